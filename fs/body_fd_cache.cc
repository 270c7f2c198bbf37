#include "fs/body_fd_cache.h"

#include <sys/resource.h>

#include <algorithm>

#include "common/cache/cache_manager.h"
#include "common/cache/cache_store.h"

namespace ghost {

Result<BodyFile> BodyFdCache::Open(CacheStore& store, const std::string& key) {
  if (auto it = entries_.find(key); it != entries_.end()) {
    // The index still has this version (its size: a replacement renamed over the name would
    // have dropped the entry through Forget); a mismatch drops the object like a fresh open.
    if (Status st = store.CheckBody(key, it->second.file.fd()); !st.ok()) {
      Forget(key);
      return st;
    }
    Result<BodyFile> dup = it->second.file.Dup();
    if (dup.ok()) {
      ++hits_;
      lru_.splice(lru_.begin(), lru_, it->second.lru);
      return dup;
    }
    Forget(key);  // out of descriptors: open it the ordinary way below
  }
  Result<BodyFile> file = CacheManager::OpenBody(store, key);
  if (!file.ok() || capacity_ == 0) return file;
  Result<BodyFile> kept = file->Dup();
  if (!kept.ok()) return file;
  while (entries_.size() >= capacity_) Forget(std::string(lru_.back()));
  lru_.push_front(key);
  entries_.emplace(key, Entry{std::move(kept).value(), lru_.begin()});
  return file;
}

void BodyFdCache::Forget(const std::string& key) {
  auto it = entries_.find(key);
  if (it == entries_.end()) return;
  lru_.erase(it->second.lru);
  entries_.erase(it);
}

std::size_t BodyFdCache::CapacityFor(std::size_t wanted) {
  rlimit rl{};
  if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY) return wanted;
  return std::min<std::size_t>(wanted, static_cast<std::size_t>(rl.rlim_cur / 4));
}

}  // namespace ghost
