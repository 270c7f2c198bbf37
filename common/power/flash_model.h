// FlashModel: the erase-and-clean cost of a flash device (DESIGN §3.7), after Douglis et al.,
// "Storage alternatives for mobile computers" (OSDI 1994), §3 and §5.2.
//
// A flash card cannot overwrite in place: it writes into erased segments and reclaims space by
// cleaning. The model keeps the card log-structured at `block` granularity:
//   - a write puts each block at the write point of the active segment and invalidates the
//     block's old copy; a full active segment is replaced by an erased one;
//   - when no erased segment is left, the cleaner picks the segment with the fewest live blocks
//     (not the active one), copies its live blocks to the write point (a read and a write of
//     each), and erases it (erase time, erase energy, one more erasure of that segment). The
//     segment that received the copies is written on until it is full: its free blocks are
//     not abandoned.
// Time: the card serves one request at a time in arrival order over its one interface (its
// "bus": reads, writes, the cleaner's copies). An erasure is not bus work: the host issues a
// block-erase command and the chip's own write state machine erases, while the other chips of
// the card serve reads and writes (Intel 28F008SA datasheet, the chip of the Series 2 card:
// 16 blocks of 64 KB per chip, 1.6 s typical block erase, erase-suspend to read). Each chip
// (the profile's erase_chip_kib; default: the whole device is one chip) erases one block at a
// time, and erasures on distinct chips run at the same time, each drawing its erase power for
// its own erase time. A segment lies on chip address / chip size. A chip does not program while
// it erases (round 14: the 28F008SA's erase suspend lets the host read another block, not write
// one), so a block written to a segment whose chip has an erasure in flight, a host write's or
// a cleaner's copy, waits for that erasure to end (reads do not wait). The writer and the
// cleaner's copies take whichever erased segment can be programmed first, on any chip; among
// victims with as few live blocks, the asynchronous cleaner picks one off the chips the writer
// programs next (the active segment's, then the next erased segment's), then the one whose
// chip is free first (on demand: chip free first).
//   - kOnDemand cleans inside the write that needs space: the write waits for the copies and
//     for the erasure, and the card serves nothing else meanwhile (the flash file system waits
//     for its erase command);
//   - kAsynchronous cleans after each write until one segment beyond the reserve is erased (or
//     being erased): the copies hold the bus, the erasure runs on its chip (one at a time there) while
//     the card serves requests. A cleaning whose copies would have to wait for an erasure in
//     flight (no room for them until a segment is erased) waits off the bus: it runs in the
//     idle time before the next request once the erasure has ended (CatchUp), so the cleaner
//     never holds the interface while a chip erases. A write waits only when it needs a fresh
//     segment whose erasure has not finished or programs a chip that is erasing (or, if no
//     segment is erased or being erased, for a whole cleaning, as on demand). Its cost is energy and erasures, not response time, while the card has idle time.
//     With the profile's clean_idle_ms (round 13) the cleaner is idle-time work, as a card
//     controller's background cleaner is: it does not run after a write but only once the card
//     has been idle that long (no request in service or waiting), one block copy at a time, and
//     a request that arrives meanwhile preempts it: it waits at most for the block copy in
//     progress, and the cleaning goes on (same victim) in the next idle time. The victim's
//     erasure is issued as soon as its last live block has been copied. If a write finds the
//     cleaner holding the last erased segment (its copies took the reserve), it waits for the
//     rest of that cleaning's copies: the reserve is what lets a cleaning in progress finish.
//     A cleaning forced inside a write (round 15) does not start its erasure on the chip the
//     writer programs next (the active segment's while it has room, else the next erased
//     segment's): the erasure is held back until the writer leaves that chip or the card has
//     been idle for clean_idle_ms, and starts then (at once if the writer needs that segment).
//     Erase is background work the host starts, and the chip programs only when idle.
// Wear levelling (the profile's clean_wear_shuffle N, round 16): every Nth cleaning takes as
// victim the segment erased least over the card's life (the preload and warm-up included), live
// data and all, instead of the greedy one: the PCMCIA Flash Translation Layer driver's choice
// (Linux drivers/mtd/ftl.c reclaim_block: "usually pick the data unit with the most deleted
// blocks", and one reclamation in shuffle_freq = 50 the least-erased unit, which moves static
// data so that its segment takes its share of erasures). Without the key the cleaner is greedy.
// As utilisation (live bytes / capacity) grows, victims hold more live data: each cleaning
// copies more and frees less, so energy, time and erasures per byte written grow.
//
// A device whose profile has no erase segment (a flash disk such as the SDP10, whose erasure is
// inside its write bandwidth) has no cleaning: writes cost latency + bytes / bandwidth.
//
// Thread-safety: not thread-safe; a value owned by one simulation.
#ifndef GHOST_COMMON_POWER_FLASH_MODEL_H_
#define GHOST_COMMON_POWER_FLASH_MODEL_H_

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "common/base/status.h"
#include "common/base/units.h"
#include "common/power/profile.h"

namespace ghost {

enum class CleaningPolicy { kOnDemand, kAsynchronous };
std::optional<CleaningPolicy> ParseCleaningPolicy(std::string_view text);  // on-demand|async
const char* CleaningPolicyName(CleaningPolicy policy);

// What one operation cost the device.
struct FlashCost {
  Duration time{0};    // the request's response time (queueing behind the card included)
  Energy energy;       // the device's energy above its idle power (I/O, copies, erasures)
  Duration background{0};  // bus time the cleaner's copies took after the request (kAsynchronous)
  Bytes copied = 0;    // live bytes moved by cleaning
  int erasures = 0;
};

struct FlashStats {
  std::uint64_t erasures = 0;
  Bytes copied = 0;
  Bytes written = 0;  // by the user
  std::uint64_t cleanings = 0;
  std::uint32_t max_segment_erasures = 0;
  // Cleanings whose victim was the least-worn segment (clean_wear_shuffle, round 16).
  std::uint64_t wear_cleanings = 0;
  // Idle-time cleaner (clean_idle_ms): block copies it made, requests that waited for one in
  // progress, and writes that waited for the rest of a cleaning holding the reserve.
  std::uint64_t idle_block_copies = 0;
  std::uint64_t preempted_waits = 0;
  std::uint64_t writes_finishing_a_cleaning = 0;
  // Host blocks that waited for an erasure in flight on their chip (round 14), and how long.
  std::uint64_t writes_behind_an_erasure = 0;
  Duration wait_behind_erasures{0};
  // Erasures of cleanings forced inside a write that were held back while the writer was
  // programming the victim's chip (round 15, clean_idle_ms).
  std::uint64_t erasures_deferred = 0;
  // Copied blocks (a cleaning's) that waited for an erasure in flight on their chip (a write's
  // cleaning: inside its response), and how long (round 15).
  std::uint64_t copies_behind_an_erasure = 0;
  Duration copy_wait_behind_erasures{0};
};

class FlashModel {
 public:
  // `device` must be kind flash with a capacity and a mode 0 that serves I/O. Fails with a
  // message naming what is missing. `block` divides the erase segment.
  static Result<FlashModel> Create(const DeviceProfile& device, CleaningPolicy policy,
                                   Bytes block = 4096);

  // Fills the device with `fraction` (0..1) of its capacity of cold data, laid out as after a
  // long life: the cold data packed in full segments, the free space dead blocks (written and
  // overwritten), only the cleaner's reserve erased; at no cost: the §5.2 starting point.
  void Preload(double fraction);

  // Starts the measured period: forgets the counters, the per-segment erasure counts and the
  // clocks (interface, eraser, segments' erasures in flight), keeps the layout (which blocks are
  // live where, which segments are erased). For a card brought to a workload's steady state
  // first (FlashSimOptions::steady_state).
  void StartMeasuring();

  // Reads / writes `size` bytes at byte `address` of the device's logical space (wrapped into
  // it), the request arriving at `arrival` (not before the previous one's); returns the cost.
  // Addresses are block-aligned inward. The forms without `arrival` issue the request when the
  // card's interface is next free (back to back): their time has no queueing in it.
  FlashCost Read(TimePoint arrival, Bytes address, Bytes size);
  FlashCost Write(TimePoint arrival, Bytes address, Bytes size);
  FlashCost Read(Bytes address, Bytes size) { return Read(bus_free_, address, size); }
  FlashCost Write(Bytes address, Bytes size) { return Write(bus_free_, address, size); }

  // When the card's interface is free and when its last erasure (on any chip) ends.
  TimePoint bus_free() const { return bus_free_; }
  TimePoint busy_until() const;

  double utilisation() const;
  const FlashStats& stats() const { return stats_; }
  const std::vector<std::uint32_t>& erase_counts() const { return erase_counts_; }
  // Erasures per segment over the card's life: not reset by StartMeasuring.
  const std::vector<std::uint32_t>& wear() const { return wear_; }
  bool has_cleaning() const { return segment_blocks_ > 0; }

  void AssertInvariants() const;

 private:
  FlashModel(const DeviceProfile& device, CleaningPolicy policy, Bytes block);
  // Puts logical block `lb` at the write point; may need an erased segment. `*t` is the time
  // on the bus: it moves on by any wait for a segment (an erasure in flight, an on-demand
  // cleaning). `foreground`: a user write (it may clean); false: a copy or the preload.
  void Place(std::uint64_t lb, TimePoint* t, FlashCost* cost, bool foreground);
  void TakeErasedSegment(TimePoint* t, FlashCost* cost);
  // Opens erased segment `erased_.back()` as the active one, waiting at `*t` for its erasure.
  void OpenErased(TimePoint* t);
  // One cleaning from bus time `*t`: the copies move `*t` on; the erasure too if `wait_erase`
  // (on demand), else it runs on the victim's chip (one erasure at a time per chip, chips at
  // once) and marks the segment ready.
  // `defer`: the erasure may be held back while the writer programs the victim's chip (Erase).
  void Clean(TimePoint* t, FlashCost* cost, bool wait_erase, bool defer = false);
  Duration TransferTime(Bytes size, bool write) const;
  // The segment the next cleaning picks: greedy, the fewest live blocks, not active, not erased
  // (every clean_wear_shuffle-th cleaning: the least-worn such segment); -1 if none.
  std::int64_t Victim() const;
  bool WearCleaningNext() const {
    return geometry_.clean_wear_shuffle > 0 &&
           (stats_.cleanings + 1) % geometry_.clean_wear_shuffle == 0;
  }
  // The index in erased_ of the segment a writer or the cleaner's copies take next.
  std::size_t NextErased() const;
  // When `segment` can be programmed: its erasure over and its chip erasing nothing else.
  TimePoint WritableAt(std::size_t segment) const;
  // When the next block put at the write point (the active segment's room, else the next erased
  // segment) could be programmed, from `t`.
  TimePoint NextBlockWritableAt(TimePoint t) const;
  std::size_t Chip(std::size_t segment) const { return segment / chip_segments_; }
  // kAsynchronous: when the next cleaning's copies could start from bus time `t` without
  // waiting for an erasure in flight (their destination: room left in the active segment, or
  // the next erased segment once its erasure has ended).
  TimePoint CopiesCanStart(TimePoint t) const;
  // kAsynchronous: runs the background cleaning that was left waiting for an erasure, in the
  // idle time before a request arriving at `arrival`; charges it to `cost`.
  void CatchUp(TimePoint arrival, FlashCost* cost);
  // clean_idle_ms: the idle-time cleaner before a request arriving at `arrival`: from the moment
  // the card has been idle for the threshold, block copies (each starting before `arrival`, the
  // last one may run past it) and erasures, until one segment beyond the reserve is erased or
  // being erased; charges them to `cost`.
  void CleanWhileIdle(TimePoint arrival, FlashCost* cost);
  // Issues the erasure of `victim` (no live block left) at `t` on its chip; charges `cost`.
  // `defer` (a cleaning forced inside a write, idle-time cleaner): if the writer's active
  // segment is on the victim's chip and has room, the erasure is held back (deferred_) until
  // the writer leaves that chip or the card goes idle (IssueDeferred); energy and counts are
  // charged now.
  void Erase(std::size_t victim, TimePoint t, FlashCost* cost, bool defer = false);
  // Starts the erasure of `victim` at `t` on its chip (after the one in flight there).
  void StartErase(std::size_t victim, TimePoint t);
  // Starts the deferred erasures at `t`: all of them, or (`all` false) those not on the chip
  // the writer is programming.
  void IssueDeferred(TimePoint t, bool all);
  // Before a request arriving at `arrival`: if the card has been idle for the idle cleaner's
  // threshold, the deferred erasures start then.
  void IssueDeferredIfIdle(TimePoint arrival);
  bool idle_cleaner() const {
    return policy_ == CleaningPolicy::kAsynchronous && geometry_.clean_idle.has_value();
  }

  IoModel io_;
  FlashGeometry geometry_;
  CleaningPolicy policy_;
  Bytes block_;
  std::uint64_t blocks_ = 0;          // logical and physical blocks
  std::uint64_t segment_blocks_ = 0;  // 0: no cleaning model
  std::vector<std::int64_t> where_;   // logical block -> physical block, -1 if never written
  std::vector<std::int64_t> owner_;   // physical block -> logical block, -1 if free or dead
  std::vector<std::uint32_t> live_;   // live blocks per segment
  std::vector<std::uint32_t> erase_counts_;
  std::vector<std::uint32_t> wear_;   // erasures per segment over the card's life
  std::vector<std::uint64_t> erased_;  // erased segments
  std::int64_t active_ = -1;          // segment being written
  std::uint64_t write_point_ = 0;     // next block within the active segment
  std::vector<TimePoint> ready_at_;   // per segment: when its last erasure ends
  TimePoint bus_free_{};              // the card's interface is busy until then
  std::uint64_t chip_segments_ = 1;    // erase segments per chip (all of them: one chip)
  std::vector<TimePoint> chip_free_;  // per chip: its erasure in flight ends then
  std::int64_t cleaning_ = -1;        // idle cleaner: the victim whose copies are under way
  std::vector<std::size_t> deferred_;  // erased (no live block), erasure not yet started
  FlashStats stats_;
};

}  // namespace ghost

#endif  // GHOST_COMMON_POWER_FLASH_MODEL_H_
