// GhostproxyOptions: every setting of the ghostproxy program, from its command line or a config
// file (TOML, the keys below), parsed once and passed by const& (the pattern of
// common/config/config.h for ghostfs).
//
// Config file (all keys optional; the command line wins over the file):
//
//   listen = "127.0.0.1:3128"            # HOST:PORT; [::1]:3128 for IPv6
//   mount = "/mnt/ghost"                 # the ghostfs mount whose cache the proxy shares
//   control = "/run/ghost/control.sock"  # that ghostfs's control socket
//   allow = ["192.168.1.0/24"]           # clients besides the default 127.0.0.1 and ::1
//   connect_ports = [443]                # ports CONNECT may tunnel to
//   access_log = "/var/log/ghostproxy/access.log"  # reopened on SIGHUP (logrotate)
//   access_log_queue = "4M"              # lines waiting for a slow log file; past it dropped
//   via = "laptop:3128"                  # the name in Via and loop detection
//   max_connections = 512                # at the limit, a new connection gets 503 unless ...
//   preempt_after = 1                    # ... one has waited this many seconds for its request
//                                        # head: it is closed (408 if it sent part of one)
//   max_connections_per_client = 256     # per client address (429 past it); 0: no own limit
//   max_header_bytes = "32K"             # request head limits (431 past them)
//   max_headers = 100
//   request_timeout = 30                 # seconds: a whole request head must arrive within
//                                        # this of connecting or of the previous response
//   send_timeout = 60                    # seconds a client may stop reading
//   connect_timeout = 10                 # seconds to connect to an origin
//   origin_timeout = 60                  # seconds an origin may stay silent
//   fallback_timeout = 5                 # seconds an origin may stay silent when a stored
//                                        # copy may answer instead (stale-if-error): then it does
//   tunnel_idle_timeout = 300            # seconds a CONNECT tunnel may stay silent
//   origin_idle_timeout = 30             # seconds an idle origin connection is kept
//   max_idle_per_origin = 32
//   heuristic_freshness = 300            # seconds, for responses without freshness info
//   high_watermark = "256K"              # buffered output per client before pausing origins
//   memory_cache = "64M"                 # responses kept in the proxy's RAM; 0 keeps none
//
// Thread-safety: plain values; the parser is reentrant.
#ifndef GHOST_PROXY_PROXY_CONFIG_H_
#define GHOST_PROXY_PROXY_CONFIG_H_

#include <string>

#include "common/base/status.h"
#include "common/base/units.h"
#include "proxy/imap_proxy.h"
#include "proxy/proxy.h"
#include "proxy/smtp_proxy.h"

namespace ghost {

struct GhostproxyOptions {
  ProxyOptions proxy;
  std::string mountpoint;
  std::string control_path;  // empty: the socket of the ghostfs at mountpoint (FindControlPath)
  // Bytes of recently served responses kept in the proxy's RAM (GhostfsBackendOptions,
  // proxy/memory_cache.h); 0 disables it.
  Bytes memory_cache = 64ull << 20;
  // The mail proxy (proxy/imap_proxy.h; its keys in proxy/mail_proxy_config.h).
  MailProxyOptions mail;
  SmtpProxyOptions smtp;
  // The log (common/base/log.h): appended to log_file, else stderr (journald under systemd);
  // log_level "error" | "warn" | "info" | "debug" (empty: info).
  std::string log_file;
  std::string log_level;
};

// Reads a config file into `options` (keys present in the file overwrite the fields). Errors
// name the file, the line and what is wrong.
[[nodiscard]] Status LoadProxyConfigFile(const std::string& path, GhostproxyOptions* options);

// Checks the combination: a mount point, at least one CONNECT port or none, limits above zero.
[[nodiscard]] Status Validate(const GhostproxyOptions& options);

}  // namespace ghost

#endif  // GHOST_PROXY_PROXY_CONFIG_H_
