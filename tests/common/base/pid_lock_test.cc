#include "common/base/pid_lock.h"

#include <gtest/gtest.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>

namespace ghost {
namespace {

class PidLockTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char dir[] = "/tmp/ghost-pidlock-XXXXXX";
    ASSERT_NE(::mkdtemp(dir), nullptr);
    dir_ = dir;
    path_ = dir_ + "/lock";
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string dir_, path_;
};

TEST_F(PidLockTest, SecondHolderIsRefusedWithTheFirstHoldersPid) {
  Result<PidLock> first = PidLock::Acquire(path_);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  EXPECT_EQ(PidLock::ReadPid(path_), ::getpid());
  Result<PidLock> second = PidLock::Acquire(path_);  // a new open file description
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), Status::Code::kExists);
  EXPECT_NE(second.status().message().find("pid " + std::to_string(::getpid())), std::string::npos)
      << second.status().message();
}

TEST_F(PidLockTest, ReleasedWhenTheHolderIsDestroyed) {
  { Result<PidLock> first = PidLock::Acquire(path_);
    ASSERT_TRUE(first.ok()); }
  EXPECT_TRUE(PidLock::Acquire(path_).ok());
}

TEST_F(PidLockTest, ChildKeepsTheLockAfterTheParentLetsGoAndRecordsItsPid) {
  // As ghostfs daemonises: the parent takes the lock, forks, and exits; the child serves.
  // (A subreaper, so the orphaned child is ours to wait for.)
  ASSERT_EQ(::prctl(PR_SET_CHILD_SUBREAPER, 1), 0);
  int ready[2], done[2];
  ASSERT_EQ(::pipe(ready), 0);
  ASSERT_EQ(::pipe(done), 0);
  pid_t holder = ::fork();
  ASSERT_GE(holder, 0);
  if (holder == 0) {
    Result<PidLock> lock = PidLock::Acquire(path_);
    if (!lock.ok()) ::_exit(1);
    pid_t child = ::fork();
    if (child == 0) {
      if (!lock->RecordPid().ok()) ::_exit(1);
      char c = 'r';
      (void)!::write(ready[1], &c, 1);
      (void)!::read(done[0], &c, 1);  // serve until the test says stop
      ::_exit(0);
    }
    ::_exit(0);  // the parent leaves at once, as fuse_daemonize's does
  }
  int st = 0;
  ASSERT_EQ(::waitpid(holder, &st, 0), holder);
  ASSERT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  char c = 0;
  ASSERT_EQ(::read(ready[0], &c, 1), 1);
  std::optional<pid_t> serving = PidLock::ReadPid(path_);
  ASSERT_TRUE(serving.has_value());
  EXPECT_NE(*serving, holder);
  Result<PidLock> mine = PidLock::Acquire(path_);
  ASSERT_FALSE(mine.ok());
  EXPECT_NE(mine.status().message().find("pid " + std::to_string(*serving)), std::string::npos);
  ASSERT_EQ(::write(done[1], "x", 1), 1);
  ASSERT_EQ(::waitpid(*serving, &st, 0), *serving);  // its exit releases the lock
  EXPECT_TRUE(PidLock::Acquire(path_).ok());
  for (int fd : {ready[0], ready[1], done[0], done[1]}) ::close(fd);
}

TEST_F(PidLockTest, LockFileInAMissingDirectoryIsAnError) {
  Result<PidLock> lock = PidLock::Acquire(dir_ + "/no/such/lock");
  ASSERT_FALSE(lock.ok());
  EXPECT_NE(lock.status().message().find(dir_ + "/no/such/lock"), std::string::npos);
}

}  // namespace
}  // namespace ghost
