// Simulator: replays a trace through the model in virtual time (DESIGN §2, §6, §7).
//
// The same components the daemons use — Device, PowerManager and its energy meter, the STPM
// modules or the default power management, the CostModel with ghost hints, the CacheIndex and
// the WriteQueue — run against a VirtualClock, so a 20-minute trace replays in milliseconds.
//
// The machine (devices, policies, power manager, cost model) is built by Machine
// (common/power/machine.h) and each read is decided by the CacheManager
// (common/cache/cache_manager.h), as in ghostfs. Policies (DESIGN §7):
//  - static: the paper's unmodified cache. Reads the cached copy whenever one exists; writes
//    each fetched object to the disk at once (spinning it up if needed); default device power
//    management.
//  - adaptive: the cost model chooses memory / disk / network for each read, with ghost hints
//    (unless disabled); STPM disk and network modules at knob K; cache fills and other
//    background writes wait in the write queue while the disk is in a low-power mode.
//  - none: no power management: every device stays in its high-power mode; static cache
//    behaviour. Its duration defines the lower bound (DESIGN §7).
//
// A run starts at time 0 with the disk in its high-power mode and the network card in its
// power-saving (lowest) mode; requests are issued by a sequential client (a request starts at
// its trace time or when the previous one ends, whichever is later); the run ends when the
// last request has completed and every deferred write has been flushed, and that flush's
// energy counts. Response time runs from a request's start to its last byte.
//
// Every policy keeps recently read and written objects in a RAM page cache (LRU, byte cap
// `page_cache`), as the kernel does under the live filesystem; a read that hits it is served
// from memory.
//
// Web: `cached 1` objects are in the disk cache at the start; others come from the network and
// are then cached. Mail: the mailbox is cached at the start (disconnected operation); READ
// reads a message, SEND uploads one and files a copy (a background write). Block: R reads
// from the disk; W is a background write.
//
// Thread-safety: Simulate is reentrant (each call builds its own machine).
#ifndef GHOST_COMMON_SIM_SIMULATOR_H_
#define GHOST_COMMON_SIM_SIMULATOR_H_

#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/power/machine.h"
#include "common/power/profile.h"
#include "common/base/status.h"
#include "common/sim/trace.h"
#include "common/base/units.h"

namespace ghost {

struct SimOptions {
  Policy policy = Policy::kAdaptive;
  int knob = 50;                    // 0..100
  bool ghost_hints = true;          // adaptive only
  DiskPolicyKind disk_policy = DiskPolicyKind::kStpm;  // adaptive only
  Bytes write_queue_cap = 4 * 1024 * 1024;             // DESIGN §3.5 default
  // RAM that keeps clean copies of recently read or written objects (the page cache: the
  // live filesystem's reads of such objects never reach the daemon). 0 disables it.
  Bytes page_cache = 8 * 1024 * 1024;
  bool compute_lower_bound = true;  // runs the no-power-management replay as well
};

// One request as the client saw it.
struct RequestRecord {
  TimePoint start;
  Duration response{0};
  std::string key;
  Bytes size = 0;
  std::string source;  // memory, disk, network (upload for SEND, write for block W)
};

struct SimResult {
  std::string profile;
  std::string trace;
  std::string policy;
  std::string disk_policy;
  int knob = 0;
  bool ghost_hints = false;
  std::size_t requests = 0;
  double mean_response_ms = 0;
  double p95_response_ms = 0;
  Energy energy;
  Energy base_energy;
  Energy lower_bound;
  Duration duration{0};
  std::vector<DeviceResult> devices;
  int ghost_hints_sent = 0;
  std::map<std::string, int> sources;  // reads served by memory / disk / network
  int uploads = 0;
  int write_batches = 0;
  Bytes bytes_written = 0;
  std::vector<RequestRecord> log;  // every request, in order
};

// Replays `trace` on `machine`. Fails (InvalidArgument) if the machine lacks a disk (or flash)
// device or a network device, or the knob is out of range.
[[nodiscard]] Result<SimResult> Simulate(const MachineProfile& machine, const Trace& trace,
                                         const SimOptions& options);

// The JSON object of DESIGN §7 (field order fixed, numbers rounded for stable output).
nlohmann::ordered_json ToJson(const SimResult& r);

}  // namespace ghost

#endif  // GHOST_COMMON_SIM_SIMULATOR_H_
