#include "common/http/autoindex.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <map>

#include "common/http/http_message.h"

namespace ghost {
namespace {

constexpr std::array<std::string_view, 12> kMonths = {"jan", "feb", "mar", "apr", "may", "jun",
                                                      "jul", "aug", "sep", "oct", "nov", "dec"};

char Lower(char c) { return (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c; }
bool IsSpace(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n' || c == '\f'; }
bool IsDigit(char c) { return c >= '0' && c <= '9'; }
bool IsAlpha(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

std::string ToLower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = Lower(c);
  return out;
}

void AppendUtf8(std::string* out, std::uint32_t cp) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

// Finds `needle` (lower case) in `lower` from `from` where it is followed by a blank or '>'
// (so "<a" does not match "<abbr"). npos if none.
std::size_t FindTag(const std::string& lower, std::string_view needle, std::size_t from) {
  while (from < lower.size()) {
    std::size_t at = lower.find(needle, from);
    if (at == std::string::npos) return std::string::npos;
    const std::size_t after = at + needle.size();
    if (after >= lower.size() || IsSpace(lower[after]) || lower[after] == '>') return at;
    from = at + 1;
  }
  return std::string::npos;
}

// Reads the attributes of a tag starting after its name at `i`, up to and past its '>'.
// Sets *href to the first href value (raw). Returns the position after '>' or npos.
std::size_t ReadAttributes(std::string_view html, std::size_t i, std::optional<std::string>* href) {
  const std::size_t n = html.size();
  while (i < n) {
    while (i < n && IsSpace(html[i])) ++i;
    if (i >= n) return std::string_view::npos;
    if (html[i] == '>') return i + 1;
    if (html[i] == '/') {  // "<a/>" or stray slash
      ++i;
      continue;
    }
    const std::size_t name_start = i;
    while (i < n && !IsSpace(html[i]) && html[i] != '=' && html[i] != '>') ++i;
    const std::string_view name = html.substr(name_start, i - name_start);
    while (i < n && IsSpace(html[i])) ++i;
    if (i >= n || html[i] != '=') continue;  // attribute without a value
    ++i;
    while (i < n && IsSpace(html[i])) ++i;
    if (i >= n) return std::string_view::npos;
    std::string_view value;
    if (html[i] == '"' || html[i] == '\'') {
      const char quote = html[i++];
      const std::size_t end = html.find(quote, i);
      if (end == std::string_view::npos) return std::string_view::npos;
      value = html.substr(i, end - i);
      i = end + 1;
    } else {
      const std::size_t start = i;
      while (i < n && !IsSpace(html[i]) && html[i] != '>') ++i;
      value = html.substr(start, i - start);
    }
    if (!href->has_value() && EqualsIgnoreCase(name, "href")) *href = std::string(value);
  }
  return std::string_view::npos;
}

// The text of `html` with tags replaced by spaces and character references decoded.
std::string VisibleText(std::string_view html) {
  std::string text;
  std::size_t i = 0;
  while (i < html.size()) {
    if (html[i] == '<') {
      const std::size_t close = html.find('>', i);
      if (close == std::string_view::npos) break;
      text.push_back(' ');
      i = close + 1;
    } else {
      text.push_back(html[i++]);
    }
  }
  return DecodeHtmlEntities(text);
}

std::vector<std::string_view> Tokens(std::string_view text) {
  std::vector<std::string_view> out;
  std::size_t i = 0;
  auto blank_at = [&](std::size_t k) -> std::size_t {  // length of a blank at k, or 0
    if (IsSpace(text[k])) return 1;
    if (static_cast<unsigned char>(text[k]) == 0xC2 && k + 1 < text.size() &&
        static_cast<unsigned char>(text[k + 1]) == 0xA0) {
      return 2;  // U+00A0 (&nbsp;)
    }
    return 0;
  };
  while (i < text.size()) {
    while (i < text.size() && blank_at(i) > 0) i += blank_at(i);
    const std::size_t start = i;
    while (i < text.size() && blank_at(i) == 0) ++i;
    if (i > start) out.push_back(text.substr(start, i - start));
  }
  return out;
}

std::optional<int> ParseInt(std::string_view s, std::size_t min_len, std::size_t max_len) {
  if (s.size() < min_len || s.size() > max_len) return std::nullopt;
  int v = 0;
  for (char c : s) {
    if (!IsDigit(c)) return std::nullopt;
    v = v * 10 + (c - '0');
  }
  return v;
}

std::optional<int> ParseMonth(std::string_view s) {
  if (s.size() != 3) return std::nullopt;
  const std::string lower = ToLower(s);
  for (std::size_t k = 0; k < kMonths.size(); ++k) {
    if (lower == kMonths[k]) return static_cast<int>(k) + 1;
  }
  return std::nullopt;
}

// A listing date: "22-Nov-2026" (nginx, Apache 2.2), "2026-11-22" (Apache 2.4) or
// "2026-Nov-22" (lighttpd), with a time "19:58" or "19:58:07". Unix seconds (UTC).
std::optional<std::int64_t> ParseListingDate(std::string_view date, std::string_view time) {
  const std::size_t d1 = date.find('-');
  if (d1 == std::string_view::npos) return std::nullopt;
  const std::size_t d2 = date.find('-', d1 + 1);
  if (d2 == std::string_view::npos) return std::nullopt;
  const std::string_view a = date.substr(0, d1);
  const std::string_view b = date.substr(d1 + 1, d2 - d1 - 1);
  const std::string_view c = date.substr(d2 + 1);
  std::optional<int> year, month, day;
  if (a.size() == 4) {  // year first
    year = ParseInt(a, 4, 4);
    month = ParseMonth(b);
    if (!month) month = ParseInt(b, 1, 2);
    day = ParseInt(c, 1, 2);
  } else {
    day = ParseInt(a, 1, 2);
    month = ParseMonth(b);
    year = ParseInt(c, 4, 4);
  }
  if (!year || !month || !day) return std::nullopt;

  const std::size_t t1 = time.find(':');
  if (t1 == std::string_view::npos) return std::nullopt;
  const std::size_t t2 = time.find(':', t1 + 1);
  std::optional<int> hour = ParseInt(time.substr(0, t1), 1, 2);
  std::optional<int> minute = ParseInt(
      time.substr(t1 + 1, t2 == std::string_view::npos ? std::string_view::npos : t2 - t1 - 1), 2,
      2);
  std::optional<int> second = 0;
  if (t2 != std::string_view::npos) second = ParseInt(time.substr(t2 + 1), 2, 2);
  if (!hour || !minute || !second || *hour > 23 || *minute > 59 || *second > 60) {
    return std::nullopt;
  }
  using namespace std::chrono;
  const year_month_day ymd{std::chrono::year{*year},
                           std::chrono::month{static_cast<unsigned>(*month)},
                           std::chrono::day{static_cast<unsigned>(*day)}};
  if (!ymd.ok()) return std::nullopt;
  const std::int64_t days = sys_days{ymd}.time_since_epoch().count();
  return days * 86400 + *hour * 3600 + *minute * 60 + *second;
}

// A size column: exact bytes ("1234") or a rounded size ("1.2K", "3M", "1G"; powers of 1024).
struct ListingSize {
  std::optional<Bytes> exact;
  std::optional<Bytes> approximate;
};

ListingSize ParseListingSize(std::string_view s) {
  ListingSize out;
  if (std::optional<Bytes> n = ParseDecimal(s)) {
    out.exact = n;
    return out;
  }
  if (s.size() < 2 || s.size() > 24) return out;
  char unit = Lower(s.back());
  std::string_view number = s.substr(0, s.size() - 1);
  // Tolerate "KB"/"KiB"-style suffixes too.
  if (unit == 'b' && s.size() >= 3) {
    number = s.substr(0, s.size() - 2);
    unit = Lower(s[s.size() - 2]);
    if (unit == 'i' && s.size() >= 4) {
      number = s.substr(0, s.size() - 3);
      unit = Lower(s[s.size() - 3]);
    }
  }
  int power = 0;
  switch (unit) {
    case 'k':
      power = 1;
      break;
    case 'm':
      power = 2;
      break;
    case 'g':
      power = 3;
      break;
    case 't':
      power = 4;
      break;
    case 'p':
      power = 5;
      break;
    default:
      return out;
  }
  // number: digits, optionally one '.' and more digits.
  double value = 0;
  double scale = 0;  // 0 before the point, then 0.1, 0.01, ...
  bool digits = false;
  for (char c : number) {
    if (IsDigit(c)) {
      digits = true;
      if (scale == 0) {
        value = value * 10 + (c - '0');
      } else {
        value += (c - '0') * scale;
        scale /= 10;
      }
    } else if (c == '.' && scale == 0) {
      scale = 0.1;
    } else {
      return out;
    }
  }
  if (!digits) return out;
  const double bytes = value * std::pow(1024.0, power);
  if (!(bytes < 9.0e18)) return out;
  out.approximate = static_cast<Bytes>(std::llround(bytes));
  return out;
}

struct RowFacts {
  std::optional<std::int64_t> mtime;
  ListingSize size;
};

// Finds "date time [size]" in the text after a link.
RowFacts ParseRow(std::string_view row_html) {
  RowFacts facts;
  const std::string text = VisibleText(row_html);
  const std::vector<std::string_view> tokens = Tokens(text);
  for (std::size_t k = 0; k + 1 < tokens.size(); ++k) {
    std::optional<std::int64_t> t = ParseListingDate(tokens[k], tokens[k + 1]);
    if (!t) continue;
    facts.mtime = t;
    if (k + 2 < tokens.size()) facts.size = ParseListingSize(tokens[k + 2]);
    break;
  }
  return facts;
}

// scheme://authority of an absolute URL, lower-cased, and the rest (path...). False if `url`
// is not absolute.
bool SplitAbsolute(std::string_view url, std::string* origin, std::string_view* rest) {
  std::size_t i = 0;
  while (i < url.size() && (IsAlpha(url[i]) || (i > 0 && (IsDigit(url[i]) || url[i] == '+' ||
                                                          url[i] == '-' || url[i] == '.')))) {
    ++i;
  }
  if (i == 0 || i + 2 >= url.size() || url.substr(i, 3) != "://") return false;
  std::size_t end = url.find('/', i + 3);
  if (end == std::string_view::npos) end = url.size();
  *origin = ToLower(url.substr(0, end));
  *rest = url.substr(end);
  return true;
}

bool HasScheme(std::string_view href) {
  std::size_t i = 0;
  while (i < href.size() && (IsAlpha(href[i]) || (i > 0 && (IsDigit(href[i]) || href[i] == '+' ||
                                                            href[i] == '-' || href[i] == '.')))) {
    ++i;
  }
  return i > 0 && i < href.size() && href[i] == ':';
}

// Path segments of `path` (without the leading '/', the trailing '/' and the query),
// each percent-decoded.
std::vector<std::string> DecodedSegments(std::string_view path) {
  std::vector<std::string> out;
  if (!path.empty() && path.front() == '/') path.remove_prefix(1);
  if (!path.empty() && path.back() == '/') path.remove_suffix(1);
  if (path.empty()) return out;
  std::size_t i = 0;
  while (true) {
    const std::size_t slash = path.find('/', i);
    out.push_back(
        PercentDecode(path.substr(i, slash == std::string_view::npos ? path.npos : slash - i)));
    if (slash == std::string_view::npos) break;
    i = slash + 1;
  }
  return out;
}

// The directory the listing describes, for absolute hrefs.
struct Directory {
  bool known = false;
  std::string origin;                 // "http://host:port", lower case
  std::vector<std::string> segments;  // decoded path segments
};

Directory ParseDirectoryUrl(std::string_view url) {
  Directory d;
  std::string_view rest;
  if (!SplitAbsolute(url, &d.origin, &rest)) return d;
  const std::size_t q = rest.find_first_of("?#");
  if (q != std::string_view::npos) rest = rest.substr(0, q);
  d.segments = DecodedSegments(rest);
  d.known = true;
  return d;
}

// The entry an href names, if it is a direct child of the directory.
std::optional<DirEntry> EntryFor(std::string_view raw_href, const Directory& dir) {
  const std::string decoded_href = DecodeHtmlEntities(raw_href);
  std::string_view href = TrimBlanks(decoded_href);
  if (href.empty() || href.find_first_of("?#") != std::string_view::npos) return std::nullopt;

  std::string path;  // an absolute href's path, or the relative reference
  bool absolute = true;
  std::string origin;
  std::string_view rest;
  if (href.substr(0, 2) == "//") {  // network-path reference: the directory's scheme
    if (!dir.known) return std::nullopt;
    const std::string full = dir.origin.substr(0, dir.origin.find(':') + 1) + std::string(href);
    if (!SplitAbsolute(full, &origin, &rest) || origin != dir.origin) return std::nullopt;
    path = std::string(rest);
  } else if (HasScheme(href)) {
    if (!dir.known || !SplitAbsolute(href, &origin, &rest) || origin != dir.origin) {
      return std::nullopt;
    }
    path = std::string(rest);
  } else if (href.front() == '/') {
    if (!dir.known) return std::nullopt;
    path = std::string(href);
  } else {
    absolute = false;
    while (href.substr(0, 2) == "./") href.remove_prefix(2);
    path = std::string(href);
  }

  DirEntry e;
  e.is_dir = !path.empty() && path.back() == '/';
  if (absolute) {
    const std::vector<std::string> segments = DecodedSegments(path);
    if (segments.size() != dir.segments.size() + 1 ||
        !std::equal(dir.segments.begin(), dir.segments.end(), segments.begin())) {
      return std::nullopt;
    }
    e.name = segments.back();
  } else {
    std::string_view segment = path;
    if (e.is_dir) segment.remove_suffix(1);
    if (segment.empty() || segment.find('/') != std::string_view::npos) return std::nullopt;
    e.name = PercentDecode(segment);
  }
  return e;
}

bool ValidName(const std::string& name) {
  return !name.empty() && name != "." && name != ".." && name.find('/') == std::string::npos &&
         name.find('\0') == std::string::npos;
}

bool LooksLikeHtml(std::string_view html, const std::string& lower) {
  if (html.find('\0') != std::string_view::npos) return false;
  for (std::string_view marker : {"<!doctype html", "<html", "<body", "<pre", "<table", "<ul"}) {
    if (lower.find(marker) != std::string::npos) return true;
  }
  return FindTag(lower, "<a", 0) != std::string::npos;
}

}  // namespace

std::string PercentDecode(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (std::size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '%' && i + 2 < text.size() && HexValue(text[i + 1]) >= 0 &&
        HexValue(text[i + 2]) >= 0) {
      out.push_back(static_cast<char>(HexValue(text[i + 1]) * 16 + HexValue(text[i + 2])));
      i += 2;
    } else {
      out.push_back(text[i]);
    }
  }
  return out;
}

std::string DecodeHtmlEntities(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  std::size_t i = 0;
  while (i < text.size()) {
    if (text[i] != '&') {
      out.push_back(text[i++]);
      continue;
    }
    const std::size_t semi = text.find(';', i + 1);
    if (semi == std::string_view::npos || semi - i > 12) {
      out.push_back(text[i++]);
      continue;
    }
    const std::string_view ref = text.substr(i + 1, semi - i - 1);
    bool decoded = true;
    if (ref == "amp") {
      out.push_back('&');
    } else if (ref == "lt") {
      out.push_back('<');
    } else if (ref == "gt") {
      out.push_back('>');
    } else if (ref == "quot") {
      out.push_back('"');
    } else if (ref == "apos") {
      out.push_back('\'');
    } else if (ref == "nbsp") {
      AppendUtf8(&out, 0xA0);
    } else if (ref.size() >= 2 && ref[0] == '#') {
      std::uint32_t cp = 0;
      const bool hex = ref[1] == 'x' || ref[1] == 'X';
      const std::string_view digits = ref.substr(hex ? 2 : 1);
      decoded = !digits.empty();
      for (char c : digits) {
        const int v = hex ? HexValue(c) : (IsDigit(c) ? c - '0' : -1);
        if (v < 0 || cp > 0x10FFFF) {
          decoded = false;
          break;
        }
        cp = cp * (hex ? 16 : 10) + static_cast<std::uint32_t>(v);
      }
      if (decoded && (cp == 0 || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))) decoded = false;
      if (decoded) AppendUtf8(&out, cp);
    } else {
      decoded = false;
    }
    if (decoded) {
      i = semi + 1;
    } else {
      out.push_back(text[i++]);
    }
  }
  return out;
}

Result<std::vector<DirEntry>> ParseAutoindex(std::string_view html,
                                             std::string_view directory_url) {
  const std::string lower = ToLower(html);
  if (!LooksLikeHtml(html, lower)) {
    return Status::InvalidArgument("not an HTML directory listing");
  }
  const Directory dir = ParseDirectoryUrl(directory_url);

  std::vector<DirEntry> entries;
  std::map<std::string, std::size_t> index;  // name → position in entries
  std::size_t pos = 0;
  while (true) {
    const std::size_t open = FindTag(lower, "<a", pos);
    if (open == std::string::npos) break;
    std::optional<std::string> href;
    const std::size_t body = ReadAttributes(html, open + 2, &href);
    if (body == std::string_view::npos) break;  // unterminated tag: nothing more to read
    pos = body;
    if (!href) continue;

    std::optional<DirEntry> entry = EntryFor(*href, dir);
    if (!entry || !ValidName(entry->name)) continue;

    // The row: from the end of this link to the end of its line or table row, or the next
    // link, whichever comes first.
    // (An unclosed link's row starts right after its start tag.)
    const std::size_t next_link = FindTag(lower, "<a", body);
    const std::size_t close = FindTag(lower, "</a", body);
    std::size_t row_start = body;
    if (close != std::string::npos && (next_link == std::string::npos || close < next_link)) {
      const std::size_t gt = lower.find('>', close);
      row_start = gt == std::string::npos ? html.size() : gt + 1;
    }
    std::size_t row_end = html.size();
    for (std::size_t cut : {lower.find('\n', row_start), lower.find("</tr", row_start),
                            FindTag(lower, "<a", row_start)}) {
      if (cut != std::string::npos && cut < row_end) row_end = cut;
    }
    const RowFacts facts = ParseRow(html.substr(row_start, row_end - row_start));
    if (!entry->is_dir) {
      entry->size = facts.size.exact;
      entry->approximate_size = facts.size.approximate;
    }
    entry->mtime_unix = facts.mtime;

    auto [it, inserted] = index.emplace(entry->name, entries.size());
    if (inserted) {
      entries.push_back(std::move(*entry));
    } else {
      DirEntry& first = entries[it->second];
      if (!first.size && !first.approximate_size) {
        first.size = entry->size;
        first.approximate_size = entry->approximate_size;
      }
      if (!first.mtime_unix) first.mtime_unix = entry->mtime_unix;
    }
  }
  return entries;
}

ListingKind ClassifyListing(std::string_view html) {
  // The generated listings say so at the top: look at the head and the first heading only,
  // so a page that merely mentions "Index of" in its text stays a page.
  const std::string lower = ToLower(html.substr(0, 8192));
  for (std::string_view tag : {"<title", "<h1", "<h2"}) {
    std::size_t at = FindTag(lower, tag, 0);
    if (at == std::string::npos) continue;
    std::size_t gt = lower.find('>', at);
    if (gt == std::string::npos) continue;
    std::size_t text = gt + 1;
    while (text < lower.size() && IsSpace(lower[text])) ++text;
    std::string_view rest = std::string_view(lower).substr(text);
    if (rest.starts_with("index of ") || rest.starts_with("directory listing for ")) {
      return ListingKind::kAutoindex;
    }
  }
  return ListingKind::kPage;
}

std::string_view ListingKindName(ListingKind kind) {
  return kind == ListingKind::kAutoindex ? "autoindex" : "page";
}

namespace {

// The value of every `attr`="..." (or '...', or bare) in `lower`-cased `html` at positions
// where `lower` has " attr=" inside a tag; raw values from `html`.
std::vector<std::string> AttributeValues(std::string_view html, const std::string& lower, std::string_view attr) {
  std::vector<std::string> out;
  std::size_t from = 0;
  while (true) {
    std::size_t at = lower.find(attr, from);
    if (at == std::string::npos) break;
    from = at + attr.size();
    if (at == 0 || !IsSpace(lower[at - 1])) continue;
    std::size_t i = at + attr.size();
    while (i < lower.size() && IsSpace(lower[i])) ++i;
    if (i >= lower.size() || lower[i] != '=') continue;
    ++i;
    while (i < lower.size() && IsSpace(lower[i])) ++i;
    if (i >= lower.size()) break;
    std::size_t end;
    if (html[i] == '"' || html[i] == '\'') {
      end = html.find(html[i], i + 1);
      if (end == std::string_view::npos) break;
      ++i;
    } else {
      end = i;
      while (end < html.size() && !IsSpace(html[end]) && html[end] != '>') ++end;
    }
    out.emplace_back(html.substr(i, end - i));
    from = end;
  }
  return out;
}

}  // namespace

Result<DirectoryAnswer> ReadDirectoryAnswer(std::string_view html, std::string_view directory_url,
                                            std::optional<std::int64_t> page_mtime) {
  Result<std::vector<DirEntry>> parsed = ParseAutoindex(html, directory_url);
  if (!parsed.ok()) return parsed.status();
  DirectoryAnswer answer;
  answer.kind = ClassifyListing(html);
  if (answer.kind == ListingKind::kAutoindex) {
    answer.entries = std::move(parsed).value();
    return answer;
  }
  DirEntry page;
  page.name = std::string(kDirectoryPageName);
  page.size = html.size();
  page.mtime_unix = page_mtime;
  answer.entries.push_back(page);
  // The directory's own path and its scheme://host, to take absolute links inside it.
  std::string_view origin, dir_path = "/";
  if (std::size_t scheme = directory_url.find("://"); scheme != std::string_view::npos) {
    std::size_t slash = directory_url.find('/', scheme + 3);
    origin = directory_url.substr(0, slash == std::string_view::npos ? directory_url.size() : slash);
    if (slash != std::string_view::npos) dir_path = directory_url.substr(slash);
  }
  const std::string lower = ToLower(html);
  std::map<std::string, std::size_t> seen;  // name → index in entries
  seen[page.name] = 0;
  for (std::string_view attr : {"href", "src"}) {
    for (std::string raw : AttributeValues(html, lower, attr)) {
      std::string link = DecodeHtmlEntities(raw);
      if (std::size_t cut = link.find_first_of("?#"); cut != std::string::npos) link.resize(cut);
      if (link.empty()) continue;
      if (!origin.empty() && link.starts_with(origin) && link.size() > origin.size() && link[origin.size()] == '/') {
        link.erase(0, origin.size());
      } else if (link.find("://") != std::string::npos || link.starts_with("//") || link.find(':') < link.find('/')) {
        continue;  // another host, or mailto:, javascript: ...
      }
      if (link.starts_with("/")) {
        if (!link.starts_with(dir_path) || !dir_path.ends_with("/")) continue;
        link.erase(0, dir_path.size());
      }
      while (link.starts_with("./")) link.erase(0, 2);
      std::size_t slash = link.find('/');
      std::string name = PercentDecode(link.substr(0, slash));
      if (name.empty() || name == "." || name == ".." || name.find('\0') != std::string::npos) continue;
      bool is_dir = slash != std::string::npos;
      auto [it, fresh] = seen.try_emplace(name, answer.entries.size());
      if (fresh) {
        DirEntry e;
        e.name = name;
        e.is_dir = is_dir;
        answer.entries.push_back(std::move(e));
      } else if (is_dir && it->second != 0) {
        answer.entries[it->second].is_dir = true;
      }
    }
  }
  return answer;
}

}  // namespace ghost
