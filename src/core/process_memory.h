// Measured memory of this process (Linux /proc), for the planned-versus-measured report.
#pragma once

#include <cstddef>

namespace brisk {
// Peak resident set size (VmHWM) in bytes; 0 when unavailable.
size_t peak_rss_bytes();
// Current resident set size (VmRSS) in bytes; 0 when unavailable.
size_t current_rss_bytes();
}  // namespace brisk
