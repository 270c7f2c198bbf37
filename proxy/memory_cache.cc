// MemoryCache (see memory_cache.h for why ghostproxy keeps copies in RAM).
#include "proxy/memory_cache.h"

namespace ghost {

namespace {

// List node, map node and the shared object's control block, roughly.
constexpr Bytes kEntryOverhead = 256;

}  // namespace

Bytes MemoryCache::Charge(const std::string& key, const MemoryObject& object) {
  Bytes n = kEntryOverhead + 2 * key.size() + object.body.size();
  for (const auto& [name, value] : object.head.headers) n += name.size() + value.size() + 64;
  return n;
}

std::shared_ptr<const MemoryObject> MemoryCache::Find(const std::string& key) {
  auto it = map_.find(key);
  if (it == map_.end()) {
    ++stats_.misses;
    return nullptr;
  }
  lru_.splice(lru_.begin(), lru_, it->second);
  ++stats_.hits;
  return it->second->object;
}

bool MemoryCache::Insert(const std::string& key, std::shared_ptr<const MemoryObject> object) {
  if (auto it = map_.find(key); it != map_.end()) Remove(it->second);
  if (!object || object->body.size() != object->head.size) return false;
  const Bytes charge = Charge(key, *object);
  if (capacity_ == 0 || object->body.size() > max_object() || charge > capacity_) return false;
  while (bytes_ + charge > capacity_ && !lru_.empty()) {
    Remove(std::prev(lru_.end()));
    ++stats_.evictions;
  }
  lru_.push_front(Entry{key, std::move(object), charge});
  map_.emplace(key, lru_.begin());
  bytes_ += charge;
  ++stats_.inserts;
  return true;
}

bool MemoryCache::Erase(const std::string& key) {
  auto it = map_.find(key);
  if (it == map_.end()) return false;
  Remove(it->second);
  ++stats_.drops;
  return true;
}

void MemoryCache::Clear() {
  stats_.drops += map_.size();
  map_.clear();
  lru_.clear();
  bytes_ = 0;
}

void MemoryCache::Remove(Lru::iterator it) {
  bytes_ -= it->charge;
  map_.erase(it->key);
  lru_.erase(it);
}

}  // namespace ghost
