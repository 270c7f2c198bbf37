// The SMTP submission listener and the outbox sender. See proxy/smtp_proxy.h.
//
// A session's states (one client connection):
//
//   kCommand ──AUTH PLAIN (no initial response)──▶ kAuthPlain ──base64──▶ kCommand
//   kCommand ──AUTH LOGIN──▶ kAuthLoginUser ──▶ kAuthLoginPass ──▶ kCommand
//   kCommand ──DATA (with MAIL and RCPT)──▶ kData ──"."──▶ kCommand (journaled: 250)
//   any ──QUIT / bad input / timeout──▶ kClosing (the last reply is written, then freed)
#include "proxy/smtp_proxy.h"

#include <curl/curl.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/listener.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <map>
#include <mutex>
#include <thread>

#include "common/base/accept_pause.h"
#include "common/base/clock.h"
#include "common/control/control.h"
#include "common/imap/imap_queue.h"
#include "proxy/network_watch.h"
#include "common/imap/outbox.h"
#include "proxy/smtp_wire.h"

namespace ghost {

namespace {

constexpr std::size_t kMaxCommandLine = 4096;
constexpr std::size_t kMaxDataLine = 64 * 1024;
constexpr std::size_t kMaxRcpts = 100;

timeval ToTimeval(Duration d) {
  auto us = std::chrono::duration_cast<std::chrono::microseconds>(d).count();
  return timeval{static_cast<time_t>(us / 1'000'000), static_cast<suseconds_t>(us % 1'000'000)};
}

// One message to send, with what the worker thread needs (copied: the thread touches nothing
// of the loop's).
struct SendJob {
  std::string id, path, from, user, password;
  std::vector<std::string> rcpts;
  Bytes size = 0;
};
struct SendResult {
  std::string id;
  bool ok = false;
  bool permanent = false;  // a 5xx: refused for good
  std::string reply;
};

int OnCurlDebug(CURL*, curl_infotype type, char* data, std::size_t size, void* arg) {
  if (type == CURLINFO_HEADER_IN) {
    std::string line(data, size);
    while (!line.empty() && (line.back() == '\n' || line.back() == '\r')) line.pop_back();
    // The first refusal (4xx/5xx) is the answer that matters; later lines are QUIT's.
    auto* reply = static_cast<std::string*>(arg);
    if (reply->empty() && !line.empty() && (line[0] == '4' || line[0] == '5')) *reply = line;
  }
  return 0;
}

// How long a send in progress may still take once the proxy is stopping: a server's late
// answer to a DATA it has (ghostproxy_smtp_stop) still takes the message out of the outbox;
// one that does not answer by then leaves it waiting (sent again after the next start), and
// the proxy stops instead of waiting for curl's own timeouts (60 s: ghostproxy_smtp_hang).
constexpr Duration kStopGrace = std::chrono::seconds(4);

// When the worker must give up (steady_clock nanoseconds since its epoch), 0 while the proxy runs.
using StopAt = std::atomic<std::int64_t>;

std::int64_t SteadyNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// curl calls this about once a second even while nothing moves: nonzero aborts the transfer.
int OnCurlProgress(void* arg, curl_off_t, curl_off_t, curl_off_t, curl_off_t) {
  std::int64_t at = static_cast<const StopAt*>(arg)->load();
  return at != 0 && SteadyNs() >= at ? 1 : 0;
}

SendResult SendOne(const std::string& origin, const SendJob& job, const StopAt& stop_at) {
  SendResult r;
  r.id = job.id;
  FILE* f = std::fopen(job.path.c_str(), "rb");
  if (!f) {
    r.reply = "cannot read " + job.path;
    return r;
  }
  CURL* c = curl_easy_init();
  curl_slist* rcpts = nullptr;
  for (const std::string& to : job.rcpts) rcpts = curl_slist_append(rcpts, ("<" + to + ">").c_str());
  std::string from = "<" + job.from + ">";
  std::string last_reply;
  char error[CURL_ERROR_SIZE] = "";
  curl_easy_setopt(c, CURLOPT_URL, origin.c_str());
  curl_easy_setopt(c, CURLOPT_MAIL_FROM, from.c_str());
  curl_easy_setopt(c, CURLOPT_MAIL_RCPT, rcpts);
  curl_easy_setopt(c, CURLOPT_UPLOAD, 1L);
  curl_easy_setopt(c, CURLOPT_READDATA, f);
  curl_easy_setopt(c, CURLOPT_INFILESIZE_LARGE, static_cast<curl_off_t>(job.size));
  curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT, 15L);
  curl_easy_setopt(c, CURLOPT_LOW_SPEED_LIMIT, 1L);
  curl_easy_setopt(c, CURLOPT_LOW_SPEED_TIME, 60L);
  curl_easy_setopt(c, CURLOPT_ERRORBUFFER, error);
  curl_easy_setopt(c, CURLOPT_VERBOSE, 1L);
  curl_easy_setopt(c, CURLOPT_DEBUGFUNCTION, &OnCurlDebug);
  curl_easy_setopt(c, CURLOPT_DEBUGDATA, &last_reply);
  curl_easy_setopt(c, CURLOPT_NOPROGRESS, 0L);
  curl_easy_setopt(c, CURLOPT_XFERINFOFUNCTION, &OnCurlProgress);
  curl_easy_setopt(c, CURLOPT_XFERINFODATA, const_cast<StopAt*>(&stop_at));
  if (origin.starts_with("smtp://")) curl_easy_setopt(c, CURLOPT_USE_SSL, static_cast<long>(CURLUSESSL_TRY));
  if (!job.user.empty()) {
    curl_easy_setopt(c, CURLOPT_USERNAME, job.user.c_str());
    curl_easy_setopt(c, CURLOPT_PASSWORD, job.password.c_str());
  }
  CURLcode rc = curl_easy_perform(c);
  long code = 0;
  curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &code);
  r.ok = rc == CURLE_OK;
  r.permanent = !r.ok && code >= 500 && code < 600;
  r.reply = last_reply.empty() ? std::string(error[0] ? error : curl_easy_strerror(rc)) : last_reply;
  if (rc == CURLE_ABORTED_BY_CALLBACK) r.reply = "no answer from the server before the proxy stopped";
  curl_slist_free_all(rcpts);
  curl_easy_cleanup(c);
  std::fclose(f);
  return r;
}

}  // namespace

class SmtpSession;

class SmtpProxy::Impl {
 public:
  event_base* base = nullptr;
  CacheBackend* backend = nullptr;
  SmtpProxyOptions options;
  ListenAddress bound;
  evconnlistener* listener = nullptr;
  std::unique_ptr<Outbox> outbox;
  SmtpProxyStats stats;
  std::map<SmtpSession*, std::unique_ptr<SmtpSession>> sessions;
  // Credentials by user, from AUTH, in RAM only.
  std::map<std::string, std::string> passwords;
  event* deadline_timer = nullptr;
  bool sending = false, again = false;
  std::thread worker;
  // The worker's results, stored before it posts Sent: applied by Sent, or by ~Impl when the
  // loop stopped before running it (else mail the server took would be sent again).
  std::mutex done_mu;
  std::vector<SendResult> done;
  std::shared_ptr<bool> alive = std::make_shared<bool>(true);
  // Set by ~Impl: the worker's send in progress ends by then, and it starts no other.
  StopAt stop_at{0};
  // ghostfs's network card, knob and `ghostctl flush` (proxy/network_watch.h).
  std::unique_ptr<NetworkWatch> watch;

  // Out of descriptors, the listener pauses instead of spinning (common/base/accept_pause.h).
  std::unique_ptr<AcceptPause> accept_pause;

  ~Impl();
  static void OnAccept(evconnlistener*, evutil_socket_t fd, sockaddr*, int, void* arg);
  static void OnAcceptError(evconnlistener* l, void* arg) {
    static_cast<Impl*>(arg)->accept_pause->Failed(l);
  }
  static void OnDeadline(evutil_socket_t, short, void* arg) {
    static_cast<Impl*>(arg)->Flush("deadline");
  }
  void Remove(SmtpSession* s);
  void Accepted();
  void ArmDeadline() {
    if (outbox->waiting().empty() || evtimer_pending(deadline_timer, nullptr)) return;
    // 60 s at K=50, twice that at K=0, at once at K=100, like the IMAP queues (imap_queue.h).
    timeval tv = ToTimeval(DeadlineFor(options.deadline, watch ? watch->knob() : 50));
    evtimer_add(deadline_timer, &tv);
  }
  void Flush(const char* why);
  void Sent(std::uint64_t transfer);
  Bytes Apply();
  void SubscribeModes();
};

class SmtpSession {
 public:
  SmtpSession(SmtpProxy::Impl* owner, evutil_socket_t fd) : owner_(owner), data_(kMaxDataLine) {
    bev_ = bufferevent_socket_new(owner->base, fd, BEV_OPT_CLOSE_ON_FREE);
    bufferevent_setcb(bev_, &OnRead, &OnWrite, &OnEvent, this);
    bufferevent_enable(bev_, EV_READ | EV_WRITE);
    Reply("220 ghostproxy ESMTP Ghost outbox (mail is sent when the radio is up)");
  }
  ~SmtpSession() {
    std::fill(password_.begin(), password_.end(), '\0');
    bufferevent_free(bev_);
  }

 private:
  enum class State { kCommand, kAuthPlain, kAuthLoginUser, kAuthLoginPass, kData, kClosing };

  static void OnRead(bufferevent*, void* arg) { static_cast<SmtpSession*>(arg)->Read(); }
  static void OnWrite(bufferevent*, void* arg) {
    auto* s = static_cast<SmtpSession*>(arg);
    if (s->state_ != State::kClosing) return;
    // The last reply is out: half-close, and read (dropping it) what the client still sends
    // until it closes, so the close is a FIN, not a reset that could destroy the reply.
    shutdown(bufferevent_getfd(s->bev_), SHUT_WR);
    timeval tv = ToTimeval(std::chrono::seconds(5));
    bufferevent_set_timeouts(s->bev_, &tv, nullptr);
    bufferevent_enable(s->bev_, EV_READ);
  }
  static void OnEvent(bufferevent*, short, void* arg) {
    auto* s = static_cast<SmtpSession*>(arg);
    s->owner_->Remove(s);
  }

  void Reply(const std::string& line) {
    std::string out = line + "\r\n";
    bufferevent_write(bev_, out.data(), out.size());
  }
  void Close(const std::string& line) {
    Reply(line);
    state_ = State::kClosing;
    bufferevent_disable(bev_, EV_READ);
  }
  void ResetTransaction() {
    from_.reset();
    rcpts_.clear();
    message_.clear();
    too_big_ = false;
    data_ = smtpwire::DataReader(kMaxDataLine);
  }
  void Authenticated(const std::string& user, const std::string& password) {
    // The user is kept in the outbox's JSON envelope with each message (and passed upstream).
    if (!smtpwire::IsUtf8(user)) {
      state_ = State::kCommand;
      return Reply("501 5.5.4 Ghost: the user name is not UTF-8");
    }
    user_ = user;
    owner_->passwords[user] = password;  // RAM only: for this user's upstream sends
    Reply("235 2.7.0 Authentication accepted (Ghost: used for the upstream send)");
    state_ = State::kCommand;
    // Mail of this user waiting since a restart goes at the next turn (not now: a login is
    // no reason to wake the radio).
  }

  void Read();
  void Command(const std::string& line);
  void Data();

  SmtpProxy::Impl* owner_;
  bufferevent* bev_ = nullptr;
  State state_ = State::kCommand;
  std::string user_, password_, login_user_;
  std::optional<std::string> from_;
  std::vector<std::string> rcpts_;
  smtpwire::DataReader data_;
  std::string message_;
  bool too_big_ = false;
};

void SmtpSession::Read() {
  evbuffer* in = bufferevent_get_input(bev_);
  if (state_ == State::kClosing) {
    evbuffer_drain(in, evbuffer_get_length(in));
    return;
  }
  timeval tv = ToTimeval(owner_->options.timeout);
  while (state_ != State::kClosing) {
    if (state_ == State::kData) {
      Data();
      if (state_ == State::kData) break;
      continue;
    }
    evbuffer_ptr eol = evbuffer_search_eol(in, nullptr, nullptr, EVBUFFER_EOL_CRLF);
    if (eol.pos < 0) {
      if (evbuffer_get_length(in) > kMaxCommandLine)
        return Close("500 5.5.2 Line too long (Ghost: closing)");
      break;
    }
    if (static_cast<std::size_t>(eol.pos) > kMaxCommandLine)
      return Close("500 5.5.2 Line too long (Ghost: closing)");
    std::size_t n = 0;
    char* raw = evbuffer_readln(in, &n, EVBUFFER_EOL_CRLF);
    std::string line(raw, n);
    std::free(raw);
    Command(line);
  }
  // A timeout only while a command or a message is half-way in.
  bool partial = evbuffer_get_length(in) > 0 || state_ == State::kData;
  bufferevent_set_timeouts(bev_, partial ? &tv : nullptr, nullptr);
}

void SmtpSession::Data() {
  evbuffer* in = bufferevent_get_input(bev_);
  while (evbuffer_get_length(in) > 0 && !data_.done() && !data_.error()) {
    evbuffer_iovec v{};
    evbuffer_peek(in, -1, nullptr, &v, 1);
    std::string_view chunk(static_cast<const char*>(v.iov_base), v.iov_len);
    std::string got;
    std::size_t used = data_.Feed(chunk, &got);
    evbuffer_drain(in, used);
    if (!too_big_) {
      if (message_.size() + got.size() > owner_->options.max_message) {
        too_big_ = true;
        message_.clear();
      } else {
        message_ += got;
      }
    }
  }
  if (data_.error()) return Close("500 5.5.2 Message line too long (Ghost: closing)");
  if (!data_.done()) return;
  state_ = State::kCommand;
  if (too_big_) {
    ResetTransaction();
    return Reply("552 5.3.4 Message too big for the outbox");
  }
  Result<OutboxMessage> m = owner_->outbox->Put(*from_, rcpts_, user_, message_);
  ResetTransaction();
  if (!m.ok()) {
    std::fprintf(stderr, "ghostproxy: smtp: %s\n", m.status().ToString().c_str());
    if (m.status().code() == Status::Code::kInvalidArgument)  // would fail again as it is
      return Reply("554 5.6.0 Ghost: cannot journal the message: " + m.status().message());
    return Reply("451 4.3.0 Ghost: cannot journal the message: " + m.status().message());
  }
  ++owner_->stats.accepted;
  Reply("250 2.0.0 Ok: queued as " + m->id + " (Ghost outbox: sent when the radio is up)");
  owner_->Accepted();
}

void SmtpSession::Command(const std::string& line) {
  if (state_ == State::kAuthPlain) {
    if (line == "*") {
      state_ = State::kCommand;
      return Reply("501 5.7.0 Authentication cancelled");
    }
    auto creds = smtpwire::PlainCredentials(line);
    state_ = State::kCommand;
    if (!creds) return Reply("501 5.5.2 Malformed AUTH PLAIN response");
    return Authenticated(creds->first, creds->second);
  }
  if (state_ == State::kAuthLoginUser || state_ == State::kAuthLoginPass) {
    std::optional<std::string> v = line == "*" ? std::nullopt : smtpwire::Base64Decode(line);
    if (!v) {
      state_ = State::kCommand;
      return Reply("501 5.5.2 Malformed AUTH LOGIN response");
    }
    if (state_ == State::kAuthLoginUser) {
      login_user_ = *v;
      state_ = State::kAuthLoginPass;
      return Reply("334 UGFzc3dvcmQ6");
    }
    return Authenticated(login_user_, *v);
  }
  std::optional<smtpwire::Command> c = smtpwire::ParseCommand(line);
  if (!c) return Reply("500 5.5.2 Syntax error");
  const std::string& v = c->verb;
  if (v == "EHLO") {
    return Reply("250-ghostproxy\r\n250-PIPELINING\r\n250-8BITMIME\r\n250-SIZE " +
                 std::to_string(owner_->options.max_message) + "\r\n250 AUTH PLAIN LOGIN");
  }
  if (v == "HELO") return Reply("250 ghostproxy");
  if (v == "NOOP") return Reply("250 2.0.0 Ok");
  if (v == "RSET") {
    ResetTransaction();
    return Reply("250 2.0.0 Ok");
  }
  if (v == "QUIT") return Close("221 2.0.0 Bye");
  if (v == "STARTTLS") return Reply("454 4.7.0 TLS not available through this proxy");
  if (v == "VRFY") return Reply("252 2.1.5 Cannot verify, will try");
  if (v == "AUTH") {
    std::string_view arg = c->arg;
    std::size_t sp = arg.find(' ');
    std::string mech(arg.substr(0, sp));
    std::transform(mech.begin(), mech.end(), mech.begin(), ::toupper);
    std::string initial = sp == std::string_view::npos ? "" : std::string(arg.substr(sp + 1));
    if (!user_.empty()) return Reply("503 5.5.1 Already authenticated");
    if (mech == "PLAIN") {
      if (initial.empty()) {
        state_ = State::kAuthPlain;
        return Reply("334 ");
      }
      state_ = State::kAuthPlain;
      return Command(initial);
    }
    if (mech == "LOGIN") {
      if (!initial.empty()) {
        std::optional<std::string> u = smtpwire::Base64Decode(initial);
        if (!u) return Reply("501 5.5.2 Malformed AUTH LOGIN response");
        login_user_ = *u;
        state_ = State::kAuthLoginPass;
        return Reply("334 UGFzc3dvcmQ6");
      }
      state_ = State::kAuthLoginUser;
      return Reply("334 VXNlcm5hbWU6");
    }
    return Reply("504 5.5.4 Unrecognized authentication type (PLAIN and LOGIN are)");
  }
  if (v == "MAIL") {
    if (from_) return Reply("503 5.5.1 Nested MAIL command");
    std::optional<std::string> path = smtpwire::ParsePath(c->arg, "FROM:");
    if (!path) return Reply("501 5.1.7 Bad sender address syntax");
    from_ = *path;
    return Reply("250 2.1.0 Ok");
  }
  if (v == "RCPT") {
    if (!from_) return Reply("503 5.5.1 Need MAIL first");
    std::optional<std::string> path = smtpwire::ParsePath(c->arg, "TO:");
    if (!path || path->empty()) return Reply("501 5.1.3 Bad recipient address syntax");
    if (rcpts_.size() >= kMaxRcpts) return Reply("452 4.5.3 Too many recipients");
    rcpts_.push_back(*path);
    return Reply("250 2.1.5 Ok");
  }
  if (v == "DATA") {
    if (!from_ || rcpts_.empty()) return Reply("503 5.5.1 Need MAIL and RCPT first");
    state_ = State::kData;
    return Reply("354 End data with <CR><LF>.<CR><LF>");
  }
  return Reply("502 5.5.2 Command not implemented");
}

// ---- the outbox sender ----

void SmtpProxy::Impl::Accepted() {
  if (outbox->waiting_bytes() > options.cap || outbox->waiting().size() >= options.cap_messages)
    return Flush("outbox cap");
  ArmDeadline();
}

void SmtpProxy::Impl::Flush(const char* why) {
  if (sending) {
    again = true;
    return;
  }
  std::vector<SendJob> jobs;
  for (const OutboxMessage& m : outbox->waiting()) {
    SendJob j;
    if (!m.user.empty()) {
      auto p = passwords.find(m.user);
      if (p == passwords.end()) continue;  // waits for its user to authenticate again
      j.password = p->second;
    }
    j.id = m.id;
    j.path = outbox->DataPath(m.id);
    j.from = m.from;
    j.user = m.user;
    j.rcpts = m.rcpts;
    j.size = m.size;
    jobs.push_back(std::move(j));
  }
  if (jobs.empty()) {
    ArmDeadline();  // mail waiting for its user's credentials is tried again at the deadline
    return;
  }
  ++stats.flushes;
  std::fprintf(stderr, "ghostproxy: smtp: sending %zu message(s) (%s)\n", jobs.size(), why);
  evtimer_del(deadline_timer);
  sending = true;
  std::uint64_t transfer = backend->TransferBegin();
  if (worker.joinable()) worker.join();
  std::weak_ptr<bool> weak = alive;
  worker = std::thread([this, weak, transfer, jobs = std::move(jobs), origin = options.smtp_origin,
                        base = base] {
    std::vector<SendResult> results;
    for (const SendJob& j : jobs) {
      if (stop_at.load() != 0) break;  // the rest keep waiting in the outbox
      results.push_back(SendOne(origin, j, stop_at));
    }
    {
      std::lock_guard lock(done_mu);
      done = std::move(results);
    }
    RunSoon(base, [this, weak, transfer] {
      if (weak.expired()) return;  // ~Impl applied the results
      Sent(transfer);
    });
  });
}

void SmtpProxy::Impl::Sent(std::uint64_t transfer) {
  sending = false;
  backend->TransferEnd(transfer, Apply());
  if (again) {
    again = false;
    Flush("again");
  }
  ArmDeadline();
}

// The worker's results not applied yet, to the outbox and the stats; the bytes sent.
Bytes SmtpProxy::Impl::Apply() {
  std::vector<SendResult> results;
  {
    std::lock_guard lock(done_mu);
    results.swap(done);
  }
  Bytes bytes = 0;
  for (const SendResult& r : results) {
    for (const OutboxMessage& m : outbox->waiting()) {
      if (m.id == r.id) bytes += m.size;
    }
    Status s;
    if (r.ok) {
      ++stats.sent;
      s = outbox->Remove(r.id);
    } else if (r.permanent) {
      ++stats.refused;
      std::fprintf(stderr, "ghostproxy: smtp: %s refused: %s (kept in the outbox's refused/)\n",
                   r.id.c_str(), r.reply.c_str());
      s = outbox->Refuse(r.id, r.reply);
    } else {
      ++stats.send_failures;
      std::fprintf(stderr, "ghostproxy: smtp: %s not sent, will retry: %s\n", r.id.c_str(), r.reply.c_str());
    }
    if (!s.ok()) std::fprintf(stderr, "ghostproxy: smtp: %s\n", s.ToString().c_str());
  }
  return bytes;
}

void SmtpProxy::Impl::SubscribeModes() {
  NetworkWatch::Handlers h;
  // Mail rides along with traffic that pays for the wake-up anyway (the modes at subscription
  // are the baseline: a card kept in its high-power mode all the time gives no occasion).
  h.on_high = [this] {
    if (!outbox->waiting().empty()) Flush("network card in its high-power mode");
  };
  h.on_flush = [this] {
    if (!outbox->waiting().empty()) Flush("ghostctl flush");
  };
  watch = std::make_unique<NetworkWatch>(base, backend, options.control_path, "smtp", std::move(h));
}

// ---- the listener ----

void SmtpProxy::Impl::Remove(SmtpSession* s) {
  auto it = sessions.find(s);
  if (it == sessions.end()) return;
  std::shared_ptr<SmtpSession> owned(it->second.release());
  sessions.erase(it);
  if (accept_pause) accept_pause->Resume();  // a slot frees on the next turn (else it pauses again)
  // Deferred: the session may be inside its own callback.
  RunSoon(base, [owned = std::move(owned)]() mutable { owned.reset(); });
}

SmtpProxy::Impl::~Impl() {
  alive.reset();
  stop_at.store(SteadyNs() + std::chrono::duration_cast<std::chrono::nanoseconds>(kStopGrace).count());
  if (worker.joinable()) worker.join();
  // Only the outbox part: the daemon ends the open transfer with this connection.
  Apply();
  accept_pause.reset();  // its timer enables the listener
  if (listener) evconnlistener_free(listener);
  sessions.clear();
  if (deadline_timer) event_free(deadline_timer);
}

void SmtpProxy::Impl::OnAccept(evconnlistener*, evutil_socket_t fd, sockaddr*, int, void* arg) {
  auto* self = static_cast<Impl*>(arg);
  auto s = std::make_unique<SmtpSession>(self, fd);
  SmtpSession* raw = s.get();
  self->sessions[raw] = std::move(s);
  ++self->stats.sessions;
}

Result<std::unique_ptr<SmtpProxy>> SmtpProxy::Start(event_base* base, CacheBackend* backend,
                                                    const SmtpProxyOptions& options) {
  if (!options.smtp_listen) return Status::InvalidArgument("no smtp_listen address");
  if (!options.smtp_origin.starts_with("smtp://") && !options.smtp_origin.starts_with("smtps://")) {
    return Status::InvalidArgument("--smtp-origin " + options.smtp_origin +
                                   ": must be smtp://HOST:PORT/ or smtps://HOST:PORT/");
  }
  if (options.outbox.empty())
    return Status::InvalidArgument("--smtp-listen needs --smtp-outbox DIR (where waiting mail is kept)");
  curl_global_init(CURL_GLOBAL_DEFAULT);
  auto impl = std::make_unique<Impl>();
  impl->base = base;
  impl->backend = backend;
  impl->options = options;
  Result<std::unique_ptr<Outbox>> ob = Outbox::Open(options.outbox);
  if (!ob.ok()) return ob.status();
  impl->outbox = std::move(*ob);
  impl->deadline_timer = evtimer_new(base, &Impl::OnDeadline, impl.get());
  sockaddr_storage ss{};
  socklen_t len = options.smtp_listen->ToSockaddr(&ss);
  impl->listener = evconnlistener_new_bind(
      base, &Impl::OnAccept, impl.get(), LEV_OPT_CLOSE_ON_FREE | LEV_OPT_REUSEABLE | LEV_OPT_CLOSE_ON_EXEC,
      -1, reinterpret_cast<const sockaddr*>(&ss), static_cast<int>(len));
  if (!impl->listener) {
    return Status::FromErrno(errno, "smtp_listen " + options.smtp_listen->ToString() +
                                        " (address in use: is another proxy running?)");
  }
  impl->accept_pause = std::make_unique<AcceptPause>(base, "ghostproxy: smtp");
  evconnlistener_set_error_cb(impl->listener, &Impl::OnAcceptError);
  impl->bound = *options.smtp_listen;
  sockaddr_storage got{};
  socklen_t got_len = sizeof got;
  if (getsockname(evconnlistener_get_fd(impl->listener), reinterpret_cast<sockaddr*>(&got), &got_len) == 0) {
    impl->bound.port = ntohs(got.ss_family == AF_INET ? reinterpret_cast<sockaddr_in*>(&got)->sin_port
                                                      : reinterpret_cast<sockaddr_in6*>(&got)->sin6_port);
  }
  impl->SubscribeModes();
  impl->ArmDeadline();  // mail waiting from before a restart
  return std::make_unique<SmtpProxy>(std::move(impl));
}

SmtpProxy::SmtpProxy(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
SmtpProxy::~SmtpProxy() = default;
void SmtpProxy::Flush(const char* why) { impl_->Flush(why); }
const ListenAddress& SmtpProxy::address() const { return impl_->bound; }
const SmtpProxyStats& SmtpProxy::stats() const { return impl_->stats; }

}  // namespace ghost
