#include "common/cache/flash_log.h"

#include <event2/event.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <sstream>

#include "common/base/file_io.h"
#include "common/base/uring_file_io.h"

namespace ghost {
namespace {

namespace fs = std::filesystem;

std::string ReadFile(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void WriteFile(const fs::path& p, const std::string& s) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out << s;
}

// The disk: files under a scratch directory; counts what it is asked to do.
class DirTarget final : public FlushTarget {
 public:
  explicit DirTarget(fs::path root) : root_(std::move(root)) { fs::create_directories(root_); }
  ~DirTarget() override { EndFlush(); }

  Result<int> OpenForFlush(LogRecordKind, const std::string& path) override {
    ++opens;
    int fd = open((root_ / path).c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) return Status::FromErrno(errno, "open " + path);
    fds_.push_back(fd);
    return fd;
  }
  Status ApplyMeta(MetaOp op, const std::string& path, Bytes arg,
                   const std::string& arg2) override {
    ++metas;
    std::error_code ec;
    switch (op) {
      case MetaOp::kUnlink: fs::remove(root_ / path, ec); break;
      case MetaOp::kTruncate: {
        if (truncate((root_ / path).c_str(), static_cast<off_t>(arg)) != 0) {
          return Status::FromErrno(errno, "truncate " + path);
        }
        break;
      }
      case MetaOp::kRename:
        if (fs::exists(root_ / path)) fs::rename(root_ / path, root_ / arg2, ec);
        break;
      default: break;
    }
    if (ec) return Status::IoError(ec.message());
    return Status::Ok();
  }
  void EndFlush() override {
    for (int fd : fds_) close(fd);
    fds_.clear();
  }
  std::string Contents(const std::string& path) const { return ReadFile(root_ / path); }

  int opens = 0;
  int metas = 0;

 private:
  fs::path root_;
  std::vector<int> fds_;
};

class FlashLogTest : public ::testing::Test {
 protected:
  void SetUp() override {
    base_ = event_base_new();
    sync_io_ = std::make_unique<SyncFileIo>(base_);
    faulty_ = std::make_unique<FaultyFileIo>(*sync_io_);
    char tmpl[] = "/tmp/flash_log_test.XXXXXX";
    dir_ = mkdtemp(tmpl);
    fs::create_directories(dir_ / "flash");
    target_ = std::make_unique<DirTarget>(dir_ / "disk");
  }
  void TearDown() override {
    log_.reset();
    target_.reset();
    faulty_.reset();
    sync_io_.reset();
    event_base_free(base_);
    fs::remove_all(dir_);
  }

  FlashLogOptions Options() {
    FlashLogOptions o;
    o.dir = (dir_ / "flash").string();
    o.capacity = 1 << 20;
    o.buffer = 4096;
    return o;
  }

  void OpenLog(FlashLogOptions o, RecoveryReport* report = nullptr) {
    log_.reset();
    auto r = FlashLog::Open(o, *faulty_, *target_, report);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    log_ = std::move(r).value();
  }

  void RunUntil(const bool& done) {
    for (int i = 0; i < 100000 && !done; ++i) event_base_loop(base_, EVLOOP_ONCE);
    ASSERT_TRUE(done) << "the callback never ran";
  }

  Result<std::uint64_t> Write(const std::string& path, Bytes off, const std::string& data) {
    bool done = false;
    Result<std::uint64_t> out = Status::Internal("unset");
    log_->AppendWrite(LogRecordKind::kLocalWrite, path, off, data,
                      [&](Result<std::uint64_t> r) { out = std::move(r); done = true; });
    RunUntil(done);
    return out;
  }

  FlushReport Flush(LogFlushReason reason = LogFlushReason::kExplicit) {
    bool done = false;
    FlushReport out;
    log_->Flush(reason, [&](const FlushReport& r) { out = r; done = true; });
    RunUntil(done);
    return out;
  }

  fs::path LogFile() { return dir_ / "flash" / "flash.log"; }

  event_base* base_ = nullptr;
  std::unique_ptr<SyncFileIo> sync_io_;
  std::unique_ptr<FaultyFileIo> faulty_;
  fs::path dir_;
  std::unique_ptr<DirTarget> target_;
  std::unique_ptr<FlashLog> log_;
};

// Applies writes in order to an in-memory file: what the disk must hold after a flush.
void ApplyReference(std::string* file, Bytes off, const std::string& data) {
  if (file->size() < off + data.size()) file->resize(off + data.size(), '\0');
  file->replace(off, data.size(), data);
}

TEST(Crc32cTest, MatchesTheCastagnoliCheckValue) {
  EXPECT_EQ(Crc32c("123456789"), 0xE3069283u);
  EXPECT_EQ(Crc32c("56789", Crc32c("1234")), 0xE3069283u);
}

TEST_F(FlashLogTest, AcknowledgedAppendsAreRecoveredAfterReopen) {
  OpenLog(Options());
  ASSERT_TRUE(Write("a", 0, "hello").ok());
  auto seq = Write("a", 5, " world");
  ASSERT_TRUE(seq.ok());
  EXPECT_EQ(*seq, 2u);
  RecoveryReport rep;
  OpenLog(Options(), &rep);
  EXPECT_EQ(rep.records, 2u);
  EXPECT_EQ(rep.torn_tail_cut, 0u);
  ASSERT_EQ(log_->records().size(), 2u);
  EXPECT_EQ(log_->records()[1].seq, 2u);
  EXPECT_EQ(*Write("b", 0, "x"), 3u);  // sequence numbers continue
}

TEST_F(FlashLogTest, LargeWritesAreSplitIntoBufferSizedRecords) {
  OpenLog(Options());
  std::string big(10000, 'z');
  ASSERT_TRUE(Write("big", 0, big).ok());
  EXPECT_EQ(log_->records().size(), 3u);
  for (const auto& r : log_->records()) EXPECT_LE(r.log_length, Options().buffer);
  Flush();
  EXPECT_EQ(target_->Contents("big"), big);
}

TEST_F(FlashLogTest, CrashAtEveryPointOfAppendKeepsEveryAcknowledgedRecordAndCutsTheTornTail) {
  OpenLog(Options());
  std::vector<std::string> datas = {"first", "second record", "third!!"};
  for (std::size_t i = 0; i < datas.size(); ++i) ASSERT_TRUE(Write("f", i * 100, datas[i]).ok());
  std::vector<LogRecordInfo> recs = log_->records();
  ASSERT_EQ(recs.size(), datas.size());  // else the cuts below would test an empty log
  log_.reset();
  const std::string full = ReadFile(LogFile());
  ASSERT_EQ(full.size(), recs.back().log_offset + recs.back().log_length);
  for (std::size_t len = 0; len <= full.size(); ++len) {
    WriteFile(LogFile(), full.substr(0, len));
    std::size_t whole = 0;
    for (const auto& r : recs) whole += (r.log_offset + r.log_length <= len);
    RecoveryReport rep;
    OpenLog(Options(), &rep);
    ASSERT_EQ(rep.records, whole) << "log cut at " << len;
    Bytes kept_end = whole == 0 ? 0 : recs[whole - 1].log_offset + recs[whole - 1].log_length;
    EXPECT_EQ(rep.torn_tail_cut, len - kept_end) << "log cut at " << len;
    EXPECT_TRUE(rep.corrupt.empty());
    EXPECT_EQ(fs::file_size(LogFile()), kept_end);
  }
}

TEST_F(FlashLogTest, BadCrcInTheMiddleIsReportedSavedAndTheLaterRecordsKept) {
  OpenLog(Options());
  ASSERT_TRUE(Write("f", 0, "aaaa").ok());
  ASSERT_TRUE(Write("f", 4, "bbbb").ok());
  ASSERT_TRUE(Write("f", 8, "cccc").ok());
  LogRecordInfo second = log_->records()[1];
  log_.reset();
  std::string bytes = ReadFile(LogFile());
  bytes[second.log_offset + second.log_length - 1] ^= 0x5a;  // a data byte of record 2
  WriteFile(LogFile(), bytes);
  RecoveryReport rep;
  OpenLog(Options(), &rep);
  EXPECT_EQ(rep.records, 2u);
  ASSERT_EQ(rep.corrupt.size(), 1u);
  EXPECT_EQ(rep.corrupt[0].offset, second.log_offset);
  EXPECT_EQ(rep.corrupt[0].length, second.log_length);
  ASSERT_FALSE(rep.corrupt[0].saved_as.empty());
  EXPECT_EQ(fs::file_size(rep.corrupt[0].saved_as), second.log_length);
  EXPECT_EQ(log_->records()[0].seq, 1u);
  EXPECT_EQ(log_->records()[1].seq, 3u);
  EXPECT_EQ(log_->stats().corrupt_regions, 1u);
  Flush(LogFlushReason::kRecovery);
  EXPECT_EQ(target_->Contents("f"), std::string("aaaa\0\0\0\0cccc", 12));
}

// A second corruption at the same offset (after the first was flushed away) gets its own file:
// the copy the first recovery saved is not overwritten.
TEST_F(FlashLogTest, ASecondCorruptRegionAtTheSameOffsetDoesNotOverwriteTheFirstCopy) {
  std::vector<std::string> saved;
  for (int round = 0; round < 2; ++round) {
    OpenLog(Options());
    ASSERT_TRUE(Write("f", 0, "aaaa").ok());
    ASSERT_TRUE(Write("f", 4, round == 0 ? "bbbb" : "BBBB").ok());
    ASSERT_TRUE(Write("f", 8, "cccc").ok());
    LogRecordInfo second = log_->records()[1];
    log_.reset();
    std::string bytes = ReadFile(LogFile());
    bytes[second.log_offset + second.log_length - 1] ^= 0x5a;
    WriteFile(LogFile(), bytes);
    RecoveryReport rep;
    OpenLog(Options(), &rep);
    ASSERT_EQ(rep.corrupt.size(), 1u);
    ASSERT_FALSE(rep.corrupt[0].saved_as.empty());
    saved.push_back(rep.corrupt[0].saved_as);
    EXPECT_EQ(ReadFile(saved.back()), bytes.substr(second.log_offset, second.log_length));
    FlushReport r = Flush(LogFlushReason::kRecovery);
    ASSERT_TRUE(r.errors.empty());
    ASSERT_TRUE(log_->records().empty());
  }
  ASSERT_NE(saved[0], saved[1]);
  EXPECT_NE(ReadFile(saved[0]).find("bbb"), std::string::npos);
  EXPECT_NE(ReadFile(saved[1]).find("BBB"), std::string::npos);
}

class FlashLogAlgorithmTest : public FlashLogTest,
                              public ::testing::WithParamInterface<FlushAlgorithm> {};

TEST_P(FlashLogAlgorithmTest, FlushLeavesTheDiskAsTheWritesInOrderWould) {
  FlashLogOptions o = Options();
  o.algorithm = GetParam();
  o.buffer = 1024;
  OpenLog(o);
  std::mt19937 rng(42);
  std::map<std::string, std::string> ref;
  for (int i = 0; i < 300; ++i) {
    std::string path = "file" + std::to_string(rng() % 3);
    Bytes off = rng() % 4000;
    std::string data(1 + rng() % 300, static_cast<char>('a' + rng() % 26));
    ApplyReference(&ref[path], off, data);
    ASSERT_TRUE(Write(path, off, data).ok());
  }
  FlushReport rep = Flush();
  EXPECT_TRUE(rep.errors.empty()) << rep.errors.front();
  EXPECT_EQ(rep.records_kept, 0u);
  EXPECT_EQ(rep.records_applied, 300u);
  for (const auto& [path, data] : ref) EXPECT_EQ(target_->Contents(path), data) << path;
  EXPECT_EQ(log_->records().size(), 0u);
  EXPECT_EQ(fs::file_size(LogFile()), 0u);
  if (GetParam() == FlushAlgorithm::kSortMerge) {
    EXPECT_GT(rep.bytes_merged_away, 0u);
    EXPECT_LT(rep.writes, 300u);
  } else {
    EXPECT_EQ(rep.bytes_merged_away, 0u);
    EXPECT_EQ(rep.writes, 300u);
  }
}

INSTANTIATE_TEST_SUITE_P(All, FlashLogAlgorithmTest,
                         ::testing::Values(FlushAlgorithm::kOneRecord, FlushAlgorithm::kChunked,
                                           FlushAlgorithm::kDoubleBuffer,
                                           FlushAlgorithm::kSortMerge));

TEST(FlushPlanTest, SortMergeMatchesAReferenceOfRandomOverwritesLaterWins) {
  std::mt19937 rng(7);
  for (int round = 0; round < 50; ++round) {
    std::vector<PlanRecord> recs;
    std::vector<std::string> datas;
    std::string ref;
    Bytes log_at = 0;
    for (int i = 0; i < 40; ++i) {
      PlanRecord r;
      r.seq = i + 1;
      r.kind = LogRecordKind::kBlock;
      r.path = "disk";
      r.offset = rng() % 200;
      r.length = 1 + rng() % 40;
      r.log_offset = log_at;
      r.log_length = 32 + r.length;
      log_at += r.log_length;
      std::string d;
      for (Bytes k = 0; k < r.length; ++k) d.push_back(static_cast<char>('A' + rng() % 60));
      ApplyReference(&ref, r.offset, d);
      recs.push_back(r);
      datas.push_back(d);
    }
    FlushPlan plan = PlanFlush(recs, FlushAlgorithm::kSortMerge, 1 << 20);
    ASSERT_EQ(plan.steps.size(), 1u);
    std::string out(ref.size(), '\0');
    Bytes last_end = 0;
    bool first = true;
    std::vector<int> owned(recs.size(), 0);
    for (const PlannedOp& op : plan.steps[0].ops) {
      // Sorted by address, disjoint, and not adjacent (adjacent ones are merged).
      if (!first) {
        EXPECT_GT(op.offset, last_end);
      }
      first = false;
      last_end = op.offset + op.length;
      Bytes at = op.offset;
      for (const PlannedPiece& p : op.pieces) {
        out.replace(at, p.length, datas[p.record].substr(p.data_offset, p.length));
        at += p.length;
      }
      EXPECT_EQ(at, op.offset + op.length);
      for (std::size_t i : op.records) ++owned[i];
    }
    // Every byte some record wrote is the latest record's byte.
    for (const auto& r : recs) {
      EXPECT_EQ(out.substr(r.offset, r.length), ref.substr(r.offset, r.length));
    }
    for (int n : owned) EXPECT_EQ(n, 1);  // each record belongs to exactly one write
    EXPECT_EQ(plan.written_bytes + plan.merged_away(), plan.record_bytes);
  }
}

TEST(FlushPlanTest, MetadataRecordsAreBarriersToSorting) {
  std::vector<PlanRecord> recs(3);
  recs[0] = {1, LogRecordKind::kLocalWrite, "f", 100, 10, 0, 50, 40};
  recs[1] = {2, LogRecordKind::kMeta, "f", 0, 0, 50, 40, 40};
  recs[2] = {3, LogRecordKind::kLocalWrite, "f", 0, 10, 90, 50, 40};
  FlushPlan plan = PlanFlush(recs, FlushAlgorithm::kSortMerge, 1 << 20);
  ASSERT_EQ(plan.steps.size(), 1u);
  ASSERT_EQ(plan.steps[0].ops.size(), 3u);
  EXPECT_EQ(plan.steps[0].ops[0].offset, 100u);
  EXPECT_EQ(plan.steps[0].ops[1].type, PlannedOp::Type::kMeta);
  EXPECT_EQ(plan.steps[0].ops[2].offset, 0u);
}

TEST(FlushPlanTest, ChunkedStepsReadAtMostOneBufferExceptForOneRecord) {
  std::vector<PlanRecord> recs;
  Bytes at = 0;
  for (int i = 0; i < 10; ++i) {
    recs.push_back({static_cast<std::uint64_t>(i + 1), LogRecordKind::kBlock, "d",
                    static_cast<Bytes>(i) * 100, 68, at, 100, 32});
    at += 100;
  }
  FlushPlan one = PlanFlush(recs, FlushAlgorithm::kOneRecord, 350);
  EXPECT_EQ(one.steps.size(), 10u);
  EXPECT_FALSE(one.overlap);
  FlushPlan chunked = PlanFlush(recs, FlushAlgorithm::kChunked, 350);
  EXPECT_EQ(chunked.steps.size(), 4u);  // 3 + 3 + 3 + 1 records
  for (const auto& s : chunked.steps) EXPECT_LE(s.read_length, 350u);
  EXPECT_TRUE(PlanFlush(recs, FlushAlgorithm::kDoubleBuffer, 350).overlap);
}

TEST_F(FlashLogTest, EioMidFlushKeepsTheRecordsReportsThemAndALaterFlushAppliesThem) {
  OpenLog(Options());
  ASSERT_TRUE(Write("good", 0, "fine").ok());
  ASSERT_TRUE(Write("bad", 0, "one").ok());
  ASSERT_TRUE(Write("bad", 3, "two").ok());
  ASSERT_TRUE(Write("good", 4, "also").ok());
  // The disk fails the first write of the flush.
  std::uint64_t target_writes = 0;
  faulty_->FailWhen(
      [&](const FileCall& c) {
        if (c.op != FileOp::kWrite) return false;
        // The log is not written during a flush; so every write is a target write. With
        // algorithm 4, "bad" (sorted first) is the first write.
        return ++target_writes == 1;
      },
      EIO);
  FlushReport rep = Flush();
  faulty_->Heal();
  ASSERT_FALSE(rep.errors.empty());
  EXPECT_NE(rep.errors[0].find("bad"), std::string::npos) << rep.errors[0];
  EXPECT_EQ(rep.records_kept, 2u);
  EXPECT_EQ(rep.records_applied, 2u);
  EXPECT_EQ(target_->Contents("good"), "finealso");
  ASSERT_EQ(log_->records().size(), 2u);
  EXPECT_EQ(log_->records()[0].path, "bad");
  EXPECT_EQ(log_->stats().records_kept, 2u);
  // Kept across a restart too.
  RecoveryReport recovery;
  OpenLog(Options(), &recovery);
  EXPECT_EQ(recovery.records, 2u);
  FlushReport again = Flush(LogFlushReason::kRecovery);
  EXPECT_TRUE(again.errors.empty());
  EXPECT_EQ(target_->Contents("bad"), "onetwo");
  EXPECT_EQ(log_->records().size(), 0u);
}

TEST_F(FlashLogTest, CrashAtEveryPointOfFlushLosesNothingAfterRecovery) {
  FlashLogOptions o = Options();
  o.buffer = 512;
  std::mt19937 rng(3);
  std::map<std::string, std::string> ref;
  OpenLog(o);
  for (int i = 0; i < 40; ++i) {
    std::string path = "f" + std::to_string(rng() % 2);
    Bytes off = rng() % 1000;
    std::string data(1 + rng() % 200, static_cast<char>('a' + i % 26));
    ApplyReference(&ref[path], off, data);
    ASSERT_TRUE(Write(path, off, data).ok());
  }
  log_.reset();
  const std::string saved_log = ReadFile(LogFile());
  // A crash after k of the flush's disk writes: the disk holds a prefix of them, the log is
  // whole (it is cut only after the disk's files are fsynced). Recovery replays it.
  for (int k = 0; k <= 45; ++k) {
    fs::remove_all(dir_ / "disk");
    target_ = std::make_unique<DirTarget>(dir_ / "disk");
    WriteFile(LogFile(), saved_log);
    OpenLog(o);
    std::uint64_t n = 0;
    faulty_->FailWhen([&](const FileCall& c) { return c.op == FileOp::kWrite && ++n > static_cast<std::uint64_t>(k); }, EIO);
    Flush();
    faulty_->Heal();
    log_.reset();
    WriteFile(LogFile(), saved_log);  // the crash: the cut never happened
    RecoveryReport rep;
    OpenLog(o, &rep);
    ASSERT_EQ(rep.records, 40u);
    FlushReport r = Flush(LogFlushReason::kRecovery);
    ASSERT_TRUE(r.errors.empty());
    for (const auto& [path, data] : ref) ASSERT_EQ(target_->Contents(path), data) << "k=" << k;
  }
}

TEST_F(FlashLogTest, FullFlashDeviceFailsTheAppendAndLeavesTheLogIntact) {
  OpenLog(Options());
  ASSERT_TRUE(Write("f", 0, "kept").ok());
  faulty_->FailNthCall(1, ENOSPC);
  auto r = Write("f", 4, "lost");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().ToString().find("flash log append"), std::string::npos)
      << r.status().ToString();
  EXPECT_EQ(log_->stats().append_failures, 1u);
  ASSERT_TRUE(Write("f", 4, "more").ok());
  RecoveryReport rep;
  OpenLog(Options(), &rep);
  EXPECT_EQ(rep.records, 2u);
  Flush();
  EXPECT_EQ(target_->Contents("f"), "keptmore");
}

TEST_F(FlashLogTest, WhenFullTheLogFlushesBeforeTheAppendThatDoesNotFit) {
  FlashLogOptions o = Options();
  o.capacity = 8192;
  o.buffer = 1024;
  OpenLog(o);
  std::string ref;
  for (int i = 0; i < 20; ++i) {
    std::string data(900, static_cast<char>('a' + i));
    ApplyReference(&ref, i * 500, data);
    ASSERT_TRUE(Write("f", i * 500, data).ok());
  }
  EXPECT_GE(log_->stats().flushes[static_cast<int>(LogFlushReason::kFull)], 2u);
  EXPECT_LE(log_->stats().used, o.capacity);
  Flush();
  EXPECT_EQ(target_->Contents("f"), ref);
}

TEST_F(FlashLogTest, EachSpinUpPolicyFlushesOnSpinUpAndWhenFullDoesNot) {
  FlashLogOptions o = Options();
  o.policy = LogFlushPolicy::kWhenFull;
  OpenLog(o);
  ASSERT_TRUE(Write("f", 0, "x").ok());
  log_->OnDiskSpinUp();
  for (int i = 0; i < 10; ++i) event_base_loop(base_, EVLOOP_NONBLOCK);
  EXPECT_EQ(log_->records().size(), 1u);
  o.policy = LogFlushPolicy::kEachSpinUp;
  OpenLog(o);
  log_->OnDiskSpinUp();
  for (int i = 0; i < 100 && log_->flushing(); ++i) event_base_loop(base_, EVLOOP_ONCE);
  EXPECT_EQ(log_->records().size(), 0u);
  EXPECT_EQ(log_->stats().flushes[static_cast<int>(LogFlushReason::kSpinUp)], 1u);
  EXPECT_EQ(target_->Contents("f"), "x");
}

TEST_F(FlashLogTest, MetadataRecordsAreAppliedInOrderWithTheWrites) {
  OpenLog(Options());
  ASSERT_TRUE(Write("old", 0, "data").ok());
  bool done = false;
  log_->AppendMeta(MetaOp::kRename, "old", 0, "new",
                   [&](Result<std::uint64_t> r) { EXPECT_TRUE(r.ok()); done = true; });
  RunUntil(done);
  ASSERT_TRUE(Write("new", 4, "more").ok());
  FlushReport rep = Flush();
  EXPECT_TRUE(rep.errors.empty());
  EXPECT_EQ(target_->metas, 1);
  EXPECT_FALSE(fs::exists(dir_ / "disk" / "old"));
  EXPECT_EQ(target_->Contents("new"), "datamore");
}

TEST_F(FlashLogTest, ReadsSeeTheLoggedBytes) {
  OpenLog(Options());
  ASSERT_TRUE(Write("f", 2, "abc").ok());
  ASSERT_TRUE(Write("f", 3, "Z").ok());
  std::string buf = "--------";
  auto covered = log_->ReadOverlay(LogRecordKind::kLocalWrite, "f", 0,
                                   std::span<char>(buf.data(), buf.size()));
  ASSERT_TRUE(covered.ok());
  EXPECT_EQ(buf, "--aZc---");
  ASSERT_EQ(covered->size(), 2u);
  EXPECT_EQ(log_->LoggedEnd(LogRecordKind::kLocalWrite, "f"), 5u);
  EXPECT_EQ(log_->LoggedEnd(LogRecordKind::kLocalWrite, "g"), 0u);
}

TEST_F(FlashLogTest, ALoggedTruncateCutsTheEarlierBytesInReadsAndInTheEnd) {
  OpenLog(Options());
  ASSERT_TRUE(Write("f", 0, "abcdefgh").ok());
  bool done = false;
  log_->AppendMeta(MetaOp::kTruncate, "f", 3, "", [&](Result<std::uint64_t> r) {
    EXPECT_TRUE(r.ok());
    done = true;
  });
  RunUntil(done);
  EXPECT_EQ(log_->LoggedEnd(LogRecordKind::kLocalWrite, "f"), 3u);
  ASSERT_TRUE(Write("f", 5, "Z").ok());
  EXPECT_EQ(log_->LoggedEnd(LogRecordKind::kLocalWrite, "f"), 6u);
  EXPECT_TRUE(log_->Holds(LogRecordKind::kLocalWrite, "f"));
  EXPECT_FALSE(log_->Holds(LogRecordKind::kLocalWrite, "g"));
  std::string buf = "--------";
  ASSERT_TRUE(log_->ReadOverlay(LogRecordKind::kLocalWrite, "f", 0,
                                std::span<char>(buf.data(), buf.size()))
                  .ok());
  EXPECT_EQ(buf, std::string("abc\0\0Z\0\0", 8));
  Flush();
  EXPECT_EQ(target_->Contents("f"), std::string("abc\0\0Z", 6));
}

// A truncate alone (its file's bytes flushed before it was written) holds no bytes of the file,
// but its replay changes the file: Changes says so, waiting or durable, until a flush applies it.
TEST_F(FlashLogTest, ATruncateAloneChangesItsFileButHoldsNoBytesOfIt) {
  OpenLog(Options());
  ASSERT_TRUE(Write("f", 0, "abcdefgh").ok());
  Flush();
  EXPECT_FALSE(log_->Changes(LogRecordKind::kLocalWrite, "f"));
  bool done = false;
  log_->AppendMeta(MetaOp::kTruncate, "f", 3, "", [&](Result<std::uint64_t> r) {
    EXPECT_TRUE(r.ok());
    done = true;
  });
  EXPECT_TRUE(log_->Changes(LogRecordKind::kLocalWrite, "f"));  // waiting to be written
  RunUntil(done);
  EXPECT_FALSE(log_->Holds(LogRecordKind::kLocalWrite, "f"));
  EXPECT_TRUE(log_->Changes(LogRecordKind::kLocalWrite, "f"));
  EXPECT_FALSE(log_->Changes(LogRecordKind::kLocalWrite, "g"));
  EXPECT_EQ(log_->LoggedSize(LogRecordKind::kLocalWrite, "f"), std::optional<Bytes>(3));
  Flush();
  EXPECT_EQ(target_->Contents("f"), "abc");
  EXPECT_FALSE(log_->Changes(LogRecordKind::kLocalWrite, "f"));
}

TEST_F(FlashLogTest, TheFlushObserverSeesEveryFlushFullOnesToo) {
  FlashLogOptions o = Options();
  o.capacity = 8192;
  o.buffer = 1024;
  OpenLog(o);
  std::vector<LogFlushReason> seen;
  log_->SetFlushObserver([&](const FlushReport& r) { seen.push_back(r.reason); });
  for (int i = 0; i < 12; ++i) ASSERT_TRUE(Write("f", i * 900, std::string(900, 'a')).ok());
  Flush();
  ASSERT_GE(seen.size(), 2u);
  EXPECT_EQ(seen.front(), LogFlushReason::kFull);
  EXPECT_EQ(seen.back(), LogFlushReason::kExplicit);
}

TEST_F(FlashLogTest, ReadOnlyLogDirectoryIsAClearError) {
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // A private mount namespace with a read-only tmpfs on the log directory.
    if (unshare(CLONE_NEWNS) != 0 || mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0 ||
        mount("tmpfs", (dir_ / "flash").c_str(), "tmpfs", MS_RDONLY, nullptr) != 0) {
      _exit(77);
    }
    auto r = FlashLog::Open(Options(), *faulty_, *target_, nullptr);
    if (r.ok()) _exit(1);
    if (r.status().code() != Status::Code::kReadOnly) _exit(2);
    if (r.status().message().find("flash.log") == std::string::npos) _exit(3);
    _exit(0);
  }
  int status = 0;
  waitpid(child, &status, 0);
  ASSERT_TRUE(WIFEXITED(status));
  if (WEXITSTATUS(status) == 77) GTEST_SKIP() << "no mount namespace (needs root)";
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

TEST_F(FlashLogTest, AppendAndSortMergeFlushThroughIoUringLeaveTheDiskAsTheReference) {
  auto uring = UringFileIo::Create(base_);
  if (!uring.ok()) GTEST_SKIP() << "no io_uring: " << uring.status().ToString();
  std::unique_ptr<UringFileIo> io = std::move(uring).value();
  FlashLogOptions o = Options();
  o.buffer = 2048;
  auto opened = FlashLog::Open(o, *io, *target_, nullptr);
  ASSERT_TRUE(opened.ok()) << opened.status().ToString();
  std::unique_ptr<FlashLog> log = std::move(opened).value();
  std::mt19937 rng(11);
  std::string ref;
  for (int i = 0; i < 100; ++i) {
    Bytes off = rng() % 5000;
    std::string data(1 + rng() % 700, static_cast<char>('A' + rng() % 26));
    ApplyReference(&ref, off, data);
    bool done = false;
    log->AppendWrite(LogRecordKind::kLocalWrite, "u", off, data, [&](Result<std::uint64_t> r) {
      EXPECT_TRUE(r.ok());
      done = true;
    });
    RunUntil(done);
  }
  bool done = false;
  FlushReport rep;
  log->Flush(LogFlushReason::kExplicit, [&](const FlushReport& r) { rep = r; done = true; });
  RunUntil(done);
  EXPECT_TRUE(rep.errors.empty());
  EXPECT_GT(rep.bytes_merged_away, 0u);
  EXPECT_EQ(target_->Contents("u"), ref);
  log.reset();
}

TEST_F(FlashLogTest, ABufferLargerThanTheCapacityIsRefused) {
  FlashLogOptions o = Options();
  o.capacity = 1000;
  o.buffer = 4096;
  auto r = FlashLog::Open(o, *faulty_, *target_, nullptr);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Status::Code::kInvalidArgument);
}

// Progress: the line an unmount that waits long on its flush logs (ghostfs's shutdown watch):
// what the flush is doing, and what waits behind it.
TEST_F(FlashLogTest, ProgressSaysWhatARunningFlushIsDoingAndWhatWaits) {
  OpenLog(Options());
  ASSERT_TRUE(Write("a", 0, "first").ok());
  EXPECT_EQ(log_->Progress(), "idle; 1 records, 0 appends and 0 flush requests waiting");
  bool done = false;
  log_->Flush(LogFlushReason::kExplicit, [&](const FlushReport&) { done = true; });
  bool appended = false;
  log_->AppendWrite(LogRecordKind::kLocalWrite, "b", 0, "second", [&](Result<std::uint64_t>) { appended = true; });
  const std::string during = log_->Progress();
  EXPECT_EQ(during.rfind("flushing (explicit): step 1 of 1", 0), 0u) << during;
  EXPECT_NE(during.find("1 records, 1 appends and 1 flush requests waiting"), std::string::npos) << during;
  RunUntil(done);
  RunUntil(appended);
  EXPECT_EQ(log_->Progress(), "idle; 1 records, 0 appends and 0 flush requests waiting");
}

}  // namespace
}  // namespace ghost
