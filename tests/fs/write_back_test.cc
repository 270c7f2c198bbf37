#include "fs/write_back.h"

#include <event2/event.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "common/base/clock.h"
#include "common/base/file_io.h"
#include "common/power/adaptive_spindown.h"
#include "common/power/device.h"
#include "common/power/power_manager.h"
#include "common/power/profile.h"
#include "fs/flash_local.h"

namespace ghost {
namespace {

constexpr int kPerformanceIdle = 0;

// The write-back on a disk without a policy (every write goes to the writer at once), over a
// real cache store in a temporary directory.
class WriteBackTest : public ::testing::Test {
 protected:
  // A microdrive in standby (performance-idle, low-power-idle, standby: mode 2) and the flash
  // log's options of the spill tests: what a fill past the cap with the disk asleep needs.
  static constexpr int kStandby = 2;
  std::unique_ptr<Device> AsleepMicrodrive() {
    Result<DeviceProfile> profile = LoadDeviceProfile("microdrive-1gb", GHOST_PROFILE_DIR);
    EXPECT_TRUE(profile.ok());
    return std::make_unique<Device>(clock_, *profile, nullptr, kStandby);
  }
  // A 64 KiB queue cap: a 100 KiB fill is past it (a batch that would wake the disk).
  static WriteQueueOptions SmallQueue() {
    WriteQueueOptions q;
    q.cap = 64 << 10;
    return q;
  }
  FlashLogOptions SpillLogOptions() const {
    FlashLogOptions o;
    o.dir = root_ + "/flash";
    o.capacity = 4 << 20;
    o.buffer = 64 << 10;
    return o;
  }

  void SetUp() override {
    base_ = event_base_new();
    ASSERT_NE(base_, nullptr);
    io_ = std::make_unique<SyncFileIo>(base_);
    std::string tmpl = ::testing::TempDir() + "ghost_write_back_XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    root_ = tmpl;
    Result<std::unique_ptr<CacheStore>> store = CacheStore::Open(root_ + "/objects-db", 0, clock_, *io_);
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    store_ = std::move(store).value();
    Result<DeviceProfile> profile = LoadDeviceProfile("microdrive-1gb", GHOST_PROFILE_DIR);
    ASSERT_TRUE(profile.ok()) << profile.status().ToString();
    disk_ = std::make_unique<Device>(clock_, *profile, nullptr, kPerformanceIdle);
    pm_ = std::make_unique<PowerManager>(clock_, Power::Milliwatts(1440), 50);
    disk_id_ = pm_->Register(disk_.get(), nullptr);
    wb_ = std::make_unique<WriteBack>(*pm_, disk_id_, *disk_, *store_, WriteBackOptions{});
    wb_->SetHooks(WriteBack::Hooks{
        .local_file =
            [this](WriteRecord r, std::function<void()> done) {
              local_.push_back(std::move(r));
              done();
            },
        .local_file_to_log =
            [this](WriteRecord r, std::function<void()> done) {
              to_log_.push_back(std::move(r));
              done();
            },
        .batch_done = [this] { ++batches_done_; },
        .fill_committed = [this](const std::string& key) { committed_.push_back(key); }});
  }

  void TearDown() override {
    wb_.reset();
    pm_.reset();
    disk_.reset();
    if (store_) (void)store_->Close();
    store_.reset();
    io_.reset();
    if (base_) event_base_free(base_);
    std::error_code ec;
    std::filesystem::remove_all(root_, ec);
  }

  // Runs the virtual clock (the emulated disk) and the loop (the store's file I/O) until
  // nothing is left to do.
  void Drain() {
    for (int i = 0; i < 100; ++i) {
      clock_.RunUntilIdle();
      event_base_loop(base_, EVLOOP_NONBLOCK);
      if (wb_->queue().idle() && !wb_->Writing("http://o/a") && wb_->backlog_waiters() == 0) break;
    }
  }

  std::string ReadStored(const std::string& key) {
    const CacheEntry* e = store_->index().Find(key);
    if (!e) return "<absent>";
    std::string buf(e->size, '\0');
    std::string out = "<pending>";
    store_->ReadBody(key, 0, std::span<char>(buf.data(), buf.size()), [&](Result<std::size_t> n) {
      out = n.ok() ? buf.substr(0, *n) : "<error>";
    });
    Drain();
    return out;
  }

  VirtualClock clock_;
  event_base* base_ = nullptr;
  std::unique_ptr<FileIo> io_;
  std::string root_;
  std::unique_ptr<CacheStore> store_;
  std::unique_ptr<Device> disk_;
  std::unique_ptr<PowerManager> pm_;
  DeviceId disk_id_ = -1;
  std::unique_ptr<WriteBack> wb_;
  std::vector<WriteRecord> local_;
  std::vector<WriteRecord> to_log_;  // local/ records the write-back sent to the flash log
  std::vector<std::string> committed_;
  int batches_done_ = 0;
};

TEST_F(WriteBackTest, CommitsAQueuedFillToTheStore) {
  CacheEntry meta;
  meta.content_type = "text/plain";
  wb_->QueueFill("http://o/a", meta, "hello");
  Drain();
  ASSERT_NE(store_->index().Find("http://o/a"), nullptr);
  EXPECT_EQ(store_->index().Find("http://o/a")->size, 5u);
  EXPECT_EQ(ReadStored("http://o/a"), "hello");
  EXPECT_EQ(wb_->QueuedBodyOf("http://o/a"), nullptr);  // handed over: no longer in memory
  EXPECT_EQ(committed_, std::vector<std::string>{"http://o/a"});
  EXPECT_TRUE(local_.empty());
  EXPECT_GE(batches_done_, 1);
}

// Fills handed over while a batch is being written wait (in the write queue, merged and sorted
// by key, since the queue holds records that find the writer busy); the next write takes them
// all, so they share one group commit (one sqlite transaction), not one each.
TEST_F(WriteBackTest, FillsThatWaitForTheWriterShareOneTransaction) {
  wb_->QueueFill("http://o/first", CacheEntry{}, "x");  // the disk is awake: written at once
  ASSERT_TRUE(wb_->WritingBatch());
  const std::uint64_t before = store_->transactions();
  constexpr int kFills = 200;
  for (int i = 0; i < kFills; ++i) wb_->QueueFill("http://o/" + std::to_string(i), CacheEntry{}, std::string(512, 'a' + i % 26));
  Drain();
  EXPECT_EQ(store_->index().size(), static_cast<std::size_t>(kFills + 1));
  EXPECT_EQ(ReadStored("http://o/7"), std::string(512, 'a' + 7));
  EXPECT_EQ(ReadStored("http://o/199"), std::string(512, 'a' + 199 % 26));
  ASSERT_EQ(committed_.size(), static_cast<std::size_t>(kFills + 1));
  EXPECT_EQ(std::set<std::string>(committed_.begin(), committed_.end()).size(), committed_.size());
  // The first fill's transaction, then one or two for the 200 that waited (the old writer:
  // 200, one per batch).
  EXPECT_LE(store_->transactions() - before, 3u);
}

// The write queue holds what finds the writer busy only up to its cap: past it (and for a sync
// record) it hands a batch over at once, so batches pile up behind the write. The writer takes
// them all in its next write (TakeBacklog): one group commit, not one per batch. This is what
// the write-back's own merge adds to the queue's.
TEST_F(WriteBackTest, BatchesFlushedPastTheQueuesCapWhileWritingShareOneWrite) {
  WriteBackOptions o;
  o.queue.cap = 4 << 10;  // a batch every 8 fills of 512 bytes
  wb_.reset();
  wb_ = std::make_unique<WriteBack>(*pm_, disk_id_, *disk_, *store_, o);
  wb_->QueueFill("http://o/first", CacheEntry{}, "x");  // the disk is awake: written at once
  ASSERT_TRUE(wb_->WritingBatch());
  const std::uint64_t before = store_->transactions();
  const std::uint64_t writes_before = wb_->batches_written();
  constexpr int kFills = 200;
  for (int i = 0; i < kFills; ++i) {
    wb_->QueueFill("http://o/" + std::to_string(i), CacheEntry{}, std::string(512, 'a' + i % 26));
  }
  EXPECT_GE(wb_->queue().stats().flushes_cap, 20u);  // the queue did hand them over
  Drain();
  EXPECT_EQ(store_->index().size(), static_cast<std::size_t>(kFills + 1));
  EXPECT_EQ(ReadStored("http://o/199"), std::string(512, 'a' + 199 % 26));
  // The first fill's write, then one for the ~25 batches that waited behind it (or two, if
  // the last flush came after the writer took the backlog).
  EXPECT_LE(wb_->batches_written() - writes_before, 3u);
  EXPECT_LE(store_->transactions() - before, 3u);
  EXPECT_GE(wb_->most_merged(), 20u);
}

// Two queued writes of one local/ file are never in one write (io_uring would not keep their
// order): the second waits for the next.
TEST_F(WriteBackTest, TwoWritesOfOneLocalFileLandInOrder) {
  wb_->QueueFill("http://o/first", CacheEntry{}, "x");
  ASSERT_TRUE(wb_->WritingBatch());
  for (const char* data : {"one", "two"}) {
    WriteRecord r;
    r.kind = WriteKind::kLocalFile;
    r.key = "local:1:2";
    r.data = data;
    r.length = 3;
    wb_->queue().Add(std::move(r));
  }
  Drain();
  // Merged in the queue (the later write wins where they overlap) or written one after the
  // other: either way the file ends with "two", and "one" is never written after it.
  ASSERT_FALSE(local_.empty());
  EXPECT_EQ(local_.back().data, "two");
}

// The fill backlog's RAM is bounded: over it, a producer's WhenFillBacklogBelow waits (in
// order) until the store has taken enough fills; nothing is dropped.
TEST_F(WriteBackTest, AProducerWaitsWhileTheFillBacklogIsOverItsBound) {
  WriteBackOptions o;
  o.fill_backlog_max = 8 * WriteBack::FillCost("http://o/0", CacheEntry{}, 1000);
  wb_.reset();
  wb_ = std::make_unique<WriteBack>(*pm_, disk_id_, *disk_, *store_, o);
  int queued = 0;
  std::vector<int> ran;
  for (int i = 0; i < 40; ++i) {
    wb_->WhenFillBacklogBelow([this, i, &queued, &ran] {
      ran.push_back(i);
      wb_->QueueFill("http://o/" + std::to_string(i), CacheEntry{}, std::string(1000, 'z'));
      ++queued;
    });
  }
  // Queued until the bound, the rest wait.
  EXPECT_EQ(queued, 8);
  EXPECT_TRUE(wb_->OverFillBacklog());
  EXPECT_EQ(wb_->backlog_waiters(), 32u);
  EXPECT_LE(wb_->FillBacklogBytes(), o.fill_backlog_max);
  Drain();
  EXPECT_EQ(queued, 40);
  EXPECT_EQ(store_->index().size(), 40u);
  EXPECT_EQ(wb_->FillBacklogBytes(), 0u);
  // A fill is let in while the backlog is under the bound: it may pass it by one fill.
  EXPECT_LE(wb_->fill_backlog_peak(), o.fill_backlog_max + WriteBack::FillCost("http://o/39", CacheEntry{}, 1000));
  for (int i = 0; i < 40; ++i) EXPECT_EQ(ran[i], i);
  // A dropped or replaced fill leaves the count too (the first fill keeps the writer busy, so
  // the next two wait in the queue's backlog, where the second replaces the first).
  wb_->QueueFill("http://o/first", CacheEntry{}, "x");
  const Bytes first = WriteBack::FillCost("http://o/first", CacheEntry{}, 1);
  wb_->QueueFill("http://o/x", CacheEntry{}, "abc");
  wb_->QueueFill("http://o/x", CacheEntry{}, "abcd");
  EXPECT_EQ(wb_->FillBacklogBytes(), first + WriteBack::FillCost("http://o/x", CacheEntry{}, 4));
  EXPECT_TRUE(wb_->DropQueuedFill("http://o/x"));
  EXPECT_EQ(wb_->FillBacklogBytes(), first);
  Drain();
  EXPECT_EQ(wb_->FillBacklogBytes(), 0u);
  EXPECT_EQ(store_->index().Find("http://o/x"), nullptr);
}

TEST_F(WriteBackTest, RoutesLocalFileRecordsToTheLocalWriter) {
  WriteRecord r;
  r.kind = WriteKind::kLocalFile;
  r.key = "local:1:2";
  r.data = "abc";
  r.length = 3;
  wb_->queue().Add(std::move(r));
  Drain();
  ASSERT_EQ(local_.size(), 1u);
  EXPECT_EQ(local_[0].key, "local:1:2");
  EXPECT_EQ(local_[0].data, "abc");
  EXPECT_EQ(store_->index().size(), 0u);
  EXPECT_TRUE(committed_.empty());
}

// The kind routes a record, not its key's text: a local file whose identity happens to look
// like a fill's key is still written into the file.
TEST_F(WriteBackTest, RoutesByKindNotByKeyPrefix) {
  WriteRecord r;
  r.kind = WriteKind::kLocalFile;
  r.key = WriteBack::FillKey("http://o/a");
  r.data = "xyz";
  r.length = 3;
  wb_->queue().Add(std::move(r));
  Drain();
  ASSERT_EQ(local_.size(), 1u);
  EXPECT_EQ(local_[0].key, "fill:http://o/a");
  EXPECT_EQ(store_->index().Find("http://o/a"), nullptr);
  EXPECT_TRUE(committed_.empty());
}

TEST_F(WriteBackTest, AFillRecordWithoutItsQueuedBodyWritesNothing) {
  // What the queue holds after an invalidate dropped the fill (the writer skips it).
  WriteRecord r;
  r.kind = WriteKind::kFill;
  r.key = WriteBack::FillKey("http://o/gone");
  r.length = 4;
  wb_->queue().Add(std::move(r));
  Drain();
  EXPECT_EQ(store_->index().Find("http://o/gone"), nullptr);
  EXPECT_TRUE(committed_.empty());
  EXPECT_TRUE(local_.empty());
}

TEST_F(WriteBackTest, IndexUpdatesAreNeitherFillsNorLocalWrites) {
  wb_->QueueFill("http://o/a", CacheEntry{}, "hello");
  Drain();
  ASSERT_TRUE(store_->UpdateMeta("http://o/a", [](CacheEntry& e) { e.etag = "\"v2\""; }).ok());
  wb_->QueueIndexUpdate("http://o/a");
  Drain();
  EXPECT_TRUE(wb_->queue().idle());
  EXPECT_EQ(committed_, std::vector<std::string>{"http://o/a"});  // the fill only
  EXPECT_TRUE(local_.empty());
  EXPECT_EQ(ReadStored("http://o/a"), "hello");  // the body stays
  EXPECT_EQ(store_->index().Find("http://o/a")->etag, "\"v2\"");
}

// With a flash log that takes writes (here: it holds a record, so a write must not overtake it
// on the way to the disk), local/ records go to the log and the disk does no work for them.
TEST_F(WriteBackTest, RoutesLocalFileRecordsToTheFlashLogWhileItTakesWrites) {
  FlashLogOptions o;
  o.dir = root_ + "/flash";
  o.capacity = 1 << 20;
  o.buffer = 64 << 10;
  Result<std::unique_ptr<LocalFlashLog>> flash =
      LocalFlashLog::Open(o, *io_, root_ + "/local", *pm_, disk_id_, *disk_, nullptr);
  ASSERT_TRUE(flash.ok()) << flash.status().ToString();
  wb_->SetFlashLog(flash->get());
  auto add = [this](const std::string& data) {
    WriteRecord r;
    r.kind = WriteKind::kLocalFile;
    r.key = "local:1:2";
    r.data = data;
    r.length = data.size();
    wb_->queue().Add(std::move(r));
    Drain();
  };
  add("before");  // the log is empty and the disk ready: to the disk
  ASSERT_EQ(local_.size(), 1u);
  EXPECT_TRUE(to_log_.empty());
  bool appended = false;
  (*flash)->log().AppendWrite(LogRecordKind::kLocalWrite, "fh:1:00", 0, "held",
                              [&](Result<std::uint64_t>) { appended = true; });
  for (int i = 0; i < 100 && !appended; ++i) event_base_loop(base_, EVLOOP_NONBLOCK);
  ASSERT_TRUE(appended);
  ASSERT_TRUE((*flash)->TakesWrites());
  add("after");
  ASSERT_EQ(to_log_.size(), 1u);
  EXPECT_EQ(to_log_[0].data, "after");
  EXPECT_EQ(local_.size(), 1u);  // nothing more went to the disk
  wb_->SetFlashLog(nullptr);
  wb_.reset();  // before the log it borrowed
}

// Fills spilled to the flash log (write_back.h): with the disk asleep under a deferring policy,
// a fill past the queue's cap goes to the log (the disk does nothing), reads back from there,
// and the log's flush commits it to the store.
TEST_F(WriteBackTest, AFillPastTheCapWithTheDiskAsleepGoesToTheFlashLogAndItsFlushCommitsIt) {
  std::unique_ptr<Device> drive = AsleepMicrodrive();
  Device& asleep = *drive;
  DeviceId id = pm_->Register(&asleep, std::make_unique<ExpertsDiskPolicy>());
  auto wbp = std::make_unique<WriteBack>(*pm_, id, asleep, *store_, WriteBackOptions{SmallQueue()});
  WriteBack& wb = *wbp;
  const FlashLogOptions o = SpillLogOptions();
  Result<std::unique_ptr<LocalFlashLog>> flash = LocalFlashLog::Open(o, *io_, root_ + "/local", *pm_, id, asleep, nullptr);
  ASSERT_TRUE(flash.ok()) << flash.status().ToString();
  wb.SetFlashLog(flash->get());
  ASSERT_TRUE((*flash)->TakesFills());
  std::string body(200 << 10, '\0');
  for (std::size_t i = 0; i < body.size(); ++i) body[i] = static_cast<char>(i * 13 % 253);
  CacheEntry meta;
  meta.etag = "\"v1\"";
  meta.content_type = "application/x-test";
  wb.QueueFill("http://o/big", meta, body);  // past the 64K cap: a batch that would wake the disk
  for (int i = 0; i < 100 && !(wb.queue().idle() && (*flash)->log().records().size() > 0); ++i) {
    clock_.RunUntilIdle();
    event_base_loop(base_, EVLOOP_NONBLOCK);
  }
  EXPECT_EQ(asleep.mode(), kStandby);
  EXPECT_EQ(asleep.target_mode(), kStandby);
  EXPECT_EQ(store_->index().Find("http://o/big"), nullptr);
  EXPECT_TRUE(wb.Logged("http://o/big"));
  EXPECT_TRUE(wb.FillPending("http://o/big"));
  ASSERT_NE(wb.QueuedMeta("http://o/big"), nullptr);
  EXPECT_EQ(wb.QueuedMeta("http://o/big")->etag, "\"v1\"");
  const QueuedBody* q = wb.QueuedBodyOf("http://o/big");
  ASSERT_NE(q, nullptr);
  EXPECT_TRUE(*q->data == body);  // read back from the log
  bool flushed = false;
  (*flash)->log().Flush(LogFlushReason::kExplicit, [&](const FlushReport&) { flushed = true; });
  for (int i = 0; i < 1000 && !flushed; ++i) {
    clock_.RunUntilIdle();
    event_base_loop(base_, EVLOOP_NONBLOCK);
  }
  ASSERT_TRUE(flushed);
  EXPECT_TRUE((*flash)->log().records().empty());
  const CacheEntry* e = store_->index().Find("http://o/big");
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->size, body.size());
  EXPECT_EQ(e->etag, "\"v1\"");
  EXPECT_EQ(e->content_type, "application/x-test");
  EXPECT_FALSE(wb.Logged("http://o/big"));
  EXPECT_FALSE(wb.FillPending("http://o/big"));
  wb.SetFlashLog(nullptr);
  flash->reset();  // both unsubscribe from the disk before it is deregistered
  wbp.reset();
  pm_->Deregister(id);
}

// A fill a former run spilled to the log (the daemon killed before the log's flush) is readable
// from the log when the next run attaches the log, until the mount's replay puts it in the
// store; a fill whose commit a torn tail cut is not offered (the replay drops it too).
TEST_F(WriteBackTest, AFillLeftInTheLogByAFormerRunIsReadableUntilTheReplayAppliesIt) {
  std::unique_ptr<Device> drive = AsleepMicrodrive();
  Device& asleep = *drive;
  DeviceId id = pm_->Register(&asleep, std::make_unique<ExpertsDiskPolicy>());
  const FlashLogOptions o = SpillLogOptions();
  std::string body(200 << 10, '\0');
  for (std::size_t i = 0; i < body.size(); ++i) body[i] = static_cast<char>(i * 13 % 253);
  auto spin = [&](auto done) {
    for (int i = 0; i < 1000 && !done(); ++i) {
      clock_.RunUntilIdle();
      event_base_loop(base_, EVLOOP_NONBLOCK);
    }
  };
  {
    // The former run: both fills spill to the log, then the daemon is gone.
    auto wb = std::make_unique<WriteBack>(*pm_, id, asleep, *store_, WriteBackOptions{SmallQueue()});
    Result<std::unique_ptr<LocalFlashLog>> flash = LocalFlashLog::Open(o, *io_, root_ + "/local", *pm_, id, asleep, nullptr);
    ASSERT_TRUE(flash.ok()) << flash.status().ToString();
    wb->SetFlashLog(flash->get());
    CacheEntry meta;
    meta.etag = "\"v1\"";
    wb->QueueFill("http://o/big", meta, body);
    spin([&] { return wb->queue().idle() && wb->Logged("http://o/big"); });
    ASSERT_TRUE(wb->Logged("http://o/big"));
    wb->QueueFill("http://o/torn", meta, std::string(100 << 10, 't'));
    spin([&] { return wb->queue().idle() && wb->Logged("http://o/torn"); });
    ASSERT_TRUE(wb->Logged("http://o/torn"));
    wb->SetFlashLog(nullptr);
    flash->reset();
  }
  // The last fill's commit record torn off by the crash.
  const std::string log_file = o.dir + "/flash.log";
  ASSERT_EQ(::truncate(log_file.c_str(), static_cast<off_t>(std::filesystem::file_size(log_file) - 3)), 0);
  auto wb = std::make_unique<WriteBack>(*pm_, id, asleep, *store_, WriteBackOptions{SmallQueue()});
  Result<std::unique_ptr<LocalFlashLog>> flash = LocalFlashLog::Open(o, *io_, root_ + "/local", *pm_, id, asleep, nullptr);
  ASSERT_TRUE(flash.ok()) << flash.status().ToString();
  wb->SetFlashLog(flash->get());
  EXPECT_EQ(store_->index().Find("http://o/big"), nullptr);
  EXPECT_TRUE(wb->Logged("http://o/big"));
  ASSERT_NE(wb->QueuedMeta("http://o/big"), nullptr);
  EXPECT_EQ(wb->QueuedMeta("http://o/big")->etag, "\"v1\"");
  const QueuedBody* q = wb->QueuedBodyOf("http://o/big");
  ASSERT_NE(q, nullptr);
  EXPECT_TRUE(*q->data == body);  // read from the log
  EXPECT_FALSE(wb->Logged("http://o/torn"));
  EXPECT_EQ(wb->QueuedBodyOf("http://o/torn"), nullptr);
  bool replayed = false;
  (*flash)->SetFlushListener([&](const FlushReport&) { replayed = true; });
  (*flash)->Replay();
  spin([&] { return replayed; });
  ASSERT_TRUE(replayed);
  const CacheEntry* e = store_->index().Find("http://o/big");
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->size, body.size());
  EXPECT_FALSE(wb->Logged("http://o/big"));
  EXPECT_EQ(store_->index().Find("http://o/torn"), nullptr);
  wb->SetFlashLog(nullptr);
  flash->reset();
  wb.reset();
  pm_->Deregister(id);
}

// Round 19 (files19): a fill's metadata in the flash log (its commit record) read back with
// nlohmann's value(), which throws type_error on a field of another type: SetFlashLog (the
// mount's start) threw, so ghostfs aborted at every mount while the log held the record. A
// time out of range (INT64_MIN, a float) was undefined behaviour. Now each is a Corruption
// (the replay logs "dropping the logged fill PATH: ..." and goes on: a fill is the origin's
// bytes, fetched again on the next read).
TEST_F(WriteBackTest, DamagedFillMetadataIsCorruptionNotAnException) {
  for (const char* text : {R"({"etag":5})", R"({"response":{"status":200}})", R"({"content_type":null})",
                           R"({"fetched_us":"1"})", R"({"fetched_us":1e300})",
                           R"({"fetched_us":-9223372036854775808})", R"({"expires_us":"x"})",
                           R"({"expires_us":9223372036854775807})"}) {
    Result<CacheEntry> e = wb_->DecodeFillMeta(text);
    EXPECT_FALSE(e.ok()) << text;
    if (!e.ok()) {
      EXPECT_EQ(e.status().code(), Status::Code::kCorruption) << text;
    }
  }
  for (const char* text : {"", "{", "[1]", "\xff"}) EXPECT_FALSE(wb_->DecodeFillMeta(text).ok()) << text;
  // What EncodeFillMeta writes still reads back.
  CacheEntry meta;
  meta.etag = "\"v2\"";
  meta.content_type = "text/plain";
  meta.response = R"({"status":200})";
  meta.fetched = clock_.Now();
  meta.expires = clock_.Now() + Seconds(60);
  Result<CacheEntry> back = wb_->DecodeFillMeta(wb_->EncodeFillMeta(meta));
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->etag, meta.etag);
  EXPECT_EQ(back->response, meta.response);
  ASSERT_TRUE(back->expires.has_value());
  EXPECT_LT(std::abs(ToSeconds(*back->expires - clock_.Now()) - 60.0), 1.0);
}

// The same end to end: a former run left a fill with such metadata in the log; the next run
// attaches the log (SetFlashLog threw before) and replays it: the good fill is applied, the
// damaged one is not offered for reads and not stored.
TEST_F(WriteBackTest, AFillWithDamagedMetadataInTheLogDoesNotStopTheMount) {
  std::unique_ptr<Device> drive = AsleepMicrodrive();
  Device& asleep = *drive;
  DeviceId id = pm_->Register(&asleep, std::make_unique<ExpertsDiskPolicy>());
  const FlashLogOptions o = SpillLogOptions();
  auto spin = [&](auto done) {
    for (int i = 0; i < 1000 && !done(); ++i) {
      clock_.RunUntilIdle();
      event_base_loop(base_, EVLOOP_NONBLOCK);
    }
  };
  {
    Result<std::unique_ptr<LocalFlashLog>> flash = LocalFlashLog::Open(o, *io_, root_ + "/local", *pm_, id, asleep, nullptr);
    ASSERT_TRUE(flash.ok()) << flash.status().ToString();
    int logged = 0;
    auto done = [&](Result<std::string> r) {
      EXPECT_TRUE(r.ok());
      ++logged;
    };
    (*flash)->AppendFill("http://o/bad", std::make_shared<const std::string>("bad body"), R"({"etag":5,"fetched_us":"x"})", done);
    (*flash)->AppendFill("http://o/good", std::make_shared<const std::string>("good body"), R"({"etag":"\"g\""})", done);
    spin([&] { return logged == 2; });
    ASSERT_EQ(logged, 2);
    flash->reset();
  }
  auto wb = std::make_unique<WriteBack>(*pm_, id, asleep, *store_, WriteBackOptions{SmallQueue()});
  Result<std::unique_ptr<LocalFlashLog>> flash = LocalFlashLog::Open(o, *io_, root_ + "/local", *pm_, id, asleep, nullptr);
  ASSERT_TRUE(flash.ok()) << flash.status().ToString();
  EXPECT_NO_THROW(wb->SetFlashLog(flash->get()));  // threw type_error 302 before
  EXPECT_TRUE(wb->Logged("http://o/good"));
  EXPECT_FALSE(wb->Logged("http://o/bad"));
  bool replayed = false;
  (*flash)->SetFlushListener([&](const FlushReport&) { replayed = true; });
  (*flash)->Replay();
  spin([&] { return replayed; });
  ASSERT_TRUE(replayed);
  const CacheEntry* good = store_->index().Find("http://o/good");
  ASSERT_NE(good, nullptr);
  EXPECT_EQ(good->etag, "\"g\"");
  EXPECT_EQ(store_->index().Find("http://o/bad"), nullptr);
  wb->SetFlashLog(nullptr);
  flash->reset();
  wb.reset();
  pm_->Deregister(id);
}

}  // namespace
}  // namespace ghost
