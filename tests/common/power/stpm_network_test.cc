#include "common/power/stpm_network.h"

#include <gtest/gtest.h>

#include <memory>
#include <optional>
#include <vector>

#include "common/base/clock.h"
#include "common/power/device.h"
#include "common/power/power_manager.h"
#include "common/power/profile.h"

namespace ghost {
namespace {

constexpr int kCam = 0;
constexpr int kPsm = 1;
constexpr Bytes kItem = 32 * 1024;
constexpr Duration kThink = Millis(100);  // between the transfers of a run
constexpr Duration kBetweenRuns = Seconds(5);

// One machine: the Cisco 350 behind the ipaq-2004 link, base power 1.44 W, the card starting
// in PSM and managed by an StpmNetworkPolicy. Every transfer opens a new connection (no
// keep-alive), so each pays the full round trips of the link.
Link ColdLink(Link link) {
  link.keepalive = Duration::zero();
  return link;
}

struct Rig {
  Rig(const MachineProfile& machine, const DeviceProfile& card, int knob, int initial_mode = kPsm)
      : link(ColdLink(machine.link)), nic(clock, card, &link, initial_mode),
        pm(clock, Power::Watts(1.44), knob) {
    auto p = std::make_unique<StpmNetworkPolicy>();
    policy = p.get();
    id = pm.Register(&nic, std::move(p));
  }

  // One transfer, waiting for its last byte.
  void Transfer(Bytes size = kItem) {
    bool done = false;
    nic.Submit({size, false}, [&done] { done = true; });
    while (!done && clock.RunNext()) {
    }
    ASSERT_TRUE(done);
    policy->AssertInvariants();
  }
  // A run of `n` transfers, each followed by the user's think time.
  void Run(int n) {
    for (int i = 0; i < n; ++i) {
      Transfer();
      clock.AdvanceBy(kThink);
    }
  }
  // Runs of the given lengths, `kBetweenRuns` apart, `times` over.
  void Train(const std::vector<int>& lengths, int times) {
    for (int t = 0; t < times; ++t) {
      for (int n : lengths) {
        Run(n);
        clock.AdvanceBy(kBetweenRuns);
      }
    }
  }
  // Transfers (with think time) until the policy asks for CAM; returns the count, or nullopt
  // if it had not after `limit`.
  std::optional<int> TransfersUntilSwitch(int limit) {
    std::int64_t before = policy->switches_to_cam();
    for (int j = 1; j <= limit; ++j) {
      Transfer();
      if (policy->switches_to_cam() > before) return j;
      clock.AdvanceBy(kThink);
    }
    return std::nullopt;
  }

  VirtualClock clock;
  Link link;
  Device nic;
  PowerManager pm;  // declared after the device: deregisters it first
  StpmNetworkPolicy* policy = nullptr;
  DeviceId id = -1;
};

class StpmNetworkTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto machine = LoadMachineProfile("ipaq-2004", GHOST_PROFILE_DIR);
    ASSERT_TRUE(machine.ok()) << machine.status().ToString();
    machine_ = *machine;
    const DeviceProfile* card = machine_.FindDevice(DeviceKind::kNetwork);
    ASSERT_NE(card, nullptr);
    ASSERT_EQ(card->name, "cisco-350");
    card_ = *card;
  }
  std::unique_ptr<Rig> MakeRig(int knob) { return std::make_unique<Rig>(machine_, card_, knob); }

  MachineProfile machine_;
  DeviceProfile card_;
};

TEST_F(StpmNetworkTest, RunGapDefaultsToTheCardsBreakEvenTime) {
  auto rig = MakeRig(50);
  // (510 mJ + 530 mJ) / (1410 mW − 390 mW) = 1.0196 s.
  EXPECT_NEAR(ToSeconds(rig->policy->break_even()), 1.0196, 1e-3);
  EXPECT_EQ(rig->policy->run_gap(), rig->policy->break_even());
  // No history: never switches up, comes back after the break-even time.
  EXPECT_EQ(rig->policy->CamAfterTransfers(), std::nullopt);
  EXPECT_EQ(rig->policy->IdleTimeout(), rig->policy->break_even());
}

TEST_F(StpmNetworkTest, SwitchesToCamAfterARunOfTransfers) {
  auto rig = MakeRig(50);
  rig->Run(10);
  EXPECT_EQ(rig->policy->switches_to_cam(), 0) << "no history: the first run stays in PSM";
  rig->clock.AdvanceBy(kBetweenRuns);
  rig->Train({10}, 8);
  EXPECT_EQ(rig->policy->runs(), 9);
  EXPECT_NEAR(rig->policy->ExpectedRemainingTransfers(1), 9.0, 1e-9);
  rig->clock.AdvanceBy(Seconds(20));
  ASSERT_EQ(rig->nic.mode(), kPsm);

  std::optional<int> j = rig->TransfersUntilSwitch(10);
  ASSERT_TRUE(j.has_value()) << rig->policy->Describe();
  EXPECT_LE(*j, 3) << rig->policy->Describe();
  EXPECT_EQ(j, rig->policy->CamAfterTransfers());
  rig->Run(3);
  EXPECT_EQ(rig->nic.mode(), kCam);
  EXPECT_NE(rig->policy->Describe().find("stpm-net K=50: CAM after"), std::string::npos)
      << rig->policy->Describe();
}

TEST_F(StpmNetworkTest, DoesNotSwitchForSingleTransfers) {
  for (int knob : {0, 50, 100}) {
    SCOPED_TRACE(knob);
    auto rig = MakeRig(knob);
    for (int i = 0; i < 30; ++i) {
      rig->Run(1);
      EXPECT_EQ(rig->nic.mode(), kPsm);
      rig->clock.AdvanceBy(kBetweenRuns);
    }
    EXPECT_EQ(rig->policy->runs(), 30);
    EXPECT_EQ(rig->policy->switches_to_cam(), 0);
    EXPECT_EQ(rig->policy->ExpectedRemainingTransfers(1), 0.0);
    EXPECT_EQ(rig->policy->CamAfterTransfers(), std::nullopt);
    EXPECT_NE(rig->policy->Describe().find("stays in PSM"), std::string::npos);
  }
}

TEST_F(StpmNetworkTest, ReturnsToPsmAfterIdle) {
  auto rig = MakeRig(50);
  rig->Train({10}, 6);
  rig->clock.AdvanceBy(Seconds(20));
  ASSERT_EQ(rig->nic.mode(), kPsm);
  std::int64_t downs = rig->policy->switches_to_psm();

  rig->Run(9);
  rig->Transfer();
  ASSERT_EQ(rig->nic.mode(), kCam);
  std::optional<Duration> tau = rig->policy->IdleTimeout();
  ASSERT_TRUE(tau.has_value());
  // The card stays awake through the think time of a run...
  EXPECT_GT(*tau, kThink);
  TimePoint idle_from = rig->clock.Now();
  rig->clock.RunUntil(idle_from + *tau - Millis(1));
  EXPECT_EQ(rig->nic.mode(), kCam);
  EXPECT_FALSE(rig->nic.transitioning());
  EXPECT_EQ(rig->policy->switches_to_psm(), downs);
  // ...and goes back to PSM τ after the last transfer (plus the 410 ms switch).
  rig->clock.RunUntil(idle_from + *tau + Millis(1));
  EXPECT_EQ(rig->policy->switches_to_psm(), downs + 1);
  EXPECT_TRUE(rig->nic.transitioning());
  rig->clock.RunUntil(idle_from + *tau + Millis(411));
  EXPECT_EQ(rig->nic.mode(), kPsm);
  EXPECT_FALSE(rig->nic.transitioning());
}

TEST_F(StpmNetworkTest, GhostHintsCountAsTransfers) {
  auto rig = MakeRig(50);
  // Mostly single transfers, now and then a long run: one hint is not worth a switch, two are.
  rig->Train({1, 1, 1, 1, 12}, 4);
  rig->clock.AdvanceBy(Seconds(20));
  ASSERT_EQ(rig->nic.mode(), kPsm);
  std::optional<int> expected = rig->policy->CamAfterTransfers();
  ASSERT_TRUE(expected.has_value()) << rig->policy->Describe();
  ASSERT_GT(*expected, 1) << rig->policy->Describe();
  std::int64_t ups = rig->policy->switches_to_cam();
  std::int64_t transfers = rig->policy->stats().transfers;

  GhostHint hint{Millis(160), Energy::Millijoules(580)};
  int hints = 0;
  while (rig->nic.target_mode() != kCam && hints < 10) {
    rig->pm.SendGhostHint(rig->id, hint);
    ++hints;
    rig->clock.AdvanceBy(Millis(50));
  }
  EXPECT_EQ(hints, *expected) << "hints switch the card after as many as transfers would";
  EXPECT_EQ(rig->policy->switches_to_cam(), ups + 1);
  EXPECT_EQ(rig->policy->stats().ghost_hints, hints);
  EXPECT_EQ(rig->policy->stats().transfers, transfers + hints);
  rig->clock.AdvanceBy(Millis(400));
  EXPECT_EQ(rig->nic.mode(), kCam) << "switched without any I/O";
}

TEST_F(StpmNetworkTest, HigherKnobNeverSwitchesLater) {
  const std::vector<int> knobs = {0, 25, 50, 75, 90, 100};
  std::vector<int> switch_after;                  // 31 = never within the run
  std::vector<std::optional<Duration>> timeouts;  // nullopt = never
  for (int knob : knobs) {
    SCOPED_TRACE(knob);
    // The same history for every knob: trained at K = 50, then the knob is set.
    auto rig = MakeRig(50);
    rig->Train({1, 2, 20}, 5);
    rig->clock.AdvanceBy(Seconds(20));
    ASSERT_EQ(rig->nic.mode(), kPsm);
    rig->pm.SetKnob(knob);
    timeouts.push_back(rig->policy->IdleTimeout());
    std::optional<int> j = rig->TransfersUntilSwitch(30);
    switch_after.push_back(j ? *j : 31);
    rig->policy->AssertInvariants();
  }
  for (std::size_t i = 1; i < knobs.size(); ++i) {
    EXPECT_LE(switch_after[i], switch_after[i - 1]) << "K=" << knobs[i] << " vs K=" << knobs[i - 1];
    if (timeouts[i - 1].has_value() && timeouts[i].has_value()) {
      EXPECT_GE(*timeouts[i], *timeouts[i - 1]) << "K=" << knobs[i];
    } else {
      EXPECT_FALSE(timeouts[i].has_value() && !timeouts[i - 1].has_value()) << "K=" << knobs[i];
    }
  }
  // The knob matters on this history: time-first switches sooner than energy-first.
  EXPECT_LT(switch_after.back(), switch_after.front());

  // The plans agree for every knob, not only the six above.
  auto rig = MakeRig(50);
  rig->Train({1, 2, 20}, 5);
  int previous_switch = 1000;
  std::optional<Duration> previous_timeout = Duration::zero();
  for (int knob = 0; knob <= 100; ++knob) {
    SCOPED_TRACE(knob);
    rig->pm.SetKnob(knob);
    int j = rig->policy->CamAfterTransfers().value_or(999);
    EXPECT_LE(j, previous_switch);
    std::optional<Duration> tau = rig->policy->IdleTimeout();
    EXPECT_TRUE(!tau.has_value() || (previous_timeout.has_value() && *tau >= *previous_timeout));
    previous_switch = j;
    previous_timeout = tau;
  }
  rig->policy->AssertInvariants();
}

TEST_F(StpmNetworkTest, NoTimersWhileIdleInPsm) {
  auto rig = MakeRig(50);
  rig->Train({10}, 4);
  EXPECT_GT(rig->policy->switches_to_cam(), 0);
  rig->clock.RunUntilIdle();
  EXPECT_EQ(rig->nic.mode(), kPsm);
  EXPECT_FALSE(rig->nic.transitioning());
  EXPECT_EQ(rig->clock.pending(), 0u);
  rig->clock.AdvanceBy(Seconds(60));
  EXPECT_EQ(rig->clock.pending(), 0u);
  // A transfer that does not switch leaves nothing armed either.
  rig->Run(1);
  if (rig->nic.mode() == kPsm && rig->nic.target_mode() == kPsm) {
    EXPECT_EQ(rig->clock.pending(), 0u);
  }
  rig->policy->AssertInvariants();
}

TEST_F(StpmNetworkTest, DisclosedTransferAndItsIoCountOnce) {
  auto rig = MakeRig(50);
  rig->pm.TransferBegin(rig->id);
  rig->Transfer();
  rig->Transfer();  // a second burst of the same disclosed transfer
  rig->pm.TransferEnd(rig->id);
  EXPECT_EQ(rig->policy->stats().transfers, 1);
  rig->Transfer();  // undisclosed
  EXPECT_EQ(rig->policy->stats().transfers, 2);
  rig->pm.SendGhostHint(rig->id, GhostHint{});
  EXPECT_EQ(rig->policy->stats().transfers, 3);
  EXPECT_EQ(rig->policy->stats().ghost_hints, 1);
  EXPECT_EQ(rig->policy->runs(), 1);
}

TEST_F(StpmNetworkTest, FullKnobStaysInCamAcrossLongGaps) {
  auto rig = MakeRig(100);
  for (int i = 0; i < 6; ++i) {
    rig->Run(10);
    rig->clock.AdvanceBy(Seconds(15));  // beyond the longest timeout candidate
  }
  EXPECT_EQ(rig->policy->IdleTimeout(), std::nullopt) << rig->policy->Describe();
  EXPECT_EQ(rig->nic.mode(), kCam);
  EXPECT_EQ(rig->clock.pending(), 0u) << "staying in CAM needs no timer either";
  // Energy first: the same history brings the card back to PSM.
  rig->pm.SetKnob(0);
  ASSERT_TRUE(rig->policy->IdleTimeout().has_value());
  rig->clock.RunUntilIdle();
  EXPECT_EQ(rig->nic.mode(), kPsm);
}

// ---- Naps of a shaped download (DESIGN §3.6, rules 2–5) -------------------------------------

// A card that wakes fast (wifi-ac: 5 ms, 6 mJ each way; CAM 850 mW, PSM 75 mW) under STPM, in
// CAM: what a shaped download on a 60 ms path naps with.
class ShapingNapTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto machine = LoadMachineProfile("laptop-2024", GHOST_PROFILE_DIR);
    ASSERT_TRUE(machine.ok()) << machine.status().ToString();
    machine_ = *machine;
    const DeviceProfile* card = machine_.FindDevice(DeviceKind::kNetwork);
    ASSERT_NE(card, nullptr);
    ASSERT_EQ(card->name, "wifi-ac");
    card_ = *card;
  }
  std::unique_ptr<Rig> MakeRig(int mode) { return std::make_unique<Rig>(machine_, card_, 50, mode); }
  static const DeviceEnergy& Card(const EnergyReport& r) { return r.devices.at(0); }

  MachineProfile machine_;
  DeviceProfile card_;
};

constexpr Duration kRtt = Millis(60);
constexpr Duration kLead = Millis(2);

TEST_F(ShapingNapTest, Rule2NoNapOutsideCam) {
  auto rig = MakeRig(kPsm);
  std::string why = rig->nic.TryShapingNap(kRtt, kRtt, kLead);
  EXPECT_NE(why, "") << "a card in PSM already sleeps between beacons";
  EXPECT_FALSE(rig->nic.napping());
  EXPECT_EQ(rig->nic.nap_stats().naps, 0);
  EXPECT_EQ(rig->nic.nap_stats().refused, 1);
  EXPECT_EQ(rig->nic.nap_stats().refused_slow_wake, 0);
  // Busy in CAM is no nap either.
  auto cam = MakeRig(kCam);
  cam->nic.Submit({kItem, false}, [] {});
  EXPECT_NE(cam->nic.TryShapingNap(kRtt, kRtt, kLead), "");
  EXPECT_FALSE(cam->nic.napping());
}

TEST_F(ShapingNapTest, Rule3NapSleepsInTheLowestModeAndIsBackInCamBeforeTheBurst) {
  auto rig = MakeRig(kCam);
  const StpmNetworkStats before = rig->policy->stats();
  const EnergyReport r0 = rig->pm.meter().Read();
  const TimePoint start = rig->clock.Now();
  ASSERT_EQ(rig->nic.TryShapingNap(kRtt, kRtt, kLead), "");
  EXPECT_TRUE(rig->nic.napping());
  EXPECT_EQ(rig->nic.mode(), kCam) << "a nap is not a mode change";
  // Back in CAM wake_lead before the burst is due: the up transition (5 ms) starts at
  // 60 − 2 − 5 = 53 ms and ends at 58 ms.
  rig->clock.RunUntil(start + kRtt - kLead - Millis(1));
  EXPECT_TRUE(rig->nic.napping());
  rig->clock.RunUntil(start + kRtt - kLead);
  EXPECT_FALSE(rig->nic.napping());
  EXPECT_TRUE(rig->nic.idle());
  const EnergyReport r1 = rig->pm.meter().Read();
  // Down 6 mJ + 48 ms at 75 mW (3.6 mJ) + up 6 mJ = 15.6 mJ, against 58 ms at 850 mW.
  EXPECT_NEAR((Card(r1).energy - Card(r0).energy).millijoules(), 15.6, 1e-6);
  EXPECT_NEAR(rig->nic.nap_stats().energy.millijoules(), 15.6, 1e-6);
  EXPECT_NEAR(rig->nic.nap_stats().saved.millijoules(), 58 * 0.85 - 15.6, 1e-6);
  EXPECT_EQ(rig->nic.nap_stats().time, Millis(58));
  EXPECT_EQ(rig->nic.nap_stats().asleep, Millis(48));
  EXPECT_NEAR(Card(r1).time_in_mode[kPsm] / Millis(1) - Card(r0).time_in_mode[kPsm] / Millis(1), 48, 1e-9);
  // Not an STPM mode switch, not a transfer, no run and no gap sample; the meter counts no
  // transition.
  EXPECT_EQ(Card(r1).transitions, Card(r0).transitions);
  const StpmNetworkStats& after = rig->policy->stats();
  EXPECT_EQ(after.transfers, before.transfers);
  EXPECT_EQ(after.runs, before.runs);
  EXPECT_EQ(after.switches_to_cam, before.switches_to_cam);
  EXPECT_EQ(after.switches_to_psm, before.switches_to_psm);
  rig->nic.AssertInvariants();
  rig->policy->AssertInvariants();
}

TEST_F(ShapingNapTest, Rule3IoDuringANapWaitsForTheWakeUp) {
  auto rig = MakeRig(kCam);
  const TimePoint start = rig->clock.Now();
  ASSERT_EQ(rig->nic.TryShapingNap(kRtt, kRtt, kLead), "");
  rig->clock.RunUntil(start + Millis(20));
  bool done = false;
  rig->nic.Submit({kItem, false}, [&done] { done = true; });
  EXPECT_TRUE(rig->nic.napping()) << "waking takes the profile's 5 ms";
  EXPECT_EQ(rig->nic.nap_stats().early, 1);
  rig->clock.RunUntil(start + Millis(25));
  EXPECT_FALSE(rig->nic.napping());
  while (!done && rig->clock.RunNext()) {
  }
  EXPECT_TRUE(done);
  EXPECT_EQ(rig->nic.nap_stats().time, Millis(25));
}

TEST_F(ShapingNapTest, EndNapWakesEarly) {
  auto rig = MakeRig(kCam);
  const TimePoint start = rig->clock.Now();
  ASSERT_EQ(rig->nic.TryShapingNap(kRtt, kRtt, kLead), "");
  rig->clock.RunUntil(start + Millis(10));
  rig->nic.EndNap();
  rig->clock.RunUntil(start + Millis(15));
  EXPECT_FALSE(rig->nic.napping());
  EXPECT_EQ(rig->nic.nap_stats().asleep, Millis(5));
  rig->nic.EndNap();  // not napping: nothing
  EXPECT_EQ(rig->nic.nap_stats().early, 1);
}

TEST_F(ShapingNapTest, Rule4NoNapWhenTheCardWakesSlowly) {
  // The Cisco 350 (400 ms PSM→CAM) never naps on a 60 ms path; the WaveLAN (2 ms) does.
  auto machine = LoadMachineProfile("ipaq-2004", GHOST_PROFILE_DIR);
  ASSERT_TRUE(machine.ok());
  const DeviceProfile* cisco = machine->FindDevice(DeviceKind::kNetwork);
  ASSERT_NE(cisco, nullptr);
  Rig slow(*machine, *cisco, 50, kCam);
  std::string why = slow.nic.TryShapingNap(kRtt, kRtt, kLead);
  EXPECT_NE(why.find("more than half"), std::string::npos) << why;
  EXPECT_FALSE(slow.nic.napping());
  EXPECT_EQ(slow.nic.nap_stats().refused_slow_wake, 1);
  EXPECT_EQ(slow.nic.nap_stats().naps, 0);
  // Even a very long due time: rule 4 is about the round trip.
  EXPECT_NE(slow.nic.TryShapingNap(Seconds(5), kRtt, kLead), "");

  auto wavelan = LoadDeviceProfile("wavelan-2.4", GHOST_PROFILE_DIR);
  ASSERT_TRUE(wavelan.ok()) << wavelan.status().ToString();
  // The boundary: 2 ms + lead 2 ms against half of an 8 ms and of a 7.9 ms round trip. (A
  // fresh card each time: after a nap STPM may send the WaveLAN to sleep for real.)
  auto nap = [&](Duration due, Duration rtt) {
    Rig fast(*machine, *wavelan, 50, kCam);
    return fast.nic.TryShapingNap(due, rtt, kLead);
  };
  EXPECT_EQ(nap(kRtt, kRtt), "");
  EXPECT_EQ(nap(Millis(8), Millis(8)), "");
  EXPECT_NE(nap(Millis(8), Millis(7.9)), "");
  // A nap too short to reach sleep is refused, not charged.
  EXPECT_NE(nap(Millis(4), kRtt), "");
}

TEST_F(ShapingNapTest, Rule5IdleTimerHeldDuringANap) {
  auto rig = MakeRig(kCam);
  // One transfer in CAM: with no history τ is the run gap, the card's break-even time
  // (12 mJ / 775 mW = 15.5 ms), armed when the transfer ends.
  rig->Transfer();
  ASSERT_EQ(rig->nic.mode(), kCam);
  std::optional<Duration> tau = rig->policy->IdleTimeout();
  ASSERT_TRUE(tau.has_value()) << rig->policy->Describe();
  ASSERT_GT(*tau, Millis(10));
  const std::int64_t downs = rig->policy->switches_to_psm();
  const TimePoint idle_from = rig->clock.Now();
  // A nap that spans τ: no switch to PSM during it.
  rig->clock.RunUntil(idle_from + *tau - Millis(5));
  ASSERT_EQ(rig->policy->switches_to_psm(), downs);
  const Duration due = Millis(500);
  ASSERT_EQ(rig->nic.TryShapingNap(due, kRtt * 10, kLead), "");
  const TimePoint nap_from = rig->clock.Now();
  rig->clock.RunUntil(idle_from + *tau + Millis(100));
  EXPECT_EQ(rig->policy->switches_to_psm(), downs) << "the idle timer is held during a nap";
  EXPECT_TRUE(rig->nic.napping());
  // The nap ends at 500 − 2 = 498 ms; the idle clock restarts there.
  const TimePoint nap_end = nap_from + due - kLead;
  rig->clock.RunUntil(nap_end);
  EXPECT_FALSE(rig->nic.napping());
  rig->clock.RunUntil(nap_end + *tau - Millis(1));
  EXPECT_EQ(rig->policy->switches_to_psm(), downs);
  rig->clock.RunUntil(nap_end + *tau + Millis(1));
  EXPECT_EQ(rig->policy->switches_to_psm(), downs + 1);
}

}  // namespace
}  // namespace ghost
