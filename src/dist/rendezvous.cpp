// The TCP rendezvous (see rendezvous.h): POSIX sockets, every wait bounded by poll().
#include "dist/rendezvous.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>

#include "core/error.h"

namespace brisk {
namespace {

constexpr uint32_t kMagic = 0x4b535242;  // "BRSK"
constexpr uint32_t kVersion = 1;

using Clock = std::chrono::steady_clock;

// A socket closed when it goes out of scope.
struct Socket {
  int fd = -1;
  explicit Socket(int f = -1) : fd(f) {}
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;
  ~Socket() {
    if (fd >= 0) ::close(fd);
  }
};

// Milliseconds left until `deadline` (0 when past it).
int ms_left(Clock::time_point deadline) {
  const auto left =
      std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return left > 0 ? static_cast<int>(std::min<int64_t>(left, 1 << 30)) : 0;
}

// Waits until fd is ready for `events`; false at the deadline.
bool wait_for(int fd, short events, Clock::time_point deadline) {
  for (;;) {
    pollfd p{fd, events, 0};
    const int r = ::poll(&p, 1, ms_left(deadline));
    if (r > 0) return true;
    if (r == 0) return false;
    if (errno != EINTR) return false;
  }
}

// Moves exactly n bytes, or fails naming `what`.
void send_all(int fd, const void* data, size_t n, Clock::time_point deadline, const char* what) {
  const auto* p = static_cast<const char*>(data);
  while (n > 0) {
    BRISK_CHECK(wait_for(fd, POLLOUT, deadline), "rendezvous: timed out sending ", what);
    const ssize_t k = ::send(fd, p, n, MSG_NOSIGNAL);
    if (k < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    BRISK_CHECK(k > 0, "rendezvous: sending ", what, " failed: ", std::strerror(errno));
    p += k;
    n -= static_cast<size_t>(k);
  }
}

void recv_all(int fd, void* data, size_t n, Clock::time_point deadline, const char* what) {
  auto* p = static_cast<char*>(data);
  while (n > 0) {
    BRISK_CHECK(wait_for(fd, POLLIN, deadline), "rendezvous: timed out waiting for ", what);
    const ssize_t k = ::recv(fd, p, n, 0);
    if (k < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    BRISK_CHECK(k > 0, "rendezvous: the connection closed before ", what, " arrived");
    p += k;
    n -= static_cast<size_t>(k);
  }
}

struct Greeting {
  uint32_t magic, version;
  int32_t rank, size;
};

std::vector<uint8_t> serve(const LaunchInfo& launch, const std::vector<uint8_t>& blob,
                           Clock::time_point deadline, double timeout) {
  Socket listener(::socket(AF_INET6, SOCK_STREAM, 0));
  bool v6 = listener.fd >= 0;
  if (!v6) listener.fd = ::socket(AF_INET, SOCK_STREAM, 0);
  BRISK_CHECK(listener.fd >= 0, "rendezvous: cannot open a socket: ", std::strerror(errno));
  const int one = 1, zero = 0;
  ::setsockopt(listener.fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  int bound = -1;
  if (v6) {
    ::setsockopt(listener.fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);  // IPv4 too
    sockaddr_in6 a{};
    a.sin6_family = AF_INET6;
    a.sin6_addr = in6addr_any;
    a.sin6_port = htons(static_cast<uint16_t>(launch.master_port));
    bound = ::bind(listener.fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  } else {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_ANY);
    a.sin_port = htons(static_cast<uint16_t>(launch.master_port));
    bound = ::bind(listener.fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  }
  BRISK_CHECK(bound == 0, "rendezvous: rank 0 cannot listen on MASTER_PORT=", launch.master_port,
              ": ", std::strerror(errno));
  BRISK_CHECK(::listen(listener.fd, 128) == 0, "rendezvous: listen failed: ", std::strerror(errno));
  std::vector<bool> seen(static_cast<size_t>(launch.size), false);
  for (int served = 1; served < launch.size; ++served) {
    BRISK_CHECK(wait_for(listener.fd, POLLIN, deadline), "rendezvous: rank 0 waited ", timeout,
                " s on port ", launch.master_port, " and ", launch.size - served, " of ",
                launch.size - 1, " other ranks did not connect");
    Socket peer(::accept(listener.fd, nullptr, nullptr));
    BRISK_CHECK(peer.fd >= 0, "rendezvous: accept failed: ", std::strerror(errno));
    Greeting g{};
    recv_all(peer.fd, &g, sizeof g, deadline, "a rank's greeting");
    BRISK_CHECK(g.magic == kMagic && g.version == kVersion,
                "rendezvous: something that is not a brisk rank connected to MASTER_PORT=",
                launch.master_port);
    BRISK_CHECK(g.size == launch.size, "rendezvous: a rank says WORLD_SIZE=", g.size,
                ", rank 0 has WORLD_SIZE=", launch.size);
    BRISK_CHECK(g.rank >= 1 && g.rank < launch.size && !seen[static_cast<size_t>(g.rank)],
                "rendezvous: rank ", g.rank, " connected ",
                g.rank >= 1 && g.rank < launch.size ? "twice" : "(outside the world)");
    seen[static_cast<size_t>(g.rank)] = true;
    send_all(peer.fd, blob.data(), blob.size(), deadline, "rank 0's data");
  }
  return blob;
}

std::vector<uint8_t> join(const LaunchInfo& launch, size_t blob_size, Clock::time_point deadline,
                          double timeout) {
  BRISK_CHECK(!launch.master_addr.empty(), "rendezvous: MASTER_ADDR is not set");
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const std::string port = std::to_string(launch.master_port);
  const int rc = ::getaddrinfo(launch.master_addr.c_str(), port.c_str(), &hints, &found);
  BRISK_CHECK(rc == 0 && found, "rendezvous: MASTER_ADDR=", launch.master_addr,
              " cannot be resolved: ", ::gai_strerror(rc));
  std::string last_error = "no address";
  // Rank 0 may not listen yet: try again until the deadline.
  for (;;) {
    for (addrinfo* a = found; a; a = a->ai_next) {
      Socket s(::socket(a->ai_family, a->ai_socktype, a->ai_protocol));
      if (s.fd < 0) continue;
      if (::connect(s.fd, a->ai_addr, a->ai_addrlen) != 0) {
        last_error = std::strerror(errno);
        continue;
      }
      ::freeaddrinfo(found);
      const Greeting g{kMagic, kVersion, launch.rank, launch.size};
      send_all(s.fd, &g, sizeof g, deadline, "the greeting");
      std::vector<uint8_t> blob(blob_size);
      recv_all(s.fd, blob.data(), blob.size(), deadline, "rank 0's data");
      return blob;
    }
    if (ms_left(deadline) == 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(std::min(100, ms_left(deadline))));
  }
  ::freeaddrinfo(found);
  BRISK_FAIL("rendezvous: rank ", launch.rank, " found no rank 0 listening on ", launch.master_addr,
             ":", launch.master_port, " within ", timeout, " s (", last_error, ")");
}

}  // namespace

std::vector<uint8_t> rendezvous_share(const LaunchInfo& launch, const std::vector<uint8_t>& blob,
                                      size_t blob_size, double timeout_seconds) {
  BRISK_CHECK(launch.size >= 1 && launch.rank >= 0 && launch.rank < launch.size,
              "rendezvous: rank ", launch.rank, " of ", launch.size);
  BRISK_CHECK(launch.size == 1 || (launch.master_port > 0 && launch.master_port < 65536),
              "rendezvous: MASTER_PORT must be set to a port (1-65535) for ", launch.size,
              " ranks");
  BRISK_CHECK(launch.rank != 0 || blob.size() == blob_size, "internal error: rank 0's blob holds ",
              blob.size(), " bytes, not ", blob_size);
  const auto deadline =
      Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(timeout_seconds * 1000));
  if (launch.size == 1) return blob;
  return launch.rank == 0 ? serve(launch, blob, deadline, timeout_seconds)
                          : join(launch, blob_size, deadline, timeout_seconds);
}

}  // namespace brisk
