#include "common/http/http_fetcher.h"

#include <curl/curl.h>
#include <event2/event.h>
#include <sys/socket.h>

#include <array>
#include <cassert>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <type_traits>
#include <utility>

#include "common/http/origin_health.h"

namespace ghost {
namespace {

// The callbacks' signatures must be what curl calls through its variadic setopt.
static_assert(std::is_same_v<CURL, void> && std::is_same_v<CURLM, void>,
              "HttpFetcher's callback signatures assume CURL and CURLM are void");
static_assert(std::is_same_v<curl_socket_t, int>, "curl sockets are ints on this platform");

void InitCurlOnce() {
  static std::once_flag once;
  std::call_once(once, [] {
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) {
      std::fprintf(stderr, "ghost: curl_global_init failed; cannot fetch from HTTP origins\n");
      std::abort();
    }
  });
}

struct EasyDeleter {
  void operator()(CURL* e) const { curl_easy_cleanup(e); }
};
struct SlistDeleter {
  void operator()(curl_slist* l) const { curl_slist_free_all(l); }
};
struct UrlDeleter {
  void operator()(CURLU* u) const { curl_url_cleanup(u); }
};
struct CurlFree {
  void operator()(char* p) const { curl_free(p); }
};

long MillisFor(Duration d) { return static_cast<long>((d.count() + 999) / 1000); }
long WholeSecondsFor(Duration d) { return static_cast<long>((d.count() + 999'999) / 1'000'000); }

bool HasLineBreakOrNul(std::string_view s) {
  return s.find_first_of(std::string_view("\r\n\0", 3)) != std::string_view::npos;
}

// Checks that `url` is an absolute http:// or https:// URL that curl can parse.
Status ValidateUrl(const std::string& url) {
  for (unsigned char c : url) {
    if (c <= 0x20 || c == 0x7f) {
      return Status::InvalidArgument("URL \"" + url +
                                     "\" contains a space or control character; "
                                     "percent-encode it");
    }
  }
  std::unique_ptr<CURLU, UrlDeleter> u(curl_url());
  if (!u) return Status::Internal("curl_url: out of memory");
  if (curl_url_set(u.get(), CURLUPART_URL, url.c_str(), 0) != CURLUE_OK) {
    return Status::InvalidArgument("\"" + url +
                                   "\" is not an absolute URL; use http://host/path or "
                                   "https://host/path");
  }
  char* raw_scheme = nullptr;
  if (curl_url_get(u.get(), CURLUPART_SCHEME, &raw_scheme, 0) != CURLUE_OK || !raw_scheme) {
    return Status::InvalidArgument("\"" + url + "\" has no scheme; use http:// or https://");
  }
  std::unique_ptr<char, CurlFree> scheme(raw_scheme);
  if (!EqualsIgnoreCase(scheme.get(), "http") && !EqualsIgnoreCase(scheme.get(), "https")) {
    return Status::InvalidArgument("\"" + url + "\": scheme \"" + std::string(scheme.get()) +
                                   "\" is not supported; only http:// and https:// URLs are");
  }
  return Status::Ok();
}

// True when the head just completed is the final answer: not a 1xx, and not a redirect that
// curl will follow (3xx other than 304 with a Location). If the guess says "redirect" and curl
// does not follow after all, the head is delivered late (first body byte or completion).
bool LooksFinal(const HttpResponseHead& head) {
  if (head.status < 200) return false;
  if (head.status >= 300 && head.status < 400 && head.status != 304 &&
      head.Find("Location") != nullptr) {
    return false;
  }
  return true;
}

}  // namespace

// One fetch. Owned by HttpFetcher::transfers_; curl's callbacks get a raw pointer (PRIVATE,
// HEADERDATA, WRITEDATA) that stays valid while the easy handle is attached.
struct HttpFetcher::Transfer {
  HttpFetcher* owner = nullptr;
  FetchId id = 0;
  State state = State::kQueued;
  bool attached = false;  // in the multi handle
  HttpRequest request;
  Callbacks callbacks;
  std::unique_ptr<CURL, EasyDeleter> easy;
  std::unique_ptr<curl_slist, SlistDeleter> headers;
  std::array<char, CURL_ERROR_SIZE> error{};
  HttpResponseHead head;
  bool head_delivered = false;
  bool paused = false;  // receiving paused (Pause)
  Status failure;  // why we aborted it ourselves (receiver's refusal, a throw), or kFailed's
  int socket_errno = 0;  // socket(2)'s errno when curl could not open one (EMFILE: OnCurlOpenSocket)
};

// One socket curl asked us to watch; freed on CURL_POLL_REMOVE or with the fetcher.
struct HttpFetcher::SocketWatch {
  HttpFetcher* owner = nullptr;
  int fd = -1;
  short kind = 0;  // EV_READ | EV_WRITE currently watched
  event* ev = nullptr;
  ~SocketWatch() {
    if (ev) event_free(ev);
  }
};

namespace {

// Marks the time spent inside a curl callback, where curl forbids adding or removing handles.
class CallbackScope {
 public:
  explicit CallbackScope(int* depth) : depth_(depth) { ++*depth_; }
  ~CallbackScope() { --*depth_; }
  CallbackScope(const CallbackScope&) = delete;
  CallbackScope& operator=(const CallbackScope&) = delete;

 private:
  int* depth_;
};

}  // namespace

HttpFetcher::HttpFetcher(event_base* base, const HttpFetcherOptions& options)
    : base_(base), options_(options) {
  assert(base_ != nullptr);
  InitCurlOnce();
  multi_ = curl_multi_init();
  timer_ev_ = evtimer_new(base_, &HttpFetcher::OnTimerEvent, this);
  deferred_ev_ = event_new(base_, -1, 0, &HttpFetcher::OnDeferredEvent, this);
  if (!multi_ || !timer_ev_ || !deferred_ev_) {
    std::fprintf(stderr, "ghost: HttpFetcher: out of memory creating curl/libevent handles\n");
    std::abort();
  }
  curl_multi_setopt(multi_, CURLMOPT_SOCKETFUNCTION, &HttpFetcher::OnCurlSocket);
  curl_multi_setopt(multi_, CURLMOPT_SOCKETDATA, this);
  curl_multi_setopt(multi_, CURLMOPT_TIMERFUNCTION, &HttpFetcher::OnCurlTimer);
  curl_multi_setopt(multi_, CURLMOPT_TIMERDATA, this);
  curl_multi_setopt(multi_, CURLMOPT_MAX_HOST_CONNECTIONS,
                    static_cast<long>(options_.max_connections_per_host));
  curl_multi_setopt(multi_, CURLMOPT_MAX_TOTAL_CONNECTIONS,
                    static_cast<long>(options_.max_total_connections));
  curl_multi_setopt(multi_, CURLMOPT_MAXCONNECTS,
                    static_cast<long>(options_.connection_cache_size));
}

HttpFetcher::~HttpFetcher() {
  assert(callback_depth_ == 0 && "HttpFetcher destroyed inside one of its callbacks");
  for (auto& [id, t] : transfers_) {
    if (t->attached) {
      curl_multi_remove_handle(multi_, t->easy.get());
      t->attached = false;
    }
  }
  transfers_.clear();
  curl_multi_cleanup(multi_);  // closes kept-alive connections; may still call OnCurlSocket
  multi_ = nullptr;
  for (SocketWatch* w : watches_) delete w;
  watches_.clear();
  event_free(timer_ev_);
  event_free(deferred_ev_);
}

FetchId HttpFetcher::Fetch(HttpRequest request, Callbacks callbacks) {
  const FetchId id = next_id_++;
  auto owned = std::make_unique<Transfer>();
  Transfer& t = *owned;
  t.owner = this;
  t.id = id;
  t.request = std::move(request);
  t.callbacks = std::move(callbacks);
  transfers_.emplace(id, std::move(owned));

  Status configured = Configure(t);
  if (!configured.ok()) {
    t.state = State::kFailed;
    t.failure = configured;
    t.easy.reset();
    to_fail_.push_back(id);
    ScheduleDeferred();
    return id;
  }
  t.state = State::kQueued;
  if (callback_depth_ > 0) {
    to_attach_.push_back(id);
    ScheduleDeferred();
  } else {
    Attach(t);
  }
  return id;
}

bool HttpFetcher::Cancel(FetchId id) {
  auto it = transfers_.find(id);
  if (it == transfers_.end()) return false;
  Transfer& t = *it->second;
  switch (t.state) {
    case State::kCancelled:
      return false;
    case State::kFinishing:
      // Its late on_head is running (Finish frees it when that returns, without on_done).
      t.state = State::kCancelled;
      return true;
    case State::kQueued:
    case State::kFailed:
      // Not in curl, and none of its callbacks is running: free it now (the deferred lists
      // hold only its id).
      transfers_.erase(it);
      return true;
    case State::kRunning:
      t.state = State::kCancelled;
      if (callback_depth_ > 0) {
        // Inside a curl callback (maybe this fetch's own): curl forbids removing a handle
        // here, and the callback's frame may still use the transfer. Reap on the next turn;
        // until then its curl callbacks return "abort" without calling the receiver.
        to_reap_.push_back(id);
        ScheduleDeferred();
      } else {
        Reap(id);
      }
      return true;
  }
  return false;
}

bool HttpFetcher::Pause(FetchId id, bool paused) {
  auto it = transfers_.find(id);
  if (it == transfers_.end() || it->second->state != State::kRunning) return false;
  Transfer& t = *it->second;
  if (t.paused == paused) return true;
  t.paused = paused;
  if (paused) {
    curl_easy_pause(t.easy.get(), CURLPAUSE_RECV);
  } else {
    // Unpausing may hand over buffered bytes at once: not inside the caller's frame.
    to_resume_.push_back(id);
    ScheduleDeferred();
  }
  return true;
}

std::size_t HttpFetcher::active() const {
  std::size_t n = 0;
  for (const auto& [id, t] : transfers_) {
    if (t->state != State::kCancelled) ++n;
  }
  return n;
}

Status HttpFetcher::Configure(Transfer& t) {
  const HttpRequest& r = t.request;
  Status url_ok = ValidateUrl(r.url);
  if (!url_ok.ok()) return url_ok;
  if (r.range && r.range->first > r.range->second) {
    return Status::InvalidArgument("range " + std::to_string(r.range->first) + "-" +
                                   std::to_string(r.range->second) + " for " + r.url +
                                   " has first > last");
  }
  if (HasLineBreakOrNul(r.if_none_match) || HasLineBreakOrNul(r.if_modified_since) ||
      HasLineBreakOrNul(r.if_range)) {
    return Status::InvalidArgument("conditional header for " + r.url +
                                   " contains a line break or NUL");
  }

  t.easy.reset(curl_easy_init());
  if (!t.easy) return Status::Internal("curl_easy_init failed for " + r.url);
  CURL* e = t.easy.get();
  curl_slist* list = nullptr;
  auto add_header = [&](const std::string& line) -> bool {
    curl_slist* grown = curl_slist_append(list, line.c_str());
    if (!grown) return false;
    list = grown;
    return true;
  };
  bool ok = true;
  if (!r.if_none_match.empty()) ok = ok && add_header("If-None-Match: " + r.if_none_match);
  if (!r.if_range.empty() && r.range) ok = ok && add_header("If-Range: " + r.if_range);
  if (!r.if_modified_since.empty()) {
    ok = ok && add_header("If-Modified-Since: " + r.if_modified_since);
  }
  t.headers.reset(list);
  if (!ok) return Status::Internal("out of memory building headers for " + r.url);

  CURLcode rc = CURLE_OK;
  auto set = [&](CURLoption opt, auto value) {
    if (rc == CURLE_OK) rc = curl_easy_setopt(e, opt, value);
  };
  set(CURLOPT_URL, r.url.c_str());
  set(CURLOPT_NOSIGNAL, 1L);
  set(CURLOPT_PRIVATE, static_cast<void*>(&t));
  set(CURLOPT_ERRORBUFFER, t.error.data());
  set(CURLOPT_HEADERFUNCTION, &HttpFetcher::OnCurlHeader);
  set(CURLOPT_HEADERDATA, static_cast<void*>(&t));
  set(CURLOPT_WRITEFUNCTION, &HttpFetcher::OnCurlWrite);
  set(CURLOPT_WRITEDATA, static_cast<void*>(&t));
  // curl reports a socket(2) that failed as CURLE_COULDNT_CONNECT with no errno
  // (CURLINFO_OS_ERRNO 0): out of descriptors looked like an origin refusing connections,
  // readers got ENOTCONN and the log said "check that the origin is up" (round 20, helper
  // adv20). The errno is kept for StatusFor.
  curl_opensocket_callback open_socket = [](void* arg, curlsocktype,
                                            curl_sockaddr* a) -> curl_socket_t {
    const int fd = ::socket(a->family, a->socktype, a->protocol);
    if (fd < 0) static_cast<Transfer*>(arg)->socket_errno = errno;
    return fd < 0 ? CURL_SOCKET_BAD : fd;
  };
  set(CURLOPT_OPENSOCKETFUNCTION, open_socket);
  set(CURLOPT_OPENSOCKETDATA, static_cast<void*>(&t));
  set(CURLOPT_PROTOCOLS_STR, "http,https");
  set(CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
  set(CURLOPT_FOLLOWLOCATION, 1L);
  set(CURLOPT_MAXREDIRS, static_cast<long>(options_.max_redirects));
  set(CURLOPT_SUPPRESS_CONNECT_HEADERS, 1L);
  set(CURLOPT_CONNECTTIMEOUT_MS, MillisFor(options_.connect_timeout));
  if (options_.low_speed_time > Duration::zero()) {
    set(CURLOPT_LOW_SPEED_LIMIT, static_cast<long>(options_.low_speed_limit));
    set(CURLOPT_LOW_SPEED_TIME, WholeSecondsFor(options_.low_speed_time));
  }
  if (options_.total_timeout > Duration::zero()) {
    set(CURLOPT_TIMEOUT_MS, MillisFor(options_.total_timeout));
  }
  if (!options_.user_agent.empty()) set(CURLOPT_USERAGENT, options_.user_agent.c_str());
  if (!options_.ca_info.empty()) set(CURLOPT_CAINFO, options_.ca_info.c_str());
  if (!options_.ca_path.empty()) set(CURLOPT_CAPATH, options_.ca_path.c_str());
  set(CURLOPT_SSL_VERIFYPEER, options_.verify_peer ? 1L : 0L);
  set(CURLOPT_SSL_VERIFYHOST, options_.verify_peer ? 2L : 0L);
  if (r.head) set(CURLOPT_NOBODY, 1L);
  std::string range;
  if (r.range) {
    range = std::to_string(r.range->first) + "-" + std::to_string(r.range->second);
    set(CURLOPT_RANGE, range.c_str());  // curl copies string options
  }
  if (t.headers) set(CURLOPT_HTTPHEADER, t.headers.get());
  if (rc != CURLE_OK) {
    return Status::Internal("configuring curl for " + r.url + ": " + curl_easy_strerror(rc));
  }
  return Status::Ok();
}

void HttpFetcher::Attach(Transfer& t) {
  assert(callback_depth_ == 0 && t.state == State::kQueued);
  CURLMcode rc = curl_multi_add_handle(multi_, t.easy.get());
  if (rc != CURLM_OK) {
    t.state = State::kFailed;
    t.failure = Status::Internal("curl_multi_add_handle for " + t.request.url + ": " +
                                 curl_multi_strerror(rc));
    to_fail_.push_back(t.id);
    ScheduleDeferred();
    return;
  }
  t.attached = true;
  t.state = State::kRunning;
}

void HttpFetcher::Reap(FetchId id) {
  assert(callback_depth_ == 0);
  auto it = transfers_.find(id);
  if (it == transfers_.end() || it->second->state != State::kCancelled) return;
  if (it->second->attached) curl_multi_remove_handle(multi_, it->second->easy.get());
  transfers_.erase(it);
}

void HttpFetcher::AssertInvariants() const {
#ifndef NDEBUG
  for (const auto& [id, t] : transfers_) {
    assert(t->id == id && t->owner == this);
    // Only a running transfer (or one cancelled while running, awaiting its reaping) is in curl.
    assert(!t->attached || t->state == State::kRunning || t->state == State::kCancelled);
    assert(t->state != State::kRunning || t->attached);
    assert(t->state != State::kFailed || !t->failure.ok());
  }
  assert(callback_depth_ >= 0);
  // Deferred work always has the deferred event on its way.
  assert(deferred_scheduled_ || (to_attach_.empty() && to_fail_.empty() && to_reap_.empty()));
#endif
}

void HttpFetcher::ScheduleDeferred() {
  if (deferred_scheduled_) return;
  deferred_scheduled_ = true;
  event_active(deferred_ev_, EV_TIMEOUT, 0);  // runs on the loop's next turn; never "added"
}

void HttpFetcher::RunDeferred() {
  deferred_scheduled_ = false;
  std::vector<FetchId> reap = std::move(to_reap_);
  std::vector<FetchId> attach = std::move(to_attach_);
  std::vector<FetchId> fail = std::move(to_fail_);
  to_reap_.clear();
  to_attach_.clear();
  to_fail_.clear();
  for (FetchId id : reap) Reap(id);
  std::vector<FetchId> resume = std::move(to_resume_);
  to_resume_.clear();
  for (FetchId id : resume) {
    auto it = transfers_.find(id);
    if (it == transfers_.end() || it->second->state != State::kRunning || it->second->paused) continue;
    curl_easy_pause(it->second->easy.get(), CURLPAUSE_CONT);
  }
  for (FetchId id : attach) {
    auto it = transfers_.find(id);
    if (it != transfers_.end() && it->second->state == State::kQueued) Attach(*it->second);
  }
  for (FetchId id : fail) {
    auto it = transfers_.find(id);
    if (it == transfers_.end() || it->second->state != State::kFailed) continue;
    std::unique_ptr<Transfer> t = std::move(it->second);
    transfers_.erase(it);
    if (t->callbacks.on_done) t->callbacks.on_done(t->failure);
  }
  AssertInvariants();
}

void HttpFetcher::SocketAction(int fd, int curl_events) {
  int running = 0;
  curl_multi_socket_action(multi_, fd, curl_events, &running);
  ProcessCompletions();
  AssertInvariants();
}

void HttpFetcher::ProcessCompletions() {
  int left = 0;
  while (CURLMsg* msg = curl_multi_info_read(multi_, &left)) {
    if (msg->msg != CURLMSG_DONE) continue;
    CURL* easy = msg->easy_handle;
    const CURLcode code = msg->data.result;
    void* priv = nullptr;
    curl_easy_getinfo(easy, CURLINFO_PRIVATE, &priv);
    auto* t = static_cast<Transfer*>(priv);
    assert(t != nullptr && t->attached);
    curl_multi_remove_handle(multi_, easy);  // also drops any other message of this handle
    t->attached = false;
    long connects = 0;
    if (curl_easy_getinfo(easy, CURLINFO_NUM_CONNECTS, &connects) == CURLE_OK && connects > 0) {
      connections_opened_ += static_cast<std::uint64_t>(connects);
    }
    if (t->state == State::kCancelled) {
      transfers_.erase(t->id);
      continue;
    }
    Finish(t, code);  // may run receiver code that fetches or cancels (we are at depth 0)
  }
}

void HttpFetcher::Finish(Transfer* t, int curl_code) {
  assert(t->state == State::kRunning && !t->attached);
  t->state = State::kFinishing;
  Status status = StatusFor(*t, curl_code);
  if (status.ok() && !t->head_delivered) {
    // A response without body bytes (HEAD, 304, empty file) or a late head (see LooksFinal).
    bool go = false;
    try {
      go = DeliverHead(*t);
    } catch (const std::exception& e) {
      t->failure = Status::Internal(t->request.url + ": on_head threw: " + e.what());
    } catch (...) {
      t->failure = Status::Internal(t->request.url + ": on_head threw");
    }
    if (t->state == State::kCancelled) {  // Cancel from inside on_head
      transfers_.erase(t->id);
      return;
    }
    if (!go) status = t->failure;
  }
  auto it = transfers_.find(t->id);
  std::unique_ptr<Transfer> owned = std::move(it->second);
  transfers_.erase(it);  // Cancel from on_done finds nothing: the fetch is over
  if (options_.on_finish) {
    options_.on_finish(owned->request, owned->head_delivered ? owned->head.status : 0, status);
  }
  if (owned->callbacks.on_done) owned->callbacks.on_done(status);
}

bool HttpFetcher::DeliverHead(Transfer& t) {
  t.head_delivered = true;
  char* url = nullptr;
  if (curl_easy_getinfo(t.easy.get(), CURLINFO_EFFECTIVE_URL, &url) == CURLE_OK && url) {
    t.head.effective_url = url;
  }
  if (t.head.status == 0) {
    long code = 0;
    curl_easy_getinfo(t.easy.get(), CURLINFO_RESPONSE_CODE, &code);
    t.head.status = static_cast<int>(code);
  }
  t.head.Finish();
  if (!t.callbacks.on_head) return true;
  const bool go = t.callbacks.on_head(t.head);
  if (t.state == State::kCancelled) return false;
  if (!go) {
    t.failure = Status::IoError(t.request.url + ": aborted by the receiver (on_head)");
    return false;
  }
  return true;
}

Status HttpFetcher::StatusFor(const Transfer& t, int curl_code) const {
  if (!t.failure.ok()) return t.failure;
  const auto code = static_cast<CURLcode>(curl_code);
  if (code == CURLE_OK) return Status::Ok();
  const std::string what = std::string(t.request.head ? "HEAD " : "GET ") + t.request.url;
  const std::string detail =
      t.error[0] != '\0' ? std::string(t.error.data()) : std::string(curl_easy_strerror(code));
  switch (code) {
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_COULDNT_RESOLVE_PROXY:
      // No such host (a typo in the URL, or no DNS): nothing can reach it.
      return Status::Unavailable(what + ": " + detail +
                                 "; check the host name in the URL and the network")
          .WithErrno(EHOSTUNREACH);
    case CURLE_COULDNT_CONNECT: {
      // No socket at all: this process's limits, not the origin (OriginHealth keeps it up).
      if (IsLocalResourceErrno(t.socket_errno)) {
        return Status::FromErrno(t.socket_errno, what + ": cannot open a socket (the process's "
                                                        "descriptor limit, `ulimit -n`?)");
      }
      // The socket's own errno: ECONNREFUSED (nothing listens), EHOSTUNREACH, ENETUNREACH.
      long os_errno = 0;
      curl_easy_getinfo(t.easy.get(), CURLINFO_OS_ERRNO, &os_errno);
      return Status::Unavailable(what + ": " + detail +
                                 "; check that the origin is up and the network is reachable")
          .WithErrno(os_errno == ECONNREFUSED || os_errno == EHOSTUNREACH ||
                             os_errno == ENETUNREACH
                         ? static_cast<int>(os_errno)
                         : ECONNREFUSED);
    }
    case CURLE_OPERATION_TIMEDOUT:
      return Status::TimedOut(what + ": " + detail +
                              "; the origin is slow or unreachable (see connect_timeout and "
                              "the stall limits)");
    case CURLE_PARTIAL_FILE:
      return Status::Corruption(what + ": connection closed mid-body: " + detail);
    case CURLE_WEIRD_SERVER_REPLY:
    case CURLE_BAD_CONTENT_ENCODING:
      return Status::Corruption(what + ": malformed reply: " + detail);
    case CURLE_RECV_ERROR:
      // curl reports a broken chunked encoding as a receive error; only its text tells.
      if (detail.find("chunk") != std::string::npos) {
        return Status::Corruption(what + ": malformed reply: " + detail);
      }
      return Status::IoError(what + ": " + detail);
    case CURLE_UNSUPPORTED_PROTOCOL: {
      // Our scheme check passed, so this is either a redirect to another scheme or a reply
      // that is not HTTP at all (curl calls it HTTP/0.9 and refuses it).
      long redirects = 0;
      curl_easy_getinfo(t.easy.get(), CURLINFO_REDIRECT_COUNT, &redirects);
      if (redirects > 0) {
        return Status::NotSupported(what + ": redirected to an unsupported scheme: " + detail);
      }
      return Status::Corruption(what + ": the reply is not HTTP: " + detail);
    }
    case CURLE_URL_MALFORMAT:
      return Status::InvalidArgument(what + ": " + detail);
    case CURLE_OUT_OF_MEMORY:
      return Status::Internal(what + ": " + detail);
    default:
      return Status::IoError(what + ": " + detail);
  }
}

// ---- C entry points ----

int HttpFetcher::OnCurlSocket(void* /*easy*/, int fd, int what, void* self_arg,
                              void* watch_arg) noexcept {
  auto* self = static_cast<HttpFetcher*>(self_arg);
  auto* w = static_cast<SocketWatch*>(watch_arg);
  if (what == CURL_POLL_REMOVE) {
    if (w) {
      self->watches_.erase(w);
      delete w;  // event_free: safe even from inside this socket's own event callback
    }
    return 0;
  }
  const short kind = static_cast<short>(((what & CURL_POLL_IN) ? EV_READ : 0) |
                                        ((what & CURL_POLL_OUT) ? EV_WRITE : 0));
  if (!w) {
    auto fresh = std::make_unique<SocketWatch>();
    fresh->owner = self;
    fresh->fd = fd;
    fresh->ev = event_new(self->base_, fd, static_cast<short>(kind | EV_PERSIST),
                          &HttpFetcher::OnSocketEvent, fresh.get());
    if (!fresh->ev) return -1;  // curl fails the transfer
    if (curl_multi_assign(self->multi_, fd, fresh.get()) != CURLM_OK) return -1;
    w = fresh.release();
    self->watches_.insert(w);
  } else if (w->kind == kind) {
    return 0;
  } else {
    event_del(w->ev);
    event_assign(w->ev, self->base_, fd, static_cast<short>(kind | EV_PERSIST),
                 &HttpFetcher::OnSocketEvent, w);
  }
  w->kind = kind;
  if (kind != 0) event_add(w->ev, nullptr);
  return 0;
}

int HttpFetcher::OnCurlTimer(void* /*multi*/, long timeout_ms, void* self_arg) noexcept {
  auto* self = static_cast<HttpFetcher*>(self_arg);
  if (timeout_ms < 0) {
    evtimer_del(self->timer_ev_);
    return 0;
  }
  // Never call curl back from here (re-entry); a zero timeout runs on the loop's next turn.
  timeval tv{static_cast<time_t>(timeout_ms / 1000),
             static_cast<suseconds_t>((timeout_ms % 1000) * 1000)};
  return evtimer_add(self->timer_ev_, &tv) == 0 ? 0 : -1;
}

void HttpFetcher::OnSocketEvent(int fd, short what, void* watch_arg) noexcept {
  // The watch may be freed inside SocketAction (CURL_POLL_REMOVE): copy what we need first.
  HttpFetcher* self = static_cast<SocketWatch*>(watch_arg)->owner;
  const int flags =
      ((what & EV_READ) ? CURL_CSELECT_IN : 0) | ((what & EV_WRITE) ? CURL_CSELECT_OUT : 0);
  self->SocketAction(fd, flags);
}

void HttpFetcher::OnTimerEvent(int /*fd*/, short /*what*/, void* self_arg) noexcept {
  static_cast<HttpFetcher*>(self_arg)->SocketAction(CURL_SOCKET_TIMEOUT, 0);
}

void HttpFetcher::OnDeferredEvent(int /*fd*/, short /*what*/, void* self_arg) noexcept {
  static_cast<HttpFetcher*>(self_arg)->RunDeferred();
}

std::size_t HttpFetcher::OnCurlHeader(char* data, std::size_t size, std::size_t n,
                                      void* t_arg) noexcept {
  auto* t = static_cast<Transfer*>(t_arg);
  const std::size_t len = size * n;
  if (t->state == State::kCancelled) return 0;
  if (t->head_delivered) return len;  // trailers of a chunked body: not part of the head
  CallbackScope scope(&t->owner->callback_depth_);
  try {
    const std::string_view line(data, len);
    t->head.AddHeaderLine(line);
    const bool blank = line == "\r\n" || line == "\n";
    if (blank && t->head.status != 0 && LooksFinal(t->head)) {
      return t->owner->DeliverHead(*t) ? len : 0;
    }
    return len;
  } catch (const std::exception& e) {
    t->failure = Status::Internal(t->request.url + ": on_head threw: " + e.what());
  } catch (...) {
    t->failure = Status::Internal(t->request.url + ": on_head threw");
  }
  return 0;
}

std::size_t HttpFetcher::OnCurlWrite(char* data, std::size_t size, std::size_t n,
                                     void* t_arg) noexcept {
  auto* t = static_cast<Transfer*>(t_arg);
  const std::size_t len = size * n;
  if (t->state == State::kCancelled) return 0;
  CallbackScope scope(&t->owner->callback_depth_);
  try {
    if (!t->head_delivered && !t->owner->DeliverHead(*t)) return 0;
    if (!t->callbacks.on_data || len == 0) return len;
    const bool go = t->callbacks.on_data(std::string_view(data, len));
    if (t->state == State::kCancelled) return 0;
    if (!go) {
      t->failure = Status::IoError(t->request.url + ": aborted by the receiver (on_data)");
      return 0;
    }
    return len;
  } catch (const std::exception& e) {
    t->failure = Status::Internal(t->request.url + ": a callback threw: " + e.what());
  } catch (...) {
    t->failure = Status::Internal(t->request.url + ": a callback threw");
  }
  return 0;
}

}  // namespace ghost
