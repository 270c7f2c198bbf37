#include "fs/inval_notifier.h"

#include <utility>

namespace ghost {

InvalNotifier::InvalNotifier(fuse_session* se) : se_(se), thread_([this] { Run(); }) {}

void InvalNotifier::Invalidate(fuse_ino_t ino) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    // One pending notification per inode: it is sent after this change, so it covers it, and
    // the queue stays bounded by the inodes however many fills arrive while the thread waits.
    if (stopping_ || !queued_.insert(ino).second) return;
    queue_.push_back(ino);
  }
  cv_.notify_one();
}

void InvalNotifier::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_one();
  if (thread_.joinable()) thread_.join();
}

std::uint64_t InvalNotifier::sent() const {
  std::lock_guard<std::mutex> lock(mu_);
  return sent_;
}

std::uint64_t InvalNotifier::refused() const {
  std::lock_guard<std::mutex> lock(mu_);
  return refused_;
}

void InvalNotifier::Run() {
  id_.store(std::this_thread::get_id());
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stopping, and everything queued was sent
    fuse_ino_t ino = queue_.front();
    queue_.pop_front();
    queued_.erase(ino);  // a change from now on queues a notification of its own
    lock.unlock();
    // Attributes and every cached page (offset 0, length 0 = to the end). -ENOENT: the kernel
    // has no such inode cached (forgotten meanwhile), nothing to drop.
    int r = fuse_lowlevel_notify_inval_inode(se_, ino, 0, 0);
    lock.lock();
    ++sent_;
    if (r != 0) ++refused_;
  }
}

}  // namespace ghost
