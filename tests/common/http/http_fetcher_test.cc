#include "common/http/http_fetcher.h"

#include <arpa/inet.h>
#include <event2/event.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/http/autoindex.h"
#include "common/http/http_freshness.h"
#include "tests/common/nginx_fixture.h"

namespace ghost {
namespace {

namespace fs = std::filesystem;

constexpr Bytes kBigSize = 8 * 1024 * 1024 + 123;  // several MiB, not a round number

// ---- Helpers ----

// Runs `base` until `done()` holds or `limit` passes. Returns false on timeout.
bool RunLoopUntil(event_base* base, const std::function<bool()>& done,
                  Duration limit = Seconds(20)) {
  bool timed_out = false;
  event* guard = evtimer_new(
      base, [](evutil_socket_t, short, void* flag) { *static_cast<bool*>(flag) = true; },
      &timed_out);
  const timeval tv{static_cast<time_t>(limit.count() / 1'000'000),
                   static_cast<suseconds_t>(limit.count() % 1'000'000)};
  evtimer_add(guard, &tv);
  while (!done() && !timed_out) event_base_loop(base, EVLOOP_ONCE);
  event_free(guard);
  return !timed_out;
}

HttpRequest Req(std::string url) {
  HttpRequest r;
  r.url = std::move(url);
  return r;
}

HttpRequest Head(std::string url) {
  HttpRequest r = Req(std::move(url));
  r.head = true;
  return r;
}

// Everything the callbacks of one fetch saw, in order.
struct Outcome {
  std::vector<std::string> calls;  // "head", "data", "done" in call order
  HttpResponseHead head;
  std::string body;
  int chunks = 0;
  bool done = false;
  Status status = Status::Internal("on_done not called");

  int Count(const std::string& what) const {
    int n = 0;
    for (const std::string& c : calls) n += c == what;
    return n;
  }
};

// Callbacks that record into `out` (which must outlive the fetch).
HttpFetcher::Callbacks Recorder(Outcome* out) {
  HttpFetcher::Callbacks cb;
  cb.on_head = [out](const HttpResponseHead& h) {
    out->calls.push_back("head");
    out->head = h;
    return true;
  };
  cb.on_data = [out](std::string_view d) {
    out->calls.push_back("data");
    out->body.append(d);
    ++out->chunks;
    return true;
  };
  cb.on_done = [out](Status s) {
    out->calls.push_back("done");
    out->done = true;
    out->status = s;
  };
  return cb;
}

std::string BigContent() {
  std::string s(kBigSize, '\0');
  std::mt19937_64 rng(42);
  for (char& c : s) c = static_cast<char>(rng() & 0xff);
  return s;
}

void WriteFile(const fs::path& p, const std::string& content) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out << content;
}

std::string ReadFile(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// A loopback port where nothing listens.
int ClosedPort() {
  const int s = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(s, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  socklen_t len = sizeof addr;
  ::getsockname(s, reinterpret_cast<sockaddr*>(&addr), &len);
  ::close(s);
  return ntohs(addr.sin_port);
}

// A scripted origin on the test's own event loop: for each connection it reads the request
// head, sends `reply`, then closes the connection (or keeps it open and silent).
class ScriptedServer {
 public:
  enum class After { kClose, kHold };

  ScriptedServer(event_base* base, std::string reply, After after)
      : base_(base), reply_(std::move(reply)), after_(after) {
    listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ::bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
    ::listen(listen_fd_, 16);
    socklen_t len = sizeof addr;
    ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.sin_port);
    accept_ev_ = event_new(base_, listen_fd_, EV_READ | EV_PERSIST, &OnAccept, this);
    event_add(accept_ev_, nullptr);
  }
  ~ScriptedServer() {
    for (auto& c : conns_) {
      if (c->ev) event_free(c->ev);
      if (c->fd >= 0) ::close(c->fd);
    }
    event_free(accept_ev_);
    ::close(listen_fd_);
  }
  ScriptedServer(const ScriptedServer&) = delete;
  ScriptedServer& operator=(const ScriptedServer&) = delete;

  std::string url(const std::string& path = "/file") const {
    return "http://127.0.0.1:" + std::to_string(port_) + path;
  }
  int connections() const { return static_cast<int>(conns_.size()); }

 private:
  struct Conn {
    ScriptedServer* server = nullptr;
    int fd = -1;
    event* ev = nullptr;
    std::string request;
    bool replied = false;
  };

  static void OnAccept(evutil_socket_t fd, short, void* arg) {
    auto* self = static_cast<ScriptedServer*>(arg);
    const int c = ::accept4(fd, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (c < 0) return;
    auto conn = std::make_unique<Conn>();
    conn->server = self;
    conn->fd = c;
    conn->ev = event_new(self->base_, c, EV_READ | EV_PERSIST, &OnReadable, conn.get());
    event_add(conn->ev, nullptr);
    self->conns_.push_back(std::move(conn));
  }

  static void OnReadable(evutil_socket_t fd, short, void* arg) {
    auto* conn = static_cast<Conn*>(arg);
    char buf[4096];
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) {  // the client went away
      CloseConn(conn);
      return;
    }
    if (conn->replied) return;  // a held connection: ignore whatever comes
    conn->request.append(buf, static_cast<std::size_t>(n));
    if (conn->request.find("\r\n\r\n") == std::string::npos) return;
    conn->replied = true;
    ::send(fd, conn->server->reply_.data(), conn->server->reply_.size(), MSG_NOSIGNAL);
    if (conn->server->after_ == After::kClose) {
      ::shutdown(fd, SHUT_WR);  // FIN after the reply, not a reset
      CloseConn(conn);
    }
  }

  static void CloseConn(Conn* conn) {
    event_free(conn->ev);
    conn->ev = nullptr;
    ::close(conn->fd);
    conn->fd = -1;
  }

  event_base* base_;
  std::string reply_;
  After after_;
  int listen_fd_ = -1;
  int port_ = 0;
  event* accept_ev_ = nullptr;
  std::vector<std::unique_ptr<Conn>> conns_;
};

// ---- HttpResponseHead parsing (no network) ----

TEST(HttpResponseHeadTest, BuildsTheFinalHeadFromHeaderLines) {
  HttpResponseHead h;
  EXPECT_TRUE(h.AddHeaderLine("HTTP/1.1 100 Continue\r\n"));
  h.AddHeaderLine("X-Early: yes\r\n");
  EXPECT_TRUE(h.AddHeaderLine("HTTP/1.1 206 Partial Content\r\n"));
  h.AddHeaderLine("Content-Length: 100\r\n");
  h.AddHeaderLine("content-range: bytes 100-199/1000\r\n");
  h.AddHeaderLine("ETag: \"abc\"\r\n");
  h.AddHeaderLine("Cache-Control: max-age=60\r\n");
  h.AddHeaderLine("Cache-Control: public\r\n");
  h.AddHeaderLine("X-Folded: one\r\n");
  h.AddHeaderLine("   two\r\n");
  h.AddHeaderLine("not a header\r\n");
  h.AddHeaderLine("\r\n");
  h.Finish();
  EXPECT_EQ(h.status, 206);
  EXPECT_EQ(h.Find("X-Early"), nullptr);
  ASSERT_TRUE(h.content_length.has_value());
  EXPECT_EQ(*h.content_length, 100u);
  ASSERT_TRUE(h.content_range.has_value());
  EXPECT_EQ(h.content_range->first, 100u);
  EXPECT_EQ(h.content_range->second, 199u);
  EXPECT_EQ(h.total_size_from_content_range, 1000u);
  EXPECT_EQ(h.etag, "\"abc\"");
  EXPECT_EQ(h.cache_control, "max-age=60, public");
  ASSERT_NE(h.Find("x-folded"), nullptr);
  EXPECT_EQ(*h.Find("X-FOLDED"), "one two");
}

TEST(HttpResponseHeadTest, ParsesStatusLinesAndContentRanges) {
  EXPECT_EQ(ParseStatusLine("HTTP/2 404\r\n"), 404);
  EXPECT_EQ(ParseStatusLine("HTTP/1.0 200 OK"), 200);
  EXPECT_FALSE(ParseStatusLine("HTTP/1.1 20x OK").has_value());
  EXPECT_FALSE(ParseStatusLine("HTTP/1.1 2000 OK").has_value());
  EXPECT_FALSE(ParseStatusLine("ICY 200 OK").has_value());

  std::optional<std::pair<Bytes, Bytes>> range;
  Bytes total = 7;
  EXPECT_TRUE(ParseContentRange("bytes */1234", &range, &total));
  EXPECT_FALSE(range.has_value());
  EXPECT_EQ(total, 1234u);
  EXPECT_TRUE(ParseContentRange("bytes 0-0/*", &range, &total));
  EXPECT_EQ(total, 0u);
  EXPECT_FALSE(ParseContentRange("bytes 5-4/10", &range, &total));
  EXPECT_FALSE(ParseContentRange("bytes 0-10/10", &range, &total));
  EXPECT_FALSE(ParseContentRange("items 0-1/10", &range, &total));
  EXPECT_FALSE(ParseContentRange("bytes 0-99999999999999999999999/*", &range, &total));
}

// ---- Against a real nginx ----

class HttpFetcherTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    tree_ = new fs::path(fs::temp_directory_path() /
                         ("ghost-http-fetcher-tree-" + std::to_string(::getpid())));
    fs::create_directories(*tree_ / "sub");
    WriteFile(*tree_ / "small.txt", "Hello, Ghost!\n");
    WriteFile(*tree_ / "empty.txt", "");
    WriteFile(*tree_ / "big.bin", BigContent());
    WriteFile(*tree_ / "sub" / "nested.txt", "nested\n");
    WriteFile(*tree_ / "with space & co.txt", "spaces\n");
    WriteFile(*tree_ / "100%.txt", "percent\n");
    WriteFile(*tree_ / "\xc3\xbcnicode.txt", "utf8\n");  // "ünicode.txt"
  }
  static void TearDownTestSuite() {
    std::error_code ec;
    fs::remove_all(*tree_, ec);
    delete tree_;
    tree_ = nullptr;
  }

  void SetUp() override {
    if (std::string why = NginxServer::Unavailable(); !why.empty()) {
      GTEST_SKIP() << "needs nginx: " << why;
    }
    base_ = event_base_new();
    ASSERT_NE(base_, nullptr);
    Result<int> port = nginx_.Start(tree_->string(), ExtraConfig());
    ASSERT_TRUE(port.ok()) << port.status().ToString();
    fetcher_ = std::make_unique<HttpFetcher>(base_, options_);
  }

  void TearDown() override {
    fetcher_.reset();
    nginx_.Stop();
    if (base_) event_base_free(base_);
  }

  static std::string ExtraConfig() {
    return "    location = /old { return 301 /small.txt; }\n"
           "    location = /loop { return 302 /loop; }\n";
  }

  std::string Url(const std::string& path) const { return nginx_.base_url() + path; }

  // Fetches and runs the loop until on_done.
  Outcome FetchAndWait(HttpRequest request) {
    Outcome out;
    fetcher_->Fetch(std::move(request), Recorder(&out));
    EXPECT_TRUE(RunLoopUntil(base_, [&] { return out.done; })) << "fetch did not finish";
    return out;
  }
  Outcome Get(const std::string& path) {
    HttpRequest r;
    r.url = Url(path);
    return FetchAndWait(r);
  }

  static fs::path* tree_;
  HttpFetcherOptions options_;
  event_base* base_ = nullptr;
  NginxServer nginx_;
  std::unique_ptr<HttpFetcher> fetcher_;
};

fs::path* HttpFetcherTest::tree_ = nullptr;

TEST_F(HttpFetcherTest, GetsSmallFileByteIdentical) {
  Outcome out = Get("/small.txt");
  ASSERT_TRUE(out.status.ok()) << out.status.ToString();
  EXPECT_EQ(out.head.status, 200);
  EXPECT_EQ(out.body, "Hello, Ghost!\n");
  ASSERT_TRUE(out.head.content_length.has_value());
  EXPECT_EQ(*out.head.content_length, 14u);
  EXPECT_FALSE(out.head.etag.empty());
  EXPECT_EQ(out.head.content_type, "text/plain");
  EXPECT_TRUE(ParseHttpDate(out.head.last_modified).has_value());
  EXPECT_TRUE(ParseHttpDate(out.head.date).has_value());
  EXPECT_EQ(out.calls.front(), "head");
  EXPECT_EQ(out.calls.back(), "done");
  EXPECT_EQ(out.Count("head"), 1);
  EXPECT_EQ(out.Count("done"), 1);
}

TEST_F(HttpFetcherTest, StreamsLargeFileInManyChunksBeforeDone) {
  Outcome out;
  Bytes bytes_at_first_chunk = 0;
  HttpFetcher::Callbacks cb = Recorder(&out);
  auto record = cb.on_data;
  cb.on_data = [&](std::string_view d) {
    if (out.chunks == 0) bytes_at_first_chunk = d.size();
    return record(d);
  };
  fetcher_->Fetch(Req(Url("/big.bin")), cb);
  ASSERT_TRUE(RunLoopUntil(base_, [&] { return out.done; }));
  ASSERT_TRUE(out.status.ok()) << out.status.ToString();
  EXPECT_EQ(out.head.status, 200);
  EXPECT_EQ(out.body.size(), kBigSize);
  EXPECT_TRUE(out.body == ReadFile(*tree_ / "big.bin")) << "body differs from the file";
  // The body streamed: many chunks, the first one a small part of the whole, all of them
  // between on_head and on_done.
  EXPECT_GE(out.chunks, 8);
  EXPECT_LT(bytes_at_first_chunk, kBigSize / 4);
  EXPECT_EQ(out.calls.front(), "head");
  EXPECT_EQ(out.calls.back(), "done");
  EXPECT_EQ(out.Count("data"), out.chunks);
}

TEST_F(HttpFetcherTest, EmptyFileGivesHeadAndDoneWithoutData) {
  Outcome out = Get("/empty.txt");
  ASSERT_TRUE(out.status.ok()) << out.status.ToString();
  EXPECT_EQ(out.head.status, 200);
  EXPECT_EQ(out.head.content_length, std::optional<Bytes>(0));
  EXPECT_EQ(out.calls, (std::vector<std::string>{"head", "done"}));
}

TEST_F(HttpFetcherTest, RangeRequestGets206WithTheRightBytes) {
  HttpRequest r = Req(Url("/big.bin"));
  r.range = std::make_pair(Bytes{1'000'000}, Bytes{1'065'535});
  Outcome out = FetchAndWait(r);
  ASSERT_TRUE(out.status.ok()) << out.status.ToString();
  EXPECT_EQ(out.head.status, 206);
  EXPECT_EQ(out.body, BigContent().substr(1'000'000, 65'536));
  ASSERT_TRUE(out.head.content_range.has_value());
  EXPECT_EQ(out.head.content_range->first, 1'000'000u);
  EXPECT_EQ(out.head.content_range->second, 1'065'535u);
  EXPECT_EQ(out.head.total_size_from_content_range, kBigSize);
  EXPECT_TRUE(nginx_.WaitForAccessLog("\"GET /big.bin HTTP/1.1\" 206 "));
}

TEST_F(HttpFetcherTest, IfNoneMatchWithTheEtagGets304) {
  Outcome first = Get("/small.txt");
  ASSERT_TRUE(first.status.ok());
  ASSERT_FALSE(first.head.etag.empty());

  HttpRequest r = Req(Url("/small.txt"));
  r.if_none_match = first.head.etag;
  Outcome again = FetchAndWait(r);
  ASSERT_TRUE(again.status.ok()) << again.status.ToString();
  EXPECT_EQ(again.head.status, 304);
  EXPECT_EQ(again.head.etag, first.head.etag);
  EXPECT_TRUE(again.body.empty());
  EXPECT_EQ(again.calls, (std::vector<std::string>{"head", "done"}));
  EXPECT_TRUE(nginx_.WaitForAccessLog("\"GET /small.txt HTTP/1.1\" 304 "))
      << nginx_.ReadAccessLog();

  // A changed entity tag gets the whole body again.
  r.if_none_match = "\"not-the-etag\"";
  Outcome changed = FetchAndWait(r);
  EXPECT_EQ(changed.head.status, 200);
  EXPECT_EQ(changed.body, "Hello, Ghost!\n");
}

TEST_F(HttpFetcherTest, IfModifiedSinceWithLastModifiedGets304) {
  Outcome first = Get("/small.txt");
  ASSERT_TRUE(first.status.ok());
  HttpRequest r = Req(Url("/small.txt"));
  r.if_modified_since = first.head.last_modified;
  Outcome again = FetchAndWait(r);
  EXPECT_EQ(again.head.status, 304);
  EXPECT_TRUE(again.body.empty());
}

TEST_F(HttpFetcherTest, HeadGetsSizeWithoutBody) {
  HttpRequest r = Head(Url("/big.bin"));
  Outcome out = FetchAndWait(r);
  ASSERT_TRUE(out.status.ok()) << out.status.ToString();
  EXPECT_EQ(out.head.status, 200);
  EXPECT_EQ(out.head.content_length, std::optional<Bytes>(kBigSize));
  EXPECT_EQ(out.calls, (std::vector<std::string>{"head", "done"}));
  EXPECT_TRUE(nginx_.WaitForAccessLog("\"HEAD /big.bin HTTP/1.1\" 200 "));
}

TEST_F(HttpFetcherTest, MissingFileIsA404AnswerNotAFailure) {
  Outcome out = Get("/no-such-file");
  EXPECT_TRUE(out.status.ok()) << out.status.ToString();
  EXPECT_EQ(out.head.status, 404);
  EXPECT_EQ(out.Count("done"), 1);
}

TEST_F(HttpFetcherTest, FollowsRedirects) {
  Outcome out = Get("/old");
  ASSERT_TRUE(out.status.ok()) << out.status.ToString();
  EXPECT_EQ(out.head.status, 200);  // on_head saw only the final answer
  EXPECT_EQ(out.Count("head"), 1);
  EXPECT_EQ(out.body, "Hello, Ghost!\n");
  EXPECT_EQ(out.head.effective_url, Url("/small.txt"));
}

TEST_F(HttpFetcherTest, RedirectLoopFailsAfterTheLimit) {
  Outcome out = Get("/loop");
  EXPECT_EQ(out.status.code(), Status::Code::kIoError) << out.status.ToString();
  EXPECT_EQ(out.Count("head"), 0);
  EXPECT_EQ(out.Count("done"), 1);
}

TEST_F(HttpFetcherTest, ReusesTheKeptAliveConnection) {
  for (int i = 0; i < 3; ++i) {
    Outcome out = Get("/small.txt");
    ASSERT_TRUE(out.status.ok()) << out.status.ToString();
  }
  EXPECT_EQ(fetcher_->connections_opened(), 1u);
}

TEST_F(HttpFetcherTest, RunsManyFetchesAtOnce) {
  const std::string big = BigContent();
  std::vector<Outcome> outs(12);
  for (std::size_t i = 0; i < outs.size(); ++i) {
    HttpRequest r = Req(Url("/big.bin"));
    r.range = std::make_pair(Bytes{i * 100'000}, Bytes{i * 100'000 + 99'999});
    fetcher_->Fetch(r, Recorder(&outs[i]));
  }
  EXPECT_EQ(fetcher_->active(), outs.size());
  ASSERT_TRUE(RunLoopUntil(base_, [&] {
    for (const Outcome& o : outs) {
      if (!o.done) return false;
    }
    return true;
  }));
  for (std::size_t i = 0; i < outs.size(); ++i) {
    ASSERT_TRUE(outs[i].status.ok()) << outs[i].status.ToString();
    EXPECT_EQ(outs[i].head.status, 206);
    EXPECT_TRUE(outs[i].body == big.substr(i * 100'000, 100'000)) << "range " << i;
  }
  EXPECT_EQ(fetcher_->active(), 0u);
  EXPECT_LE(fetcher_->connections_opened(),
            static_cast<std::uint64_t>(options_.max_connections_per_host));
}

TEST_F(HttpFetcherTest, IdleFetcherLeavesNoEventsPending) {
  EXPECT_EQ(event_base_get_num_events(base_, EVENT_BASE_COUNT_ADDED), 0);
  Outcome a = Get("/small.txt");
  Outcome b = Get("/big.bin");
  HttpRequest h = Head(Url("/small.txt"));
  Outcome c = FetchAndWait(h);
  ASSERT_TRUE(a.status.ok() && b.status.ok() && c.status.ok());
  // No socket watched and no timer armed while kept-alive connections wait for reuse.
  EXPECT_EQ(event_base_get_num_events(base_, EVENT_BASE_COUNT_ADDED), 0);
  EXPECT_EQ(event_base_get_num_events(base_, EVENT_BASE_COUNT_ACTIVE), 0);
  EXPECT_EQ(event_base_loop(base_, EVLOOP_NONBLOCK), 1) << "the loop still had events";
  // And the kept-alive connection still works afterwards.
  Outcome d = Get("/small.txt");
  EXPECT_TRUE(d.status.ok());
  EXPECT_EQ(fetcher_->connections_opened(), 1u);
}

TEST_F(HttpFetcherTest, CancelInsideOnDataStopsWithoutFurtherCallbacks) {
  Outcome out;
  FetchId id = 0;
  HttpFetcher::Callbacks cb = Recorder(&out);
  auto record = cb.on_data;
  cb.on_data = [&](std::string_view d) {
    record(d);
    EXPECT_TRUE(fetcher_->Cancel(id));
    EXPECT_FALSE(fetcher_->Cancel(id));  // already cancelled
    return true;
  };
  id = fetcher_->Fetch(Req(Url("/big.bin")), cb);
  // Also a second fetch that must finish normally after the cancel.
  Outcome other;
  fetcher_->Fetch(Req(Url("/small.txt")), Recorder(&other));
  ASSERT_TRUE(RunLoopUntil(base_, [&] { return other.done && fetcher_->active() == 0; }));
  // Let any stray callback show itself.
  event_base_loop(base_, EVLOOP_NONBLOCK);
  EXPECT_EQ(out.calls, (std::vector<std::string>{"head", "data"}));
  EXPECT_FALSE(out.done);
  EXPECT_TRUE(other.status.ok());
  EXPECT_EQ(event_base_get_num_events(base_, EVENT_BASE_COUNT_ADDED), 0);
}

TEST_F(HttpFetcherTest, PauseInsideOnDataHoldsTheBodyUntilResumed) {
  Outcome out;
  FetchId id = 0;
  HttpFetcher::Callbacks cb = Recorder(&out);
  auto record = cb.on_data;
  bool paused = false;
  cb.on_data = [&](std::string_view d) {
    record(d);
    if (!paused) {
      paused = true;
      EXPECT_TRUE(fetcher_->Pause(id, true));
    }
    return true;
  };
  id = fetcher_->Fetch(Req(Url("/big.bin")), cb);
  ASSERT_TRUE(RunLoopUntil(base_, [&] { return paused; }));
  const std::size_t held_at = out.body.size();
  // Paused: no more bytes and no end for a while (the back-pressure a stream window needs).
  EXPECT_FALSE(RunLoopUntil(base_, [&] { return out.done; }, Seconds(0.5)));
  EXPECT_EQ(out.body.size(), held_at);
  EXPECT_LT(held_at, kBigSize);
  EXPECT_TRUE(fetcher_->Pause(id, false));
  EXPECT_EQ(out.body.size(), held_at);  // resuming never calls on_data inside Pause
  ASSERT_TRUE(RunLoopUntil(base_, [&] { return out.done; }));
  ASSERT_TRUE(out.status.ok()) << out.status.ToString();
  EXPECT_TRUE(out.body == ReadFile(*tree_ / "big.bin")) << "body differs from the file";
  EXPECT_FALSE(fetcher_->Pause(id, true));  // finished: nothing to pause
}

TEST_F(HttpFetcherTest, IfRangeWithAnotherVersionsTagGetsTheWholeBody) {
  Outcome first = Get("/big.bin");
  ASSERT_TRUE(first.status.ok());
  HttpRequest r = Req(Url("/big.bin"));
  r.range = std::make_pair(Bytes{1'000}, Bytes{1'999});
  r.if_range = first.head.etag;
  Outcome same = FetchAndWait(r);
  EXPECT_EQ(same.head.status, 206);
  EXPECT_EQ(same.body, BigContent().substr(1'000, 1'000));
  r.if_range = "\"another-version\"";
  Outcome other = FetchAndWait(r);
  EXPECT_EQ(other.head.status, 200);
  EXPECT_EQ(other.body.size(), kBigSize);
}

TEST_F(HttpFetcherTest, CancelInsideOnHeadAndBeforeTheLoopRuns) {
  Outcome in_head;
  FetchId id = 0;
  HttpFetcher::Callbacks cb = Recorder(&in_head);
  auto record = cb.on_head;
  cb.on_head = [&](const HttpResponseHead& h) {
    record(h);
    fetcher_->Cancel(id);
    return true;
  };
  id = fetcher_->Fetch(Req(Url("/small.txt")), cb);

  Outcome never_ran;
  const FetchId early = fetcher_->Fetch(Req(Url("/small.txt")), Recorder(&never_ran));
  EXPECT_TRUE(fetcher_->Cancel(early));

  ASSERT_TRUE(RunLoopUntil(base_, [&] { return fetcher_->active() == 0; }));
  event_base_loop(base_, EVLOOP_NONBLOCK);
  EXPECT_EQ(in_head.calls, (std::vector<std::string>{"head"}));
  EXPECT_TRUE(never_ran.calls.empty());
  EXPECT_FALSE(fetcher_->Cancel(12345));
}

TEST_F(HttpFetcherTest, OnHeadReturningFalseAbortsWithAnError) {
  Outcome out;
  HttpFetcher::Callbacks cb = Recorder(&out);
  cb.on_head = [&](const HttpResponseHead& h) {
    out.calls.push_back("head");
    out.head = h;
    return false;
  };
  fetcher_->Fetch(Req(Url("/big.bin")), cb);
  ASSERT_TRUE(RunLoopUntil(base_, [&] { return out.done; }));
  EXPECT_EQ(out.calls, (std::vector<std::string>{"head", "done"}));
  EXPECT_EQ(out.status.code(), Status::Code::kIoError);
  EXPECT_NE(out.status.message().find("aborted by the receiver"), std::string::npos);
}

TEST_F(HttpFetcherTest, CallbacksNeverRunInsideFetch) {
  Outcome ok_fetch, bad_fetch;
  fetcher_->Fetch(Req(Url("/small.txt")), Recorder(&ok_fetch));
  fetcher_->Fetch(Req("ftp://127.0.0.1/x"), Recorder(&bad_fetch));
  EXPECT_TRUE(ok_fetch.calls.empty());
  EXPECT_TRUE(bad_fetch.calls.empty());
  ASSERT_TRUE(RunLoopUntil(base_, [&] { return ok_fetch.done && bad_fetch.done; }));
  EXPECT_TRUE(ok_fetch.status.ok());
}

TEST_F(HttpFetcherTest, FetchesStartedFromInsideCallbacksRun) {
  // From on_data (inside curl: attached on the next turn) and from on_done (at top level).
  Outcome first, from_data, from_done;
  bool started_from_data = false;
  HttpFetcher::Callbacks cb = Recorder(&first);
  auto record_data = cb.on_data;
  auto record_done = cb.on_done;
  cb.on_data = [&](std::string_view d) {
    if (!started_from_data) {
      started_from_data = true;
      fetcher_->Fetch(Req(Url("/sub/nested.txt")), Recorder(&from_data));
    }
    return record_data(d);
  };
  cb.on_done = [&](Status s) {
    record_done(s);
    fetcher_->Fetch(Req(Url("/small.txt")), Recorder(&from_done));
  };
  fetcher_->Fetch(Req(Url("/big.bin")), cb);
  ASSERT_TRUE(RunLoopUntil(base_, [&] { return from_data.done && from_done.done; }));
  EXPECT_TRUE(first.status.ok());
  EXPECT_EQ(from_data.body, "nested\n");
  EXPECT_EQ(from_done.body, "Hello, Ghost!\n");
}

TEST_F(HttpFetcherTest, RejectsUrlsThatAreNotHttp) {
  for (const std::string url : {"ftp://127.0.0.1/x", "file:///etc/passwd", "not a url",
                                "/relative/path", "http://127.0.0.1/with space", ""}) {
    Outcome out;
    fetcher_->Fetch(Req(url), Recorder(&out));
    ASSERT_TRUE(RunLoopUntil(base_, [&] { return out.done; }));
    EXPECT_EQ(out.status.code(), Status::Code::kInvalidArgument) << url;
    EXPECT_EQ(out.calls, (std::vector<std::string>{"done"})) << url;
  }
  Outcome bad_range;
  HttpRequest r = Req(Url("/big.bin"));
  r.range = std::make_pair(Bytes{10}, Bytes{5});
  fetcher_->Fetch(r, Recorder(&bad_range));
  ASSERT_TRUE(RunLoopUntil(base_, [&] { return bad_range.done; }));
  EXPECT_EQ(bad_range.status.code(), Status::Code::kInvalidArgument);

  Outcome injected;
  HttpRequest inj = Req(Url("/small.txt"));
  inj.if_none_match = "\"x\"\r\nX-Evil: 1";
  fetcher_->Fetch(inj, Recorder(&injected));
  ASSERT_TRUE(RunLoopUntil(base_, [&] { return injected.done; }));
  EXPECT_EQ(injected.status.code(), Status::Code::kInvalidArgument);
}

TEST_F(HttpFetcherTest, NginxListingParsesIntoEntries) {
  Outcome out = Get("/");
  ASSERT_TRUE(out.status.ok()) << out.status.ToString();
  ASSERT_EQ(out.head.status, 200);
  Result<std::vector<DirEntry>> entries = ParseAutoindex(out.body, Url("/"));
  ASSERT_TRUE(entries.ok()) << entries.status().ToString() << "\n" << out.body;
  auto find = [&](const std::string& name) -> const DirEntry* {
    for (const DirEntry& e : *entries) {
      if (e.name == name) return &e;
    }
    return nullptr;
  };
  EXPECT_EQ(entries->size(), 7u) << out.body;
  const DirEntry* big = find("big.bin");
  ASSERT_NE(big, nullptr) << out.body;
  EXPECT_FALSE(big->is_dir);
  EXPECT_EQ(big->size, std::optional<Bytes>(kBigSize));
  ASSERT_TRUE(big->mtime_unix.has_value());
  const auto file_mtime = std::chrono::duration_cast<std::chrono::seconds>(
      std::chrono::file_clock::to_sys(fs::last_write_time(*tree_ / "big.bin")).time_since_epoch());
  EXPECT_LE(std::abs(*big->mtime_unix - file_mtime.count()), 60);  // the listing has minutes
  const DirEntry* sub = find("sub");
  ASSERT_NE(sub, nullptr);
  EXPECT_TRUE(sub->is_dir);
  EXPECT_FALSE(sub->size.has_value());
  for (const std::string name :
       {"small.txt", "empty.txt", "with space & co.txt", "100%.txt", "\xc3\xbcnicode.txt"}) {
    const DirEntry* e = find(name);
    ASSERT_NE(e, nullptr) << name << "\n" << out.body;
    EXPECT_EQ(e->size, std::optional<Bytes>(fs::file_size(*tree_ / name))) << name;
  }
}

// ---- Faulty origins (no nginx needed) ----

class HttpFetcherFaultTest : public ::testing::Test {
 protected:
  void SetUp() override {
    base_ = event_base_new();
    ASSERT_NE(base_, nullptr);
  }
  void TearDown() override {
    fetcher_.reset();
    if (base_) event_base_free(base_);
  }
  HttpFetcher& fetcher() {
    if (!fetcher_) fetcher_ = std::make_unique<HttpFetcher>(base_, options_);
    return *fetcher_;
  }
  Outcome FetchAndWait(const std::string& url) {
    Outcome out;
    fetcher().Fetch(Req(url), Recorder(&out));
    EXPECT_TRUE(RunLoopUntil(base_, [&] { return out.done; })) << "fetch did not finish";
    return out;
  }

  HttpFetcherOptions options_;
  event_base* base_ = nullptr;
  std::unique_ptr<HttpFetcher> fetcher_;
};

TEST_F(HttpFetcherFaultTest, ConnectionRefusedIsUnavailableWithinTwoSeconds) {
  const auto start = std::chrono::steady_clock::now();
  Outcome out = FetchAndWait("http://127.0.0.1:" + std::to_string(ClosedPort()) + "/anything");
  const auto took = std::chrono::steady_clock::now() - start;
  EXPECT_EQ(out.status.code(), Status::Code::kUnavailable) << out.status.ToString();
  EXPECT_LT(took, std::chrono::seconds(2));
  EXPECT_EQ(out.calls, (std::vector<std::string>{"done"}));
  EXPECT_EQ(event_base_get_num_events(base_, EVENT_BASE_COUNT_ADDED), 0);
}

TEST_F(HttpFetcherFaultTest, GarbageRepliesFailWithoutCrashing) {
  using namespace std::string_literals;
  const std::vector<std::string> replies = {
      "\x00\xff\xfe garbage \x01\x02\r\n\r\n"s,
      "SSH-2.0-OpenSSH_9.2\r\n",
      "HTTP/1.1 abc\r\n\r\n",
      "HTTP/1.1 200 OK\r\nContent-Length: banana\r\n\r\nxyz",
      "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nnot hex\r\n",
  };
  for (const std::string& reply : replies) {
    ScriptedServer server(base_, reply, ScriptedServer::After::kClose);
    Outcome out = FetchAndWait(server.url());
    EXPECT_TRUE(out.status.code() == Status::Code::kCorruption ||
                out.status.code() == Status::Code::kIoError)
        << "reply " << testing::PrintToString(reply) << " gave " << out.status.ToString();
    EXPECT_EQ(out.Count("done"), 1);
  }
}

TEST_F(HttpFetcherFaultTest, ConnectionClosedMidBodyIsCorruption) {
  ScriptedServer server(base_, "HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n0123456789",
                        ScriptedServer::After::kClose);
  Outcome out = FetchAndWait(server.url());
  EXPECT_EQ(out.status.code(), Status::Code::kCorruption) << out.status.ToString();
  EXPECT_NE(out.status.message().find("closed mid-body"), std::string::npos);
  EXPECT_EQ(out.head.status, 200);
  EXPECT_EQ(out.body, "0123456789");
}

TEST_F(HttpFetcherFaultTest, SilentServerTimesOut) {
  options_.total_timeout = Millis(300);
  ScriptedServer server(base_, "", ScriptedServer::After::kHold);
  const auto start = std::chrono::steady_clock::now();
  Outcome out = FetchAndWait(server.url());
  EXPECT_EQ(out.status.code(), Status::Code::kTimedOut) << out.status.ToString();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(3));
}

TEST_F(HttpFetcherFaultTest, StalledBodyTimesOutOnTheLowSpeedLimit) {
  options_.low_speed_limit = 100;
  options_.low_speed_time = Seconds(1);
  ScriptedServer server(base_, "HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\nabc",
                        ScriptedServer::After::kHold);
  Outcome out = FetchAndWait(server.url());
  EXPECT_EQ(out.status.code(), Status::Code::kTimedOut) << out.status.ToString();
  EXPECT_EQ(out.body, "abc");
}

TEST_F(HttpFetcherFaultTest, DestroyingTheFetcherMidTransferCallsNothing) {
  ScriptedServer server(base_, "HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\nabc",
                        ScriptedServer::After::kHold);
  Outcome out;
  fetcher().Fetch(Req(server.url()), Recorder(&out));
  ASSERT_TRUE(RunLoopUntil(base_, [&] { return out.Count("data") > 0; }));
  fetcher_.reset();
  EXPECT_FALSE(out.done);
  // Only the scripted server's own events remain.
  EXPECT_EQ(event_base_get_num_events(base_, EVENT_BASE_COUNT_ADDED), 1 + server.connections());
}

}  // namespace
}  // namespace ghost
