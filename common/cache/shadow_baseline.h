// ShadowBaseline: the paper's static cache (DESIGN §7: default device power management, the
// cached copy whenever there is one, fills written at once) run beside the live policy on the
// same reads and the same clock, with no I/O — so the daemon can say what an ordinary cache
// would have spent: "saved X J (Y%) and Z s of waiting since mount".
//
// The live CacheManager reports each decision (CacheManager::SetObserver) to Observe. The
// shadow decides the same read with its own static CacheManager on a second Machine built from
// the same profile (Policy::kStatic), and submits the I/O that decision costs to the shadow's
// emulated devices: a disk read of the body, or a network fetch (plus the disk write of the
// fill, at once). Its devices' timers run on the shared clock, so their default power
// management spins down and wakes up as it would have. No byte is read or written.
//
// Waiting is modelled on both sides the same way: for each read, the chosen device's estimated
// time from now to the last byte (Device::Estimate: mode changes, spin-up, beacons included),
// on the live machine as it is and on the shadow as it is, just before each submits the I/O.
// Reads served from memory wait for nothing.
//
// I/O outside the read decisions that the live machine's devices do, the static cache does
// too, and at once (it has no write queue): writes to the cache (local/ files, a proxy's fills)
// through ObserveWrite, fetches from an origin (a proxy's miss, through "transfer") through
// ObserveFetch. A read's fill is not one of those: Observe writes it (ReadDecision::queue_fill).
// Directory listings and name probes (HEAD) are carried by the real network only: the live
// machine does not charge them to its emulated card, so neither side pays for them.
//
// A miss is observed with the size the live side expects to fetch (ObjectState::size: the
// listing's or the message's size; 0 when unknown), so both sides carry the same bytes.
//
// "Today": the same figures since local midnight, carried across remounts in a small file in
// the cache directory (KeepDay). The day rolls when a reading finds the local date changed
// (nothing runs at midnight: the figures are computed when asked for); the file is written
// at each roll and by SaveDay (the daemon calls it at unmount).
//
// Without power management (no --profile: an ideal machine) there is nothing to compare:
// Build is not called and the stats say energy is not modelled.
//
// Thread-safety: not thread-safe; the thread that drives the clock.
#ifndef GHOST_COMMON_CACHE_SHADOW_BASELINE_H_
#define GHOST_COMMON_CACHE_SHADOW_BASELINE_H_

#include <functional>
#include <memory>
#include <string>
#include <nlohmann/json.hpp>

#include "common/base/clock.h"
#include "common/base/status.h"
#include "common/base/units.h"
#include "common/cache/cache_manager.h"
#include "common/power/machine.h"

namespace ghost {

class ShadowBaseline {
 public:
  // Builds the static machine of `profile` on `clock` (borrowed, must outlive this) beside
  // `live` (borrowed likewise), whose meter it compares with. `page_cache` is the live page-cache
  // model's cap. Fails as Machine::Build does.
  [[nodiscard]] static Result<std::unique_ptr<ShadowBaseline>> Build(Clock& clock,
                                                                     Machine& live,
                                                                     Bytes page_cache);
  ShadowBaseline(const ShadowBaseline&) = delete;
  ShadowBaseline& operator=(const ShadowBaseline&) = delete;

  // One read the live policy decided (`live` is its decision for `state`). Call before the
  // live side submits the read's I/O.
  void Observe(const ObjectState& state, const ReadDecision& live);
  // `size` bytes the live side wrote to its cache outside a read's fill: the static cache
  // writes them now (a disk write on the shadow).
  void ObserveWrite(Bytes size);
  // `size` bytes the live side fetched from an origin outside a read decision: the static
  // cache fetches them too (a network read on the shadow).
  void ObserveFetch(Bytes size);

  struct Figures {
    Energy live_energy, baseline_energy;  // whole machines (base power included)
    Duration live_waiting{0}, baseline_waiting{0};
    std::uint64_t reads = 0;
    Bytes written = 0, fetched = 0;  // ObserveWrite's and ObserveFetch's bytes
    Energy saved() const { return baseline_energy - live_energy; }
    Duration waiting_saved() const { return baseline_waiting - live_waiting; }
    // saved() as a percentage of the baseline's energy (0 when it spent none).
    double percent() const;
  };
  Figures figures() const;
  // {"baseline":"static","reads":N,"since_s":S,"energy_j":X,"percent":Y,"waiting_s":Z,
  //  "live_energy_j":..,"baseline_energy_j":..,"live_waiting_s":..,"baseline_waiting_s":..,
  //  "other_io":{"written_b":..,"fetched_b":..},"baseline_devices":[the shadow's devices, as
  //  ghostfs's stats show the live ones]}
  // With KeepDay, also "today":{"date":..,"energy_j":..,"percent":..,"waiting_s":..,"reads":..}.
  // Not const: a reading may roll the day.
  nlohmann::json ToJson();
  // "saved 12.3 J (41%) and 3.2 s of waiting since mount (1 h 2 min), against a static cache"
  static std::string Sentence(const nlohmann::json& saved);

  Machine& machine() { return *shadow_; }

  // The local date, "YYYY-MM-DD", of the real clock now (LocalDate's default).
  static std::string LocalDateNow();
  // Keeps "today" in `path` (e.g. CACHE/saved-today.json): if the file holds figures of
  // `local_date()`'s date they are carried into today's, else today starts now. A file that
  // cannot be read or parsed starts today afresh (the error is returned for a log line).
  Status KeepDay(std::string path, std::function<std::string()> local_date = LocalDateNow);
  // Writes today's figures to the KeepDay file (temporary file and rename). OK if none.
  Status SaveDay();
  // Today's figures (since local midnight, this mount and the earlier ones of the day).
  Figures today();

 private:
  ShadowBaseline(Clock& clock, Machine& live, std::unique_ptr<Machine> shadow, Bytes page_cache);
  // The estimated time of reading `size` bytes from `source` on machine `m` now.
  static Duration WaitFor(Machine& m, ReadSource source, Bytes size);

  Clock& clock_;
  Machine& live_;
  std::unique_ptr<Machine> shadow_;
  std::unique_ptr<CacheManager> manager_;  // static, on shadow_
  TimePoint started_{};
  Duration live_waiting_{0}, baseline_waiting_{0};
  std::uint64_t reads_ = 0;
  Bytes written_ = 0, fetched_ = 0;

  // Rolls the day if the local date changed since the last reading.
  void RollDay();
  std::string day_path_;                        // empty: no "today"
  std::function<std::string()> local_date_;
  std::string day_;                             // the local date today's figures are of
  Figures carried_;                             // earlier mounts' figures of day_
  Figures day_start_;                           // this mount's figures when day_ began
};

}  // namespace ghost

#endif  // GHOST_COMMON_CACHE_SHADOW_BASELINE_H_
