// Fitting a run to memory from its plan (see fit.h).
#include "train/fit.h"

#include <algorithm>
#include <cctype>
#include <cstdio>

#include "core/process_memory.h"
#include "train/assembly.h"

namespace brisk {

namespace {
std::string mib(size_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f MiB", static_cast<double>(bytes) / (1 << 20));
  return buf;
}
}  // namespace

size_t parse_memory_size(const std::string& text) {
  size_t i = 0;
  while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.'))
    ++i;
  std::string unit = text.substr(i);
  unit.erase(std::remove(unit.begin(), unit.end(), ' '), unit.end());
  for (char& c : unit) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  double number = 0;
  bool ok = i > 0 && std::count(text.begin(), text.begin() + i, '.') <= 1;
  if (ok) {
    try {
      number = std::stod(text.substr(0, i));
    } catch (const std::exception&) {
      ok = false;
    }
  }
  const std::pair<const char*, double> units[] = {{"", 1},
                                                  {"b", 1},
                                                  {"kb", 1e3},
                                                  {"mb", 1e6},
                                                  {"gb", 1e9},
                                                  {"tb", 1e12},
                                                  {"k", 1024.0},
                                                  {"kib", 1024.0},
                                                  {"m", 1048576.0},
                                                  {"mib", 1048576.0},
                                                  {"g", 1073741824.0},
                                                  {"gib", 1073741824.0},
                                                  {"t", 1099511627776.0},
                                                  {"tib", 1099511627776.0}};
  double scale = -1;
  for (const auto& [name, factor] : units)
    if (unit == name) scale = factor;
  BRISK_CHECK(ok && scale > 0, "max_memory \"", text,
              "\" is not a size (examples: 6GB, 6GiB, 512MiB, 1.5G)");
  const double bytes = number * scale;
  BRISK_CHECK(bytes >= 1 && bytes < 1e18, "max_memory \"", text, "\" is out of range");
  return static_cast<size_t>(bytes);
}

MemoryBudget memory_budget(const TrainOptions& o, Device device, const Backend* backend) {
  MemoryBudget b;
  b.device = device;
  const bool gpu_here = backend && backend->device() == Device::cuda;
  if (!o.max_memory.empty()) {
    b.budget = parse_memory_size(o.max_memory);
    b.source = "--max_memory " + o.max_memory;
    if (device == Device::cpu) {
      b.fixed = current_rss_bytes();
    } else {
      const int64_t used = gpu_here ? backend->device_memory_used() : -1;
      b.fixed = used > 0 ? static_cast<size_t>(used) : kCudaContextBytes;
    }
    return b;
  }
  if (device == Device::cpu) {
    b.budget = available_host_bytes();
    b.source = "the host's available memory";
  } else {
    const int64_t free_bytes = gpu_here ? backend->device_memory_free() : -1;
    BRISK_CHECK(free_bytes > 0,
                "fitting a GPU run needs --max_memory where no GPU can be asked for its free "
                "memory");
    b.budget = static_cast<size_t>(free_bytes);
    b.source = "the GPU's free memory";
  }
  BRISK_CHECK(b.budget > 0, "cannot tell how much memory is available; give --max_memory");
  return b;
}

size_t needed_bytes(const MemoryPlan& plan, const MemoryBudget& budget) {
  const size_t planned =
      budget.device == Device::cuda ? plan.total_bytes(Placement::device) : plan.total_bytes();
  return planned + budget.fixed + std::max(planned / 50, size_t{32} << 20);
}

BatchFit fit_batch(const TrainOptions& o, Device device, const MemoryBudget& budget,
                   const Dataset* dataset) {
  const int64_t global = o.per_device_train_batch_size * o.gradient_accumulation_steps;
  auto need = [&](int64_t batch, bool checkpointing) {
    TrainOptions t = o;
    t.per_device_train_batch_size = batch;
    t.gradient_accumulation_steps = global / batch;
    t.gradient_checkpointing = checkpointing;
    return needed_bytes(assemble_run(t, device, nullptr, dataset)->plan, budget);
  };
  // The data bounds the batch: a loader refuses a batch larger than the dataset.
  TrainOptions one = o;
  one.per_device_train_batch_size = 1;
  one.gradient_accumulation_steps = global;
  const int64_t samples = assemble_run(one, device, nullptr, dataset)->data->size();
  for (int64_t b = std::min(global, samples); b >= 1; --b) {
    if (global % b) continue;
    const size_t needed = need(b, o.gradient_checkpointing);
    if (needed > budget.budget) continue;
    BatchFit f{b, global / b, needed, ""};
    f.reason = "auto_find_batch_size: per_device_train_batch_size " + std::to_string(b) +
               " x gradient_accumulation_steps " + std::to_string(global / b) + " (global batch " +
               std::to_string(global) + ") needs " + mib(needed) + " of " + mib(budget.budget) +
               " (" + budget.source + ")";
    if (b < std::min(global, samples))
      f.reason += "; the next larger batch dividing " + std::to_string(global) + " does not fit";
    return f;
  }
  BRISK_FAIL("auto_find_batch_size: not even per_device_train_batch_size 1 fits ",
             mib(budget.budget), " (", budget.source, "): it needs ",
             mib(need(1, o.gradient_checkpointing)),
             o.gradient_checkpointing
                 ? ""
                 : (", and " + mib(need(1, true)) + " with --gradient_checkpointing").c_str());
}

}  // namespace brisk
