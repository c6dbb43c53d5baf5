// Sub-communicators, point to point and all-to-all, and the device mesh built from them, on every
// rank of the job (mpirun's 2, 3 and 4 ranks), against what each rank computes for the others
// from their ranks. Copies: bit-exact; sums of small integers: exact.
#include <gtest/gtest.h>

#include <array>
#include <string>
#include <vector>

#include "core/error.h"
#include "parallel/launch.h"
#include "parallel/mesh.h"
#include "parallel/test_world.h"

namespace brisk::testing {
namespace {

using FVec = std::vector<float>;

Tensor view(FVec& v) {
  return Tensor(v.data(), Shape{static_cast<int64_t>(v.size())}, DType::f32);
}

// Rank r's message to rank p: n values telling both apart.
FVec message(int r, int p, int n) {
  FVec v(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) v[static_cast<size_t>(i)] = 1000.f * r + 10.f * p + 0.25f * i;
  return v;
}

TEST(PeerToPeer, SendReceiveAndExchangeAroundARing) {
  NEEDS_MPI();
  const int N = world().size(), r = world().rank();
  const int next = (r + 1) % N, prev = (r + N - 1) % N;
  FVec out = message(r, next, 1001), in(1001, -1.f);
  world().send_receive(view(out), next, view(in), prev);
  EXPECT_EQ(in, message(prev, r, 1001));
  // Rank 0 to the last rank, blocking on both sides.
  FVec one(17, -1.f);
  if (r == 0) {
    FVec m = message(0, N - 1, 17);
    world().send(view(m), N - 1);
  } else if (r == N - 1) {
    world().receive(view(one), 0);
    EXPECT_EQ(one, message(0, N - 1, 17));
  }
  world().barrier();
}

TEST(PeerToPeer, AShortMessageAndABadPeerAreNamed) {
  NEEDS_MPI();
  const int N = world().size(), r = world().rank();
  FVec three = message(0, 1, 3), four(4, 0.f);
  if (r == 0) world().send(view(three), 1);
  if (r == 1) {
    try {
      world().receive(view(four), 0);
      ADD_FAILURE() << "a 3-element message filled a 4-element buffer";
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()), "receive: rank 0 sent 3 elements, 4 expected");
    }
  }
  try {
    world().send(view(three), r);
    ADD_FAILURE() << "sent to itself";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              "send: rank " + std::to_string(r) + " is not another rank of " + std::to_string(N));
  }
  world().barrier();
}

TEST(PeerToPeer, AllToAllSendsChunkRToRankR) {
  NEEDS_MPI();
  const int N = world().size(), r = world().rank(), chunk = 513;
  FVec in, out(static_cast<size_t>(N * chunk), -1.f), want;
  for (int p = 0; p < N; ++p) {
    const FVec to_p = message(r, p, chunk), from_p = message(p, r, chunk);
    in.insert(in.end(), to_p.begin(), to_p.end());
    want.insert(want.end(), from_p.begin(), from_p.end());
  }
  world().all_to_all(view(in), view(out));
  EXPECT_EQ(out, want);
  FVec odd(static_cast<size_t>(N * chunk + 1)), odd_out(odd.size());
  EXPECT_THROW(world().all_to_all(view(odd), view(odd_out)), Error);
}

// Rank r's piece for rank p: of 0 to 4 elements, some empty.
int piece(int r, int p) {
  return (3 * r + p) % 5;
}

TEST(PeerToPeer, AllToAllVSendsPiecesOfAnyLength) {
  NEEDS_MPI();
  const int N = world().size(), r = world().rank();
  FVec in, want;
  std::vector<int64_t> send, receive;
  for (int p = 0; p < N; ++p) {
    const FVec to_p = message(r, p, piece(r, p)), from_p = message(p, r, piece(p, r));
    in.insert(in.end(), to_p.begin(), to_p.end());
    want.insert(want.end(), from_p.begin(), from_p.end());
    send.push_back(piece(r, p));
    receive.push_back(piece(p, r));
  }
  FVec out(want.size(), -1.f);
  world().all_to_all_v(view(in), send, view(out), receive);
  EXPECT_EQ(out, want);
  // Counts that do not add up to the buffers are refused before anything is sent.
  FVec longer(out.size() + 1);
  EXPECT_THROW(world().all_to_all_v(view(in), send, view(longer), receive), Error);
  receive.pop_back();
  EXPECT_THROW(world().all_to_all_v(view(in), send, view(out), receive), Error);
}

TEST(Split, EachGroupSumsAmongItselfInKeyOrder) {
  NEEDS_MPI();
  const int N = world().size(), r = world().rank();
  // Even and odd ranks, each group ranked backwards.
  const std::unique_ptr<Communicator> group = world().split(r % 2, -r);
  int members = 0, after = 0;
  double sum = 0;
  for (int p = r % 2; p < N; p += 2) {
    ++members;
    sum += p;
    if (p > r) ++after;
  }
  EXPECT_EQ(group->size(), members);
  EXPECT_EQ(group->rank(), after);
  std::vector<double> v{static_cast<double>(r)};
  group->all_reduce_sum(Tensor(v.data(), Shape{1}, DType::f64));
  EXPECT_EQ(v[0], sum);
  // The group's own point to point: its rank 0 to its last.
  if (group->size() > 1) {
    FVec m = message(group->rank(), 0, 5), got(5);
    if (group->rank() == group->size() - 1) group->send(view(m), 0);
    if (group->rank() == 0) {
      group->receive(view(got), group->size() - 1);
      EXPECT_EQ(got, message(group->size() - 1, 0, 5));
    }
  }
  world().barrier();
}

// Expert parallelism's division of the data ranks: each run of ep neighbouring data ranks is an
// expert group, the ranks at the same place in their runs the expert replicas; a group of every
// rank is the world itself (no communicator of its own).
TEST(Mesh, ExpertRunsDivideTheDataRanks) {
  NEEDS_MPI();
  const int N = world().size(), r = world().rank();
  for (int ep = 1; ep <= N; ++ep) {
    if (N % ep) continue;
    SCOPED_TRACE("ep " + std::to_string(ep));
    DeviceMesh mesh(world(), mesh_shape(N, 1, 1, 1, ep));
    EXPECT_EQ(&mesh.group(MeshDim::data), &world());
    EXPECT_EQ(&mesh.replicas(), &world());
    EXPECT_EQ(mesh.coordinate(MeshDim::expert), r % ep);
    Communicator& experts = mesh.group(MeshDim::expert);
    Communicator& replicas = mesh.expert_replicas();
    EXPECT_EQ(experts.size(), ep);
    EXPECT_EQ(experts.rank(), r % ep);
    EXPECT_EQ(replicas.size(), N / ep);
    EXPECT_EQ(replicas.rank(), r / ep);
    EXPECT_EQ(ep == N, &experts == &world());
    // Members by their sums of world ranks: the run r / ep, and the place r % ep in each run.
    std::vector<double> v{static_cast<double>(r)};
    experts.all_reduce_sum(Tensor(v.data(), Shape{1}, DType::f64));
    const int first = r / ep * ep;
    EXPECT_EQ(v[0], ep * first + ep * (ep - 1) / 2.0);
    v = {static_cast<double>(r)};
    replicas.all_reduce_sum(Tensor(v.data(), Shape{1}, DType::f64));
    double want = 0;
    for (int k = r % ep; k < N; k += ep) want += k;
    EXPECT_EQ(v[0], want);
  }
  world().barrier();
}

// Every shape of the world's ranks: coordinates, group sizes and ranks, and each group's sum of
// its world ranks against the members the shape says it has.
TEST(Mesh, EveryShapeOfTheWorldGroupsTheRightRanks) {
  NEEDS_MPI();
  const int N = world().size();
  int shapes = 0;
  for (int pp = 1; pp <= N; ++pp)
    for (int sp = 1; sp <= N; ++sp)
      for (int tp = 1; tp <= N; ++tp) {
        if (N % (pp * sp * tp)) continue;
        ++shapes;
        const MeshShape shape = mesh_shape(N, tp, pp, sp);
        DeviceMesh mesh(world(), shape);
        const std::array<int, kMeshDims> mine = mesh_coordinate(shape, world().rank());
        EXPECT_EQ(mesh_rank(shape, mine), world().rank());
        for (int d = 0; d < kMeshDims; ++d) {
          const auto dim = static_cast<MeshDim>(d);
          Communicator& g = mesh.group(dim);
          EXPECT_EQ(mesh.coordinate(dim), mine[d]) << shape.str();
          EXPECT_EQ(g.size(), shape[dim]) << shape.str();
          EXPECT_EQ(g.rank(), mine[d]) << shape.str();
          double want = 0;
          for (int k = 0; k < shape[dim]; ++k) {
            std::array<int, kMeshDims> member = mine;
            member[d] = k;
            want += mesh_rank(shape, member);
          }
          std::vector<double> v{static_cast<double>(world().rank())};
          g.all_reduce_sum(Tensor(v.data(), Shape{1}, DType::f64));
          EXPECT_EQ(v[0], want) << shape.str() << ", dimension " << d;
        }
      }
  EXPECT_GE(shapes, 4);  // 2 ranks: data, pipeline, sequence or tensor 2; more for 3 and 4
}

}  // namespace
}  // namespace brisk::testing
