// The daemon's loop, its FUSE operation table and the root directory; each operation goes to
// the tree of its node. local/ is in local_tree.cc (LocalTree, behind a LocalContext); origins
// and the read path in origin_tree.cc; control operations in control_ops.cc.
#include <dirent.h>
#include <event2/event.h>
#include <fcntl.h>
#include <sys/statvfs.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <cassert>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "common/base/log.h"
#include "common/base/mounts.h"
#include "fs/ghostfs_internal.h"
#include "fs/mail_tree.h"

namespace ghost {
namespace {

constexpr double kAttrTimeout = 1.0;  // seconds the kernel may cache attributes and entries
constexpr const char* kLocalName = "local";
constexpr const char* kStoreName = ".ghost";  // the shared store (store_tree.cc); not listed

Daemon* Self(fuse_req_t req) { return static_cast<Daemon*>(fuse_req_userdata(req)); }

// A machine whose devices are always ready and cost nothing: used without --profile, so the
// read path is the same code, and nothing is injected.
MachineProfile IdealMachine() {
  MachineProfile m;
  m.name = "ideal";
  m.description = "no emulated devices: always ready, no delays";
  m.link.round_trips = 1;
  m.link.warm_round_trips = 1;
  for (DeviceKind kind : {DeviceKind::kDisk, DeviceKind::kNetwork}) {
    DeviceProfile d;
    d.kind = kind;
    d.name = kind == DeviceKind::kDisk ? "cache-disk" : "network";
    Mode on;
    on.name = "ready";
    on.serves_io = true;
    d.modes.push_back(on);
    m.devices.push_back(d);
  }
  return m;
}

}  // namespace

Daemon::Daemon(const GhostfsOptions& options) : options_(options) {}

Daemon::~Daemon() {
  local_.reset();
  for (event* ev : signal_evs_) event_free(ev);
  if (fuse_ev_) event_free(fuse_ev_);
  control_.reset();
  mail_.reset();
  queue_.reset();
  http_.reset();
  if (store_) (void)store_->Close();
  store_.reset();
  io_.reset();
  manager_.reset();
  machine_.reset();
  clock_.reset();
  if (base_) event_base_free(base_);
}

Status Daemon::LoadMachine() {
  MachineProfile profile;
  if (options_.profile.empty()) {
    profile = IdealMachine();
  } else {
    Result<MachineProfile> m = LoadMachineProfile(options_.profile);
    if (!m.ok()) return m.status();
    profile = std::move(m).value();
  }
  // The machine ghostsim builds for the same --policy (common/power/machine.h), so live and
  // simulated runs compare. Without a profile the devices are always ready: no policy.
  MachineOptions mo;
  mo.policy = options_.policy;
  mo.knob = options_.knob;
  mo.ghost_hints = options_.ghost_hints;
  mo.power_management = !options_.profile.empty();
  Result<std::unique_ptr<Machine>> machine = Machine::Build(*clock_, std::move(profile), mo);
  if (!machine.ok()) return machine.status();
  machine_ = std::move(machine).value();
  pm_ = &machine_->pm();
  disk_ = &machine_->storage();
  net_ = &machine_->network();
  disk_id_ = machine_->storage_id();
  net_id_ = machine_->network_id();
  cost_ = &machine_->cost();
  manager_ = std::make_unique<CacheManager>(
      *clock_, *machine_, CacheManager::Options{.page_cache = kPageCacheModelBytes});
  // Mode changes are pushed to `ghostctl watch`.
  for (DeviceId id : {disk_id_, net_id_}) {
    for (int m = 0; m < pm_->NumModes(id); ++m) {
      pm_->Subscribe(id, m, [this](DeviceId, int) { PublishModes(); });
    }
  }
  return Status::Ok();
}

void Daemon::DiscloseTransferBegin() { machine_->TransferBegin(); }

void Daemon::DiscloseTransferEnd() { machine_->TransferEnd(); }

Status Daemon::OpenCache() {
  std::error_code ec;
  std::filesystem::create_directories(options_.cache_dir, ec);
  if (ec) return Status::IoError("cannot create cache directory " + options_.cache_dir + ": " + ec.message());
  // One daemon per cache directory: two would write one index and one set of bodies. Held
  // until exit (by the daemonised child after the fork; Run records its pid).
  Result<PidLock> lock = PidLock::Acquire(options_.cache_dir + "/lock");
  if (!lock.ok()) {
    if (lock.status().code() != Status::Code::kExists) return lock.status();
    return Status::Exists("cache directory " + options_.cache_dir + " is in use by another ghostfs (" +
                          lock.status().message() + "); stop that ghostfs, or give this one another --cache");
  }
  cache_lock_.emplace(std::move(lock).value());

  Result<std::unique_ptr<UringFileIo>> uring = UringFileIo::Create(base_);
  if (uring.ok()) {
    io_ = std::move(uring).value();
  } else {
    std::fprintf(stderr, "ghostfs: io_uring unavailable (%s); using pread/pwrite\n",
                 uring.status().ToString().c_str());
    io_ = std::make_unique<SyncFileIo>(base_);
  }
  Result<std::unique_ptr<CacheStore>> store =
      CacheStore::Open(options_.cache_dir + "/objects-db", options_.cache_size, *clock_, *io_);
  if (!store.ok()) return store.status();
  store_ = std::move(store).value();
  for (const std::string& w : store_->warnings()) std::fprintf(stderr, "ghostfs: %s\n", w.c_str());

  WriteQueueOptions wq;
  wq.cap = options_.write_queue_cap;
  queue_ = std::make_unique<WriteQueue>(
      *pm_, disk_id_, wq,
      [this](std::vector<WriteRecord> batch, std::function<void()> done) { WriteBatch(std::move(batch), std::move(done)); });
  HttpFetcherOptions ho;
  ho.ca_info = options_.cacert;  // --cacert: the same trust for https:// as for imaps://
  // A stalled origin fails within the stall timeout (libcurl's low-speed limit: under 1 byte/s
  // for that long, whole seconds), and so does one that does not finish connecting.
  ho.low_speed_time = options_.stall_timeout;
  if (options_.stall_timeout > Duration::zero()) {
    ho.connect_timeout = std::min<Duration>(ho.connect_timeout, options_.stall_timeout);
  }
  ho.on_finish = [this](const HttpRequest& rq, int http_status, const Status& s) {
    health_->Record(rq.head ? "HEAD" : "GET", rq.url, http_status, s);  // logs failures
  };
  http_ = std::make_unique<HttpFetcher>(base_, ho);
  Result<std::unique_ptr<LocalTree>> local = LocalTree::Create(
      options_.cache_dir + "/local",
      LocalContext{.inodes = inodes_,
                   .queue = *queue_,
                   .io = *io_,
                   .new_fh = [this] { return next_fh_++; },
                   .reply_dir_entries =
                       [this](fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
                              const std::vector<std::pair<std::string, mode_t>>& entries) {
                         ReplyDirEntries(req, ino, size, off, entries);
                       },
                   .attr_timeout = kAttrTimeout});
  if (!local.ok()) return local.status();
  local_ = std::move(local).value();
  return Status::Ok();
}

namespace {

// Refuses a mount point that already is a FUSE mount (a ghostfs, or one whose daemon died):
// mounting on top would stack silently and hide it.
Status CheckMountPoint(const std::string& mountpoint) {
  struct stat st {};
  if (::stat(mountpoint.c_str(), &st) != 0) {
    if (errno == ENOTCONN) {
      return Status::Exists(mountpoint + " is a FUSE mount whose daemon has gone; unmount it first " +
                            "(fusermount3 -u " + mountpoint + ")");
    }
    return Status::Ok();  // fuse_session_mount reports a missing mount point
  }
  std::error_code ec;
  std::filesystem::path real = std::filesystem::canonical(mountpoint, ec);
  if (ec) return Status::Ok();
  std::optional<MountInfo> m = MountAt(real.string());
  if (!m || !m->fstype.starts_with("fuse")) return Status::Ok();
  std::string what = m->fstype == "fuse.ghost" ? std::string("a ghostfs")
                                                : "a FUSE file system (" + m->fstype + ")";
  return Status::Exists(mountpoint + " is already the mount point of " + what +
                        "; unmount it first (fusermount3 -u " + mountpoint +
                        ") or choose another mount point");
}

// fuse_daemonize(3), except that the child names itself in the cache lock (which it inherited
// with the fork) before the parent exits: once `ghostfs` returns to the shell, CACHE/lock names
// the process that serves. In the child: returns true (detached, in /, stdio on /dev/null). The
// parent exits 0 once the child is ready, 1 if it died first. False if the fork failed.
bool Daemonize(PidLock* lock) {
  int ready[2];
  if (::pipe2(ready, O_CLOEXEC) != 0) {
    std::perror("ghostfs: pipe");
    return false;
  }
  pid_t pid = ::fork();
  if (pid < 0) {
    std::perror("ghostfs: fork");
    ::close(ready[0]);
    ::close(ready[1]);
    return false;
  }
  if (pid > 0) {
    ::close(ready[1]);
    char done = 1;
    ssize_t n;
    while ((n = ::read(ready[0], &done, 1)) < 0 && errno == EINTR) {
    }
    ::_exit(n == 1 && done == 0 ? 0 : 1);
  }
  ::close(ready[0]);
  ::setsid();
  if (::chdir("/") != 0) std::perror("ghostfs: chdir /");
  int null = ::open("/dev/null", O_RDWR);
  if (null >= 0) {
    for (int fd = 0; fd <= 2; ++fd) ::dup2(null, fd);
    if (null > 2) ::close(null);
  }
  if (lock != nullptr) (void)lock->RecordPid();
  char done = 0;
  (void)!::write(ready[1], &done, 1);
  ::close(ready[1]);
  return true;
}

}  // namespace

Status Daemon::Init() {
  if (Status s = CheckMountPoint(options_.mountpoint); !s.ok()) return s;
  base_ = MakeEventBase();
  if (!base_) return Status::Internal("cannot create the event loop");
  clock_ = std::make_unique<RealClock>(base_);
  started_ = clock_->Now();
  if (Status s = LoadMachine(); !s.ok()) return s;
  StartObserving();  // fs/observability.cc: origin health, mode log lines, the static baseline
  if (Status s = OpenCache(); !s.ok()) return s;
  passthrough_ = std::make_unique<FusePassthrough>(options_.cache_dir);
  Result<std::unique_ptr<MailTree>> mail = MailTree::Create(*this);
  if (!mail.ok()) return mail.status();
  mail_ = std::move(mail).value();
  if (Status s = StartControl(); !s.ok()) return s;
  return Status::Ok();
}

Status Daemon::StartControl() {
  // Always a control socket: without --control, the one ghostctl and ghostproxy derive from
  // the mount point (MountControlPath, common/control/control.h), in a directory only we use.
  std::error_code ec;
  if (options_.control_path.empty()) {
    options_.control_path = MountControlPath(options_.mountpoint);
    const std::filesystem::path dir = std::filesystem::path(options_.control_path).parent_path();
    if (std::filesystem::create_directories(dir, ec)) {
      std::filesystem::permissions(dir, std::filesystem::perms::owner_all, ec);
    }
  }
  std::filesystem::create_directories(std::filesystem::path(options_.control_path).parent_path(), ec);
  Result<std::unique_ptr<ControlServer>> server = ControlServer::Listen(
      base_, options_.control_path,
      [this](const ControlRequest& request, ControlServer::Reply reply) { HandleControl(request, std::move(reply)); });
  if (!server.ok()) return server.status();
  control_ = std::move(server).value();
  return Status::Ok();
}

// ---- the loop ----

void Daemon::OnFuseReadable() {
  // One buffer for every request (libfuse allocates it on first use): a fresh megabyte per
  // request would cost an mmap and page faults each time.
  int n = fuse_session_receive_buf(se_, &fuse_buf_);
  if (n > 0) fuse_session_process_buf(se_, &fuse_buf_);
  if (n < 0 && n != -EINTR && n != -EAGAIN) fuse_session_exit(se_);
  if (fuse_session_exited(se_)) Shutdown();
}

void Daemon::Shutdown() {
  // Once: the ended session's fd stays readable (ENODEV), and each call would queue another
  // flush waiter while a sleeping disk spins up.
  if (shutting_down_) return;
  shutting_down_ = true;
  if (fuse_ev_) event_del(fuse_ev_);
  // Deferred writes reach the disk before the loop ends (they may spin it up).
  if (!queue_) {
    event_base_loopbreak(base_);
    return;
  }
  queue_->FlushAll([this] { event_base_loopbreak(base_); });
}

// ---- attributes ----

struct stat Daemon::DirStat(fuse_ino_t ino) const {
  struct stat st {};
  st.st_ino = ino;
  st.st_mode = S_IFDIR | 0555;
  st.st_nlink = 2;
  st.st_uid = getuid();
  st.st_gid = getgid();
  return st;
}

fuse_entry_param Daemon::EntryFor(Node* n, const struct stat& st) {
  fuse_entry_param e{};
  e.ino = n->ino;
  e.attr = st;
  e.attr.st_ino = n->ino;
  e.attr_timeout = kAttrTimeout;
  e.entry_timeout = kAttrTimeout;
  return e;
}

void Daemon::ReplyEntry(fuse_req_t req, Node* n, const struct stat& st) {
  fuse_entry_param e = EntryFor(n, st);
  fuse_reply_entry(req, &e);
}

bool Daemon::BadName(const char* name) {
  return name[0] == '\0' || std::strcmp(name, ".") == 0 || std::strcmp(name, "..") == 0 ||
         std::strchr(name, '/') != nullptr || std::strlen(name) > 255;
}

// ---- FUSE operations ----

void Daemon::OpLookup(fuse_req_t req, fuse_ino_t parent, const char* name) {
  Node* p = inodes_.Find(parent);
  if (!p) return (void)fuse_reply_err(req, ESTALE);
  if (p->kind == NodeKind::kLocal) return local_->Lookup(req, p, name);
  if (BadName(name)) return (void)fuse_reply_err(req, ENOENT);
  switch (p->kind) {
    case NodeKind::kRoot: {
      if (std::strcmp(name, kLocalName) == 0) return local_->LookupRoot(req);
      if (std::strcmp(name, kStoreName) == 0) {
        Node* n = inodes_.Lookup(NodeKind::kStoreDir, -1, "");
        return ReplyEntry(req, n, StoreStat(n));
      }
      for (int i = 0; i < static_cast<int>(options_.origins.size()); ++i) {
        if (options_.origins[i].name == name) {
          Node* n = inodes_.Lookup(mail_->IsMailOrigin(i) ? NodeKind::kMailDir : NodeKind::kOriginDir, i, "");
          return ReplyEntry(req, n, DirStat(n->ino));
        }
      }
      return (void)fuse_reply_err(req, ENOENT);
    }
    case NodeKind::kLocal: return;  // answered above (local/ checks its own names)
    case NodeKind::kOriginDir: return OriginLookup(req, p, name);
    case NodeKind::kStoreDir: return StoreLookup(req, p, name);
    case NodeKind::kMailDir: return mail_->Lookup(req, p, name);
    case NodeKind::kMailFile:
    case NodeKind::kOriginFile:
    case NodeKind::kStoreObject:
    case NodeKind::kStoreFill: return (void)fuse_reply_err(req, ENOTDIR);
  }
}

void Daemon::OpForget(fuse_ino_t ino, uint64_t nlookup) { inodes_.Forget(ino, nlookup); }

void Daemon::OpGetattr(fuse_req_t req, fuse_ino_t ino) {
  Node* n = inodes_.Find(ino);
  if (!n) return (void)fuse_reply_err(req, ESTALE);
  switch (n->kind) {
    case NodeKind::kRoot: {
      struct stat st = DirStat(ino);
      st.st_mode = S_IFDIR | 0755;
      return (void)fuse_reply_attr(req, &st, kAttrTimeout);
    }
    case NodeKind::kLocal: return local_->Getattr(req, n);
    case NodeKind::kOriginDir:
    case NodeKind::kOriginFile: return OriginGetattr(req, n);
    case NodeKind::kStoreDir:
    case NodeKind::kStoreObject:
    case NodeKind::kStoreFill: return StoreGetattr(req, n);
    case NodeKind::kMailDir:
    case NodeKind::kMailFile: return mail_->Getattr(req, n);
  }
}

void Daemon::OpSetattr(fuse_req_t req, fuse_ino_t ino, struct stat* attr, int to_set, fuse_file_info* fi) {
  Node* n = inodes_.Find(ino);
  if (!n) return (void)fuse_reply_err(req, ESTALE);
  if (n->kind == NodeKind::kMailDir || n->kind == NodeKind::kMailFile) return mail_->Setattr(req, n, attr, to_set);
  // The kernel truncates O_TRUNC opens with a SETATTR (no atomic O_TRUNC, local_tree.h): a
  // proxy opens its fill token with O_TRUNC, and a fill starts empty anyway.
  constexpr int kTimes = FUSE_SET_ATTR_ATIME | FUSE_SET_ATTR_MTIME | FUSE_SET_ATTR_ATIME_NOW |
                         FUSE_SET_ATTR_MTIME_NOW | FUSE_SET_ATTR_CTIME;
  if (n->kind == NodeKind::kStoreFill && (to_set & ~(FUSE_SET_ATTR_SIZE | kTimes)) == 0 && attr->st_size == 0) {
    return StoreGetattr(req, n);
  }
  if (n->kind != NodeKind::kLocal) return (void)fuse_reply_err(req, EROFS);
  local_->Setattr(req, n, *attr, to_set, fi ? fi->fh : 0);
}

void Daemon::OpOpendir(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
  Node* n = inodes_.Find(ino);
  if (!n) return (void)fuse_reply_err(req, ESTALE);
  if (n->kind == NodeKind::kOriginFile || n->kind == NodeKind::kStoreObject || n->kind == NodeKind::kStoreFill ||
      n->kind == NodeKind::kMailFile) {
    return (void)fuse_reply_err(req, ENOTDIR);
  }
  fi->fh = 0;
  if (n->kind == NodeKind::kOriginDir) {
    // The directory's own failure (404 → ENOENT, 403 → EACCES, unreachable) is said here:
    // readdir(3) takes an ENOENT from getdents for the end of the directory, so a 404 would
    // list as an empty directory. The listing fetched stays for the readdir that follows.
    fuse_file_info info = *fi;
    return WithListing(n->origin, n->path, [req, info](Result<const Listing*> l) {
      if (!l.ok()) return (void)fuse_reply_err(req, l.status().ToErrno());
      fuse_reply_open(req, &info);
    });
  }
  fuse_reply_open(req, fi);
}

void Daemon::OpReleasedir(fuse_req_t req, fuse_ino_t, fuse_file_info*) { fuse_reply_err(req, 0); }

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

void Daemon::OpReaddir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, fuse_file_info*) {
  Node* n = inodes_.Find(ino);
  if (!n) return (void)fuse_reply_err(req, ESTALE);
  if (n->kind == NodeKind::kOriginDir) return OriginReaddir(req, n, size, off);
  if (n->kind == NodeKind::kStoreDir) return StoreReaddir(req, n, size, off);
  if (n->kind == NodeKind::kMailDir) return mail_->Readdir(req, n, size, off);
  if (n->kind == NodeKind::kRoot) {
    std::vector<std::pair<std::string, mode_t>> entries;
    for (const Origin& o : options_.origins) entries.emplace_back(o.name, S_IFDIR);
    entries.emplace_back(kLocalName, S_IFDIR);
    return ReplyDirEntries(req, ino, size, off, entries);
  }
  local_->Readdir(req, n, size, off);
}

void Daemon::ReplyDirEntries(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
                             const std::vector<std::pair<std::string, mode_t>>& entries) {
  DirBuffer out(req, size, off);
  if (out.Add(".", ino, S_IFDIR) && out.Add("..", ino, S_IFDIR)) {
    for (const auto& [name, mode] : entries) {
      if (!out.Add(name, kUnknownIno, mode)) break;
    }
  }
  out.Reply();
}

void Daemon::OpCreate(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t mode, fuse_file_info* fi) {
  Node* p = inodes_.Find(parent);
  if (!p) return (void)fuse_reply_err(req, ESTALE);
  if (p->kind == NodeKind::kLocal) return local_->Create(req, p, name, mode, fi);
  if (p->kind == NodeKind::kMailDir && !BadName(name)) return mail_->Create(req, p, name, mode, fi);
  fuse_reply_err(req, NotWritable(p));
}

void Daemon::OpOpen(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
  Node* n = inodes_.Find(ino);
  if (!n) return (void)fuse_reply_err(req, ESTALE);
  if (n->kind == NodeKind::kRoot || n->kind == NodeKind::kOriginDir || n->kind == NodeKind::kStoreDir ||
      n->kind == NodeKind::kMailDir) {
    return (void)fuse_reply_err(req, EISDIR);
  }
  if (n->kind == NodeKind::kMailFile) return mail_->Open(req, n, fi);
  if (n->kind == NodeKind::kStoreObject || n->kind == NodeKind::kStoreFill) return StoreOpen(req, n, fi);
  if (n->kind == NodeKind::kOriginFile) {
    if ((fi->flags & O_ACCMODE) != O_RDONLY) return (void)fuse_reply_err(req, EROFS);
    return OriginOpen(req, n, fi);
  }
  local_->Open(req, n, fi);
}

void Daemon::OpRead(fuse_req_t req, fuse_ino_t, size_t size, off_t off, fuse_file_info* fi) {
  ++fuse_reads_;
  if (local_->Owns(fi->fh)) return local_->Read(req, fi->fh, size, off);
  auto it = handles_.find(fi->fh);
  if (it == handles_.end()) return (void)fuse_reply_err(req, EBADF);
  if (it->second.kind == NodeKind::kStoreFill) return (void)fuse_reply_err(req, EBADF);  // write-only
  if (it->second.kind == NodeKind::kMailFile) return mail_->Read(req, it->second, size, off, fi->fh);
  OriginRead(req, it->second, size, off, fi->fh);
}

void Daemon::OpWrite(fuse_req_t req, fuse_ino_t, const char* buf, size_t size, off_t off, fuse_file_info* fi) {
  if (local_->Owns(fi->fh)) return local_->Write(req, fi->fh, buf, size, off);
  auto it = handles_.find(fi->fh);
  if (it == handles_.end()) return (void)fuse_reply_err(req, EBADF);
  Handle& h = it->second;
  if (h.kind == NodeKind::kStoreFill) return StoreWrite(req, h, buf, size, off);
  if (h.kind == NodeKind::kMailFile) return mail_->Write(req, h, buf, size, off);
  fuse_reply_err(req, EROFS);
}

void Daemon::OpFlush(fuse_req_t req, fuse_ino_t, fuse_file_info* fi) {
  if (local_->Owns(fi->fh)) return local_->Flush(req, fi->fh);
  auto it = handles_.find(fi->fh);
  if (it != handles_.end() && it->second.kind == NodeKind::kStoreFill) StoreHandOver(it->second);
  fuse_reply_err(req, 0);
}

void Daemon::OpFsync(fuse_req_t req, fuse_ino_t, int datasync, fuse_file_info* fi) {
  if (local_->Owns(fi->fh)) return local_->Fsync(req, fi->fh, datasync);
  if (!handles_.contains(fi->fh)) return (void)fuse_reply_err(req, EBADF);
  fuse_reply_err(req, 0);
}

void Daemon::OpRelease(fuse_req_t req, fuse_ino_t, fuse_file_info* fi) {
  if (local_->Owns(fi->fh)) {
    local_->Release(fi->fh);
    return (void)fuse_reply_err(req, 0);
  }
  auto it = handles_.find(fi->fh);
  if (it != handles_.end()) {
    if (it->second.kind == NodeKind::kStoreFill) {
      StoreHandOver(it->second);
    } else {
      if (it->second.fd >= 0) close(it->second.fd);
      OriginRelease(it->second);
    }
    handles_.erase(it);
  }
  fuse_reply_err(req, 0);
}

void Daemon::WriteBatch(std::vector<WriteRecord> batch, std::function<void()> done) {
  write_backlog_.emplace_back(std::move(batch), std::move(done));
  if (writing_) return;
  writing_ = true;
  // Runs the backlog one batch at a time: io_uring does not order writes, batches must be.
  // The runner holds itself only weakly: each batch's completion holds it until it has started
  // the next batch, so it is freed once the backlog is empty (a strong self-reference leaked it
  // every time the writer went idle).
  auto next = std::make_shared<std::function<void()>>();
  *next = [this, self = std::weak_ptr<std::function<void()>>(next)] {
    if (write_backlog_.empty()) {
      writing_ = false;
      return;
    }
    auto [records, done] = std::move(write_backlog_.front());
    write_backlog_.pop_front();
    ApplyBatch(std::move(records), [this, done = std::move(done), next = self.lock()] {
      done();
      local_->DropIdle();  // files whose last queued write is now durable
      (*next)();
    });
  };
  (*next)();
}

// Applies a sorted, merged batch to the disk: local/ records are written into their files;
// cache fills are committed to the cache store.
void Daemon::ApplyBatch(std::vector<WriteRecord> batch, std::function<void()> done) {
  Bytes total = 0;
  for (const WriteRecord& r : batch) total += r.length;
  auto pending = std::make_shared<int>(1);
  auto finish = [pending, done] {
    if (--*pending == 0) done();
  };
  // The emulated disk does the same amount of work (it may need to spin up first).
  ++*pending;
  disk_->Submit({total, true}, finish);
  bool save_index = false;  // metadata changes (after a 304) wait for a batch, too
  for (WriteRecord& r : batch) {
    if (r.kind == WriteKind::kLocalFile) {
      ++*pending;
      local_->ApplyWrite(std::move(r), finish);
    } else if (r.key.starts_with("index:")) {
      save_index = true;
    } else if (r.key.starts_with("fill:")) {
      std::string url = r.key.substr(5);
      auto meta = pending_fills_.find(url);
      if (meta == pending_fills_.end()) continue;
      CacheEntry entry = meta->second;
      pending_fills_.erase(meta);
      // The latest queued version of the body (its metadata is the latest too).
      std::shared_ptr<const std::string> body;
      if (auto q = queued_bodies_.find(url); q != queued_bodies_.end()) {
        body = std::move(q->second.data);
        queued_bodies_.erase(q);
      }
      Result<FillId> fill = store_->BeginFill(url, entry);
      if (!fill.ok()) {
        std::fprintf(stderr, "ghostfs: not caching %s: %s\n", url.c_str(), fill.status().ToString().c_str());
        continue;
      }
      ++*pending;
      FillId id = *fill;
      ++writing_fills_[url];
      store_->AppendFill(id, body ? std::string(*body) : std::move(r.data), [this, id, url, finish](Status s) {
        if (!s.ok()) {
          std::fprintf(stderr, "ghostfs: not caching %s: %s\n", url.c_str(), s.ToString().c_str());
          store_->AbortFill(id);
          FillSettled(url);
          return finish();
        }
        store_->CommitFill(id, [this, url, finish](Status c) {
          if (!c.ok()) std::fprintf(stderr, "ghostfs: not caching %s: %s\n", url.c_str(), c.ToString().c_str());
          else FillCommitted(url);
          FillSettled(url);
          finish();
        });
      });
    }
  }
  if (save_index) {
    if (Status s = store_->SaveIndex(); !s.ok()) std::fprintf(stderr, "ghostfs: saving the cache index: %s\n", s.ToString().c_str());
  }
  finish();
}

void Daemon::OpMkdir(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t mode) {
  Node* p = inodes_.Find(parent);
  if (!p) return (void)fuse_reply_err(req, ESTALE);
  if (p->kind != NodeKind::kLocal) return (void)fuse_reply_err(req, NotWritable(p));
  local_->Mkdir(req, p, name, mode);
}

void Daemon::OpMknod(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t mode, dev_t rdev) {
  Node* p = inodes_.Find(parent);
  if (!p) return (void)fuse_reply_err(req, ESTALE);
  if (p->kind != NodeKind::kLocal) return (void)fuse_reply_err(req, NotWritable(p));
  local_->Mknod(req, p, name, mode, rdev);
}

void Daemon::OpSymlink(fuse_req_t req, const char* target, fuse_ino_t parent, const char* name) {
  Node* p = inodes_.Find(parent);
  if (!p) return (void)fuse_reply_err(req, ESTALE);
  if (p->kind != NodeKind::kLocal) return (void)fuse_reply_err(req, NotWritable(p));
  local_->Symlink(req, target, p, name);
}

void Daemon::OpReadlink(fuse_req_t req, fuse_ino_t ino) {
  Node* n = inodes_.Find(ino);
  if (!n) return (void)fuse_reply_err(req, ESTALE);
  if (n->kind != NodeKind::kLocal) return (void)fuse_reply_err(req, EINVAL);  // no links elsewhere
  local_->Readlink(req, n);
}

void Daemon::OpLink(fuse_req_t req, fuse_ino_t ino, fuse_ino_t newparent, const char* newname) {
  Node* n = inodes_.Find(ino);
  Node* q = inodes_.Find(newparent);
  if (!n || !q) return (void)fuse_reply_err(req, ESTALE);
  // Maildir writers (Python's mailbox) try link(2) first and fall back to rename on EPERM.
  if (n->kind != NodeKind::kLocal || q->kind != NodeKind::kLocal) return (void)fuse_reply_err(req, EPERM);
  local_->Link(req, n, q, newname);
}

int Daemon::NotWritable(const Node* parent) { return parent->kind == NodeKind::kRoot ? EACCES : EROFS; }

void Daemon::OpUnlink(fuse_req_t req, fuse_ino_t parent, const char* name) {
  Node* p = inodes_.Find(parent);
  if (!p) return (void)fuse_reply_err(req, ESTALE);
  if (p->kind == NodeKind::kLocal) return local_->Unlink(req, p, name);
  if (p->kind == NodeKind::kStoreDir) return StoreUnlink(req, p, name);
  if (p->kind == NodeKind::kMailDir && !BadName(name)) return mail_->Unlink(req, p, name);
  fuse_reply_err(req, NotWritable(p));
}

void Daemon::OpRmdir(fuse_req_t req, fuse_ino_t parent, const char* name) {
  Node* p = inodes_.Find(parent);
  if (!p) return (void)fuse_reply_err(req, ESTALE);
  if (p->kind != NodeKind::kLocal) return (void)fuse_reply_err(req, NotWritable(p));
  local_->Rmdir(req, p, name);
}

void Daemon::OpRename(fuse_req_t req, fuse_ino_t parent, const char* name, fuse_ino_t newparent,
                      const char* newname, unsigned int flags) {
  Node* p = inodes_.Find(parent);
  Node* q = inodes_.Find(newparent);
  if (!p || !q) return (void)fuse_reply_err(req, ESTALE);
  if (p->kind == NodeKind::kMailDir && !BadName(name) && !BadName(newname)) {
    return mail_->Rename(req, p, name, q, newname, flags);
  }
  if (p->kind != NodeKind::kLocal || q->kind != NodeKind::kLocal) {
    return (void)fuse_reply_err(req, (p->kind == NodeKind::kOriginDir || q->kind == NodeKind::kOriginDir) ? EROFS : EXDEV);
  }
  local_->Rename(req, p, name, q, newname, flags);
}

void Daemon::OpStatfs(fuse_req_t req, fuse_ino_t) { local_->Statfs(req); }

// ---- extended attributes ----

namespace {
constexpr const char* kXattrs[] = {"user.ghost.cached", "user.ghost.source", "user.ghost.cost",
                                   "user.http.etag", "user.http.content_type"};

void ReplyXattr(fuse_req_t req, const std::string& value, size_t size) {
  if (size == 0) return (void)fuse_reply_xattr(req, value.size());
  if (size < value.size()) return (void)fuse_reply_err(req, ERANGE);
  fuse_reply_buf(req, value.data(), value.size());
}
}  // namespace

void Daemon::OpGetxattr(fuse_req_t req, fuse_ino_t ino, const char* name, size_t size) {
  Node* n = inodes_.Find(ino);
  if (!n) return (void)fuse_reply_err(req, ESTALE);
  if (n->kind == NodeKind::kMailFile) {
    std::optional<std::string> v = mail_->Xattr(n, name);
    if (!v) return (void)fuse_reply_err(req, ENODATA);
    return ReplyXattr(req, *v, size);
  }
  if (n->kind == NodeKind::kLocal) return local_->Getxattr(req, n, name, size);
  if (n->kind != NodeKind::kOriginFile) return (void)fuse_reply_err(req, ENODATA);
  std::optional<std::string> v = OriginXattr(n, name);
  if (!v) return (void)fuse_reply_err(req, ENODATA);
  ReplyXattr(req, *v, size);
}

void Daemon::OpListxattr(fuse_req_t req, fuse_ino_t ino, size_t size) {
  Node* n = inodes_.Find(ino);
  if (!n) return (void)fuse_reply_err(req, ESTALE);
  if (n->kind == NodeKind::kLocal) return local_->Listxattr(req, n, size);
  std::string list;
  if (n->kind == NodeKind::kOriginFile) {
    for (const char* x : kXattrs) {
      if (OriginXattr(n, x)) list.append(x).push_back('\0');
    }
  }
  if (n->kind == NodeKind::kMailFile) {
    for (const std::string& x : mail_->XattrNames(n)) list.append(x).push_back('\0');
  }
  ReplyXattr(req, list, size);
}

// Only local/ keeps attributes that users set; elsewhere ENOTSUP (never ENOSYS, which the
// kernel would take as "no setxattr on the whole mount").
void Daemon::OpSetxattr(fuse_req_t req, fuse_ino_t ino, const char* name, const char* value, size_t size, int flags) {
  Node* n = inodes_.Find(ino);
  if (!n) return (void)fuse_reply_err(req, ESTALE);
  if (n->kind != NodeKind::kLocal) return (void)fuse_reply_err(req, ENOTSUP);
  local_->Setxattr(req, n, name, value, size, flags);
}

void Daemon::OpRemovexattr(fuse_req_t req, fuse_ino_t ino, const char* name) {
  Node* n = inodes_.Find(ino);
  if (!n) return (void)fuse_reply_err(req, ESTALE);
  if (n->kind != NodeKind::kLocal) return (void)fuse_reply_err(req, ENOTSUP);
  local_->Removexattr(req, n, name);
}

// ---- the operation table and the loop ----

namespace {

constexpr unsigned kReadAheadBytes = 1 << 20;

// A FUSE mount's read-ahead window is the smaller of max_readahead and its backing device
// info's read_ahead_kb, which starts at 128 KiB: raise the latter (root only; best effort).
// The bdi is named after the mount's device number, found in /proc/self/mountinfo because a
// stat of our own mount point would wait for the loop that is not running yet.
void RaiseReadAhead(const std::string& mountpoint) {
  std::ifstream mounts("/proc/self/mountinfo");
  std::string line;
  std::string dev;
  while (std::getline(mounts, line)) {
    // "id parent major:minor root mountpoint ..." (mount points with blanks are escaped as \040)
    std::istringstream fields(line);
    std::string id, parent, majmin, root, point;
    if (fields >> id >> parent >> majmin >> root >> point && point == mountpoint) dev = majmin;
  }
  if (dev.empty()) return;
  std::ofstream ra("/sys/class/bdi/" + dev + "/read_ahead_kb");
  ra << kReadAheadBytes / 1024;
}

const fuse_lowlevel_ops* Operations() {
  static fuse_lowlevel_ops ops = [] {
    fuse_lowlevel_ops o{};
    o.init = [](void*, fuse_conn_info* conn) {
      // Large sequential reads in few requests: let the kernel read ahead up to 1 MiB, in
      // 1 MiB requests (libfuse derives the kernel's max_pages from max_write). Every request
      // is a round trip through the loop. The kernel also caps read-ahead at the mount's bdi
      // setting, which RaiseReadAhead lifts.
      conn->max_readahead = kReadAheadBytes;
      conn->max_write = kReadAheadBytes;
      if (conn->capable & FUSE_CAP_ASYNC_READ) conn->want |= FUSE_CAP_ASYNC_READ;
      // The kernel truncates an O_TRUNC open itself, with a SETATTR after its checks (write
      // permission; ETXTBSY for a running binary), as on a local file system. An atomic
      // O_TRUNC would reach the daemon inside the open and truncate before those checks.
      conn->want &= ~FUSE_CAP_ATOMIC_O_TRUNC;
    };
    o.lookup = [](fuse_req_t r, fuse_ino_t p, const char* n) { Self(r)->OpLookup(r, p, n); };
    o.forget = [](fuse_req_t r, fuse_ino_t i, uint64_t n) {
      Self(r)->OpForget(i, n);
      fuse_reply_none(r);
    };
    o.forget_multi = [](fuse_req_t r, size_t count, fuse_forget_data* f) {
      for (size_t i = 0; i < count; ++i) Self(r)->OpForget(f[i].ino, f[i].nlookup);
      fuse_reply_none(r);
    };
    o.getattr = [](fuse_req_t r, fuse_ino_t i, fuse_file_info*) { Self(r)->OpGetattr(r, i); };
    o.setattr = [](fuse_req_t r, fuse_ino_t i, struct stat* a, int s, fuse_file_info* f) { Self(r)->OpSetattr(r, i, a, s, f); };
    o.opendir = [](fuse_req_t r, fuse_ino_t i, fuse_file_info* f) { Self(r)->OpOpendir(r, i, f); };
    o.readdir = [](fuse_req_t r, fuse_ino_t i, size_t s, off_t o, fuse_file_info* f) { Self(r)->OpReaddir(r, i, s, o, f); };
    o.releasedir = [](fuse_req_t r, fuse_ino_t i, fuse_file_info* f) { Self(r)->OpReleasedir(r, i, f); };
    o.open = [](fuse_req_t r, fuse_ino_t i, fuse_file_info* f) { Self(r)->OpOpen(r, i, f); };
    o.create = [](fuse_req_t r, fuse_ino_t p, const char* n, mode_t m, fuse_file_info* f) { Self(r)->OpCreate(r, p, n, m, f); };
    o.read = [](fuse_req_t r, fuse_ino_t i, size_t s, off_t o, fuse_file_info* f) { Self(r)->OpRead(r, i, s, o, f); };
    o.write = [](fuse_req_t r, fuse_ino_t i, const char* b, size_t s, off_t o, fuse_file_info* f) { Self(r)->OpWrite(r, i, b, s, o, f); };
    o.flush = [](fuse_req_t r, fuse_ino_t i, fuse_file_info* f) { Self(r)->OpFlush(r, i, f); };
    o.release = [](fuse_req_t r, fuse_ino_t i, fuse_file_info* f) { Self(r)->OpRelease(r, i, f); };
    o.fsync = [](fuse_req_t r, fuse_ino_t i, int d, fuse_file_info* f) { Self(r)->OpFsync(r, i, d, f); };
    o.mkdir = [](fuse_req_t r, fuse_ino_t p, const char* n, mode_t m) { Self(r)->OpMkdir(r, p, n, m); };
    o.unlink = [](fuse_req_t r, fuse_ino_t p, const char* n) { Self(r)->OpUnlink(r, p, n); };
    o.rmdir = [](fuse_req_t r, fuse_ino_t p, const char* n) { Self(r)->OpRmdir(r, p, n); };
    o.link = [](fuse_req_t r, fuse_ino_t i, fuse_ino_t np, const char* nn) { Self(r)->OpLink(r, i, np, nn); };
    o.mknod = [](fuse_req_t r, fuse_ino_t p, const char* n, mode_t m, dev_t d) { Self(r)->OpMknod(r, p, n, m, d); };
    o.symlink = [](fuse_req_t r, const char* t, fuse_ino_t p, const char* n) { Self(r)->OpSymlink(r, t, p, n); };
    o.readlink = [](fuse_req_t r, fuse_ino_t i) { Self(r)->OpReadlink(r, i); };
    o.rename = [](fuse_req_t r, fuse_ino_t p, const char* n, fuse_ino_t np, const char* nn, unsigned f) {
      Self(r)->OpRename(r, p, n, np, nn, f);
    };
    o.getxattr = [](fuse_req_t r, fuse_ino_t i, const char* n, size_t s) { Self(r)->OpGetxattr(r, i, n, s); };
    o.listxattr = [](fuse_req_t r, fuse_ino_t i, size_t s) { Self(r)->OpListxattr(r, i, s); };
    o.setxattr = [](fuse_req_t r, fuse_ino_t i, const char* n, const char* v, size_t s, int f) {
      Self(r)->OpSetxattr(r, i, n, v, s, f);
    };
    o.removexattr = [](fuse_req_t r, fuse_ino_t i, const char* n) { Self(r)->OpRemovexattr(r, i, n); };
    o.statfs = [](fuse_req_t r, fuse_ino_t i) { Self(r)->OpStatfs(r, i); };
    return o;
  }();
  return &ops;
}

}  // namespace

int Daemon::Run() {
  std::vector<std::string> argv_store = {"ghostfs", "-o", "fsname=ghostfs,subtype=ghost,default_permissions"};
  for (const std::string& o : options_.fuse_options) {
    argv_store.push_back("-o");
    argv_store.push_back(o);
  }
  std::vector<char*> argv;
  for (std::string& s : argv_store) argv.push_back(s.data());
  fuse_args args = FUSE_ARGS_INIT(static_cast<int>(argv.size()), argv.data());
  se_ = fuse_session_new(&args, Operations(), sizeof(fuse_lowlevel_ops), this);
  fuse_opt_free_args(&args);  // option parsing left a copy of the arguments there
  if (!se_) {
    std::fprintf(stderr, "ghostfs: bad FUSE options\n");
    return 2;
  }
  // Resolved before mounting: afterwards a lookup of the mount point waits for this loop.
  std::error_code ec;
  std::string mount_path = std::filesystem::canonical(options_.mountpoint, ec).string();
  if (fuse_session_mount(se_, options_.mountpoint.c_str()) != 0) {
    std::fprintf(stderr, "ghostfs: cannot mount on %s\n", options_.mountpoint.c_str());
    fuse_session_destroy(se_);
    return 1;
  }
  mount_path_ = ec ? options_.mountpoint : mount_path;
  // Passthrough is off under --profile: a passthrough read never reaches the daemon, and the
  // emulated disk must be charged for every read as it happens (DESIGN §7: live replays land
  // within ±15% of ghostsim). Charging the whole body at open instead would charge reads that
  // never happen (a file's head, parts of an mmap) and hold the open for the whole transfer,
  // which ghostsim does not model. The read path with its per-read charge stays as it was.
  if (options_.passthrough && options_.profile.empty()) {
    fuse_custom_io io{};
    io.read = [](int fd, void* buf, size_t len, void* self) {
      return static_cast<Daemon*>(self)->passthrough_->Read(fd, buf, len);
    };
    io.writev = [](int fd, iovec* iov, int count, void* self) {
      return static_cast<Daemon*>(self)->passthrough_->Writev(fd, iov, count);
    };
    passthrough_->Attach(se_, io);
  }
  mail_->Start();
  if (!ec) RaiseReadAhead(mount_path);
  if (!options_.foreground && !Daemonize(cache_lock_ ? &*cache_lock_ : nullptr)) {
    fuse_session_unmount(se_);
    fuse_session_destroy(se_);
    return 1;
  }
  // A log file or syslog: the lines written straight to stderr reach it too.
  if (Status s = CaptureStderr(base_); !s.ok()) Log(LogLevel::kWarn, "stderr not captured: %s", s.ToString().c_str());
  Log(LogLevel::kInfo, "serving %s (%zu origins, cache %s, %s)", mount_path_.c_str(), options_.origins.size(),
      options_.cache_dir.c_str(),
      options_.profile.empty() ? "energy not modelled: no --profile"
                               : ("energy modelled from profile " + machine_->profile().name).c_str());
  fuse_ev_ = event_new(base_, fuse_session_fd(se_), EV_READ | EV_PERSIST,
                       [](evutil_socket_t, short, void* self) { static_cast<Daemon*>(self)->OnFuseReadable(); }, this);
  event_add(fuse_ev_, nullptr);
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) {
    event* ev = evsignal_new(base_, sig, [](evutil_socket_t, short, void* self) {
      static_cast<Daemon*>(self)->Shutdown();
    }, this);
    event_add(ev, nullptr);
    signal_evs_.push_back(ev);
  }
  std::signal(SIGPIPE, SIG_IGN);
  // A write past a file-size limit fails with EFBIG, reported to its writer, instead of
  // killing the daemon (and every queued write with it).
  std::signal(SIGXFSZ, SIG_IGN);
  event_base_dispatch(base_);
  event_del(fuse_ev_);
  std::free(fuse_buf_.mem);
  fuse_buf_.mem = nullptr;
  fuse_session_unmount(se_);
  fuse_session_destroy(se_);
  se_ = nullptr;
  return 0;
}

Result<std::unique_ptr<GhostFs>> GhostFs::Create(const GhostfsOptions& options) {
  if (Status s = Validate(options); !s.ok()) return s;
  auto d = std::make_unique<Daemon>(options);
  if (Status s = d->Init(); !s.ok()) return s;
  return std::unique_ptr<GhostFs>(std::move(d));
}

void Daemon::QueueWholeFill(const std::string& key, std::string body,
                            const std::string& content_type) {
  CacheEntry meta;
  meta.content_type = content_type;
  QueueFill(key, std::move(meta), std::move(body));
}

void Daemon::QueueFill(const std::string& key, CacheEntry meta, std::string body) {
  meta.size = body.size();
  pending_fills_[key] = meta;
  QueuedBody& q = queued_bodies_[key];
  q.data = std::make_shared<const std::string>(std::move(body));
  q.version = next_body_version_++;
  // Length only: two queued fills of one key must not merge into a body of neither (the
  // queue merges records of a key byte-wise); the writer takes the bytes from queued_bodies_.
  WriteRecord rec;
  rec.key = "fill:" + key;
  rec.length = meta.size;
  queue_->Add(std::move(rec));
}

}  // namespace ghost
