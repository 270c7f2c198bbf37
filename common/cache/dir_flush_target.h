// DirFlushTarget: a FlushTarget (flash_log.h) that applies flash-log records to the files of a
// directory tree on the disk — the local/ tree's backing directory in ghostfs (DESIGN §3.5).
//
// Record paths are relative to the root ("notes/today.txt"); a path that is absolute or climbs
// out of the root ("..") is refused (the record is kept and reported by the flush). Data records
// are written into the file (created 0644 if missing, parents created). Metadata records are
// idempotent, because recovery replays records that may already be applied: unlink and rmdir of
// a missing path succeed, rename succeeds when the source is gone and the target exists, mkdir
// of an existing directory succeeds, truncate and chmod are idempotent by nature.
//
// Thread-safety: not thread-safe; used from the FlashLog's thread.
#ifndef GHOST_COMMON_CACHE_DIR_FLUSH_TARGET_H_
#define GHOST_COMMON_CACHE_DIR_FLUSH_TARGET_H_

#include <map>
#include <string>

#include "common/base/file_io.h"
#include "common/cache/flash_log.h"

namespace ghost {

class DirFlushTarget final : public FlushTarget {
 public:
  // `root` must exist. `open_flags` are added to O_RDWR|O_CREAT (e.g. O_DSYNC).
  explicit DirFlushTarget(std::string root, int open_flags = 0);
  ~DirFlushTarget() override = default;

  Result<int> OpenForFlush(LogRecordKind kind, const std::string& path) override;
  Status ApplyMeta(MetaOp op, const std::string& path, Bytes arg,
                   const std::string& arg2) override;
  void EndFlush() override;

  // The file a record path stands for, or InvalidArgument if it leaves the root.
  Result<std::string> Resolve(const std::string& path) const;

 private:
  std::string root_;
  int open_flags_;
  std::map<std::string, UniqueFd> fds_;  // open for this flush
};

}  // namespace ghost

#endif  // GHOST_COMMON_CACHE_DIR_FLUSH_TARGET_H_
