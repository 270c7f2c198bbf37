#include "proxy/proxy_config.h"

#include <toml++/toml.h>

#include <set>

#include "common/config/config.h"
#include "common/config/toml_file.h"
#include "proxy/mail_proxy_config.h"

namespace ghost {

Status LoadProxyConfigFile(const std::string& path, GhostproxyOptions* o) {
  Result<toml::table> parsed = ParseTomlFile(path);
  if (!parsed.ok()) return parsed.status();
  toml::table& t = *parsed;
  static const std::set<std::string> kKeys = {"listen",
                                              "mount",
                                              "control",
                                              "allow",
                                              "connect_ports",
                                              "access_log",
                                              "access_log_queue",
                                              "via",
                                              "max_connections",
                                              "max_connections_per_client",
                                              "preempt_after",
                                              "max_header_bytes",
                                              "max_headers",
                                              "request_timeout",
                                              "send_timeout",
                                              "connect_timeout",
                                              "origin_timeout",
                                              "fallback_timeout",
                                              "tunnel_idle_timeout",
                                              "origin_idle_timeout",
                                              "max_idle_per_origin",
                                              "heuristic_freshness",
                                              "high_watermark",
                                              "memory_cache",
                                              "shape",
                                              "shape_knob",
                                              "shape_max_slowdown",
                                              "shape_threshold",
                                              "shape_buffer",
                                              "plain_rcvbuf",
                                              "log_file",
                                              "log_level"};
  for (auto&& [k, v] : t) {
    if (!kKeys.count(std::string(k.str())) && !IsMailProxyKey(k.str())) {
      return Status::InvalidArgument(TomlWhere(path, v.source()) + ": unknown key \"" +
                                     std::string(k.str()) + "\"");
    }
  }
  auto bad = [&](const toml::node& n, const std::string& what) {
    return Status::InvalidArgument(TomlWhere(path, n.source()) + ": " + what);
  };
  auto str = [&](const char* key, std::string* out) -> Status {
    if (const toml::node* n = t.get(key)) {
      auto s = n->value<std::string>();
      if (!s) return bad(*n, std::string("\"") + key + "\" must be a string");
      *out = *s;
    }
    return Status::Ok();
  };
  auto count = [&](const char* key, std::size_t* out) -> Status {
    if (const toml::node* n = t.get(key)) {
      auto i = n->value<std::int64_t>();
      if (!i || !n->is_integer() || *i <= 0)
        return bad(*n, std::string("\"") + key + "\" must be a positive integer");
      *out = static_cast<std::size_t>(*i);
    }
    return Status::Ok();
  };
  auto count_or_zero = [&](const char* key, std::size_t* out) -> Status {
    if (const toml::node* n = t.get(key)) {
      auto i = n->value<std::int64_t>();
      if (!i || !n->is_integer() || *i < 0)
        return bad(*n, std::string("\"") + key + "\" must be an integer, 0 or more");
      *out = static_cast<std::size_t>(*i);
    }
    return Status::Ok();
  };
  auto size_or_zero = [&](const char* key, Bytes* out) -> Status {
    if (const toml::node* n = t.get(key)) {
      Result<Bytes> b = TomlSize(*n, key);
      if (!b.ok()) return bad(*n, b.status().message());
      *out = *b;
    }
    return Status::Ok();
  };
  auto size = [&](const char* key, std::size_t* out) -> Status {
    Bytes b = 0;
    if (Status s = size_or_zero(key, &b); !s.ok()) return s;
    if (const toml::node* n = t.get(key); n && b == 0) {
      return bad(*n, std::string("\"") + key + "\" must be above zero");
    }
    if (t.get(key)) *out = static_cast<std::size_t>(b);
    return Status::Ok();
  };
  auto seconds = [&](const char* key, Duration* out) -> Status {
    if (const toml::node* n = t.get(key)) {
      auto d = n->value<double>();
      if (!d || *d <= 0 || !IsUserSeconds(*d))
        return bad(*n, std::string("\"") + key + "\" must be a positive number of seconds (at most 1e9)");
      *out = Seconds(*d);
    }
    return Status::Ok();
  };

  ProxyOptions& p = o->proxy;
  Status s;
  std::string listen;
  if (!(s = str("listen", &listen)).ok()) return s;
  if (!listen.empty()) {
    Result<ListenAddress> la = ListenAddress::Parse(listen);
    if (!la.ok()) return bad(*t.get("listen"), la.status().message());
    p.listen = *la;
  }
  if (!(s = str("mount", &o->mountpoint)).ok()) return s;
  if (!(s = str("control", &o->control_path)).ok()) return s;
  if (!(s = str("access_log", &p.access_log)).ok()) return s;
  if (!(s = str("via", &p.via_name)).ok()) return s;
  if (const toml::node* n = t.get("allow")) {
    const toml::array* list = n->as_array();
    if (!list)
      return bad(*n, "\"allow\" must be an array of CIDR strings, e.g. [\"192.168.1.0/24\"]");
    p.allow.clear();
    for (const toml::node& item : *list) {
      auto text = item.value<std::string>();
      if (!text) return bad(item, "\"allow\" entries must be strings such as \"10.0.0.0/8\"");
      Result<Cidr> c = Cidr::Parse(*text);
      if (!c.ok()) return bad(item, c.status().message());
      p.allow.push_back(*c);
    }
  }
  if (const toml::node* n = t.get("connect_ports")) {
    const toml::array* list = n->as_array();
    if (!list) return bad(*n, "\"connect_ports\" must be an array of ports, e.g. [443]");
    p.connect_ports.clear();
    for (const toml::node& item : *list) {
      auto port = item.value<std::int64_t>();
      if (!port || !item.is_integer() || *port < 1 || *port > 65535) {
        return bad(item, "\"connect_ports\" entries must be ports in 1..65535");
      }
      p.connect_ports.push_back(static_cast<std::uint16_t>(*port));
    }
  }
  if (!(s = count("max_connections", &p.max_connections)).ok()) return s;
  if (!(s = count_or_zero("max_connections_per_client", &p.max_connections_per_client)).ok())
    return s;
  if (!(s = seconds("preempt_after", &p.preempt_after)).ok()) return s;
  if (!(s = size("max_header_bytes", &p.limits.max_header_bytes)).ok()) return s;
  if (!(s = count("max_headers", &p.limits.max_headers)).ok()) return s;
  if (!(s = count("max_idle_per_origin", &p.max_idle_per_origin)).ok()) return s;
  if (!(s = size("high_watermark", &p.high_watermark)).ok()) return s;
  if (!(s = size("access_log_queue", &p.access_log_queue)).ok()) return s;
  if (const toml::node* n = t.get("access_log_queue"); n && p.access_log_queue < 4096)
    return bad(*n, "\"access_log_queue\" must be a size of at least 4K");
  if (!(s = size_or_zero("memory_cache", &o->memory_cache)).ok()) return s;
  if (!(s = str("log_file", &o->log_file)).ok()) return s;
  if (!(s = str("log_level", &o->log_level)).ok()) return s;
  if (!(s = seconds("request_timeout", &p.request_timeout)).ok()) return s;
  if (!(s = seconds("send_timeout", &p.send_timeout)).ok()) return s;
  if (!(s = seconds("connect_timeout", &p.connect_timeout)).ok()) return s;
  if (!(s = seconds("origin_timeout", &p.origin_timeout)).ok()) return s;
  if (!(s = seconds("fallback_timeout", &p.fallback_timeout)).ok()) return s;
  if (!(s = seconds("tunnel_idle_timeout", &p.tunnel_idle_timeout)).ok()) return s;
  if (!(s = seconds("origin_idle_timeout", &p.origin_idle_timeout)).ok()) return s;
  if (!(s = seconds("heuristic_freshness", &p.heuristic_freshness)).ok()) return s;
  if (!(s = LoadMailProxyConfig(t, path, &o->mail, &o->smtp)).ok()) return s;
  // Download shaping (proxy/shaper.h).
  std::string shape;
  if (!(s = str("shape", &shape)).ok()) return s;
  if (!shape.empty()) {
    std::optional<ShapeMode> m = ParseShapeMode(shape.c_str());
    if (!m) return bad(*t.get("shape"), "\"shape\" must be \"auto\", \"off\" or \"always\"");
    p.shaping.mode = *m;
  }
  if (const toml::node* n = t.get("shape_knob")) {
    auto k = n->value<std::int64_t>();
    if (!k || !n->is_integer() || *k < 0 || *k > 100)
      return bad(*n, "\"shape_knob\" must be an integer in 0..100");
    p.shaping.knob = static_cast<int>(*k);
    p.shaping.knob_fixed = true;
  }
  if (const toml::node* n = t.get("shape_max_slowdown")) {
    auto d = n->value<double>();
    if (!d || *d < 1) return bad(*n, "\"shape_max_slowdown\" must be a number ≥ 1 (1.5: 50% slower)");
    p.shaping.max_slowdown = *d;
  }
  if (!(s = size("shape_threshold", &p.shaping.threshold)).ok()) return s;
  std::size_t buffer = 0;
  if (!(s = size("shape_buffer", &buffer)).ok()) return s;
  if (buffer > 0) {
    if (buffer < 4096 || buffer > (64u << 20))
      return bad(*t.get("shape_buffer"), "\"shape_buffer\" must be between 4K and 64M");
    p.shaping.buffer = static_cast<int>(buffer);
  }
  std::size_t plain = 0;
  if (!(s = size("plain_rcvbuf", &plain)).ok()) return s;
  if (plain > 0) {
    if (plain < 4096 || plain > (64u << 20))
      return bad(*t.get("plain_rcvbuf"), "\"plain_rcvbuf\" must be between 4K and 64M");
    p.shaping.plain_buffer = static_cast<int>(plain);
  }
  return Status::Ok();
}

Status Validate(const GhostproxyOptions& o) {
  if (o.mountpoint.empty()) {
    return Status::InvalidArgument(
        "no ghostfs mount point (--mount MOUNTPOINT): the proxy serves from its cache");
  }
  const ProxyOptions& p = o.proxy;
  if (p.max_connections == 0) return Status::InvalidArgument("max_connections must be above zero");
  if (p.limits.max_header_bytes == 0 || p.limits.max_headers == 0) {
    return Status::InvalidArgument("header limits must be above zero");
  }
  if (p.high_watermark == 0) return Status::InvalidArgument("high_watermark must be above zero");
  if (p.access_log_queue < 4096)
    return Status::InvalidArgument("access_log_queue must be at least 4K");
  return ValidateMailProxy(o.mail, o.smtp);
}

}  // namespace ghost
