#include "common/power/machine.h"

#include <gtest/gtest.h>

#include "common/base/clock.h"
#include "common/power/adaptive_spindown.h"
#include "common/power/default_pm.h"
#include "common/power/stpm_disk.h"
#include "common/power/stpm_network.h"

namespace ghost {
namespace {

class MachineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    Result<MachineProfile> m = LoadMachineProfile("ipaq-2004", GHOST_PROFILE_DIR);
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    profile_ = *m;
  }
  std::unique_ptr<Machine> Build(MachineOptions o) {
    Result<std::unique_ptr<Machine>> m = Machine::Build(clock_, profile_, o);
    EXPECT_TRUE(m.ok()) << m.status().ToString();
    return m.ok() ? std::move(m).value() : nullptr;
  }
  static MachineOptions With(Policy p) {
    MachineOptions o;
    o.policy = p;
    return o;
  }

  VirtualClock clock_;
  MachineProfile profile_;
};

TEST_F(MachineTest, StaticRunsTheDefaultPowerManagement) {
  auto m = Build(With(Policy::kStatic));
  ASSERT_TRUE(m);
  EXPECT_NE(dynamic_cast<const DefaultDiskPolicy*>(m->pm().policy(m->storage_id())), nullptr);
  EXPECT_NE(dynamic_cast<const DefaultNetworkPolicy*>(m->pm().policy(m->network_id())), nullptr);
  EXPECT_FALSE(m->cost().ghost_hints());
  EXPECT_STREQ(m->DiskPolicyName(), "default");
}

TEST_F(MachineTest, AdaptiveRunsStpmOrExpertsWithHints) {
  auto m = Build(With(Policy::kAdaptive));
  ASSERT_TRUE(m);
  EXPECT_NE(dynamic_cast<const StpmDiskPolicy*>(m->pm().policy(m->storage_id())), nullptr);
  EXPECT_NE(dynamic_cast<const StpmNetworkPolicy*>(m->pm().policy(m->network_id())), nullptr);
  EXPECT_TRUE(m->cost().ghost_hints());
  EXPECT_STREQ(m->DiskPolicyName(), "stpm");

  MachineOptions o = With(Policy::kAdaptive);
  o.disk_policy = DiskPolicyKind::kExperts;
  o.ghost_hints = false;
  auto e = Build(o);
  ASSERT_TRUE(e);
  EXPECT_NE(dynamic_cast<const ExpertsDiskPolicy*>(e->pm().policy(e->storage_id())), nullptr);
  EXPECT_FALSE(e->cost().ghost_hints());
  EXPECT_STREQ(e->DiskPolicyName(), "experts");
}

TEST_F(MachineTest, NoneKeepsEveryDeviceInItsHighPowerMode) {
  auto m = Build(With(Policy::kNone));
  ASSERT_TRUE(m);
  EXPECT_EQ(m->pm().policy(m->storage_id()), nullptr);
  EXPECT_EQ(m->pm().policy(m->network_id()), nullptr);
  EXPECT_EQ(m->storage().mode(), m->storage().profile().HighPowerMode());
  EXPECT_EQ(m->network().mode(), m->network().profile().HighPowerMode());
  // Under the managed policies the card starts in its lowest mode.
  auto s = Build(With(Policy::kStatic));
  ASSERT_TRUE(s);
  EXPECT_EQ(s->network().mode(), s->network().profile().LowestMode());
  EXPECT_EQ(s->storage().mode(), s->storage().profile().HighPowerMode());
}

TEST_F(MachineTest, WithoutPowerManagementNoDeviceHasAPolicy) {
  MachineOptions o = With(Policy::kAdaptive);
  o.power_management = false;
  auto m = Build(o);
  ASSERT_TRUE(m);
  EXPECT_EQ(m->pm().policy(m->storage_id()), nullptr);
  EXPECT_EQ(m->pm().policy(m->network_id()), nullptr);
  EXPECT_TRUE(m->adaptive());  // the read policy is still adaptive
}

TEST_F(MachineTest, KnobReachesThePowerManager) {
  MachineOptions o = With(Policy::kAdaptive);
  o.knob = 95;
  auto m = Build(o);
  ASSERT_TRUE(m);
  EXPECT_EQ(m->pm().knob(), 95);
}

TEST_F(MachineTest, RejectsAKnobOutOfRangeAndAProfileWithoutANetwork) {
  MachineOptions o;
  o.knob = 101;
  Result<std::unique_ptr<Machine>> bad = Machine::Build(clock_, profile_, o);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), Status::Code::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("knob 101"), std::string::npos);

  MachineProfile no_net = profile_;
  std::erase_if(no_net.devices, [](const DeviceProfile& d) { return d.kind == DeviceKind::kNetwork; });
  Result<std::unique_ptr<Machine>> none = Machine::Build(clock_, no_net, MachineOptions());
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("needs a disk (or flash) device and a network device"),
            std::string::npos);
}

TEST_F(MachineTest, OnlyAdaptiveDisclosesTransfers) {
  auto a = Build(With(Policy::kAdaptive));
  ASSERT_TRUE(a);
  auto* stpm = dynamic_cast<const StpmNetworkPolicy*>(a->pm().policy(a->network_id()));
  ASSERT_NE(stpm, nullptr);
  std::int64_t before = stpm->stats().transfers;
  a->TransferBegin();
  a->TransferEnd();
  EXPECT_EQ(stpm->stats().transfers, before + 1);

  // Under static a disclosed transfer would wake the card (DefaultNetworkPolicy); it is not
  // disclosed, so the card stays in its power-saving mode.
  auto s = Build(With(Policy::kStatic));
  ASSERT_TRUE(s);
  int lowest = s->network().profile().LowestMode();
  s->TransferBegin();
  clock_.AdvanceBy(Seconds(1.0));
  EXPECT_EQ(s->network().mode(), lowest);
  s->TransferEnd();
}

TEST_F(MachineTest, FloorPowerIsBasePlusEveryLowestMode) {
  auto m = Build(With(Policy::kStatic));
  ASSERT_TRUE(m);
  Power expect = profile_.base_power + m->storage().profile().modes.back().power +
                 m->network().profile().modes.back().power;
  EXPECT_DOUBLE_EQ(m->FloorPower().watts(), expect.watts());
}

TEST_F(MachineTest, DevicesReportOneEntryPerDeviceInJson) {
  auto m = Build(With(Policy::kAdaptive));
  ASSERT_TRUE(m);
  clock_.AdvanceBy(Seconds(10.0));
  std::vector<DeviceResult> r = DeviceResults(m->pm(), m->pm().meter().Read());
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(r[0].kind, "disk");
  EXPECT_EQ(r[1].kind, "network");
  EXPECT_FALSE(r[0].policy.empty());
  nlohmann::ordered_json j = DevicesToJson(r);
  ASSERT_EQ(j.size(), 2u);
  EXPECT_EQ(j[0]["name"], r[0].name);
  EXPECT_TRUE(j[0]["time_in_mode_s"].contains("transition"));
  EXPECT_GT(j[0]["energy_j"].get<double>(), 0.0);
}

TEST(PolicyTest, ParsesWhatAUserMayChoose) {
  EXPECT_EQ(*ParsePolicy("static"), Policy::kStatic);
  EXPECT_EQ(*ParsePolicy("adaptive"), Policy::kAdaptive);
  EXPECT_FALSE(ParsePolicy("none").ok());
  EXPECT_STREQ(PolicyName(Policy::kNone), "none");
}

// The flash log's device (ghostfs --flash-log): a read from the log is charged to it, from its
// own profile, and it is back in its lowest mode once idle.
TEST_F(MachineTest, AReadChargedToTheFlashDeviceMovesItsEnergyNotTheDisks) {
  auto m = Build(With(Policy::kAdaptive));
  auto twin = Build(With(Policy::kAdaptive));  // the same machine on the same clock, no read
  ASSERT_TRUE(m && twin);
  Result<DeviceProfile> sd = LoadDeviceProfile("sd-card", GHOST_PROFILE_DIR);
  ASSERT_TRUE(sd.ok()) << sd.status().ToString();
  Result<DeviceId> id = m->AddFlash(clock_, *sd);
  ASSERT_TRUE(id.ok()) << id.status().ToString();
  ASSERT_NE(m->flash(), nullptr);
  EXPECT_EQ(m->flash_id(), *id);
  EXPECT_EQ(m->flash()->mode(), sd->LowestMode());
  EXPECT_FALSE(m->AddFlash(clock_, *sd).ok());  // one flash device
  clock_.AdvanceBy(Seconds(1));
  const EnergyReport before = m->pm().meter().Read();
  bool done = false;
  const TimePoint start = clock_.Now();
  m->flash()->Submit({Bytes{1} << 20, false}, [&] { done = true; });
  clock_.AdvanceBy(Seconds(2));
  ASSERT_TRUE(done);
  const EnergyReport after = m->pm().meter().Read();
  // 1 MiB at the card's 25 MB/s and 0.66 W, a 1 ms wake-up and the 250 ms tail back to sleep:
  // about 40 + 0.3 + 82.5 mJ, against 2 mJ asleep for the same 2 s.
  const Energy flash = after.devices[*id].energy - before.devices[*id].energy;
  EXPECT_GT(flash.joules(), 0.1);
  EXPECT_LT(flash.joules(), 0.2);
  // The disk drew what it draws without the read.
  const EnergyReport twin_now = twin->pm().meter().Read();
  EXPECT_NEAR(after.devices[m->storage_id()].energy.joules(),
              twin_now.devices[twin->storage_id()].energy.joules(), 1e-6);
  EXPECT_EQ(m->flash()->mode(), sd->LowestMode());
  EXPECT_GE(clock_.Now() - start, Seconds(2));
  // Not a flash device: refused.
  auto m2 = Build(With(Policy::kAdaptive));
  Result<DeviceProfile> disk_profile = LoadDeviceProfile("cu140", GHOST_PROFILE_DIR);
  ASSERT_TRUE(disk_profile.ok());
  EXPECT_FALSE(m2->AddFlash(clock_, *disk_profile).ok());
}

}  // namespace
}  // namespace ghost
