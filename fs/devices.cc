// --devices auto: the machine's own disk, Wi-Fi card and energy meters behind the model
// (common/power/hardware.h). What cannot be used is logged once, in one line each, and the
// device stays modelled only.
#include <netdb.h>
#include <sys/socket.h>

#include <cstdio>

#include "fs/ghostfs_internal.h"

namespace ghost {
namespace {

// The host of an http(s):// or imap(s):// URL ("user@host:port/path" → "host").
std::string UrlHost(const std::string& url) {
  std::size_t start = url.find("://");
  start = start == std::string::npos ? 0 : start + 3;
  std::size_t end = url.find_first_of("/?#", start);
  std::string auth = url.substr(start, end == std::string::npos ? std::string::npos : end - start);
  if (std::size_t at = auth.rfind('@'); at != std::string::npos) auth = auth.substr(at + 1);
  if (auth.starts_with("[")) return auth.substr(1, auth.find(']') - 1);
  return auth.substr(0, auth.find(':'));
}

// The first address `host` resolves to, as a literal ("" when it does not resolve).
std::string FirstAddress(const std::string& host) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (host.empty() || ::getaddrinfo(host.c_str(), nullptr, &hints, &res) != 0) return "";
  char buf[NI_MAXHOST] = {};
  std::string out;
  if (res != nullptr && ::getnameinfo(res->ai_addr, res->ai_addrlen, buf, sizeof buf, nullptr, 0,
                                      NI_NUMERICHOST) == 0) {
    out = buf;
  }
  ::freeaddrinfo(res);
  return out;
}

}  // namespace

void Daemon::StartHardware() {
  if (options_.devices != "auto") return;
  HardwareOptions ho;
  ho.cache_dir = options_.cache_dir;
  ho.manage_disk = options_.manage_disk;
  ho.force_manage_disk = options_.force_manage_disk;
  if (!options_.origins.empty()) ho.origin_address = FirstAddress(UrlHost(options_.origins[0].url));
  hardware_ = Hardware::Detect(*clock_, ho, HardwareLayers::Real());
  hardware_->Bind(*pm_, disk_id_, net_id_);
  for (const std::string& note : hardware_->notes()) std::fprintf(stderr, "ghostfs: %s\n", note.c_str());
}

}  // namespace ghost
