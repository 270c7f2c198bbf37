#include "common/power/real_wifi.h"

#include <gtest/gtest.h>
#include <linux/genetlink.h>
#include <linux/nl80211.h>
#include <linux/rtnetlink.h>
#include <netlink/genl/genl.h>
#include <netlink/msg.h>

#include <cerrno>
#include <deque>

#include "common/power/profile.h"
#include "tests/common/power/fake_sysfs.h"

namespace ghost {
namespace {

// The numbers of linux/nl80211.h and linux/genetlink.h the expected bytes below spell out.
static_assert(NL80211_CMD_SET_POWER_SAVE == 61 && NL80211_CMD_GET_POWER_SAVE == 62);
static_assert(NL80211_ATTR_IFINDEX == 3 && NL80211_ATTR_PS_STATE == 93);
static_assert(NL80211_PS_ENABLED == 1 && NL80211_PS_DISABLED == 0);
static_assert(GENL_ID_CTRL == 0x10 && CTRL_CMD_GETFAMILY == 3 && CTRL_ATTR_FAMILY_NAME == 2);
static_assert(RTM_GETROUTE == 26 && RTA_DST == 1);

constexpr std::uint16_t kFamily = 0x1c;

std::string Raw(std::initializer_list<int> bytes) {
  std::string s;
  for (int b : bytes) s.push_back(static_cast<char>(b));
  return s;
}

std::string Serialize(nl_msg* m) {
  nlmsghdr* h = nlmsg_hdr(m);
  std::string s(reinterpret_cast<const char*>(h), h->nlmsg_len);
  nlmsg_free(m);
  return s;
}

// The kernel's side of generic netlink for one nl80211 card: the controller's family reply,
// GET/SET_POWER_SAVE against `ps`, and injected errors (consumed first).
class FakeKernel final : public NetlinkTransport {
 public:
  struct State {
    bool ps = true;
    std::vector<std::string> requests;
    std::deque<int> errors;  // errno of the next replies (0: answer normally)
  };
  explicit FakeKernel(State* s) : s_(s) {}
  Result<std::vector<std::string>> Exchange(const std::string& request) override {
    s_->requests.push_back(request);
    if (!s_->errors.empty()) {
      int e = s_->errors.front();
      s_->errors.pop_front();
      if (e != 0) return Status::FromErrno(e, "nl80211");
    }
    auto* h = reinterpret_cast<const nlmsghdr*>(request.data());
    auto* g = reinterpret_cast<const genlmsghdr*>(NLMSG_DATA(h));
    if (h->nlmsg_type == GENL_ID_CTRL) {
      nl_msg* m = nlmsg_alloc();
      genlmsg_put(m, 0, h->nlmsg_seq, GENL_ID_CTRL, 0, 0, CTRL_CMD_NEWFAMILY, 1);
      nla_put_string(m, CTRL_ATTR_FAMILY_NAME, "nl80211");
      nla_put_u16(m, CTRL_ATTR_FAMILY_ID, kFamily);
      return std::vector<std::string>{Serialize(m)};
    }
    if (g->cmd == NL80211_CMD_SET_POWER_SAVE) {
      nlattr* tb[NL80211_ATTR_MAX + 1] = {};
      genlmsg_parse(const_cast<nlmsghdr*>(h), 0, tb, NL80211_ATTR_MAX, nullptr);
      s_->ps = nla_get_u32(tb[NL80211_ATTR_PS_STATE]) == NL80211_PS_ENABLED;
      return std::vector<std::string>{};
    }
    nl_msg* m = nlmsg_alloc();
    genlmsg_put(m, 0, h->nlmsg_seq, kFamily, 0, 0, NL80211_CMD_GET_POWER_SAVE, 0);
    nla_put_u32(m, NL80211_ATTR_PS_STATE, s_->ps ? NL80211_PS_ENABLED : NL80211_PS_DISABLED);
    return std::vector<std::string>{Serialize(m)};
  }

 private:
  State* s_;
};

TEST(Nl80211BytesTest, SetPowerSaveOnIsTheKernelHeadersLayout) {
  EXPECT_EQ(BuildPowerSaveRequest(kFamily, 2, 3, true),
            Raw({36, 0, 0, 0,  0x1c, 0,  5, 0,  2, 0, 0, 0,  0, 0, 0, 0,  // nlmsghdr
                 61, 0, 0, 0,                                         // genlmsghdr: SET, v0
                 8, 0, 3, 0,  3, 0, 0, 0,                             // IFINDEX = 3
                 8, 0, 93, 0,  1, 0, 0, 0}));                         // PS_STATE = ENABLED
}

TEST(Nl80211BytesTest, SetPowerSaveOffCarriesDisabled) {
  std::string m = BuildPowerSaveRequest(kFamily, 7, 12, false);
  ASSERT_EQ(m.size(), 36u);
  EXPECT_EQ(m.substr(28), Raw({8, 0, 93, 0, 0, 0, 0, 0}));
  EXPECT_EQ(m.substr(20, 8), Raw({8, 0, 3, 0, 12, 0, 0, 0}));
}

TEST(Nl80211BytesTest, GetPowerSaveHasOnlyTheInterface) {
  EXPECT_EQ(BuildPowerSaveRequest(kFamily, 1, 3, std::nullopt),
            Raw({28, 0, 0, 0,  0x1c, 0,  5, 0,  1, 0, 0, 0,  0, 0, 0, 0,
                 62, 0, 0, 0,
                 8, 0, 3, 0,  3, 0, 0, 0}));
}

TEST(Nl80211BytesTest, GetFamilyAsksTheControllerForNl80211) {
  EXPECT_EQ(BuildGetFamilyRequest(1, "nl80211"),
            Raw({32, 0, 0, 0,  0x10, 0,  5, 0,  1, 0, 0, 0,  0, 0, 0, 0,
                 3, 1, 0, 0,                                           // CTRL_CMD_GETFAMILY, v1
                 12, 0, 2, 0,  'n', 'l', '8', '0', '2', '1', '1', 0}));
}

TEST(RtnetlinkBytesTest, RouteRequestForAnIpv4Host) {
  Result<std::string> r = BuildRouteRequest(1, "192.0.2.7");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, Raw({36, 0, 0, 0,  26, 0,  5, 0,  1, 0, 0, 0,  0, 0, 0, 0,
                     2, 32, 0, 0,  0, 0, 0, 0,  0, 0, 0, 0,           // rtmsg: AF_INET, /32
                     8, 0, 1, 0,  192, 0, 2, 7}));                    // RTA_DST
}

TEST(RtnetlinkBytesTest, NotAnAddressIsRefused) {
  EXPECT_FALSE(BuildRouteRequest(1, "example.org").ok());
}

TEST(RtnetlinkReplyTest, OutputInterfaceIsRead) {
  nl_msg* m = nlmsg_alloc_simple(RTM_NEWROUTE, 0);
  rtmsg rt{};
  rt.rtm_family = AF_INET;
  nlmsg_append(m, &rt, sizeof rt, NLMSG_ALIGNTO);
  nla_put_u32(m, RTA_OIF, 4);
  EXPECT_EQ(*ParseRouteReply({Serialize(m)}), 4);
  EXPECT_FALSE(ParseRouteReply({}).ok());
  EXPECT_FALSE(ParseRouteReply({std::string("\x03\x00", 2)}).ok());  // truncated
}

class WifiBackendTest : public ::testing::Test {
 protected:
  std::unique_ptr<WifiBackend> Make(bool manage) {
    RealLinkOptions o;
    o.ifname = "wlan0";
    o.ifindex = 3;
    o.link_kind = "wifi";
    o.manage = manage;
    return std::make_unique<WifiBackend>(
        o, std::make_unique<Nl80211>(std::make_unique<FakeKernel>(&kernel_)));
  }
  void SetUp() override {
    Result<DeviceProfile> p = LoadDeviceProfile("wifi-ac", GHOST_PROFILE_DIR);
    ASSERT_TRUE(p.ok()) << p.status().ToString();
    profile_ = *p;
  }
  FakeKernel::State kernel_;
  DeviceProfile profile_;
};

TEST_F(WifiBackendTest, ReadsTheSettingFoundAtStart) {
  kernel_.ps = false;
  auto b = Make(true);
  ASSERT_EQ(kernel_.requests.size(), 2u);  // the family, then GET_POWER_SAVE
  EXPECT_EQ(kernel_.requests[1], BuildPowerSaveRequest(kFamily, 2, 3, std::nullopt));
  EXPECT_EQ(b->original(), false);
  EXPECT_EQ(b->ToJson()["power_save"], "off");
}

TEST_F(WifiBackendTest, CamTurnsPowerSaveOffAndReadsItBack) {
  auto b = Make(true);
  b->Apply(profile_, profile_.ModeIndex("CAM"));
  ASSERT_EQ(kernel_.requests.size(), 4u);
  EXPECT_EQ(kernel_.requests[2], BuildPowerSaveRequest(kFamily, 3, 3, false));
  EXPECT_EQ(kernel_.requests[3], BuildPowerSaveRequest(kFamily, 4, 3, std::nullopt));
  EXPECT_FALSE(kernel_.ps);
  EXPECT_EQ(b->power_save(), false);
  EXPECT_EQ(b->ToJson()["hardware_mode"], "awake");
}

TEST_F(WifiBackendTest, PsmWhenAlreadyOnSendsNothing) {
  auto b = Make(true);
  b->Apply(profile_, profile_.ModeIndex("PSM"));
  EXPECT_EQ(kernel_.requests.size(), 2u);
}

TEST_F(WifiBackendTest, RestoreOnDestructionPutsTheOriginalBack) {
  {
    auto b = Make(true);
    b->Apply(profile_, profile_.ModeIndex("CAM"));
    EXPECT_FALSE(kernel_.ps);
  }
  EXPECT_TRUE(kernel_.ps);
  EXPECT_EQ(kernel_.requests.back(), BuildPowerSaveRequest(kFamily, 5, 3, true));
}

TEST_F(WifiBackendTest, RestoreWithoutChangesSendsNothing) {
  {
    auto b = Make(true);
    b->Restore();
  }
  EXPECT_EQ(kernel_.requests.size(), 2u);
}

TEST_F(WifiBackendTest, EpermMakesTheCardModelOnlyWithOneMessage) {
  auto b = Make(true);
  kernel_.errors.push_back(EPERM);
  b->Apply(profile_, profile_.ModeIndex("CAM"));
  nlohmann::json j = b->ToJson();
  EXPECT_FALSE(j["managed"].get<bool>());
  EXPECT_NE(j["error"].get<std::string>().find("CAP_NET_ADMIN"), std::string::npos) << j.dump();
  const std::size_t sent = kernel_.requests.size();
  b->Apply(profile_, profile_.ModeIndex("CAM"));
  EXPECT_EQ(kernel_.requests.size(), sent);
  EXPECT_TRUE(kernel_.ps);  // never changed
}

TEST_F(WifiBackendTest, CardGoneIsModelOnly) {
  auto b = Make(true);
  kernel_.errors.push_back(ENODEV);
  b->Apply(profile_, profile_.ModeIndex("CAM"));
  nlohmann::json j = b->ToJson();
  EXPECT_FALSE(j["managed"].get<bool>());
  EXPECT_EQ(j["error"], "wlan0 is gone; the card is modelled only");
  EXPECT_EQ(j["hardware_mode"], "unknown");
}

TEST_F(WifiBackendTest, EioIsReportedAndRetriedNextTime) {
  auto b = Make(true);
  kernel_.errors.push_back(EIO);
  b->Apply(profile_, profile_.ModeIndex("CAM"));
  EXPECT_TRUE(b->ToJson().contains("error"));
  EXPECT_TRUE(kernel_.ps);
  b->Apply(profile_, profile_.ModeIndex("CAM"));
  EXPECT_FALSE(kernel_.ps);
  EXPECT_FALSE(b->ToJson().contains("error"));
}

TEST_F(WifiBackendTest, UnmanagedCardOnlyReads) {
  auto b = Make(false);
  b->Apply(profile_, profile_.ModeIndex("CAM"));
  EXPECT_EQ(kernel_.requests.size(), 2u);
  EXPECT_TRUE(kernel_.ps);
}

TEST(ClassifyLinkTest, KindsFromSysfs) {
  FakeSysfs fake;
  fake.Mkdir("class/net/wlan0/wireless");
  fake.Write("class/net/wlan0/type", "1\n");
  fake.Write("class/net/lo/type", "772\n");
  fake.Write("class/net/eth0/type", "1\n");
  fake.Write("class/net/wwan0/type", "519\n");
  fake.Write("class/net/wwan0/uevent", "INTERFACE=wwan0\nIFINDEX=5\nDEVTYPE=wwan\n");
  Sysfs s = fake.sysfs();
  EXPECT_EQ(ClassifyLink(s, "wlan0"), "wifi");
  EXPECT_EQ(ClassifyLink(s, "lo"), "loopback");
  EXPECT_EQ(ClassifyLink(s, "eth0"), "ethernet");
  EXPECT_EQ(ClassifyLink(s, "wwan0"), "cellular");
  EXPECT_EQ(ClassifyLink(s, "wlan9"), "gone");
}

}  // namespace
}  // namespace ghost
