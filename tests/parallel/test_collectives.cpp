// The host communicator's collectives (MPI's or Gloo's) on every rank of the job, against sums and
// concatenations computed in double from every rank's inputs (each rank makes all ranks' inputs
// from their seeds). Odd lengths; float32 and bf16; in place where the collective allows it.
//
// Tolerances: float32 sums of N terms differ from the fp64 sum by at most (N-1) ulps of the
// running sum: 1e-6 of sum |terms| for N <= 3. bf16 sums round to 8 bits after every partial sum:
// 2^-7 of sum |terms|. Gathers and broadcasts copy: bit-exact.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "parallel/launch.h"
#include "parallel/test_world.h"
#include "test_support.h"

namespace brisk::testing {
namespace {

using FVec = std::vector<float>;

// Rank r's input of n values: random, distinct per rank and per test (salt).
FVec input(int r, int64_t n, int salt) {
  std::mt19937 rng(1000u * static_cast<unsigned>(salt) + static_cast<unsigned>(r));
  std::normal_distribution<float> d(0.f, 1.f);
  FVec v(static_cast<size_t>(n));
  for (float& x : v) x = d(rng);
  return v;
}

std::vector<uint16_t> to_bf16(const FVec& v) {
  std::vector<uint16_t> h(v.size());
  for (size_t i = 0; i < v.size(); ++i) h[i] = float_to_bf16(v[i]);
  return h;
}

// Every element within tol * sum over ranks of |term| of the fp64 sum.
void expect_sums(const std::vector<double>& got, int64_t n, int salt, int64_t offset, double tol,
                 bool bf16_terms) {
  const int N = world().size();
  std::vector<double> want(got.size(), 0.0), scale(got.size(), 0.0);
  for (int r = 0; r < N; ++r) {
    const FVec v = input(r, n, salt);
    for (size_t i = 0; i < got.size(); ++i) {
      const double x = bf16_terms ? bf16_to_float(float_to_bf16(v[offset + i])) : v[offset + i];
      want[i] += x;
      scale[i] += std::abs(x);
    }
  }
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < got.size(); ++i)
    if (!(std::abs(got[i] - want[i]) <= tol * scale[i]) && bad++ == 0) first = i;
  EXPECT_EQ(bad, 0u) << "first at " << first << ": got " << got[first] << ", want " << want[first];
}

// mpirun's ranks talk through MPI, a torchrun-style launch's through Gloo.
TEST(Collectives, RankAndSizeAreTheLaunchers) {
  const LaunchInfo launch = launch_info_from_env();
  EXPECT_EQ(world().rank(), launch.rank);
  EXPECT_EQ(world().size(), launch.size);
  EXPECT_GE(world().size(), 2) << "run me under mpirun -np 2 or more, or launch_env.sh 2";
  ASSERT_NE(launch.launcher, Launcher::none);
  const char* library = launch.launcher == Launcher::mpi ? "MPI" : "Gloo";
  EXPECT_NE(world().name().find(library), std::string::npos) << world().name();
}

TEST(Collectives, AllReduceSumsEveryRanksBuffer) {
  const int64_t n = 100'003;
  FVec v = input(world().rank(), n, 1);
  world().all_reduce_sum(Tensor(v.data(), Shape{n}, DType::f32));
  expect_sums(std::vector<double>(v.begin(), v.end()), n, 1, 0, 1e-6, false);

  std::vector<uint16_t> h = to_bf16(input(world().rank(), n, 2));
  world().all_reduce_sum(Tensor(h.data(), Shape{n}, DType::bf16));
  std::vector<double> got(h.size());
  for (size_t i = 0; i < h.size(); ++i) got[i] = bf16_to_float(h[i]);
  expect_sums(got, n, 2, 0, std::ldexp(1.0, -7), true);
}

// Started all-reduces run while the caller goes on (on MPI's communication thread), in the order
// started; wait_started returns when all are done; a blocking collective called meanwhile first
// finishes them.
TEST(Collectives, StartedAllReducesSumLikeBlockingOnes) {
  const std::vector<int64_t> lengths{70'001, 3, 1'000'000, 129};
  std::vector<FVec> bufs;
  for (size_t i = 0; i < lengths.size(); ++i)
    bufs.push_back(input(world().rank(), lengths[i], 10 + static_cast<int>(i)));
  for (FVec& v : bufs)
    world().start_all_reduce_sum(
        Tensor(v.data(), Shape{static_cast<int64_t>(v.size())}, DType::f32));
  EXPECT_GE(world().wait_started(), 0.0);
  for (size_t i = 0; i < lengths.size(); ++i) {
    SCOPED_TRACE(i);
    expect_sums(std::vector<double>(bufs[i].begin(), bufs[i].end()), lengths[i],
                10 + static_cast<int>(i), 0, 1e-6, false);
  }
  // Started, then a barrier and a blocking all-reduce before the wait.
  FVec a = input(world().rank(), 50'000, 20), b = input(world().rank(), 777, 21);
  world().start_all_reduce_sum(Tensor(a.data(), Shape{50'000}, DType::f32));
  world().barrier();
  world().all_reduce_sum(Tensor(b.data(), Shape{777}, DType::f32));
  expect_sums(std::vector<double>(a.begin(), a.end()), 50'000, 20, 0, 1e-6, false);
  expect_sums(std::vector<double>(b.begin(), b.end()), 777, 21, 0, 1e-6, false);
  EXPECT_GE(world().wait_started(), 0.0);
}

// Small integers sum exactly in float32 in any order: every rank ends with the same bits.
TEST(Collectives, AllReduceOfExactSumsIsTheSameOnEveryRank) {
  const int64_t n = 4097;
  FVec v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = static_cast<float>((i * 7 + world().rank() * 13) % 101);
  world().all_reduce_sum(Tensor(v.data(), Shape{n}, DType::f32));
  for (int64_t i = 0; i < n; ++i) {
    double want = 0;
    for (int r = 0; r < world().size(); ++r) want += (i * 7 + r * 13) % 101;
    ASSERT_EQ(v[i], want) << i;
  }
}

// The largest of every rank's float32 values, exact; in pieces where the communicator gathers
// them (Gloo's: the default's 65,536 values).
TEST(Collectives, AllReduceMaxTakesEveryRanksLargest) {
  const int64_t n = 100'003;
  FVec v = input(world().rank(), n, 3);
  world().all_reduce_max(Tensor(v.data(), Shape{n}, DType::f32));
  std::vector<FVec> all;
  for (int r = 0; r < world().size(); ++r) all.push_back(input(r, n, 3));
  size_t bad = 0;
  for (int64_t i = 0; i < n; ++i) {
    float want = all[0][i];
    for (const FVec& a : all) want = std::max(want, a[i]);
    bad += v[i] != want;
  }
  EXPECT_EQ(bad, 0u);
  std::vector<double> wide(3, 1.0);
  expect_error([&] { world().all_reduce_max(Tensor(wide.data(), Shape{3}, DType::f64)); },
               "float32 expected");
}

TEST(Collectives, ReduceScatterGivesEachRankItsChunksSum) {
  const int N = world().size(), r = world().rank();
  const int64_t chunk = 30'011, n = chunk * N;
  FVec in = input(r, n, 3), out(chunk, -7.f);
  world().reduce_scatter_sum(Tensor(in.data(), Shape{n}, DType::f32),
                             Tensor(out.data(), Shape{chunk}, DType::f32));
  expect_sums(std::vector<double>(out.begin(), out.end()), n, 3, r * chunk, 1e-6, false);

  std::vector<uint16_t> hin = to_bf16(input(r, n, 4)), hout(chunk);
  world().reduce_scatter_sum(Tensor(hin.data(), Shape{n}, DType::bf16),
                             Tensor(hout.data(), Shape{chunk}, DType::bf16));
  std::vector<double> got(hout.size());
  for (size_t i = 0; i < hout.size(); ++i) got[i] = bf16_to_float(hout[i]);
  expect_sums(got, n, 4, r * chunk, std::ldexp(1.0, -7), true);
}

// Pieces of any length (ZeRO stage 2's gradient segments cut by the shards), one of them empty.
TEST(Collectives, ReduceScatterOfUnequalPiecesGivesEachRankItsPiecesSum) {
  const int N = world().size(), r = world().rank();
  std::vector<int64_t> counts;
  for (int q = 0; q < N; ++q) counts.push_back(q == 1 ? 0 : 1'000 * (q + 1) + 7);
  int64_t n = 0, offset = 0;
  for (int q = 0; q < N; ++q) {
    if (q == r) offset = n;
    n += counts[static_cast<size_t>(q)];
  }
  const int64_t mine = counts[static_cast<size_t>(r)];
  FVec in = input(r, n, 6), out(static_cast<size_t>(mine), -7.f);
  world().reduce_scatter_sum_v(Tensor(in.data(), Shape{n}, DType::f32), counts,
                               Tensor(out.data(), Shape{mine}, DType::f32));
  expect_sums(std::vector<double>(out.begin(), out.end()), n, 6, offset, 1e-6, false);
  // Counts that do not add up to the buffers are refused on every rank, before communicating.
  std::vector<int64_t> wrong = counts;
  wrong[0] += 1;
  EXPECT_THROW(world().reduce_scatter_sum_v(Tensor(in.data(), Shape{n}, DType::f32), wrong,
                                            Tensor(out.data(), Shape{mine}, DType::f32)),
               Error);
}

// Started reduce-scatters run in order, each followed by its consumer (on the communication
// thread), which sees its own sum before the next one overwrites the shared receiving buffer;
// waiting until one is left leaves at most the latest unfinished.
TEST(Collectives, StartedReduceScattersRunTheirConsumersInOrder) {
  const int N = world().size(), r = world().rank();
  std::vector<int64_t> counts(static_cast<size_t>(N), 500);
  const int64_t n = 500 * N;
  constexpr int kStarted = 5;
  std::vector<FVec> ins;
  for (int k = 0; k < kStarted; ++k) ins.push_back(input(r, n, 10 + k));
  FVec receive(500);
  std::vector<FVec> consumed(kStarted);
  std::vector<int> order;
  for (int k = 0; k < kStarted; ++k)
    world().start_reduce_scatter_sum_v(
        Tensor(ins[static_cast<size_t>(k)].data(), Shape{n}, DType::f32), counts,
        Tensor(receive.data(), Shape{500}, DType::f32), [&, k] {
          consumed[static_cast<size_t>(k)] = receive;
          order.push_back(k);
        });
  world().wait_started_until(1);
  world().wait_started();
  ASSERT_EQ(order, (std::vector<int>{0, 1, 2, 3, 4}));
  for (int k = 0; k < kStarted; ++k)
    expect_sums(std::vector<double>(consumed[static_cast<size_t>(k)].begin(),
                                    consumed[static_cast<size_t>(k)].end()),
                n, 10 + k, r * 500, 1e-6, false);
}

// Gathering to one rank, pieces of any length (one empty): the root gets them in rank order, the
// others keep nothing.
TEST(Collectives, GatherToOneRankConcatenatesInRankOrder) {
  const int N = world().size(), r = world().rank();
  std::vector<int64_t> counts;
  int64_t total = 0;
  for (int q = 0; q < N; ++q) {
    counts.push_back(q == 1 ? 0 : 777 * (q + 1));
    total += counts.back();
  }
  for (const int root : {0, N - 1}) {
    FVec in = input(r, counts[static_cast<size_t>(r)], 8);
    FVec out(static_cast<size_t>(r == root ? total : 0), -7.f);
    world().gather_v(Tensor(in.data(), Shape{static_cast<int64_t>(in.size())}, DType::f32), counts,
                     Tensor(out.data(), Shape{static_cast<int64_t>(out.size())}, DType::f32), root);
    if (r != root) continue;
    FVec want;
    for (int q = 0; q < N; ++q) {
      const FVec piece = input(q, counts[static_cast<size_t>(q)], 8);
      want.insert(want.end(), piece.begin(), piece.end());
    }
    EXPECT_EQ(out, want) << "root " << root;
  }
  // Bytes, through gather_pieces: only the root gets them.
  std::vector<uint8_t> mine(static_cast<size_t>(r + 1), static_cast<uint8_t>(r + 1));
  std::vector<int64_t> shares;
  const std::vector<uint8_t> got =
      gather_pieces(world(), Tensor(mine.data(), Shape{r + 1}, DType::u8), &shares, /*root=*/0);
  EXPECT_EQ(shares.size(), static_cast<size_t>(N));
  if (r == 0) {
    std::vector<uint8_t> want;
    for (int q = 0; q < N; ++q) want.insert(want.end(), static_cast<size_t>(q + 1), q + 1);
    EXPECT_EQ(got, want);
  } else {
    EXPECT_TRUE(got.empty());
  }
}

TEST(Collectives, AllGatherConcatenatesInRankOrder) {
  const int N = world().size(), r = world().rank();
  const int64_t chunk = 12'347;
  FVec in = input(r, chunk, 5), out(chunk * N, -7.f);
  world().all_gather(Tensor(in.data(), Shape{chunk}, DType::f32),
                     Tensor(out.data(), Shape{chunk * N}, DType::f32));
  for (int q = 0; q < N; ++q)
    EXPECT_EQ(FVec(out.begin() + q * chunk, out.begin() + (q + 1) * chunk), input(q, chunk, 5))
        << "chunk of rank " << q;
  // In place, as ZeRO gathers: this rank's chunk already sits in the full buffer.
  std::vector<uint16_t> full(chunk * N, 0);
  const std::vector<uint16_t> mine = to_bf16(input(r, chunk, 6));
  std::copy(mine.begin(), mine.end(), full.begin() + r * chunk);
  world().all_gather(Tensor(full.data() + r * chunk, Shape{chunk}, DType::bf16),
                     Tensor(full.data(), Shape{chunk * N}, DType::bf16));
  for (int q = 0; q < N; ++q)
    EXPECT_EQ(std::vector<uint16_t>(full.begin() + q * chunk, full.begin() + (q + 1) * chunk),
              to_bf16(input(q, chunk, 6)))
        << "in place, chunk of rank " << q;
}

// Gathering pieces of any length (one empty) to every rank, blocking and started: the pieces in
// rank order everywhere. Started gathers are waited for one at a time by their tickets
// (Communicator::started), as ZeRO stage 3 waits for the block it needs while the next one's
// gather may still run.
TEST(Collectives, AllGatherOfUnequalPiecesConcatenatesInRankOrder) {
  const int N = world().size(), r = world().rank();
  std::vector<int64_t> counts;
  int64_t total = 0;
  for (int q = 0; q < N; ++q) {
    counts.push_back(q == 1 ? 0 : 501 * (q + 1));
    total += counts.back();
  }
  auto want = [&](int salt) {
    FVec w;
    for (int q = 0; q < N; ++q) {
      const FVec piece = input(q, counts[static_cast<size_t>(q)], salt);
      w.insert(w.end(), piece.begin(), piece.end());
    }
    return w;
  };
  const int64_t mine = counts[static_cast<size_t>(r)];
  FVec in = input(r, mine, 20), out(static_cast<size_t>(total), -7.f);
  world().all_gather_v(Tensor(in.data(), Shape{mine}, DType::f32), counts,
                       Tensor(out.data(), Shape{total}, DType::f32));
  EXPECT_EQ(out, want(20));
  constexpr int kStarted = 4;
  std::vector<FVec> ins, outs(kStarted, FVec(static_cast<size_t>(total), -7.f));
  std::vector<int64_t> tickets;
  for (int k = 0; k < kStarted; ++k) {
    ins.push_back(input(r, mine, 21 + k));
    world().start_all_gather_v(
        Tensor(ins.back().data(), Shape{mine}, DType::f32), counts,
        Tensor(outs[static_cast<size_t>(k)].data(), Shape{total}, DType::f32));
    tickets.push_back(world().started());
  }
  for (int k = 0; k < kStarted; ++k) {
    world().wait_started_until(world().started() - tickets[static_cast<size_t>(k)]);
    EXPECT_EQ(outs[static_cast<size_t>(k)], want(21 + k)) << "started gather " << k;
  }
  world().wait_started();
  // Refused alike on every rank: counts that do not add up to out.
  FVec short_out(static_cast<size_t>(total - 1));
  EXPECT_THROW(world().all_gather_v(Tensor(in.data(), Shape{mine}, DType::f32), counts,
                                    Tensor(short_out.data(), Shape{total - 1}, DType::f32)),
               Error);
}

TEST(Collectives, BroadcastCopiesTheRootsBuffer) {
  const int64_t n = 5003;
  for (int root = 0; root < world().size(); ++root) {
    FVec v = input(world().rank(), n, 7 + root);
    world().broadcast(Tensor(v.data(), Shape{n}, DType::f32), root);
    EXPECT_EQ(v, input(root, n, 7 + root)) << "root " << root;
  }
}

// Refused on every rank alike, before anything is sent, so no rank waits for the others.
TEST(Collectives, MismatchedBuffersAreRefusedBeforeCommunicating) {
  const int N = world().size();
  FVec a(10 * N), b(7), c(10);
  std::vector<int32_t> ints(10);
  EXPECT_THROW(world().reduce_scatter_sum(Tensor(a.data(), Shape{10 * N}, DType::f32),
                                          Tensor(b.data(), Shape{7}, DType::f32)),
               Error);
  EXPECT_THROW(world().all_gather(Tensor(c.data(), Shape{10}, DType::f32),
                                  Tensor(b.data(), Shape{7}, DType::f32)),
               Error);
  EXPECT_THROW(world().all_reduce_sum(Tensor(ints.data(), Shape{10}, DType::i32)), Error);
  EXPECT_THROW(world().broadcast(Tensor(c.data(), Shape{10}, DType::f32), N), Error);
  EXPECT_THROW(world().reduce_scatter_sum(Tensor(a.data(), Shape{10 * N}, DType::f32),
                                          Tensor(a.data(), Shape{10}, DType::f32)),
               Error);  // out inside in
  world().barrier();    // and everyone is still in step
}

}  // namespace
}  // namespace brisk::testing
