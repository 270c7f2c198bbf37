#include "common/power/shaper.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

namespace ghost {
namespace {

constexpr Bytes kMss = 1448;
constexpr Bytes kWindow = 120 * 1024;
constexpr double kRate20Mbps = 20e6 / 8;  // bytes/s

// A scripted TCP sender behind a bottleneck, in virtual time, driving one DownloadShaper the
// way the proxy does: while the shaper reads freely the window never limits the sender (its
// cwnd doubles each round trip up to the window); while it shapes, the sender is blocked by
// the zero window until the shaper opens it and the next window arrives one RTT later.
struct LinkSpec {
  double rate = kRate20Mbps;
  std::function<Duration(TimePoint)> rtt = [](TimePoint) { return Millis(60); };
  double loss = 0;             // per packet; the retransmission arrives one RTT later
  double jitter_mean_ms = 0;   // gamma(shape 2) extra delay per packet, never reordering
  std::vector<int> lost_opens; // opens (1-based) whose window update is lost
  Bytes size = 5'000'000;
  std::uint64_t seed = 7;
};

struct RunResult {
  ShaperStats stats;
  ShaperState final_state{};
  std::vector<ShaperState> states;  // every state seen, in order (no repeats)
  Duration time{};
  int opens = 0;
};

class SimLink {
 public:
  SimLink(const LinkSpec& spec, const ShaperOptions& options)
      : spec_(spec), shaper_(options, TimePoint{}), rng_(spec.seed) {
    shaper_.SetMinRtt(spec.rtt(TimePoint{}));
  }

  DownloadShaper& shaper() { return shaper_; }

  RunResult Run() {
    RunResult r;
    r.states.push_back(shaper_.state());
    ScheduleFlight(TimePoint{} + spec_.rtt(TimePoint{}), 10);
    while (delivered_ < spec_.size) {
      if (guard_++ > 10'000'000) {
        ADD_FAILURE() << "simulation did not finish";
        break;
      }
      const std::optional<TimePoint> deadline = shaper_.NextDeadline();
      const std::optional<TimePoint> arrival =
          pending_.empty() ? std::nullopt : std::optional<TimePoint>(pending_.front().at);
      if (!arrival && !deadline) {
        if (waiting_open_ || shaper_.wants_open()) {
          Open(now_, r);
          continue;
        }
        ADD_FAILURE() << "stuck: no arrival and no deadline";
        break;
      }
      if (deadline && (!arrival || *deadline <= *arrival)) {
        now_ = std::max(now_, *deadline);
        shaper_.OnTimer(now_);
      } else {
        const Packet p = pending_.front();
        pending_.erase(pending_.begin());
        now_ = std::max(now_, p.at);
        shaper_.OnArrival(now_, p.bytes, p.missing);
        delivered_ += p.bytes;
        if (pending_.empty() || pending_.front().retransmission) FlightDone();
      }
      if (shaper_.wants_open()) Open(now_, r);
      if (r.states.back() != shaper_.state()) r.states.push_back(shaper_.state());
    }
    shaper_.Finish(now_);
    r.stats = shaper_.stats();
    r.final_state = shaper_.state();
    r.time = now_ - TimePoint{};
    return r;
  }

 private:
  struct Packet {
    TimePoint at;
    Bytes bytes;
    bool missing;
    bool retransmission;
  };

  void Open(TimePoint now, RunResult& r) {
    shaper_.OnOpened(now);
    ++r.opens;
    if (!waiting_open_) return;
    waiting_open_ = false;
    TimePoint first = now + spec_.rtt(now);
    if (std::find(spec_.lost_opens.begin(), spec_.lost_opens.end(), r.opens) !=
        spec_.lost_opens.end()) {
      first = now + Millis(400);  // the sender's zero-window probe finds the open window
    }
    ScheduleFlight(first, static_cast<double>(kWindow) / kMss);
  }

  // The sender's last packet of a flight has arrived: what comes next.
  void FlightDone() {
    if (delivered_ >= spec_.size) return;
    if (shaper_.reads_freely()) {
      cwnd_ = std::min(cwnd_ * 2, static_cast<double>(kWindow) / kMss);
      const TimePoint ack_clock = flight_first_ + spec_.rtt(flight_first_);
      ScheduleFlight(std::max(ack_clock, now_ + Serialise(kMss)), cwnd_);
    } else {
      waiting_open_ = true;
      if (shaper_.wants_open()) return;
    }
  }

  Duration Serialise(Bytes b) const { return Seconds(static_cast<double>(b) / spec_.rate); }

  void ScheduleFlight(TimePoint first, double packets) {
    flight_first_ = first;
    shaper_.SetMinRtt(spec_.rtt(now_));  // as the kernel's windowed minimum follows the path
    std::gamma_distribution<double> jitter(2.0, spec_.jitter_mean_ms / 2.0);
    std::bernoulli_distribution lost(spec_.loss);
    TimePoint last = TimePoint{};
    bool hole = false;
    std::vector<Packet> retrans;
    Bytes left = spec_.size - std::min(spec_.size, delivered_ + Queued());
    for (int i = 0; i < static_cast<int>(packets) && left > 0; ++i) {
      const Bytes b = std::min(kMss, left);
      left -= b;
      TimePoint at = first + Serialise(kMss) * i;
      if (spec_.jitter_mean_ms > 0) at += Millis(jitter(rng_));
      at = std::max(at, last + Duration(1));  // no reordering
      last = at;
      if (spec_.loss > 0 && lost(rng_)) {
        hole = true;
        retrans.push_back(Packet{at + spec_.rtt(at), b, false, true});
        continue;
      }
      pending_.push_back(Packet{at, b, hole, false});
    }
    for (const Packet& p : retrans) {
      TimePoint at = std::max(p.at, (pending_.empty() ? p.at : pending_.back().at) + Duration(1));
      pending_.push_back(Packet{at, p.bytes, false, true});
    }
  }

  Bytes Queued() const {
    Bytes q = 0;
    for (const Packet& p : pending_) q += p.bytes;
    return q;
  }

  LinkSpec spec_;
  DownloadShaper shaper_;
  std::mt19937_64 rng_;
  std::vector<Packet> pending_;
  TimePoint now_{};
  TimePoint flight_first_{};
  double cwnd_ = 10;
  Bytes delivered_ = 0;
  bool waiting_open_ = false;
  std::uint64_t guard_ = 0;
};

ShaperOptions Options(ShapeMode mode = ShapeMode::kAlways, int knob = 0) {
  ShaperOptions o;
  o.mode = mode;
  o.knob = knob;
  o.mss = kMss;
  o.window = kWindow;
  o.base = Power::Watts(0);
  return o;
}

bool Saw(const RunResult& r, ShaperState s) {
  return std::find(r.states.begin(), r.states.end(), s) != r.states.end();
}

class DownloadShaperTest : public ::testing::Test {};

TEST_F(DownloadShaperTest, InterarrivalAverageFollowsTheArrivals) {
  DownloadShaper s(Options(), TimePoint{});
  s.SetMinRtt(Millis(200));
  TimePoint t{};
  for (int i = 0; i < 200; ++i) {
    t += Millis(1);
    s.OnArrival(t, kMss);
  }
  // Steady 1 ms gaps: IA → 1 ms, ID → 0, so with P = 200 past W the threshold is the floor
  // (td_min: W is the first guess, not a measured window).
  EXPECT_EQ(s.BurstEndThreshold(), Millis(3));
  // Early in a burst (P small against W) the (W − P)·IA term dominates, capped at RTT / 2.
  DownloadShaper fresh(Options(), TimePoint{});
  fresh.SetMinRtt(Millis(200));
  t = TimePoint{};
  for (int i = 0; i < 20; ++i) {
    t += Millis(1);
    fresh.OnArrival(t, kMss);
  }
  const double w = fresh.window_packets();
  const double expected_ms = (w - 20) * 1.0;  // ID ≈ 0 after 19 equal gaps... plus 4·ID
  EXPECT_GE(ToMillis(fresh.BurstEndThreshold()), expected_ms);
  EXPECT_LE(ToMillis(fresh.BurstEndThreshold()), 100.0);
}

TEST_F(DownloadShaperTest, CompleteWindowEndsBelowTheJitterFloor) {
  // Round 8: once a burst holds the whole window (P ≥ W − 1, W from a clean burst), the sender
  // can send nothing more before the next open, so the 3 ms floor meant for gaps inside a
  // window is not waited.
  ShaperOptions o = Options();
  o.mode = ShapeMode::kAlways;
  o.window = 16 * kMss;
  o.td_full = Millis(1);
  o.td_grant = o.td_min;  // td_full alone (td_grant: WholeGrantEndsAfterTdGrantNotTheJitterFloor)
  DownloadShaper s(o, TimePoint{});
  s.SetMinRtt(Millis(60));
  TimePoint t{};
  auto burst = [&](int packets) {
    for (int i = 0; i < packets; ++i) {
      t += Millis(0.58);  // 20 Mb/s
      s.OnArrival(t, kMss);
    }
  };
  auto settle = [&]() {  // run the deadlines until the shaper asks for an open, then open
    for (int i = 0; i < 10 && !s.wants_open(); ++i) {
      const std::optional<TimePoint> d = s.NextDeadline();
      if (!d) break;  // nothing pending: the adapter opens the window itself (a forced open)
      t = std::max(t, *d);
      s.OnTimer(t);
    }
    s.OnOpened(t);
    t += Millis(60);
  };
  burst(16);  // slow start's flight, cut at the window: saving begins
  ASSERT_EQ(s.state(), ShaperState::kSaving);
  settle();
  // W is the flight's guess: a burst of a whole window still waits the jitter floor.
  burst(16);
  EXPECT_GE(s.BurstEndThreshold(), o.td_min);
  settle();
  // Now W is measured (a clean burst of 16): three packets still owed wait the floor...
  burst(13);
  EXPECT_GE(s.BurstEndThreshold(), o.td_min);
  burst(3);
  // ...a complete window waits (W − P)·IA + 4·ID ≈ 0.6 ms, floored at td_full, not td_min.
  EXPECT_LT(s.BurstEndThreshold(), o.td_min);
  EXPECT_GE(s.BurstEndThreshold(), o.td_full);
  const std::optional<TimePoint> end = s.NextDeadline();
  ASSERT_TRUE(end);
  EXPECT_LT(*end - t, o.td_min);
  EXPECT_EQ(s.stats().missed_packets, 0u);
}

TEST_F(DownloadShaperTest, ThresholdIsClampedToOneWayDelay) {
  DownloadShaper s(Options(), TimePoint{});
  s.SetMinRtt(Millis(20));
  TimePoint t{};
  for (int i = 0; i < 5; ++i) {
    t += Millis(5);
    s.OnArrival(t, kMss);
  }
  // (W − 5)·5 ms is far above the one-way delay of 10 ms.
  EXPECT_EQ(s.BurstEndThreshold(), Millis(10));
}

TEST_F(DownloadShaperTest, NoTimerBeforeTheFirstByteNorAfterFinish) {
  DownloadShaper s(Options(), TimePoint{});
  EXPECT_FALSE(s.NextDeadline());
  s.OnArrival(TimePoint{} + Millis(1), kMss);
  EXPECT_TRUE(s.NextDeadline());
  s.Finish(TimePoint{} + Millis(2));
  EXPECT_FALSE(s.NextDeadline());
  EXPECT_TRUE(s.card_awake());
}

TEST_F(DownloadShaperTest, CleanLinkSettlesInSavingAndSleepsBetweenBursts) {
  SimLink link(LinkSpec{}, Options());
  std::vector<std::pair<TimePoint, bool>> card;
  link.shaper().SetCardListener([&](TimePoint t, bool awake) { card.emplace_back(t, awake); });
  const RunResult r = link.Run();
  EXPECT_EQ(r.final_state, ShaperState::kSaving);
  EXPECT_TRUE(Saw(r, ShaperState::kSlowStart));
  EXPECT_EQ(r.stats.missed_packets, 0u);
  EXPECT_EQ(r.stats.bad_bursts, 0u);
  // 5 MB in windows of 120 KiB: about 40 bursts, each about one window.
  EXPECT_GE(r.stats.bursts, 35u);
  EXPECT_LE(r.stats.bursts, 45u);
  const double mean = static_cast<double>(r.stats.burst_bytes) / r.stats.bursts;
  EXPECT_GT(mean, 0.8 * kWindow);
  // Each cycle is ~60 ms asleep of ~110 ms: the card sleeps well over a third of the time.
  EXPECT_GT(ToSeconds(r.stats.sleep), 0.4 * ToSeconds(r.time));
  // The listener saw alternating sleeps and wake-ups, each sleep before the next burst.
  ASSERT_GE(card.size(), 2u);
  for (size_t i = 0; i < card.size(); ++i) EXPECT_EQ(card[i].second, i % 2 == 1);
}

std::string States(const RunResult& r) {
  std::string out;
  for (ShaperState s : r.states) out += std::string(ShaperStateName(s)) + " ";
  return out;
}

TEST_F(DownloadShaperTest, LossSendsTheShaperToRecoveryAndBack) {
  LinkSpec spec;
  spec.loss = 0.01;
  SimLink link(spec, Options());  // the paper's rule (round 12's opt-in clock: the next test)
  const RunResult r = link.Run();
  EXPECT_TRUE(Saw(r, ShaperState::kRecovery));
  EXPECT_NE(r.final_state, ShaperState::kPlain);
  // Recovery stays awake for the retransmissions: they are not missed.
  EXPECT_EQ(r.stats.missed_packets, 0u);
  // Most 84-packet bursts lose one at 1%; the card stays awake after those, so it sleeps less
  // than on a clean link but still a good share of the time.
  EXPECT_GT(ToSeconds(r.stats.sleep), 0.1 * ToSeconds(r.time));
  // After recovery, a clean burst brings the shaper back to saving.
  const auto rec = std::find(r.states.begin(), r.states.end(), ShaperState::kRecovery);
  EXPECT_NE(std::find(rec, r.states.end(), ShaperState::kSaving), r.states.end());
}

TEST_F(DownloadShaperTest, GammaJitterMissesUnderOnePacketPerDownload) {
  std::uint64_t missed = 0;
  for (std::uint64_t seed = 1; seed <= 10; ++seed) {
    LinkSpec spec;
    spec.jitter_mean_ms = 2;
    spec.seed = seed;
    SimLink link(spec, Options());
    const RunResult r = link.Run();
    missed += r.stats.missed_packets;
    EXPECT_NE(r.final_state, ShaperState::kPlain) << "seed " << seed;
    EXPECT_GT(r.stats.bursts, 20u) << "seed " << seed;
  }
  EXPECT_LT(missed, 10u);
}

TEST_F(DownloadShaperTest, LostOpenIsDetectedAndTheCardWaitsAwake) {
  LinkSpec spec;
  spec.lost_opens = {6};
  SimLink link(spec, Options());
  const RunResult r = link.Run();
  EXPECT_EQ(r.stats.lost_opens, 1u);
  EXPECT_EQ(r.stats.bad_bursts, 1u);
  EXPECT_EQ(r.stats.missed_packets, 0u);
  EXPECT_TRUE(Saw(r, ShaperState::kRecovery));
  EXPECT_EQ(r.final_state, ShaperState::kSaving);
}

TEST_F(DownloadShaperTest, SaturatedLinkRevertsToPlainTcp) {
  // BDP at 20 Mb/s and 40 ms is 100 kB: the 120 KiB window is more than 90% of it.
  LinkSpec spec;
  spec.rtt = [](TimePoint) { return Millis(40); };
  SimLink link(spec, Options());
  const RunResult r = link.Run();
  EXPECT_EQ(r.final_state, ShaperState::kPlain);
  EXPECT_TRUE(r.stats.saturated);
  EXPECT_TRUE(link.shaper().reads_freely());
}

TEST_F(DownloadShaperTest, PlainReturnsToShapingWhenNoLongerSaturated) {
  LinkSpec spec;
  spec.size = 12'000'000;
  // Saturated for the first second, then the path lengthens to 120 ms.
  spec.rtt = [](TimePoint t) { return ToSeconds(t) < 1.0 ? Millis(40) : Millis(120); };
  SimLink link(spec, Options());
  const RunResult r = link.Run();
  const auto plain = std::find(r.states.begin(), r.states.end(), ShaperState::kPlain);
  ASSERT_NE(plain, r.states.end()) << States(r);
  EXPECT_NE(std::find(plain, r.states.end(), ShaperState::kSaving), r.states.end()) << States(r);
  EXPECT_EQ(r.final_state, ShaperState::kSaving) << States(r);
}

TEST_F(DownloadShaperTest, KnobAtHundredNeverShapes) {
  SimLink link(LinkSpec{}, Options(ShapeMode::kAuto, 100));
  const RunResult r = link.Run();
  EXPECT_TRUE(r.stats.declined);
  EXPECT_FALSE(Saw(r, ShaperState::kSaving));
  EXPECT_EQ(r.stats.sleep, Duration::zero());
  EXPECT_EQ(r.stats.bursts, 0u);
}

TEST_F(DownloadShaperTest, AutoShapesAtAnEnergyKnobAgainstWindowLimitedPlainTcp) {
  ShaperOptions o = Options(ShapeMode::kAuto, 0);
  o.plain_window = kWindow;  // plain TCP would idle between windows: shaping pays
  LinkSpec spec;
  spec.rtt = [](TimePoint) { return Millis(120); };
  SimLink link(spec, o);
  const RunResult r = link.Run();
  EXPECT_FALSE(r.stats.declined);
  EXPECT_EQ(r.final_state, ShaperState::kSaving);
}

TEST_F(DownloadShaperTest, AutoDeclinesAgainstPlainTcpAtTheLinkRate) {
  // Unshaped, an autotuned window fills the link and the card never idles: there is nothing
  // to sleep through, and shaping only adds round trips.
  SimLink link(LinkSpec{}, Options(ShapeMode::kAuto, 0));
  const RunResult r = link.Run();
  EXPECT_TRUE(r.stats.declined);
  EXPECT_EQ(r.final_state, ShaperState::kPlain);
  EXPECT_FALSE(link.shaper().NextDeadline());
}

TEST_F(DownloadShaperTest, EqFourCostDecides) {
  const WnicPowers wnic;
  // 120 KiB windows at 120 ms and 20 Mb/s: plain TCP with the same window idles ~60% of
  // each round trip with the card awake.
  const ShapingLink link{kRate20Mbps, Millis(120), kWindow, Millis(3), kWindow};
  const ShapingEstimate e = EstimateShaping(wnic, Power::Watts(0), 5'000'000, link);
  EXPECT_GT(e.slowdown, 1.0);
  EXPECT_LT(e.shaped_energy, e.plain_energy);
  EXPECT_TRUE(ShapingPays(e, 0, DefaultMaxSlowdown(0)));
  EXPECT_FALSE(ShapingPays(e, 100, 100.0));
  // The slowdown cap vetoes shaping even where energy wins.
  EXPECT_FALSE(ShapingPays(e, 0, 1.05));
  // With a heavy base power the time the shaping costs outweighs the card's saving.
  const ShapingEstimate heavy = EstimateShaping(wnic, Power::Watts(20), 5'000'000, link);
  EXPECT_FALSE(ShapingPays(heavy, 0, 10.0));
  // Against plain TCP at the link rate the card saves nothing.
  const ShapingLink full{kRate20Mbps, Millis(60), kWindow, Millis(3), 0};
  EXPECT_FALSE(ShapingPays(EstimateShaping(wnic, Power::Watts(0), 5'000'000, full), 0, 10.0));
  EXPECT_DOUBLE_EQ(DefaultMaxSlowdown(100), 1.0);
  EXPECT_DOUBLE_EQ(DefaultMaxSlowdown(0), 3.0);
}

// Bursts of 16 packets at 20 Mb/s that come `delay` after each open, with the kernel's min
// RTT at 60 ms; returns the shaper's stats after `cycles` opens and, per cycle, how long
TEST_F(DownloadShaperTest, LossWithTheAckClockStaysOutOfRecovery) {
  // Round 12: with the ACK clock a burst with loss does not send the shaper to recovery; the
  // retransmission on this link comes one RTT after the lost packet, inside the clocked
  // wake-up (one min RTT after the burst's first packet), and is not missed.
  LinkSpec spec;
  spec.loss = 0.01;
  ShaperOptions clock = Options();
  clock.ack_clock_after_loss = true;
  const RunResult old_rule = SimLink(spec, Options()).Run();
  const RunResult clocked = SimLink(spec, clock).Run();
  std::printf("SimLink 1%%: missed %llu → %llu, sleep %.2f → %.2f s, time %.2f → %.2f s, recovery %d → %d\n",
              static_cast<unsigned long long>(old_rule.stats.missed_packets),
              static_cast<unsigned long long>(clocked.stats.missed_packets),
              ToSeconds(old_rule.stats.sleep), ToSeconds(clocked.stats.sleep),
              ToSeconds(old_rule.time), ToSeconds(clocked.time), Saw(old_rule, ShaperState::kRecovery),
              Saw(clocked, ShaperState::kRecovery));
  EXPECT_TRUE(Saw(old_rule, ShaperState::kRecovery));
  EXPECT_FALSE(Saw(clocked, ShaperState::kRecovery));
  EXPECT_EQ(clocked.stats.missed_packets, 0u);
  EXPECT_NE(clocked.final_state, ShaperState::kPlain);
  // This link's 84-packet windows come whole after each open, so the clocked wake-up only
  // wakes the card early: sleep 0.92 → 0.30 s (a cost the emulated link weighs, round 12).
  EXPECT_GT(ToSeconds(clocked.stats.sleep), 0.1);
}

// before the burst's first packet the card was awake again (negative: it woke too late).
struct DelayRun {
  ShaperStats stats;
  std::vector<double> awake_before_ms;
};
DelayRun BurstsComeAfter(Duration delay, double percentile, int cycles, bool ack_clock = false,
                         bool clump_wake = false) {
  ShaperOptions o = Options();
  o.window = 16 * kMss;
  o.wake_for_clocked_clumps = clump_wake;
  o.wake_percentile = percentile;
  o.ack_clock_after_loss = ack_clock;
  DownloadShaper s(o, TimePoint{});
  s.SetMinRtt(Millis(60));
  std::optional<TimePoint> woke;
  s.SetCardListener([&](TimePoint t, bool awake) { woke = awake ? std::optional(t) : std::nullopt; });
  TimePoint t{};
  DelayRun r;
  for (int c = 0; c < cycles; ++c) {
    for (int i = 0; i < 16; ++i) {
      if (i == 0 && c > 0) {
        // Run the card's wake-up if it is due before the burst's first packet.
        const std::optional<TimePoint> d = s.NextDeadline();
        if (d && *d <= t) s.OnTimer(*d);
        r.awake_before_ms.push_back(woke ? ToMillis(t - *woke) : -1.0);
      }
      s.OnArrival(t, kMss);
      t += Millis(0.58);
    }
    for (int i = 0; i < 10 && !s.wants_open(); ++i) {
      const std::optional<TimePoint> d = s.NextDeadline();
      if (!d) break;
      t = std::max(t, *d);
      s.OnTimer(t);
    }
    s.OnOpened(t);
    t += delay;
  }
  s.Finish(t);
  r.stats = s.stats();
  return r;
}

TEST_F(DownloadShaperTest, WakeUpFollowsTheObservedOpenToDataDelay) {
  // Round 9: data comes one observed open→data delay after an open. With the kernel's min RTT
  // above it (here 60 ms against 50 ms observed) the card woke after the burst began, every
  // cycle it slept in (every other one: a miss keeps it awake for the next burst); from the
  // observed delays it is awake before the first packet once 2 are seen.
  const DelayRun rtt = BurstsComeAfter(Millis(50), 0, 30);
  const DelayRun observed = BurstsComeAfter(Millis(50), 0.1, 30);
  EXPECT_GE(rtt.stats.missed_packets, 10u);
  // Round 16: the clump wake (on by default) stays armed while bursts come before their open's
  // round trip has ended, so it wakes one min RTT after each burst's first packet, as the ACK
  // clock below does (until round 16 three confirmed grants disarmed it: 15 missed here).
  const DelayRun clumps = BurstsComeAfter(Millis(50), 0, 30, false, /*clump_wake=*/true);
  EXPECT_LE(clumps.stats.missed_packets, 1u);
  EXPECT_GT(ToSeconds(clumps.stats.sleep), ToSeconds(rtt.stats.sleep) * 0.5);
  // Round 12's ACK clock (opt-in) catches these: after the first miss
  // the card wakes one min RTT after each burst's first packet, before the early burst.
  const DelayRun clocked = BurstsComeAfter(Millis(50), 0, 30, /*ack_clock=*/true);
  EXPECT_LE(clocked.stats.missed_packets, 1u);
  EXPECT_GE(clocked.stats.bursts, 25u);
  EXPECT_GT(ToSeconds(clocked.stats.sleep), ToSeconds(rtt.stats.sleep) * 0.5);
  EXPECT_LE(observed.stats.missed_packets, 1u);  // the first burst, before 2 delays are seen
  EXPECT_GE(observed.stats.bursts, 25u);
  for (size_t i = 8; i < observed.awake_before_ms.size(); ++i) {
    EXPECT_GT(observed.awake_before_ms[i], 0.0) << "cycle " << i;
  }
  // Later than the min RTT (70 ms observed): the card sleeps longer and still wakes in time.
  const DelayRun late_rtt = BurstsComeAfter(Millis(70), 0, 30);
  const DelayRun late = BurstsComeAfter(Millis(70), 0.1, 30);
  EXPECT_EQ(late.stats.missed_packets, 0u);
  EXPECT_EQ(late_rtt.stats.missed_packets, 0u);
  EXPECT_GT(ToMillis(late.stats.sleep), ToMillis(late_rtt.stats.sleep) + 20 * 8.0);
  for (size_t i = 8; i < late.awake_before_ms.size(); ++i) {
    EXPECT_GT(late.awake_before_ms[i], 0.0) << "cycle " << i;
    EXPECT_LT(late.awake_before_ms[i], 6.0) << "cycle " << i;
  }
}

// Slow start's flight cut at a window, then the rest of what the sender had in flight arriving
// in ACK-clocked clumps 15, 30 and 45 ms later (gaps far above Td's floor). Returns when the
// shaper first asked for an open (relative to the cut) and the bytes of its first burst.
std::pair<Duration, Bytes> FirstOpenAfterSlowStart(bool settle, bool hold = false) {
  ShaperOptions o = Options();
  o.window = 16 * kMss;
  o.settle_after_slow_start = settle;
  o.hold_part_windows = hold;
  DownloadShaper s(o, TimePoint{});
  s.SetMinRtt(Millis(60));
  TimePoint t{};
  for (int i = 0; i < 16; ++i) {
    t += Millis(0.58);
    s.OnArrival(t, kMss);
  }
  EXPECT_EQ(s.state(), ShaperState::kSaving);
  const TimePoint cut = t;
  std::vector<TimePoint> arrivals;
  for (int clump = 1; clump <= 3; ++clump) {
    for (int i = 0; i < 3; ++i) arrivals.push_back(cut + Millis(15.0 * clump + 0.58 * i));
  }
  for (TimePoint a : arrivals) {
    for (std::optional<TimePoint> d = s.NextDeadline(); d && *d <= a && !s.wants_open();
         d = s.NextDeadline()) {
      t = *d;
      s.OnTimer(t);
    }
    if (s.wants_open()) return {t - cut, s.stats().burst_bytes};
    t = a;
    s.OnArrival(t, kMss);
  }
  for (int i = 0; i < 10 && !s.wants_open(); ++i) {
    const std::optional<TimePoint> d = s.NextDeadline();
    if (!d) break;
    t = std::max(t, *d);
    s.OnTimer(t);
  }
  EXPECT_TRUE(s.wants_open());
  return {t - cut, s.stats().burst_bytes};
}

TEST_F(DownloadShaperTest, FirstOpenAfterSlowStartWaitsForTheFlightInTransit) {
  // Round 9, the two-half-window regime: an open while part of the flight is still in transit
  // grants the sender only the window less that part, and the two parts circulate from then on.
  const auto [settled_at, settled_bytes] = FirstOpenAfterSlowStart(true);
  EXPECT_GE(settled_at, Millis(60)) << "opened before one min RTT after reading stopped";
  EXPECT_EQ(settled_bytes, 9 * kMss) << "the first burst is not the whole rest of the flight";
  const auto [early_at, early_bytes] = FirstOpenAfterSlowStart(false);
  EXPECT_LT(early_at, Millis(45)) << "without the settle time the first open waits too: the "
                                     "test no longer sets up the early open";
  EXPECT_LT(early_bytes, 9 * kMss);
  // Round 10: the part-window hold alone (no settle time) waits for the flight too: each clump
  // is short of the window, so the burst goes on until the flight has come.
  const auto [held_at, held_bytes] = FirstOpenAfterSlowStart(false, true);
  EXPECT_GE(held_at, Millis(45));
  EXPECT_EQ(held_bytes, 9 * kMss);
}

// Round 10: a scripted download on a 16-packet window at 60 ms (20 Mb/s): the test gives the
// arrivals, the script runs the shaper's deadlines between them and opens the window at once
// whenever the shaper asks (as the adapter's drain does), recording each open and each card
// transition.
class Scripted {
 public:
  explicit Scripted(bool hold, Duration rtt = Millis(60), Bytes size = 0,
                    Duration td_grant = Millis(3), bool ack_clock = false, bool clamp = false,
                    bool clamp_when_pays = false, bool tail_wake = true, bool clump_wake = false,
                    std::optional<Duration> delayed_ack = std::nullopt,
                    const std::function<void(ShaperOptions&)>& tweak = nullptr) {
    ShaperOptions o = Options();
    o.wake_for_clocked_clumps = clump_wake;
    if (delayed_ack) o.delayed_ack = *delayed_ack;
    o.clamp_to_sender = clamp;
    o.clamp_when_pays = clamp_when_pays;
    o.wake_for_slow_start_tail = tail_wake;
    o.window = 16 * kMss;
    o.size = size;
    o.hold_part_windows = hold;
    o.td_grant = td_grant;
    o.ack_clock_after_loss = ack_clock;
    if (tweak) tweak(o);
    shaper_ = std::make_unique<DownloadShaper>(o, TimePoint{});
    shaper_->SetMinRtt(rtt);
    shaper_->SetCardListener([this](TimePoint at, bool awake) {
      if (!awake) sleeps.push_back(at);
    });
  }
  DownloadShaper& s() { return *shaper_; }
  // Runs every deadline up to `until`, opening whenever the shaper asks.
  void RunTo(TimePoint until) {
    for (std::optional<TimePoint> d = s().NextDeadline(); d && *d <= until; d = s().NextDeadline()) {
      now = std::max(now, *d);
      s().OnTimer(now);
      if (flush_acks && s().wants_ack_flush()) {  // the adapter's TCP_QUICKACK (round 20)
        s().OnAckFlushed(now);
        flushes.push_back(now);
      }
      if (s().wants_open()) Open(now);
    }
    now = std::max(now, until);
  }
  void Open(TimePoint at) {
    s().OnOpened(at);
    opens.push_back(at);
  }
  // `n` packets back to back at 20 Mb/s from `at`; `missing`: the first shows a hole (loss).
  void Packets(TimePoint at, int n, bool missing = false) {
    for (int i = 0; i < n; ++i) {
      const TimePoint p = at + Millis(0.58) * i;
      RunTo(p);
      s().OnArrival(p, kMss, missing && i == 0);
      last = p;
      if (s().wants_open()) Open(p);
    }
  }
  // Slow start's flight cut at the window, the adapter's open (nothing pending: the window
  // closed on a full buffer), then `whole` bursts of a whole window one RTT after each open.
  void WholeWindows(int whole, Duration rtt = Millis(60)) {
    Packets(now + Millis(1), 16);
    EXPECT_EQ(s().state(), ShaperState::kSaving);
    RunTo(now + Millis(100));
    if (opens.empty()) Open(now);
    for (int i = 0; i < whole; ++i) {
      const std::size_t before = opens.size();
      Packets(opens.back() + rtt, 16);
      RunTo(last + rtt / 2);
      EXPECT_EQ(opens.size(), before + 1) << "whole window " << i;
    }
  }
  // Slow start's flight of 12 packets (over ¾ of the window: reading stops, kSaving), run up to
  // one RTT after it; returns that time, when the flight's ACKs bring the first clump of its tail.
  TimePoint SlowStartFlight(Duration rtt = Millis(60)) {
    const TimePoint flight = now + Millis(1);
    Packets(flight, 12);
    const TimePoint clump = flight + rtt;
    RunTo(clump - Millis(1));
    EXPECT_EQ(s().state(), ShaperState::kSaving);
    return clump;
  }
  std::size_t OpensAfter(TimePoint t) const {
    return static_cast<std::size_t>(std::count_if(opens.begin(), opens.end(),
                                                  [t](TimePoint o) { return o > t; }));
  }

  TimePoint now{}, last{};
  std::vector<TimePoint> opens, sleeps;
  bool flush_acks = false;  // the harness flushes the ACKs the shaper asks for (round 20)
  std::vector<TimePoint> flushes;

 private:
  std::unique_ptr<DownloadShaper> shaper_;
};

TEST_F(DownloadShaperTest, PartWindowIsHeldUntilTheRestOfTheGrantArrives) {
  // Round 10, the two-half-window regime at its cause: one RTT after an open 6 packets of the
  // window come, the other 10 some 20 ms later (in transit at the open, or sent on a later
  // ACK). Judged ended after the 6, the shaper opened then: the sender could send only the 6
  // back (the 10 were in flight), the card slept through the 10 (missed) and from then on two
  // part-windows circulated. Held, the burst is the whole window and one open follows it.
  auto run = [](bool hold) {
    Scripted sc(hold);
    sc.WholeWindows(3);
    const TimePoint open = sc.opens.back();
    const std::uint64_t bursts = sc.s().stats().bursts;
    sc.Packets(open + Millis(60), 6);
    const TimePoint part_end = sc.last;
    sc.Packets(part_end + Millis(20), 10);
    const TimePoint rest_end = sc.last;
    sc.RunTo(rest_end + Millis(30));
    struct {
      std::size_t opens_in_gap, opens_after;
      std::uint64_t missed, bursts, held;
    } r{sc.OpensAfter(part_end) - sc.OpensAfter(part_end + Millis(20)), sc.OpensAfter(rest_end),
        sc.s().stats().missed_packets, sc.s().stats().bursts - bursts, sc.s().stats().held_bursts};
    return r;
  };
  const auto held = run(true);
  EXPECT_EQ(held.opens_in_gap, 0u) << "opened on the part-window";
  EXPECT_EQ(held.opens_after, 1u) << "one open after the whole window";
  EXPECT_EQ(held.missed, 0u);
  EXPECT_EQ(held.bursts, 1u);
  EXPECT_EQ(held.held, 1u);
  // The scenario is the regime's start: without the hold the shaper opens on the part and
  // misses the rest.
  const auto old = run(false);
  EXPECT_EQ(old.opens_in_gap, 1u);
  EXPECT_GE(old.missed, 1u);
}

TEST_F(DownloadShaperTest, PartWindowHoldIsBoundedAndLearnsASmallerWindow) {
  // The rest never comes (the window was smaller than thought, or the sender had no more):
  // the hold ends half a min RTT after the part's last packet, awake throughout, and opens; the
  // grant is lowered to what came, so the next burst of that size is not held again.
  Scripted sc(true);
  sc.WholeWindows(3);
  sc.Packets(sc.opens.back() + Millis(60), 10);
  const TimePoint part_end = sc.last;
  const std::size_t sleeps = sc.sleeps.size();
  sc.RunTo(part_end + Millis(80));  // the next burst is due 90 ms after the part
  ASSERT_EQ(sc.OpensAfter(part_end), 1u) << "a hold must end in an open (no hang)";
  const TimePoint open = sc.opens.back();
  EXPECT_GE(open - part_end, Millis(30));
  EXPECT_LE(open - part_end, Millis(31));
  // Asleep only after the open (the hold keeps the card awake for the rest).
  ASSERT_EQ(sc.sleeps.size(), sleeps + 1);
  EXPECT_EQ(sc.sleeps.back(), open);
  EXPECT_EQ(sc.s().stats().held_bursts, 0u) << "nothing came during the hold";
  // The next 10-packet burst is a whole window now: it opens after Td, not after a hold.
  sc.Packets(open + Millis(60), 10);
  const TimePoint next_end = sc.last;
  sc.RunTo(next_end + Millis(100));
  ASSERT_EQ(sc.OpensAfter(next_end), 1u);
  EXPECT_LT(sc.opens.back() - next_end, Millis(31)) << "held again";
  EXPECT_EQ(sc.s().stats().missed_packets, 0u);
}

TEST_F(DownloadShaperTest, WholeGrantEndsAfterTdGrantNotTheJitterFloor) {
  // Round 11: once a burst has delivered a whole grant (learned from whole bursts), the sender
  // can send nothing more before the next open: the burst ends td_grant after its last packet,
  // not after the 3 ms floor meant for gaps inside a window still coming (measured at 60 ms:
  // Td 3.2 ms of a ~72 ms cycle, the card awake and the open waiting throughout).
  struct R {
    Duration open_after, sleep_after;
    std::uint64_t missed;
  };
  auto run = [](Duration td_grant) {
    Scripted sc(true, Millis(60), 0, td_grant);
    sc.WholeWindows(3);
    sc.Packets(sc.opens.back() + Millis(60), 16);
    const TimePoint end = sc.last;
    sc.RunTo(end + Millis(20));
    EXPECT_EQ(sc.OpensAfter(end), 1u);
    return R{sc.opens.back() - end, sc.sleeps.back() - end, sc.s().stats().missed_packets};
  };
  const R on = run(Millis(0.5));
  EXPECT_EQ(on.open_after, Millis(0.5));
  EXPECT_EQ(on.sleep_after, Millis(0.5));
  EXPECT_EQ(on.missed, 0u);
  const R off = run(Millis(3));  // td_grant ≥ td_min: the old judgement, the floor
  EXPECT_GE(off.open_after, Millis(3));
  EXPECT_EQ(off.missed, 0u);
}

TEST_F(DownloadShaperTest, BurstShortOfAGrantStillWaitsTheFloor) {
  // Bytes since the open reach a grant before the burst does (a straggler of the last grant's
  // credit came after the open): the burst is not complete until its own bytes are a grant,
  // so its last packet, 0.58 ms after the one that filled the count, is not slept through.
  Scripted sc(true, Millis(60), 0, Millis(0.5));
  sc.WholeWindows(3);
  const TimePoint open = sc.opens.back();
  sc.Packets(open + Millis(5), 1);  // a straggler, long before the open can be answered
  const std::uint64_t missed = sc.s().stats().missed_packets;  // it came mid-nap
  sc.Packets(open + Millis(60), 16);
  const TimePoint end = sc.last;
  sc.RunTo(end + Millis(20));
  EXPECT_EQ(sc.s().stats().missed_packets, missed);
  ASSERT_GE(sc.OpensAfter(end), 1u);
  EXPECT_EQ(sc.OpensAfter(end - Millis(0.5)), sc.OpensAfter(end)) << "opened inside the burst";
}

TEST_F(DownloadShaperTest, TdGrantShortensTheDownloadWithoutMissingPackets) {
  // The whole synthetic download, clean and with gamma jitter (which never reorders, so a
  // grant's bytes all come before the next open is answered): td_grant shortens each cycle
  // and the card's awake time (the nap stays one min RTT less the wake-up), and misses
  // nothing more than the jitter floor did.
  for (double jitter : {0.0, 2.0}) {
    Duration time[2] = {};
    Duration awake[2] = {};
    std::uint64_t missed[2] = {0, 0};
    for (int on = 0; on < 2; ++on) {
      for (std::uint64_t seed = 1; seed <= 5; ++seed) {
        LinkSpec spec;
        spec.jitter_mean_ms = jitter;
        spec.seed = seed;
        ShaperOptions o = Options();
        o.td_grant = on ? Millis(0.5) : o.td_min;
        SimLink link(spec, o);
        const RunResult r = link.Run();
        time[on] += r.time;
        awake[on] += r.stats.awake;
        missed[on] += r.stats.missed_packets;
      }
    }
    EXPECT_LT(time[1], time[0]) << "jitter " << jitter;
    EXPECT_LT(awake[1], awake[0]) << "jitter " << jitter;
    EXPECT_LE(missed[1], missed[0]) << "jitter " << jitter;
  }
}

TEST_F(DownloadShaperTest, LastWindowOfADeclaredSizeIsNotHeld) {
  // 6 whole windows then the download's last 5 packets, with the size declared: the short
  // last window is the end of the download, opened (delivered) after Td, not after a hold.
  Scripted sc(true, Millis(60), 16 * kMss * 6 + 5 * kMss);
  sc.WholeWindows(5);  // slow start's flight and 5 bursts
  sc.Packets(sc.opens.back() + Millis(60), 5);
  const TimePoint end = sc.last;
  sc.RunTo(end + Millis(100));
  ASSERT_GE(sc.OpensAfter(end), 1u);
  EXPECT_LT(*std::find_if(sc.opens.begin(), sc.opens.end(), [end](TimePoint o) { return o > end; }) - end,
            Millis(31));
  EXPECT_EQ(sc.s().stats().held_bursts, 0u);
}

TEST_F(DownloadShaperTest, PartWindowWithLossIsNotHeld) {
  // A burst short of the window with a hole in it is loss: the retransmission comes a round
  // trip later, the shaper goes to recovery (card awake) and opens at once, as before (the
  // paper's rule; with round 12's opt-in ACK clock: the next test).
  Scripted sc(true);
  sc.WholeWindows(3);
  sc.Packets(sc.opens.back() + Millis(60), 6, /*missing=*/true);
  const TimePoint part_end = sc.last;
  sc.RunTo(part_end + Millis(40));
  EXPECT_EQ(sc.OpensAfter(part_end), 1u);
  EXPECT_LT(sc.opens.back() - part_end, Millis(31));
  EXPECT_EQ(sc.s().state(), ShaperState::kRecovery);
  EXPECT_TRUE(sc.s().card_awake());
  EXPECT_EQ(sc.s().stats().held_bursts, 0u);
}

// Round 12, the capture at 60 ms / 1% in miniature: a burst with a hole halves the sender's
// cwnd; from then on each cycle brings a clocked piece one RTT after the last burst's first
// packet (released by the ACKs the kernel sent while that burst came) and the open's piece one
// RTT after the open, a few ms later. Returns the missed packets, the opens and naps after the
// loss, and whether recovery was entered.
struct ClockScript {
  std::uint64_t missed = 0;
  std::size_t opens = 0, naps = 0;
  bool recovery = false;
};
ClockScript LossThenClockedCycles(bool ack_clock, int cycles) {
  Scripted sc(true, Millis(60), 0, Millis(3), ack_clock);
  sc.WholeWindows(3);
  TimePoint first = sc.opens.back() + Millis(60);
  sc.Packets(first, 4);
  sc.Packets(sc.last + Millis(1.16), 8, /*missing=*/true);  // one segment lost before these
  const TimePoint loss_end = sc.last;
  const std::size_t naps = sc.sleeps.size();
  ClockScript r;
  r.recovery = sc.s().state() == ShaperState::kRecovery;
  for (int c = 0; c < cycles; ++c) {
    sc.RunTo(first + Millis(59));
    r.recovery = r.recovery || sc.s().state() == ShaperState::kRecovery;
    const TimePoint open = sc.opens.back();
    sc.Packets(first + Millis(60), 5);  // the clocked piece
    sc.Packets(std::max(open + Millis(60), sc.last + Millis(0.58)), 6);  // the open's piece
    first += Millis(60);
  }
  sc.RunTo(sc.last + Millis(40));
  r.missed = sc.s().stats().missed_packets;
  r.opens = sc.OpensAfter(loss_end);
  r.naps = sc.sleeps.size() - naps;
  return r;
}

TEST_F(DownloadShaperTest, AckClockedPiecesAreAwaitedAndMergedWithTheOpensData) {
  const ClockScript paper = LossThenClockedCycles(false, 6);
  const ClockScript clocked = LossThenClockedCycles(true, 6);
  // The paper's rule: recovery (awake) for the loss, then the clocked pieces come mid-nap.
  EXPECT_TRUE(paper.recovery);
  EXPECT_GE(paper.missed, 3u);
  EXPECT_LT(paper.naps, 6u);
  // The clock: no recovery cycle, the card awake for each clocked piece, one open per cycle
  // (the piece and the open's data are one burst), a nap in every cycle.
  EXPECT_FALSE(clocked.recovery);
  EXPECT_EQ(clocked.missed, 0u);
  EXPECT_EQ(clocked.opens, 7u);
  EXPECT_GE(clocked.naps, 6u);
  std::printf("paper: missed %llu opens %zu naps %zu; clocked: missed %llu opens %zu naps %zu\n",
              static_cast<unsigned long long>(paper.missed), paper.opens, paper.naps,
              static_cast<unsigned long long>(clocked.missed), clocked.opens, clocked.naps);
}

TEST_F(DownloadShaperTest, LostOpenAfterAHeldWindowIsStillDetected) {
  // A held window, its open, then the window update is lost: nothing comes, the shaper sees
  // the lost open (two min RTTs and 200 ms) and waits awake; the sender's probe then brings
  // a whole window, which is not held.
  Scripted sc(true);
  sc.WholeWindows(3);
  sc.Packets(sc.opens.back() + Millis(60), 6);
  sc.Packets(sc.last + Millis(20), 10);
  sc.RunTo(sc.last + Millis(30));
  ASSERT_EQ(sc.s().stats().held_bursts, 1u);
  const TimePoint open = sc.opens.back();
  sc.RunTo(open + Millis(400));
  EXPECT_EQ(sc.s().stats().lost_opens, 1u);
  EXPECT_EQ(sc.s().state(), ShaperState::kRecovery);
  EXPECT_TRUE(sc.s().card_awake());
  sc.Packets(sc.now + Millis(1), 16);
  sc.RunTo(sc.last + Millis(40));
  EXPECT_EQ(sc.s().stats().held_bursts, 1u);
  EXPECT_EQ(sc.s().state(), ShaperState::kSaving);
  EXPECT_EQ(sc.s().stats().missed_packets, 0u);
}

TEST_F(DownloadShaperTest, SplitWindowsAreNeitherMissedNorTakenForSaturation) {
  // Each window comes in two halves 25 ms apart (the rest in transit behind the part): held,
  // every window is one burst, nothing is missed, and the burst's rate leaves the hold's gap
  // out (with it, 16 packets over ~30 ms would make the 23 KB window look like 90% of the
  // bandwidth-delay product and send the shaper to plain TCP).
  Scripted sc(true);
  sc.WholeWindows(2);
  for (int i = 0; i < 6; ++i) {
    sc.Packets(sc.opens.back() + Millis(60), 8);
    sc.Packets(sc.last + Millis(25), 8);
    sc.RunTo(sc.last + Millis(30));
  }
  EXPECT_EQ(sc.s().stats().held_bursts, 6u);
  EXPECT_EQ(sc.s().stats().missed_packets, 0u);
  EXPECT_EQ(sc.s().state(), ShaperState::kSaving);
  EXPECT_FALSE(sc.s().stats().saturated);
  EXPECT_GT(sc.s().rate(), 2e6);  // the link's 2.5 MB/s, not the window over the split
}

TEST_F(DownloadShaperTest, SaturatedLinkWithSplitWindowsStillRevertsToPlainTcp) {
  // 8 ms RTT: the 16-packet window (23 KB) is above 90% of the 20 KB bandwidth-delay product.
  // Each window comes in two parts 3.5 ms apart; held or not, the link is saturated.
  Scripted sc(true, Millis(8));
  sc.Packets(sc.now + Millis(1), 16);
  sc.RunTo(sc.now + Millis(20));
  if (sc.opens.empty()) sc.Open(sc.now);
  for (int i = 0; i < 6 && sc.s().state() != ShaperState::kPlain; ++i) {
    sc.Packets(sc.opens.back() + Millis(8), 8);
    sc.Packets(sc.last + Millis(3.5), 8);
    sc.RunTo(sc.last + Millis(8));
  }
  EXPECT_EQ(sc.s().state(), ShaperState::kPlain);
  EXPECT_TRUE(sc.s().stats().saturated);
}

// Round 10: a link that keeps TCP's window accounting, to see where part-windows come from.
// The index of the earliest of `due` (the next event of a window-accounting model), or -1.
template <std::size_t N>
int Earliest(const std::optional<TimePoint> (&due)[N]) {
  int which = -1;
  for (int i = 0; i < static_cast<int>(N); ++i) {
    if (due[i] && (which < 0 || *due[i] < *due[which])) which = i;
  }
  return which;
}

// A window-accounting link (rounds 8–14): the receiver's advertised right edge is what it has
// read plus its grant and never shrinks; every arriving packet is ACKed at once with that edge,
// the cumulative ACK and the bytes held out of order; the sender sends whatever the edge allows
// (segments the window holds whole), serialised at the bottleneck, half a round trip each way.
// The adapter is modelled as the proxy's: it reads every packet while the shaper reads freely,
// drains everything queued when the shaper asks for an open, opens itself when the shaper waits
// with nothing pending, and, with `read_awaited`, reads the first packet after each open too
// (the bufferevent reading while a burst is awaited: quiet bursts off; not while the grant is
// clamped, where the read would grant the sender an MSS more than its cwnd), which moves the
// edge. The sender is Reno (round 12): `cwnd0` packets at first (none: never short of it),
// congestion avoidance from there; with `loss_every` every loss_every-th new segment is dropped
// once, retransmitted on the first duplicate ACK (SACK/RACK on a link that never reorders) or by
// the retransmission timer, and the cwnd halves; the receiver reads only what is in order. With
// the clamp (round 13) the receiver's grant follows the shaper's grant_share(), as the proxy's
// receive buffer does (the kernel never shrinks an offered window, so the edge only moves up).
struct LinkSpecW {
  Duration rtt = Millis(60);
  int loss_every = 0;
  Bytes size = 3'000'000;
  bool declared = true;      // the shaper knows the size (a response's length)
  bool hold = true;          // ShaperOptions::hold_part_windows
  bool read_awaited = true;  // the awaited burst's first packet is read (quiet bursts off)
  bool ack_clock = false;
  bool clamp = false;
  bool clamp_when_pays = false;
  double cwnd0 = 1e9;        // packets
  bool clump_wake = false;   // ShaperOptions::wake_for_clocked_clumps
  // ShaperOptions::delayed_ack: off, as this link's receiver ACKs every arrival at once (it has
  // no delayed-ACK timer to model).
  Duration delayed_ack = Duration::zero();
};
struct LinkRun {
  ShaperStats stats;
  Duration time{};
  int opens = 0;
  ShaperState final_state{};
};
LinkRun WindowLink(const LinkSpecW& spec) {
  const Duration rtt = spec.rtt;
  const Bytes window = 16 * kMss;
  const Bytes size = spec.size;
  const int loss_every = spec.loss_every;
  ShaperOptions o = Options();
  o.window = window;
  o.size = spec.declared ? size : 0;
  o.hold_part_windows = spec.hold;
  o.ack_clock_after_loss = spec.ack_clock;
  o.clamp_to_sender = spec.clamp;
  o.clamp_when_pays = spec.clamp_when_pays;
  o.wake_for_clocked_clumps = spec.clump_wake;
  o.delayed_ack = spec.delayed_ack;
  DownloadShaper s(o, TimePoint{});
  s.SetMinRtt(rtt);
  struct Pkt {
    TimePoint at;
    Bytes seq, bytes;
  };
  struct Ack {
    TimePoint at;
    Bytes ack, edge, sacked;
  };
  std::vector<Pkt> packets;
  std::vector<Ack> acks;
  std::vector<std::pair<Bytes, Bytes>> ooo;  // the receiver's out-of-order segments
  Bytes rcv_nxt = 0, read = 0, edge = 0, sacked = 0;
  Bytes snd_una = 0, snd_nxt = 0, snd_edge = 0, snd_sacked = 0, retransmitted_at = ~Bytes{0};
  double cwnd = spec.cwnd0;
  std::int64_t sent_segments = 0;
  TimePoint now{}, link_free{}, progress{};
  LinkRun r;
  auto ack = [&](TimePoint at) {
    const auto grant = static_cast<Bytes>(static_cast<double>(window) * s.grant_share());
    edge = std::max(edge, read + grant);
    acks.push_back({at + rtt / 2, rcv_nxt, edge, sacked});
  };
  auto transmit = [&](Bytes seq, Bytes b, bool drop) {
    link_free = std::max(now, link_free) + Seconds(static_cast<double>(b) / kRate20Mbps);
    if (!drop) packets.push_back({link_free + rtt / 2, seq, b});  // in time order: one link
  };
  auto send_new = [&] {
    while (snd_nxt + std::min<Bytes>(kMss, size - snd_nxt) <= snd_edge && snd_nxt < size &&
           static_cast<double>(snd_nxt - snd_una) - static_cast<double>(snd_sacked) < cwnd * kMss) {
      const Bytes b = std::min<Bytes>(kMss, size - snd_nxt);
      transmit(snd_nxt, b, loss_every > 0 && ++sent_segments % loss_every == loss_every / 2);
      snd_nxt += b;
    }
  };
  bool awaiting = false;
  auto open = [&](TimePoint at) {
    s.OnOpened(at);
    ++r.opens;
    read = rcv_nxt;
    ack(at);
    awaiting = true;
  };
  std::size_t next_packet = 0, next_ack = 0;
  ack(now);  // the request: the first window
  for (int guard = 0; rcv_nxt < size; ++guard) {
    if (guard > 2'000'000) {
      ADD_FAILURE() << "the simulation did not finish";
      break;
    }
    // The retransmission timer (a lost segment with none after it: no duplicate ACK).
    const std::optional<TimePoint> rto =
        snd_una < snd_nxt ? std::optional(progress + Millis(300)) : std::nullopt;
    const std::optional<TimePoint> due[4] = {
        s.NextDeadline(),
        next_packet < packets.size() ? std::optional(packets[next_packet].at) : std::nullopt,
        next_ack < acks.size() ? std::optional(acks[next_ack].at) : std::nullopt, rto};
    const int which = Earliest(due);
    if (which < 0) {
      open(now);  // nothing pending: the adapter opens the closed window itself
      continue;
    }
    now = std::max(now, *due[which]);
    if (which == 3) {
      progress = now;
      cwnd = 2;
      transmit(snd_una, std::min<Bytes>(kMss, size - snd_una), false);
    } else if (which == 2) {
      const Ack a = acks[next_ack++];
      snd_edge = std::max(snd_edge, a.edge);
      if (a.ack > snd_una) {
        progress = now;
        cwnd += static_cast<double>(a.ack - snd_una) / kMss / cwnd;  // congestion avoidance
        snd_una = a.ack;
      } else if (a.sacked > 0 && snd_una < snd_nxt && retransmitted_at != snd_una) {
        // The first duplicate ACK with a hole: retransmit it, halve the window (Reno).
        retransmitted_at = snd_una;
        cwnd = std::max(2.0, cwnd / 2);
        transmit(snd_una, std::min<Bytes>(kMss, size - snd_una), false);
      }
      snd_sacked = a.sacked;
      send_new();
    } else if (which == 1) {
      const Pkt p = packets[next_packet++];
      bool missing = p.seq != rcv_nxt;
      if (p.seq == rcv_nxt) {
        rcv_nxt += p.bytes;
        std::sort(ooo.begin(), ooo.end());
        while (!ooo.empty() && ooo.front().first <= rcv_nxt) {
          rcv_nxt = std::max(rcv_nxt, ooo.front().first + ooo.front().second);
          ooo.erase(ooo.begin());
        }
      } else if (p.seq > rcv_nxt) {
        ooo.push_back({p.seq, p.bytes});
      }
      sacked = 0;
      for (const auto& [q, b] : ooo) sacked += b;
      s.OnArrival(now, p.bytes, missing);
      if (s.reads_freely() || (awaiting && spec.read_awaited && s.grant_clamp() == 0)) read = rcv_nxt;
      awaiting = false;
      ack(now);
    } else {
      s.OnTimer(now);
    }
    if (s.wants_open()) open(now);
  }
  s.Finish(now);
  r.stats = s.stats();
  r.time = now - TimePoint{};
  r.final_state = s.state();
  return r;
}
// The round-8 link: no loss, a sender never short of cwnd, no declared size.
LinkRun GrantLink(bool hold, bool read_awaited, bool ack_clock = false) {
  return WindowLink({.declared = false, .hold = hold, .read_awaited = read_awaited,
                     .ack_clock = ack_clock});
}
// The round-12 link: a Reno sender from `cwnd0` packets, a loss every `loss_every` segments.
LinkRun RenoLink(bool ack_clock, int loss_every, Bytes size = 3'000'000, bool clamp = false,
                 double cwnd0 = 10) {
  return WindowLink({.loss_every = loss_every, .size = size, .ack_clock = ack_clock,
                     .clamp = clamp, .cwnd0 = cwnd0});
}

TEST_F(DownloadShaperTest, ReadingTheAwaitedBurstMissesEveryCycleAndQuietBurstsDoNot) {
  // Reading the awaited burst's first packet moves the edge by its size; the sender sends that
  // much one round trip later, in the middle of the next nap, every cycle (round 8's
  // ACK-clocked tails). No judgement of the shaper's can cure that: the bytes were re-granted.
  const LinkRun read_old = GrantLink(false, true);
  EXPECT_GE(read_old.stats.missed_packets, 40u);
  const LinkRun read_held = GrantLink(true, true);
  EXPECT_GE(read_held.stats.missed_packets, 40u);
  // Round 12: the ACK clock (opt-in) does: the re-granted bytes come one
  // round trip after the burst's first packet, when the clocked wake-up has the card listening.
  const LinkRun read_clocked = GrantLink(true, true, /*ack_clock=*/true);
  EXPECT_LE(read_clocked.stats.missed_packets, 2u);
  // Measured: sleep 3.28 → 0.17 s here: a re-granted packet that comes just after an open is
  // held as a clocked piece for a whole RTT (RESULTS.md, round 12: not cured in this round).
  std::printf("read awaited: held missed %llu sleep %.2f s bursts %llu; clocked missed %llu sleep %.2f s bursts %llu\n",
              static_cast<unsigned long long>(read_held.stats.missed_packets), ToSeconds(read_held.stats.sleep),
              static_cast<unsigned long long>(read_held.stats.bursts),
              static_cast<unsigned long long>(read_clocked.stats.missed_packets), ToSeconds(read_clocked.stats.sleep),
              static_cast<unsigned long long>(read_clocked.stats.bursts));
  // Reading only at opens (quiet bursts), nothing is missed in the whole download, held or not
  // (this link's freely read flight comes in one clump, so slow start's end opens on no part),
  // with about one open per window (3 MB / 23 KB ≈ 130): the hold costs nothing here.
  const LinkRun quiet_old = GrantLink(false, false);
  EXPECT_LE(quiet_old.stats.missed_packets, 1u);
  const LinkRun quiet_held = GrantLink(true, false);
  EXPECT_EQ(quiet_held.stats.missed_packets, 0u);
  EXPECT_EQ(quiet_held.stats.bad_bursts, 0u);
  EXPECT_LE(quiet_held.opens, 135);
  EXPECT_GT(ToSeconds(quiet_held.stats.sleep), ToSeconds(read_held.stats.sleep) + 2.0);
}

// Prints two runs of RenoLink side by side (the figures the tests' comments quote).
void PrintRuns(const char* label, const LinkRun& a, const LinkRun& b) {
  auto u = [](std::uint64_t v) { return static_cast<unsigned long long>(v); };
  std::printf("%s: missed %llu → %llu, bad %llu → %llu, sleep %.2f → %.2f s, time %.2f → %.2f s, "
              "bursts %llu → %llu (clocked %llu, clamped %llu, held %llu → %llu)\n",
              label, u(a.stats.missed_packets), u(b.stats.missed_packets), u(a.stats.bad_bursts),
              u(b.stats.bad_bursts), ToSeconds(a.stats.sleep), ToSeconds(b.stats.sleep),
              ToSeconds(a.time), ToSeconds(b.time), u(a.stats.bursts), u(b.stats.bursts),
              u(b.stats.clocked_bursts), u(b.stats.clamped_bursts), u(a.stats.held_bursts),
              u(b.stats.held_bursts));
}

TEST_F(DownloadShaperTest, AckClockAfterALossCatchesTheClockedData) {
  // 1% loss: after each loss the sender is cwnd-limited and ACK-clocked; its data comes one
  // round trip after the ACKs of the last burst, before open + RTT. Without the clock the card
  // naps into it (missed packets, bad bursts, recovery awake); with it the card wakes in time.
  const LinkRun old_rule = RenoLink(false, 100);
  const LinkRun clocked = RenoLink(true, 100);
  PrintRuns("1% loss, ACK clock", old_rule, clocked);
  EXPECT_GT(clocked.stats.clocked_bursts, 0u);
  EXPECT_EQ(old_rule.stats.clocked_bursts, 0u);
  // Measured on this model: missed 87 → 3, but sleep 3.48 → 1.45 s and time 13.3 → 14.3 s (the
  // clocked pieces come far ahead of the open's data here, and the card listens in between):
  // the model does not say the clock pays; the emulated link decides (RESULTS.md, round 12).
  EXPECT_LE(clocked.stats.missed_packets * 4, old_rule.stats.missed_packets);
  EXPECT_LT(clocked.stats.bad_bursts * 4, old_rule.stats.bad_bursts);
}

TEST_F(DownloadShaperTest, ClampAfterALossKeepsOneOpenOneBurst) {
  // Round 13: the same lossy Reno link with the grant clamped to the sender's estimated cwnd.
  // The sender starts above the grant (as Linux's slow start leaves it), so whole bursts measure
  // the unclamped grant before the first loss.
  const LinkRun old_rule = RenoLink(false, 100, 3'000'000, false, 24);
  const LinkRun clamped = RenoLink(false, 100, 3'000'000, /*clamp=*/true, 24);
  PrintRuns("1% loss, clamp", old_rule, clamped);
  EXPECT_EQ(old_rule.stats.clamped_bursts, 0u);
  EXPECT_GT(clamped.stats.clamped_bursts, 0u);
  // Measured on this model: missed 85 → 21, sleep 3.43 → 6.26 s, time 12.94 → 13.76 s.
  EXPECT_LE(clamped.stats.missed_packets * 4, old_rule.stats.missed_packets);
  EXPECT_GT(ToSeconds(clamped.stats.sleep), 1.5 * ToSeconds(old_rule.stats.sleep));
  EXPECT_LT(ToSeconds(clamped.time), 1.1 * ToSeconds(old_rule.time));
  // No loss: the sender is short of the grant only where the awaited burst's first read
  // re-granted an MSS (that packet comes mid-nap, the open's data one short); the clamp then
  // engages for a few bursts and, reading nothing of the awaited burst meanwhile, removes the
  // re-grant. Measured on this model: missed 84 → 8, time 9.25 → 9.25 s (41 clamped bursts).
  const LinkRun clean_old = RenoLink(false, 0, 3'000'000, false, 24);
  const LinkRun clean_clamped = RenoLink(false, 0, 3'000'000, true, 24);
  PrintRuns("no loss, clamp", clean_old, clean_clamped);
  EXPECT_LE(clean_clamped.stats.missed_packets, clean_old.stats.missed_packets);
  EXPECT_LT(ToSeconds(clean_clamped.time), 1.1 * ToSeconds(clean_old.time));
}

TEST_F(DownloadShaperTest, GrantIsClampedToTheSendersBurstsAfterALossAndReleasedAsTheyGrow) {
  // Round 13, on synthetic arrivals: whole 16-packet grants, a burst with loss, the
  // retransmission's burst, then a sender whose cwnd was halved: 8 packets of the 16 granted,
  // the other 8 one round trip after the first (its ACK clock). The clamp follows the bursts.
  Scripted sc(true, Millis(60), 0, Millis(0.5), false, /*clamp=*/true);
  sc.WholeWindows(3);
  EXPECT_EQ(sc.s().grant_share(), 1.0);
  sc.Packets(sc.opens.back() + Millis(60), 16, /*missing=*/true);
  sc.RunTo(sc.last + Millis(35));
  EXPECT_EQ(sc.s().grant_share(), 1.0) << "a burst with loss is no measure of the sender";
  sc.Packets(sc.opens.back() + Millis(60), 3);  // the retransmission and fast recovery's data
  sc.RunTo(sc.last + Millis(35));
  EXPECT_EQ(sc.s().grant_share(), 1.0) << "a part, but no clocked rest followed it";
  const TimePoint first = sc.opens.back() + Millis(60);
  sc.Packets(first, 8);
  const TimePoint part_end = sc.last;
  sc.RunTo(part_end + Millis(31));  // the hold runs out
  ASSERT_EQ(sc.OpensAfter(part_end), 1u);
  EXPECT_EQ(sc.s().grant_share(), 1.0) << "not yet: a kernel's short grant looks the same";
  // The old grant's rest comes one RTT after the part's first packet, before the open's data
  // could: the card is awake for it, and it proves the sender short of cwnd.
  ASSERT_TRUE(sc.s().nap_due());
  EXPECT_EQ(*sc.s().nap_due(), first + Millis(60));
  sc.Packets(first + Millis(60), 8);
  EXPECT_EQ(sc.s().grant_clamp(), 8.0 * kMss);
  EXPECT_NEAR(sc.s().grant_share(), 8.5 / 16, 1e-9);
  sc.RunTo(sc.last + Millis(5));
  EXPECT_EQ(sc.s().stats().missed_packets, 0u);
  EXPECT_EQ(sc.s().grant_clamp(), 8.0 * kMss) << "the clocked rest is no measure of cwnd";
  // From here one open brings one whole burst of the clamped grant; each raises it an MSS
  // (the sender's cwnd grows one per round trip) until it is the whole grant again.
  for (int n = 8; n < 16; ++n) {
    const std::size_t opens = sc.opens.size();
    sc.Packets(sc.opens.back() + Millis(60), n);
    sc.RunTo(sc.last + Millis(5));
    ASSERT_EQ(sc.opens.size(), opens + 1) << "one open per burst of " << n;
    EXPECT_EQ(sc.s().grant_clamp(), n + 1 < 16 ? (n + 1.0) * kMss : 0.0) << "after a burst of " << n;
  }
  EXPECT_EQ(sc.s().grant_share(), 1.0) << "released";
  EXPECT_EQ(sc.s().stats().missed_packets, 0u);
  EXPECT_EQ(sc.s().stats().held_bursts, 0u);
  // A burst short of the clamp (another loss's halving, seen without a hold) lowers it at once.
  sc.Packets(sc.opens.back() + Millis(60), 16, /*missing=*/true);
  sc.RunTo(sc.last + Millis(35));
  sc.Packets(sc.opens.back() + Millis(60), 2);
  sc.RunTo(sc.last + Millis(35));
  const TimePoint short_first = sc.opens.back() + Millis(60);
  sc.Packets(short_first, 15);  // one short: not held, but a part
  sc.RunTo(sc.last + Millis(5));
  EXPECT_EQ(sc.s().grant_share(), 1.0);
  sc.Packets(short_first + Millis(60), 1);  // its clocked rest
  EXPECT_EQ(sc.s().grant_clamp(), 15.0 * kMss);
  EXPECT_EQ(sc.s().stats().missed_packets, 0u);
}

TEST_F(DownloadShaperTest, PartWithoutAClockedRestIsNotTakenForTheSendersCwnd) {
  // A part whose rest never comes before the open's data was all that was granted (the
  // kernel's grant for a clamped buffer is not exactly the share asked for) or all the sender
  // had: lowering the clamp to it would ratchet the grant down burst by burst (measured on the
  // emulated link at 60 ms / 1% before this rule: 1208 bursts of ~4 KB, E×D 6.2×).
  Scripted sc(true, Millis(60), 0, Millis(0.5), false, /*clamp=*/true);
  sc.WholeWindows(3);
  for (int i = 0; i < 4; ++i) {
    sc.Packets(sc.opens.back() + Millis(60), 8);
    sc.RunTo(sc.last + Millis(35));
    EXPECT_EQ(sc.s().grant_share(), 1.0) << "part " << i;
  }
}

// Round 14: the clamp only where eq. 4 says it pays, from what the shaper measured. The
// unclamped cycles of a loss episode are booked as they end; a part proves the sender short of
// cwnd; the clamp falls (the cycle model says a clamped cycle costs less per byte than the
// measured unclamped ones); clamped cycles that then cost more per byte than the unclamped ones
// release it, and the next proof is declined on the measured figures.
void LossEpisodeToAClamp(Scripted& sc) {
  sc.WholeWindows(3);
  sc.Packets(sc.opens.back() + Millis(60), 16, /*missing=*/true);
  sc.RunTo(sc.last + Millis(35));
  sc.Packets(sc.opens.back() + Millis(60), 3);  // the retransmission and fast recovery's data
  sc.RunTo(sc.last + Millis(35));
  const TimePoint first = sc.opens.back() + Millis(60);
  sc.Packets(first, 8);  // the halved cwnd's part
  sc.RunTo(sc.last + Millis(31));
  sc.Packets(first + Millis(60), 8);  // its clocked rest: the proof
  sc.RunTo(sc.last + Millis(5));
}
void DearClampedCycles(Scripted& sc, int n) {
  // Each clamped open brings one packet (a kernel's grant far short of the share asked for, or
  // a sender that stalls): the part is held awake, the cycle costs more per byte.
  for (int i = 0; i < n; ++i) {
    sc.Packets(sc.opens.back() + Millis(60), 1);
    sc.RunTo(sc.last + Millis(35));
  }
}

TEST_F(DownloadShaperTest, ClampEngagesOnlyWhileItsCyclesCostLessThanUnclampedOnes) {
  Scripted rule(true, Millis(60), 0, Millis(0.5), false, /*clamp=*/true, /*clamp_when_pays=*/true);
  LossEpisodeToAClamp(rule);
  // The unclamped cycles of the episode (recovery awake, a held part) cost more per byte than
  // the model's clamped cycle at 60 ms: the clamp falls, as round 13's.
  EXPECT_EQ(rule.s().grant_clamp(), 8.0 * kMss);
  EXPECT_EQ(rule.s().stats().clamps_declined, 0u);
  DearClampedCycles(rule, 6);
  EXPECT_EQ(rule.s().stats().clamps_released, 1u) << "measured dearer than unclamped";
  EXPECT_EQ(rule.s().grant_share(), 1.0);
  // The next loss episode's proof is weighed with the measured clamped cycles: declined.
  rule.Packets(rule.opens.back() + Millis(60), 16, /*missing=*/true);
  rule.RunTo(rule.last + Millis(35));
  const TimePoint first = rule.opens.back() + Millis(60);
  rule.Packets(first, 8);
  rule.RunTo(rule.last + Millis(31));
  rule.Packets(first + Millis(60), 8);
  rule.RunTo(rule.last + Millis(5));
  EXPECT_GE(rule.s().stats().clamps_declined, 1u);
  EXPECT_EQ(rule.s().grant_share(), 1.0);
  // Round 13's clamp (no eq. 4) keeps its clamp through the same dear cycles.
  Scripted always(true, Millis(60), 0, Millis(0.5), false, /*clamp=*/true);
  LossEpisodeToAClamp(always);
  DearClampedCycles(always, 6);
  EXPECT_GT(always.s().grant_clamp(), 0.0);
  EXPECT_EQ(always.s().stats().clamps_released, 0u);
}

TEST_F(DownloadShaperTest, ClampRuleOnTheRenoLinkDeclinesAtAShortRttAndClampsAtALongerOne) {
  // The lossy Reno link of round 12 at 30 and 60 ms (K = 0, as the bench's driver: eq. 4 is
  // card energy per byte). Round 13's clamp costs more than it saves at 30 ms on this model too
  // (sleep 1.71 → 2.41 s but time 7.03 → 8.10 s: each clamped cycle carries c bytes for one
  // round trip + the burst + Td); with the rule the clamped cycles measured there cost more per
  // byte than the unclamped ones, the clamp is released and later proofs are declined. At 60 ms
  // the clamped cycles stay cheaper and the rule clamps exactly as round 13's.
  auto exd = [](const LinkRun& r) {  // the card's E×D on this model (awake at P_idle)
    return (1.319 * ToSeconds(r.stats.awake) + 0.177 * ToSeconds(r.stats.sleep)) * ToSeconds(r.time);
  };
  for (const int rtt : {30, 60}) {
    const LinkRun base = WindowLink({.rtt = Millis(rtt), .loss_every = 100, .cwnd0 = 24});
    const LinkRun clamp =
        WindowLink({.rtt = Millis(rtt), .loss_every = 100, .clamp = true, .cwnd0 = 24});
    const LinkRun rule = WindowLink({.rtt = Millis(rtt), .loss_every = 100, .clamp = true,
                                     .clamp_when_pays = true, .cwnd0 = 24});
    std::printf("%d ms: E×D clamp/base %.2f, rule/base %.2f; rule declined %llu released %llu\n", rtt,
                exd(clamp) / exd(base), exd(rule) / exd(base),
                static_cast<unsigned long long>(rule.stats.clamps_declined),
                static_cast<unsigned long long>(rule.stats.clamps_released));
    PrintRuns(" base → clamp", base, clamp);
    PrintRuns(" base → rule ", base, rule);
    if (rtt == 30) {
      // Measured on this model: clamped bursts 159 → 4, E×D 1.25× → 1.09× base.
      EXPECT_GT(rule.stats.clamps_declined, 0u);
      EXPECT_LT(rule.stats.clamped_bursts * 4, clamp.stats.clamped_bursts);
      EXPECT_LT(exd(rule), exd(clamp));
    } else {
      // Measured: the same 95 clamped bursts, missed 85 → 21, E×D 0.89× base.
      EXPECT_EQ(rule.stats.clamps_declined, 0u);
      EXPECT_EQ(rule.stats.clamped_bursts, clamp.stats.clamped_bursts);
      EXPECT_LT(exd(rule), exd(base));
    }
  }
}

TEST_F(DownloadShaperTest, NapAfterSlowStartEndsForTheClockedTail) {
  // Round 14, read off the captures at 30 and 60 ms / 0%: every missed packet of a loss-free
  // download came in its first second, one RTT after a clump of slow start's tail (the sender
  // still ACK-clocked: each clump's ACKs release the next), while the card napped for the open's
  // data. Synthetic: a flight of 12 (slow start ends), a clump of 6 one RTT after its first
  // packet (a part: held, then opened), the next clump of 8 one RTT after that clump, then the
  // open's data one RTT after the open.
  auto run = [](bool tail_wake) {
    Scripted sc(true, Millis(60), 0, Millis(0.5), false, false, false, tail_wake);
    const TimePoint clump = sc.SlowStartFlight();
    sc.Packets(clump, 6);
    sc.RunTo(sc.last + Millis(31));  // the hold runs out: open, nap
    EXPECT_EQ(sc.opens.size(), 1u);
    sc.Packets(clump + Millis(60), 8);  // the next clocked clump
    sc.RunTo(sc.last + Millis(5));
    sc.Packets(sc.opens.back() + Millis(60), 16);  // the open's data
    sc.RunTo(sc.last + Millis(5));
    return sc.s().stats();
  };
  const ShaperStats tail = run(true);
  const ShaperStats old_rule = run(false);
  EXPECT_GT(old_rule.missed_packets, 0u) << "the clump came mid-nap";
  EXPECT_EQ(tail.missed_packets, 0u);
  EXPECT_EQ(tail.bad_bursts, 0u);
  // The card naps again between the clocked clump and the open's data (it is not kept awake):
  // measured 48 ms asleep in its two naps (the old rule: 27 ms, its nap cut by the miss).
  EXPECT_GT(ToSeconds(tail.sleep), 0.04);
  std::printf("tail: missed %llu → %llu, sleep %.1f → %.1f ms\n",
              static_cast<unsigned long long>(old_rule.missed_packets),
              static_cast<unsigned long long>(tail.missed_packets), ToSeconds(old_rule.sleep) * 1e3,
              ToSeconds(tail.sleep) * 1e3);
}

TEST_F(DownloadShaperTest, NapAfterAHeldTailEndsForTheClumpAfterItsLastClump) {
  // The capture at 60 ms / 0% (round 14): clumps of slow start's tail 11 and 28 ms apart are held
  // as one part-window (each gap within half a min RTT); the next clump comes one RTT after the
  // *last* clump's first packet, not the burst's first.
  Scripted sc(true, Millis(60), 0, Millis(0.5));
  const TimePoint a = sc.SlowStartFlight();
  sc.Packets(a, 2);
  sc.Packets(a + Millis(11), 4);
  const TimePoint last_clump = a + Millis(40);
  sc.Packets(last_clump, 2);
  sc.RunTo(sc.last + Millis(31));  // the hold runs out: open, nap
  ASSERT_EQ(sc.opens.size(), 1u);
  ASSERT_TRUE(sc.s().nap_due());
  EXPECT_EQ(*sc.s().nap_due(), last_clump + Millis(60));
  sc.Packets(last_clump + Millis(60), 4);
  sc.RunTo(sc.last + Millis(5));
  EXPECT_EQ(sc.s().stats().missed_packets, 0u);
}

TEST_F(DownloadShaperTest, ClockedClumpsAfterALossAreAwaitedNotMissed) {
  // Round 15, read off the captures at 60 and 120 ms / 1%: after a loss the sender is short of
  // cwnd, the ACKs of each clump release the next one a round trip after its first packet, and
  // the card napped into them. With the clump wake it wakes for every clump of the last round
  // trip until a whole grant is confirmed again.
  for (const double rtt : {60.0, 120.0}) {
    const LinkRun old_rule = WindowLink({.rtt = Millis(rtt), .loss_every = 100, .cwnd0 = 10});
    const LinkRun clumps =
        WindowLink({.rtt = Millis(rtt), .loss_every = 100, .cwnd0 = 10, .clump_wake = true});
    PrintRuns(rtt == 60 ? "1% loss 60 ms, clump wake" : "1% loss 120 ms, clump wake", old_rule, clumps);
    EXPECT_LE(clumps.stats.missed_packets * 2, old_rule.stats.missed_packets) << rtt;
    // Measured 0 and 3; 7 and 5 when one confirmed grant disarmed the wake (a hold that ran out
    // had lowered the grant to the cwnd-limited part).
    EXPECT_LE(clumps.stats.missed_packets, 3u) << rtt;
    EXPECT_LT(clumps.stats.bad_bursts, old_rule.stats.bad_bursts) << rtt;
    EXPECT_LE(ToSeconds(clumps.time), ToSeconds(old_rule.time) * 1.02) << rtt;
    // The card sleeps more, not less: a wake for a clump that does not come naps again (measured
    // 3.48 → 4.44 s at 60 ms, 9.20 → 13.66 s at 120 ms; without the re-nap 3.84 s at 60 ms).
    EXPECT_GE(ToSeconds(clumps.stats.sleep), 1.2 * ToSeconds(old_rule.stats.sleep)) << rtt;
  }
}

TEST_F(DownloadShaperTest, LossArmsTheClumpWakeThroughRecovery) {
  // Whole grants confirmed (the wake disarmed), then a burst with a loss (kRecovery, awake), then
  // the sender short of cwnd: a part of 8 (held, then opened: back to kSaving) whose ACKs
  // release the rest of 8 one RTT after the part's first packet, before the open's data.
  auto run = [](bool clump_wake) {
    Scripted sc(true, Millis(60), 0, Millis(3), false, false, false, /*tail_wake=*/false, clump_wake);
    sc.WholeWindows(3);
    sc.Packets(sc.opens.back() + Millis(60), 15, /*missing=*/true);
    sc.RunTo(sc.last + Millis(5));
    EXPECT_EQ(sc.s().state(), ShaperState::kRecovery);
    const TimePoint part = sc.opens.back() + Millis(60);
    sc.Packets(part, 8);
    sc.RunTo(sc.last + Millis(31));  // the hold runs out: open, kSaving, nap
    EXPECT_EQ(sc.s().state(), ShaperState::kSaving);
    EXPECT_FALSE(sc.s().card_awake());
    sc.Packets(part + Millis(60), 8);  // the clocked rest
    sc.RunTo(sc.last + Millis(5));
    return sc.s().stats();
  };
  EXPECT_GT(run(false).missed_packets, 0u) << "the clocked rest came mid-nap";
  const ShaperStats clumps = run(true);
  EXPECT_EQ(clumps.missed_packets, 0u);
  EXPECT_EQ(clumps.bad_bursts, 0u);
}

// Round 16, the cycle of the round-15 sweep's 60 ms / 0.5% row (160 of its 167 missed packets,
// read off its capture): a sender held at a steady cwnd of 5 packets, in two clumps per round
// trip, 1 packet and 4 packets 28 ms later, each released by the ACKs of the same clump one RTT
// before. The proxy's drains freed less than half the window, so the kernel sent no window update
// for them (tcp_cleanup_rbuf); the next clump's first ACK carried it. A hold that ran out had
// lowered the grant to the 5 packets, every cycle then "confirmed" it, and three confirms ended
// the clocked regime: the nap after the 1-clump ended for the open's data and the 4-clump came
// mid-nap, every cycle. Only a grant released by its open (its data one min RTT after it) now
// counts towards ending the regime.
TEST_F(DownloadShaperTest, ClumpsOfASteadyCwndKeepTheClumpWakeArmed) {
  auto run = [](bool clump_wake) {
    Scripted sc(true, Millis(60), 0, Millis(0.5), false, false, false, /*tail_wake=*/false,
                clump_wake);
    const TimePoint a = sc.SlowStartFlight();
    for (int cycle = 0; cycle < 40; ++cycle) {
      const TimePoint c = a + Millis(60) * cycle;
      sc.Packets(c, 1);
      sc.Packets(c + Millis(28), 4);
    }
    sc.RunTo(sc.last + Millis(40));
    return sc.s().stats();
  };
  const ShaperStats clumps = run(true);
  const ShaperStats old_rule = run(false);
  std::printf("steady cwnd clumps: missed %llu → %llu, sleep %.1f → %.1f ms, bad %llu → %llu\n",
              static_cast<unsigned long long>(old_rule.missed_packets),
              static_cast<unsigned long long>(clumps.missed_packets), ToSeconds(old_rule.sleep) * 1e3,
              ToSeconds(clumps.sleep) * 1e3, static_cast<unsigned long long>(old_rule.bad_bursts),
              static_cast<unsigned long long>(clumps.bad_bursts));
  // Measured 0 missed and 1.82 s asleep; round 15's rule 29 missed (from the 8th cycle on, one
  // per cycle) and 1.03 s; without the clump wake 39 and 0.80 s.
  EXPECT_LE(clumps.missed_packets, 1u);
  EXPECT_LE(clumps.bad_bursts, 1u);
  EXPECT_GT(ToSeconds(clumps.sleep), 1.5 * ToSeconds(old_rule.sleep));
}

// Round 19, read off the captures at 90 ms / 1% and 120 ms / 0.5% (RESULTS.md): after a loss,
// a part of 2 packets one RTT after an open and a clump of 4 some 19 ms later, the part held for
// half a min RTT (60 ms here) — past the kernel's delayed-ACK timer (40 ms), which the proxy's
// read would have cancelled. Nothing is read while the part is held, so the kernel ACKs none of
// it at once (the window would shrink) and the timer, armed by the part's first packet (after a
// full drain's update) or by the clump's (after a partial one, which leaves the part ACKed at
// once), fires 40–49 ms later. A sender short of cwnd sends its next data on that ACK, one RTT
// later: ~40 ms after the ring's clump entry and before the open's data, mid-nap.
TEST_F(DownloadShaperTest, DataClockedByTheKernelsDelayedAckIsAwaited) {
  auto run = [](Duration delack, bool armed_by_part, Duration fired_after) {
    const Duration rtt = Millis(120);
    Scripted sc(true, rtt, 0, Millis(3), false, false, false, /*tail_wake=*/false,
                /*clump_wake=*/true, delack);
    sc.WholeWindows(3, rtt);
    sc.Packets(sc.opens.back() + rtt, 15, /*missing=*/true);  // a loss arms the clump wake
    sc.RunTo(sc.last + Millis(5));
    EXPECT_EQ(sc.s().state(), ShaperState::kRecovery);
    const TimePoint part = sc.opens.back() + rtt;
    sc.Packets(part, 2);
    const TimePoint clump = part + Millis(19);
    sc.Packets(clump, 4);
    sc.RunTo(sc.last + Millis(61));      // the hold (60 ms) runs out: open, kSaving, nap
    EXPECT_EQ(sc.s().state(), ShaperState::kSaving);
    EXPECT_FALSE(sc.s().card_awake());
    if (!armed_by_part) {
      sc.Packets(part + rtt, 2);         // clocked by the part's immediate ACK (its ring entry)
      sc.RunTo(sc.last + Millis(10));
    }
    const TimePoint armed = armed_by_part ? part : clump;
    sc.Packets(armed + fired_after + rtt, 2);  // clocked by the delayed ACK
    sc.RunTo(sc.last + Millis(300));
    return sc.s().stats();
  };
  for (const bool by_part : {true, false}) {
    for (const double fired : {40.5, 44.0, 48.0}) {
      const ShaperStats model = run(Millis(40), by_part, Millis(fired));
      const ShaperStats old_rule = run(Duration::zero(), by_part, Millis(fired));
      std::printf("delayed ACK armed by the %s, fired after %.1f ms: missed %llu → %llu, sleep "
                  "%.1f → %.1f ms\n", by_part ? "part" : "clump", fired,
                  static_cast<unsigned long long>(old_rule.missed_packets),
                  static_cast<unsigned long long>(model.missed_packets),
                  ToSeconds(old_rule.sleep) * 1e3, ToSeconds(model.sleep) * 1e3);
      EXPECT_GT(old_rule.missed_packets, 0u) << "the delayed ACK's data came mid-nap";
      EXPECT_EQ(model.missed_packets, 0u) << by_part << " " << fired;
      EXPECT_EQ(model.bad_bursts, 0u);
    }
  }
}

TEST_F(DownloadShaperTest, AckOwedAtAHoldsStartIsFlushedAndItsDataAwaited) {
  // Round 20: after a loss (the clocked regime), a 6-packet part one RTT after an open is held
  // for the rest of its grant. The kernel owes the part an ACK (nothing read: no immediate
  // ACK) and its delayed-ACK timer would send it ~40 ms after the part's first packet, mid-hold
  // at 90 ms (the hold is 45 ms). The shaper asks for it at the hold's start instead
  // (wants_ack_flush: the adapter's TCP_QUICKACK), and the rest of the grant that ACK releases
  // (a sender short of cwnd) comes one RTT after the flush, mid-nap unless awaited. Without a
  // flush asked (the harness not flushing) the kernel's timer sends it: round 19's model
  // awaits that. At 60 ms (a 30 ms hold) the open's read sends the ACK first: no flush.
  struct Result {
    ShaperStats stats;
    std::vector<TimePoint> flushes;
    TimePoint part_last{};
    Duration td{};
  };
  auto run = [](Duration rtt, bool flush) {
    Scripted sc(true, rtt, 0, Millis(3), false, false, false, /*tail_wake=*/false,
                /*clump_wake=*/true, Millis(40),
                [](ShaperOptions& o) { o.flush_ack_on_hold = true; });  // opt-in
    sc.flush_acks = flush;
    sc.WholeWindows(3, rtt);
    sc.Packets(sc.opens.back() + rtt, 15, /*missing=*/true);  // a loss arms the clump wake
    sc.RunTo(sc.last + Millis(5));
    EXPECT_EQ(sc.s().state(), ShaperState::kRecovery);
    const TimePoint part = sc.opens.back() + rtt;
    sc.Packets(part, 6);
    Result r;
    r.part_last = sc.last;
    r.td = sc.s().BurstEndThreshold();
    sc.RunTo(sc.last + rtt / 2 + Millis(1));  // the hold runs out: open, kSaving, nap
    EXPECT_EQ(sc.s().state(), ShaperState::kSaving);
    EXPECT_FALSE(sc.s().card_awake());
    // The ACK of the part: flushed, or sent by the kernel's timer 40.5 ms after its first packet.
    const TimePoint acked = !sc.flushes.empty() ? sc.flushes.front() : part + Millis(40.5);
    sc.Packets(acked + rtt, 10);  // the rest of the grant, released by that ACK
    sc.RunTo(sc.last + Millis(300));
    r.stats = sc.s().stats();
    r.flushes = sc.flushes;
    return r;
  };
  const Result flushed = run(Millis(90), true);
  const Result awaited = run(Millis(90), false);
  std::printf("90 ms: flushed %zu time(s), %.1f ms after the part's last packet (Td %.1f ms); "
              "missed %llu (awaited: %llu), sleep %.1f ms (awaited: %.1f)\n",
              flushed.flushes.size(),
              flushed.flushes.empty() ? -1.0 : ToSeconds(flushed.flushes.front() - flushed.part_last) * 1e3,
              ToSeconds(flushed.td) * 1e3,
              static_cast<unsigned long long>(flushed.stats.missed_packets),
              static_cast<unsigned long long>(awaited.stats.missed_packets),
              ToSeconds(flushed.stats.sleep) * 1e3, ToSeconds(awaited.stats.sleep) * 1e3);
  ASSERT_EQ(flushed.flushes.size(), 1u) << "the hold's start asks for the ACK owed";
  EXPECT_EQ(flushed.flushes.front(), flushed.part_last + flushed.td) << "at the hold's start";
  EXPECT_EQ(flushed.stats.missed_packets, 0u) << "the flushed ACK's data came mid-nap";
  EXPECT_EQ(flushed.stats.bad_bursts, 0u);
  EXPECT_EQ(awaited.stats.missed_packets, 0u);
  const Result at60 = run(Millis(60), true);
  EXPECT_TRUE(at60.flushes.empty()) << "at 60 ms the open's read sends the ACK before the timer";
  EXPECT_EQ(at60.stats.missed_packets, 0u);
}

TEST_F(DownloadShaperTest, HoldEndsBeforeTheKernelsDelayedAckFires) {
  // Round 20 (ShaperOptions::hold_ends_before_delayed_ack): the same held 6-packet part at
  // 90 ms. The kernel's timer, armed by the part's first packet, would send its ACK ~40 ms
  // later, mid-hold (45 ms after the part's last packet); with the option the hold ends, and
  // the open's read sends that ACK, 4.5 ms before then, never before Td.
  auto open_after_part = [](bool before) {
    const Duration rtt = Millis(90);
    Scripted sc(true, rtt, 0, Millis(3), false, false, false, /*tail_wake=*/false,
                /*clump_wake=*/true, Millis(40),
                [before](ShaperOptions& o) { o.hold_ends_before_delayed_ack = before; });
    sc.WholeWindows(3, rtt);
    sc.Packets(sc.opens.back() + rtt, 15, /*missing=*/true);
    sc.RunTo(sc.last + Millis(5));
    const TimePoint part = sc.opens.back() + rtt;
    sc.Packets(part, 6);
    const Duration td = sc.s().BurstEndThreshold();
    const TimePoint last = sc.last;
    sc.RunTo(sc.last + rtt / 2 + Millis(1));
    EXPECT_EQ(sc.opens.back() >= last + td, true);
    const TimePoint open = sc.opens.back();
    // Whatever the ACK owed released comes with the open's data, one RTT after the open.
    sc.Packets(open + rtt, 16);
    sc.RunTo(sc.last + Millis(300));
    EXPECT_EQ(sc.s().stats().missed_packets, 0u);
    return open - part;
  };
  const Duration before = open_after_part(true);
  const Duration held = open_after_part(false);
  std::printf("open %.1f ms after the part's first packet (hold to half an RTT: %.1f ms)\n",
              ToSeconds(before) * 1e3, ToSeconds(held) * 1e3);
  EXPECT_EQ(before, Millis(40) - Millis(4.5));
  EXPECT_GT(held, Millis(40)) << "without the option the hold outlasts the timer";
}

TEST_F(DownloadShaperTest, NoNapBehindAStragglerEndedByTheNextBurst) {
  // Round 20: a straggler's burst (a clocked clump long before the open's data is due) ended by
  // the next burst's first packet (within the straggler's Td, but late enough to be the open's
  // burst). The shaper napped behind the straggler while the new burst ran: its packets were
  // not counted, and a loss in it sent the shaper to kRecovery with the card asleep (the
  // invariant's abort, seen on the emulated link at 90 ms / 1%).
  // With hold_ends_before_delayed_ack no nap is taken; by default (main's behaviour, measured)
  // the nap is taken and the card wakes at once for the new burst's first packet, counted
  // missed. Either way the card is awake through the new burst.
  for (const bool no_nap : {true, false}) {
  const Duration rtt = Millis(90);
  Scripted sc(true, rtt, 0, Millis(3), false, false, false, /*tail_wake=*/false,
              /*clump_wake=*/true, std::nullopt,
              [no_nap](ShaperOptions& o) { o.hold_ends_before_delayed_ack = no_nap; });
  sc.WholeWindows(1, rtt);
  const TimePoint part = sc.opens.back() + rtt;
  sc.Packets(part, 6);                 // a part, held
  sc.Packets(part + Millis(25), 10);   // the rest: a whole grant, opened at once
  sc.RunTo(sc.last + Millis(10));
  ASSERT_GT(sc.opens.back(), part + Millis(25));
  const TimePoint open = sc.opens.back();
  sc.RunTo(part + rtt - Millis(1));    // the card wakes for the part's clocked clump
  ASSERT_EQ(sc.s().state(), ShaperState::kSaving);
  ASSERT_TRUE(sc.s().card_awake());
  sc.Packets(part + rtt + Millis(2.5), 1);  // a straggler (long before open + RTT)
  ASSERT_TRUE(sc.s().card_awake());
  const TimePoint next = open + rtt - rtt / 4 + Millis(0.05);  // the open's burst, not a straggler
  ASSERT_LT(next, sc.last + sc.s().BurstEndThreshold())
      << "within the straggler's Td: " << ToSeconds(next - sc.last) * 1e3 << " ms, Td "
      << ToSeconds(sc.s().BurstEndThreshold()) * 1e3;
  sc.Packets(next, 1);
  EXPECT_TRUE(sc.s().card_awake()) << "asleep behind the straggler with the next burst begun";
  const std::uint64_t missed = no_nap ? 0u : 1u;
  EXPECT_EQ(sc.s().stats().missed_packets, missed) << no_nap;
  sc.Packets(next + Millis(0.6), 5, /*missing=*/true);  // a loss in that burst: kRecovery
  sc.RunTo(sc.last + Millis(300));
  EXPECT_EQ(sc.s().stats().missed_packets, missed) << no_nap;
  }
}

TEST_F(DownloadShaperTest, ParsesShapeModes) {
  EXPECT_EQ(ParseShapeMode("off"), ShapeMode::kOff);
  EXPECT_EQ(ParseShapeMode("auto"), ShapeMode::kAuto);
  EXPECT_EQ(ParseShapeMode("always"), ShapeMode::kAlways);
  EXPECT_FALSE(ParseShapeMode("sometimes"));
  EXPECT_STREQ(ShapeModeName(ShapeMode::kAlways), "always");
}

}  // namespace
}  // namespace ghost
