#include "common/power/adaptive_spindown.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "common/power/stpm_disk.h"

namespace ghost {

ExpertsDiskPolicy::ExpertsDiskPolicy(const ExpertsOptions& options) : options_(options) {
  assert(options_.experts >= 3);
  assert(options_.min_timeout > Duration::zero() && options_.min_timeout < options_.max_timeout);
  assert(options_.beta > 0 && options_.beta < 1);
  assert(options_.share >= 0 && options_.share < 1);
  const int finite = options_.experts - 1;
  const double lo = ToSeconds(options_.min_timeout);
  const double ratio = ToSeconds(options_.max_timeout) / lo;
  for (int i = 0; i < finite; ++i) {
    timeouts_.push_back(Seconds(lo * std::pow(ratio, static_cast<double>(i) / (finite - 1))));
  }
  timeouts_.push_back(Duration::max());  // "never spin down"
  weights_.assign(timeouts_.size(), 1.0 / static_cast<double>(timeouts_.size()));
}

ExpertsDiskPolicy::~ExpertsDiskPolicy() = default;

void ExpertsDiskPolicy::Attach(PowerManager& pm, DeviceId id, Device& device) {
  DevicePolicy::Attach(pm, id, device);
  assert(device.profile().LowestMode() >= 1);
  knob_ = pm.knob();
  last_mode_ = device.mode();
  timers_ = std::make_unique<SpinDownTimers>(pm.clock(), device);
  timers_->Start(Steps());
}

Duration ExpertsDiskPolicy::WeightedTimeout() const {
  const double never = weights_.back();
  if (never >= 0.5) return Duration::max();
  double weighted_seconds = 0;
  double finite_weight = 0;
  for (std::size_t i = 0; i + 1 < timeouts_.size(); ++i) {
    weighted_seconds += weights_[i] * ToSeconds(timeouts_[i]);
    finite_weight += weights_[i];
  }
  return Seconds(weighted_seconds / finite_weight);
}

Duration ExpertsDiskPolicy::CurrentTimeout() const {
  return knob_ >= 100 ? Duration::max() : WeightedTimeout();
}

std::vector<SpinDownTimers::Step> ExpertsDiskPolicy::Steps() const {
  return {{device_->profile().LowestMode(), CurrentTimeout()}};
}

void ExpertsDiskPolicy::Learn(Duration gap) {
  assert(device_);
  if (gap <= Duration::zero()) return;
  const DeviceProfile& p = device_->profile();
  const int lp = p.LowestMode();
  const Power saved = p.modes[p.HighPowerMode()].power - p.modes[lp].power;
  const double spin_cost = std::max(0.0, WeightedSpinUpCost(p, lp, pm_->base_power(), knob_));
  std::vector<double> loss(timeouts_.size());
  double worst = 0;
  for (std::size_t i = 0; i < timeouts_.size(); ++i) {
    const bool spins_down = timeouts_[i] < gap;
    const Duration stayed_up = spins_down ? timeouts_[i] : gap;
    loss[i] = (100 - knob_) * std::max(0.0, (saved * stayed_up).joules()) +
              (spins_down ? spin_cost : 0.0);
    worst = std::max(worst, loss[i]);
  }
  ++periods_;
  // Scale: twice the spin-up cost, the break-even expert's worst case (see the header).
  double scale = 2 * spin_cost;
  if (scale <= 0) scale = worst;
  if (scale <= 0) return;  // every expert did equally well
  double sum = 0;
  for (std::size_t i = 0; i < weights_.size(); ++i) {
    weights_[i] *= std::pow(options_.beta, std::min(1.0, loss[i] / scale));
    sum += weights_[i];
  }
  const double n = static_cast<double>(weights_.size());
  for (double& w : weights_) w = (1 - options_.share) * (w / sum) + options_.share / n;
}

void ExpertsDiskPolicy::EndIdlePeriod(TimePoint arrival) {
  std::optional<TimePoint> start = timers_->idle_start();
  if (start && arrival > *start) Learn(arrival - *start);
}

void ExpertsDiskPolicy::OnIoBegin(const IoRequest&) {
  const bool was_idle = timers_->idle_start().has_value();
  if (was_idle) EndIdlePeriod(pm_->clock().Now());
  timers_->OnIoBegin();
  if (was_idle) timers_->SetSteps(Steps());
}

void ExpertsDiskPolicy::OnIoEnd(const IoRequest&) { timers_->OnIoEnd(); }

void ExpertsDiskPolicy::OnModeEntered(int mode) {
  const int previous = last_mode_;
  last_mode_ = mode;
  const int hp = device_->profile().HighPowerMode();
  const bool io_spun_up = mode == hp && !device_->idle() && timers_->idle_start().has_value();
  if (io_spun_up) {
    // The I/O that ended the idle period arrived about one spin-up ago.
    Duration spin_up = device_->profile().TransitionCost(previous, hp).time;
    EndIdlePeriod(pm_->clock().Now() - spin_up);
  }
  timers_->OnModeEntered(mode);
  if (io_spun_up) timers_->SetSteps(Steps());
}

void ExpertsDiskPolicy::OnKnobChanged(int knob) {
  knob_ = knob;
  timers_->SetSteps(Steps());
}

std::string ExpertsDiskPolicy::Describe() const {
  std::string out = name() + " K=" + std::to_string(knob_) + ": ";
  if (!device_) return out + "not attached";
  Duration t = CurrentTimeout();
  char buf[256];
  if (t == Duration::max()) {
    std::snprintf(buf, sizeof buf, "never spins down (%zu experts, %d periods)", timeouts_.size(),
                  periods_);
  } else {
    std::snprintf(buf, sizeof buf, "%s after %.2f s (%zu experts, %d periods)",
                  device_->profile().modes[device_->profile().LowestMode()].name.c_str(),
                  ToSeconds(t), timeouts_.size(), periods_);
  }
  return out + buf;
}

void ExpertsDiskPolicy::AssertInvariants() const {
  auto fail = [](const char* what) {
    std::fprintf(stderr, "ghost: experts-disk: broken invariant: %s\n", what);
    std::abort();
  };
  if (weights_.size() != timeouts_.size()) fail("weights and experts differ in number");
  double sum = 0;
  for (double w : weights_) {
    if (!(w >= 0) || !std::isfinite(w)) fail("a weight is negative or not finite");
    sum += w;
  }
  if (std::abs(sum - 1) > 1e-9) fail("weights do not sum to 1");
  if (!std::is_sorted(timeouts_.begin(), timeouts_.end())) fail("expert timeouts out of order");
  if (timers_) timers_->AssertInvariants();
}

}  // namespace ghost
