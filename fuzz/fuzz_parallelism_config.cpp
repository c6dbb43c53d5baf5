// libFuzzer target: any bytes as a --parallelism_config file (accelerate's ParallelismConfig),
// read over default options and over flags it may contradict, then validated as train does.
#include "core/error.h"
#include "fuzz_support.h"
#include "train/parallelism_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = brisk::fuzz::input_file(data, size, ".json");
  brisk::TrainOptions flags;
  flags.tp_size = 2;
  flags.zero_stage = 1;
  for (brisk::TrainOptions o : {brisk::TrainOptions{}, flags}) {
    try {
      o.parallelism_config = path;
      brisk::validate_options(brisk::apply_parallelism_config(o, 4));
    } catch (const brisk::Error&) {
    }
  }
  return 0;
}
