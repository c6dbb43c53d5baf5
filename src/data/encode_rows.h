// Encoding the rows of a table in parallel, for the text datasets.
#pragma once

#include <omp.h>

#include <atomic>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "data/text_dataset.h"

namespace brisk {

// Encodes rows [0, n) in parallel (OpenMP) into what encode_row makes of each; the first error
// any row raises is raised here. The encoder hears of the progress every 4096 rows, from the first
// thread.
template <typename T, typename F>
std::vector<T> encode_rows_as(const TextEncoder& encoder, int64_t n, F&& encode_row) {
  std::vector<T> out(static_cast<size_t>(n));
  std::string error;
  std::atomic<int64_t> done{0};
  int64_t reported = 0;  // the first thread's
#pragma omp parallel for schedule(dynamic, 64)
  for (int64_t r = 0; r < n; ++r) {
    try {
      out[static_cast<size_t>(r)] = encode_row(r);
      const int64_t d = done.fetch_add(1, std::memory_order_relaxed) + 1;
      if (omp_get_thread_num() == 0 && d - reported >= 4096) {
        reported = d;
        encoder.progress(d, n);
      }
    } catch (const std::exception& e) {
#pragma omp critical(brisk_encode_error)
      if (error.empty()) error = e.what();
    }
  }
  if (!error.empty()) throw Error(error);
  encoder.progress(n, n);
  return out;
}
template <typename F>
std::vector<Encoded> encode_rows(const TextEncoder& encoder, int64_t n, F&& encode_row) {
  return encode_rows_as<Encoded>(encoder, n, std::forward<F>(encode_row));
}

}  // namespace brisk
