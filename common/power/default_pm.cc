#include "common/power/default_pm.h"

#include <cassert>
#include <cstdio>

namespace ghost {

// ---- DefaultDiskPolicy ----

DefaultDiskPolicy::DefaultDiskPolicy(const DefaultDiskOptions& options) : options_(options) {}

DefaultDiskPolicy::~DefaultDiskPolicy() = default;

void DefaultDiskPolicy::Attach(PowerManager& pm, DeviceId id, Device& device) {
  DevicePolicy::Attach(pm, id, device);
  const int deepest = device.profile().LowestMode();
  assert(deepest >= 1);
  timers_ = std::make_unique<SpinDownTimers>(pm.clock(), device);
  timers_->Start({{1, options_.low_power_after}, {deepest, options_.deepest_after}});
}

void DefaultDiskPolicy::OnIoBegin(const IoRequest&) { timers_->OnIoBegin(); }
void DefaultDiskPolicy::OnIoEnd(const IoRequest&) { timers_->OnIoEnd(); }
void DefaultDiskPolicy::OnModeEntered(int mode) { timers_->OnModeEntered(mode); }

std::string DefaultDiskPolicy::Describe() const {
  if (!device_) return name();
  const DeviceProfile& p = device_->profile();
  char buf[256];
  std::snprintf(buf, sizeof buf, "%s: %s after %.2f s, %s after %.2f s", name().c_str(),
                p.modes[1].name.c_str(), ToSeconds(options_.low_power_after),
                p.modes[p.LowestMode()].name.c_str(), ToSeconds(options_.deepest_after));
  return buf;
}

// ---- DefaultNetworkPolicy ----

DefaultNetworkPolicy::DefaultNetworkPolicy(const DefaultNetworkOptions& options)
    : options_(options) {}

DefaultNetworkPolicy::~DefaultNetworkPolicy() { CancelIdleTimer(); }

void DefaultNetworkPolicy::Attach(PowerManager& pm, DeviceId id, Device& device) {
  DevicePolicy::Attach(pm, id, device);
  psm_ = device.profile().LowestMode();
  io_in_flight_ = device.busy();
  MaybeArmIdleTimer();
}

void DefaultNetworkPolicy::OnIoBegin(const IoRequest&) {
  io_in_flight_ = true;
  if (hinted_open_ == 0) {
    TransferBegins();
  } else {
    CancelIdleTimer();  // part of a hinted transfer: activity, not a new transfer
  }
}

void DefaultNetworkPolicy::OnIoEnd(const IoRequest&) {
  io_in_flight_ = false;
  MaybeArmIdleTimer();
}

void DefaultNetworkPolicy::OnTransferBegin() {
  ++hinted_open_;
  TransferBegins();
}

void DefaultNetworkPolicy::OnTransferEnd() {
  if (hinted_open_ > 0) --hinted_open_;
  MaybeArmIdleTimer();
}

void DefaultNetworkPolicy::TransferBegins() {
  CancelIdleTimer();
  const TimePoint now = pm_->clock().Now();
  if (last_begin_ && now - *last_begin_ < options_.burst_gap) {
    device_->RequestMode(device_->profile().HighPowerMode());
  }
  last_begin_ = now;
}

void DefaultNetworkPolicy::MaybeArmIdleTimer() {
  if (open_transfers() > 0 || device_->target_mode() == psm_) return;
  CancelIdleTimer();
  idle_timer_ = pm_->clock().ScheduleAfter(options_.idle_timeout, [this] {
    idle_timer_ = kNoTimer;
    device_->RequestMode(psm_);
  });
}

void DefaultNetworkPolicy::CancelIdleTimer() {
  if (idle_timer_ != kNoTimer) pm_->clock().Cancel(idle_timer_);
  idle_timer_ = kNoTimer;
}

std::string DefaultNetworkPolicy::Describe() const {
  char buf[256];
  std::snprintf(buf, sizeof buf,
                "%s: CAM while transfers begin < %.0f ms apart, PSM after %.0f ms idle",
                name().c_str(), ToMillis(options_.burst_gap), ToMillis(options_.idle_timeout));
  return buf;
}

}  // namespace ghost
