#include "common/base/log.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

namespace ghost {
namespace {

class LogTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/ghost-log-test-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    path_ = dir_ + "/ghost.log";
  }
  void TearDown() override {
    // Back to the unconfigured sink for the other tests of this binary.
    LogOptions o;
    o.level = LogLevel::kWarn;
    ASSERT_TRUE(ConfigureLog(o).ok());
    std::remove(path_.c_str());
    ::rmdir(dir_.c_str());
  }
  std::string Contents() const {
    std::ifstream f(path_);
    std::stringstream s;
    s << f.rdbuf();
    return s.str();
  }
  std::string dir_, path_;
};

TEST_F(LogTest, ParsesTheFourLevelsAndRefusesOthers) {
  EXPECT_EQ(*ParseLogLevel("error"), LogLevel::kError);
  EXPECT_EQ(*ParseLogLevel("warn"), LogLevel::kWarn);
  EXPECT_EQ(*ParseLogLevel("warning"), LogLevel::kWarn);
  EXPECT_EQ(*ParseLogLevel("info"), LogLevel::kInfo);
  EXPECT_EQ(*ParseLogLevel("debug"), LogLevel::kDebug);
  Result<LogLevel> bad = ParseLogLevel("loud");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("error, warn, info, debug"), std::string::npos);
}

TEST_F(LogTest, ChoosesFileThenSyslogWhenDaemonisedThenStderr) {
  EXPECT_EQ(ChooseLogOptions("ghostfs", "/x.log", "", false, true)->sink, LogSink::kFile);
  EXPECT_EQ(ChooseLogOptions("ghostfs", "", "", false, true)->sink, LogSink::kSyslog);
  EXPECT_EQ(ChooseLogOptions("ghostfs", "", "", false, false)->sink, LogSink::kStderr);
  EXPECT_EQ(ChooseLogOptions("ghostfs", "", "", false, false)->level, LogLevel::kInfo);
  EXPECT_EQ(ChooseLogOptions("ghostfs", "", "", true, false)->level, LogLevel::kDebug);
  // A level given wins over -v.
  EXPECT_EQ(ChooseLogOptions("ghostfs", "", "warn", true, false)->level, LogLevel::kWarn);
  EXPECT_FALSE(ChooseLogOptions("ghostfs", "", "chatty", false, false).ok());
}

TEST_F(LogTest, WritesTimestampedLinesAtOrAboveTheLevelToTheFile) {
  LogOptions o;
  o.program = "ghostfs";
  o.level = LogLevel::kInfo;
  o.sink = LogSink::kFile;
  o.file = path_;
  ASSERT_TRUE(ConfigureLog(o).ok());
  Log(LogLevel::kInfo, "origin %s up again", "web");
  Log(LogLevel::kDebug, "not shown");
  Log(LogLevel::kError, "origin %s down", "web");
  std::string text = Contents();
  EXPECT_NE(text.find("ghostfs[" + std::to_string(::getpid()) + "] info: origin web up again\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("error: origin web down\n"), std::string::npos) << text;
  EXPECT_EQ(text.find("not shown"), std::string::npos) << text;
  // ISO 8601 UTC time first: 2026-11-25T15:02:11Z.
  ASSERT_GE(text.size(), 21u);
  EXPECT_EQ(text[4], '-');
  EXPECT_EQ(text[10], 'T');
  EXPECT_EQ(text[19], 'Z');
  EXPECT_FALSE(LogEnabled(LogLevel::kDebug));
  EXPECT_TRUE(LogEnabled(LogLevel::kWarn));
}

TEST_F(LogTest, AnUnwritableLogFileIsAnErrorNamingIt) {
  LogOptions o;
  o.sink = LogSink::kFile;
  o.file = dir_ + "/no/such/dir/ghost.log";
  Status s = ConfigureLog(o);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find(o.file), std::string::npos) << s.ToString();
}

}  // namespace
}  // namespace ghost
