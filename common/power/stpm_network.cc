#include "common/power/stpm_network.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace ghost {
namespace {

[[noreturn]] void Fail(const char* what, const std::string& detail) {
  std::fprintf(stderr, "ghost: stpm-net: %s%s%s\n", what, detail.empty() ? "" : ": ",
               detail.c_str());
  std::abort();
}

Energy Over(Power p, std::chrono::duration<double> d) {
  return Energy::Joules(p.watts() * d.count());
}

}  // namespace

double Price::Weighted(int knob) const {
  assert(knob >= 0 && knob <= 100);
  return knob * ToSeconds(time) + (100 - knob) * energy.joules();
}

StpmNetworkPolicy::StpmNetworkPolicy(const StpmNetworkOptions& options) : options_(options) {
  if (options_.max_run_length < 1) Fail("bad options", "max_run_length must be at least 1");
  if (!(options_.run_decay > 0 && options_.run_decay <= 1) ||
      !(options_.gap_decay > 0 && options_.gap_decay <= 1)) {
    Fail("bad options", "decays must lie in (0, 1]");
  }
  if (options_.timeout_steps < 2 || options_.min_timeout <= Duration::zero() ||
      options_.max_timeout <= options_.min_timeout) {
    Fail("bad options", "need timeout_steps >= 2 and 0 < min_timeout < max_timeout");
  }
  if (!(options_.size_weight > 0 && options_.size_weight <= 1)) {
    Fail("bad options", "size_weight must lie in (0, 1]");
  }
}

StpmNetworkPolicy::~StpmNetworkPolicy() { CancelIdleTimer(); }

int StpmNetworkPolicy::knob() const { return pm_ ? pm_->knob() : 50; }

void StpmNetworkPolicy::Attach(PowerManager& pm, DeviceId id, Device& device) {
  DevicePolicy::Attach(pm, id, device);
  clock_ = &pm.clock();
  const DeviceProfile& prof = device.profile();
  if (prof.kind != DeviceKind::kNetwork || prof.modes.size() < 2) {
    Fail("needs a network device with a CAM and a PSM mode", prof.name);
  }
  cam_ = prof.HighPowerMode();
  psm_ = prof.LowestMode();
  Power delta = prof.modes[cam_].power - prof.modes[psm_].power;
  if (delta <= Power()) Fail("PSM must draw less than CAM", prof.name);
  Transition up = prof.TransitionCost(psm_, cam_);
  Transition down = prof.TransitionCost(cam_, psm_);
  // DESIGN §3.2 eq. 1, applied to the card.
  break_even_ = (up.energy + down.energy) / delta;
  run_gap_ = options_.run_gap > Duration::zero() ? options_.run_gap : break_even_;
  if (run_gap_ <= Duration::zero()) run_gap_ = options_.min_timeout;

  edges_.clear();
  double ratio = std::pow(ToSeconds(options_.max_timeout) / ToSeconds(options_.min_timeout),
                          1.0 / (options_.timeout_steps - 1));
  for (int i = 0; i < options_.timeout_steps; ++i) {
    edges_.push_back(Seconds(ToSeconds(options_.min_timeout) * std::pow(ratio, i)));
  }
  if (break_even_ > Duration::zero()) edges_.push_back(break_even_);
  edges_.push_back(run_gap_);
  std::sort(edges_.begin(), edges_.end());
  edges_.erase(std::unique(edges_.begin(), edges_.end()), edges_.end());
  gaps_.assign(edges_.size() + 1, GapBucket{});
  for (std::size_t i = 0; i < edges_.size(); ++i) gaps_[i].within_run = edges_[i] <= run_gap_;

  run_weight_.assign(options_.max_run_length + 1, 0.0);
  remaining_.assign(options_.max_run_length + 1, 0.0);
  switch_share_.assign(options_.max_run_length + 1, 0.0);
  served_before_.assign(options_.max_run_length + 1, 0.0);
  mean_run_ = 0;
  run_total_weight_ = 0;
  long_run_weighted_length_ = 0;
  mean_transfer_bytes_ = static_cast<double>(options_.initial_transfer_size);
  Recompute();
  MaybeArmIdleTimer(clock_->Now());
}

// ---- Hooks ----------------------------------------------------------------------------------

void StpmNetworkPolicy::OnIoBegin(const IoRequest& io) {
  // The round trips of a split transfer carry no data: its size comes with the continuation.
  if (!io.round_trips_only) {
    mean_transfer_bytes_ +=
        options_.size_weight * (static_cast<double>(io.size) - mean_transfer_bytes_);
  }
  if (open_disclosed_ > 0) {
    // Part of a transfer the application disclosed: counted at OnTransferBegin.
    CancelIdleTimer();
    ++in_flight_io_;
    return;
  }
  BeginTransfer();
  ++in_flight_io_;
}

void StpmNetworkPolicy::OnIoEnd(const IoRequest&) {
  if (in_flight_io_ > 0) --in_flight_io_;
  EndActivity();
}

void StpmNetworkPolicy::OnTransferBegin() {
  BeginTransfer();
  ++open_disclosed_;
}

void StpmNetworkPolicy::OnTransferEnd() {
  if (open_disclosed_ > 0) --open_disclosed_;
  EndActivity();
}

void StpmNetworkPolicy::OnGhostHint(const GhostHint&) {
  ++stats_.ghost_hints;
  BeginTransfer();
  EndActivity();
}

void StpmNetworkPolicy::OnModeEntered(int mode) {
  if (mode == cam_) {
    cam_entered_ = clock_->Now();
    MaybeArmIdleTimer(cam_entered_);
  } else {
    CancelIdleTimer();
  }
}

void StpmNetworkPolicy::OnNap(bool napping) {
  if (napping) {
    CancelIdleTimer();
  } else {
    // Device::idle() is false during a nap, so nothing re-armed the timer meanwhile.
    MaybeArmIdleTimer(clock_->Now());
  }
}

void StpmNetworkPolicy::OnKnobChanged(int) {
  // The plans cover every knob; only the running idle clock needs the new τ.
  if (idle_in_cam_) MaybeArmIdleTimer(idle_from_);
}

// ---- Transfers and runs ---------------------------------------------------------------------

void StpmNetworkPolicy::BeginTransfer() {
  TimePoint now = clock_->Now();
  CancelIdleTimer();
  bool new_run = run_length_ == 0;
  bool sampled = false;
  if (Quiet() && last_end_) {
    // Runs are separated by the time since the last activity. Inside a run the gap histogram,
    // which prices the idle timer, measures from when the timer would have started (the card
    // may have reached CAM after the activity ended: a switch finishing during think time).
    Duration since_end = std::max(now - *last_end_, Duration::zero());
    new_run = new_run || since_end >= run_gap_;
    Duration since_idle = std::max(now - std::max(*last_end_, cam_entered_), Duration::zero());
    AddGapSample(new_run ? since_end : since_idle);
    sampled = true;
  }
  if (new_run) {
    if (run_length_ > 0) AddRunSample(run_length_);
    run_length_ = 0;
    ++stats_.runs;
  }
  ++run_length_;
  ++stats_.transfers;
  if (sampled) Recompute();

  if (device_->target_mode() == cam_) return;  // in CAM or on its way
  if (ShouldSwitch(PriceNow(), knob(), run_length_)) {
    device_->RequestMode(cam_);
    ++stats_.switches_to_cam;
  }
}

void StpmNetworkPolicy::EndActivity() {
  TimePoint now = clock_->Now();
  last_end_ = now;
  MaybeArmIdleTimer(now);
}

void StpmNetworkPolicy::MaybeArmIdleTimer(TimePoint idle_from) {
  CancelIdleTimer();
  if (!Quiet() || !device_->idle() || device_->mode() != cam_ || device_->target_mode() != cam_) {
    return;
  }
  idle_in_cam_ = true;
  idle_from_ = idle_from;
  std::optional<Duration> tau = plans_[knob()].terms.timeout;
  if (!tau) return;  // never: the card stays in CAM
  timer_ = clock_->ScheduleAt(idle_from + *tau, [this] {
    timer_ = kNoTimer;
    OnIdleTimeout();
  });
}

void StpmNetworkPolicy::CancelIdleTimer() {
  idle_in_cam_ = false;
  if (timer_ != kNoTimer) {
    clock_->Cancel(timer_);
    timer_ = kNoTimer;
  }
}

void StpmNetworkPolicy::OnIdleTimeout() {
  idle_in_cam_ = false;
  if (!Quiet() || !device_->idle() || device_->mode() != cam_ || device_->target_mode() != cam_) {
    return;
  }
  device_->RequestMode(psm_);
  ++stats_.switches_to_psm;
}

// ---- Histograms -----------------------------------------------------------------------------

void StpmNetworkPolicy::AddRunSample(int length) {
  const int n_max = options_.max_run_length;
  for (double& w : run_weight_) w *= options_.run_decay;
  run_total_weight_ *= options_.run_decay;
  long_run_weighted_length_ *= options_.run_decay;
  int n = std::min(length, n_max);
  run_weight_[n] += 1;
  run_total_weight_ += 1;
  if (n == n_max) long_run_weighted_length_ += length;

  // R(j) = Σ_{n≥j} (ℓ_n − j)·h[n] / Σ_{n≥j} h[n], suffix sums from the top.
  double long_len = run_weight_[n_max] > 0 ? long_run_weighted_length_ / run_weight_[n_max] : n_max;
  auto len_of = [&](int bucket) {
    return bucket == n_max ? long_len : static_cast<double>(bucket);
  };
  double den = 0, len_sum = 0;  // Σ h[n], Σ ℓ_n·h[n] over n ≥ j
  remaining_[0] = 0;
  for (int j = n_max; j >= 1; --j) {
    den += run_weight_[j];
    len_sum += len_of(j) * run_weight_[j];
    remaining_[j] = den > 0 ? std::max(0.0, (len_sum - j * den) / den) : 0.0;
  }
  // E[n], P(n > j) and E[min(n, j)] for the per-run cost of a switch threshold j.
  mean_run_ = 0;
  for (int n = 1; n <= n_max; ++n) mean_run_ += len_of(n) * run_weight_[n] / run_total_weight_;
  for (int j = 0; j <= n_max; ++j) {
    double longer = 0, served = 0;
    for (int n = 1; n <= n_max; ++n) {
      double share = run_weight_[n] / run_total_weight_;
      if (len_of(n) > j) longer += share;
      served += std::min(len_of(n), static_cast<double>(j)) * share;
    }
    switch_share_[j] = longer;
    served_before_[j] = served;
  }
}

void StpmNetworkPolicy::AddGapSample(Duration gap) {
  for (GapBucket& b : gaps_) {
    b.weight *= options_.gap_decay;
    b.weighted_sum *= options_.gap_decay;
  }
  std::size_t i = std::upper_bound(edges_.begin(), edges_.end(), gap) - edges_.begin();
  gaps_[i].weight += 1;
  gaps_[i].weighted_sum += FloatSeconds(ToSeconds(gap));
}

double StpmNetworkPolicy::Remaining(int j) const {
  const int n_max = options_.max_run_length;
  if (j <= n_max) return remaining_[j];
  if (run_weight_[n_max] <= 0) return 0;
  return std::max(0.0, long_run_weighted_length_ / run_weight_[n_max] - j);
}

double StpmNetworkPolicy::ExpectedRemainingTransfers(int j) const {
  assert(j >= 1);
  return Remaining(j);
}

// ---- Costs ----------------------------------------------------------------------------------

StpmNetworkPolicy::Pricing StpmNetworkPolicy::PriceNow() const {
  const DeviceProfile& prof = device_->profile();
  Pricing p;
  p.rest = pm_->base_power() + pm_->IdlePowerOfOthers(id_);
  p.delta_power = prof.modes[cam_].power - prof.modes[psm_].power;

  IoRequest io;
  io.size = static_cast<Bytes>(std::max(1.0, std::round(mean_transfer_bytes_)));
  IoEstimate in_cam = device_->Estimate(io, cam_);
  IoEstimate in_psm = device_->Estimate(io, psm_);
  Duration dt = in_psm.time - in_cam.time;

  double within_weight = 0;
  FloatSeconds within_sum(0);
  for (const GapBucket& b : gaps_) {
    if (!b.within_run) continue;
    within_weight += b.weight;
    within_sum += b.weighted_sum;
  }
  FloatSeconds think = within_weight > 0 ? within_sum / within_weight : FloatSeconds(0);
  p.saving.time = dt;
  p.saving.energy =
      (in_psm.device_energy - in_cam.device_energy) + p.rest * dt - Over(p.delta_power, think);

  Transition up = prof.TransitionCost(psm_, cam_);
  Transition down = prof.TransitionCost(cam_, psm_);
  p.up.time = up.time;
  p.up.energy = up.energy + p.rest * up.time;
  p.down_extra = std::max(Energy(), down.energy - prof.modes[psm_].power * down.time);
  p.t_down = down.time;
  return p;
}

std::vector<StpmNetworkPolicy::TimeoutTerms> StpmNetworkPolicy::TimeoutCandidates(
    const Pricing& p) const {
  double between_weight = 0, within_weight = 0;
  for (const GapBucket& g : gaps_) (g.within_run ? within_weight : between_weight) += g.weight;
  const std::size_t n_edges = edges_.size();
  std::vector<TimeoutTerms> out;
  out.reserve(n_edges + 1);
  for (std::size_t c = 0; c <= n_edges; ++c) {
    TimeoutTerms t;
    if (c < n_edges) t.timeout = edges_[c];
    double reach = 0, short_weight = 0;
    FloatSeconds short_sum(0), after_time(0), within_time(0);
    Energy after_energy, within_energy;
    for (std::size_t b = 0; b < gaps_.size(); ++b) {
      const GapBucket& g = gaps_[b];
      if (g.weight <= 0) continue;
      // Bucket b = [edges_[b−1], edges_[b]) lies below τ = edges_[c] iff b <= c.
      const bool below = c == n_edges || b <= c;
      const FloatSeconds mean = g.Mean();
      if (below && !g.within_run) {  // the card waits in CAM through the whole gap
        double f = g.weight / between_weight;
        short_weight += g.weight;
        short_sum += g.weight * mean;
        after_energy += Over(p.delta_power, mean) * f;
      } else if (!below) {  // the card waits τ, returns, and the next transfer may wait for it
        const FloatSeconds tau(ToSeconds(*t.timeout));
        const FloatSeconds wait =
            std::max(FloatSeconds(0), tau + FloatSeconds(ToSeconds(p.t_down)) - mean);
        const Energy spent = Over(p.delta_power, tau) + p.down_extra + Over(p.rest, wait);
        if (!g.within_run) {
          double f = g.weight / between_weight;
          reach += f;
          after_time += wait * f;
          after_energy += spent * f;
        } else {
          // Inside a run: S already charged the think time in CAM; the card sleeps from τ,
          // and the run goes on with one transfer in PSM and another switch up.
          double f = g.weight / within_weight;
          within_time += (wait + FloatSeconds(ToSeconds(p.up.time + p.saving.time))) * f;
          within_energy += (spent - Over(p.delta_power, mean) + p.up.energy + p.saving.energy) * f;
        }
      }
    }
    t.returns = between_weight > 0 ? reach : 1.0;
    t.gap_in_cam =
        short_weight > 0 ? Seconds((short_sum / short_weight).count()) : Duration::zero();
    t.after_run = Price{Seconds(after_time.count()), after_energy};
    const double within_gaps = std::max(0.0, mean_run_ - 1);  // think times per run
    t.within_run = Price{Seconds(within_time.count() * within_gaps), within_energy * within_gaps};
    out.push_back(t);
  }
  return out;
}

double StpmNetworkPolicy::SwitchValue(const Pricing& p, int k, int j, const TimeoutTerms& t) const {
  const double save = p.saving.Weighted(k);
  // An episode in CAM lasts until a gap between runs reaches τ: 1/q − 1 further runs on
  // average, each served in CAM after a gap spent in CAM (and any drops inside it).
  const double further_runs = 1.0 / std::max(t.returns, kMinReturnShare) - 1.0;
  const double per_run = mean_run_ * save -
                         Price{Duration::zero(), p.delta_power * t.gap_in_cam}.Weighted(k) -
                         t.within_run.Weighted(k);
  const double last_return =
      t.timeout && t.returns > 0
          ? Price{Duration::zero(), p.down_extra + p.delta_power * *t.timeout}.Weighted(k)
          : 0.0;
  return Remaining(j) * save + further_runs * per_run - p.up.Weighted(k) - last_return;
}

bool StpmNetworkPolicy::ShouldSwitch(const Pricing& p, int k, int j) const {
  double r = Remaining(j);
  if (r <= 0) return false;
  if (SwitchValue(p, k, j, plans_[k].terms) > 0) return true;      // rule (a)
  if (SwitchValue(p, 100, j, plans_[k].terms) <= 0) return false;  // costs time
  for (int lower = 0; lower < k; ++lower) {                        // rule (b)
    if (SwitchValue(p, lower, j, plans_[lower].terms) > 0) return true;
  }
  return false;
}

double StpmNetworkPolicy::PerRunCost(const Pricing& p, int k, const TimeoutTerms& t,
                                     std::optional<int> cam_after) const {
  // A run starts in PSM or in CAM. From PSM it switches with probability s = P(n > j*), after
  // serving E[min(n, j*)] transfers in PSM; a run that ends in CAM is followed by a gap that
  // reaches τ with probability q. The share of runs that start in CAM is then
  // π = s(1 − q) / (q + s(1 − q)) (the stationary state of that two-state chain).
  const int n_max = options_.max_run_length;
  const double s = cam_after ? switch_share_[std::min(*cam_after, n_max)] : 0.0;
  const double served_in_psm = cam_after ? served_before_[std::min(*cam_after, n_max)] : mean_run_;
  const double q = t.returns;
  const double den = q + s * (1 - q);
  const double in_cam = den > 0 ? s * (1 - q) / den : 0.0;
  const double cam_run = t.after_run.Weighted(k) + t.within_run.Weighted(k);
  const double from_psm = served_in_psm * p.saving.Weighted(k) + s * (p.up.Weighted(k) + cam_run);
  return (1 - in_cam) * from_psm + in_cam * cam_run;
}

void StpmNetworkPolicy::Recompute() {
  if (!device_) return;
  if (run_total_weight_ <= 0) {
    TimeoutTerms no_history;
    no_history.timeout = run_gap_;
    for (Plan& plan : plans_) plan = Plan{std::nullopt, no_history};
    return;
  }
  const Pricing p = PriceNow();
  const int n_max = options_.max_run_length;
  const std::vector<TimeoutTerms> candidates = TimeoutCandidates(p);
  std::vector<char> lower_pays(n_max + 1, 0);  // f_K'(j) > 0 for some K' below this K
  auto cheaper = [](double cost, double best) {
    return cost < best - 1e-9 * std::max(1.0, std::fabs(best));
  };

  std::size_t lowest = 0;  // τ_K may not be shorter than τ_{K−1}
  for (int k = 0; k < kKnobs; ++k) {
    auto first_switch = [&](const TimeoutTerms& t) -> std::optional<int> {
      for (int j = 1; j <= n_max; ++j) {
        double r = remaining_[j];
        if (r <= 0) continue;
        if (SwitchValue(p, k, j, t) > 0) return j;
        if (lower_pays[j] && SwitchValue(p, 100, j, t) > 0) return j;  // saves time
      }
      return std::nullopt;
    };
    // Candidates in ascending order, `never` last: ties go to the shorter timeout.
    std::size_t best = lowest;
    std::optional<int> best_switch = first_switch(candidates[best]);
    double best_cost = PerRunCost(p, k, candidates[best], best_switch);
    for (std::size_t c = lowest + 1; c < candidates.size(); ++c) {
      std::optional<int> j = first_switch(candidates[c]);
      double cost = PerRunCost(p, k, candidates[c], j);
      if (cheaper(cost, best_cost)) {
        best = c;
        best_switch = j;
        best_cost = cost;
      }
    }
    plans_[k] = Plan{best_switch, candidates[best]};
    for (int j = 1; j <= n_max; ++j) {
      if (remaining_[j] > 0 && SwitchValue(p, k, j, candidates[best]) > 0) lower_pays[j] = 1;
    }
    lowest = best;
  }
}

// ---- Introspection --------------------------------------------------------------------------

std::optional<int> StpmNetworkPolicy::CamAfterTransfers() const {
  assert(device_);
  return plans_[knob()].cam_after;
}

std::optional<Duration> StpmNetworkPolicy::IdleTimeout() const {
  assert(device_);
  return plans_[knob()].terms.timeout;
}

std::string StpmNetworkPolicy::Describe() const {
  int k = knob();
  std::string out = name() + " K=" + std::to_string(k) + ":";
  if (!device_) return out + " not attached";
  const Plan& plan = plans_[k];
  char buf[160];
  if (plan.cam_after) {
    std::snprintf(buf, sizeof buf, " CAM after %d transfer%s", *plan.cam_after,
                  *plan.cam_after == 1 ? "" : "s");
    out += buf;
  } else {
    out += run_total_weight_ > 0 ? " stays in PSM" : " stays in PSM (no run history yet)";
  }
  if (plan.terms.timeout) {
    std::snprintf(buf, sizeof buf, ", PSM after %.3g s idle", ToSeconds(*plan.terms.timeout));
    out += buf;
  } else {
    out += ", stays in CAM once there";
  }
  return out;
}

void StpmNetworkPolicy::AssertInvariants() const {
  if (in_flight_io_ < 0 || open_disclosed_ < 0)
    Fail("broken invariant", "negative in-flight count");
  if (timer_ != kNoTimer && !(idle_in_cam_ && Quiet())) {
    Fail("broken invariant", "idle timer armed while not idle in CAM");
  }
  if (device_ && timer_ != kNoTimer && device_->mode() != cam_) {
    Fail("broken invariant", "idle timer armed outside CAM");
  }
  if (!std::is_sorted(edges_.begin(), edges_.end())) Fail("broken invariant", "edges unsorted");
  for (double w : run_weight_) {
    if (w < 0) Fail("broken invariant", "negative run weight");
  }
  for (const GapBucket& b : gaps_) {
    if (b.weight < 0) Fail("broken invariant", "negative gap weight");
  }
  for (int k = 1; k < kKnobs; ++k) {
    const auto& lo = plans_[k - 1].terms.timeout;
    const auto& hi = plans_[k].terms.timeout;
    if (!lo && hi) Fail("broken invariant", "idle timeout shorter at a higher knob");
    if (lo && hi && *hi < *lo) Fail("broken invariant", "idle timeout shorter at a higher knob");
  }
}

}  // namespace ghost
