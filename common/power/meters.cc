#include "common/power/meters.h"

#include <cmath>

namespace ghost {
namespace {

constexpr const char* kSupplies = "class/power_supply";
constexpr const char* kPowercap = "class/powercap";

}  // namespace

BatteryMeter::BatteryMeter(const Sysfs& sysfs, std::string name)
    : sysfs_(sysfs), name_(std::move(name)) {}

MeterReading BatteryMeter::Read(TimePoint now) {
  MeterReading r;
  r.name = name_;
  r.kind = "battery";
  const std::string dir = std::string(kSupplies) + "/" + name_ + "/";
  auto fail = [&](const Status& s) {
    r.error = s.code() == Status::Code::kNotFound ? "battery " + name_ + " absent" : s.message();
    r.energy = used_;
    r.remaining = last_remaining_;
    return r;
  };
  if (!sysfs_.Exists(dir)) return fail(Status::NotFound(dir));
  if (Result<std::string> st = sysfs_.ReadString(dir + "status"); st.ok()) r.status = *st;
  std::optional<Power> power;
  if (sysfs_.Exists(dir + "power_now")) {
    Result<std::int64_t> uw = sysfs_.ReadInt(dir + "power_now");
    if (!uw.ok()) return fail(uw.status());
    power = Power::Watts(static_cast<double>(std::llabs(*uw)) / 1e6);
  } else if (sysfs_.Exists(dir + "current_now")) {
    Result<std::int64_t> ua = sysfs_.ReadInt(dir + "current_now");
    if (!ua.ok()) return fail(ua.status());
    Result<std::int64_t> uv = sysfs_.ReadInt(dir + "voltage_now");
    if (!uv.ok()) return fail(uv.status());
    power = Power::Watts(std::fabs(static_cast<double>(*ua) / 1e6 * static_cast<double>(*uv) / 1e6));
  }
  std::optional<Energy> remaining;
  if (sysfs_.Exists(dir + "energy_now")) {
    Result<std::int64_t> uwh = sysfs_.ReadInt(dir + "energy_now");
    if (!uwh.ok()) return fail(uwh.status());
    remaining = Energy::Joules(static_cast<double>(*uwh) * 3600.0 / 1e6);  // µWh → J
  }
  if (!power && !remaining) {
    return fail(Status::NotFound(dir + " has neither power_now, current_now nor energy_now"));
  }
  const bool discharging = r.status == "Discharging";
  if (last_at_) {
    if (remaining && last_remaining_ && discharging && *remaining <= *last_remaining_) {
      used_ += *last_remaining_ - *remaining;  // the driver's own integral
    } else if (power && last_power_ && discharging) {
      // Trapezoid over the two readings.
      used_ += Power::Watts((power->watts() + last_power_->watts()) / 2) * (now - *last_at_);
    }
  }
  last_at_ = now;
  last_power_ = power;
  last_remaining_ = remaining;
  r.ok = true;
  r.power = power;
  r.energy = used_;
  r.remaining = remaining;
  return r;
}

RaplMeter::RaplMeter(const Sysfs& sysfs, std::string dir)
    : sysfs_(sysfs), dir_(std::move(dir)) {
  Result<std::string> n = sysfs_.ReadString(std::string(kPowercap) + "/" + dir_ + "/name");
  name_ = n.ok() && !n->empty() ? *n : dir_;
}

MeterReading RaplMeter::Read(TimePoint now) {
  MeterReading r;
  r.name = name_;
  r.kind = "rapl";
  const std::string base = std::string(kPowercap) + "/" + dir_ + "/";
  Result<std::int64_t> uj = sysfs_.ReadInt(base + "energy_uj");
  if (!uj.ok() || *uj < 0) {
    r.error = !uj.ok() ? (uj.status().code() == Status::Code::kNotFound ? "RAPL zone " + dir_ + " gone"
                                                                        : uj.status().message())
                       : base + "energy_uj is negative";
    r.energy = used_;
    r.wraps = wraps_;
    return r;
  }
  const auto cur = static_cast<std::uint64_t>(*uj);
  if (last_uj_) {
    std::uint64_t delta;
    if (cur >= *last_uj_) {
      delta = cur - *last_uj_;
    } else {
      // Wrapped: the counter runs from 0 to max_energy_range_uj.
      Result<std::int64_t> range = sysfs_.ReadInt(base + "max_energy_range_uj");
      std::uint64_t max = range.ok() && *range > 0 ? static_cast<std::uint64_t>(*range) : *last_uj_;
      delta = (max >= *last_uj_ ? max - *last_uj_ : 0) + cur;
      ++wraps_;
    }
    Energy e = Energy::Joules(static_cast<double>(delta) / 1e6);
    used_ += e;
    if (now > *last_at_) r.power = e / (now - *last_at_);
  }
  last_uj_ = cur;
  last_at_ = now;
  r.ok = true;
  r.energy = used_;
  r.wraps = wraps_;
  return r;
}

std::vector<std::unique_ptr<EnergySource>> DiscoverMeters(const Sysfs& sysfs) {
  std::vector<std::unique_ptr<EnergySource>> out;
  for (const std::string& s : sysfs.List(kSupplies)) {
    Result<std::string> type = sysfs.ReadString(std::string(kSupplies) + "/" + s + "/type");
    if (type.ok() && *type == "Battery") out.push_back(std::make_unique<BatteryMeter>(sysfs, s));
  }
  for (const std::string& z : sysfs.List(kPowercap, "intel-rapl:")) {
    // Top-level zones only: "intel-rapl:0", not "intel-rapl:0:0".
    if (z.find(':', std::string_view("intel-rapl:").size()) != std::string::npos) continue;
    if (!sysfs.Exists(std::string(kPowercap) + "/" + z + "/energy_uj")) continue;
    out.push_back(std::make_unique<RaplMeter>(sysfs, z));
  }
  return out;
}

MeterSampler::MeterSampler(Clock& clock, std::vector<std::unique_ptr<EnergySource>> sources,
                           Duration interval)
    : clock_(clock), sources_(std::move(sources)), interval_(interval) {
  Sample();
}

MeterSampler::~MeterSampler() {
  if (timer_ != kNoTimer) clock_.Cancel(timer_);
}

void MeterSampler::NoteActivity() {
  if (sources_.empty()) return;
  active_since_sample_ = true;
  if (timer_ == kNoTimer) timer_ = clock_.ScheduleAfter(interval_, [this] { OnTimer(); });
}

void MeterSampler::OnTimer() {
  timer_ = kNoTimer;
  const bool active = active_since_sample_;
  Sample();
  // Re-armed only while something happened in the last period: idle means no wake-ups.
  if (active) timer_ = clock_.ScheduleAfter(interval_, [this] { OnTimer(); });
}

void MeterSampler::SampleIfOlderThan(Duration age) {
  if (clock_.Now() - last_sample_ >= age) Sample();
}

void MeterSampler::Sample() {
  active_since_sample_ = false;
  const TimePoint now = clock_.Now();
  last_sample_ = now;
  readings_.clear();
  for (auto& s : sources_) readings_.push_back(s->Read(now));
  ++samples_;
}

nlohmann::json MeterSampler::ToJson() const {
  nlohmann::json out = nlohmann::json::array();
  for (const MeterReading& r : readings_) {
    nlohmann::json j = {{"name", r.name}, {"kind", r.kind}, {"ok", r.ok},
                        {"energy_j", r.energy.joules()},
                        {"power_w", r.power ? nlohmann::json(r.power->watts()) : nlohmann::json()}};
    if (!r.error.empty()) j["error"] = r.error;
    if (r.kind == "battery") {
      j["status"] = r.status;
      j["remaining_j"] = r.remaining ? nlohmann::json(r.remaining->joules()) : nlohmann::json();
    } else {
      j["wraps"] = r.wraps;
    }
    out.push_back(std::move(j));
  }
  return out;
}

}  // namespace ghost
