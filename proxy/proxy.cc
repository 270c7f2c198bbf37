// Proxy::Impl: the listener, admission (allowlist, connection limit), the pool of idle origin
// connections, counters, the access log and the proxy's own pages. See proxy.h and
// proxy_internal.h.
#include "proxy/proxy.h"

#include <event2/event.h>
#include <ifaddrs.h>
#include <unistd.h>

#include <cassert>
#include <charconv>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <ctime>
#include <nlohmann/json.hpp>

#include "common/http/http_message.h"
#include "proxy/proxy_internal.h"

namespace ghost {
namespace proxy_internal {
namespace {

void IgnoreSigpipeUnlessHandled() {
  struct sigaction old {};
  if (sigaction(SIGPIPE, nullptr, &old) == 0 && old.sa_handler == SIG_DFL) {
    struct sigaction ign {};
    ign.sa_handler = SIG_IGN;
    sigaction(SIGPIPE, &ign, nullptr);
  }
}

std::vector<IpAddress> LocalAddresses() {
  std::vector<IpAddress> out;
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return out;
  for (ifaddrs* i = list; i != nullptr; i = i->ifa_next) {
    if (i->ifa_addr == nullptr) continue;
    const socklen_t len =
        i->ifa_addr->sa_family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
    if (Result<IpAddress> ip = IpAddress::FromSockaddr(i->ifa_addr, len); ip.ok())
      out.push_back(*ip);
  }
  freeifaddrs(list);
  return out;
}

}  // namespace

Impl::Impl(event_base* b, Clock* c, CacheBackend* be, const ProxyOptions& o)
    : base(b), clock(c), backend(be), options(o) {
  resolver->base = base;
  allow = DefaultAllowList();
  allow.insert(allow.end(), options.allow.begin(), options.allow.end());
}

Impl::~Impl() {
  {
    std::lock_guard lock(resolver->mu);
    resolver->alive = false;  // resolver threads still running post nothing now
  }
  alive.reset();
  accept_pause_.reset();  // its timer enables the listener
  listener_.reset();
  // Close every connection; Close() removes it from the map, so walk a copy.
  std::vector<std::shared_ptr<ClientConnection>> all;
  for (auto& [id, c] : connections) all.push_back(c);
  for (auto& c : all) c->Close();
  connections.clear();
  idle_.clear();
}

Status Impl::Listen() {
  sockaddr_storage ss{};
  const socklen_t len = options.listen.ToSockaddr(&ss);
  evconnlistener* l = nullptr;
  if (options.listen_fd >= 0) {
    // Inherited (socket activation): already bound and listening; it may block, libevent
    // needs it non-blocking.
    evutil_make_socket_nonblocking(options.listen_fd);
    l = evconnlistener_new(base, &Impl::OnAccept, this,
                           LEV_OPT_CLOSE_ON_FREE | LEV_OPT_CLOSE_ON_EXEC, /*backlog=*/0,
                           options.listen_fd);
    if (l == nullptr) return Status::FromErrno(errno, "cannot accept on the inherited socket");
  } else {
    l = evconnlistener_new_bind(
        base, &Impl::OnAccept, this,
        LEV_OPT_CLOSE_ON_FREE | LEV_OPT_REUSEABLE | LEV_OPT_CLOSE_ON_EXEC,
        /*backlog=*/-1, reinterpret_cast<const sockaddr*>(&ss), static_cast<int>(len));
  }
  if (l == nullptr) {
    const int err = errno;
    if (err == EADDRINUSE) {
      return Status::Exists(
          "cannot listen on " + options.listen.ToString() +
          ": address in use (is another proxy running? choose another --listen port)");
    }
    return Status::FromErrno(err, "cannot listen on " + options.listen.ToString());
  }
  listener_.reset(l);
  accept_pause_ = std::make_unique<AcceptPause>(base, "ghostproxy: http");
  evconnlistener_set_error_cb(l, &Impl::OnAcceptError);
  // The bound address, with the kernel's port when 0 was asked for.
  sockaddr_storage got{};
  socklen_t got_len = sizeof got;
  bound = options.listen;
  if (getsockname(evconnlistener_get_fd(l), reinterpret_cast<sockaddr*>(&got), &got_len) == 0) {
    if (options.listen_fd >= 0) {
      Result<IpAddress> ip = IpAddress::FromSockaddr(reinterpret_cast<sockaddr*>(&got), got_len);
      if (ip.ok()) bound.host = *ip;
    }
    bound.port = ntohs(got.ss_family == AF_INET ? reinterpret_cast<sockaddr_in*>(&got)->sin_port
                                                : reinterpret_cast<sockaddr_in6*>(&got)->sin6_port);
  }
  if (bound.host.IsUnspecified()) local_addresses_ = LocalAddresses();
  if (options.via_name.empty()) {
    char host[256] = {};
    if (gethostname(host, sizeof host - 1) != 0 || host[0] == '\0')
      std::snprintf(host, sizeof host, "ghostproxy");
    via_name = std::string(host) + ":" + std::to_string(bound.port);
  } else {
    via_name = options.via_name;
  }
  started_ = clock->Now();
  started_unix_ = UnixNow();
  return Status::Ok();
}

void Impl::AppendNumber(std::string* out, long long n, int width, char pad) {
  char digits[24];
  const auto [end, ec] = std::to_chars(digits, digits + sizeof digits, n);
  const int len = static_cast<int>(end - digits);
  if (len < width) out->append(static_cast<std::size_t>(width - len), pad);
  out->append(digits, end);
}

std::int64_t Impl::UnixNow() const {
  if (options.unix_now) return options.unix_now();
  return static_cast<std::int64_t>(std::time(nullptr));
}

bool Impl::IsSelf(std::string_view host, std::uint16_t port) const {
  if (port != bound.port) return false;
  std::optional<IpAddress> ip;
  if (EqualsIgnoreCase(host, "localhost")) {
    // localhost is ours if we listen on a loopback address of either family, or everywhere.
    return bound.host.IsLoopback() || bound.host.IsUnspecified();
  }
  Result<IpAddress> parsed = IpAddress::Parse(host);
  if (!parsed.ok()) return false;
  if (*parsed == bound.host) return true;
  if (bound.host.IsUnspecified()) {
    if (parsed->IsLoopback() || parsed->IsUnspecified()) return true;
    for (const IpAddress& a : local_addresses_) {
      if (a == *parsed) return true;
    }
  }
  return false;
}

bool Impl::ViaHasUs(std::string_view via) const {
  // Via = #( received-protocol RWS received-by [ RWS comment ] ) (RFC 9110 §7.6.3).
  std::size_t i = 0;
  while (i <= via.size()) {
    std::size_t comma = via.find(',', i);
    if (comma == std::string_view::npos) comma = via.size();
    std::string_view element = TrimBlanks(via.substr(i, comma - i));
    const std::size_t sp = element.find_first_of(" \t");
    if (sp != std::string_view::npos) {
      std::string_view by = TrimBlanks(element.substr(sp + 1));
      by = by.substr(0, by.find_first_of(" \t"));
      if (EqualsIgnoreCase(by, via_name)) return true;
    }
    i = comma + 1;
  }
  return false;
}

// Admission, in order: the allowlist (403), the client's own limit (429), the proxy's limit
// (a waiting connection gives up its place, else 503). Every refused connection gets its answer
// (written, flushed, then a lingering close: connection.cc) and holds no place meanwhile; if
// descriptors run out, OnAcceptError pauses accepting until a connection closes, so the kernel's
// backlog holds the rest rather than the proxy dropping them unanswered.
void Impl::OnAccept(evconnlistener*, evutil_socket_t fd, sockaddr* addr, int len, void* arg) {
  auto* self = static_cast<Impl*>(arg);
  Result<IpAddress> peer = IpAddress::FromSockaddr(addr, static_cast<socklen_t>(len));
  if (!peer.ok()) {
    evutil_closesocket(fd);
    return;
  }
  const ProxyOptions& o = self->options;
  const std::string client = peer->ToString();
  int reject = 0;
  if (!IsAllowed(self->allow, *peer)) {
    reject = 403;
    ++self->stats.connections_refused_denied;
  } else if (o.max_connections_per_client > 0 &&
             self->places_per_client[client] >= o.max_connections_per_client) {
    reject = 429;
    ++self->stats.connections_refused_client;
  } else if (self->places_taken >= o.max_connections && !self->PreemptWaiting()) {
    reject = 503;
    ++self->stats.connections_refused_limit;
  } else {
    ++self->stats.connections_accepted;
  }
  if (self->places_per_client[client] == 0) self->places_per_client.erase(client);
  evutil_make_socket_nonblocking(fd);
  const std::uint64_t id = self->next_id_++;
  auto c = std::make_shared<ClientConnection>(self, id, fd, *peer);
  if (reject == 0) {
    c->holds_place_ = true;
    ++self->places_taken;
    ++self->places_per_client[client];
  }
  self->connections.emplace(id, c);
  c->Start(reject);
}

bool Impl::PreemptWaiting() {
  const TimePoint now = clock->Now();
  std::shared_ptr<ClientConnection> oldest;
  for (const auto& [id, c] : connections) {
    if (!c->holds_place_ || c->state_ != ClientConnection::State::kReadingHead) continue;
    if (c->ClientBackedUp()) continue;  // busy sending answers; its next head waits for us
    if (now - c->waiting_since_ < options.preempt_after) continue;
    if (!oldest || c->waiting_since_ < oldest->waiting_since_) oldest = c;
  }
  if (!oldest) return false;
  ++stats.connections_preempted;
  oldest->Preempt();  // releases its place at once, though a 408 may still be going out
  return true;
}

void Impl::ReleasePlace(ClientConnection* c) {
  if (!c->holds_place_) return;
  c->holds_place_ = false;
  assert(places_taken > 0);
  --places_taken;
  auto it = places_per_client.find(c->peer_text_);
  if (it != places_per_client.end() && --it->second == 0) places_per_client.erase(it);
}

void Impl::OnAcceptError(evconnlistener* listener, void* arg) {
  // Out of descriptors: the pending connection would wake us forever. Stop accepting until a
  // connection closes (Remove) or a moment passes (common/base/accept_pause.h).
  static_cast<Impl*>(arg)->accept_pause_->Failed(listener);
}

void Impl::Remove(std::uint64_t id) {
  auto it = connections.find(id);
  if (it == connections.end()) return;
  ReleasePlace(it->second.get());
  connections.erase(it);
  if (accept_pause_) accept_pause_->Resume();
}

std::unique_ptr<OriginConn> Impl::TakeIdle(const std::string& pool_key) {
  auto it = idle_.find(pool_key);
  if (it == idle_.end()) return nullptr;
  std::unique_ptr<OriginConn> conn;
  while (!it->second.empty() && !conn) {
    conn = std::move(it->second.back());  // the most recently used: least likely closed
    it->second.pop_back();
    if (conn->state() != OriginConn::State::kOpen || evbuffer_get_length(conn->input()) != 0)
      conn.reset();
  }
  if (it->second.empty()) idle_.erase(it);
  return conn;
}

void Impl::PutIdle(std::unique_ptr<OriginConn> conn) {
  if (options.max_idle_per_origin == 0 || conn->bev() == nullptr) return;
  conn->SetOwner(nullptr);
  // Idle: watch for the origin closing it, and give up on it after the idle timeout.
  const timeval idle = ToTimeval(options.origin_idle_timeout);
  bufferevent_set_timeouts(conn->bev(), &idle, nullptr);
  bufferevent_setwatermark(conn->bev(), EV_WRITE, 0, 0);
  bufferevent_enable(conn->bev(), EV_READ);
  auto& list = idle_[conn->pool_key()];
  if (list.size() >= options.max_idle_per_origin) list.pop_front();
  list.push_back(std::move(conn));
}

void Impl::DropIdle(OriginConn* conn) {
  auto it = idle_.find(conn->pool_key());
  if (it == idle_.end()) return;
  auto& list = it->second;
  for (auto i = list.begin(); i != list.end(); ++i) {
    if (i->get() == conn) {
      list.erase(i);  // destroys conn
      break;
    }
  }
  if (list.empty()) idle_.erase(it);
}

std::size_t Impl::idle_origin_count() const {
  std::size_t n = 0;
  for (const auto& [key, list] : idle_) n += list.size();
  return n;
}

void Impl::LogAccess(TimePoint start, const std::string& client, ResultCode code, int status,
                     std::uint64_t bytes, const std::string& method, const std::string& url,
                     const std::string& hierarchy, const std::string& content_type) {
  if (!access_log_) return;
  // squid's native format: time elapsed client code/status bytes method URL user hierarchy type
  // ("%lld.%03lld %6lld %s %s/%03d %llu %s %s - %s %s\n"), written without printf: this runs
  // for every request.
  const auto now = std::chrono::system_clock::now().time_since_epoch();
  const long long ms_total = std::chrono::duration_cast<std::chrono::milliseconds>(now).count();
  const long long elapsed = static_cast<long long>(ToMillis(clock->Now() - start));
  std::string& line = log_line_;
  line.clear();
  AppendNumber(&line, ms_total / 1000, 0, ' ');
  line += '.';
  AppendNumber(&line, ms_total % 1000, 3, '0');
  line += ' ';
  AppendNumber(&line, elapsed, 6, ' ');
  line += ' ';
  line += client;
  line += ' ';
  line += ResultName(code);
  line += '/';
  AppendNumber(&line, status, 3, '0');
  line += ' ';
  AppendNumber(&line, static_cast<long long>(bytes), 0, ' ');
  line += ' ';
  line += method.empty() ? std::string_view("-") : std::string_view(method);
  line += ' ';
  if (url.empty()) {
    line += '-';
  } else {
    for (const char ch : url)
      line += static_cast<unsigned char>(ch) <= 0x20 || ch == 0x7f ? '_' : ch;
  }
  line += " - ";
  line += hierarchy;
  line += ' ';
  if (content_type.empty()) {
    line += '-';
  } else {
    for (const char ch : std::string_view(content_type).substr(0, content_type.find(';')))
      line += ch == ' ' ? '_' : ch;
  }
  line += '\n';
  access_log_->Append(line);  // never waits: a full queue drops the line (counted)
  if (!log_flush_pending_) {
    log_flush_pending_ = true;
    if (!log_flush_) log_flush_.reset(event_new(base, -1, 0, &Impl::OnFlushAccessLog, this));
    if (log_flush_) {
      event_active(log_flush_.get(), EV_TIMEOUT, 0);
    } else {
      OnFlushAccessLog(-1, 0, this);  // no event: hand it over now
    }
  }
}

void Impl::OnFlushAccessLog(evutil_socket_t, short, void* arg) {
  auto* self = static_cast<Impl*>(arg);
  self->log_flush_pending_ = false;
  if (self->access_log_) self->access_log_->Submit();
}

std::string Impl::StatusJson() const {
  using nlohmann::json;
  json allow_list = json::array();
  for (const Cidr& c : allow) allow_list.push_back(c.ToString());
  json ports = json::array();
  for (std::uint16_t p : options.connect_ports) ports.push_back(p);
  const ProxyStats& s = stats;
  json j = {
      {"listen", bound.ToString()},
      {"via", via_name},
      {"uptime_s", ToSeconds(clock->Now() - started_)},
      {"started_unix", started_unix_},
      {"allow", allow_list},
      {"connect_ports", ports},
      {"connections",
       {{"open", connections.size()},
        {"max", options.max_connections},
        {"accepted", s.connections_accepted},
        {"max_per_client", options.max_connections_per_client},
        {"refused_limit", s.connections_refused_limit},
        {"refused_client_limit", s.connections_refused_client},
        {"preempted", s.connections_preempted},
        {"refused_denied", s.connections_refused_denied},
        {"timeouts", s.timeouts}}},
      {"requests",
       {{"total", s.requests},
        {"HIT", s.hit},
        {"MEM_HIT", s.mem_hit},
        {"MISS", s.miss},
        {"NET_PREFERRED", s.net_preferred},
        {"REVALIDATED", s.revalidated},
        {"STALE", s.stale},
        {"TUNNEL", s.tunnel},
        {"LOCAL", s.local},
        {"DENIED", s.denied},
        {"ERROR", s.error}}},
      {"ghost_hints", s.ghost_hints},
      {"cache", {{"stores", s.stores}, {"store_failures", s.store_failures}}},
      {"bytes", {{"to_clients", s.bytes_to_clients}, {"from_origins", s.bytes_from_origins}}},
      {"origins",
       {{"connections_opened", s.origin_connections},
        {"reuses", s.origin_reuses},
        {"idle", idle_origin_count()},
        {"transfers_in_progress", transfers_in_progress}}},
      {"shaping", json::parse(ShapingStatusJson(options.shaping, s.shaping))},
  };
  if (access_log_) {
    const AccessLog::Counters c = access_log_->counters();
    j["access_log"] = {{"lines_written", c.lines_written}, {"lines_dropped", c.lines_dropped},
                       {"lines_failed", c.lines_failed}, {"queued_bytes", c.queued_bytes},
                       {"reopens", c.reopens}, {"reopen_failures", c.reopen_failures}};
  }
  return j.dump(2) + "\n";
}

std::string Impl::MetricsText() const {
  const ProxyStats& s = stats;
  std::string out;
  auto metric = [&](const char* name, const char* type, const char* help,
                    std::initializer_list<std::pair<std::string, std::uint64_t>> values) {
    out += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
    for (const auto& [labels, v] : values) {
      out += name + labels + " " + std::to_string(v) + "\n";
    }
  };
  metric("ghostproxy_requests_total", "counter", "Requests answered, by result code.",
         {{"{result=\"HIT\"}", s.hit},
          {"{result=\"MEM_HIT\"}", s.mem_hit},
          {"{result=\"MISS\"}", s.miss},
          {"{result=\"NET_PREFERRED\"}", s.net_preferred},
          {"{result=\"REVALIDATED\"}", s.revalidated},
          {"{result=\"STALE\"}", s.stale},
          {"{result=\"TUNNEL\"}", s.tunnel},
          {"{result=\"LOCAL\"}", s.local},
          {"{result=\"DENIED\"}", s.denied},
          {"{result=\"ERROR\"}", s.error}});
  metric("ghostproxy_connections_open", "gauge", "Client connections open now.",
         {{"", connections.size()}});
  metric("ghostproxy_connections_total", "counter", "Client connections, by outcome at accept.",
         {{"{outcome=\"accepted\"}", s.connections_accepted},
          {"{outcome=\"refused_limit\"}", s.connections_refused_limit},
          {"{outcome=\"refused_client_limit\"}", s.connections_refused_client},
          {"{outcome=\"refused_denied\"}", s.connections_refused_denied}});
  metric("ghostproxy_client_timeouts_total", "counter", "Client connections ended by a timeout.",
         {{"", s.timeouts}});
  metric("ghostproxy_connections_preempted_total", "counter",
         "Connections waiting for a request head, closed at the limit to admit a new one.",
         {{"", s.connections_preempted}});
  metric("ghostproxy_ghost_hints_total", "counter",
         "Cache lookups whose cost-model choice sent the disk a ghost hint.",
         {{"", s.ghost_hints}});
  metric("ghostproxy_cache_stores_total", "counter", "Responses written to the cache, by outcome.",
         {{"{outcome=\"ok\"}", s.stores}, {"{outcome=\"failed\"}", s.store_failures}});
  metric("ghostproxy_bytes_total", "counter", "Bytes sent to clients and received from origins.",
         {{"{direction=\"to_clients\"}", s.bytes_to_clients},
          {"{direction=\"from_origins\"}", s.bytes_from_origins}});
  metric("ghostproxy_origin_connections_total", "counter",
         "Origin connections opened, and requests sent on reused ones.",
         {{"{kind=\"opened\"}", s.origin_connections}, {"{kind=\"reused\"}", s.origin_reuses}});
  metric("ghostproxy_origin_connections_idle", "gauge", "Idle origin connections kept for reuse.",
         {{"", idle_origin_count()}});
  metric("ghostproxy_transfers_in_progress", "gauge",
         "Origin transfers disclosed to the power manager and not yet ended.",
         {{"", transfers_in_progress}});
  if (access_log_) {
    const AccessLog::Counters c = access_log_->counters();
    metric("ghostproxy_access_log_lines_total", "counter",
           "Access-log lines by outcome: written, dropped (the writer's queue was full: the file "
           "was slow or blocked), failed (write error).",
           {{"{outcome=\"written\"}", c.lines_written},
            {"{outcome=\"dropped\"}", c.lines_dropped},
            {"{outcome=\"failed\"}", c.lines_failed}});
  }
  out += ShapingMetricsText(s.shaping);
  if (options.extra_metrics) out += options.extra_metrics();
  return out;
}

}  // namespace proxy_internal

// ---- Proxy ----

Proxy::Proxy(std::unique_ptr<proxy_internal::Impl> impl) : impl_(std::move(impl)) {}

Proxy::~Proxy() = default;

Result<std::unique_ptr<Proxy>> Proxy::Start(event_base* base, Clock* clock, CacheBackend* backend,
                                            const ProxyOptions& options) {
  assert(base != nullptr && clock != nullptr && backend != nullptr);
  auto impl = std::make_unique<proxy_internal::Impl>(base, clock, backend, options);
  proxy_internal::IgnoreSigpipeUnlessHandled();
  if (!options.access_log.empty()) {
    auto log = AccessLog::Open(options.access_log, options.access_log_queue);
    if (!log.ok()) return log.status();
    impl->OpenAccessLog(std::move(*log));
  }
  if (Status s = impl->Listen(); !s.ok()) return s;
  return std::unique_ptr<Proxy>(new Proxy(std::move(impl)));
}

const ListenAddress& Proxy::address() const { return impl_->bound; }
const ProxyStats& Proxy::stats() const { return impl_->stats; }
std::size_t Proxy::open_connections() const { return impl_->connections.size(); }
std::string Proxy::StatusJson() const { return impl_->StatusJson(); }
std::string Proxy::MetricsText() const { return impl_->MetricsText(); }
void Proxy::ReopenAccessLog() {
  if (impl_->access_log() != nullptr) impl_->access_log()->Reopen();
}

}  // namespace ghost
