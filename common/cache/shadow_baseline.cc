#include "common/cache/shadow_baseline.h"

#include <cmath>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <string>

#include "common/base/json_fields.h"

namespace ghost {

Result<std::unique_ptr<ShadowBaseline>> ShadowBaseline::Build(Clock& clock, Machine& live,
                                                              Bytes page_cache) {
  MachineOptions mo;
  mo.policy = Policy::kStatic;
  mo.knob = live.options().knob;
  mo.ghost_hints = false;
  mo.power_management = true;
  Result<std::unique_ptr<Machine>> m = Machine::Build(clock, live.profile(), mo);
  if (!m.ok()) return m.status();
  return std::unique_ptr<ShadowBaseline>(
      new ShadowBaseline(clock, live, std::move(m).value(), page_cache));
}

ShadowBaseline::ShadowBaseline(Clock& clock, Machine& live, std::unique_ptr<Machine> shadow,
                               Bytes page_cache)
    : clock_(clock), live_(live), shadow_(std::move(shadow)) {
  manager_ = std::make_unique<CacheManager>(clock_, *shadow_,
                                            CacheManager::Options{.page_cache = page_cache});
  started_ = clock_.Now();
}

Duration ShadowBaseline::WaitFor(Machine& m, ReadSource source, Bytes size) {
  switch (source) {
    case ReadSource::kDisk:
    case ReadSource::kFlash:
    case ReadSource::kStale:  // a stale copy served from the disk
      return m.storage().Estimate({size, false}).time;
    case ReadSource::kNetwork:
      return m.network().Estimate({size, false}).time;
    case ReadSource::kRevalidate:
      return m.network().Estimate({0, false}).time;  // a 304: the round trips only
    case ReadSource::kMemory:
    case ReadSource::kWriteQueue:
      return Duration::zero();
  }
  return Duration::zero();
}

void ShadowBaseline::Observe(const ObjectState& state, const ReadDecision& live) {
  ++reads_;
  live_waiting_ += WaitFor(live_, live.source, state.size);
  // The static cache wrote every fill at once: what waits in the live write queue is on its
  // disk, and in RAM (it was just written).
  ObjectState s = state;
  if (s.in_write_queue && !s.on_disk) {
    s.in_write_queue = false;
    s.on_disk = true;
    s.in_memory = true;
  }
  ReadDecision d = manager_->DecideRead(s);
  baseline_waiting_ += WaitFor(*shadow_, d.source, s.size);
  switch (d.source) {
    case ReadSource::kDisk:
    case ReadSource::kFlash:
    case ReadSource::kStale:
      shadow_->storage().Submit({s.size, false}, [] {});
      break;
    case ReadSource::kNetwork:
      shadow_->network().Submit({s.size, false}, [] {});
      if (d.queue_fill) shadow_->storage().Submit({s.size, true}, [] {});  // written at once
      break;
    case ReadSource::kRevalidate:
      shadow_->network().Submit({0, false}, [] {});
      break;
    case ReadSource::kMemory:
    case ReadSource::kWriteQueue:
      break;
  }
}

void ShadowBaseline::ObserveWrite(Bytes size) {
  if (size == 0) return;
  written_ += size;
  shadow_->storage().Submit({size, true}, [] {});
}

void ShadowBaseline::ObserveFetch(Bytes size) {
  fetched_ += size;
  shadow_->network().Submit({size, false}, [] {});
}

double ShadowBaseline::Figures::percent() const {
  if (baseline_energy.joules() <= 0) return 0;
  return 100.0 * saved().joules() / baseline_energy.joules();
}

ShadowBaseline::Figures ShadowBaseline::figures() const {
  Figures f;
  f.live_energy = live_.pm().meter().Read().total;
  f.baseline_energy = shadow_->pm().meter().Read().total;
  f.live_waiting = live_waiting_;
  f.baseline_waiting = baseline_waiting_;
  f.reads = reads_;
  f.written = written_;
  f.fetched = fetched_;
  return f;
}

std::string ShadowBaseline::LocalDateNow() {
  std::time_t t = std::time(nullptr);
  std::tm tm{};
  localtime_r(&t, &tm);
  char buf[16];
  std::strftime(buf, sizeof buf, "%Y-%m-%d", &tm);
  return buf;
}

Status ShadowBaseline::KeepDay(std::string path, std::function<std::string()> local_date) {
  day_path_ = std::move(path);
  local_date_ = std::move(local_date);
  day_ = local_date_();
  carried_ = Figures{};
  day_start_ = figures();
  std::ifstream in(day_path_);
  if (!in) return Status::Ok();  // the first mount: today starts now
  nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  // Every field of its type and in range: value() threw type_error on a "reads" of another type
  // (ghostfs aborted at every mount that day), and a huge figure overflowed Seconds().
  auto figure = [&j](const char* key) {
    const nlohmann::json& v = j[key];
    return v.is_number() && std::isfinite(v.get<double>()) && std::fabs(v.get<double>()) < 1e12;
  };
  std::uint64_t reads = 0;
  if (!j.is_object() || !j["date"].is_string() || !figure("live_energy_j") || !figure("baseline_energy_j") ||
      !figure("live_waiting_s") || !figure("baseline_waiting_s") || !json_fields::Get(j, "reads", &reads)) {
    return Status::InvalidArgument(day_path_ + ": not today's saved figures; today starts now");
  }
  if (j["date"].get<std::string>() != day_) return Status::Ok();  // an earlier day's
  carried_.live_energy = Energy::Joules(j["live_energy_j"].get<double>());
  carried_.baseline_energy = Energy::Joules(j["baseline_energy_j"].get<double>());
  carried_.live_waiting = Seconds(j["live_waiting_s"].get<double>());
  carried_.baseline_waiting = Seconds(j["baseline_waiting_s"].get<double>());
  carried_.reads = reads;
  return Status::Ok();
}

void ShadowBaseline::RollDay() {
  if (day_path_.empty()) return;
  std::string now = local_date_();
  if (now == day_) return;
  // The figures up to this reading go to the day that ended (the last one's share is small:
  // readings come at least with every stats push).
  day_start_ = figures();
  carried_ = Figures{};
  day_ = now;
  (void)SaveDay();
}

ShadowBaseline::Figures ShadowBaseline::today() {
  RollDay();
  Figures now = figures(), t = carried_;
  t.live_energy += now.live_energy - day_start_.live_energy;
  t.baseline_energy += now.baseline_energy - day_start_.baseline_energy;
  t.live_waiting += now.live_waiting - day_start_.live_waiting;
  t.baseline_waiting += now.baseline_waiting - day_start_.baseline_waiting;
  t.reads += now.reads - day_start_.reads;
  return t;
}

Status ShadowBaseline::SaveDay() {
  if (day_path_.empty()) return Status::Ok();
  Figures t = today();
  nlohmann::json j = {{"date", day_},
                      {"live_energy_j", t.live_energy.joules()},
                      {"baseline_energy_j", t.baseline_energy.joules()},
                      {"live_waiting_s", ToSeconds(t.live_waiting)},
                      {"baseline_waiting_s", ToSeconds(t.baseline_waiting)},
                      {"reads", t.reads}};
  std::string tmp = day_path_ + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << j.dump() << "\n";
    out.flush();
    if (!out) return Status::Internal("cannot write " + tmp);
  }
  if (std::rename(tmp.c_str(), day_path_.c_str()) != 0) {
    return Status::Internal("cannot rename " + tmp + " to " + day_path_);
  }
  return Status::Ok();
}

nlohmann::json ShadowBaseline::ToJson() {
  Figures f = figures();
  auto round3 = [](double v) { return std::round(v * 1000) / 1000; };
  nlohmann::json out = {{"baseline", "static"},
          {"reads", f.reads},
          {"since_s", round3(ToSeconds(clock_.Now() - started_))},
          {"energy_j", round3(f.saved().joules())},
          {"percent", std::round(f.percent() * 10) / 10},
          {"waiting_s", round3(ToSeconds(f.waiting_saved()))},
          {"live_energy_j", round3(f.live_energy.joules())},
          {"baseline_energy_j", round3(f.baseline_energy.joules())},
          {"live_waiting_s", round3(ToSeconds(f.live_waiting))},
          {"baseline_waiting_s", round3(ToSeconds(f.baseline_waiting))},
          {"other_io", {{"written_b", f.written}, {"fetched_b", f.fetched}}},
          {"baseline_devices", DevicesToJson(DeviceResults(shadow_->pm(), shadow_->pm().meter().Read()))}};
  if (!day_path_.empty()) {
    Figures t = today();
    out["today"] = {{"date", day_},
                    {"energy_j", round3(t.saved().joules())},
                    {"percent", std::round(t.percent() * 10) / 10},
                    {"waiting_s", round3(ToSeconds(t.waiting_saved()))},
                    {"reads", t.reads}};
  }
  return out;
}

std::string ShadowBaseline::Sentence(const nlohmann::json& saved) {
  if (!saved.is_object()) return "";
  // "saved 1.2 J (3.4%) and saved 0.5 s of waiting" / "spent an extra … and added 0.5 s …":
  // each figure says which way it went.
  auto figures = [](const nlohmann::json& f) {
    double j = f.value("energy_j", 0.0), pct = f.value("percent", 0.0), w = f.value("waiting_s", 0.0);
    char buf[160];
    std::snprintf(buf, sizeof buf, "%s %.1f J (%.1f%%) and %s %.1f s of waiting",
                  j >= 0 ? "saved" : "spent an extra", std::fabs(j), std::fabs(pct),
                  w >= 0 ? "saved" : "added", std::fabs(w));
    return std::string(buf);
  };
  char since[64];
  std::snprintf(since, sizeof since, " since mount (%.0f s ago)", saved.value("since_s", 0.0));
  std::string out = figures(saved) + since;
  if (const auto t = saved.find("today"); t != saved.end() && t->is_object()) {
    out += "; today " + figures(*t);
  }
  return out + ", against a static cache on the same reads";
}

}  // namespace ghost
