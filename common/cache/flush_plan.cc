#include "common/cache/flush_plan.h"

#include <cassert>
#include <iterator>
#include <map>
#include <tuple>
#include <utility>

namespace ghost {

const char* LogRecordKindName(LogRecordKind kind) {
  switch (kind) {
    case LogRecordKind::kFill: return "fill";
    case LogRecordKind::kLocalWrite: return "local-write";
    case LogRecordKind::kMeta: return "meta";
    case LogRecordKind::kBlock: return "block";
  }
  return "?";
}

const char* MetaOpName(MetaOp op) {
  switch (op) {
    case MetaOp::kNone: return "none";
    case MetaOp::kTruncate: return "truncate";
    case MetaOp::kUnlink: return "unlink";
    case MetaOp::kRename: return "rename";
    case MetaOp::kMkdir: return "mkdir";
    case MetaOp::kRmdir: return "rmdir";
    case MetaOp::kChmod: return "chmod";
    case MetaOp::kCreate: return "create";
    case MetaOp::kFill: return "fill";
  }
  return "?";
}

std::optional<FlushAlgorithm> ParseFlushAlgorithm(std::string_view text) {
  if (text == "1" || text == "one-record") return FlushAlgorithm::kOneRecord;
  if (text == "2" || text == "chunked") return FlushAlgorithm::kChunked;
  if (text == "3" || text == "double-buffer") return FlushAlgorithm::kDoubleBuffer;
  if (text == "4" || text == "sort-merge") return FlushAlgorithm::kSortMerge;
  return std::nullopt;
}

const char* FlushAlgorithmName(FlushAlgorithm alg) {
  switch (alg) {
    case FlushAlgorithm::kOneRecord: return "one-record";
    case FlushAlgorithm::kChunked: return "chunked";
    case FlushAlgorithm::kDoubleBuffer: return "double-buffer";
    case FlushAlgorithm::kSortMerge: return "sort-merge";
  }
  return "?";
}

namespace {

// One data record's write, unmerged (algorithms 1-3).
PlannedOp WriteOf(const std::vector<PlanRecord>& records, std::size_t i) {
  const PlanRecord& r = records[i];
  PlannedOp op;
  op.type = PlannedOp::Type::kWrite;
  op.kind = r.kind;
  op.path = r.path;
  op.offset = r.offset;
  op.length = r.length;
  op.pieces.push_back({i, 0, r.length});
  op.records.push_back(i);
  return op;
}

// A byte range of the target that one record's data supplies.
struct Segment {
  Bytes end = 0;
  std::size_t record = 0;
  Bytes data_offset = 0;  // of the segment's first byte within the record's data
};

// Sorts a run of data records (no metadata record among them) by address and merges
// overlapping and adjacent ones, later records winning (algorithm 4).
void SortAndMerge(const std::vector<PlanRecord>& records, const std::vector<std::size_t>& run,
                  std::vector<PlannedOp>* ops) {
  using FileKey = std::pair<LogRecordKind, std::string>;
  std::map<FileKey, std::map<Bytes, Segment>> files;  // start -> segment, disjoint
  std::map<FileKey, std::vector<std::size_t>> members;
  for (std::size_t i : run) {  // log order = sequence order: later inserts win
    const PlanRecord& r = records[i];
    if (r.length == 0) continue;
    FileKey key{r.kind, r.path};
    members[key].push_back(i);
    auto& segs = files[key];
    const Bytes start = r.offset;
    const Bytes end = r.offset + r.length;
    // The segment starting before `start` that reaches into [start, end): cut it at `start`,
    // keeping its part past `end` as a new segment.
    auto it = segs.lower_bound(start);
    if (it != segs.begin()) {
      auto prev = std::prev(it);
      if (prev->second.end > start) {
        Segment old = prev->second;
        prev->second.end = start;
        if (old.end > end) {
          segs[end] = {old.end, old.record, old.data_offset + (end - prev->first)};
        }
      }
    }
    // Segments starting in [start, end): drop them, keeping a tail that reaches past `end`.
    it = segs.lower_bound(start);
    while (it != segs.end() && it->first < end) {
      Segment old = it->second;
      Bytes old_start = it->first;
      it = segs.erase(it);
      if (old.end > end) {
        segs[end] = {old.end, old.record, old.data_offset + (end - old_start)};
        break;
      }
    }
    segs[start] = {end, i, 0};
  }
  for (auto& [key, segs] : files) {
    std::vector<PlannedOp> file_ops;
    for (const auto& [start, seg] : segs) {
      if (file_ops.empty() || file_ops.back().offset + file_ops.back().length != start) {
        PlannedOp op;
        op.type = PlannedOp::Type::kWrite;
        op.kind = key.first;
        op.path = key.second;
        op.offset = start;
        file_ops.push_back(std::move(op));
      }
      PlannedOp& op = file_ops.back();
      op.pieces.push_back({seg.record, seg.data_offset, seg.end - start});
      op.length += seg.end - start;
    }
    // Each record's whole range lies inside exactly one merged write.
    for (std::size_t i : members[key]) {
      const PlanRecord& r = records[i];
      for (PlannedOp& op : file_ops) {
        if (r.offset >= op.offset && r.offset + r.length <= op.offset + op.length) {
          op.records.push_back(i);
          break;
        }
      }
    }
    for (PlannedOp& op : file_ops) ops->push_back(std::move(op));
  }
}

void PlanStepOps(const std::vector<PlanRecord>& records, std::size_t first, std::size_t last,
                 FlushAlgorithm alg, FlushStep* step) {
  std::vector<std::size_t> run;
  auto end_run = [&] {
    if (alg == FlushAlgorithm::kSortMerge) {
      SortAndMerge(records, run, &step->ops);
    } else {
      for (std::size_t i : run) {
        if (records[i].length > 0) step->ops.push_back(WriteOf(records, i));
      }
    }
    run.clear();
  };
  for (std::size_t i = first; i < last; ++i) {
    if (records[i].kind == LogRecordKind::kMeta) {
      end_run();
      PlannedOp op;
      op.type = PlannedOp::Type::kMeta;
      op.kind = LogRecordKind::kMeta;
      op.path = records[i].path;
      op.records.push_back(i);
      step->ops.push_back(std::move(op));
    } else {
      run.push_back(i);
    }
  }
  end_run();
}

}  // namespace

FlushPlan PlanFlush(const std::vector<PlanRecord>& records, FlushAlgorithm alg, Bytes buffer) {
  assert(buffer > 0);
  FlushPlan plan;
  plan.algorithm = alg;
  plan.buffer = buffer;
  plan.overlap = alg == FlushAlgorithm::kDoubleBuffer || alg == FlushAlgorithm::kSortMerge;
  std::size_t i = 0;
  while (i < records.size()) {
    std::size_t first = i;
    Bytes start = records[i].log_offset;
    ++i;
    if (alg != FlushAlgorithm::kOneRecord) {
      while (i < records.size() &&
             records[i].log_offset + records[i].log_length - start <= buffer) {
        ++i;
      }
    }
    FlushStep step;
    step.read_offset = start;
    step.read_length = records[i - 1].log_offset + records[i - 1].log_length - start;
    PlanStepOps(records, first, i, alg, &step);
    plan.steps.push_back(std::move(step));
  }
  for (const PlanRecord& r : records) plan.record_bytes += r.length;
  for (const FlushStep& s : plan.steps) {
    for (const PlannedOp& op : s.ops) {
      if (op.type == PlannedOp::Type::kWrite) {
        plan.written_bytes += op.length;
        ++plan.writes;
      }
    }
  }
  return plan;
}

}  // namespace ghost
