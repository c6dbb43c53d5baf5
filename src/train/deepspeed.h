// --deepspeed ds_config.json, as Trainer takes it: the DeepSpeed keys brisk has a meaning for
// become its options, "auto" (Trainer's way of saying "from TrainingArguments") keeps the option,
// and an explicit value that contradicts an option or asks for what brisk does not do is refused
// naming the key, as is a flag given another value than the config's (a flag at its default
// yields). DeepSpeed's keys brisk has no use for are listed, not refused (a DeepSpeed config
// carries many: logging, autotuning, ...), a key DeepSpeed does not have is refused
// (train/deepspeed_keys.h); sections that change what the run computes and that brisk does
// not do (tensor_parallel, ZenFlow, ...) are refused. The optimizer and scheduler sections are
// DeepSpeed's own, as Trainer hands them to DeepSpeed: Adam/AdamW run as adamw_torch, and WarmupLR,
// WarmupDecayLR and WarmupCosineLR follow DeepSpeed's curves (train/schedule.h).
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "train/options.h"
#include "train/schedule.h"

namespace brisk {

// Reads the file `o.deepspeed` names (none: nothing) into a copy of `o`. `ranks`: the processes of
// the run (train_batch_size is micro-batch x accumulation x ranks). `ignored`, when given,
// receives the keys without a meaning for brisk, as "zero_optimization.sub_group_size".
TrainOptions apply_deepspeed_config(const TrainOptions& o, int ranks,
                                    std::vector<std::string>* ignored = nullptr);
// The same from a parsed config; `origin` names it in messages.
TrainOptions apply_deepspeed_json(const TrainOptions& o, const nlohmann::json& ds,
                                  const std::string& origin, int ranks,
                                  std::vector<std::string>* ignored = nullptr);
// The run's schedule over `total_steps`: lr_scheduler_type's, or the config's scheduler, whose
// explicit warmup_num_steps and total_num_steps must be the run's (refused otherwise).
Schedule learning_rate_schedule(const TrainOptions& o, int64_t total_steps);

}  // namespace brisk
