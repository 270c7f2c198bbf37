#include "tests/common/server_process.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <thread>

#include "common/base/file_io.h"

namespace ghost {

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return "";
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

namespace {

sockaddr_in Loopback(int port) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<std::uint16_t>(port));
  return addr;
}

}  // namespace

Result<int> PickFreePort() {
  UniqueFd s(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!s.valid()) return Status::FromErrno(errno, "socket");
  sockaddr_in addr = Loopback(0);
  if (::bind(s.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    return Status::FromErrno(errno, "bind 127.0.0.1:0");
  }
  socklen_t len = sizeof addr;
  if (::getsockname(s.get(), reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    return Status::FromErrno(errno, "getsockname");
  }
  return static_cast<int>(ntohs(addr.sin_port));
}

bool Accepts(int port) {
  UniqueFd s(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!s.valid()) return false;
  sockaddr_in addr = Loopback(port);
  return ::connect(s.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
}

std::string MakeTempDir(const std::string& name) {
  const char* tmp = std::getenv("TMPDIR");
  std::string pattern = std::string(tmp && *tmp ? tmp : "/tmp") + "/ghost-" + name + "-XXXXXX";
  if (::mkdtemp(pattern.data()) == nullptr) return "";
  return pattern;
}

Result<pid_t> StartChild(std::vector<std::string> args, const std::string& out_path, bool append) {
  UniqueFd out(::open(out_path.c_str(),
                      O_WRONLY | O_CREAT | O_CLOEXEC | (append ? O_APPEND : O_TRUNC), 0644));
  if (!out.valid()) return Status::FromErrno(errno, "open " + out_path);
  // Everything the child needs is built before fork: after it, only async-signal-safe calls.
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) return Status::FromErrno(errno, "fork for " + args.front());
  if (pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(127);  // the test died before prctl
    ::dup2(out.get(), STDOUT_FILENO);
    ::dup2(out.get(), STDERR_FILENO);
    ::close_range(3, ~0U, 0);  // no test sockets leak into the server
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  return pid;
}

Status WaitUntilAccepting(pid_t* pid, const std::vector<int>& ports, const std::string& name,
                          const std::function<std::string()>& log, bool* port_taken) {
  *port_taken = false;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (std::chrono::steady_clock::now() < deadline) {
    int wstatus = 0;
    if (::waitpid(*pid, &wstatus, WNOHANG) == *pid) {
      *pid = -1;
      const std::string text = log();
      *port_taken = text.find("Address already in use") != std::string::npos;
      return Status::Unavailable(name + " exited at start (status " + std::to_string(wstatus) +
                                 "); its log:\n" + text);
    }
    bool all = true;
    for (int port : ports) all = all && Accepts(port);
    if (all) return Status::Ok();
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return Status::TimedOut(name + " did not accept connections on 127.0.0.1:" +
                          std::to_string(ports.front()) + " within 10 s; its log:\n" + log());
}

void StopChild(pid_t* pid, int sig) {
  if (*pid <= 0) return;
  ::kill(*pid, sig);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  bool reaped = false;
  while (!reaped && std::chrono::steady_clock::now() < deadline) {
    int wstatus = 0;
    const pid_t r = ::waitpid(*pid, &wstatus, WNOHANG);
    if (r == *pid || (r < 0 && errno == ECHILD)) {
      reaped = true;
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }
  if (!reaped) {
    ::kill(*pid, SIGKILL);
    int wstatus = 0;
    ::waitpid(*pid, &wstatus, 0);
  }
  *pid = -1;
}

}  // namespace ghost
