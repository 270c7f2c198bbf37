// The stored-head format GhostfsBackend keeps in the daemon's index (proxy/ghostfs_backend.h),
// and a fill's file against a fake daemon (tests/proxy/fake_daemon.h, answering "store" with a
// path) and a FileIo that holds writes back as UringFileIo's submitter thread may. The
// backend's traffic with a real daemon is tested end to end by the proxy's integration tests
// (tests/integration/ghostproxy_test.py, ghostproxy_random_test.py, ghostproxy_abort_fill_test.py).
#include "proxy/ghostfs_backend.h"

#include <event2/event.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/base/clock.h"
#include "common/control/control.h"
#include "common/control/protocol.h"
#include "proxy/cache_backend.h"
#include "tests/proxy/fake_daemon.h"

namespace ghost {
namespace {

TEST(StoredResponseTest, RoundTripsEveryField) {
  StoredResponse r;
  r.status = 203;
  r.headers = {{"Content-Type", "text/html; charset=utf-8"}, {"Vary", "Accept-Encoding"},
               {"X-Odd", "quote \" backslash \\ tab\t, unicode \xc3\xa9"}, {"Set-Cookie", "a=1"},
               {"Set-Cookie", "b=2"}};
  r.stored_unix = 1795380000;
  r.expires_unix = 1795383600;
  Result<StoredResponse> back = ParseStoredResponse(SerializeStoredResponse(r));
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->status, 203);
  EXPECT_EQ(back->headers, r.headers);  // order and repeats kept
  EXPECT_EQ(back->stored_unix, r.stored_unix);
  EXPECT_EQ(back->expires_unix, r.expires_unix);

  r.expires_unix.reset();
  back = ParseStoredResponse(SerializeStoredResponse(r));
  ASSERT_TRUE(back.ok());
  EXPECT_FALSE(back->expires_unix.has_value());
}

// The head every miss stores is written without a json tree; it must be exactly what the json
// library writes (the daemon keeps the text, and older heads were written that way), for any
// header bytes: every control character, quotes, backslashes, DEL, and non-ASCII (which takes
// the library's path).
TEST(StoredResponseTest, IsWhatTheJsonLibraryWrites) {
  auto reference = [](const StoredResponse& r) {
    nlohmann::json headers = nlohmann::json::array();
    for (const auto& [name, value] : r.headers) headers.push_back({name, value});
    return nlohmann::json{{"status", r.status},
                          {"headers", headers},
                          {"stored_unix", r.stored_unix},
                          {"expires_unix", r.expires_unix ? nlohmann::json(*r.expires_unix) : nlohmann::json()}}
        .dump();
  };
  std::string every_ascii;
  for (int c = 0; c < 0x80; ++c) every_ascii += static_cast<char>(c);
  std::vector<StoredResponse> heads(5);
  heads[0].headers = {{"ETag", "\"abc\""}, {"Content-Type", "text/plain"}, {"X-Path", "C:\\dir\\f"}};
  heads[0].stored_unix = 1795380000;
  heads[0].expires_unix = 1795383600;
  heads[1].status = 404;
  heads[1].headers = {{"X-All", every_ascii}, {every_ascii, ""}};
  heads[1].stored_unix = -5;
  heads[1].expires_unix = -1;
  heads[2].status = 999;  // no headers, no expiry
  heads[3].headers = {{"X-Latin", "caf\xc3\xa9"}, {"ETag", "\"x\""}};
  heads[3].expires_unix = 0;
  heads[4].headers = {{"Last-Modified", "Thu, 26 Nov 2026 12:00:00 GMT"}, {"Vary", ""}};
  for (const StoredResponse& r : heads) {
    EXPECT_EQ(SerializeStoredResponse(r), reference(r));
    Result<StoredResponse> back = ParseStoredResponse(SerializeStoredResponse(r));
    ASSERT_TRUE(back.ok()) << back.status().ToString();
    EXPECT_EQ(back->headers, r.headers);
  }
}

TEST(StoredResponseTest, RefusesWhatIsNotAStoredHead) {
  for (const char* bad : {"", "not json", "[]", "{}", R"({"status":"200","headers":[]})",
                          R"({"status":42,"headers":[]})", R"({"status":200})",
                          R"({"status":200,"headers":{"a":"b"}})", R"({"status":200,"headers":[["a"]]})",
                          R"({"status":200,"headers":[["a",1]]})", "{\"status\":200,\"headers\":[[\"a\",\"b\"]"}) {
    Result<StoredResponse> r = ParseStoredResponse(bad);
    EXPECT_FALSE(r.ok()) << bad;
    if (!r.ok()) {
      EXPECT_NE(r.status().message().find("stored head"), std::string::npos) << r.status().ToString();
    }
  }
}

TEST(MakeGhostfsBackendTest, ExplainsAMountThatIsNotGhostfs) {
  event_base* base = event_base_new();
  Result<std::unique_ptr<CacheBackend>> b = MakeGhostfsBackend(base, "/tmp", "/nonexistent/control.sock");
  ASSERT_FALSE(b.ok());
  EXPECT_NE(b.status().message().find("not a ghostfs mount"), std::string::npos) << b.status().ToString();
  event_base_free(base);
}

// Holds every request until Release(), which then does the system call on the fd *number* the
// request named, as the kernel does when UringFileIo's submitter thread enters it (which may
// be well after Write returned), and delivers the results on the loop.
class HeldFileIo final : public FileIo {
 public:
  explicit HeldFileIo(event_base* base) : base_(base) {}
  void Read(int, std::uint64_t, std::span<char>, Done done) override {
    RunSoon(base_, [done = std::move(done)] { done(std::size_t{0}); });
  }
  void Write(int fd, std::uint64_t offset, std::string data, Done done) override {
    held_.push_back({fd, offset, std::move(data), std::move(done)});
  }
  void Fsync(int, std::function<void(Status)> done) override {
    RunSoon(base_, [done = std::move(done)] { done(Status::Ok()); });
  }
  std::size_t held() const { return held_.size(); }
  int held_fd(std::size_t i) const { return held_[i].fd; }
  void Release() {
    for (Held& h : held_) {
      const ssize_t n = ::pwrite(h.fd, h.data.data(), h.data.size(), static_cast<off_t>(h.offset));
      Result<std::size_t> r = n >= 0 ? Result<std::size_t>(static_cast<std::size_t>(n))
                                     : Result<std::size_t>(Status::FromErrno(errno, "pwrite"));
      RunSoon(base_, [done = std::move(h.done), r] { done(r); });
    }
    held_.clear();
  }

 private:
  struct Held {
    int fd;
    std::uint64_t offset;
    std::string data;
    Done done;
  };
  event_base* base_;
  std::vector<Held> held_;
};

class GhostfsFillTest : public FakeDaemonTest {
 protected:
  void Answer(const ControlRequest& request, ControlServer::Reply reply) override {
    if (request.op != ControlOp::kStore) return reply(nlohmann::json::object());
    // The daemon creates the fill file and names it (fs/store_tree.cc).
    fill_path_ = mnt_ + "/.ghost/fill-" + std::to_string(++fills_);
    const int fd = ::open(fill_path_.c_str(), O_CREAT | O_WRONLY | O_CLOEXEC, 0600);
    if (fd >= 0) ::close(fd);
    reply({{"path", fill_path_}});
  }
  GhostfsBackendOptions BackendOptions() override {
    GhostfsBackendOptions options;
    options.file_io = [this](event_base* base) {
      auto io = std::make_unique<HeldFileIo>(base);
      io_ = io.get();
      return io;
    };
    return options;
  }

  std::string fill_path_;
  int fills_ = 0;
  HeldFileIo* io_ = nullptr;
};

// ghostproxy_random, seed 794409: a GET of small.txt on a new connection got over-inline.bin's
// first bytes before any head. A fill aborted (its client went away) closed its file while its
// first write waited for the submitter thread; the number went to the next accepted socket,
// and the write, entering the kernel then, went there.
TEST_F(GhostfsFillTest, AnAbortedFillKeepsItsFileUntilItsQueuedWritesAreDone) {
  ASSERT_NE(io_, nullptr);
  StoredResponse head;
  head.size = 20000;  // over the inline limit: the body goes through a fill file
  std::unique_ptr<CacheWriter> writer = backend_->Store("http://origin/over-inline.bin", head);
  ASSERT_NE(writer, nullptr);
  writer->Write(std::string(20000, 'F'));
  ASSERT_TRUE(RunUntil([&] { return io_->held() == 1; })) << "the fill's write was never queued";
  const int fd = io_->held_fd(0);
  struct stat fill {};
  ASSERT_EQ(::fstat(fd, &fill), 0);

  writer->Abort();  // the client went away: the fill is abandoned
  EXPECT_NE(::access(fill_path_.c_str(), F_OK), 0) << "the abandoned fill was not unlinked";
  struct stat now {};
  const bool open_still = ::fstat(fd, &now) == 0 && now.st_ino == fill.st_ino && now.st_dev == fill.st_dev;
  EXPECT_TRUE(open_still) << "fd " << fd << " was closed while a write naming it was still queued";
  // A socket accepted now (here: a file opened now) takes the lowest free number.
  const std::string victim_path = dir_ + "/victim";
  const int victim = ::open(victim_path.c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0600);
  ASSERT_GE(victim, 0);
  io_->Release();  // the queued write enters the kernel now
  event_base_loop(base_, EVLOOP_NONBLOCK);
  struct stat v {};
  ASSERT_EQ(::fstat(victim, &v), 0);
  EXPECT_EQ(v.st_size, 0) << "the aborted fill's bytes went to fd " << victim
                          << ", opened after the abort";
  ::close(victim);
  // Once its write is done, the abandoned fill's file is closed (nothing leaks).
  ASSERT_TRUE(RunUntil([&] {
    struct stat st {};
    return ::fstat(fd, &st) != 0 || st.st_ino != fill.st_ino || st.st_dev != fill.st_dev;
  })) << "fd " << fd << " of the abandoned fill stays open after its write completed";
}

}  // namespace
}  // namespace ghost
