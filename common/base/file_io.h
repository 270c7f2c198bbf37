// FileIo: the one narrow interface through which Ghost reads and writes file bodies (DESIGN
// §4; STYLE "file I/O through one narrow interface").
//
// The cache store and the write queue's writer call Read / Write / Fsync and get the result in
// a callback on the daemon's event-loop thread. Live, the backend is io_uring (UringFileIo, in
// uring_file_io.h), whose completions wake the loop through an eventfd; where io_uring is
// unavailable, and in tests, SyncFileIo does the system call at once and delivers the result
// on the loop's next turn. Faults are injected by wrapping either in FaultyFileIo (after
// leveldb's db/fault_injection_test.cc and sqlite's src/test_vfs.c): fail the N-th call, or
// every call a predicate picks, with a chosen errno.
//
// Contract shared by every implementation:
//  - `done` runs on the event-loop thread, exactly once, and never inside the call that
//    submitted the request (so a caller may submit, then update its own state).
//  - Read moves up to buf.size() bytes; fewer only at end of file (0 at or past it). Write
//    moves all of `data` or fails. Short transfers are retried inside the implementation.
//  - Requests are independent: two requests on one fd may complete in any order.
//  - `fd` must stay open, naming the same file, until `done` runs: UringFileIo resolves the
//    number only when its submitter thread enters the kernel, which may be well after the call
//    returned. A number closed before then may name another file or socket by then, which
//    then gets the write (a fill abandoned with a write queued wrote its bytes into a client
//    socket accepted meanwhile, ghostproxy round 17) or feeds the read.
//  - Destroying a FileIo drops the callbacks of requests not yet completed (they never run).
//    Read buffers must stay valid until `done` runs or the FileIo is destroyed.
//
// Thread-safety: not thread-safe; every call on the event-loop thread.
#ifndef GHOST_COMMON_BASE_FILE_IO_H_
#define GHOST_COMMON_BASE_FILE_IO_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <span>
#include <string>

#include "common/base/status.h"

struct event;  // libevent, kept out of the interface
struct event_base;

namespace ghost {

class FileIo {
 public:
  virtual ~FileIo() = default;

  // Bytes moved, or the error (a Status from Status::FromErrno naming the op and the fd).
  using Done = std::function<void(Result<std::size_t>)>;

  // Reads into `buf` from `offset` of `fd`. `buf` is borrowed until `done` runs.
  virtual void Read(int fd, std::uint64_t offset, std::span<char> buf, Done done) = 0;
  // Writes all of `data` (owned by the request) at `offset` of `fd`.
  virtual void Write(int fd, std::uint64_t offset, std::string data, Done done) = 0;
  // Makes the data written to `fd` durable.
  virtual void Fsync(int fd, std::function<void(Status)> done) = 0;
  // Makes the whole file system holding `fd` durable (syncfs(2): e.g. the name changes a flush
  // made). io_uring has no syncfs: this default does the system call at once (blocking the
  // loop) and delivers its result through an Fsync of `fd`, so it still arrives on the loop.
  virtual void Syncfs(int fd, std::function<void(Status)> done);
};

// An owned file descriptor: closes it on destruction. Move-only.
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(UniqueFd&& other) noexcept : fd_(other.release()) {}
  UniqueFd& operator=(UniqueFd&& other) noexcept;
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  ~UniqueFd() { reset(); }

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int release();
  // Closes the held fd (if any) and holds `fd` instead.
  void reset(int fd = -1);

 private:
  int fd_ = -1;
};

// pread / pwrite / fsync done at once in the calling thread; the result is delivered on the
// loop's next turn through one manually activated libevent event (no timer, so an idle
// SyncFileIo costs no wake-ups). The fallback when io_uring is unavailable, and the tests'
// backend. It blocks the loop for the duration of each system call: fine for a page-cache hit,
// which is why io_uring is the live default.
class SyncFileIo final : public FileIo {
 public:
  // Borrows `base`, which must outlive this object.
  explicit SyncFileIo(event_base* base);
  ~SyncFileIo() override;
  SyncFileIo(const SyncFileIo&) = delete;
  SyncFileIo& operator=(const SyncFileIo&) = delete;

  void Read(int fd, std::uint64_t offset, std::span<char> buf, Done done) override;
  void Write(int fd, std::uint64_t offset, std::string data, Done done) override;
  void Fsync(int fd, std::function<void(Status)> done) override;
  void Syncfs(int fd, std::function<void(Status)> done) override;

 private:
  static void OnReady(int fd, short what, void* arg);
  void Complete(std::function<void()> fn);

  event* ready_event_ = nullptr;
  std::deque<std::function<void()>> ready_;  // completions waiting for the next turn
};

// What a FaultyFileIo predicate sees of each call.
enum class FileOp { kRead, kWrite, kFsync, kSyncfs };
struct FileCall {
  FileOp op;
  int fd;
  std::uint64_t offset;   // 0 for kFsync, kSyncfs
  std::size_t size;       // bytes asked for; 0 for kFsync, kSyncfs
  std::uint64_t ordinal;  // 1 for the first call made through this FaultyFileIo
};
const char* FileOpName(FileOp op);
// "read of 4096 bytes at offset 0 of fd 7": the `what` of the Status a failed call returns.
std::string DescribeFileCall(FileOp op, int fd, std::uint64_t offset, std::size_t size);

// Wraps another FileIo and makes chosen calls fail with a chosen errno instead of reaching it
// (a failed Write writes nothing). Failures are delivered like real ones: on the loop, never
// inside the call (by a zero-length read of the same fd on the wrapped FileIo, whose result
// is replaced). Other calls pass through unchanged.
class FaultyFileIo final : public FileIo {
 public:
  using Predicate = std::function<bool(const FileCall&)>;

  // Borrows `base`, which must outlive this object.
  explicit FaultyFileIo(FileIo& base) : base_(base) {}
  FaultyFileIo(const FaultyFileIo&) = delete;
  FaultyFileIo& operator=(const FaultyFileIo&) = delete;

  // Fails the n-th call made from now on (n = 1: the next call) with `err`, once.
  // Precondition: n >= 1.
  void FailNthCall(std::uint64_t n, int err);
  // Fails every call for which `pred` is true with `err`, until Heal.
  void FailWhen(Predicate pred, int err);
  // Stops injecting faults.
  void Heal();

  // Calls made through this object, and how many of them were failed.
  std::uint64_t calls() const { return calls_; }
  std::uint64_t failures() const { return failures_; }

  void Read(int fd, std::uint64_t offset, std::span<char> buf, Done done) override;
  void Write(int fd, std::uint64_t offset, std::string data, Done done) override;
  void Fsync(int fd, std::function<void(Status)> done) override;
  void Syncfs(int fd, std::function<void(Status)> done) override;

 private:
  // Counts the call; returns the errno to fail it with, or 0 to pass it through.
  int Decide(FileOp op, int fd, std::uint64_t offset, std::size_t size);
  // Delivers `Status::FromErrno(err, ...)` to `fail` on the loop.
  void FailLater(const FileCall& call, int err, std::function<void(Status)> fail);

  FileIo& base_;
  std::uint64_t calls_ = 0;
  std::uint64_t failures_ = 0;
  std::uint64_t fail_ordinal_ = 0;  // 0 = none armed
  int fail_ordinal_errno_ = 0;
  Predicate pred_;
  int pred_errno_ = 0;
};

}  // namespace ghost

#endif  // GHOST_COMMON_BASE_FILE_IO_H_
