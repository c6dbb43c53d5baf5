// libFuzzer target: any bytes as a safetensors file. Accepted files must have every tensor
// readable in full (the reader validated offsets and sizes); bad ones end in brisk::Error.
#include "core/error.h"
#include "core/safetensors.h"
#include "fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = brisk::fuzz::input_file(data, size, ".safetensors");
  try {
    brisk::SafetensorsFile file(path);
    volatile uint8_t sink = 0;
    for (const std::string& name : file.names()) {
      const brisk::Tensor& t = file.get(name);
      const uint8_t* p = static_cast<const uint8_t*>(t.data());
      for (size_t i = 0; i < t.bytes(); i += 4096) sink = sink ^ p[i];
      if (t.bytes()) sink = sink ^ p[t.bytes() - 1];
    }
  } catch (const brisk::Error&) {
  }
  return 0;
}
