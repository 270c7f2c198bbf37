#include "common/cache/cache_manager.h"

#include <gtest/gtest.h>

#include "common/base/clock.h"
#include "common/power/machine.h"
#include "common/power/profile.h"

namespace ghost {
namespace {

constexpr Bytes k4K = 4 * 1024;
constexpr Bytes k1M = 1024 * 1024;

// The ipaq-2004 machine without device policies, so a test puts the disk in the mode it
// wants and it stays there while the manager decides.
class CacheManagerTest : public ::testing::Test {
 protected:
  void Build(Policy policy, int knob = 50, bool hints = true, Bytes page_cache = 8 * k1M) {
    Result<MachineProfile> p = LoadMachineProfile("ipaq-2004", GHOST_PROFILE_DIR);
    ASSERT_TRUE(p.ok()) << p.status().ToString();
    MachineOptions o;
    o.policy = policy;
    o.knob = knob;
    o.ghost_hints = hints;
    o.power_management = false;
    Result<std::unique_ptr<Machine>> m = Machine::Build(clock_, *p, o);
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    machine_ = std::move(m).value();
    manager_ = std::make_unique<CacheManager>(clock_, *machine_,
                                              CacheManager::Options{.page_cache = page_cache});
  }
  // Spins the disk down to its lowest mode (standby) and waits for the transition.
  void SpinDown() {
    Device& disk = machine_->storage();
    disk.RequestMode(disk.profile().LowestMode());
    clock_.AdvanceBy(Seconds(30));
    ASSERT_EQ(disk.mode(), disk.profile().LowestMode());
  }
  // The card in its fast mode (CAM), so the network is quick to answer.
  void WakeNetwork() {
    Device& net = machine_->network();
    net.RequestMode(net.profile().HighPowerMode());
    clock_.AdvanceBy(Seconds(5));
    ASSERT_EQ(net.mode(), net.profile().HighPowerMode());
  }
  static ObjectState OnDisk(Bytes size, bool fresh = true) {
    ObjectState s;
    s.size = size;
    s.on_disk = true;
    s.fresh = fresh;
    return s;
  }

  VirtualClock clock_;
  std::unique_ptr<Machine> machine_;
  std::unique_ptr<CacheManager> manager_;
};

TEST_F(CacheManagerTest, AFillInTheWriteQueueIsReadFromMemoryWithoutCosting) {
  for (Policy p : {Policy::kStatic, Policy::kAdaptive}) {
    Build(p);
    ObjectState s;
    s.size = k1M;
    s.in_write_queue = true;
    ReadDecision d = manager_->DecideRead(s);
    EXPECT_EQ(d.source, ReadSource::kWriteQueue) << PolicyName(p);
    EXPECT_FALSE(d.costed);
    EXPECT_FALSE(d.queue_fill);
    EXPECT_STREQ(ReadSourceName(d.source), "memory");
  }
}

TEST_F(CacheManagerTest, AnUncachedObjectComesFromTheNetworkAndFillsTheCache) {
  for (Policy p : {Policy::kStatic, Policy::kAdaptive, Policy::kNone}) {
    Build(p);
    ObjectState s;
    s.size = k4K;
    s.in_memory = true;  // a RAM copy without a cached body is not a holder
    ReadDecision d = manager_->DecideRead(s);
    EXPECT_EQ(d.source, ReadSource::kNetwork) << PolicyName(p);
    EXPECT_TRUE(d.queue_fill);
    EXPECT_FALSE(d.costed);
  }
}

TEST_F(CacheManagerTest, AStaleCopyIsRevalidated) {
  Build(Policy::kAdaptive);
  ReadDecision d = manager_->DecideRead(OnDisk(k4K, /*fresh=*/false));
  EXPECT_EQ(d.source, ReadSource::kRevalidate);
  EXPECT_FALSE(d.queue_fill);
  EXPECT_FALSE(IsLocal(d.source));
}

TEST_F(CacheManagerTest, StaticReadsTheCachedCopyEvenWhenTheDiskSleeps) {
  Build(Policy::kStatic, /*knob=*/100);
  SpinDown();
  WakeNetwork();
  ReadDecision d = manager_->DecideRead(OnDisk(k4K));
  EXPECT_EQ(d.source, ReadSource::kDisk);
  ASSERT_TRUE(d.costed);
  // The estimates are there for user.ghost.cost, but static sends no hint.
  EXPECT_EQ(d.choice.candidates.size(), 2u);
  EXPECT_FALSE(d.choice.hinted);
  EXPECT_EQ(machine_->cost().hints_sent(), 0);
}

TEST_F(CacheManagerTest, StaticPrefersTheRamCopy) {
  Build(Policy::kStatic);
  ObjectState s = OnDisk(k4K);
  s.in_memory = true;
  EXPECT_EQ(manager_->DecideRead(s).source, ReadSource::kMemory);
}

TEST_F(CacheManagerTest, AdaptiveReadsTheSpinningDisk) {
  Build(Policy::kAdaptive, /*knob=*/50);
  ReadDecision d = manager_->DecideRead(OnDisk(k1M));
  EXPECT_EQ(d.source, ReadSource::kDisk);
  EXPECT_TRUE(d.costed);
  EXPECT_FALSE(d.choice.hinted);
}

TEST_F(CacheManagerTest, AdaptiveGoesToTheNetworkWhenTheDiskSleepsAndHintsTheDisk) {
  Build(Policy::kAdaptive, /*knob=*/100);
  SpinDown();
  WakeNetwork();
  ReadDecision d = manager_->DecideRead(OnDisk(k4K));
  EXPECT_EQ(d.source, ReadSource::kNetwork);
  EXPECT_FALSE(d.queue_fill);  // the cached copy stays as it is
  ASSERT_TRUE(d.costed);
  EXPECT_EQ(d.choice.ideal.holder.device, machine_->storage_id());
  EXPECT_TRUE(d.choice.hinted);
  EXPECT_EQ(machine_->pm().ghost_hints_received(machine_->storage_id()), 1);
}

TEST_F(CacheManagerTest, AdaptiveWithoutGhostHintsSendsNone) {
  Build(Policy::kAdaptive, /*knob=*/100, /*hints=*/false);
  SpinDown();
  WakeNetwork();
  ReadDecision d = manager_->DecideRead(OnDisk(k4K));
  EXPECT_EQ(d.source, ReadSource::kNetwork);
  EXPECT_FALSE(d.choice.hinted);
  EXPECT_EQ(machine_->pm().ghost_hints_received(machine_->storage_id()), 0);
}

TEST_F(CacheManagerTest, AdaptiveTakesTheRamCopyOverASleepingDisk) {
  Build(Policy::kAdaptive, /*knob=*/50);
  SpinDown();
  ObjectState s = OnDisk(k1M);
  s.in_memory = true;
  ReadDecision d = manager_->DecideRead(s);
  EXPECT_EQ(d.source, ReadSource::kMemory);
  EXPECT_EQ(d.choice.candidates.size(), 3u);
}

TEST_F(CacheManagerTest, PageCacheModelKeepsRecentCopiesWithinItsCap) {
  Build(Policy::kAdaptive, 50, true, /*page_cache=*/2 * k1M);
  manager_->Remember("a", k1M);
  manager_->Remember("b", k1M);
  EXPECT_TRUE(manager_->InMemory("a"));  // a is now the most recently used
  manager_->Remember("c", k1M);          // evicts b
  EXPECT_FALSE(manager_->InMemory("b"));
  EXPECT_TRUE(manager_->InMemory("a"));
  EXPECT_TRUE(manager_->InMemory("c"));
  manager_->Remember("huge", 3 * k1M);  // larger than the cap: not kept, evicts nothing
  manager_->Remember("empty", 0);
  EXPECT_FALSE(manager_->InMemory("huge"));
  EXPECT_FALSE(manager_->InMemory("empty"));
  EXPECT_TRUE(manager_->InMemory("a"));
  EXPECT_EQ(manager_->ForgetMemory(), 2u);
  EXPECT_FALSE(manager_->InMemory("a"));
}

TEST_F(CacheManagerTest, DisabledPageCacheModelHoldsNothing) {
  Build(Policy::kAdaptive, 50, true, /*page_cache=*/0);
  manager_->Remember("a", k4K);
  EXPECT_FALSE(manager_->InMemory("a"));
}

TEST(ReadSourceTest, NamesAreWhatTheEdgesPrint) {
  EXPECT_STREQ(ReadSourceName(ReadSource::kMemory), "memory");
  EXPECT_STREQ(ReadSourceName(ReadSource::kWriteQueue), "memory");
  EXPECT_STREQ(ReadSourceName(ReadSource::kDisk), "disk");
  EXPECT_STREQ(ReadSourceName(ReadSource::kNetwork), "network");
  EXPECT_STREQ(ReadSourceName(ReadSource::kFlash), "flash");
  EXPECT_TRUE(IsLocal(ReadSource::kWriteQueue));
  EXPECT_FALSE(IsLocal(ReadSource::kNetwork));
}

}  // namespace
}  // namespace ghost
