// StpmDiskPolicy: self-tuning power management for a disk (DESIGN §3.2; Anand, Nightingale,
// Flinn, "Ghosts in the Machine: Interfaces for Better Power Management", MobiSys 2004, §3).
//
// Notation: mode 0 is the high-power mode hp (power Php); lp >= 1 a low-power mode (power
// Plp); Tdown/Edown the transition 0→lp and Tup/Eup the transition lp→0, as
// DeviceProfile::TransitionCost gives them; Pbase the machine's base power; K the global knob
// (0 = save energy … 100 = performance). Seconds and joules are weighed as in eq. 4:
// cost = K·time + (100 − K)·energy.
//
//   (1) Tbe    = (Eup + Edown) / (Php − Plp)                       break-even time
//   (2) CE     = Edown − Php·Tdown + Eup + Pbase·Tup               whole-machine energy cost
//                                                                  of a trip down and up
//   (3) Tbe(K) = (Tup·K + CE·(100 − K)) / ((Php − Plp)·(100 − K))  knob-weighted break-even;
//                                                                  K = 100: never
//
// Spin-down rule. Each low-power mode m >= 1 has its own threshold Tbe(K, m) from eq. (3),
// with Pbase = PowerManager::base_power(). When the disk becomes idle (an I/O ends leaving it
// idle, it reaches mode 0 with nothing queued, or the policy is attached to an idle disk) one
// timer per mode is armed at idle_start + Tbe(K, m); when it fires the disk is asked for mode m
// if it is idle and shallower than m, so it steps down through the modes (a deeper mode whose
// timer fires first simply goes deeper; a timer never moves the disk up). See SpinDownTimers
// for the exact firing rule. An I/O begin cancels the timers. A knob change recomputes the
// thresholds and re-arms them from the same start of idleness (a threshold already passed
// fires at once). K = 100 arms nothing: the disk never spins down.
//
// Ghost hints (DESIGN §3.2, paper §3.3). A hint counts only while the disk is in, or heading
// to, a low-power mode: lp = device.target_mode() >= 1 (a hint while it is in mode 0 or
// already spinning up is ignored). With B the running weighted benefit (K·s + (100−K)·J):
//   1. B −= (100 − K)·(Php − Plp)·Δt, Δt the time since the previous counted hint (0 for the
//      first hint after B was reset): the weighted energy cost of having stayed in the
//      high-power mode all that time instead; then B = max(B, 0).
//   2. B += K·time_saved + (100 − K)·energy_saved.
//   3. If B > Tup·K + CE·(100 − K) (for lp), RequestMode(0) (a proactive spin-up) and B = 0.
// B (and the previous-hint time) also reset whenever the disk enters mode 0, for any reason.
// With the microdrive at K = 50, a Figure 3 hint (32 KB: 160 ms, 0.58 J) is worth 37 against a
// standby spin-up cost of 147.9: one hint never spins the disk up; five within a second do.
//
//   HIGH-BUSY ──I/O ends, idle──▶ HIGH-IDLE ──Tbe(K,1)──▶ LOW(1) ──Tbe(K,2)──▶ LOW(2)
//       ▲                            ▲                       │                   │
//       │ I/O begins                 │ mode 0 entered,       └───── B > cost ────┤
//       │ (from any state)           │ nothing queued                            ▼
//       └────────────────────────────┴──────────────────────────────────────  SPIN-UP
//
// | state (policy's view) | event                               | next                     |
// |-----------------------|-------------------------------------|--------------------------|
// | HIGH-BUSY             | I/O ends, device idle               | HIGH-IDLE (arm timers)   |
// | HIGH-IDLE             | timer m fires                       | LOW(m) (RequestMode(m))  |
// | HIGH-IDLE, LOW(m)     | I/O begins (after a spin-up if low) | HIGH-BUSY (cancel timers)|
// | LOW(m)                | deeper timer m' fires               | LOW(m')                  |
// | LOW(m)                | ghost hint with B > cost(m)         | SPIN-UP (RequestMode(0)) |
// | SPIN-UP               | mode 0 entered, nothing queued      | HIGH-IDLE (re-arm)       |
// | any                   | mode 0 entered                      | B = 0                    |
// | any                   | knob change                         | same; thresholds redone  |
//
// Background writes are deferred (DefersBackgroundWrites() = true): the write queue waits for
// the disk's next spin-up (DESIGN §3.5).
//
// Thread-safety: not thread-safe; all hooks run on the clock's thread.
#ifndef GHOST_COMMON_POWER_STPM_DISK_H_
#define GHOST_COMMON_POWER_STPM_DISK_H_

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/power/power_manager.h"
#include "common/power/profile.h"
#include "common/power/spin_down_timers.h"
#include "common/base/units.h"

namespace ghost {

// Eq. (1): Tbe = (Eup + Edown) / (Php − Plp). Duration::max() if Php <= Plp.
// Precondition: 1 <= lp_mode < profile.modes.size().
Duration BreakEven(const DeviceProfile& profile, int lp_mode);

// Eq. (2): CE = Edown − Php·Tdown + Eup + Pbase·Tup.
// Precondition: 1 <= lp_mode < profile.modes.size().
Energy TransitionEnergyCost(const DeviceProfile& profile, int lp_mode, Power base);

// Eq. (3): Tbe(K) = (Tup·K + CE·(100 − K)) / ((Php − Plp)·(100 − K)); Duration::max() for
// K = 100 (never spin down) or Php <= Plp; never negative.
// Preconditions: 1 <= lp_mode < profile.modes.size(), 0 <= knob <= 100.
Duration KnobBreakEven(const DeviceProfile& profile, int lp_mode, Power base, int knob);

// The weighted cost of one spin-up from lp, Tup·K + CE·(100 − K) (K·s + (100−K)·J): the bar
// the ghost-hint benefit must clear, and the numerator of eq. (3).
double WeightedSpinUpCost(const DeviceProfile& profile, int lp_mode, Power base, int knob);

class StpmDiskPolicy : public DevicePolicy {
 public:
  StpmDiskPolicy() = default;
  ~StpmDiskPolicy() override;
  StpmDiskPolicy(const StpmDiskPolicy&) = delete;
  StpmDiskPolicy& operator=(const StpmDiskPolicy&) = delete;

  void Attach(PowerManager& pm, DeviceId id, Device& device) override;
  void OnIoBegin(const IoRequest& io) override;
  void OnIoEnd(const IoRequest& io) override;
  void OnModeEntered(int mode) override;
  void OnGhostHint(const GhostHint& hint) override;
  void OnKnobChanged(int knob) override;
  bool DefersBackgroundWrites() const override { return true; }
  std::string name() const override { return "stpm-disk"; }
  // E.g. "stpm-disk K=50: low-power-idle after 2.55 s, standby after 4.35 s".
  std::string Describe() const override;

  // Idle time after which the disk enters low-power mode `mode` at the current knob
  // (Duration::max(): never). Precondition: attached, 1 <= mode < number of modes.
  Duration threshold(int mode) const { return thresholds_.at(mode); }
  // The running weighted ghost-hint benefit B (K·s + (100−K)·J).
  double weighted_benefit() const { return benefit_; }
  // Spin-ups this policy asked for because of ghost hints.
  int proactive_spin_ups() const { return proactive_spin_ups_; }

  // Aborts with a message if the policy's state is inconsistent.
  void AssertInvariants() const;

 private:
  void Recompute();
  std::vector<SpinDownTimers::Step> Steps() const;
  void ResetBenefit();

  int knob_ = 50;
  Power base_;
  std::vector<Duration> thresholds_;  // by mode; [0] unused
  std::unique_ptr<SpinDownTimers> timers_;
  double benefit_ = 0;
  std::optional<TimePoint> last_hint_;
  int proactive_spin_ups_ = 0;
};

}  // namespace ghost

#endif  // GHOST_COMMON_POWER_STPM_DISK_H_
