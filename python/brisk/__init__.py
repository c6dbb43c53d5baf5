"""brisk from Python: transformers' Trainer and TrainingArguments over brisk's native engine.

    import brisk
    args = brisk.TrainingArguments(output_dir="out", num_train_epochs=1)
    trainer = brisk.Trainer(model="path/to/model", args=args, train_dataset=train,
                            eval_dataset=dev)
    trainer.estimate_memory()   # the plan, by category, before any run
    trainer.train()
    trainer.evaluate()

One process per run (several processes: the brisk program under mpirun or torchrun).
"""

from ._brisk import BriskError
from .callbacks import TrainerCallback, TrainerControl, TrainerState
from .functions import generate, tokenize
from .trainer import EvalPrediction, PredictionOutput, Trainer, TrainOutput
from .training_args import TrainingArguments

__all__ = ["BriskError", "EvalPrediction", "PredictionOutput", "TrainOutput", "Trainer",
           "TrainerCallback", "TrainerControl", "TrainerState", "TrainingArguments", "generate",
           "tokenize"]
