// StoreTree against a context of fakes and small real parts (no mount, no FUSE): a virtual
// clock, an ideal machine, a cache store in a temporary directory, and the control socket
// served on the test's own loop. The same context serves a test of OriginTree's open-time
// prefetch (its reads go through a FileIo that can hold them, as UringFileIo's submitter does).
#include "fs/store_tree.h"

#include <event2/event.h>
#include <gtest/gtest.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <memory>
#include <span>
#include <sstream>
#include <string>
#include <vector>

#include "common/base/clock.h"
#include "common/base/file_io.h"
#include "common/cache/cache_manager.h"
#include "common/config/config.h"
#include "common/control/control.h"
#include "common/control/protocol.h"
#include "common/http/http_fetcher.h"
#include "common/power/ideal_machine.h"
#include "common/power/machine.h"
#include "fs/fuse_passthrough.h"
#include "fs/origin_tree.h"
#include "fs/write_back.h"

namespace ghost {
namespace {

// A SyncFileIo whose reads can be held: a held read is done (pread on its fd *number*) only at
// Release(), as UringFileIo's submitter thread looks the number up only when it enters the
// kernel. It notes whether the number still names the file it named when the read was asked.
class HoldingFileIo final : public FileIo {
 public:
  explicit HoldingFileIo(event_base* base) : inner_(base) {}
  void Read(int fd, std::uint64_t offset, std::span<char> buf, Done done) override {
    if (!hold_reads_) return inner_.Read(fd, offset, buf, std::move(done));
    struct stat st{};
    (void)::fstat(fd, &st);
    held_.push_back({fd, offset, buf, std::move(done), st.st_dev, st.st_ino});
  }
  void Write(int fd, std::uint64_t offset, std::string data, Done done) override {
    inner_.Write(fd, offset, std::move(data), std::move(done));
  }
  void Fsync(int fd, std::function<void(Status)> done) override { inner_.Fsync(fd, std::move(done)); }

  void set_hold_reads(bool hold) { hold_reads_ = hold; }
  std::size_t held() const { return held_.size(); }
  int held_fd(std::size_t i) const { return held_[i].fd; }
  // What the held reads found wrong with their fd when they were done.
  const std::vector<std::string>& misuses() const { return misuses_; }
  void Release() {
    std::vector<Held> held = std::move(held_);
    held_.clear();
    for (Held& h : held) {
      struct stat st{};
      if (::fstat(h.fd, &st) != 0) {
        misuses_.push_back("fd " + std::to_string(h.fd) + " was closed while a read naming it was still queued");
      } else if (st.st_dev != h.dev || st.st_ino != h.ino) {
        misuses_.push_back("fd " + std::to_string(h.fd) + " named another file (opened after the read was queued) when the read was done");
      }
      const ssize_t n = ::pread(h.fd, h.buf.data(), h.buf.size(), static_cast<off_t>(h.offset));
      h.done(n >= 0 ? Result<std::size_t>(static_cast<std::size_t>(n))
                    : Result<std::size_t>(Status::FromErrno(errno, "pread")));
    }
  }

 private:
  struct Held {
    int fd;
    std::uint64_t offset;
    std::span<char> buf;
    Done done;
    dev_t dev;
    ino_t ino;
  };
  SyncFileIo inner_;
  bool hold_reads_ = false;
  std::vector<Held> held_;
  std::vector<std::string> misuses_;
};

class StoreTreeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    base_ = event_base_new();
    ASSERT_NE(base_, nullptr);
    std::string tmpl = ::testing::TempDir() + "ghost_store_tree_XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    root_ = tmpl;
    options_.cache_dir = root_;
    mount_path_ = root_ + "/mnt";
    MachineOptions mo;
    mo.power_management = false;
    Result<std::unique_ptr<Machine>> machine = Machine::Build(clock_, IdealMachineProfile(), mo);
    ASSERT_TRUE(machine.ok()) << machine.status().ToString();
    machine_ = std::move(machine).value();
    manager_ = std::make_unique<CacheManager>(clock_, *machine_, CacheManager::Options{});
    io_ = std::make_unique<HoldingFileIo>(base_);
    Result<std::unique_ptr<CacheStore>> store = CacheStore::Open(root_ + "/objects-db", 0, clock_, *io_);
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    store_ = std::move(store).value();
    write_back_ = std::make_unique<WriteBack>(machine_->pm(), machine_->storage_id(), machine_->storage(),
                                              *store_, WriteBackOptions{});
    http_ = std::make_unique<HttpFetcher>(base_, HttpFetcherOptions{});
    passthrough_ = std::make_unique<FusePassthrough>(root_);
    TreeContext ctx{.options = options_,
                    .clock = clock_,
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
                    .stats_changed = [this] { ++stats_changes_; },
                    .object_changed = [this](const std::string& key) { changed_.push_back(key); },
                    .baseline_write = [](Bytes) {},
                    .baseline_fetch = [](Bytes) {},
                    .imap_outcome = [](const std::string&, bool, const Status&) {},
                    .loop = base_,
                    .mount_path = mount_path_,
                    .invalidate_inode = {}};
    origin_ = std::make_unique<OriginTree>(ctx);
    tree_ = std::make_unique<StoreTree>(ctx, *origin_);
    Result<std::unique_ptr<ControlServer>> server = ControlServer::Listen(
        base_, root_ + "/control.sock",
        [this](const ControlRequest& request, ControlServer::Reply reply) { tree_->Control(request, std::move(reply)); });
    ASSERT_TRUE(server.ok()) << server.status().ToString();
    server_ = std::move(server).value();
    Result<std::unique_ptr<AsyncControlClient>> client = AsyncControlClient::Connect(base_, root_ + "/control.sock");
    ASSERT_TRUE(client.ok()) << client.status().ToString();
    client_ = std::move(client).value();
  }

  void TearDown() override {
    client_.reset();
    server_.reset();
    tree_.reset();
    origin_.reset();
    http_.reset();
    write_back_.reset();
    if (store_) (void)store_->Close();
    store_.reset();
    io_.reset();
    manager_.reset();
    machine_.reset();
    if (base_) event_base_free(base_);
    std::error_code ec;
    std::filesystem::remove_all(root_, ec);
  }

  // Sends `op` with `args` to the tree through the socket and runs the loop and the clock
  // until the reply is back.
  Result<nlohmann::json> Call(ControlOp op, nlohmann::json args) {
    std::optional<Result<nlohmann::json>> out;
    client_->Call(op, std::move(args), [&](Result<nlohmann::json> r) { out = std::move(r); });
    for (int i = 0; i < 10000 && !out; ++i) {
      clock_.RunUntilIdle();
      event_base_loop(base_, EVLOOP_ONCE | EVLOOP_NONBLOCK);
    }
    if (!out) return Status::TimedOut("no reply");
    return std::move(*out);
  }

  Result<LookupResult> Lookup(const std::string& key) {
    Result<nlohmann::json> r = Call(ControlOp::kLookup, {{"key", key}});
    if (!r.ok()) return r.status();
    return LookupResult::FromJson(*r);
  }

  static std::string ReadFile(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }

  VirtualClock clock_;
  event_base* base_ = nullptr;
  std::string root_;
  std::string mount_path_;
  GhostfsOptions options_;
  std::unique_ptr<Machine> machine_;
  std::unique_ptr<CacheManager> manager_;
  std::unique_ptr<HoldingFileIo> io_;
  std::unique_ptr<CacheStore> store_;
  std::unique_ptr<WriteBack> write_back_;
  std::unique_ptr<HttpFetcher> http_;
  std::unique_ptr<FusePassthrough> passthrough_;
  InodeTable inodes_;
  ReadLog reads_;
  std::uint64_t next_fh_ = 1;
  int stats_changes_ = 0;
  std::vector<std::string> changed_;
  std::unique_ptr<OriginTree> origin_;
  std::unique_ptr<StoreTree> tree_;
  std::unique_ptr<ControlServer> server_;
  std::unique_ptr<AsyncControlClient> client_;
};

// Round 17 (scripts/RESULTS.md, proxyrand17): a handle released before its open-time prefetch
// read was done closed its body file under that read; the FileIo may resolve the number only
// later, when it may name a file (or a socket, or /dev/fuse) opened meanwhile, which the read
// then reads from. The prefetch keeps the released handle's file until its read is done.
TEST_F(StoreTreeTest, PrefetchKeepsAReleasedHandlesFileUntilItsReadIsDone) {
  const std::string body_path = root_ + "/body";
  const std::string victim_path = root_ + "/victim";
  { std::ofstream(body_path, std::ios::binary) << std::string(100, 'b'); }
  { std::ofstream(victim_path, std::ios::binary) << std::string(100, 'v'); }
  Result<BodyFile> file = BodyFile::Open(body_path);
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  Handle h;
  h.kind = NodeKind::kOriginFile;
  h.io_mode = IoMode::kDirect;  // no page-cache or passthrough bookkeeping to undo at release
  h.key = "http://o/body";
  h.source = ReadSource::kDisk;
  h.file = std::move(file).value();
  const int body_fd = h.file.fd();
  io_->set_hold_reads(true);
  std::uint64_t fh = origin_->AddHandle(std::move(h));
  // Said to be longer than the file: the in-page-cache attempt (RWF_NOWAIT) comes back short,
  // so the read goes through the FileIo, as for a body not in the page cache.
  origin_->StartPrefetch(*origin_->FindHandle(fh), 4096);
  ASSERT_EQ(io_->held(), 1u) << "the prefetch did not go through the FileIo";
  ASSERT_EQ(io_->held_fd(0), body_fd);
  origin_->ReleaseHandle(fh);
  // A file opened now takes the lowest free number: the body's, had the release closed it.
  const int victim_fd = ::open(victim_path.c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(victim_fd, 0);
  io_->Release();
  EXPECT_TRUE(io_->misuses().empty()) << io_->misuses().front();
  EXPECT_NE(victim_fd, body_fd) << "the released handle's body file was closed before its prefetch read was done";
  // Once the read is done, the prefetch closes the file it kept.
  if (victim_fd != body_fd) {
    EXPECT_EQ(::fcntl(body_fd, F_GETFD), -1) << "fd " << body_fd << " left open";
  }
  ::close(victim_fd);
}

TEST_F(StoreTreeTest, LookupOfAnUncachedKeyIsNotCached) {
  Result<nlohmann::json> r = Call(ControlOp::kLookup, {{"key", "http://o/none"}});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(*r, nlohmann::json({{"cached", false}}));
  EXPECT_TRUE(reads_.requests_by_source.empty());
}

TEST_F(StoreTreeTest, LookupOfAStoredObjectNamesOneVersionOnTheDisk) {
  // Queued and (no power management) written at once: the lookup waits for the fill. Large
  // enough to be a body file of its own (not packed in the index).
  CacheEntry meta;
  meta.etag = "\"e1\"";
  const std::string body(20000, 'h');
  write_back_->QueueFill("http://o/a", meta, body);
  Result<LookupResult> r = Lookup("http://o/a");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(r->cached);
  EXPECT_EQ(r->size, 20000u);
  EXPECT_EQ(r->etag, "\"e1\"");
  EXPECT_EQ(r->choice, LookupChoice::kDisk);
  EXPECT_EQ(r->source, "disk");
  ASSERT_FALSE(r->version.empty());
  EXPECT_EQ(r->version[0], 'd');
  EXPECT_TRUE(r->path.starts_with(mount_path_ + "/.ghost/objects/")) << r->path;
  EXPECT_TRUE(r->path.ends_with("@" + r->version)) << r->path;
  EXPECT_EQ(ReadFile(r->body_path), body);
  EXPECT_TRUE(r->cost.is_object());
  EXPECT_EQ(reads_.requests_by_source[ReadSource::kDisk], 1);
  EXPECT_EQ(reads_.bytes_from_cache, 20000u);
}

TEST_F(StoreTreeTest, LookupOfASmallObjectNamesItsPackedVersionAndNoBodyFile) {
  write_back_->QueueFill("http://o/small", CacheEntry{}, "hello");
  Result<LookupResult> r = Lookup("http://o/small");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(r->cached);
  EXPECT_EQ(r->size, 5u);
  EXPECT_EQ(r->version, CacheStore::PackedVersion("hello"));
  EXPECT_TRUE(r->path.ends_with("@" + r->version)) << r->path;
  EXPECT_TRUE(r->body_path.empty()) << r->body_path;  // no file: the bytes come with it
  EXPECT_EQ(r->packed_body, "hello");
  EXPECT_EQ(reads_.bytes_from_cache, 5u);
}

// The lookup remembered the object in the page-cache model: the next one reads memory, as
// ghostsim counts it.
TEST_F(StoreTreeTest, ASecondLookupIsServedFromTheMemoryModel) {
  write_back_->QueueFill("http://o/a", CacheEntry{}, "hello");
  ASSERT_TRUE(Lookup("http://o/a").ok());
  Result<LookupResult> r = Lookup("http://o/a");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->source, "memory");
  EXPECT_EQ(r->choice, LookupChoice::kDisk);
  EXPECT_EQ(reads_.requests_by_source[ReadSource::kMemory], 1);
}

TEST_F(StoreTreeTest, InvalidateDropsTheObject) {
  write_back_->QueueFill("http://o/a", CacheEntry{}, "hello");
  ASSERT_TRUE(Lookup("http://o/a").ok());
  Result<nlohmann::json> r = Call(ControlOp::kInvalidate, {{"key", "http://o/a"}});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ((*r)["removed"], true);
  Result<LookupResult> again = Lookup("http://o/a");
  ASSERT_TRUE(again.ok());
  EXPECT_FALSE(again->cached);
}

TEST_F(StoreTreeTest, StoreHandsOutAFillPathUnderTheMount) {
  Result<nlohmann::json> r = Call(ControlOp::kStore, {{"key", "http://o/b"}, {"content_type", "text/plain"}});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  Result<std::string> path = StorePathFromJson(*r);
  ASSERT_TRUE(path.ok());
  EXPECT_TRUE(path->starts_with(mount_path_ + "/.ghost/fill/")) << *path;
  EXPECT_EQ(tree_->StatsJson()["open_fills"], 1);
}

TEST_F(StoreTreeTest, InlineStoreQueuesTheBodyWithNoFillFile) {
  const std::string body = std::string("inline \0 bytes\xff", 16) + std::string(500, 'i');
  Result<nlohmann::json> r = Call(ControlOp::kStore, {{"key", "http://o/inline"},
                                                      {"etag", "\"i1\""},
                                                      {"body_base64", EncodeBase64(body)}});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(*r, nlohmann::json({{"stored", body.size()}}));
  nlohmann::json stats = tree_->StatsJson();
  EXPECT_EQ(stats["fills"], 1);
  EXPECT_EQ(stats["inline_fills"], 1);
  EXPECT_EQ(stats["open_fills"], 0);  // no .ghost/fill token was handed out
  // Committed like a fill file's body (packed in the index), with its fields, read and charged
  // as any packed body.
  Result<LookupResult> got = Lookup("http://o/inline");
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_TRUE(got->cached);
  EXPECT_EQ(got->etag, "\"i1\"");
  EXPECT_EQ(got->version, CacheStore::PackedVersion(body));
  EXPECT_EQ(got->packed_body, body);
  EXPECT_EQ(reads_.bytes_from_cache, body.size());
  EXPECT_EQ(store_->PackedBody("http://o/inline") ? *store_->PackedBody("http://o/inline") : "", body);
}

TEST_F(StoreTreeTest, InlineStoreReplacingAnObjectAnnouncesTheChange) {
  write_back_->QueueFill("http://o/r", CacheEntry{}, "old");
  ASSERT_TRUE(Lookup("http://o/r").ok());  // from the first lookup on, changes are announced
  changed_.clear();
  ASSERT_TRUE(Call(ControlOp::kStore, {{"key", "http://o/r"}, {"body_base64", EncodeBase64("new!")}}).ok());
  Result<LookupResult> got = Lookup("http://o/r");
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(got->packed_body, "new!");
  EXPECT_NE(std::find(changed_.begin(), changed_.end(), "http://o/r"), changed_.end());
}

TEST_F(StoreTreeTest, InlineStoreOfAMalformedBodyIsRefusedAndStoresNothing) {
  Result<nlohmann::json> r = Call(ControlOp::kStore, {{"key", "http://o/bad"}, {"body_base64", "@@@@"}});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("body_base64"), std::string::npos) << r.status().ToString();
  EXPECT_EQ(tree_->StatsJson()["fills"], 0);
  Result<LookupResult> got = Lookup("http://o/bad");
  ASSERT_TRUE(got.ok());
  EXPECT_FALSE(got->cached);
}

TEST_F(StoreTreeTest, OpsOfTheDaemonAreNotTheStoresOps) {
  Result<nlohmann::json> r = Call(ControlOp::kDevices, nlohmann::json::object());
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("not an op of the shared store"), std::string::npos)
      << r.status().ToString();
}

}  // namespace
}  // namespace ghost
