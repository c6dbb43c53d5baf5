// The NCCL communicator (parallel/nccl.cpp) in one process: every collective on GPU buffers, and
// host buffers staged through the GPU (ZeRO's host-resident parts). Skips, saying why, where no GPU
// can run it; without a GPU it checks that asking for NCCL ends with one clear message. Several
// ranks: tests/parallel/test_nccl_ranks.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <vector>

#include "backend_support.h"
#include "parallel/communicator.h"

namespace brisk::testing {
namespace {

TEST(Nccl, WithoutAGpuAskingForItEndsWithAMessage) {
  std::string why;
  if (nccl_built_in() && cuda_available(&why)) GTEST_SKIP() << "a GPU is present";
  LaunchInfo one;
  expect_error([&] { make_nccl(one, nullptr, Device::cuda, 1.0); },
               nccl_built_in() ? "NCCL: " : "built without NCCL");
}

TEST(Nccl, OneRanksCollectivesOnTheGpu) {
  if (!nccl_built_in()) GTEST_SKIP() << "brisk was built without NCCL";
  REQUIRE_GPU();
  const std::unique_ptr<Communicator> comm = make_nccl(LaunchInfo{}, nullptr, Device::cuda, 60.0);
  EXPECT_EQ(comm->size(), 1);
  EXPECT_NE(comm->name().find("NCCL"), std::string::npos);
  const std::unique_ptr<Backend> be = make_backend(Device::cuda);
  DeviceBuffers buf(*be);
  const FVec x{1.5f, -2.f, 3.25f, 4.f, 0.5f};
  const Tensor a = buf.put(x, Shape{5});
  comm->all_reduce_sum(a);  // one rank: the sum is its own buffer
  EXPECT_EQ(buf.get(a), x);
  const Tensor out = buf.alloc(Shape{5});
  comm->reduce_scatter_sum(a, out);
  EXPECT_EQ(buf.get(out), x);
  const Tensor piece = buf.alloc(Shape{5});
  comm->reduce_scatter_sum_v(a, {5}, piece);
  EXPECT_EQ(buf.get(piece), x);
  const Tensor gathered = buf.alloc(Shape{5});
  comm->all_gather(a, gathered);
  EXPECT_EQ(buf.get(gathered), x);
  const Tensor to_root = buf.alloc(Shape{5});
  comm->gather_v(a, {5}, to_root, 0);
  EXPECT_EQ(buf.get(to_root), x);
  comm->broadcast(a, 0);
  comm->barrier();
  EXPECT_EQ(buf.get(a), x);
  FVec host = x;
  comm->all_reduce_sum(Tensor(host.data(), Shape{5}, DType::f32));
  EXPECT_EQ(host, x);
  FVec host_out(5, -7.f);
  comm->all_gather(a, Tensor(host_out.data(), Shape{5}, DType::f32));
  EXPECT_EQ(host_out, x);

  // Started collectives are queued after the backend's queued work (its stream, not the host,
  // waits) and waited for by ticket: a gather reads what the fill before it wrote, 64 MiB of it,
  // queued at once after the fill; a started sum follows.
  comm->set_device_stream(be->device_stream());
  const int64_t n = int64_t{16} << 20;
  const Tensor src = buf.alloc(Shape{n}), dst = buf.alloc(Shape{n});
  be->fill(dst, 0.0f);
  be->synchronize();
  be->fill(src, 2.5f);
  comm->start_all_gather_v(src, {n}, dst);
  const int64_t ticket = comm->started();
  comm->start_all_reduce_sum(a);
  comm->wait_started_until(comm->started() - ticket);
  std::vector<float> got(static_cast<size_t>(n));
  be->download(dst, Tensor(got.data(), Shape{n}, DType::f32));
  EXPECT_EQ(std::count(got.begin(), got.end(), 2.5f), n);
  EXPECT_GT(comm->wait_started(), 0.0) << "the gather's time on the GPU";
  EXPECT_EQ(buf.get(a), x);
  comm->set_device_stream(nullptr);
}

}  // namespace
}  // namespace brisk::testing
