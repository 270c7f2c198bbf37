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
  for (const char* bad : {"FROM:a@b", "FROM:<a@b", "FROM:<a b>", "TO:<c@d>", "FROM:<a@b>x"}) {
    EXPECT_FALSE(ParsePath(bad, "FROM:")) << bad;
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
