// Network addresses for ghostproxy's exposure rules: the listen address
// ("127.0.0.1:3128", "[::1]:3128"), the client allowlist (`--allow CIDR`), and the
// IPv4-mapped IPv6 addresses a dual-stack listener reports.
//
// Clients are admitted only when their address falls in one of the allowed prefixes. The
// default allowlist is the loopback host addresses 127.0.0.1/32 and ::1/128, so a proxy bound
// to a public address still serves only this machine until the user widens it.
//
// Thread-safety: plain values and pure functions.
#ifndef GHOST_PROXY_ADDRESS_H_
#define GHOST_PROXY_ADDRESS_H_

#include <netinet/in.h>
#include <sys/socket.h>

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/base/status.h"

namespace ghost {

// An IPv4 or IPv6 address as 16 bytes (IPv4 as ::ffff:a.b.c.d, so one prefix type covers
// both families and a v4 client on a dual-stack socket matches a v4 prefix).
struct IpAddress {
  std::array<std::uint8_t, 16> bytes{};
  bool v4 = false;  // an IPv4 address (stored mapped)

  // From a socket address (AF_INET or AF_INET6; an IPv4-mapped IPv6 address becomes v4).
  // Fails for other families.
  [[nodiscard]] static Result<IpAddress> FromSockaddr(const sockaddr* sa, socklen_t len);
  // "127.0.0.1", "::1", "[::1]" (brackets allowed). Fails on anything else (no host names).
  [[nodiscard]] static Result<IpAddress> Parse(std::string_view text);
  // "127.0.0.1" or "::1" (no brackets).
  std::string ToString() const;
  bool IsLoopback() const;
  bool IsUnspecified() const;  // 0.0.0.0 or ::

  friend bool operator==(const IpAddress&, const IpAddress&) = default;
};

// An address prefix: `address/bits`.
struct Cidr {
  IpAddress address;  // with the bits past the prefix cleared
  int bits = 0;       // 0..32 for IPv4, 0..128 for IPv6

  // "10.0.0.0/8", "192.168.1.7" (a host: /32), "::1/128", "fd00::/8". Fails with a message
  // naming the text on a bad address, a prefix length out of range, or host bits set past the
  // prefix ("10.1.0.0/8": probably a typo for 10.0.0.0/8 or 10.1.0.0/16).
  [[nodiscard]] static Result<Cidr> Parse(std::string_view text);
  bool Contains(const IpAddress& a) const;
  std::string ToString() const;
};

// The allowlist used when the user names none: 127.0.0.1/32 and ::1/128.
std::vector<Cidr> DefaultAllowList();
// True when some prefix of `allow` contains `a`.
bool IsAllowed(const std::vector<Cidr>& allow, const IpAddress& a);

// A listen address "HOST:PORT": HOST an IPv4 address or a bracketed IPv6 one ("[::1]:3128");
// "localhost" means 127.0.0.1; PORT 0..65535 (0: the kernel picks one).
struct ListenAddress {
  IpAddress host;
  std::uint16_t port = 0;

  [[nodiscard]] static Result<ListenAddress> Parse(std::string_view text);
  // Fills `*storage` for bind(); returns the length.
  socklen_t ToSockaddr(sockaddr_storage* storage) const;
  // "127.0.0.1:3128" or "[::1]:3128".
  std::string ToString() const;
};

// Parses "443,8443" (a comma-separated list of ports 1..65535) for --connect-ports.
[[nodiscard]] Result<std::vector<std::uint16_t>> ParsePortList(std::string_view text);

}  // namespace ghost

#endif  // GHOST_PROXY_ADDRESS_H_
