// Internals of ghostproxy's server (proxy.h), shared by its .cc files and nothing else:
//   proxy.cc       Proxy::Impl: listener, admission, origin connection pool, stats, access
//                  log, /ghost/status and /ghost/metrics.
//   connection.cc  ClientConnection: the per-connection state machine (Drive), request
//                  parsing, local answers, CONNECT tunnels.
//   exchange.cc    One request/response exchange: cache lookup and the RFC 9111 decisions,
//                  the origin request, streaming the response to the client and the cache.
//   origin.cc      OriginConn: resolving and connecting to an origin, its bufferevent.
//
// The origin client is our own, on bufferevents with the http1 parser, rather than
// common/http/http_fetcher.h (libcurl): a forward proxy must pass arbitrary methods, request bodies
// and end-to-end header fields through verbatim, stream bodies both ways under back-pressure
// (pause the origin while a slow client's output is above the watermark), and keep and reuse
// origin connections per host. libcurl rewrites requests and owns its connections and
// buffering, so each of those would fight it.
//
// Lifetimes: Impl owns every ClientConnection through a shared_ptr; every libevent or backend
// callback first takes its own reference (or locks a weak_ptr), so a connection closed inside a
// callback lives until the callback returns. A ClientConnection owns its Exchange, the Exchange
// its OriginConn and CacheWriter. Idle OriginConns belong to Impl's pool. Backend callbacks
// carry the exchange serial and do nothing once that exchange is gone.
//
// Thread-safety: everything runs on the proxy's event loop thread.
#ifndef GHOST_PROXY_PROXY_INTERNAL_H_
#define GHOST_PROXY_PROXY_INTERNAL_H_

#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/bufferevent.h>
#include <event2/listener.h>
#include <sys/socket.h>

#include <cstdint>
#include <cstdio>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/base/accept_pause.h"
#include "common/base/clock.h"
#include "common/http/http_freshness.h"
#include "proxy/access_log.h"
#include "proxy/address.h"
#include "proxy/cache_backend.h"
#include "proxy/cache_policy.h"
#include "proxy/http1.h"
#include "proxy/proxy.h"

namespace ghost::proxy_internal {

struct BevDeleter {
  void operator()(bufferevent* b) const { bufferevent_free(b); }
};
using BevPtr = std::unique_ptr<bufferevent, BevDeleter>;

struct ListenerDeleter {
  void operator()(evconnlistener* l) const { evconnlistener_free(l); }
};
struct FileCloser {
  void operator()(std::FILE* f) const { std::fclose(f); }
};
struct EventDeleter {
  void operator()(event* e) const { event_free(e); }
};

// A one-shot timer on the injected Clock, cancelled when re-armed or destroyed. The callback
// may destroy the timer's owner.
class OneShotTimer {
 public:
  explicit OneShotTimer(Clock* clock) : clock_(clock) {}
  ~OneShotTimer() { Cancel(); }
  OneShotTimer(const OneShotTimer&) = delete;
  OneShotTimer& operator=(const OneShotTimer&) = delete;

  void Arm(Duration after, std::function<void()> fn) {
    Cancel();
    id_ = clock_->ScheduleAfter(after, [this, fn = std::move(fn)] {
      id_ = kNoTimer;
      fn();  // may destroy *this: nothing after it
    });
  }
  void Cancel() {
    if (id_ != kNoTimer) clock_->Cancel(id_);
    id_ = kNoTimer;
  }
  bool armed() const { return id_ != kNoTimer; }

 private:
  Clock* clock_;
  TimerId id_ = kNoTimer;
};

// "1.5 s", "300 ms": a duration for messages.
std::string DurationText(Duration d);
timeval ToTimeval(Duration d);
// A contiguous view of the first (at most 64 KiB of) bytes of `buf`, for a parser.
std::string_view Pullup(evbuffer* buf, std::size_t* len);

// What an exchange ended as, for the access log and the counters (squid-like names).
enum class ResultCode {
  kNone,
  kHit,
  kMemHit,  // a hit served from the backend's copy in RAM
  kMiss,
  kNetPreferred,
  kRevalidated,
  kStale,
  kTunnel,
  kLocal,
  kDenied,
  kError
};
const char* ResultName(ResultCode code);

// What happened on an origin connection, for its owner.
enum class OriginEvent {
  kConnected,  // resolved and connected: the request may be written
  kReadable,   // response bytes in the input buffer
  kDrained,    // output at or below the low watermark
  kEof,        // the origin closed its side
  kError,      // resolve, connect, socket error or timeout: see OriginConn::error()
};

class ClientConnection;
class Impl;

// One connection to an origin (or a tunnel's far end). Owned by an exchange or tunnel while
// busy (owner != nullptr, events go to the owner) and by the pool while idle.
class OriginConn {
 public:
  enum class State { kResolving, kConnecting, kOpen, kFailed };

  OriginConn(Impl* proxy, std::string host, std::uint16_t port);
  ~OriginConn();
  OriginConn(const OriginConn&) = delete;
  OriginConn& operator=(const OriginConn&) = delete;

  // Resolves the host and connects to its addresses in turn; reports kConnected or kError to
  // the owner later (never inside this call).
  void Connect();
  // Routes events to `owner` (nullptr: pooled; the pool watches it).
  void SetOwner(ClientConnection* owner);

  const std::string& host() const { return host_; }
  std::uint16_t port() const { return port_; }
  const std::string& pool_key() const { return pool_key_; }
  // "host:port" of the peer address connected to, for the access log.
  const std::string& peer() const { return peer_; }
  State state() const { return state_; }
  const Status& error() const { return error_; }
  bufferevent* bev() const { return bev_.get(); }
  evbuffer* input() const { return bufferevent_get_input(bev_.get()); }
  evbuffer* output() const { return bufferevent_get_output(bev_.get()); }
  http1::ResponseParser& parser() { return parser_; }
  bool reused = false;  // has carried an earlier exchange (a failure may be a stale socket)
  ClientConnection* owner() const { return owner_; }

  // Download shaping (proxy/shaper.h). StartShaping shapes what this connection reads from now on
  // (`size`: the declared length, 0 unknown; nothing with --shape off); StopShaping (also on
  // SetOwner(nullptr)) ends it. PauseReading is the owner's back-pressure: while paused nothing
  // is read, resumed the shaper decides.
  void StartShaping(Bytes size);
  void StopShaping();
  void PauseReading(bool paused);
  bool shaping() const { return shaper_ != nullptr; }

 private:
  struct Resolve;  // a name being resolved (outlives us if we give up on it; see origin.cc)
  static void OnResolved(evutil_socket_t, short, void* arg);
  static void OnRead(bufferevent* bev, void* arg);
  static void OnWrite(bufferevent* bev, void* arg);
  static void OnEvent(bufferevent* bev, short what, void* arg);
  void TryNextAddress();
  void Fail(Status status);
  void Notify(OriginEvent event);

  Impl* proxy_;
  std::string host_;
  std::uint16_t port_;
  std::string pool_key_;
  std::string peer_;
  State state_ = State::kResolving;
  Status error_;
  Status last_connect_error_;
  BevPtr bev_;
  http1::ResponseParser parser_;
  Resolve* resolve_ = nullptr;
  bool in_connect_ = false;     // Connect() is on the stack: events are deferred
  OneShotTimer deferred_;       // delivers an event deferred out of Connect()
  OneShotTimer resolve_timer_;  // a name lookup may take up to the connect timeout
  std::vector<sockaddr_storage> addresses_;
  std::size_t next_address_ = 0;
  ClientConnection* owner_ = nullptr;
  bool read_paused_ = false;
  std::unique_ptr<UpstreamShaper> shaper_;  // declared after bev_: destroyed before it
  std::optional<Duration> handshake_rtt_;   // tcpi_min_rtt when the connect completed
};

// The server state shared by every connection.
class Impl {
 public:
  Impl(event_base* base, Clock* clock, CacheBackend* backend, const ProxyOptions& options);
  ~Impl();

  Status Listen();
  void OpenAccessLog(std::unique_ptr<AccessLog> log) { access_log_ = std::move(log); }
  AccessLog* access_log() const { return access_log_.get(); }

  // True when host:port names this proxy (its bound address, or a loopback name when it
  // listens on loopback or on every address).
  bool IsSelf(std::string_view host, std::uint16_t port) const;
  // True when a Via field value already names this proxy.
  bool ViaHasUs(std::string_view via) const;
  std::int64_t UnixNow() const;

  // Idle origin connections: take one for host:port (nullptr if none), or give one back.
  std::unique_ptr<OriginConn> TakeIdle(const std::string& pool_key);
  void PutIdle(std::unique_ptr<OriginConn> conn);
  // A pooled connection became unusable (closed, data, timeout): drop it.
  void DropIdle(OriginConn* conn);

  // Forgets a closed connection (it lives on while a callback holds it).
  void Remove(std::uint64_t id);
  // The connection no longer holds one of the max_connections places (nor one of its client's):
  // it is closing, preempted. Idempotent.
  void ReleasePlace(ClientConnection* c);
  // One access-log line (squid native format).
  void LogAccess(TimePoint start, const std::string& client, ResultCode code, int status,
                 std::uint64_t bytes, const std::string& method, const std::string& url,
                 const std::string& hierarchy, const std::string& content_type);

  std::string StatusJson() const;
  std::string MetricsText() const;
  std::size_t idle_origin_count() const;

  event_base* const base;
  Clock* const clock;
  CacheBackend* const backend;
  const ProxyOptions options;
  ListenAddress bound;
  std::string via_name;
  std::vector<Cidr> allow;
  ProxyStats stats;
  // Shared with resolver threads (origin.cc): they post their result to `base` only while
  // `alive` holds, under `mu`.
  struct ResolverShared {
    std::mutex mu;
    event_base* base = nullptr;
    bool alive = true;
  };
  std::shared_ptr<ResolverShared> resolver = std::make_shared<ResolverShared>();
  std::map<std::uint64_t, std::shared_ptr<ClientConnection>> connections;
  // Connections holding a place (accepted, not refused nor preempted), in all and per client
  // address (ClientConnection::holds_place_).
  std::size_t places_taken = 0;
  std::map<std::string, std::size_t> places_per_client;
  std::uint64_t transfers_in_progress = 0;
  // Expires with the proxy: backend callbacks that outlive every connection check it.
  std::shared_ptr<bool> alive = std::make_shared<bool>(true);

 private:
  static void OnAccept(evconnlistener* listener, evutil_socket_t fd, sockaddr* addr, int len,
                       void* arg);
  static void OnAcceptError(evconnlistener* listener, void* arg);
  static void OnFlushAccessLog(evutil_socket_t, short, void* arg);
  // `n` in decimal, padded with `pad` on the left to `width` characters (printf's "%6lld",
  // "%03d").
  static void AppendNumber(std::string* out, long long n, int width, char pad);
  // At the limit: closes the connection that has waited longest (at least preempt_after) for a
  // request head. False when none has.
  bool PreemptWaiting();

  std::unique_ptr<evconnlistener, ListenerDeleter> listener_;
  // Out of descriptors: accepting pauses until a connection closes or 100 ms pass (a proxy whose
  // descriptors the IMAP sessions hold has no connection of its own to wait for).
  std::unique_ptr<AcceptPause> accept_pause_;
  std::map<std::string, std::deque<std::unique_ptr<OriginConn>>> idle_;
  std::unique_ptr<AccessLog> access_log_;
  std::string log_line_;  // LogAccess's line, its capacity kept from one request to the next
  // Lines go to the log's writer thread once per loop turn (an active event, no timer): a busy
  // turn's requests cost one hand-over, and the loop never waits for the file (access_log.h).
  std::unique_ptr<event, EventDeleter> log_flush_;
  bool log_flush_pending_ = false;
  std::vector<IpAddress> local_addresses_;  // when bound to 0.0.0.0 / ::
  std::uint64_t next_id_ = 1;
  TimePoint started_;
  std::int64_t started_unix_ = 0;
};

}  // namespace ghost::proxy_internal

namespace ghost {

// What every hit on one RAM copy would derive again from its stored head (exchange.cc,
// MemoryObject::memo): its freshness fields parsed once, and the head of a whole-body answer
// to a plain GET written out, but for Age, Content-Length and Connection. Built on the first
// hit, for the proxy's Via name and heuristic freshness (another proxy sharing the backend
// builds its own).
struct MemoryHitMemo {
  std::string via_name;
  Duration heuristic{0};
  StoredFreshness freshness;
  // `head` and `tail` are usable: every field can be sent (else hits take the general path,
  // which answers 502 for such a head).
  bool head_ok = false;
  std::string head;  // the status line and the stored fields, each with its CRLF
  std::string tail;  // the Via and X-Ghost-Source lines
  std::string content_type;
};

}  // namespace ghost

namespace ghost::proxy_internal {

// One request and its response (see exchange.cc for the cache decisions).
struct Exchange {
  enum class Step {
    kLookup,     // waiting for the backend's Lookup
    kOrigin,     // talking to the origin (connect, request, response)
    kCacheBody,  // sending a stored body (ReadBody slices)
    kDone,       // the response is complete (or the exchange was cut)
  };
  enum class Framing { kNone, kLength, kChunked, kUntilClose };

  std::uint64_t serial = 0;
  TimePoint start{};
  Step step = Step::kLookup;
  http1::RequestHead req;
  http1::AbsoluteUrl url;
  std::string url_key;  // UrlKey(url)
  std::string log_url;
  CacheControl req_cc;

  // The client's request message.
  bool request_complete = false;      // its body (if any) has been read entirely
  bool request_body_started = false;  // body bytes went to an origin (no retry)
  bool body_sink_ready = false;       // the origin takes the body now
  bool sent_continue = false;

  // Cache.
  std::string key;  // where the stored response is (or will be) kept
  std::optional<StoredResponse> stored;
  StoredState stored_state;
  // The backend's copy in RAM that `stored` came from (CacheChoice::kMemory), if any.
  std::shared_ptr<const MemoryObject> memory;
  // The backend's hold on the version of the body `stored` describes (CacheLookup::body).
  std::shared_ptr<const void> body;
  bool skip_memory = false;        // the RAM copy cannot answer: the lookups go to the backend
  std::string vary;                // the URL key holds a vary index with this Vary
  bool revalidating = false;       // the origin request carries our validators
  bool net_preferred = false;      // the cost model chose the network over a copy
  bool fallback_to_cache = false;  // a fresh copy exists: serve it if the origin fails
  ResultCode result = ResultCode::kNone;

  // Origin.
  std::unique_ptr<OriginConn> origin;
  bool transfer_open = false;  // TransferBegin sent, TransferEnd owed
  std::uint64_t transfer = 0;  // its id
  Bytes origin_bytes = 0;
  Bytes origin_body_bytes = 0;
  // The backend's network card carries the body (TransferData): until it has, the response's
  // last byte is held back (`held`), and an origin response already complete waits.
  bool card_data_sent = false;
  bool card_pending = false;
  bool complete_after_card = false;
  std::string held;
  int attempts = 0;
  bool origin_head_seen = false;  // a final response head arrived
  bool origin_paused = false;     // origin reading paused for back-pressure
  std::string hierarchy = "NONE/-";
  http1::ResponseHead origin_head;  // the final response head, copied
  std::unique_ptr<CacheWriter> writer;
  std::string store_key;
  StoredResponse store_head;
  std::string store_vary;            // the stored variant needs a vary index with this Vary
  bool discard_origin_body = false;  // reading the origin's body only to drop it

  // Response to the client.
  bool response_started = false;
  std::string deferred_head;  // a head waiting for the first body bytes
  bool logged = false;
  int status = 0;
  std::string content_type;
  Framing framing = Framing::kNone;
  std::uint64_t bytes_sent = 0;  // head and body bytes queued for the client
  Bytes cache_offset = 0, cache_end = 0;
  bool cache_read_in_flight = false;
};

// One client connection: a state enum moved by Drive (diagram and table in connection.cc).
class ClientConnection : public std::enable_shared_from_this<ClientConnection> {
 public:
  enum class State { kReadingHead, kExchange, kTunnelConnecting, kTunnel, kClosing, kClosed };

  ClientConnection(Impl* proxy, std::uint64_t id, evutil_socket_t fd, const IpAddress& peer);
  ~ClientConnection();

  // Starts reading; `reject_status` (403, 429 or 503 at accept) answers at once and closes.
  void Start(int reject_status);
  // Gives up its place for a new connection (Impl::PreemptWaiting): precondition kReadingHead.
  // Idle (no byte of a head): closed silently; a partial head: 408, then closed.
  void Preempt();
  // Closes at once (no more output); the proxy forgets the connection.
  void Close();
  State state() const { return state_; }
  std::uint64_t id() const { return id_; }

  // Events from the origin connection of the exchange or tunnel.
  void OnOrigin(OriginEvent event);

 private:
  friend class Impl;
  static void OnRead(bufferevent* bev, void* arg);
  static void OnWrite(bufferevent* bev, void* arg);
  static void OnEvent(bufferevent* bev, short what, void* arg);

  // The one function that moves the connection through its states (connection.cc).
  void Drive();
  void AssertInvariants() const;
  void EnterReadingHead();
  void EnterClosing();
  void ArmHeadTimer(Duration after);
  void OnHeadTimeout();
  bool ParseNextHead();
  void PumpRequestBody();
  void DiscardRequestBody();

  // Local answers. `close`: the connection ends after it.
  void SendLocal(int status, const std::string& message, ResultCode code, bool close,
                 const http1::HeaderList& extra = {});
  void SendRaw(int status, const std::string& content_type, const std::string& body,
               ResultCode code, bool close, const http1::HeaderList& extra = {});
  void SendStatusPage(const std::string& path);
  // /ghost/ or /ghost with a dashboard running (ProxyOptions::dashboard_url): a 302 to its page,
  // and true; else false and nothing is sent.
  bool SendDashboardRedirect(const std::string& path);

  // Requests (exchange.cc).
  void StartExchange();
  void StartLookup(const std::string& key, bool second_level);
  void OnLookup(const std::string& key, Result<CacheLookup> lookup, bool second_level);
  void DecideFromStored(const CacheLookup& lookup);
  void StartFetch();
  void ConnectOrigin();
  void SendOriginRequest();
  // Parses what the origin sent; `force` also while paused (the origin has closed).
  void OnOriginReadable(bool force);
  void OnOriginHead();
  void OnOriginBody(std::string_view data);
  void OnOriginComplete();
  void OnOriginEof();
  // `why` is taken by value: it is often the failed OriginConn's error(), and the connection is
  // destroyed here before the message is used (a reference would read freed memory).
  void OnOriginFailed(Status why, bool bad_response);
  void ReleaseOrigin(bool reusable);
  void EndTransfer();
  // Tells the backend's card the body's size; the response completes once it has carried it.
  void StartCardData(Bytes body_bytes);
  void OnCardDone();
  void ServeFromCache(const StoredResponse& stored, ResultCode code, const char* source);
  // The memo of the exchange's RAM copy (MemoryHitMemo), built on its first hit.
  const MemoryHitMemo& HitMemo();
  // A whole-body 200-like answer to a plain GET from the RAM copy, its head from the memo:
  // the same bytes ServeFromCache writes through WriteResponseHead. False (nothing written)
  // when the request is not a plain GET or the memo's head cannot be used.
  bool ServePlainMemoryHit(const StoredState& st);
  bool ServeFailure();
  void ReadNextCacheSlice();
  void StartStore(const http1::ResponseHead& head, const StorageDecision& decision);
  void CommitStore();
  void AbortExchange();
  void FinishExchange();
  // The head for the client: `headers` plus Via, X-Ghost-Source and Connection.
  // `defer`: keep the head until the first body bytes (WriteBody) or EndBody, so a cached
  // body that cannot be read can still be answered differently.
  void WriteResponseHead(int status, const std::string& reason, http1::HeaderList headers,
                         const char* source, Exchange::Framing framing, bool body_follows,
                         bool defer);
  void WriteBody(std::string_view data);
  // The deferred head (if any) and bytes [first, first + length) of the exchange's RAM copy:
  // written to the socket at once when nothing is queued before them; what it does not take
  // is referenced (not copied) by the output buffer, which keeps the copy alive until sent.
  void WriteMemoryBody(Bytes first, Bytes length);
  void EndBody();
  bool ClientBackedUp() const;
  void OnClientDrained();

  // CONNECT tunnels (connection.cc).
  void StartTunnel();
  void OnTunnelOrigin(OriginEvent event);
  void RelayTunnel();
  void OnTunnelIdle();
  void CloseTunnelWhenFlushed();

  evbuffer* input() const { return bufferevent_get_input(bev_.get()); }
  evbuffer* output() const { return bufferevent_get_output(bev_.get()); }
  void SetReadTimeout(std::optional<Duration> timeout);

  Impl* const proxy_;
  const std::uint64_t id_;
  State state_ = State::kReadingHead;
  BevPtr bev_;
  IpAddress peer_;
  std::string peer_text_;
  http1::RequestParser parser_;
  OneShotTimer head_timer_;
  TimePoint waiting_since_{};  // when kReadingHead began (the head deadline counts from it)
  bool holds_place_ = false;   // counted in Impl::places_taken (set and cleared by Impl)
  bool head_started_ = false;  // a byte of the next head arrived (else the connection is idle)
  bool peer_closed_ = false;  // EOF from the client
  bool keep_alive_ = true;    // the connection may carry another request
  bool linger_ = false;       // closing: wait for the client's EOF after our output
  OneShotTimer linger_timer_;
  OneShotTimer fallback_timer_;  // the exchange's copy answers if the origin stays silent
  std::uint64_t next_serial_ = 1;
  std::unique_ptr<Exchange> ex_;

  // Tunnel.
  std::unique_ptr<OriginConn> tunnel_;
  OneShotTimer tunnel_timer_;
  TimePoint tunnel_last_activity_{};
  TimePoint tunnel_start_{};
  std::uint64_t tunnel_bytes_up_ = 0, tunnel_bytes_down_ = 0;
  std::string tunnel_target_;
  bool tunnel_closing_ = false;
};

}  // namespace ghost::proxy_internal

#endif  // GHOST_PROXY_PROXY_INTERNAL_H_
