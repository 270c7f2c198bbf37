// ObjectTable: the compact in-memory table of a CacheStore's objects (DESIGN §3.4): one
// fixed-size slot per object, keyed by the first 64 bits of the SHA-256 of its key (the same
// digest that names its body file), holding only what a status query, the byte cap and
// eviction need: the size and an LRU tick. Everything else about an object (its key, validators,
// stored response head, expiry) stays in the index database and is read on demand.
//
// Layout: open addressing with linear probing over one array of 24-byte slots; hash 0 marks an
// empty slot (a real hash of 0 is stored as 1). The array grows by half when it is 7/8 full, so
// an object costs 24 / load bytes, 27-41 bytes (DESIGN §3.4 measures it). Deletion shifts the
// following cluster back (no tombstones), so a lookup never scans more than one cluster.
//
// Eviction without a list: PickVictim returns the slot with the lowest tick among all objects
// when there are few of them (<= kExactLimit: exact LRU), else among kSample slots chosen at
// random (sampled LRU, as in Redis's maxmemory-policy allkeys-lru): with 32 samples the victim
// is older than ~97% of the objects. Ties in tick go to the lower hash, so the order is
// deterministic.
//
// Ticks are strictly increasing per table user (the store hands out wall-clock microseconds,
// bumped by one on ties), so a tick is both the LRU order and the last-access time.
//
// Thread-safety: not thread-safe; a value type owned by one CacheStore.
#ifndef GHOST_COMMON_CACHE_OBJECT_TABLE_H_
#define GHOST_COMMON_CACHE_OBJECT_TABLE_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "common/base/units.h"

namespace ghost {

class ObjectTable {
 public:
  struct Slot {
    std::uint64_t hash = 0;  // 0 = empty
    Bytes size = 0;
    std::int64_t tick = 0;
  };
  static_assert(sizeof(Slot) == 24, "a slot is three words");

  // Below this many objects PickVictim scans every slot (exact LRU); above, it samples.
  static constexpr std::size_t kExactLimit = 1024;
  static constexpr int kSample = 32;

  ObjectTable() = default;

  // Inserts `hash` or replaces its size and tick. Returns the size it had, or nullopt if new.
  std::optional<Bytes> Put(std::uint64_t hash, Bytes size, std::int64_t tick);
  // The slot of `hash`, or nullptr. Valid until the next non-const call.
  const Slot* Get(std::uint64_t hash) const;
  bool Contains(std::uint64_t hash) const { return Get(hash) != nullptr; }
  // Sets the tick of `hash`. Returns false if absent.
  bool Touch(std::uint64_t hash, std::int64_t tick);
  // Removes `hash`. Returns false if absent.
  bool Erase(std::uint64_t hash);
  // The least recently used object (exact or sampled, see above) other than `keep`, or
  // nullopt if there is none.
  std::optional<Slot> PickVictim(std::uint64_t keep);

  std::size_t size() const { return count_; }
  Bytes total_bytes() const { return total_bytes_; }
  // Bytes of the slot array (the table's whole heap use).
  std::size_t memory_bytes() const { return slots_.capacity() * sizeof(Slot); }
  // Calls `fn(slot)` for every object, in no particular order.
  void ForEach(const std::function<void(const Slot&)>& fn) const;

  // Maps a digest's first 8 bytes (big-endian) to a table hash (never 0).
  static std::uint64_t HashOf(const unsigned char* digest8);

  // Aborts with a message if count, total bytes or probe clusters are inconsistent.
  void AssertInvariants() const;
  // The longest distance of an object's slot from its home slot (the worst lookup's probes).
  std::size_t LongestProbe() const;
  // Slots stepped over past home slots by every lookup and insert so far (growth included).
  std::uint64_t probe_steps() const { return probe_steps_; }

 private:
  std::size_t Home(std::uint64_t hash) const {
    // The hash is mixed first (splitmix64's finalizer, a bijection): Lemire's reduction alone
    // is monotone in the hash, and a clean Open loads the rows in hash order (from the index
    // objects_table), which then piled every key of a growing table into one cluster at its
    // start: quadratic probing, 9 s to load 100k objects. Then Lemire's multiply-shift range
    // reduction: no power-of-two size needed.
    std::uint64_t z = hash;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    __extension__ using Wide = unsigned __int128;
    return static_cast<std::size_t>((static_cast<Wide>(z) * slots_.size()) >> 64);
  }
  std::size_t Next(std::size_t i) const { return i + 1 == slots_.size() ? 0 : i + 1; }
  // The index of `hash`'s slot, or of the empty slot where it would go. Precondition: the
  // array is not empty and not full.
  std::size_t Probe(std::uint64_t hash) const;
  mutable std::uint64_t probe_steps_ = 0;
  void Grow();
  static bool Older(const Slot& a, const Slot& b) {
    return a.tick != b.tick ? a.tick < b.tick : a.hash < b.hash;
  }

  std::vector<Slot> slots_;
  std::size_t count_ = 0;
  Bytes total_bytes_ = 0;
  std::uint64_t rng_ = 0x9e3779b97f4a7c15ull;  // xorshift64 state for sampling
};

}  // namespace ghost

#endif  // GHOST_COMMON_CACHE_OBJECT_TABLE_H_
