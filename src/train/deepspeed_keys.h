// The keys a DeepSpeed config may hold: DeepSpeed's top level, and the sections whose models
// DeepSpeed itself reads strictly (zero_optimization with its offload sections, fp16, bf16). A
// key outside them is refused naming it and the key it is closest to, so that a misspelled key
// never silently leaves a setting at its default.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace brisk {

// Refuses (an Error opening with `origin`) the first key of `ds` that is not DeepSpeed's.
void check_deepspeed_keys(const nlohmann::json& ds, const std::string& origin);

}  // namespace brisk
