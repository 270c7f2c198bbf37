// Maildir names for an IMAP origin (DESIGN §4.1: "an IMAP origin maps mailboxes to directories
// and messages to files, Maildir-style names so Maildir readers work"). Pure functions, no I/O.
//
// 1. Modified UTF-7 (RFC 3501 §5.1.3): the wire form of mailbox names. DecodeMutf7 is strict:
//    it rejects what the RFC forbids (bytes outside 0x20..0x7e, printable ASCII inside a base64
//    run, unpaired UTF-16 surrogates, non-zero padding bits, an unterminated or empty '&' run),
//    so Encode(Decode(x)) == x for every x that decodes, except names that split one base64
//    run into two adjacent runs ("&AOk-&AOk-"), which the encoder would merge; MailboxToDirName
//    catches those by re-encoding.
//
// 2. Mailbox name <-> directory name, the Maildir++ layout (chosen over nested directories
//    because every Maildir reader understands it: Python's mailbox.Maildir, mutt/neomutt,
//    dovecot, mbsync with SubFolders Maildir++):
//      INBOX (any case)           <->  ""  (the Maildir root: cur/ new/ tmp/)
//      "Work/Reports" (delim '/') <->  ".Work.Reports"
//    A directory name is "." followed by the mailbox name, decoded to UTF-8, with each
//    hierarchy delimiter written as '.', and these bytes percent-escaped as %XX (upper-case
//    hex): control characters (C0, DEL, and the C1 controls U+0080..U+009F byte by byte), '%',
//    '/', a '.' that is not a delimiter, and a delimiter that does not separate two non-empty
//    levels (leading, trailing or doubled). So a directory name never contains '/', is never
//    "." or "..", never ends in '.', never contains "..", and holds no control character.
//    UTF-8 letters stay as they are, so
//    "Entwürfe" is ".Entwürfe", not ".Entw&APw-rfe".
//    A wire name that is not canonical modified UTF-7 (8-bit bytes from a non-conforming
//    server, "&" runs that do not round-trip) cannot be shown as UTF-8; it maps to ".%!"
//    followed by its raw bytes with every byte outside 0x21..0x7e and '%', '.', '/' escaped
//    (a flat name: the delimiter is not mapped to '.'). "%!" never appears otherwise (an
//    escape is always % and two hex digits), so the two forms cannot collide.
//    DirNameToMailbox accepts only canonical directory names (those MailboxToDirName
//    produces): "%2e" (lower case), a needless escape, ".INBOX" and the like are refused, so
//    the mapping is a bijection between mailbox names and the directory names it accepts.
//    A directory name longer than NAME_MAX (255 bytes) is refused with kInvalidArgument.
//
// 3. Message file names, stable across restarts because they are made of the message's
//    UIDVALIDITY and UID (unique in a mailbox for as long as UIDVALIDITY holds):
//      "<uidvalidity>.<uid>.ghost[,S=<size>]:2,<info letters>"
//    e.g. "1795387522.42.ghost,S=5120:2,FS". ",S=<size>" is the RFC822.SIZE (dovecot and
//    others read it to skip a stat); the part before ':' is the Maildir "unique name".
//
// 4. IMAP flags <-> Maildir info letters (cr.yp.to/proto/maildir.html; letters in ASCII order):
//      \Draft D, \Flagged F, $Forwarded P (passed), \Answered R, \Seen S, \Deleted T.
//    \Recent has no letter (it is session state); other keywords have none either (Maildir
//    readers have no portable way to hold them) and are returned to the caller as unmapped.
//    System flags match case-insensitively (RFC 3501 §2.3.2).
//
// Thread-safety: pure functions of their arguments.
#ifndef GHOST_COMMON_IMAP_MAILDIR_NAMES_H_
#define GHOST_COMMON_IMAP_MAILDIR_NAMES_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/base/status.h"

namespace ghost {

// ---- Modified UTF-7 ----

// UTF-8 -> modified UTF-7. Fails (kInvalidArgument) on invalid UTF-8 (overlong forms,
// surrogates, code points above U+10FFFF, truncated sequences) and on NUL.
[[nodiscard]] Result<std::string> EncodeMutf7(std::string_view utf8);
// Modified UTF-7 -> UTF-8. Fails (kInvalidArgument, naming the offset) on anything RFC 3501
// forbids; see the file comment.
[[nodiscard]] Result<std::string> DecodeMutf7(std::string_view mutf7);

// ---- Mailbox names <-> directory names ----

// Maps a mailbox's wire name (as LIST returns it) to its Maildir++ directory name under the
// Maildir root ("" for INBOX). `delimiter` is the hierarchy delimiter LIST reported for it
// ('\0' for NIL: a flat name). Fails (kInvalidArgument) on an empty name or a result longer
// than 255 bytes.
[[nodiscard]] Result<std::string> MailboxToDirName(std::string_view wire_name, char delimiter);
// The inverse: a directory name under the Maildir root ("" or one starting with '.') back to
// the wire name. Fails (kInvalidArgument, saying why) on anything MailboxToDirName would not
// have produced with this delimiter.
[[nodiscard]] Result<std::string> DirNameToMailbox(std::string_view dir_name, char delimiter);

// True for "INBOX" in any case (RFC 3501 §5.1).
bool IsInbox(std::string_view wire_name);

// ---- Message file names ----

struct MaildirFileName {
  std::uint32_t uidvalidity = 0;
  std::uint32_t uid = 0;
  std::optional<std::uint64_t> size;  // RFC822.SIZE, written as ",S=<size>"
  std::string info;                   // Maildir info letters after ":2,", sorted, unique

  bool operator==(const MaildirFileName&) const = default;
};

// "<uidvalidity>.<uid>.ghost[,S=<size>]:2,<info>". The info letters are sorted and deduplicated
// first. Precondition: uidvalidity and uid are non-zero (IMAP never uses 0).
std::string FormatMaildirFileName(const MaildirFileName& name);
// Parses a name FormatMaildirFileName produced (a name without ":2," has empty info). Fails
// (kInvalidArgument) on any other name: foreign files in a Maildir are not ours to map.
[[nodiscard]] Result<MaildirFileName> ParseMaildirFileName(std::string_view file_name);

// ---- Flags <-> info letters ----

// The info letters for `flags` (sorted, unique). Flags with no letter are appended to
// `unmapped` when it is not null.
std::string FlagsToInfo(const std::vector<std::string>& flags,
                        std::vector<std::string>* unmapped = nullptr);
// The IMAP flags for the info letters, in the letters' order (canonical spelling, e.g.
// "\\Seen"). Letters with no flag (lower-case keyword letters, unknown ones) are appended to
// `unmapped` when it is not null.
std::vector<std::string> InfoToFlags(std::string_view info, std::string* unmapped = nullptr);
// Sorts and deduplicates info letters (the Maildir spec wants them in ASCII order).
std::string NormalizeInfo(std::string_view info);

// Where a server message shows in a Maildir, the way readers (mutt, neomutt, Python's
// mailbox) understand it: "new" while it is unseen (no 'S' in its `info` letters) and no reader
// has moved it to cur/ yet; "cur" otherwise.
std::string MaildirSubdirFor(std::string_view info, bool moved_to_cur_by_reader);

}  // namespace ghost

#endif  // GHOST_COMMON_IMAP_MAILDIR_NAMES_H_
