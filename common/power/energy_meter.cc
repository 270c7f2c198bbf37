#include "common/power/energy_meter.h"

#include <cassert>

namespace ghost {

EnergyMeter::EnergyMeter(const Clock& clock, Power base_power)
    : clock_(clock), base_power_(base_power), start_(clock.Now()), base_since_(start_) {}

int EnergyMeter::AddDevice(const std::string& name, std::vector<std::string> mode_names, int mode,
                           Power power) {
  Track t;
  t.totals.name = name;
  t.totals.energy_in_mode.assign(mode_names.size(), Energy());
  t.totals.time_in_mode.assign(mode_names.size(), Duration::zero());
  t.totals.mode_names = std::move(mode_names);
  t.since = clock_.Now();
  t.power = power;
  t.mode = mode;
  tracks_.push_back(std::move(t));
  return static_cast<int>(tracks_.size()) - 1;
}

void EnergyMeter::Accumulate(Track& t, TimePoint until) {
  if (until <= t.since) return;
  Duration d = until - t.since;
  Energy e = t.power * d;
  t.totals.energy += e;
  if (t.mode == kInTransition) {
    t.totals.transition_energy += e;
    t.totals.transition_time += d;
  } else {
    t.totals.energy_in_mode[t.mode] += e;
    t.totals.time_in_mode[t.mode] += d;
  }
  t.since = until;
}

void EnergyMeter::Record(int d, int mode, Power power) {
  assert(d >= 0 && d < static_cast<int>(tracks_.size()));
  Track& t = tracks_[d];
  assert(mode == kInTransition || (mode >= 0 && mode < static_cast<int>(t.totals.energy_in_mode.size())));
  TimePoint now = clock_.Now();
  if (keep_timeline_ && now > t.since) timeline_.push_back({d, t.since, now, t.power, t.mode});
  Accumulate(t, now);
  t.power = power;
  t.mode = mode;
}

void EnergyMeter::CountTransition(int d) { ++tracks_[d].totals.transitions; }

void EnergyMeter::SetBasePower(Power p) {
  TimePoint now = clock_.Now();
  base_energy_ += base_power_ * (now - base_since_);
  base_since_ = now;
  base_power_ = p;
}

EnergyReport EnergyMeter::Read() const {
  TimePoint now = clock_.Now();
  EnergyReport r;
  r.elapsed = now - start_;
  r.base = base_energy_ + base_power_ * (now - base_since_);
  r.total = r.base;
  for (const Track& t : tracks_) {
    Track copy = t;
    Accumulate(copy, now);
    r.total += copy.totals.energy;
    r.devices.push_back(std::move(copy.totals));
  }
  return r;
}

void EnergyMeter::Reset() {
  TimePoint now = clock_.Now();
  start_ = base_since_ = now;
  base_energy_ = Energy();
  timeline_.clear();
  for (Track& t : tracks_) {
    DeviceEnergy fresh;
    fresh.name = t.totals.name;
    fresh.mode_names = t.totals.mode_names;
    fresh.energy_in_mode.assign(fresh.mode_names.size(), Energy());
    fresh.time_in_mode.assign(fresh.mode_names.size(), Duration::zero());
    t.totals = std::move(fresh);
    t.since = now;
  }
}

std::vector<PowerSegment> EnergyMeter::Timeline() const {
  std::vector<PowerSegment> out = timeline_;
  TimePoint now = clock_.Now();
  for (int d = 0; d < static_cast<int>(tracks_.size()); ++d) {
    const Track& t = tracks_[d];
    if (now > t.since) out.push_back({d, t.since, now, t.power, t.mode});
  }
  return out;
}

}  // namespace ghost
