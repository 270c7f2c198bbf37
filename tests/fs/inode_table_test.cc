// InodeTable: local/ inodes are keyed by their backing file and own its O_PATH descriptor.
#include "fs/inode_table.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

namespace ghost {
namespace {

// Whether `fd` is an open descriptor.
bool IsOpen(int fd) { return fcntl(fd, F_GETFD) != -1; }

UniqueFd OpenPath() { return UniqueFd(open("/", O_PATH | O_CLOEXEC)); }

TEST(InodeTableTest, LocalInodesAreKeyedByBackingFileNotName) {
  InodeTable t;
  UniqueFd first = OpenPath();
  int first_fd = first.get();
  Node* a = t.LookupLocal(1, 42, std::move(first));
  UniqueFd second = OpenPath();
  int second_fd = second.get();
  Node* again = t.LookupLocal(1, 42, std::move(second));  // a hard link or a new name
  EXPECT_EQ(a, again);
  EXPECT_EQ(a->lookups, 2u);
  EXPECT_EQ(a->kind, NodeKind::kLocal);
  EXPECT_EQ(a->fd.get(), first_fd);
  EXPECT_FALSE(IsOpen(second_fd));  // the duplicate descriptor was closed
  Node* other = t.LookupLocal(2, 42, OpenPath());  // same inode number, other device
  EXPECT_NE(other, a);
}

TEST(InodeTableTest, ForgettingTheLastLookupClosesTheBackingDescriptor) {
  InodeTable t;
  UniqueFd fd = OpenPath();
  int raw = fd.get();
  Node* n = t.LookupLocal(1, 7, std::move(fd));
  fuse_ino_t ino = n->ino;
  t.LookupLocal(1, 7, OpenPath());
  t.Forget(ino, 1);
  EXPECT_TRUE(IsOpen(raw));
  ASSERT_NE(t.Find(ino), nullptr);
  t.Forget(ino, 1);
  EXPECT_EQ(t.Find(ino), nullptr);
  EXPECT_FALSE(IsOpen(raw));
  // The same file looked up again is a new inode number (the kernel forgot the old one).
  Node* back = t.LookupLocal(1, 7, OpenPath());
  EXPECT_NE(back->ino, ino);
}

// LocalTree asks FindLocal whether the kernel may still open a file that lost its last name
// (LocalTree::LostName): only while a lookup of it is counted, never creating one.
TEST(InodeTableTest, FindLocalSeesALocalInodeOnlyWhileTheKernelKnowsIt) {
  InodeTable t;
  EXPECT_EQ(t.FindLocal(1, 9), nullptr);
  EXPECT_EQ(t.size(), 1u);  // the root only: the question added nothing
  Node* n = t.LookupLocal(1, 9, OpenPath());
  EXPECT_EQ(t.FindLocal(1, 9), n);
  EXPECT_EQ(t.FindLocal(2, 9), nullptr);  // another device
  EXPECT_EQ(n->lookups, 1u);               // finding is not a lookup
  t.Forget(n->ino, 1);
  EXPECT_EQ(t.FindLocal(1, 9), nullptr);
}

}  // namespace
}  // namespace ghost
