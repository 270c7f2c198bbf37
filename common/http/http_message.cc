#include "common/http/http_message.h"

#include <limits>

namespace ghost {
namespace {

char LowerAscii(char c) { return (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c; }

bool IsBlank(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; }

bool IsDigit(char c) { return c >= '0' && c <= '9'; }

// Strips the CR LF (or LF) that ends a raw header line.
std::string_view StripLineEnd(std::string_view line) {
  while (!line.empty() && (line.back() == '\n' || line.back() == '\r')) line.remove_suffix(1);
  return line;
}

}  // namespace

bool EqualsIgnoreCase(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (LowerAscii(a[i]) != LowerAscii(b[i])) return false;
  }
  return true;
}

std::string_view TrimBlanks(std::string_view text) {
  while (!text.empty() && IsBlank(text.front())) text.remove_prefix(1);
  while (!text.empty() && IsBlank(text.back())) text.remove_suffix(1);
  return text;
}

std::optional<Bytes> ParseDecimal(std::string_view text) {
  text = TrimBlanks(text);
  if (text.empty()) return std::nullopt;
  Bytes value = 0;
  for (char c : text) {
    if (!IsDigit(c)) return std::nullopt;
    const Bytes digit = static_cast<Bytes>(c - '0');
    if (value > (std::numeric_limits<Bytes>::max() - digit) / 10) return std::nullopt;
    value = value * 10 + digit;
  }
  return value;
}

std::optional<int> ParseStatusLine(std::string_view line) {
  line = StripLineEnd(line);
  if (line.size() < 5 || line.substr(0, 5) != "HTTP/") return std::nullopt;
  std::size_t sp = line.find(' ');
  if (sp == std::string_view::npos) return std::nullopt;
  std::string_view rest = line.substr(sp + 1);
  while (!rest.empty() && rest.front() == ' ') rest.remove_prefix(1);
  if (rest.size() < 3 || !IsDigit(rest[0]) || !IsDigit(rest[1]) || !IsDigit(rest[2])) {
    return std::nullopt;
  }
  if (rest.size() > 3 && rest[3] != ' ' && rest[3] != '\t') return std::nullopt;
  return (rest[0] - '0') * 100 + (rest[1] - '0') * 10 + (rest[2] - '0');
}

bool ParseContentRange(std::string_view value, std::optional<std::pair<Bytes, Bytes>>* range,
                       Bytes* total) {
  value = TrimBlanks(value);
  if (value.size() < 6 || !EqualsIgnoreCase(value.substr(0, 5), "bytes") ||
      (value[5] != ' ' && value[5] != '\t')) {
    return false;
  }
  value = TrimBlanks(value.substr(6));
  const std::size_t slash = value.find('/');
  if (slash == std::string_view::npos) return false;
  const std::string_view span = TrimBlanks(value.substr(0, slash));
  const std::string_view length = TrimBlanks(value.substr(slash + 1));

  Bytes complete = 0;
  if (length != "*") {
    std::optional<Bytes> n = ParseDecimal(length);
    if (!n) return false;
    complete = *n;
  }
  std::optional<std::pair<Bytes, Bytes>> parsed;
  if (span == "*") {
    if (length == "*") return false;  // "bytes */*" says nothing
  } else {
    const std::size_t dash = span.find('-');
    if (dash == std::string_view::npos) return false;
    std::optional<Bytes> first = ParseDecimal(span.substr(0, dash));
    std::optional<Bytes> last = ParseDecimal(span.substr(dash + 1));
    if (!first || !last || *first > *last) return false;
    if (length != "*" && *last >= complete) return false;
    parsed = std::make_pair(*first, *last);
  }
  *range = parsed;
  *total = complete;
  return true;
}

const std::string* HttpResponseHead::Find(std::string_view name) const {
  for (const auto& [n, v] : headers) {
    if (EqualsIgnoreCase(n, name)) return &v;
  }
  return nullptr;
}

std::string HttpResponseHead::FindAll(std::string_view name) const {
  std::string joined;
  for (const auto& [n, v] : headers) {
    if (!EqualsIgnoreCase(n, name) || v.empty()) continue;
    if (!joined.empty()) joined += ", ";
    joined += v;
  }
  return joined;
}

bool HttpResponseHead::AddHeaderLine(std::string_view line) {
  if (std::optional<int> code = ParseStatusLine(line)) {
    std::string url = std::move(effective_url);
    *this = HttpResponseHead{};
    effective_url = std::move(url);
    status = *code;
    return true;
  }
  if (status == 0) return false;  // nothing before the status line belongs to a head
  line = StripLineEnd(line);
  if (line.empty()) return false;
  if (line.front() == ' ' || line.front() == '\t') {
    // Obsolete folding (RFC 9112 §5.2): the line continues the previous field's value.
    if (!headers.empty()) {
      std::string_view more = TrimBlanks(line);
      if (!more.empty()) {
        if (!headers.back().second.empty()) headers.back().second += ' ';
        headers.back().second.append(more);
      }
    }
    return false;
  }
  const std::size_t colon = line.find(':');
  if (colon == std::string_view::npos || colon == 0) return false;
  std::string_view name = line.substr(0, colon);
  if (name.back() == ' ' || name.back() == '\t') return false;  // RFC 9112 §5.1: reject
  headers.emplace_back(std::string(name), std::string(TrimBlanks(line.substr(colon + 1))));
  return false;
}

void HttpResponseHead::Finish() {
  content_length.reset();
  etag.clear();
  last_modified.clear();
  content_type.clear();
  expires.clear();
  date.clear();
  age.clear();
  content_range.reset();
  total_size_from_content_range = 0;

  auto first = [this](std::string_view name) -> std::string {
    const std::string* v = Find(name);
    return v ? *v : std::string();
  };
  if (const std::string* v = Find("Content-Length")) content_length = ParseDecimal(*v);
  etag = first("ETag");
  last_modified = first("Last-Modified");
  content_type = first("Content-Type");
  cache_control = FindAll("Cache-Control");
  expires = first("Expires");
  date = first("Date");
  age = first("Age");
  if (const std::string* v = Find("Content-Range")) {
    std::optional<std::pair<Bytes, Bytes>> range;
    Bytes total = 0;
    if (ParseContentRange(*v, &range, &total)) {
      content_range = range;
      total_size_from_content_range = total;
    }
  }
}

}  // namespace ghost
