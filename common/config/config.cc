#include "common/config/config.h"

#include "common/base/log.h"
#include "common/config/toml_file.h"

#include <toml++/toml.h>
#include <unistd.h>

#include <cctype>
#include <charconv>
#include <fstream>
#include <optional>
#include <set>
#include <sstream>

#include "common/imap/imap_client.h"

namespace ghost {
namespace {

bool ValidName(const std::string& n) {
  if (n.empty() || n == "." || n == ".." || n == "local" || n.size() > 64) return false;
  for (char c : n) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '_' && c != '-') return false;
  }
  return true;
}

}  // namespace

Result<Origin> ParseOrigin(const std::string& spec) {
  auto eq = spec.find('=');
  if (eq == std::string::npos) return Status::InvalidArgument("origin \"" + spec + "\" is not NAME=URL");
  Origin o;
  o.name = spec.substr(0, eq);
  o.url = spec.substr(eq + 1);
  if (!ValidName(o.name)) {
    return Status::InvalidArgument("origin name \"" + o.name +
                                   "\" must be letters, digits, '.', '_' or '-', and not \"local\"");
  }
  if (!(o.url.starts_with("http://") || o.url.starts_with("https://") || o.imap()) ||
      o.url.find("://") + 3 >= o.url.size()) {
    return Status::InvalidArgument("origin " + o.name + ": \"" + o.url +
                                   "\" is not an http://, https://, imap:// or imaps:// URL");
  }
  if (o.imap()) {
    Result<ImapUrl> u = ParseImapUrl(o.url);
    if (!u.ok()) return Status::InvalidArgument("origin " + o.name + ": " + u.status().message());
    if (u->user.empty()) return Status::InvalidArgument("origin " + o.name + ": \"" + o.url + "\" names no user (imap://USER@HOST:PORT/)");
    if (!u->mailbox.empty()) return Status::InvalidArgument("origin " + o.name + ": \"" + o.url + "\" must name the server, not a mailbox (end it after HOST:PORT/)");
  }
  if (o.url.find_first_of(" \t\r\n") != std::string::npos) {
    return Status::InvalidArgument("origin " + o.name + ": URL contains white space");
  }
  if (!o.url.ends_with("/")) o.url += '/';
  return o;
}

Result<Bytes> ParseSize(const std::string& text) {
  Bytes v = 0;
  auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || p == text.data()) return Status::InvalidArgument("size \"" + text + "\" is not a number");
  std::string suffix(p, text.data() + text.size());
  Bytes mult = 1;
  if (suffix.empty() || suffix == "B") mult = 1;
  else if (suffix == "K" || suffix == "KiB") mult = 1ull << 10;
  else if (suffix == "M" || suffix == "MiB") mult = 1ull << 20;
  else if (suffix == "G" || suffix == "GiB") mult = 1ull << 30;
  else if (suffix == "T" || suffix == "TiB") mult = 1ull << 40;
  else return Status::InvalidArgument("size \"" + text + "\": unknown suffix \"" + suffix + "\" (use K, M, G or T)");
  if (v > (~Bytes{0}) / mult) return Status::InvalidArgument("size \"" + text + "\" is too large");
  return v * mult;
}

Status LoadConfigFile(const std::string& path, GhostfsOptions* o) {
  Result<toml::table> parsed = ParseTomlFile(path);
  if (!parsed.ok()) return parsed.status();
  toml::table& t = *parsed;
  static const std::set<std::string> kKeys = {
      "cache",     "cache_size",          "profile",         "knob",   "control",
      "max_stale", "heuristic_freshness", "write_queue_cap", "fill_backlog_max", "cacert", "imap_delete",
      "policy",    "ghost_hints",         "passthrough",     "origins", "stall_timeout",
      "log_file",  "log_level",           "devices",         "manage_disk", "force_manage_disk",
      "flash_log", "flash_policy", "flash_alg", "flash_device"};
  for (auto&& [k, v] : t) {
    if (!kKeys.count(std::string(k.str()))) {
      return Status::InvalidArgument(TomlWhere(path, v.source()) + ": unknown key \"" + std::string(k.str()) + "\"");
    }
  }
  auto str = [&](const char* key, std::string* out) -> Status {
    if (const toml::node* n = t.get(key)) {
      auto s = n->value<std::string>();
      if (!s) return Status::InvalidArgument(TomlWhere(path, n->source()) + ": \"" + key + "\" must be a string");
      *out = *s;
    }
    return Status::Ok();
  };
  auto size = [&](const char* key, Bytes* out) -> Status {
    if (const toml::node* n = t.get(key)) {
      Result<Bytes> b = TomlSize(*n, key);
      if (!b.ok()) return Status::InvalidArgument(TomlWhere(path, n->source()) + ": " + b.status().message());
      *out = *b;
    }
    return Status::Ok();
  };
  auto seconds = [&](const char* key, Duration* out) -> Status {
    if (const toml::node* n = t.get(key)) {
      auto d = n->value<double>();
      if (!d || !IsUserSeconds(*d)) return Status::InvalidArgument(TomlWhere(path, n->source()) + ": \"" + key + "\" must be a number of seconds in 0..1e9");
      *out = Seconds(*d);
    }
    return Status::Ok();
  };
  Status s;
  if (!(s = str("cache", &o->cache_dir)).ok()) return s;
  if (!(s = str("profile", &o->profile)).ok()) return s;
  if (!(s = str("control", &o->control_path)).ok()) return s;
  if (!(s = str("cacert", &o->cacert)).ok()) return s;
  if (!(s = str("log_file", &o->log_file)).ok()) return s;
  if (!(s = str("log_level", &o->log_level)).ok()) return s;
  if (const toml::node* n = t.get("log_level")) {
    if (Result<LogLevel> l = ParseLogLevel(o->log_level); !l.ok()) {
      return Status::InvalidArgument(TomlWhere(path, n->source()) + ": " + l.status().message());
    }
  }
  if (!(s = str("imap_delete", &o->imap_delete)).ok()) return s;
  if (const toml::node* n = t.get("imap_delete")) {
    if (Result<std::string> d = ParseImapDelete(o->imap_delete); !d.ok()) {
      return Status::InvalidArgument(TomlWhere(path, n->source()) + ": " + d.status().message());
    }
  }
  if (!(s = size("cache_size", &o->cache_size)).ok()) return s;
  if (!(s = size("write_queue_cap", &o->write_queue_cap)).ok()) return s;
  if (!(s = size("fill_backlog_max", &o->fill_backlog_max)).ok()) return s;
  if (!(s = seconds("max_stale", &o->max_stale)).ok()) return s;
  if (!(s = seconds("heuristic_freshness", &o->heuristic_freshness)).ok()) return s;
  if (!(s = seconds("stall_timeout", &o->stall_timeout)).ok()) return s;
  if (const toml::node* n = t.get("passthrough")) {
    auto b = n->value<bool>();
    if (!b || !n->is_boolean())
      return Status::InvalidArgument(TomlWhere(path, n->source()) +
                                     ": passthrough must be true or false");
    o->passthrough = *b;
  }
  if (const toml::node* n = t.get("knob")) {
    auto k = n->value<std::int64_t>();
    if (!k || *k < 0 || *k > 100) return Status::InvalidArgument(TomlWhere(path, n->source()) + ": knob must be an integer in 0..100");
    o->knob = static_cast<int>(*k);
  }
  if (const toml::node* n = t.get("policy")) {
    auto text = n->value<std::string>();
    if (!text)
      return Status::InvalidArgument(TomlWhere(path, n->source()) +
                                     ": policy must be \"static\" or \"adaptive\"");
    Result<Policy> p = ParsePolicy(*text);
    if (!p.ok())
      return Status::InvalidArgument(TomlWhere(path, n->source()) + ": " + p.status().message());
    o->policy = *p;
  }
  if (!(s = str("devices", &o->devices)).ok()) return s;
  if (o->devices != "auto" && o->devices != "none") {
    return Status::InvalidArgument(TomlWhere(path, t.get("devices")->source()) +
                                   ": devices must be \"auto\" or \"none\"");
  }
  if (!(s = str("manage_disk", &o->manage_disk)).ok()) return s;
  if (!(s = str("flash_log", &o->flash_log)).ok()) return s;
  if (!(s = str("flash_policy", &o->flash_policy)).ok()) return s;
  if (!(s = str("flash_device", &o->flash_device)).ok()) return s;
  if (const toml::node* n = t.get("flash_policy"); n && o->flash_policy != "each-spinup" && o->flash_policy != "when-full") {
    return Status::InvalidArgument(TomlWhere(path, n->source()) +
                                   ": flash_policy must be \"each-spinup\" or \"when-full\"");
  }
  if (const toml::node* n = t.get("flash_alg")) {
    auto a = n->value<std::int64_t>();
    if (!a || !n->is_integer() || *a < 1 || *a > 4) {
      return Status::InvalidArgument(TomlWhere(path, n->source()) + ": flash_alg must be 1, 2, 3 or 4");
    }
    o->flash_alg = static_cast<int>(*a);
  }
  if (const toml::node* n = t.get("force_manage_disk")) {
    auto b = n->value<bool>();
    if (!b || !n->is_boolean())
      return Status::InvalidArgument(TomlWhere(path, n->source()) +
                                     ": force_manage_disk must be true or false");
    o->force_manage_disk = *b;
  }
  if (const toml::node* n = t.get("ghost_hints")) {
    auto b = n->value<bool>();
    if (!b || !n->is_boolean())
      return Status::InvalidArgument(TomlWhere(path, n->source()) +
                                     ": ghost_hints must be true or false");
    o->ghost_hints = *b;
  }
  if (const toml::node* n = t.get("origins")) {
    const toml::table* origins = n->as_table();
    if (!origins) return Status::InvalidArgument(TomlWhere(path, n->source()) + ": [origins] must be a table of NAME = \"URL\"");
    for (auto&& [k, v] : *origins) {
      // NAME = "URL", or NAME = { url = "URL", password_file = "PATH" } (or password = "...").
      std::optional<std::string> url = v.value<std::string>();
      std::string password_file, password;
      if (const toml::table* spec = v.as_table()) {
        for (auto&& [sk, sv] : *spec) {
          std::string key(sk.str());
          if (key != "url" && key != "password_file" && key != "password") {
            return Status::InvalidArgument(TomlWhere(path, sv.source()) + ": unknown origin key \"" + key + "\" (url, password_file, password)");
          }
          if (!sv.value<std::string>()) return Status::InvalidArgument(TomlWhere(path, sv.source()) + ": \"" + key + "\" must be a string");
        }
        url = (*spec)["url"].value<std::string>();
        password_file = (*spec)["password_file"].value_or(std::string());
        password = (*spec)["password"].value_or(std::string());
      }
      if (!url) return Status::InvalidArgument(TomlWhere(path, v.source()) + ": origin URL must be a string (or a table with url)");
      Result<Origin> origin = ParseOrigin(std::string(k.str()) + "=" + *url);
      if (!origin.ok()) return Status::InvalidArgument(TomlWhere(path, v.source()) + ": " + origin.status().message());
      if ((!password_file.empty() || !password.empty()) && !origin->imap()) {
        return Status::InvalidArgument(TomlWhere(path, v.source()) + ": origin " + origin->name + ": a password is only for imap:// and imaps:// origins");
      }
      origin.value().password_file = password_file;
      origin.value().password = password;
      o->origins.push_back(*origin);
    }
  }
  return Status::Ok();
}

Result<std::string> ParseImapDelete(const std::string& text) {
  if (text == "expunge") return std::string();
  if (text.starts_with("move:") && text.size() > 5 &&
      text.find_first_of("\r\n") == std::string::npos) {
    return text.substr(5);
  }
  return Status::InvalidArgument("imap_delete \"" + text +
                                 "\" must be \"expunge\" or \"move:MAILBOX\" (e.g. move:Trash)");
}

Status ApplyPasswordFile(const std::string& spec, GhostfsOptions* options) {
  auto eq = spec.find('=');
  if (eq == std::string::npos || eq + 1 >= spec.size()) {
    return Status::InvalidArgument("--password-file \"" + spec + "\" is not NAME=PATH");
  }
  std::string name = spec.substr(0, eq);
  for (Origin& o : options->origins) {
    if (o.name != name) continue;
    if (!o.imap()) return Status::InvalidArgument("--password-file: origin " + name + " is not an imap:// or imaps:// origin");
    o.password_file = spec.substr(eq + 1);
    o.password.clear();
    return Status::Ok();
  }
  return Status::InvalidArgument("--password-file: no origin named \"" + name + "\"");
}

Result<std::string> ReadOriginPassword(const Origin& o) {
  if (!o.password.empty()) return o.password;
  if (o.password_file.empty()) {
    return Status::InvalidArgument("origin " + o.name + ": no password (password_file in the config, or --password-file " + o.name + "=PATH)");
  }
  std::ifstream in(o.password_file);
  if (!in) return Status::NotFound("origin " + o.name + ": cannot read password file " + o.password_file);
  std::string line;
  std::getline(in, line);
  if (!line.empty() && line.back() == '\r') line.pop_back();
  if (line.empty()) return Status::InvalidArgument("origin " + o.name + ": password file " + o.password_file + " is empty");
  return line;
}

Status Validate(const GhostfsOptions& o) {
  if (o.cache_dir.empty()) return Status::InvalidArgument("no cache directory (--cache DIR)");
  if (o.mountpoint.empty()) return Status::InvalidArgument("no mount point");
  if (o.knob < 0 || o.knob > 100) return Status::InvalidArgument("knob " + std::to_string(o.knob) + " is outside 0..100");
  if (Result<std::string> d = ParseImapDelete(o.imap_delete); !d.ok()) return d.status();
  if (!o.cacert.empty() && ::access(o.cacert.c_str(), R_OK) != 0) {
    return Status::InvalidArgument("cacert \"" + o.cacert +
                                   "\" cannot be read (a PEM file of CA certificates)");
  }
  std::set<std::string> names;
  for (const Origin& origin : o.origins) {
    if (!names.insert(origin.name).second) return Status::InvalidArgument("origin name \"" + origin.name + "\" given twice");
    if (origin.imap() && origin.password.empty() && origin.password_file.empty()) {
      return Status::InvalidArgument("origin " + origin.name + ": no password (password_file in the config, or --password-file " + origin.name + "=PATH)");
    }
  }
  return Status::Ok();
}

}  // namespace ghost
