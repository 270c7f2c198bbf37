// Proxy: ghostproxy's HTTP/1.1 forward proxy (DESIGN §3.4, §4.3). Browsers
// and other HTTP clients send it absolute-form requests ("GET http://host/path HTTP/1.1") and
// CONNECT requests; it answers from the cache it shares with ghostfs (CacheBackend) or from the
// origin, and tunnels CONNECT to allowlisted ports.
//
// What it does, in the order a request meets it:
//   - Exposure: listens on one address (127.0.0.1 by default); a client outside the allowlist
//     gets 403, one over its per-client limit 429, one over the connection limit 503 unless a
//     connection that has waited long enough for its request head gives up its place.
//   - Parsing (proxy/http1.h): heads over the limits get 431, slow or idle clients 408.
//   - Loops: a request for the proxy's own address, or one whose Via already names this proxy,
//     gets 508. GET /ghost/status (JSON) and /ghost/metrics (Prometheus text) are answered by
//     the proxy itself (origin-form, or absolute-form for the proxy's own address).
//   - Caching (proxy/cache_policy.h, RFC 9111): GET and HEAD are looked up; a fresh stored
//     response is served from the disk when the cost model chooses it (CacheChoice::kDisk) and
//     fetched from the network when it chooses the network (the backend then sends the disk a
//     ghost hint); stale ones are revalidated; when the origin fails, a stale copy is served if
//     allowed, else a 504 page. Client conditional and range requests are answered from a fresh
//     stored response (304, 206, 416).
//   - Forwarding: the request goes to the origin with hop-by-hop fields removed, Via added and
//     its body (Content-Length or chunked) streamed; the response comes back the same way,
//     stored if cacheable. Every origin transfer is disclosed to the backend
//     (TransferBegin/TransferEnd).
//   - Every response carries X-Ghost-Source: cache, network, revalidated, stale, tunnel, or
//     proxy (an answer the proxy made itself: errors, status pages).
//   - Every request ends in one access-log line (squid's native format, with Ghost's result
//     codes HIT, MISS, NET_PREFERRED, REVALIDATED, STALE, TUNNEL, and NONE/DENIED/ERROR/LOCAL
//     for the proxy's own answers).
//
// Event model: one libevent loop, callbacks only. Idle, the proxy arms no timer: timeouts are
// one-shot timers and bufferevent timeouts that exist only while a connection does.
//
// Thread-safety: not thread-safe. Create, use and destroy the Proxy on the thread that runs
// its event_base.
#ifndef GHOST_PROXY_PROXY_H_
#define GHOST_PROXY_PROXY_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/base/clock.h"
#include "common/base/status.h"
#include "common/base/units.h"
#include "proxy/address.h"
#include "proxy/cache_backend.h"
#include "proxy/http1.h"
#include "proxy/shaper.h"

struct event_base;

namespace ghost {

namespace proxy_internal {
class Impl;
}

// Every setting of the proxy, parsed once (proxy/proxy_config.h reads them from a TOML file
// and the command line) and passed by const&.
struct ProxyOptions {
  // Where to listen; port 0 lets the kernel choose (see Proxy::address()).
  ListenAddress listen = *ListenAddress::Parse("127.0.0.1:3128");
  // A socket already bound and listening (socket activation, proxy/socket_activation.h):
  // the proxy accepts on it and takes ownership; `listen` is then ignored. -1: bind `listen`.
  int listen_fd = -1;
  // Clients allowed to connect besides this machine's (DefaultAllowList(): 127.0.0.1, ::1,
  // always admitted).
  std::vector<Cidr> allow;
  // Ports CONNECT may tunnel to.
  std::vector<std::uint16_t> connect_ports = {443};
  // Access log file, appended to; empty for none. Written by a thread of its own
  // (proxy/access_log.h): at most `access_log_queue` bytes of lines wait for a slow file, the
  // rest are dropped and counted.
  std::string access_log;
  std::size_t access_log_queue = 4 << 20;

  // Request heads: start line, header bytes and count (431 / 414 past them).
  http1::Limits limits;
  // Open client connections. At the limit a new connection takes the place of the one that
  // has waited longest for a request head, if that one has waited at least `preempt_after`
  // (an idle kept-alive connection is closed silently, a partial head gets 408); otherwise the
  // new one gets 503 (always written and flushed before the close). Refused connections do
  // not count against the limit while their answer goes out.
  std::size_t max_connections = 512;
  Duration preempt_after = std::chrono::seconds(1);
  // Open connections from one client address; one more gets 429 and is closed. 0: no limit
  // but max_connections. Clients behind one address (NAT, this machine) share it.
  std::size_t max_connections_per_client = 256;
  // A complete request head must arrive within this time of the connection opening or of the
  // previous response ending, however slowly its bytes trickle in (else 408; a connection that
  // sent nothing is closed silently); a request body must keep arriving (no gap longer).
  Duration request_timeout = std::chrono::seconds(30);
  // A client must keep accepting response bytes (no gap longer than this) or is dropped.
  Duration send_timeout = std::chrono::seconds(60);
  // Connecting to an origin, and then waiting for each part of its response.
  Duration connect_timeout = std::chrono::seconds(10);
  Duration origin_timeout = std::chrono::seconds(60);
  // With a stored copy that may answer when the origin fails (a stale copy without
  // must-revalidate or no-cache, RFC 9111 §4.2.4; or a fresh copy the cost model passed over
  // for the network), the origin's response head must arrive within this, else the copy is
  // served at once rather than after origin_timeout (a stalled origin counts as an error).
  Duration fallback_timeout = std::chrono::seconds(5);
  // A tunnel with no bytes either way for this long is closed.
  Duration tunnel_idle_timeout = std::chrono::minutes(5);
  // Idle origin connections kept for reuse: per host:port, and for how long. As many as the
  // clients a busy proxy serves at once: with fewer, each burst of concurrent misses to one
  // origin closes the surplus and connects again on the next (4 against 16 clients: most
  // misses paid a connect and a close on both sides). An idle one costs a socket.
  std::size_t max_idle_per_origin = 32;
  Duration origin_idle_timeout = std::chrono::seconds(30);

  // Freshness lifetime of a response with no explicit freshness and no Last-Modified.
  Duration heuristic_freshness = std::chrono::seconds(300);
  // Output waiting for a client above which the proxy stops reading the origin (or the
  // cache) for it, resuming when half of it has been sent; the same for request bodies and
  // tunnels in the other direction.
  std::size_t high_watermark = 256 * 1024;
  // How much of a cached body is read per ReadBody call.
  Bytes cache_read_slice = 256 * 1024;

  // The name in Via ("1.1 NAME") and the key of loop detection; empty: "HOSTNAME:PORT".
  std::string via_name;
  // Wall-clock Unix seconds, for HTTP dates and freshness; empty: the system clock. Tests
  // move it to age cached responses without sleeping.
  std::function<std::int64_t()> unix_now;
  // Download shaping of large responses and of tunnels' downloads (proxy/shaper.h).
  ShapingOptions shaping;
  // More Prometheus text appended to /ghost/metrics (the dashboard's device-mode, energy and
  // saving gauges, proxy/dashboard.h); empty: none.
  std::function<std::string()> extra_metrics;
  // The dashboard's page URL ("http://127.0.0.1:8081/ghost/", proxy/dashboard.h) when it runs;
  // the proxy's own /ghost/ then redirects there. Empty function or result: no dashboard.
  std::function<std::string()> dashboard_url;
};

// Counters behind /ghost/status and /ghost/metrics.
struct ProxyStats {
  std::uint64_t connections_accepted = 0;
  std::uint64_t connections_refused_limit = 0;   // 503 at accept
  std::uint64_t connections_refused_client = 0;  // 429: the client's own limit
  std::uint64_t connections_refused_denied = 0;  // 403: client not allowed
  std::uint64_t connections_preempted = 0;  // waiting for a head, closed at the limit for a new one
  std::uint64_t requests = 0;
  // By result code (access-log names): HIT, MEM_HIT (from the backend's RAM copy), MISS,
  // NET_PREFERRED, REVALIDATED, STALE, TUNNEL, LOCAL, DENIED, ERROR.
  std::uint64_t hit = 0, mem_hit = 0, miss = 0, net_preferred = 0, revalidated = 0, stale = 0,
                tunnel = 0, local = 0, denied = 0, error = 0;
  std::uint64_t ghost_hints = 0;  // lookups whose choice sent the disk a ghost hint
  std::uint64_t stores = 0;       // responses committed to the cache
  std::uint64_t store_failures = 0;
  std::uint64_t bytes_to_clients = 0;  // body and head bytes written to clients
  std::uint64_t bytes_from_origins = 0;
  std::uint64_t origin_connections = 0;  // opened
  std::uint64_t origin_reuses = 0;       // requests sent on a pooled connection
  std::uint64_t timeouts = 0;            // client timeouts (408 or dropped)
  ShapingStats shaping;
};

class Proxy {
 public:
  // Starts listening. `base`, `clock` and `backend` are borrowed and must outlive the proxy;
  // `clock` must run its timers on `base`'s loop (a RealClock over `base`). Fails with an errno
  // status naming the address when it cannot bind ("address in use: is another proxy
  // running?"), kIoError when the access log cannot be opened.
  [[nodiscard]] static Result<std::unique_ptr<Proxy>> Start(event_base* base, Clock* clock,
                                                            CacheBackend* backend,
                                                            const ProxyOptions& options);
  // Closes every connection (transfers in progress are cut, cache writes aborted).
  ~Proxy();
  Proxy(const Proxy&) = delete;
  Proxy& operator=(const Proxy&) = delete;

  // The bound address (with the kernel's port when options.listen.port was 0).
  const ListenAddress& address() const;
  const ProxyStats& stats() const;
  std::size_t open_connections() const;
  // The bodies of /ghost/status and /ghost/metrics.
  std::string StatusJson() const;
  std::string MetricsText() const;
  // Opens the access log's path again once the lines logged so far are written (logrotate:
  // rename, then SIGHUP). Does nothing without an access log.
  void ReopenAccessLog();

  explicit Proxy(std::unique_ptr<proxy_internal::Impl> impl);

 private:
  std::unique_ptr<proxy_internal::Impl> impl_;
};

}  // namespace ghost

#endif  // GHOST_PROXY_PROXY_H_
