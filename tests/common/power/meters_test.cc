#include "common/power/meters.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include "common/base/clock.h"
#include "tests/common/power/fake_sysfs.h"

namespace ghost {
namespace {

class MetersTest : public ::testing::Test {
 protected:
  void Battery(const std::string& name) {
    fake_.Write("class/power_supply/" + name + "/type", "Battery\n");
    fake_.Write("class/power_supply/" + name + "/status", "Discharging\n");
  }
  void Bat(const std::string& attr, const std::string& v) {
    fake_.Write("class/power_supply/BAT0/" + attr, v + "\n");
  }
  void Rapl(const std::string& zone, const std::string& name, std::uint64_t uj, std::uint64_t max) {
    fake_.Write("class/powercap/" + zone + "/name", name + "\n");
    fake_.Write("class/powercap/" + zone + "/energy_uj", std::to_string(uj) + "\n");
    fake_.Write("class/powercap/" + zone + "/max_energy_range_uj", std::to_string(max) + "\n");
  }
  FakeSysfs fake_;
  VirtualClock clock_;
};

TEST_F(MetersTest, BatteryPowerNowIsMicrowatts) {
  Battery("BAT0");
  Bat("power_now", "9500000");
  BatteryMeter m(fake_.sysfs(), "BAT0");
  MeterReading r = m.Read(clock_.Now());
  ASSERT_TRUE(r.ok) << r.error;
  ASSERT_TRUE(r.power.has_value());
  EXPECT_DOUBLE_EQ(r.power->watts(), 9.5);
  EXPECT_EQ(r.status, "Discharging");
}

TEST_F(MetersTest, BatteryWithoutPowerNowMultipliesCurrentByVoltage) {
  Battery("BAT0");
  Bat("current_now", "800000");   // 0.8 A
  Bat("voltage_now", "12000000");  // 12 V
  BatteryMeter m(fake_.sysfs(), "BAT0");
  MeterReading r = m.Read(clock_.Now());
  ASSERT_TRUE(r.ok) << r.error;
  EXPECT_NEAR(r.power->watts(), 9.6, 1e-9);
}

TEST_F(MetersTest, BatteryEnergyUsedIsTheFallOfEnergyNow) {
  Battery("BAT0");
  Bat("power_now", "10000000");
  Bat("energy_now", "50000000");  // 50 Wh
  BatteryMeter m(fake_.sysfs(), "BAT0");
  (void)m.Read(clock_.Now());
  Bat("energy_now", "49990000");  // 10 mWh = 36 J later
  clock_.AdvanceBy(std::chrono::seconds(4));
  MeterReading r = m.Read(clock_.Now());
  ASSERT_TRUE(r.ok);
  EXPECT_NEAR(r.energy.joules(), 36.0, 1e-6);
  EXPECT_NEAR(r.remaining->joules(), 49.99 * 3600, 1e-6);
}

TEST_F(MetersTest, BatteryWithoutEnergyNowIntegratesPower) {
  Battery("BAT0");
  Bat("power_now", "8000000");
  BatteryMeter m(fake_.sysfs(), "BAT0");
  (void)m.Read(clock_.Now());
  Bat("power_now", "12000000");
  clock_.AdvanceBy(std::chrono::seconds(10));
  MeterReading r = m.Read(clock_.Now());
  EXPECT_NEAR(r.energy.joules(), 100.0, 1e-6);  // trapezoid: (8 + 12) / 2 W × 10 s
}

TEST_F(MetersTest, BatteryRemovedKeepsItsTotalAndSaysAbsent) {
  Battery("BAT0");
  Bat("power_now", "8000000");
  BatteryMeter m(fake_.sysfs(), "BAT0");
  (void)m.Read(clock_.Now());
  clock_.AdvanceBy(std::chrono::seconds(10));
  (void)m.Read(clock_.Now());
  fake_.Remove("class/power_supply/BAT0");
  MeterReading r = m.Read(clock_.Now());
  EXPECT_FALSE(r.ok);
  EXPECT_EQ(r.error, "battery BAT0 absent");
  EXPECT_NEAR(r.energy.joules(), 80.0, 1e-6);
}

TEST_F(MetersTest, BatteryUnreadableAttributeIsAnErrorNotAReading) {
  Battery("BAT0");
  fake_.Mkdir("class/power_supply/BAT0/power_now");  // reading a directory fails (EISDIR)
  BatteryMeter m(fake_.sysfs(), "BAT0");
  MeterReading r = m.Read(clock_.Now());
  EXPECT_FALSE(r.ok);
  EXPECT_NE(r.error.find("power_now"), std::string::npos) << r.error;
}

TEST_F(MetersTest, NoBatteryNoRaplDiscoversNothing) {
  fake_.Write("class/power_supply/AC/type", "Mains\n");
  EXPECT_TRUE(DiscoverMeters(fake_.sysfs()).empty());
}

TEST_F(MetersTest, DiscoversBatteriesAndTopLevelRaplZonesOnly) {
  Battery("BAT1");
  fake_.Write("class/power_supply/BAT1/power_now", "1\n");
  Rapl("intel-rapl:0", "package-0", 5, 100);
  Rapl("intel-rapl:0:0", "core", 5, 100);
  auto meters = DiscoverMeters(fake_.sysfs());
  ASSERT_EQ(meters.size(), 2u);
  EXPECT_EQ(meters[0]->name(), "BAT1");
  EXPECT_EQ(meters[1]->name(), "package-0");
}

TEST_F(MetersTest, RaplCountsEnergyAndPowerBetweenReadings) {
  Rapl("intel-rapl:0", "package-0", 1'000'000, 262'143'328'850);
  RaplMeter m(fake_.sysfs(), "intel-rapl:0");
  MeterReading first = m.Read(clock_.Now());
  EXPECT_TRUE(first.ok);
  EXPECT_FALSE(first.power.has_value());
  fake_.Write("class/powercap/intel-rapl:0/energy_uj", "31000000\n");
  clock_.AdvanceBy(std::chrono::seconds(10));
  MeterReading r = m.Read(clock_.Now());
  EXPECT_NEAR(r.energy.joules(), 30.0, 1e-9);
  EXPECT_NEAR(r.power->watts(), 3.0, 1e-9);
  EXPECT_EQ(r.wraps, 0);
}

TEST_F(MetersTest, RaplCounterWrapAddsTheRestOfTheRange) {
  Rapl("intel-rapl:0", "package-0", 999'000'000, 1'000'000'000);  // 1 J short of 1000 J
  RaplMeter m(fake_.sysfs(), "intel-rapl:0");
  (void)m.Read(clock_.Now());
  fake_.Write("class/powercap/intel-rapl:0/energy_uj", "2000000\n");  // wrapped, then 2 J
  clock_.AdvanceBy(std::chrono::seconds(1));
  MeterReading r = m.Read(clock_.Now());
  ASSERT_TRUE(r.ok);
  EXPECT_NEAR(r.energy.joules(), 3.0, 1e-9);
  EXPECT_EQ(r.wraps, 1);
}

TEST_F(MetersTest, RaplZoneGoneKeepsItsTotal) {
  Rapl("intel-rapl:0", "package-0", 0, 1'000'000'000);
  RaplMeter m(fake_.sysfs(), "intel-rapl:0");
  (void)m.Read(clock_.Now());
  fake_.Write("class/powercap/intel-rapl:0/energy_uj", "5000000\n");
  (void)m.Read(clock_.Now());
  fake_.Remove("class/powercap/intel-rapl:0");
  MeterReading r = m.Read(clock_.Now());
  EXPECT_FALSE(r.ok);
  EXPECT_EQ(r.error, "RAPL zone intel-rapl:0 gone");
  EXPECT_NEAR(r.energy.joules(), 5.0, 1e-9);
}

TEST_F(MetersTest, RaplPermissionDeniedIsReported) {
  if (::geteuid() == 0) GTEST_SKIP() << "root reads a mode-000 file";
  Rapl("intel-rapl:0", "package-0", 0, 1);
  std::filesystem::permissions(fake_.root() + "/class/powercap/intel-rapl:0/energy_uj",
                               std::filesystem::perms::none);
  RaplMeter m(fake_.sysfs(), "intel-rapl:0");
  EXPECT_FALSE(m.Read(clock_.Now()).ok);
}

TEST_F(MetersTest, SamplerHasNoWakeUpsWhileIdle) {
  Rapl("intel-rapl:0", "package-0", 0, 1'000'000'000);
  MeterSampler s(clock_, DiscoverMeters(fake_.sysfs()), std::chrono::seconds(10));
  EXPECT_EQ(s.samples(), 1);  // the first reading
  clock_.AdvanceBy(std::chrono::hours(1));
  EXPECT_EQ(s.samples(), 1);
  EXPECT_FALSE(s.timer_armed());
}

TEST_F(MetersTest, SamplerReadsAtTheIntervalWhileActiveThenStops) {
  Rapl("intel-rapl:0", "package-0", 0, 1'000'000'000);
  MeterSampler s(clock_, DiscoverMeters(fake_.sysfs()), std::chrono::seconds(10));
  s.NoteActivity();
  clock_.AdvanceBy(std::chrono::seconds(10));
  EXPECT_EQ(s.samples(), 2);
  s.NoteActivity();
  clock_.AdvanceBy(std::chrono::seconds(10));
  EXPECT_EQ(s.samples(), 3);
  // No activity in this period: one last reading, then the timer stays off.
  clock_.AdvanceBy(std::chrono::seconds(10));
  EXPECT_EQ(s.samples(), 4);
  clock_.AdvanceBy(std::chrono::minutes(10));
  EXPECT_EQ(s.samples(), 4);
  EXPECT_FALSE(s.timer_armed());
}

TEST_F(MetersTest, SamplerWithoutMetersNeverArmsATimer) {
  MeterSampler s(clock_, {}, std::chrono::seconds(10));
  s.NoteActivity();
  EXPECT_FALSE(s.timer_armed());
  EXPECT_TRUE(s.ToJson().empty());
}

TEST_F(MetersTest, SamplerJsonNamesEachMeter) {
  Battery("BAT0");
  Bat("power_now", "7000000");
  MeterSampler s(clock_, DiscoverMeters(fake_.sysfs()));
  nlohmann::json j = s.ToJson();
  ASSERT_EQ(j.size(), 1u);
  EXPECT_EQ(j[0]["name"], "BAT0");
  EXPECT_EQ(j[0]["kind"], "battery");
  EXPECT_DOUBLE_EQ(j[0]["power_w"].get<double>(), 7.0);
}

}  // namespace
}  // namespace ghost
