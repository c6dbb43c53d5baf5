// accelerate's ParallelismConfig (TrainingArguments' parallelism_config), read from a JSON file
// given as --parallelism_config: its degrees as brisk's options.
#pragma once

#include "train/options.h"

namespace brisk {

// The options with the file's degrees applied, for a run of `ranks` processes: tp_size sets
// --tp_size, sp_size --sp_size; dp_shard_size above 1 shards the data replicas' model states as
// FSDP's full shard does (--zero_stage 3); dp_replicate_size x dp_shard_size x tp_size x sp_size
// must be the run's processes. cp_size above 1, hybrid sharding (both data degrees above 1),
// unknown keys and values contradicting the options are refused by name.
TrainOptions apply_parallelism_config(const TrainOptions& o, int ranks);

}  // namespace brisk
