// FlushPlan: what a flash-log flush reads from the log and writes to the disk, for each of the
// NVCache flush algorithms (DESIGN §3.5). Pure: no I/O, no clock.
//
// One owner for the algorithm: the live flusher (flash_log.h) executes a plan through FileIo,
// and ghostsim (common/sim/flash_sim.h) prices the same plan with the device models, so the
// simulated and the measured flush differ only in the devices.
//
// The algorithms (after the NVCache paper's flush policies, DESIGN §1 and §3.5):
//   kOneRecord    (1) read one record from the log, write it, then the next record;
//   kChunked      (2) read a DRAM buffer's worth of records in one read, write them in log
//                     order, then read the next buffer;
//   kDoubleBuffer (3) as (2) with two buffers: the next buffer is read while the current one
//                     is written;
//   kSortMerge    (4) as (3), and the data records of a buffer are sorted by address (kind,
//                     path, offset) and overlapping or adjacent records merged into one write,
//                     the later record (higher sequence number) winning where they overlap.
// A metadata record (rename, unlink, truncate ...) is a barrier: data records are never sorted
// or merged across it, so a write before an unlink never lands after it.
//
// Records are never larger than the buffer (FlashLog splits larger writes when appending), so
// one step reads one contiguous range of the log of at most `buffer` bytes, except that a
// single record is always read whole.
//
// Thread-safety: plain functions over values.
#ifndef GHOST_COMMON_CACHE_FLUSH_PLAN_H_
#define GHOST_COMMON_CACHE_FLUSH_PLAN_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/base/units.h"

namespace ghost {

// What a log record stands for.
enum class LogRecordKind : std::uint8_t {
  kFill = 1,        // a cache fill: bytes of a cache object (path = cache key)
  kLocalWrite = 2,  // bytes written into a file of local/ (path relative to the local root)
  kMeta = 3,        // a metadata change (see MetaOp)
  kBlock = 4,       // a block of a block device (ghostsim's block traces; path names the device)
};
const char* LogRecordKindName(LogRecordKind kind);

// The metadata change a kMeta record stands for. `arg` and `arg2` of the record:
enum class MetaOp : std::uint8_t {
  kNone = 0,
  kTruncate = 1,  // arg = the new size
  kUnlink = 2,
  kRename = 3,    // arg2 = the new path
  kMkdir = 4,     // arg = the mode
  kRmdir = 5,
  kChmod = 6,     // arg = the mode
  kCreate = 7,    // arg = the mode
  // The commit record of a fill spilled to the log (fs/write_back.h): it follows the fill's
  // kFill data records (same path) in the same append group; arg = the body's size, arg2 = the
  // body's CRC32C and its cache metadata. Data records without it are a fill never committed.
  kFill = 8,
};
const char* MetaOpName(MetaOp op);

enum class FlushAlgorithm : std::uint8_t {
  kOneRecord = 1,
  kChunked = 2,
  kDoubleBuffer = 3,
  kSortMerge = 4,
};
// "1".."4" or the names "one-record", "chunked", "double-buffer", "sort-merge".
std::optional<FlushAlgorithm> ParseFlushAlgorithm(std::string_view text);
const char* FlushAlgorithmName(FlushAlgorithm alg);

// Where a record is in the log and what it says, as the planner needs it.
struct PlanRecord {
  std::uint64_t seq = 0;
  LogRecordKind kind = LogRecordKind::kLocalWrite;
  std::string path;
  Bytes offset = 0;       // in the target file (data records)
  Bytes length = 0;       // data bytes (data records); 0 for kMeta
  Bytes log_offset = 0;   // where the record starts in the log
  Bytes log_length = 0;   // the whole record: header, path, data
  Bytes data_offset = 0;  // where its data starts, from log_offset
};

// Bytes [data_offset, data_offset + length) of record `record`'s data.
struct PlannedPiece {
  std::size_t record = 0;  // index into the planned records
  Bytes data_offset = 0;
  Bytes length = 0;
};

struct PlannedOp {
  enum class Type { kWrite, kMeta } type = Type::kWrite;
  LogRecordKind kind = LogRecordKind::kLocalWrite;
  std::string path;
  Bytes offset = 0;  // kWrite: where the write starts in the target
  Bytes length = 0;  // kWrite: sum of the pieces' lengths
  // kWrite: the bytes, in target order and contiguous. kMeta: empty.
  std::vector<PlannedPiece> pieces;
  // Every record this op stands for (kMeta: the one record; kWrite: all whose bytes it carries
  // and those it overwrote). If the op fails these records are kept in the log.
  std::vector<std::size_t> records;
};

struct FlushStep {
  Bytes read_offset = 0;  // one read of the log
  Bytes read_length = 0;
  // Done in order, one at a time; the live flusher issues alg 4's writes between two kMeta ops
  // together (they are disjoint after merging), see FlashLog::Flusher.
  std::vector<PlannedOp> ops;
};

struct FlushPlan {
  FlushAlgorithm algorithm = FlushAlgorithm::kSortMerge;
  Bytes buffer = 0;
  // Reads of step k+1 overlap the writes of step k (algorithms 3 and 4).
  bool overlap = false;
  std::vector<FlushStep> steps;
  Bytes record_bytes = 0;   // data bytes of the records
  Bytes written_bytes = 0;  // data bytes the plan writes
  std::size_t writes = 0;   // write ops
  Bytes merged_away() const { return record_bytes - written_bytes; }
};

// Plans the flush of `records` (in log order: increasing log_offset and seq) with `alg` and a
// DRAM buffer of `buffer` bytes (> 0; algorithm 1 uses one record as its buffer).
FlushPlan PlanFlush(const std::vector<PlanRecord>& records, FlushAlgorithm alg, Bytes buffer);

}  // namespace ghost

#endif  // GHOST_COMMON_CACHE_FLUSH_PLAN_H_
