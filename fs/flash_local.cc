// The flash log of local/ (flash_local.h): handles as record paths, the disk's share of it.
#include "fs/flash_local.h"

#include <fcntl.h>
#include <limits.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iterator>
#include <map>
#include <optional>
#include <set>
#include <span>
#include <sstream>
#include <utility>

#include "common/config/config.h"

namespace ghost {
namespace {

constexpr char kHandlePrefix[] = "fh:";

std::string Hex(const unsigned char* p, std::size_t n) {
  static const char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(2 * n);
  for (std::size_t i = 0; i < n; ++i) {
    out += kDigits[p[i] >> 4];
    out += kDigits[p[i] & 0xf];
  }
  return out;
}

int HexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

// A file_handle with room for the largest handle (MAX_HANDLE_SZ).
struct Handle {
  alignas(file_handle) unsigned char raw[sizeof(file_handle) + MAX_HANDLE_SZ] = {};
  file_handle& head() { return *reinterpret_cast<file_handle*>(raw); }
  unsigned char* bytes() { return raw + offsetof(file_handle, f_handle); }
};

// "fh:TYPE:HEX" → the handle, or nullopt if `path` is not one.
std::optional<Handle> ParseHandle(const std::string& path) {
  if (!path.starts_with(kHandlePrefix)) return std::nullopt;
  std::size_t colon = path.find(':', 3);
  if (colon == std::string::npos) return std::nullopt;
  Handle h{};
  try {
    h.head().handle_type = std::stoi(path.substr(3, colon - 3));
  } catch (...) {
    return std::nullopt;
  }
  std::string hex = path.substr(colon + 1);
  if (hex.size() % 2 != 0 || hex.size() / 2 > MAX_HANDLE_SZ) return std::nullopt;
  h.head().handle_bytes = static_cast<unsigned>(hex.size() / 2);
  for (std::size_t i = 0; i < hex.size() / 2; ++i) {
    int hi = HexDigit(hex[2 * i]), lo = HexDigit(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) return std::nullopt;
    h.bytes()[i] = static_cast<unsigned char>(hi << 4 | lo);
  }
  return h;
}

}  // namespace

std::string EncodeLocalMetaArgs(const LocalMetaArgs& args) {
  return std::to_string(args.serial) + "\n" + args.handle + "\n" + args.new_path;
}

Result<LocalMetaArgs> DecodeLocalMetaArgs(const std::string& text) {
  std::size_t a = text.find('\n');
  std::size_t b = a == std::string::npos ? std::string::npos : text.find('\n', a + 1);
  if (b == std::string::npos) {
    return Status::InvalidArgument("flash log: a local/ metadata record's argument is not SERIAL\\nHANDLE\\nPATH");
  }
  LocalMetaArgs out;
  const std::string serial = text.substr(0, a);
  if (serial.empty() || serial.find_first_not_of("0123456789") != std::string::npos || serial.size() > 19) {
    return Status::InvalidArgument("flash log: a local/ metadata record's serial \"" + serial + "\" is not a number");
  }
  out.serial = std::stoull(serial);
  out.handle = text.substr(a + 1, b - a - 1);
  out.new_path = text.substr(b + 1);
  return out;
}

bool MetaSerialMarker::Holds(std::uint64_t serial) const {
  if (serial <= through) return true;
  auto it = above.upper_bound(serial);  // the first range starting past `serial`
  if (it == above.begin()) return false;
  --it;
  return serial <= it->second;
}

void MetaSerialMarker::Add(std::uint64_t first, std::uint64_t last) {
  if (last <= through) return;
  first = std::max(first, through + 1);
  // Merge with every range that overlaps [first, last] or touches it.
  auto it = above.upper_bound(first);
  if (it != above.begin() && std::prev(it)->second + 1 >= first) --it;
  while (it != above.end() && it->first <= last + 1) {
    first = std::min(first, it->first);
    last = std::max(last, it->second);
    it = above.erase(it);
  }
  if (first == through + 1) {
    through = last;
  } else {
    above[first] = last;
  }
}

std::string MetaSerialMarker::Encode() const {
  std::string out = std::to_string(through);
  for (const auto& [first, last] : above) {
    out += ' ' + std::to_string(first);
    if (last != first) out += '-' + std::to_string(last);
  }
  return out;
}

std::optional<MetaSerialMarker> ParseMetaSerialMarker(const std::string& text) {
  auto number = [](const std::string& t, std::uint64_t* out) {
    if (t.empty() || t.size() > 19 || t.find_first_not_of("0123456789") != std::string::npos) return false;
    *out = std::stoull(t);
    return true;
  };
  std::istringstream in(text);
  std::string word;
  MetaSerialMarker out;
  if (!(in >> word) || !number(word, &out.through)) return std::nullopt;
  while (in >> word) {
    std::size_t dash = word.find('-');
    std::uint64_t first = 0, last = 0;
    if (!number(word.substr(0, dash), &first)) return std::nullopt;
    if (dash == std::string::npos) {
      last = first;
    } else if (!number(word.substr(dash + 1), &last)) {
      return std::nullopt;
    }
    if (last < first) return std::nullopt;
    out.Add(first, last);
  }
  return out;
}

Result<FlashLogSpec> ParseFlashLogSpec(const std::string& text) {
  FlashLogSpec spec;
  spec.dir = text;
  if (std::size_t colon = text.rfind(':'); colon != std::string::npos && colon + 1 < text.size()) {
    if (Result<Bytes> size = ParseSize(text.substr(colon + 1)); size.ok()) {
      spec.dir = text.substr(0, colon);
      spec.capacity = *size;
    }
  }
  if (spec.dir.empty()) {
    return Status::InvalidArgument("flash log \"" + text + "\": give a directory, DIR or DIR:SIZE");
  }
  if (spec.capacity < (64 << 10)) {
    return Status::InvalidArgument("flash log \"" + text + "\": the size must be at least 64K");
  }
  return spec;
}

Status CheckLeftFlashLog(const std::string& cache_dir, const std::string& flash_dir) {
  char buf[PATH_MAX];
  ssize_t n = getxattr(cache_dir.c_str(), kFlashLogDirXattr, buf, sizeof buf);
  if (n <= 0) return Status::Ok();  // never used with a log, or left clean (or no xattrs here)
  const std::string recorded(buf, static_cast<std::size_t>(n));
  if (!flash_dir.empty()) {
    char real[PATH_MAX];
    if (realpath(flash_dir.c_str(), real) != nullptr && recorded == real) return Status::Ok();
  }
  struct stat st;
  const std::string log = recorded + "/flash.log";
  if (stat(log.c_str(), &st) != 0) {
    if (errno != ENOENT) {
      return Status::FromErrno(errno, "stat " + log + ", the flash log the cache " + cache_dir + " was last used with");
    }
    std::fprintf(stderr, "ghostfs: the cache %s was last used with the flash log %s, which is gone: whatever it held "
                 "that the disk lacked is lost\n", cache_dir.c_str(), log.c_str());
    removexattr(cache_dir.c_str(), kFlashLogDirXattr);
    return Status::Ok();
  }
  if (st.st_size == 0) {  // it holds nothing
    removexattr(cache_dir.c_str(), kFlashLogDirXattr);
    return Status::Ok();
  }
  return Status::Unavailable("the cache " + cache_dir + " was last used with the flash log " + recorded +
                             " and the daemon did not end cleanly: the log holds " + std::to_string(st.st_size) +
                             " bytes of records the disk may lack; mount once with --flash-log " + recorded +
                             " to replay them (or delete " + log + " to drop them)");
}

namespace {

constexpr char kFillPathPrefix[] = "fill:";

std::string FillPath(std::uint64_t n, const std::string& key) {
  return kFillPathPrefix + std::to_string(n) + ":" + key;
}

// Whether `body` has the CRC32C that its commit record's `arg2` ("CRC\nMETA") names.
bool FillCrcMatches(const std::string& body, const std::string& arg2) {
  char crc[16];
  std::snprintf(crc, sizeof crc, "%08x", Crc32c(body));
  std::size_t nl = arg2.find('\n');
  return nl != std::string::npos && arg2.compare(0, nl, crc) == 0;
}

}  // namespace

// "fill:N:KEY" -> (N, KEY).
std::optional<std::pair<std::uint64_t, std::string>> ParseFillPath(const std::string& path) {
  if (!path.starts_with(kFillPathPrefix)) return std::nullopt;
  std::size_t start = sizeof(kFillPathPrefix) - 1;
  std::size_t colon = path.find(':', start);
  if (colon == std::string::npos || colon == start) return std::nullopt;
  std::uint64_t n = 0;
  for (std::size_t i = start; i < colon; ++i) {
    if (path[i] < '0' || path[i] > '9') return std::nullopt;
    n = n * 10 + static_cast<std::uint64_t>(path[i] - '0');
  }
  return std::make_pair(n, path.substr(colon + 1));
}

// Applies records to the local/ tree's files, found by their handles, and its metadata records
// (flash_local.h).
class LocalFlashLog::Target final : public FlushTarget {
 public:
  // `root`: the local/ backing directory; `marker_dir`: where kMetaSerialXattr lives (its parent,
  // same file system, out of the user's sight).
  Target(UniqueFd root, UniqueFd marker_dir) : root_(std::move(root)), marker_dir_(std::move(marker_dir)) {
    std::string buf(4096, '\0');
    ssize_t n = fgetxattr(marker_dir_.get(), kMetaSerialXattr, buf.data(), buf.size());
    if (n < 0 && errno == ERANGE) {
      n = fgetxattr(marker_dir_.get(), kMetaSerialXattr, nullptr, 0);
      if (n > 0) {
        buf.assign(static_cast<std::size_t>(n), '\0');
        n = fgetxattr(marker_dir_.get(), kMetaSerialXattr, buf.data(), buf.size());
      }
    }
    if (n > 0) {
      buf.resize(static_cast<std::size_t>(n));
      if (std::optional<MetaSerialMarker> m = ParseMetaSerialMarker(buf)) marker_ = std::move(*m);
    }
  }

  // The file of `path`, opened `flags`; a file that is gone opens an unnamed temporary file.
  Result<UniqueFd> OpenFile(const std::string& path, int flags) {
    // A file recreated by a replayed create (its logged handle died with the power cut).
    if (auto it = remap_.find(path); it != remap_.end()) {
      int fd = open(("/proc/self/fd/" + std::to_string(it->second.get())).c_str(), flags | O_CLOEXEC);
      if (fd < 0) return Status::FromErrno(errno, "reopen the recreated local/ file of " + path);
      return UniqueFd(fd);
    }
    std::optional<Handle> h = ParseHandle(path);
    if (!h) return Status::InvalidArgument("flash log record path \"" + path + "\" is not a file handle");
    int fd = open_by_handle_at(root_.get(), &h->head(), flags | O_CLOEXEC);
    if (fd >= 0) return UniqueFd(fd);
    if (errno != ESTALE && errno != ENOENT) {
      return Status::FromErrno(errno, "open the local/ file of flash log record " + path);
    }
    // Deleted since: its bytes go nowhere, as writes to a deleted file do.
    fd = openat(root_.get(), ".", O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
    if (fd < 0) return Status::FromErrno(errno, "open a scratch file for a deleted local/ file");
    return UniqueFd(fd);
  }

  Result<int> OpenForFlush(LogRecordKind kind, const std::string& path) override {
    if (kind == LogRecordKind::kFill) {
      // A spilled fill's body goes to RAM first: the store writes it (ApplyFills).
      int fd = memfd_create("ghost-fill", MFD_CLOEXEC);
      if (fd < 0) return Status::FromErrno(errno, "memfd_create for the logged fill " + path);
      fill_fds_[path] = UniqueFd(fd);
      return fd;
    }
    Result<UniqueFd> fd = OpenFile(path, O_RDWR);
    if (!fd.ok()) return fd.status();
    int raw = fd->get();
    fds_[path] = std::move(fd).value();
    return raw;
  }

  Status ApplyMeta(MetaOp op, const std::string& path, Bytes arg, const std::string& arg2) override {
    if (op == MetaOp::kFill) {
      CheckFill(path, arg, arg2);
      return Status::Ok();
    }
    ++meta_records_;
    if (op == MetaOp::kTruncate) {
      Result<UniqueFd> fd = OpenFile(path, O_WRONLY);
      if (!fd.ok()) return fd.status();
      if (ftruncate(fd->get(), static_cast<off_t>(arg)) != 0) return Status::FromErrno(errno, "truncate " + path);
      sync_files_.push_back(std::move(fd).value());  // the new size: an inode change
      return Status::Ok();
    }
    Result<LocalMetaArgs> a = DecodeLocalMetaArgs(arg2);
    if (!a.ok()) return a.status();
    NoteSync(op, path, *a);
    // Already in the backing tree (made there before it was logged): the flush's syncfs makes
    // it durable. A record an earlier replay kept is not in the marker: it is tried again.
    if (marker_.Holds(a->serial)) return Status::Ok();
    if (Status s = Replay(op, path, static_cast<mode_t>(arg), *a); !s.ok()) {
      return s.WithContext(std::string("replaying local/ ") + MetaOpName(op) + " of " + path);
    }
    SetApplied(a->serial);
    return Status::Ok();
  }

  // The metadata changes the flush covered go to the disk before the log forgets them: an
  // fsync of each directory whose entries they changed, of each file whose inode they changed
  // (mode, size) and of the marker's directory, through the log's FileIo (its fault switch fails
  // them too), all in flight at once. Not a syncfs: that writes every dirty page of the whole
  // file system, other programs' too, which on a busy machine took over 30 s at an unmount and
  // blocked the loop while it ran. Only when a directory cannot be opened by the name the record
  // gave (renamed or removed by a later change) does the flush fall back to a syncfs. If a sync
  // fails, the log keeps every record of the flush and the next flush syncs again.
  void SyncFlush(FileIo& io, std::function<void(Status)> done) override {
    std::weak_ptr<bool> alive = alive_;
    SyncLocal(io, [this, alive, done = std::move(done)](Status st) {
      if (alive.expired()) return;
      if (!st.ok() || ready_fills_.empty()) return done(st);
      if (!applier_) return done(Status::Unavailable("the flash log holds fills and nothing applies them"));
      applier_(std::exchange(ready_fills_, {}), [alive, done](Status f) {
        if (alive.expired()) return;
        done(f.WithContext("apply the logged fills to the store"));
      });
    });
  }

  void SyncLocal(FileIo& io, std::function<void(Status)> done) {
    if (meta_records_ == 0) return done(Status::Ok());
    // The FileIo outlives this target: its callbacks must not touch a destroyed one.
    std::weak_ptr<bool> alive = alive_;
    auto finish = [this, alive, done = std::move(done)](Status st) {
      if (alive.expired()) return;
      if (st.ok()) {
        meta_charged_ += meta_records_;
      } else {
        std::fprintf(stderr, "ghostfs: flash log flush: %s; every record stays in the log\n", st.ToString().c_str());
      }
      meta_records_ = 0;
      ClearSync();
      done(st.WithContext("sync the metadata changes of local/"));
    };
    for (const std::string& dir : sync_dirs_) {
      if (sync_whole_) break;
      int fd = openat(root_.get(), dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
      if (fd >= 0) {
        sync_files_.emplace_back(fd);
      } else if (errno == ENOENT || errno == ENOTDIR || errno == ELOOP) {
        sync_whole_ = true;  // moved on by a later change: its name no longer finds it
      } else {
        return finish(Status::FromErrno(errno, "open local/" + dir + " to fsync it"));
      }
    }
    if (sync_whole_) {
      syncing_ = "a syncfs of local/ (a changed directory was renamed or removed since)";
      io.Syncfs(root_.get(), finish);
      return;
    }
    syncing_ = std::to_string(sync_files_.size() + 1) + " fsyncs of the changed directories and files";
    auto left = std::make_shared<std::size_t>(sync_files_.size() + 1);
    auto first_error = std::make_shared<Status>();
    auto one = [left, first_error, finish](Status st) {
      if (!st.ok() && first_error->ok()) *first_error = st;
      if (--*left == 0) finish(*first_error);
    };
    std::vector<int> fds;
    for (const UniqueFd& fd : sync_files_) fds.push_back(fd.get());
    fds.push_back(marker_dir_.get());
    for (int fd : fds) {
      io.Fsync(fd, [alive, one](Status st) {
        if (alive.expired()) return;
        one(std::move(st));
      });
    }
  }

  std::string SyncProgress() const override { return syncing_.empty() ? "applying the logged fills" : syncing_; }

  void EndFlush() override {
    ClearSync();
    fds_.clear();
    fill_fds_.clear();
    ready_fills_.clear();
    remap_.clear();
    meta_records_ = 0;
  }

  // Records that the backing tree holds the metadata change `serial`; stores the marker.
  void SetApplied(std::uint64_t serial) {
    marker_.Add(serial);
    std::string v = marker_.Encode();
    if (fsetxattr(marker_dir_.get(), kMetaSerialXattr, v.data(), v.size(), 0) != 0 && !warned_) {
      warned_ = true;
      std::fprintf(stderr, "ghostfs: flash log: cannot store %s (%s): after a power cut the log's metadata "
                   "records are taken as applied\n", kMetaSerialXattr, std::strerror(errno));
    }
  }
  // The highest serial the backing tree holds (kept records below it may be missing).
  std::uint64_t applied() const { return marker_.Highest(); }
  const MetaSerialMarker& marker() const { return marker_; }
  // Metadata records flushed since the last call (each one a block the disk writes).
  std::uint64_t TakeMetaCharge() { return std::exchange(meta_charged_, 0); }

  int root() const { return root_.get(); }
  void SetFillApplier(FillApplier applier) { applier_ = std::move(applier); }

 private:
  // What the flush's SyncLocal fsyncs for a metadata record (path relative to local/).
  void NoteSync(MetaOp op, const std::string& path, const LocalMetaArgs& a) {
    auto parent = [](const std::string& p) {
      std::size_t slash = p.rfind('/');
      return slash == std::string::npos ? std::string() : p.substr(0, slash);
    };
    sync_dirs_.insert(parent(path));
    if (op == MetaOp::kRename) sync_dirs_.insert(parent(a.new_path));
    if (op == MetaOp::kMkdir) sync_dirs_.insert(path);
    if (op == MetaOp::kCreate || op == MetaOp::kChmod) {
      // The file's own inode (its mode; a created file's inode), found by its handle wherever
      // later changes put it; a file deleted since needs nothing.
      if (std::optional<Handle> h = ParseHandle(a.handle)) {
        int fd = open_by_handle_at(root_.get(), &h->head(), O_RDONLY | O_CLOEXEC);
        if (fd >= 0) sync_files_.emplace_back(fd);
      } else if (op == MetaOp::kChmod) {
        sync_dirs_.insert(path);  // a directory's chmod (no handle): opened as a directory
      }
    }
  }

  void ClearSync() {
    sync_dirs_.clear();
    sync_files_.clear();
    sync_whole_ = false;
    syncing_.clear();
  }

  // The commit record of the fill `path`: its body (in the memfd the flush wrote) must have the
  // committed size and CRC32C; then it is applied at SyncFlush, else dropped (never torn).
  void CheckFill(const std::string& path, Bytes size, const std::string& arg2) {
    auto drop = [&](const std::string& why) {
      std::fprintf(stderr, "ghostfs: flash log: dropping the logged fill %s: %s (it is fetched again)\n",
                   path.c_str(), why.c_str());
    };
    std::optional<std::pair<std::uint64_t, std::string>> parsed = ParseFillPath(path);
    std::size_t nl = arg2.find('\n');
    if (!parsed || nl == std::string::npos) return drop("a malformed commit record");
    std::string body;
    if (auto it = fill_fds_.find(path); it != fill_fds_.end()) {
      struct stat st;
      if (fstat(it->second.get(), &st) != 0) return drop(std::string("fstat: ") + std::strerror(errno));
      body.resize(static_cast<std::size_t>(st.st_size));
      if (!body.empty() && pread(it->second.get(), body.data(), body.size(), 0) != static_cast<ssize_t>(body.size())) {
        return drop("reading its body back failed");
      }
    }
    if (body.size() != size) {
      return drop("its body has " + std::to_string(body.size()) + " of " + std::to_string(size) + " bytes");
    }
    if (!FillCrcMatches(body, arg2)) return drop("its body's CRC32C is not the committed one");
    ready_fills_.push_back(LoggedFill{path, parsed->second, arg2.substr(nl + 1), std::move(body)});
  }

  // Makes a logged change the backing tree lost (a power cut). Each step accepts finding it
  // made already: the marker may lag the tree by the one change made just before it.
  Status Replay(MetaOp op, const std::string& path, mode_t mode, const LocalMetaArgs& a) {
    int root = root_.get();
    switch (op) {
      case MetaOp::kCreate: {
        if (std::optional<Handle> h = ParseHandle(a.handle)) {
          int fd = open_by_handle_at(root, &h->head(), O_PATH | O_CLOEXEC);
          if (fd >= 0) {
            close(fd);
            return Status::Ok();  // the file is there (wherever later changes put it)
          }
        }
        int fd = openat(root, path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode & 07777);
        if (fd < 0 && errno == EEXIST) fd = openat(root, path.c_str(), O_RDWR | O_NOFOLLOW | O_CLOEXEC);
        if (fd < 0) return Status::FromErrno(errno, "create");
        UniqueFd owned(fd);
        if (fchmod(fd, mode & 07777) != 0) return Status::FromErrno(errno, "chmod");
        if (!a.handle.empty()) remap_[a.handle] = std::move(owned);
        return Status::Ok();
      }
      case MetaOp::kMkdir:
        if (mkdirat(root, path.c_str(), mode & 07777) != 0 && errno != EEXIST) return Status::FromErrno(errno, "mkdir");
        return Status::Ok();
      case MetaOp::kUnlink:
        if (unlinkat(root, path.c_str(), 0) != 0 && errno != ENOENT) return Status::FromErrno(errno, "unlink");
        return Status::Ok();
      case MetaOp::kRmdir:
        if (unlinkat(root, path.c_str(), AT_REMOVEDIR) != 0 && errno != ENOENT) return Status::FromErrno(errno, "rmdir");
        return Status::Ok();
      case MetaOp::kRename:
        if (renameat(root, path.c_str(), root, a.new_path.c_str()) != 0) {
          // Made already: the old name is gone and the new one is there.
          if (errno == ENOENT && faccessat(root, a.new_path.c_str(), F_OK, AT_SYMLINK_NOFOLLOW) == 0) return Status::Ok();
          return Status::FromErrno(errno, "rename to " + a.new_path);
        }
        return Status::Ok();
      case MetaOp::kChmod:
        if (fchmodat(root, path.c_str(), mode & 07777, 0) != 0) return Status::FromErrno(errno, "chmod");
        return Status::Ok();
      default:
        return Status::InvalidArgument(std::string("local/ does not log ") + MetaOpName(op) + " records");
    }
  }

  UniqueFd root_;        // the local/ backing directory: the mount for open_by_handle_at
  UniqueFd marker_dir_;  // holds kMetaSerialXattr
  MetaSerialMarker marker_;
  std::uint64_t meta_records_ = 0;  // metadata records this flush went through
  std::set<std::string> sync_dirs_;  // directories their changes touched ("" = local/ itself)
  std::vector<UniqueFd> sync_files_;  // files whose inode they changed, then the opened dirs
  bool sync_whole_ = false;           // a directory is gone from its name: syncfs instead
  std::string syncing_;               // what SyncLocal waits for (SyncProgress)
  std::uint64_t meta_charged_ = 0;
  bool warned_ = false;
  std::map<std::string, UniqueFd> fds_;
  std::map<std::string, UniqueFd> remap_;  // logged handle -> the file a replayed create made
  std::map<std::string, UniqueFd> fill_fds_;  // this flush's fill bodies (memfd), by path
  std::vector<LoggedFill> ready_fills_;       // checked by their commit, in log order
  FillApplier applier_;
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);  // SyncFlush's callback checks it
};

LocalFlashLog::LocalFlashLog(FileIo& io, PowerManager& pm, DeviceId disk_id, Device& disk)
    : io_(io), pm_(pm), disk_id_(disk_id), disk_(disk) {}

LocalFlashLog::~LocalFlashLog() {
  if (spin_up_ != 0) pm_.Unsubscribe(spin_up_);
  // Ending with every record on the disk: a mount without this log may follow.
  if (log_ && log_->empty() && !log_->flushing() && !cache_dir_.empty()) {
    removexattr(cache_dir_.c_str(), kFlashLogDirXattr);
  }
  log_.reset();  // before the target it borrows
}

Result<std::unique_ptr<LocalFlashLog>> LocalFlashLog::Open(const FlashLogOptions& options, FileIo& io,
                                                           const std::string& local_dir, PowerManager& pm,
                                                           DeviceId disk_id, Device& disk,
                                                           RecoveryReport* report) {
  std::error_code ec;
  std::filesystem::create_directories(options.dir, ec);
  if (ec) {
    return Status::IoError("cannot create the flash log directory " + options.dir + ": " + ec.message() +
                           "; give --flash-log a writable directory on the flash device");
  }
  // One daemon per log: two would append over each other's records at their own tails, and
  // one's flush cut the other's (two mounts sharing a directory lost both files' fsync'd bytes).
  // A lock that cannot be made (a read-only directory) is left to FlashLog::Open to report.
  std::optional<PidLock> dir_lock;
  if (Result<PidLock> lock = PidLock::Acquire(options.dir + "/lock"); lock.ok()) {
    dir_lock.emplace(std::move(lock).value());
  } else if (lock.status().code() == Status::Code::kExists) {
    return Status::Exists("flash log directory " + options.dir + " is in use by another ghostfs (" +
                          lock.status().message() + "); give each ghostfs its own --flash-log directory");
  }
  std::filesystem::create_directories(local_dir, ec);
  UniqueFd root(open(local_dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!root.valid()) return Status::FromErrno(errno, "open " + local_dir);
  std::unique_ptr<FaultyFileIo> faulty;
  const char* fault_file = std::getenv(kDiskFaultEnv);
  if (fault_file != nullptr && *fault_file != '\0') {
    faulty = std::make_unique<FaultyFileIo>(io);
    std::fprintf(stderr, "ghostfs: TEST ONLY: %s=%s: the flash log's disk writes fail with EIO while that file "
                 "exists\n", kDiskFaultEnv, fault_file);
  }
  std::unique_ptr<LocalFlashLog> self(new LocalFlashLog(faulty ? *faulty : io, pm, disk_id, disk));
  self->dir_lock_ = std::move(dir_lock);
  if (faulty) {
    LocalFlashLog* raw = self.get();
    faulty->FailWhen(
        [raw, path = std::string(fault_file)](const FileCall& c) {
          // Reads and the log's own file pass: only the disk fails.
          if (c.op == FileOp::kRead || (raw->log_ && c.fd == raw->log_->log_fd())) return false;
          return access(path.c_str(), F_OK) == 0;
        },
        EIO);
    self->faulty_ = std::move(faulty);
  }
  UniqueFd marker_dir(openat(root.get(), "..", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!marker_dir.valid()) return Status::FromErrno(errno, "open the parent of " + local_dir);
  char real[PATH_MAX];
  if (realpath(local_dir.c_str(), real) == nullptr) return Status::FromErrno(errno, "realpath " + local_dir);
  self->root_path_ = real;
  self->target_ = std::make_unique<Target>(std::move(root), std::move(marker_dir));
  // The records name files by handle: the local/ file system must give them.
  if (Result<std::string> probe = self->PathOf(self->target_->root()); !probe.ok()) {
    return Status::InvalidArgument("--flash-log needs file handles on the file system of " + local_dir +
                                   " (" + probe.status().message() + ")");
  }
  if (Status s = CheckLeftFlashLog(std::filesystem::path(real).parent_path().string(), options.dir); !s.ok()) {
    return s;
  }
  Result<std::unique_ptr<FlashLog>> log = FlashLog::Open(options, self->io_, *self->target_, report);
  if (!log.ok()) return log.status();
  self->log_ = std::move(log).value();
  self->cache_dir_ = std::filesystem::path(real).parent_path().string();
  for (const LogRecordInfo& r : self->log_->records()) {
    if (r.kind == LogRecordKind::kLocalWrite || (r.kind == LogRecordKind::kMeta && r.op != MetaOp::kFill)) {
      self->MarkCache();  // it recovered local/ records
      break;
    }
  }
  // Serials go on from the marker and from what the log holds (it may hold changes the backing
  // tree lost, with serials past the marker: replay applies them and new ones come after).
  self->meta_serial_ = self->target_->applied();
  for (const LogRecordInfo& r : self->log_->records()) {
    if (r.kind == LogRecordKind::kMeta && r.op != MetaOp::kTruncate) ++self->meta_serial_;
  }
  for (const LogRecordInfo& r : self->log_->records()) {
    if (auto f = ParseFillPath(r.path)) self->fill_serial_ = std::max(self->fill_serial_, f->first);
  }
  LocalFlashLog* raw = self.get();
  self->log_->SetFlushObserver([raw](const FlushReport& r) { raw->OnFlushed(r); });
  self->log_->SetAppendObserver([raw](Bytes n) { raw->ChargeFlash(n, true); });
  int high = disk.profile().HighPowerMode();
  self->spin_up_ = pm.Subscribe(disk_id, high, [raw](DeviceId, int) { raw->log_->OnDiskSpinUp(); });
  return self;
}

void LocalFlashLog::MarkCache() {
  if (cache_marked_) return;
  cache_marked_ = true;
  char dir[PATH_MAX];
  if (realpath(log_->options().dir.c_str(), dir) == nullptr ||
      setxattr(cache_dir_.c_str(), kFlashLogDirXattr, dir, std::strlen(dir), 0) != 0) {
    std::fprintf(stderr, "ghostfs: flash log: cannot mark the cache %s with %s (%s): a mount without the log after "
                 "a crash will not be refused\n", cache_dir_.c_str(), kFlashLogDirXattr, std::strerror(errno));
  }
}

Result<std::string> LocalFlashLog::PathOf(int fd) const {
  Handle h{};
  h.head().handle_bytes = MAX_HANDLE_SZ;
  int mount_id = 0;
  if (name_to_handle_at(fd, "", &h.head(), &mount_id, AT_EMPTY_PATH) != 0) {
    return Status::FromErrno(errno, "name_to_handle_at");
  }
  return std::string(kHandlePrefix) + std::to_string(h.head().handle_type) + ":" +
         Hex(h.bytes(), h.head().handle_bytes);
}

bool LocalFlashLog::TakesWrites() const {
  if (!log_->empty() || log_->flushing()) return true;
  const DevicePolicy* policy = pm_.policy(disk_id_);
  if (!policy || !policy->DefersBackgroundWrites()) return false;
  int high = disk_.profile().HighPowerMode();
  return !(disk_.mode() == high && disk_.target_mode() == high);
}

bool LocalFlashLog::TakesFills() const {
  const DevicePolicy* policy = pm_.policy(disk_id_);
  if (!policy || !policy->DefersBackgroundWrites()) return false;
  int high = disk_.profile().HighPowerMode();
  return disk_.mode() != high && disk_.target_mode() != high;
}

void LocalFlashLog::SetFillApplier(FillApplier applier) { target_->SetFillApplier(std::move(applier)); }

void LocalFlashLog::AppendFill(const std::string& key, std::shared_ptr<const std::string> body, std::string meta,
                               std::function<void(Result<std::string>)> done) {
  char crc[16];
  std::snprintf(crc, sizeof crc, "%08x", Crc32c(*body));
  std::string path = FillPath(++fill_serial_, key);
  log_->AppendFill(path, *body, std::string(crc) + "\n" + meta,
                   [this, path, done = std::move(done)](Result<std::uint64_t> r) {
                     // Runs only while the log (owned by this) lives.
                     if (!r.ok()) return done(r.status());
                     ++fills_logged_;
                     done(path);
                   });
}

std::vector<LocalFlashLog::LoggedFill> LocalFlashLog::RecoveredFills() {
  std::vector<LoggedFill> out;
  const std::vector<LogRecordInfo> records = log_->records();  // ReadOverlay reads, not changes
  for (const LogRecordInfo& r : records) {
    if (r.kind != LogRecordKind::kMeta || r.op != MetaOp::kFill) continue;
    std::optional<std::pair<std::uint64_t, std::string>> parsed = ParseFillPath(r.path);
    if (!parsed) continue;
    // The commit record's data is its arg2 ("CRC\nMETA"), at its arg (the body's size).
    std::string arg2(static_cast<std::size_t>(r.length), '\0');
    Result<std::vector<std::pair<Bytes, Bytes>>> got =
        log_->ReadOverlay(LogRecordKind::kMeta, r.path, r.offset, std::span<char>(arg2.data(), arg2.size()));
    std::size_t nl = arg2.find('\n');
    if (!got.ok() || nl == std::string::npos) continue;
    // Only a whole body with the committed CRC: the replay drops any other (CheckFill).
    std::string body(static_cast<std::size_t>(r.offset), '\0');
    if (!ReadFill(r.path, 0, std::span<char>(body.data(), body.size())).ok()) continue;
    if (!FillCrcMatches(body, arg2)) continue;
    out.push_back(LoggedFill{r.path, parsed->second, arg2.substr(nl + 1), "", r.offset});
  }
  return out;
}

Status LocalFlashLog::ReadFill(const std::string& path, Bytes offset, std::span<char> buf) {
  Result<std::vector<std::pair<Bytes, Bytes>>> r = log_->ReadOverlay(LogRecordKind::kFill, path, offset, buf);
  if (!r.ok()) return r.status();
  Bytes covered = 0;
  for (const auto& [a, b] : *r) covered += b - a;  // the records of one fill do not overlap
  if (covered < buf.size()) return Status::NotFound("the flash log no longer holds all of " + path);
  return Status::Ok();
}

void LocalFlashLog::AppendWrite(int fd, Bytes offset, std::string data, std::function<void(Status)> done) {
  Result<std::string> path = PathOf(fd);
  if (!path.ok()) return done(path.status());
  MarkCache();
  // The bytes stay here until the append is durable: if it fails they go to the disk instead
  // (a write acknowledged into the queue is never dropped because the log could not take it).
  auto bytes = std::make_shared<const std::string>(std::move(data));
  std::string p = *path;
  log_->AppendWrite(LogRecordKind::kLocalWrite, std::move(path).value(), offset, *bytes,
                    [this, fd, p = std::move(p), offset, bytes, done = std::move(done)](Result<std::uint64_t> r) {
                      // Runs only while the log (owned by this) lives.
                      if (r.ok()) return done(Status::Ok());
                      WriteThrough(fd, p, offset, bytes, r.status(), done);
                    });
}

void LocalFlashLog::WriteThrough(int fd, std::string path, Bytes offset, std::shared_ptr<const std::string> data,
                                 Status cause, std::function<void(Status)> done) {
  ++write_throughs_;
  std::fprintf(stderr, "ghostfs: flash log %s could not take %zu bytes of a local/ file (%s); writing them through "
               "to the disk (it spins up); check the flash device\n", log_->options().dir.c_str(), data->size(),
               cause.ToString().c_str());
  std::weak_ptr<bool> alive = alive_;
  auto write = [this, alive, fd, path, offset, data, cause, done](const FlushReport*) {
    if (alive.expired()) return;
    if (log_->Changes(LogRecordKind::kLocalWrite, path)) {
      // Older bytes or a truncate of the file are stuck in the log (the disk refused them):
      // writing these now would let the log's later flush put the older ones over them (or cut
      // them).
      ++write_through_failures_;
      return done(cause.WithContext("and the flash log still holds older records of the file that the disk "
                                    "refused (see the flush errors); the bytes were not written"));
    }
    disk_.Submit({data->size(), true}, [this, alive, fd, offset, data, cause, done] {
      if (alive.expired()) return;
      io_.Write(fd, offset, *data, [this, alive, cause, done](Result<std::size_t> n) {
        if (alive.expired()) return;
        if (n.ok()) return done(Status::Ok());
        ++write_through_failures_;
        done(n.status().WithContext("writing through to the disk after the flash log failed (" + cause.ToString() + ")"));
      });
    });
  };
  if (!log_->Changes(LogRecordKind::kLocalWrite, path)) return write(nullptr);
  log_->Flush(LogFlushReason::kExplicit, [write](const FlushReport& r) { write(&r); });
}

void LocalFlashLog::AppendTruncate(int fd, Bytes size, std::function<void(Status)> done) {
  Result<std::string> path = PathOf(fd);
  if (!path.ok()) return done(path.status());
  MarkCache();
  std::string p = *path;
  log_->AppendMeta(MetaOp::kTruncate, std::move(path).value(), size, "",
                   [this, p = std::move(p), size, done = std::move(done)](Result<std::uint64_t> r) {
                     if (r.ok()) return done(Status::Ok());
                     // Runs only while the log (owned by this) lives. The flush starts before any
                     // later append is written (they wait behind it), so it applies only records
                     // older than the truncate; the truncate then goes on top of them.
                     ++write_throughs_;
                     std::fprintf(stderr, "ghostfs: flash log %s could not take a truncate of a local/ file (%s); "
                                  "flushing the log and truncating on the disk (it spins up); check the flash device\n", log_->options().dir.c_str(),
                                  r.status().ToString().c_str());
                     Status cause = r.status();
                     log_->Flush(LogFlushReason::kExplicit, [this, p, size, cause, done](const FlushReport&) {
                       if (log_->Changes(LogRecordKind::kLocalWrite, p)) {
                         ++write_through_failures_;
                         return done(cause.WithContext("and the disk refused the file's logged records"));
                       }
                       done(target_->ApplyMeta(MetaOp::kTruncate, p, size, ""));
                     });
                   });
}

bool LocalFlashLog::TakesMeta() const { return !replaying_ && TakesWrites(); }

std::uint64_t LocalFlashLog::applied_meta_serial() const { return target_->applied(); }

Result<std::string> LocalFlashLog::RelPath(int dir_fd, const std::string& name) const {
  char buf[PATH_MAX];
  ssize_t n = readlink(("/proc/self/fd/" + std::to_string(dir_fd)).c_str(), buf, sizeof(buf) - 1);
  if (n < 0) return Status::FromErrno(errno, "readlink of a local/ directory");
  std::string dir(buf, static_cast<std::size_t>(n));
  if (name.empty()) {  // the descriptor's own file
    if (dir == root_path_) return std::string(".");
    if (dir.starts_with(root_path_ + "/")) return dir.substr(root_path_.size() + 1);
    return Status::NotFound("local/ file " + dir + " is not under " + root_path_);
  }
  if (dir == root_path_) return name;
  if (!dir.starts_with(root_path_ + "/")) {
    return Status::NotFound("local/ directory " + dir + " is not under " + root_path_);
  }
  return dir.substr(root_path_.size() + 1) + "/" + name;
}

void LocalFlashLog::AppendMeta(MetaOp op, const std::string& path, int fd, Bytes mode, const std::string& new_path,
                               std::function<void(Status)> done) {
  MarkCache();
  LocalMetaArgs args;
  meta_serial_ = std::max(meta_serial_, target_->applied()) + 1;
  args.serial = meta_serial_;
  if (fd >= 0) {
    if (Result<std::string> h = PathOf(fd); h.ok()) args.handle = *h;
  }
  args.new_path = new_path;
  // The change is in the backing tree already: the marker says so before the record exists.
  target_->SetApplied(args.serial);
  log_->AppendMeta(op, path, mode, EncodeLocalMetaArgs(args),
                   [this, op, path, done = std::move(done)](Result<std::uint64_t> r) {
                     // Runs only while the log (owned by this) lives.
                     if (r.ok()) {
                       ++meta_logged_;
                       return done(Status::Ok());
                     }
                     // The change stays made; make it durable on the disk instead.
                     ++meta_failures_;
                     std::fprintf(stderr, "ghostfs: flash log %s could not take a local/ %s of %s (%s); syncing it "
                                  "to the disk (it spins up); check the flash device\n", log_->options().dir.c_str(),
                                  MetaOpName(op), path.c_str(), r.status().ToString().c_str());
                     disk_.Submit({kMetaRecordBytes, true}, [] {});
                     // Through the FileIo, so the disk fault switch (and tests' faults) reach it.
                     Status cause = r.status();
                     std::weak_ptr<bool> alive = alive_;
                     io_.Syncfs(target_->root(), [alive, cause, done](Status st) {
                       if (alive.expired()) return;
                       done(st.ok() ? cause.WithContext("synced to the disk instead")
                                    : cause.WithContext("and syncing the disk failed: " + st.ToString()));
                     });
                   });
}

bool LocalFlashLog::Holds(int fd) const {
  if (log_->empty()) return false;
  Result<std::string> path = PathOf(fd);
  return path.ok() && log_->Holds(LogRecordKind::kLocalWrite, *path);
}

bool LocalFlashLog::Changes(int fd) const {
  if (log_->empty()) return false;
  Result<std::string> path = PathOf(fd);
  return path.ok() && log_->Changes(LogRecordKind::kLocalWrite, *path);
}

Bytes LocalFlashLog::LoggedEnd(int fd) const {
  if (log_->empty()) return 0;
  Result<std::string> path = PathOf(fd);
  return path.ok() ? log_->LoggedEnd(LogRecordKind::kLocalWrite, *path) : 0;
}

Bytes LocalFlashLog::SizeOver(int fd, Bytes disk_size) const {
  if (log_->empty()) return disk_size;
  Result<std::string> path = PathOf(fd);
  if (!path.ok()) return disk_size;
  if (std::optional<Bytes> s = log_->LoggedSize(LogRecordKind::kLocalWrite, *path)) return *s;
  return std::max(disk_size, log_->LoggedEnd(LogRecordKind::kLocalWrite, *path));
}

Status LocalFlashLog::Overlay(int fd, Bytes offset, std::size_t size, std::string* buf) {
  if (log_->empty()) return Status::Ok();
  Result<std::string> path = PathOf(fd);
  if (!path.ok()) return path.status();
  if (!log_->Changes(LogRecordKind::kLocalWrite, *path)) return Status::Ok();
  // The file reads to its logged size even where the disk holds less: a flush replaying an
  // older, shorter truncate cuts the disk's file below a later one still in the log.
  const std::optional<Bytes> logged_size = log_->LoggedSize(LogRecordKind::kLocalWrite, *path);
  Bytes end = std::max(log_->LoggedEnd(LogRecordKind::kLocalWrite, *path), logged_size.value_or(0));
  if (end > offset) {
    std::size_t want = static_cast<std::size_t>(std::min<Bytes>(size, end - offset));
    if (buf->size() < want) buf->resize(want, '\0');
  }
  if (buf->empty()) return Status::Ok();
  Result<std::vector<std::pair<Bytes, Bytes>>> r =
      log_->ReadOverlay(LogRecordKind::kLocalWrite, *path, offset, std::span<char>(buf->data(), buf->size()));
  if (!r.ok()) return r.status();
  // The bytes the log supplied were read from its device (a later record over an earlier one
  // is read twice, as ReadOverlay does).
  Bytes from_log = 0;
  for (const auto& [a, b] : *r) from_log += b - a;
  if (from_log > 0) ChargeFlash(from_log, false);
  if (logged_size) {
    const Bytes s = *logged_size;
    buf->resize(static_cast<std::size_t>(s > offset ? std::min<Bytes>(buf->size(), s - offset) : 0));
  }
  return Status::Ok();
}

void LocalFlashLog::Replay() {
  if (log_->records().empty()) return;
  replaying_ = true;
  log_->Flush(LogFlushReason::kRecovery, [this](const FlushReport& r) {
    // Runs only while the log (owned by this) lives.
    replaying_ = false;
    // Nothing left from the last run: serials go on from what the backing tree holds.
    if (log_->records().empty()) meta_serial_ = target_->applied();
    std::fprintf(stderr, "ghostfs: flash log replayed: %zu records applied, %zu kept%s\n", r.records_applied,
                 r.records_kept, r.status.ok() ? "" : (", " + r.status.ToString()).c_str());
  });
}

void LocalFlashLog::ChargeFlash(Bytes bytes, bool write) {
  (write ? flash_bytes_written_ : flash_bytes_read_) += bytes;
  if (flash_ != nullptr) flash_->Submit({bytes, write}, [] {});
}

void LocalFlashLog::OnFlushed(const FlushReport& report) {
  // The flush read the log from its device.
  if (report.bytes_read > 0) ChargeFlash(report.bytes_read, false);
  // The disk does the flush's writes (it may have to spin up for a kFull flush: that is the
  // one spin-up the log costs).
  Bytes bytes = report.bytes_written + target_->TakeMetaCharge() * kMetaRecordBytes;
  if (bytes > 0) disk_.Submit({bytes, true}, [] {});
  last_flush_errors_ = report.errors;
  for (const std::string& e : report.errors) {
    std::fprintf(stderr, "ghostfs: flash log flush (%s): kept in the log: %s\n", LogFlushReasonName(report.reason),
                 e.c_str());
  }
  if (listener_) listener_(report);
}

nlohmann::json LocalFlashLog::StatsJson() const {
  const FlashLogStats& s = log_->stats();
  nlohmann::json flushes = nlohmann::json::object();
  for (std::size_t i = 0; i < kLogFlushReasons; ++i) {
    flushes[LogFlushReasonName(static_cast<LogFlushReason>(i))] = s.flushes[i];
  }
  return {{"dir", log_->options().dir},
          {"policy", LogFlushPolicyName(log_->options().policy)},
          {"algorithm", static_cast<int>(log_->options().algorithm)},
          {"used", s.used},
          {"capacity", s.capacity},
          {"records", s.records},
          {"appends", s.appends},
          {"append_failures", s.append_failures},
          {"flushes", flushes},
          {"bytes_merged_away", s.bytes_merged_away},
          {"records_kept", s.records_kept},
          {"corrupt_regions", s.corrupt_regions},
          {"meta_logged", meta_logged_},
          {"fills_logged", fills_logged_},
          {"meta_failures", meta_failures_},
          {"meta_serial_applied", target_->applied()},
          {"meta_serial_marker", target_->marker().Encode()},
          {"write_throughs", write_throughs_},
          {"write_through_failures", write_through_failures_},
          {"device_bytes_written", flash_bytes_written_},
          {"device_bytes_read", flash_bytes_read_},
          {"last_flush_errors", last_flush_errors_}};
}

}  // namespace ghost
