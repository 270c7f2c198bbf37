// Hardware: the machine's own devices and energy meters behind the model (ghostfs --devices
// auto). It finds
//   - the disk under the cache directory (st_dev → sysfs dev/block → the whole disk): a
//     rotating one gets an AtaDiskBackend (managed only when named with --manage-disk, and
//     never the disk holding / unless forced), an SSD/NVMe an SsdBackend (read-only);
//   - the link carrying the route to the first origin (rtnetlink): Wi-Fi gets nl80211 power
//     save (managed with CAP_NET_ADMIN), any other link is reported;
//   - the battery and RAPL meters (meters.h);
// and binds the backends to the model's devices: every mode the model's device enters is
// applied to the hardware and read back. What cannot be done (no such device, no privilege,
// the root disk) is one plain line in notes() and a model-only device, never a failure.
//
// The OS is reached only through HardwareLayers, so tests run it over a fake sysfs, a fake
// SG_IO and fake netlink sockets.
//
// Thread-safety: not thread-safe; use from the thread that drives the clock.
#ifndef GHOST_COMMON_POWER_HARDWARE_H_
#define GHOST_COMMON_POWER_HARDWARE_H_

#include <sys/types.h>

#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/base/clock.h"
#include "common/power/device_backend.h"
#include "common/power/meters.h"
#include "common/power/power_manager.h"
#include "common/power/real_disk.h"
#include "common/power/real_wifi.h"
#include "common/power/sysfs.h"

namespace ghost {

struct HardwareOptions {
  std::string cache_dir;          // the disk under it is the model's disk
  std::string manage_disk;        // --manage-disk DEV ("" = report only)
  bool force_manage_disk = false; // --force-manage-disk: even the disk holding /
  std::string origin_address;     // an IP literal of the first origin ("" = no network lookup)
};

// How Hardware reaches the OS. Real() is the machine's; tests replace any member.
struct HardwareLayers {
  Sysfs sysfs{"/sys"};
  std::function<Result<std::unique_ptr<SgIo>>(const std::string& dev_path)> open_sg;
  std::function<Result<std::unique_ptr<NetlinkTransport>>(int protocol)> open_netlink;
  // Whether the process holds capability `cap` (CAP_SYS_RAWIO, CAP_NET_ADMIN) effective.
  std::function<bool(int cap)> has_capability;
  // stat(path).st_dev.
  std::function<Result<dev_t>(const std::string& path)> device_of;
  // if_indextoname.
  std::function<std::string(int ifindex)> interface_name;
  // Sysfs from $GHOST_SYSFS_ROOT (or /sys) and the real system calls.
  static HardwareLayers Real();
};

class Hardware {
 public:
  // Finds the devices and meters. Never fails: what is missing is a note.
  static std::unique_ptr<Hardware> Detect(Clock& clock, const HardwareOptions& options,
                                          HardwareLayers layers);
  ~Hardware();
  Hardware(const Hardware&) = delete;
  Hardware& operator=(const Hardware&) = delete;

  // Follows the model's devices `storage` and `network` of `pm` (borrowed: it must outlive
  // this object, or Unbind be called first). The network's current mode is applied at once
  // (the card's power save follows the policy from the start); the disk is left as found
  // until the model's disk changes mode (no spin-up at start).
  void Bind(PowerManager& pm, DeviceId storage, DeviceId network);
  void Unbind();

  DeviceBackend* storage() const { return storage_.get(); }
  DeviceBackend* network() const { return network_.get(); }
  MeterSampler& meters() { return *meters_; }
  const MeterSampler& meters() const { return *meters_; }
  // One line per limitation ("the cache directory is on no block device ..."), for the log
  // and `ghostctl devices`.
  const std::vector<std::string>& notes() const { return notes_; }
  // The backend's report for model device `id` (null when none backs it).
  nlohmann::json DeviceJson(DeviceId id) const;
  // {"real_devices": N, "notes": [...]}.
  nlohmann::json SummaryJson() const;
  // Puts the card's power save back as found (also done by the destructor). Idempotent.
  void Restore();

 private:
  Hardware(Clock& clock, HardwareLayers layers) : clock_(clock), layers_(std::move(layers)) {}
  void DetectDisk(const HardwareOptions& options);
  void DetectLink(const HardwareOptions& options);

  Clock& clock_;
  HardwareLayers layers_;
  std::unique_ptr<DeviceBackend> storage_, network_;
  std::unique_ptr<MeterSampler> meters_;
  std::vector<std::string> notes_;
  PowerManager* pm_ = nullptr;
  DeviceId storage_id_ = -1, network_id_ = -1;
  std::vector<SubscriptionId> subs_;
};

}  // namespace ghost

#endif  // GHOST_COMMON_POWER_HARDWARE_H_
