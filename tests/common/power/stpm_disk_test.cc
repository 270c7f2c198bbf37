#include "common/power/stpm_disk.h"

#include <gtest/gtest.h>

#include <memory>

#include "common/base/clock.h"
#include "common/power/device.h"
#include "common/power/power_manager.h"
#include "common/power/profile.h"

namespace ghost {
namespace {

constexpr int kLowPowerIdle = 1;
constexpr int kStandby = 2;
constexpr Power kBase = Power::Milliwatts(1440);
// The paper's Figure 3 hint: a 32 KB read would have been 160 ms and 0.58 J cheaper from a
// disk in performance idle (DESIGN §5).
constexpr GhostHint kFigure3Hint{Millis(160), Energy::Joules(0.58)};

class StpmDiskTest : public ::testing::Test {
 protected:
  void SetUp() override {
    Result<DeviceProfile> p = LoadDeviceProfile("microdrive-1gb", GHOST_PROFILE_DIR);
    ASSERT_TRUE(p.ok()) << p.status().ToString();
    profile_ = *p;
  }

  void Start(int knob = 50) {
    disk_ = std::make_unique<Device>(clock_, profile_, nullptr, 0);
    pm_ = std::make_unique<PowerManager>(clock_, kBase, knob);
    auto policy = std::make_unique<StpmDiskPolicy>();
    policy_ = policy.get();
    id_ = pm_->Register(disk_.get(), std::move(policy));
  }

  // Submits a 32 KiB read and runs the clock until it completes; returns the completion time.
  TimePoint RunIo() {
    bool done = false;
    TimePoint end{};
    disk_->Submit({32 * 1024, false}, [&] {
      done = true;
      end = clock_.Now();
    });
    while (!done && clock_.RunNext()) {
    }
    EXPECT_TRUE(done);
    return end;
  }

  // One I/O, then idle until the disk has settled in standby.
  void PutDiskInStandby() {
    TimePoint end = RunIo();
    clock_.RunUntil(end + policy_->threshold(kStandby) + Seconds(1));
    ASSERT_EQ(disk_->mode(), kStandby);
    ASSERT_FALSE(disk_->transitioning());
  }

  VirtualClock clock_;
  DeviceProfile profile_;
  // Declared before pm_: the manager (and the policy it owns) goes first.
  std::unique_ptr<Device> disk_;
  std::unique_ptr<PowerManager> pm_;
  StpmDiskPolicy* policy_ = nullptr;
  DeviceId id_ = -1;
};

TEST_F(StpmDiskTest, BreakEvenMatchesEquation1) {
  // Tbe = (Eup + Edown) / (Php − Plp)
  EXPECT_NEAR(ToSeconds(BreakEven(profile_, kLowPowerIdle)), (0.31 + 0.15) / (0.76 - 0.34), 1e-6);
  EXPECT_NEAR(ToSeconds(BreakEven(profile_, kStandby)), (0.9 + 0.3) / (0.76 - 0.08), 1e-6);
}

TEST_F(StpmDiskTest, TransitionEnergyCostMatchesEquation2) {
  // CE = Edown − Php·Tdown + Eup + Pbase·Tup
  EXPECT_NEAR(TransitionEnergyCost(profile_, kStandby, kBase).joules(),
              0.3 - 0.76 * 0.32 + 0.9 + 1.44 * 0.82, 1e-9);  // 2.1376 J
  EXPECT_NEAR(TransitionEnergyCost(profile_, kLowPowerIdle, kBase).joules(),
              0.15 - 0.76 * 0.16 + 0.31 + 1.44 * 0.30, 1e-9);  // 0.7704 J
}

TEST_F(StpmDiskTest, KnobBreakEvenMatchesEquation3AtSeveralKnobs) {
  // Tbe(K) = (Tup·K + CE·(100 − K)) / ((Php − Plp)·(100 − K)), by hand:
  //   standby:        Tup 0.82 s, CE 2.1376 J, Php − Plp 0.68 W
  //   low-power idle: Tup 0.30 s, CE 0.7704 J, Php − Plp 0.42 W
  struct Case {
    int knob;
    double standby_s;
    double low_power_idle_s;
  };
  const Case cases[] = {
      {0, 2.1376 / 0.68, 0.7704 / 0.42},                      // 3.1435, 1.8343
      {50, (41.0 + 106.88) / 34.0, (15.0 + 38.52) / 21.0},    // 4.3494, 2.5486
      {90, (73.8 + 21.376) / 6.8, (27.0 + 7.704) / 4.2},      // 13.9965, 8.2629
      {99, (81.18 + 2.1376) / 0.68, (29.7 + 0.7704) / 0.42},  // 122.5259, 72.5486
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.knob);
    EXPECT_NEAR(ToSeconds(KnobBreakEven(profile_, kStandby, kBase, c.knob)), c.standby_s, 1e-5);
    EXPECT_NEAR(ToSeconds(KnobBreakEven(profile_, kLowPowerIdle, kBase, c.knob)),
                c.low_power_idle_s, 1e-5);
  }
  EXPECT_NEAR(ToSeconds(KnobBreakEven(profile_, kStandby, kBase, 50)), 4.349412, 1e-5);
  EXPECT_NEAR(ToSeconds(KnobBreakEven(profile_, kLowPowerIdle, kBase, 50)), 2.548571, 1e-5);
}

TEST_F(StpmDiskTest, Knob100NeverSpinsDown) {
  EXPECT_EQ(KnobBreakEven(profile_, kStandby, kBase, 100), Duration::max());
  EXPECT_EQ(KnobBreakEven(profile_, kLowPowerIdle, kBase, 100), Duration::max());
  Start(100);
  TimePoint end = RunIo();
  EXPECT_EQ(clock_.pending(), 0u);  // nothing armed
  clock_.RunUntil(end + Seconds(24 * 3600));
  EXPECT_EQ(disk_->mode(), 0);
  EXPECT_EQ(pm_->meter().Read().devices[0].transitions, 0);
  EXPECT_EQ(policy_->Describe(), "stpm-disk K=100: never spins down");
}

TEST_F(StpmDiskTest, StepsDownThroughLowPowerModesAfterTheirBreakEvenTimes) {
  Start(50);
  const Duration lpi = policy_->threshold(kLowPowerIdle);
  const Duration standby = policy_->threshold(kStandby);
  ASSERT_EQ(lpi, KnobBreakEven(profile_, kLowPowerIdle, kBase, 50));
  ASSERT_EQ(standby, KnobBreakEven(profile_, kStandby, kBase, 50));
  const Duration down = Millis(160);  // perf→LPidle and LPidle→standby both take 160 ms

  TimePoint end = RunIo();
  clock_.RunUntil(end + lpi - Millis(1));
  EXPECT_EQ(disk_->mode(), 0);
  EXPECT_EQ(disk_->target_mode(), 0);
  clock_.RunUntil(end + lpi + Millis(1));
  EXPECT_EQ(disk_->target_mode(), kLowPowerIdle);
  clock_.RunUntil(end + lpi + down + Millis(1));
  EXPECT_EQ(disk_->mode(), kLowPowerIdle);
  EXPECT_FALSE(disk_->transitioning());

  clock_.RunUntil(end + standby - Millis(1));
  EXPECT_EQ(disk_->mode(), kLowPowerIdle);
  EXPECT_EQ(disk_->target_mode(), kLowPowerIdle);
  clock_.RunUntil(end + standby + Millis(1));
  EXPECT_EQ(disk_->target_mode(), kStandby);
  clock_.RunUntil(end + standby + down + Millis(1));
  EXPECT_EQ(disk_->mode(), kStandby);

  clock_.RunUntil(end + Seconds(3600));
  EXPECT_EQ(disk_->mode(), kStandby);
  EXPECT_EQ(pm_->meter().Read().devices[0].transitions, 2);
  policy_->AssertInvariants();
}

TEST_F(StpmDiskTest, DescribeListsTheThresholds) {
  Start(50);
  EXPECT_EQ(policy_->Describe(),
            "stpm-disk K=50: low-power-idle after 2.55 s, standby after 4.35 s");
}

TEST_F(StpmDiskTest, IoCancelsSpinDown) {
  Start(50);
  const Duration lpi = policy_->threshold(kLowPowerIdle);
  TimePoint end1 = RunIo();
  EXPECT_EQ(clock_.pending(), 2u);     // one spin-down timer per low-power mode
  clock_.RunUntil(end1 + Seconds(2));  // before the first threshold
  bool done = false;
  TimePoint end2{};
  disk_->Submit({1 << 20, false}, [&] {  // 1 MiB: ≈ 0.77 s, past the old threshold
    done = true;
    end2 = clock_.Now();
  });
  ASSERT_TRUE(clock_.RunNext());  // the device starts the I/O
  ASSERT_TRUE(disk_->busy());
  EXPECT_EQ(clock_.pending(), 1u);  // only the I/O's own completion: the timers are gone
  while (!done && clock_.RunNext()) {
  }
  ASSERT_TRUE(done);
  clock_.RunUntil(end1 + lpi + Millis(300));
  EXPECT_EQ(disk_->mode(), 0);
  EXPECT_EQ(disk_->target_mode(), 0);
  // The new idle period counts from the end of the second I/O.
  clock_.RunUntil(end2 + lpi - Millis(1));
  EXPECT_EQ(disk_->target_mode(), 0);
  clock_.RunUntil(end2 + lpi + Millis(200));
  EXPECT_EQ(disk_->mode(), kLowPowerIdle);
}

TEST_F(StpmDiskTest, IoInStandbySpinsUpAndRestartsTheThresholds) {
  Start(50);
  PutDiskInStandby();
  TimePoint end = RunIo();
  EXPECT_EQ(disk_->mode(), 0);
  clock_.RunUntil(end + policy_->threshold(kLowPowerIdle) - Millis(1));
  EXPECT_EQ(disk_->target_mode(), 0);
  clock_.RunUntil(end + policy_->threshold(kLowPowerIdle) + Millis(1));
  EXPECT_EQ(disk_->target_mode(), kLowPowerIdle);
}

TEST_F(StpmDiskTest, KnobChangeReArmsTheThresholds) {
  Start(50);
  TimePoint end = RunIo();
  clock_.RunUntil(end + Seconds(1));
  pm_->SetKnob(0);  // low-power idle now after 1.83 s of the same idle period
  EXPECT_NEAR(ToSeconds(policy_->threshold(kLowPowerIdle)), 0.7704 / 0.42, 1e-5);
  clock_.RunUntil(end + policy_->threshold(kLowPowerIdle) + Millis(1));
  EXPECT_EQ(disk_->target_mode(), kLowPowerIdle);

  // And a higher knob postpones: after an I/O at K = 90, nothing happens at 2.55 s.
  TimePoint end2 = RunIo();
  pm_->SetKnob(90);
  clock_.RunUntil(end2 + Seconds(3));
  EXPECT_EQ(disk_->mode(), 0);
  EXPECT_EQ(disk_->target_mode(), 0);
  clock_.RunUntil(end2 + policy_->threshold(kLowPowerIdle) + Millis(1));
  EXPECT_EQ(disk_->target_mode(), kLowPowerIdle);
}

TEST_F(StpmDiskTest, OneGhostHintDoesNotSpinUp) {
  Start(50);
  PutDiskInStandby();
  pm_->SendGhostHint(id_, kFigure3Hint);
  // 50·0.16 + 50·0.58 = 37 < 0.82·50 + 2.1376·50 = 147.88
  EXPECT_NEAR(policy_->weighted_benefit(), 37.0, 1e-9);
  EXPECT_EQ(disk_->target_mode(), kStandby);
  clock_.AdvanceBy(Seconds(10));
  EXPECT_EQ(disk_->mode(), kStandby);
  EXPECT_EQ(policy_->proactive_spin_ups(), 0);
}

TEST_F(StpmDiskTest, SpinsUpAfterEnoughGhostHints) {
  Start(50);
  PutDiskInStandby();
  // Hints 100 ms apart: each adds 37, each gap costs 50·0.68 W·0.1 s = 3.4.
  for (int i = 0; i < 4; ++i) {
    if (i > 0) clock_.AdvanceBy(Millis(100));
    pm_->SendGhostHint(id_, kFigure3Hint);
  }
  EXPECT_NEAR(policy_->weighted_benefit(), 4 * 37.0 - 3 * 3.4, 1e-6);  // 137.8 < 147.88
  EXPECT_EQ(disk_->target_mode(), kStandby);
  clock_.AdvanceBy(Millis(100));
  pm_->SendGhostHint(id_, kFigure3Hint);  // 171.4 > 147.88
  EXPECT_EQ(disk_->target_mode(), 0);
  EXPECT_EQ(policy_->proactive_spin_ups(), 1);
  EXPECT_EQ(policy_->weighted_benefit(), 0.0);
  clock_.AdvanceBy(Millis(821));  // standby → performance idle takes 820 ms
  EXPECT_EQ(disk_->mode(), 0);
}

TEST_F(StpmDiskTest, GhostHintsFarApartDecayAndNeverSpinUp) {
  Start(50);
  PutDiskInStandby();
  // 10 s between hints costs 50·0.68·10 = 340, more than a hint brings: B never grows.
  for (int i = 0; i < 20; ++i) {
    pm_->SendGhostHint(id_, kFigure3Hint);
    EXPECT_NEAR(policy_->weighted_benefit(), 37.0, 1e-9);
    clock_.AdvanceBy(Seconds(10));
  }
  EXPECT_EQ(disk_->mode(), kStandby);
  EXPECT_EQ(policy_->proactive_spin_ups(), 0);
}

TEST_F(StpmDiskTest, TwoGhostHintsSpinUpFromLowPowerIdle) {
  Start(50);
  TimePoint end = RunIo();
  clock_.RunUntil(end + policy_->threshold(kLowPowerIdle) + Millis(200));
  ASSERT_EQ(disk_->mode(), kLowPowerIdle);
  // Spin-up cost from low-power idle: 0.3·50 + 0.7704·50 = 53.52.
  pm_->SendGhostHint(id_, kFigure3Hint);
  EXPECT_EQ(disk_->target_mode(), kLowPowerIdle);
  pm_->SendGhostHint(id_, kFigure3Hint);
  EXPECT_EQ(disk_->target_mode(), 0);
}

TEST_F(StpmDiskTest, GhostHintsAreIgnoredInHighPowerMode) {
  Start(50);
  RunIo();
  for (int i = 0; i < 10; ++i) pm_->SendGhostHint(id_, kFigure3Hint);
  EXPECT_EQ(policy_->weighted_benefit(), 0.0);
  EXPECT_EQ(policy_->proactive_spin_ups(), 0);
  EXPECT_EQ(pm_->ghost_hints_received(id_), 10);
}

TEST_F(StpmDiskTest, EnteringHighPowerModeResetsTheBenefit) {
  Start(50);
  PutDiskInStandby();
  pm_->SendGhostHint(id_, kFigure3Hint);
  ASSERT_GT(policy_->weighted_benefit(), 0.0);
  RunIo();  // spins the disk up
  EXPECT_EQ(policy_->weighted_benefit(), 0.0);
}

TEST_F(StpmDiskTest, ProactiveSpinUpSpinsDownAgainWithoutIo) {
  Start(50);
  PutDiskInStandby();
  for (int i = 0; i < 5; ++i) pm_->SendGhostHint(id_, kFigure3Hint);
  ASSERT_EQ(disk_->target_mode(), 0);
  clock_.AdvanceBy(Millis(820));
  ASSERT_EQ(disk_->mode(), 0);
  const TimePoint up = clock_.Now();
  clock_.RunUntil(up + policy_->threshold(kLowPowerIdle) - Millis(1));
  EXPECT_EQ(disk_->target_mode(), 0);
  clock_.RunUntil(up + policy_->threshold(kLowPowerIdle) + Millis(1));
  EXPECT_EQ(disk_->target_mode(), kLowPowerIdle);
}

TEST_F(StpmDiskTest, DefersBackgroundWrites) {
  StpmDiskPolicy policy;
  EXPECT_TRUE(policy.DefersBackgroundWrites());
  EXPECT_EQ(policy.name(), "stpm-disk");
}

}  // namespace
}  // namespace ghost
