// ClientConnection: one client's connection, a state enum moved by Drive().
//
//                 accept (403 / 503 refusals go straight to kClosing)
//                   │
//                   ▼          head parsed                       response complete,
//   ┌────────▶ kReadingHead ─────────────────▶ kExchange ─────── keep-alive ──────────┐
//   │               │   │                        │                                     │
//   │               │   │ CONNECT, allowed port  │ response complete, no keep-alive,   │
//   │               │   ▼                        │ or the request body was not read    │
//   │               │ kTunnelConnecting ─fail─▶ (kExchange with a 502/504, closing)    │
//   │               │   │ connected (200)        ▼                                     │
//   │               │   ▼                     kClosing ──output sent, client EOF or ──▶ kClosed
//   │               │ kTunnel ─either side──────▲           linger timeout
//   │               │          closes, flushed──┘
//   │               └─ 408 (no head in time), 4xx (bad head) ─▶ kExchange (local answer)
//   └──────────────────────────────────────────────────────────────────────────────────┘
//
//   state              event                          action
//   kReadingHead       input                          parse; head → StartExchange (not while
//                                                     the output is above the high watermark)
//   kReadingHead       client output drained          parse the next head (it waited)
//   kReadingHead       head timer, deadline passed    part of a head: 408, then close;
//                                                     nothing (idle): close
//   kReadingHead       head timer, time left          re-arm for the rest (armed for an
//                                                     earlier head)
//   kReadingHead       client EOF                     answer complete heads, then kClosing
//   kExchange          input                          request body → origin (when it takes it)
//   kExchange          client output drained          resume the origin or the next cache slice
//   kExchange          response complete (kDone)      log; next request or kClosing
//   kExchange          client EOF                     go on (a half-close); kClosing after
//                                                     the answers to what the client sent; a
//                                                     request body cut short: abort, close
//   kExchange          client error                   abort the exchange, close
//   kTunnel            input on either side           relay, pausing a side whose peer is full
//   kTunnel            EOF on either side             flush to the other side, then kExchange
//                                                     (done) → kClosing
//   kClosing           output sent                    shutdown(SHUT_WR), wait for the client's
//                                                     EOF (at most 2 s), close
//   kClosing           client EOF                     close once the output is sent
//   kReadingHead       preempted (proxy at its limit, close silently when idle, else 408
//                      waited >= preempt_after)       (the place is given up at once)
//   any                socket error, send timeout     close at once
//
// Pipelined requests are answered in order because the parser is not asked for the next head
// until the current response is complete, nor while the client has not read the answers above
// the high watermark; the bytes wait in the input buffer, whose size the read watermark bounds.
#include <event2/event.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <cassert>

#include "common/http/http_message.h"
#include "proxy/proxy_internal.h"

namespace ghost::proxy_internal {
namespace {

// Client input buffered while a response is in progress (pipelined requests, body bytes the
// origin does not take yet): reading stops above it.
constexpr std::size_t kClientInputHigh = 64 * 1024;
// Bytes handed to a parser per call.
constexpr std::size_t kParseChunk = 64 * 1024;
// How long a closing connection waits for the client to read the answer and close.
constexpr Duration kLinger = std::chrono::seconds(2);

std::string HtmlEscape(std::string_view s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '&':
        out += "&amp;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

}  // namespace

std::string_view Pullup(evbuffer* buf, std::size_t* len) {
  *len = std::min(evbuffer_get_length(buf), kParseChunk);
  if (*len == 0) return {};
  const auto* data =
      reinterpret_cast<const char*>(evbuffer_pullup(buf, static_cast<ev_ssize_t>(*len)));
  return {data, *len};
}

std::string DurationText(Duration d) {
  char buf[32];
  if (d < std::chrono::seconds(1)) {
    std::snprintf(buf, sizeof buf, "%.0f ms", ToMillis(d));
  } else {
    std::snprintf(buf, sizeof buf, "%g s", ToSeconds(d));
  }
  return buf;
}

timeval ToTimeval(Duration d) {
  return timeval{static_cast<time_t>(d.count() / 1'000'000),
                 static_cast<suseconds_t>(d.count() % 1'000'000)};
}

const char* ResultName(ResultCode code) {
  switch (code) {
    case ResultCode::kNone:
      return "NONE";
    case ResultCode::kHit:
      return "HIT";
    case ResultCode::kMemHit:
      return "MEM_HIT";
    case ResultCode::kMiss:
      return "MISS";
    case ResultCode::kNetPreferred:
      return "NET_PREFERRED";
    case ResultCode::kRevalidated:
      return "REVALIDATED";
    case ResultCode::kStale:
      return "STALE";
    case ResultCode::kTunnel:
      return "TUNNEL";
    case ResultCode::kLocal:
      return "LOCAL";
    case ResultCode::kDenied:
      return "DENIED";
    case ResultCode::kError:
      return "ERROR";
  }
  return "NONE";
}

ClientConnection::ClientConnection(Impl* proxy, std::uint64_t id, evutil_socket_t fd,
                                   const IpAddress& peer)
    : proxy_(proxy),
      id_(id),
      peer_(peer),
      peer_text_(peer.ToString()),
      parser_(proxy->options.limits),
      head_timer_(proxy->clock),
      linger_timer_(proxy->clock),
      fallback_timer_(proxy->clock),
      tunnel_timer_(proxy->clock) {
  // A response goes out as a head and then body pieces: with Nagle, a small last piece waits
  // for the client's delayed ACK (~40 ms) on every request of a keep-alive connection.
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);  // fails harmlessly on non-TCP
  bev_.reset(bufferevent_socket_new(proxy->base, fd, BEV_OPT_CLOSE_ON_FREE));
  if (!bev_) {
    evutil_closesocket(fd);
    return;
  }
  // libevent writes at most 16 KiB per turn by default: a 16 KiB hit and its head would take
  // two writev calls and two turns of the loop. Up to the high watermark goes in one.
  bufferevent_set_max_single_write(bev_.get(), proxy->options.high_watermark);
}

ClientConnection::~ClientConnection() = default;

void ClientConnection::AssertInvariants() const {
  assert((state_ == State::kClosed) == (bev_ == nullptr));
  assert(state_ != State::kExchange || ex_ != nullptr);
  assert(state_ != State::kReadingHead || ex_ == nullptr);
  assert((state_ != State::kTunnel && state_ != State::kTunnelConnecting) || tunnel_ != nullptr);
  // The head timer may stay armed in kExchange (EnterReadingHead): it then does nothing.
  assert(!head_timer_.armed() || state_ == State::kReadingHead || state_ == State::kExchange);
}

void ClientConnection::SetReadTimeout(std::optional<Duration> timeout) {
  const timeval send = ToTimeval(proxy_->options.send_timeout);
  if (timeout) {
    const timeval read = ToTimeval(*timeout);
    bufferevent_set_timeouts(bev_.get(), &read, &send);
  } else {
    bufferevent_set_timeouts(bev_.get(), nullptr, &send);
  }
}

void ClientConnection::Start(int reject_status) {
  if (!bev_) {
    state_ = State::kReadingHead;  // for Close's bookkeeping
    Close();
    return;
  }
  bufferevent_setcb(bev_.get(), &ClientConnection::OnRead, &ClientConnection::OnWrite,
                    &ClientConnection::OnEvent, this);
  bufferevent_setwatermark(bev_.get(), EV_READ, 0, kClientInputHigh);
  bufferevent_setwatermark(bev_.get(), EV_WRITE, proxy_->options.high_watermark / 2, 0);
  SetReadTimeout(std::nullopt);
  bufferevent_enable(bev_.get(), EV_READ | EV_WRITE);
  if (reject_status == 403) {
    SendLocal(403,
              "client address " + peer_text_ +
                  " is not allowed to use this proxy (ghostproxy --allow CIDR admits more clients)",
              ResultCode::kDenied, /*close=*/true);
  } else if (reject_status != 0) {
    http1::HeaderList retry;
    retry.Add("Retry-After", "1");
    const std::string message =
        reject_status == 429
            ? "client " + peer_text_ + " already has " +
                  std::to_string(proxy_->options.max_connections_per_client) +
                  " connections open, the most one client may have; try again shortly "
                  "(ghostproxy --max-connections-per-client)"
            : "the proxy is serving its maximum of " +
                  std::to_string(proxy_->options.max_connections) +
                  " connections; try again shortly";
    SendLocal(reject_status, message, ResultCode::kError, /*close=*/true, retry);
  } else {
    EnterReadingHead();
  }
  Drive();
}

void ClientConnection::EnterReadingHead() {
  state_ = State::kReadingHead;
  ex_.reset();
  head_started_ = false;
  waiting_since_ = proxy_->clock->Now();
  SetReadTimeout(std::nullopt);
  // The deadline is waiting_since_ + request_timeout. A timer still armed from an earlier head
  // of this connection stays (it fires early and re-arms for the rest): re-arming it for every
  // request of a kept-alive connection cost an allocation and a timer insert and removal each.
  if (!head_timer_.armed()) ArmHeadTimer(proxy_->options.request_timeout);
}

void ClientConnection::ArmHeadTimer(Duration after) {
  std::weak_ptr<ClientConnection> weak = weak_from_this();
  head_timer_.Arm(after, [weak] {
    if (auto self = weak.lock()) self->OnHeadTimeout();
  });
}

void ClientConnection::OnHeadTimeout() {
  if (state_ != State::kReadingHead) return;  // an exchange is on: its end arms a new deadline
  if (ClientBackedUp()) {
    // The next head is not late: it waits for the client to read its answers (Drive), and
    // the send timeout closes a client that stops reading.
    waiting_since_ = proxy_->clock->Now();
    ArmHeadTimer(proxy_->options.request_timeout);
    return;
  }
  const Duration left = waiting_since_ + proxy_->options.request_timeout - proxy_->clock->Now();
  if (left > Duration::zero()) {
    ArmHeadTimer(left);  // armed for an earlier head: this one has time left
    return;
  }
  ++proxy_->stats.timeouts;
  if (!head_started_ && evbuffer_get_length(input()) == 0) {
    // An idle connection, not a slow request: close it without an answer (RFC 9112 §9.5). A
    // 408 here would race the client's next request on the kept-alive connection and be read
    // as that request's response; a close tells the client to retry on a new one.
    Close();
    return;
  }
  SendLocal(408,
            "no complete request arrived within " + DurationText(proxy_->options.request_timeout) +
                "; the connection is closed",
            ResultCode::kError, /*close=*/true);
  Drive();
}

void ClientConnection::Preempt() {
  assert(state_ == State::kReadingHead);
  proxy_->ReleasePlace(this);
  if (!head_started_ && evbuffer_get_length(input()) == 0) {
    Close();  // idle: as at the head deadline, no answer (it would race a next request)
    return;
  }
  SendLocal(408,
            "no complete request arrived within " +
                DurationText(proxy_->clock->Now() - waiting_since_) +
                " while the proxy is at its connection limit; the connection is closed",
            ResultCode::kError, /*close=*/true);
  Drive();
}

void ClientConnection::EnterClosing() {
  state_ = State::kClosing;
  head_timer_.Cancel();
  ex_.reset();
  SetReadTimeout(std::nullopt);
  bufferevent_setwatermark(bev_.get(), EV_WRITE, 0, 0);
  bufferevent_enable(bev_.get(), EV_WRITE);
  linger_ = !peer_closed_;
}

void ClientConnection::Drive() {
  while (true) {
    AssertInvariants();
    switch (state_) {
      case State::kReadingHead:
        // A client that sends requests without reading the answers (pipelined, or a flood of
        // /ghost/metrics) must not make the output grow without bound: its next request waits
        // until the output has drained below half the watermark (OnWrite), and its input stops
        // being read at kClientInputHigh.
        if (ClientBackedUp()) return;
        if (!ParseNextHead()) return;
        continue;  // a head started an exchange (or an error answer)

      case State::kExchange: {
        Exchange& ex = *ex_;
        if (!ex.request_complete && ex.body_sink_ready) PumpRequestBody();
        if (state_ != State::kExchange || ex_->step != Exchange::Step::kDone) return;
        if (!ex_->request_complete)
          keep_alive_ = false;  // its unread body would be read as a request
        FinishExchange();
        // After a half-close, the requests the client sent before it are still answered.
        if (keep_alive_ && (!peer_closed_ || evbuffer_get_length(input()) > 0)) {
          EnterReadingHead();
        } else {
          EnterClosing();
        }
        continue;
      }

      case State::kTunnelConnecting:
      case State::kTunnel:
        return;  // the tunnel's own handlers move it

      case State::kClosing: {
        if (evbuffer_get_length(output()) > 0) return;  // OnWrite drives again
        if (!linger_ || peer_closed_) {
          Close();
          return;
        }
        if (!linger_timer_.armed()) {
          // Half-close, then read and drop what the client still sends until it closes, so the
          // kernel does not reset the connection before the client has read our answer.
          ::shutdown(bufferevent_getfd(bev_.get()), SHUT_WR);
          evbuffer_drain(input(), evbuffer_get_length(input()));
          bufferevent_enable(bev_.get(), EV_READ);
          std::weak_ptr<ClientConnection> weak = weak_from_this();
          linger_timer_.Arm(kLinger, [weak] {
            if (auto self = weak.lock()) self->Close();
          });
        }
        return;
      }

      case State::kClosed:
        return;
    }
  }
}

bool ClientConnection::ParseNextHead() {
  while (true) {
    std::size_t len = 0;
    const std::string_view data = Pullup(input(), &len);
    if (len == 0 && peer_closed_) {
      // The client closed between requests (or inside a head it never finished); what is owed
      // to it (the answers to its earlier pipelined requests) still goes out.
      EnterClosing();
      return true;
    }
    if (len == 0) return false;
    const http1::Event e = parser_.Parse(data);
    switch (e.type) {
      case http1::EventType::kNeedMore:
        head_started_ = true;
        evbuffer_drain(input(), e.consumed);
        continue;
      case http1::EventType::kHead:
        evbuffer_drain(input(), e.consumed);
        StartExchange();  // the head timer stays armed: it ignores every state but kReadingHead
        return true;
      case http1::EventType::kError: {
        evbuffer_drain(input(), e.consumed);
        const http1::ParseError& err = parser_.error();
        SendLocal(err.http_status, "bad request: " + err.message, ResultCode::kError,
                  /*close=*/true);
        return true;
      }
      case http1::EventType::kBody:
      case http1::EventType::kMessageComplete:
        evbuffer_drain(input(), e.consumed);  // cannot happen between messages
        continue;
      case http1::EventType::kTunnel:
      case http1::EventType::kEnd:
        Close();
        return false;
    }
  }
}

void ClientConnection::PumpRequestBody() {
  Exchange& ex = *ex_;
  const bool chunked = ex.req.framing == http1::BodyFraming::kChunked;
  while (!ex.request_complete && ex.origin && ex.origin->bev() != nullptr) {
    if (evbuffer_get_length(ex.origin->output()) > proxy_->options.high_watermark)
      return;  // kDrained resumes
    std::size_t len = 0;
    const std::string_view data = Pullup(input(), &len);
    // Parse even with no bytes: the end of a Content-Length body is reported by the call after
    // its last bytes.
    const http1::Event e = parser_.Parse(data);
    switch (e.type) {
      case http1::EventType::kBody: {
        std::string out;
        if (chunked) {
          http1::AppendChunk(e.body, &out);
        } else {
          out.assign(e.body);
        }
        evbuffer_add(ex.origin->output(), out.data(), out.size());
        ex.request_body_started = true;
        evbuffer_drain(input(), e.consumed);
        break;
      }
      case http1::EventType::kMessageComplete: {
        evbuffer_drain(input(), e.consumed);
        if (chunked) {
          std::string out;
          if (!http1::AppendLastChunk(parser_.trailers(), &out).ok()) {
            out = "0\r\n\r\n";  // drop trailers that cannot be forwarded
          }
          evbuffer_add(ex.origin->output(), out.data(), out.size());
        }
        ex.request_complete = true;
        SetReadTimeout(std::nullopt);
        return;
      }
      case http1::EventType::kNeedMore:
        evbuffer_drain(input(), e.consumed);
        if (evbuffer_get_length(input()) > 0) break;
        if (peer_closed_) {  // the client closed in the middle of its body
          AbortExchange();
          Close();
        }
        return;
      default: {  // kError (bad chunk): the request cannot be completed
        evbuffer_drain(input(), e.consumed);
        const std::string why = parser_.error().message;
        AbortExchange();
        if (!ex_->response_started) {
          SendLocal(400, "bad request body: " + why, ResultCode::kError, /*close=*/true);
        } else {
          Close();
        }
        return;
      }
    }
  }
}

// ---- Local answers ----

void ClientConnection::SendLocal(int status, const std::string& message, ResultCode code,
                                 bool close, const http1::HeaderList& extra) {
  const std::string title = std::to_string(status) + " " + std::string(http1::ReasonPhrase(status));
  const std::string body = "<!DOCTYPE html>\n<html><head><title>" + title +
                           "</title></head><body>\n<h1>" + title + "</h1>\n<p>" +
                           HtmlEscape(message) + "</p>\n<hr><address>ghostproxy " +
                           HtmlEscape(proxy_->via_name) + "</address>\n</body></html>\n";
  http1::HeaderList fields = extra;
  // The one-line reason, for clients that do not show bodies (and for tests and logs).
  std::string line = message;
  for (char& c : line) {
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = ' ';
  }
  fields.Add("X-Ghost-Error", line);
  SendRaw(status, "text/html; charset=utf-8", body, code, close, fields);
}

void ClientConnection::SendRaw(int status, const std::string& content_type, const std::string& body,
                               ResultCode code, bool close, const http1::HeaderList& extra) {
  head_timer_.Cancel();
  if (!ex_) {
    // An answer before (or without) a parsed request: refusals, bad heads, timeouts.
    ex_ = std::make_unique<Exchange>();
    ex_->serial = next_serial_++;
    ex_->start = proxy_->clock->Now();
    ex_->req.method = parser_.head().method.empty() ? "NONE" : parser_.head().method;
    ex_->log_url = parser_.head().target.empty() ? "-" : parser_.head().target;
    ex_->request_complete = true;
  }
  state_ = State::kExchange;
  Exchange& ex = *ex_;
  ex.deferred_head.clear();
  if (ex.response_started) {  // a head already went out: nothing else can be said
    Close();
    return;
  }
  ex.result = code;
  if (close) keep_alive_ = false;
  http1::HeaderList fields;
  fields.Add("Content-Type", content_type);
  fields.Add("Content-Length", std::to_string(body.size()));
  fields.Add("Cache-Control", "no-store");
  fields.Add("Date", FormatHttpDate(proxy_->UnixNow()));
  for (const http1::HeaderField& f : extra) fields.Add(f.name, f.value);
  const bool with_body = ex.req.method != "HEAD";
  WriteResponseHead(status, "", std::move(fields), "proxy", Exchange::Framing::kLength, with_body,
                    false);
  if (with_body) WriteBody(body);
  ex.step = Exchange::Step::kDone;
}

void ClientConnection::SendStatusPage(const std::string& path) {
  const std::string_view p = std::string_view(path).substr(0, path.find('?'));
  if (ex_->req.method != "GET" && ex_->req.method != "HEAD") {
    http1::HeaderList allow;
    allow.Add("Allow", "GET, HEAD");
    SendLocal(405, std::string(p) + " answers GET and HEAD only", ResultCode::kLocal, false, allow);
  } else if (p == "/ghost/status") {
    SendRaw(200, "application/json", proxy_->StatusJson(), ResultCode::kLocal, false);
  } else {
    SendRaw(200, "text/plain; version=0.0.4; charset=utf-8", proxy_->MetricsText(),
            ResultCode::kLocal, false);
  }
}

bool ClientConnection::SendDashboardRedirect(const std::string& path) {
  if (path != "/ghost/" && path != "/ghost") return false;
  const std::string url = proxy_->options.dashboard_url ? proxy_->options.dashboard_url() : std::string();
  if (url.empty()) return false;
  http1::HeaderList location;
  location.Add("Location", url);
  SendRaw(302, "text/plain", "the dashboard is at " + url + "\n", ResultCode::kLocal, false, location);
  return true;
}

// ---- Writing the response ----

void ClientConnection::WriteResponseHead(int status, const std::string& reason,
                                         http1::HeaderList headers, const char* source,
                                         Exchange::Framing framing, bool body_follows, bool defer) {
  Exchange& ex = *ex_;
  const bool http10 = ex.req.version_minor == 0;
  if (body_follows && framing == Exchange::Framing::kChunked && http10) {
    framing = Exchange::Framing::kUntilClose;  // HTTP/1.0 has no chunked coding
  }
  if (body_follows && framing == Exchange::Framing::kUntilClose) keep_alive_ = false;

  http1::ResponseHead head;
  head.version_minor = 1;
  head.status = status;
  head.reason = reason;
  std::string via = headers.FindAll("Via");
  headers.Remove("Via");
  headers.Remove("X-Ghost-Source");
  headers.Remove("Transfer-Encoding");
  headers.Remove("Connection");
  head.headers = std::move(headers);
  head.headers.Add("Via", (via.empty() ? "" : via + ", ") + "1.1 " + proxy_->via_name);
  head.headers.Add("X-Ghost-Source", source);
  if (body_follows && framing == Exchange::Framing::kChunked)
    head.headers.Add("Transfer-Encoding", "chunked");
  if (!keep_alive_) {
    head.headers.Add("Connection", "close");
  } else if (http10) {
    head.headers.Add("Connection", "keep-alive");
  }
  std::string out;
  if (Status s = http1::AppendResponseHead(head, &out); !s.ok()) {
    // A field the origin sent cannot be written back (the parser let it through): answer
    // with an error instead of a broken head.
    SendLocal(502, "the origin's response head cannot be forwarded: " + s.message(),
              ResultCode::kError, true);
    return;
  }
  ex.status = status;
  ex.response_started = true;
  ex.framing = body_follows ? framing : Exchange::Framing::kNone;
  if (const std::string* ct = head.headers.Find("Content-Type")) ex.content_type = *ct;
  if (defer) {
    ex.deferred_head = std::move(out);
    return;
  }
  ex.bytes_sent += out.size();
  evbuffer_add(output(), out.data(), out.size());
}

void ClientConnection::WriteBody(std::string_view data) {
  Exchange& ex = *ex_;
  if (ex.step == Exchange::Step::kCacheBody && !data.empty() && ex.framing != Exchange::Framing::kChunked &&
      evbuffer_get_length(output()) == 0) {
    // A slice of a cached body (ReadNextCacheSlice), nothing queued before it: the (deferred
    // head and the) slice go to the socket now, in one sendmsg, as WriteMemoryBody does for a
    // hit from RAM. A cached body read from the daemon (a packed one comes with the lookup's
    // answer) that fits the socket's send buffer then arms no write event: no epoll_ctl to add
    // it, no loop turn to wait for it, no epoll_ctl to remove it. What the socket does not
    // take, or all of it on any error (the bufferevent's own write then reports it), is queued
    // as before. (An origin's body streamed to the client keeps the buffered write.)
    const std::string head = std::move(ex.deferred_head);
    ex.deferred_head.clear();
    ex.bytes_sent += head.size() + data.size();
    iovec iov[2] = {{const_cast<char*>(head.data()), head.size()},
                    {const_cast<char*>(data.data()), data.size()}};
    msghdr msg{};
    msg.msg_iov = head.empty() ? iov + 1 : iov;
    msg.msg_iovlen = head.empty() ? 1 : 2;
    const ssize_t n = ::sendmsg(bufferevent_getfd(bev_.get()), &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    std::size_t sent = n > 0 ? static_cast<std::size_t>(n) : 0;
    if (sent < head.size()) {
      evbuffer_add(output(), head.data() + sent, head.size() - sent);
      sent = 0;
    } else {
      sent -= head.size();
    }
    if (sent < data.size()) evbuffer_add(output(), data.data() + sent, data.size() - sent);
    return;
  }
  if (!ex.deferred_head.empty()) {
    ex.bytes_sent += ex.deferred_head.size();
    evbuffer_add(output(), ex.deferred_head.data(), ex.deferred_head.size());
    ex.deferred_head.clear();
  }
  if (data.empty()) return;
  if (ex.framing == Exchange::Framing::kChunked) {
    std::string out;
    http1::AppendChunk(data, &out);
    ex.bytes_sent += out.size();
    evbuffer_add(output(), out.data(), out.size());
  } else {
    ex.bytes_sent += data.size();
    evbuffer_add(output(), data.data(), data.size());
  }
}

void ClientConnection::WriteMemoryBody(Bytes first, Bytes length) {
  Exchange& ex = *ex_;
  assert(ex.memory && ex.framing == Exchange::Framing::kLength);
  assert(first + length <= ex.memory->body.size());
  const std::string head = std::move(ex.deferred_head);
  ex.deferred_head.clear();
  const char* body = ex.memory->body.data() + first;
  ex.bytes_sent += head.size() + length;
  // Nothing queued before it: the response goes to the socket now, in one sendmsg. A hit that
  // fits the socket's send buffer (the usual one) then never touches the output buffer, so no
  // write event is armed for it: no epoll_ctl to add it, no loop turn to wait for it, no
  // epoll_ctl to remove it. What the socket does not take (or all of it, on any error: the
  // bufferevent's own write then reports the error as for any response) is queued as before.
  std::size_t sent = 0;
  if (evbuffer_get_length(output()) == 0) {
    iovec iov[2] = {{const_cast<char*>(head.data()), head.size()},
                    {const_cast<char*>(body), static_cast<std::size_t>(length)}};
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = 2;
    const ssize_t n = ::sendmsg(bufferevent_getfd(bev_.get()), &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) sent = static_cast<std::size_t>(n);
  }
  if (sent < head.size()) {
    evbuffer_add(output(), head.data() + sent, head.size() - sent);
    sent = 0;
  } else {
    sent -= head.size();
  }
  first += sent;
  body += sent;
  length -= sent;
  if (length == 0) return;
  // The rest is referenced (not copied) by the output buffer, which keeps the copy alive until
  // it is sent.
  auto* hold = new std::shared_ptr<const MemoryObject>(ex.memory);
  const int r = evbuffer_add_reference(
      output(), body, static_cast<std::size_t>(length),
      [](const void*, size_t, void* arg) {
        delete static_cast<std::shared_ptr<const MemoryObject>*>(arg);
      },
      hold);
  if (r != 0) {  // libevent could not allocate the chain: copy instead
    delete hold;
    evbuffer_add(output(), body, static_cast<std::size_t>(length));
  }
}

void ClientConnection::EndBody() {
  WriteBody({});  // a deferred head goes out even for an empty body
  if (ex_->framing == Exchange::Framing::kChunked) {
    static constexpr std::string_view kLast = "0\r\n\r\n";
    ex_->bytes_sent += kLast.size();
    evbuffer_add(output(), kLast.data(), kLast.size());
  }
}

bool ClientConnection::ClientBackedUp() const {
  return evbuffer_get_length(output()) > proxy_->options.high_watermark;
}

// ---- libevent callbacks ----

void ClientConnection::OnRead(bufferevent*, void* arg) {
  std::shared_ptr<ClientConnection> self = static_cast<ClientConnection*>(arg)->shared_from_this();
  switch (self->state_) {
    case State::kTunnel:
      self->RelayTunnel();
      return;
    case State::kTunnelConnecting:
      return;  // early tunnel bytes wait until the far end is connected
    case State::kClosing:
      if (self->linger_timer_.armed())
        evbuffer_drain(self->input(), evbuffer_get_length(self->input()));
      return;
    default:
      self->Drive();
  }
}

void ClientConnection::OnWrite(bufferevent*, void* arg) {
  std::shared_ptr<ClientConnection> self = static_cast<ClientConnection*>(arg)->shared_from_this();
  switch (self->state_) {
    case State::kTunnel:
      if (self->tunnel_closing_) {
        self->CloseTunnelWhenFlushed();
      } else {
        self->RelayTunnel();
      }
      return;
    case State::kExchange:
      self->OnClientDrained();
      self->Drive();
      return;
    case State::kClosing:
    case State::kReadingHead:  // the next request may have waited for the output to drain
      self->Drive();
      return;
    default:
      return;
  }
}

void ClientConnection::OnEvent(bufferevent*, short what, void* arg) {
  std::shared_ptr<ClientConnection> self = static_cast<ClientConnection*>(arg)->shared_from_this();
  if (what & BEV_EVENT_TIMEOUT) {
    ++self->proxy_->stats.timeouts;
    if ((what & BEV_EVENT_READING) && self->state_ == State::kExchange &&
        !self->ex_->response_started) {
      // The request body stopped arriving.
      self->AbortExchange();
      self->SendLocal(408,
                      "the request body stopped arriving for " +
                          DurationText(self->proxy_->options.request_timeout),
                      ResultCode::kError, /*close=*/true);
      self->Drive();
      return;
    }
    self->Close();  // the client stopped reading what we send
    return;
  }
  if (what & BEV_EVENT_ERROR) {
    self->Close();
    return;
  }
  if (what & BEV_EVENT_EOF) {
    self->peer_closed_ = true;
    switch (self->state_) {
      case State::kReadingHead:
        self->Drive();
        return;
      case State::kExchange:
        if (self->ex_->step == Exchange::Step::kDone) {
          self->Drive();  // finish (log) and close
        } else {
          // A half-close after the request (`nc -N`, HTTP/1.0 tools): the client may still
          // read, and the kernel cannot tell that from a close. The answer goes on; a client
          // that is gone makes the next write fail (BEV_EVENT_ERROR), and Drive closes after
          // the answer (peer_closed_). A request body still in the input goes to the origin;
          // one that ends short is found there (PumpRequestBody aborts).
          bufferevent_disable(self->bev_.get(), EV_READ);
          if (!self->ex_->request_complete) self->Drive();
        }
        return;
      case State::kTunnel:
        self->RelayTunnel();  // what the client sent last goes on
        self->CloseTunnelWhenFlushed();
        return;
      case State::kTunnelConnecting:
        self->Close();
        return;
      case State::kClosing:
        // The client has sent all it will; what we owe it still goes out (Drive closes once
        // the output is flushed).
        self->Drive();
        return;
      case State::kClosed:
        return;
    }
  }
}

void ClientConnection::Close() {
  if (state_ == State::kClosed) return;
  if (ex_ && !ex_->logged) {
    if (ex_->result == ResultCode::kNone) ex_->result = ResultCode::kError;
    FinishExchange();  // logs the cut exchange
  }
  AbortExchange();
  tunnel_.reset();
  head_timer_.Cancel();
  linger_timer_.Cancel();
  tunnel_timer_.Cancel();
  fallback_timer_.Cancel();
  bev_.reset();
  state_ = State::kClosed;
  proxy_->Remove(id_);  // the caller holds a reference
}

void ClientConnection::OnOrigin(OriginEvent event) {
  if (state_ == State::kTunnelConnecting || state_ == State::kTunnel) {
    OnTunnelOrigin(event);
    return;
  }
  if (state_ != State::kExchange || !ex_ || !ex_->origin) return;
  switch (event) {
    case OriginEvent::kConnected:
      SendOriginRequest();
      break;
    case OriginEvent::kReadable:
      OnOriginReadable(/*force=*/false);
      break;
    case OriginEvent::kDrained:
      break;  // Drive pumps more of the request body
    case OriginEvent::kEof:
      OnOriginEof();
      break;
    case OriginEvent::kError:
      OnOriginFailed(ex_->origin->error(), /*bad_response=*/false);
      break;
  }
  Drive();
}

// ---- CONNECT tunnels ----

void ClientConnection::StartTunnel() {
  head_timer_.Cancel();  // a tunnel never reads another head
  Exchange& ex = *ex_;
  Result<http1::HostPort> hp = http1::SplitAuthority(ex.req.target, /*require_port=*/true);
  if (!hp.ok()) {  // the parser checked it already
    SendLocal(400, "CONNECT needs host:port: " + hp.status().message(), ResultCode::kError, true);
    return;
  }
  const auto& ports = proxy_->options.connect_ports;
  if (std::find(ports.begin(), ports.end(), hp->port) == ports.end()) {
    std::string allowed;
    for (std::uint16_t p : ports) allowed += (allowed.empty() ? "" : ",") + std::to_string(p);
    SendLocal(403,
              "CONNECT to port " + std::to_string(hp->port) + " is not allowed; allowed ports: " +
                  (allowed.empty() ? "none" : allowed) + " (ghostproxy --connect-ports)",
              ResultCode::kDenied, /*close=*/true);
    return;
  }
  if (proxy_->IsSelf(hp->host, hp->port)) {
    SendLocal(508, "CONNECT to the proxy's own address " + ex.req.target + " would loop",
              ResultCode::kError, true);
    return;
  }
  ex.result = ResultCode::kTunnel;
  ex.hierarchy = "DIRECT/" + hp->host;
  keep_alive_ = false;
  ex.transfer = proxy_->backend->TransferBegin();
  ex.transfer_open = true;
  ++proxy_->transfers_in_progress;
  tunnel_ = std::make_unique<OriginConn>(proxy_, hp->host, hp->port);
  tunnel_->SetOwner(this);
  ++proxy_->stats.origin_connections;
  state_ = State::kTunnelConnecting;
  tunnel_->Connect();
}

void ClientConnection::OnTunnelOrigin(OriginEvent event) {
  Exchange& ex = *ex_;
  if (state_ == State::kTunnelConnecting) {
    if (event == OriginEvent::kConnected) {
      ex.hierarchy = "DIRECT/" + tunnel_->peer();
      const std::string head = "HTTP/1.1 200 Connection established\r\nVia: 1.1 " +
                               proxy_->via_name + "\r\nX-Ghost-Source: tunnel\r\n\r\n";
      evbuffer_add(output(), head.data(), head.size());
      ex.bytes_sent += head.size();
      ex.status = 200;
      ex.response_started = true;
      state_ = State::kTunnel;
      // Idleness is the tunnel timer's business; the far end may be silent for long.
      bufferevent_set_timeouts(tunnel_->bev(), nullptr, nullptr);
      bufferevent_setwatermark(tunnel_->bev(), EV_WRITE, proxy_->options.high_watermark / 2, 0);
      bufferevent_enable(tunnel_->bev(), EV_READ | EV_WRITE);
      tunnel_start_ = tunnel_last_activity_ = proxy_->clock->Now();
      std::weak_ptr<ClientConnection> weak = weak_from_this();
      tunnel_timer_.Arm(proxy_->options.tunnel_idle_timeout, [weak] {
        if (auto self = weak.lock()) self->OnTunnelIdle();
      });
      RelayTunnel();
      return;
    }
    if (event == OriginEvent::kError) {
      const Status why = tunnel_->error();
      tunnel_.reset();
      EndTransfer();
      const bool timeout = why.code() == Status::Code::kTimedOut;
      SendLocal(timeout ? 504 : 502,
                "cannot open a tunnel to " + ex.req.target + ": " + why.message(),
                ResultCode::kError, /*close=*/true);
      Drive();
    }
    return;
  }
  switch (event) {
    case OriginEvent::kReadable:
      RelayTunnel();
      return;
    case OriginEvent::kDrained:
      if (tunnel_closing_) {
        CloseTunnelWhenFlushed();
      } else {
        RelayTunnel();
      }
      return;
    case OriginEvent::kEof:
    case OriginEvent::kError:
      RelayTunnel();  // the far end's last bytes go to the client
      CloseTunnelWhenFlushed();
      return;
    case OriginEvent::kConnected:
      return;
  }
}

void ClientConnection::RelayTunnel() {
  if (state_ != State::kTunnel || !tunnel_) return;
  const std::size_t up = evbuffer_get_length(input());
  const std::size_t down = evbuffer_get_length(tunnel_->input());
  if (up > 0 && !tunnel_closing_) evbuffer_add_buffer(tunnel_->output(), input());
  if (down > 0) evbuffer_add_buffer(output(), tunnel_->input());
  if (up > 0 || down > 0) {
    tunnel_bytes_up_ += tunnel_closing_ ? 0 : up;
    tunnel_bytes_down_ += down;
    ex_->bytes_sent += down;
    tunnel_last_activity_ = proxy_->clock->Now();
  }
  if (tunnel_closing_) return;
  // Back-pressure (libevent's le-proxy): stop reading a side while the other side's output is
  // above the watermark; the write callback at half of it resumes.
  const std::size_t high = proxy_->options.high_watermark;
  if (evbuffer_get_length(tunnel_->output()) > high) {
    bufferevent_disable(bev_.get(), EV_READ);
  } else {
    bufferevent_enable(bev_.get(), EV_READ);
  }
  // Download shaping of the server-to-client direction once it is large (proxy/shaper.h). The
  // shaper fixes the buffer then, as for HTTP: fixed before the SYN (so until round 8), the
  // window (~2/3 of the buffer) stayed below the full flight that ends the shaper's slow start
  // and HTTPS was not shaped (0 bursts on scripts/bench-shaping.sh's https arm); small tunnels
  // keep an autotuned window.
  if (!tunnel_->shaping() && tunnel_bytes_down_ >= TunnelShapingThreshold(proxy_->options.shaping)) {
    tunnel_->StartShaping(0);
  }
  tunnel_->PauseReading(evbuffer_get_length(output()) > high);
}

void ClientConnection::OnTunnelIdle() {
  if (state_ != State::kTunnel) return;
  const Duration idle = proxy_->clock->Now() - tunnel_last_activity_;
  const Duration limit = proxy_->options.tunnel_idle_timeout;
  if (idle >= limit) {
    ++proxy_->stats.timeouts;
    Close();
    return;
  }
  // Activity since the timer was armed: check again when the idle time could first be reached.
  std::weak_ptr<ClientConnection> weak = weak_from_this();
  tunnel_timer_.Arm(limit - idle, [weak] {
    if (auto self = weak.lock()) self->OnTunnelIdle();
  });
}

void ClientConnection::CloseTunnelWhenFlushed() {
  if (state_ != State::kTunnel) return;
  if (!tunnel_closing_) {
    tunnel_closing_ = true;
    bufferevent_disable(bev_.get(), EV_READ);
    if (tunnel_) {
      tunnel_->StopShaping();
      bufferevent_disable(tunnel_->bev(), EV_READ);
      bufferevent_setwatermark(tunnel_->bev(), EV_WRITE, 0, 0);
    }
    bufferevent_setwatermark(bev_.get(), EV_WRITE, 0, 0);
  }
  const bool client_flushed = evbuffer_get_length(output()) == 0;
  const bool origin_flushed = !tunnel_ || evbuffer_get_length(tunnel_->output()) == 0 ||
                              tunnel_->state() == OriginConn::State::kFailed;
  if (!client_flushed || !origin_flushed) return;  // the write callbacks call again
  ex_->origin_bytes = tunnel_bytes_up_ + tunnel_bytes_down_;
  tunnel_.reset();
  tunnel_timer_.Cancel();
  EndTransfer();
  ex_->step = Exchange::Step::kDone;
  state_ = State::kExchange;
  keep_alive_ = false;
  Drive();
}

}  // namespace ghost::proxy_internal
