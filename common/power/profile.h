// Device and machine profiles: devices are data (DESIGN §2, §5).
//
// A device profile lists the device's modes, ordered from the high-power mode (index 0, the
// fastest that serves I/O) down to the deepest low-power mode, with each mode's power, whether
// it serves I/O and, if it does, its I/O model; and the transitions between modes with their
// time and energy. A machine profile names a base power, a network link and its devices.
//
// Profiles are TOML files under common/profiles/ (format documented in
// common/profiles/README.md); every number in a shipped profile carries its source in a
// comment. Errors name the file and line.
//
// Thread-safety: plain values; the loaders are reentrant.
#ifndef GHOST_COMMON_POWER_PROFILE_H_
#define GHOST_COMMON_POWER_PROFILE_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/base/status.h"
#include "common/base/units.h"

namespace ghost {

enum class DeviceKind { kDisk, kNetwork, kFlash, kMemory };
const char* DeviceKindName(DeviceKind kind);

// How a mode that serves I/O performs. For a disk or flash device: a request of n bytes
// takes `latency + n / bandwidth`, drawing `active_power` instead of the mode's idle power.
// For a network device the per-request time comes from the machine's link (round trips and
// link bandwidth, see Link); `latency` is the extra server time per request.
struct IoModel {
  Duration latency{0};
  Bandwidth read_bandwidth;
  Bandwidth write_bandwidth;
  Power active_power;
};

struct Mode {
  std::string name;
  Power power;             // drawn while idle in this mode
  bool serves_io = false;  // false: I/O first needs a transition to a mode that serves
  IoModel io;              // meaningful only if serves_io
  // Network power-saving mode: the card sleeps and wakes at each beacon (DESIGN §7). A round
  // trip whose reply arrives while the card sleeps is delivered at the next beacon; once
  // awake the card receives at the link rate. Zero means always awake.
  Duration beacon_interval{0};
};

struct Transition {
  int from = 0;
  int to = 0;
  Duration time{0};
  Energy energy;  // the device's energy over the transition (not the rest of the machine)
};

// Flash devices (DESIGN §3.7); zero for others.
struct FlashGeometry {
  Bytes erase_segment = 0;  // 0: erasure is inside the write bandwidth (a flash disk)
  Duration erase_time{0};   // per segment
  Power erase_power;        // drawn while erasing (0: the mode's active power)
  Bytes capacity = 0;       // the device's size; 0: unknown (the flash model needs it)
  // The size of one erasing chip (its own write state machine: one erasure at a time on it,
  // erasures on distinct chips at once); 0: the whole device is one chip.
  Bytes erase_chip = 0;
  // Asynchronous cleaning in idle time (DESIGN §3.7, round 13): the background cleaner starts
  // once the card has been idle this long and copies block by block, a host request waiting
  // at most for the block copy in progress. Unset (no clean_idle_ms): the cleaner runs right
  // after each write, as before round 13.
  std::optional<Duration> clean_idle;
  // Wear levelling in the victim choice (DESIGN §3.7, round 16): every Nth cleaning takes the
  // segment erased least over the card's life instead of the greedy one, as the PCMCIA Flash
  // Translation Layer driver does (Linux drivers/mtd/ftl.c reclaim_block, shuffle_freq 50).
  // 0 (no clean_wear_shuffle): greedy every time.
  std::uint32_t clean_wear_shuffle = 0;
};

struct DeviceProfile {
  std::string name;
  DeviceKind kind = DeviceKind::kDisk;
  std::string description;
  std::vector<Mode> modes;              // [0] is the high-power mode
  std::vector<Transition> transitions;  // every pair used by a policy must be listed
  FlashGeometry flash;
  std::string source;                   // file the profile came from, for messages

  int ModeIndex(const std::string& mode_name) const;  // -1 if absent
  // The direct transition between two modes, if the profile lists one.
  const Transition* FindTransition(int from, int to) const;
  // Time and energy to get from `from` to `to`: the direct transition, or through the
  // high-power mode (down steps are composed as from→0→to). Zero if from == to.
  Transition TransitionCost(int from, int to) const;
  // The fastest mode that serves I/O (normally 0).
  int HighPowerMode() const { return 0; }
  int LowestMode() const { return static_cast<int>(modes.size()) - 1; }
};

// The network path between the machine and its origins.
struct Link {
  Duration one_way_delay{0};
  Bandwidth down;
  Bandwidth up;
  // Round trips before the first byte of a reply (connection set-up, request, slow start),
  // chosen so the paper's Figure 3 calibration holds (DESIGN §5).
  int round_trips = 1;
  // A request on a connection kept alive from an earlier transfer skips the handshake: it
  // takes `warm_round_trips`, if it starts within `keepalive` of the last transfer's end
  // (zero keepalive: every request opens a new connection).
  int warm_round_trips = 1;
  Duration keepalive{0};
  Duration rtt() const { return 2 * one_way_delay; }
};

struct MachineProfile {
  std::string name;
  std::string description;
  Power base_power;
  Link link;
  std::vector<DeviceProfile> devices;
  std::string source;

  // First device of that kind, or nullptr.
  const DeviceProfile* FindDevice(DeviceKind kind) const;
};

// Where the shipped profiles may be, in the order DefaultProfileDir() tries them:
//   $GHOST_PROFILE_DIR if set (only it);
//   else, for a program run from its build tree, the source tree's common/profiles;
//   else (installed) $datadir/ghost/profiles next to the program's own $bindir (so a package
//   unpacked anywhere finds its copy), then the configured $prefix/$datadir/ghost/profiles.
std::vector<std::string> ProfileDirCandidates();
// The first candidate that is a directory; the first candidate when none is.
std::string DefaultProfileDir();

// Loads a machine profile by name (looked up as DIR/NAME.toml) or by path (anything with a
// '/' or ending in .toml). A device profile given where a machine is expected becomes a
// machine with that one device, the ipaq-2004 base power and link. Unknown names give
// NotFound listing the available profiles.
[[nodiscard]] Result<MachineProfile> LoadMachineProfile(const std::string& name_or_path,
                                                        const std::string& dir = DefaultProfileDir());
[[nodiscard]] Result<DeviceProfile> LoadDeviceProfile(const std::string& name_or_path,
                                                      const std::string& dir = DefaultProfileDir());
// Parses a profile from text (for tests and for files); `source` names it in errors.
[[nodiscard]] Result<MachineProfile> ParseMachineProfile(const std::string& text,
                                                         const std::string& source,
                                                         const std::string& dir = DefaultProfileDir());
[[nodiscard]] Result<DeviceProfile> ParseDeviceProfile(const std::string& text,
                                                       const std::string& source);

// Names of the profiles in `dir` (machine and device), sorted.
std::vector<std::string> ListProfiles(const std::string& dir = DefaultProfileDir());

}  // namespace ghost

#endif  // GHOST_COMMON_POWER_PROFILE_H_
