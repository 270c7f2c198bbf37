// HttpFetcher: the HTTP(S) origin fetcher of the cache (DESIGN §2 "push, never poll", §4
// common/ "origin fetchers"). libcurl's multi-socket API runs on the daemon's one libevent
// loop: curl tells us which sockets to watch and when its next timeout is due
// (CURLMOPT_SOCKETFUNCTION / CURLMOPT_TIMERFUNCTION) and we turn those into libevent events, so
// a transfer wakes the loop only when its socket is ready or one of curl's own deadlines
// (connect timeout, stall detection) is due. Nothing blocks the loop and nothing ticks: an
// idle fetcher has no socket event and no timer armed (kept-alive connections sit in curl's
// connection cache unwatched and are checked when next reused).
//
// A fetch streams: on_head once the final response's head is complete (before any body; not
// for 1xx answers or redirects that are followed), on_data for each chunk as it arrives, and
// on_done exactly once. HTTP error statuses (404, 500, ...) are answers, not failures: they
// come through on_head's status and on_done(OK). on_done's Status otherwise says what failed:
//   kUnavailable   the origin could not be reached (DNS failure, connection refused,
//                  host or network unreachable)
//   kTimedOut      the connect timeout, the stall limit or the total timeout ran out
//   kCorruption    the reply is not HTTP, is malformed, or its body ended before its
//                  Content-Length ("closed mid-body")
//   kInvalidArgument  the request itself is bad (not an http:// or https:// URL, a range with
//                  first > last, a line break in a header value)
//   kNotSupported  a redirect to a scheme other than http/https
//   kIoError       anything else (reset connections, TLS failures, too many redirects, the
//                  receiver aborting by returning false from on_head/on_data)
//
// Life of one fetch (one Transfer inside, keyed by its FetchId):
//
//     Fetch ─┬─▶ kQueued ──attach──▶ kRunning ──curl done──▶ kFinishing ──▶ on_done, freed
//            │   (attach waits for the loop's      │ on_head, on_data     [late on_head]
//            │    next turn when Fetch runs inside a curl callback: curl forbids re-entry)
//            └─▶ kFailed (invalid request) ──next turn──▶ on_done(error), freed
//     Cancel (kQueued, kFailed, kRunning, kFinishing) ──▶ kCancelled ──▶ freed; no callbacks
//
//   state      | event                           | next       | callbacks
//   kQueued    | Fetch at top level / next turn  | kRunning   | none yet
//   kFailed    | next turn                       | (freed)    | on_done(error)
//   kRunning   | final head complete             | kRunning   | on_head (once)
//   kRunning   | body bytes                      | kRunning   | [on_head first] on_data
//   kRunning   | curl reports done               | kFinishing | [on_head if not yet]
//   kFinishing | (same turn)                     | (freed)    | on_done (exactly once)
//   any        | Cancel                          | kCancelled | none, ever again; a running
//              |                                 |            | transfer is detached from curl
//              |                                 |            | now, or next turn if Cancel
//              |                                 |            | ran inside a curl callback
//
// Callbacks never run inside Fetch or Cancel: they run from the event loop. A callback may call
// Fetch and Cancel (for any fetch, its own included); it must not destroy the fetcher and must
// not throw (an exception from on_head/on_data fails that fetch with kInternal; one from
// on_done terminates the process, since it cannot be reported anywhere).
//
// Thread-safety: not thread-safe. Construct, call, and destroy on the thread that runs the
// event loop; all callbacks run there.
#ifndef GHOST_COMMON_HTTP_HTTP_FETCHER_H_
#define GHOST_COMMON_HTTP_HTTP_FETCHER_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "common/http/http_message.h"
#include "common/base/status.h"
#include "common/base/units.h"

struct event_base;  // libevent, kept out of the interface
struct event;

namespace ghost {

// How the fetcher talks to origins; parsed once from the configuration, passed by const&.
struct HttpFetcherOptions {
  // Time allowed to resolve the name and set up TCP (and TLS) to the origin.
  Duration connect_timeout = Seconds(2);
  // Stall detection: a transfer slower than low_speed_limit bytes/s for low_speed_time fails
  // with kTimedOut. A zero time disables it.
  Bytes low_speed_limit = 1;
  Duration low_speed_time = Seconds(30);
  // Hard limit on a whole transfer; zero (the default) means none, since a large object on a
  // slow link may legitimately take long (stall detection catches dead ones).
  Duration total_timeout = Duration::zero();
  std::string user_agent = "ghost/0.1";
  // Connections kept to one origin at once (others queue inside curl); 0 = no limit.
  int max_connections_per_host = 4;
  // Connections open in total; 0 = no limit.
  int max_total_connections = 0;
  // Idle connections kept for reuse (keep-alive).
  int connection_cache_size = 16;
  // Redirects followed per fetch.
  int max_redirects = 5;
  // TLS: a CA bundle file and/or a CA directory (empty: curl's built-in defaults), and
  // whether to verify the server's certificate and name (only switch off for tests).
  std::string ca_info;
  std::string ca_path;
  bool verify_peer = true;
  // Told of every fetch that finishes (not of cancelled ones), just before its on_done:
  // `http_status` is the final response's status (0 when none came) and `status` what on_done
  // gets. For the owner's origin health and log lines (common/http/origin_health.h).
  std::function<void(const HttpRequest& request, int http_status, const Status& status)> on_finish;
};

using FetchId = std::uint64_t;

class HttpFetcher {
 public:
  struct Callbacks {
    // The final response's head. Return false to abort the fetch (on_done then reports
    // kIoError "aborted by the receiver"). May be empty.
    std::function<bool(const HttpResponseHead&)> on_head;
    // A chunk of the body, borrowed for the call only. Return false to abort. May be empty.
    std::function<bool(std::string_view)> on_data;
    // Called exactly once (unless cancelled): OK after a complete response of any status.
    std::function<void(Status)> on_done;
  };

  // Borrows `base`; it must outlive the fetcher. The loop is driven by its owner.
  HttpFetcher(event_base* base, const HttpFetcherOptions& options);
  // Stops every fetch without calling any of its callbacks, closes the kept-alive
  // connections and frees every event. Must not run inside one of the fetcher's callbacks.
  ~HttpFetcher();
  HttpFetcher(const HttpFetcher&) = delete;
  HttpFetcher& operator=(const HttpFetcher&) = delete;

  // Starts a fetch. Never calls a callback before returning: an invalid request is reported
  // through on_done(kInvalidArgument) on the loop's next turn. Returns the fetch's id (never 0).
  FetchId Fetch(HttpRequest request, Callbacks callbacks);
  // Stops a fetch: none of its callbacks runs after Cancel returns (even when called from
  // inside one of them). Returns false if the id is unknown or already finished/cancelled.
  bool Cancel(FetchId id);
  // Stops receiving a running fetch's body (paused = true) or receives it again (false): the
  // receiver's back-pressure, so a body larger than memory streams through a fixed window.
  // A paused fetch is exempt from stall detection. Pausing takes effect at once (also from
  // inside its own on_data); resuming on the loop's next turn, never inside this call, so
  // on_data is not re-entered. Returns false if the fetch is not running.
  bool Pause(FetchId id, bool paused);

  // Fetches started and not yet finished or cancelled.
  std::size_t active() const;
  // TCP connections opened by finished fetches so far (a reused keep-alive connection adds 0).
  std::uint64_t connections_opened() const { return connections_opened_; }

 private:
  struct Transfer;
  struct SocketWatch;
  enum class State { kQueued, kFailed, kRunning, kFinishing, kCancelled };

  // C entry points from curl and libevent (they catch everything; see the header comment).
  static int OnCurlSocket(void* easy, int fd, int what, void* self, void* watch) noexcept;
  static int OnCurlTimer(void* multi, long timeout_ms, void* self) noexcept;
  static void OnSocketEvent(int fd, short what, void* self) noexcept;
  static void OnTimerEvent(int fd, short what, void* self) noexcept;
  static void OnDeferredEvent(int fd, short what, void* self) noexcept;
  static std::size_t OnCurlHeader(char* data, std::size_t size, std::size_t n, void* t) noexcept;
  static std::size_t OnCurlWrite(char* data, std::size_t size, std::size_t n, void* t) noexcept;

  Status Configure(Transfer& t);
  void Attach(Transfer& t);
  void ScheduleDeferred();
  void RunDeferred();
  void SocketAction(int fd, int curl_events);
  void ProcessCompletions();
  void Finish(Transfer* t, int curl_code);
  void Reap(FetchId id);
  bool DeliverHead(Transfer& t);
  Status StatusFor(const Transfer& t, int curl_code) const;
  void AssertInvariants() const;  // aborts on a broken invariant (debug builds)

  event_base* base_;
  const HttpFetcherOptions options_;
  void* multi_ = nullptr;         // CURLM*, owned (curl_multi_cleanup)
  event* timer_ev_ = nullptr;     // curl's single timeout, owned
  event* deferred_ev_ = nullptr;  // made active (never added) when deferred work waits, owned
  bool deferred_scheduled_ = false;
  int callback_depth_ = 0;  // > 0 while inside a curl callback: curl forbids re-entry
  FetchId next_id_ = 1;
  std::map<FetchId, std::unique_ptr<Transfer>> transfers_;
  std::vector<FetchId> to_attach_;  // kQueued fetches started inside a curl callback
  std::vector<FetchId> to_fail_;    // kFailed fetches awaiting on_done
  std::vector<FetchId> to_reap_;    // kCancelled fetches still attached to curl
  std::vector<FetchId> to_resume_;  // paused fetches to resume on the next turn
  std::set<SocketWatch*> watches_;  // every socket event, owned
  std::uint64_t connections_opened_ = 0;
};

}  // namespace ghost

#endif  // GHOST_COMMON_HTTP_HTTP_FETCHER_H_
