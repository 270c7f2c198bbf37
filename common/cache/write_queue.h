// WriteQueue: the deferred-write policy for one disk (DESIGN §3.2 last sentence, §3.5).
//
// Background writes (cache fills, metadata updates) must not wake a sleeping disk by
// themselves. While the disk's policy defers background writes and the disk is not in (or is
// heading out of) its high-power mode, writes wait here in memory. The queue is flushed
//   - when the disk next enters its high-power mode (a PowerManager subscription: pushed,
//     never polled, no timers),
//   - when the queued bytes exceed the cap (default 4 MiB, as in the paper; the write spins
//     the disk up),
//   - when a record marked sync arrives (the user's data must be durable before the sync
//     returns: DESIGN §2 "nothing acknowledged is lost"),
//   - on FlushAll (end of a run, unmount).
// A policy that does not defer (the static baseline, DESIGN §7) has every write handed to the
// writer at once, spinning the disk up by writing.
//
// A flush sorts the queued records by (key, offset) and merges overlapping and adjacent
// records of the same key, later writes winning on overlap (NVCache policy 4, DESIGN §3.5),
// then hands the merged batch to the writer. Records added while a batch is with the writer
// go in the next batch; so do those that find the disk in its high-power mode while the writer
// is busy: they wait, merged, until it is done (sync, the cap and FlushAll do not wait), so
// the writer's backlog is a few batches, never one disk access per write. Reads see queued data, and data being flushed, until the writer says
// it is durable.
//
//   Add ──▶ write-now? ──yes──▶ writer (batch of one, or the queue + this record)
//             │no
//             ▼
//           queue ──(disk enters mode 0 | bytes > cap | sync | FlushAll)──▶ sort + merge
//                                                                          ──▶ writer
//   writer's done ──▶ batch leaves the in-flight set; sync and FlushAll callbacks fire
//
// The writer performs one batch on the disk: in ghostsim it submits one disk write of the
// batch's total size; live, it writes the files. It must apply batches in the order it
// receives them (later batches overwrite earlier ones) and call `done` once the batch is
// durable; it may call `done` from inside the call. A record carries data in live use and
// none in simulation (length only).
//
// Thread-safety: not thread-safe; use from the thread that drives the clock (where the
// PowerManager's callbacks run). The writer's `done` must be called on that thread too.
#ifndef GHOST_COMMON_CACHE_WRITE_QUEUE_H_
#define GHOST_COMMON_CACHE_WRITE_QUEUE_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/power/power_manager.h"
#include "common/base/units.h"

namespace ghost {

// What a write record stands for, so the writer routes it by type, not by its key's text.
enum class WriteKind {
  kCache,      // a cache write the simulator only sizes (ghostsim's fills)
  kLocalFile,  // a write into a file of the mount's local/ tree (fs/local_tree.h)
  kFill,       // a body for the cache store (fs/write_back.h)
  kIndex,      // an index row update for the cache store (fs/write_back.h)
};

struct WriteRecord {
  WriteKind kind = WriteKind::kCache;  // one key has one kind
  std::string key;  // the object (cache key or file identity)
  Bytes offset = 0;
  Bytes length = 0;
  // The bytes (live), or empty (simulation). If not empty, data.size() == length.
  std::string data;
  // The application synced this data: it must be durable before the sync returns. In a merged
  // record: some record of this key in the batch was sync.
  bool sync = false;
};

struct WriteQueueOptions {
  // Queued bytes (the sum of the records' lengths, before merging) above which the queue is
  // flushed at once, spinning the disk up. 4 MiB is the paper's buffer (DESIGN §3.5).
  Bytes cap = 4 * 1024 * 1024;
};

// Why a queue flush happened.
enum class FlushReason {
  // The disk entered its high-power mode; or Add found it there (or its policy no longer
  // deferring) with writes still queued; or the writer finished a batch while records that
  // found the disk there waited for it.
  kPowerCallback,
  kCap,       // queued bytes exceeded the cap
  kSync,      // a sync record arrived
  kExplicit,  // FlushAll
};
const char* FlushReasonName(FlushReason reason);

struct WriteQueueStats {
  std::uint64_t records_added = 0;            // every Add / AddSync
  std::uint64_t records_queued = 0;           // of those, deferred in the queue
  std::uint64_t records_written_at_once = 0;  // of those, handed to the writer at once
  Bytes bytes_written_at_once = 0;
  std::uint64_t batches_flushed = 0;  // queue flushes handed to the writer
  std::uint64_t records_flushed = 0;  // merged records in those batches
  Bytes bytes_flushed = 0;            // merged bytes in those batches
  std::uint64_t flushes_power_callback = 0;
  std::uint64_t flushes_cap = 0;
  std::uint64_t flushes_sync = 0;
  std::uint64_t flushes_explicit = 0;
};

class WriteQueue {
 public:
  // Performs `batch` on the disk and calls `done` when it is durable (see the file comment).
  using Writer = std::function<void(std::vector<WriteRecord> batch, std::function<void()> done)>;

  // Borrows `pm`, which must outlive the queue; `disk` must stay registered while the queue
  // lives. Subscribes to the disk entering its high-power mode.
  WriteQueue(PowerManager& pm, DeviceId disk, const WriteQueueOptions& options, Writer writer);
  // Unsubscribes. Batches still with the writer are forgotten: their `done` then does nothing,
  // and no AddSync or FlushAll callback runs after this (call FlushAll and wait for it first
  // to be sure everything is durable).
  ~WriteQueue();
  WriteQueue(const WriteQueue&) = delete;
  WriteQueue& operator=(const WriteQueue&) = delete;

  // Adds a write. If the disk's policy does not defer background writes (or the disk has no
  // policy), or the disk is in its high-power mode and not heading down, the write goes to
  // the writer at once: alone if nothing is queued, else merged into a flush of the queue (so
  // it cannot overtake older queued writes). Otherwise it is queued, and the queue is flushed
  // if it now exceeds the cap or the record is sync. Never fails; the writer may be called
  // before Add returns.
  // Precondition: record.data is empty or record.data.size() == record.length.
  void Add(WriteRecord record);

  // Adds a write marked sync (forcing a flush of the queue with it) and calls `done` once it
  // and every write added before it are durable. `done` never runs inside AddSync.
  void AddSync(WriteRecord record, std::function<void()> done);

  // Flushes whatever is queued (spinning the disk up if needed) and calls `done` once every
  // write added so far is durable. `done` never runs inside FlushAll.
  void FlushAll(std::function<void()> done);

  // Drops the queued (not yet handed to the writer) records of `key`: the object is gone (a
  // deleted file nobody has open), so writing them would only spend the disk. Records with the
  // writer are not recalled. Sync and FlushAll callbacks are unaffected.
  void Discard(const std::string& key);

  // The bytes [offset, offset + length) of `key` as the queued and in-flight writes have them
  // (later writes win), or nullopt if those writes do not cover the whole range. Bytes of
  // records without data (simulation) read as zeros. A zero-length range reads as "" if the
  // key has pending writes.
  std::optional<std::string> Read(const std::string& key, Bytes offset, Bytes length) const;
  // Whether [offset, offset + length) of `key` is wholly covered by pending writes.
  bool Covers(const std::string& key, Bytes offset, Bytes length) const;
  // Whether `key` has writes that are queued or with the writer (not yet durable).
  bool Contains(const std::string& key) const;
  // Distinct bytes of `key` held by pending writes (queued or with the writer).
  Bytes QueuedBytes(const std::string& key) const;
  // One past the last byte of `key` that is not yet durable (0 if none): a file's size must
  // cover queued writes beyond its end on the disk.
  Bytes QueuedEnd(const std::string& key) const;
  // Copies every byte of `key` that is not yet durable and falls in [offset, offset + length)
  // over `buf` (later writes win), leaving the other bytes of `buf` as they are.
  void Overlay(const std::string& key, Bytes offset, char* buf, std::size_t length) const;

  // Whether a record added now is handed to the writer at once: the disk is in its
  // high-power mode, or its policy does not defer background writes.
  bool WriteNow() const;

  // Bytes waiting in the queue (the sum of lengths that the cap applies to), and records.
  Bytes queued_bytes() const { return queued_bytes_; }
  std::size_t queued_records() const { return queued_records_; }
  // Batches handed to the writer and not yet durable.
  std::size_t batches_in_flight() const { return in_flight_.size(); }
  // Nothing queued and nothing with the writer.
  bool idle() const { return queue_.empty() && in_flight_.empty(); }

  const WriteQueueStats& stats() const { return stats_; }

  // Aborts with a message if the byte and record counts disagree with the queue.
  void AssertInvariants() const;

 private:
  using ByKey = std::map<std::string, std::vector<WriteRecord>>;  // arrival order per key
  struct Batch {
    ByKey records;  // merged: per key sorted by offset, disjoint, non-adjacent
  };
  struct Waiter {
    std::uint64_t after_batch;  // fires when this batch and all before it are durable
    std::function<void()> fn;
  };

  // Add's work; returns the id of the batch the record went into, or 0 if it was queued.
  std::uint64_t AddRecord(WriteRecord record);
  void Enqueue(WriteRecord record);
  // Hands the queue to the writer as one merged batch; returns its id (0 if nothing queued).
  std::uint64_t Flush(FlushReason reason);
  std::uint64_t HandToWriter(ByKey records);
  void OnBatchDurable(std::uint64_t id);
  void OnHighPowerMode();
  // Runs `fn` once every batch up to `batch` is durable; never inside this call.
  void WhenDurable(std::uint64_t batch, std::function<void()> fn);
  // Pending writes of `key`, oldest first (in-flight batches, then the queue).
  std::vector<const WriteRecord*> PendingRecords(const std::string& key) const;

  PowerManager& pm_;
  DeviceId disk_;
  WriteQueueOptions options_;
  Writer writer_;
  SubscriptionId subscription_ = 0;

  ByKey queue_;
  Bytes queued_bytes_ = 0;
  std::size_t queued_records_ = 0;
  std::uint64_t next_batch_ = 1;
  std::map<std::uint64_t, Batch> in_flight_;  // by id = hand-off order
  std::vector<Waiter> waiters_;
  WriteQueueStats stats_;
  // Lets a writer's `done` outliving the queue find out that it is gone.
  std::shared_ptr<WriteQueue*> self_;
};

// Merges one key's records (given oldest first) into disjoint, non-adjacent records sorted by
// offset; later records win where they overlap. Data is kept byte-exact when records carry it;
// where a merged record mixes records with and without data, the latter's bytes are zeros.
// Zero-length records survive only where no other record touches their offset.
// Exposed for the flash log's flush (DESIGN §3.5, policy 4) and for tests.
std::vector<WriteRecord> MergeWriteRecords(const std::vector<const WriteRecord*>& oldest_first);

}  // namespace ghost

#endif  // GHOST_COMMON_CACHE_WRITE_QUEUE_H_
