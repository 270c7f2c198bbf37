// The ghostfs daemon's internals, shared by its source files (ghostfs.cc: loop, FUSE table,
// root; local/ is its own class, fs/local_tree.h, reached only through local_; origin_tree.cc: HTTP origins and the read path; control_ops.cc: the
// control socket's operations). Nothing outside fs/ may include this.
//
// Thread-safety: everything runs on the daemon's one event-loop thread.
#ifndef GHOST_FS_GHOSTFS_INTERNAL_H_
#define GHOST_FS_GHOSTFS_INTERNAL_H_

#include <fuse_lowlevel.h>
#include <sys/stat.h>

#include <ctime>
#include <deque>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "common/http/autoindex.h"
#include "common/cache/cache_manager.h"
#include "common/cache/cache_store.h"
#include "common/base/clock.h"
#include "common/config/config.h"
#include "common/base/pid_lock.h"
#include "common/control/control.h"
#include "common/power/cost_model.h"
#include "common/power/device.h"
#include "common/power/machine.h"
#include "common/base/file_io.h"
#include "common/http/http_fetcher.h"
#include "common/http/http_freshness.h"
#include "common/http/origin_health.h"
#include "common/cache/shadow_baseline.h"
#include "common/power/power_manager.h"
#include "common/power/profile.h"
#include "common/base/uring_file_io.h"
#include "common/cache/write_queue.h"
#include "fs/fuse_passthrough.h"
#include "fs/ghostfs.h"
#include "fs/inode_table.h"
#include "fs/local_tree.h"

struct event;
struct event_base;

namespace ghost {

class MailTree;  // fs/mail_tree.h

// readdir entries whose inode the kernel must look up (libfuse passes 0xffffffff as "unknown").
inline constexpr fuse_ino_t kUnknownIno = 0xffffffff;
// How much of a cached body an open reads ahead (the largest FUSE read request).
constexpr Bytes kPrefetchBytes = 1 << 20;
// What one index row update costs the disk in the write queue: one sqlite page.
constexpr Bytes kIndexRowBytes = 4096;
// .ghost/ entries change only through the control socket: short attribute timeouts.
constexpr double kStoreAttrTimeout = 0.0;

inline std::int64_t UnixNow() { return static_cast<std::int64_t>(std::time(nullptr)); }

// What a read of an origin file last did, for the user.ghost.* attributes.
struct Decision {
  std::string source;     // memory | disk | network | stale
  nlohmann::json cost;    // the estimates behind it
};

// A body the proxy is handing over through .ghost/fill/<token> (fs/store_tree.cc).
struct StoreFill {
  std::string key;
  CacheEntry meta;
  std::string data;
  bool handed_over = false;
};

// A proxy's fetch that the emulated card carries (the "transfer" control op, store_tree.cc).
struct ProxyTransfer {
  bool data_sent = false;
  int data_pending = 0;  // "data" I/Os the card has not finished
  bool ended = false;    // "end" came: the transfer closes once the data is through
};

// The page-cache model's size: ghostsim's default (SimOptions::page_cache, CacheManager).
constexpr Bytes kPageCacheModelBytes = 8 * 1024 * 1024;

struct StoreStats {
  std::uint64_t lookups = 0, hits = 0, network_preferred = 0, fills = 0, refreshes = 0;
  std::uint64_t memory_hits = 0;  // reads a client served from its own RAM copy ("served")
};

// A directory listing of an origin, as parsed from its HTML index.
struct Listing {
  std::vector<DirEntry> entries;
  TimePoint expires{};
  bool from_saved = false;  // loaded from the cache (possibly stale)
};

// An object being fetched from an origin: a window of the bytes so far, and the reads waiting
// for more. The window holds bytes [base, base + data.size()); an origin stream keeps it at
// most kStreamWindow long (bytes every open reader has passed are dropped, and the fetch is
// paused while the window is full), so a body larger than memory streams through (DESIGN §4).
struct Stream {
  std::string key;       // cache key (the URL)
  std::string data;
  Bytes base = 0;        // offset of data[0]
  Bytes received() const { return base + data.size(); }
  std::optional<Bytes> size;  // from Content-Length, once known
  bool done = false;
  Status status;         // set when done
  bool emulated_ready = false;  // the emulated network device finished its part
  bool no_body = false;   // a 304 or an error status: nothing to stream or cache
  bool replaces = false;  // a changed object on revalidation: the fill replaces the copy
  FetchId fetch = 0;
  CacheEntry meta;       // validators and freshness from the reply head
  bool storable = false;
  struct Waiter {
    fuse_req_t req;
    Bytes offset;
    std::size_t size;
    std::uint64_t fh = 0;  // the handle reading (its position moves when answered)
  };
  std::deque<Waiter> waiters;
  int opens = 0;
  // Pieces fetched with range requests for reads far ahead of the stream (by first byte).
  std::map<Bytes, std::string> ranges;
  // Origin streams: how far each open handle (by fh) has read; the window never drops bytes
  // a reader has not passed. A reader behind the window gets a range request.
  std::map<std::uint64_t, Bytes> readers;
  bool windowed = false;  // data is trimmed to the window (origin streams; mail keeps it whole)
  bool paused = false;    // the fetch is paused until readers (or the fill) catch up
  // The cache fill, once the body is too big to wait in the write queue: written to the
  // store as it arrives (fill_id), or abandoned (fill_failed); fill_in_flight bytes are with
  // the disk (the fetch pauses above kStreamWindow of them).
  std::optional<FillId> fill_id;
  bool fill_failed = false;
  Bytes fill_in_flight = 0;
  std::string fill_pending;  // bytes for the store fill not handed over yet (< kFillPiece)
  bool fill_wanted = false;  // storable, and not a copy of what the cache already has
  std::string small_body;    // the whole body while it may still go through the write queue
  bool small = true;         // small_body holds every byte so far
};

// Bytes of an origin body held in memory per stream, and the largest body that waits whole
// in the write queue (bigger ones are written to the store as they arrive).
constexpr Bytes kStreamWindow = 8 * 1024 * 1024;
constexpr Bytes kMaxQueuedFill = 4 * 1024 * 1024;
constexpr Bytes kFillPiece = 1024 * 1024;

// A fill waiting in the write queue: the one version of the body that readers opening it now
// get. A reader keeps its version even when a newer fill of the key is queued after it.
struct QueuedBody {
  std::shared_ptr<const std::string> data;
  std::uint64_t version = 0;
};

// Which version of a body an origin inode's page cache holds, and how many cached-mode
// handles read it: handles of another version read with direct_io, so the kernel's pages
// (and its idea of the size) never mix two versions (fs/origin_tree.cc).
struct PageVersion {
  std::string version;
  int opens = 0;
  TimePoint since{};  // when it became the inode's version
  bool pages_valid = false;  // a cached open of it dropped the older pages (keep_cache off)
};

// The start of a cached body, read when it is opened so that the first READ finds it in
// memory (or waits less): the read overlaps the open's reply and the kernel's next request.
struct Prefetch {
  std::string data;  // bytes [0, data.size()) once done
  bool done = false;
  bool ok = false;
  std::vector<std::function<void()>> waiters;  // reads that came before it finished
};

// How the kernel reads an open origin file (fs/fuse_passthrough.h: an inode is in cached or
// passthrough mode, and while it has passthrough opens every open of it must carry the flag).
enum class IoMode {
  kCached,        // READ requests, the kernel's page cache in front (keep_cache)
  kDirect,        // READ requests for every read (direct_io)
  kPassthrough,   // no READ requests: the kernel reads the body file itself
  kDirectJoined,  // kDirect, sent with the inode's backing id: passthrough opens were active
};

// One open file.
struct Handle {
  NodeKind kind = NodeKind::kLocal;
  fuse_ino_t ino = 0;  // origin: the node (for the passthrough counts)
  IoMode io_mode = IoMode::kCached;
  int fd = -1;                    // origin: the cached body (local/ opens live in LocalTree)
  std::string key;                // origin: the URL
  std::string source;             // origin: where this open reads from
  std::shared_ptr<Stream> stream; // origin, network source
  std::shared_ptr<Prefetch> prefetch;  // origin from the disk, until reads pass its end
  // Source "memory": the queued fill this handle reads (one version, kept until release).
  std::shared_ptr<const std::string> body;
  // The size of the body file `fd` (origin from the disk), known once fd_size_known.
  Bytes fd_size = 0;
  bool fd_size_known = false;
  bool page_counted = false;  // counted in page_versions_[ino].opens
};

class Daemon final : public GhostFs {
  friend class MailTree;  // IMAP origins reuse the entry, listing and read helpers

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
  Status OpenCache();
  Status StartControl();
  void OnFuseReadable();
  void Shutdown();

  // ---- attributes ----
  struct stat DirStat(fuse_ino_t ino) const;
  static fuse_entry_param EntryFor(Node* n, const struct stat& st);
  void ReplyEntry(fuse_req_t req, Node* n, const struct stat& st);
  static bool BadName(const char* name);
  // The errno for a create-like op on `parent`, which is not in local/ (a read-only tree).
  static int NotWritable(const Node* parent);

  // The write queue's writer. Batches are applied one after another, in order.
  // Hands `body`, stored whole under cache key `key`, to the write queue as a fill (readers
  // see it at once; the disk gets it with the next batch). Saved listings and mailbox indexes.
  void QueueWholeFill(const std::string& key, std::string body, const std::string& content_type);
  // Origin streams (origin_tree.cc): drops what every reader has passed, pauses or resumes
  // the fetch by the window, and feeds the store fill of a big body.
  void TrimStream(Stream& st);
  void StreamToFill(const std::shared_ptr<Stream>& st, std::string_view data);
  void FinishStreamFill(const std::shared_ptr<Stream>& st, bool complete);
  void WriteBatch(std::vector<WriteRecord> batch, std::function<void()> done);
  void ApplyBatch(std::vector<WriteRecord> batch, std::function<void()> done);

  // ---- policy (ghostfs.cc; GhostfsOptions::policy) ----
 public:
  // Hands `body`, stored whole under cache key `key` with `meta` (its size is set here), to
  // the write queue as a fill: readers see it at once (the manager's kWriteQueue holder), the
  // disk gets it with the next batch (DESIGN §3.5). The body is kept once, in queued_bodies_:
  // readers that open it share that version; the write queue's record carries only the length.
  void QueueFill(const std::string& key, CacheEntry meta, std::string body);
  // Transfer hints to the network module (DESIGN §3.3): only the adaptive policy discloses its
  // transfers, as in ghostsim; under static the card's default policy sees only its I/O.
  void DiscloseTransferBegin();
  void DiscloseTransferEnd();

 private:
  // ---- origins (origin_tree.cc) ----
  void OriginLookup(fuse_req_t req, Node* parent, const char* name);
  void OriginGetattr(fuse_req_t req, Node* n);
  void OriginReaddir(fuse_req_t req, Node* n, size_t size, off_t off);
  void OriginOpen(fuse_req_t req, Node* n, fuse_file_info* fi);
  // `fh` is h's file handle (to find it again after waiting).
  void OriginRead(fuse_req_t req, Handle& h, size_t size, off_t off, std::uint64_t fh);
  void OriginRelease(Handle& h);
  bool PageCacheMayServe(fuse_ino_t ino, const std::string& version, fuse_file_info* info);
  void DropUnopenableNames(const std::string& url, std::vector<DirEntry>* entries);
  // Starts reading the first piece of h's cached body (of `size` bytes) into h.prefetch.
  void StartPrefetch(Handle& h, Bytes size);
  // Answers the reads of `st` that its data (or its end) can answer.
  void ServeStream(Stream& st);
  // A read far beyond what has arrived: answered from a range request (DESIGN §4).
  void ReadAhead(fuse_req_t req, std::shared_ptr<Stream> st, Bytes offset, std::size_t size);
  std::optional<std::string> OriginXattr(Node* n, const std::string& name);
  std::string OriginUrl(const Node* n) const;
  // The cache entry of `url` if it is that URL's file (not a proxy-only entry), else nullptr.
  const CacheEntry* MountEntry(const std::string& url) const;
  // The estimates behind a cost-model choice, as user.ghost.cost and "lookup" show them.
  nlohmann::json CostJson(const Choice& c) const;
  std::optional<std::int64_t> FileMtime(const DirEntry* listed, const CacheEntry* cached) const;
  const DirEntry* ListedEntry(const Node* n) const;  // from the listing in memory, if any
  // Loads a directory's listing (saved, fresh, or fetched) and calls `then` with it.
  void WithListing(int origin, const std::string& dir, std::function<void(Result<const Listing*>)> then);
  void FillCommitted(const std::string& key);
  // A fill handed to the cache store finished (committed or not): runs what waited for it.
  void FillSettled(const std::string& key);
  // Runs `fn` now, or once the fill of `key` being written settles.
  void WhenFillSettles(const std::string& key, std::function<void()> fn);

  // ---- the shared store .ghost/ (store_tree.cc) ----
  std::string StoreName(const std::string& key) const;
  struct stat StoreStat(const Node* n) const;
  const std::string* StoreKey(const std::string& name) const;
  std::string StoreVersion(const std::string& key) const;
  void StoreLookup(fuse_req_t req, Node* parent, const char* name);
  void StoreGetattr(fuse_req_t req, Node* n);
  void StoreReaddir(fuse_req_t req, Node* n, size_t size, off_t off);
  void StoreOpen(fuse_req_t req, Node* n, fuse_file_info* fi);
  void StoreWrite(fuse_req_t req, Handle& h, const char* buf, size_t size, off_t off);
  void StoreHandOver(Handle& h);
  void StoreUnlink(fuse_req_t req, Node* parent, const char* name);
  void StoreControl(const std::string& op, const nlohmann::json& request, ControlServer::Reply reply);
  nlohmann::json StoreStatsJson() const;
  void StoreTransfer(const nlohmann::json& request, ControlServer::Reply reply);
  // Replies to a readdir with ".", ".." and `entries`, from offset `off` on.
  void ReplyDirEntries(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
                       const std::vector<std::pair<std::string, mode_t>>& entries);

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
  void ControlDropCaches(const ControlRequest& request, ControlServer::Reply reply);
  // lookup, store, refresh, invalidate, transfer, served: the shared store (store_tree.cc).
  void ControlStore(const ControlRequest& request, ControlServer::Reply reply);
  nlohmann::json DevicesJson() const;
  nlohmann::json StatsJson() const;
  void PublishModes();

 public:
  // State the control operations and origin tree reach.
  GhostfsOptions options_;
  event_base* base_ = nullptr;
  std::unique_ptr<RealClock> clock_;
  std::unique_ptr<Machine> machine_;
  // Borrowed from machine_ (set by LoadMachine, valid while machine_ lives).
  PowerManager* pm_ = nullptr;
  Device* disk_ = nullptr;
  Device* net_ = nullptr;
  DeviceId disk_id_ = -1, net_id_ = -1;
  CostModel* cost_ = nullptr;
  // Decides every read (origin_tree.cc, mail_tree.cc, store_tree.cc) and keeps the
  // page-cache model; borrows machine_.
  std::unique_ptr<CacheManager> manager_;
  std::unique_ptr<FileIo> io_;
  std::unique_ptr<CacheStore> store_;
  std::unique_ptr<WriteQueue> queue_;
  std::unique_ptr<HttpFetcher> http_;
  std::unique_ptr<ControlServer> control_;
  std::optional<PidLock> cache_lock_;  // CACHE/lock, held while this daemon serves
  std::unique_ptr<FusePassthrough> passthrough_;  // always set after Init; kOff unless attached
  InodeTable inodes_;
  fuse_session* se_ = nullptr;
  event* fuse_ev_ = nullptr;
  fuse_buf fuse_buf_{};  // reused for every request
  std::vector<event*> signal_evs_;
  std::unique_ptr<LocalTree> local_;  // local/ (fs/local_tree.h)
  TimePoint started_{};

  std::uint64_t next_fh_ = 1;
  std::map<std::uint64_t, Handle> handles_;
  std::map<std::string, Listing> listings_;               // by directory URL
  std::map<std::string, std::shared_ptr<Stream>> streams_;  // by URL, while fetching
  std::map<std::string, CacheEntry> pending_fills_;       // queued fills: their metadata
  std::map<std::string, QueuedBody> queued_bodies_;       // queued fills: their bodies
  std::uint64_t next_body_version_ = 1;
  std::map<fuse_ino_t, PageVersion> page_versions_;       // origin inodes read in cached mode
  std::set<std::string> long_names_logged_;               // listing URLs with names > NAME_MAX
  std::map<std::string, int> writing_fills_;              // fills being written, by key
  std::map<std::string, std::vector<std::function<void()>>> fill_waiters_;
  std::deque<std::pair<std::vector<WriteRecord>, std::function<void()>>> write_backlog_;
  bool writing_ = false;
  bool shutting_down_ = false;  // Shutdown ran: the loop ends once the queue is flushed
  std::map<fuse_ino_t, Decision> decisions_;
  std::map<std::string, int> requests_by_source_;
  std::uint64_t bytes_from_network_ = 0;
  std::uint64_t bytes_from_cache_ = 0;  // served by the daemon (passthrough reads are not seen)
  std::uint64_t fuse_reads_ = 0;        // READ requests that reached the daemon
  std::string mount_path_;                                // canonical, for paths handed out
  std::map<std::string, StoreFill> store_fills_;          // by token
  std::map<std::string, std::string> store_keys_;         // .ghost/objects name → key
  std::uint64_t next_store_token_ = 1;
  StoreStats store_stats_;
  std::map<std::uint64_t, ProxyTransfer> proxy_transfers_;  // by id
  std::uint64_t next_transfer_id_ = 1;
  bool objects_published_ = false;  // the store's changes go to the "objects" topic
  std::unique_ptr<MailTree> mail_;                        // IMAP origins (mail_tree.cc)
  std::unique_ptr<OriginHealth> health_;    // HTTP origins up/down, failures (fs/observability.cc)
  std::unique_ptr<ShadowBaseline> shadow_;  // the static cache beside this one; null: no profile
  void StartObserving();                    // the two above, the log's hooks (observability.cc)
  nlohmann::json EnergyModelJson() const;    // stats "energy_model" (observability.cc)
};

}  // namespace ghost

#endif  // GHOST_FS_GHOSTFS_INTERNAL_H_
