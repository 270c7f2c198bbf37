// HTTP origins: the namespace (listings as directories) and the read path (DESIGN §3.4):
// on open, the cost model picks the disk cache or the network; a network read streams to the
// reader while it arrives and then fills the cache through the write queue; stale copies are
// revalidated; an unreachable origin serves what the cache holds.
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <ctime>

#include "fs/origin_tree.h"

#include "common/base/file_io.h"
#include "common/config/config.h"
#include "common/http/http_freshness.h"
#include "common/http/origin_health.h"
#include "fs/fuse_passthrough.h"

namespace ghost {
namespace {

constexpr double kAttrTimeout = 1.0;
// The entry/attribute timeout of a cached file while its copy is fresh (its body cannot change
// without the store telling the tree, which then invalidates the kernel's copy).
constexpr double kFreshAttrTimeout = 60.0;


// Percent-encodes one path component for a URL (RFC 3986 unreserved characters stay).
std::string EncodeComponent(const std::string& s) {
  static const char* kHex = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : s) {
    if (std::isalnum(c) || c == '-' || c == '.' || c == '_' || c == '~') {
      out.push_back(static_cast<char>(c));
    } else {
      out.push_back('%');
      out.push_back(kHex[c >> 4]);
      out.push_back(kHex[c & 15]);
    }
  }
  return out;
}

std::string DirOf(const std::string& path) {
  auto slash = path.rfind('/');
  return slash == std::string::npos ? "" : path.substr(0, slash);
}

std::string BaseOf(const std::string& path) {
  auto slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

int ErrnoFor(const Status& s, int http_status) { return OriginErrno(s, http_status); }  // origin_health.h

// Answers `req` with `err`. An EIO says in the log which path failed and why: a reader's EIO at
// an open or a read never comes with nothing logged (evict15 saw one, once in 32 runs).
void ReplyErr(fuse_req_t req, int err, const std::string& what, const std::string& why) {
  if (err == EIO) std::fprintf(stderr, "ghostfs: %s: %s; answered EIO\n", what.c_str(), why.c_str());
  fuse_reply_err(req, err);
}
void ReplyErr(fuse_req_t req, const Status& s, const std::string& what) {
  ReplyErr(req, s.ToErrno(), what, s.ToString());
}

const char kListingPrefix[] = "listing:";
// A read this far beyond the bytes that have arrived gets its own range request, in pieces
// of at least kRangePiece.
constexpr Bytes kReadAheadGap = 1 << 20;
constexpr Bytes kRangePiece = 1 << 20;
// Live bytes of a stream's window cheap enough to move whenever the passed ones are dropped.
constexpr std::size_t kStreamCompactBytes = 64 * 1024;

}  // namespace

// Body files kept open for the next open of the same object (fs/body_fd_cache.h).
constexpr std::size_t kKeptBodies = 512;

OriginTree::OriginTree(TreeContext ctx) : ctx_(std::move(ctx)), bodies_(BodyFdCache::CapacityFor(kKeptBodies)) {
  // The store outlives the tree (TreeContext); the listener goes with the tree.
  ctx_.store.SetInternalChangeListener([this](const std::string& key) {
    bodies_.Forget(key);
    ctx_.passthrough.DropKept(key);
    DropKernelCopy(key);
  });
}

double OriginTree::CachedTimeout(const std::string& url, fuse_ino_t ino, const CacheEntry* cached) {
  if (!cached || !cached->expires || ctx_.write_back.QueuedBodyOf(url)) return kAttrTimeout;
  double left = ToSeconds(*cached->expires - ctx_.clock.Now());
  if (left <= kAttrTimeout) return kAttrTimeout;
  long_timeouts_[url] = ino;
  return std::min(left, kFreshAttrTimeout);
}

void OriginTree::DropKernelCopy(const std::string& url) {
  auto it = long_timeouts_.find(url);
  if (it == long_timeouts_.end()) return;
  fuse_ino_t ino = it->second;
  long_timeouts_.erase(it);
  if (ctx_.invalidate_inode) ctx_.invalidate_inode(ino);
}

struct stat OriginTree::KernelStat(fuse_ino_t ino, Bytes size, std::optional<std::int64_t> mtime) {
  if (Node* n = ctx_.inodes.Find(ino)) n->kernel_size = static_cast<std::int64_t>(size);
  return ghost::FileStat(ino, size, 0444, mtime);
}

std::optional<Bytes> OriginTree::CurrentSize(const std::string& url, fuse_ino_t ino, const CacheEntry* cached,
                                             std::optional<Bytes> listed) const {
  if (auto pv = page_versions_.find(ino); pv != page_versions_.end() && pv->second.opens > 0 && pv->second.size) {
    return pv->second.size;
  }
  if (auto s = streams_.find(url); s != streams_.end() && s->second->size) {
    return s->second->size;
  }
  // A fill waiting in the write queue (or the flash log) is what opens read (DESIGN §3.5).
  if (const CacheEntry* q = ctx_.write_back.QueuedMeta(url); q && q->size) return q->size;
  if (cached) return cached->size;
  return listed;
}

OriginTree::~OriginTree() { ctx_.store.SetInternalChangeListener(nullptr); }

std::string OriginTree::OriginUrl(const Node* n) const {
  std::string url = ctx_.options.origins[n->origin].url;
  std::string component;
  for (std::size_t i = 0; i <= n->path.size(); ++i) {
    if (i == n->path.size() || n->path[i] == '/') {
      if (!component.empty()) url += EncodeComponent(component) + "/";
      component.clear();
    } else {
      component.push_back(n->path[i]);
    }
  }
  if (n->kind == NodeKind::kOriginFile && url.ends_with("/")) url.pop_back();
  return url;
}

// A name longer than NAME_MAX (255 bytes) cannot be looked up through any Linux file system:
// listing it would show a file nobody can open. Such names are left out of the directory, with
// one line per directory URL on stderr (not one per listing: listings are refetched).
void OriginTree::DropUnopenableNames(const std::string& url, std::vector<DirEntry>* entries) {
  std::size_t before = entries->size();
  std::erase_if(*entries, [](const DirEntry& e) { return e.name.size() > NAME_MAX; });
  std::size_t dropped = before - entries->size();
  if (dropped > 0 && long_names_logged_.insert(url).second) {
    std::fprintf(stderr,
                 "ghostfs: %s: %zu name(s) longer than %d bytes left out of the listing (Linux cannot open "
                 "them; rename them on the origin)\n",
                 url.c_str(), dropped, NAME_MAX);
  }
}

void OriginTree::WithListing(int origin, const std::string& dir, std::function<void(Result<const Listing*>)> then) {
  Node probe;
  probe.kind = NodeKind::kOriginDir;
  probe.origin = origin;
  probe.path = dir;
  std::string url = OriginUrl(&probe);
  auto it = listings_.find(url);
  if (it != listings_.end() && it->second.expires > ctx_.clock.Now()) return then(&it->second);

  auto body = std::make_shared<std::string>();
  auto status = std::make_shared<int>(0);
  auto last_modified = std::make_shared<std::string>();
  HttpFetcher::Callbacks cb;
  cb.on_head = [status, last_modified](const HttpResponseHead& h) {
    *status = h.status;
    *last_modified = h.last_modified;
    return true;
  };
  cb.on_data = [body](std::string_view d) {
    if (body->size() + d.size() > (16u << 20)) return false;  // no listing is 16 MiB
    body->append(d);
    return true;
  };
  cb.on_done = [this, url, body, status, last_modified, then](Status s) {
    if (s.ok() && *status == 200) {
      Result<DirectoryAnswer> answer = ReadDirectoryAnswer(*body, url, ParseHttpDate(*last_modified));
      if (answer.ok()) {
        DropUnopenableNames(url, &answer->entries);
        auto [at, fresh] = listings_.try_emplace(url);
        Listing& l = at->second;
        if (answer->kind == ListingKind::kPage && (fresh || l.kind != ListingKind::kPage)) {
          std::fprintf(stderr,
                       "ghostfs: %s serves a page, not a directory listing: shown as %s with the %zu name(s) it "
                       "links to; other names are asked of the origin (user.ghost.listing=page)\n",
                       url.c_str(), std::string(kDirectoryPageName).c_str(), answer->entries.size() - 1);
        }
        l.kind = answer->kind;
        l.entries = std::move(answer->entries);
        l.expires = ctx_.clock.Now() + ctx_.options.heuristic_freshness;
        l.from_saved = false;
        // Saved with the cache, so the tree can be listed offline.
        ctx_.write_back.QueueWholeFill(kListingPrefix + url, std::move(*body), "text/html");
        return then(&l);
      }
      std::fprintf(stderr, "ghostfs: %s: %s\n", url.c_str(), answer.status().message().c_str());
      return then(Status::NotSupported(url + " is not an HTML directory listing"));
    }
    // Offline or failing: the listing we had, or the saved one.
    auto have = listings_.find(url);
    if (have != listings_.end() && *status != 404) return then(&have->second);
    std::string key = kListingPrefix + url;
    const CacheEntry* saved = ctx_.store.index().Find(key);
    if (!saved || *status == 404) {
      if (*status == 404) return then(Status::NotFound(url));
      return then(s.ok() ? OriginHttpStatus(url, *status)  // 401/403: EACCES (origin_health.h)
                         : Status::Unavailable(url + ": " + s.message()).WithErrno(OriginErrno(s, 0)));
    }
    auto buf = std::make_shared<std::string>(saved->size, '\0');
    ctx_.store.ReadBody(key, 0, std::span<char>(buf->data(), buf->size()),
                     [this, url, buf, then](Result<std::size_t> n) {
                       if (!n.ok()) return then(n.status());
                       buf->resize(*n);
                       Result<DirectoryAnswer> answer = ReadDirectoryAnswer(*buf, url, std::nullopt);
                       if (!answer.ok()) return then(answer.status());
                       DropUnopenableNames(url, &answer->entries);
                       Listing& l = listings_[url];
                       l.kind = answer->kind;
                       l.entries = std::move(answer->entries);
                       l.expires = ctx_.clock.Now();  // stale: try the origin again next time
                       l.from_saved = true;
                       then(&l);
                     });
  };
  HttpRequest rq;
  rq.url = url;
  ctx_.http.Fetch(std::move(rq), std::move(cb));
}

namespace {

const DirEntry* FindEntry(const Listing& l, const std::string& name) {
  for (const DirEntry& e : l.entries) {
    if (e.name == name) return &e;
  }
  return nullptr;
}

}  // namespace

// The cached copy of an origin URL as the mount may use it. ghostproxy shares the index and
// keys its objects by URL too; what it stores under a URL that is not a plain 200 response
// (its index of Vary variants, a 404 it cached) is not this URL's file: the mount fetches
// the URL itself then.
const CacheEntry* OriginTree::MountEntry(const std::string& url) const {
  const CacheEntry* e = ctx_.store.index().Find(url);
  if (!e || e->response.empty()) return e;
  nlohmann::json head = nlohmann::json::parse(e->response, nullptr, /*allow_exceptions=*/false);
  // Whatever a store request put there (any control client's "response" string, kept in the
  // index across restarts): a "status" that is no integer is not a 200 (value() threw:
  // ghostfs aborted at every open of the URL, round 19).
  if (!head.is_object()) return nullptr;
  auto status = head.find("status");
  if (status == head.end() || !status->is_number_integer() || status->get<std::int64_t>() != 200) return nullptr;
  if (auto it = head.find("headers"); it != head.end() && it->is_array()) {
    for (const nlohmann::json& field : *it) {
      if (field.is_array() && field.size() == 2 && field[0].is_string() &&
          EqualsIgnoreCase(field[0].get<std::string>(), "X-Ghost-Vary-Index")) {
        return nullptr;
      }
    }
  }
  return e;
}

// One rule for every reply, so a file's mtime never flips between lookup and getattr (the
// kernel drops a file's cached pages when it sees the mtime change): the listing's time, else
// the cached copy's Last-Modified.
std::optional<std::int64_t> OriginTree::FileMtime(const DirEntry* listed, const CacheEntry* cached) const {
  if (listed && listed->mtime_unix) return listed->mtime_unix;
  if (cached) return ParseHttpDate(cached->last_modified);
  return std::nullopt;
}

const DirEntry* OriginTree::ListedEntry(const Node* n) const {
  Node dir;
  dir.kind = NodeKind::kOriginDir;
  dir.origin = n->origin;
  dir.path = DirOf(n->path);
  auto it = listings_.find(OriginUrl(&dir));
  const DirEntry* e = it == listings_.end() ? nullptr : FindEntry(it->second, BaseOf(n->path));
  return e ? e : ProbedEntry(n->origin, dir.path, BaseOf(n->path));
}

void OriginTree::Lookup(fuse_req_t req, Node* parent, const char* name_c) {
  std::string name = name_c;
  int origin = parent->origin;
  std::string dir = parent->path;
  WithListing(origin, dir, [this, req, origin, dir, name](Result<const Listing*> l) {
    if (OriginMustProbe(l, name)) {
      return OriginProbe(origin, dir, name, [this, req, origin, dir](Result<DirEntry> e) {
        OriginReplyProbed(req, origin, dir, std::move(e), 0);
      });
    }
    if (!l.ok()) return ReplyErr(req, l.status(), "lookup of " + name + ": the listing of /" + dir);
    const DirEntry* e = FindEntry(**l, name);
    if (!e) return (void)fuse_reply_err(req, ENOENT);
    std::string path = InodeTable::Join(dir, name);
    if (e->is_dir) {
      Node* n = ctx_.inodes.Lookup(NodeKind::kOriginDir, origin, path);
      return ReplyNodeEntry(req, n, ReadOnlyDirStat(n->ino));
    }
    Node* n = ctx_.inodes.Lookup(NodeKind::kOriginFile, origin, path);
    std::string url = OriginUrl(n);
    // The cached copy's size is exact (or a newer version's arriving, CurrentSize); a
    // listing's may be missing (Apache's "1.2K").
    const CacheEntry* cached = MountEntry(url);
    std::optional<Bytes> size = CurrentSize(url, n->ino, cached, e->size);
    if (size) {
      return ReplyNodeEntry(req, n, KernelStat(n->ino, *size, FileMtime(e, cached)),
                            cached ? CachedTimeout(url, n->ino, cached) : kAttrTimeout);
    }
    fuse_ino_t ino = n->ino;
    auto mtime = FileMtime(e, nullptr);
    HttpRequest head;
    head.url = url;
    head.head = true;
    auto length = std::make_shared<std::optional<Bytes>>();
    HttpFetcher::Callbacks cb;
    cb.on_head = [length](const HttpResponseHead& h) {
      if (h.status == 200) *length = h.content_length;
      return true;
    };
    cb.on_done = [this, req, ino, mtime, length](Status) {
      Node* node = ctx_.inodes.Find(ino);
      if (!node) return (void)fuse_reply_err(req, ENOENT);
      // Unknown length: 0 until read (like /proc); reads go past it with direct_io.
      ReplyNodeEntry(req, node, KernelStat(ino, length->value_or(0), mtime));
    };
    ctx_.http.Fetch(std::move(head), std::move(cb));
  });
}

void OriginTree::Getattr(fuse_req_t req, Node* n) {
  if (n->kind == NodeKind::kOriginDir) return (void)fuse_reply_attr(req, &static_cast<const struct stat&>(ReadOnlyDirStat(n->ino)), kAttrTimeout);
  std::string url = OriginUrl(n);
  if (auto pv = page_versions_.find(n->ino); pv != page_versions_.end() && pv->second.opens > 0 && pv->second.size) {
    // Cached-mode opens of a version are open: the inode's size stays theirs (CurrentSize).
    struct stat st = KernelStat(n->ino, *pv->second.size, FileMtime(ListedEntry(n), MountEntry(url)));
    return (void)fuse_reply_attr(req, &st, kAttrTimeout);
  }
  if (ctx_.write_back.Writing(url)) {
    // A fill of it is with the writer, neither queued nor committed: an open just read that
    // version, whose size comes with the commit (as its opens, this waits for it).
    fuse_ino_t ino = n->ino;
    return ctx_.write_back.WhenFillSettles(url, [this, req, ino] {
      Node* node = ctx_.inodes.Find(ino);
      if (!node) return (void)fuse_reply_err(req, ESTALE);
      Getattr(req, node);
    });
  }
  // Served from memory: the cache index or the parent's listing; no disk, no network.
  const CacheEntry* c = MountEntry(url);
  if (auto s = streams_.find(url); s != streams_.end() && s->second->size) {
    // A version is arriving (new, or the cached one again): its size is the one an open reads.
    struct stat st = KernelStat(n->ino, *s->second->size, FileMtime(ListedEntry(n), nullptr));
    return (void)fuse_reply_attr(req, &st, kAttrTimeout);
  }
  if (c) {
    struct stat st = KernelStat(n->ino, CurrentSize(url, n->ino, c, c->size).value_or(c->size), FileMtime(ListedEntry(n), c));
    return (void)fuse_reply_attr(req, &st, CachedTimeout(url, n->ino, c));
  }
  fuse_ino_t ino = n->ino;
  std::string name = BaseOf(n->path);
  int origin = n->origin;
  std::string dir = DirOf(n->path);
  WithListing(origin, dir, [this, req, ino, name, origin, dir](Result<const Listing*> l) {
    if (OriginMustProbe(l, name) || (l.ok() && !FindEntry(**l, name) && ProbedEntry(origin, dir, name))) {
      return OriginProbe(origin, dir, name, [this, req, origin, dir, ino](Result<DirEntry> e) {
        OriginReplyProbed(req, origin, dir, std::move(e), ino);
      });
    }
    if (!l.ok()) return ReplyErr(req, l.status(), "getattr of " + name + ": the listing of /" + dir);
    const DirEntry* e = FindEntry(**l, name);
    if (!e) return (void)fuse_reply_err(req, ENOENT);
    struct stat st = KernelStat(ino, e->size.value_or(0), e->mtime_unix);
    fuse_reply_attr(req, &st, kAttrTimeout);
  });
}

// The directory's own failure (404 → ENOENT, 403 → EACCES, unreachable) is said here:
// readdir(3) takes an ENOENT from getdents for the end of the directory, so a 404 would list
// as an empty directory. The listing fetched stays for the readdir that follows.
void OriginTree::Opendir(fuse_req_t req, Node* n, fuse_file_info* fi) {
  if (n->kind != NodeKind::kOriginDir) return (void)fuse_reply_open(req, fi);
  fuse_file_info info = *fi;
  WithListing(n->origin, n->path, [req, info, dir = n->path](Result<const Listing*> l) {
    if (!l.ok()) return ReplyErr(req, l.status(), "opendir: the listing of /" + dir);
    fuse_reply_open(req, &info);
  });
}

void OriginTree::Readdir(fuse_req_t req, Node* n, size_t size, off_t off, fuse_file_info*) {
  fuse_ino_t ino = n->ino;
  WithListing(n->origin, n->path, [this, req, ino, size, off, url = OriginUrl(n)](Result<const Listing*> l) {
    const std::map<std::string, Probe>* probed = nullptr;
    if (auto p = probes_.find(url); p != probes_.end()) probed = &p->second;
    if (!l.ok()) return ReplyErr(req, l.status(), "readdir: " + url);
    std::vector<char> buf(size);
    std::size_t used = 0;
    off_t index = 0;
    auto add = [&](const std::string& name, mode_t mode) {
      ++index;
      if (index <= off) return true;
      struct stat st {};
      st.st_ino = name == "." ? ino : kUnknownIno;
      st.st_mode = mode;
      std::size_t need = fuse_add_direntry(req, buf.data() + used, buf.size() - used, name.c_str(), &st, index);
      if (need > buf.size() - used) return false;
      used += need;
      return true;
    };
    if (add(".", S_IFDIR) && add("..", S_IFDIR)) {
      // A page's slash-less links may be files or directories: the type is left unknown.
      bool page = (*l)->kind == ListingKind::kPage;
      bool full = false;
      for (const DirEntry& e : (*l)->entries) {
        if ((full = !add(e.name, e.is_dir ? S_IFDIR : page && e.name != kDirectoryPageName ? 0 : S_IFREG))) break;
      }
      // And the names the origin confirmed that the page does not link to.
      if (page && probed && !full) {
        for (const auto& [name, p] : *probed) {
          if (p.entry && !FindEntry(**l, name) && !add(name, p.entry->is_dir ? S_IFDIR : S_IFREG)) break;
        }
      }
    }
    fuse_reply_buf(req, buf.data(), used);
  });
}

void OriginTree::Open(fuse_req_t req, Node* n, fuse_file_info* fi) { OpenObject(req, n, fi, /*copy_gone=*/false); }

void OriginTree::OpenObject(fuse_req_t req, Node* n, fuse_file_info* fi, bool copy_gone) {
  if ((fi->flags & O_ACCMODE) != O_RDONLY) return (void)fuse_reply_err(req, EROFS);
  std::string url = OriginUrl(n);
  fuse_ino_t ino = n->ino;
  fuse_file_info info = *fi;
  if (OpenPinned(req, ino, info)) return;
  const CacheEntry* cached = copy_gone ? nullptr : MountEntry(url);
  TimePoint now = ctx_.clock.Now();

  auto open_handle = [this, req, info, asked = *fi, url, ino, copy_gone](ReadSource source,
                                                                         std::shared_ptr<Stream> stream) mutable {
    Handle h;
    h.kind = NodeKind::kOriginFile;
    h.ino = ino;
    h.key = url;
    h.source = source;
    // A network read's length may differ from what stat said; let reads go to EOF.
    info.direct_io = source == ReadSource::kNetwork ? 1 : 0;
    info.keep_cache = source == ReadSource::kDisk || source == ReadSource::kWriteQueue ? 1 : 0;
    // Read-only, and Flush has nothing to do (Tree::Flush): close() need not wait for a
    // FLUSH round trip (a small cached read is lookup, open, read; release is asynchronous).
    info.noflush = 1;
    std::optional<int> backing;
    // Which version of the body this handle reads (one, from open to release).
    std::string version;
    // The same object opened recently: its backing id is still registered (the store's change
    // listener drops it the moment the object changes), so the kernel reads it at once.
    if (source == ReadSource::kDisk) {
      ctx_.store.Touch(url);
      backing = ctx_.passthrough.AcquireKept(ino, url);
    }
    std::shared_ptr<const std::string> packed =
        source == ReadSource::kDisk && !backing ? ctx_.store.PackedBody(url) : nullptr;
    if (backing) {
      // Nothing to read here: passthrough reads never reach the daemon.
    } else if (packed) {
      // A small body packed in the index: this handle keeps the bytes it read.
      version = CacheStore::PackedVersion(*packed);
      // The kernel reads it from a memfd copy (no READ round trip), else the daemon serves it.
      backing = ctx_.passthrough.AcquireBytes(ino, *packed, url);
      h.body = std::move(packed);
    } else if (source == ReadSource::kDisk) {
      // Opened once per open file, not per read; stays readable even if evicted meanwhile.
      // A body opened recently is still open (no path walk on the disk).
      Result<BodyFile> file = bodies_.Open(ctx_.store, url);
      if (!file.ok()) {
        int err = file.status().ToErrno();
        if (err == ENOENT) {
          // The copy left the cache after the decision: the cap evicted it (also while a
          // revalidation asked the origin), or CheckBody dropped it as damaged. A reader asked
          // for the file, not for that copy: it is fetched again, as a miss. Once: missing
          // again (the stale paths, with the origin failing too), the copy is stale.
          Node* node = ctx_.inodes.Find(ino);
          if (node && !copy_gone) return OpenObject(req, node, &asked, /*copy_gone=*/true);
          err = ESTALE;
        }
        return ReplyErr(req, err, "open of " + url, "the cached copy: " + file.status().ToString());
      }
      h.file = std::move(file).value();
      // The cost model chose the disk for this open: the kernel may read the body file itself
      // (a committed body is complete and never rewritten: a replacement is a new file).
      const CacheEntry* e = MountEntry(url);
      if (h.file.size_known()) version = h.file.version();
      if (e && h.file.size_known() && h.file.size() == e->size) {
        backing = ctx_.passthrough.Acquire(ino, h.file.fd(), url);
      }
      if (!backing && h.file.size_known()) StartPrefetch(h, h.file.size());
    } else if (source == ReadSource::kWriteQueue) {
      if (const QueuedBody* q = ctx_.write_back.QueuedBodyOf(url)) {
        h.body = q->data;
        version = "q" + std::to_string(q->version);
      }
    }
    // The kernel cuts page-cache reads and mmap at the size it was given (a direct_io read
    // goes to EOF, an mmap of st_size does not): an open of a version of another size (the
    // origin changed since the lookup, a fill replaced the copy) drops the kernel's attributes
    // before the reply, so an fstat after the open asks Getattr, which says this version's.
    std::optional<Bytes> open_size;
    if (source == ReadSource::kNetwork) {
      if (stream) open_size = stream->size;
    } else if (h.body) {
      open_size = h.body->size();
    } else if (h.file.is_open() && h.file.size_known()) {
      open_size = h.file.size();
    } else if (const CacheEntry* e = backing ? MountEntry(url) : nullptr) {
      open_size = e->size;
    }
    if (Node* node = open_size ? ctx_.inodes.Find(ino) : nullptr;
        node && node->kernel_size >= 0 && static_cast<Bytes>(node->kernel_size) != *open_size) {
      node->kernel_size = -1;
      if (ctx_.invalidate_attributes) ctx_.invalidate_attributes(ino);
    }
    if (!backing && !info.direct_io && !PageCacheMayServe(ino, version, open_size, &info)) {
      // Another version is in (or may be in) the kernel's pages of this inode: read this
      // one past them.
      info.direct_io = 1;
      info.keep_cache = 0;
    }
    if (!info.direct_io && !backing) h.page_counted = true;
    h.io_mode = backing ? IoMode::kPassthrough : info.direct_io ? IoMode::kDirect : IoMode::kCached;
    if (!backing && (backing = ctx_.passthrough.JoinBacking(ino))) {
      // Passthrough opens of this inode (of another body) are active: the kernel fails any
      // open of it without the flag, so this one carries it with direct_io (reads come here).
      info.direct_io = 1;
      info.keep_cache = 0;
      h.io_mode = IoMode::kDirectJoined;
    }
    h.stream = std::move(stream);
    if (h.stream) ++h.stream->opens;
    info.fh = ctx_.new_fh();
    std::uint64_t fh = info.fh;
    // From its open on, the window keeps what this reader has not read yet.
    if (h.stream && h.stream->windowed) h.stream->readers.try_emplace(fh, h.stream->base);
    IoMode mode = h.io_mode;
    handles_[fh] = std::move(h);
    if (mode == IoMode::kCached) ctx_.passthrough.CachedOpened(ino);
    ++ctx_.reads.requests_by_source[source];
    ctx_.stats_changed();
    int sent =
        backing ? ctx_.passthrough.ReplyOpen(req, &info, *backing) : fuse_reply_open(req, &info);
    if (sent == -ENOENT) {
      // The open was interrupted: the kernel forgot it, and no release will come.
      auto it = handles_.find(fh);
      if (it != handles_.end()) {
        OriginRelease(it->second);
        handles_.erase(it);
      }
    }
  };

  // Network: stream the object (or join a stream already running); the open is answered
  // once the reply's head says whether there is a body.
  // The size the emulated card will carry: the cached copy's, else the parent listing's.
  Bytes listed_size = 0;
  {
    Node parent;
    parent.kind = NodeKind::kOriginDir;
    parent.origin = n->origin;
    parent.path = DirOf(n->path);
    auto l = listings_.find(OriginUrl(&parent));
    if (l != listings_.end()) {
      if (const DirEntry* e = FindEntry(l->second, BaseOf(n->path)); e && e->size) listed_size = *e->size;
    }
  }
  auto from_network = [this, ino, url, open_handle, req, listed_size, cached = cached != nullptr](const std::string& validator_etag,
                                                                                   const std::string& validator_date) mutable {
    auto running = streams_.find(url);
    // A running stream is joined only while it still holds the body's first bytes: once its
    // window moved on, a reader from the start gets its own fetch (one version each).
    // Not a revalidation's: its 304 carries no body for a reader that joined it.
    if (running != streams_.end() && validator_etag.empty() && running->second->base == 0 &&
        !running->second->validating) {
      ctx_.reads.decisions[ino].source = ReadSource::kNetwork;
      return open_handle(ReadSource::kNetwork, running->second);
    }
    auto st = std::make_shared<Stream>();
    st->key = url;
    st->validating = !validator_etag.empty() || !validator_date.empty();
    streams_[url] = st;
    auto opened = std::make_shared<bool>(false);
    HttpRequest rq;
    rq.url = url;
    rq.if_none_match = validator_etag;
    rq.if_modified_since = validator_date;
    bool revalidating = !validator_etag.empty() || !validator_date.empty();
    // The emulated card carries the transfer (its mode decides the delay, DESIGN §7).
    ctx_.machine.TransferBegin();
    HttpFetcher::Callbacks cb;
    cb.on_head = [this, st, opened, open_handle, req, ino, url, revalidating](const HttpResponseHead& h) mutable {
      if (revalidating && h.status == 304) {
        // Still good: refresh the copy's freshness and read it from the disk.
        FreshnessInfo f = ComputeFreshness(h, ctx_.clock.Now(), UnixNow(), ctx_.options.heuristic_freshness);
        (void)ctx_.store.UpdateMeta(url, [&](CacheEntry& e) {
          e.expires = f.fresh_until;
          if (!h.etag.empty()) e.etag = h.etag;
        });
        // The index row reaches sqlite with the next write batch (DESIGN §3.5): one page.
        ctx_.write_back.QueueIndexUpdate(url);
        streams_.erase(url);
        st->no_body = true;
        *opened = true;
        ctx_.reads.decisions[ino].source = ReadSource::kRevalidate;
        open_handle(ReadSource::kDisk, nullptr);
        ++ctx_.reads.requests_by_source[ReadSource::kRevalidate];
        return false;  // no body to wait for
      }
      if (h.status != 200) {
        const std::string why = url + ": HTTP " + std::to_string(h.status);
        st->status = h.status == 404 || h.status == 410 ? Status::NotFound(why) : Status::IoError(why);
        st->no_body = true;
        *opened = true;
        streams_.erase(url);
        // Opens that joined this fetch before its head came were answered at once: their reads
        // end now (ESTALE for a gone object, else EIO), as nothing will come. Without this,
        // on_done (which skips a bodiless stream) never served them, and a reader waited
        // forever (ghostfs_web_random: a file removed from the origin, opened twice at once).
        st->done = true;
        ServeStream(*st);
        if (h.status >= 500 && MountEntry(url)) {
          // stale-if-error (RFC 5861): a failing origin does not hide the copy we have.
          std::fprintf(stderr, "ghostfs: %s answered HTTP %d; serving the cached copy (stale)\n", url.c_str(),
                       h.status);
          ++ctx_.reads.requests_by_source[ReadSource::kStale];
          ctx_.reads.decisions[ino].source = ReadSource::kStale;
          open_handle(ReadSource::kDisk, nullptr);
          return false;
        }
        int err = ErrnoFor(Status::Ok(), h.status);
        // An EIO from the origin's answer says why in the log (a 404 is ENOENT, plain enough).
        if (err == EIO) std::fprintf(stderr, "ghostfs: %s answered HTTP %d; the open fails with EIO\n", url.c_str(), h.status);
        fuse_reply_err(req, err);
        return false;
      }
      st->size = h.content_length;
      st->replaces = revalidating;
      st->windowed = true;
      FreshnessInfo f = ComputeFreshness(h, ctx_.clock.Now(), UnixNow(), ctx_.options.heuristic_freshness);
      st->storable = f.storable;
      st->meta.etag = h.etag;
      st->meta.last_modified = h.last_modified;
      st->meta.content_type = h.content_type;
      st->meta.expires = f.fresh_until;
      st->fill_wanted = st->storable && (!MountEntry(url) || st->replaces);
      // Too big to wait in the write queue: written to the store as it arrives.
      if (st->fill_wanted && st->size && *st->size > kMaxQueuedFill) StreamToFill(st, {});
      *opened = true;
      ctx_.reads.decisions[ino].source = ReadSource::kNetwork;
      open_handle(ReadSource::kNetwork, st);
      return true;
    };
    cb.on_data = [this, st](std::string_view d) {
      st->data.append(d);
      ctx_.reads.bytes_from_network += d.size();
      if (st->fill_wanted) StreamToFill(st, d);
      ServeStream(*st);
      TrimStream(*st);  // pauses the fetch while the window is full
      return true;
    };
    cb.on_done = [this, st, opened, req, url, cached, open_handle, ino](Status s) mutable {
      ctx_.machine.TransferEnd();
      if (st->no_body) return;
      st->done = true;
      st->status = s;
      if (streams_.count(url) && streams_[url] == st) streams_.erase(url);
      if (!*opened) {
        *opened = true;
        // Unreachable: serve the cached copy if there is one (stale), else a clear errno.
        if (cached && MountEntry(url)) {
          std::fprintf(stderr, "ghostfs: %s unreachable (%s); serving the cached copy (stale)\n", url.c_str(), s.message().c_str());
          ++ctx_.reads.requests_by_source[ReadSource::kStale];
          ctx_.reads.decisions[ino].source = ReadSource::kStale;  // user.ghost.source: not "network"
          return open_handle(ReadSource::kDisk, nullptr);
        }
        std::fprintf(stderr, "ghostfs: %s: %s\n", url.c_str(), s.message().c_str());
        return (void)fuse_reply_err(req, ErrnoFor(s, 0));
      }
      ServeStream(*st);  // reads still waiting get what there is (EOF), or the error
      TrimStream(*st);
      bool complete = s.ok() && (!st->size || *st->size == st->received());
      if (!complete) {
        std::fprintf(stderr, "ghostfs: %s: incomplete (%s); not cached\n", url.c_str(), s.message().c_str());
      }
      FinishStreamFill(st, complete);
    };
    st->fetch = ctx_.http.Fetch(std::move(rq), std::move(cb));
    // The emulated card carries the same transfer; data reaches readers once both the real
    // bytes and the card's modelled delay (mode change, beacons, DESIGN §7) are through.
    Bytes expected = listed_size;
    if (const CacheEntry* e = MountEntry(url)) expected = e->size;
    ctx_.machine.network().Submit({expected, false}, [this, st] {
      st->emulated_ready = true;
      ServeStream(*st);
    });
  };

  // The cache manager decides (common/cache/cache_manager.h): a fill still waiting in the
  // write queue is read from memory (DESIGN §3.5), a stale copy is revalidated, a fresh one
  // goes to the cost model (which may hint the ideal device).
  ObjectState state;
  state.on_disk = cached != nullptr;
  // A fill of it waits in the write queue (its body readable here), or is with the writer (the
  // open waits for the commit). A pending fill with neither (in the store, its batch not done
  // yet; refused by the store; dropped) is not read from the queue: a handle without a body
  // finds the copy at its first read only if the cap has not evicted it by then.
  state.in_write_queue = ctx_.write_back.FillPending(url) &&
                         (ctx_.write_back.Writing(url) || ctx_.write_back.QueuedBodyOf(url) != nullptr);
  state.fresh = cached && cached->expires && *cached->expires + ctx_.options.max_stale > now;
  state.size = cached ? cached->size : listed_size;  // a miss: what the fetch should carry
  ReadDecision d = ctx_.manager.DecideRead(state);
  if (d.costed) {
    Decision& dec = ctx_.reads.decisions[ino];
    dec.choice = d.choice;
    dec.knob = ctx_.machine.pm().knob();
    dec.cost = nullptr;
  }
  switch (d.source) {
    case ReadSource::kWriteQueue:
    case ReadSource::kMemory:
      if (ctx_.write_back.Writing(url) && !ctx_.write_back.QueuedBodyOf(url)) {
        // With the writer: neither in the queue nor committed. Open what the commit leaves:
        // the copy, or the origin if the cap evicted it meanwhile (a handle without a body
        // would find nothing at its first read: EIO).
        fuse_file_info again = *fi;
        return ctx_.write_back.WhenFillSettles(url, [this, req, ino, again, copy_gone]() mutable {
          Node* node = ctx_.inodes.Find(ino);
          if (!node) return (void)fuse_reply_err(req, ESTALE);
          OpenObject(req, node, &again, copy_gone);
        });
      }
      ctx_.reads.decisions[ino].source = d.source;
      return open_handle(ReadSource::kWriteQueue, nullptr);
    case ReadSource::kRevalidate:
      return from_network(cached->etag, cached->last_modified);
    case ReadSource::kDisk:
    case ReadSource::kFlash:
      ctx_.reads.decisions[ino].source = ReadSource::kDisk;
      return open_handle(ReadSource::kDisk, nullptr);
    case ReadSource::kNetwork:
    case ReadSource::kStale:  // not a decision (see cache_manager.h)
      return from_network("", "");
  }
}

nlohmann::json CostJson(const Choice& c, const PowerManager& pm) { return CostJson(c, pm.knob()); }

nlohmann::json CostJson(const Choice& c, int knob) {
  nlohmann::json cost = nlohmann::json::object();
  for (const SourceEstimate& e : c.candidates) {
    cost[SourceName(e.holder.source)] = {{"time_ms", ToMillis(e.time)}, {"energy_j", e.energy.joules()}, {"cost", e.cost}};
  }
  cost["knob"] = knob;
  cost["chosen"] = SourceName(c.chosen.holder.source);
  cost["ideal"] = SourceName(c.ideal.holder.source);
  cost["ghost_hint"] = c.hinted;
  return cost;
}

void OriginTree::OriginRead(fuse_req_t req, Handle& h, size_t size, off_t off, std::uint64_t h_fh) {
  Bytes offset = static_cast<Bytes>(off);
  if (h.stream) {
    Stream& st = *h.stream;
    // Already fetched by a range request?
    for (auto& [first, piece] : st.ranges) {
      if (offset >= first && offset + size <= first + piece.size()) {
        return (void)fuse_reply_buf(req, piece.data() + (offset - first), size);
      }
    }
    bool behind = offset < st.base && (!st.size || offset < *st.size);
    if (behind || (!st.done && offset > st.received() + kReadAheadGap && (!st.size || offset < *st.size))) {
      // Far ahead of the stream, or behind its window (those bytes are gone from memory).
      return ReadAhead(req, h.stream, offset, size);
    }
    if (st.windowed) st.readers.try_emplace(h_fh, st.base);
    st.waiters.push_back({req, offset, size, h_fh});
    ServeStream(st);
    TrimStream(st);
    return;
  }
  if (h.source == ReadSource::kWriteQueue && !h.body) {
    // Opened before the fill was queued (mail): the version queued now, for good.
    if (const QueuedBody* q = ctx_.write_back.QueuedBodyOf(h.key)) h.body = q->data;
  }
  if (h.body) {
    // The one version of the queued fill this handle opened, or a small body packed in the
    // index (DESIGN §4.5).
    const std::string& body = *h.body;
    std::size_t from = static_cast<std::size_t>(std::min<Bytes>(offset, body.size()));
    std::size_t n = std::min<std::size_t>(size, body.size() - from);
    // A fill spilled to the flash log, read back from there (the store's handles say so; an
    // origin file's handle opened its queued fill, which may have gone to the log since): the
    // log's device does the read (Machine::AddFlash), not the disk.
    if (n > 0 && (h.source == ReadSource::kFlash ||
                  (h.source == ReadSource::kWriteQueue && ctx_.write_back.Logged(h.key)))) {
      ctx_.reads.bytes_from_cache += n;
      Device* flash = ctx_.machine.flash();
      if (flash == nullptr) return (void)fuse_reply_buf(req, body.data() + from, n);
      flash->Submit({n, false}, [req, keep = h.body, from, n] { fuse_reply_buf(req, keep->data() + from, n); });
      return;
    }
    if (h.source == ReadSource::kWriteQueue || n == 0) {
      return (void)fuse_reply_buf(req, body.data() + from, n);
    }
    // Packed: read from the index on the disk, so the emulated disk does the same work as for
    // a body file (else a packed read would cost neither time nor energy in the model).
    ctx_.reads.bytes_from_cache += n;
    if (ctx_.options.profile.empty()) return (void)fuse_reply_buf(req, body.data() + from, n);
    ctx_.machine.storage().Submit({n, false}, [req, keep = h.body, from, n] {
      fuse_reply_buf(req, keep->data() + from, n);
    });
    return;
  }
  if (h.source == ReadSource::kWriteQueue) {
    // Flushed before the first read: the copy is on the disk now, or about to be.
    if (ctx_.write_back.Writing(h.key)) {
      std::uint64_t fh = h_fh;
      return ctx_.write_back.WhenFillSettles(h.key, [this, req, fh, size, off] {
        auto it = handles_.find(fh);
        if (it == handles_.end()) return (void)fuse_reply_err(req, EBADF);
        OriginRead(req, it->second, size, off, fh);
      });
    }
    // Gone from the cache before this first read (an origin file's open never makes such a
    // handle: OpenObject): the version this open was to read is gone, which ESTALE says. EIO
    // stays for a real I/O error.
    if (!ctx_.store.index().Find(h.key)) return (void)fuse_reply_err(req, ESTALE);
    h.source = ReadSource::kDisk;
    if ((h.body = ctx_.store.PackedBody(h.key))) return OriginRead(req, h, size, off, h_fh);
    Result<BodyFile> file = CacheManager::OpenBody(ctx_.store, h.key);
    if (!file.ok()) {
      int err = file.status().ToErrno();
      return ReplyErr(req, err == ENOENT ? ESTALE : err, "first read of " + h.key,
                      "the copy flushed since the open: " + file.status().ToString());
    }
    h.file = std::move(file).value();
  }
  // The prefetch started at open covers this read: wait for it or take from it.
  if (h.prefetch) {
    std::shared_ptr<Prefetch> p = h.prefetch;
    if (!p->done) {
      p->waiters.push_back([this, req, size, off, fh = h_fh] {
        auto it = handles_.find(fh);
        if (it == handles_.end()) return (void)fuse_reply_err(req, EBADF);
        OriginRead(req, it->second, size, off, fh);
      });
      return;
    }
    if (p->ok && offset < p->data.size() && (offset + size <= p->data.size() || p->data.size() < kPrefetchBytes)) {
      // Inside it, or past the end of a body it holds whole (then the read ends at EOF).
      std::size_t n = static_cast<std::size_t>(std::min<Bytes>(size, p->data.size() - offset));
      ctx_.reads.bytes_from_cache += n;
      return (void)fuse_reply_buf(req, p->data.data() + offset, n);
    }
    if (!p->ok || offset >= p->data.size()) h.prefetch.reset();  // done with it
  }
  // From the disk cache (through io_uring), with the emulated disk doing the same work.
  // The size of the body this handle opened (it stays readable if evicted or replaced
  // meanwhile; the index describes the current version, which may be another file).
  if (!h.file.size_known()) {
    if (int err = h.file.Stat()) {
      return ReplyErr(req, err, "read of " + h.key, std::string("fstat of its body file: ") + std::strerror(err));
    }
  }
  Bytes body_size = h.file.size();
  if (offset >= body_size) return (void)fuse_reply_buf(req, nullptr, 0);
  std::size_t want = static_cast<std::size_t>(std::min<Bytes>(size, body_size - offset));
  ctx_.reads.bytes_from_cache += want;
  bool emulated = !ctx_.options.profile.empty();
  auto buf = std::make_shared<std::string>(want, '\0');
  // Bytes already in the page cache are copied here without blocking (RWF_NOWAIT fails with
  // EAGAIN rather than wait for the disk); only the rest goes through io_uring. A warm read
  // then costs no thread hand-offs at all.
  std::size_t have = 0;
  if (!emulated) {
    iovec iov{buf->data(), want};
    ssize_t n = preadv2(h.file.fd(), &iov, 1, off, RWF_NOWAIT);
    if (n > 0) have = static_cast<std::size_t>(n);
    if (have == want) return (void)fuse_reply_buf(req, buf->data(), want);
  }
  auto result = std::make_shared<Result<std::size_t>>(Status::Internal("unset"));
  auto reply = [req, buf, result, have, key = h.key, offset] {
    if (!result->ok()) {
      return ReplyErr(req, result->status(),
                      "read of " + key + " at " + std::to_string(offset) + " from its body file");
    }
    fuse_reply_buf(req, buf->data(), have + **result);
  };
  auto pending = std::make_shared<int>(emulated ? 2 : 1);
  auto finish = [pending, reply] {
    if (--*pending == 0) reply();
  };
  if (emulated) ctx_.machine.storage().Submit({want, false}, finish);  // the emulated disk does the same work
  ctx_.io.Read(h.file.fd(), offset + have, std::span<char>(buf->data() + have, want - have), [result, finish](Result<std::size_t> n) {
    *result = std::move(n);
    finish();
  });
}

void OriginTree::StartPrefetch(Handle& h, Bytes size) {
  // The emulated disk is charged per read (OriginRead); a prefetch would bypass it.
  if (!ctx_.options.profile.empty() || size == 0) return;
  auto p = std::make_shared<Prefetch>();
  p->data.resize(static_cast<std::size_t>(std::min<Bytes>(size, kPrefetchBytes)));
  h.prefetch = p;
  iovec iov{p->data.data(), p->data.size()};
  ssize_t n = preadv2(h.file.fd(), &iov, 1, 0, RWF_NOWAIT);  // in the page cache: no I/O at all
  if (n == static_cast<ssize_t>(p->data.size())) {
    p->done = p->ok = true;
    return;
  }
  ctx_.io.Read(h.file.fd(), 0, std::span<char>(p->data.data(), p->data.size()), [p](Result<std::size_t> r) {
    p->done = true;
    p->ok = r.ok();
    if (r.ok()) p->data.resize(*r);
    p->file.Close();  // a released handle's file, kept open for this read
    auto waiters = std::move(p->waiters);
    for (auto& w : waiters) w();
  });
}

void OriginTree::ReadAhead(fuse_req_t req, std::shared_ptr<Stream> st, Bytes offset, std::size_t size) {
  Bytes len = std::max<Bytes>(size, kRangePiece);
  if (st->size) len = std::min<Bytes>(len, *st->size - offset);
  HttpRequest rq;
  rq.url = st->key;
  rq.range = std::make_pair(offset, offset + len - 1);
  // Only a range of the version being streamed (a weak tag cannot validate a range).
  rq.if_range = !st->meta.etag.empty() && !st->meta.etag.starts_with("W/") ? st->meta.etag : st->meta.last_modified;
  auto piece = std::make_shared<std::string>();
  auto ok = std::make_shared<bool>(false);
  auto changed = std::make_shared<bool>(false);
  HttpFetcher::Callbacks cb;
  cb.on_head = [ok, changed, offset](const HttpResponseHead& h) {
    *ok = h.status == 206 && h.content_range && h.content_range->first == offset;
    // If-Range did not match (the whole new version came instead), or the object is gone.
    *changed = h.status == 200 || h.status == 404 || h.status == 410;
    return *ok;
  };
  cb.on_data = [piece](std::string_view d) {
    piece->append(d);
    return true;
  };
  cb.on_done = [this, req, st, offset, size, piece, ok, changed](Status s) {
    if (!*ok && *changed && offset < st->base) {
      // Bytes this open passed, read again after the origin changed: its version is gone from
      // the origin and from memory. ESTALE says so (never another version's bytes).
      return (void)fuse_reply_err(req, ESTALE);
    }
    if (s.ok() && *ok) {
      ctx_.reads.bytes_from_network += piece->size();
      std::size_t n = std::min<std::size_t>(size, piece->size());
      fuse_reply_buf(req, piece->data(), n);
      if (st->ranges.size() >= 8) st->ranges.erase(st->ranges.begin());
      st->ranges[offset] = std::move(*piece);
      return;
    }
    // No range support (or it failed): wait for the stream like any other read.
    st->waiters.push_back({req, offset, size});
    ServeStream(*st);
  };
  ctx_.http.Fetch(std::move(rq), std::move(cb));
}

void OriginTree::ServeStream(Stream& st) {
  if (!st.emulated_ready) return;
  // Every waiter its bytes are here for, not only the first: readers at different places
  // must not wait for each other (the window may be full waiting for the one behind).
  for (auto it = st.waiters.begin(); it != st.waiters.end();) {
    Stream::Waiter& w = *it;
    Bytes end = st.received();
    bool have = end >= w.offset + w.size;
    if (!have && !st.done) {
      ++it;
      continue;
    }
    if (w.offset < st.base || (!have && !st.status.ok())) {
      // Fell behind the window, or the fetch failed short: EIO; ESTALE when the object is gone
      // from the server (a message another client expunged after this one was opened).
      bool gone = w.offset >= st.base && st.status.code() == Status::Code::kNotFound;
      ReplyErr(w.req, gone ? ESTALE : EIO, "read of " + st.key + " at " + std::to_string(w.offset),
               w.offset < st.base ? "behind the stream's window (from " + std::to_string(st.base) +
                                        "), and no range of this version came"
                                  : "the fetch ended short at " + std::to_string(end) + ": " + st.status.ToString());
    } else {
      Bytes from = std::min<Bytes>(w.offset, end);
      std::size_t n = static_cast<std::size_t>(std::min<Bytes>(w.size, end - from));
      fuse_reply_buf(w.req, st.data.data() + (from - st.base), n);
      if (auto r = st.readers.find(w.fh); r != st.readers.end()) r->second = std::max(r->second, from + n);
    }
    it = st.waiters.erase(it);
  }
}

void OriginTree::TrimStream(Stream& st) {
  if (!st.windowed) return;
  // Bytes every open reader has passed, and no waiter needs, leave memory (the store fill has
  // its own copy of them in flight).
  Bytes keep_from = st.received();
  for (const auto& [fh, pos] : st.readers) keep_from = std::min(keep_from, pos);
  for (const Stream::Waiter& w : st.waiters) keep_from = std::min(keep_from, w.offset);
  std::size_t drop = keep_from > st.base ? static_cast<std::size_t>(std::min<Bytes>(keep_from - st.base, st.data.size())) : 0;
  // A body that fits the window is kept whole: a reader may read it in any order (a range
  // first, then from the start), and its version must stay readable to it even after the
  // origin changed (a passed byte read again would need a range request, which the changed
  // origin can no longer answer for this version).
  if (st.size && *st.size <= kStreamWindow) drop = 0;
  std::size_t live = st.data.size() - drop;
  // Erasing the front moves every byte behind it: done only once the passed bytes are at
  // least as many as the live ones (or the live ones are few), so each byte is moved O(1)
  // times over the stream (erasing at every 16 KiB arrival moved up to the whole window each
  // time: half the daemon's CPU on a first read of a large file). The passed bytes stay
  // readable meanwhile; the window holds at most twice kStreamWindow.
  if (drop > 0 && (drop >= live || live <= kStreamCompactBytes)) {
    st.data.erase(0, drop);
    st.base += drop;
    if (st.data.capacity() > 2 * kStreamWindow) st.data.shrink_to_fit();
  }
  bool full = live >= kStreamWindow || st.fill_in_flight >= kStreamWindow;
  if (st.done || st.fetch == 0) return;
  if (full != st.paused && ctx_.http.Pause(st.fetch, full)) st.paused = full;
}

// The fill of a streamed body: small ones are kept whole and go through the write queue at
// the end (deferred while the disk sleeps, DESIGN §3.5); from kMaxQueuedFill on, the body is
// written to the store as it arrives (the queue would spin the disk up for it anyway), so no
// copy of it stays in memory.
void OriginTree::StreamToFill(const std::shared_ptr<Stream>& sp, std::string_view d) {
  Stream& st = *sp;
  if (st.fill_failed) return;
  if (st.small) {
    if ((!st.size || *st.size <= kMaxQueuedFill) && st.small_body.size() + d.size() <= kMaxQueuedFill) {
      st.small_body.append(d);
      return;
    }
    st.small = false;
    CacheEntry meta = st.meta;
    meta.size = st.size.value_or(0);
    Result<FillId> id = ctx_.store.BeginFill(st.key, meta);
    if (!id.ok()) {
      std::fprintf(stderr, "ghostfs: not caching %s: %s\n", st.key.c_str(), id.status().ToString().c_str());
      st.fill_failed = true;
      std::string().swap(st.small_body);
      return;
    }
    st.fill_id = *id;
    std::string first;
    first.swap(st.small_body);
    first.append(d);
    d = {};
    if (!first.empty()) StreamToFill(sp, first);
    return;
  }
  if (!st.fill_id) return;
  // Handed to the store in pieces of kFillPiece (the network delivers 16 KiB at a time), the
  // rest by FinishStreamFill (called with an empty `d`).
  st.fill_pending.append(d);
  if (st.fill_pending.empty() || (!d.empty() && st.fill_pending.size() < kFillPiece)) return;
  std::string piece;
  piece.swap(st.fill_pending);
  Bytes n = piece.size();
  st.fill_in_flight += n;
  std::weak_ptr<Stream> weak = sp;
  FillId id = *st.fill_id;
  ctx_.store.AppendFill(id, std::move(piece), [this, weak, n, id](Status s) {
    std::shared_ptr<Stream> sp = weak.lock();
    if (!sp) return;
    sp->fill_in_flight -= n;
    if (!s.ok() && !sp->fill_failed) {
      // Disk full or failing: the body still streams to its readers, it is just not cached.
      std::fprintf(stderr, "ghostfs: not caching %s: %s\n", sp->key.c_str(), s.ToString().c_str());
      sp->fill_failed = true;
      if (sp->fill_id == id) sp->fill_id.reset();
      ctx_.store.AbortFill(id);
    }
    TrimStream(*sp);
  });
}

void OriginTree::FinishStreamFill(const std::shared_ptr<Stream>& sp, bool complete) {
  Stream& st = *sp;
  if (!st.fill_wanted || st.fill_failed) return;
  const std::string url = st.key;
  // Another read may have cached it meanwhile; a revalidation's new body replaces it.
  bool wanted = complete && (!MountEntry(url) || st.replaces);
  if (st.small) {
    if (wanted) ctx_.write_back.QueueFill(url, st.meta, std::move(st.small_body));
    std::string().swap(st.small_body);
    return;
  }
  if (!st.fill_id) return;
  if (wanted) StreamToFill(sp, {});  // the last piece
  if (!st.fill_id) return;           // it could not be handed over
  FillId id = *st.fill_id;
  st.fill_id.reset();
  std::string().swap(st.fill_pending);
  if (!wanted) return ctx_.store.AbortFill(id);
  // The emulated disk does the work of the writes (DESIGN §7), as for a queued fill.
  ctx_.machine.storage().Submit({st.received(), true}, [] {});
  ctx_.write_back.FillStarted(url);
  ctx_.store.CommitFill(id, [this, url](Status c) {
    if (!c.ok()) {
      std::fprintf(stderr, "ghostfs: not caching %s: %s\n", url.c_str(), c.ToString().c_str());
    } else {
      ctx_.write_back.FillCommitted(url);
    }
    ctx_.write_back.FillSettled(url);
  });
}

void OriginTree::OriginRelease(Handle& h) {
  if (h.io_mode == IoMode::kPassthrough || h.io_mode == IoMode::kDirectJoined) {
    ctx_.passthrough.ReleasePassthrough(h.ino);
  }
  if (h.io_mode == IoMode::kCached) ctx_.passthrough.CachedReleased(h.ino);
  if (h.page_counted) {
    auto pv = page_versions_.find(h.ino);
    if (pv != page_versions_.end()) --pv->second.opens;
    h.page_counted = false;
  }
  if (h.prefetch && !h.prefetch->done) h.prefetch->file = std::move(h.file);
  if (!h.stream) return;
  Stream& st = *h.stream;
  --st.opens;
  // Its position no longer holds the window back. A fetch still running may finish into the
  // cache; readers' waiters were answered or belong to other handles.
  for (auto it = st.readers.begin(); it != st.readers.end();) {
    auto other = handles_.find(it->first);
    if (other == handles_.end() || &other->second == &h) {
      it = st.readers.erase(it);
    } else {
      ++it;
    }
  }
  TrimStream(st);
}

// The kernel keeps one set of pages per inode, and a new version's open, though direct_io,
// can still fill them: a MAP_PRIVATE mmap of a direct_io file is served through the inode's
// page cache (fuse_file_mmap), and the daemon never sees the mmap. A reader holding the older
// version in cached mode would then read the new version's pages in the middle of its own
// (tests/integration/ghostfs_page_mix_test.py). So while such readers are open, an open gets
// their version, from the same bytes they read (a duplicate of the body file, or the same
// queued or packed body), without asking the origin: one version per inode until they close.
bool OriginTree::OpenPinned(fuse_req_t req, fuse_ino_t ino, fuse_file_info info) {
  auto pv = page_versions_.find(ino);
  if (pv == page_versions_.end() || pv->second.opens <= 0) return false;
  const Handle* pin = nullptr;
  for (const auto& [fh, h] : handles_) {
    if (h.ino == ino && h.kind == NodeKind::kOriginFile && h.io_mode == IoMode::kCached && h.page_counted) {
      pin = &h;
      break;
    }
  }
  if (pin == nullptr || (!pin->file.is_open() && !pin->body)) return false;
  Handle h;
  h.kind = NodeKind::kOriginFile;
  h.ino = ino;
  h.key = pin->key;
  h.source = pin->source;
  h.body = pin->body;
  if (pin->file.is_open()) {
    Result<BodyFile> dup = pin->file.Dup();
    if (!dup.ok()) return false;  // no fd to spare: the usual open decides
    h.file = std::move(dup).value();
  }
  h.io_mode = IoMode::kCached;
  h.page_counted = true;
  ++pv->second.opens;
  info.direct_io = 0;
  info.keep_cache = 1;  // the pages are this version's
  info.noflush = 1;
  info.fh = ctx_.new_fh();
  ctx_.reads.decisions[ino].source = h.source;
  ++ctx_.reads.requests_by_source[h.source];
  ++ctx_.reads.pinned_opens;
  handles_[info.fh] = std::move(h);
  ctx_.passthrough.CachedOpened(ino);
  fuse_reply_open(req, &info);
  return true;
}

// May a cached-mode (page cache) open of `ino` read body version `version`? The kernel keeps
// one set of pages and one size per inode: they may serve only one version, and only once the
// kernel's attributes (attr timeout) can no longer carry the previous version's size. Sets
// keep_cache: the pages are kept only when they are of this version.
bool OriginTree::PageCacheMayServe(fuse_ino_t ino, const std::string& version, std::optional<Bytes> size,
                                   fuse_file_info* info) {
  if (version.empty()) return false;
  TimePoint now = ctx_.clock.Now();
  const Duration settle = Seconds(kAttrTimeout + 0.5);
  auto [it, fresh] = page_versions_.try_emplace(ino);
  PageVersion& pv = it->second;
  if (fresh || pv.version != version) {
    if (pv.opens > 0) return false;  // readers of the other version are still open
    // No reader of the old version: this one becomes the inode's version once the kernel's
    // size has had time to follow; until then reads bypass the pages.
    pv.version = version;
    pv.size = size;
    pv.since = now;
    pv.opens = 0;
    pv.pages_valid = false;
    return false;
  }
  if (now - pv.since < settle) return false;
  // The first cached open of this version drops whatever pages the kernel kept (of an older
  // version); later ones keep the pages it read.
  if (!pv.pages_valid) info->keep_cache = 0;
  pv.pages_valid = true;
  ++pv.opens;
  return true;
}

std::optional<std::string> OriginTree::OriginXattr(Node* n, const std::string& name) {
  std::string url = OriginUrl(n);
  const CacheEntry* e = MountEntry(url);
  auto d = ctx_.reads.decisions.find(n->ino);
  if (name == "user.ghost.cached") return std::string(e ? "1" : "0");
  if (name == "user.ghost.source") return d == ctx_.reads.decisions.end() || !d->second.source ? std::string("none") : SourceLabel(*d->second.source);
  if (name == "user.ghost.cost") {
    if (d == ctx_.reads.decisions.end()) return std::nullopt;
    if (d->second.choice) return CostJson(*d->second.choice, d->second.knob).dump();
    if (d->second.cost.is_null()) return std::nullopt;
    return d->second.cost.dump();
  }
  if (name == "user.http.etag") {
    if (!e || e->etag.empty()) return std::nullopt;
    return e->etag;
  }
  if (name == "user.http.content_type") {
    if (!e || e->content_type.empty()) return std::nullopt;
    return e->content_type;
  }
  return std::nullopt;
}

// ---- the open bodies of the read path ----

std::uint64_t OriginTree::AddHandle(Handle h) {
  std::uint64_t fh = ctx_.new_fh();
  handles_[fh] = std::move(h);
  return fh;
}

Handle* OriginTree::FindHandle(std::uint64_t fh) {
  auto it = handles_.find(fh);
  return it == handles_.end() ? nullptr : &it->second;
}

void OriginTree::ReadHandle(fuse_req_t req, std::uint64_t fh, size_t size, off_t off) {
  auto it = handles_.find(fh);
  if (it == handles_.end()) return (void)fuse_reply_err(req, EBADF);
  OriginRead(req, it->second, size, off, fh);
}

void OriginTree::ReleaseHandle(std::uint64_t fh) {
  auto it = handles_.find(fh);
  if (it == handles_.end()) return;
  OriginRelease(it->second);
  handles_.erase(it);
}

void OriginTree::Read(fuse_req_t req, Node*, size_t size, off_t off, fuse_file_info* fi) {
  ReadHandle(req, fi->fh, size, off);
}

void OriginTree::Release(fuse_req_t req, Node*, fuse_file_info* fi) {
  ReleaseHandle(fi->fh);
  fuse_reply_err(req, 0);
}

namespace {
constexpr const char* kXattrs[] = {"user.ghost.cached", "user.ghost.source", "user.ghost.cost",
                                   "user.http.etag", "user.http.content_type"};
}  // namespace

void OriginTree::Getxattr(fuse_req_t req, Node* n, const char* name, size_t size) {
  if (n->kind == NodeKind::kOriginDir) return OriginDirXattr(req, n, name, size);
  if (n->kind != NodeKind::kOriginFile) return (void)fuse_reply_err(req, ENODATA);
  std::optional<std::string> v = OriginXattr(n, name);
  if (!v) return (void)fuse_reply_err(req, ENODATA);
  ReplyXattr(req, *v, size);
}

void OriginTree::Listxattr(fuse_req_t req, Node* n, size_t size) {
  std::string list;
  if (n->kind == NodeKind::kOriginFile) {
    for (const char* x : kXattrs) {
      if (OriginXattr(n, x)) list.append(x).push_back('\0');
    }
  }
  if (n->kind == NodeKind::kOriginDir) list.append("user.ghost.listing").push_back('\0');
  ReplyXattr(req, list, size);
}

// ---- names no listing settles ----
// A directory whose URL answers with an ordinary page (most sites: an index.html), or that
// cannot be listed at all (403 without autoindex), still has names: a lookup of one asks the
// origin with a HEAD instead of failing, and the answer is remembered for the listing's
// freshness time (probes_). An autoindex is the whole directory: names it lacks are ENOENT
// without a request.

bool OriginTree::OriginMustProbe(const Result<const Listing*>& l, const std::string& name) const {
  if (!l.ok()) return true;  // the probe itself falls back to a cached copy when offline
  if ((*l)->kind == ListingKind::kAutoindex) return false;
  return name != kDirectoryPageName;  // the page itself came with the listing
}

const DirEntry* OriginTree::ProbedEntry(int origin, const std::string& dir, const std::string& name) const {
  Node d;
  d.kind = NodeKind::kOriginDir;
  d.origin = origin;
  d.path = dir;
  auto it = probes_.find(OriginUrl(&d));
  if (it == probes_.end()) return nullptr;
  auto p = it->second.find(name);
  return p == it->second.end() || !p->second.entry ? nullptr : &*p->second.entry;
}

void OriginTree::OriginProbe(int origin, const std::string& dir, const std::string& name,
                             std::function<void(Result<DirEntry>)> then) {
  Node d;
  d.kind = NodeKind::kOriginDir;
  d.origin = origin;
  d.path = dir;
  std::string dir_url = OriginUrl(&d);
  Node f;
  f.kind = NodeKind::kOriginFile;
  f.origin = origin;
  f.path = InodeTable::Join(dir, name);
  std::string url = OriginUrl(&f);
  if (auto it = probes_.find(dir_url); it != probes_.end()) {
    if (auto p = it->second.find(name); p != it->second.end() && p->second.expires > ctx_.clock.Now()) {
      if (!p->second.entry) return then(Status::NotFound(url));
      return then(*p->second.entry);
    }
  }
  auto head = std::make_shared<HttpResponseHead>();
  HttpFetcher::Callbacks cb;
  cb.on_head = [head](const HttpResponseHead& h) {
    *head = h;
    return true;
  };
  cb.on_done = [this, dir_url, url, name, head, then](Status s) {
    Probe& slot = probes_[dir_url][name];
    if (!s.ok()) {
      // Unreachable: what we know of it, else the cached copy, else the failure.
      if (slot.entry) return then(*slot.entry);
      if (const CacheEntry* c = MountEntry(url)) {
        DirEntry e;
        e.name = name;
        e.size = c->size;
        e.mtime_unix = ParseHttpDate(c->last_modified);
        return then(e);
      }
      // Out of descriptors here: EMFILE, as a local open says it (not the origin's ENOTCONN).
      if (IsLocalResourceErrno(s.ToErrno())) return then(Status::Unavailable(url + ": " + s.message()).WithErrno(s.ToErrno()));
      return then(Status::Unavailable(url + ": " + s.message()));
    }
    slot.expires = ctx_.clock.Now() + ctx_.options.heuristic_freshness;
    DirEntry e;
    e.name = name;
    // A directory answers its slash-less URL with a redirect to "name/" (nginx, Apache),
    // followed here whatever it then answers (its page, or 403 without autoindex).
    if (!head->effective_url.empty() && head->effective_url != url && head->effective_url == url + "/") {
      e.is_dir = true;
    } else if (head->status == 200) {
      e.size = head->content_length;
      e.mtime_unix = ParseHttpDate(head->last_modified);
    } else {
      slot.entry.reset();
      if (head->status == 404 || head->status == 410) return then(Status::NotFound(url));
      slot.expires = ctx_.clock.Now();  // not a settled answer: ask again next time
      if (head->status == 401 || head->status == 403) {
        return then(Status::PermissionDenied(url + ": HTTP " + std::to_string(head->status)));
      }
      return then(Status::IoError(url + ": HTTP " + std::to_string(head->status)));
    }
    slot.entry = e;
    then(std::move(e));
  };
  HttpRequest rq;
  rq.url = url;
  rq.head = true;
  ctx_.http.Fetch(std::move(rq), std::move(cb));
}

// Replies to a lookup (getattr_ino 0) or a getattr of file `getattr_ino` with a probed name.
void OriginTree::OriginReplyProbed(fuse_req_t req, int origin, const std::string& dir, Result<DirEntry> e,
                               fuse_ino_t getattr_ino) {
  if (!e.ok()) return ReplyErr(req, e.status(), "probe of a name in /" + dir);
  std::string path = InodeTable::Join(dir, e->name);
  if (e->is_dir) {
    if (getattr_ino != 0) return (void)fuse_reply_err(req, ENOENT);  // a file became a directory
    Node* n = ctx_.inodes.Lookup(NodeKind::kOriginDir, origin, path);
    return ReplyNodeEntry(req, n, ReadOnlyDirStat(n->ino));
  }
  Node* n = getattr_ino != 0 ? ctx_.inodes.Find(getattr_ino) : ctx_.inodes.Lookup(NodeKind::kOriginFile, origin, path);
  if (!n) return (void)fuse_reply_err(req, ESTALE);
  const CacheEntry* cached = MountEntry(OriginUrl(n));
  Bytes size = CurrentSize(OriginUrl(n), n->ino, cached, e->size).value_or(0);
  struct stat st = KernelStat(n->ino, size, FileMtime(&*e, cached));
  if (getattr_ino != 0) return (void)fuse_reply_attr(req, &st, kAttrTimeout);
  ReplyNodeEntry(req, n, st);
}

// user.ghost.listing of an origin directory: "autoindex" (the server's listing: the whole
// directory) or "page" (an ordinary page: index.html and the names it links to).
void OriginTree::OriginDirXattr(fuse_req_t req, Node* n, const std::string& name, size_t size) {
  if (name != "user.ghost.listing") return (void)fuse_reply_err(req, ENODATA);
  WithListing(n->origin, n->path, [req, size](Result<const Listing*> l) {
    if (!l.ok()) return (void)fuse_reply_err(req, ENODATA);
    std::string value(ListingKindName((*l)->kind));
    if (size == 0) return (void)fuse_reply_xattr(req, value.size());
    if (size < value.size()) return (void)fuse_reply_err(req, ERANGE);
    fuse_reply_buf(req, value.data(), value.size());
  });
}

}  // namespace ghost
