#include "common/http/autoindex.h"

#include <gtest/gtest.h>

#include <random>
#include <set>
#include <string>
#include <vector>

namespace ghost {
namespace {

constexpr std::int64_t k22Nov2026At1958 = 1795377480;  // 2026-11-22 19:58:00 UTC
constexpr std::int64_t k20Nov2026At0801 = 1795161660;  // 2026-11-20 08:01:00 UTC
constexpr std::int64_t k21Nov2026At0705 = 1795244700;  // 2026-11-21 07:05:00 UTC

// nginx 1.22 `autoindex on;` (CRLF line ends, names padded to 50 columns, long names cut
// with "..&gt;", hrefs percent-encoded, text HTML-escaped).
const char kNginx[] =
    "<html>\r\n"
    "<head><title>Index of /pub/</title></head>\r\n"
    "<body>\r\n"
    "<h1>Index of /pub/</h1><hr><pre><a href=\"../\">../</a>\r\n"
    "<a href=\"docs/\">docs/</a>                                              "
    "22-Nov-2026 19:58                   -\r\n"
    "<a href=\"100%25.txt\">100%.txt</a>                                           "
    "22-Nov-2026 19:58                   8\r\n"
    "<a href=\"a%3Ab.txt\">a:b.txt</a>                                            "
    "20-Nov-2026 08:01                1234\r\n"
    "<a href=\"LLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLL.txt\">"
    "LLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLL..&gt;</a> "
    "21-Nov-2026 07:05             8388731\r\n"
    "<a href=\"with%20space%20%26%20co.txt\">with space &amp; co.txt</a>"
    "                                22-Nov-2026 19:58                   0\r\n"
    "<a href=\"%C3%BCnicode.txt\">\xc3\xbcnicode.txt</a>"
    "                                       22-Nov-2026 19:58                  17\r\n"
    "</pre><hr></body>\r\n"
    "</html>\r\n";

// nginx with `autoindex_exact_size off;`: sizes above 9999 bytes are rounded.
const char kNginxApproximate[] =
    "<html>\r\n<head><title>Index of /iso/</title></head>\r\n<body>\r\n"
    "<h1>Index of /iso/</h1><hr><pre><a href=\"../\">../</a>\r\n"
    "<a href=\"small.txt\">small.txt</a>                                          "
    "22-Nov-2026 19:58       3\r\n"
    "<a href=\"medium.bin\">medium.bin</a>                                         "
    "22-Nov-2026 19:58      12K\r\n"
    "<a href=\"disk.iso\">disk.iso</a>                                           "
    "22-Nov-2026 19:58       3G\r\n"
    "</pre><hr></body>\r\n</html>\r\n";

// Apache 2.4 mod_autoindex without FancyIndexing.
const char kApachePlain[] =
    "<!DOCTYPE HTML PUBLIC \"-//W3C//DTD HTML 3.2 Final//EN\">\n"
    "<html>\n <head>\n  <title>Index of /pub</title>\n </head>\n <body>\n"
    "<h1>Index of /pub</h1>\n"
    "<ul><li><a href=\"/\"> Parent Directory</a></li>\n"
    "<li><a href=\"docs/\"> docs/</a></li>\n"
    "<li><a href=\"notes.txt\"> notes.txt</a></li>\n"
    "<li><a href=\"my%20file.bin\"> my file.bin</a></li>\n"
    "</ul>\n</body></html>\n";

// Apache 2.2 FancyIndexing (a <pre>, dd-Mon-yyyy dates, a description column).
const char kApacheFancyPre[] =
    "<!DOCTYPE HTML PUBLIC \"-//W3C//DTD HTML 3.2 Final//EN\">\n"
    "<html>\n <head>\n  <title>Index of /pub</title>\n </head>\n <body>\n"
    "<h1>Index of /pub</h1>\n"
    "<pre><img src=\"/icons/blank.gif\" alt=\"Icon \"> <a href=\"?C=N;O=D\">Name</a>"
    "                    <a href=\"?C=M;O=A\">Last modified</a>      <a href=\"?C=S;O=A\">"
    "Size</a>  <a href=\"?C=D;O=A\">Description</a><hr><img src=\"/icons/back.gif\" "
    "alt=\"[DIR]\"> <a href=\"/\">Parent Directory</a>                             -   \n"
    "<img src=\"/icons/folder.gif\" alt=\"[DIR]\"> <a href=\"docs/\">docs/</a>"
    "                   22-Nov-2026 19:58    -   \n"
    "<img src=\"/icons/text.gif\" alt=\"[TXT]\"> <a href=\"notes.txt\">notes.txt</a>"
    "               22-Nov-2026 19:58  1.2K  Release notes 2026-01-01 12:00\n"
    "<img src=\"/icons/unknown.gif\" alt=\"[   ]\"> <a href=\"data.bin\">data.bin</a>"
    "                21-Nov-2026 07:05  512   \n"
    "<hr></pre>\n"
    "<address>Apache/2.2.22 (Debian) Server at example.org Port 80</address>\n"
    "</body></html>\n";

// Apache 2.4 FancyIndexing with HTMLTable (Debian's default IndexOptions).
const char kApacheTable[] =
    "<!DOCTYPE HTML PUBLIC \"-//W3C//DTD HTML 3.2 Final//EN\">\n"
    "<html>\n <head>\n  <title>Index of /pub</title>\n </head>\n <body>\n"
    "<h1>Index of /pub</h1>\n"
    "  <table>\n"
    "   <tr><th valign=\"top\"><img src=\"/icons/blank.gif\" alt=\"[ICO]\"></th><th>"
    "<a href=\"?C=N;O=D\">Name</a></th><th><a href=\"?C=M;O=A\">Last modified</a></th>"
    "<th><a href=\"?C=S;O=A\">Size</a></th><th><a href=\"?C=D;O=A\">Description</a></th>"
    "</tr>\n"
    "   <tr><th colspan=\"5\"><hr></th></tr>\n"
    "<tr><td valign=\"top\"><img src=\"/icons/back.gif\" alt=\"[PARENTDIR]\"></td><td>"
    "<a href=\"/\">Parent Directory</a></td><td>&nbsp;</td><td align=\"right\">  - </td>"
    "<td>&nbsp;</td></tr>\n"
    "<tr><td valign=\"top\"><img src=\"/icons/folder.gif\" alt=\"[DIR]\"></td><td>"
    "<a href=\"docs/\">docs/</a></td><td align=\"right\">2026-11-22 19:58  </td>"
    "<td align=\"right\">  - </td><td>&nbsp;</td></tr>\n"
    "<tr><td valign=\"top\"><img src=\"/icons/compressed.gif\" alt=\"[   ]\"></td><td>"
    "<a href=\"archive.tar.gz\">archive.tar.gz</a></td><td align=\"right\">"
    "2026-11-20 08:01  </td><td align=\"right\">3.0M</td><td>&nbsp;</td></tr>\n"
    "<tr><td valign=\"top\"><img src=\"/icons/text.gif\" alt=\"[TXT]\"></td><td>"
    "<a href=\"notes.txt\">notes.txt</a></td><td align=\"right\">2026-11-22 19:58  </td>"
    "<td align=\"right\">1.2K</td><td>&nbsp;</td></tr>\n"
    "<tr><td valign=\"top\"><img src=\"/icons/text.gif\" alt=\"[TXT]\"></td><td>"
    "<a href=\"tiny.txt\">tiny.txt</a></td><td align=\"right\">2026-11-21 07:05  </td>"
    "<td align=\"right\">512 </td><td>&nbsp;</td></tr>\n"
    "   <tr><th colspan=\"5\"><hr></th></tr>\n"
    "</table>\n"
    "<address>Apache/2.4.57 (Debian) Server at example.org Port 80</address>\n"
    "</body></html>\n";

// Apache with IconsAreLinks: every entry is linked twice, the icon first.
const char kApacheIconsAreLinks[] =
    "<html><body><pre>"
    "<a href=\"notes.txt\"><img src=\"/icons/text.gif\" alt=\"[TXT]\"></a> "
    "<a href=\"notes.txt\">notes.txt</a>               2026-11-22 19:58  4096  \n"
    "</pre></body></html>\n";

// lighttpd mod_dirlisting.
const char kLighttpd[] =
    "<!DOCTYPE html>\n<html>\n<head>\n<title>Index of /pub/</title>\n</head>\n<body>\n"
    "<h2>Index of /pub/</h2>\n<div class=\"list\">\n<table summary=\"Directory Listing\" "
    "cellpadding=\"0\" cellspacing=\"0\">\n<thead><tr><th class=\"n\">Name</th><th "
    "class=\"m\">Last Modified</th><th class=\"s\">Size</th><th class=\"t\">Type</th></tr>"
    "</thead>\n<tbody>\n"
    "<tr class=\"d\"><td class=\"n\"><a href=\"../\">..</a>/</td><td class=\"m\">&nbsp;</td>"
    "<td class=\"s\">- &nbsp;</td><td class=\"t\">Directory</td></tr>\n"
    "<tr><td class=\"n\"><a href=\"docs/\">docs</a>/</td><td class=\"m\">2026-Nov-22 "
    "19:58:07</td><td class=\"s\">- &nbsp;</td><td class=\"t\">Directory</td></tr>\n"
    "<tr><td class=\"n\"><a href=\"notes.txt\">notes.txt</a></td><td class=\"m\">"
    "2026-Nov-22 19:58:07</td><td class=\"s\">1.5K</td><td class=\"t\">text/plain</td>"
    "</tr>\n"
    "</tbody>\n</table>\n</div>\n</body>\n</html>\n";

// Python's http.server.
const char kPython[] =
    "<!DOCTYPE HTML>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
    "<title>Directory listing for /</title>\n</head>\n<body>\n"
    "<h1>Directory listing for /</h1>\n<hr>\n<ul>\n"
    "<li><a href=\"docs/\">docs/</a></li>\n"
    "<li><a href=\"notes.txt\">notes.txt</a></li>\n"
    "<li><a href=\"it%27s.txt\">it&#x27;s.txt</a></li>\n"
    "</ul>\n<hr>\n</body>\n</html>\n";

const std::vector<std::string> kAllSamples = {
    kNginx,       kNginxApproximate,    kApachePlain, kApacheFancyPre,
    kApacheTable, kApacheIconsAreLinks, kLighttpd,    kPython};

std::vector<DirEntry> ParseOk(std::string_view html, std::string_view dir = {}) {
  Result<std::vector<DirEntry>> r = ParseAutoindex(html, dir);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? *r : std::vector<DirEntry>{};
}

std::vector<std::string> Names(const std::vector<DirEntry>& entries) {
  std::vector<std::string> names;
  for (const DirEntry& e : entries) names.push_back(e.name + (e.is_dir ? "/" : ""));
  return names;
}

DirEntry File(std::string name, std::optional<Bytes> size, std::optional<std::int64_t> mtime,
              std::optional<Bytes> approx = std::nullopt) {
  DirEntry e;
  e.name = std::move(name);
  e.size = size;
  e.approximate_size = approx;
  e.mtime_unix = mtime;
  return e;
}

DirEntry Dir(std::string name, std::optional<std::int64_t> mtime) {
  DirEntry e;
  e.name = std::move(name);
  e.is_dir = true;
  e.mtime_unix = mtime;
  return e;
}

TEST(AutoindexTest, ParsesNginxListing) {
  const std::vector<DirEntry> entries = ParseOk(kNginx);
  const std::vector<DirEntry> expected = {
      Dir("docs", k22Nov2026At1958),
      File("100%.txt", 8, k22Nov2026At1958),
      File("a:b.txt", 1234, k20Nov2026At0801),
      File(std::string(70, 'L') + ".txt", 8388731, k21Nov2026At0705),
      File("with space & co.txt", 0, k22Nov2026At1958),
      File("\xc3\xbcnicode.txt", 17, k22Nov2026At1958),
  };
  EXPECT_EQ(entries, expected);
}

TEST(AutoindexTest, RoundedSizesAreApproximateAndLeaveSizeUnset) {
  const std::vector<DirEntry> entries = ParseOk(kNginxApproximate);
  const std::vector<DirEntry> expected = {
      File("small.txt", 3, k22Nov2026At1958),
      File("medium.bin", std::nullopt, k22Nov2026At1958, 12 * 1024),
      File("disk.iso", std::nullopt, k22Nov2026At1958, Bytes{3} << 30),
  };
  EXPECT_EQ(entries, expected);
}

TEST(AutoindexTest, ParsesApachePlainListWithoutSizesOrDates) {
  const std::vector<DirEntry> entries = ParseOk(kApachePlain);
  const std::vector<DirEntry> expected = {
      Dir("docs", std::nullopt),
      File("notes.txt", std::nullopt, std::nullopt),
      File("my file.bin", std::nullopt, std::nullopt),
  };
  EXPECT_EQ(entries, expected);
}

TEST(AutoindexTest, ParsesApacheFancyPreListing) {
  const std::vector<DirEntry> entries = ParseOk(kApacheFancyPre);
  const std::vector<DirEntry> expected = {
      Dir("docs", k22Nov2026At1958),
      File("notes.txt", std::nullopt, k22Nov2026At1958, 1229),  // 1.2 × 1024, rounded
      File("data.bin", 512, k21Nov2026At0705),
  };
  EXPECT_EQ(entries, expected);
}

TEST(AutoindexTest, ParsesApacheHtmlTableListing) {
  const std::vector<DirEntry> entries = ParseOk(kApacheTable);
  const std::vector<DirEntry> expected = {
      Dir("docs", k22Nov2026At1958),
      File("archive.tar.gz", std::nullopt, k20Nov2026At0801, 3 * 1024 * 1024),
      File("notes.txt", std::nullopt, k22Nov2026At1958, 1229),
      File("tiny.txt", 512, k21Nov2026At0705),
  };
  EXPECT_EQ(entries, expected);
}

TEST(AutoindexTest, EntryLinkedTwiceIsOneEntryWithItsFacts) {
  const std::vector<DirEntry> entries = ParseOk(kApacheIconsAreLinks);
  const std::vector<DirEntry> expected = {File("notes.txt", 4096, k22Nov2026At1958)};
  EXPECT_EQ(entries, expected);
}

TEST(AutoindexTest, ParsesLighttpdAndPythonListings) {
  const std::vector<DirEntry> lighttpd = ParseOk(kLighttpd);
  const std::vector<DirEntry> expected = {
      Dir("docs", k22Nov2026At1958 + 7),
      File("notes.txt", std::nullopt, k22Nov2026At1958 + 7, 1536),
  };
  EXPECT_EQ(lighttpd, expected);
  EXPECT_EQ(Names(ParseOk(kPython)), (std::vector<std::string>{"docs/", "notes.txt", "it's.txt"}));
}

TEST(AutoindexTest, SkipsParentSortExternalAndDeeperLinks) {
  const char html[] =
      "<html><body><pre>\n"
      "<a href=\"../\">../</a>\n"
      "<a href=\"..\">..</a>\n"
      "<a href=\"./\">.</a>\n"
      "<a href=\"/\">Parent Directory</a>\n"
      "<a href=\"?C=N;O=D\">Name</a>\n"
      "<a href=\"#top\">top</a>\n"
      "<a href=\"file.txt?download=1\">with query</a>\n"
      "<a href=\"http://other.example/x.txt\">elsewhere</a>\n"
      "<a href=\"//other.example/x.txt\">elsewhere too</a>\n"
      "<a href=\"mailto:admin@example.org\">mail</a>\n"
      "<a href=\"sub/deeper.txt\">deeper</a>\n"
      "<a href=\"sub/deeper/\">deeper dir</a>\n"
      "<a>no href</a>\n"
      "<a name=\"anchor\">anchor</a>\n"
      "<abbr href=\"nope.txt\">not a link</abbr>\n"
      "<A HREF='kept.txt'>kept</A>  22-Nov-2026 19:58   10\n"
      "<a href=./also-kept.txt>also kept</a>\n"
      "</pre></body></html>\n";
  EXPECT_EQ(Names(ParseOk(html)), (std::vector<std::string>{"kept.txt", "also-kept.txt"}));
}

TEST(AutoindexTest, RejectsNamesThatLeaveTheDirectory) {
  const char html[] =
      "<html><body><pre>\n"
      "<a href=\"%2e%2e/\">dotdot</a>\n"
      "<a href=\"%2E%2E\">dotdot file</a>\n"
      "<a href=\"%2e\">dot</a>\n"
      "<a href=\"a%2Fb.txt\">slash</a>\n"
      "<a href=\"..%2F..%2Fetc%2Fpasswd\">passwd</a>\n"
      "<a href=\"nul%00.txt\">nul</a>\n"
      "<a href=\"\">empty</a>\n"
      "<a href=\"%\">lone percent</a>\n"
      "<a href=\"a..b.txt\">dots inside are fine</a>\n"
      "</pre></body></html>\n";
  EXPECT_EQ(Names(ParseOk(html)), (std::vector<std::string>{"%", "a..b.txt"}));
}

TEST(AutoindexTest, AbsoluteLinksCountOnlyInsideTheGivenDirectory) {
  const char html[] =
      "<html><body><ul>\n"
      "<li><a href=\"/pub/\">Parent Directory</a></li>\n"
      "<li><a href=\"/pub/dir/\">this directory</a></li>\n"
      "<li><a href=\"/pub/dir/abs.txt\">abs.txt</a></li>\n"
      "<li><a href=\"/pub/dir/My%20Docs/\">My Docs/</a></li>\n"
      "<li><a href=\"/pub/dir/sub/deep.txt\">deep</a></li>\n"
      "<li><a href=\"/pub/other/x.txt\">other dir</a></li>\n"
      "<li><a href=\"HTTP://Example.org:8080/pub/dir/full.txt\">full URL</a></li>\n"
      "<li><a href=\"http://example.org:9999/pub/dir/port.txt\">other port</a></li>\n"
      "<li><a href=\"https://example.org:8080/pub/dir/scheme.txt\">other scheme</a></li>\n"
      "<li><a href=\"//example.org:8080/pub/dir/netpath.txt\">network path</a></li>\n"
      "<li><a href=\"rel.txt\">rel</a></li>\n"
      "</ul></body></html>\n";
  EXPECT_EQ(
      Names(ParseOk(html, "http://example.org:8080/pub/dir/")),
      (std::vector<std::string>{"abs.txt", "My Docs/", "full.txt", "netpath.txt", "rel.txt"}));
  // Without the directory's URL, only relative links are trusted.
  EXPECT_EQ(Names(ParseOk(html)), (std::vector<std::string>{"rel.txt"}));
  // The directory URL may be given without its trailing slash, or percent-encoded.
  EXPECT_EQ(Names(ParseOk("<ul><li><a href=\"/a%20b/x\">x</a></li></ul>", "http://h/a b")),
            (std::vector<std::string>{"x"}));
}

TEST(AutoindexTest, DecodesEntitiesAndPercentEscapesInHrefs) {
  const char html[] =
      "<html><pre>"
      "<a href=\"Tom&amp;Jerry.txt\">x</a>\n"
      "<a href=\"caf&#233;.txt\">x</a>\n"
      "<a href=\"snow&#x2603;.txt\">x</a>\n"
      "<a href=\"%E2%82%AC.txt\">x</a>\n"
      "<a href=\"bad&#xZZ;.txt\">a malformed reference's '#' starts a fragment</a>\n"
      "<a href=\"AT&T.txt\">bare ampersand</a>\n"
      "</pre></html>";
  EXPECT_EQ(Names(ParseOk(html)),
            (std::vector<std::string>{"Tom&Jerry.txt", "caf\xc3\xa9.txt", "snow\xe2\x98\x83.txt",
                                      "\xe2\x82\xac.txt", "AT&T.txt"}));
  EXPECT_EQ(PercentDecode("a%20b%zz%4"), "a b%zz%4");
  EXPECT_EQ(DecodeHtmlEntities("&lt;&gt;&quot;&apos;&#39;&unknown;&"), "<>\"''&unknown;&");
}

TEST(AutoindexTest, MalformedDatesAndSizesAreLeftUnset) {
  const char html[] =
      "<html><pre>"
      "<a href=\"a.txt\">a</a>  31-Feb-2026 19:58   12\n"
      "<a href=\"b.txt\">b</a>  22-Nov-2026 25:61   12\n"
      "<a href=\"c.txt\">c</a>  22-Foo-2026 19:58   12\n"
      "<a href=\"d.txt\">d</a>  22-Nov-2026 19:58   12Q\n"
      "<a href=\"e.txt\">e</a>  22-Nov-2026 19:58   99999999999999999999999\n"
      "<a href=\"f.txt\">f</a>  22-Nov-2026 19:58   9999999999P\n"
      "</pre></html>";
  const std::vector<DirEntry> entries = ParseOk(html);
  ASSERT_EQ(entries.size(), 6u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_FALSE(entries[i].mtime_unix.has_value()) << entries[i].name;
    EXPECT_FALSE(entries[i].size.has_value()) << entries[i].name;  // size follows the date
  }
  for (int i = 3; i < 6; ++i) {
    EXPECT_EQ(entries[i].mtime_unix, k22Nov2026At1958) << entries[i].name;
    EXPECT_FALSE(entries[i].size.has_value()) << entries[i].name;
    EXPECT_FALSE(entries[i].approximate_size.has_value()) << entries[i].name;
  }
}

TEST(AutoindexTest, NonHtmlInputIsInvalidArgument) {
  using namespace std::string_literals;
  for (const std::string& input :
       {""s, "plain text, no markup at all\n"s, "{\"json\": [1, 2, 3]}"s,
        "\x89PNG\r\n\x1a\n\0\0\0\rIHDR"s, "<html>\0<a href=\"x\">x</a>"s}) {
    Result<std::vector<DirEntry>> r = ParseAutoindex(input);
    ASSERT_FALSE(r.ok()) << testing::PrintToString(input);
    EXPECT_EQ(r.status().code(), Status::Code::kInvalidArgument);
    EXPECT_EQ(r.status().message(), "not an HTML directory listing");
  }
  // HTML without entries is a listing of an empty directory.
  Result<std::vector<DirEntry>> empty =
      ParseAutoindex("<html><body><pre><a href=\"../\">../</a></pre></body></html>");
  ASSERT_TRUE(empty.ok());
  EXPECT_TRUE(empty->empty());
}

TEST(AutoindexTest, SurvivesTruncationAtEveryByte) {
  for (const std::string& sample : kAllSamples) {
    // The whole sample lists entries; a cut one lists a subset of their names, or is refused.
    const std::vector<DirEntry> full = ParseOk(sample);
    ASSERT_FALSE(full.empty());
    std::set<std::string> names;
    for (const DirEntry& e : full) names.insert(e.name);
    for (std::size_t n = 0; n <= sample.size(); ++n) {
      Result<std::vector<DirEntry>> r = ParseAutoindex(std::string_view(sample).substr(0, n));
      if (!r.ok()) {
        EXPECT_EQ(r.status().code(), Status::Code::kInvalidArgument);
        continue;
      }
      for (const DirEntry& e : *r) {
        EXPECT_TRUE(names.contains(e.name)) << "cut at " << n << " of " << sample.size() << ": \"" << e.name << "\"";
      }
    }
  }
}

TEST(AutoindexTest, SurvivesRandomMutations) {
  std::mt19937_64 rng(20261122);
  auto pick = [&](std::size_t n) { return n == 0 ? 0 : static_cast<std::size_t>(rng() % n); };
  const std::string specials = "<>\"'&;%#/?=-: \n\r\t.0123456789KMG";
  int ok = 0;
  for (int iter = 0; iter < 4000; ++iter) {
    std::string s = kAllSamples[pick(kAllSamples.size())];
    const int edits = 1 + static_cast<int>(pick(8));
    for (int e = 0; e < edits; ++e) {
      const std::size_t at = pick(s.size() + 1);
      switch (pick(6)) {
        case 0:  // flip a byte to anything
          if (!s.empty()) s[pick(s.size())] = static_cast<char>(rng());
          break;
        case 1:  // a markup-ish byte
          s.insert(s.begin() + static_cast<std::ptrdiff_t>(at), specials[pick(specials.size())]);
          break;
        case 2:  // delete a run
          s.erase(at, pick(40));
          break;
        case 3:  // duplicate a run elsewhere
          if (!s.empty()) s.insert(pick(s.size()), s.substr(pick(s.size()), pick(80)));
          break;
        case 4:  // truncate
          s.resize(at);
          break;
        default:  // random bytes
          for (std::size_t k = pick(16); k > 0; --k) {
            s.insert(s.begin() + static_cast<std::ptrdiff_t>(pick(s.size() + 1)),
                     static_cast<char>(rng()));
          }
      }
    }
    Result<std::vector<DirEntry>> r = ParseAutoindex(s, "http://example.org/pub/");
    if (!r.ok()) {
      EXPECT_EQ(r.status().code(), Status::Code::kInvalidArgument);
      continue;
    }
    ++ok;
    for (const DirEntry& entry : *r) {
      EXPECT_FALSE(entry.name.empty());
      EXPECT_NE(entry.name, ".");
      EXPECT_NE(entry.name, "..");
      EXPECT_EQ(entry.name.find('/'), std::string::npos);
      EXPECT_EQ(entry.name.find('\0'), std::string::npos);
      EXPECT_FALSE(entry.size && entry.approximate_size);
      EXPECT_FALSE(entry.is_dir && (entry.size || entry.approximate_size));
    }
  }
  EXPECT_GT(ok, 1000);  // most mutants are still HTML and were really parsed
  // Pure noise.
  for (int iter = 0; iter < 500; ++iter) {
    std::string noise(pick(2048), '\0');
    for (char& c : noise) c = static_cast<char>(rng());
    (void)ParseAutoindex(noise);
  }
}

}  // namespace
// A site's own index.html (what most directory URLs serve) is not a listing of the
// directory: its links are some names, and index.html itself is not among them.
const char kSitePage[] =
    "<!DOCTYPE html>\n<html lang=\"en\">\n<head><meta charset=\"utf-8\">\n"
    "<title>Example Site - Home</title></head>\n<body>\n<h1>Welcome</h1>\n"
    "<p>See the <a href=\"about.html\">about page</a>, the <a href=\"blog/\">blog</a> and "
    "<a href=\"downloads\">downloads</a>. Index of our projects below.</p>\n"
    "<img src=\"img/logo.png\">\n</body>\n</html>\n";

TEST(AutoindexTest, ServerListingsClassifyAsAutoindex) {
  for (const char* sample : {kNginx, kNginxApproximate, kApachePlain, kApacheFancyPre, kApacheTable,
                             kLighttpd, kPython}) {
    EXPECT_EQ(ClassifyListing(sample), ListingKind::kAutoindex) << sample;
  }
  EXPECT_EQ(ListingKindName(ListingKind::kAutoindex), "autoindex");
}

TEST(AutoindexTest, OrdinaryPagesClassifyAsPage) {
  EXPECT_EQ(ClassifyListing(kSitePage), ListingKind::kPage);
  // "Index of" in the body text, not in the title or first heading.
  EXPECT_EQ(ClassifyListing("<html><head><title>Docs</title></head><body><p>Index of terms</p>"
                            "<a href=\"a.html\">a</a></body></html>"),
            ListingKind::kPage);
  EXPECT_EQ(ClassifyListing(""), ListingKind::kPage);
  EXPECT_EQ(ListingKindName(ListingKind::kPage), "page");
}

TEST(AutoindexTest, PageAnswerIsThePageFileAndTheNamesItLinksTo) {
  const std::string page =
      "<html><head><title>Home</title><link rel=\"stylesheet\" href=\"css/site.css\"></head><body>"
      "<a href=\"about.html\">About</a> <a href='blog/'>Blog</a> <a href=\"downloads\">Get</a>"
      "<a href=\"/docs/manual/index.html\">Manual</a> <a href=\"http://127.0.0.1:8080/news.html?x=1\">N</a>"
      "<a href=\"https://elsewhere.example/x.html\">x</a> <a href=\"mailto:me@example.org\">me</a>"
      "<a href=\"#top\">top</a> <a href=\"../up.html\">up</a> <img src=\"img/logo.png\">"
      "<a href=\"about.html#team\">again</a> <a href=\"index.html\">home</a></body></html>";
  Result<DirectoryAnswer> a = ReadDirectoryAnswer(page, "http://127.0.0.1:8080/", 1795377480);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_EQ(a->kind, ListingKind::kPage);
  ASSERT_FALSE(a->entries.empty());
  EXPECT_EQ(a->entries[0].name, "index.html");
  EXPECT_EQ(a->entries[0].size, std::optional<Bytes>(page.size()));
  EXPECT_EQ(a->entries[0].mtime_unix, std::optional<std::int64_t>(1795377480));
  std::vector<std::pair<std::string, bool>> got;
  for (const DirEntry& e : a->entries) got.emplace_back(e.name, e.is_dir);
  const std::vector<std::pair<std::string, bool>> want = {
      {"index.html", false}, {"css", true},  {"about.html", false}, {"blog", true},
      {"downloads", false},  {"docs", true}, {"news.html", false},  {"img", true}};
  EXPECT_EQ(got, want);
}

TEST(AutoindexTest, AutoindexAnswerIsItsEntries) {
  Result<DirectoryAnswer> a = ReadDirectoryAnswer(kNginx, "", std::nullopt);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->kind, ListingKind::kAutoindex);
  EXPECT_EQ(a->entries, ParseOk(kNginx));
}

}  // namespace ghost
