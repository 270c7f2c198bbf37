// ImapQueue: the deferred IMAP operations of a Maildir view (DESIGN §3.5 applied to the mail
// origin, §4.1 "writes to IMAP become deferred APPEND / flag / expunge operations").
//
// A reader's change to the Maildir (a message moved from tmp/ into new/ or cur/, a rename
// that changes the info flags, an unlink) becomes an ImapOp. The view shows the change at
// once; the operation waits here until the network is awake, because waking a card in its
// power-saving mode for one small command costs more than it saves (DESIGN §3.3: PSM→CAM is
// 400 ms and 510 mJ on the Cisco 350). The queue is sent, in order, one operation after the
// other,
//   - when the network device enters its high-power mode (a PowerManager subscription:
//     pushed, never polled, no timer),
//   - at Add, when the network is in its high-power mode already (and not heading down),
//   - at Add, when more than `cap_ops` operations or `cap_bytes` bytes are queued (the send
//     wakes the card, like a full write queue spins the disk up),
//   - on Flush() (the daemon calls it when its IMAP connection comes back, and at mount, and
//     for `ghostctl sync` / `flush`),
//   - at a deadline: no change waits forever because the card never needed its high-power
//     mode. With a `clock`, the oldest queued operation goes out at most DeadlineFor(knob)
//     after it was queued (or after the last try that could not reach the server): `deadline`
//     (default 60 s) at K=50, twice that at K=0, at once at K=100 (deadline * (100 - K) / 50).
//     One timer, armed only while something is queued.
// Operations are sent strictly in order, because later ones may depend on earlier ones (an
// APPEND and then a flag change of the same message).
//
// Durability: nothing a reader was told is done may be lost (DESIGN §2). Add returns only
// after the operation is in the journal and the journal is fdatasync'ed, so a crash (kill -9,
// power loss) after the rename or unlink returned replays it at the next Open. The journal is
// an append-only file of records:
//   {"op":..., "seq":N, ..., "body_bytes":B, "sum":"<fnv1a-64 of header and body>"}\n<B bytes>\n
//   {"ack":N}\n                                   (the operation N is done or dropped)
// Open replays it in order and keeps the operations with no ack. A torn tail (a crash in the
// middle of an append: an unterminated header, a short body, a bad checksum) is cut off with
// a warning; it was never acknowledged to the reader because Add had not returned. A damaged
// record anywhere (not JSON, a field of another type, a body length past the end, a bad
// checksum) is never just dropped, since it may be a reader's APPEND: its bytes are appended
// to JOURNAL.damaged, a warning names both files, and replay resumes at the next line that
// starts an operation with a right checksum (acks in between are lost: those operations go
// out again, marked maybe_applied); the journal is then rewritten without it. The
// journal is compacted once every operation is acknowledged (truncated to zero), or after
// `compact_after` acks (the live operations are rewritten into a new file that replaces the
// old one by rename), so it does not grow without bound.
//
// The sender (the daemon's IMAP side) performs one operation and says how it went:
//   kDone        the server has it: ack, next operation
//   kRetryLater  the server could not be reached (or dropped the connection): the operation
//                stays first in the queue and sending stops until the next trigger
//   kDropped     the server refused it for good (the message is gone, the mailbox does not
//                exist, UIDVALIDITY changed): ack it, count it, the sender logs why
//
// Thread-safety: not thread-safe; use from the thread that drives the PowerManager (the
// event loop). The sender's `done` must be called on that thread; it may be called inside the
// sender's call.
#ifndef GHOST_COMMON_IMAP_IMAP_QUEUE_H_
#define GHOST_COMMON_IMAP_IMAP_QUEUE_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/power/power_manager.h"
#include "common/base/status.h"
#include "common/base/units.h"

namespace ghost {

struct ImapOp {
  // kCopy: UID COPY of one message to `destination` (queued by ghostproxy's IMAP proxy).
  enum class Kind { kAppend, kStore, kExpunge, kMove, kCopy };
  std::uint64_t seq = 0;  // assigned by Add, increasing, unique in the journal's life
  Kind kind = Kind::kAppend;
  std::string origin;     // the origin's name
  std::string mailbox;    // wire name (modified UTF-7)
  // kStore, kExpunge, kMove, kCopy: the message, valid while its mailbox keeps this UIDVALIDITY.
  std::uint32_t uidvalidity = 0;
  std::uint32_t uid = 0;
  // kAppend: the message's flags; kStore: the flags to add (UID STORE +FLAGS) ...
  std::vector<std::string> flags;
  // ... and to remove (-FLAGS): only what the reader changed, so keywords survive.
  std::vector<std::string> remove_flags;
  std::string destination;        // kMove, kCopy: the destination mailbox's wire name
  // kAppend: the date to give it, seconds since the epoch (0 = the server's clock). kStore,
  // kExpunge, kMove: the message's INTERNALDATE as listed, and its RFC822.SIZE, which find it
  // again if the mailbox's UIDVALIDITY changes before the op is sent (fs/mail_tree.cc Resync).
  std::int64_t internaldate = 0;
  std::uint64_t message_size = 0;
  std::string local_name;         // kAppend: where the reader put it ("new/NAME", ".F/cur/NAME")
  std::string body;               // kAppend: the message (RFC 5322)
  // Not journaled. Set by the queue on the first operation replayed from the journal and on
  // one whose last try ended in kRetryLater: the server may have applied it without its answer
  // reaching us. A sender checks before repeating what is not idempotent (an APPEND: see
  // common/imap/find_appended.h).
  bool maybe_applied = false;

  Bytes bytes() const { return body.size() + 64; }  // what it weighs against cap_bytes
};

const char* ImapOpKindName(ImapOp::Kind kind);

enum class SendOutcome { kDone, kRetryLater, kDropped };

struct ImapQueueOptions {
  std::string journal_path;  // created if missing; its directory must exist
  // Queued operations / bytes above which Add sends at once, waking the network.
  std::size_t cap_ops = 64;
  Bytes cap_bytes = 4 * 1024 * 1024;
  // Acks written since the last compaction after which the journal is rewritten.
  std::size_t compact_after = 64;
  // The deadline timer's clock (borrowed; must outlive the queue); nullptr: no deadline.
  Clock* clock = nullptr;
  Duration deadline = Seconds(60);  // at K=50; see DeadlineFor
};

// How long the oldest queued operation may wait at knob `knob`: deadline * (100 - K) / 50.
Duration DeadlineFor(Duration deadline, int knob);

// How long to wait before the next LOGIN after `failures` refused logins in a row: none after
// the first (a reader's access right after it still gets the refusal), then 2 s, 4 s, 8 s ...
// up to 5 minutes, so a wrong password costs the server a few attempts a minute at most.
Duration LoginBackoff(int failures);

struct ImapQueueStats {
  std::uint64_t added = 0;
  std::uint64_t sent = 0;       // acknowledged by the server (kDone)
  std::uint64_t dropped = 0;    // refused for good (kDropped)
  std::uint64_t retries = 0;    // kRetryLater answers
  std::uint64_t replayed = 0;   // operations found in the journal at Open
  std::uint64_t flushes_power_callback = 0;  // the network entered its high-power mode
  std::uint64_t flushes_active = 0;          // Add found the network awake
  std::uint64_t flushes_cap = 0;
  std::uint64_t flushes_explicit = 0;
  std::uint64_t flushes_deadline = 0;  // the oldest operation reached its deadline
  std::uint64_t compactions = 0;
};

class ImapQueue {
 public:
  using Sender = std::function<void(const ImapOp& op, std::function<void(SendOutcome)> done)>;

  // Opens (creating if missing) the journal and replays it (see the header comment). Borrows
  // `pm`, which must outlive the queue; subscribes to device `net` entering its high-power
  // mode. Does not send anything yet: call Flush() once the sender is ready. Fails with the
  // errno's Status if the journal cannot be opened, read or repaired.
  [[nodiscard]] static Result<std::unique_ptr<ImapQueue>> Open(const ImapQueueOptions& options,
                                                               PowerManager& pm, DeviceId net,
                                                               Sender sender);
  ~ImapQueue();
  ImapQueue(const ImapQueue&) = delete;
  ImapQueue& operator=(const ImapQueue&) = delete;

  // Journals `op` (durable on return), queues it, and sends the queue if the network is awake
  // or the queue is over its cap. Returns the op's seq. On a journal write error nothing is
  // queued and the error is returned (the reader's change must then fail).
  [[nodiscard]] Result<std::uint64_t> Add(ImapOp op);
  // Sends the queue now (whatever the network's mode). No-op while sending or when empty.
  void Flush();
  // Flush, then `done(left)` once every operation queued at the call is sent (left 0), or
  // sending stopped because the server could not be reached (left: those of them still
  // queued). Operations added meanwhile are sent too but not waited for, so a reader that
  // keeps changing the Maildir cannot hold a `ghostctl sync` forever. At once when nothing is
  // queued.
  void Flush(std::function<void(std::size_t left)> done);

  // The operations not yet acknowledged, oldest first (the first may be with the sender).
  const std::deque<ImapOp>& pending() const { return pending_; }
  bool sending() const { return sending_; }
  const ImapQueueStats& stats() const { return stats_; }
  Bytes queued_bytes() const;
  // What Open repaired (a torn tail, a damaged record kept aside), one line each.
  const std::vector<std::string>& warnings() const { return warnings_; }
  std::uint64_t journal_size() const { return journal_size_; }

 private:
  enum class Why { kPowerCallback, kActive, kCap, kExplicit, kDeadline };
  // Arms the deadline timer for the oldest operation when none is armed; cancels it when the
  // queue is empty.
  void ArmDeadline();
  // Sending stopped: runs the Flush(done) waiters and re-arms the deadline.
  void Stopped();
  ImapQueue(const ImapQueueOptions& options, PowerManager& pm, DeviceId net, Sender sender);
  Status Replay();
  // Appends `bytes` (a damaged region of the journal) to `path` and syncs it.
  static Status KeepAside(const std::string& path, std::string_view bytes);
  Status AppendRecord(const std::string& record);
  Status Compact();
  void Start(Why why);
  void SendNext();
  void OnSent(SendOutcome outcome);
  bool NetworkAwake() const;

  const ImapQueueOptions options_;
  PowerManager& pm_;
  const DeviceId net_;
  Sender sender_;
  SubscriptionId subscription_ = 0;
  int fd_ = -1;
  std::uint64_t journal_size_ = 0;
  std::uint64_t next_seq_ = 1;
  std::size_t acks_since_compact_ = 0;
  std::deque<ImapOp> pending_;
  bool sending_ = false;
  bool in_send_ = false;     // inside sender_(...): a synchronous done() loops, not recurses
  bool sent_inline_ = false;
  ImapQueueStats stats_;
  std::vector<std::string> warnings_;
  TimerId deadline_timer_ = kNoTimer;
  struct FlushWaiter {
    std::uint64_t last = 0;  // the newest operation queued at its Flush
    std::function<void(std::size_t)> done;
  };
  // Runs the waiters whose operations are all sent (all of them once sending `stopped`).
  void SettleWaiters(bool stopped);
  std::size_t LeftOf(std::uint64_t last) const;  // queued operations up to seq `last`
  std::vector<FlushWaiter> flush_waiters_;
  // Sender callbacks hold a weak_ptr to this: once the queue is gone they do nothing.
  std::shared_ptr<int> alive_ = std::make_shared<int>(0);
};

}  // namespace ghost

#endif  // GHOST_COMMON_IMAP_IMAP_QUEUE_H_
