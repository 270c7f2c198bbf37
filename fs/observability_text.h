// How ghostctl words what fs/observability.cc adds to the stats and status results: whether
// the energy is modelled (and from which profile), the saving against the static baseline, and
// each origin's health. Plain functions over the JSON results (common/control/protocol.h).
#ifndef GHOST_FS_OBSERVABILITY_TEXT_H_
#define GHOST_FS_OBSERVABILITY_TEXT_H_

#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "common/cache/shadow_baseline.h"

namespace ghost {

// "modelled from profile ipaq-2004" / "not modelled (no --profile: ...)"; "" for a daemon
// that does not say (older).
inline std::string EnergyModelText(const nlohmann::json& stats) {
  auto it = stats.find("energy_model");
  if (it == stats.end() || !it->is_object()) return "";
  if (!it->value("modelled", false)) {
    return "not modelled (no --profile: the devices are ideal, always ready; mount with "
           "--profile NAME to model a machine)";
  }
  std::string p = it->contains("profile") && (*it)["profile"].is_string()
                      ? (*it)["profile"].get<std::string>()
                      : "?";
  return "modelled from profile " + p + " (emulated devices, not measured)";
}

inline bool EnergyModelled(const nlohmann::json& stats) {
  auto it = stats.find("energy_model");
  return it == stats.end() || !it->is_object() || it->value("modelled", false);
}

// The saving against the static cache, or "" when there is none to say.
inline std::string SavedText(const nlohmann::json& stats) {
  auto it = stats.find("saved");
  if (it == stats.end() || !it->is_object()) return "";
  return ShadowBaseline::Sentence(*it);
}

// One row per origin: {"origin web", "up for 2 min, 12 fetches, 0 failures"}.
inline std::vector<std::pair<std::string, std::string>> OriginRows(const nlohmann::json& origins) {
  std::vector<std::pair<std::string, std::string>> rows;
  if (!origins.is_object()) return rows;
  for (const auto& [name, o] : origins.items()) rows.emplace_back("origin " + name, [&] {
      if (!o.is_object()) return std::string("-");
      char buf[128];
      std::snprintf(buf, sizeof buf, "%s for %.0f s, %llu fetches, %llu failures",
                    o.value("state", std::string("unknown")).c_str(), o.value("for_s", 0.0),
                    static_cast<unsigned long long>(o.value("fetches", 0ull)),
                    static_cast<unsigned long long>(o.value("failures", 0ull)));
      std::string out = buf;
      if (auto f = o.find("last_failure"); f != o.end() && f->is_object()) {
        std::snprintf(buf, sizeof buf, "%.0f s ago", f->value("ago_s", 0.0));
        std::string url = f->value("url", std::string()), why = f->value("reason", std::string());
        // A transport failure's reason names the request already.
        out += "; last failure " + std::string(buf) + ": " +
               (why.find(url) == std::string::npos ? url + ": " + why : why) + " (" +
               f->value("errno", std::string()) + ")";
      }
      return out;
    }());
  return rows;
}

}  // namespace ghost

#endif  // GHOST_FS_OBSERVABILITY_TEXT_H_
