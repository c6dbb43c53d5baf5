// The measurement switches (see switches.h): one table, each variable read once.
#include "core/switches.h"

#include <algorithm>
#include <array>
#include <cstdlib>
#include <map>
#include <mutex>

#include "core/error.h"

namespace brisk {
namespace {

struct Switch {
  const char* name;
  const char* values;  // what it takes, as the message lists them
};

constexpr const char* kOnOff = "0 or 1";
constexpr std::array kSwitches = {
    Switch{"BRISK_ATTENTION_BF16_IO", kOnOff},
    Switch{"BRISK_ATTENTION_DETERMINISTIC", kOnOff},
    Switch{"BRISK_BF16_ACTIVATIONS", kOnOff},
    Switch{"BRISK_BF16_ACTIVATION_GRADIENT", kOnOff},
    Switch{"BRISK_BF16_HEAD_GRAD", kOnOff},
    Switch{"BRISK_BF16_PRODUCT_OUTPUT", kOnOff},
    Switch{"BRISK_CPU_PRODUCTS", "openblas or onednn"},
    Switch{"BRISK_FUSED_ACTIVATION_GRADIENT", kOnOff},
    Switch{"BRISK_FUSED_ATTENTION", kOnOff},
    Switch{"BRISK_FUSED_RESIDUAL_NORM", kOnOff},
    Switch{"BRISK_KEY_LENGTHS", kOnOff},
    Switch{"BRISK_LABELLED_ROWS_ONLY", kOnOff},
    Switch{"BRISK_PAD_HEAD", kOnOff},
    Switch{"BRISK_RECOMPUTE_ACTIVATION", kOnOff},
    Switch{"BRISK_RECORDED_STEPS", kOnOff},
    Switch{"BRISK_UNMASKED_ATTENTION", kOnOff},
};

const Switch& find_switch(const std::string& name) {
  const auto it = std::find_if(kSwitches.begin(), kSwitches.end(),
                               [&](const Switch& s) { return name == s.name; });
  BRISK_CHECK(it != kSwitches.end(), "internal: ", name, " is not a switch of core/switches.cpp");
  return *it;
}

// Whether `value` is one the switch takes ("" is unset).
bool takes(const Switch& s, const std::string& value) {
  if (value.empty()) return true;
  if (s.values == kOnOff) return value == "0" || value == "1";
  return value == "openblas" || value == "onednn";
}

std::mutex g_mutex;
std::map<std::string, std::string> g_read;  // each variable as first read

}  // namespace

const std::string& switch_value(const char* name) {
  const std::lock_guard<std::mutex> lock(g_mutex);
  std::map<std::string, std::string>& read = g_read;
  const auto it = read.find(name);
  if (it != read.end()) return it->second;
  const Switch& s = find_switch(name);
  const char* v = std::getenv(name);
  const std::string value = v ? v : "";
  BRISK_CHECK(takes(s, value), "environment variable ", name, "=", excerpt(value),
              ": the switch takes ", s.values, " (or leave it unset)");
  return read.emplace(name, value).first->second;
}

void forget_switches() {
  const std::lock_guard<std::mutex> lock(g_mutex);
  g_read.clear();
}

void check_switches() {
  for (const Switch& s : kSwitches) switch_value(s.name);
}

bool switched_off(const char* name) {
  return switch_value(name) == "0";
}

bool switched_on(const char* name) {
  return switch_value(name) == "1";
}

}  // namespace brisk
