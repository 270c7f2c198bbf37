#include "common/power/device.h"

#include <cassert>
#include <cstdio>
#include <cstdlib>

namespace ghost {

Device::Device(Clock& clock, DeviceProfile profile, const Link* link, int initial_mode)
    : clock_(clock), profile_(std::move(profile)), link_(link), mode_(initial_mode) {
  assert(!profile_.modes.empty());
  assert(initial_mode >= 0 && initial_mode < static_cast<int>(profile_.modes.size()));
  assert(profile_.kind != DeviceKind::kNetwork || link_ != nullptr);
  idle_since_ = clock_.Now();
}

Device::~Device() {
  if (timer_ != kNoTimer) clock_.Cancel(timer_);
  if (pump_timer_ != kNoTimer) clock_.Cancel(pump_timer_);
  if (nap_timer_ != kNoTimer) clock_.Cancel(nap_timer_);
}

void Device::Attach(EnergyMeter* meter, Events events) {
  meter_ = meter;
  events_ = std::move(events);
  if (meter_) {
    std::vector<std::string> names;
    for (const Mode& m : profile_.modes) names.push_back(m.name);
    meter_index_ = meter_->AddDevice(profile_.name, std::move(names), mode_, IdlePower(mode_));
  }
}

int Device::target_mode() const {
  if (transitioning_) return transition_to_;
  if (pending_mode_) return *pending_mode_;
  return mode_;
}

void Device::Report(int mode, Power power) {
  if (meter_) meter_->Record(meter_index_, mode, power);
}

void Device::RequestMode(int mode) {
  assert(mode >= 0 && mode < static_cast<int>(profile_.modes.size()));
  if (mode == target_mode()) return;
  if (busy_ || transitioning_ || napping()) {
    // Applied when the running work ends; a queued mode op goes in front of later I/O.
    pending_mode_ = mode;
    return;
  }
  BeginTransition(mode);
}

void Device::Submit(const IoRequest& io, std::function<void()> done) {
  Op op;
  op.io = io;
  op.done = std::move(done);
  queue_.push_back(std::move(op));
  if (napping()) {
    EndNap();  // the I/O waits for the wake-up; NapDone starts it
    return;
  }
  if (!busy_ && !transitioning_) {
    // Start on the next turn so `done` never runs inside Submit and callers see a stable state.
    if (pump_timer_ == kNoTimer) pump_timer_ = clock_.ScheduleAfter(Duration::zero(), [this] {
      pump_timer_ = kNoTimer;
      Pump();
    });
  }
}

void Device::Pump() {
  if (busy_ || transitioning_ || napping()) return;
  if (pending_mode_) {
    int m = *pending_mode_;
    pending_mode_.reset();
    if (m != mode_) {
      BeginTransition(m);
      return;
    }
  }
  if (queue_.empty()) return;
  if (!profile_.modes[mode_].serves_io) {
    BeginTransition(profile_.HighPowerMode());
    return;
  }
  Op op = std::move(queue_.front());
  queue_.pop_front();
  BeginIo(std::move(op));
}

void Device::BeginTransition(int to) {
  assert(!busy_ && !transitioning_);
  Transition t = profile_.TransitionCost(mode_, to);
  transitioning_ = true;
  transition_to_ = to;
  transition_end_ = clock_.Now() + t.time;
  if (t.time > Duration::zero()) Report(EnergyMeter::kInTransition, t.energy / t.time);
  timer_ = clock_.ScheduleAt(transition_end_, [this] {
    timer_ = kNoTimer;
    EndTransition();
  });
}

void Device::EndTransition() {
  transitioning_ = false;
  mode_ = transition_to_;
  Report(mode_, IdlePower(mode_));
  if (meter_) meter_->CountTransition(meter_index_);
  if (events_.mode_entered) events_.mode_entered(mode_);
  Pump();
  if (idle()) idle_since_ = clock_.Now();
}

IoPlan Device::PlanIo(const IoRequest& io, int mode, TimePoint start) const {
  const Mode& m = profile_.modes[mode];
  assert(m.serves_io);
  IoPlan plan;
  if (profile_.kind == DeviceKind::kNetwork) {
    Bandwidth bw = io.write ? (m.io.write_bandwidth.is_zero() ? link_->up : m.io.write_bandwidth)
                            : (m.io.read_bandwidth.is_zero() ? link_->down : m.io.read_bandwidth);
    if (io.continuation) {
      plan.active = bw.TimeFor(io.size);
      return plan;
    }
    TimePoint t = start;
    bool warm = last_transfer_end_ && link_->keepalive > Duration::zero() &&
                start - *last_transfer_end_ <= link_->keepalive;
    int round_trips = warm ? link_->warm_round_trips : link_->round_trips;
    for (int i = 0; i < round_trips; ++i) {
      t += link_->rtt();
      if (m.beacon_interval > Duration::zero()) {
        // The reply waits at the access point for the next beacon.
        auto since_epoch = t.time_since_epoch();
        auto rem = since_epoch % m.beacon_interval;
        if (rem != Duration::zero()) t += m.beacon_interval - rem;
      }
    }
    t += m.io.latency;
    plan.wait = t - start;
    plan.active = bw.TimeFor(io.size);
  } else {
    Bandwidth bw = io.write ? m.io.write_bandwidth : m.io.read_bandwidth;
    plan.active = m.io.latency + bw.TimeFor(io.size);
  }
  return plan;
}

IoEstimate Device::Estimate(const IoRequest& io, std::optional<int> assume_mode) const {
  IoEstimate e;
  TimePoint now = clock_.Now();
  TimePoint t = now;
  int mode = mode_;
  if (assume_mode) {
    mode = *assume_mode;
  } else {
    if (transitioning_) {
      t = transition_end_;
      e.transition += transition_end_ - now;
      mode = transition_to_;
    }
    if (busy_ && busy_until_ > t) t = busy_until_;
    if (pending_mode_) {
      Transition tr = profile_.TransitionCost(mode, *pending_mode_);
      t += tr.time;
      e.transition += tr.time;
      e.device_energy += tr.energy;
      mode = *pending_mode_;
    }
    // Time spent waiting for the device is drawn at its current power.
    e.device_energy += IdlePower(mode_) * (t - now - e.transition);
  }
  if (!profile_.modes[mode].serves_io) {
    Transition tr = profile_.TransitionCost(mode, profile_.HighPowerMode());
    t += tr.time;
    e.transition += tr.time;
    e.device_energy += tr.energy;
    mode = profile_.HighPowerMode();
  }
  IoPlan plan = PlanIo(io, mode, t);
  const Mode& m = profile_.modes[mode];
  e.device_energy += m.power * plan.wait + m.io.active_power * plan.active;
  e.time = (t - now) + plan.wait + plan.active;
  e.serving_mode = mode;
  return e;
}

void Device::BeginIo(Op op) {
  busy_ = true;
  current_ = std::move(op);
  IoPlan plan = PlanIo(current_.io, mode_, clock_.Now());
  busy_until_ = clock_.Now() + plan.wait + plan.active;
  if (events_.io_begin) events_.io_begin(current_.io);
  const Mode& m = profile_.modes[mode_];
  if (plan.wait > Duration::zero()) {
    Report(mode_, m.power);
    timer_ = clock_.ScheduleAfter(plan.wait, [this, active = plan.active] {
      Report(mode_, profile_.modes[mode_].io.active_power);
      timer_ = clock_.ScheduleAfter(active, [this] {
        timer_ = kNoTimer;
        EndIo();
      });
    });
  } else {
    Report(mode_, m.io.active_power);
    timer_ = clock_.ScheduleAfter(plan.active, [this] {
      timer_ = kNoTimer;
      EndIo();
    });
  }
}

void Device::EndIo() {
  busy_ = false;
  if (profile_.kind == DeviceKind::kNetwork) last_transfer_end_ = clock_.Now();
  Report(mode_, IdlePower(mode_));
  Op op = std::move(current_);
  current_ = Op();
  if (queue_.empty() && !pending_mode_) idle_since_ = clock_.Now();
  if (events_.io_end) events_.io_end(op.io);
  if (op.done) op.done();
  Pump();
}

std::string Device::NapRefusal() const {
  if (profile_.kind != DeviceKind::kNetwork) return "not a network card";
  if (profile_.modes.size() < 2) return "the card has one mode";
  if (napping()) return "napping already";
  if (mode_ != profile_.HighPowerMode() || transitioning_ || pending_mode_) {
    return "the card is not in " + profile_.modes[profile_.HighPowerMode()].name;
  }
  if (busy_ || !queue_.empty()) return "the card is busy";
  return "";
}

std::string Device::TryShapingNap(Duration due_in, Duration min_rtt, Duration wake_lead) {
  std::string why = NapRefusal();
  if (why.empty()) {
    const Transition down = profile_.TransitionCost(profile_.HighPowerMode(), profile_.LowestMode());
    const Transition up = profile_.TransitionCost(profile_.LowestMode(), profile_.HighPowerMode());
    if (2 * (up.time + wake_lead) > min_rtt) {
      ++nap_stats_.refused_slow_wake;
      char buf[160];
      std::snprintf(buf, sizeof buf,
                    "the card wakes in %.1f ms: with the %.1f ms lead, more than half the %.1f ms "
                    "minimum RTT",
                    ToSeconds(up.time) * 1e3, ToSeconds(wake_lead) * 1e3, ToSeconds(min_rtt) * 1e3);
      why = buf;
    } else if (due_in - wake_lead - up.time <= down.time) {
      why = "too short to sleep";
    } else {
      BeginNap(clock_.Now() + due_in - wake_lead - up.time);
      return "";
    }
  }
  ++nap_stats_.refused;
  return why;
}

void Device::BeginNap(TimePoint wake_start) {
  assert(NapRefusal().empty());
  const TimePoint now = clock_.Now();
  nap_begin_ = now;
  nap_wake_ = wake_start;
  nap_energy_before_ = nap_stats_.energy;
  ++nap_stats_.naps;
  const Transition down = profile_.TransitionCost(mode_, profile_.LowestMode());
  nap_ = NapPhase::kDown;
  nap_phase_start_ = now;
  nap_stats_.energy += down.energy;
  if (down.time > Duration::zero()) Report(EnergyMeter::kInTransition, down.energy / down.time);
  nap_timer_ = clock_.ScheduleAt(now + down.time, [this] {
    nap_timer_ = kNoTimer;
    NapStep();
  });
  if (events_.nap) events_.nap(true);
}

void Device::NapStep() {
  const TimePoint now = clock_.Now();
  switch (nap_) {
    case NapPhase::kDown:
      nap_ = NapPhase::kAsleep;
      nap_phase_start_ = now;
      Report(profile_.LowestMode(), IdlePower(profile_.LowestMode()));
      if (nap_wake_ <= now) {
        NapWake(now);
      } else {
        nap_timer_ = clock_.ScheduleAt(nap_wake_, [this] {
          nap_timer_ = kNoTimer;
          NapStep();
        });
      }
      break;
    case NapPhase::kAsleep:
      NapWake(now);
      break;
    case NapPhase::kUp:
      NapDone();
      break;
    case NapPhase::kNone:
      break;
  }
}

void Device::NapWake(TimePoint now) {
  assert(nap_ == NapPhase::kAsleep);
  const Duration slept = now - nap_phase_start_;
  nap_stats_.asleep += slept;
  nap_stats_.energy += IdlePower(profile_.LowestMode()) * slept;
  const Transition up = profile_.TransitionCost(profile_.LowestMode(), profile_.HighPowerMode());
  nap_ = NapPhase::kUp;
  nap_phase_start_ = now;
  nap_stats_.energy += up.energy;
  if (up.time > Duration::zero()) Report(EnergyMeter::kInTransition, up.energy / up.time);
  if (nap_timer_ != kNoTimer) clock_.Cancel(nap_timer_);
  nap_timer_ = clock_.ScheduleAt(now + up.time, [this] {
    nap_timer_ = kNoTimer;
    NapStep();
  });
}

void Device::NapDone() {
  const TimePoint now = clock_.Now();
  nap_ = NapPhase::kNone;
  const Duration total = now - nap_begin_;
  nap_stats_.time += total;
  // Saved against idling in mode 0 all along (negative when the transitions cost more).
  nap_stats_.saved += IdlePower(mode_) * total - (nap_stats_.energy - nap_energy_before_);
  Report(mode_, IdlePower(mode_));
  if (queue_.empty() && !pending_mode_) idle_since_ = now;
  if (events_.nap) events_.nap(false);
  Pump();
}

void Device::EndNap() {
  const TimePoint now = clock_.Now();
  if (nap_ == NapPhase::kAsleep) {
    ++nap_stats_.early;
    NapWake(now);
  } else if (nap_ == NapPhase::kDown && nap_wake_ > now) {
    ++nap_stats_.early;
    nap_wake_ = now;  // up as soon as the down transition ends
  }
}

void Device::AssertInvariants() const {
  auto fail = [this](const char* what) {
    std::fprintf(stderr, "ghost: device %s: broken invariant: %s\n", profile_.name.c_str(), what);
    std::abort();
  };
  if (mode_ < 0 || mode_ >= static_cast<int>(profile_.modes.size())) fail("mode out of range");
  if (busy_ && transitioning_) fail("busy and transitioning at once");
  if (busy_ && !profile_.modes[mode_].serves_io) fail("busy in a mode that serves no I/O");
  if ((busy_ || transitioning_) && timer_ == kNoTimer) fail("work in progress with no timer");
  if (napping() && (busy_ || transitioning_ || mode_ != profile_.HighPowerMode())) {
    fail("napping while busy, in transition or out of mode 0");
  }
  if (napping() != (nap_timer_ != kNoTimer)) fail("a nap without its timer, or a timer without a nap");
}

}  // namespace ghost
