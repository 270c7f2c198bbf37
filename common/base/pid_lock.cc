#include "common/base/pid_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <utility>

namespace ghost {

Result<PidLock> PidLock::Acquire(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return Status::FromErrno(errno, "cannot open lock file " + path);
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    int err = errno;
    ::close(fd);
    if (err != EWOULDBLOCK) return Status::FromErrno(err, "cannot lock " + path);
    std::optional<pid_t> holder = ReadPid(path);
    return Status::Exists(path + " is held by " +
                          (holder ? "pid " + std::to_string(*holder) : "another process"));
  }
  PidLock lock(path, fd);
  if (Status s = lock.RecordPid(); !s.ok()) return s;
  return lock;
}

PidLock::PidLock(PidLock&& other) noexcept
    : path_(std::move(other.path_)), fd_(std::exchange(other.fd_, -1)) {}

PidLock& PidLock::operator=(PidLock&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    path_ = std::move(other.path_);
    fd_ = std::exchange(other.fd_, -1);
  }
  return *this;
}

PidLock::~PidLock() {
  if (fd_ >= 0) ::close(fd_);  // the last close of the description releases the flock
}

Status PidLock::RecordPid() {
  const std::string text = std::to_string(::getpid()) + "\n";
  if (::ftruncate(fd_, 0) != 0) return Status::FromErrno(errno, "cannot write " + path_);
  if (::pwrite(fd_, text.data(), text.size(), 0) != static_cast<ssize_t>(text.size())) {
    return Status::FromErrno(errno, "cannot write " + path_);
  }
  return Status::Ok();
}

std::optional<pid_t> PidLock::ReadPid(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  char buf[32];
  ssize_t n = ::pread(fd, buf, sizeof(buf), 0);
  ::close(fd);
  if (n <= 0) return std::nullopt;
  pid_t pid = 0;
  auto [end, ec] = std::from_chars(buf, buf + n, pid);
  if (ec != std::errc() || pid <= 0 || end == buf) return std::nullopt;
  return pid;
}

}  // namespace ghost
