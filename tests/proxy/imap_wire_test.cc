// Tests of the IMAP proxy's stream framing and recognizers (proxy/imap_wire.h).
#include "proxy/imap_wire.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace ghost::imapwire {
namespace {

struct Seen {
  std::vector<std::string> segments;  // with a "+" mark when the segment begins a command
  std::string literal;
  int literal_ends = 0;
  std::string error;
};

// Feeds `input` in pieces of `piece` bytes, as a socket might deliver it.
Seen Frame(const std::string& input, std::size_t piece, Limits limits = {}) {
  Framer f(limits);
  Seen out;
  std::size_t pos = 0;
  while (true) {
    std::string_view chunk = std::string_view(input).substr(pos, std::min(piece, input.size() - pos));
    Event ev;
    std::size_t used = f.Next(chunk, &ev);
    pos += used;
    switch (ev.kind) {
      case Event::Kind::kSegment:
        out.segments.push_back((ev.first ? "+" : "") + std::string(ev.text));
        break;
      case Event::Kind::kLiteralData:
        out.literal += ev.text;
        break;
      case Event::Kind::kLiteralEnd:
        ++out.literal_ends;
        break;
      case Event::Kind::kError:
        out.error = ev.error;
        return out;
      case Event::Kind::kNeedMore:
        if (pos >= input.size()) return out;
        break;
    }
  }
}

TEST(ImapWireTest, FramesLinesAndLiteralsAcrossAnySplit) {
  const std::string in =
      "a1 LOGIN {5}\r\nghost {3+}\r\npwd\r\na2 NOOP\r\n* 1 FETCH (BODY[] {4}\r\nab\r\n)\r\n";
  for (std::size_t piece : {1u, 2u, 7u, 1000u}) {
    Seen s = Frame(in, piece);
    ASSERT_EQ(s.error, "") << piece;
    ASSERT_EQ(s.segments.size(), 6u) << piece;
    EXPECT_EQ(s.segments[0], "+a1 LOGIN {5}\r\n");
    EXPECT_EQ(s.segments[1], " {3+}\r\n");
    EXPECT_EQ(s.segments[2], "\r\n");
    EXPECT_EQ(s.segments[3], "+a2 NOOP\r\n");
    EXPECT_EQ(s.segments[4], "+* 1 FETCH (BODY[] {4}\r\n");
    EXPECT_EQ(s.segments[5], ")\r\n");
    EXPECT_EQ(s.literal, "ghostpwdab\r\n");
    EXPECT_EQ(s.literal_ends, 3);
  }
}

TEST(ImapWireTest, RefusesALiteralOverTheLimit) {
  Seen s = Frame("a1 APPEND INBOX {1073741824}\r\n", 4096, Limits{1024, 1 << 20});
  EXPECT_NE(s.error.find("over the limit"), std::string::npos) << s.error;
  EXPECT_TRUE(s.segments.empty());
}

TEST(ImapWireTest, RefusesAnOverLongLineWithoutBufferingIt) {
  Framer f(Limits{1024, 1 << 20});
  std::string big(4096, 'x');
  Event ev;
  f.Next(big, &ev);
  EXPECT_EQ(ev.kind, Event::Kind::kError);
  EXPECT_TRUE(f.failed());
  EXPECT_LE(f.partial().size(), 1024u);
}

TEST(ImapWireTest, RefusesAMalformedLiteralSize) {
  EXPECT_NE(Frame("a1 LOGIN {12x}\r\n", 100).error, "");
  EXPECT_NE(Frame("a1 LOGIN {}\r\n", 100).error, "");
  EXPECT_NE(Frame("a1 LOGIN {99999999999999999999}\r\n", 100).error, "");
}

TEST(ImapWireTest, AtBoundaryOnlyBetweenCommands) {
  Framer f(Limits{});
  Event ev;
  EXPECT_TRUE(f.AtBoundary());
  f.Next("a1 X {2}\r\n", &ev);
  EXPECT_FALSE(f.AtBoundary());
  f.Next("ab", &ev);
  f.Next("", &ev);
  EXPECT_EQ(ev.kind, Event::Kind::kLiteralEnd);
  EXPECT_FALSE(f.AtBoundary());
  f.Next("\r\n", &ev);
  EXPECT_TRUE(f.AtBoundary());
}

TEST(ImapWireTest, ParsesCommandsAndAstrings) {
  std::optional<Command> c = ParseCommand("x7 uid fetch 5 (BODY.PEEK[])\r\n");
  ASSERT_TRUE(c);
  EXPECT_EQ(c->tag, "x7");
  EXPECT_EQ(c->name, "UID FETCH");
  EXPECT_EQ(c->rest, "5 (BODY.PEEK[])");
  std::string_view rest = R"( "we\"ird" plain)";
  EXPECT_EQ(ReadAstring(&rest), "we\"ird");
  EXPECT_EQ(ReadAstring(&rest), "plain");
  std::string_view lit = "{5}";
  EXPECT_FALSE(ReadAstring(&lit));
  EXPECT_FALSE(ParseCommand("\r\n"));
}

TEST(ImapWireTest, RecognizesOnlyWholeBodyFetchesOfOneMessage) {
  auto f = ParseBodyFetch("5 (UID BODY.PEEK[])");
  ASSERT_TRUE(f);
  EXPECT_EQ(f->number, 5u);
  EXPECT_FALSE(f->sets_seen());
  ASSERT_TRUE(ParseBodyFetch("3 RFC822"));
  EXPECT_TRUE(ParseBodyFetch("3 RFC822")->sets_seen());
  EXPECT_EQ(ParseBodyFetch("3 body[]")->response_name(), "BODY[]");
  auto partial = ParseBodyFetch("3 (UID BODY.PEEK[]<100.5000>)");
  ASSERT_TRUE(partial);
  EXPECT_EQ(partial->partial, std::make_pair(std::uint64_t{100}, std::uint64_t{5000}));
  EXPECT_EQ(partial->response_name(), "BODY[]<100>");
  EXPECT_FALSE(partial->sets_seen());
  for (const char* no : {"1:3 BODY[]", "1,2 BODY[]", "* BODY[]", "3 BODY[TEXT]", "3 BODY[]<0>", "3 BODY[]<0.0>", "3 BODY[]<a.1>",
                         "3 (BODY[] FLAGS)", "3 (BODY[]", "3 BODY[] BODY[]", "0 BODY[]",
                         "3 BINARY[]", "3 (BODY[] RFC822)"}) {
    EXPECT_FALSE(ParseBodyFetch(no)) << no;
  }
}

TEST(ImapWireTest, RecognizesWholeBodyLiteralsInFetchResponses) {
  auto p = ParseBodyPrefix("* 12 FETCH (UID 40 FLAGS (\\Seen) BODY[] {512}\r\n");
  ASSERT_TRUE(p);
  EXPECT_EQ(p->seq, 12u);
  EXPECT_EQ(p->uid, 40u);
  EXPECT_EQ(p->size, 512u);
  auto q = ParseBodyPrefix("* 2 FETCH (RFC822 {9}\r\n");
  ASSERT_TRUE(q);
  EXPECT_FALSE(q->uid);
  EXPECT_FALSE(ParseBodyPrefix("* 2 FETCH (BODY[HEADER] {9}\r\n"));
  EXPECT_FALSE(ParseBodyPrefix("* 2 FETCH (BODY[]<0> {9}\r\n"));
  EXPECT_FALSE(ParseBodyPrefix("* 2 FETCH (BINARY[] {9}\r\n"));
  EXPECT_FALSE(ParseBodyPrefix("* 2 FETCH (BODY[] {9+}\r\n"));
}

TEST(ImapWireTest, TracksMailboxData) {
  EXPECT_EQ(UntaggedNumber("* 5 EXISTS\r\n", "EXISTS"), 5u);
  EXPECT_EQ(UntaggedNumber("* 0 EXISTS\r\n", "EXISTS"), 0u);
  EXPECT_FALSE(UntaggedNumber("* 5 EXISTS extra\r\n", "EXISTS"));
  EXPECT_EQ(UntaggedNumber("* 3 EXPUNGE\r\n", "EXPUNGE"), 3u);
  EXPECT_EQ(UidValidity("* OK [UIDVALIDITY 1700000000] UIDs valid\r\n"), 1700000000u);
  auto uids = EsearchUids("* ESEARCH (TAG \"g1\") UID ALL 1:3,7,5\r\n", "g1", 100);
  ASSERT_TRUE(uids);
  EXPECT_EQ(*uids, (std::vector<std::uint32_t>{1, 2, 3, 5, 7}));
  EXPECT_EQ(EsearchUids("* ESEARCH (TAG \"g1\") UID\r\n", "g1", 100)->size(), 0u);
  EXPECT_FALSE(EsearchUids("* ESEARCH (TAG \"g2\") UID ALL 1\r\n", "g1", 100));
  EXPECT_FALSE(EsearchUids("* ESEARCH (TAG \"g1\") UID ALL 1:4000000000\r\n", "g1", 100));
}

TEST(ImapWireTest, FiltersCapabilitiesItCannotHonour) {
  EXPECT_EQ(FilterCapabilities("* CAPABILITY IMAP4rev1 COMPRESS=DEFLATE STARTTLS IDLE AUTH=PLAIN "
                               "AUTH=CRAM-MD5 QRESYNC\r\n"),
            "* CAPABILITY IMAP4rev1 IDLE AUTH=PLAIN\r\n");
  EXPECT_EQ(FilterCapabilities("a1 OK [CAPABILITY IMAP4rev1 compress=deflate ESEARCH] Logged in\r\n"),
            "a1 OK [CAPABILITY IMAP4rev1 ESEARCH] Logged in\r\n");
  EXPECT_EQ(FilterCapabilities("* OK hello\r\n"), "* OK hello\r\n");
}

TEST(ImapWireTest, ReadsThePlainUserAndNotThePassword) {
  // base64("\0ghost\0secret") and base64("admin\0ghost\0secret").
  EXPECT_EQ(PlainUser("AGdob3N0AHNlY3JldA=="), "ghost");
  EXPECT_EQ(PlainUser("YWRtaW4AZ2hvc3QAc2VjcmV0"), "admin");
  EXPECT_FALSE(PlainUser("not base64!"));
  EXPECT_FALSE(PlainUser("Z2hvc3Q="));  // no NULs
}

}  // namespace
}  // namespace ghost::imapwire
