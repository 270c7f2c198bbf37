// Control socket (DESIGN §4.2): how ghostctl, ghostproxy and scripts talk to the ghostfs daemon.
//
// A Unix stream socket (mode 0600, default path $GHOST_CONTROL or /run/ghost/control.sock)
// speaking newline-delimited JSON. This file is the protocol's one definition: ControlServer
// frames, validates and routes requests to a handler the daemon supplies, and pushes
// subscription events; ControlClient is the blocking client for ghostctl and tests.
//
// ---- Framing ----
// Every message is one JSON object on one line ending in "\n" (a "\r" before it is ignored;
// blank lines are ignored). Requests go client → server; replies and pushed events go server →
// client on the same connection. A client may send several requests without waiting: each
// reply carries the request's id, and replies to asynchronous ops (flush) may overtake earlier
// ones. Events never carry an id.
//
//   request   {"id": 7, "op": "knob", "value": 70}
//   reply     {"id":7,"ok":true,"result":{"knob":70,"previous":50}}
//   error     {"id":7,"ok":false,"error":"knob: 170 is outside 0..100"}
//   event     {"event":"modes","data":{"device":"microdrive-1gb","id":0,"mode":"standby",...}}
//
// "id" is echoed verbatim (a number by convention; null when the request had none or could not
// be parsed). Errors the server answers itself, the connection staying usable:
//   - invalid JSON, a line that is not an object, a missing or non-string "op", an unknown op,
//     arguments of the wrong type or range (see the ops below);
//   - a request line longer than 64 KiB (ControlServerOptions::max_request_line): error reply,
//     then the server reads nothing more and closes the connection once the reply is written.
//
// ---- Ops ----
// The server validates the arguments listed here and passes only well-formed requests to the
// handler, which implements the op (in ghostfs) and replies with the result shown.
//
//   status {"path": P}  cache status of a file. P is absolute (under the mount point; ghostctl
//       sends absolute paths) or relative to the mount root. Result:
//       {"path":"/mnt/ghost/web/index.html","cached":true,"size":5120,
//        "source_preference":"disk","last_source":"network",   (optional: "url", "state")
//        "cost":{"disk":{"time_s":0.012,"energy_j":0.03},"network":{"time_s":0.2,"energy_j":0.4}}}
//       An unknown path is an error reply ("status: /x: no such file in the mount").
//   hint {"kind": K, "device": D, "time_s": T, "energy_j": E}  an application's hint (DESIGN
//       §3.3, §3.4). K is "ghost" | "transfer_begin" | "transfer_end" | "background"; D is a
//       device name ("microdrive-1gb") or id (0); T and E (numbers >= 0, default 0) are what a
//       ghost hint says the device's best mode would have saved. Result: {}.
//   knob {"value": V}?  without "value": get; with an integer V in 0..100: set.
//       Result: {"knob":70} (a set adds "previous":50).
//   devices  every registered device. Result:
//       [{"id":0,"name":"microdrive-1gb","kind":"disk","mode":"standby","mode_index":2,
//         "modes":[{"name":"active","power_w":1.3},{"name":"idle","power_w":0.5},
//                  {"name":"standby","power_w":0.08}],
//         "power_w":0.08,"policy":"stpm-disk K=50: spin down after 12.3 s"}]
//       ("kind": "disk" | "network" | "flash"; "power_w": what it draws now.)
//   stats  energy and activity since the daemon started. Result:
//       {"uptime_s":3600.5,"knob":50,
//        "energy_j":{"total":1234.5,"base":1000.0,"devices":{"microdrive-1gb":120.5}},
//        "requests":{"memory":0,"disk":3,"network":5},"ghost_hints_sent":2,
//                    (more request sources, e.g. "revalidated", may follow the three)
//        "write_queue":{"queued_bytes":4096,"flushes":1},
//        "cache":{"objects":42,"bytes":1048576,"capacity":67108864}}
//   flush  write every deferred write to its device now; replies when done (asynchronous).
//       Result: {"flushed_bytes":4096,"duration_s":1.2}
//   drop_caches  forgets the page-cache model's contents (the shared store's RAM copies,
//       fs/store_tree.cc), as `echo 1 > /proc/sys/vm/drop_caches` does for the kernel's: the
//       next lookups choose between disk and network. Result: {"dropped": N} (objects).
//
//   The shared store (ghostproxy's cache is the daemon's: fs/store_tree.cc). K is an opaque
//   non-empty cache key (the proxy uses the URL, plus the Vary'd request headers).
//   lookup {"key": K}  is K cached, and where should it be read from now? The daemon runs the
//       cost model (sending the disk a ghost hint when the network wins). Result:
//       {"cached":false}, or {"cached":true,"size":5120,"response":"<the stored head>",
//        "choice":"disk"|"network","source":"disk"|"memory"|"network","ghost_hint":false,
//        "cost":{...the estimates, as the user.ghost.cost attribute shows them...},
//        "etag":"\"5f-1\"","last_modified":"...","content_type":"text/html","expires_unix":N|null,
//        "path":"/mnt/ghost/.ghost/objects/<hex sha-256 of K>",   (read the body there)
//        "body_path":"<cache dir>/objects/ab/ab12..."}   (only with "choice":"disk": the body
//       file itself, which a reader on this machine may read instead of "path"; the daemon
//       has charged the emulated disk for that read already)
//   store {"key": K, "response": R, "etag": E, "last_modified": L, "content_type": T,
//          "expires_unix": X}  (all but "key" optional; R is stored verbatim, X is an integer
//       or null) opens a fill. Result: {"path":"/mnt/ghost/.ghost/fill/<token>"}: write the
//       body there; closing the file hands it to the write queue, replacing any object at K;
//       unlinking it first abandons the fill.
//   refresh {"key": K, ...the fields of store...}  a 304 refreshed K: replaces those fields,
//       keeps the body. Result: {}; an error if K is not cached.
//   invalidate {"key": K}  drops K. Result: {"removed":true|false}.
//   transfer {"phase": "begin"}  a proxy's fetch from an origin, carried by the emulated card
//       (fs/store_tree.cc): disclosed to the network module, the card's round trips start.
//       Result: {"transfer": T}.
//     {"phase": "data", "transfer": T, "bytes": B}  the body's size is known: the card carries
//       B bytes; answered ({}) once it has (once per transfer).
//     {"phase": "end", "transfer": T}  the fetch is over (the transfer closes after its data).
//   served {"memory": {K: N, ...}, "bytes": B}  a client served N reads of each K from its own
//       copy in RAM (the memory source, DESIGN §3.4; ghostproxy's MemoryCache), B body bytes in
//       all, since its last report: counted as memory reads in stats, and each K becomes the
//       most recently used. N are integers >= 1, B an integer >= 0. Result: {}.
//   subscribe {"topics": [T...]}  answered by the server itself: from the reply on, every
//       event published on those topics is pushed to this connection until it closes
//       (subscribing again adds topics). Result: {"topics":["modes","stats"]} (all now held).
//
// ---- Topics (pushed {"event": topic, "data": ...}) ----
//   modes   a device entered a mode, or a policy changed (knob set): data is the devices
//           result, the whole array as `devices` returns it. (ghostctl also accepts one
//           device's entry, {"device":"microdrive-1gb","id":0,"mode":"standby","mode_index":2,
//           "power_w":0.08}, and updates that row.)
//   stats   the stats changed: data has the shape of the stats result (the daemon coalesces;
//           nothing is pushed while nothing happens).
//   events  anything else worth a log line: {"type":"ghost_hint"|"flush"|"fetch_error"|...,...}
//   objects a stored object changed or left the cache (refreshed, replaced by a fill,
//           invalidated, evicted): {"key": K}. A client holding a copy of K in RAM drops it;
//           one that loses its subscription must drop every copy (it may have missed events).
//           Published from the daemon's first "lookup" on (no copy can exist before one).
//
// ---- Back-pressure ----
// The server never blocks its loop on a client. It stops reading a client's requests while
// more than ControlServerOptions::pause_reading_at bytes of output wait for it, and resumes
// once the output has drained. Events cannot wait, so a client whose queued output passes
// ControlServerOptions::high_watermark (1 MiB) — a subscriber that never reads — is
// disconnected; other clients are unaffected.
//
// Thread-safety: a ControlServer and its Replies belong to the thread that runs its event_base;
// call Publish, invoke Replies and destroy the server only there (libevent finishes closing
// the sockets on the loop's next turn, or when the base is freed). A ControlClient is a plain
// blocking object for one thread at a time.
#ifndef GHOST_COMMON_CONTROL_CONTROL_H_
#define GHOST_COMMON_CONTROL_CONTROL_H_

#include <sys/types.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

#include "common/base/status.h"
#include "common/base/units.h"

// libevent and socket types, kept out of the interface.
struct bufferevent;
struct event_base;
struct evconnlistener;
struct sockaddr;

namespace ghost {

// The ops a request may name, and the topics a subscription may hold.
inline constexpr std::array<std::string_view, 14> kControlOps = {
    "status",    "hint",   "knob",  "devices", "stats",      "flush",    "drop_caches",
    "subscribe", "lookup", "store", "refresh", "invalidate", "transfer", "served"};
inline constexpr std::array<std::string_view, 4> kControlTopics = {"modes", "stats", "events",
                                                                   "objects"};

// $GHOST_CONTROL if set and non-empty, else /run/ghost/control.sock.
std::string DefaultControlPath();

struct ControlServerOptions {
  // A request line longer than this (without its newline) is refused and ends the connection.
  std::size_t max_request_line = 64 * 1024;
  // Requests are not read from a client while more output than this waits for it.
  std::size_t pause_reading_at = 256 * 1024;
  // A client whose waiting output passes this is disconnected (it is not reading).
  std::size_t high_watermark = 1024 * 1024;
};

class ControlServer {
 public:
  // The one answer to one request. Copyable, so it may be stored in callbacks and invoked later
  // (a flush replies when the disk has been written), on the server's thread, exactly once.
  // Invoking it after the client disconnected (or the server was destroyed) does nothing. If
  // every copy is destroyed unanswered, the client gets an "internal error" reply, so a request
  // never goes unanswered.
  class Reply {
   public:
    // Replies {"ok":true,"result":result}.
    void operator()(nlohmann::json result) const;
    // Replies {"ok":false,"error":message}.
    void Error(const std::string& message) const;
    // Replies with the status's message. Precondition: !status.ok().
    void Error(const Status& status) const;
    // False once replied, or once the client has gone (the reply would be dropped).
    bool pending() const;

   private:
    friend class ControlServer;
    struct State;
    explicit Reply(std::shared_ptr<State> state) : state_(std::move(state)) {}
    std::shared_ptr<State> state_;
  };

  // Runs on the server's thread for every well-formed request except subscribe. `request` is
  // the whole object (id, op and arguments) and lives only for the call. An exception thrown by
  // the handler becomes an "internal error" reply (if it had not replied yet).
  using Handler = std::function<void(const nlohmann::json& request, Reply reply)>;

  // Listens on `path` with `base` (borrowed: it must outlive the server). The socket file is
  // created with mode 0600 before it accepts connections. A stale socket file (no server
  // answers) is replaced. Fails with kExists if a live server answers at `path` or `path` is
  // not a socket, kInvalidArgument if the path is too long for a Unix socket, an errno status
  // if the socket cannot be created. Also makes the process ignore SIGPIPE if it did not
  // already handle it (a client that disconnects must not kill the daemon).
  static Result<std::unique_ptr<ControlServer>> Listen(event_base* base, const std::string& path,
                                                       Handler handler,
                                                       const ControlServerOptions& options = {});

  // Closes every connection (pending Replies become no-ops) and unlinks the socket file if it
  // is still ours.
  ~ControlServer();
  ControlServer(const ControlServer&) = delete;
  ControlServer& operator=(const ControlServer&) = delete;

  // Pushes {"event":topic,"data":data} to every connection subscribed to `topic`, disconnecting
  // any whose output passes the high watermark. Never blocks.
  void Publish(const std::string& topic, const nlohmann::json& data);
  // Whether any connection is subscribed to `topic`: lets a caller skip building an event
  // nobody receives (on a hot path such as every open).
  bool Subscribed(const std::string& topic) const;

  const std::string& path() const { return path_; }
  std::size_t connections() const { return connections_.size(); }
  std::size_t subscribers(const std::string& topic) const;

 private:
  struct Connection;
  enum class ConnState;
  enum class ConnEvent;

  ControlServer(event_base* base, std::string path, Handler handler, ControlServerOptions options);
  static void OnAccept(evconnlistener* listener, int fd, sockaddr* addr, int len, void* arg);
  static void OnAcceptError(evconnlistener* listener, void* arg);
  static void OnRead(bufferevent* bev, void* arg);
  static void OnWrite(bufferevent* bev, void* arg);
  static void OnEvent(bufferevent* bev, short what, void* arg);

  // The one function that moves a connection through its states (see control.cc).
  void Drive(Connection& c, ConnEvent ev);
  void ReadRequests(Connection& c);
  void HandleLine(Connection& c, std::string_view line);
  void Subscribe(Connection& c, const nlohmann::json& request, const Reply& reply);
  void Send(Connection& c, const std::string& line);
  void Close(Connection& c);

  event_base* base_;
  std::string path_;
  Handler handler_;
  ControlServerOptions options_;
  struct ListenerDeleter {
    void operator()(evconnlistener* l) const;
  };
  std::unique_ptr<evconnlistener, ListenerDeleter> listener_;
  bool accepting_ = true;  // false while accept() fails for lack of fds
  dev_t socket_dev_ = 0;   // identity of our socket file, so we unlink only our own
  ino_t socket_ino_ = 0;
  std::uint64_t next_conn_ = 1;
  std::map<std::uint64_t, std::shared_ptr<Connection>> connections_;
};

// Blocking client of the control socket: one request at a time, events queued while waiting.
class ControlClient {
 public:
  // Connects to the server at `path`. Fails with kUnavailable and the message "cannot connect
  // to PATH: is ghostfs running? (--control PATH)" when nothing listens there, kReadOnly when
  // the socket is not ours (permission denied), kInvalidArgument for a path too long.
  static Result<ControlClient> Connect(const std::string& path);

  ControlClient(ControlClient&& other) noexcept;
  ControlClient& operator=(ControlClient&& other) noexcept;
  ControlClient(const ControlClient&) = delete;
  ControlClient& operator=(const ControlClient&) = delete;
  ~ControlClient();  // closes the connection

  // Sends {"id":n,"op":op,...args} and waits for its reply (at most `timeout`, if given).
  // Returns the reply's "result" (null if absent); an error reply becomes kInvalidArgument
  // with the server's message; kUnavailable if the server closed the connection, kTimedOut.
  // Precondition: `args` is an object (or null) without "id" or "op". Events that arrive
  // meanwhile are queued for ReadEvent.
  Result<nlohmann::json> Call(const std::string& op,
                              const nlohmann::json& args = nlohmann::json::object(),
                              std::optional<Duration> timeout = std::nullopt);

  // The next pushed event, {"event":topic,"data":...}: a queued one, else waits (at most
  // `timeout`, if given; Duration(0) only takes what has already arrived). kTimedOut when the
  // time ran out, kUnavailable when the server closed the connection.
  Result<nlohmann::json> ReadEvent(std::optional<Duration> timeout = std::nullopt);

  // Events received and not yet returned by ReadEvent.
  std::size_t queued_events() const { return events_.size(); }
  void DiscardQueuedEvents() { events_.clear(); }

  // The socket, to poll() for readability next to other fds; then ReadEvent(Duration(0)).
  int fd() const { return fd_; }

 private:
  explicit ControlClient(int fd) : fd_(fd) {}
  // Reads once (waiting at most `timeout`) and parses every complete line into events_ or
  // replies_. kTimedOut if nothing arrived in time, kUnavailable on end of stream or error.
  Status Receive(std::optional<Duration> timeout);
  Status SendAll(const std::string& data);

  int fd_ = -1;
  std::int64_t next_id_ = 1;
  std::string in_;  // bytes after the last complete line
  std::deque<nlohmann::json> events_;
  std::map<std::int64_t, nlohmann::json> replies_;  // by id, until their Call takes them
};

// Client of the control socket on an event loop (ghostproxy): requests go out at once and may
// overlap; each reply is matched by id and handed to its callback on the loop, never inside
// Call. If the connection drops, every waiting callback gets kUnavailable and the next Call
// reconnects. Pushed events (after a "subscribe" call) go to the event handler, in the order
// they arrived relative to the replies; a subscription lasts only as long as its connection,
// which the disconnect handler reports.
class AsyncControlClient {
 public:
  using Done = std::function<void(Result<nlohmann::json>)>;
  using EventHandler = std::function<void(const nlohmann::json& event)>;

  // Connects now, so a wrong path fails at start with ControlClient::Connect's messages.
  // `base` is borrowed and must outlive the client.
  static Result<std::unique_ptr<AsyncControlClient>> Connect(event_base* base,
                                                             const std::string& path);
  ~AsyncControlClient();  // pending callbacks are dropped
  AsyncControlClient(const AsyncControlClient&) = delete;
  AsyncControlClient& operator=(const AsyncControlClient&) = delete;

  // Sends {"id":n,"op":op,...args}; `done` gets the reply's "result", an error reply as
  // kInvalidArgument with the server's message, or kUnavailable.
  void Call(const std::string& op, nlohmann::json args, Done done);
  std::size_t pending() const { return waiting_.size(); }

  // Receives every pushed event ({"event":topic,"data":...}) on the loop. Empty: ignored.
  void SetEventHandler(EventHandler handler) { on_event_ = std::move(handler); }
  // Runs when the connection drops (before the waiting callbacks fail): its subscriptions
  // are gone, and events may have been missed.
  void SetDisconnectHandler(std::function<void()> handler) { on_disconnect_ = std::move(handler); }
  // Counts connections made: a subscription answered on an older one no longer holds.
  std::uint64_t connection_serial() const { return connection_serial_; }

 private:
  struct BevDeleter {
    void operator()(bufferevent* b) const;
  };
  AsyncControlClient(event_base* base, std::string path);
  Status Open();
  void Defer(std::function<void()> fn);
  static void OnRead(bufferevent* bev, void* arg);
  static void OnEvent(bufferevent* bev, short what, void* arg);

  event_base* base_;
  std::string path_;
  std::unique_ptr<bufferevent, BevDeleter> bev_;
  std::int64_t next_id_ = 1;
  std::map<std::int64_t, Done> waiting_;
  EventHandler on_event_;
  std::function<void()> on_disconnect_;
  std::uint64_t connection_serial_ = 0;
};

}  // namespace ghost

#endif  // GHOST_COMMON_CONTROL_CONTROL_H_
