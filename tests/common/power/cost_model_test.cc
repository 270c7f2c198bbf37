#include "common/power/cost_model.h"

#include <gtest/gtest.h>

#include "common/base/clock.h"
#include "common/power/device.h"
#include "common/power/power_manager.h"
#include "common/power/profile.h"

namespace ghost {
namespace {

constexpr Bytes k32K = 32 * 1024;
constexpr Bytes k512K = 512 * 1024;

// The ipaq-2004 machine with its disk and network card in chosen modes and no policies, so
// the modes stay put while the estimates are read.
class CostModelTest : public ::testing::Test {
 protected:
  void Build(const char* disk_mode, const char* net_mode) {
    Result<MachineProfile> m = LoadMachineProfile("ipaq-2004", GHOST_PROFILE_DIR);
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    machine_ = *m;
    const DeviceProfile& disk = *machine_.FindDevice(DeviceKind::kDisk);
    const DeviceProfile& net = *machine_.FindDevice(DeviceKind::kNetwork);
    disk_ = std::make_unique<Device>(clock_, disk, nullptr, disk.ModeIndex(disk_mode));
    net_ = std::make_unique<Device>(clock_, net, &machine_.link, net.ModeIndex(net_mode));
    pm_ = std::make_unique<PowerManager>(clock_, machine_.base_power, 50);
    disk_id_ = pm_->Register(disk_.get(), nullptr);
    net_id_ = pm_->Register(net_.get(), nullptr);
    model_ = std::make_unique<CostModel>(*pm_);
  }
  Holder DiskHolder() const { return {Source::kDisk, disk_id_}; }
  Holder NetHolder() const { return {Source::kNetwork, net_id_}; }

  VirtualClock clock_;
  MachineProfile machine_;
  std::unique_ptr<Device> disk_, net_;
  std::unique_ptr<PowerManager> pm_;
  std::unique_ptr<CostModel> model_;
  DeviceId disk_id_ = -1, net_id_ = -1;
};

// A calibration point holds if within ±20% of the paper's figure (DESIGN §5).
void ExpectWithin20Percent(double got, double want, const char* what) {
  EXPECT_GE(got, want * 0.8) << what;
  EXPECT_LE(got, want * 1.2) << what;
}

TEST_F(CostModelTest, Figure3SmallItemFromStandbyDiskTakes820msAnd2_3J) {
  Build("standby", "PSM");
  SourceEstimate e = model_->Estimate(DiskHolder(), k32K);
  ExpectWithin20Percent(ToMillis(e.time), 820, "time (ms)");
  ExpectWithin20Percent(e.energy.joules(), 2.3, "energy (J)");
}

TEST_F(CostModelTest, Figure3SmallItemFromNetworkInCamTakes250msAnd0_9J) {
  Build("standby", "CAM");
  SourceEstimate e = model_->Estimate(NetHolder(), k32K);
  ExpectWithin20Percent(ToMillis(e.time), 250, "time (ms)");
  ExpectWithin20Percent(e.energy.joules(), 0.9, "energy (J)");
}

TEST_F(CostModelTest, Figure3PerformanceIdleDiskWouldSave160msAnd580mJ) {
  Build("standby", "CAM");
  Holder holders[] = {DiskHolder(), NetHolder()};
  Choice c = model_->Choose(holders, k32K);
  EXPECT_EQ(c.chosen.holder.source, Source::kNetwork);
  EXPECT_EQ(c.ideal.holder.source, Source::kDisk);
  ASSERT_TRUE(c.hinted);
  ExpectWithin20Percent(ToMillis(c.hint.time_saved), 160, "time saved (ms)");
  ExpectWithin20Percent(c.hint.energy_saved.millijoules(), 580, "energy saved (mJ)");
  EXPECT_EQ(pm_->ghost_hints_received(disk_id_), 1);
}

TEST_F(CostModelTest, Figure3LargeItemIsAbout320msFasterFromStandbyDiskThanCamNetwork) {
  Build("standby", "CAM");
  SourceEstimate disk = model_->Estimate(DiskHolder(), k512K);
  SourceEstimate net = model_->Estimate(NetHolder(), k512K);
  ExpectWithin20Percent(ToMillis(net.time - disk.time), 320, "disk advantage (ms)");
}

TEST_F(CostModelTest, ChoosesDiskWhenItIsSpinning) {
  Build("performance-idle", "PSM");
  Holder holders[] = {DiskHolder(), NetHolder()};
  Choice c = model_->Choose(holders, k32K);
  EXPECT_EQ(c.chosen.holder.source, Source::kDisk);
  EXPECT_FALSE(c.hinted);
}

TEST_F(CostModelTest, KnobDecidesBetweenFastAndFrugalSources) {
  // A 512 KiB item: the standby disk is faster, the PSM network is slower. At K=100 only
  // time counts, so the disk wins; the pure-energy choice (K=0) is whichever costs fewer
  // joules, which must be the one with the smaller energy estimate.
  Build("standby", "CAM");
  Holder holders[] = {DiskHolder(), NetHolder()};
  pm_->SetKnob(100);
  Choice fast = model_->Choose(holders, k512K);
  EXPECT_EQ(fast.chosen.holder.source, Source::kDisk);
  pm_->SetKnob(0);
  Choice frugal = model_->Choose(holders, k512K);
  SourceEstimate disk = model_->Estimate(DiskHolder(), k512K);
  SourceEstimate net = model_->Estimate(NetHolder(), k512K);
  EXPECT_EQ(frugal.chosen.holder.source, disk.energy < net.energy ? Source::kDisk : Source::kNetwork);
}

TEST_F(CostModelTest, NoGhostHintWhenDisabled) {
  Build("standby", "CAM");
  model_->set_ghost_hints(false);
  Holder holders[] = {DiskHolder(), NetHolder()};
  Choice c = model_->Choose(holders, k32K);
  EXPECT_FALSE(c.hinted);
  EXPECT_EQ(pm_->ghost_hints_received(disk_id_), 0);
}

TEST_F(CostModelTest, PsmNetworkWaitsForBeacons) {
  Build("standby", "PSM");
  SourceEstimate psm = model_->Estimate(NetHolder(), k32K);
  SourceEstimate cam = model_->Estimate(NetHolder(), k32K, /*best_mode=*/true);
  // Four round trips each end at a 100 ms beacon instead of after 40 ms.
  EXPECT_GE(psm.time - cam.time, Millis(200));
  EXPECT_LE(psm.time - cam.time, Millis(400));
}

TEST_F(CostModelTest, WeightedCostFollowsEquation4) {
  EXPECT_DOUBLE_EQ(WeightedCost(Seconds(2), Energy::Joules(3), 50), 2 * 50 + 3 * 50);
  EXPECT_DOUBLE_EQ(WeightedCost(Seconds(2), Energy::Joules(3), 100), 200);
  EXPECT_DOUBLE_EQ(WeightedCost(Seconds(2), Energy::Joules(3), 0), 300);
}

}  // namespace
}  // namespace ghost
