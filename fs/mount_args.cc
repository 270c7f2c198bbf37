#include "fs/mount_args.h"

#include <algorithm>
#include <array>
#include <string_view>
#include <vector>

namespace ghost {
namespace {

// -o keys that are ghostfs settings (spelled as in the config file, common/config/config.h).
constexpr std::array<std::string_view, 19> kValueKeys = {
    "cache", "origin",  "password_file", "profile", "knob",   "policy",
    "control", "config", "cache_size",   "max_stale", "cacert", "imap_delete",
    "devices", "manage_disk", "log_file", "log_level", "flash_log", "flash_policy", "flash_alg"};
constexpr std::array<std::string_view, 3> kFlagKeys = {"no_passthrough", "no_ghost_hints",
                                                       "force_manage_disk"};
// Options for mount(8) and mount.fuse3, meaningless to the file system.
constexpr std::array<std::string_view, 10> kMountOnly = {
    "auto", "noauto", "user", "users", "nouser", "owner", "group", "_netdev", "nofail", "defaults"};

template <std::size_t N>
bool In(const std::array<std::string_view, N>& set, std::string_view s) {
  return std::find(set.begin(), set.end(), s) != set.end();
}

std::string AsLongOption(std::string_view key) {
  std::string o = "--" + std::string(key);
  std::replace(o.begin(), o.end(), '_', '-');
  return o;
}

// Splits one -o value at commas and sorts its entries into `ghost_args` and `fuse`.
void SortOptions(std::string_view list, std::vector<std::string>* ghost_args,
                 std::vector<std::string>* fuse) {
  while (!list.empty()) {
    const std::size_t comma = list.find(',');
    std::string_view entry = list.substr(0, comma);
    list = comma == std::string_view::npos ? std::string_view() : list.substr(comma + 1);
    if (entry.empty()) continue;
    const std::size_t eq = entry.find('=');
    const std::string_view key = entry.substr(0, eq);
    if (eq != std::string_view::npos && In(kValueKeys, key)) {
      ghost_args->push_back(AsLongOption(key));
      ghost_args->emplace_back(entry.substr(eq + 1));
    } else if (eq == std::string_view::npos && In(kFlagKeys, key)) {
      ghost_args->push_back(AsLongOption(key));
    } else if (In(kMountOnly, key) || key == "comment" || key.starts_with("x-")) {
      // for mount(8); dropped
    } else {
      fuse->emplace_back(entry);
    }
  }
}

}  // namespace

std::vector<std::string> RewriteMountArgs(const std::vector<std::string>& args,
                                          const std::vector<std::string>& value_options) {
  if (args.empty()) return args;
  std::vector<std::string> out = {args[0]}, positionals, ghost_args, fuse;
  for (std::size_t i = 1; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "-o" && i + 1 < args.size()) {
      SortOptions(args[++i], &ghost_args, &fuse);
    } else if (a.starts_with("-o") && a.size() > 2) {
      SortOptions(std::string_view(a).substr(2), &ghost_args, &fuse);
    } else if (a.starts_with("-")) {
      out.push_back(a);
      const bool takes_value = a.find('=') == std::string::npos &&
          std::find(value_options.begin(), value_options.end(), a) != value_options.end();
      if (takes_value && i + 1 < args.size()) out.push_back(args[++i]);
    } else {
      positionals.push_back(a);
    }
  }
  if (positionals.size() == 2) {
    // mount.fuse3's form: SOURCE MOUNTPOINT.
    if (positionals[0].find('/') != std::string::npos) {
      out.push_back("--config");
      out.push_back(positionals[0]);
    }
    positionals.erase(positionals.begin());
  }
  out.insert(out.end(), ghost_args.begin(), ghost_args.end());
  if (!fuse.empty()) {
    std::string joined;
    for (const std::string& f : fuse) joined += (joined.empty() ? "" : ",") + f;
    out.push_back("-o");
    out.push_back(joined);
  }
  out.insert(out.end(), positionals.begin(), positionals.end());
  return out;
}

namespace {

std::size_t EditDistance(std::string_view a, std::string_view b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diag = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      std::size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

}  // namespace

std::string UnknownLongOption(const std::vector<std::string>& args, const std::vector<std::string>& known) {
  for (std::size_t i = 1; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--") break;
    if (!a.starts_with("--") || a.size() == 2) continue;
    std::string name = a.substr(0, a.find('='));
    if (std::find(known.begin(), known.end(), name) != known.end()) continue;
    std::string msg = "unknown option " + name;
    std::string best;
    std::size_t best_d = 3;  // suggest only near names
    for (const std::string& k : known) {
      std::size_t d = EditDistance(name, k);
      if (d < best_d) {
        best_d = d;
        best = k;
      }
    }
    if (!best.empty()) msg += " (did you mean " + best + "?)";
    return msg;
  }
  return {};
}

}  // namespace ghost
