// Control socket (DESIGN §4.2): how ghostctl, ghostproxy and scripts talk to the ghostfs daemon.
//
// A Unix stream socket (mode 0600; one per mount, found from the mount point: see "Where the
// socket is" below) speaking newline-delimited JSON. This file is the transport; the ops are
// defined in protocol.h. ControlServer frames, validates and routes requests to a handler the
// daemon supplies, and pushes subscription events; ControlClient is the blocking client for
// ghostctl and tests, AsyncControlClient the one on an event loop (ghostproxy).
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
//     arguments of the wrong type or range (protocol.h);
//   - a request line longer than 64 KiB (ControlServerOptions::max_request_line): error reply,
//     then the server reads nothing more and closes the connection once the reply is written.
//
// ---- Ops, arguments, results, topics ----
// Defined once in common/control/protocol.h. The server checks every request's arguments there
// (ParseControlArgs) and passes only well-formed requests, typed, to the handler, which
// implements the op (in ghostfs: fs/control_ops.cc); subscribe it answers itself.
//
// ---- Hostile input ----
// No line can stop the server: a line that is not JSON, numbers out of range (1e999), nesting
// deeper than kMaxRequestDepth, an "id" that is not a number, string, boolean or null
// (answered with a null id), wrong argument types: each gets one error reply and the
// connection stays usable. No exception leaves a libevent callback.
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
#include <vector>

#include "common/base/accept_pause.h"
#include "common/base/status.h"
#include "common/base/units.h"
#include "common/control/protocol.h"

// libevent and socket types, kept out of the interface.
struct bufferevent;
struct event_base;
struct evconnlistener;
struct sockaddr;

namespace ghost {

// Requests nested deeper than this (arrays and objects) are refused unparsed.
inline constexpr int kMaxRequestDepth = 32;

// ---- Where the socket is ----
// Every ghostfs has a control socket. Without --control it listens at MountControlPath(MNT),
// a path derived from the mount point alone, so ghostctl and ghostproxy find it from MNT:
//
//   RUNDIR/<name>-<h>.sock   name: the mount point's last component (at most 32 characters,
//                            other than [A-Za-z0-9._-] replaced by '_'), h: the first 16 hex
//                            digits of the SHA-256 of the mount point's real path
//   RUNDIR: /run/ghost for root; else $XDG_RUNTIME_DIR/ghost, or /tmp/ghost-UID without it
//
// e.g. /run/ghost/ghost-3fa2b1c0d9e8a7b6.sock for /mnt/ghost. The directory is created mode
// 0700, the socket is mode 0600. The real path is taken before the mount (ghostfs) or of the
// mounted root (clients); a mount point that cannot be resolved (a dead mount) is made
// absolute and normalised instead, which gives the same path unless it contains symlinks.

// The runtime directory above.
std::string ControlRunDir();
// The control socket of the ghostfs mounted (or to be mounted) at `mountpoint`.
std::string MountControlPath(const std::string& mountpoint);
// The mount points of every ghostfs mounted now (file system type fuse.ghost, from
// /proc/self/mountinfo), in mount order.
std::vector<std::string> GhostfsMounts();

// The socket a client (ghostctl, ghostproxy) should connect to, first match wins:
//   1. `control` (--control) if non-empty;
//   2. MountControlPath(`mountpoint`) (--mount) if non-empty;
//   3. $GHOST_CONTROL if set and non-empty;
//   4. the socket of the one ghostfs mounted now.
// kNotFound when none applies (no ghostfs mounted, or several: the message lists them and
// what was tried, and says to pass --mount or --control).
Result<std::string> FindControlPath(const std::string& control, const std::string& mountpoint);

struct ControlServerOptions {
  // A request line longer than this (without its newline) is refused and ends the connection.
  std::size_t max_request_line = 64 * 1024;
  // Requests are not read from a client while more output than this waits for it.
  std::size_t pause_reading_at = 256 * 1024;
  // A client whose waiting output passes this is disconnected (it is not reading).
  std::size_t high_watermark = 1024 * 1024;
  // Requests are not read from a client owed this many replies (0: no limit): a handler that
  // answers later to hold a producer back (ghostfs's stores while its fill backlog is full)
  // holds at most this many of its requests, and the client waits.
  std::size_t max_replies_owed = 256;
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
    // Replies {"ok":true,"result":<result_text>}: `result_text`, a JSON object's text as the
    // server would write it (LookupResult::ToJsonText), goes into the line as is.
    void Text(std::string_view result_text) const;
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

  // Runs on the server's thread for every well-formed request except subscribe: its op, its
  // checked arguments (protocol.h) and the whole object, which lives only for the call. An
  // exception thrown by the handler becomes an "internal error" reply (if it had not replied).
  using Handler = std::function<void(const ControlRequest& request, Reply reply)>;

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

  // Runs on the server's thread once for each connection that closes (the client hung up or
  // died, or the server dropped it), with the id its requests carried (ControlRequest::
  // connection); not when the server itself is destroyed. A client killed in the middle of
  // something it opened — a proxy's transfer, disclosed to the card's power policy — leaves
  // nobody to close it: the daemon closes it here. The handler must not destroy the server.
  void SetCloseHandler(std::function<void(std::uint64_t connection)> handler) {
    close_handler_ = std::move(handler);
  }

  const std::string& path() const { return path_; }
  std::size_t connections() const { return connections_.size(); }
  std::size_t subscribers(const std::string& topic) const;
  // Writes of replies and events to clients so far: the answers to requests that arrived
  // together (read in one batch) are written together, once the batch has been handled.
  std::uint64_t writes() const { return writes_; }

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

  void Accept(int fd, bool* owned);
  // The one function that moves a connection through its states (see control.cc).
  void Drive(Connection& c, ConnEvent ev);
  // Drive, for libevent's callbacks: an exception closes the connection instead of escaping.
  void DriveNoThrow(Connection& c, ConnEvent ev);
  void ReadRequests(Connection& c);
  // Pauses or resumes reading c's requests: paused while its output is backed up (until it
  // drains) or while it is owed max_replies_owed replies.
  void UpdateReading(Connection& c);
  void HandleLine(Connection& c, std::string_view line);
  void HandleRequest(Connection& c, std::string_view line);
  void Subscribe(Connection& c, const SubscribeArgs& args, const Reply& reply);
  // Sends `line` to `c`: held while c's requests are being read (FlushHeld writes them at the
  // end of the batch), else written now.
  void Send(Connection& c, const std::string& line);
  void FlushHeld(Connection& c);
  void Write(Connection& c, const std::string& line);
  // What one connection may hold before writing: a batch of large answers is not all in RAM.
  static constexpr std::size_t kMaxHeldBytes = 64 * 1024;
  void Close(Connection& c);

  event_base* base_;
  std::string path_;
  Handler handler_;
  ControlServerOptions options_;
  struct ListenerDeleter {
    void operator()(evconnlistener* l) const;
  };
  std::unique_ptr<evconnlistener, ListenerDeleter> listener_;
  // Out of descriptors: accepting pauses until a connection closes or 100 ms pass. It paused only
  // while it had connections: a ghostctl or ghostproxy connecting to a daemon with none and no
  // descriptor left made it spin (round 20, helper adv20).
  std::unique_ptr<AcceptPause> accept_pause_;
  dev_t socket_dev_ = 0;   // identity of our socket file, so we unlink only our own
  ino_t socket_ino_ = 0;
  std::uint64_t next_conn_ = 1;
  std::map<std::uint64_t, std::shared_ptr<Connection>> connections_;
  std::uint64_t writes_ = 0;
  std::function<void(std::uint64_t)> close_handler_;
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
  Result<nlohmann::json> Call(ControlOp op, const nlohmann::json& args = nlohmann::json::object(),
                              std::optional<Duration> timeout = std::nullopt);
  // The same with the op's name as text (scripts and tests send names that are no op).
  Result<nlohmann::json> Call(std::string_view op,
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
  void Call(ControlOp op, nlohmann::json args, Done done);
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
  void ReadReplies(bufferevent* bev);
  void Disconnected();

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
