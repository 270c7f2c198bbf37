// DelayLine: packets leave in order, after the delay, as one batch per tick.
#include "tests/linkemu/delay_line.h"

#include <gtest/gtest.h>

namespace ghost::linkemu {
namespace {

using std::chrono::microseconds;
using std::chrono::milliseconds;

class DelayLineTest : public ::testing::Test {
 protected:
  DelayLine line_{milliseconds(20), microseconds(100)};
};

TEST_F(DelayLineTest, EmptyLineNeedsNoTimer) {
  EXPECT_FALSE(line_.NextDeadline().has_value());
  EXPECT_FALSE(line_.TakeDue(milliseconds(1000)).has_value());
  EXPECT_FALSE(line_.TakeAll().has_value());
}

TEST_F(DelayLineTest, HoldsEachPacketForTheDelay) {
  line_.Push(milliseconds(5), 7);
  ASSERT_TRUE(line_.NextDeadline().has_value());
  EXPECT_EQ(*line_.NextDeadline(), milliseconds(25));
  EXPECT_FALSE(line_.TakeDue(milliseconds(24)).has_value());
  EXPECT_EQ(line_.TakeDue(milliseconds(25)), 7u);
  EXPECT_EQ(line_.size(), 0u);
  EXPECT_FALSE(line_.NextDeadline().has_value());
}

TEST_F(DelayLineTest, ReleasesTheDuePrefixAsOneBatchAndKeepsTheRest) {
  line_.Push(milliseconds(0), 1);
  line_.Push(milliseconds(1), 2);
  line_.Push(milliseconds(2), 3);
  line_.Push(milliseconds(10), 4);
  // At 22 ms packets 1-3 are due: one verdict "accept up to 3".
  EXPECT_EQ(line_.TakeDue(milliseconds(22)), 3u);
  EXPECT_EQ(line_.size(), 1u);
  EXPECT_EQ(*line_.NextDeadline(), milliseconds(30));
  EXPECT_EQ(line_.TakeDue(milliseconds(30)), 4u);
}

TEST_F(DelayLineTest, PacketsDueWithinTheCoalesceWindowLeaveTogether) {
  line_.Push(microseconds(0), 1);
  line_.Push(microseconds(80), 2);   // due 80 us after packet 1: within the window
  line_.Push(microseconds(300), 3);  // 300 us after: not
  EXPECT_EQ(line_.TakeDue(milliseconds(20)), 2u);
  EXPECT_EQ(line_.size(), 1u);
}

TEST_F(DelayLineTest, IdsWrapAroundInOrder) {
  line_.Push(milliseconds(0), 0xffffffffu);
  line_.Push(milliseconds(0), 0u);
  EXPECT_EQ(line_.TakeDue(milliseconds(20)), 0u);
}

TEST_F(DelayLineTest, TakeAllReturnsTheNewestAndEmptiesTheLine) {
  line_.Push(milliseconds(0), 10);
  line_.Push(milliseconds(3), 11);
  EXPECT_EQ(line_.TakeAll(), 11u);
  EXPECT_EQ(line_.size(), 0u);
  EXPECT_EQ(line_.max_held(), 2u);
}

TEST_F(DelayLineTest, JitteredPacketsStillLeaveInOrder) {
  line_.Push(milliseconds(0), 1, milliseconds(15));  // due at 35
  line_.Push(milliseconds(1), 2);                    // due at 21, but waits for 1
  line_.Push(milliseconds(2), 3, milliseconds(30));  // due at 52
  EXPECT_FALSE(line_.TakeDue(milliseconds(30)).has_value());
  EXPECT_EQ(line_.TakeDue(milliseconds(35)), 2u);  // 1 and 2 together
  EXPECT_FALSE(line_.TakeDue(milliseconds(51)).has_value());
  EXPECT_EQ(line_.TakeDue(milliseconds(52)), 3u);
}

TEST(ImpairmentTest, DropsAboutTheGivenShareOfPackets) {
  Impairment link(0.01, Nanos(0), 2, 42);
  int dropped = 0;
  for (int i = 0; i < 100000; ++i) dropped += link.Next().drop ? 1 : 0;
  EXPECT_GT(dropped, 850);
  EXPECT_LT(dropped, 1150);
}

TEST(ImpairmentTest, JitterIsGammaWithTheGivenMeanAndNeverNegative) {
  Impairment link(0, milliseconds(5), 2, 7);
  double sum = 0, sq = 0;
  const int n = 100000;
  for (int i = 0; i < n; ++i) {
    const Impairment::Fate f = link.Next();
    ASSERT_FALSE(f.drop);
    ASSERT_GE(f.extra.count(), 0);
    const double ms = static_cast<double>(f.extra.count()) / 1e6;
    sum += ms;
    sq += ms * ms;
  }
  const double mean = sum / n, var = sq / n - mean * mean;
  EXPECT_NEAR(mean, 5.0, 0.1);
  EXPECT_NEAR(var, 12.5, 1.0);  // gamma: mean² / shape
}

TEST(ImpairmentTest, NoLossNoJitterLeavesPacketsAlone) {
  Impairment link(0, Nanos(0), 2, 1);
  EXPECT_FALSE(link.active());
  for (int i = 0; i < 1000; ++i) {
    const Impairment::Fate f = link.Next();
    EXPECT_FALSE(f.drop);
    EXPECT_EQ(f.extra.count(), 0);
  }
}

}  // namespace
}  // namespace ghost::linkemu
