// Autoindex: reads an HTML directory listing from an HTTP origin into directory entries, so an
// HTTP origin's tree appears as directories in the mount (DESIGN §4.1).
//
// Formats understood (each sample is in tests/common/http/autoindex_test.cc):
//   - nginx `autoindex on;` (HTML): a <pre> of `<a href="name">name</a>   22-Nov-2026 19:58
//     1234` lines; the size is bytes, "-" for directories, or "1K"/"12M" with
//     `autoindex_exact_size off;`.
//   - Apache mod_autoindex, plain (a <ul> of links, no sizes or dates), FancyIndexing in a
//     <pre> and FancyIndexing with HTMLTable; dates `2026-11-22 19:58` (2.4) or
//     `22-Nov-2026 19:58` (2.2); sizes "-", "512", "1.2K", "3M".
//   - Anything similar: lighttpd's table (`2026-Nov-22 19:58:00`, "1.2K"), Python's
//     http.server list.
// An entry is an <a href> that names a direct child of the directory: a relative href with one
// path segment ("name" or "name/"; the slash marks a directory). Skipped: the parent ("../",
// "/", "Parent Directory"), sort links ("?C=N;O=D"), fragments, hrefs with a query, links to
// other hosts or deeper paths, and, after percent-decoding, names that are empty, "." or "..",
// or that contain "/" or NUL (a listing must not lead outside its directory). An absolute
// href (path or URL) is accepted only when `directory_url` is given and the href is a direct
// child of it. A name listed twice (Apache's IconsAreLinks) is one entry.
//
// The date and size come from the text after the link on the same line (or table row). Dates
// are taken as UTC (nginx's default; Apache prints server local time, which the listing does
// not say). A rounded size ("1.2K", "3M", powers of 1024) is approximate: `size` stays
// nullopt, so the caller knows a HEAD is needed for the exact size, and `approximate_size`
// holds the estimate.
//
// Robust to any bytes: malformed markup yields fewer entries, never a crash.
//
// Thread-safety: pure functions.
#ifndef GHOST_COMMON_HTTP_AUTOINDEX_H_
#define GHOST_COMMON_HTTP_AUTOINDEX_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/base/status.h"
#include "common/base/units.h"

namespace ghost {

struct DirEntry {
  std::string name;  // one path segment, percent-decoded
  bool is_dir = false;
  std::optional<Bytes> size;              // exact size in bytes, when the listing says it
  std::optional<Bytes> approximate_size;  // a rounded size ("1.2K"); size is then nullopt
  std::optional<std::int64_t> mtime_unix;

  bool operator==(const DirEntry&) const = default;
};

// Parses the listing `html` of the directory at `directory_url` (e.g.
// "http://host:8080/pub/dir/"; may be empty: then only relative hrefs count). Entries are in
// listing order. Returns InvalidArgument("not an HTML directory listing") when the input is
// not HTML (no HTML markup, or NUL bytes). An HTML page with no entries gives an empty vector.
Result<std::vector<DirEntry>> ParseAutoindex(std::string_view html,
                                             std::string_view directory_url = {});

// What a directory URL answered with: a server's generated listing of the directory
// (complete), or an ordinary page (an index.html) whose links are only some of its names.
enum class ListingKind { kAutoindex, kPage };

// Tells the listings that nginx (`autoindex on;`), Apache mod_autoindex, lighttpd's
// dir-listing and Python's http.server generate — a <title> or first heading "Index of /..."
// or "Directory listing for /..." — from any other HTML page. Pure, any bytes.
ListingKind ClassifyListing(std::string_view html);

// "page" or "autoindex", as user.ghost.listing shows it.
std::string_view ListingKindName(ListingKind kind);

// The file name under which a directory shows the page its URL serves (ListingKind::kPage).
inline constexpr std::string_view kDirectoryPageName = "index.html";

// What a directory URL's answer shows of the directory.
struct DirectoryAnswer {
  ListingKind kind = ListingKind::kAutoindex;
  std::vector<DirEntry> entries;
};

// Reads the answer `html` of `directory_url` (see ParseAutoindex). An autoindex gives its
// entries. An ordinary page gives, first, the page itself as the file kDirectoryPageName
// (html.size() bytes, modified at `page_mtime`, the answer's Last-Modified), then the names
// its links (<a href>, <img src>, <link href>, <script src>) lead to inside the directory:
// the first path segment of each relative or same-directory link, a directory when the link
// goes deeper or ends in '/'. Those are names seen, not the whole directory: a caller asks the
// origin about any other name, and about whether a slash-less link is a file or a directory.
// InvalidArgument as ParseAutoindex for input that is not HTML.
Result<DirectoryAnswer> ReadDirectoryAnswer(std::string_view html, std::string_view directory_url,
                                            std::optional<std::int64_t> page_mtime);

// Percent-decodes `text` ("%20" → " "); a '%' not followed by two hex digits stays as is.
std::string PercentDecode(std::string_view text);

// Decodes the HTML character references that listings use (&amp; &lt; &gt; &quot; &apos;
// &#39; &nbsp; and numeric &#NN; &#xHH;); unknown or malformed references stay as is.
std::string DecodeHtmlEntities(std::string_view text);

}  // namespace ghost

#endif  // GHOST_COMMON_HTTP_AUTOINDEX_H_
