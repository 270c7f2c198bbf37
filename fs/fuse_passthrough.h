// FusePassthrough: kernel FUSE passthrough for opens of fully cached bodies, so that reads of
// a cached object go from the kernel straight to the body file in the cache directory (no
// READ request, no copy through the daemon).
//
// The kernel has it since Linux 6.9 (CONFIG_FUSE_PASSTHROUGH); libfuse only since 3.16. Debian
// 12 ships libfuse 3.14, so this is a small shim over what 3.14 does offer:
//   - fuse_session_custom_io() replaces the session's read and writev functions. In 3.14 it
//     only checks its arguments, copies the two functions and sets the session's fd (checked
//     in the 3.14 binary: nothing else), so it can be called after fuse_session_mount() with
//     fuse_session_fd(); the INIT request has not been read then.
//   - INIT: Read() sees the kernel's FUSE_INIT request (whether it offers FUSE_PASSTHROUGH,
//     bit 37, in flags2 with FUSE_INIT_EXT); Writev() patches libfuse's reply to that unique:
//     FUSE_INIT_EXT, the FUSE_PASSTHROUGH bit and max_stack_depth (the kernel ignores the flag
//     unless 1 <= max_stack_depth <= FILESYSTEM_MAX_STACK_DEPTH and writeback_cache is off:
//     fs/fuse/inode.c process_init_reply). libfuse 3.14's fuse_init_out has these fields as
//     unused words, sent zeroed, so the reply has room for them.
//   - Open: FUSE_DEV_IOC_BACKING_OPEN registers the body's fd and returns a backing id;
//     ReplyOpen() sends libfuse's open reply with FOPEN_PASSTHROUGH and that id patched into
//     struct fuse_open_out (the 3.14 header calls the field `padding`).
//
// Kernel rules this follows (fs/fuse/iomode.c, backing.c):
//   - An inode is in one io mode at a time. Cached-mode opens (page cache; not direct_io) and
//     passthrough opens exclude each other, and while an inode has a backing file (passthrough
//     opens active) every other open of it must carry FOPEN_PASSTHROUGH too; the open that
//     breaks a rule fails with EIO. A plain direct_io open mixes with cached opens only.
//     So: Acquire refuses while cached-mode opens are active (the open takes the normal path),
//     and while passthrough opens are active an open that cannot be passthrough (a body being
//     fetched, a newer body) is sent as FOPEN_PASSTHROUGH | FOPEN_DIRECT_IO on the inode's
//     backing id (JoinBacking): its reads and writes still go to the daemon; only an mmap of it
//     maps the backing file, i.e. the body the passthrough opens read.
//   - All passthrough opens of one inode must share one backing file (else EBUSY), so the
//     inode's opens share one backing id while they last; the id is closed once neither an
//     inode's opens nor the kept backings (below) refer to it.
//   - The kernel looks the id up when the opener processes the reply, after our writev has
//     returned; closing the id right after the reply could race with that. It takes its own
//     reference then (the backing file outlives the id), so closing at the last release is safe.
//   - FOPEN_KEEP_CACHE is not allowed with FOPEN_PASSTHROUGH; the patch clears it.
//   - Registering needs CAP_SYS_ADMIN; a backing file on a stacked file system (overlayfs)
//     needs max_stack_depth 2, which is chosen from the cache directory's file system type.
// If the kernel does not offer passthrough, or the first registration fails, passthrough stays
// off for the mount with one log line, and every open takes the daemon's normal read path.
//
// Kept backings: a backing id registered for an object (the caller's key: its URL) stays
// registered after the last release of its opens, so the next open of the same object is
// answered with it at once (AcquireKept): no registration, and for a packed body no index
// read, memfd or copy. A backing id is not tied to an inode in the kernel (it is a reference to
// the backing file), so a new inode of the same object (after the kernel forgot the old one)
// reuses it. The caller drops a key's kept backing (DropKept) the moment its object changes
// (replaced, evicted, new metadata), so a kept backing never serves a version the index no
// longer has, nor holds an evicted file's space. Bounded: kMaxKept ids and kMaxKeptBytes of
// memfd copies, the least recently acquired idle ones out first.
//
// Thread-safety: not thread-safe; the daemon's one event-loop thread calls everything
// (libfuse calls Read and Writev from fuse_session_receive_buf and fuse_reply_* on that thread).
#ifndef GHOST_FS_FUSE_PASSTHROUGH_H_
#define GHOST_FS_FUSE_PASSTHROUGH_H_

#include <fuse_lowlevel.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/uio.h>

#include <cstdint>
#include <list>
#include <nlohmann/json.hpp>
#include <optional>
#include <string_view>
#include <string>
#include <unordered_map>

#include "common/base/status.h"
#include "fs/inval_notifier.h"

namespace ghost {

class FusePassthrough {
 public:
  // Where negotiation stands; kOn once the kernel accepted a backing file.
  enum class State { kOff, kWaitingForInit, kNegotiated, kOn, kUnavailable };

  // `cache_dir` holds the backing files (its file system type sets max_stack_depth).
  explicit FusePassthrough(std::string cache_dir);
  FusePassthrough(const FusePassthrough&) = delete;
  FusePassthrough& operator=(const FusePassthrough&) = delete;

  // Installs `io` (whose read and writev must call Read and Writev) on `se`, after
  // fuse_session_mount and before the first request is read. On failure passthrough stays off
  // (logged) and the session is unchanged.
  void Attach(fuse_session* se, const fuse_custom_io& io);
  // The notifier whose thread also writes to the session (kernel cache invalidations): its
  // messages are not replies, and go out unpatched without touching this object's state.
  void SetNotifier(const InvalNotifier* notifier) { notifier_ = notifier; }

  // The session's read and writev, with the INIT and open patches. Same contract as
  // read(2)/writev(2): -1 and errno on failure.
  ssize_t Read(int fd, void* buf, size_t len);
  ssize_t Writev(int fd, const iovec* iov, int count);

  // Whether a passthrough open may be tried (negotiated, and not refused since).
  bool enabled() const { return state_ == State::kNegotiated || state_ == State::kOn; }
  State state() const { return state_; }

  // The backing id for a passthrough open of `ino` reading the complete, immutable body file
  // `body_fd` (the caller keeps it open; the kernel takes its own reference), counted as one
  // passthrough open of `ino` until Released. nullopt: open it the normal way — cached-mode
  // opens of `ino` are active, or passthrough opens of an older body of it, or passthrough is
  // not available (the first refusal is logged once and turns it off).
  // With a non-empty `key`, the backing id is kept for the next open of `key` (AcquireKept).
  std::optional<int> Acquire(fuse_ino_t ino, int body_fd, const std::string& key = {});
  // Acquire for a body held in memory (a small body packed in the index): the bytes are
  // copied into a sealed memfd that the kernel reads instead (the READ round trip of a small
  // file is most of its cost). Only tried while no other open of `ino` is active, so a
  // passthrough open never refuses a later one for being of another backing file.
  std::optional<int> AcquireBytes(fuse_ino_t ino, std::string_view body, const std::string& key = {});
  // The kept backing id of `key` for a passthrough open of `ino`, counted as one passthrough
  // open of `ino` until Released. nullopt: none kept (or dropped), cached-mode opens of `ino`
  // are active, or passthrough opens of `ino` on another backing are; open it the normal way.
  std::optional<int> AcquireKept(fuse_ino_t ino, const std::string& key);
  // `key`'s object changed: its kept backing id is closed now, or at the last release of the
  // opens still reading it; later AcquireKept calls for it fail until a new Acquire keeps one.
  void DropKept(const std::string& key);
  std::size_t kept() const { return kept_.size(); }
  // While passthrough opens of `ino` are active, any other open of it must join them: the
  // inode's backing id, for an open sent with direct_io (reads through the daemon), counted
  // like a passthrough open until Released. nullopt: no passthrough open of `ino` is active.
  std::optional<int> JoinBacking(fuse_ino_t ino);
  // An open that Acquired or Joined was released (or its reply failed); the inode's last one
  // lets go of the id (closed unless it is kept).
  void ReleasePassthrough(fuse_ino_t ino);
  // A cached-mode (not direct_io) open of `ino` was replied / released.
  void CachedOpened(fuse_ino_t ino);
  void CachedReleased(fuse_ino_t ino);

  // fuse_reply_open with FOPEN_PASSTHROUGH and `backing_id` set (FOPEN_DIRECT_IO stays if
  // fi->direct_io); returns what fuse_reply_open returns (-ENOENT: the open was interrupted,
  // no release will come).
  int ReplyOpen(fuse_req_t req, const fuse_file_info* fi, int backing_id);

  // {"state": "on"|..., "opens": passthrough opens so far, "fallbacks": opens that could
  // have been passthrough but were not (another io mode, or an older body, was active),
  // "joined": opens sent with direct_io on a backing id because passthrough opens were active,
  // "kept": backing ids kept now, "kept_hits": opens answered with a kept one}.
  nlohmann::json StatsJson() const;

 private:
  const InvalNotifier* notifier_ = nullptr;
  struct InodeIo {
    int cached = 0;       // cached-mode opens replied and not released
    int passthrough = 0;  // opens replied with FOPEN_PASSTHROUGH and not released
    int backing_id = -1;  // while passthrough > 0 (holds one reference of it)
    dev_t dev = 0;        // the body file the backing id refers to
    ino_t body_ino = 0;
  };
  // A registered backing id: one reference per inode whose passthrough opens use it, one
  // more while it is kept under a key; closed when none is left.
  struct Backing {
    int refs = 0;
    dev_t dev = 0;  // the file it refers to
    ino_t body_ino = 0;
    std::size_t bytes = 0;  // of a memfd copy (0: a body file)
    std::string key;        // kept under this key (empty: not kept)
    std::list<int>::iterator lru;
  };
  static constexpr std::size_t kMaxKept = 512;
  static constexpr std::size_t kMaxKeptBytes = 4 << 20;
  void TurnOff(const std::string& why);
  void Forget(fuse_ino_t ino);  // drops the entry once nothing is open
  // Registers `fd` for a first passthrough open of `ino` (nothing of it open), kept under `key`
  // unless empty. nullopt: the kernel refused (passthrough is turned off).
  std::optional<int> Register(fuse_ino_t ino, InodeIo& io, int fd, const struct stat& st,
                              const std::string& key, std::size_t bytes);
  void Unref(int id);  // the last reference closes the id
  void TrimKept();     // drops kept ids beyond the bounds, least recently acquired first
  std::unordered_map<int, Backing> backings_;
  std::unordered_map<std::string, int> kept_;  // key -> backing id
  std::list<int> kept_lru_;                    // kept ids, most recently acquired first
  std::size_t kept_bytes_ = 0;
  std::uint64_t kept_hits_ = 0;

  std::string cache_dir_;
  State state_ = State::kOff;
  int fuse_fd_ = -1;
  std::uint32_t max_stack_depth_ = 1;
  std::uint64_t init_unique_ = 0;  // the FUSE_INIT request's, until its reply is patched
  bool kernel_offers_ = false;     // FUSE_PASSTHROUGH in the INIT request's flags
  int pending_backing_id_ = -1;    // set only inside ReplyOpen: the reply Writev patches
  bool pending_patched_ = false;
  std::unordered_map<fuse_ino_t, InodeIo> inodes_;
  std::uint64_t opens_ = 0, fallbacks_ = 0, joined_ = 0;
};

}  // namespace ghost

#endif  // GHOST_FS_FUSE_PASSTHROUGH_H_
