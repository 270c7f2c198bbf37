#include "proxy/access_log.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

namespace ghost {
namespace {

using Clock = std::chrono::steady_clock;

class AccessLogTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::signal(SIGPIPE, SIG_IGN);  // as Proxy::Start does: a FIFO whose reader left is EPIPE
    char tmpl[] = "/tmp/ghostproxy-accesslog-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::system(("rm -rf " + dir_).c_str()); }

  static std::string Line(int i) {
    return "1764000000.000      1 127.0.0.1 HIT/200 512 GET http://o/" + std::to_string(i) +
           " - HIER_NONE/- application/octet-stream\n";
  }
  static std::string Slurp(const std::string& path) {
    std::ifstream f(path);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
  }
  // Reads what the FIFO holds until it stays empty for 200 ms.
  static std::string Drain(int fd) {
    std::string out;
    char buf[65536];
    auto quiet = Clock::now();
    while (Clock::now() - quiet < std::chrono::milliseconds(200)) {
      const ssize_t n = ::read(fd, buf, sizeof buf);
      if (n > 0) {
        out.append(buf, static_cast<std::size_t>(n));
        quiet = Clock::now();
      } else {
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
    }
    return out;
  }

  std::string dir_;
};

// A log that takes nothing (a FIFO open but never read) never holds up the caller: the lines
// past the queue are dropped and counted, and once the FIFO is read the kept ones arrive whole
// and in order.
TEST_F(AccessLogTest, ABlockedFileNeverBlocksAppendAndDropsPastTheQueue) {
  const std::string fifo = dir_ + "/log.fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const int rfd = ::open(fifo.c_str(), O_RDONLY | O_NONBLOCK);
  ASSERT_GE(rfd, 0);
  auto log = AccessLog::Open(fifo, 16 << 10, std::chrono::milliseconds(200));
  ASSERT_TRUE(log.ok()) << log.status().ToString();
  const int kLines = 20000;  // ~2 MB: 30 times the pipe's 64 KiB and the 16 KiB queue
  const auto t0 = Clock::now();
  int kept = 0;
  for (int i = 0; i < kLines; ++i) {
    kept += (*log)->Append(Line(i)) ? 1 : 0;
    if (i % 16 == 15) (*log)->Submit();
  }
  (*log)->Submit();
  EXPECT_LT(Clock::now() - t0, std::chrono::seconds(2));
  AccessLog::Counters c = (*log)->counters();
  EXPECT_EQ(c.lines_dropped, static_cast<std::uint64_t>(kLines - kept));
  EXPECT_GT(c.lines_dropped, 10000u);
  EXPECT_GT(c.queued_bytes, 0u);
  EXPECT_LE(c.queued_bytes, 16u << 10);

  std::string got = Drain(rfd);
  c = (*log)->counters();
  EXPECT_EQ(c.queued_bytes, 0u);
  EXPECT_EQ(c.lines_written, static_cast<std::uint64_t>(kept));
  EXPECT_EQ(c.lines_written + c.lines_dropped, static_cast<std::uint64_t>(kLines));
  // Whole lines, in the order appended (a dropped line leaves a gap, never half a line).
  std::istringstream in(got);
  std::string line;
  int n = 0, last = -1;
  while (std::getline(in, line)) {
    const std::size_t at = line.find("http://o/");
    ASSERT_NE(at, std::string::npos) << line;
    const int i = std::atoi(line.c_str() + at + 9);
    ASSERT_EQ(line + "\n", Line(i));
    ASSERT_GT(i, last);
    last = i;
    ++n;
  }
  EXPECT_EQ(n, kept);
  EXPECT_EQ(got.back(), '\n');
  log->reset();
  ::close(rfd);
}

// The destructor of a log whose file takes nothing returns after its wait, not never.
TEST_F(AccessLogTest, StoppingWhileTheFileTakesNothingReturns) {
  const std::string fifo = dir_ + "/log.fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const int rfd = ::open(fifo.c_str(), O_RDONLY | O_NONBLOCK);
  auto log = AccessLog::Open(fifo, 1 << 20, std::chrono::milliseconds(300));
  ASSERT_TRUE(log.ok());
  for (int i = 0; i < 5000; ++i) (*log)->Append(Line(i));
  (*log)->Submit();
  const auto t0 = Clock::now();
  log->reset();
  EXPECT_LT(Clock::now() - t0, std::chrono::seconds(2));
  ::close(rfd);  // the writer's blocked write then fails with EPIPE
}

// On a plain file every line is written by the stop; Reopen after a rename writes the lines
// before it to the old file and the later ones to a new file at the path.
TEST_F(AccessLogTest, EveryLineIsWrittenAndReopenFollowsARename) {
  const std::string path = dir_ + "/access.log";
  auto log = AccessLog::Open(path, 1 << 20);
  ASSERT_TRUE(log.ok());
  for (int i = 0; i < 3000; ++i) {
    ASSERT_TRUE((*log)->Append(Line(i)));
    if (i % 7 == 0) (*log)->Submit();
  }
  ASSERT_EQ(::rename(path.c_str(), (path + ".1").c_str()), 0);
  (*log)->Reopen();
  for (int i = 3000; i < 5000; ++i) ASSERT_TRUE((*log)->Append(Line(i)));
  log->reset();
  std::string before, after;
  for (int i = 0; i < 3000; ++i) before += Line(i);
  for (int i = 3000; i < 5000; ++i) after += Line(i);
  EXPECT_EQ(Slurp(path + ".1"), before);
  EXPECT_EQ(Slurp(path), after);
}

TEST_F(AccessLogTest, AFifoWithoutAReaderIsAnErrorNotAHang) {
  const std::string fifo = dir_ + "/lonely.fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  auto log = AccessLog::Open(fifo, 1 << 20);
  ASSERT_FALSE(log.ok());
  EXPECT_NE(log.status().message().find("cannot open access log"), std::string::npos);
  EXPECT_FALSE(AccessLog::Open(dir_ + "/no/such/dir/log", 1 << 20).ok());
}

}  // namespace
}  // namespace ghost
