// LocalFlashLog: the flash log (common/cache/flash_log.h, DESIGN §3.5) in front of the disk
// for ghostfs's local/ tree: `ghostfs --flash-log DIR[:SIZE]`.
//
// Where it sits. The write queue (common/cache/write_queue.h) still gathers local/ writes in
// RAM; its writer (fs/write_back.h) asks TakesWrites() for every batch and, when the answer is
// yes, hands the batch's local/ records to the log instead of the disk. So an fsync in local/
// (which flushes the queue) returns once the records are durable in the log, and the sleeping
// disk is not woken. The log is flushed to the disk when the disk enters its high-power mode
// (policy each-spinup) or when it is full (both policies); each flush is charged to the
// emulated disk as one write of the bytes it wrote.
//
//   write(2) ──▶ WriteQueue (RAM) ──flush (fsync, cap, spin-up)──▶ WriteBack
//                                    ├─ TakesWrites() ──▶ FlashLog (flash) ──flush──▶ disk
//                                    └─ otherwise ──────────────────────────────────▶ disk
//
// TakesWrites() is yes while the disk is not in (or is leaving) its high-power mode under a
// policy that defers background writes, and also while the log holds anything (or flushes):
// a write that went straight to the disk then could be overwritten by an older logged record
// when the log is flushed later.
//
// Records name a file by its file handle (name_to_handle_at: "fh:TYPE:HEX"), not its name:
// local/ applies names (create, rename, unlink) to the backing tree at once, and a handle
// stays with its file across rename, unlink-while-open and remounts (ext4, tmpfs, xfs, btrfs
// have stable handles). A handle whose file is gone (ESTALE: deleted before the flush) is
// flushed into an unnamed O_TMPFILE, i.e. dropped like the writes to any deleted file. A
// truncate of a file with logged records is logged too (MetaOp::kTruncate on its handle), so
// replaying the log in order never revives bytes the truncate cut.
//
// Reads of a local/ file overlay its logged bytes on the disk's (Overlay, LoggedEnd), then the
// write queue's. At mount the log is recovered (torn tail cut) and replayed (flushed, reason
// recovery); reads see its records until then.
//
// Test-only fault switch: with GHOST_TEST_DISK_FAULT=PATH in the environment, every write and
// fsync the log makes to the disk (a flush's writes into local/ files, a write-through) fails
// with EIO while the file PATH exists; the log's own file is untouched. It drives the "disk
// fails mid-flush" integration test (ghostfs_flash_faults) through the same FaultyFileIo the
// unit tests use; nothing else reads it and it is not a user option.
//
// Thread-safety: not thread-safe; the daemon's event-loop thread.
#ifndef GHOST_FS_FLASH_LOCAL_H_
#define GHOST_FS_FLASH_LOCAL_H_

#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/base/file_io.h"
#include "common/base/status.h"
#include "common/cache/flash_log.h"
#include "common/power/device.h"
#include "common/power/power_manager.h"

namespace ghost {

// The environment variable of the test-only disk fault switch (the file comment).
inline constexpr char kDiskFaultEnv[] = "GHOST_TEST_DISK_FAULT";

// --flash-log DIR[:SIZE]: the directory and the log's capacity (default 16M; SIZE with K, M,
// G suffixes). A ':' is read as the size separator only when what follows parses as a size.
struct FlashLogSpec {
  std::string dir;
  Bytes capacity = 16 << 20;
};
[[nodiscard]] Result<FlashLogSpec> ParseFlashLogSpec(const std::string& text);

class LocalFlashLog {
 public:
  // Opens and recovers the log in options.dir (created if missing) for the local/ tree stored
  // in `local_dir`; subscribes to `disk_id` entering its high-power mode. Borrows `io`, `pm`
  // and `disk` (the emulated disk of `disk_id`): they must outlive this. Fails with a message
  // naming the directory (missing and not creatable, read-only, unreadable log) or when the
  // local/ file system has no file handles.
  static Result<std::unique_ptr<LocalFlashLog>> Open(const FlashLogOptions& options, FileIo& io,
                                                     const std::string& local_dir,
                                                     PowerManager& pm, DeviceId disk_id,
                                                     Device& disk, RecoveryReport* report);
  ~LocalFlashLog();
  LocalFlashLog(const LocalFlashLog&) = delete;
  LocalFlashLog& operator=(const LocalFlashLog&) = delete;

  // Whether local/ writes go to the log now (see the file comment). The one owner of that
  // decision; WriteBack asks it per batch.
  bool TakesWrites() const;

  // Appends bytes written at `offset` of the file open as `fd` (a writable descriptor of it);
  // `done` runs once they are durable in the log, or — when the append fails (the flash device
  // full or failing, the log full and its flush refused by the disk) — once they are written
  // through to the disk instead (WriteThrough: a warning, the disk spins up). `done` gets an
  // error only when neither worked; the bytes are then not durable and the caller must report
  // it (the writer's next fsync or close). `fd` must stay open until `done` runs.
  void AppendWrite(int fd, Bytes offset, std::string data, std::function<void(Status)> done);
  // Logs a truncate of the file `fd` to `size` (call after truncating the backing file, when
  // Holds(fd)). If the log cannot take it, the log is flushed and the truncate applied to the
  // disk again after it (the flushed older records must not revive the cut bytes); `done` gets
  // an error only if the disk refused the file's records, which then stay in the log.
  void AppendTruncate(int fd, Bytes size, std::function<void(Status)> done);

  // Whether the log holds records of the file `fd`.
  bool Holds(int fd) const;
  // The end of the file's logged bytes (0 if none).
  Bytes LoggedEnd(int fd) const;
  // The file's size as the log has it: with a truncate logged, that size (the disk's size does
  // not count: a flush may be rewriting older bytes into it); else the larger of `disk_size`
  // and LoggedEnd.
  Bytes SizeOver(int fd, Bytes disk_size) const;
  // `buf` holds the disk's bytes of file `fd` from `offset` (maybe short of `size`): extends it
  // to cover the logged bytes up to `size` and overlays them; cuts it at a logged truncate's
  // size (SizeOver).
  Status Overlay(int fd, Bytes offset, std::size_t size, std::string* buf);

  // Replays what recovery found: flushes the log (reason recovery) if it holds records.
  void Replay();

  // "flash_log" of `ghostctl stats`: fill, records, flushes by reason, bytes merged away, the
  // fault counters and the last flush's errors (what the disk refused, kept in the log).
  nlohmann::json StatsJson() const;
  // Called after every flush (after the disk was charged for it).
  void SetFlushListener(std::function<void(const FlushReport&)> fn) { listener_ = std::move(fn); }

  FlashLog& log() { return *log_; }

 private:
  class Target;
  LocalFlashLog(FileIo& io, PowerManager& pm, DeviceId disk_id, Device& disk);
  // The append of `data` (at `offset` of `fd`, record path `path`) failed with `cause`: writes
  // it to the disk. If the log holds older records of the file, it is flushed first (they would
  // overwrite these bytes when flushed later); if it still holds them then (the disk refused
  // them), `done` gets an error naming both failures.
  void WriteThrough(int fd, std::string path, Bytes offset, std::shared_ptr<const std::string> data,
                    Status cause, std::function<void(Status)> done);
  // The record path of the file `fd`: "fh:TYPE:HEX" of its file handle.
  Result<std::string> PathOf(int fd) const;
  void OnFlushed(const FlushReport& report);

  // GHOST_TEST_DISK_FAULT only: wraps the daemon's FileIo (io_ is then this). Declared first so
  // that it is destroyed last.
  std::unique_ptr<FaultyFileIo> faulty_;
  FileIo& io_;
  PowerManager& pm_;
  DeviceId disk_id_;
  Device& disk_;
  std::unique_ptr<Target> target_;
  std::unique_ptr<FlashLog> log_;
  SubscriptionId spin_up_ = 0;
  std::function<void(const FlushReport&)> listener_;
  std::uint64_t write_throughs_ = 0;         // appends that failed and went to the disk
  std::uint64_t write_through_failures_ = 0;  // ... and failed there too (reported to the writer)
  std::vector<std::string> last_flush_errors_;  // the last flush's (empty when it applied all)
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);  // the disk's callbacks check it
};

}  // namespace ghost

#endif  // GHOST_FS_FLASH_LOCAL_H_
