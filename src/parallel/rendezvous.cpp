// The TCP rendezvous (see rendezvous.h): POSIX sockets, every wait bounded by poll(). Rank 0's
// thread serves the other ranks' requests; its own go to the store directly.
#include "parallel/rendezvous.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <utility>

#include "core/error.h"

namespace brisk {
namespace {

constexpr uint32_t kMagic = 0x4b535242;  // "BRSK"
constexpr uint32_t kVersion = 2;
constexpr uint32_t kSet = 1, kGet = 2;
constexpr uint32_t kMaxKey = 1 << 12;
constexpr uint64_t kMaxValue = uint64_t{1} << 24;

using Clock = std::chrono::steady_clock;

// A socket closed when it goes out of scope.
struct Socket {
  int fd = -1;
  explicit Socket(int f = -1) : fd(f) {}
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;
  ~Socket() { close(); }
  void close() {
    if (fd >= 0) ::close(fd);
    fd = -1;
  }
};

// Milliseconds left until `deadline` (0 when past it).
int ms_left(Clock::time_point deadline) {
  const auto left =
      std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return left > 0 ? static_cast<int>(std::min<int64_t>(left, 1 << 30)) : 0;
}

Clock::time_point deadline_after(double seconds) {
  return Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000));
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

void recv_all(int fd, void* data, size_t n, Clock::time_point deadline, const std::string& what) {
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

struct Request {
  uint32_t op, key_bytes;
  uint64_t value_bytes;
};

// A socket listening on every interface (IPv6 and IPv4 where the host has both) at `port`.
int listen_on(int port) {
  Socket s(::socket(AF_INET6, SOCK_STREAM, 0));
  const bool v6 = s.fd >= 0;
  if (!v6) s.fd = ::socket(AF_INET, SOCK_STREAM, 0);
  BRISK_CHECK(s.fd >= 0, "rendezvous: cannot open a socket: ", std::strerror(errno));
  const int one = 1, zero = 0;
  ::setsockopt(s.fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  int bound = -1;
  if (v6) {
    ::setsockopt(s.fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);  // IPv4 too
    sockaddr_in6 a{};
    a.sin6_family = AF_INET6;
    a.sin6_addr = in6addr_any;
    a.sin6_port = htons(static_cast<uint16_t>(port));
    bound = ::bind(s.fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  } else {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_ANY);
    a.sin_port = htons(static_cast<uint16_t>(port));
    bound = ::bind(s.fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  }
  BRISK_CHECK(bound == 0, "rendezvous: rank 0 cannot listen on port ", port,
              " (brisk's rendezvous port: BRISK_RENDEZVOUS_PORT, else MASTER_PORT + 1): ",
              std::strerror(errno), "; set BRISK_RENDEZVOUS_PORT to a free port");
  BRISK_CHECK(::listen(s.fd, 128) == 0, "rendezvous: listen failed: ", std::strerror(errno));
  return std::exchange(s.fd, -1);
}

// Connects to MASTER_ADDR at the rendezvous port, trying again until rank 0 listens.
int connect_to_rank_zero(const LaunchInfo& launch, Clock::time_point deadline, double timeout) {
  BRISK_CHECK(!launch.master_addr.empty(), "rendezvous: MASTER_ADDR is not set");
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const std::string port = std::to_string(launch.rendezvous_port);
  const int rc = ::getaddrinfo(launch.master_addr.c_str(), port.c_str(), &hints, &found);
  BRISK_CHECK(rc == 0 && found, "rendezvous: MASTER_ADDR=", launch.master_addr,
              " cannot be resolved: ", ::gai_strerror(rc));
  std::string last_error = "no address";
  for (;;) {
    for (addrinfo* a = found; a; a = a->ai_next) {
      Socket s(::socket(a->ai_family, a->ai_socktype, a->ai_protocol));
      if (s.fd < 0) continue;
      const bool connected = ::connect(s.fd, a->ai_addr, a->ai_addrlen) == 0;
      if (connected && !connected_to_itself(s.fd)) {
        ::freeaddrinfo(found);
        return std::exchange(s.fd, -1);
      }
      last_error = connected ? "a connection to itself" : std::strerror(errno);
    }
    if (ms_left(deadline) == 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(std::min(100, ms_left(deadline))));
  }
  ::freeaddrinfo(found);
  BRISK_FAIL("rendezvous: rank ", launch.rank, " found no rank 0 listening on ", launch.master_addr,
             ":", launch.rendezvous_port, " within ", timeout, " s (", last_error, ")");
}

}  // namespace

bool connected_to_itself(int fd) {
  sockaddr_storage mine{}, peer{};
  socklen_t mine_len = sizeof mine, peer_len = sizeof peer;
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&mine), &mine_len) != 0 ||
      ::getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &peer_len) != 0)
    return false;
  return mine_len == peer_len && std::memcmp(&mine, &peer, mine_len) == 0;
}

// Rank 0's side: the store, and a thread answering the other ranks.
struct RendezvousStore::Server {
  struct Peer {
    Socket socket;
    int rank = -1;  // until its greeting
  };
  LaunchInfo launch;
  double timeout;
  Clock::time_point deadline;
  Socket listener;
  std::mutex mu;
  std::condition_variable changed;
  std::map<std::string, std::vector<uint8_t>> values;
  std::map<std::string, std::vector<int>> waiting;  // fds waiting for a key
  std::vector<std::unique_ptr<Peer>> peers;
  std::vector<bool> seen;
  int greeted = 0, gone = 0;
  std::string error;
  std::atomic<bool> stop{false};
  std::thread thread;

  Server(const LaunchInfo& l, double t)
      : launch(l),
        timeout(t),
        deadline(deadline_after(t)),
        listener(listen_on(l.rendezvous_port)),
        seen(static_cast<size_t>(l.size), false) {
    thread = std::thread([this] { serve(); });
  }
  ~Server() {
    stop = true;
    thread.join();
  }

  void serve() {
    while (!stop) {
      std::vector<pollfd> fds{{listener.fd, POLLIN, 0}};
      for (const auto& p : peers) fds.push_back({p->socket.fd, POLLIN, 0});
      if (::poll(fds.data(), fds.size(), 50) <= 0) continue;
      if (fds[0].revents) accept_peer();
      for (size_t i = 1; i < fds.size(); ++i)
        if (fds[i].revents && peers[i - 1]->socket.fd >= 0) answer(*peers[i - 1]);
    }
  }
  void accept_peer() {
    const int fd = ::accept(listener.fd, nullptr, nullptr);
    if (fd < 0) return;
    peers.push_back(std::make_unique<Peer>());
    peers.back()->socket.fd = fd;
  }
  // One message from `p`: its greeting, a request, or its hanging up. A failure is kept for
  // finish() and ends that connection.
  void answer(Peer& p) {
    try {
      if (p.rank < 0) return greet(p);
      char byte;
      if (::recv(p.socket.fd, &byte, 1, MSG_PEEK) <= 0) {
        std::lock_guard<std::mutex> lock(mu);
        ++gone;
        p.socket.close();
        changed.notify_all();
        return;
      }
      request(p);
    } catch (const Error& e) {
      std::lock_guard<std::mutex> lock(mu);
      if (error.empty()) error = e.what();
      p.socket.close();
      changed.notify_all();
    }
  }
  void greet(Peer& p) {
    Greeting g{};
    recv_all(p.socket.fd, &g, sizeof g, deadline_after(timeout), "a rank's greeting");
    BRISK_CHECK(g.magic == kMagic && g.version == kVersion,
                "rendezvous: something that is not a brisk rank connected to port ",
                launch.rendezvous_port);
    BRISK_CHECK(g.size == launch.size, "rendezvous: a rank says WORLD_SIZE=", g.size,
                ", rank 0 has WORLD_SIZE=", launch.size);
    std::lock_guard<std::mutex> lock(mu);
    BRISK_CHECK(g.rank >= 1 && g.rank < launch.size && !seen[static_cast<size_t>(g.rank)],
                "rendezvous: rank ", g.rank, " connected ",
                g.rank >= 1 && g.rank < launch.size ? "twice" : "(outside the world)");
    seen[static_cast<size_t>(g.rank)] = true;
    p.rank = g.rank;
    ++greeted;
    changed.notify_all();
  }
  void request(Peer& p) {
    const auto until = deadline_after(timeout);
    Request r{};
    recv_all(p.socket.fd, &r, sizeof r, until, "a request");
    BRISK_CHECK((r.op == kSet || r.op == kGet) && r.key_bytes <= kMaxKey &&
                    r.value_bytes <= kMaxValue && (r.op == kSet || r.value_bytes == 0),
                "rendezvous: rank ", p.rank, " sent a malformed request");
    std::string key(r.key_bytes, '\0');
    recv_all(p.socket.fd, key.data(), key.size(), until, "a key");
    if (r.op == kGet) {
      std::lock_guard<std::mutex> lock(mu);
      const auto it = values.find(key);
      if (it == values.end()) return waiting[key].push_back(p.socket.fd);
      return reply(p.socket.fd, it->second);
    }
    std::vector<uint8_t> value(r.value_bytes);
    recv_all(p.socket.fd, value.data(), value.size(), until, "a value");
    put(key, std::move(value));
  }
  // Under mu.
  void reply(int fd, const std::vector<uint8_t>& value) {
    const uint64_t n = value.size();
    send_all(fd, &n, sizeof n, deadline_after(timeout), "a value's length");
    send_all(fd, value.data(), value.size(), deadline_after(timeout), "a value");
  }
  void put(const std::string& key, std::vector<uint8_t> value) {
    std::lock_guard<std::mutex> lock(mu);
    const std::vector<uint8_t>& kept = values[key] = std::move(value);
    for (const int fd : std::exchange(waiting[key], {})) reply(fd, kept);
    changed.notify_all();
  }
  std::vector<uint8_t> get(const std::string& key) {
    std::unique_lock<std::mutex> lock(mu);
    const bool arrived =
        changed.wait_until(lock, deadline, [&] { return values.count(key) > 0 || !error.empty(); });
    BRISK_CHECK(error.empty(), error);
    BRISK_CHECK(arrived, "rendezvous: rank 0 waited ", timeout, " s for key \"", key,
                "\", which no rank set");
    return values[key];
  }
  void finish() {
    std::unique_lock<std::mutex> lock(mu);
    const int others = launch.size - 1;
    const bool done =
        changed.wait_until(lock, deadline, [&] { return gone == others || !error.empty(); });
    BRISK_CHECK(error.empty(), error);
    BRISK_CHECK(greeted == others, "rendezvous: rank 0 waited ", timeout, " s on port ",
                launch.rendezvous_port, " and ", others - greeted, " of ", others,
                " other ranks did not connect");
    BRISK_CHECK(done, "rendezvous: rank 0 waited ", timeout, " s for ", others - gone,
                " ranks to finish with the rendezvous");
  }
};

// Another rank's side: one connection to rank 0.
struct RendezvousStore::Client {
  double timeout;
  Clock::time_point deadline;
  Socket socket;
  Client(const LaunchInfo& launch, double t)
      : timeout(t), deadline(deadline_after(t)), socket(connect_to_rank_zero(launch, deadline, t)) {
    const Greeting g{kMagic, kVersion, launch.rank, launch.size};
    send_all(socket.fd, &g, sizeof g, deadline, "the greeting");
  }
  void send_request(uint32_t op, const std::string& key, const std::vector<uint8_t>& value) {
    BRISK_CHECK(socket.fd >= 0, "rendezvous: the store was used after finish()");
    const Request r{op, static_cast<uint32_t>(key.size()), value.size()};
    send_all(socket.fd, &r, sizeof r, deadline, "a request");
    send_all(socket.fd, key.data(), key.size(), deadline, "a key");
    send_all(socket.fd, value.data(), value.size(), deadline, "a value");
  }
  std::vector<uint8_t> get(const std::string& key) {
    send_request(kGet, key, {});
    uint64_t n = 0;
    const std::string what = "rank 0's value of \"" + key + "\"";
    recv_all(socket.fd, &n, sizeof n, deadline, what);
    BRISK_CHECK(n <= kMaxValue, "rendezvous: rank 0 sent a malformed value");
    std::vector<uint8_t> value(n);
    recv_all(socket.fd, value.data(), value.size(), deadline, what);
    return value;
  }
};

RendezvousStore::RendezvousStore(const LaunchInfo& launch, double timeout_seconds) {
  BRISK_CHECK(launch.size >= 1 && launch.rank >= 0 && launch.rank < launch.size,
              "rendezvous: rank ", launch.rank, " of ", launch.size);
  BRISK_CHECK(launch.rendezvous_port > 0 && launch.rendezvous_port < 65536,
              "rendezvous: no port for brisk's rendezvous among ", launch.size,
              " ranks: set MASTER_PORT (brisk listens on MASTER_PORT + 1) or "
              "BRISK_RENDEZVOUS_PORT");
  if (launch.rank == 0)
    server_ = std::make_unique<Server>(launch, timeout_seconds);
  else
    client_ = std::make_unique<Client>(launch, timeout_seconds);
}

RendezvousStore::~RendezvousStore() = default;

void RendezvousStore::set(const std::string& key, const std::vector<uint8_t>& value) {
  BRISK_CHECK(key.size() <= kMaxKey && value.size() <= kMaxValue, "rendezvous: key \"", key,
              "\" or its ", value.size(), " bytes are too long");
  if (server_) return server_->put(key, value);
  client_->send_request(kSet, key, value);
}

std::vector<uint8_t> RendezvousStore::get(const std::string& key) {
  return server_ ? server_->get(key) : client_->get(key);
}

void RendezvousStore::finish() {
  if (server_) return server_->finish();
  client_->socket.close();
}

std::vector<uint8_t> rendezvous_share(const LaunchInfo& launch, const std::vector<uint8_t>& blob,
                                      size_t blob_size, double timeout_seconds) {
  BRISK_CHECK(launch.rank != 0 || blob.size() == blob_size, "internal error: rank 0's blob holds ",
              blob.size(), " bytes, not ", blob_size);
  if (launch.size == 1) return blob;
  RendezvousStore store(launch, timeout_seconds);
  if (launch.rank == 0) {
    store.set("blob", blob);
    store.finish();
    return blob;
  }
  std::vector<uint8_t> got = store.get("blob");
  BRISK_CHECK(got.size() == blob_size, "rendezvous: rank 0 sent ", got.size(), " bytes, not ",
              blob_size);
  store.finish();
  return got;
}

}  // namespace brisk
