// Measured memory of this process (Linux /proc), for the planned-versus-measured report.
#pragma once

#include <cstddef>

namespace brisk {
// Peak resident set size (VmHWM) in bytes; 0 when unavailable.
size_t peak_rss_bytes();
// Current resident set size (VmRSS) in bytes; 0 when unavailable.
size_t current_rss_bytes();
// Restarts the peak at the current resident size (Linux clear_refs), so that a run measures its
// own peak even when it is not the first thing the process did. Returns false if not possible.
bool reset_peak_rss();
// Memory the kernel can still give to processes (MemAvailable), in bytes; 0 when unavailable.
size_t available_host_bytes();
}  // namespace brisk
