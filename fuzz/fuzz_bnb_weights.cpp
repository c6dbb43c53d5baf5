// libFuzzer target: any bytes as a model.safetensors that may hold bitsandbytes' 4-bit weights.
// Each state accepted was read and checked and dequantizes within its packed codes' bounds; bad
// ones end in brisk::Error.
#include <vector>

#include "core/error.h"
#include "core/weight_files.h"
#include "fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = brisk::fuzz::input_file(data, size, ".safetensors");
  try {
    brisk::WeightFiles files(path);
    for (const std::string& name : files.names())
      if (const brisk::Bnb4bitWeight* w = files.bnb_4bit(name)) {
        std::vector<float> out(static_cast<size_t>(w->layout.numel));
        brisk::dequantize_bnb_4bit(name, *w, out.data());
      }
  } catch (const brisk::Error&) {
  }
  return 0;
}
