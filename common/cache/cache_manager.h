// CacheManager: the one place that decides where a read of an object comes from (DESIGN §3.4,
// §3.5, §7). ghostfs's HTTP and Maildir trees, the proxy's "lookup" and ghostsim's replay all
// ask it, so the live daemon and the simulator make the same choice from the same state.
//
// The caller says which holders the object has (ObjectState): a clean copy in RAM (the
// page-cache model below), a fill still waiting in the write queue, a committed body on disk
// (fresh or stale), and its size. The decision, in this order:
//
//   holders                               decision
//   ------------------------------------  ------------------------------------------------
//   write queue, no committed body        kWriteQueue (memory; the only local copy: nothing
//                                         to cost)
//   no committed body                     kNetwork, and the fetched body fills the cache
//   committed body, stale                 kRevalidate (ask the origin with the validators;
//                                         a 304 reads the disk)
//   committed body, fresh                 static / none: kMemory if the page-cache model
//                                         holds it, else kDisk (the cached copy whenever one
//                                         exists); adaptive: the cost model's cheapest of
//                                         memory (if held), disk and network, which may send
//                                         a ghost hint to the ideal device
//
// Network reads (kNetwork, kRevalidate) are disclosed to the network module as transfers
// under the adaptive policy only (Machine::TransferBegin). A future flash log is one more
// holder (ReadSource::kFlash, Source::kFlash in the cost model).
//
// The page-cache model: RAM that keeps clean copies of recently read or written objects (LRU
// within a byte cap), as the kernel does under the live filesystem. Callers touch it when they
// read an object (InMemory) and remember what passed through RAM (Remember).
//
// Thread-safety: not thread-safe; use from the thread that drives the clock.
#ifndef GHOST_COMMON_CACHE_CACHE_MANAGER_H_
#define GHOST_COMMON_CACHE_CACHE_MANAGER_H_

#include <functional>
#include <memory>
#include <string>

#include "common/base/clock.h"
#include "common/base/units.h"
#include "common/cache/body_file.h"
#include "common/cache/cache_store.h"
#include "common/cache/cache_index.h"
#include "common/power/cost_model.h"
#include "common/power/machine.h"

namespace ghost {

// Where a read is served from.
enum class ReadSource {
  kMemory,      // a clean copy in RAM (the page-cache model)
  kWriteQueue,  // the fill waiting in the write queue (in memory)
  kFlash,       // the flash log (reserved)
  kDisk,        // the committed body in the disk cache
  kNetwork,     // the origin
  kRevalidate,  // the origin, asked with the stale copy's validators
  kStale,       // the committed body although stale: the origin failed (stale-if-error, RFC
                // 5861); an outcome the caller reports, never a decision of DecideRead
};
// The text the edges print (user.ghost.source, access logs, stats, ghostsim's "sources"):
// "memory" for both RAM holders, "flash", "disk", "network", "revalidate", "stale".
const char* ReadSourceName(ReadSource s);
// Reads served locally (memory, write queue, flash, disk).
inline bool IsLocal(ReadSource s) { return s != ReadSource::kNetwork && s != ReadSource::kRevalidate; }

// What the caller knows about one object.
struct ObjectState {
  // The committed body's size; for an object not cached, the size its fetch is expected to
  // have (a listing's or a message's; 0: unknown), which only the shadow baseline uses.
  Bytes size = 0;
  bool in_memory = false;       // the page-cache model holds a clean copy
  bool in_write_queue = false;  // a fill of it waits in the write queue
  bool on_disk = false;         // a committed body in the cache store
  bool fresh = true;            // that body may be served without asking the origin
};

struct ReadDecision {
  ReadSource source = ReadSource::kNetwork;
  // The holders were costed (a fresh committed body): `choice` has the estimates behind the
  // decision (user.ghost.cost) and says whether a ghost hint was sent.
  bool costed = false;
  Choice choice;
  bool queue_fill = false;  // a network read of an uncached object: its body fills the cache
};

class CacheManager {
 public:
  struct Options {
    Bytes page_cache = 8 * 1024 * 1024;  // the page-cache model's cap; 0 disables it
  };

  // Borrows `clock` and `machine`, which must outlive the manager.
  CacheManager(const Clock& clock, Machine& machine, Options options);
  CacheManager(const CacheManager&) = delete;
  CacheManager& operator=(const CacheManager&) = delete;

  // Where to read an object in `state` (the table above). Under the adaptive policy a costed
  // choice may send a ghost hint.
  ReadDecision DecideRead(const ObjectState& state);
  // Told of every decision DecideRead makes, after it is made and before the caller acts on
  // it (the daemon's shadow baseline, common/cache/shadow_baseline.h). Empty: none.
  using Observer = std::function<void(const ObjectState& state, const ReadDecision& decision)>;
  void SetObserver(Observer observer) { observer_ = std::move(observer); }

  // Opens the committed body of `key` in `store` (one version, read until the BodyFile is
  // closed; see body_file.h). Fails with the open's errno (ENOENT: no body, or a body whose
  // size is not the index's, which the store then drops: CacheStore::CheckBody).
  [[nodiscard]] static Result<BodyFile> OpenBody(CacheStore& store, const std::string& key) {
    Result<BodyFile> file = BodyFile::Open(store.BodyPath(key));
    if (!file.ok()) return file;
    if (ghost::Status st = store.CheckBody(key, file->fd()); !st.ok()) return st;
    return file;
  }

  // ---- the page-cache model ----
  // Whether RAM still holds a clean copy of `key`; counts as a use (LRU).
  bool InMemory(const std::string& key) { return page_cache_->Touch(key); }
  // `key`'s `size` bytes passed through RAM: keep a clean copy as the most recently used,
  // evicting the least recently used ones. No-op for an empty object, one larger than the
  // cap, or a disabled model.
  void Remember(const std::string& key, Bytes size);
  // Forgets every copy (drop_caches). Returns how many there were.
  std::size_t ForgetMemory();
  Bytes page_cache_bytes() const { return options_.page_cache; }

  Machine& machine() { return machine_; }

 private:
  const Clock& clock_;
  Machine& machine_;
  Options options_;
  std::unique_ptr<CacheIndex> page_cache_;
  Observer observer_;

  ReadDecision Decide(const ObjectState& state);
};

}  // namespace ghost

#endif  // GHOST_COMMON_CACHE_CACHE_MANAGER_H_
