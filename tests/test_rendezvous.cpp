// The TCP rendezvous of torchrun-style launches (dist/rendezvous.h), with every rank a thread of
// this process on the loopback interface: rank 0's bytes reach every rank; a wrong world size, a
// rank connecting twice, a missing rank or a missing rank 0 end with a message, in bounded time.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "dist/rendezvous.h"
#include "test_support.h"

namespace brisk::testing {
namespace {

// A port nobody listens on now (the kernel's pick for a socket closed at once).
int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  socklen_t len = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

// Connects to the loopback port (retrying while nobody listens), sends `bytes` and hangs up.
void send_raw(int port, const std::string& bytes) {
  for (int attempt = 0; attempt < 200; ++attempt) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(static_cast<uint16_t>(port));
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
  l.master_port = port;
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
               "MASTER_PORT must be set");
}

}  // namespace
}  // namespace brisk::testing
