// ArrivalTap (proxy/arrival_tap.h): a capture filtered to one connection sees every payload
// byte the peer sends, once, with times that never go backwards, and nothing of another
// connection. Needs CAP_NET_RAW: skipped without it.
#include "proxy/arrival_tap.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>
#include <thread>

namespace ghost {
namespace {

struct Pair {
  int client = -1, server = -1;
  ~Pair() {
    if (client >= 0) ::close(client);
    if (server >= 0) ::close(server);
  }
};

void Connect(Pair* p) {
  const int l = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
  ASSERT_EQ(::bind(l, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  ASSERT_EQ(::listen(l, 1), 0);
  socklen_t len = sizeof a;
  getsockname(l, reinterpret_cast<sockaddr*>(&a), &len);
  p->client = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_EQ(::connect(p->client, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  p->server = ::accept(l, nullptr, nullptr);
  ::close(l);
  ASSERT_GE(p->server, 0);
}

// Reads everything from `fd` until `want` bytes came, draining the tap as it goes.
Bytes ReadAll(int fd, ArrivalTap* tap, Bytes want, Bytes* tapped, int* segments,
              bool* ordered, bool* closing) {
  Bytes got = 0;
  TimePoint last{};
  auto sink = [&](const TappedSegment& s) {
    *tapped += s.payload;
    if (s.payload > 0) ++*segments;
    if (s.at < last) *ordered = false;
    last = s.at;
    if (s.closing) *closing = true;
  };
  char buf[65536];
  while (got < want) {
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    got += static_cast<Bytes>(n);
    tap->Drain(sink);
  }
  // The capture may trail the socket by a packet or two.
  for (int i = 0; i < 50 && (*tapped < want || !*closing); ++i) {
    pollfd pfd{tap->fd(), POLLIN, 0};
    ::poll(&pfd, 1, 20);
    tap->Drain(sink);
  }
  return got;
}

TEST(ArrivalTapTest, SeesEveryPayloadByteOfItsConnectionOnceInOrder) {
  Pair p, other;
  Connect(&p);
  Connect(&other);
  RealClock clock(nullptr);
  std::string why;
  std::unique_ptr<ArrivalTap> tap = ArrivalTap::Open(p.client, &clock, &why);
  if (!tap) GTEST_SKIP() << "no capture: " << why;
  const std::string data(300000, 'x');
  std::thread writer([&] {
    ::send(other.server, data.data(), 100000, MSG_NOSIGNAL);  // not ours: never counted
    std::size_t off = 0;
    while (off < data.size()) {
      const ssize_t n = ::send(p.server, data.data() + off, std::min<std::size_t>(7000, data.size() - off), MSG_NOSIGNAL);
      if (n <= 0) break;
      off += static_cast<std::size_t>(n);
    }
    ::shutdown(p.server, SHUT_WR);
  });
  Bytes tapped = 0;
  int segments = 0;
  bool ordered = true, closing = false;
  const Bytes got = ReadAll(p.client, tap.get(), data.size(), &tapped, &segments, &ordered, &closing);
  writer.join();
  EXPECT_EQ(got, data.size());
  EXPECT_EQ(tapped, data.size());
  EXPECT_GE(segments, 5);
  EXPECT_TRUE(ordered);
  EXPECT_TRUE(closing) << "the FIN was not seen";
}

}  // namespace
}  // namespace ghost
