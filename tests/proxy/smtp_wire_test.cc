// Tests of the SMTP listener's parsers (proxy/smtp_wire.h).
#include "proxy/smtp_wire.h"

#include <gtest/gtest.h>

namespace ghost::smtpwire {
namespace {

TEST(SmtpWireTest, ParsesCommands) {
  auto c = ParseCommand("mail FROM:<a@b> SIZE=10\r\n");
  ASSERT_TRUE(c);
  EXPECT_EQ(c->verb, "MAIL");
  EXPECT_EQ(c->arg, "FROM:<a@b> SIZE=10");
  EXPECT_FALSE(ParseCommand(""));
  EXPECT_FALSE(ParseCommand("M4IL x"));
}

TEST(SmtpWireTest, ParsesPaths) {
  EXPECT_EQ(ParsePath("FROM:<a@b> SIZE=10", "FROM:"), "a@b");
  EXPECT_EQ(ParsePath("from: <a@b>", "FROM:"), "a@b");
  EXPECT_EQ(ParsePath("FROM:<>", "FROM:"), "");
  EXPECT_EQ(ParsePath("TO:<c@d>", "TO:"), "c@d");
  for (const char* bad : {"FROM:a@b", "FROM:<a@b", "FROM:<a b>", "TO:<c@d>", "FROM:<a@b>x",
                          "FROM:<\xff@b>", "FROM:<a@\xc3>"}) {
    EXPECT_FALSE(ParsePath(bad, "FROM:")) << bad;
  }
  EXPECT_EQ(ParsePath("FROM:<j\xc3\xa9r\xc3\xb4me@b>", "FROM:"), "j\xc3\xa9r\xc3\xb4me@b");  // UTF-8 stays
}

// Round 19: the outbox's envelope is JSON, so an address or user that is not UTF-8 is refused
// at the door (before, the envelope's dump threw at DATA's end and ghostproxy aborted).
TEST(SmtpWireTest, IsUtf8IsStrict) {
  for (const char* good : {"", "plain", "\xc3\xa9", "\xe2\x82\xac", "\xf0\x9f\x93\xa7", "\xf4\x8f\xbf\xbf"}) {
    EXPECT_TRUE(IsUtf8(good)) << good;
  }
  for (const char* bad : {"\xff", "\x80", "\xc3", "\xc0\xaf", "\xe0\x80\xaf", "\xed\xa0\x80",
                          "\xf4\x90\x80\x80", "\xf8\x88\x80\x80\x80", "a\xe2\x82"}) {
    EXPECT_FALSE(IsUtf8(bad)) << bad;
  }
}

TEST(SmtpWireTest, DecodesAuthPlain) {
  auto creds = PlainCredentials("AGdob3N0AHNlY3JldA==");  // "\0ghost\0secret"
  ASSERT_TRUE(creds);
  EXPECT_EQ(creds->first, "ghost");
  EXPECT_EQ(creds->second, "secret");
  EXPECT_FALSE(PlainCredentials("!!!notbase64"));
  EXPECT_FALSE(PlainCredentials("Z2hvc3Q="));  // no NULs
}

TEST(SmtpWireTest, UndoesDotStuffingAndStopsAtTheEnd) {
  DataReader r(1000);
  std::string out;
  std::string in = "Subject: x\r\n\r\n..dot\r\nbody\r\n.\r\nQUIT\r\n";
  std::size_t used = r.Feed(in.substr(0, 9), &out);
  used += r.Feed(in.substr(used), &out);
  EXPECT_TRUE(r.done());
  EXPECT_EQ(out, "Subject: x\r\n\r\n.dot\r\nbody\r\n");
  EXPECT_EQ(in.substr(used), "QUIT\r\n");
}

TEST(SmtpWireTest, RefusesAnOverLongDataLine) {
  DataReader r(100);
  std::string out;
  r.Feed(std::string(500, 'x'), &out);
  EXPECT_TRUE(r.error());
  EXPECT_TRUE(out.empty());
}

}  // namespace
}  // namespace ghost::smtpwire
