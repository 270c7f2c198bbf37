#include "common/imap/imap_queue.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string_view>

#include "common/base/json_fields.h"

namespace ghost {
namespace {

std::uint64_t Fnv1a64(std::string_view a, std::string_view b) {
  std::uint64_t h = 1469598103934665603ull;
  for (std::string_view s : {a, b}) {
    for (unsigned char c : s) {
      h ^= c;
      h *= 1099511628211ull;
    }
  }
  return h;
}

std::string Hex64(std::uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

std::string Dump(const nlohmann::json& j) {
  // Keys are sorted (std::map), so a header dumps to the same bytes when it is read back;
  // names that are not UTF-8 are replaced rather than thrown on (they are informational).
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string EncodeOp(const ImapOp& op) {
  nlohmann::json h = {{"op", ImapOpKindName(op.kind)},
                      {"seq", op.seq},
                      {"origin", op.origin},
                      {"mailbox", op.mailbox},
                      {"body_bytes", op.body.size()}};
  if (op.uidvalidity) h["uidvalidity"] = op.uidvalidity;
  if (op.uid) h["uid"] = op.uid;
  if (!op.flags.empty() || op.kind == ImapOp::Kind::kStore) h["flags"] = op.flags;
  if (!op.remove_flags.empty()) h["remove_flags"] = op.remove_flags;
  if (!op.destination.empty()) h["destination"] = op.destination;
  if (op.internaldate) h["internaldate"] = op.internaldate;
  if (op.message_size) h["message_size"] = op.message_size;
  if (!op.local_name.empty()) h["local_name"] = op.local_name;
  std::string header = Dump(h);
  h["sum"] = Hex64(Fnv1a64(header, op.body));
  std::string record = Dump(h);
  record.push_back('\n');
  record += op.body;
  record.push_back('\n');
  return record;
}

bool KindFromName(const std::string& name, ImapOp::Kind* kind) {
  for (ImapOp::Kind k : {ImapOp::Kind::kAppend, ImapOp::Kind::kStore, ImapOp::Kind::kExpunge,
                         ImapOp::Kind::kMove, ImapOp::Kind::kCopy}) {
    if (name == ImapOpKindName(k)) {
      *kind = k;
      return true;
    }
  }
  return false;
}

Status WriteAll(int fd, const std::string& data, const std::string& path) {
  std::size_t done = 0;
  while (done < data.size()) {
    ssize_t n = ::write(fd, data.data() + done, data.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return Status::FromErrno(errno, "writing " + path);
    }
    done += static_cast<std::size_t>(n);
  }
  return Status::Ok();
}

}  // namespace

const char* ImapOpKindName(ImapOp::Kind kind) {
  switch (kind) {
    case ImapOp::Kind::kAppend: return "append";
    case ImapOp::Kind::kStore: return "store";
    case ImapOp::Kind::kExpunge: return "expunge";
    case ImapOp::Kind::kMove: return "move";
    case ImapOp::Kind::kCopy: return "copy";
  }
  return "?";
}

ImapQueue::ImapQueue(const ImapQueueOptions& options, PowerManager& pm, DeviceId net, Sender sender)
    : options_(options), pm_(pm), net_(net), sender_(std::move(sender)) {}

ImapQueue::~ImapQueue() {
  if (deadline_timer_ != kNoTimer) options_.clock->Cancel(deadline_timer_);
  if (subscription_) pm_.Unsubscribe(subscription_);
  if (fd_ >= 0) ::close(fd_);
}

Result<std::unique_ptr<ImapQueue>> ImapQueue::Open(const ImapQueueOptions& options, PowerManager& pm,
                                                   DeviceId net, Sender sender) {
  std::unique_ptr<ImapQueue> q(new ImapQueue(options, pm, net, std::move(sender)));
  q->fd_ = ::open(options.journal_path.c_str(), O_RDWR | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
  if (q->fd_ < 0) return Status::FromErrno(errno, "opening the IMAP journal " + options.journal_path);
  if (Status s = q->Replay(); !s.ok()) return s;
  int high = pm.device(net).profile().HighPowerMode();
  ImapQueue* self = q.get();
  q->subscription_ = pm.Subscribe(net, high, [self](DeviceId, int) {
    if (!self->pending_.empty()) self->Start(Why::kPowerCallback);
  });
  q->ArmDeadline();  // replayed operations wait no longer than new ones
  return q;
}

namespace {

// One record of the journal at `pos`: an operation (its header's checksum right, every field of
// its type) or an ack. `*end`: where the next record starts.
enum class Parsed { kOp, kAck, kDamaged };
Parsed ParseRecord(const std::string& data, std::size_t pos, ImapOp* op, std::uint64_t* ack, std::size_t* end,
                   std::string* why) {
  namespace jf = json_fields;
  const std::size_t nl = data.find('\n', pos);
  if (nl == std::string::npos) {
    *why = "an unterminated record header";
    return Parsed::kDamaged;
  }
  nlohmann::json h = nlohmann::json::parse(data.begin() + static_cast<std::ptrdiff_t>(pos),
                                           data.begin() + static_cast<std::ptrdiff_t>(nl), nullptr, false);
  if (h.is_discarded() || !h.is_object()) {
    *why = "a record header that is not JSON";
    return Parsed::kDamaged;
  }
  if (h.contains("ack")) {
    if (h.size() != 1 || !jf::As(h["ack"], ack)) {
      *why = "an ack that is not {\"ack\": SEQ}";
      return Parsed::kDamaged;
    }
    *end = nl + 1;
    return Parsed::kAck;
  }
  // The body's length first (the checksum covers the body), checked against what is left:
  // nl + 1 + body_bytes + 1 wraps for a huge one.
  std::uint64_t body_bytes = 0;
  std::string sum;
  if (!jf::As(h.value("body_bytes", nlohmann::json()), &body_bytes) || !jf::Get(h, "sum", &sum)) {
    *why = "a record header without its body's length";
    return Parsed::kDamaged;
  }
  if (body_bytes > data.size() - nl - 1 || data.size() - nl - 1 - body_bytes < 1 || data[nl + 1 + body_bytes] != '\n') {
    *why = "a record cut short";
    return Parsed::kDamaged;
  }
  h.erase("sum");
  std::string_view body(data.data() + nl + 1, body_bytes);
  if (sum != Hex64(Fnv1a64(Dump(h), body))) {
    *why = "a record with a bad checksum";
    return Parsed::kDamaged;
  }
  // Checked, so written by EncodeOp; still, a field of another type is a damaged record, not
  // nlohmann's type_error (which aborted the daemon at every mount).
  std::string kind;
  if (!jf::Get(h, "op", &kind) || !KindFromName(kind, &op->kind) || !jf::Get(h, "seq", &op->seq) ||
      !jf::Get(h, "origin", &op->origin) || !jf::Get(h, "mailbox", &op->mailbox) ||
      !jf::Get(h, "uidvalidity", &op->uidvalidity) || !jf::Get(h, "uid", &op->uid) ||
      !jf::Get(h, "flags", &op->flags) || !jf::Get(h, "remove_flags", &op->remove_flags) ||
      !jf::Get(h, "destination", &op->destination) || !jf::Get(h, "internaldate", &op->internaldate) ||
      !jf::Get(h, "message_size", &op->message_size) || !jf::Get(h, "local_name", &op->local_name)) {
    *why = "a record with a field of the wrong type";
    return Parsed::kDamaged;
  }
  op->body.assign(body);
  *end = nl + 1 + body_bytes + 1;
  return Parsed::kOp;
}

}  // namespace

Status ImapQueue::Replay() {
  struct stat st;
  if (::fstat(fd_, &st) != 0) return Status::FromErrno(errno, "stat " + options_.journal_path);
  std::string data(static_cast<std::size_t>(st.st_size), '\0');
  std::size_t got = 0;
  while (got < data.size()) {
    ssize_t n = ::pread(fd_, data.data() + got, data.size() - got, static_cast<off_t>(got));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Status::FromErrno(errno, "reading " + options_.journal_path);
    if (n == 0) break;
    got += static_cast<std::size_t>(n);
  }
  data.resize(got);
  std::size_t pos = 0;
  std::uint64_t max_seq = 0;
  bool skipped = false;       // a damaged region before a good record: the journal is rewritten
  bool after_damage = false;  // the records after one may have been sent (their acks lost)
  bool unkept = false;        // damage left in the journal: no compaction may drop it now
  while (pos < data.size()) {
    ImapOp op;
    std::uint64_t ack = 0;
    std::size_t end = 0;
    std::string why;
    Parsed p = ParseRecord(data, pos, &op, &ack, &end, &why);
    if (p == Parsed::kAck) {
      for (auto it = pending_.begin(); it != pending_.end(); ++it) {
        if (it->seq == ack) {
          pending_.erase(it);
          break;
        }
      }
      ++acks_since_compact_;
      pos = end;
      continue;
    }
    if (p == Parsed::kOp) {
      op.maybe_applied = after_damage;
      max_seq = std::max(max_seq, op.seq);
      pending_.push_back(std::move(op));
      pos = end;
      continue;
    }
    // A damaged record. At the tail it is most likely torn by a crash while it was written
    // (Add had not returned: the reader was never told it is done); anywhere else, or if it is
    // damage after all, it may hold a reader's change. Either way it is never just dropped: its
    // bytes go to JOURNAL.damaged, and replay goes on at the next line that starts a record
    // whose checksum is right (an ack cannot be told from a line of a message, so only an
    // operation resumes it; the acks in between are lost: those operations are sent again).
    std::size_t next = data.size();
    for (std::size_t nl = data.find('\n', pos); nl != std::string::npos && nl + 1 < data.size();
         nl = data.find('\n', nl + 1)) {
      ImapOp probe;
      std::uint64_t probe_ack;
      std::size_t probe_end;
      std::string probe_why;
      if (data[nl + 1] == '{' &&
          ParseRecord(data, nl + 1, &probe, &probe_ack, &probe_end, &probe_why) == Parsed::kOp) {
        next = nl + 1;
        break;
      }
    }
    const std::string aside = options_.journal_path + ".damaged";
    Status kept = KeepAside(aside, std::string_view(data).substr(pos, next - pos));
    std::string what = options_.journal_path + ": " + std::to_string(next - pos) + " bytes at offset " +
                       std::to_string(pos) + " (" + why + ")";
    if (!kept.ok()) {
      unkept = true;
      // Left where it is (the next open finds it again; records appended go after it).
      what += ", left in the journal: it could NOT be kept aside (" + kept.ToString() + ")";
    } else if (next == data.size()) {
      what += ", from a crash while it was written or damaged: cut off, kept in " + aside;
    } else {
      what += ", damaged: kept in " + aside + ", the records after it replayed";
      skipped = true;
    }
    after_damage = true;
    warnings_.push_back(what);
    std::fprintf(stderr, "ghostfs: IMAP journal %s\n", warnings_.back().c_str());
    if (kept.ok() && next == data.size()) {
      if (::ftruncate(fd_, static_cast<off_t>(pos)) != 0 || ::fdatasync(fd_) != 0) {
        return Status::FromErrno(errno, "repairing " + options_.journal_path);
      }
      break;
    }
    pos = next;
  }
  journal_size_ = pos;
  next_seq_ = max_seq + 1;
  stats_.replayed = pending_.size();
  // Operations are sent one at a time, oldest first: the first may have been with the server
  // when the last run stopped (its answer, or its ack, lost).
  if (!pending_.empty()) pending_.front().maybe_applied = true;
  // Acks and dropped records of the last run are not needed any more; a damaged region in the
  // middle goes too (its bytes kept aside above).
  if (!unkept && ((pending_.empty() && journal_size_ > 0) || skipped)) return Compact();
  return Status::Ok();
}

Status ImapQueue::KeepAside(const std::string& path, std::string_view bytes) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
  if (fd < 0) return Status::FromErrno(errno, "opening " + path);
  Status s = WriteAll(fd, std::string(bytes), path);
  if (s.ok() && ::fdatasync(fd) != 0) s = Status::FromErrno(errno, "syncing " + path);
  ::close(fd);
  return s;
}

Status ImapQueue::AppendRecord(const std::string& record) {
  if (Status s = WriteAll(fd_, record, options_.journal_path); !s.ok()) {
    // Whatever part of it reached the file is a torn tail: take it back.
    (void)!::ftruncate(fd_, static_cast<off_t>(journal_size_));
    return s;
  }
  if (::fdatasync(fd_) != 0) return Status::FromErrno(errno, "syncing " + options_.journal_path);
  journal_size_ += record.size();
  return Status::Ok();
}

Status ImapQueue::Compact() {
  ++stats_.compactions;
  acks_since_compact_ = 0;
  if (pending_.empty()) {
    if (::ftruncate(fd_, 0) != 0 || ::fdatasync(fd_) != 0) {
      return Status::FromErrno(errno, "truncating " + options_.journal_path);
    }
    journal_size_ = 0;
    return Status::Ok();
  }
  // The live records into a new file, which replaces the journal by rename: a crash leaves
  // the old journal or the new one, never a mix.
  std::string tmp = options_.journal_path + ".compact";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return Status::FromErrno(errno, "creating " + tmp);
  std::string all;
  for (const ImapOp& op : pending_) all += EncodeOp(op);
  Status s = WriteAll(fd, all, tmp);
  if (s.ok() && ::fdatasync(fd) != 0) s = Status::FromErrno(errno, "syncing " + tmp);
  ::close(fd);
  if (s.ok() && ::rename(tmp.c_str(), options_.journal_path.c_str()) != 0) {
    s = Status::FromErrno(errno, "renaming " + tmp);
  }
  if (!s.ok()) {
    ::unlink(tmp.c_str());
    return s;
  }
  std::string dir = options_.journal_path.substr(0, options_.journal_path.rfind('/') + 1);
  if (int dfd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC); dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
  int nfd = ::open(options_.journal_path.c_str(), O_RDWR | O_APPEND | O_CLOEXEC);
  if (nfd < 0) return Status::FromErrno(errno, "reopening " + options_.journal_path);
  ::close(fd_);
  fd_ = nfd;
  journal_size_ = all.size();
  return Status::Ok();
}

Result<std::uint64_t> ImapQueue::Add(ImapOp op) {
  op.seq = next_seq_;
  if (Status s = AppendRecord(EncodeOp(op)); !s.ok()) return s;
  ++next_seq_;
  ++stats_.added;
  std::uint64_t seq = op.seq;
  pending_.push_back(std::move(op));
  ArmDeadline();
  if (pending_.size() > options_.cap_ops || queued_bytes() > options_.cap_bytes) {
    Start(Why::kCap);
  } else if (NetworkAwake()) {
    Start(Why::kActive);
  }
  return seq;
}

void ImapQueue::Flush() {
  if (!pending_.empty()) Start(Why::kExplicit);
}

void ImapQueue::Flush(std::function<void(std::size_t left)> done) {
  std::uint64_t last = pending_.empty() ? 0 : pending_.back().seq;
  Start(Why::kExplicit);
  if (!sending_) return done(LeftOf(last));
  flush_waiters_.push_back({last, std::move(done)});
}

std::size_t ImapQueue::LeftOf(std::uint64_t last) const {
  std::size_t n = 0;
  for (const ImapOp& op : pending_) n += op.seq <= last;
  return n;
}

void ImapQueue::SettleWaiters(bool stopped) {
  // Moved out first: a waiter may call Flush again.
  std::vector<FlushWaiter> ready;
  for (auto it = flush_waiters_.begin(); it != flush_waiters_.end();) {
    if (stopped || pending_.empty() || pending_.front().seq > it->last) {
      ready.push_back(std::move(*it));
      it = flush_waiters_.erase(it);
    } else {
      ++it;
    }
  }
  for (FlushWaiter& w : ready) w.done(LeftOf(w.last));
}

Duration DeadlineFor(Duration deadline, int knob) {
  knob = std::clamp(knob, 0, 100);
  return deadline * (100 - knob) / 50;
}

Duration LoginBackoff(int failures) {
  if (failures <= 1) return Duration(0);
  if (failures > 9) return Seconds(300);
  return std::min<Duration>(Seconds(1 << (failures - 1)), Seconds(300));
}

void ImapQueue::ArmDeadline() {
  if (options_.clock == nullptr) return;
  if (pending_.empty()) {
    if (deadline_timer_ != kNoTimer) options_.clock->Cancel(deadline_timer_);
    deadline_timer_ = kNoTimer;
    return;
  }
  if (deadline_timer_ != kNoTimer || sending_) return;
  std::weak_ptr<int> alive = alive_;
  deadline_timer_ = options_.clock->ScheduleAfter(DeadlineFor(options_.deadline, pm_.knob()), [this, alive] {
    if (alive.expired()) return;
    deadline_timer_ = kNoTimer;
    Start(Why::kDeadline);
    if (!sending_) ArmDeadline();
  });
}

void ImapQueue::Stopped() {
  ArmDeadline();
  SettleWaiters(true);
}

Bytes ImapQueue::queued_bytes() const {
  Bytes total = 0;
  for (const ImapOp& op : pending_) total += op.bytes();
  return total;
}

bool ImapQueue::NetworkAwake() const {
  const Device& d = pm_.device(net_);
  int high = d.profile().HighPowerMode();
  return d.mode() == high && d.target_mode() == high;
}

void ImapQueue::Start(Why why) {
  if (sending_ || pending_.empty()) return;
  switch (why) {
    case Why::kPowerCallback: ++stats_.flushes_power_callback; break;
    case Why::kActive: ++stats_.flushes_active; break;
    case Why::kCap: ++stats_.flushes_cap; break;
    case Why::kExplicit: ++stats_.flushes_explicit; break;
    case Why::kDeadline: ++stats_.flushes_deadline; break;
  }
  sending_ = true;
  SendNext();
}

void ImapQueue::SendNext() {
  // A sender that answers inside its call would recurse once per operation: loop instead.
  while (sending_) {
    if (pending_.empty()) {
      sending_ = false;
      Stopped();
      return;
    }
    in_send_ = true;
    sent_inline_ = false;
    std::weak_ptr<int> alive = alive_;
    std::uint64_t seq = pending_.front().seq;
    auto answered = std::make_shared<bool>(false);
    sender_(pending_.front(), [this, alive, seq, answered](SendOutcome outcome) {
      if (alive.expired() || *answered) return;
      *answered = true;
      if (pending_.empty() || pending_.front().seq != seq) return;
      OnSent(outcome);
      if (in_send_) {
        sent_inline_ = true;  // the loop goes on
      } else {
        SendNext();
      }
    });
    if (alive.expired()) return;
    in_send_ = false;
    if (!sent_inline_) return;  // the answer comes later, from the loop
  }
}

void ImapQueue::OnSent(SendOutcome outcome) {
  if (outcome == SendOutcome::kRetryLater) {
    ++stats_.retries;
    // The try may have reached the server before the connection failed or timed out.
    pending_.front().maybe_applied = true;
    sending_ = false;
    Stopped();
    return;
  }
  std::uint64_t seq = pending_.front().seq;
  pending_.pop_front();
  if (outcome == SendOutcome::kDone) ++stats_.sent;
  else ++stats_.dropped;
  ++acks_since_compact_;
  Status s = (pending_.empty() || acks_since_compact_ >= options_.compact_after)
                 ? Compact()
                 : AppendRecord(Dump(nlohmann::json{{"ack", seq}}) + "\n");
  // A lost ack only means the operation is sent again after a crash (IMAP flag stores are
  // idempotent; a repeated APPEND is a duplicate, never a loss).
  if (!s.ok()) std::fprintf(stderr, "ghostfs: IMAP journal: %s\n", s.ToString().c_str());
  SettleWaiters(false);
}

}  // namespace ghost
