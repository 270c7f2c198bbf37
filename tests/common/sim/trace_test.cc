#include "common/sim/trace.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

namespace ghost {
namespace {

class TraceTest : public ::testing::Test {
 protected:
  static Result<Trace> Parse(const std::string& text, const std::string& name = "t.trace") {
    std::istringstream in(text);
    return ParseTrace(in, name);
  }

  // Expects `text` to fail on `line` with a message naming the file and line and containing
  // `fragment`.
  static void ExpectError(const std::string& text, int line, const std::string& fragment) {
    Result<Trace> r = Parse(text, "bad.trace");
    ASSERT_FALSE(r.ok()) << "accepted:\n" << text;
    EXPECT_EQ(r.status().code(), Status::Code::kInvalidArgument);
    const std::string msg = r.status().message();
    EXPECT_EQ(msg.rfind("bad.trace:" + std::to_string(line) + ": ", 0), 0u) << msg;
    EXPECT_NE(msg.find(fragment), std::string::npos) << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    EXPECT_EQ(msg.back(), ')') << "no (what was expected) part: " << msg;
  }

  static std::string Write(const Trace& t) {
    std::ostringstream out;
    WriteTrace(t, out);
    return out.str();
  }
};

constexpr const char* kWebHeader = "# ghost-trace web v1\n";
constexpr const char* kMailHeader = "# ghost-trace mail v1\n";
constexpr const char* kBlockHeader = "# ghost-trace block v1\n";

TEST_F(TraceTest, ParsesEveryFieldOfAWebTrace) {
  Result<Trace> r = Parse(std::string(kWebHeader) +
                          "0 GET http://origin.test/a.html 1234 1\n"
                          "1.5 GET https://origin.test:8443/b.png?x=1 0 0\n");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->kind, TraceKind::kWeb);
  EXPECT_EQ(r->name, "t.trace");
  ASSERT_EQ(r->web.size(), 2u);
  EXPECT_EQ(r->web[0], (WebRequest{TimePoint{}, "http://origin.test/a.html", 1234, true}));
  EXPECT_EQ(r->web[1],
            (WebRequest{TimePoint(Millis(1500)), "https://origin.test:8443/b.png?x=1", 0, false}));
  EXPECT_TRUE(r->mail.empty());
  EXPECT_TRUE(r->block.empty());
}

TEST_F(TraceTest, ParsesReadsAndSendsOfAMailTrace) {
  Result<Trace> r = Parse(std::string(kMailHeader) +
                          "2.25 READ INBOX 4021 5120\n"
                          "30 SEND Sent - 900\n");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->mail.size(), 2u);
  EXPECT_EQ(r->mail[0],
            (MailEvent{TimePoint(Millis(2250)), MailEvent::Op::kRead, "INBOX", 4021, 5120}));
  EXPECT_EQ(r->mail[1], (MailEvent{TimePoint(Seconds(30)), MailEvent::Op::kSend, "Sent", 0, 900}));
}

TEST_F(TraceTest, ParsesReadsAndWritesOfABlockTrace) {
  Result<Trace> r = Parse(std::string(kBlockHeader) +
                          "0.001 R 0 8\n"
                          "0.002 W 18446744073 256\n");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->block.size(), 2u);
  EXPECT_EQ(r->block[0], (BlockEvent{TimePoint(Millis(1)), false, 0, 8}));
  EXPECT_EQ(r->block[1], (BlockEvent{TimePoint(Millis(2)), true, 18446744073u, 256}));
}

TEST_F(TraceTest, HeaderOnlyIsAValidEmptyTrace) {
  for (const char* header : {kWebHeader, kMailHeader, kBlockHeader}) {
    Result<Trace> r = Parse(header);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_TRUE(r->web.empty() && r->mail.empty() && r->block.empty());
  }
  EXPECT_TRUE(Parse("# ghost-trace web v1").ok()) << "no final newline";
}

TEST_F(TraceTest, CommentsBlankLinesAndCrlfAreIgnored) {
  Result<Trace> r = Parse(
      "\n   \n# ghost-trace web v1   # the header may carry a comment\r\n"
      "# a whole-line comment\n"
      "\n\t \n"
      "1 GET http://o.test/x 10 0 # a comment after the fields\r\n"
      "\t2\tGET\thttp://o.test/y\t20\t1\t\n"
      "#3 GET http://o.test/z 30 0\n");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->web.size(), 2u);
  EXPECT_EQ(r->web[0].url, "http://o.test/x");
  EXPECT_EQ(r->web[1].size, 20u);
  EXPECT_TRUE(r->web[1].cached);
}

TEST_F(TraceTest, EqualTimesAreAllowed) {
  EXPECT_TRUE(Parse(std::string(kBlockHeader) + "1 R 0 8\n1 W 8 8\n1.000000 R 16 8\n").ok());
}

TEST_F(TraceTest, MissingHeaderNamesFileAndLine) {
  ExpectError("\n0 GET http://o.test/x 1 0\n", 2, "missing header");
  ExpectError("# just a comment\n# ghost-trace web v1\n", 1, "missing header");
  ExpectError("ghost-trace web v1\n", 1, "missing header");
}

TEST_F(TraceTest, EmptyInputIsMissingItsHeader) {
  ExpectError("", 1, "empty");
  ExpectError("\n\n  \n", 3, "empty");
}

TEST_F(TraceTest, UnknownKindOrVersionIsRejected) {
  ExpectError("# ghost-trace video v1\n", 1, "unknown trace kind \"video\"");
  ExpectError("# ghost-trace web v2\n", 1, "unsupported version \"v2\"");
  ExpectError("# ghost-trace web\n", 1, "incomplete header");
  ExpectError("# ghost-trace web v1 extra\n", 1, "trailing garbage \"extra\"");
  ExpectError("# ghost-trace WEB v1\n", 1, "unknown trace kind");
}

TEST_F(TraceTest, NegativeTimeNamesFileAndLine) {
  ExpectError(std::string(kWebHeader) + "0 GET http://o.test/a 1 0\n-1 GET http://o.test/a 1 0\n",
              3, "time \"-1\" is negative");
}

TEST_F(TraceTest, NonMonotonicTimeNamesFileAndLine) {
  ExpectError(std::string(kMailHeader) +
                  "1 READ INBOX 1 10\n"
                  "# comment\n"
                  "5.5 READ INBOX 2 10\n"
                  "5.499 READ INBOX 3 10\n",
              5, "before the previous event's time 5.500 on line 4");
}

TEST_F(TraceTest, NanAndInfiniteTimesAreRejected) {
  for (const char* t : {"nan", "inf", "-inf", "NaN", "infinity"}) {
    ExpectError(std::string(kBlockHeader) + t + " R 0 8\n", 2, "is not a finite number");
  }
  ExpectError(std::string(kBlockHeader) + "1e400 R 0 8\n", 2, "out of range");
  ExpectError(std::string(kBlockHeader) + "1e10 R 0 8\n", 2, "too large");
}

TEST_F(TraceTest, TimeMustBeAWholeDecimalNumber) {
  for (const char* t : {"1s", "0x10", "+1", "1,5", "1..2", "--1", "."}) {
    ExpectError(std::string(kBlockHeader) + t + " R 0 8\n", 2, "is not a number of seconds");
  }
}

TEST_F(TraceTest, NonNumericSizeNamesFileAndLine) {
  std::string text = std::string(kWebHeader);
  for (int i = 0; i < 10; ++i)
    text += std::to_string(i) + " GET http://o.test/" + std::to_string(i) + " 1 0\n";
  ExpectError(text + "11 GET http://o.test/big 12k 0\n", 12,
              "size \"12k\" is not a number of bytes");
  ExpectError(std::string(kWebHeader) + "0 GET http://o.test/a 1.5 0\n", 2,
              "not a number of bytes");
  ExpectError(std::string(kWebHeader) + "0 GET http://o.test/a +5 0\n", 2, "not a number of bytes");
  ExpectError(std::string(kMailHeader) + "0 READ INBOX 1 lots\n", 2, "not a number of bytes");
}

TEST_F(TraceTest, NegativeOrHugeSizeIsRejected) {
  ExpectError(std::string(kWebHeader) + "0 GET http://o.test/a -5 0\n", 2,
              "size \"-5\" is negative");
  ExpectError(std::string(kMailHeader) + "0 SEND Sent - -1\n", 2, "is negative");
  ExpectError(std::string(kWebHeader) + "0 GET http://o.test/a 99999999999999999999999 0\n", 2,
              "too large");
}

TEST_F(TraceTest, UrlMustBeAbsoluteHttpOrHttps) {
  for (const char* url : {"/index.html", "origin.test/a", "ftp://o.test/a", "http:/o.test",
                          "http://", "http:///path", "http://:80/", "mailto:x@y",
                          "http://o.test:99999/", "http://[::1/", "http://h\xC3\xA9.test/"}) {
    SCOPED_TRACE(url);
    ExpectError(std::string(kWebHeader) + "0 GET " + url + " 1 0\n", 2, "url ");
  }
  EXPECT_TRUE(Parse(std::string(kWebHeader) + "0 GET HTTPS://[::1]:8080/a 1 0\n").ok());
  EXPECT_TRUE(Parse(std::string(kWebHeader) + "0 GET http://user@o.test 1 0\n").ok());
}

TEST_F(TraceTest, CachedFlagMustBeZeroOrOne) {
  for (const char* flag : {"2", "yes", "true", "01", "-1"}) {
    ExpectError(std::string(kWebHeader) + "0 GET http://o.test/a 1 " + flag + "\n", 2,
                "cached flag");
  }
}

TEST_F(TraceTest, CachedFlagMustAgreeForEveryRequestOfAUrl) {
  ExpectError(std::string(kWebHeader) +
                  "0 GET http://o.test/a 1 1\n1 GET http://o.test/b 1 0\n"
                  "2 GET http://o.test/a 1 0\n",
              4, "contradicts line 2");
}

TEST_F(TraceTest, WrongFieldCountNamesFileAndLine) {
  ExpectError(std::string(kWebHeader) + "0 GET http://o.test/a 1\n", 2, "too few fields: found 4");
  ExpectError(std::string(kWebHeader) + "0\n", 2, "too few fields");
  ExpectError(std::string(kMailHeader) + "0 READ INBOX 7\n", 2, "too few fields");
  ExpectError(std::string(kBlockHeader) + "0 R 8\n", 2, "too few fields");
}

TEST_F(TraceTest, TrailingGarbageIsRejected) {
  ExpectError(std::string(kWebHeader) + "0 GET http://o.test/a 1 0 junk\n", 2,
              "trailing garbage \"junk\"");
  ExpectError(std::string(kMailHeader) + "0 SEND Sent - 10 10\n", 2, "trailing garbage");
  ExpectError(std::string(kBlockHeader) + "0 R 0 8 x\n", 2, "trailing garbage");
}

TEST_F(TraceTest, UnknownOperationIsRejected) {
  ExpectError(std::string(kWebHeader) + "0 PUT http://o.test/a 1 0\n", 2,
              "unknown operation \"PUT\"");
  ExpectError(std::string(kWebHeader) + "0 get http://o.test/a 1 0\n", 2, "unknown operation");
  ExpectError(std::string(kMailHeader) + "0 DELETE INBOX 1 10\n", 2, "unknown operation");
  ExpectError(std::string(kBlockHeader) + "0 X 0 8\n", 2, "expected R or W");
  ExpectError(std::string(kBlockHeader) + "0 RW 0 8\n", 2, "unknown operation");
  ExpectError(std::string(kBlockHeader) + "0 r 0 8\n", 2, "unknown operation");
}

TEST_F(TraceTest, ReadNeedsAPositiveIntegerUid) {
  for (const char* uid : {"0", "-", "-3", "abc", "1.0", "4294967296"}) {
    SCOPED_TRACE(uid);
    ExpectError(std::string(kMailHeader) + "0 READ INBOX " + uid + " 10\n", 2, "uid");
  }
  EXPECT_TRUE(Parse(std::string(kMailHeader) + "0 READ INBOX 4294967295 10\n").ok());
}

TEST_F(TraceTest, SendNeedsADashAsUid) {
  ExpectError(std::string(kMailHeader) + "0 SEND Sent 17 10\n", 2, "SEND has uid \"17\"");
  ExpectError(std::string(kMailHeader) + "0 SEND Sent 0 10\n", 2, "write \"-\"");
}

TEST_F(TraceTest, SectorAndSectorsMustBeIntegers) {
  ExpectError(std::string(kBlockHeader) + "0 R 1.5 8\n", 2, "sector \"1.5\"");
  ExpectError(std::string(kBlockHeader) + "0 R -1 8\n", 2, "sector \"-1\"");
  ExpectError(std::string(kBlockHeader) + "0 R 0 eight\n", 2, "sectors \"eight\"");
  ExpectError(std::string(kBlockHeader) + "0 R 0 0\n", 2, "sectors \"0\" is not a positive");
  ExpectError(std::string(kBlockHeader) + "0 W 0 4294967296\n", 2, "too large");
  ExpectError(std::string(kBlockHeader) + "0 W 36028797018963967 2\n", 2, "runs past");
}

TEST_F(TraceTest, ControlCharactersAreRejected) {
  ExpectError(std::string(kMailHeader) +
                  "0 READ IN\x01"
                  "BOX 1 10\n",
              2, "control character 0x01");
  ExpectError(std::string(kMailHeader) + "0 READ INBOX 1 10\r\r\n", 2, "control character 0x0d");
  ExpectError(std::string(kMailHeader) + std::string("0 READ INBOX 1 1\0 0\n", 19), 2,
              "control character 0x00");
}

TEST_F(TraceTest, ErrorMessagesStayShortForLongTokens) {
  Result<Trace> r = Parse(std::string(kWebHeader) + "0 GET http://o.test/a " +
                          std::string(100000, '9') + "x 0\n");
  ASSERT_FALSE(r.ok());
  EXPECT_LT(r.status().message().size(), 300u);
}

TEST_F(TraceTest, WriteThenParseGivesTheSameEvents) {
  Trace web{TraceKind::kWeb, "w", {}, {}, {}};
  web.web = {{TimePoint{}, "http://o.test/a.html", 0, true},
             {TimePoint(Duration(1)), "https://o.test/b.js", 123456789, false},
             {TimePoint(Duration(1'234'567'891)), "http://o.test/a.html", 1, true}};
  Trace mail{TraceKind::kMail, "m", {}, {}, {}};
  mail.mail = {{TimePoint(Millis(1)), MailEvent::Op::kRead, "INBOX", 4294967295u, 3},
               {TimePoint(Seconds(900)), MailEvent::Op::kSend, "Sent", 0, 0}};
  Trace block{TraceKind::kBlock, "b", {}, {}, {}};
  block.block = {{TimePoint(Duration(999'999)), true, 36028797018963967u, 1},
                 {TimePoint(Duration(1'000'000)), false, 0, 4294967295u}};
  for (const Trace* t : {&web, &mail, &block}) {
    std::string text = Write(*t);
    Result<Trace> back = Parse(text);
    ASSERT_TRUE(back.ok()) << back.status().ToString() << "\n" << text;
    EXPECT_EQ(back->kind, t->kind);
    EXPECT_EQ(back->web, t->web);
    EXPECT_EQ(back->mail, t->mail);
    EXPECT_EQ(back->block, t->block);
    EXPECT_EQ(Write(*back), text);
  }
}

TEST_F(TraceTest, WritesMillisecondTimesWithThreeDecimalsAndOthersWithSix) {
  Trace t{TraceKind::kBlock, "b", {}, {}, {}};
  t.block = {{TimePoint(Millis(1500)), false, 0, 8}, {TimePoint(Duration(1'500'001)), true, 8, 8}};
  EXPECT_EQ(Write(t), "# ghost-trace block v1\n1.500 R 0 8\n1.500001 W 8 8\n");
}

TEST_F(TraceTest, WriteAddsTheCommentAfterTheHeader) {
  Trace t{TraceKind::kMail, "m", {}, {}, {}};
  t.mail = {{TimePoint{}, MailEvent::Op::kSend, "Sent", 0, 5}};
  std::ostringstream out;
  WriteTrace(t, out, "generated by: x\nsecond line");
  EXPECT_EQ(out.str(),
            "# ghost-trace mail v1\n# generated by: x\n# second line\n0.000 SEND Sent - 5\n");
  Result<Trace> back = Parse(out.str());
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->mail, t.mail);
}

TEST_F(TraceTest, SummaryCountsEventsObjectsAndBytes) {
  Result<Trace> web = Parse(std::string(kWebHeader) +
                            "0 GET http://o.test/a 100 1\n"
                            "5 GET http://o.test/b 50 0\n"
                            "9.5 GET http://o.test/a 100 1\n");
  ASSERT_TRUE(web.ok());
  TraceSummary s = SummarizeTrace(*web);
  EXPECT_EQ(s.events, 3u);
  EXPECT_EQ(s.unique_objects, 2u);
  EXPECT_EQ(s.cached_objects, 1u);
  EXPECT_EQ(s.bytes, 250u);
  EXPECT_EQ(s.duration, Millis(9500));

  Result<Trace> block = Parse(std::string(kBlockHeader) + "0 R 0 8\n1 W 4 8\n2 R 100 1\n");
  ASSERT_TRUE(block.ok());
  s = SummarizeTrace(*block);
  EXPECT_EQ(s.unique_objects, 13u) << "sectors 0-11 and 100";
  EXPECT_EQ(s.reads, 2u);
  EXPECT_EQ(s.writes, 1u);
  EXPECT_EQ(s.bytes, 17u * kSectorSize);

  Result<Trace> mail =
      Parse(std::string(kMailHeader) + "0 READ INBOX 1 10\n1 READ INBOX 1 10\n2 SEND Sent - 5\n");
  ASSERT_TRUE(mail.ok());
  s = SummarizeTrace(*mail);
  EXPECT_EQ(s.unique_objects, 2u);
  EXPECT_EQ(s.bytes, 25u);
}

TEST_F(TraceTest, LoadTraceNamesThePathInErrors) {
  const std::string dir = ::testing::TempDir();
  const std::string path = dir + "/trace_test_" + std::to_string(::getpid()) + ".trace";
  {
    std::ofstream out(path);
    out << "# ghost-trace web v1\n0 GET relative/url 1 0\n";
  }
  Result<Trace> r = LoadTrace(path);
  std::filesystem::remove(path);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message().rfind(path + ":2: url \"relative/url\"", 0), 0u)
      << r.status().message();
}

TEST_F(TraceTest, LoadTraceReportsAMissingFile) {
  Result<Trace> r = LoadTrace("/nonexistent/ghost/web.trace");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Status::Code::kNotFound);
  EXPECT_NE(r.status().message().find("/nonexistent/ghost/web.trace"), std::string::npos);
}

TEST_F(TraceTest, LoadTraceRejectsADirectory) {
  Result<Trace> r = LoadTrace(::testing::TempDir());
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("is a directory"), std::string::npos);
}

// Mutations of valid traces and random bytes: the parser must answer, never crash, and every
// failure must name the input and a line.
TEST_F(TraceTest, NeverCrashesOnMangledInput) {
  const std::string seeds[] = {
      std::string(kWebHeader) + "0 GET http://o.test/a.html 1234 1\n1.5 GET https://o.test/b 9 0\n",
      std::string(kMailHeader) + "0 READ INBOX 7 100\n3 SEND Sent - 50\n",
      std::string(kBlockHeader) + "0 R 0 8\n0.01 W 4096 16\n",
  };
  const std::string alphabet = "0123456789 .-#\t\n\r:/abcxyzRWGETSNDAhttp\x01\xff";
  std::mt19937_64 gen(12345);
  int accepted = 0;
  for (int i = 0; i < 20000; ++i) {
    std::string text = seeds[gen() % 3];
    const int edits = 1 + static_cast<int>(gen() % 4);
    for (int e = 0; e < edits && !text.empty(); ++e) {
      const std::size_t pos = gen() % text.size();
      const char c = alphabet[gen() % alphabet.size()];
      switch (gen() % 3) {
        case 0:
          text[pos] = c;
          break;
        case 1:
          text.insert(pos, 1, c);
          break;
        default:
          text.erase(pos, 1);
          break;
      }
    }
    if (i % 10 == 0) {  // sometimes pure noise
      text.resize(gen() % 200);
      for (char& ch : text) ch = static_cast<char>(gen());
    }
    Result<Trace> r = Parse(text, "fuzz.trace");
    if (r.ok()) {
      ++accepted;
      Result<Trace> again = Parse(Write(*r), "fuzz.trace");  // what we accept, we write back
      ASSERT_TRUE(again.ok()) << again.status().ToString();
      EXPECT_EQ(again->web, r->web);
      EXPECT_EQ(again->mail, r->mail);
      EXPECT_EQ(again->block, r->block);
    } else {
      EXPECT_EQ(r.status().message().rfind("fuzz.trace:", 0), 0u) << r.status().message();
    }
  }
  EXPECT_GT(accepted, 0) << "the mutations should leave some traces valid";
}

}  // namespace
}  // namespace ghost
