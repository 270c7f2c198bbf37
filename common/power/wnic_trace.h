// WNIC energy of one download, computed post-mortem from its packets' arrival times (a capture
// on the client side of the link) — the shaping paper's method (DESIGN §3.6; Yan et al.,
// "Client-centred energy and delay analysis for TCP downloads"): the same packets priced with
// the card always awake (plain TCP), with the card following the shaper's logged sleep/wake
// decisions (shaped), and with an emulated ideal 802.11 PSM (the paper's Fig. 7).
//
// The card (WnicCard) comes from a network device profile (wavelan-2.4: the paper's WaveLAN;
// wifi-ac: a modern card) or from the shaper's WnicPowers, so there is one set of numbers per
// card and no second model of it.
//
// Energy of a run from `start` (the request) to its end (the last packet delivered):
//   E = P_awake·t_awake + P_sleep·t_sleep + (P_receive − P_awake)·airtime + n_wake·E_wake
// with airtime = bytes / rate (each packet at the link rate). Delay = end − start.
//
//   Plain   the card is awake throughout; each packet is delivered when it arrives.
//   Shaped  the card follows the schedule (sleep at a burst end, wake before the next burst).
//           A scheduled wake-up at t is the start of the transition: the card listens from
//           t + wake, and the transition is priced by wake_energy alone (not also as awake).
//           A packet that arrives while the card sleeps is a *missed packet*; the card then
//           wakes for it (it is counted, not dropped: the access point would have buffered it).
//   PSM     ideal 802.11 PSM with one poll per burst: the card sleeps, the access point
//           buffers; at each beacon the card wakes and, if data is buffered, receives it and
//           stays awake until no packet came for `psm_idle`, then sleeps to the next beacon.
//           Buffering delays a burst to the next beacon, and TCP's ACK clock carries that delay
//           to every later packet: each packet is delivered at arrival + the delay accumulated
//           so far (what the paper's emulated PSM showed as one beacon per round trip).
//
// Thread-safety: pure functions of their arguments.
#ifndef GHOST_COMMON_POWER_WNIC_TRACE_H_
#define GHOST_COMMON_POWER_WNIC_TRACE_H_

#include <cstdint>
#include <vector>

#include "common/base/units.h"
#include "common/power/profile.h"
#include "common/power/shaper.h"

namespace ghost {

struct WnicCard {
  Power awake;        // idle and listening (CAM)
  Power receive;      // while a packet is on the air
  Power sleep;        // dozing
  Duration wake{};    // sleep → awake
  Energy wake_energy; // the card's energy over one wake-up
  Bandwidth rate;     // the air link, for airtime (bytes / rate)
  Duration beacon = Millis(100);   // PSM beacon interval
  Duration psm_idle = Millis(10);  // PSM: back to sleep after this long with no packet
};

// From a network profile: mode 0 is awake (its power, its active power when receiving, its
// read bandwidth as the rate), the lowest mode is asleep (its beacon interval if it has one),
// the lowest→0 transition is the wake-up. `rate` is used when the profile has no bandwidth.
WnicCard WnicCardFromProfile(const DeviceProfile& profile, Bandwidth rate);
// From the shaper's powers (WaveLAN by default).
WnicCard WnicCardFromPowers(const WnicPowers& powers, Bandwidth rate);

struct PacketArrival {
  TimePoint at;
  Bytes bytes = 0;  // payload
};
// One decision of the shaper's card model: from `at` on the card is awake or asleep.
struct CardSwitch {
  TimePoint at;
  bool awake = true;
};

struct WnicRun {
  Duration delay{};         // start → last packet delivered
  Energy energy;            // the card's, over the delay
  Duration sleep{};         // time asleep
  std::uint64_t wakes = 0;
  std::uint64_t missed = 0; // packets that came while the card slept (shaped only)
  double energy_delay() const { return energy.joules() * ToSeconds(delay); }
};

// Preconditions for all three: `packets` sorted by time, none before `start`.
WnicRun PlainRun(const WnicCard& card, TimePoint start, const std::vector<PacketArrival>& packets);
// `schedule` sorted by time; the card is awake at `start` until its first entry.
WnicRun ScheduledRun(const WnicCard& card, TimePoint start,
                     const std::vector<PacketArrival>& packets,
                     const std::vector<CardSwitch>& schedule);
WnicRun PsmRun(const WnicCard& card, TimePoint start, const std::vector<PacketArrival>& packets);

}  // namespace ghost

#endif  // GHOST_COMMON_POWER_WNIC_TRACE_H_
