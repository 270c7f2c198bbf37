#include "common/cache/dir_flush_target.h"

#include <event2/event.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

namespace ghost {
namespace {

namespace fs = std::filesystem;

class DirFlushTargetTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/dir_flush_target_test.XXXXXX";
    dir_ = mkdtemp(tmpl);
    fs::create_directories(dir_ / "flash");
    fs::create_directories(dir_ / "local");
    base_ = event_base_new();
    io_ = std::make_unique<SyncFileIo>(base_);
    target_ = std::make_unique<DirFlushTarget>((dir_ / "local").string());
  }
  void TearDown() override {
    log_.reset();
    target_.reset();
    io_.reset();
    event_base_free(base_);
    fs::remove_all(dir_);
  }
  std::string Read(const std::string& rel) {
    std::ifstream in(dir_ / "local" / rel, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }
  void Open() {
    FlashLogOptions o;
    o.dir = (dir_ / "flash").string();
    o.capacity = 1 << 20;
    o.buffer = 8192;
    auto r = FlashLog::Open(o, *io_, *target_, nullptr);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    log_ = std::move(r).value();
  }
  void Wait(const bool& done) {
    for (int i = 0; i < 10000 && !done; ++i) event_base_loop(base_, EVLOOP_ONCE);
    ASSERT_TRUE(done);
  }
  void Write(const std::string& path, Bytes off, const std::string& data) {
    bool done = false;
    log_->AppendWrite(LogRecordKind::kLocalWrite, path, off, data, [&](Result<std::uint64_t> r) {
      EXPECT_TRUE(r.ok()) << r.status().ToString();
      done = true;
    });
    Wait(done);
  }
  void Meta(MetaOp op, const std::string& path, Bytes arg = 0, const std::string& arg2 = "") {
    bool done = false;
    log_->AppendMeta(op, path, arg, arg2, [&](Result<std::uint64_t> r) {
      EXPECT_TRUE(r.ok());
      done = true;
    });
    Wait(done);
  }
  FlushReport Flush() {
    bool done = false;
    FlushReport rep;
    log_->Flush(LogFlushReason::kExplicit, [&](const FlushReport& r) { rep = r; done = true; });
    Wait(done);
    return rep;
  }

  fs::path dir_;
  event_base* base_ = nullptr;
  std::unique_ptr<SyncFileIo> io_;
  std::unique_ptr<DirFlushTarget> target_;
  std::unique_ptr<FlashLog> log_;
};

TEST_F(DirFlushTargetTest, AppliesWritesAndMetadataIntoTheTree) {
  Open();
  Meta(MetaOp::kMkdir, "docs", 0755);
  Write("docs/a.txt", 0, "hello world");
  Meta(MetaOp::kTruncate, "docs/a.txt", 5);
  Meta(MetaOp::kRename, "docs/a.txt", 0, "docs/b.txt");
  Write("docs/gone", 0, "x");
  Meta(MetaOp::kUnlink, "docs/gone");
  FlushReport rep = Flush();
  EXPECT_TRUE(rep.errors.empty()) << rep.errors.front();
  EXPECT_EQ(Read("docs/b.txt"), "hello");
  EXPECT_FALSE(fs::exists(dir_ / "local" / "docs" / "a.txt"));
  EXPECT_FALSE(fs::exists(dir_ / "local" / "docs" / "gone"));
}

TEST_F(DirFlushTargetTest, ReplayingAlreadyAppliedMetadataSucceeds) {
  fs::create_directories(dir_ / "local" / "d");
  std::ofstream(dir_ / "local" / "d" / "new") << "x";
  EXPECT_TRUE(target_->ApplyMeta(MetaOp::kMkdir, "d", 0755, "").ok());
  EXPECT_TRUE(target_->ApplyMeta(MetaOp::kRename, "d/old", 0, "d/new").ok());
  EXPECT_TRUE(target_->ApplyMeta(MetaOp::kUnlink, "d/missing", 0, "").ok());
  EXPECT_TRUE(target_->ApplyMeta(MetaOp::kRmdir, "nodir", 0, "").ok());
  EXPECT_FALSE(target_->ApplyMeta(MetaOp::kRename, "d/none", 0, "d/none2").ok());
}

TEST_F(DirFlushTargetTest, APathLeavingTheRootIsKeptAndReportedNotWritten) {
  Open();
  Write("../escape", 0, "evil");
  Write("ok", 0, "fine");
  FlushReport rep = Flush();
  ASSERT_EQ(rep.errors.size(), 1u);
  EXPECT_NE(rep.errors[0].find("leaves"), std::string::npos) << rep.errors[0];
  EXPECT_EQ(rep.records_kept, 1u);
  EXPECT_FALSE(fs::exists(dir_ / "escape"));
  EXPECT_EQ(Read("ok"), "fine");
  EXPECT_EQ(log_->records().size(), 1u);
}

}  // namespace
}  // namespace ghost
