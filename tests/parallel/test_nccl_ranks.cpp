// The NCCL communicator across the job's ranks, bootstrapped through MPI: sums, pieces and
// gathers on GPU buffers equal the host communicator's, and host buffers go through it too. Skips,
// saying why, unless brisk has NCCL and this process sees a GPU for every rank on its host.
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "backend/backend.h"
#include "parallel/communicator.h"
#include "parallel/test_world.h"

namespace brisk::testing {
namespace {

TEST(NcclRanks, CollectivesMatchTheHostCommunicators) {
  std::string why;
  const std::unique_ptr<Communicator> nccl = nccl_world(&why);
  if (!nccl) GTEST_SKIP() << why;
  const int N = world().size(), r = world().rank();
  const std::unique_ptr<Backend> be = make_backend(Device::cuda);
  const int64_t n = 1000 * N + 17 * N;
  std::vector<float> mine(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) mine[static_cast<size_t>(i)] = static_cast<float>((i % 13) + r);
  std::vector<float> want = mine;
  world().all_reduce_sum(Tensor(want.data(), Shape{n}, DType::f32));
  MemoryPlan plan;
  plan.add("a", Category::temporaries, DType::f32, Shape{n});
  plan.add("b", Category::temporaries, DType::f32, Shape{n});
  plan.add("c", Category::temporaries, DType::f32, Shape{n});
  plan.finalize();
  Arena arena(plan, be->device_memory(), be->staging_memory());
  const Tensor a = arena.tensor(0), b = arena.tensor(1), c = arena.tensor(2);
  be->upload(Tensor(mine.data(), Shape{n}, DType::f32), a);
  nccl->all_reduce_sum(a);
  std::vector<float> got(static_cast<size_t>(n));
  be->download(a, Tensor(got.data(), Shape{n}, DType::f32));
  EXPECT_EQ(got, want);  // small whole numbers: exact in any order
  std::vector<float> largest = mine;
  world().all_reduce_max(Tensor(largest.data(), Shape{n}, DType::f32));
  be->upload(Tensor(mine.data(), Shape{n}, DType::f32), a);
  nccl->all_reduce_max(a);
  be->download(a, Tensor(got.data(), Shape{n}, DType::f32));
  EXPECT_EQ(got, largest);
  // Pieces of unequal length (rank 1's empty) summed to their owners.
  std::vector<int64_t> counts;
  int64_t offset = 0, total = 0;
  for (int q = 0; q < N; ++q) {
    counts.push_back(q == 1 ? 0 : 1000 + q);
    if (q == r) offset = total;
    total += counts.back();
  }
  be->upload(Tensor(mine.data(), Shape{n}, DType::f32), a);
  const int64_t count = counts[static_cast<size_t>(r)];
  nccl->reduce_scatter_sum_v(element_range(a, 0, total), counts, element_range(b, 0, count));
  std::vector<float> piece(static_cast<size_t>(count));
  be->download(element_range(b, 0, count), Tensor(piece.data(), Shape{count}, DType::f32));
  EXPECT_EQ(piece, std::vector<float>(want.begin() + offset, want.begin() + offset + count));
  nccl->barrier();
  // Host buffers go through the GPU: a sum in place, every rank's bytes gathered (some ranks'
  // empty; to rank 0 alone and to all), a broadcast from the last rank.
  std::vector<float> host = mine;
  nccl->all_reduce_sum(Tensor(host.data(), Shape{n}, DType::f32));
  EXPECT_EQ(host, want);
  const std::string text =
      r == 1 ? std::string() : std::string(static_cast<size_t>(5 + r), 'a' + r);
  std::string joined;
  for (int q = 0; q < N; ++q)
    if (q != 1) joined += std::string(static_cast<size_t>(5 + q), 'a' + q);
  const Tensor piece_bytes(const_cast<char*>(text.data()), Shape{static_cast<int64_t>(text.size())},
                           DType::u8);
  for (const int root : {0, -1}) {
    const std::vector<uint8_t> all = gather_pieces(*nccl, piece_bytes, nullptr, root);
    if (root < 0 || r == root)
      EXPECT_EQ(std::string(all.begin(), all.end()), joined) << "root " << root;
    else
      EXPECT_TRUE(all.empty());
  }
  // Started on the GPU (queued after the backend's work, waited for by ticket): the sum as the
  // blocking one's, and a gather of every rank's piece (rank q's 1000 + q values of q + 1) that
  // the backend's fill just before it wrote.
  nccl->set_device_stream(be->device_stream());
  be->upload(Tensor(mine.data(), Shape{n}, DType::f32), a);
  nccl->start_all_reduce_sum(a);
  const int64_t sum_ticket = nccl->started();
  std::vector<int64_t> sizes;
  int64_t gathered = 0;
  for (int q = 0; q < N; ++q) gathered += sizes.emplace_back(1000 + q);
  be->fill(c, static_cast<float>(r + 1));
  nccl->start_all_gather_v(element_range(c, 0, 1000 + r), sizes, element_range(b, 0, gathered));
  nccl->wait_started_until(nccl->started() - sum_ticket);
  be->download(a, Tensor(got.data(), Shape{n}, DType::f32));
  EXPECT_EQ(got, want);
  EXPECT_GT(nccl->wait_started(), 0.0) << "the started collectives' time on the GPU";
  std::vector<float> all(static_cast<size_t>(gathered));
  be->download(element_range(b, 0, gathered), Tensor(all.data(), Shape{gathered}, DType::f32));
  int64_t at = 0;
  for (int q = 0; q < N; ++q)
    for (int64_t i = 0; i < 1000 + q; ++i, ++at)
      ASSERT_EQ(all[static_cast<size_t>(at)], static_cast<float>(q + 1)) << "rank " << q;
  nccl->set_device_stream(nullptr);
  double value = r == N - 1 ? 42.5 : 0.0;
  nccl->broadcast(Tensor(&value, Shape{1}, DType::f64), N - 1);
  EXPECT_EQ(value, 42.5);
}

// Split groups, an exchange around a ring and an all-to-all on GPU buffers, against the values
// each rank knows the others sent (whole numbers: exact).
TEST(NcclRanks, SplitPointToPointAndAllToAllMoveTheRightChunks) {
  std::string why;
  const std::unique_ptr<Communicator> nccl = nccl_world(&why);
  if (!nccl) GTEST_SKIP() << why;
  const int N = world().size(), r = world().rank();
  const std::unique_ptr<Backend> be = make_backend(Device::cuda);
  const int64_t chunk = 257, n = chunk * N;
  MemoryPlan plan;
  plan.add("in", Category::temporaries, DType::f32, Shape{n});
  plan.add("out", Category::temporaries, DType::f32, Shape{n});
  plan.finalize();
  Arena arena(plan, be->device_memory(), be->staging_memory());
  const Tensor in = arena.tensor(0), out = arena.tensor(1);
  auto value = [&](int from, int to, int64_t i) { return 1000.f * from + 10.f * to + i % 7; };
  std::vector<float> mine(static_cast<size_t>(n)), got(static_cast<size_t>(n));
  for (int p = 0; p < N; ++p)
    for (int64_t i = 0; i < chunk; ++i) mine[static_cast<size_t>(p * chunk + i)] = value(r, p, i);
  be->upload(Tensor(mine.data(), Shape{n}, DType::f32), in);
  nccl->all_to_all(in, out);
  be->download(out, Tensor(got.data(), Shape{n}, DType::f32));
  for (int p = 0; p < N; ++p)
    for (int64_t i = 0; i < chunk; ++i)
      ASSERT_EQ(got[static_cast<size_t>(p * chunk + i)], value(p, r, i)) << "from rank " << p;
  // Around the ring (one rank alone has no other to exchange with: send_receive refuses that).
  const int next = (r + 1) % N, prev = (r + N - 1) % N;
  if (N > 1) {
    nccl->send_receive(element_range(in, next * chunk, chunk), next, element_range(out, 0, chunk),
                       prev);
    be->download(element_range(out, 0, chunk), Tensor(got.data(), Shape{chunk}, DType::f32));
    for (int64_t i = 0; i < chunk; ++i) ASSERT_EQ(got[static_cast<size_t>(i)], value(prev, r, i));
  }
  const std::unique_ptr<Communicator> half = nccl->split(r % 2, r);
  double sum = r, want = 0;
  for (int p = r % 2; p < N; p += 2) want += p;
  half->all_reduce_sum(Tensor(&sum, Shape{1}, DType::f64));
  EXPECT_EQ(sum, want);
}

}  // namespace
}  // namespace brisk::testing
