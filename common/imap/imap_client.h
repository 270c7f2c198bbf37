// ImapClient: the IMAP origin fetcher of the cache (DESIGN §4 common/ "origin fetchers", §4.1
// "an IMAP origin maps mailboxes to directories and messages to files"). A small asynchronous
// IMAP4rev1 client (RFC 3501) on the daemon's one libevent loop, over a bufferevent, with TLS
// (imaps://, and STARTTLS on imap://) through libevent's bufferevent_openssl.
//
// Why not libcurl, which the HTTP side uses: curl's IMAP support is one request per transfer
// (a URL names one mailbox operation), with no IDLE, so new mail could only be found by
// polling, which DESIGN §2 forbids; no pipelined APPEND with flags and an internal date; no
// UID STORE, MOVE or UID EXPUNGE except as opaque CUSTOMREQUESTs whose untagged answers
// (EXISTS, EXPUNGE, FETCH FLAGS, COPYUID) it does not parse; and no way to keep a selected
// mailbox and its sequence-number map across requests. The protocol needed here is small;
// a client that owns the connection can push every server event to the cache.
//
// Push, never poll: the client waits on its socket. The only timers are (a) the command
// timeout, armed only while a command is outstanding (or a connection is being set up) and
// re-armed whenever bytes arrive, so a stalled server fails the command after
// `command_timeout` of silence while a large body that keeps arriving never does; and (b)
// while in IDLE, one timer per `idle_refresh` (29 min by default, RFC 2177 §3: servers may
// drop a client idle for 30 min) that ends and restarts IDLE. An idle, IDLE-ing client makes
// no other wake-up.
//
// Connection life (state()):
//
//   kDisconnected ──Connect──▶ kConnecting ──greeting, [STARTTLS], LOGIN OK──▶ kReady
//        ▲                        │ (TCP, TLS handshake, greeting, CAPABILITY, STARTTLS,      │
//        │                        │  LOGIN: all inside kConnecting)                           │
//        └───── error / BYE / EOF / timeout / Close ◀──────────────────────────────────────────┤
//        └───── Logout's tagged OK ◀── kLoggingOut ◀──Logout───────────────────────────────────┘
//
//   state        | event                          | next          | callbacks
//   kDisconnected| Connect                        | kConnecting   | -
//   kConnecting  | LOGIN OK (+ capabilities)      | kReady        | Connect's done(OK)
//   kConnecting  | any failure                    | kDisconnected | done(error), queued commands
//                |                                |               | fail with the same error
//   kReady       | failure (see Errors)           | kDisconnected | every queued and outstanding
//                |                                |               | command fails; then the
//                |                                |               | disconnect handler
//   kReady       | Logout                         | kLoggingOut   | -
//   kLoggingOut  | tagged OK / EOF after BYE      | kDisconnected | Logout's done(OK)
//   any          | Close                          | kDisconnected | commands fail (kUnavailable)
//
// Commands may be called in any state; they are queued and sent once the client is kReady
// (in kDisconnected they fail on the next turn). Each gets a tag; its tagged answer is
// matched by tag; its callback runs exactly once, from the event loop, never inside the call.
// A command sent alone (see below) completes after everything issued before it and before
// everything issued after it; pipelined reads may complete in any order among themselves; a
// command refused before it is sent (bad arguments, not connected, a write to a read-only
// mailbox) fails on the next turn, ahead of the others.
//
// Pipelining (RFC 3501 §5.5): the client sends a command while others are outstanding only
// when the result cannot depend on them, because servers (dovecot among them) run pipelined
// commands concurrently — an APPEND and a FETCH sent together may see the mailbox before the
// APPEND. So commands fall into classes:
//   reads    FetchBody, FetchSummary, List, Noop   pipelined with each other (at most
//            one List and one FetchSummary outstanding: their untagged answers carry no tag)
//   appends  Append (server with LITERAL+)          pipelined with other appends
//   others   Select, Examine, UidStore, UidExpunge, UidMove, UidSearchHeader, Create, Delete,
//            Logout, Append
//            without LITERAL+ (it must wait for the server's "+")
//            sent alone: after everything before them completed, and nothing after them is
//            sent until they complete.
// At most `max_in_flight` commands are outstanding. Body fetches therefore go out back to
// back and arrive as one burst, which is what the energy model wants (DESIGN §3.3).
//
// IDLE (RFC 2177): StartIdle() asks the client to idle whenever it has nothing else to do in
// the selected mailbox. When a command is issued during IDLE the client sends DONE, waits for
// IDLE's tagged OK, runs the queued commands, and re-enters IDLE when the queue is empty. So
// callers never manage IDLE around their commands; they see a little latency (one round trip
// for DONE) on the first command after an idle period. StopIdle() ends it for good. Select
// and Examine keep the wish: IDLE resumes in the new mailbox.
//
// Mailbox events: untagged EXISTS, RECENT, EXPUNGE and unsolicited FETCH (flag changes) are
// pushed to the event handler whenever they arrive (in IDLE or in answer to any command),
// except those that are a command's own result (a Select's EXISTS, a FetchSummary's FETCH).
// The client keeps the selected mailbox's sequence-number -> UID map (filled by Select's
// EXISTS, FetchSummary, and FETCH answers carrying UID; shifted by EXPUNGE), so EXPUNGE events
// carry the UID when it is known.
//
// Message bodies stream: FetchBody passes a body literal to on_data chunk by chunk as it
// arrives (straight from the socket buffer, never copied into a string or scanned for line
// ends), so a body of many MiB costs no more memory than the socket buffer. Other literals
// (mailbox names, for instance) are kept, up to `max_buffered_literal`.
//
// Writes (UidStore, UidExpunge, UidMove) to a mailbox opened with Examine are refused with
// kReadOnly without being sent: dovecot, for one, answers OK to them and changes nothing.
//
// Errors (the Status given to callbacks):
//   kUnavailable      cannot connect (refused, unreachable, name not found); the server said
//                     BYE or closed the connection (also mid-literal); the client was closed
//   kTimedOut         no byte from the server for command_timeout while a command was
//                     outstanding, or connecting took longer than that
//   kCorruption       the server sent something that is not IMAP (garbage, a malformed
//                     response, an answer with an unknown tag, an oversized line or literal);
//                     the connection is dropped, since the stream cannot be trusted
//   kInvalidArgument  a bad URL, flag, UID set; LOGIN refused (wrong user or password);
//                     the server answered BAD
//   kNotFound         NO [NONEXISTENT] / [TRYCREATE]; a NO to Select/Examine without a more
//                     precise code; FetchBody of a UID that is not there
//   kExists           NO [ALREADYEXISTS]
//   kReadOnly         a write to a mailbox opened with Examine; NO [NOPERM]
//   kNotSupported     IDLE on a server without it; STARTTLS required but not offered
//   kIoError          any other NO; TLS failures; the receiver stopped a FetchBody
// After kUnavailable, kTimedOut or kCorruption the connection is gone and every other
// outstanding command fails with the same status; NO and BAD fail only their own command.
//
// Callbacks may call any method of the client (issue commands, Close); they must not destroy
// the client and must not throw: they are called from C callbacks of libevent, so an
// exception terminates the process (on_data's exceptions are caught and fail that FetchBody
// with kInternal).
//
// Thread-safety: not thread-safe. Construct, call, and destroy on the thread that runs the
// event loop; all callbacks run there.
#ifndef GHOST_COMMON_IMAP_IMAP_CLIENT_H_
#define GHOST_COMMON_IMAP_IMAP_CLIENT_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/imap/imap_client_internal.h"
#include "common/base/status.h"
#include "common/base/units.h"

struct event_base;  // libevent, kept out of the interface
struct event;
struct bufferevent;
struct evdns_base;
struct ssl_ctx_st;
struct timeval;

namespace ghost {

// How the client talks to its server; parsed once from the configuration, passed by const&.
struct ImapClientOptions {
  // A command (or connection set-up) fails with kTimedOut after this long without a byte
  // from the server. Zero disables the timeout.
  Duration command_timeout = Seconds(10);
  // STARTTLS on imap:// URLs: never; when the server offers it (the default: the password is
  // not sent in clear text to a server that can do better); or required (fail otherwise).
  enum class StartTls { kNever, kIfAvailable, kRequired };
  StartTls starttls = StartTls::kIfAvailable;
  // TLS trust: a CA bundle file and/or directory (empty: the system's defaults), and whether
  // to verify the server's certificate and name at all (only switch off for tests).
  std::string ca_file;
  std::string ca_path;
  bool verify_peer = true;
  // Commands outstanding at once (see "Pipelining").
  std::size_t max_in_flight = 16;
  // A response line longer than this (without its literals) is kCorruption.
  std::size_t max_line_bytes = 1 << 20;
  // A literal kept in memory (all but streamed bodies) longer than this is kCorruption.
  std::size_t max_buffered_literal = 64 << 20;
  // IDLE is ended and restarted after this long (RFC 2177 §3). Zero: never.
  Duration idle_refresh = Seconds(29 * 60);
};

// An IMAP URL (RFC 5092 server part): imap://[user@]host[:port]/[mailbox] or imaps://...
struct ImapUrl {
  bool implicit_tls = false;  // imaps://
  std::string host;           // without brackets for IPv6
  int port = 143;             // 143 for imap://, 993 for imaps:// unless given
  std::string user;           // percent-decoded; may be empty
  std::string mailbox;        // percent-decoded path without the leading '/'; may be empty
};
// Fails (kInvalidArgument, saying what is wrong) on anything else.
[[nodiscard]] Result<ImapUrl> ParseImapUrl(std::string_view url);

// Capability names, upper-case ("IMAP4REV1", "IDLE", "AUTH=PLAIN").
struct ImapCapabilities {
  std::set<std::string> names;
  bool Has(std::string_view name) const;  // case-insensitive
  bool idle() const { return Has("IDLE"); }
  bool uidplus() const { return Has("UIDPLUS"); }
  bool move() const { return Has("MOVE"); }
  bool literal_plus() const { return Has("LITERAL+"); }
  bool starttls() const { return Has("STARTTLS"); }
};

// One LIST answer.
struct MailboxInfo {
  std::string name;                     // the wire name (modified UTF-7; see maildir_names.h)
  char delimiter = '\0';                // hierarchy delimiter; '\0' for NIL (flat)
  std::vector<std::string> attributes;  // "\HasNoChildren", "\Noselect", "\Sent", ...
  bool HasAttribute(std::string_view a) const;  // case-insensitive
};

// What Select / Examine learned about the mailbox.
struct MailboxStatus {
  std::string name;
  std::uint32_t uidvalidity = 0;
  std::uint32_t uidnext = 0;  // 0 if the server did not say
  std::uint32_t exists = 0;
  std::uint32_t recent = 0;
  std::uint64_t highestmodseq = 0;           // 0 without CONDSTORE
  std::vector<std::string> flags;            // FLAGS
  std::vector<std::string> permanent_flags;  // PERMANENTFLAGS ("\*": new keywords allowed)
  bool read_only = false;                    // [READ-ONLY], and always for Examine
};

// One message from FetchSummary.
struct MessageSummary {
  std::uint32_t uid = 0;
  std::uint32_t seq = 0;  // its sequence number when fetched
  std::vector<std::string> flags;
  std::uint64_t size = 0;              // RFC822.SIZE
  std::string internaldate;            // as sent: "17-Jul-1996 02:44:25 -0700"
  std::int64_t internaldate_unix = 0;  // the same, seconds since the Unix epoch (0 if bad)
};

// APPENDUID (RFC 4315); zeros when the server has no UIDPLUS.
struct AppendResult {
  std::uint32_t uidvalidity = 0;
  std::uint32_t uid = 0;
};

// COPYUID (RFC 4315) of a move: source UID -> destination UID, and the destination's
// UIDVALIDITY; empty when the server did not say.
struct MoveResult {
  std::uint32_t uidvalidity = 0;
  std::vector<std::pair<std::uint32_t, std::uint32_t>> uids;
};

enum class StoreMode { kAdd, kRemove, kReplace };  // +FLAGS, -FLAGS, FLAGS

// An unsolicited change in the selected mailbox (see "Mailbox events").
struct MailboxEvent {
  enum class Kind {
    kExists,   // number = messages in the mailbox now
    kRecent,   // number = \Recent messages now
    kExpunge,  // number = the sequence number removed; uid if known
    kFetch,    // number = sequence number; uid if known; flags if sent
  };
  Kind kind = Kind::kExists;
  std::uint32_t number = 0;
  std::uint32_t uid = 0;  // 0 when unknown
  std::optional<std::vector<std::string>> flags;
};

class ImapClient {
 public:
  enum class State { kDisconnected, kConnecting, kReady, kLoggingOut };
  using StatusCallback = std::function<void(Status)>;
  template <typename T>
  using ResultCallback = std::function<void(Result<T>)>;
  // A chunk of a message body, borrowed for the call only. Return false to stop: the rest of
  // the body is skipped and on_done reports kIoError.
  using DataCallback = std::function<bool(std::string_view)>;

  // Borrows `base`; it must outlive the client. The loop is driven by its owner.
  ImapClient(event_base* base, const ImapClientOptions& options);
  // Drops the connection and frees every event without calling any callback. Must not run
  // inside one of the client's callbacks.
  ~ImapClient();
  ImapClient(const ImapClient&) = delete;
  ImapClient& operator=(const ImapClient&) = delete;

  // Connects to `url` (see ParseImapUrl), reads the greeting and capabilities, upgrades with
  // STARTTLS as the options say, and logs in as `user` (the URL's user when empty) with
  // `password`. done(OK) once logged in. Precondition: kDisconnected (else done fails with
  // kInternal).
  void Connect(std::string_view url, std::string user, std::string password, StatusCallback done);

  // LIST reference pattern (pattern "*": every mailbox).
  void List(std::string reference, std::string pattern,
            ResultCallback<std::vector<MailboxInfo>> done);
  // SELECT / EXAMINE `mailbox` (its wire name). On success it is the selected mailbox, and the
  // sequence-number map starts over; on failure no mailbox is selected (RFC 3501 §6.3.1).
  void Select(std::string mailbox, ResultCallback<MailboxStatus> done);
  void Examine(std::string mailbox, ResultCallback<MailboxStatus> done);
  // UID FETCH uid_set (UID FLAGS RFC822.SIZE INTERNALDATE): one summary per message, in the
  // order the server sent them. uid_set: "1:*", "7", "3,9:12" (see FetchSummaryRange).
  void FetchSummary(std::string uid_set, ResultCallback<std::vector<MessageSummary>> done);
  void FetchSummaryRange(std::uint32_t first, std::optional<std::uint32_t> last,
                         ResultCallback<std::vector<MessageSummary>> done);
  // UID FETCH uid (UID BODY.PEEK[]): the whole message, streamed to on_data (which is not
  // called for an empty message); does not set \Seen. on_done(kNotFound) if no message has
  // that UID.
  void FetchBody(std::uint32_t uid, DataCallback on_data, StatusCallback on_done);
  // APPEND mailbox (flags) "internaldate" {n}: stores `message` (RFC 5322, CRLF line ends).
  // internaldate in seconds since the Unix epoch; none: the server's clock.
  void Append(std::string mailbox, std::vector<std::string> flags,
              std::optional<std::int64_t> internaldate, std::string message,
              ResultCallback<AppendResult> done);
  // UID STORE uid_set +FLAGS.SILENT / -FLAGS.SILENT / FLAGS.SILENT (flags).
  void UidStore(std::string uid_set, StoreMode mode, std::vector<std::string> flags,
                StatusCallback done);
  // Removes the \Deleted messages in uid_set: UID EXPUNGE with UIDPLUS; without it a plain
  // EXPUNGE, which also removes every other \Deleted message in the mailbox.
  void UidExpunge(std::string uid_set, StatusCallback done);
  // Moves the messages to `destination`: UID MOVE with MOVE (RFC 6851); else UID COPY, UID
  // STORE +FLAGS.SILENT (\Deleted), then UidExpunge (one after the other, each after the
  // previous succeeded; a failure stops the sequence and is reported).
  void UidMove(std::string uid_set, std::string destination, ResultCallback<MoveResult> done);
  // UID COPY uid_set destination: copies the messages (flags and INTERNALDATE kept); the
  // result's uids are the server's COPYUID pairs (empty without UIDPLUS).
  void UidCopy(std::string uid_set, std::string destination, ResultCallback<MoveResult> done);
  // UID SEARCH HEADER field "value" in the selected mailbox: the UIDs of the messages whose
  // header `field` contains `value` (RFC 3501 §6.4.4: a substring match, case-insensitive),
  // in the server's order; empty when none. `field` must be a header name (letters, digits,
  // '-'), else kInvalidArgument. Sent alone (its answer depends on earlier writes).
  void UidSearchHeader(std::string field, std::string value,
                       ResultCallback<std::vector<std::uint32_t>> done);
  // UID SEARCH SINCE <day-1> BEFORE <day+2> in the selected mailbox, day being the UTC date of
  // `unix_seconds`: the UIDs of the messages whose INTERNALDATE lies within a day of it. RFC 3501
  // §6.4.4 compares dates "disregarding time and timezone", in whichever timezone the server
  // reckons the date; a day either side covers every timezone. A superset: the caller filters by
  // the exact INTERNALDATE (common/imap/find_appended.h). Sent alone.
  void UidSearchNearDate(std::int64_t unix_seconds, ResultCallback<std::vector<std::uint32_t>> done);
  void Create(std::string mailbox, StatusCallback done);
  void Delete(std::string mailbox, StatusCallback done);
  void Noop(StatusCallback done);
  // LOGOUT; done(OK) when the server has said goodbye and the connection is closed.
  void Logout(StatusCallback done);
  // Drops the connection now (no LOGOUT); every queued and outstanding command fails with
  // kUnavailable. The disconnect handler is not called. Safe inside callbacks.
  void Close();

  // Idle in the selected mailbox whenever nothing else is to be done (see "IDLE"). Fails with
  // kNotSupported if the server (once connected) lacks IDLE; takes effect once a mailbox is
  // selected.
  [[nodiscard]] Status StartIdle();
  void StopIdle();
  // True while the server has confirmed IDLE ("+ idling") and it has not been ended.
  bool idling() const;

  // Receives every MailboxEvent (see "Mailbox events"). May be empty.
  void SetEventHandler(std::function<void(const MailboxEvent&)> handler);
  // Called once when an established (kReady) connection is lost without Logout or Close,
  // after the commands' callbacks (e.g. to reconnect). May be empty.
  void SetDisconnectHandler(std::function<void(Status)> handler);

  State state() const { return state_; }
  const ImapCapabilities& capabilities() const { return caps_; }
  // The mailbox selected now, or "" (also while a Select is outstanding).
  const std::string& selected() const { return selected_; }
  // The UID of sequence number `seq` in the selected mailbox, 0 if unknown.
  std::uint32_t UidForSeq(std::uint32_t seq) const;
  // Commands issued and not completed (queued or outstanding); IDLE and the connection's own
  // set-up commands do not count.
  std::size_t pending() const;
  // Bytes received on the current connection (after TLS decryption).
  std::uint64_t bytes_received() const { return bytes_received_; }

 private:
  struct Command;
  enum class Phase {  // inside kConnecting
    kNone,
    kTcp,           // TCP connect
    kTlsHandshake,  // imaps://, or after STARTTLS's OK
    kGreeting,      // waiting for the server's greeting
    kCapability,    // CAPABILITY outstanding
    kStartTls,      // STARTTLS outstanding
    kLogin,         // LOGIN (or the CAPABILITY after it) outstanding
  };
  enum class IdleState { kOff, kStarting, kIdling, kStopping };
  enum class LiteralSink { kKeep, kStream, kSkip };
  // A callback due on the loop's next turn: a command's completion, or a plain function.
  struct Deferred {
    std::unique_ptr<Command> cmd;
    Status status;
    std::function<void()> fn;
  };

  // C entry points from libevent (see the header comment about exceptions).
  static void OnRead(bufferevent* bev, void* self) noexcept;
  static void OnEvent(bufferevent* bev, short what, void* self) noexcept;
  static void OnTimeout(int fd, short what, void* self) noexcept;
  static void OnIdleRefresh(int fd, short what, void* self) noexcept;
  static void OnDeferred(int fd, short what, void* self) noexcept;

  // Connection set-up.
  void StartTcp();
  Status StartTls();
  void OnConnected();
  void AfterGreeting();
  void SendCapability();
  void AfterCapabilities();
  void SendLogin();
  void BecomeReady();
  std::string ServerName() const;

  // Reading: lines and literals cut into segments, then whole responses dispatched.
  void ReadInput();
  bool ReadLiteralBytes(bufferevent* bev);
  void OnLine(std::string line);
  static bool IsStatusLine(std::string_view line);
  void BeginLiteral(std::uint64_t length);
  void DeliverBody(Command& cmd, std::string_view bytes);
  void HandleResponse(std::vector<imap::Segment> segments);
  void HandleTagged(const imap::Response& r);
  void HandleUntagged(const imap::Response& r);
  void HandleContinuation(const imap::Response& r);
  void HandleFetch(const imap::Response& r);
  void HandleStatusCode(const imap::Response& r, Command* cmd);
  Status StatusForTagged(const Command& cmd, const imap::Response& r) const;
  void Emit(const MailboxEvent& e);

  // Commands.
  void SelectOrExamine(std::string mailbox, bool examine, ResultCallback<MailboxStatus> done);
  void SimpleMailboxCommand(int kind, const char* verb, std::string mailbox, StatusCallback done);
  std::unique_ptr<Command> MakeExpunge(const std::string& uid_set, StatusCallback done);
  // UID SEARCH `label` (as logged); `build` writes the command; an `invalid` status fails it
  // on the next turn without sending.
  void UidSearch(std::string label, std::function<std::vector<std::string>(const ImapCapabilities&)> build,
                 Status invalid, ResultCallback<std::vector<std::uint32_t>> done);
  void Enqueue(std::unique_ptr<Command> cmd);
  bool CanSend(const Command& cmd) const;
  void Pump();
  void Send(std::unique_ptr<Command> cmd);
  void SendNextPart(Command& cmd);
  void StopIdleNow();
  void CompleteCommand(Command& cmd, Status status);
  Command* FindInFlight(int kind);
  const Command* FindInFlightConst(int kind) const;
  Command* FindBodyCommand(std::uint32_t uid);

  // Failure, teardown, timers, deferred callbacks.
  void OnConnectionEnd(short what);
  void Fail(Status status);  // drops the connection; every command fails with `status`
  void FailQueued(Status status);
  void Disconnect();
  void FailLater(std::unique_ptr<Command> cmd, Status status);
  void Defer(std::function<void()> fn);
  void ScheduleDeferred();
  void UpdateTimeout(bool activity);
  static timeval ToTimeval(Duration d);
  void AssertInvariants() const;  // aborts on a broken invariant (debug builds)

  event_base* base_;
  const ImapClientOptions options_;
  State state_ = State::kDisconnected;
  Phase phase_ = Phase::kNone;
  IdleState idle_state_ = IdleState::kOff;
  bool idle_wanted_ = false;

  // Connection (owned; null when disconnected).
  bufferevent* bev_ = nullptr;        // the socket, or the TLS filter over it (which owns it)
  std::vector<bufferevent*> doomed_;  // dropped while reading from them; freed after
  evdns_base* dns_ = nullptr;         // made on first use of a host name
  ssl_ctx_st* ssl_ctx_ = nullptr;     // made on first use of TLS
  bool tls_active_ = false;
  event* timeout_ev_ = nullptr;  // the command timeout, armed only while one is due
  bool timeout_armed_ = false;
  event* idle_refresh_ev_ = nullptr;  // armed only while in IDLE
  event* deferred_ev_ = nullptr;      // made active (never added) when deferred work waits
  bool deferred_scheduled_ = false;
  std::deque<Deferred> deferred_;

  ImapUrl url_;
  std::string user_;
  std::string password_;  // kept until LOGIN succeeded, then wiped
  StatusCallback connect_done_;
  ImapCapabilities caps_;
  bool login_caps_seen_ = false;
  std::string bye_text_;
  std::string selected_;
  bool selected_read_only_ = false;
  std::vector<std::uint32_t> uid_by_seq_;  // index seq-1; 0 = unknown

  // Response assembly.
  std::vector<imap::Segment> segments_;  // the response being read
  std::size_t scanned_ = 0;              // bytes of input already searched for a line end
  std::uint64_t literal_left_ = 0;       // bytes of the current literal still to come
  std::uint64_t literal_total_ = 0;
  LiteralSink literal_sink_ = LiteralSink::kKeep;
  Command* literal_cmd_ = nullptr;  // kStream target: an in-flight FetchBody
  std::uint64_t bytes_received_ = 0;
  int dispatch_depth_ = 0;  // > 0 while reading input: a dropped bufferevent is freed after

  // Commands: queued (not sent) and in flight (sent, awaiting the tagged answer), in order.
  std::deque<std::unique_ptr<Command>> queue_;
  std::deque<std::unique_ptr<Command>> in_flight_;
  std::uint64_t next_tag_ = 1;
  bool closing_by_user_ = false;

  std::function<void(const MailboxEvent&)> event_handler_;
  std::function<void(Status)> disconnect_handler_;
};

}  // namespace ghost

#endif  // GHOST_COMMON_IMAP_IMAP_CLIENT_H_
