#include "common/power/spin_down_timers.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>

namespace ghost {

SpinDownTimers::SpinDownTimers(Clock& clock, Device& device) : clock_(clock), device_(device) {}

SpinDownTimers::~SpinDownTimers() { Disarm(); }

void SpinDownTimers::Start(std::vector<Step> steps) {
  Disarm();
  steps_ = std::move(steps);
  timers_.assign(steps_.size(), kNoTimer);
  if (device_.idle()) {
    Arm(device_.idle_since());
  } else {
    idle_start_.reset();
  }
}

void SpinDownTimers::SetSteps(std::vector<Step> steps) {
  std::optional<TimePoint> start = idle_start_;
  Disarm();
  steps_ = std::move(steps);
  timers_.assign(steps_.size(), kNoTimer);
  if (start) Arm(*start);
}

void SpinDownTimers::OnIoBegin() {
  Disarm();
  idle_start_.reset();
}

void SpinDownTimers::OnIoEnd() {
  Disarm();
  if (device_.idle()) {
    Arm(clock_.Now());
  } else {
    idle_start_.reset();
  }
}

void SpinDownTimers::OnModeEntered(int mode) {
  if (mode == 0) {
    Disarm();
    // Entering mode 0 with I/O queued ends idleness (the I/O is what spun the disk up);
    // with nothing queued (a proactive spin-up), a new idle period starts now.
    if (device_.idle() && device_.target_mode() == 0) {
      Arm(clock_.Now());
    } else {
      idle_start_.reset();
    }
    return;
  }
  int deferred = deferred_mode_;
  deferred_mode_ = 0;
  if (deferred > mode && device_.idle() && device_.target_mode() == mode) {
    device_.RequestMode(deferred);
  }
}

int SpinDownTimers::armed() const {
  return static_cast<int>(
      std::count_if(timers_.begin(), timers_.end(), [](TimerId t) { return t != kNoTimer; }));
}

void SpinDownTimers::Arm(TimePoint idle_start) {
  idle_start_ = idle_start;
  for (std::size_t i = 0; i < steps_.size(); ++i) {
    if (steps_[i].after == Duration::max()) continue;
    int index = static_cast<int>(i);
    timers_[i] = clock_.ScheduleAt(idle_start + steps_[i].after, [this, index] { Fire(index); });
  }
}

void SpinDownTimers::Disarm() {
  for (TimerId& t : timers_) {
    if (t != kNoTimer) clock_.Cancel(t);
    t = kNoTimer;
  }
  deferred_mode_ = 0;
}

void SpinDownTimers::Fire(int step_index) {
  timers_[step_index] = kNoTimer;
  int m = steps_[step_index].mode;
  if (device_.idle()) {
    if (device_.mode() < m) device_.RequestMode(m);
    return;
  }
  if (device_.transitioning() && device_.target_mode() > device_.mode() &&
      m > device_.target_mode()) {
    deferred_mode_ = std::max(deferred_mode_, m);
  }
}

void SpinDownTimers::AssertInvariants() const {
  auto fail = [](const char* what) {
    std::fprintf(stderr, "ghost: spin-down timers: broken invariant: %s\n", what);
    std::abort();
  };
  if (timers_.size() != steps_.size()) fail("timers and steps differ in number");
  if (armed() > 0 && !idle_start_) fail("a step is armed outside an idle period");
  for (const Step& s : steps_) {
    if (s.mode < 1 || s.mode >= static_cast<int>(device_.profile().modes.size())) {
      fail("a step names no low-power mode of the device");
    }
  }
}

}  // namespace ghost
