#include "common/cache/flash_log.h"

#include <fcntl.h>
#include <isa-l/crc.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <set>
#include <utility>

namespace ghost {

std::uint32_t Crc32c(std::string_view data, std::uint32_t crc) {
  // ISA-L's crc32_iscsi takes and returns the register without the final inversion.
  return ~crc32_iscsi(reinterpret_cast<unsigned char*>(const_cast<char*>(data.data())),
                      static_cast<int>(data.size()), ~crc);
}

std::optional<LogFlushPolicy> ParseLogFlushPolicy(std::string_view text) {
  if (text == "each-spinup") return LogFlushPolicy::kEachSpinUp;
  if (text == "when-full") return LogFlushPolicy::kWhenFull;
  return std::nullopt;
}

const char* LogFlushPolicyName(LogFlushPolicy policy) {
  return policy == LogFlushPolicy::kEachSpinUp ? "each-spinup" : "when-full";
}

const char* LogFlushReasonName(LogFlushReason reason) {
  switch (reason) {
    case LogFlushReason::kSpinUp: return "spin-up";
    case LogFlushReason::kFull: return "full";
    case LogFlushReason::kRecovery: return "recovery";
    case LogFlushReason::kExplicit: return "explicit";
  }
  return "?";
}

namespace {

constexpr std::uint32_t kMagic = 0x314C4647;  // "GFL1" little-endian
constexpr std::string_view kLogName = "flash.log";

void Put(std::string* out, std::uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

std::uint64_t Get(std::string_view in, std::size_t at, int bytes) {
  std::uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) {
    v |= std::uint64_t{static_cast<unsigned char>(in[at + i])} << (8 * i);
  }
  return v;
}

std::string Encode(std::uint64_t seq, LogRecordKind kind, MetaOp op, std::string_view path,
                   Bytes offset, std::string_view data) {
  std::string out;
  out.reserve(FlashLog::kHeaderSize + path.size() + data.size());
  Put(&out, kMagic, 4);
  Put(&out, 0, 4);  // CRC, filled below
  Put(&out, seq, 8);
  Put(&out, static_cast<std::uint8_t>(kind), 1);
  Put(&out, static_cast<std::uint8_t>(op), 1);
  Put(&out, path.size(), 2);
  Put(&out, data.size(), 4);
  Put(&out, offset, 8);
  out.append(path);
  out.append(data);
  std::uint32_t crc = Crc32c(std::string_view(out).substr(8));
  for (int i = 0; i < 4; ++i) out[4 + i] = static_cast<char>((crc >> (8 * i)) & 0xff);
  return out;
}

enum class DecodeResult { kOk, kTorn, kBad };

// Decodes the record at `at` of `log`: kTorn if it runs past the end, kBad if its magic, CRC,
// kind or sequence number (must exceed `last_seq`) is wrong.
DecodeResult Decode(std::string_view log, Bytes at, std::uint64_t last_seq, LogRecordInfo* info) {
  if (log.size() - at < FlashLog::kHeaderSize) return DecodeResult::kTorn;
  if (Get(log, at, 4) != kMagic) return DecodeResult::kBad;
  Bytes path_len = Get(log, at + 18, 2);
  Bytes data_len = Get(log, at + 20, 4);
  Bytes total = FlashLog::kHeaderSize + path_len + data_len;
  if (log.size() - at < total) return DecodeResult::kTorn;
  std::uint32_t crc = static_cast<std::uint32_t>(Get(log, at + 4, 4));
  if (Crc32c(log.substr(at + 8, total - 8)) != crc) return DecodeResult::kBad;
  auto kind = static_cast<LogRecordKind>(Get(log, at + 16, 1));
  if (kind < LogRecordKind::kFill || kind > LogRecordKind::kBlock) return DecodeResult::kBad;
  std::uint64_t seq = Get(log, at + 8, 8);
  if (seq <= last_seq) return DecodeResult::kBad;
  info->seq = seq;
  info->kind = kind;
  info->op = static_cast<MetaOp>(Get(log, at + 17, 1));
  info->path.assign(log.substr(at + FlashLog::kHeaderSize, path_len));
  info->offset = Get(log, at + 24, 8);
  info->length = data_len;
  info->log_offset = at;
  info->log_length = total;
  return DecodeResult::kOk;
}

Status ReadAll(int fd, const std::string& what, std::string* out) {
  struct stat st;
  if (fstat(fd, &st) != 0) return Status::FromErrno(errno, "stat " + what);
  out->resize(static_cast<std::size_t>(st.st_size));
  std::size_t done = 0;
  while (done < out->size()) {
    ssize_t n = pread(fd, out->data() + done, out->size() - done, static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Status::FromErrno(errno, "read " + what);
    if (n == 0) break;
    done += static_cast<std::size_t>(n);
  }
  out->resize(done);
  return Status::Ok();
}

Status PreadExact(int fd, char* buf, std::size_t len, Bytes offset, const std::string& what) {
  std::size_t done = 0;
  while (done < len) {
    ssize_t n = pread(fd, buf + done, len - done, static_cast<off_t>(offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Status::FromErrno(errno, "read " + what);
    if (n == 0) return Status::Corruption("short read of " + what);
    done += static_cast<std::size_t>(n);
  }
  return Status::Ok();
}

Status WriteExact(int fd, std::string_view data, Bytes offset, const std::string& what) {
  std::size_t done = 0;
  while (done < data.size()) {
    ssize_t n = pwrite(fd, data.data() + done, data.size() - done,
                       static_cast<off_t>(offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Status::FromErrno(errno, "write " + what);
    done += static_cast<std::size_t>(n);
  }
  return Status::Ok();
}

Status SyncDir(const std::string& dir) {
  UniqueFd fd(open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!fd.valid()) return Status::FromErrno(errno, "open directory " + dir);
  if (fsync(fd.get()) != 0) return Status::FromErrno(errno, "fsync directory " + dir);
  return Status::Ok();
}

}  // namespace

// An append waiting for its write, or in it.
struct FlashLog::Pending {
  LogRecordKind kind;
  MetaOp op;
  std::string path;
  Bytes offset;
  std::string data;
  AppendDone done;
  LogRecordInfo info;  // filled when written
  bool with_next = false;  // one group with the next pending record (AppendFill)
};

std::string FlashLog::log_path() const { return options_.dir + "/" + std::string(kLogName); }

FlashLog::FlashLog(const FlashLogOptions& options, FileIo& io, FlushTarget& target, UniqueFd fd)
    : options_(options), io_(io), target_(target), fd_(std::move(fd)),
      alive_(std::make_shared<bool>(true)) {
  stats_.capacity = options_.capacity;
}

FlashLog::~FlashLog() = default;

Result<std::unique_ptr<FlashLog>> FlashLog::Open(const FlashLogOptions& options, FileIo& io,
                                                  FlushTarget& target, RecoveryReport* report) {
  if (options.buffer < kHeaderSize + 1 || options.capacity < options.buffer) {
    return Status::InvalidArgument("flash log " + options.dir + ": the buffer (" +
                                   std::to_string(options.buffer) +
                                   " bytes) must exceed a record header and fit the capacity (" +
                                   std::to_string(options.capacity) + " bytes)");
  }
  std::string path = options.dir + "/" + std::string(kLogName);
  UniqueFd fd(open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600));
  if (!fd.valid()) {
    return Status::FromErrno(errno, "open flash log " + path)
        .WithContext("the flash log needs a writable directory on the flash device");
  }
  std::unique_ptr<FlashLog> log(new FlashLog(options, io, target, std::move(fd)));
  RecoveryReport local;
  Status st = log->Recover(report != nullptr ? report : &local);
  if (!st.ok()) return st;
  return log;
}

Status FlashLog::Recover(RecoveryReport* report) {
  std::string log;
  if (Status st = ReadAll(fd_.get(), log_path(), &log); !st.ok()) return st;
  Bytes pos = 0;
  std::uint64_t last_seq = 0;
  while (pos < log.size()) {
    LogRecordInfo info;
    DecodeResult r = Decode(log, pos, last_seq, &info);
    if (r == DecodeResult::kOk) {
      last_seq = info.seq;
      pos += info.log_length;
      records_.push_back(std::move(info));
      continue;
    }
    // Is there a valid record later? Then this is corruption in the middle, else a torn tail.
    Bytes next = pos + 1;
    LogRecordInfo later;
    for (; next + kHeaderSize <= log.size(); ++next) {
      if (Get(log, next, 4) == kMagic &&
          Decode(log, next, last_seq, &later) == DecodeResult::kOk) {
        break;
      }
    }
    if (next + kHeaderSize > log.size()) {
      report->torn_tail_cut = log.size() - pos;
      if (ftruncate(fd_.get(), static_cast<off_t>(pos)) != 0 || fsync(fd_.get()) != 0) {
        return Status::FromErrno(errno, "cut the torn tail of " + log_path());
      }
      log.resize(pos);
      break;
    }
    CorruptRegion region{pos, next - pos, ""};
    // A new name: a copy an earlier recovery saved at the same offset stays as it was.
    std::string saved = options_.dir + "/corrupt-" + std::to_string(pos) + ".bin";
    UniqueFd out(open(saved.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
    for (int n = 1; !out.valid() && errno == EEXIST && n < 1000; ++n) {
      saved = options_.dir + "/corrupt-" + std::to_string(pos) + "." + std::to_string(n) + ".bin";
      out = UniqueFd(open(saved.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
    }
    if (out.valid() &&
        WriteExact(out.get(), std::string_view(log).substr(pos, next - pos), 0, saved).ok() &&
        fsync(out.get()) == 0) {
      region.saved_as = saved;
    }
    report->corrupt.push_back(region);
    ++stats_.corrupt_regions;
    pos = next;
  }
  tail_ = log.size();
  next_seq_ = last_seq + 1;
  report->records = records_.size();
  stats_.used = tail_;
  stats_.records = records_.size();
  return Status::Ok();
}

void FlashLog::AppendWrite(LogRecordKind kind, std::string path, Bytes offset,
                           std::string_view data, AppendDone done) {
  assert(kind != LogRecordKind::kMeta);
  if (data.empty()) {
    done(next_seq_ - 1);
    return;
  }
  const Bytes max_data = options_.buffer - kHeaderSize - path.size();
  if (path.size() > 0xffff || options_.buffer <= kHeaderSize + path.size()) {
    done(Status::InvalidArgument("flash log: path too long for a record: " + path));
    return;
  }
  // One callback for all pieces: the first error, or the last sequence number.
  struct Join {
    std::size_t remaining;
    Status error;
    std::uint64_t last_seq = 0;
    AppendDone done;
  };
  std::size_t pieces = (data.size() + max_data - 1) / max_data;
  auto join = std::make_shared<Join>(Join{pieces, Status::Ok(), 0, std::move(done)});
  for (std::size_t i = 0; i < pieces; ++i) {
    Bytes at = i * max_data;
    std::string part(data.substr(at, max_data));
    auto p = std::make_unique<Pending>(Pending{kind, MetaOp::kNone, path, offset + at,
                                               std::move(part), nullptr, {}, false});
    p->done = [join](Result<std::uint64_t> r) {
      if (!r.ok() && join->error.ok()) join->error = r.status();
      if (r.ok()) join->last_seq = std::max(join->last_seq, *r);
      if (--join->remaining == 0) {
        if (join->error.ok()) {
          join->done(join->last_seq);
        } else {
          join->done(join->error);
        }
      }
    };
    pending_.push_back(std::move(p));
  }
  Pump();
}

void FlashLog::AppendMeta(MetaOp op, std::string path, Bytes arg, std::string arg2,
                          AppendDone done) {
  if (kHeaderSize + path.size() + arg2.size() > options_.buffer || path.size() > 0xffff) {
    done(Status::InvalidArgument("flash log: metadata record too large for " + path));
    return;
  }
  pending_.push_back(std::make_unique<Pending>(Pending{LogRecordKind::kMeta, op, std::move(path),
                                                       arg, std::move(arg2), std::move(done),
                                                       {}, false}));
  Pump();
}

void FlashLog::AppendFill(std::string path, std::string_view body, std::string commit_arg2,
                          AppendDone done) {
  const Bytes max_data = options_.buffer > kHeaderSize + path.size()
                             ? options_.buffer - kHeaderSize - path.size() : 0;
  if (path.size() > 0xffff || max_data == 0 ||
      kHeaderSize + path.size() + commit_arg2.size() > options_.buffer) {
    done(Status::InvalidArgument("flash log: fill record too large for " + path));
    return;
  }
  const std::size_t pieces = (body.size() + max_data - 1) / max_data;
  const Bytes group = pieces * (kHeaderSize + path.size()) + body.size() + kHeaderSize +
                      path.size() + commit_arg2.size();
  if (group > options_.capacity) {
    done(Status::InvalidArgument("flash log: a fill of " + std::to_string(body.size()) +
                                 " bytes does not fit in the log (" +
                                 std::to_string(options_.capacity) + " bytes)"));
    return;
  }
  // The data pieces' callbacks do nothing: the group is written (or fails) as one, and the
  // commit record's callback reports it.
  for (std::size_t i = 0; i < pieces; ++i) {
    Bytes at = i * max_data;
    auto p = std::make_unique<Pending>(Pending{LogRecordKind::kFill, MetaOp::kNone, path, at,
                                               std::string(body.substr(at, max_data)),
                                               [](Result<std::uint64_t>) {}, {}, true});
    pending_.push_back(std::move(p));
  }
  pending_.push_back(std::make_unique<Pending>(Pending{LogRecordKind::kMeta, MetaOp::kFill,
                                                       std::move(path), body.size(),
                                                       std::move(commit_arg2), std::move(done),
                                                       {}, false}));
  Pump();
}

void FlashLog::Flush(LogFlushReason reason, FlushDone done) {
  flush_requests_.emplace_back(reason, std::move(done));
  Pump();
}

void FlashLog::OnDiskSpinUp() {
  if (options_.policy == LogFlushPolicy::kEachSpinUp && !records_.empty()) {
    Flush(LogFlushReason::kSpinUp, nullptr);
  }
}

// Starts the next thing to do, if nothing is in flight: a flush asked for, else a write of
// the pending appends that fit, else (the first pending append does not fit) a kFull flush.
void FlashLog::Pump() {
  if (writing_ || flushing_) return;
  if (!flush_requests_.empty()) {
    StartFlush(flush_requests_.front().first);
    return;
  }
  if (pending_.empty()) return;
  std::string batch;
  std::vector<std::unique_ptr<Pending>> taken;
  Bytes at = tail_;
  while (!pending_.empty()) {
    // A group (AppendFill) goes whole or waits: it is never split by a flush.
    Bytes size = 0;
    for (const auto& q : pending_) {
      size += kHeaderSize + q->path.size() + q->data.size();
      if (!q->with_next) break;
    }
    if (at + size > options_.capacity) break;
    bool with_next = true;
    while (with_next) {
      Pending& p = *pending_.front();
      size = kHeaderSize + p.path.size() + p.data.size();
      std::string rec = Encode(next_seq_, p.kind, p.op, p.path, p.offset, p.data);
      p.info = LogRecordInfo{next_seq_, p.kind, p.op, p.path, p.offset, p.data.size(), at, size};
      ++next_seq_;
      batch += rec;
      at += size;
      with_next = p.with_next;
      taken.push_back(std::move(pending_.front()));
      pending_.pop_front();
    }
  }
  if (taken.empty()) {
    if (full_flush_done_) {
      // A kFull flush just ran and the record (or group) still does not fit (records were
      // kept: the disk refused them). Fail this append rather than flushing in a loop.
      full_flush_done_ = false;
      bool more = true;
      while (more && !pending_.empty()) {
        std::unique_ptr<Pending> p = std::move(pending_.front());
        pending_.pop_front();
        more = p->with_next;
        ++stats_.append_failures;
        p->done(Status::IoError("flash log " + log_path() + " is full and its flush could not "
                                "free space (see the flush errors); write to the disk instead"));
      }
      Pump();
      return;
    }
    flush_requests_.emplace_back(LogFlushReason::kFull, nullptr);
    StartFlush(LogFlushReason::kFull);
    return;
  }
  full_flush_done_ = false;
  writing_ = true;
  auto batch_state = std::make_shared<std::vector<std::unique_ptr<Pending>>>(std::move(taken));
  inflight_ = batch_state;
  std::weak_ptr<bool> alive = alive_;
  auto finish = [this, alive, batch_state](Status st) {
    if (alive.expired()) return;
    writing_ = false;
    inflight_.reset();
    if (!st.ok()) {
      // Drop the partial bytes; the log stays as it was before this batch.
      if (ftruncate(fd_.get(), static_cast<off_t>(tail_)) != 0) {
        st = st.WithContext("and the partial write could not be cut (" +
                            std::string(std::strerror(errno)) + ")");
      }
      for (auto& p : *batch_state) {
        ++stats_.append_failures;
        p->done(st.WithContext("flash log append to " + log_path()));
      }
    } else {
      const Bytes before = tail_;
      for (auto& p : *batch_state) {
        tail_ = p->info.log_offset + p->info.log_length;
        records_.push_back(p->info);
        ++stats_.appends;
      }
      stats_.used = tail_;
      if (append_observer_) append_observer_(tail_ - before);
      stats_.records = records_.size();
      for (auto& p : *batch_state) p->done(p->info.seq);
    }
    Pump();
  };
  io_.Write(fd_.get(), tail_, std::move(batch),
            [this, alive, finish](Result<std::size_t> r) {
              if (alive.expired()) return;
              if (!r.ok()) {
                finish(r.status());
                return;
              }
              io_.Fsync(fd_.get(), [finish](Status st) { finish(std::move(st)); });
            });
}

// Runs one flush: reads each step's range of the log into one of two buffers and does its
// ops, overlapping the next read with the current writes when the plan says so.
class FlashLog::Flusher {
 public:
  Flusher(FlashLog& log, LogFlushReason reason)
      : log_(log), alive_(log.alive_) {
    report_.reason = reason;
    report_.algorithm = log.options_.algorithm;
    for (const LogRecordInfo& r : log.records_) {
      PlanRecord p;
      p.seq = r.seq;
      p.kind = r.kind;
      p.path = r.path;
      p.offset = r.kind == LogRecordKind::kMeta ? 0 : r.offset;
      p.length = r.kind == LogRecordKind::kMeta ? 0 : r.length;
      p.log_offset = r.log_offset;
      p.log_length = r.log_length;
      p.data_offset = kHeaderSize + r.path.size();
      plan_records_.push_back(std::move(p));
    }
    plan_ = PlanFlush(plan_records_, log.options_.algorithm, log.options_.buffer);
    kept_.assign(plan_records_.size(), false);
    report_.steps = plan_.steps.size();
    report_.bytes_merged_away = plan_.merged_away();
    for (auto& b : buffers_) b = std::make_shared<std::string>();
  }

  void Start() { Advance(); }

  std::string Progress() const {
    std::string out = std::string("flushing (") + LogFlushReasonName(report_.reason) + "): ";
    if (syncing_) {
      return out + (syncs_left_ > 0 ? std::to_string(syncs_left_) + " of " + std::to_string(fds_.size()) +
                                          " file fsyncs in flight"
                                    : "the target's sync (" + log_.target_.SyncProgress() + ")");
    }
    return out + "step " + std::to_string(std::min(writes_done_ + 1, nsteps())) + " of " +
           std::to_string(nsteps()) + (reading_ ? ", reading the log" : "") +
           (writes_in_flight_ > 0 ? ", " + std::to_string(writes_in_flight_) + " writes in flight" : "");
  }

 private:
  std::size_t nsteps() const { return plan_.steps.size(); }

  void Advance() {
    if (aborted_from_ != SIZE_MAX && !reading_ && !writing_) {
      // A log read failed: keep everything from that step on.
      for (std::size_t s = aborted_from_; s < nsteps(); ++s) {
        for (const PlannedOp& op : plan_.steps[s].ops) {
          for (std::size_t i : op.records) kept_[i] = true;
        }
      }
      SyncTargets();
      return;
    }
    if (aborted_from_ != SIZE_MAX) return;
    // With two buffers step r's buffer is free once step r-2's writes are done; with one,
    // once step r-1's are.
    if (!reading_ && next_read_ < nsteps() &&
        (plan_.overlap ? next_read_ <= writes_done_ + 1 : next_read_ == writes_done_ && !writing_)) {
      StartRead(next_read_++);
    }
    if (!writing_ && writes_done_ < reads_done_ && writes_done_ < nsteps()) {
      writing_ = true;
      next_op_ = 0;
      DoOps();  // continues in its callbacks, or (every op done at once) in Advance again
      return;
    }
    if (writes_done_ == nsteps() && !reading_ && !writing_) SyncTargets();
  }

  void StartRead(std::size_t s) {
    const FlushStep& step = plan_.steps[s];
    auto buf = buffers_[s % 2];
    buf->assign(step.read_length, '\0');
    reading_ = true;
    std::weak_ptr<bool> alive = alive_;
    log_.io_.Read(log_.fd_.get(), step.read_offset, std::span<char>(buf->data(), buf->size()),
                  [this, alive, buf, s](Result<std::size_t> r) {
                    if (alive.expired()) return;
                    reading_ = false;
                    if (!r.ok() || *r != buf->size()) {
                      report_.errors.push_back(
                          (r.ok() ? Status::Corruption("short read of the flash log")
                                  : r.status()).ToString());
                      aborted_from_ = std::min(aborted_from_, s);
                    } else {
                      report_.bytes_read += *r;
                      reads_done_ = s + 1;
                    }
                    Advance();
                  });
  }

  // Does the current step's ops in order. Algorithm 4's writes between two metadata records
  // are disjoint (merged by address), so they go to the FileIo together (io_uring keeps them
  // in flight at once, as a disk queue would); every other algorithm writes one at a time
  // (their records may overlap: the later must land last). Either way the flush fsyncs each
  // target once at the end (SyncTargets): the same durability for every algorithm.
  void DoOps() {
    const std::size_t s = writes_done_;
    const FlushStep& step = plan_.steps[s];
    const bool together = log_.options_.algorithm == FlushAlgorithm::kSortMerge;
    // While issuing together, a write the FileIo answers at once does not re-enter: this loop
    // goes on and the end of the step is decided below.
    issuing_ = together;
    while (next_op_ < step.ops.size()) {
      const PlannedOp& op = step.ops[next_op_];
      if (op.type == PlannedOp::Type::kMeta && writes_in_flight_ > 0) break;  // a barrier
      ++next_op_;
      if (failed_paths_.count(op.path) != 0) {
        for (std::size_t i : op.records) kept_[i] = true;
        continue;
      }
      const std::string& buf = *buffers_[s % 2];
      if (op.type == PlannedOp::Type::kMeta) {
        std::size_t i = op.records.front();
        const PlanRecord& pr = plan_records_[i];
        const LogRecordInfo& info = log_.records_[i];
        std::string arg2 = buf.substr(pr.log_offset + pr.data_offset - step.read_offset,
                                      info.length);
        Status st = log_.target_.ApplyMeta(info.op, info.path, info.offset, arg2);
        if (!st.ok()) Fail(op, st.WithContext(std::string("apply ") + MetaOpName(info.op) +
                                               " of " + info.path));
        continue;
      }
      Result<int> fd = FdFor(op.kind, op.path);
      if (!fd.ok()) {
        Fail(op, fd.status());
        continue;
      }
      std::string data;
      data.reserve(op.length);
      for (const PlannedPiece& piece : op.pieces) {
        const PlanRecord& pr = plan_records_[piece.record];
        data.append(buf, pr.log_offset + pr.data_offset + piece.data_offset - step.read_offset,
                    piece.length);
      }
      std::weak_ptr<bool> alive = alive_;
      const PlannedOp* opp = &op;
      ++writes_in_flight_;
      log_.io_.Write(*fd, op.offset, std::move(data),
                     [this, alive, opp](Result<std::size_t> r) {
                       if (alive.expired()) return;
                       --writes_in_flight_;
                       if (!r.ok()) {
                         Fail(*opp, r.status().WithContext(std::string("flush ") +
                                                           LogRecordKindName(opp->kind) + " " +
                                                           opp->path));
                       } else {
                         report_.bytes_written += *r;
                         ++report_.writes;
                       }
                       if (!issuing_) DoOps();
                     });
      if (!together) return;  // one write at a time; the callback continues
    }
    issuing_ = false;
    if (writes_in_flight_ > 0) return;  // the last write's callback continues
    if (next_op_ < step.ops.size()) return DoOps();  // the barrier's writes were answered at once
    writing_ = false;
    writes_done_ = s + 1;
    Advance();
  }

  Result<int> FdFor(LogRecordKind kind, const std::string& path) {
    auto it = fds_.find({kind, path});
    if (it != fds_.end()) return it->second;
    Result<int> fd = log_.target_.OpenForFlush(kind, path);
    if (fd.ok()) fds_[{kind, path}] = *fd;
    return fd;
  }

  void Fail(const PlannedOp& op, const Status& st) {
    report_.errors.push_back(st.ToString());
    failed_paths_.insert(op.path);
  }

  // Runs once per flush: the fsync callbacks count syncs_left_ down and the last one
  // destroys this flusher, so a second round would call back into freed memory.
  void SyncTargets() {
    if (syncing_) return;
    syncing_ = true;
    if (fds_.empty()) {
      SyncTarget();
      return;
    }
    syncs_left_ = fds_.size();
    std::weak_ptr<bool> alive = alive_;
    for (const auto& [key, fd] : fds_) {
      std::string path = key.second;
      log_.io_.Fsync(fd, [this, alive, path](Status st) {
        if (alive.expired()) return;
        if (!st.ok()) {
          report_.errors.push_back(st.WithContext("fsync " + path).ToString());
          failed_paths_.insert(path);
        }
        if (--syncs_left_ == 0) SyncTarget();
      });
    }
  }

  // After the fsyncs: the target's own sync (SyncFlush); its failure keeps every record.
  void SyncTarget() {
    std::weak_ptr<bool> alive = alive_;
    log_.target_.SyncFlush(log_.io_, [this, alive](Status st) {
      if (alive.expired()) return;
      if (!st.ok()) {
        report_.errors.push_back(st.WithContext("sync the flush (every record kept)").ToString());
        sync_failed_ = true;
      }
      Done();
    });
  }

  void Done() {
    log_.target_.EndFlush();
    for (std::size_t i = 0; i < plan_records_.size(); ++i) {
      if (sync_failed_ || failed_paths_.count(plan_records_[i].path) != 0) kept_[i] = true;
      if (kept_[i]) {
        ++report_.records_kept;
      } else {
        ++report_.records_applied;
      }
    }
    log_.FinishFlush(std::move(report_), kept_);  // destroys this
  }

  FlashLog& log_;
  std::weak_ptr<bool> alive_;
  FlushReport report_;
  std::vector<PlanRecord> plan_records_;
  FlushPlan plan_;
  std::vector<bool> kept_;
  std::array<std::shared_ptr<std::string>, 2> buffers_;
  std::size_t next_read_ = 0;
  std::size_t reads_done_ = 0;   // steps 0 .. reads_done_-1 are in their buffers
  std::size_t writes_done_ = 0;  // steps whose ops are done
  std::size_t next_op_ = 0;
  std::size_t writes_in_flight_ = 0;  // this step's writes the FileIo has not answered
  bool issuing_ = false;              // DoOps is issuing (a write answered at once waits for it)
  bool reading_ = false;
  bool writing_ = false;
  std::size_t aborted_from_ = SIZE_MAX;
  std::map<std::pair<LogRecordKind, std::string>, int> fds_;
  std::set<std::string> failed_paths_;
  std::size_t syncs_left_ = 0;
  bool syncing_ = false;
  bool sync_failed_ = false;  // SyncFlush failed: every record is kept
};

std::string FlashLog::Progress() const {
  std::string out;
  if (flusher_) {
    out = flusher_->Progress();
  } else if (writing_) {
    out = "writing an append batch";
  } else {
    out = "idle";
  }
  return out + "; " + std::to_string(records_.size()) + " records, " + std::to_string(pending_.size()) +
         " appends and " + std::to_string(flush_requests_.size()) + " flush requests waiting";
}

void FlashLog::StartFlush(LogFlushReason reason) {
  flushing_ = true;
  flusher_ = std::make_unique<Flusher>(*this, reason);
  flusher_->Start();
}

void FlashLog::FinishFlush(FlushReport report, const std::vector<bool>& kept) {
  bool any_kept = false;
  for (bool k : kept) any_kept = any_kept || k;
  if (!records_.empty()) {
    Status st = RewriteLog(kept);
    if (!st.ok()) {
      // The old log stays whole: its records are applied again by the next flush.
      report.status = st;
      report.errors.push_back(st.ToString());
    } else {
      ++stats_.flushes[static_cast<std::size_t>(report.reason)];
      stats_.bytes_merged_away += report.bytes_merged_away;
      stats_.records_kept += report.records_kept;
    }
  }
  (void)any_kept;
  full_flush_done_ = report.reason == LogFlushReason::kFull;
  std::unique_ptr<Flusher> done_flusher = std::move(flusher_);
  flushing_ = false;
  FlushDone done;
  if (!flush_requests_.empty()) {
    done = std::move(flush_requests_.front().second);
    flush_requests_.pop_front();
  }
  // Requests queued behind this one that this flush satisfied (it flushed everything).
  std::vector<FlushDone> also;
  while (!flush_requests_.empty() && report.status.ok()) {
    if (flush_requests_.front().second) also.push_back(std::move(flush_requests_.front().second));
    flush_requests_.pop_front();
  }
  std::weak_ptr<bool> alive = alive_;
  if (observer_) observer_(report);
  if (alive.expired()) return;
  if (done) done(report);
  for (auto& d : also) {
    if (alive.expired()) return;
    d(report);
  }
  if (alive.expired()) return;
  Pump();
  (void)done_flusher;  // destroyed here, after its report was delivered
}

Status FlashLog::RewriteLog(const std::vector<bool>& kept) {
  std::vector<LogRecordInfo> keep;
  for (std::size_t i = 0; i < records_.size(); ++i) {
    if (kept[i]) keep.push_back(records_[i]);
  }
  if (keep.empty()) {
    if (ftruncate(fd_.get(), 0) != 0 || fsync(fd_.get()) != 0) {
      return Status::FromErrno(errno, "cut the flushed flash log " + log_path());
    }
    records_.clear();
    tail_ = 0;
  } else {
    std::string tmp = log_path() + ".new";
    UniqueFd out(open(tmp.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600));
    if (!out.valid()) return Status::FromErrno(errno, "create " + tmp);
    Bytes at = 0;
    for (LogRecordInfo& r : keep) {
      std::string bytes(r.log_length, '\0');
      if (Status st = PreadExact(fd_.get(), bytes.data(), bytes.size(), r.log_offset, log_path());
          !st.ok()) {
        return st;
      }
      if (Status st = WriteExact(out.get(), bytes, at, tmp); !st.ok()) return st;
      r.log_offset = at;
      at += r.log_length;
    }
    if (fdatasync(out.get()) != 0) return Status::FromErrno(errno, "fdatasync " + tmp);
    if (rename(tmp.c_str(), log_path().c_str()) != 0) {
      return Status::FromErrno(errno, "rename " + tmp);
    }
    if (Status st = SyncDir(options_.dir); !st.ok()) return st;
    fd_ = std::move(out);
    records_ = std::move(keep);
    tail_ = at;
  }
  stats_.used = tail_;
  stats_.records = records_.size();
  return Status::Ok();
}

Result<std::vector<std::pair<Bytes, Bytes>>> FlashLog::ReadOverlay(LogRecordKind kind,
                                                                   const std::string& path,
                                                                   Bytes offset,
                                                                   std::span<char> buf) {
  std::vector<std::pair<Bytes, Bytes>> covered;
  const Bytes end = offset + buf.size();
  auto overlay = [&](Bytes rec_off, Bytes rec_len, auto&& copy) -> Status {
    Bytes s = std::max(offset, rec_off);
    Bytes e = std::min(end, rec_off + rec_len);
    if (s >= e) return Status::Ok();
    if (Status st = copy(s - rec_off, e - s, buf.data() + (s - offset)); !st.ok()) return st;
    covered.emplace_back(s, e);
    return Status::Ok();
  };
  // A truncate of `path` logged between data records cuts the earlier ones: from its size on
  // the file reads as zeros until a later record writes there (as ftruncate then pwrite).
  auto truncate_at = [&](Bytes size) {
    Bytes s = std::max(offset, size);
    if (s >= end) return;
    std::memset(buf.data() + (s - offset), 0, end - s);
    covered.emplace_back(s, end);
  };
  auto cuts = [&](LogRecordKind k, MetaOp op, const std::string& p) {
    return kind != LogRecordKind::kMeta && k == LogRecordKind::kMeta && op == MetaOp::kTruncate &&
           p == path;
  };
  for (const LogRecordInfo& r : records_) {
    if (cuts(r.kind, r.op, r.path)) {
      truncate_at(r.offset);
      continue;
    }
    if (r.kind != kind || r.path != path) continue;
    Status st = overlay(r.offset, r.length, [&](Bytes from, Bytes len, char* to) {
      return PreadExact(fd_.get(), to, len, r.log_offset + kHeaderSize + r.path.size() + from,
                        log_path());
    });
    if (!st.ok()) return st;
  }
  std::vector<const Pending*> unwritten;
  if (inflight_) {
    for (const auto& p : *inflight_) unwritten.push_back(p.get());
  }
  for (const auto& p : pending_) unwritten.push_back(p.get());
  for (const Pending* p : unwritten) {
    if (cuts(p->kind, p->op, p->path)) {
      truncate_at(p->offset);
      continue;
    }
    if (p->kind != kind || p->path != path) continue;
    (void)overlay(p->offset, p->data.size(), [&](Bytes from, Bytes len, char* to) {
      std::memcpy(to, p->data.data() + from, len);
      return Status::Ok();
    });
  }
  return covered;
}

Bytes FlashLog::LoggedEnd(LogRecordKind kind, const std::string& path) const {
  Bytes end = 0;
  auto add = [&](LogRecordKind k, MetaOp op, const std::string& p, Bytes off, Bytes len) {
    if (p != path) return;
    if (kind != LogRecordKind::kMeta && k == LogRecordKind::kMeta && op == MetaOp::kTruncate) {
      end = std::min(end, off);  // a logged truncate cuts what the log held before it
    } else if (k == kind) {
      end = std::max(end, off + len);
    }
  };
  for (const LogRecordInfo& r : records_) add(r.kind, r.op, r.path, r.offset, r.length);
  if (inflight_) {
    for (const auto& p : *inflight_) add(p->kind, p->op, p->path, p->offset, p->data.size());
  }
  for (const auto& p : pending_) add(p->kind, p->op, p->path, p->offset, p->data.size());
  return end;
}

std::optional<Bytes> FlashLog::LoggedSize(LogRecordKind kind, const std::string& path) const {
  std::optional<Bytes> size;
  auto add = [&](LogRecordKind k, MetaOp op, const std::string& p, Bytes off, Bytes len) {
    if (p != path) return;
    if (kind != LogRecordKind::kMeta && k == LogRecordKind::kMeta && op == MetaOp::kTruncate) {
      size = off;  // the truncate fixes the size; later records may extend it
    } else if (k == kind && size) {
      size = std::max(*size, off + len);
    }
  };
  for (const LogRecordInfo& r : records_) add(r.kind, r.op, r.path, r.offset, r.length);
  if (inflight_) {
    for (const auto& p : *inflight_) add(p->kind, p->op, p->path, p->offset, p->data.size());
  }
  for (const auto& p : pending_) add(p->kind, p->op, p->path, p->offset, p->data.size());
  return size;
}

bool FlashLog::Holds(LogRecordKind kind, const std::string& path) const {
  return HoldsOf(kind, path, false);
}

bool FlashLog::Changes(LogRecordKind kind, const std::string& path) const {
  return HoldsOf(kind, path, kind != LogRecordKind::kMeta);
}

bool FlashLog::HoldsOf(LogRecordKind kind, const std::string& path, bool truncates) const {
  auto matches = [&](LogRecordKind k, MetaOp op, const std::string& p) {
    return p == path && (k == kind || (truncates && k == LogRecordKind::kMeta && op == MetaOp::kTruncate));
  };
  for (const LogRecordInfo& r : records_) {
    if (matches(r.kind, r.op, r.path)) return true;
  }
  if (inflight_) {
    for (const auto& p : *inflight_) {
      if (matches(p->kind, p->op, p->path)) return true;
    }
  }
  for (const auto& p : pending_) {
    if (matches(p->kind, p->op, p->path)) return true;
  }
  return false;
}

}  // namespace ghost
