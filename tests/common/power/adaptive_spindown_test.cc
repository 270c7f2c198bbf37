#include "common/power/adaptive_spindown.h"

#include <gtest/gtest.h>

#include <memory>

#include "common/base/clock.h"
#include "common/power/device.h"
#include "common/power/power_manager.h"
#include "common/power/profile.h"

namespace ghost {
namespace {

constexpr int kStandby = 2;
constexpr Power kBase = Power::Milliwatts(1440);

class AdaptiveSpindownTest : public ::testing::Test {
 protected:
  void SetUp() override {
    Result<DeviceProfile> p = LoadDeviceProfile("microdrive-1gb", GHOST_PROFILE_DIR);
    ASSERT_TRUE(p.ok()) << p.status().ToString();
    profile_ = *p;
  }

  void Start(int knob = 50, const ExpertsOptions& options = ExpertsOptions()) {
    disk_ = std::make_unique<Device>(clock_, profile_, nullptr, 0);
    pm_ = std::make_unique<PowerManager>(clock_, kBase, knob);
    auto policy = std::make_unique<ExpertsDiskPolicy>(options);
    policy_ = policy.get();
    pm_->Register(disk_.get(), std::move(policy));
  }

  // Submits a 32 KiB read and runs the clock until it completes; returns the completion time.
  TimePoint RunIo() {
    bool done = false;
    TimePoint end{};
    disk_->Submit({32 * 1024, false}, [&] {
      done = true;
      end = clock_.Now();
    });
    while (!done && clock_.RunNext()) {
    }
    EXPECT_TRUE(done);
    return end;
  }

  // `n` I/Os, each arriving `gap` after the previous one completed.
  void RunWorkload(int n, Duration gap) {
    for (int i = 0; i < n; ++i) {
      TimePoint end = RunIo();
      clock_.RunUntil(end + gap);
    }
  }

  VirtualClock clock_;
  DeviceProfile profile_;
  std::unique_ptr<Device> disk_;  // outlives pm_, which owns the policy
  std::unique_ptr<PowerManager> pm_;
  ExpertsDiskPolicy* policy_ = nullptr;
};

TEST_F(AdaptiveSpindownTest, ExpertsStartWithEqualWeightsOnGeometricTimeouts) {
  ExpertsDiskPolicy policy;
  ASSERT_EQ(policy.timeouts().size(), 25u);
  EXPECT_EQ(policy.timeouts().front(), Millis(10));
  EXPECT_EQ(policy.timeouts()[23], Seconds(60));
  EXPECT_EQ(policy.timeouts().back(), Duration::max());  // "never"
  const double ratio = ToSeconds(policy.timeouts()[1]) / ToSeconds(policy.timeouts()[0]);
  EXPECT_NEAR(ToSeconds(policy.timeouts()[12]) / ToSeconds(policy.timeouts()[11]), ratio, 1e-3);
  for (double w : policy.weights()) EXPECT_DOUBLE_EQ(w, 1.0 / 25);
  EXPECT_TRUE(policy.DefersBackgroundWrites());
  policy.AssertInvariants();
}

TEST_F(AdaptiveSpindownTest, SpinsDownToTheDeepestModeAfterTheWeightedTimeout) {
  Start();
  const Duration timeout = policy_->CurrentTimeout();
  // Equal weights: the plain mean of the 24 finite timeouts.
  double mean = 0;
  for (int i = 0; i < 24; ++i) mean += ToSeconds(policy_->timeouts()[i]) / 24;
  EXPECT_NEAR(ToSeconds(timeout), mean, 1e-5);

  TimePoint end = RunIo();
  clock_.RunUntil(end + timeout - Millis(1));
  EXPECT_EQ(disk_->target_mode(), 0);
  clock_.RunUntil(end + timeout + Millis(1));
  EXPECT_EQ(disk_->target_mode(), kStandby);  // straight to standby, not low-power idle
  clock_.RunUntil(end + timeout + Millis(321));
  EXPECT_EQ(disk_->mode(), kStandby);
  EXPECT_EQ(pm_->meter().Read().devices[0].transitions, 1);
}

TEST_F(AdaptiveSpindownTest, ConvergesToShortTimeoutsForLongGaps) {
  Start();
  const Duration initial = policy_->CurrentTimeout();
  RunWorkload(300, Seconds(120));
  EXPECT_EQ(policy_->periods_learned(), 299);  // the first I/O ends no idle period
  const Duration learned = policy_->CurrentTimeout();
  EXPECT_LT(learned, Seconds(1));
  EXPECT_LT(learned * 5, initial);
  // The weight sits on the short timeouts now.
  double short_weight = 0;
  for (std::size_t i = 0; i < policy_->timeouts().size(); ++i) {
    if (policy_->timeouts()[i] < Seconds(1)) short_weight += policy_->weights()[i];
  }
  EXPECT_GT(short_weight, 0.7);
  policy_->AssertInvariants();
}

TEST_F(AdaptiveSpindownTest, ConvergesToLongTimeoutsForShortGaps) {
  Start();
  const Duration initial = policy_->CurrentTimeout();
  RunWorkload(300, Seconds(2));
  const Duration learned = policy_->CurrentTimeout();
  EXPECT_GT(learned, Seconds(10));
  EXPECT_GT(learned, initial);
  // The experts that spin down within a 2 s gap held 15/25 of the weight; they lost it.
  double short_weight = 0;
  for (std::size_t i = 0; i < policy_->timeouts().size(); ++i) {
    if (policy_->timeouts()[i] < Seconds(2)) short_weight += policy_->weights()[i];
  }
  EXPECT_LT(short_weight, 0.1);
  EXPECT_EQ(disk_->mode(), 0);  // and the disk no longer spins down between the I/Os
  policy_->AssertInvariants();
}

TEST_F(AdaptiveSpindownTest, FollowsAWorkloadChange) {
  Start();
  RunWorkload(300, Seconds(120));
  const Duration after_long = policy_->CurrentTimeout();
  RunWorkload(150, Seconds(2));
  EXPECT_GT(policy_->CurrentTimeout(), after_long * 4);
  EXPECT_GT(policy_->CurrentTimeout(), Seconds(2));
}

TEST_F(AdaptiveSpindownTest, AnIdlePeriodEndedByASpinUpTeachesItsTrueLength) {
  Start();
  TimePoint end = RunIo();
  clock_.RunUntil(end + Seconds(30));
  ASSERT_EQ(disk_->mode(), kStandby);  // spun down after ≈ 7.9 s
  RunIo();                             // arrives 30 s after `end`, waits 820 ms to spin up
  ASSERT_EQ(policy_->periods_learned(), 1);

  // The same lesson given directly.
  VirtualClock clock;
  Device disk(clock, profile_, nullptr, 0);
  PowerManager pm(clock, kBase, 50);
  auto reference = std::make_unique<ExpertsDiskPolicy>();
  ExpertsDiskPolicy* ref = reference.get();
  pm.Register(&disk, std::move(reference));
  ref->Learn(Seconds(30));
  for (std::size_t i = 0; i < ref->weights().size(); ++i) {
    EXPECT_NEAR(policy_->weights()[i], ref->weights()[i], 1e-12) << "expert " << i;
  }
}

TEST_F(AdaptiveSpindownTest, Knob100NeverSpinsDown) {
  Start(100);
  EXPECT_EQ(policy_->CurrentTimeout(), Duration::max());
  EXPECT_NE(policy_->WeightedTimeout(), Duration::max());
  TimePoint end = RunIo();
  clock_.RunUntil(end + Seconds(3600));
  EXPECT_EQ(disk_->mode(), 0);
  EXPECT_EQ(pm_->meter().Read().devices[0].transitions, 0);
  EXPECT_EQ(policy_->Describe(), "experts-disk K=100: never spins down (25 experts, 0 periods)");
}

TEST_F(AdaptiveSpindownTest, AtKnob100TheNeverExpertWins) {
  // Only delay counts at K = 100: an expert that spins down within a gap loses, the others
  // do not, and "never" never loses.
  Start(100);
  for (int i = 0; i < 200; ++i) policy_->Learn(Seconds(30 + i % 50));
  EXPECT_GT(policy_->weights().back(), policy_->weights().front() * 100);
  pm_->SetKnob(99);
  EXPECT_GT(policy_->CurrentTimeout(), Seconds(30));
}

}  // namespace
}  // namespace ghost
