// imap_wire: the IMAP proxy's view of the byte streams it relays (RFC 3501 §2.2, §4.3, RFC 7888
// for {n+}). The proxy (proxy/imap_proxy.h) passes through what it need not understand, so it
// does not parse whole commands and responses: it frames each stream into segments (a line up
// to CRLF, which may announce a literal) and literal bytes, streamed, never gathered; and it
// recognizes the few commands and responses it acts on (LOGIN, AUTHENTICATE PLAIN, SELECT,
// whole-body FETCH, CAPABILITY, EXISTS, EXPUNGE, UIDVALIDITY, ESEARCH).
//
// Memory is bounded: a line longer than Limits::max_line, or a literal announced larger than
// Limits::max_literal (a 1 GB literal, say), is an error the proxy answers with BAD and a close.
// Literal bytes are handed out as views of the caller's input, never copied.
//
// Everything here is pure (no I/O, no libevent), so tests/fuzz/imap_proxy_fuzz.cc runs it.
// Thread-safety: a Framer is a value used by one thread; the functions are reentrant.
#ifndef GHOST_PROXY_IMAP_WIRE_H_
#define GHOST_PROXY_IMAP_WIRE_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "proxy/imap_section.h"

namespace ghost::imapwire {

struct Limits {
  std::size_t max_line = 64 * 1024;         // bytes of one segment, CRLF included
  std::uint64_t max_literal = 64ull << 20;  // bytes one literal may announce
};

struct Event {
  enum class Kind {
    kNeedMore,     // everything given was consumed; call again with more input
    kSegment,      // `text` is one line with its line end; `literal` what it announces
    kLiteralData,  // `text` is the next bytes of the current literal (a view of the input)
    kLiteralEnd,   // the current literal is complete; the line continues in the next segment
    kError,        // `error` says what; the framer stays failed
  };
  Kind kind = Kind::kNeedMore;
  std::string_view text;
  bool first = false;  // kSegment: begins a new command or response (not a continuation)
  std::optional<std::uint64_t> literal;  // kSegment: the literal announced at the line's end
  bool nonsync = false;                  // kSegment: the literal is {n+}
  std::string error;
};

// Splits a stream into segments and literals. States:
//
//   kLine ──CRLF, no literal──▶ kLine (next segment starts a new command/response)
//   kLine ──CRLF, {n}──▶ kLiteral ──n bytes──▶ kLiteralEnd event ──▶ kLine (continuation)
//   any ──line over max_line / literal over max_literal / bad {n}──▶ kFailed (stays)
class Framer {
 public:
  explicit Framer(Limits limits) : limits_(limits) {}

  // Consumes a prefix of `in` and reports one event. Returns how many bytes of `in` were
  // consumed (0 is possible: kLiteralEnd, kError). Event views stay valid until the next call
  // and while `in`'s bytes do.
  std::size_t Next(std::string_view in, Event* ev);

  // Between two commands (or responses): no partial line, no literal in progress.
  bool AtBoundary() const {
    return state_ == State::kLine && (line_.empty() || clear_line_) && !continuing_;
  }
  bool failed() const { return state_ == State::kFailed; }
  // The line being read (on an error: its start), and whether it begins a command/response:
  // for naming the tag of a command that is refused.
  std::string_view partial() const { return clear_line_ ? std::string_view() : std::string_view(line_); }
  bool partial_first() const { return !continuing_; }
  // Inside a literal: bytes still to come.
  std::uint64_t literal_left() const { return literal_left_; }

 private:
  enum class State { kLine, kLiteral, kFailed };
  Limits limits_;
  State state_ = State::kLine;
  std::string line_;
  bool clear_line_ = false;  // line_ was handed out by the last event
  bool continuing_ = false;  // the next segment continues the current command
  bool literal_pending_end_ = false;
  std::uint64_t literal_left_ = 0;
  std::string error_;
};

// The literal announced at the end of `line` (line end removed or not): {n} or {n+}.
// nullopt when there is none; sets *bad when the braces hold something other than a size
// (then the stream cannot be framed).
std::optional<std::uint64_t> AnnouncedLiteral(std::string_view line, bool* nonsync, bool* bad);

// The line without its CR LF.
std::string_view StripEol(std::string_view line);

// A client command's first words: "a1 UID FETCH 5 BODY[]" -> tag "a1", name "UID FETCH"
// (upper case), rest "5 BODY[]". Fails (nullopt) when there is no tag or no name.
struct Command {
  std::string tag;
  std::string name;
  std::string_view rest;
};
std::optional<Command> ParseCommand(std::string_view line);

// Reads an atom or a quoted string (RFC 3501 astring without literals) from the front of *s,
// skipping spaces before it; advances *s past it. nullopt on a literal or malformed input.
std::optional<std::string> ReadAstring(std::string_view* s);

// A FETCH the proxy may answer from the cache: one message and one body item — BODY[section],
// BODY.PEEK[section] (the whole body for an empty section; see proxy/imap_section.h), either
// with a partial <start.count>, or RFC822 — with UID besides at most. Anything else (ranges,
// other items, BINARY, unbalanced brackets or parentheses) is nullopt and passes through to the
// server, which answers it.
struct BodyFetch {
  std::uint32_t number = 0;  // a UID for UID FETCH, else a sequence number
  // kBinary*: RFC 3516 BINARY[part], BINARY.PEEK[part], BINARY.SIZE[part] (a part path only).
  enum class Item { kBody, kBodyPeek, kRfc822, kBinary, kBinaryPeek, kBinarySize } item = Item::kBodyPeek;
  // <start.count> of BODY[] or BODY.PEEK[] (RFC 3501 §6.4.5): count > 0.
  std::optional<std::pair<std::uint64_t, std::uint64_t>> partial;
  Section section;  // empty part path and Text::kAll: the whole body
  bool sets_seen() const { return item == Item::kBody || item == Item::kRfc822 || item == Item::kBinary; }
  bool binary() const { return item == Item::kBinary || item == Item::kBinaryPeek || item == Item::kBinarySize; }
  bool whole() const { return !binary() && section.part.empty() && section.text == Section::Text::kAll; }
  // The item's name in the response: BODY[section] (for BODY[..] and BODY.PEEK[..], the
  // section as the server writes it), BODY[section]<start> for a partial, or RFC822.
  std::string response_name() const {
    if (item == Item::kRfc822) return "RFC822";
    const char* kind = item == Item::kBinarySize ? "BINARY.SIZE[" : binary() ? "BINARY[" : "BODY[";
    std::string name = kind + SectionName(section) + "]";
    return partial ? name + "<" + std::to_string(partial->first) + ">" : name;
  }
};
std::optional<BodyFetch> ParseBodyFetch(std::string_view rest);

// A server's untagged FETCH segment announcing a whole body: "* 3 FETCH (UID 7 BODY[] {512}"
// or "... RFC822 {512}". seq, the UID when the prefix names it, the body's size.
struct BodyPrefix {
  std::uint32_t seq = 0;
  std::optional<std::uint32_t> uid;
  std::uint64_t size = 0;
};
std::optional<BodyPrefix> ParseBodyPrefix(std::string_view segment);

// Untagged data the proxy tracks for the selected mailbox's sequence-number map.
// "* 5 EXISTS" / "* 5 EXPUNGE": the number; nullopt otherwise.
std::optional<std::uint32_t> UntaggedNumber(std::string_view line, std::string_view keyword);
// "[UIDVALIDITY n]" anywhere in an untagged OK.
std::optional<std::uint32_t> UidValidity(std::string_view line);
// "* ESEARCH (TAG "t") UID ALL 1:3,7" for tag `tag`: the UIDs, ascending (empty for no ALL).
// nullopt when the line is not that tag's ESEARCH or the set is malformed or over max_uids.
std::optional<std::vector<std::uint32_t>> EsearchUids(std::string_view line, std::string_view tag,
                                                      std::size_t max_uids);

// The line with capabilities the proxy cannot honour while inspecting the stream removed
// from "* CAPABILITY ..." and from "[CAPABILITY ...]" response codes: COMPRESS=* (the stream
// would be unreadable), STARTTLS (the server's: the proxy offers its own, TlsCapabilities), QRESYNC (VANISHED instead of
// EXPUNGE), AUTH= mechanisms other than PLAIN (the proxy learns the user only from LOGIN and
// PLAIN). Other lines come back unchanged.
std::string FilterCapabilities(std::string_view line);

// The proxy's own TLS words in a capability list (after FilterCapabilities): STARTTLS when
// `offer_starttls` (a plain session with a certificate configured, before login), and when
// `login_disabled` LOGINDISABLED with every AUTH= mechanism removed (RFC 3501 §6.2.3, RFC 9051
// §6.2.1: no password in clear on a non-loopback listener before STARTTLS). Either word is
// removed when its flag is false. Other lines come back unchanged.
std::string TlsCapabilities(std::string_view line, bool offer_starttls, bool login_disabled);

// The capability list of a greeting's "[CAPABILITY ...]" response code ("* OK [CAPABILITY
// IMAP4rev1 STARTTLS] ready" -> "IMAP4rev1 STARTTLS"); nullopt when it has none.
std::optional<std::string> GreetingCapabilities(std::string_view greeting);
// The greeting with its "[CAPABILITY ...]" code removed (the capabilities a server announced
// before STARTTLS are forgotten after it, RFC 3501 §6.2.1); other greetings unchanged.
std::string GreetingWithoutCapabilities(std::string_view greeting);
// Whether the space-separated capability list `caps` has `name` (case-insensitive).
bool HasCapability(std::string_view caps, std::string_view name);

// The user a SASL PLAIN initial response (base64 of authzid NUL authcid NUL password) logs
// in as: authzid when given, else authcid. The password is not kept. nullopt when malformed.
std::optional<std::string> PlainUser(std::string_view base64);


// The password of a SASL PLAIN initial response, for the deferred-change sender that logs in
// later in the client's name (kept in RAM only, proxy/imap_deferred.h). nullopt when malformed.
std::optional<std::string> PlainPassword(std::string_view base64);

// "UID STORE set +FLAGS[.SILENT] (flags)" (or -FLAGS): the parts the proxy may defer. The set
// is expanded against `known` (the selected mailbox's UIDs, ascending; "*" is its last), and
// every UID must be in it. nullopt for anything else (FLAGS replacement, UNCHANGEDSINCE, a
// UID the proxy does not know, a set of more than `max_uids`), which then goes to the server.
struct UidStore {
  std::vector<std::uint32_t> uids;
  bool add = true;  // +FLAGS; false: -FLAGS
  bool silent = false;
  std::vector<std::string> flags;
};
std::optional<UidStore> ParseUidStore(std::string_view rest, const std::vector<std::uint32_t>& known,
                                      std::size_t max_uids = 1000);

// A sequence set ("2,4:6,*") or, with `by_uid`, a UID set, expanded against `known` (the
// selected mailbox's UIDs, ascending): the UIDs it names, ascending, without duplicates. "*" is
// the last message. A sequence number past the end, a single UID the proxy does not know, a
// range naming no known message, a malformed set, or more than `max_uids` messages: nullopt.
std::optional<std::vector<std::uint32_t>> ExpandSet(std::string_view set, const std::vector<std::uint32_t>& known,
                                                    bool by_uid, std::size_t max_uids = 1000);

// "COPY set mailbox" / "UID COPY set mailbox" (`rest` after the command name; `by_uid` for UID
// COPY): the messages (as ExpandSet) and the destination (an atom or a quoted string; a literal
// is nullopt).
struct CopyCommand {
  std::vector<std::uint32_t> uids;
  std::string destination;
};
std::optional<CopyCommand> ParseCopy(std::string_view rest, const std::vector<std::uint32_t>& known, bool by_uid,
                                     std::size_t max_uids = 1000);

// An APPEND command's first segment, "APPEND mailbox [(flags)] ["date-time"] {n}" or {n+}
// (`rest` after the name as ParseCommand gives it, the line end gone; the announcement
// must be its last character): one message, the mailbox an atom or a quoted
// string. The date-time is returned as given (unchecked). nullopt for anything else (a literal
// mailbox, CATENATE, extensions), which then goes to the server.
struct AppendCommand {
  std::string mailbox;
  std::vector<std::string> flags;
  std::string date;  // "" when none
  std::uint64_t size = 0;
  bool nonsync = false;
};
std::optional<AppendCommand> ParseAppend(std::string_view rest);

// A server's untagged FETCH segment carrying FLAGS: "* 3 FETCH (UID 7 FLAGS (\Seen) ...)".
// The sequence number, the UID when the segment names it, the flags, and where "(...)" of the
// flags is in the segment (offset, length), for RewriteFlags. nullopt otherwise.
struct FetchFlags {
  std::uint32_t seq = 0;
  std::optional<std::uint32_t> uid;
  std::vector<std::string> flags;
  std::size_t list_at = 0, list_len = 0;
};
std::optional<FetchFlags> ParseFetchFlags(std::string_view segment);
// `segment` with its flag list (as found by ParseFetchFlags) replaced by `flags`.
std::string RewriteFlags(std::string_view segment, const FetchFlags& found,
                         const std::vector<std::string>& flags);
// "(\Seen \Flagged)" for a list of flags.
std::string FlagList(const std::vector<std::string>& flags);

}  // namespace ghost::imapwire

#endif  // GHOST_PROXY_IMAP_WIRE_H_
