#include "common/base/file_io.h"

#include <event2/event.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cerrno>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/base/uring_file_io.h"

namespace ghost {
namespace {

// The backends under test. The io_uring one gets a small ring and small entries, so a
// handful of requests fill the ring (exercising the waiting list) and a large transfer goes
// in pieces (exercising the resubmission of short transfers).
struct UringBackend {
  static Result<std::unique_ptr<FileIo>> Make(event_base* base) {
    Result<std::unique_ptr<UringFileIo>> io = UringFileIo::Create(base, 4, 64 * 1024);
    if (!io.ok()) return io.status();
    return std::unique_ptr<FileIo>(std::move(io).value());
  }
};

struct SyncBackend {
  static Result<std::unique_ptr<FileIo>> Make(event_base* base) {
    return std::unique_ptr<FileIo>(std::make_unique<SyncFileIo>(base));
  }
};

std::string RandomBytes(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::string s(n, '\0');
  for (char& c : s) c = static_cast<char>(rng());
  return s;
}

template <typename Backend>
class FileIoTest : public ::testing::Test {
 protected:
  void SetUp() override {
    base_ = event_base_new();
    ASSERT_NE(base_, nullptr);
    Result<std::unique_ptr<FileIo>> io = Backend::Make(base_);
    if (!io.ok()) {
      int err = io.status().ToErrno();
      if (err == ENOSYS || err == EPERM) {
        GTEST_SKIP() << "io_uring is unavailable on this machine (" << io.status().ToString()
                     << "); the daemon falls back to SyncFileIo";
      }
      FAIL() << io.status().ToString();
    }
    io_ = std::move(io).value();
    std::string tmpl = ::testing::TempDir() + "ghost_file_io_XXXXXX";
    fd_ = ::mkstemp(tmpl.data());
    ASSERT_GE(fd_, 0) << "mkstemp " << tmpl;
    ::unlink(tmpl.c_str());  // the open fd keeps the file for the test's duration
  }

  void TearDown() override {
    io_.reset();
    if (fd_ >= 0) ::close(fd_);
    if (base_ != nullptr) event_base_free(base_);
  }

  // Runs the loop until `done`, failing the test after 10 s without it.
  void RunUntil(const bool& done) {
    timed_out_ = false;
    event* watchdog = evtimer_new(base_, &FileIoTest::OnWatchdog, this);
    timeval tv{10, 0};
    evtimer_add(watchdog, &tv);
    while (!done && !timed_out_) event_base_loop(base_, EVLOOP_ONCE);
    event_free(watchdog);
    ASSERT_FALSE(timed_out_) << "the file I/O did not complete within 10 s";
  }
  static void OnWatchdog(int, short, void* arg) {
    auto* self = static_cast<FileIoTest*>(arg);
    self->timed_out_ = true;
    event_base_loopbreak(self->base_);
  }

  Result<std::size_t> WriteAndWait(FileIo& io, int fd, std::uint64_t offset, std::string data) {
    bool done = false;
    Result<std::size_t> result = Status::Internal("not run");
    io.Write(fd, offset, std::move(data), [&](Result<std::size_t> r) {
      result = std::move(r);
      done = true;
    });
    RunUntil(done);
    return result;
  }
  Result<std::size_t> ReadAndWait(FileIo& io, int fd, std::uint64_t offset, std::span<char> buf) {
    bool done = false;
    Result<std::size_t> result = Status::Internal("not run");
    io.Read(fd, offset, buf, [&](Result<std::size_t> r) {
      result = std::move(r);
      done = true;
    });
    RunUntil(done);
    return result;
  }
  Status FsyncAndWait(FileIo& io, int fd) {
    bool done = false;
    Status result = Status::Internal("not run");
    io.Fsync(fd, [&](Status st) {
      result = std::move(st);
      done = true;
    });
    RunUntil(done);
    return result;
  }

  event_base* base_ = nullptr;
  std::unique_ptr<FileIo> io_;
  int fd_ = -1;
  bool timed_out_ = false;
};

using Backends = ::testing::Types<UringBackend, SyncBackend>;
class BackendNames {
 public:
  template <typename T>
  static std::string GetName(int) {
    return std::is_same_v<T, UringBackend> ? "Uring" : "Sync";
  }
};
TYPED_TEST_SUITE(FileIoTest, Backends, BackendNames);

TYPED_TEST(FileIoTest, WriteFsyncReadRoundTrip) {
  FileIo& io = *this->io_;
  Result<std::size_t> w = this->WriteAndWait(io, this->fd_, 0, "hello, ghost");
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  EXPECT_EQ(*w, 12u);
  Status synced = this->FsyncAndWait(io, this->fd_);
  EXPECT_TRUE(synced.ok()) << synced.ToString();
  std::string buf(12, '\0');
  Result<std::size_t> r = this->ReadAndWait(io, this->fd_, 0, buf);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(*r, 12u);
  EXPECT_EQ(buf, "hello, ghost");
}

TYPED_TEST(FileIoTest, MultiMiBTransfersRoundTripByteIdentical) {
  FileIo& io = *this->io_;
  std::string data = RandomBytes(3 * 1024 * 1024 + 17, 7);
  Result<std::size_t> w = this->WriteAndWait(io, this->fd_, 4096, data);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  EXPECT_EQ(*w, data.size());
  std::string back(data.size(), '\0');
  Result<std::size_t> r = this->ReadAndWait(io, this->fd_, 4096, back);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(*r, data.size());
  EXPECT_TRUE(back == data) << "the bytes read back differ from the bytes written";
}

TYPED_TEST(FileIoTest, ReadIsShortAtEndOfFileAndEmptyPastIt) {
  FileIo& io = *this->io_;
  ASSERT_TRUE(this->WriteAndWait(io, this->fd_, 0, std::string(100, 'x')).ok());
  std::string buf(4096, '\0');
  Result<std::size_t> r = this->ReadAndWait(io, this->fd_, 40, buf);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(*r, 60u);
  EXPECT_EQ(buf.substr(0, 60), std::string(60, 'x'));
  r = this->ReadAndWait(io, this->fd_, 100, buf);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, 0u);
  r = this->ReadAndWait(io, this->fd_, 1 << 20, buf);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, 0u);
}

TYPED_TEST(FileIoTest, BadFdBecomesAStatusNamingTheCall) {
  FileIo& io = *this->io_;
  int closed_fd = ::dup(this->fd_);
  ASSERT_GE(closed_fd, 0);
  ::close(closed_fd);
  std::string buf(16, '\0');
  Result<std::size_t> r = this->ReadAndWait(io, closed_fd, 0, buf);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().ToErrno(), EBADF);
  EXPECT_NE(r.status().message().find("read of 16 bytes at offset 0 of fd"), std::string::npos)
      << r.status().ToString();

  Result<std::size_t> w = this->WriteAndWait(io, closed_fd, 0, "data");
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.status().ToErrno(), EBADF);
  Status s = this->FsyncAndWait(io, closed_fd);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.ToErrno(), EBADF);
}

TYPED_TEST(FileIoTest, WriteToAReadOnlyFdFails) {
  FileIo& io = *this->io_;
  std::string path = "/proc/self/fd/" + std::to_string(this->fd_);
  int ro = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(ro, 0);
  Result<std::size_t> w = this->WriteAndWait(io, ro, 0, "data");
  ::close(ro);
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.status().ToErrno(), EBADF);
}

TYPED_TEST(FileIoTest, DoneNeverRunsInsideTheSubmittingCall) {
  FileIo& io = *this->io_;
  bool returned = false;
  bool ran_inside = false;
  int completed = 0;
  bool all = false;
  auto check = [&] {
    if (!returned) ran_inside = true;
    all = ++completed == 4;
  };
  std::string buf(4, '\0');
  io.Write(this->fd_, 0, "abcd", [&](Result<std::size_t>) { check(); });
  io.Read(this->fd_, 0, buf, [&](Result<std::size_t>) { check(); });
  io.Read(-1, 0, buf, [&](Result<std::size_t>) { check(); });  // fails at once, still later
  io.Fsync(this->fd_, [&](Status) { check(); });
  returned = true;
  this->RunUntil(all);
  EXPECT_FALSE(ran_inside);
}

TYPED_TEST(FileIoTest, ManyConcurrentRequestsAllComplete) {
  // More requests than the io_uring test ring has entries: the rest wait their turn.
  FileIo& io = *this->io_;
  constexpr int kBlocks = 64;
  constexpr std::size_t kBlock = 4096;
  int done = 0;
  int failed = 0;
  bool all_written = false;
  for (int i = 0; i < kBlocks; ++i) {
    io.Write(this->fd_, i * kBlock, std::string(kBlock, static_cast<char>('A' + i % 26)),
             [&](Result<std::size_t> r) {
               if (!r.ok() || *r != kBlock) ++failed;
               all_written = ++done == kBlocks;
             });
  }
  this->RunUntil(all_written);
  EXPECT_EQ(done, kBlocks);
  EXPECT_EQ(failed, 0);
  std::vector<std::string> bufs(kBlocks, std::string(kBlock, '\0'));
  int read_done = 0;
  bool reads_ok = true;
  bool all_read = false;
  for (int i = 0; i < kBlocks; ++i) {
    io.Read(this->fd_, i * kBlock, bufs[i], [&](Result<std::size_t> r) {
      if (!r.ok() || *r != kBlock) reads_ok = false;
      all_read = ++read_done == kBlocks;
    });
  }
  this->RunUntil(all_read);
  EXPECT_TRUE(reads_ok);
  for (int i = 0; i < kBlocks; ++i) {
    EXPECT_EQ(bufs[i], std::string(kBlock, static_cast<char>('A' + i % 26))) << "block " << i;
  }
}

TYPED_TEST(FileIoTest, IdleBackendLeavesNothingArmedOnTheLoop) {
  // Push, never poll: with no request outstanding, the backend keeps no event on the loop
  // (an idle daemon makes zero wake-ups).
  FileIo& io = *this->io_;
  ASSERT_TRUE(this->WriteAndWait(io, this->fd_, 0, "x").ok());
  EXPECT_EQ(event_base_get_num_events(this->base_, EVENT_BASE_COUNT_ADDED), 0);
  EXPECT_EQ(event_base_get_num_events(this->base_, EVENT_BASE_COUNT_ACTIVE), 0);
  // And the loop, run now, returns at once for want of events.
  EXPECT_EQ(event_base_loop(this->base_, EVLOOP_NONBLOCK), 1);
}

TYPED_TEST(FileIoTest, FaultyFileIoFailsExactlyTheNthCall) {
  FaultyFileIo faulty(*this->io_);
  faulty.FailNthCall(3, EIO);
  std::vector<Result<std::size_t>> results;
  for (int i = 0; i < 5; ++i) {
    results.push_back(this->WriteAndWait(faulty, this->fd_, i * 10, std::string(10, 'a' + i)));
  }
  ASSERT_EQ(results.size(), 5u);
  for (int i = 0; i < 5; ++i) {
    if (i == 2) {
      ASSERT_FALSE(results[i].ok());
      EXPECT_EQ(results[i].status().ToErrno(), EIO);
      EXPECT_NE(results[i].status().message().find("injected"), std::string::npos);
    } else {
      EXPECT_TRUE(results[i].ok()) << "call " << i + 1 << ": " << results[i].status().ToString();
    }
  }
  EXPECT_EQ(faulty.calls(), 5u);
  EXPECT_EQ(faulty.failures(), 1u);
  // The failed write wrote nothing: its bytes are a hole between its neighbours.
  std::string buf(50, '\0');
  Result<std::size_t> r = this->ReadAndWait(*this->io_, this->fd_, 0, buf);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(buf, std::string(10, 'a') + std::string(10, 'b') + std::string(10, '\0') +
                     std::string(10, 'd') + std::string(10, 'e'));
}

TYPED_TEST(FileIoTest, FaultyFileIoFailsEveryCallMatchingAPredicateUntilHealed) {
  FaultyFileIo faulty(*this->io_);
  faulty.FailWhen([](const FileCall& c) { return c.op == FileOp::kWrite && c.offset >= 100; },
                  ENOSPC);
  EXPECT_TRUE(this->WriteAndWait(faulty, this->fd_, 0, "ok").ok());
  Result<std::size_t> w = this->WriteAndWait(faulty, this->fd_, 100, "full");
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.status().ToErrno(), ENOSPC);
  EXPECT_FALSE(this->WriteAndWait(faulty, this->fd_, 200, "full").ok());
  EXPECT_TRUE(this->FsyncAndWait(faulty, this->fd_).ok());
  faulty.Heal();
  EXPECT_TRUE(this->WriteAndWait(faulty, this->fd_, 300, "fine").ok());
  EXPECT_EQ(faulty.failures(), 2u);
  EXPECT_EQ(faulty.calls(), 5u);
}

TYPED_TEST(FileIoTest, FaultyFileIoDeliversFailuresOnTheLoop) {
  FaultyFileIo faulty(*this->io_);
  faulty.FailWhen([](const FileCall&) { return true; }, EIO);
  bool returned = false;
  bool ran_inside = false;
  bool done = false;
  faulty.Fsync(this->fd_, [&](Status st) {
    ran_inside = !returned;
    EXPECT_EQ(st.ToErrno(), EIO);
    done = true;
  });
  returned = true;
  this->RunUntil(done);
  EXPECT_FALSE(ran_inside);
}

// Syncfs (the flash log's flush makes its name changes durable with it) completes on the loop
// on every backend, and FaultyFileIo can fail it like any other call (FileOp::kSyncfs).
TYPED_TEST(FileIoTest, SyncfsCompletesOnTheLoopAndFaultyFileIoCanFailIt) {
  FileIo& io = *this->io_;
  bool returned = false;
  bool ran_inside = false;
  bool done = false;
  Status result = Status::Internal("not run");
  io.Syncfs(this->fd_, [&](Status st) {
    ran_inside = !returned;
    result = std::move(st);
    done = true;
  });
  returned = true;
  this->RunUntil(done);
  EXPECT_FALSE(ran_inside);
  EXPECT_TRUE(result.ok()) << result.ToString();
  FaultyFileIo faulty(io);
  faulty.FailWhen([](const FileCall& c) { return c.op == FileOp::kSyncfs; }, EIO);
  EXPECT_TRUE(this->FsyncAndWait(faulty, this->fd_).ok());  // other calls pass
  done = false;
  faulty.Syncfs(this->fd_, [&](Status st) {
    result = std::move(st);
    done = true;
  });
  this->RunUntil(done);
  EXPECT_EQ(result.ToErrno(), EIO);
  EXPECT_NE(result.message().find("syncfs of fd"), std::string::npos) << result.ToString();
  EXPECT_EQ(faulty.failures(), 1u);
}

}  // namespace
}  // namespace ghost
