// The mount's write-back: the write queue's writer and the fills waiting in it (write_back.h).
#include "fs/write_back.h"

#include <cstdio>

#include "fs/flash_local.h"

namespace ghost {

WriteBack::WriteBack(PowerManager& pm, DeviceId disk_id, Device& disk, CacheStore& store,
                     WriteQueueOptions options)
    : store_(store), disk_(disk) {
  queue_ = std::make_unique<WriteQueue>(
      pm, disk_id, options,
      [this](std::vector<WriteRecord> batch, std::function<void()> done) { WriteBatch(std::move(batch), std::move(done)); });
}

void WriteBack::QueueWholeFill(const std::string& key, std::string body,
                               const std::string& content_type) {
  CacheEntry meta;
  meta.content_type = content_type;
  QueueFill(key, std::move(meta), std::move(body));
}

void WriteBack::QueueFill(const std::string& key, CacheEntry meta, std::string body) {
  meta.size = body.size();
  pending_fills_[key] = meta;
  QueuedBody& q = queued_bodies_[key];
  q.data = std::make_shared<const std::string>(std::move(body));
  q.version = next_body_version_++;
  // Length only: two queued fills of one key must not merge into a body of neither (the
  // queue merges records of a key byte-wise); the writer takes the bytes from queued_bodies_.
  WriteRecord rec;
  rec.kind = WriteKind::kFill;
  rec.key = FillKey(key);
  rec.length = meta.size;
  queue_->Add(std::move(rec));
}

void WriteBack::QueueIndexUpdate(const std::string& key) {
  WriteRecord r;
  r.kind = WriteKind::kIndex;
  r.key = IndexKey(key);
  r.length = kIndexRowBytes;
  queue_->Add(std::move(r));
}

const CacheEntry* WriteBack::QueuedMeta(const std::string& key) const {
  auto it = pending_fills_.find(key);
  return it == pending_fills_.end() ? nullptr : &it->second;
}

const QueuedBody* WriteBack::QueuedBodyOf(const std::string& key) const {
  auto it = queued_bodies_.find(key);
  return it == queued_bodies_.end() ? nullptr : &it->second;
}

bool WriteBack::DropQueuedFill(const std::string& key) {
  bool queued = pending_fills_.erase(key) > 0;
  queued_bodies_.erase(key);
  return queued;
}

void WriteBack::FillSettled(const std::string& key) {
  auto w = writing_fills_.find(key);
  if (w == writing_fills_.end() || --w->second > 0) return;
  writing_fills_.erase(w);
  auto waiters = fill_waiters_.extract(key);
  if (waiters.empty()) return;
  for (auto& fn : waiters.mapped()) fn();
}

void WriteBack::WhenFillSettles(const std::string& key, std::function<void()> fn) {
  if (!writing_fills_.count(key)) return fn();
  fill_waiters_[key].push_back(std::move(fn));
}

void WriteBack::FillCommitted(const std::string& key) {
  if (hooks_.fill_committed) hooks_.fill_committed(key);
}

void WriteBack::WriteBatch(std::vector<WriteRecord> batch, std::function<void()> done) {
  write_backlog_.emplace_back(std::move(batch), std::move(done));
  if (writing_) return;
  writing_ = true;
  // Runs the backlog one batch at a time: io_uring does not order writes, batches must be.
  // The runner holds itself only weakly: each batch's completion holds it until it has started
  // the next batch, so it is freed once the backlog is empty (a strong self-reference leaked it
  // every time the writer went idle).
  auto next = std::make_shared<std::function<void()>>();
  *next = [this, self = std::weak_ptr<std::function<void()>>(next)] {
    if (write_backlog_.empty()) {
      writing_ = false;
      return;
    }
    auto [records, done] = std::move(write_backlog_.front());
    write_backlog_.pop_front();
    ApplyBatch(std::move(records), [this, done = std::move(done), next = self.lock()] {
      done();
      if (hooks_.batch_done) hooks_.batch_done();  // e.g. local/ files now durable
      (*next)();
    });
  };
  (*next)();
}

void WriteBack::ApplyBatch(std::vector<WriteRecord> batch, std::function<void()> done) {
  // local/ records go to the flash log while it takes them (one answer per batch, so a
  // batch is never split between the log and the disk); the disk is charged for the rest.
  const bool to_log = flash_ != nullptr && hooks_.local_file_to_log && flash_->TakesWrites();
  Bytes total = 0;
  for (const WriteRecord& r : batch) {
    if (!(to_log && r.kind == WriteKind::kLocalFile)) total += r.length;
  }
  auto pending = std::make_shared<int>(1);
  std::function<void()> finish = [pending, done] {
    if (--*pending == 0) done();
  };
  // The emulated disk does the same amount of work (it may need to spin up first).
  if (total > 0 || !to_log) {
    ++*pending;
    disk_.Submit({total, true}, finish);
  }
  bool save_index = false;  // metadata changes (after a 304) wait for a batch, too
  for (WriteRecord& r : batch) {
    switch (r.kind) {
      case WriteKind::kLocalFile:
        ++*pending;
        if (to_log) {
          hooks_.local_file_to_log(std::move(r), finish);
        } else if (hooks_.local_file) {
          hooks_.local_file(std::move(r), finish);
        } else {
          std::fprintf(stderr, "ghostfs: no writer for local file %s\n", r.key.c_str());
          finish();
        }
        break;
      case WriteKind::kIndex:
        save_index = true;
        break;
      case WriteKind::kFill:
        ++*pending;
        if (!ApplyFill(r, finish)) --*pending;
        break;
      case WriteKind::kCache:  // sized only (ghostsim): nothing to write here
        break;
    }
  }
  if (save_index) {
    if (Status s = store_.SaveIndex(); !s.ok()) std::fprintf(stderr, "ghostfs: saving the cache index: %s\n", s.ToString().c_str());
  }
  finish();
}

bool WriteBack::ApplyFill(WriteRecord& r, const std::function<void()>& finish) {
  std::string url = r.key.substr(FillKey("").size());
  auto meta = pending_fills_.find(url);
  if (meta == pending_fills_.end()) return false;
  CacheEntry entry = meta->second;
  pending_fills_.erase(meta);
  // The latest queued version of the body (its metadata is the latest too).
  std::shared_ptr<const std::string> body;
  if (auto q = queued_bodies_.find(url); q != queued_bodies_.end()) {
    body = std::move(q->second.data);
    queued_bodies_.erase(q);
  }
  Result<FillId> fill = store_.BeginFill(url, entry);
  if (!fill.ok()) {
    std::fprintf(stderr, "ghostfs: not caching %s: %s\n", url.c_str(), fill.status().ToString().c_str());
    return false;
  }
  FillId id = *fill;
  FillStarted(url);
  store_.AppendFill(id, body ? std::string(*body) : std::move(r.data), [this, id, url, finish](Status s) {
    if (!s.ok()) {
      std::fprintf(stderr, "ghostfs: not caching %s: %s\n", url.c_str(), s.ToString().c_str());
      store_.AbortFill(id);
      FillSettled(url);
      return finish();
    }
    store_.CommitFill(id, [this, url, finish](Status c) {
      if (!c.ok()) std::fprintf(stderr, "ghostfs: not caching %s: %s\n", url.c_str(), c.ToString().c_str());
      else FillCommitted(url);
      FillSettled(url);
      finish();
    });
  });
  return true;
}

}  // namespace ghost
