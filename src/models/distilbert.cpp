// DistilBERT for sequence classification (or masked LM): the encoder with DistilBERT's names, no
// token types, and a pre_classifier + ReLU head (or vocab_transform, vocab_layer_norm and the
// tied vocab_projector). Its config differences (no dropout after the
// attention output, seq_classif_dropout, fixed LayerNorm epsilon, sinusoidal initial positions)
// are read in config.cpp.
#include "models/distilbert.h"

#include "models/encoder.h"

namespace brisk {

std::unique_ptr<Model> make_distilbert(const ModelConfig& config) {
  static constexpr EncoderNames kNames{
      "DistilBertForSequenceClassification",
      "distilbert.",
      "embeddings.word_embeddings",
      "embeddings.position_embeddings",
      nullptr,
      "embeddings.LayerNorm",
      "transformer.layer.",
      "attention.q_lin",
      "attention.k_lin",
      "attention.v_lin",
      "attention.out_lin",
      "sa_layer_norm",
      "ffn.lin1",
      "ffn.lin2",
      "output_layer_norm",
      "pre_classifier",
      /*tanh_head=*/false,
      "classifier",
      "DistilBertForMaskedLM",
      "vocab_transform",
      "vocab_layer_norm",
      "vocab_projector.bias",
  };
  return make_encoder(config, kNames);
}

}  // namespace brisk
