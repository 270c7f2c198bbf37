// The IMAP4rev1 syntax under ImapClient (RFC 3501 §9): the response tokenizer and parser,
// and the encoders for command arguments. Internal to common/imap/imap_client.cc and its tests;
// other components use common/imap/imap_client.h.
//
// A response arrives as segments: the text of a line up to and including a literal's "{n}"
// (or "{n+}"), then the literal's bytes, then the text after it, and so on until a line ends
// without a literal. The connection cuts a response into ImapSegments as the bytes arrive
// (literals are counted, never scanned for line ends), and hands the whole response to
// ParseResponse. A literal that the connection streamed to a receiver instead of keeping (a
// message body) is a segment with `streamed` set and no bytes.
//
// The tokenizer knows atoms (with bracketed sections such as BODY[HEADER.FIELDS (From)]<0>
// kept whole, as fetch attribute names need), numbers (atoms of digits), quoted strings with
// \" and \\ escapes, literals, NIL, and parenthesized lists nested to any depth (up to a
// limit, so hostile input cannot exhaust the stack). Status responses (OK, NO, BAD, BYE,
// PREAUTH) are split into the response code ([UIDVALIDITY 7], [CAPABILITY ...]) and the
// free text, which is not tokenized (it may hold unbalanced quotes or parentheses).
//
// Thread-safety: plain values and pure functions.
#ifndef GHOST_COMMON_IMAP_IMAP_CLIENT_INTERNAL_H_
#define GHOST_COMMON_IMAP_IMAP_CLIENT_INTERNAL_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/base/status.h"

namespace ghost::imap {

struct Segment {
  std::string bytes;      // line text (no CRLF), or a literal's contents
  bool literal = false;   // this segment is a literal's contents
  bool streamed = false;  // a literal delivered elsewhere; `bytes` is empty
};

struct Token {
  enum class Type { kAtom, kString, kNil, kList };
  Type type = Type::kAtom;
  std::string text;          // atom or string contents
  std::vector<Token> items;  // kList
  bool literal = false;      // kString that came as a literal
  bool streamed = false;     // kString whose literal was streamed (text empty)

  bool IsAtom(std::string_view upper) const;  // case-insensitive
  // The atom as a number, if it is one that fits.
  std::optional<std::uint64_t> Number() const;
  // Atom, string or NIL as text (NIL -> empty).
  std::string_view Str() const { return text; }
};

struct Response {
  enum class Kind { kTagged, kUntagged, kContinuation };
  Kind kind = Kind::kUntagged;
  std::string tag;  // kTagged
  // Status responses: "OK", "NO", "BAD", "BYE", "PREAUTH" (upper-case); else empty.
  std::string status;
  std::string code;              // response code atom, upper-case ("UIDVALIDITY"); "" if none
  std::string code_text;         // everything between '[' and ']' as sent
  std::vector<Token> code_args;  // the code's arguments, tokenized (empty if they do not parse)
  std::string text;              // the human-readable text (or a continuation's text)
  // Untagged data responses ("* 3 EXISTS", "* LIST ..."): keyword upper-case, the number
  // before it if any, and the rest tokenized.
  std::optional<std::uint32_t> number;
  std::string keyword;
  std::vector<Token> data;

  bool IsStatus() const { return !status.empty(); }
};

// Parses one complete response. Fails (kCorruption, with the offending text) on anything that
// is not IMAP4rev1 response syntax.
[[nodiscard]] Result<Response> ParseResponse(const std::vector<Segment>& segments);

// For a FETCH response cut short by a literal that is about to arrive: what the literal is.
// `segments` ends with the text segment that ends in "{n}".
struct FetchPrefix {
  bool is_fetch = false;  // "* <n> FETCH (" ... and the literal is a top-level value
  std::uint32_t seq = 0;
  std::string item;                  // the attribute the literal is the value of, upper-case
  std::optional<std::uint32_t> uid;  // UID, if it came before the literal
};
FetchPrefix AnalyzeFetchPrefix(const std::vector<Segment>& segments);

// If `line` ends with a literal marker "{n}" or "{n+}", its length. Sets *bad when the
// marker is malformed or too large to be a length.
std::optional<std::uint64_t> TrailingLiteral(std::string_view line, bool* bad);

// ---- Encoders for command arguments ----

// An astring argument: an atom when every byte is an ATOM-CHAR, else a quoted string when
// there is no CR, LF, NUL or 8-bit byte, else a literal. For a literal, the command text is
// cut: `*parts` ends with "... {n}" (or "{n+}" when `literal_plus`) and the next part starts
// with the bytes. Appends to the last element of *parts.
void AppendAstring(std::string_view s, bool literal_plus, std::vector<std::string>* parts);
// Like AppendAstring, but always a quoted string or literal (for mailbox names and the LIST
// pattern, where an empty string must be "").
void AppendString(std::string_view s, bool literal_plus, std::vector<std::string>* parts);
// True when `flag` is a flag or keyword IMAP can carry ("\Seen", "$Forwarded", "Junk").
bool IsValidFlag(std::string_view flag);
// True for a sequence set of UIDs: "7", "1:5", "3,9:*", ... (RFC 3501 sequence-set).
bool IsValidUidSet(std::string_view set);
// Expands a sequence set without '*' ("4:6,9") to its numbers in order; nullopt when it is
// malformed or holds more than `limit` numbers.
std::optional<std::vector<std::uint32_t>> ExpandUidSet(std::string_view set,
                                                       std::size_t limit = 1'000'000);
// True when `uid` is in `set` ('*' stands for any number at or above its partner).
bool UidSetContains(std::string_view set, std::uint32_t uid);

// "17-Jul-1996 02:44:25 -0700" <-> seconds since the Unix epoch (UTC).
std::optional<std::int64_t> ParseInternalDate(std::string_view s);
std::string FormatInternalDate(std::int64_t unix_seconds);

}  // namespace ghost::imap

#endif  // GHOST_COMMON_IMAP_IMAP_CLIENT_INTERNAL_H_
