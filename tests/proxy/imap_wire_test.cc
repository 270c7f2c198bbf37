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

TEST(ImapWireTest, RecognizesOnlyOneBodyItemOfOneMessage) {
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
  for (const char* no : {"1:3 BODY[]", "1,2 BODY[]", "* BODY[]", "3 BODY[]<0>", "3 BODY[]<0.0>", "3 BODY[]<a.1>",
                         "3 (BODY[] FLAGS)", "3 (BODY[]", "3 BODY[] BODY[]", "0 BODY[]",
                         "3 BINARY[]", "3 (BODY[] RFC822)", "3 BODY[TEXT", "3 BODY[[TEXT]]",
                         "3 BODY[1.]", "3 BODY[MIME]", "3 (BODY.PEEK[HEADER.FIELDS (A  B)])",
                         "3 BODY[HEADER.FIELDS (\"A\")]", "3 BODY[0]", "3 RFC822.HEADER"}) {
    EXPECT_FALSE(ParseBodyFetch(no)) << no;
  }
}

TEST(ImapWireTest, RecognizesSectionsAndNamesThemAsTheServerDoes) {
  auto f = ParseBodyFetch("7 (UID BODY.PEEK[header.fields (subject x-long)])");
  ASSERT_TRUE(f);
  EXPECT_FALSE(f->whole());
  EXPECT_EQ(f->section.text, Section::Text::kHeaderFields);
  EXPECT_EQ(f->section.fields, (std::vector<std::string>{"SUBJECT", "X-LONG"}));
  EXPECT_EQ(f->response_name(), "BODY[HEADER.FIELDS (SUBJECT X-LONG)]");
  f = ParseBodyFetch("7 BODY[1.2.mime]<2.5>");
  ASSERT_TRUE(f);
  EXPECT_TRUE(f->sets_seen());
  EXPECT_EQ(f->section.part, (std::vector<std::uint32_t>{1, 2}));
  EXPECT_EQ(f->response_name(), "BODY[1.2.MIME]<2>");
  EXPECT_EQ(ParseBodyFetch("7 BODY.PEEK[2.TEXT]")->response_name(), "BODY[2.TEXT]");
  EXPECT_EQ(ParseBodyFetch("7 BODY.PEEK[3]")->response_name(), "BODY[3]");
  EXPECT_TRUE(ParseBodyFetch("7 BODY.PEEK[]")->whole());
  f = ParseBodyFetch("7 (UID BINARY.PEEK[2.1]<0.10>)");
  ASSERT_TRUE(f);
  EXPECT_FALSE(f->sets_seen());
  EXPECT_FALSE(f->whole());
  EXPECT_EQ(f->response_name(), "BINARY[2.1]<0>");
  EXPECT_TRUE(ParseBodyFetch("7 BINARY[1]")->sets_seen());
  EXPECT_EQ(ParseBodyFetch("7 binary.size[3]")->response_name(), "BINARY.SIZE[3]");
  EXPECT_FALSE(ParseBodyFetch("7 BINARY.SIZE[3]")->sets_seen());
  for (const char* no : {"7 BINARY[]", "7 BINARY[1.MIME]", "7 BINARY.SIZE[1]<0.5>", "7 BINARY[HEADER]"}) {
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

TEST(ImapWireTest, OffersStartTlsAndDisablesLoginOnlyWhenAsked) {
  const std::string caps = "* CAPABILITY IMAP4rev1 IDLE AUTH=PLAIN\r\n";
  EXPECT_EQ(TlsCapabilities(caps, false, false), caps);  // byte for byte
  EXPECT_EQ(TlsCapabilities(caps, true, false), "* CAPABILITY IMAP4rev1 IDLE AUTH=PLAIN STARTTLS\r\n");
  EXPECT_EQ(TlsCapabilities(caps, true, true), "* CAPABILITY IMAP4rev1 IDLE STARTTLS LOGINDISABLED\r\n");
  EXPECT_EQ(TlsCapabilities("* OK [CAPABILITY IMAP4rev1 AUTH=PLAIN] ready\r\n", true, true),
            "* OK [CAPABILITY IMAP4rev1 STARTTLS LOGINDISABLED] ready\r\n");
  // After STARTTLS (or login) the words go, even if a server had said them.
  EXPECT_EQ(TlsCapabilities("a1 OK [CAPABILITY IMAP4rev1 STARTTLS LOGINDISABLED] x\r\n", false, false),
            "a1 OK [CAPABILITY IMAP4rev1] x\r\n");
  EXPECT_EQ(TlsCapabilities("* CAPABILITY IMAP4rev1 starttls\r\n", true, false), "* CAPABILITY IMAP4rev1 starttls\r\n");
  EXPECT_EQ(TlsCapabilities("* OK hello\r\n", true, true), "* OK hello\r\n");
}

TEST(ImapWireTest, ReadsThePlainUserAndNotThePassword) {
  // base64("\0ghost\0secret") and base64("admin\0ghost\0secret").
  EXPECT_EQ(PlainUser("AGdob3N0AHNlY3JldA=="), "ghost");
  EXPECT_EQ(PlainUser("YWRtaW4AZ2hvc3QAc2VjcmV0"), "admin");
  EXPECT_FALSE(PlainUser("not base64!"));
  EXPECT_FALSE(PlainUser("Z2hvc3Q="));  // no NULs
}

TEST(ImapWireTest, ReadsThePlainPassword) {
  EXPECT_EQ(PlainPassword("AGdob3N0AHNlY3JldA=="), "secret");
  EXPECT_EQ(PlainPassword("YWRtaW4AZ2hvc3QAc2VjcmV0"), "secret");
  EXPECT_FALSE(PlainPassword("Z2hvc3Q="));  // no NULs
  EXPECT_FALSE(PlainPassword("not base64!"));
}

TEST(ImapWireTest, ParsesADeferrableUidStoreAgainstTheKnownUids) {
  const std::vector<std::uint32_t> known = {3, 5, 9, 12};
  auto st = ParseUidStore("5 +FLAGS (\\Seen \\Flagged)\r\n", known);
  ASSERT_TRUE(st);
  EXPECT_EQ(st->uids, (std::vector<std::uint32_t>{5}));
  EXPECT_TRUE(st->add);
  EXPECT_FALSE(st->silent);
  EXPECT_EQ(st->flags, (std::vector<std::string>{"\\Seen", "\\Flagged"}));
  st = ParseUidStore("3:9,12 -flags.silent \\Deleted", known);
  ASSERT_TRUE(st);
  EXPECT_EQ(st->uids, (std::vector<std::uint32_t>{3, 5, 9, 12}));
  EXPECT_FALSE(st->add);
  EXPECT_TRUE(st->silent);
  EXPECT_EQ(st->flags, (std::vector<std::string>{"\\Deleted"}));
  st = ParseUidStore("10:* +FLAGS ($Ghost)", known);
  ASSERT_TRUE(st);
  EXPECT_EQ(st->uids, (std::vector<std::uint32_t>{12}));
  // What goes to the server instead: an unknown UID, a replacement, UNCHANGEDSINCE, no flags,
  // a range of unknown UIDs, too many UIDs.
  EXPECT_FALSE(ParseUidStore("4 +FLAGS (\\Seen)", known));
  EXPECT_FALSE(ParseUidStore("5 FLAGS (\\Seen)", known));
  EXPECT_FALSE(ParseUidStore("5 (UNCHANGEDSINCE 7) +FLAGS (\\Seen)", known));
  EXPECT_FALSE(ParseUidStore("5 +FLAGS ()", known));
  EXPECT_FALSE(ParseUidStore("6:8 +FLAGS (\\Seen)", known));
  EXPECT_FALSE(ParseUidStore("1:* +FLAGS (\\Seen)", known, 3));
  EXPECT_FALSE(ParseUidStore("5 +FLAGS (\\Seen", known));
}

TEST(ImapWireTest, FindsAndRewritesTheFlagsOfAnUntaggedFetch) {
  auto ff = ParseFetchFlags("* 4 FETCH (UID 9 FLAGS (\\Seen \\Recent))\r\n");
  ASSERT_TRUE(ff);
  EXPECT_EQ(ff->seq, 4u);
  EXPECT_EQ(ff->uid, 9u);
  EXPECT_EQ(ff->flags, (std::vector<std::string>{"\\Seen", "\\Recent"}));
  EXPECT_EQ(RewriteFlags("* 4 FETCH (UID 9 FLAGS (\\Seen \\Recent))\r\n", *ff, {"\\Flagged"}),
            "* 4 FETCH (UID 9 FLAGS (\\Flagged))\r\n");
  // dovecot's order (FLAGS, then UID), a MODSEQ before them, and a body literal after them.
  ff = ParseFetchFlags("* 2 FETCH (FLAGS () UID 7)\r\n");
  ASSERT_TRUE(ff);
  EXPECT_EQ(ff->uid, 7u);
  EXPECT_TRUE(ff->flags.empty());
  ff = ParseFetchFlags("* 2 FETCH (MODSEQ (12) FLAGS (\\Answered) BODY[] {12}\r\n");
  ASSERT_TRUE(ff);
  EXPECT_FALSE(ff->uid);
  EXPECT_EQ(RewriteFlags("* 2 FETCH (MODSEQ (12) FLAGS (\\Answered) BODY[] {12}\r\n", *ff, {}),
            "* 2 FETCH (MODSEQ (12) FLAGS () BODY[] {12}\r\n");
  EXPECT_FALSE(ParseFetchFlags("* 2 FETCH (UID 7 RFC822.SIZE 100)\r\n"));
  EXPECT_FALSE(ParseFetchFlags("* 2 EXISTS\r\n"));
  EXPECT_FALSE(ParseFetchFlags("* 2 FETCH (BODY[HEADER.FIELDS (FLAGS)] {3}\r\n"));
}

TEST(ImapWireTest, ExpandsSequenceAndUidSetsAgainstTheMap) {
  const std::vector<std::uint32_t> known = {3, 5, 9, 12};
  EXPECT_EQ(*ExpandSet("2,4", known, false), (std::vector<std::uint32_t>{5, 12}));
  EXPECT_EQ(*ExpandSet("3:*", known, false), (std::vector<std::uint32_t>{9, 12}));
  EXPECT_EQ(*ExpandSet("*:1", known, false), known);
  EXPECT_EQ(*ExpandSet("4:10", known, true), (std::vector<std::uint32_t>{5, 9}));
  EXPECT_EQ(*ExpandSet("12,3,3", known, true), (std::vector<std::uint32_t>{3, 12}));
  // A sequence number past the end, an unknown UID, junk, too many: nullopt (to the server).
  EXPECT_FALSE(ExpandSet("5", known, false));
  EXPECT_FALSE(ExpandSet("0", known, false));
  EXPECT_FALSE(ExpandSet("4", known, true));
  EXPECT_FALSE(ExpandSet("1,", known, false));
  EXPECT_FALSE(ExpandSet("1:x", known, false));
  EXPECT_FALSE(ExpandSet("", known, false));
  EXPECT_FALSE(ExpandSet("1", {}, false));
  EXPECT_FALSE(ExpandSet("1:4", known, false, 3));
}

TEST(ImapWireTest, ParsesACopyToAnotherMailbox) {
  const std::vector<std::uint32_t> known = {3, 5, 9, 12};
  auto c = ParseCopy("2:3 Archive\r\n", known, false);
  ASSERT_TRUE(c);
  EXPECT_EQ(c->uids, (std::vector<std::uint32_t>{5, 9}));
  EXPECT_EQ(c->destination, "Archive");
  c = ParseCopy("12 \"Saved mail\"\r\n", known, true);
  ASSERT_TRUE(c);
  EXPECT_EQ(c->uids, (std::vector<std::uint32_t>{12}));
  EXPECT_EQ(c->destination, "Saved mail");
  EXPECT_FALSE(ParseCopy("2 {7}\r\n", known, false));      // a literal mailbox
  EXPECT_FALSE(ParseCopy("2 Archive extra\r\n", known, false));
  EXPECT_FALSE(ParseCopy("7 Archive\r\n", known, true));   // unknown UID
  EXPECT_FALSE(ParseCopy("2\r\n", known, false));
}

TEST(ImapWireTest, ParsesAnAppendOfOneMessage) {
  auto a = ParseAppend("Sent (\\Seen $Ghost) \"26-Nov-2026 04:00:00 +0000\" {310}");
  ASSERT_TRUE(a);
  EXPECT_EQ(a->mailbox, "Sent");
  EXPECT_EQ(a->flags, (std::vector<std::string>{"\\Seen", "$Ghost"}));
  EXPECT_EQ(a->date, "26-Nov-2026 04:00:00 +0000");
  EXPECT_EQ(a->size, 310u);
  EXPECT_FALSE(a->nonsync);
  a = ParseAppend("\"My Drafts\" {12+}");
  ASSERT_TRUE(a);
  EXPECT_EQ(a->mailbox, "My Drafts");
  EXPECT_TRUE(a->flags.empty());
  EXPECT_TRUE(a->date.empty());
  EXPECT_TRUE(a->nonsync);
  EXPECT_EQ(a->size, 12u);
  EXPECT_FALSE(ParseAppend("Sent (\\Seen {12}"));  // unbalanced
  EXPECT_FALSE(ParseAppend("Sent CATENATE (TEXT {12}"));  // an extension
  EXPECT_FALSE(ParseAppend("Sent"));  // no literal
  EXPECT_FALSE(ParseAppend("{4}"));  // a literal mailbox
  EXPECT_FALSE(ParseAppend("Sent {x}"));
  // "{5+}\r\r\n" on the wire: ParseCommand takes the CRLF, and the CR left is no literal
  // announcement for the framer (AnnouncedLiteral of the whole line), so none here.
  EXPECT_FALSE(ParseAppend("Sent {5+}\r"));
  bool nonsync = false, bad = false;
  EXPECT_FALSE(AnnouncedLiteral("a APPEND Sent {5+}\r\r\n", &nonsync, &bad));
}

TEST(ImapWireTest, ReadsAGreetingsCapabilitiesForStartTlsTowardTheServer) {
  EXPECT_EQ(GreetingCapabilities("* OK [CAPABILITY IMAP4rev1 STARTTLS AUTH=PLAIN] Dovecot ready.\r\n"),
            "IMAP4rev1 STARTTLS AUTH=PLAIN");
  EXPECT_EQ(GreetingCapabilities("* OK [capability imap4rev1] hi"), "imap4rev1");
  EXPECT_FALSE(GreetingCapabilities("* OK Dovecot ready.\r\n"));
  EXPECT_FALSE(GreetingCapabilities("* OK [CAPABILITY IMAP4rev1 unterminated\r\n"));
  EXPECT_TRUE(HasCapability("IMAP4rev1 starttls AUTH=PLAIN", "STARTTLS"));
  EXPECT_FALSE(HasCapability("IMAP4rev1 STARTTLSX AUTH=PLAIN", "STARTTLS"));
  EXPECT_FALSE(HasCapability("", "STARTTLS"));
  EXPECT_TRUE(HasCapability(" IMAP4rev1  STARTTLS", "STARTTLS"));
}

TEST(ImapWireTest, ForgetsThePreTlsCapabilitiesOfAGreeting) {
  EXPECT_EQ(GreetingWithoutCapabilities("* OK [CAPABILITY IMAP4rev1 STARTTLS LOGINDISABLED] Dovecot ready.\r\n"),
            "* OK Dovecot ready.\r\n");
  EXPECT_EQ(GreetingWithoutCapabilities("* OK Dovecot ready.\r\n"), "* OK Dovecot ready.\r\n");
  EXPECT_EQ(GreetingWithoutCapabilities("* OK [CAPABILITY IMAP4rev1\r\n"), "* OK [CAPABILITY IMAP4rev1\r\n");
}

}  // namespace
}  // namespace ghost::imapwire
