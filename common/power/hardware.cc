#include "common/power/hardware.h"

#include <linux/netlink.h>
#include <net/if.h>
#include <sys/capability.h>
#include <sys/stat.h>

#include <cerrno>

namespace ghost {
namespace {

bool ProcessHasCapability(int cap) {
  cap_t caps = cap_get_proc();
  if (caps == nullptr) return false;
  cap_flag_value_t v = CAP_CLEAR;
  const bool ok = cap_get_flag(caps, static_cast<cap_value_t>(cap), CAP_EFFECTIVE, &v) == 0;
  cap_free(caps);
  return ok && v == CAP_SET;
}

}  // namespace

HardwareLayers HardwareLayers::Real() {
  HardwareLayers l;
  l.sysfs = Sysfs::FromEnvironment();
  l.open_sg = OpenSgIo;
  l.open_netlink = OpenNetlink;
  l.has_capability = ProcessHasCapability;
  l.device_of = [](const std::string& path) -> Result<dev_t> {
    struct stat st{};
    if (::stat(path.c_str(), &st) != 0) return Status::FromErrno(errno, "stat " + path);
    return st.st_dev;
  };
  l.interface_name = [](int ifindex) {
    char name[IF_NAMESIZE] = {};
    return ::if_indextoname(static_cast<unsigned>(ifindex), name) != nullptr ? std::string(name)
                                                                             : std::string();
  };
  return l;
}

std::unique_ptr<Hardware> Hardware::Detect(Clock& clock, const HardwareOptions& options,
                                           HardwareLayers layers) {
  std::unique_ptr<Hardware> hw(new Hardware(clock, std::move(layers)));
  hw->DetectDisk(options);
  hw->DetectLink(options);
  hw->meters_ = std::make_unique<MeterSampler>(clock, DiscoverMeters(hw->layers_.sysfs));
  if (hw->meters_->empty()) {
    hw->notes_.push_back("no energy meter: no battery in " + hw->layers_.sysfs.Path("class/power_supply") +
                         " and no RAPL zone in " + hw->layers_.sysfs.Path("class/powercap") +
                         "; only the model's estimate is shown");
  }
  return hw;
}

Hardware::~Hardware() {
  Restore();
  Unbind();
}

void Hardware::DetectDisk(const HardwareOptions& o) {
  const Sysfs& sysfs = layers_.sysfs;
  auto model_only = [&](const std::string& why) { notes_.push_back("disk: " + why + "; the disk is modelled only"); };
  Result<dev_t> dev = layers_.device_of(o.cache_dir);
  if (!dev.ok()) return model_only("cannot stat the cache directory: " + dev.status().message());
  Result<BlockDeviceInfo> info = sysfs.BlockDevice(*dev);
  if (!info.ok()) {
    return model_only("the cache directory " + o.cache_dir + " is on no block device (" +
                      info.status().message() + ")");
  }
  if (!info->rotational) {
    storage_ = std::make_unique<SsdBackend>(sysfs, *info);
    if (!o.manage_disk.empty()) {
      notes_.push_back("disk: " + info->dev_path() + " is solid-state: --manage-disk has nothing to spin down");
    }
    return;
  }
  RealDiskOptions ro;
  ro.info = *info;
  if (o.manage_disk.empty()) {
    ro.note = "reported only: name it with --manage-disk " + info->dev_path() + " to let STPM spin it down";
  } else if (Result<BlockDeviceInfo> named = sysfs.BlockDeviceByName(o.manage_disk); !named.ok()) {
    ro.note = "--manage-disk " + o.manage_disk + ": " + named.status().message();
  } else if (named->disk != info->disk) {
    ro.note = "--manage-disk " + o.manage_disk + " is not the disk under the cache directory (" +
              info->dev_path() + "); not managed";
  } else {
    ro.manage = true;
    Result<dev_t> root = layers_.device_of("/");
    Result<BlockDeviceInfo> root_disk = root.ok() ? sysfs.BlockDevice(*root) : Result<BlockDeviceInfo>(root.status());
    if (root_disk.ok() && root_disk->disk == info->disk && !o.force_manage_disk) {
      ro.manage = false;
      ro.note = info->dev_path() + " holds /: not managed (spinning down the system disk stalls the "
                "whole machine); --force-manage-disk to manage it anyway";
    }
  }
  std::unique_ptr<SgIo> io;
  if (!layers_.has_capability(CAP_SYS_RAWIO)) {
    ro.note = "no CAP_SYS_RAWIO: cannot send ATA commands to " + info->dev_path() +
              " (run as root or grant the capability); modelled only";
    ro.manage = false;
  } else if (Result<std::unique_ptr<SgIo>> sg = layers_.open_sg(info->dev_path()); !sg.ok()) {
    ro.note = "cannot send ATA commands to " + info->dev_path() + " (" + sg.status().message() +
              "); modelled only";
    ro.manage = false;
  } else {
    io = std::move(sg).value();
  }
  if (!ro.manage && (o.manage_disk.size() || io == nullptr)) notes_.push_back("disk: " + ro.note);
  storage_ = std::make_unique<AtaDiskBackend>(std::move(ro), std::move(io));
}

void Hardware::DetectLink(const HardwareOptions& o) {
  auto model_only = [&](const std::string& why) { notes_.push_back("network: " + why + "; the card is modelled only"); };
  if (o.origin_address.empty()) return model_only("no origin address to find the route to");
  Result<std::unique_ptr<NetlinkTransport>> rt = layers_.open_netlink(NETLINK_ROUTE);
  if (!rt.ok()) return model_only("no rtnetlink socket: " + rt.status().message());
  Result<int> ifindex = RouteInterface(**rt, o.origin_address);
  if (!ifindex.ok()) return model_only("no route to " + o.origin_address + ": " + ifindex.status().message());
  RealLinkOptions lo;
  lo.ifindex = *ifindex;
  lo.ifname = layers_.interface_name(*ifindex);
  lo.link_kind = ClassifyLink(layers_.sysfs, lo.ifname);
  std::unique_ptr<Nl80211> nl;
  if (lo.link_kind != "wifi") {
    lo.note = "the route to " + o.origin_address + " is over " + lo.ifname + " (" + lo.link_kind +
              "), not Wi-Fi: reported, modelled only";
    notes_.push_back("network: " + lo.note);
  } else if (Result<std::unique_ptr<NetlinkTransport>> genl = layers_.open_netlink(NETLINK_GENERIC); !genl.ok()) {
    lo.note = "no generic netlink socket: " + genl.status().message() + "; modelled only";
    notes_.push_back("network: " + lo.note);
  } else {
    nl = std::make_unique<Nl80211>(std::move(genl).value());
    lo.manage = layers_.has_capability(CAP_NET_ADMIN);
    if (!lo.manage) {
      lo.note = "no CAP_NET_ADMIN: power save on " + lo.ifname + " is read, not set (run as root or "
                "grant the capability); modelled only";
      notes_.push_back("network: " + lo.note);
    }
  }
  network_ = std::make_unique<WifiBackend>(std::move(lo), std::move(nl));
}

void Hardware::Bind(PowerManager& pm, DeviceId storage, DeviceId network) {
  Unbind();
  pm_ = &pm;
  storage_id_ = storage;
  network_id_ = network;
  for (auto [id, backend] : {std::pair{storage, storage_.get()}, std::pair{network, network_.get()}}) {
    for (int m = 0; m < pm.NumModes(id); ++m) {
      subs_.push_back(pm.Subscribe(id, m, [this, backend](DeviceId d, int mode) {
        meters_->NoteActivity();
        if (backend != nullptr) backend->Apply(pm_->device(d).profile(), mode);
      }));
    }
  }
  if (network_) network_->Apply(pm.device(network).profile(), pm.device(network).mode());
}

void Hardware::Unbind() {
  if (pm_ != nullptr) {
    for (SubscriptionId s : subs_) pm_->Unsubscribe(s);
  }
  subs_.clear();
  pm_ = nullptr;
}

nlohmann::json Hardware::DeviceJson(DeviceId id) const {
  DeviceBackend* b = id == storage_id_ ? storage_.get() : id == network_id_ ? network_.get() : nullptr;
  if (b == nullptr) {
    const char* what = id == storage_id_ ? "disk" : "network";
    for (const std::string& n : notes_) {
      if (n.starts_with(what)) return {{"backend", "none"}, {"managed", false}, {"note", n}};
    }
    return {{"backend", "none"}, {"managed", false}};
  }
  b->Refresh();
  return b->ToJson();
}

nlohmann::json Hardware::SummaryJson() const {
  return {{"real_devices", (storage_ ? 1 : 0) + (network_ ? 1 : 0)},
          {"meters", meters_->readings().size()},
          {"notes", notes_}};
}

void Hardware::Restore() {
  if (network_) network_->Restore();
}

}  // namespace ghost
