// WriteBack: the mount's write queue and its writer (DESIGN §3.5). Every deferred write of the
// mount goes through it: cache fills (bodies the read path fetched, saved listings and
// mailbox summaries, the proxy's fills), index updates after a revalidation, and writes into
// local/ files. A record says what it is (WriteKind), and the writer routes it by that kind:
//
//   kind        applied by                      key in the queue
//   ----------  ------------------------------  -------------------------------------------
//   kFill       the cache store (BeginFill,     FillKey(key): the body waits here, once, in
//               AppendFill, CommitFill)         QueuedBody; the record carries its length
//   kIndex      CacheStore::SaveIndex (one per  IndexKey(key): one sqlite page
//               batch)
//   kLocalFile  the local/ tree (Hooks)         its file's identity (fs/local_tree.h)
//               or, with --flash-log, the flash
//               log (Hooks::local_file_to_log)
//
// The queue merges the records of one key byte-wise, so a key names one kind; the keys of the
// three kinds never meet (FillKey and IndexKey prefix theirs). Batches are applied one after
// another, in order (io_uring does not order writes; batches must be). The emulated disk does
// a batch's work (its total length) as the real one does it.
//
// A fill while it waits is readable at once: QueuedBodyOf hands readers the one version of the
// body queued now (a reader keeps its version even when a newer fill of the key is queued
// after it); while it is being written, WhenFillSettles waits for it.
//
// With a flash log (fs/flash_local.h), each batch asks it whether local/ records go to the log
// now (LocalFlashLog::TakesWrites); those records are then neither written to the disk nor
// charged to it: the log's flushes are.
//
// Fills spilled to the flash log (DESIGN §3.5 *Fills*). A batch that would wake the sleeping
// disk (LocalFlashLog::TakesFills: its cap passed, an fsync, a flush) and holds no index row
// sends its fills to the flash log instead of the store: each is one append group there,
// acknowledged once durable; the disk is neither written nor charged. A key with a fill in the
// log sends every later fill of it to the log too (applied in log order, the later wins). While
// in the log, the fill is readable: QueuedBodyOf reads its body back from the log (the reader
// shares that copy; the write-back keeps only the last one read), QueuedMeta and FillPending
// see it, and Logged says the source is the flash. The log's flush hands the fills back
// (ApplyLoggedFills) and they are written to the store as any fill (BeginFill, AppendFill,
// CommitFill); the log forgets them only once they are committed. A fill dropped meanwhile
// (DropQueuedFill, a newer fill of its key) is skipped then. If the log cannot take a fill, it
// goes to the store (the disk spins up).
//
// The writer's backlog. While one batch is being written, batches the queue hands over wait;
// the next write takes all of them that wait (up to kMaxMergedRecords records and
// kMaxMergedBytes, never two
// local/ records of one file, whose order io_uring would not keep) as one batch: their fills
// reach the store together and share one group commit (one sqlite transaction) and one disk
// charge, so the commit keeps up with a storm of small fills instead of paying a transaction
// and a disk request per fill.
//
// The fill backlog's RAM is bounded (FillBacklogBytes, WriteBackOptions::fill_backlog_max):
// every fill from QueueFill until it is in the store (or the flash log, or dropped) counts its
// body, head, key and a fixed cost for its records. Producers ask OverFillBacklog before
// queueing more and wait with WhenFillBacklogBelow (the proxy's stores are answered later;
// DESIGN §3.5 *Fills*); nothing is dropped to keep the bound.
//
// Thread-safety: not thread-safe; the daemon's one event-loop thread.
#ifndef GHOST_FS_WRITE_BACK_H_
#define GHOST_FS_WRITE_BACK_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "common/cache/cache_store.h"
#include "common/cache/write_queue.h"
#include "common/power/device.h"
#include "common/power/power_manager.h"
#include "fs/flash_local.h"

namespace ghost {

// What one index row update costs the disk in the write queue: one sqlite page.
constexpr Bytes kIndexRowBytes = 4096;

// A fill waiting in the write queue: the one version of the body that readers opening it now
// get. A reader keeps its version even when a newer fill of the key is queued after it.
struct QueuedBody {
  std::shared_ptr<const std::string> data;
  std::uint64_t version = 0;
};

struct WriteBackOptions {
  WriteQueueOptions queue;
  // Bytes the fills waiting for the store may hold in RAM before producers are held back
  // (FillBacklogBytes). 0: no bound.
  Bytes fill_backlog_max = 64 * 1024 * 1024;
};

// What one queued fill costs in RAM besides its body, head and key: its metadata's other
// strings, the queue's record of it (in the queue, then in the batch being written), the
// map nodes that find it and the callbacks that finish it (measured: about 1.2 KiB a fill at
// 100k queued small fills; DESIGN §3.5).
constexpr Bytes kQueuedFillOverhead = 1024;
// The most records, and bytes, one write of the backlog takes (a larger batch handed over is
// written whole): a group commit of this much holds the loop for tens of milliseconds.
constexpr std::size_t kMaxMergedRecords = 1024;
constexpr Bytes kMaxMergedBytes = 1024 * 1024;

class WriteBack {
 public:
  // Applies one record of a kind the write-back does not apply itself (kLocalFile) and calls
  // `done` once it is on the disk.
  using RecordWriter = std::function<void(WriteRecord record, std::function<void()> done)>;
  struct Hooks {
    RecordWriter local_file;                             // kLocalFile records
    RecordWriter local_file_to_log;                      // kLocalFile records, to the flash log
    std::function<void()> batch_done;                    // after each durable batch
    std::function<void(const std::string& key)> fill_committed;  // a fill is in the store
  };

  // The queue defers writes for the disk `disk_id` of `pm` (`disk` is that device: it does
  // each batch's work). Borrows everything; it must outlive the write-back.
  WriteBack(PowerManager& pm, DeviceId disk_id, Device& disk, CacheStore& store, WriteBackOptions options);
  ~WriteBack();
  WriteBack(const WriteBack&) = delete;
  WriteBack& operator=(const WriteBack&) = delete;

  // Set once, before the first write of a kind they handle.
  void SetHooks(Hooks hooks) { hooks_ = std::move(hooks); }
  // The flash log local/ records go to while it takes writes (null: none). Borrowed; set
  // before the first write, and it must outlive the write-back or be unset first.
  // Also the log's fill applier (fills spilled to it come back through ApplyLoggedFills).
  void SetFlashLog(LocalFlashLog* flash);
  WriteQueue& queue() { return *queue_; }
  const WriteQueue& queue() const { return *queue_; }

  // The queue's keys of the cache store's records.
  static std::string FillKey(const std::string& key) { return "fill:" + key; }
  static std::string IndexKey(const std::string& key) { return "index:" + key; }

  // Hands `body`, stored whole under cache key `key` with `meta` (its size is set here), to
  // the write queue as a fill: readers see it at once (the manager's kWriteQueue holder), the
  // disk gets it with the next batch (DESIGN §3.5). The body is kept once, here: readers
  // that open it share that version; the queue's record carries only the length.
  void QueueFill(const std::string& key, CacheEntry meta, std::string body);
  // QueueFill with only a content type (saved listings and mailbox summaries).
  void QueueWholeFill(const std::string& key, std::string body, const std::string& content_type);
  // The index row of `key` changed in memory (CacheStore::UpdateMeta): it reaches sqlite with
  // the next batch.
  void QueueIndexUpdate(const std::string& key);

  // Whether a fill of `key` is queued or with the writer (not yet in the store), or in the
  // flash log.
  bool FillPending(const std::string& key) const {
    return queue_->Contains(FillKey(key)) || logged_fills_.contains(key);
  }
  // Whether the fill of `key` readers get (QueuedBodyOf) is durable in the flash log: read
  // from flash. (While its append runs it is still read from RAM, and not yet durable.)
  bool Logged(const std::string& key) const {
    if (queued_bodies_.contains(key)) return false;
    auto l = logged_fills_.find(key);
    return l != logged_fills_.end() && !l->second.path.empty();
  }
  // Fills now in the flash log (or on their way into it).
  std::size_t logged_fills() const { return logged_fills_.size(); }
  // The metadata and body of the fill of `key` waiting in the queue (not yet handed to the
  // store), or nullptr.
  const CacheEntry* QueuedMeta(const std::string& key) const;
  const QueuedBody* QueuedBodyOf(const std::string& key) const;
  // Drops the queued fill of `key` (the writer then skips its record), and one in the flash log
  // (its flush skips it). Whether there was one.
  bool DropQueuedFill(const std::string& key);

  // Fills handed to the cache store and not yet committed (or abandoned): a reader of `key`
  // waits for them with WhenFillSettles (runs `fn` now if none).
  void FillStarted(const std::string& key) { ++writing_fills_[key]; }
  void FillSettled(const std::string& key);
  bool Writing(const std::string& key) const { return writing_fills_.contains(key); }
  // A batch is being written to the disk now.
  bool WritingBatch() const { return writing_; }
  // Batches handed over and waiting for the one being written.
  std::size_t backlog_batches() const { return write_backlog_.size(); }
  // Batches written (after merging the backlog) and the most handed-over batches one took.
  std::uint64_t batches_written() const { return batches_written_; }
  std::size_t most_merged() const { return most_merged_; }

  // The fill backlog (the file comment): the RAM its fills hold now, the bound, and whether
  // it is over the bound (a producer then waits before queueing more).
  Bytes FillBacklogBytes() const { return fill_backlog_bytes_; }
  Bytes fill_backlog_max() const { return fill_backlog_max_; }
  Bytes fill_backlog_peak() const { return fill_backlog_peak_; }
  bool OverFillBacklog() const { return fill_backlog_max_ != 0 && fill_backlog_bytes_ >= fill_backlog_max_; }
  // Runs `fn` once the fill backlog is under its bound (now, if it is). Waiters run in order;
  // each may queue fills, and the next runs only if the backlog is still under the bound.
  void WhenFillBacklogBelow(std::function<void()> fn);
  std::size_t backlog_waiters() const { return backlog_waiters_.size(); }
  // What a fill of `key` with `meta` and `body_size` bytes counts in the fill backlog.
  static Bytes FillCost(const std::string& key, const CacheEntry& meta, Bytes body_size) {
    return body_size + meta.response.size() + meta.etag.size() + meta.last_modified.size() +
           meta.content_type.size() + 4 * key.size() + kQueuedFillOverhead;
  }
  void WhenFillSettles(const std::string& key, std::function<void()> fn);
  // A fill reached the store's index (Hooks::fill_committed).
  void FillCommitted(const std::string& key);

  // The queue's writer: applies `batch` after every batch handed over before it.
  void WriteBatch(std::vector<WriteRecord> batch, std::function<void()> done);

  // The flash log's fill applier (LocalFlashLog::SetFillApplier): writes its checked fills to
  // the store, one after another in log order, skipping those dropped or superseded since;
  // `done` gets OK once all are committed (or refused by the store, as a fill it would not
  // cache), else the first write error (the log then keeps them for its next flush).
  void ApplyLoggedFills(std::vector<LocalFlashLog::LoggedFill> fills, std::function<void(Status)> done);
  // The text of a fill's metadata in its commit record (JSON; times as wall-clock microseconds,
  // so a replay by a later process with another clock keeps them), and back.
  std::string EncodeFillMeta(const CacheEntry& meta) const;
  Result<CacheEntry> DecodeFillMeta(const std::string& text) const;

 private:
  // Takes the batches waiting in the backlog that may be written together (the file comment)
  // as one batch, with the `done` of each.
  std::pair<std::vector<WriteRecord>, std::vector<std::function<void()>>> TakeBacklog();
  // A fill left the backlog (in the store, in the flash log, dropped or superseded): its
  // bytes no longer count; waiters run if the backlog is now under its bound.
  void ReleaseFill(Bytes cost);
  void RunBacklogWaiters();
  // Applies a sorted, merged batch: each record by its kind (the table in the file comment).
  void ApplyBatch(std::vector<WriteRecord> batch, std::function<void()> done);
  // A kFill record: commits the queued body of its key to the store; calls `finish` once
  // settled (false if there was nothing to write, and `finish` is not called).
  bool ApplyFill(WriteRecord& r, const std::function<void()>& finish);
  // A kFill record of a batch that would wake the disk: appends its fill to the flash log;
  // `finish` once durable there (or, if the log failed, in the store). False as ApplyFill.
  bool SpillFill(WriteRecord& r, const std::function<void()>& finish);
  // Writes `body` to the store as the fill of `url` and calls `finish` with the outcome.
  void StoreFill(const std::string& url, CacheEntry entry, std::shared_ptr<const std::string> body,
                 std::function<void(Status)> finish);

  // A fill in the flash log (or being appended to it: path empty, body held here till then).
  struct LoggedFillEntry {
    CacheEntry meta;
    QueuedBody body;   // data set only while appending
    std::string path;  // its record path in the log, once durable
  };
  PowerManager& pm_;
  CacheStore& store_;
  Device& disk_;
  Hooks hooks_;
  LocalFlashLog* flash_ = nullptr;
  std::unique_ptr<WriteQueue> queue_;
  // Queued fills: their metadata, and what each counts in the fill backlog.
  struct PendingFill {
    CacheEntry meta;
    Bytes cost = 0;
  };
  std::map<std::string, PendingFill> pending_fills_;
  std::map<std::string, QueuedBody> queued_bodies_;  // queued fills: their bodies
  std::uint64_t next_body_version_ = 1;
  std::map<std::string, int> writing_fills_;         // fills being written, by key
  std::map<std::string, std::vector<std::function<void()>>> fill_waiters_;
  std::deque<std::pair<std::vector<WriteRecord>, std::function<void()>>> write_backlog_;
  bool writing_ = false;
  std::uint64_t batches_written_ = 0;
  std::size_t most_merged_ = 0;
  Bytes fill_backlog_max_ = 0;
  Bytes fill_backlog_bytes_ = 0;
  Bytes fill_backlog_peak_ = 0;
  std::deque<std::function<void()>> backlog_waiters_;
  bool running_waiters_ = false;
  std::map<std::string, LoggedFillEntry> logged_fills_;  // by cache key
  std::set<std::string> skip_logged_;  // record paths of logged fills dropped or superseded
  mutable QueuedBody logged_view_;     // the last logged body QueuedBodyOf read back
  mutable std::string logged_view_path_;
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);  // the log's callbacks check it
};

}  // namespace ghost

#endif  // GHOST_FS_WRITE_BACK_H_
