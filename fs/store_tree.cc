// The shared store: MOUNTPOINT/.ghost/, through which ghostproxy uses this daemon's cache
// (DESIGN §3.4, §4; the proxy's side is proxy/ghostfs_backend.cc).
//
// One cache, one owner: the daemon keeps the index, the bodies, the byte cap, the write queue
// and the power model; the proxy speaks HTTP and decides what is cacheable. They meet in two
// places:
//   - the control socket (common/control/control.h): "lookup" answers whether a key is cached, its
//     stored response head and where the cost model says to read it from right now (sending
//     the disk a ghost hint when the network wins); "store" opens a fill; "refresh" replaces
//     a stored head after a 304; "invalidate" drops a key; "transfer" has the emulated card
//     carry the proxy's own fetches (below);
//   - this directory: .ghost/objects/<hash>@<version> reads one version of a cached body
//     (hash = hex SHA-256 of the key; version d<inode>-<size> of the body file or q<n> of a
//     fill still queued: the name a "lookup" returns, which opens only while that version is
//     current; an opened file stays that version to its close, as does the "body_path" file,
//     since a replacement is a new file renamed over the name), through the same read path as
//     an origin file — the
//     write queue's copy while its fill waits, else the disk via io_uring, with the emulated
//     disk doing the same work; .ghost/fill/<token> (from "store") takes the body's bytes,
//     and closing it hands the fill to the write queue like any fill of ghostfs's own, so a
//     sleeping disk is not woken for it (DESIGN §3.5).
//
// Charging the emulated devices as ghostsim does (common/sim/simulator.cc): a "lookup" that
// chooses the disk is answered once the emulated disk has done the read (a spin-up included),
// so the proxy's client waits what the simulated client waits; the proxy then reads the body
// file, from the kernel's page cache or the real disk. Objects read or filled recently are in
// a RAM page-cache model of the simulator's size (LRU, 8 MiB): a lookup that finds one there
// is served from memory and costs the disk nothing, as the simulator counts it. A proxy fetch
// from an origin is a "transfer": "begin" discloses it to the network module and starts the
// card's round trips; "data" (once the reply head gives the body's size) has the card carry
// the body ("upload": true: bytes the proxy sent, an IMAP APPEND's message, carried at the
// link's upload rate) and answers when it has, so the proxy holds the response's last byte until both the
// real bytes and the card's modelled transfer are through (they overlap, as in the mount's
// read path); "end" closes it. The proxy's fills go through the write queue: deferred while
// the disk sleeps under adaptive, written at once under static (the disk's policy decides).
// .ghost/ is not listed in the mount's root, and nothing in it can be created, renamed or
// removed by name: only the control socket makes names appear.
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <array>
#include <random>
#include <utility>
#include <variant>

#include "fs/store_tree.h"

#include "common/config/config.h"
#include "common/control/protocol.h"
#include "fs/origin_tree.h"
#include "fs/write_back.h"

namespace ghost {

namespace {

constexpr const char* kObjectsDir = "objects";
constexpr const char* kFillDir = "fill";
// A body handed over through .ghost/fill is held in memory until its fill is queued: bigger
// ones are refused (the proxy then serves without storing).
constexpr Bytes kMaxStoreFill = 256ull << 20;

std::string After(const std::string& path, const char* dir) {
  std::string prefix = std::string(dir) + "/";
  return path.starts_with(prefix) ? path.substr(prefix.size()) : std::string();
}

// .ghost/objects/<hash>@<version> names one version of an object (see StoreVersion); the
// plain <hash> whatever version is current when it is opened.
std::pair<std::string, std::string> SplitVersion(const std::string& name) {
  auto at = name.find('@');
  if (at == std::string::npos) return {name, ""};
  return {name.substr(0, at), name.substr(at + 1)};
}

// The version of a body file: its inode and size (a replacement is a new file, renamed over).
std::string FileVersion(const struct stat& st) {
  return "d" + std::to_string(st.st_ino) + "-" + std::to_string(st.st_size);
}

}  // namespace

StoreTree::StoreTree(TreeContext ctx, OriginTree& reads) : ctx_(std::move(ctx)), reads_(reads) {}

std::string StoreTree::StoreName(const std::string& key) const {
  std::string body = ctx_.store.BodyPath(key);
  return body.substr(body.rfind('/') + 1);
}

struct stat StoreTree::StoreStat(const Node* n) const {
  struct stat st {};
  st.st_ino = n->ino;
  st.st_uid = getuid();
  st.st_gid = getgid();
  if (n->kind == NodeKind::kStoreDir) {
    st.st_mode = S_IFDIR | 0500;
    st.st_nlink = 2;
    return st;
  }
  st.st_nlink = 1;
  if (n->kind == NodeKind::kStoreFill) {
    st.st_mode = S_IFREG | 0200;
    auto f = store_fills_.find(After(n->path, kFillDir));
    if (f != store_fills_.end()) st.st_size = static_cast<off_t>(f->second.data.size());
    return st;
  }
  st.st_mode = S_IFREG | 0400;
  const auto [hash, version] = SplitVersion(After(n->path, kObjectsDir));
  auto k = store_keys_.find(hash);
  if (k != store_keys_.end()) {
    // The size of the version the name opens (Open): a queued fill's, unless it names a body
    // file, whose version carries its size. The kernel keeps it as i_size, and an io_uring
    // read of a direct_io file from at or past i_size returns 0 (a read of a longer queued body
    // under the disk's shorter size ended early).
    const QueuedBody* q = ctx_.write_back.QueuedBodyOf(k->second);
    const CacheEntry* e = ctx_.store.index().Find(k->second);
    const auto dash = version.rfind('-');
    if (q && (version.empty() || version[0] == 'q' || !e)) {
      st.st_size = static_cast<off_t>(q->data->size());
    } else if ((version.starts_with('d') || version.starts_with('p')) && dash != std::string::npos) {
      st.st_size = static_cast<off_t>(std::strtoull(version.c_str() + dash + 1, nullptr, 10));
    } else if (e) {
      st.st_size = static_cast<off_t>(e->size);
    }
  }
  st.st_blocks = (st.st_size + 511) / 512;
  return st;
}

// The object behind .ghost/objects/<name>: cached, or its fill still in the write queue.
const std::string* StoreTree::StoreKey(const std::string& name) const {
  auto k = store_keys_.find(SplitVersion(name).first);
  if (k == store_keys_.end()) return nullptr;
  if (!ctx_.store.index().Find(k->second) && !ctx_.write_back.QueuedBodyOf(k->second)) return nullptr;
  return &k->second;
}

// The version a "lookup" hands out: the queued fill's ("q<n>") while one waits, else the body
// file's ("d<inode>-<size>"); empty if neither exists.
std::string StoreTree::StoreVersion(const std::string& key) const {
  if (const QueuedBody* q = ctx_.write_back.QueuedBodyOf(key))
    return "q" + std::to_string(q->version);
  if (!ctx_.store.index().Find(key)) return "";
  if (std::shared_ptr<const std::string> packed = ctx_.store.PackedBody(key)) {
    return CacheStore::PackedVersion(*packed);
  }
  struct stat st;
  if (::stat(ctx_.store.BodyPath(key).c_str(), &st) != 0) return "";
  return FileVersion(st);
}

void StoreTree::Lookup(fuse_req_t req, Node* parent, const char* name_c) {
  std::string name = name_c;
  if (parent->path.empty()) {
    if (name != kObjectsDir && name != kFillDir) return (void)fuse_reply_err(req, ENOENT);
    Node* n = ctx_.inodes.Lookup(NodeKind::kStoreDir, -1, name);
    return ReplyNodeEntry(req, n, StoreStat(n));
  }
  if (parent->path == kObjectsDir) {
    if (!StoreKey(name)) return (void)fuse_reply_err(req, ENOENT);
    Node* n = ctx_.inodes.Lookup(NodeKind::kStoreObject, -1, InodeTable::Join(kObjectsDir, name));
    return ReplyNodeEntry(req, n, StoreStat(n));
  }
  if (!store_fills_.count(name)) return (void)fuse_reply_err(req, ENOENT);
  Node* n = ctx_.inodes.Lookup(NodeKind::kStoreFill, -1, InodeTable::Join(kFillDir, name));
  ReplyNodeEntry(req, n, StoreStat(n));
}

void StoreTree::Getattr(fuse_req_t req, Node* n) {
  struct stat st = StoreStat(n);
  fuse_reply_attr(req, &st, kStoreAttrTimeout);
}

void StoreTree::Readdir(fuse_req_t req, Node* n, size_t size, off_t off, fuse_file_info*) {
  // Only .ghost/ itself lists anything: objects and fills are reached by the names the
  // control socket hands out.
  std::vector<std::pair<std::string, mode_t>> entries;
  if (n->path.empty()) entries = {{kFillDir, S_IFDIR}, {kObjectsDir, S_IFDIR}};
  ReplyDirEntries(req, n->ino, size, off, entries);
}

void StoreTree::Open(fuse_req_t req, Node* n, fuse_file_info* fi) {
  Handle h;
  h.kind = n->kind;
  if (n->kind == NodeKind::kStoreFill) {
    if ((fi->flags & O_ACCMODE) != O_WRONLY) return (void)fuse_reply_err(req, EACCES);
    std::string token = After(n->path, kFillDir);
    auto f = store_fills_.find(token);
    if (f == store_fills_.end() || f->second.handed_over) return (void)fuse_reply_err(req, ENOENT);
    h.key = token;
  } else {
    if ((fi->flags & O_ACCMODE) != O_RDONLY) return (void)fuse_reply_err(req, EACCES);
    const std::string name = After(n->path, kObjectsDir);
    const std::string* key = StoreKey(name);
    if (!key) return (void)fuse_reply_err(req, ENOENT);
    h.key = *key;
    // A reader gets exactly one version: the queued body it shares, or the body file it
    // opened (a replacement renames a new file over it). A name with a version that is no
    // longer current is ENOENT: the reader looks the key up again.
    const std::string version = SplitVersion(name).second;
    const QueuedBody* q = ctx_.write_back.QueuedBodyOf(*key);
    if (q && (version.empty() || version == "q" + std::to_string(q->version))) {
      // Its fill still waits in the write queue, or in the flash log (read back from there).
      h.source = ctx_.write_back.Logged(*key) ? ReadSource::kFlash : ReadSource::kWriteQueue;
      h.body = q->data;
    } else if (std::shared_ptr<const std::string> packed = ctx_.store.PackedBody(*key);
               packed && (version.empty() || version == CacheStore::PackedVersion(*packed))) {
      h.source = ReadSource::kDisk;  // a small body packed in the index, read whole
      h.body = std::move(packed);
      ctx_.store.Touch(*key);
    } else if (ctx_.store.index().Find(*key) && (version.empty() || version[0] == 'd')) {
      h.source = ReadSource::kDisk;
      Result<BodyFile> file = CacheManager::OpenBody(ctx_.store, *key);
      if (!file.ok()) {
        if (file.status().ToErrno() == ENOENT) return (void)fuse_reply_err(req, ENOENT);
        std::fprintf(stderr, "ghostfs: open of %s's body (.ghost/objects): %s; answered EIO\n", key->c_str(),
                     file.status().ToString().c_str());
        return (void)fuse_reply_err(req, EIO);
      }
      if (!file->size_known() || (!version.empty() && file->version() != version)) {
        return (void)fuse_reply_err(req, ENOENT);
      }
      h.file = std::move(file).value();
      ctx_.store.Touch(*key);
    } else {
      return (void)fuse_reply_err(req, ENOENT);
    }
  }
  // The proxy reads each body once, and a key's body can be replaced: no page cache.
  fi->direct_io = 1;
  fi->keep_cache = 0;
  fi->fh = reads_.AddHandle(std::move(h));
  fuse_reply_open(req, fi);
}

void StoreTree::Write(fuse_req_t req, Node*, const char* buf, size_t size, off_t off, fuse_file_info* fi) {
  Handle* hp = reads_.FindHandle(fi->fh);
  if (!hp) return (void)fuse_reply_err(req, EBADF);
  Handle& h = *hp;
  if (h.kind != NodeKind::kStoreFill) return (void)fuse_reply_err(req, EROFS);
  auto f = store_fills_.find(h.key);
  if (f == store_fills_.end() || f->second.handed_over) return (void)fuse_reply_err(req, EBADF);
  std::string& data = f->second.data;
  Bytes end = static_cast<Bytes>(off) + size;
  if (end > kMaxStoreFill) return (void)fuse_reply_err(req, EFBIG);
  if (data.size() < end) data.resize(end);
  data.replace(static_cast<std::size_t>(off), size, buf, size);
  fuse_reply_write(req, size);
}

// The first close of a fill's file hands the body to the write queue (close() returns after
// this, so a "lookup" right after it finds the object).
void StoreTree::StoreHandOver(Handle& h) {
  auto f = store_fills_.find(h.key);
  if (f == store_fills_.end() || f->second.handed_over) return;
  StoreFill& fill = f->second;
  fill.handed_over = true;
  QueueStoreFill(fill.key, std::move(fill.meta), std::move(fill.data));
  store_fills_.erase(f);
}

// One body of the proxy's into the write queue: the fill file's close and an inline "store"
// both end here, so they are queued, committed and announced alike.
void StoreTree::QueueStoreFill(const std::string& key, CacheEntry meta, std::string data) {
  meta.size = data.size();
  ctx_.manager.Remember(key, data.size());
  ctx_.baseline_write(data.size());
  ctx_.write_back.QueueFill(key, std::move(meta), std::move(data));
  reads_.DropKernelCopy(key);  // the mount reads the queued version from now on
  ++store_stats_.fills;
}

// ---- control operations ----

namespace {

// Unix seconds to the daemon clock's time (cache entries keep the clock's time).
TimePoint FromUnix(const Clock& clock, std::int64_t unix_seconds) {
  return clock.Now() + Seconds(static_cast<double>(unix_seconds - UnixNow()));
}

void ReadStoredFields(const nlohmann::json& request, const Clock& clock, CacheEntry* e) {
  if (auto it = request.find("response"); it != request.end()) e->response = it->get<std::string>();
  if (auto it = request.find("etag"); it != request.end()) e->etag = it->get<std::string>();
  if (auto it = request.find("last_modified"); it != request.end()) e->last_modified = it->get<std::string>();
  if (auto it = request.find("content_type"); it != request.end()) e->content_type = it->get<std::string>();
  if (auto it = request.find("expires_unix"); it != request.end()) {
    if (it->is_null()) {
      e->expires.reset();
    } else {
      e->expires = FromUnix(clock, it->get<std::int64_t>());
    }
  }
}

}  // namespace

void StoreTree::Control(const ControlRequest& request, ControlServer::Reply reply) {
  using Handler = void (StoreTree::*)(const ControlRequest&, ControlServer::Reply);
  // The shared store's side of the ops table (common/control/protocol.h).
  static constexpr std::array<std::pair<ControlOp, Handler>, 6> kHandlers = {{
      {ControlOp::kLookup, &StoreTree::ControlLookup},
      {ControlOp::kStore, &StoreTree::ControlStore},
      {ControlOp::kRefresh, &StoreTree::ControlRefresh},
      {ControlOp::kInvalidate, &StoreTree::ControlInvalidate},
      {ControlOp::kTransfer, &StoreTree::ControlTransfer},
      {ControlOp::kServed, &StoreTree::ControlServed},
  }};
  for (const auto& [op, handler] : kHandlers) {
    if (op != request.op) continue;
    // The ops that change what is stored wait, in order, while the fill backlog is over its
    // bound (fs/write_back.h): the proxy's store is answered once its fill fits, and the
    // control server stops reading a client owed too many answers, so the proxy waits too.
    // An invalidate or refresh waits behind the stores before it, which it must follow.
    const bool changes = op == ControlOp::kStore || op == ControlOp::kRefresh || op == ControlOp::kInvalidate;
    if (changes && (ctx_.write_back.OverFillBacklog() || ctx_.write_back.backlog_waiters() > 0)) {
      ++store_stats_.held;
      ++held_now_;
      auto held = std::make_shared<std::pair<ControlArgs, nlohmann::json>>(request.args, request.json);
      return ctx_.write_back.WhenFillBacklogBelow([this, handler, op, held, connection = request.connection,
                                                   reply = std::move(reply)]() mutable {
        --held_now_;
        (this->*handler)(ControlRequest{op, std::move(held->first), held->second, connection}, std::move(reply));
      });
    }
    return (this->*handler)(request, std::move(reply));
  }
  reply.Error(std::string(ControlOpName(request.op)) + ": not an op of the shared store");
}

void StoreTree::ControlLookup(const ControlRequest& request, ControlServer::Reply reply) {
  const ObjectArgs& args = std::get<ObjectArgs>(request.args);
  LookupObject(args.key, std::move(reply), args.begin_transfer, request.connection);
}

nlohmann::json StoreTree::MissJson(bool begin_transfer, std::uint64_t connection, const ControlServer::Reply& reply) {
  LookupResult out;
  if (begin_transfer && reply.pending()) {
    out.transfer = BeginProxyTransfer(connection);
    out.card = !ctx_.options.profile.empty();
  }
  return out.ToJson();
}

void StoreTree::LookupObject(const std::string& key, ControlServer::Reply reply, bool begin_transfer,
                             std::uint64_t connection) {
  if (!objects_published_) {
    // From the first lookup on, a client may hold a copy of what it read in RAM (ghostproxy's
    // MemoryCache): every change to a stored object is pushed to it so it drops that copy.
    objects_published_ = true;
    ctx_.store.SetChangeListener([this](const std::string& changed) { ctx_.object_changed(changed); });
  }
  ++store_stats_.lookups;
  const CacheEntry* e = ctx_.store.index().Find(key);
  // A fill queued and not yet being written (one being written shows up when it commits).
  if (!e && ctx_.write_back.Writing(key)) {
    // Being written right now: answer once it is in the index.
    return ctx_.write_back.WhenFillSettles(key, [this, key, begin_transfer, connection,
                                                 reply = std::move(reply)]() mutable {
      --store_stats_.lookups;
      LookupObject(key, std::move(reply), begin_transfer, connection);
    });
  }
  const CacheEntry* pending = ctx_.write_back.QueuedMeta(key);
  const QueuedBody* queued_body = ctx_.write_back.QueuedBodyOf(key);
  ObjectState state;
  state.in_write_queue = pending != nullptr && queued_body != nullptr;
  // One version per answer. While a fill waits in the write queue, its body is the object
  // (StoreVersion and an open of the plain name give it): the older body on the disk does not
  // hold that version, so it is no holder to cost. (Counting it paired the disk's size and head
  // with the queued body's version and bytes: a reader cut or ran short of the body.)
  state.on_disk = e != nullptr && !state.in_write_queue;
  // The page-cache model: a copy read or written lately is still in RAM.
  state.in_memory = ctx_.manager.InMemory(key);
  LookupResult out;
  if (!state.on_disk && !state.in_write_queue) return reply(MissJson(begin_transfer, connection, reply));
  state.size = state.in_write_queue ? queued_body->data->size() : e->size;
  ctx_.manager.Remember(key, state.size);
  std::string name = StoreName(key);
  store_keys_[name] = key;
  // The version this answer describes: its size and head go with exactly these bytes, and
  // the path (and body_path's inode) open only them.
  const std::string version = StoreVersion(key);
  if (version.empty() || (version[0] == 'q') != state.in_write_queue) return reply(MissJson(begin_transfer, connection, reply));
  out.cached = true;
  out.path = ctx_.mount_path + "/.ghost/objects/" + name + "@" + version;
  out.version = version;
  // What the index knows, so a reader can make a head for objects ghostfs fetched itself.
  const CacheEntry& known = state.in_write_queue ? *pending : *e;
  out.etag = known.etag;
  out.last_modified = known.last_modified;
  out.content_type = known.content_type;
  if (known.expires) {
    out.expires_unix = UnixNow() + static_cast<std::int64_t>(ToSeconds(*known.expires - ctx_.clock.Now()));
  }
  // The same decision an open of an origin file makes (common/cache/cache_manager.h), with
  // the page cache as a holder as in ghostsim.
  ReadDecision d = ctx_.manager.DecideRead(state);
  // A fill spilled to the flash log is read from there (fs/write_back.h).
  if (d.source == ReadSource::kWriteQueue && ctx_.write_back.Logged(key)) d.source = ReadSource::kFlash;
  if (d.source == ReadSource::kWriteQueue || d.source == ReadSource::kFlash) {
    // Its fill still waits in the write queue (or the flash log): nothing to choose.
    const CacheEntry& meta = *pending;
    out.size = state.size;
    out.response = meta.response;
    out.choice = LookupChoice::kDisk;
    out.source = ReadSourceName(d.source);
    out.ghost_hint = false;
    // A small one goes with the answer, as a packed body does: the reader needs no FUSE open
    // and read of its version. Reading the queued copy costs no device either way (OriginRead
    // answers it from memory, uncharged), so the accounting is the same; a copy in the flash
    // log costs its device's read either way.
    if (state.size <= kMaxInlineStoreBytes) out.packed_body = *queued_body->data;
    ++ctx_.reads.requests_by_source[d.source];
    ++store_stats_.hits;
    // One spilled to the flash log and sent with the answer was read from the log: its
    // device does that read (Machine::AddFlash); a larger one is charged when it is read.
    Device* flash = ctx_.machine.flash();
    if (d.source == ReadSource::kFlash && flash != nullptr && out.packed_body && !out.packed_body->empty()) {
      return flash->Submit({out.packed_body->size(), false},
                           [reply = std::move(reply), out = out.ToJsonText()]() mutable { reply.Text(out); });
    }
    return reply.Text(out.ToJsonText());
  }
  const Choice& c = d.choice;
  bool local = IsLocal(d.source);
  // The body file's version names its size: it must be the index's (a body is renamed into
  // place and indexed in one turn of the loop, so they never differ; if they did, the answer
  // would pair one size with another's bytes).
  if (!version.ends_with("-" + std::to_string(e->size))) return reply(MissJson(begin_transfer, connection, reply));
  out.size = e->size;
  out.response = e->response;
  out.choice = local ? LookupChoice::kDisk : LookupChoice::kNetwork;
  out.source = ReadSourceName(d.source);
  out.ghost_hint = c.hinted;
  out.cost = CostJson(c, ctx_.machine.pm());
  ++ctx_.reads.requests_by_source[d.source];
  ++(local ? store_stats_.hits : store_stats_.network_preferred);
  if (!local) {
    ctx_.stats_changed();
    return reply.Text(out.ToJsonText());
  }
  // The cheapest equivalent of reading .ghost/objects/<name>: the body file itself.
  // A packed body has no file of its own: it goes with the answer.
  if (version.empty() || version[0] != 'p') {
    out.body_path = ctx_.store.BodyPath(key);
  } else if (std::shared_ptr<const std::string> packed = ctx_.store.PackedBody(key)) {
    out.packed_body = *packed;
  }
  ctx_.store.Touch(key);
  ctx_.reads.bytes_from_cache += e->size;
  ctx_.stats_changed();
  if (d.source == ReadSource::kMemory || ctx_.options.profile.empty()) return reply.Text(out.ToJsonText());
  // The emulated disk does the read the caller is about to make; the answer waits for it.
  ctx_.machine.storage().Submit({e->size, false},
                [reply = std::move(reply), out = out.ToJsonText()]() mutable { reply.Text(out); });
}

void StoreTree::ControlStore(const ControlRequest& request_args, ControlServer::Reply reply) {
  const nlohmann::json& request = request_args.json;
  const ObjectArgs& args = std::get<ObjectArgs>(request_args.args);
  const std::string& key = args.key;
  CacheEntry meta;
  ReadStoredFields(request, ctx_.clock, &meta);
  meta.fetched = ctx_.clock.Now();
  if (args.body) {
    // A small body inline: queued now, as the fill file's close would queue it.
    const Bytes size = args.body->size();
    QueueStoreFill(key, std::move(meta), *args.body);
    ++store_stats_.inline_fills;
    if (args.transfer_end) {
      // The fetch that brought it is over (the transfer op's "end", folded in).
      std::string error;
      if (args.transfer_bytes) error = ProxyTransferData(*args.transfer_end, *args.transfer_bytes, false, [] {});
      if (error.empty()) error = EndProxyTransfer(*args.transfer_end);
      if (!error.empty()) return reply.Error("store: stored, but " + error);
    }
    return reply({{"stored", size}});
  }
  std::uint64_t r = std::random_device{}();
  char token[40];
  std::snprintf(token, sizeof token, "%llu-%016llx", static_cast<unsigned long long>(next_store_token_++),
                static_cast<unsigned long long>(r << 32 ^ std::random_device{}()));
  StoreFill& f = store_fills_[token];
  f.key = key;
  f.meta = std::move(meta);
  return reply({{"path", ctx_.mount_path + "/.ghost/fill/" + token}});
}

void StoreTree::ControlRefresh(const ControlRequest& request_args, ControlServer::Reply reply) {
  const nlohmann::json& request = request_args.json;
  const std::string& key = std::get<ObjectArgs>(request_args.args).key;
  Status s = ctx_.store.UpdateMeta(key, [&](CacheEntry& e) {
    ReadStoredFields(request, ctx_.clock, &e);
    e.fetched = ctx_.clock.Now();
  });
  if (!s.ok()) return reply.Error("refresh: " + s.message());
  // The index row reaches sqlite with the next write batch (DESIGN §3.5).
  ctx_.write_back.QueueIndexUpdate(key);
  ++store_stats_.refreshes;
  return reply(nlohmann::json::object());
}

void StoreTree::ControlTransfer(const ControlRequest& request, ControlServer::Reply reply) {
  StoreTransfer(std::get<TransferArgs>(request.args), request.connection, std::move(reply));
}

void StoreTree::ControlInvalidate(const ControlRequest& request, ControlServer::Reply reply) {
  const std::string& key = std::get<ObjectArgs>(request.args).key;
  // A fill still queued is dropped too: the writer skips fills without their metadata.
  bool queued = ctx_.write_back.DropQueuedFill(key);
  if (queued) ctx_.object_changed(key);
  Status s = ctx_.store.Erase(key);
  if (!s.ok() && s.code() != Status::Code::kNotFound) return reply.Error("invalidate: " + s.message());
  return reply({{"removed", s.ok() || queued}});
}

void StoreTree::ControlServed(const ControlRequest& request, ControlServer::Reply reply) {
  // The checked arguments (protocol.cc ParseServed), not the request's JSON: its "memory" was
  // read with operator[] on a const object, undefined for a missing key (round 19).
  const ServedArgs& args = std::get<ServedArgs>(request.args);
  // Reads a client answered from its own RAM copy: the memory source (DESIGN §3.4), which
  // costs no device anything; counted, and the objects stay recently used on disk too.
  std::uint64_t reads = 0;
  for (const auto& [served_key, n] : args.memory) {
    ctx_.store.Touch(served_key);
    reads += n;
  }
  ctx_.reads.requests_by_source[ReadSource::kMemory] += static_cast<int>(reads);
  store_stats_.memory_hits += reads;
  ctx_.reads.bytes_from_cache += args.bytes;
  ctx_.stats_changed();
  return reply(nlohmann::json::object());
}

// The proxy's fetch from an origin, on the emulated card (see the file comment). The card's
// policy sees one disclosed transfer, as ghostsim's card sees one I/O: under static the
// default policy counts the transfer's begin as ghostsim counts its I/O's begin.
void StoreTree::StoreTransfer(const TransferArgs& args, std::uint64_t connection, ControlServer::Reply reply) {
  switch (args.phase) {
    case TransferPhase::kBegin:
      return reply({{"transfer", BeginProxyTransfer(connection)}, {"card", !ctx_.options.profile.empty()}});
    case TransferPhase::kData: {
      auto answer = std::make_shared<ControlServer::Reply>(reply);
      std::string error = ProxyTransferData(args.transfer, args.bytes, args.upload,
                                            [answer] { (*answer)(nlohmann::json::object()); });
      if (!error.empty()) reply.Error("transfer: " + error);
      return;
    }
    case TransferPhase::kEnd: {
      std::string error;
      if (args.end_bytes) error = ProxyTransferData(args.transfer, *args.end_bytes, false, [] {});
      if (error.empty()) error = EndProxyTransfer(args.transfer);
      if (!error.empty()) return reply.Error("transfer: " + error);
      return reply(nlohmann::json::object());
    }
  }
}

std::uint64_t StoreTree::BeginProxyTransfer(std::uint64_t connection) {
  std::uint64_t id = next_transfer_id_++;
  proxy_transfers_[id] = ProxyTransfer{.connection = connection};
  ctx_.machine.pm().TransferBegin(ctx_.machine.network_id());
  if (!ctx_.options.profile.empty()) {
    IoRequest io;
    io.round_trips_only = true;
    ctx_.machine.network().Submit(io, [] {});
  }
  return id;
}

std::string StoreTree::ProxyTransferData(std::uint64_t id, Bytes bytes, bool upload, std::function<void()> done) {
  auto it = proxy_transfers_.find(id);
  if (it == proxy_transfers_.end()) return "no open transfer " + std::to_string(id);
  if (it->second.data_sent) return "data already given for transfer " + std::to_string(id);
  it->second.data_sent = true;
  ctx_.baseline_fetch(bytes);
  if (ctx_.options.profile.empty()) {
    done();
    return "";
  }
  ++it->second.data_pending;
  IoRequest io;
  io.size = bytes;
  io.write = upload;  // an upload (an IMAP APPEND's message): the link's upload rate
  io.continuation = true;
  ctx_.machine.network().Submit(io, [this, id, done = std::move(done)] {
    auto t = proxy_transfers_.find(id);
    if (t != proxy_transfers_.end() && --t->second.data_pending == 0 && t->second.ended) {
      proxy_transfers_.erase(t);
      ctx_.machine.pm().TransferEnd(ctx_.machine.network_id());
    }
    done();
  });
  return "";
}

std::string StoreTree::EndProxyTransfer(std::uint64_t id) {
  auto it = proxy_transfers_.find(id);
  if (it == proxy_transfers_.end()) return "no open transfer " + std::to_string(id);
  it->second.ended = true;
  if (it->second.data_pending == 0) {
    proxy_transfers_.erase(it);
    ctx_.machine.pm().TransferEnd(ctx_.machine.network_id());
  }
  return "";
}

void StoreTree::ConnectionClosed(std::uint64_t connection) {
  std::vector<std::uint64_t> orphans;
  for (const auto& [id, t] : proxy_transfers_) {
    if (connection != 0 && t.connection == connection && !t.ended) orphans.push_back(id);
  }
  for (std::uint64_t id : orphans) {
    ++store_stats_.orphaned_transfers;
    EndProxyTransfer(id);
  }
  if (!orphans.empty()) ctx_.stats_changed();
}

// Unlinking .ghost/fill/<token> before closing it abandons the fill.
void StoreTree::Unlink(fuse_req_t req, Node* parent, const char* name) {
  if (parent->path != kFillDir) return (void)fuse_reply_err(req, EROFS);
  auto f = store_fills_.find(name);
  if (f == store_fills_.end()) return (void)fuse_reply_err(req, ENOENT);
  store_fills_.erase(f);
  fuse_reply_err(req, 0);
}

nlohmann::json StoreTree::StatsJson() const {
  return {{"lookups", store_stats_.lookups},
          {"hits", store_stats_.hits},
          {"network_preferred", store_stats_.network_preferred},
          {"fills", store_stats_.fills},
          {"inline_fills", store_stats_.inline_fills},
          {"refreshes", store_stats_.refreshes},
          {"memory_hits", store_stats_.memory_hits},
          {"open_fills", store_fills_.size()},
          // Stores (and the invalidates and refreshes behind them) answered later because the
          // fill backlog was over its bound, in all and now.
          {"held", store_stats_.held},
          {"held_now", held_now_},
          {"open_transfers", proxy_transfers_.size()},
          // Transfers whose client closed its connection without ending them (ended then).
          {"orphaned_transfers", store_stats_.orphaned_transfers}};
}

void StoreTree::LookupRoot(fuse_req_t req) {
  Node* n = ctx_.inodes.Lookup(NodeKind::kStoreDir, -1, "");
  ReplyNodeEntry(req, n, StoreStat(n));
}

void StoreTree::Setattr(fuse_req_t req, Node* n, struct stat* attr, int to_set, fuse_file_info*) {
  // The kernel truncates O_TRUNC opens with a SETATTR (no atomic O_TRUNC, local_tree.h): a
  // proxy opens its fill token with O_TRUNC, and a fill starts empty anyway.
  constexpr int kTimes = FUSE_SET_ATTR_ATIME | FUSE_SET_ATTR_MTIME | FUSE_SET_ATTR_ATIME_NOW |
                         FUSE_SET_ATTR_MTIME_NOW | FUSE_SET_ATTR_CTIME;
  if (n->kind == NodeKind::kStoreFill && (to_set & ~(FUSE_SET_ATTR_SIZE | kTimes)) == 0 && attr->st_size == 0) {
    return Getattr(req, n);
  }
  fuse_reply_err(req, EROFS);
}

void StoreTree::Read(fuse_req_t req, Node*, size_t size, off_t off, fuse_file_info* fi) {
  Handle* h = reads_.FindHandle(fi->fh);
  if (!h || h->kind == NodeKind::kStoreFill) return (void)fuse_reply_err(req, EBADF);  // fills are write-only
  reads_.ReadHandle(req, fi->fh, size, off);
}

void StoreTree::Flush(fuse_req_t req, Node*, fuse_file_info* fi) {
  Handle* h = reads_.FindHandle(fi->fh);
  if (h && h->kind == NodeKind::kStoreFill) StoreHandOver(*h);
  fuse_reply_err(req, 0);
}

void StoreTree::Release(fuse_req_t req, Node*, fuse_file_info* fi) {
  Handle* h = reads_.FindHandle(fi->fh);
  if (h && h->kind == NodeKind::kStoreFill) {
    StoreHandOver(*h);
    reads_.DropHandle(fi->fh);
  } else {
    reads_.ReleaseHandle(fi->fh);
  }
  fuse_reply_err(req, 0);
}


}  // namespace ghost
