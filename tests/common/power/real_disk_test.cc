#include "common/power/real_disk.h"

#include <gtest/gtest.h>
#include <sys/sysmacros.h>

#include <cerrno>
#include <deque>

#include "common/power/profile.h"
#include "tests/common/power/fake_sysfs.h"

namespace ghost {
namespace {

// The disk's side of SG_IO: records each command block, answers from a script.
class FakeSgIo final : public SgIo {
 public:
  struct Log {
    std::vector<AtaCdb> sent;
    std::deque<Result<SgIoReply>> replies;
    // When the script is empty: a CHECK POWER MODE answer with this count.
    std::uint8_t power_count = 0xff;
  };
  explicit FakeSgIo(Log* log) : log_(log) {}
  Result<SgIoReply> Execute(const AtaCdb& cdb) override {
    log_->sent.push_back(cdb);
    if (!log_->replies.empty()) {
      Result<SgIoReply> r = std::move(log_->replies.front());
      log_->replies.pop_front();
      return r;
    }
    if (cdb[14] == kAtaStandbyImmediate) log_->power_count = 0x00;
    if (cdb[14] == kAtaIdleImmediate) log_->power_count = 0x80;
    return Ok(log_->power_count);
  }
  // A successful reply as libata sends it: CHECK CONDITION, DRIVER_SENSE, descriptor sense
  // with the ATA Status Return descriptor.
  static SgIoReply Ok(std::uint8_t count, std::uint8_t status = 0x50, std::uint8_t error = 0) {
    SgIoReply r;
    r.status = 0x02;
    r.driver_status = 0x08;
    r.sense.assign(8 + 14, 0);
    r.sense[0] = 0x72;
    r.sense[7] = 14;
    r.sense[8] = 0x09;
    r.sense[9] = 0x0c;
    r.sense[8 + 3] = error;
    r.sense[8 + 5] = count;
    r.sense[8 + 13] = status;
    return r;
  }

 private:
  Log* log_;
};

AtaCdb Expected(std::uint8_t command) {
  return {0x85, 0x06, 0x20, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x40, command, 0};
}

TEST(AtaCdbTest, CheckPowerModeBlockIsHdparmsBytes) {
  EXPECT_EQ(AtaNonDataCdb(0xE5), Expected(0xE5));
}

TEST(AtaCdbTest, StandbyAndIdleImmediateBlocks) {
  EXPECT_EQ(AtaNonDataCdb(kAtaStandbyImmediate), Expected(0xE0));
  EXPECT_EQ(AtaNonDataCdb(kAtaIdleImmediate), Expected(0xE1));
}

TEST(AtaReplyTest, PowerModeNamesAsHdparm) {
  EXPECT_EQ(AtaPowerModeName(0x00), "standby");
  EXPECT_EQ(AtaPowerModeName(0x80), "idle");
  EXPECT_EQ(AtaPowerModeName(0xff), "active/idle");
  EXPECT_EQ(AtaPowerModeName(0x82), "idle_b");
  EXPECT_EQ(AtaPowerModeName(0x13), "unknown");
}

TEST(AtaReplyTest, ErrBitIsARefusal) {
  Result<AtaRegisters> r = ParseAtaReply(FakeSgIo::Ok(0, 0x51, 0x04));  // ERR, ABRT
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("0x51"), std::string::npos);
}

TEST(AtaReplyTest, NoDescriptorIsAnError) {
  SgIoReply r = FakeSgIo::Ok(0);
  r.sense[0] = 0x70;  // fixed-format sense: no ATA registers
  EXPECT_FALSE(ParseAtaReply(r).ok());
  r = FakeSgIo::Ok(0);
  r.host_status = 0x07;  // DID_ERROR
  EXPECT_FALSE(ParseAtaReply(r).ok());
}

class AtaDiskBackendTest : public ::testing::Test {
 protected:
  std::unique_ptr<AtaDiskBackend> Make(bool manage) {
    RealDiskOptions o;
    o.info.disk = "sda";
    o.info.rotational = true;
    o.manage = manage;
    return std::make_unique<AtaDiskBackend>(o, std::make_unique<FakeSgIo>(&log_));
  }
  void SetUp() override {
    Result<DeviceProfile> p = LoadDeviceProfile("laptop-hdd", GHOST_PROFILE_DIR);
    ASSERT_TRUE(p.ok()) << p.status().ToString();
    profile_ = *p;
  }
  int Mode(const std::string& name) { return profile_.ModeIndex(name); }
  FakeSgIo::Log log_;
  DeviceProfile profile_;
};

TEST_F(AtaDiskBackendTest, ReadsThePowerModeAtStart) {
  log_.power_count = 0x00;
  auto b = Make(true);
  ASSERT_EQ(log_.sent.size(), 1u);
  EXPECT_EQ(log_.sent[0], Expected(0xE5));
  EXPECT_EQ(b->hardware_mode(), "standby");
}

TEST_F(AtaDiskBackendTest, StandbyModeSendsStandbyImmediateAndReadsItBack) {
  auto b = Make(true);
  log_.sent.clear();
  b->Apply(profile_, Mode("standby"));
  ASSERT_EQ(log_.sent.size(), 2u);
  EXPECT_EQ(log_.sent[0], Expected(0xE0));
  EXPECT_EQ(log_.sent[1], Expected(0xE5));
  EXPECT_EQ(b->hardware_mode(), "standby");
  EXPECT_EQ(b->ToJson()["hardware_mode"], "standby");
}

TEST_F(AtaDiskBackendTest, LeavingStandbySendsIdleImmediate) {
  log_.power_count = 0x00;
  auto b = Make(true);
  log_.sent.clear();
  b->Apply(profile_, Mode("performance-idle"));
  ASSERT_EQ(log_.sent.size(), 2u);
  EXPECT_EQ(log_.sent[0], Expected(0xE1));
  EXPECT_EQ(b->hardware_mode(), "idle");
}

TEST_F(AtaDiskBackendTest, SpinningDiskAskedForAnIdleModeGetsNoCommand) {
  auto b = Make(true);  // active/idle
  log_.sent.clear();
  b->Apply(profile_, Mode("low-power-idle"));
  ASSERT_EQ(log_.sent.size(), 1u);  // only the read-back
  EXPECT_EQ(log_.sent[0], Expected(0xE5));
}

TEST_F(AtaDiskBackendTest, ReadBackShowsWhatTheDiskSaysNotWhatWasAsked) {
  auto b = Make(true);
  log_.replies.push_back(FakeSgIo::Ok(0));     // STANDBY IMMEDIATE accepted...
  log_.replies.push_back(FakeSgIo::Ok(0xff));  // ...but the disk reports active/idle
  b->Apply(profile_, Mode("standby"));
  EXPECT_EQ(b->hardware_mode(), "active/idle");
}

TEST_F(AtaDiskBackendTest, UnmanagedDiskOnlyReads) {
  auto b = Make(false);
  log_.sent.clear();
  b->Apply(profile_, Mode("standby"));
  EXPECT_TRUE(log_.sent.empty());
  EXPECT_FALSE(b->ToJson()["managed"].get<bool>());
}

TEST_F(AtaDiskBackendTest, EioIsReportedAndTheDiskStaysManaged) {
  auto b = Make(true);
  log_.replies.push_back(Status::FromErrno(EIO, "SG_IO on /dev/sda"));
  b->Apply(profile_, Mode("standby"));
  nlohmann::json j = b->ToJson();
  EXPECT_TRUE(j["managed"].get<bool>());
  EXPECT_NE(j["error"].get<std::string>().find("STANDBY IMMEDIATE"), std::string::npos) << j.dump();
  EXPECT_NE(j["error"].get<std::string>().find("Input/output error"), std::string::npos) << j.dump();
}

TEST_F(AtaDiskBackendTest, EpermMakesTheDiskModelOnly) {
  auto b = Make(true);
  log_.replies.push_back(Status::FromErrno(EPERM, "SG_IO on /dev/sda"));
  b->Apply(profile_, Mode("standby"));
  nlohmann::json j = b->ToJson();
  EXPECT_FALSE(j["managed"].get<bool>());
  EXPECT_NE(j["error"].get<std::string>().find("CAP_SYS_RAWIO"), std::string::npos) << j.dump();
  log_.sent.clear();
  b->Apply(profile_, Mode("standby"));
  EXPECT_TRUE(log_.sent.empty());
}

TEST_F(AtaDiskBackendTest, DiskGoneIsModelOnlyAndSaysSo) {
  auto b = Make(true);
  log_.replies.push_back(Status::FromErrno(ENODEV, "SG_IO on /dev/sda"));
  b->Apply(profile_, Mode("standby"));
  nlohmann::json j = b->ToJson();
  EXPECT_FALSE(j["managed"].get<bool>());
  EXPECT_EQ(j["hardware_mode"], "gone");
  EXPECT_EQ(j["error"], "/dev/sda is gone; the disk is modelled only");
  b->Refresh();  // no device left to ask
  EXPECT_EQ(b->ToJson()["hardware_mode"], "gone");
}

TEST_F(AtaDiskBackendTest, DiskWithoutAtaPassThroughIsModelOnly) {
  log_.replies.push_back(Status::FromErrno(ENOTTY, "SG_IO on /dev/sda"));  // virtio-blk
  auto b = Make(true);
  nlohmann::json j = b->ToJson();
  EXPECT_FALSE(j["managed"].get<bool>());
  EXPECT_EQ(j["hardware_mode"], "n/a");
  EXPECT_NE(j["error"].get<std::string>().find("takes no ATA commands"), std::string::npos) << j.dump();
  log_.sent.clear();
  b->Apply(profile_, Mode("standby"));
  b->Refresh();
  EXPECT_TRUE(log_.sent.empty());
}

TEST_F(AtaDiskBackendTest, DriveRefusingTheCommandIsAnError) {
  auto b = Make(true);
  log_.replies.push_back(FakeSgIo::Ok(0, 0x51, 0x04));
  b->Apply(profile_, Mode("standby"));
  EXPECT_NE(b->ToJson()["error"].get<std::string>().find("refused"), std::string::npos);
}

TEST(SysfsBlockTest, PartitionResolvesToItsWholeDisk) {
  FakeSysfs fake;
  fake.AddDisk("sda", 8, 0, true, "ST320LT030");
  Result<BlockDeviceInfo> info = fake.sysfs().BlockDevice(makedev(8, 1));
  ASSERT_TRUE(info.ok()) << info.status().ToString();
  EXPECT_EQ(info->disk, "sda");
  EXPECT_EQ(info->partition, "sda1");
  EXPECT_TRUE(info->rotational);
  EXPECT_EQ(info->model, "ST320LT030");
}

TEST(SysfsBlockTest, AnonymousDeviceIsNotABlockDevice) {
  FakeSysfs fake;
  Result<BlockDeviceInfo> info = fake.sysfs().BlockDevice(makedev(0, 42));
  ASSERT_FALSE(info.ok());
  EXPECT_NE(info.status().message().find("not a block device"), std::string::npos);
}

TEST(SysfsBlockTest, ByNameAcceptsDevPathsAndPartitions) {
  FakeSysfs fake;
  fake.AddDisk("sdb", 8, 16, false);
  EXPECT_EQ(fake.sysfs().BlockDeviceByName("/dev/sdb")->disk, "sdb");
  EXPECT_EQ(fake.sysfs().BlockDeviceByName("/dev/sdb1")->disk, "sdb");
  EXPECT_FALSE(fake.sysfs().BlockDeviceByName("/dev/sdz").ok());
  EXPECT_FALSE(fake.sysfs().BlockDeviceByName("../etc").ok());
}

TEST(SsdBackendTest, NvmeReportsApstReadOnly) {
  FakeSysfs fake;
  fake.AddDisk("nvme0n1", 259, 0, false);
  fake.Write("block/nvme0n1/device/power/runtime_status", "active\n");
  fake.Write("class/nvme/nvme0/power/pm_qos_latency_tolerance_us", "100000\n");
  SsdBackend b(fake.sysfs(), *fake.sysfs().BlockDeviceByName("nvme0n1"));
  nlohmann::json j = b.ToJson();
  EXPECT_EQ(j["backend"], "nvme");
  EXPECT_FALSE(j["managed"].get<bool>());
  EXPECT_TRUE(j["apst"].get<bool>());
  EXPECT_EQ(j["hardware_mode"], "active");
}

}  // namespace
}  // namespace ghost
