// SpinDownTimers: the timer half of the disk power-management policies (StpmDiskPolicy,
// DefaultDiskPolicy, ExpertsDiskPolicy). The policy decides *when* (a list of steps: "enter
// low-power mode m after d of idleness"); this class tracks when the disk became idle and
// steps it down at those times. Push, never poll (DESIGN §2): one timer per step, armed only
// while the disk is idle, all cancelled by the next I/O.
//
// Idleness:
//   - starts at Start() (at the device's idle_since(), if it is idle then), at the end of an
//     I/O that leaves the device idle, and when the device enters its high-power mode (0)
//     with nothing queued (a spin-up without I/O);
//   - ends at the next I/O begin, or when the device enters mode 0 with I/O waiting.
//
// Step rule: for each step {m, d} with d != Duration::max(), a timer at idle_start + d. When
// it fires:
//
// | device state when the timer fires              | action                                |
// |------------------------------------------------|---------------------------------------|
// | idle, mode() < m                               | RequestMode(m) (a deeper step firing  |
// |                                                | first simply goes deeper)             |
// | idle, mode() >= m                              | nothing: never up from a timer        |
// | transitioning down (target_mode() > mode())    | remembered; applied when the device   |
// |                                                | enters its target, if it is then idle,|
// |                                                | nothing is pending and m is deeper    |
// | busy, I/O queued, or spinning up               | nothing (idleness is over)            |
//
//   idle(0) ──d1──▶ idle(1) ──d2──▶ idle(2)        (d measured from the start of idleness)
//      ▲               │               │
//      └── I/O / spin-up (device) ◀────┘
//
// Thread-safety: not thread-safe; use from the thread that drives the clock. Timer callbacks
// capture `this`; the destructor cancels them.
#ifndef GHOST_COMMON_POWER_SPIN_DOWN_TIMERS_H_
#define GHOST_COMMON_POWER_SPIN_DOWN_TIMERS_H_

#include <optional>
#include <vector>

#include "common/base/clock.h"
#include "common/power/device.h"
#include "common/base/units.h"

namespace ghost {

class SpinDownTimers {
 public:
  // Enter low-power mode `mode` (>= 1) once the disk has been idle for `after`
  // (Duration::max(): never).
  struct Step {
    int mode = 1;
    Duration after{0};
  };

  // Borrows `clock` and `device`, which must outlive this object.
  SpinDownTimers(Clock& clock, Device& device);
  ~SpinDownTimers();
  SpinDownTimers(const SpinDownTimers&) = delete;
  SpinDownTimers& operator=(const SpinDownTimers&) = delete;

  // Sets the steps and, if the device is idle now, starts idleness at its idle_since() and
  // arms the steps (a step already due fires on the next turn of the clock).
  void Start(std::vector<Step> steps);
  // Replaces the steps; if idle, re-arms them from the same start of idleness.
  void SetSteps(std::vector<Step> steps);

  // Hooks, forwarded by the policy from DevicePolicy's hooks of the same name.
  void OnIoBegin();
  void OnIoEnd();
  void OnModeEntered(int mode);

  // When the current idle period began; empty while the device is not idle.
  std::optional<TimePoint> idle_start() const { return idle_start_; }
  // Number of steps with a pending timer.
  int armed() const;

  // Aborts with a message if the internal state is inconsistent.
  void AssertInvariants() const;

 private:
  void Arm(TimePoint idle_start);
  void Disarm();
  void Fire(int step_index);

  Clock& clock_;
  Device& device_;
  std::vector<Step> steps_;
  std::vector<TimerId> timers_;  // parallel to steps_; kNoTimer when not pending
  std::optional<TimePoint> idle_start_;
  int deferred_mode_ = 0;  // a step that fired during a transition down; 0: none
};

}  // namespace ghost

#endif  // GHOST_COMMON_POWER_SPIN_DOWN_TIMERS_H_
