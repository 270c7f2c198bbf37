// Device: an emulated device that reproduces a DeviceProfile in time (DESIGN §2, §3.1).
//
// The device is a state machine over the profile's modes. Policies (STPM modules, the default
// power management) ask for a mode; applications submit I/O. The same code runs against the
// virtual clock in ghostsim and against the real clock in the daemons, where a mode change or
// a spin-up delay is a timer, never a sleeping thread.
//
//          RequestMode(m) / I/O needs a serving mode
//   IDLE(mode) ─────────────────────────────────────▶ TRANSITION(from→to) ──timer──▶ IDLE(to)
//      │  ▲                                                                        
//   Submit│  │timer (I/O done)                                                      
//      ▼  │                                                                          
//   BUSY(mode)  network: wait phase (round trips, beacons) then active phase (data)  
//
// | state      | event                   | next                                        |
// |------------|-------------------------|---------------------------------------------|
// | idle       | RequestMode(m ≠ mode)   | transition mode→m                           |
// | idle       | Submit, mode serves I/O | busy                                        |
// | idle       | Submit, mode does not   | transition mode→high-power mode, then busy  |
// | busy       | RequestMode(m)          | kept pending; applied when the I/O ends     |
// | busy       | I/O done                | idle (next queued op, if any, starts)       |
// | transition | anything                | queued until the transition ends            |
//
// Requests run in the order submitted. A mode request is applied before I/O queued after it.
// Power is reported to the EnergyMeter at every change: the mode's power while idle, the I/O
// model's active power while transferring, transition energy ÷ transition time while moving.
//
// Thread-safety: not thread-safe; use from the thread that drives the clock.
#ifndef GHOST_COMMON_POWER_DEVICE_H_
#define GHOST_COMMON_POWER_DEVICE_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <optional>
#include <string>

#include "common/base/clock.h"
#include "common/power/energy_meter.h"
#include "common/power/profile.h"
#include "common/base/units.h"

namespace ghost {

struct IoRequest {
  Bytes size = 0;
  bool write = false;  // network: upload
  // Network, a transfer whose size is known only once its reply head has arrived (a proxy's
  // fetch): first an I/O with `round_trips_only` (size 0: the round trips and latency before
  // the first byte, beacon waits included), then one with `continuation` carrying the body
  // (no round trips, no latency). Together they take what one I/O of the body's size takes.
  bool round_trips_only = false;
  bool continuation = false;
};

// What an I/O would cost if started now.
struct IoEstimate {
  Duration time{0};       // from now to the last byte (waits and transitions included)
  Duration transition{0};  // part of `time` spent changing mode
  Energy device_energy;   // this device only, transition included
  int serving_mode = 0;
};

// The two phases of one I/O in a given mode (see PlanIo).
struct IoPlan {
  Duration wait{0};    // round trips and beacon waits (network), drawn at the mode's power
  Duration active{0};  // latency and transfer, drawn at the I/O model's active power
};

class Device {
 public:
  // What the device tells its owner (the PowerManager). Any may be empty.
  struct Events {
    std::function<void(int mode)> mode_entered;
    std::function<void(const IoRequest&)> io_begin;
    std::function<void(const IoRequest&)> io_end;
    // A nap began (true) or ended (false): see BeginNap.
    std::function<void(bool napping)> nap;
  };

  // Borrows `clock` and `link` (network devices only; may be null for others), which must
  // outlive the device. Starts idle in `initial_mode`.
  Device(Clock& clock, DeviceProfile profile, const Link* link, int initial_mode = 0);
  ~Device();
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;

  // Connects the device to a meter (from now on its power is metered) and its owner's events.
  void Attach(EnergyMeter* meter, Events events);

  const DeviceProfile& profile() const { return profile_; }
  const std::string& name() const { return profile_.name; }
  DeviceKind kind() const { return profile_.kind; }

  // The mode the device is in; while transitioning, the mode it is leaving.
  int mode() const { return mode_; }
  bool transitioning() const { return transitioning_; }
  // The mode the device is heading to: the transition's target, else a pending request,
  // else the current mode.
  int target_mode() const;
  bool busy() const { return busy_; }
  // I/O in flight or queued (a transition alone is not work).
  bool has_work() const { return busy_ || !queue_.empty(); }
  bool idle() const { return !busy_ && !transitioning_ && queue_.empty() && nap_ == NapPhase::kNone; }
  // When the device last became idle (no I/O in flight or queued).
  TimePoint idle_since() const { return idle_since_; }

  // Asks for a mode. Applied at once when idle, else after the running I/O (a later request
  // replaces an earlier pending one). Asking for the mode already targeted does nothing.
  void RequestMode(int mode);

  // Queues an I/O; `done` runs when its last byte has moved (never synchronously).
  void Submit(const IoRequest& io, std::function<void()> done);

  // The cost of `io` if submitted now. With `assume_mode`, as if the device were idle in that
  // mode now (for ghost hints: "had the device been in its best mode").
  IoEstimate Estimate(const IoRequest& io, std::optional<int> assume_mode = std::nullopt) const;

  // The phases of an I/O started at `start` in `mode` (which must serve I/O). Network round
  // trips in a beacon mode end at the next beacon after the reply arrives; beacons fall on
  // multiples of the beacon interval since the clock's epoch (DESIGN §7). A network request
  // within the link's keep-alive time of the last transfer's end reuses the connection
  // (Link::warm_round_trips).
  IoPlan PlanIo(const IoRequest& io, int mode, TimePoint start) const;

  // ---- Naps (network cards; download shaping, DESIGN §3.6 rules 2–5) ----
  // A nap is a short sleep between two bursts of a shaped download, not a mode switch: the
  // card goes to its lowest mode (paying the profile's CAM→lowest transition), sleeps, and
  // from `wake_start` comes back to mode 0 (paying lowest→CAM), so that it is in CAM again
  // by wake_start + the profile's lowest→CAM time. mode() stays mode 0 throughout and no
  // mode_entered event is sent (the policy sees Events::nap instead); the meter is told the
  // powers (transitions as kInTransition, the sleep as the lowest mode) but counts no
  // transition. I/O submitted during a nap ends it at once (the I/O waits for the wake-up);
  // a mode request is kept pending until it ends.
  //
  // Why not, or "" when a nap may begin now: a network device idle in mode 0 (rule 2: not in
  // PSM, not in or heading to another mode), with no I/O, not napping already.
  std::string NapRefusal() const;
  // Begins a nap now. Precondition: NapRefusal() is empty. A wake_start before the end of
  // the down transition wakes right after it.
  void BeginNap(TimePoint wake_start);
  // Wakes early: the up transition starts now (after the down one, if that still runs).
  // Does nothing when not napping or already waking.
  void EndNap();
  bool napping() const { return nap_ != NapPhase::kNone; }
  // A shaped download's nap (DESIGN §3.6): the next burst is due `due_in` from now on a path
  // whose minimum RTT is `min_rtt`; the shaper wants the card awake `wake_lead` before it.
  // Refused (the reason returned, counted in nap_stats) when NapRefusal says so (rule 2), when
  // the card's lowest→CAM time plus wake_lead exceeds min_rtt / 2 (rule 4: a card that wakes
  // slowly never naps), or when the sleep would not outlast the down transition; otherwise
  // begins a nap whose up transition starts at now + due_in − wake_lead − lowest→CAM time
  // (rule 3) and returns "".
  std::string TryShapingNap(Duration due_in, Duration min_rtt, Duration wake_lead);
  struct NapStats {
    std::int64_t naps = 0;      // begun
    std::int64_t refused = 0;   // TryShapingNap said no
    std::int64_t refused_slow_wake = 0;  // of which by rule 4
    std::int64_t early = 0;     // ended before their planned wake-up (EndNap, I/O)
    Duration time{0};           // from each nap's begin to its return to mode 0
    Duration asleep{0};         // of which in the lowest mode
    Energy energy;              // drawn during naps, transitions included
    Energy saved;               // against idling in mode 0 for the same time (may be < 0)
  };
  const NapStats& nap_stats() const { return nap_stats_; }

  void AssertInvariants() const;

 private:
  enum class NapPhase { kNone, kDown, kAsleep, kUp };
  void NapStep();  // the nap timer fired: next phase
  void NapWake(TimePoint now);
  void NapDone();

  struct Op {
    bool is_mode = false;
    int mode = 0;
    IoRequest io;
    std::function<void()> done;
  };

  void Pump();
  void BeginTransition(int to);
  void EndTransition();
  void BeginIo(Op op);
  void EndIo();
  void Report(int mode, Power power);
  Power IdlePower(int mode) const { return profile_.modes[mode].power; }

  Clock& clock_;
  DeviceProfile profile_;
  const Link* link_;
  EnergyMeter* meter_ = nullptr;
  int meter_index_ = -1;
  Events events_;

  int mode_;
  bool transitioning_ = false;
  int transition_to_ = 0;
  bool busy_ = false;
  std::optional<int> pending_mode_;
  std::deque<Op> queue_;
  Op current_;
  TimePoint busy_until_{};
  TimePoint transition_end_{};
  TimePoint idle_since_{};
  std::optional<TimePoint> last_transfer_end_;  // network: for connection reuse
  TimerId timer_ = kNoTimer;       // transition end, I/O phase or I/O end
  TimerId pump_timer_ = kNoTimer;  // deferred start of work submitted while idle
  NapPhase nap_ = NapPhase::kNone;
  TimePoint nap_begin_{};
  TimePoint nap_wake_{};        // planned start of the up transition
  TimePoint nap_phase_start_{};
  TimerId nap_timer_ = kNoTimer;
  Energy nap_energy_before_;  // nap_stats_.energy when this nap began
  NapStats nap_stats_;
};

}  // namespace ghost

#endif  // GHOST_COMMON_POWER_DEVICE_H_
