// The SMTP listener's parsers. See proxy/smtp_wire.h.
#include "proxy/smtp_wire.h"

#include <openssl/evp.h>

#include <algorithm>
#include <cctype>

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
  std::string_view rest = arg.substr(close + 1);
  if (!rest.empty() && rest.front() != ' ') return std::nullopt;
  return std::string(path);
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
