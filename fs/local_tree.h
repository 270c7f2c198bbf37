// LocalTree: the mount's writable local/ directory, an ordinary POSIX tree stored in
// CACHE/local, with its writes deferred through the write queue (DESIGN §3.5).
//
// Identity follows the file, not the name (after libfuse's example/passthrough_hp.cc): each
// local/ inode holds an O_PATH descriptor of its backing file and is keyed by the backing
// file's (st_dev, st_ino), so a node, an open file and its queued writes stay with their file
// across rename, RENAME_EXCHANGE, unlink and hard links. An open file is a descriptor of the
// backing file; queued writes of a file are written through a writable descriptor that the
// file keeps (LocalFile::wfd) until its last open is closed and its last queued write is on
// the disk, so writes to an open unlinked file land in that file.
//
// Errors reach the writer: a write is reserved on the backing disk (fallocate) before it is
// acknowledged, so a full disk fails the write(2) itself; a deferred write that still fails
// is recorded in its file's error sequence, and every open that was open when it happened
// sees it once, on its next fsync or close (like the kernel's errseq_t; an open made later,
// by another process, neither sees nor consumes it).
//
// fallocate: mode 0 and FALLOC_FL_KEEP_SIZE (allocation only; no byte changes, so queued and
// logged writes stay valid); modes that change bytes (punch hole, zero, collapse, insert range)
// fail with EOPNOTSUPP.
//
// Ownership and modes are the caller's: new entries belong to the request's uid (and gid, or
// the parent's group under a set-group-ID directory); modes arrive from the kernel already
// masked by the caller's umask and are applied without the daemon's.
//
// O_TRUNC: the daemon does not take FUSE's atomic O_TRUNC, so the kernel truncates an opened
// file with a SETATTR after its own checks, exactly as on tmpfs or ext4: open(O_RDONLY |
// O_TRUNC) truncates when the caller may write the file, and fails with ETXTBSY (truncating
// nothing) when the file is being executed.
//
// Thread-safety: not thread-safe; the daemon's one event-loop thread owns it.
#ifndef GHOST_FS_LOCAL_TREE_H_
#define GHOST_FS_LOCAL_TREE_H_

#include <dirent.h>
#include <fuse_lowlevel.h>
#include <sys/stat.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/base/file_io.h"
#include "common/base/status.h"
#include "common/cache/flush_plan.h"
#include "common/cache/write_queue.h"
#include "fs/inode_table.h"
#include "fs/tree.h"

namespace ghost {

class LocalFlashLog;  // fs/flash_local.h

// What the local tree shares with the daemon: nothing else of it is reachable.
struct LocalContext {
  InodeTable& inodes;
  WriteQueue& queue;  // deferred writes; records of kind WriteKind::kLocalFile come back
                      // to LocalTree::ApplyWrite
  FileIo& io;         // the writer's file I/O
  std::function<std::uint64_t()> new_fh;  // a file handle unique across the mount
  // Replies to a readdir with ".", ".." and `entries` from offset `off` on.
  std::function<void(fuse_req_t, fuse_ino_t, size_t, off_t, const std::vector<std::pair<std::string, mode_t>>&)>
      reply_dir_entries;
  std::function<void(Bytes)> baseline_write;  // bytes written: the static baseline writes them too
  double attr_timeout = 1.0;  // seconds the kernel may cache attributes and entries
  // --flash-log (fs/flash_local.h): reads overlay its records, sizes cover them, truncates of
  // files it holds are logged; null without one. Borrowed: outlives the tree.
  LocalFlashLog* flash = nullptr;
};

class LocalTree final : public Tree {
 public:
  // Opens (creating if needed) the backing directory `dir`. `ctx` is borrowed: its references
  // must outlive the tree.
  static Result<std::unique_ptr<LocalTree>> Create(const std::string& dir, LocalContext ctx);
  ~LocalTree();
  LocalTree(const LocalTree&) = delete;
  LocalTree& operator=(const LocalTree&) = delete;

  // ---- FUSE operations on local/ nodes: each replies to `req` exactly once ----
  // local/ checks its own names (NameError): any name the kernel sends reaches it.
  bool ChecksNames() const override { return true; }
  // The Tree operations on open files: the file handle the kernel names (fi->fh).
  void Setattr(fuse_req_t req, Node* n, struct stat* attr, int to_set, fuse_file_info* fi) override {
    Setattr(req, n, *attr, to_set, fi ? fi->fh : 0);
  }
  void Read(fuse_req_t req, Node*, size_t size, off_t off, fuse_file_info* fi) override { Read(req, fi->fh, size, off); }
  void Write(fuse_req_t req, Node*, const char* buf, size_t size, off_t off, fuse_file_info* fi) override {
    Write(req, fi->fh, buf, size, off);
  }
  void Flush(fuse_req_t req, Node*, fuse_file_info* fi) override { Flush(req, fi->fh); }
  void Fsync(fuse_req_t req, Node*, int datasync, fuse_file_info* fi) override { Fsync(req, fi->fh, datasync); }
  void Fallocate(fuse_req_t req, Node*, int mode, off_t off, off_t len, fuse_file_info* fi) override {
    Fallocate(req, fi->fh, mode, off, len);
  }
  void Release(fuse_req_t req, Node*, fuse_file_info* fi) override {
    Release(fi->fh);
    fuse_reply_err(req, 0);
  }
  // Looks up local/ itself (the root's entry "local").
  void LookupRoot(fuse_req_t req);
  void Lookup(fuse_req_t req, Node* parent, const char* name) override;
  void Getattr(fuse_req_t req, Node* n) override;
  // `fh` is the open file the kernel names (0 if none).
  void Setattr(fuse_req_t req, Node* n, const struct stat& attr, int to_set, std::uint64_t fh);
  // A directory open keeps one stream of the backing directory (fi->fh): readdir hands out the
  // backing file system's own offsets (telldir cookies), so a listing read in several calls, or
  // resumed with seekdir, sees every entry present throughout exactly once while others create
  // and unlink, and a directory of n entries costs O(n) to list, not O(n^2).
  void Opendir(fuse_req_t req, Node* n, fuse_file_info* fi) override;
  void Readdir(fuse_req_t req, Node* n, size_t size, off_t off, fuse_file_info* fi) override;
  void Releasedir(std::uint64_t fh) { dirs_.erase(fh); }
  // On success replies with a new file handle (fi->fh) that the daemon routes back here.
  void Open(fuse_req_t req, Node* n, fuse_file_info* fi) override;
  void Create(fuse_req_t req, Node* parent, const char* name, mode_t mode, fuse_file_info* fi) override;
  void Read(fuse_req_t req, std::uint64_t fh, size_t size, off_t off);
  void Write(fuse_req_t req, std::uint64_t fh, const char* buf, size_t size, off_t off);
  void Flush(fuse_req_t req, std::uint64_t fh);
  void Fsync(fuse_req_t req, std::uint64_t fh, int datasync);
  // Allocates blocks (mode 0 may extend the size, FALLOC_FL_KEEP_SIZE does not); never
  // changes a byte, so queued and logged writes stay valid over it. Modes that change bytes
  // (punch hole, zero, collapse, insert range) fail with EOPNOTSUPP.
  void Fallocate(fuse_req_t req, std::uint64_t fh, int mode, off_t off, off_t len);
  // Closes the open file `fh` (no reply: the daemon replies).
  void Release(std::uint64_t fh);
  bool Owns(std::uint64_t fh) const { return opens_.contains(fh); }
  void Mkdir(fuse_req_t req, Node* parent, const char* name, mode_t mode) override;
  void Mknod(fuse_req_t req, Node* parent, const char* name, mode_t mode, dev_t rdev) override;
  void Symlink(fuse_req_t req, const char* target, Node* parent, const char* name) override;
  void Readlink(fuse_req_t req, Node* n) override;
  void Link(fuse_req_t req, Node* n, Node* newparent, const char* newname) override;
  void Unlink(fuse_req_t req, Node* parent, const char* name) override;
  void Rmdir(fuse_req_t req, Node* parent, const char* name) override;
  // renameat2: RENAME_NOREPLACE and RENAME_EXCHANGE are honoured.
  void Rename(fuse_req_t req, Node* parent, const char* name, Node* newparent, const char* newname,
              unsigned int flags) override;
  void Setxattr(fuse_req_t req, Node* n, const char* name, const char* value, size_t size, int flags) override;
  void Getxattr(fuse_req_t req, Node* n, const char* name, size_t size) override;
  void Listxattr(fuse_req_t req, Node* n, size_t size) override;
  void Removexattr(fuse_req_t req, Node* n, const char* name) override;
  void Statfs(fuse_req_t req);

  // ---- the write queue's writer ----
  // Writes `record` (kind kLocalFile) into its file and calls `done` when the write finished
  // (an error is recorded for the file's open writers and logged).
  void ApplyWrite(WriteRecord record, std::function<void()> done);
  // Appends `record` to the flash log instead (the write-back's choice, fs/write_back.h) and
  // calls `done` once it is durable there; a failed append is recorded for the file's open
  // writers (their next fsync or close fails) and logged, as a failed disk write is.
  void ApplyWriteToLog(WriteRecord record, std::function<void()> done);

  // Forgets files with no open and no queued write (call when a batch is durable).
  void DropIdle();
  // The kernel forgot the local/ inode of backing file (dev, ino) (call after
  // InodeTable::Forget freed it): a file with no name left and no open can no longer be
  // opened, so its queued writes are dropped (LostName).
  void Forgotten(dev_t dev, ino_t ino) { LostName(dev, ino); }

 private:
  // A backing file with opens or queued writes.
  struct LocalFile {
    dev_t dev = 0;
    ino_t ino = 0;
    std::string key;      // the write-queue key
    UniqueFd wfd;         // writable descriptor for queued writes (opened on the first write)
    int opens = 0;
    std::uint64_t err_seq = 0;  // bumped by every deferred write that failed
    int err = 0;                // the errno of the latest
    // An mtime the caller set (utimensat: cp -a, tar x, rsync -a) while writes made before it
    // were still queued: each of those, landing, sets it again (a write landing stamps the
    // backing file with its own time). Cleared by a later write or size change.
    std::optional<timespec> mtime_after_writes;
  };
  struct OpenFile {
    std::shared_ptr<LocalFile> file;
    UniqueFd fd;
    int flags = 0;                 // the open's flags (O_APPEND, O_ACCMODE)
    std::uint64_t seen_err_seq = 0;  // errors up to here were reported to this open (or predate it)
  };

  LocalTree(UniqueFd root, LocalContext ctx);
  static std::string Key(dev_t dev, ino_t ino);
  int NodeFd(const Node* n) const;
  // fstat of a node, its size covering queued writes.
  Status Stat(const Node* n, struct stat* st) const;
  // The node of `name` under `parent` (an O_PATH open of the entry), counting one lookup,
  // and its attributes in `st`.
  Result<Node*> LookupNode(Node* parent, const char* name, struct stat* st);
  fuse_entry_param Entry(Node* n, const struct stat& st) const;
  // Looks up `name` under `parent` and replies with its entry.
  void ReplyLookup(fuse_req_t req, Node* parent, const char* name);
  // ReplyLookup for an entry this call just made (mknod, symlink, link): when the lookup fails
  // the entry is removed again, so a call that fails leaves nothing.
  void ReplyMade(fuse_req_t req, Node* parent, const char* name);
  // Registers an open of the file `fd` with fi->flags; sets fi->fh.
  Status AddOpen(fuse_file_info* fi, UniqueFd fd);
  // Makes a just-created entry `name` of `parent` the caller's (uid, gid, exact mode).
  Status Adopt(fuse_req_t req, Node* parent, const char* name, mode_t mode, bool is_symlink);
  std::shared_ptr<LocalFile> FileOf(const struct stat& st);
  // Flushes the write queue (the queue flushes as a whole, sorted and merged, DESIGN §3.5).
  void FlushQueue(std::function<void()> done);
  // A regular file lost a name: if it has no name left, no open, and the kernel no longer
  // knows its inode, its queued writes are dropped and its descriptor closed (the disk gets
  // the space back at once).
  void LostName(dev_t dev, ino_t ino);
  // The errno of a deferred write that failed since this open last asked (0 if none).
  int TakeError(OpenFile& of);
  std::string ProcPath(int fd) const;
  // A metadata change was just made in the backing tree (`name` of `parent`; kRename: to
  // `newname` of `newparent`; `fd` the file for kCreate and kChmod, else -1): when the flash
  // log takes metadata (fs/flash_local.h) it is logged and `reply` runs once the record is
  // durable; otherwise `reply` runs now. The change stands either way (a failed append is
  // logged and synced to the disk by the log).
  void LogMeta(MetaOp op, int parent_fd, const char* name, int fd, mode_t mode, int newparent_fd, const char* newname,
               std::function<void()> reply);

  // An open directory: its stream, the offset it is at, and an entry read but not yet sent
  // (it did not fit the last reply).
  struct OpenDir {
    explicit OpenDir(DIR* d) : dir(d) {}
    ~OpenDir() { closedir(dir); }
    OpenDir(const OpenDir&) = delete;
    OpenDir& operator=(const OpenDir&) = delete;
    DIR* dir;
    off_t offset = 0;
    dirent* pending = nullptr;
  };

  UniqueFd root_;  // CACHE/local (O_PATH)
  LocalContext ctx_;
  std::map<std::uint64_t, OpenFile> opens_;                  // by file handle
  std::map<std::string, std::shared_ptr<LocalFile>> files_;  // by write-queue key
  std::map<std::uint64_t, std::unique_ptr<OpenDir>> dirs_;    // by directory handle
  std::uint64_t next_dir_ = 1;
};

}  // namespace ghost

#endif  // GHOST_FS_LOCAL_TREE_H_
