// libFuzzer target for the control socket's request lines (common/control/control.h). Built and
// run by tests/fuzz/fuzz.sh.
//
// One ControlServer runs on a private event_base for the whole run. Each input is sent, as
// raw bytes, by a fresh client that then shuts down its sending side and reads every reply
// until the server closes. The handler answers some ops at once, throws for some, answers
// others later (after the next loop turn) and drops some unanswered, so every path of Reply
// is taken. Checked: the server survives (no crash, no uncaught exception, no sanitizer
// report), every reply is one JSON object line with "id" and "ok", and every non-blank request
// line gets exactly one reply (up to an over-long line, which gets one error and the close).
#include <sys/socket.h>
#include <sys/un.h>
#include <poll.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include <event2/event.h>

#include "common/control/control.h"

namespace {

using nlohmann::json;

constexpr std::size_t kMaxLine = 1024;

[[noreturn]] void Die(const char* what, std::string_view detail) {
  std::fprintf(stderr, "control_fuzz: %s\n%.*s\n", what, static_cast<int>(detail.size()),
               detail.data());
  std::abort();
}

// The request object, whether the handler is given it directly or inside a parsed request
// (a struct with a `json` member): the target builds against either form of the API.
const json& JsonOf(const json& j) { return j; }
template <typename Request>
auto JsonOf(const Request& r) -> decltype((r.json)) {
  return r.json;
}

struct Fixture {
  event_base* base = nullptr;
  std::unique_ptr<ghost::ControlServer> server;
  std::string path;
  std::vector<ghost::ControlServer::Reply> later;  // answered on the next loop turn

  Fixture() {
    char dir[] = "/tmp/control_fuzz.XXXXXX";
    if (mkdtemp(dir) == nullptr) Die("mkdtemp failed", "");
    path = std::string(dir) + "/control.sock";
    base = event_base_new();
    ghost::ControlServerOptions options;
    options.max_request_line = kMaxLine;
    auto listening = ghost::ControlServer::Listen(
        base, path,
        [this](const auto& parsed, ghost::ControlServer::Reply reply) {
          const json& request = JsonOf(parsed);
          const std::string op = request.at("op").template get<std::string>();
          if (op == "stats") throw std::runtime_error("thrown by the fuzz handler");
          if (op == "lookup") return;  // dropped unanswered: "internal error" reply
          if (op == "flush") {
            later.push_back(reply);
            return;
          }
          if (op == "status") {
            reply.Error("no such file");
            return;
          }
          reply(request);  // echoes everything back, invalid UTF-8 included
        });
    if (!listening.ok()) Die("Listen failed", listening.status().message());
    server = std::move(*listening);
  }
};

Fixture& F() {
  static Fixture* f = new Fixture();  // lives for the whole run
  return *f;
}

// The replies the input is owed: its non-blank lines, up to and including an over-long one.
std::size_t ExpectedReplies(std::string_view in) {
  std::size_t n = 0;
  std::size_t pos = 0;
  while (pos < in.size()) {
    std::size_t nl = in.find('\n', pos);
    const std::size_t end = nl == std::string_view::npos ? in.size() : nl;
    std::string_view line = in.substr(pos, end - pos);
    if (line.size() > kMaxLine) return n + 1;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.find_first_not_of(" \t") != std::string_view::npos) ++n;
    if (nl == std::string_view::npos) break;
    pos = nl + 1;
  }
  return n;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  Fixture& f = F();
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", f.path.c_str());
  if (fd < 0 || ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0)
    Die("connect failed", f.path);
  std::size_t sent = 0;
  std::string got;
  bool eof = false;
  bool shut = false;
  for (int turns = 0; !eof; ++turns) {
    if (turns > 100000) Die("the server never closed the connection", got);
    if (sent < size) {
      const ssize_t n = ::send(fd, data + sent, size - sent, MSG_NOSIGNAL);
      if (n > 0) sent += static_cast<std::size_t>(n);
      if (n < 0 && errno != EAGAIN) sent = size;  // the server closed on an over-long line
    }
    if (sent == size && !shut) {
      ::shutdown(fd, SHUT_WR);
      shut = true;
    }
    event_base_loop(f.base, EVLOOP_NONBLOCK);
    std::vector<ghost::ControlServer::Reply> later;
    later.swap(f.later);
    for (auto& r : later) r(json{{"flushed", true}});
    char buf[65536];
    while (true) {
      const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
      if (n > 0) {
        got.append(buf, static_cast<std::size_t>(n));
        continue;
      }
      if (n == 0 || (errno != EAGAIN && errno != EINTR)) eof = true;
      break;
    }
    if (!eof) {
      pollfd p{fd, POLLIN, 0};
      ::poll(&p, 1, 1);
    }
  }
  ::close(fd);

  std::size_t replies = 0;
  std::size_t pos = 0;
  while (pos < got.size()) {
    std::size_t nl = got.find('\n', pos);
    if (nl == std::string::npos) Die("a reply without its newline", got.substr(pos));
    const std::string line = got.substr(pos, nl - pos);
    json reply = json::parse(line, nullptr, false);
    if (reply.is_discarded() || !reply.is_object() || !reply.contains("id") ||
        !reply.contains("ok") || !reply["ok"].is_boolean()) {
      Die("a reply that is not {\"id\":..,\"ok\":..}", line);
    }
    ++replies;
    pos = nl + 1;
  }
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  if (replies != ExpectedReplies(in)) {
    Die("the replies do not match the request lines",
        "expected " + std::to_string(ExpectedReplies(in)) + ", got " + std::to_string(replies) +
            ":\n" + got);
  }
  return 0;
}
