#include "tests/common/dovecot_fixture.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>
#include <vector>

#include "common/base/file_io.h"
#include "tests/common/server_process.h"

namespace ghost {
namespace {

namespace fs = std::filesystem;

Status WriteFile(const std::string& path, const std::string& contents, mode_t mode) {
  UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode));
  if (fd.get() < 0) return Status::FromErrno(errno, "open " + path);
  std::size_t done = 0;
  while (done < contents.size()) {
    const ssize_t n = ::write(fd.get(), contents.data() + done, contents.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return Status::FromErrno(errno, "write " + path);
    }
    done += static_cast<std::size_t>(n);
  }
  if (::fchmod(fd.get(), mode) != 0) return Status::FromErrno(errno, "chmod " + path);
  return Status::Ok();
}

// Runs argv to completion with its output in `out_path`; returns its exit status or -1.
int RunAndWait(std::vector<std::string> args, const std::string& out_path) {
  Result<pid_t> started = StartChild(std::move(args), out_path, /*append=*/true);
  if (!started.ok()) return -1;
  const pid_t pid = *started;
  int wstatus = 0;
  while (::waitpid(pid, &wstatus, 0) < 0 && errno == EINTR) {
  }
  return WIFEXITED(wstatus) ? WEXITSTATUS(wstatus) : -1;
}

// Makes `path` (and missing parents) and gives it to the mail user.
Status MakeMailDir(const std::string& path) {
  std::error_code ec;
  fs::create_directories(path, ec);
  if (ec) return Status::IoError("creating " + path + ": " + ec.message());
  if (::chown(path.c_str(), DovecotServer::kMailUid, DovecotServer::kMailUid) != 0) {
    return Status::FromErrno(errno, "chown " + path);
  }
  return Status::Ok();
}

std::string PercentEncodeUser(const std::string& user) {
  static const char kHex[] = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : user) {
    if (std::isalnum(c) || c == '-' || c == '.' || c == '_' || c == '~') {
      out.push_back(static_cast<char>(c));
    } else {
      out.push_back('%');
      out.push_back(kHex[c >> 4]);
      out.push_back(kHex[c & 15]);
    }
  }
  return out;
}

}  // namespace

DovecotServer::~DovecotServer() { Stop(); }

std::string DovecotServer::Unavailable() {
  if (::access(kBinary, X_OK) != 0 || ::access(kDoveadm, X_OK) != 0) {
    return std::string(kBinary) + " or " + kDoveadm + " not found (apt-get install dovecot-imapd)";
  }
  if (::geteuid() != 0) return "dovecot tests need root (dovecot switches to the mail user)";
  return "";
}

Status DovecotServer::Start(const Options& options) {
  if (running()) return Status::Internal("DovecotServer::Start: already running");
  if (std::string why = Unavailable(); !why.empty()) return Status::NotFound(why);
  if (options.user.empty() || options.user.find_first_of(":\n") != std::string::npos ||
      options.password.find_first_of(":\n") != std::string::npos) {
    return Status::InvalidArgument(
        "DovecotServer: user and password must not contain ':' or "
        "a newline (passwd-file format)");
  }
  options_ = options;
  dir_ = MakeTempDir("dovecot");
  if (dir_.empty()) return Status::FromErrno(errno, "mkdtemp for dovecot");
  // dovecot's auth process runs as its own user and must reach the password file.
  if (::chmod(dir_.c_str(), 0755) != 0) return Status::FromErrno(errno, "chmod " + dir_);
  std::error_code ec;
  fs::create_directories(dir_ + "/base", ec);
  fs::create_directories(dir_ + "/state", ec);
  if (ec) return Status::IoError("creating dovecot dirs under " + dir_ + ": " + ec.message());
  for (const char* sub :
       {"/home", "/home/Maildir", "/home/Maildir/cur", "/home/Maildir/new", "/home/Maildir/tmp"}) {
    Status s = MakeMailDir(dir_ + sub);
    if (!s.ok()) return s;
  }
  Status s =
      WriteFile(dir_ + "/passwd",
                options_.user + ":{PLAIN}" + options_.password + ":" + std::to_string(kMailUid) +
                    ":" + std::to_string(kMailUid) + "::" + dir_ + "/home\n",
                0644);
  if (!s.ok()) return s;
  if (options_.tls) {
    s = MakeCertificate();
    if (!s.ok()) {
      Stop();
      return s;
    }
  }

  Status last = Status::Internal("dovecot did not start");
  for (int attempt = 0; attempt < 5; ++attempt) {
    Result<int> port = PickFreePort();
    if (!port.ok()) return port.status();
    int tls_port = 0;
    if (options_.tls) {
      Result<int> p = PickFreePort();
      if (!p.ok()) return p.status();
      if (*p == *port) continue;
      tls_port = *p;
    }
    bool port_taken = false;
    last = SpawnOnce(*port, tls_port, &port_taken);
    if (last.ok()) return last;
    if (!port_taken) break;
  }
  Status failed = last;
  Stop();
  return failed;
}

Status DovecotServer::MakeCertificate() {
  const std::string out = dir_ + "/openssl.log";
  const int rc =
      RunAndWait({"/usr/bin/openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout",
                  dir_ + "/key.pem", "-out", dir_ + "/cert.pem", "-days", "2", "-subj",
                  "/CN=localhost", "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"},
                 out);
  if (rc != 0) {
    return Status::Unavailable("openssl req could not make a test certificate (exit " +
                               std::to_string(rc) + "): " + ReadFile(out));
  }
  ::chmod((dir_ + "/key.pem").c_str(), 0600);
  return Status::Ok();
}

std::string DovecotServer::Config(int port, int tls_port) const {
  std::ostringstream c;
  c << "protocols = imap\n"
    << "listen = 127.0.0.1\n"
    << "base_dir = " << dir_ << "/base\n"
    << "state_dir = " << dir_ << "/state\n"
    << "log_path = " << dir_ << "/dovecot.log\n"
    << "disable_plaintext_auth = no\n"
    << "auth_mechanisms = plain login\n"
    << "mail_location = maildir:~/Maildir\n"
    // With inotify changes are seen at once; this bounds the wait where it is missing.
    << "mailbox_idle_check_interval = 1 secs\n"
    << "mail_fsync = never\n"
    << (options_.capabilities.empty() ? "" : "imap_capability = " + options_.capabilities + "\n")
    << "passdb {\n  driver = passwd-file\n  args = " << dir_ << "/passwd\n}\n"
    << "userdb {\n  driver = passwd-file\n  args = " << dir_ << "/passwd\n}\n";
  if (options_.tls) {
    c << "ssl = yes\n"
      << "ssl_cert = <" << dir_ << "/cert.pem\n"
      << "ssl_key = <" << dir_ << "/key.pem\n";
  } else {
    c << "ssl = no\n";
  }
  c << "service imap-login {\n"
    << "  inet_listener imap {\n    address = 127.0.0.1\n    port = " << port << "\n  }\n"
    << "  inet_listener imaps {\n    address = 127.0.0.1\n    port = " << tls_port << "\n  }\n"
    << "}\n";
  return c.str();
}

Status DovecotServer::SpawnOnce(int port, int tls_port, bool* port_taken) {
  *port_taken = false;
  const std::string conf_path = dir_ + "/dovecot.conf";
  Status s = WriteFile(conf_path, Config(port, tls_port), 0644);
  if (!s.ok()) return s;
  std::error_code ec;
  fs::remove(dir_ + "/dovecot.log", ec);
  const std::string out_path = dir_ + "/stderr.log";
  Result<pid_t> pid = StartChild({kBinary, "-F", "-c", conf_path}, out_path);
  if (!pid.ok()) return pid.status();
  pid_ = *pid;
  port_ = port;
  tls_port_ = tls_port;
  std::vector<int> ports = {port_};
  if (tls_port_ != 0) ports.push_back(tls_port_);
  s = WaitUntilAccepting(
      &pid_, ports, "dovecot", [&] { return ReadLog() + ReadFile(out_path); }, port_taken);
  if (s.code() == Status::Code::kTimedOut) Stop();
  return s;
}

void DovecotServer::Stop() {
  if (pid_ > 0) {
    // doveadm stop signals the master and waits until it is gone; a zombie still counts as
    // there, so the master is reaped here while doveadm runs (else doveadm waits 3 s).
    Result<pid_t> started =
        StartChild({kDoveadm, "-c", dir_ + "/dovecot.conf", "stop"}, dir_ + "/doveadm.log", true);
    const pid_t doveadm = started.ok() ? *started : -1;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    bool master_gone = false;
    bool doveadm_gone = doveadm < 0;
    while ((!master_gone || !doveadm_gone) && std::chrono::steady_clock::now() < deadline) {
      int wstatus = 0;
      if (!master_gone) {
        const pid_t r = ::waitpid(pid_, &wstatus, WNOHANG);
        master_gone = r == pid_ || (r < 0 && errno == ECHILD);
      }
      if (!doveadm_gone) {
        const pid_t r = ::waitpid(doveadm, &wstatus, WNOHANG);
        doveadm_gone = r == doveadm || (r < 0 && errno == ECHILD);
      }
      if (!master_gone || !doveadm_gone) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    int wstatus = 0;
    if (!master_gone) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, &wstatus, 0);
    }
    if (!doveadm_gone) {
      ::kill(doveadm, SIGKILL);
      ::waitpid(doveadm, &wstatus, 0);
    }
    pid_ = -1;
  }
  if (!dir_.empty()) {
    std::error_code ec;
    fs::remove_all(dir_, ec);
    dir_.clear();
  }
  port_ = 0;
  tls_port_ = 0;
}

std::string DovecotServer::url() const {
  return "imap://" + PercentEncodeUser(options_.user) + "@127.0.0.1:" + std::to_string(port_) + "/";
}

std::string DovecotServer::imaps_url() const {
  return "imaps://" + PercentEncodeUser(options_.user) + "@127.0.0.1:" + std::to_string(tls_port_) +
         "/";
}

std::string DovecotServer::cert_path() const { return options_.tls ? dir_ + "/cert.pem" : ""; }
std::string DovecotServer::maildir() const { return dir_ + "/home/Maildir"; }
std::string DovecotServer::ReadLog() const { return ReadFile(dir_ + "/dovecot.log"); }

std::string DovecotServer::WaitForLog(std::string_view text, std::chrono::milliseconds timeout) const {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  std::string log = ReadLog();
  while (log.find(text) == std::string::npos && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    log = ReadLog();
  }
  return log;
}

Status DovecotServer::CreateFolder(const std::string& folder) {
  if (folder.empty() || folder[0] != '.' || folder.find('/') != std::string::npos ||
      folder == "." || folder == "..") {
    return Status::InvalidArgument("DovecotServer::CreateFolder: \"" + folder +
                                   "\" is not a Maildir++ folder name (\".Name\")");
  }
  const std::string root = maildir() + "/" + folder;
  for (const char* sub : {"", "/cur", "/new", "/tmp"}) {
    Status s = MakeMailDir(root + sub);
    if (!s.ok()) return s;
  }
  const std::string marker = root + "/maildirfolder";
  Status s = WriteFile(marker, "", 0644);
  if (!s.ok()) return s;
  if (::chown(marker.c_str(), kMailUid, kMailUid) != 0) {
    return Status::FromErrno(errno, "chown " + marker);
  }
  return Status::Ok();
}

Result<std::string> DovecotServer::Seed(const std::string& folder, const std::string& contents,
                                        const std::string& info, bool into_new) {
  if (!running()) return Status::Internal("DovecotServer::Seed: not running");
  if (!folder.empty()) {
    Status s = CreateFolder(folder);
    if (!s.ok()) return s;
  }
  const std::string root = maildir() + (folder.empty() ? "" : "/" + folder);
  // Names sort in seeding order (dovecot gives new files UIDs in name order).
  char unique[64];
  std::snprintf(unique, sizeof unique, "1700000000.G%06uP%d.ghosttest", ++seeded_,
                static_cast<int>(::getpid()));
  const std::string tmp = root + "/tmp/" + unique;
  Status s = WriteFile(tmp, contents, 0644);
  if (!s.ok()) return s;
  if (::chown(tmp.c_str(), kMailUid, kMailUid) != 0)
    return Status::FromErrno(errno, "chown " + tmp);
  const std::string final_path =
      into_new ? root + "/new/" + unique : root + "/cur/" + unique + ":2," + info;
  if (::rename(tmp.c_str(), final_path.c_str()) != 0) {
    return Status::FromErrno(errno, "rename " + tmp + " to " + final_path);
  }
  return final_path;
}

}  // namespace ghost
