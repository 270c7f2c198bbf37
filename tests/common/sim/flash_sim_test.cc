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

// Records of 4 KiB each, one after another in the log, at the given disk offsets.
std::vector<PlanRecord> Records(const std::vector<Bytes>& offsets) {
  std::vector<PlanRecord> out;
  Bytes at = 0;
  for (std::size_t i = 0; i < offsets.size(); ++i) {
    const Bytes rec = FlashLog::kHeaderSize + 4 + 4096;
    out.push_back({i + 1, LogRecordKind::kBlock, "disk", offsets[i], 4096, at, rec, FlashLog::kHeaderSize + 4});
    at += rec;
  }
  return out;
}

Duration Predict(const std::vector<PlanRecord>& records, FlushAlgorithm alg, Duration log_latency) {
  DeviceProfile card = Load("intel-flash"), disk = Load("cu140");
  card.modes[0].io.latency = log_latency;
  FlashSimOptions o;
  o.algorithm = alg;
  o.dram_buffer = 64 << 10;
  return PredictFlushTime(records, o, card, disk, Bytes{40} << 20);
}

// The NVCache algorithms as the paper describes them (DESIGN §3.5): algorithm 1 reads each
// record from the flash and then writes it, so it pays every record's read in series with the
// disk; algorithm 2 pays one read per DRAM buffer; algorithms 3 and 4 hide the reads after
// the first behind the writes.
TEST(FlashSimTest, AlgorithmOnePaysEveryRecordsFlashReadBeforeItsDiskWrite) {
  // Ten records far apart on the disk (no two adjacent), all within one 64 KiB buffer.
  std::vector<PlanRecord> recs = Records({0, 20 << 20, 4 << 20, 36 << 20, 8 << 20, 28 << 20, 12 << 20,
                                          24 << 20, 16 << 20, 32 << 20});
  const Duration lat = Millis(5);
  EXPECT_EQ(Predict(recs, FlushAlgorithm::kOneRecord, lat) - Predict(recs, FlushAlgorithm::kOneRecord, Duration::zero()),
            10 * lat);
  EXPECT_EQ(Predict(recs, FlushAlgorithm::kChunked, lat) - Predict(recs, FlushAlgorithm::kChunked, Duration::zero()),
            lat);
  EXPECT_EQ(Predict(recs, FlushAlgorithm::kDoubleBuffer, lat) -
                Predict(recs, FlushAlgorithm::kDoubleBuffer, Duration::zero()),
            lat);
}

// Two records that are adjacent on the disk: written back to back from one buffer the second
// needs no positioning; with algorithm 1 the flash read between them lets its first sector
// pass under the head, so it waits for the platter to come round (a rotation less the read).
TEST(FlashSimTest, AnAdjacentRecordAfterAFlashReadWaitsForThePlatterToComeRound) {
  std::vector<PlanRecord> recs = Records({8 << 20, (8 << 20) + 4096});
  const Duration lat = Millis(2);
  const Duration one = Predict(recs, FlushAlgorithm::kOneRecord, lat);
  const Duration two = Predict(recs, FlushAlgorithm::kChunked, lat);
  // Algorithm 1: read 0, write 0, read 1, a rotation less read 1, write 1. Algorithm 2: one
  // read of both, write 0, write 1. The cu140's rotation is 2 x 8.3 ms (FlashSimOptions).
  const Bandwidth bw = Load("intel-flash").modes[0].io.read_bandwidth;
  EXPECT_EQ(one - two, 2 * Millis(8.3) + bw.TimeFor(recs[0].log_length) -
                           bw.TimeFor(recs[0].log_length + recs[1].log_length));
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

// A block trace of `n` writes of `size` bytes every `gap`, each at the next address, and, if
// `read_after` > 0, a read of 4 KiB that long after each write.
Trace Spaced(int n, Bytes size, Duration gap, Duration read_after = Duration::zero()) {
  Trace t;
  t.kind = TraceKind::kBlock;
  for (int i = 0; i < n; ++i) {
    TimePoint at = TimePoint{} + gap * i;
    t.block.push_back({at, true, static_cast<std::uint64_t>(i) * (size / kSectorSize),
                       static_cast<std::uint32_t>(size / kSectorSize)});
    if (read_after > Duration::zero()) t.block.push_back({at + read_after, false, 0, 8});
  }
  return t;
}

// `trace` on the intel-flash card alone at `utilisation`, cleaning by `cleaning`.
FlashSimResult OnCard(const Trace& trace, CleaningPolicy cleaning, double utilisation) {
  FlashSimOptions o;
  o.cleaning = cleaning;
  o.utilisation = utilisation;
  auto r = SimulateFlash(Load("intel-flash"), nullptr, trace, o);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? *r : FlashSimResult{};
}

// Asynchronous cleaning erases on the chip while the card serves requests (DESIGN §3.7): writes
// spaced wider than a cleaning (here 16 KiB, 77 ms, every 2 s against 1.6 s erasures) never
// wait for one, however full the card, so their response is their transfer time.
TEST(FlashSimTest, AsynchronousCleaningInIdleTimeAddsNoWriteLatency) {
  const FlashSimResult r = OnCard(Spaced(200, 16 << 10, Seconds(2)), CleaningPolicy::kAsynchronous, 0.95);
  EXPECT_GT(r.erasures, 40u);  // 3.2 MB into 0.5 MB of free space: it does clean
  // None waits for a cleaning. (Before round 13's idle-time cleaner the first write, finding
  // only the reserve erased, waited for a cleaning's erasure, 1.6 s; now it waits for the copies
  // only, and the victim at the start is dead space: no copy.) Since round 14 a write waits for
  // an erasure on its own chip: the preload leaves its dead space on the last chip, the one the
  // writer starts on, so the first two writes wait for an erasure there (at most 1.6 s each);
  // after that the cleaner erases on other chips and no write waits.
  const double transfer_ms = 1000.0 * (16 << 10) / (209.0 * 1024);
  EXPECT_LE(r.writes_behind_an_erasure, 2u);
  EXPECT_NEAR(r.mean_write_ms, transfer_ms, 0.5 + 2 * 1600.0 / 200);
}

// A read right behind a write whose cleaning erases is not held up by the erasure (the chip
// suspends it, or another chip serves the read: 28F008SA erase-suspend to read).
TEST(FlashSimTest, AReadDoesNotWaitForAnErasureInFlight) {
  const FlashSimResult r =
      OnCard(Spaced(100, 64 << 10, Seconds(3), Millis(400)), CleaningPolicy::kAsynchronous, 0.4);
  EXPECT_GT(r.erasures, 50u);
  // 4 KiB at 9.5 MB/s: 0.4 ms; only the first read waits, behind the first write (which found
  // only the reserve erased and cleaned first): 1.5 s / 100 reads.
  EXPECT_LT(r.mean_read_ms, 20.0);
}

// On demand, a write that needs a segment waits for the cleaning: at least one erasure.
TEST(FlashSimTest, OnDemandCleaningIsInTheWritesResponse) {
  const FlashSimResult r = OnCard(Spaced(50, 64 << 10, Seconds(5)), CleaningPolicy::kOnDemand, 0.4);
  EXPECT_GT(r.mean_write_ms, 1600.0);
}

// A block trace of writes (`write`) or reads of `size` bytes at the given times (ms), each at
// the next address.
Trace At(const std::vector<std::pair<double, bool>>& events, Bytes size) {
  Trace t;
  t.kind = TraceKind::kBlock;
  std::uint64_t sector = 0;
  for (const auto& [ms, write] : events) {
    t.block.push_back({TimePoint{} + Millis(ms), write, sector,
                       static_cast<std::uint32_t>(size / kSectorSize)});
    sector += size / kSectorSize;
  }
  return t;
}

FlashSimResult OnFlashDisk(const Trace& trace, Bytes write_buffer) {
  FlashSimOptions o;
  o.write_buffer = write_buffer;
  auto r = SimulateFlash(Load("sdp10"), nullptr, trace, o);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? *r : FlashSimResult{};
}

// The host write buffer (FlashSimOptions::write_buffer, round 15): on the SDP10 flash disk (no
// cleaning: one 8 KiB write is latency + bytes / bandwidth on the device, d ms), four 8 KiB
// writes 10 ms apart into a 16 KiB buffer. The first two fit and return at once; the third
// waits until the first is on the device (d - 20 ms), the fourth until the second is (2d - 30);
// the device does the same work in the same order, so energy and duration are unchanged.
TEST(FlashSimTest, AWriteThatFitsTheHostBufferReturnsAtOnceAndTheRestWaitForTheDrain) {
  const double d = OnFlashDisk(At({{0, true}}, 8 << 10), 0).mean_write_ms;
  ASSERT_GT(d, 100.0);  // 8 KiB at 50 KB/s
  const Trace burst = At({{0, true}, {10, true}, {20, true}, {30, true}}, 8 << 10);
  const FlashSimResult direct = OnFlashDisk(burst, 0);
  const FlashSimResult buffered = OnFlashDisk(burst, 16 << 10);
  EXPECT_NEAR(direct.mean_write_ms, (10 * d - 60) / 4, 0.01);  // each queued behind the last
  EXPECT_NEAR(buffered.mean_write_ms, (0 + 0 + (d - 20) + (2 * d - 30)) / 4, 0.01);
  EXPECT_EQ(buffered.writes_waiting_for_buffer, 2u);
  EXPECT_EQ(buffered.writes_through_buffer, 0u);
  EXPECT_EQ(buffered.writes, 4u);
  EXPECT_NEAR(buffered.energy.joules(), direct.energy.joules(), 1e-9);
  EXPECT_EQ(buffered.duration, direct.duration);
}

// A write larger than the buffer waits for the buffer to empty and is written through; a read
// is not served from the buffer: it queues on the device behind the drain writes issued before
// it arrived.
TEST(FlashSimTest, AWriteLargerThanTheHostBufferIsWrittenThroughAndAReadQueuesBehindTheDrain) {
  const double d = OnFlashDisk(At({{0, true}}, 8 << 10), 0).mean_write_ms;
  const double big = OnFlashDisk(At({{0, true}}, 24 << 10), 0).mean_write_ms;
  const FlashSimResult r = OnFlashDisk(At({{0, true}, {1, true}}, 8 << 10), 4 << 10);
  EXPECT_EQ(r.writes_through_buffer, 2u);  // 8 KiB each into 4 KiB
  EXPECT_NEAR(r.mean_write_ms, (d + (2 * d - 1)) / 2, 0.01);
  Trace t = At({{0, true}, {5, true}}, 8 << 10);
  t.block.push_back({TimePoint{} + Millis(10), true, 100, 48});  // 24 KiB
  t.block.push_back({TimePoint{} + Millis(20), false, 0, 8});     // 4 KiB read
  const FlashSimResult m = OnFlashDisk(t, 16 << 10);
  EXPECT_EQ(m.writes_through_buffer, 1u);
  // The big write waits for both buffered writes to be on the device (2d - 10 ms), then takes
  // its own time; the read arrives behind it.
  EXPECT_NEAR(m.mean_write_ms, (0 + 0 + (2 * d - 10) + big) / 3, 0.01);
  EXPECT_GT(m.mean_read_ms, 2 * d + big - 20 - 0.01);
}

// A write buffer is refused where it would be ignored: on a disk and with a flash log.
TEST(FlashSimTest, AHostWriteBufferIsRefusedOnADisk) {
  FlashSimOptions o;
  o.write_buffer = 64 << 10;
  auto r = SimulateFlash(Load("cu140"), nullptr, At({{0, true}}, 8 << 10), o);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("write buffer"), std::string::npos);
}

TEST(FlashSimTest, AWebTraceIsRefused) {
  Trace t;
  t.kind = TraceKind::kWeb;
  auto r = SimulateFlash(Load("cu140"), nullptr, t, FlashSimOptions{});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("block"), std::string::npos);
}

// §5.2 in the steady state (FlashSimOptions::steady_state): the trace must lie inside the live
// data, or the live fraction would drift from the one asked for (a 40 MiB trace wrapped onto
// the 10 MB card took "40%" to 65%).
TEST(FlashSimTest, SteadyStateRefusesATraceLargerThanTheLiveData) {
  FlashSimOptions o;
  o.steady_state = true;
  o.utilisation = 0.4;
  auto r = SimulateFlash(Load("intel-flash"), nullptr, NvTrace(), o);  // a 40 MiB disk
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("live data"), std::string::npos) << r.status().ToString();
}

Trace SmallNvcacheTrace() {
  NvcacheTraceOptions o;
  o.disk_sectors = (4u << 20) / kSectorSize;  // 40% of the 10 MB card
  return GenerateNvcacheTrace(o);
}

// The warm-up writes at least the card's capacity and stops when a round costs what the one
// before did; the live fraction is the one asked for throughout. Measured after it, the 40%
// card copies live data: its free space is spread over the workload's segments, not the
// dead segments of the preload, which a trace can erase without a copy.
TEST(FlashSimTest, SteadyStateSettlesTheCardAndHoldsTheUtilisation) {
  const Trace t = SmallNvcacheTrace();
  FlashSimOptions o;
  o.utilisation = 0.4;
  auto cold = SimulateFlash(Load("intel-flash"), nullptr, t, o);
  o.steady_state = true;
  auto settled = SimulateFlash(Load("intel-flash"), nullptr, t, o);
  ASSERT_TRUE(cold.ok() && settled.ok()) << settled.status().ToString();
  EXPECT_TRUE(settled->steady);
  EXPECT_GE(settled->warm_up_written, Bytes{10} << 20);
  EXPECT_GE(settled->warm_up_passes, 2);
  EXPECT_NEAR(settled->final_utilisation, 0.4, 0.001);
  EXPECT_GT(settled->copied, cold->copied + (Bytes{1} << 20));
  EXPECT_EQ(settled->writes, cold->writes);  // the timed replay is the trace itself
}

}  // namespace
}  // namespace ghost
