// GhostfsBackend (see ghostfs_backend.h for how ghostproxy and ghostfs share one cache).
#include "proxy/ghostfs_backend.h"

#include <event2/event.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <deque>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <utility>
#include <vector>

#include "common/control/control.h"
#include "common/control/protocol.h"
#include "common/base/clock.h"
#include "common/base/file_io.h"
#include "common/http/http_message.h"
#include "common/base/uring_file_io.h"
#include "proxy/memory_cache.h"

namespace ghost {

namespace {

using nlohmann::json;

// Bodies are read and written in pieces of this size (one io_uring request each).
constexpr std::size_t kPiece = 256 * 1024;
// A "store" request's other fields may take this much of its line (the control server's
// limit is 64 KiB; an inline body's base64 takes up to 21848 bytes).
constexpr std::size_t kMaxInlineHeadBytes = 32 * 1024;

std::int64_t UnixNow() { return static_cast<std::int64_t>(std::time(nullptr)); }

void LogError(const std::string& what, const Status& s) {
  std::fprintf(stderr, "ghostproxy: %s: %s\n", what.c_str(), s.ToString().c_str());
}

// The fields of the control protocol's "store"/"refresh" that the daemon's index keeps.
json StoreArgs(const std::string& key, const StoredResponse& head) {
  json args = {{"key", key}, {"response", SerializeStoredResponse(head)}};
  for (const auto& [name, value] : head.headers) {
    if (EqualsIgnoreCase(name, "ETag")) args["etag"] = value;
    if (EqualsIgnoreCase(name, "Last-Modified")) args["last_modified"] = value;
    if (EqualsIgnoreCase(name, "Content-Type")) args["content_type"] = value;
  }
  args["expires_unix"] = head.expires_unix ? json(*head.expires_unix) : json();
  return args;
}

// At least the length of `args.dump()`, without writing it: a string's byte takes at most 6
// characters (\u00XX), a number, bool or null at most 32. The store's arguments are dumped once
// more for the request itself; dumping them to measure them too (the head's JSON, escaped) was
// a third of ghostproxy's serialising in a fill of small objects (perf, round 12).
std::size_t DumpLengthBound(const json& args) {
  std::size_t n = 2;
  for (const auto& [name, value] : args.items()) {
    n += 6 * name.size() + 4;
    if (value.is_string()) {
      n += 6 * value.get_ref<const std::string&>().size() + 2;
    } else if (value.is_primitive()) {
      n += 32;
    } else {
      n += value.dump().size();
    }
  }
  return n;
}

// A stored head for an object ghostfs fetched itself (no "response" in the index).
StoredResponse HeadFromIndex(const LookupResult& r) {
  StoredResponse head;
  head.status = 200;
  head.size = r.size;
  for (const auto& [name, value] : {std::pair<const char*, const std::string&>{"Content-Type", r.content_type},
                                    {"ETag", r.etag},
                                    {"Last-Modified", r.last_modified}}) {
    if (!value.empty()) head.headers.emplace_back(name, value);
  }
  head.stored_unix = UnixNow();
  head.expires_unix = r.expires_unix;
  return head;
}

// One body being handed to the daemon. A small one (at most kMaxInlineStoreBytes, with a head
// that leaves its base64 room in one control line) is collected here and sent in the "store"
// request itself when it is committed: one round trip, no FUSE traffic. A larger one — or one
// whose declared length is larger — goes through .ghost/fill/<token>: "store" is sent as soon
// as the body is known not to fit, and the bytes are written to the path it answers. Shared
// with the callbacks of its control request and writes, so it outlives an early-destroyed
// writer.
struct FillState : std::enable_shared_from_this<FillState> {
  event_base* base = nullptr;
  FileIo* io = nullptr;
  std::weak_ptr<bool> backend_alive;
  // Still collecting a body that may go inline (`small`); false once the fill file is asked
  // for (open_file has run) or the inline store was sent.
  bool collecting = true;
  std::string small;
  // Both set by the backend, and both check that it is alive: ask for the fill file (its
  // answer calls Start), or send `small` inline (the answer runs the commit's `done`).
  std::function<void()> open_file;
  std::function<void(std::string body, std::uint64_t transfer, std::function<void(Status)> done)>
      store_inline;
  // The fetch's transfer, taken to end with the inline store (0: none); `end_transfer` ends
  // it otherwise (set by the backend, checks that it is alive).
  std::uint64_t transfer_end = 0;
  std::function<void(std::uint64_t)> end_transfer;
  void ReleaseTransfer() {
    const std::uint64_t t = transfer_end;
    transfer_end = 0;
    if (t != 0 && end_transfer) end_transfer(t);
  }
  // The body goes to the fill file from now on: what was collected is written first.
  void SwitchToFile() {
    ReleaseTransfer();
    collecting = false;
    if (!small.empty()) waiting.push_back(std::move(small));
    small.clear();
    auto open = std::move(open_file);
    open_file = nullptr;
    if (open) open();
  }
  bool answered = false;  // "store" answered (with `path`, or an error in `status`)
  std::string path;
  int fd = -1;
  Bytes offset = 0;
  std::deque<std::string> waiting;  // written before the path was known
  int in_flight = 0;
  Status status = Status::Ok();
  bool abandoned = false;
  std::function<void(Status)> commit_done;

  void Start(std::string p) {
    answered = true;
    path = std::move(p);
    if (abandoned) {
      ::unlink(path.c_str());  // the daemon drops the fill it opened for us
      return;
    }
    fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
    if (fd < 0) {
      status = Status::FromErrno(errno, "opening " + path);
    } else {
      while (!waiting.empty()) {
        Send(std::move(waiting.front()));
        waiting.pop_front();
      }
    }
    MaybeFinish();
  }

  void Send(std::string data) {
    Bytes at = offset;
    offset += data.size();
    ++in_flight;
    std::weak_ptr<bool> alive = backend_alive;
    // The state stays until the write completes, even if its writer is gone.
    io->Write(fd, at, std::move(data), [this, alive, keep = shared_from_this()](Result<std::size_t> n) {
      if (alive.expired()) return;
      --in_flight;
      if (!n.ok() && status.ok()) status = n.status();
      if (abandoned) CloseAbandoned();
      MaybeFinish();
    });
  }

  void MaybeFinish() {
    if (!commit_done || in_flight > 0 || !answered) return;
    Status s = status;
    if (fd >= 0) {
      // close() makes the daemon hand the fill to its write queue (fs/store_tree.cc); after a
      // failed write, unlinking first abandons it instead.
      if (!s.ok()) ::unlink(path.c_str());
      if (::close(fd) != 0 && s.ok()) s = Status::FromErrno(errno, "closing " + path);
      fd = -1;
    }
    auto done = std::move(commit_done);
    commit_done = nullptr;
    done(s);
  }

  void Abandon() {
    abandoned = true;
    waiting.clear();
    if (fd >= 0) ::unlink(path.c_str());
    CloseAbandoned();
  }

  // The file of an abandoned fill is closed once no write names its fd: a write the FileIo
  // has not yet handed to the kernel (UringFileIo's submitter thread enters it later) would
  // otherwise go to whatever the number names by then. Closing it under a queued write gave
  // a client socket accepted meanwhile the fill's first bytes before its own response
  // (ghostproxy_random, seed 794409: a GET of small.txt answered with over-inline.bin's body;
  // ghostproxy_abort_fill), or sent them to the origin in a request (nginx answered 400).
  void CloseAbandoned() {
    if (fd < 0 || in_flight > 0) return;
    ::close(fd);
    fd = -1;
  }
};

class GhostfsWriter final : public CacheWriter {
 public:
  explicit GhostfsWriter(std::shared_ptr<FillState> state) : state_(std::move(state)) {}
  ~GhostfsWriter() override {
    if (!committed_) Abort();
  }

  void Write(std::string data) override {
    FillState& s = *state_;
    if (s.abandoned || !s.status.ok() || data.empty()) return;
    if (s.collecting) {
      if (s.small.size() + data.size() <= kMaxInlineStoreBytes) {
        s.small += data;
        return;
      }
      s.SwitchToFile();
    }
    if (s.fd < 0) {
      s.waiting.push_back(std::move(data));
      return;
    }
    s.Send(std::move(data));
  }

  void Commit(std::function<void(Status)> done) override {
    committed_ = true;
    FillState& s = *state_;
    if (s.abandoned) {
      s.ReleaseTransfer();
      RunSoon(s.base, [done = std::move(done)] { done(Status::Internal("commit of an aborted fill")); });
      return;
    }
    if (s.collecting) {
      // The whole body fits in the request: the daemon queues it on receipt (and ends the
      // fetch's transfer, if this writer took it).
      s.collecting = false;
      s.open_file = nullptr;
      auto send = std::move(s.store_inline);
      s.store_inline = nullptr;
      const std::uint64_t transfer = s.transfer_end;
      s.transfer_end = 0;
      send(std::move(s.small), transfer, [keep = state_, done = std::move(done)](Status st) { done(st); });
      return;
    }
    // Keep the state alive until the commit is through.
    s.commit_done = [keep = state_, done = std::move(done)](Status st) { done(st); };
    event_base* base = s.base;
    std::weak_ptr<FillState> weak = state_;
    RunSoon(base, [weak] {
      if (auto st = weak.lock()) st->MaybeFinish();
    });
  }

  void Abort() override {
    committed_ = true;
    state_->ReleaseTransfer();
    state_->collecting = false;  // nothing was sent for a body still collected
    state_->small.clear();
    state_->open_file = nullptr;
    state_->store_inline = nullptr;
    state_->Abandon();
  }

  bool TakeTransferEnd(std::uint64_t transfer) override {
    FillState& s = *state_;
    if (committed_ || !s.collecting || s.abandoned || !s.status.ok() || s.transfer_end != 0 ||
        !s.end_transfer) {
      return false;
    }
    s.transfer_end = transfer;
    return true;
  }

 private:
  std::shared_ptr<FillState> state_;
  bool committed_ = false;
};

class GhostfsBackend final : public CacheBackend {
 public:
  GhostfsBackend(event_base* base, std::string mount, std::unique_ptr<AsyncControlClient> ctl,
                 std::unique_ptr<FileIo> io, const GhostfsBackendOptions& options)
      : base_(base),
        mount_(std::move(mount)),
        ctl_(std::move(ctl)),
        io_(std::move(io)),
        options_(options),
        memory_(options.memory_cache) {
    // The RAM copies are only as good as the invalidation feed: events go to OnControlEvent; a
    // lost connection empties the cache (events may have been missed) until a new
    // subscription is answered.
    ctl_->SetEventHandler([this](const json& event) { OnControlEvent(event); });
    ctl_->SetDisconnectHandler([this] {
      subscribed_serial_ = 0;
      subscribing_ = false;
      ++changes_;
      memory_.Clear();
      devices_.reset();
      ForEachListener([](const DaemonListener& l) {
        if (l.on_lost) l.on_lost();
      });
    });
    Subscribe();
    WatchKnob();
  }

  ~GhostfsBackend() override {
    ReportServed();
    // A committed fill holds itself through its commit callback until the daemon has answered
    // its "store" and taken the file; the control client drops that answer's callback with the
    // backend. Break the cycle (it would be a leak otherwise). A fill its writer did not commit
    // is abandoned: never handed over half-written. A committed one keeps its file open: the
    // whole body was given to the writes, and the file's close at exit hands it to the daemon
    // (abandoning it lost a fill a stop came right after: the replay's pre-fill, 1 of 2 stored).
    for (const std::weak_ptr<FillState>& weak : fills_) {
      if (std::shared_ptr<FillState> fill = weak.lock()) {
        const bool committed = fill->commit_done != nullptr;
        fill->commit_done = nullptr;
        if (!committed) fill->Abandon();
      }
    }
  }

  std::optional<int> DaemonKnob() const override { return knob_; }

  std::uint64_t WatchDaemon(DaemonListener listener) override {
    const std::uint64_t id = next_listener_++;
    if (knob_ && listener.on_knob) listener.on_knob(*knob_);
    if (devices_ && listener.on_modes) listener.on_modes(*devices_, /*baseline=*/true);
    listeners_.emplace(id, std::move(listener));
    if (knob_serial_ != ctl_->connection_serial() && !knob_asking_) WatchKnob();
    return id;
  }
  void UnwatchDaemon(std::uint64_t id) override { listeners_.erase(id); }

  void NapBegin(Duration due_in, Duration min_rtt, Duration wake_lead,
                std::function<void(bool napping, bool slow_wake)> done) override {
    std::weak_ptr<bool> alive = alive_;
    ctl_->Call(ControlOp::kNap,
               {{"phase", "begin"}, {"due_in_s", ToSeconds(due_in)}, {"min_rtt_s", ToSeconds(min_rtt)},
                {"wake_lead_s", ToSeconds(wake_lead)}},
               [alive, done = std::move(done)](Result<json> r) {
                 if (alive.expired() || !r.ok() || !r->is_object()) return;
                 const bool napping = r->value("napping", false);
                 const std::string reason = r->value("reason", "");
                 // Rule 4's refusal, or a daemon with no emulated card: neither changes.
                 const bool hopeless = reason.find("more than half") != std::string::npos ||
                                       reason.find("no emulated card") != std::string::npos;
                 if (done) done(napping, hopeless);
               });
  }
  void NapEnd() override {
    ctl_->Call(ControlOp::kNap, {{"phase", "end"}}, [](Result<json>) {});
  }

  std::shared_ptr<const MemoryObject> FindInMemory(const std::string& key) override {
    if (!MemoryUsable()) return nullptr;
    return memory_.Find(key);
  }

  void ServedFromMemory(const std::string& key, Bytes bytes) override {
    ++served_[key];
    served_bytes_ += bytes;
    if (report_armed_) return;
    // Batched: one "served" report per delay while hits come in, none while idle.
    report_armed_ = true;
    std::weak_ptr<bool> alive = alive_;
    RunSoon(
        base_,
        [this, alive] {
          if (alive.expired()) return;
          report_armed_ = false;
          ReportServed();
        },
        options_.report_delay);
  }

  void Lookup(const std::string& key, std::function<void(Result<CacheLookup>)> done) override {
    if (!MemoryUsable() && !subscribing_) Subscribe();
    if (knob_serial_ != ctl_->connection_serial() && !knob_asking_) WatchKnob();
    LookupAttempt(key, 1, /*for_fetch=*/false, std::move(done));
  }

  // The miss begins the fetch's transfer in the same round trip ("begin_transfer"); a daemon
  // that does not know it answers a plain miss, and the transfer is begun on its own.
  void LookupForFetch(const std::string& key, std::function<void(Result<CacheLookup>)> done) override {
    if (!MemoryUsable() && !subscribing_) Subscribe();
    if (knob_serial_ != ctl_->connection_serial() && !knob_asking_) WatchKnob();
    LookupAttempt(key, 1, /*for_fetch=*/true, std::move(done));
  }

  void LookupAttempt(const std::string& key, int attempt, bool for_fetch,
                     std::function<void(Result<CacheLookup>)> done) {
    std::weak_ptr<bool> alive = alive_;
    json args = {{"key", key}};
    if (for_fetch) args["begin_transfer"] = true;
    ctl_->Call(ControlOp::kLookup, std::move(args), [this, alive, key, attempt, for_fetch, done = std::move(done)](Result<json> r) mutable {
      if (alive.expired()) return;
      if (!r.ok()) return done(r.status());
      Result<LookupResult> found = LookupResult::FromJson(*r);
      if (!found.ok()) return done(found.status());
      CacheLookup out;
      if (!found->cached) {
        if (found->transfer) {
          out.transfer = OpenedTransfer(*found->transfer, found->card);
        } else if (for_fetch) {
          out.transfer = TransferBegin();
        }
        return done(out);
      }
      if (found->response.empty()) {
        out.response = HeadFromIndex(*found);
      } else {
        Result<StoredResponse> head = ParseStoredResponse(found->response);
        if (!head.ok()) {
          LogError("the stored head of " + key + " is unreadable; treating it as not cached", head.status());
          CacheLookup miss;
          if (for_fetch) miss.transfer = TransferBegin();
          return done(miss);
        }
        out.response = std::move(*head);
      }
      out.cached = true;
      out.response.size = found->size;
      out.choice = found->choice == LookupChoice::kNetwork ? CacheChoice::kNetwork : CacheChoice::kDisk;
      out.ghost_hint = found->ghost_hint;
      // Open the version this answer describes now: its size and head go with exactly those
      // bytes, and every slice of the exchange reads that file (a replacement renames a new
      // one over the name). Replaced between the answer and the open: ask again.
      Result<std::shared_ptr<OpenedBody>> body = OpenVersion(*found);
      if (!body.ok()) {
        if (attempt < kLookupAttempts) return LookupAttempt(key, attempt + 1, for_fetch, std::move(done));
        LogError("the cached body of " + key + " keeps changing; fetching it", body.status());
        CacheLookup miss;
        if (for_fetch) miss.transfer = TransferBegin();
        return done(miss);
      }
      // A whole body read after this answer may be kept in RAM, unless anything changes
      // before the read completes (the answer and the events come in order on one socket).
      if (MemoryUsable() && out.response.size <= memory_.max_object()) {
        (*body)->head = std::make_shared<StoredResponse>(out.response);
        (*body)->changes = changes_;
      }
      out.body = std::move(*body);
      done(std::move(out));
    });
  }

  void ReadBody(const std::string& key, const std::shared_ptr<const void>& version, Bytes offset,
                Bytes length, std::function<bool(std::string_view)> on_data,
                std::function<void(Status)> done) override {
    auto body = std::static_pointer_cast<const OpenedBody>(version);
    if (!body) {
      RunSoon(base_, [done = std::move(done), key] { done(Status::NotFound("not looked up: " + key)); });
      return;
    }
    if (offset + length > body->size) {
      Status s = Status::InvalidArgument("read of [" + std::to_string(offset) + ", " +
                                         std::to_string(offset + length) + ") past the end (" +
                                         std::to_string(body->size) + " bytes) of the cached body of " + key);
      LogError("reading a cached body", s);
      RunSoon(base_, [done = std::move(done), s] { done(s); });
      return;
    }
    auto read = std::make_shared<BodyRead>();
    read->key_for_log = key;
    read->body = body;
    read->fd = body->fd;
    read->next = offset;
    read->end = offset + length;
    read->on_data = std::move(on_data);
    read->done = std::move(done);
    // A packed body is handed out from the answer itself; a file's pieces need a buffer only
    // as large as the read (a 256 KiB one zeroed for each 512-byte hit was ~5 % of the proxy's
    // CPU in bench-scale's hit phase, perf round 20).
    if (!body->packed) read->buf.resize(static_cast<std::size_t>(std::min<Bytes>(kPiece, length)));
    if (body->head && !body->keep_offered && offset == 0 && length == body->head->size) {
      // The whole body: keep a copy in RAM once it has been read completely.
      read->keep = std::make_shared<MemoryObject>();
      read->keep->head = *body->head;
      read->keep->body.reserve(static_cast<std::size_t>(length));
      read->key = key;
      read->changes = body->changes;
    }
    body->keep_offered = true;  // one chance per lookup
    ReadPiece(read);
  }

  std::unique_ptr<CacheWriter> Store(const std::string& key, const StoredResponse& head) override {
    Changed(key);  // the copy in RAM is about to be replaced
    auto state = std::make_shared<FillState>();
    std::erase_if(fills_, [](const std::weak_ptr<FillState>& f) { return f.expired(); });
    fills_.push_back(state);
    state->base = base_;
    state->io = io_.get();
    state->backend_alive = alive_;
    std::weak_ptr<FillState> weak = state;
    std::weak_ptr<bool> alive = alive_;
    auto args = std::make_shared<json>(StoreArgs(key, head));
    state->open_file = [this, alive, weak, args, key] {
      if (alive.expired()) return;
      ctl_->Call(ControlOp::kStore, *args, [weak, alive, key](Result<json> r) {
        if (alive.expired()) return;
        auto st = weak.lock();
        if (!st) return;  // the writer went away before the daemon answered: nothing to hand over
        Result<std::string> path = r.ok() ? StorePathFromJson(*r) : Result<std::string>(r.status());
        if (!path.ok()) {
          st->status = path.status();
          LogError("not storing " + key, st->status);
          st->answered = true;
          st->MaybeFinish();
          return;
        }
        st->Start(*path);
      });
    };
    state->store_inline = [this, alive, args, key](std::string body, std::uint64_t transfer,
                                                   std::function<void(Status)> done) {
      if (alive.expired()) return;
      (*args)["body_base64"] = EncodeBase64(body);
      auto send = [this, alive, args, key, done = std::move(done)]() mutable {
        ctl_->Call(ControlOp::kStore, std::move(*args), [alive, key, done = std::move(done)](Result<json> r) {
          if (alive.expired()) return;
          if (!r.ok()) LogError("not storing " + key, r.status());
          done(r.ok() ? Status::Ok() : r.status());
        });
      };
      if (transfer == 0) return send();
      // The fetch's transfer ends with the store, on a daemon that folds it (it said "card").
      WhenTransferKnown(transfer, [this, transfer, args, send = std::move(send)]() mutable {
        auto it = transfers_.find(transfer);
        if (it == transfers_.end()) return send();
        if (!it->second.id || !it->second.folds) {
          send();
          return TransferEnd(transfer, 0);
        }
        (*args)["transfer_end"] = *it->second.id;
        if (it->second.folded) (*args)["transfer_bytes"] = *it->second.folded;
        transfers_.erase(it);
        send();
      });
    };
    state->end_transfer = [this, alive](std::uint64_t transfer) {
      if (!alive.expired()) TransferEnd(transfer, 0);
    };
    // A body declared larger than an inline store takes, or a head that leaves its base64 no
    // room in one request line: the fill file from the start.
    if (head.size > kMaxInlineStoreBytes ||
        (DumpLengthBound(*args) > kMaxInlineHeadBytes && args->dump().size() > kMaxInlineHeadBytes)) {
      state->SwitchToFile();
    }
    return std::make_unique<GhostfsWriter>(state);
  }

  void Refresh(const std::string& key, const StoredResponse& head) override {
    Changed(key);  // the next lookup brings the new head (and may keep it again)
    ctl_->Call(ControlOp::kRefresh, StoreArgs(key, head), [key](Result<json> r) {
      if (!r.ok()) LogError("refreshing " + key, r.status());
    });
  }

  void Invalidate(const std::string& key) override {
    Changed(key);
    ctl_->Call(ControlOp::kInvalidate, {{"key", key}}, [key](Result<json> r) {
      if (!r.ok()) LogError("invalidating " + key, r.status());
    });
  }

  // The daemon's "transfer" op (fs/store_tree.cc): the transfer is disclosed to its network
  // module and carried by its emulated card. Calls made before "begin" has answered wait for
  // its id; if it failed, the transfer is not charged and TransferData's `done` runs at once.
  std::uint64_t TransferBegin() override {
    std::uint64_t local = next_transfer_++;
    transfers_[local];
    std::weak_ptr<bool> alive = alive_;
    ctl_->Call(ControlOp::kTransfer, {{"phase", "begin"}}, [this, alive, local](Result<json> r) {
      if (alive.expired()) return;
      auto it = transfers_.find(local);
      if (it == transfers_.end()) return;
      Result<std::uint64_t> id = r.ok() ? TransferIdFromJson(*r) : Result<std::uint64_t>(r.status());
      if (id.ok()) {
        it->second.id = *id;
        const std::optional<bool> card = TransferCardFromJson(*r);
        it->second.card = card.value_or(true);
        it->second.folds = card.has_value();
      } else {
        LogError("starting a transfer", id.status());
      }
      it->second.known = true;
      auto waiting = std::move(it->second.waiting);
      for (auto& fn : waiting) fn();
    });
    return local;
  }

  void TransferData(std::uint64_t transfer, Bytes body_bytes, std::function<void()> done) override {
    Charge(transfer, body_bytes, /*upload=*/false, std::move(done));
  }

  void TransferUpload(std::uint64_t transfer, Bytes bytes, std::function<void()> done) override {
    Charge(transfer, bytes, /*upload=*/true, std::move(done));
  }

  void Charge(std::uint64_t transfer, Bytes body_bytes, bool upload, std::function<void()> done) {
    WhenTransferKnown(transfer, [this, transfer, body_bytes, upload, done = std::move(done)]() mutable {
      auto it = transfers_.find(transfer);
      if (it == transfers_.end() || !it->second.id) return RunSoon(base_, std::move(done));
      if (!it->second.card && !upload && !it->second.folded) {
        // No emulated card: nothing to wait for; the bytes go with the end (or the store).
        it->second.folded = body_bytes;
        return RunSoon(base_, std::move(done));
      }
      std::weak_ptr<bool> alive = alive_;
      nlohmann::json args = {{"phase", "data"}, {"transfer", *it->second.id}, {"bytes", body_bytes}};
      if (upload) args["upload"] = true;
      ctl_->Call(ControlOp::kTransfer, std::move(args),
                 [alive, done = std::move(done)](Result<json> r) {
                   if (alive.expired()) return;
                   if (!r.ok()) LogError("charging a transfer", r.status());
                   done();
                 });
    });
  }

  void TransferEnd(std::uint64_t transfer, Bytes) override {
    WhenTransferKnown(transfer, [this, transfer] {
      auto it = transfers_.find(transfer);
      if (it == transfers_.end()) return;
      std::optional<std::uint64_t> id = it->second.id;
      std::optional<Bytes> folded = it->second.folded;
      transfers_.erase(it);
      if (!id) return;
      json args = {{"phase", "end"}, {"transfer", *id}};
      if (folded) args["bytes"] = *folded;
      ctl_->Call(ControlOp::kTransfer, std::move(args), [](Result<json> r) {
        if (!r.ok()) LogError("ending a transfer", r.status());
      });
    });
  }

 private:
  // Lookups answered with a version that was replaced before it could be opened are asked
  // again this many times in all, then treated as misses (the proxy fetches the object).
  static constexpr int kLookupAttempts = 3;

  // One version of a cached body, opened when its lookup was answered (CacheLookup::body).
  struct OpenedBody {
    int fd = -1;
    Bytes size = 0;
    // A small body packed in the daemon's index comes whole with the answer (fd is -1 then).
    std::optional<std::string> packed;
    // Set when a whole read of the body may be kept in RAM: the head, and changes_ then.
    std::shared_ptr<const StoredResponse> head;
    std::uint64_t changes = 0;
    mutable bool keep_offered = false;  // the one read that may keep it has started
    OpenedBody() = default;
    OpenedBody(const OpenedBody&) = delete;
    OpenedBody& operator=(const OpenedBody&) = delete;
    ~OpenedBody() {
      if (fd >= 0) ::close(fd);
    }
  };

  // Opens the body a "lookup" answer describes: the body file itself when the daemon offers
  // it (same bytes, already charged to the emulated disk; no FUSE round trips) if it is still
  // that version ("version" d<inode>-<size>), else the mount's path for that version
  // (.ghost/objects/<hash>@<version>, which the daemon opens only while it is current).
  // Fails if the version is gone (replaced or evicted since the answer).
  static Result<std::shared_ptr<OpenedBody>> OpenVersion(const LookupResult& r) {
    auto out = std::make_shared<OpenedBody>();
    const Bytes size = r.size;
    out->size = size;
    const std::string& version = r.version;
    const std::string& body_path = r.body_path;
    const std::string& mount_path = r.path;
    if (r.packed_body) {
      out->packed = r.packed_body;
      return out;
    }
    if (!body_path.empty()) {
      out->fd = ::open(body_path.c_str(), O_RDONLY | O_CLOEXEC);
      struct stat st;
      if (out->fd >= 0 && ::fstat(out->fd, &st) == 0 && static_cast<Bytes>(st.st_size) == size &&
          (version.empty() ||
           version == "d" + std::to_string(st.st_ino) + "-" + std::to_string(st.st_size))) {
        return out;
      }
      if (out->fd >= 0) ::close(out->fd);
      out->fd = -1;
    }
    if (mount_path.empty()) return Status::NotFound("no path in the lookup's answer");
    out->fd = ::open(mount_path.c_str(), O_RDONLY | O_CLOEXEC);
    if (out->fd < 0) return Status::FromErrno(errno, "opening " + mount_path);
    return out;
  }

  struct BodyRead {
    std::shared_ptr<const OpenedBody> body;  // owns fd
    std::string key_for_log;
    int fd = -1;
    Bytes next = 0, end = 0;
    std::string buf;
    std::function<bool(std::string_view)> on_data;
    std::function<void(Status)> done;
    // When the whole body is read: the copy being collected for the RAM cache, its key and
    // changes_ at its lookup.
    std::shared_ptr<MemoryObject> keep;
    std::string key;
    std::uint64_t changes = 0;
  };

  void ReadPiece(std::shared_ptr<BodyRead> read) {
    std::size_t want = static_cast<std::size_t>(std::min<Bytes>(kPiece, read->end - read->next));
    if (want == 0) {
      Keep(*read);
      auto done = std::move(read->done);
      RunSoon(base_, [done = std::move(done)] { done(Status::Ok()); });
      return;
    }
    // Bytes in the page cache are taken at once (RWF_NOWAIT fails instead of waiting for the
    // disk): a warm hit costs no thread hand-off.
    ssize_t got;
    const char* data = read->buf.data();
    if (const std::optional<std::string>& packed = read->body->packed) {
      got = static_cast<ssize_t>(want);  // ReadBody checked the range against the size
      data = packed->data() + read->next;
    } else {
      iovec iov{read->buf.data(), want};
      got = preadv2(read->fd, &iov, 1, static_cast<off_t>(read->next), RWF_NOWAIT);
    }
    if (got > 0) {
      read->next += static_cast<Bytes>(got);
      if (read->keep) read->keep->body.append(data, static_cast<std::size_t>(got));
      if (!read->on_data(std::string_view(data, static_cast<std::size_t>(got)))) {
        Keep(*read);  // the reader stops at the end of what it wanted (a whole body: kept)
        auto done = std::move(read->done);
        RunSoon(base_, [done = std::move(done)] { done(Status::Ok()); });
        return;
      }
      return ReadPiece(read);
    }
    std::weak_ptr<bool> alive = alive_;
    io_->Read(read->fd, read->next, std::span<char>(read->buf.data(), want),
              [this, alive, read](Result<std::size_t> n) {
                if (alive.expired()) return;
                if (!n.ok() || *n == 0) {
                  Status s = !n.ok() ? n.status() : Status::IoError("the cached body ended early");
                  LogError("reading the cached body of " + read->key_for_log + " at " + std::to_string(read->next), s);
                  return read->done(s);
                }
                read->next += *n;
                if (read->keep) read->keep->body.append(read->buf.data(), *n);
                if (!read->on_data(std::string_view(read->buf.data(), *n))) {
                  Keep(*read);
                  return read->done(Status::Ok());
                }
                ReadPiece(read);
              });
  }

  // The RAM copies may be served only while the daemon's "objects" events reach us.
  bool MemoryUsable() const {
    return memory_.capacity() > 0 && subscribed_serial_ != 0 &&
           subscribed_serial_ == ctl_->connection_serial();
  }

  void Subscribe() {
    if (memory_.capacity() == 0 || subscribe_refused_) return;
    subscribing_ = true;
    std::weak_ptr<bool> alive = alive_;
    ctl_->Call(ControlOp::kSubscribe, {{"topics", {"objects"}}}, [this, alive](Result<json> r) {
      if (alive.expired()) return;
      subscribing_ = false;
      if (!r.ok()) {
        if (r.status().code() == Status::Code::kUnavailable) return;  // retried at the next lookup
        // An older ghostfs without the "objects" topic: no RAM copies (every hit asks it).
        LogError("not keeping responses in RAM", r.status());
        subscribe_refused_ = true;
        return;
      }
      // A reply arrives only on the live connection: the subscription holds on it.
      subscribed_serial_ = ctl_->connection_serial();
    });
  }

  // The daemon's knob, its network card's modes and its "events": the proxy's one
  // subscription for them (shaping's knob and the mail proxies' NetworkWatch, DaemonListener).
  // Subscribed once per connection, the knob and the devices read then, then followed through
  // the events ("stats" and "modes" are published when the knob or a mode changes, "stats" also
  // when the cache does; never on a timer).
  void WatchKnob() {
    knob_asking_ = true;
    std::weak_ptr<bool> alive = alive_;
    ctl_->Call(ControlOp::kSubscribe, {{"topics", {"stats", "modes", "events"}}}, [this, alive](Result<json> r) {
      if (alive.expired() || !r.ok()) {
        if (!alive.expired()) knob_asking_ = false;
        return;
      }
      ctl_->Call(ControlOp::kKnob, json::object(), [this, alive](Result<json> k) {
        if (alive.expired()) return;
        knob_asking_ = false;
        if (!k.ok()) return;
        TakeKnob(*k);
        knob_serial_ = ctl_->connection_serial();
      });
      ctl_->Call(ControlOp::kDevices, json::object(), [this, alive](Result<json> d) {
        if (alive.expired() || !d.ok() || !d->is_array()) return;
        devices_ = *d;
        ForEachListener([&d](const DaemonListener& l) {
          if (l.on_modes) l.on_modes(*d, /*baseline=*/true);
        });
      });
    });
  }

  void TakeKnob(const json& j) {
    auto k = j.find("knob");
    if (k != j.end() && k->is_number_integer()) {
      const auto v = k->get<std::int64_t>();
      if (v >= 0 && v <= 100 && knob_ != static_cast<int>(v)) {
        knob_ = static_cast<int>(v);
        ForEachListener([this](const DaemonListener& l) {
          if (l.on_knob) l.on_knob(*knob_);
        });
      }
    }
  }

  // Calls `fn` for each listener; a listener added or removed meanwhile is safe.
  template <typename Fn>
  void ForEachListener(Fn fn) {
    std::vector<std::uint64_t> ids;
    ids.reserve(listeners_.size());
    for (const auto& [id, l] : listeners_) ids.push_back(id);
    std::weak_ptr<bool> alive = alive_;
    for (std::uint64_t id : ids) {
      auto it = listeners_.find(id);
      if (it == listeners_.end()) continue;
      DaemonListener l = it->second;  // a copy: the listener may remove itself
      fn(l);
      if (alive.expired()) return;
    }
  }

  void OnControlEvent(const json& event) {
    auto topic = event.find("event");
    if (topic == event.end() || !topic->is_string()) return;
    auto data = event.find("data");
    if (data == event.end()) return;
    if (*topic == "stats" && data->is_object()) return TakeKnob(*data);
    if (*topic == "modes" && data->is_array()) {
      devices_ = *data;
      ForEachListener([&data](const DaemonListener& l) {
        if (l.on_modes) l.on_modes(*data, /*baseline=*/false);
      });
      return;
    }
    if (*topic == "events") {
      ForEachListener([&data](const DaemonListener& l) {
        if (l.on_event) l.on_event(*data);
      });
      return;
    }
    if (*topic != "objects") return;
    Result<std::string> key = ObjectsEventKey(*data);
    if (key.ok()) Changed(*key);
  }

  // `key` changed or left the daemon's cache (or is about to, by our own hand).
  void Changed(const std::string& key) {
    ++changes_;
    memory_.Erase(key);
  }

  // A whole body was read: keep it if nothing changed since its lookup. (A read stopped
  // early has fewer bytes than its head says, and is not kept.)
  void Keep(BodyRead& read) {
    if (!read.keep) return;
    std::shared_ptr<MemoryObject> object = std::move(read.keep);
    if (!MemoryUsable() || read.changes != changes_ || object->body.size() != object->head.size)
      return;
    memory_.Insert(read.key, std::move(object));
  }

  void ReportServed() {
    if (served_.empty()) return;
    json memory = json::object();
    for (const auto& [key, n] : served_) memory[key] = n;
    ctl_->Call(ControlOp::kServed, {{"memory", std::move(memory)}, {"bytes", served_bytes_}},
               [](Result<json> r) {
                 if (!r.ok()) LogError("reporting reads served from RAM", r.status());
               });
    served_.clear();
    served_bytes_ = 0;
  }

  void WhenTransferKnown(std::uint64_t transfer, std::function<void()> fn) {
    auto it = transfers_.find(transfer);
    if (it == transfers_.end() || it->second.known) return fn();
    it->second.waiting.push_back(std::move(fn));
  }

  event_base* base_;
  std::string mount_;
  std::unique_ptr<AsyncControlClient> ctl_;
  std::unique_ptr<FileIo> io_;
  GhostfsBackendOptions options_;
  struct Transfer {
    bool known = false;               // "begin" answered
    std::optional<std::uint64_t> id;  // the daemon's id, if it answered with one
    // The daemon emulates a card (or did not say): "data" is sent and waited for.
    bool card = true;
    // The daemon said "card": it takes "bytes" with "end" and the end with an inline store.
    bool folds = false;
    std::optional<Bytes> folded;  // no card: the data phase's bytes, sent with the end
    std::vector<std::function<void()>> waiting;
  };

  // A transfer the daemon began with a lookup's miss: known at once.
  std::uint64_t OpenedTransfer(std::uint64_t id, std::optional<bool> card) {
    std::uint64_t local = next_transfer_++;
    Transfer& t = transfers_[local];
    t.known = true;
    t.id = id;
    t.card = card.value_or(true);
    t.folds = card.has_value();
    return local;
  }
  std::map<std::uint64_t, Transfer> transfers_;  // by our id, until TransferEnd
  std::uint64_t next_transfer_ = 1;
  MemoryCache memory_;
  std::uint64_t subscribed_serial_ = 0;  // the connection our "objects" subscription holds on
  bool subscribing_ = false;
  bool subscribe_refused_ = false;  // the daemon does not know the "objects" topic
  std::optional<int> knob_;         // the daemon's knob, once it said
  std::uint64_t knob_serial_ = 0;   // the connection the knob is followed on
  bool knob_asking_ = false;
  std::optional<json> devices_;  // the daemon's devices as last pushed (modes), while connected
  std::map<std::uint64_t, DaemonListener> listeners_;  // WatchDaemon's, by id
  std::uint64_t next_listener_ = 1;
  // Counts changes seen (events, our own writes, lost connections): a body read that spans
  // one is not kept, as it may be older than the change.
  std::uint64_t changes_ = 0;
  std::map<std::string, std::uint64_t> served_;  // reads from RAM not yet reported, by key
  Bytes served_bytes_ = 0;
  bool report_armed_ = false;
  // The fills handed out and not finished (expired ones are pruned at each Store).
  std::vector<std::weak_ptr<FillState>> fills_;
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
};

// Appends `v` as a JSON string, escaped as nlohmann's dump() escapes it. Only for ASCII text
// (nlohmann's rules for other bytes — UTF-8 checks — are left to it).
void AppendJsonAscii(std::string& out, std::string_view v) {
  static constexpr char kHex[] = "0123456789abcdef";
  out += '"';
  for (const char ch : v) {
    const auto c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c < 0x20) {
          out += "\\u00";
          out += kHex[c >> 4];
          out += kHex[c & 0xf];
        } else {
          out += ch;
        }
    }
  }
  out += '"';
}

bool IsAscii(std::string_view v) {
  for (const char ch : v) {
    if (static_cast<unsigned char>(ch) >= 0x80) return false;
  }
  return true;
}

}  // namespace

// Written by hand for the usual all-ASCII head (every miss stores one: building and dumping a
// json tree was a sixth of ghostproxy's CPU per miss); byte for byte what the json path below
// writes, which takes any other head.
std::string SerializeStoredResponse(const StoredResponse& r) {
  bool ascii = true;
  std::size_t bytes = 80;
  for (const auto& [name, value] : r.headers) {
    ascii = ascii && IsAscii(name) && IsAscii(value);
    bytes += name.size() + value.size() + 8;
  }
  if (ascii) {
    std::string out;
    out.reserve(bytes + bytes / 8);
    out += "{\"expires_unix\":";
    out += r.expires_unix ? std::to_string(*r.expires_unix) : "null";
    out += ",\"headers\":[";
    bool first = true;
    for (const auto& [name, value] : r.headers) {
      out += first ? "[" : ",[";
      first = false;
      AppendJsonAscii(out, name);
      out += ',';
      AppendJsonAscii(out, value);
      out += ']';
    }
    out += "],\"status\":";
    out += std::to_string(r.status);
    out += ",\"stored_unix\":";
    out += std::to_string(r.stored_unix);
    out += '}';
    return out;
  }
  json headers = json::array();
  for (const auto& [name, value] : r.headers) headers.push_back({name, value});
  return json{{"status", r.status},
              {"headers", headers},
              {"stored_unix", r.stored_unix},
              {"expires_unix", r.expires_unix ? json(*r.expires_unix) : json()}}
      .dump();
}

Result<StoredResponse> ParseStoredResponse(const std::string& text) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  auto bad = [&](const char* what) { return Status::InvalidArgument(std::string("stored head: ") + what); };
  if (!j.is_object()) return bad("not a JSON object");
  StoredResponse r;
  if (!j.contains("status") || !j["status"].is_number_integer()) return bad("no status");
  r.status = j["status"].get<int>();
  if (r.status < 100 || r.status > 999) return bad("status out of range");
  if (!j.contains("headers") || !j["headers"].is_array()) return bad("no header list");
  for (const json& h : j["headers"]) {
    if (!h.is_array() || h.size() != 2 || !h[0].is_string() || !h[1].is_string()) return bad("a header is not [name, value]");
    r.headers.emplace_back(h[0].get<std::string>(), h[1].get<std::string>());
  }
  if (j.contains("stored_unix") && j["stored_unix"].is_number_integer()) r.stored_unix = j["stored_unix"].get<std::int64_t>();
  if (j.contains("expires_unix") && j["expires_unix"].is_number_integer()) r.expires_unix = j["expires_unix"].get<std::int64_t>();
  return r;
}

Result<std::unique_ptr<CacheBackend>> MakeGhostfsBackend(event_base* base,
                                                         const std::string& mountpoint,
                                                         const std::string& control_path,
                                                         const GhostfsBackendOptions& options) {
  std::string mount = mountpoint;
  while (mount.size() > 1 && mount.back() == '/') mount.pop_back();
  struct stat st;
  if (::stat((mount + "/.ghost").c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return Status::InvalidArgument(mountpoint + " is not a ghostfs mount (no .ghost/ in it): start ghostfs "
                                   "there first, or pass --mount with its mount point");
  }
  Result<std::unique_ptr<AsyncControlClient>> ctl = AsyncControlClient::Connect(base, control_path);
  if (!ctl.ok()) return ctl.status();
  std::unique_ptr<FileIo> io;
  if (options.file_io) {
    io = options.file_io(base);
  } else if (Result<std::unique_ptr<UringFileIo>> uring = UringFileIo::Create(base); uring.ok()) {
    io = std::move(*uring);
  } else {
    LogError("io_uring unavailable; reading and writing bodies with pread/pwrite", uring.status());
    io = std::make_unique<SyncFileIo>(base);
  }
  return std::unique_ptr<CacheBackend>(
      std::make_unique<GhostfsBackend>(base, mount, std::move(*ctl), std::move(io), options));
}

}  // namespace ghost
