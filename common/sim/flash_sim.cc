#include "common/sim/flash_sim.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <random>

namespace ghost {

namespace {

// The disk rule of flash_sim.h, accounting its energy as it goes.
class DiskTimeline {
 public:
  explicit DiskTimeline(const DeviceProfile& d, Duration spin_down)
      : d_(d), io_(d.modes[0].io), spin_down_(spin_down),
        up_(d.TransitionCost(d.LowestMode(), 0)), down_(d.TransitionCost(0, d.LowestMode())) {}

  // Brings the disk to serving at or after `t`; returns when it can start and whether it spun
  // up.
  TimePoint Ready(TimePoint t, bool* spun_up) {
    TimePoint start = std::max(t, free_);
    *spun_up = false;
    if (d_.modes.size() > 1 && start - free_ > spin_down_) {
      // Idle for spin_down, spin down, sleep, spin up.
      energy_ += d_.modes[0].power * spin_down_;
      energy_ += down_.energy;
      Duration asleep = start - free_ - spin_down_ - down_.time;
      if (asleep > Duration::zero()) energy_ += d_.modes.back().power * asleep;
      energy_ += up_.energy;
      start += up_.time;
      ++spin_ups_;
      *spun_up = true;
    } else {
      energy_ += d_.modes[0].power * (start - free_);
    }
    free_ = start;
    return start;
  }
  // Busy from free_ for `d` at active power.
  void Busy(Duration d) {
    energy_ += io_.active_power * d;
    free_ += d;
  }
  // Head positioning from byte `from` to byte `to` of a disk whose data spans `span` bytes.
  // `idle`: how long the disk waited (for a read of the log) since its last write ended. A
  // write that starts where the last one ended costs nothing if it follows at once, but after
  // a wait its first sector has passed under the head: it waits for the platter to come round
  // (a full rotation less the wait, modulo a rotation; C. Ruemmler, J. Wilkes, "An introduction
  // to disk drive modeling", IEEE Computer 1994, on rotational position). This is what
  // algorithm 1 pays between two adjacent records: the flash read of the second one.
  Duration Position(Bytes from, Bytes to, Bytes span, const FlashSimOptions& o,
                    Duration idle = Duration::zero()) const {
    Duration rot = std::min(o.half_rotation, io_.latency);
    if (from == to) {
      if (idle <= Duration::zero() || rot <= Duration::zero()) return Duration::zero();
      const Duration turn = 2 * rot;
      return turn - Duration(idle.count() % turn.count());
    }
    Duration seek_avg = io_.latency - rot;
    Duration min_seek = std::min(o.min_seek, seek_avg);
    double k = ToSeconds(seek_avg - min_seek) / (8.0 / 15.0);
    double frac = span == 0 ? 1.0
                            : std::min(1.0, static_cast<double>(from > to ? from - to : to - from) /
                                                static_cast<double>(span));
    return rot + min_seek + Seconds(k * std::sqrt(frac));
  }
  Duration IoTime(Bytes size, bool write, bool seek = true) const {
    return (seek ? io_.latency : Duration::zero()) +
           (write ? io_.write_bandwidth : io_.read_bandwidth).TimeFor(size);
  }
  void Finish(TimePoint end) {
    bool unused;
    if (end > free_) {
      Duration idle = std::min(end - free_, spin_down_);
      energy_ += d_.modes[0].power * idle;
      free_ += idle;
      (void)unused;
    }
  }
  TimePoint free() const { return free_; }
  Energy energy() const { return energy_; }
  std::uint64_t spin_ups() const { return spin_ups_; }

 private:
  const DeviceProfile& d_;
  IoModel io_;
  Duration spin_down_;
  Transition up_, down_;
  TimePoint free_{};
  Energy energy_;
  std::uint64_t spin_ups_ = 0;
};

// Prices a flush of `records` to the disk starting now; returns its duration.
Duration PriceFlush(const std::vector<PlanRecord>& records, const FlashSimOptions& o,
                    const IoModel& log_io, Bytes span, Bytes* head, DiskTimeline* disk,
                    FlashSimResult* r) {
  FlushPlan plan = PlanFlush(records, o.algorithm, o.dram_buffer);
  std::vector<Duration> reads, writes;
  for (const FlushStep& s : plan.steps) {
    reads.push_back(log_io.latency + log_io.read_bandwidth.TimeFor(s.read_length));
  }
  for (std::size_t k = 0; k < plan.steps.size(); ++k) {
    // How long the disk waits for this step's read after the last step's writes: all of the
    // read without overlap (algorithms 1 and 2), what the writes did not hide with it (3, 4).
    Duration idle = reads[k];
    if (plan.overlap) idle = k == 0 ? reads[0] : std::max(Duration::zero(), reads[k] - writes[k - 1]);
    Duration w{0};
    bool first = true;
    for (const PlannedOp& op : plan.steps[k].ops) {
      if (op.type != PlannedOp::Type::kWrite) continue;
      w += disk->Position(*head, op.offset, span, o, first ? idle : Duration::zero()) +
           disk->IoTime(op.length, true, false);
      first = false;
      *head = op.offset + op.length;
    }
    writes.push_back(w);
  }
  Duration total{0};
  if (plan.overlap) {
    if (!reads.empty()) total += reads[0];
    for (std::size_t k = 0; k < writes.size(); ++k) {
      total += std::max(writes[k], k + 1 < reads.size() ? reads[k + 1] : Duration::zero());
    }
  } else {
    for (std::size_t k = 0; k < reads.size(); ++k) total += reads[k] + writes[k];
  }
  r->bytes_flushed += plan.written_bytes;
  r->bytes_merged_away += plan.merged_away();
  disk->Busy(total);
  return total;
}

// FlashSimOptions::steady_state: checks that the trace lies in the live data, then writes blocks
// drawn with the trace's own write frequencies, untimed, until a round costs what the one before
// did. A device without cleaning (a flash disk) has no state to settle.
Status WarmUp(const DeviceProfile& storage, const Trace& trace, const FlashSimOptions& o,
              FlashModel* model, FlashSimResult* r) {
  if (!model->has_cleaning()) return Status::Ok();
  Bytes span = 0;
  for (const BlockEvent& e : trace.block) {
    span = std::max(span, (e.sector + e.sectors) * kSectorSize);
  }
  const double capacity = static_cast<double>(storage.flash.capacity);
  const double live = model->utilisation() * capacity;
  if (static_cast<double>(span) > live) {
    char msg[256];
    std::snprintf(msg, sizeof msg,
                  "steady state: the trace spans %.2f MiB, more than the %.2f MiB of live data "
                  "on %s at utilisation %.2f; generate it over at most that much",
                  static_cast<double>(span) / (1 << 20), live / (1 << 20), storage.name.c_str(),
                  o.utilisation);
    return Status::InvalidArgument(msg);
  }
  auto close = [](double a, double b) {
    return std::abs(a - b) <= FlashSimOptions::kSteadyTolerance * std::max(a, b);
  };
  // The trace's writes as blocks, one entry per block written (a block written k times is in
  // it k times): a uniform pick from it is a block drawn with the trace's own write frequency.
  constexpr Bytes kBlock = 4096;
  std::vector<Bytes> written;
  for (const BlockEvent& e : trace.block) {
    if (!e.write) continue;
    const Bytes first = e.sector * kSectorSize / kBlock;
    const Bytes last = ((e.sector + e.sectors) * kSectorSize + kBlock - 1) / kBlock;
    for (Bytes b = first; b < last; ++b) written.push_back(b * kBlock);
  }
  if (written.empty()) {
    model->StartMeasuring();
    return Status::Ok();
  }
  std::mt19937_64 rng(1);
  FlashStats last{};
  bool have_last = false;
  for (int round = 0; round < FlashSimOptions::kMaxWarmUpPasses; ++round) {
    const FlashStats before = model->stats();
    for (std::size_t i = 0; i < written.size(); ++i) {
      (void)model->Write(written[rng() % written.size()], kBlock);
    }
    const FlashStats now = model->stats();
    FlashStats d;
    d.erasures = now.erasures - before.erasures;
    d.copied = now.copied - before.copied;
    ++r->warm_up_passes;
    r->warm_up_written += now.written - before.written;
    if (have_last && static_cast<double>(r->warm_up_written) >= capacity &&
        close(static_cast<double>(d.erasures), static_cast<double>(last.erasures)) &&
        close(static_cast<double>(d.copied), static_cast<double>(last.copied))) {
      r->steady = true;
      break;
    }
    last = d;
    have_last = true;
  }
  model->StartMeasuring();
  return Status::Ok();
}

}  // namespace

Result<FlashSimResult> SimulateFlash(const DeviceProfile& storage, const DeviceProfile* log_device,
                                     const Trace& trace, const FlashSimOptions& o) {
  if (trace.kind != TraceKind::kBlock) {
    return Status::InvalidArgument("the flash simulation replays block traces (# ghost-trace block v1)");
  }
  if (storage.modes.empty() || !storage.modes[0].serves_io) {
    return Status::InvalidArgument("profile " + storage.name + " has no mode 0 serving I/O");
  }
  FlashSimResult r;
  r.storage = storage.name;
  Duration read_total{0}, write_total{0};
  TimePoint end{};

  if (o.write_buffer > 0 && (o.log_capacity > 0 || storage.kind == DeviceKind::kDisk)) {
    return Status::InvalidArgument(
        "a write buffer is for a flash device holding everything (--storage of a flash profile, "
        "no flash log)");
  }
  if (o.log_capacity > 0 || storage.kind == DeviceKind::kDisk) {
    if (o.log_capacity > 0 && log_device == nullptr) {
      return Status::InvalidArgument("a flash log needs a log device profile");
    }
    if (o.log_capacity > 0 && o.log_capacity < o.dram_buffer) {
      return Status::InvalidArgument("the flash log must hold at least one DRAM buffer");
    }
    DiskTimeline disk(storage, o.spin_down);
    IoModel log_io = log_device != nullptr ? log_device->modes[0].io : IoModel{};
    Power log_idle = log_device != nullptr ? log_device->modes[0].power : Power();
    if (log_device != nullptr) r.log_device = log_device->name;
    std::vector<PlanRecord> log;
    Bytes span = 0;
    for (const BlockEvent& e : trace.block) {
      span = std::max<Bytes>(span, (e.sector + e.sectors) * kSectorSize);
    }
    Bytes head = span / 2;  // where the head is; reads move it too
    Bytes log_used = 0;
    Energy log_energy;
    TimePoint log_free{};
    auto flush = [&](LogFlushReason why) {
      if (log.empty()) return;
      Duration took = PriceFlush(log, o, log_io, span, &head, &disk, &r);
      r.flush_time += took;
      log_energy += log_io.active_power * took;  // an upper bound: the log is read part of it
      ++r.flushes;
      ++r.flushes_by_reason[static_cast<std::size_t>(why)];
      log.clear();
      log_used = 0;
    };
    for (const BlockEvent& e : trace.block) {
      const Bytes size = Bytes{e.sectors} * kSectorSize;
      const Bytes addr = e.sector * kSectorSize;
      if (e.write && o.log_capacity > 0) {
        ++r.writes;
        // Append in records of at most one DRAM buffer.
        TimePoint start = std::max(e.time, log_free);
        Duration t{0};
        const Bytes max_data = o.dram_buffer - FlashLog::kHeaderSize - 4;
        for (Bytes at = 0; at < size; at += max_data) {
          Bytes len = std::min(max_data, size - at);
          Bytes rec = FlashLog::kHeaderSize + 4 + len;
          if (log_used + rec > o.log_capacity) {
            bool spun;
            TimePoint ready = disk.Ready(start + t, &spun);
            (void)ready;
            flush(LogFlushReason::kFull);
            t = disk.free() - start;
          }
          log.push_back({r.writes, LogRecordKind::kBlock, "disk", addr + at, len, log_used, rec,
                         FlashLog::kHeaderSize + 4});
          log_used += rec;
          r.bytes_logged += len;
          Duration w = log_io.latency + log_io.write_bandwidth.TimeFor(rec);
          log_energy += log_io.active_power * w;
          t += w;
        }
        log_free = start + t;
        write_total += log_free - e.time;
        end = std::max(end, log_free);
        continue;
      }
      bool spun = false;
      TimePoint start = disk.Ready(e.time, &spun);
      if (spun && o.log_capacity > 0 && o.policy == LogFlushPolicy::kEachSpinUp) {
        flush(LogFlushReason::kSpinUp);
        start = disk.free();
      }
      disk.Busy(disk.IoTime(size, e.write));
      head = addr + size;
      Duration resp = disk.free() - e.time;
      (e.write ? write_total : read_total) += resp;
      ++(e.write ? r.writes : r.reads);
      end = std::max(end, disk.free());
      (void)start;
    }
    if (!log.empty()) {
      bool spun;
      (void)disk.Ready(end, &spun);
      flush(LogFlushReason::kExplicit);
      end = std::max(end, disk.free());
    }
    disk.Finish(end);
    r.spin_ups = disk.spin_ups();
    r.duration = end.time_since_epoch();
    r.energy = disk.energy() + log_energy + log_idle * r.duration;
  } else {
    Result<FlashModel> m = FlashModel::Create(storage, o.cleaning);
    if (!m.ok()) return m.status();
    FlashModel model = std::move(m).value();
    model.Preload(o.utilisation);
    if (o.steady_state) {
      Status warmed = WarmUp(storage, trace, o, &model, &r);
      if (!warmed.ok()) return warmed;
    }
    Energy active;
    // The host write buffer (options.write_buffer): writes waiting to drain, in arrival order.
    struct Buffered {
      TimePoint queued;
      Bytes address, size;
    };
    std::deque<Buffered> buffer;
    Bytes buffered = 0;   // queued, not yet sent to the device
    Bytes in_flight = 0;  // the last drain write's size: its room is free once it is done
    TimePoint drained{};  // when the last drain write is done on the device
    // The next drain write goes to the device when it was queued or when the one before it is
    // done, whichever is later.
    auto next_drain = [&] { return std::max(buffer.front().queued, drained); };
    auto drain_one = [&] {
      const Buffered b = buffer.front();
      buffer.pop_front();
      const TimePoint at = std::max(b.queued, drained);
      const FlashCost c = model.Write(at, b.address, b.size);
      active += c.energy;
      drained = at + c.time;
      buffered -= b.size;
      in_flight = b.size;
      end = std::max(end, model.busy_until());
    };
    for (const BlockEvent& e : trace.block) {
      const Bytes size = Bytes{e.sectors} * kSectorSize;
      // Drain writes due by now go to the device first: it serves requests in arrival order.
      while (!buffer.empty() && next_drain() <= e.time) drain_one();
      if (e.write && o.write_buffer > 0) {
        ++r.writes;
        // Wait for room: the bytes queued, and the drain write in flight until it is done (for
        // an empty buffer if the write is larger than it).
        const Bytes need = std::min(size, o.write_buffer);
        TimePoint room = e.time;
        while (buffered + (drained > room ? in_flight : 0) + need > o.write_buffer) {
          if (drained > room) {
            room = drained;
          } else {
            drain_one();
          }
        }
        if (room > e.time) ++r.writes_waiting_for_buffer;
        if (size > o.write_buffer) {
          ++r.writes_through_buffer;
          const FlashCost c = model.Write(room, e.sector * kSectorSize, size);
          active += c.energy;
          write_total += room - e.time + c.time;
          drained = room + c.time;
          in_flight = 0;
          end = std::max(end, model.busy_until());
          continue;
        }
        buffer.push_back({room, e.sector * kSectorSize, size});
        buffered += size;
        write_total += room - e.time;
        end = std::max(end, room);
        continue;
      }
      // The model queues the request behind the card's interface and prices any wait for an
      // erased segment or a cleaning; its time is the response.
      FlashCost c = e.write ? model.Write(e.time, e.sector * kSectorSize, size)
                            : model.Read(e.time, e.sector * kSectorSize, size);
      active += c.energy;
      (e.write ? write_total : read_total) += c.time;
      ++(e.write ? r.writes : r.reads);
      end = std::max(end, model.busy_until());
    }
    while (!buffer.empty()) drain_one();  // the run ends when the buffer is on the device
    r.duration = end.time_since_epoch();
    r.energy = active + storage.modes[0].power * r.duration;
    r.erasures = model.stats().erasures;
    r.copied = model.stats().copied;
    r.max_segment_erasures = model.stats().max_segment_erasures;
    if (!model.erase_counts().empty()) {
      r.min_segment_erasures =
          *std::min_element(model.erase_counts().begin(), model.erase_counts().end());
    }
    r.wear_cleanings = model.stats().wear_cleanings;
    r.final_utilisation = model.utilisation();
    r.written = model.stats().written;
    r.idle_block_copies = model.stats().idle_block_copies;
    r.preempted_waits = model.stats().preempted_waits;
    r.writes_finishing_a_cleaning = model.stats().writes_finishing_a_cleaning;
    r.writes_behind_an_erasure = model.stats().writes_behind_an_erasure;
    r.wait_behind_erasures_ms = ToMillis(model.stats().wait_behind_erasures);
    r.erasures_deferred = model.stats().erasures_deferred;
    r.copies_behind_an_erasure = model.stats().copies_behind_an_erasure;
    r.copy_wait_behind_erasures_ms = ToMillis(model.stats().copy_wait_behind_erasures);
  }
  r.mean_read_ms = r.reads ? ToMillis(read_total) / static_cast<double>(r.reads) : 0;
  r.mean_write_ms = r.writes ? ToMillis(write_total) / static_cast<double>(r.writes) : 0;
  return r;
}

Duration PredictFlushTime(const std::vector<PlanRecord>& records, const FlashSimOptions& o,
                          const DeviceProfile& log_device, const DeviceProfile& disk, Bytes span) {
  DiskTimeline timeline(disk, o.spin_down);
  FlashSimResult unused;
  Bytes head = span / 2;
  return PriceFlush(records, o, log_device.modes[0].io, span, &head, &timeline, &unused);
}

nlohmann::json ToJson(const FlashSimResult& r, const FlashSimOptions& o) {
  nlohmann::json j;
  j["storage"] = r.storage;
  j["reads"] = r.reads;
  j["writes"] = r.writes;
  j["mean_read_ms"] = r.mean_read_ms;
  j["mean_write_ms"] = r.mean_write_ms;
  j["energy_j"] = r.energy.joules();
  j["duration_s"] = ToSeconds(r.duration);
  j["spin_ups"] = r.spin_ups;
  if (o.log_capacity > 0) {
    j["log_device"] = r.log_device;
    j["flash_log_bytes"] = o.log_capacity;
    j["flush_policy"] = LogFlushPolicyName(o.policy);
    j["flush_alg"] = static_cast<int>(o.algorithm);
    j["dram_buffer_bytes"] = o.dram_buffer;
    j["flushes"] = r.flushes;
    nlohmann::json by;
    for (std::size_t i = 0; i < kLogFlushReasons; ++i) {
      by[LogFlushReasonName(static_cast<LogFlushReason>(i))] = r.flushes_by_reason[i];
    }
    j["flushes_by_reason"] = by;
    j["flush_time_s"] = ToSeconds(r.flush_time);
    j["bytes_logged"] = r.bytes_logged;
    j["bytes_flushed"] = r.bytes_flushed;
    j["bytes_merged_away"] = r.bytes_merged_away;
  }
  if (r.erasures > 0 || r.final_utilisation > 0) {
    j["cleaning"] = CleaningPolicyName(o.cleaning);
    j["utilisation"] = r.final_utilisation;
    j["erasures"] = r.erasures;
    j["copied_bytes"] = r.copied;
    j["max_segment_erasures"] = r.max_segment_erasures;
    j["min_segment_erasures"] = r.min_segment_erasures;
    j["wear_cleanings"] = r.wear_cleanings;
    j["written_bytes"] = r.written;
    j["idle_block_copies"] = r.idle_block_copies;
    j["preempted_waits"] = r.preempted_waits;
    j["writes_finishing_a_cleaning"] = r.writes_finishing_a_cleaning;
    j["writes_behind_an_erasure"] = r.writes_behind_an_erasure;
    j["wait_behind_erasures_ms"] = r.wait_behind_erasures_ms;
    j["erasures_deferred"] = r.erasures_deferred;
    j["copies_behind_an_erasure"] = r.copies_behind_an_erasure;
    j["copy_wait_behind_erasures_ms"] = r.copy_wait_behind_erasures_ms;
  }
  if (o.write_buffer > 0) {
    j["write_buffer_bytes"] = o.write_buffer;
    j["writes_waiting_for_buffer"] = r.writes_waiting_for_buffer;
    j["writes_through_buffer"] = r.writes_through_buffer;
  }
  if (o.steady_state) {
    j["warm_up_passes"] = r.warm_up_passes;
    j["warm_up_written_bytes"] = r.warm_up_written;
    j["steady"] = r.steady;
  }
  return j;
}

}  // namespace ghost
