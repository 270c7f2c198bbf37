// OriginTree: HTTP origins as directories (their HTML listings), and the read path every
// cached or streamed body goes through (origin_tree.cc, DESIGN §3.4): on open the cache
// manager picks memory, the disk cache or the network; a network read streams to the reader
// while it arrives and then fills the cache through the write-back; stale copies are
// revalidated; an unreachable origin serves what the cache holds.
//
// The open files of the read path (Handle) live here, keyed by file handle: the Maildir tree
// (fs/mail_tree.h) and the shared store (fs/store_tree.h) open bodies through the same path
// and hand their handles to it (AddHandle, ReadHandle, ReleaseHandle).
//
// Thread-safety: the daemon's one event-loop thread.
#ifndef GHOST_FS_ORIGIN_TREE_H_
#define GHOST_FS_ORIGIN_TREE_H_

#include <fuse_lowlevel.h>
#include <sys/stat.h>

#include <ctime>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "common/cache/body_file.h"
#include "common/cache/cache_store.h"
#include "common/http/autoindex.h"
#include "common/http/http_fetcher.h"
#include "fs/body_fd_cache.h"
#include "fs/inode_table.h"
#include "fs/tree.h"
#include "fs/write_back.h"

namespace ghost {

// How much of a cached body an open reads ahead (the largest FUSE read request).
constexpr Bytes kPrefetchBytes = 1 << 20;

inline std::int64_t UnixNow() { return static_cast<std::int64_t>(std::time(nullptr)); }

// A directory listing of an origin, as parsed from its HTML index.
struct Listing {
  std::vector<DirEntry> entries;
  TimePoint expires{};
  bool from_saved = false;  // loaded from the cache (possibly stale)
  // kPage: the directory URL answered with an ordinary page (shown as kDirectoryPageName);
  // entries are the names it links to, not the whole directory (others are asked of the origin).
  ListingKind kind = ListingKind::kAutoindex;
};

// What a HEAD told of one name in a directory that has no complete listing (OriginProbe).
struct Probe {
  std::optional<DirEntry> entry;  // nullopt: the origin has no such name
  TimePoint expires{};
};

// An object being fetched from an origin: a window of the bytes so far, and the reads waiting
// for more. The window holds bytes [base, base + data.size()); an origin stream keeps at most
// kStreamWindow bytes no reader has passed (the fetch is paused while that many wait), and
// drops the passed ones once they are as many as the rest (so data is at most twice
// kStreamWindow long), so a body larger than memory streams through (DESIGN §4).
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
  bool validating = false;  // a revalidation's fetch (conditional): never joined by another open
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

// Which version of a body an origin inode's page cache holds, and how many cached-mode
// handles read it: handles of another version read with direct_io, so the kernel's pages
// (and its idea of the size) never mix two versions (fs/origin_tree.cc).
struct PageVersion {
  std::string version;
  int opens = 0;
  TimePoint since{};  // when it became the inode's version
  bool pages_valid = false;  // a cached open of it dropped the older pages (keep_cache off)
  std::optional<Bytes> size;  // its size, if known
};

// The start of a cached body, read when it is opened so that the first READ finds it in
// memory (or waits less): the read overlaps the open's reply and the kernel's next request.
struct Prefetch {
  std::string data;  // bytes [0, data.size()) once done
  bool done = false;
  bool ok = false;
  std::vector<std::function<void()>> waiters;  // reads that came before it finished
  // The file of a handle released before the read finished, kept open until it has: the
  // FileIo may hand the read to the kernel only later, and by then a closed number may name
  // another file or a socket (common/base/file_io.h).
  BodyFile file;
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
  BodyFile file;                  // the cached body read from the disk (closed with the handle)
  std::string key;                // origin: the URL
  // Where this open reads from: kWriteQueue (the queued fill, `body`; the disk once it is
  // written), kDisk or kStale (`file`), or kNetwork (`stream`).
  ReadSource source = ReadSource::kDisk;
  bool tmp = false;               // mail: a tmp/ file, held in memory by the Maildir tree
  std::shared_ptr<Stream> stream; // origin, network source
  std::shared_ptr<Prefetch> prefetch;  // origin from the disk, until reads pass its end
  // Source kWriteQueue: the queued fill this handle reads (one version, kept until release).
  std::shared_ptr<const std::string> body;
  bool page_counted = false;  // counted in page_versions_[ino].opens
};

class OriginTree final : public Tree {
 public:
  // `ctx` is borrowed: its references must outlive the tree.
  explicit OriginTree(TreeContext ctx);
  ~OriginTree() override;
  OriginTree(const OriginTree&) = delete;
  OriginTree& operator=(const OriginTree&) = delete;

  // ---- Tree: nodes of NodeKind::kOriginDir and kOriginFile ----
  void Lookup(fuse_req_t req, Node* parent, const char* name) override;
  void Getattr(fuse_req_t req, Node* n) override;
  void Opendir(fuse_req_t req, Node* n, fuse_file_info* fi) override;
  void Readdir(fuse_req_t req, Node* n, size_t size, off_t off, fuse_file_info* fi) override;
  // Read-only: EROFS for an open for writing. A cached copy that leaves the cache between the
  // decision and the open is fetched again from the origin (never EIO: OpenObject).
  void Open(fuse_req_t req, Node* n, fuse_file_info* fi) override;
  void Read(fuse_req_t req, Node* n, size_t size, off_t off, fuse_file_info* fi) override;
  void Release(fuse_req_t req, Node* n, fuse_file_info* fi) override;
  void Getxattr(fuse_req_t req, Node* n, const char* name, size_t size) override;
  void Listxattr(fuse_req_t req, Node* n, size_t size) override;

  // The kernel's copy of `url`'s attributes and pages, if it was given a long timeout, is
  // dropped (through the notifier thread): the object changed or is about to (a fill of it was
  // queued). The store's changes call this; so does the shared store when it queues a fill.
  void DropKernelCopy(const std::string& url);

  // ---- the read path, shared with the Maildir tree and the shared store ----
  // Registers an open body and returns its file handle.
  std::uint64_t AddHandle(Handle h);
  Handle* FindHandle(std::uint64_t fh);
  // Reads from the open body `fh` (EBADF if there is none).
  void ReadHandle(fuse_req_t req, std::uint64_t fh, size_t size, off_t off);
  // Closes the open body `fh` (no reply).
  void ReleaseHandle(std::uint64_t fh);
  // Forgets `fh`, which reads no body (a .ghost/fill handle).
  void DropHandle(std::uint64_t fh) { handles_.erase(fh); }
  // Fetches running, by key (the URL), while they fetch.
  std::map<std::string, std::shared_ptr<Stream>>& streams() { return streams_; }
  // Starts reading the first piece of h's cached body (of `size` bytes) into h.prefetch.
  void StartPrefetch(Handle& h, Bytes size);
  // Answers the reads of `st` that its data (or its end) can answer.
  void ServeStream(Stream& st);

  // The URL of an origin node.
  std::string OriginUrl(const Node* n) const;
  // The cache entry of `url` if it is that URL's file (not a proxy-only entry), else nullptr.
  const CacheEntry* MountEntry(const std::string& url) const;

 private:
  // Open with the decision taken again: `copy_gone` when the cached copy the first decision
  // chose left the cache before the open could read it (evicted by the cap, or dropped as
  // damaged): the copy is then ignored and the object fetched again from the origin, as a miss.
  void OpenObject(fuse_req_t req, Node* n, fuse_file_info* fi, bool copy_gone);
  // `fh` is h's file handle (to find it again after waiting).
  void OriginRead(fuse_req_t req, Handle& h, size_t size, off_t off, std::uint64_t fh);
  void OriginRelease(Handle& h);
  bool PageCacheMayServe(fuse_ino_t ino, const std::string& version, std::optional<Bytes> size,
                         fuse_file_info* info);
  // While page-cache (cached-mode) readers of a version of `ino` are open, an open gets that
  // version too, in cached mode (DESIGN §4.1): true when it was answered so.
  bool OpenPinned(fuse_req_t req, fuse_ino_t ino, fuse_file_info info);
  void DropUnopenableNames(const std::string& url, std::vector<DirEntry>* entries);
  // A read far beyond what has arrived: answered from a range request (DESIGN §4).
  void ReadAhead(fuse_req_t req, std::shared_ptr<Stream> st, Bytes offset, std::size_t size);
  // Drops what every reader has passed, pauses or resumes the fetch by the window, and feeds
  // the store fill of a big body.
  void TrimStream(Stream& st);
  void StreamToFill(const std::shared_ptr<Stream>& st, std::string_view data);
  void FinishStreamFill(const std::shared_ptr<Stream>& st, bool complete);
  std::optional<std::string> OriginXattr(Node* n, const std::string& name);
  std::optional<std::int64_t> FileMtime(const DirEntry* listed, const CacheEntry* cached) const;
  const DirEntry* ListedEntry(const Node* n) const;  // from the listing in memory, if any
  // Loads a directory's listing (saved, fresh, or fetched) and calls `then` with it.
  void WithListing(int origin, const std::string& dir, std::function<void(Result<const Listing*>)> then);
  // Names a listing does not settle (an ordinary page's directory, or one that cannot be
  // listed): asked of the origin with a HEAD, remembered in probes_.
  bool OriginMustProbe(const Result<const Listing*>& l, const std::string& name) const;
  void OriginProbe(int origin, const std::string& dir, const std::string& name,
                   std::function<void(Result<DirEntry>)> then);
  void OriginReplyProbed(fuse_req_t req, int origin, const std::string& dir, Result<DirEntry> e, fuse_ino_t getattr_ino);
  const DirEntry* ProbedEntry(int origin, const std::string& dir, const std::string& name) const;
  void OriginDirXattr(fuse_req_t req, Node* n, const std::string& name, size_t size);

  TreeContext ctx_;
  std::map<std::uint64_t, Handle> handles_;                 // open bodies, by file handle
  std::map<std::string, Listing> listings_;                 // by directory URL
  std::map<std::string, std::map<std::string, Probe>> probes_;  // by directory URL, name
  std::map<std::string, std::shared_ptr<Stream>> streams_;  // by URL, while fetching
  std::map<fuse_ino_t, PageVersion> page_versions_;         // origin inodes read in cached mode
  std::set<std::string> long_names_logged_;                 // listing URLs with names > NAME_MAX
  // The entry/attribute timeout for a cached file: long (up to a minute, not past its expiry)
  // while its copy is fresh and no fill of it is queued, remembered in long_timeouts_ so that
  // a change invalidates it; else the 1 s of every other reply.
  double CachedTimeout(const std::string& url, fuse_ino_t ino, const CacheEntry* cached);
  // The stat of an origin file as the kernel is told it, which Node::kernel_size remembers.
  struct stat KernelStat(fuse_ino_t ino, Bytes size, std::optional<std::int64_t> mtime);
  // The size of `url` (inode `ino`) to tell the kernel: while cached-mode (page cache) opens of
  // a version are open, theirs (the kernel ends their reads at the inode's size: a newer
  // version's size would cut them short; a newer version's opens read with direct_io, to
  // EOF); else a running fetch's (the newest version: the one an open now reads), else a
  // queued fill's, else the cached copy's, else `listed`.
  std::optional<Bytes> CurrentSize(const std::string& url, fuse_ino_t ino, const CacheEntry* cached,
                                   std::optional<Bytes> listed) const;
  std::unordered_map<std::string, fuse_ino_t> long_timeouts_;  // url -> inode
  BodyFdCache bodies_;  // body files of recent opens, kept open (dropped when they change)
};

}  // namespace ghost

#endif  // GHOST_FS_ORIGIN_TREE_H_
