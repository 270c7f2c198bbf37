// smtp_wire: what the SMTP submission listener (proxy/smtp_proxy.h) parses of its clients
// (RFC 5321 §4.1, RFC 4954 AUTH, RFC 4616 PLAIN): command lines, the paths of MAIL FROM and
// RCPT TO, the base64 of AUTH, and the message of DATA with its dot-stuffing undone, streamed
// with bounded memory per line.
//
// Pure (no I/O), so tests/fuzz/smtp_proxy_fuzz.cc runs it. Thread-safety: a DataReader is a value
// used by one thread; the functions are reentrant.
#ifndef GHOST_PROXY_SMTP_WIRE_H_
#define GHOST_PROXY_SMTP_WIRE_H_

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

namespace ghost::smtpwire {

// "MAIL FROM:<a@b> SIZE=9" -> verb "MAIL", arg "FROM:<a@b> SIZE=9". nullopt for an empty line
// or a verb that is not letters.
struct Command {
  std::string verb;  // upper case
  std::string arg;
};
std::optional<Command> ParseCommand(std::string_view line);

// The path of "FROM:<path> params" / "TO:<path> params" (`prefix` "FROM:" or "TO:",
// case-insensitive; a space after the colon tolerated). "" for the null path <>. nullopt when
// malformed (no angle brackets, unbalanced, control characters, bytes that are not UTF-8,
// over 512 bytes).
std::optional<std::string> ParsePath(std::string_view arg, std::string_view prefix);

// Well-formed UTF-8 (no overlong forms, surrogates or code points past U+10FFFF). The outbox
// keeps addresses and users in JSON, which holds nothing else (common/imap/outbox.h).
bool IsUtf8(std::string_view text);

// Base64 (RFC 4648) to bytes; nullopt when malformed or over 16 KiB.
std::optional<std::string> Base64Decode(std::string_view text);
// AUTH PLAIN's response: (authcid, password); authzid, if given, must equal authcid.
std::optional<std::pair<std::string, std::string>> PlainCredentials(std::string_view base64);

// The message of DATA: lines up to the lone ".", dot-stuffing removed (RFC 5321 §4.5.2).
class DataReader {
 public:
  explicit DataReader(std::size_t max_line) : max_line_(max_line) {}
  // Consumes a prefix of `in`, appending message bytes to *out (CRLF line ends kept). Stops
  // after the end-of-data line (done()) or on a line over max_line (error()).
  std::size_t Feed(std::string_view in, std::string* out);
  bool done() const { return done_; }
  bool error() const { return error_; }

 private:
  std::size_t max_line_;
  std::string line_;
  bool done_ = false, error_ = false;
};

}  // namespace ghost::smtpwire

#endif  // GHOST_PROXY_SMTP_WIRE_H_
