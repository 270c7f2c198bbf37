// ImapDeferred: the IMAP proxy's deferred changes (DESIGN §3.5 applied to mail clients, §4.1
// "writes to IMAP become deferred ... flag ... operations"): a client's flag change, answered at
// once while the network card is in its low-power mode, waits in the Maildir view's journaled
// queue (common/imap/imap_queue.h, reused whole: journal, replay, cap, knob-scaled deadline)
// until the card is awake anyway.
//
// The queue is the same class the Maildir view uses, with its own journal (`imap_journal`). It
// needs a PowerManager to learn the card's mode; the card is ghostfs's, so the queue gets a
// mirror: a PowerManager of this process with one two-mode network device, whose entry into its
// high-power mode is announced whenever ghostfs's card enters its own ("modes" events,
// proxy/network_watch.h), and whose knob is ghostfs's. So the queue is sent
//   - when ghostfs's network card enters its high-power mode (the mirror's mode change),
//   - when more than `cap_ops` operations are queued,
//   - at the deadline: `deadline` × (100 − K) / 50 after the oldest was queued (ImapQueue's
//     DeadlineFor, with ghostfs's knob K),
//   - on Flush: `ghostctl flush` / `ghostctl sync` (ghostfs publishes a flush event), SIGUSR1,
//   - at start when the journal holds operations from before a crash (after their user logs in
//     again: see below), and when a user's password changes.
//
// Credentials: each operation goes upstream in the name of the user whose client made it, over
// a connection of the proxy's own (common/imap/imap_client.h), logging in with the password the
// client gave at LOGIN / AUTHENTICATE PLAIN. The password is kept in RAM only, never in the
// journal: operations replayed after a restart wait (kRetryLater) until that user logs in
// through the proxy again.
//
// Conflicts: an operation whose message is gone upstream (the mailbox's UIDVALIDITY changed, or
// the UID no longer exists), or that the server refuses, is dropped from the queue and written,
// whole, with the reason, to `<imap_journal>.unapplied` (one JSON object a line), and counted;
// never silently lost.
//
// What the clients see stays consistent with what they were told: Overlay applies the queued
// flag changes to flags the server reports (FETCH FLAGS) until they are sent.
//
// Thread-safety: the proxy's loop thread only.
#ifndef GHOST_PROXY_IMAP_DEFERRED_H_
#define GHOST_PROXY_IMAP_DEFERRED_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/base/status.h"
#include "common/base/units.h"
#include "common/imap/imap_queue.h"
#include "common/power/profile.h"

struct event_base;

namespace ghost {

class CacheBackend;
class Clock;
class Device;
class ImapClient;
class NetworkWatch;
class PowerManager;

struct ImapDeferredOptions {
  std::string journal_path;     // [imap_journal] the queue's journal
  std::string origin_url;       // imap[s]://HOST:PORT/ (no user)
  std::string control_path;     // ghostfs's control socket ("" : no mode events)
  Duration deadline = Seconds(60);  // [imap_deadline] at K=50
  std::size_t cap_ops = 64;
  Bytes cap_bytes = 4 * 1024 * 1024;
  // STARTTLS on an imap:// origin (the proxy's imap_origin_starttls): 0 when offered, 1
  // required, 2 never (ImapClientOptions::StartTls's kIfAvailable, kRequired, kNever).
  int starttls = 0;
};

struct ImapDeferredStats {
  std::uint64_t deferred = 0;   // operations queued
  std::uint64_t conflicts = 0;  // dropped and recorded in the unapplied file
  std::uint64_t appends_found = 0;  // APPENDs in doubt found on the server, not sent again
};

class ImapDeferred {
 public:
  // Opens the journal (replaying it). `base`, `clock` and `backend` are borrowed and must
  // outlive this. Fails when the journal cannot be opened or repaired.
  [[nodiscard]] static Result<std::unique_ptr<ImapDeferred>> Open(event_base* base, Clock* clock,
                                                                  CacheBackend* backend,
                                                                  const ImapDeferredOptions& options);
  ~ImapDeferred();
  ImapDeferred(const ImapDeferred&) = delete;
  ImapDeferred& operator=(const ImapDeferred&) = delete;

  // Whether a change should be deferred now: the card is known to be out of its high-power
  // mode. False without mode events (nothing would send the queue but the deadline).
  bool ShouldDefer() const;
  // A client logged in as `user` with `password` (kept in RAM, replacing an older one). Sends
  // what waits for that user when the password is new (the first login since a restart, or a
  // changed password); another login with the same one leaves the queue to its triggers.
  void RememberLogin(const std::string& user, const std::string& password);
  bool CanSendFor(const std::string& user) const { return passwords_.count(user) != 0; }

  // Journals `op` (op.origin is the user), durable on return; see ImapQueue::Add.
  [[nodiscard]] Result<std::uint64_t> Add(ImapOp op);
  // Sends the queue now; `done(left)` once sending stops (may be empty).
  void Flush(const char* why, std::function<void(std::size_t left)> done = nullptr);

  // Applies the queued flag changes of (user, mailbox, uidvalidity, uid) to `flags`.
  void Overlay(const std::string& user, const std::string& mailbox, std::uint32_t uidvalidity,
               std::uint32_t uid, std::vector<std::string>* flags) const;

  // Called when a deferred APPEND has been made on the server with the UID it assigned
  // (APPENDUID; not called without one): the proxy stores the message in the cache under that
  // UID, so the next session reads it from the disk. `op` is the journaled operation.
  void set_on_appended(std::function<void(const ImapOp& op, std::uint32_t uidvalidity, std::uint32_t uid)> fn) {
    on_appended_ = std::move(fn);
  }

  const ImapQueue& queue() const { return *queue_; }
  const ImapDeferredStats& stats() const { return stats_; }
  std::string unapplied_path() const { return options_.journal_path + ".unapplied"; }

 private:
  struct Upstream;
  ImapDeferred(event_base* base, Clock* clock, CacheBackend* backend, const ImapDeferredOptions& options);
  void Send(const ImapOp& op, std::function<void(SendOutcome)> done);
  void ApplyToUid(const ImapOp& op, ImapClient* c, std::function<void(Status)> result,
                  std::function<void(SendOutcome)> done);
  void Conflict(const ImapOp& op, const std::string& why);
  void SetMirror(bool high);

  event_base* base_;
  Clock* clock_;
  CacheBackend* backend_;
  const ImapDeferredOptions options_;
  std::unique_ptr<PowerManager> pm_;
  Link mirror_link_;  // the mirror device's (unused: it carries no transfers)
  std::unique_ptr<Device> net_;
  int net_id_ = -1;
  std::unique_ptr<ImapQueue> queue_;
  std::unique_ptr<NetworkWatch> watch_;
  std::map<std::string, std::string> passwords_;            // by user, RAM only
  std::map<std::string, std::unique_ptr<Upstream>> upstream_;  // by user
  ImapDeferredStats stats_;
  std::function<void(const ImapOp&, std::uint32_t, std::uint32_t)> on_appended_;
  std::shared_ptr<int> alive_ = std::make_shared<int>(0);
};

}  // namespace ghost

#endif  // GHOST_PROXY_IMAP_DEFERRED_H_
