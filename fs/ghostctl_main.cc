// ghostctl: the command-line client of ghostfs's control socket (DESIGN §4.2; the protocol and
// the shapes of the results are in common/control/control.h).
//
//   ghostctl [--mount MNT | --control PATH] [--json]
//            devices | knob [K] | stats [--proxy ADDR] | status PATH | flush | sync | watch
//
// Which ghostfs: --control PATH, else the one mounted at MNT (its socket is derived from the
// mount point: MountControlPath, common/control/control.h), else $GHOST_CONTROL, else the only
// ghostfs mounted; with none of these, a message says what was tried.
//
// `stats --proxy ADDR` also reads ghostproxy's GET /ghost/status (HTTP, ADDR is its listen
// address or URL) and prints its download shaping: shaped downloads, bursts, mean burst size,
// estimated card sleep, missed packets, slowdown (proxy/shaper.h, ShapingStatusJson).
//
// Human-readable output by default, the raw JSON result with --json. `watch` subscribes to
// mode changes and stats and redraws on every pushed event; it never polls the daemon.
//
// Exit codes: 0 success, 1 ghostfs is not running or refused the request, 2 bad arguments.
#include <poll.h>
#include <signal.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <curl/curl.h>
#include <cassert>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "common/build_info.h"
#include "fs/observability_text.h"
#include "common/control/control.h"
#include "common/imap/outbox.h"
#include "common/control/protocol.h"
#include "common/base/units.h"

namespace {

using nlohmann::json;

constexpr int kFailed = 1;
constexpr int kUsage = 2;
// Replies to everything but flush come at once from a healthy daemon; a wedged one should not
// hang a shell forever.
constexpr ghost::Duration kCallTimeout = ghost::Seconds(30);

int Usage(const std::string& msg) {
  std::fprintf(stderr, "ghostctl: %s\nRun 'ghostctl --help' for usage.\n", msg.c_str());
  return kUsage;
}

int Failed(const std::string& msg) {
  std::fprintf(stderr, "ghostctl: %s\n", msg.c_str());
  return kFailed;
}

// ---- Reading results that may lack fields ----

// The member at `keys` below `j`, or null when any step is missing.
const json* Find(const json& j, std::initializer_list<const char*> keys) {
  const json* at = &j;
  for (const char* k : keys) {
    if (!at->is_object()) return nullptr;
    auto it = at->find(k);
    if (it == at->end()) return nullptr;
    at = &*it;
  }
  return at;
}

std::optional<double> Number(const json& j, std::initializer_list<const char*> keys) {
  const json* v = Find(j, keys);
  if (v == nullptr || !v->is_number()) return std::nullopt;
  return v->get<double>();
}

std::string Text(const json& j, std::initializer_list<const char*> keys) {
  const json* v = Find(j, keys);
  if (v == nullptr || v->is_null()) return "-";
  if (v->is_string()) return v->get<std::string>();
  return v->dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string Printf(const char* fmt, double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), fmt, v);
  return buf;
}

std::string PowerText(std::optional<double> w) {
  if (!w) return "-";
  if (*w >= 1 || *w == 0) return Printf("%.2f W", *w);
  return Printf("%.0f mW", *w * 1e3);
}

std::string EnergyText(std::optional<double> j) {
  if (!j) return "-";
  if (std::fabs(*j) >= 1e4) return Printf("%.2f kJ", *j / 1e3);
  if (std::fabs(*j) >= 100) return Printf("%.1f J", *j);
  return Printf("%.2f J", *j);
}

std::string BytesText(std::optional<double> b) {
  if (!b) return "-";
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = *b;
  int u = 0;
  while (std::fabs(v) >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  if (u == 0) return Printf("%.0f B", v);
  return Printf("%.1f ", v) + units[u];
}

std::string DurationText(std::optional<double> s) {
  if (!s) return "-";
  if (*s < 60) return Printf("%.1f s", *s);
  auto total = static_cast<long long>(*s);
  char buf[64];
  if (total < 3600) {
    std::snprintf(buf, sizeof(buf), "%lldm %02llds", total / 60, total % 60);
  } else {
    std::snprintf(buf, sizeof(buf), "%lldh %02lldm %02llds", total / 3600, total / 60 % 60,
                  total % 60);
  }
  return buf;
}

std::string CountText(std::optional<double> n) {
  if (!n) return "-";
  return Printf("%.0f", *n);
}

// "1 flush", "3 flushes", "- flushes".
std::string CountOf(std::optional<double> n, const std::string& one, const std::string& many) {
  return CountText(n) + " " + (n && *n == 1 ? one : many);
}

// The flash log's faults, when there were any: "; faults: 1 corrupt region (saved beside the
// log), 2 appends written through to the disk, ...". Empty when all are zero.
std::string FlashFaults(const json& fl) {
  std::string out;
  auto add = [&](const char* key, const std::string& one, const std::string& many) {
    std::optional<double> n = Number(fl, {key});
    if (n && *n > 0) out += (out.empty() ? "; faults: " : ", ") + CountOf(n, one, many);
  };
  add("corrupt_regions", "corrupt region (saved beside the log)", "corrupt regions (saved beside the log)");
  add("append_failures", "failed append", "failed appends");
  add("write_throughs", "append written through to the disk", "appends written through to the disk");
  add("write_through_failures", "write lost to both (reported to its writer)",
      "writes lost to both (reported to their writers)");
  add("records_kept", "record the disk refused (kept in the log)", "records the disk refused (kept in the log)");
  return out;
}

// Columns padded to their widest cell; the last column is not padded.
std::string Table(const std::vector<std::vector<std::string>>& rows) {
  std::vector<std::size_t> width;
  for (const auto& r : rows) {
    if (width.size() < r.size()) width.resize(r.size(), 0);
    for (std::size_t i = 0; i < r.size(); ++i) width[i] = std::max(width[i], r[i].size());
  }
  std::string out;
  for (const auto& r : rows) {
    for (std::size_t i = 0; i < r.size(); ++i) {
      out += r[i];
      if (i + 1 < r.size()) out += std::string(width[i] - r[i].size() + 3, ' ');
    }
    out += "\n";
  }
  return out;
}

// "memory 0, disk 3, network 5": the three sources in the model's order, then any others.
std::string RequestsText(const json& stats, const char* sep, const char* is = " ") {
  const json* req = Find(stats, {"requests"});
  if (req == nullptr || !req->is_object()) return "-";
  std::string out;
  auto add = [&](const std::string& name, const json& v) {
    if (!out.empty()) out += sep;
    out += name + is + (v.is_number() ? CountText(v.get<double>()) : std::string("-"));
  };
  for (const char* k : {"memory", "disk", "network"}) {
    if (auto it = req->find(k); it != req->end()) add(k, *it);
  }
  for (const auto& [k, v] : req->items()) {
    if (k != "memory" && k != "disk" && k != "network") add(k, v);
  }
  return out.empty() ? "-" : out;
}

// ---- The commands ----

// The real device behind a model device (ghostfs --devices auto): "standby (/dev/sda)",
// "power_save (wlan0)", "none", with "model only" when ghostfs does not drive it.
std::string HardwareText(const json& h) {
  std::string where = Text(h, {"path"}) != "-" ? Text(h, {"path"}) : Text(h, {"interface"});
  if (Text(h, {"backend"}) == "none") return "none (modelled only)";
  std::string mode = Find(h, {"hardware_mode"}) != nullptr ? Text(h, {"hardware_mode"})
                                                            : Text(h, {"link"});
  std::string out = mode + " (" + where + ")";
  const json* managed = Find(h, {"managed"});
  if (managed == nullptr || !managed->is_boolean() || !managed->get<bool>()) out += ", model only";
  return out;
}

std::string DevicesText(const json& devices) {
  bool hardware = false;
  if (devices.is_array()) {
    for (const json& d : devices) hardware = hardware || Find(d, {"hardware"}) != nullptr;
  }
  std::vector<std::vector<std::string>> rows = {{"DEVICE", "KIND", "MODE", "POWER", "POLICY"}};
  if (hardware) rows[0].insert(rows[0].begin() + 3, "REAL DEVICE");
  std::string notes;
  if (devices.is_array()) {
    for (const json& d : devices) {
      rows.push_back({Text(d, {"name"}), Text(d, {"kind"}), Text(d, {"mode"}),
                      PowerText(Number(d, {"power_w"})), Text(d, {"policy"})});
      if (!hardware) continue;
      const json* h = Find(d, {"hardware"});
      rows.back().insert(rows.back().begin() + 3, h ? HardwareText(*h) : "-");
      for (const char* k : {"note", "error"}) {
        if (h != nullptr && Find(*h, {k}) != nullptr) notes += Text(d, {"name"}) + ": " + Text(*h, {k}) + "\n";
      }
    }
  }
  if (rows.size() == 1) return "no devices registered\n";
  return Table(rows) + (notes.empty() ? "" : "\n" + notes);
}

// "9.2 W measured (BAT0), 12.1 J since start" beside "model 7.1 W".
std::string MeasuredText(const json& s) {
  const json* m = Find(s, {"measured"});
  if (m == nullptr) return "";
  std::string names;
  if (const json* meters = Find(*m, {"meters"}); meters != nullptr && meters->is_array()) {
    for (const json& r : *meters) {
      std::string one = Text(r, {"name"});
      if (const json* ok = Find(r, {"ok"}); ok != nullptr && ok->is_boolean() && !ok->get<bool>()) {
        one += ": " + Text(r, {"error"});
      }
      names += (names.empty() ? "" : ", ") + one;
    }
  }
  if (names.empty()) return "none (no battery or RAPL meter)";
  return PowerText(Number(*m, {"power_w"})) + ", " + EnergyText(Number(*m, {"energy_j"})) +
         " since start (" + names + ")";
}

std::string StatsText(const json& s) {
  std::vector<std::vector<std::string>> rows;
  rows.push_back({"uptime", DurationText(Number(s, {"uptime_s"}))});
  rows.push_back({"knob", CountText(Number(s, {"knob"}))});
  std::string energy = EnergyText(Number(s, {"energy_j", "total"})) + " total";
  if (auto base = Number(s, {"energy_j", "base"})) energy += ", base " + EnergyText(base);
  if (!ghost::EnergyModelled(s)) energy = "";  // 0 J of an ideal machine says nothing
  if (std::string m = ghost::EnergyModelText(s); !m.empty()) energy += (energy.empty() ? "" : "; ") + m;
  rows.push_back({"energy", energy});
  if (std::string saved = ghost::SavedText(s); !saved.empty()) rows.push_back({"saved", saved});
  if (const json* o = Find(s, {"origins"})) {
    for (auto& [k, v] : ghost::OriginRows(*o)) rows.push_back({k, v});
  }
  if (const json* devs = Find(s, {"energy_j", "devices"}); devs != nullptr && devs->is_object()) {
    for (const auto& [name, j] : devs->items()) {
      rows.push_back({"  " + name, j.is_number() ? EnergyText(j.get<double>()) : "-"});
    }
  }
  if (std::string measured = MeasuredText(s); !measured.empty()) {
    rows.push_back({"power", "model " + PowerText(Number(s, {"model", "power_w"})) + ", measured " + measured});
  }
  if (const json* n = Find(s, {"naps"}); n != nullptr && n->is_object()) {
    // Naps of shaped downloads on the emulated card (ghostproxy --mount; DESIGN §3.6).
    rows.push_back({"naps", CountText(Number(*n, {"naps"})) + " (" +
                                CountText(Number(*n, {"refused"})) + " refused), asleep " +
                                DurationText(Number(*n, {"asleep_s"})) + ", " +
                                EnergyText(Number(*n, {"energy_j"})) + ", saved " +
                                EnergyText(Number(*n, {"saved_j"}))});
  }
  rows.push_back({"requests", RequestsText(s, ", ")});
  rows.push_back({"ghost hints", CountText(Number(s, {"ghost_hints_sent"})) + " sent"});
  if (Find(s, {"fuse"}) != nullptr) {
    // Reads of passthrough opens go from the kernel to the cached body, never to the daemon.
    rows.push_back({"fuse reads",
                    CountText(Number(s, {"fuse", "reads"})) + " through the daemon; passthrough " +
                        Text(s, {"fuse", "passthrough", "state"}) + ", " +
                        CountOf(Number(s, {"fuse", "passthrough", "opens"}), "open", "opens")});
  }
  std::string wq = BytesText(Number(s, {"write_queue", "queued_bytes"})) + " queued, " +
                   CountOf(Number(s, {"write_queue", "flushes"}), "flush", "flushes");
  rows.push_back({"write queue", wq});
  if (const json* fl = Find(s, {"flash_log"}); fl != nullptr && fl->is_object()) {
    // The flash log in front of the disk (ghostfs --flash-log): fill, records, flushes by reason.
    std::string flushes;
    if (const json* by = Find(*fl, {"flushes"}); by != nullptr && by->is_object()) {
      for (const auto& [reason, n] : by->items()) {
        flushes += (flushes.empty() ? "" : ", ") + reason + " " + (n.is_number() ? CountText(n.get<double>()) : "-");
      }
    }
    rows.push_back({"flash log", BytesText(Number(*fl, {"used"})) + " of " + BytesText(Number(*fl, {"capacity"})) +
                                     ", " + CountOf(Number(*fl, {"records"}), "record", "records") + "; flushes: " +
                                     flushes + "; " + BytesText(Number(*fl, {"bytes_merged_away"})) + " merged away" +
                                     FlashFaults(*fl)});
  }
  if (const json* imap = Find(s, {"imap"}); imap != nullptr && imap->is_object()) {
    rows.push_back({"imap", CountText(Number(s, {"imap", "queued"})) + " operations queued, " +
                                CountText(Number(s, {"imap", "sent"})) + " sent, " +
                                CountText(Number(s, {"imap", "dropped"})) + " dropped"});
  }
  std::string cache = CountOf(Number(s, {"cache", "objects"}), "object", "objects") + ", " +
                      BytesText(Number(s, {"cache", "bytes"}));
  if (auto cap = Number(s, {"cache", "capacity"})) cache += " of " + BytesText(cap);
  rows.push_back({"cache", cache});
  // Damaged state the daemon set aside at a start instead of losing it (fs/observability.cc):
  // one row per file, so that nobody misses that a change may wait in one.
  if (const json* kept = Find(s, {"kept_aside"}); kept != nullptr && kept->is_array()) {
    for (const json& k : *kept) {
      rows.push_back({"kept aside", Text(k, {"path"}) + " (" + BytesText(Number(k, {"bytes"})) +
                                        "; damaged state, read it and remove it)"});
    }
  }
  return Table(rows);
}

// ghostproxy's download shaping, from the "shaping" object of its /ghost/status
// (proxy/shaper.h: ShapingStatusJson): rows for the stats table.
std::vector<std::vector<std::string>> ShapingRows(const json& status) {
  const json* sh = Find(status, {"shaping"});
  if (sh == nullptr || !sh->is_object()) return {{"shaping", "- (ghostproxy did not say)"}};
  std::string head = Text(*sh, {"mode"});
  if (auto k = Number(*sh, {"knob_used"}); k && *k >= 0) head += ", knob " + CountText(k);
  const std::optional<double> n = Number(*sh, {"shaped_downloads"});
  std::string downloads = CountText(n) + " shaped";
  if (auto a = Number(*sh, {"active"}); a && *a > 0) downloads += " (" + CountText(a) + " now)";
  downloads += ", " + CountText(Number(*sh, {"declined"})) + " declined, " +
               CountText(Number(*sh, {"saturated"})) + " left for plain TCP (saturated)";
  std::string bursts = CountText(Number(*sh, {"bursts"}));
  if (auto b = Number(*sh, {"bursts"}); b && *b > 0) bursts += ", " + BytesText(Number(*sh, {"mean_burst_bytes"})) + " mean";
  std::string slowdown = "-";
  if (auto d = Number(*sh, {"mean_slowdown"})) slowdown = Printf("%.2f×", *d) + " plain TCP's time (mean)";
  return {{"shaping", head},
          {"  downloads", downloads},
          {"  bursts", bursts},
          {"  card asleep", DurationText(Number(*sh, {"sleep_s"})) + " (estimated)"},
          {"  missed packets", CountText(Number(*sh, {"missed_packets"}))},
          {"  slowdown", slowdown}};
}

std::size_t AppendToString(char* data, std::size_t size, std::size_t n, void* out) {
  static_cast<std::string*>(out)->append(data, size * n);
  return size * n;
}

// GET http://ADDR/ghost/status from ghostproxy (ADDR: HOST:PORT or a URL). Never through a
// proxy from the environment: the proxy asked is the one named.
ghost::Result<json> ProxyStatus(const std::string& addr) {
  std::string url = addr.find("://") == std::string::npos ? "http://" + addr : addr;
  while (!url.empty() && url.back() == '/') url.pop_back();
  url += "/ghost/status";
  CURL* curl = curl_easy_init();
  if (curl == nullptr) return ghost::Status::Unavailable("curl_easy_init failed");
  std::string body;
  char err[CURL_ERROR_SIZE] = "";
  curl_easy_setopt(curl, CURLOPT_URL, url.c_str());
  curl_easy_setopt(curl, CURLOPT_NOPROXY, "*");
  curl_easy_setopt(curl, CURLOPT_TIMEOUT, 10L);
  curl_easy_setopt(curl, CURLOPT_FAILONERROR, 1L);
  curl_easy_setopt(curl, CURLOPT_ERRORBUFFER, err);
  curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, &AppendToString);
  curl_easy_setopt(curl, CURLOPT_WRITEDATA, &body);
  const CURLcode rc = curl_easy_perform(curl);
  curl_easy_cleanup(curl);
  if (rc != CURLE_OK) {
    return ghost::Status::Unavailable("cannot read " + url + ": " + (err[0] ? err : curl_easy_strerror(rc)) +
                                      "; is ghostproxy listening there? (--proxy ADDR)");
  }
  json j = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return ghost::Status::Unavailable(url + " did not answer with a JSON object");
  return j;
}

// The cost model's estimates, one source per line part: "disk 12 ms, 0.05 J; network ...".
std::string CostText(const json* cost) {
  if (cost == nullptr || !cost->is_object() || cost->empty()) return "-";
  std::string out;
  for (const auto& [source, e] : cost->items()) {
    if (!e.is_object()) continue;
    std::optional<double> time_s = Number(e, {"time_s"});
    if (!time_s) {
      if (auto ms = Number(e, {"time_ms"})) time_s = *ms / 1e3;
    }
    std::string part = source;
    if (time_s) part += " " + (*time_s < 1 ? Printf("%.0f ms", *time_s * 1e3) : DurationText(time_s));
    if (auto j = Number(e, {"energy_j"})) part += ", " + EnergyText(j);
    out += (out.empty() ? "" : "; ") + part;
  }
  return out.empty() ? Text(*cost, {}) : out;
}

std::string StatusText(const json& r) {
  std::string cached = "-";
  if (const json* c = Find(r, {"cached"}); c != nullptr && c->is_boolean()) {
    cached = c->get<bool>() ? "yes" : "no";
  }
  std::string size = "-";
  if (auto b = Number(r, {"size"})) size = BytesText(b) + " (" + CountText(b) + " bytes)";
  std::vector<std::vector<std::string>> rows = {{"path", Text(r, {"path"})}};
  if (Find(r, {"url"}) != nullptr) rows.push_back({"url", Text(r, {"url"})});
  std::vector<std::vector<std::string>> rest = {
      {"cached", cached},
      {"size", size},
      {"source preference", Text(r, {"source_preference"})},
      {"last source", Text(r, {"last_source"})},
      {"cost", CostText(Find(r, {"cost"}))}};
  rows.insert(rows.end(), rest.begin(), rest.end());
  if (const json* o = Find(r, {"origin"}); o != nullptr && o->is_object()) {
    for (auto& [k, v] : ghost::OriginRows(json{{"", *o}})) rows.push_back({"origin", v});
  }
  return Table(rows);
}

std::string KnobText(const json& r) {
  ghost::Result<ghost::KnobResult> k = ghost::KnobResult::FromJson(r);
  if (!k.ok()) return "knob " + Text(r, {"knob"}) + "\n";
  std::string out = "knob " + std::to_string(k->knob);
  if (k->previous) out += " (was " + std::to_string(*k->previous) + ")";
  return out + "\n";
}

// "flushed 12.0 KiB in 0.3 s; 2 IMAP operations sent", and what stays queued, if anything.
std::string FlushText(const json& r) {
  std::string out = "flushed";
  if (auto b = Number(r, {"flushed_bytes"})) out += " " + BytesText(b);
  if (auto d = Number(r, {"duration_s"})) out += " in " + DurationText(d);
  if (auto sent = Number(r, {"imap", "sent"}); sent && *sent > 0) out += "; " + CountOf(sent, "IMAP operation", "IMAP operations") + " sent";
  if (auto left = Number(r, {"imap", "left"}); left && *left > 0) {
    out += "; " + CountOf(left, "IMAP operation", "IMAP operations") + " still queued (" +
           Text(r, {"imap", "why"}) + ")";
  }
  return out + "\n";
}

std::string SyncText(const json& r) {
  std::string out = CountOf(Number(r, {"sent"}), "IMAP operation", "IMAP operations") + " sent";
  if (auto left = Number(r, {"left"}); left && *left > 0) {
    out += "; " + CountOf(left, "operation", "operations") + " still queued (" + Text(r, {"why"}) + ")";
  }
  return out + "\n";
}

// ---- watch ----

// What `watch` shows: the devices table and the stats, kept current by pushed events.
struct WatchView {
  json devices = json::array();
  json stats = json::object();

  // A modes event: the whole devices array, or one device {"device":name,"id":n,"mode":..}.
  void ApplyMode(const json& m) {
    if (m.is_array()) {
      devices = m;
      return;
    }
    if (!m.is_object() || !devices.is_array()) return;
    const json name = m.contains("device") ? m["device"] : m.value("name", json());
    json* target = nullptr;
    for (json& d : devices) {
      bool same_id = m.contains("id") && d.contains("id") && m["id"] == d["id"];
      bool same_name = !name.is_null() && d.contains("name") && name == d["name"];
      if (same_id || same_name) target = &d;
    }
    if (target == nullptr) {
      devices.push_back({{"name", name.is_null() ? json("?") : name}});
      target = &devices.back();
    }
    for (const char* k : {"mode", "mode_index", "power_w"}) {
      if (m.contains(k)) (*target)[k] = m[k];
    }
  }

  void Apply(const json& event) {
    std::string topic = Text(event, {"event"});
    const json* data = Find(event, {"data"});
    if (data == nullptr) return;
    if (topic == "modes") ApplyMode(*data);
    if (topic == "stats" && data->is_object()) stats = *data;
  }

  std::string Energy(const json& d) const {
    const json* name = Find(d, {"name"});
    if (name == nullptr || !name->is_string()) return "-";
    return EnergyText(Number(stats, {"energy_j", "devices", name->get<std::string>().c_str()}));
  }

  // The full-screen view (for a terminal).
  std::string Screen(const std::string& control) const {
    std::string out = "ghostfs at " + control + "   up " +
                      DurationText(Number(stats, {"uptime_s"})) + "   knob " +
                      CountText(Number(stats, {"knob"})) + "   (Ctrl-C quits)\n\n";
    std::vector<std::vector<std::string>> rows = {{"DEVICE", "MODE", "POWER", "ENERGY"}};
    for (const json& d : devices) {
      rows.push_back(
          {Text(d, {"name"}), Text(d, {"mode"}), PowerText(Number(d, {"power_w"})), Energy(d)});
    }
    out += Table(rows) + "\n";
    std::string energy = EnergyText(Number(stats, {"energy_j", "total"}));
    if (auto base = Number(stats, {"energy_j", "base"}))
      energy += " (base " + EnergyText(base) + ")";
    if (!ghost::EnergyModelled(stats)) energy = "";
    if (std::string m = ghost::EnergyModelText(stats); !m.empty())
      energy += (energy.empty() ? "" : "; ") + m;
    std::vector<std::vector<std::string>> summary = {{"energy", energy}};
    if (std::string measured = MeasuredText(stats); !measured.empty()) {
      summary.push_back({"power", "model " + PowerText(Number(stats, {"model", "power_w"})) +
                                      ", measured " + measured});
    }
    summary.push_back({"requests", RequestsText(stats, "   ")});
    summary.push_back({"ghost hints", CountText(Number(stats, {"ghost_hints_sent"})) + " sent"});
    if (std::string saved = ghost::SavedText(stats); !saved.empty()) summary.push_back({"saved", saved});
    out += Table(summary);
    return out;
  }

  // One line per update (for a pipe or a log).
  std::string Line() const {
    std::string out = "uptime=" + Printf("%.1f", Number(stats, {"uptime_s"}).value_or(0)) + "s";
    for (const json& d : devices) out += " " + Text(d, {"name"}) + "=" + Text(d, {"mode"});
    if (ghost::EnergyModelled(stats)) {
      out += " energy=" + Printf("%.2f", Number(stats, {"energy_j", "total"}).value_or(0)) + "J";
      if (const json* p = Find(stats, {"energy_model", "profile"}); p != nullptr && p->is_string())
        out += " modelled=" + p->get<std::string>();
      if (auto saved = Number(stats, {"saved", "energy_j"})) out += " saved=" + Printf("%.2f", *saved) + "J";
    } else {
      out += " energy=not-modelled";
    }
    if (auto w = Number(stats, {"measured", "power_w"})) {
      out += " model_power=" + Printf("%.2f", Number(stats, {"model", "power_w"}).value_or(0)) +
             "W measured_power=" + Printf("%.2f", *w) + "W";
    }
    out += " requests=" + RequestsText(stats, ",", ":");
    out += " hints=" + CountText(Number(stats, {"ghost_hints_sent"}));
    return out + "\n";
  }
};

// Ctrl-C (SIGINT) and SIGTERM arrive as readable bytes on a signalfd, polled with the socket,
// so the program leaves through main's normal return.
class SignalEvents {
 public:
  SignalEvents() {
    sigemptyset(&mask_);
    sigaddset(&mask_, SIGINT);
    sigaddset(&mask_, SIGTERM);
    sigprocmask(SIG_BLOCK, &mask_, nullptr);
    fd_ = signalfd(-1, &mask_, SFD_CLOEXEC);
  }
  ~SignalEvents() {
    if (fd_ >= 0) close(fd_);
    sigprocmask(SIG_UNBLOCK, &mask_, nullptr);
  }
  SignalEvents(const SignalEvents&) = delete;
  SignalEvents& operator=(const SignalEvents&) = delete;
  int fd() const { return fd_; }
  // Takes the pending signal, so that unblocking at exit does not deliver it again.
  void Consume() {
    signalfd_siginfo info;
    while (read(fd_, &info, sizeof(info)) < 0 && errno == EINTR) {
    }
  }

 private:
  sigset_t mask_;
  int fd_ = -1;
};

int Watch(ghost::ControlClient& client, const std::string& control, bool raw_json) {
  SignalEvents signals;
  if (signals.fd() < 0) return Failed(std::string("signalfd: ") + std::strerror(errno));
  auto sub = client.Call(ghost::ControlOp::kSubscribe, {{"topics", {"modes", "stats"}}}, kCallTimeout);
  if (!sub.ok()) return Failed(sub.status().message());

  // The snapshots and the events share one ordered stream: events queued before a snapshot's
  // reply are older than it. Mode events before the devices reply and stats events before the
  // stats reply are dropped; mode events between the two replies are newer, and kept.
  WatchView view;
  auto devices = client.Call(ghost::ControlOp::kDevices, json::object(), kCallTimeout);
  if (!devices.ok()) return Failed(devices.status().message());
  client.DiscardQueuedEvents();
  auto stats = client.Call(ghost::ControlOp::kStats, json::object(), kCallTimeout);
  if (!stats.ok()) return Failed(stats.status().message());
  if (devices->is_array()) view.devices = *devices;
  if (stats->is_object()) view.stats = *stats;
  for (std::size_t n = client.queued_events(); n > 0; --n) {
    auto ev = client.ReadEvent(ghost::Duration(0));
    if (ev.ok() && Text(*ev, {"event"}) == "modes" && !raw_json) view.Apply(*ev);
  }

  const bool tty = isatty(STDOUT_FILENO) == 1;
  auto draw = [&] {
    if (raw_json) return;
    if (tty) {
      std::cout << "\x1b[H\x1b[2J" << view.Screen(control) << std::flush;
    } else {
      std::cout << view.Line() << std::flush;
    }
  };
  draw();
  for (;;) {
    if (client.queued_events() == 0) {
      pollfd fds[2] = {{signals.fd(), POLLIN, 0}, {client.fd(), POLLIN, 0}};
      if (poll(fds, 2, -1) < 0) {
        if (errno == EINTR) continue;
        return Failed(std::string("poll: ") + std::strerror(errno));
      }
      if (fds[0].revents != 0) {  // Ctrl-C: a clean exit
        signals.Consume();
        break;
      }
      auto first = client.ReadEvent(ghost::Duration(0));
      if (!first.ok()) {
        if (first.status().code() == ghost::Status::Code::kTimedOut) continue;  // part of a line
        if (tty && !raw_json) std::cout << "\n";
        return Failed(first.status().message());
      }
      if (raw_json)
        std::cout << first->dump(-1, ' ', false, json::error_handler_t::replace) << "\n";
      view.Apply(*first);
    }
    // Apply everything already here, then draw once.
    while (client.queued_events() > 0) {
      auto ev = client.ReadEvent(ghost::Duration(0));
      if (!ev.ok()) break;
      if (raw_json) std::cout << ev->dump(-1, ' ', false, json::error_handler_t::replace) << "\n";
      view.Apply(*ev);
    }
    if (raw_json) std::cout << std::flush;
    draw();
  }
  if (tty && !raw_json) std::cout << "\n";
  return 0;
}

// The commands that make one call: the op each sends and how its result is printed.
struct Command {
  const char* name;
  const char* help;
  ghost::ControlOp op;
  std::string (*text)(const json& result);
  bool waits;  // no time limit: the reply comes when the device has done the work
};
const Command kCommands[] = {
    {"devices", "devices, their power modes and policies", ghost::ControlOp::kDevices, &DevicesText,
     false},
    {"knob", "[K]: print the performance/energy knob, or set it (0 saves energy, 100 performance)",
     ghost::ControlOp::kKnob, &KnobText, false},
    {"stats", "uptime, energy, requests by source, ghost hints, write queue, cache",
     ghost::ControlOp::kStats, &StatsText, false},
    {"status", "PATH: cache status of a file in the mount", ghost::ControlOp::kStatus, &StatusText,
     false},
    {"flush", "send every deferred operation now: cache writes and queued IMAP operations (waits)",
     ghost::ControlOp::kFlush, &FlushText, true},
    {"sync", "send the queued IMAP operations now (waits until the server has them)",
     ghost::ControlOp::kSync, &SyncText, true},
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "ghostctl: talk to the ghostfs daemon through its control socket (common/DESIGN.md §4.2).\n"
      "Which ghostfs: --control PATH, else the one mounted at --mount MNT, else "
      "$GHOST_CONTROL, else the only ghostfs mounted."};
  app.set_version_flag("--version", std::string("ghostctl ") + GHOST_VERSION,
                       "print the version and exit");
  std::string control, mount;
  bool raw_json = false;
  app.add_option("--control", control,
                 "control socket of ghostfs (only needed if ghostfs was started with --control)");
  app.add_option("--mount", mount, "the ghostfs mount point; its control socket is found from it");
  app.add_flag("--json", raw_json, "print the raw JSON result");
  app.require_subcommand(1, 1);
  app.fallthrough();  // so `ghostctl stats --json` works as well as `ghostctl --json stats`

  std::vector<CLI::App*> subcommands;
  for (const Command& c : kCommands) subcommands.push_back(app.add_subcommand(c.name, c.help));
  CLI::App* knob = subcommands[1];
  CLI::App* stats = subcommands[2];
  std::string proxy_addr;
  stats->add_option("--proxy", proxy_addr,
                    "also ghostproxy's download shaping, from its /ghost/status (ADDR: its "
                    "--listen address, e.g. 127.0.0.1:3128, or a URL)");
  CLI::App* status = subcommands[3];
  std::string knob_text;
  knob->add_option("K", knob_text, "new knob value, 0 (save energy) .. 100 (performance)");
  std::string status_path;
  status->add_option("PATH", status_path, "a file in the mount")->required();
  CLI::App* watch =
      app.add_subcommand("watch", "live view of device modes, energy and requests (Ctrl-C quits)");
  // Reads ghostproxy's outbox directory itself (common/imap/outbox.h): no ghostfs needed.
  CLI::App* outbox = app.add_subcommand(
      "outbox", "mail waiting in ghostproxy's SMTP outbox, and mail the server refused");
  std::string outbox_dir;
  outbox->add_option("DIR", outbox_dir, "the outbox directory (ghostproxy --smtp-outbox)")->required();
  try {
    app.parse(argc, argv);
  } catch (const CLI::Success& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    return Usage(e.what());
  }

  json args = json::object();
  if (knob->parsed() && !knob_text.empty()) {
    ghost::Result<int> k = ghost::ParseKnobText(knob_text);
    if (!k.ok()) return Usage("knob: " + k.status().message());
    args["value"] = *k;
  }
  if (status->parsed()) {
    std::error_code ec;
    if (!std::filesystem::exists(std::filesystem::symlink_status(status_path, ec))) {
      return Failed("status: " + status_path + ": " +
                    (ec ? ec.message() : std::string(std::strerror(ENOENT))));
    }
    std::filesystem::path abs = std::filesystem::absolute(status_path, ec);
    args["path"] = ec ? status_path : abs.lexically_normal().string();
  }

  if (outbox->parsed()) {
    ghost::Result<json> list = ghost::ListOutbox(outbox_dir);
    if (!list.ok()) return Failed(list.status().message());
    if (raw_json) {
      std::cout << list->dump(-1, ' ', false, json::error_handler_t::replace) << "\n";
      return 0;
    }
    for (const char* kind : {"waiting", "refused"}) {
      std::cout << kind << ": " << (*list)[kind].size() << "\n";
      for (const json& m : (*list)[kind]) {
        std::string rcpts;
        for (const json& r : m["rcpts"]) rcpts += (rcpts.empty() ? "" : ",") + r.get<std::string>();
        std::cout << "  " << m.value("id", "") << "  <" << m.value("from", "") << "> -> " << rcpts
                  << "  " << m.value("size", 0) << " bytes";
        if (m.contains("reply")) std::cout << "  server: " << m.value("reply", "");
        std::cout << "\n";
      }
    }
    return 0;
  }
  // stats --proxy: ghostproxy's part first, so it is printed even without a ghostfs.
  std::optional<json> proxy_status;
  if (stats->parsed() && !proxy_addr.empty()) {
    ghost::Result<json> st = ProxyStatus(proxy_addr);
    if (!st.ok()) return Failed(st.status().message());
    proxy_status = std::move(*st);
  }
  // Without a ghostfs, stats --proxy prints the proxy's part and still fails (exit 1).
  auto proxy_only = [&](const std::string& msg) {
    if (proxy_status) {
      if (raw_json) {
        std::cout << json{{"ghostproxy", *proxy_status}}.dump(-1, ' ', false, json::error_handler_t::replace) << "\n";
      } else {
        std::cout << Table(ShapingRows(*proxy_status));
      }
      std::cout << std::flush;
    }
    return Failed(msg);
  };
  ghost::Result<std::string> path = ghost::FindControlPath(control, mount);
  if (!path.ok()) return proxy_only(path.status().message());
  ghost::Result<ghost::ControlClient> client = ghost::ControlClient::Connect(*path);
  if (!client.ok()) {
    std::string msg = client.status().message();
    if (control.empty() && !mount.empty()) {
      msg += "; the control socket of the ghostfs at " + mount + " (if it was started with " +
             "--control, pass the same --control here)";
    }
    return proxy_only(msg);
  }

  if (watch->parsed()) return Watch(*client, *path, raw_json);

  const Command* command = nullptr;
  for (std::size_t i = 0; i < subcommands.size(); ++i) {
    if (subcommands[i]->parsed()) command = &kCommands[i];
  }
  assert(command != nullptr);
  std::optional<ghost::Duration> timeout;
  if (!command->waits) timeout = kCallTimeout;
  ghost::Result<json> result = client->Call(command->op, args, timeout);
  if (!result.ok()) return proxy_only(result.status().message());
  if (proxy_status) {
    // The daemon's stats with ghostproxy's status beside them (as "ghostproxy").
    if (raw_json) {
      json both = *result;
      both["ghostproxy"] = *proxy_status;
      std::cout << both.dump(-1, ' ', false, json::error_handler_t::replace) << "\n";
    } else {
      std::cout << command->text(*result) << Table(ShapingRows(*proxy_status));
    }
  } else if (raw_json) {
    std::cout << result->dump(-1, ' ', false, json::error_handler_t::replace) << "\n";
  } else {
    std::cout << command->text(*result);
  }
  // sync could not send everything (the server is unreachable): the operations stay queued.
  if (command->op == ghost::ControlOp::kSync && Number(*result, {"left"}).value_or(0) > 0) return kFailed;
  return 0;
}
