// The local end of the route to a host: the address and interface this machine would send from
// to reach it (a UDP socket connected to it and asked its own address: nothing is sent). Gloo
// and NCCL listen there when the user names no interface (GLOO_SOCKET_IFNAME,
// NCCL_SOCKET_IFNAME), as the ranks of several hosts reach each other on the network that
// reaches MASTER_ADDR.
#pragma once

#include <string>

namespace brisk {

struct LocalRoute {
  std::string address;    // numeric, as getnameinfo writes it ("10.0.0.2", "fe80::1")
  std::string interface;  // the interface holding it ("eth0"), "" when none does
};

// The route to `host` (a name or a numeric address); refused naming `host` and `what` (the
// variable that gave it) when it does not resolve or no route leads there.
LocalRoute route_to(const std::string& host, const std::string& what);

// Whether `host` names this machine's loopback (127.0.0.0/8, ::1, localhost).
bool is_loopback(const std::string& host);

}  // namespace brisk
