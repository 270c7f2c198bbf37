// Clock: the one source of time, timers and randomness for all policy code (DESIGN §2, "one
// model, two clocks").
//
// Two implementations behind one interface:
//  - VirtualClock: discrete-event time for ghostsim and unit tests. Time moves only when the
//    owner runs timers (RunNext / RunUntil / RunUntilIdle); a 20-minute trace replays in
//    milliseconds.
//  - RealClock: monotonic wall time; timers are libevent timer events on an event_base that
//    the owner runs (the daemons' one event loop). No thread sleeps, nothing ticks: a timer is
//    armed only while something is scheduled.
//
// Thread-safety: every method may be called from any thread. Timer callbacks run on the
// thread that drives the clock (the VirtualClock's caller, the RealClock's event loop), never
// while an internal lock is held, so a callback may schedule or cancel timers.
#ifndef GHOST_COMMON_BASE_CLOCK_H_
#define GHOST_COMMON_BASE_CLOCK_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <random>

#include "common/base/units.h"

struct event_base;  // libevent, kept out of the interface

namespace ghost {

using TimerId = std::uint64_t;
constexpr TimerId kNoTimer = 0;

class Clock {
 public:
  virtual ~Clock() = default;

  virtual TimePoint Now() const = 0;

  // Runs `fn` once at `when` (at once, on the next turn, if `when` has passed).
  // Returns an id for Cancel; never kNoTimer.
  virtual TimerId ScheduleAt(TimePoint when, std::function<void()> fn) = 0;
  TimerId ScheduleAfter(Duration delay, std::function<void()> fn) {
    return ScheduleAt(Now() + delay, std::move(fn));
  }
  // Cancels a pending timer. Returns false if it already ran, was cancelled, or never existed.
  virtual bool Cancel(TimerId id) = 0;

  // The seeded random source shared by the policies of one run (deterministic in ghostsim).
  std::mt19937_64& Random() { return random_; }
  void Seed(std::uint64_t seed) { random_.seed(seed); }

 private:
  std::mt19937_64 random_{1};
};

// Discrete-event clock. Timers due at the same instant run in the order they were scheduled.
class VirtualClock final : public Clock {
 public:
  explicit VirtualClock(TimePoint start = TimePoint{}) : now_(start) {}
  VirtualClock(const VirtualClock&) = delete;
  VirtualClock& operator=(const VirtualClock&) = delete;

  TimePoint Now() const override;
  TimerId ScheduleAt(TimePoint when, std::function<void()> fn) override;
  bool Cancel(TimerId id) override;

  // Moves time to the earliest pending timer and runs it. Returns false if none is pending.
  bool RunNext();
  // Runs every timer due at or before `t`, in time order, then sets the time to `t`.
  // Precondition: t >= Now().
  void RunUntil(TimePoint t);
  void AdvanceBy(Duration d) { RunUntil(Now() + d); }
  // Runs timers until none is pending (timers that keep rescheduling would not stop; the
  // policies never do that while idle). Returns the number of timers run.
  std::size_t RunUntilIdle(std::size_t limit = 100'000'000);
  // The time of the earliest pending timer, if any.
  bool NextDue(TimePoint* when) const;
  std::size_t pending() const;

 private:
  struct Key {
    TimePoint when;
    std::uint64_t seq;
    bool operator<(const Key& o) const { return when != o.when ? when < o.when : seq < o.seq; }
  };
  mutable std::mutex mu_;  // guards everything below; never held while a callback runs
  TimePoint now_;
  std::uint64_t next_seq_ = 1;
  std::map<Key, std::function<void()>> timers_;
  std::map<TimerId, Key> by_id_;
};

// Real monotonic time; timers are libevent events on `base`, run by whoever runs the loop.
// The base must be made thread-aware (evthread_use_pthreads before event_base_new) if timers
// are scheduled from threads other than the loop's; ghost::MakeEventBase does that.
class RealClock final : public Clock {
 public:
  // Borrows `base`; it must outlive this clock.
  explicit RealClock(event_base* base);
  ~RealClock() override;
  RealClock(const RealClock&) = delete;
  RealClock& operator=(const RealClock&) = delete;

  TimePoint Now() const override;
  TimerId ScheduleAt(TimePoint when, std::function<void()> fn) override;
  bool Cancel(TimerId id) override;

 private:
  struct Timer;
  static void OnTimer(int fd, short what, void* arg);
  event_base* base_;
  const std::chrono::steady_clock::time_point origin_;
  std::mutex mu_;  // guards timers_ and next_id_; never held while a callback runs
  std::uint64_t next_id_ = 1;
  std::map<TimerId, std::unique_ptr<Timer>> timers_;
};

// A libevent base that may be used from several threads (pthreads locking enabled).
// The caller owns it (event_base_free).
event_base* MakeEventBase();

// Runs `fn` once on `base`'s loop: on its next turn, or `after` from now. Never inside the
// call, so a callback handed to an asynchronous API never runs before that API returns.
// `fn` must guard its own captures (a weak token) if their owner can go first; a call still
// pending when the base is freed (FreeEventBase) is dropped without running.
void RunSoon(event_base* base, std::function<void()> fn, Duration after = Duration::zero());

// event_base_free(base), and the RunSoon calls still pending on it are destroyed, not run
// (libevent frees its one-shot events but not what they carry: a leak at exit otherwise).
void FreeEventBase(event_base* base);

}  // namespace ghost

#endif  // GHOST_COMMON_BASE_CLOCK_H_
