#include "common/sim/trace.h"

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <istream>
#include <limits>
#include <ostream>
#include <set>
#include <system_error>
#include <unordered_map>
#include <utility>

namespace ghost {
namespace {

// Limits that keep every later computation in range: times fit a TimePoint with room to add
// durations, sizes can be summed over millions of events, and a sector's byte offset fits in
// 64 bits.
constexpr double kMaxTimeSeconds = 1e9;                       // ~31 years
constexpr Bytes kMaxSize = Bytes{1} << 48;                    // 256 TiB
constexpr std::uint64_t kMaxSector = std::uint64_t{1} << 55;  // 2^55 * 512 = 2^64 bytes

constexpr std::string_view kHeaderForm = "\"# ghost-trace <web|mail|block> v1\"";
constexpr std::string_view kWebForm = "<time> GET <absolute-url> <size> <cached 0|1>";
constexpr std::string_view kMailForm =
    "<time> READ <mailbox> <uid> <size> or <time> SEND <mailbox> - <size>";
constexpr std::string_view kMailReadForm = "<time> READ <mailbox> <uid> <size>";
constexpr std::string_view kMailSendForm = "<time> SEND <mailbox> - <size>";
constexpr std::string_view kBlockForm = "<time> <R|W> <sector> <sectors>";

// A token as it appears in a message: quoted, and cut short so a message stays one line.
std::string Quote(std::string_view token) {
  constexpr std::size_t kMaxShown = 48;
  std::string q = "\"";
  if (token.size() > kMaxShown) {
    q.append(token.substr(0, kMaxShown));
    q.append("...");
  } else {
    q.append(token);
  }
  q.push_back('"');
  return q;
}

// Seconds with three decimals when the time is a whole millisecond, else six.
std::string FormatSeconds(Duration d) {
  const std::int64_t us = d.count();
  const std::uint64_t mag =
      us < 0 ? std::uint64_t{0} - static_cast<std::uint64_t>(us) : static_cast<std::uint64_t>(us);
  std::string s = us < 0 ? "-" : "";
  s += std::to_string(mag / 1'000'000);
  std::uint64_t frac = mag % 1'000'000;
  int digits = 6;
  if (frac % 1000 == 0) {
    frac /= 1000;
    digits = 3;
  }
  std::string f = std::to_string(frac);
  s += '.';
  s.append(static_cast<std::size_t>(digits) - f.size(), '0');
  s += f;
  return s;
}

enum class NumberError { kOk, kNotANumber, kNegative, kTooLarge };

// Parses a whole token as an unsigned decimal integer no larger than `max`.
template <typename T>
NumberError ParseUnsigned(std::string_view token, T max, T* out) {
  const char* begin = token.data();
  const char* end = begin + token.size();
  if (!token.empty() && token.front() == '-') {
    // Tell "-5" (a negative number) from "-x" (not a number at all).
    std::uint64_t ignored = 0;
    auto [ptr, ec] = std::from_chars(begin + 1, end, ignored);
    bool integer = ptr == end && ptr != begin + 1 &&
                   (ec == std::errc() || ec == std::errc::result_out_of_range);
    return integer ? NumberError::kNegative : NumberError::kNotANumber;
  }
  T value{};
  auto [ptr, ec] = std::from_chars(begin, end, value);
  if (ptr != end || token.empty()) return NumberError::kNotANumber;
  if (ec == std::errc::result_out_of_range) return NumberError::kTooLarge;
  if (ec != std::errc()) return NumberError::kNotANumber;
  if (value > max) return NumberError::kTooLarge;
  *out = value;
  return NumberError::kOk;
}

char ToLowerAscii(char c) { return c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c; }

bool EqualsIgnoreCase(std::string_view a, std::string_view b) {
  return std::equal(a.begin(), a.end(), b.begin(), b.end(),
                    [](char x, char y) { return ToLowerAscii(x) == ToLowerAscii(y); });
}

// Checks that `url` is an absolute http or https URL (RFC 3986 §3: scheme "://" authority,
// with a non-empty host and an optional numeric port). Returns what is wrong, or "".
std::string CheckUrl(std::string_view url) {
  std::size_t scheme_end = url.find("://");
  std::string_view scheme = scheme_end == std::string_view::npos ? "" : url.substr(0, scheme_end);
  if (!EqualsIgnoreCase(scheme, "http") && !EqualsIgnoreCase(scheme, "https")) {
    return "is not an absolute http or https URL";
  }
  for (char c : url) {
    if (static_cast<unsigned char>(c) > 0x7e) return "has a non-ASCII byte (percent-encode it)";
  }
  std::string_view rest = url.substr(scheme_end + 3);
  std::string_view authority = rest.substr(0, rest.find_first_of("/?"));
  if (std::size_t at = authority.rfind('@'); at != std::string_view::npos) {
    authority.remove_prefix(at + 1);  // drop userinfo
  }
  std::string_view host = authority;
  std::string_view port;
  if (!authority.empty() && authority.front() == '[') {  // IPv6 literal
    std::size_t close = authority.find(']');
    if (close == std::string_view::npos) return "has an unterminated IPv6 address";
    host = authority.substr(0, close + 1);
    std::string_view after = authority.substr(close + 1);
    if (!after.empty() && after.front() != ':') return "has garbage after its IPv6 address";
    if (!after.empty()) port = after.substr(1);
  } else if (std::size_t colon = authority.find(':'); colon != std::string_view::npos) {
    host = authority.substr(0, colon);
    port = authority.substr(colon + 1);
  }
  if (host.empty() || host == "[]") return "has no host";
  if (!port.empty()) {
    std::uint32_t p = 0;
    if (ParseUnsigned<std::uint32_t>(port, 65535, &p) != NumberError::kOk) {
      return "has a port that is not a number from 0 to 65535";
    }
  }
  return "";
}

// Parses one trace; each method returns OK or the error for the current line.
class Parser {
 public:
  Parser(std::istream& in, const std::string& name) : in_(in), name_(name) {}

  Result<Trace> Run() {
    Trace trace;
    trace.name = name_;
    bool have_header = false;
    std::string raw;
    while (std::getline(in_, raw)) {
      ++line_;
      std::string_view text = raw;
      if (line_ == 1 && text.substr(0, 3) == "\xEF\xBB\xBF") text.remove_prefix(3);  // UTF-8 BOM
      if (!text.empty() && text.back() == '\r') text.remove_suffix(1);
      if (!have_header) {
        if (IsBlank(text)) continue;
        Status s = ParseHeader(text, &trace.kind);
        if (!s.ok()) return s;
        have_header = true;
        continue;
      }
      std::string_view data = text.substr(0, text.find('#'));
      if (Status s = CheckCharacters(data); !s.ok()) return s;
      Split(data);
      if (fields_.empty()) continue;
      Status s = ParseEvent(&trace);
      if (!s.ok()) return s;
    }
    if (in_.bad())
      return Status::IoError(name_ + ": reading the trace failed after line " +
                             std::to_string(line_));
    if (!have_header) {
      line_ = std::max<std::size_t>(line_, 1);
      return Error("the trace is empty",
                   "the first line must be the header " + std::string(kHeaderForm));
    }
    return trace;
  }

 private:
  Status Error(const std::string& what, const std::string& expected) const {
    return Status::InvalidArgument(name_ + ":" + std::to_string(line_) + ": " + what + " (" +
                                   expected + ")");
  }

  static bool IsBlank(std::string_view text) {
    return text.find_first_not_of(" \t") == std::string_view::npos;
  }

  void Split(std::string_view data) {
    fields_.clear();
    std::size_t pos = 0;
    while (true) {
      pos = data.find_first_not_of(" \t", pos);
      if (pos == std::string_view::npos) break;
      std::size_t end = data.find_first_of(" \t", pos);
      if (end == std::string_view::npos) end = data.size();
      fields_.push_back(data.substr(pos, end - pos));
      pos = end;
    }
  }

  Status CheckCharacters(std::string_view data) const {
    for (char c : data) {
      auto u = static_cast<unsigned char>(c);
      if ((u < 0x20 && c != '\t') || u == 0x7f) {
        static constexpr char kHex[] = "0123456789abcdef";
        std::string code = "0x";
        code += kHex[u >> 4];
        code += kHex[u & 0xf];
        return Error("control character " + code + " in the line",
                     "fields are printable text separated by spaces or tabs");
      }
    }
    return Status::Ok();
  }

  Status ParseHeader(std::string_view text, TraceKind* kind) {
    std::size_t start = text.find_first_not_of(" \t");
    if (text[start] != '#') {
      return Error("missing header", "the first line must be " + std::string(kHeaderForm));
    }
    std::string_view rest = text.substr(start + 1);
    Split(rest.substr(0, rest.find('#')));
    if (fields_.empty() || fields_[0] != "ghost-trace") {
      return Error("missing header", "the first line must be " + std::string(kHeaderForm));
    }
    if (fields_.size() < 3) {
      return Error("incomplete header", "expected " + std::string(kHeaderForm));
    }
    if (fields_[1] == "web") {
      *kind = TraceKind::kWeb;
    } else if (fields_[1] == "mail") {
      *kind = TraceKind::kMail;
    } else if (fields_[1] == "block") {
      *kind = TraceKind::kBlock;
    } else {
      return Error("unknown trace kind " + Quote(fields_[1]), "expected web, mail or block");
    }
    if (fields_[2] != "v1") {
      return Error("unsupported version " + Quote(fields_[2]) + " of the " + TraceKindName(*kind) +
                       " format",
                   "this reader knows v1");
    }
    if (fields_.size() > 3) {
      return Error("trailing garbage " + Quote(fields_[3]) + " after the header",
                   "expected " + std::string(kHeaderForm));
    }
    return Status::Ok();
  }

  // Checks the field count once the operation is known.
  Status CheckFieldCount(std::size_t want, std::string_view form) const {
    if (fields_.size() < want) {
      return Error("too few fields: found " + std::to_string(fields_.size()) + ", need " +
                       std::to_string(want),
                   "expected " + std::string(form));
    }
    if (fields_.size() > want) {
      return Error("trailing garbage " + Quote(fields_[want]) + " after the last field",
                   "expected " + std::string(form));
    }
    return Status::Ok();
  }

  Status ParseTime(std::string_view token, std::string_view form, TimePoint* out) {
    double seconds = 0;
    auto [ptr, ec] = std::from_chars(token.data(), token.data() + token.size(), seconds,
                                     std::chars_format::general);
    if (ptr != token.data() + token.size() ||
        (ec != std::errc() && ec != std::errc::result_out_of_range)) {
      return Error("time " + Quote(token) + " is not a number of seconds",
                   "expected " + std::string(form));
    }
    if (ec == std::errc::result_out_of_range) {
      return Error("time " + Quote(token) + " is out of range",
                   "expected seconds from 0 to " + FormatSeconds(Seconds(kMaxTimeSeconds)));
    }
    if (!std::isfinite(seconds)) {
      return Error("time " + Quote(token) + " is not a finite number",
                   "expected seconds from the trace start");
    }
    if (seconds < 0) {
      return Error("time " + Quote(token) + " is negative",
                   "expected seconds from the trace start, 0 or more");
    }
    if (seconds > kMaxTimeSeconds) {
      return Error("time " + Quote(token) + " is too large",
                   "expected at most " + FormatSeconds(Seconds(kMaxTimeSeconds)) + " seconds");
    }
    TimePoint t(Duration(std::llround(seconds * 1e6)));
    if (have_previous_ && t < previous_time_) {
      return Error("time " + Quote(token) + " is before the previous event's time " +
                       FormatSeconds(previous_time_.time_since_epoch()) + " on line " +
                       std::to_string(previous_line_),
                   "times must not decrease");
    }
    have_previous_ = true;
    previous_time_ = t;
    previous_line_ = line_;
    *out = t;
    return Status::Ok();
  }

  Status ParseSize(std::string_view token, std::string_view form, Bytes* out) const {
    switch (ParseUnsigned<Bytes>(token, kMaxSize, out)) {
      case NumberError::kOk:
        return Status::Ok();
      case NumberError::kNegative:
        return Error("size " + Quote(token) + " is negative", "expected a number of bytes");
      case NumberError::kTooLarge:
        return Error("size " + Quote(token) + " is too large",
                     "expected at most " + std::to_string(kMaxSize) + " bytes");
      case NumberError::kNotANumber:
        break;
    }
    return Error("size " + Quote(token) + " is not a number of bytes",
                 "expected a non-negative integer: " + std::string(form));
  }

  Status ParseEvent(Trace* trace) {
    std::string_view form = trace->kind == TraceKind::kWeb    ? kWebForm
                            : trace->kind == TraceKind::kMail ? kMailForm
                                                              : kBlockForm;
    if (fields_.size() < 2) {
      return Error("too few fields: found " + std::to_string(fields_.size()),
                   "expected " + std::string(form));
    }
    TimePoint time;
    if (Status s = ParseTime(fields_[0], form, &time); !s.ok()) return s;
    switch (trace->kind) {
      case TraceKind::kWeb:
        return ParseWeb(time, trace);
      case TraceKind::kMail:
        return ParseMail(time, trace);
      case TraceKind::kBlock:
        return ParseBlock(time, trace);
    }
    return Status::Internal("unknown trace kind");
  }

  Status ParseWeb(TimePoint time, Trace* trace) {
    if (fields_[1] != "GET") {
      return Error("unknown operation " + Quote(fields_[1]),
                   "expected GET: " + std::string(kWebForm));
    }
    if (Status s = CheckFieldCount(5, kWebForm); !s.ok()) return s;
    WebRequest r;
    r.time = time;
    r.url = std::string(fields_[2]);
    if (std::string why = CheckUrl(fields_[2]); !why.empty()) {
      return Error("url " + Quote(fields_[2]) + " " + why,
                   "expected an absolute URL such as http://host/path");
    }
    if (Status s = ParseSize(fields_[3], kWebForm, &r.size); !s.ok()) return s;
    if (fields_[4] != "0" && fields_[4] != "1") {
      return Error("cached flag " + Quote(fields_[4]) + " is not 0 or 1",
                   "expected 1 if the object is cached when the trace starts, else 0");
    }
    r.cached = fields_[4] == "1";
    auto [it, inserted] = cached_by_url_.try_emplace(r.url, r.cached, line_);
    if (!inserted && it->second.first != r.cached) {
      return Error("cached flag " + std::string(fields_[4]) + " contradicts line " +
                       std::to_string(it->second.second) + " for the same url",
                   "the flag says whether the object is cached when the trace starts, so it "
                   "must be the same on every request of a url");
    }
    trace->web.push_back(std::move(r));
    return Status::Ok();
  }

  Status ParseMail(TimePoint time, Trace* trace) {
    MailEvent e;
    e.time = time;
    std::string_view form;
    if (fields_[1] == "READ") {
      e.op = MailEvent::Op::kRead;
      form = kMailReadForm;
    } else if (fields_[1] == "SEND") {
      e.op = MailEvent::Op::kSend;
      form = kMailSendForm;
    } else {
      return Error("unknown operation " + Quote(fields_[1]), "expected READ or SEND");
    }
    if (Status s = CheckFieldCount(5, form); !s.ok()) return s;
    e.mailbox = std::string(fields_[2]);
    std::string_view uid = fields_[3];
    if (e.op == MailEvent::Op::kRead) {
      NumberError err =
          ParseUnsigned<std::uint32_t>(uid, std::numeric_limits<std::uint32_t>::max(), &e.uid);
      if (err == NumberError::kTooLarge) {
        return Error("uid " + Quote(uid) + " is too large",
                     "IMAP uids are positive 32-bit integers");
      }
      if (err != NumberError::kOk || e.uid == 0) {
        return Error("uid " + Quote(uid) + " is not a positive integer",
                     "READ names the message read: " + std::string(form));
      }
    } else if (uid != "-") {
      return Error("SEND has uid " + Quote(uid),
                   "a sent message has no uid yet, write \"-\": " + std::string(form));
    }
    if (Status s = ParseSize(fields_[4], form, &e.size); !s.ok()) return s;
    trace->mail.push_back(std::move(e));
    return Status::Ok();
  }

  Status ParseBlock(TimePoint time, Trace* trace) {
    BlockEvent e;
    e.time = time;
    if (fields_[1] == "R" || fields_[1] == "W") {
      e.write = fields_[1] == "W";
    } else {
      return Error("unknown operation " + Quote(fields_[1]), "expected R or W");
    }
    if (Status s = CheckFieldCount(4, kBlockForm); !s.ok()) return s;
    switch (ParseUnsigned<std::uint64_t>(fields_[2], kMaxSector - 1, &e.sector)) {
      case NumberError::kOk:
        break;
      case NumberError::kTooLarge:
        return Error("sector " + Quote(fields_[2]) + " is too large",
                     "expected a sector below 2^55 (a 64-bit byte offset)");
      default:
        return Error("sector " + Quote(fields_[2]) + " is not a non-negative integer",
                     "expected " + std::string(kBlockForm));
    }
    NumberError err = ParseUnsigned<std::uint32_t>(
        fields_[3], std::numeric_limits<std::uint32_t>::max(), &e.sectors);
    if (err == NumberError::kTooLarge) {
      return Error("sectors " + Quote(fields_[3]) + " is too large",
                   "expected a 32-bit count of sectors");
    }
    if (err != NumberError::kOk || e.sectors == 0) {
      return Error("sectors " + Quote(fields_[3]) + " is not a positive integer",
                   "expected the number of 512-byte sectors, 1 or more");
    }
    if (e.sectors > kMaxSector - e.sector) {
      return Error("the range of " + std::string(fields_[3]) + " sectors at " +
                       std::string(fields_[2]) + " runs past sector 2^55",
                   "expected a range whose byte offsets fit in 64 bits");
    }
    trace->block.push_back(e);
    return Status::Ok();
  }

  std::istream& in_;
  const std::string& name_;
  std::size_t line_ = 0;
  std::vector<std::string_view> fields_;  // views into the current line
  bool have_previous_ = false;
  TimePoint previous_time_;
  std::size_t previous_line_ = 0;
  std::unordered_map<std::string, std::pair<bool, std::size_t>> cached_by_url_;  // flag, line
};

Bytes AddSaturating(Bytes a, Bytes b) {
  return a > std::numeric_limits<Bytes>::max() - b ? std::numeric_limits<Bytes>::max() : a + b;
}

}  // namespace

const char* TraceKindName(TraceKind kind) {
  switch (kind) {
    case TraceKind::kWeb:
      return "web";
    case TraceKind::kMail:
      return "mail";
    case TraceKind::kBlock:
      return "block";
  }
  return "unknown";
}

Result<Trace> ParseTrace(std::istream& in, const std::string& name) {
  return Parser(in, name).Run();
}

Result<Trace> LoadTrace(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    return Status::InvalidArgument(path + ": is a directory (expected a trace file)");
  }
  std::ifstream in(path, std::ios::binary);
  if (!in.is_open()) {
    int err = errno != 0 ? errno : ENOENT;
    return Status::FromErrno(err, "open trace " + path);
  }
  return ParseTrace(in, path);
}

void WriteTrace(const Trace& t, std::ostream& out, std::string_view comment) {
  out << "# ghost-trace " << TraceKindName(t.kind) << " v1\n";
  while (!comment.empty()) {
    std::size_t nl = comment.find('\n');
    out << "# " << comment.substr(0, nl) << '\n';
    comment.remove_prefix(nl == std::string_view::npos ? comment.size() : nl + 1);
  }
  switch (t.kind) {
    case TraceKind::kWeb:
      for (const WebRequest& r : t.web) {
        out << FormatSeconds(r.time.time_since_epoch()) << " GET " << r.url << ' ' << r.size << ' '
            << (r.cached ? 1 : 0) << '\n';
      }
      break;
    case TraceKind::kMail:
      for (const MailEvent& e : t.mail) {
        out << FormatSeconds(e.time.time_since_epoch());
        if (e.op == MailEvent::Op::kRead) {
          out << " READ " << e.mailbox << ' ' << e.uid;
        } else {
          out << " SEND " << e.mailbox << " -";
        }
        out << ' ' << e.size << '\n';
      }
      break;
    case TraceKind::kBlock:
      for (const BlockEvent& e : t.block) {
        out << FormatSeconds(e.time.time_since_epoch()) << (e.write ? " W " : " R ") << e.sector
            << ' ' << e.sectors << '\n';
      }
      break;
  }
}

TraceSummary SummarizeTrace(const Trace& t) {
  TraceSummary s;
  auto note_time = [&s](TimePoint time) {
    s.duration = std::max(s.duration, time.time_since_epoch());
  };
  switch (t.kind) {
    case TraceKind::kWeb: {
      std::unordered_map<std::string_view, bool> cached;
      for (const WebRequest& r : t.web) {
        note_time(r.time);
        cached.emplace(r.url, r.cached);
        s.bytes = AddSaturating(s.bytes, r.size);
      }
      s.events = s.reads = t.web.size();
      s.unique_objects = cached.size();
      s.cached_objects = static_cast<std::size_t>(
          std::count_if(cached.begin(), cached.end(), [](const auto& kv) { return kv.second; }));
      break;
    }
    case TraceKind::kMail: {
      std::set<std::pair<std::string_view, std::uint32_t>> read;
      for (const MailEvent& e : t.mail) {
        note_time(e.time);
        s.bytes = AddSaturating(s.bytes, e.size);
        if (e.op == MailEvent::Op::kRead) {
          ++s.reads;
          read.emplace(e.mailbox, e.uid);
        } else {
          ++s.writes;
        }
      }
      s.events = t.mail.size();
      s.unique_objects = read.size() + s.writes;
      break;
    }
    case TraceKind::kBlock: {
      std::vector<std::pair<std::uint64_t, std::uint64_t>> ranges;  // [first, end)
      ranges.reserve(t.block.size());
      for (const BlockEvent& e : t.block) {
        note_time(e.time);
        s.bytes = AddSaturating(s.bytes, Bytes{e.sectors} * kSectorSize);
        ++(e.write ? s.writes : s.reads);
        ranges.emplace_back(e.sector, e.sector + e.sectors);
      }
      std::sort(ranges.begin(), ranges.end());
      std::uint64_t covered_to = 0;
      for (const auto& [first, end] : ranges) {
        std::uint64_t from = std::max(first, covered_to);
        if (end > from) s.unique_objects += end - from;
        covered_to = std::max(covered_to, end);
      }
      s.events = t.block.size();
      break;
    }
  }
  return s;
}

}  // namespace ghost
