// libFuzzer target for the IMAP response parser (common/imap/imap_client_internal.h). Built and
// run by tests/fuzz/fuzz.sh.
//
// The input is read as a server's byte stream the way ImapClient::OnLine frames it: CRLF (or
// LF) lines; a line ending in a literal announcement {n} or {n+} is followed by n bytes of
// literal and the rest of the response. Every response is parsed (ParseResponse) and every
// prefix before a literal analysed (AnalyzeFetchPrefix); each line also goes to the small
// parsers (UID sets, flags, internal dates). Checked: no crash, no uncaught exception, no
// sanitizer report; an internal date that parses formats and parses back to itself; a string
// quoted for a command (AppendString) parses back from a FETCH response to the same bytes.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "common/imap/imap_client_internal.h"

namespace ghost::imap {
namespace {

void Check(bool ok, const char* what, std::string_view detail) {
  if (ok) return;
  std::fprintf(stderr, "imap_fuzz: %s\n%.*s\n", what, static_cast<int>(detail.size()),
               detail.data());
  std::abort();
}

bool EqualsUpper(std::string_view word, std::string_view upper) {
  if (word.size() != upper.size()) return false;
  for (std::size_t i = 0; i < word.size(); ++i) {
    char c = word[i];
    if (c >= 'a' && c <= 'z') c = static_cast<char>(c - 'a' + 'A');
    if (c != upper[i]) return false;
  }
  return true;
}

// ImapClient::IsStatusLine: "<tag> OK|NO|BAD|BYE|PREAUTH ..." may end in "{5}" without a
// literal.
bool IsStatusLine(std::string_view line) {
  const std::size_t sp = line.find(' ');
  if (sp == std::string_view::npos) return false;
  std::string_view rest = line.substr(sp + 1);
  const std::string_view word = rest.substr(0, rest.find(' '));
  for (std::string_view s : {"OK", "NO", "BAD", "BYE", "PREAUTH"})
    if (EqualsUpper(word, s)) return true;
  return false;
}

// Frames `in` into responses and parses each; returns the parsed ones. With
// `stream_odd_literals`, literals of odd length arrive empty, as streamed ones do.
std::vector<Response> Parse(std::string_view in, bool stream_odd_literals) {
  std::vector<Response> out;
  std::vector<Segment> segments;
  std::size_t pos = 0;
  while (pos < in.size()) {
    std::size_t nl = in.find('\n', pos);
    if (nl == std::string_view::npos) break;  // an unfinished line waits for more
    std::string_view line = in.substr(pos, nl - pos);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    pos = nl + 1;
    const bool first = segments.empty();
    if (first && !line.empty() && line[0] == '+') {
      if (Result<Response> r = ParseResponse({Segment{std::string(line), false, false}}); r.ok())
        out.push_back(*r);
      continue;
    }
    bool bad = false;
    std::optional<std::uint64_t> literal;
    if (!(first && IsStatusLine(line))) literal = TrailingLiteral(line, &bad);
    if (bad) break;  // the client fails the connection
    segments.push_back(Segment{std::string(line), false, false});
    if (!literal) {
      Result<Response> r = ParseResponse(segments);
      if (r.ok()) {
        out.push_back(*r);
      } else {
        Check(!r.status().message().empty(), "an error without a message", line);
      }
      segments.clear();
      continue;
    }
    const FetchPrefix fp = AnalyzeFetchPrefix(segments);
    Check(!fp.uid || *fp.uid > 0, "a FETCH prefix with UID 0", line);
    if (*literal > in.size() - pos) break;  // the literal has not all arrived
    Segment lit;
    lit.literal = true;
    // Literals the client streams elsewhere (bodies) arrive empty: both kinds must parse.
    lit.streamed = stream_odd_literals && (*literal % 2) == 1;
    if (!lit.streamed) lit.bytes = std::string(in.substr(pos, *literal));
    segments.push_back(std::move(lit));
    pos += *literal;
  }
  return out;
}

void SmallParsers(std::string_view line) {
  (void)IsValidFlag(line);
  if (IsValidUidSet(line)) {
    (void)ExpandUidSet(line, 4096);
    (void)UidSetContains(line, 1);
    (void)UidSetContains(line, 0xffffffffu);
  }
  if (std::optional<std::int64_t> t = ParseInternalDate(line)) {
    const std::string formatted = FormatInternalDate(*t);
    const std::optional<std::int64_t> back = ParseInternalDate(formatted);
    Check(back && *back == *t, "an internal date does not round-trip", formatted);
  }
}

// AppendString must quote any bytes so that the server's echo parses back to them.
void QuotedRoundTrip(std::string_view s) {
  if (s.find('\0') != std::string_view::npos) return;  // IMAP strings cannot hold NUL
  for (const bool plus : {false, true}) {
    std::vector<std::string> parts{"* 1 FETCH (UID 7 X "};
    AppendString(s, plus, &parts);
    std::string wire;
    for (const std::string& p : parts) wire += p;  // a literal's "{n}\r\n" is already there
    wire += ")\r\n";
    const std::vector<Response> r = Parse(wire, false);
    Check(r.size() == 1 && r[0].data.size() == 1 && r[0].data[0].items.size() == 4 &&
              r[0].data[0].items[3].text == s,
          "a string quoted by AppendString does not parse back", wire);
  }
}

}  // namespace
}  // namespace ghost::imap

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace ghost::imap;
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  for (const Response& r : Parse(in, true)) {
    for (const Token& t : r.data) {
      (void)t.Number();
      (void)t.IsAtom("FETCH");
    }
  }
  std::size_t pos = 0;
  for (int n = 0; pos < in.size() && n < 32; ++n) {
    std::size_t nl = in.find('\n', pos);
    if (nl == std::string_view::npos) nl = in.size();
    SmallParsers(in.substr(pos, nl - pos));
    pos = nl + 1;
  }
  if (size <= 256) QuotedRoundTrip(in);
  return 0;
}
