// The passthrough shim over libfuse 3.14 (see fuse_passthrough.h for what the kernel and
// libfuse require, and why).
#include "fs/fuse_passthrough.h"

#include <linux/fuse.h>
#include <linux/magic.h>
#include <fcntl.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <vector>

#include "common/base/file_io.h"

namespace ghost {
namespace {

// What Linux ≥ 6.9's <linux/fuse.h> has and Debian 12's (6.1) does not.
constexpr std::uint64_t kFusePassthrough = 1ULL << 37;  // INIT flag, in flags2
constexpr std::uint32_t kFopenPassthrough = 1u << 7;
// Open flags the kernel allows with FOPEN_PASSTHROUGH (fs/fuse/iomode.c FOPEN_PASSTHROUGH_MASK:
// PASSTHROUGH | DIRECT_IO | PARALLEL_DIRECT_WRITES | NOFLUSH); anything else fails the open.
constexpr std::uint32_t kPassthroughOpenMask =
    kFopenPassthrough | FOPEN_DIRECT_IO | FOPEN_PARALLEL_DIRECT_WRITES | FOPEN_NOFLUSH;
struct BackingMap {  // struct fuse_backing_map
  std::int32_t fd;
  std::uint32_t flags;    // must be 0
  std::uint64_t padding;  // must be 0
};
static_assert(sizeof(BackingMap) == 16);
const unsigned long kIocBackingOpen = _IOW(FUSE_DEV_IOC_MAGIC, 1, BackingMap);
const unsigned long kIocBackingClose = _IOW(FUSE_DEV_IOC_MAGIC, 2, std::uint32_t);

// Where the newer fields sit in the older structs (same ABI, renamed fields).
constexpr std::size_t kMaxStackDepthOffset =
    offsetof(fuse_init_out, unused);  // u32 max_stack_depth
static_assert(kMaxStackDepthOffset == 36);
constexpr std::size_t kBackingIdOffset = offsetof(fuse_open_out, padding);  // i32 backing_id
static_assert(kBackingIdOffset == 12 && sizeof(fuse_open_out) == 16);
constexpr int kFilesystemMaxStackDepth = 2;  // the kernel's FILESYSTEM_MAX_STACK_DEPTH

std::size_t TotalLength(const iovec* iov, int count) {
  std::size_t n = 0;
  for (int i = 0; i < count; ++i) n += iov[i].iov_len;
  return n;
}

std::vector<char> Flatten(const iovec* iov, int count) {
  std::vector<char> out;
  out.reserve(TotalLength(iov, count));
  for (int i = 0; i < count; ++i) {
    const char* p = static_cast<const char*>(iov[i].iov_base);
    out.insert(out.end(), p, p + iov[i].iov_len);
  }
  return out;
}

template <typename T>
T Load(const std::vector<char>& b, std::size_t at) {
  T v;
  std::memcpy(&v, b.data() + at, sizeof v);
  return v;
}

template <typename T>
void Store(std::vector<char>& b, std::size_t at, T v) {
  std::memcpy(b.data() + at, &v, sizeof v);
}

ssize_t WriteAll(int fd, const std::vector<char>& b) {
  iovec one{const_cast<char*>(b.data()), b.size()};
  return ::writev(fd, &one, 1);
}

const char* StateName(FusePassthrough::State s) {
  switch (s) {
    case FusePassthrough::State::kOff:
      return "off";
    case FusePassthrough::State::kWaitingForInit:
      return "negotiating";
    case FusePassthrough::State::kNegotiated:
      return "negotiated";
    case FusePassthrough::State::kOn:
      return "on";
    case FusePassthrough::State::kUnavailable:
      return "unavailable";
  }
  return "?";
}

}  // namespace

FusePassthrough::FusePassthrough(std::string cache_dir) : cache_dir_(std::move(cache_dir)) {}

void FusePassthrough::Attach(fuse_session* se, const fuse_custom_io& io) {
  int fd = fuse_session_fd(se);
  if (int r = fuse_session_custom_io(se, &io, fd); r != 0) {
    return TurnOff("libfuse refused the custom io: " + std::string(std::strerror(-r)));
  }
  fuse_fd_ = fd;
  // A backing file on a stacked file system needs one more level of stacking below us.
  struct statfs fs;
  if (statfs(cache_dir_.c_str(), &fs) == 0 &&
      (fs.f_type == OVERLAYFS_SUPER_MAGIC || fs.f_type == ECRYPTFS_SUPER_MAGIC)) {
    max_stack_depth_ = kFilesystemMaxStackDepth;
  }
  state_ = State::kWaitingForInit;
}

void FusePassthrough::TurnOff(const std::string& why) {
  state_ = State::kUnavailable;
  std::fprintf(
      stderr,
      "ghostfs: FUSE passthrough unavailable (%s); cached bodies are read through the daemon\n",
      why.c_str());
}

ssize_t FusePassthrough::Read(int fd, void* buf, size_t len) {
  ssize_t n = ::read(fd, buf, len);
  // Only the first request matters: the kernel sends FUSE_INIT before anything else.
  if (state_ != State::kWaitingForInit || init_unique_ != 0 ||
      n < static_cast<ssize_t>(sizeof(fuse_in_header)))
    return n;
  fuse_in_header in;
  std::memcpy(&in, buf, sizeof in);
  if (in.opcode != FUSE_INIT) return n;
  init_unique_ = in.unique;
  fuse_init_in arg{};
  std::size_t have = static_cast<std::size_t>(n) - sizeof in;
  std::memcpy(&arg, static_cast<const char*>(buf) + sizeof in, std::min(have, sizeof arg));
  std::uint64_t flags = arg.flags;
  if (flags & FUSE_INIT_EXT) flags |= static_cast<std::uint64_t>(arg.flags2) << 32;
  kernel_offers_ = (flags & kFusePassthrough) != 0;
  return n;
}

ssize_t FusePassthrough::Writev(int fd, const iovec* iov, int count) {
  if (notifier_ && notifier_->OnNotifierThread()) return ::writev(fd, iov, count);
  bool init_reply = init_unique_ != 0;
  if (!init_reply && pending_backing_id_ < 0) return ::writev(fd, iov, count);
  std::vector<char> msg = Flatten(iov, count);
  if (msg.size() < sizeof(fuse_out_header)) return ::writev(fd, iov, count);
  fuse_out_header out;
  std::memcpy(&out, msg.data(), sizeof out);
  const std::size_t arg = sizeof out;
  const std::size_t arg_len = msg.size() - arg;

  if (init_reply && out.unique == init_unique_) {
    init_unique_ = 0;
    if (out.error != 0) return WriteAll(fd, msg);
    if (!kernel_offers_) {
      TurnOff("the kernel does not offer it: Linux >= 6.9 with CONFIG_FUSE_PASSTHROUGH is needed");
      return WriteAll(fd, msg);
    }
    if (arg_len < kMaxStackDepthOffset + sizeof(std::uint32_t)) {
      TurnOff("libfuse's INIT reply is too short to carry max_stack_depth");
      return WriteAll(fd, msg);
    }
    std::uint32_t flags = Load<std::uint32_t>(msg, arg + offsetof(fuse_init_out, flags));
    if (flags & FUSE_WRITEBACK_CACHE) {
      TurnOff("writeback caching is on, and the kernel allows passthrough only without it");
      return WriteAll(fd, msg);
    }
    std::uint32_t flags2 = Load<std::uint32_t>(msg, arg + offsetof(fuse_init_out, flags2));
    Store<std::uint32_t>(msg, arg + offsetof(fuse_init_out, flags), flags | FUSE_INIT_EXT);
    Store<std::uint32_t>(msg, arg + offsetof(fuse_init_out, flags2),
                         flags2 | static_cast<std::uint32_t>(kFusePassthrough >> 32));
    Store<std::uint32_t>(msg, arg + kMaxStackDepthOffset, max_stack_depth_);
    state_ = State::kNegotiated;
    return WriteAll(fd, msg);
  }
  if (pending_backing_id_ >= 0 && out.error == 0 && arg_len == sizeof(fuse_open_out)) {
    std::uint32_t open_flags = Load<std::uint32_t>(msg, arg + offsetof(fuse_open_out, open_flags));
    Store<std::uint32_t>(msg, arg + offsetof(fuse_open_out, open_flags),
                         (open_flags & kPassthroughOpenMask) | kFopenPassthrough);
    Store<std::int32_t>(msg, arg + kBackingIdOffset, pending_backing_id_);
    pending_patched_ = true;
    return WriteAll(fd, msg);
  }
  return ::writev(fd, iov, count);
}

std::optional<int> FusePassthrough::Acquire(fuse_ino_t ino, int body_fd, const std::string& key) {
  if (!enabled()) return std::nullopt;
  struct stat st;
  if (fstat(body_fd, &st) != 0) return std::nullopt;
  InodeIo& io = inodes_[ino];
  if (io.cached > 0) {
    ++fallbacks_;
    return std::nullopt;
  }
  if (io.passthrough > 0) {
    // One backing file per inode: a replaced body waits until the old one's opens are gone.
    if (io.dev != st.st_dev || io.body_ino != st.st_ino) {
      ++fallbacks_;
      return std::nullopt;
    }
    ++io.passthrough;
    ++opens_;
    return io.backing_id;
  }
  return Register(ino, io, body_fd, st, key, 0);
}

std::optional<int> FusePassthrough::Register(fuse_ino_t ino, InodeIo& io, int fd, const struct stat& st,
                                             const std::string& key, std::size_t bytes) {
  BackingMap map{fd, 0, 0};
  int id = ioctl(fuse_fd_, kIocBackingOpen, &map);
  if (id < 0) {
    int e = errno;
    Forget(ino);
    TurnOff(std::string("FUSE_DEV_IOC_BACKING_OPEN: ") + std::strerror(e) +
            (e == EPERM ? " (needs CAP_SYS_ADMIN, and a kernel that accepted passthrough at INIT)"
                        : ""));
    return std::nullopt;
  }
  state_ = State::kOn;
  io.passthrough = 1;
  io.backing_id = id;
  io.dev = st.st_dev;
  io.body_ino = st.st_ino;
  Backing& b = backings_[id];
  b.refs = 1;  // the inode's
  b.dev = st.st_dev;
  b.body_ino = st.st_ino;
  ++opens_;
  if (!key.empty()) {
    DropKept(key);  // an older body of the key: its opens keep their reference
    b.refs += 1;
    b.key = key;
    b.bytes = bytes;
    kept_lru_.push_front(id);
    b.lru = kept_lru_.begin();
    kept_[key] = id;
    kept_bytes_ += bytes;
    TrimKept();
  }
  return id;
}

std::optional<int> FusePassthrough::AcquireBytes(fuse_ino_t ino, std::string_view body, const std::string& key) {
  if (!enabled()) return std::nullopt;
  if (auto it = inodes_.find(ino); it != inodes_.end() && (it->second.cached > 0 || it->second.passthrough > 0)) {
    return std::nullopt;  // the daemon serves it, as before (no fallback counted: no body file)
  }
  UniqueFd fd(memfd_create("ghost-packed", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!fd.valid()) return std::nullopt;
  std::size_t done = 0;
  while (done < body.size()) {
    ssize_t n = pwrite(fd.get(), body.data() + done, body.size() - done, static_cast<off_t>(done));
    if (n <= 0) return std::nullopt;
    done += static_cast<std::size_t>(n);
  }
  // Nothing may change the bytes the kernel reads for this open (the daemon closes its fd
  // right after; the kernel keeps its own reference until the last open is released).
  (void)fcntl(fd.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE | F_SEAL_SEAL);
  struct stat st;
  if (fstat(fd.get(), &st) != 0) return std::nullopt;
  return Register(ino, inodes_[ino], fd.get(), st, key, body.size());
}

std::optional<int> FusePassthrough::AcquireKept(fuse_ino_t ino, const std::string& key) {
  if (!enabled()) return std::nullopt;
  auto k = kept_.find(key);
  if (k == kept_.end()) return std::nullopt;
  int id = k->second;
  Backing& b = backings_[id];
  InodeIo& io = inodes_[ino];
  if (io.cached > 0 || (io.passthrough > 0 && io.backing_id != id)) {
    ++fallbacks_;
    Forget(ino);
    return std::nullopt;
  }
  if (io.passthrough++ == 0) {
    io.backing_id = id;
    io.dev = b.dev;
    io.body_ino = b.body_ino;
    ++b.refs;
  }
  kept_lru_.splice(kept_lru_.begin(), kept_lru_, b.lru);
  ++opens_;
  ++kept_hits_;
  return id;
}

void FusePassthrough::DropKept(const std::string& key) {
  auto k = kept_.find(key);
  if (k == kept_.end()) return;
  int id = k->second;
  kept_.erase(k);
  Backing& b = backings_[id];
  kept_lru_.erase(b.lru);
  kept_bytes_ -= b.bytes;
  b.key.clear();
  Unref(id);
}

void FusePassthrough::TrimKept() {
  while (!kept_lru_.empty() && (kept_.size() > kMaxKept || kept_bytes_ > kMaxKeptBytes)) {
    DropKept(std::string(backings_[kept_lru_.back()].key));
  }
}

void FusePassthrough::Unref(int id) {
  auto it = backings_.find(id);
  if (it == backings_.end() || --it->second.refs > 0) return;
  backings_.erase(it);
  std::uint32_t uid = static_cast<std::uint32_t>(id);
  if (ioctl(fuse_fd_, kIocBackingClose, &uid) != 0) {
    std::fprintf(stderr, "ghostfs: FUSE_DEV_IOC_BACKING_CLOSE %u: %s\n", uid, std::strerror(errno));
  }
}

void FusePassthrough::ReleasePassthrough(fuse_ino_t ino) {
  auto it = inodes_.find(ino);
  if (it == inodes_.end() || it->second.passthrough <= 0) return;
  InodeIo& io = it->second;
  if (--io.passthrough == 0) {
    Unref(io.backing_id);
    io.backing_id = -1;
  }
  Forget(ino);
}

std::optional<int> FusePassthrough::JoinBacking(fuse_ino_t ino) {
  auto it = inodes_.find(ino);
  if (it == inodes_.end() || it->second.passthrough <= 0) return std::nullopt;
  ++it->second.passthrough;
  ++joined_;
  return it->second.backing_id;
}

void FusePassthrough::CachedOpened(fuse_ino_t ino) {
  if (state_ == State::kOff) return;  // nothing can conflict
  ++inodes_[ino].cached;
}

void FusePassthrough::CachedReleased(fuse_ino_t ino) {
  auto it = inodes_.find(ino);
  if (it == inodes_.end() || it->second.cached <= 0) return;
  --it->second.cached;
  Forget(ino);
}

void FusePassthrough::Forget(fuse_ino_t ino) {
  auto it = inodes_.find(ino);
  if (it != inodes_.end() && it->second.cached == 0 && it->second.passthrough == 0)
    inodes_.erase(it);
}

int FusePassthrough::ReplyOpen(fuse_req_t req, const fuse_file_info* fi, int backing_id) {
  fuse_file_info info = *fi;
  info.keep_cache = 0;  // not allowed with FOPEN_PASSTHROUGH
  pending_backing_id_ = backing_id;
  pending_patched_ = false;
  int r = fuse_reply_open(req, &info);
  pending_backing_id_ = -1;
  // fuse_reply_open writes exactly one message, this reply, through Writev.
  if (r == 0 && !pending_patched_) {
    std::fprintf(stderr,
                 "ghostfs: an open reply went out without passthrough (unexpected reply shape)\n");
  }
  return r;
}

nlohmann::json FusePassthrough::StatsJson() const {
  return {{"state", StateName(state_)},
          {"opens", opens_},
          {"fallbacks", fallbacks_},
          {"joined", joined_},
          {"kept", kept_.size()},
          {"kept_hits", kept_hits_}};
}

}  // namespace ghost
