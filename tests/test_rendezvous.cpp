// The TCP rendezvous of torchrun-style launches (parallel/rendezvous.h), with every rank a thread
// of this process on the loopback interface: rank 0's bytes reach every rank; every rank's keys
// reach every other; a wrong world size, a rank connecting twice, a missing rank, a missing rank 0
// or a port already taken end with a message, in bounded time. Then Gloo's communicator, which
// finds its ranks through it (the full suite runs across processes in tests/parallel/).
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "parallel/communicator.h"
#include "parallel/rendezvous.h"
#include "parallel/route.h"
#include "test_support.h"

namespace brisk::testing {
namespace {

// The loopback address at `port` (0: the kernel's pick, where bound).
sockaddr_in loopback(int port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(port));
  return a;
}

// A port nobody listens on now (the kernel's pick for a socket closed at once).
int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a = loopback(0);
  EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  socklen_t len = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

// A socket bound to a loopback port and connected to that same port, where nobody listens, is
// connected to itself (TCP's simultaneous open: what a rank connecting to rank 0's port before it
// listens may be given, and must not take for rank 0); a connection to a listener is not.
TEST(Rendezvous, AConnectionToItselfIsToldFromOneToAListener) {
  const int self = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a = loopback(0);
  ASSERT_EQ(::bind(self, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  socklen_t len = sizeof a;
  ASSERT_EQ(::getsockname(self, reinterpret_cast<sockaddr*>(&a), &len), 0);
  ASSERT_EQ(::connect(self, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  EXPECT_TRUE(connected_to_itself(self));
  ::close(self);

  const int listener = ::socket(AF_INET, SOCK_STREAM, 0),
            client = ::socket(AF_INET, SOCK_STREAM, 0);
  a = loopback(0);
  ASSERT_EQ(::bind(listener, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  ASSERT_EQ(::listen(listener, 1), 0);
  ASSERT_EQ(::getsockname(listener, reinterpret_cast<sockaddr*>(&a), &len), 0);
  ASSERT_EQ(::connect(client, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  EXPECT_FALSE(connected_to_itself(client));
  ::close(client);
  ::close(listener);
}

// Connects to the loopback port (retrying while nobody listens), sends `bytes` and hangs up.
void send_raw(int port, const std::string& bytes) {
  for (int attempt = 0; attempt < 200; ++attempt) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a = loopback(port);
    if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) {
      if (!bytes.empty())
        EXPECT_EQ(::send(fd, bytes.data(), bytes.size(), 0), ssize_t(bytes.size()));
      ::close(fd);
      return;
    }
    ::close(fd);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ADD_FAILURE() << "nobody listened on port " << port;
}

LaunchInfo rank_of(int rank, int size, int port) {
  LaunchInfo l;
  l.launcher = Launcher::torchrun;
  l.rank = rank;
  l.size = size;
  l.master_addr = "127.0.0.1";
  l.master_port = port - 1;
  l.rendezvous_port = port;
  return l;
}

TEST(Rendezvous, RankZerosBytesReachEveryRank) {
  const int port = free_port();
  std::vector<uint8_t> id(128);
  for (size_t i = 0; i < id.size(); ++i) id[i] = static_cast<uint8_t>(i * 7 + 3);
  constexpr int kRanks = 4;
  std::vector<std::future<std::vector<uint8_t>>> ranks;
  // The other ranks start first: they wait for rank 0 to listen.
  for (int r = kRanks - 1; r >= 0; --r)
    ranks.push_back(std::async(std::launch::async, [&, r] {
      return rendezvous_share(rank_of(r, kRanks, port), r == 0 ? id : std::vector<uint8_t>(),
                              id.size(), 20.0);
    }));
  for (auto& f : ranks) EXPECT_EQ(f.get(), id);
  // One process needs no rendezvous.
  EXPECT_EQ(rendezvous_share(rank_of(0, 1, 0), id, id.size(), 1.0), id);
}

TEST(Rendezvous, DisagreementsAndAbsencesEndWithAMessage) {
  const std::vector<uint8_t> id(16, 9);
  {  // a rank with another world size
    const int port = free_port();
    auto zero = std::async(std::launch::async, [&] {
      return rendezvous_share(rank_of(0, 2, port), id, id.size(), 10.0);
    });
    auto one = std::async(std::launch::async, [&] {
      return rendezvous_share(rank_of(1, 3, port), {}, id.size(), 10.0);
    });
    expect_error([&] { zero.get(); }, "a rank says WORLD_SIZE=3, rank 0 has WORLD_SIZE=2");
    EXPECT_THROW(one.get(), Error);  // rank 0 hung up on it
  }
  {  // two ranks claim rank 1
    const int port = free_port();
    auto zero = std::async(std::launch::async, [&] {
      return rendezvous_share(rank_of(0, 3, port), id, id.size(), 10.0);
    });
    auto first = std::async(std::launch::async, [&] {
      return rendezvous_share(rank_of(1, 3, port), {}, id.size(), 10.0);
    });
    EXPECT_EQ(first.get(), id);
    auto again = std::async(std::launch::async, [&] {
      return rendezvous_share(rank_of(1, 3, port), {}, id.size(), 10.0);
    });
    expect_error([&] { zero.get(); }, "rank 1 connected twice");
    EXPECT_THROW(again.get(), Error);
  }
  // Something that is not a brisk rank: 16 bytes of something else, or a connection that closes
  // before its greeting.
  for (const std::string garbage : {std::string("GET / HTTP/1.1\r\n\r\n"), std::string()}) {
    const int port = free_port();
    auto zero = std::async(std::launch::async, [&] {
      return rendezvous_share(rank_of(0, 2, port), id, id.size(), 10.0);
    });
    send_raw(port, garbage);
    expect_error([&] { zero.get(); },
                 garbage.empty() ? "the connection closed before a rank's" : "is not a brisk rank");
  }
  const auto start = std::chrono::steady_clock::now();
  {  // a rank that never comes
    const int port = free_port();
    expect_error([&] { rendezvous_share(rank_of(0, 2, port), id, id.size(), 0.5); },
                 "1 of 1 other ranks did not connect");
  }
  // no rank 0
  expect_error([&] { rendezvous_share(rank_of(1, 2, free_port()), {}, id.size(), 0.5); },
               "found no rank 0 listening on 127.0.0.1:");
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 5.0);
  expect_error([&] { rendezvous_share(rank_of(1, 2, 0), {}, id.size(), 0.5); },
               "set MASTER_PORT (brisk listens on MASTER_PORT + 1) or BRISK_RENDEZVOUS_PORT");
}

// As Gloo uses the store: each rank sets its own key, then reads every other rank's, in any order.
TEST(Rendezvous, EveryRanksKeysReachEveryOtherRank) {
  const int port = free_port();
  constexpr int kRanks = 3;
  std::vector<std::future<std::vector<std::string>>> ranks;
  for (int r = kRanks - 1; r >= 0; --r)
    ranks.push_back(std::async(std::launch::async, [&, r] {
      RendezvousStore store(rank_of(r, kRanks, port), 20.0);
      store.set("rank" + std::to_string(r), std::vector<uint8_t>(static_cast<size_t>(r + 1), 'a'));
      std::vector<std::string> got;
      for (int q = 0; q < kRanks; ++q) {
        const std::vector<uint8_t> v = store.get("rank" + std::to_string(q));
        got.emplace_back(v.begin(), v.end());
      }
      store.finish();
      return got;
    }));
  for (auto& f : ranks) EXPECT_EQ(f.get(), (std::vector<std::string>{"a", "aa", "aaa"}));
}

// Something else (torchrun's own store, say) holds the port: rank 0 says which port, why it is
// that one, and how to choose another.
TEST(Rendezvous, APortAlreadyTakenIsRefusedNamingIt) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  ASSERT_EQ(::listen(fd, 1), 0);
  socklen_t len = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  const int port = ntohs(a.sin_port);
  expect_error([&] { rendezvous_share(rank_of(0, 2, port), {1}, 1, 1.0); },
               "rank 0 cannot listen on port " + std::to_string(port) +
                   " (brisk's rendezvous port: BRISK_RENDEZVOUS_PORT, else MASTER_PORT + 1): "
                   "Address already in use; set BRISK_RENDEZVOUS_PORT to a free port");
  ::close(fd);
}

// Ranks as threads of this process (a torchrun-style launch of 3): sums of small whole numbers
// (exact in any order, bf16 too), maxima, unequal pieces summed to their owners (one empty),
// gathers and a broadcast, and a started sum whose consumer runs before the wait returns.
TEST(Gloo, RanksAsThreadsCommunicateThroughIt) {
  if (!gloo_built_in()) GTEST_SKIP() << "this brisk was built without Gloo";
  const int port = free_port();
  constexpr int N = 3;
  auto rank = [&](int r) {
    LaunchInfo l = rank_of(r, N, port);
    const std::unique_ptr<Communicator> comm = make_communicator(l);
    EXPECT_NE(comm->name().find("Gloo"), std::string::npos) << comm->name();
    std::vector<float> f(1001);
    std::vector<uint16_t> h(1001);
    for (size_t i = 0; i < f.size(); ++i) {
      f[i] = static_cast<float>((i + static_cast<size_t>(r)) % 50);
      h[i] = float_to_bf16(f[i]);
    }
    comm->all_reduce_sum(Tensor(f.data(), Shape{1001}, DType::f32));
    comm->all_reduce_sum(Tensor(h.data(), Shape{1001}, DType::bf16));
    for (size_t i = 0; i < f.size(); ++i) {
      const float want = static_cast<float>(i % 50 + (i + 1) % 50 + (i + 2) % 50);
      EXPECT_EQ(f[i], want) << i;
      EXPECT_EQ(bf16_to_float(h[i]), want) << i;
    }
    // The largest of 70,000 values, gathered in two pieces.
    std::vector<float> m(70'000);
    for (size_t i = 0; i < m.size(); ++i)
      m[i] = static_cast<float>((i + static_cast<size_t>(r)) % 50);
    comm->all_reduce_max(Tensor(m.data(), Shape{70'000}, DType::f32));
    for (size_t i = 0; i < m.size(); ++i)
      EXPECT_EQ(m[i], static_cast<float>(std::max({i % 50, (i + 1) % 50, (i + 2) % 50}))) << i;
    // Pieces of 4, 0 and 5 values: rank r's in is r + 1 everywhere.
    const std::vector<int64_t> counts{4, 0, 5};
    std::vector<double> in(9, r + 1.0), out(static_cast<size_t>(counts[static_cast<size_t>(r)]));
    bool consumed = false;
    comm->start_reduce_scatter_sum_v(Tensor(in.data(), Shape{9}, DType::f64), counts,
                                     Tensor(out.data(), Shape{counts[r]}, DType::f64),
                                     [&] { consumed = true; });
    comm->wait_started();
    EXPECT_TRUE(consumed);
    EXPECT_EQ(out, std::vector<double>(out.size(), 6.0));
    // Every rank's piece (rank q: counts[q] values of q) gathered to rank 2, and to all.
    std::vector<double> mine(out.size(), r), all(9, -1.0), to_all(9, -1.0);
    comm->gather_v(Tensor(mine.data(), Shape{counts[r]}, DType::f64), counts,
                   Tensor(all.data(), Shape{9}, DType::f64), 2);
    comm->all_gather_v(Tensor(mine.data(), Shape{counts[r]}, DType::f64), counts,
                       Tensor(to_all.data(), Shape{9}, DType::f64));
    const std::vector<double> joined{0, 0, 0, 0, 2, 2, 2, 2, 2};
    if (r == 2) EXPECT_EQ(all, joined);
    EXPECT_EQ(to_all, joined);
    double value = r == 1 ? 42.5 : 0.0;
    comm->broadcast(Tensor(&value, Shape{1}, DType::f64), 1);
    EXPECT_EQ(value, 42.5);
    comm->barrier();
  };
  std::vector<std::future<void>> ranks;
  for (int r = 0; r < N; ++r) ranks.push_back(std::async(std::launch::async, rank, r));
  for (auto& f : ranks) f.get();
}

}  // namespace
}  // namespace brisk::testing

namespace brisk::testing {
namespace {

// The route to MASTER_ADDR: from loopback to loopback here (the two-host case runs in
// Dist.TwoHostsTrainAsOne); a name that does not resolve is refused naming the variable.
TEST(Route, TheLocalEndOfTheRouteToAHostIsFoundOrRefusedByName) {
  const LocalRoute local = route_to("127.0.0.1", "MASTER_ADDR");
  EXPECT_EQ(local.address, "127.0.0.1");
  EXPECT_EQ(local.interface, "lo");
  EXPECT_TRUE(is_loopback("127.0.0.1") && is_loopback("localhost") && is_loopback("::1"));
  EXPECT_FALSE(is_loopback("10.0.0.1"));
  expect_error([] { route_to("", "MASTER_ADDR"); }, "MASTER_ADDR is not set");
  // A numeric address of no family resolves without asking a name server.
  expect_error([] { route_to("[10.0.0.1", "MASTER_ADDR"); }, "MASTER_ADDR=[10.0.0.1 does not");
}

}  // namespace
}  // namespace brisk::testing
