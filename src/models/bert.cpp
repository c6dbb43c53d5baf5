// BERT for sequence classification (BertForSequenceClassification in transformers): the
// encoder classifier with BERT's names, token types and tanh pooler.
#include "models/bert.h"

#include "models/encoder.h"

namespace brisk {

std::unique_ptr<Model> make_bert(const ModelConfig& config) {
  static constexpr EncoderNames kNames{
      "BertForSequenceClassification",
      "bert.",
      "embeddings.word_embeddings",
      "embeddings.position_embeddings",
      "embeddings.token_type_embeddings",
      "embeddings.LayerNorm",
      "encoder.layer.",
      "attention.self.query",
      "attention.self.key",
      "attention.self.value",
      "attention.output.dense",
      "attention.output.LayerNorm",
      "intermediate.dense",
      "output.dense",
      "output.LayerNorm",
      "bert.pooler.dense",
      /*tanh_head=*/true,
      "classifier",
      "BertForMaskedLM",
      "cls.predictions.transform.dense",
      "cls.predictions.transform.LayerNorm",
      "cls.predictions.bias",
  };
  return make_encoder(config, kNames);
}

}  // namespace brisk
