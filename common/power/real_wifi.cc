#include "common/power/real_wifi.h"

#include <arpa/inet.h>
#include <linux/genetlink.h>
#include <linux/netlink.h>
#include <linux/nl80211.h>
#include <linux/rtnetlink.h>
#include <netlink/genl/genl.h>
#include <netlink/msg.h>
#include <netlink/netlink.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace ghost {
namespace {

constexpr std::uint8_t kCtrlVersion = 1;     // as genl_ctrl_resolve
constexpr std::uint8_t kNl80211Version = 0;  // as iw

// An nl_msg, freed on scope exit.
struct MsgDeleter {
  void operator()(nl_msg* m) const { nlmsg_free(m); }
};
using Msg = std::unique_ptr<nl_msg, MsgDeleter>;

std::string WireBytes(nl_msg* m) {
  nlmsghdr* h = nlmsg_hdr(m);
  return std::string(reinterpret_cast<const char*>(h), h->nlmsg_len);
}

Msg NewMsg() { return Msg(nlmsg_alloc()); }

// The message `raw` as a header libnl can parse, or null when it is malformed.
const nlmsghdr* Header(const std::string& raw) {
  if (raw.size() < sizeof(nlmsghdr)) return nullptr;
  auto* h = reinterpret_cast<const nlmsghdr*>(raw.data());
  if (h->nlmsg_len < sizeof(nlmsghdr) || h->nlmsg_len > raw.size()) return nullptr;
  return h;
}

class LinuxNetlink final : public NetlinkTransport {
 public:
  LinuxNetlink(int fd, int protocol) : fd_(fd), protocol_(protocol) {}
  ~LinuxNetlink() override { ::close(fd_); }

  Result<std::vector<std::string>> Exchange(const std::string& request) override {
    sockaddr_nl kernel{};
    kernel.nl_family = AF_NETLINK;
    if (::sendto(fd_, request.data(), request.size(), 0, reinterpret_cast<sockaddr*>(&kernel),
                 sizeof kernel) < 0) {
      return Status::FromErrno(errno, "netlink send");
    }
    const auto seq = reinterpret_cast<const nlmsghdr*>(request.data())->nlmsg_seq;
    std::vector<std::string> replies;
    std::string buf(32768, '\0');
    for (;;) {
      ssize_t n = ::recv(fd_, buf.data(), buf.size(), 0);
      if (n < 0) {
        if (errno == EINTR) continue;
        return Status::FromErrno(errno, "netlink receive");
      }
      int left = static_cast<int>(n);
      for (auto* h = reinterpret_cast<nlmsghdr*>(buf.data()); NLMSG_OK(h, left);
           h = NLMSG_NEXT(h, left)) {
        if (h->nlmsg_seq != seq) continue;  // a late reply to an earlier request
        if (h->nlmsg_type == NLMSG_DONE) return replies;
        if (h->nlmsg_type == NLMSG_ERROR) {
          auto* e = static_cast<nlmsgerr*>(NLMSG_DATA(h));
          if (e->error == 0) return replies;  // the acknowledgement
          return Status::FromErrno(-e->error, protocol_ == NETLINK_ROUTE ? "rtnetlink" : "nl80211");
        }
        replies.emplace_back(reinterpret_cast<const char*>(h), h->nlmsg_len);
      }
    }
  }

 private:
  int fd_;
  int protocol_;
};

bool IsPermission(const Status& s) { return s.ToErrno() == EPERM || s.ToErrno() == EACCES; }

}  // namespace

Result<std::unique_ptr<NetlinkTransport>> OpenNetlink(int protocol) {
  int fd = ::socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, protocol);
  if (fd < 0) return Status::FromErrno(errno, "netlink socket");
  timeval tv{.tv_sec = 2, .tv_usec = 0};
  (void)::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  sockaddr_nl self{};
  self.nl_family = AF_NETLINK;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&self), sizeof self) != 0) {
    int err = errno;
    ::close(fd);
    return Status::FromErrno(err, "netlink bind");
  }
  return std::unique_ptr<NetlinkTransport>(new LinuxNetlink(fd, protocol));
}

std::string BuildGetFamilyRequest(std::uint32_t seq, const std::string& family_name) {
  Msg m = NewMsg();
  genlmsg_put(m.get(), 0, seq, GENL_ID_CTRL, 0, NLM_F_REQUEST | NLM_F_ACK, CTRL_CMD_GETFAMILY,
              kCtrlVersion);
  nla_put_string(m.get(), CTRL_ATTR_FAMILY_NAME, family_name.c_str());
  return WireBytes(m.get());
}

std::string BuildPowerSaveRequest(std::uint16_t family, std::uint32_t seq, int ifindex,
                                  std::optional<bool> on) {
  Msg m = NewMsg();
  genlmsg_put(m.get(), 0, seq, family, 0, NLM_F_REQUEST | NLM_F_ACK,
              on ? NL80211_CMD_SET_POWER_SAVE : NL80211_CMD_GET_POWER_SAVE, kNl80211Version);
  nla_put_u32(m.get(), NL80211_ATTR_IFINDEX, static_cast<std::uint32_t>(ifindex));
  if (on) nla_put_u32(m.get(), NL80211_ATTR_PS_STATE, *on ? NL80211_PS_ENABLED : NL80211_PS_DISABLED);
  return WireBytes(m.get());
}

Result<std::string> BuildRouteRequest(std::uint32_t seq, const std::string& address) {
  unsigned char addr[16];
  rtmsg rt{};
  int len = 0;
  if (::inet_pton(AF_INET, address.c_str(), addr) == 1) {
    rt.rtm_family = AF_INET;
    len = 4;
  } else if (::inet_pton(AF_INET6, address.c_str(), addr) == 1) {
    rt.rtm_family = AF_INET6;
    len = 16;
  } else {
    return Status::InvalidArgument("\"" + address + "\" is not an IP address");
  }
  rt.rtm_dst_len = static_cast<unsigned char>(len * 8);
  Msg m(nlmsg_alloc_simple(RTM_GETROUTE, NLM_F_REQUEST | NLM_F_ACK));
  nlmsg_hdr(m.get())->nlmsg_seq = seq;
  nlmsg_append(m.get(), &rt, sizeof rt, NLMSG_ALIGNTO);
  nla_put(m.get(), RTA_DST, len, addr);
  return WireBytes(m.get());
}

Result<std::uint16_t> ParseFamilyReply(const std::vector<std::string>& replies) {
  for (const std::string& raw : replies) {
    const nlmsghdr* h = Header(raw);
    if (h == nullptr) continue;
    nlattr* tb[CTRL_ATTR_MAX + 1] = {};
    if (genlmsg_parse(const_cast<nlmsghdr*>(h), 0, tb, CTRL_ATTR_MAX, nullptr) < 0) continue;
    if (tb[CTRL_ATTR_FAMILY_ID] != nullptr) return nla_get_u16(tb[CTRL_ATTR_FAMILY_ID]);
  }
  return Status::Corruption("the generic netlink controller named no nl80211 family");
}

Result<bool> ParsePowerSaveReply(const std::vector<std::string>& replies) {
  for (const std::string& raw : replies) {
    const nlmsghdr* h = Header(raw);
    if (h == nullptr) continue;
    nlattr* tb[NL80211_ATTR_MAX + 1] = {};
    if (genlmsg_parse(const_cast<nlmsghdr*>(h), 0, tb, NL80211_ATTR_MAX, nullptr) < 0) continue;
    if (tb[NL80211_ATTR_PS_STATE] != nullptr) {
      return nla_get_u32(tb[NL80211_ATTR_PS_STATE]) == NL80211_PS_ENABLED;
    }
  }
  return Status::Corruption("nl80211 replied without NL80211_ATTR_PS_STATE");
}

Result<int> ParseRouteReply(const std::vector<std::string>& replies) {
  for (const std::string& raw : replies) {
    const nlmsghdr* h = Header(raw);
    if (h == nullptr || h->nlmsg_type != RTM_NEWROUTE) continue;
    nlattr* tb[RTA_MAX + 1] = {};
    if (nlmsg_parse(const_cast<nlmsghdr*>(h), sizeof(rtmsg), tb, RTA_MAX, nullptr) < 0) continue;
    if (tb[RTA_OIF] != nullptr) return static_cast<int>(nla_get_u32(tb[RTA_OIF]));
  }
  return Status::Corruption("rtnetlink replied with no route (RTA_OIF)");
}

Result<int> RouteInterface(NetlinkTransport& route, const std::string& address) {
  Result<std::string> req = BuildRouteRequest(1, address);
  if (!req.ok()) return req.status();
  Result<std::vector<std::string>> r = route.Exchange(*req);
  if (!r.ok()) return r.status();
  return ParseRouteReply(*r);
}

std::string ClassifyLink(const Sysfs& sysfs, const std::string& name) {
  const std::string dir = "class/net/" + name;
  if (!sysfs.Exists(dir)) return "gone";
  if (sysfs.Exists(dir + "/wireless") || sysfs.Exists(dir + "/phy80211")) return "wifi";
  Result<std::int64_t> type = sysfs.ReadInt(dir + "/type");
  if (type.ok() && *type == 772) return "loopback";  // ARPHRD_LOOPBACK
  // DEVTYPE may be on any line of uevent.
  if (std::FILE* f = std::fopen(sysfs.Path(dir + "/uevent").c_str(), "re"); f != nullptr) {
    char line[256];
    bool wwan = false;
    while (std::fgets(line, sizeof line, f) != nullptr) {
      if (std::strncmp(line, "DEVTYPE=wwan", 12) == 0) wwan = true;
    }
    std::fclose(f);
    if (wwan) return "cellular";
  }
  if (type.ok() && *type == 1) return "ethernet";  // ARPHRD_ETHER
  return "other";
}

Status Nl80211::Resolve() {
  if (family_) return Status::Ok();
  Result<std::vector<std::string>> r = genl_->Exchange(BuildGetFamilyRequest(++seq_, "nl80211"));
  if (!r.ok()) return r.status();
  Result<std::uint16_t> f = ParseFamilyReply(*r);
  if (!f.ok()) return f.status();
  family_ = *f;
  return Status::Ok();
}

Result<bool> Nl80211::GetPowerSave(int ifindex) {
  if (Status s = Resolve(); !s.ok()) return s;
  Result<std::vector<std::string>> r =
      genl_->Exchange(BuildPowerSaveRequest(*family_, ++seq_, ifindex, std::nullopt));
  if (!r.ok()) return r.status();
  return ParsePowerSaveReply(*r);
}

Status Nl80211::SetPowerSave(int ifindex, bool on) {
  if (Status s = Resolve(); !s.ok()) return s;
  Result<std::vector<std::string>> r =
      genl_->Exchange(BuildPowerSaveRequest(*family_, ++seq_, ifindex, on));
  return r.ok() ? Status::Ok() : r.status();
}

WifiBackend::WifiBackend(RealLinkOptions options, std::unique_ptr<Nl80211> nl)
    : options_(std::move(options)), nl_(std::move(nl)), manage_(options_.manage && nl_ != nullptr) {
  if (nl_) {
    Result<bool> ps = nl_->GetPowerSave(options_.ifindex);
    if (ps.ok()) {
      original_ = *ps;
      power_save_ = *ps;
    } else {
      Fail(ps.status(), "reading power save");
    }
  }
}

WifiBackend::~WifiBackend() { Restore(); }

void WifiBackend::Fail(const Status& s, const std::string& what) {
  if (IsPermission(s)) {
    error_ = what + " on " + options_.ifname +
             ": permission denied (needs CAP_NET_ADMIN); the card is modelled only";
    manage_ = false;
  } else if (s.ToErrno() == ENODEV || s.ToErrno() == ENOENT) {
    error_ = options_.ifname + " is gone; the card is modelled only";
    manage_ = false;
    nl_.reset();
    power_save_.reset();
  } else {
    error_ = what + " on " + options_.ifname + ": " + s.message();
  }
}

void WifiBackend::Refresh() {
  if (!nl_) return;
  Result<bool> ps = nl_->GetPowerSave(options_.ifindex);
  if (!ps.ok()) return Fail(ps.status(), "reading power save");
  power_save_ = *ps;
}

void WifiBackend::Apply(const DeviceProfile& profile, int mode) {
  if (!manage_ || !nl_ || mode < 0 || mode >= static_cast<int>(profile.modes.size())) return;
  const bool want = profile.modes[mode].beacon_interval > Duration::zero();
  if (power_save_ == want) return;
  if (Status s = nl_->SetPowerSave(options_.ifindex, want); !s.ok()) {
    return Fail(s, std::string("setting power save ") + (want ? "on" : "off"));
  }
  changed_ = true;
  error_.clear();
  Refresh();  // read back, never assumed
}

void WifiBackend::Restore() {
  if (!changed_ || !nl_ || !original_) return;
  changed_ = false;
  if (Status s = nl_->SetPowerSave(options_.ifindex, *original_); !s.ok()) {
    Fail(s, "restoring power save");
    return;
  }
  power_save_ = original_;
}

nlohmann::json WifiBackend::ToJson() const {
  auto opt = [](std::optional<bool> b) {
    return b ? nlohmann::json(*b ? "on" : "off") : nlohmann::json();
  };
  nlohmann::json j = {{"backend", options_.link_kind == "wifi" ? "nl80211" : "link"},
                      {"interface", options_.ifname},
                      {"link", options_.link_kind},
                      {"managed", manage_}};
  if (options_.link_kind == "wifi") {
    j["hardware_mode"] = power_save_ ? (*power_save_ ? "power_save" : "awake") : "unknown";
    j["power_save"] = opt(power_save_);
    j["power_save_at_start"] = opt(original_);
  }
  if (!options_.note.empty()) j["note"] = options_.note;
  if (!error_.empty()) j["error"] = error_;
  return j;
}

}  // namespace ghost
