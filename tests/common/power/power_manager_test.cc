#include "common/power/power_manager.h"

#include <gtest/gtest.h>

#include "common/base/clock.h"
#include "common/power/profile.h"

namespace ghost {
namespace {

class RecordingPolicy : public DevicePolicy {
 public:
  std::string name() const override { return "recording"; }
  void OnGhostHint(const GhostHint& h) override { hints.push_back(h); }
  void OnKnobChanged(int k) override { knobs.push_back(k); }
  void OnModeEntered(int m) override { modes.push_back(m); }
  std::vector<GhostHint> hints;
  std::vector<int> knobs;
  std::vector<int> modes;
};

class PowerManagerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    Result<MachineProfile> m = LoadMachineProfile("ipaq-2004", GHOST_PROFILE_DIR);
    ASSERT_TRUE(m.ok());
    machine_ = *m;
    disk_ = std::make_unique<Device>(clock_, *machine_.FindDevice(DeviceKind::kDisk), nullptr, 0);
    net_ = std::make_unique<Device>(clock_, *machine_.FindDevice(DeviceKind::kNetwork), &machine_.link, 1);
  }
  VirtualClock clock_;
  MachineProfile machine_;
  std::unique_ptr<Device> disk_, net_;
};

TEST_F(PowerManagerTest, AnswersTheFigure5Queries) {
  PowerManager pm(clock_, machine_.base_power, 50);
  DeviceId d = pm.Register(disk_.get(), nullptr);
  EXPECT_EQ(pm.NumModes(d), 3);
  EXPECT_EQ(pm.ModeInfo(d, 1).name, "low-power-idle");
  EXPECT_EQ(pm.TransitionCost(d, 1, 0).time, Millis(300));
  EXPECT_EQ(pm.CurrentMode(d), 0);
  EXPECT_EQ(pm.FindDevice(DeviceKind::kDisk), d);
  EXPECT_FALSE(pm.FindDevice(DeviceKind::kFlash).has_value());
}

TEST_F(PowerManagerTest, SubscribersAreCalledWhenTheDeviceEntersTheMode) {
  PowerManager pm(clock_, machine_.base_power, 50);
  DeviceId d = pm.Register(disk_.get(), nullptr);
  std::vector<TimePoint> calls;
  pm.Subscribe(d, 0, [&](DeviceId id, int mode) {
    EXPECT_EQ(id, d);
    EXPECT_EQ(mode, 0);
    calls.push_back(clock_.Now());
  });
  disk_->RequestMode(2);
  clock_.RunUntilIdle();
  EXPECT_TRUE(calls.empty());
  clock_.AdvanceBy(Seconds(5));
  disk_->RequestMode(0);  // standby → performance idle takes 820 ms
  clock_.RunUntilIdle();
  ASSERT_EQ(calls.size(), 1u);
  // Pushed at the instant of entry: no polling period in between.
  EXPECT_EQ(calls[0], TimePoint(Millis(320) + Seconds(5) + Millis(820)));
  EXPECT_EQ(clock_.pending(), 0u);
}

TEST_F(PowerManagerTest, UnsubscribedCallbackIsNotCalled) {
  PowerManager pm(clock_, machine_.base_power, 50);
  DeviceId d = pm.Register(disk_.get(), nullptr);
  int calls = 0;
  SubscriptionId s = pm.Subscribe(d, 2, [&](DeviceId, int) { ++calls; });
  pm.Unsubscribe(s);
  disk_->RequestMode(2);
  clock_.RunUntilIdle();
  EXPECT_EQ(calls, 0);
}

TEST_F(PowerManagerTest, RoutesHintsKnobAndModesToThePolicy) {
  PowerManager pm(clock_, machine_.base_power, 50);
  auto policy = std::make_unique<RecordingPolicy>();
  RecordingPolicy* p = policy.get();
  DeviceId d = pm.Register(disk_.get(), std::move(policy));
  pm.SendGhostHint(d, {Millis(160), Energy::Millijoules(580)});
  pm.SetKnob(90);
  disk_->RequestMode(1);
  clock_.RunUntilIdle();
  ASSERT_EQ(p->hints.size(), 1u);
  EXPECT_EQ(p->hints[0].time_saved, Millis(160));
  EXPECT_EQ(p->knobs, std::vector<int>{90});
  EXPECT_EQ(p->modes, std::vector<int>{1});
  EXPECT_EQ(pm.ghost_hints_received(d), 1);
  EXPECT_EQ(pm.knob(), 90);
}

TEST_F(PowerManagerTest, EnergyMeterTotalsEqualTheIntegralOfTheModeTimeline) {
  PowerManager pm(clock_, machine_.base_power, 50);
  pm.meter().EnableTimeline();
  pm.Register(disk_.get(), nullptr);
  pm.Register(net_.get(), nullptr);
  // A busy few seconds: I/O on both, mode changes, transitions.
  disk_->Submit({200'000, false}, nullptr);
  net_->Submit({50'000, false}, nullptr);
  clock_.RunUntilIdle();
  clock_.AdvanceBy(Millis(700));
  disk_->RequestMode(2);
  net_->RequestMode(0);
  clock_.RunUntilIdle();
  clock_.AdvanceBy(Seconds(3));
  disk_->Submit({1000, true}, nullptr);
  net_->Submit({8000, true}, nullptr);
  clock_.RunUntilIdle();
  clock_.AdvanceBy(Seconds(1));

  EnergyReport r = pm.meter().Read();
  std::vector<PowerSegment> timeline = pm.meter().Timeline();
  std::vector<double> per_device(2, 0.0);
  std::vector<std::vector<double>> per_mode(2, std::vector<double>(3, 0.0));
  for (const PowerSegment& s : timeline) {
    double j = (s.power * (s.end - s.start)).joules();
    per_device[s.device] += j;
    if (s.mode >= 0) per_mode[s.device][s.mode] += j;
  }
  double base = (machine_.base_power * r.elapsed).joules();
  EXPECT_NEAR(r.base.joules(), base, 1e-9);
  EXPECT_NEAR(r.total.joules(), base + per_device[0] + per_device[1], 1e-9);
  for (int d = 0; d < 2; ++d) {
    EXPECT_NEAR(r.devices[d].energy.joules(), per_device[d], 1e-9);
    for (size_t m = 0; m < r.devices[d].energy_in_mode.size(); ++m) {
      EXPECT_NEAR(r.devices[d].energy_in_mode[m].joules(), per_mode[d][m], 1e-9);
    }
  }
  EXPECT_EQ(r.devices[0].transitions, 2);  // down to standby, back up for the write
  EXPECT_EQ(r.devices[1].transitions, 1);  // PSM → CAM
  // Time in each mode plus transition time covers the whole run.
  for (const DeviceEnergy& d : r.devices) {
    Duration sum = d.transition_time;
    for (Duration t : d.time_in_mode) sum += t;
    EXPECT_EQ(sum, r.elapsed);
  }
}

}  // namespace
}  // namespace ghost
