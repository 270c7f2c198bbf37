// The mount's write-back: the write queue's writer and the fills waiting in it (write_back.h).
#include "fs/write_back.h"

#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <span>

#include "common/base/json_fields.h"

namespace ghost {

WriteBack::WriteBack(PowerManager& pm, DeviceId disk_id, Device& disk, CacheStore& store,
                     WriteBackOptions options)
    : pm_(pm), store_(store), disk_(disk), fill_backlog_max_(options.fill_backlog_max) {
  queue_ = std::make_unique<WriteQueue>(
      pm, disk_id, options.queue,
      [this](std::vector<WriteRecord> batch, std::function<void()> done) { WriteBatch(std::move(batch), std::move(done)); });
}

WriteBack::~WriteBack() {
  if (flash_) flash_->SetFillApplier(nullptr);
}

void WriteBack::SetFlashLog(LocalFlashLog* flash) {
  if (flash_) flash_->SetFillApplier(nullptr);
  flash_ = flash;
  if (!flash_) return;
  std::weak_ptr<bool> alive = alive_;
  flash_->SetFillApplier([this, alive](std::vector<LocalFlashLog::LoggedFill> fills, std::function<void(Status)> done) {
    if (alive.expired()) return done(Status::Unavailable("the write-back is gone"));
    ApplyLoggedFills(std::move(fills), std::move(done));
  });
  // Fills a former run spilled to the log stay readable from it (source flash) while the
  // mount's replay applies them: indexed as this run's spilled fills are.
  for (LocalFlashLog::LoggedFill& f : flash_->RecoveredFills()) {
    Result<CacheEntry> meta = DecodeFillMeta(f.meta);
    if (!meta.ok()) continue;
    meta->size = f.size;
    logged_fills_[f.key] = LoggedFillEntry{*meta, QueuedBody{nullptr, next_body_version_++}, f.path};
  }
}

void WriteBack::QueueWholeFill(const std::string& key, std::string body,
                               const std::string& content_type) {
  CacheEntry meta;
  meta.content_type = content_type;
  QueueFill(key, std::move(meta), std::move(body));
}

void WriteBack::QueueFill(const std::string& key, CacheEntry meta, std::string body) {
  meta.size = body.size();
  const Bytes cost = FillCost(key, meta, body.size());
  PendingFill& p = pending_fills_[key];
  // A newer fill of a queued key replaces the older one: only the newer counts.
  fill_backlog_bytes_ -= p.cost;
  p.meta = meta;
  p.cost = cost;
  fill_backlog_bytes_ += cost;
  fill_backlog_peak_ = std::max(fill_backlog_peak_, fill_backlog_bytes_);
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
  if (it != pending_fills_.end()) return &it->second.meta;
  auto l = logged_fills_.find(key);
  return l == logged_fills_.end() ? nullptr : &l->second.meta;
}

const QueuedBody* WriteBack::QueuedBodyOf(const std::string& key) const {
  auto it = queued_bodies_.find(key);
  if (it != queued_bodies_.end()) return &it->second;
  auto l = logged_fills_.find(key);
  if (l == logged_fills_.end()) return nullptr;
  const LoggedFillEntry& e = l->second;
  if (e.body.data) return &e.body;  // still being appended: its bytes are here
  if (logged_view_path_ == e.path && logged_view_.data) return &logged_view_;
  // Read back from the flash log; the reader shares this copy (the last one read is kept).
  auto body = std::make_shared<std::string>(e.meta.size, '\0');
  if (Status s = flash_->ReadFill(e.path, 0, std::span<char>(body->data(), body->size())); !s.ok()) {
    std::fprintf(stderr, "ghostfs: reading the fill of %s from the flash log: %s\n", key.c_str(), s.ToString().c_str());
    return nullptr;
  }
  logged_view_ = QueuedBody{std::move(body), e.body.version};
  logged_view_path_ = e.path;
  return &logged_view_;
}

bool WriteBack::DropQueuedFill(const std::string& key) {
  bool queued = false;
  if (auto p = pending_fills_.find(key); p != pending_fills_.end()) {
    queued = true;
    const Bytes cost = p->second.cost;
    pending_fills_.erase(p);
    ReleaseFill(cost);
  }
  queued_bodies_.erase(key);
  if (auto l = logged_fills_.find(key); l != logged_fills_.end()) {
    queued = true;
    // Its record stays in the log until the next flush, which skips it. One being appended
    // now (no path yet) is skipped when its append completes.
    if (!l->second.path.empty()) skip_logged_.insert(l->second.path);
    logged_fills_.erase(l);
  }
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

void WriteBack::ReleaseFill(Bytes cost) {
  fill_backlog_bytes_ -= std::min(cost, fill_backlog_bytes_);
  if (!backlog_waiters_.empty() && !OverFillBacklog()) RunBacklogWaiters();
}

void WriteBack::WhenFillBacklogBelow(std::function<void()> fn) {
  // Behind those already waiting: a producer keeps its order.
  if (backlog_waiters_.empty() && !OverFillBacklog()) return fn();
  backlog_waiters_.push_back(std::move(fn));
}

void WriteBack::RunBacklogWaiters() {
  // On the loop's next turn, never inside the call that released the fill (a waiter queues
  // fills, and its caller may be in the middle of the writer's bookkeeping).
  if (running_waiters_) return;
  running_waiters_ = true;
  std::weak_ptr<bool> alive = alive_;
  pm_.clock().ScheduleAfter(Duration::zero(), [this, alive] {
    if (alive.expired()) return;
    running_waiters_ = false;
    while (!backlog_waiters_.empty() && !OverFillBacklog()) {
      std::function<void()> fn = std::move(backlog_waiters_.front());
      backlog_waiters_.pop_front();
      fn();
    }
  });
}

std::pair<std::vector<WriteRecord>, std::vector<std::function<void()>>> WriteBack::TakeBacklog() {
  std::vector<WriteRecord> records;
  std::vector<std::function<void()>> dones;
  std::set<std::string> local_keys;  // local/ files in the batch: one record each at most
  Bytes bytes = 0;
  while (!write_backlog_.empty()) {
    auto& [batch, done] = write_backlog_.front();
    Bytes batch_bytes = 0;
    for (const WriteRecord& r : batch) batch_bytes += r.length;
    if (!dones.empty()) {
      if (records.size() + batch.size() > kMaxMergedRecords || bytes + batch_bytes > kMaxMergedBytes) break;
      bool clash = false;
      for (const WriteRecord& r : batch) {
        clash = clash || (r.kind == WriteKind::kLocalFile && local_keys.contains(r.key));
      }
      if (clash) break;  // two writes of one file: io_uring would not keep their order
    }
    for (WriteRecord& r : batch) {
      if (r.kind == WriteKind::kLocalFile) local_keys.insert(r.key);
      records.push_back(std::move(r));
    }
    bytes += batch_bytes;
    dones.push_back(std::move(done));
    write_backlog_.pop_front();
  }
  return {std::move(records), std::move(dones)};
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
    // Every batch that waited meanwhile goes in this write (TakeBacklog): one group commit.
    auto [records, dones] = TakeBacklog();
    ++batches_written_;
    most_merged_ = std::max(most_merged_, dones.size());
    ApplyBatch(std::move(records), [this, dones = std::move(dones), next = self.lock()] {
      for (const auto& done : dones) done();  // in hand-over order
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
  // Fills go to the log when the batch would wake the sleeping disk for them: not when it
  // writes an index row anyway (the disk spins up for that).
  bool fills_to_log = flash_ != nullptr && flash_->TakesFills();
  for (const WriteRecord& r : batch) fills_to_log = fills_to_log && r.kind != WriteKind::kIndex;
  // A key with a fill in the log: its later fills go there too (the log's flush would put the
  // older over them).
  auto spills = [&](const WriteRecord& r) {
    return r.kind == WriteKind::kFill && flash_ != nullptr &&
           (fills_to_log || logged_fills_.contains(r.key.substr(FillKey("").size())));
  };
  Bytes total = 0;
  bool spilled = false;
  for (const WriteRecord& r : batch) {
    if (spills(r)) {
      spilled = true;
    } else if (!(to_log && r.kind == WriteKind::kLocalFile)) {
      total += r.length;
    }
  }
  auto pending = std::make_shared<int>(1);
  std::function<void()> finish = [pending, done] {
    if (--*pending == 0) done();
  };
  // The emulated disk does the same amount of work (it may need to spin up first).
  if (total > 0 || !(to_log || spilled)) {
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
        if (!(spills(r) ? SpillFill(r, finish) : ApplyFill(r, finish))) --*pending;
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
  CacheEntry entry = std::move(meta->second.meta);
  const Bytes cost = meta->second.cost;
  pending_fills_.erase(meta);
  // The latest queued version of the body (its metadata is the latest too).
  std::shared_ptr<const std::string> body;
  if (auto q = queued_bodies_.find(url); q != queued_bodies_.end()) {
    body = std::move(q->second.data);
    queued_bodies_.erase(q);
  }
  // It counts in the fill backlog until the store has it (committed or refused).
  std::weak_ptr<bool> alive = alive_;
  StoreFill(url, std::move(entry), body ? body : std::make_shared<const std::string>(std::move(r.data)),
            [this, alive, cost, finish](Status) {
              if (!alive.expired()) ReleaseFill(cost);
              finish();
            });
  return true;
}

void WriteBack::StoreFill(const std::string& url, CacheEntry entry, std::shared_ptr<const std::string> body,
                          std::function<void(Status)> finish) {
  Result<FillId> fill = store_.BeginFill(url, entry);
  if (!fill.ok()) {
    std::fprintf(stderr, "ghostfs: not caching %s: %s\n", url.c_str(), fill.status().ToString().c_str());
    return finish(Status::Ok());  // refused, as a fill the store would not cache: nothing to retry
  }
  FillId id = *fill;
  FillStarted(url);
  store_.AppendFill(id, std::string(*body), [this, id, url, finish](Status s) {
    if (!s.ok()) {
      std::fprintf(stderr, "ghostfs: not caching %s: %s\n", url.c_str(), s.ToString().c_str());
      store_.AbortFill(id);
      FillSettled(url);
      return finish(s);
    }
    store_.CommitFill(id, [this, url, finish](Status c) {
      if (!c.ok()) std::fprintf(stderr, "ghostfs: not caching %s: %s\n", url.c_str(), c.ToString().c_str());
      else FillCommitted(url);
      FillSettled(url);
      finish(c);
    });
  });
}

bool WriteBack::SpillFill(WriteRecord& r, const std::function<void()>& finish) {
  std::string url = r.key.substr(FillKey("").size());
  auto meta = pending_fills_.find(url);
  if (meta == pending_fills_.end()) return false;
  CacheEntry entry = meta->second.meta;
  const Bytes cost = meta->second.cost;
  pending_fills_.erase(meta);
  auto q = queued_bodies_.find(url);
  if (q == queued_bodies_.end()) {
    ReleaseFill(cost);
    return false;
  }
  QueuedBody body = std::move(q->second);
  queued_bodies_.erase(q);
  LoggedFillEntry& e = logged_fills_[url];
  if (!e.path.empty()) skip_logged_.insert(e.path);  // superseded by this one
  e = LoggedFillEntry{entry, body, ""};
  std::weak_ptr<bool> alive = alive_;
  const std::uint64_t version = body.version;
  // In the fill backlog until durable in the log (or, if the log fails, in the store).
  std::function<void()> released = [this, alive, cost, finish] {
    if (!alive.expired()) ReleaseFill(cost);
    finish();
  };
  flash_->AppendFill(url, body.data, EncodeFillMeta(entry),
                     [this, alive, url, version, entry, data = body.data, finish = std::move(released)](
                         Result<std::string> path) {
                       if (alive.expired()) return;
                       auto l = logged_fills_.find(url);
                       const bool current = l != logged_fills_.end() && l->second.body.version == version;
                       if (path.ok()) {
                         if (current) {
                           l->second.path = *path;
                           l->second.body.data.reset();  // read back from the log from now on
                         } else {
                           skip_logged_.insert(*path);  // dropped or superseded meanwhile
                         }
                         return finish();
                       }
                       // The log could not take it: the disk does (it spins up).
                       std::fprintf(stderr, "ghostfs: the flash log could not take the fill of %s (%s); writing it "
                                    "to the disk\n", url.c_str(), path.status().ToString().c_str());
                       if (!current) return finish();
                       logged_fills_.erase(l);
                       disk_.Submit({data->size(), true}, [] {});
                       StoreFill(url, entry, data, [finish](Status) { finish(); });
                     });
  return true;
}

void WriteBack::ApplyLoggedFills(std::vector<LocalFlashLog::LoggedFill> fills, std::function<void(Status)> done) {
  struct Run {
    std::vector<LocalFlashLog::LoggedFill> fills;
    std::size_t next = 0;
    Status error;
    std::function<void(Status)> done;
    std::function<void()> step;
  };
  auto run = std::make_shared<Run>();
  run->fills = std::move(fills);
  run->done = std::move(done);
  std::weak_ptr<bool> alive = alive_;
  // One fill at a time, in log order (two fills of a key: the later wins). The step holds the
  // run only weakly; each store callback holds it until it has started the next step.
  run->step = [this, alive, weak = std::weak_ptr<Run>(run)] {
    std::shared_ptr<Run> run = weak.lock();
    if (!run) return;
    while (run->next < run->fills.size()) {
      LocalFlashLog::LoggedFill& f = run->fills[run->next++];
      if (skip_logged_.erase(f.path) > 0) continue;  // dropped or superseded in this run
      auto l = logged_fills_.find(f.key);
      if (l != logged_fills_.end() && l->second.path != f.path) continue;  // a newer one is logged
      CacheEntry meta;
      if (l != logged_fills_.end()) {
        meta = l->second.meta;
      } else if (Result<CacheEntry> m = DecodeFillMeta(f.meta); m.ok()) {
        meta = *m;  // logged by an earlier run: replayed
      } else {
        std::fprintf(stderr, "ghostfs: dropping the logged fill %s: %s\n", f.path.c_str(), m.status().ToString().c_str());
        continue;
      }
      meta.size = f.body.size();
      auto body = std::make_shared<const std::string>(std::move(f.body));
      StoreFill(f.key, meta, body, [this, alive, run, path = f.path, key = f.key](Status s) {
        if (alive.expired()) return;
        if (s.ok()) {
          auto l = logged_fills_.find(key);
          if (l != logged_fills_.end() && l->second.path == path) logged_fills_.erase(l);
          if (logged_view_path_ == path) logged_view_ = QueuedBody{};
        } else if (run->error.ok()) {
          run->error = s;
        }
        run->step();
      });
      return;
    }
    auto finish = std::move(run->done);
    finish(run->error);
  };
  run->step();
}

std::string WriteBack::EncodeFillMeta(const CacheEntry& meta) const {
  // Wall-clock microseconds: the model clock of a later process starts elsewhere.
  const auto wall_now = std::chrono::duration_cast<std::chrono::microseconds>(
                            std::chrono::system_clock::now().time_since_epoch()).count();
  const TimePoint now = pm_.clock().Now();
  auto wall = [&](TimePoint t) { return wall_now + (t - now).count(); };
  nlohmann::json j = {{"etag", meta.etag},
                      {"last_modified", meta.last_modified},
                      {"content_type", meta.content_type},
                      {"response", meta.response},
                      {"fetched_us", wall(meta.fetched)}};
  if (meta.expires) j["expires_us"] = wall(*meta.expires);
  return j.dump();
}

Result<CacheEntry> WriteBack::DecodeFillMeta(const std::string& text) const {
  namespace jf = json_fields;
  nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return Status::Corruption("a fill commit record with no metadata");
  const auto wall_now = std::chrono::duration_cast<std::chrono::microseconds>(
                            std::chrono::system_clock::now().time_since_epoch()).count();
  const TimePoint now = pm_.clock().Now();
  CacheEntry e;
  std::int64_t fetched_us = wall_now;
  std::optional<std::int64_t> expires_us;
  // A field of another type is damage (nlohmann's value() threw type_error out of the mount's
  // start: ghostfs aborted at every mount while the log held the record).
  const char* bad = nullptr;
  if (!jf::Get(j, "etag", &e.etag)) bad = "etag";
  else if (!jf::Get(j, "last_modified", &e.last_modified)) bad = "last_modified";
  else if (!jf::Get(j, "content_type", &e.content_type)) bad = "content_type";
  else if (!jf::Get(j, "response", &e.response)) bad = "response";
  else if (!jf::Get(j, "fetched_us", &fetched_us)) bad = "fetched_us";
  else if (j.contains("expires_us") && !j["expires_us"].is_null() && !jf::As(j["expires_us"], &expires_us.emplace())) bad = "expires_us";
  if (bad) return Status::Corruption(std::string("a fill commit record whose \"") + bad + "\" is of the wrong type");
  // Times more than ~80000 years from now are damage too (us - wall_now overflowed for
  // INT64_MIN: undefined behaviour).
  constexpr std::int64_t kRange = std::int64_t{9} << 58;  // microseconds, under 2^63 / 3
  auto in_range = [&](std::int64_t us) { return us > wall_now - kRange && us < wall_now + kRange; };
  if (!in_range(fetched_us) || (expires_us && !in_range(*expires_us))) {
    return Status::Corruption("a fill commit record with a time out of range");
  }
  auto model = [&](std::int64_t us) { return now + Duration(us - wall_now); };
  e.fetched = model(fetched_us);
  if (expires_us) e.expires = model(*expires_us);
  return e;
}

}  // namespace ghost
