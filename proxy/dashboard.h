// Dashboard: ghostproxy's page about the ghostfs it serves from — the devices' modes
// over time, the modelled energy (and a measured one where a meter exists), requests by
// source, ghost hints, the write and IMAP queues and the energy saved against the static
// baseline.
//
// It listens on its own address (ghostproxy --dashboard ADDR) with libevent's evhttp:
//   GET /ghost/         the page (proxy/dashboard.html, embedded at build time)
//   GET /ghost/events   server-sent events: first "snapshot" ({"devices":..,"stats":..,
//                       "history":[..]}), then every event the daemon pushes ("modes",
//                       "stats", "events", data as in common/control/protocol.h), relayed as
//                       it arrives on the control socket's subscription
//   GET /ghost/state    the snapshot as JSON
//   GET /ghost/metrics  Prometheus gauges of the devices' modes and power, the energy and the
//                       saving (also appended to the proxy's own /ghost/metrics: MetricsText)
// Nothing polls: the page is redrawn by pushed events, the dashboard's state by the daemon's.
//
// Thread-safety: one thread, the loop's.
#ifndef GHOST_PROXY_DASHBOARD_H_
#define GHOST_PROXY_DASHBOARD_H_

#include <memory>
#include <string>

#include "common/base/status.h"
#include "proxy/address.h"

struct event_base;

namespace ghost {

class Dashboard {
 public:
  // Subscribes to the daemon at `control_path` and listens on `listen` (port 0: the kernel's
  // choice, see address()). `base` is borrowed and must outlive the dashboard.
  [[nodiscard]] static Result<std::unique_ptr<Dashboard>> Start(event_base* base,
                                                                const std::string& control_path,
                                                                const ListenAddress& listen);
  virtual ~Dashboard() = default;
  // The bound address, "127.0.0.1:8080".
  virtual std::string address() const = 0;
  // The Prometheus gauges (device modes, power, energy, saving), from the latest pushed state.
  virtual std::string MetricsText() const = 0;
};

}  // namespace ghost

#endif  // GHOST_PROXY_DASHBOARD_H_
