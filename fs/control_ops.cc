// The control socket's operations (DESIGN §4.2; ops, arguments and result shapes in
// common/control/protocol.h), dispatched through one table of handlers.
#include <array>
#include <chrono>
#include <utility>
#include <variant>

#include "common/power/machine.h"
#include "fs/flash_local.h"
#include "fs/ghostfs_internal.h"
#include "fs/mail_tree.h"
#include "fs/origin_tree.h"
#include "fs/store_tree.h"

namespace ghost {
namespace {

// stats' "measured": the meters (read now unless read within the last second), their sum,
// and what is missing.
nlohmann::json MeasuredJson(Hardware& hw, Duration uptime) {
  hw.meters().SampleIfOlderThan(std::chrono::seconds(1));
  nlohmann::json meters = hw.meters().ToJson();
  // The battery sees the whole machine; RAPL only the package. Prefer the battery's figure.
  std::optional<double> power, energy;
  for (const char* kind : {"battery", "rapl"}) {
    if (power) break;
    for (const nlohmann::json& m : meters) {
      if (m["kind"] != kind || !m["ok"].get<bool>()) continue;
      if (m["power_w"].is_number()) power = power.value_or(0) + m["power_w"].get<double>();
      energy = energy.value_or(0) + m["energy_j"].get<double>();
    }
  }
  nlohmann::json notes = nlohmann::json::array();
  for (const std::string& n : hw.notes()) {
    if (n.starts_with("no energy meter")) notes.push_back(n);
  }
  return {{"power_w", power ? nlohmann::json(*power) : nlohmann::json()},
          {"energy_j", energy ? nlohmann::json(*energy) : nlohmann::json()},
          {"since_s", ToSeconds(uptime)},
          {"meters", meters},
          {"notes", notes}};
}

}  // namespace

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
    if (hardware_) out.back()["hardware"] = hardware_->DeviceJson(id);
  }
  return out;
}

nlohmann::json Daemon::StatsJson() const {
  EnergyReport e = pm_->meter().Read();
  nlohmann::json devices = nlohmann::json::object();
  for (const DeviceEnergy& d : e.devices) devices[d.name] = d.energy.joules();
  nlohmann::json requests = nlohmann::json::object();
  for (const char* s : {"memory", "disk", "network", "revalidated", "stale"}) requests[s] = 0;
  for (const auto& [source, n] : reads_.requests_by_source) {
    const char* label = SourceLabel(source);
    if (requests.contains(label)) requests[label] = requests[label].get<int>() + n;
  }
  const WriteQueueStats& w = write_back_->queue().stats();
  // Per device, in the shape of ghostsim's report (common/power/machine.h), so a live run's JSON
  // can be compared field by field.
  nlohmann::json device_detail =
      nlohmann::json::parse(DevicesToJson(DeviceResults(*pm_, e)).dump());
  nlohmann::json out = {
      {"uptime_s", ToSeconds(clock_->Now() - started_)},
      {"knob", pm_->knob()},
      {"policy", PolicyName(options_.policy)},
      {"ghost_hints", cost_->ghost_hints()},
      {"devices", device_detail},
      {"profile", machine_->profile().name},
      // Whether the energy figures are modelled, from which profile (fs/observability.cc).
      {"energy_model", EnergyModelJson()},
      // Against the static cache on the same reads; null when energy is not modelled.
      {"saved", shadow_ ? shadow_->ToJson() : nlohmann::json()},
      {"origins", health_ ? health_->ToJson() : nlohmann::json::object()},
      {"energy_j", {{"total", e.total.joules()}, {"base", e.base.joules()}, {"devices", devices}}},
      {"requests", requests},
      {"bytes", {{"network", reads_.bytes_from_network}, {"cache", reads_.bytes_from_cache}}},
      {"ghost_hints_sent", cost_->hints_sent()},
      // READ requests the daemon served; reads of passthrough opens never reach it.
      {"fuse", {{"reads", reads_.fuse_reads}, {"flushes", reads_.fuse_flushes}, {"pinned_opens", reads_.pinned_opens},
                {"passthrough", passthrough_->StatsJson()}}},
      {"proxy", store_tree_->StatsJson()},
      {"imap", mail_->StatsJson()},
      {"write_queue",
       {{"queued_bytes", write_back_->queue().queued_bytes()},
        {"flushes", w.flushes_power_callback + w.flushes_cap + w.flushes_sync + w.flushes_explicit},
        {"flushes_power_callback", w.flushes_power_callback},
        {"flushes_cap", w.flushes_cap},
        // The writer's side (fs/write_back.h): batches waiting for the one being written,
        // writes made (each takes every batch that waited), the most batches one took, and
        // the RAM of the fills not yet in the store against its bound.
        {"backlog_batches", write_back_->backlog_batches()},
        {"writes", write_back_->batches_written()},
        {"most_merged", write_back_->most_merged()},
        {"fill_backlog_bytes", write_back_->FillBacklogBytes()},
        {"fill_backlog_peak", write_back_->fill_backlog_peak()},
        {"fill_backlog_max", write_back_->fill_backlog_max()}}},
      {"cache",
       {{"objects", store_->index().size()},
        {"bytes", store_->index().total_bytes()},
        // null: no cap
        {"capacity",
         options_.cache_size ? nlohmann::json(options_.cache_size) : nlohmann::json()}}}};
  // The model's power now, and (--devices auto) what the machine's meters measured.
  out["model"] = {{"power_w", (pm_->base_power() + pm_->IdlePowerOfOthers(-1)).watts()}};
  if (hardware_) out["measured"] = MeasuredJson(*hardware_, clock_->Now() - started_);
  if (flash_) out["flash_log"] = flash_->StatsJson();
  out["kept_aside"] = KeptAsideJson();
  if (!options_.profile.empty()) {
    // Naps of shaped downloads on the emulated card (the nap op; DESIGN §3.6). Their energy
    // is in energy_j already: this says how much of it, and what they saved.
    const Device::NapStats& n = machine_->network().nap_stats();
    out["naps"] = {{"naps", n.naps},
                   {"refused", n.refused},
                   {"refused_slow_wake", n.refused_slow_wake},
                   {"early", n.early},
                   {"time_s", ToSeconds(n.time)},
                   {"asleep_s", ToSeconds(n.asleep)},
                   {"energy_j", n.energy.joules()},
                   {"saved_j", n.saved.joules()}};
  }
  return out;
}

void Daemon::ControlNap(const ControlRequest& request, ControlServer::Reply reply) {
  const NapArgs& a = std::get<NapArgs>(request.args);
  if (options_.profile.empty()) {
    if (!a.begin) return reply(nlohmann::json::object());
    return reply({{"napping", false}, {"reason", "no emulated card (ghostfs runs without --profile)"}});
  }
  Device& card = machine_->network();
  if (!a.begin) {
    card.EndNap();
    return reply(nlohmann::json::object());
  }
  std::string why = card.TryShapingNap(Seconds(a.due_in_s), Seconds(a.min_rtt_s), Seconds(a.wake_lead_s));
  if (!why.empty()) return reply({{"napping", false}, {"reason", why}});
  reply({{"napping", true}});
}

void Daemon::PublishModes() {
  if (!control_) return;
  if (control_->Subscribed("modes")) control_->Publish("modes", DevicesJson());
  // The stats are the dearer half: built only for a subscriber.
  if (control_->Subscribed("stats")) PublishStatsNow();
}

namespace {

// Whether a table indexed by ControlOp lists the ops in ControlOp's order.
template <typename Table>
constexpr bool InOpOrder(const Table& table) {
  for (std::size_t i = 0; i < table.size(); ++i) {
    if (static_cast<std::size_t>(table[i].first) != i) return false;
  }
  return true;
}

}  // namespace

void Daemon::HandleControl(const ControlRequest& request, ControlServer::Reply reply) {
  using OpHandler = void (Daemon::*)(const ControlRequest&, ControlServer::Reply);
  // The daemon's side of the ops table (common/control/protocol.h), indexed by ControlOp.
  // subscribe is answered by the server itself.
  static constexpr std::array<std::pair<ControlOp, OpHandler>, kControlOpCount> kOpHandlers = {{
      {ControlOp::kStatus, &Daemon::ControlStatus},
      {ControlOp::kHint, &Daemon::ControlHint},
      {ControlOp::kKnob, &Daemon::ControlKnob},
      {ControlOp::kDevices, &Daemon::ControlDevices},
      {ControlOp::kStats, &Daemon::ControlStats},
      {ControlOp::kFlush, &Daemon::ControlFlush},
      {ControlOp::kDropCaches, &Daemon::ControlDropCaches},
      {ControlOp::kSubscribe, nullptr},
      {ControlOp::kLookup, &Daemon::ControlStore},
      {ControlOp::kStore, &Daemon::ControlStore},
      {ControlOp::kRefresh, &Daemon::ControlStore},
      {ControlOp::kInvalidate, &Daemon::ControlStore},
      {ControlOp::kTransfer, &Daemon::ControlStore},
      {ControlOp::kServed, &Daemon::ControlStore},
      {ControlOp::kSync, &Daemon::ControlSync},
      {ControlOp::kNap, &Daemon::ControlNap},
  }};
  static_assert(InOpOrder(kOpHandlers), "kOpHandlers must list the ops in ControlOp's order");
  OpHandler handler = kOpHandlers[static_cast<std::size_t>(request.op)].second;
  if (handler == nullptr) {
    return reply.Error(std::string(ControlOpName(request.op)) + ": not an op of the daemon");
  }
  (this->*handler)(request, std::move(reply));
}

void Daemon::ControlDevices(const ControlRequest&, ControlServer::Reply reply) {
  reply(DevicesJson());
}

void Daemon::ControlStats(const ControlRequest&, ControlServer::Reply reply) {
  reply(StatsJson());
}

void Daemon::ControlKnob(const ControlRequest& request, ControlServer::Reply reply) {
  const KnobArgs& args = std::get<KnobArgs>(request.args);
  KnobResult out;
  if (args.value) {
    out.previous = pm_->knob();
    pm_->SetKnob(*args.value);  // every STPM module retunes now
    PublishModes();
  }
  out.knob = pm_->knob();
  reply(out.ToJson());
}

// Every queue: the cache writes, then the queued IMAP operations ("imap": sent, left, why).
void Daemon::ControlFlush(const ControlRequest&, ControlServer::Reply reply) {
  // ghostproxy's mail queues (deferred IMAP changes, the outbox) go too (proxy/network_watch.h).
  control_->Publish("events", {{"type", "flush"}});
  auto start = std::chrono::steady_clock::now();
  Bytes queued = write_back_->queue().queued_bytes();
  write_back_->queue().FlushAll([this, reply, start, queued] {
    auto answer = [reply, start, queued](nlohmann::json imap) {
      nlohmann::json out = {
          {"flushed_bytes", queued},
          {"duration_s", std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count()}};
      if (!imap.is_null()) out["imap"] = std::move(imap);
      reply(std::move(out));
    };
    auto rest = [this, answer] {
      if (!mail_) return answer(nullptr);
      mail_->Sync(answer);
    };
    // "Writes everything": what the flash log holds goes to the disk too.
    if (!flash_) return rest();
    flash_->log().Flush(LogFlushReason::kExplicit, [rest](const FlushReport&) { rest(); });
  });
}

void Daemon::ControlSync(const ControlRequest&, ControlServer::Reply reply) {
  control_->Publish("events", {{"type", "flush"}});
  if (!mail_) return reply({{"sent", 0}, {"left", 0}});
  mail_->Sync([reply](nlohmann::json r) { reply(std::move(r)); });
}

void Daemon::ControlDropCaches(const ControlRequest&, ControlServer::Reply reply) {
  reply({{"dropped", manager_->ForgetMemory()}});
}

void Daemon::ControlHint(const ControlRequest& request, ControlServer::Reply reply) {
  const HintArgs& args = std::get<HintArgs>(request.args);
  DeviceId id = -1;
  for (DeviceId d : pm_->devices()) {
    const auto* number = std::get_if<std::int64_t>(&args.device);
    const auto* name = std::get_if<std::string>(&args.device);
    if ((number && *number == d) || (name && *name == pm_->device(d).name())) id = d;
  }
  if (id < 0) {
    const auto* name = std::get_if<std::string>(&args.device);
    return reply.Error("hint: no device " +
                       (name ? *name : std::to_string(std::get<std::int64_t>(args.device))) +
                       " (see ghostctl devices)");
  }
  switch (args.kind) {
    case HintKind::kGhost:
      pm_->SendGhostHint(id, {Seconds(args.time_s), Energy::Joules(args.energy_j)});
      break;
    case HintKind::kTransferBegin:
      pm_->TransferBegin(id);
      break;
    case HintKind::kTransferEnd:
      pm_->TransferEnd(id);
      break;
    case HintKind::kBackground:
      break;
  }
  reply(nlohmann::json::object());
}

void Daemon::ControlStore(const ControlRequest& request, ControlServer::Reply reply) {
  store_tree_->Control(request, std::move(reply));
}

void Daemon::ControlStatus(const ControlRequest& request, ControlServer::Reply reply) {
  const std::string& path = std::get<StatusArgs>(request.args).path;
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
    std::string url = origin_->OriginUrl(&probe);
    const CacheEntry* e = origin_->MountEntry(url);
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
    auto d = n ? reads_.decisions.find(n->ino) : reads_.decisions.end();
    return reply({{"path", path},
                  {"url", url},
                  {"cached", e != nullptr},
                  {"state", e ? (preference == "disk" ? "present" : "present-network-preferred") : "absent"},
                  {"size", e ? nlohmann::json(e->size) : nlohmann::json()},
                  {"source_preference", preference},
                  {"last_source", d != reads_.decisions.end() && d->second.source ? SourceLabel(*d->second.source) : "none"},
                  {"origin", health_ ? health_->ToJson().value(top, nlohmann::json()) : nlohmann::json()},
                  {"cost", cost}});
  }
  reply.Error("status: " + path + ": no such file in the mount (not under an origin)");
}

}  // namespace ghost
