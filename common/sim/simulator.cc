#include "common/sim/simulator.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <functional>
#include <memory>

#include "common/cache/cache_index.h"
#include "common/cache/cache_manager.h"
#include "common/base/clock.h"
#include "common/power/cost_model.h"
#include "common/power/device.h"
#include "common/power/power_manager.h"
#include "common/cache/write_queue.h"

namespace ghost {
namespace {

// One replay: the machine, its policies and the client, on a private virtual clock.
class Run {
 public:
  // Borrows `clock` and `machine` (built on that clock), which must outlive the run.
  Run(VirtualClock& clock, Machine& machine, const SimOptions& options)
      : options_(options),
        clock_(clock),
        machine_(machine),
        pm_(machine.pm()),
        storage_(machine.storage()),
        network_(machine.network()),
        storage_id_(machine.storage_id()),
        network_id_(machine.network_id()),
        cost_(machine.cost()),
        index_(clock_),
        manager_(clock_, machine, CacheManager::Options{.page_cache = options.page_cache}) {
    WriteQueueOptions wq;
    wq.cap = options.write_queue_cap;
    queue_ = std::make_unique<WriteQueue>(
        pm_, storage_id_, wq, [this](std::vector<WriteRecord> batch, std::function<void()> done) {
          Bytes total = 0;
          for (const WriteRecord& r : batch) total += r.length;
          ++write_batches_;
          bytes_written_ += total;
          storage_.Submit({total, /*write=*/true}, std::move(done));
        });
  }

  SimResult Replay(const Trace& trace) {
    Preload(trace);
    std::size_t n = trace.kind == TraceKind::kWeb    ? trace.web.size()
                    : trace.kind == TraceKind::kMail ? trace.mail.size()
                                                     : trace.block.size();
    responses_.reserve(n);
    // The issuer holds itself only weakly (as WriteBack::WriteBatch's runner): the pending
    // request's callbacks hold it until they issued the next one. A strong self-reference was
    // a cycle that outlived the run (LeakSanitizer at ghostsim's exit).
    auto next = std::make_shared<std::function<void(std::size_t)>>();
    bool finished = n == 0;
    *next = [&, self = std::weak_ptr<std::function<void(std::size_t)>>(next), n](std::size_t i) {
      if (i == n) {
        finished = true;
        return;
      }
      TimePoint at = std::max(clock_.Now(), EventTime(trace, i));
      clock_.ScheduleAt(at, [&, next = self.lock(), i] {
        TimePoint start = clock_.Now();
        log_.push_back({start, Duration::zero(), "", 0, ""});
        Issue(trace, i, [&, next, i, start] {
          responses_.push_back(clock_.Now() - start);
          log_[i].response = clock_.Now() - start;
          (*next)(i + 1);
        });
      });
    };
    (*next)(0);
    while (!finished && clock_.RunNext()) {
    }
    // The run ends once every deferred write is on the disk.
    bool flushed = false;
    queue_->FlushAll([&] { flushed = true; });
    while ((!flushed || storage_.has_work()) && clock_.RunNext()) {
    }
    return Report(trace);
  }

 private:
  static TimePoint EventTime(const Trace& t, std::size_t i) {
    switch (t.kind) {
      case TraceKind::kWeb: return t.web[i].time;
      case TraceKind::kMail: return t.mail[i].time;
      case TraceKind::kBlock: return t.block[i].time;
    }
    return TimePoint{};
  }

  static std::string MailKey(const std::string& mailbox, std::uint32_t uid) {
    return "imap:" + mailbox + "/" + std::to_string(uid);
  }

  // Objects in the cache when the trace starts.
  void Preload(const Trace& t) {
    for (const WebRequest& r : t.web) {
      if (r.cached && !index_.Find(r.url)) AddToCache(r.url, r.size);
    }
    for (const MailEvent& e : t.mail) {
      if (e.op == MailEvent::Op::kRead) AddToCache(MailKey(e.mailbox, e.uid), e.size);
    }
  }

  // The simulated cache has no byte cap, so Insert cannot fail or evict.
  void AddToCache(const std::string& key, Bytes size) {
    CacheEntry e;
    e.size = size;
    e.where = Residence::kDisk;
    Result<std::vector<std::string>> evicted = index_.Insert(key, e);
    assert(evicted.ok() && evicted->empty());
    (void)evicted;
  }

  void Issue(const Trace& t, std::size_t i, std::function<void()> done) {
    switch (t.kind) {
      case TraceKind::kWeb: Read(t.web[i].url, t.web[i].size, std::move(done)); break;
      case TraceKind::kMail: {
        const MailEvent& e = t.mail[i];
        if (e.op == MailEvent::Op::kRead) {
          Read(MailKey(e.mailbox, e.uid), e.size, std::move(done));
        } else {
          Upload(e.size, [this, e, i, done = std::move(done)] {
            // The sent copy is filed locally: a background write.
            Fill(MailKey("Sent", static_cast<std::uint32_t>(i + 1)), e.size);
            done();
          });
        }
        break;
      }
      case TraceKind::kBlock: {
        const BlockEvent& e = t.block[i];
        Bytes size = static_cast<Bytes>(e.sectors) * kSectorSize;
        if (e.write) {
          WriteRecord r;
          r.key = "block";
          r.offset = e.sector * kSectorSize;
          r.length = size;
          queue_->Add(std::move(r));
          Note("block", size, "write");
          clock_.ScheduleAfter(Duration::zero(), std::move(done));
        } else {
          ++sources_["disk"];
          Note("block", size, "disk");
          storage_.Submit({size, false}, std::move(done));
        }
        break;
      }
    }
  }

  // A read of a cacheable object: wherever the cache manager decides, as in ghostfs.
  void Read(const std::string& key, Bytes size, std::function<void()> done) {
    const CacheEntry* entry = index_.Find(key);
    if (entry) index_.Touch(key);
    ObjectState state;
    state.size = size;
    // The simulated cache marks a fetched object as on disk at once, and its fill waiting in
    // the write queue as a copy in memory next to it (both costed, as the figures always
    // were); ghostfs sees no committed body until the fill is written (kWriteQueue). Either
    // way a queued object is read from memory.
    state.in_memory = (entry && queue_->Contains(key)) || manager_.InMemory(key);
    state.on_disk = entry && entry->where.Has(Residence::kDisk);
    manager_.Remember(key, size);
    ReadDecision d = manager_.DecideRead(state);
    const char* source = ReadSourceName(d.source);
    ++sources_[source];
    Note(key, size, source);
    switch (d.source) {
      case ReadSource::kMemory:
      case ReadSource::kWriteQueue:
        clock_.ScheduleAfter(CostModel::Options().memory_bandwidth.TimeFor(size), std::move(done));
        return;
      case ReadSource::kDisk:
      case ReadSource::kFlash:
      case ReadSource::kStale:  // never decided (the simulated origin does not fail)
        storage_.Submit({size, false}, std::move(done));
        return;
      case ReadSource::kNetwork:
      case ReadSource::kRevalidate:  // the simulated cache has no expiry
        Transfer({size, false}, [this, key, size, fill = d.queue_fill, done = std::move(done)] {
          if (fill) Fill(key, size);
          done();
        });
        return;
    }
  }

  void Upload(Bytes size, std::function<void()> done) {
    ++uploads_;
    Note("upload", size, "upload");
    Transfer({size, true}, std::move(done));
  }

  // A network transfer; the adaptive application discloses it (transfer hints, DESIGN §3.3).
  void Transfer(IoRequest io, std::function<void()> done) {
    machine_.TransferBegin();
    network_.Submit(io, [this, done = std::move(done)] {
      machine_.TransferEnd();
      done();
    });
  }

  // A fetched object enters the cache: a background write of its body.
  void Fill(const std::string& key, Bytes size) {
    AddToCache(key, size);
    manager_.Remember(key, size);
    WriteRecord r;
    r.key = key;
    r.length = size;
    queue_->Add(std::move(r));
  }

  // Describes the request being issued (the last one logged).
  void Note(const std::string& key, Bytes size, const char* source) {
    RequestRecord& r = log_.back();
    r.key = key;
    r.size = size;
    r.source = source;
  }

  SimResult Report(const Trace& trace) {
    SimResult r;
    r.profile = machine_.profile().name;
    r.trace = trace.name;
    r.policy = PolicyName(options_.policy);
    r.disk_policy = machine_.DiskPolicyName();
    r.knob = options_.knob;
    r.ghost_hints = options_.policy == Policy::kAdaptive && options_.ghost_hints;
    r.requests = responses_.size();
    if (!responses_.empty()) {
      double sum = 0;
      for (Duration d : responses_) sum += ToMillis(d);
      r.mean_response_ms = sum / responses_.size();
      std::vector<Duration> sorted = responses_;
      std::sort(sorted.begin(), sorted.end());
      std::size_t rank = static_cast<std::size_t>(std::ceil(0.95 * sorted.size()));
      r.p95_response_ms = ToMillis(sorted[std::max<std::size_t>(rank, 1) - 1]);
    }
    EnergyReport e = pm_.meter().Read();
    r.energy = e.total;
    r.base_energy = e.base;
    r.duration = e.elapsed;
    r.devices = DeviceResults(pm_, e);
    r.ghost_hints_sent = cost_.hints_sent();
    r.sources = sources_;
    r.uploads = uploads_;
    r.write_batches = write_batches_;
    r.bytes_written = bytes_written_;
    r.log = std::move(log_);
    return r;
  }

  SimOptions options_;
  VirtualClock& clock_;
  Machine& machine_;
  PowerManager& pm_;
  Device& storage_;
  Device& network_;
  DeviceId storage_id_ = -1;
  DeviceId network_id_ = -1;
  CostModel& cost_;
  CacheIndex index_;
  CacheManager manager_;  // the read decision and the page-cache model
  std::unique_ptr<WriteQueue> queue_;
  std::vector<Duration> responses_;
  std::vector<RequestRecord> log_;
  std::map<std::string, int> sources_;
  int uploads_ = 0;
  int write_batches_ = 0;
  Bytes bytes_written_ = 0;
};

double Round(double v, double unit) { return std::round(v / unit) * unit; }

}  // namespace

namespace {

MachineOptions MachineOptionsFor(const SimOptions& o) {
  MachineOptions m;
  m.policy = o.policy;
  m.knob = o.knob;
  m.ghost_hints = o.ghost_hints;
  m.disk_policy = o.disk_policy;
  return m;
}

// One replay on a fresh machine and virtual clock.
Result<SimResult> ReplayOn(const MachineProfile& profile, const Trace& trace, const SimOptions& options) {
  VirtualClock clock;
  Result<std::unique_ptr<Machine>> machine = Machine::Build(clock, profile, MachineOptionsFor(options));
  if (!machine.ok()) return machine.status();
  Run run(clock, **machine, options);
  return run.Replay(trace);
}

}  // namespace

Result<SimResult> Simulate(const MachineProfile& machine, const Trace& trace, const SimOptions& options) {
  Result<SimResult> result = ReplayOn(machine, trace, options);
  if (!result.ok()) return result.status();
  if (options.compute_lower_bound) {
    // DESIGN §7: every device in its lowest mode, plus base power, over the duration of the
    // run without power management.
    SimOptions none = options;
    none.policy = Policy::kNone;
    VirtualClock clock;
    Result<std::unique_ptr<Machine>> floor = Machine::Build(clock, machine, MachineOptionsFor(none));
    if (!floor.ok()) return floor.status();
    Run baseline(clock, **floor, none);
    SimResult b = baseline.Replay(trace);
    result->lower_bound = (*floor)->FloorPower() * b.duration;
  }
  return result;
}

nlohmann::ordered_json ToJson(const SimResult& r) {
  nlohmann::ordered_json j;
  j["profile"] = r.profile;
  j["trace"] = r.trace;
  j["policy"] = r.policy;
  j["disk_policy"] = r.disk_policy;
  j["knob"] = r.knob;
  j["ghost_hints"] = r.ghost_hints;
  j["requests"] = r.requests;
  j["mean_response_ms"] = Round(r.mean_response_ms, 0.01);
  j["p95_response_ms"] = Round(r.p95_response_ms, 0.01);
  j["energy_j"] = Round(r.energy.joules(), 0.001);
  j["lower_bound_j"] = Round(r.lower_bound.joules(), 0.001);
  j["base_energy_j"] = Round(r.base_energy.joules(), 0.001);
  j["duration_s"] = Round(ToSeconds(r.duration), 0.001);
  j["ghost_hints_sent"] = r.ghost_hints_sent;
  nlohmann::ordered_json sources = nlohmann::ordered_json::object();
  for (const char* s : {"memory", "disk", "network"}) {
    auto it = r.sources.find(s);
    sources[s] = it == r.sources.end() ? 0 : it->second;
  }
  j["sources"] = sources;
  j["uploads"] = r.uploads;
  j["write_batches"] = r.write_batches;
  j["bytes_written"] = r.bytes_written;
  j["devices"] = DevicesToJson(r.devices);
  return j;
}

}  // namespace ghost
