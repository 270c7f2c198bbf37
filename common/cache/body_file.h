// BodyFile: one open version of a committed body in the cache store, for reading (DESIGN
// §3.5). RAII: the descriptor is closed when the BodyFile is destroyed (or Close is called).
//
// A committed body is never rewritten in place: a replacement is a new file renamed over the
// name. So an open BodyFile reads one version from open to close, even when the object is
// evicted or replaced meanwhile; its version() names that file ("d<inode>-<size>").
//
// CacheManager::OpenBody hands them out (common/cache/cache_manager.h); ghostfs's read path
// reads through fd() with io_uring or pread, and may give it to the kernel (passthrough).
//
// Thread-safety: a value owned by one thread.
#ifndef GHOST_COMMON_CACHE_BODY_FILE_H_
#define GHOST_COMMON_CACHE_BODY_FILE_H_

#include <string>

#include "common/base/file_io.h"
#include "common/base/status.h"
#include "common/base/units.h"

namespace ghost {

class BodyFile {
 public:
  BodyFile() = default;  // not open
  // Opens `path` read-only for sequential reading and reads its size. Fails with the open's
  // errno (Status::ToErrno gives it back; ENOENT: no such body).
  [[nodiscard]] static Result<BodyFile> Open(const std::string& path);
  BodyFile(BodyFile&&) noexcept = default;
  BodyFile& operator=(BodyFile&&) noexcept = default;
  BodyFile(const BodyFile&) = delete;
  BodyFile& operator=(const BodyFile&) = delete;

  bool is_open() const { return fd_.valid(); }
  int fd() const { return fd_.get(); }
  // The size and version from the fstat at open; size_known() is false if that failed (then
  // Stat() asks again).
  bool size_known() const { return size_known_; }
  Bytes size() const { return size_; }
  const std::string& version() const { return version_; }
  // Reads the size and version again; returns 0, or the errno of fstat.
  int Stat();
  void Close() { fd_.reset(); }
  // Another descriptor of the same open file (same version, size and read-ahead advice), or
  // the errno of dup.
  [[nodiscard]] Result<BodyFile> Dup() const;

 private:
  UniqueFd fd_;
  Bytes size_ = 0;
  bool size_known_ = false;
  std::string version_;
};

}  // namespace ghost

#endif  // GHOST_COMMON_CACHE_BODY_FILE_H_
