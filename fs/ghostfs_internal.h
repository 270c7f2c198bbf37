// The ghostfs daemon: the event loop, the FUSE operation table and the control socket
// (ghostfs.cc: loop, FUSE table, root; control_ops.cc: the control socket's operations). The
// namespace is in trees behind one interface (fs/tree.h): origins and the read path
// (fs/origin_tree.h), Maildirs (fs/mail_tree.h), the shared store .ghost/ (fs/store_tree.h)
// and local/ (fs/local_tree.h); each FUSE operation finds its node and hands it to the node's
// tree. Nothing outside fs/ may include this.
//
// Thread-safety: everything runs on the daemon's one event-loop thread.
#ifndef GHOST_FS_GHOSTFS_INTERNAL_H_
#define GHOST_FS_GHOSTFS_INTERNAL_H_

#include <fuse_lowlevel.h>
#include <sys/stat.h>

#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "common/base/clock.h"
#include "common/base/file_io.h"
#include "common/base/pid_lock.h"
#include "common/base/uring_file_io.h"
#include "common/cache/cache_manager.h"
#include "common/cache/cache_store.h"
#include "common/config/config.h"
#include "common/control/control.h"
#include "common/power/hardware.h"
#include "common/http/http_fetcher.h"
#include "common/power/machine.h"
#include "common/http/origin_health.h"
#include "common/cache/shadow_baseline.h"
#include "fs/fuse_passthrough.h"
#include "fs/ghostfs.h"
#include "fs/inode_table.h"
#include "fs/inval_notifier.h"
#include "fs/tree.h"
#include "fs/write_back.h"

struct event;
struct event_base;

namespace ghost {

class LocalFlashLog;  // fs/flash_local.h
class LocalTree;   // fs/local_tree.h
class MailTree;    // fs/mail_tree.h
class OriginTree;  // fs/origin_tree.h
class StoreTree;   // fs/store_tree.h
class RootTree;    // ghostfs.cc

// The page-cache model's size: ghostsim's default (SimOptions::page_cache, CacheManager).
constexpr Bytes kPageCacheModelBytes = 8 * 1024 * 1024;

class Daemon final : public GhostFs {
 public:
  explicit Daemon(const GhostfsOptions& options);
  ~Daemon() override;
  Status Init();
  int Run() override;

  // ---- FUSE operations (one handler per op; every request gets exactly one reply) ----
  void OpLookup(fuse_req_t req, fuse_ino_t parent, const char* name);
  void OpForget(fuse_ino_t ino, uint64_t nlookup);
  void OpGetattr(fuse_req_t req, fuse_ino_t ino);
  void OpSetattr(fuse_req_t req, fuse_ino_t ino, struct stat* attr, int to_set, fuse_file_info* fi);
  void OpOpendir(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi);
  void OpReaddir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, fuse_file_info* fi);
  void OpReleasedir(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi);
  void OpOpen(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi);
  void OpCreate(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t mode, fuse_file_info* fi);
  void OpRead(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, fuse_file_info* fi);
  void OpWrite(fuse_req_t req, fuse_ino_t ino, const char* buf, size_t size, off_t off, fuse_file_info* fi);
  void OpFlush(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi);
  void OpRelease(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi);
  void OpFsync(fuse_req_t req, fuse_ino_t ino, int datasync, fuse_file_info* fi);
  void OpFallocate(fuse_req_t req, fuse_ino_t ino, int mode, off_t off, off_t len, fuse_file_info* fi);
  void OpMkdir(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t mode);
  void OpUnlink(fuse_req_t req, fuse_ino_t parent, const char* name);
  void OpRmdir(fuse_req_t req, fuse_ino_t parent, const char* name);
  void OpRename(fuse_req_t req, fuse_ino_t parent, const char* name, fuse_ino_t newparent,
                const char* newname, unsigned int flags);
  void OpMknod(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t mode, dev_t rdev);
  void OpSymlink(fuse_req_t req, const char* target, fuse_ino_t parent, const char* name);
  void OpReadlink(fuse_req_t req, fuse_ino_t ino);
  void OpLink(fuse_req_t req, fuse_ino_t ino, fuse_ino_t newparent, const char* newname);
  void OpSetxattr(fuse_req_t req, fuse_ino_t ino, const char* name, const char* value, size_t size, int flags);
  void OpGetxattr(fuse_req_t req, fuse_ino_t ino, const char* name, size_t size);
  void OpListxattr(fuse_req_t req, fuse_ino_t ino, size_t size);
  void OpRemovexattr(fuse_req_t req, fuse_ino_t ino, const char* name);
  void OpStatfs(fuse_req_t req, fuse_ino_t ino);

 private:
  // ---- set-up ----
  Status LoadMachine();
  // --devices auto: finds the real devices and meters and binds them (fs/devices.cc).
  void StartHardware();
  Status OpenCache();
  // The trees and what they share (after OpenCache).
  Status MakeTrees();
  TreeContext Context();
  Status StartControl();
  void OnFuseReadable();
  void Shutdown();

  // The tree of node `n` (by its kind).
  Tree& TreeOf(const Node* n);

  // ---- control socket (control_ops.cc) ----
  // Dispatches a checked request (common/control/protocol.h) through the ops table to one of
  // the Control* handlers below; each replies exactly once.
  void HandleControl(const ControlRequest& request, ControlServer::Reply reply);
  void ControlStatus(const ControlRequest& request, ControlServer::Reply reply);
  void ControlHint(const ControlRequest& request, ControlServer::Reply reply);
  void ControlKnob(const ControlRequest& request, ControlServer::Reply reply);
  void ControlDevices(const ControlRequest& request, ControlServer::Reply reply);
  void ControlStats(const ControlRequest& request, ControlServer::Reply reply);
  void ControlFlush(const ControlRequest& request, ControlServer::Reply reply);
  void ControlSync(const ControlRequest& request, ControlServer::Reply reply);
  void ControlDropCaches(const ControlRequest& request, ControlServer::Reply reply);
  // nap: a shaped download's nap on the emulated card (DESIGN §3.6; Device::TryShapingNap).
  void ControlNap(const ControlRequest& request, ControlServer::Reply reply);
  // lookup, store, refresh, invalidate, transfer, served: the shared store (store_tree.cc).
  void ControlStore(const ControlRequest& request, ControlServer::Reply reply);
  nlohmann::json DevicesJson() const;
  nlohmann::json StatsJson() const;
  void PublishModes();
  // "stats" events after the cache or the activity changed (a fill committed, a read): at
  // most one per kStatsEventInterval, the first at once and the last after the interval, so
  // a fill storm does not build and push one stats document per fill (it was 14 % of the
  // daemon's CPU per miss). PublishModes (a knob or mode change) still publishes at once.
  void PublishStats();
  void PublishStatsNow();
  static constexpr Duration kStatsEventInterval = std::chrono::milliseconds(100);
  TimerId stats_timer_ = kNoTimer;
  std::optional<TimePoint> stats_published_;
  // The cache index's unsaved access times and metadata reach sqlite within the store's
  // access_max_lag: this one-shot timer is armed when the store gets its first unsaved change
  // (CacheStore::SetUnsavedListener) and queues an index save through the write queue (so a
  // sleeping disk is not woken for it). None while nothing is unsaved: an idle daemon does
  // not wake for it.
  void ScheduleIndexSave();
  TimerId index_timer_ = kNoTimer;

  GhostfsOptions options_;
  event_base* base_ = nullptr;
  std::unique_ptr<RealClock> clock_;
  std::unique_ptr<Machine> machine_;
  // --devices auto (fs/devices.cc): the real devices behind machine_'s; null with "none".
  std::unique_ptr<Hardware> hardware_;
  // Borrowed from machine_ (set by LoadMachine, valid while machine_ lives).
  PowerManager* pm_ = nullptr;
  DeviceId disk_id_ = -1, net_id_ = -1;
  CostModel* cost_ = nullptr;
  // Decides every read (the trees ask it) and keeps the page-cache model; borrows machine_.
  std::unique_ptr<CacheManager> manager_;
  std::unique_ptr<FileIo> io_;
  std::unique_ptr<CacheStore> store_;
  std::unique_ptr<WriteBack> write_back_;
  std::unique_ptr<LocalFlashLog> flash_;  // --flash-log; null without (fs/flash_local.h)
  Status OpenFlashLog();                  // flash_, from the options (before MakeTrees)
  std::unique_ptr<HttpFetcher> http_;
  std::unique_ptr<ControlServer> control_;
  std::optional<PidLock> cache_lock_;  // CACHE/lock, held while this daemon serves
  std::unique_ptr<FusePassthrough> passthrough_;  // always set after Init; kOff unless attached
  InodeTable inodes_;
  ReadLog reads_;
  fuse_session* se_ = nullptr;
  std::unique_ptr<InvalNotifier> notifier_;  // kernel cache invalidations (fs/inval_notifier.h)
  event* fuse_ev_ = nullptr;
  fuse_buf fuse_buf_{};  // reused for every request
  std::vector<event*> signal_evs_;
  TimePoint started_{};
  std::uint64_t next_fh_ = 1;
  bool shutting_down_ = false;  // Shutdown ran: the loop ends once the queue is flushed
  event* shutdown_watch_ = nullptr;  // every 10 s of an unmount's flush: a line saying what it waits for
  TimePoint shutdown_start_{};
  void ReportShutdownProgress();
  std::string mount_path_;      // canonical, for paths handed out
  // The trees (each borrows the context above; destroyed before it).
  std::unique_ptr<OriginTree> origin_;  // HTTP origins and the read path
  std::unique_ptr<StoreTree> store_tree_;
  std::unique_ptr<MailTree> mail_;
  std::unique_ptr<LocalTree> local_;
  std::unique_ptr<RootTree> root_;
  std::unique_ptr<OriginHealth> health_;    // HTTP origins up/down, failures (fs/observability.cc)
  std::unique_ptr<ShadowBaseline> shadow_;  // the static cache beside this one; null: no profile
  void StartObserving();                    // the two above, the log's hooks (observability.cc)
  nlohmann::json EnergyModelJson() const;    // stats "energy_model" (observability.cc)
  nlohmann::json KeptAsideJson() const;      // stats "kept_aside" (observability.cc)
  void BaselineWrite(Bytes size);            // to the static baseline, if any (observability.cc)
  void BaselineFetch(Bytes size);
  // An IMAP origin's connection attempt, to origin health (observability.cc).
  void ImapOutcome(const std::string& url, bool answered, const Status& status);
};

}  // namespace ghost

#endif  // GHOST_FS_GHOSTFS_INTERNAL_H_
