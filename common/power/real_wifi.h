// The real network link behind the model's card (device_backend.h): the interface that carries
// the route to the origins (an rtnetlink route lookup), and if it is Wi-Fi, its power save
// through nl80211 over generic netlink, as `iw dev X get|set power_save` does:
//
//   NL80211_CMD_GET_POWER_SAVE  {NL80211_ATTR_IFINDEX u32}  → reply {NL80211_ATTR_PS_STATE u32}
//   NL80211_CMD_SET_POWER_SAVE  {NL80211_ATTR_IFINDEX u32, NL80211_ATTR_PS_STATE u32}
//   (NL80211_PS_ENABLED = 1, NL80211_PS_DISABLED = 0; linux/nl80211.h)
//
// The nl80211 family's number is asked of the generic netlink controller (CTRL_CMD_GETFAMILY,
// CTRL_ATTR_FAMILY_NAME "nl80211"). Messages are built and parsed with libnl-3/libnl-genl-3;
// the socket is behind NetlinkTransport so tests script the kernel's side.
//
// Model mode → setting: a mode with a beacon interval (PSM) is power save on; one without
// (CAM) is off. The setting found at start is put back on Restore (the daemon's exit, SIGTERM
// included). Without CAP_NET_ADMIN the card is read, not set ("model only"). Other links
// (Ethernet, loopback, cellular) are reported and modelled only.
//
// Thread-safety: not thread-safe.
#ifndef GHOST_COMMON_POWER_REAL_WIFI_H_
#define GHOST_COMMON_POWER_REAL_WIFI_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/base/status.h"
#include "common/power/device_backend.h"
#include "common/power/sysfs.h"

namespace ghost {

// One netlink socket: a request out, its replies back. Real: AF_NETLINK; tests: a fake.
class NetlinkTransport {
 public:
  virtual ~NetlinkTransport() = default;
  // Sends `request` (one netlink message, NLM_F_ACK set) and returns the reply messages
  // (each a whole nlmsghdr-framed message) up to the kernel's acknowledgement. A negative
  // acknowledgement is its errno as a Status (EPERM, ENODEV, EOPNOTSUPP ...).
  [[nodiscard]] virtual Result<std::vector<std::string>> Exchange(const std::string& request) = 0;
};

// A socket of netlink `protocol` (NETLINK_GENERIC, NETLINK_ROUTE), with a receive timeout.
[[nodiscard]] Result<std::unique_ptr<NetlinkTransport>> OpenNetlink(int protocol);

// The requests, byte for byte (port 0: the kernel fills in ours).
std::string BuildGetFamilyRequest(std::uint32_t seq, const std::string& family_name);
// cmd NL80211_CMD_GET_POWER_SAVE (no `on`) or NL80211_CMD_SET_POWER_SAVE (with `on`).
std::string BuildPowerSaveRequest(std::uint16_t family, std::uint32_t seq, int ifindex,
                                  std::optional<bool> on);
// RTM_GETROUTE for the host route to `address` (an IPv4 or IPv6 literal).
[[nodiscard]] Result<std::string> BuildRouteRequest(std::uint32_t seq, const std::string& address);

// Replies: CTRL_ATTR_FAMILY_ID, NL80211_ATTR_PS_STATE, RTA_OIF. Corruption when missing.
[[nodiscard]] Result<std::uint16_t> ParseFamilyReply(const std::vector<std::string>& replies);
[[nodiscard]] Result<bool> ParsePowerSaveReply(const std::vector<std::string>& replies);
[[nodiscard]] Result<int> ParseRouteReply(const std::vector<std::string>& replies);

// The interface index carrying the route to `address`.
[[nodiscard]] Result<int> RouteInterface(NetlinkTransport& route, const std::string& address);

// What kind of link sysfs says interface `name` is: "wifi" (wireless/ or phy80211/),
// "loopback" (type 772), "cellular" (DEVTYPE=wwan), "ethernet" (type 1), else "other";
// "gone" when class/net/NAME is missing.
std::string ClassifyLink(const Sysfs& sysfs, const std::string& name);

// nl80211 power save over one generic-netlink transport.
class Nl80211 {
 public:
  explicit Nl80211(std::unique_ptr<NetlinkTransport> genl) : genl_(std::move(genl)) {}
  // Asks the controller for nl80211's family number (once; later calls reuse it).
  [[nodiscard]] Status Resolve();
  [[nodiscard]] Result<bool> GetPowerSave(int ifindex);
  [[nodiscard]] Status SetPowerSave(int ifindex, bool on);

 private:
  std::unique_ptr<NetlinkTransport> genl_;
  std::optional<std::uint16_t> family_;
  std::uint32_t seq_ = 0;
};

struct RealLinkOptions {
  std::string ifname;
  int ifindex = 0;
  std::string link_kind;  // ClassifyLink's
  bool manage = false;    // Wi-Fi with CAP_NET_ADMIN
  std::string note;       // why it is modelled only
};

// The link to the origins behind the model's card.
class WifiBackend final : public DeviceBackend {
 public:
  // `nl` may be null (not Wi-Fi, or no generic netlink): then only reported.
  WifiBackend(RealLinkOptions options, std::unique_ptr<Nl80211> nl);
  ~WifiBackend() override;
  void Apply(const DeviceProfile& profile, int mode) override;
  void Refresh() override;
  bool managed() const override { return manage_; }
  nlohmann::json ToJson() const override;
  // Sets power save back to what it was at start, if this backend changed it.
  void Restore() override;
  std::optional<bool> original() const { return original_; }
  std::optional<bool> power_save() const { return power_save_; }

 private:
  void Fail(const Status& s, const std::string& what);
  RealLinkOptions options_;
  std::unique_ptr<Nl80211> nl_;
  bool manage_;
  std::optional<bool> original_;
  std::optional<bool> power_save_;
  bool changed_ = false;
  std::string error_;
};

}  // namespace ghost

#endif  // GHOST_COMMON_POWER_REAL_WIFI_H_
