// BERT for sequence classification (BertForSequenceClassification in transformers).
#pragma once

#include <memory>

#include "models/model.h"

namespace brisk {
std::unique_ptr<Model> make_bert(const ModelConfig& config);
}
