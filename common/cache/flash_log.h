// FlashLog: the durable log on a flash device in front of a sleeping disk (the NVCache role,
// DESIGN §3.5).
//
// What would otherwise wake the disk — cache fills, writes into local/ files, metadata
// changes — is appended to a log file on flash (DIR/flash.log). An append's callback runs once
// the record is durable (written and fsynced), so an application's fsync can be acknowledged
// while the disk sleeps. The log is flushed to the disk (through a FlushTarget) when the disk
// enters its high-power mode (policy kEachSpinUp) or when the log is full (both policies), with
// one of the NVCache algorithms (flush_plan.h; default 4, sort + merge).
//
// On-disk record (little-endian, no padding), kHeaderSize bytes of header, then path, then data:
//
//   off size  field
//     0    4  magic "GFL1"
//     4    4  CRC32C (Castagnoli) of bytes 8 .. end of record
//     8    8  sequence number (increasing along the log)
//    16    1  kind (LogRecordKind)      17  1  meta op (MetaOp)
//    18    2  path length               20  4  data length
//    24    8  offset (data records: in the target; kTruncate/kMkdir/kChmod/kCreate: the arg)
//    32  ...  path, then data (kRename: the new path)
//
// Crash safety. A record is acknowledged only after write + fsync of the log file, so after a
// crash every acknowledged record is in the log (or, once flushed, on the disk: the log is cut
// only after the target's files are fsynced). Open scans the log: a record whose header or body
// runs past the end of the file, or whose CRC fails with no valid later record, is a torn tail
// and is cut (it was never acknowledged). A bad record followed by valid ones is corruption in
// the middle: its bytes are saved to DIR/corrupt-<offset>.bin (-<offset>.<n>.bin if that name is
// taken: an earlier recovery's copy is never overwritten), reported, and skipped; the later
// records are kept and replayed (a CRC that fails names no trustworthy path, so the region is
// kept for a human, not applied). Recovery replays the log by flushing it (LogFlushReason::kRecovery).
//
// Faults. A failed append (the flash device full, EIO) fails that append's callbacks with the
// error and leaves the log as it was (the partial bytes are truncated away). A record the flush
// cannot apply (the disk fails mid-flush, a target that refuses) is kept in the log, with every
// other record of the same path (replaying them in order stays correct), and reported in the
// FlushReport; it is never dropped. If the target's SyncFlush fails (the disk failed syncing
// the flush's name changes), every record of the flush is kept.
//
// Appends are group-committed: those arriving while a write is in flight go together in the
// next write + fsync. While a flush runs, appends wait and start after it.
//
// Thread-safety: not thread-safe; every call and every callback on the event-loop thread of
// the FileIo.
#ifndef GHOST_COMMON_CACHE_FLASH_LOG_H_
#define GHOST_COMMON_CACHE_FLASH_LOG_H_

#include <array>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/base/file_io.h"
#include "common/base/status.h"
#include "common/base/units.h"
#include "common/cache/flush_plan.h"

namespace ghost {

// CRC32C (Castagnoli, as iSCSI and ext4 use), through ISA-L's crc32_iscsi. Crc32c("123456789")
// is 0xE3069283. `crc` continues a previous value.
std::uint32_t Crc32c(std::string_view data, std::uint32_t crc = 0);

enum class LogFlushPolicy : std::uint8_t {
  kEachSpinUp,  // flush whenever the disk enters its high-power mode, and when full
  kWhenFull,    // flush only when the log is full (the paper's better policy)
};
// "each-spinup" / "when-full".
std::optional<LogFlushPolicy> ParseLogFlushPolicy(std::string_view text);
const char* LogFlushPolicyName(LogFlushPolicy policy);

enum class LogFlushReason : std::uint8_t { kSpinUp = 0, kFull, kRecovery, kExplicit };
inline constexpr std::size_t kLogFlushReasons = 4;
const char* LogFlushReasonName(LogFlushReason reason);

struct FlashLogOptions {
  std::string dir;                 // must exist; the log is dir/flash.log
  Bytes capacity = 16 << 20;       // bytes of log (records' whole size) before it is full
  LogFlushPolicy policy = LogFlushPolicy::kWhenFull;
  FlushAlgorithm algorithm = FlushAlgorithm::kSortMerge;
  Bytes buffer = 256 << 10;        // the DRAM flush buffer; also the largest record
};

// Where a flush puts the records. Implemented by the owner of the disk (ghostfs's local and
// cache stores; tests' in-memory or scratch-directory targets).
class FlushTarget {
 public:
  virtual ~FlushTarget() = default;
  // An fd the flush writes `path`'s bytes of `kind` to through the FileIo, or the error (the
  // records of that path are then kept). Called at most once per path per flush; the fd stays
  // owned by the target until EndFlush.
  virtual Result<int> OpenForFlush(LogRecordKind kind, const std::string& path) = 0;
  // Applies a metadata record, synchronously. Must succeed when the change is already in
  // place (replay after a crash applies records again).
  virtual Status ApplyMeta(MetaOp op, const std::string& path, Bytes arg,
                           const std::string& arg2) = 0;
  // Every fd the flush was given has been fsynced (or failed): makes the rest of the flush
  // durable (e.g. the name changes ApplyMeta made: a syncfs through `io`, the log's FileIo, so
  // its fault injection reaches it). An error keeps every record of the flush in the log (data
  // and metadata: none of it is known to be on the disk). Default: nothing more to sync.
  virtual void SyncFlush(FileIo& io, std::function<void(Status)> done) {
    (void)io;
    done(Status::Ok());
  }
  // What SyncFlush is waiting for, for a progress line (FlashLog::Progress).
  virtual std::string SyncProgress() const { return "waiting"; }
  // The flush is over (after SyncFlush): close the fds it was given.
  virtual void EndFlush() = 0;
};

// A record as the log holds it (without its data).
struct LogRecordInfo {
  std::uint64_t seq = 0;
  LogRecordKind kind = LogRecordKind::kLocalWrite;
  MetaOp op = MetaOp::kNone;
  std::string path;
  Bytes offset = 0;  // or the meta arg
  Bytes length = 0;  // data bytes (kRename: the new path's length)
  Bytes log_offset = 0;
  Bytes log_length = 0;
};

struct CorruptRegion {
  Bytes offset = 0;
  Bytes length = 0;
  std::string saved_as;  // where its bytes were copied, or empty if that failed
};

struct RecoveryReport {
  std::size_t records = 0;  // valid records found
  Bytes torn_tail_cut = 0;  // bytes cut from the end
  std::vector<CorruptRegion> corrupt;
};

struct FlushReport {
  LogFlushReason reason = LogFlushReason::kExplicit;
  FlushAlgorithm algorithm = FlushAlgorithm::kSortMerge;
  std::size_t records_applied = 0;
  std::size_t records_kept = 0;  // could not be applied: still in the log
  std::size_t steps = 0;
  std::size_t writes = 0;
  Bytes bytes_read = 0;  // from the log
  Bytes bytes_written = 0;
  Bytes bytes_merged_away = 0;
  std::vector<std::string> errors;  // one per failed op, what failed on what
  Status status;                    // not OK if the log itself could not be cut
};

struct FlashLogStats {
  Bytes used = 0;
  Bytes capacity = 0;
  std::size_t records = 0;
  std::uint64_t appends = 0;
  std::uint64_t append_failures = 0;
  std::array<std::uint64_t, kLogFlushReasons> flushes{};  // by LogFlushReason
  Bytes bytes_merged_away = 0;
  std::uint64_t records_kept = 0;  // over all flushes
  std::uint64_t corrupt_regions = 0;
};

class FlashLog {
 public:
  using AppendDone = std::function<void(Result<std::uint64_t>)>;  // the sequence number
  using FlushDone = std::function<void(const FlushReport&)>;

  static constexpr Bytes kHeaderSize = 32;

  // Opens (creating) dir/flash.log and recovers it (see the file comment); fills `report`.
  // `io` and `target` are borrowed and must outlive the log. Fails if the directory is
  // missing, read-only (kReadOnly) or the log unreadable; nothing is changed then.
  static Result<std::unique_ptr<FlashLog>> Open(const FlashLogOptions& options, FileIo& io,
                                                FlushTarget& target, RecoveryReport* report);
  ~FlashLog();
  FlashLog(const FlashLog&) = delete;
  FlashLog& operator=(const FlashLog&) = delete;

  // Appends `data` for `path` at `offset`, in records of at most `buffer` bytes each; `done`
  // runs once all are durable (with the last one's sequence number) or with the first error.
  // If the log cannot hold them, a kFull flush runs first. An empty `data` is a no-op (done
  // with the current sequence number). `data` is copied before this returns (the caller may
  // keep its bytes, e.g. to write them to the disk itself if the append fails).
  void AppendWrite(LogRecordKind kind, std::string path, Bytes offset, std::string_view data,
                   AppendDone done);
  // Appends a metadata change.
  void AppendMeta(MetaOp op, std::string path, Bytes arg, std::string arg2, AppendDone done);
  // Appends a spilled fill as one group: `body` as kFill data records of `path` (from offset
  // 0, in pieces as AppendWrite), then its commit record (kMeta, MetaOp::kFill, arg = the
  // body's size, `commit_arg2`). A group is written in one write + fsync and never split by a
  // flush, so a flush sees the commit with all its data or none of it; after a crash a torn
  // tail can only cut the commit with (some of) the data, which a flush then drops (a fill
  // without its commit). Fails at once if the group is larger than the log.
  void AppendFill(std::string path, std::string_view body, std::string commit_arg2, AppendDone done);

  // Flushes every record now in the log; `done` runs when the flush is over. A flush asked for
  // while one runs runs after it.
  void Flush(LogFlushReason reason, FlushDone done);
  // The disk entered its high-power mode: flushes if the policy is kEachSpinUp and the log
  // holds records.
  void OnDiskSpinUp();

  // Overlays the logged bytes of `path` (records of `kind`) on `buf`, which holds the
  // target's bytes from `offset`; returns the ranges [start, end) of the file it replaced, in
  // log order. Reads the log (synchronously, with pread).
  Result<std::vector<std::pair<Bytes, Bytes>>> ReadOverlay(LogRecordKind kind,
                                                           const std::string& path,
                                                           Bytes offset, std::span<char> buf);
  // The end of the data the log holds for `path` (0 if none): a file's size is at least this.
  // For data kinds, a kTruncate record of the same path (MetaOp, kind kMeta) cuts the records
  // before it, in ReadOverlay and here, as replaying the log in order would.
  Bytes LoggedEnd(LogRecordKind kind, const std::string& path) const;
  // When the log holds a truncate of `path`: the size the file has once the log is replayed
  // (the last truncate's size, extended by the data records after it), whatever the target
  // holds meanwhile (a flush may be rewriting older bytes into it). nullopt without a truncate.
  std::optional<Bytes> LoggedSize(LogRecordKind kind, const std::string& path) const;
  // Whether the log (durable, being written, or waiting) holds a record of `kind` for `path`.
  bool Holds(LogRecordKind kind, const std::string& path) const;
  // Holds, or a kTruncate record (kind kMeta) of `path`: whether replaying the log changes the
  // data file `path` at all. A truncate alone counts: its replay sets the size again, so a
  // later change of the size made outside the log would be undone by it.
  bool Changes(LogRecordKind kind, const std::string& path) const;
  // Whether anything is in the log or on its way into it.
  bool empty() const { return records_.empty() && pending_.empty() && !writing_; }

  // Runs after every flush (whatever asked for it, kFull ones included), before the flush's own
  // `done`: e.g. to charge the disk for the flush's writes. The observer may destroy the log.
  void SetFlushObserver(FlushDone observer) { observer_ = std::move(observer); }

  // Runs after every append batch made durable, with its bytes (headers included): what the
  // log's device wrote (ghostfs charges its flash device for it). A flush's reads of the log
  // are FlushReport::bytes_read.
  void SetAppendObserver(std::function<void(Bytes)> observer) { append_observer_ = std::move(observer); }

  const FlashLogStats& stats() const { return stats_; }
  const std::vector<LogRecordInfo>& records() const { return records_; }
  bool flushing() const { return flushing_; }
  // What the log is doing now, for a line in the daemon's log when something takes long (e.g.
  // "flushing (explicit): step 2 of 3, 1 write in flight" or "syncing: 2 fsyncs in flight").
  std::string Progress() const;
  const FlashLogOptions& options() const { return options_; }
  std::string log_path() const;
  // The descriptor of the log file (it changes when a flush that kept records rewrites it).
  int log_fd() const { return fd_.get(); }

 private:
  struct Pending;

  FlashLog(const FlashLogOptions& options, FileIo& io, FlushTarget& target, UniqueFd fd);
  Status Recover(RecoveryReport* report);
  // Holds (`truncates` false) and Changes.
  bool HoldsOf(LogRecordKind kind, const std::string& path, bool truncates) const;
  void Enqueue(std::string encoded, LogRecordInfo info, AppendDone done);
  void Pump();
  void StartFlush(LogFlushReason reason);
  class Flusher;
  void FinishFlush(FlushReport report, const std::vector<bool>& kept);
  Status RewriteLog(const std::vector<bool>& kept);

  FlashLogOptions options_;
  FileIo& io_;
  FlushTarget& target_;
  UniqueFd fd_;
  Bytes tail_ = 0;  // end of the last durable record
  std::uint64_t next_seq_ = 1;
  std::vector<LogRecordInfo> records_;  // durable records, in log order
  std::deque<std::unique_ptr<Pending>> pending_;  // appends not yet written
  bool writing_ = false;  // an append batch is in write + fsync
  std::shared_ptr<std::vector<std::unique_ptr<Pending>>> inflight_;  // that batch
  bool full_flush_done_ = false;  // the last thing done was a kFull flush
  bool flushing_ = false;
  std::deque<std::pair<LogFlushReason, FlushDone>> flush_requests_;
  std::unique_ptr<Flusher> flusher_;
  FlushDone observer_;
  FlashLogStats stats_;
  std::function<void(Bytes)> append_observer_;
  std::shared_ptr<bool> alive_;  // callbacks check it: the log may be destroyed first
};

}  // namespace ghost

#endif  // GHOST_COMMON_CACHE_FLASH_LOG_H_
