#include "common/power/cost_model.h"

#include <cassert>

namespace ghost {

const char* SourceName(Source s) {
  switch (s) {
    case Source::kMemory: return "memory";
    case Source::kFlash: return "flash";
    case Source::kDisk: return "disk";
    case Source::kNetwork: return "network";
  }
  return "?";
}

double WeightedCost(Duration time, Energy energy, int knob) {
  return ToSeconds(time) * knob + energy.joules() * (100 - knob);
}

CostModel::CostModel(PowerManager& pm, Options options) : pm_(pm), options_(options) {}

SourceEstimate CostModel::Estimate(const Holder& holder, Bytes size, bool best_mode) const {
  SourceEstimate e;
  e.holder = holder;
  if (holder.source == Source::kMemory || holder.device < 0) {
    e.time = options_.memory_bandwidth.TimeFor(size);
    e.energy = (pm_.base_power() + pm_.IdlePowerOfOthers(-1)) * e.time;
  } else {
    const Device& d = pm_.device(holder.device);
    IoRequest io{size, /*write=*/false};
    IoEstimate io_est = best_mode ? d.Estimate(io, d.profile().HighPowerMode()) : d.Estimate(io);
    e.time = io_est.time;
    // While this device works, the rest of the machine draws base power and idles.
    e.energy = io_est.device_energy + (pm_.base_power() + pm_.IdlePowerOfOthers(holder.device)) * e.time;
  }
  e.cost = WeightedCost(e.time, e.energy, pm_.knob());
  return e;
}

Choice CostModel::Choose(std::span<const Holder> holders, Bytes size) {
  assert(!holders.empty());
  Choice c;
  for (const Holder& h : holders) {
    c.candidates.push_back(Estimate(h, size));
    if (c.candidates.size() == 1 || c.candidates.back().cost < c.chosen.cost) c.chosen = c.candidates.back();
  }
  bool first = true;
  for (const Holder& h : holders) {
    SourceEstimate best = Estimate(h, size, /*best_mode=*/true);
    if (first || best.cost < c.ideal.cost) c.ideal = best;
    first = false;
  }
  bool differs = c.ideal.holder.source != c.chosen.holder.source ||
                 c.ideal.holder.device != c.chosen.holder.device;
  if (differs && c.ideal.holder.device >= 0 && c.ideal.cost < c.chosen.cost) {
    c.hint.time_saved = c.chosen.time - c.ideal.time;
    c.hint.energy_saved = c.chosen.energy - c.ideal.energy;
    if (options_.ghost_hints) {
      pm_.SendGhostHint(c.ideal.holder.device, c.hint);
      c.hinted = true;
      ++hints_sent_;
    }
  }
  return c;
}

}  // namespace ghost
