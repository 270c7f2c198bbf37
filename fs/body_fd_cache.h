// BodyFdCache: the body files of recently opened cached objects, kept open, so that the next
// open of the same body costs no path walk. A cold walk of <cache>/objects/<h[0..2]>/<h> reads
// a directory block and an inode from the disk for every object (the hash spreads objects
// over 256 directories), in the daemon's loop, while the opener waits; a kept descriptor
// answers with one dup (and its check against the index: CacheStore::CheckBody).
//
// Bounded (least recently opened out first). An entry is dropped as soon as the store says
// its object changed (replaced, evicted, dropped: CacheStore::SetInternalChangeListener), so
// a kept descriptor never serves a version the index no longer has, and never holds an
// evicted file's disk space.
//
// Thread-safety: the daemon's one event-loop thread.
#ifndef GHOST_FS_BODY_FD_CACHE_H_
#define GHOST_FS_BODY_FD_CACHE_H_

#include <cstddef>
#include <list>
#include <string>
#include <unordered_map>

#include "common/base/status.h"
#include "common/cache/body_file.h"

namespace ghost {

class CacheStore;

class BodyFdCache {
 public:
  // At most `capacity` descriptors (0: keeps none).
  explicit BodyFdCache(std::size_t capacity) : capacity_(capacity) {}
  BodyFdCache(const BodyFdCache&) = delete;
  BodyFdCache& operator=(const BodyFdCache&) = delete;

  // The committed body of `key` in `store`, as CacheManager::OpenBody gives it (a descriptor
  // of its own, one version), from a kept descriptor when there is one; keeps one otherwise.
  [[nodiscard]] Result<BodyFile> Open(CacheStore& store, const std::string& key);
  // `key` changed in the store: its kept descriptor (if any) is closed.
  void Forget(const std::string& key);
  std::size_t size() const { return entries_.size(); }
  std::size_t capacity() const { return capacity_; }
  std::uint64_t hits() const { return hits_; }

  // The capacity for this process: `wanted`, or less if the open-files limit is low (a
  // quarter of it, so the cache never starves the daemon of descriptors).
  static std::size_t CapacityFor(std::size_t wanted);

 private:
  struct Entry {
    BodyFile file;
    std::list<std::string>::iterator lru;
  };
  std::size_t capacity_;
  std::list<std::string> lru_;  // most recently opened first
  std::unordered_map<std::string, Entry> entries_;
  std::uint64_t hits_ = 0;
};

}  // namespace ghost

#endif  // GHOST_FS_BODY_FD_CACHE_H_
