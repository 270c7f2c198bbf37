#include "common/cache/cache_store.h"

#include <dirent.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <openssl/sha.h>
#include <sqlite3.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cassert>
#include <cerrno>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_set>
#include <utility>

namespace ghost {
namespace {

bool IsLowerHex(std::string_view s) {
  for (char c : s) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

// A key as it may appear in a message: quoted, non-printable bytes escaped, long keys cut.
std::string Quote(std::string_view key) {
  constexpr std::size_t kMax = 160;
  std::string out = "\"";
  for (std::size_t i = 0; i < key.size() && i < kMax; ++i) {
    auto c = static_cast<unsigned char>(key[i]);
    if (c < 0x20 || c >= 0x7f || c == '"' || c == '\\') {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  if (key.size() > kMax) out += "...";
  return out + "\"";
}

// st.WithContext(context), keeping the errno that Status::WithContext drops (so ENOSPC still
// reaches the FUSE edge as ENOSPC): a Status from FromErrno ends in ": <strerror>", which is
// moved to the end again.
Status WithErrnoContext(const Status& st, const std::string& context) {
  int err = st.ToErrno();
  std::string tail = std::string(": ") + std::strerror(err);
  const std::string& msg = st.message();
  if (st.ok() || msg.size() < tail.size() ||
      msg.compare(msg.size() - tail.size(), tail.size(), tail) != 0) {
    return st.WithContext(context);
  }
  return Status::FromErrno(err, context + ": " + msg.substr(0, msg.size() - tail.size()));
}

std::string TooBig(std::string_view key, Bytes size, Bytes capacity) {
  return "cannot cache " + Quote(key) + ": its " + std::to_string(size) +
         " bytes exceed the cache capacity of " + std::to_string(capacity) +
         " bytes; raise the cache size to cache objects this large";
}

// mkdir that accepts an existing directory.
Status MakeDir(const std::string& path, const std::string& what) {
  if (::mkdir(path.c_str(), 0700) == 0) return Status::Ok();
  int err = errno;
  if (err == EEXIST) {
    struct stat st;
    if (::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) return Status::Ok();
    return Status::FromErrno(ENOTDIR, what + " " + path + " exists and is not a directory");
  }
  if (err == ENOENT) {
    return Status::NotFound("cannot create " + what + " " + path +
                            ": its parent directory does not exist; create it first or choose "
                            "another location");
  }
  return Status::FromErrno(err, "cannot create " + what + " " + path);
}

struct DirCloser {
  void operator()(DIR* d) const { ::closedir(d); }
};
using DirPtr = std::unique_ptr<DIR, DirCloser>;

// ---- sqlite ----

bool IsCorruption(int rc) {
  int primary = rc & 0xff;
  return primary == SQLITE_CORRUPT || primary == SQLITE_NOTADB;
}

// A prepared statement; finalized on destruction. Move-only.
class Stmt {
 public:
  Stmt() = default;
  explicit Stmt(sqlite3_stmt* s) : s_(s) {}
  Stmt(Stmt&& o) noexcept : s_(std::exchange(o.s_, nullptr)) {}
  Stmt& operator=(Stmt&& o) noexcept {
    if (this != &o) {
      sqlite3_finalize(s_);
      s_ = std::exchange(o.s_, nullptr);
    }
    return *this;
  }
  Stmt(const Stmt&) = delete;
  Stmt& operator=(const Stmt&) = delete;
  ~Stmt() { sqlite3_finalize(s_); }

  // Binds 1-based parameters; the text is copied (SQLITE_TRANSIENT), so keys with NUL bytes
  // keep their full length.
  void Bind(int i, std::string_view text) {
    // (An empty view may have no data: still the empty text, not NULL.)
    sqlite3_bind_text(s_, i, text.data() ? text.data() : "", static_cast<int>(text.size()),
                      SQLITE_TRANSIENT);
  }
  void Bind(int i, std::int64_t v) { sqlite3_bind_int64(s_, i, v); }
  void BindBlob(int i, std::string_view bytes) {
    sqlite3_bind_blob(s_, i, bytes.data(), static_cast<int>(bytes.size()), SQLITE_TRANSIENT);
  }
  void Bind(int i, std::optional<std::int64_t> v) {
    if (v) {
      sqlite3_bind_int64(s_, i, *v);
    } else {
      sqlite3_bind_null(s_, i);
    }
  }
  int Step() { return sqlite3_step(s_); }
  // Ready for reuse: resets and clears the bindings.
  void Reset() {
    sqlite3_reset(s_);
    sqlite3_clear_bindings(s_);
  }
  std::string Text(int col) const {
    const auto* p = static_cast<const char*>(sqlite3_column_blob(s_, col));
    return p ? std::string(p, static_cast<std::size_t>(sqlite3_column_bytes(s_, col)))
             : std::string();
  }
  std::int64_t Int(int col) const { return sqlite3_column_int64(s_, col); }
  bool IsNull(int col) const { return sqlite3_column_type(s_, col) == SQLITE_NULL; }
  bool IsBlob(int col) const { return sqlite3_column_type(s_, col) == SQLITE_BLOB; }

 private:
  sqlite3_stmt* s_ = nullptr;
};

struct DbCloser {
  void operator()(sqlite3* db) const { sqlite3_close_v2(db); }
};

// Version 2 added objects.response (the proxy's stored response head); version 3 added h (the
// key's 64-bit hash, indexed: the in-memory table's key) and body (a packed small body, NULL
// when the body is a file); version 4 the shutdown table (one row: clean = 1 after a Close
// whose bodies reached the disk, so the next Open may skip checking every body file). Older
// indexes are upgraded in place; an older ghost refuses version 4, so it can never run on the
// cache without clearing the mark that this one trusts.
// Version 5 (the disk per small object, DESIGN §4.5): objects is a rowid table with no index
// on key (lookups go by h, then compare the key; a trigger keeps one row per key), its one
// index objects_by_h(h, complete, size, accessed_us) covers Open and every lookup, a partial
// index finds the few incomplete rows, pages are 16 KiB, and a response head is stored
// deflated (kHeadDeflate1). Older indexes are rebuilt into it once, at their first Open.
constexpr int kSchemaVersion = 5;

// The ticks table (kTicksTable; DESIGN §4.5, round 14): an access time saved after its row was
// written is a row (h, tick) appended to `ticks`, not an UPDATE of objects.accessed_us. An
// UPDATE lands on a random page of the table and one of objects_by_h: two 16 KiB pages in the
// WAL for an 8-byte time (a batch of 512 ticks over 100k objects wrote ~1,000 pages, 16 MiB);
// appended rows fill the table's last page, ~650 to a page. Open replays the table (the newest
// time of each object wins: ticks only grow). It is compacted, in the transaction that would
// take it past max(CacheStoreOptions::ticks_min_rows, objects), to one row per cached object
// (a sequential write of ~25 bytes an object), so it never holds more than about twice the
// objects: at most ~50 bytes an object on the disk, and Open reads at most that.

// Page size of a new index: a packed 512-byte object's row is about 700 bytes; rows are
// appended in rowid order, so a page wastes on average half a row (88 bytes a row at 4 KiB,
// 15 at 16 KiB). An index created with another page size keeps it.
constexpr int kPageSize = 16384;

std::int64_t StoredHash(std::uint64_t h) { return static_cast<std::int64_t>(h); }

// ghost_h(key): the key's 64-bit hash as stored in objects.h (the SQL side of KeyHash), so a
// statement looks a key up as `h = ghost_h(?1) AND key = ?1` through the index on h.
void SqlKeyHash(sqlite3_context* ctx, int /*argc*/, sqlite3_value** argv) {
  const void* p = sqlite3_value_blob(argv[0]);
  auto n = static_cast<std::size_t>(sqlite3_value_bytes(argv[0]));
  std::string_view key(p ? static_cast<const char*>(p) : "", p ? n : 0);
  sqlite3_result_int64(ctx, StoredHash(CacheStore::KeyHash(key)));
}

// ---- Stored response heads ----
//
// objects.response holds the proxy's response head, opaque to the store (ghostproxy's JSON).
// Stored as TEXT it was most of a small object's row (369 of its 1028 bytes for nginx's 512-byte
// objects), and it repeats the etag, last_modified and content_type columns. So a row with a
// head stores those four together as one BLOB and leaves the three columns empty: the byte
// kHeadDeflate1, then raw deflate (zlib) with the preset dictionary kHeadDictionary of
//   [LEB128 length][etag] [LEB128 length][last_modified] [LEB128 length][content_type] [head]
// (the head's copies of the three then cost ~3 bytes each). A row with no head (an object
// ghostfs fetched itself), with one that does not shrink, or written before version 5 has the
// three columns and the head as TEXT. The dictionary is part of the format: a change needs a
// new format byte, with the old one still read.
constexpr unsigned char kHeadDeflate1 = 1;
constexpr char kHeadDictionary[] =
    R"(Vary","Accept-Encoding"],["Age","0"],["Pragma","no-cache"],["Access-Control-Allow-Origin","*"],)"
    R"(["X-Content-Type-Options","nosniff"],["Content-Encoding","gzip"],["Strict-Transport-Security",)"
    R"("max-age=31536000"],["Transfer-Encoding","chunked"],["Set-Cookie","; path=/; HttpOnly"],)"
    R"(["Via","1.1 "],["Location","https://text/html; charset=utf-8image/jpegimage/png)"
    R"(application/jsonapplication/javascripttext/cssMon, Tue, Wed, Fri, Sat, Sun, Jan Feb Mar Apr )"
    R"(May Jun Jul Aug Sep Oct Dec {"expires_unix":null,"headers":[["Server","Apache"],["Server",)"
    R"("nginx/1.2{"expires_unix":17,"headers":[["Server","nginx/1.22.1"],["Date","Thu, 01 Nov 2026 )"
    R"(00:00:00 GMT"],["Content-Type","application/octet-stream"],["Content-Length","0"],)"
    R"(["Last-Modified","Thu, 01 Nov 2026 00:00:00 GMT"],["Connection","keep-alive"],["ETag",)"
    R"("\"0-0\""],["Expires","Thu, 01 Nov 2026 00:00:00 GMT"],["Cache-Control","public, )"
    R"(max-age=3600"],["Accept-Ranges","bytes"]],"status":200,"stored_unix":17)";

// Deflates and inflates heads with one z_stream each, reset per head (an init allocates the
// window). Deflate's window is 4 KiB (windowBits 12) and its hash 2^11 entries (memLevel 4):
// a head and the dictionary are ~1.5 KB, and the default 32 KiB window and 2^16-entry hash
// (memLevel 9), which every reset clears (128 KiB of memset) and the dictionary is hashed
// into, made the head's deflate ~10 % of ghostfs's CPU in a fill of 512-byte objects (perf,
// round 12) for the same 87 bytes out. The stream is raw deflate either way: inflate's
// 32 KiB window reads both, so rows written before read on.
constexpr int kHeadDeflateWindowBits = 12;
constexpr int kHeadDeflateMemLevel = 4;
class HeadCodec {
 public:
  HeadCodec() {
    ok_ = deflateInit2(&def_, Z_BEST_COMPRESSION, Z_DEFLATED, -kHeadDeflateWindowBits, kHeadDeflateMemLevel,
                       Z_DEFAULT_STRATEGY) == Z_OK;
    ok_ = inflateInit2(&inf_, -15) == Z_OK && ok_;
  }
  ~HeadCodec() {
    deflateEnd(&def_);
    inflateEnd(&inf_);
  }
  HeadCodec(const HeadCodec&) = delete;
  HeadCodec& operator=(const HeadCodec&) = delete;

  // The BLOB holding `e`'s validators, content type and head; false if it should be stored as
  // columns and TEXT instead (no head, or deflating does not pay).
  bool Encode(const CacheEntry& e, std::string* out) {
    out->clear();
    if (e.response.empty() || !ok_) return false;
    std::string plain;
    for (const std::string* field : {&e.etag, &e.last_modified, &e.content_type}) {
      for (std::size_t n = field->size(); ; n >>= 7) {
        plain += static_cast<char>((n & 0x7f) | (n >= 0x80 ? 0x80 : 0));
        if (n < 0x80) break;
      }
      plain += *field;
    }
    plain += e.response;
    if (deflateReset(&def_) != Z_OK ||
        deflateSetDictionary(&def_, reinterpret_cast<const Bytef*>(kHeadDictionary),
                             sizeof kHeadDictionary - 1) != Z_OK) {
      return false;
    }
    out->resize(1 + deflateBound(&def_, plain.size()));
    (*out)[0] = static_cast<char>(kHeadDeflate1);
    def_.next_in = reinterpret_cast<Bytef*>(plain.data());
    def_.avail_in = static_cast<uInt>(plain.size());
    def_.next_out = reinterpret_cast<Bytef*>(out->data() + 1);
    def_.avail_out = static_cast<uInt>(out->size() - 1);
    if (deflate(&def_, Z_FINISH) != Z_STREAM_END) return false;
    out->resize(out->size() - def_.avail_out);
    return out->size() < plain.size();
  }

  // Sets `e`'s etag, last_modified, content_type and response from a BLOB Encode made; false
  // (and `e` unchanged) if it does not decode.
  bool Decode(std::string_view stored, CacheEntry* e) {
    if (!ok_ || stored.empty() || static_cast<unsigned char>(stored[0]) != kHeadDeflate1) {
      return false;
    }
    if (inflateReset(&inf_) != Z_OK ||
        inflateSetDictionary(&inf_, reinterpret_cast<const Bytef*>(kHeadDictionary),
                             sizeof kHeadDictionary - 1) != Z_OK) {
      return false;
    }
    std::string out;
    inf_.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(stored.data() + 1));
    inf_.avail_in = static_cast<uInt>(stored.size() - 1);
    std::size_t used = 0;
    int rc = Z_OK;
    while (rc == Z_OK) {
      std::size_t chunk = std::max<std::size_t>(1024, 4 * stored.size());
      out.resize(used + chunk);
      inf_.next_out = reinterpret_cast<Bytef*>(out.data() + used);
      inf_.avail_out = static_cast<uInt>(chunk);
      rc = inflate(&inf_, Z_NO_FLUSH);
      used = out.size() - inf_.avail_out;
      // Room left but no end: the input ran out (a cut blob).
      if (rc == Z_OK && inf_.avail_out != 0) rc = Z_DATA_ERROR;
    }
    if (rc != Z_STREAM_END) return false;
    out.resize(used);
    std::string_view rest = out;
    std::string fields[3];
    for (std::string& field : fields) {
      std::size_t n = 0;
      for (int shift = 0;; shift += 7) {
        if (rest.empty() || shift > 56) return false;
        auto b = static_cast<unsigned char>(rest[0]);
        rest.remove_prefix(1);
        n |= static_cast<std::size_t>(b & 0x7f) << shift;
        if ((b & 0x80) == 0) break;
      }
      if (n > rest.size()) return false;
      field = rest.substr(0, n);
      rest.remove_prefix(n);
    }
    e->etag = std::move(fields[0]);
    e->last_modified = std::move(fields[1]);
    e->content_type = std::move(fields[2]);
    e->response = rest;
    return true;
  }

 private:
  z_stream def_{};
  z_stream inf_{};
  bool ok_ = false;
};

constexpr char kObjectColumns[] =
    "key, size, etag, last_modified, content_type, expires_us, fetched_us, accessed_us, response";

// The objects table (version 5): a rowid table, rows appended in commit order (so its pages
// fill up), no index on key. response: TEXT, or a BLOB in the HeadCodec's format.
constexpr char kObjectsTable[] =
    "key TEXT NOT NULL, size INTEGER NOT NULL, etag TEXT NOT NULL DEFAULT '', "
    "last_modified TEXT NOT NULL DEFAULT '', content_type TEXT NOT NULL DEFAULT '', "
    "expires_us INTEGER, fetched_us INTEGER NOT NULL, accessed_us INTEGER NOT NULL, "
    "complete INTEGER NOT NULL, response NOT NULL DEFAULT '', h INTEGER, body BLOB";

// The WAL's checkpointer (DESIGN §4.5): a thread with its own connection to the index that
// copies committed pages from the WAL into the database file and fsyncs both, so that the
// loop's commits only append to the WAL (synchronous=NORMAL: no fsync per commit) and a hit
// queued behind a commit never waits for the disk's flush. Woken by Request (the loop's WAL
// hook, after a commit that leaves the WAL past Db::kCheckpointFrames); blocked on a condition
// variable otherwise, so an idle daemon does not wake for it. Its checkpoints are PASSIVE:
// they never take the write lock, so the loop's transactions are never refused or held for
// one. A crash in the middle of one is the ordinary WAL recovery (sqlite replays the WAL).
// The thread starts at the first request. ghostfs opens its cache before it daemonises (a
// fork, which keeps only the forking thread): it stops the thread first (CacheStore::
// PrepareFork). Should a fork happen without that, a request in the child abandons the old
// thread's objects (joining or destroying them there is undefined) and starts a new thread
// with a fresh mutex and condition variables (safe unless the fork caught a pass in sqlite).
// Thread-safety: Request and RequestAndWait from the owner's (event-loop) thread; the
// connection is used by the checkpointer's thread only.
class Checkpointer {
 public:
  // Takes `db`, a connection of its own to the index (closed by the destructor).
  explicit Checkpointer(sqlite3* db) : db_(db) {}
  // Waits for a checkpoint in progress, then closes the connection.
  ~Checkpointer() { Stop(); }

  // Ends the thread after its pass under way (none runs until the next request, which starts
  // a new one). Before a fork: a thread caught inside sqlite by the fork would leave the
  // child's copy of the connection and its locks in mid-checkpoint.
  void Stop() {
    if (!thread_) return;
    if (owner_ != ::getpid()) {
      Abandon();
      return;
    }
    {
      std::lock_guard<std::mutex> lock(sync_->mu);
      stop_ = true;
    }
    sync_->cv.notify_all();
    thread_->join();
    thread_.reset();
  }
  Checkpointer(const Checkpointer&) = delete;
  Checkpointer& operator=(const Checkpointer&) = delete;

  // Asks for a checkpoint soon; requests made while one runs make one more after it.
  void Request() {
    EnsureThread();
    {
      std::lock_guard<std::mutex> lock(sync_->mu);
      requested_ = true;
    }
    sync_->cv.notify_all();
  }
  // Requests a checkpoint and waits until one that started after this call has finished:
  // with no commit meanwhile (the caller is the only writer), the WAL is then fully copied
  // and the next transaction starts it over from its beginning.
  void RequestAndWait() {
    EnsureThread();
    std::unique_lock<std::mutex> lock(sync_->mu);
    const std::uint64_t target = started_ + 1;  // the next pass to start, not one under way
    requested_ = true;
    sync_->cv.notify_all();
    sync_->finished.wait(lock, [&] { return finished_ >= target || stop_; });
  }

 private:
  struct Sync {
    std::mutex mu;                     // guards the flags and counts of the Checkpointer
    std::condition_variable cv;        // the thread waits for a request
    std::condition_variable finished;  // RequestAndWait waits for a pass
  };

  // A thread of this process, started now if there is none.
  void EnsureThread() {
    if (thread_ && owner_ == ::getpid()) return;
    if (thread_) Abandon();  // forked without Stop: that thread is not in this process
    sync_ = std::make_unique<Sync>();
    requested_ = stop_ = false;
    started_ = finished_ = 0;
    owner_ = ::getpid();
    thread_ = std::make_unique<std::thread>([this, sync = sync_.get()] { Run(*sync); });
  }
  // Leaks the objects of a thread left behind in the parent of a fork.
  void Abandon() {
    (void)thread_.release();
    (void)sync_.release();
  }

  void Run(Sync& sync) {
    std::unique_lock<std::mutex> lock(sync.mu);
    for (;;) {
      sync.cv.wait(lock, [this] { return requested_ || stop_; });
      if (stop_) return;
      requested_ = false;
      ++started_;
      lock.unlock();
      int log = 0, copied = 0;
      int rc = sqlite3_wal_checkpoint_v2(db_.get(), nullptr, SQLITE_CHECKPOINT_PASSIVE, &log,
                                         &copied);
      if (rc != SQLITE_OK && (rc & 0xff) != SQLITE_BUSY) {
        // The pages stay in the WAL (readable, and checkpointed at the next request or when
        // the loop's connection closes): nothing is lost, the WAL is only longer.
        std::fprintf(stderr, "ghost: cache store: checkpointing the index: %s\n",
                     sqlite3_errmsg(db_.get()));
      }
      lock.lock();
      ++finished_;
      sync.finished.notify_all();
    }
  }

  std::unique_ptr<sqlite3, DbCloser> db_;
  std::unique_ptr<Sync> sync_ = std::make_unique<Sync>();
  bool requested_ = false;     // guarded by sync_->mu, as are the three below
  bool stop_ = false;
  std::uint64_t started_ = 0;  // passes started
  std::uint64_t finished_ = 0;
  pid_t owner_ = 0;            // the process that started thread_
  std::unique_ptr<std::thread> thread_;
};

}  // namespace

// ---- The index database ----

struct CacheStore::Db {
  std::string path;
  // One store per directory (flock on the directory, held until the index is closed):
  // sqlite's own EXCLUSIVE locking mode would keep the checkpointer's connection out.
  UniqueFd dir_lock;
  std::unique_ptr<sqlite3, DbCloser> handle;  // closed after the statements
  // Declared after `handle`: its connection closes first, so the loop's close, the last one,
  // checkpoints what is left and removes the WAL.
  std::unique_ptr<Checkpointer> checkpointer;
  int last_rc = SQLITE_OK;                    // of the last failed call

  Stmt begin, commit, rollback;
  Stmt insert_pending;   // a fill started: row complete=0 unless a complete one exists
  Stmt mark_incomplete;  // a replacement is being renamed into place
  Stmt mark_complete;    // the replacement's rename failed: the old body is still there
  Stmt upsert_complete;  // a fill committed
  Stmt delete_key;
  Stmt delete_pending;
  Stmt insert_tick;   // an access time, appended to the ticks table
  Stmt delete_ticks;  // every row of the ticks table (before a snapshot of the table's ticks)
  Stmt update_meta;
  Stmt select_entry;     // the metadata and packed body of a complete row, by key
  Stmt select_key;       // the key of a complete row, by hash
  Stmt set_clean;        // ?1: 1 after a clean Close, 0 while the store is open
  Stmt select_packed;    // the packed body of a complete row, by key (no row: a body file)
  HeadCodec heads;       // objects.response's stored form

  ghost::Status Error(const std::string& what, int rc) {
    last_rc = rc;
    std::string msg = what + " in cache index " + path + ": " +
                      (handle ? sqlite3_errmsg(handle.get()) : sqlite3_errstr(rc));
    if ((rc & 0xff) == SQLITE_BUSY || (rc & 0xff) == SQLITE_LOCKED) {
      msg += " (is another ghostfs using this cache directory? stop it or choose another)";
    }
    return ghost::Status::IoError(std::move(msg));
  }

  ghost::Status Exec(const char* sql) {
    char* msg = nullptr;
    int rc = sqlite3_exec(handle.get(), sql, nullptr, nullptr, &msg);
    sqlite3_free(msg);
    return rc == SQLITE_OK ? ghost::Status::Ok() : Error(std::string("\"") + sql + "\"", rc);
  }

  ghost::Status Prepare(const char* sql, Stmt* out) {
    sqlite3_stmt* s = nullptr;
    int rc = sqlite3_prepare_v3(handle.get(), sql, -1, SQLITE_PREPARE_PERSISTENT, &s, nullptr);
    if (rc != SQLITE_OK) return Error(std::string("preparing \"") + sql + "\"", rc);
    *out = Stmt(s);
    return ghost::Status::Ok();
  }

  // Runs a prepared statement that returns no rows, then readies it for reuse.
  ghost::Status Run(Stmt& s, const std::string& what) {
    int rc = s.Step();
    s.Reset();
    return rc == SQLITE_DONE ? ghost::Status::Ok() : Error(what, rc);
  }

  // Opens or creates the database, checks it and prepares the statements.
  ghost::Status Open() {
    if (!dir_lock.valid()) {  // held already when Open runs again after CopyIntoVersion5
      std::string parent = path.substr(0, path.rfind('/') + 1);
      dir_lock = UniqueFd(
          ::open(parent.empty() ? "." : parent.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
      if (!dir_lock.valid()) {
        return ghost::Status::FromErrno(errno, "opening the cache index's directory " + parent);
      }
      if (::flock(dir_lock.get(), LOCK_EX | LOCK_NB) != 0) {
        int err = errno;
        dir_lock = UniqueFd();
        if (err == EWOULDBLOCK) {
          return ghost::Status::IoError("cache index " + path +
                                        " is locked (is another ghostfs using this cache "
                                        "directory? stop it or choose another)");
        }
        return ghost::Status::FromErrno(err, "locking the cache index's directory " + parent);
      }
    }
    sqlite3* raw = nullptr;
    int rc =
        sqlite3_open_v2(path.c_str(), &raw,
                        SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX, nullptr);
    handle.reset(raw);  // closed even when the open failed
    if (rc != SQLITE_OK) return Error("opening", rc);
    sqlite3_extended_result_codes(raw, 1);
    // WAL: a commit appends, no rollback journal; NORMAL: no fsync per commit (a cache may
    // lose its last fills in a power cut, and Open drops any row whose body does not match);
    // the WAL's checkpoints, which fsync, run on the Checkpointer's thread (WalHook).
    // temp_store=MEMORY: a statement's journal (an UPDATE inside a transaction keeps one in
    // case it fails halfway) stays in RAM instead of a temp file written page by page.
    // cache_size 16 MiB (1024 pages; sqlite's default is 2000 KiB, 125 of them): a transaction
    // that dirties more pages than the cache holds spills them to the WAL before its commit,
    // and a page spilled is written again (measured: 13,500 WAL frames written and 7,000 read
    // back for one transaction of 4096 access times that dirtied ~1,700 pages, DESIGN §4.5).
    // Allocated as used: a small cache never grows to it.
    // page_size: only a new file takes it (before WAL mode writes the header). The WAL is cut
    // back to 16 MiB when it restarts, so a burst that outran the checkpointer does not keep
    // its largest size on the disk; below that no truncation on the loop.
    std::string page_size = "PRAGMA page_size=" + std::to_string(kPageSize);
    for (const char* pragma :
         {page_size.c_str(), "PRAGMA journal_mode=WAL", "PRAGMA synchronous=NORMAL",
          "PRAGMA temp_store=MEMORY", "PRAGMA journal_size_limit=16777216",
          "PRAGMA cache_size=-16384"}) {
      if (ghost::Status st = Exec(pragma); !st.ok()) return st;
    }
    rc = sqlite3_create_function_v2(raw, "ghost_h", 1,
                                    SQLITE_UTF8 | SQLITE_DETERMINISTIC | SQLITE_INNOCUOUS,
                                    nullptr, SqlKeyHash, nullptr, nullptr, nullptr);
    if (rc != SQLITE_OK) return Error("registering ghost_h", rc);
    // No quick_check here: it reads every page, seconds for a million objects. Load scans
    // every row of the table anyway, and a corrupt page it meets sets the index aside the
    // same way (CacheStore::Open).

    if (ghost::Status st = Exec("BEGIN IMMEDIATE"); !st.ok()) return st;
    bool rebuilt = false;
    ghost::Status st = CreateSchema(&rebuilt);
    if (st.ok()) st = Exec("COMMIT");
    if (!st.ok()) {
      Exec("ROLLBACK").ok();  // best effort; the error that matters is `st`
      return st;
    }
    if (rebuilt) {
      // The older table is copied into a new file (CopyIntoVersion5), which then replaces
      // this one: open that.
      if (ghost::Status copy = CopyIntoVersion5(); !copy.ok()) return copy;
      return Open();
    }

    std::string cols = kObjectColumns;
    // A key's row, through the index on h (there is none on key).
    const std::string by_key = "h = ghost_h(?1) AND key = ?1";
    struct {
      Stmt* stmt;
      std::string sql;
    } statements[] = {
        {&begin, "BEGIN IMMEDIATE"},
        {&commit, "COMMIT"},
        {&rollback, "ROLLBACK"},
        // Nothing if a row of the key exists (complete or not).
        {&insert_pending, "INSERT INTO objects(" + cols +
                              ", h, complete) SELECT ?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, 0 "
                              "WHERE NOT EXISTS (SELECT 1 FROM objects WHERE h = ?10 AND key = ?1)"},
        {&mark_incomplete, "UPDATE objects SET complete = 0 WHERE " + by_key},
        {&mark_complete, "UPDATE objects SET complete = 1 WHERE " + by_key},
        // Replaces the key's row (the trigger objects_one_per_key deletes it first).
        {&upsert_complete,  // ?11: the packed body, or NULL for a body file
         "INSERT INTO objects(" + cols +
             ", h, complete, body) VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, 1, ?11)"},
        {&delete_key, "DELETE FROM objects WHERE " + by_key},
        {&delete_pending, "DELETE FROM objects WHERE " + by_key + " AND complete = 0"},
        {&insert_tick, "INSERT INTO ticks(h, tick) VALUES(?1, ?2)"},
        {&delete_ticks, "DELETE FROM ticks"},
        {&update_meta,
         "UPDATE objects SET etag = ?2, last_modified = ?3, content_type = ?4, expires_us = ?5, "
         "fetched_us = ?6, response = ?7 WHERE " + by_key + " AND complete = 1"},
        // With the packed body (column 9; NULL for a body file): a lookup that serves the
        // object asks for both, and one statement is one read transaction (two fcntl locks
        // of the WAL index) instead of three (DESIGN §4.5, round 15).
        {&select_entry,
         "SELECT " + cols + ", body FROM objects WHERE " + by_key + " AND complete = 1"},
        {&select_key, "SELECT key FROM objects WHERE h = ?1 AND complete = 1"},
        {&set_clean, "UPDATE shutdown SET clean = ?1"},
        {&select_packed, "SELECT body FROM objects WHERE " + by_key +
                             " AND complete = 1 AND body IS NOT NULL"},
    };
    for (auto& s : statements) {
      if (ghost::Status prep = Prepare(s.sql.c_str(), s.stmt); !prep.ok()) {
        // Our own tables exist by now, so a statement that does not compile means the file
        // holds some other database under our name.
        last_rc = SQLITE_CORRUPT;
        return prep;
      }
    }
    return StartCheckpointer();
  }

  // The WAL is checkpointed once it holds this much (sqlite's automatic checkpoint does it
  // every 1000 pages, 16 MiB here, on the committing thread).
  static constexpr int kCheckpointFrames = (4 << 20) / kPageSize;

  // Opens the checkpointer's connection and hands the WAL's checkpoints to it: the WAL hook
  // replaces sqlite's automatic checkpoint on this connection.
  ghost::Status StartCheckpointer() {
    sqlite3* raw = nullptr;
    int rc = sqlite3_open_v2(path.c_str(), &raw, SQLITE_OPEN_READWRITE | SQLITE_OPEN_NOMUTEX,
                             nullptr);
    std::unique_ptr<sqlite3, DbCloser> second(raw);
    if (rc != SQLITE_OK) return Error("opening the checkpointer's connection", rc);
    // A checkpoint copies pages from the WAL to the file: it needs no page cache of its own.
    rc = sqlite3_exec(raw, "PRAGMA synchronous=NORMAL; PRAGMA cache_size=-256", nullptr,
                      nullptr, nullptr);
    if (rc != SQLITE_OK) return Error("setting up the checkpointer's connection", rc);
    checkpointer = std::make_unique<Checkpointer>(second.release());
    sqlite3_wal_hook(handle.get(), &Db::WalHook, this);
    return ghost::Status::Ok();
  }

  // The WAL starts over from its beginning only at a transaction that begins with all of it
  // copied; commits back to back outrun a checkpointer that copies while they append, and the
  // WAL would grow for as long as they last (measured: 97 MB for 800 fills in a row). Past
  // this length the committing thread waits for one checkpoint to copy everything.
  static constexpr int kWalCapFrames = 8 * kCheckpointFrames;

  // After each commit on the loop's connection, with the WAL's length in pages.
  static int WalHook(void* arg, sqlite3*, const char*, int frames) {
    auto* db = static_cast<Db*>(arg);
    if (!db->checkpointer) return SQLITE_OK;
    if (frames >= kWalCapFrames) {
      db->checkpointer->RequestAndWait();
    } else if (frames >= kCheckpointFrames) {
      db->checkpointer->Request();
    }
    return SQLITE_OK;
  }

  // Creates the tables of a new index, or brings an older one up to version 4 in place;
  // `rebuilt` is set when the objects table must still be copied into the version-5 layout
  // (the caller commits, then CopyIntoVersion5).
  ghost::Status CreateSchema(bool* rebuilt) {
    if (ghost::Status st =
            Exec("CREATE TABLE IF NOT EXISTS schema_version(version INTEGER NOT NULL)");
        !st.ok()) {
      return st;
    }
    Stmt q;
    if (ghost::Status st = Prepare("SELECT max(version) FROM schema_version", &q); !st.ok())
      return st;
    int rc = q.Step();
    if (rc != SQLITE_ROW) return Error("reading the schema version", rc);
    if (q.IsNull(0)) {
      q = Stmt();
      std::string sql =
          "INSERT INTO schema_version(version) VALUES(" + std::to_string(kSchemaVersion) + ")";
      if (ghost::Status st = Exec(sql.c_str()); !st.ok()) return st;
    } else if (std::int64_t v = q.Int(0); v >= 1 && v <= 4) {
      q = Stmt();
      if (v == 1 && !HasColumn("response")) {
        if (ghost::Status st =
                Exec("ALTER TABLE objects ADD COLUMN response TEXT NOT NULL DEFAULT ''");
            !st.ok()) {
          return st;
        }
      }
      if (v <= 2) {
        if (ghost::Status st = UpgradeToHashes(); !st.ok()) return st;
      }
      *rebuilt = true;
      return Exec(
          "CREATE TABLE IF NOT EXISTS shutdown(clean INTEGER NOT NULL); "
          "INSERT INTO shutdown(clean) SELECT 0 WHERE NOT EXISTS (SELECT 1 FROM shutdown)");
    } else if (v != kSchemaVersion) {
      return ghost::Status::NotSupported(
          "cache index " + path + " has schema version " + std::to_string(v) +
          ", but this ghost reads version " + std::to_string(kSchemaVersion) +
          "; run the ghost that wrote it, or remove the cache directory to start afresh");
    }
    return Exec(
        ("CREATE TABLE IF NOT EXISTS objects(" + std::string(kObjectsTable) + "); " +
         // Covers what Open loads into the table (so a clean Open reads this index, not the
         // rows with their response heads and packed bodies) and every lookup (by h, then key).
         "CREATE INDEX IF NOT EXISTS objects_by_h ON objects(h, complete, size, accessed_us); "
         // The rows of fills cut short, which Open deletes: few, so a small partial index.
         "CREATE INDEX IF NOT EXISTS objects_pending ON objects(h) WHERE complete = 0; "
         // The rows whose body is a file, which a crash recovery checks (packed rows are as
         // safe as the index): few at scale, where most objects are packed.
         "CREATE INDEX IF NOT EXISTS objects_files ON objects(h) "
         "WHERE complete = 1 AND body IS NULL; "
         // One row per key, as the primary key on key did before version 5: an insert replaces
         // the key's row (upsert_complete).
         "CREATE TRIGGER IF NOT EXISTS objects_one_per_key BEFORE INSERT ON objects BEGIN "
         "DELETE FROM objects WHERE h = NEW.h AND key = NEW.key; END; "
         "CREATE TABLE IF NOT EXISTS shutdown(clean INTEGER NOT NULL); "
         "INSERT INTO shutdown(clean) SELECT 0 WHERE NOT EXISTS (SELECT 1 FROM shutdown); "
         // Access times saved after a row was written (kTicksTable): appended, never updated.
         // A table an older ghost of version 5 ignores (it then reads the rows' own times).
         "CREATE TABLE IF NOT EXISTS ticks(h INTEGER NOT NULL, tick INTEGER NOT NULL)")
            .c_str());
  }

  // Versions 1-4 -> 5: the rows copied, in rowid order, into a new file (16 KiB pages, no
  // journal, one transaction, no index yet: CreateSchema makes them at the next Open), which
  // is synced and renamed over this one once complete; closes the handle. A crash before the
  // rename leaves the old file (and a partial copy, removed at the next try); after it, the
  // new one. Heads stay as they were (TEXT) until their object is stored again. One copy of
  // the data, no VACUUM: the in-place rebuild and VACUUM it replaces wrote the table three
  // times through a journal (48.9 s for 100k objects on a loaded machine).
  ghost::Status CopyIntoVersion5() {
    const std::string fresh = path + ".v5";
    for (const char* suffix : {"", "-journal", "-wal", "-shm"}) ::unlink((fresh + suffix).c_str());
    Stmt attach;
    if (ghost::Status st = Prepare("ATTACH DATABASE ?1 AS v5", &attach); !st.ok()) return st;
    attach.Bind(1, fresh);
    if (ghost::Status st = Run(attach, "creating the new index file"); !st.ok()) return st;
    attach = Stmt();
    const std::string all = std::string(kObjectColumns) + ", complete, h, body";
    const std::string copy =
        "PRAGMA v5.page_size=" + std::to_string(kPageSize) + "; PRAGMA v5.journal_mode=OFF; "
        "PRAGMA v5.synchronous=OFF; BEGIN; "
        "CREATE TABLE v5.schema_version(version INTEGER NOT NULL); "
        "INSERT INTO v5.schema_version(version) VALUES(" + std::to_string(kSchemaVersion) + "); "
        "CREATE TABLE v5.objects(" + std::string(kObjectsTable) + "); "
        "INSERT INTO v5.objects(" + all + ") SELECT " + all + " FROM main.objects ORDER BY rowid; "
        "CREATE TABLE v5.shutdown(clean INTEGER NOT NULL); "
        "INSERT INTO v5.shutdown(clean) SELECT clean FROM main.shutdown; COMMIT";
    ghost::Status st = Exec(copy.c_str());
    if (!st.ok()) Exec("ROLLBACK").ok();  // best effort; `st` is the error
    if (ghost::Status detach = Exec("DETACH DATABASE v5"); st.ok()) st = detach;
    if (st.ok()) {
      UniqueFd fd(::open(fresh.c_str(), O_RDONLY | O_CLOEXEC));
      if (!fd.valid() || ::fsync(fd.get()) != 0) {
        st = ghost::Status::FromErrno(errno, "syncing the new cache index " + fresh);
      }
    }
    if (!st.ok()) {
      ::unlink(fresh.c_str());
      return st;
    }
    handle.reset();  // checkpoints and removes the old file's WAL
    // Any WAL left belongs to the old file and must never be applied to the new one; the
    // copy already holds what it had.
    for (const char* suffix : {"-wal", "-shm"}) ::unlink((path + suffix).c_str());
    if (::rename(fresh.c_str(), path.c_str()) != 0) {
      return ghost::Status::FromErrno(errno, "replacing " + path + " by its upgraded copy");
    }
    std::string parent = path.substr(0, path.rfind('/') + 1);
    UniqueFd dir(::open(parent.empty() ? "." : parent.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (dir.valid()) ::fsync(dir.get());
    return ghost::Status::Ok();
  }

  // Whether the last Close was clean (see kSchemaVersion).
  bool WasClean() {
    Stmt q;
    if (!Prepare("SELECT clean FROM shutdown", &q).ok()) return false;
    return q.Step() == SQLITE_ROW && q.Int(0) == 1;
  }

  // Sets the shutdown mark durably: the commit is fsynced (synchronous=FULL for it), since
  // the mark vouches for everything else in the index.
  ghost::Status SetClean(bool clean) {
    if (ghost::Status st = Exec("PRAGMA synchronous=FULL"); !st.ok()) return st;
    set_clean.Bind(1, std::int64_t{clean ? 1 : 0});
    ghost::Status st = Run(set_clean, "setting the shutdown mark");
    if (ghost::Status normal = Exec("PRAGMA synchronous=NORMAL"); st.ok()) st = normal;
    return st;
  }

  bool HasColumn(const char* name) {
    Stmt q;
    if (!Prepare("SELECT name FROM pragma_table_info('objects')", &q).ok()) return false;
    while (q.Step() == SQLITE_ROW) {
      if (q.Text(0) == name) return true;
    }
    return false;
  }

  // Version 2 -> 3: the h and body columns, h computed for every row (once).
  ghost::Status UpgradeToHashes() {
    for (const char* col : {"h", "body"}) {
      if (HasColumn(col)) continue;
      std::string sql = std::string("ALTER TABLE objects ADD COLUMN ") + col +
                        (col[0] == 'h' ? " INTEGER" : " BLOB");
      if (ghost::Status st = Exec(sql.c_str()); !st.ok()) return st;
    }
    Stmt q, set;
    if (ghost::Status st = Prepare("SELECT rowid, key FROM objects", &q); !st.ok()) return st;
    if (ghost::Status st = Prepare("UPDATE objects SET h = ?2 WHERE rowid = ?1", &set); !st.ok())
      return st;
    int rc;
    while ((rc = q.Step()) == SQLITE_ROW) {
      set.Bind(1, q.Int(0));
      set.Bind(2, StoredHash(CacheStore::KeyHash(q.Text(1))));
      if (ghost::Status st = Run(set, "hashing the keys of an older index"); !st.ok()) return st;
    }
    return rc == SQLITE_DONE ? ghost::Status::Ok() : Error("hashing the keys", rc);
  }

  // Binds ?1..?9 of insert_pending / upsert_complete.
  void BindObject(Stmt& s, const std::string& key, const CacheEntry& e, std::int64_t fetched_us,
                  std::int64_t accessed_us, std::optional<std::int64_t> expires_us) {
    s.Bind(1, key);
    s.Bind(2, static_cast<std::int64_t>(e.size));
    BindHead(s, 3, 9, e);
    s.Bind(6, expires_us);
    s.Bind(7, fetched_us);
    s.Bind(8, accessed_us);
    s.Bind(10, StoredHash(CacheStore::KeyHash(key)));
  }

  // Binds etag, last_modified and content_type at etag_at.. etag_at + 2, and the head at
  // head_at, in their stored form (HeadCodec).
  void BindHead(Stmt& s, int etag_at, int head_at, const CacheEntry& e) {
    std::string stored;
    bool packed = heads.Encode(e, &stored);
    s.Bind(etag_at, packed ? std::string_view() : std::string_view(e.etag));
    s.Bind(etag_at + 1, packed ? std::string_view() : std::string_view(e.last_modified));
    s.Bind(etag_at + 2, packed ? std::string_view() : std::string_view(e.content_type));
    if (packed) {
      s.BindBlob(head_at, stored);
    } else {
      s.Bind(head_at, std::string_view(e.response));
    }
  }

  // Reads etag, last_modified and content_type from columns etag_col.. etag_col + 2 and the
  // head from head_col into `e`. A BLOB that does not decode reads as no head (the object is
  // then served with the head its columns give, as one ghostfs fetched itself).
  void ReadHead(const Stmt& q, int etag_col, int head_col, CacheEntry* e) {
    e->etag = q.Text(etag_col);
    e->last_modified = q.Text(etag_col + 1);
    e->content_type = q.Text(etag_col + 2);
    if (!q.IsBlob(head_col)) {
      e->response = q.Text(head_col);
    } else if (!heads.Decode(q.Text(head_col), e)) {
      std::fprintf(stderr, "ghost: cache store: an unreadable stored response head in %s\n",
                   path.c_str());
      e->response.clear();
    }
  }
};

// ---- Opening ----

CacheStore::CacheStore(std::string dir, Bytes capacity, const Clock& clock, FileIo& io,
                       const CacheStoreOptions& options)
    : dir_(std::move(dir)),
      capacity_(capacity),
      pack_limit_(options.pack_limit),
      access_batch_(options.access_batch),
      ticks_min_rows_(options.ticks_min_rows),
      access_max_lag_(options.access_max_lag),
      clock_(clock),
      io_(io) {
  auto wall = options.wall_clock ? options.wall_clock() : std::chrono::system_clock::now();
  auto wall_us =
      std::chrono::duration_cast<std::chrono::microseconds>(wall.time_since_epoch()).count();
  wall_offset_us_ = wall_us - clock_.Now().time_since_epoch().count();
}

Result<std::unique_ptr<CacheStore>> CacheStore::Open(const std::string& dir, Bytes capacity,
                                                     const Clock& clock, FileIo& io,
                                                     const CacheStoreOptions& options) {
  if (dir.empty()) return ghost::Status::InvalidArgument("the cache directory path is empty");
  std::string root = dir;
  while (root.size() > 1 && root.back() == '/') root.pop_back();
  if (ghost::Status st = MakeDir(root, "cache directory"); !st.ok()) return st;
  if (ghost::Status st = MakeDir(root + "/objects", "cache object directory"); !st.ok()) return st;

  std::unique_ptr<CacheStore> store(new CacheStore(root, capacity, clock, io, options));
  ghost::Status st = store->OpenIndex();
  if (st.ok()) st = store->Load();
  if (!st.ok() && store->db_ && IsCorruption(store->db_->last_rc)) {
    // A damaged page met while loading: start afresh like an unreadable file.
    store->table_ = ObjectTable();
    store->last_tick_ = 0;
    store->SetAsideCorruptIndex(st.message());
    store->db_ = std::make_unique<Db>();
    store->db_->path = root + "/index.sqlite";
    st = store->db_->Open();
    if (st.ok()) st = store->Load();
  }
  // After a clean Close every file under objects/ is a committed body or nothing: no scan.
  if (st.ok() && !store->clean_open_) st = store->RemoveOrphans();
  if (!st.ok()) {
    store->db_.reset();  // possibly half set up: the destructor must not write through it
    store->closed_ = true;
    return st;
  }
  return store;
}

void CacheStore::Warn(std::string line) {
  std::fprintf(stderr, "ghost: cache store: %s\n", line.c_str());
  warnings_.push_back(std::move(line));
}

ghost::Status CacheStore::OpenIndex() {
  db_ = std::make_unique<Db>();
  db_->path = dir_ + "/index.sqlite";
  ghost::Status st = db_->Open();
  if (st.ok() || !IsCorruption(db_->last_rc)) return st;
  SetAsideCorruptIndex(st.message());
  db_ = std::make_unique<Db>();
  db_->path = dir_ + "/index.sqlite";
  return db_->Open();
}

void CacheStore::SetAsideCorruptIndex(const std::string& why) {
  db_.reset();  // closes the file before it is renamed
  auto now = std::chrono::system_clock::now().time_since_epoch();
  std::string path = dir_ + "/index.sqlite";
  std::string aside = path + ".corrupt-" +
                      std::to_string(std::chrono::duration_cast<std::chrono::seconds>(now).count());
  for (const char* suffix : {"", "-wal", "-shm", "-journal"}) {
    std::string from = path + suffix;
    if (::access(from.c_str(), F_OK) != 0) continue;
    if (::rename(from.c_str(), (aside + suffix).c_str()) != 0) ::unlink(from.c_str());
  }
  Warn("the cache index was unreadable (" + why + "); moved it to " + aside +
       " and started an empty cache (cached bodies were discarded)");
}

ghost::Status CacheStore::Load() {
  std::vector<std::string> doomed_files;  // removed after the transaction commits
  std::size_t damaged = 0;
  // After a clean Close no body file is checked here (a million stats would take seconds);
  // a body changed behind the store's back is caught when it is opened (CheckBody). The mark
  // is cleared, durably, before anything else is written: a crash from here on makes the
  // next Open check everything.
  clean_open_ = db_->WasClean();
  if (clean_open_) {
    if (ghost::Status st = db_->SetClean(false); !st.ok()) return st;
  }
  ghost::Status st = Batch([&]() -> ghost::Status {
    // Fills and replacements cut short by a crash: their rows and any body at their path.
    Stmt q;
    if (ghost::Status s = db_->Prepare("SELECT key FROM objects WHERE complete = 0", &q); !s.ok()) {
      return s;
    }
    int rc;
    while ((rc = q.Step()) == SQLITE_ROW) doomed_files.push_back(BodyPath(q.Text(0)));
    if (rc != SQLITE_DONE) return db_->Error("listing incomplete objects", rc);
    q = Stmt();
    if (ghost::Status s = db_->Exec("DELETE FROM objects WHERE complete = 0"); !s.ok()) return s;

    // After a crash, the bodies in doubt are the body files (a power cut may lose a file whose
    // row committed); packed bodies are rows, as safe as the index. Only the rows with a body
    // file are read, through the partial index objects_files: recovery costs what is in doubt,
    // not the cache's size (a million packed objects read their whole rows in 29.8 s).
    std::vector<std::string> dropped;
    std::unordered_set<std::int64_t> damaged_rows;
    if (!clean_open_) {
      if (ghost::Status s = db_->Prepare("SELECT rowid, size, key FROM objects INDEXED BY "
                                         "objects_files WHERE complete = 1 AND body IS NULL",
                                         &q);
          !s.ok()) {
        return s;
      }
      while ((rc = q.Step()) == SQLITE_ROW) {
        // A body that is missing or the wrong length (lost by a power cut, or edited) is
        // never served.
        struct stat sb;
        std::string key = q.Text(2);
        std::string path = BodyPath(key);
        if (::stat(path.c_str(), &sb) != 0 || !S_ISREG(sb.st_mode) ||
            static_cast<Bytes>(sb.st_size) != static_cast<Bytes>(q.Int(1))) {
          ++damaged;
          damaged_rows.insert(q.Int(0));
          dropped.push_back(std::move(key));
        }
      }
      if (rc != SQLITE_DONE) return db_->Error("checking body files", rc);
    }

    // Only what the table holds, from the covering index objects_by_h (not the rows with
    // their response heads and packed bodies).
    if (ghost::Status s = db_->Prepare(
            "SELECT h, size, accessed_us, rowid FROM objects WHERE complete = 1", &q);
        !s.ok()) {
      return s;
    }
    std::vector<std::int64_t> dropped_rows;  // their keys are read after the scan
    while ((rc = q.Step()) == SQLITE_ROW) {
      auto h = static_cast<std::uint64_t>(q.Int(0));
      auto size = static_cast<Bytes>(q.Int(1));
      std::int64_t tick = q.Int(2);
      if (!damaged_rows.empty() && damaged_rows.count(q.Int(3)) != 0) continue;
      if (table_.Contains(h) || (capacity_ != 0 && size > capacity_)) {
        // A 64-bit hash collision (the later row goes), or bigger than a lowered cap.
        dropped_rows.push_back(q.Int(3));
        continue;
      }
      table_.Put(h, size, tick);
      last_tick_ = std::max(last_tick_, tick);
    }
    if (rc != SQLITE_DONE) return db_->Error("loading objects", rc);
    // Access times saved after their rows (kTicksTable): the newest of each object wins.
    // Rows of objects gone since (evicted, erased, dropped above) are skipped.
    if (ghost::Status s = db_->Prepare("SELECT h, tick FROM ticks", &q); !s.ok()) return s;
    tick_rows_ = 0;
    while ((rc = q.Step()) == SQLITE_ROW) {
      ++tick_rows_;
      auto h = static_cast<std::uint64_t>(q.Int(0));
      std::int64_t tick = q.Int(1);
      const ObjectTable::Slot* slot = table_.Get(h);
      if (slot == nullptr || slot->tick >= tick) continue;
      table_.Touch(h, tick);
      last_tick_ = std::max(last_tick_, tick);
    }
    if (rc != SQLITE_DONE) return db_->Error("loading access times", rc);
    if (!dropped_rows.empty()) {
      if (ghost::Status s = db_->Prepare("SELECT key FROM objects WHERE rowid = ?1", &q); !s.ok())
        return s;
      for (std::int64_t row : dropped_rows) {
        q.Bind(1, row);
        if (q.Step() == SQLITE_ROW) dropped.push_back(q.Text(0));
        q.Reset();
      }
    }
    q = Stmt();
    for (std::string& key : EvictFor(0, 0)) dropped.push_back(std::move(key));  // lowered cap
    for (const std::string& key : dropped) {
      db_->delete_key.Bind(1, key);
      if (ghost::Status s = db_->Run(db_->delete_key, "dropping an object"); !s.ok()) return s;
      doomed_files.push_back(BodyPath(key));
    }
    return ghost::Status::Ok();
  });
  if (!st.ok()) return st;
  for (const std::string& path : doomed_files) RemoveFile(path);
  if (damaged > 0) {
    Warn("dropped " + std::to_string(damaged) +
         " cached objects whose body files were missing or of the wrong size");
  }
  return ghost::Status::Ok();
}

ghost::Status CacheStore::RemoveOrphans() {
  // Every file under objects/ that is not the body of an indexed object: temp files of fills
  // cut short, bodies whose row was never committed or was dropped. A body's name starts with
  // its table hash, so no key is read.
  std::string objects = dir_ + "/objects";
  DirPtr top(::opendir(objects.c_str()));
  if (!top) return ghost::Status::FromErrno(errno, "cannot list cache objects in " + objects);
  while (dirent* d = ::readdir(top.get())) {
    std::string name = d->d_name;
    if (name == "." || name == "..") continue;
    std::string sub = objects + "/" + name;
    struct stat sb;
    if (::lstat(sub.c_str(), &sb) != 0) continue;
    if (!S_ISDIR(sb.st_mode)) {
      RemoveFile(sub);
      continue;
    }
    DirPtr inner(::opendir(sub.c_str()));
    if (!inner) continue;
    while (dirent* f = ::readdir(inner.get())) {
      std::string file = f->d_name;
      if (file == "." || file == "..") continue;
      bool body = file.size() == 64 && IsLowerHex(file) && file.compare(0, 2, name) == 0;
      if (body) {
        unsigned char digest8[8];
        for (int i = 0; i < 8; ++i) {
          digest8[i] = static_cast<unsigned char>(std::stoi(file.substr(2 * i, 2), nullptr, 16));
        }
        if (table_.Contains(ObjectTable::HashOf(digest8))) continue;
      }
      std::string path = sub + "/" + file;
      if (::lstat(path.c_str(), &sb) == 0 && !S_ISDIR(sb.st_mode)) RemoveFile(path);
    }
  }
  return ghost::Status::Ok();
}

CacheStore::~CacheStore() {
  if (ghost::Status st = Close(); !st.ok()) {
    std::fprintf(stderr, "ghost: cache store: closing %s: %s\n", dir_.c_str(),
                 st.ToString().c_str());
  }
}

ghost::Status CacheStore::Close() {
  if (closed_) return ghost::Status::Ok();
  std::vector<FillId> ids;
  for (const auto& [id, fill] : fills_) ids.push_back(id);
  for (FillId id : ids) AbortFill(id);
  ghost::Status st = Batch([] { return ghost::Status::Ok(); }, true);  // persists access times
  if (st.ok() && !lost_files_ && db_) {
    // No syncfs first: it flushes the whole file system's dirty data (seconds on a busy
    // machine, measured: an unmount outlived its caller's 10 s wait and was killed, so every
    // next Open was a crash recovery). A body lost to a power cut after this Close has the
    // wrong size (none, or 0 bytes), which CheckBody finds at its first open, as Open used to.
    st = db_->SetClean(true);
  }
  db_.reset();  // finalizes the statements, checkpoints the WAL and closes the file
  closed_ = true;
  return st;
}

void CacheStore::PrepareFork() {
  if (db_ && db_->checkpointer) db_->checkpointer->Stop();
}

ghost::Status CacheStore::ClosedError() const {
  return ghost::Status::Internal("the cache store in " + dir_ + " is closed");
}

// ---- Helpers ----

namespace {

// SHA-256 of `data` into `digest`. OpenSSL 3's one-shot SHA256() looks the algorithm up in its
// provider store on every call (EVP_MD_fetch, under a lock): two thirds of a key hash's time,
// and a mount hashes a key several times per open. Fetched once here; same bytes out.
void Sha256(std::string_view data, unsigned char* digest) {
  static EVP_MD* const md = EVP_MD_fetch(nullptr, "SHA256", nullptr);
  unsigned int len = 0;
  if (md == nullptr || EVP_Digest(data.data(), data.size(), digest, &len, md, nullptr) != 1) {
    ::SHA256(reinterpret_cast<const unsigned char*>(data.data()), data.size(), digest);
  }
}

}  // namespace

std::string CacheStore::ObjectName(std::string_view key) {
  unsigned char digest[SHA256_DIGEST_LENGTH];
  Sha256(key, digest);
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (unsigned char b : digest) {
    out += kHex[b >> 4];
    out += kHex[b & 0xf];
  }
  return out;
}

std::uint64_t CacheStore::KeyHash(std::string_view key) {
  // One request asks for the same key's hash several times in a row (find, touch, the packed
  // body, the table): the last one is remembered, per thread.
  thread_local std::string last_key;
  thread_local std::uint64_t last_hash = 0;
  thread_local bool have_last = false;
  if (have_last && key == last_key) return last_hash;
  unsigned char digest[SHA256_DIGEST_LENGTH];
  Sha256(key, digest);
  last_hash = ObjectTable::HashOf(digest);
  last_key.assign(key);
  have_last = true;
  return last_hash;
}

std::int64_t CacheStore::NextTick() {
  std::int64_t t = ToStored(clock_.Now());
  if (t <= last_tick_) t = last_tick_ + 1;
  last_tick_ = t;
  return t;
}

std::optional<std::string> CacheStore::KeyOf(std::uint64_t h) const {
  if (!db_) return std::nullopt;
  Stmt& q = db_->select_key;
  q.Bind(1, StoredHash(h));
  std::optional<std::string> key;
  if (q.Step() == SQLITE_ROW) key = q.Text(0);
  q.Reset();
  return key;
}

std::optional<CacheEntry> CacheStore::LoadEntry(const std::string& key,
                                                const ObjectTable::Slot& slot,
                                                PackedRead* packed) const {
  CacheEntry e;
  if (auto dirty = dirty_meta_.find(key); dirty != dirty_meta_.end()) {
    e = dirty->second;
  } else {
    if (!db_) return std::nullopt;
    Stmt& q = db_->select_entry;
    ++index_reads_;
    q.Bind(1, key);
    if (q.Step() != SQLITE_ROW) {
      q.Reset();
      return std::nullopt;  // a colliding hash: another key holds the slot
    }
    db_->ReadHead(q, 2, 8, &e);
    if (!q.IsNull(5)) e.expires = FromStored(q.Int(5));
    e.fetched = FromStored(q.Int(6));
    if (packed != nullptr) {
      packed->known = true;
      packed->body = q.IsNull(9) ? nullptr : std::make_shared<const std::string>(q.Text(9));
    }
    q.Reset();
  }
  e.size = slot.size;
  e.where = Residence::kDisk;
  e.last_access = FromStored(slot.tick);
  return e;
}

const CacheEntry* CacheStore::FindEntry(const std::string& key) const {
  const ObjectTable::Slot* slot = table_.Get(KeyHash(key));
  if (slot == nullptr) return nullptr;
  auto it = found_.find(key);
  if (it != found_.end() && !it->second.stale) {
    it->second.entry.size = slot->size;
    it->second.entry.last_access = FromStored(slot->tick);
    return &it->second.entry;
  }
  PackedRead packed;
  std::optional<CacheEntry> e = LoadEntry(key, *slot, &packed);
  if (!e) return nullptr;
  if (it != found_.end()) {  // reloaded into the same node
    it->second.entry = std::move(*e);
    it->second.stale = false;
    it->second.packed = std::move(packed);
    return &it->second.entry;
  }
  while (found_.size() >= kFoundLimit && !found_order_.empty()) {
    found_.erase(found_order_.front());
    found_order_.pop_front();
  }
  found_order_.push_back(key);
  return &found_.emplace(key, Found{std::move(*e), false, std::move(packed)}).first->second.entry;
}

void CacheStore::ForEachEntry(
    const std::function<void(const std::string&, const CacheEntry&)>& fn) const {
  std::vector<ObjectTable::Slot> slots;
  slots.reserve(table_.size());
  table_.ForEach([&](const ObjectTable::Slot& s) { slots.push_back(s); });
  std::sort(slots.begin(), slots.end(), [](const auto& a, const auto& b) {
    return a.tick != b.tick ? a.tick < b.tick : a.hash < b.hash;
  });
  for (const ObjectTable::Slot& slot : slots) {
    std::optional<std::string> key = KeyOf(slot.hash);
    if (!key) continue;
    if (std::optional<CacheEntry> e = LoadEntry(*key, slot)) fn(*key, *e);
  }
}

bool CacheStore::Unindex(const std::string& key) {
  std::uint64_t h = KeyHash(key);
  MarkStale(key);
  dirty_access_.erase(h);
  dirty_meta_.erase(key);
  return table_.Erase(h);
}

std::vector<std::string> CacheStore::EvictFor(Bytes incoming, std::uint64_t keep) {
  std::vector<std::string> evicted;
  if (capacity_ == 0 || incoming > capacity_) return evicted;
  while (table_.size() > 0 && table_.total_bytes() > capacity_ - incoming) {
    std::optional<ObjectTable::Slot> victim = table_.PickVictim(keep);
    if (!victim) break;
    table_.Erase(victim->hash);
    dirty_access_.erase(victim->hash);
    if (std::optional<std::string> key = KeyOf(victim->hash)) {
      MarkStale(*key);
      dirty_meta_.erase(*key);
      evicted.push_back(std::move(*key));
    }
  }
  return evicted;
}

// ---- StoreIndex ----

const CacheEntry* StoreIndex::Find(const std::string& key) const {
  return store_->FindEntry(key);
}
bool StoreIndex::Contains(const std::string& key) const {
  return store_->table_.Contains(CacheStore::KeyHash(key));
}
CacheStatus StoreIndex::Status(const std::string& key, bool network_preferred) const {
  const ObjectTable::Slot* slot = store_->table_.Get(CacheStore::KeyHash(key));
  if (slot == nullptr) return CacheStatus{};
  return CacheStatus{
      network_preferred ? CacheState::kPresentNetworkPreferred : CacheState::kPresent, slot->size};
}
std::size_t StoreIndex::size() const { return store_->table_.size(); }
Bytes StoreIndex::total_bytes() const { return store_->table_.total_bytes(); }
void StoreIndex::ForEach(
    const std::function<void(const std::string&, const CacheEntry&)>& fn) const {
  store_->ForEachEntry(fn);
}

std::string CacheStore::BodyPath(std::string_view key) const {
  std::string name = ObjectName(key);
  return dir_ + "/objects/" + name.substr(0, 2) + "/" + name;
}

void CacheStore::RemoveFile(const std::string& path) {
  if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
    lost_files_ = true;  // an orphan on the disk: the next Open must scan for it
    Warn("cannot remove " + path + ": " + std::strerror(errno));
  }
}

void CacheStore::Defer(std::function<void()> fn) {
  // FileIo is this store's only way onto the loop: a zero-length read of no file moves
  // nothing and completes on the loop's next turn. Its (EBADF) result is ignored.
  std::weak_ptr<int> alive = alive_;
  io_.Read(-1, 0, std::span<char>(), [alive, fn = std::move(fn)](Result<std::size_t>) {
    if (!alive.expired()) fn();
  });
}

bool CacheStore::AccessTimesDue() const {
  if (dirty_access_.empty()) return false;
  return dirty_access_.size() >= access_batch_ || clock_.Now() - first_dirty_access_ >= access_max_lag_;
}

ghost::Status CacheStore::Batch(const std::function<ghost::Status()>& changes, bool all_access) {
  if (!db_) return ClosedError();
  if (ghost::Status st = db_->Run(db_->begin, "beginning a transaction"); !st.ok()) return st;
  ghost::Status st = ghost::Status::Ok();
  // Access times wait for a batch (a transaction writes at least one page; a batch of
  // appended ticks shares the table's last pages, kTicksTable).
  const bool write_access = all_access || AccessTimesDue();
  std::size_t tick_rows = tick_rows_;
  if (write_access && tick_rows_ + dirty_access_.size() > std::max(ticks_min_rows_, table_.size())) {
    // Compaction: the table's ticks replace the appended ones, one row per object.
    st = db_->Run(db_->delete_ticks, "compacting the access times");
    tick_rows = 0;
    table_.ForEach([&](const ObjectTable::Slot& slot) {
      if (st.ok()) st = AppendTick(slot.hash, slot.tick);
      ++tick_rows;
    });
  } else if (write_access) {
    for (std::uint64_t h : dirty_access_) {
      const ObjectTable::Slot* slot = table_.Get(h);
      if (slot == nullptr) continue;
      st = AppendTick(h, slot->tick);
      if (!st.ok()) break;
      ++tick_rows;
    }
  }
  for (const auto& [key, meta] : dirty_meta_) {
    if (!st.ok()) break;
    if (!table_.Contains(KeyHash(key))) continue;
    const CacheEntry* e = &meta;
    Stmt& s = db_->update_meta;
    s.Bind(1, key);
    db_->BindHead(s, 2, 7, *e);
    s.Bind(5, e->expires ? std::optional<std::int64_t>(ToStored(*e->expires)) : std::nullopt);
    s.Bind(6, ToStored(e->fetched));
    st = db_->Run(s, "updating the metadata of " + Quote(key));
  }
  if (st.ok()) st = changes();
  if (st.ok()) st = db_->Run(db_->commit, "committing a transaction");
  if (!st.ok()) {
    db_->Run(db_->rollback, "rolling back").ok();  // best effort: `st` is the error to report
    return st;
  }
  ++transactions_;
  tick_rows_ = tick_rows;
  if (write_access) {
    dirty_access_.clear();
    ++access_saves_;
  }
  dirty_meta_.clear();  // Find reads them from sqlite now
  return ghost::Status::Ok();
}

ghost::Status CacheStore::AppendTick(std::uint64_t h, std::int64_t tick) {
  db_->insert_tick.Bind(1, StoredHash(h));
  db_->insert_tick.Bind(2, tick);
  return db_->Run(db_->insert_tick, "saving an access time");
}

std::uint64_t CacheStore::pages_written() const {
  if (!db_ || !db_->handle) return 0;
  int cur = 0, high = 0;
  sqlite3_db_status(db_->handle.get(), SQLITE_DBSTATUS_CACHE_WRITE, &cur, &high, 0);
  return static_cast<std::uint64_t>(cur);
}

ghost::Status CacheStore::DropObjects(const std::vector<std::string>& keys) {
  if (keys.empty()) return ghost::Status::Ok();
  for (const std::string& key : keys) {
    dirty_access_.erase(KeyHash(key));
    dirty_meta_.erase(key);
    MarkStale(key);
  }
  ghost::Status st = Batch([&]() -> ghost::Status {
    for (const std::string& key : keys) {
      db_->delete_key.Bind(1, key);
      if (ghost::Status s = db_->Run(db_->delete_key, "deleting an object"); !s.ok()) return s;
    }
    return ghost::Status::Ok();
  });
  // The bodies go even if the rows could not: a row without its body is dropped at Open,
  // and the bytes on disk must respect the cap.
  for (const std::string& key : keys) RemoveFile(BodyPath(key));
  for (const std::string& key : keys) Changed(key);
  return st;
}

// ---- Queries and metadata ----

CacheStatus CacheStore::Status(const std::string& key, bool network_preferred) const {
  return view_.Status(key, network_preferred);
}

bool CacheStore::Touch(const std::string& key) {
  std::uint64_t h = KeyHash(key);
  if (!table_.Touch(h, NextTick())) return false;
  if (dirty_access_.empty()) first_dirty_access_ = clock_.Now();
  if (dirty_access_.insert(h).second && unsaved_index_changes() == 1 && on_unsaved_) on_unsaved_();
  return true;
}

ghost::Status CacheStore::UpdateMeta(const std::string& key,
                                     const std::function<void(CacheEntry&)>& fn) {
  if (closed_) return ClosedError();
  const CacheEntry* current = FindEntry(key);
  if (current == nullptr) return ghost::Status::NotFound("not in the cache: " + Quote(key));
  CacheEntry updated = *current;
  fn(updated);
  updated.size = current->size;
  updated.where = current->where;
  updated.last_access = current->last_access;
  if (auto it = found_.find(key); it != found_.end()) {
    it->second.entry = updated;  // in place: a pointer Find handed out sees the change
    it->second.stale = false;
  }
  bool first = unsaved_index_changes() == 0;
  dirty_meta_.insert_or_assign(key, std::move(updated));
  if (first && on_unsaved_) on_unsaved_();
  Changed(key);
  return ghost::Status::Ok();
}

ghost::Status CacheStore::SaveIndex() {
  if (closed_) return ClosedError();
  if (unsaved_index_changes() == 0) return ghost::Status::Ok();
  return Batch([] { return ghost::Status::Ok(); }, true);
}

ghost::Status CacheStore::Erase(const std::string& key) {
  if (closed_) return ClosedError();
  if (!Unindex(key)) return ghost::Status::NotFound("not in the cache: " + Quote(key));
  return DropObjects({key});
}

void CacheStore::ReadBody(const std::string& key, std::uint64_t offset, std::span<char> buf,
                          FileIo::Done done) {
  if (closed_) {
    Defer([done = std::move(done), st = ClosedError()] { done(st); });
    return;
  }
  if (!view_.Contains(key)) {
    Defer([done = std::move(done),
           st = ghost::Status::NotFound("not in the cache: " + Quote(key))] { done(st); });
    return;
  }
  if (std::shared_ptr<const std::string> packed = PackedBody(key)) {
    Touch(key);
    std::size_t from = static_cast<std::size_t>(std::min<std::uint64_t>(offset, packed->size()));
    std::size_t n = std::min(buf.size(), packed->size() - from);
    std::memcpy(buf.data(), packed->data() + from, n);
    Defer([done = std::move(done), n] { done(n); });
    return;
  }
  std::string path = BodyPath(key);
  auto fd = std::make_shared<UniqueFd>(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd->valid()) {
    int err = errno;
    if (err == ENOENT) {  // removed behind our back: stop claiming to have it
      Unindex(key);
      DropObjects({key}).ok();  // best effort: the read's error is what the caller needs
    }
    Defer([done = std::move(done),
           st = ghost::Status::FromErrno(err, "opening the cached body of " + Quote(key))] {
      done(st);
    });
    return;
  }
  if (ghost::Status st = CheckBody(key, fd->get()); !st.ok()) {
    Defer([done = std::move(done), st] { done(st); });
    return;
  }
  Touch(key);
  std::weak_ptr<int> alive = alive_;
  // `fd` rides along so the body stays open (even if evicted meanwhile) until the read ends.
  io_.Read(fd->get(), offset, buf,
           [alive, fd, done = std::move(done),
            what = "reading the cached body of " + Quote(key)](Result<std::size_t> r) {
             if (alive.expired()) return;
             if (!r.ok()) {
               done(WithErrnoContext(r.status(), what));
             } else {
               done(std::move(r));
             }
           });
}

std::shared_ptr<const std::string> CacheStore::PackedBody(const std::string& key) const {
  if (!db_ || !table_.Contains(KeyHash(key))) return nullptr;
  // Read with the entry by a Find since the object last changed (a change marks it stale).
  if (auto it = found_.find(key); it != found_.end() && !it->second.stale && it->second.packed.known) {
    return it->second.packed.body;
  }
  Stmt& q = db_->select_packed;
  ++index_reads_;
  q.Bind(1, key);
  std::shared_ptr<const std::string> body;
  if (q.Step() == SQLITE_ROW) body = std::make_shared<const std::string>(q.Text(0));
  q.Reset();
  return body;
}

std::string CacheStore::PackedVersion(std::string_view body) {
  // The content names the version: equal bytes may share the kernel's pages.
  char buf[48];
  std::snprintf(buf, sizeof buf, "p%016llx-%zu",
                static_cast<unsigned long long>(std::hash<std::string_view>{}(body)), body.size());
  return buf;
}

ghost::Status CacheStore::CheckBody(const std::string& key, int fd) {
  const ObjectTable::Slot* slot = table_.Get(KeyHash(key));
  if (slot == nullptr) return ghost::Status::NotFound("not in the cache: " + Quote(key));
  struct stat sb;
  if (::fstat(fd, &sb) != 0) {
    return ghost::Status::FromErrno(errno, "checking the cached body of " + Quote(key));
  }
  if (S_ISREG(sb.st_mode) && static_cast<Bytes>(sb.st_size) == slot->size) {
    return ghost::Status::Ok();
  }
  std::string why = "the cached body of " + Quote(key) + " has " + std::to_string(sb.st_size) +
                    " bytes but the index says " + std::to_string(slot->size) +
                    "; dropped it (it is fetched again)";
  Unindex(key);
  DropObjects({key}).ok();  // best effort: the caller needs `why`
  Warn(why);
  return ghost::Status::FromErrno(ENOENT, why);
}

// ---- Fills ----

Result<FillId> CacheStore::BeginFill(const std::string& key, CacheEntry meta) {
  if (closed_) return ClosedError();
  if (capacity_ != 0 && meta.size > capacity_) {
    return ghost::Status::InvalidArgument(TooBig(key, meta.size, capacity_));
  }
  if (meta.size > 0) {
    // Make room now, while the disk is being written anyway, rather than overshoot the cap
    // with this body in flight.
    if (ghost::Status st = DropObjects(EvictFor(meta.size, 0)); !st.ok()) return st;
  }
  // A fill announced under the pack limit is published by one transaction holding its row and
  // body (or not at all: a size mismatch is refused), so it needs no pending row and no temp
  // file: its bytes wait in RAM (at most the announced size; more fails the fill), and a crash
  // before the commit leaves nothing. (The temp file's create, write, read-back and unlink were
  // a third of the daemon's CPU per small miss.)
  const bool packed_ahead = meta.size != 0 && meta.size < pack_limit_;
  FillId id = next_fill_id_++;
  if (packed_ahead) {
    Fill fill;
    fill.key = key;
    fill.meta = std::move(meta);
    fill.in_memory = true;
    fills_.emplace(id, std::move(fill));
    return id;
  }
  std::string body = BodyPath(key);
  std::string subdir = body.substr(0, body.rfind('/'));
  if (ghost::Status st = MakeDir(subdir, "cache object directory"); !st.ok()) return st;
  std::string temp = body + ".fill-" + std::to_string(id);
  auto fd = std::make_shared<UniqueFd>(
      ::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
  if (!fd->valid()) {
    return ghost::Status::FromErrno(errno, "creating " + temp + " to cache " + Quote(key));
  }
  TimePoint now = clock_.Now();
  ghost::Status st = Batch([&]() -> ghost::Status {
    db_->BindObject(db_->insert_pending, key, meta, ToStored(now), ToStored(now), std::nullopt);
    return db_->Run(db_->insert_pending, "recording the fill of " + Quote(key));
  });
  if (!st.ok()) {
    fd.reset();
    RemoveFile(temp);
    return st;
  }
  Fill fill;
  fill.key = key;
  fill.meta = std::move(meta);
  fill.temp_path = std::move(temp);
  fill.fd = std::move(fd);
  fills_.emplace(id, std::move(fill));
  return id;
}

void CacheStore::AppendFill(FillId id, std::string data, std::function<void(ghost::Status)> done) {
  auto it = fills_.find(id);
  if (it == fills_.end()) {
    Defer([done = std::move(done),
           st = ghost::Status::NotFound("no cache fill " + std::to_string(id) +
                                        " (it was committed or aborted)")] { done(st); });
    return;
  }
  Fill& fill = it->second;
  if (fill.error.ok() && fill.committing) {
    Defer([done = std::move(done),
           st = ghost::Status::InvalidArgument("append to the cache fill of " + Quote(fill.key) +
                                               " after its commit")] { done(st); });
    return;
  }
  if (fill.error.ok() && capacity_ != 0 && fill.written + data.size() > capacity_) {
    Fail(fill,
         ghost::Status::InvalidArgument(TooBig(fill.key, fill.written + data.size(), capacity_)));
  }
  if (fill.error.ok() && fill.in_memory && fill.written + data.size() > fill.meta.size) {
    Fail(fill, ghost::Status::InvalidArgument(
                   "the cache fill of " + Quote(fill.key) + " grew past the " +
                   std::to_string(fill.meta.size) +
                   " bytes announced; a body of another size is not cached"));
  }
  if (!fill.error.ok()) {
    Defer([done = std::move(done), st = fill.error] { done(st); });
    return;
  }
  if (fill.in_memory) {
    // Kept in RAM until the commit; the completion comes on the loop, as a write's would.
    fill.memory += data;
    fill.written += data.size();
    ++fill.in_flight;
    std::weak_ptr<int> alive = alive_;
    Defer([this, alive, id, done = std::move(done)] {
      if (alive.expired()) return;
      OnAppendDone(id, ghost::Status::Ok(), done);
    });
    return;
  }
  std::uint64_t offset = fill.written;
  fill.written += data.size();
  ++fill.in_flight;
  std::weak_ptr<int> alive = alive_;
  io_.Write(fill.fd->get(), offset, std::move(data),
            [this, alive, id, fd = fill.fd, done = std::move(done)](Result<std::size_t> r) {
              if (alive.expired()) return;
              OnAppendDone(id, r.status(), done);
            });
}

void CacheStore::OnAppendDone(FillId id, ghost::Status st,
                              const std::function<void(ghost::Status)>& done) {
  auto it = fills_.find(id);
  if (it == fills_.end()) {
    done(ghost::Status::Internal("cache fill " + std::to_string(id) +
                                 " was aborted before this append completed"));
    return;
  }
  Fill& fill = it->second;
  --fill.in_flight;
  if (!st.ok() && fill.error.ok()) {
    Fail(fill, WithErrnoContext(
                   st, "cache fill of " + Quote(fill.key) + " abandoned, nothing of it is cached"));
  }
  ghost::Status result = fill.error;
  bool commit_now = fill.committing && fill.in_flight == 0;
  std::weak_ptr<int> alive = alive_;
  done(result);  // may begin, append to or abort fills (`fill` is not used after this), or
                 // even destroy the store
  if (commit_now && !alive.expired()) FinishCommit(id);
}

void CacheStore::CommitFill(FillId id, std::function<void(ghost::Status)> done) {
  auto it = fills_.find(id);
  if (it == fills_.end()) {
    Defer([done = std::move(done),
           st = ghost::Status::NotFound("no cache fill " + std::to_string(id) +
                                        " (it was committed or aborted)")] { done(st); });
    return;
  }
  Fill& fill = it->second;
  if (fill.committing) {
    Defer([done = std::move(done),
           st = ghost::Status::InvalidArgument("the cache fill of " + Quote(fill.key) +
                                               " was committed twice")] { done(st); });
    return;
  }
  fill.committing = true;
  fill.commit_done = std::move(done);
  if (fill.in_flight == 0) Defer([this, id] { FinishCommit(id); });
  // else the last append's completion calls FinishCommit
}

void CacheStore::FinishCommit(FillId id) {
  if (!fills_.contains(id)) return;  // aborted meanwhile; AbortFill told the caller
  ready_.push_back(id);
  if (group_scheduled_) return;
  group_scheduled_ = true;
  Defer([this] { CommitReady(); });
}

bool CacheStore::Packable(const Fill& fill) const {
  return fill.error.ok() && fill.written < pack_limit_ &&
         (fill.meta.size == 0 || fill.written == fill.meta.size) &&
         (capacity_ == 0 || fill.written <= capacity_);
}

void CacheStore::CommitReady() {
  group_scheduled_ = false;
  std::vector<FillId> ids = std::move(ready_);
  ready_.clear();
  std::vector<Fill> group;  // in commit order (the order of same-key fills decides the winner)
  group.reserve(ids.size());
  for (FillId id : ids) {
    auto it = fills_.find(id);
    if (it == fills_.end()) continue;  // aborted meanwhile; AbortFill told the caller
    group.push_back(std::move(it->second));
    fills_.erase(it);
  }
  std::vector<ghost::Status> results(group.size(), ghost::Status::Ok());
  std::vector<Fill*> packed;
  std::vector<ghost::Status*> packed_results;
  auto flush_packed = [&] {
    if (!packed.empty()) PublishPackedGroup(packed, packed_results);
    packed.clear();
    packed_results.clear();
  };
  for (std::size_t i = 0; i < group.size(); ++i) {
    Fill& fill = group[i];
    if (!fill.error.ok()) {
      results[i] = fill.error;
    } else if (closed_) {
      results[i] = ClosedError();
    } else if (Packable(fill)) {
      packed.push_back(&fill);
      packed_results.push_back(&results[i]);
    } else {
      flush_packed();  // earlier fills first: a later fill of the same key must win
      results[i] = Publish(fill);
    }
  }
  flush_packed();
  // Every row above is committed (or failed): only now are the fills acknowledged.
  std::weak_ptr<int> alive = alive_;
  for (std::size_t i = 0; i < group.size(); ++i) {
    auto done = std::move(group[i].commit_done);
    done(results[i]);  // may begin, commit or abort fills, or destroy the store
    if (alive.expired()) return;
  }
}

void CacheStore::PublishPackedGroup(std::vector<Fill*>& fills,
                                    std::vector<ghost::Status*>& results) {
  struct Item {
    Fill* fill;
    ghost::Status* result;
    std::string bytes;
    CacheEntry stored;
    std::int64_t tick = 0;
    bool replacing = false;
    std::vector<std::string> evicted;
  };
  std::vector<Item> items;
  items.reserve(fills.size());
  for (std::size_t i = 0; i < fills.size(); ++i) {
    Fill& fill = *fills[i];
    Result<std::string> bytes = TakeFillBytes(fill);
    if (!bytes.ok()) {
      *results[i] = bytes.status();
      Discard(fill);
      continue;
    }
    items.push_back(Item{&fill, results[i], std::move(*bytes), {}, 0, false, {}});
  }
  if (items.empty()) return;
  for (Item& item : items) {
    Fill& fill = *item.fill;
    std::uint64_t h = KeyHash(fill.key);
    item.replacing = table_.Contains(h);
    item.stored = std::move(fill.meta);
    item.stored.size = fill.written;
    item.stored.where = Residence::kDisk;
    Unindex(fill.key);
    item.evicted = EvictFor(item.stored.size, h);
    item.tick = NextTick();
    table_.Put(h, item.stored.size, item.tick);
    item.stored.fetched = clock_.Now();
  }
  // Bodies and rows in one transaction: each key's old object (file or packed) until it
  // commits, the new one after; no intermediate state to recover.
  ghost::Status st = Batch([&]() -> ghost::Status {
    for (Item& item : items) {
      const std::string& key = item.fill->key;
      Stmt& s = db_->upsert_complete;
      db_->BindObject(s, key, item.stored, ToStored(item.stored.fetched), item.tick,
                      item.stored.expires
                          ? std::optional<std::int64_t>(ToStored(*item.stored.expires))
                          : std::nullopt);
      s.BindBlob(11, item.bytes);
      if (ghost::Status r = db_->Run(s, "committing " + Quote(key)); !r.ok()) return r;
      for (const std::string& k : item.evicted) {
        db_->delete_key.Bind(1, k);
        if (ghost::Status r = db_->Run(db_->delete_key, "evicting " + Quote(k)); !r.ok()) return r;
      }
    }
    return ghost::Status::Ok();
  });
  for (Item& item : items) {
    const std::string& key = item.fill->key;
    if (!item.fill->in_memory) RemoveFile(item.fill->temp_path);
    for (const std::string& k : item.evicted) RemoveFile(BodyPath(k));
    if (st.ok() && item.replacing) RemoveFile(BodyPath(key));  // a body file it may have had
    for (const std::string& k : item.evicted) Changed(k);
    if (item.replacing) Changed(key);
    *item.result = st;
  }
  if (!st.ok()) {
    for (Item& item : items) Unindex(item.fill->key);  // old rows stay in sqlite, back at Open
  }
}

ghost::Status CacheStore::Publish(Fill& fill) {
  if (closed_) return ClosedError();
  const std::string& key = fill.key;
  if (fill.meta.size != 0 && fill.written != fill.meta.size) {
    Discard(fill);
    return ghost::Status::InvalidArgument("the cache fill of " + Quote(key) + " ended after " +
                                          std::to_string(fill.written) + " bytes, but " +
                                          std::to_string(fill.meta.size) +
                                          " were announced; a truncated body is not cached");
  }
  if (capacity_ != 0 && fill.written > capacity_) {  // appends check this; keep it certain
    Discard(fill);
    return ghost::Status::InvalidArgument(TooBig(key, fill.written, capacity_));
  }
  fill.fd.reset();
  std::string body = BodyPath(key);
  std::uint64_t h = KeyHash(key);
  bool replacing = table_.Contains(h);
  if (fill.written < pack_limit_) return PublishPacked(fill, replacing);
  if (replacing) {
    // From here until the final commit, a crash must not pair the old row with the new body.
    ghost::Status st = Batch([&]() -> ghost::Status {
      db_->mark_incomplete.Bind(1, key);
      return db_->Run(db_->mark_incomplete, "replacing " + Quote(key));
    });
    if (!st.ok()) {
      Discard(fill);
      return st;
    }
  }
  if (::rename(fill.temp_path.c_str(), body.c_str()) != 0) {
    ghost::Status st = ghost::Status::FromErrno(
        errno, "publishing the cached body of " + Quote(key) + " (rename to " + body + ")");
    if (replacing) {
      Batch([&]() -> ghost::Status {
        db_->mark_complete.Bind(1, key);
        return db_->Run(db_->mark_complete, "restoring " + Quote(key));
      }).ok();  // best effort; if it fails Open drops the old object, which is allowed
    }
    Discard(fill);
    return st;
  }
  CacheEntry stored = std::move(fill.meta);
  stored.size = fill.written;
  stored.where = Residence::kDisk;
  // The old body is replaced, so its bytes do not count against the new one.
  Unindex(key);  // the row is written whole below
  std::vector<std::string> evicted = EvictFor(stored.size, h);
  std::int64_t tick = NextTick();
  table_.Put(h, stored.size, tick);
  stored.fetched = clock_.Now();
  ghost::Status st = Batch([&]() -> ghost::Status {
    db_->BindObject(
        db_->upsert_complete, key, stored, ToStored(stored.fetched), tick,
        stored.expires ? std::optional<std::int64_t>(ToStored(*stored.expires)) : std::nullopt);
    if (ghost::Status s = db_->Run(db_->upsert_complete, "committing " + Quote(key)); !s.ok()) {
      return s;
    }
    for (const std::string& k : evicted) {
      db_->delete_key.Bind(1, k);
      if (ghost::Status s = db_->Run(db_->delete_key, "evicting " + Quote(k)); !s.ok()) return s;
    }
    return ghost::Status::Ok();
  });
  for (const std::string& k : evicted) RemoveFile(BodyPath(k));
  for (const std::string& k : evicted) Changed(k);
  if (replacing) Changed(key);
  if (!st.ok()) {
    // The row did not turn complete: Open would drop the body, so do not serve it now.
    Unindex(key);
    RemoveFile(body);
    return st;
  }
  return ghost::Status::Ok();
}

ghost::Status CacheStore::PublishPacked(Fill& fill, bool replacing) {
  const std::string& key = fill.key;
  Result<std::string> taken = TakeFillBytes(fill);
  if (!taken.ok()) {
    Discard(fill);
    return taken.status();
  }
  std::string bytes = std::move(*taken);
  std::uint64_t h = KeyHash(key);
  CacheEntry stored = std::move(fill.meta);
  stored.size = fill.written;
  stored.where = Residence::kDisk;
  Unindex(key);
  std::vector<std::string> evicted = EvictFor(stored.size, h);
  std::int64_t tick = NextTick();
  table_.Put(h, stored.size, tick);
  stored.fetched = clock_.Now();
  // Body and row in one transaction: the old object (file or packed) until it commits, the
  // new one after; no intermediate state to recover.
  ghost::Status st = Batch([&]() -> ghost::Status {
    Stmt& s = db_->upsert_complete;
    db_->BindObject(
        s, key, stored, ToStored(stored.fetched), tick,
        stored.expires ? std::optional<std::int64_t>(ToStored(*stored.expires)) : std::nullopt);
    s.BindBlob(11, bytes);
    if (ghost::Status r = db_->Run(s, "committing " + Quote(key)); !r.ok()) return r;
    for (const std::string& k : evicted) {
      db_->delete_key.Bind(1, k);
      if (ghost::Status r = db_->Run(db_->delete_key, "evicting " + Quote(k)); !r.ok()) return r;
    }
    return ghost::Status::Ok();
  });
  if (!fill.in_memory) RemoveFile(fill.temp_path);
  for (const std::string& k : evicted) RemoveFile(BodyPath(k));
  if (st.ok() && replacing) RemoveFile(BodyPath(key));  // a body file it may have had
  for (const std::string& k : evicted) Changed(k);
  if (replacing) Changed(key);
  if (!st.ok()) {
    Unindex(key);  // the old row, if any, stays in sqlite and is back at the next Open
    return st;
  }
  return ghost::Status::Ok();
}

void CacheStore::Fail(Fill& fill, ghost::Status st) {
  assert(!st.ok());
  fill.error = std::move(st);
  Discard(fill);
}

Result<std::string> CacheStore::TakeFillBytes(Fill& fill) {
  if (fill.in_memory) return std::move(fill.memory);
  fill.fd.reset();
  std::string bytes(fill.written, '\0');
  UniqueFd fd(::open(fill.temp_path.c_str(), O_RDONLY | O_CLOEXEC));
  ssize_t n = fd.valid() ? ::pread(fd.get(), bytes.data(), bytes.size(), 0) : -1;
  if (n != static_cast<ssize_t>(bytes.size())) {
    return ghost::Status::FromErrno(n < 0 ? errno : EIO, "reading back the fill of " + Quote(fill.key));
  }
  return bytes;
}

void CacheStore::Discard(Fill& fill) {
  if (fill.in_memory) {
    fill.memory.clear();
    fill.memory.shrink_to_fit();
    return;  // no temp file, no pending row
  }
  fill.fd.reset();  // in-flight writes hold their own reference; they land in an unlinked file
  RemoveFile(fill.temp_path);
  if (!db_) return;
  Batch([&]() -> ghost::Status {
    db_->delete_pending.Bind(1, fill.key);
    return db_->Run(db_->delete_pending, "forgetting the fill of " + Quote(fill.key));
  }).ok();  // best effort: Open removes a leftover pending row
}

void CacheStore::AbortFill(FillId id) {
  auto it = fills_.find(id);
  if (it == fills_.end()) return;
  Fill fill = std::move(it->second);
  fills_.erase(it);
  if (fill.error.ok()) Discard(fill);
  if (fill.committing) {
    Defer([done = std::move(fill.commit_done),
           st = ghost::Status::Internal("the cache fill of " + Quote(fill.key) +
                                        " was aborted before its commit completed")] { done(st); });
  }
}

}  // namespace ghost
