// Traces: the workloads that ghostsim replays and the live harness plays against the daemons
// (DESIGN §6).
//
// A trace is plain text, one event per line, in one of three kinds:
//
//     # ghost-trace web v1
//     <time> GET <absolute-url> <size> <cached 0|1>
//
//     # ghost-trace mail v1
//     <time> READ <mailbox> <uid> <size>
//     <time> SEND <mailbox> - <size>
//
//     # ghost-trace block v1
//     <time> <R|W> <sector> <sectors>
//
// The first non-blank line is the header naming the kind and version. `#` starts a comment
// anywhere on a line; blank lines are ignored; fields are separated by spaces or tabs; a CRLF
// line end is accepted. Times are decimal seconds from the trace start (kept to the
// microsecond) and never decrease from one event to the next; sizes are bytes; a sector is
// 512 bytes. Web: `cached 1` means the object is in the disk cache when the trace starts, so it
// is a property of the URL and must agree on every request of that URL. Mail: READ names a
// message by its IMAP uid (a positive 32-bit integer); SEND uploads a new message and has `-`
// as its uid.
//
// ParseTrace is strict (numbers must be whole tokens, see the .cc for every rule) and never
// crashes on any input: every defect is a Status::InvalidArgument whose message is one line of
// the form `FILE:LINE: what is wrong (what was expected)`. WriteTrace writes the same format
// back, so Parse(Write(t)) == t for every valid trace.
//
// Thread-safety: plain values and free functions; distinct traces and streams may be used
// from different threads at once.
#ifndef GHOST_COMMON_SIM_TRACE_H_
#define GHOST_COMMON_SIM_TRACE_H_

#include <cstddef>
#include <cstdint>
#include <iosfwd>
#include <string>
#include <string_view>
#include <vector>

#include "common/base/status.h"
#include "common/base/units.h"

namespace ghost {

enum class TraceKind { kWeb, kMail, kBlock };

// "web", "mail" or "block": the kind's name in the header and on the command line.
const char* TraceKindName(TraceKind kind);

// Bytes per sector in block traces.
inline constexpr Bytes kSectorSize = 512;

// One GET of a web object. The client is sequential: a request starts at `time` or when the
// previous one ends, whichever is later.
struct WebRequest {
  TimePoint time;
  std::string url;  // absolute http:// or https:// URL
  Bytes size = 0;
  bool cached = false;  // in the disk cache when the trace starts
  friend bool operator==(const WebRequest&, const WebRequest&) = default;
};

// One mail operation against a mailbox that is cached locally at the start.
struct MailEvent {
  enum class Op { kRead, kSend };
  TimePoint time;
  Op op = Op::kRead;
  std::string mailbox;
  std::uint32_t uid = 0;  // the message read; 0 for SEND
  Bytes size = 0;
  friend bool operator==(const MailEvent&, const MailEvent&) = default;
};

// One block I/O of `sectors` sectors starting at `sector`.
struct BlockEvent {
  TimePoint time;
  bool write = false;
  std::uint64_t sector = 0;
  std::uint32_t sectors = 0;  // at least 1
  friend bool operator==(const BlockEvent&, const BlockEvent&) = default;
};

// A parsed or generated trace. Only the vector of `kind` is used; the others stay empty.
// Events are in file order, which is time order.
struct Trace {
  TraceKind kind = TraceKind::kWeb;
  std::string name;  // the file name (or a description for a generated trace)
  std::vector<WebRequest> web;
  std::vector<MailEvent> mail;
  std::vector<BlockEvent> block;
};

// Parses a whole trace from `in`. `name` stands for the input in error messages.
// On failure returns InvalidArgument "name:LINE: what is wrong (what was expected)", or
// IoError if the stream itself fails. A header-only trace is valid and has no events.
[[nodiscard]] Result<Trace> ParseTrace(std::istream& in, const std::string& name);

// Opens and parses the trace at `path` (used as the name in errors). A file that cannot be
// opened is NotFound / IoError from its errno.
[[nodiscard]] Result<Trace> LoadTrace(const std::string& path);

// Writes `t` in its format: the header, then `comment` (if not empty) as `# ` comment lines
// (one per line of `comment`), then one line per event of `t.kind`. Times are written to the
// microsecond, so ParseTrace gives back the same events.
// Precondition: `t` is valid (as ParseTrace would accept); the caller checks `out` for errors.
void WriteTrace(const Trace& t, std::ostream& out, std::string_view comment = {});

// What `ghosttrace check` prints about a trace.
struct TraceSummary {
  std::size_t events = 0;
  Duration duration{0};  // time of the last event (traces start at 0)
  // web: distinct URLs; mail: distinct messages (READ mailbox+uid, plus one per SEND);
  // block: distinct sectors touched.
  std::size_t unique_objects = 0;
  std::size_t cached_objects = 0;  // web only: distinct URLs with cached 1
  std::size_t reads = 0;           // GETs, READs or R events
  std::size_t writes = 0;          // SENDs or W events
  Bytes bytes = 0;                 // bytes moved by all events (saturates at the maximum)
};
TraceSummary SummarizeTrace(const Trace& t);

}  // namespace ghost

#endif  // GHOST_COMMON_SIM_TRACE_H_
