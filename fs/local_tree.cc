#include "fs/local_tree.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/fs.h>
#include <sys/statvfs.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "common/cache/cache_manager.h"
#include "fs/flash_local.h"

namespace ghost {
namespace {

// Longest name of one path component (NAME_MAX), as ext4 and tmpfs.
constexpr std::size_t kNameMax = 255;

// The errno for a name a local/ operation cannot take, or 0.
int NameError(const char* name) {
  if (name[0] == '\0') return ENOENT;
  if (std::strchr(name, '/') != nullptr) return EINVAL;
  if (std::strlen(name) > kNameMax) return ENAMETOOLONG;
  return 0;
}

// Entries are created with the caller's mode exactly: the kernel already applied the caller's
// umask (ghostfs does not ask for FUSE_CAP_DONT_MASK), and the daemon's own must not apply a
// second time. Scoped rather than process-wide so other files the daemon creates keep theirs.
// Only the loop thread creates local/ entries, so the brief change is seen by no other creator.
class ScopedUmask {
 public:
  ScopedUmask() : old_(umask(0)) {}
  ~ScopedUmask() { umask(old_); }
  ScopedUmask(const ScopedUmask&) = delete;
  ScopedUmask& operator=(const ScopedUmask&) = delete;

 private:
  mode_t old_;
};

bool InGroup(fuse_req_t req, gid_t gid) {
  const fuse_ctx* c = fuse_req_ctx(req);
  if (c->gid == gid) return true;
  gid_t groups[64];
  int n = fuse_req_getgroups(req, 64, groups);
  for (int i = 0; i < std::min(n, 64); ++i) {
    if (groups[i] == gid) return true;
  }
  return false;
}

void ReplyXattrBuf(fuse_req_t req, ssize_t n, const std::vector<char>& buf, size_t size) {
  if (n < 0) return (void)fuse_reply_err(req, errno);
  if (size == 0) return (void)fuse_reply_xattr(req, static_cast<size_t>(n));
  fuse_reply_buf(req, buf.data(), static_cast<size_t>(n));
}

}  // namespace

Result<std::unique_ptr<LocalTree>> LocalTree::Create(const std::string& dir, LocalContext ctx) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return Status::IoError("cannot create directory " + dir + ": " + ec.message());
  int fd = open(dir.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return Status::FromErrno(errno, "open " + dir);
  return std::unique_ptr<LocalTree>(new LocalTree(UniqueFd(fd), std::move(ctx)));
}

LocalTree::LocalTree(UniqueFd root, LocalContext ctx) : root_(std::move(root)), ctx_(std::move(ctx)) {}

LocalTree::~LocalTree() = default;

std::string LocalTree::Key(dev_t dev, ino_t ino) {
  return "local:" + std::to_string(dev) + ":" + std::to_string(ino);
}

std::string LocalTree::ProcPath(int fd) const { return "/proc/self/fd/" + std::to_string(fd); }

void LocalTree::LogMeta(MetaOp op, int parent_fd, const char* name, int fd, mode_t mode, int newparent_fd,
                        const char* newname, std::function<void()> reply) {
  if (ctx_.flash == nullptr || !ctx_.flash->TakesMeta()) return reply();
  Result<std::string> path = ctx_.flash->RelPath(parent_fd, name);
  Result<std::string> new_path = newname ? ctx_.flash->RelPath(newparent_fd, newname) : Result<std::string>("");
  if (!path.ok() || !new_path.ok()) {
    std::fprintf(stderr, "ghostfs: local/: %s of %s not logged (%s); it is in the backing tree only\n", MetaOpName(op),
                 name, (path.ok() ? new_path.status() : path.status()).ToString().c_str());
    return reply();
  }
  ctx_.flash->AppendMeta(op, *path, fd, mode & 07777, *new_path, [op, p = *path, reply = std::move(reply)](Status s) {
    if (!s.ok()) std::fprintf(stderr, "ghostfs: local/: %s of %s: %s\n", MetaOpName(op), p.c_str(), s.ToString().c_str());
    reply();
  });
}

int LocalTree::NodeFd(const Node* n) const { return n->fd.valid() ? n->fd.get() : root_.get(); }

Status LocalTree::Stat(const Node* n, struct stat* st) const {
  if (fstatat(NodeFd(n), "", st, AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW) != 0) return Status::FromErrno(errno, "local/ stat");
  // Queued and logged writes may extend the file past what is on the disk.
  if (S_ISREG(st->st_mode)) {
    Bytes end = ctx_.queue.QueuedEnd(Key(st->st_dev, st->st_ino));
    if (ctx_.flash) st->st_size = static_cast<off_t>(ctx_.flash->SizeOver(NodeFd(n), static_cast<Bytes>(st->st_size)));
    if (end > static_cast<Bytes>(st->st_size)) st->st_size = static_cast<off_t>(end);
  }
  st->st_ino = n->ino;
  return Status::Ok();
}

// ---- names ----

void LocalTree::LookupRoot(fuse_req_t req) {
  struct stat st;
  if (fstat(root_.get(), &st) != 0) return (void)fuse_reply_err(req, errno);
  int fd = fcntl(root_.get(), F_DUPFD_CLOEXEC, 0);
  if (fd < 0) return (void)fuse_reply_err(req, errno);
  Node* n = ctx_.inodes.LookupLocal(st.st_dev, st.st_ino, UniqueFd(fd));
  n->kind = NodeKind::kLocal;
  if (Status s = Stat(n, &st); !s.ok()) return (void)fuse_reply_err(req, s.ToErrno());
  fuse_entry_param e{};
  e.ino = n->ino;
  e.attr = st;
  e.attr_timeout = ctx_.attr_timeout;
  e.entry_timeout = ctx_.attr_timeout;
  fuse_reply_entry(req, &e);
}

Result<Node*> LocalTree::LookupNode(Node* parent, const char* name, struct stat* st) {
  int fd = openat(NodeFd(parent), name, O_PATH | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return Status::FromErrno(errno, std::string("local/ lookup ") + name);
  UniqueFd owned(fd);
  if (fstatat(fd, "", st, AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW) != 0) return Status::FromErrno(errno, "local/ stat");
  Node* n = ctx_.inodes.LookupLocal(st->st_dev, st->st_ino, std::move(owned));
  if (Status s = Stat(n, st); !s.ok()) return s;
  return n;
}

fuse_entry_param LocalTree::Entry(Node* n, const struct stat& st) const {
  fuse_entry_param e{};
  e.ino = n->ino;
  e.attr = st;
  e.attr_timeout = ctx_.attr_timeout;
  e.entry_timeout = ctx_.attr_timeout;
  return e;
}

void LocalTree::ReplyLookup(fuse_req_t req, Node* parent, const char* name) {
  struct stat st;
  Result<Node*> n = LookupNode(parent, name, &st);
  if (!n.ok()) return (void)fuse_reply_err(req, n.status().ToErrno());
  fuse_entry_param e = Entry(*n, st);
  fuse_reply_entry(req, &e);
}

void LocalTree::ReplyMade(fuse_req_t req, Node* parent, const char* name) {
  struct stat st;
  Result<Node*> n = LookupNode(parent, name, &st);
  if (!n.ok()) {
    // The lookup of the entry just made failed (EMFILE: its O_PATH descriptor): the caller is
    // told the call failed, so the entry must not stay behind (a retry would get EEXIST).
    unlinkat(NodeFd(parent), name, 0);
    return (void)fuse_reply_err(req, n.status().ToErrno());
  }
  fuse_entry_param e = Entry(*n, st);
  fuse_reply_entry(req, &e);
}

void LocalTree::Lookup(fuse_req_t req, Node* parent, const char* name) {
  if (int e = NameError(name)) return (void)fuse_reply_err(req, e);
  ReplyLookup(req, parent, name);
}

Status LocalTree::Adopt(fuse_req_t req, Node* parent, const char* name, mode_t mode, bool is_symlink) {
  const fuse_ctx* c = fuse_req_ctx(req);
  int pfd = NodeFd(parent);
  struct stat pst;
  if (fstatat(pfd, "", &pst, AT_EMPTY_PATH) != 0) return Status::FromErrno(errno, "local/ stat parent");
  // Under a set-group-ID directory, new entries take its group (and new directories its bit).
  bool sgid_dir = (pst.st_mode & S_ISGID) != 0;
  gid_t gid = sgid_dir ? pst.st_gid : c->gid;
  if (fchownat(pfd, name, c->uid, gid, AT_SYMLINK_NOFOLLOW) != 0) return Status::FromErrno(errno, "local/ chown");
  if (is_symlink) return Status::Ok();
  struct stat st;
  if (fstatat(pfd, name, &st, AT_SYMLINK_NOFOLLOW) != 0) return Status::FromErrno(errno, "local/ stat");
  mode_t want = mode & 07777;
  if (S_ISDIR(st.st_mode) && sgid_dir) want |= S_ISGID;
  // As the kernel does for a creator outside the file's group (inode_init_owner).
  if (!S_ISDIR(st.st_mode) && (want & S_ISGID) && c->uid != 0 && !InGroup(req, gid)) want &= ~S_ISGID;
  // chown dropped set-user-ID and set-group-ID bits; the caller asked for them.
  if ((st.st_mode & 07777) != want && fchmodat(pfd, name, want, 0) != 0) return Status::FromErrno(errno, "local/ chmod");
  return Status::Ok();
}

void LocalTree::Mkdir(fuse_req_t req, Node* parent, const char* name, mode_t mode) {
  if (int e = NameError(name)) return (void)fuse_reply_err(req, e);
  {
    ScopedUmask no_umask;
    if (mkdirat(NodeFd(parent), name, mode & 07777) != 0) return (void)fuse_reply_err(req, errno);
  }
  if (Status s = Adopt(req, parent, name, mode, false); !s.ok()) {
    unlinkat(NodeFd(parent), name, AT_REMOVEDIR);
    return (void)fuse_reply_err(req, s.ToErrno());
  }
  struct stat st;
  Result<Node*> n = LookupNode(parent, name, &st);
  if (!n.ok()) {
    unlinkat(NodeFd(parent), name, AT_REMOVEDIR);  // failed (EMFILE): nothing made
    return (void)fuse_reply_err(req, n.status().ToErrno());
  }
  fuse_entry_param e = Entry(*n, st);
  LogMeta(MetaOp::kMkdir, NodeFd(parent), name, -1, st.st_mode, -1, nullptr, [req, e] { fuse_reply_entry(req, &e); });
}

void LocalTree::Mknod(fuse_req_t req, Node* parent, const char* name, mode_t mode, dev_t rdev) {
  if (int e = NameError(name)) return (void)fuse_reply_err(req, e);
  {
    ScopedUmask no_umask;
    if (mknodat(NodeFd(parent), name, mode, rdev) != 0) return (void)fuse_reply_err(req, errno);
  }
  if (Status s = Adopt(req, parent, name, mode, false); !s.ok()) {
    unlinkat(NodeFd(parent), name, 0);
    return (void)fuse_reply_err(req, s.ToErrno());
  }
  ReplyMade(req, parent, name);
}

void LocalTree::Symlink(fuse_req_t req, const char* target, Node* parent, const char* name) {
  if (int e = NameError(name)) return (void)fuse_reply_err(req, e);
  if (symlinkat(target, NodeFd(parent), name) != 0) return (void)fuse_reply_err(req, errno);
  if (Status s = Adopt(req, parent, name, 0777, true); !s.ok()) {
    unlinkat(NodeFd(parent), name, 0);
    return (void)fuse_reply_err(req, s.ToErrno());
  }
  ReplyMade(req, parent, name);
}

void LocalTree::Readlink(fuse_req_t req, Node* n) {
  char buf[PATH_MAX + 1];
  ssize_t len = readlinkat(NodeFd(n), "", buf, sizeof(buf));
  if (len < 0) return (void)fuse_reply_err(req, errno);
  if (static_cast<size_t>(len) >= sizeof(buf)) return (void)fuse_reply_err(req, ENAMETOOLONG);
  buf[len] = '\0';
  fuse_reply_readlink(req, buf);
}

void LocalTree::Link(fuse_req_t req, Node* n, Node* newparent, const char* newname) {
  if (newparent->kind != NodeKind::kLocal) return Tree::Link(req, n, newparent, newname);
  if (int e = NameError(newname)) return (void)fuse_reply_err(req, e);
  // AT_EMPTY_PATH links the descriptor's own file (the daemon has CAP_DAC_READ_SEARCH).
  if (linkat(NodeFd(n), "", NodeFd(newparent), newname, AT_EMPTY_PATH) != 0) return (void)fuse_reply_err(req, errno);
  ReplyMade(req, newparent, newname);
}

void LocalTree::Unlink(fuse_req_t req, Node* parent, const char* name) {
  if (int e = NameError(name)) return (void)fuse_reply_err(req, e);
  // Nothing to flush: queued writes go to the file, not the name (LocalFile::wfd).
  struct stat st;
  bool known = fstatat(NodeFd(parent), name, &st, AT_SYMLINK_NOFOLLOW) == 0;
  if (unlinkat(NodeFd(parent), name, 0) != 0) return (void)fuse_reply_err(req, errno);
  if (known && S_ISREG(st.st_mode)) LostName(st.st_dev, st.st_ino);
  LogMeta(MetaOp::kUnlink, NodeFd(parent), name, -1, 0, -1, nullptr, [req] { fuse_reply_err(req, 0); });
}

void LocalTree::LostName(dev_t dev, ino_t ino) {
  auto it = files_.find(Key(dev, ino));
  if (it == files_.end() || it->second->opens > 0) return;
  // The kernel still knows the inode, so an open may still reach it: one whose lookup came
  // before the rename or unlink (an open racing with an atomic save), an O_PATH descriptor,
  // /proc/PID/fd. It must read the bytes written. Dropped when the kernel forgets it (Forgotten).
  if (ctx_.inodes.FindLocal(dev, ino)) return;
  struct stat st;
  if (it->second->wfd.valid() && fstat(it->second->wfd.get(), &st) == 0 && st.st_nlink > 0) return;
  ctx_.queue.Discard(it->first);
  if (!ctx_.queue.Contains(it->first)) files_.erase(it);
}

void LocalTree::Rmdir(fuse_req_t req, Node* parent, const char* name) {
  if (int e = NameError(name)) return (void)fuse_reply_err(req, e);
  if (unlinkat(NodeFd(parent), name, AT_REMOVEDIR) != 0) return (void)fuse_reply_err(req, errno);
  LogMeta(MetaOp::kRmdir, NodeFd(parent), name, -1, 0, -1, nullptr, [req] { fuse_reply_err(req, 0); });
}

void LocalTree::Rename(fuse_req_t req, Node* parent, const char* name, Node* newparent, const char* newname,
                       unsigned int flags) {
  if (newparent->kind != NodeKind::kLocal) return Tree::Rename(req, parent, name, newparent, newname, flags);
  if (int e = NameError(name)) return (void)fuse_reply_err(req, e);
  if (int e = NameError(newname)) return (void)fuse_reply_err(req, e);
  if (flags & ~(RENAME_NOREPLACE | RENAME_EXCHANGE)) return (void)fuse_reply_err(req, EINVAL);
  // Nodes are keyed by their files, so nothing in the inode table or the queue moves.
  struct stat victim;
  bool replaces = !(flags & RENAME_EXCHANGE) &&
                  fstatat(NodeFd(newparent), newname, &victim, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(victim.st_mode);
  if (renameat2(NodeFd(parent), name, NodeFd(newparent), newname, flags) != 0) return (void)fuse_reply_err(req, errno);
  if (replaces) LostName(victim.st_dev, victim.st_ino);
  // RENAME_EXCHANGE is not logged (its replay could not tell whether it was made).
  if (flags & RENAME_EXCHANGE) return (void)fuse_reply_err(req, 0);
  LogMeta(MetaOp::kRename, NodeFd(parent), name, -1, 0, NodeFd(newparent), newname, [req] { fuse_reply_err(req, 0); });
}

// ---- attributes ----

void LocalTree::Getattr(fuse_req_t req, Node* n) {
  struct stat st;
  if (Status s = Stat(n, &st); !s.ok()) return (void)fuse_reply_err(req, s.ToErrno());
  fuse_reply_attr(req, &st, ctx_.attr_timeout);
}

void LocalTree::Setattr(fuse_req_t req, Node* n, const struct stat& attr, int to_set, std::uint64_t fh) {
  fuse_ino_t ino = n->ino;
  // Times, the queued writes' mtime, the reply (and a chmod's record): after the size change.
  auto rest = std::make_shared<std::function<void()>>();
  auto finish = [this, req, ino, attr, to_set, fh, rest = [rest] { (*rest)(); }] {
    Node* n = ctx_.inodes.Find(ino);
    if (!n) return (void)fuse_reply_err(req, ESTALE);
    int nfd = NodeFd(n);
    struct stat cur;
    if (fstatat(nfd, "", &cur, AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW) != 0) return (void)fuse_reply_err(req, errno);
    if (to_set & FUSE_SET_ATTR_MODE) {
      if (S_ISLNK(cur.st_mode)) return (void)fuse_reply_err(req, EOPNOTSUPP);
      if (chmod(ProcPath(nfd).c_str(), attr.st_mode & 07777) != 0) return (void)fuse_reply_err(req, errno);
    }
    if (to_set & (FUSE_SET_ATTR_UID | FUSE_SET_ATTR_GID)) {
      uid_t uid = (to_set & FUSE_SET_ATTR_UID) ? attr.st_uid : static_cast<uid_t>(-1);
      gid_t gid = (to_set & FUSE_SET_ATTR_GID) ? attr.st_gid : static_cast<gid_t>(-1);
      if (fchownat(nfd, "", uid, gid, AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW) != 0) return (void)fuse_reply_err(req, errno);
    }
    if (to_set & FUSE_SET_ATTR_SIZE) {
      auto of = opens_.find(fh);
      int r;
      if (of != opens_.end() && (of->second.flags & O_ACCMODE) != O_RDONLY) {
        r = ftruncate(of->second.fd.get(), attr.st_size);
      } else {
        UniqueFd w(open(ProcPath(nfd).c_str(), O_WRONLY | O_CLOEXEC));
        if (!w.valid()) return (void)fuse_reply_err(req, errno);
        r = ftruncate(w.get(), attr.st_size);
      }
      if (r != 0) return (void)fuse_reply_err(req, errno);
      // Logged records of the file must not outlive the truncate when the log is replayed; nor
      // may a logged truncate alone (logged while a flush took the file's bytes) undo it. The
      // reply waits until the truncate is durable in the log: an fsync after it returns at once
      // (nothing queued), and an unmount's flush must find it in the log, not still waiting
      // behind a running flush (which rewrites the older bytes into the cut file).
      if (ctx_.flash && ctx_.flash->Changes(nfd)) {
        ctx_.flash->AppendTruncate(nfd, static_cast<Bytes>(attr.st_size), [rest, req](Status s) {
          if (!s.ok()) {
            std::fprintf(stderr, "ghostfs: local/: logging a truncate: %s\n", s.ToString().c_str());
            return (void)fuse_reply_err(req, s.ToErrno());
          }
          rest();
        });
        return;
      }
    }
    rest();
  };
  // The rest of Setattr, once a size change is durable.
  *rest = [this, req, ino, attr, to_set] {
    Node* n = ctx_.inodes.Find(ino);
    if (!n) return (void)fuse_reply_err(req, ESTALE);
    int nfd = NodeFd(n);
    struct stat cur;
    if (fstatat(nfd, "", &cur, AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW) != 0) return (void)fuse_reply_err(req, errno);
    if (to_set & (FUSE_SET_ATTR_ATIME | FUSE_SET_ATTR_MTIME)) {
      timespec ts[2];
      ts[0] = (to_set & FUSE_SET_ATTR_ATIME_NOW) ? timespec{0, UTIME_NOW}
              : (to_set & FUSE_SET_ATTR_ATIME)   ? attr.st_atim
                                                 : timespec{0, UTIME_OMIT};
      ts[1] = (to_set & FUSE_SET_ATTR_MTIME_NOW) ? timespec{0, UTIME_NOW}
              : (to_set & FUSE_SET_ATTR_MTIME)   ? attr.st_mtim
                                                 : timespec{0, UTIME_OMIT};
      if (utimensat(nfd, "", ts, AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW) != 0) return (void)fuse_reply_err(req, errno);
    }
    // Writes still queued would stamp the file with the time they land, losing the mtime just
    // set (a size change or "now" needs no keeping: a later landing is as good).
    if (S_ISREG(cur.st_mode) && (to_set & (FUSE_SET_ATTR_MTIME | FUSE_SET_ATTR_SIZE))) {
      auto f = files_.find(Key(cur.st_dev, cur.st_ino));
      if (f != files_.end()) {
        bool keep = (to_set & FUSE_SET_ATTR_MTIME) && !(to_set & FUSE_SET_ATTR_MTIME_NOW) &&
                    !(to_set & FUSE_SET_ATTR_SIZE) && ctx_.queue.Contains(f->first);
        f->second->mtime_after_writes = keep ? std::optional<timespec>(attr.st_mtim) : std::nullopt;
      }
    }
    struct stat st;
    if (Status s = Stat(n, &st); !s.ok()) return (void)fuse_reply_err(req, s.ToErrno());
    double timeout = ctx_.attr_timeout;
    if (!(to_set & FUSE_SET_ATTR_MODE)) return (void)fuse_reply_attr(req, &st, timeout);
    LogMeta(MetaOp::kChmod, nfd, "", nfd, st.st_mode, -1, nullptr, [req, st, timeout] { fuse_reply_attr(req, &st, timeout); });
  };
  // A size change must not be undone by queued writes: they land first.
  struct stat cur;
  if ((to_set & FUSE_SET_ATTR_SIZE) && fstatat(NodeFd(n), "", &cur, AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW) == 0 &&
      ctx_.queue.Contains(Key(cur.st_dev, cur.st_ino))) {
    return FlushQueue(finish);
  }
  finish();
}

void LocalTree::Opendir(fuse_req_t req, Node* n, fuse_file_info* fi) {
  int fd = openat(NodeFd(n), ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return (void)fuse_reply_err(req, errno);
  DIR* d = fdopendir(fd);
  if (!d) {
    int e = errno;
    close(fd);
    return (void)fuse_reply_err(req, e);
  }
  fi->fh = next_dir_++;
  dirs_.emplace(fi->fh, std::make_unique<OpenDir>(d));
  if (fuse_reply_open(req, fi) != 0) dirs_.erase(fi->fh);  // the opener was interrupted: no releasedir comes
}

void LocalTree::Readdir(fuse_req_t req, Node* n, size_t size, off_t off, fuse_file_info* fi) {
  auto it = dirs_.find(fi->fh);
  if (it == dirs_.end()) return (void)fuse_reply_err(req, EBADF);
  OpenDir& d = *it->second;
  if (off != d.offset) {  // a seekdir, or a rewind: the backing stream goes there too
    seekdir(d.dir, off);
    d.pending = nullptr;
    d.offset = off;
  }
  std::vector<char> buf(size);
  size_t used = 0;
  for (;;) {
    if (d.pending == nullptr) {
      errno = 0;
      d.pending = readdir(d.dir);
      if (d.pending == nullptr) {
        if (errno != 0 && used == 0) return (void)fuse_reply_err(req, errno);
        break;
      }
    }
    const char* name = d.pending->d_name;
    bool dots = std::strcmp(name, ".") == 0 || std::strcmp(name, "..") == 0;
    struct stat st {};
    st.st_ino = dots ? n->ino : kUnknownIno;
    st.st_mode = static_cast<mode_t>(DTTOIF(d.pending->d_type));
    size_t need = fuse_add_direntry(req, buf.data() + used, size - used, name, &st, d.pending->d_off);
    if (need > size - used) break;  // the entry waits for the next call
    used += need;
    d.offset = d.pending->d_off;
    d.pending = nullptr;
  }
  fuse_reply_buf(req, buf.data(), used);
}

void LocalTree::Statfs(fuse_req_t req) {
  struct statvfs st;
  if (statvfs(ProcPath(root_.get()).c_str(), &st) != 0) return (void)fuse_reply_err(req, errno);
  fuse_reply_statfs(req, &st);
}

// ---- open files ----

std::shared_ptr<LocalTree::LocalFile> LocalTree::FileOf(const struct stat& st) {
  std::string key = Key(st.st_dev, st.st_ino);
  auto it = files_.find(key);
  if (it != files_.end()) return it->second;
  auto f = std::make_shared<LocalFile>();
  f->dev = st.st_dev;
  f->ino = st.st_ino;
  f->key = key;
  files_[key] = f;
  return f;
}

void LocalTree::DropIdle() {
  for (auto it = files_.begin(); it != files_.end();) {
    if (it->second->opens == 0 && !ctx_.queue.Contains(it->first)) {
      it = files_.erase(it);
    } else {
      ++it;
    }
  }
}

Status LocalTree::AddOpen(fuse_file_info* fi, UniqueFd fd) {
  struct stat st;
  if (fstat(fd.get(), &st) != 0) return Status::FromErrno(errno, "local/ fstat");
  std::shared_ptr<LocalFile> f = FileOf(st);
  bool writable = (fi->flags & O_ACCMODE) != O_RDONLY;
  if (writable && !f->wfd.valid()) {
    f->wfd.reset(open(ProcPath(fd.get()).c_str(), O_WRONLY | O_CLOEXEC));
    if (!f->wfd.valid()) {
      Status s = Status::FromErrno(errno, "local/ open for writing");
      if (f->opens == 0) files_.erase(f->key);
      return s;
    }
  }
  ++f->opens;
  OpenFile of;
  of.file = f;
  of.fd = std::move(fd);
  of.flags = fi->flags;
  of.seen_err_seq = f->err_seq;  // earlier errors belong to the opens that saw them happen
  fi->fh = ctx_.new_fh();
  opens_[fi->fh] = std::move(of);
  return Status::Ok();
}

// Flags for the backing descriptor: the kernel resolved the name and made any truncation a
// SETATTR; O_APPEND is applied by the daemon (queued writes decide where the end is).
static int BackingFlags(int flags) {
  return (flags & ~(O_CREAT | O_EXCL | O_NOCTTY | O_TRUNC | O_APPEND | O_NOFOLLOW | O_DIRECT)) | O_CLOEXEC;
}

void LocalTree::Open(fuse_req_t req, Node* n, fuse_file_info* fi) {
  int fd = open(ProcPath(NodeFd(n)).c_str(), BackingFlags(fi->flags));
  if (fd < 0) return (void)fuse_reply_err(req, errno);
  if (Status s = AddOpen(fi, UniqueFd(fd)); !s.ok()) return (void)fuse_reply_err(req, s.ToErrno());
  fuse_reply_open(req, fi);
}

void LocalTree::Create(fuse_req_t req, Node* parent, const char* name, mode_t mode, fuse_file_info* fi) {
  if (int e = NameError(name)) return (void)fuse_reply_err(req, e);
  int pfd = NodeFd(parent);
  int fd;
  bool created = true;
  {
    ScopedUmask no_umask;
    fd = openat(pfd, name, BackingFlags(fi->flags) | O_CREAT | O_EXCL | O_NOFOLLOW, mode & 07777);
  }
  if (fd < 0 && errno == EEXIST && !(fi->flags & O_EXCL)) {
    created = false;  // made meanwhile: open it as it is
    fd = openat(pfd, name, BackingFlags(fi->flags) | O_NOFOLLOW);
  }
  if (fd < 0) return (void)fuse_reply_err(req, errno);
  UniqueFd owned(fd);
  if (created) {
    if (Status s = Adopt(req, parent, name, mode, false); !s.ok()) {
      unlinkat(pfd, name, 0);
      return (void)fuse_reply_err(req, s.ToErrno());
    }
  }
  // Out of descriptors (EMFILE) past the file's creation: the create fails, so the file it made
  // goes too (it stayed: an O_EXCL retry got EEXIST; round 20, helper adv20).
  auto undo = [&] {
    if (created) unlinkat(pfd, name, 0);
  };
  struct stat st;
  Result<Node*> n = LookupNode(parent, name, &st);
  if (!n.ok()) {
    undo();
    return (void)fuse_reply_err(req, n.status().ToErrno());
  }
  if (Status s = AddOpen(fi, std::move(owned)); !s.ok()) {
    ctx_.inodes.Forget((*n)->ino, 1);
    undo();
    return (void)fuse_reply_err(req, s.ToErrno());
  }
  fuse_entry_param e = Entry(*n, st);
  if (!created) return (void)fuse_reply_create(req, &e, fi);
  fuse_file_info reply_fi = *fi;
  LogMeta(MetaOp::kCreate, pfd, name, opens_.at(fi->fh).fd.get(), st.st_mode, -1, nullptr,
          [req, e, reply_fi]() mutable { fuse_reply_create(req, &e, &reply_fi); });
}

void LocalTree::Read(fuse_req_t req, std::uint64_t fh, size_t size, off_t off) {
  auto it = opens_.find(fh);
  if (it == opens_.end()) return (void)fuse_reply_err(req, EBADF);
  OpenFile& of = it->second;
  std::string buf(size, '\0');
  ssize_t n = pread(of.fd.get(), buf.data(), size, off);
  if (n < 0) return (void)fuse_reply_err(req, errno);
  buf.resize(static_cast<size_t>(n));
  // Then what the flash log holds for it (older than what is queued).
  if (ctx_.flash) {
    if (Status s = ctx_.flash->Overlay(of.fd.get(), static_cast<Bytes>(off), size, &buf); !s.ok()) {
      return (void)fuse_reply_err(req, s.ToErrno());
    }
  }
  // Overlay what is still queued for this file (reads see queued data, DESIGN §3.5).
  const std::string& key = of.file->key;
  Bytes end = ctx_.queue.QueuedEnd(key);
  if (end > static_cast<Bytes>(off)) {
    size_t want = static_cast<size_t>(std::min<Bytes>(size, end - static_cast<Bytes>(off)));
    if (buf.size() < want) buf.resize(want, '\0');
    ctx_.queue.Overlay(key, static_cast<Bytes>(off), buf.data(), buf.size());
  }
  fuse_reply_buf(req, buf.data(), buf.size());
}

void LocalTree::Write(fuse_req_t req, std::uint64_t fh, const char* buf, size_t size, off_t off) {
  auto it = opens_.find(fh);
  if (it == opens_.end()) return (void)fuse_reply_err(req, EBADF);
  OpenFile& of = it->second;
  LocalFile& f = *of.file;
  if (!f.wfd.valid()) return (void)fuse_reply_err(req, EBADF);
  if (of.flags & O_APPEND) {
    struct stat st;
    if (fstat(of.fd.get(), &st) != 0) return (void)fuse_reply_err(req, errno);
    off_t disk_end = st.st_size;
    if (ctx_.flash) disk_end = static_cast<off_t>(ctx_.flash->SizeOver(of.fd.get(), static_cast<Bytes>(disk_end)));
    off = std::max<off_t>(disk_end, static_cast<off_t>(ctx_.queue.QueuedEnd(f.key)));
  }
  // Reserve the blocks before acknowledging: a full disk fails this write(2), instead of a
  // deferred write failing after the writer may have closed the file (DESIGN §2: nothing
  // acknowledged is lost). KEEP_SIZE allocates without changing the size or the bytes.
  if (size > 0 && fallocate(f.wfd.get(), FALLOC_FL_KEEP_SIZE, off, static_cast<off_t>(size)) != 0) {
    int e = errno;
    if (e != EOPNOTSUPP) return (void)fuse_reply_err(req, e);
    // A backing file system without fallocate: refuse what cannot fit with what is queued.
    struct statvfs vfs;
    if (fstatvfs(f.wfd.get(), &vfs) == 0 &&
        static_cast<Bytes>(vfs.f_bavail) * vfs.f_frsize < ctx_.queue.queued_bytes() + size) {
      return (void)fuse_reply_err(req, ENOSPC);
    }
  }
  f.mtime_after_writes.reset();  // this write moves the mtime on, as it would anywhere
  WriteRecord r;
  r.kind = WriteKind::kLocalFile;
  r.key = f.key;
  r.offset = static_cast<Bytes>(off);
  r.length = size;
  r.data.assign(buf, size);
  ctx_.queue.Add(std::move(r));
  if (ctx_.baseline_write) ctx_.baseline_write(size);
  fuse_reply_write(req, size);
}

int LocalTree::TakeError(OpenFile& of) {
  if (of.seen_err_seq == of.file->err_seq) return 0;
  of.seen_err_seq = of.file->err_seq;
  return of.file->err;
}

void LocalTree::FlushQueue(std::function<void()> done) { ctx_.queue.FlushAll(std::move(done)); }

void LocalTree::Flush(fuse_req_t req, std::uint64_t fh) {
  auto it = opens_.find(fh);
  if (it == opens_.end()) return (void)fuse_reply_err(req, EBADF);
  // close() reports a deferred write of this file that failed since this open last asked.
  fuse_reply_err(req, TakeError(it->second));
}

void LocalTree::Fsync(fuse_req_t req, std::uint64_t fh, int datasync) {
  if (!opens_.contains(fh)) return (void)fuse_reply_err(req, EBADF);
  // Durable means on the disk: flush the queue (this may spin the disk up), then fsync.
  FlushQueue([this, req, fh, datasync] {
    auto it = opens_.find(fh);
    if (it == opens_.end()) return (void)fuse_reply_err(req, EBADF);
    if (int err = TakeError(it->second)) return (void)fuse_reply_err(req, err);
    int fd = it->second.fd.get();
    int r = datasync ? fdatasync(fd) : fsync(fd);
    fuse_reply_err(req, r == 0 ? 0 : errno);
  });
}

void LocalTree::Fallocate(fuse_req_t req, std::uint64_t fh, int mode, off_t off, off_t len) {
  auto it = opens_.find(fh);
  if (it == opens_.end()) return (void)fuse_reply_err(req, EBADF);
  if (mode & ~FALLOC_FL_KEEP_SIZE) return (void)fuse_reply_err(req, EOPNOTSUPP);
  if ((it->second.flags & O_ACCMODE) == O_RDONLY || !it->second.file->wfd.valid()) {
    return (void)fuse_reply_err(req, EBADF);
  }
  int fd = it->second.file->wfd.get();
  struct stat before;
  if (fstat(fd, &before) != 0) return (void)fuse_reply_err(req, errno);
  // The file's size as readers see it: the disk's, the logged bytes and truncates over it, the
  // queued writes' end (Write's O_APPEND end). Not the disk's alone: a fallocate ending short
  // of bytes still in the log must not log a "truncate" to its end, which cut them.
  Bytes size_before = static_cast<Bytes>(before.st_size);
  if (ctx_.flash) size_before = ctx_.flash->SizeOver(fd, size_before);
  size_before = std::max<Bytes>(size_before, ctx_.queue.QueuedEnd(it->second.file->key));
  if (fallocate(fd, mode, off, len) != 0) return (void)fuse_reply_err(req, errno);
  // A size it grew is logged as a truncate upwards for a file with logged records, so their
  // replay, which makes every logged truncate again, does not cut the file back.
  Bytes end = static_cast<Bytes>(off) + static_cast<Bytes>(len);
  // The reply waits until it is durable in the log (as Setattr's truncate).
  if (!(mode & FALLOC_FL_KEEP_SIZE) && end > size_before && ctx_.flash && ctx_.flash->Changes(fd)) {
    return ctx_.flash->AppendTruncate(fd, end, [req](Status s) {
      if (!s.ok()) std::fprintf(stderr, "ghostfs: local/: logging a fallocate's size: %s\n", s.ToString().c_str());
      fuse_reply_err(req, s.ok() ? 0 : s.ToErrno());
    });
  }
  fuse_reply_err(req, 0);
}

void LocalTree::Release(std::uint64_t fh) {
  auto it = opens_.find(fh);
  if (it == opens_.end()) return;
  std::shared_ptr<LocalFile> f = it->second.file;
  opens_.erase(it);
  --f->opens;
  if (f->opens == 0 && !ctx_.queue.Contains(f->key)) files_.erase(f->key);
}

void LocalTree::ApplyWrite(WriteRecord record, std::function<void()> done) {
  auto it = files_.find(record.key);
  if (it == files_.end() || !it->second->wfd.valid()) {
    // Cannot happen: a file stays while it has queued writes. Say so rather than lose quietly.
    std::fprintf(stderr, "ghostfs: local/: a queued write has no file (%s); dropped\n", record.key.c_str());
    return done();
  }
  std::shared_ptr<LocalFile> f = it->second;
  int fd = f->wfd.get();
  ctx_.io.Write(fd, record.offset, std::move(record.data), [this, f, done = std::move(done)](Result<std::size_t> n) {
    if (!n.ok()) {
      // Like the kernel's writeback errors: every open of the file sees it at its next fsync
      // or close (TakeError).
      char path[PATH_MAX] = "?";
      ssize_t len = readlink(ProcPath(f->wfd.get()).c_str(), path, sizeof(path) - 1);
      if (len > 0) path[len] = '\0';
      std::fprintf(stderr, "ghostfs: %s: a deferred write failed (its writer's next fsync or close reports it): %s\n",
                   path, n.status().ToString().c_str());
      f->err = n.status().ToErrno();
      ++f->err_seq;
    }
    if (f->mtime_after_writes) {
      timespec ts[2] = {{0, UTIME_OMIT}, *f->mtime_after_writes};
      if (futimens(f->wfd.get(), ts) != 0) {
        std::fprintf(stderr, "ghostfs: local/ %s: restoring the mtime after a deferred write: %s\n", f->key.c_str(),
                     std::strerror(errno));
      }
    }
    done();
  });
}

void LocalTree::ApplyWriteToLog(WriteRecord record, std::function<void()> done) {
  auto it = files_.find(record.key);
  if (it == files_.end() || !it->second->wfd.valid() || ctx_.flash == nullptr) {
    std::fprintf(stderr, "ghostfs: local/: a queued write has no file (%s); dropped\n", record.key.c_str());
    return done();
  }
  std::shared_ptr<LocalFile> f = it->second;
  ctx_.flash->AppendWrite(f->wfd.get(), record.offset, std::move(record.data),
                          [f, done = std::move(done)](Status s) {
    if (!s.ok()) {
      char path[PATH_MAX] = "?";
      std::string proc = "/proc/self/fd/" + std::to_string(f->wfd.get());
      ssize_t len = readlink(proc.c_str(), path, sizeof(path) - 1);
      if (len > 0) path[len] = '\0';
      std::fprintf(stderr, "ghostfs: %s: a deferred write went neither into the flash log nor to the disk (its "
                   "writer's next fsync or close reports it): %s\n", path, s.ToString().c_str());
      f->err = s.ToErrno();
      ++f->err_seq;
    }
    done();
  });
}

// ---- extended attributes ----
// On the backing file through /proc/self/fd (an O_PATH descriptor takes no xattr calls).
// Symbolic links take no user.* attributes (as on ext4 and tmpfs).

void LocalTree::Setxattr(fuse_req_t req, Node* n, const char* name, const char* value, size_t size, int flags) {
  struct stat st;
  if (fstatat(NodeFd(n), "", &st, AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW) != 0) return (void)fuse_reply_err(req, errno);
  if (S_ISLNK(st.st_mode)) return (void)fuse_reply_err(req, EPERM);
  int r = setxattr(ProcPath(NodeFd(n)).c_str(), name, value, size, flags);
  fuse_reply_err(req, r == 0 ? 0 : errno);
}

void LocalTree::Getxattr(fuse_req_t req, Node* n, const char* name, size_t size) {
  struct stat st;
  if (fstatat(NodeFd(n), "", &st, AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW) != 0) return (void)fuse_reply_err(req, errno);
  if (S_ISLNK(st.st_mode)) return (void)fuse_reply_err(req, ENODATA);
  // A file with bytes in the flash log is read from there (the cost model's source "flash").
  if (S_ISREG(st.st_mode) && std::strcmp(name, "user.ghost.source") == 0 && ctx_.flash &&
      ctx_.flash->Holds(NodeFd(n))) {
    const char* src = ReadSourceName(ReadSource::kFlash);
    std::vector<char> v(src, src + std::strlen(src));
    if (size != 0 && size < v.size()) return (void)fuse_reply_err(req, ERANGE);
    return ReplyXattrBuf(req, static_cast<ssize_t>(v.size()), v, size);
  }
  std::vector<char> buf(size);
  ssize_t r = getxattr(ProcPath(NodeFd(n)).c_str(), name, size ? buf.data() : nullptr, size);
  ReplyXattrBuf(req, r, buf, size);
}

void LocalTree::Listxattr(fuse_req_t req, Node* n, size_t size) {
  struct stat st;
  if (fstatat(NodeFd(n), "", &st, AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW) != 0) return (void)fuse_reply_err(req, errno);
  std::vector<char> buf(size);
  if (S_ISLNK(st.st_mode)) return ReplyXattrBuf(req, 0, buf, size);
  ssize_t r = listxattr(ProcPath(NodeFd(n)).c_str(), size ? buf.data() : nullptr, size);
  ReplyXattrBuf(req, r, buf, size);
}

void LocalTree::Removexattr(fuse_req_t req, Node* n, const char* name) {
  struct stat st;
  if (fstatat(NodeFd(n), "", &st, AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW) != 0) return (void)fuse_reply_err(req, errno);
  if (S_ISLNK(st.st_mode)) return (void)fuse_reply_err(req, ENODATA);
  int r = removexattr(ProcPath(NodeFd(n)).c_str(), name);
  fuse_reply_err(req, r == 0 ? 0 : errno);
}

}  // namespace ghost
