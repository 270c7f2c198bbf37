// OriginHealth: what the daemon knows about each HTTP origin's reachability, and the one
// mapping from a failed origin fetch to the errno a reader gets (DESIGN §4: failures are said,
// once, in the log and in `ghostctl status`).
//
// Every finished fetch is recorded (HttpFetcherOptions::on_finish). An origin is
//
//     unknown ──answer──▶ up ◀──answer (logged "origin NAME up again")──┐
//        │                 │                                           │
//        └──unreachable────┴──unreachable (logged "origin NAME down")──▶ down
//
// "answer": any HTTP response, 404 included (the server is there); "unreachable": no response
// (name not resolved, connection refused, host unreachable, timed out, TLS failure). Each
// failure — an HTTP error status or no response — is one log line with the URL, the reason and
// the errno readers get; the state changes are lines of their own.
//
// Thread-safety: not thread-safe; the daemon's loop thread only.
#ifndef GHOST_COMMON_HTTP_ORIGIN_HEALTH_H_
#define GHOST_COMMON_HTTP_ORIGIN_HEALTH_H_

#include <cerrno>
#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/base/clock.h"
#include "common/base/log.h"
#include "common/base/status.h"

namespace ghost {

// An errno that says this process ran out of something (descriptors, buffers, memory) before
// the origin was tried: readers get it as it is, and the origin is not marked down for it.
inline bool IsLocalResourceErrno(int e) { return e == EMFILE || e == ENFILE || e == ENOBUFS || e == ENOMEM; }

// The errno a reader gets for an origin fetch that failed: 404 and 410 → ENOENT, 401 and 403
// → EACCES, other HTTP errors → EIO; no response: the transport status's errno (EHOSTUNREACH
// for a name that does not resolve or a host that cannot be reached, ECONNREFUSED when
// nothing listens), ETIMEDOUT when it timed out, else EIO. `http_status` 0: no response.
int OriginErrno(const Status& transport, int http_status);
// The Status for an HTTP error answer of `url` (kNotFound, kPermissionDenied or kIoError), its
// ToErrno() equal to OriginErrno's.
Status OriginHttpStatus(const std::string& url, int http_status);
// "ENOENT", "EACCES", ... (the errno's name, for log lines).
const char* ErrnoName(int err);

class OriginHealth {
 public:
  enum class State { kUnknown, kUp, kDown };
  struct Origin {
    std::string name;
    std::string url;  // the base URL; a fetch belongs to the longest base that prefixes it
  };
  // Borrows `clock` (it must outlive this).
  OriginHealth(Clock& clock, std::vector<Origin> origins);

  // One finished fetch (HttpFetcherOptions::on_finish's arguments). Logs failures and state
  // changes; calls on_change after a state change.
  void Record(const std::string& method, const std::string& url, int http_status,
              const Status& status);
  // One IMAP connection attempt to the origin whose base URL is `url` (an imap:// or imaps://
  // origin): `answered` the server replied (a refused login included: it is up, the failure
  // is EACCES), else it could not be reached (down, the status's errno). Logged and counted
  // as Record does; a success brings the origin up.
  void RecordImap(const std::string& url, bool answered, const Status& status);
  // Called with the origin's name after it went down or came up.
  std::function<void(const std::string& name, State state)> on_change;

  State state(const std::string& name) const;
  static const char* StateName(State s);
  // {"NAME": {"url":..., "state":"up"|"down"|"unknown", "for_s": 12.5, "fetches": N,
  //           "failures": N, "last_failure": {"url":..., "reason":..., "errno":"ENOENT",
  //           "ago_s": 3.1}|null}}
  nlohmann::json ToJson() const;

 private:
  struct Entry {
    Origin origin;
    State state = State::kUnknown;
    TimePoint since{};
    std::uint64_t fetches = 0, failures = 0;
    bool has_failure = false;
    std::string last_url, last_reason;
    int last_errno = 0;
    TimePoint last_failure_at{};
  };
  Entry* Find(const std::string& url);
  // Counts a failure of `e` (may be null) with its log line, or nothing if `failed` is false;
  // then moves `e` up (answered) or down (no answer and a failure), logging the change.
  void Outcome(Entry* e, bool answered, bool failed, int err, const std::string& url,
               const std::string& reason, const std::string& line, LogLevel level);

  Clock& clock_;
  std::vector<Entry> entries_;
};

}  // namespace ghost

#endif  // GHOST_COMMON_HTTP_ORIGIN_HEALTH_H_
