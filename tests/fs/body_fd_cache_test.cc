#include "fs/body_fd_cache.h"

#include <event2/event.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <memory>
#include <string>

#include "common/base/clock.h"
#include "common/base/file_io.h"
#include "common/cache/cache_store.h"

namespace ghost {
namespace {

namespace fs = std::filesystem;

// A real store on a temporary directory (bodies are files: pack_limit 0), filled through its
// ordinary fill path.
class BodyFdCacheTest : public ::testing::Test {
 protected:
  void SetUp() override {
    base_ = event_base_new();
    ASSERT_NE(base_, nullptr);
    io_ = std::make_unique<SyncFileIo>(base_);
    std::string tmpl = ::testing::TempDir() + "ghost_body_fd_cache_XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    root_ = tmpl;
    Open(0);
  }
  void TearDown() override {
    store_.reset();
    io_.reset();
    event_base_free(base_);
    std::error_code ec;
    fs::remove_all(root_, ec);
  }
  void Open(Bytes capacity) {
    store_.reset();
    CacheStoreOptions options;
    options.pack_limit = 0;
    Result<std::unique_ptr<CacheStore>> s = CacheStore::Open(root_ + "/cache", capacity, clock_, *io_, options);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    store_ = std::move(s).value();
    store_->SetInternalChangeListener([this](const std::string& key) { cache_.Forget(key); });
  }
  void Fill(const std::string& key, const std::string& body) {
    Result<FillId> id = store_->BeginFill(key, {});
    ASSERT_TRUE(id.ok()) << id.status().ToString();
    int pending = 1;
    store_->AppendFill(*id, body, [&](Status st) {
      EXPECT_TRUE(st.ok()) << st.ToString();
      --pending;
    });
    while (pending > 0) event_base_loop(base_, EVLOOP_ONCE);
    bool done = false;
    store_->CommitFill(*id, [&](Status st) {
      EXPECT_TRUE(st.ok()) << st.ToString();
      done = true;
    });
    while (!done) event_base_loop(base_, EVLOOP_ONCE);
  }
  std::string ReadAll(const BodyFile& f) {
    std::string out(f.size(), '\0');
    EXPECT_EQ(pread(f.fd(), out.data(), out.size(), 0), static_cast<ssize_t>(out.size()));
    return out;
  }

  event_base* base_ = nullptr;
  VirtualClock clock_;
  std::unique_ptr<SyncFileIo> io_;
  std::string root_;
  std::unique_ptr<CacheStore> store_;
  BodyFdCache cache_{4};
};

TEST_F(BodyFdCacheTest, SecondOpenOfABodyUsesTheKeptDescriptorNotThePath) {
  Fill("http://o/a", "first body");
  Result<BodyFile> one = cache_.Open(*store_, "http://o/a");
  ASSERT_TRUE(one.ok()) << one.status().ToString();
  EXPECT_EQ(cache_.hits(), 0u);
  EXPECT_EQ(cache_.size(), 1u);
  // Renamed away behind the store's back: only a kept descriptor can still open it.
  std::string path = store_->BodyPath("http://o/a");
  ASSERT_EQ(::rename(path.c_str(), (path + ".moved").c_str()), 0);
  Result<BodyFile> two = cache_.Open(*store_, "http://o/a");
  ASSERT_TRUE(two.ok()) << two.status().ToString();
  EXPECT_EQ(cache_.hits(), 1u);
  EXPECT_NE(two->fd(), one->fd());  // each open has its own descriptor (closed at release)
  EXPECT_EQ(two->version(), one->version());
  EXPECT_EQ(ReadAll(*two), "first body");
}

TEST_F(BodyFdCacheTest, AReplacedBodyIsOpenedAfreshNotFromTheOldDescriptor) {
  Fill("http://o/a", "version one");
  Result<BodyFile> old = cache_.Open(*store_, "http://o/a");
  ASSERT_TRUE(old.ok());
  Fill("http://o/a", "version TWO");  // same size: only the change listener can tell
  EXPECT_EQ(cache_.size(), 0u);
  Result<BodyFile> now = cache_.Open(*store_, "http://o/a");
  ASSERT_TRUE(now.ok());
  EXPECT_EQ(cache_.hits(), 0u);
  EXPECT_NE(now->version(), old->version());
  EXPECT_EQ(ReadAll(*now), "version TWO");
  EXPECT_EQ(ReadAll(*old), "version one");  // an open file keeps reading its version
}

TEST_F(BodyFdCacheTest, AnErasedBodyIsNotKeptOpenAndIsNotServed) {
  Fill("http://o/a", "gone soon");
  ASSERT_TRUE(cache_.Open(*store_, "http://o/a").ok());
  ASSERT_TRUE(store_->Erase("http://o/a").ok());
  EXPECT_EQ(cache_.size(), 0u);  // the descriptor no longer holds the file's disk space
  EXPECT_FALSE(cache_.Open(*store_, "http://o/a").ok());
}

TEST_F(BodyFdCacheTest, KeepsAtMostItsCapacityDroppingTheLeastRecentlyOpened) {
  for (int i = 0; i < 6; ++i) Fill("http://o/" + std::to_string(i), "body " + std::to_string(i));
  for (int i = 0; i < 6; ++i) ASSERT_TRUE(cache_.Open(*store_, "http://o/" + std::to_string(i)).ok());
  EXPECT_EQ(cache_.size(), 4u);
  ASSERT_TRUE(cache_.Open(*store_, "http://o/5").ok());  // kept
  EXPECT_EQ(cache_.hits(), 1u);
  ASSERT_TRUE(cache_.Open(*store_, "http://o/0").ok());  // dropped first: opened again
  EXPECT_EQ(cache_.hits(), 1u);
}

TEST_F(BodyFdCacheTest, CapacityStaysWellUnderTheOpenFilesLimit) {
  EXPECT_LE(BodyFdCache::CapacityFor(1u << 30), static_cast<std::size_t>(sysconf(_SC_OPEN_MAX)) / 4 + 1);
  EXPECT_EQ(BodyFdCache::CapacityFor(3), 3u);
}

}  // namespace
}  // namespace ghost
