// CostModel: choosing a source for each read, and ghost hints (DESIGN §3.4; the ghost-hints
// paper, MobiSys 2004, §3 and eq. 4).
//
// For a read of an object of size s, every source that holds it (the write queue in memory,
// the flash log, the disk cache, the network origin) is costed from the devices' current
// modes: expected time (waiting for the device, a transition if it must change mode, its
// latency, s / bandwidth; network round trips and PSM beacon waits as the Device models them)
// and expected whole-machine energy over that time (the serving device's energy plus base
// power and every other device's current idle power). The chosen source minimises
//
//     Cost = time·K + energy·(100 − K)        (eq. 4; seconds and joules, K the global knob)
//
// The model also costs every source as if its device were in its best (high-power) mode. If
// that ideal source differs from the chosen one, the ideal source's device receives a ghost
// hint carrying the time and energy that would have been saved (ideal vs chosen). Enough hints
// make the device's STPM module switch it proactively.
//
// Thread-safety: not thread-safe; use from the thread that drives the clock.
#ifndef GHOST_COMMON_POWER_COST_MODEL_H_
#define GHOST_COMMON_POWER_COST_MODEL_H_

#include <optional>
#include <span>
#include <string>
#include <vector>

#include "common/power/power_manager.h"
#include "common/base/units.h"

namespace ghost {

enum class Source { kMemory, kFlash, kDisk, kNetwork };
const char* SourceName(Source s);

// A place that holds the object: a source kind and its device (none for memory).
struct Holder {
  Source source = Source::kMemory;
  DeviceId device = -1;
};

struct SourceEstimate {
  Holder holder;
  Duration time{0};
  Energy energy;      // whole machine over `time`
  double cost = 0;    // eq. 4 at the knob of the estimate
};

struct Choice {
  SourceEstimate chosen;
  std::vector<SourceEstimate> candidates;  // every holder, current modes
  SourceEstimate ideal;                    // best holder with every device in its best mode
  bool hinted = false;                     // a ghost hint went to ideal.holder.device
  GhostHint hint;
};

// Weighted cost of eq. 4 (seconds and joules, K in 0..100).
double WeightedCost(Duration time, Energy energy, int knob);

class CostModel {
 public:
  // Memory reads (the write queue, the page cache) take s / memory_bandwidth.
  struct Options {
    Bandwidth memory_bandwidth = Bandwidth::BytesPerSecond(100e6);
    bool ghost_hints = true;
  };

  // Borrows `pm`, which must outlive the model.
  explicit CostModel(PowerManager& pm) : CostModel(pm, Options()) {}
  CostModel(PowerManager& pm, Options options);

  // Time and whole-machine energy to read `size` bytes from `holder` if started now; with
  // `best_mode`, as if the holder's device were idle in its high-power mode.
  SourceEstimate Estimate(const Holder& holder, Bytes size, bool best_mode = false) const;

  // Picks the cheapest holder now, and sends the ghost hint if the ideal holder differs.
  // Precondition: `holders` is not empty.
  Choice Choose(std::span<const Holder> holders, Bytes size);

  bool ghost_hints() const { return options_.ghost_hints; }
  void set_ghost_hints(bool on) { options_.ghost_hints = on; }
  int hints_sent() const { return hints_sent_; }

 private:
  PowerManager& pm_;
  Options options_;
  int hints_sent_ = 0;
};

}  // namespace ghost

#endif  // GHOST_COMMON_POWER_COST_MODEL_H_
