// Body sections of a cached message. See proxy/imap_section.h.
#include "proxy/imap_section.h"

#include <strings.h>

#include <algorithm>
#include <cctype>
#include <charconv>

namespace ghost::imapwire {

namespace {

constexpr std::size_t kMaxParts = 10000;

std::string Upper(std::string_view s) {
  std::string u(s);
  for (char& c : u) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return u;
}

std::string Lower(std::string_view s) {
  std::string u(s);
  for (char& c : u) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return u;
}

bool IsAtomChar(char c) {
  auto u = static_cast<unsigned char>(c);
  return u > 0x20 && u < 0x7f && c != '(' && c != ')' && c != '{' && c != '"' && c != '\\' &&
         c != '%' && c != '*' && c != ']' && c != '[';
}

// One entity (a message or a body part): its header block (the blank line included) and body,
// and what its Content-Type says.
struct Entity {
  std::string_view header, body;
  std::string type = "text", subtype = "plain", boundary;
  std::string cte;  // Content-Transfer-Encoding, lower case ("" when absent)
  bool cte_ok = true;  // at most one, a single token
  bool Is(std::string_view t, std::string_view st) const { return type == t && subtype == st; }
  bool Multipart() const { return type == "multipart"; }
};

// Every line ends in CRLF (no bare LF): offsets then are the server's.
bool CrlfOnly(std::string_view v) {
  for (std::size_t i = v.find('\n'); i != std::string_view::npos; i = v.find('\n', i + 1)) {
    if (i == 0 || v[i - 1] != '\r') return false;
  }
  return true;
}

// The header's fields, each with its continuation lines and CRLF; nullopt on a line that is
// not a field (no colon, or white space in the name).
struct Field {
  std::string_view name, whole;
};
std::optional<std::vector<Field>> Fields(std::string_view header) {
  std::vector<Field> out;
  if (header.ends_with("\r\n")) header.remove_suffix(2);  // the blank line
  std::size_t at = 0;
  while (at < header.size()) {
    std::size_t end = at;
    do {
      std::size_t eol = header.find("\r\n", end);
      if (eol == std::string_view::npos) return std::nullopt;
      end = eol + 2;
    } while (end < header.size() && (header[end] == ' ' || header[end] == '\t'));
    std::string_view whole = header.substr(at, end - at);
    std::size_t colon = whole.find(':');
    if (colon == std::string_view::npos || colon == 0) return std::nullopt;
    std::string_view name = whole.substr(0, colon);
    if (std::any_of(name.begin(), name.end(), [](char c) { return c == ' ' || c == '\t' || c == '\r'; }))
      return std::nullopt;
    out.push_back({name, whole});
    if (out.size() > kMaxParts) return std::nullopt;
    at = end;
  }
  return out;
}

// The unfolded value of a field ("Content-Type: a/b;\r\n c=d\r\n" -> "a/b; c=d").
std::string Unfolded(const Field& f) {
  std::string_view v = f.whole.substr(f.name.size() + 1);
  std::string out;
  for (char c : v) {
    if (c == '\r' || c == '\n') continue;
    out += c == '\t' ? ' ' : c;
  }
  return out;
}

// Reads Content-Type's type, subtype and boundary into `e`. False when unsure (comments,
// RFC 2231 boundary, quoting trouble, no slash).
bool ReadContentType(std::string_view v, Entity* e) {
  if (v.find('(') != std::string_view::npos) return false;
  auto trim = [](std::string_view s) {
    while (!s.empty() && s.front() == ' ') s.remove_prefix(1);
    while (!s.empty() && s.back() == ' ') s.remove_suffix(1);
    return s;
  };
  std::size_t semi = v.find(';');
  std::string_view mt = trim(v.substr(0, semi));
  std::size_t slash = mt.find('/');
  if (slash == std::string_view::npos) return false;
  std::string_view t = trim(mt.substr(0, slash)), st = trim(mt.substr(slash + 1));
  if (t.empty() || st.empty() || !std::all_of(t.begin(), t.end(), IsAtomChar) ||
      !std::all_of(st.begin(), st.end(), IsAtomChar))
    return false;
  e->type = Lower(t);
  e->subtype = Lower(st);
  std::string_view params = semi == std::string_view::npos ? std::string_view() : v.substr(semi + 1);
  while (!params.empty()) {
    params = trim(params);
    if (params.empty()) break;
    std::size_t eq = params.find('=');
    if (eq == std::string_view::npos) return false;
    std::string name = Lower(trim(params.substr(0, eq)));
    params = trim(params.substr(eq + 1));
    std::string value;
    if (!params.empty() && params.front() == '"') {
      std::size_t i = 1;
      for (; i < params.size() && params[i] != '"'; ++i) {
        if (params[i] == '\\') return false;
        value += params[i];
      }
      if (i >= params.size()) return false;
      params.remove_prefix(i + 1);
      params = trim(params);
      if (!params.empty() && params.front() != ';') return false;
    } else {
      std::size_t end = params.find(';');
      value = std::string(trim(params.substr(0, end)));
      params = end == std::string_view::npos ? std::string_view() : params.substr(end);
    }
    if (!params.empty() && params.front() == ';') params.remove_prefix(1);
    if (name.starts_with("boundary*")) return false;
    if (name == "boundary") e->boundary = value;
  }
  if (e->Multipart() && (e->boundary.empty() || e->boundary.size() > 200)) return false;
  return true;
}

// Splits `v` into header and body and reads its Content-Type (default: `type`/`subtype`).
std::optional<Entity> ParseEntity(std::string_view v, std::string_view type, std::string_view subtype) {
  Entity e;
  e.type = type;
  e.subtype = subtype;
  if (v.starts_with("\r\n")) {
    e.header = v.substr(0, 2);
    e.body = v.substr(2);
  } else {
    std::size_t blank = v.find("\r\n\r\n");
    if (blank == std::string_view::npos) return std::nullopt;
    e.header = v.substr(0, blank + 4);
    e.body = v.substr(blank + 4);
  }
  std::optional<std::vector<Field>> fields = Fields(e.header);
  if (!fields) return std::nullopt;
  const Field* ct = nullptr;
  for (const Field& f : *fields) {
    if (strncasecmp(f.name.data(), "Content-Type", 12) == 0 && f.name.size() == 12) {
      if (ct) return std::nullopt;  // two: which one the server takes is not certain
      ct = &f;
    }
  }
  if (ct && !ReadContentType(Unfolded(*ct), &e)) return std::nullopt;
  int ctes = 0;
  for (const Field& f : *fields) {
    if (f.name.size() == 25 && strncasecmp(f.name.data(), "Content-Transfer-Encoding", 25) == 0) {
      ++ctes;
      std::string v = Unfolded(f);
      std::string_view t = v;
      while (!t.empty() && t.front() == ' ') t.remove_prefix(1);
      while (!t.empty() && t.back() == ' ') t.remove_suffix(1);
      e.cte = Lower(t);
      if (t.empty() || !std::all_of(t.begin(), t.end(), IsAtomChar)) e.cte_ok = false;
    }
  }
  if (ctes > 1) e.cte_ok = false;
  if (e.Multipart() && e.boundary.empty()) return std::nullopt;
  return e;
}

std::optional<std::vector<std::string_view>> Children(const Entity& e, int depth = 0);

// Whether `v` (a part, or a message's body as an entity) ends with a multipart's close
// delimiter line, its own or a nested one's: dovecot then counts the CRLF after that line as
// the part's (the enclosing delimiter has no CRLF of its own before it). nullopt when unsure.
std::optional<bool> EndsWithClose(std::string_view v, std::string_view type, std::string_view subtype, int depth) {
  if (depth > static_cast<int>(kMaxSectionDepth)) return std::nullopt;
  std::optional<Entity> e = ParseEntity(v, type, subtype);
  if (!e) return std::nullopt;
  if (e->Multipart()) {
    if (!Children(*e, depth + 1)) return std::nullopt;
    const std::string close = "--" + e->boundary + "--";
    return e->body.ends_with("\r\n" + close) || e->body == close;
  }
  if (e->Is("message", "rfc822")) return EndsWithClose(e->body, "text", "plain", depth + 1);
  return false;
}

// The parts of a multipart entity (each its MIME header and body), between "--boundary"
// lines, up to "--boundary--". nullopt when the structure is not certain.
std::optional<std::vector<std::string_view>> Children(const Entity& e, int depth) {
  if (depth > static_cast<int>(kMaxSectionDepth)) return std::nullopt;
  const bool digest = e.subtype == "digest";
  const std::string delim = "--" + e.boundary;
  std::string_view b = e.body;
  std::vector<std::size_t> starts;  // where each delimiter line begins (its CRLF before it)
  std::vector<std::string_view> parts;
  std::size_t content = std::string_view::npos;  // where the current part begins
  std::size_t at = 0;
  while (true) {
    std::size_t p = b.find(delim, at);
    if (p == std::string_view::npos) return std::nullopt;  // no close delimiter
    at = p + 1;
    if (p != 0 && (p < 2 || b.substr(p - 2, 2) != "\r\n")) continue;  // not at a line start
    std::size_t after = p + delim.size();
    bool close = b.substr(after, 2) == "--";
    std::size_t eol = b.find("\r\n", after);
    std::string_view rest = b.substr(after + (close ? 2 : 0),
                                     (eol == std::string_view::npos ? b.size() : eol) - after - (close ? 2 : 0));
    if (!std::all_of(rest.begin(), rest.end(), [](char c) { return c == ' ' || c == '\t'; })) {
      return std::nullopt;  // a line that begins like the delimiter: the server's call
    }
    if (content != std::string_view::npos) {
      if (p < content + 2) return std::nullopt;
      std::string_view part = b.substr(content, p - 2 - content);
      std::optional<bool> nested_close =
          EndsWithClose(part, digest ? "message" : "text", digest ? "rfc822" : "plain", depth);
      if (!nested_close) return std::nullopt;
      if (*nested_close) part = b.substr(content, p - content);
      parts.push_back(part);
      if (parts.size() > kMaxParts) return std::nullopt;
    }
    if (close) break;
    if (eol == std::string_view::npos) return std::nullopt;
    content = eol + 2;
    at = content;
  }
  if (parts.empty()) return std::nullopt;
  return parts;
}

std::optional<std::string> HeaderFields(std::string_view header, const Section& s) {
  std::optional<std::vector<Field>> fields = Fields(header);
  if (!fields) return std::nullopt;
  std::string out;
  for (const Field& f : *fields) {
    bool listed = std::any_of(s.fields.begin(), s.fields.end(), [&](const std::string& n) {
      return n.size() == f.name.size() && strncasecmp(n.data(), f.name.data(), n.size()) == 0;
    });
    if (listed == (s.text == Section::Text::kHeaderFields)) out += f.whole;
  }
  return out + "\r\n";
}

// HEADER, TEXT or HEADER.FIELDS of the message `m`.
std::optional<std::string> OfMessage(const Entity& m, const Section& s) {
  switch (s.text) {
    case Section::Text::kHeader:
      return std::string(m.header);
    case Section::Text::kText:
      return std::string(m.body);
    case Section::Text::kHeaderFields:
    case Section::Text::kHeaderFieldsNot:
      return HeaderFields(m.header, s);
    case Section::Text::kAll:
    case Section::Text::kMime:
      break;
  }
  return std::nullopt;
}

}  // namespace

std::optional<Section> ParseSection(std::string_view spec) {
  Section s;
  std::string u = Upper(spec);
  std::string_view v = u;
  while (!v.empty() && v.front() >= '0' && v.front() <= '9') {
    std::size_t n = 0;
    while (n < v.size() && v[n] >= '0' && v[n] <= '9') ++n;
    std::uint64_t x = 0;
    auto [p, ec] = std::from_chars(v.data(), v.data() + n, x);
    if (ec != std::errc() || x == 0 || x > 0xffffffffu || n > 10) return std::nullopt;
    s.part.push_back(static_cast<std::uint32_t>(x));
    if (s.part.size() > kMaxSectionDepth) return std::nullopt;
    v.remove_prefix(n);
    if (v.empty()) return s;
    if (v.front() != '.') return std::nullopt;
    v.remove_prefix(1);
    if (v.empty()) return std::nullopt;
  }
  if (v.empty()) return s;  // "" only (a part path returned above)
  if (v == "HEADER") {
    s.text = Section::Text::kHeader;
  } else if (v == "TEXT") {
    s.text = Section::Text::kText;
  } else if (v == "MIME") {
    if (s.part.empty()) return std::nullopt;
    s.text = Section::Text::kMime;
  } else if (v.starts_with("HEADER.FIELDS ") || v.starts_with("HEADER.FIELDS.NOT ")) {
    bool nots = v.starts_with("HEADER.FIELDS.NOT ");
    s.text = nots ? Section::Text::kHeaderFieldsNot : Section::Text::kHeaderFields;
    v.remove_prefix(nots ? 18 : 14);
    if (v.size() < 3 || v.front() != '(' || v.back() != ')') return std::nullopt;
    v = v.substr(1, v.size() - 2);
    while (true) {
      std::size_t sp = v.find(' ');
      std::string_view name = v.substr(0, sp);
      if (name.empty() || !std::all_of(name.begin(), name.end(), IsAtomChar)) return std::nullopt;
      s.fields.emplace_back(name);
      if (s.fields.size() > kMaxSectionFields) return std::nullopt;
      if (sp == std::string_view::npos) break;
      v.remove_prefix(sp + 1);
    }
  } else {
    return std::nullopt;
  }
  return s;
}

std::string SectionName(const Section& s) {
  std::string out;
  for (std::uint32_t p : s.part) {
    if (!out.empty()) out += '.';
    out += std::to_string(p);
  }
  const char* text = nullptr;
  switch (s.text) {
    case Section::Text::kAll: return out;
    case Section::Text::kHeader: text = "HEADER"; break;
    case Section::Text::kText: text = "TEXT"; break;
    case Section::Text::kMime: text = "MIME"; break;
    case Section::Text::kHeaderFields: text = "HEADER.FIELDS"; break;
    case Section::Text::kHeaderFieldsNot: text = "HEADER.FIELDS.NOT"; break;
  }
  if (!out.empty()) out += '.';
  out += text;
  if (!s.fields.empty()) {
    out += " (";
    for (std::size_t i = 0; i < s.fields.size(); ++i) out += (i ? " " : "") + s.fields[i];
    out += ')';
  }
  return out;
}

namespace {

struct Located {
  Entity part;
  bool body_of_message = false;  // `part` is a non-multipart message's body itself
};

// Walks the part path `path` (not empty) of the message `msg`.
std::optional<Located> Locate(const Entity& msg, const std::vector<std::uint32_t>& path);

std::optional<std::string> DecodeBase64(std::string_view v) {
  static constexpr std::string_view kAlphabet =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  std::uint32_t acc = 0;
  int bits = 0, pad = 0;
  std::size_t n = 0;
  for (std::size_t i = 0; i < v.size(); ++i) {
    char c = v[i];
    if (c == '\r' && i + 1 < v.size() && v[i + 1] == '\n') {
      ++i;
      continue;
    }
    if (c == '=') {
      ++pad;
      ++n;
      continue;
    }
    std::size_t x = kAlphabet.find(c);
    if (x == std::string_view::npos || pad) return std::nullopt;
    ++n;
    acc = (acc << 6) | static_cast<std::uint32_t>(x);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out += static_cast<char>((acc >> bits) & 0xff);
    }
  }
  if (n % 4 != 0 || pad > 2) return std::nullopt;
  return out;
}

std::optional<std::string> DecodeQuotedPrintable(std::string_view v) {
  auto hex = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  std::string out;
  for (std::size_t i = 0; i < v.size(); ++i) {
    char c = v[i];
    if (c == '\r') {
      if (i > 0 && (v[i - 1] == ' ' || v[i - 1] == '\t')) return std::nullopt;  // trailing white space
      out += c;
      continue;
    }
    if (c != '=') {
      out += c;
      continue;
    }
    if (v.substr(i + 1, 2) == "\r\n") {  // a soft line break
      i += 2;
      continue;
    }
    if (i + 2 >= v.size() || hex(v[i + 1]) < 0 || hex(v[i + 2]) < 0) return std::nullopt;
    out += static_cast<char>(hex(v[i + 1]) * 16 + hex(v[i + 2]));
    i += 2;
  }
  if (!v.empty() && (v.back() == ' ' || v.back() == '\t')) return std::nullopt;
  return out;
}

}  // namespace

std::optional<std::string> ExtractBinary(std::string_view message, const std::vector<std::uint32_t>& path,
                                         bool* literal8) {
  *literal8 = false;
  if (path.empty() || path.size() > kMaxSectionDepth || !CrlfOnly(message)) return std::nullopt;
  std::optional<Entity> msg = ParseEntity(message, "text", "plain");
  if (!msg) return std::nullopt;
  std::optional<Located> at = Locate(*msg, path);
  if (!at) return std::nullopt;
  const Entity& p = at->part;
  if (p.Multipart() || p.type == "message" || !p.cte_ok) return std::nullopt;
  std::optional<std::string> out;
  const bool identity = p.cte.empty() || p.cte == "7bit" || p.cte == "8bit" || p.cte == "binary";
  if (identity) {
    out = std::string(p.body);
  } else if (p.cte == "base64") {
    out = DecodeBase64(p.body);
  } else if (p.cte == "quoted-printable") {
    out = DecodeQuotedPrintable(p.body);
  }
  if (!out || out->find('\0') != std::string::npos) return std::nullopt;
  // As dovecot answers (observed): decoded base64 and 8-bit decoded quoted-printable come as a
  // literal8, 7-bit content that was not encoded as a literal; the other cases (8-bit content
  // not encoded, quoted-printable that decodes to 7-bit) are left to the server.
  const bool eight = std::any_of(out->begin(), out->end(), [](char c) { return static_cast<unsigned char>(c) >= 0x80; });
  if (identity) {
    if (eight) return std::nullopt;
  } else if (p.cte == "quoted-printable" && !eight) {
    return std::nullopt;
  } else {
    *literal8 = true;
  }
  return out;
}

namespace {

std::optional<Located> Locate(const Entity& msg, const std::vector<std::uint32_t>& path) {
  // Walk the part path (RFC 3501 §6.4.5): in a multipart, n is its n-th part; in any other
  // message, 1 is its body; a message/rfc822 part is entered for the numbers after it, a
  // multipart part is a container for them.
  Entity container = msg;
  Entity part;
  bool body_of_message = false;  // `part` is the non-multipart `container`'s body itself
  for (std::size_t i = 0; i < path.size(); ++i) {
    std::uint32_t k = path[i];
    if (container.Multipart()) {
      std::optional<std::vector<std::string_view>> children = Children(container);
      if (!children || k > children->size()) return std::nullopt;
      bool digest = container.subtype == "digest";
      std::optional<Entity> p = ParseEntity((*children)[k - 1], digest ? "message" : "text",
                                            digest ? "rfc822" : "plain");
      if (!p) return std::nullopt;
      part = *p;
      body_of_message = false;
    } else {
      if (k != 1) return std::nullopt;
      part = container;
      body_of_message = true;
    }
    if (i + 1 == path.size()) break;
    if (body_of_message) return std::nullopt;
    if (part.Is("message", "rfc822")) {
      std::optional<Entity> inner = ParseEntity(part.body, "text", "plain");
      if (!inner) return std::nullopt;
      container = *inner;
    } else if (part.Multipart()) {
      container = part;
    } else {
      return std::nullopt;
    }
  }
  return Located{part, body_of_message};
}

}  // namespace

std::optional<std::string> ExtractSection(std::string_view message, const Section& s) {
  if (!CrlfOnly(message)) return std::nullopt;
  std::optional<Entity> msg = ParseEntity(message, "text", "plain");
  if (!msg) return std::nullopt;
  if (s.part.empty()) {
    if (s.text == Section::Text::kAll) return std::string(message);
    return OfMessage(*msg, s);
  }
  std::optional<Located> at = Locate(*msg, s.part);
  if (!at) return std::nullopt;
  const Entity& part = at->part;
  const bool body_of_message = at->body_of_message;
  switch (s.text) {
    case Section::Text::kAll:
      return std::string(part.body);
    case Section::Text::kMime:
      if (body_of_message) return std::nullopt;
      return std::string(part.header);
    default: {
      if (body_of_message || !part.Is("message", "rfc822")) return std::nullopt;
      std::optional<Entity> inner = ParseEntity(part.body, "text", "plain");
      if (!inner) return std::nullopt;
      return OfMessage(*inner, s);
    }
  }
}

}  // namespace ghost::imapwire
