// The local end of the route to a host (see route.h): getaddrinfo, a connected UDP socket's own
// address, and the interface of getifaddrs that holds it.
#include "parallel/route.h"

#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>

#include "core/error.h"

namespace brisk {
namespace {

// The numeric form of an address of `length` bytes ("" when it has none).
std::string numeric(const sockaddr* a, socklen_t length) {
  char text[NI_MAXHOST] = {};
  if (::getnameinfo(a, length, text, sizeof text, nullptr, 0, NI_NUMERICHOST) != 0) return "";
  return text;
}

// The interface holding `address` (numeric), "" when none does.
std::string interface_of(const std::string& address) {
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return "";
  const std::unique_ptr<ifaddrs, void (*)(ifaddrs*)> held(list, ::freeifaddrs);
  for (const ifaddrs* i = list; i; i = i->ifa_next) {
    if (!i->ifa_addr) continue;
    const int family = i->ifa_addr->sa_family;
    if (family != AF_INET && family != AF_INET6) continue;
    const socklen_t length = family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
    // A link-local IPv6 address prints with its zone ("fe80::1%eth0"): compared without it.
    const std::string mine = numeric(i->ifa_addr, length);
    if (mine == address || mine.substr(0, mine.find('%')) == address) return i->ifa_name;
  }
  return "";
}

}  // namespace

bool is_loopback(const std::string& host) {
  return host == "localhost" || host == "::1" || host.rfind("127.", 0) == 0;
}

LocalRoute route_to(const std::string& host, const std::string& what) {
  BRISK_CHECK(!host.empty(), what, " is not set: the ranks meet at that host");
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  const int rc = ::getaddrinfo(host.c_str(), "9", &hints, &found);  // any port: nothing is sent
  BRISK_CHECK(rc == 0 && found, what, "=", excerpt(host),
              " does not resolve: ", rc == 0 ? "no address" : ::gai_strerror(rc));
  const std::unique_ptr<addrinfo, void (*)(addrinfo*)> held(found, ::freeaddrinfo);
  std::string why = "no address";
  for (const addrinfo* a = found; a; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, SOCK_DGRAM, 0);
    if (fd < 0) continue;
    sockaddr_storage own{};
    socklen_t length = sizeof own;
    const bool routed = ::connect(fd, a->ai_addr, a->ai_addrlen) == 0 &&
                        ::getsockname(fd, reinterpret_cast<sockaddr*>(&own), &length) == 0;
    why = routed ? why : std::strerror(errno);
    ::close(fd);
    if (!routed) continue;
    LocalRoute route;
    route.address = numeric(reinterpret_cast<const sockaddr*>(&own), length);
    route.address = route.address.substr(0, route.address.find('%'));
    route.interface = interface_of(route.address);
    if (!route.address.empty()) return route;
  }
  BRISK_FAIL("no route from this host to ", what, "=", excerpt(host), ": ", why);
}

}  // namespace brisk
