"""A checkpoint folder as transformers' Trainer writes it, for tests/test_outputs.cpp:

  python scripts/make_trainer_checkpoint_fixture.py     (pip install torch transformers accelerate)

A tiny BertForSequenceClassification trained two steps by Trainer with save_steps 2 leaves
tests/fixtures/trainer_checkpoint/checkpoint-2: model.safetensors and config.json (a model folder
brisk reads), optimizer.pt, scheduler.pt, rng_state.pth and training_args.bin (pickled by
PyTorch, which brisk does not read) and trainer_state.json.
"""
import os
import shutil
import tempfile

import torch
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures",
                   "trainer_checkpoint")


class Data(torch.utils.data.Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, i):
        ids = torch.tensor([100 + (i * 7 + j) % 1000 for j in range(6)])
        return {"input_ids": ids, "attention_mask": torch.ones(6, dtype=torch.long),
                "labels": torch.tensor(i % 2)}


def main():
    torch.manual_seed(0)
    config = BertConfig(vocab_size=1200, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=16, max_position_embeddings=16, num_labels=2)
    model = BertForSequenceClassification(config)
    with tempfile.TemporaryDirectory() as tmp:
        args = TrainingArguments(output_dir=tmp, per_device_train_batch_size=4, max_steps=2,
                                 save_steps=2, report_to=[], use_cpu=True, seed=0)
        Trainer(model=model, args=args, train_dataset=Data()).train()
        shutil.rmtree(OUT, ignore_errors=True)
        shutil.copytree(os.path.join(tmp, "checkpoint-2"), os.path.join(OUT, "checkpoint-2"))
    print("wrote", OUT, sorted(os.listdir(os.path.join(OUT, "checkpoint-2"))))


if __name__ == "__main__":
    main()
