// DistilBERT for sequence classification (DistilBertForSequenceClassification in transformers).
#pragma once

#include <memory>

#include "models/model.h"

namespace brisk {
std::unique_ptr<Model> make_distilbert(const ModelConfig& config);
}
