// PidLock: an advisory lock on a file that names the process holding it, so that one resource
// (ghostfs's cache directory: CACHE/lock) has one owner at a time and a second one can say who
// the first is.
//
// The lock is flock(2) on the file, so it belongs to the open file description: it survives a
// fork (a daemonising process hands it to its child, which should then RecordPid) and is
// released by the kernel when the last process holding it exits, even by SIGKILL: a lock file
// left behind by a crash is never stale. The pid written in the file is only for messages.
//
// Thread-safety: a PidLock is a plain value for one thread at a time.
#ifndef GHOST_COMMON_BASE_PID_LOCK_H_
#define GHOST_COMMON_BASE_PID_LOCK_H_

#include <sys/types.h>

#include <optional>
#include <string>

#include "common/base/status.h"

namespace ghost {

class PidLock {
 public:
  // Takes the lock on `path` (created mode 0644 if missing) without waiting, and writes this
  // process's pid in it. Fails with kExists, "PATH is held by pid N" (or "by another process"
  // when the file names none), if another open file description holds it; with an errno
  // status if the file cannot be created or locked.
  static Result<PidLock> Acquire(const std::string& path);

  PidLock(PidLock&& other) noexcept;
  PidLock& operator=(PidLock&& other) noexcept;
  PidLock(const PidLock&) = delete;
  PidLock& operator=(const PidLock&) = delete;
  ~PidLock();  // releases the lock (for every process sharing it) and closes the file

  // Writes this process's pid in the file: call after fork in the process that keeps the lock.
  Status RecordPid();

  // The pid written in `path`, if it holds one (the holder's, while the lock is held).
  static std::optional<pid_t> ReadPid(const std::string& path);

  const std::string& path() const { return path_; }

 private:
  PidLock(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}
  std::string path_;
  int fd_ = -1;
};

}  // namespace ghost

#endif  // GHOST_COMMON_BASE_PID_LOCK_H_
