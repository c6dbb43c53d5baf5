// libFuzzer target: any bytes as a --options_file, then the options validated as train does.
#include "core/error.h"
#include "fuzz_support.h"
#include "train/options.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = brisk::fuzz::input_file(data, size, ".json");
  try {
    brisk::TrainOptions o;
    brisk::load_options_file(o, path);
    brisk::validate_options(o);
  } catch (const brisk::Error&) {
  }
  return 0;
}
