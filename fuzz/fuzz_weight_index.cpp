// libFuzzer target: any bytes as a model.safetensors.index.json. Shards named by an accepted index
// were opened and hold every tensor it places in them; bad ones end in brisk::Error.
#include "core/error.h"
#include "core/weight_files.h"
#include "fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = brisk::fuzz::input_file(data, size, ".index.json");
  try {
    brisk::WeightFiles files(path);
    (void)files.path();
  } catch (const brisk::Error&) {
  }
  return 0;
}
