// ArrivalTap (proxy/arrival_tap.h): a capture filtered to one connection sees every payload
// byte the peer sends, each once unless the sender retransmitted it (then flagged), with times
// that never go backwards, and nothing of another connection. Needs CAP_NET_RAW: skipped
// without it.
#include "proxy/arrival_tap.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <string>
#include <thread>
#include <vector>

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

// What the tap saw of one connection.
struct Seen {
  std::vector<bool> bytes;   // by stream offset
  Bytes beyond = 0;          // payload bytes past the stream's end (none should be)
  Bytes again = 0;           // bytes seen a second time (a retransmission on a loaded machine)
  Bytes again_unflagged = 0; // of those, in a segment not flagged `missing`
  int segments = 0;
  bool ordered = true, closing = false;
  Bytes Distinct() const { return static_cast<Bytes>(std::count(bytes.begin(), bytes.end(), true)); }
};

// Reads everything from `fd` until `want` bytes came, draining the tap as it goes.
Bytes ReadAll(int fd, ArrivalTap* tap, Bytes want, Seen* seen) {
  Bytes got = 0;
  TimePoint last{};
  seen->bytes.assign(want, false);
  auto sink = [&](const TappedSegment& s) {
    for (Bytes i = 0; i < s.payload; ++i) {
      const Bytes at = Bytes{s.offset} + i;
      if (at >= want) {
        ++seen->beyond;
      } else if (seen->bytes[at]) {
        ++seen->again;
        if (!s.missing) ++seen->again_unflagged;
      } else {
        seen->bytes[at] = true;
      }
    }
    if (s.payload > 0) ++seen->segments;
    if (s.at < last) seen->ordered = false;
    last = s.at;
    if (s.closing) seen->closing = true;
  };
  char buf[65536];
  while (got < want) {
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    got += static_cast<Bytes>(n);
    tap->Drain(sink);
  }
  // The capture may trail the socket by a packet or two.
  for (int i = 0; i < 50 && (seen->Distinct() < want || !seen->closing); ++i) {
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
  Seen seen;
  const Bytes got = ReadAll(p.client, tap.get(), data.size(), &seen);
  writer.join();
  EXPECT_EQ(got, data.size());
  EXPECT_EQ(seen.Distinct(), data.size()) << "every byte of the stream";
  EXPECT_EQ(seen.beyond, 0u) << "nothing past it (the other connection's 100000 bytes)";
  EXPECT_EQ(seen.again_unflagged, 0u) << "a byte seen twice comes in a retransmission, flagged";
  EXPECT_LT(seen.again, data.size() / 2) << "retransmissions, not a second copy of the stream";
  EXPECT_GE(seen.segments, 5);
  EXPECT_TRUE(seen.ordered);
  EXPECT_TRUE(seen.closing) << "the FIN was not seen";
}

}  // namespace
}  // namespace ghost
