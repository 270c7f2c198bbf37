#include "common/base/clock.h"

#include <event2/event.h>
#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <thread>
#include <vector>

namespace ghost {
namespace {

TEST(VirtualClockTest, RunsTimersInTimeOrderAndMovesTime) {
  VirtualClock clock;
  std::vector<int> order;
  clock.ScheduleAfter(Millis(30), [&] { order.push_back(3); });
  clock.ScheduleAfter(Millis(10), [&] { order.push_back(1); });
  clock.ScheduleAfter(Millis(20), [&] { order.push_back(2); });
  EXPECT_EQ(clock.RunUntilIdle(), 3u);
  EXPECT_EQ(order, (std::vector<int>{1, 2, 3}));
  EXPECT_EQ(clock.Now(), TimePoint(Millis(30)));
}

TEST(VirtualClockTest, SameInstantRunsInScheduleOrder) {
  VirtualClock clock;
  std::vector<int> order;
  for (int i = 0; i < 5; ++i) clock.ScheduleAt(TimePoint(Seconds(1)), [&, i] { order.push_back(i); });
  clock.RunUntilIdle();
  EXPECT_EQ(order, (std::vector<int>{0, 1, 2, 3, 4}));
}

TEST(VirtualClockTest, CancelledTimerDoesNotRun) {
  VirtualClock clock;
  bool ran = false;
  TimerId id = clock.ScheduleAfter(Seconds(1), [&] { ran = true; });
  EXPECT_TRUE(clock.Cancel(id));
  EXPECT_FALSE(clock.Cancel(id));
  clock.RunUntilIdle();
  EXPECT_FALSE(ran);
}

TEST(VirtualClockTest, RunUntilStopsAtTheGivenTime) {
  VirtualClock clock;
  int runs = 0;
  clock.ScheduleAfter(Seconds(1), [&] { ++runs; });
  clock.ScheduleAfter(Seconds(3), [&] { ++runs; });
  clock.RunUntil(TimePoint(Seconds(2)));
  EXPECT_EQ(runs, 1);
  EXPECT_EQ(clock.Now(), TimePoint(Seconds(2)));
  EXPECT_EQ(clock.pending(), 1u);
}

TEST(VirtualClockTest, CallbackMayScheduleMoreTimers) {
  VirtualClock clock;
  int runs = 0;
  std::function<void()> again = [&] {
    if (++runs < 4) clock.ScheduleAfter(Seconds(1), again);
  };
  clock.ScheduleAfter(Seconds(1), again);
  clock.RunUntilIdle();
  EXPECT_EQ(runs, 4);
  EXPECT_EQ(clock.Now(), TimePoint(Seconds(4)));
}

TEST(VirtualClockTest, SafeToScheduleFromManyThreads) {
  VirtualClock clock;
  std::atomic<int> runs{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 1000; ++i) clock.ScheduleAfter(Millis(i), [&] { ++runs; });
    });
  }
  for (auto& th : threads) th.join();
  clock.RunUntilIdle();
  EXPECT_EQ(runs.load(), 4000);
}

TEST(RealClockTest, TimerFiresFromTheEventLoopAfterItsDelay) {
  event_base* base = MakeEventBase();
  {
    RealClock clock(base);
    TimePoint start = clock.Now();
    TimePoint fired{};
    clock.ScheduleAfter(Millis(50), [&] { fired = clock.Now(); });
    event_base_dispatch(base);  // returns when no event is pending
    EXPECT_GE(fired - start, Millis(50));
    EXPECT_LT(fired - start, Millis(1000));
  }
  event_base_free(base);
}

TEST(RealClockTest, CancelledTimerNeverFiresAndLeavesNoEvent) {
  event_base* base = MakeEventBase();
  {
    RealClock clock(base);
    bool ran = false;
    TimerId id = clock.ScheduleAfter(Millis(20), [&] { ran = true; });
    EXPECT_TRUE(clock.Cancel(id));
    event_base_dispatch(base);  // nothing pending: returns at once
    EXPECT_FALSE(ran);
  }
  event_base_free(base);
}

TEST(RealClockTest, TimerScheduledFromAnotherThreadWakesTheLoop) {
  event_base* base = MakeEventBase();
  {
    RealClock clock(base);
    std::atomic<bool> ran{false};
    // Keep the loop alive until the cross-thread timer has run.
    event* keepalive = event_new(base, -1, EV_PERSIST, [](int, short, void*) {}, nullptr);
    timeval forever{3600, 0};
    event_add(keepalive, &forever);
    std::thread other([&] {
      clock.ScheduleAfter(Millis(10), [&] {
        ran = true;
        event_del(keepalive);
      });
    });
    event_base_dispatch(base);
    other.join();
    EXPECT_TRUE(ran.load());
    event_free(keepalive);
  }
  event_base_free(base);
}

TEST(RunSoonTest, RunsOnTheLoopNotInsideTheCall) {
  event_base* base = MakeEventBase();
  int ran = 0;
  RunSoon(base, [&] { ++ran; });
  EXPECT_EQ(ran, 0);
  event_base_loop(base, EVLOOP_NONBLOCK);
  EXPECT_EQ(ran, 1);
  FreeEventBase(base);
}

// A call still pending when its base is freed is destroyed, not run and not leaked (libevent
// frees its one-shot event, not what RunSoon gave it: ghostproxy's SMTP worker posted one after
// the loop had stopped, a LeakSanitizer report at exit).
TEST(RunSoonTest, PendingCallsAreDroppedWithTheirBase) {
  event_base* base = MakeEventBase();
  auto token = std::make_shared<int>(0);
  bool ran = false;
  RunSoon(base, [&ran, token] { ran = true; });
  RunSoon(base, [&ran, token] { ran = true; }, Seconds(3600));
  EXPECT_EQ(token.use_count(), 3);
  FreeEventBase(base);
  EXPECT_FALSE(ran);
  EXPECT_EQ(token.use_count(), 1);  // both captures destroyed
  // Another base's calls are its own.
  event_base* other = MakeEventBase();
  RunSoon(other, [token] {});
  event_base* third = MakeEventBase();
  FreeEventBase(third);
  EXPECT_EQ(token.use_count(), 2);
  FreeEventBase(other);
  EXPECT_EQ(token.use_count(), 1);
}

}  // namespace
}  // namespace ghost
