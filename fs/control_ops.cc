// The control socket's operations (DESIGN §4.2; protocol and result shapes in
// common/control/control.h): status, hint, knob, devices, stats, flush.
#include <chrono>

#include "common/power/machine.h"
#include "fs/ghostfs_internal.h"
#include "fs/mail_tree.h"

namespace ghost {

nlohmann::json Daemon::DevicesJson() const {
  nlohmann::json out = nlohmann::json::array();
  for (DeviceId id : pm_->devices()) {
    const Device& d = pm_->device(id);
    nlohmann::json modes = nlohmann::json::array();
    for (const Mode& m : d.profile().modes) modes.push_back({{"name", m.name}, {"power_w", m.power.watts()}});
    DevicePolicy* p = pm_->policy(id);
    out.push_back({{"id", id},
                   {"name", d.name()},
                   {"kind", DeviceKindName(d.kind())},
                   {"mode", d.profile().modes[d.mode()].name},
                   {"mode_index", d.mode()},
                   {"modes", modes},
                   {"power_w", d.profile().modes[d.mode()].power.watts()},
                   {"policy", p ? p->Describe() : "none (always ready)"}});
  }
  return out;
}

nlohmann::json Daemon::StatsJson() const {
  EnergyReport e = pm_->meter().Read();
  nlohmann::json devices = nlohmann::json::object();
  for (const DeviceEnergy& d : e.devices) devices[d.name] = d.energy.joules();
  nlohmann::json requests = nlohmann::json::object();
  for (const char* s : {"memory", "disk", "network", "revalidated", "stale"}) {
    auto it = requests_by_source_.find(s);
    requests[s] = it == requests_by_source_.end() ? 0 : it->second;
  }
  const WriteQueueStats& w = queue_->stats();
  // Per device, in the shape of ghostsim's report (common/power/machine.h), so a live run's JSON
  // can be compared field by field.
  nlohmann::json device_detail =
      nlohmann::json::parse(DevicesToJson(DeviceResults(*pm_, e)).dump());
  return {
      {"uptime_s", ToSeconds(clock_->Now() - started_)},
      {"knob", pm_->knob()},
      {"policy", PolicyName(options_.policy)},
      {"ghost_hints", cost_->ghost_hints()},
      {"devices", device_detail},
      {"profile", machine_->profile().name},
      {"energy_j", {{"total", e.total.joules()}, {"base", e.base.joules()}, {"devices", devices}}},
      {"requests", requests},
      {"bytes", {{"network", bytes_from_network_}, {"cache", bytes_from_cache_}}},
      {"ghost_hints_sent", cost_->hints_sent()},
      // READ requests the daemon served; reads of passthrough opens never reach it.
      {"fuse", {{"reads", fuse_reads_}, {"passthrough", passthrough_->StatsJson()}}},
      {"proxy", StoreStatsJson()},
      {"imap", mail_->StatsJson()},
      {"write_queue",
       {{"queued_bytes", queue_->queued_bytes()},
        {"flushes", w.flushes_power_callback + w.flushes_cap + w.flushes_sync + w.flushes_explicit},
        {"flushes_power_callback", w.flushes_power_callback},
        {"flushes_cap", w.flushes_cap}}},
      {"cache",
       {{"objects", store_->index().size()},
        {"bytes", store_->index().total_bytes()},
        // null: no cap
        {"capacity",
         options_.cache_size ? nlohmann::json(options_.cache_size) : nlohmann::json()}}}};
}

void Daemon::PublishModes() {
  if (!control_) return;
  control_->Publish("modes", DevicesJson());
  control_->Publish("stats", StatsJson());
}

void Daemon::HandleControl(const nlohmann::json& request, ControlServer::Reply reply) {
  const std::string op = request.value("op", "");
  if (op == "devices") return reply(DevicesJson());
  if (op == "stats") return reply(StatsJson());
  if (op == "knob") {
    if (request.contains("value")) {
      const nlohmann::json& v = request["value"];
      if (!v.is_number_integer() || v.get<int>() < 0 || v.get<int>() > 100) {
        return reply.Error("knob: value must be an integer in 0..100");
      }
      pm_->SetKnob(v.get<int>());  // every STPM module retunes now
      PublishModes();
    }
    return reply({{"knob", pm_->knob()}});
  }
  if (op == "flush") {
    auto start = std::chrono::steady_clock::now();
    Bytes queued = queue_->queued_bytes();
    return queue_->FlushAll([reply, start, queued] {
      reply({{"flushed_bytes", queued},
             {"duration_s", std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count()}});
    });
  }
  if (op == "drop_caches") {
    return reply({{"dropped", manager_->ForgetMemory()}});
  }
  if (op == "hint") {
    std::string kind = request.value("kind", "");
    DeviceId id = -1;
    const nlohmann::json& dev = request.contains("device") ? request["device"] : nlohmann::json();
    for (DeviceId d : pm_->devices()) {
      if ((dev.is_number_integer() && dev.get<int>() == d) || (dev.is_string() && dev.get<std::string>() == pm_->device(d).name())) id = d;
    }
    if (id < 0) return reply.Error("hint: no device " + dev.dump());
    double t = request.value("time_s", 0.0), e = request.value("energy_j", 0.0);
    if (t < 0 || e < 0) return reply.Error("hint: time_s and energy_j must be >= 0");
    if (kind == "ghost") pm_->SendGhostHint(id, {Seconds(t), Energy::Joules(e)});
    else if (kind == "transfer_begin") pm_->TransferBegin(id);
    else if (kind == "transfer_end") pm_->TransferEnd(id);
    else if (kind != "background") return reply.Error("hint: kind must be ghost, transfer_begin, transfer_end or background");
    return reply(nlohmann::json::object());
  }
  if (op == "lookup" || op == "store" || op == "refresh" || op == "invalidate" ||
      op == "transfer" || op == "served") {
    return StoreControl(op, request, std::move(reply));
  }
  if (op == "status") {
    std::string path = request.value("path", "");
    std::string rel = path;
    if (!options_.mountpoint.empty() && rel.starts_with(options_.mountpoint)) rel = rel.substr(options_.mountpoint.size());
    while (rel.starts_with("/")) rel.erase(0, 1);
    auto slash = rel.find('/');
    std::string top = rel.substr(0, slash);
    std::string inside = slash == std::string::npos ? "" : rel.substr(slash + 1);
    if (inside.find("..") != std::string::npos) return reply.Error("status: " + path + ": '..' is not allowed");
    for (int i = 0; i < static_cast<int>(options_.origins.size()); ++i) {
      if (options_.origins[i].name != top) continue;
      Node probe;
      probe.kind = NodeKind::kOriginFile;
      probe.origin = i;
      probe.path = inside;
      std::string url = OriginUrl(&probe);
      const CacheEntry* e = MountEntry(url);
      nlohmann::json cost = nlohmann::json::object();
      std::string preference = "network";
      if (e) {
        SourceEstimate disk = cost_->Estimate({Source::kDisk, disk_id_}, e->size);
        SourceEstimate net = cost_->Estimate({Source::kNetwork, net_id_}, e->size);
        cost["disk"] = {{"time_s", ToSeconds(disk.time)}, {"energy_j", disk.energy.joules()}};
        cost["network"] = {{"time_s", ToSeconds(net.time)}, {"energy_j", net.energy.joules()}};
        preference = disk.cost <= net.cost ? "disk" : "network";
      }
      Node* n = inodes_.FindByPath(NodeKind::kOriginFile, i, inside);
      auto d = n ? decisions_.find(n->ino) : decisions_.end();
      return reply({{"path", path},
                    {"url", url},
                    {"cached", e != nullptr},
                    {"state", e ? (preference == "disk" ? "present" : "present-network-preferred") : "absent"},
                    {"size", e ? nlohmann::json(e->size) : nlohmann::json()},
                    {"source_preference", preference},
                    {"last_source", d != decisions_.end() ? d->second.source : "none"},
                    {"cost", cost}});
    }
    return reply.Error("status: " + path + ": no such file in the mount (not under an origin)");
  }
  reply.Error("unknown op \"" + op + "\"");
}

}  // namespace ghost
