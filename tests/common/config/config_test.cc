// ghostfs's config file (common/config/config.h): the keys of the machine's own devices, and
// that a bad value or an unknown key is refused with its place in the file.
#include "common/config/config.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>

namespace ghost {
namespace {

class ConfigFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/ghost-config-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    path_ = dir_ + "/ghostfs.conf";
  }
  void TearDown() override {
    std::remove(path_.c_str());
    rmdir(dir_.c_str());
  }
  Status Load(const std::string& text, GhostfsOptions* o) {
    std::ofstream(path_) << text;
    return LoadConfigFile(path_, o);
  }
  std::string dir_, path_;
};

TEST_F(ConfigFileTest, ReadsTheRealDeviceKeys) {
  GhostfsOptions o;
  ASSERT_TRUE(Load("devices = \"auto\"\nmanage_disk = \"/dev/sdb\"\nforce_manage_disk = true\n", &o).ok());
  EXPECT_EQ(o.devices, "auto");
  EXPECT_EQ(o.manage_disk, "/dev/sdb");
  EXPECT_TRUE(o.force_manage_disk);
}

TEST_F(ConfigFileTest, DevicesDefaultToTheModelOnly) {
  GhostfsOptions o;
  ASSERT_TRUE(Load("knob = 30\n", &o).ok());
  EXPECT_EQ(o.devices, "none");
  EXPECT_TRUE(o.manage_disk.empty());
  EXPECT_FALSE(o.force_manage_disk);
  EXPECT_EQ(o.knob, 30);
}

TEST_F(ConfigFileTest, ABadDevicesValueIsRefusedWithItsLine) {
  GhostfsOptions o;
  Status s = Load("knob = 50\ndevices = \"sometimes\"\n", &o);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("ghostfs.conf:2"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("\"auto\" or \"none\""), std::string::npos) << s.message();
}

TEST_F(ConfigFileTest, ANonBooleanForceIsRefused) {
  GhostfsOptions o;
  Status s = Load("force_manage_disk = \"yes\"\n", &o);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("force_manage_disk must be true or false"), std::string::npos) << s.message();
}

TEST_F(ConfigFileTest, AnUnknownKeyIsRefused) {
  GhostfsOptions o;
  Status s = Load("manage_disks = \"/dev/sdb\"\n", &o);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("unknown key \"manage_disks\""), std::string::npos) << s.message();
}

TEST_F(ConfigFileTest, SizesAreBytesOrSuffixedStrings) {
  GhostfsOptions o;
  EXPECT_EQ(o.fill_backlog_max, Bytes{64} << 20);  // the default
  ASSERT_TRUE(Load("cache_size = \"2G\"\nwrite_queue_cap = 4096\nfill_backlog_max = \"1M\"\n", &o).ok());
  EXPECT_EQ(o.cache_size, Bytes{2} << 30);
  EXPECT_EQ(o.write_queue_cap, 4096u);
  EXPECT_EQ(o.fill_backlog_max, Bytes{1} << 20);
}

TEST_F(ConfigFileTest, ABadSizeIsRefusedWithItsLineAndWhy) {
  struct Case {
    const char* text;
    const char* says;
  };
  for (const Case& c : {Case{"knob = 1\ncache_size = -5\n", "ghostfs.conf:2: \"cache_size\" must not be negative"},
                        Case{"cache_size = \"5Q\"\n", "unknown suffix \"Q\""},
                        Case{"write_queue_cap = true\n", "\"write_queue_cap\" must be a size"}}) {
    GhostfsOptions o;
    Status s = Load(c.text, &o);
    ASSERT_FALSE(s.ok()) << c.text;
    EXPECT_NE(s.message().find(c.says), std::string::npos) << c.text << " -> " << s.message();
  }
}

TEST_F(ConfigFileTest, ATimeOutOfRangeIsRefusedNotConverted) {
  // 1e300 seconds does not fit a Duration; converting it was undefined behaviour.
  for (const char* text : {"max_stale = 1e300\n", "stall_timeout = -1\n", "heuristic_freshness = nan\n"}) {
    GhostfsOptions o;
    Status s = Load(text, &o);
    ASSERT_FALSE(s.ok()) << text;
    EXPECT_NE(s.message().find("must be a number of seconds in 0..1e9"), std::string::npos)
        << text << " -> " << s.message();
  }
}

TEST_F(ConfigFileTest, ReadsTheFlashLogKeys) {
  GhostfsOptions o;
  EXPECT_TRUE(o.flash_log.empty());
  EXPECT_EQ(o.flash_policy, "when-full");
  EXPECT_EQ(o.flash_alg, 4);
  ASSERT_TRUE(Load("flash_log = \"/mnt/sd/ghost:8M\"\nflash_policy = \"each-spinup\"\nflash_alg = 2\n", &o).ok());
  EXPECT_EQ(o.flash_log, "/mnt/sd/ghost:8M");
  EXPECT_EQ(o.flash_policy, "each-spinup");
  EXPECT_EQ(o.flash_alg, 2);
  // The log's device profile (Machine::AddFlash): sd-card unless the file says otherwise.
  EXPECT_EQ(o.flash_device, "sd-card");
  ASSERT_TRUE(Load("flash_device = \"intel-flash\"\n", &o).ok());
  EXPECT_EQ(o.flash_device, "intel-flash");
}

TEST_F(ConfigFileTest, BadFlashLogValuesAreRefusedWithTheKey) {
  GhostfsOptions o;
  Status policy = Load("flash_policy = \"sometimes\"\n", &o);
  ASSERT_FALSE(policy.ok());
  EXPECT_NE(policy.message().find("flash_policy must be"), std::string::npos) << policy.message();
  Status alg = Load("flash_alg = 5\n", &o);
  ASSERT_FALSE(alg.ok());
  EXPECT_NE(alg.message().find("flash_alg must be 1, 2, 3 or 4"), std::string::npos) << alg.message();
}

}  // namespace
}  // namespace ghost
