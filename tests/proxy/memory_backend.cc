#include "tests/proxy/memory_backend.h"

#include <event2/event.h>

#include <algorithm>
#include <cassert>

namespace ghost {
namespace {

// Runs `fn` on `base`'s loop at its next turn, unless `alive` has expired by then.
void PostTo(event_base* base, std::weak_ptr<bool> alive, std::function<void()> fn) {
  struct Task {
    std::weak_ptr<bool> alive;
    std::function<void()> fn;
  };
  auto* task = new Task{std::move(alive), std::move(fn)};
  const timeval zero{0, 0};
  const int rc = event_base_once(
      base, -1, EV_TIMEOUT,
      [](evutil_socket_t, short, void* arg) {
        std::unique_ptr<Task> t(static_cast<Task*>(arg));
        if (!t->alive.expired()) t->fn();
      },
      task, &zero);
  assert(rc == 0);
  (void)rc;
}

constexpr std::size_t kReadPiece = 16 * 1024;  // ReadBody hands bytes over in pieces this big

}  // namespace

class MemoryBackend::Writer final : public CacheWriter {
 public:
  Writer(event_base* base, std::weak_ptr<bool> alive, std::shared_ptr<State> state, std::string key,
         StoredResponse head)
      : base_(base),
        alive_(std::move(alive)),
        state_(std::move(state)),
        key_(std::move(key)),
        head_(std::move(head)) {}
  ~Writer() override {
    if (!done_) {
      std::lock_guard lock(state_->mu);
      ++state_->counters.aborts;
    }
  }
  void Write(std::string data) override {
    assert(!done_);
    body_ += data;
  }
  void Commit(std::function<void(Status)> done) override {
    assert(!done_);
    done_ = true;
    // The object becomes visible on the loop, then `done` runs; the writer may be gone by then.
    PostTo(base_, alive_,
           [state = state_, key = key_, head = head_, body = std::move(body_),
            done = std::move(done)] {
             {
               std::lock_guard lock(state->mu);
               Object o{head, body};
               if (o.head.size == 0) o.head.size = body.size();
               state->objects[key] = std::move(o);
               ++state->counters.commits;
             }
             done(Status::Ok());
           });
  }
  void Abort() override {
    if (done_) return;
    done_ = true;
    body_.clear();
    std::lock_guard lock(state_->mu);
    ++state_->counters.aborts;
  }

 private:
  event_base* base_;
  std::weak_ptr<bool> alive_;
  std::shared_ptr<State> state_;
  std::string key_;
  StoredResponse head_;
  std::string body_;
  bool done_ = false;
};

MemoryBackend::MemoryBackend(event_base* base) : base_(base) {}

MemoryBackend::~MemoryBackend() { alive_.reset(); }

void MemoryBackend::Post(std::function<void()> fn) { PostTo(base_, alive_, std::move(fn)); }

void MemoryBackend::Lookup(const std::string& key, std::function<void(Result<CacheLookup>)> done) {
  Post([state = state_, key, done = std::move(done)] {
    CacheLookup l;
    bool fail = false;
    {
      std::lock_guard lock(state->mu);
      ++state->counters.lookups;
      fail = state->fail_lookups;
      auto it = state->objects.find(key);
      if (!fail && it != state->objects.end()) {
        ++state->counters.hits;
        l.cached = true;
        l.response = it->second.head;
        l.choice = state->choice;
        // The network won although the disk holds the object: the disk gets a ghost hint.
        l.ghost_hint = state->choice == CacheChoice::kNetwork;
        if (l.ghost_hint) ++state->counters.ghost_hints;
      }
    }
    if (fail) {
      done(Status::Unavailable("memory backend told to fail lookups"));
    } else {
      done(std::move(l));
    }
  });
}

void MemoryBackend::ReadBody(const std::string& key, const std::shared_ptr<const void>&,
                             Bytes offset, Bytes length,
                             std::function<bool(std::string_view)> on_data,
                             std::function<void(Status)> done) {
  Post([state = state_, key, offset, length, on_data = std::move(on_data), done = std::move(done)] {
    std::string bytes;
    Status status;
    {
      std::lock_guard lock(state->mu);
      ++state->counters.reads;
      auto it = state->objects.find(key);
      if (state->fail_reads || it == state->objects.end()) {
        status = Status::NotFound("memory backend: " + key + " is not stored");
      } else if (offset > it->second.body.size()) {
        status = Status::InvalidArgument("memory backend: read past the end of " + key);
      } else {
        bytes = it->second.body.substr(offset, length);
      }
    }
    if (status.ok()) {
      for (std::size_t at = 0; at < bytes.size(); at += kReadPiece) {
        if (!on_data(std::string_view(bytes).substr(at, kReadPiece))) break;
      }
    }
    done(status);
  });
}

std::unique_ptr<CacheWriter> MemoryBackend::Store(const std::string& key,
                                                  const StoredResponse& head) {
  {
    std::lock_guard lock(state_->mu);
    ++state_->counters.stores;
  }
  return std::make_unique<Writer>(base_, alive_, state_, key, head);
}

void MemoryBackend::Refresh(const std::string& key, const StoredResponse& head) {
  std::lock_guard lock(state_->mu);
  ++state_->counters.refreshes;
  auto it = state_->objects.find(key);
  if (it == state_->objects.end()) return;
  const Bytes size = it->second.head.size;
  it->second.head = head;
  it->second.head.size = size;
}

void MemoryBackend::Invalidate(const std::string& key) {
  std::lock_guard lock(state_->mu);
  ++state_->counters.invalidations;
  state_->objects.erase(key);
}

std::uint64_t MemoryBackend::TransferBegin() {
  std::lock_guard lock(state_->mu);
  return static_cast<std::uint64_t>(++state_->counters.transfer_begins);
}

void MemoryBackend::TransferData(std::uint64_t, Bytes, std::function<void()> done) {
  {
    std::lock_guard lock(state_->mu);
    ++state_->counters.transfer_data;
  }
  Post(std::move(done));
}

void MemoryBackend::TransferEnd(std::uint64_t, Bytes bytes) {
  std::lock_guard lock(state_->mu);
  ++state_->counters.transfer_ends;
  state_->counters.transfer_bytes += bytes;
}

std::shared_ptr<const MemoryObject> MemoryBackend::FindInMemory(const std::string& key) {
  std::lock_guard lock(state_->mu);
  auto it = state_->objects.find(key);
  if (!state_->memory_copies || it == state_->objects.end()) return nullptr;
  auto copy = std::make_shared<MemoryObject>();
  copy->head = it->second.head;
  copy->body = it->second.body;
  return copy;
}

void MemoryBackend::ServedFromMemory(const std::string&, Bytes) {
  std::lock_guard lock(state_->mu);
  ++state_->counters.memory_served;
}

void MemoryBackend::SetMemoryCopies(bool on) {
  std::lock_guard lock(state_->mu);
  state_->memory_copies = on;
}

void MemoryBackend::SetChoice(CacheChoice choice) {
  std::lock_guard lock(state_->mu);
  state_->choice = choice;
}

void MemoryBackend::SetFailLookups(bool fail) {
  std::lock_guard lock(state_->mu);
  state_->fail_lookups = fail;
}

void MemoryBackend::SetFailReads(bool fail) {
  std::lock_guard lock(state_->mu);
  state_->fail_reads = fail;
}

MemoryBackend::Counters MemoryBackend::counters() const {
  std::lock_guard lock(state_->mu);
  return state_->counters;
}

std::optional<StoredResponse> MemoryBackend::Get(const std::string& key, std::string* body) const {
  std::lock_guard lock(state_->mu);
  auto it = state_->objects.find(key);
  if (it == state_->objects.end()) return std::nullopt;
  if (body != nullptr) *body = it->second.body;
  return it->second.head;
}

void MemoryBackend::Put(const std::string& key, const StoredResponse& head,
                        const std::string& body) {
  std::lock_guard lock(state_->mu);
  Object o{head, body};
  if (o.head.size == 0) o.head.size = body.size();
  state_->objects[key] = std::move(o);
}

std::vector<std::string> MemoryBackend::Keys() const {
  std::lock_guard lock(state_->mu);
  std::vector<std::string> keys;
  for (const auto& [k, v] : state_->objects) keys.push_back(k);
  return keys;
}

}  // namespace ghost
