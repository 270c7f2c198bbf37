// DelayLine: the pure part of nfq_delay (tests/linkemu/nfq_delay.cc). Packets enter with the
// time they were read and leave, in arrival order, once they have been held for the delay.
// Because every packet of a line is held for the same delay, the packets that are due form a
// prefix of the FIFO, and one NFQUEUE batch verdict ("accept every id up to N") releases them
// all; TakeDue returns that N. A packet may be held longer than the delay (jitter, see
// Impairment below), but never past a later packet's departure: its deadline is at least the
// one before it, so the link varies its delay without reordering (as the shaping paper's
// modified DummyNet) and the due packets are still a prefix.
//
// Thread-safety: none; one event loop owns a line. Time is passed in, so tests need no clock.
#ifndef GHOST_TESTS_LINKEMU_DELAY_LINE_H_
#define GHOST_TESTS_LINKEMU_DELAY_LINE_H_

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <optional>
#include <random>

namespace ghost::linkemu {

using Nanos = std::chrono::nanoseconds;

class DelayLine {
 public:
  // `delay`: how long each packet is held. `coalesce`: a packet due within this much after
  // `now` leaves with the ones already due, so a burst of packets costs one verdict and one
  // timer rather than one each (it leaves at most `coalesce` early).
  DelayLine(Nanos delay, Nanos coalesce) : delay_(delay), coalesce_(coalesce) {}

  // Holds packet `id`, read at `now`. Ids come from one NFQUEUE queue, so they increase by one
  // per packet (modulo 2^32) in arrival order.
  // `extra`: held this much longer than the delay (and at least until the packet before it).
  void Push(Nanos now, std::uint32_t id, Nanos extra = Nanos(0)) {
    Nanos deadline = now + delay_ + extra;
    if (!held_.empty() && deadline < held_.back().deadline) deadline = held_.back().deadline;
    held_.push_back({deadline, id});
    if (held_.size() > max_held_) max_held_ = held_.size();
  }

  // Removes the packets due at `now` (deadline <= now + coalesce) and returns the id of the
  // last of them, or nothing when none is due.
  std::optional<std::uint32_t> TakeDue(Nanos now) {
    std::optional<std::uint32_t> last;
    while (!held_.empty() && held_.front().deadline <= now + coalesce_) {
      last = held_.front().id;
      held_.pop_front();
    }
    return last;
  }

  // Removes every held packet and returns the id of the last one (shutdown: accept them all).
  std::optional<std::uint32_t> TakeAll() {
    if (held_.empty()) return std::nullopt;
    std::uint32_t last = held_.back().id;
    held_.clear();
    return last;
  }

  // When the first held packet is due; nothing when the line is empty (no timer is needed).
  std::optional<Nanos> NextDeadline() const {
    if (held_.empty()) return std::nullopt;
    return held_.front().deadline;
  }

  std::size_t size() const { return held_.size(); }
  std::size_t max_held() const { return max_held_; }

 private:
  struct Held {
    Nanos deadline;
    std::uint32_t id;
  };

  const Nanos delay_;
  const Nanos coalesce_;
  std::deque<Held> held_;
  std::size_t max_held_ = 0;
};

// What the link does to each packet besides the fixed delay: random loss (each packet dropped
// with probability `loss`, independently) and a random extra delay drawn from a gamma
// distribution with mean `jitter_mean` and shape `jitter_shape` (shape 1 is exponential; the
// larger, the more symmetric around the mean). Deterministic for a given seed.
class Impairment {
 public:
  struct Fate {
    bool drop = false;
    Nanos extra{0};
  };
  // Preconditions: 0 ≤ loss ≤ 1, jitter_mean ≥ 0, jitter_shape > 0.
  Impairment(double loss, Nanos jitter_mean, double jitter_shape, std::uint64_t seed)
      : loss_(loss), jitter_(jitter_mean), rng_(seed), drop_(loss),
        gamma_(jitter_shape, static_cast<double>(jitter_mean.count()) / jitter_shape) {}

  Fate Next() {
    Fate f;
    if (loss_ > 0 && drop_(rng_)) {
      f.drop = true;
      return f;
    }
    if (jitter_.count() > 0) f.extra = Nanos(static_cast<std::int64_t>(gamma_(rng_)));
    return f;
  }
  bool active() const { return loss_ > 0 || jitter_.count() > 0; }

 private:
  double loss_;
  Nanos jitter_;
  std::mt19937_64 rng_;
  std::bernoulli_distribution drop_;
  std::gamma_distribution<double> gamma_;
};

}  // namespace ghost::linkemu

#endif  // GHOST_TESTS_LINKEMU_DELAY_LINE_H_
