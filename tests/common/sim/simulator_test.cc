#include "common/sim/simulator.h"

#include <gtest/gtest.h>

#include <sstream>

#include "common/power/profile.h"
#include "common/sim/trace.h"

namespace ghost {
namespace {

class SimulatorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    Result<MachineProfile> m = LoadMachineProfile("ipaq-2004", GHOST_PROFILE_DIR);
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    machine_ = *m;
  }
  Trace Shipped(const std::string& name) {
    Result<Trace> t = LoadTrace(std::string(GHOST_TRACE_DIR) + "/" + name + ".trace");
    EXPECT_TRUE(t.ok()) << t.status().ToString();
    return t.ok() ? *t : Trace();
  }
  SimResult Run(const Trace& t, Policy policy, int knob = 50, bool hints = true) {
    SimOptions o;
    o.policy = policy;
    o.knob = knob;
    o.ghost_hints = hints;
    Result<SimResult> r = Simulate(machine_, t, o);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? *r : SimResult();
  }
  Trace Parse(const std::string& text) {
    std::istringstream in(text);
    Result<Trace> t = ParseTrace(in, "test.trace");
    EXPECT_TRUE(t.ok()) << t.status().ToString();
    return t.ok() ? *t : Trace();
  }
  MachineProfile machine_;
};

TEST_F(SimulatorTest, IsDeterministic) {
  Trace t = Shipped("web");
  std::string a = ToJson(Run(t, Policy::kAdaptive)).dump();
  std::string b = ToJson(Run(t, Policy::kAdaptive)).dump();
  EXPECT_EQ(a, b);
}

TEST_F(SimulatorTest, AdaptiveBeatsStaticInTimeAndEnergyOnTheWebTrace) {
  Trace t = Shipped("web");
  SimResult s = Run(t, Policy::kStatic);
  SimResult a = Run(t, Policy::kAdaptive);
  EXPECT_EQ(s.requests, t.web.size());
  EXPECT_LT(a.mean_response_ms, s.mean_response_ms);
  EXPECT_LT(a.energy, s.energy);
}

TEST_F(SimulatorTest, AdaptiveBeatsStaticInTimeAndEnergyOnTheMailTrace) {
  Trace t = Shipped("mail");
  SimResult s = Run(t, Policy::kStatic);
  SimResult a = Run(t, Policy::kAdaptive);
  EXPECT_EQ(s.requests, t.mail.size());
  EXPECT_LT(a.mean_response_ms, s.mean_response_ms);
  EXPECT_LT(a.energy, s.energy);
}

TEST_F(SimulatorTest, EnergyNeverFallsBelowTheLowerBound) {
  for (const char* name : {"web", "mail", "web-cached"}) {
    Trace t = Shipped(name);
    for (Policy p : {Policy::kStatic, Policy::kAdaptive}) {
      SimResult r = Run(t, p);
      EXPECT_GT(r.lower_bound, Energy()) << name;
      EXPECT_GE(r.energy, r.lower_bound) << name << " " << PolicyName(p);
    }
  }
}

// The paper's §5.3 claim: raising the knob never substantially raises response time, and
// lowering it never substantially raises energy. "Substantially": more than 5%.
TEST_F(SimulatorTest, KnobSweepTradesTimeForEnergyMonotonically) {
  for (const char* name : {"web", "mail"}) {
    Trace t = Shipped(name);
    std::vector<SimResult> sweep;
    for (int k : {0, 50, 90, 95, 99, 100}) sweep.push_back(Run(t, Policy::kAdaptive, k));
    for (size_t i = 1; i < sweep.size(); ++i) {
      EXPECT_LE(sweep[i].mean_response_ms, sweep[i - 1].mean_response_ms * 1.05)
          << name << " K=" << sweep[i].knob << " is slower than K=" << sweep[i - 1].knob;
      EXPECT_LE(sweep[i - 1].energy.joules(), sweep[i].energy.joules() * 1.05)
          << name << " K=" << sweep[i - 1].knob << " uses more energy than K=" << sweep[i].knob;
    }
    EXPECT_LT(sweep.back().mean_response_ms, sweep.front().mean_response_ms);
    EXPECT_LT(sweep.front().energy, sweep.back().energy);
  }
}

TEST_F(SimulatorTest, GhostHintsNeverSlowTheAllCachedTraceAtHighKnobs) {
  Trace t = Shipped("web-cached");
  for (int k : {90, 95, 99}) {
    SimResult on = Run(t, Policy::kAdaptive, k, true);
    SimResult off = Run(t, Policy::kAdaptive, k, false);
    EXPECT_LE(on.mean_response_ms, off.mean_response_ms) << "K=" << k;
    EXPECT_EQ(off.ghost_hints_sent, 0);
  }
  SimResult on = Run(t, Policy::kAdaptive, 95, true);
  SimResult off = Run(t, Policy::kAdaptive, 95, false);
  EXPECT_GT(on.ghost_hints_sent, 0);
  EXPECT_LT(on.mean_response_ms, off.mean_response_ms * 0.95);
}

TEST_F(SimulatorTest, StaticReadsCachedCopiesAndFetchesTheRest) {
  Trace t = Parse(
      "# ghost-trace web v1\n"
      "0 GET http://o.test/a 10000 1\n"
      "1 GET http://o.test/b 10000 0\n");
  SimResult r = Run(t, Policy::kStatic);
  EXPECT_EQ(r.sources["disk"], 1);
  EXPECT_EQ(r.sources["network"], 1);
  EXPECT_EQ(r.write_batches, 1);  // the fetched object is written at once
  EXPECT_EQ(r.bytes_written, 10000u);
}

TEST_F(SimulatorTest, AdaptiveDefersTheFillUntilTheEndOfTheRun) {
  // The disk is spun down by the time the object arrives; its fill waits in the write queue
  // and is flushed when the run ends, and the flush's energy counts.
  Trace t = Parse(
      "# ghost-trace web v1\n"
      "30 GET http://o.test/b 10000 0\n"
      "60 GET http://o.test/b 10000 0\n");
  SimResult r = Run(t, Policy::kAdaptive);
  EXPECT_EQ(r.sources["network"], 1);
  EXPECT_EQ(r.sources["memory"], 1);  // the second read sees the queued copy
  EXPECT_EQ(r.write_batches, 1);
  EXPECT_GT(r.duration, Seconds(60));
  ASSERT_EQ(r.devices.size(), 2u);
  EXPECT_GE(r.devices[0].transitions, 3);  // down, and up again for the final flush
}

TEST_F(SimulatorTest, ResponseTimeRunsFromStartToLastByte) {
  Trace t = Parse(
      "# ghost-trace web v1\n"
      "0 GET http://o.test/a 32768 1\n");
  SimOptions o;
  o.policy = Policy::kNone;  // disk in performance idle: latency + size / bandwidth
  Result<SimResult> r = Simulate(machine_, t, o);
  ASSERT_TRUE(r.ok());
  const DeviceProfile& disk = *machine_.FindDevice(DeviceKind::kDisk);
  double want = ToMillis(disk.modes[0].io.latency + disk.modes[0].io.read_bandwidth.TimeFor(32768));
  EXPECT_NEAR(r->mean_response_ms, want, 0.01);
}

TEST_F(SimulatorTest, RejectsAKnobOutsideTheRange) {
  SimOptions o;
  o.knob = 101;
  Result<SimResult> r = Simulate(machine_, Trace(), o);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("knob 101"), std::string::npos);
}

TEST_F(SimulatorTest, MailSendUploadsAndFilesACopy) {
  Trace t = Parse(
      "# ghost-trace mail v1\n"
      "0 READ INBOX 1 5000\n"
      "5 SEND INBOX - 20000\n");
  SimResult r = Run(t, Policy::kStatic);
  EXPECT_EQ(r.uploads, 1);
  EXPECT_EQ(r.sources["disk"], 1);
  EXPECT_EQ(r.bytes_written, 20000u);
}

}  // namespace
}  // namespace ghost
