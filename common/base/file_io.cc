#include "common/base/file_io.h"

#include <event2/event.h>
#include <unistd.h>

#include <cassert>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <utility>

namespace ghost {

// ---- UniqueFd ----

UniqueFd& UniqueFd::operator=(UniqueFd&& other) noexcept {
  if (this != &other) reset(other.release());
  return *this;
}

int UniqueFd::release() {
  int fd = fd_;
  fd_ = -1;
  return fd;
}

void UniqueFd::reset(int fd) {
  if (fd_ >= 0) ::close(fd_);  // nothing useful to do on failure: the fd is gone either way
  fd_ = fd;
}

// ---- Names ----

const char* FileOpName(FileOp op) {
  switch (op) {
    case FileOp::kRead:
      return "read";
    case FileOp::kWrite:
      return "write";
    case FileOp::kFsync:
      return "fsync";
    case FileOp::kSyncfs:
      return "syncfs";
  }
  return "unknown";
}

std::string DescribeFileCall(FileOp op, int fd, std::uint64_t offset, std::size_t size) {
  if (op == FileOp::kFsync || op == FileOp::kSyncfs) {
    return std::string(FileOpName(op)) + " of fd " + std::to_string(fd);
  }
  return std::string(FileOpName(op)) + " of " + std::to_string(size) + " bytes at offset " +
         std::to_string(offset) + " of fd " + std::to_string(fd);
}

// ---- FileIo ----

void FileIo::Syncfs(int fd, std::function<void(Status)> done) {
  Status st = ::syncfs(fd) < 0 ? Status::FromErrno(errno, DescribeFileCall(FileOp::kSyncfs, fd, 0, 0))
                               : Status::Ok();
  Fsync(fd, [done = std::move(done), st = std::move(st)](Status fsync) { done(st.ok() ? std::move(fsync) : st); });
}

// ---- SyncFileIo ----

SyncFileIo::SyncFileIo(event_base* base) {
  // fd -1 and no events: the event fires only when activated by Complete.
  ready_event_ = event_new(base, -1, 0, &SyncFileIo::OnReady, this);
  if (ready_event_ == nullptr) {
    std::fprintf(stderr, "ghost: SyncFileIo: event_new failed (out of memory)\n");
    std::abort();
  }
}

SyncFileIo::~SyncFileIo() { event_free(ready_event_); }

void SyncFileIo::Complete(std::function<void()> fn) {
  ready_.push_back(std::move(fn));
  event_active(ready_event_, 0, 0);  // no-op if already active
}

void SyncFileIo::OnReady(int, short, void* arg) {
  auto* self = static_cast<SyncFileIo*>(arg);
  // Completions queued by these callbacks run on the next turn, not in this loop.
  std::deque<std::function<void()>> batch;
  batch.swap(self->ready_);
  for (auto& fn : batch) fn();
}

void SyncFileIo::Read(int fd, std::uint64_t offset, std::span<char> buf, Done done) {
  std::size_t moved = 0;
  int err = 0;
  while (moved < buf.size()) {
    ssize_t n =
        ::pread(fd, buf.data() + moved, buf.size() - moved, static_cast<off_t>(offset + moved));
    if (n < 0) {
      if (errno == EINTR) continue;
      err = errno;
      break;
    }
    if (n == 0) break;  // end of file
    moved += static_cast<std::size_t>(n);
  }
  if (buf.empty() && fd < 0) err = EBADF;  // pread(…, 0) may not look at the fd
  if (err != 0) {
    Status st = Status::FromErrno(err, DescribeFileCall(FileOp::kRead, fd, offset, buf.size()));
    Complete([done = std::move(done), st = std::move(st)] { done(st); });
  } else {
    Complete([done = std::move(done), moved] { done(moved); });
  }
}

void SyncFileIo::Write(int fd, std::uint64_t offset, std::string data, Done done) {
  std::size_t moved = 0;
  int err = 0;
  while (moved < data.size()) {
    ssize_t n =
        ::pwrite(fd, data.data() + moved, data.size() - moved, static_cast<off_t>(offset + moved));
    if (n < 0) {
      if (errno == EINTR) continue;
      err = errno;
      break;
    }
    if (n == 0) {  // a regular file never does this; do not spin on it
      err = EIO;
      break;
    }
    moved += static_cast<std::size_t>(n);
  }
  if (data.empty() && fd < 0) err = EBADF;
  if (err != 0) {
    Status st = Status::FromErrno(err, DescribeFileCall(FileOp::kWrite, fd, offset, data.size()));
    Complete([done = std::move(done), st = std::move(st)] { done(st); });
  } else {
    Complete([done = std::move(done), moved] { done(moved); });
  }
}

void SyncFileIo::Fsync(int fd, std::function<void(Status)> done) {
  int rc;
  do {
    rc = ::fsync(fd);
  } while (rc < 0 && errno == EINTR);
  Status st =
      rc < 0 ? Status::FromErrno(errno, DescribeFileCall(FileOp::kFsync, fd, 0, 0)) : Status::Ok();
  Complete([done = std::move(done), st = std::move(st)] { done(st); });
}

void SyncFileIo::Syncfs(int fd, std::function<void(Status)> done) {
  Status st = ::syncfs(fd) < 0 ? Status::FromErrno(errno, DescribeFileCall(FileOp::kSyncfs, fd, 0, 0))
                               : Status::Ok();
  Complete([done = std::move(done), st = std::move(st)] { done(st); });
}

// ---- FaultyFileIo ----

void FaultyFileIo::FailNthCall(std::uint64_t n, int err) {
  assert(n >= 1);
  fail_ordinal_ = calls_ + n;
  fail_ordinal_errno_ = err;
}

void FaultyFileIo::FailWhen(Predicate pred, int err) {
  pred_ = std::move(pred);
  pred_errno_ = err;
}

void FaultyFileIo::Heal() {
  fail_ordinal_ = 0;
  pred_ = nullptr;
}

int FaultyFileIo::Decide(FileOp op, int fd, std::uint64_t offset, std::size_t size) {
  FileCall call{op, fd, offset, size, ++calls_};
  int err = 0;
  if (fail_ordinal_ != 0 && call.ordinal == fail_ordinal_) {
    err = fail_ordinal_errno_;
    fail_ordinal_ = 0;
  } else if (pred_ && pred_(call)) {
    err = pred_errno_;
  }
  if (err != 0) ++failures_;
  return err;
}

void FaultyFileIo::FailLater(const FileCall& call, int err, std::function<void(Status)> fail) {
  Status st = Status::FromErrno(
      err, DescribeFileCall(call.op, call.fd, call.offset, call.size) + " (injected fault)");
  // A zero-length read touches nothing; it only carries us to the loop's next completion.
  base_.Read(call.fd, call.offset, std::span<char>(),
             [fail = std::move(fail), st = std::move(st)](Result<std::size_t>) { fail(st); });
}

void FaultyFileIo::Read(int fd, std::uint64_t offset, std::span<char> buf, Done done) {
  if (int err = Decide(FileOp::kRead, fd, offset, buf.size()); err != 0) {
    FailLater({FileOp::kRead, fd, offset, buf.size(), calls_}, err,
              [done = std::move(done)](Status st) { done(std::move(st)); });
    return;
  }
  base_.Read(fd, offset, buf, std::move(done));
}

void FaultyFileIo::Write(int fd, std::uint64_t offset, std::string data, Done done) {
  if (int err = Decide(FileOp::kWrite, fd, offset, data.size()); err != 0) {
    FailLater({FileOp::kWrite, fd, offset, data.size(), calls_}, err,
              [done = std::move(done)](Status st) { done(std::move(st)); });
    return;
  }
  base_.Write(fd, offset, std::move(data), std::move(done));
}

void FaultyFileIo::Syncfs(int fd, std::function<void(Status)> done) {
  if (int err = Decide(FileOp::kSyncfs, fd, 0, 0); err != 0) {
    FailLater({FileOp::kSyncfs, fd, 0, 0, calls_}, err, std::move(done));
    return;
  }
  base_.Syncfs(fd, std::move(done));
}

void FaultyFileIo::Fsync(int fd, std::function<void(Status)> done) {
  if (int err = Decide(FileOp::kFsync, fd, 0, 0); err != 0) {
    FailLater({FileOp::kFsync, fd, 0, 0, calls_}, err, std::move(done));
    return;
  }
  base_.Fsync(fd, std::move(done));
}

}  // namespace ghost
