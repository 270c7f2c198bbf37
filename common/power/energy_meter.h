// EnergyMeter: whole-machine energy, integrated over time (DESIGN §3.1, §7).
//
// The machine draws its base power all the time; each device draws a piecewise-constant power
// that the device reports at every change (mode entered, I/O begun or ended, transition
// begun). The meter integrates each device's power over time into buckets by mode (idle and
// active time in a mode count for that mode) and a transition bucket, and counts transitions.
// Totals are exact integrals of the reported timeline: the meter never samples.
//
// Thread-safety: not thread-safe; use from the thread that drives the clock.
#ifndef GHOST_COMMON_POWER_ENERGY_METER_H_
#define GHOST_COMMON_POWER_ENERGY_METER_H_

#include <string>
#include <vector>

#include "common/base/clock.h"
#include "common/base/units.h"

namespace ghost {

struct DeviceEnergy {
  std::string name;
  std::vector<std::string> mode_names;
  Energy energy;                         // everything this device drew
  std::vector<Energy> energy_in_mode;    // idle + active, per mode
  std::vector<Duration> time_in_mode;
  Energy transition_energy;
  Duration transition_time{0};
  int transitions = 0;
};

struct EnergyReport {
  Duration elapsed{0};
  Energy base;    // base power × elapsed
  Energy total;   // base + every device
  std::vector<DeviceEnergy> devices;
};

// One piece of the recorded timeline (kept only when EnableTimeline was called).
struct PowerSegment {
  int device;
  TimePoint start;
  TimePoint end;
  Power power;
  int mode;  // -1 while in a transition
};

class EnergyMeter {
 public:
  static constexpr int kInTransition = -1;

  // Borrows `clock`, which must outlive the meter. Metering starts at clock.Now().
  EnergyMeter(const Clock& clock, Power base_power);
  EnergyMeter(const EnergyMeter&) = delete;
  EnergyMeter& operator=(const EnergyMeter&) = delete;

  // Adds a device drawing `power` in `mode` from now on; returns its index in reports.
  int AddDevice(const std::string& name, std::vector<std::string> mode_names, int mode, Power power);
  // From now on device `d` draws `power` in `mode` (kInTransition during a transition).
  void Record(int d, int mode, Power power);
  // Counts a completed transition of device `d` (its energy arrives through Record).
  void CountTransition(int d);
  void SetBasePower(Power p);

  // Totals from the start up to now. Cheap: O(devices × modes).
  EnergyReport Read() const;
  // Forgets everything so far and starts again at now, keeping each device's current power.
  void Reset();

  void EnableTimeline() { keep_timeline_ = true; }
  // The timeline up to now (the open segment of each device is closed at now).
  std::vector<PowerSegment> Timeline() const;

 private:
  struct Track {
    DeviceEnergy totals;
    TimePoint since;
    Power power;
    int mode;
  };
  static void Accumulate(Track& t, TimePoint until);

  const Clock& clock_;
  Power base_power_;
  TimePoint start_;
  TimePoint base_since_;
  Energy base_energy_;
  std::vector<Track> tracks_;
  bool keep_timeline_ = false;
  std::vector<PowerSegment> timeline_;
};

}  // namespace ghost

#endif  // GHOST_COMMON_POWER_ENERGY_METER_H_
