// PowerManager: the one registry of devices, the global knob, and the energy meter
// (DESIGN §3.1; the interface follows the ghost-hints paper's Figure 5).
//
//   register / deregister a device        Register, Deregister
//   notify of a mode change               Notify (devices call it when they enter a mode)
//   number of modes, mode info            NumModes, ModeInfo
//   transition cost, current mode         TransitionCost, CurrentMode
//   subscribe to a device entering a mode Subscribe / Unsubscribe (pushed, never polled)
//
// It also holds the knob K (0 = save energy … 100 = performance) and the base power, routes
// hints from applications to each device's power-management policy (ghost hints, transfer
// begin/end), and owns the EnergyMeter that integrates the whole machine's power.
//
// A DevicePolicy (STPM module, default power management, multiple experts) decides a
// device's modes; it sees the device's I/O, mode changes, hints and knob changes.
//
// Thread-safety: not thread-safe; use from the thread that drives the clock. Subscriber
// callbacks run on that thread, synchronously, when the device enters the mode.
#ifndef GHOST_COMMON_POWER_POWER_MANAGER_H_
#define GHOST_COMMON_POWER_POWER_MANAGER_H_

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/base/clock.h"
#include "common/power/device.h"
#include "common/power/energy_meter.h"
#include "common/power/profile.h"
#include "common/base/units.h"

namespace ghost {

using DeviceId = int;
using SubscriptionId = std::uint64_t;

// What an application would have saved had the device been in its best mode (DESIGN §3.4).
struct GhostHint {
  Duration time_saved{0};
  Energy energy_saved;
};

class PowerManager;

// Decides one device's power modes. All hooks run on the clock's thread.
class DevicePolicy {
 public:
  virtual ~DevicePolicy() = default;
  // Called once when registered; `pm` and `device` outlive the policy's registration.
  virtual void Attach(PowerManager& pm, DeviceId id, Device& device) {
    pm_ = &pm;
    id_ = id;
    device_ = &device;
  }
  virtual void OnIoBegin(const IoRequest&) {}
  virtual void OnIoEnd(const IoRequest&) {}
  virtual void OnModeEntered(int /*mode*/) {}
  virtual void OnGhostHint(const GhostHint&) {}
  // Transfer hints: an application discloses a network transfer (DESIGN §3.3).
  virtual void OnTransferBegin() {}
  virtual void OnTransferEnd() {}
  virtual void OnKnobChanged(int /*knob*/) {}
  // The device began (true) or ended (false) a nap (Device::BeginNap): not a mode change.
  virtual void OnNap(bool /*napping*/) {}
  // Background work (cache fills, deferred writes) waiting for the device: the policy may
  // keep the device asleep (STPM) or wake it (a policy that does not defer writes).
  virtual bool DefersBackgroundWrites() const { return true; }
  virtual std::string name() const = 0;
  // One line describing the policy's current thresholds, for `ghostctl devices` and logs.
  virtual std::string Describe() const { return name(); }

 protected:
  PowerManager* pm_ = nullptr;
  DeviceId id_ = -1;
  Device* device_ = nullptr;
};

class PowerManager {
 public:
  // Borrows `clock`, which must outlive the manager. Precondition: 0 <= knob <= 100.
  PowerManager(Clock& clock, Power base_power, int knob = 50);
  ~PowerManager();
  PowerManager(const PowerManager&) = delete;
  PowerManager& operator=(const PowerManager&) = delete;

  // Registers a device (borrowed: it must outlive its registration) with the policy that
  // manages it (owned; may be null for an unmanaged device). Starts metering it.
  DeviceId Register(Device* device, std::unique_ptr<DevicePolicy> policy);
  // Stops routing events to and from the device; its energy so far stays in the meter.
  void Deregister(DeviceId id);

  // A device entered `mode` (devices call this; real backends call it when they observe a
  // change). Runs the policy's hook, then every subscriber for (id, mode).
  void Notify(DeviceId id, int mode);

  int NumModes(DeviceId id) const;
  const Mode& ModeInfo(DeviceId id, int mode) const;
  Transition TransitionCost(DeviceId id, int from, int to) const;
  int CurrentMode(DeviceId id) const;

  // Calls `fn(id, mode)` every time the device enters `mode`, until Unsubscribe.
  SubscriptionId Subscribe(DeviceId id, int mode, std::function<void(DeviceId, int)> fn);
  void Unsubscribe(SubscriptionId sub);

  int knob() const { return knob_; }
  // Precondition: 0 <= knob <= 100. Every policy hears of the change.
  void SetKnob(int knob);
  Power base_power() const { return base_power_; }

  // Hints from applications, routed to the device's policy and counted.
  void SendGhostHint(DeviceId id, const GhostHint& hint);
  void TransferBegin(DeviceId id);
  void TransferEnd(DeviceId id);

  Device& device(DeviceId id) const;
  DevicePolicy* policy(DeviceId id) const;
  std::vector<DeviceId> devices() const;
  std::optional<DeviceId> FindDevice(DeviceKind kind) const;
  // Power every registered device draws idle in its current mode (for whole-machine costs).
  Power IdlePowerOfOthers(DeviceId except) const;

  int ghost_hints_received(DeviceId id) const;

  Clock& clock() const { return clock_; }
  EnergyMeter& meter() { return meter_; }
  const EnergyMeter& meter() const { return meter_; }

 private:
  struct Entry {
    Device* device = nullptr;
    std::unique_ptr<DevicePolicy> policy;
    int ghost_hints = 0;
  };
  struct Subscription {
    DeviceId id;
    int mode;
    std::function<void(DeviceId, int)> fn;
  };
  Entry& entry(DeviceId id) const;

  Clock& clock_;
  Power base_power_;
  int knob_;
  EnergyMeter meter_;
  // Entries are never erased (ids stay stable); a deregistered entry has device == nullptr.
  std::vector<std::unique_ptr<Entry>> entries_;
  SubscriptionId next_sub_ = 1;
  std::map<SubscriptionId, Subscription> subs_;
};

}  // namespace ghost

#endif  // GHOST_COMMON_POWER_POWER_MANAGER_H_
