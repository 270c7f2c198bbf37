// NetworkWatch: what the mail proxy learns from the running ghostfs about the network card and
// the user (DESIGN §3.3: deferred transfers ride along with traffic that wakes the card anyway).
//
// Over ghostfs's control socket it subscribes to the "modes" and "events" topics and reads the
// knob ("status"), and tells its owner:
//   - on_high: a network device has just entered its most power-hungry mode (the modes at
//     subscription are the baseline: a card already awake then gives no occasion);
//   - on_flush: the user asked ghostfs to send its queues now (`ghostctl flush` or `ghostctl
//     sync`: ghostfs publishes {"type":"flush"} on "events"), so the proxy's queues go too;
//   - high(): whether the card is in its high-power mode now (false until known);
//   - knob(): the performance/energy knob (50 until known), read at subscription and again at
//     every mode event (a knob change is seen at the card's next mode change).
// Without a control socket (or when ghostfs cannot be reached) nothing is ever reported: the
// owners' caps and deadlines still send.
//
// One subscription (round 9): given the proxy's CacheBackend, the watch listens on the
// backend's own subscription (CacheBackend::WatchDaemon: the ghostfs backend's control
// connection, which also carries download shaping's knob), so a knob change reaches shaping,
// the IMAP proxy and the SMTP outbox from the same "stats" event, at once rather than at the
// card's next mode change. Only a backend without a daemon (the tests' in-memory one) leaves
// the watch to connect to `control_path` itself, as before.
//
// Event model: the proxy's loop; push only, no timer. Thread-safety: loop thread only.
#ifndef GHOST_PROXY_NETWORK_WATCH_H_
#define GHOST_PROXY_NETWORK_WATCH_H_

#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

struct event_base;

namespace ghost {

class AsyncControlClient;
class CacheBackend;

class NetworkWatch {
 public:
  struct Handlers {
    std::function<void()> on_high;
    std::function<void()> on_flush;
  };
  // `base` is borrowed and must outlive the watch. `who` names the owner in messages. An empty
  // `control_path`, or one that cannot be reached, gives a watch that reports nothing.
  NetworkWatch(event_base* base, const std::string& control_path, std::string who, Handlers handlers);
  // Listens on `backend`'s subscription when it has one (borrowed; must outlive the watch),
  // else as above.
  NetworkWatch(event_base* base, CacheBackend* backend, const std::string& control_path,
               std::string who, Handlers handlers);
  ~NetworkWatch();
  NetworkWatch(const NetworkWatch&) = delete;
  NetworkWatch& operator=(const NetworkWatch&) = delete;

  bool connected() const { return control_ != nullptr || listener_ != 0; }
  // Whether the watch listens on the backend's subscription (no connection of its own).
  bool shared() const { return listener_ != 0; }
  // Whether mode events are known (subscribed and the baseline read).
  bool known() const { return known_; }
  bool high() const { return high_; }
  int knob() const { return knob_; }

  // Exposed for tests: feeds a "modes" event's data (the devices array).
  void OnModes(const nlohmann::json& devices, bool baseline);

 private:
  void ReadKnob();
  void Connect(event_base* base, const std::string& control_path);
  void OnEvent(const nlohmann::json& data);
  std::string who_;
  CacheBackend* backend_ = nullptr;
  std::uint64_t listener_ = 0;  // the backend's listener id (0: none)
  Handlers handlers_;
  std::unique_ptr<AsyncControlClient> control_;
  bool known_ = false;
  bool high_ = false;
  int knob_ = 50;
};

}  // namespace ghost

#endif  // GHOST_PROXY_NETWORK_WATCH_H_
