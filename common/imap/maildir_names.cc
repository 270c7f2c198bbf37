#include "common/imap/maildir_names.h"

#include <algorithm>
#include <array>
#include <cassert>
#include <charconv>
#include <cstddef>
#include <vector>

namespace ghost {
namespace {

constexpr std::size_t kNameMax = 255;  // NAME_MAX on Linux file systems
constexpr char kHex[] = "0123456789ABCDEF";
// RFC 3501 §5.1.3: modified base64 is RFC 2045 base64 with ',' instead of '/'.
constexpr char kBase64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+,";

int Base64Value(char c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '+') return 62;
  if (c == ',') return 63;
  return -1;
}

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

bool IsPrintableAscii(std::uint32_t cp) { return cp >= 0x20 && cp <= 0x7e; }

std::string Quote(std::string_view s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    if (c < 0x20 || c >= 0x7f || c == '"' || c == '\\') {
      out += "\\x";
      out += kHex[c >> 4];
      out += kHex[c & 15];
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + "\"";
}

void AppendUtf8(std::uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xc0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3f)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xe0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3f)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3f)));
  } else {
    out->push_back(static_cast<char>(0xf0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3f)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3f)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3f)));
  }
}

// Decodes one code point of strict UTF-8 at s[*i], advancing *i. False on invalid input.
bool NextCodePoint(std::string_view s, std::size_t* i, std::uint32_t* cp) {
  const auto b0 = static_cast<unsigned char>(s[*i]);
  int extra = 0;
  std::uint32_t min = 0;
  if (b0 < 0x80) {
    *cp = b0;
    ++*i;
    return true;
  } else if ((b0 & 0xe0) == 0xc0) {
    extra = 1, *cp = b0 & 0x1f, min = 0x80;
  } else if ((b0 & 0xf0) == 0xe0) {
    extra = 2, *cp = b0 & 0x0f, min = 0x800;
  } else if ((b0 & 0xf8) == 0xf0) {
    extra = 3, *cp = b0 & 0x07, min = 0x10000;
  } else {
    return false;
  }
  if (*i + static_cast<std::size_t>(extra) >= s.size()) return false;  // truncated
  for (int k = 1; k <= extra; ++k) {
    const auto b = static_cast<unsigned char>(s[*i + k]);
    if ((b & 0xc0) != 0x80) return false;
    *cp = (*cp << 6) | (b & 0x3f);
  }
  if (*cp < min || *cp > 0x10ffff || (*cp >= 0xd800 && *cp <= 0xdfff)) return false;
  *i += static_cast<std::size_t>(extra) + 1;
  return true;
}

// Writes the UTF-16 units of a base64 run: "&" + modified base64 + "-".
void FlushRun(const std::vector<std::uint16_t>& units, std::string* out) {
  out->push_back('&');
  std::uint32_t bits = 0;
  int nbits = 0;
  for (std::uint16_t u : units) {
    bits = (bits << 16) | u;
    nbits += 16;
    while (nbits >= 6) {
      nbits -= 6;
      out->push_back(kBase64[(bits >> nbits) & 0x3f]);
    }
    bits &= (1u << nbits) - 1;
  }
  if (nbits > 0) out->push_back(kBase64[(bits << (6 - nbits)) & 0x3f]);
  out->push_back('-');
}

bool IsC1Lead(std::string_view s, std::size_t i) {
  // U+0080..U+009F are 0xC2 0x80..0x9F in UTF-8.
  return i + 1 < s.size() && static_cast<unsigned char>(s[i]) == 0xc2 &&
         static_cast<unsigned char>(s[i + 1]) >= 0x80 &&
         static_cast<unsigned char>(s[i + 1]) <= 0x9f;
}

void Escape(unsigned char c, std::string* out) {
  out->push_back('%');
  out->push_back(kHex[c >> 4]);
  out->push_back(kHex[c & 15]);
}

// The raw form for names that are not canonical modified UTF-7 (see the header).
std::string RawDirName(std::string_view wire) {
  std::string out = ".%!";
  for (unsigned char c : wire) {
    if (c < 0x21 || c > 0x7e || c == '%' || c == '.' || c == '/') {
      Escape(c, &out);
    } else {
      out.push_back(static_cast<char>(c));
    }
  }
  return out;
}

// Undoes %XX escapes; false on a malformed escape.
bool Unescape(std::string_view s, std::string* out) {
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '%') {
      out->push_back(s[i]);
      continue;
    }
    if (i + 2 >= s.size()) return false;
    const int hi = HexValue(s[i + 1]);
    const int lo = HexValue(s[i + 2]);
    if (hi < 0 || lo < 0) return false;
    out->push_back(static_cast<char>(hi * 16 + lo));
    i += 2;
  }
  return true;
}

// A positive decimal without leading zeros that fits in T.
template <typename T>
bool ParseCanonicalNumber(std::string_view s, T* value) {
  if (s.empty() || s.size() > 20 || (s[0] == '0' && s.size() > 1)) return false;
  if (!std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; })) return false;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), *value);
  return ec == std::errc() && end == s.data() + s.size();
}

struct FlagLetter {
  char letter;
  const char* flag;
};
// In ASCII order of the letters (the Maildir spec's order).
constexpr std::array<FlagLetter, 6> kFlagLetters = {{
    {'D', "\\Draft"},
    {'F', "\\Flagged"},
    {'P', "$Forwarded"},
    {'R', "\\Answered"},
    {'S', "\\Seen"},
    {'T', "\\Deleted"},
}};

bool EqualsIgnoreAsciiCase(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    char x = a[i], y = b[i];
    if (x >= 'A' && x <= 'Z') x = static_cast<char>(x - 'A' + 'a');
    if (y >= 'A' && y <= 'Z') y = static_cast<char>(y - 'A' + 'a');
    if (x != y) return false;
  }
  return true;
}

}  // namespace

// ---- Modified UTF-7 ----

Result<std::string> EncodeMutf7(std::string_view utf8) {
  std::string out;
  std::vector<std::uint16_t> run;
  std::size_t i = 0;
  while (i < utf8.size()) {
    const std::size_t at = i;
    std::uint32_t cp = 0;
    if (!NextCodePoint(utf8, &i, &cp)) {
      return Status::InvalidArgument("mailbox name " + Quote(utf8) +
                                     " is not valid UTF-8 (at byte " + std::to_string(at) + ")");
    }
    if (cp == 0) {
      return Status::InvalidArgument("mailbox name " + Quote(utf8) + " contains a NUL byte");
    }
    if (IsPrintableAscii(cp)) {
      if (!run.empty()) {
        FlushRun(run, &out);
        run.clear();
      }
      if (cp == '&') {
        out += "&-";
      } else {
        out.push_back(static_cast<char>(cp));
      }
    } else if (cp < 0x10000) {
      run.push_back(static_cast<std::uint16_t>(cp));
    } else {
      const std::uint32_t v = cp - 0x10000;
      run.push_back(static_cast<std::uint16_t>(0xd800 | (v >> 10)));
      run.push_back(static_cast<std::uint16_t>(0xdc00 | (v & 0x3ff)));
    }
  }
  if (!run.empty()) FlushRun(run, &out);
  return out;
}

Result<std::string> DecodeMutf7(std::string_view s) {
  auto bad = [&](std::size_t at, const std::string& why) {
    return Status::InvalidArgument("mailbox name " + Quote(s) +
                                   " is not valid modified UTF-7 (RFC 3501 §5.1.3) at byte " +
                                   std::to_string(at) + ": " + why);
  };
  std::string out;
  std::size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x20 || c > 0x7e) return bad(i, "byte outside printable US-ASCII");
    if (c != '&') {
      out.push_back(static_cast<char>(c));
      ++i;
      continue;
    }
    const std::size_t start = i;
    ++i;
    if (i < s.size() && s[i] == '-') {  // "&-" is a literal '&'
      out.push_back('&');
      ++i;
      continue;
    }
    std::uint32_t bits = 0;
    int nbits = 0;
    std::vector<std::uint16_t> units;
    while (i < s.size() && s[i] != '-') {
      const int v = Base64Value(s[i]);
      if (v < 0) return bad(i, "character not in modified base64 inside a '&' run");
      bits = (bits << 6) | static_cast<std::uint32_t>(v);
      nbits += 6;
      if (nbits >= 16) {
        nbits -= 16;
        units.push_back(static_cast<std::uint16_t>(bits >> nbits));
        bits &= (1u << nbits) - 1;
      }
      ++i;
    }
    if (i >= s.size()) return bad(start, "'&' run not terminated by '-'");
    ++i;  // the '-'
    if (units.empty()) return bad(start, "empty '&' run");
    if (nbits >= 6 || bits != 0) return bad(start, "'&' run has leftover or non-zero padding bits");
    for (std::size_t k = 0; k < units.size(); ++k) {
      std::uint32_t cp = units[k];
      if (cp >= 0xd800 && cp <= 0xdbff) {
        if (k + 1 >= units.size() || units[k + 1] < 0xdc00 || units[k + 1] > 0xdfff) {
          return bad(start, "unpaired UTF-16 high surrogate");
        }
        cp = 0x10000 + ((cp - 0xd800) << 10) + (units[k + 1] - 0xdc00);
        ++k;
      } else if (cp >= 0xdc00 && cp <= 0xdfff) {
        return bad(start, "unpaired UTF-16 low surrogate");
      }
      if (IsPrintableAscii(cp)) return bad(start, "printable US-ASCII encoded in base64");
      if (cp == 0) return bad(start, "NUL encoded in base64");
      AppendUtf8(cp, &out);
    }
  }
  return out;
}

// ---- Mailbox names <-> directory names ----

bool IsInbox(std::string_view wire_name) { return EqualsIgnoreAsciiCase(wire_name, "INBOX"); }

Result<std::string> MailboxToDirName(std::string_view wire, char delimiter) {
  if (wire.empty()) return Status::InvalidArgument("empty mailbox name");
  if (IsInbox(wire)) return std::string();
  std::string dir;
  Result<std::string> utf8 = DecodeMutf7(wire);
  bool canonical = utf8.ok();
  if (canonical) {
    Result<std::string> again = EncodeMutf7(*utf8);
    canonical = again.ok() && *again == wire;
  }
  if (!canonical) {
    dir = RawDirName(wire);
  } else {
    const std::string& name = *utf8;
    dir = ".";
    for (std::size_t i = 0; i < name.size(); ++i) {
      const auto c = static_cast<unsigned char>(name[i]);
      const bool is_delim = delimiter != '\0' && name[i] == delimiter;
      if (is_delim && i > 0 && i + 1 < name.size() && name[i - 1] != delimiter &&
          name[i + 1] != delimiter) {
        dir.push_back('.');
      } else if (is_delim || c < 0x20 || c == 0x7f || c == '%' || c == '/' || c == '.') {
        Escape(c, &dir);
      } else if (IsC1Lead(name, i)) {
        Escape(c, &dir);
        Escape(static_cast<unsigned char>(name[i + 1]), &dir);
        ++i;
      } else {
        dir.push_back(static_cast<char>(c));
      }
    }
  }
  if (dir.size() > kNameMax) {
    return Status::InvalidArgument("mailbox " + Quote(wire) + " needs a directory name of " +
                                   std::to_string(dir.size()) + " bytes, more than the " +
                                   std::to_string(kNameMax) + " a file system allows");
  }
  return dir;
}

Result<std::string> DirNameToMailbox(std::string_view dir, char delimiter) {
  if (dir.empty()) return std::string("INBOX");
  auto refuse = [&](const std::string& why) {
    return Status::InvalidArgument("directory name " + Quote(dir) +
                                   " does not name a mailbox: " + why);
  };
  if (dir[0] != '.' || dir.size() < 2) {
    return refuse("mailbox directories are Maildir++ folders, \".\" followed by a name");
  }
  std::string wire;
  const std::string_view body = dir.substr(1);
  if (body.substr(0, 2) == "%!") {
    if (!Unescape(body.substr(2), &wire)) return refuse("malformed %XX escape");
  } else {
    std::string utf8;
    for (std::size_t i = 0; i < body.size(); ++i) {
      if (body[i] == '.') {
        if (delimiter == '\0') return refuse("'.' separates levels but the mailbox is flat");
        utf8.push_back(delimiter);
      } else if (body[i] == '%') {
        if (i + 2 >= body.size()) return refuse("truncated %XX escape");
        const int hi = HexValue(body[i + 1]);
        const int lo = HexValue(body[i + 2]);
        if (hi < 0 || lo < 0) return refuse("malformed %XX escape");
        utf8.push_back(static_cast<char>(hi * 16 + lo));
        i += 2;
      } else {
        utf8.push_back(body[i]);
      }
    }
    Result<std::string> encoded = EncodeMutf7(utf8);
    if (!encoded.ok()) return refuse(encoded.status().message());
    wire = std::move(*encoded);
  }
  if (wire.empty()) return refuse("empty mailbox name");
  // Only the canonical spelling is accepted: the mapping must stay a bijection.
  Result<std::string> back = MailboxToDirName(wire, delimiter);
  if (!back.ok()) return refuse(back.status().message());
  if (*back != dir) {
    return refuse(back->empty() ? "INBOX is the Maildir root, not a folder"
                                : "not the canonical spelling (expected " + Quote(*back) + ")");
  }
  return wire;
}

// ---- Message file names ----

std::string FormatMaildirFileName(const MaildirFileName& name) {
  assert(name.uidvalidity != 0 && name.uid != 0);
  std::string out = std::to_string(name.uidvalidity) + "." + std::to_string(name.uid) + ".ghost";
  if (name.size) out += ",S=" + std::to_string(*name.size);
  out += ":2,";
  out += NormalizeInfo(name.info);
  return out;
}

Result<MaildirFileName> ParseMaildirFileName(std::string_view file) {
  auto refuse = [&](const std::string& why) {
    return Status::InvalidArgument("file name " + Quote(file) +
                                   " is not a Ghost Maildir message name "
                                   "(<uidvalidity>.<uid>.ghost[,S=<size>]:2,<flags>): " +
                                   why);
  };
  MaildirFileName out;
  std::string_view unique = file;
  const std::size_t colon = file.find(':');
  if (colon != std::string_view::npos) {
    unique = file.substr(0, colon);
    const std::string_view info = file.substr(colon + 1);
    if (info.substr(0, 2) != "2,") return refuse("info does not start with \"2,\"");
    for (char c : info.substr(2)) {
      if (!((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z'))) {
        return refuse("info letters must be ASCII letters");
      }
    }
    out.info = NormalizeInfo(info.substr(2));
  }
  const std::size_t dot1 = unique.find('.');
  if (dot1 == std::string_view::npos) return refuse("no '.'");
  const std::size_t dot2 = unique.find('.', dot1 + 1);
  if (dot2 == std::string_view::npos) return refuse("only one '.'");
  if (!ParseCanonicalNumber(unique.substr(0, dot1), &out.uidvalidity) || out.uidvalidity == 0) {
    return refuse("bad UIDVALIDITY");
  }
  if (!ParseCanonicalNumber(unique.substr(dot1 + 1, dot2 - dot1 - 1), &out.uid) || out.uid == 0) {
    return refuse("bad UID");
  }
  std::string_view rest = unique.substr(dot2 + 1);
  if (rest.substr(0, 5) != "ghost") return refuse("not made by ghost");
  rest.remove_prefix(5);
  if (!rest.empty()) {
    if (rest.substr(0, 3) != ",S=") return refuse("unknown field after \"ghost\"");
    std::uint64_t size = 0;
    if (!ParseCanonicalNumber(rest.substr(3), &size)) return refuse("bad size");
    out.size = size;
  }
  return out;
}

// ---- Flags <-> info letters ----

std::string NormalizeInfo(std::string_view info) {
  std::string out(info);
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

std::string FlagsToInfo(const std::vector<std::string>& flags, std::vector<std::string>* unmapped) {
  std::string letters;
  for (const std::string& f : flags) {
    bool found = false;
    for (const FlagLetter& fl : kFlagLetters) {
      if (EqualsIgnoreAsciiCase(f, fl.flag)) {
        letters.push_back(fl.letter);
        found = true;
        break;
      }
    }
    if (!found && unmapped) unmapped->push_back(f);
  }
  return NormalizeInfo(letters);
}

std::vector<std::string> InfoToFlags(std::string_view info, std::string* unmapped) {
  std::vector<std::string> flags;
  std::string seen;
  for (char c : info) {
    if (seen.find(c) != std::string::npos) continue;
    seen.push_back(c);
    bool found = false;
    for (const FlagLetter& fl : kFlagLetters) {
      if (fl.letter == c) {
        flags.emplace_back(fl.flag);
        found = true;
        break;
      }
    }
    if (!found && unmapped) unmapped->push_back(c);
  }
  return flags;
}

std::string MaildirSubdirFor(std::string_view info, bool moved_to_cur_by_reader) {
  if (moved_to_cur_by_reader || info.find('S') != std::string_view::npos) return "cur";
  return "new";
}

}  // namespace ghost
