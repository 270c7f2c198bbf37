#include "proxy/network_watch.h"

#include <algorithm>
#include <cstdio>

#include "common/control/control.h"
#include "proxy/cache_backend.h"

namespace ghost {

NetworkWatch::NetworkWatch(event_base* base, const std::string& control_path, std::string who,
                           Handlers handlers)
    : who_(std::move(who)), handlers_(std::move(handlers)) {
  Connect(base, control_path);
}

NetworkWatch::NetworkWatch(event_base* base, CacheBackend* backend, const std::string& control_path,
                           std::string who, Handlers handlers)
    : who_(std::move(who)), handlers_(std::move(handlers)) {
  if (backend != nullptr && !control_path.empty()) {
    // The callbacks run only while registered: the destructor unregisters them.
    CacheBackend::DaemonListener l;
    l.on_knob = [this](int knob) { knob_ = std::clamp(knob, kKnobMin, kKnobMax); };
    l.on_modes = [this](const nlohmann::json& devices, bool baseline) { OnModes(devices, baseline); };
    l.on_event = [this](const nlohmann::json& data) { OnEvent(data); };
    l.on_lost = [this] {
      high_ = false;
      known_ = false;
    };
    listener_ = backend->WatchDaemon(std::move(l));
    if (listener_ != 0) {
      backend_ = backend;
      return;
    }
  }
  Connect(base, control_path);
}

void NetworkWatch::OnEvent(const nlohmann::json& data) {
  if (data.is_object() && data.value("type", "") == "flush" && handlers_.on_flush) handlers_.on_flush();
}

void NetworkWatch::Connect(event_base* base, const std::string& control_path) {
  if (control_path.empty()) return;
  Result<std::unique_ptr<AsyncControlClient>> c = AsyncControlClient::Connect(base, control_path);
  if (!c.ok()) {
    std::fprintf(stderr, "ghostproxy: %s: no network mode events (%s): queues go at their cap or deadline\n",
                 who_.c_str(), c.status().ToString().c_str());
    return;
  }
  control_ = std::move(*c);
  // The callbacks below are the client's; it is destroyed with this watch, and drops them then.
  control_->SetEventHandler([this](const nlohmann::json& e) {
    const std::string topic = e.value("event", "");
    if (topic == "modes" && e.contains("data")) {
      OnModes(e["data"], /*baseline=*/false);
      ReadKnob();
    } else if (topic == "events" && e.contains("data")) {
      OnEvent(e["data"]);
    }
  });
  control_->SetDisconnectHandler([this] {
    high_ = false;
    known_ = false;
  });
  control_->Call(ControlOp::kSubscribe, {{"topics", {"modes", "events"}}}, [this](Result<nlohmann::json> r) {
    if (!r.ok()) {
      std::fprintf(stderr, "ghostproxy: %s: subscribing to modes: %s\n", who_.c_str(), r.status().ToString().c_str());
      return;
    }
    control_->Call(ControlOp::kDevices, nlohmann::json::object(), [this](Result<nlohmann::json> d) {
      if (d.ok()) OnModes(*d, /*baseline=*/true);
    });
    ReadKnob();
  });
}

NetworkWatch::~NetworkWatch() {
  if (backend_ != nullptr) backend_->UnwatchDaemon(listener_);
}

void NetworkWatch::ReadKnob() {
  if (!control_) return;
  control_->Call(ControlOp::kKnob, nlohmann::json::object(), [this](Result<nlohmann::json> s) {
    if (s.ok() && s->is_object() && s->contains("knob") && (*s)["knob"].is_number_integer())
      knob_ = std::clamp((*s)["knob"].get<int>(), kKnobMin, kKnobMax);
  });
}

void NetworkWatch::OnModes(const nlohmann::json& devices, bool baseline) {
  if (!devices.is_array()) return;
  bool high = false;
  for (const auto& d : devices) {
    if (!d.is_object() || d.value("kind", "") != "network" || !d.contains("modes")) continue;
    double top = -1;
    for (const auto& m : d["modes"]) top = std::max(top, m.value("power_w", 0.0));
    if (d.value("power_w", -2.0) >= top) high = true;
  }
  const bool entered = high && !high_ && !baseline;
  high_ = high;
  known_ = true;
  if (entered && handlers_.on_high) handlers_.on_high();
}

}  // namespace ghost
