// MailTree: IMAP origins as Maildirs (DESIGN §4.1, §4.4). MOUNT/NAME/ is a Maildir++ tree:
//
//   NAME/{cur,new,tmp}/           INBOX
//   NAME/.Work.Reports/{cur,...}  mailbox "Work/Reports" (names: common/imap/maildir_names.h)
//
// Maildir++ folders (not nested directories) because every Maildir reader understands them
// (Python's mailbox.Maildir, mutt/neomutt, dovecot, mbsync). A message is one file,
// "<uidvalidity>.<uid>.ghost,S=<size>:2,<flags>", in cur/: the name is stable for as long
// as the mailbox keeps its UIDVALIDITY, its size is the server's RFC822.SIZE (stat needs no
// body), its info letters are the IMAP flags.
//
// Reads go through the same machinery as HTTP objects (origin_tree.cc): the body's cache key
// is "imap://USER@HOST:PORT/<mailbox>;UIDVALIDITY=v;UID=n" in the one cache store under the
// one byte cap; for each open the cost model chooses the cached copy or the network and sends
// ghost hints; a network read streams to the reader as it arrives and then fills the cache
// through the write queue. Mailbox summaries (UIDs, sizes, flags) are saved in the cache too,
// so with the server unreachable the Maildir still lists what it held and serves the cached
// bodies (disconnected operation).
//
// Writes become deferred IMAP operations (common/imap/imap_queue.h), shown in the view at once:
//   tmp/X renamed into new/ or cur/  → APPEND (flags from the info letters); the file keeps the
//                                      reader's name (served from memory) until the APPEND
//                                      went through, then takes its UID-based name in cur/
//   cur/A:2,S renamed to cur/A:2,FS  → UID STORE +FLAGS/-FLAGS (only the letters that changed,
//                                      so keywords set by other clients survive)
//   cur/A renamed into .Other/cur/   → UID MOVE
//   unlink cur/A                      → UID MOVE to the trash (imap_delete = "move:Trash", the
//                                      default; the trash is created if missing), or
//                                      UID STORE +\Deleted, UID EXPUNGE (imap_delete =
//                                      "expunge", and for an unlink inside the trash)
// If a mailbox's UIDVALIDITY changes while operations on its UIDs wait, each is sent to the
// message found again or kept elsewhere, never applied to another message (MailTree::Resync
// has the rule). A refused login, a dropped connection or a malformed answer never drops a
// queued operation; the reader gets EACCES, ENOTCONN or EIO and the log a line.
// New files can only be created in tmp/ (held in memory until renamed).
//
// New mail: the connection IDLEs (RFC 2177) in the mailbox it last selected, and the server's
// EXISTS / EXPUNGE / FETCH pushes refresh that mailbox's summary. Every other mailbox is
// refreshed when it is listed after its freshness (heuristic_freshness) ran out. Nothing
// polls.
//
// Thread-safety: the daemon's one event-loop thread.
#ifndef GHOST_FS_MAIL_TREE_H_
#define GHOST_FS_MAIL_TREE_H_

#include <fuse_lowlevel.h>
#include <sys/stat.h>

#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "common/imap/imap_client.h"
#include "common/imap/imap_queue.h"
#include "common/base/status.h"
#include "fs/tree.h"

namespace ghost {

class OriginTree;
struct Node;
struct Handle;
struct MailOrigin;
struct MailBox;

class MailTree final : public Tree {
 public:
  // Opens the IMAP operation journal (CACHE/imap-journal) and reads the origins' passwords.
  // Borrows `ctx` and `reads` (the read path bodies are read through, fs/origin_tree.h),
  // which must outlive the tree.
  [[nodiscard]] static Result<std::unique_ptr<MailTree>> Create(TreeContext ctx, OriginTree& reads);
  ~MailTree();
  MailTree(const MailTree&) = delete;
  MailTree& operator=(const MailTree&) = delete;

  bool IsMailOrigin(int origin) const;
  // Once mounted: sends what the journal replayed (operations of the last run).
  void Start();

  // ---- Tree: mail nodes (NodeKind::kMailDir, kMailFile); each replies exactly once ----
  void Lookup(fuse_req_t req, Node* parent, const char* name) override;
  void Getattr(fuse_req_t req, Node* n) override;
  void Setattr(fuse_req_t req, Node* n, struct stat* attr, int to_set, fuse_file_info* fi) override;
  void Readdir(fuse_req_t req, Node* n, size_t size, off_t off, fuse_file_info* fi) override;
  void Open(fuse_req_t req, Node* n, fuse_file_info* fi) override;
  void Create(fuse_req_t req, Node* parent, const char* name, mode_t mode, fuse_file_info* fi) override;
  void Read(fuse_req_t req, Node* n, size_t size, off_t off, fuse_file_info* fi) override;
  void Write(fuse_req_t req, Node* n, const char* buf, size_t size, off_t off, fuse_file_info* fi) override;
  void Release(fuse_req_t req, Node* n, fuse_file_info* fi) override;
  void Unlink(fuse_req_t req, Node* parent, const char* name) override;
  void Rename(fuse_req_t req, Node* p, const char* name, Node* q, const char* newname, unsigned flags) override;
  void Getxattr(fuse_req_t req, Node* n, const char* name, size_t size) override;
  void Listxattr(fuse_req_t req, Node* n, size_t size) override;
  // For `ghostctl stats`: {"queued", "sent", "dropped", ...}.
  nlohmann::json StatsJson() const;
  // `ghostctl sync` (and `flush`): sends the queued IMAP operations now, even during a login
  // backoff; `done` once sending stops, with {"sent", "left", "why"} (why: the last error of
  // an origin that could not be reached, when operations are left).
  void Sync(std::function<void(nlohmann::json)> done);
  // At unmount: a line saying how many operations stay queued (journaled; sent after the
  // next mount), if any.
  void ReportQueuedAtExit() const;

 private:
  MailTree(TreeContext ctx, OriginTree& reads);
  std::optional<std::string> Xattr(Node* n, const std::string& name);
  std::vector<std::string> XattrNames(Node* n);
  MailOrigin* OriginOf(int origin) const;
  void EnsureConnected(MailOrigin& mo);
  void OnMailboxEvent(MailOrigin& mo, const MailboxEvent& e);
  void WithMailboxes(MailOrigin& mo, std::function<void(Status)> then);
  void WithBox(MailOrigin& mo, const std::string& folder, bool force, std::function<void(Result<MailBox*>)> then);
  void LoadBox(MailOrigin& mo, MailBox& box, std::function<void(Status)> then);
  // `box` was deleted on the server: hidden from the view (MailBox::gone), with a log line
  // naming the operations still queued for it.
  void Gone(MailOrigin& mo, MailBox& box, const std::string& why);
  void LoadSavedBox(MailOrigin& mo, MailBox& box, Status why, std::function<void(Status)> then);
  void SaveBox(MailOrigin& mo, const MailBox& box);
  void ApplyPending(MailOrigin& mo, MailBox& box);
  // Selects `box` (if it is not the selected one) and checks its UIDVALIDITY, then runs `fn`.
  void Selected(MailOrigin& mo, const std::string& wire, std::function<void(Result<std::uint32_t>)> fn);
  // Runs `fn` once `wire` is the selected mailbox and no other Select was issued since, so the
  // commands `fn` issues at once run in that mailbox (mail_tree.cc explains why).
  void WithSelection(MailOrigin& mo, const std::string& wire, bool fresh,
                     std::function<void(Result<MailboxStatus>)> fn);
  void SelectNext(MailOrigin& mo);
  std::string BodyKey(const MailOrigin& mo, const std::string& wire, std::uint32_t uidvalidity,
                      std::uint32_t uid) const;
  void Send(const ImapOp& op, std::function<void(SendOutcome)> done);
  // An APPEND in doubt (maybe_applied) to `wire` that FindAppended did not find there: looks in
  // the origin's other mailboxes (FindAppendedIn). `done` as FindAppendedIn's.
  void FindAppendedElsewhere(MailOrigin& mo, const std::string& wire, std::shared_ptr<const std::string> body,
                             std::int64_t internaldate, std::function<void(Result<std::string>)> done);
  void SendToUid(MailOrigin& mo, const ImapOp& op, std::function<void(Status)> result);
  // op.mailbox's UIDVALIDITY is now `uidvalidity_now`, not op.uidvalidity: find the message
  // again or keep the change elsewhere (the rule is at the definition).
  void Resync(MailOrigin& mo, const ImapOp& op, std::uint32_t uidvalidity_now,
              std::function<void(Status)> result, std::function<void(SendOutcome)> done);
  void RecordUnapplied(const ImapOp& op, const std::string& why);
  // Rewrites CACHE/imap-appended.jsonl without the lines no queued operation waits for any
  // more (temp file, fsync, rename: a crash leaves the old file or the new one), or removes it
  // once none is waited for. `always`: even when few lines are stale (at start).
  void PruneAppended(bool always);
  void ReplyMessageEntry(fuse_req_t req, MailOrigin& mo, const std::string& path, Bytes size,
                         std::int64_t mtime);

  TreeContext ctx_;
  OriginTree& reads_;
  std::vector<std::unique_ptr<MailOrigin>> origins_;  // by origin index; null for HTTP origins
  std::unique_ptr<ImapQueue> queue_;
  std::uint64_t fetches_ = 0, fetch_errors_ = 0, bytes_fetched_ = 0, refreshes_ = 0,
                idle_events_ = 0, uidvalidity_changes_ = 0;
  std::uint64_t resync_retargeted_ = 0, resync_reappended_ = 0, resync_gone_ = 0,
                resync_unapplied_ = 0;
  std::uint64_t appends_found_ = 0;  // APPENDs in doubt found on the server, not sent again
  std::string trash_;           // wire name of the trash mailbox; "" = unlink expunges
  std::string unapplied_path_;  // CACHE/imap-unapplied.jsonl
  // The lines of CACHE/imap-appended.jsonl, in the file's order: a delivered message's UID
  // that operations queued behind its APPEND wait for (MailTree::Send, PruneAppended).
  struct AppendedLine {
    std::string origin, wire, unique, line;
  };
  std::vector<AppendedLine> appended_lines_;
};

}  // namespace ghost

#endif  // GHOST_FS_MAIL_TREE_H_
