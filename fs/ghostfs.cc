// The daemon's loop, its FUSE operation table and the root directory; each operation goes to
// the tree of its node (fs/tree.h): origins and the read path in origin_tree.cc, Maildirs in
// mail_tree.cc, .ghost/ in store_tree.cc, local/ in local_tree.cc; control operations in
// control_ops.cc.
#include <dirent.h>
#include <event2/event.h>
#include <fcntl.h>
#include <sys/stat.h>
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
#include "common/power/ideal_machine.h"
#include "fs/ghostfs_internal.h"
#include "fs/flash_local.h"
#include "fs/local_tree.h"
#include "fs/mail_tree.h"
#include "fs/origin_tree.h"
#include "fs/store_tree.h"

namespace ghost {
namespace {

constexpr double kAttrTimeout = 1.0;  // seconds the kernel may cache attributes and entries
constexpr const char* kLocalName = "local";
constexpr const char* kStoreName = ".ghost";  // the shared store (store_tree.cc); not listed

Daemon* Self(fuse_req_t req) { return static_cast<Daemon*>(fuse_req_userdata(req)); }

}  // namespace

Daemon::Daemon(const GhostfsOptions& options) : options_(options) {}

Daemon::~Daemon() {
  if (stats_timer_ != kNoTimer && clock_) clock_->Cancel(stats_timer_);
  if (index_timer_ != kNoTimer && clock_) clock_->Cancel(index_timer_);
  if (store_) store_->SetUnsavedListener(nullptr);
  hardware_.reset();  // the card's power save back as found (SIGTERM ends here too)
  local_.reset();
  root_.reset();
  for (event* ev : signal_evs_) event_free(ev);
  if (shutdown_watch_) event_free(shutdown_watch_);
  if (fuse_ev_) event_free(fuse_ev_);
  control_.reset();
  mail_.reset();
  http_.reset();
  store_tree_.reset();
  origin_.reset();
  write_back_.reset();
  flash_.reset();  // after the write-back that borrows it, before the I/O it uses
  if (store_) (void)store_->Close();
  store_.reset();
  io_.reset();
  manager_.reset();
  // Both borrow the clock (the baseline's machine has timers of its own): before it goes.
  if (shadow_) {
    if (Status s = shadow_->SaveDay(); !s.ok()) std::fprintf(stderr, "ghostfs: today's saved energy: %s\n", s.ToString().c_str());
  }
  shadow_.reset();
  health_.reset();
  machine_.reset();
  clock_.reset();
  if (base_) FreeEventBase(base_);
}

Status Daemon::LoadMachine() {
  MachineProfile profile;
  if (options_.profile.empty()) {
    profile = IdealMachineProfile();
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

  WriteBackOptions wb;
  wb.queue.cap = options_.write_queue_cap;
  wb.fill_backlog_max = options_.fill_backlog_max;
  write_back_ = std::make_unique<WriteBack>(*pm_, disk_id_, machine_->storage(), *store_, wb);
  store_->SetUnsavedListener([this] { ScheduleIndexSave(); });
  // Access times left unsaved while the disk slept go with its next spin-up (pushed by the
  // power manager: no timer, no wake-up of its own).
  pm_->Subscribe(disk_id_, pm_->device(disk_id_).profile().HighPowerMode(), [this](DeviceId, int) {
    if (store_ && store_->unsaved_index_changes() > 0) write_back_->QueueIndexUpdate("");
  });
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
  return Status::Ok();
}

// The root directory: one directory per origin, local/, and .ghost/ (not listed).
class RootTree final : public Tree {
 public:
  RootTree(const GhostfsOptions& options, InodeTable& inodes, LocalTree& local, StoreTree& store, MailTree& mail)
      : options_(options), inodes_(inodes), local_(local), store_(store), mail_(mail) {}

  void Lookup(fuse_req_t req, Node*, const char* name) override {
    if (std::strcmp(name, kLocalName) == 0) return local_.LookupRoot(req);
    if (std::strcmp(name, kStoreName) == 0) return store_.LookupRoot(req);
    for (int i = 0; i < static_cast<int>(options_.origins.size()); ++i) {
      if (options_.origins[i].name == name) {
        Node* n = inodes_.Lookup(mail_.IsMailOrigin(i) ? NodeKind::kMailDir : NodeKind::kOriginDir, i, "");
        return ReplyNodeEntry(req, n, ReadOnlyDirStat(n->ino), kAttrTimeout);
      }
    }
    fuse_reply_err(req, ENOENT);
  }
  void Getattr(fuse_req_t req, Node* n) override {
    struct stat st = ReadOnlyDirStat(n->ino);
    st.st_mode = S_IFDIR | 0755;
    fuse_reply_attr(req, &st, kAttrTimeout);
  }
  void Readdir(fuse_req_t req, Node* n, size_t size, off_t off, fuse_file_info*) override {
    std::vector<std::pair<std::string, mode_t>> entries;
    for (const Origin& o : options_.origins) entries.emplace_back(o.name, S_IFDIR);
    entries.emplace_back(kLocalName, S_IFDIR);
    ReplyDirEntries(req, n->ino, size, off, entries);
  }
  void Open(fuse_req_t req, Node*, fuse_file_info*) override { fuse_reply_err(req, EISDIR); }

 protected:
  int NotWritable(const Node*) const override { return EACCES; }

 private:
  const GhostfsOptions& options_;
  InodeTable& inodes_;
  LocalTree& local_;
  StoreTree& store_;
  MailTree& mail_;
};

TreeContext Daemon::Context() {
  return TreeContext{.options = options_,
                     .clock = *clock_,
                     .machine = *machine_,
                     .manager = *manager_,
                     .store = *store_,
                     .write_back = *write_back_,
                     .inodes = inodes_,
                     .io = *io_,
                     .http = *http_,
                     .passthrough = *passthrough_,
                     .reads = reads_,
                     .new_fh = [this] { return next_fh_++; },
                     .stats_changed = [this] { PublishStats(); },
                     .object_changed =
                         [this](const std::string& key) {
                           if (control_ && control_->Subscribed("objects")) control_->Publish("objects", {{"key", key}});
                         },
                     .baseline_write = [this](Bytes n) { BaselineWrite(n); },
                     .baseline_fetch = [this](Bytes n) { BaselineFetch(n); },
                     .imap_outcome = [this](const std::string& url, bool answered, const Status& s) { ImapOutcome(url, answered, s); },
                     .loop = base_,
                     .mount_path = mount_path_,
                     .invalidate_inode =
                         [this](fuse_ino_t ino) {
                           if (notifier_) notifier_->Invalidate(ino);
                         },
                     .invalidate_attributes =
                         [this](fuse_ino_t ino) {
                           // Offset < 0: attributes only, no page invalidation (no page lock).
                           if (notifier_ && se_) (void)fuse_lowlevel_notify_inval_inode(se_, ino, -1, 0);
                         }};
}

Status Daemon::OpenFlashLog() {
  // Without a log: refused if the cache was left by a crash with one that holds records.
  if (options_.flash_log.empty()) return CheckLeftFlashLog(options_.cache_dir, "");
  Result<FlashLogSpec> spec = ParseFlashLogSpec(options_.flash_log);
  if (!spec.ok()) return spec.status();
  FlashLogOptions fo;
  fo.dir = spec->dir;
  fo.capacity = spec->capacity;
  // A small log (ParseFlashLogSpec takes 64K) gets a smaller DRAM buffer, so that several of
  // its largest records fit: FlashLog::Open refuses a buffer larger than the log.
  fo.buffer = std::min<Bytes>(fo.buffer, fo.capacity / 4);
  fo.policy = ParseLogFlushPolicy(options_.flash_policy).value_or(LogFlushPolicy::kWhenFull);
  fo.algorithm = static_cast<FlushAlgorithm>(options_.flash_alg);
  RecoveryReport report;
  Result<std::unique_ptr<LocalFlashLog>> flash = LocalFlashLog::Open(
      fo, *io_, options_.cache_dir + "/local", *pm_, disk_id_, machine_->storage(), &report);
  if (!flash.ok()) return flash.status();
  flash_ = std::move(flash).value();
  // Reads served from the log are charged to its device (Machine::AddFlash).
  if (!options_.profile.empty() && !options_.flash_device.empty()) {
    Result<DeviceProfile> device = LoadDeviceProfile(options_.flash_device);
    if (!device.ok()) return device.status();
    if (Result<DeviceId> id = machine_->AddFlash(*clock_, *device); !id.ok()) return id.status();
    // So are its appends and its flushes' reads of the log.
    flash_->SetFlashDevice(machine_->flash());
  }
  if (report.torn_tail_cut > 0 || !report.corrupt.empty()) {
    std::fprintf(stderr, "ghostfs: flash log %s: %zu records recovered, a torn tail of %llu bytes cut, %zu corrupt "
                 "regions skipped (saved beside the log)\n", fo.dir.c_str(), report.records,
                 static_cast<unsigned long long>(report.torn_tail_cut), report.corrupt.size());
  }
  for (const CorruptRegion& c : report.corrupt) {
    std::fprintf(stderr, "ghostfs: flash log %s: corrupt record (bad CRC) at offset %llu, %llu bytes: %s\n",
                 fo.dir.c_str(), static_cast<unsigned long long>(c.offset), static_cast<unsigned long long>(c.length),
                 c.saved_as.empty() ? "could not be saved" : ("saved as " + c.saved_as).c_str());
  }
  flash_->SetFlushListener([this](const FlushReport&) { PublishStats(); });
  return Status::Ok();
}

Status Daemon::MakeTrees() {
  if (Status s = OpenFlashLog(); !s.ok()) return s;
  Result<std::unique_ptr<LocalTree>> local = LocalTree::Create(
      options_.cache_dir + "/local",
      LocalContext{.inodes = inodes_,
                   .queue = write_back_->queue(),
                   .io = *io_,
                   .new_fh = [this] { return next_fh_++; },
                   .reply_dir_entries = ReplyDirEntries,
                   .baseline_write = [this](Bytes n) { BaselineWrite(n); },
                   .attr_timeout = kAttrTimeout,
                   .flash = flash_.get()});
  if (!local.ok()) return local.status();
  local_ = std::move(local).value();
  origin_ = std::make_unique<OriginTree>(Context());
  store_tree_ = std::make_unique<StoreTree>(Context(), *origin_);
  Result<std::unique_ptr<MailTree>> mail = MailTree::Create(Context(), *origin_);
  if (!mail.ok()) return mail.status();
  mail_ = std::move(mail).value();
  root_ = std::make_unique<RootTree>(options_, inodes_, *local_, *store_tree_, *mail_);
  write_back_->SetHooks(WriteBack::Hooks{
      .local_file = [this](WriteRecord r, std::function<void()> done) { local_->ApplyWrite(std::move(r), std::move(done)); },
      .local_file_to_log = [this](WriteRecord r, std::function<void()> done) { local_->ApplyWriteToLog(std::move(r), std::move(done)); },
      .batch_done = [this] { local_->DropIdle(); },  // files whose last queued write is durable
      .fill_committed = [this](const std::string&) { PublishStats(); }});
  if (flash_) {
    write_back_->SetFlashLog(flash_.get());
    flash_->Replay();  // what the last run left in the log goes to the disk now
  }
  return Status::Ok();
}

void Daemon::ScheduleIndexSave() {
  if (index_timer_ != kNoTimer) return;
  index_timer_ = clock_->ScheduleAt(clock_->Now() + store_->access_max_lag(), [this] {
    index_timer_ = kNoTimer;
    // "" names no object: the record stands for the index's unsaved rows as a whole. Only
    // while the disk takes writes: queued behind a sleeping disk, the record would make the
    // queue's next flush spin the disk up for access times (and keep fills out of the flash
    // log, which does not take index rows). While it sleeps, the save waits for its
    // high-power mode (the subscription in OpenCache) or for the next fill's transaction.
    if (store_->unsaved_index_changes() > 0 && write_back_->queue().WriteNow()) {
      write_back_->QueueIndexUpdate("");
    }
  });
}

void Daemon::PublishStats() {
  if (!control_ || !control_->Subscribed("stats")) return;
  if (stats_timer_ != kNoTimer) return;  // the publish already due will carry this change
  const TimePoint now = clock_->Now();
  if (!stats_published_ || now >= *stats_published_ + kStatsEventInterval) return PublishStatsNow();
  stats_timer_ = clock_->ScheduleAt(*stats_published_ + kStatsEventInterval, [this] {
    stats_timer_ = kNoTimer;
    PublishStatsNow();
  });
}

void Daemon::PublishStatsNow() {
  stats_published_ = clock_->Now();
  if (control_ && control_->Subscribed("stats")) control_->Publish("stats", StatsJson());
}

Tree& Daemon::TreeOf(const Node* n) {
  switch (n->kind) {
    case NodeKind::kRoot: return *root_;
    case NodeKind::kLocal: return *local_;
    case NodeKind::kOriginDir:
    case NodeKind::kOriginFile: return *origin_;
    case NodeKind::kStoreDir:
    case NodeKind::kStoreObject:
    case NodeKind::kStoreFill: return *store_tree_;
    case NodeKind::kMailDir:
    case NodeKind::kMailFile: return *mail_;
  }
  assert(false && "a node of no tree");
  return *root_;
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
  StartHardware();
  passthrough_ = std::make_unique<FusePassthrough>(options_.cache_dir);
  if (Status s = MakeTrees(); !s.ok()) return s;
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
  // A client gone in the middle of a transfer it disclosed (a proxy killed or stopped while
  // sending) ends it: else the card's power policy would see activity for ever.
  control_->SetCloseHandler([this](std::uint64_t connection) {
    if (store_tree_) store_tree_->ConnectionClosed(connection);
  });
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
  if (mail_) mail_->ReportQueuedAtExit();  // journaled: they go out after the next mount
  // Deferred writes reach the disk before the loop ends (they may spin it up).
  if (!write_back_) {
    event_base_loopbreak(base_);
    return;
  }
  const TimePoint start = clock_->Now();
  shutdown_start_ = start;
  if (!write_back_->queue().idle() || (flash_ && !flash_->log().empty())) {
    Log(LogLevel::kInfo, "unmount: flushing %zu queued writes (%llu bytes)%s to the disk", write_back_->queue().queued_records(),
        static_cast<unsigned long long>(write_back_->queue().queued_bytes()),
        flash_ ? (" and the flash log's " + std::to_string(flash_->log().records().size()) + " records").c_str() : "");
  }
  // Whoever waits for our exit (a script, a test harness) may give up and kill us: say what the
  // flush waits for while it runs long.
  shutdown_watch_ = evtimer_new(base_, [](evutil_socket_t, short, void* self) {
    static_cast<Daemon*>(self)->ReportShutdownProgress();
  }, this);
  const timeval every{10, 0};
  evtimer_add(shutdown_watch_, &every);
  write_back_->queue().FlushAll([this, start] {
    // The flash log goes to the disk too, so the disk holds everything after an unmount (a
    // later mount without --flash-log sees it all).
    if (!flash_) return (void)event_base_loopbreak(base_);
    flash_->log().Flush(LogFlushReason::kExplicit, [this, start](const FlushReport& r) {
      // Said when it is worth knowing: the flush's sync covers the whole file system, which
      // takes seconds on a busy machine, and whoever waits for the daemon's exit waits that long.
      const double secs = std::chrono::duration<double>(clock_->Now() - start).count();
      if (secs >= 2 || r.records_kept > 0) {
        std::fprintf(stderr, "ghostfs: unmount: flash log flushed to the disk in %.1f s: %zu records applied, %zu kept "
                     "in the log (replayed at the next mount)\n", secs, r.records_applied, r.records_kept);
      }
      event_base_loopbreak(base_);
    });
  });
}

void Daemon::ReportShutdownProgress() {
  const double secs = std::chrono::duration<double>(clock_->Now() - shutdown_start_).count();
  const WriteQueue& q = write_back_->queue();
  std::string what = q.idle() ? "the write queue is flushed"
                              : "the write queue: " + std::to_string(q.queued_records()) + " records queued, " +
                                    std::to_string(q.batches_in_flight()) + " batches being written";
  if (flash_) what += "; the flash log: " + flash_->log().Progress();
  Log(LogLevel::kWarn, "unmount: still flushing after %.0f s: %s", secs, what.c_str());
  const timeval every{10, 0};
  evtimer_add(shutdown_watch_, &every);
}

// ---- FUSE operations: the node, the checks every tree shares, then the node's tree ----

namespace {

bool IsDir(NodeKind k) {
  return k == NodeKind::kRoot || k == NodeKind::kOriginDir || k == NodeKind::kStoreDir || k == NodeKind::kMailDir;
}

}  // namespace

void Daemon::OpLookup(fuse_req_t req, fuse_ino_t parent, const char* name) {
  Node* p = inodes_.Find(parent);
  if (!p) return (void)fuse_reply_err(req, ESTALE);
  Tree& t = TreeOf(p);
  if (!t.ChecksNames()) {
    if (BadName(name)) return (void)fuse_reply_err(req, ENOENT);
    if (!IsDir(p->kind)) return (void)fuse_reply_err(req, ENOTDIR);
  }
  t.Lookup(req, p, name);
}

void Daemon::OpForget(fuse_ino_t ino, uint64_t nlookup) {
  // A local/ inode's backing file, for LocalTree::Forgotten once the inode is freed.
  struct stat backing {};
  Node* n = inodes_.Find(ino);
  bool local = n && n->kind == NodeKind::kLocal && n->fd.valid() && fstat(n->fd.get(), &backing) == 0 &&
               S_ISREG(backing.st_mode);
  inodes_.Forget(ino, nlookup);
  if (local && local_ && !inodes_.Find(ino)) local_->Forgotten(backing.st_dev, backing.st_ino);
  // A forgotten inode number is never handed out again: what its reads did goes with it (else
  // the map grows by one entry each time the kernel drops and looks up a file again).
  if (!inodes_.Find(ino)) reads_.decisions.erase(ino);
}

void Daemon::OpGetattr(fuse_req_t req, fuse_ino_t ino) {
  Node* n = inodes_.Find(ino);
  if (!n) return (void)fuse_reply_err(req, ESTALE);
  TreeOf(n).Getattr(req, n);
}

void Daemon::OpSetattr(fuse_req_t req, fuse_ino_t ino, struct stat* attr, int to_set, fuse_file_info* fi) {
  Node* n = inodes_.Find(ino);
  if (!n) return (void)fuse_reply_err(req, ESTALE);
  TreeOf(n).Setattr(req, n, attr, to_set, fi);
}

void Daemon::OpOpendir(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
  Node* n = inodes_.Find(ino);
  if (!n) return (void)fuse_reply_err(req, ESTALE);
  if (n->kind != NodeKind::kLocal && !IsDir(n->kind)) return (void)fuse_reply_err(req, ENOTDIR);
  fi->fh = 0;
  TreeOf(n).Opendir(req, n, fi);
}

// Only local/ keeps a handle of an open directory (a stream of its backing directory).
void Daemon::OpReleasedir(fuse_req_t req, fuse_ino_t, fuse_file_info* fi) {
  if (fi->fh != 0) local_->Releasedir(fi->fh);
  fuse_reply_err(req, 0);
}

void Daemon::OpReaddir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, fuse_file_info* fi) {
  Node* n = inodes_.Find(ino);
  if (!n) return (void)fuse_reply_err(req, ESTALE);
  TreeOf(n).Readdir(req, n, size, off, fi);
}

void Daemon::OpCreate(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t mode, fuse_file_info* fi) {
  Node* p = inodes_.Find(parent);
  if (!p) return (void)fuse_reply_err(req, ESTALE);
  TreeOf(p).Create(req, p, name, mode, fi);
}

void Daemon::OpOpen(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
  Node* n = inodes_.Find(ino);
  if (!n) return (void)fuse_reply_err(req, ESTALE);
  if (IsDir(n->kind)) return (void)fuse_reply_err(req, EISDIR);
  TreeOf(n).Open(req, n, fi);
}

// Open files: the kernel holds a lookup of an open file's inode until it is released, so the
// node is there; if not, the handle is unknown.
void Daemon::OpRead(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, fuse_file_info* fi) {
  ++reads_.fuse_reads;
  Node* n = inodes_.Find(ino);
  if (!n) return (void)fuse_reply_err(req, EBADF);
  TreeOf(n).Read(req, n, size, off, fi);
}

void Daemon::OpWrite(fuse_req_t req, fuse_ino_t ino, const char* buf, size_t size, off_t off, fuse_file_info* fi) {
  Node* n = inodes_.Find(ino);
  if (!n) return (void)fuse_reply_err(req, EBADF);
  TreeOf(n).Write(req, n, buf, size, off, fi);
}

void Daemon::OpFlush(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
  ++reads_.fuse_flushes;
  Node* n = inodes_.Find(ino);
  if (!n) return (void)fuse_reply_err(req, 0);
  TreeOf(n).Flush(req, n, fi);
}

void Daemon::OpFsync(fuse_req_t req, fuse_ino_t ino, int datasync, fuse_file_info* fi) {
  Node* n = inodes_.Find(ino);
  if (!n) return (void)fuse_reply_err(req, EBADF);
  TreeOf(n).Fsync(req, n, datasync, fi);
}

void Daemon::OpFallocate(fuse_req_t req, fuse_ino_t ino, int mode, off_t off, off_t len, fuse_file_info* fi) {
  Node* n = inodes_.Find(ino);
  if (!n) return (void)fuse_reply_err(req, EBADF);
  TreeOf(n).Fallocate(req, n, mode, off, len, fi);
}

void Daemon::OpRelease(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
  Node* n = inodes_.Find(ino);
  if (!n) return (void)fuse_reply_err(req, 0);
  TreeOf(n).Release(req, n, fi);
}

void Daemon::OpMkdir(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t mode) {
  Node* p = inodes_.Find(parent);
  if (!p) return (void)fuse_reply_err(req, ESTALE);
  TreeOf(p).Mkdir(req, p, name, mode);
}

void Daemon::OpMknod(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t mode, dev_t rdev) {
  Node* p = inodes_.Find(parent);
  if (!p) return (void)fuse_reply_err(req, ESTALE);
  TreeOf(p).Mknod(req, p, name, mode, rdev);
}

void Daemon::OpSymlink(fuse_req_t req, const char* target, fuse_ino_t parent, const char* name) {
  Node* p = inodes_.Find(parent);
  if (!p) return (void)fuse_reply_err(req, ESTALE);
  TreeOf(p).Symlink(req, target, p, name);
}

void Daemon::OpReadlink(fuse_req_t req, fuse_ino_t ino) {
  Node* n = inodes_.Find(ino);
  if (!n) return (void)fuse_reply_err(req, ESTALE);
  TreeOf(n).Readlink(req, n);
}

void Daemon::OpLink(fuse_req_t req, fuse_ino_t ino, fuse_ino_t newparent, const char* newname) {
  Node* n = inodes_.Find(ino);
  if (!n) return (void)fuse_reply_err(req, ESTALE);
  Node* q = inodes_.Find(newparent);
  if (!q) return (void)fuse_reply_err(req, ESTALE);
  TreeOf(n).Link(req, n, q, newname);
}

void Daemon::OpUnlink(fuse_req_t req, fuse_ino_t parent, const char* name) {
  Node* p = inodes_.Find(parent);
  if (!p) return (void)fuse_reply_err(req, ESTALE);
  TreeOf(p).Unlink(req, p, name);
}

void Daemon::OpRmdir(fuse_req_t req, fuse_ino_t parent, const char* name) {
  Node* p = inodes_.Find(parent);
  if (!p) return (void)fuse_reply_err(req, ESTALE);
  TreeOf(p).Rmdir(req, p, name);
}

void Daemon::OpRename(fuse_req_t req, fuse_ino_t parent, const char* name, fuse_ino_t newparent,
                      const char* newname, unsigned int flags) {
  Node* p = inodes_.Find(parent);
  if (!p) return (void)fuse_reply_err(req, ESTALE);
  Node* q = inodes_.Find(newparent);
  if (!q) return (void)fuse_reply_err(req, ESTALE);
  TreeOf(p).Rename(req, p, name, q, newname, flags);
}

void Daemon::OpStatfs(fuse_req_t req, fuse_ino_t) { local_->Statfs(req); }

void Daemon::OpGetxattr(fuse_req_t req, fuse_ino_t ino, const char* name, size_t size) {
  Node* n = inodes_.Find(ino);
  if (!n) return (void)fuse_reply_err(req, ESTALE);
  TreeOf(n).Getxattr(req, n, name, size);
}

void Daemon::OpListxattr(fuse_req_t req, fuse_ino_t ino, size_t size) {
  Node* n = inodes_.Find(ino);
  if (!n) return (void)fuse_reply_err(req, ESTALE);
  TreeOf(n).Listxattr(req, n, size);
}

void Daemon::OpSetxattr(fuse_req_t req, fuse_ino_t ino, const char* name, const char* value, size_t size, int flags) {
  Node* n = inodes_.Find(ino);
  if (!n) return (void)fuse_reply_err(req, ESTALE);
  TreeOf(n).Setxattr(req, n, name, value, size, flags);
}

void Daemon::OpRemovexattr(fuse_req_t req, fuse_ino_t ino, const char* name) {
  Node* n = inodes_.Find(ino);
  if (!n) return (void)fuse_reply_err(req, ESTALE);
  TreeOf(n).Removexattr(req, n, name);
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
    o.fallocate = [](fuse_req_t r, fuse_ino_t i, int m, off_t o, off_t l, fuse_file_info* f) {
      Self(r)->OpFallocate(r, i, m, o, l, f);
    };
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
  if (!options_.foreground && store_) store_->PrepareFork();  // its checkpointer's thread
  if (!options_.foreground && !Daemonize(cache_lock_ ? &*cache_lock_ : nullptr)) {
    fuse_session_unmount(se_);
    fuse_session_destroy(se_);
    return 1;
  }
  if (!options_.foreground && flash_) flash_->RecordLockPid();
  // After Daemonize: a thread does not survive the fork.
  notifier_ = std::make_unique<InvalNotifier>(se_);
  passthrough_->SetNotifier(notifier_.get());
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
  notifier_->Stop();  // before the session goes; later invalidations are dropped
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

}  // namespace ghost
