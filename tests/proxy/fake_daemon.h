// A fake ghostfs daemon for GhostfsBackend's tests (daemon_feed_test.cc, ghostfs_backend_test.cc):
// a ControlServer on a temporary socket, answering each request with Answer, and a directory
// with .ghost/ in it standing for the mount; backend_ is a GhostfsBackend connected to both.
#ifndef GHOST_TESTS_PROXY_FAKE_DAEMON_H_
#define GHOST_TESTS_PROXY_FAKE_DAEMON_H_

#include <event2/event.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include "common/control/control.h"
#include "common/control/protocol.h"
#include "proxy/cache_backend.h"
#include "proxy/ghostfs_backend.h"

namespace ghost {

class FakeDaemonTest : public ::testing::Test {
 protected:
  // The daemon's answer to one request (by default an empty object).
  virtual void Answer(const ControlRequest&, ControlServer::Reply reply) { reply(nlohmann::json::object()); }
  // The options backend_ is made with.
  virtual GhostfsBackendOptions BackendOptions() { return {}; }

  void SetUp() override {
    char tmpl[] = "/tmp/ghost-daemon-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    mnt_ = dir_ + "/mnt";
    ASSERT_EQ(::mkdir(mnt_.c_str(), 0755), 0);
    ASSERT_EQ(::mkdir((mnt_ + "/.ghost").c_str(), 0755), 0);
    socket_ = dir_ + "/ctl";
    base_ = event_base_new();
    ASSERT_NE(base_, nullptr);
    Result<std::unique_ptr<ControlServer>> server = ControlServer::Listen(
        base_, socket_,
        [this](const ControlRequest& request, ControlServer::Reply reply) { Answer(request, std::move(reply)); });
    ASSERT_TRUE(server.ok()) << server.status().ToString();
    server_ = std::move(*server);
    Result<std::unique_ptr<CacheBackend>> backend = MakeGhostfsBackend(base_, mnt_, socket_, BackendOptions());
    ASSERT_TRUE(backend.ok()) << backend.status().ToString();
    backend_ = std::move(*backend);
  }

  void TearDown() override {
    backend_.reset();
    server_.reset();
    if (base_ != nullptr) event_base_free(base_);
    std::system(("rm -rf " + dir_).c_str());
  }

  // Runs the loop until `done` holds (false after 5 s).
  bool RunUntil(const std::function<bool()>& done) {
    for (int i = 0; i < 5000; ++i) {
      event_base_loop(base_, EVLOOP_NONBLOCK);
      if (done()) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return false;
  }

  std::string dir_, mnt_, socket_;
  event_base* base_ = nullptr;
  std::unique_ptr<ControlServer> server_;
  std::unique_ptr<CacheBackend> backend_;
};

}  // namespace ghost

#endif  // GHOST_TESTS_PROXY_FAKE_DAEMON_H_
