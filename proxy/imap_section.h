// imap_section: the body sections of a cached message (RFC 3501 §6.4.5, RFC 9051 §6.4.5), so
// the IMAP proxy (proxy/imap_proxy.h) answers BODY[HEADER], BODY[TEXT], BODY[HEADER.FIELDS
// (...)], BODY[n], BODY[n.MIME], BODY[n.TEXT], BODY[n.HEADER] ... from the whole message it
// keeps, byte for byte what the server would send.
//
// Why a small locator and not a MIME library: the answer must be the server's exact bytes
// (offsets into the message as it is stored), which a parser that rebuilds the message (GMime)
// does not promise; finding the parts only needs the header block, Content-Type's type and
// boundary, and the boundary lines. The locator is conservative: whatever it is not sure to
// answer as dovecot does (bare LF line ends, a missing close delimiter, a part number past the
// end, a sub-part of a non-message leaf, MIME of a non-multipart message, quoted field names,
// nesting deeper than kMaxDepth) is nullopt, and the proxy sends the FETCH to the server.
//
// Pure (no I/O), bounded (depth, parts, fields); tests/fuzz/imap_proxy_fuzz.cc runs it.
// Thread-safety: reentrant.
#ifndef GHOST_PROXY_IMAP_SECTION_H_
#define GHOST_PROXY_IMAP_SECTION_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace ghost::imapwire {

// A section-spec: the part path (empty: the message itself) and what of it.
struct Section {
  std::vector<std::uint32_t> part;
  enum class Text { kAll, kHeader, kHeaderFields, kHeaderFieldsNot, kText, kMime } text = Text::kAll;
  std::vector<std::string> fields;  // kHeaderFields(Not): the field names, upper case
};

constexpr std::size_t kMaxSectionDepth = 16;
constexpr std::size_t kMaxSectionFields = 64;

// Parses the text between BODY[ and ] ("", "HEADER", "1.2.MIME", "HEADER.FIELDS (FROM TO)").
// Field names must be atoms. nullopt when malformed, or MIME without a part number.
std::optional<Section> ParseSection(std::string_view spec);

// The section's text as the server names it in its answer: upper case, one space inside the
// field list ("HEADER.FIELDS (FROM TO)").
std::string SectionName(const Section& s);

// The bytes of section `s` of `message` (a whole message with CRLF line ends, as BODY[] sends
// it); nullopt when not certain to match the server's answer (see above).
std::optional<std::string> ExtractSection(std::string_view message, const Section& s);

// The decoded content of part `part` (RFC 3516 BINARY[part]): its body with its
// Content-Transfer-Encoding undone (base64, quoted-printable; 7bit, 8bit, binary or none as
// they are). nullopt when not certain to match the server: an empty path, a multipart or
// message/rfc822 part, another encoding, anything but strict base64 (alphabet, CRLF lines,
// padding at the end) or strict quoted-printable (upper-case hex, no trailing white space), or
// a NUL in the result. *literal8 says whether the server sends it as a literal8 ("~{n}", RFC
// 3516 §4.2), as dovecot does: for decoded base64, and for quoted-printable that decodes to
// 8-bit bytes; 8-bit content that was not encoded, and quoted-printable that decodes to 7-bit,
// are nullopt (dovecot's choice there not established).
std::optional<std::string> ExtractBinary(std::string_view message, const std::vector<std::uint32_t>& part,
                                         bool* literal8);

}  // namespace ghost::imapwire

#endif  // GHOST_PROXY_IMAP_SECTION_H_
