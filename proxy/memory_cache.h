// MemoryCache: the copies of recently served responses that ghostproxy keeps in its own RAM
// (DESIGN §3.4: a copy held in memory is the memory source, which always costs least).
//
// Why a second copy next to ghostfs's cache: a hit through the daemon costs a control-socket
// round trip and a read of the body file, and the bodies a proxy serves again and again are
// few and small. Holding them here is what the cost model would choose anyway (memory needs
// no device in any mode, so no device can be cheaper), so serving from this copy is the
// model's choice, not a way around it. What keeps it honest lives in the owner
// (GhostfsBackend): it fills this cache only from a complete body read after a lookup, drops
// a key when the daemon reports it refreshed, replaced, invalidated or evicted (the "objects"
// subscription of the control socket), empties it when that subscription is lost, and tells
// the daemon about every read served from here (so `ghostctl stats` counts them as memory).
// Freshness is the proxy's to judge (proxy/cache_policy.h), exactly as for a copy on disk.
//
// Bounded by bytes (a body, its head's fields and its key are charged), least recently used
// first out. Capacity 0 disables it: nothing is ever kept. An object bigger than
// max_object() is not kept, so one big body cannot flush every small one.
//
// Objects are shared, immutable values: an object evicted or replaced while a response is
// still being written from it stays alive until that write lets go of it.
//
// Thread-safety: not thread-safe; one event-loop thread.
#ifndef GHOST_PROXY_MEMORY_CACHE_H_
#define GHOST_PROXY_MEMORY_CACHE_H_

#include <algorithm>
#include <cstdint>
#include <list>
#include <memory>
#include <string>
#include <unordered_map>

#include "common/base/units.h"
#include "proxy/cache_backend.h"

namespace ghost {

struct MemoryCacheStats {
  std::uint64_t hits = 0;       // Find found the key
  std::uint64_t misses = 0;     // Find did not
  std::uint64_t inserts = 0;    // objects kept
  std::uint64_t evictions = 0;  // objects pushed out by the byte cap
  std::uint64_t drops = 0;      // objects removed by Erase (changed or removed elsewhere)
};

class MemoryCache {
 public:
  // The largest object kept: a quarter of the capacity, at most 1 MiB (the hot set of a proxy
  // is small objects; larger bodies stream from the disk cache at its bandwidth anyway).
  static constexpr Bytes kMaxObject = 1 << 20;

  explicit MemoryCache(Bytes capacity) : capacity_(capacity) {}
  MemoryCache(const MemoryCache&) = delete;
  MemoryCache& operator=(const MemoryCache&) = delete;

  // The object kept under `key`, now the most recently used; nullptr if none.
  std::shared_ptr<const MemoryObject> Find(const std::string& key);

  // Keeps `object` under `key`, replacing what was there, then evicts least recently used
  // objects until the total is within the capacity. Returns false (keeping nothing, and
  // dropping an older copy of `key`) when the cache is disabled, the object is bigger than
  // max_object(), or its body's length differs from head.size.
  bool Insert(const std::string& key, std::shared_ptr<const MemoryObject> object);

  // Drops `key`; true if it was kept.
  bool Erase(const std::string& key);
  // Drops everything (e.g. the invalidation feed was lost).
  void Clear();

  Bytes capacity() const { return capacity_; }
  Bytes max_object() const { return std::min<Bytes>(kMaxObject, capacity_ / 4); }
  Bytes bytes() const { return bytes_; }
  std::size_t size() const { return map_.size(); }
  const MemoryCacheStats& stats() const { return stats_; }

  // What one object is charged: its body, key and header fields, plus a fixed overhead for
  // the bookkeeping.
  static Bytes Charge(const std::string& key, const MemoryObject& object);

 private:
  struct Entry {
    std::string key;
    std::shared_ptr<const MemoryObject> object;
    Bytes charge = 0;
  };
  using Lru = std::list<Entry>;  // front: most recently used

  void Remove(Lru::iterator it);

  Bytes capacity_;
  Bytes bytes_ = 0;
  Lru lru_;
  std::unordered_map<std::string, Lru::iterator> map_;
  MemoryCacheStats stats_;
};

}  // namespace ghost

#endif  // GHOST_PROXY_MEMORY_CACHE_H_
