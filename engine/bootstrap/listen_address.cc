// ResolveListenAddress (declared in rendezvous.h): interface names and host names to IPv4.
#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <unistd.h>

#include <cerrno>
#include <string>
#include <vector>

#include "engine/bootstrap/rendezvous.h"
#include "engine/bootstrap/socket_io.h"
#include "engine/common/logging.h"

namespace kolo::bootstrap {
namespace {

struct InterfaceAddress {
  std::string name;
  std::string ip;
  bool up = false;
  bool loopback = false;
};

std::string Ipv4ToString(const in_addr& a) {
  char buf[INET_ADDRSTRLEN] = {};
  ::inet_ntop(AF_INET, &a, buf, sizeof(buf));
  return buf;
}

bool IsLoopback(const in_addr& a) { return (ntohl(a.s_addr) >> 24) == 127; }

StatusOr<std::vector<InterfaceAddress>> ListIpv4Interfaces() {
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return ErrnoStatus(StatusCode::kInternal, "getifaddrs", errno);
  std::vector<InterfaceAddress> out;
  for (ifaddrs* i = list; i != nullptr; i = i->ifa_next) {
    if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != AF_INET) continue;
    const in_addr a = reinterpret_cast<const sockaddr_in*>(i->ifa_addr)->sin_addr;
    out.push_back({i->ifa_name, Ipv4ToString(a), (i->ifa_flags & IFF_UP) != 0,
                   (i->ifa_flags & IFF_LOOPBACK) != 0 || IsLoopback(a)});
  }
  ::freeifaddrs(list);
  return out;
}

std::string Describe(const std::vector<InterfaceAddress>& ifaces) {
  std::string s;
  for (const auto& i : ifaces) {
    if (!s.empty()) s += ", ";
    s += fmt::format("{} ({})", i.name, i.ip);
  }
  return s.empty() ? "none" : s;
}

// The host name's IPv4 addresses, in resolver order; empty if it does not resolve.
std::vector<in_addr> ResolveHostName(const std::string& host) {
  std::vector<in_addr> out;
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (::getaddrinfo(host.c_str(), nullptr, &hints, &res) != 0) return out;
  for (addrinfo* r = res; r != nullptr; r = r->ai_next) {
    out.push_back(reinterpret_cast<const sockaddr_in*>(r->ai_addr)->sin_addr);
  }
  ::freeaddrinfo(res);
  return out;
}

}  // namespace

StatusOr<std::string> ResolveListenAddress(const Options& options) {
  if (!options.iface.empty()) {
    if (IsIpv4Address(options.iface)) return options.iface;
    KOLO_ASSIGN_OR_RETURN(const auto ifaces, ListIpv4Interfaces());
    for (const auto& i : ifaces) {
      if (i.name == options.iface) return i.ip;
    }
    return InvalidArgument(
        "KOLO_IFACE='{}' is neither an IPv4 address nor an interface with an IPv4 address; "
        "interfaces with one: {}",
        options.iface, Describe(ifaces));
  }
  if (options.local_size == options.size) return std::string("127.0.0.1");

  char host[256] = {};
  if (::gethostname(host, sizeof(host) - 1) != 0) {
    return ErrnoStatus(StatusCode::kInternal, "gethostname", errno);
  }
  const std::vector<in_addr> resolved = ResolveHostName(host);
  for (const in_addr& a : resolved) {
    if (!IsLoopback(a)) return Ipv4ToString(a);
  }
  // Ranks on other hosts cannot reach a loopback address, so look for a real interface.
  KOLO_ASSIGN_OR_RETURN(const auto ifaces, ListIpv4Interfaces());
  for (const auto& i : ifaces) {
    if (i.up && !i.loopback) {
      KOLO_LOG(kInfo,
               "host name '{}' resolves to {}; listening on {} ({}) instead (set "
               "KOLO_IFACE to choose)",
               host, resolved.empty() ? std::string("nothing") : Ipv4ToString(resolved[0]), i.ip,
               i.name);
      return i.ip;
    }
  }
  return InvalidArgument(
      "ranks span several hosts (local_size={} < size={}), but host name '{}' resolves to {} and "
      "no interface that is up has a non-loopback IPv4 address; set KOLO_IFACE (interfaces: {})",
      options.local_size, options.size, host,
      resolved.empty() ? std::string("nothing") : Ipv4ToString(resolved[0]), Describe(ifaces));
}

}  // namespace kolo::bootstrap
