// InodeTable: the mount's inodes, with lookup counts (after libfuse's passthrough_hp.cc).
//
// Every name the kernel has looked up has an inode here until the kernel forgets it. An inode
// is identified by its place in the namespace: which tree (the root, an origin, .ghost/, a
// Maildir) and the path inside it; except local/ inodes, which are identified by their backing
// file (device and inode number) and hold an O_PATH descriptor of it, so that they keep their
// identity across rename and unlink (fs/local_tree.h). The root is pinned. Paths never contain "." or ".." components: names
// are checked before they get here.
//
// Thread-safety: not thread-safe; the daemon's one event-loop thread owns it.
#ifndef GHOST_FS_INODE_TABLE_H_
#define GHOST_FS_INODE_TABLE_H_

#include <fuse_lowlevel.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>

#include "common/base/file_io.h"

namespace ghost {

enum class NodeKind {
  kRoot,       // the mount point: one directory per origin, plus local/
  kOriginDir,  // a directory of an HTTP origin ("" is the origin's root)
  kOriginFile,
  kLocal,      // local/ itself or an entry under it (any file type), keyed by its backing file
  // The shared store .ghost/ (fs/store_tree.cc): "" itself, "objects" and "fill" directories,
  // then "objects/<hash>" and "fill/<token>" files.
  kStoreDir,
  kStoreObject,
  kStoreFill,
  // An IMAP origin's Maildir (fs/mail_tree.cc): its root, folders ".Name", and their cur/,
  // new/, tmp/ directories; then message files (and tmp/ files).
  kMailDir,
  kMailFile,
};

struct Node {
  fuse_ino_t ino = 0;
  NodeKind kind = NodeKind::kRoot;
  int origin = -1;      // index into the configured origins, for kOriginDir/kOriginFile
  std::string path;     // inside its tree: "" for a tree's root, else "a/b/c" (no slashes at the ends);
                        // kLocal: the backing file's identity "dev:ino"
  std::uint64_t lookups = 0;
  // kOriginFile: the size the kernel was last given for it (an entry or attribute reply), or
  // -1; an open of a version of another size drops the kernel's attributes (OriginTree::Open).
  std::int64_t kernel_size = -1;
  UniqueFd fd;          // kLocal: an O_PATH descriptor of the backing file (closed with the node)
};

class InodeTable {
 public:
  static constexpr fuse_ino_t kRootIno = FUSE_ROOT_ID;

  InodeTable();

  Node* Find(fuse_ino_t ino);
  // The inode of (kind, origin, path), created if new; counts one lookup.
  Node* Lookup(NodeKind kind, int origin, const std::string& path);
  // The local/ inode of backing file (dev, ino), created if new with `fd` (an O_PATH
  // descriptor of it, which the node then owns; else `fd` is closed); counts one lookup.
  Node* LookupLocal(dev_t dev, ino_t ino, UniqueFd fd);
  // The local/ inode of backing file (dev, ino) if the kernel knows it (it may still open it).
  Node* FindLocal(dev_t dev, ino_t ino);
  // The inode of (kind, origin, path) if the kernel knows it.
  Node* FindByPath(NodeKind kind, int origin, const std::string& path);
  // Drops `n` lookups; the inode is freed when none remain (the root never is).
  void Forget(fuse_ino_t ino, std::uint64_t n);
  // A local/ entry moved: it and everything below it get the new path.
  void Rename(NodeKind kind, int origin, const std::string& from, const std::string& to);
  std::size_t size() const { return by_ino_.size(); }

  static std::string Join(const std::string& dir, const std::string& name) {
    return dir.empty() ? name : dir + "/" + name;
  }

 private:
  static std::string Key(NodeKind kind, int origin, const std::string& path);
  static std::string LocalPath(dev_t dev, ino_t ino) { return std::to_string(dev) + ":" + std::to_string(ino); }
  fuse_ino_t next_ino_ = kRootIno + 1;
  std::unordered_map<fuse_ino_t, std::unique_ptr<Node>> by_ino_;
  std::map<std::string, fuse_ino_t> by_key_;  // ordered, so a subtree is a key range
};

}  // namespace ghost

#endif  // GHOST_FS_INODE_TABLE_H_
