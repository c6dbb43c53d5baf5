// libFuzzer target: any bytes as a checkpoint's trainer_state.json, read and checked as resume
// reads it.
#include "core/error.h"
#include "core/json_file.h"
#include "train/checkpoint.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const char* text = reinterpret_cast<const char*>(data);
  try {
    brisk::parse_trainer_state(brisk::parse_json_bounded(text, text + size, "trainer_state.json"),
                               "trainer_state.json");
  } catch (const brisk::Error&) {
  }
  return 0;
}
