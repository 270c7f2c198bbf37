#include "fs/inode_table.h"

#include <vector>

namespace ghost {

InodeTable::InodeTable() {
  auto root = std::make_unique<Node>();
  root->ino = kRootIno;
  root->kind = NodeKind::kRoot;
  root->lookups = 1;  // pinned
  by_key_[Key(NodeKind::kRoot, -1, "")] = kRootIno;
  by_ino_[kRootIno] = std::move(root);
}

std::string InodeTable::Key(NodeKind kind, int origin, const std::string& path) {
  // kOriginDir and kOriginFile share a key space: a path is one or the other.
  char tree = kind == NodeKind::kRoot ? 'R' : kind == NodeKind::kLocal ? 'L' : 'O';
  return std::string(1, tree) + std::to_string(origin) + ":" + path;
}

Node* InodeTable::Find(fuse_ino_t ino) {
  auto it = by_ino_.find(ino);
  return it == by_ino_.end() ? nullptr : it->second.get();
}

Node* InodeTable::FindByPath(NodeKind kind, int origin, const std::string& path) {
  auto it = by_key_.find(Key(kind, origin, path));
  return it == by_key_.end() ? nullptr : Find(it->second);
}

Node* InodeTable::Lookup(NodeKind kind, int origin, const std::string& path) {
  std::string key = Key(kind, origin, path);
  auto it = by_key_.find(key);
  Node* n;
  if (it != by_key_.end()) {
    n = Find(it->second);
  } else {
    auto node = std::make_unique<Node>();
    node->ino = next_ino_++;
    node->origin = origin;
    node->path = path;
    n = node.get();
    by_key_[key] = node->ino;
    by_ino_[node->ino] = std::move(node);
  }
  n->kind = kind;  // an origin path may turn out to be a directory after all
  ++n->lookups;
  return n;
}

Node* InodeTable::LookupLocal(dev_t dev, ino_t ino, UniqueFd fd) {
  Node* n = Lookup(NodeKind::kLocal, -1, LocalPath(dev, ino));
  if (!n->fd.valid()) n->fd = std::move(fd);
  return n;
}

Node* InodeTable::FindLocal(dev_t dev, ino_t ino) { return FindByPath(NodeKind::kLocal, -1, LocalPath(dev, ino)); }

void InodeTable::Forget(fuse_ino_t ino, std::uint64_t n) {
  if (ino == kRootIno) return;
  auto it = by_ino_.find(ino);
  if (it == by_ino_.end()) return;
  Node& node = *it->second;
  node.lookups = n >= node.lookups ? 0 : node.lookups - n;
  if (node.lookups > 0) return;
  auto k = by_key_.find(Key(node.kind, node.origin, node.path));
  if (k != by_key_.end() && k->second == ino) by_key_.erase(k);
  by_ino_.erase(it);
}

void InodeTable::Rename(NodeKind kind, int origin, const std::string& from, const std::string& to) {
  std::string exact = Key(kind, origin, from);
  std::string prefix = exact + "/";
  std::vector<std::pair<std::string, fuse_ino_t>> moved;
  for (auto it = by_key_.lower_bound(exact); it != by_key_.end();) {
    if (it->first != exact && it->first.compare(0, prefix.size(), prefix) != 0) break;
    moved.emplace_back(it->first, it->second);
    it = by_key_.erase(it);
  }
  // Whatever the kernel knew at the destination is replaced.
  std::string target = Key(kind, origin, to);
  by_key_.erase(target);
  for (auto& [key, ino] : moved) {
    Node* n = Find(ino);
    n->path = to + n->path.substr(from.size());
    by_key_[Key(kind, origin, n->path)] = ino;
  }
}

}  // namespace ghost
