#include "common/cache/shadow_baseline.h"

#include <gtest/gtest.h>

#include "common/base/clock.h"
#include "common/power/machine.h"
#include "common/power/profile.h"

namespace ghost {
namespace {

constexpr Bytes k1M = 1024 * 1024;

// A live adaptive ipaq-2004 machine and the static shadow beside it, on one virtual clock. The
// tests call Observe with the live decisions and submit no live I/O, so whatever the shadow
// spends beyond the live machine is the shadow's own I/O.
class ShadowBaselineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    Result<MachineProfile> p = LoadMachineProfile("ipaq-2004", GHOST_PROFILE_DIR);
    ASSERT_TRUE(p.ok()) << p.status().ToString();
    MachineOptions o;
    o.policy = Policy::kAdaptive;
    Result<std::unique_ptr<Machine>> m = Machine::Build(clock_, *p, o);
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    live_ = std::move(m).value();
    Result<std::unique_ptr<ShadowBaseline>> s = ShadowBaseline::Build(clock_, *live_, 8 * k1M);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    shadow_ = std::move(s).value();
  }
  VirtualClock clock_;
  std::unique_ptr<Machine> live_;
  std::unique_ptr<ShadowBaseline> shadow_;
};

TEST_F(ShadowBaselineTest, TheShadowIsAStaticMachineOfTheSameProfile) {
  EXPECT_EQ(shadow_->machine().policy(), Policy::kStatic);
  EXPECT_EQ(shadow_->machine().profile().name, live_->profile().name);
}

TEST_F(ShadowBaselineTest, CountsTheDiskReadsTheStaticCacheMakesAndTheLivePolicyAvoided) {
  // The live policy served the cached object from the network (its disk asleep); the static
  // cache reads its cached copy, spinning its disk up each time after it spun down.
  ObjectState state{.size = k1M, .on_disk = true};
  ReadDecision live;
  live.source = ReadSource::kNetwork;
  for (int i = 0; i < 5; ++i) {
    clock_.AdvanceBy(Seconds(60));  // the default disk policy is in standby by now
    shadow_->Observe(state, live);
  }
  clock_.AdvanceBy(Seconds(60));
  ShadowBaseline::Figures f = shadow_->figures();
  EXPECT_EQ(f.reads, 5u);
  EXPECT_GT(f.baseline_waiting, Seconds(1)) << "five spin-ups and reads of 1 MiB";
  EXPECT_GT(f.live_waiting, Duration::zero()) << "the network reads the live policy chose";
  // Only the shadow's devices did any work here.
  EXPECT_GT(f.baseline_energy.joules(), f.live_energy.joules());
  EXPECT_GT(f.saved().joules(), 0);
  EXPECT_GT(f.percent(), 0);
  nlohmann::json j = shadow_->ToJson();
  EXPECT_EQ(j["baseline"], "static");
  EXPECT_EQ(j["reads"], 5);
  EXPECT_NE(ShadowBaseline::Sentence(j).find("saved"), std::string::npos);
}

TEST_F(ShadowBaselineTest, ReadsFromMemoryWaitForNothingOnEitherSide) {
  ObjectState state{.size = 4096, .in_memory = true, .on_disk = true};
  ReadDecision live;
  live.source = ReadSource::kMemory;
  shadow_->Observe(state, live);
  ShadowBaseline::Figures f = shadow_->figures();
  EXPECT_EQ(f.live_waiting, Duration::zero());
  EXPECT_EQ(f.baseline_waiting, Duration::zero());
}

TEST_F(ShadowBaselineTest, AFetchedObjectIsWrittenToTheShadowDiskAtOnce) {
  ObjectState state{.size = k1M};  // not cached anywhere: both fetch it
  ReadDecision live;
  live.source = ReadSource::kNetwork;
  live.queue_fill = true;
  EnergyReport before = shadow_->machine().pm().meter().Read();
  shadow_->Observe(state, live);
  EXPECT_TRUE(shadow_->machine().storage().has_work()) << "the static cache writes the fill now";
  EXPECT_TRUE(shadow_->machine().network().has_work());
  clock_.AdvanceBy(Seconds(30));
  EXPECT_GT(shadow_->machine().pm().meter().Read().total.joules(), before.total.joules());
}

}  // namespace
}  // namespace ghost
