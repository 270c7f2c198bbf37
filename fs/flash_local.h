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
// Metadata (create, mkdir, rename, unlink, rmdir, chmod) while the log takes writes: LocalTree
// makes the change in the backing tree at once (so lookup, getattr and readdir show it, and
// nothing else of the tree changes), then logs it (AppendMeta) and replies once the record is
// durable. The backing tree's change sits in the page cache: the disk is not written until the
// log's flush, which fsyncs the directories (and files) the changes touched before it cuts the
// log (a syncfs only when such a directory was renamed away since; Target::SyncFlush) and charges
// the emulated disk kMetaRecordBytes per metadata record. A local/ metadata record:
//
//   kind kMeta, op = the MetaOp, path = the entry relative to the local/ root ("dir/name"),
//   offset (arg) = the mode (kCreate, kMkdir, kChmod), else 0,
//   arg2 = "SERIAL\nHANDLE\nNEWPATH" (LocalMetaArgs): SERIAL a per-tree counter of logged
//   metadata changes, HANDLE the "fh:..." of the created/chmodded file (else empty), NEWPATH
//   the rename's target (else empty).
//
// Replay is idempotent by the serial: every logged change also stores its SERIAL in the xattr
// kMetaSerialXattr of the backing local/ root, right after the change (the same journal
// transaction on ext4), so after a crash the backing tree says which changes it holds. A flush
// or recovery applies only records with a larger serial (what a power cut took from the
// backing tree; after a SIGKILL none: the page cache kept them), in log order, each tolerant of
// having been applied already (the one change the marker may lag behind); a recreated file's
// old handle is mapped to the new file, so its logged bytes land there. A record that cannot
// be applied (e.g. rmdir of a directory that is not empty) is kept and reported, as a data
// record the disk refuses; the marker never passes it (MetaSerialMarker: serials applied past
// it are stored as ranges above the gap), so every later flush and replay retries it until it
// applies. The flush's syncs go through the FileIo (FlushTarget::SyncFlush); if one fails,
// every record of the flush (data and metadata) stays in the log. RENAME_EXCHANGE, link, symlink, mknod, chown and utimens are not
// logged: they go to the backing tree only (durable at its next sync). While a recovery replay
// runs, metadata is not logged either (TakesMeta): the serials must stay ordered.
//
// Reads of a local/ file overlay its logged bytes on the disk's (Overlay, LoggedEnd), then the
// write queue's. At mount the log is recovered (torn tail cut) and replayed (flushed, reason
// recovery); reads see its records until then.
//
// Fills (DESIGN §3.5 *Fills*). A batch of the write queue that would wake the sleeping disk
// (its cap passed, an fsync, a flush) spills its cache fills here instead (WriteBack asks
// TakesFills). A fill is one append group (FlashLog::AppendFill): its body as kFill data records
// of the path "fill:N:KEY" (N a per-log serial, so two fills of a key never merge), then its
// commit record (MetaOp::kFill: the body's size, CRC32C and cache metadata). Acknowledged once
// durable. A flush writes the body into an anonymous memory file (memfd: nothing on the disk),
// checks it against the commit record and hands it to the fill applier (WriteBack: the store's
// BeginFill, AppendFill, CommitFill, i.e. a normal fill with its crash safety) before the log is
// cut; a body without its commit or with another CRC (a torn tail, a corrupt region) is dropped,
// never applied torn. Reads see the body in the log (ReadFill) until it is in the store; after a
// restart too: WriteBack indexes the fills the log held at open (RecoveredFills) before the replay.
// The log's appends, its flushes' reads and Overlay's reads are charged to its device
// (SetFlashDevice).
//
// Test-only fault switch: with GHOST_TEST_DISK_FAULT=PATH in the environment, every write,
// fsync and syncfs the log makes to the disk (a flush's writes into local/ files and its syncs
// of local/, a write-through) fails
// with EIO while the file PATH exists; the log's own file is untouched. It drives the "disk
// fails mid-flush" integration test (ghostfs_flash_faults) through the same FaultyFileIo the
// unit tests use; nothing else reads it and it is not a user option.
//
// Thread-safety: not thread-safe; the daemon's event-loop thread.
#ifndef GHOST_FS_FLASH_LOCAL_H_
#define GHOST_FS_FLASH_LOCAL_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "common/base/file_io.h"
#include "common/base/pid_lock.h"
#include "common/base/status.h"
#include "common/cache/flash_log.h"
#include "common/power/device.h"
#include "common/power/power_manager.h"

namespace ghost {

// The environment variable of the test-only disk fault switch (the file comment).
inline constexpr char kDiskFaultEnv[] = "GHOST_TEST_DISK_FAULT";

// The xattr of the backing local/ root holding the serial of the last logged metadata change
// applied to it (the file comment).
inline constexpr char kMetaSerialXattr[] = "trusted.ghost.flash_meta_serial";
// The xattr of the cache directory (the parent of local/) naming, while a flash log holds (or
// held) records of local/, that log's directory (resolved). Set when the log first takes or
// recovers a local/ record (not for spilled fills: the origin has those); removed when the
// daemon ends with the log empty (every record on the disk). Left after a crash, it makes a mount
// without that log refuse (CheckLeftFlashLog): the log may hold fsync'd bytes the disk lacks,
// and replaying it after the disk's files changed without it would put older bytes over newer.
inline constexpr char kFlashLogDirXattr[] = "trusted.ghost.flash_log_dir";
// At a mount of the cache `cache_dir` with the flash log `flash_dir` (empty: none): an error
// naming the log and what to do when the cache was last used with another log that still holds
// records. A recorded log whose flash.log is gone or empty holds nothing: its mark is removed
// (a note on stderr when it is gone) and the mount goes on.
[[nodiscard]] Status CheckLeftFlashLog(const std::string& cache_dir, const std::string& flash_dir);

// What one metadata change costs the disk when the log's flush makes it durable: a directory
// block or an inode (one 4 KiB block).
inline constexpr Bytes kMetaRecordBytes = 4096;

// arg2 of a local/ metadata record (the file comment).
struct LocalMetaArgs {
  std::uint64_t serial = 0;
  std::string handle;    // "fh:TYPE:HEX" or empty
  std::string new_path;  // kRename's target or empty
  bool operator==(const LocalMetaArgs&) const = default;
};
std::string EncodeLocalMetaArgs(const LocalMetaArgs& args);
[[nodiscard]] Result<LocalMetaArgs> DecodeLocalMetaArgs(const std::string& text);

// The value of kMetaSerialXattr: which logged metadata changes the backing tree holds. Every
// serial up to `through`, and the ranges in `above` (applied past a gap). A gap is a record a
// recovery replay could not apply (kept in the log): the marker never passes it, so every later
// flush tries it again until it applies. Live changes go in at once (the tree has them), past
// any gap. Stored as "THROUGH" or "THROUGH A-B C ..." (ranges, or single serials, past a gap);
// a marker written before the gaps existed ("N") reads as through = N.
struct MetaSerialMarker {
  std::uint64_t through = 0;
  std::map<std::uint64_t, std::uint64_t> above;  // first -> last, disjoint, first > through + 1
  // Whether the backing tree holds `serial`.
  bool Holds(std::uint64_t serial) const;
  // The backing tree holds `serial` (every serial in [first, last]) now: adds it, merging
  // ranges (and into `through`).
  void Add(std::uint64_t serial) { Add(serial, serial); }
  void Add(std::uint64_t first, std::uint64_t last);
  // The highest serial the backing tree holds.
  std::uint64_t Highest() const { return above.empty() ? through : above.rbegin()->second; }
  std::string Encode() const;
  bool operator==(const MetaSerialMarker&) const = default;
};
// nullopt for a value that is not a marker.
std::optional<MetaSerialMarker> ParseMetaSerialMarker(const std::string& text);

// The record path of a spilled fill, "fill:N:KEY" -> (N, KEY); nullopt for other paths.
std::optional<std::pair<std::uint64_t, std::string>> ParseFillPath(const std::string& path);

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
  // and `disk` (the emulated disk of `disk_id`): they must outlive this. Holds options.dir/lock
  // (PidLock) while it lives. Fails with a message naming the directory (missing and not
  // creatable, read-only, unreadable log, in use by another daemon), when the cache was left
  // with another log that holds records (CheckLeftFlashLog) or when the local/ file system has
  // no file handles.
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
  // Changes(fd)). If the log cannot take it, the log is flushed and the truncate applied to the
  // disk again after it (the flushed older records must not revive the cut bytes); `done` gets
  // an error only if the disk refused the file's records, which then stay in the log.
  void AppendTruncate(int fd, Bytes size, std::function<void(Status)> done);

  // Whether local/ metadata changes are logged now: TakesWrites(), and no recovery replay runs.
  bool TakesMeta() const;
  // Logs the metadata change `op` just made to the backing tree: `path` (and kRename's
  // `new_path`) relative to the local/ root, `fd` a descriptor of the created or chmodded file
  // (else -1), `mode` for kCreate, kMkdir, kChmod. Stores the change's serial in the backing
  // root's kMetaSerialXattr first. `done` runs once the record is durable; with an error when
  // the log could not take it (the change is then only in the backing tree: it is synced to
  // the disk at once, which spins up; the error says whether that worked).
  void AppendMeta(MetaOp op, const std::string& path, int fd, Bytes mode, const std::string& new_path,
                  std::function<void(Status)> done);
  // The path of `name` in the directory `dir_fd` relative to the local/ root (with an empty
  // `name`: of `dir_fd`'s own file, "." for the root), or an error if it is not under the root
  // (deleted).
  Result<std::string> RelPath(int dir_fd, const std::string& name) const;
  // The serial stored in the backing root (0 if none).
  std::uint64_t applied_meta_serial() const;

  // Whether the log holds bytes of the file `fd` (data records).
  bool Holds(int fd) const;
  // Whether replaying the log changes the file `fd`: it holds its bytes or a truncate of it. A
  // size change made to the backing file of such a file must be logged too (AppendTruncate):
  // else the log's flush, replaying an older truncate, undoes it. A truncate alone is what a
  // truncate logged while a flush ran leaves once that flush took the file's bytes.
  bool Changes(int fd) const;
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

  // Whether cache fills go to the log now: the disk is asleep (not in, nor heading to, its
  // high-power mode) under a policy that defers background writes.
  bool TakesFills() const;
  // A fill read back from the log by a flush, checked against its commit record.
  struct LoggedFill {
    std::string path;  // "fill:N:KEY"
    std::string key;
    std::string meta;  // the commit record's metadata text (the caller's, opaque here)
    std::string body;
    Bytes size = 0;  // RecoveredFills: the committed size (the body is left in the log)
  };
  // The whole fills the log held when it was opened (a former run spilled them), in log order:
  // path, key, metadata and size, each body checked against its commit record (size, CRC32C)
  // and left in the log (ReadFill reads it). Readers see them there until the replay's flush
  // applies them to the store.
  std::vector<LoggedFill> RecoveredFills();
  // Applies the checked fills of a flush (in log order) and calls `done`: OK once they are
  // durable in the store (the log then forgets them), an error to keep every record of the
  // flush in the log (applied again by the next flush: a fill must be idempotent).
  using FillApplier = std::function<void(std::vector<LoggedFill>, std::function<void(Status)>)>;
  void SetFillApplier(FillApplier applier);
  // Appends the fill of `key` (`meta`: the caller's text for its metadata); `done` gets the
  // record path ("fill:N:KEY") once durable, or the error (the caller writes it to the disk).
  void AppendFill(const std::string& key, std::shared_ptr<const std::string> body, std::string meta,
                  std::function<void(Result<std::string>)> done);
  // Reads `buf.size()` bytes of the logged fill `path` from `offset` (from the flash log).
  Status ReadFill(const std::string& path, Bytes offset, std::span<char> buf);

  // The flash log's own device (Machine::flash(), ghostfs --flash-device with --profile), or
  // null: the log's appends (records with their headers), a flush's reads of the log and the
  // reads of local/ bytes served from the log (Overlay) are its I/O, submitted to it so its
  // energy and mode follow them and the disk is not charged for them. Reads of spilled fills
  // are charged by their readers (the mount, the store), which hold the body. The counts in
  // StatsJson ("device_bytes_written", "device_bytes_read") are kept with or without one.
  void SetFlashDevice(Device* flash) { flash_ = flash; }

  // Writes this process's pid into the log directory's lock: call after a fork in the process
  // that keeps it (as the cache directory's lock), so a refused second daemon names the live one.
  void RecordLockPid() {
    if (dir_lock_) (void)dir_lock_->RecordPid();
  }

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
  // Sets kFlashLogDirXattr on the cache directory (once per run).
  void MarkCache();
  // `bytes` of I/O on the log's device: counted, and submitted to it if there is one.
  void ChargeFlash(Bytes bytes, bool write);

  // GHOST_TEST_DISK_FAULT only: wraps the daemon's FileIo (io_ is then this). Declared first so
  // that it is destroyed last.
  std::unique_ptr<FaultyFileIo> faulty_;
  FileIo& io_;
  PowerManager& pm_;
  DeviceId disk_id_;
  Device& disk_;
  Device* flash_ = nullptr;                   // SetFlashDevice
  Bytes flash_bytes_written_ = 0;             // appends to the log, headers included
  Bytes flash_bytes_read_ = 0;                // flushes' and Overlay's reads of the log
  std::unique_ptr<Target> target_;
  std::unique_ptr<FlashLog> log_;
  SubscriptionId spin_up_ = 0;
  std::function<void(const FlushReport&)> listener_;
  std::string root_path_;                     // the local/ backing directory, resolved
  std::string cache_dir_;                     // its parent: holds kFlashLogDirXattr
  std::optional<PidLock> dir_lock_;           // DIR/lock: one daemon per log (Open)
  bool cache_marked_ = false;                 // MarkCache ran
  std::uint64_t meta_serial_ = 0;             // the last serial given to a logged change
  std::uint64_t fill_serial_ = 0;             // the last N of a "fill:N:KEY" path
  std::uint64_t fills_logged_ = 0;            // fills spilled to the log
  bool replaying_ = false;                    // Replay's flush runs
  std::uint64_t meta_logged_ = 0;             // metadata changes logged
  std::uint64_t meta_failures_ = 0;           // ... that the log could not take
  std::uint64_t write_throughs_ = 0;         // appends that failed and went to the disk
  std::uint64_t write_through_failures_ = 0;  // ... and failed there too (reported to the writer)
  std::vector<std::string> last_flush_errors_;  // the last flush's (empty when it applied all)
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);  // the disk's callbacks check it
};

}  // namespace ghost

#endif  // GHOST_FS_FLASH_LOCAL_H_
