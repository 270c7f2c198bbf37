// OriginConn: one TCP connection from the proxy to an origin (or a tunnel's far end).
//
//   kResolving ──addresses──▶ kConnecting ──connected──▶ kOpen ──error/timeout──▶ kFailed
//        │                      │   ▲                      │
//        │ no address           │   │ next address         └─ EOF: reported, stays kOpen
//        ▼                      ▼   │ (refused, timeout)
//     kFailed ◀───── none left ─┘───┘
//
// Names are resolved by the system's getaddrinfo (so /etc/hosts and nsswitch apply as for every
// other program) on a short-lived thread of their own, which posts the addresses to the loop;
// IP literals need no lookup. (libevent's evdns was the alternative; it probes a nameserver
// that stopped answering on a timer that keeps running while the proxy is idle, which an
// offline laptop would pay for in wake-ups.) A lookup that takes longer than the connect timeout
// fails. Every address is tried in turn. Events go to the owning ClientConnection, or, for a
// pooled connection, to the pool, which drops the connection on anything but silence.
#include <event2/event.h>
#include <event2/util.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <cstring>
#include <string_view>
#include <thread>

#include "common/http/http_message.h"
#include "proxy/proxy_internal.h"

namespace ghost::proxy_internal {
namespace {

std::string FormatSockaddr(const sockaddr_storage& ss) {
  Result<IpAddress> ip = IpAddress::FromSockaddr(reinterpret_cast<const sockaddr*>(&ss), sizeof ss);
  if (!ip.ok()) return "?";
  return ip->ToString();
}

// RFC 6761 §6.4: "invalid" and the names under it never resolve, and name resolution APIs
// should answer so at once. getaddrinfo asks the configured nameservers anyway (a query that
// leaves the machine, and waits on an offline one), so the proxy answers them itself.
bool IsInvalidName(std::string_view host) {
  if (!host.empty() && host.back() == '.') host.remove_suffix(1);
  constexpr std::string_view kInvalid = "invalid";
  if (host.size() < kInvalid.size()) return false;
  const std::string_view tld = host.substr(host.size() - kInvalid.size());
  if (!EqualsIgnoreCase(tld, kInvalid)) return false;
  return host.size() == kInvalid.size() || host[host.size() - kInvalid.size() - 1] == '.';
}

socklen_t SockaddrLength(const sockaddr_storage& ss) {
  return ss.ss_family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
}

}  // namespace

// A name being resolved. The resolver thread fills `error` and `addresses`, then posts this to
// the loop; `conn` is read and cleared only on the loop (cleared when the connection gives up
// on the lookup, and then the callback only frees this).
struct OriginConn::Resolve {
  OriginConn* conn = nullptr;
  int error = 0;
  std::vector<sockaddr_storage> addresses;
};

OriginConn::OriginConn(Impl* proxy, std::string host, std::uint16_t port)
    : proxy_(proxy),
      host_(std::move(host)),
      port_(port),
      pool_key_(host_ + ":" + std::to_string(port)),
      deferred_(proxy->clock),
      resolve_timer_(proxy->clock) {}

OriginConn::~OriginConn() {
  if (resolve_ != nullptr) resolve_->conn = nullptr;  // the posted result only frees itself
}

void OriginConn::SetOwner(ClientConnection* owner) {
  if (owner == nullptr) {
    StopShaping();
    read_paused_ = false;
  }
  owner_ = owner;
}

void OriginConn::StartShaping(Bytes size) {
  ShapingOptions o = proxy_->options.shaping;
  if (shaper_ || !bev_ || state_ != State::kOpen || o.mode == ShapeMode::kOff) return;
  if (!o.knob_fixed) {
    if (std::optional<int> k = proxy_->backend->DaemonKnob()) o.knob = *k;
  }
  // A buffer fixed before connect (--plain-rcvbuf) holds plain TCP to its window.
  const bool fixed = o.plain_buffer > 0;
  shaper_ = std::make_unique<UpstreamShaper>(proxy_->clock, bev_.get(), o, size, fixed,
                                             &proxy_->stats.shaping, handshake_rtt_);
  shaper_->SetCardBackend(proxy_->backend);
  if (read_paused_) shaper_->SetPaused(true);
}

void OriginConn::StopShaping() { shaper_.reset(); }  // reads again unless paused

void OriginConn::PauseReading(bool paused) {
  read_paused_ = paused;
  if (shaper_) {
    shaper_->SetPaused(paused);
  } else if (paused) {
    bufferevent_disable(bev_.get(), EV_READ);
  } else {
    bufferevent_enable(bev_.get(), EV_READ);
  }
}

void OriginConn::Connect() {
  in_connect_ = true;
  state_ = State::kResolving;
  // An IP literal needs no resolver.
  if (Result<IpAddress> ip = IpAddress::Parse(host_); ip.ok()) {
    ListenAddress a{*ip, port_};
    sockaddr_storage ss{};
    a.ToSockaddr(&ss);
    addresses_.push_back(ss);
    TryNextAddress();
    in_connect_ = false;
    return;
  }
  if (IsInvalidName(host_)) {
    Fail(Status::Unavailable("cannot resolve host \"" + host_ +
                             "\": names under .invalid never resolve (RFC 6761)"));
    in_connect_ = false;  // Fail deferred the event: the owner hears of it on the next turn
    return;
  }
  auto* r = new Resolve;
  r->conn = this;
  resolve_ = r;
  resolve_timer_.Arm(proxy_->options.connect_timeout, [this] {
    resolve_->conn = nullptr;  // its result, when it comes, only frees itself
    resolve_ = nullptr;
    Fail(Status::TimedOut("resolving host \"" + host_ + "\" took longer than " +
                          DurationText(proxy_->options.connect_timeout)));
  });
  std::thread([shared = proxy_->resolver, r, host = host_, port = std::to_string(port_)] {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_protocol = IPPROTO_TCP;
    addrinfo* res = nullptr;
    r->error = ::getaddrinfo(host.c_str(), port.c_str(), &hints, &res);
    for (addrinfo* ai = res; r->error == 0 && ai != nullptr; ai = ai->ai_next) {
      if ((ai->ai_family == AF_INET || ai->ai_family == AF_INET6) &&
          ai->ai_addrlen <= sizeof(sockaddr_storage)) {
        sockaddr_storage ss{};
        std::memcpy(&ss, ai->ai_addr, ai->ai_addrlen);
        r->addresses.push_back(ss);
      }
    }
    if (res != nullptr) ::freeaddrinfo(res);
    std::lock_guard lock(shared->mu);
    if (!shared->alive) return;  // the proxy is gone (r leaks, at exit only)
    const timeval now{0, 0};
    event_base_once(shared->base, -1, EV_TIMEOUT, &OriginConn::OnResolved, r, &now);
  }).detach();
  in_connect_ = false;
}

void OriginConn::OnResolved(evutil_socket_t, short, void* arg) {
  std::unique_ptr<Resolve> r(static_cast<Resolve*>(arg));
  OriginConn* self = r->conn;
  if (self == nullptr) return;  // the connection gave up on it
  self->resolve_ = nullptr;
  self->resolve_timer_.Cancel();
  if (r->error != 0) {
    self->Fail(Status::Unavailable("cannot resolve host \"" + self->host_ +
                                   "\": " + ::gai_strerror(r->error)));
    return;
  }
  if (r->addresses.empty()) {
    self->Fail(Status::Unavailable("host \"" + self->host_ + "\" has no IPv4 or IPv6 address"));
    return;
  }
  self->addresses_ = std::move(r->addresses);
  self->TryNextAddress();
}

void OriginConn::TryNextAddress() {
  while (next_address_ < addresses_.size()) {
    const sockaddr_storage& ss = addresses_[next_address_++];
    evutil_socket_t fd = -1;
    if (proxy_->options.shaping.plain_buffer > 0) {
      // --plain-rcvbuf: the paper's plain TCP, a fixed window from the SYN on (a measurement aid).
      fd = socket(ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
      if (fd >= 0) SetShapingBuffer(fd, proxy_->options.shaping.plain_buffer);
    }
    bev_.reset(bufferevent_socket_new(proxy_->base, fd, BEV_OPT_CLOSE_ON_FREE));
    if (!bev_) {
      if (fd >= 0) evutil_closesocket(fd);
      last_connect_error_ = Status::Internal("cannot create a socket event");
      continue;
    }
    bufferevent_setcb(bev_.get(), &OriginConn::OnRead, &OriginConn::OnWrite, &OriginConn::OnEvent,
                      this);
    // While connecting, libevent applies the write timeout to the connect.
    const timeval read_tv = ToTimeval(proxy_->options.origin_timeout);
    const timeval connect_tv = ToTimeval(proxy_->options.connect_timeout);
    bufferevent_set_timeouts(bev_.get(), &read_tv, &connect_tv);
    peer_ = FormatSockaddr(ss);
    state_ = State::kConnecting;
    if (bufferevent_socket_connect(bev_.get(), reinterpret_cast<const sockaddr*>(&ss),
                                   static_cast<int>(SockaddrLength(ss))) == 0) {
      return;
    }
    last_connect_error_ = Status::FromErrno(errno, "connect to " + peer_);
    bev_.reset();
  }
  Fail(Status::Unavailable(
      "cannot connect to " + pool_key_ + ": " +
      (last_connect_error_.ok() ? std::string("no address") : last_connect_error_.message())));
}

void OriginConn::Fail(Status status) {
  state_ = State::kFailed;
  error_ = std::move(status);
  Notify(OriginEvent::kError);
}

void OriginConn::Notify(OriginEvent event) {
  if (in_connect_) {
    // Never report inside Connect(): the caller is still setting up.
    deferred_.Arm(Duration::zero(), [this, event] { Notify(event); });
    return;
  }
  if (owner_ != nullptr) {
    std::shared_ptr<ClientConnection> keep = owner_->shared_from_this();
    owner_->OnOrigin(event);  // may destroy *this
    return;
  }
  // Pooled: an idle connection must stay silent. Data, EOF, an error or the idle timeout all
  // mean it can no longer carry a request.
  if (event != OriginEvent::kDrained) proxy_->DropIdle(this);  // destroys *this
}

void OriginConn::OnRead(bufferevent*, void* arg) {
  static_cast<OriginConn*>(arg)->Notify(OriginEvent::kReadable);
}

void OriginConn::OnWrite(bufferevent*, void* arg) {
  static_cast<OriginConn*>(arg)->Notify(OriginEvent::kDrained);
}

void OriginConn::OnEvent(bufferevent*, short what, void* arg) {
  auto* self = static_cast<OriginConn*>(arg);
  if (self->state_ == State::kConnecting) {
    if (what & BEV_EVENT_CONNECTED) {
      self->state_ = State::kOpen;
      // The path's round trip before any data (a shaper started later, as a tunnel's is at
      // 256 KiB with the bottleneck queue full, must not take its minimum RTT from then).
      self->handshake_rtt_ = HandshakeRtt(bufferevent_getfd(self->bev_.get()));
      // A request head and its body go out as separate writes: no Nagle wait between them.
      int one = 1;
      setsockopt(bufferevent_getfd(self->bev_.get()), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      const timeval tv = ToTimeval(self->proxy_->options.origin_timeout);
      bufferevent_set_timeouts(self->bev_.get(), &tv, &tv);
      bufferevent_enable(self->bev_.get(), EV_READ | EV_WRITE);
      self->Notify(OriginEvent::kConnected);
      return;
    }
    if (what & BEV_EVENT_TIMEOUT) {
      self->last_connect_error_ =
          Status::TimedOut("connect to " + self->peer_ + " timed out after " +
                           DurationText(self->proxy_->options.connect_timeout));
    } else {
      const int err = EVUTIL_SOCKET_ERROR();
      self->last_connect_error_ =
          Status::FromErrno(err != 0 ? err : ECONNREFUSED, "connect to " + self->peer_);
    }
    self->bev_.reset();
    self->TryNextAddress();
    return;
  }
  if (what & BEV_EVENT_EOF) {
    self->Notify(OriginEvent::kEof);
    return;
  }
  if (what & BEV_EVENT_TIMEOUT) {
    self->state_ = State::kFailed;
    self->error_ = Status::TimedOut("origin " + self->pool_key_ + " sent nothing for " +
                                    DurationText(self->proxy_->options.origin_timeout));
    self->Notify(OriginEvent::kError);
    return;
  }
  if (what & BEV_EVENT_ERROR) {
    const int err = EVUTIL_SOCKET_ERROR();
    self->state_ = State::kFailed;
    self->error_ =
        Status::FromErrno(err != 0 ? err : EPIPE, "connection to origin " + self->pool_key_);
    self->Notify(OriginEvent::kError);
  }
}

}  // namespace ghost::proxy_internal
