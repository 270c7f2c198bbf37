// The IMAP proxy's framer and recognizers. See proxy/imap_wire.h.
#include "proxy/imap_wire.h"

#include <openssl/evp.h>
#include <strings.h>

#include <algorithm>
#include <cctype>
#include <charconv>

namespace ghost::imapwire {

namespace {

bool IEquals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (std::toupper(static_cast<unsigned char>(a[i])) != std::toupper(static_cast<unsigned char>(b[i])))
      return false;
  }
  return true;
}

bool IStartsWith(std::string_view s, std::string_view prefix) {
  return s.size() >= prefix.size() && IEquals(s.substr(0, prefix.size()), prefix);
}

std::string Upper(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return out;
}

void SkipSpaces(std::string_view* s) {
  while (!s->empty() && s->front() == ' ') s->remove_prefix(1);
}

std::string_view Word(std::string_view* s) {
  SkipSpaces(s);
  std::size_t end = s->find(' ');
  if (end == std::string_view::npos) end = s->size();
  std::string_view w = s->substr(0, end);
  s->remove_prefix(end);
  return w;
}

std::optional<std::uint32_t> Number(std::string_view s) {
  if (s.empty() || s.size() > 10) return std::nullopt;
  std::uint64_t v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || p != s.data() + s.size() || v == 0 || v > 0xffffffffu) return std::nullopt;
  return static_cast<std::uint32_t>(v);
}

}  // namespace

std::string_view StripEol(std::string_view line) {
  if (!line.empty() && line.back() == '\n') line.remove_suffix(1);
  if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
  return line;
}

std::optional<std::uint64_t> AnnouncedLiteral(std::string_view line, bool* nonsync, bool* bad) {
  *bad = false;
  *nonsync = false;
  line = StripEol(line);
  if (line.empty() || line.back() != '}') return std::nullopt;
  std::size_t open = line.rfind('{');
  if (open == std::string_view::npos) return std::nullopt;
  std::string_view inside = line.substr(open + 1, line.size() - open - 2);
  if (!inside.empty() && inside.back() == '+') {
    *nonsync = true;
    inside.remove_suffix(1);
  }
  // "{...}" that is not a size ends a line only in a malformed stream (a quoted string cannot
  // end a line; an atom cannot hold braces).
  if (inside.empty() || inside.size() > 19 ||
      !std::all_of(inside.begin(), inside.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    *bad = true;
    return std::nullopt;
  }
  std::uint64_t n = 0;
  std::from_chars(inside.data(), inside.data() + inside.size(), n);
  return n;
}

std::size_t Framer::Next(std::string_view in, Event* ev) {
  *ev = Event{};
  if (clear_line_) {
    line_.clear();
    clear_line_ = false;
  }
  auto fail = [&](std::string why) {
    state_ = State::kFailed;
    error_ = std::move(why);
    ev->kind = Event::Kind::kError;
    ev->error = error_;
    return std::size_t{0};
  };
  switch (state_) {
    case State::kFailed:
      ev->kind = Event::Kind::kError;
      ev->error = error_;
      return 0;
    case State::kLiteral: {
      if (literal_left_ == 0) {
        state_ = State::kLine;
        ev->kind = Event::Kind::kLiteralEnd;
        return 0;
      }
      if (in.empty()) return 0;
      std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(literal_left_, in.size()));
      literal_left_ -= n;
      ev->kind = Event::Kind::kLiteralData;
      ev->text = in.substr(0, n);
      return n;
    }
    case State::kLine:
      break;
  }
  std::size_t nl = in.find('\n');
  auto keep_start = [&] {  // for partial(): enough to name the tag
    if (line_.size() < 256) line_.append(in.substr(0, std::min<std::size_t>(256 - line_.size(), in.size())));
  };
  if (nl == std::string_view::npos) {
    if (line_.size() + in.size() > limits_.max_line) keep_start();
    if (line_.size() + in.size() > limits_.max_line)
      return fail("line longer than " + std::to_string(limits_.max_line) + " bytes");
    line_.append(in);
    return in.size();
  }
  if (line_.size() + nl + 1 > limits_.max_line) keep_start();
  if (line_.size() + nl + 1 > limits_.max_line)
    return fail("line longer than " + std::to_string(limits_.max_line) + " bytes");
  line_.append(in.substr(0, nl + 1));
  bool nonsync = false, bad = false;
  std::optional<std::uint64_t> lit = AnnouncedLiteral(line_, &nonsync, &bad);
  if (bad) return fail("malformed literal size");
  if (lit && *lit > limits_.max_literal)
    return fail("literal of " + std::to_string(*lit) + " bytes is over the limit of " +
                std::to_string(limits_.max_literal));
  ev->kind = Event::Kind::kSegment;
  ev->text = line_;
  ev->first = !continuing_;
  ev->literal = lit;
  ev->nonsync = nonsync;
  continuing_ = lit.has_value();
  if (lit) {
    state_ = State::kLiteral;
    literal_left_ = *lit;
  }
  clear_line_ = true;
  return nl + 1;
}

std::optional<Command> ParseCommand(std::string_view line) {
  std::string_view s = StripEol(line);
  Command c;
  std::string_view tag = Word(&s);
  if (tag.empty() || tag == "*" || tag == "+") return std::nullopt;
  c.tag = std::string(tag);
  std::string_view name = Word(&s);
  if (name.empty()) return std::nullopt;
  c.name = Upper(name);
  if (c.name == "UID") {
    std::string_view sub = Word(&s);
    if (sub.empty()) return std::nullopt;
    c.name += " " + Upper(sub);
  }
  SkipSpaces(&s);
  c.rest = s;
  return c;
}

std::optional<std::string> ReadAstring(std::string_view* s) {
  SkipSpaces(s);
  if (s->empty()) return std::nullopt;
  if (s->front() == '"') {
    std::string out;
    for (std::size_t i = 1; i < s->size(); ++i) {
      char c = (*s)[i];
      if (c == '\\') {
        if (++i >= s->size()) return std::nullopt;
        out += (*s)[i];
      } else if (c == '"') {
        s->remove_prefix(i + 1);
        return out;
      } else {
        out += c;
      }
    }
    return std::nullopt;
  }
  if (s->front() == '{') return std::nullopt;
  std::size_t end = 0;
  while (end < s->size()) {
    char c = (*s)[end];
    if (c == ' ' || c == '(' || c == ')' || c == '"' || c == '{' || c < 0x20 || c == 0x7f) break;
    ++end;
  }
  if (end == 0) return std::nullopt;
  std::string out(s->substr(0, end));
  s->remove_prefix(end);
  return out;
}

std::optional<BodyFetch> ParseBodyFetch(std::string_view rest) {
  rest = StripEol(rest);
  BodyFetch f;
  std::string_view num = Word(&rest);
  std::optional<std::uint32_t> n = Number(num);
  if (!n) return std::nullopt;
  f.number = *n;
  SkipSpaces(&rest);
  bool parens = !rest.empty() && rest.front() == '(';
  if (parens) {
    if (rest.back() != ')') return std::nullopt;
    rest = rest.substr(1, rest.size() - 2);
  }
  int bodies = 0;
  while (true) {
    // One fetch-att: up to a space outside brackets ("BODY.PEEK[HEADER.FIELDS (A B)]<0.10>").
    SkipSpaces(&rest);
    std::size_t end = 0;
    int depth = 0;
    for (; end < rest.size(); ++end) {
      char c = rest[end];
      if (c == '[') {
        if (++depth > 1) return std::nullopt;
      } else if (c == ']') {
        if (--depth < 0) return std::nullopt;
      } else if (c == ' ' && depth == 0) {
        break;
      }
    }
    if (depth != 0) return std::nullopt;
    std::string_view w = rest.substr(0, end);
    rest.remove_prefix(end);
    if (w.empty()) break;
    if (!parens && bodies > 0) return std::nullopt;
    if (IEquals(w, "UID")) continue;
    if (IEquals(w, "RFC822")) {
      f.item = BodyFetch::Item::kRfc822;
      ++bodies;
      continue;
    }
    std::size_t open = w.find('[');
    std::size_t close = w.find(']');
    if (open == std::string_view::npos || close == std::string_view::npos || close < open) return std::nullopt;
    std::string_view name = w.substr(0, open);
    if (IEquals(name, "BODY")) {
      f.item = BodyFetch::Item::kBody;
    } else if (IEquals(name, "BODY.PEEK")) {
      f.item = BodyFetch::Item::kBodyPeek;
    } else if (IEquals(name, "BINARY")) {
      f.item = BodyFetch::Item::kBinary;
    } else if (IEquals(name, "BINARY.PEEK")) {
      f.item = BodyFetch::Item::kBinaryPeek;
    } else if (IEquals(name, "BINARY.SIZE")) {
      f.item = BodyFetch::Item::kBinarySize;
    } else {
      return std::nullopt;
    }
    std::optional<Section> section = ParseSection(w.substr(open + 1, close - open - 1));
    if (!section) return std::nullopt;
    // BINARY takes a part path only (RFC 3516 §4.2), and BINARY.SIZE no partial.
    // BINARY[] (the whole message) goes to the server: not answered here.
    if (f.binary() && (section->text != Section::Text::kAll || section->part.empty())) return std::nullopt;
    f.section = std::move(*section);
    std::string_view after = w.substr(close + 1);
    if (!after.empty()) {
      // A partial: <start.count> (RFC 3501 §6.4.5).
      if (after.size() < 5 || after.front() != '<' || after.back() != '>') return std::nullopt;
      std::string_view range = after.substr(1, after.size() - 2);
      std::size_t dot = range.find('.');
      if (dot == std::string_view::npos) return std::nullopt;
      std::string_view a = range.substr(0, dot), b = range.substr(dot + 1);
      auto digits = [](std::string_view d) {
        return !d.empty() && d.size() <= 10 &&
               std::all_of(d.begin(), d.end(), [](char c) { return c >= '0' && c <= '9'; });
      };
      if (!digits(a) || !digits(b)) return std::nullopt;
      std::uint64_t start = 0, count = 0;
      std::from_chars(a.data(), a.data() + a.size(), start);
      std::from_chars(b.data(), b.data() + b.size(), count);
      if (count == 0 || f.item == BodyFetch::Item::kBinarySize) return std::nullopt;
      f.partial = std::make_pair(start, count);
    }
    ++bodies;
  }
  if (bodies != 1) return std::nullopt;
  return f;
}

std::optional<BodyPrefix> ParseBodyPrefix(std::string_view segment) {
  std::string_view s = StripEol(segment);
  if (!s.starts_with("* ")) return std::nullopt;
  s.remove_prefix(2);
  std::optional<std::uint32_t> seq = Number(Word(&s));
  if (!seq) return std::nullopt;
  if (!IEquals(Word(&s), "FETCH")) return std::nullopt;
  SkipSpaces(&s);
  if (s.empty() || s.front() != '(') return std::nullopt;
  s.remove_prefix(1);
  bool nonsync = false, bad = false;
  std::optional<std::uint64_t> size = AnnouncedLiteral(s, &nonsync, &bad);
  if (!size || nonsync) return std::nullopt;
  std::string_view items = s.substr(0, s.rfind('{'));
  // The literal must belong to a whole-body item: the last word before it.
  std::string_view head = items;
  while (!head.empty() && head.back() == ' ') head.remove_suffix(1);
  std::size_t sp = head.rfind(' ');
  std::string_view item = sp == std::string_view::npos ? head : head.substr(sp + 1);
  if (!IEquals(item, "BODY[]") && !IEquals(item, "RFC822")) return std::nullopt;
  BodyPrefix p;
  p.seq = *seq;
  p.size = *size;
  // Earlier items are simple (UID n, FLAGS (...), RFC822.SIZE n ...): find "UID n" as words.
  std::string_view rest = head.substr(0, sp == std::string_view::npos ? 0 : sp);
  std::string_view prev;
  while (true) {
    std::string_view w = Word(&rest);
    if (w.empty()) break;
    if (IEquals(prev, "UID")) {
      std::string_view digits = w;
      while (!digits.empty() && digits.back() == ')') digits.remove_suffix(1);
      p.uid = Number(digits);
    }
    // "(UID" at the start of a parenthesized list cannot occur here (we removed '('), but
    // FLAGS lists may hold "UID"-looking atoms only as flags with a backslash or keywords.
    prev = w;
  }
  return p;
}

std::optional<std::uint32_t> UntaggedNumber(std::string_view line, std::string_view keyword) {
  std::string_view s = StripEol(line);
  if (!s.starts_with("* ")) return std::nullopt;
  s.remove_prefix(2);
  std::string_view num = Word(&s);
  std::optional<std::uint32_t> n;
  if (num == "0") {
    n = 0;
  } else {
    n = Number(num);
  }
  if (!n) return std::nullopt;
  if (!IEquals(Word(&s), keyword)) return std::nullopt;
  SkipSpaces(&s);
  if (!s.empty()) return std::nullopt;
  return n;
}

std::optional<std::uint32_t> UidValidity(std::string_view line) {
  std::string_view s = StripEol(line);
  if (!s.starts_with("* ")) return std::nullopt;
  std::string upper = Upper(s);
  std::size_t at = upper.find("[UIDVALIDITY ");
  if (at == std::string::npos) return std::nullopt;
  std::string_view v = s.substr(at + 13);
  std::size_t close = v.find(']');
  if (close == std::string_view::npos) return std::nullopt;
  return Number(v.substr(0, close));
}

std::optional<std::vector<std::uint32_t>> EsearchUids(std::string_view line, std::string_view tag,
                                                      std::size_t max_uids) {
  std::string_view s = StripEol(line);
  if (!IStartsWith(s, "* ESEARCH (TAG \"")) return std::nullopt;
  s.remove_prefix(16);
  if (!s.starts_with(tag) || s.substr(tag.size()).substr(0, 2) != "\")") return std::nullopt;
  s.remove_prefix(tag.size() + 2);
  std::vector<std::uint32_t> uids;
  if (!IEquals(Word(&s), "UID")) return std::nullopt;
  std::string_view key = Word(&s);
  if (key.empty()) return uids;
  if (!IEquals(key, "ALL")) return std::nullopt;
  std::string_view set = Word(&s);
  while (!set.empty()) {
    std::size_t comma = set.find(',');
    std::string_view part = set.substr(0, comma);
    set = comma == std::string_view::npos ? std::string_view() : set.substr(comma + 1);
    std::size_t colon = part.find(':');
    std::optional<std::uint32_t> a = Number(part.substr(0, colon));
    std::optional<std::uint32_t> b = colon == std::string_view::npos ? a : Number(part.substr(colon + 1));
    if (!a || !b) return std::nullopt;
    std::uint32_t lo = std::min(*a, *b), hi = std::max(*a, *b);
    if (hi - lo >= max_uids || uids.size() + (hi - lo) + 1 > max_uids) return std::nullopt;
    for (std::uint64_t u = lo; u <= hi; ++u) uids.push_back(static_cast<std::uint32_t>(u));
  }
  std::sort(uids.begin(), uids.end());
  uids.erase(std::unique(uids.begin(), uids.end()), uids.end());
  return uids;
}

namespace {

// Where the capability list of "* CAPABILITY ..." or a "[CAPABILITY ...]" code is in `body`
// (a line without its line end): [start, end). False when the line has none.
bool FindCapabilityList(std::string_view body, std::size_t* start, std::size_t* end) {
  std::string upper = Upper(body);
  if (upper.starts_with("* CAPABILITY ")) {
    *start = 13;
    *end = body.size();
    return true;
  }
  if (std::size_t at = upper.find("[CAPABILITY "); at != std::string::npos) {
    *start = at + 12;
    *end = upper.find(']', *start);
    return *end != std::string::npos;
  }
  return false;
}

// `line` with its capability list rewritten by `keep` (a word -> whether it stays) and
// `extra` appended (words not already there); byte for byte `line` when nothing changes.
template <typename Keep>
std::string RewriteCapabilities(std::string_view line, Keep keep, const std::vector<std::string>& extra) {
  std::string_view body = StripEol(line);
  std::string_view eol = line.substr(body.size());
  std::size_t start, end;
  if (!FindCapabilityList(body, &start, &end)) return std::string(line);
  std::string kept;
  std::vector<std::string> present;
  bool changed = false;
  std::string_view caps = body.substr(start, end - start);
  while (true) {
    std::string_view w = Word(&caps);
    if (w.empty()) break;
    std::string u = Upper(w);
    if (!keep(u)) {
      changed = true;
      continue;
    }
    present.push_back(u);
    if (!kept.empty()) kept += ' ';
    kept += w;
  }
  for (const std::string& x : extra) {
    if (std::find(present.begin(), present.end(), x) != present.end()) continue;
    changed = true;
    if (!kept.empty()) kept += ' ';
    kept += x;
  }
  if (!changed) return std::string(line);  // byte for byte what the server said
  return std::string(body.substr(0, start)) + kept + std::string(body.substr(end)) + std::string(eol);
}

}  // namespace

std::string FilterCapabilities(std::string_view line) {
  return RewriteCapabilities(
      line,
      [](const std::string& u) {
        return !(u.starts_with("COMPRESS=") || u == "STARTTLS" || u == "QRESYNC" ||
                 (u.starts_with("AUTH=") && u != "AUTH=PLAIN"));
      },
      {});
}

std::optional<std::string> GreetingCapabilities(std::string_view greeting) {
  greeting = StripEol(greeting);
  const std::string upper = Upper(greeting);
  std::size_t at = upper.find("[CAPABILITY ");
  if (at == std::string::npos || !upper.starts_with("* ")) return std::nullopt;
  std::size_t end = greeting.find(']', at);
  if (end == std::string_view::npos) return std::nullopt;
  return std::string(greeting.substr(at + 12, end - at - 12));
}

std::string GreetingWithoutCapabilities(std::string_view greeting) {
  const std::string upper = Upper(greeting);
  std::size_t at = upper.find("[CAPABILITY ");
  std::size_t end = at == std::string::npos ? at : greeting.find(']', at);
  if (end == std::string_view::npos) return std::string(greeting);
  std::size_t after = end + 1;
  if (after < greeting.size() && greeting[after] == ' ') ++after;
  return std::string(greeting.substr(0, at)) + std::string(greeting.substr(after));
}

bool HasCapability(std::string_view caps, std::string_view name) {
  while (!caps.empty()) {
    std::size_t sp = caps.find(' ');
    std::string_view word = caps.substr(0, sp);
    if (word.size() == name.size() && strncasecmp(word.data(), name.data(), name.size()) == 0) return true;
    if (sp == std::string_view::npos) break;
    caps.remove_prefix(sp + 1);
  }
  return false;
}

std::string TlsCapabilities(std::string_view line, bool offer_starttls, bool login_disabled) {
  std::vector<std::string> extra;
  if (offer_starttls) extra.push_back("STARTTLS");
  if (login_disabled) extra.push_back("LOGINDISABLED");
  return RewriteCapabilities(
      line,
      [&](const std::string& u) {
        if (!offer_starttls && u == "STARTTLS") return false;
        if (!login_disabled && u == "LOGINDISABLED") return false;
        return !(login_disabled && u.starts_with("AUTH="));
      },
      extra);
}

namespace {

// The three NUL-separated fields of a SASL PLAIN message (RFC 4616), decoded from base64;
// nullopt when it is not base64 or has fewer than two NULs. The decoded copy is wiped.
struct PlainFields {
  std::string authzid, authcid, password;
};

std::optional<PlainFields> DecodePlain(std::string_view base64) {
  base64 = StripEol(base64);
  while (!base64.empty() && base64.back() == ' ') base64.remove_suffix(1);
  if (base64.empty() || base64.size() % 4 != 0 || base64.size() > 4096) return std::nullopt;
  std::string out(base64.size() / 4 * 3 + 1, '\0');
  int n = EVP_DecodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                          reinterpret_cast<const unsigned char*>(base64.data()),
                          static_cast<int>(base64.size()));
  if (n < 0) return std::nullopt;
  std::size_t len = static_cast<std::size_t>(n);
  // EVP_DecodeBlock counts the padding as zero bytes.
  if (base64.ends_with("==")) len -= 2;
  else if (base64.ends_with("=")) len -= 1;
  out.resize(len);
  std::size_t first = out.find('\0');
  std::size_t second = first == std::string::npos ? first : out.find('\0', first + 1);
  std::optional<PlainFields> f;
  if (second != std::string::npos) {
    f = PlainFields{out.substr(0, first), out.substr(first + 1, second - first - 1),
                    out.substr(second + 1)};
  }
  std::fill(out.begin(), out.end(), '\0');  // the password does not linger
  return f;
}

}  // namespace

std::optional<std::string> PlainUser(std::string_view base64) {
  std::optional<PlainFields> f = DecodePlain(base64);
  if (!f || f->authcid.empty()) return std::nullopt;
  std::fill(f->password.begin(), f->password.end(), '\0');
  return f->authzid.empty() ? f->authcid : f->authzid;
}

std::optional<std::string> PlainPassword(std::string_view base64) {
  std::optional<PlainFields> f = DecodePlain(base64);
  if (!f) return std::nullopt;
  return std::move(f->password);
}

}  // namespace ghost::imapwire

namespace ghost::imapwire {

namespace {

// Skips spaces; reads a number; nullopt when there is none or it is 0 or over 2^32-1.
std::optional<std::uint32_t> ReadNumber(std::string_view* s) {
  while (!s->empty() && s->front() == ' ') s->remove_prefix(1);
  std::uint64_t v = 0;
  std::size_t i = 0;
  while (i < s->size() && i < 11 && std::isdigit(static_cast<unsigned char>((*s)[i]))) {
    v = v * 10 + static_cast<std::uint64_t>((*s)[i] - '0');
    ++i;
  }
  if (i == 0 || v == 0 || v > 0xffffffffull) return std::nullopt;
  s->remove_prefix(i);
  return static_cast<std::uint32_t>(v);
}

bool StartsWithNoCase(std::string_view s, std::string_view prefix) {
  return s.size() >= prefix.size() && strncasecmp(s.data(), prefix.data(), prefix.size()) == 0;
}

// "(a b c)" at the front of *s: the atoms (flags), advancing past ")". nullopt when malformed.
std::optional<std::vector<std::string>> ReadFlagList(std::string_view* s) {
  while (!s->empty() && s->front() == ' ') s->remove_prefix(1);
  if (s->empty() || s->front() != '(') return std::nullopt;
  std::size_t close = s->find(')');
  if (close == std::string_view::npos) return std::nullopt;
  std::string_view inner = s->substr(1, close - 1);
  std::vector<std::string> flags;
  while (!inner.empty()) {
    while (!inner.empty() && inner.front() == ' ') inner.remove_prefix(1);
    std::size_t end = inner.find(' ');
    std::string_view f = inner.substr(0, end);
    if (!f.empty()) {
      for (char c : f) {
        if (c == '(' || c == '"' || c == '{' || c < 0x21 || c > 0x7e) return std::nullopt;
      }
      flags.emplace_back(f);
    }
    if (end == std::string_view::npos) break;
    inner.remove_prefix(end);
  }
  s->remove_prefix(close + 1);
  return flags;
}

}  // namespace

std::optional<std::vector<std::uint32_t>> ExpandSet(std::string_view set, const std::vector<std::uint32_t>& known,
                                                    bool by_uid, std::size_t max_uids) {
  if (set.empty() || known.empty()) return std::nullopt;
  std::vector<std::uint32_t> out;
  // n, n:m, *, comma-separated.
  while (!set.empty()) {
    std::size_t comma = set.find(',');
    std::string_view range = set.substr(0, comma);
    if (comma != std::string_view::npos && comma + 1 == set.size()) return std::nullopt;  // "1,"
    set = comma == std::string_view::npos ? std::string_view() : set.substr(comma + 1);
    auto bound = [&](std::string_view t) -> std::optional<std::uint32_t> {
      if (t == "*") return by_uid ? known.back() : static_cast<std::uint32_t>(known.size());
      std::string_view c = t;
      if (c.empty() || c.front() == ' ') return std::nullopt;
      std::optional<std::uint32_t> v = ReadNumber(&c);
      if (!v || !c.empty()) return std::nullopt;
      return v;
    };
    std::size_t colon = range.find(':');
    std::optional<std::uint32_t> lo = bound(range.substr(0, colon));
    std::optional<std::uint32_t> hi = colon == std::string_view::npos ? lo : bound(range.substr(colon + 1));
    if (!lo || !hi) return std::nullopt;
    if (*lo > *hi) std::swap(lo, hi);
    if (!by_uid) {
      if (*hi > known.size()) return std::nullopt;  // the server says BAD: let it
      if (*hi - *lo + 1 > max_uids) return std::nullopt;
      for (std::uint32_t n = *lo; n <= *hi; ++n) out.push_back(known[n - 1]);
      if (out.size() > max_uids) return std::nullopt;
      continue;
    }
    auto first = std::lower_bound(known.begin(), known.end(), *lo);
    auto last = std::upper_bound(known.begin(), known.end(), *hi);
    if (colon == std::string_view::npos && (first == known.end() || *first != *lo)) return std::nullopt;
    if (first == last) return std::nullopt;  // names no message the proxy knows
    for (auto it = first; it != last; ++it) {
      out.push_back(*it);
      if (out.size() > max_uids) return std::nullopt;
    }
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

std::optional<CopyCommand> ParseCopy(std::string_view rest, const std::vector<std::uint32_t>& known, bool by_uid,
                                     std::size_t max_uids) {
  rest = StripEol(rest);
  while (!rest.empty() && rest.front() == ' ') rest.remove_prefix(1);
  std::size_t sp = rest.find(' ');
  if (sp == std::string_view::npos) return std::nullopt;
  std::optional<std::vector<std::uint32_t>> uids = ExpandSet(rest.substr(0, sp), known, by_uid, max_uids);
  if (!uids) return std::nullopt;
  rest.remove_prefix(sp);
  std::optional<std::string> box = ReadAstring(&rest);
  if (!box) return std::nullopt;
  while (!rest.empty() && rest.front() == ' ') rest.remove_prefix(1);
  if (!rest.empty()) return std::nullopt;
  return CopyCommand{std::move(*uids), std::move(*box)};
}

std::optional<AppendCommand> ParseAppend(std::string_view rest) {
  // The announcement is the last thing in `rest` (which has no line end): a stray CR after
  // it ("{5}\r\r\n" on the wire) is no announcement for the framer, so none here either.
  if (rest.empty() || rest.back() != '}') return std::nullopt;
  AppendCommand out;
  bool bad = false;
  std::optional<std::uint64_t> n = AnnouncedLiteral(rest, &out.nonsync, &bad);
  if (!n) return std::nullopt;
  out.size = *n;
  std::string_view s = StripEol(rest);
  s = s.substr(0, s.rfind('{'));  // the words before the literal
  std::optional<std::string> box = ReadAstring(&s);
  if (!box) return std::nullopt;
  out.mailbox = std::move(*box);
  while (!s.empty() && s.front() == ' ') s.remove_prefix(1);
  if (!s.empty() && s.front() == '(') {
    std::optional<std::vector<std::string>> flags = ReadFlagList(&s);
    if (!flags) return std::nullopt;
    out.flags = std::move(*flags);
    while (!s.empty() && s.front() == ' ') s.remove_prefix(1);
  }
  if (!s.empty() && s.front() == '"') {
    std::optional<std::string> date = ReadAstring(&s);
    if (!date || date->empty()) return std::nullopt;
    out.date = std::move(*date);
    while (!s.empty() && s.front() == ' ') s.remove_prefix(1);
  }
  if (!s.empty()) return std::nullopt;  // CATENATE, UTF8 (...), an extension: the server's
  return out;
}

std::optional<UidStore> ParseUidStore(std::string_view rest, const std::vector<std::uint32_t>& known,
                                      std::size_t max_uids) {
  rest = StripEol(rest);
  while (!rest.empty() && rest.front() == ' ') rest.remove_prefix(1);
  std::size_t sp = rest.find(' ');
  if (sp == std::string_view::npos || known.empty()) return std::nullopt;
  std::string_view set = rest.substr(0, sp);
  rest.remove_prefix(sp);
  UidStore out;
  std::optional<std::vector<std::uint32_t>> uids = ExpandSet(set, known, /*by_uid=*/true, max_uids);
  if (!uids) return std::nullopt;
  out.uids = std::move(*uids);
  while (!rest.empty() && rest.front() == ' ') rest.remove_prefix(1);
  if (StartsWithNoCase(rest, "+FLAGS")) {
    out.add = true;
  } else if (StartsWithNoCase(rest, "-FLAGS")) {
    out.add = false;
  } else {
    return std::nullopt;
  }
  rest.remove_prefix(6);
  if (StartsWithNoCase(rest, ".SILENT")) {
    out.silent = true;
    rest.remove_prefix(7);
  }
  if (rest.empty() || rest.front() != ' ') return std::nullopt;
  while (!rest.empty() && rest.front() == ' ') rest.remove_prefix(1);
  std::optional<std::vector<std::string>> flags;
  if (!rest.empty() && rest.front() == '(') {
    flags = ReadFlagList(&rest);
  } else {
    // A single flag without parentheses (RFC 3501 allows a flag list of atoms).
    flags = std::vector<std::string>();
    std::string_view f = rest.substr(0, rest.find(' '));
    if (f.empty()) return std::nullopt;
    flags->emplace_back(f);
    rest.remove_prefix(f.size());
  }
  if (!flags || flags->empty()) return std::nullopt;
  while (!rest.empty() && rest.front() == ' ') rest.remove_prefix(1);
  if (!rest.empty()) return std::nullopt;
  std::sort(out.uids.begin(), out.uids.end());
  out.uids.erase(std::unique(out.uids.begin(), out.uids.end()), out.uids.end());
  out.flags = std::move(*flags);
  return out;
}

std::optional<FetchFlags> ParseFetchFlags(std::string_view segment) {
  std::string_view s = StripEol(segment);
  if (!s.starts_with("* ")) return std::nullopt;
  s.remove_prefix(2);
  FetchFlags out;
  std::optional<std::uint32_t> seq = ReadNumber(&s);
  if (!seq || !StartsWithNoCase(s, " FETCH (")) return std::nullopt;
  out.seq = *seq;
  s.remove_prefix(8);
  // Items before FLAGS are atoms and numbers here (UID, MODSEQ (n), RFC822.SIZE ...); a quoted
  // string or a nested list before it is not looked into.
  while (!s.empty()) {
    while (!s.empty() && s.front() == ' ') s.remove_prefix(1);
    if (StartsWithNoCase(s, "UID ")) {
      s.remove_prefix(4);
      std::optional<std::uint32_t> uid = ReadNumber(&s);
      if (!uid) return std::nullopt;
      out.uid = uid;
      continue;
    }
    if (StartsWithNoCase(s, "FLAGS ")) {
      s.remove_prefix(6);
      while (!s.empty() && s.front() == ' ') s.remove_prefix(1);
      out.list_at = static_cast<std::size_t>(s.data() - segment.data());
      std::string_view before = s;
      std::optional<std::vector<std::string>> flags = ReadFlagList(&s);
      if (!flags) return std::nullopt;
      out.list_len = before.size() - s.size();
      out.flags = std::move(*flags);
      // A UID after the flags.
      std::string_view after = s;
      while (!after.empty() && after.front() == ' ') after.remove_prefix(1);
      if (!out.uid && StartsWithNoCase(after, "UID ")) {
        after.remove_prefix(4);
        out.uid = ReadNumber(&after);
      }
      return out;
    }
    // Skip one item name and a simple value (an atom, a number or a flat "(...)").
    std::size_t sp = s.find(' ');
    if (sp == std::string_view::npos) return std::nullopt;
    std::string_view name = s.substr(0, sp);
    if (name.find('[') != std::string_view::npos || name.find('(') != std::string_view::npos)
      return std::nullopt;  // a body section or something nested: not looked into
    s.remove_prefix(sp + 1);
    if (!s.empty() && s.front() == '(') {
      std::size_t close = s.find(')');
      if (close == std::string_view::npos || s.substr(0, close).find('(', 1) != std::string_view::npos)
        return std::nullopt;
      s.remove_prefix(close + 1);
    } else {
      std::size_t end = s.find_first_of(" )");
      if (end == std::string_view::npos || s.front() == '"' || s.front() == '{') return std::nullopt;
      s.remove_prefix(end);
    }
  }
  return std::nullopt;
}

std::string FlagList(const std::vector<std::string>& flags) {
  std::string out = "(";
  for (std::size_t i = 0; i < flags.size(); ++i) {
    if (i) out += ' ';
    out += flags[i];
  }
  return out + ")";
}

std::string RewriteFlags(std::string_view segment, const FetchFlags& found,
                         const std::vector<std::string>& flags) {
  std::string out(segment.substr(0, found.list_at));
  out += FlagList(flags);
  out += segment.substr(found.list_at + found.list_len);
  return out;
}

}  // namespace ghost::imapwire
