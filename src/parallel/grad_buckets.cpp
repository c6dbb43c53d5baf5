#include "parallel/grad_buckets.h"

#include "backend/backend.h"
#include "core/error.h"
#include "parallel/communicator.h"

namespace brisk {

GradBuckets::GradBuckets(const Tensor& flat, const std::vector<ElementRange>& segments,
                         int64_t cap_bytes)
    : flat_(flat) {
  BRISK_CHECK(cap_bytes > 0, "the gradient bucket size must be positive, not ", cap_bytes,
              " bytes");
  const int64_t elem = dtype_size(flat.dtype());
  int64_t covered = 0;
  for (const ElementRange& s : segments) {
    BRISK_CHECK(s.offset >= 0 && s.count >= 0 && s.offset + s.count <= flat.numel(),
                "internal error: gradient segment [", s.offset, ", +", s.count,
                ") outside the flat buffer of ", flat.numel());
    covered += s.count;
    // Segments go downwards through the buffer: a bucket grows while the next one ends where it
    // begins.
    const bool joins = !buckets_.empty() && buckets_.back().range.count * elem < cap_bytes &&
                       s.offset + s.count == buckets_.back().range.offset;
    if (!joins) buckets_.push_back(Bucket{{s.offset + s.count, 0}});
    Bucket& b = buckets_.back();
    b.range.offset = s.offset;
    b.range.count += s.count;
    ++b.segments;
    bucket_of_.push_back(static_cast<int>(buckets_.size()) - 1);
  }
  BRISK_CHECK(covered == flat.numel(), "internal error: the gradient segments cover ", covered,
              " of ", flat.numel(), " elements");
  for (Bucket& b : buckets_) b.remaining = b.segments;
  reported_.assign(segments.size(), false);
}

void GradBuckets::start(Communicator& comm, Bucket& b) {
  b.started = true;
  if (b.range.count > 0)
    comm.start_all_reduce_sum(element_range(flat_, b.range.offset, b.range.count));
}

void GradBuckets::segment_done(Communicator& comm, int segment) {
  BRISK_CHECK(segment >= 0 && segment < static_cast<int>(bucket_of_.size()),
              "internal error: gradient segment ", segment, " of ", bucket_of_.size());
  const auto i = static_cast<size_t>(segment);
  BRISK_CHECK(!reported_[i], "internal error: gradient segment ", segment, " reported twice");
  reported_[i] = true;
  Bucket& b = buckets_[static_cast<size_t>(bucket_of_[i])];
  if (--b.remaining == 0) start(comm, b);
}

double GradBuckets::finish(Communicator& comm) {
  for (Bucket& b : buckets_)
    if (!b.started) start(comm, b);
  const double seconds = comm.wait_started();
  for (Bucket& b : buckets_) {
    b.remaining = b.segments;
    b.started = false;
  }
  reported_.assign(reported_.size(), false);
  return seconds;
}

std::vector<ElementRange> GradBuckets::ranges() const {
  std::vector<ElementRange> out;
  for (const Bucket& b : buckets_) out.push_back(b.range);
  return out;
}

}  // namespace brisk
