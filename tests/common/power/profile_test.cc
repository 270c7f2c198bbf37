#include "common/power/profile.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>

namespace ghost {
namespace {

TEST(ProfileTest, LoadsTheIpaqMachineWithItsDiskAndCard) {
  Result<MachineProfile> m = LoadMachineProfile("ipaq-2004", GHOST_PROFILE_DIR);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_DOUBLE_EQ(m->base_power.milliwatts(), 1440);
  EXPECT_EQ(m->link.rtt(), Millis(40));
  ASSERT_NE(m->FindDevice(DeviceKind::kDisk), nullptr);
  ASSERT_NE(m->FindDevice(DeviceKind::kNetwork), nullptr);
  const DeviceProfile& disk = *m->FindDevice(DeviceKind::kDisk);
  EXPECT_EQ(disk.name, "microdrive-1gb");
  ASSERT_EQ(disk.modes.size(), 3u);
  EXPECT_DOUBLE_EQ(disk.modes[2].power.milliwatts(), 80);
  Transition up = disk.TransitionCost(2, 0);
  EXPECT_EQ(up.time, Millis(820));
  EXPECT_DOUBLE_EQ(up.energy.millijoules(), 900);
  const DeviceProfile& net = *m->FindDevice(DeviceKind::kNetwork);
  EXPECT_EQ(net.modes[net.ModeIndex("PSM")].beacon_interval, Millis(100));
}

TEST(ProfileTest, EveryShippedProfileLoads) {
  std::vector<std::string> names = ListProfiles(GHOST_PROFILE_DIR);
  ASSERT_GE(names.size(), 12u);
  for (const std::string& n : names) {
    Result<MachineProfile> m = LoadMachineProfile(n, GHOST_PROFILE_DIR);
    EXPECT_TRUE(m.ok()) << n << ": " << m.status().ToString();
  }
}

TEST(ProfileTest, ComposesMissingTransitionsThroughTheHighPowerMode) {
  Result<DeviceProfile> d = ParseDeviceProfile(R"(
kind = "disk"
name = "t"
[[mode]]
name = "on"
power_mw = 1000
serves_io = true
latency_ms = 1
read_kib_s = 1
write_kib_s = 1
active_mw = 1
[[mode]]
name = "a"
power_mw = 10
[[mode]]
name = "b"
power_mw = 5
[[transition]]
from = "on"
to = "a"
time_ms = 10
energy_mj = 1
[[transition]]
from = "a"
to = "on"
time_ms = 20
energy_mj = 2
[[transition]]
from = "on"
to = "b"
time_ms = 30
energy_mj = 3
[[transition]]
from = "b"
to = "on"
time_ms = 40
energy_mj = 4
)", "t.toml");
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  Transition t = d->TransitionCost(1, 2);  // a → on → b
  EXPECT_EQ(t.time, Millis(50));
  EXPECT_DOUBLE_EQ(t.energy.millijoules(), 5);
}

TEST(ProfileTest, UnknownProfileListsTheAvailableOnes) {
  Result<MachineProfile> m = LoadMachineProfile("no-such-device", GHOST_PROFILE_DIR);
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("no-such-device"), std::string::npos);
  EXPECT_NE(m.status().message().find("ipaq-2004"), std::string::npos);
  EXPECT_NE(m.status().message().find("microdrive-1gb"), std::string::npos);
}

struct BadProfile {
  const char* text;
  const char* expect;  // substring of the message, after "bad.toml:LINE: "
  int line;
};

class MalformedProfileTest : public ::testing::TestWithParam<BadProfile> {};

TEST_P(MalformedProfileTest, ErrorNamesFileAndLine) {
  const BadProfile& p = GetParam();
  Result<DeviceProfile> d = ParseDeviceProfile(p.text, "bad.toml");
  ASSERT_FALSE(d.ok());
  const std::string msg = d.status().message();
  EXPECT_EQ(msg.rfind("bad.toml:" + std::to_string(p.line) + ":", 0), 0u) << msg;
  EXPECT_NE(msg.find(p.expect), std::string::npos) << msg;
}

INSTANTIATE_TEST_SUITE_P(
    ProfileTest, MalformedProfileTest,
    ::testing::Values(
        BadProfile{"kind = \"disk\"\nname = \"x\"\n[[mode]]\nname = \"on\"\npower_mw = \"lots\"\n",
                   "\"power_mw\" must be a number in 0..1e9", 5},
        BadProfile{"kind = \"disk\"\nname = \"x\"\n[[mode]]\nname = \"on\"\npower_mw = -3\n",
                   "in 0..1e9", 5},
        // Found by profile_fuzz: a latency too long for a Duration was undefined behaviour.
        BadProfile{"kind = \"disk\"\nname = \"x\"\n[[mode]]\nname = \"on\"\npower_mw = 1\n"
                   "serves_io = true\nlatency_ms = 2.5e75\n",
                   "\"latency_ms\" must be a number in 0..1e9", 7},
        BadProfile{"kind = \"disk\"\nname = \"x\"\n[[mode]]\nname = \"on\"\npower_mw = inf\n",
                   "in 0..1e9", 5},
        // The idle-time cleaner's threshold (round 13): a negative one is refused, not "unset".
        BadProfile{"kind = \"flash\"\nname = \"x\"\nclean_idle_ms = -1\n", "\"clean_idle_ms\" must be a number in 0..1e9", 3},
        // Wear levelling every Nth cleaning (round 16): N is a whole number.
        BadProfile{"kind = \"flash\"\nname = \"x\"\nclean_wear_shuffle = 2.5\n",
                   "\"clean_wear_shuffle\" must be a whole number", 3},
        BadProfile{"kind = \"tape\"\nname = \"x\"\n", "kind \"tape\"", 1},
        BadProfile{"kind = \"disk\"\nname = \"x\"\n[[mode]\n", "", 3},  // TOML syntax error
        BadProfile{"kind = \"disk\"\nname = \"x\"\n[[mode]]\nname = \"on\"\npower_mw = 1\nserves_io = true\n"
                   "latency_ms = 1\nread_kib_s = 1\nwrite_kib_s = 1\nactive_mw = 1\n"
                   "[[transition]]\nfrom = \"on\"\nto = \"off\"\ntime_ms = 1\nenergy_mj = 1\n",
                   "unknown mode \"off\"", 11}));

TEST(ProfileTest, DeviceProfileBecomesAMachineOnTheIpaq) {
  Result<MachineProfile> m = LoadMachineProfile("cu140", GHOST_PROFILE_DIR);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->devices[0].name, "cu140");
  ASSERT_NE(m->FindDevice(DeviceKind::kNetwork), nullptr);
  EXPECT_DOUBLE_EQ(m->base_power.milliwatts(), 1440);
}


TEST(ProfileTest, UnknownProfileNamesTheDirectoryItLookedIn) {
  Result<MachineProfile> m = LoadMachineProfile("no-such-device", GHOST_PROFILE_DIR);
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find(GHOST_PROFILE_DIR), std::string::npos)
      << m.status().message();
}

TEST(ProfileTest, EmptyProfileDirectorySaysWhereToPointGhostProfileDir) {
  const std::string empty = ::testing::TempDir() + "/ghost-no-profiles";
  std::filesystem::create_directories(empty);
  Result<MachineProfile> m = LoadMachineProfile("ipaq-2004", empty);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), Status::Code::kNotFound);
  EXPECT_NE(m.status().message().find("no profiles in " + empty), std::string::npos)
      << m.status().message();
  EXPECT_NE(m.status().message().find("$GHOST_PROFILE_DIR"), std::string::npos);
}

TEST(ProfileTest, GhostProfileDirOverridesEveryOtherPlace) {
  const char* old = std::getenv("GHOST_PROFILE_DIR");
  const std::string saved = old ? old : "";
  setenv("GHOST_PROFILE_DIR", "/somewhere/profiles", 1);
  EXPECT_EQ(ProfileDirCandidates(), std::vector<std::string>{"/somewhere/profiles"});
  EXPECT_EQ(DefaultProfileDir(), "/somewhere/profiles");
  if (old) {
    setenv("GHOST_PROFILE_DIR", saved.c_str(), 1);
  } else {
    unsetenv("GHOST_PROFILE_DIR");
  }
}

TEST(ProfileTest, ProgramInTheBuildTreeUsesTheSourceTreeProfiles) {
  // This test binary runs uninstalled, from the build tree.
  const char* old = std::getenv("GHOST_PROFILE_DIR");
  const std::string saved = old ? old : "";
  unsetenv("GHOST_PROFILE_DIR");
  EXPECT_EQ(DefaultProfileDir(), std::string(GHOST_PROFILE_DIR));
  Result<MachineProfile> m = LoadMachineProfile("ipaq-2004");
  EXPECT_TRUE(m.ok()) << m.status().message();
  if (old) setenv("GHOST_PROFILE_DIR", saved.c_str(), 1);
}

}  // namespace
}  // namespace ghost
