#include "tests/common/nginx_fixture.h"

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
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>
#include <vector>

namespace ghost {
namespace {

// An fd closed on scope exit.
class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return "";
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// A port on 127.0.0.1 that nothing listens on right now (the kernel's pick).
Result<int> PickFreePort() {
  Fd s(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (s.get() < 0) return Status::FromErrno(errno, "socket");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
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
  Fd s(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (s.get() < 0) return false;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<std::uint16_t>(port));
  return ::connect(s.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
}

std::string MakeTempDir() {
  const char* tmp = std::getenv("TMPDIR");
  std::string pattern = std::string(tmp && *tmp ? tmp : "/tmp") + "/ghost-nginx-XXXXXX";
  std::vector<char> buf(pattern.begin(), pattern.end());
  buf.push_back('\0');
  if (::mkdtemp(buf.data()) == nullptr) return "";
  return std::string(buf.data());
}

std::string Config(const std::string& dir, const std::string& root, int port,
                   const std::string& extra) {
  std::ostringstream c;
  // One process, running as the test's user: it can read whatever the test wrote, and
  // nothing else needs privileges.
  c << "master_process off;\n"
    << "worker_processes 1;\n"
    << "error_log " << dir << "/error.log info;\n"
    << "pid " << dir << "/nginx.pid;\n"
    << "events { worker_connections 256; }\n"
    << "http {\n"
    << "  types { text/html html htm; text/plain txt; application/octet-stream bin; }\n"
    << "  default_type application/octet-stream;\n"
    << "  access_log " << dir << "/access.log;\n"
    << "  client_body_temp_path " << dir << "/tmp/client_body;\n"
    << "  proxy_temp_path " << dir << "/tmp/proxy;\n"
    << "  fastcgi_temp_path " << dir << "/tmp/fastcgi;\n"
    << "  uwsgi_temp_path " << dir << "/tmp/uwsgi;\n"
    << "  scgi_temp_path " << dir << "/tmp/scgi;\n"
    << "  sendfile on;\n"
    << "  keepalive_timeout 75s;\n"
    << "  keepalive_requests 10000;\n"
    << "  server {\n"
    << "    listen 127.0.0.1:" << port << ";\n"
    << "    server_name localhost;\n"
    << "    root " << root << ";\n"
    << "    autoindex on;\n"
    << "    etag on;\n"
    << extra << "\n"
    << "  }\n"
    << "}\n";
  return c.str();
}

}  // namespace

NginxServer::~NginxServer() { Stop(); }

std::string NginxServer::Unavailable() {
  if (::access(kBinary, X_OK) != 0) {
    return std::string(kBinary) + " not found or not executable (apt-get install nginx-light)";
  }
  return "";
}

Result<int> NginxServer::Start(const std::string& root_dir, const std::string& extra) {
  if (running()) return Status::Internal("NginxServer::Start: already running");
  if (std::string why = Unavailable(); !why.empty()) return Status::NotFound(why);
  dir_ = MakeTempDir();
  if (dir_.empty()) return Status::FromErrno(errno, "mkdtemp for nginx");
  std::error_code ec;
  std::filesystem::create_directories(dir_ + "/tmp", ec);
  if (ec) return Status::IoError("creating " + dir_ + "/tmp: " + ec.message());

  Status last = Status::Internal("nginx did not start");
  for (int attempt = 0; attempt < 5; ++attempt) {
    Result<int> port = PickFreePort();
    if (!port.ok()) return port.status();
    bool port_taken = false;
    last = SpawnOnce(root_dir, extra, *port, &port_taken);
    if (last.ok()) return port_;
    if (!port_taken) break;
  }
  Status failed = last;
  Stop();
  return failed;
}

Status NginxServer::SpawnOnce(const std::string& root_dir, const std::string& extra, int port,
                              bool* port_taken) {
  *port_taken = false;
  const std::string conf_path = dir_ + "/nginx.conf";
  {
    std::ofstream conf(conf_path, std::ios::trunc);
    conf << Config(dir_, root_dir, port, extra);
    if (!conf) return Status::IoError("writing " + conf_path);
  }
  std::filesystem::remove(dir_ + "/error.log");
  const std::string out_path = dir_ + "/stderr.log";
  Fd out(::open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (out.get() < 0) return Status::FromErrno(errno, "open " + out_path);

  // Everything the child needs is built before fork: after it, only async-signal-safe calls.
  const std::string error_log = dir_ + "/error.log";
  std::vector<std::string> args = {kBinary, "-c",      conf_path, "-p",         dir_ + "/",
                                   "-e",    error_log, "-g",      "daemon off;"};
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t parent = ::getpid();

  const pid_t pid = ::fork();
  if (pid < 0) return Status::FromErrno(errno, "fork for nginx");
  if (pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(127);  // the test died before prctl
    ::dup2(out.get(), STDOUT_FILENO);
    ::dup2(out.get(), STDERR_FILENO);
    ::close_range(3, ~0U, 0);  // no test sockets leak into nginx
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  pid_ = pid;
  port_ = port;

  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (std::chrono::steady_clock::now() < deadline) {
    int wstatus = 0;
    if (::waitpid(pid_, &wstatus, WNOHANG) == pid_) {
      pid_ = -1;
      const std::string log = ReadErrorLog() + ReadFile(out_path);
      *port_taken = log.find("Address already in use") != std::string::npos;
      return Status::Unavailable("nginx exited at start (status " + std::to_string(wstatus) +
                                 "); its log:\n" + log);
    }
    if (Accepts(port_)) return Status::Ok();
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  const std::string log = ReadErrorLog();
  Stop();
  return Status::TimedOut("nginx did not accept connections on 127.0.0.1:" + std::to_string(port) +
                          " within 10 s; its log:\n" + log);
}

void NginxServer::Stop() {
  if (pid_ > 0) {
    ::kill(pid_, SIGTERM);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    bool reaped = false;
    while (!reaped && std::chrono::steady_clock::now() < deadline) {
      int wstatus = 0;
      const pid_t r = ::waitpid(pid_, &wstatus, WNOHANG);
      if (r == pid_ || (r < 0 && errno == ECHILD)) {
        reaped = true;
      } else {
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
    }
    if (!reaped) {
      ::kill(pid_, SIGKILL);
      int wstatus = 0;
      ::waitpid(pid_, &wstatus, 0);
    }
    pid_ = -1;
  }
  if (!dir_.empty()) {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
    dir_.clear();
  }
  port_ = 0;
}

std::string NginxServer::base_url() const { return "http://127.0.0.1:" + std::to_string(port_); }

std::string NginxServer::access_log_path() const { return dir_ + "/access.log"; }
std::string NginxServer::error_log_path() const { return dir_ + "/error.log"; }
std::string NginxServer::ReadAccessLog() const { return ReadFile(access_log_path()); }
std::string NginxServer::ReadErrorLog() const { return ReadFile(error_log_path()); }

bool NginxServer::WaitForAccessLog(const std::string& text, int timeout_ms) const {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (true) {
    if (ReadAccessLog().find(text) != std::string::npos) return true;
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

}  // namespace ghost
