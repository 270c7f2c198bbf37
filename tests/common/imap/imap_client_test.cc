#include "common/imap/imap_client.h"
#include "common/imap/find_appended.h"

#include <arpa/inet.h>
#include <event2/event.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>
#include <utime.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "common/base/clock.h"
#include "common/imap/imap_client_internal.h"
#include "common/imap/maildir_names.h"
#include "tests/common/dovecot_fixture.h"

namespace ghost {
namespace {

using imap::Segment;
using imap::Token;

// ---- Helpers ----

// Runs `base` until `done()` holds or `limit` passes. Returns false on timeout.
bool RunLoopUntil(event_base* base, const std::function<bool()>& done,
                  Duration limit = Seconds(30)) {
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

// Runs one asynchronous call to completion and returns what its callback got.
template <typename T>
Result<T> Await(event_base* base, const std::function<void(ImapClient::ResultCallback<T>)>& start) {
  std::unique_ptr<Result<T>> out;
  start([&out](Result<T> r) { out = std::make_unique<Result<T>>(std::move(r)); });
  if (!RunLoopUntil(base, [&] { return out != nullptr; })) {
    return Status::TimedOut("test: the callback never ran");
  }
  return std::move(*out);
}

Status AwaitStatus(event_base* base, const std::function<void(ImapClient::StatusCallback)>& start) {
  std::optional<Status> out;
  start([&out](Status s) { out.emplace(std::move(s)); });
  if (!RunLoopUntil(base, [&] { return out.has_value(); })) {
    return Status::TimedOut("test: the callback never ran");
  }
  return *out;
}

// A message of exactly `size` bytes (CRLF line ends, as IMAP serves them), different per seed.
std::string MakeMessage(std::size_t size, unsigned seed) {
  std::mt19937 rng(seed);
  std::string m = "From: ghost@example.org\r\nTo: user@example.org\r\nSubject: test " +
                  std::to_string(seed) + "\r\nMessage-ID: <" + std::to_string(seed) +
                  "@ghost>\r\n\r\n";
  static const char kChars[] =
      "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 .,;:!?-+=()[]";
  while (m.size() < size) {
    const std::size_t line = 20 + rng() % 60;
    for (std::size_t i = 0; i < line && m.size() < size; ++i) {
      m.push_back(kChars[rng() % (sizeof kChars - 1)]);
    }
    if (m.size() + 2 <= size) m += "\r\n";
  }
  while (m.size() < size) m.push_back('x');
  m.resize(size);
  if (m.size() >= 2 && m[m.size() - 2] != '\r') m.replace(m.size() - 2, 2, "\r\n");
  return m;
}

std::vector<Segment> Segs(std::initializer_list<std::string> texts) {
  std::vector<Segment> out;
  bool literal = false;
  for (const std::string& t : texts) {
    out.push_back(Segment{t, literal, false});
    literal = !literal;
  }
  return out;
}

// ---- Syntax (imap_client_internal.h) ----

TEST(ImapSyntaxTest, ParsesTaggedStatusWithCode) {
  Result<imap::Response> r =
      imap::ParseResponse(Segs({"G7 OK [APPENDUID 38505 3955] APPEND done"}));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->kind, imap::Response::Kind::kTagged);
  EXPECT_EQ(r->tag, "G7");
  EXPECT_EQ(r->status, "OK");
  EXPECT_EQ(r->code, "APPENDUID");
  ASSERT_EQ(r->code_args.size(), 2u);
  EXPECT_EQ(r->code_args[0].Number(), 38505u);
  EXPECT_EQ(r->code_args[1].Number(), 3955u);
  EXPECT_EQ(r->text, "APPEND done");
}

TEST(ImapSyntaxTest, ParsesUntaggedStatusWithListCodeAndOddText) {
  Result<imap::Response> r = imap::ParseResponse(
      Segs({"* OK [PERMANENTFLAGS (\\Seen \\Deleted \\*)] Don't \"worry (unbalanced"}));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->kind, imap::Response::Kind::kUntagged);
  EXPECT_EQ(r->code, "PERMANENTFLAGS");
  ASSERT_EQ(r->code_args.size(), 1u);
  ASSERT_EQ(r->code_args[0].type, Token::Type::kList);
  ASSERT_EQ(r->code_args[0].items.size(), 3u);
  EXPECT_EQ(r->code_args[0].items[2].text, "\\*");
  EXPECT_EQ(r->text, "Don't \"worry (unbalanced");
}

TEST(ImapSyntaxTest, ParsesFetchWithSectionsQuotedEscapesNilAndLiterals) {
  Result<imap::Response> r = imap::ParseResponse(
      Segs({"* 12 FETCH (UID 42 FLAGS (\\Seen $Junk) INTERNALDATE \"17-Jul-1996 02:44:25 -0700\" "
            "BODY[HEADER.FIELDS (From To)]<0> {11}",
            "From: a\r\n\r\n", " X-NIL NIL X-Q \"a\\\"b\\\\c\" BODY[] {0}", "", ")"}));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->number, 12u);
  EXPECT_EQ(r->keyword, "FETCH");
  ASSERT_EQ(r->data.size(), 1u);
  const auto& items = r->data[0].items;
  ASSERT_EQ(items.size(), 14u);
  EXPECT_TRUE(items[0].IsAtom("UID"));
  EXPECT_EQ(items[1].Number(), 42u);
  EXPECT_EQ(items[3].items.size(), 2u);
  EXPECT_EQ(items[5].text, "17-Jul-1996 02:44:25 -0700");
  EXPECT_EQ(items[6].text, "BODY[HEADER.FIELDS (From To)]<0>");
  EXPECT_TRUE(items[7].literal);
  EXPECT_EQ(items[7].text, "From: a\r\n\r\n");
  EXPECT_EQ(items[9].type, Token::Type::kNil);
  EXPECT_EQ(items[11].text, "a\"b\\c");
  EXPECT_TRUE(items[12].IsAtom("BODY[]"));
  EXPECT_EQ(items[13].text, "");
}

TEST(ImapSyntaxTest, ParsesContinuationAndDataResponses) {
  Result<imap::Response> c = imap::ParseResponse(Segs({"+ idling"}));
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->kind, imap::Response::Kind::kContinuation);
  EXPECT_EQ(c->text, "idling");
  Result<imap::Response> e = imap::ParseResponse(Segs({"* 3 EXISTS"}));
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(e->keyword, "EXISTS");
  EXPECT_EQ(e->number, 3u);
  Result<imap::Response> l =
      imap::ParseResponse(Segs({"* LIST (\\Noselect) \"/\" {5}", "ab cd", ""}));
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  ASSERT_EQ(l->data.size(), 3u);
  EXPECT_EQ(l->data[2].text, "ab cd");
  Result<imap::Response> n = imap::ParseResponse(Segs({"* LIST () NIL INBOX"}));
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(n->data[1].type, Token::Type::kNil);
}

TEST(ImapSyntaxTest, RefusesMalformedResponses) {
  for (const char* bad : {"", "G1", "G1 MAYBE done", "HTTP/1.1 200 OK", "* 3", "* LIST (a b",
                          "* LIST (a)) x", "* X \"unterminated", "* 99999999999 EXISTS",
                          "* FETCH (BODY[ x)", "G(1 OK x", "* LIST {abc}", "* X {3}x"}) {
    Result<imap::Response> r = imap::ParseResponse(Segs({bad}));
    EXPECT_FALSE(r.ok()) << "parsed: " << bad;
    if (!r.ok()) {
      EXPECT_EQ(r.status().code(), Status::Code::kCorruption) << bad;
    }
  }
}

TEST(ImapSyntaxTest, SurvivesRandomBytes) {
  std::mt19937_64 rng(7);
  const std::string alphabet = "* GOKNOBADFETCH()[]{}\"\\0123456789+<>\r\nUIDBODY.";
  int parsed = 0;
  for (int i = 0; i < 50000; ++i) {
    std::string line;
    const int len = static_cast<int>(rng() % 40);
    for (int k = 0; k < len; ++k) {
      line.push_back(rng() % 8 == 0 ? static_cast<char>(rng() % 256)
                                    : alphabet[rng() % alphabet.size()]);
    }
    std::vector<Segment> segs = {Segment{line, false, false}};
    if (rng() % 4 == 0) {
      segs.push_back(Segment{"lit", true, false});
      segs.push_back(Segment{")", false, false});
    }
    Result<imap::Response> r = imap::ParseResponse(segs);
    if (r.ok()) {
      ++parsed;
    } else {
      ASSERT_EQ(r.status().code(), Status::Code::kCorruption);
    }
    bool bad = false;
    (void)imap::TrailingLiteral(line, &bad);
    (void)imap::AnalyzeFetchPrefix(segs);
  }
  // The valid ones round-trip through the structure: at least some random lines are IMAP.
  EXPECT_GT(parsed, 0);
  // Deep nesting is refused, not a stack overflow.
  EXPECT_FALSE(imap::ParseResponse(Segs({"* X " + std::string(100000, '(')})).ok());
}

TEST(ImapSyntaxTest, AnalyzesFetchPrefixBeforeABodyLiteral) {
  imap::FetchPrefix p = imap::AnalyzeFetchPrefix(Segs({"* 3 FETCH (UID 17 BODY[] {1234}"}));
  EXPECT_TRUE(p.is_fetch);
  EXPECT_EQ(p.seq, 3u);
  EXPECT_EQ(p.item, "BODY[]");
  EXPECT_EQ(p.uid, 17u);
  p = imap::AnalyzeFetchPrefix(Segs({"* 3 FETCH (BODY[] {5}"}));
  EXPECT_TRUE(p.is_fetch);
  EXPECT_FALSE(p.uid.has_value());
  // A literal inside a nested list is not a top-level attribute value.
  p = imap::AnalyzeFetchPrefix(Segs({"* 3 FETCH (UID 1 ENVELOPE (\"d\" {5}"}));
  EXPECT_FALSE(p.is_fetch);
  p = imap::AnalyzeFetchPrefix(Segs({"* LIST () \"/\" {5}"}));
  EXPECT_FALSE(p.is_fetch);
}

TEST(ImapSyntaxTest, FindsTrailingLiterals) {
  bool bad = false;
  EXPECT_EQ(imap::TrailingLiteral("* 1 FETCH (BODY[] {42}", &bad), 42u);
  EXPECT_EQ(imap::TrailingLiteral("A APPEND x {7+}", &bad), 7u);
  EXPECT_FALSE(imap::TrailingLiteral("* OK done", &bad).has_value());
  EXPECT_FALSE(imap::TrailingLiteral("* X {}", &bad).has_value());
  EXPECT_FALSE(bad);
  EXPECT_FALSE(imap::TrailingLiteral("* X {99999999999999999999999}", &bad).has_value());
  EXPECT_TRUE(bad);
}

TEST(ImapSyntaxTest, EncodesArgumentsAsAtomQuotedOrLiteral) {
  std::vector<std::string> parts = {"LOGIN "};
  imap::AppendAstring("ghost", false, &parts);
  parts.back() += " ";
  imap::AppendAstring("s3cret \"quoted\" \\", false, &parts);
  EXPECT_EQ(parts, (std::vector<std::string>{"LOGIN ghost \"s3cret \\\"quoted\\\" \\\\\""}));
  parts = {"X "};
  imap::AppendString("caf\xc3\xa9", false, &parts);
  parts.back() += " end";
  EXPECT_EQ(parts, (std::vector<std::string>{"X {5}\r\n", "caf\xc3\xa9 end"}));
  parts = {"X "};
  imap::AppendString("a\r\nb", true, &parts);
  EXPECT_EQ(parts, (std::vector<std::string>{"X {4+}\r\na\r\nb"}));
  parts = {"X "};
  imap::AppendString("", true, &parts);
  EXPECT_EQ(parts, (std::vector<std::string>{"X \"\""}));
}

TEST(ImapSyntaxTest, ValidatesFlagsAndUidSets) {
  for (const char* f : {"\\Seen", "$Forwarded", "Junk", "\\Deleted"})
    EXPECT_TRUE(imap::IsValidFlag(f)) << f;
  for (const char* f : {"", "\\", "a b", "(x", "x)", "\\Seen\r\n", "a\"b", "a]"}) {
    EXPECT_FALSE(imap::IsValidFlag(f)) << f;
  }
  for (const char* s : {"1", "1:*", "*", "3,9:12", "4294967295", "5:2"}) {
    EXPECT_TRUE(imap::IsValidUidSet(s)) << s;
  }
  for (const char* s : {"", "0", "1:", ",1", "1,,2", "a", "1 2", "4294967296", "01"}) {
    EXPECT_FALSE(imap::IsValidUidSet(s)) << s;
  }
  EXPECT_EQ(imap::ExpandUidSet("4:6,9,2:1"), (std::vector<std::uint32_t>{4, 5, 6, 9, 1, 2}));
  EXPECT_FALSE(imap::ExpandUidSet("1:*").has_value());
  EXPECT_FALSE(imap::ExpandUidSet("1:4294967295", 1000).has_value());
  EXPECT_TRUE(imap::UidSetContains("3,9:12", 10));
  EXPECT_FALSE(imap::UidSetContains("3,9:12", 4));
  EXPECT_TRUE(imap::UidSetContains("100:*", 150));
  EXPECT_FALSE(imap::UidSetContains("100:*", 50));  // the server's "last message" answer
}

TEST(ImapSyntaxTest, InternalDatesRoundTrip) {
  EXPECT_EQ(imap::ParseInternalDate("17-Jul-1996 02:44:25 -0700"), 837596665);
  EXPECT_EQ(imap::ParseInternalDate(" 1-Jan-1970 00:00:00 +0000"), 0);
  EXPECT_EQ(imap::ParseInternalDate("01-Jan-1970 01:00:00 +0100"), 0);
  EXPECT_FALSE(imap::ParseInternalDate("32-Jan-1970 00:00:00 +0000").has_value());
  EXPECT_FALSE(imap::ParseInternalDate("1-Foo-1970 00:00:00 +0000").has_value());
  EXPECT_FALSE(imap::ParseInternalDate("garbage").has_value());
  for (std::int64_t t : {0LL, 837596665LL, 1700000000LL, 951782400LL /* 2000-02-29 */}) {
    const std::string s = imap::FormatInternalDate(t);
    EXPECT_EQ(imap::ParseInternalDate(s), t) << s;
  }
  EXPECT_EQ(imap::FormatInternalDate(837596665), "17-Jul-1996 09:44:25 +0000");
}

TEST(ImapSyntaxTest, ParsesImapUrls) {
  Result<ImapUrl> u = ParseImapUrl("imap://me%40home@mail.example.org:1143/INBOX");
  ASSERT_TRUE(u.ok()) << u.status().ToString();
  EXPECT_FALSE(u->implicit_tls);
  EXPECT_EQ(u->user, "me@home");
  EXPECT_EQ(u->host, "mail.example.org");
  EXPECT_EQ(u->port, 1143);
  EXPECT_EQ(u->mailbox, "INBOX");
  u = ParseImapUrl("imaps://[::1]/");
  ASSERT_TRUE(u.ok()) << u.status().ToString();
  EXPECT_TRUE(u->implicit_tls);
  EXPECT_EQ(u->host, "::1");
  EXPECT_EQ(u->port, 993);
  u = ParseImapUrl("IMAP://u;AUTH=*@h");
  ASSERT_TRUE(u.ok());
  EXPECT_EQ(u->user, "u");
  EXPECT_EQ(u->port, 143);
  for (const char* bad : {"http://h/", "imap://", "imap://u:pw@h/", "imap://h:0/", "imap://h:x/",
                          "imap://h:70000/", "imap://[::1/", "imap://h h/", "imap://u%zz@h/"}) {
    EXPECT_FALSE(ParseImapUrl(bad).ok()) << bad;
  }
  Result<ImapUrl> pw = ParseImapUrl("imap://u:pw@h/");
  EXPECT_NE(pw.status().message().find("password"), std::string::npos);
}

// ---- A scripted fake server, for what a real one never does ----

// Accepts one connection on 127.0.0.1 and runs `script` on it in a thread. The script reads
// lines (blocking until a line, the client's close, the server's destruction, or 20 s so a
// broken test cannot hang) and writes bytes.
class FakeServer {
 public:
  class Conn {
   public:
    Conn(int fd, int stop_fd) : fd_(fd), stop_fd_(stop_fd) {}
    // One line without its CRLF; "" on EOF, on stop, or after 20 s.
    std::string ReadLine() {
      std::string line;
      while (true) {
        const std::size_t nl = buf_.find("\r\n");
        if (nl != std::string::npos) {
          line = buf_.substr(0, nl);
          buf_.erase(0, nl + 2);
          return line;
        }
        pollfd p[2] = {{fd_, POLLIN, 0}, {stop_fd_, POLLIN, 0}};
        if (::poll(p, 2, 20000) <= 0 || p[1].revents != 0) return "";
        char tmp[65536];
        const ssize_t n = ::recv(fd_, tmp, sizeof tmp, 0);
        if (n <= 0) return "";
        buf_.append(tmp, static_cast<std::size_t>(n));
      }
    }
    // Reads a line and returns its tag ("" on EOF).
    std::string ReadTag(std::string* line_out = nullptr) {
      const std::string line = ReadLine();
      if (line_out) *line_out = line;
      return line.substr(0, line.find(' '));
    }
    void Send(const std::string& bytes) {
      std::size_t done = 0;
      while (done < bytes.size()) {
        const ssize_t n = ::send(fd_, bytes.data() + done, bytes.size() - done, MSG_NOSIGNAL);
        if (n <= 0) return;
        done += static_cast<std::size_t>(n);
      }
    }
    // Waits until the client closes the connection.
    void WaitForClose() {
      while (!ReadLine().empty()) {
      }
    }
    // The standard opening: greeting, then LOGIN answered OK.
    void GreetAndLogin(const std::string& caps = "IMAP4rev1 LITERAL+ IDLE") {
      Send("* OK [CAPABILITY " + caps + "] fake ready\r\n");
      const std::string tag = ReadTag();
      Send(tag + " OK [CAPABILITY " + caps + "] logged in\r\n");
    }
    void AnswerSelect() {
      const std::string tag = ReadTag();
      Send("* 2 EXISTS\r\n* OK [UIDVALIDITY 5] ok\r\n* OK [UIDNEXT 9] ok\r\n" + tag +
           " OK [READ-WRITE] selected\r\n");
    }

   private:
    int fd_;
    int stop_fd_;
    std::string buf_;
  };

  explicit FakeServer(std::function<void(Conn&)> script) {
    listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ::bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
    socklen_t len = sizeof addr;
    ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.sin_port);
    ::listen(listen_fd_, 4);
    if (::pipe2(stop_, O_CLOEXEC) != 0) std::abort();
    thread_ = std::thread([this, script = std::move(script)] {
      pollfd p[2] = {{listen_fd_, POLLIN, 0}, {stop_[0], POLLIN, 0}};
      if (::poll(p, 2, 20000) <= 0 || p[1].revents != 0) return;
      const int fd = ::accept(listen_fd_, nullptr, nullptr);
      if (fd < 0) return;
      Conn conn(fd, stop_[0]);
      script(conn);
      ::close(fd);
      finished_ = true;
    });
  }
  // Ends the script's waits (a client that is still connected is not waited for) and joins.
  ~FakeServer() {
    const char x = 'x';
    (void)!::write(stop_[1], &x, 1);
    thread_.join();
    ::close(listen_fd_);
    ::close(stop_[0]);
    ::close(stop_[1]);
  }
  std::string url() const { return "imap://ghost@127.0.0.1:" + std::to_string(port_) + "/"; }
  bool finished() const { return finished_; }

 private:
  int listen_fd_ = -1;
  int stop_[2] = {-1, -1};
  int port_ = 0;
  std::thread thread_;
  std::atomic<bool> finished_{false};
};

class ImapClientFakeServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    base_ = MakeEventBase();
    options_.command_timeout = Millis(500);
  }
  void TearDown() override {
    client_.reset();
    event_base_free(base_);
  }
  ImapClient& Client() {
    if (!client_) client_ = std::make_unique<ImapClient>(base_, options_);
    return *client_;
  }
  Status Connect(const FakeServer& server) {
    return AwaitStatus(base_, [&](ImapClient::StatusCallback cb) {
      Client().Connect(server.url(), "", "pw", std::move(cb));
    });
  }
  Result<MailboxStatus> SelectInbox() {
    return Await<MailboxStatus>(base_, [&](ImapClient::ResultCallback<MailboxStatus> cb) {
      Client().Select("INBOX", std::move(cb));
    });
  }
  // UID FETCH uid BODY.PEEK[], the body's bytes appended to `got` as they come.
  Status FetchBodyInto(std::uint32_t uid, std::string* got) {
    return AwaitStatus(base_, [&](ImapClient::StatusCallback cb) {
      Client().FetchBody(
          uid,
          [got](std::string_view d) {
            got->append(d);
            return true;
          },
          std::move(cb));
    });
  }

  event_base* base_ = nullptr;
  ImapClientOptions options_;
  std::unique_ptr<ImapClient> client_;
};

TEST_F(ImapClientFakeServerTest, ServerDroppingMidLiteralFailsTheFetchAndTheConnection) {
  FakeServer server([](FakeServer::Conn& c) {
    c.GreetAndLogin();
    c.AnswerSelect();
    std::string line;
    c.ReadTag(&line);
    c.Send("* 1 FETCH (UID 7 BODY[] {5000}\r\n" + std::string(1000, 'a'));
  });
  ASSERT_TRUE(Connect(server).ok());
  ASSERT_TRUE(SelectInbox().ok());
  int disconnects = 0;
  Status disconnect_status;
  Client().SetDisconnectHandler([&](Status s) {
    ++disconnects;
    disconnect_status = s;
  });
  std::string got;
  Status s = FetchBodyInto(7, &got);
  EXPECT_EQ(s.code(), Status::Code::kUnavailable) << s.ToString();
  EXPECT_NE(s.message().find("5000-byte literal (4000 bytes missing)"), std::string::npos)
      << s.ToString();
  EXPECT_EQ(got, std::string(1000, 'a'));
  EXPECT_EQ(Client().state(), ImapClient::State::kDisconnected);
  ASSERT_TRUE(RunLoopUntil(
      base_, [&] { return disconnects == 1; }, Seconds(5)));
  EXPECT_EQ(disconnect_status.code(), Status::Code::kUnavailable);
  // Later commands fail at once instead of hanging.
  Status later =
      AwaitStatus(base_, [&](ImapClient::StatusCallback cb) { Client().Noop(std::move(cb)); });
  EXPECT_EQ(later.code(), Status::Code::kUnavailable);
}

TEST_F(ImapClientFakeServerTest, GarbageGreetingFailsConnectWithCorruption) {
  FakeServer server([](FakeServer::Conn& c) {
    c.Send("HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n");
    c.WaitForClose();
  });
  Status s = Connect(server);
  EXPECT_EQ(s.code(), Status::Code::kCorruption) << s.ToString();
  EXPECT_NE(s.message().find("HTTP/1.1 400"), std::string::npos) << s.ToString();
  EXPECT_EQ(Client().state(), ImapClient::State::kDisconnected);
}

TEST_F(ImapClientFakeServerTest, GarbageAnswerFailsTheCommandWithCorruption) {
  FakeServer server([](FakeServer::Conn& c) {
    c.GreetAndLogin();
    c.ReadTag();
    c.Send("\x01\xff garbage (((\r\n");
    c.WaitForClose();
  });
  ASSERT_TRUE(Connect(server).ok());
  Status s =
      AwaitStatus(base_, [&](ImapClient::StatusCallback cb) { Client().Noop(std::move(cb)); });
  EXPECT_EQ(s.code(), Status::Code::kCorruption) << s.ToString();
}

TEST_F(ImapClientFakeServerTest, SilentServerTimesOutTheCommand) {
  FakeServer server([](FakeServer::Conn& c) {
    c.GreetAndLogin();
    c.ReadTag();  // SELECT, never answered
    c.WaitForClose();
  });
  ASSERT_TRUE(Connect(server).ok());
  const auto start = std::chrono::steady_clock::now();
  Result<MailboxStatus> r = SelectInbox();
  const auto took = std::chrono::steady_clock::now() - start;
  EXPECT_EQ(r.status().code(), Status::Code::kTimedOut) << r.status().ToString();
  EXPECT_NE(r.status().message().find("SELECT"), std::string::npos) << r.status().ToString();
  EXPECT_GE(took, std::chrono::milliseconds(450));
  EXPECT_LT(took, std::chrono::seconds(5));
  EXPECT_EQ(Client().state(), ImapClient::State::kDisconnected);
}

TEST_F(ImapClientFakeServerTest, ServerThatNeverGreetsTimesOutConnect) {
  FakeServer server([](FakeServer::Conn& c) { c.WaitForClose(); });
  Status s = Connect(server);
  EXPECT_EQ(s.code(), Status::Code::kTimedOut) << s.ToString();
  EXPECT_NE(s.message().find("connecting"), std::string::npos) << s.ToString();
}

TEST_F(ImapClientFakeServerTest, SlowButSteadyBodyDoesNotTimeOut) {
  // The timeout counts silence, not the length of a transfer: a body that keeps coming in
  // pieces for longer than command_timeout completes.
  FakeServer server([](FakeServer::Conn& c) {
    c.GreetAndLogin();
    c.AnswerSelect();
    const std::string tag = c.ReadTag();
    c.Send("* 1 FETCH (UID 3 BODY[] {40}\r\n");
    for (int i = 0; i < 8; ++i) {
      c.Send("12345");
      pollfd none{-1, 0, 0};
      ::poll(&none, 0, 150);  // the server is slow; 8 x 150 ms > the 500 ms timeout
    }
    c.Send(")\r\n" + tag + " OK done\r\n");
    c.WaitForClose();
  });
  ASSERT_TRUE(Connect(server).ok());
  ASSERT_TRUE(SelectInbox().ok());
  std::string got;
  Status s = FetchBodyInto(3, &got);
  EXPECT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(got.size(), 40u);
}

TEST_F(ImapClientFakeServerTest, BodyBeforeUidIsStillRouted) {
  FakeServer server([](FakeServer::Conn& c) {
    c.GreetAndLogin();
    c.AnswerSelect();
    const std::string tag = c.ReadTag();
    c.Send("* 1 FETCH (BODY[] {5}\r\nhello UID 7 FLAGS (\\Seen))\r\n" + tag + " OK done\r\n");
    c.WaitForClose();
  });
  ASSERT_TRUE(Connect(server).ok());
  ASSERT_TRUE(SelectInbox().ok());
  std::string got;
  Status s = FetchBodyInto(7, &got);
  EXPECT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(got, "hello");
}

// dovecot's answer for a message another session expunged, before this session is told:
// `BODY[] NIL` and a tagged OK. That is no message, not a message of 0 bytes (a reader of the
// Maildir view read 0 bytes as the whole message before this).
TEST_F(ImapClientFakeServerTest, NilBodyIsNoMessage) {
  FakeServer server([](FakeServer::Conn& c) {
    c.GreetAndLogin();
    c.AnswerSelect();
    const std::string tag = c.ReadTag();
    c.Send("* 1 FETCH (UID 7 BODY[] NIL)\r\n" + tag + " OK Fetch completed.\r\n");
    c.WaitForClose();
  });
  ASSERT_TRUE(Connect(server).ok());
  ASSERT_TRUE(SelectInbox().ok());
  std::string got;
  Status s = FetchBodyInto(7, &got);
  EXPECT_EQ(s.code(), Status::Code::kNotFound) << s.ToString();
  EXPECT_EQ(got, "");
}

// An APPEND in doubt of a message without a Message-ID (common/imap/find_appended.h): the
// server is asked for the messages of the days around the APPEND's INTERNALDATE, and only
// those are summarised (never UID FETCH 1:*); the candidates with the exact INTERNALDATE are
// compared, newest first, and the one with the same bytes (CRs aside) is the one found.
TEST_F(ImapClientFakeServerTest, FindAppendedWithoutMessageIdSearchesByDateAndFetchesOnlyThose) {
  const std::int64_t when = 1'700'000'000;  // 14-Nov-2023 22:13:20 +0000
  const std::string body = "From: a@b\nSubject: no id\n\nsame bytes\n";
  std::vector<std::string> lines;  // what the client sent after SELECT (read after the join)
  {
    FakeServer server([&lines](FakeServer::Conn& c) {
      c.GreetAndLogin();
      c.AnswerSelect();
      std::string line;
      std::string tag = c.ReadTag(&line);
      lines.push_back(line.substr(line.find(' ') + 1));
      c.Send("* SEARCH 4 6 7\r\n" + tag + " OK Search completed.\r\n");
      tag = c.ReadTag(&line);
      lines.push_back(line.substr(line.find(' ') + 1));
      c.Send("* 1 FETCH (UID 4 FLAGS () RFC822.SIZE 40 INTERNALDATE \"14-Nov-2023 22:13:19 +0000\")\r\n"
             "* 2 FETCH (UID 6 FLAGS () RFC822.SIZE 40 INTERNALDATE \"14-Nov-2023 23:13:20 +0100\")\r\n"
             "* 3 FETCH (UID 7 FLAGS () RFC822.SIZE 40 INTERNALDATE \"14-Nov-2023 22:13:20 +0000\")\r\n" +
             tag + " OK Fetch completed.\r\n");
      for (const char* uid : {"7", "6"}) {  // newest first; 4 has another date
        tag = c.ReadTag(&line);
        lines.push_back(line.substr(line.find(' ') + 1));
        std::string got = std::string(uid) == "6" ? "From: a@b\r\nSubject: no id\r\n\r\nsame bytes\r\n"
                                                  : "From: a@b\r\nSubject: no id\r\n\r\nother bytes\r\n";
        c.Send("* 1 FETCH (UID " + std::string(uid) + " BODY[] {" + std::to_string(got.size()) + "}\r\n" +
               got + ")\r\n" + tag + " OK Fetch completed.\r\n");
      }
      c.WaitForClose();
    });
    ASSERT_TRUE(Connect(server).ok());
    ASSERT_TRUE(SelectInbox().ok());
    Result<std::uint32_t> found = Await<std::uint32_t>(base_, [&](ImapClient::ResultCallback<std::uint32_t> cb) {
      FindAppended(Client(), std::make_shared<const std::string>(body), when,
                   [](std::function<void(Status)> step) { step(Status::Ok()); }, std::move(cb));
    });
    ASSERT_TRUE(found.ok()) << found.status().ToString();
    EXPECT_EQ(*found, 6u);
    client_.reset();
  }
  ASSERT_EQ(lines.size(), 4u);
  EXPECT_EQ(lines[0], "UID SEARCH SINCE 13-Nov-2023 BEFORE 16-Nov-2023");
  EXPECT_EQ(lines[1], "UID FETCH 4,6,7 (UID FLAGS RFC822.SIZE INTERNALDATE)");
  EXPECT_EQ(lines[2], "UID FETCH 7 (UID BODY.PEEK[])");
  EXPECT_EQ(lines[3], "UID FETCH 6 (UID BODY.PEEK[])");
}

// An APPEND in doubt not found in its own mailbox (FindAppendedIn): the other mailboxes are
// searched in turn, each selected first, and the first that holds the same bytes with the same
// INTERNALDATE is the answer; without the APPEND's date nothing is asked (an older copy could
// not be told from ours).
TEST_F(ImapClientFakeServerTest, FindAppendedInLooksInEachMailboxUntilOneHoldsTheMessage) {
  const std::int64_t when = 1'700'000'000;  // 14-Nov-2023 22:13:20 +0000
  const std::string body = "From: a@b\nMessage-ID: <m1@ghost.test>\nSubject: moved\n\nbytes\n";
  std::vector<std::string> lines;
  std::vector<std::string> selected;
  {
    FakeServer server([&lines](FakeServer::Conn& c) {
      c.GreetAndLogin();
      std::string line;
      std::string tag = c.ReadTag(&line);  // Work: no such Message-ID
      lines.push_back(line.substr(line.find(' ') + 1));
      c.Send("* SEARCH\r\n" + tag + " OK Search completed.\r\n");
      tag = c.ReadTag(&line);  // Archive: UID 9
      lines.push_back(line.substr(line.find(' ') + 1));
      c.Send("* SEARCH 9\r\n" + tag + " OK Search completed.\r\n");
      tag = c.ReadTag(&line);
      lines.push_back(line.substr(line.find(' ') + 1));
      c.Send("* 1 FETCH (UID 9 FLAGS () RFC822.SIZE 60 INTERNALDATE \"14-Nov-2023 22:13:20 +0000\")\r\n" + tag +
             " OK Fetch completed.\r\n");
      tag = c.ReadTag(&line);
      lines.push_back(line.substr(line.find(' ') + 1));
      const std::string got = "From: a@b\r\nMessage-ID: <m1@ghost.test>\r\nSubject: moved\r\n\r\nbytes\r\n";
      c.Send("* 1 FETCH (UID 9 BODY[] {" + std::to_string(got.size()) + "}\r\n" + got + ")\r\n" + tag +
             " OK Fetch completed.\r\n");
      c.WaitForClose();
    });
    ASSERT_TRUE(Connect(server).ok());
    SelectMailbox select = [&selected](const std::string& wire, std::function<void(Status)> step) {
      selected.push_back(wire);
      step(Status::Ok());
    };
    Result<std::string> found = Await<std::string>(base_, [&](ImapClient::ResultCallback<std::string> cb) {
      FindAppendedIn(Client(), std::make_shared<const std::string>(body), when, {"Work", "Archive", "Trash"},
                     select, std::move(cb));
    });
    ASSERT_TRUE(found.ok()) << found.status().ToString();
    EXPECT_EQ(*found, "Archive");
    // Without the date: nothing is asked, nothing found.
    Result<std::string> undated = Await<std::string>(base_, [&](ImapClient::ResultCallback<std::string> cb) {
      FindAppendedIn(Client(), std::make_shared<const std::string>(body), 0, {"Work", "Archive"}, select,
                     std::move(cb));
    });
    ASSERT_TRUE(undated.ok()) << undated.status().ToString();
    EXPECT_EQ(*undated, "");
    client_.reset();
  }
  ASSERT_EQ(lines.size(), 4u);
  EXPECT_EQ(lines[0], "UID SEARCH HEADER Message-ID \"<m1@ghost.test>\"");
  EXPECT_EQ(lines[1], "UID SEARCH HEADER Message-ID \"<m1@ghost.test>\"");
  EXPECT_EQ(lines[2], "UID FETCH 9 (UID FLAGS RFC822.SIZE INTERNALDATE)");
  EXPECT_EQ(lines[3], "UID FETCH 9 (UID BODY.PEEK[])");
  // Selected before each command of its search; never Trash, after the one that held it.
  ASSERT_FALSE(selected.empty());
  EXPECT_EQ(selected.front(), "Work");
  EXPECT_EQ(selected.back(), "Archive");
  EXPECT_EQ(std::count(selected.begin(), selected.end(), "Trash"), 0);
}

TEST_F(ImapClientFakeServerTest, NoAndBadFailOnlyTheirCommand) {
  FakeServer server([](FakeServer::Conn& c) {
    c.GreetAndLogin();
    std::string tag = c.ReadTag();
    c.Send(tag + " NO [NONEXISTENT] Mailbox doesn't exist: Nope\r\n");
    tag = c.ReadTag();
    c.Send(tag + " BAD Error in IMAP command\r\n");
    tag = c.ReadTag();
    c.Send(tag + " NO [ALREADYEXISTS] Mailbox exists\r\n");
    tag = c.ReadTag();
    c.Send(tag + " OK NOOP done\r\n");
    c.WaitForClose();
  });
  ASSERT_TRUE(Connect(server).ok());
  Result<MailboxStatus> sel = SelectInbox();
  EXPECT_EQ(sel.status().code(), Status::Code::kNotFound) << sel.status().ToString();
  EXPECT_EQ(Client().selected(), "");
  Status bad =
      AwaitStatus(base_, [&](ImapClient::StatusCallback cb) { Client().Noop(std::move(cb)); });
  EXPECT_EQ(bad.code(), Status::Code::kInvalidArgument) << bad.ToString();
  Status exists = AwaitStatus(
      base_, [&](ImapClient::StatusCallback cb) { Client().Create("Archive", std::move(cb)); });
  EXPECT_EQ(exists.code(), Status::Code::kExists) << exists.ToString();
  Status ok =
      AwaitStatus(base_, [&](ImapClient::StatusCallback cb) { Client().Noop(std::move(cb)); });
  EXPECT_TRUE(ok.ok()) << ok.ToString();
  EXPECT_EQ(Client().state(), ImapClient::State::kReady);
}

TEST_F(ImapClientFakeServerTest, AnswerWithUnknownTagIsCorruption) {
  FakeServer server([](FakeServer::Conn& c) {
    c.GreetAndLogin();
    c.ReadTag();
    c.Send("X99 OK what\r\n");
    c.WaitForClose();
  });
  ASSERT_TRUE(Connect(server).ok());
  Status s =
      AwaitStatus(base_, [&](ImapClient::StatusCallback cb) { Client().Noop(std::move(cb)); });
  EXPECT_EQ(s.code(), Status::Code::kCorruption) << s.ToString();
  EXPECT_NE(s.message().find("X99"), std::string::npos);
}

TEST_F(ImapClientFakeServerTest, OversizedLineAndLiteralAreCorruption) {
  options_.max_line_bytes = 1000;
  options_.max_buffered_literal = 100;
  FakeServer server([](FakeServer::Conn& c) {
    c.GreetAndLogin();
    c.ReadTag();
    c.Send("* LIST () \"/\" {1000000}\r\n");
    c.WaitForClose();
  });
  ASSERT_TRUE(Connect(server).ok());
  Result<std::vector<MailboxInfo>> r = Await<std::vector<MailboxInfo>>(
      base_, [&](auto cb) { Client().List("", "*", std::move(cb)); });
  EXPECT_EQ(r.status().code(), Status::Code::kCorruption) << r.status().ToString();
  EXPECT_NE(r.status().message().find("max_buffered_literal"), std::string::npos);

  client_.reset();
  FakeServer server2([](FakeServer::Conn& c) {
    c.GreetAndLogin();
    c.ReadTag();
    c.Send("* " + std::string(5000, 'x'));  // no line end
    c.WaitForClose();
  });
  ASSERT_TRUE(Connect(server2).ok());
  Status s =
      AwaitStatus(base_, [&](ImapClient::StatusCallback cb) { Client().Noop(std::move(cb)); });
  EXPECT_EQ(s.code(), Status::Code::kCorruption) << s.ToString();
  EXPECT_NE(s.message().find("longer than 1000"), std::string::npos) << s.ToString();
}

TEST_F(ImapClientFakeServerTest, DataAfterStartTlsOkIsRefused) {
  options_.starttls = ImapClientOptions::StartTls::kRequired;
  FakeServer server([](FakeServer::Conn& c) {
    c.Send("* OK [CAPABILITY IMAP4rev1 STARTTLS] fake\r\n");
    const std::string tag = c.ReadTag();
    c.Send(tag + " OK Begin TLS\r\n* OK [CAPABILITY IMAP4rev1 AUTH=PLAIN] injected\r\n");
    c.WaitForClose();
  });
  Status s = Connect(server);
  EXPECT_EQ(s.code(), Status::Code::kCorruption) << s.ToString();
  EXPECT_NE(s.message().find("STARTTLS"), std::string::npos) << s.ToString();
}

TEST_F(ImapClientFakeServerTest, StartTlsRequiredButNotOfferedFails) {
  options_.starttls = ImapClientOptions::StartTls::kRequired;
  FakeServer server([](FakeServer::Conn& c) {
    c.Send("* OK [CAPABILITY IMAP4rev1] fake\r\n");
    c.WaitForClose();
  });
  Status s = Connect(server);
  EXPECT_EQ(s.code(), Status::Code::kNotSupported) << s.ToString();
}

TEST_F(ImapClientFakeServerTest, ByeFailsEverythingOutstanding) {
  FakeServer server([](FakeServer::Conn& c) {
    c.GreetAndLogin();
    c.ReadTag();
    c.Send("* BYE server shutting down\r\n");
    c.WaitForClose();
  });
  ASSERT_TRUE(Connect(server).ok());
  Status a, b;
  int done = 0;
  Client().Noop([&](Status s) {
    a = s;
    ++done;
  });
  Client().Noop([&](Status s) {
    b = s;
    ++done;
  });
  ASSERT_TRUE(RunLoopUntil(
      base_, [&] { return done == 2; }, Seconds(5)));
  EXPECT_EQ(a.code(), Status::Code::kUnavailable);
  EXPECT_NE(a.message().find("shutting down"), std::string::npos) << a.ToString();
  EXPECT_EQ(b.code(), Status::Code::kUnavailable);
}

TEST_F(ImapClientFakeServerTest, CloseInsideOnDataStopsCleanly) {
  FakeServer server([](FakeServer::Conn& c) {
    c.GreetAndLogin();
    c.AnswerSelect();
    c.ReadTag();
    c.Send("* 1 FETCH (UID 7 BODY[] {100000}\r\n" + std::string(100000, 'z') + ")\r\n");
    c.WaitForClose();
  });
  ASSERT_TRUE(Connect(server).ok());
  ASSERT_TRUE(SelectInbox().ok());
  int calls = 0;
  Status s = AwaitStatus(base_, [&](ImapClient::StatusCallback cb) {
    Client().FetchBody(
        7,
        [&](std::string_view) {
          ++calls;
          Client().Close();
          return true;
        },
        std::move(cb));
  });
  EXPECT_EQ(s.code(), Status::Code::kUnavailable) << s.ToString();
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(Client().state(), ImapClient::State::kDisconnected);
}

TEST_F(ImapClientFakeServerTest, ConnectionRefusedIsUnavailable) {
  // A port nothing listens on: bind one, close it.
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  socklen_t len = sizeof addr;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  ::close(fd);
  Status s = AwaitStatus(base_, [&](ImapClient::StatusCallback cb) {
    Client().Connect("imap://u@127.0.0.1:" + std::to_string(ntohs(addr.sin_port)) + "/", "", "pw",
                     std::move(cb));
  });
  EXPECT_EQ(s.code(), Status::Code::kUnavailable) << s.ToString();
  EXPECT_NE(s.message().find("refused"), std::string::npos) << s.ToString();
}

TEST_F(ImapClientFakeServerTest, BadArgumentsFailOnTheNextTurnWithoutSending) {
  FakeServer server([](FakeServer::Conn& c) {
    c.GreetAndLogin();
    c.WaitForClose();
  });
  ASSERT_TRUE(Connect(server).ok());
  bool called_inside = false;
  bool returned = false;
  Status s = AwaitStatus(base_, [&](ImapClient::StatusCallback cb) {
    Client().UidStore("1:x", StoreMode::kAdd, {"\\Seen"}, [&, cb](Status st) {
      called_inside = !returned;
      cb(st);
    });
    returned = true;
  });
  EXPECT_EQ(s.code(), Status::Code::kInvalidArgument);
  EXPECT_FALSE(called_inside);
  Status flag = AwaitStatus(base_, [&](ImapClient::StatusCallback cb) {
    Client().UidStore("1", StoreMode::kAdd, {"bad flag"}, std::move(cb));
  });
  EXPECT_EQ(flag.code(), Status::Code::kInvalidArgument);
  ImapClient other(base_, options_);
  Status bad_url = AwaitStatus(base_, [&](ImapClient::StatusCallback cb) {
    other.Connect("http://x/", "u", "p", std::move(cb));
  });
  EXPECT_EQ(bad_url.code(), Status::Code::kInvalidArgument);
  EXPECT_EQ(other.state(), ImapClient::State::kDisconnected);
}

// ---- Against a real dovecot ----

class ImapClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (std::string why = DovecotServer::Unavailable(); !why.empty()) GTEST_SKIP() << why;
    base_ = MakeEventBase();
  }
  void TearDown() override {
    clients_.clear();
    if (base_) event_base_free(base_);
  }

  void StartServer(DovecotServer::Options options = {}) {
    Status s = server_.Start(options);
    ASSERT_TRUE(s.ok()) << s.ToString();
  }

  // A new client, logged in.
  ImapClient& NewClient(ImapClientOptions options = {}) {
    clients_.push_back(std::make_unique<ImapClient>(base_, options));
    ImapClient& c = *clients_.back();
    Status s = AwaitStatus(base_, [&](ImapClient::StatusCallback cb) {
      c.Connect(server_.url(), "", server_.options().password, std::move(cb));
    });
    EXPECT_TRUE(s.ok()) << s.ToString() << "\n" << server_.ReadLog();
    return c;
  }

  Result<MailboxStatus> Select(ImapClient& c, const std::string& mailbox) {
    return Await<MailboxStatus>(base_, [&](ImapClient::ResultCallback<MailboxStatus> cb) {
      c.Select(mailbox, std::move(cb));
    });
  }
  Result<std::vector<MessageSummary>> Summaries(ImapClient& c, const std::string& set = "1:*") {
    return Await<std::vector<MessageSummary>>(base_,
                                              [&](auto cb) { c.FetchSummary(set, std::move(cb)); });
  }
  Result<std::string> Body(ImapClient& c, std::uint32_t uid, int* chunks = nullptr) {
    std::string body;
    int n = 0;
    Status s = AwaitStatus(base_, [&](ImapClient::StatusCallback cb) {
      c.FetchBody(
          uid,
          [&](std::string_view d) {
            body.append(d);
            ++n;
            return true;
          },
          std::move(cb));
    });
    if (chunks) *chunks = n;
    if (!s.ok()) return s;
    return body;
  }
  Result<AppendResult> Append(ImapClient& c, const std::string& mailbox, const std::string& msg,
                              std::vector<std::string> flags = {},
                              std::optional<std::int64_t> date = std::nullopt) {
    return Await<AppendResult>(
        base_, [&](auto cb) { c.Append(mailbox, flags, date, msg, std::move(cb)); });
  }
  const MessageSummary* Find(const std::vector<MessageSummary>& v, std::uint32_t uid) {
    for (const MessageSummary& m : v) {
      if (m.uid == uid) return &m;
    }
    return nullptr;
  }

  event_base* base_ = nullptr;
  DovecotServer server_;
  std::vector<std::unique_ptr<ImapClient>> clients_;
};

TEST_F(ImapClientTest, LogsInAndReadsCapabilities) {
  StartServer();
  ImapClient& c = NewClient();
  EXPECT_EQ(c.state(), ImapClient::State::kReady);
  for (const char* cap : {"IMAP4REV1", "IDLE", "UIDPLUS", "MOVE", "LITERAL+"}) {
    EXPECT_TRUE(c.capabilities().Has(cap)) << cap;
  }
  EXPECT_FALSE(c.capabilities().Has("STARTTLS"));  // ssl = no
  Status out = AwaitStatus(base_, [&](ImapClient::StatusCallback cb) { c.Logout(std::move(cb)); });
  EXPECT_TRUE(out.ok()) << out.ToString();
  EXPECT_EQ(c.state(), ImapClient::State::kDisconnected);
  Status after = AwaitStatus(base_, [&](ImapClient::StatusCallback cb) { c.Noop(std::move(cb)); });
  EXPECT_EQ(after.code(), Status::Code::kUnavailable);
}

TEST_F(ImapClientTest, RefusedLoginSaysSoWithoutThePassword) {
  StartServer();
  ImapClient c(base_, ImapClientOptions{});
  Status s = AwaitStatus(base_, [&](ImapClient::StatusCallback cb) {
    c.Connect(server_.url(), "", "wrong-password-123", std::move(cb));
  });
  EXPECT_EQ(s.code(), Status::Code::kPermissionDenied) << s.ToString();
  EXPECT_EQ(s.ToErrno(), EACCES);
  EXPECT_NE(s.message().find("login refused"), std::string::npos) << s.ToString();
  EXPECT_NE(s.message().find("\"ghost\""), std::string::npos) << s.ToString();
  EXPECT_EQ(s.message().find("wrong-password-123"), std::string::npos) << s.ToString();
  EXPECT_EQ(c.state(), ImapClient::State::kDisconnected);
}

TEST_F(ImapClientTest, ListsMailboxesWithDelimiterAndAttributes) {
  StartServer();
  ASSERT_TRUE(server_.CreateFolder(".Work").ok());
  ASSERT_TRUE(server_.CreateFolder(".Work.Reports").ok());
  ASSERT_TRUE(server_.CreateFolder(".Entw&APw-rfe").ok());
  ASSERT_TRUE(server_.CreateFolder(".Tom &- Jerry").ok());
  ImapClient& c = NewClient();
  Result<std::vector<MailboxInfo>> r =
      Await<std::vector<MailboxInfo>>(base_, [&](auto cb) { c.List("", "*", std::move(cb)); });
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  std::map<std::string, MailboxInfo> by_name;
  for (const MailboxInfo& m : *r) by_name[m.name] = m;
  ASSERT_EQ(by_name.size(), 5u);
  for (const char* n : {"INBOX", "Work", "Work.Reports", "Entw&APw-rfe", "Tom &- Jerry"}) {
    ASSERT_TRUE(by_name.count(n)) << n;
    EXPECT_EQ(by_name[n].delimiter, '.') << n;
  }
  EXPECT_TRUE(by_name["Work"].HasAttribute("\\HasChildren"));
  EXPECT_TRUE(by_name["Work.Reports"].HasAttribute("\\hasnochildren"));
  // The names map to Maildir++ folders and back.
  EXPECT_EQ(*DecodeMutf7(by_name["Entw&APw-rfe"].name), "Entw\xc3\xbcrfe");
  EXPECT_EQ(*MailboxToDirName("Entw&APw-rfe", '.'), ".Entw\xc3\xbcrfe");
  EXPECT_EQ(*MailboxToDirName("Work.Reports", '.'), ".Work.Reports");
}

TEST_F(ImapClientTest, SelectReportsUidValidityUidNextAndExists) {
  StartServer();
  for (unsigned i = 0; i < 3; ++i) ASSERT_TRUE(server_.Seed("", MakeMessage(500, i)).ok());
  ImapClient& c = NewClient();
  Result<MailboxStatus> m = Select(c, "INBOX");
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->exists, 3u);
  EXPECT_EQ(m->uidnext, 4u);
  EXPECT_NE(m->uidvalidity, 0u);
  EXPECT_FALSE(m->read_only);
  EXPECT_NE(std::find(m->flags.begin(), m->flags.end(), "\\Seen"), m->flags.end());
  EXPECT_NE(std::find(m->permanent_flags.begin(), m->permanent_flags.end(), "\\*"),
            m->permanent_flags.end());
  EXPECT_EQ(c.selected(), "INBOX");

  Result<MailboxStatus> ro =
      Await<MailboxStatus>(base_, [&](auto cb) { c.Examine("INBOX", std::move(cb)); });
  ASSERT_TRUE(ro.ok());
  EXPECT_TRUE(ro->read_only);
  EXPECT_EQ(ro->uidvalidity, m->uidvalidity);
  Status store = AwaitStatus(base_, [&](ImapClient::StatusCallback cb) {
    c.UidStore("1", StoreMode::kAdd, {"\\Flagged"}, std::move(cb));
  });
  EXPECT_FALSE(store.ok());

  Result<MailboxStatus> none = Select(c, "Nope");
  EXPECT_EQ(none.status().code(), Status::Code::kNotFound) << none.status().ToString();
  EXPECT_EQ(c.selected(), "");
}

TEST_F(ImapClientTest, FetchesSummariesOfSeededMessages) {
  StartServer();
  const std::vector<std::string> info = {"S", "FS", ""};
  std::vector<std::string> msgs;
  for (unsigned i = 0; i < 3; ++i) {
    msgs.push_back(MakeMessage(700 + i * 111, i));
    Result<std::string> path = server_.Seed("", msgs.back(), info[i]);
    ASSERT_TRUE(path.ok());
    utimbuf t{1600000000 + i, 1600000000 + static_cast<time_t>(i)};
    ASSERT_EQ(::utime(path->c_str(), &t), 0);  // dovecot's INTERNALDATE is the file's mtime
  }
  ImapClient& c = NewClient();
  ASSERT_TRUE(Select(c, "INBOX").ok());
  Result<std::vector<MessageSummary>> r = Summaries(c);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->size(), 3u);
  for (unsigned i = 0; i < 3; ++i) {
    const MessageSummary& m = (*r)[i];
    EXPECT_EQ(m.uid, i + 1);
    EXPECT_EQ(m.seq, i + 1);
    EXPECT_EQ(m.size, msgs[i].size());
    EXPECT_EQ(FlagsToInfo(m.flags), info[i]) << i;
    EXPECT_EQ(m.internaldate_unix, 1600000000 + static_cast<std::int64_t>(i)) << m.internaldate;
    EXPECT_EQ(c.UidForSeq(i + 1), i + 1);
  }
  Result<std::vector<MessageSummary>> one = Summaries(c, "2");
  ASSERT_TRUE(one.ok());
  ASSERT_EQ(one->size(), 1u);
  EXPECT_EQ((*one)[0].uid, 2u);
  // "n:*" past the last UID: the server answers with the last message; it is left out.
  Result<std::vector<MessageSummary>> past = Summaries(c, "10:*");
  ASSERT_TRUE(past.ok());
  EXPECT_TRUE(past->empty());
}

TEST_F(ImapClientTest, FetchesBodiesByteIdenticalFromOneKiBToThreeMiB) {
  StartServer();
  const std::vector<std::size_t> sizes = {1024, 4096 + 7, 65536 + 1, 1024 * 1024 + 3,
                                          3 * 1024 * 1024};
  std::vector<std::string> msgs;
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    msgs.push_back(MakeMessage(sizes[i], static_cast<unsigned>(100 + i)));
    ASSERT_TRUE(server_.Seed("", msgs.back()).ok());
  }
  // Bodies stream: were a body literal kept in memory, more than 4 KiB of it would fail the
  // fetch (kCorruption, max_buffered_literal).
  ImapClientOptions o;
  o.max_buffered_literal = 4096;
  ImapClient& c = NewClient(o);
  ASSERT_TRUE(Select(c, "INBOX").ok());
  Result<std::vector<MessageSummary>> sums = Summaries(c);
  ASSERT_TRUE(sums.ok());
  ASSERT_EQ(sums->size(), sizes.size());
  // One by one.
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    int chunks = 0;
    Result<std::string> body = Body(c, (*sums)[i].uid, &chunks);
    ASSERT_TRUE(body.ok()) << body.status().ToString();
    EXPECT_EQ(body->size(), sizes[i]);
    EXPECT_TRUE(*body == msgs[i]) << "body " << i << " differs";
    if (sizes[i] >= 1024 * 1024) {
      EXPECT_GT(chunks, 1) << "a MiB body should stream in pieces";
    }
  }
  // All at once: pipelined, each body to its own receiver.
  std::vector<std::string> got(sizes.size());
  int done = 0;
  bool all_ok = true;
  const std::uint64_t before = c.bytes_received();
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    c.FetchBody((*sums)[i].uid,
                [&got, i](std::string_view d) {
                  got[i].append(d);
                  return true;
                },
                [&](Status s) {
                  all_ok = all_ok && s.ok();
                  ++done;
                });
  }
  EXPECT_EQ(c.pending(), sizes.size());
  ASSERT_TRUE(RunLoopUntil(base_, [&] { return done == static_cast<int>(sizes.size()); }));
  EXPECT_TRUE(all_ok);
  for (std::size_t i = 0; i < sizes.size(); ++i) EXPECT_TRUE(got[i] == msgs[i]) << i;
  std::uint64_t total = 0;
  for (std::size_t s : sizes) total += s;
  EXPECT_GE(c.bytes_received() - before, total);
  // A UID that is not there.
  Result<std::string> missing = Body(c, 999);
  EXPECT_EQ(missing.status().code(), Status::Code::kNotFound) << missing.status().ToString();
  // The receiver may stop a body; the connection stays usable.
  Status stopped = AwaitStatus(base_, [&](ImapClient::StatusCallback cb) {
    c.FetchBody((*sums)[4].uid, [](std::string_view) { return false; }, std::move(cb));
  });
  EXPECT_EQ(stopped.code(), Status::Code::kIoError) << stopped.ToString();
  Result<std::string> again = Body(c, (*sums)[0].uid);
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE(*again == msgs[0]);
}

TEST_F(ImapClientTest, AppendsThenFetchesWhatItAppended) {
  StartServer();
  ImapClient& c = NewClient();
  Result<MailboxStatus> m = Select(c, "INBOX");
  ASSERT_TRUE(m.ok());
  const std::string msg = MakeMessage(20000, 7);
  Result<AppendResult> a =
      Append(c, "INBOX", msg, {"\\Seen", "\\Flagged", "$Forwarded"}, 1500000000);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_EQ(a->uidvalidity, m->uidvalidity);
  EXPECT_EQ(a->uid, m->uidnext);
  Result<std::vector<MessageSummary>> sums = Summaries(c, std::to_string(a->uid));
  ASSERT_TRUE(sums.ok());
  ASSERT_EQ(sums->size(), 1u);
  EXPECT_EQ(FlagsToInfo((*sums)[0].flags), "FPS");
  EXPECT_EQ((*sums)[0].internaldate_unix, 1500000000);
  EXPECT_EQ((*sums)[0].size, msg.size());
  Result<std::string> body = Body(c, a->uid);
  ASSERT_TRUE(body.ok());
  EXPECT_TRUE(*body == msg);
  // Appends pipeline (LITERAL+): five at once, distinct UIDs, all there.
  std::vector<AppendResult> results;
  int failures = 0;
  for (unsigned i = 0; i < 5; ++i) {
    c.Append("INBOX", {}, std::nullopt, MakeMessage(3000, 50 + i), [&](Result<AppendResult> r) {
      if (r.ok()) {
        results.push_back(*r);
      } else {
        ++failures;
      }
    });
  }
  ASSERT_TRUE(RunLoopUntil(base_, [&] { return results.size() + failures == 5; }));
  EXPECT_EQ(failures, 0);
  std::set<std::uint32_t> uids;
  for (const AppendResult& r : results) uids.insert(r.uid);
  EXPECT_EQ(uids.size(), 5u);
  Result<std::vector<MessageSummary>> all = Summaries(c);
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(all->size(), 6u);
  // Appending to a mailbox that does not exist: TRYCREATE.
  Result<AppendResult> nope = Append(c, "Nope", msg);
  EXPECT_EQ(nope.status().code(), Status::Code::kNotFound) << nope.status().ToString();
}

TEST_F(ImapClientTest, StoresFlagsAndSeesThem) {
  StartServer();
  ASSERT_TRUE(server_.Seed("", MakeMessage(900, 1), "S").ok());
  ImapClient& c = NewClient();
  ASSERT_TRUE(Select(c, "INBOX").ok());
  auto store = [&](StoreMode mode, std::vector<std::string> flags) {
    return AwaitStatus(
        base_, [&](ImapClient::StatusCallback cb) { c.UidStore("1", mode, flags, std::move(cb)); });
  };
  auto info = [&]() {
    Result<std::vector<MessageSummary>> r = Summaries(c, "1");
    return r.ok() && r->size() == 1 ? FlagsToInfo((*r)[0].flags) : std::string("?");
  };
  ASSERT_TRUE(store(StoreMode::kAdd, {"\\Flagged", "\\Answered"}).ok());
  EXPECT_EQ(info(), "FRS");
  ASSERT_TRUE(store(StoreMode::kRemove, {"\\Seen"}).ok());
  EXPECT_EQ(info(), "FR");
  ASSERT_TRUE(store(StoreMode::kReplace, {"\\Draft"}).ok());
  EXPECT_EQ(info(), "D");
}

TEST_F(ImapClientTest, SearchesByMessageIdHeader) {
  StartServer();
  for (unsigned i = 1; i <= 3; ++i) ASSERT_TRUE(server_.Seed("", MakeMessage(700, i)).ok());
  ASSERT_TRUE(server_.Seed("", MakeMessage(700, 2)).ok());  // a second copy of <2@ghost>
  ImapClient& c = NewClient();
  ASSERT_TRUE(Select(c, "INBOX").ok());
  auto search = [&](std::string field, std::string value) {
    return Await<std::vector<std::uint32_t>>(
        base_, [&](auto cb) { c.UidSearchHeader(field, value, std::move(cb)); });
  };
  Result<std::vector<std::uint32_t>> one = search("Message-ID", "<3@ghost>");
  ASSERT_TRUE(one.ok()) << one.status().ToString();
  EXPECT_EQ(*one, (std::vector<std::uint32_t>{3}));
  Result<std::vector<std::uint32_t>> two = search("Message-ID", "<2@ghost>");
  ASSERT_TRUE(two.ok());
  EXPECT_EQ(*two, (std::vector<std::uint32_t>{2, 4}));
  Result<std::vector<std::uint32_t>> none = search("Message-ID", "<nope@ghost>");
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->empty());
  Result<std::vector<std::uint32_t>> bad = search("Message ID", "x");
  EXPECT_EQ(bad.status().code(), Status::Code::kInvalidArgument);
}

TEST_F(ImapClientTest, ExpungesDeletedMessagesAndReportsTheirUids) {
  StartServer();
  for (unsigned i = 0; i < 3; ++i) ASSERT_TRUE(server_.Seed("", MakeMessage(600, i)).ok());
  ImapClient& c = NewClient();
  ASSERT_TRUE(Select(c, "INBOX").ok());
  ASSERT_TRUE(Summaries(c).ok());  // fills the sequence map
  std::vector<MailboxEvent> events;
  c.SetEventHandler([&](const MailboxEvent& e) { events.push_back(e); });
  ASSERT_TRUE(AwaitStatus(base_, [&](ImapClient::StatusCallback cb) {
                c.UidStore("2", StoreMode::kAdd, {"\\Deleted"}, std::move(cb));
              }).ok());
  Status ex =
      AwaitStatus(base_, [&](ImapClient::StatusCallback cb) { c.UidExpunge("2", std::move(cb)); });
  ASSERT_TRUE(ex.ok()) << ex.ToString();
  Result<std::vector<MessageSummary>> r = Summaries(c);
  ASSERT_TRUE(r.ok());
  ASSERT_EQ(r->size(), 2u);
  EXPECT_EQ((*r)[0].uid, 1u);
  EXPECT_EQ((*r)[1].uid, 3u);
  bool saw = false;
  for (const MailboxEvent& e : events) {
    if (e.kind == MailboxEvent::Kind::kExpunge) {
      EXPECT_EQ(e.number, 2u);
      EXPECT_EQ(e.uid, 2u);
      saw = true;
    }
  }
  EXPECT_TRUE(saw);
  EXPECT_EQ(c.UidForSeq(2), 3u);
}

TEST_F(ImapClientTest, MovesMessagesToAnotherMailbox) {
  StartServer();
  for (unsigned i = 0; i < 3; ++i) ASSERT_TRUE(server_.Seed("", MakeMessage(800, i)).ok());
  ImapClient& c = NewClient();
  ASSERT_TRUE(AwaitStatus(base_, [&](ImapClient::StatusCallback cb) {
                c.Create("Archive", std::move(cb));
              }).ok());
  ASSERT_TRUE(Select(c, "INBOX").ok());
  Result<std::string> body2 = Body(c, 2);
  ASSERT_TRUE(body2.ok());
  Result<MoveResult> mv =
      Await<MoveResult>(base_, [&](auto cb) { c.UidMove("2:3", "Archive", std::move(cb)); });
  ASSERT_TRUE(mv.ok()) << mv.status().ToString();
  ASSERT_EQ(mv->uids.size(), 2u);
  EXPECT_EQ(mv->uids[0].first, 2u);
  EXPECT_NE(mv->uidvalidity, 0u);
  Result<std::vector<MessageSummary>> left = Summaries(c);
  ASSERT_TRUE(left.ok());
  ASSERT_EQ(left->size(), 1u);
  EXPECT_EQ((*left)[0].uid, 1u);
  Result<MailboxStatus> arch = Select(c, "Archive");
  ASSERT_TRUE(arch.ok());
  EXPECT_EQ(arch->exists, 2u);
  EXPECT_EQ(arch->uidvalidity, mv->uidvalidity);
  Result<std::string> moved = Body(c, mv->uids[0].second);
  ASSERT_TRUE(moved.ok());
  EXPECT_TRUE(*moved == *body2);
}

// A server that advertises neither MOVE, UIDPLUS nor LITERAL+: MOVE becomes COPY + STORE +
// EXPUNGE, APPEND waits for the server's "+", and nothing is lost.
TEST_F(ImapClientTest, FallsBackWithoutMoveUidplusAndLiteralPlus) {
  DovecotServer::Options o;
  o.capabilities = "IMAP4rev1 IDLE";
  StartServer(o);
  for (unsigned i = 0; i < 2; ++i) ASSERT_TRUE(server_.Seed("", MakeMessage(800, i)).ok());
  ImapClient& c = NewClient();
  EXPECT_FALSE(c.capabilities().move());
  EXPECT_FALSE(c.capabilities().uidplus());
  EXPECT_FALSE(c.capabilities().literal_plus());
  ASSERT_TRUE(AwaitStatus(base_, [&](ImapClient::StatusCallback cb) {
                c.Create("Archive", std::move(cb));
              }).ok());
  ASSERT_TRUE(Select(c, "INBOX").ok());
  // Sync literals: the appends go one at a time, each after the server's "+".
  const std::string msg = MakeMessage(5000, 9);
  int appended = 0;
  for (int i = 0; i < 3; ++i) {
    c.Append("INBOX", {"\\Seen"}, std::nullopt, msg, [&](Result<AppendResult> r) {
      EXPECT_TRUE(r.ok()) << r.status().ToString();
      ++appended;
    });
  }
  ASSERT_TRUE(RunLoopUntil(base_, [&] { return appended == 3; }));
  Result<MoveResult> mv =
      Await<MoveResult>(base_, [&](auto cb) { c.UidMove("1", "Archive", std::move(cb)); });
  ASSERT_TRUE(mv.ok()) << mv.status().ToString();
  Result<std::vector<MessageSummary>> left = Summaries(c);
  ASSERT_TRUE(left.ok());
  EXPECT_EQ(left->size(), 4u);
  EXPECT_EQ(Find(*left, 1), nullptr);
  Result<MailboxStatus> arch = Select(c, "Archive");
  ASSERT_TRUE(arch.ok());
  EXPECT_EQ(arch->exists, 1u);
}

TEST_F(ImapClientTest, IdleReceivesExistsWhenAnotherClientAppends) {
  StartServer();
  ASSERT_TRUE(server_.Seed("", MakeMessage(700, 1)).ok());
  ImapClient& watcher = NewClient();
  ASSERT_TRUE(Select(watcher, "INBOX").ok());
  ASSERT_TRUE(Summaries(watcher).ok());
  std::vector<MailboxEvent> events;
  watcher.SetEventHandler([&](const MailboxEvent& e) { events.push_back(e); });
  ASSERT_TRUE(watcher.StartIdle().ok());
  ASSERT_TRUE(RunLoopUntil(
      base_, [&] { return watcher.idling(); }, Seconds(10)));

  ImapClient& other = NewClient();
  ASSERT_TRUE(Append(other, "INBOX", MakeMessage(1234, 2)).ok());
  auto saw_exists = [&](std::uint32_t n) {
    for (const MailboxEvent& e : events) {
      if (e.kind == MailboxEvent::Kind::kExists && e.number == n) return true;
    }
    return false;
  };
  ASSERT_TRUE(RunLoopUntil(
      base_, [&] { return saw_exists(2); }, Seconds(10)));
  EXPECT_TRUE(watcher.idling());  // it came while idling, not in answer to a command

  // A command while idling ends IDLE, runs, and IDLE resumes.
  Result<std::vector<MessageSummary>> fresh = Summaries(watcher, "2:*");
  ASSERT_TRUE(fresh.ok()) << fresh.status().ToString();
  ASSERT_EQ(fresh->size(), 1u);
  EXPECT_EQ((*fresh)[0].size, 1234u);
  ASSERT_TRUE(RunLoopUntil(
      base_, [&] { return watcher.idling(); }, Seconds(10)));

  // Flags changed elsewhere arrive as FETCH events with the UID.
  ASSERT_TRUE(Select(other, "INBOX").ok());
  ASSERT_TRUE(AwaitStatus(base_, [&](ImapClient::StatusCallback cb) {
                other.UidStore("1", StoreMode::kAdd, {"\\Flagged"}, std::move(cb));
              }).ok());
  auto saw_flag = [&] {
    for (const MailboxEvent& e : events) {
      if (e.kind == MailboxEvent::Kind::kFetch && e.uid == 1 && e.flags &&
          FlagsToInfo(*e.flags).find('F') != std::string::npos) {
        return true;
      }
    }
    return false;
  };
  ASSERT_TRUE(RunLoopUntil(base_, saw_flag, Seconds(10)));
  watcher.StopIdle();
  ASSERT_TRUE(RunLoopUntil(
      base_, [&] { return !watcher.idling() && watcher.pending() == 0; }, Seconds(10)));
}

TEST_F(ImapClientTest, IdleReceivesExistsWhenAFileIsDeliveredIntoNew) {
  StartServer();
  ImapClientOptions o;
  o.idle_refresh = Duration::zero();
  ImapClient& c = NewClient(o);
  ASSERT_TRUE(Select(c, "INBOX").ok());
  std::vector<MailboxEvent> events;
  c.SetEventHandler([&](const MailboxEvent& e) { events.push_back(e); });
  ASSERT_TRUE(c.StartIdle().ok());
  ASSERT_TRUE(RunLoopUntil(
      base_, [&] { return c.idling(); }, Seconds(10)));
  // While idling the client has no timer armed at all (idle_refresh is off): nothing ticks.
  int timers = 0;
  event_base_foreach_event(
      base_,
      [](const event_base*, const event* ev, void* n) {
        // No fd and no signal: a timer (event_pending would deadlock in here: the base's
        // lock is held).
        if (event_get_fd(ev) < 0 && !(event_get_events(ev) & (EV_READ | EV_WRITE | EV_SIGNAL))) {
          ++*static_cast<int*>(n);
        }
        return 0;
      },
      &timers);
  EXPECT_EQ(timers, 0);
  ASSERT_TRUE(server_.Seed("", MakeMessage(2048, 3), "", /*into_new=*/true).ok());
  ASSERT_TRUE(RunLoopUntil(
      base_,
      [&] {
        return std::any_of(events.begin(), events.end(), [](const MailboxEvent& e) {
          return e.kind == MailboxEvent::Kind::kExists && e.number == 1;
        });
      },
      Seconds(15)));
}

// RFC 2177: IDLE is ended and restarted before servers give up on it (29 min by default;
// 200 ms here). The restarts are the only traffic, and events still arrive after them.
TEST_F(ImapClientTest, IdleIsRefreshedAndKeepsDeliveringEvents) {
  StartServer();
  ImapClientOptions o;
  o.idle_refresh = Millis(200);
  ImapClient& c = NewClient(o);
  ASSERT_TRUE(Select(c, "INBOX").ok());
  std::vector<MailboxEvent> events;
  c.SetEventHandler([&](const MailboxEvent& e) { events.push_back(e); });
  ASSERT_TRUE(c.StartIdle().ok());
  ASSERT_TRUE(RunLoopUntil(
      base_, [&] { return c.idling(); }, Seconds(10)));
  const std::uint64_t before = c.bytes_received();
  // Each refresh brings IDLE's tagged OK and a new "+ idling" (dozens of bytes).
  ASSERT_TRUE(RunLoopUntil(
      base_, [&] { return c.bytes_received() > before + 100; }, Seconds(10)));
  EXPECT_EQ(c.pending(), 0u);
  ImapClient& other = NewClient();
  ASSERT_TRUE(Append(other, "INBOX", MakeMessage(999, 5)).ok());
  ASSERT_TRUE(RunLoopUntil(
      base_,
      [&] {
        return std::any_of(events.begin(), events.end(), [](const MailboxEvent& e) {
          return e.kind == MailboxEvent::Kind::kExists && e.number == 1;
        });
      },
      Seconds(10)));
}

TEST_F(ImapClientTest, ServerGoingAwayWhileIdlingCallsTheDisconnectHandler) {
  StartServer();
  ImapClient& c = NewClient();
  ASSERT_TRUE(Select(c, "INBOX").ok());
  std::optional<Status> lost;
  c.SetDisconnectHandler([&](Status s) { lost = s; });
  ASSERT_TRUE(c.StartIdle().ok());
  ASSERT_TRUE(RunLoopUntil(
      base_, [&] { return c.idling(); }, Seconds(10)));
  server_.Stop();
  ASSERT_TRUE(RunLoopUntil(
      base_, [&] { return lost.has_value(); }, Seconds(15)));
  EXPECT_EQ(lost->code(), Status::Code::kUnavailable) << lost->ToString();
  EXPECT_EQ(c.state(), ImapClient::State::kDisconnected);
  EXPECT_FALSE(c.idling());
}

TEST_F(ImapClientTest, ResolvesHostNames) {
  StartServer();
  ImapClient c(base_, ImapClientOptions{});
  Status s = AwaitStatus(base_, [&](ImapClient::StatusCallback cb) {
    c.Connect("imap://ghost@localhost:" + std::to_string(server_.port()) + "/", "",
              server_.options().password, std::move(cb));
  });
  // localhost may resolve to ::1 first where it exists; dovecot listens on 127.0.0.1 only.
  if (!s.ok() && s.message().find("refused") != std::string::npos) {
    GTEST_SKIP() << "localhost resolved to an address dovecot does not listen on: " << s.ToString();
  }
  EXPECT_TRUE(s.ok()) << s.ToString();
  ImapClient other(base_, ImapClientOptions{});
  Status unknown = AwaitStatus(base_, [&](ImapClient::StatusCallback cb) {
    other.Connect("imap://u@no-such-host.invalid/", "", "pw", std::move(cb));
  });
  EXPECT_EQ(unknown.code(), Status::Code::kUnavailable) << unknown.ToString();
}

class ImapClientTlsTest : public ImapClientTest {
 protected:
  void SetUp() override {
    ImapClientTest::SetUp();
    if (IsSkipped()) return;
    DovecotServer::Options o;
    o.tls = true;
    StartServer(o);
  }
  Status ConnectWith(const std::string& url, ImapClientOptions o, ImapClient** out = nullptr) {
    clients_.push_back(std::make_unique<ImapClient>(base_, o));
    ImapClient* c = clients_.back().get();
    if (out) *out = c;
    return AwaitStatus(base_, [&](ImapClient::StatusCallback cb) {
      c->Connect(url, "", server_.options().password, std::move(cb));
    });
  }
};

TEST_F(ImapClientTlsTest, ImapsWithTrustedCertificateWorks) {
  ImapClientOptions o;
  o.ca_file = server_.cert_path();
  ImapClient* c = nullptr;
  Status s = ConnectWith(server_.imaps_url(), o, &c);
  ASSERT_TRUE(s.ok()) << s.ToString() << "\n" << server_.ReadLog();
  ASSERT_TRUE(server_.Seed("", MakeMessage(300000, 4)).ok());
  ASSERT_TRUE(Select(*c, "INBOX").ok());
  Result<std::string> body = Body(*c, 1);
  ASSERT_TRUE(body.ok()) << body.status().ToString();
  EXPECT_TRUE(*body == MakeMessage(300000, 4));
}

TEST_F(ImapClientTlsTest, StartTlsUpgradesPlainConnections) {
  ImapClientOptions o;
  o.ca_file = server_.cert_path();
  o.starttls = ImapClientOptions::StartTls::kRequired;
  ImapClient* c = nullptr;
  Status s = ConnectWith(server_.url(), o, &c);
  ASSERT_TRUE(s.ok()) << s.ToString() << "\n" << server_.ReadLog();
  EXPECT_FALSE(c->capabilities().starttls());  // capabilities were re-read inside TLS
  EXPECT_TRUE(c->capabilities().idle());
  EXPECT_NE(server_.WaitForLog("TLS").find("TLS"), std::string::npos);
}

TEST_F(ImapClientTlsTest, UntrustedCertificateFailsWithAClearMessage) {
  Status s = ConnectWith(server_.imaps_url(), ImapClientOptions{});  // system CAs only
  EXPECT_EQ(s.code(), Status::Code::kIoError) << s.ToString();
  EXPECT_NE(s.message().find("certificate verify failed"), std::string::npos) << s.ToString();
  // The hint names the option and the config key that exist (cacert), not the client's field.
  EXPECT_NE(s.message().find("--cacert"), std::string::npos) << s.ToString();
  EXPECT_NE(s.message().find("cacert = "), std::string::npos) << s.ToString();
  EXPECT_EQ(s.message().find("ca_file"), std::string::npos) << s.ToString();
  ImapClientOptions insecure;
  insecure.verify_peer = false;
  EXPECT_TRUE(ConnectWith(server_.imaps_url(), insecure).ok());
}

}  // namespace
}  // namespace ghost
