// DistilBERT for sequence classification: the encoder classifier with DistilBERT's names, no
// token types, and a pre_classifier + ReLU head. Its config differences (no dropout after the
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
      nullptr,
      nullptr,
  };
  return make_encoder(config, kNames);
}

}  // namespace brisk
