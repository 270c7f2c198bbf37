#include "common/power/machine.h"

#include <cmath>

#include "common/power/adaptive_spindown.h"
#include "common/power/default_pm.h"
#include "common/power/stpm_disk.h"
#include "common/power/stpm_network.h"

namespace ghost {
namespace {

double Round(double v, double unit) { return std::round(v / unit) * unit; }

}  // namespace

const char* PolicyName(Policy p) {
  switch (p) {
    case Policy::kStatic: return "static";
    case Policy::kAdaptive: return "adaptive";
    case Policy::kNone: return "none";
  }
  return "?";
}

Result<Policy> ParsePolicy(const std::string& text) {
  if (text == "static") return Policy::kStatic;
  if (text == "adaptive") return Policy::kAdaptive;
  return Status::InvalidArgument("policy \"" + text + "\" is neither \"static\" nor \"adaptive\"");
}

Machine::Machine(MachineProfile profile, const MachineOptions& options)
    : profile_(std::move(profile)), options_(options) {}

Result<std::unique_ptr<Machine>> Machine::Build(Clock& clock, MachineProfile profile,
                                                const MachineOptions& options) {
  if (options.knob < 0 || options.knob > 100) {
    return Status::InvalidArgument("knob " + std::to_string(options.knob) + " is outside 0..100");
  }
  const DeviceProfile* storage = profile.FindDevice(DeviceKind::kDisk);
  if (!storage) storage = profile.FindDevice(DeviceKind::kFlash);
  const DeviceProfile* network = profile.FindDevice(DeviceKind::kNetwork);
  if (!storage || !network) {
    return Status::InvalidArgument("profile " + profile.name +
                                   " needs a disk (or flash) device and a network device");
  }
  DeviceProfile storage_profile = *storage, network_profile = *network;
  std::unique_ptr<Machine> m(new Machine(std::move(profile), options));
  bool none = options.policy == Policy::kNone;
  m->pm_ = std::make_unique<PowerManager>(clock, m->profile_.base_power, options.knob);
  m->storage_ = std::make_unique<Device>(clock, storage_profile, nullptr, storage_profile.HighPowerMode());
  m->network_ = std::make_unique<Device>(clock, network_profile, &m->profile_.link,
                                         none ? network_profile.HighPowerMode() : network_profile.LowestMode());
  std::unique_ptr<DevicePolicy> storage_policy, network_policy;
  if (options.power_management) {
    switch (options.policy) {
      case Policy::kNone: break;
      case Policy::kStatic:
        storage_policy = std::make_unique<DefaultDiskPolicy>();
        network_policy = std::make_unique<DefaultNetworkPolicy>();
        break;
      case Policy::kAdaptive:
        if (options.disk_policy == DiskPolicyKind::kExperts) {
          storage_policy = std::make_unique<ExpertsDiskPolicy>();
        } else {
          storage_policy = std::make_unique<StpmDiskPolicy>();
        }
        network_policy = std::make_unique<StpmNetworkPolicy>();
        break;
    }
  }
  m->storage_id_ = m->pm_->Register(m->storage_.get(), std::move(storage_policy));
  m->network_id_ = m->pm_->Register(m->network_.get(), std::move(network_policy));
  m->cost_ = std::make_unique<CostModel>(
      *m->pm_, CostModel::Options{.ghost_hints = m->adaptive() && options.ghost_hints});
  return m;
}

Result<DeviceId> Machine::AddFlash(Clock& clock, const DeviceProfile& profile) {
  if (profile.kind != DeviceKind::kFlash) {
    return Status::InvalidArgument("profile " + profile.name + " is not a flash device");
  }
  if (flash_) return Status::InvalidArgument("the machine has a flash device already");
  if (profile.modes.empty() || !profile.modes[0].serves_io) {
    return Status::InvalidArgument("profile " + profile.name + " has no mode 0 serving I/O");
  }
  const bool managed = options_.power_management && profile.LowestMode() != 0;
  flash_ = std::make_unique<Device>(clock, profile, nullptr, managed ? profile.LowestMode() : 0);
  std::unique_ptr<DevicePolicy> policy;
  if (managed) {
    policy = std::make_unique<DefaultDiskPolicy>(
        DefaultDiskOptions{.low_power_after = Duration::zero(), .deepest_after = Duration::zero()});
  }
  flash_id_ = pm_->Register(flash_.get(), std::move(policy));
  return flash_id_;
}

const char* Machine::DiskPolicyName() const {
  switch (options_.policy) {
    case Policy::kAdaptive: return options_.disk_policy == DiskPolicyKind::kExperts ? "experts" : "stpm";
    case Policy::kStatic: return "default";
    case Policy::kNone: return "none";
  }
  return "?";
}

void Machine::TransferBegin() {
  if (adaptive()) pm_->TransferBegin(network_id_);
}

void Machine::TransferEnd() {
  if (adaptive()) pm_->TransferEnd(network_id_);
}

Power Machine::FloorPower() const {
  return profile_.base_power + storage_->profile().modes.back().power +
         network_->profile().modes.back().power;
}

std::vector<DeviceResult> DeviceResults(const PowerManager& pm, const EnergyReport& e) {
  std::vector<DeviceResult> out;
  for (DeviceId id : pm.devices()) {
    const DeviceEnergy& de = e.devices[id];
    DeviceResult d;
    d.name = de.name;
    d.kind = DeviceKindName(pm.device(id).kind());
    d.energy = de.energy;
    d.modes = de.mode_names;
    d.time_in_mode = de.time_in_mode;
    d.energy_in_mode = de.energy_in_mode;
    d.transition_time = de.transition_time;
    d.transitions = de.transitions;
    d.ghost_hints_received = pm.ghost_hints_received(id);
    if (const DevicePolicy* p = pm.policy(id)) d.policy = p->Describe();
    out.push_back(std::move(d));
  }
  return out;
}

nlohmann::ordered_json DevicesToJson(const std::vector<DeviceResult>& devices) {
  nlohmann::ordered_json out = nlohmann::ordered_json::array();
  for (const DeviceResult& d : devices) {
    nlohmann::ordered_json dj;
    dj["name"] = d.name;
    dj["kind"] = d.kind;
    dj["energy_j"] = Round(d.energy.joules(), 0.001);
    nlohmann::ordered_json tim = nlohmann::ordered_json::object(),
                           eim = nlohmann::ordered_json::object();
    for (std::size_t m = 0; m < d.modes.size(); ++m) {
      tim[d.modes[m]] = Round(ToSeconds(d.time_in_mode[m]), 0.001);
      eim[d.modes[m]] = Round(d.energy_in_mode[m].joules(), 0.001);
    }
    tim["transition"] = Round(ToSeconds(d.transition_time), 0.001);
    dj["time_in_mode_s"] = tim;
    dj["energy_in_mode_j"] = eim;
    dj["transitions"] = d.transitions;
    dj["ghost_hints_received"] = d.ghost_hints_received;
    if (!d.policy.empty()) dj["policy"] = d.policy;
    out.push_back(dj);
  }
  return out;
}

}  // namespace ghost
