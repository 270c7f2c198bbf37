#include "common/power/stpm_disk.h"

#include <algorithm>
#include <cassert>
#include <cstdio>
#include <cstdlib>

#include "common/power/cost_model.h"

namespace ghost {
namespace {

void CheckLowPowerMode(const DeviceProfile& profile, int lp_mode) {
  assert(lp_mode >= 1 && lp_mode < static_cast<int>(profile.modes.size()));
  (void)profile;
  (void)lp_mode;
}

// Php − Plp, the power saved per unit of time spent in lp instead of the high-power mode.
Power PowerSaved(const DeviceProfile& profile, int lp_mode) {
  return profile.modes[profile.HighPowerMode()].power - profile.modes[lp_mode].power;
}

}  // namespace

Duration BreakEven(const DeviceProfile& profile, int lp_mode) {
  CheckLowPowerMode(profile, lp_mode);
  const int hp = profile.HighPowerMode();
  Power saved = PowerSaved(profile, lp_mode);
  if (saved <= Power()) return Duration::max();
  Energy round_trip = profile.TransitionCost(lp_mode, hp).energy +  // Eup
                      profile.TransitionCost(hp, lp_mode).energy;   // Edown
  return round_trip / saved;
}

Energy TransitionEnergyCost(const DeviceProfile& profile, int lp_mode, Power base) {
  CheckLowPowerMode(profile, lp_mode);
  const int hp = profile.HighPowerMode();
  Transition down = profile.TransitionCost(hp, lp_mode);
  Transition up = profile.TransitionCost(lp_mode, hp);
  Power php = profile.modes[hp].power;
  return down.energy - php * down.time + up.energy + base * up.time;
}

double WeightedSpinUpCost(const DeviceProfile& profile, int lp_mode, Power base, int knob) {
  CheckLowPowerMode(profile, lp_mode);
  Duration t_up = profile.TransitionCost(lp_mode, profile.HighPowerMode()).time;
  return WeightedCost(t_up, TransitionEnergyCost(profile, lp_mode, base), knob);
}

Duration KnobBreakEven(const DeviceProfile& profile, int lp_mode, Power base, int knob) {
  CheckLowPowerMode(profile, lp_mode);
  assert(knob >= 0 && knob <= 100);
  Power saved = PowerSaved(profile, lp_mode);
  if (knob >= 100 || saved <= Power()) return Duration::max();
  // Eq. (3): the idle time at which the weighted energy saved in lp, (Php − Plp)·t·(100 − K),
  // pays for the weighted cost of the trip, Tup·K + CE·(100 − K).
  double seconds =
      WeightedSpinUpCost(profile, lp_mode, base, knob) / (saved.watts() * (100 - knob));
  return Seconds(std::max(seconds, 0.0));
}

StpmDiskPolicy::~StpmDiskPolicy() = default;

void StpmDiskPolicy::Attach(PowerManager& pm, DeviceId id, Device& device) {
  DevicePolicy::Attach(pm, id, device);
  knob_ = pm.knob();
  base_ = pm.base_power();
  Recompute();
  timers_ = std::make_unique<SpinDownTimers>(pm.clock(), device);
  timers_->Start(Steps());
}

void StpmDiskPolicy::Recompute() {
  const DeviceProfile& p = device_->profile();
  thresholds_.assign(p.modes.size(), Duration::max());
  for (int m = 1; m < static_cast<int>(p.modes.size()); ++m) {
    thresholds_[m] = KnobBreakEven(p, m, base_, knob_);
  }
}

std::vector<SpinDownTimers::Step> StpmDiskPolicy::Steps() const {
  std::vector<SpinDownTimers::Step> steps;
  for (int m = 1; m < static_cast<int>(thresholds_.size()); ++m) {
    steps.push_back({m, thresholds_[m]});
  }
  return steps;
}

void StpmDiskPolicy::ResetBenefit() {
  benefit_ = 0;
  last_hint_.reset();
}

void StpmDiskPolicy::OnIoBegin(const IoRequest&) { timers_->OnIoBegin(); }

void StpmDiskPolicy::OnIoEnd(const IoRequest&) { timers_->OnIoEnd(); }

void StpmDiskPolicy::OnModeEntered(int mode) {
  if (mode == device_->profile().HighPowerMode()) ResetBenefit();
  timers_->OnModeEntered(mode);
}

void StpmDiskPolicy::OnGhostHint(const GhostHint& hint) {
  const int lp = device_->target_mode();
  if (lp == device_->profile().HighPowerMode()) return;  // in or heading to mode 0: no use
  const TimePoint now = pm_->clock().Now();
  if (last_hint_) {
    // The weighted energy the machine would have spent keeping the disk in mode 0 since the
    // previous hint: a spin-up would have cost that much on top of the transition.
    Energy stayed_up = PowerSaved(device_->profile(), lp) * (now - *last_hint_);
    benefit_ = std::max(0.0, benefit_ - (100 - knob_) * stayed_up.joules());
  }
  benefit_ += WeightedCost(hint.time_saved, hint.energy_saved, knob_);
  last_hint_ = now;
  if (benefit_ > WeightedSpinUpCost(device_->profile(), lp, base_, knob_)) {
    ResetBenefit();
    ++proactive_spin_ups_;
    device_->RequestMode(device_->profile().HighPowerMode());
  }
}

void StpmDiskPolicy::OnKnobChanged(int knob) {
  knob_ = knob;
  Recompute();
  timers_->SetSteps(Steps());
}

std::string StpmDiskPolicy::Describe() const {
  std::string out = name() + " K=" + std::to_string(knob_) + ":";
  if (!device_) return out + " not attached";
  bool any = false;
  for (int m = 1; m < static_cast<int>(thresholds_.size()); ++m) {
    if (thresholds_[m] == Duration::max()) continue;
    char buf[128];
    std::snprintf(buf, sizeof buf, "%s %s after %.2f s", any ? "," : "",
                  device_->profile().modes[m].name.c_str(), ToSeconds(thresholds_[m]));
    out += buf;
    any = true;
  }
  if (!any) out += " never spins down";
  return out;
}

void StpmDiskPolicy::AssertInvariants() const {
  auto fail = [](const char* what) {
    std::fprintf(stderr, "ghost: stpm-disk: broken invariant: %s\n", what);
    std::abort();
  };
  if (!device_ || !timers_) fail("used before Attach");
  if (benefit_ < 0) fail("negative ghost-hint benefit");
  if (knob_ < 0 || knob_ > 100) fail("knob out of range");
  if (thresholds_.size() != device_->profile().modes.size()) fail("thresholds out of date");
  if (knob_ == 100 && timers_->armed() > 0) fail("a spin-down is armed at K = 100");
  timers_->AssertInvariants();
}

}  // namespace ghost
