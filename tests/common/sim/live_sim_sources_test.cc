// The acceptance test of "one cache manager, two clocks": a trace replayed through ghostsim
// and through the live daemon's read path on a virtual clock gets the same source for every
// request.
//
// The live side is driven the way ghostfs drives it under scripts/replay (ghostproxy's
// "lookup" in fs/store_tree.cc): the Machine built as Daemon::LoadMachine builds it, the
// CacheManager with the daemon's page-cache model, a write queue whose writer commits fills
// to the index only once the emulated disk has written them (so a queued fill is the
// kWriteQueue holder, and a lookup of a fill being written waits for it, as
// Daemon::WhenFillSettles does), and a miss fetched by the proxy and handed over as a fill.
#include <gtest/gtest.h>

#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "common/base/clock.h"
#include "common/cache/cache_index.h"
#include "common/cache/cache_manager.h"
#include "common/cache/write_queue.h"
#include "common/power/machine.h"
#include "common/power/profile.h"
#include "common/sim/simulator.h"
#include "common/sim/trace.h"

namespace ghost {
namespace {

// ghostfs's defaults (common/config/config.h, fs/ghostfs_internal.h).
constexpr Bytes kWriteQueueCap = 4 * 1024 * 1024;
constexpr Bytes kPageCacheModelBytes = 8 * 1024 * 1024;

class LiveReplay {
 public:
  LiveReplay(const MachineProfile& profile, Policy policy, int knob) {
    MachineOptions mo;  // as Daemon::LoadMachine, with --profile
    mo.policy = policy;
    mo.knob = knob;
    mo.ghost_hints = true;
    mo.power_management = true;
    Result<std::unique_ptr<Machine>> m = Machine::Build(clock_, profile, mo);
    EXPECT_TRUE(m.ok()) << m.status().ToString();
    machine_ = std::move(m).value();
    manager_ = std::make_unique<CacheManager>(
        clock_, *machine_, CacheManager::Options{.page_cache = kPageCacheModelBytes});
    WriteQueueOptions wq;
    wq.cap = kWriteQueueCap;
    queue_ = std::make_unique<WriteQueue>(
        machine_->pm(), machine_->storage_id(), wq,
        [this](std::vector<WriteRecord> batch, std::function<void()> done) {
          Bytes total = 0;
          for (const WriteRecord& r : batch) {
            total += r.length;
            writing_.insert(r.key);
          }
          machine_->storage().Submit({total, /*write=*/true}, [this, batch, done] {
            for (const WriteRecord& r : batch) Commit(r.key.substr(5), r.length);
            for (const WriteRecord& r : batch) writing_.erase(r.key);
            done();
            Settled();
          });
        });
  }

  std::vector<std::string> Replay(const Trace& t) {
    for (const WebRequest& r : t.web) {
      if (r.cached) Commit(r.url, r.size);
    }
    std::vector<std::string> sources(t.web.size());
    auto next = std::make_shared<std::function<void(std::size_t)>>();
    bool finished = t.web.empty();
    // Held weakly by itself, strongly by the pending request (as the simulator's Replay).
    *next = [&, self = std::weak_ptr<std::function<void(std::size_t)>>(next)](std::size_t i) {
      if (i == t.web.size()) {
        finished = true;
        return;
      }
      clock_.ScheduleAt(std::max(clock_.Now(), t.web[i].time), [&, next = self.lock(), i] {
        Lookup(t.web[i], &sources[i], [next, i] { (*next)(i + 1); });
      });
    };
    (*next)(0);
    while (!finished && clock_.RunNext()) {
    }
    return sources;
  }

 private:
  // The store's "lookup" of `r.url` and the proxy's read that follows it.
  void Lookup(const WebRequest& r, std::string* source, std::function<void()> done) {
    std::string fill = "fill:" + r.url;
    const CacheEntry* e = index_.Find(r.url);
    if (!e && writing_.count(fill)) {
      // Being written: the daemon answers once the fill settles.
      waiting_.push_back([this, r, source, done] { Lookup(r, source, done); });
      return;
    }
    if (e) index_.Touch(r.url);
    ObjectState s;
    s.on_disk = e != nullptr;
    s.in_write_queue = !e && queue_->Contains(fill);
    s.in_memory = manager_->InMemory(r.url);
    s.size = r.size;
    if (!s.on_disk && !s.in_write_queue) {
      // Not cached: the proxy fetches it (a disclosed transfer) and stores it.
      *source = "network";
      return Fetch(r.size, [this, r, done] {
        WriteRecord w;
        w.key = "fill:" + r.url;
        w.length = r.size;
        manager_->Remember(r.url, r.size);
        queue_->Add(std::move(w));
        done();
      });
    }
    manager_->Remember(r.url, r.size);
    ReadDecision d = manager_->DecideRead(s);
    *source = ReadSourceName(d.source);
    switch (d.source) {
      case ReadSource::kMemory:
      case ReadSource::kWriteQueue:
        clock_.ScheduleAfter(CostModel::Options().memory_bandwidth.TimeFor(r.size), std::move(done));
        return;
      case ReadSource::kDisk:
      case ReadSource::kFlash:
      case ReadSource::kStale:  // never decided
        machine_->storage().Submit({r.size, false}, std::move(done));
        return;
      case ReadSource::kNetwork:
      case ReadSource::kRevalidate:
        Fetch(r.size, std::move(done));
        return;
    }
  }

  void Fetch(Bytes size, std::function<void()> done) {
    machine_->TransferBegin();
    machine_->network().Submit({size, false}, [this, done = std::move(done)] {
      machine_->TransferEnd();
      done();
    });
  }

  void Commit(const std::string& key, Bytes size) {
    CacheEntry e;
    e.size = size;
    e.where = Residence::kDisk;
    (void)index_.Insert(key, e);
  }

  void Settled() {
    auto waiting = std::move(waiting_);
    waiting_.clear();
    for (auto& fn : waiting) fn();
  }

  VirtualClock clock_;
  std::unique_ptr<Machine> machine_;
  std::unique_ptr<CacheManager> manager_;
  std::unique_ptr<WriteQueue> queue_;
  CacheIndex index_{clock_};
  std::set<std::string> writing_;
  std::vector<std::function<void()>> waiting_;
};

class LiveSimSourcesTest : public ::testing::TestWithParam<const char*> {
 protected:
  void Check(const std::string& trace_name, Policy policy, int knob) {
    Result<MachineProfile> profile = LoadMachineProfile(GetParam(), GHOST_PROFILE_DIR);
    ASSERT_TRUE(profile.ok()) << profile.status().ToString();
    Result<Trace> t = LoadTrace(std::string(GHOST_TRACE_DIR) + "/" + trace_name + ".trace");
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    SimOptions so;
    so.policy = policy;
    so.knob = knob;
    so.compute_lower_bound = false;
    Result<SimResult> sim = Simulate(*profile, *t, so);
    ASSERT_TRUE(sim.ok()) << sim.status().ToString();
    LiveReplay live(*profile, policy, knob);
    std::vector<std::string> sources = live.Replay(*t);
    ASSERT_EQ(sim->log.size(), sources.size());
    int differ = 0;
    for (std::size_t i = 0; i < sources.size(); ++i) {
      if (sim->log[i].source != sources[i] && ++differ <= 5) {
        ADD_FAILURE() << trace_name << " " << PolicyName(policy) << " K=" << knob << " request " << i
                      << " (" << sim->log[i].key << "): ghostsim " << sim->log[i].source
                      << ", daemon " << sources[i];
      }
    }
    EXPECT_EQ(differ, 0);
    // Both sides used more than one source, or the comparison says little.
    std::set<std::string> used(sources.begin(), sources.end());
    EXPECT_GE(used.size(), 2u);
  }
};

TEST_P(LiveSimSourcesTest, WebTraceStatic) { Check("web", Policy::kStatic, 50); }
TEST_P(LiveSimSourcesTest, WebTraceAdaptive) {
  for (int k : {0, 50, 95, 100}) Check("web", Policy::kAdaptive, k);
}
TEST_P(LiveSimSourcesTest, CachedWebTraceStatic) { Check("web-cached", Policy::kStatic, 50); }
TEST_P(LiveSimSourcesTest, CachedWebTraceAdaptive) {
  for (int k : {0, 50, 95, 100}) Check("web-cached", Policy::kAdaptive, k);
}

INSTANTIATE_TEST_SUITE_P(Profiles, LiveSimSourcesTest, ::testing::Values("ipaq-2004", "laptop-hdd"));

}  // namespace
}  // namespace ghost
