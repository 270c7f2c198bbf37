// The body-section locator (proxy/imap_section.h): the answers dovecot gives for the same
// sections (checked against a real dovecot in tests/integration/ghostproxy_imap_sections_test.py).
#include "proxy/imap_section.h"

#include <gtest/gtest.h>

#include <string>

namespace ghost::imapwire {
namespace {

std::string Crlf(std::string s) {
  std::string out;
  for (char c : s) {
    if (c == '\n') out += '\r';
    out += c;
  }
  return out;
}

std::optional<std::string> Get(const std::string& msg, const char* spec) {
  std::optional<Section> s = ParseSection(spec);
  if (!s) return std::nullopt;
  return ExtractSection(msg, *s);
}

const std::string kMixed = Crlf(
    "From: a@example.org\n"
    "Subject: mixed\n"
    "X-Long: one\n"
    " two\n"
    "MIME-Version: 1.0\n"
    "Content-Type: multipart/mixed; boundary=\"XX\"\n"
    "\n"
    "preamble\n"
    "--XX\n"
    "Content-Type: text/plain\n"
    "\n"
    "hello\n"
    "--XX\n"
    "Content-Type: message/rfc822\n"
    "\n"
    "Subject: inner\n"
    "Content-Type: multipart/alternative; boundary=in\n"
    "\n"
    "--in\n"
    "\n"
    "inner one\n"
    "--in--\n"
    "--XX--\n"
    "epilogue\n");

TEST(ImapSectionTest, ParsesSectionSpecsAndNamesThemInUpperCase) {
  std::optional<Section> s = ParseSection("1.2.header.fields.not (From x-A)");
  ASSERT_TRUE(s);
  EXPECT_EQ(s->part, (std::vector<std::uint32_t>{1, 2}));
  EXPECT_EQ(s->text, Section::Text::kHeaderFieldsNot);
  EXPECT_EQ(SectionName(*s), "1.2.HEADER.FIELDS.NOT (FROM X-A)");
  EXPECT_EQ(SectionName(*ParseSection("")), "");
  EXPECT_EQ(SectionName(*ParseSection("3.mime")), "3.MIME");
  for (const char* bad : {"MIME", "0", "1.", ".1", "1..2", "HEADER.FIELDS", "HEADER.FIELDS ()",
                          "HEADER.FIELDS (A", "TEXT.1", "1.TEXTX", "99999999999", "HEADER.FIELDS (A  B)"}) {
    EXPECT_FALSE(ParseSection(bad)) << bad;
  }
}

TEST(ImapSectionTest, LocatesHeaderTextAndFieldsOfTheMessage) {
  EXPECT_EQ(Get(kMixed, "HEADER")->substr(0, 20), "From: a@example.org\r");
  EXPECT_TRUE(Get(kMixed, "HEADER")->ends_with("\"XX\"\r\n\r\n"));
  EXPECT_TRUE(Get(kMixed, "TEXT")->starts_with("preamble\r\n--XX"));
  EXPECT_EQ(*Get(kMixed, "HEADER.FIELDS (subject x-long)"), "Subject: mixed\r\nX-Long: one\r\n two\r\n\r\n");
  EXPECT_EQ(*Get(kMixed, "HEADER.FIELDS (Nothing)"), "\r\n");
  EXPECT_EQ(Get(kMixed, "HEADER.FIELDS.NOT (From Subject X-Long Content-Type)"), "MIME-Version: 1.0\r\n\r\n");
}

TEST(ImapSectionTest, LocatesPartsTheirMimeHeadersAndEncapsulatedMessages) {
  EXPECT_EQ(*Get(kMixed, "1"), "hello");
  EXPECT_EQ(*Get(kMixed, "1.MIME"), "Content-Type: text/plain\r\n\r\n");
  // The nested close delimiter's CRLF belongs to the part (dovecot's count).
  EXPECT_EQ(*Get(kMixed, "2.TEXT"), "--in\r\n\r\ninner one\r\n--in--\r\n");
  EXPECT_TRUE(Get(kMixed, "2")->starts_with("Subject: inner\r\n"));
  EXPECT_TRUE(Get(kMixed, "2")->ends_with("--in--\r\n"));
  EXPECT_EQ(*Get(kMixed, "2.HEADER.FIELDS (SUBJECT)"), "Subject: inner\r\n\r\n");
  EXPECT_EQ(*Get(kMixed, "2.1"), "inner one");
  EXPECT_EQ(*Get(kMixed, "2.1.MIME"), "\r\n");
}

TEST(ImapSectionTest, PartOneOfASinglePartMessageIsItsBody) {
  std::string m = Crlf("Subject: s\n\nbody\n");
  EXPECT_EQ(*Get(m, "1"), "body\r\n");
  EXPECT_FALSE(Get(m, "1.MIME"));
  EXPECT_FALSE(Get(m, "2"));
}

TEST(ImapSectionTest, LeavesWhatItIsNotSureOfToTheServer) {
  EXPECT_FALSE(Get(kMixed, "3"));      // past the end (dovecot: empty)
  EXPECT_FALSE(Get(kMixed, "1.1"));    // a sub-part of a leaf (dovecot: the leaf)
  EXPECT_FALSE(Get(kMixed, "1.TEXT")); // TEXT of a part that is not a message
  std::string bare_lf = "Subject: s\n\nbody\n";
  EXPECT_FALSE(Get(bare_lf, "TEXT"));
  std::string no_close = Crlf("Content-Type: multipart/mixed; boundary=b\n\n--b\n\nx\n");
  EXPECT_FALSE(Get(no_close, "1"));
  std::string prefix = Crlf("Content-Type: multipart/mixed; boundary=b\n\n--b\n\nx\n--bc\n--b--\n");
  EXPECT_FALSE(Get(prefix, "1"));
  std::string two_types = Crlf("Content-Type: text/plain\nContent-Type: multipart/mixed; boundary=b\n\nx\n");
  EXPECT_FALSE(Get(two_types, "1"));
  std::string rfc2231 = Crlf("Content-Type: multipart/mixed; boundary*=utf-8''b\n\n--b\n\nx\n--b--\n");
  EXPECT_FALSE(Get(rfc2231, "1"));
}

TEST(ImapSectionTest, DecodesBinaryPartsStrictly) {
  std::string m = Crlf(
      "Content-Type: multipart/mixed; boundary=b\n\n"
      "--b\nContent-Transfer-Encoding: base64\n\naGVsbG8g\nd29ybGQ=\n"
      "--b\nContent-Transfer-Encoding: Quoted-Printable\n\nCaf=C3=A9 long=\n line\n"
      "--b\n\nplain\n"
      "--b\nContent-Transfer-Encoding: base64\n\nAAE=\n"
      "--b\nContent-Transfer-Encoding: quoted-printable\n\ntrailing \nx\n"
      "--b\nContent-Transfer-Encoding: base64\n\naGV*bG8=\n"
      "--b\nContent-Transfer-Encoding: x-uuencode\n\nx\n"
      "--b--\n");
  bool l8 = true;
  EXPECT_EQ(*ExtractBinary(m, {1}, &l8), "hello world");
  EXPECT_TRUE(l8);  // decoded base64: a literal8, as dovecot sends it
  EXPECT_EQ(*ExtractBinary(m, {2}, &l8), "Caf\xC3\xA9 long line");
  EXPECT_TRUE(l8);  // decoded 8-bit content: dovecot sends a literal8
  EXPECT_EQ(*ExtractBinary(m, {3}, &l8), "plain");
  EXPECT_FALSE(l8);
  EXPECT_FALSE(ExtractBinary(m, {4}, &l8));  // a NUL
  EXPECT_FALSE(ExtractBinary(m, {5}, &l8));  // trailing white space in quoted-printable
  EXPECT_FALSE(ExtractBinary(m, {6}, &l8));  // not base64
  EXPECT_FALSE(ExtractBinary(m, {7}, &l8));  // an encoding it does not decode
  EXPECT_FALSE(ExtractBinary(m, {}, &l8));   // BINARY[]: the server's
}

TEST(ImapSectionTest, BoundsNestingDepth) {
  std::string m = "Content-Type: multipart/mixed; boundary=b0\r\n\r\n";
  std::string tail;
  for (int i = 1; i < 40; ++i) {
    m += "--b" + std::to_string(i - 1) + "\r\nContent-Type: multipart/mixed; boundary=b" + std::to_string(i) + "\r\n\r\n";
    tail = "--b" + std::to_string(i - 1) + "--\r\n" + tail;
  }
  m += "--b39\r\n\r\nx\r\n--b39--\r\n" + tail;
  EXPECT_FALSE(Get(m, "1"));  // deeper than kMaxSectionDepth: not answered here
}

}  // namespace
}  // namespace ghost::imapwire
