// CacheIndex: the in-memory index of cached objects (DESIGN §3.4).
//
// The cache manager answers "is this object cached, where, and how big?" from this index alone,
// so a status query never touches a device (a query that spun up the disk would cost the very
// energy the cache exists to save). Each entry records the object's size, where its body lives
// (write queue, flash log, disk cache; possibly several at once), its HTTP validators and
// expiry, and when it was fetched and last read.
//
// The index also keeps the cache's LRU order and its byte cap. Eviction is driven by additions
// (Insert, EvictFor), never by a poller (DESIGN §2): the index only names the victims; the
// caller deletes their bodies. Keys are compared exactly (a URL, or "imap:mailbox/uid").
//
//   LRU list:  least recently used ... most recently used
//              front (evicted first)       back (Insert, Touch)
//
// All operations are O(1) expected (a list plus a hash map), except EvictFor/Insert, which are
// O(1) per evicted entry, and ForEach.
//
// Thread-safety: not thread-safe; use from the thread that drives the clock.
#ifndef GHOST_COMMON_CACHE_CACHE_INDEX_H_
#define GHOST_COMMON_CACHE_CACHE_INDEX_H_

#include <cstdint>
#include <functional>
#include <list>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/base/clock.h"
#include "common/base/status.h"
#include "common/base/units.h"

namespace ghost {

// Where an object's body lives. The cost model prices a read from each of them (DESIGN §3.4).
enum class Residence : std::uint8_t {
  kWriteQueue = 1 << 0,  // deferred write, still in memory
  kFlashLog = 1 << 1,    // spilled to the flash log (NVCache role)
  kDisk = 1 << 2,        // in the disk cache
  kMemory = 1 << 3,      // a clean copy in RAM (the page cache)
};

// A small set of Residences (an object may be both queued and on disk, e.g. after an update
// of a cached object while the disk sleeps). A value type.
class Residences {
 public:
  constexpr Residences() = default;
  constexpr Residences(Residence r) : bits_(static_cast<std::uint8_t>(r)) {}  // NOLINT: implicit

  constexpr bool Has(Residence r) const { return (bits_ & static_cast<std::uint8_t>(r)) != 0; }
  constexpr Residences& Add(Residence r) {
    bits_ |= static_cast<std::uint8_t>(r);
    return *this;
  }
  constexpr Residences& Remove(Residence r) {
    bits_ &= static_cast<std::uint8_t>(~static_cast<std::uint8_t>(r));
    return *this;
  }
  constexpr bool empty() const { return bits_ == 0; }

  // For saving the index (sqlite) and loading it back; FromBits ignores unknown bits.
  constexpr std::uint8_t bits() const { return bits_; }
  static constexpr Residences FromBits(std::uint8_t bits) {
    Residences r;
    r.bits_ = bits & kAllBits;
    return r;
  }

  friend constexpr bool operator==(Residences, Residences) = default;

 private:
  static constexpr std::uint8_t kAllBits = 0xf;
  std::uint8_t bits_ = 0;
};

constexpr Residences operator|(Residences a, Residence b) { return a.Add(b); }
constexpr Residences operator|(Residence a, Residence b) { return Residences(a).Add(b); }

// One cached object.
struct CacheEntry {
  Bytes size = 0;
  Residences where;           // never empty for an entry in the index
  std::string etag;           // origin's validator, empty if none
  std::string last_modified;  // origin's Last-Modified header as sent, empty if none
  std::string content_type;
  // When the origin's copy stops being fresh, in the clock's time; nullopt = unknown (the
  // caller revalidates by its own rule).
  std::optional<TimePoint> expires;
  TimePoint fetched{};      // when the body was fetched from the origin
  TimePoint last_access{};  // when it was last read (or inserted)
  // The stored response head of an object the proxy cached (its own serialization, opaque to
  // the cache); empty for objects ghostfs fetched itself.
  std::string response;

  bool Expired(TimePoint now) const { return expires.has_value() && *expires <= now; }
};

// What a cache status query answers (DESIGN §3.4).
enum class CacheState {
  kAbsent,
  kPresent,
  kPresentNetworkPreferred,  // cached, but the cost model prefers the network right now
};
const char* CacheStateName(CacheState state);

struct CacheStatus {
  CacheState state = CacheState::kAbsent;
  Bytes size = 0;  // 0 when absent
};

class CacheIndex {
 public:
  // Borrows `clock` (for access times), which must outlive the index. `capacity` is the byte
  // cap; 0 means unlimited.
  explicit CacheIndex(const Clock& clock, Bytes capacity = 0);
  CacheIndex(const CacheIndex&) = delete;
  CacheIndex& operator=(const CacheIndex&) = delete;

  // Adds `key`, or replaces its entry, as the most recently used; stamps `fetched` and
  // `last_access` with the clock's time (an insert is a fetch). First evicts least recently
  // used entries (never `key` itself) until the new size fits under the cap.
  // Returns the evicted keys, least recently used first: the caller must delete their bodies.
  // Fails with InvalidArgument, changing nothing, if `entry.size` exceeds a non-zero cap.
  // Precondition: `entry.where` is not empty.
  [[nodiscard]] Result<std::vector<std::string>> Insert(const std::string& key, CacheEntry entry);

  // Like Insert but keeps the entry's `fetched` and `last_access` (loading a saved index:
  // restore entries in ForEach order to get the same LRU order back). Evicts in the same way.
  [[nodiscard]] Result<std::vector<std::string>> Restore(const std::string& key, CacheEntry entry);

  // Changes an entry's metadata in place (residence, validators, expiry, content type)
  // without changing its LRU position. Returns false if `key` is absent.
  // Preconditions: `fn` leaves `size` unchanged (use Insert to change the size) and leaves
  // `where` non-empty (use Erase when the body is gone from everywhere).
  bool Update(const std::string& key, const std::function<void(CacheEntry&)>& fn);

  // Removes `key`. Returns false if it was absent.
  bool Erase(const std::string& key);

  // The entry, or nullptr if absent. The pointer is valid until the next non-const call.
  // Does not count as an access.
  const CacheEntry* Find(const std::string& key) const;
  bool Contains(const std::string& key) const { return Find(key) != nullptr; }

  // Records a read of `key`: it becomes the most recently used and its `last_access` is now.
  // Returns false if it is absent.
  bool Touch(const std::string& key);

  // The cache status of `key` (DESIGN §3.4). `network_preferred` is the cost model's current
  // verdict for this object; a present object then reads as kPresentNetworkPreferred. Does not
  // count as an access and ignores expiry (freshness is the caller's rule).
  CacheStatus Status(const std::string& key, bool network_preferred) const;

  // Evicts least recently used entries until `incoming` more bytes fit under the cap, and
  // returns their keys, least recently used first (the caller deletes their bodies). Evicts
  // nothing if the cap is 0 (unlimited) or if `incoming` alone exceeds it (it cannot be cached).
  // EvictFor(0) shrinks the cache to a cap lowered by set_capacity.
  [[nodiscard]] std::vector<std::string> EvictFor(Bytes incoming);

  // The byte cap; 0 = unlimited. Lowering it evicts nothing by itself: the next addition (or
  // EvictFor(0)) does.
  void set_capacity(Bytes capacity) { capacity_ = capacity; }
  Bytes capacity() const { return capacity_; }
  Bytes total_bytes() const { return total_bytes_; }
  std::size_t size() const { return map_.size(); }
  bool empty() const { return map_.empty(); }

  // Calls `fn(key, entry)` for every entry, least recently used first. `fn` must not modify
  // the index.
  void ForEach(const std::function<void(const std::string&, const CacheEntry&)>& fn) const;

  // Aborts with a message if the list, the map and total_bytes disagree.
  void AssertInvariants() const;

 private:
  using Node = std::pair<const std::string, CacheEntry>;
  using List = std::list<Node>;

  Result<std::vector<std::string>> Add(const std::string& key, CacheEntry entry);

  const Clock& clock_;
  Bytes capacity_;
  Bytes total_bytes_ = 0;
  List lru_;  // front = least recently used
  // Keys are views of the list nodes' keys (list nodes never move).
  std::unordered_map<std::string_view, List::iterator> map_;
};

}  // namespace ghost

#endif  // GHOST_COMMON_CACHE_CACHE_INDEX_H_
