// Energy meters of the real machine: the battery's discharge and Intel RAPL's counters
// (powertop's two sources), read through sysfs (sysfs.h), shown beside the model's estimate.
//
//   battery  /sys/class/power_supply/BAT*/: power_now (µW), or current_now (µA) × voltage_now
//            (µV) when the driver has no power_now; energy_now (µWh) the charge left. Energy
//            used = the fall of energy_now while discharging, else ∫ power over the readings.
//   RAPL     /sys/class/powercap/intel-rapl:N/energy_uj: a free-running µJ counter that wraps
//            at max_energy_range_uj. Only top-level zones are read (intel-rapl:0, not
//            intel-rapl:0:0, which package-0 already contains).
//
// Readings happen when asked (a stats request) and, while the daemon is active, at a coarse
// interval: MeterSampler's timer is armed by activity and not re-armed once a period passes
// without any, so an idle daemon has no wake-up from metering. A RAPL counter that wraps more
// than once between two readings (hours of idle at tens of watts) undercounts; the reading
// says so ("wrapped").
//
// Thread-safety: not thread-safe; use from the thread that drives the clock.
#ifndef GHOST_COMMON_POWER_METERS_H_
#define GHOST_COMMON_POWER_METERS_H_

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "common/base/clock.h"
#include "common/base/status.h"
#include "common/base/units.h"
#include "common/power/sysfs.h"

namespace ghost {

struct MeterReading {
  std::string name;   // "BAT0", "package-0"
  std::string kind;   // "battery" | "rapl"
  bool ok = false;
  std::string error;  // why the last read failed (battery removed, EIO, permission)
  std::optional<Power> power;   // now (battery) or since the previous reading (RAPL)
  Energy energy;                // used since the meter started
  std::optional<Energy> remaining;  // battery: energy_now
  std::string status;           // battery: "Discharging", "Charging", "Full", ...
  int wraps = 0;                // RAPL: counter wraps seen
};

class EnergySource {
 public:
  virtual ~EnergySource() = default;
  // Reads the hardware at `now`; on failure the reading keeps its totals and says why.
  virtual MeterReading Read(TimePoint now) = 0;
  virtual const std::string& name() const = 0;
};

// One battery, /sys/class/power_supply/NAME.
class BatteryMeter final : public EnergySource {
 public:
  BatteryMeter(const Sysfs& sysfs, std::string name);
  MeterReading Read(TimePoint now) override;
  const std::string& name() const override { return name_; }

 private:
  Sysfs sysfs_;
  std::string name_;
  Energy used_;
  std::optional<Energy> last_remaining_;
  std::optional<Power> last_power_;
  std::optional<TimePoint> last_at_;
};

// One top-level RAPL zone, /sys/class/powercap/DIR.
class RaplMeter final : public EnergySource {
 public:
  RaplMeter(const Sysfs& sysfs, std::string dir);
  MeterReading Read(TimePoint now) override;
  const std::string& name() const override { return name_; }

 private:
  Sysfs sysfs_;
  std::string dir_;
  std::string name_;
  std::optional<std::uint64_t> last_uj_;
  std::optional<TimePoint> last_at_;
  Energy used_;
  int wraps_ = 0;
};

// Every meter sysfs offers: the batteries (type "Battery") and top-level RAPL zones.
std::vector<std::unique_ptr<EnergySource>> DiscoverMeters(const Sysfs& sysfs);

// The meters, read on demand and at `interval` while there is activity (see the header).
class MeterSampler {
 public:
  // Borrows `clock`, which must outlive the sampler. Takes a first reading now.
  MeterSampler(Clock& clock, std::vector<std::unique_ptr<EnergySource>> sources,
               Duration interval = std::chrono::seconds(10));
  ~MeterSampler();
  MeterSampler(const MeterSampler&) = delete;
  MeterSampler& operator=(const MeterSampler&) = delete;

  bool empty() const { return sources_.empty(); }
  // Something happened (I/O, a mode change): keep sampling for at least one more interval.
  void NoteActivity();
  // Reads every meter now.
  void Sample();
  // Reads every meter unless the last reading is younger than `age` (a stats request, which
  // mode changes also push, reads at most this often).
  void SampleIfOlderThan(Duration age);
  const std::vector<MeterReading>& readings() const { return readings_; }
  // Readings taken so far (for tests: the idle daemon's count stays put).
  int samples() const { return samples_; }
  bool timer_armed() const { return timer_ != kNoTimer; }
  // [{"name":"BAT0","kind":"battery","power_w":9.1,"energy_j":12.5,...}, ...]
  nlohmann::json ToJson() const;

 private:
  void OnTimer();

  Clock& clock_;
  std::vector<std::unique_ptr<EnergySource>> sources_;
  Duration interval_;
  std::vector<MeterReading> readings_;
  int samples_ = 0;
  TimePoint last_sample_{};
  bool active_since_sample_ = false;
  TimerId timer_ = kNoTimer;
};

}  // namespace ghost

#endif  // GHOST_COMMON_POWER_METERS_H_
