#include "proxy/imap_deferred.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <ctime>
#include <nlohmann/json.hpp>

#include "common/base/clock.h"
#include "common/imap/find_appended.h"
#include "common/imap/imap_client.h"
#include "common/power/device.h"
#include "common/power/power_manager.h"
#include "proxy/network_watch.h"

namespace ghost {

namespace {

// The mirror of ghostfs's network card: mode 0 its high-power mode, 1 anything lower. Its
// transitions are instant: the real card's costs are ghostfs's to account.
DeviceProfile MirrorProfile() {
  DeviceProfile p;
  p.name = "ghostfs-network";
  p.kind = DeviceKind::kNetwork;
  p.description = "ghostproxy's view of the network card of the running ghostfs";
  Mode high;
  high.name = "high";
  high.power = Power::Watts(1);
  high.serves_io = true;
  Mode low;
  low.name = "low";
  low.power = Power::Watts(0.1);
  p.modes = {high, low};
  p.transitions = {Transition{0, 1, Duration(0), Energy::Joules(0)},
                   Transition{1, 0, Duration(0), Energy::Joules(0)}};
  return p;
}

bool Transient(const Status& s) {
  return s.code() == Status::Code::kUnavailable || s.code() == Status::Code::kTimedOut ||
         s.code() == Status::Code::kCorruption;
}

}  // namespace

// One user's connection for sending the queue.
struct ImapDeferred::Upstream {
  std::unique_ptr<ImapClient> client;
  std::string mailbox;  // selected, with this UIDVALIDITY
  std::uint32_t uidvalidity = 0;
};

ImapDeferred::ImapDeferred(event_base* base, Clock* clock, CacheBackend* backend,
                           const ImapDeferredOptions& options)
    : base_(base), clock_(clock), backend_(backend), options_(options) {}

ImapDeferred::~ImapDeferred() {
  alive_.reset();
  watch_.reset();
  queue_.reset();  // unsubscribes from the mirror
  upstream_.clear();
  if (pm_ && net_id_ >= 0) pm_->Deregister(net_id_);
  pm_.reset();
  net_.reset();
}

Result<std::unique_ptr<ImapDeferred>> ImapDeferred::Open(event_base* base, Clock* clock,
                                                         CacheBackend* backend,
                                                         const ImapDeferredOptions& options) {
  std::unique_ptr<ImapDeferred> d(new ImapDeferred(base, clock, backend, options));
  d->pm_ = std::make_unique<PowerManager>(*clock, Power::Watts(0));
  d->net_ = std::make_unique<Device>(*clock, MirrorProfile(), &d->mirror_link_, /*initial_mode=*/1);
  d->net_id_ = d->pm_->Register(d->net_.get(), nullptr);
  ImapQueueOptions qo;
  qo.journal_path = options.journal_path;
  qo.cap_ops = options.cap_ops;
  qo.cap_bytes = options.cap_bytes;
  qo.clock = clock;
  qo.deadline = options.deadline;
  ImapDeferred* self = d.get();
  Result<std::unique_ptr<ImapQueue>> q =
      ImapQueue::Open(qo, *d->pm_, d->net_id_, [self](const ImapOp& op, std::function<void(SendOutcome)> done) {
        self->Send(op, std::move(done));
      });
  if (!q.ok()) return q.status().WithContext("imap_journal " + options.journal_path);
  d->queue_ = std::move(q).value();
  for (const std::string& w : d->queue_->warnings()) std::fprintf(stderr, "ghostproxy: imap: %s\n", w.c_str());
  if (!d->queue_->pending().empty()) {
    std::fprintf(stderr,
                 "ghostproxy: imap: %zu deferred changes from before a restart; each goes when its user logs in\n",
                 d->queue_->pending().size());
  }
  NetworkWatch::Handlers h;
  h.on_high = [self] {
    self->SetMirror(true);
  };
  h.on_flush = [self] { self->Flush("ghostctl flush"); };
  d->watch_ = std::make_unique<NetworkWatch>(base, backend, options.control_path, "imap", std::move(h));
  return d;
}

void ImapDeferred::SetMirror(bool high) {
  pm_->SetKnob(watch_ ? watch_->knob() : 50);
  // ghostfs's card entered its high-power mode: announced to the queue's subscription as the
  // mirror's entry into mode 0. The mirror itself stays in its low mode (its mode is only
  // asked by ImapQueue::Add, and the proxy adds only while the card is known to be low).
  if (high) pm_->Notify(net_id_, 0);
}

bool ImapDeferred::ShouldDefer() const { return watch_ && watch_->known() && !watch_->high(); }

void ImapDeferred::RememberLogin(const std::string& user, const std::string& password) {
  if (user.empty()) return;
  auto known = passwords_.find(user);
  bool same = known != passwords_.end() && known->second == password;
  passwords_[user] = password;
  // Only a password learned now can send what waited for it: a client logging in again (mbsync
  // and curl log in for every run) does not wake the card for changes the queue holds anyway.
  if (same) return;
  for (const ImapOp& op : queue_->pending()) {
    if (op.origin == user) return Flush("its user logged in");
  }
}

Result<std::uint64_t> ImapDeferred::Add(ImapOp op) {
  pm_->SetKnob(watch_ ? watch_->knob() : 50);
  Result<std::uint64_t> seq = queue_->Add(std::move(op));
  if (seq.ok()) ++stats_.deferred;
  return seq;
}

void ImapDeferred::Flush(const char* why, std::function<void(std::size_t)> done) {
  if (!queue_->pending().empty()) {
    std::fprintf(stderr, "ghostproxy: imap: sending %zu deferred changes (%s)\n", queue_->pending().size(), why);
  }
  if (done) return queue_->Flush(std::move(done));
  queue_->Flush();
}

void ImapDeferred::Overlay(const std::string& user, const std::string& mailbox, std::uint32_t uidvalidity,
                           std::uint32_t uid, std::vector<std::string>* flags) const {
  auto same = [](const std::string& a, const std::string& b) {
    return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
             return std::tolower(static_cast<unsigned char>(x)) == std::tolower(static_cast<unsigned char>(y));
           });
  };
  for (const ImapOp& op : queue_->pending()) {
    if (op.kind != ImapOp::Kind::kStore || op.origin != user || op.mailbox != mailbox ||
        op.uidvalidity != uidvalidity || op.uid != uid)
      continue;
    for (const std::string& f : op.flags) {
      if (std::none_of(flags->begin(), flags->end(), [&](const std::string& g) { return same(f, g); }))
        flags->push_back(f);
    }
    for (const std::string& f : op.remove_flags) {
      std::erase_if(*flags, [&](const std::string& g) { return same(f, g); });
    }
  }
}

void ImapDeferred::Conflict(const ImapOp& op, const std::string& why) {
  ++stats_.conflicts;
  nlohmann::json j = {{"op", ImapOpKindName(op.kind)}, {"user", op.origin},        {"mailbox", op.mailbox},
                      {"uidvalidity", op.uidvalidity},  {"uid", op.uid},           {"flags", op.flags},
                      {"remove_flags", op.remove_flags}, {"destination", op.destination},
                      {"why", why},                     {"unix", static_cast<std::int64_t>(std::time(nullptr))}};
  std::string line = j.dump() + "\n";
  std::string path = unapplied_path();
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
  bool written = fd >= 0 && ::write(fd, line.data(), line.size()) == static_cast<ssize_t>(line.size()) &&
                 ::fdatasync(fd) == 0;
  if (fd >= 0) ::close(fd);
  std::fprintf(stderr, "ghostproxy: imap: deferred %s of UID %u in %s for %s not applied: %s%s%s\n",
               ImapOpKindName(op.kind), op.uid, op.mailbox.c_str(), op.origin.c_str(), why.c_str(),
               written ? "; recorded in " : "; COULD NOT record it in ", path.c_str());
}

void ImapDeferred::Send(const ImapOp& op, std::function<void(SendOutcome)> done) {
  auto pw = passwords_.find(op.origin);
  if (pw == passwords_.end()) return done(SendOutcome::kRetryLater);  // until the user logs in
  std::unique_ptr<Upstream>& slot = upstream_[op.origin];
  if (!slot) {
    slot = std::make_unique<Upstream>();
    ImapClientOptions co;
    co.starttls = options_.starttls == 1   ? ImapClientOptions::StartTls::kRequired
                  : options_.starttls == 2 ? ImapClientOptions::StartTls::kNever
                                           : ImapClientOptions::StartTls::kIfAvailable;
    slot->client = std::make_unique<ImapClient>(base_, co);
  }
  Upstream* u = slot.get();
  ImapClient* c = u->client.get();
  if (c->state() == ImapClient::State::kDisconnected) {
    u->mailbox.clear();
    c->Connect(options_.origin_url, op.origin, pw->second, [](Status) {});
  }
  std::weak_ptr<int> alive = alive_;
  // Every outcome of the operation, once.
  auto result = [this, alive, op, c, done](Status s) {
    if (alive.expired()) return;
    if (s.ok()) return done(SendOutcome::kDone);
    if (Transient(s) || c->state() != ImapClient::State::kReady) {
      std::fprintf(stderr, "ghostproxy: imap: deferred %s for %s kept queued: %s\n", ImapOpKindName(op.kind),
                   op.origin.c_str(), s.ToString().c_str());
      return done(SendOutcome::kRetryLater);
    }
    Conflict(op, "refused by the server: " + s.message());
    done(SendOutcome::kDropped);
  };
  auto apply = [this, alive, op, c, result, done] {
    if (alive.expired()) return;
    // The message must still be there (a STORE to a UID that is gone succeeds silently); the
    // NOOP first lets the server tell this connection of expunges made by others meanwhile.
    c->Noop([this, alive, op, c, result, done](Status noop) {
      if (alive.expired()) return;
      if (!noop.ok()) return result(noop);
      ApplyToUid(op, c, result, done);
    });
  };
  if (op.kind == ImapOp::Kind::kAppend) {
    auto append = [this, alive, op, c, result] {
      std::optional<std::int64_t> date;
      if (op.internaldate) date = op.internaldate;
      c->Append(op.mailbox, op.flags, date, op.body, [this, alive, op, result](Result<AppendResult> r) {
        if (alive.expired()) return;
        if (r.ok() && r->uid != 0 && on_appended_) on_appended_(op, r->uidvalidity, r->uid);
        result(r.status());
      });
    };
    if (!op.maybe_applied) return append();
    // The last try may have reached the server (common/imap/find_appended.h): look first.
    InMailbox in_mailbox = [alive, u, c, op](std::function<void(Status)> step) {
      if (alive.expired()) return;
      if (u->mailbox == op.mailbox && c->selected() == op.mailbox) return step(Status::Ok());
      c->Select(op.mailbox, [alive, u, op, step](Result<MailboxStatus> st) {
        if (alive.expired()) return;
        if (!st.ok()) return step(st.status());
        u->mailbox = op.mailbox;
        u->uidvalidity = st->uidvalidity;
        step(Status::Ok());
      });
    };
    auto body = std::make_shared<const std::string>(op.body);
    // Not in its mailbox: another client may have moved it on since; looked for in the others.
    auto elsewhere = [this, alive, op, u, c, body, append, result] {
      c->List("", "*", [this, alive, op, u, c, body, append, result](Result<std::vector<MailboxInfo>> list) {
        if (alive.expired()) return;
        if (!list.ok()) return result(list.status());
        std::vector<std::string> others;
        for (const MailboxInfo& m : *list) {
          if (m.name != op.mailbox && !m.HasAttribute("\\Noselect") && !m.HasAttribute("\\NonExistent")) {
            others.push_back(m.name);
          }
        }
        SelectMailbox select = [alive, u, c](const std::string& wire, std::function<void(Status)> step) {
          c->Select(wire, [alive, u, wire, step](Result<MailboxStatus> st) {
            if (alive.expired()) return;
            if (!st.ok()) return step(st.status());
            u->mailbox = wire;
            u->uidvalidity = st->uidvalidity;
            step(Status::Ok());
          });
        };
        FindAppendedIn(*c, body, op.internaldate, std::move(others), std::move(select),
                       [this, alive, op, append, result](Result<std::string> box) {
                         if (alive.expired()) return;
                         if (!box.ok()) return result(box.status());
                         if (box->empty()) return append();
                         ++stats_.appends_found;
                         std::fprintf(stderr,
                                      "ghostproxy: imap: the deferred APPEND to %s for %s was on the server "
                                      "already, moved on to %s by another client (the answer to the last try "
                                      "was lost): not sent again\n",
                                      op.mailbox.c_str(), op.origin.c_str(), box->c_str());
                         result(Status::Ok());
                       });
      });
    };
    return FindAppended(*c, body, op.internaldate, in_mailbox,
                        [this, alive, op, u, elsewhere, result](Result<std::uint32_t> uid) {
                          if (alive.expired()) return;
                          if (!uid.ok()) return result(uid.status());
                          if (*uid == 0) return elsewhere();
                          ++stats_.appends_found;
                          std::fprintf(stderr,
                                       "ghostproxy: imap: the deferred APPEND to %s for %s was on the server "
                                       "already (UID %u; the answer to the last try was lost): not sent again\n",
                                       op.mailbox.c_str(), op.origin.c_str(), *uid);
                          if (on_appended_) on_appended_(op, u->uidvalidity, *uid);
                          result(Status::Ok());
                        });
  }
  if (u->mailbox == op.mailbox && u->uidvalidity == op.uidvalidity && c->selected() == op.mailbox) return apply();
  c->Select(op.mailbox, [this, alive, u, op, result, apply, done](Result<MailboxStatus> st) {
    if (alive.expired()) return;
    if (!st.ok()) return result(st.status());
    u->mailbox = op.mailbox;
    u->uidvalidity = st->uidvalidity;
    if (st->uidvalidity != op.uidvalidity) {
      Conflict(op, "the mailbox's UIDVALIDITY changed from " + std::to_string(op.uidvalidity) + " to " +
                       std::to_string(st->uidvalidity));
      return done(SendOutcome::kDropped);
    }
    apply();
  });
}

// Precondition: op.mailbox is selected on `c` with op.uidvalidity.
void ImapDeferred::ApplyToUid(const ImapOp& op, ImapClient* c, std::function<void(Status)> result,
                              std::function<void(SendOutcome)> done) {
  std::weak_ptr<int> alive = alive_;
  std::string set = std::to_string(op.uid);
  c->FetchSummary(set, [this, alive, op, c, set, result, done](Result<std::vector<MessageSummary>> r) {
    if (alive.expired()) return;
    if (!r.ok()) return result(r.status());
    if (r->empty()) {
      Conflict(op, "the message is gone from the server");
      return done(SendOutcome::kDropped);
    }
    switch (op.kind) {
      case ImapOp::Kind::kStore: {
        auto remove = [c, set, op, result](Status s) {
          if (!s.ok() || op.remove_flags.empty()) return result(s);
          c->UidStore(set, StoreMode::kRemove, op.remove_flags, result);
        };
        if (op.flags.empty()) return remove(Status::Ok());
        return c->UidStore(set, StoreMode::kAdd, op.flags, remove);
      }
      case ImapOp::Kind::kExpunge:
        return c->UidStore(set, StoreMode::kAdd, {"\\Deleted"}, [c, set, result](Status s) {
          if (!s.ok()) return result(s);
          c->UidExpunge(set, result);
        });
      case ImapOp::Kind::kMove:
        return c->UidMove(set, op.destination, [result](Result<MoveResult> m) { result(m.status()); });
      case ImapOp::Kind::kCopy:
        return c->UidCopy(set, op.destination, [result](Result<MoveResult> m) { result(m.status()); });
      case ImapOp::Kind::kAppend:
        break;
    }
    result(Status::Internal("unreachable"));
  });
}

}  // namespace ghost
