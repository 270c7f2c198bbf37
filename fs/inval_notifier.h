// InvalNotifier: tells the kernel to drop what it caches of an inode (attributes and pages),
// from a thread of its own. The mount gives fresh cached objects long entry/attribute timeouts
// (fs/origin_tree.cc) and calls Invalidate when such an object changes (a new version stored, an
// eviction, new metadata). libfuse's rule (example/notify_inval_inode.c, passthrough_hp.cc): a
// notification must not be sent from inside a request handler, since the kernel may wait for
// that request (a page lock) while the notification waits for the kernel; the daemon's loop is
// single-threaded, so the notifications go through a queue to this thread, and the loop never
// blocks on them.
//
// Thread-safety: Invalidate may be called from any thread; Stop (and the destructor) from the
// thread that constructed it, before the session is destroyed.
#ifndef GHOST_FS_INVAL_NOTIFIER_H_
#define GHOST_FS_INVAL_NOTIFIER_H_

#include <fuse_lowlevel.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <thread>
#include <unordered_set>

namespace ghost {

class InvalNotifier {
 public:
  // Starts the thread; borrows `se`, which must outlive Stop.
  explicit InvalNotifier(fuse_session* se);
  ~InvalNotifier() { Stop(); }
  InvalNotifier(const InvalNotifier&) = delete;
  InvalNotifier& operator=(const InvalNotifier&) = delete;

  // Queues an invalidation of `ino`'s attributes and cached pages. Never blocks on the kernel.
  void Invalidate(fuse_ino_t ino);
  // Sends what is queued, then ends the thread. Idempotent.
  void Stop();

  // Notifications sent (and those the kernel refused, e.g. an inode it had forgotten).
  std::uint64_t sent() const;
  std::uint64_t refused() const;
  // Whether the calling thread is this notifier's (its writes to /dev/fuse are not replies).
  bool OnNotifierThread() const { return std::this_thread::get_id() == id_.load(); }

 private:
  void Run();

  fuse_session* se_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<fuse_ino_t> queue_;
  std::unordered_set<fuse_ino_t> queued_;  // the inodes in queue_
  bool stopping_ = false;
  std::uint64_t sent_ = 0;
  std::uint64_t refused_ = 0;
  std::atomic<std::thread::id> id_{};  // the thread's, set as it starts
  std::thread thread_;  // last: started once the members above exist
};

}  // namespace ghost

#endif  // GHOST_FS_INVAL_NOTIFIER_H_
