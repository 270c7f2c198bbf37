#include "common/base/clock.h"

#include <event2/event.h>
#include <event2/thread.h>

#include <cassert>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace ghost {

// ---- VirtualClock ----

TimePoint VirtualClock::Now() const {
  std::lock_guard lock(mu_);
  return now_;
}

TimerId VirtualClock::ScheduleAt(TimePoint when, std::function<void()> fn) {
  std::lock_guard lock(mu_);
  if (when < now_) when = now_;
  Key key{when, next_seq_++};
  TimerId id = key.seq;
  timers_.emplace(key, std::move(fn));
  by_id_.emplace(id, key);
  return id;
}

bool VirtualClock::Cancel(TimerId id) {
  std::lock_guard lock(mu_);
  auto it = by_id_.find(id);
  if (it == by_id_.end()) return false;
  timers_.erase(it->second);
  by_id_.erase(it);
  return true;
}

bool VirtualClock::RunNext() {
  std::function<void()> fn;
  {
    std::lock_guard lock(mu_);
    if (timers_.empty()) return false;
    auto it = timers_.begin();
    now_ = std::max(now_, it->first.when);
    fn = std::move(it->second);
    by_id_.erase(it->first.seq);
    timers_.erase(it);
  }
  fn();
  return true;
}

void VirtualClock::RunUntil(TimePoint t) {
  for (;;) {
    {
      std::lock_guard lock(mu_);
      assert(t >= now_);
      if (timers_.empty() || timers_.begin()->first.when > t) {
        now_ = std::max(now_, t);
        return;
      }
    }
    RunNext();
  }
}

std::size_t VirtualClock::RunUntilIdle(std::size_t limit) {
  std::size_t n = 0;
  while (n < limit && RunNext()) ++n;
  return n;
}

bool VirtualClock::NextDue(TimePoint* when) const {
  std::lock_guard lock(mu_);
  if (timers_.empty()) return false;
  *when = timers_.begin()->first.when;
  return true;
}

std::size_t VirtualClock::pending() const {
  std::lock_guard lock(mu_);
  return timers_.size();
}

// ---- RealClock ----

struct RealClock::Timer {
  RealClock* clock;
  TimerId id;
  event* ev = nullptr;
  std::function<void()> fn;
  ~Timer() {
    if (ev) event_free(ev);
  }
};

RealClock::RealClock(event_base* base) : base_(base), origin_(std::chrono::steady_clock::now()) {}

RealClock::~RealClock() {
  std::lock_guard lock(mu_);
  timers_.clear();  // event_free deletes pending events
}

TimePoint RealClock::Now() const {
  return TimePoint(std::chrono::duration_cast<Duration>(std::chrono::steady_clock::now() - origin_));
}

TimerId RealClock::ScheduleAt(TimePoint when, std::function<void()> fn) {
  Duration delay = when - Now();
  if (delay < Duration::zero()) delay = Duration::zero();
  std::lock_guard lock(mu_);
  TimerId id = next_id_++;
  auto t = std::make_unique<Timer>();
  t->clock = this;
  t->id = id;
  t->fn = std::move(fn);
  t->ev = evtimer_new(base_, &RealClock::OnTimer, t.get());
  timeval tv{static_cast<time_t>(delay.count() / 1'000'000),
             static_cast<suseconds_t>(delay.count() % 1'000'000)};
  evtimer_add(t->ev, &tv);
  timers_.emplace(id, std::move(t));
  return id;
}

bool RealClock::Cancel(TimerId id) {
  std::unique_ptr<Timer> doomed;
  std::lock_guard lock(mu_);
  auto it = timers_.find(id);
  if (it == timers_.end()) return false;
  doomed = std::move(it->second);  // event_free (in ~Timer) removes the pending event
  timers_.erase(it);
  return true;
}

void RealClock::OnTimer(int, short, void* arg) {
  auto* t = static_cast<Timer*>(arg);
  RealClock* self = t->clock;
  std::unique_ptr<Timer> mine;
  {
    std::lock_guard lock(self->mu_);
    auto it = self->timers_.find(t->id);
    if (it == self->timers_.end()) return;  // cancelled concurrently
    mine = std::move(it->second);
    self->timers_.erase(it);
  }
  mine->fn();
}

namespace {

// A RunSoon call not run yet, listed under its base until it runs or the base is freed.
struct SoonCall {
  std::function<void()> fn;
  event_base* base;
};
struct SoonCalls {
  std::mutex mu;
  std::unordered_map<event_base*, std::unordered_set<SoonCall*>> pending;
};
SoonCalls& PendingSoonCalls() {
  static SoonCalls calls;
  return calls;
}

}  // namespace

void RunSoon(event_base* base, std::function<void()> fn, Duration after) {
  auto* call = new SoonCall{std::move(fn), base};
  SoonCalls& calls = PendingSoonCalls();
  {
    std::lock_guard lock(calls.mu);
    calls.pending[base].insert(call);
  }
  const auto us = std::chrono::duration_cast<std::chrono::microseconds>(after).count();
  const timeval tv = {static_cast<time_t>(us / 1000000), static_cast<suseconds_t>(us % 1000000)};
  const int rc = event_base_once(
      base, -1, EV_TIMEOUT,
      [](evutil_socket_t, short, void* arg) {
        std::unique_ptr<SoonCall> c(static_cast<SoonCall*>(arg));
        {
          SoonCalls& all = PendingSoonCalls();
          std::lock_guard lock(all.mu);
          all.pending[c->base].erase(c.get());
        }
        c->fn();
      },
      call, us > 0 ? &tv : nullptr);
  if (rc != 0) {  // libevent could not allocate the event; nothing will run it
    {
      std::lock_guard lock(calls.mu);
      calls.pending[base].erase(call);
    }
    delete call;
  }
}

void FreeEventBase(event_base* base) {
  event_base_free(base);
  std::unordered_set<SoonCall*> dropped;
  {
    SoonCalls& calls = PendingSoonCalls();
    std::lock_guard lock(calls.mu);
    if (auto it = calls.pending.find(base); it != calls.pending.end()) {
      dropped = std::move(it->second);
      calls.pending.erase(it);
    }
  }
  for (SoonCall* c : dropped) delete c;  // outside the lock: their captures' destructors may call RunSoon
}

event_base* MakeEventBase() {
  static std::once_flag once;
  std::call_once(once, [] { evthread_use_pthreads(); });
  return event_base_new();
}

}  // namespace ghost
