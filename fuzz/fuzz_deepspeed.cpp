// libFuzzer target: any bytes as a --deepspeed config, read over default options and over flags
// the config may contradict, then the options validated as train does.
#include "core/error.h"
#include "fuzz_support.h"
#include "train/deepspeed.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = brisk::fuzz::input_file(data, size, ".json");
  brisk::TrainOptions flags;
  flags.zero_stage = 2;
  flags.ddp_bucket_cap_mb = 50;
  flags.stage3_prefetch_bucket_size = 100;
  flags.offload_optimizer = "cpu";
  for (brisk::TrainOptions o : {brisk::TrainOptions{}, flags}) {
    try {
      o.deepspeed = path;
      std::vector<std::string> ignored;
      const brisk::TrainOptions applied = brisk::apply_deepspeed_config(o, 2, &ignored);
      brisk::validate_options(applied);
    } catch (const brisk::Error&) {
    }
  }
  return 0;
}
