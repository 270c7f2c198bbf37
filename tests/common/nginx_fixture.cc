#include "tests/common/nginx_fixture.h"

#include <signal.h>

#include <cerrno>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "tests/common/server_process.h"

namespace ghost {
namespace {

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
  dir_ = MakeTempDir("nginx");
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
  const std::string error_log = dir_ + "/error.log";
  Result<pid_t> pid = StartChild({kBinary, "-c", conf_path, "-p", dir_ + "/", "-e", error_log,
                                  "-g", "daemon off;"},
                                 out_path);
  if (!pid.ok()) return pid.status();
  pid_ = *pid;
  port_ = port;
  Status s = WaitUntilAccepting(
      &pid_, {port_}, "nginx", [&] { return ReadErrorLog() + ReadFile(out_path); }, port_taken);
  if (s.code() == Status::Code::kTimedOut) Stop();
  return s;
}

void NginxServer::Stop() {
  StopChild(&pid_, SIGTERM);
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
