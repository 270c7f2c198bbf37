// One request and its response: where the answer comes from (DESIGN §3.4, RFC 9111) and how
// it is streamed.
//
//   request ──▶ RAM copy (GET/HEAD), usable ─────────────────────────▶ memory body (MEM_HIT)
//                  │ none, or not usable: ask the backend
//               lookup ──miss────────────────────────────────────────────▶ origin (MISS)
//                  │ vary index: look up the variant key, same rules
//                  │ stored, usable (fresh for this client)
//                  │    choice kDisk ────────────────────────────────▶ cache body (HIT)
//                  │    choice kNetwork ─────────────────────────────▶ origin (NET_PREFERRED);
//                  │                                                   fails → the copy (HIT)
//                  │ stored, needs validation
//                  │    choice kNetwork, HEAD, or no validators ─────▶ origin (NET_PREFERRED/MISS)
//                  │    else conditional request ──304──▶ refresh, cache body (REVALIDATED)
//                  │                                ──200──▶ replace, stream (MISS)
//                  └ origin unreachable / 5xx with a stored copy that may be served stale
//                                                  ────────────────▶ cache body (STALE)
//                    no such copy ─────────────────────────────────▶ 504 page
//
// Streaming: origin body bytes go to the client (re-chunked when the length is unknown) and,
// when the response is storable, to a CacheWriter; above the high watermark of the client's
// output the origin is not read until half of it has drained. A cached body is read in
// slices, the next one only once the client has taken the last.
#include <algorithm>

#include "proxy/proxy_internal.h"

namespace ghost::proxy_internal {
namespace {

// The first transfer coding of a response with a body that is not chunked ("" when none).
std::string OtherTransferCoding(const http1::ResponseHead& head) {
  if (head.framing == http1::BodyFraming::kNone) return "";
  const std::string te = head.headers.FindAll("Transfer-Encoding");
  std::size_t i = 0;
  while (i <= te.size()) {
    std::size_t comma = te.find(',', i);
    if (comma == std::string::npos) comma = te.size();
    const std::string_view coding = TrimBlanks(std::string_view(te).substr(i, comma - i));
    if (!coding.empty() && !EqualsIgnoreCase(coding, "chunked")) return std::string(coding);
    i = comma + 1;
  }
  return "";
}

bool IsServerFailure(int status) {
  return status == 500 || status == 502 || status == 503 || status == 504;
}

std::string StoredField(const StoredResponse& stored, std::string_view name) {
  std::string out;
  for (const auto& [n, v] : stored.headers) {
    if (EqualsIgnoreCase(n, name)) out = out.empty() ? v : out + ", " + v;
  }
  return out;
}

}  // namespace

void ClientConnection::StartExchange() {
  ex_ = std::make_unique<Exchange>();
  Exchange& ex = *ex_;
  ex.serial = next_serial_++;
  ex.start = proxy_->clock->Now();
  ex.req = parser_.head();
  ex.log_url = ex.req.target;
  state_ = State::kExchange;
  ++proxy_->stats.requests;
  keep_alive_ = ex.req.keep_alive;
  if (ex.req.framing == http1::BodyFraming::kNone) {
    const http1::Event e = parser_.Parse({});  // the message ends with its head
    ex.request_complete = e.type == http1::EventType::kMessageComplete;
  } else {
    SetReadTimeout(proxy_->options.request_timeout);  // the body must keep arriving
  }

  if (ex.req.method == "CONNECT") {
    StartTunnel();
    return;
  }
  if (const std::string via = ex.req.headers.FindAll("Via");
      !via.empty() && proxy_->ViaHasUs(via)) {
    SendLocal(508,
              "this request has already passed through this proxy (Via: " + via +
                  "): it is forwarded in a loop; check the proxy settings of the origin or the "
                  "next proxy",
              ResultCode::kError, /*close=*/false);
    return;
  }
  switch (ex.req.target_form) {
    case http1::TargetForm::kOrigin: {
      const std::string path = ex.req.target.substr(0, ex.req.target.find('?'));
      if (path == "/ghost/status" || path == "/ghost/metrics") {
        SendStatusPage(ex.req.target);
      } else if (SendDashboardRedirect(path)) {
      } else {
        SendLocal(
            400,
            "ghostproxy is a forward proxy: send absolute URLs (GET http://host/path), i.e. set it "
            "as your HTTP proxy; it serves /ghost/status and /ghost/metrics itself",
            ResultCode::kError, /*close=*/false);
      }
      return;
    }
    case http1::TargetForm::kAsterisk: {
      http1::HeaderList allow;
      allow.Add("Allow", "GET, HEAD, POST, PUT, DELETE, OPTIONS, PATCH, CONNECT");
      SendRaw(200, "text/plain", "", ResultCode::kLocal, /*close=*/false, allow);
      return;
    }
    case http1::TargetForm::kAuthority:  // only CONNECT, handled above
      SendLocal(400, "only CONNECT takes a host:port target", ResultCode::kError, /*close=*/false);
      return;
    case http1::TargetForm::kAbsolute:
      break;
  }
  Result<http1::AbsoluteUrl> url = http1::SplitAbsoluteUrl(ex.req.target);
  if (!url.ok()) {
    const bool unsupported = url.status().code() == Status::Code::kNotSupported;
    SendLocal(unsupported ? 501 : 400, url.status().message(), ResultCode::kError, /*close=*/false);
    return;
  }
  ex.url = *url;
  ex.url_key = UrlKey(ex.url);
  ex.log_url = ex.url_key;
  if (proxy_->IsSelf(ex.url.host, ex.url.port)) {
    const std::string path = ex.url.path.substr(0, ex.url.path.find('?'));
    if (path == "/ghost/status" || path == "/ghost/metrics") {
      SendStatusPage(ex.url.path);
    } else if (SendDashboardRedirect(path)) {
    } else {
      SendLocal(508,
                ex.url_key +
                    " is this proxy's own address: forwarding it would loop (the proxy itself "
                    "serves only /ghost/status and /ghost/metrics)",
                ResultCode::kError, /*close=*/false);
    }
    return;
  }
  ex.req_cc = RequestCacheControl(ex.req.headers);
  if (IsLookupMethod(ex.req.method) && CacheMayAnswer(ex.req)) {
    StartLookup(ex.url_key, /*second_level=*/false);
    return;
  }
  ex.result = ResultCode::kMiss;
  StartFetch();
}

// ---- Cache lookup ----

void ClientConnection::StartLookup(const std::string& key, bool second_level) {
  ex_->step = Exchange::Step::kLookup;
  if (!ex_->skip_memory) {
    // The backend's copy in RAM answers at once (the memory source: no device, no round trip),
    // judged by the same rules as any stored response.
    if (std::shared_ptr<const MemoryObject> m = proxy_->backend->FindInMemory(key)) {
      CacheLookup lookup;  // its response is m->head, not copied (OnLookup)
      lookup.cached = true;
      lookup.choice = CacheChoice::kMemory;
      lookup.memory = std::move(m);
      OnLookup(key, std::move(lookup), second_level);
      return;
    }
  }
  std::weak_ptr<ClientConnection> weak = weak_from_this();
  const std::uint64_t serial = ex_->serial;
  // The backend runs this only while it lives, and the proxy (Impl) owns no backend: a
  // transfer begun for an exchange that is gone is ended through the backend itself.
  CacheBackend* backend = proxy_->backend;
  backend->LookupForFetch(key, [weak, serial, key, second_level, backend](Result<CacheLookup> lookup) {
    std::shared_ptr<ClientConnection> self = weak.lock();
    if (!self || self->state_ != State::kExchange || !self->ex_ || self->ex_->serial != serial ||
        self->ex_->step != Exchange::Step::kLookup) {
      if (lookup.ok() && lookup->transfer) backend->TransferEnd(*lookup->transfer, 0);
      return;
    }
    self->OnLookup(key, std::move(lookup), second_level);
    self->Drive();
  });
}

void ClientConnection::OnLookup(const std::string& key, Result<CacheLookup> lookup,
                                bool second_level) {
  Exchange& ex = *ex_;
  if (lookup.ok() && lookup->transfer) {
    // The miss began the fetch's transfer (LookupForFetch): the fetch below uses it.
    if (ex.transfer_open) {
      proxy_->backend->TransferEnd(*lookup->transfer, 0);
    } else {
      ex.transfer = *lookup->transfer;
      ex.transfer_open = true;
      ++proxy_->transfers_in_progress;
    }
  }
  auto miss = [&] {
    ex.result = ResultCode::kMiss;
    if (ex.req_cc.only_if_cached) {
      SendLocal(504, ex.url_key + " is not in the cache and the request says only-if-cached",
                ResultCode::kError,
                /*close=*/false);
      return;
    }
    StartFetch();
  };
  if (!lookup.ok()) {
    // The cache is unavailable: the request still deserves an answer from the origin.
    std::fprintf(stderr, "ghostproxy: cache lookup of %s failed: %s\n", key.c_str(),
                 lookup.status().message().c_str());
    miss();
    return;
  }
  if (lookup->ghost_hint) ++proxy_->stats.ghost_hints;
  // A RAM copy's head is read where it is (a hit copies no fields).
  const StoredResponse& response = lookup->memory ? lookup->memory->head : lookup->response;
  if (!lookup->cached) {
    miss();
    return;
  }
  std::string vary;
  if (IsVaryIndex(response, &vary)) {
    if (second_level || vary.empty()) {
      miss();
      return;
    }
    ex.vary = vary;
    StartLookup(VariantKey(ex.url_key, vary, ex.req.headers), /*second_level=*/true);
    return;
  }
  if (!second_level) {
    // A response with Vary stored under the plain URL (by ghostfs, whose requests carry none of
    // the fields browsers vary on) matches only requests without those fields either.
    const std::string v = StoredField(response, "Vary");
    if (!v.empty() && VariantKey(ex.url_key, v, ex.req.headers) != VariantKey(ex.url_key, v, {})) {
      miss();
      return;
    }
  }
  ex.key = key;
  ex.memory = lookup->memory;
  // A RAM copy's head stays in ex.memory (DecideFromStored serves it or drops the copy).
  // DecideFromStored reads only lookup->choice.
  if (!ex.memory) ex.stored = std::move(lookup->response);
  ex.body = lookup->body;  // every slice reads this version
  DecideFromStored(*lookup);
}

void ClientConnection::DecideFromStored(const CacheLookup& lookup) {
  Exchange& ex = *ex_;
  ex.stored_state =
      ex.memory ? EvaluateStored(HitMemo().freshness, ex.req_cc, proxy_->UnixNow())
                : EvaluateStored(*ex.stored, ex.req_cc, proxy_->UnixNow(),
                                 proxy_->options.heuristic_freshness);
  const StoredState& st = ex.stored_state;
  if (lookup.choice == CacheChoice::kMemory) {
    if (st.usable) {
      ServeFromCache(ex.memory ? ex.memory->head : *ex.stored, ResultCode::kMemHit, "cache");
      return;
    }
    // Stale, or the client asks for more than this copy gives: the backend decides as for
    // any stored copy (revalidation, the network, the disk), with the daemon's cost model.
    ex.memory.reset();
    ex.stored.reset();
    ex.skip_memory = true;
    StartLookup(ex.key, /*second_level=*/!ex.vary.empty());
    return;
  }
  ex.memory.reset();  // only a kMemory answer is served from RAM
  if (st.usable) {
    if (lookup.choice == CacheChoice::kDisk) {
      ServeFromCache(*ex.stored, ResultCode::kHit, "cache");
      return;
    }
    // The network is cheaper now than the disk (the backend has sent the disk its ghost hint):
    // fetch the client's request as it is, keep the copy as the fallback.
    ex.net_preferred = true;
    ex.fallback_to_cache = true;
    ex.result = ResultCode::kNetPreferred;
    StartFetch();
    return;
  }
  if (ex.req_cc.only_if_cached) {
    SendLocal(504,
              "the cached copy of " + ex.url_key + " is stale and the request says only-if-cached",
              ResultCode::kError, /*close=*/false);
    return;
  }
  if (lookup.choice == CacheChoice::kNetwork || ex.req.method == "HEAD" || !st.has_validators) {
    ex.net_preferred = lookup.choice == CacheChoice::kNetwork;
    ex.result = ex.net_preferred ? ResultCode::kNetPreferred : ResultCode::kMiss;
    StartFetch();
    return;
  }
  ex.revalidating = true;
  ex.result = ResultCode::kRevalidated;
  StartFetch();
}

// ---- The origin ----

void ClientConnection::StartFetch() {
  Exchange& ex = *ex_;
  ex.step = Exchange::Step::kOrigin;
  if (!ex.transfer_open) {
    ex.transfer = proxy_->backend->TransferBegin();
    ex.transfer_open = true;
    ++proxy_->transfers_in_progress;
  }
  if (ex.stored && (ex.fallback_to_cache || ex.stored_state.may_serve_stale)) {
    // A copy can answer: a stalled origin should not hold the client for origin_timeout.
    std::weak_ptr<ClientConnection> weak = weak_from_this();
    const std::uint64_t serial = ex.serial;
    fallback_timer_.Arm(proxy_->options.fallback_timeout, [weak, serial] {
      std::shared_ptr<ClientConnection> self = weak.lock();
      if (!self || self->state_ != State::kExchange || !self->ex_ || self->ex_->serial != serial ||
          self->ex_->step != Exchange::Step::kOrigin || self->ex_->origin_head_seen) {
        return;
      }
      self->OnOriginFailed(
          Status::TimedOut("origin " + self->ex_->url.Authority() + " sent no response within " +
                           DurationText(self->proxy_->options.fallback_timeout)),
          /*bad_response=*/false);
      self->Drive();
    });
  }
  ConnectOrigin();
}

void ClientConnection::ConnectOrigin() {
  Exchange& ex = *ex_;
  ++ex.attempts;
  ex.origin_head_seen = false;
  ex.origin_paused = false;
  ex.hierarchy = "DIRECT/" + ex.url.host;
  std::unique_ptr<OriginConn> pooled =
      proxy_->TakeIdle(ex.url.host + ":" + std::to_string(ex.url.port));
  if (pooled) {
    ex.origin = std::move(pooled);
    ex.origin->SetOwner(this);
    ++proxy_->stats.origin_reuses;
    SendOriginRequest();
    return;
  }
  ex.origin = std::make_unique<OriginConn>(proxy_, ex.url.host, ex.url.port);
  ex.origin->SetOwner(this);
  ++proxy_->stats.origin_connections;
  ex.origin->Connect();
}

void ClientConnection::SendOriginRequest() {
  Exchange& ex = *ex_;
  OriginConn& o = *ex.origin;
  ex.hierarchy = "DIRECT/" + o.peer();
  http1::RequestHead out;
  out.method = ex.req.method;
  out.target = ex.url.path;
  out.version_minor = 1;
  http1::HeaderList fields = ex.req.headers;
  http1::RemoveHopByHopHeaders(&fields);
  const bool expect_continue = fields.HasToken("Expect", "100-continue");
  if (expect_continue) fields.Remove("Expect");  // the proxy answers it (below)
  const std::string via = fields.FindAll("Via");
  for (const char* name : {"Host", "Content-Length", "Via"}) fields.Remove(name);
  out.headers.Add("Host", ex.url.Authority());
  for (const http1::HeaderField& f : fields) out.headers.Add(f.name, f.value);
  out.headers.Add("Via", (via.empty() ? "" : via + ", ") + "1." +
                             std::to_string(ex.req.version_minor) + " " + proxy_->via_name);
  if (ex.revalidating) SetValidators(*ex.stored, &out.headers);
  if (ex.req.framing == http1::BodyFraming::kContentLength) {
    out.headers.Add("Content-Length", std::to_string(ex.req.content_length));
  } else if (ex.req.framing == http1::BodyFraming::kChunked) {
    out.headers.Add("Transfer-Encoding", "chunked");
  }
  std::string head;
  if (Status s = http1::AppendRequestHead(out, &head); !s.ok()) {
    AbortExchange();
    SendLocal(400, "the request cannot be forwarded: " + s.message(), ResultCode::kError,
              /*close=*/true);
    return;
  }
  evbuffer_add(o.output(), head.data(), head.size());
  o.parser().SetRequestMethod(ex.req.method);
  const timeval tv = ToTimeval(proxy_->options.origin_timeout);
  bufferevent_set_timeouts(o.bev(), &tv, &tv);
  bufferevent_setwatermark(o.bev(), EV_WRITE, proxy_->options.high_watermark / 2, 0);
  bufferevent_enable(o.bev(), EV_READ | EV_WRITE);
  if (!ex.request_complete) {
    ex.body_sink_ready = true;
    if (expect_continue && ex.req.version_minor >= 1 && !ex.sent_continue && !ex.response_started) {
      static constexpr std::string_view kContinue = "HTTP/1.1 100 Continue\r\n\r\n";
      evbuffer_add(output(), kContinue.data(), kContinue.size());
      ex.sent_continue = true;
    }
  }
}

void ClientConnection::OnOriginReadable(bool force) {
  while (state_ == State::kExchange && ex_ && ex_->origin && (force || !ex_->origin_paused)) {
    Exchange& ex = *ex_;
    OriginConn& o = *ex.origin;
    std::size_t len = 0;
    const std::string_view data = Pullup(o.input(), &len);
    // Parse even with no bytes: the end of a Content-Length body is reported by the call after
    // its last bytes.
    const http1::Event e = o.parser().Parse(data);
    ex.origin_bytes += e.consumed;
    switch (e.type) {
      case http1::EventType::kNeedMore:
        evbuffer_drain(o.input(), e.consumed);
        if (evbuffer_get_length(o.input()) == 0) return;
        continue;
      case http1::EventType::kHead:
        evbuffer_drain(o.input(), e.consumed);
        if (o.parser().head().status < 200) continue;  // 1xx: the final response follows
        if (const std::string coding = OtherTransferCoding(o.parser().head()); !coding.empty()) {
          // The proxy removes the chunked framing and with it the Transfer-Encoding field: the
          // client (and the cache) would take gzip-coded bytes for the body (as nginx does,
          // such a response is refused).
          OnOriginFailed(Status::InvalidArgument("bad response from " + o.pool_key() +
                                                 ": transfer coding \"" + coding +
                                                 "\" (the proxy passes on only chunked)"),
                         /*bad_response=*/true);
          return;
        }
        ex.origin_head_seen = true;
        ex.origin_head = o.parser().head();
        OnOriginHead();
        continue;
      case http1::EventType::kBody:
        OnOriginBody(e.body);  // before the drain: the bytes live in the buffer
        evbuffer_drain(o.input(), e.consumed);
        continue;
      case http1::EventType::kMessageComplete:
        evbuffer_drain(o.input(), e.consumed);
        if (!ex.origin_head_seen) continue;  // the end of a 1xx
        OnOriginComplete();
        return;
      case http1::EventType::kError:
      case http1::EventType::kTunnel:
      case http1::EventType::kEnd: {
        evbuffer_drain(o.input(), e.consumed);
        const std::string why = e.type == http1::EventType::kError
                                    ? o.parser().error().message
                                    : std::string("unexpected end of the response");
        OnOriginFailed(Status::InvalidArgument("bad response from " + o.pool_key() + ": " + why),
                       /*bad_response=*/true);
        return;
      }
    }
  }
}

void ClientConnection::OnOriginHead() {
  Exchange& ex = *ex_;
  const http1::ResponseHead& h = ex.origin_head;
  const std::int64_t now = proxy_->UnixNow();
  if (ex.revalidating && h.status == 304) {
    StoredResponse refreshed =
        RefreshStored(*ex.stored, h, now, proxy_->options.heuristic_freshness);
    proxy_->backend->Refresh(ex.key, refreshed);
    ex.stored = refreshed;
    ex.discard_origin_body = true;
    ServeFromCache(*ex.stored, ResultCode::kRevalidated, "revalidated");
    return;
  }
  if (IsServerFailure(h.status) && ex.stored &&
      (ex.fallback_to_cache || ex.stored_state.may_serve_stale)) {
    ReleaseOrigin(/*reusable=*/false);  // its error body is not wanted
    ServeFailure();
    return;
  }
  if (ex.revalidating || ex.result == ResultCode::kNone) ex.result = ResultCode::kMiss;

  // Unsafe methods invalidate what is stored for their URL (RFC 9111 §4.4).
  if (InvalidatesCache(ex.req.method) && h.status >= 200 && h.status < 400) {
    proxy_->backend->Invalidate(ex.url_key);
  }
  if (ex.req.method == "GET" && !ex.fallback_to_cache) {
    const StorageDecision d = DecideStorage(ex.req, h, now, proxy_->options.heuristic_freshness);
    if (d.store) {
      StartStore(h, d);
    } else if (ex.stored && h.status == 200) {
      proxy_->backend->Invalidate(ex.key);  // the origin no longer lets this be stored
    }
  }

  http1::HeaderList fields = h.headers;
  http1::RemoveHopByHopHeaders(&fields);
  const bool body_follows = h.framing != http1::BodyFraming::kNone;
  Exchange::Framing framing = Exchange::Framing::kNone;
  if (h.framing == http1::BodyFraming::kContentLength) {
    framing = Exchange::Framing::kLength;
  } else if (body_follows) {
    framing = Exchange::Framing::kChunked;  // length unknown: re-chunk (or close for HTTP/1.0)
    fields.Remove("Content-Length");
  }
  WriteResponseHead(h.status, h.reason, std::move(fields), "network", framing, body_follows,
                    /*defer=*/false);
  if (framing == Exchange::Framing::kLength && ex.transfer_open) StartCardData(h.content_length);
  // Download shaping (proxy/shaper.h): a large declared length from the network.
  if (framing == Exchange::Framing::kLength && ex.origin && !ex.discard_origin_body &&
      h.content_length > proxy_->options.shaping.threshold) {
    ex.origin->StartShaping(h.content_length);
  }
}

void ClientConnection::StartCardData(Bytes body_bytes) {
  Exchange& ex = *ex_;
  if (ex.card_data_sent || !ex.transfer_open) return;
  ex.card_data_sent = true;
  ex.card_pending = true;
  std::weak_ptr<ClientConnection> weak = weak_from_this();
  const std::uint64_t serial = ex.serial;
  proxy_->backend->TransferData(ex.transfer, body_bytes, [weak, serial] {
    std::shared_ptr<ClientConnection> self = weak.lock();
    if (!self || self->state_ != State::kExchange || !self->ex_ || self->ex_->serial != serial)
      return;
    self->OnCardDone();
    self->Drive();
  });
}

void ClientConnection::OnCardDone() {
  Exchange& ex = *ex_;
  ex.card_pending = false;
  if (ex.step != Exchange::Step::kOrigin) return;  // served otherwise (a failure, the cache)
  if (!ex.held.empty()) {
    WriteBody(ex.held);
    ex.held.clear();
  }
  if (ex.complete_after_card) {
    ex.complete_after_card = false;
    EndBody();
    CommitStore();
    ex.step = Exchange::Step::kDone;
  }
}

void ClientConnection::OnOriginBody(std::string_view data) {
  Exchange& ex = *ex_;
  if (ex.discard_origin_body || ex.step != Exchange::Step::kOrigin) return;
  ex.origin_body_bytes += data.size();
  if (ex.writer) ex.writer->Write(std::string(data));
  if (ex.card_pending && !data.empty()) {
    // The last byte waits for the card: keep one byte back until it is through.
    WriteBody(ex.held);
    ex.held.assign(1, data.back());
    data.remove_suffix(1);
  }
  WriteBody(data);
  // Download shaping: an unknown length that has grown past the threshold.
  if (ex.origin && !ex.origin->shaping() &&
      ex.origin_body_bytes >= proxy_->options.shaping.threshold) {
    ex.origin->StartShaping(0);
  }
  if (ClientBackedUp() && !ex.origin_paused && ex.origin) {
    // A slow client: stop reading the origin (its window closes) until half has drained.
    ex.origin_paused = true;
    ex.origin->PauseReading(true);
  }
}

void ClientConnection::OnClientDrained() {
  if (!ex_) return;
  Exchange& ex = *ex_;
  if (ex.origin_paused && ex.origin && !ClientBackedUp()) {
    ex.origin_paused = false;
    ex.origin->PauseReading(false);
    OnOriginReadable(/*force=*/false);
  }
  if (ex_ && ex_->step == Exchange::Step::kCacheBody && !ex_->cache_read_in_flight &&
      !ClientBackedUp()) {
    ReadNextCacheSlice();
  }
}

void ClientConnection::OnOriginComplete() {
  Exchange& ex = *ex_;
  const bool reusable = ex.origin_head.keep_alive && ex.request_complete && ex.origin &&
                        evbuffer_get_length(ex.origin->input()) == 0;
  const bool streaming = ex.step == Exchange::Step::kOrigin && !ex.discard_origin_body;
  // A body of unknown length: the card learns its size now (and the end waits for it).
  if (streaming && ex.transfer_open && !ex.card_data_sent) StartCardData(ex.origin_body_bytes);
  ReleaseOrigin(reusable);
  if (streaming && ex.card_pending) {
    ex.complete_after_card = true;
    return;
  }
  if (streaming) {
    EndBody();
    CommitStore();
    ex.step = Exchange::Step::kDone;
  }
}

void ClientConnection::OnOriginEof() {
  OnOriginReadable(/*force=*/true);  // what arrived before the end first
  if (state_ != State::kExchange || !ex_ || !ex_->origin) return;  // that completed it
  Exchange& ex = *ex_;
  const http1::Event e = ex.origin->parser().Eof();
  if (e.type == http1::EventType::kMessageComplete && ex.origin_head_seen) {
    OnOriginComplete();  // a body delimited by the close
    return;
  }
  if (!ex.origin_head_seen) {
    OnOriginFailed(Status::Unavailable("origin " + ex.origin->pool_key() +
                                       " closed the connection without answering"),
                   /*bad_response=*/false);
  } else {
    OnOriginFailed(Status::Unavailable("origin " + ex.origin->pool_key() +
                                       " closed the connection in the middle of the response"),
                   /*bad_response=*/true);
  }
}

void ClientConnection::OnOriginFailed(Status why, bool bad_response) {
  Exchange& ex = *ex_;
  // A pooled connection that fails before any answer was most likely closed by the origin while
  // idle: try once more on a new one, unless part of a request body has gone.
  if (ex.origin && ex.origin->reused && !ex.origin_head_seen && !ex.request_body_started &&
      !bad_response && why.code() != Status::Code::kTimedOut && ex.attempts < 3) {
    ex.origin.reset();
    ConnectOrigin();
    return;
  }
  ex.origin.reset();
  ex.origin_paused = false;
  ex.body_sink_ready = false;
  EndTransfer();
  if (ex.origin_head_seen) {
    if (ex.step == Exchange::Step::kOrigin && !ex.discard_origin_body) {
      // Cut in the middle of the body: the client sees the truncation (no last chunk, or fewer
      // bytes than Content-Length); nothing is stored.
      if (ex.writer) {
        ex.writer->Abort();
        ex.writer.reset();
      }
      std::fprintf(stderr, "ghostproxy: %s: %s\n", ex.log_url.c_str(), why.message().c_str());
      Close();
    }
    return;  // otherwise the client is served from the cache; the origin was only finishing
  }
  if (ServeFailure()) return;
  const std::string what =
      bad_response ? "the origin sent a bad response for " + ex.url_key + ": " + why.message()
                   : "cannot reach " + ex.url_key + " (" + why.message() +
                         ") and no cached copy may be served; "
                         "try again when the origin is reachable";
  SendLocal(bad_response ? 502 : 504, what, ResultCode::kError, /*close=*/false);
}

bool ClientConnection::ServeFailure() {
  Exchange& ex = *ex_;
  if (!ex.stored) return false;
  if (ex.fallback_to_cache) {
    ServeFromCache(*ex.stored, ResultCode::kHit, "cache");  // fresh: the network was only cheaper
    return true;
  }
  if (ex.stored_state.may_serve_stale) {
    ServeFromCache(*ex.stored, ResultCode::kStale, "stale");
    return true;
  }
  return false;
}

void ClientConnection::ReleaseOrigin(bool reusable) {
  Exchange& ex = *ex_;
  EndTransfer();
  ex.body_sink_ready = false;
  ex.origin_paused = false;
  if (!ex.origin) return;
  if (reusable) {
    ex.origin->reused = true;
    proxy_->PutIdle(std::move(ex.origin));
  } else {
    ex.origin.reset();
  }
}

void ClientConnection::EndTransfer() {
  if (!ex_ || !ex_->transfer_open) return;
  ex_->transfer_open = false;
  --proxy_->transfers_in_progress;
  proxy_->stats.bytes_from_origins += ex_->origin_bytes;
  // A body being stored may carry the end with its commit (one control round trip less).
  if (ex_->writer && ex_->writer->TakeTransferEnd(ex_->transfer)) return;
  proxy_->backend->TransferEnd(ex_->transfer, ex_->origin_bytes);
}

// ---- Serving a stored response ----

namespace {

// The stored fields a cached answer carries (before WriteResponseHead adds the proxy's own).
http1::HeaderList ServedFields(const StoredResponse& stored) {
  http1::HeaderList fields;
  for (const auto& [name, value] : stored.headers) {
    if (EqualsIgnoreCase(name, "Age") || EqualsIgnoreCase(name, "Content-Length") ||
        EqualsIgnoreCase(name, "Content-Range") || http1::IsHopByHopHeader(name)) {
      continue;
    }
    fields.Add(name, value);
  }
  return fields;
}

// A GET that takes the stored response whole and as it is: no conditional, no range.
bool IsPlainGet(const http1::RequestHead& req) {
  return req.method == "GET" && !req.headers.Find("If-None-Match") &&
         !req.headers.Find("If-Modified-Since") && !req.headers.Find("Range");
}

}  // namespace

const MemoryHitMemo& ClientConnection::HitMemo() {
  const MemoryObject& m = *ex_->memory;
  const Duration heuristic = proxy_->options.heuristic_freshness;
  if (m.memo && m.memo->heuristic == heuristic && m.memo->via_name == proxy_->via_name)
    return *m.memo;
  auto memo = std::make_shared<MemoryHitMemo>();
  memo->via_name = proxy_->via_name;
  memo->heuristic = heuristic;
  memo->freshness = PrepareStored(m.head, heuristic);
  // The fields as ServeFromCache and WriteResponseHead arrange them: the stored ones, then Age
  // and Content-Length (written per hit), then Via and X-Ghost-Source.
  http1::HeaderList fields = ServedFields(m.head);
  const std::string via = fields.FindAll("Via");
  for (const char* name : {"Via", "X-Ghost-Source", "Transfer-Encoding", "Connection"})
    fields.Remove(name);
  if (const std::string* ct = fields.Find("Content-Type")) memo->content_type = *ct;
  const std::string our_via = (via.empty() ? "" : via + ", ") + "1.1 " + proxy_->via_name;
  http1::ResponseHead head;
  head.version_minor = 1;
  head.status = m.head.status;
  head.headers = fields;
  // Checked whole (with every field a hit adds) once, as WriteResponseHead checks each head.
  http1::ResponseHead whole = head;
  whole.headers.Add("Age", "0");
  whole.headers.Add("Content-Length", std::to_string(m.head.size));
  whole.headers.Add("Via", our_via);
  whole.headers.Add("X-Ghost-Source", "cache");
  std::string check;
  // A 204's head has no Content-Length: it takes the general path (ServeFromCache).
  if (m.head.status != 204 && http1::AppendResponseHead(whole, &check).ok() &&
      http1::AppendResponseHead(head, &memo->head).ok()) {
    memo->head.resize(memo->head.size() - 2);  // the empty line ending the head comes later
    memo->tail = "Via: " + our_via + "\r\nX-Ghost-Source: cache\r\n";
    memo->head_ok = true;
  }
  m.memo = std::move(memo);
  return *m.memo;
}

bool ClientConnection::ServePlainMemoryHit(const StoredState& st) {
  Exchange& ex = *ex_;
  if (!IsPlainGet(ex.req)) return false;
  const MemoryHitMemo& memo = HitMemo();
  if (!memo.head_ok) return false;
  const Bytes length = ex.memory->head.size;
  std::string& out = ex.deferred_head;
  out.reserve(memo.head.size() + memo.tail.size() + 64);
  out = memo.head;
  out += "Age: ";
  out += std::to_string(std::max<std::int64_t>(0, st.age));
  out += "\r\nContent-Length: ";
  out += std::to_string(length);
  out += "\r\n";
  out += memo.tail;
  if (!keep_alive_) {
    out += "Connection: close\r\n";
  } else if (ex.req.version_minor == 0) {
    out += "Connection: keep-alive\r\n";
  }
  out += "\r\n";
  ex.status = ex.memory->head.status;
  ex.response_started = true;
  ex.framing = Exchange::Framing::kLength;
  ex.content_type = memo.content_type;
  WriteMemoryBody(0, length);  // the head, then the body
  ex.step = Exchange::Step::kDone;
  return true;
}

void ClientConnection::ServeFromCache(const StoredResponse& stored, ResultCode code,
                                      const char* source) {
  Exchange& ex = *ex_;
  ex.result = code;
  if (ex.memory) {
    // Every answer made from the RAM copy is a read of the memory source, for the stats.
    const bool body =
        ex.req.method != "HEAD" && (IsPlainGet(ex.req) || !IsNotModified(ex.req, stored));
    proxy_->backend->ServedFromMemory(ex.key, body ? stored.size : 0);
  }
  const StoredState st = ex.memory ? EvaluateStored(HitMemo().freshness, CacheControl{},
                                                    proxy_->UnixNow())
                                   : EvaluateStored(stored, CacheControl{}, proxy_->UnixNow(),
                                                    proxy_->options.heuristic_freshness);
  if (ex.memory && code == ResultCode::kMemHit && ServePlainMemoryHit(st)) return;
  const std::string age = std::to_string(std::max<std::int64_t>(0, st.age));
  if (IsNotModified(ex.req, stored)) {
    http1::HeaderList fields = NotModifiedFields(stored);
    fields.Add("Age", age);
    WriteResponseHead(304, "", std::move(fields), source, Exchange::Framing::kNone, false, false);
    ex.step = Exchange::Step::kDone;
    return;
  }
  http1::HeaderList fields = ServedFields(stored);
  fields.Add("Age", age);
  const RangeDecision range = EvaluateRange(ex.req, stored, stored.size);
  int status = stored.status;
  Bytes first = 0;
  Bytes length = stored.size;
  if (range.kind == RangeDecision::Kind::kUnsatisfiable) {
    fields.Add("Content-Range", "bytes */" + std::to_string(stored.size));
    fields.Add("Content-Length", "0");
    WriteResponseHead(416, "", std::move(fields), source, Exchange::Framing::kLength, true, false);
    ex.step = Exchange::Step::kDone;
    return;
  }
  if (range.kind == RangeDecision::Kind::kPartial) {
    status = 206;
    first = range.first;
    length = range.last - range.first + 1;
    fields.Add("Content-Range", "bytes " + std::to_string(range.first) + "-" +
                                    std::to_string(range.last) + "/" + std::to_string(stored.size));
  }
  // A 204 has no body and no Content-Length (RFC 9110 §8.6: a server MUST NOT send one).
  if (status != 204) fields.Add("Content-Length", std::to_string(length));
  const bool head_only = ex.req.method == "HEAD";
  if (head_only || length == 0 || status == 204) {
    WriteResponseHead(status, "", std::move(fields), source,
                      status == 204 ? Exchange::Framing::kNone : Exchange::Framing::kLength,
                      !head_only && status != 204, false);
    ex.step = Exchange::Step::kDone;
    return;
  }
  if (ex.memory) {
    // The whole body is here: head and body go out together (WriteMemoryBody), nothing to
    // wait for.
    WriteResponseHead(status, "", std::move(fields), source, Exchange::Framing::kLength, true,
                      /*defer=*/true);
    if (ex.result == code) WriteMemoryBody(first, length);  // else the head could not be written
    ex.step = Exchange::Step::kDone;
    return;
  }
  // The head waits for the first body bytes: a copy evicted meanwhile is then fetched instead.
  WriteResponseHead(status, "", std::move(fields), source, Exchange::Framing::kLength, true,
                    /*defer=*/true);
  ex.cache_offset = first;
  ex.cache_end = first + length;
  ex.step = Exchange::Step::kCacheBody;
  ReadNextCacheSlice();
}

void ClientConnection::ReadNextCacheSlice() {
  Exchange& ex = *ex_;
  if (ex.cache_read_in_flight || ex.step != Exchange::Step::kCacheBody) return;
  if (ex.cache_offset >= ex.cache_end) {
    EndBody();
    ex.step = Exchange::Step::kDone;
    return;
  }
  const Bytes length =
      std::min<Bytes>(proxy_->options.cache_read_slice, ex.cache_end - ex.cache_offset);
  const Bytes start = ex.cache_offset;
  ex.cache_read_in_flight = true;
  std::weak_ptr<ClientConnection> weak = weak_from_this();
  const std::uint64_t serial = ex.serial;
  auto current = [weak, serial]() -> std::shared_ptr<ClientConnection> {
    std::shared_ptr<ClientConnection> self = weak.lock();
    if (!self || self->state_ != State::kExchange || !self->ex_ || self->ex_->serial != serial ||
        self->ex_->step != Exchange::Step::kCacheBody) {
      return nullptr;
    }
    return self;
  };
  proxy_->backend->ReadBody(
      ex.key, ex.body, start, length,
      [current](std::string_view data) -> bool {
        std::shared_ptr<ClientConnection> self = current();
        if (!self) return false;
        Exchange& e = *self->ex_;
        data = data.substr(0, static_cast<std::size_t>(e.cache_end - e.cache_offset));
        self->WriteBody(data);
        e.cache_offset += data.size();
        return e.cache_offset < e.cache_end;
      },
      [current, start](Status status) {
        std::shared_ptr<ClientConnection> self = current();
        if (!self) return;
        Exchange& e = *self->ex_;
        e.cache_read_in_flight = false;
        if (!status.ok() || e.cache_offset == start) {
          if (!e.deferred_head.empty()) {
            // Nothing sent yet: the copy went away (evicted) or cannot be read. Fetch it.
            std::fprintf(stderr, "ghostproxy: cached %s unreadable (%s); fetching it\n",
                         e.key.c_str(), status.ok() ? "no bytes" : status.message().c_str());
            e.deferred_head.clear();
            e.response_started = false;
            e.bytes_sent = 0;
            e.stored.reset();
            e.fallback_to_cache = e.revalidating = e.discard_origin_body = false;
            e.result = ResultCode::kMiss;
            if (e.origin) self->ReleaseOrigin(/*reusable=*/false);
            self->StartFetch();
          } else {
            self->Close();  // cut in the middle: the client sees fewer bytes than announced
          }
          self->Drive();
          return;
        }
        if (e.cache_offset >= e.cache_end) {
          self->EndBody();
          e.step = Exchange::Step::kDone;
        } else if (!self->ClientBackedUp()) {
          self->ReadNextCacheSlice();
        }  // else OnClientDrained asks for the next slice
        self->Drive();
      });
}

// ---- Storing ----

void ClientConnection::StartStore(const http1::ResponseHead& head,
                                  const StorageDecision& decision) {
  Exchange& ex = *ex_;
  ex.store_vary = head.headers.FindAll("Vary");
  ex.store_key =
      ex.store_vary.empty() ? ex.url_key : VariantKey(ex.url_key, ex.store_vary, ex.req.headers);
  const Bytes size = head.framing == http1::BodyFraming::kContentLength ? head.content_length : 0;
  ex.store_head = MakeStoredResponse(head, decision.freshness, proxy_->UnixNow(), size);
  ex.writer = proxy_->backend->Store(ex.store_key, ex.store_head);
}

void ClientConnection::CommitStore() {
  Exchange& ex = *ex_;
  if (!ex.writer) return;
  std::unique_ptr<CacheWriter> writer = std::move(ex.writer);
  Impl* proxy = proxy_;
  std::weak_ptr<bool> alive = proxy_->alive;
  writer->Commit([proxy, alive, vary = ex.store_vary, url_key = ex.url_key](Status s) {
    if (alive.expired()) return;
    if (!s.ok()) {
      ++proxy->stats.store_failures;
      std::fprintf(stderr, "ghostproxy: storing %s failed: %s\n", url_key.c_str(),
                   s.message().c_str());
      return;
    }
    ++proxy->stats.stores;
    if (!vary.empty()) {
      // The URL key now points lookups at the variants.
      std::unique_ptr<CacheWriter> index =
          proxy->backend->Store(url_key, MakeVaryIndex(vary, proxy->UnixNow()));
      if (index) index->Commit([](Status) {});
    }
  });
}

void ClientConnection::AbortExchange() {
  if (!ex_) return;
  Exchange& ex = *ex_;
  if (ex.writer) {
    ex.writer->Abort();
    ex.writer.reset();
  }
  ex.origin.reset();
  ex.body_sink_ready = false;
  ex.origin_paused = false;
  EndTransfer();
}

void ClientConnection::FinishExchange() {
  Exchange& ex = *ex_;
  fallback_timer_.Cancel();
  if (ex.logged) return;
  ex.logged = true;
  if (ex.origin) ReleaseOrigin(/*reusable=*/false);  // e.g. a 304 not fully read: not reusable
  EndTransfer();
  ProxyStats& s = proxy_->stats;
  switch (ex.result) {
    case ResultCode::kHit:
      ++s.hit;
      break;
    case ResultCode::kMemHit:
      ++s.mem_hit;
      break;
    case ResultCode::kMiss:
      ++s.miss;
      break;
    case ResultCode::kNetPreferred:
      ++s.net_preferred;
      break;
    case ResultCode::kRevalidated:
      ++s.revalidated;
      break;
    case ResultCode::kStale:
      ++s.stale;
      break;
    case ResultCode::kTunnel:
      ++s.tunnel;
      break;
    case ResultCode::kLocal:
      ++s.local;
      break;
    case ResultCode::kDenied:
      ++s.denied;
      break;
    case ResultCode::kError:
    case ResultCode::kNone:
      ++s.error;
      break;
  }
  s.bytes_to_clients += ex.bytes_sent;
  proxy_->LogAccess(ex.start, peer_text_, ex.result, ex.status, ex.bytes_sent, ex.req.method,
                    ex.log_url, ex.hierarchy, ex.content_type);
}

}  // namespace ghost::proxy_internal
