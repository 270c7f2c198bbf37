#include "common/power/hardware.h"

#include <gtest/gtest.h>
#include <linux/capability.h>
#include <linux/netlink.h>
#include <linux/nl80211.h>
#include <linux/rtnetlink.h>
#include <netlink/genl/genl.h>
#include <netlink/msg.h>
#include <sys/sysmacros.h>

#include "common/power/machine.h"
#include "tests/common/power/fake_sysfs.h"

namespace ghost {
namespace {

std::string Serialize(nl_msg* m) {
  nlmsghdr* h = nlmsg_hdr(m);
  std::string s(reinterpret_cast<const char*>(h), h->nlmsg_len);
  nlmsg_free(m);
  return s;
}

// rtnetlink: every route is over `oif`. Generic netlink: one nl80211 card.
class FakeNetlink final : public NetlinkTransport {
 public:
  struct State {
    int oif = 3;
    bool ps = true;
    int sets = 0;
  };
  FakeNetlink(int protocol, State* s) : protocol_(protocol), s_(s) {}
  Result<std::vector<std::string>> Exchange(const std::string& req) override {
    auto* h = reinterpret_cast<const nlmsghdr*>(req.data());
    if (protocol_ == NETLINK_ROUTE) {
      nl_msg* m = nlmsg_alloc_simple(RTM_NEWROUTE, 0);
      rtmsg rt{};
      nlmsg_append(m, &rt, sizeof rt, NLMSG_ALIGNTO);
      nla_put_u32(m, RTA_OIF, static_cast<std::uint32_t>(s_->oif));
      return std::vector<std::string>{Serialize(m)};
    }
    nl_msg* m = nlmsg_alloc();
    if (h->nlmsg_type == GENL_ID_CTRL) {
      genlmsg_put(m, 0, h->nlmsg_seq, GENL_ID_CTRL, 0, 0, CTRL_CMD_NEWFAMILY, 1);
      nla_put_u16(m, CTRL_ATTR_FAMILY_ID, 0x1c);
      return std::vector<std::string>{Serialize(m)};
    }
    auto* g = static_cast<const genlmsghdr*>(NLMSG_DATA(h));
    if (g->cmd == NL80211_CMD_SET_POWER_SAVE) {
      nlattr* tb[NL80211_ATTR_MAX + 1] = {};
      genlmsg_parse(const_cast<nlmsghdr*>(h), 0, tb, NL80211_ATTR_MAX, nullptr);
      s_->ps = nla_get_u32(tb[NL80211_ATTR_PS_STATE]) == NL80211_PS_ENABLED;
      ++s_->sets;
      nlmsg_free(m);
      return std::vector<std::string>{};
    }
    genlmsg_put(m, 0, h->nlmsg_seq, 0x1c, 0, 0, NL80211_CMD_GET_POWER_SAVE, 0);
    nla_put_u32(m, NL80211_ATTR_PS_STATE, s_->ps ? 1 : 0);
    return std::vector<std::string>{Serialize(m)};
  }

 private:
  int protocol_;
  State* s_;
};

class FakeSg final : public SgIo {
 public:
  explicit FakeSg(std::vector<std::uint8_t>* commands) : commands_(commands) {}
  Result<SgIoReply> Execute(const AtaCdb& cdb) override {
    commands_->push_back(cdb[14]);
    if (cdb[14] == kAtaStandbyImmediate) count_ = 0;
    if (cdb[14] == kAtaIdleImmediate) count_ = 0x80;
    SgIoReply r;
    r.status = 2;
    r.driver_status = 8;
    r.sense.assign(22, 0);
    r.sense[0] = 0x72;
    r.sense[7] = 14;
    r.sense[8] = 9;
    r.sense[9] = 12;
    r.sense[13] = count_;
    r.sense[21] = 0x50;
    return r;
  }

 private:
  std::vector<std::uint8_t>* commands_;
  std::uint8_t count_ = 0xff;
};

class HardwareTest : public ::testing::Test {
 protected:
  HardwareLayers Layers() {
    HardwareLayers l;
    l.sysfs = fake_.sysfs();
    l.open_sg = [this](const std::string& path) -> Result<std::unique_ptr<SgIo>> {
      opened_.push_back(path);
      return std::unique_ptr<SgIo>(new FakeSg(&ata_));
    };
    l.open_netlink = [this](int protocol) -> Result<std::unique_ptr<NetlinkTransport>> {
      return std::unique_ptr<NetlinkTransport>(new FakeNetlink(protocol, &net_));
    };
    l.has_capability = [this](int cap) {
      return cap == CAP_SYS_RAWIO ? rawio_ : cap == CAP_NET_ADMIN ? net_admin_ : false;
    };
    l.device_of = [this](const std::string& path) -> Result<dev_t> {
      return path == "/" ? root_dev_ : cache_dev_;
    };
    l.interface_name = [](int ifindex) { return ifindex == 3 ? "wlan0" : "lo"; };
    return l;
  }
  HardwareOptions Options() {
    HardwareOptions o;
    o.cache_dir = "/home/u/.cache/ghost";
    o.origin_address = "192.0.2.1";
    return o;
  }
  void SetUp() override {
    fake_.AddDisk("sda", 8, 0, true);
    fake_.AddDisk("sdb", 8, 16, true);
    fake_.Mkdir("class/net/wlan0/wireless");
    fake_.Write("class/net/lo/type", "772\n");
  }

  FakeSysfs fake_;
  VirtualClock clock_;
  std::vector<std::string> opened_;
  std::vector<std::uint8_t> ata_;
  FakeNetlink::State net_;
  bool rawio_ = true, net_admin_ = true;
  dev_t root_dev_ = makedev(8, 1), cache_dev_ = makedev(8, 17);
};

bool AnyNoteHas(const Hardware& hw, const std::string& text) {
  for (const std::string& n : hw.notes()) {
    if (n.find(text) != std::string::npos) return true;
  }
  return false;
}

TEST_F(HardwareTest, NoBlockDeviceNoWifiNoMetersSaysSoPlainly) {
  cache_dev_ = makedev(0, 50);  // an overlay
  net_.oif = 1;                 // lo
  auto hw = Hardware::Detect(clock_, Options(), Layers());
  EXPECT_EQ(hw->storage(), nullptr);
  EXPECT_TRUE(AnyNoteHas(*hw, "is on no block device")) << hw->SummaryJson().dump();
  EXPECT_TRUE(AnyNoteHas(*hw, "over lo (loopback), not Wi-Fi")) << hw->SummaryJson().dump();
  EXPECT_TRUE(AnyNoteHas(*hw, "no energy meter")) << hw->SummaryJson().dump();
  EXPECT_FALSE(hw->network()->managed());
}

TEST_F(HardwareTest, DiskNotNamedIsReportedOnly) {
  auto hw = Hardware::Detect(clock_, Options(), Layers());
  ASSERT_NE(hw->storage(), nullptr);
  EXPECT_FALSE(hw->storage()->managed());
  EXPECT_EQ(hw->storage()->ToJson()["path"], "/dev/sdb");
  EXPECT_EQ(hw->storage()->ToJson()["hardware_mode"], "active/idle");
}

TEST_F(HardwareTest, NamedDiskIsManaged) {
  HardwareOptions o = Options();
  o.manage_disk = "/dev/sdb";
  auto hw = Hardware::Detect(clock_, o, Layers());
  EXPECT_TRUE(hw->storage()->managed());
  EXPECT_EQ(opened_, std::vector<std::string>{"/dev/sdb"});
}

TEST_F(HardwareTest, DiskHoldingRootIsNeverManagedUnlessForced) {
  fake_.Write("block/sda/sda2/partition", "2\n");
  fake_.Link("dev/block/8:2", "../../block/sda/sda2");
  cache_dev_ = makedev(8, 2);  // another partition of sda, which holds /
  HardwareOptions o = Options();
  o.manage_disk = "/dev/sda";
  auto hw = Hardware::Detect(clock_, o, Layers());
  ASSERT_NE(hw->storage(), nullptr) << hw->SummaryJson().dump();
  EXPECT_FALSE(hw->storage()->managed());
  EXPECT_TRUE(AnyNoteHas(*hw, "holds /")) << hw->SummaryJson().dump();
  o.force_manage_disk = true;
  EXPECT_TRUE(Hardware::Detect(clock_, o, Layers())->storage()->managed());
}

TEST_F(HardwareTest, ManageDiskNamingAnotherDiskIsRefused) {
  HardwareOptions o = Options();
  o.manage_disk = "/dev/sda";
  auto hw = Hardware::Detect(clock_, o, Layers());
  EXPECT_FALSE(hw->storage()->managed());
  EXPECT_TRUE(AnyNoteHas(*hw, "is not the disk under the cache directory"));
}

TEST_F(HardwareTest, WithoutRawIoTheDiskIsModelOnlyWithOneMessage) {
  rawio_ = false;
  HardwareOptions o = Options();
  o.manage_disk = "/dev/sdb";
  auto hw = Hardware::Detect(clock_, o, Layers());
  EXPECT_FALSE(hw->storage()->managed());
  EXPECT_TRUE(opened_.empty());
  int n = 0;
  for (const std::string& note : hw->notes()) n += note.find("CAP_SYS_RAWIO") != std::string::npos;
  EXPECT_EQ(n, 1);
}

TEST_F(HardwareTest, WithoutNetAdminTheCardIsReadNotSet) {
  net_admin_ = false;
  auto hw = Hardware::Detect(clock_, Options(), Layers());
  EXPECT_FALSE(hw->network()->managed());
  EXPECT_TRUE(AnyNoteHas(*hw, "CAP_NET_ADMIN"));
  EXPECT_EQ(hw->network()->ToJson()["power_save"], "on");
}

TEST_F(HardwareTest, SsdIsReportedReadOnly) {
  fake_.AddDisk("nvme0n1", 259, 0, false);
  cache_dev_ = makedev(259, 1);
  HardwareOptions o = Options();
  o.manage_disk = "/dev/nvme0n1";
  auto hw = Hardware::Detect(clock_, o, Layers());
  EXPECT_FALSE(hw->storage()->managed());
  EXPECT_EQ(hw->storage()->ToJson()["backend"], "nvme");
  EXPECT_TRUE(AnyNoteHas(*hw, "solid-state"));
}

TEST_F(HardwareTest, BoundBackendsFollowTheModelAndTheCardIsRestored) {
  Result<MachineProfile> profile = LoadMachineProfile("laptop-2024", GHOST_PROFILE_DIR);
  ASSERT_TRUE(profile.ok()) << profile.status().ToString();
  net_.ps = false;  // the user had power save off
  HardwareOptions o = Options();
  o.manage_disk = "/dev/sdb";
  {
    auto machine = Machine::Build(clock_, *profile, MachineOptions{});
    ASSERT_TRUE(machine.ok());
    Machine& m = **machine;
    auto hw = Hardware::Detect(clock_, o, Layers());
    hw->Bind(m.pm(), m.storage_id(), m.network_id());
    // The card starts in PSM under the adaptive policy: power save goes on at once.
    EXPECT_TRUE(net_.ps);
    EXPECT_EQ(hw->DeviceJson(m.network_id())["hardware_mode"], "power_save");
    // The model's disk goes to standby: STANDBY IMMEDIATE, then read back.
    ata_.clear();
    m.storage().RequestMode(m.storage().profile().ModeIndex("standby"));
    clock_.AdvanceBy(std::chrono::seconds(5));
    ASSERT_GE(ata_.size(), 2u);
    EXPECT_EQ(ata_[0], kAtaStandbyImmediate);
    EXPECT_EQ(ata_[1], kAtaCheckPowerMode);
    EXPECT_EQ(hw->DeviceJson(m.storage_id())["hardware_mode"], "standby");
    hw.reset();  // the daemon's exit (SIGTERM included)
    EXPECT_FALSE(net_.ps);
  }
}

}  // namespace
}  // namespace ghost
