// StpmNetworkPolicy: self-tuning power management for a wireless network card (DESIGN §3.3;
// after Anand, Nightingale, Flinn, "Self-tuning wireless network power management", MobiCom
// 2003, and the ghost hints of Anand, Nightingale, Flinn, "Ghosts in the Machine: Interfaces
// for Better Power Management", MobiSys 2004).
//
// The card has a fast, hungry mode CAM (mode 0, power Pcam) and a power-saving mode PSM (the
// lowest mode, power Ppsm, which wakes at each beacon so every round trip waits for one,
// DESIGN §7). Switching costs Tup/Eup (PSM→CAM) and Tdown/Edown (CAM→PSM); on the Cisco 350
// 400 ms/510 mJ and 410 ms/530 mJ, so a switch for one or two transfers loses time *and*
// energy. The module decides, from what the card has seen and the global knob K, when to go up
// (after j transfers of a run) and when to come down (after an idle time τ).
//
// Notation. ΔP = Pcam − Ppsm. Prest = base power + the idle power of every other device
// (PowerManager::base_power, IdlePowerOfOthers): what the rest of the machine draws while the
// user waits. Costs are weighed as in the ghost-hints paper's eq. 4:
//   W_K(t, E) = K·t + (100 − K)·E          (t in seconds, E in joules)
//
// Transfers. A transfer begins at
//   - OnTransferBegin (an application disclosed it); I/O that begins while a disclosed
//     transfer is open belongs to it and is not counted again (so a disclosed download made of
//     several bursts is one transfer, and a hint plus its I/O count once);
//   - OnIoBegin while no disclosed transfer is open (an undisclosed transfer);
//   - OnGhostHint: a ghost hint is a transfer that begins and ends at once, in the current run
//     (DESIGN §3.3; like any transfer it starts a new run if it comes run_gap or more after
//     the last activity), so several in a row switch the card like transfers do. Its time and
//     energy are not used: the hint says "the network would have been used", which is what a
//     transfer says.
// Activity ends at OnIoEnd, OnTransferEnd and at a ghost hint. The idle period before a
// transfer, begin − end of the last activity, is defined only if nothing was in flight.
// Within a run the gap histogram records it from the later of that end and the card's last
// arrival in CAM (when the idle timer starts), so a transfer that had to wait for a PSM→CAM
// switch does not record that wait as idle time in CAM.
//
// Runs. A transfer that begins run_gap or more after the last activity ended starts a new run
// (the previous run's length then enters the run histogram). Default run_gap = the card's
// break-even time Tbe = (Eup + Edown) / ΔP (DESIGN §3.2 eq. 1; 1.02 s for the Cisco 350):
// idle shorter than that is never worth a round trip to PSM, so it cannot separate two runs.
//
// Histograms (both decay, so the module follows a changing workload):
//   h[n]  run lengths in transfers, n = 1..N (N = max_run_length; h[N] holds every run of N or
//         more at their mean length ℓ_N); all weights × run_decay (0.95) per new run.
//   gaps  every idle period, in log-spaced buckets whose edges are τ candidates (50 ms … 10 s)
//         plus Tbe and run_gap; each bucket keeps its weight and mean gap; all weights ×
//         gap_decay (0.98) per idle period. Buckets below run_gap are the gaps *within* runs,
//         the others the gaps *between* runs (DESIGN §3.3's gap histogram). Both are needed: a
//         timeout shorter than the think time inside a run would drop the card mid-run.
//
// Transfers still to come after j transfers of the current run (conditioned on what is known,
// that the run has at least j transfers; DESIGN §3.3's formula conditions on n > j, which
// ignores that the run may end now and overestimates R after short runs):
//   R(j) = Σ_{n≥j} (ℓ_n − j)·h[n] / Σ_{n≥j} h[n]     (ℓ_n = n for n < N; 0 with no history)
//
// Price of one transfer of the recent mean size (EWMA of I/O sizes, weight 1/4), from
// Device::Estimate(io, CAM) and Device::Estimate(io, PSM) as if the transfer started now:
//   S = (Δt, ΔE),  Δt = t_psm − t_cam,
//                  ΔE = (e_psm − e_cam) + Prest·Δt − ΔP·ḡ_in
// where ḡ_in is the mean idle gap within runs: in CAM the card also draws ΔP more through the
// user's think time between the transfers of a run (a refinement of DESIGN §3.3; without it a
// run with long think times looks like an energy win in CAM when it is not).
//
// Switch costs, whole machine:
//   Up    = (Tup, Eup + Prest·Tup)       the switch delays the run by Tup
//   Down⁺ = max(0, Edown − Ppsm·Tdown)    the return is off the critical path: only its energy
//                                         above staying in PSM counts
//
// What an idle timeout τ implies, from the gap histogram (ḡ_b: a bucket's mean gap):
//   q(τ)  share of the gaps between runs that reach τ (after which the card is back in PSM)
//   ḡ(τ)  mean of the gaps between runs shorter than τ (the card waits through them in CAM)
//   G(τ)  cost of the gap after a run that ends in CAM: (0, ΔP·ḡ_b) for gaps below τ;
//         (d_b, ΔP·τ + Down⁺ + Prest·d_b) for gaps at or above τ, where d_b = max(0, τ + Tdown
//         − ḡ_b) is the next transfer's wait for the return transition
//   D(τ)  (E[n] − 1) × the cost of a think time inside a run reaching τ: the card sleeps from τ
//         instead of idling (energy ΔP·(τ − ḡ_b) + Down⁺, wait d_b), then one transfer is
//         served in PSM (S) and the card switches again (Up)
//
// PSM→CAM rule. At each transfer begin while the card is in PSM and not heading to CAM, with j
// the transfers of the current run so far (this one included) and
//   f_K(j) = R(j)·W_K(S) + (1/q − 1)·V_K − W_K(Up) − W_K(0, Down⁺ + ΔP·τ_K)
//   V_K    = E[n]·W_K(S) − W_K(0, ΔP·ḡ(τ_K)) − W_K(D(τ_K))
// (q = q(τ_K), floored at 10⁻³; the last term is 0 for τ_K = never), switch (RequestMode(CAM);
// applied when a running I/O ends) iff R(j) > 0 and
//   (a) f_K(j) > 0, or
//   (b) switching saves time — f_100(j) computed with τ_K's terms is positive — and
//       f_K'(j) > 0 for some K' < K.
// A switch buys this run's R(j) remaining transfers in CAM; it pays Up now and, at the end of
// the episode, a return after τ_K idle. With q = 1 (every gap between runs reaches τ) f is
// DESIGN §3.3's rule R(j)·S > C, C = Up + Down⁺ + ΔP·(idle tail τ). The episode term is a
// refinement: when τ_K outlasts the gaps between runs the card stays up for 1/q runs, each
// worth V_K; charging every run a switch it does not make would keep a knob that should hold
// the card in CAM from ever switching.
// (b) is the monotonicity guard. f_K is linear in K but for τ_K, so the knobs where it is
// positive lie at one end of 0..100 — at the low end when switching pays more in energy than
// in time. Without (b) such a history would make a higher knob switch later and, where the
// switch saves time, be *slower* (DESIGN §3.3's warning). With (b), wherever switching saves
// time the set of knobs that switch after j transfers is upward closed, so a higher knob never
// switches later. Where switching costs time, (b) does not apply: there only the energy term
// can make f positive, which favours the lower knobs, and not switching is the faster choice.
// A run's first transfer with no history never switches (R = 0).
//
// CAM→PSM rule. When the card is idle in CAM (nothing in flight or queued; from the later of
// the last activity's end and its arrival in CAM) one timer is armed for τ_K; any transfer
// cancels it; when it fires the card is asked for PSM. No timer exists in PSM: nothing polls.
// τ_K and j*_K (the first j at which the rule above switches) are chosen together: over the
// candidates τ ∈ bucket edges ∪ {never} with τ >= τ_{K−1}, each with the j*(τ) the rule
// would then use, τ_K minimises the expected weighted cost per run
//   J_K(τ) = (1 − π)·(m·W_K(S) + s·(W_K(Up) + C)) + π·C,    C = W_K(G(τ)) + W_K(D(τ))
//   s = P(n > j*) and m = E[min(n, j*)] (0 and E[n] if it never switches),
//   π = s·(1 − q) / (q + s·(1 − q)), the share of runs that start in CAM (stationary state of
//       the chain: a run from PSM ends in CAM w.p. s; after a run in CAM the gap reaches τ
//       w.p. q),
// all against one baseline (every transfer in CAM, no switches, free gaps), so "stay in PSM",
// "switch and come back soon" and "switch and stay up across runs" compete on equal terms.
// Ties go to the shorter τ; τ >= τ_{K−1} makes a higher knob never leave CAM sooner. K runs
// 0..100 in order (rule (b) needs the lower knobs' plans). With no completed run yet: no
// switching and τ_K = run_gap (= Tbe by default) for every K. The plans are recomputed
// whenever a histogram gains a sample, with S priced then (≈ 0.1 ms per transfer with the
// defaults); the decision at a transfer prices S afresh.
//
// Extremes. K = 0 (energy only): switch when the energy of the transfers (and runs) to come
// in CAM outweighs the energy of the switch; come back after the τ that minimises expected
// energy, typically just past the think times within runs. K = 100 (time only): waiting in
// CAM is free, so (for any history with R > 0) τ is the shortest edge past every gap seen
// (never, once a gap beyond 10 s has been seen), q = 0, and the card switches at the first
// transfer with R(j) > 0 and then stays up through any gap no longer than those seen, for
// good with never (like the disk module, which never spins down at K = 100): every later
// transfer is faster, for one Tup. A history of single transfers (R = 0) never switches at
// any K.
//
//   PSM ──rule (a)/(b) at transfer j──▶ UP ──CAM entered──▶ CAM ──idle for τ_K──▶ DOWN ──▶ PSM
//                                                    (CAM-BUSY ⇄ CAM-IDLE; a transfer cancels τ)
//
//   state (policy's view)  event                                  next
//   ---------------------  -------------------------------------  ----------------------------
//   PSM                    transfer j, rule (a) or (b) holds      UP (RequestMode(CAM))
//   PSM                    transfer j, rule does not hold         PSM
//   UP                     transfer                               UP (the device finishes the
//                                                                 running I/O, then switches)
//   UP                     CAM entered, nothing in flight/queued  CAM-IDLE (arm τ_K)
//   UP                     CAM entered, I/O queued                CAM-BUSY
//   CAM-BUSY               activity ends, nothing left            CAM-IDLE (arm τ_K)
//   CAM-IDLE               transfer                               CAM-BUSY (cancel the timer)
//   CAM-IDLE               timer fires                            DOWN (RequestMode(PSM))
//   CAM-IDLE               knob change                            CAM-IDLE (re-arm τ_K from
//                                                                 the same idle start)
//   DOWN                   transfer                               as PSM (the device queues it
//                                                                 until it reaches PSM)
//   DOWN                   PSM entered                            PSM (no timer)
//
// Thread-safety: not thread-safe; all hooks run on the clock's thread.
#ifndef GHOST_COMMON_POWER_STPM_NETWORK_H_
#define GHOST_COMMON_POWER_STPM_NETWORK_H_

#include <array>
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/base/clock.h"
#include "common/power/power_manager.h"
#include "common/base/units.h"

namespace ghost {

// Tuning of the network module. The defaults are the rule documented above.
struct StpmNetworkOptions {
  // Idle time that separates two runs; zero means the card's break-even time Tbe.
  Duration run_gap{0};
  // Runs of this many transfers or more share the last run-length bucket (N).
  int max_run_length = 64;
  // Weight kept by the old samples of each histogram when a new one arrives.
  double run_decay = 0.95;
  double gap_decay = 0.98;
  // Idle-timeout candidates: `timeout_steps` log-spaced values from min to max (plus Tbe and
  // run_gap), which are also the gap histogram's bucket edges.
  Duration min_timeout = Millis(50);
  Duration max_timeout = Seconds(10);
  int timeout_steps = 16;
  // EWMA weight of a new I/O size in the mean transfer size; the mean before any I/O.
  double size_weight = 0.25;
  Bytes initial_transfer_size = 32 * 1024;
};

// What the module has seen and done, for tests and `ghostctl stats`.
struct StpmNetworkStats {
  std::int64_t runs = 0;       // runs started
  std::int64_t transfers = 0;  // transfers counted (ghost hints included)
  std::int64_t ghost_hints = 0;
  std::int64_t switches_to_cam = 0;
  std::int64_t switches_to_psm = 0;
};

// A time and an energy that together make one weighted cost, W_K(time, energy).
struct Price {
  Duration time{0};
  Energy energy;
  // K·seconds + (100 − K)·joules (the ghost-hints paper's eq. 4). Precondition: 0 <= K <= 100.
  double Weighted(int knob) const;
};

class StpmNetworkPolicy : public DevicePolicy {
 public:
  explicit StpmNetworkPolicy(const StpmNetworkOptions& options = {});
  ~StpmNetworkPolicy() override;
  StpmNetworkPolicy(const StpmNetworkPolicy&) = delete;
  StpmNetworkPolicy& operator=(const StpmNetworkPolicy&) = delete;

  // Precondition: `device` is a network device with at least two modes (CAM = 0, PSM = the
  // lowest); aborts with a message otherwise.
  void Attach(PowerManager& pm, DeviceId id, Device& device) override;
  void OnIoBegin(const IoRequest& io) override;
  void OnIoEnd(const IoRequest& io) override;
  void OnModeEntered(int mode) override;
  void OnGhostHint(const GhostHint& hint) override;
  void OnTransferBegin() override;
  void OnTransferEnd() override;
  void OnKnobChanged(int knob) override;
  // A shaped download's nap (DESIGN §3.6 rule 5): the CAM→PSM idle timer is held while it
  // lasts and the idle clock restarts at its end. A nap is neither a transfer nor a mode
  // switch nor an idle gap: the histograms do not see it.
  void OnNap(bool napping) override;
  std::string name() const override { return "stpm-net"; }
  // E.g. "stpm-net K=50: CAM after 3 transfers, PSM after 0.8 s idle" (thresholds as of the
  // last histogram sample).
  std::string Describe() const override;

  const StpmNetworkStats& stats() const { return stats_; }
  std::int64_t runs() const { return stats_.runs; }
  std::int64_t switches_to_cam() const { return stats_.switches_to_cam; }
  std::int64_t switches_to_psm() const { return stats_.switches_to_psm; }

  // At the current knob: the j at which a run first switches to CAM (nullopt: never), and the
  // idle time after which the card returns to PSM (nullopt: never). Precondition: attached.
  std::optional<int> CamAfterTransfers() const;
  std::optional<Duration> IdleTimeout() const;
  // R(j) from the run histogram (0 with no history). Precondition: j >= 1.
  double ExpectedRemainingTransfers(int j) const;
  // The run gap in use and the card's break-even time. Precondition: attached.
  Duration run_gap() const { return run_gap_; }
  Duration break_even() const { return break_even_; }

  // Aborts with a message if the policy's state is inconsistent.
  void AssertInvariants() const;

 private:
  using FloatSeconds = std::chrono::duration<double>;
  static constexpr int kKnobs = 101;
  // Floor of q(τ) in an episode's length (1/q runs): a timeout that no gap has reached yet
  // counts as 1000 runs in CAM, not infinitely many.
  static constexpr double kMinReturnShare = 1e-3;

  // What one candidate idle timeout τ implies, from the gap histogram (knob-independent).
  struct TimeoutTerms {
    std::optional<Duration> timeout;  // τ; nullopt = never
    double returns = 1;               // q(τ): fraction of gaps between runs that reach τ
    Duration gap_in_cam{0};           // ḡ(τ): mean gap between runs shorter than τ
    Price after_run;                  // G(τ): the gap after a run that ends in CAM
    Price within_run;                 // D(τ): drops inside one run served in CAM
  };
  // The thresholds at one knob, from the last recompute.
  struct Plan {
    std::optional<int> cam_after;  // j*_K
    TimeoutTerms terms;            // of τ_K
  };
  struct GapBucket {
    double weight = 0;
    FloatSeconds weighted_sum{0};  // Σ weight·gap, for the bucket's mean gap
    bool within_run = false;       // the bucket lies below run_gap
    FloatSeconds Mean() const { return weight > 0 ? weighted_sum / weight : FloatSeconds(0); }
  };
  // Everything the cost rules need, priced at one moment.
  struct Pricing {
    Price saving;       // S
    Price up;           // Up
    Energy down_extra;  // Down⁺
    Power delta_power;  // ΔP
    Power rest;         // Prest
    Duration t_down{0};
  };

  // A transfer begins now (any kind). Returns after a possible switch decision.
  void BeginTransfer();
  // Activity ended now; arms the idle timer if the card is now idle in CAM.
  void EndActivity();
  bool Quiet() const { return in_flight_io_ == 0 && open_disclosed_ == 0; }
  void MaybeArmIdleTimer(TimePoint idle_from);
  void CancelIdleTimer();
  void OnIdleTimeout();

  void AddRunSample(int length);
  void AddGapSample(Duration gap);
  bool HaveRunHistory() const { return run_total_weight_ > 0; }
  double Remaining(int j) const;  // R(j) from the cached table
  Pricing PriceNow() const;
  // Every candidate τ (the bucket edges, then never), priced with `p`.
  std::vector<TimeoutTerms> TimeoutCandidates(const Pricing& p) const;
  // f_K(j) for timeout terms `t`.
  double SwitchValue(const Pricing& p, int knob, int j, const TimeoutTerms& t) const;
  // Rules (a) and (b) with the plans' timeouts.
  bool ShouldSwitch(const Pricing& p, int knob, int j) const;
  // J_K(τ, j*): expected weighted cost per run of the pair.
  double PerRunCost(const Pricing& p, int knob, const TimeoutTerms& t,
                    std::optional<int> cam_after) const;
  void Recompute();
  int knob() const;

  StpmNetworkOptions options_;
  Clock* clock_ = nullptr;
  int cam_ = 0;
  int psm_ = 1;
  Duration run_gap_{0};
  Duration break_even_{0};

  // Run-length histogram: index n = 1..N (0 unused); [N] holds runs of N or more.
  std::vector<double> run_weight_;
  double run_total_weight_ = 0;
  double long_run_weighted_length_ = 0;  // Σ weight·length over bucket N (a count of transfers)
  std::vector<double> remaining_;        // R(j), j = 0..N, cached at each run sample
  std::vector<double> switch_share_;     // P(n > j), j = 0..N, cached likewise
  std::vector<double> served_before_;    // E[min(n, j)], j = 0..N, cached likewise
  double mean_run_ = 0;                  // E[n]

  std::vector<Duration> edges_;  // ascending; bucket i = [edges_[i−1], edges_[i])
  std::vector<GapBucket> gaps_;  // edges_.size() + 1 buckets

  std::array<Plan, kKnobs> plans_;

  double mean_transfer_bytes_ = 0;  // EWMA of I/O sizes
  int in_flight_io_ = 0;
  int open_disclosed_ = 0;
  std::optional<TimePoint> last_end_;  // end of the last activity
  int run_length_ = 0;                 // transfers of the current run so far

  TimerId timer_ = kNoTimer;
  bool idle_in_cam_ = false;  // the idle clock is running (timer armed unless never)
  TimePoint idle_from_{};
  TimePoint cam_entered_{};  // when the card last entered CAM

  StpmNetworkStats stats_;
};

}  // namespace ghost

#endif  // GHOST_COMMON_POWER_STPM_NETWORK_H_
