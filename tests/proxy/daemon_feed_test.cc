// The proxy's one subscription to ghostfs (CacheBackend::WatchDaemon, proxy/ghostfs_backend.cc):
// download shaping's knob (DaemonKnob) and the mail proxies' NetworkWatch (the IMAP proxy's
// deferred changes, the SMTP outbox) all follow the daemon over the backend's single control
// connection, so a knob change reaches every one of them from the same event. Against a fake
// daemon (tests/proxy/fake_daemon.h) answering "knob" and "devices".
#include <gtest/gtest.h>

#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "common/control/control.h"
#include "common/control/protocol.h"
#include "proxy/cache_backend.h"
#include "proxy/network_watch.h"
#include "tests/proxy/fake_daemon.h"

namespace ghost {
namespace {

using nlohmann::json;

json Devices(double card_power_w) {
  // One network card with a low (0.1 W) and a high (1.4 W) mode, in the shape of DevicesJson.
  return json::array({{{"name", "wlan"},
                       {"kind", "network"},
                       {"power_w", card_power_w},
                       {"modes", json::array({{{"power_w", 0.1}}, {{"power_w", 1.4}}})}}});
}

class DaemonFeedTest : public FakeDaemonTest {
 protected:
  void Answer(const ControlRequest& request, ControlServer::Reply reply) override {
    switch (request.op) {
      case ControlOp::kKnob:
        return reply({{"knob", knob_}});
      case ControlOp::kDevices:
        return reply(devices_);
      default:
        return reply(json::object());
    }
  }

  void TearDown() override {
    imap_.reset();
    smtp_.reset();
    FakeDaemonTest::TearDown();
  }

  std::unique_ptr<NetworkWatch> Watch(const char* who, int* highs, int* flushes) {
    NetworkWatch::Handlers h;
    h.on_high = [highs] { ++*highs; };
    h.on_flush = [flushes] { ++*flushes; };
    return std::make_unique<NetworkWatch>(base_, backend_.get(), socket_, who, std::move(h));
  }

  std::unique_ptr<NetworkWatch> imap_, smtp_;
  int knob_ = 30;
  json devices_ = Devices(0.1);
};

TEST_F(DaemonFeedTest, OneConnectionCarriesTheKnobToShapingAndBothMailWatches) {
  int imap_highs = 0, imap_flushes = 0, smtp_highs = 0, smtp_flushes = 0;
  imap_ = Watch("imap", &imap_highs, &imap_flushes);
  smtp_ = Watch("smtp", &smtp_highs, &smtp_flushes);
  EXPECT_TRUE(imap_->shared()) << "the IMAP watch opened a connection of its own";
  EXPECT_TRUE(smtp_->shared()) << "the SMTP watch opened a connection of its own";
  ASSERT_TRUE(RunUntil([&] {
    return backend_->DaemonKnob() == 30 && imap_->known() && smtp_->known() && imap_->knob() == 30 &&
           smtp_->knob() == 30;
  })) << "knob " << backend_->DaemonKnob().value_or(-1) << ", imap " << imap_->knob() << ", smtp "
      << smtp_->knob();
  EXPECT_EQ(server_->connections(), 1u) << "one control connection for the whole proxy";
  EXPECT_EQ(server_->subscribers("stats"), 1u);
  EXPECT_EQ(server_->subscribers("modes"), 1u);
  EXPECT_EQ(server_->subscribers("events"), 1u);

  // `ghostctl knob 80`: the daemon publishes "modes" and "stats" (fs/control_ops.cc PublishModes).
  knob_ = 80;
  server_->Publish("modes", devices_);
  server_->Publish("stats", {{"knob", 80}});
  ASSERT_TRUE(RunUntil([&] {
    return backend_->DaemonKnob() == 80 && imap_->knob() == 80 && smtp_->knob() == 80;
  })) << "knob " << backend_->DaemonKnob().value_or(-1) << ", imap " << imap_->knob() << ", smtp "
      << smtp_->knob();
  EXPECT_EQ(imap_highs + smtp_highs, 0) << "the card stayed in its low mode";

  // The card enters its high-power mode: both mail queues hear it once.
  server_->Publish("modes", Devices(1.4));
  ASSERT_TRUE(RunUntil([&] { return imap_highs == 1 && smtp_highs == 1; }))
      << imap_highs << " " << smtp_highs;
  EXPECT_TRUE(imap_->high());
  EXPECT_TRUE(smtp_->high());
  // `ghostctl flush`.
  server_->Publish("events", {{"type", "flush"}});
  ASSERT_TRUE(RunUntil([&] { return imap_flushes == 1 && smtp_flushes == 1; }))
      << imap_flushes << " " << smtp_flushes;

  // A watch that is gone hears nothing more; the others still do.
  smtp_.reset();
  server_->Publish("stats", {{"knob", 10}});
  ASSERT_TRUE(RunUntil([&] { return backend_->DaemonKnob() == 10 && imap_->knob() == 10; }));
  EXPECT_EQ(server_->connections(), 1u);
}

// A watch made after the backend already knows the knob and the card's modes starts with them
// (WatchDaemon gives the known state at once) and still opens no connection.
TEST_F(DaemonFeedTest, LateWatchStartsFromTheKnownState) {
  ASSERT_TRUE(RunUntil([&] { return backend_->DaemonKnob() == 30; }));
  // The devices are read just after the knob: let that answer come too.
  int highs = 0, flushes = 0;
  ASSERT_TRUE(RunUntil([&] {
    imap_ = Watch("imap", &highs, &flushes);
    return imap_->known();
  }));
  EXPECT_EQ(imap_->knob(), 30);
  EXPECT_FALSE(imap_->high());
  EXPECT_EQ(server_->connections(), 1u);
}

// Losing the daemon resets what the watches know (a card mode may have been missed).
TEST_F(DaemonFeedTest, LostConnectionIsReportedToTheWatches) {
  int highs = 0, flushes = 0;
  imap_ = Watch("imap", &highs, &flushes);
  ASSERT_TRUE(RunUntil([&] { return imap_->known(); }));
  server_.reset();  // the daemon is gone: its connections close
  ASSERT_TRUE(RunUntil([&] { return !imap_->known(); }));
  EXPECT_FALSE(imap_->high());
}

}  // namespace
}  // namespace ghost
