// The SMTP listener's parsers. See proxy/smtp_wire.h.
#include "proxy/smtp_wire.h"

#include <openssl/evp.h>

#include <algorithm>
#include <cctype>
#include <cstdint>

namespace ghost::smtpwire {

std::optional<Command> ParseCommand(std::string_view line) {
  while (!line.empty() && (line.back() == '\n' || line.back() == '\r')) line.remove_suffix(1);
  std::size_t sp = line.find(' ');
  std::string_view verb = line.substr(0, sp);
  if (verb.empty() || verb.size() > 16) return std::nullopt;
  Command c;
  for (char ch : verb) {
    if (!std::isalpha(static_cast<unsigned char>(ch))) return std::nullopt;
    c.verb += static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  }
  if (sp != std::string_view::npos) c.arg = std::string(line.substr(sp + 1));
  return c;
}

std::optional<std::string> ParsePath(std::string_view arg, std::string_view prefix) {
  if (arg.size() < prefix.size()) return std::nullopt;
  for (std::size_t i = 0; i < prefix.size(); ++i) {
    if (std::toupper(static_cast<unsigned char>(arg[i])) != prefix[i]) return std::nullopt;
  }
  arg.remove_prefix(prefix.size());
  while (!arg.empty() && arg.front() == ' ') arg.remove_prefix(1);
  if (arg.empty() || arg.front() != '<') return std::nullopt;
  std::size_t close = arg.find('>');
  if (close == std::string_view::npos || close > 513) return std::nullopt;
  std::string_view path = arg.substr(1, close - 1);
  for (char ch : path) {
    if (static_cast<unsigned char>(ch) < 0x20 || ch == 0x7f || ch == '<' || ch == ' ') return std::nullopt;
  }
  if (!IsUtf8(path)) return std::nullopt;
  std::string_view rest = arg.substr(close + 1);
  if (!rest.empty() && rest.front() != ' ') return std::nullopt;
  return std::string(path);
}

bool IsUtf8(std::string_view text) {
  std::size_t i = 0;
  while (i < text.size()) {
    const auto b = static_cast<unsigned char>(text[i]);
    int more = 0;
    std::uint32_t cp = 0;
    if (b < 0x80) {
      ++i;
      continue;
    } else if (b >= 0xc2 && b <= 0xdf) {
      more = 1, cp = b & 0x1f;
    } else if (b >= 0xe0 && b <= 0xef) {
      more = 2, cp = b & 0x0f;
    } else if (b >= 0xf0 && b <= 0xf4) {
      more = 3, cp = b & 0x07;
    } else {
      return false;  // a continuation byte first, an overlong 2-byte lead, or past U+10FFFF
    }
    if (text.size() - i <= static_cast<std::size_t>(more)) return false;
    for (int k = 1; k <= more; ++k) {
      const auto c = static_cast<unsigned char>(text[i + k]);
      if ((c & 0xc0) != 0x80) return false;
      cp = (cp << 6) | (c & 0x3f);
    }
    if ((more == 2 && cp < 0x800) || (more == 3 && (cp < 0x10000 || cp > 0x10ffff)) ||
        (cp >= 0xd800 && cp <= 0xdfff)) {
      return false;
    }
    i += static_cast<std::size_t>(more) + 1;
  }
  return true;
}

std::optional<std::string> Base64Decode(std::string_view text) {
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r' || text.back() == ' ')) text.remove_suffix(1);
  if (text.size() % 4 != 0 || text.size() > 16 * 1024) return std::nullopt;
  if (text.empty()) return std::string();
  std::string out(text.size() / 4 * 3 + 1, '\0');
  int n = EVP_DecodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                          reinterpret_cast<const unsigned char*>(text.data()), static_cast<int>(text.size()));
  if (n < 0) return std::nullopt;
  std::size_t len = static_cast<std::size_t>(n);
  if (text.ends_with("==")) len -= 2;
  else if (text.ends_with("=")) len -= 1;
  out.resize(len);
  return out;
}

std::optional<std::pair<std::string, std::string>> PlainCredentials(std::string_view base64) {
  std::optional<std::string> raw = Base64Decode(base64);
  if (!raw) return std::nullopt;
  std::size_t a = raw->find('\0');
  if (a == std::string::npos) return std::nullopt;
  std::size_t b = raw->find('\0', a + 1);
  if (b == std::string::npos) return std::nullopt;
  std::string authzid = raw->substr(0, a), authcid = raw->substr(a + 1, b - a - 1);
  std::string password = raw->substr(b + 1);
  if (authcid.empty() || (!authzid.empty() && authzid != authcid)) return std::nullopt;
  return std::make_pair(authcid, password);
}

std::size_t DataReader::Feed(std::string_view in, std::string* out) {
  std::size_t used = 0;
  while (used < in.size() && !done_ && !error_) {
    std::size_t nl = in.find('\n', used);
    std::size_t end = nl == std::string_view::npos ? in.size() : nl + 1;
    if (line_.size() + (end - used) > max_line_) {
      error_ = true;
      return used;
    }
    line_.append(in.substr(used, end - used));
    used = end;
    if (nl == std::string_view::npos) break;
    if (line_ == ".\r\n" || line_ == ".\n") {
      done_ = true;
    } else if (line_.starts_with(".")) {
      out->append(line_, 1);
    } else {
      out->append(line_);
    }
    line_.clear();
  }
  return used;
}

}  // namespace ghost::smtpwire
