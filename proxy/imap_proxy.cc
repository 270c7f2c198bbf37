// The IMAP proxy: one Session per client, relaying to one server connection. See
// proxy/imap_proxy.h.
//
// A session's client side, in the order a client line meets it:
//
//   await_ == kAuthData ──▶ SASL data (PLAIN: the user name is read, the password is not kept)
//   await_ == kIdleDone ──▶ "DONE" ends IDLE
//   a command ──▶ COMPRESS/STARTTLS refused here; a cacheable body FETCH answered from the cache
//                 (busy_: no further client input is read until it is complete); anything else
//                 recorded in pending_ by tag and sent to the server
//
// The server side: responses tagged with the proxy's own tags (kOwnTagPrefix) are consumed;
// every other byte goes to the client, capabilities filtered, whole bodies teed into a fill.
#include "proxy/imap_proxy.h"

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/bufferevent_ssl.h>
#include <event2/event.h>
#include <event2/listener.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <openssl/evp.h>
#include <openssl/err.h>
#include <openssl/rand.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <strings.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <functional>
#include <map>
#include <set>

#include "common/base/accept_pause.h"
#include "common/base/clock.h"
#include "common/imap/imap_client.h"
#include "common/imap/imap_client_internal.h"
#include "proxy/imap_deferred.h"
#include "proxy/imap_wire.h"

namespace ghost {

namespace {

constexpr char kOwnTagPrefix[] = "ghostp";
constexpr std::size_t kMaxMapUids = 4'000'000;

timeval ToTimeval(Duration d) {
  auto us = std::chrono::duration_cast<std::chrono::microseconds>(d).count();
  return timeval{static_cast<time_t>(us / 1'000'000), static_cast<suseconds_t>(us % 1'000'000)};
}

std::string OpenSslErrorText() {
  unsigned long e = ERR_get_error();
  ERR_clear_error();
  char buf[256] = "out of memory";
  if (e) ERR_error_string_n(e, buf, sizeof buf);
  return buf;
}

std::string NormalizeMailbox(std::string box) {
  if (strcasecmp(box.c_str(), "INBOX") == 0) return "INBOX";
  return box;
}

}  // namespace

class ImapSession;

class ImapProxy::Impl {
 public:
  event_base* base = nullptr;
  CacheBackend* backend = nullptr;
  MailProxyOptions options;
  ImapUrl origin;
  std::string origin_text;  // scheme://HOST:PORT/ with the path the user gave
  ListenAddress bound;
  evconnlistener* listener = nullptr;
  SSL_CTX* ssl_ctx = nullptr;
  // TLS toward clients (tls_cert/tls_key): the server context, the implicit-TLS listener, and
  // whether logins are taken before STARTTLS on the plain listener (a loopback address).
  SSL_CTX* server_ctx = nullptr;
  evconnlistener* tls_listener = nullptr;
  std::optional<ListenAddress> tls_bound;
  bool plain_login_ok = true;
  ImapProxyStats stats;
  std::map<ImapSession*, std::shared_ptr<ImapSession>> sessions;
  // With imap_journal: the deferred changes, on a clock of the loop.
  std::unique_ptr<RealClock> clock;
  std::unique_ptr<ImapDeferred> deferred;
  // For the backend's answers that outlive the session that asked (a fill): expires first thing
  // in ~Impl.
  std::shared_ptr<bool> alive = std::make_shared<bool>(true);

  // Offline service (the server unreachable): what sessions knew, in RAM only. Logins the
  // server accepted, as salted SHA-256 digests (never the password), and each (user, mailbox)'s
  // last UID map and flags.
  struct Snapshot {
    std::uint32_t uidvalidity = 0;
    std::vector<std::uint32_t> uids;
    std::map<std::uint32_t, std::vector<std::string>> flags;
  };
  std::map<std::string, Snapshot> snapshots;  // by user + "\n" + mailbox
  std::map<std::string, std::string> logins;  // user -> digest
  std::string salt = [] {
    std::string s(16, '\0');
    RAND_bytes(reinterpret_cast<unsigned char*>(s.data()), static_cast<int>(s.size()));
    return s;
  }();
  std::string Digest(const std::string& user, const std::string& password) const {
    std::string in = salt + user + std::string(1, '\0') + password;
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int len = 0;
    EVP_Digest(in.data(), in.size(), md, &len, EVP_sha256(), nullptr);
    std::fill(in.begin(), in.end(), '\0');
    return std::string(reinterpret_cast<char*>(md), len);
  }

  // Stores a whole message under `key` unless it is cached already (a fill from the server, or
  // a deferred APPEND once the server gave its UID).
  void StoreBody(const std::string& key, std::shared_ptr<std::string> data);

  // Out of descriptors, the listeners pause instead of spinning (common/base/accept_pause.h).
  std::unique_ptr<AcceptPause> accept_pause;

  ~Impl();
  static void OnAccept(evconnlistener*, evutil_socket_t fd, sockaddr*, int, void* arg);
  static void OnAcceptTls(evconnlistener*, evutil_socket_t fd, sockaddr*, int, void* arg);
  static void OnAcceptError(evconnlistener* l, void* arg) {
    static_cast<Impl*>(arg)->accept_pause->Failed(l);
  }
  void Accept(evutil_socket_t fd, bool implicit_tls);
  void Remove(ImapSession* s) {
    // Deferred: the session may be inside its own callback.
    auto it = sessions.find(s);
    if (it == sessions.end()) return;
    std::shared_ptr<ImapSession> keep = it->second;
    sessions.erase(it);
    if (accept_pause) accept_pause->Resume();  // a slot frees on the next turn (else it pauses again)
    RunSoon(base, [keep = std::move(keep)]() mutable { keep.reset(); });
  }
  // The prefix of every body key for `user` (MailTree::BodyKey's mo.url).
  std::string KeyPrefix(const std::string& user) const {
    std::size_t scheme = origin_text.find("://");
    return origin_text.substr(0, scheme + 3) + user + "@" + origin_text.substr(scheme + 3);
  }
};

class ImapSession : public std::enable_shared_from_this<ImapSession> {
 public:
  // `implicit_tls`: the client connected to the IMAPS listener; the TLS handshake comes first.
  ImapSession(ImapProxy::Impl* owner, evutil_socket_t fd, bool implicit_tls)
      : owner_(owner),
        cframer_({owner->options.client_max_line, owner->options.max_literal}),
        sframer_({owner->options.server_max_line, owner->options.max_literal}) {
    if (implicit_tls) {
      client_ = TlsClient(fd);
    } else {
      client_ = bufferevent_socket_new(owner->base, fd, BEV_OPT_CLOSE_ON_FREE);
    }
  }
  ~ImapSession() {
    if (fill_writer_) fill_writer_->Abort();
    for (auto& [tag, p] : pending_) {
      if (p.transfer) owner_->backend->TransferEnd(p.transfer, p.bytes);
    }
    if (client_) bufferevent_free(client_);
    if (server_) bufferevent_free(server_);
  }

  void Start();
  bool has_client() const { return client_ != nullptr; }

 private:
  enum class Await { kNone, kAuthData, kIdleDone };
  enum class Kind { kOther, kLogin, kAuth, kSelect, kClose, kIdle, kFetch, kAppend };
  struct Pending {
    Kind kind = Kind::kOther;
    std::string arg;  // kLogin/kAuth: the user; kSelect: the mailbox
    std::string secret;  // kLogin/kAuth: the password, for the deferred changes (RAM only)
    std::uint64_t transfer = 0;
    Bytes bytes = 0;
    // kFetch forwarded to the server: the emulated card has been given the body's size
    // (TransferData, at the first literal of the answer) and is still carrying it; kAppend
    // sent to the server: the message's size (TransferUpload, as the command goes out).
    bool charged = false;
    bool charging = false;
    int search = 0;  // SEARCH 1, UID SEARCH 2: its untagged SEARCH is translated (hidden_)
  };
  enum class Own { kMapRefresh, kSeen, kSync, kQuiet };

  static void OnClientRead(bufferevent*, void* arg) { static_cast<ImapSession*>(arg)->ProcessClient(); }
  static void OnServerRead(bufferevent*, void* arg) { static_cast<ImapSession*>(arg)->ProcessServer(); }
  static void OnClientWrite(bufferevent*, void* arg) { static_cast<ImapSession*>(arg)->ClientDrained(); }
  static void OnServerWrite(bufferevent*, void* arg) { static_cast<ImapSession*>(arg)->ServerDrained(); }
  static void OnClientEvent(bufferevent*, short what, void* arg) {
    static_cast<ImapSession*>(arg)->ClientEvent(what);
  }
  static void OnServerEvent(bufferevent*, short what, void* arg) {
    static_cast<ImapSession*>(arg)->ServerEvent(what);
  }

  void ClientEvent(short what);
  void ServerEvent(short what);
  // A bufferevent doing the server side of TLS on `fd` (owned: closed with it).
  bufferevent* TlsClient(evutil_socket_t fd) {
    tls_ = true;
    SSL* ssl = SSL_new(owner_->server_ctx);
    bufferevent* bev = bufferevent_openssl_socket_new(owner_->base, fd, ssl, BUFFEREVENT_SSL_ACCEPTING,
                                                      BEV_OPT_CLOSE_ON_FREE);
    if (bev) bufferevent_openssl_set_allow_dirty_shutdown(bev, 1);
    return bev;
  }
  // STARTTLS (RFC 3501 §6.2.1): answered once nothing else is outstanding; the client's socket
  // changes to TLS once the OK is written (SwitchToTls).
  void StartTls(const std::string& tag);
  void SwitchToTls();
  // Logins wait for STARTTLS: a certificate is configured, this session is plain, and the
  // listener is not on a loopback address.
  bool LoginDisabled() const { return !tls_ && owner_->server_ctx && !owner_->plain_login_ok; }
  // The capability list the client sees: the server's, filtered, with the proxy's TLS words.
  std::string Caps(std::string_view line) const {
    return imapwire::TlsCapabilities(imapwire::FilterCapabilities(line),
                                     !tls_ && owner_->server_ctx && !logged_in_, LoginDisabled());
  }
  void ClientDrained();
  void ServerDrained();
  void ProcessClient();
  void ProcessServer();
  void HandleClientEvent(const imapwire::Event& ev);
  // The server could not be reached: the proxy greets the client itself and serves what it has
  // (see HandleOffline).
  void GoOffline();
  void HandleOffline(std::string_view line);
  void OfflineLogin(const std::string& tag, const std::optional<std::string>& user,
                    const std::optional<std::string>& password);
  void Unavailable(const std::string& tag, const std::string& what);
  // Keeps the selected mailbox's map and flags for offline sessions.
  void SaveSnapshot();
  void HandleServerEvent(const imapwire::Event& ev);
  // Returns true when the command was handled here (not to be sent on).
  bool HandleClientCommand(std::string_view line, bool allow_cache = true);
  bool TryCacheFetch(const imapwire::Command& cmd, const imapwire::BodyFetch& f, std::string line);
  // A command the proxy answers or holds: a deferred UID STORE, a FETCH from the cache, or a
  // command that must wait for the queued changes to be sent first. True when taken here.
  bool HandleLocally(const imapwire::Command& cmd, const std::string& line);
  bool TryDeferStore(const imapwire::Command& cmd, const std::string& line);
  // COPY / UID COPY to another mailbox: queued, one operation per message, answered OK (no
  // COPYUID: the server has not assigned the UIDs yet).
  bool TryDeferCopy(const imapwire::Command& cmd, const std::string& line);
  // EXPUNGE, UID EXPUNGE, CLOSE (of the \Deleted messages whose flags the client was told)
  // and MOVE/UID MOVE to another mailbox: queued, one operation per message; the client gets
  // its untagged EXPUNGEs at once and the messages join hidden_.
  bool TryDeferExpunge(const imapwire::Command& cmd, const std::string& line);
  // While hidden_ is not empty: a command the proxy can pass on with its sequence numbers
  // translated, or one that must wait for the queue (and the server's EXPUNGEs). True when
  // taken here.
  bool HandleWithHidden(const imapwire::Command& cmd, const std::string& line);
  // The selected mailbox's UIDs as the client sees them (uids_ without hidden_).
  std::vector<std::uint32_t> ClientView() const;
  bool IsHidden(std::uint32_t uid) const {
    return std::any_of(hidden_.begin(), hidden_.end(), [uid](const auto& h) { return h.second == uid; });
  }
  // Server sequence number -> the client's (0 when the message is hidden), and back.
  std::uint32_t ToClientSeq(std::uint32_t server_seq) const;
  std::uint32_t ToServerSeq(std::uint32_t client_seq) const;
  // The client's sequence number of a UID in uids_ (0 when unknown or hidden).
  std::uint32_t ClientSeqOfUid(std::uint32_t uid) const;
  // A server's untagged response with hidden_ not empty: translated, or "" to drop it.
  std::optional<std::string> TranslateUntagged(std::string_view line);
  // Reads the map first when it is not known (the command waits); true when it started that.
  bool RefreshMapFirst(const std::string& line);
  // Sends the map refresh (UID SEARCH RETURN (ALL) ALL) under a tag of the proxy's own.
  void SendMapRefresh();
  // An untagged EXISTS, EXPUNGE or VANISHED after the map refresh's answer: applied to it, or
  // marks it stale.
  void NoteAfterMap(std::string_view line);
  // APPEND (one message, to a mailbox other than the selected one, at most
  // max_deferred_append bytes): its literal is read here (the proxy says "+" to a synchronizing
  // one), journaled whole, and answered OK without APPENDUID. True when taken (the literal and
  // the rest of the command then come here).
  bool TryDeferAppend(const imapwire::Command& cmd);
  // The rest of a deferred APPEND's command after its literal: must be the line end alone.
  void FinishAppend(std::string_view segment);
  // Whether `cmd`'s answer depends on changes still queued for this user.
  bool NeedsQueueFirst(const imapwire::Command& cmd) const;
  bool HasQueued(const std::string& mailbox) const;
  // A queued change of this user in `mailbox` that adds or removes \Deleted (or is not a STORE).
  bool HasQueuedDeleted(const std::string& mailbox) const;
  // Holds `line` until the queue has been sent (or could not be), then sends it on.
  void ForwardAfterQueue(std::string line);
  // Applies the queued flag changes to an untagged FETCH FLAGS from the server; remembers them.
  std::string OverlayFlags(std::string_view line);
  // Runs `fn` on a later turn of the loop, unless the session is gone by then.
  void Later(std::function<void()> fn);
  // Whether a change of this session goes to the queue now.
  bool Defers() const { return DefersUnselected() && Selected(); }
  bool DefersUnselected() const {
    ImapDeferred* d = owner_->deferred.get();
    return d && (d->ShouldDefer() || offline_) && !user_.empty() && d->CanSendFor(user_);
  }
  void ServeFromCache(std::string tag, std::string name, imapwire::BodyFetch f, std::uint32_t uid,
                      std::uint32_t seq, std::string key, std::string line);
  void StreamSlice();
  void FinishCacheAnswer();
  // Sends a FETCH the proxy does not answer to the server after all (recorded, disclosed).
  void ForwardFetch(const std::string& line);
  void ForwardLine(std::string_view line);
  void SendOwn(Own what, const std::string& command);
  void ServerTagged(std::string_view line);
  // A forwarded body FETCH's answer announced a literal of `bytes`: the emulated card carries
  // them (CacheBackend::TransferData), and the FETCH's tagged answer waits until it has, so the
  // client's last byte waits for both the real bytes and the card's modelled transfer, as an
  // HTTP fetch's does (DESIGN §4.3, §7.2).
  void ChargeFetch(std::uint64_t bytes);
  // Has the card carry `bytes` for the pending command `tag` (its transfer, once).
  void ChargeTransfer(const std::string& tag, std::uint64_t bytes, bool upload);
  void Charged(const std::string& tag);
  // Remembers what the server can do (ESEARCH: the map refresh) from a capability list.
  void NoteCapabilities(std::string_view line);
  void StartFill(const imapwire::BodyPrefix& p);
  void EndFill();
  void ArmTimeouts();
  void UpdateFlow();
  void ToClient(std::string_view s) {
    if (client_) bufferevent_write(client_, s.data(), s.size());
  }
  void ToServer(std::string_view s) {
    if (server_) bufferevent_write(server_, s.data(), s.size());
  }
  // Says `why` to the client (a line, already framed), then closes once it is written.
  void Close(const std::string& why);
  void Linger();
  bool Selected() const { return !selected_.empty() && uidvalidity_ != 0; }
  // A tagged answer held until the card has carried its FETCH's body (ChargeFetch); the
  // server's input is not read meanwhile, so nothing after it reaches the client first.
  std::string held_tagged_, held_tag_;
  bool holding_ = false;
  // The key of a body fetch forwarded although cached (the cost model chose the network).
  std::string forwarded_cached_key_;
  std::string KeyFor(std::uint32_t uid) const {
    return owner_->KeyPrefix(user_) + selected_ + ";UIDVALIDITY=" + std::to_string(uidvalidity_) +
           ";UID=" + std::to_string(uid);
  }

  ImapProxy::Impl* owner_;
  bufferevent* client_ = nullptr;
  bufferevent* server_ = nullptr;
  imapwire::Framer cframer_, sframer_;
  bool closing_ = false;
  bool connected_ = false;
  bool offline_ = false;
  bool tls_ = false;               // the client side is TLS (implicit, or after STARTTLS)
  bool tls_up_ = false;            // ... and its handshake is done
  bool starttls_pending_ = false;  // STARTTLS answered; the socket turns TLS once that is out
  bool logged_in_ = false;         // a login succeeded (STARTTLS is no longer possible)
  // The server side before the client is served (an imap:// origin with STARTTLS possible):
  //   kTcp ──connected──▶ kGreeting ──caps without STARTTLS──▶ kRelay (plain)
  //                          │ no caps: CAPABILITY ▶ kCapability ─┘  │ STARTTLS offered
  //                          ▼                                        ▼
  //                        kRelay ◀──handshake done── kTlsHandshake ◀── kStartTls (OK)
  // kRelay: the normal relay (imaps:// and "never" go straight there at connect).
  enum class Upstream { kTcp, kGreeting, kCapability, kStartTls, kTlsHandshake, kRelay };
  Upstream upstream_ = Upstream::kTcp;
  std::string upstream_greeting_;  // the server's greeting line, for the client after TLS
  std::string upstream_caps_;      // the server's CAPABILITY lines (kCapability)
  bool upstream_clear_ = true;     // the server connection is not encrypted
  bool upstream_loopback_ = false; // ... and its peer is a loopback address
  // Reads the server's lines during negotiation (kGreeting .. kStartTls).
  void NegotiateUpstream();
  void UpstreamCaps(std::string_view caps);
  // The server connection is ready for the client (after STARTTLS, or plain): the client is
  // served, its greeting first (`greeting`, prepended to the server's input).
  void UpstreamReady(const std::string& greeting);
  void UpstreamFailed(const std::string& why);
  // LOGIN/AUTHENTICATE would send a password in clear to a server off this machine.
  bool ClearLoginRefused() const {
    return upstream_clear_ && !upstream_loopback_ && !owner_->options.origin_plain_login;
  }

  // Client side.
  Await await_ = Await::kNone;
  std::string await_tag_;
  std::map<std::string, Pending> pending_;  // the client's commands sent to the server
  bool busy_ = false;                       // a command is being answered here
  std::string client_tag_;                  // of the command whose segments are arriving
  // A deferred APPEND whose literal is arriving (TryDeferAppend).
  struct AppendCapture {
    std::string tag, mailbox, body;
    std::vector<std::string> flags;
    std::int64_t date = 0;
    std::uint64_t size = 0;
  };
  std::optional<AppendCapture> append_;
  bool client_dropping_ = false;            // the current client command is not sent on

  // The session's mailbox view.
  std::string user_;      // empty until a login succeeded (and known)
  std::string selected_;  // the mailbox's wire name
  std::uint32_t uidvalidity_ = 0, pending_uidvalidity_ = 0;
  std::vector<std::uint32_t> uids_;  // seq - 1 -> UID, when map_valid_
  bool map_valid_ = false;
  bool esearch_ = false;
  // UID -> flags as the client was last told (server's, with the queued changes applied).
  std::map<std::uint32_t, std::vector<std::string>> flags_;
  // flags_ of the mailbox a SELECT/EXAMINE of the same mailbox left, until its answer.
  std::map<std::uint32_t, std::vector<std::string>> reselect_flags_;
  std::string reselect_mailbox_;
  std::uint32_t reselect_uidvalidity_ = 0;
  // Messages the client was told are expunged whose removal waits in the queue (deferred
  // EXPUNGE/MOVE): (server sequence number, UID), ascending. Each leaves when the server reports
  // its EXPUNGE; until then sequence numbers differ between the client's view and the server's.
  std::vector<std::pair<std::uint32_t, std::uint32_t>> hidden_;
  std::optional<std::uint32_t> server_exists_;  // the server's last EXISTS, kept with EXPUNGE

  // Server side.
  std::map<std::string, Own> own_;  // the proxy's own commands by tag
  std::uint64_t own_counter_ = 0;
  bool server_dropping_ = false;  // the current server response is the proxy's own
  std::string map_tag_;           // the outstanding map refresh
  std::string deferred_line_;     // a client command waiting for the map
  std::string after_sync_line_;   // a client command waiting for the proxy's NOOP
  // The outstanding refresh's answer (its ESEARCH), kept up to date with the EXPUNGEs after it;
  // stale when an EXISTS after it announced messages it does not hold (dovecot answers from the
  // view of the last sync and announces what arrived since at the command's end).
  std::optional<std::vector<std::uint32_t>> map_result_;
  bool map_stale_ = false;
  bool map_retried_ = false;  // the command waiting for the map had it read a second time

  // A body being teed from the server into the cache.
  std::string fill_key_;
  std::string fill_data_;
  std::uint64_t fill_expected_ = 0;
  bool filling_ = false;
  std::unique_ptr<CacheWriter> fill_writer_;

  // An answer from the cache in progress.
  struct CacheAnswer {
    std::string tag, name, key;
    imapwire::BodyFetch fetch;
    std::uint32_t uid = 0, seq = 0;
    Bytes size = 0, offset = 0;  // the literal's size; the next byte of the body to send
    Bytes end = 0;               // the body's byte after the last one to send
    std::shared_ptr<const void> body;
    bool reading = false;
  };
  std::optional<CacheAnswer> answer_;
  // Answers a section fetch from the whole `message`, or forwards `line` when the section
  // cannot be located for certain (imap_section.h).
  void AnswerSection(CacheAnswer a, std::string_view message, const std::string& line);
};

void ImapSession::Start() {
  ImapProxy::Impl* o = owner_;
  bufferevent_setcb(client_, &OnClientRead, &OnClientWrite, &OnClientEvent, this);
  bufferevent_setwatermark(client_, EV_WRITE, o->options.high_watermark / 2, 0);
  if (o->origin.implicit_tls) {
    SSL* ssl = SSL_new(o->ssl_ctx);
    SSL_set_tlsext_host_name(ssl, o->origin.host.c_str());
    SSL_set1_host(ssl, o->origin.host.c_str());
    server_ = bufferevent_openssl_socket_new(o->base, -1, ssl, BUFFEREVENT_SSL_CONNECTING,
                                             BEV_OPT_CLOSE_ON_FREE);
  } else {
    server_ = bufferevent_socket_new(o->base, -1, BEV_OPT_CLOSE_ON_FREE);
  }
  bufferevent_setcb(server_, &OnServerRead, &OnServerWrite, &OnServerEvent, this);
  bufferevent_setwatermark(server_, EV_WRITE, o->options.high_watermark / 2, 0);
  timeval tv = ToTimeval(o->options.timeout);
  bufferevent_set_timeouts(server_, &tv, nullptr);  // the connection and the greeting
  const int r = bufferevent_socket_connect_hostname(server_, nullptr, AF_UNSPEC, o->origin.host.c_str(),
                                                    o->origin.port);
  // A connect that fails at once (no route: ENETUNREACH offline; no descriptor: EMFILE) runs
  // ServerEvent inside the call: the session has gone offline (server_ freed) or closed. Going
  // on enabled a freed, null server_: ghostproxy died of SIGSEGV at each IMAP client while the
  // network was down (round 20, helper adv20).
  if (!server_ || closing_) return;
  if (r != 0) return Close("* BYE Ghost: cannot connect to the IMAP server " + o->origin_text + "\r\n");
  upstream_clear_ = !o->origin.implicit_tls;
  // The client's bytes wait in the kernel until the server is there.
  bufferevent_enable(server_, EV_READ | EV_WRITE);
}

void ImapSession::Close(const std::string& why) {
  if (closing_) return;
  SaveSnapshot();
  closing_ = true;
  if (server_) {
    bufferevent_free(server_);
    server_ = nullptr;
  }
  if (fill_writer_) {
    fill_writer_->Abort();
    fill_writer_.reset();
  }
  if (!client_) return owner_->Remove(this);
  bufferevent_disable(client_, EV_READ);
  bufferevent_setwatermark(client_, EV_WRITE, 0, 0);
  if (!why.empty()) ToClient(why);
  if (evbuffer_get_length(bufferevent_get_output(client_)) == 0) return Linger();
  timeval tv = ToTimeval(owner_->options.timeout);
  bufferevent_set_timeouts(client_, nullptr, &tv);
  bufferevent_enable(client_, EV_WRITE);
}

void ImapSession::Linger() {
  // The last words are out: half-close, and drop what the client still sends until it closes,
  // so the close is a FIN, not a reset that could destroy those words before they are read.
  shutdown(bufferevent_getfd(client_), SHUT_WR);
  timeval tv = ToTimeval(std::chrono::seconds(5));
  bufferevent_set_timeouts(client_, &tv, nullptr);
  bufferevent_enable(client_, EV_READ);
}

void ImapSession::ClientEvent(short what) {
  if (what & BEV_EVENT_CONNECTED) {  // the TLS handshake with the client is done
    tls_up_ = true;
    ++owner_->stats.tls_sessions;
    return;
  }
  if (tls_ && !tls_up_) {
    ++owner_->stats.tls_failures;
    unsigned long e = bufferevent_get_openssl_error(client_);
    std::fprintf(stderr, "ghostproxy: imap: a client's TLS handshake failed: %s\n",
                 e ? ERR_reason_error_string(e) ? ERR_reason_error_string(e) : "unknown error"
                   : (what & BEV_EVENT_EOF) ? "it closed the connection" : "connection error");
  }
  // EOF, an error or a timeout: the client is gone or stalled (or our last words were cut).
  if (!closing_ && (what & BEV_EVENT_TIMEOUT)) ++owner_->stats.client_errors;
  bufferevent_free(client_);
  client_ = nullptr;
  if (closing_) return owner_->Remove(this);
  Close("");
}

void ImapSession::ServerEvent(short what) {
  if ((what & BEV_EVENT_CONNECTED) && upstream_ == Upstream::kTlsHandshake) {
    // STARTTLS's handshake is done: the client is served, greeted without the capabilities
    // the server had before TLS (RFC 3501 §6.2.1: they are forgotten).
    upstream_clear_ = false;
    ++owner_->stats.origin_tls;
    return UpstreamReady(imapwire::GreetingWithoutCapabilities(upstream_greeting_));
  }
  if (what & BEV_EVENT_CONNECTED) {
    int one = 1;
    evutil_socket_t fd = bufferevent_getfd(server_);
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    sockaddr_storage peer{};
    socklen_t plen = sizeof peer;
    if (getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &plen) == 0) {
      Result<IpAddress> a = IpAddress::FromSockaddr(reinterpret_cast<sockaddr*>(&peer), plen);
      upstream_loopback_ = a.ok() && a->IsLoopback();
    }
    if (!owner_->origin.implicit_tls &&
        owner_->options.origin_starttls != MailProxyOptions::OriginStartTls::kNever) {
      upstream_ = Upstream::kGreeting;  // the client waits until the server side is settled
      // (The greeting may have been read before the connection was reported.)
      return NegotiateUpstream();
    }
    upstream_ = Upstream::kRelay;
    connected_ = true;
    bufferevent_enable(client_, EV_READ | EV_WRITE);
    if (evbuffer_get_length(bufferevent_get_input(server_)) > 0) ProcessServer();
    ArmTimeouts();
    return;
  }
  std::string why;
  if (upstream_ == Upstream::kStartTls || upstream_ == Upstream::kTlsHandshake) {
    unsigned long e = bufferevent_get_openssl_error(server_);
    const char* reason = e ? ERR_reason_error_string(e) : nullptr;
    return UpstreamFailed(std::string("STARTTLS failed: ") +
                          (reason ? reason : (what & BEV_EVENT_TIMEOUT) ? "the server stopped answering"
                                             : (what & BEV_EVENT_EOF) ? "the server closed the connection"
                                                                      : "connection error") +
                          (reason && std::string_view(reason).find("certificate") != std::string_view::npos
                               ? " (trust the CA that signed the server's certificate: SSL_CERT_FILE)"
                               : ""));
  }
  if (!connected_) return GoOffline();  // refused, unreachable, or silent for `timeout`
  if (!(what & BEV_EVENT_TIMEOUT) && server_ && evbuffer_get_length(bufferevent_get_input(server_)) > 0) {
    // The server's last words (a LOGOUT's BYE and OK) may still wait in the input when its
    // close is reported (a TLS filter reports it before its reader has run): relay them first.
    ProcessServer();
    if (closing_ || !server_) return;
  }
  if (what & BEV_EVENT_TIMEOUT) {
    ++owner_->stats.server_errors;
    why = "* BYE Ghost: the IMAP server " + owner_->origin_text + " stopped answering\r\n";
  } else if (what & BEV_EVENT_EOF) {
    // The server's last words (a BYE) were relayed already.
    if (!sframer_.AtBoundary()) why = "* BYE Ghost: the IMAP server closed the connection mid-response\r\n";
  } else {
    why = "* BYE Ghost: lost the connection to the IMAP server\r\n";
  }
  // A literal cut short leaves the client's parser in the middle of it: close at once.
  Close(why);
}

void ImapSession::ClientDrained() {
  if (closing_) return Linger();
  if (starttls_pending_) return SwitchToTls();
  UpdateFlow();
  if (answer_ && !answer_->reading) StreamSlice();
}

void ImapSession::ServerDrained() { UpdateFlow(); }

void ImapSession::UpdateFlow() {
  if (closing_ || !server_ || !client_ || !connected_) return;
  if (starttls_pending_) {
    // Nothing may reach the client between the OK and the handshake.
    bufferevent_disable(server_, EV_READ);
    bufferevent_disable(client_, EV_READ);
    return;
  }
  const std::size_t high = owner_->options.high_watermark;
  if (evbuffer_get_length(bufferevent_get_output(client_)) > high) {
    bufferevent_disable(server_, EV_READ);
  } else if (!(bufferevent_get_enabled(server_) & EV_READ)) {
    bufferevent_enable(server_, EV_READ);
    ProcessServer();
  }
  if (closing_) return;
  if (busy_ || evbuffer_get_length(bufferevent_get_output(server_)) > high) {
    bufferevent_disable(client_, EV_READ);
  } else if (!(bufferevent_get_enabled(client_) & EV_READ)) {
    bufferevent_enable(client_, EV_READ);
    ProcessClient();
  }
}

void ImapSession::ArmTimeouts() {
  if (closing_ || !server_ || !client_) return;
  timeval tv = ToTimeval(owner_->options.timeout);
  bool awaiting = !own_.empty();
  for (const auto& [tag, p] : pending_) {
    if (p.kind != Kind::kIdle) awaiting = true;
  }
  bufferevent_set_timeouts(server_, (!sframer_.AtBoundary() || awaiting) ? &tv : nullptr, nullptr);
  bufferevent_set_timeouts(client_, !cframer_.AtBoundary() ? &tv : nullptr, nullptr);
}

void ImapSession::ProcessClient() {
  if (!client_) return;
  evbuffer* in = bufferevent_get_input(client_);
  if (closing_) {
    evbuffer_drain(in, evbuffer_get_length(in));
    return;
  }
  while (!closing_ && !busy_) {
    std::size_t len = evbuffer_get_length(in);
    evbuffer_iovec v{};
    std::string_view chunk;
    if (len > 0 && evbuffer_peek(in, -1, nullptr, &v, 1) >= 1)
      chunk = std::string_view(static_cast<const char*>(v.iov_base), v.iov_len);
    imapwire::Event ev;
    std::size_t used = cframer_.Next(chunk, &ev);
    if (ev.kind == imapwire::Event::Kind::kError) {
      ++owner_->stats.client_errors;
      std::optional<imapwire::Command> c = imapwire::ParseCommand(cframer_.partial());
      std::string tag = c && cframer_.partial_first() ? c->tag : "*";
      return Close(tag + " BAD Ghost: " + ev.error + "\r\n* BYE Ghost: closing after a malformed command\r\n");
    }
    HandleClientEvent(ev);
    if (client_) evbuffer_drain(in, used);
    if (ev.kind == imapwire::Event::Kind::kNeedMore && (used == 0 || evbuffer_get_length(in) == 0)) break;
  }
  ArmTimeouts();
  UpdateFlow();
}

void ImapSession::HandleClientEvent(const imapwire::Event& ev) {
  using K = imapwire::Event::Kind;
  switch (ev.kind) {
    case K::kNeedMore:
    case K::kError:
    case K::kLiteralEnd:
      return;
    case K::kLiteralData:
      if (append_) {
        append_->body.append(ev.text);
        return;
      }
      if (!client_dropping_) ToServer(ev.text);
      return;
    case K::kSegment:
      break;
  }
  if (!ev.first) {
    if (append_) return FinishAppend(ev.text);
    if (!client_dropping_) ToServer(ev.text);
    return;
  }
  client_dropping_ = false;
  append_.reset();
  if (await_ == Await::kNone) {
    if (std::optional<imapwire::Command> c = imapwire::ParseCommand(ev.text)) {
      if (c->name == "STARTTLS") {
        client_dropping_ = true;  // a literal after it (there should be none) is not sent on
        return StartTls(c->tag);
      }
      if ((c->name == "LOGIN" || c->name == "AUTHENTICATE") && !offline_ && ClearLoginRefused()) {
        client_dropping_ = true;
        std::fprintf(stderr,
                     "ghostproxy: imap: %s: a login refused: the server offers no STARTTLS and is not "
                     "on this machine (imap_origin_plain_login = true allows a login in clear)\n",
                     owner_->origin_text.c_str());
        ToClient(c->tag + " NO [PRIVACYREQUIRED] Ghost: the IMAP server " + owner_->origin_text +
                 " offers no STARTTLS and is not on this machine; the proxy does not send a "
                 "password to it in clear (imap_origin_plain_login = true allows it)\r\n");
        return;
      }
      if ((c->name == "LOGIN" || c->name == "AUTHENTICATE") && LoginDisabled()) {
        client_dropping_ = true;
        ToClient(c->tag + " NO [PRIVACYREQUIRED] Ghost: log in after STARTTLS (this listener "
                          "takes no password in clear)\r\n");
        return;
      }
      if (c->name == "APPEND" && ev.literal && TryDeferAppend(*c)) return;
    }
  }
  if (offline_) return HandleOffline(ev.text);
  if (await_ == Await::kAuthData) {
    // SASL data: PLAIN's carries the user (and the password, which is passed on, not kept).
    auto p = pending_.find(await_tag_);
    if (p != pending_.end() && p->second.arg.empty() && p->second.kind == Kind::kAuth) {
      if (std::optional<std::string> user = imapwire::PlainUser(ev.text)) p->second.arg = *user;
      if (std::optional<std::string> pw = imapwire::PlainPassword(ev.text)) p->second.secret = *pw;
    }
    ToServer(ev.text);
    return;
  }
  if (await_ == Await::kIdleDone) {
    if (strncasecmp(std::string(imapwire::StripEol(ev.text)).c_str(), "DONE", 5) == 0) await_ = Await::kNone;
    ToServer(ev.text);
    return;
  }
  if (ev.literal) {
    // A command with literals (APPEND, LOGIN {n}): passed on; LOGIN's user stays unknown.
    std::optional<imapwire::Command> c = imapwire::ParseCommand(ev.text);
    if (c) {
      Pending p;
      if (c->name == "LOGIN") p.kind = Kind::kLogin;  // user unknown: no caching
      if (c->name == "SELECT" || c->name == "EXAMINE") {
        p.kind = Kind::kSelect;
        selected_.clear();
        map_valid_ = false;
      }
      if (c->name == "LOGIN") p.arg.clear();
      const bool append = c->name == "APPEND";
      if (append) {
        // Sent to the server (not deferred): an upload, disclosed and carried by the card like
        // a body fetch, its tagged answer held until the card has sent the (first) message.
        p.kind = Kind::kAppend;
        p.transfer = owner_->backend->TransferBegin();
      }
      pending_[c->tag] = p;
      if (append) ChargeTransfer(c->tag, *ev.literal, /*upload=*/true);
    }
    ToServer(ev.text);
    return;
  }
  if (!HandleClientCommand(ev.text)) ForwardLine(ev.text);
}

bool ImapSession::HandleClientCommand(std::string_view line, bool allow_cache) {
  std::optional<imapwire::Command> c = imapwire::ParseCommand(line);
  if (!c) return false;  // the server answers BAD
  const std::string& n = c->name;
  if (n == "COMPRESS") {
    ToClient(c->tag + " NO [CANNOT] Ghost: COMPRESS is not available through this proxy\r\n");
    return true;
  }
  if (allow_cache && HandleLocally(*c, std::string(line))) return true;
  Pending p;
  std::string_view rest = c->rest;
  if (n == "LOGIN") {
    p.kind = Kind::kLogin;
    if (std::optional<std::string> user = imapwire::ReadAstring(&rest)) p.arg = *user;
    if (std::optional<std::string> pw = imapwire::ReadAstring(&rest)) p.secret = *pw;
  } else if (n == "AUTHENTICATE") {
    p.kind = Kind::kAuth;
    std::optional<std::string> mech = imapwire::ReadAstring(&rest);
    std::optional<std::string> initial = imapwire::ReadAstring(&rest);
    if (mech && strcasecmp(mech->c_str(), "PLAIN") == 0 && initial && *initial != "=") {
      if (std::optional<std::string> user = imapwire::PlainUser(*initial)) p.arg = *user;
      if (std::optional<std::string> pw = imapwire::PlainPassword(*initial)) p.secret = *pw;
    }
    await_ = Await::kAuthData;
    await_tag_ = c->tag;
  } else if (n == "SELECT" || n == "EXAMINE") {
    p.kind = Kind::kSelect;
    if (std::optional<std::string> box = imapwire::ReadAstring(&rest)) p.arg = NormalizeMailbox(*box);
    SaveSnapshot();
    // The flags the client was told stay what it knows if it selects the same mailbox again
    // (offlineimap3 EXAMINEs, FETCHes every message's FLAGS, then SELECTs it read-write to
    // change them): kept aside, and taken back when the server confirms the same UIDVALIDITY.
    reselect_flags_.clear();
    if (Selected() && p.arg == selected_) {
      reselect_mailbox_ = selected_;
      reselect_uidvalidity_ = uidvalidity_;
      reselect_flags_ = std::move(flags_);
    }
    selected_.clear();  // a SELECT attempt leaves the old mailbox (RFC 3501 §6.3.1)
    map_valid_ = false;
    flags_.clear();
    hidden_.clear();
    server_exists_.reset();
  } else if (n == "CLOSE" || n == "UNSELECT") {
    p.kind = Kind::kClose;
    hidden_.clear();
  } else if (n == "IDLE") {
    p.kind = Kind::kIdle;
    await_ = Await::kIdleDone;
  } else if (n == "FETCH" || n == "UID FETCH") {
    std::string upper(c->rest);
    std::transform(upper.begin(), upper.end(), upper.begin(), ::toupper);
    if (upper.find("BODY[") != std::string::npos || upper.find("BODY.PEEK[") != std::string::npos ||
        upper.find("RFC822") != std::string::npos || upper.find("BINARY") != std::string::npos) {
      p.kind = Kind::kFetch;
      p.transfer = owner_->backend->TransferBegin();
    }
  } else if (n == "ENABLE") {
    map_valid_ = false;  // whatever it enables, the proxy reads the map again
  }
  pending_[c->tag] = std::move(p);
  return false;
}

void ImapSession::ForwardLine(std::string_view line) { ToServer(line); }

bool ImapSession::TryCacheFetch(const imapwire::Command& cmd, const imapwire::BodyFetch& f,
                                std::string line) {
  // Only in a state the answer cannot reorder: nothing of the client's outstanding.
  if (user_.empty() || !Selected() || !pending_.empty() || await_ != Await::kNone) return false;
  if (!map_valid_) {
    if (!esearch_ || !map_tag_.empty()) return false;
    // Read the map first, then decide (the command waits; no other client input is read).
    busy_ = true;
    deferred_line_ = std::move(line);
    map_retried_ = false;
    SendMapRefresh();
    return true;
  }
  std::uint32_t uid = 0, seq = 0;
  if (cmd.name == "UID FETCH") {
    auto it = std::lower_bound(uids_.begin(), uids_.end(), f.number);
    if (it == uids_.end() || *it != f.number || IsHidden(f.number)) return false;
    uid = f.number;
    seq = ClientSeqOfUid(uid);
  } else if (hidden_.empty()) {
    if (f.number > uids_.size()) return false;
    seq = f.number;
    uid = uids_[seq - 1];
  } else {
    std::vector<std::uint32_t> view = ClientView();
    if (f.number > view.size()) return false;
    seq = f.number;
    uid = view[seq - 1];
  }
  ServeFromCache(cmd.tag, cmd.name, f, uid, seq, KeyFor(uid), std::move(line));
  return true;
}

bool ImapSession::HandleLocally(const imapwire::Command& cmd, const std::string& line) {
  static const std::set<std::string> kExpunging = {"EXPUNGE", "UID EXPUNGE", "CLOSE", "MOVE", "UID MOVE"};
  if (kExpunging.count(cmd.name) && TryDeferExpunge(cmd, line)) return true;
  if (!hidden_.empty() && HandleWithHidden(cmd, line)) return true;
  if (cmd.name == "UID STORE" && TryDeferStore(cmd, line)) return true;
  if ((cmd.name == "COPY" || cmd.name == "UID COPY") && TryDeferCopy(cmd, line)) return true;
  if (cmd.name == "FETCH" || cmd.name == "UID FETCH") {
    if (std::optional<imapwire::BodyFetch> f = imapwire::ParseBodyFetch(cmd.rest)) {
      if (TryCacheFetch(cmd, *f, line)) return true;
    }
  }
  if (NeedsQueueFirst(cmd)) {
    ForwardAfterQueue(line);
    return true;
  }
  return false;
}

std::vector<std::uint32_t> ImapSession::ClientView() const {
  std::vector<std::uint32_t> view;
  view.reserve(uids_.size());
  for (std::uint32_t u : uids_) {
    if (!IsHidden(u)) view.push_back(u);
  }
  return view;
}

std::uint32_t ImapSession::ToClientSeq(std::uint32_t server_seq) const {
  std::uint32_t before = 0;
  for (const auto& [pos, uid] : hidden_) {
    if (pos == server_seq) return 0;
    if (pos < server_seq) ++before;
  }
  return server_seq - before;
}

std::uint32_t ImapSession::ToServerSeq(std::uint32_t client_seq) const {
  std::uint32_t s = client_seq;
  for (const auto& [pos, uid] : hidden_) {  // ascending
    if (pos <= s) ++s;
  }
  return s;
}

std::uint32_t ImapSession::ClientSeqOfUid(std::uint32_t uid) const {
  auto it = std::lower_bound(uids_.begin(), uids_.end(), uid);
  if (it == uids_.end() || *it != uid) return 0;
  return ToClientSeq(static_cast<std::uint32_t>(it - uids_.begin()) + 1);
}

bool ImapSession::TryDeferExpunge(const imapwire::Command& cmd, const std::string& line) {
  // Offline too: the map and flags are the snapshot's, and the changes wait in the journal.
  if (!Defers() || !pending_.empty() || await_ != Await::kNone || busy_) return false;
  if (!map_valid_) return RefreshMapFirst(line);
  const std::string& n = cmd.name;
  const bool move = n == "MOVE" || n == "UID MOVE";
  std::vector<std::uint32_t> view = ClientView();
  std::vector<std::uint32_t> targets;
  std::string destination;
  auto deleted = [this](std::uint32_t uid) -> std::optional<bool> {
    auto f = flags_.find(uid);
    if (f == flags_.end()) return std::nullopt;
    return std::any_of(f->second.begin(), f->second.end(),
                       [](const std::string& x) { return strcasecmp(x.c_str(), "\\Deleted") == 0; });
  };
  if (move) {
    std::optional<imapwire::CopyCommand> cp = imapwire::ParseCopy(cmd.rest, view, n == "UID MOVE");
    if (!cp) return false;
    destination = NormalizeMailbox(cp->destination);
    if (destination == selected_) return false;
    targets = std::move(cp->uids);
  } else {
    std::vector<std::uint32_t> candidates = view;
    if (n == "UID EXPUNGE") {
      std::string_view rest = imapwire::StripEol(cmd.rest);
      while (!rest.empty() && rest.front() == ' ') rest.remove_prefix(1);
      if (rest.empty() || rest.find(' ') != std::string_view::npos) return false;
      std::optional<std::vector<std::uint32_t>> set = imapwire::ExpandSet(rest, view, /*by_uid=*/true);
      if (!set) return false;
      candidates = std::move(*set);
    } else if (!imapwire::StripEol(cmd.rest).empty()) {
      return false;
    }
    // Only messages whose flags the client was told: the server's \Deleted of a message the
    // client never saw flagged is the server's business (it goes with the next EXPUNGE there).
    for (std::uint32_t uid : candidates) {
      std::optional<bool> d = deleted(uid);
      if (!d) return false;
      if (*d) targets.push_back(uid);
    }
    if (targets.empty()) return false;  // nothing to defer: the server's (it may have others')
  }
  for (std::uint32_t uid : targets) {
    ImapOp op;
    op.kind = move ? ImapOp::Kind::kMove : ImapOp::Kind::kExpunge;
    op.origin = user_;
    op.mailbox = selected_;
    op.uidvalidity = uidvalidity_;
    op.uid = uid;
    op.destination = destination;
    Result<std::uint64_t> r = owner_->deferred->Add(std::move(op));
    if (!r.ok()) {
      // Nothing is told: the operations queued before this one go to the server and their
      // EXPUNGEs reach the client from there.
      std::fprintf(stderr, "ghostproxy: imap: cannot journal a deferred %s: %s\n", n.c_str(),
                   r.status().ToString().c_str());
      ToClient(cmd.tag + " NO [SERVERBUG] Ghost: the change could not be journaled (" + r.status().message() +
               ")\r\n");
      return true;
    }
  }
  ++owner_->stats.deferred_expunges;
  std::string untagged;
  // Highest first: each EXPUNGE leaves the numbers below it as they were.
  for (auto it = targets.rbegin(); it != targets.rend(); ++it) {
    std::uint32_t seq = ClientSeqOfUid(*it);
    if (seq) untagged += "* " + std::to_string(seq) + " EXPUNGE\r\n";
  }
  for (std::uint32_t uid : targets) {
    auto at = std::lower_bound(uids_.begin(), uids_.end(), uid);
    if (at == uids_.end() || *at != uid) continue;
    hidden_.emplace_back(static_cast<std::uint32_t>(at - uids_.begin()) + 1, uid);
    flags_.erase(uid);
  }
  std::sort(hidden_.begin(), hidden_.end());
  if (n == "CLOSE") {
    // No untagged EXPUNGE after CLOSE (RFC 3501 §6.4.2); the mailbox is no longer selected, and
    // the next session's view (the snapshot) is without the messages.
    SaveSnapshot();
    selected_.clear();
    map_valid_ = false;
    flags_.clear();
    hidden_.clear();
    // The server leaves the mailbox too, without expunging (so its EXISTS/EXPUNGE stop).
    if (!offline_) SendOwn(Own::kQuiet, "UNSELECT");
    ToClient(cmd.tag + " OK CLOSE completed (Ghost: expunge deferred until the network is up)\r\n");
    return true;
  }
  ToClient(untagged + cmd.tag + " OK " + n + " completed (Ghost: deferred until the network is up)\r\n");
  return true;
}

bool ImapSession::HandleWithHidden(const imapwire::Command& cmd, const std::string& line) {
  const std::string& n = cmd.name;
  // Carry no sequence numbers, or only UIDs (their answers are filtered): passed on.
  static const std::set<std::string> kPass = {"NOOP", "CHECK", "IDLE", "LOGOUT", "CAPABILITY", "UID FETCH",
                                              "ID", "NAMESPACE", "LIST", "LSUB", "GETQUOTAROOT"};
  if (kPass.count(n)) return false;
  // End the view (the hidden messages with it): as without them (SELECT of this mailbox still
  // sends the queue first).
  if (n == "SELECT" || n == "EXAMINE" || n == "UNSELECT") return false;
  if (n == "UID STORE" && TryDeferStore(cmd, line)) return true;
  if ((n == "COPY" || n == "UID COPY") && TryDeferCopy(cmd, line)) return true;
  if (n == "SEARCH" || n == "UID SEARCH") {
    // Criteria with numbers may hold sequence sets, RETURN an ESEARCH: after the queue.
    std::string upper(imapwire::StripEol(cmd.rest));
    std::transform(upper.begin(), upper.end(), upper.begin(), ::toupper);
    bool plain = upper.find("RETURN") == std::string::npos &&
                 std::none_of(upper.begin(), upper.end(), [](char c) {
                   return std::isdigit(static_cast<unsigned char>(c)) || c == '*';
                 });
    // ... and flag changes still queued would change the answer.
    ImapDeferred* d = owner_->deferred.get();
    for (const ImapOp& op : d->queue().pending()) {
      if (op.origin == user_ && op.mailbox == selected_ && op.kind == ImapOp::Kind::kStore) plain = false;
    }
    if (plain) {
      HandleClientCommand(line, /*allow_cache=*/false);
      pending_[cmd.tag].search = n == "SEARCH" ? 1 : 2;
      ForwardLine(line);
      return true;
    }
  }
  if (n == "FETCH") {
    // The client's sequence numbers become the server's.
    std::string_view rest = imapwire::StripEol(cmd.rest);
    while (!rest.empty() && rest.front() == ' ') rest.remove_prefix(1);
    std::size_t sp = rest.find(' ');
    std::vector<std::uint32_t> view = ClientView();
    std::vector<std::uint32_t> seqs;
    if (map_valid_ && sp != std::string_view::npos) {
      std::vector<std::uint32_t> numbers(view.size());
      for (std::size_t i = 0; i < numbers.size(); ++i) numbers[i] = static_cast<std::uint32_t>(i + 1);
      std::optional<std::vector<std::uint32_t>> set =
          imapwire::ExpandSet(rest.substr(0, sp), numbers, /*by_uid=*/false, /*max_uids=*/100000);
      if (set) seqs = std::move(*set);
    }
    if (!seqs.empty()) {
      std::string set;
      for (std::size_t i = 0; i < seqs.size();) {
        std::size_t j = i;
        std::uint32_t first = ToServerSeq(seqs[i]);
        while (j + 1 < seqs.size() && ToServerSeq(seqs[j + 1]) == ToServerSeq(seqs[j]) + 1) ++j;
        std::uint32_t last = ToServerSeq(seqs[j]);
        if (!set.empty()) set += ",";
        set += std::to_string(first);
        if (last != first) set += ":" + std::to_string(last);
        i = j + 1;
      }
      std::string translated = cmd.tag + " FETCH " + set + std::string(rest.substr(sp)) + "\r\n";
      // A cached body is answered from the cache under the client's number, as without hidden
      // messages; whatever has to go to the server after all goes with the server's numbers.
      if (std::optional<imapwire::BodyFetch> f = imapwire::ParseBodyFetch(cmd.rest)) {
        if (TryCacheFetch(cmd, *f, translated)) return true;
      }
      HandleClientCommand(translated, /*allow_cache=*/false);
      ForwardLine(translated);
      return true;
    }
  }
  // Anything else waits for the queue and the server's EXPUNGEs (ServerTagged, kSync).
  ForwardAfterQueue(line);
  return true;
}

std::optional<std::string> ImapSession::TranslateUntagged(std::string_view line) {
  std::string_view s = imapwire::StripEol(line);
  std::string_view eol = line.substr(s.size());
  if (s.size() > 9 && strncasecmp(s.data(), "* SEARCH", 8) == 0 && (s.size() == 8 || s[8] == ' ')) {
    int mode = 0;
    for (const auto& [tag, p] : pending_) {
      if (p.search) {
        mode = p.search;
        break;
      }
    }
    if (!mode) return std::string(line);
    std::string out = "* SEARCH";
    std::string_view rest = s.substr(8);
    while (!rest.empty()) {
      while (!rest.empty() && rest.front() == ' ') rest.remove_prefix(1);
      if (rest.empty()) break;
      if (rest.front() == '(') {  // (MODSEQ n)
        out += " " + std::string(rest);
        break;
      }
      std::size_t sp = rest.find(' ');
      std::string_view word = rest.substr(0, sp);
      rest = sp == std::string_view::npos ? std::string_view() : rest.substr(sp);
      std::uint32_t v = 0;
      auto [end, ec] = std::from_chars(word.data(), word.data() + word.size(), v);
      if (ec != std::errc() || end != word.data() + word.size()) return std::string(line);
      if (mode == 2) {
        if (!IsHidden(v)) out += " " + std::to_string(v);
      } else if (std::uint32_t c = ToClientSeq(v)) {
        out += " " + std::to_string(c);
      }
    }
    return out + std::string(eol);
  }
  // "* N WORD ...": EXISTS, EXPUNGE, FETCH.
  std::size_t i = 2;
  while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) ++i;
  if (i == 2 || i >= s.size() || s[i] != ' ') return std::string(line);
  std::uint32_t num = 0;
  std::from_chars(s.data() + 2, s.data() + i, num);
  std::string_view word = s.substr(i + 1);
  auto starts = [&](const char* w) {
    std::size_t l = std::strlen(w);
    return word.size() >= l && strncasecmp(word.data(), w, l) == 0 && (word.size() == l || word[l] == ' ');
  };
  if (starts("EXISTS")) {
    server_exists_ = num;
    std::uint32_t c = num >= hidden_.size() ? num - static_cast<std::uint32_t>(hidden_.size()) : 0;
    return "* " + std::to_string(c) + " EXISTS" + std::string(eol);
  }
  if (starts("EXPUNGE")) {
    if (server_exists_ && *server_exists_ > 0) --*server_exists_;
    std::uint32_t c = ToClientSeq(num);
    std::erase_if(hidden_, [num](const auto& h) { return h.first == num; });
    for (auto& h : hidden_) {
      if (h.first > num) --h.first;
    }
    if (!c) return std::string();  // the client was told already
    return "* " + std::to_string(c) + " EXPUNGE" + std::string(eol);
  }
  if (starts("FETCH")) {
    std::uint32_t c = ToClientSeq(num);
    if (!c) return std::string();
    return "* " + std::to_string(c) + std::string(line.substr(i));
  }
  return std::string(line);
}

bool ImapSession::TryDeferStore(const imapwire::Command& cmd, const std::string& line) {
  // Only in a state the answer cannot reorder: nothing of the client's outstanding.
  if (!Defers() || !pending_.empty() || await_ != Await::kNone || busy_) return false;
  if (!map_valid_) return RefreshMapFirst(line);
  std::optional<imapwire::UidStore> st = imapwire::ParseUidStore(cmd.rest, hidden_.empty() ? uids_ : ClientView());
  if (!st) return false;
  if (!st->silent) {
    // The untagged answer carries each message's flags: only when the proxy knows them.
    for (std::uint32_t uid : st->uids) {
      if (!flags_.count(uid)) return false;
    }
  }
  std::string untagged;
  for (std::uint32_t uid : st->uids) {
    ImapOp op;
    op.kind = ImapOp::Kind::kStore;
    op.origin = user_;
    op.mailbox = selected_;
    op.uidvalidity = uidvalidity_;
    op.uid = uid;
    (st->add ? op.flags : op.remove_flags) = st->flags;
    Result<std::uint64_t> r = owner_->deferred->Add(std::move(op));
    if (!r.ok()) {
      std::fprintf(stderr, "ghostproxy: imap: cannot journal a deferred STORE: %s\n", r.status().ToString().c_str());
      ToClient(untagged + cmd.tag + " NO [SERVERBUG] Ghost: the change could not be journaled (" +
               r.status().message() + "); messages before UID " + std::to_string(uid) + " were changed\r\n");
      return true;
    }
    auto f = flags_.find(uid);
    if (f != flags_.end()) {
      owner_->deferred->Overlay(user_, selected_, uidvalidity_, uid, &f->second);
      if (!st->silent) {
        std::size_t seq = ClientSeqOfUid(uid);
        untagged += "* " + std::to_string(seq) + " FETCH (UID " + std::to_string(uid) + " FLAGS " +
                    imapwire::FlagList(f->second) + ")\r\n";
      }
    }
  }
  ++owner_->stats.deferred_stores;
  ToClient(untagged + cmd.tag + " OK UID STORE completed (Ghost: deferred until the network is up)\r\n");
  return true;
}

bool ImapSession::RefreshMapFirst(const std::string& line) {
  if (map_valid_ || !esearch_ || !map_tag_.empty() || offline_ || !server_) return false;
  busy_ = true;
  deferred_line_ = line;
  map_retried_ = false;
  SendMapRefresh();
  return true;
}

void ImapSession::SendMapRefresh() {
  map_tag_ = kOwnTagPrefix + std::to_string(++own_counter_);
  own_[map_tag_] = Own::kMapRefresh;
  map_result_.reset();
  map_stale_ = false;
  ToServer(map_tag_ + " UID SEARCH RETURN (ALL) ALL\r\n");
}

void ImapSession::NoteAfterMap(std::string_view line) {
  if (std::optional<std::uint32_t> n = imapwire::UntaggedNumber(line, "EXISTS")) {
    if (*n != map_result_->size()) map_stale_ = true;  // new messages, their UIDs unknown
  } else if (std::optional<std::uint32_t> e = imapwire::UntaggedNumber(line, "EXPUNGE")) {
    if (*e >= 1 && *e <= map_result_->size()) {
      map_result_->erase(map_result_->begin() + (*e - 1));
    } else {
      map_stale_ = true;
    }
  } else if (line.size() > 10 && strncasecmp(line.data(), "* VANISHED", 10) == 0) {
    map_stale_ = true;
  }
}

bool ImapSession::TryDeferCopy(const imapwire::Command& cmd, const std::string& line) {
  // Only in a state the answer cannot reorder: nothing of the client's outstanding.
  if (!Defers() || !pending_.empty() || await_ != Await::kNone || busy_) return false;
  if (!map_valid_) return RefreshMapFirst(line);
  std::optional<imapwire::CopyCommand> cp =
      imapwire::ParseCopy(cmd.rest, hidden_.empty() ? uids_ : ClientView(), cmd.name == "UID COPY");
  if (!cp) return false;
  std::string destination = NormalizeMailbox(cp->destination);
  // A copy into the selected mailbox would have to show as EXISTS with UIDs nobody knows yet:
  // it goes to the server.
  if (destination == selected_) return false;
  for (std::uint32_t uid : cp->uids) {
    ImapOp op;
    op.kind = ImapOp::Kind::kCopy;
    op.origin = user_;
    op.mailbox = selected_;
    op.uidvalidity = uidvalidity_;
    op.uid = uid;
    op.destination = destination;
    Result<std::uint64_t> r = owner_->deferred->Add(std::move(op));
    if (!r.ok()) {
      std::fprintf(stderr, "ghostproxy: imap: cannot journal a deferred COPY: %s\n", r.status().ToString().c_str());
      ToClient(cmd.tag + " NO [SERVERBUG] Ghost: the copy could not be journaled (" + r.status().message() +
               "); messages before UID " + std::to_string(uid) + " were copied\r\n");
      return true;
    }
  }
  ++owner_->stats.deferred_copies;
  ToClient(cmd.tag + " OK " + cmd.name + " completed (Ghost: deferred until the network is up)\r\n");
  return true;
}

bool ImapSession::TryDeferAppend(const imapwire::Command& cmd) {
  if (!DefersUnselected() || !pending_.empty() || await_ != Await::kNone || busy_) return false;
  std::optional<imapwire::AppendCommand> a = imapwire::ParseAppend(cmd.rest);
  if (!a || a->size > owner_->options.max_deferred_append) return false;
  std::string mailbox = NormalizeMailbox(a->mailbox);
  // APPEND to the selected mailbox is deferred too (DESIGN §4.4): answered OK without
  // APPENDUID and without an untagged EXISTS; the message joins the client's view when the
  // server reports it after the flush, with the UID the server gave it (never a provisional
  // one). A SEARCH in the mailbox, or a SELECT or STATUS of it, sends the queue first.
  AppendCapture c;
  if (!a->date.empty()) {
    std::optional<std::int64_t> date = imap::ParseInternalDate(a->date);
    if (!date) return false;  // the server says BAD
    c.date = *date;
  }
  c.tag = cmd.tag;
  c.mailbox = std::move(mailbox);
  c.flags = std::move(a->flags);
  c.size = a->size;
  c.body.reserve(a->size);
  append_ = std::move(c);
  client_dropping_ = true;  // nothing of this command goes to the server
  if (!a->nonsync) ToClient("+ Ghost: ready for the message (deferred until the network is up)\r\n");
  return true;
}

void ImapSession::FinishAppend(std::string_view segment) {
  AppendCapture a = std::move(*append_);
  append_.reset();
  if (!imapwire::StripEol(segment).empty()) {
    // MULTIAPPEND's next message or a malformed end: refused whole, nothing was queued. The
    // rest of the command (its literals) is dropped.
    ToClient(a.tag + " NO [CANNOT] Ghost: only one message per APPEND while the network sleeps; "
                     "nothing was appended\r\n");
    return;
  }
  if (a.body.size() != a.size) {
    ToClient(a.tag + " BAD Ghost: the message is shorter than announced\r\n");
    return;
  }
  ImapOp op;
  op.kind = ImapOp::Kind::kAppend;
  op.origin = user_;
  op.mailbox = a.mailbox;
  op.flags = a.flags;
  op.internaldate = a.date;
  op.body = std::move(a.body);
  Result<std::uint64_t> r = owner_->deferred->Add(std::move(op));
  if (!r.ok()) {
    std::fprintf(stderr, "ghostproxy: imap: cannot journal a deferred APPEND: %s\n", r.status().ToString().c_str());
    ToClient(a.tag + " NO [SERVERBUG] Ghost: the message could not be journaled (" + r.status().message() +
             "); nothing was appended\r\n");
    return;
  }
  ++owner_->stats.deferred_appends;
  ToClient(a.tag + " OK APPEND completed (Ghost: deferred until the network is up)\r\n");
}

bool ImapSession::HasQueued(const std::string& mailbox) const {
  ImapDeferred* d = owner_->deferred.get();
  if (!d || user_.empty() || !d->CanSendFor(user_)) return false;
  for (const ImapOp& op : d->queue().pending()) {
    if (op.origin == user_ && (op.mailbox == mailbox || op.destination == mailbox)) return true;
  }
  return false;
}

bool ImapSession::HasQueuedDeleted(const std::string& mailbox) const {
  ImapDeferred* d = owner_->deferred.get();
  if (!d || user_.empty() || !d->CanSendFor(user_)) return false;
  auto deleted = [](const std::vector<std::string>& flags) {
    return std::any_of(flags.begin(), flags.end(),
                       [](const std::string& f) { return strcasecmp(f.c_str(), "\\Deleted") == 0; });
  };
  for (const ImapOp& op : d->queue().pending()) {
    if (op.origin != user_ || op.mailbox != mailbox) continue;
    if (op.kind != ImapOp::Kind::kStore || deleted(op.flags) || deleted(op.remove_flags)) return true;
  }
  return false;
}

bool ImapSession::NeedsQueueFirst(const imapwire::Command& cmd) const {
  if (!owner_->deferred || user_.empty()) return false;
  // CLOSE and EXPUNGE act on \Deleted only: other queued flag changes may wait (mbsync ends
  // every sync with CLOSE, which would otherwise send a change deferred a moment before).
  static const std::set<std::string> kOnDeleted = {"EXPUNGE", "UID EXPUNGE", "CLOSE"};
  if (kOnDeleted.count(cmd.name)) return Selected() && HasQueuedDeleted(selected_);
  static const std::set<std::string> kOnSelected = {
      "SEARCH", "UID SEARCH", "SORT", "UID SORT", "THREAD", "UID THREAD",
      "COPY",   "UID COPY",   "MOVE", "UID MOVE", "STORE", "UID STORE"};
  if (kOnSelected.count(cmd.name)) return Selected() && HasQueued(selected_);
  if (cmd.name == "SELECT" || cmd.name == "EXAMINE" || cmd.name == "STATUS") {
    std::string_view rest = cmd.rest;
    std::optional<std::string> box = imapwire::ReadAstring(&rest);
    return box && HasQueued(NormalizeMailbox(*box));
  }
  return false;
}

void ImapSession::ForwardAfterQueue(std::string line) {
  busy_ = true;
  ++owner_->stats.flushes_before;
  std::weak_ptr<ImapSession> weak = weak_from_this();
  owner_->deferred->Flush("a command that depends on them", [this, weak, line](std::size_t) {
    // Maybe inside Flush: continue on a later turn, never inside ProcessClient's loop.
    if (weak.expired()) return;
    Later([this, line] {
      if (closing_) return;
      // The server's view of this session is refreshed first, and the command goes once that
      // is done (ServerTagged): dovecot answers SEARCH from the view of the last sync, and does
      // not sync after a NOOP while the next command is already waiting.
      after_sync_line_ = line;
      SendOwn(Own::kSync, "NOOP");
      ArmTimeouts();
    });
  });
}

void ImapSession::Later(std::function<void()> fn) {
  RunSoon(owner_->base, [weak = weak_from_this(), fn = std::move(fn)] {
    if (auto s = weak.lock()) fn();
  });
}

std::string ImapSession::OverlayFlags(std::string_view line) {
  if (user_.empty() || !Selected()) return std::string(line);
  std::optional<imapwire::FetchFlags> ff = imapwire::ParseFetchFlags(line);
  if (!ff) return std::string(line);
  std::optional<std::uint32_t> uid = ff->uid;
  if (!uid && map_valid_ && ff->seq >= 1 && ff->seq <= uids_.size()) uid = uids_[ff->seq - 1];
  if (!uid) return std::string(line);
  std::vector<std::string> flags = ff->flags;
  if (owner_->deferred) owner_->deferred->Overlay(user_, selected_, uidvalidity_, *uid, &flags);
  if (flags_.size() < kMaxMapUids || flags_.count(*uid)) flags_[*uid] = flags;
  if (flags == ff->flags) return std::string(line);
  return imapwire::RewriteFlags(line, *ff, flags);
}

void ImapSession::ServeFromCache(std::string tag, std::string name, imapwire::BodyFetch f,
                                 std::uint32_t uid, std::uint32_t seq, std::string key,
                                 std::string line) {
  busy_ = true;
  std::weak_ptr<ImapSession> weak = weak_from_this();
  auto on_lookup = [this, weak, tag, name, f, uid, seq, key, line](Result<CacheLookup> r) {
    if (weak.expired() || closing_) return;
    bool from_cache = r.ok() && r->cached && (r->choice != CacheChoice::kNetwork || offline_);
    forwarded_cached_key_.clear();
    if (!from_cache && offline_) {
      busy_ = false;
      Unavailable(tag, "the message is not in the cache");
      return ProcessClient();
    }
    if (!from_cache) {
      // Cached, but the cost model chose the network: the body the server sends is not stored
      // again, and EndFill need not ask (a second lookup would run the cost model again and
      // count as a second read of the message).
      if (r.ok() && r->cached) forwarded_cached_key_ = key;
      return ForwardFetch(line);
    }
    CacheAnswer a;
    a.tag = tag;
    a.name = name;
    a.key = key;
    a.fetch = f;
    a.uid = uid;
    a.seq = seq;
    a.body = r->body;
    const Bytes whole = r->response.size;
    if (!f.whole()) {
      // A section: located in the whole message (proxy/imap_section.h), read into RAM first.
      if (whole > owner_->options.max_fill) return ForwardFetch(line);
      if (r->choice == CacheChoice::kMemory && r->memory && r->memory->body.size() == whole) {
        owner_->backend->ServedFromMemory(key, whole);
        return AnswerSection(std::move(a), r->memory->body, line);
      }
      auto message = std::make_shared<std::string>();
      message->reserve(whole);
      owner_->backend->ReadBody(
          key, a.body, 0, whole,
          [weak, message](std::string_view data) {
            if (weak.expired()) return false;
            message->append(data);
            return true;
          },
          [this, weak, message, whole, a = std::move(a), line](Status st) mutable {
            if (weak.expired() || closing_) return;
            if (!st.ok() || message->size() != whole) {
              std::fprintf(stderr, "ghostproxy: imap: reading %s from the cache: %s (asking the server)\n",
                           a.key.c_str(), st.ToString().c_str());
              return ForwardFetch(line);
            }
            AnswerSection(std::move(a), *message, line);
          });
      return;
    }
    a.offset = 0;
    a.end = whole;
    if (f.partial) {  // RFC 3501 §6.4.5: the octets from start, at most count; none past the end
      a.offset = std::min<Bytes>(f.partial->first, whole);
      a.end = a.offset + std::min<Bytes>(f.partial->second, whole - a.offset);
    }
    a.size = a.end - a.offset;
    std::string head = "* " + std::to_string(seq) + " FETCH (" +
                       (name == "UID FETCH" ? "UID " + std::to_string(uid) + " " : std::string()) +
                       f.response_name() + " {" + std::to_string(a.size) + "}\r\n";
    ToClient(head);
    ++owner_->stats.cache_hits;
    if (r->choice == CacheChoice::kMemory && r->memory && r->memory->body.size() == whole) {
      ToClient(std::string_view(r->memory->body).substr(a.offset, a.size));
      owner_->backend->ServedFromMemory(key, a.size);
      a.offset = a.end;
      answer_ = std::move(a);
      return FinishCacheAnswer();
    }
    answer_ = std::move(a);
    StreamSlice();
  };
  if (std::shared_ptr<const MemoryObject> m = owner_->backend->FindInMemory(key)) {
    // The backend's copy in RAM (kept once a whole body was read from the disk) answers with
    // no round trip to ghostfs, as for HTTP (proxy/exchange.cc StartLookup); on the next turn
    // of the loop, as a backend's answer would come (ProcessClient is not re-entered).
    CacheLookup lookup;
    lookup.cached = true;
    lookup.response = m->head;
    lookup.choice = CacheChoice::kMemory;
    lookup.memory = std::move(m);
    Later([on_lookup = std::move(on_lookup), lookup = std::move(lookup)]() mutable { on_lookup(std::move(lookup)); });
    return;
  }
  owner_->backend->Lookup(key, std::move(on_lookup));
}

void ImapSession::ForwardFetch(const std::string& line) {
  // The server answers (the cost model chose the network, nothing is cached, or a section the
  // proxy cannot locate for certain); a whole body it sends is stored on the way.
  busy_ = false;
  ++owner_->stats.forwarded_fetches;
  HandleClientCommand(line, /*allow_cache=*/false);  // records it, discloses the transfer
  ForwardLine(line);
  ArmTimeouts();
  UpdateFlow();
  ProcessClient();
}

void ImapSession::AnswerSection(CacheAnswer a, std::string_view message, const std::string& line) {
  bool literal8 = false;
  std::optional<std::string> bytes = a.fetch.binary()
                                         ? imapwire::ExtractBinary(message, a.fetch.section.part, &literal8)
                                         : imapwire::ExtractSection(message, a.fetch.section);
  if (!bytes) return ForwardFetch(line);
  std::string_view b = *bytes;
  if (a.fetch.item == imapwire::BodyFetch::Item::kBinarySize) {  // RFC 3516 §4.3: no literal
    ToClient("* " + std::to_string(a.seq) + " FETCH (" +
             (a.name == "UID FETCH" ? "UID " + std::to_string(a.uid) + " " : std::string()) +
             a.fetch.response_name() + " " + std::to_string(b.size()));
    ++owner_->stats.cache_hits;
    ++owner_->stats.section_hits;
    a.size = a.offset = a.end = 0;
    answer_ = std::move(a);
    return FinishCacheAnswer();
  }
  if (a.fetch.partial) {  // RFC 3501 §6.4.5: of the section's octets, none past its end
    b = b.substr(std::min<std::size_t>(a.fetch.partial->first, b.size()));
    b = b.substr(0, std::min<std::uint64_t>(a.fetch.partial->second, b.size()));
  }
  ToClient("* " + std::to_string(a.seq) + " FETCH (" +
           (a.name == "UID FETCH" ? "UID " + std::to_string(a.uid) + " " : std::string()) +
           a.fetch.response_name() + (literal8 ? " ~{" : " {") + std::to_string(b.size()) + "}\r\n");
  ToClient(b);
  ++owner_->stats.cache_hits;
  ++owner_->stats.section_hits;
  a.size = b.size();
  a.offset = a.end = 0;
  answer_ = std::move(a);
  FinishCacheAnswer();
}

void ImapSession::StreamSlice() {
  if (!answer_ || answer_->reading || closing_) return;
  CacheAnswer& a = *answer_;
  if (a.offset >= a.end) return FinishCacheAnswer();
  if (evbuffer_get_length(bufferevent_get_output(client_)) > owner_->options.high_watermark) return;
  a.reading = true;
  Bytes len = std::min<Bytes>(owner_->options.cache_read_slice, a.end - a.offset);
  std::weak_ptr<ImapSession> weak = weak_from_this();
  auto got = std::make_shared<Bytes>(0);
  owner_->backend->ReadBody(
      a.key, a.body, a.offset, len,
      [this, weak, got](std::string_view data) {
        if (weak.expired() || closing_) return false;
        ToClient(data);
        *got += data.size();
        return true;
      },
      [this, weak, got, len](Status s) {
        if (weak.expired() || closing_ || !answer_) return;
        answer_->reading = false;
        if (!s.ok() || *got != len) {
          // The client has part of a literal: nothing can follow but a close.
          std::fprintf(stderr, "ghostproxy: imap: reading %s from the cache: %s\n",
                       answer_->key.c_str(), s.ToString().c_str());
          return Close("");
        }
        answer_->offset += len;
        StreamSlice();
      });
}

void ImapSession::FinishCacheAnswer() {
  CacheAnswer a = std::move(*answer_);
  answer_.reset();
  ToClient(")\r\n");
  if (a.fetch.sets_seen() && Defers()) {
    // \Seen as if the server had served it, deferred like a client's STORE; the client is told
    // the flags now when the proxy knows them.
    ImapOp op;
    op.kind = ImapOp::Kind::kStore;
    op.origin = user_;
    op.mailbox = selected_;
    op.uidvalidity = uidvalidity_;
    op.uid = a.uid;
    op.flags = {"\\Seen"};
    if (Result<std::uint64_t> r = owner_->deferred->Add(std::move(op)); r.ok()) {
      ++owner_->stats.seen_stores;
      if (auto f = flags_.find(a.uid); f != flags_.end()) {
        owner_->deferred->Overlay(user_, selected_, uidvalidity_, a.uid, &f->second);
        ToClient("* " + std::to_string(a.seq) + " FETCH (UID " + std::to_string(a.uid) + " FLAGS " +
                 imapwire::FlagList(f->second) + ")\r\n");
      }
      a.fetch.item = imapwire::BodyFetch::Item::kBodyPeek;  // done: no STORE below
    }
  }
  ToClient(a.tag + " OK " + a.name + " completed (Ghost: from the cache)\r\n");
  if (a.fetch.sets_seen()) {
    // \Seen as if the server had served it; its untagged FETCH FLAGS reaches the client.
    ++owner_->stats.seen_stores;
    SendOwn(Own::kSeen, "UID STORE " + std::to_string(a.uid) + " +FLAGS (\\Seen)");
  }
  busy_ = false;
  ArmTimeouts();
  UpdateFlow();
  ProcessClient();
}

void ImapSession::SendOwn(Own what, const std::string& command) {
  std::string tag = kOwnTagPrefix + std::to_string(++own_counter_);
  own_[tag] = what;
  ToServer(tag + " " + command + "\r\n");
}

void ImapSession::ProcessServer() {
  if (!server_ || closing_) return;
  if (upstream_ != Upstream::kRelay) return NegotiateUpstream();
  evbuffer* in = bufferevent_get_input(server_);
  const std::size_t high = owner_->options.high_watermark;
  while (!closing_ && server_ && !holding_) {
    if (client_ && evbuffer_get_length(bufferevent_get_output(client_)) > high) break;
    std::size_t len = evbuffer_get_length(in);
    evbuffer_iovec v{};
    std::string_view chunk;
    if (len > 0 && evbuffer_peek(in, -1, nullptr, &v, 1) >= 1)
      chunk = std::string_view(static_cast<const char*>(v.iov_base), v.iov_len);
    imapwire::Event ev;
    std::size_t used = sframer_.Next(chunk, &ev);
    if (ev.kind == imapwire::Event::Kind::kError) {
      ++owner_->stats.server_errors;
      return Close("* BYE Ghost: the IMAP server sent malformed data (" + ev.error + ")\r\n");
    }
    HandleServerEvent(ev);
    if (!server_) break;
    evbuffer_drain(in, used);
    if (ev.kind == imapwire::Event::Kind::kNeedMore && (used == 0 || evbuffer_get_length(in) == 0)) break;
  }
  ArmTimeouts();
  UpdateFlow();
}

void ImapSession::HandleServerEvent(const imapwire::Event& ev) {
  using K = imapwire::Event::Kind;
  switch (ev.kind) {
    case K::kNeedMore:
    case K::kError:
      return;
    case K::kLiteralData:
      for (auto& [tag, p] : pending_) {
        if (p.kind == Kind::kFetch) p.bytes += ev.text.size();
      }
      if (filling_) {
        if (fill_data_.size() + ev.text.size() <= fill_expected_) fill_data_.append(ev.text);
      }
      if (!server_dropping_) ToClient(ev.text);
      return;
    case K::kLiteralEnd:
      if (filling_) EndFill();
      return;
    case K::kSegment:
      break;
  }
  if (!ev.first) {
    if (!server_dropping_) ToClient(ev.text);
    return;
  }
  server_dropping_ = false;
  std::string_view line = ev.text;
  if (ev.literal && line.starts_with("* ")) ChargeFetch(*ev.literal);
  if (line.starts_with("* ")) {
    if (!map_tag_.empty()) {
      if (auto uids = imapwire::EsearchUids(line, map_tag_, kMaxMapUids)) {
        map_result_ = std::move(*uids);
        server_dropping_ = true;
        return;
      }
      if (map_result_) NoteAfterMap(line);
    }
    if (std::optional<std::uint32_t> v = imapwire::UidValidity(line)) pending_uidvalidity_ = *v;
    // With deferred expunges the client's numbers are not the server's (computed before the
    // map below changes; OverlayFlags and the fill still see the server's numbers).
    std::optional<std::string> translated;
    if (!hidden_.empty()) {
      translated = TranslateUntagged(line);
      if (translated->empty()) {
        // A message the client was told is expunged: its EXPUNGE (or FETCH) is not shown.
        if (std::optional<std::uint32_t> e = imapwire::UntaggedNumber(line, "EXPUNGE")) {
          if (map_valid_ && *e >= 1 && *e <= uids_.size()) uids_.erase(uids_.begin() + (*e - 1));
        }
        server_dropping_ = true;
        return;
      }
    }
    if (std::optional<std::uint32_t> n = imapwire::UntaggedNumber(line, "EXISTS")) {
      if (!map_valid_ || *n != uids_.size()) map_valid_ = false;
    } else if (std::optional<std::uint32_t> e = imapwire::UntaggedNumber(line, "EXPUNGE")) {
      if (map_valid_ && *e >= 1 && *e <= uids_.size()) {
        uids_.erase(uids_.begin() + (*e - 1));
      } else {
        map_valid_ = false;
      }
    } else if (line.size() > 10 && strncasecmp(line.data(), "* VANISHED", 10) == 0) {
      map_valid_ = false;
    }
    if (ev.literal) {
      if (std::optional<imapwire::BodyPrefix> p = imapwire::ParseBodyPrefix(line)) StartFill(*p);
    }
    std::string filtered = Caps(OverlayFlags(line));
    if (translated && *translated != line) {
      // Only the leading number changed (FETCH) or the whole line was rebuilt (EXISTS,
      // EXPUNGE, SEARCH): the overlay's flags are kept for FETCH.
      std::string_view t = *translated;
      if (std::optional<imapwire::FetchFlags> ff = imapwire::ParseFetchFlags(line); ff && filtered != line) {
        std::size_t sp = t.find(' ', 2);
        std::size_t fsp = filtered.find(' ', 2);
        filtered = std::string(t.substr(0, sp)) + filtered.substr(fsp);
      } else {
        filtered = Caps(*translated);
      }
    }
    NoteCapabilities(line);
    ToClient(filtered);
    return;
  }
  if (line.starts_with("+")) {
    ToClient(line);
    return;
  }
  ServerTagged(line);
}

void ImapSession::ServerTagged(std::string_view line) {
  std::string_view s = imapwire::StripEol(line);
  std::size_t sp = s.find(' ');
  std::string tag(s.substr(0, sp));
  std::string_view rest = sp == std::string_view::npos ? std::string_view() : s.substr(sp + 1);
  bool ok = rest.size() >= 2 && strncasecmp(rest.data(), "OK", 2) == 0;
  if (auto p = pending_.find(tag); p != pending_.end() && p->second.charging && !holding_) {
    held_tagged_ = std::string(line);
    held_tag_ = tag;
    holding_ = true;
    return;
  }
  if (auto own = own_.find(tag); own != own_.end()) {
    Own what = own->second;
    own_.erase(own);
    server_dropping_ = true;
    if (what == Own::kSync && !after_sync_line_.empty()) {
      std::string line = std::move(after_sync_line_);
      after_sync_line_.clear();
      busy_ = false;
      if (!hidden_.empty()) {
        // The server still has messages the client was told are expunged: the command cannot be
        // answered right. While their operations wait (the server unreachable) it is refused;
        // once none waits (refused by the server, recorded as unapplied) the session ends so
        // the client reads the mailbox again.
        std::optional<imapwire::Command> c = imapwire::ParseCommand(line);
        std::string tag = c ? c->tag : "*";
        bool waiting = HasQueued(selected_);
        bool ends_view = c && (c->name == "SELECT" || c->name == "EXAMINE" || c->name == "UNSELECT");
        if (ends_view) {
          HandleClientCommand(line, /*allow_cache=*/false);  // forgets the hidden messages
          ForwardLine(line);
          Later([this] { ProcessClient(); });
          return;
        }
        if (waiting) {
          ToClient(tag + " NO [UNAVAILABLE] Ghost: deferred expunges could not be sent yet; try again\r\n");
          Later([this] { ProcessClient(); });
          return;
        }
        return Close("* BYE Ghost: the server did not take a deferred expunge; please reconnect\r\n");
      }
      HandleClientCommand(line, /*allow_cache=*/false);
      ForwardLine(line);
      Later([this] { ProcessClient(); });  // client input behind it is read again
      return;
    }
    if (what == Own::kMapRefresh && tag == map_tag_) {
      map_tag_.clear();
      const bool stale = map_stale_;
      map_stale_ = false;
      if (ok && map_result_ && !stale) {
        uids_ = std::move(*map_result_);
        map_valid_ = true;
        SaveSnapshot();
      } else if (!ok || !map_result_) {
        esearch_ = false;  // the server did not take it: no map for this session
      }
      map_result_.reset();
      if (stale && !deferred_line_.empty() && !map_retried_) {
        // Messages came after the answer (its EXISTS): read once more, the command still waits.
        map_retried_ = true;
        SendMapRefresh();
        return;
      }
      if (!deferred_line_.empty()) {
        std::string deferred = std::move(deferred_line_);
        deferred_line_.clear();
        busy_ = false;
        std::optional<imapwire::Command> c = imapwire::ParseCommand(deferred);
        if (!(c && map_valid_ && HandleLocally(*c, deferred))) {
          HandleClientCommand(deferred, /*allow_cache=*/false);
          ForwardLine(deferred);
        }
        // Client input behind it is read again (UpdateFlow / ProcessClient).
        Later([this] { ProcessClient(); });
      }
    }
    return;
  }
  auto p = pending_.find(tag);
  if (p != pending_.end()) {
    Pending done = std::move(p->second);
    pending_.erase(p);
    switch (done.kind) {
      case Kind::kLogin:
      case Kind::kAuth:
        if (ok) user_ = done.arg;
        if (ok) logged_in_ = true;
        if (ok && owner_->deferred && !user_.empty() && !done.secret.empty())
          owner_->deferred->RememberLogin(user_, done.secret);
        if (ok && !user_.empty() && !done.secret.empty()) owner_->logins[user_] = owner_->Digest(user_, done.secret);
        std::fill(done.secret.begin(), done.secret.end(), '\0');
        if (done.kind == Kind::kAuth && await_ == Await::kAuthData && await_tag_ == tag)
          await_ = Await::kNone;
        break;
      case Kind::kSelect:
        if (ok && !done.arg.empty()) {
          selected_ = done.arg;
          uidvalidity_ = pending_uidvalidity_;
          if (!reselect_flags_.empty() && selected_ == reselect_mailbox_ && uidvalidity_ != 0 &&
              uidvalidity_ == reselect_uidvalidity_)
            flags_ = std::move(reselect_flags_);
        }
        reselect_flags_.clear();
        map_valid_ = false;
        break;
      case Kind::kClose:
        if (ok) selected_.clear();
        break;
      case Kind::kIdle:
        if (await_ == Await::kIdleDone) await_ = Await::kNone;
        break;
      case Kind::kFetch:
      case Kind::kAppend:
        owner_->backend->TransferEnd(done.transfer, done.bytes);
        break;
      case Kind::kOther:
        break;
    }
    pending_uidvalidity_ = done.kind == Kind::kSelect ? 0 : pending_uidvalidity_;
  }
  NoteCapabilities(line);
  ToClient(Caps(line));
}

void ImapSession::ChargeFetch(std::uint64_t bytes) {
  for (auto& [tag, p] : pending_) {
    if (p.kind != Kind::kFetch || !p.transfer || p.charged) continue;
    return ChargeTransfer(tag, bytes, /*upload=*/false);
  }
}

void ImapSession::ChargeTransfer(const std::string& tag, std::uint64_t bytes, bool upload) {
  auto it = pending_.find(tag);
  if (it == pending_.end() || !it->second.transfer || it->second.charged) return;
  Pending& p = it->second;
  p.charged = true;  // TransferData at most once per transfer: the first body it carries
  p.charging = true;
  std::weak_ptr<ImapSession> weak = weak_from_this();
  auto done = [weak, tag] {
    if (std::shared_ptr<ImapSession> self = weak.lock()) self->Charged(tag);
  };
  if (upload) {
    owner_->backend->TransferUpload(p.transfer, bytes, std::move(done));
  } else {
    owner_->backend->TransferData(p.transfer, bytes, std::move(done));
  }
}

void ImapSession::Charged(const std::string& tag) {
  if (auto p = pending_.find(tag); p != pending_.end()) p->second.charging = false;
  if (!holding_ || held_tag_ != tag) return;
  holding_ = false;
  std::string line = std::move(held_tagged_);
  held_tagged_.clear();
  if (closing_ || !server_) return;
  ServerTagged(line);
  ProcessServer();
}

void ImapSession::NoteCapabilities(std::string_view line) {
  std::string upper(imapwire::StripEol(line));
  std::transform(upper.begin(), upper.end(), upper.begin(), ::toupper);
  if (upper.find("CAPABILITY") != std::string::npos && upper.find(" ESEARCH") != std::string::npos)
    esearch_ = true;
}

void ImapSession::StartFill(const imapwire::BodyPrefix& p) {
  filling_ = false;
  if (user_.empty() || !Selected() || p.size > owner_->options.max_fill || p.size == 0) return;
  std::optional<std::uint32_t> uid = p.uid;
  if (!uid && map_valid_ && p.seq >= 1 && p.seq <= uids_.size()) uid = uids_[p.seq - 1];
  if (!uid) return;
  filling_ = true;
  fill_key_ = KeyFor(*uid);
  fill_data_.clear();
  fill_data_.reserve(p.size);
  fill_expected_ = p.size;
}

void ImapSession::EndFill() {
  filling_ = false;
  if (fill_key_ == forwarded_cached_key_) {
    forwarded_cached_key_.clear();
    fill_data_.clear();
    return;
  }
  if (fill_data_.size() != fill_expected_) return;
  auto data = std::make_shared<std::string>(std::move(fill_data_));
  fill_data_.clear();
  owner_->StoreBody(fill_key_, std::move(data));
}

void ImapProxy::Impl::StoreBody(const std::string& key, std::shared_ptr<std::string> data) {
  ImapProxy::Impl* owner = this;
  // The fill belongs to the proxy, not to the session: a client that leaves as soon as it has
  // its body (mbsync, curl) must not take the fill with it.
  std::weak_ptr<bool> alive = owner->alive;
  // Stored only when not cached yet: a body the cost model sent to the network is already on
  // the disk, and writing it again would wake the disk for nothing.
  owner->backend->Lookup(key, [owner, alive, key, data](Result<CacheLookup> r) {
    if (alive.expired()) return;  // the backend may be going away with the proxy
    if (!r.ok()) {
      std::fprintf(stderr, "ghostproxy: imap: not storing %s: %s\n", key.c_str(), r.status().ToString().c_str());
      return;
    }
    if (r->cached) return;
    StoredResponse head;
    head.status = 200;
    head.headers = {{"Content-Type", "message/rfc822"}};
    head.size = data->size();
    head.stored_unix = static_cast<std::int64_t>(std::time(nullptr));
    std::unique_ptr<CacheWriter> w = owner->backend->Store(key, head);
    if (!w) return;
    w->Write(std::move(*data));
    // The fill outlives its writer once committed (CacheWriter::Commit).
    w->Commit([owner, alive, key](Status s) {
      if (alive.expired()) return;
      if (s.ok()) {
        ++owner->stats.fills;
      } else {
        std::fprintf(stderr, "ghostproxy: imap: storing %s: %s\n", key.c_str(), s.ToString().c_str());
      }
    });
  });
}

// ---- STARTTLS toward the client ----
//
// The OK goes out in clear; then the session stops reading either side until it is written,
// drops whatever the client sent after the command in clear (nothing pipelined before the
// handshake may be taken as sent under TLS: the STARTTLS command injection, CVE-2011-0411), and continues on a
// TLS bufferevent over a duplicate of the same socket (the plain one is freed, closing only its
// descriptor). The upstream connection is untouched: it is still before login.

void ImapSession::StartTls(const std::string& tag) {
  if (!owner_->server_ctx) {
    ToClient(tag + " BAD Ghost: STARTTLS is not available here (no --imap-tls-cert)\r\n");
    return;
  }
  if (tls_) {
    ToClient(tag + " BAD Ghost: TLS is already active\r\n");
    return;
  }
  if (logged_in_ || !pending_.empty() || busy_) {
    ToClient(tag + " BAD Ghost: STARTTLS only before login, with no other command outstanding\r\n");
    return;
  }
  starttls_pending_ = true;
  busy_ = true;
  bufferevent_disable(client_, EV_READ);
  if (server_) bufferevent_disable(server_, EV_READ);
  bufferevent_setwatermark(client_, EV_WRITE, 0, 0);  // ClientDrained once the OK is all out
  ToClient(tag + " OK Begin TLS negotiation now\r\n");
  UpdateFlow();
}

void ImapSession::SwitchToTls() {
  starttls_pending_ = false;
  evbuffer* in = bufferevent_get_input(client_);
  evbuffer_drain(in, evbuffer_get_length(in));
  int fd = fcntl(bufferevent_getfd(client_), F_DUPFD_CLOEXEC, 0);
  if (fd < 0) {
    std::perror("ghostproxy: imap: STARTTLS: dup");
    bufferevent_free(client_);
    client_ = nullptr;
    return Close("");
  }
  bufferevent_free(client_);
  cframer_ = imapwire::Framer({owner_->options.client_max_line, owner_->options.max_literal});
  client_ = TlsClient(fd);
  if (!client_) {
    close(fd);
    return Close("");
  }
  bufferevent_setcb(client_, &OnClientRead, &OnClientWrite, &OnClientEvent, this);
  bufferevent_setwatermark(client_, EV_WRITE, owner_->options.high_watermark / 2, 0);
  bufferevent_enable(client_, EV_READ | EV_WRITE);
  busy_ = false;
  ArmTimeouts();
  UpdateFlow();
}

// ---- offline: the server unreachable ----
//
// The client is greeted by the proxy and may log in with a user and password the server
// accepted through this proxy before (since it started); SELECT/EXAMINE of a mailbox a session
// had open gives its last UID map; body fetches of cached messages are answered from the cache
// (whatever the cost model says: the network is not there); UID STORE is deferred (with
// imap_journal); NOOP, CHECK, CAPABILITY, CLOSE, UNSELECT and LOGOUT are answered; everything
// else, and an uncached body, gets "NO [UNAVAILABLE]" at once.

void ImapSession::NegotiateUpstream() {
  // Before the connection is reported nothing is read: ServerEvent comes back here.
  if (upstream_ == Upstream::kTcp || !server_) return;
  evbuffer* in = bufferevent_get_input(server_);
  while (!closing_ && server_ && upstream_ != Upstream::kRelay && upstream_ != Upstream::kTlsHandshake) {
    std::size_t n = 0;
    char* raw = evbuffer_readln(in, &n, EVBUFFER_EOL_CRLF);
    if (!raw) {
      if (evbuffer_get_length(in) > owner_->options.client_max_line) {
        ++owner_->stats.server_errors;
        return UpstreamFailed("the server sent an over-long line before login");
      }
      return;
    }
    std::string line(raw, n);
    std::free(raw);
    auto starts = [&line](std::string_view p) {
      return line.size() >= p.size() && strncasecmp(line.data(), p.data(), p.size()) == 0;
    };
    if (upstream_ == Upstream::kGreeting) {
      if (starts("* BYE")) return Close(line + "\r\n");
      if (starts("* PREAUTH")) {
        // Logged in already: STARTTLS is no longer possible (RFC 3501 §6.2.1).
        if (owner_->options.origin_starttls == MailProxyOptions::OriginStartTls::kRequired)
          return UpstreamFailed("the server pre-authenticated the connection, so STARTTLS is impossible");
        return UpstreamReady(line + "\r\n");
      }
      if (!starts("* OK")) {
        ++owner_->stats.server_errors;
        return UpstreamFailed("the server sent no IMAP greeting (\"" + line.substr(0, 60) + "\")");
      }
      upstream_greeting_ = line + "\r\n";
      if (std::optional<std::string> caps = imapwire::GreetingCapabilities(line)) {
        UpstreamCaps(*caps);
      } else {
        upstream_ = Upstream::kCapability;
        ToServer("ghost-cap CAPABILITY\r\n");
      }
    } else if (upstream_ == Upstream::kCapability) {
      if (starts("* CAPABILITY ")) {
        upstream_caps_ += " " + line.substr(13);
      } else if (starts("ghost-cap ")) {
        UpstreamCaps(upstream_caps_);  // (NO/BAD or no CAPABILITY line: no STARTTLS)
      } else if (!starts("* ")) {
        ++owner_->stats.server_errors;
        return UpstreamFailed("the server answered CAPABILITY with \"" + line.substr(0, 60) + "\"");
      }
    } else if (upstream_ == Upstream::kStartTls) {
      if (starts("ghost-tls OK")) {
        // Anything after the OK came before TLS: an injection attempt (CVE-2011-0411 and kin).
        if (evbuffer_get_length(in) > 0) {
          ++owner_->stats.server_errors;
          return UpstreamFailed("the server sent data after STARTTLS's OK, before TLS; refusing it");
        }
        SSL* ssl = SSL_new(owner_->ssl_ctx);
        SSL_set_tlsext_host_name(ssl, owner_->origin.host.c_str());
        SSL_set1_host(ssl, owner_->origin.host.c_str());
        bufferevent* tls = bufferevent_openssl_filter_new(owner_->base, server_, ssl, BUFFEREVENT_SSL_CONNECTING,
                                                          BEV_OPT_CLOSE_ON_FREE);
        if (!tls) {
          SSL_free(ssl);
          return UpstreamFailed("cannot start TLS (out of memory)");
        }
        bufferevent_openssl_set_allow_dirty_shutdown(tls, 1);  // (servers close without close_notify)
        // The socket's own timeouts (the greeting's) would fire under the filter, whose own
        // timeouts ArmTimeouts sets from now on.
        bufferevent_set_timeouts(server_, nullptr, nullptr);
        server_ = tls;  // the filter owns the socket's bufferevent now
        upstream_ = Upstream::kTlsHandshake;
        bufferevent_setcb(server_, &OnServerRead, &OnServerWrite, &OnServerEvent, this);
        bufferevent_setwatermark(server_, EV_WRITE, owner_->options.high_watermark / 2, 0);
        timeval tv = ToTimeval(owner_->options.timeout);
        bufferevent_set_timeouts(server_, &tv, nullptr);
        bufferevent_enable(server_, EV_READ | EV_WRITE);
        return;
      }
      if (starts("ghost-tls ")) {
        ++owner_->stats.server_errors;
        return UpstreamFailed("the server refused STARTTLS (\"" + line.substr(0, 80) + "\")");
      }
      if (!starts("* ")) {
        ++owner_->stats.server_errors;
        return UpstreamFailed("the server answered STARTTLS with \"" + line.substr(0, 60) + "\"");
      }
    }
  }
}

void ImapSession::UpstreamCaps(std::string_view caps) {
  if (upstream_ != Upstream::kGreeting && upstream_ != Upstream::kCapability) return;
  if (imapwire::HasCapability(caps, "STARTTLS")) {
    upstream_ = Upstream::kStartTls;
    ToServer("ghost-tls STARTTLS\r\n");
    return;
  }
  if (owner_->options.origin_starttls == MailProxyOptions::OriginStartTls::kRequired)
    return UpstreamFailed("the server does not offer STARTTLS, which imap_origin_starttls = \"required\" demands "
                          "(use imaps:// if it has it)");
  UpstreamReady(upstream_greeting_);  // plain text; logins as ClearLoginRefused says
}

void ImapSession::UpstreamReady(const std::string& greeting) {
  upstream_ = Upstream::kRelay;
  connected_ = true;
  evbuffer_prepend(bufferevent_get_input(server_), greeting.data(), greeting.size());
  bufferevent_enable(client_, EV_READ | EV_WRITE);
  ProcessServer();
}

void ImapSession::UpstreamFailed(const std::string& why) {
  ++owner_->stats.origin_tls_failures;
  std::fprintf(stderr, "ghostproxy: imap: %s: %s\n", owner_->origin_text.c_str(), why.c_str());
  Close("* BYE Ghost: the IMAP server " + owner_->origin_text + ": " + why + "\r\n");
}

void ImapSession::GoOffline() {
  if (server_) {
    bufferevent_free(server_);
    server_ = nullptr;
  }
  offline_ = true;
  std::fprintf(stderr, "ghostproxy: imap: %s unreachable: serving a client from the cache\n",
               owner_->origin_text.c_str());
  ToClient(Caps("* OK [CAPABILITY IMAP4rev1 AUTH=PLAIN] Ghost: the IMAP server is unreachable; "
                "cached mail only\r\n"));
  bufferevent_set_timeouts(client_, nullptr, nullptr);
  bufferevent_enable(client_, EV_READ | EV_WRITE);
}

void ImapSession::Unavailable(const std::string& tag, const std::string& what) {
  ToClient(tag + " NO [UNAVAILABLE] Ghost: the IMAP server " + owner_->origin_text +
           " is unreachable: " + what + "\r\n");
}

void ImapSession::SaveSnapshot() {
  if (user_.empty() || !Selected() || !map_valid_) return;
  ImapProxy::Impl::Snapshot& snap = owner_->snapshots[user_ + "\n" + selected_];
  snap.uidvalidity = uidvalidity_;
  // What the client was told: a message whose expunge waits in the journal is gone for the next
  // session too (online, the queue goes first; offline, it is not shown again).
  snap.uids = hidden_.empty() ? uids_ : ClientView();
  snap.flags = flags_;
}

void ImapSession::OfflineLogin(const std::string& tag, const std::optional<std::string>& user,
                               const std::optional<std::string>& password) {
  auto known = user ? owner_->logins.find(*user) : owner_->logins.end();
  if (!user || !password || known == owner_->logins.end() || known->second != owner_->Digest(*user, *password)) {
    return Unavailable(tag, "only a login the server accepted before is possible now");
  }
  user_ = *user;
  logged_in_ = true;
  ToClient(tag + " OK [CAPABILITY IMAP4rev1 AUTH=PLAIN] Logged in (Ghost: offline, cached mail only)\r\n");
}

void ImapSession::HandleOffline(std::string_view line) {
  if (await_ == Await::kAuthData) {
    await_ = Await::kNone;
    return OfflineLogin(await_tag_, imapwire::PlainUser(line), imapwire::PlainPassword(line));
  }
  std::optional<imapwire::Command> c = imapwire::ParseCommand(line);
  if (!c) {
    ToClient("* BAD Ghost: not a command\r\n");
    return;
  }
  const std::string& n = c->name;
  const std::string& tag = c->tag;
  std::string_view rest = c->rest;
  bool literal = false, bad = false, nonsync = false;
  literal = imapwire::AnnouncedLiteral(line, &nonsync, &bad).has_value();
  if (literal) {
    // Its data (with LITERAL+) is dropped; a synchronizing literal is never asked for.
    client_dropping_ = true;
    return Unavailable(tag, "a command with a literal needs the server");
  }
  if (n == "CAPABILITY") {
    ToClient(Caps("* CAPABILITY IMAP4rev1 AUTH=PLAIN\r\n") + tag + " OK CAPABILITY completed\r\n");
  } else if (n == "NOOP" || n == "CHECK") {
    ToClient(tag + " OK " + n + " completed (Ghost: offline)\r\n");
  } else if (n == "LOGOUT") {
    Close("* BYE Ghost: logging out\r\n" + tag + " OK LOGOUT completed\r\n");
  } else if (n == "LOGIN") {
    std::optional<std::string> user = imapwire::ReadAstring(&rest);
    std::optional<std::string> password = imapwire::ReadAstring(&rest);
    OfflineLogin(tag, user, password);
  } else if (n == "AUTHENTICATE") {
    std::optional<std::string> mech = imapwire::ReadAstring(&rest);
    std::optional<std::string> initial = imapwire::ReadAstring(&rest);
    if (!mech || strcasecmp(mech->c_str(), "PLAIN") != 0) return Unavailable(tag, "only AUTHENTICATE PLAIN");
    if (initial && *initial != "=") return OfflineLogin(tag, imapwire::PlainUser(*initial), imapwire::PlainPassword(*initial));
    await_ = Await::kAuthData;
    await_tag_ = tag;
    ToClient("+ \r\n");
  } else if (user_.empty()) {
    Unavailable(tag, "log in first");
  } else if (n == "SELECT" || n == "EXAMINE") {
    std::optional<std::string> box = imapwire::ReadAstring(&rest);
    SaveSnapshot();
    hidden_.clear();
    selected_.clear();
    map_valid_ = false;
    flags_.clear();
    auto snap = box ? owner_->snapshots.find(user_ + "\n" + NormalizeMailbox(*box)) : owner_->snapshots.end();
    if (snap == owner_->snapshots.end()) return Unavailable(tag, "this mailbox was not opened through the proxy before");
    selected_ = NormalizeMailbox(*box);
    uidvalidity_ = snap->second.uidvalidity;
    uids_ = snap->second.uids;
    flags_ = snap->second.flags;
    map_valid_ = true;
    ToClient("* FLAGS (\\Answered \\Flagged \\Deleted \\Seen \\Draft)\r\n* " + std::to_string(uids_.size()) +
             " EXISTS\r\n* 0 RECENT\r\n* OK [UIDVALIDITY " + std::to_string(uidvalidity_) + "] UIDs valid\r\n" + tag +
             (n == "SELECT" ? " OK [READ-WRITE] " : " OK [READ-ONLY] ") + n + " completed (Ghost: offline)\r\n");
  } else if (n == "CLOSE" && TryDeferExpunge(*c, std::string(line))) {
    // \Deleted messages the proxy knows of: expunged on the server when the queue is sent.
  } else if (n == "CLOSE" || n == "UNSELECT") {
    SaveSnapshot();
    hidden_.clear();
    selected_.clear();
    map_valid_ = false;
    ToClient(tag + " OK " + n + " completed\r\n");
  } else if (n == "EXPUNGE" || n == "UID EXPUNGE" || n == "MOVE" || n == "UID MOVE") {
    if (!TryDeferExpunge(*c, std::string(line))) Unavailable(tag, n + " of these messages needs the server");
  } else if (n == "FETCH" || n == "UID FETCH") {
    std::optional<imapwire::BodyFetch> f = imapwire::ParseBodyFetch(c->rest);
    if (!f || !TryCacheFetch(*c, *f, std::string(line))) Unavailable(tag, "only whole bodies of cached messages");
  } else if (n == "UID STORE") {
    if (!TryDeferStore(*c, std::string(line))) Unavailable(tag, "this change cannot be deferred");
  } else if (n == "COPY" || n == "UID COPY") {
    if (!TryDeferCopy(*c, std::string(line))) Unavailable(tag, "this copy cannot be deferred");
  } else {
    Unavailable(tag, n + " needs the server");
  }
}

// ---- the listener ----

ImapProxy::Impl::~Impl() {
  alive.reset();
  accept_pause.reset();  // its timer enables the listeners
  if (listener) evconnlistener_free(listener);
  if (tls_listener) evconnlistener_free(tls_listener);
  sessions.clear();
  deferred.reset();
  clock.reset();
  if (ssl_ctx) SSL_CTX_free(ssl_ctx);
  if (server_ctx) SSL_CTX_free(server_ctx);
}

void ImapProxy::Impl::OnAccept(evconnlistener*, evutil_socket_t fd, sockaddr*, int, void* arg) {
  static_cast<Impl*>(arg)->Accept(fd, /*implicit_tls=*/false);
}

void ImapProxy::Impl::OnAcceptTls(evconnlistener*, evutil_socket_t fd, sockaddr*, int, void* arg) {
  static_cast<Impl*>(arg)->Accept(fd, /*implicit_tls=*/true);
}

void ImapProxy::Impl::Accept(evutil_socket_t fd, bool implicit_tls) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  auto s = std::make_shared<ImapSession>(this, fd, implicit_tls);
  if (!s->has_client()) {  // no memory for a bufferevent or a TLS session: refuse this one
    std::fprintf(stderr, "ghostproxy: imap: cannot take a client connection: %s\n",
                 OpenSslErrorText().c_str());
    evutil_closesocket(fd);
    return;
  }
  sessions[s.get()] = s;
  ++stats.sessions;
  s->Start();
}

namespace {

// The newest OpenSSL error's text (the queue is emptied), for messages about `what`.
std::string OpenSslError(const std::string& what) {
  unsigned long e = ERR_get_error();
  ERR_clear_error();
  char buf[256] = "unknown error";
  if (e) ERR_error_string_n(e, buf, sizeof buf);
  return what + ": " + buf;
}

// evconnlistener_new_bind on `at`; `*bound` gets the address with the port bound (for port 0).
Result<evconnlistener*> Listen(event_base* base, evconnlistener_cb cb, void* arg, const ListenAddress& at,
                               const char* key, ListenAddress* bound) {
  sockaddr_storage ss{};
  socklen_t len = at.ToSockaddr(&ss);
  evconnlistener* l = evconnlistener_new_bind(
      base, cb, arg, LEV_OPT_CLOSE_ON_FREE | LEV_OPT_REUSEABLE | LEV_OPT_CLOSE_ON_EXEC, -1,
      reinterpret_cast<const sockaddr*>(&ss), static_cast<int>(len));
  if (!l) {
    return Status::FromErrno(errno, std::string(key) + " " + at.ToString() +
                                        " (address in use: is another proxy running?)");
  }
  *bound = at;
  sockaddr_storage got{};
  socklen_t got_len = sizeof got;
  if (getsockname(evconnlistener_get_fd(l), reinterpret_cast<sockaddr*>(&got), &got_len) == 0) {
    bound->port = ntohs(got.ss_family == AF_INET ? reinterpret_cast<sockaddr_in*>(&got)->sin_port
                                                 : reinterpret_cast<sockaddr_in6*>(&got)->sin6_port);
  }
  return l;
}

}  // namespace

Result<std::unique_ptr<ImapProxy>> ImapProxy::Start(event_base* base, CacheBackend* backend,
                                                    const MailProxyOptions& options) {
  if (!options.imap_listen && !options.imaps_listen) return Status::InvalidArgument("no imap_listen address");
  if (options.tls_cert.empty() != options.tls_key.empty() || (options.imaps_listen && options.tls_cert.empty()))
    return Status::InvalidArgument("--imap-tls-cert and --imap-tls-key go together (and --imaps-listen needs them)");
  auto impl = std::make_unique<Impl>();
  impl->base = base;
  impl->backend = backend;
  impl->options = options;
  Result<ImapUrl> url = ParseImapUrl(options.imap_origin);
  if (!url.ok()) return Status::InvalidArgument("--imap-origin: " + url.status().message());
  if (!url->user.empty()) {
    return Status::InvalidArgument(
        "--imap-origin " + options.imap_origin +
        ": give no user name: each mail client logs in with its own");
  }
  impl->origin = *url;
  impl->origin_text = options.imap_origin;
  if (!options.imap_journal.empty()) {
    impl->clock = std::make_unique<RealClock>(base);
    ImapDeferredOptions d;
    d.journal_path = options.imap_journal;
    d.origin_url = options.imap_origin;
    d.control_path = options.control_path;
    d.deadline = options.imap_deadline;
    d.starttls = options.origin_starttls == MailProxyOptions::OriginStartTls::kRequired ? 1
                 : options.origin_starttls == MailProxyOptions::OriginStartTls::kNever  ? 2
                                                                                        : 0;
    Result<std::unique_ptr<ImapDeferred>> opened = ImapDeferred::Open(base, impl->clock.get(), backend, d);
    if (!opened.ok()) return opened.status();
    impl->deferred = std::move(opened).value();
    // A deferred APPEND made on the server: its message goes into the cache under the UID the
    // server gave it (the Maildir view's key), so the next session reads it from the disk.
    ImapProxy::Impl* owner = impl.get();
    impl->deferred->set_on_appended([owner](const ImapOp& op, std::uint32_t uidvalidity, std::uint32_t uid) {
      if (op.body.empty() || op.body.size() > owner->options.max_fill) return;
      owner->StoreBody(owner->KeyPrefix(op.origin) + op.mailbox + ";UIDVALIDITY=" + std::to_string(uidvalidity) +
                           ";UID=" + std::to_string(uid),
                       std::make_shared<std::string>(op.body));
    });
  }
  if (url->implicit_tls || options.origin_starttls != MailProxyOptions::OriginStartTls::kNever) {
    impl->ssl_ctx = SSL_CTX_new(TLS_client_method());
    if (!impl->ssl_ctx) return Status::Internal("cannot create a TLS context");
    SSL_CTX_set_verify(impl->ssl_ctx, SSL_VERIFY_PEER, nullptr);
    SSL_CTX_set_default_verify_paths(impl->ssl_ctx);  // honours SSL_CERT_FILE
  }
  if (!options.tls_cert.empty()) {
    // TLS toward clients: the configured certificate chain and key, TLS 1.2 at least.
    SSL_CTX* ctx = SSL_CTX_new(TLS_server_method());
    impl->server_ctx = ctx;
    if (!ctx) return Status::Internal(OpenSslError("cannot create a TLS server context"));
    SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
    if (SSL_CTX_use_certificate_chain_file(ctx, options.tls_cert.c_str()) != 1)
      return Status::InvalidArgument(OpenSslError("--imap-tls-cert " + options.tls_cert +
                                                  " (a PEM certificate chain, readable by the proxy)"));
    if (SSL_CTX_use_PrivateKey_file(ctx, options.tls_key.c_str(), SSL_FILETYPE_PEM) != 1)
      return Status::InvalidArgument(OpenSslError("--imap-tls-key " + options.tls_key +
                                                  " (a PEM private key, readable by the proxy)"));
    if (SSL_CTX_check_private_key(ctx) != 1)
      return Status::InvalidArgument(OpenSslError("--imap-tls-key " + options.tls_key +
                                                  " does not match --imap-tls-cert " + options.tls_cert));
    impl->plain_login_ok = options.imap_listen && options.imap_listen->host.IsLoopback();
  }
  impl->accept_pause = std::make_unique<AcceptPause>(base, "ghostproxy: imap");
  if (options.imap_listen) {
    Result<evconnlistener*> l = Listen(base, &Impl::OnAccept, impl.get(), *options.imap_listen, "imap_listen", &impl->bound);
    if (!l.ok()) return l.status();
    impl->listener = *l;
    evconnlistener_set_error_cb(impl->listener, &Impl::OnAcceptError);
  }
  if (options.imaps_listen) {
    ListenAddress bound;
    Result<evconnlistener*> l = Listen(base, &Impl::OnAcceptTls, impl.get(), *options.imaps_listen, "imaps_listen", &bound);
    if (!l.ok()) return l.status();
    impl->tls_listener = *l;
    evconnlistener_set_error_cb(impl->tls_listener, &Impl::OnAcceptError);
    impl->tls_bound = bound;
    if (!options.imap_listen) impl->bound = bound;
  }
  return std::make_unique<ImapProxy>(std::move(impl));
}

ImapProxy::ImapProxy(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ImapProxy::~ImapProxy() = default;
const ListenAddress& ImapProxy::address() const { return impl_->bound; }
std::optional<ListenAddress> ImapProxy::tls_address() const { return impl_->tls_bound; }
const ImapProxyStats& ImapProxy::stats() const { return impl_->stats; }
void ImapProxy::Flush(const char* why) {
  if (impl_->deferred) impl_->deferred->Flush(why);
}

}  // namespace ghost
