// SmtpProxy: outgoing mail waits for the radio (DESIGN §3.3: transfers are deferred
// and batched so the network card spends less time in its high-power mode).
//
// Mail clients submit to `smtp_listen` (plain, loopback). Each message is journaled durably in
// the Outbox (common/imap/outbox.h: fsync'ed before the answer) and answered 250 at once; the
// outbox is sent to `smtp_origin` (smtps:// or smtp:// with STARTTLS when offered, plain allowed
// to loopback, through libcurl's SMTP in a worker thread) when:
//   - the network card enters its high-power mode (ghostfs's "modes" events over its control
//     socket: a network device whose mode is its most power-hungry one), so mail rides along
//     with traffic that pays for the wake-up anyway;
//   - the waiting bytes pass `cap` or the waiting messages `cap_messages`;
//   - the oldest waiting message has waited `deadline` × (100 − K) / 50, K being ghostfs's knob
//     (60 s at K=50, 120 s at K=0, at once at K=100: DeadlineFor, as the IMAP queues): a card
//     that never needs its high-power mode must not hold mail forever;
//   - `ghostctl flush` / `ghostctl sync` (ghostfs publishes a flush event; proxy/network_watch.h);
//   - the process gets SIGUSR1 (ghostproxy_main.cc), and at start when mail is waiting from
//     before (after the deadline).
// Every send is disclosed to the power manager (TransferBegin/TransferEnd).
//
// AUTH (PLAIN, LOGIN) is passed through: the client's credentials are used for its messages'
// upstream send. They are kept in RAM only, never on disk; messages journaled by an
// authenticated user wait after a restart until that user authenticates again. A 5xx from the
// server refuses a message for good: it is moved to refused/ with the reply (ghostctl outbox
// lists it), never dropped. A 4xx or a connection failure leaves it waiting for the next turn.
//
// Bad input: a command line over 4 KiB or a message line over 64 KiB gets a 500 and a close; a
// message over `max_message` gets 552 (its bytes are read and dropped); bad base64 gets 501.
// A client silent for `timeout` mid-command or mid-message is closed.
//
// Stopping: a send in progress gets kStopGrace (4 s, smtp_proxy.cc) to finish, so a server's
// late 250 still takes its message out of the outbox; one not answered by then is aborted
// (curl's progress callback) and its message waits for the next start. A server that never
// answers does not hold the stop for curl's own 60 s (ghostproxy_smtp_hang).
//
// Event model: the proxy's loop; the deadline timer exists only while mail waits; sends run in
// one worker thread whose results come back to the loop. Thread-safety: loop thread only.
#ifndef GHOST_PROXY_SMTP_PROXY_H_
#define GHOST_PROXY_SMTP_PROXY_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "common/base/status.h"
#include "common/base/units.h"
#include "proxy/address.h"
#include "proxy/cache_backend.h"

struct event_base;

namespace ghost {

struct SmtpProxyOptions {
  std::optional<ListenAddress> smtp_listen;  // [smtp_listen] nullopt: no SMTP listener
  std::string smtp_origin;                   // [smtp_origin] smtp[s]://HOST:PORT/
  std::string outbox;                        // [smtp_outbox] the outbox directory
  Duration deadline = std::chrono::seconds(60);  // [smtp_deadline] seconds at knob 50
  Bytes cap = 1ull << 20;                    // [smtp_outbox_cap] waiting bytes
  std::size_t cap_messages = 100;
  Bytes max_message = 32ull << 20;
  Duration timeout = std::chrono::seconds(300);
  // ghostfs's control socket, for the network card's mode (empty: no high-power trigger).
  std::string control_path;
};

struct SmtpProxyStats {
  std::uint64_t sessions = 0, accepted = 0, sent = 0, refused = 0, send_failures = 0, flushes = 0;
};

class SmtpProxy {
 public:
  // Opens the outbox and listens. `base` and `backend` are borrowed and must outlive the proxy.
  [[nodiscard]] static Result<std::unique_ptr<SmtpProxy>> Start(event_base* base, CacheBackend* backend,
                                                                const SmtpProxyOptions& options);
  ~SmtpProxy();  // waits for a send in progress
  SmtpProxy(const SmtpProxy&) = delete;
  SmtpProxy& operator=(const SmtpProxy&) = delete;

  // Sends what waits now (a send in progress is followed by another).
  void Flush(const char* why);
  const ListenAddress& address() const;
  const SmtpProxyStats& stats() const;

  class Impl;
  explicit SmtpProxy(std::unique_ptr<Impl> impl);

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace ghost

#endif  // GHOST_PROXY_SMTP_PROXY_H_
