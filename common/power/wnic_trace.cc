#include "common/power/wnic_trace.h"

#include <algorithm>

namespace ghost {
namespace {

// Adds up a run: time awake and asleep, wake-ups, airtime.
struct Tally {
  Duration awake{}, asleep{};
  std::uint64_t wakes = 0;
  Bytes bytes = 0;

  WnicRun Finish(const WnicCard& card, Duration delay, std::uint64_t missed) const {
    WnicRun r;
    r.delay = delay;
    r.sleep = asleep;
    r.wakes = wakes;
    r.missed = missed;
    const Duration airtime = card.rate.TimeFor(bytes);
    r.energy = card.awake * awake + card.sleep * asleep +
               (card.receive - card.awake) * airtime + card.wake_energy * static_cast<double>(wakes);
    return r;
  }
};

Bytes Total(const std::vector<PacketArrival>& packets) {
  Bytes n = 0;
  for (const PacketArrival& p : packets) n += p.bytes;
  return n;
}

}  // namespace

WnicCard WnicCardFromProfile(const DeviceProfile& profile, Bandwidth rate) {
  WnicCard c;
  const Mode& high = profile.modes.front();
  const Mode& low = profile.modes.back();
  c.awake = high.power;
  c.receive = high.io.active_power.watts() > 0 ? high.io.active_power : high.power;
  c.sleep = low.power;
  const Transition up = profile.TransitionCost(profile.LowestMode(), profile.HighPowerMode());
  c.wake = up.time;
  c.wake_energy = up.energy;
  c.rate = high.io.read_bandwidth.is_zero() ? rate : high.io.read_bandwidth;
  if (low.beacon_interval > Duration::zero()) c.beacon = low.beacon_interval;
  return c;
}

WnicCard WnicCardFromPowers(const WnicPowers& powers, Bandwidth rate) {
  WnicCard c;
  c.awake = powers.idle;
  c.receive = powers.receive;
  c.sleep = powers.sleep;
  c.wake = powers.wake;
  c.wake_energy = powers.idle * powers.wake;  // waking costs `wake` of idle (the paper)
  c.rate = rate;
  return c;
}

WnicRun PlainRun(const WnicCard& card, TimePoint start, const std::vector<PacketArrival>& packets) {
  Tally t;
  t.bytes = Total(packets);
  const TimePoint end = packets.empty() ? start : packets.back().at;
  t.awake = end - start;
  return t.Finish(card, end - start, 0);
}

WnicRun ScheduledRun(const WnicCard& card, TimePoint start,
                     const std::vector<PacketArrival>& packets,
                     const std::vector<CardSwitch>& schedule) {
  Tally t;
  t.bytes = Total(packets);
  const TimePoint end = packets.empty() ? start : packets.back().at;
  bool awake = true;
  TimePoint since = start;
  std::uint64_t missed = 0;
  // `transition`: a scheduled wake-up at `at` starts the card's sleep → awake transition,
  // which wake_energy prices whole (the paper: waking costs `wake` of idle); the card listens
  // from at + transition. That span is neither awake nor asleep time, else it would be charged
  // twice (measured: 2 ms of idle per burst, ~3% of a 60 ms window's energy).
  auto set = [&](TimePoint at, bool on, Duration transition) {
    if (on == awake) return;
    at = std::clamp(at, since, end);
    (awake ? t.awake : t.asleep) += at - since;
    since = std::min(at + transition, end);
    awake = on;
    if (on) ++t.wakes;
  };
  std::size_t s = 0;
  for (const PacketArrival& p : packets) {
    // A packet that comes while the card is still waking up is missed too.
    while (s < schedule.size() &&
           schedule[s].at + (schedule[s].awake ? card.wake : Duration::zero()) <= p.at) {
      set(std::max(schedule[s].at, start), schedule[s].awake,
          schedule[s].awake ? card.wake : Duration::zero());
      ++s;
    }
    if (!awake) {
      // The card model slept through this packet: missed; a real card wakes for the rest.
      ++missed;
      set(p.at, true, Duration::zero());
    }
  }
  (awake ? t.awake : t.asleep) += end - since;
  return t.Finish(card, end - start, missed);
}

WnicRun PsmRun(const WnicCard& card, TimePoint start, const std::vector<PacketArrival>& packets) {
  Tally t;
  t.bytes = Total(packets);
  bool awake = false;  // the request went out; the card dozes until a beacon brings data
  TimePoint since = start;
  TimePoint last = start;  // the last delivery
  Duration shift{};
  for (const PacketArrival& p : packets) {
    TimePoint at = p.at + shift;
    if (awake && at - last > card.psm_idle) {
      // Nothing came for psm_idle: the card went back to sleep then.
      const TimePoint doze = last + card.psm_idle;
      t.awake += doze - since;
      since = doze;
      awake = false;
    }
    if (!awake) {
      // Buffered at the access point until the next beacon; the card wakes, polls, receives.
      const auto beacons = (at - start + card.beacon - Duration(1)) / card.beacon;
      const TimePoint beacon = start + beacons * card.beacon;
      const TimePoint wake = std::max(beacon, at);
      t.asleep += wake - since;
      since = wake;
      awake = true;
      ++t.wakes;
      shift += wake - at;
      at = wake;
    }
    last = std::max(last, at);
  }
  if (awake) t.awake += last - since;
  return t.Finish(card, last - start, 0);
}

}  // namespace ghost
