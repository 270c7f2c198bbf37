#include "common/cache/write_queue.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "common/base/clock.h"
#include "common/power/device.h"
#include "common/power/power_manager.h"
#include "common/power/profile.h"

namespace ghost {
namespace {

constexpr Bytes kMiB = 1024 * 1024;
constexpr int kPerformanceIdle = 0;
constexpr int kStandby = 2;

// Leaves the disk's modes to the test; only answers whether background writes wait.
class TestPolicy : public DevicePolicy {
 public:
  explicit TestPolicy(const bool* defers) : defers_(defers) {}
  bool DefersBackgroundWrites() const override { return *defers_; }
  std::string name() const override { return "test"; }

 private:
  const bool* defers_;  // borrowed from the fixture
};

WriteRecord Record(std::string key, Bytes offset, std::string data) {
  WriteRecord r;
  r.key = std::move(key);
  r.offset = offset;
  r.length = data.size();
  r.data = std::move(data);
  return r;
}

WriteRecord Sized(std::string key, Bytes offset, Bytes length) {
  WriteRecord r;
  r.key = std::move(key);
  r.offset = offset;
  r.length = length;
  return r;
}

class WriteQueueTest : public ::testing::Test {
 protected:
  void SetUp() override {
    Result<DeviceProfile> profile = LoadDeviceProfile("microdrive-1gb", GHOST_PROFILE_DIR);
    ASSERT_TRUE(profile.ok()) << profile.status().ToString();
    disk_ = std::make_unique<Device>(clock_, *profile, nullptr, kPerformanceIdle);
    pm_ = std::make_unique<PowerManager>(clock_, Power::Milliwatts(1440), 50);
    disk_id_ = pm_->Register(disk_.get(), std::make_unique<TestPolicy>(&defers_));
    // The simulator's writer: one disk write of the batch's total size.
    queue_ = std::make_unique<WriteQueue>(
        *pm_, disk_id_, WriteQueueOptions{},
        [this](std::vector<WriteRecord> batch, std::function<void()> done) {
          Bytes total = 0;
          for (const WriteRecord& r : batch) total += r.length;
          batches_.push_back(std::move(batch));
          disk_->Submit(IoRequest{total, /*write=*/true}, [this, done = std::move(done)] {
            ++durable_;
            done();
          });
        });
  }

  void PutDiskInStandby() {
    disk_->RequestMode(kStandby);
    clock_.RunUntilIdle();
    ASSERT_EQ(disk_->mode(), kStandby);
  }

  VirtualClock clock_;
  bool defers_ = true;
  std::unique_ptr<Device> disk_;
  std::unique_ptr<PowerManager> pm_;  // after disk_: deregisters it before it is destroyed
  DeviceId disk_id_ = -1;
  std::unique_ptr<WriteQueue> queue_;
  std::vector<std::vector<WriteRecord>> batches_;
  int durable_ = 0;
};

TEST_F(WriteQueueTest, DefersWritesWhileDiskIsInLowPowerMode) {
  PutDiskInStandby();
  int transitions = pm_->meter().Read().devices[0].transitions;
  queue_->Add(Sized("a", 0, 4096));
  queue_->Add(Sized("b", 0, 8192));
  clock_.AdvanceBy(Seconds(600));
  EXPECT_TRUE(batches_.empty());
  EXPECT_EQ(disk_->mode(), kStandby);
  EXPECT_EQ(pm_->meter().Read().devices[0].transitions, transitions);  // never woke
  EXPECT_EQ(queue_->queued_records(), 2u);
  EXPECT_EQ(queue_->queued_bytes(), 12288u);
  EXPECT_EQ(queue_->stats().records_queued, 2u);
  queue_->AssertInvariants();
}

TEST_F(WriteQueueTest, DefersWhileDiskIsSteppingDownFromHighPowerMode) {
  disk_->RequestMode(kStandby);  // transition under way: mode 0, heading to standby
  ASSERT_EQ(disk_->mode(), kPerformanceIdle);
  queue_->Add(Sized("a", 0, 100));
  clock_.RunUntilIdle();
  EXPECT_TRUE(batches_.empty());
  EXPECT_EQ(disk_->mode(), kStandby);
}

TEST_F(WriteQueueTest, FlushesWhenDiskEntersHighPowerMode) {
  PutDiskInStandby();
  queue_->Add(Sized("b", 0, 1000));
  queue_->Add(Sized("a", 0, 500));
  EXPECT_TRUE(batches_.empty());
  disk_->RequestMode(kPerformanceIdle);
  clock_.RunUntilIdle();
  ASSERT_EQ(batches_.size(), 1u);
  ASSERT_EQ(batches_[0].size(), 2u);
  EXPECT_EQ(batches_[0][0].key, "a");  // sorted by key
  EXPECT_EQ(batches_[0][1].key, "b");
  EXPECT_EQ(durable_, 1);
  EXPECT_EQ(queue_->stats().flushes_power_callback, 1u);
  EXPECT_EQ(queue_->stats().batches_flushed, 1u);
  EXPECT_EQ(queue_->stats().bytes_flushed, 1500u);
  EXPECT_TRUE(queue_->idle());
  EXPECT_FALSE(queue_->Contains("a"));
}

TEST_F(WriteQueueTest, FlushesWhenQueueExceedsCap) {
  PutDiskInStandby();
  for (int i = 0; i < 4; ++i) queue_->Add(Sized("k" + std::to_string(i), 0, kMiB));
  clock_.RunUntilIdle();
  EXPECT_TRUE(batches_.empty());  // exactly 4 MiB does not exceed the cap
  EXPECT_EQ(disk_->mode(), kStandby);
  queue_->Add(Sized("k4", 0, 1));
  ASSERT_EQ(batches_.size(), 1u);  // handed over at once; the write spins the disk up
  EXPECT_EQ(batches_[0].size(), 5u);
  EXPECT_EQ(queue_->stats().flushes_cap, 1u);
  EXPECT_EQ(queue_->queued_bytes(), 0u);
  clock_.RunUntilIdle();
  EXPECT_EQ(durable_, 1);
  EXPECT_EQ(disk_->mode(), kPerformanceIdle);
  EXPECT_EQ(batches_.size(), 1u);  // the spin-up's power callback found nothing left
}

TEST_F(WriteQueueTest, MergesOverlappingAndAdjacentRecordsLaterWins) {
  PutDiskInStandby();
  queue_->Add(Record("b", 5, "x"));
  queue_->Add(Record("a", 6, "cc"));    // adjacent to the next one's end
  queue_->Add(Record("a", 2, "BBBB"));  // [2,6)
  queue_->Add(Record("a", 0, "aaa"));   // [0,3): overwrites the first B
  queue_->Add(Record("a", 10, "zz"));   // a gap before it: stays separate
  queue_->Add(Record("b", 5, "y"));     // same byte again: later wins
  disk_->RequestMode(kPerformanceIdle);
  clock_.RunUntilIdle();
  ASSERT_EQ(batches_.size(), 1u);
  const std::vector<WriteRecord>& batch = batches_[0];
  ASSERT_EQ(batch.size(), 3u);
  EXPECT_EQ(batch[0].key, "a");
  EXPECT_EQ(batch[0].offset, 0u);
  EXPECT_EQ(batch[0].length, 8u);
  EXPECT_EQ(batch[0].data, "aaaBBBcc");
  EXPECT_EQ(batch[1].key, "a");
  EXPECT_EQ(batch[1].offset, 10u);
  EXPECT_EQ(batch[1].data, "zz");
  EXPECT_EQ(batch[2].key, "b");
  EXPECT_EQ(batch[2].offset, 5u);
  EXPECT_EQ(batch[2].data, "y");
  EXPECT_EQ(queue_->stats().records_flushed, 3u);
  EXPECT_EQ(queue_->stats().bytes_flushed, 11u);
}

TEST_F(WriteQueueTest, DiscardDropsTheQueuedRecordsOfOneKeyOnly) {
  PutDiskInStandby();
  queue_->Add(Record("gone", 0, "aaaa"));
  queue_->Add(Record("gone", 8, "bb"));
  queue_->Add(Record("kept", 0, "ccc"));
  queue_->Discard("gone");
  queue_->Discard("never-queued");
  EXPECT_FALSE(queue_->Contains("gone"));
  EXPECT_EQ(queue_->queued_records(), 1u);
  EXPECT_EQ(queue_->queued_bytes(), 3u);
  queue_->AssertInvariants();
  disk_->RequestMode(kPerformanceIdle);
  clock_.RunUntilIdle();
  ASSERT_EQ(batches_.size(), 1u);
  ASSERT_EQ(batches_[0].size(), 1u);
  EXPECT_EQ(batches_[0][0].key, "kept");
}

TEST_F(WriteQueueTest, MergedRecordsKeepTheirKind) {
  PutDiskInStandby();
  WriteRecord a = Record("local:1", 0, "ab");
  a.kind = WriteKind::kLocalFile;
  WriteRecord b = Record("local:1", 2, "cd");
  b.kind = WriteKind::kLocalFile;
  queue_->Add(std::move(a));
  queue_->Add(std::move(b));
  queue_->Add(Record("fill:x", 0, "z"));
  disk_->RequestMode(kPerformanceIdle);
  clock_.RunUntilIdle();
  ASSERT_EQ(batches_.size(), 1u);
  ASSERT_EQ(batches_[0].size(), 2u);
  EXPECT_EQ(batches_[0][0].key, "fill:x");
  EXPECT_EQ(batches_[0][0].kind, WriteKind::kCache);
  EXPECT_EQ(batches_[0][1].data, "abcd");
  EXPECT_EQ(batches_[0][1].kind, WriteKind::kLocalFile);
}

TEST_F(WriteQueueTest, MergeKeepsBytesOfAnOlderRecordAroundANewerOneInside) {
  WriteRecord outer = Record("f", 0, "0123456789");
  WriteRecord inner = Record("f", 3, "xyz");
  std::vector<WriteRecord> merged = MergeWriteRecords({&outer, &inner});
  ASSERT_EQ(merged.size(), 1u);
  EXPECT_EQ(merged[0].data, "012xyz6789");
  merged = MergeWriteRecords({&inner, &outer});  // newer covers older entirely
  ASSERT_EQ(merged.size(), 1u);
  EXPECT_EQ(merged[0].data, "0123456789");
}

TEST_F(WriteQueueTest, ReadsSeeQueuedData) {
  PutDiskInStandby();
  queue_->Add(Record("a", 0, "hello"));
  queue_->Add(Record("a", 5, " world"));
  queue_->Add(Record("a", 0, "J"));
  EXPECT_TRUE(queue_->Contains("a"));
  EXPECT_FALSE(queue_->Contains("b"));
  EXPECT_EQ(queue_->Read("a", 0, 11), "Jello world");
  EXPECT_EQ(queue_->Read("a", 3, 5), "lo wo");
  EXPECT_EQ(queue_->Read("a", 8, 4), std::nullopt);  // runs past the queued bytes
  EXPECT_EQ(queue_->Read("b", 0, 1), std::nullopt);
  EXPECT_EQ(queue_->QueuedBytes("a"), 11u);
  EXPECT_TRUE(queue_->Covers("a", 2, 9));
  EXPECT_FALSE(queue_->Covers("a", 2, 10));

  // Still readable while the batch is with the writer, gone once durable.
  disk_->RequestMode(kPerformanceIdle);
  while (batches_.empty() && clock_.RunNext()) {
  }
  ASSERT_EQ(batches_.size(), 1u);
  ASSERT_EQ(durable_, 0);
  EXPECT_EQ(queue_->Read("a", 0, 11), "Jello world");
  queue_->Add(Record("a", 6, "W"));  // disk awake now: straight to the writer, still readable
  EXPECT_EQ(queue_->Read("a", 0, 11), "Jello World");
  clock_.RunUntilIdle();
  EXPECT_EQ(durable_, 2);
  EXPECT_FALSE(queue_->Contains("a"));
  EXPECT_EQ(queue_->Read("a", 0, 1), std::nullopt);
}

TEST_F(WriteQueueTest, ReadsOfRecordsWithoutDataSeeZerosInSimulation) {
  PutDiskInStandby();
  queue_->Add(Sized("a", 0, 4));
  EXPECT_EQ(queue_->Read("a", 1, 2), std::string(2, '\0'));
  EXPECT_EQ(queue_->QueuedBytes("a"), 4u);
}

TEST_F(WriteQueueTest, WritesAtOnceWhenPolicyDoesNotDefer) {
  PutDiskInStandby();
  defers_ = false;
  queue_->Add(Sized("a", 0, 4096));
  ASSERT_EQ(batches_.size(), 1u);  // the baseline spins the disk up by writing
  EXPECT_EQ(batches_[0][0].key, "a");
  EXPECT_EQ(queue_->queued_records(), 0u);
  clock_.RunUntilIdle();
  EXPECT_EQ(durable_, 1);
  EXPECT_EQ(disk_->mode(), kPerformanceIdle);
  EXPECT_EQ(queue_->stats().records_written_at_once, 1u);
  EXPECT_EQ(queue_->stats().batches_flushed, 0u);
}

TEST_F(WriteQueueTest, WritesAtOnceWhenDiskIsInHighPowerMode) {
  queue_->Add(Sized("a", 0, 4096));
  EXPECT_EQ(batches_.size(), 1u);
  EXPECT_EQ(queue_->stats().records_written_at_once, 1u);
}

TEST_F(WriteQueueTest, WritesWhileTheWriterIsBusyWaitAndGoAsOneMergedBatch) {
  // The disk is spinning: the first write goes at once; the next 511 find the writer busy
  // with it and must not become 511 batches (one disk access each: 68 ms apiece on the
  // microdrive, so an fsync after 4 MiB of 8 KiB writes waited 39 s).
  for (int i = 0; i < 512; ++i) queue_->Add(Sized("a", static_cast<Bytes>(i) * 8192, 8192));
  ASSERT_EQ(batches_.size(), 1u);
  EXPECT_EQ(queue_->queued_records(), 511u);
  EXPECT_EQ(queue_->QueuedEnd("a"), 512u * 8192);
  bool synced = false;
  clock_.RunUntilIdle();
  ASSERT_EQ(batches_.size(), 2u);  // the rest went as one batch when the first was durable
  ASSERT_EQ(batches_[1].size(), 1u);
  EXPECT_EQ(batches_[1][0].offset, 8192u);
  EXPECT_EQ(batches_[1][0].length, 511u * 8192);
  EXPECT_TRUE(queue_->idle());
  // A sync record does not wait for the writer: it goes (with the waiting records) at once.
  queue_->Add(Sized("b", 0, 10));
  queue_->Add(Sized("b", 10, 10));
  queue_->AddSync(Sized("b", 20, 10), [&] { synced = true; });
  ASSERT_EQ(batches_.size(), 4u);
  EXPECT_EQ(batches_[3][0].length, 20u);
  clock_.RunUntilIdle();
  EXPECT_TRUE(synced);
  EXPECT_TRUE(queue_->idle());
  EXPECT_EQ(batches_.size(), 4u);
}

TEST_F(WriteQueueTest, WriteWhileOlderWritesAreQueuedGoesWithThemInOrder) {
  PutDiskInStandby();
  queue_->Add(Record("a", 0, "old"));
  defers_ = false;  // e.g. the knob moved to a policy that writes through
  queue_->Add(Record("a", 0, "new"));
  ASSERT_EQ(batches_.size(), 1u);
  ASSERT_EQ(batches_[0].size(), 1u);
  EXPECT_EQ(batches_[0][0].data, "new");
}

TEST_F(WriteQueueTest, SyncForcesFlushAndReportsWhenDurable) {
  PutDiskInStandby();
  queue_->Add(Sized("a", 0, 100));
  bool synced = false;
  queue_->AddSync(Record("b", 0, "user data"), [&] { synced = true; });
  ASSERT_EQ(batches_.size(), 1u);
  EXPECT_EQ(batches_[0].size(), 2u);  // the whole queue goes with it
  EXPECT_TRUE(batches_[0][1].sync);
  EXPECT_FALSE(synced);
  clock_.RunUntilIdle();
  EXPECT_TRUE(synced);
  EXPECT_EQ(durable_, 1);
  EXPECT_EQ(queue_->stats().flushes_sync, 1u);
}

TEST_F(WriteQueueTest, RecordsAddedDuringAFlushGoInTheNextBatch) {
  PutDiskInStandby();
  queue_->Add(Sized("a", 0, 100));
  disk_->RequestMode(kPerformanceIdle);
  while (batches_.empty() && clock_.RunNext()) {
  }
  ASSERT_EQ(batches_.size(), 1u);
  disk_->RequestMode(kStandby);  // steps down after the write: new writes must wait
  queue_->Add(Sized("b", 0, 200));
  clock_.RunUntilIdle();
  ASSERT_EQ(batches_.size(), 1u);
  EXPECT_EQ(queue_->queued_records(), 1u);
  disk_->RequestMode(kPerformanceIdle);
  clock_.RunUntilIdle();
  ASSERT_EQ(batches_.size(), 2u);
  EXPECT_EQ(batches_[1][0].key, "b");
  EXPECT_EQ(queue_->stats().flushes_power_callback, 2u);
}

TEST_F(WriteQueueTest, FlushAllSpinsDiskUpAndReportsWhenEverythingIsDurable) {
  PutDiskInStandby();
  queue_->Add(Sized("a", 0, 100));
  bool flushed = false;
  queue_->FlushAll([&] { flushed = true; });
  EXPECT_EQ(batches_.size(), 1u);
  EXPECT_FALSE(flushed);
  clock_.RunUntilIdle();
  EXPECT_TRUE(flushed);
  EXPECT_TRUE(queue_->idle());
  EXPECT_EQ(queue_->stats().flushes_explicit, 1u);
  bool again = false;
  queue_->FlushAll([&] { again = true; });  // nothing pending: still answers, on the next turn
  EXPECT_FALSE(again);
  clock_.RunUntilIdle();
  EXPECT_TRUE(again);
  EXPECT_EQ(batches_.size(), 1u);
}

}  // namespace
}  // namespace ghost
