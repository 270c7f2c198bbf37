// Machine: the emulated computer a policy runs on — its storage and network devices, their
// power-management policies, the power manager with its energy meter, and the cost model —
// built once from a machine profile, a policy and a knob (DESIGN §3, §7). ghostfs builds it on
// its real clock, ghostsim on a virtual one; both get the same devices, policies and costs, so
// a live run and a simulated one compare.
//
// Policies (DESIGN §7), one enum for the daemon and the simulator:
//  - kStatic: the paper's unmodified cache with the default device power management
//    (DefaultDiskPolicy, DefaultNetworkPolicy); transfers are not disclosed, no ghost hints.
//  - kAdaptive: STPM disk and network modules at knob K (or the multiple-experts disk policy),
//    transfers disclosed to the network module, ghost hints unless disabled.
//  - kNone: no power management: every device stays in its high-power mode (ghostsim's lower
//    bound run). Reads behave as under kStatic.
//
// The storage device starts in its high-power mode; the network card in its lowest mode
// (its high-power mode under kNone). With `power_management` off (ghostfs without a profile:
// an ideal machine) no device has a policy.
//
// The report helpers (DeviceResults, DevicesToJson) turn a meter reading into the per-device
// results that ghostsim's report and ghostfs's stats share.
//
// Thread-safety: not thread-safe; use from the thread that drives the clock.
#ifndef GHOST_COMMON_POWER_MACHINE_H_
#define GHOST_COMMON_POWER_MACHINE_H_

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/base/clock.h"
#include "common/base/status.h"
#include "common/base/units.h"
#include "common/power/cost_model.h"
#include "common/power/device.h"
#include "common/power/power_manager.h"
#include "common/power/profile.h"

namespace ghost {

enum class Policy { kStatic, kAdaptive, kNone };
// "static", "adaptive", "none".
const char* PolicyName(Policy p);
// "static" or "adaptive" (what a user may choose) → the policy; anything else is
// InvalidArgument naming both.
[[nodiscard]] Result<Policy> ParsePolicy(const std::string& text);

// The disk module under kAdaptive.
enum class DiskPolicyKind { kStpm, kExperts };

struct MachineOptions {
  Policy policy = Policy::kAdaptive;
  int knob = 50;                                       // 0..100
  bool ghost_hints = true;                             // kAdaptive only
  DiskPolicyKind disk_policy = DiskPolicyKind::kStpm;  // kAdaptive only
  // Off: no device gets a policy (an ideal machine whose devices are always ready).
  bool power_management = true;
};

class Machine {
 public:
  // Builds the machine of `profile` on `clock` (borrowed: it must outlive the machine).
  // Fails (InvalidArgument) if the profile lacks a disk (or flash) device or a network
  // device, or the knob is outside 0..100.
  [[nodiscard]] static Result<std::unique_ptr<Machine>> Build(Clock& clock, MachineProfile profile,
                                                              const MachineOptions& options);
  Machine(const Machine&) = delete;
  Machine& operator=(const Machine&) = delete;

  const MachineProfile& profile() const { return profile_; }
  const MachineOptions& options() const { return options_; }
  Policy policy() const { return options_.policy; }
  bool adaptive() const { return options_.policy == Policy::kAdaptive; }
  // "stpm" / "experts" under kAdaptive, "default" under kStatic, "none" under kNone.
  const char* DiskPolicyName() const;

  PowerManager& pm() { return *pm_; }
  const PowerManager& pm() const { return *pm_; }
  Device& storage() { return *storage_; }
  Device& network() { return *network_; }
  DeviceId storage_id() const { return storage_id_; }
  DeviceId network_id() const { return network_id_; }
  CostModel& cost() { return *cost_; }
  const CostModel& cost() const { return *cost_; }

  // The flash log's device (ghostfs --flash-log, DESIGN §3.5): reads of what the log holds
  // (source "flash") are charged to it, so its time and energy come from its own profile and
  // the meter shows it beside the disk. Null until AddFlash. With power management it starts
  // in its lowest mode and goes back there as soon as it is idle (DefaultDiskPolicy with no
  // delay: a card's high-current tail after an access is its profile's transition down).
  // Fails (InvalidArgument) if `profile` is not a flash device or one was added already.
  [[nodiscard]] Result<DeviceId> AddFlash(Clock& clock, const DeviceProfile& profile);
  Device* flash() { return flash_.get(); }
  DeviceId flash_id() const { return flash_id_; }

  // Transfer hints to the network module (DESIGN §3.3): only kAdaptive discloses its
  // transfers; under the others the card's policy sees only its I/O.
  void TransferBegin();
  void TransferEnd();

  // Base power plus every device in its lowest mode: the lower bound's power (DESIGN §7).
  Power FloorPower() const;

 private:
  Machine(MachineProfile profile, const MachineOptions& options);

  MachineProfile profile_;
  MachineOptions options_;
  // Destroyed in reverse order: the cost model, then the power manager (which deregisters
  // the devices), then the devices.
  std::unique_ptr<Device> storage_, network_;
  std::unique_ptr<Device> flash_;  // AddFlash; null without
  std::unique_ptr<PowerManager> pm_;
  DeviceId storage_id_ = -1, network_id_ = -1, flash_id_ = -1;
  std::unique_ptr<CostModel> cost_;
};

// One device's share of a run, as ghostsim reports it and ghostfs's stats show it.
struct DeviceResult {
  std::string name;
  std::string kind;
  Energy energy;
  std::vector<std::string> modes;
  std::vector<Duration> time_in_mode;
  std::vector<Energy> energy_in_mode;
  Duration transition_time{0};
  int transitions = 0;
  int ghost_hints_received = 0;
  std::string policy;  // the policy's Describe() at the time of the reading
};

// Each registered device's energy, time in mode, transitions, hints and policy, from `e`
// (a reading of pm's meter).
std::vector<DeviceResult> DeviceResults(const PowerManager& pm, const EnergyReport& e);
// The "devices" array of ghostsim's JSON report (field order fixed, numbers rounded to 1 ms
// and 1 mJ for stable output).
nlohmann::ordered_json DevicesToJson(const std::vector<DeviceResult>& devices);

}  // namespace ghost

#endif  // GHOST_COMMON_POWER_MACHINE_H_
