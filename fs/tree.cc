// The defaults of a read-only tree, and the reply helpers every tree uses (tree.h).
#include "fs/tree.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>

namespace ghost {

int Tree::NotWritable(const Node*) const { return EROFS; }

void Tree::Setattr(fuse_req_t req, Node*, struct stat*, int, fuse_file_info*) { fuse_reply_err(req, EROFS); }
void Tree::Create(fuse_req_t req, Node* parent, const char*, mode_t, fuse_file_info*) {
  fuse_reply_err(req, NotWritable(parent));
}
void Tree::Opendir(fuse_req_t req, Node*, fuse_file_info* fi) { fuse_reply_open(req, fi); }
void Tree::Read(fuse_req_t req, Node*, size_t, off_t, fuse_file_info*) { fuse_reply_err(req, EBADF); }
void Tree::Write(fuse_req_t req, Node*, const char*, size_t, off_t, fuse_file_info*) { fuse_reply_err(req, EROFS); }
void Tree::Flush(fuse_req_t req, Node*, fuse_file_info*) { fuse_reply_err(req, 0); }
void Tree::Fsync(fuse_req_t req, Node*, int, fuse_file_info*) { fuse_reply_err(req, 0); }
void Tree::Fallocate(fuse_req_t req, Node*, int, off_t, off_t, fuse_file_info*) { fuse_reply_err(req, EOPNOTSUPP); }
void Tree::Release(fuse_req_t req, Node*, fuse_file_info*) { fuse_reply_err(req, 0); }
void Tree::Mkdir(fuse_req_t req, Node* parent, const char*, mode_t) { fuse_reply_err(req, NotWritable(parent)); }
void Tree::Mknod(fuse_req_t req, Node* parent, const char*, mode_t, dev_t) { fuse_reply_err(req, NotWritable(parent)); }
void Tree::Symlink(fuse_req_t req, const char*, Node* parent, const char*) { fuse_reply_err(req, NotWritable(parent)); }
void Tree::Readlink(fuse_req_t req, Node*) { fuse_reply_err(req, EINVAL); }  // no links
// Maildir writers (Python's mailbox) try link(2) first and fall back to rename on EPERM.
void Tree::Link(fuse_req_t req, Node*, Node*, const char*) { fuse_reply_err(req, EPERM); }
void Tree::Unlink(fuse_req_t req, Node* parent, const char*) { fuse_reply_err(req, NotWritable(parent)); }
void Tree::Rmdir(fuse_req_t req, Node* parent, const char*) { fuse_reply_err(req, NotWritable(parent)); }
void Tree::Rename(fuse_req_t req, Node* parent, const char*, Node* newparent, const char*, unsigned int) {
  fuse_reply_err(req, (parent->kind == NodeKind::kOriginDir || newparent->kind == NodeKind::kOriginDir) ? EROFS : EXDEV);
}
void Tree::Getxattr(fuse_req_t req, Node*, const char*, size_t) { fuse_reply_err(req, ENODATA); }
void Tree::Listxattr(fuse_req_t req, Node*, size_t size) { ReplyXattr(req, std::string(), size); }
// Only local/ keeps attributes that users set; elsewhere ENOTSUP (never ENOSYS, which the
// kernel would take as "no setxattr on the whole mount").
void Tree::Setxattr(fuse_req_t req, Node*, const char*, const char*, size_t, int) { fuse_reply_err(req, ENOTSUP); }
void Tree::Removexattr(fuse_req_t req, Node*, const char*) { fuse_reply_err(req, ENOTSUP); }

namespace {
const std::int64_t kStartedUnix = static_cast<std::int64_t>(std::time(nullptr));
// The daemon's owner, once: every entry and attribute reply carries it, and getuid/getgid are
// system calls (the daemon never changes its ids).
const uid_t kOwnerUid = getuid();
const gid_t kOwnerGid = getgid();
}  // namespace

std::int64_t MountedUnix() { return kStartedUnix; }

struct stat DirStat(fuse_ino_t ino, mode_t perm) {
  struct stat st {};
  st.st_mtim.tv_sec = st.st_ctim.tv_sec = st.st_atim.tv_sec = MountedUnix();  // not 1970
  st.st_ino = ino;
  st.st_mode = S_IFDIR | perm;
  st.st_nlink = 2;
  st.st_uid = kOwnerUid;
  st.st_gid = kOwnerGid;
  return st;
}

struct stat FileStat(fuse_ino_t ino, Bytes size, mode_t perm, std::optional<std::int64_t> mtime) {
  struct stat st {};
  st.st_ino = ino;
  st.st_mode = S_IFREG | perm;
  st.st_nlink = 1;
  st.st_size = static_cast<off_t>(size);
  st.st_blocks = static_cast<blkcnt_t>((size + 511) / 512);
  st.st_uid = kOwnerUid;
  st.st_gid = kOwnerGid;
  if (mtime) st.st_mtim.tv_sec = st.st_ctim.tv_sec = *mtime;
  return st;
}

fuse_entry_param NodeEntry(const Node* n, const struct stat& st, double timeout) {
  fuse_entry_param e{};
  e.ino = n->ino;
  e.attr = st;
  e.attr.st_ino = n->ino;
  e.attr_timeout = timeout;
  e.entry_timeout = timeout;
  return e;
}

void ReplyNodeEntry(fuse_req_t req, const Node* n, const struct stat& st, double timeout) {
  fuse_entry_param e = NodeEntry(n, st, timeout);
  fuse_reply_entry(req, &e);
}

namespace {

// Collects directory entries into the reply buffer, from offset `off` on.
class DirBuffer {
 public:
  DirBuffer(fuse_req_t req, size_t size, off_t off) : req_(req), buf_(size), off_(off) {}
  // Returns false when the buffer is full.
  bool Add(const std::string& name, fuse_ino_t ino, mode_t mode) {
    ++index_;
    if (index_ <= off_) return true;
    struct stat st {};
    st.st_ino = ino;
    st.st_mode = mode;
    size_t need = fuse_add_direntry(req_, buf_.data() + used_, buf_.size() - used_, name.c_str(), &st, index_);
    if (need > buf_.size() - used_) return false;
    used_ += need;
    return true;
  }
  void Reply() { fuse_reply_buf(req_, buf_.data(), used_); }

 private:
  fuse_req_t req_;
  std::vector<char> buf_;
  off_t off_;
  off_t index_ = 0;
  size_t used_ = 0;
};

}  // namespace

void ReplyDirEntries(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
                     const std::vector<std::pair<std::string, mode_t>>& entries) {
  DirBuffer out(req, size, off);
  if (out.Add(".", ino, S_IFDIR) && out.Add("..", ino, S_IFDIR)) {
    for (const auto& [name, mode] : entries) {
      if (!out.Add(name, kUnknownIno, mode)) break;
    }
  }
  out.Reply();
}

void ReplyXattr(fuse_req_t req, const std::string& value, size_t size) {
  if (size == 0) return (void)fuse_reply_xattr(req, value.size());
  if (size < value.size()) return (void)fuse_reply_err(req, ERANGE);
  fuse_reply_buf(req, value.data(), value.size());
}

const char* SourceLabel(ReadSource s) {
  return s == ReadSource::kRevalidate ? "revalidated" : ReadSourceName(s);
}

bool BadName(const char* name) {
  return name[0] == '\0' || std::strcmp(name, ".") == 0 || std::strcmp(name, "..") == 0 ||
         std::strchr(name, '/') != nullptr || std::strlen(name) > 255;
}

}  // namespace ghost
