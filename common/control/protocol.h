// The control protocol (DESIGN §4.2), defined once: the ops a request may name, how each op's
// arguments are checked and typed, the topics of pushed events, and the shapes of the results
// that more than one program reads. The server (control.h) checks every request with
// ParseControlArgs before the daemon (fs/control_ops.cc) sees it; ghostctl, ghostproxy's
// client (proxy/ghostfs_backend.cc) and the daemon build and read the results with the types
// below, so a field promised here is a field someone sends.
//
// Framing (one JSON object per line, ids, errors) is in control.h.
//
// ---- Ops ----
//   status {"path": P}  cache status of a file. P is absolute (under the mount point; ghostctl
//       sends absolute paths) or relative to the mount root. Result:
//       {"path":"/mnt/ghost/web/index.html","cached":true,"size":5120,
//        "source_preference":"disk","last_source":"network",   (optional: "url", "state")
//        "cost":{"disk":{"time_s":0.012,"energy_j":0.03},"network":{"time_s":0.2,"energy_j":0.4}}}
//       An unknown path is an error reply ("status: /x: no such file in the mount").
//   hint {"kind": K, "device": D, "time_s": T, "energy_j": E}  an application's hint (DESIGN
//       §3.3, §3.4). K is "ghost" | "transfer_begin" | "transfer_end" | "background"; D is a
//       device name ("microdrive-1gb") or id (0); T and E (numbers >= 0, default 0, at most
//       kMaxHintSeconds and kMaxHintJoules) are what a ghost hint says the device's best mode
//       would have saved. Result: {}.
//   knob {"value": V}?  without "value" (or null): get; with an integer V in 0..100: set.
//       Result: KnobResult, {"knob":70} (a set adds "previous":50, the value before it).
//   devices  every registered device. Result:
//       [{"id":0,"name":"microdrive-1gb","kind":"disk","mode":"standby","mode_index":2,
//         "modes":[{"name":"active","power_w":1.3},{"name":"idle","power_w":0.5},
//                  {"name":"standby","power_w":0.08}],
//         "power_w":0.08,"policy":"stpm-disk K=50: spin down after 12.3 s"}]
//       ("kind": "disk" | "network" | "flash"; "power_w": what it draws now.)
//       With ghostfs --devices auto each entry adds "hardware", the real device behind it
//       (common/power/hardware.h): {"backend":"ata"|"ssd"|"nvme"|"nl80211"|"link"|"none",
//       "managed":false,"hardware_mode":"standby","path":"/dev/sda" | "interface":"wlan0",
//       "note":"why it is modelled only","error":"the last failure"}.
//   stats  energy and activity since the daemon started. Result:
//       {"uptime_s":3600.5,"knob":50,
//        "energy_j":{"total":1234.5,"base":1000.0,"devices":{"microdrive-1gb":120.5}},
//        "requests":{"memory":0,"disk":3,"network":5},"ghost_hints_sent":2,
//                    (more request sources, e.g. "revalidated", may follow the three)
//        "write_queue":{"queued_bytes":4096,"flushes":1},
//        "cache":{"objects":42,"bytes":1048576,"capacity":67108864},
//        "model":{"power_w":7.1},   (the model's whole-machine power now)
//        "measured":{"power_w":9.2,"energy_j":12.5,"since_s":60,"meters":[{"name":"BAT0",
//          "kind":"battery","ok":true,"power_w":9.2,"energy_j":12.5,...}],"notes":[...]}}
//       ("measured" only with --devices auto; null power/energy when no meter answers.)
//   flush  write every deferred write to its device now; replies when done (asynchronous).
//       Result: {"flushed_bytes":4096,"duration_s":1.2}
//   drop_caches  forgets the page-cache model's contents (the shared store's RAM copies,
//       fs/store_tree.cc), as `echo 1 > /proc/sys/vm/drop_caches` does for the kernel's: the
//       next lookups choose between disk and network. Result: {"dropped": N} (objects).
//
//   The shared store (ghostproxy's cache is the daemon's: fs/store_tree.cc). K is an opaque
//   non-empty cache key (the proxy uses the URL, plus the Vary'd request headers).
//   lookup {"key": K}  is K cached, and where should it be read from now? The daemon runs the
//       cost model (sending the disk a ghost hint when the network wins). Result: LookupResult,
//       {"cached":false}, or {"cached":true,"size":5120,"response":"<the stored head>",
//        "choice":"disk"|"network","source":"disk"|"memory"|"network","ghost_hint":false,
//        "cost":{...the estimates, as the user.ghost.cost attribute shows them...},
//        "etag":"\"5f-1\"","last_modified":"...","content_type":"text/html","expires_unix":N|null,
//        "path":"/mnt/ghost/.ghost/objects/<hex sha-256 of K>",   (read the body there)
//        "body_path":"<cache dir>/objects/ab/ab12..."}   (only with "choice":"disk": the body
//       file itself, which a reader on this machine may read instead of "path"; the daemon
//       has charged the emulated disk for that read already; or, for a small body packed in
//       the index, which has no file of its own, "body_base64":"<the body>" instead)
//     With "begin_transfer": true, a miss also begins the fetch that follows it, as transfer
//       {"phase":"begin"} would at that moment: {"cached":false,"transfer":T,"card":C} (T and
//       C as that op answers them). One round trip instead of two per miss. A daemon without
//       this field answers {"cached":false} (it ignores fields it does not know): the client
//       then sends "begin" itself. A hit begins nothing.
//   store {"key": K, "response": R, "etag": E, "last_modified": L, "content_type": T,
//          "expires_unix": X}  (all but "key" optional; R is stored verbatim, X is an integer
//       or null) opens a fill. Result: {"path":"/mnt/ghost/.ghost/fill/<token>"}: write the
//       body there; closing the file hands it to the write queue, replacing any object at K;
//       unlinking it first abandons the fill.
//     With "body_base64": B (padded base64 of at most kMaxInlineStoreBytes bytes) the body
//       comes in the request itself, and the daemon hands it to the write queue at once, as
//       the fill file's close does (same queue, same commit, same "objects" events): no FUSE
//       traffic. Result: {"stored": N} (the body's bytes), sent once it is queued — when a
//       fill file's close() would have returned. Larger bodies take the fill file. (Why base64
//       in the JSON line rather than a binary frame after it: every reader of the socket —
//       the server's line framer, ghostctl, the Python harness, the fuzz target — speaks
//       JSON lines; a frame would need a second framing state in each. Base64 costs a third
//       more bytes of a body under 16 KiB, well below one FUSE round trip, and the lookup
//       result already sends packed bodies the same way.) Our clients and the server write
//       "body_base64" as the last member of its object and copy it unescaped; a line that ends
//       with it is parsed without running it through the JSON lexer (control.cc). Any order is
//       accepted and means the same.
//     With "transfer_end": T (and "transfer_bytes": B), the fetch that brought the body is over:
//       after the body is queued, the daemon ends transfer T as {"phase":"end","transfer":T,
//       "bytes":B} would (B: the data phase, when it was not sent). Only an inline store (with
//       "body_base64") takes it; a client may send it to a daemon that said "card" in a begin
//       or lookup answer (older daemons ignore it and would leave T open). "transfer_bytes"
//       needs "transfer_end".
//   refresh {"key": K, ...the fields of store...}  a 304 refreshed K: replaces those fields,
//       keeps the body. Result: {}; an error if K is not cached.
//   invalidate {"key": K}  drops K. Result: {"removed":true|false}.
//   transfer {"phase": "begin"}  a proxy's fetch from an origin, carried by the emulated card
//       (fs/store_tree.cc): disclosed to the network module, the card's round trips start.
//       Result: {"transfer": T, "card": C}: C is false when the daemon emulates no card
//       (no --profile): then "data" is answered at once and carries nothing a client must
//       wait for, so it may be folded into "end" (below).
//     {"phase": "data", "transfer": T, "bytes": B}  the body's size is known: the card carries
//       B bytes; answered ({}) once it has (once per transfer). "upload": true (optional): B
//       bytes sent to the origin (an IMAP APPEND's message), at the link's upload rate.
//     {"phase": "end", "transfer": T}  the fetch is over (the transfer closes after its data).
//       With "bytes": B, the data phase comes first (a transfer whose data was not given).
//     A transfer (or a lookup's "begin_transfer") belongs to the connection that began it:
//     when that connection closes with it still open, the daemon ends it as "end" would (a
//     client gone mid-fetch cannot, and an open transfer keeps the card's policy busy for ever).
//     Unkeyed "hint" transfer_begin/transfer_end are not tracked this way (a begin and its end
//     may come from two ghostctl runs).
//   served {"memory": {K: N, ...}, "bytes": B}  a client served N reads of each K from its own
//       copy in RAM (the memory source, DESIGN §3.4; ghostproxy's MemoryCache), B body bytes in
//       all, since its last report: counted as memory reads in stats, and each K becomes the
//       most recently used. N are integers >= 1, B an integer >= 0. Result: {}.
//   subscribe {"topics": [T...]}  answered by the server itself: from the reply on, every
//       event published on those topics is pushed to this connection until it closes
//       (subscribing again adds topics). Result: {"topics":["modes","stats"]} (all now held).
//
//   nap {"phase": "begin", "due_in_s": D, "min_rtt_s": R, "wake_lead_s": L}  a shaped
//       download's burst ended and its next one is due D seconds from now on a path whose
//       minimum RTT is R; the proxy wants the card awake L before it (DESIGN §3.6 rules 2–5).
//       With --profile the emulated card naps (Device::TryShapingNap): its lowest mode until
//       D − L − its lowest→CAM time, then back in CAM. D and R in (0, kMaxNapSeconds], L in
//       [0, kMaxNapSeconds]. Result: {"napping":true}, or {"napping":false,"reason":"..."} when
//       refused (the card is not in CAM or is busy; it wakes too slowly for R, rule 4 — the
//       proxy then stops asking for this download; no --profile). Counted in stats "naps".
//     {"phase": "end"}  the card must be awake now (data came early, the download ended):
//       the up transition starts now if it has not. Result: {}.
//
// ---- Topics (pushed {"event": topic, "data": ...}) ----
//   modes   a device entered a mode, or a policy changed (knob set): data is the devices
//           result, the whole array as `devices` returns it. (ghostctl also accepts one
//           device's entry, {"device":"microdrive-1gb","id":0,"mode":"standby","mode_index":2,
//           "power_w":0.08}, and updates that row.)
//   stats   the stats changed: data has the shape of the stats result (the daemon coalesces;
//           nothing is pushed while nothing happens).
//   events  anything else worth a log line: {"type":"ghost_hint"|"flush"|"fetch_error"|...,...}
//   objects a stored object changed or left the cache (refreshed, replaced by a fill,
//           invalidated, evicted): {"key": K}. A client holding a copy of K in RAM drops it;
//           one that loses its subscription must drop every copy (it may have missed events).
//           Published from the daemon's first "lookup" on (no copy can exist before one).
//
// Nothing here throws: every parse checks types first and returns a Status.
// Thread-safety: plain functions and values.
#ifndef GHOST_COMMON_CONTROL_PROTOCOL_H_
#define GHOST_COMMON_CONTROL_PROTOCOL_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "common/base/status.h"

namespace ghost {

// The ops a request may name. Their names on the wire are ControlOpName's.
enum class ControlOp {
  kStatus,
  kHint,
  kKnob,
  kDevices,
  kStats,
  kFlush,
  kDropCaches,
  kSubscribe,
  kLookup,
  kStore,
  kRefresh,
  kInvalidate,
  kTransfer,
  kServed,
  kSync,  // sends the queued IMAP operations now
  kNap,   // a shaped download's nap on the emulated card (DESIGN §3.6)
};
inline constexpr std::size_t kControlOpCount = 16;

// Every op, in the order above.
const std::array<ControlOp, kControlOpCount>& AllControlOps();
std::string_view ControlOpName(ControlOp op);
// The op named `name`, or nullopt for a name that is not an op.
std::optional<ControlOp> ParseControlOp(std::string_view name);
// "status, hint, knob, ..." for messages.
std::string ControlOpList();

// The topics a subscription may hold.
inline constexpr std::array<std::string_view, 4> kControlTopics = {"modes", "stats", "events",
                                                                   "objects"};

// Bounds that keep numbers from a client within what the daemon's types hold (a time in
// microseconds in an int64, byte counts turned into transfer times): larger values are refused.
inline constexpr double kMaxHintSeconds = 365.0 * 24 * 3600;  // a ghost hint's time_s
inline constexpr double kMaxHintJoules = 1e9;                   // a ghost hint's energy_j
inline constexpr std::uint64_t kMaxTransferBytes = 1ull << 40;  // transfer data "bytes"
inline constexpr std::uint64_t kMaxServedReads = 1000000;       // served: reads of one key
inline constexpr std::int64_t kMaxUnixSeconds = 100'000'000'000;  // |expires_unix|
// store "body_base64": the largest body sent inline (the cache's pack limit, so every body
// packed in the index can come this way; its base64, 21848 bytes, leaves room for the head in
// a request line of at most 64 KiB).
inline constexpr std::size_t kMaxInlineStoreBytes = 16 * 1024;

// The performance/energy knob's range (0 saves energy, 100 favours performance).
inline constexpr int kKnobMin = 0;
inline constexpr int kKnobMax = 100;
// "70" → 70. kInvalidArgument, naming the text and the range, for anything but a decimal
// integer in kKnobMin..kKnobMax.
Result<int> ParseKnobText(std::string_view text);

// ---- Requests: the arguments of each op, checked and typed ----

struct NoArgs {};  // devices, stats, flush, drop_caches
struct StatusArgs {
  std::string path;  // non-empty
};
enum class HintKind { kGhost, kTransferBegin, kTransferEnd, kBackground };
struct HintArgs {
  HintKind kind = HintKind::kGhost;
  std::variant<std::string, std::int64_t> device;  // a name (non-empty) or an id (>= 0)
  double time_s = 0;                               // 0..kMaxHintSeconds
  double energy_j = 0;                             // 0..kMaxHintJoules
};
struct KnobArgs {
  std::optional<int> value;  // set to this (in kKnobMin..kKnobMax); nullopt: get
};
struct SubscribeArgs {
  std::vector<std::string> topics;  // non-empty, each one of kControlTopics
};
// lookup, store, refresh, invalidate. A field absent from the request is nullopt.
struct ObjectArgs {
  std::string key;  // non-empty
  std::optional<std::string> response, etag, last_modified, content_type;
  // Outer nullopt: not given; inner nullopt: given as null (no expiry). |X| <= kMaxUnixSeconds.
  std::optional<std::optional<std::int64_t>> expires_unix;
  // store only: the body sent inline ("body_base64", decoded; at most kMaxInlineStoreBytes).
  std::optional<std::string> body;
  // lookup only: a miss begins the fetch's transfer ("begin_transfer": true).
  bool begin_transfer = false;
  // store only: the transfer the fill's fetch was ("transfer_end"), ended after the store; and
  // its data phase's bytes ("transfer_bytes", <= kMaxTransferBytes), when not sent before.
  std::optional<std::uint64_t> transfer_end, transfer_bytes;
};
enum class TransferPhase { kBegin, kData, kEnd };
struct TransferArgs {
  TransferPhase phase = TransferPhase::kBegin;
  std::uint64_t transfer = 0;  // data, end: the id "begin" returned
  std::uint64_t bytes = 0;     // data: the body's size, <= kMaxTransferBytes
  bool upload = false;         // data: bytes sent to the origin (at the link's upload rate)
  std::optional<std::uint64_t> end_bytes;  // end: "bytes", the data phase folded in
};
struct ServedArgs {
  // key (non-empty), reads (1..kMaxServedReads)
  std::vector<std::pair<std::string, std::uint64_t>> memory;
  std::uint64_t bytes = 0;
};
inline constexpr double kMaxNapSeconds = 60;  // nap: due_in_s, min_rtt_s, wake_lead_s
struct NapArgs {
  bool begin = true;     // "begin" | "end"
  double due_in_s = 0;   // begin: (0, kMaxNapSeconds]
  double min_rtt_s = 0;  // begin: (0, kMaxNapSeconds]
  double wake_lead_s = 0;  // begin: [0, kMaxNapSeconds], default 0
};
using ControlArgs = std::variant<NoArgs, StatusArgs, HintArgs, KnobArgs, SubscribeArgs,
                                 ObjectArgs, TransferArgs, ServedArgs, NapArgs>;

// Checks the arguments of a request (the whole object) for `op`. Success: the typed arguments
// (the alternative documented for the op above). Failure: kInvalidArgument whose message says
// what is wrong and how it should look, without the op's name ("needs \"path\", ...").
Result<ControlArgs> ParseControlArgs(ControlOp op, const nlohmann::json& request);

// A checked request as the daemon's handler receives it.
struct ControlRequest {
  ControlOp op;
  ControlArgs args;             // the alternative for `op`
  const nlohmann::json& json;   // the whole request object (borrowed for the call)
  // The connection it came on: unique for the server's life, never 0 for a request the server
  // read (0: made up by the daemon). ControlServer::SetCloseHandler reports its end, so state a
  // client opens (a disclosed transfer) can end with it.
  std::uint64_t connection = 0;
};

// ---- Results that several programs read ----

struct KnobResult {
  int knob = 0;
  std::optional<int> previous;  // present after a set
  nlohmann::json ToJson() const;
  // kInvalidArgument unless `j` is an object with an integer "knob" (and "previous", if any).
  static Result<KnobResult> FromJson(const nlohmann::json& j);
};

// Where the daemon's cost model says a cached object should be read from.
enum class LookupChoice { kDisk, kNetwork };
struct LookupResult {
  bool cached = false;
  std::uint64_t size = 0;
  std::string response;  // the stored head (empty for objects ghostfs fetched itself)
  LookupChoice choice = LookupChoice::kDisk;
  std::string source;  // "disk" | "memory" | "network"
  bool ghost_hint = false;
  std::string etag, last_modified, content_type;
  std::optional<std::int64_t> expires_unix;
  std::string path;       // MOUNT/.ghost/objects/<hash>@<version>: opens only that version
  std::string body_path;  // the body file itself, or empty
  // A small body packed in the index (no file of its own), sent whole: "body_base64".
  std::optional<std::string> packed_body;
  std::string version;    // "d<inode>-<size>" (a body file) or "q<n>" (a queued fill)
  nlohmann::json cost;    // the cost model's estimates (null: not costed)
  // A miss asked with "begin_transfer": the transfer begun, and whether the daemon has a card.
  std::optional<std::uint64_t> transfer;
  std::optional<bool> card;
  // {"cached":false} when not cached (with "transfer" and "card" when set); else every field
  // above, "cost" only when costed and "body_path" and "body_base64" only when set (the
  // daemon's reply).
  nlohmann::json ToJson() const;
  // ToJson() as the control server writes a reply's result (common/control/control.cc,
  // DumpBodyLast: nlohmann's member order, "body_base64" last): the same bytes, written
  // without building the json. A cached answer's tree of members, its dump (the stored head
  // escaped a character at a time) and its cost object were ~25 % of ghostfs's CPU per lookup
  // of a packed hit (perf, round 20); the daemon replies with this (ControlServer::Reply::Text).
  std::string ToJsonText() const;
  // Tolerant of missing fields (they keep the defaults above); kInvalidArgument unless `j` is
  // an object whose fields, where present, have the types documented above.
  static Result<LookupResult> FromJson(const nlohmann::json& j);
};

// The "path" of a store result, the "transfer" of a transfer-begin result, the "key" of an
// objects event: kInvalidArgument when missing or of another type.
Result<std::string> StorePathFromJson(const nlohmann::json& result);
Result<std::uint64_t> TransferIdFromJson(const nlohmann::json& result);
// The "card" of a transfer-begin (or lookup) result: nullopt when absent (an older daemon:
// assume a card, whose data phase must be waited for).
std::optional<bool> TransferCardFromJson(const nlohmann::json& result);
Result<std::string> ObjectsEventKey(const nlohmann::json& data);

// Padded base64 of `bytes`, as "body_base64" carries a body (store's request, lookup's result).
std::string EncodeBase64(std::string_view bytes);

}  // namespace ghost

#endif  // GHOST_COMMON_CONTROL_PROTOCOL_H_
