// NginxServer: a real nginx on 127.0.0.1 serving a directory, for tests that need an HTTP
// origin (TESTING.md "Origins"). It runs in the foreground as a child of the test
// (`nginx -c CONF -p DIR -g 'daemon off;'`), with its config, pid, logs and temp paths in a
// fresh temporary directory, `autoindex on`, `etag on` and keep-alive, on a free port. Its
// access log shows 200/206/304, which makes revalidation testable.
//
// The server is stopped (SIGTERM, then SIGKILL after 5 s) and its directory removed by Stop()
// or the destructor, so a failing test cleans up too; if the test process dies, the kernel
// kills nginx (PR_SET_PDEATHSIG).
//
// Use: skip the test when Unavailable() says why nginx cannot run, then Start(root).
//
// Thread-safety: not thread-safe; one owner.
#ifndef GHOST_TESTS_COMMON_NGINX_FIXTURE_H_
#define GHOST_TESTS_COMMON_NGINX_FIXTURE_H_

#include <sys/types.h>

#include <string>

#include "common/base/status.h"

namespace ghost {

class NginxServer {
 public:
  static constexpr const char* kBinary = "/usr/sbin/nginx";

  NginxServer() = default;
  ~NginxServer();
  NginxServer(const NginxServer&) = delete;
  NginxServer& operator=(const NginxServer&) = delete;

  // Empty if nginx can be run here; otherwise the reason (for GTEST_SKIP).
  static std::string Unavailable();

  // Starts nginx serving `root_dir` (an absolute path) and waits until it accepts
  // connections. `extra_server_config` is pasted inside the server block (e.g. locations).
  // Returns the port. Fails (with nginx's error log in the message) if nginx does not start
  // within 10 s; retries on another port if the chosen one was taken meanwhile.
  // Precondition: not running.
  Result<int> Start(const std::string& root_dir, const std::string& extra_server_config = "");
  // Stops nginx and removes its directory. Safe to call when not running.
  void Stop();

  bool running() const { return pid_ > 0; }
  int port() const { return port_; }
  // "http://127.0.0.1:PORT" (no trailing slash).
  std::string base_url() const;
  std::string access_log_path() const;
  std::string error_log_path() const;
  // The whole file, or "" if it cannot be read.
  std::string ReadAccessLog() const;
  std::string ReadErrorLog() const;
  // Polls the access log until it contains `text` or `timeout_ms` passes (nginx writes a
  // line when it finishes a request, a moment after the client has the response).
  bool WaitForAccessLog(const std::string& text, int timeout_ms = 3000) const;

 private:
  Status SpawnOnce(const std::string& root_dir, const std::string& extra, int port,
                   bool* port_taken);

  pid_t pid_ = -1;
  int port_ = 0;
  std::string dir_;  // nginx's prefix: conf, logs, pid, temp paths
};

}  // namespace ghost

#endif  // GHOST_TESTS_COMMON_NGINX_FIXTURE_H_
