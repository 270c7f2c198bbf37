#include "common/sim/flash_sim.h"

#include <gtest/gtest.h>

#include "common/sim/trace_gen.h"

namespace ghost {
namespace {

Trace NvTrace() {
  BlockTraceOptions o;
  o.seed = 1;
  o.disk_sectors = (40u << 20) / kSectorSize;
  o.hot_space_fraction = 0.02;
  return GenerateBlockTrace(o);
}

DeviceProfile Load(const char* name) {
  auto d = LoadDeviceProfile(name, GHOST_PROFILE_DIR);
  EXPECT_TRUE(d.ok()) << d.status().ToString();
  return *d;
}

FlashSimResult RunLog(LogFlushPolicy p, FlushAlgorithm a) {
  DeviceProfile disk = Load("cu140"), card = Load("intel-flash");
  FlashSimOptions o;
  o.log_capacity = 2 << 20;
  o.policy = p;
  o.algorithm = a;
  auto r = SimulateFlash(disk, &card, NvTrace(), o);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return *r;
}

TEST(FlashSimTest, SortMergeFlushesFasterThanOneRecordAtATimeAndMergesBytesAway) {
  FlashSimResult one = RunLog(LogFlushPolicy::kWhenFull, FlushAlgorithm::kOneRecord);
  FlashSimResult four = RunLog(LogFlushPolicy::kWhenFull, FlushAlgorithm::kSortMerge);
  EXPECT_LT(four.flush_time, one.flush_time);
  EXPECT_GT(four.bytes_merged_away, 0u);
  EXPECT_EQ(one.bytes_merged_away, 0u);
  EXPECT_EQ(one.bytes_flushed, one.bytes_logged);
}

TEST(FlashSimTest, WhenFullFlushesLessOftenThanEachSpinUp) {
  FlashSimResult each = RunLog(LogFlushPolicy::kEachSpinUp, FlushAlgorithm::kSortMerge);
  FlashSimResult full = RunLog(LogFlushPolicy::kWhenFull, FlushAlgorithm::kSortMerge);
  EXPECT_LT(full.flushes, each.flushes);
  EXPECT_GT(each.flushes_by_reason[static_cast<int>(LogFlushReason::kSpinUp)], 0u);
  EXPECT_EQ(full.flushes_by_reason[static_cast<int>(LogFlushReason::kSpinUp)], 0u);
  EXPECT_LE(full.flush_time, each.flush_time);
}

TEST(FlashSimTest, FlashDevicesUseLessEnergyThanTheDiskAndWriteSlowerThanTheyRead) {
  Trace t = NvTrace();
  FlashSimOptions o;
  auto disk = SimulateFlash(Load("cu140"), nullptr, t, o);
  auto sdp = SimulateFlash(Load("sdp10"), nullptr, t, o);
  auto card = SimulateFlash(Load("intel-flash"), nullptr, t, o);
  ASSERT_TRUE(disk.ok() && sdp.ok() && card.ok());
  EXPECT_LT(sdp->energy, disk->energy);
  EXPECT_LT(card->energy, disk->energy);
  EXPECT_GT(sdp->mean_write_ms, sdp->mean_read_ms);
  EXPECT_GT(card->mean_write_ms, card->mean_read_ms);
}

TEST(FlashSimTest, AFullerFlashCardCostsMoreEnergyAndErasures) {
  Trace t = NvTrace();
  FlashSimOptions o;
  o.cleaning = CleaningPolicy::kOnDemand;
  o.utilisation = 0.4;
  auto low = SimulateFlash(Load("intel-flash"), nullptr, t, o);
  o.utilisation = 0.95;
  auto high = SimulateFlash(Load("intel-flash"), nullptr, t, o);
  ASSERT_TRUE(low.ok() && high.ok());
  EXPECT_GT(high->energy, low->energy);
  EXPECT_GT(high->erasures, low->erasures);
  EXPECT_GT(high->mean_write_ms, low->mean_write_ms);
}

TEST(FlashSimTest, AWebTraceIsRefused) {
  Trace t;
  t.kind = TraceKind::kWeb;
  auto r = SimulateFlash(Load("cu140"), nullptr, t, FlashSimOptions{});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("block"), std::string::npos);
}

}  // namespace
}  // namespace ghost
