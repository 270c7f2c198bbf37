#include "common/cache/cache_store.h"

#include <event2/event.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sqlite3.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "common/base/clock.h"
#include "common/base/file_io.h"
#include "common/base/uring_file_io.h"

// fsync/fdatasync as the test sees them: calls made by the thread under watch are counted,
// then passed to the kernel. sqlite (a shared library) calls these through its PLT, so the
// executable's definitions take their place.
namespace {
std::atomic<std::thread::id> g_sync_watch{};
std::atomic<int> g_syncs_on_watched{0};
std::atomic<int> g_syncs_elsewhere{0};  // by other threads while one is watched
void CountSync() {
  std::thread::id watched = g_sync_watch.load();
  if (std::this_thread::get_id() == watched) {
    ++g_syncs_on_watched;
  } else if (watched != std::thread::id()) {
    ++g_syncs_elsewhere;
  }
}
}  // namespace
extern "C" int fdatasync(int fd) {
  CountSync();
  return static_cast<int>(::syscall(SYS_fdatasync, fd));
}
extern "C" int fsync(int fd) {
  CountSync();
  return static_cast<int>(::syscall(SYS_fsync, fd));
}

namespace ghost {
namespace {

namespace fs = std::filesystem;
using Keys = std::vector<std::string>;

std::string RandomBytes(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::string s(n, '\0');
  for (char& c : s) c = static_cast<char>(rng());
  return s;
}

bool Contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

class CacheStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    base_ = event_base_new();
    ASSERT_NE(base_, nullptr);
    real_io_ = std::make_unique<SyncFileIo>(base_);
    io_ = std::make_unique<FaultyFileIo>(*real_io_);
    std::string tmpl = ::testing::TempDir() + "ghost_cache_store_XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr) << "mkdtemp " << tmpl;
    root_ = tmpl;
    dir_ = root_ + "/cache";
  }

  void TearDown() override {
    store_.reset();
    io_.reset();
    real_io_.reset();
    if (base_ != nullptr) event_base_free(base_);
    std::error_code ec;
    fs::remove_all(root_, ec);
  }

  // Persisted times come from this wall clock, a function of the virtual clock, so they
  // round-trip exactly across reopen.
  // Bodies are files unless a test packs them (pack_limit_).
  CacheStoreOptions Options() {
    CacheStoreOptions options;
    options.pack_limit = pack_limit_;
    options.ticks_min_rows = ticks_min_rows_;
    options.wall_clock = [this] {
      return std::chrono::system_clock::time_point(std::chrono::hours(24 * 365 * 55)) +
             clock_.Now().time_since_epoch();
    };
    return options;
  }

  Result<std::unique_ptr<CacheStore>> OpenStore(Bytes capacity) {
    return CacheStore::Open(dir_, capacity, clock_, *io_, Options());
  }
  void Reopen(Bytes capacity = 0) {
    store_.reset();
    Result<std::unique_ptr<CacheStore>> store = OpenStore(capacity);
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    store_ = std::move(store).value();
  }

  // Runs the loop until `done`, failing the test after 10 s without it.
  void Run(const bool& done) {
    timed_out_ = false;
    event* watchdog = evtimer_new(base_, &CacheStoreTest::OnWatchdog, this);
    timeval tv{10, 0};
    evtimer_add(watchdog, &tv);
    while (!done && !timed_out_) event_base_loop(base_, EVLOOP_ONCE);
    event_free(watchdog);
    ASSERT_FALSE(timed_out_) << "the cache store did not finish within 10 s";
  }
  // Runs the loop until `pending` reaches 0, failing the test after 10 s.
  void RunUntilZero(const int& pending) {
    timed_out_ = false;
    event* watchdog = evtimer_new(base_, &CacheStoreTest::OnWatchdog, this);
    timeval tv{10, 0};
    evtimer_add(watchdog, &tv);
    while (pending > 0 && !timed_out_) event_base_loop(base_, EVLOOP_ONCE);
    event_free(watchdog);
    ASSERT_FALSE(timed_out_) << "the cache store did not finish within 10 s";
  }
  static void OnWatchdog(int, short, void* arg) {
    auto* self = static_cast<CacheStoreTest*>(arg);
    self->timed_out_ = true;
    event_base_loopbreak(self->base_);
  }

  // Appends `body` in pieces of `chunk` bytes, all issued without waiting, and returns the
  // first append error (or OK) once they have all completed.
  Status Append(FillId id, const std::string& body, std::size_t chunk) {
    int pending = 0;
    bool all = body.empty();
    Status first = Status::Ok();
    for (std::size_t off = 0; off < body.size(); off += chunk) ++pending;
    for (std::size_t off = 0; off < body.size(); off += chunk) {
      store_->AppendFill(id, body.substr(off, chunk), [&](Status st) {
        if (!st.ok() && first.ok()) first = st;
        all = --pending == 0;
      });
    }
    Run(all);
    return first;
  }
  Status Commit(FillId id) {
    bool done = false;
    Status result = Status::Internal("not run");
    store_->CommitFill(id, [&](Status st) {
      result = std::move(st);
      done = true;
    });
    Run(done);
    return result;
  }
  // A whole fill: appends issued back to back, then the commit without waiting for them.
  Status Fill(const std::string& key, const std::string& body, CacheEntry meta = {},
              std::size_t chunk = 4096) {
    Result<FillId> id = store_->BeginFill(key, std::move(meta));
    if (!id.ok()) return id.status();
    Status first = Status::Ok();
    int pending = 0;
    for (std::size_t off = 0; off < body.size(); off += chunk) {
      ++pending;
      store_->AppendFill(*id, body.substr(off, chunk), [&](Status st) {
        --pending;
        if (!st.ok() && first.ok()) first = st;
      });
    }
    Status committed = Commit(*id);
    EXPECT_EQ(pending, 0) << "the commit completed before its appends";
    if (!first.ok()) {
      EXPECT_FALSE(committed.ok()) << "a fill with a failed append committed";
    }
    return committed;
  }
  // The whole body, read in 1 MiB pieces issued at once.
  Result<std::string> ReadAll(const std::string& key) {
    const CacheEntry* e = store_->index().Find(key);
    if (e == nullptr) return Status::NotFound("test: " + key + " is not in the index");
    std::string out(e->size, '\0');
    constexpr std::size_t kPiece = 1 << 20;
    int pending = 0;
    bool all = out.empty();
    Status error = Status::Ok();
    std::size_t total = 0;
    for (std::size_t off = 0; off < out.size(); off += kPiece) ++pending;
    for (std::size_t off = 0; off < out.size(); off += kPiece) {
      std::span<char> piece(out.data() + off, std::min(kPiece, out.size() - off));
      store_->ReadBody(key, off, piece, [&](Result<std::size_t> r) {
        if (!r.ok()) {
          error = r.status();
        } else {
          total += *r;
        }
        all = --pending == 0;
      });
    }
    Run(all);
    if (!error.ok()) return error;
    if (total != out.size()) return Status::Internal("test: short read of " + key);
    return out;
  }
  Result<std::size_t> ReadOnce(const std::string& key, std::uint64_t offset, std::span<char> buf) {
    bool done = false;
    Result<std::size_t> result = Status::Internal("not run");
    store_->ReadBody(key, offset, buf, [&](Result<std::size_t> r) {
      result = std::move(r);
      done = true;
    });
    Run(done);
    return result;
  }

  Keys LruOrder() const {
    Keys keys;
    store_->index().ForEach([&](const std::string& k, const CacheEntry&) { keys.push_back(k); });
    return keys;
  }
  // Every regular file under `dir`, relative to it.
  std::set<std::string> FilesUnder(const std::string& dir) const {
    std::set<std::string> files;
    std::error_code ec;
    for (auto it = fs::recursive_directory_iterator(dir, ec);
         !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
      if (it->is_regular_file(ec)) files.insert(fs::relative(it->path(), dir, ec).string());
    }
    return files;
  }
  std::set<std::string> ObjectFiles() const { return FilesUnder(dir_ + "/objects"); }
  // Rows of `table` matching `where` (the store must be closed: it locks the file).
  int CountRows(const std::string& where, const std::string& table = "objects") const {
    sqlite3* db = nullptr;
    std::string path = dir_ + "/index.sqlite";
    EXPECT_EQ(sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READWRITE, nullptr), SQLITE_OK);
    std::string sql = "SELECT count(*) FROM " + table + " WHERE " + where;
    sqlite3_stmt* stmt = nullptr;
    int n = -1;
    if (sqlite3_prepare_v2(db, sql.c_str(), -1, &stmt, nullptr) == SQLITE_OK &&
        sqlite3_step(stmt) == SQLITE_ROW) {
      n = sqlite3_column_int(stmt, 0);
    }
    sqlite3_finalize(stmt);
    sqlite3_close(db);
    return n;
  }
  // Indexes on `table` in the closed store's index database (the automatic one of a primary
  // key included).
  int CountIndexesOn(const std::string& table) const {
    sqlite3* db = nullptr;
    std::string path = dir_ + "/index.sqlite";
    EXPECT_EQ(sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READWRITE, nullptr), SQLITE_OK);
    std::string sql =
        "SELECT count(*) FROM sqlite_schema WHERE type = 'index' AND tbl_name = '" + table + "'";
    sqlite3_stmt* stmt = nullptr;
    int n = -1;
    if (sqlite3_prepare_v2(db, sql.c_str(), -1, &stmt, nullptr) == SQLITE_OK &&
        sqlite3_step(stmt) == SQLITE_ROW) {
      n = sqlite3_column_int(stmt, 0);
    }
    sqlite3_finalize(stmt);
    sqlite3_close(db);
    return n;
  }
  // The index as a crash leaves it: the shutdown mark unset (the store must be closed).
  void MarkUnclean() const { ExecSql("UPDATE shutdown SET clean = 0"); }
  bool MarkedClean() const {
    sqlite3* db = nullptr;
    std::string path = dir_ + "/index.sqlite";
    EXPECT_EQ(sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READWRITE, nullptr), SQLITE_OK);
    sqlite3_stmt* stmt = nullptr;
    bool clean = sqlite3_prepare_v2(db, "SELECT clean FROM shutdown", -1, &stmt, nullptr) ==
                     SQLITE_OK &&
                 sqlite3_step(stmt) == SQLITE_ROW && sqlite3_column_int(stmt, 0) == 1;
    sqlite3_finalize(stmt);
    sqlite3_close(db);
    return clean;
  }
  void ExecSql(const std::string& sql) const {
    sqlite3* db = nullptr;
    std::string path = dir_ + "/index.sqlite";
    ASSERT_EQ(sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READWRITE, nullptr), SQLITE_OK);
    char* msg = nullptr;
    int rc = sqlite3_exec(db, sql.c_str(), nullptr, nullptr, &msg);
    EXPECT_EQ(rc, SQLITE_OK) << (msg ? msg : "");
    sqlite3_free(msg);
    sqlite3_close(db);
  }

  static CacheEntry Meta(const std::string& etag, std::optional<TimePoint> expires = std::nullopt) {
    CacheEntry meta;
    meta.etag = etag;
    meta.last_modified = "Sat, 01 Jan 2005 00:00:00 GMT";
    meta.content_type = "text/html; charset=utf-8";
    meta.expires = expires;
    return meta;
  }

  VirtualClock clock_;
  event_base* base_ = nullptr;
  std::unique_ptr<SyncFileIo> real_io_;
  std::unique_ptr<FaultyFileIo> io_;
  std::unique_ptr<CacheStore> store_;
  Bytes pack_limit_ = 0;  // bodies under this many bytes are packed (CacheStoreOptions)
  std::size_t ticks_min_rows_ = CacheStoreOptions().ticks_min_rows;
  std::string root_;
  std::string dir_;
  bool timed_out_ = false;
};

TEST_F(CacheStoreTest, SmallFillReadsBackByteIdentical) {
  Reopen();
  ASSERT_TRUE(Fill("http://example.org/a", "hello, ghost", {}, 5).ok());
  Result<std::string> body = ReadAll("http://example.org/a");
  ASSERT_TRUE(body.ok()) << body.status().ToString();
  EXPECT_EQ(*body, "hello, ghost");
  std::string buf(100, '\0');
  Result<std::size_t> tail = ReadOnce("http://example.org/a", 7, buf);
  ASSERT_TRUE(tail.ok());
  EXPECT_EQ(*tail, 5u);  // short at the end of the body
  EXPECT_EQ(buf.substr(0, 5), "ghost");
}

TEST_F(CacheStoreTest, MultiMiBFillInManyAppendsReadsBackByteIdentical) {
  Reopen();
  std::string data = RandomBytes(5 * 1024 * 1024 + 321, 42);
  Result<FillId> id = store_->BeginFill("big", {});
  ASSERT_TRUE(id.ok());
  // Appends of uneven sizes, issued without waiting for each other.
  std::mt19937 rng(1);
  std::size_t off = 0;
  int pending = 0;
  bool all_ok = true;
  while (off < data.size()) {
    std::size_t n = std::min<std::size_t>(1 + rng() % (300 * 1024), data.size() - off);
    ++pending;
    store_->AppendFill(*id, data.substr(off, n), [&](Status st) {
      --pending;
      if (!st.ok()) all_ok = false;
    });
    off += n;
  }
  ASSERT_TRUE(Commit(*id).ok());
  EXPECT_EQ(pending, 0);
  EXPECT_TRUE(all_ok);
  EXPECT_EQ(store_->Status("big", false).size, data.size());
  Result<std::string> body = ReadAll("big");
  ASSERT_TRUE(body.ok()) << body.status().ToString();
  EXPECT_TRUE(*body == data) << "the body read back differs from the bytes appended";
}

TEST_F(CacheStoreTest, WorksOverIoUring) {
  Result<std::unique_ptr<UringFileIo>> uring = UringFileIo::Create(base_, 8, 128 * 1024);
  if (!uring.ok()) {
    int err = uring.status().ToErrno();
    if (err == ENOSYS || err == EPERM) GTEST_SKIP() << uring.status().ToString();
    FAIL() << uring.status().ToString();
  }
  std::unique_ptr<UringFileIo> uring_io = std::move(uring).value();
  io_ = std::make_unique<FaultyFileIo>(*uring_io);
  Reopen();
  std::string data = RandomBytes(3 * 1024 * 1024 + 5, 3);
  ASSERT_TRUE(Fill("u", data, {}, 256 * 1024).ok());
  Result<std::string> body = ReadAll("u");
  ASSERT_TRUE(body.ok()) << body.status().ToString();
  EXPECT_TRUE(*body == data);
  store_.reset();
  io_.reset();  // before the ring it wraps
}

TEST_F(CacheStoreTest, StatusIsAbsentThenPresentThenNetworkPreferred) {
  Reopen();
  EXPECT_EQ(store_->Status("k", false).state, CacheState::kAbsent);
  EXPECT_EQ(store_->Status("k", false).size, 0u);
  ASSERT_TRUE(Fill("k", std::string(1234, 'z')).ok());
  CacheStatus st = store_->Status("k", false);
  EXPECT_EQ(st.state, CacheState::kPresent);
  EXPECT_EQ(st.size, 1234u);
  EXPECT_EQ(store_->Status("k", true).state, CacheState::kPresentNetworkPreferred);
}

TEST_F(CacheStoreTest, ObjectIsInvisibleUntilItsFillCommits) {
  Reopen();
  Result<FillId> id = store_->BeginFill("k", {});
  ASSERT_TRUE(id.ok());
  ASSERT_TRUE(Append(*id, "partial body", 4).ok());
  EXPECT_EQ(store_->Status("k", false).state, CacheState::kAbsent);
  std::string buf(4, '\0');
  Result<std::size_t> r = ReadOnce("k", 0, buf);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Status::Code::kNotFound);
  ASSERT_TRUE(Commit(*id).ok());
  EXPECT_EQ(store_->Status("k", false).state, CacheState::kPresent);
}

TEST_F(CacheStoreTest, AbortedFillLeavesNothing) {
  Reopen();
  Result<FillId> id = store_->BeginFill("k", {});
  ASSERT_TRUE(id.ok());
  ASSERT_TRUE(Append(*id, std::string(10000, 'q'), 1000).ok());
  EXPECT_EQ(ObjectFiles().size(), 1u);  // the temp file
  store_->AbortFill(*id);
  EXPECT_EQ(store_->open_fills(), 0u);
  EXPECT_TRUE(ObjectFiles().empty());
  EXPECT_EQ(store_->Status("k", false).state, CacheState::kAbsent);
  Status commit = Commit(*id);
  EXPECT_EQ(commit.code(), Status::Code::kNotFound);
  ASSERT_TRUE(store_->Close().ok());
  EXPECT_EQ(CountRows("1"), 0);
  Reopen();
  EXPECT_TRUE(store_->index().empty());
}

TEST_F(CacheStoreTest, AbortWithAppendsInFlightReportsThemAndLeavesNothing) {
  Reopen();
  Result<FillId> id = store_->BeginFill("k", {});
  ASSERT_TRUE(id.ok());
  bool done = false;
  Status append = Status::Ok();
  store_->AppendFill(*id, "bytes", [&](Status st) {
    append = st;
    done = true;
  });
  store_->AbortFill(*id);
  Run(done);
  EXPECT_FALSE(append.ok());
  EXPECT_TRUE(ObjectFiles().empty());
}

TEST_F(CacheStoreTest, ReplacementServesTheOldBodyUntilItCommits) {
  Reopen();
  ASSERT_TRUE(Fill("k", "old body", Meta("\"v1\"")).ok());
  Result<FillId> id = store_->BeginFill("k", Meta("\"v2\""));
  ASSERT_TRUE(id.ok());
  ASSERT_TRUE(Append(*id, "new body, longer", 3).ok());
  EXPECT_EQ(*ReadAll("k"), "old body");
  EXPECT_EQ(store_->index().Find("k")->etag, "\"v1\"");
  ASSERT_TRUE(Commit(*id).ok());
  EXPECT_EQ(*ReadAll("k"), "new body, longer");
  EXPECT_EQ(store_->index().Find("k")->etag, "\"v2\"");
  EXPECT_EQ(store_->index().total_bytes(), 16u);
  Reopen();
  EXPECT_EQ(*ReadAll("k"), "new body, longer");
  EXPECT_EQ(store_->index().Find("k")->etag, "\"v2\"");
}

TEST_F(CacheStoreTest, AbortedReplacementKeepsTheOldObject) {
  Reopen();
  ASSERT_TRUE(Fill("k", "old body", Meta("\"v1\"")).ok());
  Result<FillId> id = store_->BeginFill("k", Meta("\"v2\""));
  ASSERT_TRUE(id.ok());
  ASSERT_TRUE(Append(*id, "new", 3).ok());
  store_->AbortFill(*id);
  EXPECT_EQ(*ReadAll("k"), "old body");
  Reopen();
  EXPECT_EQ(*ReadAll("k"), "old body");
  EXPECT_EQ(store_->index().Find("k")->etag, "\"v1\"");
}

TEST_F(CacheStoreTest, CapEvictsTheLeastRecentlyUsedAndDeletesTheirFiles) {
  Reopen(3000);
  for (const char* key : {"a", "b", "c"}) {
    clock_.AdvanceBy(Seconds(1));
    ASSERT_TRUE(Fill(key, std::string(1000, key[0])).ok());
  }
  clock_.AdvanceBy(Seconds(1));
  EXPECT_TRUE(store_->Touch("a"));
  std::string b_path = store_->BodyPath("b");
  ASSERT_TRUE(fs::exists(b_path));
  clock_.AdvanceBy(Seconds(1));
  ASSERT_TRUE(Fill("d", std::string(1000, 'd')).ok());
  EXPECT_EQ(LruOrder(), (Keys{"c", "a", "d"}));
  EXPECT_EQ(store_->Status("b", false).state, CacheState::kAbsent);
  EXPECT_FALSE(fs::exists(b_path));
  EXPECT_EQ(ObjectFiles().size(), 3u);
  EXPECT_LE(store_->index().total_bytes(), 3000u);
  Reopen(3000);
  EXPECT_EQ(LruOrder(), (Keys{"c", "a", "d"}));
}

TEST_F(CacheStoreTest, BeginFillWithAKnownSizeEvictsAhead) {
  Reopen(3000);
  for (const char* key : {"a", "b", "c"}) {
    clock_.AdvanceBy(Seconds(1));
    ASSERT_TRUE(Fill(key, std::string(1000, key[0])).ok());
  }
  CacheEntry meta;
  meta.size = 1500;
  Result<FillId> id = store_->BeginFill("d", meta);
  ASSERT_TRUE(id.ok());
  EXPECT_EQ(LruOrder(), (Keys{"c"}));  // 1000 + 1500 fit; a and b went before the bytes came
  EXPECT_FALSE(fs::exists(store_->BodyPath("a")));
  EXPECT_FALSE(fs::exists(store_->BodyPath("b")));
  ASSERT_TRUE(Append(*id, std::string(1500, 'd'), 500).ok());
  ASSERT_TRUE(Commit(*id).ok());
  EXPECT_EQ(LruOrder(), (Keys{"c", "d"}));
}

TEST_F(CacheStoreTest, RefusesAnObjectBiggerThanTheCap) {
  Reopen(1000);
  ASSERT_TRUE(Fill("small", std::string(400, 's')).ok());
  CacheEntry meta;
  meta.size = 2000;
  Result<FillId> refused = store_->BeginFill("huge", meta);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), Status::Code::kInvalidArgument);
  EXPECT_TRUE(Contains(refused.status().message(), "exceed the cache capacity of 1000 bytes"))
      << refused.status().ToString();

  // Unknown size: refused when the appends pass the cap; the earlier object is untouched.
  Result<FillId> id = store_->BeginFill("huge", {});
  ASSERT_TRUE(id.ok());
  ASSERT_TRUE(Append(*id, std::string(600, 'h'), 600).ok());
  Status over = Append(*id, std::string(600, 'h'), 600);
  EXPECT_EQ(over.code(), Status::Code::kInvalidArgument);
  Status commit = Commit(*id);
  EXPECT_FALSE(commit.ok());
  EXPECT_TRUE(Contains(commit.message(), "exceed the cache capacity")) << commit.ToString();
  EXPECT_EQ(store_->Status("huge", false).state, CacheState::kAbsent);
  EXPECT_EQ(*ReadAll("small"), std::string(400, 's'));
  EXPECT_EQ(
      ObjectFiles(),
      (std::set<std::string>{fs::relative(store_->BodyPath("small"), dir_ + "/objects").string()}));
}

TEST_F(CacheStoreTest, TruncatedFillIsNotCached) {
  Reopen();
  CacheEntry meta;
  meta.size = 100;
  Result<FillId> id = store_->BeginFill("k", meta);
  ASSERT_TRUE(id.ok());
  ASSERT_TRUE(Append(*id, std::string(60, 'x'), 60).ok());
  Status commit = Commit(*id);
  EXPECT_EQ(commit.code(), Status::Code::kInvalidArgument);
  EXPECT_TRUE(Contains(commit.message(), "truncated")) << commit.ToString();
  EXPECT_EQ(store_->Status("k", false).state, CacheState::kAbsent);
  EXPECT_TRUE(ObjectFiles().empty());
}

TEST_F(CacheStoreTest, ReopenRestoresObjectsMetadataAndLruOrder) {
  Reopen();
  TimePoint expires = TimePoint(Seconds(3600));
  ASSERT_TRUE(Fill("a", "body a", Meta("\"a\"", expires)).ok());
  clock_.AdvanceBy(Seconds(10));
  ASSERT_TRUE(Fill("b", "body b", Meta("\"b\"")).ok());
  clock_.AdvanceBy(Seconds(10));
  ASSERT_TRUE(Fill("c", "body c", Meta("\"c\"")).ok());
  clock_.AdvanceBy(Seconds(10));
  EXPECT_TRUE(store_->Touch("a"));  // in memory only until Close
  std::vector<std::pair<std::string, CacheEntry>> before;
  store_->index().ForEach(
      [&](const std::string& k, const CacheEntry& e) { before.emplace_back(k, e); });
  ASSERT_EQ(LruOrder(), (Keys{"b", "c", "a"}));

  Reopen();
  EXPECT_EQ(LruOrder(), (Keys{"b", "c", "a"}));
  std::vector<std::pair<std::string, CacheEntry>> after;
  store_->index().ForEach(
      [&](const std::string& k, const CacheEntry& e) { after.emplace_back(k, e); });
  ASSERT_EQ(after.size(), before.size());
  for (std::size_t i = 0; i < before.size(); ++i) {
    const CacheEntry& x = before[i].second;
    const CacheEntry& y = after[i].second;
    SCOPED_TRACE(before[i].first);
    EXPECT_EQ(y.size, x.size);
    EXPECT_TRUE(y.where.Has(Residence::kDisk));
    EXPECT_EQ(y.etag, x.etag);
    EXPECT_EQ(y.last_modified, x.last_modified);
    EXPECT_EQ(y.content_type, x.content_type);
    EXPECT_EQ(y.expires, x.expires);
    EXPECT_EQ(y.fetched, x.fetched);
    EXPECT_EQ(y.last_access, x.last_access);
  }
  EXPECT_EQ(after[2].second.expires, expires);
  EXPECT_EQ(*ReadAll("a"), "body a");
  EXPECT_EQ(*ReadAll("b"), "body b");
  EXPECT_EQ(*ReadAll("c"), "body c");
}

TEST_F(CacheStoreTest, ReadingCountsAsAnAccess) {
  Reopen();
  ASSERT_TRUE(Fill("a", "a").ok());
  clock_.AdvanceBy(Seconds(1));
  ASSERT_TRUE(Fill("b", "b").ok());
  clock_.AdvanceBy(Seconds(1));
  ASSERT_TRUE(ReadAll("a").ok());
  EXPECT_EQ(LruOrder(), (Keys{"b", "a"}));
  Reopen();
  EXPECT_EQ(LruOrder(), (Keys{"b", "a"}));
}

TEST_F(CacheStoreTest, UpdateMetaIsPersistedAndKeepsSizeAndOrder) {
  Reopen();
  ASSERT_TRUE(Fill("a", "aaaa", Meta("\"1\"")).ok());
  clock_.AdvanceBy(Seconds(1));
  ASSERT_TRUE(Fill("b", "bb", Meta("\"1\"")).ok());
  TimePoint new_expiry = clock_.Now() + Seconds(600);
  Status st = store_->UpdateMeta("a", [&](CacheEntry& e) {
    e.etag = "\"2\"";
    e.expires = new_expiry;
    e.fetched = clock_.Now();
    e.size = 999;  // ignored: the body did not change
  });
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(store_->index().Find("a")->size, 4u);
  EXPECT_EQ(store_->index().Find("a")->etag, "\"2\"");  // in memory at once
  EXPECT_EQ(LruOrder(), (Keys{"a", "b"}));
  // Not in sqlite yet: the caller decides when the disk is written (deferred writes).
  EXPECT_EQ(store_->unsaved_index_changes(), 1u);
  ASSERT_TRUE(store_->SaveIndex().ok());
  EXPECT_EQ(store_->unsaved_index_changes(), 0u);
  Reopen();
  const CacheEntry* a = store_->index().Find("a");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->etag, "\"2\"");
  EXPECT_EQ(a->expires, new_expiry);
  EXPECT_EQ(a->fetched, clock_.Now());
  EXPECT_EQ(a->size, 4u);
  EXPECT_EQ(store_->UpdateMeta("missing", [](CacheEntry&) {}).code(), Status::Code::kNotFound);
}

TEST_F(CacheStoreTest, EraseRemovesTheBodyAndTheRow) {
  Reopen();
  ASSERT_TRUE(Fill("k", "body").ok());
  std::string path = store_->BodyPath("k");
  ASSERT_TRUE(fs::exists(path));
  ASSERT_TRUE(store_->Erase("k").ok());
  EXPECT_FALSE(fs::exists(path));
  EXPECT_EQ(store_->Status("k", false).state, CacheState::kAbsent);
  EXPECT_EQ(store_->Erase("k").code(), Status::Code::kNotFound);
  Reopen();
  EXPECT_TRUE(store_->index().empty());
}

TEST_F(CacheStoreTest, ChangeListenerHearsReplacementsUpdatesErasesAndEvictions) {
  Reopen(3000);
  Keys changed;
  store_->SetChangeListener([&](const std::string& key) { changed.push_back(key); });
  ASSERT_TRUE(Fill("a", std::string(1000, 'a')).ok());
  ASSERT_TRUE(Fill("b", std::string(1000, 'b')).ok());
  EXPECT_EQ(changed, Keys{});  // new objects: nobody can hold an older copy
  ASSERT_TRUE(Fill("a", std::string(1000, 'A')).ok());
  EXPECT_EQ(changed, Keys{"a"});
  ASSERT_TRUE(store_->UpdateMeta("b", [](CacheEntry& e) { e.etag = "\"2\""; }).ok());
  EXPECT_EQ(changed, (Keys{"a", "b"}));
  ASSERT_TRUE(store_->Erase("a").ok());
  EXPECT_EQ(changed, (Keys{"a", "b", "a"}));
  EXPECT_TRUE(store_->Touch("b"));  // an access changes nothing a copy holds
  ASSERT_TRUE(Fill("c", std::string(1500, 'c')).ok());
  ASSERT_TRUE(Fill("d", std::string(1500, 'd')).ok());  // evicts b, the least recently used
  EXPECT_EQ(changed, (Keys{"a", "b", "a", "b"}));
}

TEST_F(CacheStoreTest, FillOfADroppedStoreIsGoneAfterReopen) {
  Reopen();
  Result<FillId> id = store_->BeginFill("k", {});
  ASSERT_TRUE(id.ok());
  ASSERT_TRUE(Append(*id, "half of a body", 7).ok());
  store_.reset();  // no commit
  Reopen();
  EXPECT_EQ(store_->Status("k", false).state, CacheState::kAbsent);
  EXPECT_TRUE(ObjectFiles().empty());
}

TEST_F(CacheStoreTest, StoredResponseHeadRoundTripsAndVersion1IndexesAreUpgraded) {
  Reopen();
  CacheEntry meta = Meta("\"1\"");
  meta.response = R"({"status":200,"headers":[["Vary","Accept-Encoding"]]})";
  ASSERT_TRUE(Fill("proxied", "body", meta).ok());
  ASSERT_TRUE(Fill("plain", "text").ok());
  Reopen();
  EXPECT_EQ(store_->index().Find("proxied")->response, meta.response);
  EXPECT_EQ(store_->index().Find("plain")->response, "");
  ASSERT_TRUE(store_->UpdateMeta("proxied", [](CacheEntry& e) { e.response = "{}"; }).ok());
  Reopen();
  EXPECT_EQ(store_->index().Find("proxied")->response, "{}");

  // An index written by the version before the column existed opens and keeps its objects.
  store_.reset();
  ExecSql("ALTER TABLE objects DROP COLUMN response; UPDATE schema_version SET version = 1");
  Reopen();
  ASSERT_NE(store_->index().Find("plain"), nullptr);
  EXPECT_EQ(*ReadAll("plain"), "text");
  EXPECT_EQ(store_->index().Find("proxied")->response, "");
  store_.reset();
  // A version from the future is refused with a message, not misread.
  ExecSql("UPDATE schema_version SET version = 99");
  event_base* base = event_base_new();
  {
    SyncFileIo io(base);  // gone before its base
    Result<std::unique_ptr<CacheStore>> future = CacheStore::Open(dir_, 0, clock_, io, Options());
    EXPECT_FALSE(future.ok());
    if (!future.ok()) {
      EXPECT_NE(future.status().message().find("schema version 99"), std::string::npos)
          << future.status().ToString();
    }
  }
  event_base_free(base);
  ExecSql("UPDATE schema_version SET version = 2");
}

// A cache written by the version before (schema 4: a primary key on key, the objects_table
// index, TEXT heads, 4 KiB pages) is rebuilt at its first Open and keeps every object.
TEST_F(CacheStoreTest, Version4IndexIsRebuiltAndKeepsItsObjects) {
  pack_limit_ = 16 * 1024;
  std::string file_key = "http://origin/big";
  std::string file_body(20000, 'f');
  Reopen();  // the directories
  std::string file_path = store_->BodyPath(file_key);
  store_.reset();
  fs::remove(dir_ + "/index.sqlite");
  std::ofstream(dir_ + "/index.sqlite").flush();  // an empty file is an empty database
  fs::create_directories(fs::path(file_path).parent_path());
  {
    std::ofstream(file_path) << file_body;
  }
  std::string head = R"({"status":200,"headers":[["ETag","\"p\""]]})";
  ExecSql(
      "PRAGMA page_size = 4096; PRAGMA journal_mode = WAL; "
      "CREATE TABLE schema_version(version INTEGER NOT NULL); "
      "INSERT INTO schema_version VALUES(4); "
      "CREATE TABLE objects(key TEXT PRIMARY KEY NOT NULL, size INTEGER NOT NULL, "
      "etag TEXT NOT NULL DEFAULT '', last_modified TEXT NOT NULL DEFAULT '', "
      "content_type TEXT NOT NULL DEFAULT '', expires_us INTEGER, fetched_us INTEGER NOT NULL, "
      "accessed_us INTEGER NOT NULL, complete INTEGER NOT NULL, "
      "response TEXT NOT NULL DEFAULT '', h INTEGER, body BLOB); "
      "CREATE INDEX objects_table ON objects(complete, h, size, accessed_us); "
      "CREATE TABLE shutdown(clean INTEGER NOT NULL); INSERT INTO shutdown VALUES(1);");
  auto insert = [&](const std::string& key, std::size_t size, const std::string& etag,
                    const std::string& response, const std::string& body_sql, int accessed) {
    ExecSql("INSERT INTO objects(key, size, etag, fetched_us, accessed_us, complete, response, h, "
            "body) VALUES('" + key + "', " + std::to_string(size) + ", '" + etag + "', 1, " +
            std::to_string(accessed) + ", 1, '" + response + "', " +
            std::to_string(static_cast<std::int64_t>(CacheStore::KeyHash(key))) + ", " +
            body_sql + ")");
  };
  insert("http://origin/packed", 6, "\"p\"", head, "CAST('packed' AS BLOB)", 3);
  insert(file_key, file_body.size(), "\"f\"", "", "NULL", 2);
  {
    // A partial copy left by an upgrade cut short: never opened, replaced by a whole one.
    std::ofstream(dir_ + "/index.sqlite.v5") << "half a copy";
  }
  Reopen();
  EXPECT_FALSE(fs::exists(dir_ + "/index.sqlite.v5"));
  ASSERT_EQ(store_->index().size(), 2u);
  EXPECT_EQ(LruOrder(), (Keys{file_key, "http://origin/packed"}));  // access times kept
  EXPECT_EQ(*ReadAll("http://origin/packed"), "packed");
  EXPECT_EQ(store_->index().Find("http://origin/packed")->response, head);
  EXPECT_EQ(store_->index().Find("http://origin/packed")->etag, "\"p\"");
  EXPECT_EQ(*ReadAll(file_key), file_body);
  // Stored again: the head deflated, one row of the key.
  CacheEntry meta = Meta("\"q\"");
  meta.response = head + "                                                                ";
  ASSERT_TRUE(Fill("http://origin/packed", "packed again", meta).ok());
  store_.reset();
  EXPECT_EQ(CountIndexesOn("objects"), 3);  // by_h, pending, files; no key autoindex
  EXPECT_EQ(CountRows("1"), 2);
  EXPECT_EQ(CountRows("key = 'http://origin/packed' AND typeof(response) = 'blob'"), 1);
  EXPECT_EQ(CountRows("key = '" + file_key + "' AND typeof(response) = 'text'"), 1);
  Reopen();
  EXPECT_EQ(*ReadAll("http://origin/packed"), "packed again");
  EXPECT_EQ(store_->index().Find("http://origin/packed")->response, meta.response);
  EXPECT_EQ(*ReadAll(file_key), file_body);
  store_.reset();
  // The rebuild vacuumed the file into the new page size.
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open_v2((dir_ + "/index.sqlite").c_str(), &db, SQLITE_OPEN_READWRITE, nullptr),
            SQLITE_OK);
  sqlite3_stmt* stmt = nullptr;
  int page_size = 0, version = 0;
  if (sqlite3_prepare_v2(db, "PRAGMA page_size", -1, &stmt, nullptr) == SQLITE_OK &&
      sqlite3_step(stmt) == SQLITE_ROW) {
    page_size = sqlite3_column_int(stmt, 0);
  }
  sqlite3_finalize(stmt);
  if (sqlite3_prepare_v2(db, "SELECT max(version) FROM schema_version", -1, &stmt, nullptr) ==
          SQLITE_OK &&
      sqlite3_step(stmt) == SQLITE_ROW) {
    version = sqlite3_column_int(stmt, 0);
  }
  sqlite3_finalize(stmt);
  sqlite3_close(db);
  EXPECT_EQ(page_size, 16384);
  EXPECT_EQ(version, 5);
}

TEST_F(CacheStoreTest, UpdateMetaReachesSqliteOnlyWhenSaved) {
  Reopen();
  ASSERT_TRUE(Fill("a", "aaaa", Meta("\"1\"")).ok());
  store_.reset();
  // A child updates the metadata, saves it or not, and dies without running any destructor.
  auto crash_after_update = [&](bool save) {
    std::fflush(nullptr);
    pid_t pid = ::fork();
    if (pid == 0) {
      event_base* base = event_base_new();
      SyncFileIo io(base);
      Result<std::unique_ptr<CacheStore>> store = CacheStore::Open(dir_, 0, clock_, io, Options());
      if (!store.ok()) ::_exit(2);
      if (!(*store)->UpdateMeta("a", [&](CacheEntry& e) { e.etag = save ? "\"saved\"" : "\"lost\""; }).ok()) ::_exit(3);
      if (save && !(*store)->SaveIndex().ok()) ::_exit(4);
      ::_exit(0);
    }
    int wstatus = 0;
    EXPECT_EQ(::waitpid(pid, &wstatus, 0), pid);
    EXPECT_TRUE(WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0) << "child status " << wstatus;
  };
  crash_after_update(false);
  Reopen();
  EXPECT_EQ(store_->index().Find("a")->etag, "\"1\"");  // lost with the crash: revalidated again
  store_.reset();
  crash_after_update(true);
  Reopen();
  EXPECT_EQ(store_->index().Find("a")->etag, "\"saved\"");
  EXPECT_EQ(*ReadAll("a"), "aaaa");
}

TEST_F(CacheStoreTest, FillCutShortByACrashIsGoneAfterReopen) {
  Reopen();
  ASSERT_TRUE(Fill("keep", "kept body").ok());
  store_.reset();
  std::fflush(nullptr);
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    // The child fills without committing and dies without running any destructor.
    event_base* base = event_base_new();
    SyncFileIo io(base);
    Result<std::unique_ptr<CacheStore>> store = CacheStore::Open(dir_, 0, clock_, io, Options());
    if (!store.ok()) ::_exit(2);
    Result<FillId> id = (*store)->BeginFill("crashed", {});
    if (!id.ok()) ::_exit(3);
    bool done = false;
    (*store)->AppendFill(*id, std::string(5000, 'c'), [&](Status) { done = true; });
    while (!done) event_base_loop(base, EVLOOP_ONCE);
    ::_exit(0);
  }
  int wstatus = 0;
  ASSERT_EQ(::waitpid(pid, &wstatus, 0), pid);
  ASSERT_TRUE(WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0) << "child status " << wstatus;
  // The crash left a temp file and a pending row behind...
  EXPECT_EQ(ObjectFiles().size(), 2u);
  EXPECT_EQ(CountRows("complete = 0"), 1);
  // ...which Open removes, keeping the complete object.
  Reopen();
  EXPECT_EQ(store_->Status("crashed", false).state, CacheState::kAbsent);
  EXPECT_EQ(*ReadAll("keep"), "kept body");
  EXPECT_EQ(ObjectFiles().size(), 1u);
  store_.reset();
  EXPECT_EQ(CountRows("complete = 0"), 0);
  EXPECT_EQ(CountRows("1"), 1);
}

TEST_F(CacheStoreTest, ReplacementCutShortByACrashIsDroppedNotMismatched) {
  // A crash between "row complete=0" and "row complete=1" of a replacement: the body at the
  // path may be the new one while the row describes the old. Open must serve neither.
  Reopen();
  ASSERT_TRUE(Fill("k", "body").ok());
  std::string path = store_->BodyPath("k");
  store_.reset();
  ExecSql("UPDATE objects SET complete = 0 WHERE key = 'k'");
  Reopen();
  EXPECT_EQ(store_->Status("k", false).state, CacheState::kAbsent);
  EXPECT_FALSE(fs::exists(path));
}

TEST_F(CacheStoreTest, OrphanFilesAreRemovedAtOpen) {
  Reopen();
  ASSERT_TRUE(Fill("live", "live body").ok());
  std::string live = store_->BodyPath("live");
  store_.reset();
  std::string objects = dir_ + "/objects";
  std::string orphan_name = CacheStore::ObjectName("never committed");
  fs::create_directories(objects + "/" + orphan_name.substr(0, 2));
  std::vector<std::string> orphans = {
      objects + "/" + orphan_name.substr(0, 2) + "/" + orphan_name,
      live + ".fill-17",
      objects + "/stray-file",
  };
  for (const std::string& p : orphans) std::ofstream(p) << "orphan";
  MarkUnclean();  // after a clean Close there are none: they come from crashes
  Reopen();
  for (const std::string& p : orphans) EXPECT_FALSE(fs::exists(p)) << p;
  EXPECT_TRUE(fs::exists(live));
  EXPECT_EQ(*ReadAll("live"), "live body");
}

TEST_F(CacheStoreTest, DamagedBodyIsDroppedAtOpenWithAWarning) {
  Reopen();
  ASSERT_TRUE(Fill("k", "twelve bytes").ok());
  ASSERT_TRUE(Fill("ok", "fine").ok());
  std::string path = store_->BodyPath("k");
  store_.reset();
  fs::resize_file(path, 5);
  MarkUnclean();  // after a crash (a clean Close has the checks done on open: below)
  Reopen();
  EXPECT_EQ(store_->Status("k", false).state, CacheState::kAbsent);
  EXPECT_FALSE(fs::exists(path));
  ASSERT_EQ(store_->warnings().size(), 1u);
  EXPECT_TRUE(Contains(store_->warnings()[0], "wrong size"));
  EXPECT_EQ(*ReadAll("ok"), "fine");
}

TEST_F(CacheStoreTest, OpenAfterACleanCloseChecksNoBodyAndReadsDropADamagedOne) {
  Reopen();
  ASSERT_TRUE(Fill("k", "twelve bytes").ok());
  ASSERT_TRUE(Fill("ok", "fine").ok());
  std::string path = store_->BodyPath("k");
  store_.reset();
  EXPECT_TRUE(MarkedClean());
  fs::resize_file(path, 5);
  Reopen();
  // Open looked at no body file...
  EXPECT_EQ(store_->Status("k", false).state, CacheState::kPresent);
  EXPECT_TRUE(store_->warnings().empty());
  // ...so the first read finds the damage, refuses it and drops the object.
  Result<std::string> damaged = ReadAll("k");
  ASSERT_FALSE(damaged.ok());
  EXPECT_EQ(damaged.status().ToErrno(), ENOENT);
  EXPECT_TRUE(Contains(damaged.status().message(), "index says 12"));
  EXPECT_EQ(store_->Status("k", false).state, CacheState::kAbsent);
  EXPECT_FALSE(fs::exists(path));
  EXPECT_EQ(*ReadAll("ok"), "fine");
}

TEST_F(CacheStoreTest, CleanOpenReadsTheTableFromACoveringIndexNotTheRows) {
  Reopen();
  ASSERT_TRUE(Fill("k", "body").ok());
  store_.reset();
  // The query Load runs after a clean Close: sqlite's plan must not touch the table's rows
  // (response heads and packed bodies make them hundreds of bytes each).
  sqlite3* db = nullptr;
  std::string path = dir_ + "/index.sqlite";
  ASSERT_EQ(sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READWRITE, nullptr), SQLITE_OK);
  sqlite3_stmt* stmt = nullptr;
  ASSERT_EQ(sqlite3_prepare_v2(db,
                               "EXPLAIN QUERY PLAN SELECT h, size, accessed_us, rowid FROM objects "
                               "WHERE complete = 1",
                               -1, &stmt, nullptr),
            SQLITE_OK);
  std::string plan;
  while (sqlite3_step(stmt) == SQLITE_ROW) {
    plan += reinterpret_cast<const char*>(sqlite3_column_text(stmt, 3));
    plan += "; ";
  }
  sqlite3_finalize(stmt);
  sqlite3_close(db);
  EXPECT_TRUE(Contains(plan, "COVERING INDEX objects_by_h")) << plan;
}

// What sqlite's plan for `sql` says, on the closed store's index; ghost_h is a stand-in for the
// store's function of the same name (the plan depends on its flags, not its values).
std::string PlanOf(const std::string& path, const std::string& sql) {
  sqlite3* db = nullptr;
  EXPECT_EQ(sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READWRITE, nullptr), SQLITE_OK);
  sqlite3_create_function_v2(
      db, "ghost_h", 1, SQLITE_UTF8 | SQLITE_DETERMINISTIC | SQLITE_INNOCUOUS, nullptr,
      [](sqlite3_context* ctx, int, sqlite3_value**) { sqlite3_result_int64(ctx, 7); }, nullptr,
      nullptr, nullptr);
  sqlite3_stmt* stmt = nullptr;
  std::string plan;
  EXPECT_EQ(sqlite3_prepare_v2(db, ("EXPLAIN QUERY PLAN " + sql).c_str(), -1, &stmt, nullptr),
            SQLITE_OK)
      << sqlite3_errmsg(db);
  while (stmt != nullptr && sqlite3_step(stmt) == SQLITE_ROW) {
    plan += reinterpret_cast<const char*>(sqlite3_column_text(stmt, 3));
    plan += "; ";
  }
  sqlite3_finalize(stmt);
  sqlite3_close(db);
  return plan;
}

TEST_F(CacheStoreTest, KeyLookupsAndRecoverySearchAnIndexWithoutOneOnKey) {
  Reopen();
  ASSERT_TRUE(Fill("k", "body").ok());
  store_.reset();
  std::string path = dir_ + "/index.sqlite";
  // No index holds the key (it was stored twice, 43 bytes a 512-byte object): a key is found
  // by its hash, through the one index, never by scanning the rows.
  EXPECT_EQ(CountIndexesOn("objects"), 3);  // objects_by_h, partial objects_pending, objects_files
  std::string by_key =
      PlanOf(path, "SELECT response FROM objects WHERE h = ghost_h(?1) AND key = ?1 AND complete = 1");
  EXPECT_TRUE(Contains(by_key, "SEARCH objects USING INDEX objects_by_h (h=?")) << by_key;
  std::string by_hash = PlanOf(path, "UPDATE objects SET accessed_us = ?2 WHERE h = ?1 AND complete = 1");
  EXPECT_TRUE(Contains(by_hash, "USING INDEX objects_by_h (h=? AND complete=?)")) << by_hash;
  // Open's look for fills cut short reads the small partial index, not a million rows.
  std::string pending = PlanOf(path, "SELECT key FROM objects WHERE complete = 0");
  EXPECT_TRUE(Contains(pending, "objects_pending")) << pending;
}

TEST_F(CacheStoreTest, RefillOfAKeyLeavesOneRowWithoutAUniqueKeyIndex) {
  pack_limit_ = 16 * 1024;
  Reopen();
  ASSERT_TRUE(Fill("k", "one", Meta("\"1\"")).ok());
  ASSERT_TRUE(Fill("k", std::string(20000, 'f'), Meta("\"2\"")).ok());  // a body file
  ASSERT_TRUE(Fill("k", "three", Meta("\"3\"")).ok());                  // packed again
  ASSERT_TRUE(Fill("other", "x").ok());
  EXPECT_EQ(*ReadAll("k"), "three");
  EXPECT_EQ(store_->index().Find("k")->etag, "\"3\"");
  store_.reset();
  EXPECT_EQ(CountRows("key = 'k'"), 1);
  EXPECT_EQ(CountRows("1"), 2);
  EXPECT_TRUE(ObjectFiles().empty());
}

TEST_F(CacheStoreTest, ResponseHeadIsStoredDeflatedAndReadBackWhole) {
  pack_limit_ = 16 * 1024;
  Reopen();
  CacheEntry meta;
  meta.etag = "\"6b07e9c8-200\"";
  meta.last_modified = "Thu, 26 Nov 2026 08:11:52 GMT";
  meta.content_type = "application/octet-stream";
  meta.response =
      R"({"expires_unix":1795684313,"headers":[["Server","nginx/1.22.1"],["Date","Thu, 26 Nov 2026 )"
      R"(08:11:53 GMT"],["Content-Type","application/octet-stream"],["Last-Modified","Thu, 26 Nov )"
      R"(2026 08:11:52 GMT"],["ETag","\"6b07e9c8-200\""],["Expires","Thu, 26 Nov 2026 09:11:53 )"
      R"(GMT"],["Cache-Control","max-age=3600"],["Accept-Ranges","bytes"]],"status":200,)"
      R"("stored_unix":1795680713})";
  ASSERT_TRUE(Fill("nginx", std::string(512, 'n'), meta).ok());
  CacheEntry odd = meta;  // bytes no dictionary knows, and every byte value
  odd.response.clear();
  for (int i = 0; i < 3000; ++i) odd.response += static_cast<char>((i * 7919) & 0xff);
  ASSERT_TRUE(Fill("odd", "o", odd).ok());
  CacheEntry tiny;
  tiny.response = "{}";  // does not shrink: kept as text
  ASSERT_TRUE(Fill("tiny", "t", tiny).ok());
  Reopen();
  EXPECT_EQ(store_->index().Find("nginx")->response, meta.response);
  EXPECT_EQ(store_->index().Find("nginx")->etag, meta.etag);
  EXPECT_EQ(store_->index().Find("nginx")->last_modified, meta.last_modified);
  EXPECT_EQ(store_->index().Find("nginx")->content_type, meta.content_type);
  EXPECT_EQ(store_->index().Find("odd")->response, odd.response);
  EXPECT_EQ(store_->index().Find("tiny")->response, "{}");
  // New validators and a new head, stored together (UpdateMeta, as after a 304).
  ASSERT_TRUE(store_->UpdateMeta("nginx", [](CacheEntry& e) {
                      e.etag = "\"7\"";
                      e.last_modified = "Fri, 27 Nov 2026 10:00:00 GMT";
                      e.response += " ";
                    }).ok());
  ASSERT_TRUE(store_->SaveIndex().ok());
  store_.reset();
  // nginx's 369-byte head and the 68 bytes of its validators and type cost under a third of
  // the head in its row.
  EXPECT_EQ(CountRows("key = 'nginx' AND typeof(response) = 'blob' AND etag = '' AND "
                      "last_modified = '' AND content_type = '' AND length(response) < " +
                      std::to_string(meta.response.size() / 3)),
            1);
  EXPECT_EQ(CountRows("key = 'tiny' AND typeof(response) = 'text'"), 1);
  Reopen();
  EXPECT_EQ(store_->index().Find("nginx")->response, meta.response + " ");
  EXPECT_EQ(store_->index().Find("nginx")->etag, "\"7\"");
  EXPECT_EQ(store_->index().Find("nginx")->last_modified, "Fri, 27 Nov 2026 10:00:00 GMT");
  EXPECT_EQ(store_->index().Find("nginx")->content_type, meta.content_type);
}

// Issue 16's goal, scaled down: small objects as a proxy stores them (nginx's head, URL keys)
// take at most 1.5 times their bodies' bytes on the disk, index and all. Measured as the growth
// from 1000 to 3000 objects, what each more object costs (the first pages of each small table
// and the 256 directories of objects/ are a fixed cost, nothing at a million objects).
TEST_F(CacheStoreTest, SmallObjectsTakeAtMostOneAndAHalfTimesTheirBodiesOnDisk) {
  pack_limit_ = 16 * 1024;
  std::mt19937 random(16);
  std::string body(512, '\0');
  for (char& c : body) c = static_cast<char>(random());  // incompressible, as a JPEG's bytes
  auto fill = [&](int from, int to) {
    Reopen();
    for (int i = from; i < to; ++i) {
      CacheEntry meta;
      std::string n = std::to_string(i);
      std::string minute = std::to_string(10 + i % 50);
      meta.etag = "\"6b07e9c8-" + n + "\"";
      meta.last_modified = "Thu, 26 Nov 2026 08:11:52 GMT";
      meta.content_type = "application/octet-stream";
      meta.size = body.size();  // announced, as the proxy does from Content-Length
      meta.response = R"({"expires_unix":17956)" + std::to_string(84313 + i) +
                      R"(,"headers":[["Server","nginx/1.22.1"],["Date","Thu, 26 Nov 2026 08:)" +
                      minute + R"(:53 GMT"],["Content-Type","application/octet-stream"],)"
                      R"(["Last-Modified","Thu, 26 Nov 2026 08:11:52 GMT"],["ETag","\"6b07e9c8-)" +
                      n + R"(\""],["Expires","Thu, 26 Nov 2026 09:)" + minute +
                      R"(:53 GMT"],["Cache-Control","max-age=3600"],["Accept-Ranges","bytes"]],)"
                      R"("status":200,"stored_unix":17956)" + std::to_string(80713 + i) + "}";
      ASSERT_TRUE(
          Fill("http://127.0.0.1:50031/o/" + std::to_string(i % 2) + "/" + n, body, meta).ok());
    }
    store_.reset();
  };
  auto disk = [&] {
    Bytes total = 0;
    for (const auto& entry : fs::recursive_directory_iterator(dir_)) {
      struct stat sb;
      if (::lstat(entry.path().c_str(), &sb) == 0) total += static_cast<Bytes>(sb.st_blocks) * 512;
    }
    return total;
  };
  fill(0, 1000);
  Bytes at_1000 = disk();
  fill(1000, 3000);
  Bytes at_3000 = disk();
  double per_object = static_cast<double>(at_3000 - at_1000) / 2000;
  EXPECT_LE(per_object, 1.5 * 512) << at_1000 << " bytes at 1000 objects, " << at_3000
                                   << " at 3000";
}

TEST_F(CacheStoreTest, RowsFreedByEvictionAreReusedSoACacheAtItsCapStopsGrowing) {
  // Fill -> evict -> fill: a cache at its cap keeps the same number of packed objects, so
  // the index must reuse the space evicted rows leave (sqlite's free pages), not grow.
  pack_limit_ = 16 * 1024;
  constexpr int kAtCap = 1000;
  std::mt19937 random(4);
  std::string body(512, '\0');
  for (char& c : body) c = static_cast<char>(random());
  auto disk = [&] {
    Bytes total = 0;
    for (const auto& entry : fs::recursive_directory_iterator(dir_)) {
      struct stat sb;
      if (::lstat(entry.path().c_str(), &sb) == 0) total += static_cast<Bytes>(sb.st_blocks) * 512;
    }
    return total;
  };
  int next = 0;
  auto fill = [&](int n) {
    Reopen(kAtCap * body.size());
    for (int i = 0; i < n; ++i, ++next) {
      CacheEntry meta = Meta("\"" + std::to_string(next) + "\"");
      meta.size = body.size();
      meta.response = R"({"status":200,"headers":[["ETag","\")" + std::to_string(next) + R"(\""]]})";
      ASSERT_TRUE(Fill("http://127.0.0.1:50031/o/" + std::to_string(next), body, meta).ok());
    }
    EXPECT_EQ(store_->index().size(), static_cast<std::size_t>(std::min(next, kAtCap)));
    store_.reset();
  };
  fill(kAtCap);
  Bytes full = disk();
  for (int round = 0; round < 3; ++round) fill(kAtCap);  // each round evicts the whole cache
  Bytes after = disk();
  EXPECT_LE(static_cast<double>(after), 1.1 * static_cast<double>(full))
      << full << " bytes at the cap, " << after << " after evicting it three times over";
}

TEST_F(CacheStoreTest, ObjectBiggerThanALoweredCapIsDroppedAtACleanOpen) {
  Reopen();
  ASSERT_TRUE(Fill("big", std::string(100, 'b')).ok());
  ASSERT_TRUE(Fill("small", "s").ok());
  std::string path = store_->BodyPath("big");
  store_.reset();
  ASSERT_TRUE(MarkedClean());
  Reopen(50);
  EXPECT_EQ(store_->Status("big", false).state, CacheState::kAbsent);
  EXPECT_FALSE(fs::exists(path));
  EXPECT_EQ(*ReadAll("small"), "s");
  store_.reset();
  EXPECT_EQ(CountRows("1"), 1);
}

TEST_F(CacheStoreTest, CrashAfterACleanOpenMakesTheNextOpenCheckBodies) {
  Reopen();
  ASSERT_TRUE(Fill("k", "twelve bytes").ok());
  std::string path = store_->BodyPath("k");
  store_.reset();
  ASSERT_TRUE(MarkedClean());
  std::fflush(nullptr);
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    // The child opens the cleanly closed cache and dies without closing it.
    event_base* base = event_base_new();
    SyncFileIo io(base);
    Result<std::unique_ptr<CacheStore>> store = CacheStore::Open(dir_, 0, clock_, io, Options());
    ::_exit(store.ok() ? 0 : 2);
  }
  int wstatus = 0;
  ASSERT_EQ(::waitpid(pid, &wstatus, 0), pid);
  ASSERT_TRUE(WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0) << "child status " << wstatus;
  EXPECT_FALSE(MarkedClean());  // cleared as the child opened it
  fs::resize_file(path, 5);
  Reopen();
  EXPECT_EQ(store_->Status("k", false).state, CacheState::kAbsent);
  ASSERT_EQ(store_->warnings().size(), 1u);
  EXPECT_TRUE(Contains(store_->warnings()[0], "wrong size"));
}

// Bytes this process has read through read()/pread() so far (/proc/self/io's rchar, which
// counts reads served from the page cache too): what sqlite read, in a test that does
// nothing else.
std::int64_t BytesReadSoFar() {
  std::ifstream io("/proc/self/io");
  std::string name;
  std::int64_t value = 0;
  while (io >> name >> value) {
    if (name == "rchar:") return value;
  }
  return -1;
}

TEST_F(CacheStoreTest, CrashRecoveryReadsTheIndexNotEveryPackedRow) {
  // After a crash only the body files are in doubt (a packed body is a row, as safe as the
  // index): Open reads the covering index and the rows with a body file, not the whole table
  // (1M packed objects took 29.8 s that way).
  pack_limit_ = 16 * 1024;
  Reopen();
  std::string body(8000, 'p');
  for (int i = 0; i < 1500; ++i) ASSERT_TRUE(Fill("packed-" + std::to_string(i), body).ok());
  ASSERT_TRUE(Fill("file", std::string(64 * 1024, 'f')).ok());  // over the pack limit
  store_.reset();
  MarkUnclean();
  auto table_bytes = static_cast<std::int64_t>(fs::file_size(dir_ + "/index.sqlite"));
  ASSERT_GT(table_bytes, 1500 * 8000);
  std::int64_t before = BytesReadSoFar();
  ASSERT_GE(before, 0) << "no rchar in /proc/self/io";
  Reopen();
  std::int64_t read = BytesReadSoFar() - before;
  EXPECT_LT(read, table_bytes / 8) << "the crash recovery read " << read << " bytes of a "
                                   << table_bytes << "-byte index";
  EXPECT_EQ(store_->index().size(), 1501u);
  EXPECT_EQ(*ReadAll("packed-7"), body);
  EXPECT_EQ(ReadAll("file")->size(), 64u * 1024);
}

TEST_F(CacheStoreTest, CrashRecoveryChecksBodyFilesOfAnIndexMadeBeforeObjectsFiles) {
  // A version-5 index written before the partial index objects_files existed gets it at its
  // first Open, and a crash recovery finds a damaged body file through it.
  pack_limit_ = 1024;
  Reopen();
  ASSERT_TRUE(Fill("k", std::string(4000, 'k')).ok());
  ASSERT_TRUE(Fill("packed", "small").ok());
  std::string path = store_->BodyPath("k");
  store_.reset();
  ExecSql("DROP INDEX objects_files");
  Reopen();  // clean: creates the index
  store_.reset();
  EXPECT_EQ(CountIndexesOn("objects"), 3);
  fs::resize_file(path, 5);
  MarkUnclean();
  Reopen();
  EXPECT_EQ(store_->Status("k", false).state, CacheState::kAbsent);
  EXPECT_FALSE(fs::exists(path));
  ASSERT_EQ(store_->warnings().size(), 1u);
  EXPECT_TRUE(Contains(store_->warnings()[0], "wrong size"));
  EXPECT_EQ(*ReadAll("packed"), "small");
}

TEST_F(CacheStoreTest, SmallBodiesArePackedInTheIndexAndReadBack) {
  pack_limit_ = 16;
  Reopen();
  ASSERT_TRUE(Fill("small", "fifteen bytes..", Meta("\"s\"")).ok());
  ASSERT_TRUE(Fill("large", "sixteen bytes...").ok());
  // No file for the small one (and no temp file left), a file for the one at the limit.
  EXPECT_EQ(ObjectFiles(),
            (std::set<std::string>{fs::relative(store_->BodyPath("large"), dir_ + "/objects").string()}));
  ASSERT_NE(store_->PackedBody("small"), nullptr);
  EXPECT_EQ(*store_->PackedBody("small"), "fifteen bytes..");
  EXPECT_EQ(store_->PackedBody("large"), nullptr);
  EXPECT_EQ(store_->PackedBody("absent"), nullptr);
  EXPECT_EQ(*ReadAll("small"), "fifteen bytes..");
  EXPECT_EQ(store_->index().Find("small")->etag, "\"s\"");
  // Across a reopen, clean or after a crash (which checks files, not packed bodies).
  Reopen();
  EXPECT_EQ(*ReadAll("small"), "fifteen bytes..");
  store_.reset();
  MarkUnclean();
  Reopen();
  EXPECT_EQ(*ReadAll("small"), "fifteen bytes..");
  EXPECT_TRUE(store_->warnings().empty());
  EXPECT_EQ(CacheStore::PackedVersion("fifteen bytes..").back(), '5');
  EXPECT_NE(CacheStore::PackedVersion("fifteen bytes.."), CacheStore::PackedVersion("fifteen bytes.!"));
}

// A hit as ghostfs serves one (its lookup: Find, then the packed body for the answer's version
// and again for the answer) runs one sqlite statement, one read transaction: two fcntl locks of
// the WAL index instead of six (round 15). The body read with the entry is never served once
// the object has changed.
TEST_F(CacheStoreTest, AHitReadsItsEntryAndPackedBodyWithOneStatement) {
  pack_limit_ = 1024;
  Reopen();
  ASSERT_TRUE(Fill("p", "packed body", Meta("\"1\"")).ok());
  ASSERT_TRUE(Fill("f", std::string(2000, 'f')).ok());
  ASSERT_TRUE(Fill("e", "").ok());
  Reopen();  // nothing found yet
  std::uint64_t before = store_->index_reads();
  const CacheEntry* e = store_->index().Find("p");
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->etag, "\"1\"");
  ASSERT_NE(store_->PackedBody("p"), nullptr);
  EXPECT_EQ(*store_->PackedBody("p"), "packed body");
  EXPECT_EQ(store_->index_reads() - before, 1u);
  // A body file, and an empty packed body: the entry's read tells them apart.
  before = store_->index_reads();
  ASSERT_NE(store_->index().Find("f"), nullptr);
  EXPECT_EQ(store_->PackedBody("f"), nullptr);
  ASSERT_NE(store_->index().Find("e"), nullptr);
  ASSERT_NE(store_->PackedBody("e"), nullptr);
  EXPECT_EQ(*store_->PackedBody("e"), "");
  EXPECT_EQ(store_->index_reads() - before, 2u);
  // Without a Find first, PackedBody reads sqlite itself.
  Reopen();
  before = store_->index_reads();
  EXPECT_EQ(*store_->PackedBody("p"), "packed body");
  EXPECT_EQ(store_->index_reads() - before, 1u);
  // Replaced (packed by packed, by a file, by packed again), its metadata updated, erased:
  // never the old body.
  ASSERT_NE(store_->index().Find("p"), nullptr);
  ASSERT_TRUE(Fill("p", "another body", Meta("\"2\"")).ok());
  EXPECT_EQ(*store_->PackedBody("p"), "another body");
  ASSERT_NE(store_->index().Find("p"), nullptr);
  EXPECT_EQ(*store_->PackedBody("p"), "another body");
  ASSERT_TRUE(store_->UpdateMeta("p", [](CacheEntry& m) { m.etag = "\"3\""; }).ok());
  EXPECT_EQ(store_->index().Find("p")->etag, "\"3\"");
  EXPECT_EQ(*store_->PackedBody("p"), "another body");
  ASSERT_TRUE(Fill("p", std::string(2000, 'p')).ok());
  ASSERT_NE(store_->index().Find("p"), nullptr);
  EXPECT_EQ(store_->PackedBody("p"), nullptr);
  ASSERT_TRUE(Fill("p", "small again").ok());
  ASSERT_NE(store_->index().Find("p"), nullptr);
  EXPECT_EQ(*store_->PackedBody("p"), "small again");
  ASSERT_TRUE(store_->Erase("p").ok());
  EXPECT_EQ(store_->PackedBody("p"), nullptr);
  EXPECT_EQ(store_->index().Find("p"), nullptr);
}

TEST_F(CacheStoreTest, PackedAndFileBodiesReplaceEachOther) {
  pack_limit_ = 16;
  Reopen();
  ASSERT_TRUE(Fill("k", "a body of twenty bytes").ok());
  std::string path = store_->BodyPath("k");
  ASSERT_TRUE(fs::exists(path));
  ASSERT_TRUE(Fill("k", "now small").ok());
  EXPECT_FALSE(fs::exists(path));  // the old body file goes with the replacement
  EXPECT_EQ(*ReadAll("k"), "now small");
  EXPECT_EQ(store_->index().Find("k")->size, 9u);
  ASSERT_TRUE(Fill("k", "large again, a file").ok());
  EXPECT_EQ(store_->PackedBody("k"), nullptr);
  EXPECT_EQ(*ReadAll("k"), "large again, a file");
  Reopen();
  EXPECT_EQ(*ReadAll("k"), "large again, a file");
  EXPECT_EQ(store_->index().size(), 1u);
}

TEST_F(CacheStoreTest, EvictionAndEraseFreePackedBodies) {
  pack_limit_ = 1024;
  Reopen(30);
  ASSERT_TRUE(Fill("a", std::string(10, 'a')).ok());
  ASSERT_TRUE(Fill("b", std::string(10, 'b')).ok());
  ASSERT_TRUE(Fill("c", std::string(10, 'c')).ok());
  ASSERT_TRUE(Fill("d", std::string(10, 'd')).ok());  // evicts a
  EXPECT_EQ(store_->Status("a", false).state, CacheState::kAbsent);
  EXPECT_EQ(store_->PackedBody("a"), nullptr);
  ASSERT_TRUE(store_->Erase("b").ok());
  EXPECT_EQ(store_->PackedBody("b"), nullptr);
  EXPECT_TRUE(ObjectFiles().empty());
  store_.reset();
  EXPECT_EQ(CountRows("body IS NOT NULL"), 2);
  EXPECT_EQ(CountRows("1"), 2);
}

TEST_F(CacheStoreTest, PackedFillCutShortByACrashLeavesNoRowNorFile) {
  pack_limit_ = 1024;
  Reopen();
  ASSERT_TRUE(Fill("keep", "kept").ok());
  store_.reset();
  std::fflush(nullptr);
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    event_base* base = event_base_new();
    SyncFileIo io(base);
    CacheStoreOptions options = Options();
    Result<std::unique_ptr<CacheStore>> store = CacheStore::Open(dir_, 0, clock_, io, options);
    if (!store.ok()) ::_exit(2);
    Result<FillId> id = (*store)->BeginFill("crashed", {});
    if (!id.ok()) ::_exit(3);
    bool done = false;
    (*store)->AppendFill(*id, std::string(500, 'c'), [&](Status) { done = true; });
    while (!done) event_base_loop(base, EVLOOP_ONCE);
    ::_exit(0);
  }
  int wstatus = 0;
  ASSERT_EQ(::waitpid(pid, &wstatus, 0), pid);
  ASSERT_TRUE(WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0) << "child status " << wstatus;
  Reopen();
  EXPECT_EQ(store_->Status("crashed", false).state, CacheState::kAbsent);
  EXPECT_EQ(*ReadAll("keep"), "kept");
  EXPECT_TRUE(ObjectFiles().empty());  // the temp file went with the crash recovery
  store_.reset();
  EXPECT_EQ(CountRows("1"), 1);
}

TEST_F(CacheStoreTest, CorruptIndexIsSetAsideWithAWarning) {
  Reopen();
  ASSERT_TRUE(Fill("k", "body").ok());
  store_.reset();
  {
    std::ofstream garbage(dir_ + "/index.sqlite", std::ios::binary | std::ios::trunc);
    for (int i = 0; i < 200; ++i) garbage << "this is not an sqlite database. ";
  }
  Reopen();
  ASSERT_EQ(store_->warnings().size(), 1u);
  EXPECT_TRUE(Contains(store_->warnings()[0], "index.sqlite.corrupt-")) << store_->warnings()[0];
  EXPECT_TRUE(store_->index().empty());
  EXPECT_TRUE(ObjectFiles().empty());  // bodies with no row are orphans
  bool set_aside = false;
  for (const std::string& f : FilesUnder(dir_)) {
    if (f.rfind("index.sqlite.corrupt-", 0) == 0) set_aside = true;
  }
  EXPECT_TRUE(set_aside);
  // The fresh index works and survives a reopen without complaint.
  ASSERT_TRUE(Fill("k2", "new body").ok());
  Reopen();
  EXPECT_TRUE(store_->warnings().empty());
  EXPECT_EQ(*ReadAll("k2"), "new body");
}

TEST_F(CacheStoreTest, HostileKeysStayInsideTheDirectory) {
  Reopen();
  const Keys keys = {
      "../../escape",
      "/etc/passwd",
      "a/b/../../c",
      std::string("nul\0byte", 8),
      std::string("nul\0other", 9),
      "\xff\xfe\x01 odd bytes \n\t",
      "",
      std::string(5000, '/'),
  };
  for (std::size_t i = 0; i < keys.size(); ++i) {
    ASSERT_TRUE(Fill(keys[i], "body " + std::to_string(i)).ok()) << i;
  }
  // Nothing left the cache directory.
  std::set<std::string> outside = FilesUnder(root_);
  for (const std::string& f : outside) EXPECT_EQ(f.rfind("cache/", 0), 0u) << f;
  EXPECT_FALSE(fs::exists("/etc/passwd.fill-1"));
  EXPECT_EQ(ObjectFiles().size(), keys.size());
  Reopen();
  ASSERT_EQ(store_->index().size(), keys.size());
  for (std::size_t i = 0; i < keys.size(); ++i) {
    Result<std::string> body = ReadAll(keys[i]);
    ASSERT_TRUE(body.ok()) << i << ": " << body.status().ToString();
    EXPECT_EQ(*body, "body " + std::to_string(i));
  }
}

TEST_F(CacheStoreTest, InjectedEnospcAbortsThatFillOnly) {
  Reopen();
  ASSERT_TRUE(Fill("old", "old body").ok());
  Result<FillId> a = store_->BeginFill("a", {});
  Result<FillId> b = store_->BeginFill("b", {});
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_TRUE(Append(*a, "first half of a, ", 100).ok());
  ASSERT_TRUE(Append(*b, "first half of b, ", 100).ok());
  io_->FailWhen([](const FileCall& c) { return c.op == FileOp::kWrite && c.size == 777; }, ENOSPC);
  Status full = Append(*b, std::string(777, 'b'), 777);
  ASSERT_FALSE(full.ok());
  EXPECT_EQ(full.ToErrno(), ENOSPC);
  EXPECT_TRUE(Contains(full.message(), "\"b\"")) << full.ToString();
  EXPECT_TRUE(Contains(full.message(), "abandoned")) << full.ToString();
  io_->Heal();
  EXPECT_EQ(Append(*b, "more", 4).ToErrno(), ENOSPC);  // the fill stays failed
  EXPECT_EQ(Commit(*b).ToErrno(), ENOSPC);
  ASSERT_TRUE(Append(*a, "second half of a", 100).ok());
  ASSERT_TRUE(Commit(*a).ok());

  EXPECT_EQ(store_->Status("b", false).state, CacheState::kAbsent);
  EXPECT_EQ(*ReadAll("a"), "first half of a, second half of a");
  EXPECT_EQ(*ReadAll("old"), "old body");
  EXPECT_EQ(ObjectFiles().size(), 2u);  // a and old: b's temp file is gone
  Reopen();
  EXPECT_EQ(LruOrder().size(), 2u);
  EXPECT_EQ(store_->Status("b", false).state, CacheState::kAbsent);
}

TEST_F(CacheStoreTest, InjectedEioOnAWriteAbortsThatFill) {
  Reopen();
  Result<FillId> id = store_->BeginFill("k", {});
  ASSERT_TRUE(id.ok());
  io_->FailWhen([](const FileCall& c) { return c.op == FileOp::kWrite && c.offset == 2000; }, EIO);
  Status st = Append(*id, std::string(5000, 'k'), 1000);  // the third append fails
  EXPECT_EQ(st.ToErrno(), EIO);
  EXPECT_EQ(Commit(*id).ToErrno(), EIO);
  EXPECT_EQ(store_->Status("k", false).state, CacheState::kAbsent);
  EXPECT_TRUE(ObjectFiles().empty());
}

TEST_F(CacheStoreTest, ReadErrorIsReportedWithTheKey) {
  Reopen();
  ASSERT_TRUE(Fill("k", "body").ok());
  io_->FailWhen([](const FileCall& c) { return c.op == FileOp::kRead && c.size > 0; }, EIO);
  std::string buf(4, '\0');
  Result<std::size_t> r = ReadOnce("k", 0, buf);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().ToErrno(), EIO);
  EXPECT_TRUE(Contains(r.status().message(), "reading the cached body of \"k\""))
      << r.status().ToString();
  io_->Heal();
  EXPECT_EQ(*ReadAll("k"), "body");  // the object itself is fine
}

TEST_F(CacheStoreTest, CallbacksNeverRunInsideTheCall) {
  Reopen();
  bool returned = false;
  bool ran_inside = false;
  bool done = false;
  std::string buf(4, '\0');
  store_->ReadBody("absent", 0, buf, [&](Result<std::size_t> r) {
    ran_inside = !returned;
    EXPECT_EQ(r.status().code(), Status::Code::kNotFound);
    done = true;
  });
  returned = true;
  Run(done);
  EXPECT_FALSE(ran_inside);

  Result<FillId> id = store_->BeginFill("k", {});
  ASSERT_TRUE(id.ok());
  returned = false;
  done = false;
  store_->CommitFill(*id, [&](Status st) {  // an empty body: nothing to wait for
    ran_inside = !returned;
    EXPECT_TRUE(st.ok()) << st.ToString();
    done = true;
  });
  returned = true;
  Run(done);
  EXPECT_FALSE(ran_inside);
  EXPECT_EQ(store_->Status("k", false).state, CacheState::kPresent);
}

TEST_F(CacheStoreTest, LoweredCapEvictsAtOpen) {
  Reopen();
  for (const char* key : {"a", "b", "c"}) {
    clock_.AdvanceBy(Seconds(1));
    ASSERT_TRUE(Fill(key, std::string(1000, key[0])).ok());
  }
  std::string a_path = store_->BodyPath("a");
  Reopen(2000);
  EXPECT_EQ(LruOrder(), (Keys{"b", "c"}));
  EXPECT_FALSE(fs::exists(a_path));
}

TEST_F(CacheStoreTest, MissingParentIsAClearError) {
  Result<std::unique_ptr<CacheStore>> store =
      CacheStore::Open(root_ + "/no/such/cache", 0, clock_, *io_, Options());
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), Status::Code::kNotFound);
  EXPECT_TRUE(Contains(store.status().message(), "parent directory does not exist"))
      << store.status().ToString();
  EXPECT_FALSE(fs::exists(root_ + "/no"));
}

TEST_F(CacheStoreTest, SecondStoreOnTheSameDirectoryIsRefused) {
  Reopen();
  Result<std::unique_ptr<CacheStore>> second = OpenStore(0);
  ASSERT_FALSE(second.ok());
  EXPECT_TRUE(Contains(second.status().message(), "locked")) << second.status().ToString();
  EXPECT_TRUE(Contains(second.status().message(), "another ghostfs"));
  ASSERT_TRUE(Fill("k", "still works").ok());
}

TEST_F(CacheStoreTest, ObjectNameIsTheSha256OfTheKey) {
  // FIPS 180-4 test vectors, one and two blocks.
  EXPECT_EQ(CacheStore::ObjectName("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(CacheStore::ObjectName(""),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(CacheStore::ObjectName("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  Reopen();
  EXPECT_EQ(store_->BodyPath("abc"),
            dir_ + "/objects/ba/ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

TEST_F(CacheStoreTest, ClosedStoreRefusesWork) {
  Reopen();
  ASSERT_TRUE(Fill("k", "body").ok());
  ASSERT_TRUE(store_->Close().ok());
  EXPECT_TRUE(store_->Close().ok());  // idempotent
  EXPECT_FALSE(store_->BeginFill("k2", {}).ok());
  EXPECT_FALSE(store_->Erase("k").ok());
  std::string buf(4, '\0');
  EXPECT_FALSE(ReadOnce("k", 0, buf).ok());
}

}  // namespace
}  // namespace ghost

namespace ghost {
namespace {

// Open no longer reads every page with quick_check (seconds at a million objects): a damaged
// table page is met by Load's scan, and the index is set aside just the same.
TEST_F(CacheStoreTest, CorruptTablePageMetWhileLoadingIsSetAside) {
  Reopen();
  CacheEntry meta = Meta("\"1\"");
  meta.response = std::string(300, 'r');  // many table pages
  for (int i = 0; i < 300; ++i) ASSERT_TRUE(Fill("k" + std::to_string(i), "b", meta).ok());
  store_.reset();
  {
    std::fstream db(dir_ + "/index.sqlite", std::ios::binary | std::ios::in | std::ios::out);
    db.seekg(0, std::ios::end);
    auto size = static_cast<long>(db.tellg());
    ASSERT_GT(size, 16 * 4096);
    db.seekp(size / 3);  // past the header and the schema, inside the objects table
    for (long i = size / 3; i < 2 * size / 3; ++i) db.put('\x5a');
  }
  Reopen();
  ASSERT_EQ(store_->warnings().size(), 1u);
  EXPECT_TRUE(Contains(store_->warnings()[0], "index.sqlite.corrupt-")) << store_->warnings()[0];
  EXPECT_TRUE(store_->index().empty());
  EXPECT_TRUE(ObjectFiles().empty());
  ASSERT_TRUE(Fill("new", "body").ok());
  EXPECT_EQ(*ReadAll("new"), "body");
}

// The in-memory table answers presence and size for every object after a reopen, and Find
// reads the rest of the entry from sqlite on demand.
TEST_F(CacheStoreTest, ReopenedIndexFindsEntriesOnDemand) {
  Reopen();
  for (int i = 0; i < 2000; ++i) {
    CacheEntry meta = Meta("\"" + std::to_string(i) + "\"");
    ASSERT_TRUE(Fill("url/" + std::to_string(i), std::string(i % 7 + 1, 'x'), meta).ok());
  }
  Reopen();
  EXPECT_EQ(store_->index().size(), 2000u);
  EXPECT_LT(store_->table_memory_bytes(), 2000u * 41);
  for (int i = 0; i < 2000; i += 97) {
    std::string key = "url/" + std::to_string(i);
    EXPECT_EQ(store_->Status(key, false).size, static_cast<Bytes>(i % 7 + 1));
    const CacheEntry* e = store_->index().Find(key);
    ASSERT_NE(e, nullptr) << key;
    EXPECT_EQ(e->etag, "\"" + std::to_string(i) + "\"");
    EXPECT_EQ(e->size, static_cast<Bytes>(i % 7 + 1));
  }
  EXPECT_EQ(store_->index().Find("url/2000"), nullptr);
  EXPECT_FALSE(store_->index().Contains("url/2000"));
}

// Group commit of the misses path: fills whose appends complete together are published by one
// transaction, and a fill announced under the pack limit writes no pending row of its own.
// (Before the group commit, each fill cost two: its pending row and its commit.)
TEST_F(CacheStoreTest, FillsCommittedTogetherShareOneTransaction) {
  pack_limit_ = 1024;
  Reopen();
  constexpr int kFills = 32;
  std::uint64_t before = store_->transactions();
  int pending = kFills;
  int failed = 0;
  for (int i = 0; i < kFills; ++i) {
    std::string body = RandomBytes(512, i);
    CacheEntry meta = Meta("\"" + std::to_string(i) + "\"");
    meta.size = body.size();
    Result<FillId> id = store_->BeginFill("group/" + std::to_string(i), meta);
    ASSERT_TRUE(id.ok()) << id.status().ToString();
    store_->AppendFill(*id, body, [&](Status st) { failed += st.ok() ? 0 : 1; });
    store_->CommitFill(*id, [&](Status st) {
      failed += st.ok() ? 0 : 1;
      --pending;
    });
  }
  RunUntilZero(pending);
  EXPECT_EQ(failed, 0);
  std::uint64_t used = store_->transactions() - before;
  EXPECT_GE(used, 1u);
  EXPECT_LE(used, 2u) << "fills committed together should share a transaction";
  for (int i = 0; i < kFills; ++i) EXPECT_EQ(*ReadAll("group/" + std::to_string(i)), RandomBytes(512, i));
  Reopen();
  EXPECT_EQ(store_->index().size(), static_cast<std::size_t>(kFills));
  for (int i = 0; i < kFills; ++i) EXPECT_EQ(*ReadAll("group/" + std::to_string(i)), RandomBytes(512, i));
}

// Fills of one key committed in one turn, packed and file bodies mixed: the last committed wins,
// in memory and after a reopen.
TEST_F(CacheStoreTest, LastCommittedFillOfAKeyWinsInAGroupOfPackedAndFileBodies) {
  pack_limit_ = 1024;
  Reopen();
  for (const auto& order : {std::vector<std::size_t>{100, 5000, 200}, std::vector<std::size_t>{5000, 300},
                            std::vector<std::size_t>{400, 6000}}) {
    int pending = 0;
    std::string key = "same/" + std::to_string(order.size()) + "/" + std::to_string(order.front());
    for (std::size_t i = 0; i < order.size(); ++i) {
      CacheEntry meta;
      meta.size = order[i];
      Result<FillId> id = store_->BeginFill(key, meta);
      ASSERT_TRUE(id.ok()) << id.status().ToString();
      ++pending;
      store_->AppendFill(*id, RandomBytes(order[i], i), [](Status) {});
      store_->CommitFill(*id, [&](Status st) {
        EXPECT_TRUE(st.ok()) << st.ToString();
        --pending;
      });
    }
    RunUntilZero(pending);
    std::string want = RandomBytes(order.back(), order.size() - 1);
    EXPECT_EQ(*ReadAll(key), want) << key;
    Reopen();
    EXPECT_EQ(*ReadAll(key), want) << key << " after a reopen";
  }
}

// A crash in the middle of a fill storm: every fill whose commit was acknowledged (its
// CommitFill callback ran) is readable and byte-identical after the next Open. The child
// "crashes" (_exit, no destructor, no sqlite close: what SIGKILL leaves) inside the 10th
// acknowledgement, while the rest of its group and later fills are still unacknowledged; a store
// that acknowledged a fill before its transaction committed would lose acknowledged fills here.
TEST_F(CacheStoreTest, AcknowledgedFillsSurviveACrashDuringAFillStorm) {
  pack_limit_ = 1024;
  Reopen();
  store_.reset();
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  std::fflush(nullptr);
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::close(fds[0]);
    event_base* base = event_base_new();
    SyncFileIo io(base);
    Result<std::unique_ptr<CacheStore>> store = CacheStore::Open(dir_, 0, clock_, io, Options());
    if (!store.ok()) ::_exit(2);
    int acked = 0;
    for (int i = 0; i < 64; ++i) {
      // Mostly packed bodies, every 8th a file: both kinds are acknowledged only when durable.
      std::size_t size = i % 8 == 7 ? 3000 : 512;
      CacheEntry meta;
      meta.size = size;
      std::string key = "storm/" + std::to_string(i);
      Result<FillId> id = (*store)->BeginFill(key, meta);
      if (!id.ok()) ::_exit(3);
      (*store)->AppendFill(*id, RandomBytes(size, i), [](Status) {});
      (*store)->CommitFill(*id, [&, key](Status st) {
        if (!st.ok()) ::_exit(4);
        std::string line = key + "\n";
        if (::write(fds[1], line.data(), line.size()) != static_cast<ssize_t>(line.size())) ::_exit(5);
        if (++acked == 10) ::_exit(0);
      });
    }
    for (;;) event_base_loop(base, EVLOOP_ONCE);
  }
  ::close(fds[1]);
  std::string acks;
  char buf[4096];
  for (ssize_t n; (n = ::read(fds[0], buf, sizeof buf)) > 0;) acks.append(buf, n);
  ::close(fds[0]);
  int wstatus = 0;
  ASSERT_EQ(::waitpid(pid, &wstatus, 0), pid);
  ASSERT_TRUE(WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0) << "child status " << wstatus;
  std::vector<std::string> acked;
  for (std::size_t at = 0, nl; (nl = acks.find('\n', at)) != std::string::npos; at = nl + 1) {
    acked.push_back(acks.substr(at, nl - at));
  }
  ASSERT_EQ(acked.size(), 10u);
  Reopen();
  for (const std::string& key : acked) {
    int i = std::stoi(key.substr(key.find('/') + 1));
    Result<std::string> body = ReadAll(key);
    ASSERT_TRUE(body.ok()) << key << " was acknowledged but is gone after the crash: "
                           << body.status().ToString();
    EXPECT_EQ(*body, RandomBytes(i % 8 == 7 ? 3000 : 512, i)) << key;
  }
  // Whatever else survived is whole; no temp file is left.
  for (const std::string& f : ObjectFiles()) EXPECT_EQ(f.find(".fill-"), std::string::npos) << f;
}

// A fill announced under the pack limit keeps its bytes in RAM until its commit: no temp file
// is created, written, read back and removed (a third of the daemon's CPU per small miss).
TEST_F(CacheStoreTest, AFillAnnouncedUnderThePackLimitMakesNoTempFile) {
  pack_limit_ = 1024;
  Reopen();
  std::string body = RandomBytes(700, 7);
  CacheEntry meta = Meta("\"m\"");
  meta.size = body.size();
  Result<FillId> id = store_->BeginFill("in ram", meta);
  ASSERT_TRUE(id.ok()) << id.status().ToString();
  ASSERT_TRUE(Append(*id, body, 100).ok());
  EXPECT_TRUE(ObjectFiles().empty()) << "a temp file was made for a fill announced packed";
  ASSERT_TRUE(Commit(*id).ok());
  EXPECT_TRUE(ObjectFiles().empty());
  EXPECT_EQ(*ReadAll("in ram"), body);
  EXPECT_EQ(store_->index().Find("in ram")->etag, "\"m\"");
  Reopen();
  EXPECT_EQ(*ReadAll("in ram"), body);
}

// Its RAM holds at most the announced size: more fails the fill, nothing of it is cached, and
// the object it would have replaced stays.
TEST_F(CacheStoreTest, AFillInRamThatGrowsPastItsAnnouncedSizeFails) {
  pack_limit_ = 1024;
  Reopen();
  ASSERT_TRUE(Fill("k", "old body").ok());
  CacheEntry meta;
  meta.size = 10;
  Result<FillId> id = store_->BeginFill("k", meta);
  ASSERT_TRUE(id.ok());
  ASSERT_TRUE(Append(*id, "0123456789", 10).ok());
  Status grew = Append(*id, "x", 1);
  EXPECT_FALSE(grew.ok());
  EXPECT_TRUE(Contains(grew.message(), "grew past the 10 bytes announced")) << grew.ToString();
  EXPECT_FALSE(Commit(*id).ok());
  EXPECT_EQ(*ReadAll("k"), "old body");
  // Short of the announced size: refused at the commit, as a file body is.
  id = store_->BeginFill("k", meta);
  ASSERT_TRUE(id.ok());
  ASSERT_TRUE(Append(*id, "short", 5).ok());
  EXPECT_FALSE(Commit(*id).ok());
  EXPECT_EQ(*ReadAll("k"), "old body");
  EXPECT_EQ(store_->open_fills(), 0u);
}

TEST_F(CacheStoreTest, CommitsLeaveTheWalsCheckpointsAndTheirSyncsToTheCheckpointer) {
  pack_limit_ = 16 * 1024;
  Reopen();  // Open syncs the cleared shutdown mark: not counted
  const std::string index = dir_ + "/index.sqlite";
  const auto before = fs::file_size(index);
  g_syncs_on_watched = 0;
  g_syncs_elsewhere = 0;
  g_sync_watch = std::this_thread::get_id();
  // ~12 MiB of packed bodies through the WAL: three times the checkpoint threshold.
  for (int i = 0; i < 800; ++i) {
    ASSERT_TRUE(Fill("k" + std::to_string(i), RandomBytes(15000, i)).ok());
  }
  // What the committing thread still syncs: the WAL's header when it starts over after a
  // complete checkpoint, at most once per checkpoint pass, each of which syncs twice on the
  // checkpointer's thread. sqlite's own checkpoints sync twice per 4 MiB on this thread (21
  // here) and never elsewhere.
  const int watched = g_syncs_on_watched.load();
  g_sync_watch = std::thread::id();
  const int elsewhere = g_syncs_elsewhere.load();
  EXPECT_GE(elsewhere, 2) << "no checkpoint synced on another thread";
  EXPECT_LE(2 * watched, elsewhere) << "the committing thread synced for checkpoints";
  // The checkpointer copies the WAL into the file meanwhile (bounded wait: a real thread).
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (fs::file_size(index) < before + (4u << 20) && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_GE(fs::file_size(index), before + (4u << 20)) << "no checkpoint reached the index file";
  // Back-to-back commits outrun the checkpointer; past 32 MiB the committer waits for it.
  EXPECT_LE(fs::file_size(index + "-wal"), 40u << 20) << "the WAL outgrew its checkpoints";
  Reopen();
  EXPECT_EQ(store_->index().size(), 800u);
  EXPECT_EQ(*ReadAll("k0"), RandomBytes(15000, 0));
  EXPECT_EQ(*ReadAll("k799"), RandomBytes(15000, 799));
}

TEST_F(CacheStoreTest, AccessTimesReachSqliteInBatchesOrOnceTheyAreOld) {
  CacheStoreOptions options = Options();
  options.access_batch = 3;
  options.access_max_lag = Seconds(10);
  store_.reset();
  Result<std::unique_ptr<CacheStore>> opened = CacheStore::Open(dir_, 0, clock_, *io_, options);
  ASSERT_TRUE(opened.ok()) << opened.status().ToString();
  store_ = std::move(opened).value();
  int unsaved = 0;
  store_->SetUnsavedListener([&] { ++unsaved; });
  for (const char* key : {"a", "b", "c", "d"}) {
    clock_.AdvanceBy(Seconds(1));
    ASSERT_TRUE(Fill(key, key).ok());
  }
  // Two access times, under the batch: a fill's transaction leaves them in memory.
  EXPECT_TRUE(store_->Touch("a"));
  EXPECT_TRUE(store_->Touch("b"));
  EXPECT_EQ(unsaved, 1) << "the listener hears the first unsaved change only";
  ASSERT_TRUE(Fill("e", "e").ok());
  EXPECT_EQ(store_->access_saves(), 0u);
  EXPECT_EQ(store_->unsaved_index_changes(), 2u);
  // The third makes a batch: the next transaction writes all three.
  EXPECT_TRUE(store_->Touch("c"));
  EXPECT_TRUE(store_->AccessTimesDue());
  ASSERT_TRUE(Fill("f", "f").ok());
  EXPECT_EQ(store_->access_saves(), 1u);
  EXPECT_EQ(store_->unsaved_index_changes(), 0u);
  // One, older than the lag when the next transaction comes: written too.
  EXPECT_TRUE(store_->Touch("d"));
  EXPECT_EQ(unsaved, 2);
  EXPECT_FALSE(store_->AccessTimesDue());
  clock_.AdvanceBy(Seconds(11));
  EXPECT_TRUE(store_->AccessTimesDue());
  ASSERT_TRUE(Fill("g", "g").ok());
  EXPECT_EQ(store_->access_saves(), 2u);
  EXPECT_EQ(LruOrder(), (Keys{"a", "b", "e", "c", "f", "d", "g"}));
}

TEST_F(CacheStoreTest, AccessOrderSurvivesCloseSaveIndexAndLosesOnlyUnsavedTimesToACrash) {
  Reopen(3000);
  for (const char* key : {"a", "b", "c"}) {
    clock_.AdvanceBy(Seconds(1));
    ASSERT_TRUE(Fill(key, std::string(1000, key[0])).ok());
  }
  clock_.AdvanceBy(Seconds(1));
  EXPECT_TRUE(store_->Touch("a"));
  Reopen(3000);  // a clean Close writes it
  EXPECT_EQ(LruOrder(), (Keys{"b", "c", "a"}));
  store_.reset();
  // A child touches an object, commits a fill (under the batch: the time stays in memory),
  // touches another and saves the index, touches a third and dies without closing.
  std::fflush(nullptr);
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    Result<std::unique_ptr<CacheStore>> store = OpenStore(3000);
    if (!store.ok()) ::_exit(2);
    store_ = std::move(store).value();
    clock_.AdvanceBy(Seconds(1));
    if (!store_->Touch("b")) ::_exit(3);
    if (!Fill("c", std::string(900, 'C')).ok()) ::_exit(4);  // replaces c: c is the newest
    if (store_->access_saves() != 0) ::_exit(5);
    clock_.AdvanceBy(Seconds(1));
    if (!store_->Touch("a") || !store_->SaveIndex().ok()) ::_exit(6);
    clock_.AdvanceBy(Seconds(1));
    if (!store_->Touch("c")) ::_exit(7);
    ::_exit(0);
  }
  int wstatus = 0;
  ASSERT_EQ(::waitpid(pid, &wstatus, 0), pid);
  ASSERT_TRUE(WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0) << "child status " << wstatus;
  Reopen(3000);
  // b's and a's times were saved with SaveIndex; c's last touch was lost (its fill's time
  // stands), which leaves c older than a.
  EXPECT_EQ(LruOrder(), (Keys{"b", "c", "a"}));
  // Eviction follows that order: b goes first.
  clock_.AdvanceBy(Seconds(1));
  ASSERT_TRUE(Fill("d", std::string(1000, 'd')).ok());
  EXPECT_EQ(store_->Status("b", false).state, CacheState::kAbsent);
  EXPECT_EQ(LruOrder(), (Keys{"c", "a", "d"}));
}

// A hit's access time is a row appended to the ticks table, not an UPDATE of its object's row:
// a batch of 250 times over 1,000 packed objects wrote ~50 pages (16 KiB each, a random page
// of the table and of objects_by_h per time) as updates; appended, they share a page or two.
TEST_F(CacheStoreTest, ABatchOfAccessTimesAppendsAFewPagesNotAPagePerObject) {
  pack_limit_ = 16 * 1024;
  Reopen();
  const std::string body(600, 'b');
  for (int i = 0; i < 1000; ++i) {
    clock_.AdvanceBy(Millis(1));
    ASSERT_TRUE(Fill("k" + std::to_string(i), body).ok());
  }
  Keys touched;
  for (int i = 1; i < 1000; i += 4) {  // 250, spread over the table, newest last
    clock_.AdvanceBy(Millis(1));
    touched.push_back("k" + std::to_string(i));
    ASSERT_TRUE(store_->Touch(touched.back()));
  }
  const std::uint64_t before = store_->pages_written();
  ASSERT_TRUE(store_->SaveIndex().ok());
  const std::uint64_t pages = store_->pages_written() - before;
  EXPECT_LE(pages, 6u) << "250 access times wrote " << pages << " pages of the index";
  EXPECT_GE(pages, 1u);
  EXPECT_EQ(store_->unsaved_index_changes(), 0u);
  // They order the objects after a reopen.
  Reopen();
  Keys order = LruOrder();
  ASSERT_EQ(order.size(), 1000u);
  EXPECT_EQ(Keys(order.end() - touched.size(), order.end()), touched);
}

// The ticks table is compacted to one row per object once it would pass max(ticks_min_rows,
// objects): it does not grow with the hits, and the order survives the compaction.
TEST_F(CacheStoreTest, TheTicksTableIsCompactedAndKeepsTheAccessOrder) {
  ticks_min_rows_ = 100;
  pack_limit_ = 16 * 1024;
  Reopen();
  for (int i = 0; i < 40; ++i) {
    clock_.AdvanceBy(Millis(1));
    ASSERT_TRUE(Fill("k" + std::to_string(i), "body").ok());
  }
  // 30 rounds of touching every object but one, in a round-dependent order: 1,170 times.
  Keys expect;
  for (int round = 0; round < 30; ++round) {
    expect.clear();
    for (int j = 0; j < 40; ++j) {
      int i = (j * 7 + round) % 40;
      if (i == 0) continue;
      clock_.AdvanceBy(Millis(1));
      ASSERT_TRUE(store_->Touch("k" + std::to_string(i)));
      expect.push_back("k" + std::to_string(i));
    }
    ASSERT_TRUE(store_->SaveIndex().ok());
  }
  expect.insert(expect.begin(), "k0");  // never touched: the oldest
  EXPECT_EQ(LruOrder(), expect);
  store_.reset();
  int rows = CountRows("1", "ticks");
  EXPECT_GT(rows, 0);
  EXPECT_LE(rows, 100 + 39) << "the ticks table was not compacted";
  Reopen();
  EXPECT_EQ(LruOrder(), expect);
}

TEST_F(CacheStoreTest, AStoreOpenedBeforeAForkKeepsCheckpointingInTheChild) {
  // ghostfs opens its cache, then daemonises (PrepareFork, then fork): the checkpointer's
  // thread, if it started in the parent, is not in the child. A child that commits past the
  // WAL's cap (where the committer waits for a checkpoint) must get a thread of its own, not
  // wait forever.
  pack_limit_ = 16 * 1024;
  std::fflush(nullptr);
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::alarm(300);  // a hang ends the child (SIGALRM), which the parent reports
    Result<std::unique_ptr<CacheStore>> store = OpenStore(0);
    if (!store.ok()) ::_exit(2);
    store_ = std::move(store).value();
    for (int i = 0; i < 400; ++i) {  // ~6 MiB of WAL: the thread starts here
      if (!Fill("p" + std::to_string(i), RandomBytes(15000, i)).ok()) ::_exit(3);
    }
    store_->PrepareFork();
    std::fflush(nullptr);
    pid_t grandchild = ::fork();
    if (grandchild < 0) ::_exit(4);
    if (grandchild == 0) {
      for (int i = 0; i < 1500; ++i) {  // ~22 MiB of bodies, ~65 MiB of WAL written
        if (!Fill("c" + std::to_string(i), RandomBytes(15000, i)).ok()) ::_exit(5);
      }
      if (!store_->Close().ok()) ::_exit(6);
      ::_exit(0);
    }
    int st = 0;
    if (::waitpid(grandchild, &st, 0) != grandchild) ::_exit(7);
    ::_exit(WIFEXITED(st) ? WEXITSTATUS(st) : 100 + (WIFSIGNALED(st) ? WTERMSIG(st) : 0));
  }
  int wstatus = 0;
  ASSERT_EQ(::waitpid(pid, &wstatus, 0), pid);
  ASSERT_TRUE(WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0)
      << "child status " << wstatus << " (exit " << WEXITSTATUS(wstatus) << ")";
  Reopen();
  EXPECT_EQ(store_->index().size(), 1900u);
  EXPECT_EQ(*ReadAll("c1499"), RandomBytes(15000, 1499));
}

}  // namespace
}  // namespace ghost
