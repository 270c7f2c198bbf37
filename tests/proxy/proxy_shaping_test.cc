// Download shaping in ghostproxy end to end (proxy/shaper.h): the Proxy on 127.0.0.1 with its
// loop on a thread, the in-memory cache, a streaming origin thread whose body can stall or be
// cut by a reset, and a raw-socket client. Whatever the origin does, the client gets exactly
// its bytes (or a cut connection), never altered bytes and never a hang. Sockets time out
// after 10 s so a hang fails instead of blocking. Loopback has no round trip to sleep in: these
// tests check the mechanism and the bytes; the energy is tests/integration/shaping_test.py's.
#include "proxy/shaper.h"

#include <arpa/inet.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <netinet/tcp.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <chrono>
#include <functional>
#include <future>
#include <optional>
#include <random>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include "common/base/clock.h"
#include "proxy/proxy.h"
#include "tests/proxy/memory_backend.h"

namespace ghost {
namespace {

using namespace std::chrono_literals;

void SetTimeouts(int fd) {
  timeval tv{10, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
}

int ListenOn(int* port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
  EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  EXPECT_EQ(::listen(fd, 16), 0);
  socklen_t len = sizeof a;
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  *port = ntohs(a.sin_port);
  return fd;
}

int ConnectTo(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  SetTimeouts(fd);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
  EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  return fd;
}

bool SendAll(int fd, std::string_view data) {
  while (!data.empty()) {
    const ssize_t n = ::send(fd, data.data(), data.size(), MSG_NOSIGNAL);
    if (n <= 0) return false;
    data.remove_prefix(static_cast<std::size_t>(n));
  }
  return true;
}

std::string RandomBytes(std::size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::string s(n, '\0');
  for (char& c : s) c = static_cast<char>(rng());
  return s;
}

// How the origin sends its one response.
struct Script {
  std::string head;                 // the response head (or nothing for a raw tunnel peer)
  std::string body;
  std::size_t stall_at = 0;         // after this many body bytes, wait `stall`
  std::chrono::milliseconds stall{0};
  std::size_t reset_at = 0;         // after this many body bytes, reset the connection
  bool wait_request = true;         // read a request head first (not for a tunnel peer)
};

// One connection, one response, from a thread.
class StreamingOrigin {
 public:
  explicit StreamingOrigin(Script script) : script_(std::move(script)) {
    listen_ = ListenOn(&port_);
    thread_ = std::thread([this] { Serve(); });
  }
  ~StreamingOrigin() {
    ::shutdown(listen_, SHUT_RDWR);
    thread_.join();
    ::close(listen_);
  }
  int port() const { return port_; }
  // The window scale the proxy's SYN offered (chosen from its receive buffer at connect), -1
  // before a connection came.
  int peer_wscale() const { return peer_wscale_; }

 private:
  void Serve() {
    const int fd = ::accept4(listen_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) return;
    SetTimeouts(fd);
    tcp_info info{};
    socklen_t info_len = sizeof info;
    if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &info, &info_len) == 0) peer_wscale_ = info.tcpi_snd_wscale;
    if (script_.wait_request) {
      std::string req;
      char buf[4096];
      while (req.find("\r\n\r\n") == std::string::npos) {
        const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
        if (n <= 0) break;
        req.append(buf, static_cast<std::size_t>(n));
      }
    }
    SendAll(fd, script_.head);
    std::string_view body = script_.body;
    std::size_t sent = 0;
    auto upto = [&](std::size_t mark) {
      if (mark == 0 || mark <= sent) return;
      SendAll(fd, body.substr(sent, mark - sent));
      sent = mark;
    };
    if (script_.reset_at > 0) {
      upto(script_.reset_at);
      linger l{1, 0};  // close with RST
      setsockopt(fd, SOL_SOCKET, SO_LINGER, &l, sizeof l);
      ::close(fd);
      return;
    }
    if (script_.stall_at > 0) {
      upto(script_.stall_at);
      std::this_thread::sleep_for(script_.stall);
    }
    upto(body.size());
    ::shutdown(fd, SHUT_WR);
    char drain[256];
    while (::recv(fd, drain, sizeof drain, 0) > 0) {
    }
    ::close(fd);
  }

  Script script_;
  std::atomic<int> peer_wscale_{-1};
  int listen_ = -1;
  int port_ = 0;
  std::thread thread_;
};

class ProxyShapingTest : public ::testing::Test {
 protected:
  void TearDown() override { StopProxy(); }

  ProxyOptions Options(ShapeMode mode, int knob = 0) {
    ProxyOptions o;
    o.listen = *ListenAddress::Parse("127.0.0.1:0");
    o.via_name = "test-proxy";
    o.shaping.mode = mode;
    o.shaping.knob = knob;
    return o;
  }

  void StartProxy(const ProxyOptions& options) {
    base_ = MakeEventBase();
    clock_ = std::make_unique<RealClock>(base_);
    backend_ = std::make_unique<MemoryBackend>(base_);
    Result<std::unique_ptr<Proxy>> p = Proxy::Start(base_, clock_.get(), backend_.get(), options);
    ASSERT_TRUE(p.ok()) << p.status().ToString();
    proxy_ = std::move(*p);
    port_ = proxy_->address().port;
    loop_ = std::thread([this] { event_base_loop(base_, EVLOOP_NO_EXIT_ON_EMPTY); });
  }

  void StopProxy() {
    if (!base_) return;
    event_base_loopbreak(base_);
    loop_.join();
    proxy_.reset();
    backend_.reset();
    clock_.reset();
    event_base_free(base_);
    base_ = nullptr;
  }

  // The proxy's shaping counters, read on its loop.
  ShapingStats Stats() {
    std::promise<ShapingStats> done;
    std::future<ShapingStats> result = done.get_future();
    struct Task {
      Proxy* proxy;
      std::promise<ShapingStats>* done;
    } task{proxy_.get(), &done};
    const timeval zero{0, 0};
    event_base_once(
        base_, -1, EV_TIMEOUT,
        [](evutil_socket_t, short, void* arg) {
          auto* t = static_cast<Task*>(arg);
          t->done->set_value(t->proxy->stats().shaping);
        },
        &task, &zero);
    return result.get();
  }

  // Sends `request` and reads until EOF or the timeout; `pace` sleeps between 16 KiB reads.
  std::string Exchange(const std::string& request, std::chrono::milliseconds pace = 0ms) {
    const int fd = ConnectTo(port_);
    EXPECT_TRUE(SendAll(fd, request));
    std::string out;
    char buf[16384];
    while (true) {
      const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
      if (n <= 0) break;
      out.append(buf, static_cast<std::size_t>(n));
      if (pace > 0ms) std::this_thread::sleep_for(pace);
    }
    ::close(fd);
    return out;
  }

  // HTTPS through the proxy as a browser does it: CONNECT host:port, then TLS over the tunnel
  // (the origin's certificate is not checked: the benchmark's is self-signed) and `request`
  // inside it. Returns the decrypted response (head and body) up to the origin's close;
  // `*established` says whether the proxy answered 200 to CONNECT.
  std::string TlsExchange(const std::string& authority, const std::string& request,
                          bool* established) {
    *established = false;
    const int fd = ConnectTo(port_);
    EXPECT_TRUE(SendAll(fd, "CONNECT " + authority + " HTTP/1.1\r\nHost: " + authority + "\r\n\r\n"));
    // The proxy's answer, byte by byte up to its blank line: nothing of the TLS stream follows
    // it before the client's hello.
    std::string head;
    char c;
    while (head.find("\r\n\r\n") == std::string::npos && ::recv(fd, &c, 1, 0) == 1) head += c;
    std::string out;
    if (head.rfind("HTTP/1.1 200", 0) == 0) {
      *established = true;
      SSL_CTX* ctx = SSL_CTX_new(TLS_client_method());
      SSL* ssl = SSL_new(ctx);
      SSL_set_fd(ssl, fd);
      const std::string host = authority.substr(0, authority.rfind(':'));
      SSL_set_tlsext_host_name(ssl, host.c_str());
      if (SSL_connect(ssl) == 1 && SSL_write(ssl, request.data(), static_cast<int>(request.size())) ==
                                       static_cast<int>(request.size())) {
        char buf[16384];
        int n;
        while ((n = SSL_read(ssl, buf, sizeof buf)) > 0) out.append(buf, static_cast<std::size_t>(n));
      } else {
        ADD_FAILURE() << "TLS through the tunnel to " << authority << " failed: "
                      << ERR_error_string(ERR_get_error(), nullptr);
      }
      SSL_free(ssl);
      SSL_CTX_free(ctx);
    } else {
      ADD_FAILURE() << "CONNECT " << authority << ": " << head;
    }
    ::close(fd);
    return out;
  }

  std::string Get(int origin_port, std::chrono::milliseconds pace = 0ms) {
    return Exchange("GET http://127.0.0.1:" + std::to_string(origin_port) +
                        "/big HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n",
                    pace);
  }

  static std::string BodyOf(const std::string& response) {
    const std::size_t at = response.find("\r\n\r\n");
    return at == std::string::npos ? "" : response.substr(at + 4);
  }

  event_base* base_ = nullptr;
  std::unique_ptr<RealClock> clock_;
  std::unique_ptr<MemoryBackend> backend_;
  std::unique_ptr<Proxy> proxy_;
  std::thread loop_;
  int port_ = 0;
};

std::string LengthHead(std::size_t n) {
  return "HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nCache-Control: no-store\r\n"
         "Content-Length: " + std::to_string(n) + "\r\nConnection: close\r\n\r\n";
}

TEST_F(ProxyShapingTest, LargeDownloadIsShapedAndByteIdentical) {
  StartProxy(Options(ShapeMode::kAlways));
  const std::string body = RandomBytes(5'000'000, 1);
  StreamingOrigin origin({LengthHead(body.size()), body});
  const std::string got = BodyOf(Get(origin.port()));
  EXPECT_EQ(got.size(), body.size());
  EXPECT_TRUE(got == body) << "the shaped body differs from the origin's";
  const ShapingStats s = Stats();
  EXPECT_EQ(s.shaped_downloads, 1u);
  EXPECT_EQ(s.active, 0u);
  // The shaper starts after the head: all but the first read of the body passes it.
  EXPECT_GT(s.bytes, body.size() - 300'000);
  EXPECT_LE(s.bytes, body.size());
  // Loopback is a saturated link (window ≥ its tiny bandwidth-delay product): how many bursts
  // come before the shaper reverts to plain TCP is not fixed, so only the bytes are checked.
}

// --plain-rcvbuf (the paper's plain-TCP baseline, a measurement aid): with shaping off the
// origin socket's receive buffer is fixed before the SYN, so the window scale it offers is the
// small one of that buffer (autotuned, it is chosen for tcp_rmem's maximum), and the bytes pass
// unshaped and unaltered.
TEST_F(ProxyShapingTest, PlainRcvbufFixesTheOriginWindowBeforeConnectWithShapingOff) {
  const std::string body = RandomBytes(1'000'000, 7);
  int autotuned_wscale = -1;
  {
    StartProxy(Options(ShapeMode::kOff));
    StreamingOrigin origin({LengthHead(body.size()), body});
    EXPECT_TRUE(BodyOf(Get(origin.port())) == body);
    autotuned_wscale = origin.peer_wscale();
    StopProxy();
  }
  ProxyOptions o = Options(ShapeMode::kOff);
  o.shaping.plain_buffer = 16 * 1024;  // the kernel doubles it: a 32 KiB buffer needs no scale
  StartProxy(o);
  StreamingOrigin origin({LengthHead(body.size()), body});
  const std::string got = BodyOf(Get(origin.port()));
  EXPECT_EQ(got.size(), body.size());
  EXPECT_TRUE(got == body) << "the body differs from the origin's";
  EXPECT_EQ(origin.peer_wscale(), 0) << "the buffer was not fixed before the SYN";
  EXPECT_GT(autotuned_wscale, 2) << "an autotuned socket offers a large scale";
  EXPECT_EQ(Stats().shaped_downloads, 0u);
}

// What /ghost/status and /ghost/metrics say of shaping (ghostctl stats --proxy prints the
// former): downloads, bursts, mean burst size, estimated sleep, missed packets, slowdown.
TEST(ShapingStatusTest, StatusAndMetricsShowBurstsSleepMissedPacketsAndSlowdown) {
  ShapingStats s;
  s.shaped_downloads = 2;
  s.per_packet = 2;
  s.bursts = 10;
  s.burst_bytes = 1'234'560;
  s.missed_packets = 3;
  s.saturated = 1;
  s.sleep = Millis(2500);
  s.elapsed = Seconds(6);
  s.bytes = 5'000'000;
  s.slowdown_sum = 2.5;
  s.slowdown_count = 2;
  const nlohmann::json j = nlohmann::json::parse(ShapingStatusJson(ShapingOptions{}, s));
  EXPECT_EQ(j["shaped_downloads"], 2);
  EXPECT_EQ(j["bursts"], 10);
  EXPECT_EQ(j["mean_burst_bytes"], 123'456);
  EXPECT_EQ(j["missed_packets"], 3);
  EXPECT_DOUBLE_EQ(j["sleep_s"].get<double>(), 2.5);
  EXPECT_DOUBLE_EQ(j["mean_slowdown"].get<double>(), 1.25);
  EXPECT_EQ(j["saturated"], 1);
  const std::string m = ShapingMetricsText(s);
  for (const char* line : {"ghostproxy_shaped_downloads_total 2\n", "ghostproxy_shaping_bursts_total 10\n",
                           "ghostproxy_shaping_mean_burst_bytes 123456\n",
                           "ghostproxy_shaping_missed_packets_total 3\n",
                           "ghostproxy_shaping_sleep_seconds_total 2.5", "ghostproxy_shaping_slowdown 1.25"}) {
    EXPECT_NE(m.find(line), std::string::npos) << line << " missing from\n" << m;
  }
  // No burst yet: a mean of 0 and a slowdown of 1, not a division by zero.
  const nlohmann::json none = nlohmann::json::parse(ShapingStatusJson(ShapingOptions{}, ShapingStats{}));
  EXPECT_EQ(none["mean_burst_bytes"], 0);
  EXPECT_DOUBLE_EQ(none["mean_slowdown"].get<double>(), 1.0);
}

TEST_F(ProxyShapingTest, ShapedDownloadShowsInStatusAndMetrics) {
  StartProxy(Options(ShapeMode::kAlways));
  const std::string body = RandomBytes(2'000'000, 10);
  StreamingOrigin origin({LengthHead(body.size()), body});
  ASSERT_TRUE(BodyOf(Get(origin.port())) == body);
  const std::string status =
      BodyOf(Exchange("GET /ghost/status HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"));
  const nlohmann::json j = nlohmann::json::parse(status, nullptr, /*allow_exceptions=*/false);
  ASSERT_TRUE(j.is_object()) << status;
  const nlohmann::json& sh = j["shaping"];
  EXPECT_EQ(sh["shaped_downloads"], 1) << sh;
  EXPECT_EQ(sh["active"], 0) << sh;
  for (const char* key : {"bursts", "mean_burst_bytes", "sleep_s", "missed_packets", "mean_slowdown"}) {
    EXPECT_TRUE(sh.contains(key) && sh[key].is_number()) << key << " missing from " << sh;
  }
  const std::string metrics =
      BodyOf(Exchange("GET /ghost/metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"));
  EXPECT_NE(metrics.find("ghostproxy_shaped_downloads_total 1\n"), std::string::npos) << metrics;
  for (const char* name : {"ghostproxy_shaping_bursts_total ", "ghostproxy_shaping_mean_burst_bytes ",
                           "ghostproxy_shaping_sleep_seconds_total ",
                           "ghostproxy_shaping_missed_packets_total ", "ghostproxy_shaping_slowdown "}) {
    EXPECT_NE(metrics.find(name), std::string::npos) << name << " missing";
  }
}

// A download the eq. 4 decision declines (K = 100) is not held to the shaping buffer: the
// adapter gives the window back (SO_RCVBUF and TCP_WINDOW_CLAMP far above the 128 KiB of
// shaping). On the emulated link a declined 5 MB download took 3.3 s with the small buffer
// kept, 2.4 s like plain TCP with it given back.
TEST(UpstreamShaperTest, DeclinedDownloadGetsItsReceiveWindowBack) {
  event_base* base = event_base_new();
  ASSERT_NE(base, nullptr);
  {
    RealClock clock(base);
    int port = 0;
    const int listener = ListenOn(&port);
    const int client = ConnectTo(port);
    const int server = ::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
    ASSERT_GE(server, 0);
    evutil_make_socket_nonblocking(client);
    bufferevent* bev = bufferevent_socket_new(base, client, BEV_OPT_CLOSE_ON_FREE);
    ASSERT_NE(bev, nullptr);
    constexpr std::size_t kSize = 4'000'000;
    struct Reader {
      std::size_t got = 0;
      event_base* base;
    } reader{0, base};
    bufferevent_setcb(
        bev,
        [](bufferevent* b, void* arg) {
          auto* r = static_cast<Reader*>(arg);
          evbuffer* in = bufferevent_get_input(b);
          r->got += evbuffer_get_length(in);
          evbuffer_drain(in, evbuffer_get_length(in));
          if (r->got >= kSize) event_base_loopbreak(r->base);
        },
        nullptr, nullptr, &reader);
    bufferevent_enable(bev, EV_READ);
    ShapingOptions o;
    o.mode = ShapeMode::kAuto;
    o.knob = 100;  // never shapes
    ShapingStats stats;
    auto shaper = std::make_unique<UpstreamShaper>(&clock, bev, o, kSize, /*fixed_at_connect=*/false, &stats);
    std::thread sender([server] { SendAll(server, RandomBytes(kSize, 11)); });
    const timeval limit{10, 0};
    event_base_loopexit(base, &limit);
    event_base_dispatch(base);
    sender.join();
    EXPECT_EQ(reader.got, kSize);
    EXPECT_TRUE(shaper->shaper().stats().declined);
    int rcvbuf = 0, clamp = 0;
    socklen_t len = sizeof rcvbuf;
    ASSERT_EQ(getsockopt(client, SOL_SOCKET, SO_RCVBUF, &rcvbuf, &len), 0);
    len = sizeof clamp;
    ASSERT_EQ(getsockopt(client, IPPROTO_TCP, TCP_WINDOW_CLAMP, &clamp, &len), 0);
    EXPECT_GT(rcvbuf, 1 << 20) << "the shaping buffer was kept";
    EXPECT_GT(clamp, 1 << 19) << "the window clamp was kept";
    shaper.reset();
    bufferevent_free(bev);
    ::close(server);
    ::close(listener);
  }
  event_base_free(base);
}

// The round-5/6 stall (a shaped body cut short, the shaper still active): a slow client
// paused the origin's reads while the capture still counted what arrived, so the flight that
// ended slow start was counted but never read. Unpaused, the window stayed closed with the
// shaper waiting for an arrival and no timer armed; on a full buffer (zero window) nothing
// more could come, and the download never finished. Here the origin sends one flight and
// then waits (as a zero window makes it wait): the flight must be read without more data.
// On loopback the capture usually reports one more segment after the flight (a tail-loss
// probe, flagged as loss) that asks for an open by itself, so before the fix this passed
// too in the runs made; it guards the behaviour, it is not a deterministic reproducer.
TEST(UpstreamShaperTest, FlightCountedWhilePausedIsReadWithoutMoreData) {
  event_base* base = event_base_new();
  ASSERT_NE(base, nullptr);
  {
    RealClock clock(base);
    int port = 0;
    const int listener = ListenOn(&port);
    const int client = ConnectTo(port);
    const int server = ::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
    ASSERT_GE(server, 0);
    evutil_make_socket_nonblocking(client);
    bufferevent* bev = bufferevent_socket_new(base, client, BEV_OPT_CLOSE_ON_FREE);
    ASSERT_NE(bev, nullptr);
    constexpr std::size_t kSize = 1'000'000;
    constexpr std::size_t kFlight = 100'000;  // between ¾ of the shaping window and all of it
    struct Reader {
      std::size_t got = 0;
      event_base* base;
    } reader{0, base};
    bufferevent_setcb(
        bev,
        [](bufferevent* b, void* arg) {
          auto* r = static_cast<Reader*>(arg);
          evbuffer* in = bufferevent_get_input(b);
          r->got += evbuffer_get_length(in);
          evbuffer_drain(in, evbuffer_get_length(in));
          if (r->got >= kSize) event_base_loopbreak(r->base);
        },
        nullptr, nullptr, &reader);
    bufferevent_enable(bev, EV_READ);
    ShapingOptions o;
    o.mode = ShapeMode::kAlways;  // 64 KiB: a ~123 KB window
    ShapingStats stats;
    auto shaper = std::make_unique<UpstreamShaper>(&clock, bev, o, kSize, /*fixed_at_connect=*/false, &stats);
    if (!shaper->per_packet()) {
      shaper.reset();
      bufferevent_free(bev);
      ::close(server);
      ::close(listener);
      event_base_free(base);
      GTEST_SKIP() << "no per-packet capture here (needs CAP_NET_RAW and libpcap)";
    }
    shaper->SetPaused(true);  // the client is slow: nothing is read
    const std::string data = RandomBytes(kSize, 12);
    std::promise<void> go;
    std::thread sender([server, &data, f = go.get_future()]() mutable {
      SendAll(server, std::string_view(data).substr(0, kFlight));
      f.wait();
      SendAll(server, std::string_view(data).substr(kFlight));
    });
    auto run_for = [base](long ms) {
      const timeval tv{0, ms * 1000};
      event_base_loopexit(base, &tv);
      event_base_dispatch(base);
    };
    run_for(300);  // the capture counts the flight; its end ends slow start
    EXPECT_EQ(reader.got, 0u);
    EXPECT_NE(shaper->shaper().state(), ShaperState::kSlowStart)
        << "the counted flight did not end slow start: the test no longer sets up the stall";
    shaper->SetPaused(false);
    run_for(300);
    EXPECT_EQ(reader.got, kFlight) << "the flight sat unread in a closed window";
    go.set_value();
    const timeval limit{5, 0};
    event_base_loopexit(base, &limit);
    event_base_dispatch(base);
    EXPECT_EQ(reader.got, kSize);
    ::shutdown(server, SHUT_RDWR);
    sender.join();
    shaper.reset();
    bufferevent_free(bev);
    ::close(server);
    ::close(listener);
  }
  event_base_free(base);
}

// Round 8: waiting for a burst with a capture, the adapter reads nothing (a byte read while the
// burst comes is room the next ACK offers: the sender fills it one round trip later, in the next
// nap) and has TCP_QUICKACK off (an ACK of the burst's first segment moves the window's right
// edge by the window scale's rounding). The stream still ends whole.
TEST(UpstreamShaperTest, AwaitingABurstReadsNothingAndQuietsAcks) {
  event_base* base = event_base_new();
  ASSERT_NE(base, nullptr);
  {
    RealClock clock(base);
    int port = 0;
    const int listener = ListenOn(&port);
    const int client = ConnectTo(port);
    const int server = ::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
    ASSERT_GE(server, 0);
    evutil_make_socket_nonblocking(client);
    bufferevent* bev = bufferevent_socket_new(base, client, BEV_OPT_CLOSE_ON_FREE);
    ASSERT_NE(bev, nullptr);
    constexpr std::size_t kSize = 1'000'000;
    constexpr std::size_t kFlight = 100'000;  // between ¾ of the shaping window and all of it
    constexpr std::size_t kBurst = 50'000;
    struct Reader {
      std::size_t got = 0;
      event_base* base;
    } reader{0, base};
    bufferevent_setcb(
        bev,
        [](bufferevent* b, void* arg) {
          auto* r = static_cast<Reader*>(arg);
          evbuffer* in = bufferevent_get_input(b);
          r->got += evbuffer_get_length(in);
          evbuffer_drain(in, evbuffer_get_length(in));
          if (r->got >= kSize) event_base_loopbreak(r->base);
        },
        nullptr, nullptr, &reader);
    bufferevent_enable(bev, EV_READ);
    ShapingOptions o;
    o.mode = ShapeMode::kAlways;  // 64 KiB: a ~123 KB window
    ShapingStats stats;
    ::setenv("GHOST_SHAPER_QUIET_BURSTS", "1", 1);  // the behaviour is opt-in (proxy/shaper.h)
    auto shaper = std::make_unique<UpstreamShaper>(&clock, bev, o, kSize, /*fixed_at_connect=*/false, &stats);
    ::unsetenv("GHOST_SHAPER_QUIET_BURSTS");
    if (!shaper->per_packet()) {
      shaper.reset();
      bufferevent_free(bev);
      ::close(server);
      ::close(listener);
      event_base_free(base);
      GTEST_SKIP() << "no per-packet capture here (needs CAP_NET_RAW and libpcap)";
    }
    const std::string data = RandomBytes(kSize, 13);
    std::promise<void> burst, rest;
    std::thread sender([server, &data, b = burst.get_future(), r = rest.get_future()]() mutable {
      SendAll(server, std::string_view(data).substr(0, kFlight));
      b.wait();
      SendAll(server, std::string_view(data).substr(kFlight, kBurst));
      r.wait();
      SendAll(server, std::string_view(data).substr(kFlight + kBurst));
    });
    auto run_for = [base](long ms) {
      const timeval tv{0, ms * 1000};
      event_base_loopexit(base, &tv);
      event_base_dispatch(base);
    };
    // The flight ends slow start, and (no burst due) the adapter opens the window itself; then
    // a burst comes, is judged ended, drained, and the window opened for the next one.
    run_for(500);
    EXPECT_EQ(reader.got, kFlight);
    burst.set_value();
    run_for(100);  // looked at before the lost-open deadline (2 min RTTs + 200 ms after the open)
    EXPECT_EQ(reader.got, kFlight + kBurst);
    // kSaving, or kRecovery when loopback's tiny RTT made a burst look bad: bursts either way.
    ASSERT_FALSE(shaper->shaper().reads_freely())
        << "the flight did not start the bursts: the test no longer sets up the wait ("
        << ShaperStateName(shaper->shaper().state()) << ")";
    EXPECT_EQ(bufferevent_get_enabled(bev) & EV_READ, 0)
        << "the bufferevent reads while the window waits for its burst";
    int quickack = -1;
    socklen_t len = sizeof quickack;
    ASSERT_EQ(getsockopt(client, IPPROTO_TCP, TCP_QUICKACK, &quickack, &len), 0);
    EXPECT_EQ(quickack, 0) << "the burst's segments would be ACKed at once";
    rest.set_value();
    const timeval limit{5, 0};
    event_base_loopexit(base, &limit);
    event_base_dispatch(base);
    EXPECT_EQ(reader.got, kSize);
    ::shutdown(server, SHUT_RDWR);
    sender.join();
    shaper.reset();
    bufferevent_free(bev);
    ::close(server);
    ::close(listener);
  }
  event_base_free(base);
}

// Round 9: the window opens in one read. libevent reads at most 4 KB per read callback, one
// callback per loop turn, and each read sent a window update: the window opened in steps and
// the origin answered each with a part-window. The adapter now reads all that is queued with one
// recvmsg into the bufferevent's input. Every byte still arrives once, in order.
TEST(UpstreamShaperTest, WindowOpensInOneReadAndTheStreamIsByteIdentical) {
  event_base* base = event_base_new();
  ASSERT_NE(base, nullptr);
  {
    RealClock clock(base);
    int port = 0;
    const int listener = ListenOn(&port);
    const int client = ConnectTo(port);
    const int server = ::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
    ASSERT_GE(server, 0);
    evutil_make_socket_nonblocking(client);
    bufferevent* bev = bufferevent_socket_new(base, client, BEV_OPT_CLOSE_ON_FREE);
    ASSERT_NE(bev, nullptr);
    constexpr std::size_t kSize = 1'000'000;
    constexpr std::size_t kFlight = 100'000;  // between ¾ of the shaping window and all of it
    constexpr std::size_t kBurst = 60'000;
    struct Reader {
      std::string got;
      event_base* base;
      std::size_t max_added = 0;  // the largest single addition to the input (one read)
      int reads = 0;              // the owner's read callbacks
    } reader{{}, base};
    bufferevent_setcb(
        bev,
        [](bufferevent* b, void* arg) {
          auto* r = static_cast<Reader*>(arg);
          evbuffer* in = bufferevent_get_input(b);
          const std::size_t n = evbuffer_get_length(in);
          const std::size_t at = r->got.size();
          r->got.resize(at + n);
          evbuffer_remove(in, r->got.data() + at, n);
          ++r->reads;
          if (r->got.size() >= kSize) event_base_loopbreak(r->base);
        },
        nullptr, nullptr, &reader);
    evbuffer_add_cb(
        bufferevent_get_input(bev),
        [](evbuffer*, const evbuffer_cb_info* info, void* arg) {
          auto* r = static_cast<Reader*>(arg);
          r->max_added = std::max(r->max_added, info->n_added);
        },
        &reader);
    bufferevent_enable(bev, EV_READ);
    ShapingOptions o;
    o.mode = ShapeMode::kAlways;  // 64 KiB: a ~123 KB window
    ShapingStats stats;
    ::setenv("GHOST_SHAPER_ONE_READ_DRAIN", "1", 1);  // opt-in (proxy/shaper.h)
    auto shaper = std::make_unique<UpstreamShaper>(&clock, bev, o, kSize, /*fixed_at_connect=*/false, &stats);
    ::unsetenv("GHOST_SHAPER_ONE_READ_DRAIN");
    if (!shaper->per_packet()) {
      shaper.reset();
      bufferevent_free(bev);
      ::close(server);
      ::close(listener);
      event_base_free(base);
      GTEST_SKIP() << "no per-packet capture here (needs CAP_NET_RAW and libpcap)";
    }
    const std::string data = RandomBytes(kSize, 14);
    std::promise<void> burst, rest;
    std::thread sender([server, &data, b = burst.get_future(), r = rest.get_future()]() mutable {
      SendAll(server, std::string_view(data).substr(0, kFlight));
      b.wait();
      SendAll(server, std::string_view(data).substr(kFlight, kBurst));
      r.wait();
      SendAll(server, std::string_view(data).substr(kFlight + kBurst));
    });
    auto run_for = [base](long ms) {
      const timeval tv{0, ms * 1000};
      event_base_loopexit(base, &tv);
      event_base_dispatch(base);
    };
    run_for(500);  // the flight ends slow start; the window is opened for the first burst
    EXPECT_EQ(reader.got.size(), kFlight);
    ASSERT_FALSE(shaper->shaper().reads_freely())
        << "the flight did not start the bursts: the test no longer sets up the drain ("
        << ShaperStateName(shaper->shaper().state()) << ")";
    reader.max_added = 0;
    const int reads_before = reader.reads;
    burst.set_value();
    run_for(100);  // the burst comes, is judged ended and drained
    EXPECT_EQ(reader.got.size(), kFlight + kBurst);
    // Most of the burst came in one read (a few segments may be read as it begins, before the
    // capture reports it, unless the awaited burst is read quietly).
    EXPECT_GE(reader.max_added, kBurst * 2 / 3) << "the window opened in libevent's 4 KB steps";
    EXPECT_LE(reader.reads - reads_before, 4) << "the owner was called once per small read";
    rest.set_value();
    const timeval limit{5, 0};
    event_base_loopexit(base, &limit);
    event_base_dispatch(base);
    ASSERT_EQ(reader.got.size(), kSize);
    EXPECT_TRUE(reader.got == data) << "shaping changed a byte";
    ::shutdown(server, SHUT_RDWR);
    sender.join();
    shaper.reset();
    bufferevent_free(bev);
    ::close(server);
    ::close(listener);
  }
  event_base_free(base);
}

TEST_F(ProxyShapingTest, SmallResponseIsNotShaped) {
  StartProxy(Options(ShapeMode::kAlways));
  const std::string body = RandomBytes(100'000, 2);
  StreamingOrigin origin({LengthHead(body.size()), body});
  EXPECT_TRUE(BodyOf(Get(origin.port())) == body);
  EXPECT_EQ(Stats().shaped_downloads, 0u);
}

TEST_F(ProxyShapingTest, UnknownLengthIsShapedPastTheThresholdAndByteIdentical) {
  StartProxy(Options(ShapeMode::kAlways));
  const std::string body = RandomBytes(3'000'000, 3);
  // No length: delimited by the close (the proxy re-chunks it for an HTTP/1.1 client, so ask
  // as HTTP/1.0 to get the raw bytes back until the close).
  StreamingOrigin origin({"HTTP/1.1 200 OK\r\nCache-Control: no-store\r\nConnection: close\r\n\r\n",
                          body});
  const std::string got = BodyOf(
      Exchange("GET http://127.0.0.1:" + std::to_string(origin.port()) + "/big HTTP/1.0\r\n\r\n"));
  EXPECT_TRUE(got == body) << got.size() << " bytes of " << body.size();
  EXPECT_EQ(Stats().shaped_downloads, 1u);
}

TEST_F(ProxyShapingTest, OffNeverShapes) {
  StartProxy(Options(ShapeMode::kOff));
  const std::string body = RandomBytes(2'000'000, 4);
  StreamingOrigin origin({LengthHead(body.size()), body});
  EXPECT_TRUE(BodyOf(Get(origin.port())) == body);
  EXPECT_EQ(Stats().shaped_downloads, 0u);
}

TEST_F(ProxyShapingTest, KnobAtHundredNeverBursts) {
  StartProxy(Options(ShapeMode::kAuto, 100));
  const std::string body = RandomBytes(3'000'000, 5);
  StreamingOrigin origin({LengthHead(body.size()), body});
  EXPECT_TRUE(BodyOf(Get(origin.port())) == body);
  const ShapingStats s = Stats();
  EXPECT_EQ(s.bursts, 0u);
  EXPECT_EQ(s.sleep, Duration::zero());
}

// The knob of the ghostfs whose cache the proxy shares decides, unless the proxy's own knob
// was fixed (--shape-knob, shape_knob): K = 100 never shapes, from either side.
TEST_F(ProxyShapingTest, DaemonKnobDecidesUnlessTheKnobIsFixed) {
  const std::string body = RandomBytes(1'000'000, 9);
  auto run = [&](std::optional<int> daemon, int knob, bool fixed) {
    ProxyOptions o = Options(ShapeMode::kAuto, knob);
    o.shaping.knob_fixed = fixed;
    StopProxy();
    StartProxy(o);
    backend_->daemon_knob = daemon;  // before any request reaches the loop thread
    StreamingOrigin origin({LengthHead(body.size()), body});
    EXPECT_TRUE(BodyOf(Get(origin.port())) == body);
    const ShapingStats s = Stats();
    EXPECT_EQ(s.shaped_downloads, 1u);
    return s.knob_used;
  };
  EXPECT_EQ(run(100, 0, false), 100) << "the daemon's knob decides";
  EXPECT_EQ(run(0, 100, false), 0) << "the daemon's knob decides";
  EXPECT_EQ(run(0, 100, true), 100) << "a fixed knob wins over the daemon's";
  EXPECT_EQ(run(std::nullopt, 30, false), 30) << "unknown daemon knob: the proxy's own";
}

TEST_F(ProxyShapingTest, StallingOriginIsNeitherCorruptedNorTruncated) {
  StartProxy(Options(ShapeMode::kAlways));
  const std::string body = RandomBytes(2'000'000, 6);
  StreamingOrigin origin({LengthHead(body.size()), body, 900'000, 1500ms});
  const std::string got = BodyOf(Get(origin.port()));
  EXPECT_TRUE(got == body) << got.size() << " bytes of " << body.size();
}

TEST_F(ProxyShapingTest, ResetMidBurstCutsTheClientWithoutHangingOrAlteringBytes) {
  StartProxy(Options(ShapeMode::kAlways));
  const std::string body = RandomBytes(4'000'000, 7);
  Script script{LengthHead(body.size()), body};
  script.reset_at = 1'500'000;
  StreamingOrigin origin(script);
  const auto start = std::chrono::steady_clock::now();
  const std::string got = BodyOf(Get(origin.port()));
  EXPECT_LT(std::chrono::steady_clock::now() - start, 8s) << "the client hung";
  // The client sees a cut response (shorter than its Content-Length), and what it got is a
  // prefix of what the origin sent.
  EXPECT_LT(got.size(), body.size());
  EXPECT_TRUE(body.compare(0, got.size(), got) == 0) << "the bytes before the reset differ";
  EXPECT_EQ(Stats().active, 0u);
}

TEST_F(ProxyShapingTest, SlowReadingClientGetsEveryByte) {
  StartProxy(Options(ShapeMode::kAlways));
  const std::string body = RandomBytes(2'000'000, 8);
  StreamingOrigin origin({LengthHead(body.size()), body});
  const std::string got = BodyOf(Get(origin.port(), 2ms));
  EXPECT_TRUE(got == body) << got.size() << " bytes of " << body.size();
  EXPECT_EQ(Stats().shaped_downloads, 1u);
}

TEST_F(ProxyShapingTest, TunnelDownloadIsShapedAndByteIdentical) {
  ProxyOptions o = Options(ShapeMode::kAlways);
  StartProxy(o);
  const std::string body = RandomBytes(3'000'000, 9);
  Script script{"", body};
  script.wait_request = false;  // a raw peer: it sends at once
  StreamingOrigin origin(script);
  o.connect_ports = {static_cast<std::uint16_t>(origin.port())};
  StopProxy();
  StartProxy(o);
  const std::string out = Exchange("CONNECT 127.0.0.1:" + std::to_string(origin.port()) +
                                   " HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n");
  const std::string got = BodyOf(out);
  EXPECT_TRUE(got == body) << got.size() << " bytes of " << body.size();
  EXPECT_EQ(Stats().shaped_downloads, 1u);
}

// A shaped tunnel's buffer is fixed when its shaping starts, as HTTP's: fixed before the SYN the
// window (~2/3 of the buffer) stayed below the full flight the shaper waits for in slow start,
// and on the emulated link an HTTPS download never left it (0 bursts). The SYN now offers an
// autotuned socket's window scale, not the small buffer's 0.
TEST_F(ProxyShapingTest, TunnelFixesItsShapingBufferAfterTheHandshake) {
  ProxyOptions o = Options(ShapeMode::kAlways);
  o.shaping.buffer = 16 * 1024;  // the kernel doubles it: a 32 KiB buffer needs no scale
  const std::string body = RandomBytes(1'000'000, 10);
  Script script{"", body};
  script.wait_request = false;
  StreamingOrigin origin(script);
  o.connect_ports = {static_cast<std::uint16_t>(origin.port())};
  StartProxy(o);
  const std::string got = BodyOf(Exchange("CONNECT 127.0.0.1:" + std::to_string(origin.port()) +
                                          " HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"));
  EXPECT_TRUE(got == body) << got.size() << " bytes of " << body.size();
  EXPECT_GT(origin.peer_wscale(), 2) << "the tunnel's buffer was fixed before the SYN";
  EXPECT_EQ(Stats().shaped_downloads, 1u);
}

// On an emulated link (scripts/linkemu.sh; GHOST_SHAPING_URL names a large file behind it), a
// shaped download goes in bursts and the card model sleeps between them. Skipped without the
// link. Also the driver of scripts/bench-shaping.sh: GHOST_SHAPING_MODE (always, auto, off),
// GHOST_SHAPING_BUFFER (SO_RCVBUF), GHOST_SHAPING_OUT (the body is written there, to be
// compared by hash); it prints "RESULT {json}" with the time and the shaping counters. An
// https:// URL is fetched through a CONNECT tunnel with TLS inside (the bench's HTTPS arm).
TEST_F(ProxyShapingTest, EmulatedLinkDownloadGoesInBursts) {
  const char* url = std::getenv("GHOST_SHAPING_URL");
  if (url == nullptr) GTEST_SKIP() << "GHOST_SHAPING_URL not set (needs scripts/linkemu.sh)";
  ShapeMode mode = ShapeMode::kAlways;
  if (const char* m = std::getenv("GHOST_SHAPING_MODE")) {
    const std::optional<ShapeMode> parsed = ParseShapeMode(m);
    ASSERT_TRUE(parsed.has_value()) << "GHOST_SHAPING_MODE=" << m;
    mode = *parsed;
  }
  ProxyOptions o = Options(mode);
  if (const char* buffer = std::getenv("GHOST_SHAPING_BUFFER")) o.shaping.buffer = std::atoi(buffer);
  // The paper's plain TCP (with GHOST_SHAPING_MODE=off): a fixed window from the SYN on.
  if (const char* plain = std::getenv("GHOST_SHAPING_PLAIN_RCVBUF")) o.shaping.plain_buffer = std::atoi(plain);
  // https://HOST:PORT/PATH: through a CONNECT tunnel (shaped as the proxy shapes tunnels).
  const std::string u = url;
  const bool tls = u.rfind("https://", 0) == 0;
  std::string authority, path;
  if (tls) {
    const std::size_t slash = u.find('/', 8);
    authority = u.substr(8, slash - 8);
    path = slash == std::string::npos ? "/" : u.substr(slash);
    o.connect_ports = {static_cast<std::uint16_t>(std::atoi(authority.substr(authority.rfind(':') + 1).c_str()))};
  }
  StartProxy(o);
  const auto start = std::chrono::steady_clock::now();
  bool established = true;
  const std::string out =
      tls ? TlsExchange(authority, "GET " + path + " HTTP/1.1\r\nHost: " + authority +
                                       "\r\nConnection: close\r\n\r\n", &established)
          : Exchange(std::string("GET ") + url + " HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  EXPECT_TRUE(established) << "the proxy refused CONNECT " << authority;
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  // TLS ends on the origin's close_notify, before the proxy has seen the tunnel's FIN and
  // ended its shaper (whose counters are added when it ends): wait for that, up to 5 s.
  for (int i = 0; tls && i < 500 && Stats().active > 0; ++i) std::this_thread::sleep_for(10ms);
  const ShapingStats s = Stats();
  const std::string body = BodyOf(out);
  std::printf("RESULT {\"secs\": %.4f, \"body_bytes\": %zu, \"shaping\": %s}\n", secs, body.size(),
              ShapingStatusJson(ShapingOptions{}, s).c_str());
  if (const char* path = std::getenv("GHOST_SHAPING_OUT")) {
    std::FILE* f = std::fopen(path, "w");
    ASSERT_NE(f, nullptr) << path;
    std::fwrite(body.data(), 1, body.size(), f);
    std::fclose(f);
  }
  if (mode == ShapeMode::kOff) {
    EXPECT_EQ(s.shaped_downloads, 0u);
    return;
  }
  EXPECT_EQ(s.shaped_downloads, 1u);
  EXPECT_GT(s.bursts, 10u);
  EXPECT_GT(ToSeconds(s.sleep), 0.2 * secs);
}

// The shaper's minimum RTT starts from the handshake's and is only ever lowered (round 9, issue
// 13: a tunnel's shaper starts 256 KiB in with the bottleneck queue full, and took its minimum
// RTT from the kernel's receive estimate then, 41.5 ms on a 30 ms link, so wake-ups came late).
TEST(PathMinRttTest, HandshakeRttIsLoweredBySamplesNeverRaised) {
  PathMinRtt rtt;
  EXPECT_FALSE(rtt.value().has_value());
  rtt.SetHandshake(60ms);
  EXPECT_EQ(rtt.value(), Duration(60ms));
  rtt.Sample(101ms);  // a queued estimate: ignored
  EXPECT_EQ(rtt.value(), Duration(60ms));
  rtt.Sample(59ms);  // a lower sample lowers it
  EXPECT_EQ(rtt.value(), Duration(59ms));
  rtt.Sample(75ms);  // and a later rise does not raise it again
  EXPECT_EQ(rtt.value(), Duration(59ms));
  rtt.Sample(Duration::zero());  // no sample (tcpi_rcv_rtt 0)
  EXPECT_EQ(rtt.value(), Duration(59ms));
  EXPECT_EQ(rtt.handshake(), Duration(60ms));
}

TEST(PathMinRttTest, WithoutAHandshakeTheLowestSampleIsTheValue) {
  PathMinRtt rtt;
  rtt.SetHandshake(Duration::zero());  // no sample at connect: ignored
  rtt.Sample(42ms);
  rtt.Sample(50ms);
  EXPECT_EQ(rtt.value(), Duration(42ms));
  EXPECT_FALSE(rtt.handshake().has_value());
}

// The adapter on a real socket: given a handshake RTT, its shaper starts from it rather than
// from the kernel's estimate when shaping starts, and the receive samples of the download can
// only lower it (loopback's are microseconds, far below the 80 ms given).
TEST(UpstreamShaperTest, StartsFromTheHandshakeRttAndSamplesOnlyLowerIt) {
  event_base* base = event_base_new();
  ASSERT_NE(base, nullptr);
  {
    RealClock clock(base);
    int port = 0;
    const int listener = ListenOn(&port);
    const int client = ConnectTo(port);
    const int server = ::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
    ASSERT_GE(server, 0);
    const std::optional<Duration> handshake = HandshakeRtt(client);
    ASSERT_TRUE(handshake.has_value()) << "no tcpi_min_rtt after a loopback connect";
    EXPECT_LT(*handshake, 20ms) << "loopback";
    evutil_make_socket_nonblocking(client);
    bufferevent* bev = bufferevent_socket_new(base, client, BEV_OPT_CLOSE_ON_FREE);
    ASSERT_NE(bev, nullptr);
    ShapingOptions o;
    o.mode = ShapeMode::kAlways;
    ShapingStats stats;
    auto shaper = std::make_unique<UpstreamShaper>(&clock, bev, o, 0, /*fixed_at_connect=*/false,
                                                   &stats, Duration(80ms));
    EXPECT_EQ(shaper->shaper().min_rtt(), Duration(80ms)) << "nothing received yet";
    constexpr std::size_t kSize = 2'000'000;
    struct Reader {
      std::size_t got = 0;
      event_base* base;
    } reader{0, base};
    bufferevent_setcb(
        bev,
        [](bufferevent* b, void* arg) {
          auto* r = static_cast<Reader*>(arg);
          evbuffer* in = bufferevent_get_input(b);
          r->got += evbuffer_get_length(in);
          evbuffer_drain(in, evbuffer_get_length(in));
          if (r->got >= kSize) event_base_loopbreak(r->base);
        },
        nullptr, nullptr, &reader);
    bufferevent_enable(bev, EV_READ);
    std::thread sender([server] { SendAll(server, RandomBytes(kSize, 12)); });
    const timeval limit{20, 0};
    event_base_loopexit(base, &limit);
    event_base_dispatch(base);
    sender.join();
    EXPECT_EQ(reader.got, kSize);
    EXPECT_LE(shaper->shaper().min_rtt(), Duration(80ms)) << "raised above the handshake's";
    shaper.reset();
    EXPECT_EQ(stats.last_handshake_rtt, Duration(80ms));
    EXPECT_LE(stats.last_min_rtt, Duration(80ms));
    bufferevent_free(bev);
    ::close(server);
    ::close(listener);
  }
  event_base_free(base);
}

// A tunnel's origin connection measures the handshake's RTT when it connects and hands it to
// the shaper it starts 256 KiB in (proxy/origin.cc).
TEST_F(ProxyShapingTest, TunnelShaperGetsTheHandshakeRtt) {
  ProxyOptions o = Options(ShapeMode::kAlways);
  const std::string body = RandomBytes(1'000'000, 13);
  Script script{"", body};
  script.wait_request = false;
  StreamingOrigin origin(script);
  o.connect_ports = {static_cast<std::uint16_t>(origin.port())};
  StartProxy(o);
  const std::string got = BodyOf(Exchange("CONNECT 127.0.0.1:" + std::to_string(origin.port()) +
                                          " HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"));
  EXPECT_TRUE(got == body) << got.size() << " bytes of " << body.size();
  for (int i = 0; i < 500 && Stats().active > 0; ++i) std::this_thread::sleep_for(10ms);
  const ShapingStats s = Stats();
  EXPECT_EQ(s.shaped_downloads, 1u);
  EXPECT_GT(s.last_handshake_rtt, Duration::zero()) << "the shaper was given no handshake RTT";
  EXPECT_LE(s.last_min_rtt, s.last_handshake_rtt);
}

}  // namespace
}  // namespace ghost
