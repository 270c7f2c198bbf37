#include "proxy/dashboard.h"

#include <arpa/inet.h>
#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <chrono>
#include <cmath>
#include <ctime>
#include <deque>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "common/base/log.h"
#include "common/control/control.h"
#include "proxy/dashboard_html.h"  // kDashboardHtml: proxy/dashboard.html, made at build time

namespace ghost {
namespace {

using nlohmann::json;

// Mode changes kept for the page's timeline (a new page gets them in its snapshot).
constexpr std::size_t kHistory = 500;
// Daemon "events" (origin down/up, flushes, ...) kept likewise.
constexpr std::size_t kEventHistory = 50;

double UnixNowSeconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

class DashboardImpl final : public Dashboard {
 public:
  DashboardImpl(event_base* base, std::string control_path)
      : base_(base), control_path_(std::move(control_path)) {}
  ~DashboardImpl() override {
    for (evhttp_request* r : streams_) {
      evhttp_connection_set_closecb(evhttp_request_get_connection(r), nullptr, nullptr);
    }
    if (http_) evhttp_free(http_);
  }

  Status Listen(const ListenAddress& listen) {
    http_ = evhttp_new(base_);
    if (!http_) return Status::Internal("dashboard: evhttp_new failed");
    // An event stream is quiet for as long as nothing changes: no idle timeout cuts it (the
    // page's EventSource reconnects anyway if the connection ends).
    evhttp_set_timeout(http_, 24 * 3600);
    evhttp_set_allowed_methods(http_, EVHTTP_REQ_GET | EVHTTP_REQ_HEAD);
    evhttp_set_gencb(http_, &DashboardImpl::OnRequest, this);
    evhttp_bound_socket* bound =
        evhttp_bind_socket_with_handle(http_, listen.host.ToString().c_str(), listen.port);
    if (!bound) {
      return Status::Unavailable("dashboard: cannot listen on " + listen.ToString() +
                                 " (address in use, or not this machine's?)");
    }
    sockaddr_storage ss{};
    socklen_t len = sizeof ss;
    getsockname(evhttp_bound_socket_get_fd(bound), reinterpret_cast<sockaddr*>(&ss), &len);
    int port = ss.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port)
                                        : ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
    address_ = listen.host.ToString() + ":" + std::to_string(port);
    if (listen.host.ToString().find(':') != std::string::npos) {
      address_ = "[" + listen.host.ToString() + "]:" + std::to_string(port);
    }
    return Status::Ok();
  }

  Status Subscribe() {
    Result<std::unique_ptr<AsyncControlClient>> c = AsyncControlClient::Connect(base_, control_path_);
    if (!c.ok()) return c.status();
    ctl_ = std::move(c).value();
    ctl_->SetEventHandler([this](const json& e) { OnDaemonEvent(e); });
    ctl_->SetDisconnectHandler([this] {
      Log(LogLevel::kWarn, "dashboard: lost the control socket %s; the page shows the last state",
          control_path_.c_str());
    });
    ctl_->Call(ControlOp::kSubscribe, {{"topics", {"modes", "stats", "events"}}}, [this](Result<json> r) {
      if (!r.ok()) Log(LogLevel::kWarn, "dashboard: subscribe: %s", r.status().ToString().c_str());
    });
    // The current state, after the subscription: a pushed event is never older than it.
    ctl_->Call(ControlOp::kDevices, json::object(), [this](Result<json> r) {
      if (r.ok()) {
        if (devices_.is_null()) RecordModes(*r);
        devices_ = *r;
        Broadcast("modes", devices_);
      }
    });
    ctl_->Call(ControlOp::kStats, json::object(), [this](Result<json> r) {
      if (r.ok()) {
        stats_ = *r;
        Broadcast("stats", stats_);
      }
    });
    return Status::Ok();
  }

  std::string address() const override { return address_; }

  std::string MetricsText() const override {
    std::string out;
    auto head = [&](const char* name, const char* help) {
      out += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " gauge\n";
    };
    auto num = [](double v) {
      char b[64];
      std::snprintf(b, sizeof b, "%.6g", v);
      return std::string(b);
    };
    auto label = [](const std::string& s) {
      std::string o;
      for (char c : s) {
        if (c == '"' || c == '\\') o += '\\';
        if (c == '\n') { o += "\\n"; continue; }
        o += c;
      }
      return o;
    };
    if (devices_.is_array()) {
      head("ghost_device_mode", "1 for the mode each device is in now, 0 for its other modes.");
      for (const json& d : devices_) {
        std::string dev = label(d.value("name", std::string()));
        std::string now = d.value("mode", std::string());
        if (auto m = d.find("modes"); m != d.end() && m->is_array()) {
          for (const json& mode : *m) {
            std::string name = mode.value("name", std::string());
            out += "ghost_device_mode{device=\"" + dev + "\",mode=\"" + label(name) + "\"} " +
                   (name == now ? "1" : "0") + "\n";
          }
        }
      }
      head("ghost_device_power_watts", "What each device draws now (modelled).");
      for (const json& d : devices_) {
        out += "ghost_device_power_watts{device=\"" + label(d.value("name", std::string())) +
               "\"} " + num(d.value("power_w", 0.0)) + "\n";
      }
    }
    if (stats_.is_object()) {
      const json model = stats_.value("energy_model", json::object());
      const bool modelled = model.is_object() && model.value("modelled", false);
      head("ghost_energy_modelled", "1 when the energy figures are modelled from a profile.");
      out += "ghost_energy_modelled{profile=\"" +
             label(model.is_object() && model.contains("profile") && model["profile"].is_string()
                       ? model["profile"].get<std::string>()
                       : "") +
             "\"} " + (modelled ? "1" : "0") + "\n";
      if (modelled) {
        const json e = stats_.value("energy_j", json::object());
        head("ghost_energy_joules", "Energy since the mount (modelled), total and by device.");
        out += "ghost_energy_joules{device=\"total\"} " + num(e.value("total", 0.0)) + "\n";
        out += "ghost_energy_joules{device=\"base\"} " + num(e.value("base", 0.0)) + "\n";
        if (auto d = e.find("devices"); d != e.end() && d->is_object()) {
          for (const auto& [name, j] : d->items()) {
            if (j.is_number()) out += "ghost_energy_joules{device=\"" + label(name) + "\"} " + num(j.get<double>()) + "\n";
          }
        }
      }
      if (auto s = stats_.find("saved"); s != stats_.end() && s->is_object()) {
        head("ghost_energy_saved_joules", "Energy saved against a static cache on the same reads.");
        out += "ghost_energy_saved_joules " + num(s->value("energy_j", 0.0)) + "\n";
        head("ghost_energy_saved_ratio", "That saving as a fraction of the static cache's energy.");
        out += "ghost_energy_saved_ratio " + num(s->value("percent", 0.0) / 100) + "\n";
        head("ghost_waiting_saved_seconds", "Waiting saved against a static cache on the same reads.");
        out += "ghost_waiting_saved_seconds " + num(s->value("waiting_s", 0.0)) + "\n";
      }
    }
    return out;
  }

 private:
  json Snapshot() const {
    return {{"devices", devices_},
            {"stats", stats_},
            {"history", json(history_)},
            {"events", json(events_)}};
  }

  // Remembers each device's mode (the timeline) from a devices array or one device's entry.
  void RecordModes(const json& data) {
    const double now = UnixNowSeconds();
    auto one = [&](const json& d) {
      std::string name = d.value("name", d.value("device", std::string()));
      std::string mode = d.value("mode", std::string());
      if (name.empty()) return;
      if (last_mode_[name] == mode) return;
      last_mode_[name] = mode;
      history_.push_back({{"t", now}, {"device", name}, {"mode", mode},
                          {"power_w", d.value("power_w", 0.0)}});
      if (history_.size() > kHistory) history_.pop_front();
    };
    if (data.is_array()) {
      for (const json& d : data) one(d);
    } else if (data.is_object()) {
      one(data);
    }
  }

  void OnDaemonEvent(const json& e) {
    const std::string topic = e.value("event", std::string());
    const json& data = e.contains("data") ? e["data"] : json();
    if (topic == "modes") {
      RecordModes(data);
      if (data.is_array()) devices_ = data;
    } else if (topic == "stats") {
      stats_ = data;
    } else if (topic == "events") {
      json entry = data;
      if (entry.is_object()) entry["t"] = UnixNowSeconds();
      events_.push_back(entry);
      if (events_.size() > kEventHistory) events_.pop_front();
    } else {
      return;
    }
    Broadcast(topic, topic == "modes" ? json{{"devices", devices_}, {"history", history_.empty() ? json() : history_.back()}} : data);
  }

  void Broadcast(const std::string& topic, const json& data) {
    if (streams_.empty()) return;
    std::string msg = "event: " + topic + "\ndata: " + data.dump() + "\n\n";
    for (evhttp_request* r : streams_) {
      evbuffer* b = evbuffer_new();
      evbuffer_add(b, msg.data(), msg.size());
      evhttp_send_reply_chunk(r, b);
      evbuffer_free(b);
    }
  }

  static void OnStreamClosed(evhttp_connection* conn, void* arg) {
    auto* self = static_cast<DashboardImpl*>(arg);
    std::erase_if(self->streams_, [conn](evhttp_request* r) { return evhttp_request_get_connection(r) == conn; });
  }

  static void Reply(evhttp_request* req, int code, const char* type, const std::string& body) {
    evkeyvalq* h = evhttp_request_get_output_headers(req);
    evhttp_add_header(h, "Content-Type", type);
    evhttp_add_header(h, "Cache-Control", "no-store");
    evbuffer* b = evbuffer_new();
    evbuffer_add(b, body.data(), body.size());
    evhttp_send_reply(req, code, code == 200 ? "OK" : "Not Found", b);
    evbuffer_free(b);
  }

  static void OnRequest(evhttp_request* req, void* arg) {
    auto* self = static_cast<DashboardImpl*>(arg);
    const evhttp_uri* uri = evhttp_request_get_evhttp_uri(req);
    const char* p = uri ? evhttp_uri_get_path(uri) : nullptr;
    const std::string path = p ? p : "/";
    if (path == "/" || path == "/ghost") {
      evhttp_add_header(evhttp_request_get_output_headers(req), "Location", "/ghost/");
      evhttp_send_reply(req, 302, "Found", nullptr);
    } else if (path == "/ghost/") {
      Reply(req, 200, "text/html; charset=utf-8", std::string(kDashboardHtml));
    } else if (path == "/ghost/state") {
      Reply(req, 200, "application/json", self->Snapshot().dump());
    } else if (path == "/ghost/metrics") {
      Reply(req, 200, "text/plain; version=0.0.4; charset=utf-8", self->MetricsText());
    } else if (path == "/ghost/events") {
      evkeyvalq* h = evhttp_request_get_output_headers(req);
      evhttp_add_header(h, "Content-Type", "text/event-stream");
      evhttp_add_header(h, "Cache-Control", "no-store");
      evhttp_send_reply_start(req, 200, "OK");
      std::string first = "event: snapshot\ndata: " + self->Snapshot().dump() + "\n\n";
      evbuffer* b = evbuffer_new();
      evbuffer_add(b, first.data(), first.size());
      evhttp_send_reply_chunk(req, b);
      evbuffer_free(b);
      self->streams_.insert(req);
      evhttp_connection_set_closecb(evhttp_request_get_connection(req), &OnStreamClosed, self);
    } else {
      Reply(req, 404, "text/plain", "not found: the dashboard is at /ghost/\n");
    }
  }

  event_base* base_;
  std::string control_path_;
  evhttp* http_ = nullptr;
  std::string address_;
  std::unique_ptr<AsyncControlClient> ctl_;
  json devices_, stats_;
  std::deque<json> history_, events_;
  std::map<std::string, std::string> last_mode_;
  std::set<evhttp_request*> streams_;  // open event streams (borrowed from evhttp until closed)
};

}  // namespace

Result<std::unique_ptr<Dashboard>> Dashboard::Start(event_base* base, const std::string& control_path,
                                                    const ListenAddress& listen) {
  auto d = std::make_unique<DashboardImpl>(base, control_path);
  if (Status s = d->Listen(listen); !s.ok()) return s;
  if (Status s = d->Subscribe(); !s.ok()) return s;
  return std::unique_ptr<Dashboard>(std::move(d));
}

}  // namespace ghost
