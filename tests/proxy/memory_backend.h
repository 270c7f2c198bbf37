// MemoryBackend: an in-memory CacheBackend for ghostproxy's tests (a fake, not a mock).
//
// Objects live in a map; every callback is posted to the event loop (event_base_once with a
// zero timeout), so none runs inside the call that took it, as the interface demands. The
// cost-model choice for cached objects is a switch the test sets; when it says kNetwork the
// lookup reports that the disk got a ghost hint, as the real backend does when the network wins.
// Counters record every call. With SetMemoryCopies(true) every stored object is also offered
// as a copy in RAM (FindInMemory), as GhostfsBackend does for what it has read whole.
//
// Thread-safety: the CacheBackend methods run on the loop thread; the test controls (SetChoice,
// counters, Get, Put, Keys) may be called from any thread (one mutex guards the state).
#ifndef GHOST_TESTS_PROXY_MEMORY_BACKEND_H_
#define GHOST_TESTS_PROXY_MEMORY_BACKEND_H_

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "proxy/cache_backend.h"

struct event_base;

namespace ghost {

class MemoryBackend final : public CacheBackend {
 public:
  struct Counters {
    int lookups = 0;
    int hits = 0;    // lookups that found the key
    int stores = 0;  // Store calls
    int commits = 0;
    int aborts = 0;  // Abort, or a writer destroyed without Commit
    int refreshes = 0;
    int invalidations = 0;
    int reads = 0;  // ReadBody calls
    int ghost_hints = 0;
    int transfer_begins = 0;
    int transfer_ends = 0;
    int transfer_data = 0;
    Bytes transfer_bytes = 0;
    int memory_served = 0;  // ServedFromMemory calls
  };

  // Borrows `base`, which must outlive the backend.
  explicit MemoryBackend(event_base* base);
  // What DaemonKnob says (a ghostfs's knob as the proxy last heard it); set before use.
  std::optional<int> daemon_knob;
  ~MemoryBackend() override;
  MemoryBackend(const MemoryBackend&) = delete;
  MemoryBackend& operator=(const MemoryBackend&) = delete;

  // CacheBackend.
  std::optional<int> DaemonKnob() const override { return daemon_knob; }
  void Lookup(const std::string& key, std::function<void(Result<CacheLookup>)> done) override;
  void ReadBody(const std::string& key, const std::shared_ptr<const void>& body, Bytes offset,
                Bytes length,
                std::function<bool(std::string_view)> on_data,
                std::function<void(Status)> done) override;
  std::unique_ptr<CacheWriter> Store(const std::string& key, const StoredResponse& head) override;
  void Refresh(const std::string& key, const StoredResponse& head) override;
  void Invalidate(const std::string& key) override;
  std::uint64_t TransferBegin() override;
  void TransferData(std::uint64_t transfer, Bytes body_bytes, std::function<void()> done) override;
  void TransferEnd(std::uint64_t transfer, Bytes bytes) override;
  std::shared_ptr<const MemoryObject> FindInMemory(const std::string& key) override;
  void ServedFromMemory(const std::string& key, Bytes bytes) override;

  // Test controls.
  void SetChoice(CacheChoice choice);
  void SetFailLookups(bool fail);
  // ReadBody fails for every key (an object evicted after its lookup).
  void SetFailReads(bool fail);
  // FindInMemory offers every stored object (true) or none (false, the default).
  void SetMemoryCopies(bool on);
  Counters counters() const;
  // The stored head and body of `key`, if any.
  std::optional<StoredResponse> Get(const std::string& key, std::string* body = nullptr) const;
  void Put(const std::string& key, const StoredResponse& head, const std::string& body);
  std::vector<std::string> Keys() const;

 private:
  struct Object {
    StoredResponse head;
    std::string body;
  };
  struct State {
    mutable std::mutex mu;  // guards everything below
    std::map<std::string, Object> objects;
    Counters counters;
    CacheChoice choice = CacheChoice::kDisk;
    bool fail_lookups = false;
    bool fail_reads = false;
    bool memory_copies = false;
  };
  class Writer;

  // Runs `fn` on the loop later, unless the backend has been destroyed by then.
  void Post(std::function<void()> fn);

  event_base* base_;
  std::shared_ptr<State> state_ = std::make_shared<State>();
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
};

}  // namespace ghost

#endif  // GHOST_TESTS_PROXY_MEMORY_BACKEND_H_
