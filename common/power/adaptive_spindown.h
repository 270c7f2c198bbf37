// ExpertsDiskPolicy: adaptive disk spin-down by multiplicative weights over fixed-timeout
// experts (Helmbold, Long & Sherrod, "A dynamic disk spin-down technique for mobile
// computing", MobiCom 1996: the share algorithm of Herbster & Warmuth). A comparison point for
// StpmDiskPolicy: it learns one timeout from the recent idle periods instead of deriving it
// from the break-even time.
//
// Experts. n experts (default 25): n − 1 fixed timeouts spread geometrically from
// `min_timeout` (10 ms) to `max_timeout` (60 s), t_i = min·(max/min)^(i/(n−2)), plus one
// "never spin down" expert (t = ∞). Weights start equal and always sum to 1.
//
// Timeout used. If the "never" expert holds at least half the weight, the disk is not spun
// down; otherwise the timeout is the weight-averaged timeout of the finite experts
// (Σ w_i·t_i / Σ w_i over finite i). The "never" expert cannot enter a plain average (it is
// infinite), so it votes as a majority instead. At K = 100 the disk never spins down
// (DESIGN §3.2: K = 100 never spins down), though the experts keep learning.
//
// Spin-down. Only to the deepest low-power mode lp = LowestMode() (the paper's disks have one
// sleep state; stepping through the intermediate modes is StpmDiskPolicy's job): at
// idle_start + timeout, RequestMode(lp), under SpinDownTimers' rule.
//
// Learning. An idle period of length g ends when an I/O arrives: at the I/O's begin if the
// disk was spinning; if the disk had to spin up first, at the end of the spin-up minus the
// spin-up time from the mode it left (the arrival itself is not visible to the policy).
// Periods of length 0 teach nothing. For each expert i, the weighted loss over the period,
// with the costs of eq. (3) of the ghost-hints paper (see stpm_disk.h; K = the knob now):
//     L_i = (100 − K)·(Php − Plp)·min(g, t_i)          energy of staying up, weighted
//         + [t_i < g]·(Tup·K + CE·(100 − K))          spin-down/up cost, weighted
// normalised into [0, 1] on the scale of the spin-up cost C = Tup·K + CE·(100 − K):
//     ℓ_i = min(1, L_i / (2·C))
// 2·C is the most the break-even expert (timeout Tbe(K), eq. 3) can lose in any period (the
// classic 2-competitive bound) while the best expert in hindsight loses at most C; an expert
// that loses more (a long timeout through a long gap, "never") is as bad as it gets, 1.
// (If C <= 0, ℓ_i = L_i / max_j L_j instead.) Update: w_i ← w_i·β^ℓ_i (β default 0.95),
// renormalise to Σ w = 1, then share (Herbster & Warmuth's fixed share, so a workload change
// can be followed): w_i ← (1 − α)·w_i + α/n (α = `share`, default 0.001; 0 disables it).
// With the microdrive at K = 50, 300 gaps of 120 s take the timeout from 7.9 s to ≈ 0.5 s;
// 300 gaps of 2 s take it to ≈ 19 s.
//
// DefersBackgroundWrites() = true, as for STPM.
//
// Thread-safety: not thread-safe; all hooks run on the clock's thread.
#ifndef GHOST_COMMON_POWER_ADAPTIVE_SPINDOWN_H_
#define GHOST_COMMON_POWER_ADAPTIVE_SPINDOWN_H_

#include <memory>
#include <string>
#include <vector>

#include "common/power/power_manager.h"
#include "common/power/spin_down_timers.h"
#include "common/base/units.h"

namespace ghost {

struct ExpertsOptions {
  int experts = 25;                    // including "never"; at least 3
  Duration min_timeout = Millis(10);   // shortest finite expert
  Duration max_timeout = Seconds(60);  // longest finite expert
  double beta = 0.95;                  // per-period weight factor for a normalised loss of 1
  double share = 0.001;                // fixed-share fraction α, in [0, 1)
};

class ExpertsDiskPolicy : public DevicePolicy {
 public:
  // Preconditions: options.experts >= 3, 0 < min_timeout < max_timeout, 0 < beta < 1,
  // 0 <= share < 1.
  explicit ExpertsDiskPolicy(const ExpertsOptions& options = ExpertsOptions());
  ~ExpertsDiskPolicy() override;
  ExpertsDiskPolicy(const ExpertsDiskPolicy&) = delete;
  ExpertsDiskPolicy& operator=(const ExpertsDiskPolicy&) = delete;

  // Precondition: `device` has at least one low-power mode.
  void Attach(PowerManager& pm, DeviceId id, Device& device) override;
  void OnIoBegin(const IoRequest& io) override;
  void OnIoEnd(const IoRequest& io) override;
  void OnModeEntered(int mode) override;
  void OnKnobChanged(int knob) override;
  bool DefersBackgroundWrites() const override { return true; }
  std::string name() const override { return "experts-disk"; }
  // E.g. "experts-disk K=50: standby after 7.93 s (25 experts, 12 periods)".
  std::string Describe() const override;

  // The spin-down timeout the weights give now (Duration::max(): never), ignoring the knob.
  Duration WeightedTimeout() const;
  // The timeout in use: WeightedTimeout(), or Duration::max() at K = 100.
  Duration CurrentTimeout() const;
  // One learning step for an idle period of length `gap` (what the hooks call when an idle
  // period ends; public for ghostsim and tests). Precondition: attached.
  void Learn(Duration gap);

  // Each expert's timeout (the last is Duration::max(), "never") and weight (sum 1).
  const std::vector<Duration>& timeouts() const { return timeouts_; }
  const std::vector<double>& weights() const { return weights_; }
  int periods_learned() const { return periods_; }

  // Aborts with a message if the weights are inconsistent.
  void AssertInvariants() const;

 private:
  std::vector<SpinDownTimers::Step> Steps() const;
  void EndIdlePeriod(TimePoint arrival);

  ExpertsOptions options_;
  std::vector<Duration> timeouts_;
  std::vector<double> weights_;
  int knob_ = 50;
  int last_mode_ = 0;  // the mode the device was in before the latest OnModeEntered
  int periods_ = 0;
  std::unique_ptr<SpinDownTimers> timers_;
};

}  // namespace ghost

#endif  // GHOST_COMMON_POWER_ADAPTIVE_SPINDOWN_H_
