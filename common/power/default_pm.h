// Default device power management: the static baseline's policies (DESIGN §7), for the disk
// and for the network card. Neither knows the knob or ghost hints; they model what the
// paper's iPAQ did on its own, so the `static` policy of ghostsim is compared against
// stock behaviour.
//
// DefaultDiskPolicy — fixed idle timeouts, both measured from the start of idleness:
//   - after `low_power_after` (default 0.5 s) idle: enter the first low-power mode (mode 1);
//   - after `deepest_after` (default 10 s) idle: enter the deepest mode (LowestMode()).
// Idleness starts when an I/O ends leaving the disk idle (or the disk reaches mode 0 with
// nothing queued, or the policy is attached to an idle disk) and ends at the next I/O; the
// exact timer rule is SpinDownTimers'. On a disk with one low-power mode both timeouts name
// mode 1 and the earlier one wins. DefersBackgroundWrites() = false: the baseline writes each
// fetched object at once, spinning the disk up if needed (DESIGN §7).
//
//   perf-idle ──0.5 s idle──▶ low-power-idle ──(10 s idle in all)──▶ standby
//       ▲                             │                                   │
//       └────────────── I/O (the device spins up by itself) ◀────────────┘
//
// DefaultNetworkPolicy — adaptive PSM, as the Cisco 350 driver (and Linux's dynamic power
// save) does: the card lives in its power-saving mode (PSM = the profile's LowestMode()) and
// switches to CAM (mode 0) while transfers arrive faster than a threshold. Exact rule:
//   - A *transfer begin* is OnTransferBegin (an application's transfer hint), or OnIoBegin of
//     an I/O while no hinted transfer is open (an I/O inside a hinted transfer is part of it,
//     not a new transfer). If the previous transfer began less than `burst_gap` (default
//     200 ms) before this one, RequestMode(0) (CAM). The idle timer is cancelled.
//   - A *transfer end* is OnTransferEnd or OnIoEnd. When no hinted transfer is open and no
//     device I/O is in flight, and the card is in or heading to a mode other than PSM, a
//     timer is armed: `idle_timeout` (default 800 ms) later, RequestMode(PSM). An unmatched
//     OnTransferEnd is ignored; every OnTransferBegin must be matched by an OnTransferEnd.
//   - Attached to a card not in PSM with nothing open, the same timer is armed at once.
//
//   | state          | event                                   | next                  |
//   |----------------|-----------------------------------------|-----------------------|
//   | PSM            | transfer begin < burst_gap after prev.  | → CAM (400 ms switch) |
//   | PSM            | transfer begin otherwise                | PSM                   |
//   | CAM            | last open transfer ends                 | CAM, idle timer armed |
//   | CAM, timer set | transfer begin                          | CAM, timer cancelled  |
//   | CAM, timer set | idle_timeout passes                     | → PSM                 |
//
// Thread-safety: not thread-safe; all hooks run on the clock's thread.
#ifndef GHOST_COMMON_POWER_DEFAULT_PM_H_
#define GHOST_COMMON_POWER_DEFAULT_PM_H_

#include <memory>
#include <optional>
#include <string>

#include "common/power/power_manager.h"
#include "common/power/spin_down_timers.h"
#include "common/base/units.h"

namespace ghost {

struct DefaultDiskOptions {
  Duration low_power_after = Millis(500);  // idle time before mode 1 (DESIGN §7)
  Duration deepest_after = Seconds(10);    // idle time before the deepest mode (DESIGN §7)
};

class DefaultDiskPolicy : public DevicePolicy {
 public:
  explicit DefaultDiskPolicy(const DefaultDiskOptions& options = DefaultDiskOptions());
  ~DefaultDiskPolicy() override;
  DefaultDiskPolicy(const DefaultDiskPolicy&) = delete;
  DefaultDiskPolicy& operator=(const DefaultDiskPolicy&) = delete;

  // Precondition: `device` has at least one low-power mode.
  void Attach(PowerManager& pm, DeviceId id, Device& device) override;
  void OnIoBegin(const IoRequest& io) override;
  void OnIoEnd(const IoRequest& io) override;
  void OnModeEntered(int mode) override;
  bool DefersBackgroundWrites() const override { return false; }
  std::string name() const override { return "default-disk"; }
  // E.g. "default-disk: low-power-idle after 0.50 s, standby after 10.00 s".
  std::string Describe() const override;

  const DefaultDiskOptions& options() const { return options_; }

 private:
  DefaultDiskOptions options_;
  std::unique_ptr<SpinDownTimers> timers_;
};

struct DefaultNetworkOptions {
  Duration burst_gap = Millis(200);     // begin-to-begin gap under which the card goes to CAM
  Duration idle_timeout = Millis(800);  // quiet time in CAM before returning to PSM
};

class DefaultNetworkPolicy : public DevicePolicy {
 public:
  explicit DefaultNetworkPolicy(const DefaultNetworkOptions& options = DefaultNetworkOptions());
  ~DefaultNetworkPolicy() override;
  DefaultNetworkPolicy(const DefaultNetworkPolicy&) = delete;
  DefaultNetworkPolicy& operator=(const DefaultNetworkPolicy&) = delete;

  void Attach(PowerManager& pm, DeviceId id, Device& device) override;
  void OnIoBegin(const IoRequest& io) override;
  void OnIoEnd(const IoRequest& io) override;
  void OnTransferBegin() override;
  void OnTransferEnd() override;
  bool DefersBackgroundWrites() const override { return false; }
  std::string name() const override { return "default-network"; }
  // E.g. "default-network: CAM while transfers begin < 200 ms apart, PSM after 800 ms idle".
  std::string Describe() const override;

  const DefaultNetworkOptions& options() const { return options_; }
  // Hinted transfers open now, plus one if a device I/O is in flight.
  int open_transfers() const { return hinted_open_ + (io_in_flight_ ? 1 : 0); }

 private:
  void TransferBegins();
  void MaybeArmIdleTimer();
  void CancelIdleTimer();

  DefaultNetworkOptions options_;
  int psm_ = 0;
  int hinted_open_ = 0;        // OnTransferBegin not yet matched by OnTransferEnd
  bool io_in_flight_ = false;  // the device runs one I/O at a time
  std::optional<TimePoint> last_begin_;
  TimerId idle_timer_ = kNoTimer;
};

}  // namespace ghost

#endif  // GHOST_COMMON_POWER_DEFAULT_PM_H_
