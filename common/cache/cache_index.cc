#include "common/cache/cache_index.h"

#include <cassert>
#include <cstdio>
#include <cstdlib>
#include <iterator>

namespace ghost {

const char* CacheStateName(CacheState state) {
  switch (state) {
    case CacheState::kAbsent:
      return "absent";
    case CacheState::kPresent:
      return "present";
    case CacheState::kPresentNetworkPreferred:
      return "present-network-preferred";
  }
  return "unknown";
}

CacheIndex::CacheIndex(const Clock& clock, Bytes capacity) : clock_(clock), capacity_(capacity) {}

Result<std::vector<std::string>> CacheIndex::Insert(const std::string& key, CacheEntry entry) {
  TimePoint now = clock_.Now();
  entry.fetched = now;
  entry.last_access = now;
  return Add(key, std::move(entry));
}

Result<std::vector<std::string>> CacheIndex::Restore(const std::string& key, CacheEntry entry) {
  return Add(key, std::move(entry));
}

Result<std::vector<std::string>> CacheIndex::Add(const std::string& key, CacheEntry entry) {
  assert(!entry.where.empty() && "a cache entry must say where its body is");
  if (capacity_ != 0 && entry.size > capacity_) {
    return ghost::Status::InvalidArgument(
        "cannot cache " + key + ": its " + std::to_string(entry.size) +
        " bytes exceed the cache capacity of " + std::to_string(capacity_) +
        " bytes; raise the cache size to cache objects this large");
  }
  // The old body is replaced, so its bytes do not count against the new one.
  Erase(key);
  std::vector<std::string> evicted = EvictFor(entry.size);
  lru_.emplace_back(key, std::move(entry));
  auto it = std::prev(lru_.end());
  map_.emplace(std::string_view(it->first), it);
  total_bytes_ += it->second.size;
  return evicted;
}

bool CacheIndex::Update(const std::string& key, const std::function<void(CacheEntry&)>& fn) {
  auto found = map_.find(key);
  if (found == map_.end()) return false;
  CacheEntry& entry = found->second->second;
  [[maybe_unused]] Bytes size = entry.size;
  fn(entry);
  assert(entry.size == size && "CacheIndex::Update must not change the size; use Insert");
  assert(!entry.where.empty() && "CacheIndex::Update left no residence; use Erase");
  return true;
}

bool CacheIndex::Erase(const std::string& key) {
  auto found = map_.find(key);
  if (found == map_.end()) return false;
  List::iterator it = found->second;
  total_bytes_ -= it->second.size;
  map_.erase(found);  // before the node: the map's key views the node's string
  lru_.erase(it);
  return true;
}

const CacheEntry* CacheIndex::Find(const std::string& key) const {
  auto found = map_.find(key);
  return found == map_.end() ? nullptr : &found->second->second;
}

bool CacheIndex::Touch(const std::string& key) {
  auto found = map_.find(key);
  if (found == map_.end()) return false;
  lru_.splice(lru_.end(), lru_, found->second);  // iterators stay valid
  found->second->second.last_access = clock_.Now();
  return true;
}

CacheStatus CacheIndex::Status(const std::string& key, bool network_preferred) const {
  const CacheEntry* entry = Find(key);
  if (!entry) return CacheStatus{};
  return CacheStatus{
      network_preferred ? CacheState::kPresentNetworkPreferred : CacheState::kPresent, entry->size};
}

std::vector<std::string> CacheIndex::EvictFor(Bytes incoming) {
  std::vector<std::string> evicted;
  if (capacity_ == 0 || incoming > capacity_) return evicted;
  while (!lru_.empty() && total_bytes_ > capacity_ - incoming) {
    List::iterator victim = lru_.begin();
    total_bytes_ -= victim->second.size;
    map_.erase(std::string_view(victim->first));
    evicted.push_back(victim->first);
    lru_.erase(victim);
  }
  return evicted;
}

void CacheIndex::ForEach(
    const std::function<void(const std::string&, const CacheEntry&)>& fn) const {
  for (const Node& node : lru_) fn(node.first, node.second);
}

void CacheIndex::AssertInvariants() const {
  auto fail = [](const char* what) {
    std::fprintf(stderr, "ghost: cache index: broken invariant: %s\n", what);
    std::abort();
  };
  if (lru_.size() != map_.size()) fail("LRU list and key map differ in size");
  Bytes total = 0;
  for (auto it = lru_.begin(); it != lru_.end(); ++it) {
    auto found = map_.find(std::string_view(it->first));
    if (found == map_.end() || found->second != it) fail("LRU entry missing from the key map");
    if (it->second.where.empty()) fail("entry with no residence");
    total += it->second.size;
  }
  if (total != total_bytes_) fail("total_bytes does not match the entries");
}

}  // namespace ghost
