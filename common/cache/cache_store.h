// CacheStore: the persistent disk cache under one directory (DESIGN §3.4, §4): a sqlite3
// index of the objects plus one file per object body, read and written through FileIo.
//
// Layout of `dir`:
//   index.sqlite                    WAL mode, 16 KiB pages; tables schema_version, shutdown and
//                                   objects(key, size, etag, last_modified, content_type,
//                                   expires_us, fetched_us, accessed_us, complete, response, h,
//                                   body): a rowid table with one covering index on (h, complete,
//                                   size, accessed_us) and none on key (a key is looked up by its
//                                   h; a trigger keeps one row per key); a row with a response
//                                   head keeps it with its validators and type as one deflated
//                                   BLOB (schema 5, cache_store.cc)
//   objects/<h[0..2]>/<h>           a body; h = hex SHA-256 of the key, so the key's text never
//                                   reaches a path ("..", "/", NUL in a key are harmless)
//   objects/<h[0..2]>/<h>.fill-<n>  a fill in progress, renamed to <h> when it commits
//
// Open loads each complete row's hash, size and access time into an ObjectTable (24 bytes a
// slot, DESIGN §3.4), so status and size queries (getattr, `ghostctl status`) and misses never
// touch sqlite or the disk. The rest of an entry (validators, expiry, the stored response
// head and a packed body) is read from sqlite, in one statement, when index().Find asks for
// it; the last few found are kept, and PackedBody answers from them.
// h is the first 64 bits of the key's SHA-256 (the body file's name); a later object whose h
// collides with a cached one replaces it in the table, and Open drops the older row of such a
// pair (a cache may lose objects, never serve a wrong one: Find compares the whole key).
//
// Crash safety: a cache may lose fills, never serve half of one (DESIGN §2). A body becomes
// visible only by rename after all its bytes are written, together with its row turning
// complete=1. Open deletes rows with complete=0 (a fill or a replacement cut short), temp files,
// files with no complete row, and rows whose file is missing or has the wrong size. A clean
// Close (no fill open, no file left behind) marks the index clean, and the
// next Open then skips the body files (no stat, no directory scan: mount time does not grow
// with the objects' number); a body damaged behind the store's back is then dropped when a
// reader opens it (CheckBody). The mark is cleared, fsynced, as the store opens. A corrupt
// index.sqlite is renamed aside (index.sqlite.corrupt-<unix time>) and the cache starts empty,
// with a line in warnings() and on stderr.
//
// Commit of a fill, in order: (if replacing) row complete=0; rename temp -> body; one
// transaction with the row complete=1 and the rows of the evicted objects deleted; then the
// evicted bodies are unlinked. A crash between any two steps leaves either the old object, no
// object, or the new one. Fills are not fsynced (a cache fill is not user data).
// Group commit: fills whose appends complete in one loop turn are published together on the
// next turn, consecutive packed ones (body under the pack limit: the row and its body are the
// whole commit) in one transaction; CommitFill's callback runs only after that transaction
// has committed. A fill announced packed (BeginFill with a size under the limit) writes no
// pending row and no temp file: until its commit its bytes are only in RAM (appends past the
// announced size fail it), so a crash before the commit leaves nothing to recover.
//
// Byte cap: `capacity` bytes of bodies (0 = unlimited) is a hard cap on committed objects.
// Eviction (least recently used first: exact below ObjectTable::kExactLimit objects, sampled
// LRU above, ObjectTable::PickVictim) happens when a fill commits, and
// ahead of time when BeginFill is told the size. An object bigger than the cap is refused.
// Nothing runs on a timer: every change is driven by a call (DESIGN §2).
//
// Access times (Touch, ReadBody) change the in-memory LRU order at once and reach sqlite in
// batches: with the first transaction after access_batch of them are unsaved or the oldest is
// access_max_lag old (CacheStoreOptions), with SaveIndex (which the owner calls within
// access_max_lag: SetUnsavedListener), and at Close. A crash loses at most the LRU order of
// that lag, never an object (DESIGN §4.5). A saved time is a row appended to the index's
// ticks table, replayed by Open and compacted to one row per object (cache_store.cc,
// CacheStoreOptions::ticks_min_rows), not an update of the object's row. Times are persisted as wall-clock microseconds (Options::wall_clock) so expiry and
// LRU order survive a restart even though each run's Clock starts at zero.
//
// The directory is locked (flock) while the store is open: a second store (or daemon) on the
// same directory fails to open instead of corrupting the first. The WAL's checkpoints (which
// fsync) run on a thread of the store's own with its own connection, woken only after a
// commit leaves 4 MiB in the WAL; the event loop's commits only append (DESIGN §4.5).
//
// Callbacks run on the event-loop thread (through the FileIo), never inside the call that
// took them, and exactly once, unless the store is destroyed first: then they are dropped.
// Metadata operations (mkdir, open, rename, unlink, sqlite) are synchronous; body reads and
// writes go through FileIo.
//
// Thread-safety: not thread-safe; use from the event-loop thread only.
#ifndef GHOST_COMMON_CACHE_CACHE_STORE_H_
#define GHOST_COMMON_CACHE_CACHE_STORE_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <deque>
#include <map>
#include <optional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "common/cache/cache_index.h"
#include "common/cache/object_table.h"
#include "common/base/clock.h"
#include "common/base/file_io.h"
#include "common/base/status.h"
#include "common/base/units.h"

namespace ghost {

struct CacheStoreOptions {
  // Wall-clock time, to persist the Clock's times (which start at zero each run) as
  // microseconds since the Unix epoch. Read once at Open: persisted = t + (wall - clock.Now()).
  // Empty: std::chrono::system_clock::now. Tests pass a function of their VirtualClock so
  // times round-trip exactly.
  std::function<std::chrono::system_clock::time_point()> wall_clock;
  // Bodies smaller than this are packed: stored in their index row (objects.body) instead of
  // a file of their own, written in the transaction that commits the row (squid's rock store
  // does the same for small objects in a slab file). 0: every body is a file. Packed bodies
  // already cached stay readable whatever this is.
  Bytes pack_limit = 16 * 1024;
  // Access times (Touch, reads) wait in memory until this many objects have one unsaved, or
  // the oldest unsaved one is `access_max_lag` old; then they ride with the next transaction
  // (a fill's commit, SaveIndex, Close). 0 or 1: with every transaction. A batch is appended
  // to the ticks table (~25 bytes a time: 512 share one or two pages of the WAL; they were two
  // random 16 KiB pages each as updates of the rows, DESIGN §4.5).
  std::size_t access_batch = 512;
  Duration access_max_lag = std::chrono::seconds(10);
  // The ticks table (saved access times, appended) is compacted to one row per object by the
  // transaction that would take it past max(this, objects) rows (cache_store.cc).
  std::size_t ticks_min_rows = 65536;
};

using FillId = std::uint64_t;

class CacheStore;

// A CacheStore's index of complete objects, as callers see it: sizes, counts and presence
// from memory; whole entries read from the index database on demand. A view into its store.
class StoreIndex {
 public:
  // The entry (where = kDisk), or nullptr if `key` is not cached. Reads sqlite unless the
  // entry was found recently. The pointer is valid until the next non-const call on the store
  // or 256 more Finds. Does not count as an access.
  const CacheEntry* Find(const std::string& key) const;
  // From memory only (an unrelated key whose 64-bit hash collides would read as present, a
  // chance of about n / 2^64; Find and reads compare the whole key).
  bool Contains(const std::string& key) const;
  CacheStatus Status(const std::string& key, bool network_preferred) const;
  std::size_t size() const;
  bool empty() const { return size() == 0; }
  Bytes total_bytes() const;
  // Calls `fn(key, entry)` for every object, least recently used first. Reads every row:
  // for tests and tools, not for a request path.
  void ForEach(const std::function<void(const std::string&, const CacheEntry&)>& fn) const;

 private:
  friend class CacheStore;
  explicit StoreIndex(const CacheStore* store) : store_(store) {}
  const CacheStore* store_;
};

class CacheStore {
 public:
  // Opens (creating if missing) the cache in `dir`; see the header comment for what is
  // recovered. Borrows `clock` and `io`, which must outlive the store. `capacity` is the byte
  // cap (0 = unlimited); objects beyond a lowered cap are evicted here.
  // Fails with NotFound if the parent of `dir` does not exist, with the errno's Status if
  // `dir` cannot be created or is not a directory, with IoError if the index cannot be opened
  // (e.g. another process holds it), and NotSupported if it was written by a newer schema.
  static Result<std::unique_ptr<CacheStore>> Open(const std::string& dir, Bytes capacity,
                                                  const Clock& clock, FileIo& io,
                                                  const CacheStoreOptions& options = {});
  // Closes (see Close); an error is logged to stderr.
  ~CacheStore();
  CacheStore(const CacheStore&) = delete;
  CacheStore& operator=(const CacheStore&) = delete;

  // The index of complete objects (size, validators, expiry, LRU order).
  const StoreIndex& index() const { return view_; }
  // Heap bytes of the in-memory object table (ObjectTable::memory_bytes).
  std::size_t table_memory_bytes() const { return table_.memory_bytes(); }
  // What Open recovered from (a corrupt index, damaged objects), one line each.
  const std::vector<std::string>& warnings() const { return warnings_; }
  const std::string& dir() const { return dir_; }

  // Cache status from memory only (DESIGN §3.4). Does not count as an access.
  CacheStatus Status(const std::string& key, bool network_preferred) const;

  // Reads up to buf.size() bytes of `key`'s body from `offset` into `buf` (borrowed until
  // `done`); fewer at the end of the body. Counts as an access (see Touch). `done` gets
  // NotFound if `key` is not cached, or the read's error.
  void ReadBody(const std::string& key, std::uint64_t offset, std::span<char> buf,
                FileIo::Done done);
  // Checks that `fd`, an open body of `key` (BodyPath), has the size the index has for it.
  // On a mismatch (a body changed or cut short behind the store's back: Open does not look at
  // body files after a clean Close) the object is dropped and the result is an ENOENT Status
  // saying so; NotFound if `key` is not cached. Readers of body files call this once per open.
  ghost::Status CheckBody(const std::string& key, int fd);

  // The body of `key` if it is cached packed, else nullptr (a body file, or not cached).
  // Reads sqlite (one lookup by key). Readers of a cached object ask this before BodyPath.
  std::shared_ptr<const std::string> PackedBody(const std::string& key) const;
  // The version name of a packed body, "p<hash of the bytes>-<size>" (a body file's is
  // "d<inode>-<size>"): equal for equal bytes, so the kernel may keep such pages.
  static std::string PackedVersion(std::string_view body);

  // Starts writing a new body for `key` into a temp file. `meta` carries the validators,
  // content type and expiry; `meta.size` is the announced size if known (0 = unknown): then
  // least recently used objects are evicted now to make room, a size over the cap is refused
  // here, and a commit with a different size is refused. `where`, `fetched` and `last_access`
  // are set at commit. A cached copy of `key` stays readable until the commit replaces it.
  // Fails with InvalidArgument if the object is too big for the cap, or the errno's Status if
  // the temp file cannot be created.
  [[nodiscard]] Result<FillId> BeginFill(const std::string& key, CacheEntry meta);
  // Appends `data` to the fill; `done` gets OK once written. On a write error (ENOSPC, EIO)
  // or when the body grows past the cap, the fill is abandoned: its temp file is removed,
  // this and every later Append/Commit on it report the error; other fills and cached
  // objects are untouched. Appends may be issued without waiting for earlier ones.
  void AppendFill(FillId id, std::string data, std::function<void(ghost::Status)> done);
  // Waits for the fill's appends, then publishes the body (rename, index row complete=1),
  // evicting least recently used objects to stay under the cap, and calls `done` with OK; or
  // with the error that abandoned the fill (nothing is cached then). The id is finished
  // either way.
  void CommitFill(FillId id, std::function<void(ghost::Status)> done);
  // Abandons the fill: its temp file and pending row are removed, nothing becomes visible.
  // Pending appends and a pending commit of it report an error. Unknown ids are ignored.
  void AbortFill(FillId id);

  // Changes `key`'s metadata (validators, content type, expiry, fetched; e.g. after a 304),
  // keeping its LRU position. Changes by `fn` to size, where and last_access are ignored.
  // In memory now; persisted, like access times, with the next transaction, SaveIndex or
  // Close: a caller that defers disk writes (DESIGN §3.5) decides when. A crash loses the
  // change, which costs one more revalidation, never a wrong body. NotFound if `key` is not
  // cached.
  ghost::Status UpdateMeta(const std::string& key, const std::function<void(CacheEntry&)>& fn);
  // Writes the metadata changes and access times not yet in sqlite, in one transaction.
  ghost::Status SaveIndex();
  // Rows whose metadata or access time sqlite does not have yet.
  std::size_t unsaved_index_changes() const { return dirty_access_.size() + dirty_meta_.size(); }
  // Whether the unsaved access times are due (CacheStoreOptions::access_batch,
  // access_max_lag): the next transaction writes them.
  bool AccessTimesDue() const;
  // Transactions that wrote the access times (for tests and stats).
  std::uint64_t access_saves() const { return access_saves_; }
  // Calls `fn` when the store gets an unsaved index change (an access time, a metadata
  // change) while it had none: its owner makes sure SaveIndex runs within the lag it promises
  // (ghostfs: a one-shot timer of access_max_lag), since nothing here runs on a timer. Runs
  // inside Touch or UpdateMeta. One listener; empty removes it.
  void SetUnsavedListener(std::function<void()> fn) { on_unsaved_ = std::move(fn); }
  Duration access_max_lag() const { return access_max_lag_; }
  // Removes `key`'s body and row. NotFound if it is not cached.
  ghost::Status Erase(const std::string& key);
  // Records an access: `key` becomes the most recently used. In memory now; persisted with
  // the next transaction or at Close (never on a timer). Returns false if it is not cached.
  bool Touch(const std::string& key);

  // Waits for the index's background checkpoint, if one runs, and ends its thread (the next
  // checkpoint starts a new one). Call before fork(): a thread caught in sqlite by a fork
  // would leave the child's index locked.
  void PrepareFork();

  // Abandons open fills, persists access times, and closes the index. Later calls fail
  // (callbacks get an error). Returns the error of the last write, if any. Idempotent.
  ghost::Status Close();

  // Calls `fn(key)` whenever a cached object changes or leaves the cache: its body replaced
  // by a commit, its metadata updated (UpdateMeta), erased, evicted or dropped as unreadable.
  // Runs inside the call that made the change, after it. One listener; empty removes it.
  // (ghostfs forwards these to clients that hold copies in RAM: the "objects" topic.)
  void SetChangeListener(std::function<void(const std::string& key)> fn) {
    on_change_ = std::move(fn);
  }
  // A second listener of the same changes, for the mount's own read path (ghostfs drops the
  // descriptors it keeps of a replaced or removed body). Called before the one above.
  void SetInternalChangeListener(std::function<void(const std::string& key)> fn) {
    on_internal_change_ = std::move(fn);
  }

  // Where `key`'s body lives (whether or not it is cached): dir/objects/<h[0..2]>/<h>.
  std::string BodyPath(std::string_view key) const;
  // The hex SHA-256 of `key`: the body's file name.
  static std::string ObjectName(std::string_view key);
  // The first 64 bits of ObjectName(key): the object's slot in the in-memory table.
  static std::uint64_t KeyHash(std::string_view key);
  std::size_t open_fills() const { return fills_.size(); }
  // sqlite transactions committed since Open (the misses path's cost: a group of packed fills
  // shares one).
  std::uint64_t transactions() const { return transactions_; }
  // Pages the index's connection has written to the WAL since Open (sqlite's
  // SQLITE_DBSTATUS_CACHE_WRITE): what a transaction costs the disk.
  std::uint64_t pages_written() const;
  // sqlite statements the lookups (Find, PackedBody) have run since Open, one read transaction
  // (two fcntl locks of the WAL index) each: a Find reads the packed body with the entry, so a
  // hit that asks for both runs one (tests).
  std::uint64_t index_reads() const { return index_reads_; }

 private:
  friend class StoreIndex;
  struct Db;  // sqlite handle and prepared statements (cache_store.cc)
  struct Fill {
    std::string key;
    CacheEntry meta;
    std::string temp_path;
    std::shared_ptr<UniqueFd> fd;  // shared with in-flight writes, so it outlives them
    // Announced under the pack limit: the bytes wait in `memory` (no temp file, no fd).
    bool in_memory = false;
    std::string memory;
    Bytes written = 0;             // bytes handed to FileIo so far (the next append's offset)
    int in_flight = 0;             // appends not yet completed
    bool committing = false;
    std::function<void(ghost::Status)> commit_done;
    ghost::Status error;  // not OK once abandoned; its temp file is then gone
  };

  CacheStore(std::string dir, Bytes capacity, const Clock& clock, FileIo& io,
             const CacheStoreOptions& options);

  ghost::Status OpenIndex();
  ghost::Status Load();
  ghost::Status RemoveOrphans();
  void SetAsideCorruptIndex(const std::string& why);
  void Warn(std::string line);

  // Runs `changes`, the pending metadata updates and, if due or `all_access`, the pending
  // access times in one transaction.
  ghost::Status Batch(const std::function<ghost::Status()>& changes, bool all_access = false);
  // Appends (h, tick) to the ticks table (inside a transaction).
  ghost::Status AppendTick(std::uint64_t h, std::int64_t tick);
  // Deletes the rows and bodies of objects already gone from the index.
  ghost::Status DropObjects(const std::vector<std::string>& keys);
  // Takes least recently used objects (never `keep`) out of the table until `incoming` more
  // bytes fit under the cap, and returns their keys (the caller drops their rows and bodies).
  // Nothing if the cap is 0 or `incoming` alone exceeds it.
  std::vector<std::string> EvictFor(Bytes incoming, std::uint64_t keep);
  // Removes `key` from the table and the found entries. Returns false if it was absent.
  bool Unindex(const std::string& key);
  // The key of the complete row with hash `h`, if any.
  std::optional<std::string> KeyOf(std::uint64_t h) const;
  // What one read of a row said of its packed body: known (read from sqlite with the entry)
  // and the body, or nullptr for a body file.
  struct PackedRead {
    bool known = false;
    std::shared_ptr<const std::string> body;
  };
  // The entry of `key` with the table's size and access time: dirty metadata, else sqlite
  // (then `packed`, if given, gets the row's packed body too).
  std::optional<CacheEntry> LoadEntry(const std::string& key, const ObjectTable::Slot& slot,
                                      PackedRead* packed = nullptr) const;
  const CacheEntry* FindEntry(const std::string& key) const;
  void ForEachEntry(const std::function<void(const std::string&, const CacheEntry&)>& fn) const;
  // A strictly increasing access time in stored (wall-clock) microseconds: the LRU tick.
  std::int64_t NextTick();
  void RemoveFile(const std::string& path);

  void OnAppendDone(FillId id, ghost::Status st, const std::function<void(ghost::Status)>& done);
  // Queues a fill whose appends are done for the next group commit (CommitReady).
  void FinishCommit(FillId id);
  // The group commit: publishes every fill queued by FinishCommit since the last one, in
  // order; consecutive packed fills share one transaction. Each fill's commit_done runs after
  // the transaction holding its row has committed, never before.
  void CommitReady();
  // Whether `fill` will be published packed (its body under the pack limit, no error).
  bool Packable(const Fill& fill) const;
  // The fill's whole body: its RAM copy, or read back from its temp file.
  Result<std::string> TakeFillBytes(Fill& fill);
  // Publishes packed fills in one transaction; results[i] is fills[i]'s outcome.
  void PublishPackedGroup(std::vector<Fill*>& fills, std::vector<ghost::Status*>& results);
  ghost::Status Publish(Fill& fill);
  // Publish of a body under the pack limit (CacheStoreOptions): read back from its temp file into the row.
  ghost::Status PublishPacked(Fill& fill, bool replacing);
  // Marks the fill abandoned with `st`, removing its temp file and pending row.
  void Fail(Fill& fill, ghost::Status st);
  // Removes the temp file and the pending row of a fill that will not be published.
  void Discard(Fill& fill);
  // Runs `fn` on the loop's next completion (never inside the current call), unless the
  // store is destroyed first.
  void Defer(std::function<void()> fn);
  ghost::Status ClosedError() const;

  std::int64_t ToStored(TimePoint t) const {
    return t.time_since_epoch().count() + wall_offset_us_;
  }
  TimePoint FromStored(std::int64_t us) const { return TimePoint(Duration(us - wall_offset_us_)); }

  const std::string dir_;
  const Bytes capacity_;
  const Bytes pack_limit_;
  const std::size_t access_batch_;
  const std::size_t ticks_min_rows_;
  const Duration access_max_lag_;
  const Clock& clock_;
  FileIo& io_;
  std::int64_t wall_offset_us_ = 0;  // wall-clock µs since the epoch minus the clock's µs
  ObjectTable table_;
  StoreIndex view_{this};
  std::int64_t last_tick_ = 0;
  std::unique_ptr<Db> db_;
  // Entries Find read recently (bounded FIFO of kFoundLimit). A change to the object marks
  // its entry stale (UpdateMeta rewrites it in place) rather than freeing it, so a pointer
  // Find handed out stays readable as long as with the list-based index before (callers
  // hold one across store calls); the next Find reloads a stale entry into the same node.
  // The packed body read with the entry goes with it (PackedBody answers from it until the
  // object changes): at most kFoundLimit bodies under the pack limit, 4 MiB at 16 KiB.
  struct Found {
    CacheEntry entry;
    bool stale = false;
    PackedRead packed;
  };
  static constexpr std::size_t kFoundLimit = 256;
  mutable std::unordered_map<std::string, Found> found_;
  void MarkStale(const std::string& key) {
    if (auto it = found_.find(key); it != found_.end()) it->second.stale = true;
  }
  mutable std::deque<std::string> found_order_;
  std::vector<std::string> warnings_;
  std::map<FillId, Fill> fills_;
  std::vector<FillId> ready_;     // fills waiting for the next group commit, in order
  bool group_scheduled_ = false;  // CommitReady is deferred to the loop's next turn
  std::uint64_t transactions_ = 0;
  mutable std::uint64_t index_reads_ = 0;  // statements run by Find and PackedBody
  FillId next_fill_id_ = 1;
  std::unordered_set<std::uint64_t> dirty_access_;  // hashes whose access time sqlite lacks
  TimePoint first_dirty_access_{};  // when dirty_access_ last became non-empty
  std::uint64_t access_saves_ = 0;
  std::size_t tick_rows_ = 0;  // rows in the index's ticks table (cache_store.cc, kTicksTable)
  std::function<void()> on_unsaved_;
  // Metadata from UpdateMeta that sqlite lacks (Find reads it from here until it is saved).
  std::unordered_map<std::string, CacheEntry> dirty_meta_;
  bool closed_ = false;
  bool clean_open_ = false;  // the last Close was clean: Open checked no body file
  bool lost_files_ = false;  // a file could not be removed: the next Open must scan
  std::function<void(const std::string& key)> on_change_;
  std::function<void(const std::string& key)> on_internal_change_;
  void Changed(const std::string& key) {
    if (on_internal_change_) on_internal_change_(key);
    if (on_change_) on_change_(key);
  }
  // Callbacks hold a weak_ptr to this: once the store is gone they do nothing.
  std::shared_ptr<int> alive_ = std::make_shared<int>(0);
};

}  // namespace ghost

#endif  // GHOST_COMMON_CACHE_CACHE_STORE_H_
