// The post-mortem WNIC model of the shaping benchmark (common/power/wnic_trace.h): plain TCP
// keeps the card awake, a shaped schedule sleeps between bursts (and counts packets it slept
// through), ideal PSM waits for beacons and carries the wait forward.
#include "common/power/wnic_trace.h"

#include <gtest/gtest.h>

namespace ghost {
namespace {

TimePoint At(double ms) { return TimePoint(Millis(ms)); }

// Two bursts of 10 packets, 1 ms apart, the second 100 ms after the first began.
std::vector<PacketArrival> TwoBursts() {
  std::vector<PacketArrival> v;
  for (int b = 0; b < 2; ++b)
    for (int i = 0; i < 10; ++i) v.push_back({At(10 + 100 * b + i), 1000});
  return v;
}

class WnicTraceTest : public ::testing::Test {
 protected:
  WnicCard card_ = WnicCardFromPowers(WnicPowers{}, Bandwidth::MegabitsPerSecond(20));
};

TEST_F(WnicTraceTest, PlainTcpKeepsTheCardAwakeFromRequestToLastPacket) {
  const WnicRun r = PlainRun(card_, At(0), TwoBursts());
  EXPECT_EQ(r.delay, Millis(119));
  EXPECT_EQ(r.wakes, 0u);
  const double airtime = 20000.0 / 2.5e6;
  EXPECT_NEAR(r.energy.joules(), 1.319 * 0.119 + (1.425 - 1.319) * airtime, 1e-6);
}

TEST_F(WnicTraceTest, ShapedScheduleSleepsBetweenBurstsAndCostsLess) {
  const std::vector<CardSwitch> schedule = {{At(22), false}, {At(105), true}};
  const WnicRun shaped = ScheduledRun(card_, At(0), TwoBursts(), schedule);
  const WnicRun plain = PlainRun(card_, At(0), TwoBursts());
  EXPECT_EQ(shaped.missed, 0u);
  EXPECT_EQ(shaped.sleep, Millis(83));
  EXPECT_EQ(shaped.wakes, 1u);
  EXPECT_EQ(shaped.delay, plain.delay);
  EXPECT_LT(shaped.energy.joules(), 0.5 * plain.energy.joules());
  EXPECT_LT(shaped.energy_delay(), plain.energy_delay());
}

TEST_F(WnicTraceTest, PacketsArrivingWhileTheCardSleepsAreMissedAndWakeIt) {
  // Slept too early (after 6 packets of the first burst), then again after it, and woke late.
  const std::vector<CardSwitch> schedule = {{At(15.5), false}, {At(22), false}, {At(112), true}};
  const WnicRun r = ScheduledRun(card_, At(0), TwoBursts(), schedule);
  EXPECT_EQ(r.missed, 2u);  // at 16 and at 110; the card wakes for each
  EXPECT_EQ(r.wakes, 2u);
  EXPECT_EQ(r.sleep, Millis(0.5) + Millis(88));
}

// A scheduled wake-up starts the card's transition: wake_energy prices those 2 ms, so they are
// not charged as awake time too; a packet that comes before the transition ends is missed.
TEST_F(WnicTraceTest, AScheduledWakeUpIsChargedOnceAndListensOnlyAfterTheTransition) {
  const std::vector<CardSwitch> schedule = {{At(22), false}, {At(105), true}};
  const WnicRun r = ScheduledRun(card_, At(0), TwoBursts(), schedule);
  EXPECT_EQ(r.missed, 0u);
  EXPECT_EQ(r.sleep, Millis(83));
  const double airtime = 20000.0 / 2.5e6;
  // Awake 0–22 ms and 107–119 ms; asleep 22–105 ms; one wake-up of 2 ms at idle power.
  EXPECT_NEAR(r.energy.joules(),
              1.319 * (0.022 + 0.012) + 0.177 * 0.083 + (1.425 - 1.319) * airtime + 1.319 * 0.002,
              1e-6);
  // Woken at 109 ms, the card is not listening before 111 ms: the packet at 110 ms is missed.
  const WnicRun late = ScheduledRun(card_, At(0), TwoBursts(), {{At(22), false}, {At(109), true}});
  EXPECT_EQ(late.missed, 1u);
}

TEST_F(WnicTraceTest, IdealPsmDelaysEachBurstToABeaconAndCarriesTheDelay) {
  WnicCard card = card_;
  card.beacon = Millis(100);
  const WnicRun r = PsmRun(card, At(0), TwoBursts());
  // Burst 1 arrives at 10 ms, waits for the beacon at 100 ms (+90 ms); burst 2 then comes at
  // 110 + 90 = 200 ms, on a beacon: delivered at once, last packet at 209 ms.
  EXPECT_EQ(r.delay, Millis(209));
  EXPECT_EQ(r.wakes, 2u);
  EXPECT_EQ(r.sleep, Millis(100) + Millis(200 - 119));
  EXPECT_LT(r.energy.joules(), PlainRun(card, At(0), TwoBursts()).energy.joules());
}

TEST_F(WnicTraceTest, CardFromTheWavelanProfileHasThePapersPowers) {
  Result<DeviceProfile> p = LoadDeviceProfile("wavelan-2.4", GHOST_PROFILE_DIR);
  ASSERT_TRUE(p.ok());
  const WnicCard c = WnicCardFromProfile(*p, Bandwidth::MegabitsPerSecond(20));
  EXPECT_DOUBLE_EQ(c.awake.watts(), 1.319);
  EXPECT_DOUBLE_EQ(c.receive.watts(), 1.425);
  EXPECT_DOUBLE_EQ(c.sleep.watts(), 0.177);
  EXPECT_EQ(c.wake, Millis(2));
  Result<DeviceProfile> ac = LoadDeviceProfile("wifi-ac", GHOST_PROFILE_DIR);
  ASSERT_TRUE(ac.ok());
  const WnicCard m = WnicCardFromProfile(*ac, Bandwidth::MegabitsPerSecond(20));
  EXPECT_DOUBLE_EQ(m.sleep.watts(), 0.075);
  EXPECT_EQ(m.beacon, Duration(102400));
}

}  // namespace
}  // namespace ghost
