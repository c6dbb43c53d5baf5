// The BERT family's encoder with a task head: embeddings (word + position [+ token type]) and
// LayerNorm, post-LN blocks (bidirectional, or causal for a decoder), then
// - sequence classification: the first token through a dense layer and an activation (BERT's
//   tanh pooler, DistilBERT's ReLU pre_classifier), dropout and a linear classifier under
//   cross-entropy (or one output under the squared error for regression);
// - masked LM (BertForMaskedLM, DistilBertForMaskedLM): every token through the prediction
//   head's transform (dense, the config's activation, LayerNorm) and a decoder tied to the word
//   embeddings plus its own bias, under cross-entropy at the masked tokens.
// bert.cpp and distilbert.cpp give it their parameter names.
#pragma once

#include <memory>

#include "models/model.h"

namespace brisk {

// transformers' parameter names of one architecture; "{}" in `layer` stands for the index.
struct EncoderNames {
  const char* class_name;  // "BertForSequenceClassification"
  const char* base;        // base_model_prefix + ".": "bert."
  // Relative to `base`.
  const char* word;
  const char* position;
  const char* token_type;  // nullptr: no token types
  const char* embedding_norm;
  const char* layer;  // "encoder.layer."
  // Relative to a layer; query, key and value are declared end to end as one [3C, C] matrix.
  const char *query, *key, *value, *attention_output, *attention_norm, *intermediate, *output,
      *output_norm;
  // Relative to the model (outside `base`): the dense layer over the first token, and whether
  // its activation is tanh (BERT's pooler) or ReLU (DistilBERT's pre_classifier).
  const char* head_dense;
  bool tanh_head;
  const char* classifier;
  // Masked LM (nullptr: the architecture has none here): its class, and relative to the model
  // the transform's dense layer and LayerNorm and the tied decoder's own bias.
  const char* masked_lm_class;
  const char *mlm_dense, *mlm_norm, *mlm_bias;
};

std::unique_ptr<Model> make_encoder(const ModelConfig& config, const EncoderNames& names);

}  // namespace brisk
