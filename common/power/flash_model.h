// FlashModel: the erase-and-clean cost of a flash device (DESIGN §3.7), after Douglis et al.,
// "Storage alternatives for mobile computers" (OSDI 1994), §3 and §5.2.
//
// A flash card cannot overwrite in place: it writes into erased segments and reclaims space by
// cleaning. The model keeps the card log-structured at `block` granularity:
//   - a write puts each block at the write point of the active segment and invalidates the
//     block's old copy; a full active segment is replaced by an erased one;
//   - when no erased segment is left, the cleaner picks the segment with the fewest live blocks
//     (not the active one), copies its live blocks to the write point (a read and a write of
//     each), and erases it (erase time, erase energy, one more erasure of that segment);
//   - kOnDemand cleans inside the write that needs space (the write waits for it);
//     kAsynchronous cleans after each write until one segment is erased again, so the cost is
//     energy and erasures but not the next write's response time (unless one write needs more
//     than the one erased segment holds; then it waits like kOnDemand).
// As utilisation (live bytes / capacity) grows, victims hold more live data: each cleaning
// copies more and frees less, so energy, time and erasures per byte written grow.
//
// A device whose profile has no erase segment (a flash disk such as the SDP10, whose erasure is
// inside its write bandwidth) has no cleaning: writes cost latency + bytes / bandwidth.
//
// Thread-safety: not thread-safe; a value owned by one simulation.
#ifndef GHOST_COMMON_POWER_FLASH_MODEL_H_
#define GHOST_COMMON_POWER_FLASH_MODEL_H_

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
  Duration time{0};    // added to the request's response time
  Energy energy;       // the device's energy above its idle power (I/O, copies, erasures)
  Duration background{0};  // time spent cleaning after the request (kAsynchronous)
  Bytes copied = 0;    // live bytes moved by cleaning
  int erasures = 0;
};

struct FlashStats {
  std::uint64_t erasures = 0;
  Bytes copied = 0;
  Bytes written = 0;  // by the user
  std::uint64_t cleanings = 0;
  std::uint32_t max_segment_erasures = 0;
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

  // Reads / writes `size` bytes at byte `address` of the device's logical space (wrapped into
  // it); returns the cost. Addresses are block-aligned inward.
  FlashCost Read(Bytes address, Bytes size) const;
  FlashCost Write(Bytes address, Bytes size);

  double utilisation() const;
  const FlashStats& stats() const { return stats_; }
  const std::vector<std::uint32_t>& erase_counts() const { return erase_counts_; }
  bool has_cleaning() const { return segment_blocks_ > 0; }

  void AssertInvariants() const;

 private:
  FlashModel(const DeviceProfile& device, CleaningPolicy policy, Bytes block);
  // Puts logical block `lb` at the write point; may need an erased segment.
  void Place(std::uint64_t lb, FlashCost* cost, bool charge_time);
  void TakeErasedSegment(FlashCost* cost, bool charge_time);
  void Clean(FlashCost* cost, bool charge_time);
  Duration TransferTime(Bytes size, bool write) const;

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
  std::vector<std::uint64_t> erased_;  // erased segments
  std::int64_t active_ = -1;          // segment being written
  std::uint64_t write_point_ = 0;     // next block within the active segment
  FlashStats stats_;
};

}  // namespace ghost

#endif  // GHOST_COMMON_POWER_FLASH_MODEL_H_
