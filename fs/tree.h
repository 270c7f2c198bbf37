// Tree: one part of the mount's namespace (HTTP origins, IMAP Maildirs, the shared store
// .ghost/, the writable local/, the root), behind one interface. The daemon (fs/ghostfs.cc)
// is the loop and the FUSE operation table: it finds the node, does the checks every tree
// shares (stale inode, file versus directory, names) and hands the request to the tree of the
// node's kind. Each tree owns its state and reaches what the trees share only through a
// TreeContext.
//
// Every operation replies to `req` exactly once. The defaults are those of a read-only tree
// that has no such operation (EROFS for changes, ENOTSUP for user attributes, EINVAL for
// readlink), so a tree overrides only what it serves.
//
// Thread-safety: everything runs on the daemon's one event-loop thread.
#ifndef GHOST_FS_TREE_H_
#define GHOST_FS_TREE_H_

#include <fuse_lowlevel.h>
#include <sys/stat.h>

#include <cstdint>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/cache/cache_manager.h"
#include "fs/inode_table.h"

struct event_base;

namespace ghost {

class CacheStore;
class FileIo;
class FusePassthrough;
class HttpFetcher;
class WriteBack;
struct GhostfsOptions;

// What a read of a file last did, for the user.ghost.* attributes.
struct Decision {
  std::optional<ReadSource> source;  // unset: never read
  nlohmann::json cost;               // the estimates behind it
  // Or the estimates as the cost model gave them, with the knob then, rendered as `cost` is
  // only when asked for (CostJson): building the JSON on every open was 5-7% of a cached
  // open's time in the daemon.
  std::optional<Choice> choice;
  int knob = 0;
};

// Where the reads the daemon answered came from, for `ghostctl stats` and user.ghost.source.
struct ReadLog {
  std::map<fuse_ino_t, Decision> decisions;
  std::map<ReadSource, int> requests_by_source;
  std::uint64_t bytes_from_network = 0;
  std::uint64_t bytes_from_cache = 0;  // served by the daemon (passthrough reads are not seen)
  std::uint64_t fuse_reads = 0;        // READ requests that reached the daemon
  std::uint64_t fuse_flushes = 0;      // FLUSH requests (one per close() unless FOPEN_NOFLUSH)
  // Opens given the version page-cache readers hold open, not asked of the origin (DESIGN §4.1)
  std::uint64_t pinned_opens = 0;
};

// What the trees share. Every reference is borrowed from the daemon, which outlives its trees.
struct TreeContext {
  const GhostfsOptions& options;
  Clock& clock;  // now, and timers (the IMAP queue's deadline)
  Machine& machine;        // devices, power manager, cost model
  CacheManager& manager;   // decides every read (common/cache/cache_manager.h)
  CacheStore& store;       // the one cache store (index and bodies)
  WriteBack& write_back;   // the write queue and its writer (fs/write_back.h)
  InodeTable& inodes;
  FileIo& io;
  HttpFetcher& http;
  FusePassthrough& passthrough;
  ReadLog& reads;
  std::function<std::uint64_t()> new_fh;  // a file handle unique across the mount
  // Something `ghostctl stats` shows changed: pushed to its subscribers (if any).
  std::function<void()> stats_changed;
  // A stored object changed: pushed to "objects" subscribers (a client drops its RAM copy).
  std::function<void(const std::string& key)> object_changed;
  // I/O outside the read decisions that the static baseline does too (fs/observability.cc):
  // bytes written to the cache other than a read's fill, bytes fetched outside a read.
  std::function<void(Bytes)> baseline_write;
  std::function<void(Bytes)> baseline_fetch;
  // An IMAP origin's connection attempt (`answered`: the server replied, a refused login
  // included), for origin health.
  std::function<void(const std::string& url, bool answered, const Status& status)> imap_outcome;
  event_base* loop;               // the daemon's event loop (for clients that need one)
  const std::string& mount_path;  // canonical, for paths handed out (set once mounted)
  // Drops the kernel's attributes and pages of an inode, from a notifier thread (never inside
  // this call; fs/inval_notifier.h). Does nothing before the mount or after it ends.
  std::function<void(fuse_ino_t)> invalidate_inode;
  // Drops the kernel's attributes of an inode (not its pages) now, before the caller's reply:
  // the kernel takes no page lock for that, so it may be sent from inside a request handler.
  // Does nothing before the mount or after it ends.
  std::function<void(fuse_ino_t)> invalidate_attributes;
};

class Tree {
 public:
  virtual ~Tree() = default;

  // Whether the tree checks names itself; else the daemon answers ENOENT for "", ".", "..",
  // names with '/' and names longer than NAME_MAX before Lookup, Create, Unlink and Rename.
  virtual bool ChecksNames() const { return false; }

  virtual void Lookup(fuse_req_t req, Node* parent, const char* name) = 0;
  virtual void Getattr(fuse_req_t req, Node* n) = 0;
  virtual void Setattr(fuse_req_t req, Node* n, struct stat* attr, int to_set, fuse_file_info* fi);
  // Before a directory is read: the tree may refuse it here (readdir(3) takes an ENOENT from
  // getdents for the end of the directory). The default opens it.
  virtual void Opendir(fuse_req_t req, Node* n, fuse_file_info* fi);
  virtual void Readdir(fuse_req_t req, Node* n, size_t size, off_t off, fuse_file_info* fi) = 0;
  virtual void Open(fuse_req_t req, Node* n, fuse_file_info* fi) = 0;
  virtual void Create(fuse_req_t req, Node* parent, const char* name, mode_t mode, fuse_file_info* fi);
  virtual void Read(fuse_req_t req, Node* n, size_t size, off_t off, fuse_file_info* fi);
  virtual void Write(fuse_req_t req, Node* n, const char* buf, size_t size, off_t off, fuse_file_info* fi);
  virtual void Flush(fuse_req_t req, Node* n, fuse_file_info* fi);
  virtual void Fsync(fuse_req_t req, Node* n, int datasync, fuse_file_info* fi);
  // fallocate(2) on an open file; the default: EOPNOTSUPP.
  virtual void Fallocate(fuse_req_t req, Node* n, int mode, off_t off, off_t len, fuse_file_info* fi);
  virtual void Release(fuse_req_t req, Node* n, fuse_file_info* fi);
  virtual void Mkdir(fuse_req_t req, Node* parent, const char* name, mode_t mode);
  virtual void Mknod(fuse_req_t req, Node* parent, const char* name, mode_t mode, dev_t rdev);
  virtual void Symlink(fuse_req_t req, const char* target, Node* parent, const char* name);
  virtual void Readlink(fuse_req_t req, Node* n);
  // `n` is in this tree; `newparent` may be in another (then EPERM).
  virtual void Link(fuse_req_t req, Node* n, Node* newparent, const char* newname);
  virtual void Unlink(fuse_req_t req, Node* parent, const char* name);
  virtual void Rmdir(fuse_req_t req, Node* parent, const char* name);
  // `parent` is in this tree; `newparent` may be in another (then EXDEV, or EROFS).
  virtual void Rename(fuse_req_t req, Node* parent, const char* name, Node* newparent,
                      const char* newname, unsigned int flags);
  virtual void Getxattr(fuse_req_t req, Node* n, const char* name, size_t size);
  virtual void Listxattr(fuse_req_t req, Node* n, size_t size);
  virtual void Setxattr(fuse_req_t req, Node* n, const char* name, const char* value, size_t size, int flags);
  virtual void Removexattr(fuse_req_t req, Node* n, const char* name);

 protected:
  // The errno of a create-like op under `parent` in a tree that does not take it.
  virtual int NotWritable(const Node* parent) const;
};

// ---- helpers every tree uses ----

// readdir entries whose inode the kernel must look up (libfuse passes 0xffffffff as "unknown").
inline constexpr fuse_ino_t kUnknownIno = 0xffffffff;

// A read-only directory's attributes.
// When the daemon started (wall clock): the date directories show, which have none of their own.
std::int64_t MountedUnix();
struct stat DirStat(fuse_ino_t ino, mode_t perm);
inline struct stat ReadOnlyDirStat(fuse_ino_t ino) { return DirStat(ino, 0555); }
// A regular file's attributes: owned by the mounting user; modified (and changed) at `mtime`
// when it is known, else 0.
struct stat FileStat(fuse_ino_t ino, Bytes size, mode_t perm, std::optional<std::int64_t> mtime);
// The entry of `n` (attributes `st`, cached for `timeout` seconds).
fuse_entry_param NodeEntry(const Node* n, const struct stat& st, double timeout = 1.0);
// Replies with the entry of `n` (attributes `st`, cached for `timeout` seconds).
void ReplyNodeEntry(fuse_req_t req, const Node* n, const struct stat& st, double timeout = 1.0);
// Replies to a readdir with ".", ".." and `entries`, from offset `off` on.
void ReplyDirEntries(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
                     const std::vector<std::pair<std::string, mode_t>>& entries);
// Replies to a getxattr with `value` (its size if `size` is 0; ERANGE if it does not fit).
void ReplyXattr(fuse_req_t req, const std::string& value, size_t size);
// "", ".", "..", a name with '/', or one longer than NAME_MAX.
bool BadName(const char* name);
// How user.ghost.source, `ghostctl status` and `ghostctl stats` name a source: "memory" (both
// RAM holders), "disk", "flash", "network", "revalidated", "stale".
const char* SourceLabel(ReadSource s);
// The estimates behind a cost-model choice, as user.ghost.cost and "lookup" show them.
nlohmann::json CostJson(const Choice& c, const PowerManager& pm);
nlohmann::json CostJson(const Choice& c, int knob);

}  // namespace ghost

#endif  // GHOST_FS_TREE_H_
