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
#include <ctime>

#include "common/http/http_freshness.h"
#include "fs/ghostfs_internal.h"

namespace ghost {
namespace {

constexpr double kAttrTimeout = 1.0;


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

const char kListingPrefix[] = "listing:";
// A read this far beyond the bytes that have arrived gets its own range request, in pieces
// of at least kRangePiece.
constexpr Bytes kReadAheadGap = 1 << 20;
constexpr Bytes kRangePiece = 1 << 20;

}  // namespace

std::string Daemon::OriginUrl(const Node* n) const {
  std::string url = options_.origins[n->origin].url;
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
void Daemon::DropUnopenableNames(const std::string& url, std::vector<DirEntry>* entries) {
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

void Daemon::WithListing(int origin, const std::string& dir, std::function<void(Result<const Listing*>)> then) {
  Node probe;
  probe.kind = NodeKind::kOriginDir;
  probe.origin = origin;
  probe.path = dir;
  std::string url = OriginUrl(&probe);
  auto it = listings_.find(url);
  if (it != listings_.end() && it->second.expires > clock_->Now()) return then(&it->second);

  auto body = std::make_shared<std::string>();
  auto status = std::make_shared<int>(0);
  HttpFetcher::Callbacks cb;
  cb.on_head = [status](const HttpResponseHead& h) {
    *status = h.status;
    return true;
  };
  cb.on_data = [body](std::string_view d) {
    if (body->size() + d.size() > (16u << 20)) return false;  // no listing is 16 MiB
    body->append(d);
    return true;
  };
  cb.on_done = [this, url, body, status, then](Status s) {
    if (s.ok() && *status == 200) {
      Result<std::vector<DirEntry>> entries = ParseAutoindex(*body);
      if (entries.ok()) {
        DropUnopenableNames(url, &*entries);
        Listing& l = listings_[url];
        l.entries = std::move(entries).value();
        l.expires = clock_->Now() + options_.heuristic_freshness;
        l.from_saved = false;
        // Saved with the cache, so the tree can be listed offline.
        QueueWholeFill(kListingPrefix + url, std::move(*body), "text/html");
        return then(&l);
      }
      std::fprintf(stderr, "ghostfs: %s: %s\n", url.c_str(), entries.status().message().c_str());
      return then(Status::NotSupported(url + " is not an HTML directory listing"));
    }
    // Offline or failing: the listing we had, or the saved one.
    auto have = listings_.find(url);
    if (have != listings_.end() && *status != 404) return then(&have->second);
    std::string key = kListingPrefix + url;
    const CacheEntry* saved = store_->index().Find(key);
    if (!saved || *status == 404) {
      if (*status == 404) return then(Status::NotFound(url));
      return then(s.ok() ? OriginHttpStatus(url, *status)  // 401/403: EACCES (origin_health.h)
                         : Status::Unavailable(url + ": " + s.message()).WithErrno(OriginErrno(s, 0)));
    }
    auto buf = std::make_shared<std::string>(saved->size, '\0');
    store_->ReadBody(key, 0, std::span<char>(buf->data(), buf->size()),
                     [this, url, buf, then](Result<std::size_t> n) {
                       if (!n.ok()) return then(n.status());
                       buf->resize(*n);
                       Result<std::vector<DirEntry>> entries = ParseAutoindex(*buf);
                       if (!entries.ok()) return then(entries.status());
                       DropUnopenableNames(url, &*entries);
                       Listing& l = listings_[url];
                       l.entries = std::move(entries).value();
                       l.expires = clock_->Now();  // stale: try the origin again next time
                       l.from_saved = true;
                       then(&l);
                     });
  };
  HttpRequest rq;
  rq.url = url;
  http_->Fetch(std::move(rq), std::move(cb));
}

namespace {

struct stat FileStat(fuse_ino_t ino, Bytes size, std::optional<std::int64_t> mtime) {
  struct stat st {};
  st.st_ino = ino;
  st.st_mode = S_IFREG | 0444;
  st.st_nlink = 1;
  st.st_size = static_cast<off_t>(size);
  st.st_blocks = static_cast<blkcnt_t>((size + 511) / 512);
  st.st_uid = getuid();
  st.st_gid = getgid();
  if (mtime) st.st_mtim.tv_sec = *mtime;
  return st;
}

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
const CacheEntry* Daemon::MountEntry(const std::string& url) const {
  const CacheEntry* e = store_->index().Find(url);
  if (!e || e->response.empty()) return e;
  nlohmann::json head = nlohmann::json::parse(e->response, nullptr, /*allow_exceptions=*/false);
  if (!head.is_object() || head.value("status", 0) != 200) return nullptr;
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
std::optional<std::int64_t> Daemon::FileMtime(const DirEntry* listed, const CacheEntry* cached) const {
  if (listed && listed->mtime_unix) return listed->mtime_unix;
  if (cached) return ParseHttpDate(cached->last_modified);
  return std::nullopt;
}

const DirEntry* Daemon::ListedEntry(const Node* n) const {
  Node dir;
  dir.kind = NodeKind::kOriginDir;
  dir.origin = n->origin;
  dir.path = DirOf(n->path);
  auto it = listings_.find(OriginUrl(&dir));
  return it == listings_.end() ? nullptr : FindEntry(it->second, BaseOf(n->path));
}

void Daemon::OriginLookup(fuse_req_t req, Node* parent, const char* name_c) {
  std::string name = name_c;
  int origin = parent->origin;
  std::string dir = parent->path;
  WithListing(origin, dir, [this, req, origin, dir, name](Result<const Listing*> l) {
    if (!l.ok()) return (void)fuse_reply_err(req, l.status().ToErrno());
    const DirEntry* e = FindEntry(**l, name);
    if (!e) return (void)fuse_reply_err(req, ENOENT);
    std::string path = InodeTable::Join(dir, name);
    if (e->is_dir) {
      Node* n = inodes_.Lookup(NodeKind::kOriginDir, origin, path);
      return ReplyEntry(req, n, DirStat(n->ino));
    }
    Node* n = inodes_.Lookup(NodeKind::kOriginFile, origin, path);
    std::string url = OriginUrl(n);
    // The cached copy's size is exact; a listing's may be missing (Apache's "1.2K").
    const CacheEntry* cached = MountEntry(url);
    std::optional<Bytes> size = cached ? std::optional<Bytes>(cached->size) : e->size;
    if (size) return ReplyEntry(req, n, FileStat(n->ino, *size, FileMtime(e, cached)));
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
      Node* node = inodes_.Find(ino);
      if (!node) return (void)fuse_reply_err(req, ENOENT);
      // Unknown length: 0 until read (like /proc); reads go past it with direct_io.
      ReplyEntry(req, node, FileStat(ino, length->value_or(0), mtime));
    };
    http_->Fetch(std::move(head), std::move(cb));
  });
}

void Daemon::OriginGetattr(fuse_req_t req, Node* n) {
  if (n->kind == NodeKind::kOriginDir) return (void)fuse_reply_attr(req, &static_cast<const struct stat&>(DirStat(n->ino)), kAttrTimeout);
  std::string url = OriginUrl(n);
  // Served from memory: the cache index or the parent's listing; no disk, no network.
  const CacheEntry* c = MountEntry(url);
  if (c) {
    struct stat st = FileStat(n->ino, c->size, FileMtime(ListedEntry(n), c));
    return (void)fuse_reply_attr(req, &st, kAttrTimeout);
  }
  if (auto s = streams_.find(url); s != streams_.end() && s->second->size) {
    struct stat st = FileStat(n->ino, *s->second->size, FileMtime(ListedEntry(n), nullptr));
    return (void)fuse_reply_attr(req, &st, kAttrTimeout);
  }
  fuse_ino_t ino = n->ino;
  std::string name = BaseOf(n->path);
  WithListing(n->origin, DirOf(n->path), [this, req, ino, name](Result<const Listing*> l) {
    if (!l.ok()) return (void)fuse_reply_err(req, l.status().ToErrno());
    const DirEntry* e = FindEntry(**l, name);
    if (!e) return (void)fuse_reply_err(req, ENOENT);
    struct stat st = FileStat(ino, e->size.value_or(0), e->mtime_unix);
    fuse_reply_attr(req, &st, kAttrTimeout);
  });
}

void Daemon::OriginReaddir(fuse_req_t req, Node* n, size_t size, off_t off) {
  fuse_ino_t ino = n->ino;
  WithListing(n->origin, n->path, [req, ino, size, off](Result<const Listing*> l) {
    if (!l.ok()) return (void)fuse_reply_err(req, l.status().ToErrno());
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
      for (const DirEntry& e : (*l)->entries) {
        if (!add(e.name, e.is_dir ? S_IFDIR : S_IFREG)) break;
      }
    }
    fuse_reply_buf(req, buf.data(), used);
  });
}

void Daemon::OriginOpen(fuse_req_t req, Node* n, fuse_file_info* fi) {
  std::string url = OriginUrl(n);
  fuse_ino_t ino = n->ino;
  fuse_file_info info = *fi;
  const CacheEntry* cached = MountEntry(url);
  TimePoint now = clock_->Now();

  auto open_handle = [this, req, info, url, ino](const std::string& source,
                                                 std::shared_ptr<Stream> stream) mutable {
    Handle h;
    h.kind = NodeKind::kOriginFile;
    h.ino = ino;
    h.key = url;
    h.source = source;
    // A network read's length may differ from what stat said; let reads go to EOF.
    info.direct_io = source == "network" ? 1 : 0;
    info.keep_cache = source == "disk" || source == "memory" ? 1 : 0;
    std::optional<int> backing;
    // Which version of the body this handle reads (one, from open to release).
    std::string version;
    if (source == "disk") {
      // Opened once per open file, not per read; stays readable even if evicted meanwhile.
      h.fd = ::open(store_->BodyPath(url).c_str(), O_RDONLY | O_CLOEXEC);
      if (h.fd < 0) return (void)fuse_reply_err(req, errno == ENOENT ? EIO : errno);
      // Whole-object reads are the rule: let the kernel read ahead twice as far on the body.
      posix_fadvise(h.fd, 0, 0, POSIX_FADV_SEQUENTIAL);
      store_->Touch(url);
      // The cost model chose the disk for this open: the kernel may read the body file itself
      // (a committed body is complete and never rewritten: a replacement is a new file).
      const CacheEntry* e = MountEntry(url);
      struct stat body;
      if (fstat(h.fd, &body) == 0) {
        h.fd_size = static_cast<Bytes>(body.st_size);
        h.fd_size_known = true;
        version = "d" + std::to_string(body.st_ino) + "-" + std::to_string(body.st_size);
      }
      if (e && h.fd_size_known && h.fd_size == e->size) {
        backing = passthrough_->Acquire(ino, h.fd);
      }
      if (!backing && h.fd_size_known) StartPrefetch(h, h.fd_size);
    } else if (source == "memory") {
      if (auto q = queued_bodies_.find(url); q != queued_bodies_.end()) {
        h.body = q->second.data;
        version = "q" + std::to_string(q->second.version);
      }
    }
    if (!backing && !info.direct_io && !PageCacheMayServe(ino, version, &info)) {
      // Another version is in (or may be in) the kernel's pages of this inode: read this
      // one past them.
      info.direct_io = 1;
      info.keep_cache = 0;
    }
    if (!info.direct_io && !backing) h.page_counted = true;
    h.io_mode = backing ? IoMode::kPassthrough : info.direct_io ? IoMode::kDirect : IoMode::kCached;
    if (!backing && (backing = passthrough_->JoinBacking(ino))) {
      // Passthrough opens of this inode (of another body) are active: the kernel fails any
      // open of it without the flag, so this one carries it with direct_io (reads come here).
      info.direct_io = 1;
      info.keep_cache = 0;
      h.io_mode = IoMode::kDirectJoined;
    }
    h.stream = std::move(stream);
    if (h.stream) ++h.stream->opens;
    info.fh = next_fh_++;
    std::uint64_t fh = info.fh;
    // From its open on, the window keeps what this reader has not read yet.
    if (h.stream && h.stream->windowed) h.stream->readers.try_emplace(fh, h.stream->base);
    IoMode mode = h.io_mode;
    handles_[fh] = std::move(h);
    if (mode == IoMode::kCached) passthrough_->CachedOpened(ino);
    ++requests_by_source_[source];
    if (control_ && control_->Subscribed("stats")) control_->Publish("stats", StatsJson());
    int sent =
        backing ? passthrough_->ReplyOpen(req, &info, *backing) : fuse_reply_open(req, &info);
    if (sent == -ENOENT) {
      // The open was interrupted: the kernel forgot it, and no release will come.
      auto it = handles_.find(fh);
      if (it != handles_.end()) {
        if (it->second.fd >= 0) close(it->second.fd);
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
    if (running != streams_.end() && validator_etag.empty() && running->second->base == 0) {
      decisions_[ino].source = "network";
      return open_handle("network", running->second);
    }
    auto st = std::make_shared<Stream>();
    st->key = url;
    streams_[url] = st;
    auto opened = std::make_shared<bool>(false);
    HttpRequest rq;
    rq.url = url;
    rq.if_none_match = validator_etag;
    rq.if_modified_since = validator_date;
    bool revalidating = !validator_etag.empty() || !validator_date.empty();
    // The emulated card carries the transfer (its mode decides the delay, DESIGN §7).
    DiscloseTransferBegin();
    HttpFetcher::Callbacks cb;
    cb.on_head = [this, st, opened, open_handle, req, ino, url, revalidating](const HttpResponseHead& h) mutable {
      if (revalidating && h.status == 304) {
        // Still good: refresh the copy's freshness and read it from the disk.
        FreshnessInfo f = ComputeFreshness(h, clock_->Now(), UnixNow(), options_.heuristic_freshness);
        (void)store_->UpdateMeta(url, [&](CacheEntry& e) {
          e.expires = f.fresh_until;
          if (!h.etag.empty()) e.etag = h.etag;
        });
        // The index row reaches sqlite with the next write batch (DESIGN §3.5): one page.
        WriteRecord r;
        r.key = "index:" + url;
        r.length = kIndexRowBytes;
        queue_->Add(std::move(r));
        streams_.erase(url);
        st->no_body = true;
        *opened = true;
        decisions_[ino].source = "revalidated";
        open_handle("disk", nullptr);
        ++requests_by_source_["revalidated"];
        return false;  // no body to wait for
      }
      if (h.status != 200) {
        st->status = Status::IoError(url + ": HTTP " + std::to_string(h.status));
        st->no_body = true;
        *opened = true;
        streams_.erase(url);
        if (h.status >= 500 && MountEntry(url)) {
          // stale-if-error (RFC 5861): a failing origin does not hide the copy we have.
          std::fprintf(stderr, "ghostfs: %s answered HTTP %d; serving the cached copy (stale)\n", url.c_str(),
                       h.status);
          ++requests_by_source_["stale"];
          decisions_[ino].source = "stale";
          open_handle("disk", nullptr);
          return false;
        }
        fuse_reply_err(req, ErrnoFor(Status::Ok(), h.status));
        return false;
      }
      st->size = h.content_length;
      st->replaces = revalidating;
      st->windowed = true;
      FreshnessInfo f = ComputeFreshness(h, clock_->Now(), UnixNow(), options_.heuristic_freshness);
      st->storable = f.storable;
      st->meta.etag = h.etag;
      st->meta.last_modified = h.last_modified;
      st->meta.content_type = h.content_type;
      st->meta.expires = f.fresh_until;
      st->fill_wanted = st->storable && (!MountEntry(url) || st->replaces);
      // Too big to wait in the write queue: written to the store as it arrives.
      if (st->fill_wanted && st->size && *st->size > kMaxQueuedFill) StreamToFill(st, {});
      *opened = true;
      decisions_[ino].source = "network";
      open_handle("network", st);
      return true;
    };
    cb.on_data = [this, st](std::string_view d) {
      st->data.append(d);
      bytes_from_network_ += d.size();
      if (st->fill_wanted) StreamToFill(st, d);
      ServeStream(*st);
      TrimStream(*st);  // pauses the fetch while the window is full
      return true;
    };
    cb.on_done = [this, st, opened, req, url, cached, open_handle](Status s) mutable {
      DiscloseTransferEnd();
      if (st->no_body) return;
      st->done = true;
      st->status = s;
      if (streams_.count(url) && streams_[url] == st) streams_.erase(url);
      if (!*opened) {
        *opened = true;
        // Unreachable: serve the cached copy if there is one (stale), else a clear errno.
        if (cached && MountEntry(url)) {
          std::fprintf(stderr, "ghostfs: %s unreachable (%s); serving the cached copy (stale)\n", url.c_str(), s.message().c_str());
          ++requests_by_source_["stale"];
          return open_handle("disk", nullptr);
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
    st->fetch = http_->Fetch(std::move(rq), std::move(cb));
    // The emulated card carries the same transfer; data reaches readers once both the real
    // bytes and the card's modelled delay (mode change, beacons, DESIGN §7) are through.
    Bytes expected = listed_size;
    if (const CacheEntry* e = MountEntry(url)) expected = e->size;
    net_->Submit({expected, false}, [this, st] {
      st->emulated_ready = true;
      ServeStream(*st);
    });
  };

  // The cache manager decides (common/cache/cache_manager.h): a fill still waiting in the
  // write queue is read from memory (DESIGN §3.5), a stale copy is revalidated, a fresh one
  // goes to the cost model (which may hint the ideal device).
  ObjectState state;
  state.on_disk = cached != nullptr;
  state.in_write_queue = queue_->Contains("fill:" + url);
  state.fresh = cached && cached->expires && *cached->expires + options_.max_stale > now;
  state.size = cached ? cached->size : 0;
  ReadDecision d = manager_->DecideRead(state);
  if (d.costed) decisions_[ino].cost = CostJson(d.choice);
  switch (d.source) {
    case ReadSource::kWriteQueue:
    case ReadSource::kMemory:
      decisions_[ino].source = ReadSourceName(d.source);
      return open_handle("memory", nullptr);
    case ReadSource::kRevalidate:
      return from_network(cached->etag, cached->last_modified);
    case ReadSource::kDisk:
    case ReadSource::kFlash:
      decisions_[ino].source = "disk";
      store_->Touch(url);
      return open_handle("disk", nullptr);
    case ReadSource::kNetwork:
      return from_network("", "");
  }
}

nlohmann::json Daemon::CostJson(const Choice& c) const {
  nlohmann::json cost = nlohmann::json::object();
  for (const SourceEstimate& e : c.candidates) {
    cost[SourceName(e.holder.source)] = {{"time_ms", ToMillis(e.time)}, {"energy_j", e.energy.joules()}, {"cost", e.cost}};
  }
  cost["knob"] = pm_->knob();
  cost["chosen"] = SourceName(c.chosen.holder.source);
  cost["ideal"] = SourceName(c.ideal.holder.source);
  cost["ghost_hint"] = c.hinted;
  return cost;
}

void Daemon::OriginRead(fuse_req_t req, Handle& h, size_t size, off_t off, std::uint64_t h_fh) {
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
  if (h.source == "memory" && !h.body) {
    // Opened before the fill was queued (mail): the version queued now, for good.
    if (auto q = queued_bodies_.find(h.key); q != queued_bodies_.end()) h.body = q->second.data;
  }
  if (h.body) {
    // The one version of the queued fill this handle opened.
    const std::string& body = *h.body;
    std::size_t from = static_cast<std::size_t>(std::min<Bytes>(offset, body.size()));
    std::size_t n = std::min<std::size_t>(size, body.size() - from);
    return (void)fuse_reply_buf(req, body.data() + from, n);
  }
  if (h.source == "memory") {
    // Flushed before the first read: the copy is on the disk now, or about to be.
    if (writing_fills_.count(h.key)) {
      std::uint64_t fh = h_fh;
      return WhenFillSettles(h.key, [this, req, fh, size, off] {
        auto it = handles_.find(fh);
        if (it == handles_.end()) return (void)fuse_reply_err(req, EBADF);
        OriginRead(req, it->second, size, off, fh);
      });
    }
    if (!store_->index().Find(h.key)) return (void)fuse_reply_err(req, EIO);
    h.source = "disk";
    h.fd = ::open(store_->BodyPath(h.key).c_str(), O_RDONLY | O_CLOEXEC);
    if (h.fd < 0) return (void)fuse_reply_err(req, EIO);
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
      bytes_from_cache_ += n;
      return (void)fuse_reply_buf(req, p->data.data() + offset, n);
    }
    if (!p->ok || offset >= p->data.size()) h.prefetch.reset();  // done with it
  }
  // From the disk cache (through io_uring), with the emulated disk doing the same work.
  // The size of the body this handle opened (it stays readable if evicted or replaced
  // meanwhile; the index describes the current version, which may be another file).
  if (!h.fd_size_known) {
    struct stat st;
    if (fstat(h.fd, &st) != 0) return (void)fuse_reply_err(req, errno);
    h.fd_size = static_cast<Bytes>(st.st_size);
    h.fd_size_known = true;
  }
  Bytes body_size = h.fd_size;
  if (offset >= body_size) return (void)fuse_reply_buf(req, nullptr, 0);
  std::size_t want = static_cast<std::size_t>(std::min<Bytes>(size, body_size - offset));
  bytes_from_cache_ += want;
  bool emulated = !options_.profile.empty();
  auto buf = std::make_shared<std::string>(want, '\0');
  // Bytes already in the page cache are copied here without blocking (RWF_NOWAIT fails with
  // EAGAIN rather than wait for the disk); only the rest goes through io_uring. A warm read
  // then costs no thread hand-offs at all.
  std::size_t have = 0;
  if (!emulated) {
    iovec iov{buf->data(), want};
    ssize_t n = preadv2(h.fd, &iov, 1, off, RWF_NOWAIT);
    if (n > 0) have = static_cast<std::size_t>(n);
    if (have == want) return (void)fuse_reply_buf(req, buf->data(), want);
  }
  auto result = std::make_shared<Result<std::size_t>>(Status::Internal("unset"));
  auto reply = [req, buf, result, have] {
    if (!result->ok()) return (void)fuse_reply_err(req, result->status().ToErrno());
    fuse_reply_buf(req, buf->data(), have + **result);
  };
  auto pending = std::make_shared<int>(emulated ? 2 : 1);
  auto finish = [pending, reply] {
    if (--*pending == 0) reply();
  };
  if (emulated) disk_->Submit({want, false}, finish);  // the emulated disk does the same work
  io_->Read(h.fd, offset + have, std::span<char>(buf->data() + have, want - have), [result, finish](Result<std::size_t> n) {
    *result = std::move(n);
    finish();
  });
}

void Daemon::StartPrefetch(Handle& h, Bytes size) {
  // The emulated disk is charged per read (OriginRead); a prefetch would bypass it.
  if (!options_.profile.empty() || size == 0) return;
  auto p = std::make_shared<Prefetch>();
  p->data.resize(static_cast<std::size_t>(std::min<Bytes>(size, kPrefetchBytes)));
  h.prefetch = p;
  iovec iov{p->data.data(), p->data.size()};
  ssize_t n = preadv2(h.fd, &iov, 1, 0, RWF_NOWAIT);  // in the page cache: no I/O at all
  if (n == static_cast<ssize_t>(p->data.size())) {
    p->done = p->ok = true;
    return;
  }
  io_->Read(h.fd, 0, std::span<char>(p->data.data(), p->data.size()), [p](Result<std::size_t> r) {
    p->done = true;
    p->ok = r.ok();
    if (r.ok()) p->data.resize(*r);
    auto waiters = std::move(p->waiters);
    for (auto& w : waiters) w();
  });
}

void Daemon::ReadAhead(fuse_req_t req, std::shared_ptr<Stream> st, Bytes offset, std::size_t size) {
  Bytes len = std::max<Bytes>(size, kRangePiece);
  if (st->size) len = std::min<Bytes>(len, *st->size - offset);
  HttpRequest rq;
  rq.url = st->key;
  rq.range = std::make_pair(offset, offset + len - 1);
  // Only a range of the version being streamed (a weak tag cannot validate a range).
  rq.if_range = !st->meta.etag.empty() && !st->meta.etag.starts_with("W/") ? st->meta.etag : st->meta.last_modified;
  auto piece = std::make_shared<std::string>();
  auto ok = std::make_shared<bool>(false);
  HttpFetcher::Callbacks cb;
  cb.on_head = [ok, offset](const HttpResponseHead& h) {
    *ok = h.status == 206 && h.content_range && h.content_range->first == offset;
    return *ok;
  };
  cb.on_data = [piece](std::string_view d) {
    piece->append(d);
    return true;
  };
  cb.on_done = [this, req, st, offset, size, piece, ok](Status s) {
    if (s.ok() && *ok) {
      bytes_from_network_ += piece->size();
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
  http_->Fetch(std::move(rq), std::move(cb));
}

void Daemon::ServeStream(Stream& st) {
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
      fuse_reply_err(w.req, EIO);  // fell behind the window, or the fetch failed short
    } else {
      Bytes from = std::min<Bytes>(w.offset, end);
      std::size_t n = static_cast<std::size_t>(std::min<Bytes>(w.size, end - from));
      fuse_reply_buf(w.req, st.data.data() + (from - st.base), n);
      if (auto r = st.readers.find(w.fh); r != st.readers.end()) r->second = std::max(r->second, from + n);
    }
    it = st.waiters.erase(it);
  }
}

void Daemon::TrimStream(Stream& st) {
  if (!st.windowed) return;
  // Bytes every open reader has passed, and no waiter needs, leave memory (the store fill has
  // its own copy of them in flight).
  Bytes keep_from = st.received();
  for (const auto& [fh, pos] : st.readers) keep_from = std::min(keep_from, pos);
  for (const Stream::Waiter& w : st.waiters) keep_from = std::min(keep_from, w.offset);
  if (keep_from > st.base) {
    std::size_t drop = static_cast<std::size_t>(std::min<Bytes>(keep_from - st.base, st.data.size()));
    st.data.erase(0, drop);
    st.base += drop;
    if (st.data.capacity() > 2 * kStreamWindow) st.data.shrink_to_fit();
  }
  bool full = st.data.size() >= kStreamWindow || st.fill_in_flight >= kStreamWindow;
  if (st.done || st.fetch == 0) return;
  if (full != st.paused && http_->Pause(st.fetch, full)) st.paused = full;
}

// The fill of a streamed body: small ones are kept whole and go through the write queue at
// the end (deferred while the disk sleeps, DESIGN §3.5); from kMaxQueuedFill on, the body is
// written to the store as it arrives (the queue would spin the disk up for it anyway), so no
// copy of it stays in memory.
void Daemon::StreamToFill(const std::shared_ptr<Stream>& sp, std::string_view d) {
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
    Result<FillId> id = store_->BeginFill(st.key, meta);
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
  store_->AppendFill(id, std::move(piece), [this, weak, n, id](Status s) {
    std::shared_ptr<Stream> sp = weak.lock();
    if (!sp) return;
    sp->fill_in_flight -= n;
    if (!s.ok() && !sp->fill_failed) {
      // Disk full or failing: the body still streams to its readers, it is just not cached.
      std::fprintf(stderr, "ghostfs: not caching %s: %s\n", sp->key.c_str(), s.ToString().c_str());
      sp->fill_failed = true;
      if (sp->fill_id == id) sp->fill_id.reset();
      store_->AbortFill(id);
    }
    TrimStream(*sp);
  });
}

void Daemon::FinishStreamFill(const std::shared_ptr<Stream>& sp, bool complete) {
  Stream& st = *sp;
  if (!st.fill_wanted || st.fill_failed) return;
  const std::string url = st.key;
  // Another read may have cached it meanwhile; a revalidation's new body replaces it.
  bool wanted = complete && (!MountEntry(url) || st.replaces);
  if (st.small) {
    if (wanted) QueueFill(url, st.meta, std::move(st.small_body));
    std::string().swap(st.small_body);
    return;
  }
  if (!st.fill_id) return;
  if (wanted) StreamToFill(sp, {});  // the last piece
  if (!st.fill_id) return;           // it could not be handed over
  FillId id = *st.fill_id;
  st.fill_id.reset();
  std::string().swap(st.fill_pending);
  if (!wanted) return store_->AbortFill(id);
  // The emulated disk does the work of the writes (DESIGN §7), as for a queued fill.
  disk_->Submit({st.received(), true}, [] {});
  ++writing_fills_[url];
  store_->CommitFill(id, [this, url](Status c) {
    if (!c.ok()) {
      std::fprintf(stderr, "ghostfs: not caching %s: %s\n", url.c_str(), c.ToString().c_str());
    } else {
      FillCommitted(url);
    }
    FillSettled(url);
  });
}

void Daemon::OriginRelease(Handle& h) {
  if (h.io_mode == IoMode::kPassthrough || h.io_mode == IoMode::kDirectJoined) {
    passthrough_->ReleasePassthrough(h.ino);
  }
  if (h.io_mode == IoMode::kCached) passthrough_->CachedReleased(h.ino);
  if (h.page_counted) {
    auto pv = page_versions_.find(h.ino);
    if (pv != page_versions_.end()) --pv->second.opens;
    h.page_counted = false;
  }
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

// May a cached-mode (page cache) open of `ino` read body version `version`? The kernel keeps
// one set of pages and one size per inode: they may serve only one version, and only once the
// kernel's attributes (attr timeout) can no longer carry the previous version's size. Sets
// keep_cache: the pages are kept only when they are of this version.
bool Daemon::PageCacheMayServe(fuse_ino_t ino, const std::string& version, fuse_file_info* info) {
  if (version.empty()) return false;
  TimePoint now = clock_->Now();
  const Duration settle = Seconds(kAttrTimeout + 0.5);
  auto [it, fresh] = page_versions_.try_emplace(ino);
  PageVersion& pv = it->second;
  if (fresh || pv.version != version) {
    if (pv.opens > 0) return false;  // readers of the other version are still open
    // No reader of the old version: this one becomes the inode's version once the kernel's
    // size has had time to follow; until then reads bypass the pages.
    pv.version = version;
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

std::optional<std::string> Daemon::OriginXattr(Node* n, const std::string& name) {
  std::string url = OriginUrl(n);
  const CacheEntry* e = MountEntry(url);
  auto d = decisions_.find(n->ino);
  if (name == "user.ghost.cached") return std::string(e ? "1" : "0");
  if (name == "user.ghost.source") return d == decisions_.end() || d->second.source.empty() ? std::string("none") : d->second.source;
  if (name == "user.ghost.cost") {
    if (d == decisions_.end() || d->second.cost.is_null()) return std::nullopt;
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

void Daemon::FillSettled(const std::string& key) {
  auto w = writing_fills_.find(key);
  if (w == writing_fills_.end() || --w->second > 0) return;
  writing_fills_.erase(w);
  auto waiters = fill_waiters_.extract(key);
  if (waiters.empty()) return;
  for (auto& fn : waiters.mapped()) fn();
}

void Daemon::WhenFillSettles(const std::string& key, std::function<void()> fn) {
  if (!writing_fills_.count(key)) return fn();
  fill_waiters_[key].push_back(std::move(fn));
}

void Daemon::FillCommitted(const std::string& key) {
  if (control_) control_->Publish("stats", StatsJson());
  (void)key;
}

}  // namespace ghost
