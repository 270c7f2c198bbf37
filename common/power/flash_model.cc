#include "common/power/flash_model.h"

#include <algorithm>
#include <cassert>
#include <cstdio>
#include <cstdlib>

namespace ghost {

std::optional<CleaningPolicy> ParseCleaningPolicy(std::string_view text) {
  if (text == "on-demand") return CleaningPolicy::kOnDemand;
  if (text == "async" || text == "asynchronous") return CleaningPolicy::kAsynchronous;
  return std::nullopt;
}

const char* CleaningPolicyName(CleaningPolicy policy) {
  return policy == CleaningPolicy::kOnDemand ? "on-demand" : "async";
}

Result<FlashModel> FlashModel::Create(const DeviceProfile& device, CleaningPolicy policy,
                                      Bytes block) {
  if (device.modes.empty() || !device.modes[0].serves_io) {
    return Status::InvalidArgument("flash model: profile " + device.name +
                                   " has no mode 0 that serves I/O");
  }
  if (device.flash.erase_segment > 0) {
    if (device.flash.capacity == 0) {
      return Status::InvalidArgument("flash model: profile " + device.name +
                                     " has an erase segment but no capacity_mib");
    }
    if (block == 0 || device.flash.erase_segment % block != 0 ||
        device.flash.capacity < 4 * device.flash.erase_segment) {
      return Status::InvalidArgument("flash model: profile " + device.name +
                                     " needs a capacity of at least 4 erase segments, and "
                                     "segments a multiple of the block size");
    }
    if (device.flash.erase_chip % device.flash.erase_segment != 0) {
      return Status::InvalidArgument("flash model: profile " + device.name +
                                     ": erase_chip_kib must be a multiple of erase_segment_kib");
    }
  }
  return FlashModel(device, policy, block);
}

FlashModel::FlashModel(const DeviceProfile& device, CleaningPolicy policy, Bytes block)
    : io_(device.modes[0].io), geometry_(device.flash), policy_(policy), block_(block) {
  if (geometry_.erase_power.watts() == 0) geometry_.erase_power = io_.active_power;
  if (geometry_.erase_segment == 0) return;
  segment_blocks_ = geometry_.erase_segment / block_;
  std::uint64_t segments = geometry_.capacity / geometry_.erase_segment;
  blocks_ = segments * segment_blocks_;
  where_.assign(blocks_, -1);
  owner_.assign(blocks_, -1);
  live_.assign(segments, 0);
  erase_counts_.assign(segments, 0);
  wear_.assign(segments, 0);
  ready_at_.assign(segments, TimePoint{});
  // No chip size (or one past the device): the whole device is one chip.
  chip_segments_ = geometry_.erase_chip > 0
                       ? std::min<std::uint64_t>(geometry_.erase_chip / geometry_.erase_segment,
                                                 segments)
                       : segments;
  chip_free_.assign((segments + chip_segments_ - 1) / chip_segments_, TimePoint{});
  for (std::uint64_t s = segments; s-- > 0;) erased_.push_back(s);
}

Duration FlashModel::TransferTime(Bytes size, bool write) const {
  Bandwidth bw = write ? io_.write_bandwidth : io_.read_bandwidth;
  return io_.latency + bw.TimeFor(size);
}

double FlashModel::utilisation() const {
  if (blocks_ == 0) return 0;
  std::uint64_t live = 0;
  for (std::uint32_t l : live_) live += l;
  return static_cast<double>(live) / static_cast<double>(blocks_);
}

void FlashModel::Preload(double fraction) {
  if (segment_blocks_ == 0) return;
  // Logical blocks are the physical ones less two segments (the active one and the
  // cleaner's reserve), so cleaning can always make progress.
  std::uint64_t logical = blocks_ - 2 * segment_blocks_;
  std::uint64_t n = std::min<std::uint64_t>(
      logical, static_cast<std::uint64_t>(fraction * static_cast<double>(blocks_)));
  FlashCost ignored;
  TimePoint t{};
  for (std::uint64_t lb = 0; lb < n; ++lb) Place(lb, &t, &ignored, false);
  // "After a long life": the cold data sits packed in full segments (above), and the rest of
  // the card has been written and overwritten, so it holds dead blocks, not erased segments:
  // only the cleaner's reserve is erased. A card in use erases at any utilisation (Douglis et
  // al. §5.2 compare erasures, hence lifetime, at 40% and at 95%); a preload that left the
  // free space erased would let a trace shorter than the free space run without one erasure
  // at 40%. Each dead segment costs one erase and no copy when it is cleaned.
  while (erased_.size() > 1) erased_.pop_back();
  StartMeasuring();
}

void FlashModel::StartMeasuring() {
  stats_ = FlashStats{};
  std::fill(erase_counts_.begin(), erase_counts_.end(), 0);
  std::fill(ready_at_.begin(), ready_at_.end(), TimePoint{});
  std::fill(chip_free_.begin(), chip_free_.end(), TimePoint{});
  deferred_.clear();  // their erasures end before the measured period, as the others' do
  bus_free_ = TimePoint{};
}

FlashCost FlashModel::Read(TimePoint arrival, Bytes, Bytes size) {
  // An erasure in flight does not hold a read up: the chip suspends it (28F008SA erase-suspend
  // to read) or another chip serves the read.
  FlashCost cost;
  IssueDeferredIfIdle(arrival);
  CatchUp(arrival, &cost);
  TimePoint start = std::max(arrival, bus_free_);
  Duration transfer = TransferTime(size, false);
  bus_free_ = start + transfer;
  cost.time = bus_free_ - arrival;
  cost.energy += io_.active_power * transfer;
  return cost;
}

FlashCost FlashModel::Write(TimePoint arrival, Bytes address, Bytes size) {
  FlashCost cost;
  IssueDeferredIfIdle(arrival);
  CatchUp(arrival, &cost);
  TimePoint t = std::max(arrival, bus_free_);
  stats_.written += size;
  if (idle_cleaner() && cleaning_ >= 0 && erased_.empty() && size > 0) {
    // The idle cleaner's copies took the last erased segment (the reserve) and the active
    // segment's room is what the rest of them need: the write waits for them (the erasure
    // then runs on its chip), so that the cleaning can finish.
    ++stats_.writes_finishing_a_cleaning;
    Clean(&t, &cost, false, true);
  }
  if (segment_blocks_ == 0 || size == 0) {
    Duration transfer = TransferTime(size, true);
    bus_free_ = t + transfer;
    cost.time = bus_free_ - arrival;
    cost.energy += io_.active_power * transfer;
    return cost;
  }
  const std::uint64_t logical = blocks_ - 2 * segment_blocks_;
  std::uint64_t first = address / block_;
  std::uint64_t count = (size + block_ - 1) / block_;
  t += io_.latency;
  Duration transfer = io_.latency;
  for (std::uint64_t i = 0; i < count; ++i) {
    Place((first + i) % logical, &t, &cost, true);
    // The block's transfer; the last one may be partial.
    Duration d = io_.write_bandwidth.TimeFor(i + 1 < count ? block_ : size - i * block_);
    t += d;
    transfer += d;
  }
  cost.energy += io_.active_power * transfer;
  bus_free_ = t;
  cost.time = t - arrival;
  if (policy_ == CleaningPolicy::kAsynchronous && !idle_cleaner()) {
    // Keep one segment erased (or being erased) beyond the cleaner's reserve, in the
    // background: the copies hold the bus, the erasure runs on its chip.
    TimePoint bt = bus_free_;
    FlashCost bg;
    int guard = 0;
    // A cleaning whose copies would first wait for an erasure in flight is left for later
    // (CatchUp): the cleaner does not hold the interface while the chip erases.
    while (erased_.size() < 2 && guard++ < 1000 && CopiesCanStart(bt) <= bt) {
      Clean(&bt, &bg, false);
    }
    cost.background += bt - bus_free_;
    bus_free_ = bt;
    cost.energy += bg.energy;
    cost.copied += bg.copied;
    cost.erasures += bg.erasures;
  }
  return cost;
}

TimePoint FlashModel::busy_until() const {
  TimePoint t = bus_free_;
  for (TimePoint c : chip_free_) t = std::max(t, c);
  // A deferred erasure starts once the card is idle, after the one in flight on its chip.
  const Duration idle = geometry_.clean_idle.value_or(Duration::zero());
  for (std::size_t v : deferred_) {
    t = std::max(t, std::max(bus_free_ + idle, chip_free_[Chip(v)]) + geometry_.erase_time);
  }
  return t;
}

std::int64_t FlashModel::Victim() const {
  // The idle cleaner's victim under way is finished first, whoever cleans it.
  if (cleaning_ >= 0) return cleaning_;
  if (WearCleaningNext()) {
    // Wear levelling (clean_wear_shuffle): the segment erased least over the card's life, live
    // data and all; among equals the last one, as the FTL driver's scan keeps.
    std::int64_t worn_least = -1;
    for (std::size_t s = 0; s < live_.size(); ++s) {
      if (static_cast<std::int64_t>(s) == active_) continue;
      if (std::find(erased_.begin(), erased_.end(), s) != erased_.end()) continue;
      if (worn_least < 0 || wear_[s] <= wear_[static_cast<std::size_t>(worn_least)]) {
        worn_least = static_cast<std::int64_t>(s);
      }
    }
    return worn_least;
  }
  // Greedy: the fewest live blocks. Among equals, asynchronously, the one whose erasure holds
  // up the writer least (a chip does not program while it erases): not on the active segment's
  // chip, then not on the chip of the erased segment the writer opens next (on demand the
  // writer waits for the erasure wherever it runs); then the one whose chip is free first (its
  // erasure can start soonest; on a one-chip device all are equal: the lowest segment).
  const std::size_t none = chip_free_.size();
  const bool async = policy_ == CleaningPolicy::kAsynchronous && none > 1;
  const std::size_t active_chip =
      async && active_ >= 0 ? Chip(static_cast<std::size_t>(active_)) : none;
  const std::size_t next_chip = async && !erased_.empty() ? Chip(erased_[NextErased()]) : none;
  auto hold_up = [&](std::size_t s) {
    return Chip(s) == active_chip ? 2 : Chip(s) == next_chip ? 1 : 0;
  };
  std::int64_t victim = -1;
  for (std::size_t s = 0; s < live_.size(); ++s) {
    if (static_cast<std::int64_t>(s) == active_) continue;
    if (std::find(erased_.begin(), erased_.end(), s) != erased_.end()) continue;
    const std::size_t v = static_cast<std::size_t>(victim);
    if (victim < 0 || live_[s] < live_[v] ||
        (live_[s] == live_[v] && hold_up(s) < hold_up(v)) ||
        (live_[s] == live_[v] && hold_up(s) == hold_up(v) &&
         chip_free_[Chip(s)] < chip_free_[Chip(v)])) {
      victim = static_cast<std::int64_t>(s);
    }
  }
  return victim;
}

std::size_t FlashModel::NextErased() const {
  // The erased segment that can be written first: its own erasure ended and its chip erasing
  // nothing else (a chip cannot program while it erases); among equals the one erased first
  // (the back of erased_: on a one-chip device erasures end in the order they were queued).
  std::size_t next = erased_.size() - 1;
  for (std::size_t i = erased_.size() - 1; i-- > 0;) {
    if (WritableAt(erased_[i]) < WritableAt(erased_[next])) next = i;
  }
  return next;
}

TimePoint FlashModel::WritableAt(std::size_t segment) const {
  // Erasures on a chip run one after the other, so the chip is erasing until the last one it
  // was given ends; the segment's own erasure is one of them.
  return std::max(ready_at_[segment], chip_free_[Chip(segment)]);
}

TimePoint FlashModel::NextBlockWritableAt(TimePoint t) const {
  if (active_ >= 0 && write_point_ < segment_blocks_) {
    return std::max(t, WritableAt(static_cast<std::size_t>(active_)));
  }
  if (erased_.empty()) return t;
  return std::max(t, WritableAt(erased_[NextErased()]));
}

TimePoint FlashModel::CopiesCanStart(TimePoint t) const {
  const std::int64_t victim = Victim();
  if (victim < 0) return t;
  // The copies start at the write point: the active segment's room, or the next erased segment.
  // Either way its chip must have no erasure in flight (the 28F008SA programs only when idle).
  const std::uint32_t live = live_[static_cast<std::size_t>(victim)];
  if (live == 0) return t;  // nothing to copy: the erasure can be issued at once
  TimePoint start = NextBlockWritableAt(t);
  const std::uint64_t room = active_ >= 0 ? segment_blocks_ - write_point_ : 0;
  if (live <= room || erased_.empty() || room == 0) return start;
  return std::max(start, WritableAt(erased_[NextErased()]));
}

void FlashModel::CatchUp(TimePoint arrival, FlashCost* cost) {
  if (policy_ != CleaningPolicy::kAsynchronous || segment_blocks_ == 0) return;
  if (idle_cleaner()) {
    CleanWhileIdle(arrival, cost);
    return;
  }
  // The background cleaning left for an erasure runs in the idle time before `arrival`: each
  // cleaning whose copies can start by then (they may run past it: the interface is not
  // preempted).
  TimePoint bt = bus_free_;
  FlashCost bg;
  int guard = 0;
  while (erased_.size() < 2 && guard++ < 1000) {
    const TimePoint start = CopiesCanStart(bt);
    if (start >= arrival) break;
    bt = start;
    Clean(&bt, &bg, false);
  }
  bus_free_ = std::max(bus_free_, bt);
  cost->energy += bg.energy;
  cost->copied += bg.copied;
  cost->erasures += bg.erasures;
}

void FlashModel::CleanWhileIdle(TimePoint arrival, FlashCost* cost) {
  if (arrival <= bus_free_) return;  // a request is waiting: no idle time
  // The card has been idle since bus_free_; the cleaner starts after the threshold.
  TimePoint t = bus_free_ + *geometry_.clean_idle;
  TimePoint bus_end = bus_free_;
  const Duration copy = TransferTime(block_, false) + TransferTime(block_, true);
  std::uint64_t guard = 0;
  while (t < arrival && guard++ < 4 * blocks_ + 16) {
    if (cleaning_ < 0) {
      // Keep one segment erased (or being erased) beyond the cleaner's reserve.
      if (erased_.size() >= 2) break;
      const std::int64_t v = Victim();
      if (v < 0) break;
      cleaning_ = v;
      if (WearCleaningNext()) ++stats_.wear_cleanings;
      ++stats_.cleanings;
    }
    const std::size_t victim = static_cast<std::size_t>(cleaning_);
    if (live_[victim] > 0) {
      // One block copy: its destination is the active segment's room, or the next erased
      // segment once its erasure has ended; it starts only if it can before the request.
      // Either way the destination's chip must have no erasure in flight.
      if ((active_ < 0 || write_point_ == segment_blocks_) && erased_.empty()) {
        break;  // not reached: the victim's copies fit (the reserve)
      }
      TimePoint start = NextBlockWritableAt(t);
      if (start >= arrival) break;
      const std::uint64_t base = victim * segment_blocks_;
      std::uint64_t b = base;
      while (owner_[b] < 0) ++b;
      FlashCost unused;
      Place(static_cast<std::uint64_t>(owner_[b]), &start, &unused, false);
      t = start + copy;
      bus_end = t;
      cost->energy += io_.active_power * copy;
      cost->copied += block_;
      stats_.copied += block_;
      ++stats_.idle_block_copies;
    }
    // Its last live block copied (or overwritten by the host meanwhile): the erasure is
    // issued at once on the victim's chip.
    if (live_[victim] == 0) {
      Erase(victim, t, cost);
      cleaning_ = -1;
    }
  }
  // A request that arrived during a block copy waits for that copy only.
  if (bus_end > arrival) ++stats_.preempted_waits;
  bus_free_ = std::max(bus_free_, bus_end);
}

void FlashModel::Place(std::uint64_t lb, TimePoint* t, FlashCost* cost, bool foreground) {
  if (active_ < 0 || write_point_ == segment_blocks_) {
    if (foreground) {
      TakeErasedSegment(t, cost);
    } else {
      // A copy (or the preload) takes the next erased segment directly, the reserve included.
      OpenErased(t);
    }
    // The writer has left the chip of a deferred erasure: it can start now.
    if (!deferred_.empty()) IssueDeferred(*t, false);
  }
  // A fresh segment's erasure must have ended; and the 28F008SA does not program while it
  // erases (its erase suspend is to read, DESIGN §3.7): a block written to a chip with an
  // erasure in flight waits for the erasure to end.
  const TimePoint writable = WritableAt(static_cast<std::size_t>(active_));
  if (writable > *t) {
    if (foreground) {
      ++stats_.writes_behind_an_erasure;
      stats_.wait_behind_erasures += writable - *t;
    } else {
      ++stats_.copies_behind_an_erasure;
      stats_.copy_wait_behind_erasures += writable - *t;
    }
    *t = writable;
  }
  std::int64_t phys = active_ * static_cast<std::int64_t>(segment_blocks_) +
                      static_cast<std::int64_t>(write_point_++);
  std::int64_t old = where_[lb];
  if (old >= 0) {
    owner_[old] = -1;
    --live_[static_cast<std::uint64_t>(old) / segment_blocks_];
  }
  where_[lb] = phys;
  owner_[phys] = static_cast<std::int64_t>(lb);
  ++live_[static_cast<std::uint64_t>(active_)];
}

void FlashModel::OpenErased(TimePoint* t) {
  if (erased_.empty()) {
    std::fprintf(stderr, "flash model: no erased segment left (cleaning made no progress)\n");
    std::abort();
  }
  const std::size_t next = NextErased();
  const std::size_t segment = erased_[next];
  // The only segment left is one whose erasure was held back: it starts now, and the caller
  // waits for it.
  auto d = std::find(deferred_.begin(), deferred_.end(), segment);
  if (d != deferred_.end()) {
    deferred_.erase(d);
    StartErase(segment, *t);
  }
  active_ = static_cast<std::int64_t>(segment);
  erased_.erase(erased_.begin() + static_cast<std::ptrdiff_t>(next));
  write_point_ = 0;
  // The caller (Place) waits until the segment can be programmed.
}

void FlashModel::TakeErasedSegment(TimePoint* t, FlashCost* cost) {
  // The last erased segment is the cleaner's reserve: a user write that would take it cleans
  // first and waits for the cleaning (on demand; asynchronously, only when the background
  // cleaner has no segment erased or being erased beyond the reserve). With the idle-time
  // cleaner the write waits for the copies, and for the erasure only if it needs the segment
  // (OpenErased below): the erasure runs on its chip, as the background cleaner's do.
  int guard = 0;
  while (erased_.size() <= 1 && guard++ < 1000) {
    Clean(t, cost, !idle_cleaner(), idle_cleaner());
    // The copies went to a fresh segment with room left: the write goes on in it.
    if (active_ >= 0 && write_point_ < segment_blocks_) return;
  }
  OpenErased(t);
}

void FlashModel::Clean(TimePoint* t, FlashCost* cost, bool wait_erase, bool defer) {
  const std::int64_t victim = Victim();
  if (victim < 0) return;
  if (victim == cleaning_) {
    cleaning_ = -1;  // the idle cleaner's victim under way: counted when it was started
  } else {
    if (WearCleaningNext()) ++stats_.wear_cleanings;
    ++stats_.cleanings;
  }
  Bytes moved = 0;
  const std::uint64_t base = static_cast<std::uint64_t>(victim) * segment_blocks_;
  for (std::uint64_t b = base; b < base + segment_blocks_; ++b) {
    if (owner_[b] < 0) continue;
    FlashCost unused;
    Place(static_cast<std::uint64_t>(owner_[b]), t, &unused, false);
    moved += block_;
  }
  if (moved > 0) {
    Duration copy = TransferTime(moved, false) + TransferTime(moved, true);
    *t += copy;
    cost->energy += io_.active_power * copy;
  }
  stats_.copied += moved;
  cost->copied += moved;
  Erase(static_cast<std::size_t>(victim), *t, cost, defer && !wait_erase);
  // The caller waits for the erasure (on demand).
  if (wait_erase) *t = ready_at_[static_cast<std::size_t>(victim)];
}

void FlashModel::Erase(std::size_t victim, TimePoint t, FlashCost* cost, bool defer) {
  // The chip the writer programs next: the active segment's while it has room, else the one of
  // the erased segment it opens next.
  std::optional<std::size_t> writer_chip;
  if (active_ >= 0 && write_point_ < segment_blocks_) {
    writer_chip = Chip(static_cast<std::size_t>(active_));
  } else if (!erased_.empty()) {
    writer_chip = Chip(erased_[NextErased()]);
  }
  cost->energy += geometry_.erase_power * geometry_.erase_time;
  ++erase_counts_[victim];
  ++wear_[victim];
  stats_.max_segment_erasures = std::max(stats_.max_segment_erasures, erase_counts_[victim]);
  ++stats_.erasures;
  erased_.insert(erased_.begin(), static_cast<std::uint64_t>(victim));
  ++cost->erasures;
  // An erasure is background work the host starts (28F008SA: one operation at a time per
  // chip, erase suspend only to read): one forced inside a write is not started on the chip
  // the writer is about to program, or the writer would wait for it; it starts when the writer
  // leaves the chip or the card goes idle (round 15).
  if (defer && writer_chip == Chip(victim)) {
    ready_at_[victim] = TimePoint::max();  // not writable until its erasure has run
    deferred_.push_back(victim);
    ++stats_.erasures_deferred;
    return;
  }
  StartErase(victim, t);
}

void FlashModel::StartErase(std::size_t victim, TimePoint t) {
  // The erasure runs on the victim's chip after the one in flight there (a chip erases one
  // block at a time; other chips erase at the same time).
  TimePoint& chip = chip_free_[Chip(victim)];
  const TimePoint erased_at = std::max(t, chip) + geometry_.erase_time;
  chip = erased_at;
  ready_at_[victim] = erased_at;
}

void FlashModel::IssueDeferred(TimePoint t, bool all) {
  const bool writing = active_ >= 0 && write_point_ < segment_blocks_;
  for (std::size_t i = 0; i < deferred_.size();) {
    const std::size_t v = deferred_[i];
    if (all || !writing || Chip(v) != Chip(static_cast<std::size_t>(active_))) {
      deferred_.erase(deferred_.begin() + static_cast<std::ptrdiff_t>(i));
      StartErase(v, t);
    } else {
      ++i;
    }
  }
}

void FlashModel::IssueDeferredIfIdle(TimePoint arrival) {
  if (deferred_.empty()) return;
  const TimePoint idle = bus_free_ + geometry_.clean_idle.value_or(Duration::zero());
  if (arrival > idle) IssueDeferred(idle, true);
}

void FlashModel::AssertInvariants() const {
  std::vector<std::uint32_t> live(live_.size(), 0);
  for (std::size_t b = 0; b < owner_.size(); ++b) {
    if (owner_[b] < 0) continue;
    assert(where_[static_cast<std::size_t>(owner_[b])] == static_cast<std::int64_t>(b));
    ++live[b / segment_blocks_];
  }
  assert(live == live_);
  for (std::uint64_t s : erased_) assert(live_[s] == 0);
  for (std::size_t s : deferred_) {
    assert(std::find(erased_.begin(), erased_.end(), s) != erased_.end());
  }
  if (cleaning_ >= 0) {
    assert(cleaning_ != active_);
    assert(std::find(erased_.begin(), erased_.end(),
                     static_cast<std::uint64_t>(cleaning_)) == erased_.end());
  }
  (void)live;
}

}  // namespace ghost
