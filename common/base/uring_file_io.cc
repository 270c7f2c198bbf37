#include "common/base/uring_file_io.h"

#include <event2/event.h>
#include <liburing.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <cassert>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <utility>
#include <vector>

namespace ghost {

// The kernel hands buffered writes, fsyncs and uncached reads to an io-wq worker pool that
// belongs to the task that called io_uring_enter, and keeps its last worker alive, waking
// every 5 s, for as long as that task lives. So the loop thread prepares entries but never
// enters the kernel itself: a submitter thread does, and exits once nothing has been
// submitted for kSubmitterIdle and the kernel holds no request of ours — taking its workers
// with it, so an idle daemon makes no wake-ups. (Requests of an exiting task are cancelled,
// hence the "holds no request" condition.)
//
// Lock order: `mu` only; it guards the submission queue (io_uring_get_sqe on the loop thread,
// io_uring_submit on the submitter) and the fields below it.
constexpr auto kSubmitterIdle = std::chrono::seconds(2);

struct UringFileIo::Ring {
  io_uring ring{};
  bool initialized = false;
  UniqueFd eventfd;
  event* eventfd_event = nullptr;

  std::mutex mu;
  std::condition_variable cv;
  std::thread submitter;
  bool running = false;         // the submitter thread is (still) in its loop
  bool submit_pending = false;  // new entries wait in the submission queue
  bool stop = false;
  std::size_t kernel_held = 0;  // mirror of in_flight_, for the submitter's exit decision

  void SubmitterLoop() {
    std::unique_lock lock(mu);
    while (!stop) {
      if (submit_pending) {
        submit_pending = false;
        int ret;
        do {
          ret = io_uring_submit(&ring);
        } while (ret == -EINTR);
        // EAGAIN/EBUSY: the entries stay queued; the loop asks again after a completion.
        if (ret < 0 && ret != -EAGAIN && ret != -EBUSY) {
          std::fprintf(stderr, "ghost: UringFileIo: io_uring_submit failed: %s\n", std::strerror(-ret));
          std::abort();  // requests would wait forever: a broken ring is not recoverable here
        }
        continue;
      }
      bool woken = cv.wait_for(lock, kSubmitterIdle, [this] { return stop || submit_pending; });
      if (!woken && kernel_held == 0 && io_uring_sq_ready(&ring) == 0) break;
    }
    running = false;
  }

  void StopSubmitter() {
    {
      std::lock_guard lock(mu);
      stop = true;
    }
    cv.notify_all();
    if (submitter.joinable()) submitter.join();
  }

  ~Ring() {
    StopSubmitter();
    if (eventfd_event != nullptr) event_free(eventfd_event);
    if (initialized) io_uring_queue_exit(&ring);  // before the eventfd it may signal
  }
};

struct UringFileIo::Request {
  FileOp op = FileOp::kRead;
  int fd = -1;
  std::uint64_t offset = 0;
  char* buf = nullptr;  // reads: the caller's buffer; writes: data.data()
  std::size_t size = 0;
  std::size_t moved = 0;  // bytes transferred so far
  std::string data;       // a write's bytes, owned until it completes
  Done done;
  std::function<void(Status)> fsync_done;

  std::string Describe() const { return DescribeFileCall(op, fd, offset, size); }
};

Result<std::unique_ptr<UringFileIo>> UringFileIo::Create(event_base* base, unsigned entries,
                                                         std::size_t max_bytes_per_entry) {
  assert(max_bytes_per_entry > 0);
  auto ring = std::make_unique<Ring>();
  int ret = io_uring_queue_init(entries, &ring->ring, 0);
  if (ret < 0) {
    return Status::FromErrno(-ret, "io_uring_queue_init with " + std::to_string(entries) +
                                       " entries (use the synchronous file I/O fallback)");
  }
  ring->initialized = true;
  ring->eventfd.reset(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  if (!ring->eventfd.valid()) return Status::FromErrno(errno, "eventfd for io_uring completions");
  ret = io_uring_register_eventfd(&ring->ring, ring->eventfd.get());
  if (ret < 0) return Status::FromErrno(-ret, "io_uring_register_eventfd");
  return std::unique_ptr<UringFileIo>(new UringFileIo(base, std::move(ring), max_bytes_per_entry));
}

UringFileIo::UringFileIo(event_base* base, std::unique_ptr<Ring> ring,
                         std::size_t max_bytes_per_entry)
    : base_(base),
      ring_(std::move(ring)),
      max_bytes_per_entry_(std::min<std::size_t>(max_bytes_per_entry, UINT_MAX)),
      capacity_(ring_->ring.sq.ring_entries) {
  ring_->eventfd_event =
      event_new(base_, ring_->eventfd.get(), EV_READ | EV_PERSIST, &UringFileIo::OnEventFd, this);
  if (ring_->eventfd_event == nullptr) {
    std::fprintf(stderr, "ghost: UringFileIo: event_new failed (out of memory)\n");
    std::abort();
  }
}

UringFileIo::~UringFileIo() {
  ring_->StopSubmitter();
  // The kernel may still be writing into read buffers or reading write data: wait for every
  // request it holds before anything is freed. Callbacks are dropped, not run.
  while (in_flight_ > 0) {
    int ret = io_uring_submit_and_wait(&ring_->ring, 1);
    if (ret < 0 && ret != -EINTR && ret != -EAGAIN && ret != -EBUSY) {
      std::fprintf(stderr, "ghost: UringFileIo: waiting for in-flight I/O failed: %s\n",
                   std::strerror(-ret));
      std::abort();  // freeing buffers the kernel may still use would corrupt memory
    }
    io_uring_cqe* cqe;
    unsigned head;
    unsigned seen = 0;
    io_uring_for_each_cqe(&ring_->ring, head, cqe) {
      delete static_cast<Request*>(io_uring_cqe_get_data(cqe));
      ++seen;
    }
    io_uring_cq_advance(&ring_->ring, seen);
    in_flight_ -= seen;
  }
  waiting_.clear();
}

void UringFileIo::Read(int fd, std::uint64_t offset, std::span<char> buf, Done done) {
  auto req = std::make_unique<Request>();
  req->op = FileOp::kRead;
  req->fd = fd;
  req->offset = offset;
  req->buf = buf.data();
  req->size = buf.size();
  req->done = std::move(done);
  Enqueue(std::move(req));
}

void UringFileIo::Write(int fd, std::uint64_t offset, std::string data, Done done) {
  auto req = std::make_unique<Request>();
  req->op = FileOp::kWrite;
  req->fd = fd;
  req->offset = offset;
  req->data = std::move(data);
  req->buf = req->data.data();
  req->size = req->data.size();
  req->done = std::move(done);
  Enqueue(std::move(req));
}

void UringFileIo::Fsync(int fd, std::function<void(Status)> done) {
  auto req = std::make_unique<Request>();
  req->op = FileOp::kFsync;
  req->fd = fd;
  req->fsync_done = std::move(done);
  Enqueue(std::move(req));
}

void UringFileIo::Enqueue(std::unique_ptr<Request> req) {
  // FIFO: a new request never overtakes one already waiting for an entry.
  if (!waiting_.empty() || !Prepare(req)) waiting_.push_back(std::move(req));
  if (!reaping_) {
    Submit();
    UpdateArmed();
  }
}

bool UringFileIo::Prepare(std::unique_ptr<Request>& req) {
  if (in_flight_ >= capacity_) return false;
  std::lock_guard lock(ring_->mu);
  io_uring_sqe* sqe = io_uring_get_sqe(&ring_->ring);
  if (sqe == nullptr) return false;
  std::size_t rest = req->size - req->moved;
  auto chunk = static_cast<unsigned>(std::min(rest, max_bytes_per_entry_));
  switch (req->op) {
    case FileOp::kRead:
      io_uring_prep_read(sqe, req->fd, req->buf + req->moved, chunk, req->offset + req->moved);
      break;
    case FileOp::kWrite:
      io_uring_prep_write(sqe, req->fd, req->buf + req->moved, chunk, req->offset + req->moved);
      break;
    case FileOp::kFsync:
    case FileOp::kSyncfs:  // never queued: Syncfs is FileIo's default
      io_uring_prep_fsync(sqe, req->fd, 0);
      break;
  }
  io_uring_sqe_set_data(sqe, req.release());  // owned by the ring until its completion
  ++in_flight_;
  ring_->kernel_held = in_flight_;
  return true;
}

void UringFileIo::Pump() {
  while (!waiting_.empty() && Prepare(waiting_.front())) waiting_.pop_front();
  Submit();
}

void UringFileIo::Submit() {
  {
    std::lock_guard lock(ring_->mu);
    if (io_uring_sq_ready(&ring_->ring) == 0) return;
    ring_->submit_pending = true;
    if (!ring_->running) {
      if (ring_->submitter.joinable()) ring_->submitter.join();  // it has left its loop
      ring_->running = true;
      ring_->submitter = std::thread([ring = ring_.get()] { ring->SubmitterLoop(); });
    }
  }
  ring_->cv.notify_one();
}

void UringFileIo::UpdateArmed() {
  bool want = in_flight_ > 0;
  if (want == armed_) return;
  if (want) {
    event_add(ring_->eventfd_event, nullptr);
  } else {
    event_del(ring_->eventfd_event);
  }
  armed_ = want;
}

void UringFileIo::OnEventFd(int, short, void* arg) {
  auto* self = static_cast<UringFileIo*>(arg);
  std::uint64_t count;
  // Clears the eventfd; EAGAIN (nothing new) is fine, completions are read from the ring.
  [[maybe_unused]] ssize_t n = ::read(self->ring_->eventfd.get(), &count, sizeof count);

  std::vector<std::pair<Request*, int>> completed;
  io_uring_cqe* cqe;
  unsigned head;
  io_uring_for_each_cqe(&self->ring_->ring, head, cqe) {
    completed.emplace_back(static_cast<Request*>(io_uring_cqe_get_data(cqe)), cqe->res);
  }
  io_uring_cq_advance(&self->ring_->ring, static_cast<unsigned>(completed.size()));
  self->in_flight_ -= completed.size();
  {
    std::lock_guard lock(self->ring_->mu);
    self->ring_->kernel_held = self->in_flight_;
  }

  // Requests made by the callbacks are prepared now and submitted together below.
  self->reaping_ = true;
  for (auto [req, res] : completed) self->OnCompletion(std::unique_ptr<Request>(req), res);
  self->reaping_ = false;
  self->Pump();
  self->UpdateArmed();
}

void UringFileIo::OnCompletion(std::unique_ptr<Request> req, int res) {
  if (res == -EINTR || res == -EAGAIN) {  // transient: try the same piece again
    Enqueue(std::move(req));
    return;
  }
  if (res < 0) {
    Status st = Status::FromErrno(-res, req->Describe());
    if (req->op == FileOp::kFsync) {
      req->fsync_done(std::move(st));
    } else {
      req->done(std::move(st));
    }
    return;
  }
  if (req->op == FileOp::kFsync) {
    req->fsync_done(Status::Ok());
    return;
  }
  auto moved = static_cast<std::size_t>(res);
  req->moved += moved;
  bool finished = req->moved >= req->size || (req->op == FileOp::kRead && moved == 0);
  if (!finished && req->op == FileOp::kWrite && moved == 0) {
    // A regular file never accepts zero bytes of a non-empty write; do not spin on it.
    req->done(Status::FromErrno(EIO, req->Describe()));
    return;
  }
  if (!finished) {  // short transfer, or a piece of a large one: submit the rest
    Enqueue(std::move(req));
    return;
  }
  req->done(req->moved);
}

}  // namespace ghost
