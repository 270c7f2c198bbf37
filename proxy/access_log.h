// ghostproxy's access log, written off the event loop (common/DESIGN.md §4.3, "round 16").
//
// The loop appends each request's line to a batch of its own (no lock, no syscall) and hands
// the batch to a writer thread once per loop turn (Submit: one lock, one wake-up). The thread
// write(2)s it to the file. A slow or blocked file — a full or failing disk, NFS, a FIFO nobody
// reads — then holds up the thread, never the loop: the lines wait in a bounded queue
// (`queue_bytes`, counting the batch being written), and a line that does not fit is dropped
// and counted (lines_dropped, shown on /ghost/status and /ghost/metrics).
//
// Reopen() has the thread open the path again after writing what is queued (logrotate's
// rename, then SIGHUP); the lines queued before it go to the old file. The destructor writes
// what is queued, waiting as long as the writer makes progress; after `stop_wait` without any
// (a file that takes nothing) it gives up and tells on stderr how many bytes it did not write.
#ifndef GHOST_PROXY_ACCESS_LOG_H_
#define GHOST_PROXY_ACCESS_LOG_H_

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "common/base/status.h"

namespace ghost {

class AccessLog {
 public:
  struct Counters {
    std::uint64_t lines_written = 0;
    std::uint64_t lines_dropped = 0;   // did not fit in the queue
    std::uint64_t lines_failed = 0;    // write(2) failed for them (EIO, ENOSPC, ...)
    std::uint64_t reopens = 0;         // Reopen()s done (the path opened again)
    std::uint64_t reopen_failures = 0; // the old file kept
    std::uint64_t queued_bytes = 0;    // handed to the writer, not yet written
  };

  // Opens `path` for appending (created 0666 & ~umask) and starts the writer. A FIFO with no
  // reader is refused (ENXIO) rather than waited for.
  [[nodiscard]] static Result<std::unique_ptr<AccessLog>> Open(
      const std::string& path, std::size_t queue_bytes,
      std::chrono::milliseconds stop_wait = std::chrono::seconds(2));
  ~AccessLog();
  AccessLog(const AccessLog&) = delete;
  AccessLog& operator=(const AccessLog&) = delete;

  // From the loop: one line, ending in '\n'. False (and counted) when the queue is full.
  bool Append(std::string_view line);
  // From the loop: the lines appended since the last Submit go to the writer.
  void Submit();
  // The writer opens the path again once the lines queued before this call are written.
  void Reopen();
  Counters counters() const;

  struct Shared;  // the writer thread's state, kept alive by the thread too (access_log.cc)

 private:
  AccessLog(std::shared_ptr<Shared> shared, std::chrono::milliseconds stop_wait);

  std::shared_ptr<Shared> shared_;
  std::chrono::milliseconds stop_wait_;
  std::string batch_;  // the loop's lines since the last Submit
  std::uint64_t dropped_ = 0;  // loop-side only
};

}  // namespace ghost

#endif  // GHOST_PROXY_ACCESS_LOG_H_
