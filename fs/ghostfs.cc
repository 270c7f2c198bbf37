// The daemon's loop, its FUSE operation table, the root directory and local/.
// Origins and the read path are in origin_tree.cc; control operations in control_ops.cc.
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

#include "common/power/default_pm.h"
#include "common/power/stpm_disk.h"
#include "common/power/stpm_network.h"
#include "fs/ghostfs_internal.h"
#include "fs/mail_tree.h"

namespace ghost {
namespace {

constexpr double kAttrTimeout = 1.0;  // seconds the kernel may cache attributes and entries
constexpr const char* kLocalName = "local";
constexpr const char* kStoreName = ".ghost";  // the shared store (store_tree.cc); not listed

Daemon* Self(fuse_req_t req) { return static_cast<Daemon*>(fuse_req_userdata(req)); }

void ReplyErr(fuse_req_t req, const Status& s) { fuse_reply_err(req, s.ToErrno()); }

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
  for (event* ev : signal_evs_) event_free(ev);
  if (fuse_ev_) event_free(fuse_ev_);
  control_.reset();
  mail_.reset();
  queue_.reset();
  http_.reset();
  if (store_) (void)store_->Close();
  store_.reset();
  io_.reset();
  pm_.reset();
  disk_.reset();
  net_.reset();
  clock_.reset();
  if (local_dirfd_ >= 0) close(local_dirfd_);
  if (base_) event_base_free(base_);
}

Status Daemon::LoadMachine() {
  if (options_.profile.empty()) {
    machine_ = IdealMachine();
  } else {
    Result<MachineProfile> m = LoadMachineProfile(options_.profile);
    if (!m.ok()) return m.status();
    machine_ = *m;
  }
  const DeviceProfile* storage = machine_.FindDevice(DeviceKind::kDisk);
  if (!storage) storage = machine_.FindDevice(DeviceKind::kFlash);
  const DeviceProfile* network = machine_.FindDevice(DeviceKind::kNetwork);
  if (!storage || !network) {
    return Status::InvalidArgument("profile " + machine_.name + " needs a disk (or flash) and a network device");
  }
  disk_ = std::make_unique<Device>(*clock_, *storage, nullptr, storage->HighPowerMode());
  net_ = std::make_unique<Device>(*clock_, *network, &machine_.link, network->LowestMode());
  pm_ = std::make_unique<PowerManager>(*clock_, machine_.base_power, options_.knob);
  // Without a profile the devices are always ready: no policy. Otherwise the policies ghostsim
  // uses for the same --policy (common/sim/simulator.cc), so live and simulated runs compare.
  bool managed = !options_.profile.empty();
  std::unique_ptr<DevicePolicy> disk_policy, net_policy;
  if (managed && adaptive()) {
    disk_policy = std::make_unique<StpmDiskPolicy>();
    net_policy = std::make_unique<StpmNetworkPolicy>();
  } else if (managed) {
    disk_policy = std::make_unique<DefaultDiskPolicy>();
    net_policy = std::make_unique<DefaultNetworkPolicy>();
  }
  disk_id_ = pm_->Register(disk_.get(), std::move(disk_policy));
  net_id_ = pm_->Register(net_.get(), std::move(net_policy));
  cost_ = std::make_unique<CostModel>(
      *pm_, CostModel::Options{.ghost_hints = adaptive() && options_.ghost_hints});
  // Mode changes are pushed to `ghostctl watch`.
  for (DeviceId id : {disk_id_, net_id_}) {
    for (int m = 0; m < pm_->NumModes(id); ++m) {
      pm_->Subscribe(id, m, [this](DeviceId, int) { PublishModes(); });
    }
  }
  return Status::Ok();
}

Choice Daemon::ChooseSource(std::span<const Holder> holders, Bytes size) {
  assert(!holders.empty());
  if (adaptive()) return cost_->Choose(holders, size);
  Choice c;
  for (const Holder& h : holders) c.candidates.push_back(cost_->Estimate(h, size));
  c.chosen = c.candidates.back();
  for (const SourceEstimate& e : c.candidates) {
    if (e.holder.source != Source::kNetwork) {
      c.chosen = e;
      break;
    }
  }
  c.ideal = c.chosen;
  return c;
}

void Daemon::DiscloseTransferBegin() {
  if (adaptive()) pm_->TransferBegin(net_id_);
}

void Daemon::DiscloseTransferEnd() {
  if (adaptive()) pm_->TransferEnd(net_id_);
}

Status Daemon::OpenCache() {
  std::error_code ec;
  std::filesystem::create_directories(options_.cache_dir + "/local", ec);
  if (ec) return Status::IoError("cannot create cache directory " + options_.cache_dir + ": " + ec.message());
  local_dirfd_ = open((options_.cache_dir + "/local").c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (local_dirfd_ < 0) return Status::FromErrno(errno, "open " + options_.cache_dir + "/local");

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

  page_cache_ = std::make_unique<CacheIndex>(*clock_, kPageCacheModelBytes);
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
  http_ = std::make_unique<HttpFetcher>(base_, ho);
  return Status::Ok();
}

Status Daemon::Init() {
  base_ = MakeEventBase();
  if (!base_) return Status::Internal("cannot create the event loop");
  clock_ = std::make_unique<RealClock>(base_);
  started_ = clock_->Now();
  if (Status s = LoadMachine(); !s.ok()) return s;
  if (Status s = OpenCache(); !s.ok()) return s;
  passthrough_ = std::make_unique<FusePassthrough>(options_.cache_dir);
  Result<std::unique_ptr<MailTree>> mail = MailTree::Create(*this);
  if (!mail.ok()) return mail.status();
  mail_ = std::move(mail).value();
  if (Status s = StartControl(); !s.ok()) return s;
  return Status::Ok();
}

Status Daemon::StartControl() {
  if (options_.control_path.empty()) return Status::Ok();
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(options_.control_path).parent_path(), ec);
  Result<std::unique_ptr<ControlServer>> server = ControlServer::Listen(
      base_, options_.control_path,
      [this](const nlohmann::json& request, ControlServer::Reply reply) { HandleControl(request, std::move(reply)); });
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
  if (BadName(name)) return (void)fuse_reply_err(req, ENOENT);
  switch (p->kind) {
    case NodeKind::kRoot: {
      if (std::strcmp(name, kLocalName) == 0) {
        Node* n = inodes_.Lookup(NodeKind::kLocal, -1, "");
        struct stat st;
        if (Status s = LocalStat("", &st); !s.ok()) return ReplyErr(req, s);
        return ReplyEntry(req, n, st);
      }
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
    case NodeKind::kLocal: return LocalLookup(req, p, name);
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
    case NodeKind::kLocal: {
      struct stat st;
      if (Status s = LocalStat(n->path, &st); !s.ok()) return ReplyErr(req, s);
      st.st_ino = ino;
      return (void)fuse_reply_attr(req, &st, kAttrTimeout);
    }
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
  if (n->kind != NodeKind::kLocal) return (void)fuse_reply_err(req, EROFS);
  std::string path = LocalPath(n->path);
  auto finish = [this, req, ino, path, attr = *attr, to_set, fd = fi ? static_cast<int>(fi->fh ? handles_[fi->fh].fd : -1) : -1](Status flushed) {
    if (!flushed.ok()) return ReplyErr(req, flushed);
    if (to_set & FUSE_SET_ATTR_MODE) {
      if (fchmodat(local_dirfd_, path.c_str(), attr.st_mode & 07777, 0) != 0) return (void)fuse_reply_err(req, errno);
    }
    if (to_set & (FUSE_SET_ATTR_UID | FUSE_SET_ATTR_GID)) {
      uid_t uid = (to_set & FUSE_SET_ATTR_UID) ? attr.st_uid : static_cast<uid_t>(-1);
      gid_t gid = (to_set & FUSE_SET_ATTR_GID) ? attr.st_gid : static_cast<gid_t>(-1);
      if (fchownat(local_dirfd_, path.c_str(), uid, gid, AT_SYMLINK_NOFOLLOW) != 0) return (void)fuse_reply_err(req, errno);
    }
    if (to_set & FUSE_SET_ATTR_SIZE) {
      int r = fd >= 0 ? ftruncate(fd, attr.st_size) : -1;
      if (fd < 0) {
        int f = openat(local_dirfd_, path.c_str(), O_WRONLY | O_CLOEXEC);
        if (f < 0) return (void)fuse_reply_err(req, errno);
        r = ftruncate(f, attr.st_size);
        int e = errno;
        close(f);
        errno = e;
      }
      if (r != 0) return (void)fuse_reply_err(req, errno);
    }
    if (to_set & (FUSE_SET_ATTR_ATIME | FUSE_SET_ATTR_MTIME)) {
      timespec ts[2];
      ts[0] = (to_set & FUSE_SET_ATTR_ATIME_NOW) ? timespec{0, UTIME_NOW}
              : (to_set & FUSE_SET_ATTR_ATIME)   ? attr.st_atim
                                                 : timespec{0, UTIME_OMIT};
      ts[1] = (to_set & FUSE_SET_ATTR_MTIME_NOW) ? timespec{0, UTIME_NOW}
              : (to_set & FUSE_SET_ATTR_MTIME)   ? attr.st_mtim
                                                 : timespec{0, UTIME_OMIT};
      if (utimensat(local_dirfd_, path.c_str(), ts, AT_SYMLINK_NOFOLLOW) != 0) return (void)fuse_reply_err(req, errno);
    }
    struct stat st;
    if (Status s = LocalStat(inodes_.Find(ino) ? inodes_.Find(ino)->path : "", &st); !s.ok()) return ReplyErr(req, s);
    st.st_ino = ino;
    fuse_reply_attr(req, &st, kAttrTimeout);
  };
  // A size change must not be undone by queued writes: flush this file's first.
  struct stat cur;
  if ((to_set & FUSE_SET_ATTR_SIZE) && fstatat(local_dirfd_, path.c_str(), &cur, AT_SYMLINK_NOFOLLOW) == 0 &&
      queue_->QueuedBytes(LocalKey(cur.st_ino)) > 0) {
    return FlushLocal(LocalKey(cur.st_ino), finish);
  }
  finish(Status::Ok());
}

void Daemon::OpOpendir(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
  Node* n = inodes_.Find(ino);
  if (!n) return (void)fuse_reply_err(req, ESTALE);
  if (n->kind == NodeKind::kOriginFile || n->kind == NodeKind::kStoreObject || n->kind == NodeKind::kStoreFill ||
      n->kind == NodeKind::kMailFile) {
    return (void)fuse_reply_err(req, ENOTDIR);
  }
  fi->fh = 0;
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
  // local/
  int fd = n->path.empty() ? dup(local_dirfd_)
                           : openat(local_dirfd_, n->path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return (void)fuse_reply_err(req, errno);
  DIR* d = fdopendir(fd);
  if (!d) {
    close(fd);
    return (void)fuse_reply_err(req, errno);
  }
  std::vector<std::pair<std::string, mode_t>> entries;
  while (dirent* e = readdir(d)) {
    if (std::strcmp(e->d_name, ".") == 0 || std::strcmp(e->d_name, "..") == 0) continue;
    entries.emplace_back(e->d_name, static_cast<mode_t>(DTTOIF(e->d_type)));
  }
  closedir(d);
  std::sort(entries.begin(), entries.end());  // stable offsets across calls
  ReplyDirEntries(req, ino, size, off, entries);
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

// ---- local/ ----

std::string Daemon::LocalPath(const std::string& rel) const { return rel.empty() ? "." : rel; }

Status Daemon::LocalStat(const std::string& rel, struct stat* st) {
  if (fstatat(local_dirfd_, LocalPath(rel).c_str(), st, AT_SYMLINK_NOFOLLOW) != 0) {
    return Status::FromErrno(errno, "local/" + rel);
  }
  // Queued writes may extend the file past what is on the disk.
  if (S_ISREG(st->st_mode)) {
    local_paths_[st->st_ino] = rel;
    Bytes end = queue_->QueuedEnd(LocalKey(st->st_ino));
    if (end > static_cast<Bytes>(st->st_size)) st->st_size = static_cast<off_t>(end);
  }
  return Status::Ok();
}

void Daemon::LocalLookup(fuse_req_t req, Node* parent, const char* name) {
  std::string rel = InodeTable::Join(parent->path, name);
  struct stat st;
  if (Status s = LocalStat(rel, &st); !s.ok()) return ReplyErr(req, s);
  Node* n = inodes_.Lookup(NodeKind::kLocal, -1, rel);
  ReplyEntry(req, n, st);
}

void Daemon::OpCreate(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t mode, fuse_file_info* fi) {
  Node* p = inodes_.Find(parent);
  if (!p) return (void)fuse_reply_err(req, ESTALE);
  if (p->kind == NodeKind::kMailDir && !BadName(name)) return mail_->Create(req, p, name, mode, fi);
  if (p->kind != NodeKind::kLocal) return (void)fuse_reply_err(req, p->kind == NodeKind::kRoot ? EACCES : EROFS);
  if (BadName(name)) return (void)fuse_reply_err(req, EINVAL);
  std::string rel = InodeTable::Join(p->path, name);
  int fd = openat(local_dirfd_, rel.c_str(), (fi->flags & ~O_APPEND) | O_CREAT | O_CLOEXEC, mode);
  if (fd < 0) return (void)fuse_reply_err(req, errno);
  struct stat st;
  if (Status s = LocalStat(rel, &st); !s.ok()) {
    close(fd);
    return ReplyErr(req, s);
  }
  Node* n = inodes_.Lookup(NodeKind::kLocal, -1, rel);
  Handle h;
  h.kind = NodeKind::kLocal;
  h.fd = fd;
  h.key = LocalKey(st.st_ino);
  fi->fh = next_fh_++;
  handles_[fi->fh] = std::move(h);
  fuse_entry_param e = EntryFor(n, st);
  fuse_reply_create(req, &e, fi);
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
  int flags = fi->flags & ~(O_CREAT | O_EXCL | O_NOCTTY | O_APPEND);
  int fd = openat(local_dirfd_, n->path.c_str(), flags | O_CLOEXEC);
  if (fd < 0) return (void)fuse_reply_err(req, errno);
  struct stat st;
  if (fstat(fd, &st) != 0) {
    int e = errno;
    close(fd);
    return (void)fuse_reply_err(req, e);
  }
  local_paths_[st.st_ino] = n->path;
  auto open_done = [this, req, fi_copy = *fi, fd, key = LocalKey(st.st_ino)](Status s) mutable {
    if (!s.ok()) {
      close(fd);
      return ReplyErr(req, s);
    }
    Handle h;
    h.kind = NodeKind::kLocal;
    h.fd = fd;
    h.key = key;
    fi_copy.fh = next_fh_++;
    handles_[fi_copy.fh] = std::move(h);
    fuse_reply_open(req, &fi_copy);
  };
  // O_TRUNC already cut the file on disk; queued writes of the old contents must go first.
  if ((fi->flags & O_TRUNC) && queue_->QueuedBytes(LocalKey(st.st_ino)) > 0) {
    return FlushLocal(LocalKey(st.st_ino), [this, fd, open_done](Status s) mutable {
      if (s.ok() && ftruncate(fd, 0) != 0) s = Status::FromErrno(errno, "truncate");
      open_done(s);
    });
  }
  open_done(Status::Ok());
}

void Daemon::OpRead(fuse_req_t req, fuse_ino_t, size_t size, off_t off, fuse_file_info* fi) {
  ++fuse_reads_;
  auto it = handles_.find(fi->fh);
  if (it == handles_.end()) return (void)fuse_reply_err(req, EBADF);
  if (it->second.kind == NodeKind::kLocal) return LocalRead(req, it->second, size, off);
  if (it->second.kind == NodeKind::kStoreFill) return (void)fuse_reply_err(req, EBADF);  // write-only
  if (it->second.kind == NodeKind::kMailFile) return mail_->Read(req, it->second, size, off, fi->fh);
  OriginRead(req, it->second, size, off, fi->fh);
}

void Daemon::LocalRead(fuse_req_t req, Handle& h, size_t size, off_t off) {
  std::string buf(size, '\0');
  ssize_t n = pread(h.fd, buf.data(), size, off);
  if (n < 0) return (void)fuse_reply_err(req, errno);
  buf.resize(static_cast<size_t>(n));
  // Overlay what is still queued for this file (reads see queued data, DESIGN §3.5).
  Bytes end = queue_->QueuedEnd(h.key);
  if (end > static_cast<Bytes>(off)) {
    size_t want = static_cast<size_t>(std::min<Bytes>(size, end - static_cast<Bytes>(off)));
    if (buf.size() < want) buf.resize(want, '\0');
    queue_->Overlay(h.key, static_cast<Bytes>(off), buf.data(), buf.size());
  }
  fuse_reply_buf(req, buf.data(), buf.size());
}

void Daemon::OpWrite(fuse_req_t req, fuse_ino_t, const char* buf, size_t size, off_t off, fuse_file_info* fi) {
  auto it = handles_.find(fi->fh);
  if (it == handles_.end()) return (void)fuse_reply_err(req, EBADF);
  Handle& h = it->second;
  if (h.kind == NodeKind::kStoreFill) return StoreWrite(req, h, buf, size, off);
  if (h.kind == NodeKind::kMailFile) return mail_->Write(req, h, buf, size, off);
  if (h.kind != NodeKind::kLocal) return (void)fuse_reply_err(req, EROFS);
  if (fi->flags & O_APPEND) {
    struct stat st;
    if (fstat(h.fd, &st) == 0) off = std::max<off_t>(st.st_size, static_cast<off_t>(queue_->QueuedEnd(h.key)));
  }
  WriteRecord r;
  r.key = h.key;
  r.offset = static_cast<Bytes>(off);
  r.length = size;
  r.data.assign(buf, size);
  queue_->Add(std::move(r));
  fuse_reply_write(req, size);
}

void Daemon::FlushLocal(const std::string& key, std::function<void(Status)> done) {
  (void)key;  // the queue flushes as a whole, sorted and merged (DESIGN §3.5)
  queue_->FlushAll([done = std::move(done)] { done(Status::Ok()); });
}

void Daemon::OpFlush(fuse_req_t req, fuse_ino_t, fuse_file_info* fi) {
  auto it = handles_.find(fi->fh);
  if (it != handles_.end() && it->second.kind == NodeKind::kStoreFill) StoreHandOver(it->second);
  // close() reports a deferred write of this file that failed (once, like writeback errors).
  fuse_reply_err(req, it != handles_.end() ? TakeWriteError(it->second.key) : 0);
}

int Daemon::TakeWriteError(const std::string& key) {
  auto e = write_errors_.find(key);
  if (e == write_errors_.end()) return 0;
  int err = e->second;
  write_errors_.erase(e);
  return err;
}

void Daemon::OpFsync(fuse_req_t req, fuse_ino_t, int datasync, fuse_file_info* fi) {
  auto it = handles_.find(fi->fh);
  if (it == handles_.end()) return (void)fuse_reply_err(req, EBADF);
  if (it->second.kind != NodeKind::kLocal) return (void)fuse_reply_err(req, 0);
  // Durable means on the disk: flush the queue (this may spin the disk up), then fsync.
  std::uint64_t fh = fi->fh;
  FlushLocal(it->second.key, [this, req, fh, datasync](Status s) {
    if (!s.ok()) return ReplyErr(req, s);
    auto h = handles_.find(fh);
    if (h == handles_.end()) return (void)fuse_reply_err(req, EBADF);
    if (int err = TakeWriteError(h->second.key)) return (void)fuse_reply_err(req, err);
    int r = datasync ? fdatasync(h->second.fd) : fsync(h->second.fd);
    fuse_reply_err(req, r == 0 ? 0 : errno);
  });
}

void Daemon::OpRelease(fuse_req_t req, fuse_ino_t, fuse_file_info* fi) {
  auto it = handles_.find(fi->fh);
  if (it != handles_.end()) {
    if (it->second.kind == NodeKind::kLocal) {
      close(it->second.fd);
    } else if (it->second.kind == NodeKind::kStoreFill) {
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
  auto next = std::make_shared<std::function<void()>>();
  *next = [this, next] {
    if (write_backlog_.empty()) {
      writing_ = false;
      return;
    }
    auto [records, done] = std::move(write_backlog_.front());
    write_backlog_.pop_front();
    ApplyBatch(std::move(records), [done = std::move(done), next] {
      done();
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
    if (r.key.starts_with("local:")) {
      ino_t ino = static_cast<ino_t>(std::stoull(r.key.substr(6)));
      auto path = local_paths_.find(ino);
      if (path == local_paths_.end()) continue;
      int fd = openat(local_dirfd_, path->second.c_str(), O_WRONLY | O_CLOEXEC);
      struct stat st;
      if (fd < 0 || fstat(fd, &st) != 0 || st.st_ino != ino) {
        std::fprintf(stderr, "ghostfs: local/%s: queued write lost its file (%s)\n", path->second.c_str(),
                     std::strerror(errno));
        if (fd >= 0) close(fd);
        continue;
      }
      ++*pending;
      std::string data = std::move(r.data);
      io_->Write(fd, r.offset, std::move(data), [this, fd, finish, key = r.key, rel = path->second](Result<std::size_t> n) {
        if (!n.ok()) {
          // Like the kernel's writeback errors: the next fsync or close of the file reports it.
          std::fprintf(stderr, "ghostfs: local/%s: a deferred write failed: %s\n", rel.c_str(), n.status().ToString().c_str());
          write_errors_[key] = n.status().ToErrno();
        }
        close(fd);
        finish();
      });
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
  if (p->kind != NodeKind::kLocal) return (void)fuse_reply_err(req, p->kind == NodeKind::kRoot ? EACCES : EROFS);
  if (BadName(name)) return (void)fuse_reply_err(req, EINVAL);
  std::string rel = InodeTable::Join(p->path, name);
  if (mkdirat(local_dirfd_, rel.c_str(), mode) != 0) return (void)fuse_reply_err(req, errno);
  LocalLookup(req, p, name);
}

void Daemon::OpUnlink(fuse_req_t req, fuse_ino_t parent, const char* name) {
  Node* p = inodes_.Find(parent);
  if (!p) return (void)fuse_reply_err(req, ESTALE);
  if (p->kind == NodeKind::kStoreDir) return StoreUnlink(req, p, name);
  if (p->kind == NodeKind::kMailDir && !BadName(name)) return mail_->Unlink(req, p, name);
  if (p->kind != NodeKind::kLocal) return (void)fuse_reply_err(req, p->kind == NodeKind::kRoot ? EACCES : EROFS);
  if (BadName(name)) return (void)fuse_reply_err(req, ENOENT);
  std::string rel = InodeTable::Join(p->path, name);
  struct stat st;
  if (fstatat(local_dirfd_, rel.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) return (void)fuse_reply_err(req, errno);
  auto unlink_now = [this, req, rel](Status s) {
    if (!s.ok()) return ReplyErr(req, s);
    fuse_reply_err(req, unlinkat(local_dirfd_, rel.c_str(), 0) == 0 ? 0 : errno);
  };
  // Queued writes to a file that still has other links or open handles must land first.
  if (queue_->QueuedBytes(LocalKey(st.st_ino)) > 0) return FlushLocal(LocalKey(st.st_ino), unlink_now);
  unlink_now(Status::Ok());
}

void Daemon::OpRmdir(fuse_req_t req, fuse_ino_t parent, const char* name) {
  Node* p = inodes_.Find(parent);
  if (!p) return (void)fuse_reply_err(req, ESTALE);
  if (p->kind != NodeKind::kLocal) return (void)fuse_reply_err(req, p->kind == NodeKind::kRoot ? EACCES : EROFS);
  if (BadName(name)) return (void)fuse_reply_err(req, ENOENT);
  std::string rel = InodeTable::Join(p->path, name);
  fuse_reply_err(req, unlinkat(local_dirfd_, rel.c_str(), AT_REMOVEDIR) == 0 ? 0 : errno);
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
  if (BadName(name) || BadName(newname)) return (void)fuse_reply_err(req, EINVAL);
  std::string from = InodeTable::Join(p->path, name);
  std::string to = InodeTable::Join(q->path, newname);
  if (renameat2(local_dirfd_, from.c_str(), local_dirfd_, to.c_str(), flags) != 0) {
    return (void)fuse_reply_err(req, errno);
  }
  inodes_.Rename(NodeKind::kLocal, -1, from, to);
  // The writer finds queued data by backing inode; keep its path current.
  for (auto& [ino, rel] : local_paths_) {
    if (rel == from) rel = to;
    else if (rel.starts_with(from + "/")) rel = to + rel.substr(from.size());
  }
  fuse_reply_err(req, 0);
}

void Daemon::OpStatfs(fuse_req_t req, fuse_ino_t) {
  struct statvfs st;
  if (fstatvfs(local_dirfd_, &st) != 0) return (void)fuse_reply_err(req, errno);
  fuse_reply_statfs(req, &st);
}

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
  if (n->kind != NodeKind::kOriginFile) return (void)fuse_reply_err(req, ENODATA);
  std::optional<std::string> v = OriginXattr(n, name);
  if (!v) return (void)fuse_reply_err(req, ENODATA);
  ReplyXattr(req, *v, size);
}

void Daemon::OpListxattr(fuse_req_t req, fuse_ino_t ino, size_t size) {
  Node* n = inodes_.Find(ino);
  if (!n) return (void)fuse_reply_err(req, ESTALE);
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
    // Maildir writers (Python's mailbox) try link(2) first and fall back to rename on EPERM.
    o.link = [](fuse_req_t r, fuse_ino_t, fuse_ino_t, const char*) { fuse_reply_err(r, EPERM); };
    o.rename = [](fuse_req_t r, fuse_ino_t p, const char* n, fuse_ino_t np, const char* nn, unsigned f) {
      Self(r)->OpRename(r, p, n, np, nn, f);
    };
    o.getxattr = [](fuse_req_t r, fuse_ino_t i, const char* n, size_t s) { Self(r)->OpGetxattr(r, i, n, s); };
    o.listxattr = [](fuse_req_t r, fuse_ino_t i, size_t s) { Self(r)->OpListxattr(r, i, s); };
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
  if (!options_.foreground && fuse_daemonize(0) != 0) {
    fuse_session_unmount(se_);
    fuse_session_destroy(se_);
    return 1;
  }
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
