// UringFileIo: the live FileIo backend, on io_uring (liburing), woken through an eventfd
// (DESIGN §2 "push, never poll"; §4).
//
// Requests become submission-queue entries at once. The ring signals completions on an
// eventfd registered with io_uring_register_eventfd; a libevent read event on that eventfd,
// armed only while requests are in flight, reaps the completion queue and runs the callbacks.
// An idle UringFileIo therefore costs no wake-ups and keeps nothing armed on the loop (so
// `event_base_dispatch` can return when nothing else is pending).
//
// A short read (before end of file) or short write is resubmitted for the rest; a request
// larger than `max_bytes_per_entry` goes in pieces the same way. When the ring is full (as
// many requests in flight as it has entries), further requests wait in a FIFO list and are
// submitted as completions free entries.
//
// Destroying a UringFileIo waits (blocking) for the requests the kernel already holds, so no
// buffer is freed under the kernel, then drops every pending callback without running it.
//
// The loop thread prepares ring entries; a short-lived submitter thread enters the kernel
// and exits after 2 s without submissions once nothing is in flight, so the kernel's io-wq
// worker for buffered writes ends with it and an idle daemon makes no wake-ups (see
// uring_file_io.cc).
//
// Thread-safety: not thread-safe; every call on the thread that runs the event_base. Do not
// destroy it from inside one of its own callbacks.
#ifndef GHOST_COMMON_BASE_URING_FILE_IO_H_
#define GHOST_COMMON_BASE_URING_FILE_IO_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>

#include "common/base/file_io.h"
#include "common/base/status.h"

namespace ghost {

class UringFileIo final : public FileIo {
 public:
  // The largest transfer one ring entry carries by default (the kernel caps one read at
  // about 2 GiB anyway).
  static constexpr std::size_t kDefaultMaxBytesPerEntry = std::size_t{1} << 30;

  // Sets up a ring of `entries` entries (rounded up to a power of two by the kernel) on
  // `base`, which is borrowed and must outlive the result. Fails with the errno of
  // io_uring_queue_init (ENOSYS: the kernel has no io_uring; EPERM: it is disabled, e.g. by
  // kernel.io_uring_disabled or a seccomp filter) or of the eventfd set-up; the caller then
  // falls back to SyncFileIo. `max_bytes_per_entry` (> 0) bounds one entry's transfer; tests
  // lower it to exercise the resubmission path.
  static Result<std::unique_ptr<UringFileIo>> Create(
      event_base* base, unsigned entries = 256,
      std::size_t max_bytes_per_entry = kDefaultMaxBytesPerEntry);

  ~UringFileIo() override;
  UringFileIo(const UringFileIo&) = delete;
  UringFileIo& operator=(const UringFileIo&) = delete;

  void Read(int fd, std::uint64_t offset, std::span<char> buf, Done done) override;
  void Write(int fd, std::uint64_t offset, std::string data, Done done) override;
  void Fsync(int fd, std::function<void(Status)> done) override;

  // Requests the kernel holds, and requests waiting for a free ring entry.
  std::size_t in_flight() const { return in_flight_; }
  std::size_t waiting() const { return waiting_.size(); }

 private:
  struct Ring;  // the io_uring, kept out of this header (liburing.h is large)
  struct Request;

  UringFileIo(event_base* base, std::unique_ptr<Ring> ring, std::size_t max_bytes_per_entry);

  // Queues `req` for the ring: into a free entry if there is one, else onto waiting_.
  void Enqueue(std::unique_ptr<Request> req);
  // Moves waiting requests into free entries, then submits the ring's new entries.
  void Pump();
  // Fills one free entry for `req`; returns false (taking nothing) if the ring is full.
  bool Prepare(std::unique_ptr<Request>& req);
  void Submit();
  // Handles one completion: finishes, resubmits the rest, or fails the request.
  void OnCompletion(std::unique_ptr<Request> req, int res);
  void UpdateArmed();
  static void OnEventFd(int fd, short what, void* arg);

  event_base* base_;
  std::unique_ptr<Ring> ring_;
  const std::size_t max_bytes_per_entry_;
  std::size_t capacity_;       // ring entries: the most requests in flight at once
  std::size_t in_flight_ = 0;  // prepared entries whose completion has not been reaped
  std::deque<std::unique_ptr<Request>> waiting_;
  bool armed_ = false;    // the eventfd event is added to the loop
  bool reaping_ = false;  // inside OnEventFd: batch new entries into one submit
};

}  // namespace ghost

#endif  // GHOST_COMMON_BASE_URING_FILE_IO_H_
