// LocalFlashLog (fs/flash_local.h): the flash log of local/ — records that follow their file by
// handle, reads that overlay them, logged truncates, the write-back's routing question, and the
// --flash-log DIR[:SIZE] spec.
#include "fs/flash_local.h"

#include <event2/event.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <cstring>

#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <set>
#include <string>

#include "common/base/clock.h"
#include "common/base/file_io.h"
#include "common/power/device.h"
#include "common/power/power_manager.h"
#include "common/power/profile.h"

namespace ghost {
namespace {

namespace fs = std::filesystem;

std::string ReadFile(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

TEST(ParseFlashLogSpecTest, ReadsTheDirectoryAndAnOptionalSize) {
  Result<FlashLogSpec> a = ParseFlashLogSpec("/mnt/sd/ghost:4M");
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_EQ(a->dir, "/mnt/sd/ghost");
  EXPECT_EQ(a->capacity, Bytes{4} << 20);
  Result<FlashLogSpec> b = ParseFlashLogSpec("/mnt/sd/ghost");
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->dir, "/mnt/sd/ghost");
  EXPECT_EQ(b->capacity, Bytes{16} << 20);
  Result<FlashLogSpec> c = ParseFlashLogSpec("/mnt/a:b");  // not a size: part of the name
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->dir, "/mnt/a:b");
  EXPECT_FALSE(ParseFlashLogSpec("").ok());
  EXPECT_FALSE(ParseFlashLogSpec(":4M").ok());
  Result<FlashLogSpec> tiny = ParseFlashLogSpec("/x:1K");
  ASSERT_FALSE(tiny.ok());
  EXPECT_NE(tiny.status().message().find("64K"), std::string::npos) << tiny.status().message();
}

// A local/ tree in a temporary directory, a log beside it, and a disk without a policy (always
// ready) on a virtual clock.
class LocalFlashLogTest : public ::testing::Test {
 protected:
  void SetUp() override {
    base_ = event_base_new();
    io_ = std::make_unique<SyncFileIo>(base_);
    faulty_ = std::make_unique<FaultyFileIo>(*io_);
    std::string tmpl = ::testing::TempDir() + "ghost_flash_local_XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    root_ = tmpl;
    Result<DeviceProfile> profile = LoadDeviceProfile("microdrive-1gb", GHOST_PROFILE_DIR);
    ASSERT_TRUE(profile.ok()) << profile.status().ToString();
    disk_ = std::make_unique<Device>(clock_, *profile, nullptr, profile->HighPowerMode());
    pm_ = std::make_unique<PowerManager>(clock_, Power::Milliwatts(1440), 50);
    disk_id_ = pm_->Register(disk_.get(), nullptr);
    Reopen();
  }
  // Opens the log (again: what a restart after a crash does, without flushing it first).
  void Reopen() {
    log_.reset();
    FlashLogOptions o;
    o.dir = root_ / "flash";
    o.capacity = 1 << 20;
    o.buffer = 64 << 10;
    Result<std::unique_ptr<LocalFlashLog>> log =
        LocalFlashLog::Open(o, *faulty_, (root_ / "local").string(), *pm_, disk_id_, *disk_, nullptr);
    ASSERT_TRUE(log.ok()) << log.status().ToString();
    log_ = std::move(log).value();
  }
  // Logs a metadata change made in the backing tree (as LocalTree does after making it).
  Status Meta(MetaOp op, const std::string& path, int fd = -1, Bytes mode = 0, const std::string& new_path = "") {
    bool done = false;
    Status out;
    log_->AppendMeta(op, path, fd, mode, new_path, [&](Status s) { out = s; done = true; });
    Run(done);
    return out;
  }
  // Recovery's replay (the mount's first act), run to its end.
  FlushReport ReplayAll() {
    bool done = false;
    FlushReport out;
    log_->SetFlushListener([&](const FlushReport& r) { out = r; done = true; });
    log_->Replay();
    Run(done);
    log_->SetFlushListener(nullptr);
    return out;
  }
  // A power cut took the backing tree's metadata changes since `serial`: the marker goes back.
  void LoseMetadataSince(std::uint64_t serial) {
    std::string v = std::to_string(serial);
    ASSERT_EQ(::setxattr(root_.c_str(), kMetaSerialXattr, v.data(), v.size(), 0), 0) << std::strerror(errno);
  }
  void TearDown() override {
    log_.reset();
    pm_.reset();
    flash_dev_.reset();
    disk_.reset();
    faulty_.reset();
    io_.reset();
    event_base_free(base_);
    std::error_code ec;
    fs::remove_all(root_, ec);
  }

  void Run(const bool& done) {
    for (int i = 0; i < 10000 && !done; ++i) {
      clock_.RunUntilIdle();
      event_base_loop(base_, EVLOOP_NONBLOCK);
    }
    ASSERT_TRUE(done) << "the callback never ran";
  }
  Status Append(int fd, Bytes off, const std::string& data) {
    bool done = false;
    Status out;
    log_->AppendWrite(fd, off, data, [&](Status s) { out = s; done = true; });
    Run(done);
    return out;
  }
  FlushReport Flush() {
    bool done = false;
    FlushReport out;
    log_->log().Flush(LogFlushReason::kExplicit, [&](const FlushReport& r) { out = r; done = true; });
    Run(done);
    return out;
  }
  int Create(const std::string& name) {
    int fd = open((root_ / "local" / name).c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    EXPECT_GE(fd, 0) << name;
    return fd;
  }

  VirtualClock clock_;
  event_base* base_ = nullptr;
  std::unique_ptr<FileIo> io_;
  std::unique_ptr<FaultyFileIo> faulty_;  // over io_: the log's and the disk's I/O
  fs::path root_;
  std::unique_ptr<Device> disk_;
  std::unique_ptr<PowerManager> pm_;
  DeviceId disk_id_ = -1;
  std::unique_ptr<LocalFlashLog> log_;
  std::unique_ptr<Device> flash_dev_;  // the log's own device, when a test gives it one
};

TEST_F(LocalFlashLogTest, RecordsFollowTheirFileAcrossARename) {
  int fd = Create("draft.txt");
  ASSERT_TRUE(Append(fd, 0, "saved text").ok());
  close(fd);
  fs::rename(root_ / "local" / "draft.txt", root_ / "local" / "final.txt");
  EXPECT_EQ(ReadFile(root_ / "local" / "final.txt"), "");  // only in the log so far
  FlushReport r = Flush();
  EXPECT_TRUE(r.errors.empty()) << r.errors.front();
  EXPECT_EQ(r.records_kept, 0u);
  EXPECT_EQ(ReadFile(root_ / "local" / "final.txt"), "saved text");
  EXPECT_FALSE(fs::exists(root_ / "local" / "draft.txt"));
}

TEST_F(LocalFlashLogTest, RecordsOfADeletedFileAreFlushedIntoNothing) {
  int fd = Create("gone.txt");
  ASSERT_TRUE(Append(fd, 0, "never mind").ok());
  close(fd);
  fs::remove(root_ / "local" / "gone.txt");
  FlushReport r = Flush();
  EXPECT_TRUE(r.errors.empty()) << r.errors.front();
  EXPECT_EQ(r.records_kept, 0u);
  EXPECT_EQ(log_->log().records().size(), 0u);
  EXPECT_TRUE(fs::is_empty(root_ / "local"));
}

TEST_F(LocalFlashLogTest, ReadsOverlayTheLogAndALoggedTruncateCutsWhatCameBefore) {
  int fd = Create("f");
  ASSERT_TRUE(Append(fd, 0, "hello world").ok());
  EXPECT_TRUE(log_->Holds(fd));
  EXPECT_EQ(log_->LoggedEnd(fd), 11u);
  ASSERT_EQ(ftruncate(fd, 5), 0);  // the backing file first, as LocalTree::Setattr does
  bool done = false;
  log_->AppendTruncate(fd, 5, [&](Status s) { EXPECT_TRUE(s.ok()); done = true; });
  Run(done);
  ASSERT_TRUE(Append(fd, 5, "!").ok());
  EXPECT_EQ(log_->LoggedEnd(fd), 6u);
  std::string buf(5, '\0');  // what the disk holds now: five zeros
  ASSERT_TRUE(log_->Overlay(fd, 0, 64, &buf).ok());
  EXPECT_EQ(buf, "hello!");
  // A flush rewriting the older bytes into the file meanwhile does not change the size or the
  // bytes seen: the logged truncate fixes them.
  EXPECT_EQ(log_->SizeOver(fd, 11), 6u);
  std::string mid = "hello world";
  ASSERT_TRUE(log_->Overlay(fd, 0, 64, &mid).ok());
  EXPECT_EQ(mid, "hello!");
  FlushReport r = Flush();
  EXPECT_TRUE(r.errors.empty()) << r.errors.front();
  EXPECT_EQ(ReadFile(root_ / "local" / "f"), "hello!");
  EXPECT_FALSE(log_->Holds(fd));
  close(fd);
}

// A truncate logged while a flush runs lands behind the file's bytes that flush takes: the log
// then holds the truncate alone, and the flush has meanwhile rewritten the older bytes into the
// file. The file still counts as changed by the log (Changes): reads are cut at the truncate,
// and the next size change is logged behind it (LocalTree logs it only then), so the next
// flush does not undo it by replaying the older truncate (ghostfs_concurrent [flash] lost a
// ftruncate or a fallocate's size that way).
TEST_F(LocalFlashLogTest, ASizeChangeAfterATruncateLoggedDuringAFlushIsNotUndoneByIt) {
  int fd = Create("f");
  ASSERT_TRUE(Append(fd, 0, "hello world").ok());
  bool flushed = false;
  log_->log().Flush(LogFlushReason::kExplicit, [&](const FlushReport&) { flushed = true; });
  ASSERT_TRUE(log_->log().flushing());
  // A truncate while the flush runs, as LocalTree::Setattr makes it: the backing file first.
  ASSERT_EQ(ftruncate(fd, 5), 0);
  ASSERT_TRUE(log_->Changes(fd));
  bool logged = false;
  log_->AppendTruncate(fd, 5, [&](Status s) { EXPECT_TRUE(s.ok()) << s.ToString(); logged = true; });
  Run(flushed);
  Run(logged);
  EXPECT_EQ(ReadFile(root_ / "local" / "f"), "hello world");  // the flush wrote it after the cut
  EXPECT_FALSE(log_->Holds(fd));   // no bytes of it in the log
  EXPECT_TRUE(log_->Changes(fd));  // but its truncate
  std::string buf = ReadFile(root_ / "local" / "f");
  ASSERT_TRUE(log_->Overlay(fd, 0, 64, &buf).ok());
  EXPECT_EQ(buf, "hello");
  // The next size change, as Setattr and Fallocate make it: logged only when Changes(fd).
  ASSERT_EQ(ftruncate(fd, 8), 0);
  if (log_->Changes(fd)) {
    logged = false;
    log_->AppendTruncate(fd, 8, [&](Status s) { EXPECT_TRUE(s.ok()) << s.ToString(); logged = true; });
    Run(logged);
  }
  EXPECT_EQ(log_->SizeOver(fd, 8), 8u);
  buf = ReadFile(root_ / "local" / "f");
  ASSERT_TRUE(log_->Overlay(fd, 0, 64, &buf).ok());
  EXPECT_EQ(buf, std::string("hello\0\0\0", 8));
  FlushReport r = Flush();
  EXPECT_TRUE(r.errors.empty()) << r.errors.front();
  EXPECT_EQ(ReadFile(root_ / "local" / "f"), std::string("hello\0\0\0", 8));
  EXPECT_FALSE(log_->Changes(fd));
  close(fd);
}

// A truncate that grows the file while a flush replays an older, shorter one: the flush cuts
// the disk's file below the later size, and reads still see the later size (zeros past the
// older cut), not the disk's shorter file (a short read makes the kernel shrink the file).
TEST_F(LocalFlashLogTest, ReadsSeeALaterLoggedSizeWhileAFlushCutsTheDiskBelowIt) {
  int fd = Create("f");
  ASSERT_TRUE(Append(fd, 0, "hello world").ok());
  ASSERT_EQ(ftruncate(fd, 5), 0);
  bool logged = false;
  log_->AppendTruncate(fd, 5, [&](Status s) { EXPECT_TRUE(s.ok()) << s.ToString(); logged = true; });
  Run(logged);
  bool flushed = false;
  log_->log().Flush(LogFlushReason::kExplicit, [&](const FlushReport&) { flushed = true; });
  ASSERT_EQ(ftruncate(fd, 8), 0);  // while the flush runs
  ASSERT_TRUE(log_->Changes(fd));
  logged = false;
  log_->AppendTruncate(fd, 8, [&](Status s) { EXPECT_TRUE(s.ok()) << s.ToString(); logged = true; });
  Run(flushed);
  Run(logged);
  EXPECT_EQ(ReadFile(root_ / "local" / "f"), "hello");  // the flush's truncate to 5 came last
  std::string buf = ReadFile(root_ / "local" / "f");
  ASSERT_TRUE(log_->Overlay(fd, 0, 64, &buf).ok());
  EXPECT_EQ(buf, std::string("hello\0\0\0", 8));
  buf = "";  // a read from past the disk's end
  ASSERT_TRUE(log_->Overlay(fd, 6, 64, &buf).ok());
  EXPECT_EQ(buf, std::string("\0\0", 2));
  EXPECT_EQ(log_->SizeOver(fd, 5), 8u);
  FlushReport r = Flush();
  EXPECT_TRUE(r.errors.empty()) << r.errors.front();
  EXPECT_EQ(ReadFile(root_ / "local" / "f"), std::string("hello\0\0\0", 8));
  close(fd);
}

// The log's appends, a local/ read served from the log and a flush's reads of the log are the
// flash device's I/O (SetFlashDevice): counted, and its energy moves by them, not the disk's.
TEST_F(LocalFlashLogTest, AppendsReadsAndFlushReadsAreChargedToTheFlashDevice) {
  Result<DeviceProfile> sd = LoadDeviceProfile("sd-card", GHOST_PROFILE_DIR);
  ASSERT_TRUE(sd.ok()) << sd.status().ToString();
  flash_dev_ = std::make_unique<Device>(clock_, *sd, nullptr, 0);
  const DeviceId flash_id = pm_->Register(flash_dev_.get(), nullptr);
  log_->SetFlashDevice(flash_dev_.get());
  const Power disk_idle = disk_->profile().modes[static_cast<std::size_t>(disk_->mode())].power;
  const Power card_idle = sd->modes[0].power;
  const Power card_extra = sd->modes[0].io.active_power - card_idle;
  const EnergyReport e0 = pm_->meter().Read();
  const TimePoint t0 = clock_.Now();
  int fd = Create("f");
  const std::string data(200000, 'x');
  ASSERT_TRUE(Append(fd, 0, data).ok());
  const Bytes written = log_->StatsJson()["device_bytes_written"].get<Bytes>();
  EXPECT_GE(written, data.size() + FlashLog::kHeaderSize);
  EXPECT_EQ(written, log_->log().stats().used);  // every byte of the log, headers included
  std::string buf;  // the disk holds nothing of the file yet
  ASSERT_TRUE(log_->Overlay(fd, 0, 50000, &buf).ok());
  EXPECT_EQ(buf, data.substr(0, 50000));
  EXPECT_EQ(log_->StatsJson()["device_bytes_read"].get<Bytes>(), 50000u);
  clock_.AdvanceBy(Seconds(1));
  const EnergyReport e1 = pm_->meter().Read();
  const Duration span = clock_.Now() - t0;
  // 200 KB written at 10 MB/s and 50 KB read at 25 MB/s, above the card's idle draw: ≥ 7 mJ.
  const Energy least = card_extra * (sd->modes[0].io.write_bandwidth.TimeFor(written) +
                                     sd->modes[0].io.read_bandwidth.TimeFor(50000));
  EXPECT_GE((e1.devices[flash_id].energy - e0.devices[flash_id].energy).joules(),
            (card_idle * span + least).joules() * 0.999);
  // The disk drew its idle power only: the log's I/O is not the disk's.
  EXPECT_NEAR((e1.devices[disk_id_].energy - e0.devices[disk_id_].energy).joules(),
              (disk_idle * span).joules(), 1e-3);
  FlushReport r = Flush();
  EXPECT_TRUE(r.errors.empty());
  EXPECT_GE(r.bytes_read, data.size());
  EXPECT_EQ(log_->StatsJson()["device_bytes_read"].get<Bytes>(), 50000u + r.bytes_read);
  close(fd);
}

TEST_F(LocalFlashLogTest, TakesWritesWhileItHoldsRecordsEvenWhenTheDiskIsReady) {
  // No policy: the disk is always ready, so an empty log leaves writes to the disk ...
  EXPECT_FALSE(log_->TakesWrites());
  int fd = Create("f");
  ASSERT_TRUE(Append(fd, 0, "x").ok());
  // ... but a record in the log must not be overtaken by a later write going straight there.
  EXPECT_TRUE(log_->TakesWrites());
  Flush();
  EXPECT_FALSE(log_->TakesWrites());
  close(fd);
}

TEST_F(LocalFlashLogTest, FlushesAreCountedByReasonAndListened) {
  int flushes = 0;
  log_->SetFlushListener([&](const FlushReport&) { ++flushes; });
  int fd = Create("f");
  ASSERT_TRUE(Append(fd, 0, "abc").ok());
  Flush();
  close(fd);
  EXPECT_EQ(flushes, 1);
  nlohmann::json j = log_->StatsJson();
  EXPECT_EQ(j["flushes"]["explicit"], 1);
  EXPECT_EQ(j["records"], 0);
  EXPECT_EQ(j["policy"], "when-full");
  EXPECT_EQ(j["algorithm"], 4);
}

TEST_F(LocalFlashLogTest, ReplayAtOpenAppliesWhatTheLastRunLeft) {
  int fd = Create("f");
  ASSERT_TRUE(Append(fd, 0, "survives").ok());
  close(fd);
  log_.reset();  // as if killed: the log file keeps the record
  FlashLogOptions o;
  o.dir = root_ / "flash";
  o.capacity = 1 << 20;
  o.buffer = 64 << 10;
  RecoveryReport rep;
  Result<std::unique_ptr<LocalFlashLog>> log =
      LocalFlashLog::Open(o, *faulty_, (root_ / "local").string(), *pm_, disk_id_, *disk_, &rep);
  ASSERT_TRUE(log.ok()) << log.status().ToString();
  log_ = std::move(log).value();
  EXPECT_EQ(rep.records, 1u);
  log_->Replay();
  for (int i = 0; i < 1000 && !log_->log().records().empty(); ++i) {
    clock_.RunUntilIdle();
    event_base_loop(base_, EVLOOP_NONBLOCK);
  }
  EXPECT_EQ(ReadFile(root_ / "local" / "f"), "survives");
  EXPECT_EQ(log_->log().stats().flushes[static_cast<int>(LogFlushReason::kRecovery)], 1u);
}

// The flash device is full (or failing): the bytes go to the disk, not nowhere.
TEST_F(LocalFlashLogTest, AFailedAppendIsWrittenThroughToTheDisk) {
  int fd = Create("f");
  faulty_->FailNthCall(1, ENOSPC);  // the log's write
  Status s = Append(fd, 0, "through");
  EXPECT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(ReadFile(root_ / "local" / "f"), "through");
  EXPECT_TRUE(log_->log().records().empty());
  nlohmann::json j = log_->StatsJson();
  EXPECT_EQ(j["append_failures"], 1);
  EXPECT_EQ(j["write_throughs"], 1);
  EXPECT_EQ(j["write_through_failures"], 0);
  close(fd);
}

// Older bytes of the file in the log go to the disk first, so they cannot land over the newer.
TEST_F(LocalFlashLogTest, AFailedAppendFlushesTheFilesOlderRecordsBeforeWritingThrough) {
  int fd = Create("f");
  ASSERT_TRUE(Append(fd, 0, "aaaa").ok());
  faulty_->FailNthCall(1, ENOSPC);
  Status s = Append(fd, 0, "bb");
  EXPECT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(ReadFile(root_ / "local" / "f"), "bbaa");
  EXPECT_FALSE(log_->Holds(fd));
  Flush();  // nothing left that could overwrite the newer bytes
  EXPECT_EQ(ReadFile(root_ / "local" / "f"), "bbaa");
  close(fd);
}

// The log cannot take the bytes and the disk refuses the file's older records: an error for
// the writer (its fsync fails), never an acknowledgement; the older records stay in the log.
TEST_F(LocalFlashLogTest, AFailedAppendIsAnErrorWhenTheDiskRefusesTheFilesOlderRecords) {
  int fd = Create("f");
  ASSERT_TRUE(Append(fd, 0, "aaaa").ok());
  faulty_->FailWhen([](const FileCall& c) { return c.op == FileOp::kWrite; }, EIO);
  Status s = Append(fd, 0, "bb");
  faulty_->Heal();
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.ToString().find("older records"), std::string::npos) << s.ToString();
  EXPECT_EQ(log_->StatsJson()["write_through_failures"], 1);
  EXPECT_TRUE(log_->Holds(fd));
  FlushReport r = Flush();
  EXPECT_TRUE(r.errors.empty()) << r.errors.front();
  EXPECT_EQ(ReadFile(root_ / "local" / "f"), "aaaa");
  close(fd);
}

// The disk fails mid-flush: the records stay in the log (reads still see them), the failure is
// reported to the listener and counted, and the next flush applies them.
TEST_F(LocalFlashLogTest, EioMidFlushKeepsTheRecordsAndTheNextFlushAppliesThem) {
  std::vector<std::string> errors;
  log_->SetFlushListener([&](const FlushReport& r) { errors.insert(errors.end(), r.errors.begin(), r.errors.end()); });
  int fd = Create("f");
  ASSERT_TRUE(Append(fd, 0, "keep me").ok());
  faulty_->FailWhen([](const FileCall& c) { return c.op == FileOp::kWrite; }, EIO);
  FlushReport failed = Flush();
  faulty_->Heal();
  EXPECT_EQ(failed.records_kept, 1u);
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_NE(errors[0].find("Input/output error"), std::string::npos) << errors[0];
  EXPECT_EQ(log_->StatsJson()["records_kept"], 1);
  EXPECT_EQ(log_->StatsJson()["last_flush_errors"].size(), 1u);
  EXPECT_TRUE(log_->Holds(fd));
  std::string buf;
  ASSERT_TRUE(log_->Overlay(fd, 0, 64, &buf).ok());
  EXPECT_EQ(buf, "keep me");
  FlushReport again = Flush();
  EXPECT_TRUE(again.errors.empty()) << again.errors.front();
  EXPECT_EQ(again.records_applied, 1u);
  EXPECT_EQ(ReadFile(root_ / "local" / "f"), "keep me");
  EXPECT_FALSE(log_->Holds(fd));
  EXPECT_TRUE(log_->StatsJson()["last_flush_errors"].empty());
  close(fd);
}

// The test-only switch (GHOST_TEST_DISK_FAULT): while its file exists the log's disk writes
// fail and the records stay; the log's own appends still work.
TEST_F(LocalFlashLogTest, TheTestOnlyDiskFaultSwitchFailsTheDiskWhileItsFileExists) {
  log_.reset();
  fs::path fault = root_ / "disk-fails";
  ASSERT_EQ(setenv(kDiskFaultEnv, fault.c_str(), 1), 0);
  FlashLogOptions o;
  o.dir = root_ / "flash2";
  Result<std::unique_ptr<LocalFlashLog>> log =
      LocalFlashLog::Open(o, *faulty_, (root_ / "local").string(), *pm_, disk_id_, *disk_, nullptr);
  unsetenv(kDiskFaultEnv);
  ASSERT_TRUE(log.ok()) << log.status().ToString();
  log_ = std::move(log).value();
  int fd = Create("g");
  std::ofstream(fault).put('x');
  ASSERT_TRUE(Append(fd, 0, "still here").ok());
  FlushReport failed = Flush();
  EXPECT_EQ(failed.records_kept, 1u);
  ASSERT_FALSE(failed.errors.empty());
  EXPECT_NE(failed.errors[0].find("injected fault"), std::string::npos) << failed.errors[0];
  EXPECT_EQ(ReadFile(root_ / "local" / "g"), "");
  fs::remove(fault);
  FlushReport again = Flush();
  EXPECT_EQ(again.records_applied, 1u);
  EXPECT_EQ(ReadFile(root_ / "local" / "g"), "still here");
  close(fd);
}

// A truncate the log cannot take: the older logged bytes go to the disk, then the truncate, so
// no later flush revives the bytes it cut.
TEST_F(LocalFlashLogTest, ATruncateTheLogCannotTakeIsAppliedAfterFlushingTheOlderRecords) {
  int fd = Create("f");
  ASSERT_TRUE(Append(fd, 0, "hello world").ok());
  ASSERT_EQ(ftruncate(fd, 5), 0);  // the backing file first, as LocalTree::Setattr does
  faulty_->FailNthCall(1, ENOSPC);
  bool done = false;
  Status st;
  log_->AppendTruncate(fd, 5, [&](Status s) { st = s; done = true; });
  Run(done);
  EXPECT_TRUE(st.ok()) << st.ToString();
  EXPECT_FALSE(log_->Holds(fd));
  Flush();
  EXPECT_EQ(ReadFile(root_ / "local" / "f"), "hello");
  close(fd);
}

TEST(LocalMetaArgsTest, EncodesSerialHandleAndNewPathAndRejectsGarbage) {
  LocalMetaArgs a{42, "fh:1:00ff", "dir/new name"};
  EXPECT_EQ(EncodeLocalMetaArgs(a), "42\nfh:1:00ff\ndir/new name");
  Result<LocalMetaArgs> back = DecodeLocalMetaArgs(EncodeLocalMetaArgs(a));
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(*back, a);
  Result<LocalMetaArgs> empty = DecodeLocalMetaArgs(EncodeLocalMetaArgs({7, "", ""}));
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ(empty->serial, 7u);
  EXPECT_FALSE(DecodeLocalMetaArgs("").ok());
  EXPECT_FALSE(DecodeLocalMetaArgs("12\nno second newline").ok());
  EXPECT_FALSE(DecodeLocalMetaArgs("x1\n\n").ok());
  EXPECT_FALSE(DecodeLocalMetaArgs("\n\n").ok());
}

TEST_F(LocalFlashLogTest, RelPathNamesEntriesFromTheLocalRoot) {
  fs::create_directories(root_ / "local" / "d" / "e");
  int dir = open((root_ / "local" / "d" / "e").c_str(), O_PATH | O_CLOEXEC);
  int top = open((root_ / "local").c_str(), O_PATH | O_CLOEXEC);
  ASSERT_GE(dir, 0);
  EXPECT_EQ(*log_->RelPath(dir, "f.txt"), "d/e/f.txt");
  EXPECT_EQ(*log_->RelPath(dir, ""), "d/e");
  EXPECT_EQ(*log_->RelPath(top, "f.txt"), "f.txt");
  EXPECT_EQ(*log_->RelPath(top, ""), ".");
  close(dir);
  close(top);
}

// The editor's save (write a temporary file, rename it over the original) twice, logged as
// LocalTree logs it, then a SIGKILL (the log is reopened unflushed) and recovery: the backing
// tree held every change already, so replaying the records must not make any of them again
// (recreating ".swp" and renaming it over "doc" would put the older save back).
TEST_F(LocalFlashLogTest, ReplayAfterAKillDoesNotRemakeNameChangesTheBackingTreeHolds) {
  const fs::path local = root_ / "local";
  for (const std::string text : {"first save", "second save"}) {
    int fd = Create(".doc.swp");
    ASSERT_TRUE(Meta(MetaOp::kCreate, ".doc.swp", fd, 0644).ok());
    ASSERT_TRUE(Append(fd, 0, text).ok());
    close(fd);
    fs::rename(local / ".doc.swp", local / "doc");
    ASSERT_TRUE(Meta(MetaOp::kRename, ".doc.swp", -1, 0, "doc").ok());
  }
  EXPECT_EQ(log_->log().records().size(), 6u);
  EXPECT_EQ(log_->applied_meta_serial(), 4u);
  Reopen();
  FlushReport r = ReplayAll();
  EXPECT_TRUE(r.errors.empty()) << r.errors.front();
  EXPECT_EQ(r.records_kept, 0u);
  EXPECT_EQ(ReadFile(local / "doc"), "second save");
  EXPECT_FALSE(fs::exists(local / ".doc.swp"));
  EXPECT_TRUE(log_->log().records().empty());
  // Serials go on after the recovered ones.
  fs::create_directory(local / "later");
  ASSERT_TRUE(Meta(MetaOp::kMkdir, "later", -1, 0755).ok());
  EXPECT_EQ(log_->applied_meta_serial(), 5u);
}

// A power cut took the backing tree's name changes (the marker is older than the records):
// recovery makes them again, in order, and the logged bytes of a file whose create was lost
// land in the recreated file (its logged handle is mapped to it).
TEST_F(LocalFlashLogTest, ReplayRemakesTheNameChangesAPowerCutTookWithTheirBytes) {
  const fs::path local = root_ / "local";
  fs::create_directory(local / "d");
  ASSERT_TRUE(Meta(MetaOp::kMkdir, "d", -1, 0750).ok());
  int fd = open((local / "d" / "draft").c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  ASSERT_GE(fd, 0);
  ASSERT_TRUE(Meta(MetaOp::kCreate, "d/draft", fd, 0644).ok());
  ASSERT_TRUE(Append(fd, 0, "kept bytes").ok());
  close(fd);
  fs::rename(local / "d" / "draft", local / "d" / "final");
  ASSERT_TRUE(Meta(MetaOp::kRename, "d/draft", -1, 0, "d/final").ok());
  ASSERT_EQ(chmod((local / "d" / "final").c_str(), 0600), 0);
  int cfd = open((local / "d" / "final").c_str(), O_PATH | O_CLOEXEC);
  ASSERT_TRUE(Meta(MetaOp::kChmod, "d/final", cfd, 0600).ok());
  close(cfd);
  int gone = Create("gone");
  ASSERT_TRUE(Meta(MetaOp::kCreate, "gone", gone, 0644).ok());
  close(gone);
  fs::remove(local / "gone");
  ASSERT_TRUE(Meta(MetaOp::kUnlink, "gone").ok());
  // The power cut: none of it reached the backing disk.
  log_.reset();
  fs::remove_all(local / "d");
  LoseMetadataSince(0);
  Reopen();
  FlushReport r = ReplayAll();
  EXPECT_TRUE(r.errors.empty()) << r.errors.front();
  EXPECT_EQ(r.records_kept, 0u);
  EXPECT_EQ(ReadFile(local / "d" / "final"), "kept bytes");
  EXPECT_FALSE(fs::exists(local / "d" / "draft"));
  EXPECT_FALSE(fs::exists(local / "gone"));
  struct stat st;
  ASSERT_EQ(stat((local / "d" / "final").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0600u);
  ASSERT_EQ(stat((local / "d").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0750u);
  EXPECT_EQ(log_->applied_meta_serial(), 6u);
}

// A logged change that cannot be made on replay (an rmdir of a directory that holds a file the
// log knows nothing of) is kept in the log and reported, not dropped.
TEST_F(LocalFlashLogTest, AMetadataRecordReplayCannotApplyIsKeptAndReported) {
  const fs::path local = root_ / "local";
  fs::create_directory(local / "d");
  ASSERT_TRUE(Meta(MetaOp::kRmdir, "d").ok());  // as if "d" had been removed
  std::ofstream(local / "d" / "stranger") << "x";
  log_.reset();
  LoseMetadataSince(0);
  Reopen();
  FlushReport r = ReplayAll();
  EXPECT_EQ(r.records_kept, 1u);
  ASSERT_EQ(r.errors.size(), 1u);
  EXPECT_NE(r.errors[0].find("rmdir"), std::string::npos) << r.errors[0];
  EXPECT_EQ(log_->log().records().size(), 1u);
  EXPECT_TRUE(fs::exists(local / "d" / "stranger"));
  EXPECT_EQ(log_->StatsJson()["last_flush_errors"].size(), 1u);
}


TEST(MetaSerialMarkerTest, NeverPassesAGapAndReadsTheFormerPlainForm) {
  MetaSerialMarker m;
  m.Add(1);
  m.Add(3);  // 2 is missing (a record a replay kept)
  m.Add(4);
  m.Add(6);
  EXPECT_EQ(m.through, 1u);
  EXPECT_EQ(m.Highest(), 6u);
  EXPECT_FALSE(m.Holds(2));
  EXPECT_TRUE(m.Holds(3));
  EXPECT_FALSE(m.Holds(5));
  EXPECT_EQ(m.Encode(), "1 3-4 6");
  std::optional<MetaSerialMarker> back = ParseMetaSerialMarker(m.Encode());
  ASSERT_TRUE(back.has_value());
  EXPECT_EQ(*back, m);
  m.Add(5);
  EXPECT_EQ(m.Encode(), "1 3-6");
  m.Add(2);  // the kept record applied at last: the gap closes
  EXPECT_EQ(m.Encode(), "6");
  EXPECT_TRUE(m.above.empty());
  std::optional<MetaSerialMarker> plain = ParseMetaSerialMarker("17");
  ASSERT_TRUE(plain.has_value());
  EXPECT_EQ(plain->through, 17u);
  EXPECT_TRUE(plain->Holds(17));
  EXPECT_FALSE(plain->Holds(18));
  EXPECT_FALSE(ParseMetaSerialMarker("").has_value());
  EXPECT_FALSE(ParseMetaSerialMarker("x").has_value());
  EXPECT_FALSE(ParseMetaSerialMarker("3 9-5").has_value());
  EXPECT_FALSE(ParseMetaSerialMarker("3 -5").has_value());
}

// A power cut, then a recovery that keeps a record (it cannot be applied yet) and applies a
// later one: the marker must not pass the kept record, so every later replay and flush (after
// another remount too) tries it again and reports it until it applies; it is never taken as
// applied and dropped.
TEST_F(LocalFlashLogTest, ARecordReplayKeptIsRetriedAfterLaterRecordsWereApplied) {
  const fs::path local = root_ / "local";
  fs::create_directory(local / "d");
  ASSERT_TRUE(Meta(MetaOp::kRmdir, "d").ok());  // serial 1: as if "d" had been removed
  fs::create_directory(local / "e");
  ASSERT_TRUE(Meta(MetaOp::kMkdir, "e", -1, 0755).ok());  // serial 2
  std::ofstream(local / "d" / "stranger") << "x";
  // The power cut took both changes: "e" is gone and the marker is back at 0.
  log_.reset();
  fs::remove(local / "e");
  LoseMetadataSince(0);
  Reopen();
  FlushReport first = ReplayAll();
  EXPECT_EQ(first.records_kept, 1u);
  EXPECT_EQ(first.records_applied, 1u);
  EXPECT_TRUE(fs::is_directory(local / "e"));
  EXPECT_EQ(log_->StatsJson()["meta_serial_marker"], "0 2");
  // A live change while the kept record waits goes past the gap.
  fs::create_directory(local / "f");
  ASSERT_TRUE(Meta(MetaOp::kMkdir, "f", -1, 0755).ok());
  EXPECT_EQ(log_->applied_meta_serial(), 3u);
  // Another remount: the record is still in the log, still not applicable, still reported.
  log_.reset();
  Reopen();
  FlushReport second = ReplayAll();
  EXPECT_EQ(second.records_kept, 1u);
  ASSERT_EQ(second.errors.size(), 1u);
  EXPECT_NE(second.errors[0].find("rmdir"), std::string::npos) << second.errors[0];
  EXPECT_TRUE(fs::exists(local / "d" / "stranger"));
  // Once it can be applied, the next flush applies it and the gap closes.
  fs::remove(local / "d" / "stranger");
  FlushReport third = Flush();
  EXPECT_TRUE(third.errors.empty()) << third.errors.front();
  EXPECT_EQ(third.records_kept, 0u);
  EXPECT_FALSE(fs::exists(local / "d"));
  EXPECT_TRUE(log_->log().records().empty());
  EXPECT_EQ(log_->StatsJson()["meta_serial_marker"], "3");
  EXPECT_EQ(log_->applied_meta_serial(), 3u);
}

bool IsDirectory(int fd) {
  struct stat st {};
  return fstat(fd, &st) == 0 && S_ISDIR(st.st_mode);
}

// The disk fails the fsync of a directory (the step that makes the flush's name changes
// durable): every record of the flush, data and metadata, stays in the log and is counted kept;
// the next flush applies them all.
TEST_F(LocalFlashLogTest, AFailedSyncOfTheNameChangesKeepsEveryRecordAndTheNextFlushAppliesThem) {
  const fs::path local = root_ / "local";
  int fd = Create("draft");
  ASSERT_TRUE(Meta(MetaOp::kCreate, "draft", fd, 0644).ok());
  ASSERT_TRUE(Append(fd, 0, "body").ok());
  fs::rename(local / "draft", local / "final");
  ASSERT_TRUE(Meta(MetaOp::kRename, "draft", -1, 0, "final").ok());
  faulty_->FailWhen([](const FileCall& c) { return c.op == FileOp::kFsync && IsDirectory(c.fd); }, EIO);
  FlushReport failed = Flush();
  faulty_->Heal();
  EXPECT_EQ(failed.records_kept, 3u);
  EXPECT_EQ(failed.records_applied, 0u);
  ASSERT_EQ(failed.errors.size(), 1u);
  EXPECT_NE(failed.errors[0].find("sync the metadata changes of local/"), std::string::npos) << failed.errors[0];
  EXPECT_EQ(log_->log().records().size(), 3u);
  EXPECT_EQ(log_->StatsJson()["records_kept"], 3);
  EXPECT_EQ(log_->StatsJson()["last_flush_errors"].size(), 1u);
  EXPECT_TRUE(log_->Holds(fd));
  FlushReport again = Flush();
  EXPECT_TRUE(again.errors.empty()) << again.errors.front();
  EXPECT_EQ(again.records_applied, 3u);
  EXPECT_TRUE(log_->log().records().empty());
  EXPECT_EQ(ReadFile(local / "final"), "body");
  close(fd);
}

// A flush makes its name changes durable with fsyncs of the directories they touched (and of
// the created file), all through the FileIo, never with a syncfs of the whole file system (which
// writes every program's dirty pages: over 30 s on a busy machine, ghostfs_flash_edit's unmount).
// Only a directory renamed away by a later record of the same flush sends it to a syncfs.
TEST_F(LocalFlashLogTest, AFlushSyncsTheDirectoriesItsNameChangesTouchedNotTheWholeFileSystem) {
  const fs::path local = root_ / "local";
  ASSERT_EQ(mkdir((local / "d").c_str(), 0755), 0);
  ASSERT_TRUE(Meta(MetaOp::kMkdir, "d", -1, 0755).ok());
  int fd = Create("d/draft");
  ASSERT_TRUE(Meta(MetaOp::kCreate, "d/draft", fd, 0644).ok());
  ASSERT_TRUE(Append(fd, 0, "body").ok());
  fs::rename(local / "d" / "draft", local / "final");
  ASSERT_TRUE(Meta(MetaOp::kRename, "d/draft", -1, 0, "final").ok());
  struct stat file {}, top {}, d {};
  ASSERT_EQ(fstat(fd, &file), 0);
  ASSERT_EQ(stat(local.c_str(), &top), 0);
  ASSERT_EQ(stat((local / "d").c_str(), &d), 0);
  std::set<ino_t> fsynced;
  int syncfs_calls = 0;
  // Watches every call (fails none but a syncfs).
  faulty_->FailWhen([&](const FileCall& c) {
    struct stat st {};
    if (c.op == FileOp::kFsync && fstat(c.fd, &st) == 0) fsynced.insert(st.st_ino);
    if (c.op == FileOp::kSyncfs) ++syncfs_calls;
    return c.op == FileOp::kSyncfs;
  }, EIO);
  FlushReport r = Flush();
  EXPECT_TRUE(r.errors.empty()) << r.errors.front();
  EXPECT_EQ(r.records_applied, 4u);
  EXPECT_EQ(syncfs_calls, 0);
  EXPECT_TRUE(fsynced.count(top.st_ino)) << "local/ (the rename's target directory)";
  EXPECT_TRUE(fsynced.count(d.st_ino)) << "local/d (mkdir, the create, the rename's source)";
  EXPECT_TRUE(fsynced.count(file.st_ino)) << "the created file";
  EXPECT_EQ(ReadFile(local / "final"), "body");

  // A directory that a later record renamed: its old name finds nothing, so a syncfs.
  ASSERT_EQ(mkdir((local / "e").c_str(), 0755), 0);
  ASSERT_TRUE(Meta(MetaOp::kMkdir, "e", -1, 0755).ok());
  int g = Create("e/g");
  ASSERT_TRUE(Meta(MetaOp::kCreate, "e/g", g, 0644).ok());
  fs::rename(local / "e", local / "e2");
  ASSERT_TRUE(Meta(MetaOp::kRename, "e", -1, 0, "e2").ok());
  FlushReport moved = Flush();
  faulty_->Heal();
  EXPECT_EQ(syncfs_calls, 1);
  EXPECT_EQ(moved.records_kept, 3u) << "the syncfs failed (this test's fault): every record kept";
  FlushReport again = Flush();
  EXPECT_TRUE(again.errors.empty()) << again.errors.front();
  EXPECT_EQ(again.records_applied, 3u);
  EXPECT_TRUE(fs::exists(local / "e2" / "g"));
  close(g);
  close(fd);
}

// The test-only switch fails the flush's syncs too: a flush of metadata records alone (no
// data write to fail) keeps them while the switch's file exists.
TEST_F(LocalFlashLogTest, TheTestOnlyDiskFaultSwitchFailsTheFlushesSyncfs) {
  log_.reset();
  fs::path fault = root_ / "disk-fails";
  ASSERT_EQ(setenv(kDiskFaultEnv, fault.c_str(), 1), 0);
  FlashLogOptions o;
  o.dir = root_ / "flash2";
  Result<std::unique_ptr<LocalFlashLog>> log =
      LocalFlashLog::Open(o, *faulty_, (root_ / "local").string(), *pm_, disk_id_, *disk_, nullptr);
  unsetenv(kDiskFaultEnv);
  ASSERT_TRUE(log.ok()) << log.status().ToString();
  log_ = std::move(log).value();
  const fs::path local = root_ / "local";
  int fd = Create("a");
  ASSERT_TRUE(Meta(MetaOp::kCreate, "a", fd, 0644).ok());
  close(fd);
  std::ofstream(fault).put('x');
  fs::rename(local / "a", local / "b");
  ASSERT_TRUE(Meta(MetaOp::kRename, "a", -1, 0, "b").ok());
  FlushReport failed = Flush();
  EXPECT_EQ(failed.records_kept, 2u);
  ASSERT_FALSE(failed.errors.empty());
  EXPECT_NE(failed.errors[0].find("injected fault"), std::string::npos) << failed.errors[0];
  EXPECT_EQ(log_->log().records().size(), 2u);
  fs::remove(fault);
  FlushReport again = Flush();
  EXPECT_EQ(again.records_applied, 2u);
  EXPECT_TRUE(log_->log().records().empty());
}

// AppendMeta's fallback (the log cannot take the record) syncs the change to the disk through
// the FileIo: a failing disk is reported, not taken for a success.
TEST_F(LocalFlashLogTest, AMetadataChangeTheLogCannotTakeIsSyncedThroughTheFileIo) {
  int fd = Create("a");
  const int log_fd = log_->log().log_fd();
  // The flash device fails every write of the log: the record cannot be appended.
  faulty_->FailWhen([log_fd](const FileCall& c) { return c.fd == log_fd && c.op != FileOp::kRead; }, EIO);
  Status synced = Meta(MetaOp::kCreate, "a", fd, 0644);
  ASSERT_FALSE(synced.ok());
  EXPECT_NE(synced.message().find("synced to the disk instead"), std::string::npos) << synced.message();
  // Now the disk's syncfs fails too: the caller hears it.
  faulty_->FailWhen([log_fd](const FileCall& c) {
    return (c.fd == log_fd && c.op != FileOp::kRead) || c.op == FileOp::kSyncfs;
  }, EIO);
  Status failed = Meta(MetaOp::kChmod, "a", fd, 0600);
  faulty_->Heal();
  ASSERT_FALSE(failed.ok());
  EXPECT_NE(failed.message().find("syncing the disk failed"), std::string::npos) << failed.message();
  EXPECT_EQ(log_->StatsJson()["meta_failures"], 2);
  close(fd);
}

// A cache left (a crash: no clean end) with records in its flash log names that log: a mount
// without it, or with another log, is refused until the log is replayed or gone (found by
// ghostfs_flash_crash: a mount without the log showed an fsync'd file empty, and the log's later
// replay put its older bytes over what was written meanwhile).
TEST_F(LocalFlashLogTest, ACacheLeftWithRecordsInItsLogRefusesAMountWithoutIt) {
  int fd = Create("f");
  ASSERT_TRUE(Append(fd, 0, "fsync'd").ok());
  close(fd);
  const std::string cache = root_.string();
  Status without = CheckLeftFlashLog(cache, "");
  ASSERT_FALSE(without.ok());
  EXPECT_NE(without.message().find("--flash-log " + fs::canonical(root_ / "flash").string()), std::string::npos)
      << without.message();
  EXPECT_TRUE(CheckLeftFlashLog(cache, (root_ / "flash").string()).ok());
  fs::create_directories(root_ / "other");
  EXPECT_FALSE(CheckLeftFlashLog(cache, (root_ / "other").string()).ok());
  Reopen();  // a restart with the same log: allowed, and it still holds the record
  EXPECT_FALSE(CheckLeftFlashLog(cache, "").ok());
  FlushReport r = Flush();
  ASSERT_TRUE(r.errors.empty()) << r.errors.front();
  log_.reset();  // a clean end with the log empty: the mark goes
  EXPECT_TRUE(CheckLeftFlashLog(cache, "").ok());
}

TEST_F(LocalFlashLogTest, ALeftLogThatIsGoneNoLongerRefusesAMount) {
  int fd = Create("f");
  ASSERT_TRUE(Append(fd, 0, "lost with the card").ok());
  close(fd);
  ASSERT_FALSE(CheckLeftFlashLog(root_.string(), "").ok());
  log_.reset();
  fs::remove(root_ / "flash" / "flash.log");
  EXPECT_TRUE(CheckLeftFlashLog(root_.string(), "").ok());
  EXPECT_TRUE(CheckLeftFlashLog(root_.string(), "").ok());  // and the mark was removed
  char buf[16];
  EXPECT_LT(::getxattr(root_.c_str(), kFlashLogDirXattr, buf, sizeof buf), 0);
}

// Two daemons on one log would append over each other's records (ghostfs_flash_random).
TEST_F(LocalFlashLogTest, ASecondOpenOfTheSameLogDirectoryIsRefused) {
  FlashLogOptions o;
  o.dir = root_ / "flash";
  o.capacity = 1 << 20;
  o.buffer = 64 << 10;
  fs::create_directories(root_ / "cache2" / "local");
  Result<std::unique_ptr<LocalFlashLog>> second =
      LocalFlashLog::Open(o, *faulty_, (root_ / "cache2" / "local").string(), *pm_, disk_id_, *disk_, nullptr);
  ASSERT_FALSE(second.ok());
  EXPECT_NE(second.status().message().find("in use by another ghostfs"), std::string::npos)
      << second.status().message();
  log_.reset();  // the first one ends: the directory is free
  second = LocalFlashLog::Open(o, *faulty_, (root_ / "cache2" / "local").string(), *pm_, disk_id_, *disk_, nullptr);
  EXPECT_TRUE(second.ok()) << second.status().ToString();
}

// Fills spilled to the log (flash_local.h "Fills"): one append group each, read back from the
// log, applied whole by the flush through the fill applier, never torn.
class LocalFlashLogFillTest : public LocalFlashLogTest {
 protected:
  Result<std::string> AppendFill(const std::string& key, const std::string& body, const std::string& meta) {
    bool done = false;
    Result<std::string> out = Status::Internal("not run");
    log_->AppendFill(key, std::make_shared<const std::string>(body), meta, [&](Result<std::string> r) {
      out = std::move(r);
      done = true;
    });
    Run(done);
    return out;
  }
  // The applier records what it got and answers `answer`.
  void Apply(Status answer) {
    log_->SetFillApplier([this, answer](std::vector<LocalFlashLog::LoggedFill> fills, std::function<void(Status)> done) {
      for (auto& f : fills) applied_.push_back(std::move(f));
      done(answer);
    });
  }
  static std::string Body(std::size_t n, char seed) {
    std::string b(n, '\0');
    for (std::size_t i = 0; i < n; ++i) b[i] = static_cast<char>(seed + i * 7 % 251);
    return b;
  }
  std::vector<LocalFlashLog::LoggedFill> applied_;
};

// Spilled fills alone do not mark the cache (the origin has them): a mount without the log after
// a crash goes on (ghostfs_evict_random switches one cache between plain, profile and flash
// mounts with SIGKILLs between them). A local/ write does mark it.
TEST_F(LocalFlashLogFillTest, SpilledFillsAloneDoNotMarkTheCacheALocalWriteDoes) {
  ASSERT_TRUE(AppendFill("http://o/x", Body(10 << 10, 'a'), "{}").ok());
  Reopen();  // a crash: the fill is still in the log
  EXPECT_TRUE(CheckLeftFlashLog(root_.string(), "").ok());
  int fd = Create("f");
  ASSERT_TRUE(Append(fd, 0, "mine").ok());
  close(fd);
  EXPECT_FALSE(CheckLeftFlashLog(root_.string(), "").ok());
}

TEST_F(LocalFlashLogFillTest, AFillIsReadFromTheLogAndTheFlushAppliesItWhole) {
  const std::string body = Body(150 << 10, 'a');  // three records of a 64K buffer
  Result<std::string> path = AppendFill("http://o/x", body, "{\"etag\":\"e1\"}");
  ASSERT_TRUE(path.ok()) << path.status().ToString();
  ASSERT_TRUE(ParseFillPath(*path).has_value());
  EXPECT_EQ(ParseFillPath(*path)->second, "http://o/x");
  EXPECT_EQ(log_->log().records().size(), 4u);  // 3 data records and the commit
  EXPECT_EQ(log_->log().records().back().op, MetaOp::kFill);
  std::string back(body.size(), '\0');
  ASSERT_TRUE(log_->ReadFill(*path, 0, std::span<char>(back.data(), back.size())).ok());
  EXPECT_TRUE(back == body);
  std::string tail(10, '\0');
  EXPECT_FALSE(log_->ReadFill(*path, body.size() - 5, std::span<char>(tail.data(), tail.size())).ok());
  EXPECT_EQ(log_->StatsJson()["fills_logged"], 1);
  Apply(Status::Ok());
  FlushReport r = Flush();
  EXPECT_TRUE(r.errors.empty()) << r.errors.front();
  ASSERT_EQ(applied_.size(), 1u);
  EXPECT_EQ(applied_[0].key, "http://o/x");
  EXPECT_EQ(applied_[0].path, *path);
  EXPECT_EQ(applied_[0].meta, "{\"etag\":\"e1\"}");
  EXPECT_TRUE(applied_[0].body == body);
  EXPECT_TRUE(log_->log().records().empty());
}

TEST_F(LocalFlashLogFillTest, AFillTheApplierRefusesStaysInTheLogForTheNextFlush) {
  const std::string body = Body(1000, 'b');
  ASSERT_TRUE(AppendFill("k", body, "{}").ok());
  Apply(Status::IoError("the store's disk failed"));
  FlushReport failed = Flush();
  EXPECT_EQ(failed.records_kept, 2u);
  EXPECT_EQ(log_->log().records().size(), 2u);
  Apply(Status::Ok());
  FlushReport again = Flush();
  EXPECT_EQ(again.records_applied, 2u);
  ASSERT_EQ(applied_.size(), 2u);  // once refused, once applied
  EXPECT_TRUE(applied_[1].body == body);
  EXPECT_TRUE(log_->log().records().empty());
}

// A crash cut the log's tail inside the group: the fill's data without its commit record is
// dropped by the replay, not applied torn; a whole fill before it is applied.
TEST_F(LocalFlashLogFillTest, AFillWhoseCommitATornTailCutIsDroppedNotAppliedTorn) {
  const std::string whole = Body(3000, 'c');
  const std::string torn = Body(100 << 10, 'd');
  ASSERT_TRUE(AppendFill("whole", whole, "{}").ok());
  ASSERT_TRUE(AppendFill("torn", torn, "{}").ok());
  const LogRecordInfo commit = log_->log().records().back();
  ASSERT_EQ(commit.op, MetaOp::kFill);
  const std::string log_file = log_->log().log_path();
  ASSERT_EQ(::truncate(log_file.c_str(), static_cast<off_t>(commit.log_offset + 10)), 0);
  Reopen();
  Apply(Status::Ok());
  FlushReport r = ReplayAll();
  ASSERT_EQ(applied_.size(), 1u);
  EXPECT_EQ(applied_[0].key, "whole");
  EXPECT_TRUE(applied_[0].body == whole);
  EXPECT_TRUE(log_->log().records().empty());
  // Serials of fill paths go on past the replayed ones: no path is reused.
  Result<std::string> next = AppendFill("whole", whole, "{}");
  ASSERT_TRUE(next.ok());
  EXPECT_GT(ParseFillPath(*next)->first, ParseFillPath(applied_[0].path)->first);
}

// A group is never split by a kFull flush: a fill that does not fit waits for the flush of what
// is there, then goes in whole.
TEST_F(LocalFlashLogFillTest, AFillThatDoesNotFitGoesWholeAfterAFullFlush) {
  const std::string a = Body(600 << 10, 'e');
  const std::string b = Body(600 << 10, 'f');
  Apply(Status::Ok());
  ASSERT_TRUE(AppendFill("a", a, "{}").ok());
  ASSERT_TRUE(AppendFill("b", b, "{}").ok());  // 1 MiB log: "a" is flushed first
  ASSERT_EQ(applied_.size(), 1u);
  EXPECT_TRUE(applied_[0].body == a);
  EXPECT_EQ(log_->log().stats().flushes[static_cast<std::size_t>(LogFlushReason::kFull)], 1u);
  FlushReport r = Flush();
  ASSERT_EQ(applied_.size(), 2u);
  EXPECT_TRUE(applied_[1].body == b);
  Result<std::string> huge = AppendFill("huge", Body(2 << 20, 'g'), "{}");
  EXPECT_FALSE(huge.ok());  // larger than the log: refused at once (the caller writes it to the disk)
}

}  // namespace
}  // namespace ghost
