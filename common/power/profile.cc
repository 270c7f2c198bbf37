#include "common/power/profile.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <toml++/toml.h>

#include "common/build_info.h"

namespace ghost {
namespace {

namespace fs = std::filesystem;

// "file:line: message"
Status Bad(const std::string& source, const toml::source_region& where, const std::string& msg) {
  std::string loc = source;
  if (where.begin.line > 0) loc += ":" + std::to_string(where.begin.line);
  return Status::InvalidArgument(loc + ": " + msg);
}

// Reads the fields of one TOML table, remembering the first error; every getter names the
// key and its line on failure.
class Fields {
 public:
  Fields(const toml::table& t, const std::string& source, const std::string& what)
      : t_(t), source_(source), what_(what) {}

  std::string String(const char* key, bool required = true) {
    const toml::node* n = t_.get(key);
    if (!n) {
      if (required) Fail(t_.source(), std::string(what_) + " needs \"" + key + "\"");
      return "";
    }
    if (auto v = n->value<std::string>()) return *v;
    Fail(n->source(), std::string("\"") + key + "\" must be a string");
    return "";
  }

  // A number in 0..kMaxNumber; `fallback` if absent and not required. The bound keeps every
  // conversion that follows (milliseconds to a Duration, MiB to Bytes, a count to int) in range:
  // 1e9 is a petabyte in MiB, 11 days in ms, a terabyte a second in KiB/s.
  static constexpr double kMaxNumber = 1e9;
  double Number(const char* key, bool required, double fallback = 0) {
    const toml::node* n = t_.get(key);
    if (!n) {
      if (required) Fail(t_.source(), std::string(what_) + " needs \"" + key + "\"");
      return fallback;
    }
    std::optional<double> v = n->value<double>();  // integers convert too
    if (!v || !(*v >= 0 && *v <= kMaxNumber)) {
      Fail(n->source(), std::string("\"") + key + "\" must be a number in 0..1e9");
      return fallback;
    }
    return *v;
  }

  bool Bool(const char* key, bool fallback) {
    const toml::node* n = t_.get(key);
    if (!n) return fallback;
    if (auto v = n->value<bool>()) return *v;
    Fail(n->source(), std::string("\"") + key + "\" must be true or false");
    return fallback;
  }

  void Fail(const toml::source_region& where, const std::string& msg) {
    if (status_.ok()) status_ = Bad(source_, where, msg);
  }
  const Status& status() const { return status_; }

 private:
  const toml::table& t_;
  const std::string& source_;
  std::string what_;
  Status status_;
};

Result<toml::table> ParseToml(const std::string& text, const std::string& source) {
  try {
    return toml::parse(text, source);
  } catch (const toml::parse_error& e) {
    return Bad(source, e.source(), std::string(e.description()));
  }
}

Result<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return Status::NotFound(path + ": cannot open profile");
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

bool LooksLikePath(const std::string& s) {
  return s.find('/') != std::string::npos || (s.size() > 5 && s.ends_with(".toml"));
}

Result<std::string> ResolveProfile(const std::string& name_or_path, const std::string& dir) {
  if (LooksLikePath(name_or_path)) return name_or_path;
  if (name_or_path.empty() || name_or_path.find("..") != std::string::npos) {
    return Status::InvalidArgument("bad profile name \"" + name_or_path + "\"");
  }
  std::string path = dir + "/" + name_or_path + ".toml";
  if (fs::exists(path)) return path;
  std::string list;
  for (const std::string& n : ListProfiles(dir)) list += (list.empty() ? "" : ", ") + n;
  if (!list.empty()) {
    return Status::NotFound("unknown profile \"" + name_or_path + "\" in " + dir +
                            " (available: " + list + ")");
  }
  // No profiles at all: say every place the default search tried.
  std::string looked;
  for (const std::string& d : ProfileDirCandidates()) looked += (looked.empty() ? "" : ", ") + d;
  return Status::NotFound("unknown profile \"" + name_or_path + "\": no profiles in " + dir +
                          (dir == DefaultProfileDir() ? " (looked in " + looked + ")" : "") +
                          "; set $GHOST_PROFILE_DIR to the directory of the .toml profiles, "
                          "or give a profile file's path");
}

Result<DeviceProfile> DeviceFromTable(const toml::table& t, const std::string& source) {
  Fields f(t, source, "a device profile");
  DeviceProfile d;
  d.source = source;
  d.name = f.String("name");
  d.description = f.String("description", false);
  std::string kind = f.String("kind");
  if (kind == "disk") d.kind = DeviceKind::kDisk;
  else if (kind == "network") d.kind = DeviceKind::kNetwork;
  else if (kind == "flash") d.kind = DeviceKind::kFlash;
  else if (kind == "memory") d.kind = DeviceKind::kMemory;
  else if (f.status().ok()) f.Fail(t.get("kind")->source(), "kind \"" + kind + "\" is not disk, network, flash or memory");
  d.flash.erase_segment = static_cast<Bytes>(f.Number("erase_segment_kib", false) * 1024);
  d.flash.erase_time = Millis(f.Number("erase_ms", false));
  d.flash.erase_power = Power::Milliwatts(f.Number("erase_mw", false));
  d.flash.capacity = static_cast<Bytes>(f.Number("capacity_mib", false) * 1024 * 1024);
  d.flash.erase_chip = static_cast<Bytes>(f.Number("erase_chip_kib", false) * 1024);
  if (const double idle = f.Number("clean_idle_ms", false, -1); idle >= 0) {
    d.flash.clean_idle = Millis(idle);
  }
  if (const double shuffle = f.Number("clean_wear_shuffle", false); shuffle != 0) {
    if (shuffle != static_cast<double>(static_cast<std::uint32_t>(shuffle))) {
      f.Fail(t.get("clean_wear_shuffle")->source(),
             "\"clean_wear_shuffle\" must be a whole number (every Nth cleaning)");
    }
    d.flash.clean_wear_shuffle = static_cast<std::uint32_t>(shuffle);
  }
  if (!f.status().ok()) return f.status();

  const toml::array* modes = t["mode"].as_array();
  if (!modes || modes->empty()) return Bad(source, t.source(), "a device profile needs at least one [[mode]]");
  for (const toml::node& n : *modes) {
    const toml::table* mt = n.as_table();
    if (!mt) return Bad(source, n.source(), "[[mode]] must be a table");
    Fields m(*mt, source, "a [[mode]]");
    Mode mode;
    mode.name = m.String("name");
    mode.power = Power::Milliwatts(m.Number("power_mw", true));
    mode.serves_io = m.Bool("serves_io", false);
    mode.beacon_interval = Millis(m.Number("beacon_ms", false));
    if (mode.serves_io) {
      bool net = d.kind == DeviceKind::kNetwork;
      mode.io.latency = Millis(m.Number("latency_ms", !net));
      mode.io.read_bandwidth = Bandwidth::KilobytesPerSecond(m.Number("read_kib_s", !net));
      mode.io.write_bandwidth = Bandwidth::KilobytesPerSecond(m.Number("write_kib_s", !net));
      mode.io.active_power = Power::Milliwatts(m.Number("active_mw", true));
      if (!net && m.status().ok() && (mode.io.read_bandwidth.is_zero() || mode.io.write_bandwidth.is_zero())) {
        m.Fail(mt->source(), "mode \"" + mode.name + "\" serves I/O but has a zero bandwidth");
      }
    }
    if (!m.status().ok()) return m.status();
    if (d.ModeIndex(mode.name) >= 0) return Bad(source, mt->source(), "mode \"" + mode.name + "\" defined twice");
    d.modes.push_back(std::move(mode));
  }
  if (!d.modes[0].serves_io) return Bad(source, modes->source(), "the first [[mode]] (the high-power mode) must serve I/O");

  if (const toml::node* tn = t.get("transition")) {
    const toml::array* trs = tn->as_array();
    if (!trs) return Bad(source, tn->source(), "[[transition]] must be an array of tables");
    for (const toml::node& n : *trs) {
      const toml::table* tt = n.as_table();
      if (!tt) return Bad(source, n.source(), "[[transition]] must be a table");
      Fields x(*tt, source, "a [[transition]]");
      std::string from = x.String("from"), to = x.String("to");
      Transition tr;
      tr.time = Millis(x.Number("time_ms", true));
      tr.energy = Energy::Millijoules(x.Number("energy_mj", true));
      if (!x.status().ok()) return x.status();
      tr.from = d.ModeIndex(from);
      tr.to = d.ModeIndex(to);
      if (tr.from < 0) return Bad(source, tt->source(), "transition from unknown mode \"" + from + "\"");
      if (tr.to < 0) return Bad(source, tt->source(), "transition to unknown mode \"" + to + "\"");
      if (tr.from == tr.to) return Bad(source, tt->source(), "transition from a mode to itself");
      if (tr.time == Duration::zero() && tr.energy > Energy()) {
        return Bad(source, tt->source(), "a transition with energy must take time (time_ms > 0)");
      }
      d.transitions.push_back(tr);
    }
  }
  // Every low-power mode must be reachable from and back to the high-power mode.
  for (int m = 1; m < static_cast<int>(d.modes.size()); ++m) {
    if (!d.FindTransition(0, m) || !d.FindTransition(m, 0)) {
      return Bad(source, t.source(), "mode \"" + d.modes[m].name + "\" needs transitions to and from \"" + d.modes[0].name + "\"");
    }
  }
  return d;
}

}  // namespace

const char* DeviceKindName(DeviceKind kind) {
  switch (kind) {
    case DeviceKind::kDisk: return "disk";
    case DeviceKind::kNetwork: return "network";
    case DeviceKind::kFlash: return "flash";
    case DeviceKind::kMemory: return "memory";
  }
  return "?";
}

int DeviceProfile::ModeIndex(const std::string& mode_name) const {
  for (int i = 0; i < static_cast<int>(modes.size()); ++i) {
    if (modes[i].name == mode_name) return i;
  }
  return -1;
}

const Transition* DeviceProfile::FindTransition(int from, int to) const {
  for (const Transition& t : transitions) {
    if (t.from == from && t.to == to) return &t;
  }
  return nullptr;
}

Transition DeviceProfile::TransitionCost(int from, int to) const {
  Transition r;
  r.from = from;
  r.to = to;
  if (from == to) return r;
  if (const Transition* t = FindTransition(from, to)) return *t;
  // Compose through the high-power mode (validated to exist at load).
  const Transition* a = from == 0 ? nullptr : FindTransition(from, 0);
  const Transition* b = to == 0 ? nullptr : FindTransition(0, to);
  if (a) { r.time += a->time; r.energy += a->energy; }
  if (b) { r.time += b->time; r.energy += b->energy; }
  return r;
}

const DeviceProfile* MachineProfile::FindDevice(DeviceKind kind) const {
  for (const DeviceProfile& d : devices) {
    if (d.kind == kind) return &d;
  }
  return nullptr;
}

std::vector<std::string> ProfileDirCandidates() {
  if (const char* env = std::getenv("GHOST_PROFILE_DIR"); env && *env) return {env};
  std::error_code exe_ec, root_ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", exe_ec);
  // /proc/self/exe has no symlinks; the configured build root may.
  const std::string build_root = fs::weakly_canonical(GHOST_BUILD_ROOT, root_ec).string() + "/";
  if (!exe_ec && !root_ec && exe.string().starts_with(build_root)) {
    return {GHOST_SOURCE_PROFILE_DIR};
  }
  std::vector<std::string> dirs;
  if (!exe_ec && !std::string_view(GHOST_PROFILE_DIR_FROM_BINDIR).empty()) {
    dirs.push_back((exe.parent_path() / GHOST_PROFILE_DIR_FROM_BINDIR).lexically_normal().string());
  }
  if (dirs.empty() || dirs[0] != GHOST_INSTALLED_PROFILE_DIR) {
    dirs.push_back(GHOST_INSTALLED_PROFILE_DIR);
  }
  return dirs;
}

std::string DefaultProfileDir() {
  const std::vector<std::string> dirs = ProfileDirCandidates();
  for (const std::string& d : dirs) {
    std::error_code ec;
    if (fs::is_directory(d, ec)) return d;
  }
  return dirs.front();
}

std::vector<std::string> ListProfiles(const std::string& dir) {
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    if (e.path().extension() == ".toml") names.push_back(e.path().stem().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

Result<DeviceProfile> ParseDeviceProfile(const std::string& text, const std::string& source) {
  Result<toml::table> t = ParseToml(text, source);
  if (!t.ok()) return t.status();
  return DeviceFromTable(*t, source);
}

Result<DeviceProfile> LoadDeviceProfile(const std::string& name_or_path, const std::string& dir) {
  Result<std::string> path = ResolveProfile(name_or_path, dir);
  if (!path.ok()) return path.status();
  Result<std::string> text = ReadFile(*path);
  if (!text.ok()) return text.status();
  return ParseDeviceProfile(*text, *path);
}

Result<MachineProfile> ParseMachineProfile(const std::string& text, const std::string& source,
                                           const std::string& dir) {
  Result<toml::table> parsed = ParseToml(text, source);
  if (!parsed.ok()) return parsed.status();
  const toml::table& t = *parsed;
  if (t["kind"].value_or(std::string()) != "machine") {
    // A lone device: put it on the paper's machine so it can be simulated.
    Result<DeviceProfile> d = DeviceFromTable(t, source);
    if (!d.ok()) return d.status();
    Result<MachineProfile> host = LoadMachineProfile("ipaq-2004", dir);
    if (!host.ok()) return host.status().WithContext("device profile " + source + " needs the ipaq-2004 machine");
    MachineProfile m = *host;
    m.name = d->name;
    m.source = source;
    std::erase_if(m.devices, [&](const DeviceProfile& x) { return x.kind == d->kind; });
    m.devices.insert(m.devices.begin(), std::move(d).value());
    return m;
  }
  Fields f(t, source, "a machine profile");
  MachineProfile m;
  m.source = source;
  m.name = f.String("name");
  m.description = f.String("description", false);
  m.base_power = Power::Milliwatts(f.Number("base_power_mw", true));
  if (!f.status().ok()) return f.status();
  const toml::table* link = t["link"].as_table();
  if (!link) return Bad(source, t.source(), "a machine profile needs a [link] table");
  Fields l(*link, source, "[link]");
  m.link.one_way_delay = Millis(l.Number("one_way_delay_ms", true));
  m.link.down = Bandwidth::KilobitsPerSecond(l.Number("down_kbit_s", true));
  m.link.up = Bandwidth::KilobitsPerSecond(l.Number("up_kbit_s", true));
  m.link.round_trips = static_cast<int>(l.Number("round_trips", false, 1));
  m.link.warm_round_trips = static_cast<int>(l.Number("warm_round_trips", false, m.link.round_trips));
  m.link.keepalive = Seconds(l.Number("keepalive_s", false, 0));
  if (!l.status().ok()) return l.status();
  if (m.link.down.is_zero() || m.link.up.is_zero()) return Bad(source, link->source(), "link bandwidths must be positive");
  if (m.link.round_trips < 1 || m.link.warm_round_trips < 1 || m.link.warm_round_trips > m.link.round_trips) {
    return Bad(source, link->source(), "round_trips must be ≥ 1 and warm_round_trips between 1 and round_trips");
  }
  const toml::node* devs = t.get("devices");
  const toml::array* arr = devs ? devs->as_array() : nullptr;
  if (!arr) return Bad(source, t.source(), "a machine profile needs devices = [\"name\", ...]");
  for (const toml::node& n : *arr) {
    std::optional<std::string> name = n.value<std::string>();
    if (!name) return Bad(source, n.source(), "device names must be strings");
    Result<DeviceProfile> d = LoadDeviceProfile(*name, dir);
    if (!d.ok()) return Bad(source, n.source(), d.status().message());
    m.devices.push_back(std::move(d).value());
  }
  return m;
}

Result<MachineProfile> LoadMachineProfile(const std::string& name_or_path, const std::string& dir) {
  Result<std::string> path = ResolveProfile(name_or_path, dir);
  if (!path.ok()) return path.status();
  Result<std::string> text = ReadFile(*path);
  if (!text.ok()) return text.status();
  std::string d = LooksLikePath(name_or_path) ? fs::path(*path).parent_path().string() : dir;
  if (d.empty()) d = ".";
  // Device names inside a machine file resolve next to it, then in the shipped directory.
  Result<MachineProfile> m = ParseMachineProfile(*text, *path, d);
  if (!m.ok() && d != dir && m.status().code() == Status::Code::kInvalidArgument &&
      m.status().message().find("unknown profile") != std::string::npos) {
    return ParseMachineProfile(*text, *path, dir);
  }
  return m;
}

}  // namespace ghost
