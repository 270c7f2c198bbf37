#include "common/cache/body_file.h"

#include <fcntl.h>
#include <sys/stat.h>

#include <cerrno>

namespace ghost {

Result<BodyFile> BodyFile::Open(const std::string& path) {
  BodyFile f;
  f.fd_.reset(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!f.fd_.valid()) return Status::FromErrno(errno, "open " + path);
  // Whole-object reads are the rule: let the kernel read ahead twice as far on the body.
  posix_fadvise(f.fd_.get(), 0, 0, POSIX_FADV_SEQUENTIAL);
  (void)f.Stat();
  return f;
}

Result<BodyFile> BodyFile::Dup() const {
  BodyFile f;
  f.fd_.reset(fcntl(fd_.get(), F_DUPFD_CLOEXEC, 0));
  if (!f.fd_.valid()) return Status::FromErrno(errno, "dup of a cached body");
  f.size_ = size_;
  f.size_known_ = size_known_;
  f.version_ = version_;
  return f;
}

int BodyFile::Stat() {
  struct stat st;
  if (fstat(fd_.get(), &st) != 0) return errno;
  size_ = static_cast<Bytes>(st.st_size);
  size_known_ = true;
  version_ = "d" + std::to_string(st.st_ino) + "-" + std::to_string(st.st_size);
  return 0;
}

}  // namespace ghost
