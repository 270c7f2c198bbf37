#include "proxy/http1.h"

#include <algorithm>
#include <cassert>
#include <cstring>
#include <limits>
#include <utility>

namespace ghost::http1 {
namespace {

// Empty lines tolerated before a request-line or status-line (RFC 9112 §2.2 asks for one;
// some clients send a CR LF after a POST body).
constexpr std::size_t kMaxEmptyLinesBeforeStart = 8;

bool IsDigit(unsigned char c) { return c >= '0' && c <= '9'; }
bool IsAlpha(unsigned char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }
bool IsHexDigit(unsigned char c) {
  return IsDigit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}
int HexValue(unsigned char c) {
  if (IsDigit(c)) return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return c - 'A' + 10;
}
char LowerAscii(char c) { return (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c; }
bool IsWs(unsigned char c) { return c == ' ' || c == '\t'; }

// tchar (RFC 9110 §5.6.2).
bool IsTokenChar(unsigned char c) {
  if (IsDigit(c) || IsAlpha(c)) return true;
  switch (c) {
    case '!':
    case '#':
    case '$':
    case '%':
    case '&':
    case '\'':
    case '*':
    case '+':
    case '-':
    case '.':
    case '^':
    case '_':
    case '`':
    case '|':
    case '~':
      return true;
    default:
      return false;
  }
}

bool IsToken(std::string_view s) {
  if (s.empty()) return false;
  for (unsigned char c : s) {
    if (!IsTokenChar(c)) return false;
  }
  return true;
}

// field-vchar, SP and HTAB (RFC 9110 §5.5): anything but controls and DEL.
bool IsFieldValueChar(unsigned char c) { return c == '\t' || (c >= 0x20 && c != 0x7f); }

bool IsFieldValue(std::string_view s) {
  for (unsigned char c : s) {
    if (!IsFieldValueChar(c)) return false;
  }
  return true;
}

// Visible ASCII without '#': what a request-target may hold. (Stricter than "any non-space":
// no controls, no bytes above 0x7e; looser than RFC 3986 for characters like '|' and '{' that
// browsers send unescaped.)
bool IsTargetChar(unsigned char c) { return c > 0x20 && c < 0x7f && c != '#'; }

bool IsTarget(std::string_view s) {
  if (s.empty()) return false;
  for (unsigned char c : s) {
    if (!IsTargetChar(c)) return false;
  }
  return true;
}

std::string_view TrimOws(std::string_view s) {
  while (!s.empty() && IsWs(s.front())) s.remove_prefix(1);
  while (!s.empty() && IsWs(s.back())) s.remove_suffix(1);
  return s;
}

// Calls fn(element) for each non-empty element of a comma-separated list (RFC 9110 §5.6.1),
// trimmed of OWS. Stops and returns false when fn does.
template <typename Fn>
bool ForEachListElement(std::string_view list, Fn fn) {
  while (true) {
    const std::size_t comma = list.find(',');
    std::string_view element = TrimOws(list.substr(0, comma));
    if (!element.empty() && !fn(element)) return false;
    if (comma == std::string_view::npos) return true;
    list.remove_prefix(comma + 1);
  }
}

// "HTTP/1.x" → x; -1 when it is HTTP/<d>[.<d>] of another major version; -2 when malformed.
int ParseVersion(std::string_view v) {
  if (v.size() < 6 || v.substr(0, 5) != "HTTP/" || !IsDigit(v[5])) return -2;
  const bool has_minor = v.size() == 8 && v[6] == '.' && IsDigit(v[7]);
  if (v.size() != 6 && !has_minor) return -2;
  if (v[5] != '1') return -1;  // HTTP/2, HTTP/2.0, HTTP/0.9, HTTP/3 ...
  if (!has_minor) return -2;   // "HTTP/1"
  return v[7] - '0';
}

std::string Quote(std::string_view s) {
  // For messages: at most 64 bytes, non-printable bytes as \xNN.
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out = "\"";
  for (std::size_t i = 0; i < s.size() && i < 64; ++i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c < 0x7f && c != '"' && c != '\\') {
      out += static_cast<char>(c);
    } else {
      out += "\\x";
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  if (s.size() > 64) out += "...";
  out += '"';
  return out;
}

// Content-Length fields (RFC 9110 §8.6, RFC 9112 §6.3 item 5): every element of every field
// is 1*DIGIT (no empty elements) and all are equal. Returns false with *why set otherwise;
// *length is the value.
bool ParseContentLength(const HeaderList& headers, Bytes* length, std::string* why) {
  bool seen = false;
  for (const HeaderField& f : headers) {
    if (!EqualsIgnoreCase(f.name, "Content-Length")) continue;
    std::string_view list = f.value;
    while (true) {
      const std::size_t comma = list.find(',');
      const std::string_view element = TrimOws(list.substr(0, comma));
      if (element.empty() || !std::all_of(element.begin(), element.end(), [](char c) {
            return IsDigit(static_cast<unsigned char>(c));
          })) {
        *why = "Content-Length " + Quote(f.value) + " is not a decimal number";
        return false;
      }
      const std::optional<Bytes> n = ParseDecimal(element);
      if (!n) {
        *why = "Content-Length " + Quote(f.value) + " is too large";
        return false;
      }
      if (seen && *n != *length) {
        *why = "Content-Length fields disagree (" + std::to_string(*length) + " and " +
               std::to_string(*n) + ")";
        return false;
      }
      seen = true;
      *length = *n;
      if (comma == std::string_view::npos) break;
      list.remove_prefix(comma + 1);
    }
  }
  return true;
}

// Transfer-Encoding fields: the codings in order.
struct TransferCodings {
  bool present = false;
  bool empty = true;
  bool chunked_last = false;
  bool chunked_not_last = false;  // another coding follows chunked (or chunked twice)
  std::string other;              // the first coding that is not chunked
};

TransferCodings ReadTransferCodings(const HeaderList& headers) {
  TransferCodings tc;
  for (const HeaderField& f : headers) {
    if (!EqualsIgnoreCase(f.name, "Transfer-Encoding")) continue;
    tc.present = true;
    ForEachListElement(f.value, [&](std::string_view coding) {
      if (tc.chunked_last) tc.chunked_not_last = true;  // something follows chunked
      tc.empty = false;
      tc.chunked_last = EqualsIgnoreCase(coding, "chunked");
      if (!tc.chunked_last && tc.other.empty()) tc.other = std::string(coding);
      return true;
    });
  }
  return tc;
}

// Writes "Name: value" CR LF lines after validating them.
bool AppendFields(const HeaderList& fields, std::string* out) {
  for (const HeaderField& f : fields) {
    if (!IsToken(f.name) || !IsFieldValue(f.value)) return false;
    out->append(f.name);
    out->append(": ");
    out->append(f.value);
    out->append("\r\n");
  }
  out->append("\r\n");
  return true;
}

}  // namespace

// ---- Errors ----

int HttpStatusFor(ParseErrorCode code) {
  switch (code) {
    case ParseErrorCode::kNone:
      return 0;
    case ParseErrorCode::kStartLineTooLong:
      return 414;
    case ParseErrorCode::kHeadersTooLarge:
    case ParseErrorCode::kTooManyHeaders:
    case ParseErrorCode::kTrailersTooLarge:
      return 431;
    case ParseErrorCode::kUnsupportedTransferCoding:
      return 501;
    case ParseErrorCode::kVersionNotSupported:
      return 505;
    case ParseErrorCode::kBadStartLine:
    case ParseErrorCode::kBadTarget:
    case ParseErrorCode::kBadHeader:
    case ParseErrorCode::kWhitespaceBeforeColon:
    case ParseErrorCode::kObsFold:
    case ParseErrorCode::kBadHost:
    case ParseErrorCode::kBadContentLength:
    case ParseErrorCode::kConflictingFraming:
    case ParseErrorCode::kBadTransferEncoding:
    case ParseErrorCode::kBadChunk:
    case ParseErrorCode::kTruncated:
      return 400;
  }
  return 400;
}

std::string_view ToString(ParseErrorCode code) {
  switch (code) {
    case ParseErrorCode::kNone:
      return "ok";
    case ParseErrorCode::kBadStartLine:
      return "bad start line";
    case ParseErrorCode::kBadTarget:
      return "bad request-target";
    case ParseErrorCode::kStartLineTooLong:
      return "start line too long";
    case ParseErrorCode::kVersionNotSupported:
      return "HTTP version not supported";
    case ParseErrorCode::kBadHeader:
      return "bad header field";
    case ParseErrorCode::kWhitespaceBeforeColon:
      return "whitespace before colon";
    case ParseErrorCode::kObsFold:
      return "obsolete line folding";
    case ParseErrorCode::kHeadersTooLarge:
      return "header section too large";
    case ParseErrorCode::kTooManyHeaders:
      return "too many header fields";
    case ParseErrorCode::kBadHost:
      return "bad Host";
    case ParseErrorCode::kBadContentLength:
      return "bad Content-Length";
    case ParseErrorCode::kConflictingFraming:
      return "conflicting framing";
    case ParseErrorCode::kBadTransferEncoding:
      return "bad Transfer-Encoding";
    case ParseErrorCode::kUnsupportedTransferCoding:
      return "unsupported transfer coding";
    case ParseErrorCode::kBadChunk:
      return "bad chunk";
    case ParseErrorCode::kTrailersTooLarge:
      return "trailer section too large";
    case ParseErrorCode::kTruncated:
      return "truncated message";
  }
  return "unknown";
}

std::string_view ReasonPhrase(int status) {
  switch (status) {
    case 100:
      return "Continue";
    case 101:
      return "Switching Protocols";
    case 200:
      return "OK";
    case 201:
      return "Created";
    case 202:
      return "Accepted";
    case 203:
      return "Non-Authoritative Information";
    case 204:
      return "No Content";
    case 206:
      return "Partial Content";
    case 301:
      return "Moved Permanently";
    case 302:
      return "Found";
    case 303:
      return "See Other";
    case 304:
      return "Not Modified";
    case 307:
      return "Temporary Redirect";
    case 308:
      return "Permanent Redirect";
    case 400:
      return "Bad Request";
    case 401:
      return "Unauthorized";
    case 403:
      return "Forbidden";
    case 404:
      return "Not Found";
    case 405:
      return "Method Not Allowed";
    case 407:
      return "Proxy Authentication Required";
    case 408:
      return "Request Timeout";
    case 411:
      return "Length Required";
    case 413:
      return "Content Too Large";
    case 414:
      return "URI Too Long";
    case 416:
      return "Range Not Satisfiable";
    case 431:
      return "Request Header Fields Too Large";
    case 500:
      return "Internal Server Error";
    case 501:
      return "Not Implemented";
    case 502:
      return "Bad Gateway";
    case 503:
      return "Service Unavailable";
    case 504:
      return "Gateway Timeout";
    case 505:
      return "HTTP Version Not Supported";
    default:
      return "Unknown";
  }
}

Status ParseError::ToStatus() const {
  if (ok()) return Status::Ok();
  std::string text = "HTTP/1.1: " + message + " (" + std::to_string(http_status) + ")";
  if (http_status == 501 || http_status == 505) return Status::NotSupported(std::move(text));
  return Status::InvalidArgument(std::move(text));
}

// ---- Header fields ----

const std::string* HeaderList::Find(std::string_view name) const {
  for (const HeaderField& f : fields_) {
    if (EqualsIgnoreCase(f.name, name)) return &f.value;
  }
  return nullptr;
}

std::string HeaderList::FindAll(std::string_view name) const {
  std::string joined;
  for (const HeaderField& f : fields_) {
    if (!EqualsIgnoreCase(f.name, name) || f.value.empty()) continue;
    if (!joined.empty()) joined += ", ";
    joined += f.value;
  }
  return joined;
}

std::size_t HeaderList::Count(std::string_view name) const {
  return static_cast<std::size_t>(
      std::count_if(fields_.begin(), fields_.end(),
                    [name](const HeaderField& f) { return EqualsIgnoreCase(f.name, name); }));
}

std::size_t HeaderList::Remove(std::string_view name) {
  const std::size_t before = fields_.size();
  std::erase_if(fields_, [name](const HeaderField& f) { return EqualsIgnoreCase(f.name, name); });
  return before - fields_.size();
}

bool HeaderList::HasToken(std::string_view name, std::string_view token) const {
  for (const HeaderField& f : fields_) {
    if (!EqualsIgnoreCase(f.name, name)) continue;
    const bool found = !ForEachListElement(
        f.value, [token](std::string_view element) { return !EqualsIgnoreCase(element, token); });
    if (found) return true;
  }
  return false;
}

bool IsHopByHopHeader(std::string_view name) {
  return std::any_of(kHopByHopHeaders.begin(), kHopByHopHeaders.end(),
                     [name](std::string_view h) { return EqualsIgnoreCase(h, name); });
}

void RemoveHopByHopHeaders(HeaderList* headers) {
  // Copy the names first: erasing moves the strings the Connection values live in.
  std::vector<std::string> named;
  for (const HeaderField& f : *headers) {
    if (!EqualsIgnoreCase(f.name, "Connection")) continue;
    ForEachListElement(f.value, [&named](std::string_view element) {
      named.emplace_back(element);
      return true;
    });
  }
  std::erase_if(headers->fields(), [&named](const HeaderField& f) {
    if (IsHopByHopHeader(f.name)) return true;
    return std::any_of(named.begin(), named.end(),
                       [&f](const std::string& n) { return EqualsIgnoreCase(n, f.name); });
  });
}

bool WantsKeepAlive(int version_minor, const HeaderList& headers) {
  if (headers.HasToken("Connection", "close")) return false;
  if (version_minor >= 1) return true;
  return headers.HasToken("Connection", "keep-alive");
}

// ---- URLs and authorities ----

Result<HostPort> SplitAuthority(std::string_view authority, bool require_port) {
  if (authority.empty()) return Status::InvalidArgument("empty host");
  if (authority.find('@') != std::string_view::npos) {
    return Status::InvalidArgument("user information (\"user@\") in " + Quote(authority) +
                                   " is not allowed; send credentials in a header");
  }
  HostPort hp;
  std::string_view rest;
  if (authority.front() == '[') {
    const std::size_t close = authority.find(']');
    if (close == std::string_view::npos) {
      return Status::InvalidArgument("IPv6 address in " + Quote(authority) + " has no ']'");
    }
    const std::string_view ip = authority.substr(1, close - 1);
    bool colon = false;
    for (unsigned char c : ip) {
      if (c == ':') colon = true;
      if (!IsHexDigit(c) && c != ':' && c != '.') {
        return Status::InvalidArgument("bad IPv6 address in " + Quote(authority));
      }
    }
    if (!colon) return Status::InvalidArgument("bad IPv6 address in " + Quote(authority));
    hp.host = std::string(authority.substr(0, close + 1));
    rest = authority.substr(close + 1);
  } else {
    const std::size_t colon = authority.find(':');
    const std::string_view host = authority.substr(0, colon);
    if (host.empty()) return Status::InvalidArgument("empty host in " + Quote(authority));
    for (unsigned char c : host) {
      if (!IsAlpha(c) && !IsDigit(c) && c != '-' && c != '.' && c != '_') {
        return Status::InvalidArgument("host " + Quote(host) +
                                       " has characters not allowed in a host name");
      }
    }
    hp.host = std::string(host);
    rest = colon == std::string_view::npos ? std::string_view() : authority.substr(colon);
  }
  for (char& c : hp.host) c = LowerAscii(c);

  if (rest.empty() || rest == ":") {
    if (require_port) return Status::InvalidArgument(Quote(authority) + " has no port");
    return hp;
  }
  if (rest.front() != ':') {
    return Status::InvalidArgument("unexpected " + Quote(rest) + " after the host in " +
                                   Quote(authority));
  }
  unsigned port = 0;
  for (unsigned char c : rest.substr(1)) {
    if (!IsDigit(c))
      return Status::InvalidArgument("port in " + Quote(authority) + " is not a number");
    port = port * 10 + (c - '0');
    if (port > 65535)
      return Status::InvalidArgument("port in " + Quote(authority) + " is over 65535");
  }
  if (port == 0) return Status::InvalidArgument("port 0 in " + Quote(authority));
  hp.port = static_cast<std::uint16_t>(port);
  return hp;
}

std::string AbsoluteUrl::Authority() const {
  if (port == 80) return host;
  return host + ":" + std::to_string(port);
}

Result<AbsoluteUrl> SplitAbsoluteUrl(std::string_view url) {
  const std::size_t colon = url.find(':');
  if (colon == std::string_view::npos || colon == 0 || !IsAlpha(url[0])) {
    return Status::InvalidArgument(Quote(url) + " is not an absolute URL (scheme://host/path)");
  }
  std::string scheme(url.substr(0, colon));
  for (char& c : scheme) {
    if (!IsAlpha(c) && !IsDigit(c) && c != '+' && c != '-' && c != '.') {
      return Status::InvalidArgument(Quote(url) + " is not an absolute URL (bad scheme)");
    }
    c = LowerAscii(c);
  }
  if (scheme == "https") {
    return Status::NotSupported(
        "https:// URLs are not forwarded in the clear; clients reach "
        "https origins through CONNECT");
  }
  if (scheme != "http") {
    return Status::NotSupported("scheme " + Quote(scheme) +
                                " is not supported; the proxy "
                                "forwards http:// URLs (and CONNECT tunnels)");
  }
  std::string_view rest = url.substr(colon + 1);
  if (rest.substr(0, 2) != "//") {
    return Status::InvalidArgument(Quote(url) + " has no \"//\" after \"http:\"");
  }
  rest.remove_prefix(2);
  for (unsigned char c : rest) {
    if (c == '#') return Status::InvalidArgument(Quote(url) + " has a fragment ('#')");
    if (!IsTargetChar(c)) {
      return Status::InvalidArgument(Quote(url) + " has a byte not allowed in a URL");
    }
  }
  const std::size_t end = rest.find_first_of("/?");
  Result<HostPort> hp = SplitAuthority(rest.substr(0, end), /*require_port=*/false);
  if (!hp.ok()) return hp.status().WithContext("URL " + Quote(url));

  AbsoluteUrl u;
  u.scheme = std::move(scheme);
  u.host = std::move(hp->host);
  u.port = hp->port != 0 ? hp->port : 80;
  const std::string_view path =
      end == std::string_view::npos ? std::string_view() : rest.substr(end);
  if (path.empty() || path.front() == '?') u.path = "/";
  u.path.append(path);
  return u;
}

// ---- Messages ----

void RequestHead::Clear() {
  method.clear();
  target.clear();
  target_form = TargetForm::kOrigin;
  version_minor = 1;
  headers.clear();
  framing = BodyFraming::kNone;
  content_length = 0;
  keep_alive = true;
}

void ResponseHead::Clear() {
  version_minor = 1;
  status = 0;
  reason.clear();
  headers.clear();
  framing = BodyFraming::kNone;
  content_length = 0;
  keep_alive = true;
}

HttpResponseHead ResponseHead::ToCacheHead() const {
  HttpResponseHead h;
  h.status = status;
  h.headers.reserve(headers.size());
  for (const HeaderField& f : headers) h.headers.emplace_back(f.name, f.value);
  h.Finish();
  return h;
}

// ---- MessageParser ----

MessageParser::MessageParser(const Limits& limits, bool is_request)
    : limits_(limits), is_request_(is_request) {}

void MessageParser::AssertInvariants() const {
  assert(state_ != State::kError || !error_.ok());
  assert(state_ == State::kError || error_.ok());
  assert(line_taken_ ||
         line_.size() <= std::max({limits_.max_start_line, limits_.max_header_bytes,
                                   limits_.max_chunk_line, limits_.max_trailer_bytes}));
  assert(state_ != State::kChunkData || remaining_ > 0);
}

void MessageParser::StartMessage() {
  ClearHead();
  trailers_.clear();
  line_.clear();
  line_taken_ = false;
  empty_lines_ = 0;
  head_bytes_ = 0;
  framing_ = BodyFraming::kNone;
  tunnel_after_ = false;
  remaining_ = 0;
  body_bytes_ = 0;
  state_ = State::kStartLine;
}

void MessageParser::Reset() {
  error_ = ParseError();
  StartMessage();
}

bool MessageParser::Fail(ParseErrorCode code, std::string message) {
  error_.code = code;
  error_.http_status = is_request_ ? HttpStatusFor(code) : 502;
  error_.message = std::move(message);
  state_ = State::kError;
  return false;
}

void MessageParser::SetFraming(BodyFraming framing, Bytes content_length, bool tunnel_after) {
  framing_ = framing;
  remaining_ = framing == BodyFraming::kContentLength ? content_length : 0;
  tunnel_after_ = tunnel_after;
}

MessageParser::LineStatus MessageParser::TakeLine(std::string_view in, std::size_t* pos,
                                                  std::size_t budget, std::string_view* line,
                                                  bool* had_cr, std::size_t* raw_size) {
  if (line_taken_) {
    line_.clear();
    line_taken_ = false;
  }
  // A partial line of L bytes is a line of at least L + 1; it fits only if L < budget.
  if (line_.size() >= budget) return LineStatus::kTooLong;
  const std::string_view avail = in.substr(*pos);
  const std::size_t scan = std::min(avail.size(), budget - line_.size());
  // memchr on a null pointer is undefined even for 0 bytes (an empty input at a client's EOF).
  const void* lf = scan == 0 ? nullptr : std::memchr(avail.data(), '\n', scan);
  if (lf == nullptr) {
    if (line_.size() + avail.size() >= budget) return LineStatus::kTooLong;
    line_.append(avail);
    *pos = in.size();
    return LineStatus::kNeedMore;
  }
  const std::size_t n = static_cast<std::size_t>(static_cast<const char*>(lf) - avail.data()) + 1;
  std::string_view whole;
  if (line_.empty()) {
    whole = avail.substr(0, n);
  } else {
    line_.append(avail.substr(0, n));
    line_taken_ = true;
    whole = line_;
  }
  *pos += n;
  *raw_size = whole.size();
  whole.remove_suffix(1);  // LF
  *had_cr = !whole.empty() && whole.back() == '\r';
  if (*had_cr) whole.remove_suffix(1);
  *line = whole;
  return LineStatus::kLine;
}

Event MessageParser::Complete(std::size_t consumed) {
  state_ = tunnel_after_ ? State::kTunnel : State::kMessageDone;
  return {EventType::kMessageComplete, consumed, {}};
}

Event MessageParser::Parse(std::string_view in) {
  AssertInvariants();
  std::size_t pos = 0;
  std::string_view line;
  bool had_cr = false;
  std::size_t raw = 0;
  while (true) {
    switch (state_) {
      case State::kError:
        return {EventType::kError, pos, {}};
      case State::kTunnel:
        return {EventType::kTunnel, pos, {}};
      case State::kEnded:
        return {EventType::kEnd, pos, {}};
      case State::kMessageDone:
        StartMessage();
        break;

      case State::kStartLine: {
        const LineStatus s = TakeLine(in, &pos, limits_.max_start_line, &line, &had_cr, &raw);
        if (s == LineStatus::kNeedMore) return {EventType::kNeedMore, pos, {}};
        if (s == LineStatus::kTooLong) {
          Fail(ParseErrorCode::kStartLineTooLong,
               std::string(is_request_ ? "request-line" : "status-line") + " is longer than " +
                   std::to_string(limits_.max_start_line) + " bytes");
          return {EventType::kError, pos, {}};
        }
        if (line.empty()) {
          if (++empty_lines_ > kMaxEmptyLinesBeforeStart) {
            Fail(ParseErrorCode::kBadStartLine,
                 "more than " + std::to_string(kMaxEmptyLinesBeforeStart) +
                     " empty lines before the " + (is_request_ ? "request-line" : "status-line"));
            return {EventType::kError, pos, {}};
          }
          break;
        }
        if (!OnStartLine(line)) return {EventType::kError, pos, {}};
        state_ = State::kHeaders;
        head_bytes_ = 0;
        break;
      }

      case State::kHeaders:
      case State::kTrailers: {
        const bool trailers = state_ == State::kTrailers;
        const std::size_t limit = trailers ? limits_.max_trailer_bytes : limits_.max_header_bytes;
        const LineStatus s = TakeLine(in, &pos, limit - head_bytes_, &line, &had_cr, &raw);
        if (s == LineStatus::kNeedMore) return {EventType::kNeedMore, pos, {}};
        if (s == LineStatus::kTooLong) {
          Fail(trailers ? ParseErrorCode::kTrailersTooLarge : ParseErrorCode::kHeadersTooLarge,
               std::string(trailers ? "trailer" : "header") + " section is larger than " +
                   std::to_string(limit) + " bytes");
          return {EventType::kError, pos, {}};
        }
        head_bytes_ += raw;
        if (!line.empty()) {
          if (!OnFieldLine(line, trailers)) return {EventType::kError, pos, {}};
          break;
        }
        if (trailers) return Complete(pos);
        if (!OnHeadComplete()) return {EventType::kError, pos, {}};
        switch (framing_) {
          case BodyFraming::kNone:
          case BodyFraming::kContentLength:
            state_ = State::kFixedBody;
            break;
          case BodyFraming::kChunked:
            state_ = State::kChunkSize;
            break;
          case BodyFraming::kUntilClose:
            state_ = State::kUntilClose;
            break;
        }
        return {EventType::kHead, pos, {}};
      }

      case State::kFixedBody:
      case State::kChunkData:
      case State::kUntilClose: {
        if (state_ == State::kFixedBody && remaining_ == 0) return Complete(pos);
        if (pos == in.size()) return {EventType::kNeedMore, pos, {}};
        std::size_t n = in.size() - pos;
        if (state_ != State::kUntilClose) {
          n = static_cast<std::size_t>(std::min<Bytes>(n, remaining_));
          remaining_ -= n;
          if (state_ == State::kChunkData && remaining_ == 0) state_ = State::kChunkDataCr;
        }
        const std::string_view body = in.substr(pos, n);
        pos += n;
        body_bytes_ += n;
        return {EventType::kBody, pos, body};
      }

      case State::kChunkDataCr:
      case State::kChunkDataLf: {
        if (pos == in.size()) return {EventType::kNeedMore, pos, {}};
        const char want = state_ == State::kChunkDataCr ? '\r' : '\n';
        if (in[pos] != want) {
          Fail(ParseErrorCode::kBadChunk,
               "chunk data is not followed by CR LF (got " + Quote(in.substr(pos, 1)) + ")");
          return {EventType::kError, pos, {}};
        }
        ++pos;
        state_ = state_ == State::kChunkDataCr ? State::kChunkDataLf : State::kChunkSize;
        break;
      }

      case State::kChunkSize: {
        const LineStatus s = TakeLine(in, &pos, limits_.max_chunk_line, &line, &had_cr, &raw);
        if (s == LineStatus::kNeedMore) return {EventType::kNeedMore, pos, {}};
        if (s == LineStatus::kTooLong) {
          Fail(ParseErrorCode::kBadChunk, "chunk-size line is longer than " +
                                              std::to_string(limits_.max_chunk_line) + " bytes");
          return {EventType::kError, pos, {}};
        }
        if (!had_cr) {
          Fail(ParseErrorCode::kBadChunk, "chunk-size line ends in a bare LF");
          return {EventType::kError, pos, {}};
        }
        if (!OnChunkSizeLine(line)) return {EventType::kError, pos, {}};
        break;
      }
    }
  }
}

bool MessageParser::OnChunkSizeLine(std::string_view line) {
  // chunk-size [ chunk-ext ] (RFC 9112 §7.1); the extensions are checked and ignored.
  std::size_t i = 0;
  Bytes size = 0;
  while (i < line.size() && IsHexDigit(static_cast<unsigned char>(line[i]))) {
    if (size > (std::numeric_limits<Bytes>::max() >> 4)) {
      return Fail(ParseErrorCode::kBadChunk, "chunk size " + Quote(line) + " overflows");
    }
    size = (size << 4) | static_cast<Bytes>(HexValue(static_cast<unsigned char>(line[i])));
    ++i;
  }
  if (i == 0) return Fail(ParseErrorCode::kBadChunk, "chunk size " + Quote(line) + " is not hex");
  // *( BWS ";" BWS ext-name [ BWS "=" BWS ext-val ] ), ext-val = token / quoted-string
  auto skip_ws = [&] {
    while (i < line.size() && IsWs(static_cast<unsigned char>(line[i]))) ++i;
  };
  auto token = [&] {
    const std::size_t start = i;
    while (i < line.size() && IsTokenChar(static_cast<unsigned char>(line[i]))) ++i;
    return i > start;
  };
  const auto bad_ext = [&] {
    return Fail(ParseErrorCode::kBadChunk, "bad chunk extension in " + Quote(line));
  };
  while (true) {
    skip_ws();
    if (i == line.size()) break;
    if (line[i] != ';') return bad_ext();
    ++i;
    skip_ws();
    if (!token()) return bad_ext();
    skip_ws();
    if (i < line.size() && line[i] == '=') {
      ++i;
      skip_ws();
      if (i < line.size() && line[i] == '"') {
        ++i;
        bool closed = false;
        while (i < line.size()) {
          const unsigned char c = static_cast<unsigned char>(line[i]);
          if (c == '"') {
            closed = true;
            ++i;
            break;
          }
          if (c == '\\') {
            ++i;
            if (i == line.size()) break;
          } else if (!IsFieldValueChar(c)) {
            break;
          }
          ++i;
        }
        if (!closed) return bad_ext();
      } else if (!token()) {
        return bad_ext();
      }
    }
  }
  if (size == 0) {
    state_ = State::kTrailers;
    head_bytes_ = 0;
  } else {
    remaining_ = size;
    state_ = State::kChunkData;
  }
  return true;
}

bool MessageParser::OnFieldLine(std::string_view line, bool trailers) {
  HeaderList& fields = trailers ? trailers_ : head_headers();
  const char* section = trailers ? "trailer" : "header";
  if (IsWs(static_cast<unsigned char>(line.front()))) {
    // obs-fold (RFC 9112 §5.2): a server rejects it; a proxy reading a response replaces it
    // with a space.
    if (is_request_ || fields.empty()) {
      return Fail(ParseErrorCode::kObsFold,
                  std::string(section) + " line " + Quote(line) +
                      " starts with whitespace (obsolete line folding is not accepted)");
    }
    const std::string_view more = TrimOws(line);
    if (!IsFieldValue(more)) {
      return Fail(ParseErrorCode::kBadHeader,
                  std::string(section) + " line " + Quote(line) + " has control characters");
    }
    std::string& value = fields[fields.size() - 1].value;
    if (!more.empty()) {
      if (!value.empty()) value += ' ';
      value.append(more);
    }
    return true;
  }
  if (fields.size() >= limits_.max_headers) {
    return Fail(trailers ? ParseErrorCode::kTrailersTooLarge : ParseErrorCode::kTooManyHeaders,
                "more than " + std::to_string(limits_.max_headers) + " " + section + " fields");
  }
  std::size_t i = 0;
  while (i < line.size() && IsTokenChar(static_cast<unsigned char>(line[i]))) ++i;
  const std::string_view name = line.substr(0, i);
  std::size_t j = i;
  while (j < line.size() && IsWs(static_cast<unsigned char>(line[j]))) ++j;
  if (name.empty() || j == line.size() || line[j] != ':') {
    return Fail(ParseErrorCode::kBadHeader,
                std::string(section) + " line " + Quote(line) + " is not \"name: value\"");
  }
  if (j != i && is_request_) {
    return Fail(ParseErrorCode::kWhitespaceBeforeColon,
                std::string(section) + " line " + Quote(line) +
                    " has whitespace between the field name and the colon");
  }
  const std::string_view value = TrimOws(line.substr(j + 1));
  if (!IsFieldValue(value)) {
    return Fail(ParseErrorCode::kBadHeader,
                std::string(section) + " field " + Quote(name) +
                    " has control characters (CR, NUL...) in its value");
  }
  fields.Add(std::string(name), std::string(value));
  return true;
}

Event MessageParser::Eof() {
  switch (state_) {
    case State::kError:
      return {EventType::kError, 0, {}};
    case State::kStartLine:
      if (!line_taken_ && !line_.empty()) break;
      state_ = State::kEnded;
      return {EventType::kEnd, 0, {}};
    case State::kMessageDone:
    case State::kTunnel:
    case State::kEnded:
      state_ = State::kEnded;
      return {EventType::kEnd, 0, {}};
    case State::kUntilClose:
      state_ = State::kEnded;
      return {EventType::kMessageComplete, 0, {}};
    case State::kFixedBody:
      if (remaining_ != 0) break;
      state_ = State::kEnded;
      return {EventType::kMessageComplete, 0, {}};
    default:
      break;
  }
  Fail(ParseErrorCode::kTruncated, "connection closed in the middle of a " +
                                       std::string(is_request_ ? "request" : "response") +
                                       " (after " + std::to_string(body_bytes_) + " body bytes)");
  return {EventType::kError, 0, {}};
}

// ---- RequestParser ----

bool RequestParser::OnStartLine(std::string_view line) {
  // method SP request-target SP HTTP-version (RFC 9112 §3), single spaces.
  const std::size_t sp1 = line.find(' ');
  const std::size_t sp2 = sp1 == std::string_view::npos ? sp1 : line.find(' ', sp1 + 1);
  if (sp2 == std::string_view::npos) {
    return Fail(ParseErrorCode::kBadStartLine,
                "request-line " + Quote(line) + " is not \"METHOD target HTTP/1.1\"");
  }
  const std::string_view method = line.substr(0, sp1);
  const std::string_view target = line.substr(sp1 + 1, sp2 - sp1 - 1);
  const std::string_view version = line.substr(sp2 + 1);
  const int minor = ParseVersion(version);
  if (minor == -1) {
    return Fail(ParseErrorCode::kVersionNotSupported,
                Quote(version) + " is not supported; this proxy speaks HTTP/1.0 and HTTP/1.1");
  }
  if (minor < 0 || !IsToken(method) || target.empty()) {
    return Fail(ParseErrorCode::kBadStartLine,
                "request-line " + Quote(line) + " is not \"METHOD target HTTP/1.1\"");
  }
  if (!IsTarget(target)) {
    return Fail(ParseErrorCode::kBadTarget,
                "request-target " + Quote(target) + " is empty or has bytes not allowed in a URL");
  }
  head_.method = std::string(method);
  head_.target = std::string(target);
  head_.version_minor = minor;

  // The form of the target (RFC 9112 §3.2) must match the method.
  if (method == "CONNECT") {
    Result<HostPort> hp = SplitAuthority(target, /*require_port=*/true);
    if (!hp.ok()) {
      return Fail(ParseErrorCode::kBadTarget, "CONNECT needs host:port: " + hp.status().message());
    }
    head_.target_form = TargetForm::kAuthority;
  } else if (target == "*") {
    if (method != "OPTIONS") {
      return Fail(ParseErrorCode::kBadTarget, "request-target \"*\" is only for OPTIONS");
    }
    head_.target_form = TargetForm::kAsterisk;
  } else if (target.front() == '/') {
    head_.target_form = TargetForm::kOrigin;
  } else {
    // absolute-form: scheme ":" ... (RFC 3986 §3.1); SplitAbsoluteUrl checks the rest.
    std::size_t i = 0;
    while (i < target.size() &&
           (IsAlpha(static_cast<unsigned char>(target[i])) ||
            (i > 0 && (IsDigit(static_cast<unsigned char>(target[i])) || target[i] == '+' ||
                       target[i] == '-' || target[i] == '.')))) {
      ++i;
    }
    if (i == 0 || i == target.size() || target[i] != ':') {
      return Fail(ParseErrorCode::kBadTarget,
                  "request-target " + Quote(target) +
                      " is neither \"/path\" nor an absolute URL (http://host/path)");
    }
    head_.target_form = TargetForm::kAbsolute;
  }
  return true;
}

bool RequestParser::OnHeadComplete() {
  const HeaderList& h = head_.headers;

  // Host (RFC 9112 §3.2): required in HTTP/1.1, at most one, and a valid authority.
  const std::size_t hosts = h.Count("Host");
  if (hosts > 1) return Fail(ParseErrorCode::kBadHost, "more than one Host field");
  if (hosts == 0 && head_.version_minor >= 1) {
    return Fail(ParseErrorCode::kBadHost, "an HTTP/1.1 request needs a Host field");
  }
  if (hosts == 1) {
    const std::string& host = *h.Find("Host");
    if (!host.empty()) {
      Result<HostPort> hp = SplitAuthority(host, /*require_port=*/false);
      if (!hp.ok()) return Fail(ParseErrorCode::kBadHost, "Host: " + hp.status().message());
    }
  }

  // Framing (RFC 9112 §6.1, §6.3).
  const TransferCodings te = ReadTransferCodings(h);
  const bool has_cl = h.Find("Content-Length") != nullptr;
  BodyFraming framing = BodyFraming::kNone;
  Bytes length = 0;
  if (te.present) {
    if (has_cl) {
      return Fail(ParseErrorCode::kConflictingFraming,
                  "request has both Transfer-Encoding and Content-Length (a request smuggling "
                  "pattern)");
    }
    if (head_.version_minor == 0) {
      return Fail(ParseErrorCode::kBadTransferEncoding, "Transfer-Encoding in an HTTP/1.0 request");
    }
    if (te.empty) return Fail(ParseErrorCode::kBadTransferEncoding, "Transfer-Encoding is empty");
    if (!te.chunked_last) {
      return Fail(ParseErrorCode::kBadTransferEncoding,
                  "Transfer-Encoding " + Quote(h.FindAll("Transfer-Encoding")) +
                      " does not end in chunked, so the body length is unknown");
    }
    if (te.chunked_not_last) {
      return Fail(ParseErrorCode::kBadTransferEncoding, "chunked is applied more than once");
    }
    if (!te.other.empty()) {
      return Fail(ParseErrorCode::kUnsupportedTransferCoding,
                  "transfer coding " + Quote(te.other) + " is not supported (only chunked)");
    }
    framing = BodyFraming::kChunked;
  } else if (has_cl) {
    std::string why;
    if (!ParseContentLength(h, &length, &why)) {
      return Fail(ParseErrorCode::kBadContentLength, why);
    }
    framing = BodyFraming::kContentLength;
  }
  const bool connect = head_.method == "CONNECT";
  if (connect && (framing == BodyFraming::kChunked || length != 0)) {
    // The bytes after a CONNECT belong to the tunnel; a body would make them ambiguous.
    return Fail(ParseErrorCode::kConflictingFraming, "a CONNECT request cannot have a body");
  }
  head_.framing = framing;
  head_.content_length = length;
  head_.keep_alive = !connect && WantsKeepAlive(head_.version_minor, h);
  SetFraming(framing, length, /*tunnel_after=*/connect);
  return true;
}

// ---- ResponseParser ----

void ResponseParser::SetRequestMethod(std::string_view method) {
  head_request_ = method == "HEAD";
  connect_request_ = method == "CONNECT";
}

bool ResponseParser::OnStartLine(std::string_view line) {
  // HTTP-version SP status-code SP [ reason-phrase ] (RFC 9112 §4); the SP before an empty
  // reason is optional, as some servers leave it out.
  const std::size_t sp = line.find(' ');
  const int minor = ParseVersion(line.substr(0, sp));
  if (minor == -1) {
    return Fail(ParseErrorCode::kVersionNotSupported,
                "origin answered in " + Quote(line.substr(0, sp)) + ", not HTTP/1.x");
  }
  const std::string_view rest = sp == std::string_view::npos ? "" : line.substr(sp + 1);
  if (minor < 0 || rest.size() < 3 || !IsDigit(rest[0]) || !IsDigit(rest[1]) || !IsDigit(rest[2]) ||
      (rest.size() > 3 && rest[3] != ' ')) {
    return Fail(ParseErrorCode::kBadStartLine,
                "status-line " + Quote(line) + " is not \"HTTP/1.1 200 reason\"");
  }
  const int status = (rest[0] - '0') * 100 + (rest[1] - '0') * 10 + (rest[2] - '0');
  if (status < 100 || status > 599) {
    return Fail(ParseErrorCode::kBadStartLine,
                "status " + std::to_string(status) + " is not in 100..599");
  }
  const std::string_view reason = rest.size() > 3 ? rest.substr(4) : std::string_view();
  if (!IsFieldValue(reason)) {
    return Fail(ParseErrorCode::kBadStartLine,
                "status-line " + Quote(line) + " has control characters in its reason");
  }
  head_.version_minor = minor;
  head_.status = status;
  head_.reason = std::string(reason);
  return true;
}

bool ResponseParser::OnHeadComplete() {
  const HeaderList& h = head_.headers;
  const int status = head_.status;
  // No body (RFC 9112 §6.3 items 1 and 2), whatever the fields say.
  const bool tunnel = status == 101 || (connect_request_ && status >= 200 && status < 300);
  if (tunnel || head_request_ || status < 200 || status == 204 || status == 304) {
    head_.framing = BodyFraming::kNone;
    head_.keep_alive = !tunnel && WantsKeepAlive(head_.version_minor, h);
    SetFraming(BodyFraming::kNone, 0, tunnel);
    return true;
  }
  const TransferCodings te = ReadTransferCodings(h);
  const bool has_cl = h.Find("Content-Length") != nullptr;
  BodyFraming framing = BodyFraming::kUntilClose;
  Bytes length = 0;
  if (te.present) {
    if (has_cl) {
      return Fail(ParseErrorCode::kConflictingFraming,
                  "origin response has both Transfer-Encoding and Content-Length");
    }
    if (head_.version_minor == 0) {
      return Fail(ParseErrorCode::kBadTransferEncoding,
                  "Transfer-Encoding in an HTTP/1.0 response");
    }
    if (te.chunked_not_last) {
      return Fail(ParseErrorCode::kBadTransferEncoding, "Transfer-Encoding " +
                                                            Quote(h.FindAll("Transfer-Encoding")) +
                                                            " applies a coding after chunked");
    }
    // chunked last: chunked framing (other codings stay in the body for the client);
    // otherwise the body runs until close (§6.3 item 4).
    if (te.chunked_last) framing = BodyFraming::kChunked;
  } else if (has_cl) {
    std::string why;
    if (!ParseContentLength(h, &length, &why)) {
      return Fail(ParseErrorCode::kBadContentLength, "origin response: " + why);
    }
    framing = BodyFraming::kContentLength;
  }
  head_.framing = framing;
  head_.content_length = length;
  head_.keep_alive = framing != BodyFraming::kUntilClose && WantsKeepAlive(head_.version_minor, h);
  SetFraming(framing, length, /*tunnel_after=*/false);
  return true;
}

// ---- Serializers ----

Status AppendRequestHead(const RequestHead& head, std::string* out) {
  const std::size_t old = out->size();
  if (!IsToken(head.method) || !IsTarget(head.target) || head.version_minor < 0 ||
      head.version_minor > 9) {
    return Status::InvalidArgument("request-line " + Quote(head.method + " " + head.target) +
                                   " cannot be sent (not a token, or a bad target)");
  }
  out->append(head.method);
  out->push_back(' ');
  out->append(head.target);
  out->append(" HTTP/1.");
  out->push_back(static_cast<char>('0' + head.version_minor));
  out->append("\r\n");
  if (!AppendFields(head.headers, out)) {
    out->resize(old);
    return Status::InvalidArgument(
        "a header field of the request cannot be sent (name not a "
        "token, or CR/LF/control bytes in a value)");
  }
  return Status::Ok();
}

Status AppendResponseHead(const ResponseHead& head, std::string* out) {
  const std::size_t old = out->size();
  if (head.status < 100 || head.status > 999 || !IsFieldValue(head.reason) ||
      head.version_minor < 0 || head.version_minor > 9) {
    return Status::InvalidArgument("status-line with status " + std::to_string(head.status) +
                                   " and reason " + Quote(head.reason) + " cannot be sent");
  }
  out->append("HTTP/1.");
  out->push_back(static_cast<char>('0' + head.version_minor));
  out->push_back(' ');
  out->append(std::to_string(head.status));
  out->push_back(' ');
  out->append(head.reason.empty() ? ReasonPhrase(head.status) : std::string_view(head.reason));
  out->append("\r\n");
  if (!AppendFields(head.headers, out)) {
    out->resize(old);
    return Status::InvalidArgument(
        "a header field of the response cannot be sent (name not a "
        "token, or CR/LF/control bytes in a value)");
  }
  return Status::Ok();
}

void AppendChunkHeader(Bytes size, std::string* out) {
  assert(size > 0 && "a chunk of 0 bytes is the last chunk");
  static constexpr char kHex[] = "0123456789abcdef";
  char digits[16];
  int n = 0;
  do {
    digits[n++] = kHex[size & 15];
    size >>= 4;
  } while (size != 0);
  while (n > 0) out->push_back(digits[--n]);
  out->append("\r\n");
}

void AppendChunk(std::string_view data, std::string* out) {
  if (data.empty()) return;
  AppendChunkHeader(data.size(), out);
  out->append(data);
  out->append("\r\n");
}

Status AppendLastChunk(const HeaderList& trailers, std::string* out) {
  const std::size_t old = out->size();
  out->append("0\r\n");
  if (!AppendFields(trailers, out)) {
    out->resize(old);
    return Status::InvalidArgument(
        "a trailer field cannot be sent (name not a token, or "
        "CR/LF/control bytes in a value)");
  }
  return Status::Ok();
}

}  // namespace ghost::http1
