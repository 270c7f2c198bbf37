// DeviceBackend: a real device behind an emulated one (DESIGN §3.1). The model's Device
// (device.h) stays the one the policies and the cost model see; a backend follows it: when
// the model's device enters a mode, the backend puts the hardware in the matching state (a
// disk's STANDBY IMMEDIATE, a card's power save) and reads the state back, so what
// `ghostctl devices` shows is what the hardware reports, not what was asked.
//
// A backend that may not act (not named with --manage-disk, no CAP_SYS_RAWIO or
// CAP_NET_ADMIN, a link that is not Wi-Fi, an SSD) is "model only": it still reports.
//
// Thread-safety: not thread-safe; use from the thread that drives the clock.
#ifndef GHOST_COMMON_POWER_DEVICE_BACKEND_H_
#define GHOST_COMMON_POWER_DEVICE_BACKEND_H_

#include <nlohmann/json.hpp>
#include <string>

#include "common/power/profile.h"

namespace ghost {

class DeviceBackend {
 public:
  virtual ~DeviceBackend() = default;
  // The model's device (of `profile`) entered `mode`. A managed backend applies it and reads
  // the state back; failures are recorded (see ToJson's "error"), never thrown.
  virtual void Apply(const DeviceProfile& profile, int mode) = 0;
  // Reads the hardware's state again (for a `devices` request).
  virtual void Refresh() = 0;
  // Whether Apply acts on the hardware.
  virtual bool managed() const = 0;
  // {"backend":"ata","path":"/dev/sda","managed":true,"hardware_mode":"standby",
  //  "note":"...","error":"..."}: merged into the device's entry of `ghostctl devices`.
  virtual nlohmann::json ToJson() const = 0;
  // Puts the hardware back as it was found (the card's power-save setting). Idempotent.
  virtual void Restore() {}
};

}  // namespace ghost

#endif  // GHOST_COMMON_POWER_DEVICE_BACKEND_H_
