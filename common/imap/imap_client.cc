#include "common/imap/imap_client.h"

#include <arpa/inet.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/bufferevent_ssl.h>
#include <event2/dns.h>
#include <event2/event.h>
#include <event2/util.h>
#include <netinet/in.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <sys/socket.h>
#include <sys/time.h>

#include <algorithm>
#include <cassert>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <utility>

namespace ghost {

// ---- Syntax (imap_client_internal.h) ----

namespace imap {
namespace {

constexpr int kMaxDepth = 64;  // nesting of parenthesized lists

bool IsDigit(char c) { return c >= '0' && c <= '9'; }

char ToUpper(char c) { return (c >= 'a' && c <= 'z') ? static_cast<char>(c - 'a' + 'A') : c; }

std::string Upper(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = ToUpper(c);
  return out;
}

bool EqualsUpper(std::string_view s, std::string_view upper) {
  if (s.size() != upper.size()) return false;
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (ToUpper(s[i]) != upper[i]) return false;
  }
  return true;
}

// A printable excerpt of protocol text for error messages.
std::string Excerpt(std::string_view s, std::size_t max = 120) {
  std::string out;
  for (std::size_t i = 0; i < s.size() && out.size() < max; ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c < 0x7f) {
      out.push_back(static_cast<char>(c));
    } else {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02X", c);
      out += buf;
    }
  }
  if (s.size() > max) out += "...";
  return "\"" + out + "\"";
}

// Walks the segments of one response. Text segments are read byte by byte; a literal marker
// "{n}" that ends a text segment is followed by a literal segment, then the next text segment.
class Tokenizer {
 public:
  enum class R { kOk, kPending, kError };

  explicit Tokenizer(const std::vector<Segment>& segs, std::size_t start = 0)
      : segs_(segs), pos_(start) {}

  bool AtEnd() const {
    return si_ >= segs_.size() || (pos_ >= Text().size() && si_ + 1 >= segs_.size());
  }
  bool AtSegmentEnd() const { return si_ >= segs_.size() || pos_ >= Text().size(); }
  char Peek() const { return AtSegmentEnd() ? '\0' : Text()[pos_]; }
  void SkipSpaces() {
    while (!AtSegmentEnd() && Text()[pos_] == ' ') ++pos_;
  }
  // The rest of the current text segment (for free text).
  std::string_view Rest() const {
    return AtSegmentEnd() ? std::string_view() : std::string_view(Text()).substr(pos_);
  }
  void SkipRest() { pos_ = si_ < segs_.size() ? Text().size() : 0; }
  const std::string& error() const { return error_; }

  // Reads a word up to a space (or the end of the segment); for tags and keywords.
  std::string_view Word() {
    const std::string& t = Text();
    const std::size_t start = pos_;
    while (pos_ < t.size() && t[pos_] != ' ') ++pos_;
    return std::string_view(t).substr(start, pos_ - start);
  }

  // One token. `stop_at_bracket`: ']' ends an atom (inside a response code).
  R Next(Token* out, bool stop_at_bracket, int depth) {
    SkipSpaces();
    if (AtSegmentEnd()) return Error("unexpected end of response");
    const char c = Peek();
    if (c == '(') {
      if (depth >= kMaxDepth) return Error("lists nested too deeply");
      ++pos_;
      out->type = Token::Type::kList;
      while (true) {
        SkipSpaces();
        if (AtSegmentEnd()) {
          // Not closed on this line; a pending literal is the only way the list goes on.
          return Error("unterminated list");
        }
        if (Peek() == ')') {
          ++pos_;
          return R::kOk;
        }
        Token item;
        const R r = Next(&item, stop_at_bracket, depth + 1);
        if (r != R::kOk) return r;
        out->items.push_back(std::move(item));
      }
    }
    if (c == ')') return Error("unexpected ')'");
    if (c == '"') return Quoted(out);
    if (c == '{') return Literal(out);
    return Atom(out, stop_at_bracket);
  }

 private:
  const std::string& Text() const { return segs_[si_].bytes; }

  R Error(const std::string& why) {
    if (error_.empty()) {
      std::string where;
      if (si_ < segs_.size()) where = Excerpt(std::string_view(Text()).substr(0, 200));
      error_ = why + " in " + where + " at offset " + std::to_string(pos_);
    }
    return R::kError;
  }

  R Quoted(Token* out) {
    const std::string& t = Text();
    ++pos_;
    out->type = Token::Type::kString;
    while (pos_ < t.size()) {
      const char c = t[pos_++];
      if (c == '"') return R::kOk;
      if (c == '\\') {
        if (pos_ >= t.size()) break;
        out->text.push_back(t[pos_++]);  // \" and \\ (others leniently: the char itself)
      } else {
        out->text.push_back(c);
      }
    }
    return Error("unterminated quoted string");
  }

  R Literal(Token* out) {
    const std::string& t = Text();
    std::size_t p = pos_ + 1;
    while (p < t.size() && IsDigit(t[p])) ++p;
    if (p == pos_ + 1) return Error("'{' without a length");
    if (p < t.size() && t[p] == '+') ++p;
    if (p >= t.size() || t[p] != '}' || p + 1 != t.size()) {
      return Error("literal marker not at the end of a line");
    }
    if (si_ + 1 >= segs_.size()) {
      pos_ = t.size();
      return R::kPending;  // the literal has not arrived (AnalyzeFetchPrefix)
    }
    const Segment& lit = segs_[si_ + 1];
    if (!lit.literal || si_ + 2 >= segs_.size()) return Error("literal segment missing");
    out->type = Token::Type::kString;
    out->literal = true;
    out->streamed = lit.streamed;
    out->text = lit.bytes;
    si_ += 2;
    pos_ = 0;
    return R::kOk;
  }

  R Atom(Token* out, bool stop_at_bracket) {
    const std::string& t = Text();
    const std::size_t start = pos_;
    while (pos_ < t.size()) {
      const auto c = static_cast<unsigned char>(t[pos_]);
      if (c == ' ' || c == '(' || c == ')' || c == '"' || c == '{' || c < 0x20 || c == 0x7f) {
        break;
      }
      if (c == ']' && stop_at_bracket) break;
      if (c == '[') {
        // A section ("BODY[HEADER.FIELDS (From To)]"): spaces and parentheses belong to it.
        int level = 0;
        while (pos_ < t.size()) {
          if (t[pos_] == '[') ++level;
          if (t[pos_] == ']' && --level == 0) break;
          ++pos_;
        }
        if (pos_ >= t.size()) return Error("unterminated '['");
      }
      ++pos_;
    }
    if (pos_ == start) return Error("unexpected character " + Excerpt(t.substr(pos_, 1)));
    out->text = t.substr(start, pos_ - start);
    out->type = EqualsUpper(out->text, "NIL") ? Token::Type::kNil : Token::Type::kAtom;
    if (out->type == Token::Type::kNil) out->text.clear();
    return R::kOk;
  }

  const std::vector<Segment>& segs_;
  std::size_t si_ = 0;
  std::size_t pos_ = 0;
  std::string error_;
};

bool IsStatusWord(std::string_view w) {
  return EqualsUpper(w, "OK") || EqualsUpper(w, "NO") || EqualsUpper(w, "BAD") ||
         EqualsUpper(w, "BYE") || EqualsUpper(w, "PREAUTH");
}

bool IsTagChar(unsigned char c) {
  return c > 0x20 && c < 0x7f && c != '(' && c != ')' && c != '{' && c != '%' && c != '*' &&
         c != '"' && c != '\\' && c != '+';
}

bool IsAtomChar(unsigned char c) {
  return c > 0x20 && c < 0x7f && c != '(' && c != ')' && c != '{' && c != '%' && c != '*' &&
         c != '"' && c != '\\' && c != ']';
}

// Parses "[CODE args] text" (or "text") after a status word.
void ParseStatusText(std::string_view rest, Response* r) {
  if (!rest.empty() && rest[0] == ' ') rest.remove_prefix(1);
  if (!rest.empty() && rest[0] == '[') {
    int level = 0;
    std::size_t end = 0;
    for (; end < rest.size(); ++end) {
      if (rest[end] == '[') ++level;
      if (rest[end] == ']' && --level == 0) break;
    }
    if (end < rest.size()) {
      r->code_text = std::string(rest.substr(1, end - 1));
      const std::size_t sp = r->code_text.find(' ');
      r->code = Upper(r->code_text.substr(0, sp));
      if (sp != std::string::npos) {
        std::vector<Segment> segs = {Segment{r->code_text.substr(sp + 1), false, false}};
        Tokenizer tk(segs);
        std::vector<Token> args;
        bool ok = true;
        while (true) {
          tk.SkipSpaces();
          if (tk.AtEnd()) break;
          Token t;
          if (tk.Next(&t, /*stop_at_bracket=*/false, 0) != Tokenizer::R::kOk) {
            ok = false;
            break;
          }
          args.push_back(std::move(t));
        }
        if (ok) r->code_args = std::move(args);
      }
      rest.remove_prefix(end + 1);
      if (!rest.empty() && rest[0] == ' ') rest.remove_prefix(1);
    }
  }
  r->text = std::string(rest);
}

}  // namespace

bool Token::IsAtom(std::string_view upper) const {
  return type == Type::kAtom && EqualsUpper(text, upper);
}

std::optional<std::uint64_t> Token::Number() const {
  if (type != Type::kAtom || text.empty() || text.size() > 19) return std::nullopt;
  std::uint64_t v = 0;
  for (char c : text) {
    if (!IsDigit(c)) return std::nullopt;
    v = v * 10 + static_cast<std::uint64_t>(c - '0');
  }
  return v;
}

Result<Response> ParseResponse(const std::vector<Segment>& segments) {
  if (segments.empty() || segments[0].literal) {
    return Status::Corruption("empty response");
  }
  const std::string& first = segments[0].bytes;
  Response r;
  auto bad = [&](const std::string& why) {
    return Status::Corruption("malformed IMAP response " + Excerpt(first) + ": " + why);
  };
  if (!first.empty() && first[0] == '+') {
    if (segments.size() > 1) return bad("continuation request with a literal");
    r.kind = Response::Kind::kContinuation;
    r.text = first.size() > 2 ? first.substr(2) : "";
    return r;
  }
  Tokenizer tk(segments);
  const std::string_view head = tk.Word();
  if (head.empty()) return bad("empty line");
  if (tk.Peek() == ' ') tk.SkipSpaces();
  if (head == "*") {
    r.kind = Response::Kind::kUntagged;
    std::string_view word = tk.Word();
    if (word.empty()) return bad("untagged response without a keyword");
    if (IsDigit(word[0])) {
      std::uint64_t n = 0;
      for (char c : word) {
        if (!IsDigit(c) || n > 0xffffffffULL) return bad("bad number");
        n = n * 10 + static_cast<std::uint64_t>(c - '0');
      }
      if (n > 0xffffffffULL) return bad("number out of range");
      r.number = static_cast<std::uint32_t>(n);
      tk.SkipSpaces();
      word = tk.Word();
      if (word.empty()) return bad("number without a keyword");
    }
    if (!r.number && IsStatusWord(word)) {
      r.status = Upper(word);
      if (segments.size() > 1) return bad("status response with a literal");
      ParseStatusText(tk.Rest(), &r);
      return r;
    }
    for (char c : word) {
      if (!IsAtomChar(static_cast<unsigned char>(c)) && c != '.' && c != '-') {
        return bad("keyword " + Excerpt(word) + " is not an atom");
      }
    }
    r.keyword = Upper(word);
    while (true) {
      tk.SkipSpaces();
      if (tk.AtEnd()) break;
      Token t;
      const Tokenizer::R res = tk.Next(&t, /*stop_at_bracket=*/false, 0);
      if (res != Tokenizer::R::kOk) return bad(tk.error().empty() ? "truncated" : tk.error());
      r.data.push_back(std::move(t));
    }
    return r;
  }
  for (char c : head) {
    if (!IsTagChar(static_cast<unsigned char>(c))) return bad("not a tag: " + Excerpt(head));
  }
  r.kind = Response::Kind::kTagged;
  r.tag = std::string(head);
  const std::string_view word = tk.Word();
  if (!EqualsUpper(word, "OK") && !EqualsUpper(word, "NO") && !EqualsUpper(word, "BAD")) {
    return bad("a tagged response must be OK, NO or BAD");
  }
  if (segments.size() > 1) return bad("status response with a literal");
  r.status = Upper(word);
  ParseStatusText(tk.Rest(), &r);
  return r;
}

FetchPrefix AnalyzeFetchPrefix(const std::vector<Segment>& segments) {
  FetchPrefix out;
  if (segments.empty() || segments[0].bytes.rfind("* ", 0) != 0) return out;
  Tokenizer tk(segments);
  (void)tk.Word();  // "*"
  tk.SkipSpaces();
  const std::string_view num = tk.Word();
  if (num.empty() || num.size() > 10 || !std::all_of(num.begin(), num.end(), IsDigit)) return out;
  const std::uint64_t seq = std::stoull(std::string(num));
  if (seq > 0xffffffffULL) return out;
  tk.SkipSpaces();
  if (!EqualsUpper(tk.Word(), "FETCH")) return out;
  tk.SkipSpaces();
  if (tk.Peek() != '(') return out;
  // Walk the name/value pairs inside the list until the pending literal.
  Tokenizer items(segments, segments[0].bytes.find('(') + 1);
  std::optional<std::uint32_t> uid;
  while (true) {
    items.SkipSpaces();
    if (items.AtSegmentEnd()) return out;
    Token name;
    if (items.Next(&name, false, 1) != Tokenizer::R::kOk || name.type != Token::Type::kAtom) {
      return out;
    }
    items.SkipSpaces();
    const bool top_level_literal = items.Peek() == '{';
    Token value;
    const Tokenizer::R r = items.Next(&value, false, 1);
    if (r == Tokenizer::R::kPending) {
      if (!top_level_literal) return out;
      out.is_fetch = true;
      out.seq = static_cast<std::uint32_t>(seq);
      out.item = Upper(name.text);
      out.uid = uid;
      return out;
    }
    if (r != Tokenizer::R::kOk) return out;
    if (name.IsAtom("UID")) {
      const std::optional<std::uint64_t> n = value.Number();
      if (n && *n > 0 && *n <= 0xffffffffULL) uid = static_cast<std::uint32_t>(*n);
    }
  }
}

std::optional<std::uint64_t> TrailingLiteral(std::string_view line, bool* bad) {
  *bad = false;
  if (line.empty() || line.back() != '}') return std::nullopt;
  const std::size_t open = line.rfind('{');
  if (open == std::string_view::npos) return std::nullopt;
  std::string_view inner = line.substr(open + 1, line.size() - open - 2);
  if (!inner.empty() && inner.back() == '+') inner.remove_suffix(1);
  if (inner.empty() || !std::all_of(inner.begin(), inner.end(), IsDigit)) return std::nullopt;
  if (inner.size() > 18) {
    *bad = true;
    return std::nullopt;
  }
  return std::stoull(std::string(inner));
}

namespace {

void AppendLiteral(std::string_view s, bool literal_plus, std::vector<std::string>* parts) {
  parts->back() += "{" + std::to_string(s.size()) + (literal_plus ? "+" : "") + "}\r\n";
  if (literal_plus) {
    parts->back().append(s);
  } else {
    parts->emplace_back(s);  // sent after the server's "+"
  }
}

bool NeedsLiteral(std::string_view s) {
  for (unsigned char c : s) {
    if (c == '\r' || c == '\n' || c == '\0' || c >= 0x80) return true;
  }
  return false;
}

void AppendQuoted(std::string_view s, std::string* out) {
  out->push_back('"');
  for (char c : s) {
    if (c == '"' || c == '\\') out->push_back('\\');
    out->push_back(c);
  }
  out->push_back('"');
}

// nz-number that fits in 32 bits.
bool ParseNz(std::string_view s, std::uint32_t* v) {
  if (s.empty() || s.size() > 10 || s[0] == '0') return false;
  std::uint64_t n = 0;
  for (char c : s) {
    if (!IsDigit(c)) return false;
    n = n * 10 + static_cast<std::uint64_t>(c - '0');
  }
  if (n > 0xffffffffULL) return false;
  *v = static_cast<std::uint32_t>(n);
  return true;
}

// Splits a sequence set into ranges; '*' is 0 ("largest"). False if malformed.
bool ParseSet(std::string_view set, std::vector<std::pair<std::uint32_t, std::uint32_t>>* out) {
  if (set.empty()) return false;
  std::size_t start = 0;
  while (start <= set.size()) {
    std::size_t comma = set.find(',', start);
    if (comma == std::string_view::npos) comma = set.size();
    const std::string_view item = set.substr(start, comma - start);
    const std::size_t colon = item.find(':');
    auto one = [](std::string_view s, std::uint32_t* v) {
      if (s == "*") {
        *v = 0;
        return true;
      }
      return ParseNz(s, v);
    };
    std::uint32_t a = 0, b = 0;
    if (colon == std::string_view::npos) {
      if (!one(item, &a)) return false;
      b = a;
    } else if (!one(item.substr(0, colon), &a) || !one(item.substr(colon + 1), &b)) {
      return false;
    }
    out->emplace_back(a, b);
    if (comma == set.size()) break;
    start = comma + 1;
  }
  return true;
}

constexpr const char* kMonths[] = {"Jan", "Feb", "Mar", "Apr", "May", "Jun",
                                   "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};

// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's days_from_civil).
std::int64_t DaysFromCivil(std::int64_t y, unsigned m, unsigned d) {
  y -= m <= 2;
  const std::int64_t era = (y >= 0 ? y : y - 399) / 400;
  const auto yoe = static_cast<unsigned>(y - era * 400);
  const unsigned doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
  const unsigned doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
  return era * 146097 + static_cast<std::int64_t>(doe) - 719468;
}

void CivilFromDays(std::int64_t z, std::int64_t* y, unsigned* m, unsigned* d) {
  z += 719468;
  const std::int64_t era = (z >= 0 ? z : z - 146096) / 146097;
  const auto doe = static_cast<unsigned>(z - era * 146097);
  const unsigned yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
  const unsigned doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
  const unsigned mp = (5 * doy + 2) / 153;
  *d = doy - (153 * mp + 2) / 5 + 1;
  *m = mp < 10 ? mp + 3 : mp - 9;
  *y = static_cast<std::int64_t>(yoe) + era * 400 + (*m <= 2);
}

}  // namespace

void AppendAstring(std::string_view s, bool literal_plus, std::vector<std::string>* parts) {
  const bool atom = !s.empty() && std::all_of(s.begin(), s.end(), [](char c) {
    const auto u = static_cast<unsigned char>(c);
    return IsAtomChar(u) || u == ']';
  });
  if (atom) {
    parts->back().append(s);
  } else {
    AppendString(s, literal_plus, parts);
  }
}

void AppendString(std::string_view s, bool literal_plus, std::vector<std::string>* parts) {
  if (NeedsLiteral(s)) {
    AppendLiteral(s, literal_plus, parts);
  } else {
    AppendQuoted(s, &parts->back());
  }
}

bool IsValidFlag(std::string_view flag) {
  if (!flag.empty() && flag[0] == '\\') flag.remove_prefix(1);
  return !flag.empty() && std::all_of(flag.begin(), flag.end(), [](char c) {
    return IsAtomChar(static_cast<unsigned char>(c));
  });
}

bool IsValidUidSet(std::string_view set) {
  std::vector<std::pair<std::uint32_t, std::uint32_t>> ranges;
  return ParseSet(set, &ranges);
}

std::optional<std::vector<std::uint32_t>> ExpandUidSet(std::string_view set, std::size_t limit) {
  std::vector<std::pair<std::uint32_t, std::uint32_t>> ranges;
  if (!ParseSet(set, &ranges)) return std::nullopt;
  std::vector<std::uint32_t> out;
  for (auto [a, b] : ranges) {
    if (a == 0 || b == 0) return std::nullopt;
    if (a > b) std::swap(a, b);
    if (b - a >= limit || out.size() + (b - a + 1) > limit) return std::nullopt;
    for (std::uint64_t u = a; u <= b; ++u) out.push_back(static_cast<std::uint32_t>(u));
  }
  return out;
}

bool UidSetContains(std::string_view set, std::uint32_t uid) {
  std::vector<std::pair<std::uint32_t, std::uint32_t>> ranges;
  if (!ParseSet(set, &ranges)) return false;
  for (auto [a, b] : ranges) {
    if (a == 0 && b == 0) return true;  // "*": the last message, whatever its UID
    if (a == 0) std::swap(a, b);
    if (b == 0) {
      if (uid >= a) return true;  // "n:*": every UID from n on
      continue;
    }
    if (a > b) std::swap(a, b);
    if (uid >= a && uid <= b) return true;
  }
  return false;
}

std::optional<std::int64_t> ParseInternalDate(std::string_view s) {
  // date-day-fixed "-" date-month "-" date-year SP time SP zone
  if (!s.empty() && s[0] == ' ') s.remove_prefix(1);  // " 7-Jul-..." -> "7-Jul-..."
  unsigned day = 0;
  std::size_t i = 0;
  while (i < s.size() && IsDigit(s[i]) && i < 2)
    day = day * 10 + static_cast<unsigned>(s[i++] - '0');
  if (i == 0 || i >= s.size() || s[i] != '-') return std::nullopt;
  ++i;
  if (i + 4 > s.size()) return std::nullopt;
  unsigned month = 0;
  for (unsigned m = 0; m < 12; ++m) {
    if (EqualsUpper(s.substr(i, 3), Upper(kMonths[m]))) month = m + 1;
  }
  if (month == 0 || s[i + 3] != '-') return std::nullopt;
  i += 4;
  auto digits = [&](std::size_t n, unsigned* v) {
    if (i + n > s.size()) return false;
    *v = 0;
    for (std::size_t k = 0; k < n; ++k) {
      if (!IsDigit(s[i + k])) return false;
      *v = *v * 10 + static_cast<unsigned>(s[i + k] - '0');
    }
    i += n;
    return true;
  };
  auto expect = [&](char c) {
    if (i >= s.size() || s[i] != c) return false;
    ++i;
    return true;
  };
  unsigned year = 0, hh = 0, mm = 0, ss = 0, zh = 0, zm = 0;
  if (!digits(4, &year) || !expect(' ') || !digits(2, &hh) || !expect(':') || !digits(2, &mm) ||
      !expect(':') || !digits(2, &ss) || !expect(' ')) {
    return std::nullopt;
  }
  if (i >= s.size() || (s[i] != '+' && s[i] != '-')) return std::nullopt;
  const int sign = s[i] == '-' ? -1 : 1;
  ++i;
  if (!digits(2, &zh) || !digits(2, &zm) || i != s.size()) return std::nullopt;
  if (day < 1 || day > 31 || hh > 23 || mm > 59 || ss > 60 || zm > 59) return std::nullopt;
  const std::int64_t days = DaysFromCivil(year, month, day);
  const std::int64_t local = days * 86400 + hh * 3600 + mm * 60 + ss;
  return local - sign * static_cast<std::int64_t>(zh * 3600 + zm * 60);
}

std::string FormatInternalDate(std::int64_t t) {
  std::int64_t days = t / 86400;
  std::int64_t secs = t % 86400;
  if (secs < 0) {
    secs += 86400;
    --days;
  }
  std::int64_t y = 0;
  unsigned m = 0, d = 0;
  CivilFromDays(days, &y, &m, &d);
  char buf[64];
  std::snprintf(buf, sizeof buf, "%02u-%s-%04lld %02lld:%02lld:%02lld +0000", d, kMonths[m - 1],
                static_cast<long long>(y), static_cast<long long>(secs / 3600),
                static_cast<long long>(secs / 60 % 60), static_cast<long long>(secs % 60));
  return buf;
}

}  // namespace imap

// ---- URL, capabilities, values ----

namespace {

int HexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

bool PercentDecode(std::string_view s, std::string* out) {
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '%') {
      out->push_back(s[i]);
      continue;
    }
    if (i + 2 >= s.size()) return false;
    const int hi = HexDigit(s[i + 1]), lo = HexDigit(s[i + 2]);
    if (hi < 0 || lo < 0) return false;
    out->push_back(static_cast<char>(hi * 16 + lo));
    i += 2;
  }
  return true;
}

bool EqualsIgnoreCaseAscii(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(a[i])) !=
        std::tolower(static_cast<unsigned char>(b[i]))) {
      return false;
    }
  }
  return true;
}

std::string UpperAscii(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return out;
}

bool IsIpLiteral(const std::string& host) {
  in_addr a4{};
  in6_addr a6{};
  return inet_pton(AF_INET, host.c_str(), &a4) == 1 || inet_pton(AF_INET6, host.c_str(), &a6) == 1;
}

std::vector<std::string> TokenTexts(const imap::Token& list) {
  std::vector<std::string> out;
  for (const imap::Token& t : list.items) out.push_back(t.text);
  return out;
}

constexpr std::size_t kMaxSeqMap = 16u << 20;  // sequence numbers tracked (64 MiB of UIDs)

}  // namespace

Result<ImapUrl> ParseImapUrl(std::string_view url) {
  auto bad = [&](const std::string& why) {
    return Status::InvalidArgument("\"" + std::string(url) + "\" is not an IMAP URL: " + why +
                                   " (expected imap://USER@HOST[:PORT]/ or imaps://...)");
  };
  for (unsigned char c : url) {
    if (c <= 0x20 || c >= 0x7f) return bad("it contains a space, control or 8-bit character");
  }
  ImapUrl out;
  std::string_view rest;
  if (url.size() >= 7 && EqualsIgnoreCaseAscii(url.substr(0, 7), "imap://")) {
    rest = url.substr(7);
    out.port = 143;
  } else if (url.size() >= 8 && EqualsIgnoreCaseAscii(url.substr(0, 8), "imaps://")) {
    rest = url.substr(8);
    out.implicit_tls = true;
    out.port = 993;
  } else {
    return bad("the scheme must be imap:// or imaps://");
  }
  const std::size_t slash = rest.find('/');
  std::string_view authority = rest.substr(0, slash);
  if (slash != std::string_view::npos) {
    std::string_view path = rest.substr(slash + 1);
    const std::size_t semi = path.find(';');  // ";UIDVALIDITY=" and friends: not used here
    if (!PercentDecode(path.substr(0, semi), &out.mailbox)) return bad("bad %-escape in the path");
  }
  const std::size_t at = authority.rfind('@');
  if (at != std::string_view::npos) {
    std::string_view userinfo = authority.substr(0, at);
    const std::size_t semi = userinfo.find(';');  // ";AUTH=..." (RFC 5092): LOGIN is used
    userinfo = userinfo.substr(0, semi);
    if (userinfo.find(':') != std::string_view::npos) {
      return bad("it holds a password; give the password separately (a file or the config)");
    }
    if (!PercentDecode(userinfo, &out.user)) return bad("bad %-escape in the user name");
    authority = authority.substr(at + 1);
  }
  std::string_view port;
  bool has_port = false;
  if (!authority.empty() && authority[0] == '[') {
    const std::size_t close = authority.find(']');
    if (close == std::string_view::npos) return bad("unterminated [IPv6 address]");
    out.host = std::string(authority.substr(1, close - 1));
    std::string_view after = authority.substr(close + 1);
    if (!after.empty()) {
      if (after[0] != ':') return bad("junk after the [IPv6 address]");
      port = after.substr(1);
      has_port = true;
    }
  } else {
    const std::size_t colon = authority.rfind(':');
    out.host = std::string(authority.substr(0, colon));
    if (colon != std::string_view::npos) {
      port = authority.substr(colon + 1);
      has_port = true;
    }
  }
  if (out.host.empty()) return bad("no host");
  if (has_port) {
    if (port.empty() || port.size() > 5 ||
        !std::all_of(port.begin(), port.end(), [](char c) { return c >= '0' && c <= '9'; })) {
      return bad("bad port");
    }
    const int p = std::stoi(std::string(port));
    if (p < 1 || p > 65535) return bad("port out of range");
    out.port = p;
  }
  return out;
}

bool ImapCapabilities::Has(std::string_view name) const {
  return names.count(UpperAscii(name)) > 0;
}

bool MailboxInfo::HasAttribute(std::string_view a) const {
  for (const std::string& x : attributes) {
    if (EqualsIgnoreCaseAscii(x, a)) return true;
  }
  return false;
}

// ---- Commands ----

// What a command is, for scheduling and for routing untagged answers.
enum CommandKind : int {
  kCapability,
  kStartTlsCmd,
  kLogin,
  kList,
  kSelect,
  kFetchSummary,
  kFetchBody,
  kAppend,
  kStore,
  kExpunge,
  kMove,
  kCopy,
  kCreate,
  kDelete,
  kNoop,
  kSearch,
  kIdle,
  kLogout,
};

enum class SendClass { kRead, kAppend, kAlone };

struct ImapClient::Command {
  int kind = kNoop;
  std::string tag;
  std::string label;  // the command for messages, without secrets: "UID FETCH 42 BODY.PEEK[]"
  // Builds the command text (without the tag) from the server's capabilities, when it is
  // sent: a sync literal cuts it into parts, each sent after the server's "+".
  std::function<std::vector<std::string>(const ImapCapabilities&)> build;
  std::vector<std::string> parts;
  std::size_t next_part = 0;
  bool internal = false;  // part of connection set-up
  // Called once with the outcome (the tagged answer's status, or the connection's failure).
  std::function<void(Command&, Status)> complete;

  // Collected from untagged answers while in flight.
  std::string mailbox;
  std::string uid_set;
  std::vector<MailboxInfo> list;
  MailboxStatus mbox;
  std::vector<MessageSummary> summaries;
  std::vector<std::uint32_t> found;  // UID SEARCH
  std::uint32_t uid = 0;             // FetchBody
  DataCallback on_data;
  bool body_seen = false;
  Status receiver_status;  // why the receiver stopped the body
  AppendResult append;
  MoveResult move;
  bool append_literal_plus = false;

  bool AwaitsContinuation() const { return !parts.empty() && next_part < parts.size(); }
};

namespace {

SendClass ClassOf(int kind, const ImapCapabilities& caps) {
  switch (kind) {
    case kFetchSummary:
    case kFetchBody:
    case kList:
    case kNoop:
      return SendClass::kRead;
    case kAppend:
      return caps.literal_plus() ? SendClass::kAppend : SendClass::kAlone;
    default:
      return SendClass::kAlone;
  }
}

bool IsWrite(int kind) {
  return kind == kStore || kind == kExpunge || kind == kMove || kind == kCopy;
}

}  // namespace

ImapClient::ImapClient(event_base* base, const ImapClientOptions& options)
    : base_(base), options_(options) {
  assert(base_ != nullptr);
  timeout_ev_ = evtimer_new(base_, &ImapClient::OnTimeout, this);
  idle_refresh_ev_ = evtimer_new(base_, &ImapClient::OnIdleRefresh, this);
  deferred_ev_ = event_new(base_, -1, 0, &ImapClient::OnDeferred, this);
  if (!timeout_ev_ || !idle_refresh_ev_ || !deferred_ev_) {
    std::fprintf(stderr, "ghost: ImapClient: out of memory creating libevent events\n");
    std::abort();
  }
}

ImapClient::~ImapClient() {
  assert(dispatch_depth_ == 0 && "ImapClient destroyed inside one of its callbacks");
  if (bev_) bufferevent_free(bev_);
  for (bufferevent* b : doomed_) bufferevent_free(b);
  if (dns_) evdns_base_free(dns_, /*fail_requests=*/0);
  event_free(timeout_ev_);
  event_free(idle_refresh_ev_);
  event_free(deferred_ev_);
  if (ssl_ctx_) SSL_CTX_free(ssl_ctx_);
}

std::string ImapClient::ServerName() const {
  return (url_.implicit_tls ? "imaps://" : "imap://") + url_.host + ":" + std::to_string(url_.port);
}

// ---- Connect ----

void ImapClient::Connect(std::string_view url, std::string user, std::string password,
                         StatusCallback done) {
  if (state_ != State::kDisconnected) {
    Defer(
        [done, s = Status::Internal("ImapClient::Connect: already connected to " + ServerName())] {
          if (done) done(s);
        });
    return;
  }
  Result<ImapUrl> parsed = ParseImapUrl(url);
  if (!parsed.ok()) {
    Defer([done, s = parsed.status()] {
      if (done) done(s);
    });
    return;
  }
  url_ = *parsed;
  user_ = user.empty() ? url_.user : std::move(user);
  if (user_.empty()) {
    Defer([done, s = Status::InvalidArgument("no user name for " + ServerName() +
                                             ": put it in the URL (imap://USER@HOST/)")] {
      if (done) done(s);
    });
    return;
  }
  password_ = std::move(password);
  connect_done_ = std::move(done);
  state_ = State::kConnecting;
  phase_ = Phase::kTcp;
  caps_ = ImapCapabilities{};
  tls_active_ = false;
  bye_text_.clear();
  selected_.clear();
  uid_by_seq_.clear();
  bytes_received_ = 0;
  StartTcp();
  UpdateTimeout(/*activity=*/true);
  AssertInvariants();
}

void ImapClient::StartTcp() {
  bev_ = bufferevent_socket_new(base_, -1, BEV_OPT_CLOSE_ON_FREE);
  if (!bev_) {
    Fail(Status::Internal("bufferevent_socket_new failed (out of memory?)"));
    return;
  }
  bufferevent_setcb(bev_, &ImapClient::OnRead, nullptr, &ImapClient::OnEvent, this);
  bufferevent_enable(bev_, EV_READ | EV_WRITE);
  int rc = 0;
  if (IsIpLiteral(url_.host)) {
    sockaddr_storage ss{};
    int len = sizeof ss;
    const std::string hostport = (url_.host.find(':') != std::string::npos)
                                     ? "[" + url_.host + "]:" + std::to_string(url_.port)
                                     : url_.host + ":" + std::to_string(url_.port);
    if (evutil_parse_sockaddr_port(hostport.c_str(), reinterpret_cast<sockaddr*>(&ss), &len) != 0) {
      Fail(Status::InvalidArgument("cannot parse address " + hostport));
      return;
    }
    rc = bufferevent_socket_connect(bev_, reinterpret_cast<sockaddr*>(&ss), len);
  } else {
    if (!dns_) {
      dns_ = evdns_base_new(base_, EVDNS_BASE_INITIALIZE_NAMESERVERS);
      if (!dns_) {
        Fail(Status::Unavailable("cannot set up name resolution (evdns) for " + url_.host));
        return;
      }
    }
    rc = bufferevent_socket_connect_hostname(bev_, dns_, AF_UNSPEC, url_.host.c_str(), url_.port);
  }
  if (rc != 0 && bev_) {
    const int err = EVUTIL_SOCKET_ERROR();
    Fail(Status::Unavailable("cannot connect to " + ServerName() + ": " +
                             evutil_socket_error_to_string(err)));
  }
}

Status ImapClient::StartTls() {
  if (!ssl_ctx_) {
    ssl_ctx_ = SSL_CTX_new(TLS_client_method());
    if (!ssl_ctx_) return Status::Internal("SSL_CTX_new failed");
    SSL_CTX_set_min_proto_version(ssl_ctx_, TLS1_2_VERSION);
    if (options_.verify_peer) {
      SSL_CTX_set_verify(ssl_ctx_, SSL_VERIFY_PEER, nullptr);
      int ok = 1;
      if (!options_.ca_file.empty() || !options_.ca_path.empty()) {
        ok = SSL_CTX_load_verify_locations(
            ssl_ctx_, options_.ca_file.empty() ? nullptr : options_.ca_file.c_str(),
            options_.ca_path.empty() ? nullptr : options_.ca_path.c_str());
      } else {
        ok = SSL_CTX_set_default_verify_paths(ssl_ctx_);
      }
      if (ok != 1) {
        SSL_CTX_free(ssl_ctx_);
        ssl_ctx_ = nullptr;
        return Status::InvalidArgument("cannot load the CA certificates (ca_file \"" +
                                       options_.ca_file + "\", ca_path \"" + options_.ca_path +
                                       "\")");
      }
    } else {
      SSL_CTX_set_verify(ssl_ctx_, SSL_VERIFY_NONE, nullptr);
    }
  }
  SSL* ssl = SSL_new(ssl_ctx_);
  if (!ssl) return Status::Internal("SSL_new failed");
  if (IsIpLiteral(url_.host)) {
    if (options_.verify_peer) X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl), url_.host.c_str());
  } else {
    SSL_set_tlsext_host_name(ssl, url_.host.c_str());
    if (options_.verify_peer) SSL_set1_host(ssl, url_.host.c_str());
  }
  // The filter owns the SSL object and the socket bufferevent under it (CLOSE_ON_FREE).
  bufferevent* tls = bufferevent_openssl_filter_new(base_, bev_, ssl, BUFFEREVENT_SSL_CONNECTING,
                                                    BEV_OPT_CLOSE_ON_FREE);
  if (!tls) {
    SSL_free(ssl);
    return Status::Internal("bufferevent_openssl_filter_new failed");
  }
  bufferevent_openssl_set_allow_dirty_shutdown(tls, 1);
  bev_ = tls;
  bufferevent_setcb(bev_, &ImapClient::OnRead, nullptr, &ImapClient::OnEvent, this);
  bufferevent_enable(bev_, EV_READ | EV_WRITE);
  return Status::Ok();
}

void ImapClient::OnConnected() {
  switch (phase_) {
    case Phase::kTcp:
      if (url_.implicit_tls) {
        phase_ = Phase::kTlsHandshake;
        if (Status s = StartTls(); !s.ok()) Fail(s.WithContext(ServerName()));
      } else {
        phase_ = Phase::kGreeting;
      }
      break;
    case Phase::kTlsHandshake:
      tls_active_ = true;
      if (url_.implicit_tls) {
        phase_ = Phase::kGreeting;
      } else {
        // RFC 3501 §6.2.1: capabilities from before STARTTLS must be forgotten.
        caps_ = ImapCapabilities{};
        SendCapability();
      }
      break;
    default:
      break;
  }
  UpdateTimeout(/*activity=*/true);
}

void ImapClient::SendCapability() {
  phase_ = phase_ == Phase::kLogin ? Phase::kLogin : Phase::kCapability;
  auto cmd = std::make_unique<Command>();
  cmd->kind = kCapability;
  cmd->internal = true;
  cmd->label = "CAPABILITY";
  cmd->build = [](const ImapCapabilities&) { return std::vector<std::string>{"CAPABILITY\r\n"}; };
  cmd->complete = [this](Command&, Status s) {
    if (!s.ok()) {
      Fail(s);
      return;
    }
    if (phase_ == Phase::kLogin) {
      BecomeReady();
    } else {
      AfterCapabilities();
    }
  };
  Send(std::move(cmd));
}

void ImapClient::AfterGreeting() {
  if (caps_.names.empty()) {
    SendCapability();
  } else {
    AfterCapabilities();
  }
}

void ImapClient::AfterCapabilities() {
  if (!tls_active_ && !url_.implicit_tls) {
    const bool offered = caps_.starttls();
    if (options_.starttls != ImapClientOptions::StartTls::kNever && offered) {
      phase_ = Phase::kStartTls;
      auto cmd = std::make_unique<Command>();
      cmd->kind = kStartTlsCmd;
      cmd->internal = true;
      cmd->label = "STARTTLS";
      cmd->build = [](const ImapCapabilities&) { return std::vector<std::string>{"STARTTLS\r\n"}; };
      cmd->complete = [this](Command&, Status s) {
        if (!s.ok()) {
          Fail(s);
          return;
        }
        // Anything the server sent after its OK came before TLS: an injection attempt
        // (CVE-2011-0411 and kin), never legitimate.
        if (evbuffer_get_length(bufferevent_get_input(bev_)) > 0) {
          Fail(Status::Corruption(ServerName() +
                                  " sent data after STARTTLS's OK, before TLS; refusing it"));
          return;
        }
        phase_ = Phase::kTlsHandshake;
        if (Status t = StartTls(); !t.ok()) Fail(t.WithContext(ServerName()));
      };
      Send(std::move(cmd));
      return;
    }
    if (options_.starttls == ImapClientOptions::StartTls::kRequired) {
      Fail(Status::NotSupported(ServerName() +
                                " does not offer STARTTLS, which the options require; use "
                                "imaps:// or allow plain text"));
      return;
    }
  }
  if (caps_.Has("LOGINDISABLED")) {
    Fail(Status::NotSupported(ServerName() +
                              " refuses LOGIN on this connection (LOGINDISABLED); use imaps:// "
                              "or STARTTLS"));
    return;
  }
  SendLogin();
}

void ImapClient::SendLogin() {
  phase_ = Phase::kLogin;
  auto cmd = std::make_unique<Command>();
  cmd->kind = kLogin;
  cmd->internal = true;
  cmd->label = "LOGIN " + user_;
  cmd->build = [this](const ImapCapabilities& caps) {
    std::vector<std::string> parts = {"LOGIN "};
    imap::AppendAstring(user_, caps.literal_plus(), &parts);
    parts.back() += " ";
    imap::AppendAstring(password_, caps.literal_plus(), &parts);
    parts.back() += "\r\n";
    return parts;
  };
  cmd->complete = [this](Command&, Status s) {
    if (!s.ok()) {
      // NO (or BAD) to LOGIN: the credentials. The password is never in a message.
      Fail(Status::PermissionDenied("login refused for user \"" + user_ + "\" at " + ServerName() +
                                    " (" + s.message() + "); check the user name and password"));
      return;
    }
    if (!login_caps_seen_) {
      caps_ = ImapCapabilities{};
      SendCapability();  // phase_ stays kLogin: BecomeReady after it
      return;
    }
    BecomeReady();
  };
  login_caps_seen_ = false;
  Send(std::move(cmd));
}

void ImapClient::BecomeReady() {
  state_ = State::kReady;
  phase_ = Phase::kNone;
  password_.assign(password_.size(), '\0');
  password_.clear();
  UpdateTimeout(false);
  if (connect_done_) {
    StatusCallback done = std::move(connect_done_);
    connect_done_ = nullptr;
    done(Status::Ok());
  }
  Pump();
}

// ---- Reading ----

void ImapClient::OnRead(bufferevent* /*bev*/, void* self) noexcept {
  static_cast<ImapClient*>(self)->ReadInput();
}

void ImapClient::ReadInput() {
  bufferevent* const bev = bev_;
  if (!bev) return;
  ++dispatch_depth_;
  bool any = false;
  while (bev_ == bev) {
    evbuffer* in = bufferevent_get_input(bev);
    if (literal_left_ > 0) {
      if (!ReadLiteralBytes(bev)) break;
      any = true;
      if (literal_left_ == 0) literal_cmd_ = nullptr;
      continue;
    }
    const std::size_t len = evbuffer_get_length(in);
    if (len == 0) break;
    if (scanned_ > len) scanned_ = 0;
    evbuffer_ptr from;
    evbuffer_ptr_set(in, &from, scanned_, EVBUFFER_PTR_SET);
    const evbuffer_ptr nl = evbuffer_search(in, "\n", 1, &from);
    if (nl.pos < 0) {
      scanned_ = len;
      if (len > options_.max_line_bytes) {
        Fail(Status::Corruption(ServerName() + " sent a line longer than " +
                                std::to_string(options_.max_line_bytes) + " bytes"));
      }
      break;
    }
    any = true;
    scanned_ = 0;
    const auto line_len = static_cast<std::size_t>(nl.pos);
    if (line_len > options_.max_line_bytes) {
      Fail(Status::Corruption(ServerName() + " sent a line longer than " +
                              std::to_string(options_.max_line_bytes) + " bytes"));
      break;
    }
    std::string line(line_len, '\0');
    if (line_len > 0) evbuffer_remove(in, line.data(), line_len);
    evbuffer_drain(in, 1);
    bytes_received_ += line_len + 1;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    OnLine(std::move(line));
  }
  --dispatch_depth_;
  if (dispatch_depth_ == 0) {
    for (bufferevent* b : doomed_) bufferevent_free(b);
    doomed_.clear();
  }
  if (any && bev_ == bev) UpdateTimeout(/*activity=*/true);
  AssertInvariants();
}

bool ImapClient::ReadLiteralBytes(bufferevent* bev) {
  evbuffer* in = bufferevent_get_input(bev);
  const std::size_t avail = evbuffer_get_length(in);
  if (avail == 0) return false;
  const auto n = static_cast<std::size_t>(std::min<std::uint64_t>(avail, literal_left_));
  switch (literal_sink_) {
    case LiteralSink::kKeep: {
      std::string& bytes = segments_.back().bytes;
      const std::size_t old = bytes.size();
      bytes.resize(old + n);
      evbuffer_remove(in, bytes.data() + old, n);
      break;
    }
    case LiteralSink::kSkip:
      evbuffer_drain(in, n);
      break;
    case LiteralSink::kStream: {
      // Straight from the buffer's chains: no copy, no scan.
      const int nvec = evbuffer_peek(in, static_cast<ev_ssize_t>(n), nullptr, nullptr, 0);
      std::vector<evbuffer_iovec> vec(static_cast<std::size_t>(std::max(nvec, 0)));
      evbuffer_peek(in, static_cast<ev_ssize_t>(n), nullptr, vec.data(), nvec);
      std::size_t left = n;
      for (const evbuffer_iovec& v : vec) {
        if (left == 0 || !literal_cmd_) break;
        const std::size_t take = std::min(left, v.iov_len);
        DeliverBody(*literal_cmd_, std::string_view(static_cast<const char*>(v.iov_base), take));
        left -= take;
        if (bev_ != bev) return false;  // the receiver closed the client
      }
      evbuffer_drain(in, n);
      break;
    }
  }
  literal_left_ -= n;
  bytes_received_ += n;
  return true;
}

void ImapClient::DeliverBody(Command& cmd, std::string_view bytes) {
  cmd.body_seen = true;
  if (!cmd.receiver_status.ok() || bytes.empty() || !cmd.on_data) return;
  try {
    if (!cmd.on_data(bytes)) {
      cmd.receiver_status = Status::IoError("UID FETCH " + std::to_string(cmd.uid) + " from " +
                                            ServerName() + ": stopped by the receiver");
    }
  } catch (const std::exception& e) {
    cmd.receiver_status =
        Status::Internal("UID FETCH " + std::to_string(cmd.uid) + ": on_data threw: " + e.what());
  } catch (...) {
    cmd.receiver_status =
        Status::Internal("UID FETCH " + std::to_string(cmd.uid) + ": on_data threw");
  }
}

void ImapClient::OnLine(std::string line) {
  const bool first = segments_.empty();
  if (first && !line.empty() && line[0] == '+') {
    HandleResponse({imap::Segment{std::move(line), false, false}});
    return;
  }
  bool literal_bad = false;
  std::optional<std::uint64_t> literal;
  if (!(first && IsStatusLine(line))) literal = imap::TrailingLiteral(line, &literal_bad);
  if (literal_bad) {
    Fail(Status::Corruption(ServerName() + " announced a literal too large to be real"));
    return;
  }
  segments_.push_back(imap::Segment{std::move(line), false, false});
  if (!literal) {
    std::vector<imap::Segment> segs = std::move(segments_);
    segments_.clear();
    HandleResponse(std::move(segs));
    return;
  }
  BeginLiteral(*literal);
}

bool ImapClient::IsStatusLine(std::string_view line) {
  // "<tag or *> OK|NO|BAD|BYE|PREAUTH ...": the text may end in "{5}" without a literal.
  const std::size_t sp = line.find(' ');
  if (sp == std::string_view::npos) return false;
  std::string_view rest = line.substr(sp + 1);
  const std::string_view word = rest.substr(0, rest.find(' '));
  return EqualsIgnoreCaseAscii(word, "OK") || EqualsIgnoreCaseAscii(word, "NO") ||
         EqualsIgnoreCaseAscii(word, "BAD") || EqualsIgnoreCaseAscii(word, "BYE") ||
         EqualsIgnoreCaseAscii(word, "PREAUTH");
}

void ImapClient::BeginLiteral(std::uint64_t length) {
  literal_sink_ = LiteralSink::kKeep;
  literal_cmd_ = nullptr;
  const imap::FetchPrefix fp = imap::AnalyzeFetchPrefix(segments_);
  if (fp.is_fetch && (fp.item == "BODY[]" || fp.item.rfind("BODY[]<", 0) == 0)) {
    if (fp.uid) {
      literal_cmd_ = FindBodyCommand(*fp.uid);
      literal_sink_ = literal_cmd_ ? LiteralSink::kStream : LiteralSink::kSkip;
    } else if (!FindInFlight(kFetchBody)) {
      literal_sink_ = LiteralSink::kSkip;  // nobody asked for a body
    }
    // else: the UID comes after the body; keep it and route it when the response is whole.
  }
  if (literal_sink_ == LiteralSink::kKeep && length > options_.max_buffered_literal) {
    Fail(Status::Corruption(
        ServerName() + " sent a literal of " + std::to_string(length) + " bytes, more than the " +
        std::to_string(options_.max_buffered_literal) + " kept in memory (max_buffered_literal)"));
    return;
  }
  imap::Segment seg;
  seg.literal = true;
  seg.streamed = literal_sink_ != LiteralSink::kKeep;
  if (literal_sink_ == LiteralSink::kKeep) seg.bytes.reserve(static_cast<std::size_t>(length));
  segments_.push_back(std::move(seg));
  if (literal_cmd_) literal_cmd_->body_seen = true;
  literal_left_ = length;
  literal_total_ = length;
}

// ---- Dispatching responses ----

void ImapClient::HandleResponse(std::vector<imap::Segment> segments) {
  Result<imap::Response> parsed = imap::ParseResponse(segments);
  if (!parsed.ok()) {
    Fail(Status::Corruption(ServerName() + ": " + parsed.status().message()));
    return;
  }
  const imap::Response& r = *parsed;
  switch (r.kind) {
    case imap::Response::Kind::kTagged:
      HandleTagged(r);
      break;
    case imap::Response::Kind::kUntagged:
      HandleUntagged(r);
      break;
    case imap::Response::Kind::kContinuation:
      HandleContinuation(r);
      break;
  }
}

void ImapClient::HandleTagged(const imap::Response& r) {
  auto it = std::find_if(in_flight_.begin(), in_flight_.end(),
                         [&](const std::unique_ptr<Command>& c) { return c->tag == r.tag; });
  if (it == in_flight_.end() || phase_ == Phase::kGreeting) {
    Fail(Status::Corruption(ServerName() + " answered tag \"" + r.tag +
                            "\", which no outstanding command has"));
    return;
  }
  Command& cmd = **it;
  HandleStatusCode(r, &cmd);
  Status status = r.status == "OK" ? Status::Ok() : StatusForTagged(cmd, r);
  std::unique_ptr<Command> done = std::move(*it);
  in_flight_.erase(it);
  if (done->kind == kIdle) {
    idle_state_ = IdleState::kOff;
    event_del(idle_refresh_ev_);
    if (!status.ok()) idle_wanted_ = false;  // the server refuses IDLE here; do not loop
  }
  if (done->kind == kLogout) {
    Disconnect();
    FailQueued(Status::Unavailable(ServerName() + ": logged out"));
    CompleteCommand(*done, status);
    return;
  }
  CompleteCommand(*done, status);
  Pump();
  UpdateTimeout(false);
}

void ImapClient::HandleUntagged(const imap::Response& r) {
  if (r.IsStatus()) {
    if (phase_ == Phase::kGreeting) {
      if (r.status == "BYE") {
        Fail(Status::Unavailable(ServerName() + " refused the connection: " + r.text));
        return;
      }
      HandleStatusCode(r, nullptr);
      if (r.status == "PREAUTH") {
        if (!tls_active_ && !url_.implicit_tls &&
            options_.starttls == ImapClientOptions::StartTls::kRequired) {
          Fail(Status::NotSupported(ServerName() +
                                    " pre-authenticated the connection, so STARTTLS is "
                                    "impossible, and the options require it"));
          return;
        }
        phase_ = Phase::kLogin;
        login_caps_seen_ = !caps_.names.empty();
        if (login_caps_seen_) {
          BecomeReady();
        } else {
          SendCapability();
        }
        return;
      }
      if (r.status != "OK") {
        Fail(Status::Corruption(ServerName() + " greeted with " + r.status + ": " + r.text));
        return;
      }
      AfterGreeting();
      return;
    }
    if (r.status == "BYE") {
      bye_text_ = r.text;
      if (state_ == State::kLoggingOut) return;  // the expected goodbye
      Fail(Status::Unavailable(ServerName() + " closed the connection: BYE " + r.text));
      return;
    }
    Command* target = nullptr;
    if (r.code == "COPYUID") target = FindInFlight(kMove);
    if (!target && (r.code == "UIDVALIDITY" || r.code == "UIDNEXT" || r.code == "PERMANENTFLAGS" ||
                    r.code == "HIGHESTMODSEQ" || r.code == "READ-ONLY" || r.code == "READ-WRITE")) {
      target = FindInFlight(kSelect);
    }
    HandleStatusCode(r, target);
    return;
  }
  if (phase_ == Phase::kGreeting) {
    Fail(Status::Corruption(ServerName() + " did not greet with OK, PREAUTH or BYE"));
    return;
  }
  const std::string& kw = r.keyword;
  if (kw == "CAPABILITY") {
    caps_ = ImapCapabilities{};
    for (const imap::Token& t : r.data) caps_.names.insert(UpperAscii(t.text));
    if (phase_ == Phase::kLogin) login_caps_seen_ = true;
  } else if (kw == "LIST" || kw == "LSUB") {
    Command* cmd = FindInFlight(kList);
    if (!cmd) return;
    if (r.data.size() != 3 || r.data[0].type != imap::Token::Type::kList ||
        r.data[2].type == imap::Token::Type::kList || r.data[1].type == imap::Token::Type::kList) {
      Fail(Status::Corruption(ServerName() + " sent a malformed LIST answer"));
      return;
    }
    MailboxInfo info;
    info.attributes = TokenTexts(r.data[0]);
    info.delimiter = r.data[1].text.empty() ? '\0' : r.data[1].text[0];
    info.name = r.data[2].type == imap::Token::Type::kNil ? "NIL" : r.data[2].text;
    cmd->list.push_back(std::move(info));
  } else if (kw == "FLAGS") {
    if (Command* cmd = FindInFlight(kSelect); cmd && !r.data.empty()) {
      cmd->mbox.flags = TokenTexts(r.data[0]);
    }
  } else if (kw == "EXISTS" && r.number) {
    const std::uint32_t n = *r.number;
    if (n <= kMaxSeqMap) {
      uid_by_seq_.resize(n, 0);
    } else {
      uid_by_seq_.clear();  // too many to track: UIDs unknown
    }
    if (Command* cmd = FindInFlight(kSelect)) {
      cmd->mbox.exists = n;
    } else {
      Emit(MailboxEvent{MailboxEvent::Kind::kExists, n, 0, std::nullopt});
    }
  } else if (kw == "RECENT" && r.number) {
    if (Command* cmd = FindInFlight(kSelect)) {
      cmd->mbox.recent = *r.number;
    } else {
      Emit(MailboxEvent{MailboxEvent::Kind::kRecent, *r.number, 0, std::nullopt});
    }
  } else if (kw == "EXPUNGE" && r.number) {
    const std::uint32_t seq = *r.number;
    std::uint32_t uid = 0;
    if (seq >= 1 && seq <= uid_by_seq_.size()) {
      uid = uid_by_seq_[seq - 1];
      uid_by_seq_.erase(uid_by_seq_.begin() + (seq - 1));
    }
    Emit(MailboxEvent{MailboxEvent::Kind::kExpunge, seq, uid, std::nullopt});
  } else if (kw == "FETCH" && r.number) {
    HandleFetch(r);
  } else if (kw == "SEARCH") {
    Command* cmd = FindInFlight(kSearch);
    if (!cmd) return;
    for (const imap::Token& t : r.data) {
      std::optional<std::uint64_t> n = t.Number();
      if (t.type != imap::Token::Type::kAtom || !n || *n == 0 || *n > 0xffffffffu) {
        Fail(Status::Corruption(ServerName() + " sent a malformed SEARCH answer"));
        return;
      }
      cmd->found.push_back(static_cast<std::uint32_t>(*n));
    }
  }
  // Anything else ( STATUS, ENABLED, ID, NAMESPACE, extensions) is not ours to use.
}

void ImapClient::HandleFetch(const imap::Response& r) {
  const std::uint32_t seq = *r.number;
  if (r.data.size() != 1 || r.data[0].type != imap::Token::Type::kList ||
      r.data[0].items.size() % 2 != 0) {
    Fail(Status::Corruption(ServerName() + " sent a malformed FETCH answer"));
    return;
  }
  std::uint32_t uid = 0;
  std::optional<std::vector<std::string>> flags;
  std::optional<std::uint64_t> size;
  std::string internaldate;
  const imap::Token* body = nullptr;
  const auto& items = r.data[0].items;
  for (std::size_t i = 0; i < items.size(); i += 2) {
    const imap::Token& name = items[i];
    const imap::Token& value = items[i + 1];
    if (name.IsAtom("UID")) {
      const std::optional<std::uint64_t> n = value.Number();
      if (!n || *n == 0 || *n > 0xffffffffULL) {
        Fail(Status::Corruption(ServerName() + " sent a FETCH with a bad UID"));
        return;
      }
      uid = static_cast<std::uint32_t>(*n);
    } else if (name.IsAtom("FLAGS") && value.type == imap::Token::Type::kList) {
      flags = TokenTexts(value);
    } else if (name.IsAtom("RFC822.SIZE")) {
      size = value.Number();
    } else if (name.IsAtom("INTERNALDATE")) {
      internaldate = value.text;
    } else if (name.type == imap::Token::Type::kAtom &&
               (name.IsAtom("BODY[]") || UpperAscii(name.text).rfind("BODY[]<", 0) == 0)) {
      body = &value;
    }
  }
  if (uid != 0 && seq >= 1) {
    if (seq > uid_by_seq_.size() && seq <= kMaxSeqMap) uid_by_seq_.resize(seq, 0);
    if (seq <= uid_by_seq_.size()) uid_by_seq_[seq - 1] = uid;
  }
  if (uid == 0) uid = UidForSeq(seq);  // unsolicited FETCH often carries no UID
  if (body) {
    if (body->streamed) return;  // delivered (or skipped) as it arrived
    // BODY[] NIL: the message was expunged by another session and this one has not been told
    // yet (dovecot answers so, with a tagged OK). It is not an empty message: the command
    // completes as "no message with that UID", never as a body of 0 bytes.
    if (body->type == imap::Token::Type::kNil) return;
    Command* cmd = uid ? FindBodyCommand(uid) : nullptr;
    if (cmd) DeliverBody(*cmd, body->text);
    return;
  }
  if (size) {
    Command* cmd = FindInFlight(kFetchSummary);
    if (cmd && uid != 0 && imap::UidSetContains(cmd->uid_set, uid)) {
      MessageSummary m;
      m.uid = uid;
      m.seq = seq;
      m.flags = flags.value_or(std::vector<std::string>{});
      m.size = *size;
      m.internaldate = internaldate;
      m.internaldate_unix = imap::ParseInternalDate(internaldate).value_or(0);
      cmd->summaries.push_back(std::move(m));
      return;
    }
  }
  Emit(MailboxEvent{MailboxEvent::Kind::kFetch, seq, uid, std::move(flags)});
}

void ImapClient::HandleStatusCode(const imap::Response& r, Command* cmd) {
  const std::string& code = r.code;
  if (code.empty()) return;
  auto number = [&](std::size_t i) -> std::uint64_t {
    if (i >= r.code_args.size()) return 0;
    return r.code_args[i].Number().value_or(0);
  };
  if (code == "CAPABILITY") {
    caps_ = ImapCapabilities{};
    std::string_view rest = std::string_view(r.code_text).substr(code.size());
    while (!rest.empty()) {
      while (!rest.empty() && rest[0] == ' ') rest.remove_prefix(1);
      const std::size_t sp = rest.find(' ');
      if (!rest.empty()) caps_.names.insert(UpperAscii(rest.substr(0, sp)));
      rest = sp == std::string_view::npos ? std::string_view() : rest.substr(sp);
    }
    if (phase_ == Phase::kLogin) login_caps_seen_ = true;
    return;
  }
  if (!cmd) return;
  if (cmd->kind == kSelect) {
    if (code == "UIDVALIDITY") cmd->mbox.uidvalidity = static_cast<std::uint32_t>(number(0));
    if (code == "UIDNEXT") cmd->mbox.uidnext = static_cast<std::uint32_t>(number(0));
    if (code == "HIGHESTMODSEQ") cmd->mbox.highestmodseq = number(0);
    if (code == "READ-ONLY") cmd->mbox.read_only = true;
    if (code == "PERMANENTFLAGS" && !r.code_args.empty() &&
        r.code_args[0].type == imap::Token::Type::kList) {
      cmd->mbox.permanent_flags = TokenTexts(r.code_args[0]);
    }
  } else if (cmd->kind == kAppend && code == "APPENDUID") {
    cmd->append.uidvalidity = static_cast<std::uint32_t>(number(0));
    cmd->append.uid = static_cast<std::uint32_t>(number(1));
  } else if ((cmd->kind == kMove || cmd->kind == kCopy) && code == "COPYUID" &&
             r.code_args.size() == 3) {
    const auto from = imap::ExpandUidSet(r.code_args[1].text);
    const auto to = imap::ExpandUidSet(r.code_args[2].text);
    if (from && to && from->size() == to->size()) {
      cmd->move.uidvalidity = static_cast<std::uint32_t>(number(0));
      for (std::size_t i = 0; i < from->size(); ++i) {
        cmd->move.uids.emplace_back((*from)[i], (*to)[i]);
      }
    }
  }
}

void ImapClient::HandleContinuation(const imap::Response& /*r*/) {
  // Only one command can wait for "+": those that do are sent alone (see CanSend).
  Command* waiting = nullptr;
  for (const auto& c : in_flight_) {
    if (c->AwaitsContinuation() || (c->kind == kIdle && idle_state_ == IdleState::kStarting)) {
      waiting = c.get();
      break;
    }
  }
  if (!waiting) {
    Fail(Status::Corruption(ServerName() + " sent a continuation request nobody asked for"));
    return;
  }
  if (waiting->kind == kIdle) {
    idle_state_ = IdleState::kIdling;
    if (options_.idle_refresh > Duration::zero()) {
      const timeval tv = ToTimeval(options_.idle_refresh);
      evtimer_add(idle_refresh_ev_, &tv);
    }
    UpdateTimeout(false);
    if (!queue_.empty() || !idle_wanted_) StopIdleNow();
    return;
  }
  SendNextPart(*waiting);
}

// ---- Sending ----

void ImapClient::Enqueue(std::unique_ptr<Command> cmd) {
  if (state_ == State::kDisconnected || state_ == State::kLoggingOut) {
    Status why = Status::Unavailable(
        cmd->label + ": not connected" +
        (url_.host.empty() ? std::string() : " to " + ServerName()) +
        (state_ == State::kLoggingOut ? " (logging out)" : "; call Connect first"));
    FailLater(std::move(cmd), std::move(why));
    return;
  }
  queue_.push_back(std::move(cmd));
  Pump();
}

void ImapClient::FailLater(std::unique_ptr<Command> cmd, Status status) {
  deferred_.push_back(Deferred{std::move(cmd), std::move(status), nullptr});
  ScheduleDeferred();
}

void ImapClient::Defer(std::function<void()> fn) {
  deferred_.push_back(Deferred{nullptr, Status::Ok(), std::move(fn)});
  ScheduleDeferred();
}

bool ImapClient::CanSend(const Command& cmd) const {
  if (in_flight_.empty()) return true;
  if (in_flight_.size() >= options_.max_in_flight) return false;
  const SendClass cls = ClassOf(cmd.kind, caps_);
  if (cls == SendClass::kAlone) return false;
  for (const auto& f : in_flight_) {
    if (ClassOf(f->kind, caps_) != cls || f->AwaitsContinuation()) return false;
    if ((cmd.kind == kList || cmd.kind == kFetchSummary) && f->kind == cmd.kind) return false;
  }
  return true;
}

void ImapClient::Pump() {
  if (state_ != State::kReady || !bev_) return;
  if (idle_state_ == IdleState::kIdling) {
    if (!queue_.empty() || !idle_wanted_) StopIdleNow();
    return;
  }
  if (idle_state_ != IdleState::kOff) return;  // IDLE starting or stopping: wait for it
  while (!queue_.empty() && state_ == State::kReady && CanSend(*queue_.front())) {
    std::unique_ptr<Command> cmd = std::move(queue_.front());
    queue_.pop_front();
    Send(std::move(cmd));
  }
  if (queue_.empty() && in_flight_.empty() && idle_wanted_ && !selected_.empty() && caps_.idle() &&
      state_ == State::kReady) {
    auto cmd = std::make_unique<Command>();
    cmd->kind = kIdle;
    cmd->label = "IDLE";
    cmd->build = [](const ImapCapabilities&) { return std::vector<std::string>{"IDLE\r\n"}; };
    cmd->complete = [](Command&, Status) {};
    idle_state_ = IdleState::kStarting;
    Send(std::move(cmd));
  }
}

void ImapClient::Send(std::unique_ptr<Command> cmd) {
  assert(bev_ != nullptr);
  if (IsWrite(cmd->kind) && selected_read_only_) {
    // Not even sent: some servers (dovecot) answer OK to a STORE in an EXAMINEd mailbox and
    // change nothing.
    Status why = Status::ReadOnly(cmd->label + ": mailbox \"" + selected_ +
                                  "\" is open read-only (Examine); Select it to change it");
    FailLater(std::move(cmd), std::move(why));
    return;
  }
  cmd->tag = "G" + std::to_string(next_tag_++);
  if (cmd->kind == kSelect) {
    selected_.clear();
    selected_read_only_ = false;
    uid_by_seq_.clear();
  }
  if (cmd->kind == kLogout) state_ = State::kLoggingOut;
  cmd->parts = cmd->build(caps_);
  assert(!cmd->parts.empty());
  cmd->parts[0] = cmd->tag + " " + cmd->parts[0];
  cmd->next_part = 0;
  Command& ref = *cmd;
  in_flight_.push_back(std::move(cmd));
  SendNextPart(ref);
  UpdateTimeout(false);
}

void ImapClient::SendNextPart(Command& cmd) {
  const std::string& part = cmd.parts[cmd.next_part++];
  bufferevent_write(bev_, part.data(), part.size());
  if (!cmd.AwaitsContinuation()) {
    cmd.parts.clear();  // sent: free the bytes (an APPEND may be large)
    cmd.parts.shrink_to_fit();
    cmd.next_part = 0;
  }
}

void ImapClient::StopIdleNow() {
  if (idle_state_ != IdleState::kIdling || !bev_) return;
  static constexpr char kDone[] = "DONE\r\n";
  bufferevent_write(bev_, kDone, sizeof kDone - 1);
  idle_state_ = IdleState::kStopping;
  event_del(idle_refresh_ev_);
  UpdateTimeout(true);  // DONE's answer is awaited from now
}

void ImapClient::CompleteCommand(Command& cmd, Status status) {
  if (cmd.complete) cmd.complete(cmd, std::move(status));
}

ImapClient::Command* ImapClient::FindInFlight(int kind) {
  for (const auto& c : in_flight_) {
    if (c->kind == kind) return c.get();
  }
  return nullptr;
}

ImapClient::Command* ImapClient::FindBodyCommand(std::uint32_t uid) {
  for (const auto& c : in_flight_) {
    if (c->kind == kFetchBody && c->uid == uid && !c->body_seen) return c.get();
  }
  return nullptr;
}

Status ImapClient::StatusForTagged(const Command& cmd, const imap::Response& r) const {
  std::string what = cmd.label + " at " + ServerName();
  if (!selected_.empty() && cmd.kind != kSelect && cmd.kind != kList) {
    what += " (mailbox \"" + selected_ + "\")";
  }
  const std::string said =
      r.status + (r.code_text.empty() ? "" : " [" + r.code_text + "]") + " " + r.text;
  if (r.status == "BAD") {
    return Status::InvalidArgument(what + ": the server rejected the command: " + said);
  }
  const std::string& c = r.code;
  if (c == "NONEXISTENT" || c == "TRYCREATE") return Status::NotFound(what + ": " + said);
  if (c == "ALREADYEXISTS") return Status::Exists(what + ": " + said);
  if (c == "NOPERM" || (IsWrite(cmd.kind) && selected_read_only_)) {
    return Status::ReadOnly(what + ": " + said);
  }
  if (c == "AUTHENTICATIONFAILED" || c == "AUTHORIZATIONFAILED" || c == "CANNOT") {
    return Status::InvalidArgument(what + ": " + said);
  }
  if (c == "UNAVAILABLE") return Status::Unavailable(what + ": " + said);
  // A NO to SELECT without a more precise code: dovecot, for one, says only "Mailbox doesn't
  // exist".
  if (cmd.kind == kSelect && c.empty()) return Status::NotFound(what + ": " + said);
  if (c == "LIMIT" || c == "OVERQUOTA") return Status::IoError(what + ": " + said);
  return Status::IoError(what + ": " + said);
}

// ---- Failure and teardown ----

void ImapClient::OnEvent(bufferevent* /*bev*/, short what, void* self_arg) noexcept {
  auto* self = static_cast<ImapClient*>(self_arg);
  if (what & BEV_EVENT_CONNECTED) {
    self->OnConnected();
    return;
  }
  if (what & (BEV_EVENT_EOF | BEV_EVENT_ERROR)) {
    // Whatever arrived before the end is still to be read (a BYE, a last answer).
    self->ReadInput();
    if (!self->bev_) return;
    self->OnConnectionEnd(what);
  }
}

void ImapClient::OnConnectionEnd(short what) {
  if (state_ == State::kLoggingOut) {
    // The goodbye: LOGOUT succeeded even if the server closed before its tagged OK.
    std::unique_ptr<Command> logout;
    for (auto it = in_flight_.begin(); it != in_flight_.end(); ++it) {
      if ((*it)->kind == kLogout) {
        logout = std::move(*it);
        in_flight_.erase(it);
        break;
      }
    }
    Disconnect();
    FailQueued(Status::Unavailable(ServerName() + ": logged out"));
    if (logout) CompleteCommand(*logout, Status::Ok());
    return;
  }
  std::string why;
  if (what & BEV_EVENT_ERROR) {
    unsigned long ssl_err = 0;
    std::string tls;
    while ((ssl_err = bufferevent_get_openssl_error(bev_)) != 0) {
      char buf[256];
      ERR_error_string_n(ssl_err, buf, sizeof buf);
      if (!tls.empty()) tls += "; ";
      tls += buf;
    }
    const int dns_err = bufferevent_socket_get_dns_error(bev_);
    if (dns_err != 0) {
      Fail(
          Status::Unavailable("cannot resolve " + url_.host + ": " + evutil_gai_strerror(dns_err)));
      return;
    }
    if (!tls.empty()) {
      Fail(Status::IoError("TLS with " + ServerName() + " failed: " + tls +
                           (tls.find("certificate verify failed") != std::string::npos
                                ? " (trust the CA that signed the server's certificate: ghostfs "
                                  "--cacert FILE, or cacert = \"FILE\" in the config file)"
                                : "")));
      return;
    }
    const int err = EVUTIL_SOCKET_ERROR();
    why = err != 0 ? evutil_socket_error_to_string(err) : "connection error";
    if (phase_ == Phase::kTcp) {
      Fail(Status::Unavailable("cannot connect to " + ServerName() + ": " + why +
                               "; check that the server is up and the network is reachable"));
      return;
    }
  } else {
    why = "the server closed the connection";
  }
  if (literal_left_ > 0) {
    why += " in the middle of a " + std::to_string(literal_total_) + "-byte literal (" +
           std::to_string(literal_left_) + " bytes missing)";
  } else if (!segments_.empty()) {
    why += " in the middle of a response";
  }
  if (!bye_text_.empty()) why += " (it said BYE " + bye_text_ + ")";
  std::string during;
  if (state_ == State::kConnecting) during = " while connecting";
  if (!in_flight_.empty()) during = " during " + in_flight_.front()->label;
  Fail(Status::Unavailable(ServerName() + ": " + why + during));
}

void ImapClient::Fail(Status status) {
  if (state_ == State::kDisconnected && !bev_) return;
  assert(!status.ok());
  const bool was_ready = state_ == State::kReady;
  Disconnect();
  if (connect_done_) {
    StatusCallback done = std::move(connect_done_);
    connect_done_ = nullptr;
    Defer([done, status] {
      if (done) done(status);
    });
  }
  FailQueued(status);
  if (was_ready && !closing_by_user_ && disconnect_handler_) {
    Defer([this, status] {
      if (disconnect_handler_) disconnect_handler_(status);
    });
  }
}

void ImapClient::FailQueued(Status status) {
  std::deque<std::unique_ptr<Command>> all = std::move(in_flight_);
  for (auto& c : queue_) all.push_back(std::move(c));
  in_flight_.clear();
  queue_.clear();
  for (auto& c : all) {
    if (c->internal || c->kind == kIdle) continue;  // no caller waits on these
    FailLater(std::move(c), status);
  }
}

void ImapClient::Disconnect() {
  if (bev_) {
    if (dispatch_depth_ > 0) {
      bufferevent_setcb(bev_, nullptr, nullptr, nullptr, nullptr);
      bufferevent_disable(bev_, EV_READ | EV_WRITE);
      doomed_.push_back(bev_);
    } else {
      bufferevent_free(bev_);
    }
    bev_ = nullptr;
  }
  evtimer_del(timeout_ev_);
  timeout_armed_ = false;
  event_del(idle_refresh_ev_);
  state_ = State::kDisconnected;
  phase_ = Phase::kNone;
  idle_state_ = IdleState::kOff;
  selected_.clear();
  selected_read_only_ = false;
  uid_by_seq_.clear();
  segments_.clear();
  scanned_ = 0;
  literal_left_ = 0;
  literal_cmd_ = nullptr;
  password_.clear();
}

void ImapClient::Close() {
  closing_by_user_ = true;
  Fail(Status::Unavailable("connection to " + ServerName() + " closed by the client"));
  closing_by_user_ = false;
  // Commands still queued while disconnected (none: Fail took them) and the deferred
  // callbacks run on the next turn.
}

// ---- Timers and deferred work ----

timeval ImapClient::ToTimeval(Duration d) {
  return timeval{static_cast<time_t>(d.count() / 1'000'000),
                 static_cast<suseconds_t>(d.count() % 1'000'000)};
}

void ImapClient::UpdateTimeout(bool activity) {
  bool outstanding = state_ == State::kConnecting || state_ == State::kLoggingOut;
  for (const auto& c : in_flight_) {
    if (c->kind == kIdle && idle_state_ == IdleState::kIdling) continue;
    outstanding = true;
  }
  if (!outstanding || options_.command_timeout <= Duration::zero()) {
    if (timeout_armed_) evtimer_del(timeout_ev_);
    timeout_armed_ = false;
    return;
  }
  if (timeout_armed_ && !activity) return;  // keep the earlier deadline
  const timeval tv = ToTimeval(options_.command_timeout);
  evtimer_add(timeout_ev_, &tv);
  timeout_armed_ = true;
}

void ImapClient::OnTimeout(int /*fd*/, short /*what*/, void* self_arg) noexcept {
  auto* self = static_cast<ImapClient*>(self_arg);
  self->timeout_armed_ = false;
  std::string what = self->state_ == State::kConnecting ? "connecting" : "an answer";
  if (!self->in_flight_.empty() && self->state_ != State::kConnecting) {
    what = "the answer to " + self->in_flight_.front()->label;
  }
  char secs[32];
  std::snprintf(secs, sizeof secs, "%g", ToSeconds(self->options_.command_timeout));
  self->Fail(Status::TimedOut(self->ServerName() + ": no data for " + secs +
                              " s while waiting for " + what +
                              " (command_timeout); the server or the network is stuck"));
  self->AssertInvariants();
}

void ImapClient::OnIdleRefresh(int /*fd*/, short /*what*/, void* self_arg) noexcept {
  static_cast<ImapClient*>(self_arg)->StopIdleNow();  // Pump re-enters IDLE after its OK
}

void ImapClient::ScheduleDeferred() {
  if (deferred_scheduled_) return;
  deferred_scheduled_ = true;
  event_active(deferred_ev_, EV_TIMEOUT, 0);
}

void ImapClient::OnDeferred(int /*fd*/, short /*what*/, void* self_arg) noexcept {
  auto* self = static_cast<ImapClient*>(self_arg);
  self->deferred_scheduled_ = false;
  std::deque<Deferred> work = std::move(self->deferred_);
  self->deferred_.clear();
  for (Deferred& d : work) {
    if (d.cmd) {
      self->CompleteCommand(*d.cmd, d.status);
    } else if (d.fn) {
      d.fn();
    }
  }
  self->AssertInvariants();
}

void ImapClient::Emit(const MailboxEvent& e) {
  if (event_handler_) event_handler_(e);
}

void ImapClient::AssertInvariants() const {
#ifndef NDEBUG
  assert((bev_ == nullptr) == (state_ == State::kDisconnected));
  assert(state_ == State::kConnecting || phase_ == Phase::kNone);
  assert(idle_state_ == IdleState::kOff || state_ == State::kReady);
  std::size_t waiting = 0;
  for (const auto& c : in_flight_) waiting += c->AwaitsContinuation() ? 1 : 0;
  assert(waiting <= 1 && "two commands wait for the server's \"+\"");
  assert(idle_state_ == IdleState::kOff || FindInFlightConst(kIdle) != nullptr);
  assert(literal_left_ == 0 || !segments_.empty());
  assert(state_ != State::kDisconnected || (in_flight_.empty() && queue_.empty()));
#endif
}

const ImapClient::Command* ImapClient::FindInFlightConst(int kind) const {
  for (const auto& c : in_flight_) {
    if (c->kind == kind) return c.get();
  }
  return nullptr;
}

// ---- Public commands ----

namespace {

std::string FlagList(const std::vector<std::string>& flags) {
  std::string out = "(";
  for (std::size_t i = 0; i < flags.size(); ++i) {
    if (i) out += " ";
    out += flags[i];
  }
  return out + ")";
}

}  // namespace

void ImapClient::List(std::string reference, std::string pattern,
                      ResultCallback<std::vector<MailboxInfo>> done) {
  auto cmd = std::make_unique<Command>();
  cmd->kind = kList;
  cmd->label = "LIST \"" + reference + "\" \"" + pattern + "\"";
  cmd->build = [reference, pattern](const ImapCapabilities& caps) {
    std::vector<std::string> parts = {"LIST "};
    imap::AppendString(reference, caps.literal_plus(), &parts);
    parts.back() += " ";
    imap::AppendString(pattern, caps.literal_plus(), &parts);
    parts.back() += "\r\n";
    return parts;
  };
  cmd->complete = [done = std::move(done)](Command& c, Status s) {
    if (!done) return;
    if (!s.ok()) {
      done(s);
    } else {
      done(std::move(c.list));
    }
  };
  Enqueue(std::move(cmd));
}

void ImapClient::Select(std::string mailbox, ResultCallback<MailboxStatus> done) {
  SelectOrExamine(std::move(mailbox), /*examine=*/false, std::move(done));
}

void ImapClient::Examine(std::string mailbox, ResultCallback<MailboxStatus> done) {
  SelectOrExamine(std::move(mailbox), /*examine=*/true, std::move(done));
}

void ImapClient::SelectOrExamine(std::string mailbox, bool examine,
                                 ResultCallback<MailboxStatus> done) {
  auto cmd = std::make_unique<Command>();
  cmd->kind = kSelect;
  const char* verb = examine ? "EXAMINE" : "SELECT";
  cmd->label = std::string(verb) + " \"" + mailbox + "\"";
  cmd->mailbox = mailbox;
  cmd->mbox.name = mailbox;
  cmd->mbox.read_only = examine;
  cmd->build = [mailbox, verb](const ImapCapabilities& caps) {
    std::vector<std::string> parts = {std::string(verb) + " "};
    imap::AppendString(mailbox, caps.literal_plus(), &parts);
    parts.back() += "\r\n";
    return parts;
  };
  cmd->complete = [this, done = std::move(done)](Command& c, Status s) {
    if (s.ok() && c.mbox.uidvalidity == 0) {
      s = Status::Corruption(ServerName() + " selected \"" + c.mailbox +
                             "\" without saying its UIDVALIDITY");
    }
    if (s.ok() && state_ == State::kReady) {
      selected_ = c.mailbox;
      selected_read_only_ = c.mbox.read_only;
    }
    if (!done) return;
    if (!s.ok()) {
      done(s);
    } else {
      done(std::move(c.mbox));
    }
  };
  Enqueue(std::move(cmd));
}

void ImapClient::FetchSummary(std::string uid_set,
                              ResultCallback<std::vector<MessageSummary>> done) {
  auto cmd = std::make_unique<Command>();
  cmd->kind = kFetchSummary;
  cmd->label = "UID FETCH " + uid_set + " (UID FLAGS RFC822.SIZE INTERNALDATE)";
  if (!imap::IsValidUidSet(uid_set)) {
    cmd->complete = [done](Command&, Status s) {
      if (done) done(s);
    };
    FailLater(std::move(cmd), Status::InvalidArgument("\"" + uid_set +
                                                      "\" is not a UID set (e.g. 1:*, 7, 3,9:12)"));
    return;
  }
  cmd->uid_set = uid_set;
  cmd->build = [uid_set](const ImapCapabilities&) {
    return std::vector<std::string>{"UID FETCH " + uid_set +
                                    " (UID FLAGS RFC822.SIZE INTERNALDATE)\r\n"};
  };
  cmd->complete = [done = std::move(done)](Command& c, Status s) {
    if (!done) return;
    if (!s.ok()) {
      done(s);
    } else {
      done(std::move(c.summaries));
    }
  };
  Enqueue(std::move(cmd));
}

void ImapClient::FetchSummaryRange(std::uint32_t first, std::optional<std::uint32_t> last,
                                   ResultCallback<std::vector<MessageSummary>> done) {
  FetchSummary(std::to_string(first) + ":" + (last ? std::to_string(*last) : "*"), std::move(done));
}

void ImapClient::FetchBody(std::uint32_t uid, DataCallback on_data, StatusCallback on_done) {
  auto cmd = std::make_unique<Command>();
  cmd->kind = kFetchBody;
  cmd->uid = uid;
  cmd->label = "UID FETCH " + std::to_string(uid) + " BODY.PEEK[]";
  cmd->on_data = std::move(on_data);
  cmd->complete = [this, on_done = std::move(on_done)](Command& c, Status s) {
    if (s.ok() && !c.receiver_status.ok()) s = c.receiver_status;
    if (s.ok() && !c.body_seen) {
      s = Status::NotFound("no message with UID " + std::to_string(c.uid) + " in \"" + selected_ +
                           "\" at " + ServerName() + " (expunged, or the mailbox changed)");
    }
    if (on_done) on_done(s);
  };
  if (uid == 0) {
    FailLater(std::move(cmd), Status::InvalidArgument("UID 0 does not exist"));
    return;
  }
  cmd->build = [uid](const ImapCapabilities&) {
    return std::vector<std::string>{"UID FETCH " + std::to_string(uid) + " (UID BODY.PEEK[])\r\n"};
  };
  Enqueue(std::move(cmd));
}

void ImapClient::Append(std::string mailbox, std::vector<std::string> flags,
                        std::optional<std::int64_t> internaldate, std::string message,
                        ResultCallback<AppendResult> done) {
  auto cmd = std::make_unique<Command>();
  cmd->kind = kAppend;
  cmd->label =
      "APPEND \"" + mailbox + "\" " + FlagList(flags) + " {" + std::to_string(message.size()) + "}";
  cmd->complete = [done](Command& c, Status s) {
    if (!done) return;
    if (!s.ok()) {
      done(s);
    } else {
      done(c.append);
    }
  };
  for (const std::string& f : flags) {
    if (!imap::IsValidFlag(f) || EqualsIgnoreCaseAscii(f, "\\Recent")) {
      FailLater(std::move(cmd),
                Status::InvalidArgument("\"" + f + "\" is not a flag APPEND can set"));
      return;
    }
  }
  auto msg = std::make_shared<std::string>(std::move(message));
  cmd->build = [mailbox, flags, internaldate, msg](const ImapCapabilities& caps) {
    std::vector<std::string> parts = {"APPEND "};
    imap::AppendString(mailbox, caps.literal_plus(), &parts);
    parts.back() += " " + FlagList(flags);
    if (internaldate) parts.back() += " \"" + imap::FormatInternalDate(*internaldate) + "\"";
    parts.back() += " {" + std::to_string(msg->size()) + (caps.literal_plus() ? "+" : "") + "}\r\n";
    if (caps.literal_plus()) {
      parts.back() += *msg;
    } else {
      parts.push_back(*msg);
    }
    parts.back() += "\r\n";
    msg->clear();
    msg->shrink_to_fit();
    return parts;
  };
  Enqueue(std::move(cmd));
}

void ImapClient::UidStore(std::string uid_set, StoreMode mode, std::vector<std::string> flags,
                          StatusCallback done) {
  auto cmd = std::make_unique<Command>();
  cmd->kind = kStore;
  const char* op = mode == StoreMode::kAdd      ? "+FLAGS.SILENT"
                   : mode == StoreMode::kRemove ? "-FLAGS.SILENT"
                                                : "FLAGS.SILENT";
  const std::string text = "UID STORE " + uid_set + " " + op + " " + FlagList(flags);
  cmd->label = text;
  cmd->complete = [done](Command&, Status s) {
    if (done) done(s);
  };
  if (!imap::IsValidUidSet(uid_set)) {
    FailLater(std::move(cmd), Status::InvalidArgument("\"" + uid_set + "\" is not a UID set"));
    return;
  }
  for (const std::string& f : flags) {
    if (!imap::IsValidFlag(f) || EqualsIgnoreCaseAscii(f, "\\Recent")) {
      FailLater(std::move(cmd),
                Status::InvalidArgument("\"" + f + "\" is not a flag STORE can set"));
      return;
    }
  }
  cmd->build = [text](const ImapCapabilities&) { return std::vector<std::string>{text + "\r\n"}; };
  Enqueue(std::move(cmd));
}

void ImapClient::UidExpunge(std::string uid_set, StatusCallback done) {
  auto cmd = MakeExpunge(uid_set, std::move(done));
  if (!imap::IsValidUidSet(uid_set)) {
    FailLater(std::move(cmd), Status::InvalidArgument("\"" + uid_set + "\" is not a UID set"));
    return;
  }
  Enqueue(std::move(cmd));
}

std::unique_ptr<ImapClient::Command> ImapClient::MakeExpunge(const std::string& uid_set,
                                                             StatusCallback done) {
  auto cmd = std::make_unique<Command>();
  cmd->kind = kExpunge;
  cmd->label = "UID EXPUNGE " + uid_set;
  cmd->complete = [done = std::move(done)](Command&, Status s) {
    if (done) done(s);
  };
  cmd->build = [uid_set](const ImapCapabilities& caps) {
    // Without UIDPLUS only a plain EXPUNGE exists (it removes every \Deleted message).
    return std::vector<std::string>{caps.uidplus() ? "UID EXPUNGE " + uid_set + "\r\n"
                                                   : std::string("EXPUNGE\r\n")};
  };
  return cmd;
}

void ImapClient::UidMove(std::string uid_set, std::string destination,
                         ResultCallback<MoveResult> done) {
  auto cmd = std::make_unique<Command>();
  cmd->kind = kMove;
  cmd->label = "UID MOVE " + uid_set + " \"" + destination + "\"";
  cmd->uid_set = uid_set;
  cmd->mailbox = destination;
  if (!imap::IsValidUidSet(uid_set)) {
    cmd->complete = [done](Command&, Status s) {
      if (done) done(s);
    };
    FailLater(std::move(cmd), Status::InvalidArgument("\"" + uid_set + "\" is not a UID set"));
    return;
  }
  cmd->build = [uid_set, destination](const ImapCapabilities& caps) {
    std::vector<std::string> parts = {(caps.move() ? "UID MOVE " : "UID COPY ") + uid_set + " "};
    imap::AppendString(destination, caps.literal_plus(), &parts);
    parts.back() += "\r\n";
    return parts;
  };
  cmd->complete = [this, done](Command& c, Status s) {
    if (!s.ok() || caps_.move()) {
      if (!done) return;
      if (!s.ok()) {
        done(s);
      } else {
        done(std::move(c.move));
      }
      return;
    }
    // The fallback went out as UID COPY: now flag the originals and expunge them, each step
    // next in line (ahead of commands issued meanwhile).
    MoveResult copied = std::move(c.move);
    const std::string set = c.uid_set;
    auto expunge = MakeExpunge(set, [done, copied](Status e) {
      if (!done) return;
      if (!e.ok()) {
        done(e.WithContext("moving by COPY+STORE+EXPUNGE (copied; originals not removed)"));
      } else {
        done(copied);
      }
    });
    auto store = std::make_unique<Command>();
    store->kind = kStore;
    store->label = "UID STORE " + set + " +FLAGS.SILENT (\\Deleted)";
    store->build = [set](const ImapCapabilities&) {
      return std::vector<std::string>{"UID STORE " + set + " +FLAGS.SILENT (\\Deleted)\r\n"};
    };
    auto expunge_holder = std::make_shared<std::unique_ptr<Command>>(std::move(expunge));
    store->complete = [this, done, expunge_holder](Command&, Status st) {
      if (!st.ok()) {
        if (done) done(st.WithContext("moving by COPY+STORE+EXPUNGE (copied; originals kept)"));
        return;
      }
      if (state_ == State::kDisconnected) {
        FailLater(std::move(*expunge_holder), Status::Unavailable("connection lost mid-move"));
        return;
      }
      queue_.push_front(std::move(*expunge_holder));
      Pump();
    };
    if (state_ == State::kDisconnected) {
      FailLater(std::move(store), Status::Unavailable("connection lost mid-move"));
      return;
    }
    queue_.push_front(std::move(store));
    Pump();
  };
  Enqueue(std::move(cmd));
}

void ImapClient::UidCopy(std::string uid_set, std::string destination,
                         ResultCallback<MoveResult> done) {
  auto cmd = std::make_unique<Command>();
  cmd->kind = kCopy;
  cmd->label = "UID COPY " + uid_set + " \"" + destination + "\"";
  cmd->uid_set = uid_set;
  cmd->mailbox = destination;
  cmd->complete = [done](Command& c, Status s) {
    if (!done) return;
    if (!s.ok()) return done(s);
    done(std::move(c.move));
  };
  if (!imap::IsValidUidSet(uid_set)) {
    FailLater(std::move(cmd), Status::InvalidArgument("\"" + uid_set + "\" is not a UID set"));
    return;
  }
  cmd->build = [uid_set, destination](const ImapCapabilities& caps) {
    std::vector<std::string> parts = {"UID COPY " + uid_set + " "};
    imap::AppendString(destination, caps.literal_plus(), &parts);
    parts.back() += "\r\n";
    return parts;
  };
  Enqueue(std::move(cmd));
}

void ImapClient::Create(std::string mailbox, StatusCallback done) {
  SimpleMailboxCommand(kCreate, "CREATE", std::move(mailbox), std::move(done));
}

void ImapClient::Delete(std::string mailbox, StatusCallback done) {
  SimpleMailboxCommand(kDelete, "DELETE", std::move(mailbox), std::move(done));
}

void ImapClient::SimpleMailboxCommand(int kind, const char* verb, std::string mailbox,
                                      StatusCallback done) {
  auto cmd = std::make_unique<Command>();
  cmd->kind = kind;
  cmd->label = std::string(verb) + " \"" + mailbox + "\"";
  cmd->complete = [done = std::move(done)](Command&, Status s) {
    if (done) done(s);
  };
  cmd->build = [verb, mailbox](const ImapCapabilities& caps) {
    std::vector<std::string> parts = {std::string(verb) + " "};
    imap::AppendString(mailbox, caps.literal_plus(), &parts);
    parts.back() += "\r\n";
    return parts;
  };
  Enqueue(std::move(cmd));
}

void ImapClient::UidSearchHeader(std::string field, std::string value,
                                 ResultCallback<std::vector<std::uint32_t>> done) {
  bool field_ok = !field.empty();
  for (char ch : field) {
    if (!(std::isalnum(static_cast<unsigned char>(ch)) || ch == '-')) field_ok = false;
  }
  UidSearch("HEADER " + field + " \"" + value + "\"",
            [field, value](const ImapCapabilities& caps) {
              std::vector<std::string> parts = {"UID SEARCH HEADER " + field + " "};
              imap::AppendString(value, caps.literal_plus(), &parts);
              parts.back() += "\r\n";
              return parts;
            },
            field_ok ? Status::Ok() : Status::InvalidArgument("\"" + field + "\" is not a header field name"),
            std::move(done));
}

void ImapClient::UidSearchNearDate(std::int64_t unix_seconds, ResultCallback<std::vector<std::uint32_t>> done) {
  // "dd-Mon-yyyy" of the UTC day `days` after 1970-01-01 (the date part of an INTERNALDATE).
  auto date = [](std::int64_t days) { return imap::FormatInternalDate(days * 86400).substr(0, 11); };
  std::int64_t day = unix_seconds / 86400 - (unix_seconds % 86400 < 0 ? 1 : 0);
  // SINCE is "on or after", BEFORE "earlier than": the days day-1, day and day+1.
  std::string criteria = "SINCE " + date(day - 1) + " BEFORE " + date(day + 2);
  UidSearch(criteria,
            [criteria](const ImapCapabilities&) { return std::vector<std::string>{"UID SEARCH " + criteria + "\r\n"}; },
            Status::Ok(), std::move(done));
}

void ImapClient::UidSearch(std::string label, std::function<std::vector<std::string>(const ImapCapabilities&)> build,
                           Status invalid, ResultCallback<std::vector<std::uint32_t>> done) {
  auto cmd = std::make_unique<Command>();
  cmd->kind = kSearch;
  cmd->label = "UID SEARCH " + label;
  cmd->complete = [done = std::move(done)](Command& c, Status s) {
    if (!done) return;
    if (!s.ok()) {
      done(s);
    } else {
      done(std::move(c.found));
    }
  };
  if (!invalid.ok()) {
    FailLater(std::move(cmd), std::move(invalid));
    return;
  }
  cmd->build = std::move(build);
  Enqueue(std::move(cmd));
}

void ImapClient::Noop(StatusCallback done) {
  auto cmd = std::make_unique<Command>();
  cmd->kind = kNoop;
  cmd->label = "NOOP";
  cmd->complete = [done = std::move(done)](Command&, Status s) {
    if (done) done(s);
  };
  cmd->build = [](const ImapCapabilities&) { return std::vector<std::string>{"NOOP\r\n"}; };
  Enqueue(std::move(cmd));
}

void ImapClient::Logout(StatusCallback done) {
  auto cmd = std::make_unique<Command>();
  cmd->kind = kLogout;
  cmd->label = "LOGOUT";
  cmd->complete = [done = std::move(done)](Command&, Status s) {
    if (done) done(s);
  };
  cmd->build = [](const ImapCapabilities&) { return std::vector<std::string>{"LOGOUT\r\n"}; };
  if (state_ == State::kDisconnected) {
    FailLater(std::move(cmd), Status::Ok());  // nothing to log out of
    return;
  }
  Enqueue(std::move(cmd));
}

Status ImapClient::StartIdle() {
  if (state_ == State::kReady && !caps_.idle()) {
    return Status::NotSupported(ServerName() + " does not support IDLE (RFC 2177)");
  }
  idle_wanted_ = true;
  Pump();
  return Status::Ok();
}

void ImapClient::StopIdle() {
  idle_wanted_ = false;
  StopIdleNow();
}

bool ImapClient::idling() const { return idle_state_ == IdleState::kIdling; }

void ImapClient::SetEventHandler(std::function<void(const MailboxEvent&)> handler) {
  event_handler_ = std::move(handler);
}

void ImapClient::SetDisconnectHandler(std::function<void(Status)> handler) {
  disconnect_handler_ = std::move(handler);
}

std::size_t ImapClient::pending() const {
  std::size_t n = queue_.size();
  for (const auto& c : in_flight_) n += (c->internal || c->kind == kIdle) ? 0 : 1;
  return n;
}

std::uint32_t ImapClient::UidForSeq(std::uint32_t seq) const {
  if (seq == 0 || seq > uid_by_seq_.size()) return 0;
  return uid_by_seq_[seq - 1];
}

}  // namespace ghost
