#include "common/power/power_manager.h"

#include <cassert>
#include <cstdio>
#include <cstdlib>

namespace ghost {

PowerManager::PowerManager(Clock& clock, Power base_power, int knob)
    : clock_(clock), base_power_(base_power), knob_(knob), meter_(clock, base_power) {
  assert(knob >= 0 && knob <= 100);
}

PowerManager::~PowerManager() {
  for (DeviceId id = 0; id < static_cast<DeviceId>(entries_.size()); ++id) {
    if (entries_[id]->device) Deregister(id);
  }
}

PowerManager::Entry& PowerManager::entry(DeviceId id) const {
  if (id < 0 || id >= static_cast<DeviceId>(entries_.size()) || !entries_[id]->device) {
    std::fprintf(stderr, "ghost: power manager: no registered device %d\n", id);
    std::abort();
  }
  return *entries_[id];
}

DeviceId PowerManager::Register(Device* device, std::unique_ptr<DevicePolicy> policy) {
  assert(device);
  DeviceId id = static_cast<DeviceId>(entries_.size());
  auto e = std::make_unique<Entry>();
  e->device = device;
  e->policy = std::move(policy);
  entries_.push_back(std::move(e));
  Device::Events events;
  events.mode_entered = [this, id](int mode) { Notify(id, mode); };
  events.io_begin = [this, id](const IoRequest& io) {
    if (auto* p = entries_[id]->policy.get()) p->OnIoBegin(io);
  };
  events.io_end = [this, id](const IoRequest& io) {
    if (auto* p = entries_[id]->policy.get()) p->OnIoEnd(io);
  };
  events.nap = [this, id](bool napping) {
    if (auto* p = entries_[id]->policy.get()) p->OnNap(napping);
  };
  device->Attach(&meter_, std::move(events));
  if (auto* p = entries_[id]->policy.get()) p->Attach(*this, id, *device);
  return id;
}

void PowerManager::Deregister(DeviceId id) {
  Entry& e = entry(id);
  e.device->Attach(nullptr, {});
  e.policy.reset();
  e.device = nullptr;
  for (auto it = subs_.begin(); it != subs_.end();) {
    it = it->second.id == id ? subs_.erase(it) : std::next(it);
  }
}

void PowerManager::Notify(DeviceId id, int mode) {
  Entry& e = entry(id);
  if (e.policy) e.policy->OnModeEntered(mode);
  // Copy the matching callbacks first: a subscriber may subscribe or unsubscribe.
  std::vector<std::function<void(DeviceId, int)>> fns;
  for (auto& [sid, s] : subs_) {
    if (s.id == id && s.mode == mode) fns.push_back(s.fn);
  }
  for (auto& fn : fns) fn(id, mode);
}

int PowerManager::NumModes(DeviceId id) const {
  return static_cast<int>(entry(id).device->profile().modes.size());
}

const Mode& PowerManager::ModeInfo(DeviceId id, int mode) const {
  return entry(id).device->profile().modes.at(mode);
}

Transition PowerManager::TransitionCost(DeviceId id, int from, int to) const {
  return entry(id).device->profile().TransitionCost(from, to);
}

int PowerManager::CurrentMode(DeviceId id) const { return entry(id).device->mode(); }

SubscriptionId PowerManager::Subscribe(DeviceId id, int mode, std::function<void(DeviceId, int)> fn) {
  entry(id);  // validates
  SubscriptionId sid = next_sub_++;
  subs_.emplace(sid, Subscription{id, mode, std::move(fn)});
  return sid;
}

void PowerManager::Unsubscribe(SubscriptionId sub) { subs_.erase(sub); }

void PowerManager::SetKnob(int knob) {
  assert(knob >= 0 && knob <= 100);
  knob_ = knob;
  for (auto& e : entries_) {
    if (e->device && e->policy) e->policy->OnKnobChanged(knob);
  }
}

void PowerManager::SendGhostHint(DeviceId id, const GhostHint& hint) {
  Entry& e = entry(id);
  ++e.ghost_hints;
  if (e.policy) e.policy->OnGhostHint(hint);
}

void PowerManager::TransferBegin(DeviceId id) {
  if (auto* p = entry(id).policy.get()) p->OnTransferBegin();
}

void PowerManager::TransferEnd(DeviceId id) {
  if (auto* p = entry(id).policy.get()) p->OnTransferEnd();
}

Device& PowerManager::device(DeviceId id) const { return *entry(id).device; }
DevicePolicy* PowerManager::policy(DeviceId id) const { return entry(id).policy.get(); }

std::vector<DeviceId> PowerManager::devices() const {
  std::vector<DeviceId> ids;
  for (DeviceId id = 0; id < static_cast<DeviceId>(entries_.size()); ++id) {
    if (entries_[id]->device) ids.push_back(id);
  }
  return ids;
}

std::optional<DeviceId> PowerManager::FindDevice(DeviceKind kind) const {
  for (DeviceId id : devices()) {
    if (entries_[id]->device->kind() == kind) return id;
  }
  return std::nullopt;
}

Power PowerManager::IdlePowerOfOthers(DeviceId except) const {
  Power p;
  for (DeviceId id : devices()) {
    if (id == except) continue;
    const Device& d = *entries_[id]->device;
    p += d.profile().modes[d.mode()].power;
  }
  return p;
}

int PowerManager::ghost_hints_received(DeviceId id) const { return entry(id).ghost_hints; }

}  // namespace ghost
