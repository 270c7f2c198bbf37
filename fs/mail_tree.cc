// IMAP origins as Maildirs: the namespace, the read path through the cost model and the cache
// store, and the deferred write operations. The design is in fs/mail_tree.h.
#include "fs/mail_tree.h"

#include <fcntl.h>
#include <strings.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <deque>
#include <fstream>
#include <set>

#include "common/base/json_fields.h"
#include "common/config/config.h"
#include "common/imap/find_appended.h"
#include "common/imap/maildir_names.h"
#include "common/cache/cache_store.h"
#include "common/config/config.h"
#include "fs/origin_tree.h"
#include "fs/write_back.h"

namespace ghost {

namespace {

constexpr double kMailAttrTimeout = 1.0;
const char kMailboxesPrefix[] = "imap-mailboxes:";
const char kListingPrefix[] = "imap-listing:";

bool IsSub(const std::string& s) { return s == "cur" || s == "new" || s == "tmp"; }

// A path inside a mail origin: [".Folder/"][sub["/" name]] (see mail_tree.h).
struct MailPath {
  std::string folder;  // "" (INBOX) or ".Name"
  std::string sub;     // "", "cur", "new" or "tmp"
  std::string name;    // a file in sub
};

MailPath Split(const std::string& path) {
  MailPath p;
  std::vector<std::string> parts;
  std::size_t start = 0;
  while (start <= path.size() && !path.empty()) {
    std::size_t slash = path.find('/', start);
    if (slash == std::string::npos) slash = path.size();
    parts.push_back(path.substr(start, slash - start));
    start = slash + 1;
  }
  std::size_t i = 0;
  if (i < parts.size() && parts[i].starts_with(".")) p.folder = parts[i++];
  if (i < parts.size()) p.sub = parts[i++];
  if (i < parts.size()) p.name = parts[i++];
  return p;
}

std::string Join(const MailPath& p) {
  std::string out = p.folder;
  for (const std::string* s : {&p.sub, &p.name}) {
    if (s->empty()) continue;
    if (!out.empty()) out += "/";
    out += *s;
  }
  return out;
}

std::string UniqueOf(const std::string& name) { return name.substr(0, name.find(':')); }

std::string InfoOf(const std::string& name) {
  std::size_t colon = name.find(":2,");
  return colon == std::string::npos ? std::string() : NormalizeInfo(name.substr(colon + 3));
}

// Writes `data` to `path` (created 0600; `flags` O_APPEND or O_TRUNC) and syncs it.
Status WriteDurably(const std::string& path, std::string_view data, int flags);

// An operation queued on a message the reader delivered, behind its APPEND (uid 0: the UID is
// known once the APPEND went through, MailOrigin::appended).
bool WaitsForAppend(const ImapOp& op, const std::string& origin, const std::string& wire, const std::string& unique) {
  return op.kind != ImapOp::Kind::kAppend && op.uid == 0 && op.origin == origin && op.mailbox == wire &&
         op.local_name == unique;
}

// The connection is gone or the server talks nonsense: the operation can be tried again.
bool Transient(const Status& s) {
  return s.code() == Status::Code::kUnavailable || s.code() == Status::Code::kTimedOut ||
         s.code() == Status::Code::kCorruption;
}

}  // namespace

struct MailMessage {
  std::string sub = "cur";
  std::string unique;  // the file name before ':'
  std::string info;    // Maildir info letters (the view: server flags plus pending changes)
  std::uint32_t uid = 0;  // 0: a message the reader wrote, not on the server yet
  Bytes size = 0;
  std::int64_t date = 0;
  std::vector<std::string> keywords;             // flags with no info letter
  std::shared_ptr<const std::string> body;       // uid 0: the reader's bytes
  std::string Name() const { return unique + ":2," + info; }
};

struct MailBox {
  std::string folder;  // "" or ".Name"
  std::string wire;    // the mailbox's wire name
  std::uint32_t uidvalidity = 0;
  std::map<std::string, MailMessage> messages;  // by unique name
  bool loaded = false, loading = false, again = false, offline = false;
  // Deleted on the server (by another client): no longer in its LIST, or its SELECT said it
  // does not exist. Hidden from the view (ENOENT, gone from readdir) but kept, because
  // callbacks in flight hold `MailBox&`; listed again (re-created), it is shown afresh.
  bool gone = false;
  TimePoint expires{};
  std::vector<std::function<void(Status)>> waiters;
  // Unseen messages a reader moved from new/ to cur/ (Maildir: seen by a reader, not read):
  // they stay in cur/ across refreshes (MaildirSubdirFor).
  std::set<std::uint32_t> left_new;
  // The cur/ and new/ directories' mtime: readers (Python's mailbox.Maildir) list a Maildir
  // again only when it moved forward, so every change of the view moves it.
  timespec mtime{};
  void Changed() { clock_gettime(CLOCK_REALTIME, &mtime); }

  MailMessage* FindUid(std::uint32_t uid) {
    for (auto& [u, m] : messages) {
      if (m.uid == uid) return &m;
    }
    return nullptr;
  }
};

struct MailOrigin {
  int index = -1;
  std::string name, url, user, password;
  std::unique_ptr<ImapClient> client;
  std::map<std::string, MailBox> boxes;  // by folder ("" = INBOX)
  std::map<std::string, char> delimiters;  // wire name -> hierarchy delimiter
  bool boxes_loaded = false, boxes_loading = false;
  TimePoint boxes_expires{};
  std::vector<std::function<void(Status)>> boxes_waiters;
  std::string selected;  // the mailbox the last Select was issued for
  std::uint32_t selected_uidvalidity = 0;
  int selects_outstanding = 0;  // 0 or 1: one Select at a time (MailTree::WithSelection)
  // Who waits for a mailbox to be selected, in order (MailTree::WithSelection).
  struct SelectWaiter {
    std::string wire;
    std::function<void(Result<MailboxStatus>)> fn;
  };
  std::deque<SelectWaiter> select_waiters;
  std::map<std::string, std::string> tmp;  // tmp/ files by path: their bytes
  // Local messages the server has now: "<wire>\n<unique>" -> (uidvalidity, uid).
  std::map<std::string, std::pair<std::uint32_t, std::uint32_t>> appended;
  Status last_error;
  // Refused logins in a row, and when the next LOGIN may be tried (EnsureConnected backoff).
  int login_failures = 0;
  TimePoint login_retry_at{};

  MailBox* BoxByWire(const std::string& wire) {
    for (auto& [f, b] : boxes) {
      if (b.wire == wire && !b.gone) return &b;
    }
    return nullptr;
  }
  // The mailbox shown as `folder` ("" = INBOX), or null when there is none or it is gone.
  MailBox* ShownBox(const std::string& folder) {
    auto it = boxes.find(folder);
    return it == boxes.end() || it->second.gone ? nullptr : &it->second;
  }
};

MailTree::MailTree(TreeContext ctx, OriginTree& reads) : ctx_(std::move(ctx)), reads_(reads) {}

MailTree::~MailTree() = default;

Result<std::unique_ptr<MailTree>> MailTree::Create(TreeContext ctx, OriginTree& reads) {
  std::unique_ptr<MailTree> t(new MailTree(std::move(ctx), reads));
  const TreeContext& d = t->ctx_;
  bool any = false;
  for (int i = 0; i < static_cast<int>(d.options.origins.size()); ++i) {
    const Origin& o = d.options.origins[i];
    t->origins_.emplace_back();
    if (!o.imap()) continue;
    any = true;
    Result<std::string> password = ReadOriginPassword(o);
    if (!password.ok()) return password.status();
    Result<ImapUrl> url = ParseImapUrl(o.url);
    if (!url.ok()) return url.status();
    auto mo = std::make_unique<MailOrigin>();
    mo->index = i;
    mo->name = o.name;
    mo->url = o.url;
    mo->user = url->user;
    mo->password = *password;
    ImapClientOptions co;
    co.ca_file = d.options.cacert;
    mo->client = std::make_unique<ImapClient>(d.loop, co);
    MailOrigin* raw = mo.get();
    MailTree* self = t.get();
    mo->client->SetEventHandler([self, raw](const MailboxEvent& e) { self->OnMailboxEvent(*raw, e); });
    mo->client->SetDisconnectHandler([raw](Status s) {
      std::fprintf(stderr, "ghostfs: %s: IMAP connection lost: %s\n", raw->name.c_str(), s.ToString().c_str());
      raw->selected.clear();
      raw->last_error = s;
    });
    MailBox inbox;
    inbox.wire = "INBOX";
    mo->boxes[""] = std::move(inbox);
    t->origins_.back() = std::move(mo);
  }
  if (!any) return t;
  Result<std::string> trash = ParseImapDelete(d.options.imap_delete);
  if (!trash.ok()) return trash.status();
  if (!trash->empty()) {
    Result<std::string> wire = EncodeMutf7(*trash);
    if (!wire.ok()) return Status::InvalidArgument("imap_delete: " + wire.status().message());
    t->trash_ = *wire;
  }
  t->unapplied_path_ = d.options.cache_dir + "/imap-unapplied.jsonl";
  ImapQueueOptions qo;
  qo.journal_path = d.options.cache_dir + "/imap-journal";
  qo.clock = &d.clock;  // queued operations go out by their deadline (60 s at K=50)
  Result<std::unique_ptr<ImapQueue>> q = ImapQueue::Open(
      qo, d.machine.pm(), d.machine.network_id(), [self = t.get()](const ImapOp& op, std::function<void(SendOutcome)> done) {
        self->Send(op, std::move(done));
      });
  if (!q.ok()) return q.status();
  t->queue_ = std::move(q).value();
  return t;
}

bool MailTree::IsMailOrigin(int origin) const { return OriginOf(origin) != nullptr; }

MailOrigin* MailTree::OriginOf(int origin) const {
  if (origin < 0 || origin >= static_cast<int>(origins_.size())) return nullptr;
  return origins_[origin].get();
}

void MailTree::Start() {
  // The UIDs of delivered messages that operations still queued wait for (written by Send
  // before the APPEND's ack): without them, a change the reader made to a message it delivered
  // would be dropped after a restart ("the appended message's UID is unknown").
  if (queue_) {
    std::string path = ctx_.options.cache_dir + "/imap-appended.jsonl";
    if (std::ifstream f(path); f) {
      // A whole line however long (a fixed buffer split a long mailbox or file name's line in
      // two, neither parsing: the UID was lost).
      std::size_t line_no = 0;
      for (std::string line; std::getline(f, line);) {
        ++line_no;
        // A line of the wrong shape (damage; nlohmann's value() threw type_error on a field of
        // another type, aborting ghostfs at every mount) is kept aside, named in the log: the
        // rewrite below keeps only the lines read, and one may be the UID a queued change of a
        // delivered message waits for.
        namespace jf = json_fields;
        nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
        std::string origin, wire, unique;
        std::uint32_t uidvalidity = 0, uid = 0;
        if (!j.is_object() || !jf::Get(j, "origin", &origin) || !jf::Get(j, "mailbox", &wire) ||
            !jf::Get(j, "unique", &unique) || !jf::Get(j, "uidvalidity", &uidvalidity) || !jf::Get(j, "uid", &uid)) {
          if (line.empty()) continue;
          std::string aside = path + ".damaged";
          Status st = WriteDurably(aside, line + "\n", O_APPEND);
          std::fprintf(stderr, "ghostfs: %s line %zu is damaged (not an appended message's UID): %s\n", path.c_str(),
                       line_no, st.ok() ? ("kept in " + aside).c_str() : ("NOT kept: " + st.ToString()).c_str());
          continue;
        }
        bool waited = false;
        for (const ImapOp& op : queue_->pending()) waited = waited || WaitsForAppend(op, origin, wire, unique);
        if (!waited) continue;
        for (auto& mo : origins_) {
          if (mo && mo->name == origin) mo->appended[wire + "\n" + unique] = {uidvalidity, uid};
        }
        appended_lines_.push_back({origin, wire, unique, line + "\n"});
      }
      f.close();
      PruneAppended(/*always=*/true);  // the lines kept above, or no file
    }
  }
  if (queue_ && !queue_->pending().empty()) {
    std::fprintf(stderr, "ghostfs: replaying %zu queued IMAP operations\n", queue_->pending().size());
    queue_->Flush();
  }
}

// ---- the connection ----

void MailTree::EnsureConnected(MailOrigin& mo) {
  if (mo.client->state() != ImapClient::State::kDisconnected) return;
  // A refused login is not tried again at once: readers meanwhile see what is cached.
  if (ctx_.clock.Now() < mo.login_retry_at) return;
  mo.selected.clear();
  mo.client->Connect(mo.url, mo.user, mo.password, [this, &mo](Status s) {
    if (ctx_.imap_outcome) ctx_.imap_outcome(mo.url, s.ok() || s.code() == Status::Code::kPermissionDenied, s);
    if (!s.ok()) {
      std::string next;
      if (s.code() == Status::Code::kPermissionDenied) {
        Duration wait = LoginBackoff(++mo.login_failures);
        mo.login_retry_at = ctx_.clock.Now() + wait;
        if (wait > Duration(0)) next = "; next try in " + std::to_string(ToSeconds(wait)).substr(0, 4) + " s";
      }
      std::fprintf(stderr, "ghostfs: %s: cannot log in to %s: %s%s\n", mo.name.c_str(), mo.url.c_str(),
                   s.ToString().c_str(), next.c_str());
      mo.last_error = s;
      return;
    }
    mo.login_failures = 0;
    mo.login_retry_at = {};
    mo.last_error = Status::Ok();
    // New mail is pushed while the connection has nothing else to do (RFC 2177).
    if (mo.client->capabilities().idle()) (void)mo.client->StartIdle();
    // Operations that waited for the server go out now that it answers.
    if (queue_) queue_->Flush();
  });
}

void MailTree::Selected(MailOrigin& mo, const std::string& wire, std::function<void(Result<std::uint32_t>)> fn) {
  WithSelection(mo, wire, false, [fn = std::move(fn)](Result<MailboxStatus> r) {
    if (!r.ok()) return fn(r.status());
    fn(r->uidvalidity);
  });
}

// Commands such as UID FETCH, UID STORE and UID EXPUNGE act on whichever mailbox the
// connection has selected when the server runs them, and the client sends them in the order
// they are issued, a Select alone. So a command that names a UID may be issued only while the
// last Select issued is its mailbox's: one issued from a Select's callback after another
// reader had issued a Select of another mailbox would run there, on another message (a body
// read from the wrong mailbox, a listing of the wrong mailbox, a flag or an expunge applied to
// another message). Hence one Select at a time, waiters in order: when it completes, everyone
// waiting for that mailbox runs (and issues its commands, which go out before the next
// Select), then the next mailbox is selected. `fresh`: select even if it is selected already
// (a listing wants the server's new state).
void MailTree::WithSelection(MailOrigin& mo, const std::string& wire, bool fresh,
                             std::function<void(Result<MailboxStatus>)> fn) {
  EnsureConnected(mo);
  if (!fresh && mo.selected == wire && mo.selects_outstanding == 0 && mo.select_waiters.empty() &&
      mo.client->state() == ImapClient::State::kReady) {
    MailboxStatus st;
    st.name = wire;
    st.uidvalidity = mo.selected_uidvalidity;
    return fn(std::move(st));
  }
  mo.select_waiters.push_back({wire, std::move(fn)});
  if (mo.selects_outstanding == 0) SelectNext(mo);
}

void MailTree::SelectNext(MailOrigin& mo) {
  if (mo.select_waiters.empty() || mo.selects_outstanding > 0) return;
  std::string wire = mo.select_waiters.front().wire;
  mo.selected = wire;
  ++mo.selects_outstanding;
  mo.client->Select(wire, [this, &mo, wire](Result<MailboxStatus> r) {
    if (r.ok()) {
      mo.selected_uidvalidity = r->uidvalidity;
    } else {
      mo.selected.clear();
      // NO [NONEXISTENT] (or dovecot's plain NO) to SELECT: deleted since it was listed.
      MailBox* b = mo.BoxByWire(wire);
      if (r.status().code() == Status::Code::kNotFound && b && !b->folder.empty()) Gone(mo, *b, r.status().message());
    }
    std::vector<std::function<void(Result<MailboxStatus>)>> ready;
    for (auto it = mo.select_waiters.begin(); it != mo.select_waiters.end();) {
      if (it->wire == wire) {
        ready.push_back(std::move(it->fn));
        it = mo.select_waiters.erase(it);
      } else {
        ++it;
      }
    }
    // Still counted as outstanding while they run: a WithSelection from one of them waits its
    // turn instead of issuing a Select ahead of the others' commands.
    for (auto& fn : ready) fn(r);
    --mo.selects_outstanding;
    SelectNext(mo);
  });
}

void MailTree::OnMailboxEvent(MailOrigin& mo, const MailboxEvent& e) {
  (void)e;
  ++idle_events_;
  MailBox* box = mo.BoxByWire(mo.selected);
  if (!box || !box->loaded) return;
  // Pushed by the server (new mail, an expunge, flags changed by another client): refresh.
  LoadBox(mo, *box, [](Status) {});
}

// ---- mailboxes and their summaries ----

void MailTree::WithMailboxes(MailOrigin& mo, std::function<void(Status)> then) {
  if (mo.boxes_loaded && mo.boxes_expires > ctx_.clock.Now()) return then(Status::Ok());
  mo.boxes_waiters.push_back(std::move(then));
  if (mo.boxes_loading) return;
  mo.boxes_loading = true;
  EnsureConnected(mo);
  auto finish = [&mo](Status s) {
    mo.boxes_loading = false;
    auto waiters = std::move(mo.boxes_waiters);
    for (auto& w : waiters) w(s);
  };
  auto apply = [this, &mo](const std::vector<std::pair<std::string, char>>& list) {
    std::set<std::string> listed;
    for (const auto& [wire, delim] : list) {
      mo.delimiters[wire] = delim;
      if (IsInbox(wire)) continue;
      Result<std::string> dir = MailboxToDirName(wire, delim);
      if (!dir.ok()) {
        std::fprintf(stderr, "ghostfs: %s: mailbox \"%s\" not shown: %s\n", mo.name.c_str(), wire.c_str(),
                     dir.status().message().c_str());
        continue;
      }
      listed.insert(*dir);
      MailBox& b = mo.boxes[*dir];
      if (b.gone) {
        // Deleted and made again: a new mailbox (its UIDVALIDITY tells LoadBox so), loaded
        // before it is shown, never the old listing.
        std::fprintf(stderr, "ghostfs: %s: mailbox %s is on the server again\n", mo.name.c_str(), wire.c_str());
        b.gone = false;
        b.loaded = false;
        b.offline = false;
        b.messages.clear();
        b.expires = TimePoint{};
        b.Changed();
      }
      b.folder = *dir;
      b.wire = wire;
    }
    for (auto& [folder, b] : mo.boxes) {
      if (!folder.empty() && !b.gone && !listed.count(folder)) Gone(mo, b, "not in the server's LIST any more");
    }
    mo.boxes_loaded = true;
  };
  mo.client->List("", "*", [this, &mo, finish, apply](Result<std::vector<MailboxInfo>> r) {
    if (r.ok()) {
      std::vector<std::pair<std::string, char>> list;
      nlohmann::json saved = nlohmann::json::array();
      for (const MailboxInfo& m : *r) {
        list.emplace_back(m.name, m.delimiter);
        saved.push_back({m.name, std::string(1, m.delimiter)});
      }
      apply(list);
      mo.boxes_expires = ctx_.clock.Now() + ctx_.options.heuristic_freshness;
      std::string key = kMailboxesPrefix + mo.url;
      ctx_.write_back.QueueWholeFill(key, saved.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace),
                        "application/json");
      return finish(Status::Ok());
    }
    // Unreachable: the list saved with the cache, if any (disconnected operation).
    std::string key = kMailboxesPrefix + mo.url;
    const CacheEntry* e = ctx_.store.index().Find(key);
    if (!e || mo.boxes_loaded) return finish(mo.boxes_loaded ? Status::Ok() : r.status());
    auto buf = std::make_shared<std::string>(e->size, '\0');
    ctx_.store.ReadBody(key, 0, std::span<char>(buf->data(), buf->size()),
                        [buf, finish, apply, st = r.status(), name = mo.name, key](Result<std::size_t> n) {
                          if (!n.ok()) return finish(st);
                          buf->resize(*n);
                          // A saved list of the wrong shape (damaged, or put under its key by a
                          // control client's "store"): get<>() threw type_error on an entry of
                          // another type (ghostfs aborted), m[1] of a short entry read past it.
                          // Not used: the folders known stay, the next LIST replaces it.
                          nlohmann::json j = nlohmann::json::parse(*buf, nullptr, false);
                          std::vector<std::pair<std::string, char>> list;
                          bool bad = !j.is_array();
                          for (std::size_t i = 0; !bad && i < j.size(); ++i) {
                            std::string folder, delim;
                            if (!j[i].is_array() || j[i].size() != 2 || !json_fields::As(j[i][0], &folder) ||
                                !json_fields::As(j[i][1], &delim)) {
                              bad = true;
                              break;
                            }
                            list.emplace_back(std::move(folder), delim.empty() ? '\0' : delim[0]);
                          }
                          if (bad) {
                            std::fprintf(stderr, "ghostfs: %s: the saved list of mailboxes (cached as %s) is damaged; not used\n",
                                         name.c_str(), key.c_str());
                            return finish(st);
                          }
                          apply(list);
                          finish(Status::Ok());
                        });
  });
}

void MailTree::WithBox(MailOrigin& mo, const std::string& folder, bool force,
                       std::function<void(Result<MailBox*>)> then) {
  auto with_box = [this, &mo, folder, force, then](Status listed) {
    MailBox* shown = mo.ShownBox(folder);
    if (!shown) return then(listed.ok() ? Status::NotFound(folder) : listed);
    MailBox& box = *shown;
    if (box.loaded && !force && box.expires > ctx_.clock.Now()) return then(&box);
    LoadBox(mo, box, [&box, folder, then](Status s) {
      if (box.gone) return then(Status::NotFound(folder + ": deleted on the server"));
      if (!s.ok() && !box.loaded) return then(s);
      then(&box);  // a failed refresh keeps showing what was known
    });
  };
  if (folder.empty()) return with_box(Status::Ok());
  WithMailboxes(mo, with_box);
}

void MailTree::Gone(MailOrigin& mo, MailBox& box, const std::string& why) {
  box.gone = true;
  box.loaded = false;
  box.messages.clear();
  box.left_new.clear();
  box.Changed();
  mo.boxes_expires = TimePoint{};  // the next lookup lists again: it may have been made again
  std::size_t queued = 0;
  if (queue_) {
    for (const ImapOp& op : queue_->pending()) {
      if (op.origin == mo.name && (op.mailbox == box.wire || op.destination == box.wire)) ++queued;
    }
  }
  std::fprintf(stderr, "ghostfs: %s: mailbox %s was deleted on the server (%s): %s is gone from the view%s\n",
               mo.name.c_str(), box.wire.c_str(), why.c_str(), box.folder.c_str(),
               queued ? ("; " + std::to_string(queued) +
                         " queued operation(s) on it are sent as they are, and any the server refuses "
                         "is recorded in " + unapplied_path_).c_str()
                      : "");
}

void MailTree::LoadBox(MailOrigin& mo, MailBox& box, std::function<void(Status)> then) {
  box.waiters.push_back(std::move(then));
  if (box.loading) {
    box.again = true;  // something changed while loading: load once more after
    return;
  }
  box.loading = true;
  box.again = false;
  ++refreshes_;
  auto finish = [this, &mo, &box](Status s) {
    box.loading = false;
    auto waiters = std::move(box.waiters);
    for (auto& w : waiters) w(s);
    if (box.again) LoadBox(mo, box, [](Status) {});
  };
  WithSelection(mo, box.wire, true, [this, &mo, &box, finish](Result<MailboxStatus> st) {
    if (!st.ok()) {
      if (Transient(st.status()) || st.status().code() == Status::Code::kInvalidArgument ||
          st.status().code() == Status::Code::kPermissionDenied) {
        return LoadSavedBox(mo, box, st.status(), finish);
      }
      return finish(st.status());  // NotFound: the box is gone now (SelectNext)
    }
    std::uint32_t uidvalidity = st->uidvalidity;
    auto install = [this, &mo, &box, uidvalidity, finish](const std::vector<MessageSummary>& list) {
      if (box.uidvalidity && box.uidvalidity != uidvalidity) {
        // Every UID changed meaning: the old names are gone (the old cache keys stay, so
        // Resync can read a message's Message-ID). Changes still queued for the old UIDs are
        // found again or kept when sent (MailTree::Resync), never applied to another message.
        ++uidvalidity_changes_;
        std::fprintf(stderr, "ghostfs: %s: mailbox %s changed UIDVALIDITY %u -> %u: resynchronised\n",
                     mo.name.c_str(), box.wire.c_str(), box.uidvalidity, uidvalidity);
      }
      if (box.uidvalidity != uidvalidity) box.left_new.clear();
      box.uidvalidity = uidvalidity;
      box.messages.clear();
      for (const MessageSummary& m : list) {
        MailMessage msg;
        msg.uid = m.uid;
        msg.size = m.size;
        msg.date = m.internaldate_unix;
        msg.info = FlagsToInfo(m.flags, &msg.keywords);
        msg.sub = MaildirSubdirFor(msg.info, box.left_new.count(m.uid) > 0);
        MaildirFileName n{uidvalidity, m.uid, m.size, ""};
        msg.unique = UniqueOf(FormatMaildirFileName(n));
        box.messages[msg.unique] = std::move(msg);
      }
      box.loaded = true;
      box.offline = false;
      box.Changed();
      box.expires = ctx_.clock.Now() + ctx_.options.heuristic_freshness;
      SaveBox(mo, box);
      ApplyPending(mo, box);
      finish(Status::Ok());
    };
    if (st->exists == 0) return install({});
    mo.client->FetchSummary("1:*", [this, &mo, &box, install, finish](Result<std::vector<MessageSummary>> r) {
      if (!r.ok()) {
        std::fprintf(stderr, "ghostfs: %s: listing %s: %s\n", mo.name.c_str(), box.wire.c_str(),
                     r.status().ToString().c_str());
        if (Transient(r.status())) return LoadSavedBox(mo, box, r.status(), finish);
        return finish(r.status());
      }
      install(*r);
    });
  });
}

void MailTree::SaveBox(MailOrigin& mo, const MailBox& box) {
  nlohmann::json msgs = nlohmann::json::array();
  for (const auto& [u, m] : box.messages) {
    if (m.uid) msgs.push_back({m.uid, m.size, m.info, m.date});
  }
  std::string body = nlohmann::json{{"uidvalidity", box.uidvalidity}, {"messages", msgs}}.dump();
  ctx_.write_back.QueueWholeFill(kListingPrefix + mo.url + box.wire, std::move(body), "application/json");
}

void MailTree::LoadSavedBox(MailOrigin& mo, MailBox& box, Status why, std::function<void(Status)> then) {
  std::fprintf(stderr, "ghostfs: %s: %s unreachable (%s)%s\n", mo.name.c_str(), box.wire.c_str(),
               why.message().c_str(), box.loaded ? "; showing what was known" : "; using the saved listing");
  if (box.loaded) return then(Status::Ok());
  std::string key = kListingPrefix + mo.url + box.wire;
  const CacheEntry* e = ctx_.store.index().Find(key);
  if (!e) return then(why);
  auto buf = std::make_shared<std::string>(e->size, '\0');
  ctx_.store.ReadBody(key, 0, std::span<char>(buf->data(), buf->size()),
                      [this, &mo, &box, buf, why, then](Result<std::size_t> n) {
                        if (!n.ok()) return then(why);
                        buf->resize(*n);
                        // A saved listing of the wrong shape (damaged, or put under its key by
                        // a control client's "store") is no listing: value() and get<>() threw
                        // type_error on a field of another type (ghostfs aborted), and m[0]..m[3]
                        // of a short entry read past it. The server being down, the box shows
                        // what is cached otherwise (then(why)); the listing is the server's, so
                        // nothing of the reader's is lost, and the next listing replaces it.
                        namespace jf = json_fields;
                        const nlohmann::json j = nlohmann::json::parse(*buf, nullptr, false);
                        std::uint32_t uidvalidity = 0;
                        std::map<std::string, MailMessage> messages;
                        const char* bad = nullptr;
                        if (!j.is_object()) bad = "not a JSON object";
                        else if (!jf::Get(j, "uidvalidity", &uidvalidity)) bad = "uidvalidity";
                        else if (!j.contains("messages") || !j["messages"].is_array()) bad = "messages";
                        for (std::size_t i = 0; !bad && i < j["messages"].size(); ++i) {
                          const nlohmann::json& m = j["messages"][i];
                          MailMessage msg;
                          if (!m.is_array() || m.size() != 4 || !jf::As(m[0], &msg.uid) || !jf::As(m[1], &msg.size) ||
                              !jf::As(m[2], &msg.info) || !jf::As(m[3], &msg.date)) {
                            bad = "a message";
                            break;
                          }
                          msg.sub = MaildirSubdirFor(msg.info, box.left_new.count(msg.uid) > 0);
                          msg.unique = UniqueOf(FormatMaildirFileName({uidvalidity, msg.uid, msg.size, ""}));
                          messages[msg.unique] = std::move(msg);
                        }
                        if (bad) {
                          std::fprintf(stderr, "ghostfs: %s: the saved listing of %s (cached as %s) is damaged (%s); not used\n",
                                       mo.name.c_str(), box.wire.c_str(), (kListingPrefix + mo.url + box.wire).c_str(), bad);
                          return then(why);
                        }
                        box.uidvalidity = uidvalidity;
                        box.messages = std::move(messages);
                        box.loaded = true;
                        box.offline = true;
                        box.Changed();
                        box.expires = ctx_.clock.Now();  // try the server again next time
                        ApplyPending(mo, box);
                        then(Status::Ok());
                      });
}

// The view shows queued changes at once: the server's summary plus what is still queued.
void MailTree::ApplyPending(MailOrigin& mo, MailBox& box) {
  if (!queue_) return;
  for (const ImapOp& op : queue_->pending()) {
    if (op.origin != mo.name || op.mailbox != box.wire) continue;
    MailMessage* m = nullptr;
    if (op.kind != ImapOp::Kind::kAppend) {
      if (op.uid) {
        if (op.uidvalidity == box.uidvalidity) m = box.FindUid(op.uid);
      } else if (auto it = box.messages.find(op.local_name); it != box.messages.end()) {
        m = &it->second;
      }
    }
    switch (op.kind) {
      case ImapOp::Kind::kAppend: {
        std::string name = op.local_name.substr(op.local_name.rfind('/') + 1);
        MailMessage msg;
        msg.sub = op.local_name.substr(0, op.local_name.find('/'));
        msg.unique = UniqueOf(name);
        msg.info = InfoOf(name);
        msg.size = op.body.size();
        msg.date = op.internaldate;
        msg.body = std::make_shared<const std::string>(op.body);
        box.messages[msg.unique] = std::move(msg);
        break;
      }
      case ImapOp::Kind::kStore: {
        if (!m) break;
        std::string info = m->info + FlagsToInfo(op.flags);
        std::string removed = FlagsToInfo(op.remove_flags);
        std::erase_if(info, [&](char c) { return removed.find(c) != std::string::npos; });
        m->info = NormalizeInfo(info);
        break;
      }
      case ImapOp::Kind::kExpunge:
      case ImapOp::Kind::kMove:
        if (m) box.messages.erase(m->unique);
        break;
      case ImapOp::Kind::kCopy:  // queued by ghostproxy only, never by the Maildir view
        break;
    }
  }
}

std::string MailTree::BodyKey(const MailOrigin& mo, const std::string& wire, std::uint32_t uidvalidity,
                              std::uint32_t uid) const {
  return mo.url + wire + ";UIDVALIDITY=" + std::to_string(uidvalidity) + ";UID=" + std::to_string(uid);
}

// ---- attributes ----

void MailTree::ReplyMessageEntry(fuse_req_t req, MailOrigin& mo, const std::string& path, Bytes size,
                                 std::int64_t mtime) {
  Node* n = ctx_.inodes.Lookup(NodeKind::kMailFile, mo.index, path);
  fuse_entry_param e = NodeEntry(n, FileStat(n->ino, size, 0644, mtime));
  e.attr_timeout = e.entry_timeout = kMailAttrTimeout;
  fuse_reply_entry(req, &e);
}

void MailTree::Lookup(fuse_req_t req, Node* parent, const char* name_c) {
  MailOrigin* mo = OriginOf(parent->origin);
  if (!mo) return (void)fuse_reply_err(req, ENOENT);
  std::string name = name_c;
  MailPath p = Split(parent->path);
  int origin = parent->origin;
  auto dir_entry = [this, req, origin](const std::string& path) {
    Node* n = ctx_.inodes.Lookup(NodeKind::kMailDir, origin, path);
    fuse_entry_param e = NodeEntry(n, DirStat(n->ino, 0755));
    MailPath c = Split(path);
    if (c.sub == "cur" || c.sub == "new") e.attr_timeout = 0;  // their mtime: see Getattr
    fuse_reply_entry(req, &e);
  };
  if (p.sub.empty()) {
    if (IsSub(name)) {
      MailPath c = p;
      c.sub = name;
      return dir_entry(Join(c));
    }
    if (!p.folder.empty() || !name.starts_with(".")) return (void)fuse_reply_err(req, ENOENT);
    return WithMailboxes(*mo, [mo, name, dir_entry, req](Status s) {
      if (mo->ShownBox(name)) return dir_entry(name);
      fuse_reply_err(req, s.ok() ? ENOENT : s.ToErrno());
    });
  }
  MailPath c = p;
  c.name = name;
  std::string path = Join(c);
  if (p.sub == "tmp") {
    auto t = mo->tmp.find(path);
    if (t == mo->tmp.end()) return (void)fuse_reply_err(req, ENOENT);
    return ReplyMessageEntry(req, *mo, path, t->second.size(), UnixNow());
  }
  WithBox(*mo, p.folder, false, [this, req, mo, p, name, path](Result<MailBox*> b) {
    if (!b.ok()) return (void)fuse_reply_err(req, b.status().ToErrno());
    auto it = (*b)->messages.find(UniqueOf(name));
    if (it == (*b)->messages.end() || it->second.sub != p.sub || it->second.Name() != name) {
      return (void)fuse_reply_err(req, ENOENT);
    }
    ReplyMessageEntry(req, *mo, path, it->second.size, it->second.date);
  });
}

void MailTree::Getattr(fuse_req_t req, Node* n) {
  MailOrigin* mo = OriginOf(n->origin);
  if (!mo) return (void)fuse_reply_err(req, ESTALE);
  MailPath p = Split(n->path);
  if (n->kind == NodeKind::kMailDir) {
    struct stat st = DirStat(n->ino, 0755);
    if (p.sub != "cur" && p.sub != "new") return (void)fuse_reply_attr(req, &st, kMailAttrTimeout);
    // Attributes of cur/ and new/ are not cached: their mtime is how readers see new mail, so
    // the summary is loaded before the first answer.
    return WithBox(*mo, p.folder, false, [req, st](Result<MailBox*> b) mutable {
      if (b.ok()) st.st_mtim = st.st_ctim = (*b)->mtime;
      fuse_reply_attr(req, &st, 0);
    });
  }
  fuse_ino_t ino = n->ino;
  if (p.sub == "tmp") {
    auto t = mo->tmp.find(n->path);
    if (t == mo->tmp.end()) return (void)fuse_reply_err(req, ENOENT);
    struct stat st = FileStat(ino, t->second.size(), 0644, UnixNow());
    return (void)fuse_reply_attr(req, &st, 0);
  }
  WithBox(*mo, p.folder, false, [this, req, ino, p](Result<MailBox*> b) {
    if (!b.ok()) return (void)fuse_reply_err(req, b.status().ToErrno());
    auto it = (*b)->messages.find(UniqueOf(p.name));
    if (it == (*b)->messages.end()) return (void)fuse_reply_err(req, ENOENT);
    struct stat st = FileStat(ino, it->second.size, 0644, it->second.date);
    fuse_reply_attr(req, &st, kMailAttrTimeout);
  });
}

void MailTree::Setattr(fuse_req_t req, Node* n, struct stat* attr, int to_set, fuse_file_info*) {
  MailOrigin* mo = OriginOf(n->origin);
  if (!mo) return (void)fuse_reply_err(req, ESTALE);
  if (n->kind == NodeKind::kMailDir) {
    struct stat st = DirStat(n->ino, 0755);
    return (void)fuse_reply_attr(req, &st, kMailAttrTimeout);
  }
  auto t = mo->tmp.find(n->path);
  if (t != mo->tmp.end()) {
    if (to_set & FUSE_SET_ATTR_SIZE) t->second.resize(static_cast<std::size_t>(attr->st_size));
    struct stat st = FileStat(n->ino, t->second.size(), 0644, UnixNow());
    return (void)fuse_reply_attr(req, &st, 0);
  }
  // A message's bytes never change (IMAP messages are immutable); times and modes that
  // readers set are accepted and not kept.
  if (to_set & FUSE_SET_ATTR_SIZE) return (void)fuse_reply_err(req, EPERM);
  Getattr(req, n);
}

void MailTree::Readdir(fuse_req_t req, Node* n, size_t size, off_t off, fuse_file_info*) {
  MailOrigin* mo = OriginOf(n->origin);
  if (!mo) return (void)fuse_reply_err(req, ESTALE);
  MailPath p = Split(n->path);
  fuse_ino_t ino = n->ino;
  using Entries = std::vector<std::pair<std::string, mode_t>>;
  if (p.sub.empty()) {
    Entries entries = {{"cur", S_IFDIR}, {"new", S_IFDIR}, {"tmp", S_IFDIR}};
    if (!p.folder.empty()) return ReplyDirEntries(req, ino, size, off, entries);
    return WithMailboxes(*mo, [this, mo, req, ino, size, off, entries](Status) mutable {
      for (const auto& [folder, box] : mo->boxes) {
        if (!folder.empty() && !box.gone) entries.emplace_back(folder, S_IFDIR);
      }
      ReplyDirEntries(req, ino, size, off, entries);
    });
  }
  if (p.sub == "tmp") {
    Entries entries;
    std::string prefix = n->path + "/";
    for (const auto& [path, data] : mo->tmp) {
      if (path.starts_with(prefix)) entries.emplace_back(path.substr(prefix.size()), S_IFREG);
    }
    return ReplyDirEntries(req, ino, size, off, entries);
  }
  // Listing cur/ or new/ refreshes the summary once its freshness ran out (offset 0 only: a
  // listing read in several calls must see one state).
  bool stale_ok = off > 0;
  // A reader looking while operations wait for a lost connection: try the server again (the
  // queue is sent once it answers). Driven by the reader, never by a timer.
  if (off == 0 && queue_ && !queue_->pending().empty()) EnsureConnected(*mo);
  WithBox(*mo, p.folder, false, [this, req, ino, size, off, p, stale_ok](Result<MailBox*> b) {
    if (!b.ok()) return (void)fuse_reply_err(req, b.status().ToErrno());
    (void)stale_ok;
    Entries entries;
    for (const auto& [u, m] : (*b)->messages) {
      if (m.sub == p.sub) entries.emplace_back(m.Name(), S_IFREG);
    }
    ReplyDirEntries(req, ino, size, off, entries);
  });
}

// ---- reading ----

void MailTree::Open(fuse_req_t req, Node* n, fuse_file_info* fi) {
  MailOrigin* mo = OriginOf(n->origin);
  if (!mo) return (void)fuse_reply_err(req, ESTALE);
  MailPath p = Split(n->path);
  fuse_file_info info = *fi;
  fuse_ino_t ino = n->ino;
  if (p.sub == "tmp") {
    auto t = mo->tmp.find(n->path);
    if (t == mo->tmp.end()) return (void)fuse_reply_err(req, ENOENT);
    if (fi->flags & O_TRUNC) t->second.clear();
    Handle h;
    h.kind = NodeKind::kMailFile;
    h.tmp = true;
    h.key = n->path;
    info.fh = reads_.AddHandle(std::move(h));
    info.direct_io = 1;
    return (void)fuse_reply_open(req, &info);
  }
  if ((fi->flags & O_ACCMODE) != O_RDONLY) return (void)fuse_reply_err(req, EROFS);
  WithBox(*mo, p.folder, false, [this, req, info, ino, mo, p](Result<MailBox*> b) mutable {
    if (!b.ok()) return (void)fuse_reply_err(req, b.status().ToErrno());
    MailBox& box = **b;
    auto it = box.messages.find(UniqueOf(p.name));
    if (it == box.messages.end()) return (void)fuse_reply_err(req, ENOENT);
    const MailMessage& m = it->second;
    Handle h;
    h.kind = NodeKind::kMailFile;
    auto reply = [this, req, &info, ino](Handle h, ReadSource source) {
      h.source = source;
      info.direct_io = source == ReadSource::kNetwork ? 1 : 0;
      info.keep_cache = source == ReadSource::kNetwork ? 0 : 1;
      if (h.stream) ++h.stream->opens;
      ctx_.reads.decisions[ino].source = source;
      ++ctx_.reads.requests_by_source[source];
      info.fh = reads_.AddHandle(std::move(h));
      fuse_reply_open(req, &info);
    };
    if (m.body) {
      // Written by the reader and not on the server yet: served from memory.
      auto st = std::make_shared<Stream>();
      st->data = *m.body;
      st->size = m.body->size();
      st->done = st->emulated_ready = true;
      h.stream = st;
      return reply(std::move(h), ReadSource::kWriteQueue);
    }
    std::string key = BodyKey(*mo, box.wire, box.uidvalidity, m.uid);
    h.key = key;
    const CacheEntry* cached = ctx_.store.index().Find(key);
    // The cache manager decides, as for HTTP objects (common/cache/cache_manager.h): a fill
    // still in the write queue is read from memory, a cached copy goes to the cost model
    // (which may hint the ideal device).
    ObjectState state;
    state.on_disk = cached != nullptr;
    state.in_write_queue = ctx_.write_back.FillPending(key);
    state.size = cached ? cached->size : m.size;
    ReadDecision d = ctx_.manager.DecideRead(state);
    if (d.source == ReadSource::kWriteQueue) return reply(std::move(h), ReadSource::kWriteQueue);
    if (d.costed) {
      ctx_.reads.decisions[ino].cost = CostJson(d.choice, ctx_.machine.pm());
      bool on_disk = d.source == ReadSource::kDisk;
      bool offline = box.offline || mo->client->state() == ImapClient::State::kDisconnected;
      if (on_disk || offline) {
        ReadSource source = offline && !on_disk ? ReadSource::kStale : ReadSource::kDisk;
        if ((h.body = ctx_.store.PackedBody(key))) {  // a small message packed in the index
          ctx_.store.Touch(key);
          return reply(std::move(h), source);
        }
        Result<BodyFile> file = CacheManager::OpenBody(ctx_.store, key);
        if (!file.ok()) return (void)fuse_reply_err(req, EIO);
        h.file = std::move(file).value();
        ctx_.store.Touch(key);
        reads_.StartPrefetch(h, cached->size);
        return reply(std::move(h), offline && !on_disk ? ReadSource::kStale : ReadSource::kDisk);
      }
    }
    // The network: join a fetch that is running, or start one.
    if (auto running = reads_.streams().find(key); running != reads_.streams().end()) {
      h.stream = running->second;
      return reply(std::move(h), ReadSource::kNetwork);
    }
    auto st = std::make_shared<Stream>();
    st->key = key;
    st->size = m.size;
    reads_.streams()[key] = st;
    h.stream = st;
    ++fetches_;
    ctx_.machine.TransferBegin();
    // The emulated card carries the same transfer (DESIGN §7).
    ctx_.machine.network().Submit({m.size, false}, [this, st] {
      st->emulated_ready = true;
      reads_.ServeStream(*st);
    });
    std::uint32_t uid = m.uid, uidvalidity = box.uidvalidity;
    std::string wire = box.wire;
    Bytes expected = m.size;
    auto end = [this, st, mo, key, expected](Status s) {
      ctx_.machine.TransferEnd();
      st->done = true;
      st->status = s;
      if (auto it = reads_.streams().find(key); it != reads_.streams().end() && it->second == st)
        reads_.streams().erase(it);
      reads_.ServeStream(*st);  // waiting reads get the rest, or EIO
      if (!s.ok()) {
        ++fetch_errors_;
        std::fprintf(stderr, "ghostfs: %s: fetching %s: %s\n", mo->name.c_str(), key.c_str(), s.ToString().c_str());
        return;
      }
      if (st->data.size() != expected || ctx_.store.index().Find(key)) return;
      // The fill waits in the write queue while the disk sleeps (DESIGN §3.5).
      CacheEntry meta;
      meta.content_type = "message/rfc822";
      ctx_.write_back.QueueFill(key, std::move(meta), st->data);
    };
    Selected(*mo, wire, [this, mo, st, uid, uidvalidity, end](Result<std::uint32_t> v) {
      if (!v.ok()) return end(v.status());
      if (*v != uidvalidity) {
        ++uidvalidity_changes_;
        MailBox* b = mo->BoxByWire(mo->selected);
        if (b) b->expires = TimePoint{};
        return end(Status::NotFound("the mailbox changed UIDVALIDITY; list it again"));
      }
      mo->client->FetchBody(
          uid,
          [this, st](std::string_view data) {
            st->data.append(data);
            bytes_fetched_ += data.size();
            ctx_.reads.bytes_from_network += data.size();
            reads_.ServeStream(*st);
            return true;
          },
          end);
    });
    reply(std::move(h), ReadSource::kNetwork);
  });
}

void MailTree::Read(fuse_req_t req, Node*, size_t size, off_t off, fuse_file_info* fi) {
  Handle* hp = reads_.FindHandle(fi->fh);
  if (!hp) return (void)fuse_reply_err(req, EBADF);
  Handle& h = *hp;
  if (!h.tmp) return reads_.ReadHandle(req, fi->fh, size, off);
  // tmp/ files live in memory until they are renamed into new/ or cur/.
  for (auto& mo : origins_) {
    if (!mo) continue;
    auto t = mo->tmp.find(h.key);
    if (t == mo->tmp.end()) continue;
    std::size_t from = std::min<std::size_t>(static_cast<std::size_t>(off), t->second.size());
    std::size_t n = std::min<std::size_t>(size, t->second.size() - from);
    return (void)fuse_reply_buf(req, t->second.data() + from, n);
  }
  fuse_reply_buf(req, nullptr, 0);  // renamed away meanwhile: it reads as empty
}

// ---- writing ----

void MailTree::Create(fuse_req_t req, Node* parent, const char* name, mode_t mode, fuse_file_info* fi) {
  if (BadName(name)) return Tree::Create(req, parent, name, mode, fi);
  MailOrigin* mo = OriginOf(parent->origin);
  if (!mo) return (void)fuse_reply_err(req, ESTALE);
  MailPath p = Split(parent->path);
  // Maildir writers create in tmp/ and rename into new/ or cur/ when complete.
  if (p.sub != "tmp") return (void)fuse_reply_err(req, EACCES);
  std::string path = parent->path + "/" + name;
  if ((fi->flags & O_EXCL) && mo->tmp.count(path)) return (void)fuse_reply_err(req, EEXIST);
  mo->tmp[path];
  Node* n = ctx_.inodes.Lookup(NodeKind::kMailFile, parent->origin, path);
  Handle h;
  h.kind = NodeKind::kMailFile;
  h.tmp = true;
  h.key = path;
  fi->fh = reads_.AddHandle(std::move(h));
  fi->direct_io = 1;
  fuse_entry_param e = NodeEntry(n, FileStat(n->ino, mo->tmp[path].size(), 0644, UnixNow()));
  e.attr_timeout = e.entry_timeout = 0;
  fuse_reply_create(req, &e, fi);
}

void MailTree::Write(fuse_req_t req, Node*, const char* buf, size_t size, off_t off, fuse_file_info* fi) {
  Handle* hp = reads_.FindHandle(fi->fh);
  if (!hp) return (void)fuse_reply_err(req, EBADF);
  Handle& h = *hp;
  if (!h.tmp) return (void)fuse_reply_err(req, EROFS);
  for (auto& mo : origins_) {
    if (!mo) continue;
    auto t = mo->tmp.find(h.key);
    if (t == mo->tmp.end()) continue;
    std::size_t end = static_cast<std::size_t>(off) + size;
    if (t->second.size() < end) t->second.resize(end);
    std::memcpy(t->second.data() + off, buf, size);
    return (void)fuse_reply_write(req, size);
  }
  fuse_reply_err(req, ENOENT);
}

void MailTree::Unlink(fuse_req_t req, Node* parent, const char* name_c) {
  if (BadName(name_c)) return Tree::Unlink(req, parent, name_c);
  MailOrigin* mo = OriginOf(parent->origin);
  if (!mo) return (void)fuse_reply_err(req, ESTALE);
  MailPath p = Split(parent->path);
  std::string name = name_c;
  if (p.sub == "tmp") {
    return (void)fuse_reply_err(req, mo->tmp.erase(parent->path + "/" + name) ? 0 : ENOENT);
  }
  if (p.sub.empty()) return (void)fuse_reply_err(req, EISDIR);
  WithBox(*mo, p.folder, false, [this, req, mo, p, name](Result<MailBox*> b) {
    if (!b.ok()) return (void)fuse_reply_err(req, b.status().ToErrno());
    MailBox& box = **b;
    auto it = box.messages.find(UniqueOf(name));
    if (it == box.messages.end() || it->second.sub != p.sub)
      return (void)fuse_reply_err(req, ENOENT);
    ImapOp op;
    // To the trash (recoverable, as mail clients do) unless configured to expunge or the
    // message is in the trash already: imap_delete (common/config/config.h).
    if (!trash_.empty() && box.wire != trash_) {
      op.kind = ImapOp::Kind::kMove;
      op.destination = trash_;
    } else {
      op.kind = ImapOp::Kind::kExpunge;
    }
    op.origin = mo->name;
    op.mailbox = box.wire;
    op.uidvalidity = box.uidvalidity;
    op.uid = it->second.uid;
    op.internaldate = it->second.date;
    op.message_size = it->second.size;
    if (!op.uid) op.local_name = it->second.unique;
    Result<std::uint64_t> seq = queue_->Add(std::move(op));
    if (!seq.ok()) {
      std::fprintf(stderr, "ghostfs: %s: cannot queue the deletion: %s\n", mo->name.c_str(), seq.status().ToString().c_str());
      return (void)fuse_reply_err(req, EIO);
    }
    box.messages.erase(it);
    box.Changed();
    fuse_reply_err(req, 0);
  });
}

void MailTree::Rename(fuse_req_t req, Node* p, const char* name_c, Node* q, const char* newname_c, unsigned flags) {
  if (BadName(name_c) || BadName(newname_c)) return Tree::Rename(req, p, name_c, q, newname_c, flags);
  MailOrigin* mo = OriginOf(p->origin);
  if (!mo || q->origin != p->origin || q->kind != NodeKind::kMailDir) return (void)fuse_reply_err(req, EXDEV);
  if (flags & RENAME_EXCHANGE) return (void)fuse_reply_err(req, EINVAL);
  MailPath from = Split(p->path), to = Split(q->path);
  std::string name = name_c, newname = newname_c;
  if (to.sub != "cur" && to.sub != "new") return (void)fuse_reply_err(req, EACCES);
  if (from.sub.empty()) return (void)fuse_reply_err(req, EACCES);
  from.name = name;
  to.name = newname;
  std::string from_path = Join(from), to_path = Join(to);
  int origin = p->origin;
  auto done = [this, req, origin, from_path, to_path](Result<std::uint64_t> seq) {
    if (!seq.ok()) {
      std::fprintf(stderr, "ghostfs: cannot queue an IMAP operation: %s\n", seq.status().ToString().c_str());
      return (void)fuse_reply_err(req, EIO);
    }
    ctx_.inodes.Rename(NodeKind::kMailFile, origin, from_path, to_path);
    fuse_reply_err(req, 0);
  };
  WithBox(*mo, to.folder, false,
          [this, req, mo, from, to, name, newname, from_path, done](Result<MailBox*> tb) {
            if (!tb.ok()) return (void)fuse_reply_err(req, tb.status().ToErrno());
            MailBox& dest = **tb;
            if (from.sub == "tmp") {
              // A new message: APPEND, with the flags of its info letters.
              auto t = mo->tmp.find(from_path);
              if (t == mo->tmp.end()) return (void)fuse_reply_err(req, ENOENT);
              ImapOp op;
              op.kind = ImapOp::Kind::kAppend;
              op.origin = mo->name;
              op.mailbox = dest.wire;
              op.flags = InfoToFlags(InfoOf(newname));
              op.internaldate = UnixNow();
              op.local_name = to.sub + "/" + newname;
              op.body = t->second;
              MailMessage msg;
              msg.sub = to.sub;
              msg.unique = UniqueOf(newname);
              msg.info = InfoOf(newname);
              msg.size = t->second.size();
              msg.date = op.internaldate;
              msg.body = std::make_shared<const std::string>(t->second);
              Result<std::uint64_t> seq = queue_->Add(std::move(op));
              if (seq.ok()) {
                mo->tmp.erase(t);
                dest.messages[msg.unique] = std::move(msg);
                dest.Changed();
              }
              return done(seq);
            }
            WithBox(*mo, from.folder, false,
                    [this, req, mo, from, to, name, newname, &dest, done](Result<MailBox*> sb) {
                      if (!sb.ok()) return (void)fuse_reply_err(req, sb.status().ToErrno());
                      MailBox& src = **sb;
                      auto it = src.messages.find(UniqueOf(name));
                      if (it == src.messages.end() || it->second.sub != from.sub)
                        return (void)fuse_reply_err(req, ENOENT);
                      MailMessage& m = it->second;
                      ImapOp op;
                      op.origin = mo->name;
                      op.mailbox = src.wire;
                      op.uidvalidity = src.uidvalidity;
                      op.uid = m.uid;
                      op.internaldate = m.date;
                      op.message_size = m.size;
                      if (!m.uid) op.local_name = m.unique;
                      if (&src != &dest) {
                        // Another folder: UID MOVE; it shows up there once the server has moved it.
                        op.kind = ImapOp::Kind::kMove;
                        op.destination = dest.wire;
                        Result<std::uint64_t> seq = queue_->Add(std::move(op));
                        if (seq.ok()) {
                          src.messages.erase(it);
                          src.Changed();
                        }
                        return done(seq);
                      }
                      if (UniqueOf(newname) != m.unique)
                        return (void)fuse_reply_err(req, EINVAL);  // names are ours
                      // What the reader changed: from the info of the name it renamed to the new
                      // name's. Its name may predate a change another client made meanwhile (the
                      // kernel keeps a looked-up name for a second); that change stays.
                      std::string before = name.find(":2,") == std::string::npos ? m.info : InfoOf(name);
                      std::string after = InfoOf(newname);
                      std::string added, removed;
                      for (char c : after) {
                        if (before.find(c) == std::string::npos) added.push_back(c);
                      }
                      for (char c : before) {
                        if (after.find(c) == std::string::npos) removed.push_back(c);
                      }
                      std::string now = m.info + added;
                      std::erase_if(now, [&](char c) { return removed.find(c) != std::string::npos; });
                      after = NormalizeInfo(now);
                      Result<std::uint64_t> seq = std::uint64_t{0};
                      if (!added.empty() || !removed.empty()) {
                        // Only what changed, so keywords and flags set by other clients survive.
                        op.kind = ImapOp::Kind::kStore;
                        op.flags = InfoToFlags(added);
                        op.remove_flags = InfoToFlags(removed);
                        seq = queue_->Add(std::move(op));
                      }
                      if (seq.ok()) {
                        if (from.sub == "new" && to.sub == "cur" && m.uid) src.left_new.insert(m.uid);
                        if (to.sub == "new") src.left_new.erase(m.uid);
                        m.info = after;
                        m.sub = to.sub;
                        src.Changed();
                      }
                      done(seq);
                    });
          });
}

// ---- the deferred operations, sent (common/imap/imap_queue.h) ----

namespace {

Status WriteDurably(const std::string& path, std::string_view data, int flags) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC | flags, 0600);
  if (fd < 0) return Status::FromErrno(errno, "open " + path);
  Status st;
  ssize_t n = ::write(fd, data.data(), data.size());
  if (n != static_cast<ssize_t>(data.size())) {
    st = Status::FromErrno(n < 0 ? errno : ENOSPC, "write " + path);
  } else if (::fdatasync(fd) != 0) {
    st = Status::FromErrno(errno, "fdatasync " + path);
  }
  ::close(fd);
  return st;
}

}  // namespace

void MailTree::PruneAppended(bool always) {
  std::string path = ctx_.options.cache_dir + "/imap-appended.jsonl";
  std::vector<bool> waited(appended_lines_.size(), false);
  std::size_t live_count = 0;
  for (std::size_t i = 0; i < appended_lines_.size(); ++i) {
    const AppendedLine& l = appended_lines_[i];
    for (const ImapOp& op : queue_->pending()) waited[i] = waited[i] || WaitsForAppend(op, l.origin, l.wire, l.unique);
    live_count += waited[i];
  }
  std::size_t stale = appended_lines_.size() - live_count;
  // While running, rewritten once the stale lines are as many as the live ones (or none is
  // live): each line is written O(1) times, not once per change applied.
  if (!always && (stale == 0 || stale < live_count)) return;
  std::vector<AppendedLine> live;
  for (std::size_t i = 0; i < appended_lines_.size(); ++i) {
    if (waited[i]) live.push_back(std::move(appended_lines_[i]));
  }
  appended_lines_ = std::move(live);
  if (appended_lines_.empty()) {
    if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
      std::fprintf(stderr, "ghostfs: removing %s: %s\n", path.c_str(), std::strerror(errno));
    }
    return;
  }
  std::string kept;
  for (const AppendedLine& l : appended_lines_) kept += l.line;
  // The new file replaces the old one by rename: a crash leaves one or the other, whole.
  std::string tmp = path + ".tmp";
  Status st = WriteDurably(tmp, kept, O_TRUNC);
  if (st.ok() && ::rename(tmp.c_str(), path.c_str()) != 0) st = Status::FromErrno(errno, "rename " + tmp);
  if (st.ok()) {
    if (int dir = ::open(ctx_.options.cache_dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC); dir >= 0) {
      (void)::fsync(dir);
      ::close(dir);
    }
  } else {
    ::unlink(tmp.c_str());
    std::fprintf(stderr, "ghostfs: pruning %s: %s\n", path.c_str(), st.ToString().c_str());
  }
}

void MailTree::Send(const ImapOp& op, std::function<void(SendOutcome)> done_sending) {
  // An operation that left the queue (sent, or dropped) no longer waits for its message's
  // UID: the appended file loses its line (its leaving is journaled before `done` returns).
  auto done = [this, done = std::move(done_sending)](SendOutcome outcome) {
    done(outcome);
    if (outcome != SendOutcome::kRetryLater && queue_ && !appended_lines_.empty()) PruneAppended(/*always=*/false);
  };
  MailOrigin* mo = nullptr;
  for (auto& o : origins_) {
    if (o && o->name == op.origin) mo = o.get();
  }
  std::string what = std::string(ImapOpKindName(op.kind)) + " in " + op.mailbox;
  if (!mo) {
    std::fprintf(stderr, "ghostfs: dropping a queued IMAP %s: origin %s is not configured any more\n",
                 what.c_str(), op.origin.c_str());
    return done(SendOutcome::kDropped);
  }
  auto result = [this, mo, op, what, done](Status s) {
    if (s.ok()) return done(SendOutcome::kDone);
    // A lost connection, a server talking nonsense, or no connection at all (login refused, a
    // TLS failure: the client is disconnected when the command fails) says nothing about the
    // operation: it stays queued until the server answers again.
    if (Transient(s) || mo->client->state() != ImapClient::State::kReady) {
      std::fprintf(stderr, "ghostfs: %s: IMAP %s kept queued: %s\n", mo->name.c_str(), what.c_str(), s.ToString().c_str());
      return done(SendOutcome::kRetryLater);
    }
    // Refused (NO/BAD to a well-formed command, e.g. over quota): sending it again would be
    // refused again. It leaves the queue but is kept, whole, in the unapplied file.
    std::fprintf(stderr, "ghostfs: %s: IMAP %s refused by the server: %s; recorded in %s\n",
                 mo->name.c_str(), what.c_str(), s.ToString().c_str(), unapplied_path_.c_str());
    RecordUnapplied(op, "refused by the server: " + s.message());
    done(SendOutcome::kDropped);
  };
  EnsureConnected(*mo);
  if (op.kind == ImapOp::Kind::kAppend) {
    std::string wire = op.mailbox, unique = UniqueOf(op.local_name.substr(op.local_name.rfind('/') + 1));
    auto appended = [this, mo, wire, unique](std::uint32_t uidvalidity, std::uint32_t uid) {
      mo->appended[wire + "\n" + unique] = {uidvalidity, uid};
      // Operations queued behind the APPEND need its UID after a restart too: kept durably
      // before the APPEND is acknowledged (MailTree::Start reads it back).
      bool waited = false;
      for (const ImapOp& q : queue_->pending()) waited = waited || WaitsForAppend(q, mo->name, wire, unique);
      if (waited) {
        nlohmann::json j = {{"origin", mo->name}, {"mailbox", wire}, {"unique", unique},
                            {"uidvalidity", uidvalidity}, {"uid", uid}};
        std::string path = ctx_.options.cache_dir + "/imap-appended.jsonl";
        std::string line = j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
        appended_lines_.push_back({mo->name, wire, unique, line});
        if (Status st = WriteDurably(path, line, O_APPEND); !st.ok()) {
          std::fprintf(stderr, "ghostfs: %s: cannot keep an appended message's UID: %s\n", mo->name.c_str(),
                       st.ToString().c_str());
        }
      }
      if (MailBox* b = mo->BoxByWire(wire); b && b->loaded) LoadBox(*mo, *b, [](Status) {});
    };
    auto append = [mo, op, appended, result] {
      std::optional<std::int64_t> date;
      if (op.internaldate) date = op.internaldate;
      mo->client->Append(op.mailbox, op.flags, date, op.body, [appended, result](Result<AppendResult> r) {
        if (r.ok()) appended(r->uidvalidity, r->uid);
        result(r.status());
      });
    };
    if (!op.maybe_applied) return append();
    // The last try may have reached the server (common/imap/find_appended.h): look first.
    auto validity = std::make_shared<std::uint32_t>(0);
    InMailbox in_mailbox = [this, mo, wire, validity](std::function<void(Status)> step) {
      Selected(*mo, wire, [validity, step](Result<std::uint32_t> v) {
        if (!v.ok()) return step(v.status());
        if (*validity && *v != *validity) return step(Status::Unavailable("the mailbox changed UIDVALIDITY"));
        *validity = *v;
        step(Status::Ok());
      });
    };
    auto body = std::make_shared<const std::string>(op.body);
    // Not in its mailbox: another client may have moved it on since (a MOVE or COPY keeps the
    // bytes and the INTERNALDATE); found in another mailbox, it is not appended again.
    auto elsewhere = [this, mo, what, wire, body, date = op.internaldate, appended, append, result] {
      FindAppendedElsewhere(*mo, wire, body, date, [this, mo, what, wire, appended, append, result](
                                                      Result<std::string> box) {
        if (!box.ok()) return result(box.status());
        if (box->empty()) {
          std::fprintf(stderr, "ghostfs: %s: IMAP %s may have reached the server before (the answer to the last "
                       "try was lost) but is in none of its mailboxes: sent again\n", mo->name.c_str(), what.c_str());
          return append();
        }
        ++appends_found_;
        std::fprintf(stderr,
                     "ghostfs: %s: IMAP %s was on the server already, moved on to %s by another client (the "
                     "answer to the last try was lost): not sent again; changes queued for it in %s are dropped\n",
                     mo->name.c_str(), what.c_str(), box->c_str(), wire.c_str());
        appended(0, 0);  // done, and its UID in `wire` is none
        result(Status::Ok());
      });
    };
    return FindAppended(*mo->client, body, op.internaldate, in_mailbox,
                        [this, mo, what, validity, appended, elsewhere, result](Result<std::uint32_t> uid) {
                          if (!uid.ok()) return result(uid.status());
                          if (*uid == 0) return elsewhere();
                          ++appends_found_;
                          std::fprintf(stderr,
                                       "ghostfs: %s: IMAP %s was on the server already (UID %u; the answer "
                                       "to the last try was lost): not sent again\n",
                                       mo->name.c_str(), what.c_str(), *uid);
                          appended(*validity, *uid);
                          result(Status::Ok());
                        });
  }
  ImapOp copy = op;
  if (!copy.uid) {
    // A message the reader wrote: its UID is known once its APPEND went through.
    auto a = mo->appended.find(op.mailbox + "\n" + op.local_name);
    if (a == mo->appended.end() || a->second.second == 0) {
      std::fprintf(stderr, "ghostfs: %s: IMAP %s dropped: the appended message's UID is unknown\n", mo->name.c_str(),
                   what.c_str());
      return done(SendOutcome::kDropped);
    }
    copy.uidvalidity = a->second.first;
    copy.uid = a->second.second;
  }
  Selected(*mo, op.mailbox, [this, mo, copy, result, done](Result<std::uint32_t> v) {
    if (!v.ok()) return result(v.status());
    if (*v != copy.uidvalidity) return Resync(*mo, copy, *v, result, done);
    SendToUid(*mo, copy, result);
  });
}

void MailTree::FindAppendedElsewhere(MailOrigin& mo, const std::string& wire, std::shared_ptr<const std::string> body,
                                     std::int64_t internaldate, std::function<void(Result<std::string>)> done) {
  WithMailboxes(mo, [this, &mo, wire, body, internaldate, done = std::move(done)](Status s) {
    if (!s.ok()) return done(s);
    std::vector<std::string> others;
    for (const auto& [folder, box] : mo.boxes) {
      bool same = box.wire == wire || (IsInbox(box.wire) && IsInbox(wire));
      if (!box.gone && !same) others.push_back(box.wire);
    }
    SelectMailbox select = [this, &mo](const std::string& other, std::function<void(Status)> step) {
      Selected(mo, other, [step](Result<std::uint32_t> v) { step(v.ok() ? Status::Ok() : v.status()); });
    };
    FindAppendedIn(*mo.client, body, internaldate, std::move(others), std::move(select), done);
  });
}

// Precondition: op.mailbox is selected with op.uidvalidity.
void MailTree::SendToUid(MailOrigin& mo, const ImapOp& op, std::function<void(Status)> result) {
  std::string set = std::to_string(op.uid);
  ImapClient& c = *mo.client;
  switch (op.kind) {
    // Both commands of a pair are issued now, while the mailbox is the selected one (a command
    // issued from the first one's callback could follow another reader's Select: see
    // WithSelection); the op is done when both are.
    case ImapOp::Kind::kStore: {
      if (op.flags.empty() || op.remove_flags.empty()) {
        bool add = !op.flags.empty();
        return c.UidStore(set, add ? StoreMode::kAdd : StoreMode::kRemove, add ? op.flags : op.remove_flags, result);
      }
      auto first = std::make_shared<Status>();
      c.UidStore(set, StoreMode::kAdd, op.flags, [first](Status s) { *first = s; });
      return c.UidStore(set, StoreMode::kRemove, op.remove_flags,
                        [first, result](Status s) { result(first->ok() ? s : *first); });
    }
    case ImapOp::Kind::kExpunge: {
      auto first = std::make_shared<Status>();
      c.UidStore(set, StoreMode::kAdd, {"\\Deleted"}, [first](Status s) { *first = s; });
      return c.UidExpunge(set, [first, result](Status s) { result(first->ok() ? s : *first); });
    }
    case ImapOp::Kind::kMove: {
      auto moved = [&mo, op, result](Result<MoveResult> r) {
        if (r.ok()) {
          if (MailBox* b = mo.BoxByWire(op.destination); b) b->expires = TimePoint{};
        }
        result(r.status());
      };
      return c.UidMove(
          set, op.destination, [this, &mo, &c, set, op, moved, result](Result<MoveResult> r) {
            if (r.ok() || r.status().code() != Status::Code::kNotFound) return moved(std::move(r));
            // NO [TRYCREATE]: the destination (the trash, typically) does not exist yet. Create it,
            // then move (the mailbox list is reloaded so the new folder shows).
            std::fprintf(stderr, "ghostfs: %s: creating mailbox %s for a move\n", mo.name.c_str(),
                         op.destination.c_str());
            c.Create(op.destination, [this, &mo, &c, set, op, moved, result](Status s) {
              if (!s.ok() && s.code() != Status::Code::kExists) return result(s);
              mo.boxes_expires = TimePoint{};
              // CREATE may leave the selection alone, but the move must run in the source mailbox.
              Selected(mo, op.mailbox, [&c, set, op, moved, result](Result<std::uint32_t> v) {
                if (!v.ok()) return result(v.status());
                if (*v != op.uidvalidity)
                  return result(Status::Unavailable("the mailbox changed UIDVALIDITY; retrying"));
                c.UidMove(set, op.destination, moved);
              });
            });
          });
    }
    case ImapOp::Kind::kAppend:
    case ImapOp::Kind::kCopy:  // queued by ghostproxy only, never by the Maildir view
      break;
  }
  result(Status::Internal("unreachable"));
}

// The mailbox's UIDVALIDITY changed while `op` waited (the server rebuilt its index, or the
// mailbox was deleted and made again): op.uid may now name another message, or none. The rule,
// which never applies a change to the wrong message and never loses one:
//   1. Find the message again. By its Message-ID, when its old body is in the cache
//      (UID SEARCH HEADER Message-ID, narrowed by RFC822.SIZE when several match); else by its
//      RFC822.SIZE and INTERNALDATE, as listed when the op was queued. Exactly one match: the
//      op is sent to that message's new UID ("retargeted").
//   2. No match: the message is gone from the mailbox. An expunge or a move to the trash is
//      then done already ("gone"). A flag change or a move is kept by APPENDing the cached
//      copy (to the mailbox with the new flags, or to the destination) ("reappended").
//   3. Otherwise (several matches, or gone with no cached copy): the op is not applied to any
//      message; it is written, with why, to CACHE/imap-unapplied.jsonl ("unapplied"), so a
//      person can apply it. The message itself stays on the server untouched.
// Each outcome is a log line and a count in `ghostctl stats` (imap.resync_*).
void MailTree::Resync(MailOrigin& mo, const ImapOp& op, std::uint32_t uidvalidity_now,
                      std::function<void(Status)> result, std::function<void(SendOutcome)> done) {
  ++uidvalidity_changes_;
  std::fprintf(
      stderr,
      "ghostfs: %s: mailbox %s changed UIDVALIDITY %u -> %u before a queued %s of UID %u was sent: "
      "finding the message again\n",
      mo.name.c_str(), op.mailbox.c_str(), op.uidvalidity, uidvalidity_now, ImapOpKindName(op.kind),
      op.uid);
  std::string key = BodyKey(mo, op.mailbox, op.uidvalidity, op.uid);
  const CacheEntry* e = ctx_.store.index().Find(key);
  auto with_body = [this, &mo, op, uidvalidity_now, result,
                    done](std::shared_ptr<std::string> body) {
    std::string id = body ? MessageIdOf(*body) : "";
    auto matched = [this, &mo, op, uidvalidity_now, body, result, done](
                       std::vector<std::uint32_t> uids, std::string how) {
      if (uids.size() == 1) {
        ++resync_retargeted_;
        std::fprintf(stderr,
                     "ghostfs: %s: queued %s of UID %u in %s sent to UID %u (found by %s)\n",
                     mo.name.c_str(), ImapOpKindName(op.kind), op.uid, op.mailbox.c_str(), uids[0],
                     how.c_str());
        ImapOp moved = op;
        moved.uidvalidity = uidvalidity_now;
        moved.uid = uids[0];
        return Selected(mo, op.mailbox, [this, &mo, moved, result](Result<std::uint32_t> v) {
          if (!v.ok()) return result(v.status());
          if (*v != moved.uidvalidity)
            return result(Status::Unavailable("UIDVALIDITY changed again"));
          SendToUid(mo, moved, result);
        });
      }
      if (uids.empty() && (op.kind == ImapOp::Kind::kExpunge ||
                           (op.kind == ImapOp::Kind::kMove && op.destination == trash_))) {
        ++resync_gone_;
        std::fprintf(
            stderr,
            "ghostfs: %s: queued %s of UID %u in %s: the message is not there any more (by %s); "
            "nothing to delete\n",
            mo.name.c_str(), ImapOpKindName(op.kind), op.uid, op.mailbox.c_str(), how.c_str());
        return done(SendOutcome::kDone);
      }
      if (uids.empty() && body) {
        ++resync_reappended_;
        std::string to = op.kind == ImapOp::Kind::kMove ? op.destination : op.mailbox;
        std::vector<std::string> flags =
            op.kind == ImapOp::Kind::kStore ? op.flags : std::vector<std::string>{};
        std::fprintf(
            stderr,
            "ghostfs: %s: queued %s of UID %u in %s: the message is gone from the server (by %s); "
            "APPENDing the cached copy to %s\n",
            mo.name.c_str(), ImapOpKindName(op.kind), op.uid, op.mailbox.c_str(), how.c_str(),
            to.c_str());
        std::optional<std::int64_t> date;
        if (op.internaldate) date = op.internaldate;
        return mo.client->Append(to, flags, date, *body,
                                 [this, &mo, to, result](Result<AppendResult> r) {
                                   if (r.ok()) {
                                     if (MailBox* b = mo.BoxByWire(to); b) b->expires = TimePoint{};
                                   }
                                   result(r.status());
                                 });
      }
      ++resync_unapplied_;
      std::string why = uids.empty()
                            ? "the message is gone and no copy is cached"
                            : std::to_string(uids.size()) + " messages match (" + how + ")";
      std::fprintf(stderr,
                   "ghostfs: %s: queued %s of UID %u in %s NOT applied: %s; recorded in %s\n",
                   mo.name.c_str(), ImapOpKindName(op.kind), op.uid, op.mailbox.c_str(),
                   why.c_str(), unapplied_path_.c_str());
      RecordUnapplied(op, why);
      done(SendOutcome::kDone);
    };
    auto by_size_date = [this, &mo, op, matched, result]() {
      if (!op.message_size) return matched({}, "nothing: the op carries no size or date");
      mo.client->FetchSummary("1:*", [op, matched, result](Result<std::vector<MessageSummary>> r) {
        if (!r.ok()) return result(r.status());
        std::vector<std::uint32_t> uids;
        for (const MessageSummary& m : *r) {
          if (m.size == op.message_size &&
              (!op.internaldate || m.internaldate_unix == op.internaldate)) {
            uids.push_back(m.uid);
          }
        }
        matched(uids, "size and date");
      });
    };
    Selected(
        mo, op.mailbox,
        [this, &mo, op, id, uidvalidity_now, matched, by_size_date, result](Result<std::uint32_t> v) {
          if (!v.ok()) return result(v.status());
          if (*v != uidvalidity_now)
            return result(Status::Unavailable("UIDVALIDITY changed again"));
          if (id.empty()) return by_size_date();
          mo.client->UidSearchHeader(
              "Message-ID", id,
              [this, &mo, op, id, uidvalidity_now, matched, result](Result<std::vector<std::uint32_t>> r) {
                if (!r.ok()) return result(r.status());
                if (r->size() <= 1 || !op.message_size) return matched(*r, "Message-ID " + id);
                // Copies of one message: narrow by size.
                std::string set;
                for (std::uint32_t u : *r) set += (set.empty() ? "" : ",") + std::to_string(u);
                auto narrow = [&mo, set, op, id, uidvalidity_now, matched, result](Result<std::uint32_t> v) {
                  if (!v.ok()) return result(v.status());
                  if (*v != uidvalidity_now) return result(Status::Unavailable("UIDVALIDITY changed again"));
                  mo.client->FetchSummary(
                    set, [op, id, matched, result](Result<std::vector<MessageSummary>> s) {
                      if (!s.ok()) return result(s.status());
                      std::vector<std::uint32_t> uids;
                      for (const MessageSummary& m : *s) {
                        if (m.size == op.message_size) uids.push_back(m.uid);
                      }
                      matched(uids, "Message-ID " + id + " and size");
                    });
                };
                // From a callback: the mailbox may not be the selected one any more.
                Selected(mo, op.mailbox, narrow);
              });
        });
  };
  if (!e) return with_body(nullptr);
  auto buf = std::make_shared<std::string>(e->size, '\0');
  ctx_.store.ReadBody(key, 0, std::span<char>(buf->data(), buf->size()),
                      [buf, with_body](Result<std::size_t> n) {
                        if (!n.ok() || *n != buf->size()) return with_body(nullptr);
                        with_body(buf);
                      });
}

void MailTree::RecordUnapplied(const ImapOp& op, const std::string& why) {
  nlohmann::json j = {{"time", UnixNow()},
                      {"origin", op.origin},
                      {"op", ImapOpKindName(op.kind)},
                      {"mailbox", op.mailbox},
                      {"uidvalidity", op.uidvalidity},
                      {"uid", op.uid},
                      {"flags", op.flags},
                      {"remove_flags", op.remove_flags},
                      {"destination", op.destination},
                      {"message_size", op.message_size},
                      {"internaldate", op.internaldate},
                      {"why", why}};
  // An APPEND that never reached the server carries the only copy of the reader's message:
  // it is kept byte for byte beside the record (JSON strings cannot hold arbitrary bytes).
  if (op.kind == ImapOp::Kind::kAppend) {
    std::string copy = unapplied_path_ + "." + std::to_string(op.seq) + ".eml";
    Status st = WriteDurably(copy, op.body, O_TRUNC);
    if (st.ok()) {
      j["message_file"] = copy;
    } else {
      std::fprintf(stderr, "ghostfs: cannot keep the unapplied message: %s\n",
                   st.ToString().c_str());
    }
  }
  std::string line = j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
  if (Status st = WriteDurably(unapplied_path_, line, O_APPEND); !st.ok()) {
    std::fprintf(stderr, "ghostfs: cannot record an unapplied IMAP operation: %s; it was: %s",
                 st.ToString().c_str(), line.c_str());
  }
}

// ---- attributes and stats ----

std::optional<std::string> MailTree::Xattr(Node* n, const std::string& name) {
  MailOrigin* mo = OriginOf(n->origin);
  if (!mo || n->kind != NodeKind::kMailFile) return std::nullopt;
  MailPath p = Split(n->path);
  auto b = mo->boxes.find(p.folder);
  if (b == mo->boxes.end()) return std::nullopt;
  auto it = b->second.messages.find(UniqueOf(p.name));
  if (it == b->second.messages.end()) return std::nullopt;
  const MailMessage& m = it->second;
  std::string key = m.uid ? BodyKey(*mo, b->second.wire, b->second.uidvalidity, m.uid) : "";
  auto d = ctx_.reads.decisions.find(n->ino);
  if (name == "user.ghost.cached") return std::string(!key.empty() && ctx_.store.index().Find(key) ? "1" : "0");
  if (name == "user.ghost.source") {
    return d == ctx_.reads.decisions.end() || !d->second.source ? std::string("none") : std::string(SourceLabel(*d->second.source));
  }
  if (name == "user.ghost.cost") {
    if (d == ctx_.reads.decisions.end() || d->second.cost.is_null()) return std::nullopt;
    return d->second.cost.dump();
  }
  if (name == "user.imap.mailbox") return b->second.wire;
  if (name == "user.imap.uid") {
    if (!m.uid) return std::nullopt;
    return std::to_string(m.uid);
  }
  if (name == "user.imap.uidvalidity") return std::to_string(b->second.uidvalidity);
  if (name == "user.imap.flags") {
    std::string out;
    for (const std::string& f : InfoToFlags(m.info)) out += (out.empty() ? "" : " ") + f;
    for (const std::string& f : m.keywords) out += (out.empty() ? "" : " ") + f;
    return out;
  }
  if (name == "user.imap.state") return std::string(m.uid ? "on-server" : "queued");
  return std::nullopt;
}

std::vector<std::string> MailTree::XattrNames(Node* n) {
  std::vector<std::string> out;
  for (const char* x : {"user.ghost.cached", "user.ghost.source", "user.ghost.cost", "user.imap.mailbox",
                        "user.imap.uid", "user.imap.uidvalidity", "user.imap.flags", "user.imap.state"}) {
    if (Xattr(n, x)) out.push_back(x);
  }
  return out;
}

nlohmann::json MailTree::StatsJson() const {
  if (!queue_) return nlohmann::json();
  const ImapQueueStats& s = queue_->stats();
  nlohmann::json origins = nlohmann::json::object();
  for (const auto& mo : origins_) {
    if (!mo) continue;
    origins[mo->name] = {{"connected", mo->client->state() == ImapClient::State::kReady},
                         {"idling", mo->client->idling()},
                         {"last_error", mo->last_error.ok() ? "" : mo->last_error.ToString()}};
  }
  return {{"queued", queue_->pending().size()},
          {"queued_bytes", queue_->queued_bytes()},
          {"sent", s.sent},
          {"dropped", s.dropped},
          {"retries", s.retries},
          {"replayed", s.replayed},
          {"flushes_power_callback", s.flushes_power_callback},
          {"flushes_active", s.flushes_active},
          {"flushes_cap", s.flushes_cap},
          {"flushes_explicit", s.flushes_explicit},
          {"fetches", fetches_},
          {"fetch_errors", fetch_errors_},
          {"bytes_fetched", bytes_fetched_},
          {"refreshes", refreshes_},
          {"server_events", idle_events_},
          {"uidvalidity_changes", uidvalidity_changes_},
          {"resync_retargeted", resync_retargeted_},
          {"resync_reappended", resync_reappended_},
          {"resync_gone", resync_gone_},
          {"resync_unapplied", resync_unapplied_},
          {"appends_found", appends_found_},
          {"unapplied_file", unapplied_path_},
          {"origins", origins}};
}

void MailTree::Release(fuse_req_t req, Node*, fuse_file_info* fi) {
  reads_.ReleaseHandle(fi->fh);
  fuse_reply_err(req, 0);
}

void MailTree::Getxattr(fuse_req_t req, Node* n, const char* name, size_t size) {
  std::optional<std::string> v = n->kind == NodeKind::kMailFile ? Xattr(n, name) : std::nullopt;
  if (!v) return (void)fuse_reply_err(req, ENODATA);
  ReplyXattr(req, *v, size);
}

void MailTree::Listxattr(fuse_req_t req, Node* n, size_t size) {
  std::string list;
  if (n->kind == NodeKind::kMailFile) {
    for (const std::string& x : XattrNames(n)) list.append(x).push_back('\0');
  }
  ReplyXattr(req, list, size);
}

// ---- sending now, and what stays queued ----

void MailTree::Sync(std::function<void(nlohmann::json)> done) {
  if (!queue_) return done({{"sent", 0}, {"left", 0}});
  // Asked for by the user: a login backoff does not hold this attempt back.
  for (auto& mo : origins_) {
    if (mo) mo->login_retry_at = {};
  }
  std::uint64_t before = queue_->stats().sent;
  queue_->Flush([this, before, done](std::size_t left) {
    nlohmann::json out = {{"sent", queue_->stats().sent - before}, {"left", left}};
    if (left > 0) {
      std::string why = "the server could not be reached";
      const std::string& origin = queue_->pending().front().origin;
      for (const auto& mo : origins_) {
        if (mo && mo->name == origin && !mo->last_error.ok()) why = origin + ": " + mo->last_error.message();
      }
      out["why"] = why;
    }
    done(std::move(out));
  });
}

void MailTree::ReportQueuedAtExit() const {
  if (!queue_ || queue_->pending().empty()) return;
  std::fprintf(stderr,
               "ghostfs: %zu IMAP operation(s) stay queued (%llu bytes): they are in the journal %s and go "
               "out after the next mount\n",
               queue_->pending().size(), static_cast<unsigned long long>(queue_->queued_bytes()),
               (ctx_.options.cache_dir + "/imap-journal").c_str());
}

}  // namespace ghost
