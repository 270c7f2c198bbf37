#include "common/power/device.h"

#include <gtest/gtest.h>

#include "common/base/clock.h"
#include "common/power/energy_meter.h"
#include "common/power/profile.h"

namespace ghost {
namespace {

class DeviceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    Result<MachineProfile> m = LoadMachineProfile("ipaq-2004", GHOST_PROFILE_DIR);
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    machine_ = *m;
  }
  const DeviceProfile& Disk() const { return *machine_.FindDevice(DeviceKind::kDisk); }
  const DeviceProfile& Net() const { return *machine_.FindDevice(DeviceKind::kNetwork); }

  VirtualClock clock_;
  MachineProfile machine_;
};

TEST_F(DeviceTest, IoInStandbySpinsUpFirst) {
  Device disk(clock_, Disk(), nullptr, 2);
  TimePoint done{};
  disk.Submit({32 * 1024, false}, [&] { done = clock_.Now(); });
  clock_.RunUntilIdle();
  EXPECT_EQ(disk.mode(), 0);
  IoPlan plan = disk.PlanIo({32 * 1024, false}, 0, TimePoint{});
  EXPECT_EQ(done - TimePoint{}, Millis(820) + plan.active);
}

TEST_F(DeviceTest, EstimateMatchesWhatTheIoTakes) {
  for (int mode = 0; mode < 3; ++mode) {
    VirtualClock clock(TimePoint(Millis(1234)));
    Device disk(clock, Disk(), nullptr, mode);
    IoEstimate est = disk.Estimate({100'000, false});
    TimePoint start = clock.Now(), done{};
    disk.Submit({100'000, false}, [&] { done = clock.Now(); });
    clock.RunUntilIdle();
    EXPECT_EQ(done - start, est.time) << "mode " << mode;
  }
  for (int mode = 0; mode < 2; ++mode) {
    VirtualClock clock(TimePoint(Millis(1234)));
    Device net(clock, Net(), &machine_.link, mode);
    IoEstimate est = net.Estimate({20'000, false});
    TimePoint start = clock.Now(), done{};
    net.Submit({20'000, false}, [&] { done = clock.Now(); });
    clock.RunUntilIdle();
    EXPECT_EQ(done - start, est.time) << "mode " << mode;
  }
}

TEST_F(DeviceTest, PsmRoundTripsEndAtBeacons) {
  Device net(clock_, Net(), &machine_.link, Net().ModeIndex("PSM"));
  // Starting at t=10 ms: each 40 ms round trip is delivered at the next 100 ms beacon.
  IoPlan plan = net.PlanIo({0, false}, 1, TimePoint(Millis(10)));
  EXPECT_EQ(plan.wait, Millis(400 - 10));
  IoPlan cam = net.PlanIo({0, false}, 0, TimePoint(Millis(10)));
  EXPECT_EQ(cam.wait, Millis(160));
}

TEST_F(DeviceTest, ModeRequestWhileBusyWaitsForTheIo) {
  Device disk(clock_, Disk(), nullptr, 0);
  bool done = false;
  disk.Submit({1'000'000, false}, [&] { done = true; });
  clock_.RunNext();  // starts the I/O
  ASSERT_TRUE(disk.busy());
  disk.RequestMode(2);
  EXPECT_EQ(disk.mode(), 0);
  EXPECT_EQ(disk.target_mode(), 2);
  clock_.RunUntilIdle();
  EXPECT_TRUE(done);
  EXPECT_EQ(disk.mode(), 2);
}

TEST_F(DeviceTest, DoneNeverRunsInsideSubmit) {
  Device disk(clock_, Disk(), nullptr, 0);
  bool done = false;
  disk.Submit({0, false}, [&] { done = true; });
  EXPECT_FALSE(done);
  clock_.RunUntilIdle();
  EXPECT_TRUE(done);
}

TEST_F(DeviceTest, MeterSeesTransitionAndActivePower) {
  EnergyMeter meter(clock_, Power());
  Device disk(clock_, Disk(), nullptr, 0);
  disk.Attach(&meter, {});
  disk.RequestMode(2);  // 320 ms, 300 mJ
  clock_.RunUntilIdle();
  clock_.AdvanceBy(Seconds(10));
  EnergyReport r = meter.Read();
  ASSERT_EQ(r.devices.size(), 1u);
  const DeviceEnergy& d = r.devices[0];
  EXPECT_EQ(d.transitions, 1);
  EXPECT_NEAR(d.transition_energy.millijoules(), 300, 1e-6);
  EXPECT_EQ(d.time_in_mode[2], Seconds(10));
  EXPECT_NEAR(d.energy_in_mode[2].joules(), 0.8, 1e-9);
  EXPECT_NEAR(d.energy.joules(), 1.1, 1e-9);
}

TEST_F(DeviceTest, EventsReportModesAndIo) {
  Device disk(clock_, Disk(), nullptr, 2);
  std::vector<int> modes;
  int begins = 0, ends = 0;
  Device::Events ev;
  ev.mode_entered = [&](int m) { modes.push_back(m); };
  ev.io_begin = [&](const IoRequest&) { ++begins; };
  ev.io_end = [&](const IoRequest&) { ++ends; };
  disk.Attach(nullptr, ev);
  disk.Submit({10, true}, nullptr);
  clock_.RunUntilIdle();
  EXPECT_EQ(modes, std::vector<int>{0});
  EXPECT_EQ(begins, 1);
  EXPECT_EQ(ends, 1);
  disk.AssertInvariants();
}

}  // namespace
}  // namespace ghost

namespace ghost {
namespace {

TEST_F(DeviceTest, KeptAliveConnectionSkipsTheHandshake) {
  Device net(clock_, Net(), &machine_.link, 0);  // CAM: round trips are plain RTTs
  ASSERT_EQ(machine_.link.round_trips, 4);
  ASSERT_EQ(machine_.link.warm_round_trips, 3);
  EXPECT_EQ(net.PlanIo({0, false}, 0, clock_.Now()).wait, 4 * machine_.link.rtt());  // cold
  net.Submit({1000, false}, nullptr);
  clock_.RunUntilIdle();
  EXPECT_EQ(net.PlanIo({0, false}, 0, clock_.Now() + Seconds(1)).wait, 3 * machine_.link.rtt());
  // After the keep-alive time the connection is gone.
  EXPECT_EQ(net.PlanIo({0, false}, 0, clock_.Now() + machine_.link.keepalive + Seconds(1)).wait,
            4 * machine_.link.rtt());
}

}  // namespace
}  // namespace ghost
