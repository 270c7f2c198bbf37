#include "proxy/address.h"

#include <arpa/inet.h>

#include <cstring>

namespace ghost {
namespace {

constexpr std::array<std::uint8_t, 12> kV4MappedPrefix = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};

bool HasV4MappedPrefix(const std::uint8_t* b) {
  return std::memcmp(b, kV4MappedPrefix.data(), kV4MappedPrefix.size()) == 0;
}

IpAddress FromV4(const in_addr& a) {
  IpAddress ip;
  std::memcpy(ip.bytes.data(), kV4MappedPrefix.data(), kV4MappedPrefix.size());
  std::memcpy(ip.bytes.data() + 12, &a.s_addr, 4);
  ip.v4 = true;
  return ip;
}

IpAddress FromV6(const in6_addr& a) {
  IpAddress ip;
  std::memcpy(ip.bytes.data(), a.s6_addr, 16);
  ip.v4 = HasV4MappedPrefix(ip.bytes.data());
  return ip;
}

bool ParsePort(std::string_view text, bool allow_zero, std::uint16_t* port) {
  if (text.empty() || text.size() > 5) return false;
  unsigned v = 0;
  for (char c : text) {
    if (c < '0' || c > '9') return false;
    v = v * 10 + static_cast<unsigned>(c - '0');
  }
  if (v > 65535 || (v == 0 && !allow_zero)) return false;
  *port = static_cast<std::uint16_t>(v);
  return true;
}

}  // namespace

Result<IpAddress> IpAddress::FromSockaddr(const sockaddr* sa, socklen_t len) {
  if (sa != nullptr && sa->sa_family == AF_INET &&
      len >= static_cast<socklen_t>(sizeof(sockaddr_in))) {
    return FromV4(reinterpret_cast<const sockaddr_in*>(sa)->sin_addr);
  }
  if (sa != nullptr && sa->sa_family == AF_INET6 &&
      len >= static_cast<socklen_t>(sizeof(sockaddr_in6))) {
    return FromV6(reinterpret_cast<const sockaddr_in6*>(sa)->sin6_addr);
  }
  return Status::InvalidArgument("not an IPv4 or IPv6 socket address");
}

Result<IpAddress> IpAddress::Parse(std::string_view text) {
  std::string s(text);
  if (s.size() >= 2 && s.front() == '[' && s.back() == ']') s = s.substr(1, s.size() - 2);
  in_addr a4{};
  if (inet_pton(AF_INET, s.c_str(), &a4) == 1) return FromV4(a4);
  in6_addr a6{};
  if (inet_pton(AF_INET6, s.c_str(), &a6) == 1) return FromV6(a6);
  return Status::InvalidArgument("\"" + std::string(text) + "\" is not an IPv4 or IPv6 address");
}

std::string IpAddress::ToString() const {
  char buf[INET6_ADDRSTRLEN] = {};
  if (v4) {
    inet_ntop(AF_INET, bytes.data() + 12, buf, sizeof buf);
  } else {
    inet_ntop(AF_INET6, bytes.data(), buf, sizeof buf);
  }
  return buf;
}

bool IpAddress::IsLoopback() const {
  if (v4) return bytes[12] == 127;
  static constexpr std::array<std::uint8_t, 16> kLoop = {0, 0, 0, 0, 0, 0, 0, 0,
                                                         0, 0, 0, 0, 0, 0, 0, 1};
  return bytes == kLoop;
}

bool IpAddress::IsUnspecified() const {
  const int from = v4 ? 12 : 0;
  for (int i = from; i < 16; ++i) {
    if (bytes[static_cast<std::size_t>(i)] != 0) return false;
  }
  return true;
}

Result<Cidr> Cidr::Parse(std::string_view text) {
  const std::size_t slash = text.find('/');
  Result<IpAddress> ip = IpAddress::Parse(text.substr(0, slash));
  if (!ip.ok())
    return Status::InvalidArgument("--allow \"" + std::string(text) +
                                   "\": " + ip.status().message());
  Cidr c;
  c.address = *ip;
  const int max_bits = ip->v4 ? 32 : 128;
  if (slash == std::string_view::npos) {
    c.bits = max_bits;
  } else {
    const std::string_view len = text.substr(slash + 1);
    int bits = 0;
    if (len.empty() || len.size() > 3) bits = -1;
    for (char ch : len) {
      if (ch < '0' || ch > '9') {
        bits = -1;
        break;
      }
      bits = bits * 10 + (ch - '0');
    }
    if (bits < 0 || bits > max_bits) {
      return Status::InvalidArgument("--allow \"" + std::string(text) +
                                     "\": prefix length must be 0.." + std::to_string(max_bits));
    }
    c.bits = bits;
  }
  // Host bits past the prefix: refuse rather than guess what was meant.
  const int total = c.bits + (ip->v4 ? 96 : 0);
  for (int i = total; i < 128; ++i) {
    if (c.address.bytes[static_cast<std::size_t>(i / 8)] & (0x80 >> (i % 8))) {
      return Status::InvalidArgument(
          "--allow \"" + std::string(text) + "\": address has bits set past the /" +
          std::to_string(c.bits) + " prefix (did you mean a network address?)");
    }
  }
  return c;
}

bool Cidr::Contains(const IpAddress& a) const {
  if (a.v4 != address.v4) return false;
  const int total = bits + (address.v4 ? 96 : 0);
  for (int i = 0; i < total; ++i) {
    const std::size_t byte = static_cast<std::size_t>(i / 8);
    const int mask = 0x80 >> (i % 8);
    if ((a.bytes[byte] & mask) != (address.bytes[byte] & mask)) return false;
  }
  return true;
}

std::string Cidr::ToString() const { return address.ToString() + "/" + std::to_string(bits); }

std::vector<Cidr> DefaultAllowList() {
  return {*Cidr::Parse("127.0.0.1/32"), *Cidr::Parse("::1/128")};
}

bool IsAllowed(const std::vector<Cidr>& allow, const IpAddress& a) {
  for (const Cidr& c : allow) {
    if (c.Contains(a)) return true;
  }
  return false;
}

Result<ListenAddress> ListenAddress::Parse(std::string_view text) {
  auto bad = [&](const std::string& why) {
    return Status::InvalidArgument("listen address \"" + std::string(text) + "\" " + why +
                                   " (use HOST:PORT, e.g. 127.0.0.1:3128 or [::1]:3128)");
  };
  std::string_view host, port;
  if (!text.empty() && text.front() == '[') {
    const std::size_t close = text.find(']');
    if (close == std::string_view::npos || close + 1 >= text.size() || text[close + 1] != ':') {
      return bad("is not [IPv6]:PORT");
    }
    host = text.substr(0, close + 1);
    port = text.substr(close + 2);
  } else {
    const std::size_t colon = text.rfind(':');
    if (colon == std::string_view::npos) return bad("has no port");
    host = text.substr(0, colon);
    port = text.substr(colon + 1);
    if (host.find(':') != std::string_view::npos)
      return bad("has an IPv6 address without brackets");
  }
  ListenAddress la;
  if (!ParsePort(port, /*allow_zero=*/true, &la.port)) return bad("has a bad port");
  if (host == "localhost") host = "127.0.0.1";
  Result<IpAddress> ip = IpAddress::Parse(host);
  if (!ip.ok()) return bad("does not start with an IP address");
  la.host = *ip;
  return la;
}

socklen_t ListenAddress::ToSockaddr(sockaddr_storage* storage) const {
  std::memset(storage, 0, sizeof *storage);
  if (host.v4) {
    auto* sin = reinterpret_cast<sockaddr_in*>(storage);
    sin->sin_family = AF_INET;
    sin->sin_port = htons(port);
    std::memcpy(&sin->sin_addr.s_addr, host.bytes.data() + 12, 4);
    return sizeof(sockaddr_in);
  }
  auto* sin6 = reinterpret_cast<sockaddr_in6*>(storage);
  sin6->sin6_family = AF_INET6;
  sin6->sin6_port = htons(port);
  std::memcpy(sin6->sin6_addr.s6_addr, host.bytes.data(), 16);
  return sizeof(sockaddr_in6);
}

std::string ListenAddress::ToString() const {
  return (host.v4 ? host.ToString() : "[" + host.ToString() + "]") + ":" + std::to_string(port);
}

Result<std::vector<std::uint16_t>> ParsePortList(std::string_view text) {
  std::vector<std::uint16_t> ports;
  std::size_t i = 0;
  while (i <= text.size()) {
    std::size_t comma = text.find(',', i);
    if (comma == std::string_view::npos) comma = text.size();
    std::string_view item = text.substr(i, comma - i);
    while (!item.empty() && item.front() == ' ') item.remove_prefix(1);
    while (!item.empty() && item.back() == ' ') item.remove_suffix(1);
    std::uint16_t port = 0;
    if (!ParsePort(item, /*allow_zero=*/false, &port)) {
      return Status::InvalidArgument("port list \"" + std::string(text) + "\": \"" +
                                     std::string(item) + "\" is not a port in 1..65535");
    }
    ports.push_back(port);
    i = comma + 1;
  }
  return ports;
}

}  // namespace ghost
