#include "common/imap/maildir_names.h"

#include <gtest/gtest.h>

#include <random>
#include <set>
#include <string>
#include <vector>

namespace ghost {
namespace {

// ---- Modified UTF-7 ----

TEST(MaildirNamesTest, Mutf7EncodesRfc3501Example) {
  // RFC 3501 §5.1.3's example: "~peter/mail/台北/日本語".
  Result<std::string> wire = EncodeMutf7(
      "~peter/mail/\xe5\x8f\xb0\xe5\x8c\x97/"
      "\xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e");
  ASSERT_TRUE(wire.ok()) << wire.status().ToString();
  EXPECT_EQ(*wire, "~peter/mail/&U,BTFw-/&ZeVnLIqe-");
  Result<std::string> back = DecodeMutf7(*wire);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(*back, "~peter/mail/\xe5\x8f\xb0\xe5\x8c\x97/\xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e");
}

TEST(MaildirNamesTest, Mutf7EncodesAmpersandAndAccents) {
  EXPECT_EQ(*EncodeMutf7("Tom & Jerry"), "Tom &- Jerry");
  EXPECT_EQ(*EncodeMutf7("Entw\xc3\xbcrfe"), "Entw&APw-rfe");
  EXPECT_EQ(*EncodeMutf7("\xc3\xa9\xc3\xa9"), "&AOkA6Q-");
  EXPECT_EQ(*DecodeMutf7("Tom &- Jerry"), "Tom & Jerry");
  EXPECT_EQ(*DecodeMutf7("Entw&APw-rfe"), "Entw\xc3\xbcrfe");
  EXPECT_EQ(*EncodeMutf7(""), "");
}

TEST(MaildirNamesTest, Mutf7EncodesAstralPlaneAsSurrogatePair) {
  const std::string smile = "\xf0\x9f\x98\x80";  // U+1F600
  Result<std::string> wire = EncodeMutf7("a" + smile);
  ASSERT_TRUE(wire.ok());
  EXPECT_EQ(*wire, "a&2D3eAA-");
  EXPECT_EQ(*DecodeMutf7(*wire), "a" + smile);
}

TEST(MaildirNamesTest, Mutf7DecoderRefusesWhatTheRfcForbids) {
  const std::vector<std::string> bad = {
      "caf\xc3\xa9",  // raw 8-bit
      "tab\there",    // control character
      "&AGE-",        // 'a' encoded in base64
      "&AOk",         // unterminated run
      "&-&",          // unterminated run at the end
      "&*-",          // not base64
      "&AOl-",        // non-zero padding bits
      "&A-",          // leftover bits, no unit
      "&2D0-",        // lone high surrogate
      "&3gA-",        // lone low surrogate
      "&AAA-",        // NUL
  };
  for (const std::string& s : bad) {
    Result<std::string> r = DecodeMutf7(s);
    EXPECT_FALSE(r.ok()) << "decoded " << s << " to " << (r.ok() ? *r : "");
    if (!r.ok()) {
      EXPECT_EQ(r.status().code(), Status::Code::kInvalidArgument);
      EXPECT_NE(r.status().message().find("modified UTF-7"), std::string::npos);
    }
  }
}

TEST(MaildirNamesTest, Mutf7EncoderRefusesInvalidUtf8) {
  const std::vector<std::string> bad = {
      "\xc3",              // truncated
      "\xc0\xaf",          // overlong '/'
      "\xed\xa0\x80",      // surrogate
      "\xf4\x90\x80\x80",  // above U+10FFFF
      "\xff",
      std::string("a\0b", 3),
  };
  for (const std::string& s : bad) EXPECT_FALSE(EncodeMutf7(s).ok()) << s;
}

// ---- Mailbox names <-> directory names ----

struct Mapping {
  std::string wire;
  char delimiter;
  std::string dir;
};

TEST(MaildirNamesTest, MapsMailboxesToMaildirPlusPlusFolders) {
  const std::vector<Mapping> cases = {
      {"INBOX", '/', ""},
      {"Sent", '/', ".Sent"},
      {"Work/Reports", '/', ".Work.Reports"},
      {"Work.Reports", '.', ".Work.Reports"},
      {"v1.2/notes", '/', ".v1%2E2.notes"},
      {"Entw&APw-rfe", '/', ".Entw\xc3\xbcrfe"},
      {"Tom &- Jerry", '/', ".Tom & Jerry"},
      {"100%", '/', ".100%25"},
      {"a/b", '\0', ".a%2Fb"},
      {"a.b", '\0', ".a%2Eb"},
      {"INBOX/Sub", '/', ".INBOX.Sub"},
  };
  for (const Mapping& m : cases) {
    Result<std::string> dir = MailboxToDirName(m.wire, m.delimiter);
    ASSERT_TRUE(dir.ok()) << m.wire << ": " << dir.status().ToString();
    EXPECT_EQ(*dir, m.dir) << m.wire;
    Result<std::string> wire = DirNameToMailbox(m.dir, m.delimiter);
    ASSERT_TRUE(wire.ok()) << m.dir << ": " << wire.status().ToString();
    EXPECT_EQ(*wire, m.wire == "INBOX" ? "INBOX" : m.wire);
  }
  EXPECT_EQ(*MailboxToDirName("inbox", '/'), "");
}

// Each hostile name must give a safe directory name and come back unchanged.
TEST(MaildirNamesTest, HostileNamesMapSafelyAndReversibly) {
  const std::vector<std::string> hostile = {
      "..",
      ".",
      "/",
      "//",
      "../etc",
      "a/../b",
      ".hidden",
      "a//b",
      "trailing/",
      "/leading",
      "a/./b",
      "...",
      "%2F",
      "%!x",
      "a\x01"
      "b",
      "del\x7f",
      "caf\xc3\xa9",  // raw 8-bit: raw form
      "&AGE-",
      "&AOk-&AOk-",  // non-canonical mUTF-7: raw form
      "&AIU-",       // U+0085, a C1 control, canonical
      "sp ace",
      "a..b",
      "\\",
      "*",
      "~",
  };
  for (char delim : {'/', '.', '\0'}) {
    std::set<std::string> dirs;
    for (const std::string& name : hostile) {
      Result<std::string> dir = MailboxToDirName(name, delim);
      ASSERT_TRUE(dir.ok()) << name << ": " << dir.status().ToString();
      const std::string& d = *dir;
      ASSERT_FALSE(d.empty()) << name;
      EXPECT_EQ(d[0], '.') << name;
      EXPECT_NE(d, ".") << name;
      EXPECT_NE(d, "..") << name;
      EXPECT_EQ(d.find('/'), std::string::npos) << name << " -> " << d;
      EXPECT_EQ(d.find(".."), std::string::npos) << name << " -> " << d;
      EXPECT_NE(d.back(), '.') << name << " -> " << d;
      for (std::size_t i = 0; i < d.size(); ++i) {
        const auto c = static_cast<unsigned char>(d[i]);
        EXPECT_FALSE(c < 0x20 || c == 0x7f) << name << " -> " << d;
        if (c == 0xc2 && i + 1 < d.size()) {
          EXPECT_FALSE(static_cast<unsigned char>(d[i + 1]) <= 0x9f) << "C1 control kept";
        }
      }
      EXPECT_TRUE(dirs.insert(d).second) << "two names map to " << d;
      Result<std::string> back = DirNameToMailbox(d, delim);
      ASSERT_TRUE(back.ok()) << d << ": " << back.status().ToString();
      EXPECT_EQ(*back, name);
    }
  }
  EXPECT_EQ(*MailboxToDirName("caf\xc3\xa9", '/'), ".%!caf%C3%A9");
  EXPECT_EQ(*MailboxToDirName("..", '/'), ".%2E%2E");
  EXPECT_EQ(*MailboxToDirName("/", '/'), ".%2F");
}

TEST(MaildirNamesTest, RefusesNonCanonicalDirectoryNames) {
  const std::vector<std::string> bad = {
      "cur",  // not a folder
      ".",      "..",
      ".%2e",    // lower-case escape
      ".%41",    // needless escape of 'A'
      ".a%2",    // truncated escape
      ".a%zz",   // malformed escape
      ".a.",     // trailing level separator
      ".a..b",   // empty level
      ".INBOX",  // INBOX is the root
      ".inbox",
      ".%!ok",  // raw form for a canonical name
      ".\xff",  // not UTF-8
  };
  for (const std::string& d : bad) {
    Result<std::string> r = DirNameToMailbox(d, '/');
    EXPECT_FALSE(r.ok()) << d << " gave " << (r.ok() ? *r : "");
    if (!r.ok()) {
      EXPECT_EQ(r.status().code(), Status::Code::kInvalidArgument);
    }
  }
  // A '.' in a flat namespace has no delimiter to stand for.
  EXPECT_FALSE(DirNameToMailbox(".a.b", '\0').ok());
  // A directory spelled like a wire name means that literal text: its '&' is re-encoded.
  EXPECT_EQ(*DirNameToMailbox(".Entw&APw-rfe", '/'), "Entw&-APw-rfe");
}

TEST(MaildirNamesTest, RefusesNamesTooLongForTheFileSystem) {
  EXPECT_TRUE(MailboxToDirName(std::string(254, 'x'), '/').ok());  // "." + 254 = 255 bytes
  Result<std::string> too_long = MailboxToDirName(std::string(255, 'x'), '/');
  ASSERT_FALSE(too_long.ok());
  EXPECT_NE(too_long.status().message().find("255"), std::string::npos);
  // Escapes count: 100 dots need 300 bytes.
  EXPECT_FALSE(MailboxToDirName(std::string(100, '.'), '/').ok());
  EXPECT_FALSE(MailboxToDirName("", '/').ok());
}

// Property: for random names over a hostile alphabet, mapping is safe, injective and
// reversible; for random directory names, whatever is accepted maps back to itself.
TEST(MaildirNamesTest, RandomNamesRoundTrip) {
  std::mt19937_64 rng(20241122);
  const std::vector<std::string> alphabet = {"a",
                                             "Z",
                                             "0",
                                             ".",
                                             "/",
                                             "%",
                                             "&",
                                             "-",
                                             " ",
                                             "\x01",
                                             "\x7f",
                                             "\\",
                                             "!",
                                             "\xc3\xa9",
                                             "\xe6\x97\xa5",
                                             "\xf0\x9f\x98\x80",
                                             "\xc2\x85",
                                             "+",
                                             ",",
                                             "~"};
  std::set<std::string> seen_dirs;
  std::set<std::string> seen_names;
  for (int iter = 0; iter < 20000; ++iter) {
    std::string utf8;
    const int len = 1 + static_cast<int>(rng() % 12);
    for (int k = 0; k < len; ++k) utf8 += alphabet[rng() % alphabet.size()];
    Result<std::string> wire = EncodeMutf7(utf8);
    ASSERT_TRUE(wire.ok()) << utf8;
    Result<std::string> decoded = DecodeMutf7(*wire);
    ASSERT_TRUE(decoded.ok()) << *wire;
    ASSERT_EQ(*decoded, utf8);
    // Sometimes take raw bytes as the wire name instead (a non-conforming server).
    const std::string name = (iter % 3 == 0) ? utf8 : *wire;
    constexpr char kDelimiters[] = {'/', '.', '\0'};
    const char delim = kDelimiters[(iter / 3) % 3];
    Result<std::string> dir = MailboxToDirName(name, delim);
    if (IsInbox(name)) continue;
    ASSERT_TRUE(dir.ok()) << name << ": " << dir.status().ToString();
    ASSERT_EQ(dir->find('/'), std::string::npos);
    ASSERT_EQ(dir->find(".."), std::string::npos);
    Result<std::string> back = DirNameToMailbox(*dir, delim);
    ASSERT_TRUE(back.ok()) << *dir << ": " << back.status().ToString();
    ASSERT_EQ(*back, name);
    if (delim == '/' && seen_names.insert(name).second) {
      ASSERT_TRUE(seen_dirs.insert(*dir).second) << "collision at " << *dir;
    }
  }
  // Random directory names: accepted ones are canonical (map back to themselves).
  const std::string dir_alphabet = "aZ.%!2EF0x&-";
  int accepted = 0;
  for (int iter = 0; iter < 20000; ++iter) {
    std::string dir = ".";
    const int len = 1 + static_cast<int>(rng() % 8);
    for (int k = 0; k < len; ++k) dir += dir_alphabet[rng() % dir_alphabet.size()];
    Result<std::string> wire = DirNameToMailbox(dir, '/');
    if (!wire.ok()) continue;
    ++accepted;
    Result<std::string> again = MailboxToDirName(*wire, '/');
    ASSERT_TRUE(again.ok());
    ASSERT_EQ(*again, dir);
  }
  EXPECT_GT(accepted, 1000);
}

// ---- Message file names ----

TEST(MaildirNamesTest, FormatsAndParsesMessageFileNames) {
  MaildirFileName n;
  n.uidvalidity = 1795387522;
  n.uid = 42;
  n.size = 5120;
  n.info = "SF";
  const std::string s = FormatMaildirFileName(n);
  EXPECT_EQ(s, "1795387522.42.ghost,S=5120:2,FS");
  Result<MaildirFileName> p = ParseMaildirFileName(s);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  n.info = "FS";
  EXPECT_EQ(*p, n);

  MaildirFileName bare{7, 4294967295u, std::nullopt, ""};
  EXPECT_EQ(FormatMaildirFileName(bare), "7.4294967295.ghost:2,");
  EXPECT_EQ(*ParseMaildirFileName("7.4294967295.ghost:2,"), bare);
  EXPECT_EQ(*ParseMaildirFileName("7.4294967295.ghost"), bare);  // in new/: no info yet
  // A reader that renames to change flags may write them unsorted; they are normalized.
  EXPECT_EQ(ParseMaildirFileName("7.9.ghost:2,TSRS")->info, "RST");
}

TEST(MaildirNamesTest, RefusesForeignMessageFileNames) {
  for (const char* bad :
       {"1795387522.M593165P7613.vm,S=5,W=5:2,S", "0.1.ghost:2,", "1.0.ghost", "01.1.ghost",
        "1.01.ghost", "4294967296.1.ghost", "1.2.ghost:1,S", "1.2.ghost,W=3:2,", "1.2.ghost,S=:2,",
        "1.2.ghosts", "1.2", "x.y.ghost", "1.2.ghost:2,S!", ""}) {
    EXPECT_FALSE(ParseMaildirFileName(bad).ok()) << bad;
  }
}

// ---- Flags <-> info letters ----

TEST(MaildirNamesTest, MapsFlagsToSortedInfoLetters) {
  std::vector<std::string> unmapped;
  EXPECT_EQ(FlagsToInfo({"\\Seen", "\\Answered", "\\Flagged", "\\Deleted", "\\Draft", "$Forwarded",
                         "\\Recent", "$Junk", "\\seen"},
                        &unmapped),
            "DFPRST");
  EXPECT_EQ(unmapped, (std::vector<std::string>{"\\Recent", "$Junk"}));
  EXPECT_EQ(FlagsToInfo({}), "");
  EXPECT_EQ(FlagsToInfo({"\\SEEN"}), "S");
}

TEST(MaildirNamesTest, MapsInfoLettersToFlags) {
  std::string unmapped;
  EXPECT_EQ(InfoToFlags("SRa", &unmapped), (std::vector<std::string>{"\\Seen", "\\Answered"}));
  EXPECT_EQ(unmapped, "a");
  for (const char* info : {"", "D", "F", "P", "R", "S", "T", "DFPRST", "FS"}) {
    EXPECT_EQ(FlagsToInfo(InfoToFlags(info)), info);
  }
  EXPECT_EQ(NormalizeInfo("TSSRA"), "ARST");
}

}  // namespace
TEST(MaildirSubdirForTest, UnseenIsNewUntilAReaderMovesItSeenIsCur) {
  EXPECT_EQ(MaildirSubdirFor("", false), "new");
  EXPECT_EQ(MaildirSubdirFor("F", false), "new");  // flagged, still unseen
  EXPECT_EQ(MaildirSubdirFor("S", false), "cur");
  EXPECT_EQ(MaildirSubdirFor("FRS", false), "cur");
  EXPECT_EQ(MaildirSubdirFor("", true), "cur");  // a reader moved it to cur/ (mark_old)
}

}  // namespace ghost
