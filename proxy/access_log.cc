// See access_log.h.
#include "proxy/access_log.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <thread>

namespace ghost {

struct AccessLog::Shared {
  std::string path;
  std::size_t queue_bytes = 0;
  int fd = -1;  // the writer's, after Open

  std::mutex mu;
  std::condition_variable wake;  // the writer: work, a reopen or the stop
  std::condition_variable idle;  // the destructor: the writer has written everything
  std::string queue;             // under mu
  bool reopen = false;
  std::size_t reopen_at = 0;     // with reopen: the queue's bytes that go to the file open now
  bool stop = false;
  bool writing = false;  // a batch is out of the queue, being written

  // Bytes handed over and not yet written (the queue and the batch being written): the loop
  // reads it without the lock to decide whether a line fits.
  std::atomic<std::size_t> held{0};
  std::atomic<std::uint64_t> written{0}, failed{0}, reopens{0}, reopen_failures{0};
};

namespace {

// Writes all of `data` to `fd`; false on an error other than EINTR (errno set).
bool WriteAll(int fd, std::string_view data) {
  while (!data.empty()) {
    const ssize_t n = ::write(fd, data.data(), data.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    data.remove_prefix(static_cast<std::size_t>(n));
  }
  return true;
}

void Run(const std::shared_ptr<AccessLog::Shared>& s) {
  std::string batch;
  bool reported = false;  // one stderr line per run of failures
  std::unique_lock lock(s->mu);
  for (;;) {
    s->wake.wait(lock, [&] { return !s->queue.empty() || s->reopen || s->stop; });
    // Here the queue is empty only with a reopen or the stop pending.
    // The lines queued before a Reopen go to the file open then, the rest to the new one.
    const std::size_t take = s->reopen ? s->reopen_at : s->queue.size();
    if (take > 0) {
      batch.clear();
      if (take == s->queue.size()) {
        batch.swap(s->queue);
      } else {
        batch.assign(s->queue, 0, take);
        s->queue.erase(0, take);
      }
      if (s->reopen) s->reopen_at = 0;
      s->writing = true;
      lock.unlock();
      const auto lines = static_cast<std::uint64_t>(std::count(batch.begin(), batch.end(), '\n'));
      if (WriteAll(s->fd, batch)) {
        s->written.fetch_add(lines, std::memory_order_relaxed);
        reported = false;
      } else {
        const int err = errno;
        s->failed.fetch_add(lines, std::memory_order_relaxed);
        if (!reported) {
          std::fprintf(stderr, "ghostproxy: access log %s: write failed (%s); lines lost\n",
                       s->path.c_str(), std::strerror(err));
          reported = true;
        }
      }
      s->held.fetch_sub(batch.size(), std::memory_order_relaxed);
      lock.lock();
      s->writing = false;
      continue;  // whatever came meanwhile goes before a reopen or the stop
    }
    if (s->reopen) {
      s->reopen = false;
      lock.unlock();
      const int fd = ::open(s->path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0666);
      const int err = errno;
      lock.lock();  // fd changes under the lock: the destructor reads it
      if (fd >= 0) {
        ::close(s->fd);
        s->fd = fd;
        s->reopens.fetch_add(1, std::memory_order_relaxed);
      } else {
        s->reopen_failures.fetch_add(1, std::memory_order_relaxed);
        std::fprintf(stderr, "ghostproxy: access log %s: cannot reopen (%s); still writing the "
                     "file open before\n", s->path.c_str(), std::strerror(err));
      }
      continue;
    }
    if (s->stop) break;
  }
  ::close(s->fd);
  s->fd = -1;
  s->idle.notify_all();
}

}  // namespace

Result<std::unique_ptr<AccessLog>> AccessLog::Open(const std::string& path,
                                                   std::size_t queue_bytes,
                                                   std::chrono::milliseconds stop_wait) {
  // O_NONBLOCK only for the open: a FIFO with no reader fails with ENXIO instead of hanging
  // the start; writes are blocking (the writer thread's to wait for).
  const int fd = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC | O_NONBLOCK, 0666);
  if (fd < 0) return Status::FromErrno(errno, "cannot open access log " + path);
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags < 0 || ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) < 0) {
    const int err = errno;
    ::close(fd);
    return Status::FromErrno(err, "cannot open access log " + path);
  }
  auto shared = std::make_shared<Shared>();
  shared->path = path;
  shared->queue_bytes = queue_bytes;
  shared->fd = fd;
  std::thread([shared] { Run(shared); }).detach();
  return std::unique_ptr<AccessLog>(new AccessLog(std::move(shared), stop_wait));
}

AccessLog::AccessLog(std::shared_ptr<Shared> shared, std::chrono::milliseconds stop_wait)
    : shared_(std::move(shared)), stop_wait_(stop_wait) {}

AccessLog::~AccessLog() {
  Submit();
  std::unique_lock lock(shared_->mu);
  shared_->stop = true;
  shared_->wake.notify_one();
  // Waits while the writer makes progress; after `stop_wait_` without any, gives up. The
  // thread is detached and owns `shared_` too: if the file takes nothing (a FIFO nobody reads),
  // the proxy stops anyway and the thread ends with the process.
  std::size_t held = shared_->held.load(std::memory_order_relaxed);
  while (!shared_->idle.wait_for(lock, stop_wait_, [&] { return shared_->fd < 0; })) {
    const std::size_t now = shared_->held.load(std::memory_order_relaxed);
    if (now < held) {
      held = now;
      continue;
    }
    std::fprintf(stderr, "ghostproxy: access log %s: %zu bytes not written, the file took "
                 "nothing in %lld ms\n", shared_->path.c_str(), now,
                 static_cast<long long>(stop_wait_.count()));
    break;
  }
}

bool AccessLog::Append(std::string_view line) {
  if (batch_.size() + line.size() + shared_->held.load(std::memory_order_relaxed) >
      shared_->queue_bytes) {
    ++dropped_;
    return false;
  }
  batch_ += line;
  return true;
}

void AccessLog::Submit() {
  if (batch_.empty()) return;
  {
    std::lock_guard lock(shared_->mu);
    shared_->held.fetch_add(batch_.size(), std::memory_order_relaxed);
    if (shared_->queue.empty()) {
      shared_->queue.swap(batch_);  // the writer's emptied buffer comes back with the next swap
    } else {
      shared_->queue += batch_;
    }
  }
  shared_->wake.notify_one();
  batch_.clear();
}

void AccessLog::Reopen() {
  Submit();
  {
    std::lock_guard lock(shared_->mu);
    if (!shared_->reopen) shared_->reopen_at = shared_->queue.size();
    shared_->reopen = true;
  }
  shared_->wake.notify_one();
}

AccessLog::Counters AccessLog::counters() const {
  Counters c;
  c.lines_written = shared_->written.load(std::memory_order_relaxed);
  c.lines_dropped = dropped_;
  c.lines_failed = shared_->failed.load(std::memory_order_relaxed);
  c.reopens = shared_->reopens.load(std::memory_order_relaxed);
  c.reopen_failures = shared_->reopen_failures.load(std::memory_order_relaxed);
  c.queued_bytes = shared_->held.load(std::memory_order_relaxed) + batch_.size();
  return c;
}

}  // namespace ghost
