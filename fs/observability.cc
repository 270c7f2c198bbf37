// What the daemon tells its user about itself: origin health and the log lines of
// origin failures and state changes (common/http/origin_health.h, common/base/log.h), device
// mode changes with who caused them, the static baseline run beside the live policy
// (common/cache/shadow_baseline.h) and whether the energy figures are modelled at all.
#include <dirent.h>
#include <sys/stat.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "common/base/log.h"
#include "fs/flash_local.h"
#include "fs/ghostfs_internal.h"

namespace ghost {

void Daemon::StartObserving() {
  std::vector<OriginHealth::Origin> origins;
  for (const Origin& o : options_.origins) {
    if (o.url.starts_with("http://") || o.url.starts_with("https://") || o.imap()) origins.push_back({o.name, o.url});
  }
  health_ = std::make_unique<OriginHealth>(*clock_, std::move(origins));
  health_->on_change = [this](const std::string& name, OriginHealth::State state) {
    if (!control_) return;
    control_->Publish("events", {{"type", "origin"}, {"origin", name}, {"state", OriginHealth::StateName(state)}});
    control_->Publish("stats", StatsJson());
  };

  // Each mode change, one line: the disk's at info (a spin-up costs seconds and joules, and
  // a user asks why the disk spun up), the card's at debug (it changes mode every transfer).
  for (DeviceId id : {disk_id_, net_id_}) {
    auto previous = std::make_shared<int>(pm_->device(id).mode());
    for (int m = 0; m < pm_->NumModes(id); ++m) {
      pm_->Subscribe(id, m, [this, id, previous](DeviceId, int mode) {
        const Device& d = pm_->device(id);
        const auto& modes = d.profile().modes;
        if (mode == *previous || mode < 0 || mode >= static_cast<int>(modes.size())) return;
        const bool disk = id == disk_id_;
        // Who: the I/O waiting for it (a read, or a flush of the write queue), else the policy
        // (a timer, or ghost hints that made the high-power mode worth it).
        std::string why = d.has_work() ? "for I/O" : "by its power policy";
        if (disk && d.has_work() && write_back_->queue().queued_bytes() == 0 && write_back_->WritingBatch()) why = "for the write queue's flush";
        Log(disk ? LogLevel::kInfo : LogLevel::kDebug, "%s %s: %s -> %s %s", DeviceKindName(d.kind()),
            d.name().c_str(), (*previous >= 0 && *previous < static_cast<int>(modes.size())) ? modes[*previous].name.c_str() : "?",
            modes[mode].name.c_str(), why.c_str());
        *previous = mode;
      });
    }
  }

  // The static baseline on the same reads: only with a profile (an ideal machine spends
  // nothing on either side).
  if (!options_.profile.empty()) {
    Result<std::unique_ptr<ShadowBaseline>> shadow = ShadowBaseline::Build(*clock_, *machine_, kPageCacheModelBytes);
    if (shadow.ok()) {
      shadow_ = std::move(shadow).value();
      // "today" survives remounts: the day's figures so far are kept in the cache directory.
      if (Status s = shadow_->KeepDay(options_.cache_dir + "/saved-today.json"); !s.ok()) {
        Log(LogLevel::kWarn, "%s", s.ToString().c_str());
      }
      manager_->SetObserver([this](const ObjectState& s, const ReadDecision& d) { shadow_->Observe(s, d); });
    } else {
      Log(LogLevel::kWarn, "no static baseline beside the live policy: %s", shadow.status().ToString().c_str());
    }
  }
}

void Daemon::ImapOutcome(const std::string& url, bool answered, const Status& status) {
  if (health_) health_->RecordImap(url, answered, status);
}

void Daemon::BaselineWrite(Bytes size) {
  if (shadow_) shadow_->ObserveWrite(size);
}

void Daemon::BaselineFetch(Bytes size) {
  if (shadow_) shadow_->ObserveFetch(size);
}

nlohmann::json Daemon::EnergyModelJson() const {
  if (options_.profile.empty()) {
    return {{"modelled", false},
            {"profile", nullptr},
            {"note", "energy is not modelled: no --profile, the devices are ideal (always ready, "
                     "no power drawn); mount with --profile NAME to model a machine's devices"}};
  }
  return {{"modelled", true},
          {"profile", machine_->profile().name},
          {"source", machine_->profile().source},
          {"measured", false},
          {"note", "modelled from profile " + machine_->profile().name +
                       " (emulated devices and their delays; no energy meter measures this machine)"}};
}

namespace {

// Whether a name in the cache or flash-log directory is damaged state set aside at a start:
// FILE.damaged (the IMAP journal and appended UIDs: common/imap/imap_queue.cc,
// fs/mail_tree.cc), objects-db.corrupt-* (common/cache/cache_store.cc) and the flash log's
// corrupt-OFFSET[.N].bin (common/cache/flash_log.cc).
bool SetAside(std::string_view name) {
  auto ends = [&](std::string_view s) { return name.size() > s.size() && name.ends_with(s); };
  return ends(".damaged") || name.find(".corrupt-") != std::string_view::npos ||
         (name.starts_with("corrupt-") && ends(".bin"));
}

void ListSetAside(const std::string& dir, nlohmann::json* out) {
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return;
  std::vector<std::pair<std::string, Bytes>> found;
  while (const dirent* e = ::readdir(d)) {
    if (!SetAside(e->d_name)) continue;
    std::string path = dir + "/" + e->d_name;
    struct stat st;
    if (::lstat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode)) found.emplace_back(path, st.st_size);
  }
  ::closedir(d);
  std::sort(found.begin(), found.end());
  for (auto& [path, size] : found) out->push_back({{"path", path}, {"bytes", size}});
}

}  // namespace

// Damaged state the daemon set aside rather than lose (it may hold a reader's only copy of a
// change): never deleted by ghostfs; the user reads it and removes it. Listed from the
// directories at each call, so a file removed by hand drops out.
nlohmann::json Daemon::KeptAsideJson() const {
  nlohmann::json out = nlohmann::json::array();
  ListSetAside(options_.cache_dir, &out);
  if (!options_.flash_log.empty()) {
    if (Result<FlashLogSpec> spec = ParseFlashLogSpec(options_.flash_log); spec.ok()) ListSetAside(spec->dir, &out);
  }
  return out;
}

}  // namespace ghost
