#include "common/cache/shadow_baseline.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

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

// The network card's energy on the shadow, from its meter.
Energy CardEnergy(Machine& m) {
  for (const DeviceEnergy& d : m.pm().meter().Read().devices) {
    if (d.name == m.network().name()) return d.energy;
  }
  return Energy{};
}

TEST_F(ShadowBaselineTest, AMissCarriesTheBytesTheLiveSideExpectsToFetch) {
  // A miss used to reach the shadow with size 0 (the object was not cached, so it had no
  // size): the static cache fetched nothing and the live policy alone paid for every byte.
  // Hand-computed on ipaq-2004's Cisco 350 in PSM (the default policy leaves it there for a
  // single transfer): 1 MiB at 3000 kbit/s is 8388608 / 3e6 = 2.796203 s at 3.0 W instead of
  // the 0.39 W it draws idle, so the card spends (3.0 - 0.39) * 2.796203 = 7.298 J more than
  // 0.39 W * 10 s = 3.9 J. The wait before the first byte: 4 round trips of 40 ms, each reply
  // waiting for the next 100 ms beacon (the clock is on a beacon at 1 s): 0.4 s.
  clock_.AdvanceBy(Seconds(1));
  ObjectState state{.size = k1M};
  ReadDecision live;
  live.source = ReadSource::kNetwork;
  shadow_->Observe(state, live);
  clock_.AdvanceBy(Seconds(9));
  EXPECT_NEAR(CardEnergy(shadow_->machine()).joules(), 0.39 * 10 + (3.0 - 0.39) * 8388608 / 3e6, 0.005);
  ShadowBaseline::Figures f = shadow_->figures();
  EXPECT_NEAR(ToSeconds(f.baseline_waiting), 0.4 + 8388608 / 3e6, 0.001);
  // The live card is in PSM too: the same wait on both sides, nothing saved or lost.
  EXPECT_NEAR(ToSeconds(f.waiting_saved()), 0.0, 0.001);
}

TEST_F(ShadowBaselineTest, AFetchOutsideTheReadsCostsTheShadowTheSameBytes) {
  // A proxy's miss: the live side fetched 1 MiB through "transfer"; the static cache fetches
  // it too. Same card, same hand-computed figure as a read's miss.
  clock_.AdvanceBy(Seconds(1));
  shadow_->ObserveFetch(k1M);
  clock_.AdvanceBy(Seconds(9));
  EXPECT_NEAR(CardEnergy(shadow_->machine()).joules(), 0.39 * 10 + (3.0 - 0.39) * 8388608 / 3e6, 0.005);
  EXPECT_EQ(shadow_->figures().fetched, k1M);
  EXPECT_EQ(shadow_->ToJson()["other_io"]["fetched_b"], k1M);
}

TEST_F(ShadowBaselineTest, AWriteOutsideTheReadsGoesToTheShadowDiskAtOnce) {
  // A local/ file's write or a proxy's fill: the static cache has no write queue. The
  // Microdrive is up (performance-idle) at the start: 1 MiB at 1463 KiB/s plus 68.1 ms of
  // latency is 0.768 s at 1.2 W instead of 0.76 W: 0.338 J more than a shadow that wrote
  // nothing, measured over the first 0.5 s, before either's spin-down timer can differ.
  Result<std::unique_ptr<ShadowBaseline>> idle = ShadowBaseline::Build(clock_, *live_, 8 * k1M);
  ASSERT_TRUE(idle.ok());
  shadow_->ObserveWrite(k1M);
  EXPECT_TRUE(shadow_->machine().storage().has_work());
  clock_.AdvanceBy(Millis(500));
  double extra = shadow_->machine().pm().meter().Read().total.joules() -
                 (*idle)->machine().pm().meter().Read().total.joules();
  EXPECT_NEAR(extra, (1.2 - 0.76) * 0.5, 0.001) << "the disk is writing for all of the 0.5 s";
  EXPECT_EQ(shadow_->figures().written, k1M);
}

TEST_F(ShadowBaselineTest, TodayIsCarriedAcrossRemountsAndRollsAtLocalMidnight) {
  std::string dir = ::testing::TempDir() + "/shadow-today-" + std::to_string(::getpid());
  std::filesystem::create_directories(dir);
  std::string path = dir + "/saved-today.json";
  std::filesystem::remove(path);
  // An earlier mount the same day saved 10 J live against 14 J static, 1 s of waiting
  // against 3 s: today starts with those 4 J (28.6%) and 2 s saved.
  {
    std::ofstream f(path);
    f << R"({"date":"2026-11-25","live_energy_j":10,"baseline_energy_j":14,"live_waiting_s":1,)"
      << R"("baseline_waiting_s":3,"reads":4})";
  }
  std::string date = "2026-11-25";
  ASSERT_TRUE(shadow_->KeepDay(path, [&date] { return date; }).ok());
  ShadowBaseline::Figures t = shadow_->today();
  EXPECT_NEAR(t.saved().joules(), 4.0, 1e-9);
  EXPECT_NEAR(t.percent(), 100.0 * 4 / 14, 1e-9);
  EXPECT_EQ(t.waiting_saved(), Seconds(2));
  EXPECT_EQ(t.reads, 4u);
  // This mount's reads add to it: one miss of 1 MiB observed, as since mount.
  clock_.AdvanceBy(Seconds(1));
  shadow_->Observe(ObjectState{.size = k1M}, ReadDecision{});
  clock_.AdvanceBy(Seconds(9));
  ShadowBaseline::Figures mount = shadow_->figures();
  t = shadow_->today();
  EXPECT_NEAR(t.saved().joules(), 4.0 + mount.saved().joules(), 1e-6);
  EXPECT_EQ(t.reads, 5u);
  nlohmann::json j = shadow_->ToJson();
  EXPECT_EQ(j["today"]["date"], "2026-11-25");
  EXPECT_NE(ShadowBaseline::Sentence(j).find("; today "), std::string::npos);
  // Unmount: saved; a remount the same day carries it.
  ASSERT_TRUE(shadow_->SaveDay().ok());
  {
    Result<std::unique_ptr<ShadowBaseline>> again = ShadowBaseline::Build(clock_, *live_, 8 * k1M);
    ASSERT_TRUE(again.ok());
    ASSERT_TRUE((*again)->KeepDay(path, [&date] { return date; }).ok());
    EXPECT_NEAR((*again)->today().saved().joules(), t.saved().joules(), 1e-3);
    EXPECT_EQ((*again)->today().reads, 5u);
  }
  // Midnight: the next reading starts a new day at zero, and the file says so.
  date = "2026-11-26";
  t = shadow_->today();
  EXPECT_NEAR(t.saved().joules(), 0.0, 1e-9);
  EXPECT_EQ(t.reads, 0u);
  EXPECT_EQ(shadow_->ToJson()["today"]["date"], "2026-11-26");
  std::ifstream f(path);
  EXPECT_EQ(nlohmann::json::parse(f)["date"], "2026-11-26");
  // A remount on a later day does not carry an earlier day's figures.
  date = "2026-11-27";
  Result<std::unique_ptr<ShadowBaseline>> later = ShadowBaseline::Build(clock_, *live_, 8 * k1M);
  ASSERT_TRUE(later.ok());
  ASSERT_TRUE((*later)->KeepDay(path, [&date] { return date; }).ok());
  EXPECT_EQ((*later)->today().reads, 0u);
  std::filesystem::remove_all(dir);
}

// Round 19 (files19): the saved figures of the day are ghostfs's own file, read back at every
// mount. A "reads" of another type threw nlohmann's type_error out of KeepDay (ghostfs aborted
// at every mount that day); a huge figure overflowed Seconds() (undefined behaviour). Now both
// are "not today's saved figures", naming the file, and today starts at zero.
TEST_F(ShadowBaselineTest, DamagedSavedFiguresAreAnErrorNamingTheFileNotAnException) {
  std::string dir = ::testing::TempDir() + "/shadow-damaged-" + std::to_string(::getpid());
  std::filesystem::create_directories(dir);
  std::string path = dir + "/saved-today.json";
  const std::string head = R"({"date":"2026-11-25","live_energy_j":10,"baseline_energy_j":14,"live_waiting_s":1,)";
  for (const std::string& tail : {std::string(R"("baseline_waiting_s":3,"reads":"4"})"),
                                  std::string(R"("baseline_waiting_s":3,"reads":-4})"),
                                  std::string(R"("baseline_waiting_s":1e300,"reads":4})")}) {
    {
      std::ofstream f(path, std::ios::trunc);
      f << head << tail;
    }
    Status s = shadow_->KeepDay(path, [] { return std::string("2026-11-25"); });
    EXPECT_FALSE(s.ok()) << tail;
    EXPECT_NE(s.message().find(path), std::string::npos) << s.ToString();
    EXPECT_EQ(shadow_->today().reads, 0u) << tail;
    EXPECT_NEAR(shadow_->today().saved().joules(), 0.0, 1e-9) << tail;
  }
  std::filesystem::remove_all(dir);
}

TEST(ShadowBaselineSentence, EachFigureSaysWhichWayItWent) {
  nlohmann::json j = {{"energy_j", -0.7}, {"percent", -1.5}, {"waiting_s", 0.9}, {"since_s", 12.0},
                      {"today", {{"energy_j", 2.0}, {"percent", 4.0}, {"waiting_s", -0.25}}}};
  EXPECT_EQ(ShadowBaseline::Sentence(j),
            "spent an extra 0.7 J (1.5%) and saved 0.9 s of waiting since mount (12 s ago); "
            "today saved 2.0 J (4.0%) and added 0.2 s of waiting, against a static cache on the "
            "same reads");
}

}  // namespace
}  // namespace ghost
