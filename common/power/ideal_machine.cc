#include "common/power/ideal_machine.h"

namespace ghost {

MachineProfile IdealMachineProfile() {
  MachineProfile m;
  m.name = "ideal";
  m.description = "no emulated devices: always ready, no delays";
  m.link.round_trips = 1;
  m.link.warm_round_trips = 1;
  for (DeviceKind kind : {DeviceKind::kDisk, DeviceKind::kNetwork}) {
    DeviceProfile d;
    d.kind = kind;
    d.name = kind == DeviceKind::kDisk ? "cache-disk" : "network";
    Mode on;
    on.name = "ready";
    on.serves_io = true;
    d.modes.push_back(on);
    m.devices.push_back(d);
  }
  return m;
}

}  // namespace ghost
