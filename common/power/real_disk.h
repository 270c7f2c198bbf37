// A real ATA/SATA disk behind the model's disk (device_backend.h), driven as hdparm drives it:
// ATA commands in an ATA PASS-THROUGH (16) SCSI command block through the SG_IO ioctl.
//
//   CHECK POWER MODE   0xE5  (hdparm -C) the state, in the sector count register of the
//                            ATA return descriptor; never spins the disk up
//   STANDBY IMMEDIATE  0xE0  (hdparm -y) spin down now
//   IDLE IMMEDIATE     0xE1  spin up into idle (leaving standby before the I/O arrives)
//
// The command block (hdparm sgio.c sg16(); T10 SAT-3 §12.2.2, "ATA PASS-THROUGH (16)"):
//   byte 0  0x85            ATA_16 operation code
//   byte 1  0x06            protocol 3 (non-data) << 1
//   byte 2  0x20            CK_COND: return the ATA registers in the sense data
//   bytes 3–12  0           features, count, LBA (none of these commands take any)
//   byte 13 0x40            device register: LBA bit, as hdparm sets it
//   byte 14 command
//   byte 15 0               control
// The reply: descriptor-format sense (response code 0x72) holding the ATA Status Return
// descriptor (code 0x09, length 0x0c): error at [3], sector count at [5], status at [13].
//
// Model mode → command: the profile's lowest mode (or one named "standby"/"sleep") is STANDBY
// IMMEDIATE; any other mode while the disk reads back "standby" is IDLE IMMEDIATE. A disk
// that is not managed, or has lost permission, only reads its state. SSDs and NVMe are
// reported read-only (SsdBackend): nothing spins, APST and power states are the drive's.
//
// Thread-safety: not thread-safe.
#ifndef GHOST_COMMON_POWER_REAL_DISK_H_
#define GHOST_COMMON_POWER_REAL_DISK_H_

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/base/status.h"
#include "common/power/device_backend.h"
#include "common/power/sysfs.h"

namespace ghost {

inline constexpr std::uint8_t kAtaPassThrough16 = 0x85;   // ATA_16, SAT-3
inline constexpr std::uint8_t kAtaCheckPowerMode = 0xE5;  // ATA_OP_CHECKPOWERMODE1
inline constexpr std::uint8_t kAtaStandbyImmediate = 0xE0;
inline constexpr std::uint8_t kAtaIdleImmediate = 0xE1;

using AtaCdb = std::array<std::uint8_t, 16>;

// The ATA PASS-THROUGH (16) block of a non-data ATA command, byte for byte as hdparm sends it.
AtaCdb AtaNonDataCdb(std::uint8_t command);

// What the SG_IO ioctl returned (struct sg_io_hdr's status fields and the sense buffer).
struct SgIoReply {
  std::uint8_t status = 0;          // SCSI status (0x02: CHECK CONDITION)
  std::uint16_t host_status = 0;
  std::uint16_t driver_status = 0;  // 0x08: DRIVER_SENSE
  std::vector<std::uint8_t> sense;
};

// The SG_IO layer: one command block to the disk. Real: an ioctl on /dev/sdX; tests: a fake.
class SgIo {
 public:
  virtual ~SgIo() = default;
  // Sends `cdb` (no data phase). Failure: the ioctl's errno as a Status (EPERM without
  // CAP_SYS_RAWIO, ENODEV/ENXIO when the disk is gone, EIO).
  [[nodiscard]] virtual Result<SgIoReply> Execute(const AtaCdb& cdb) = 0;
};

// Opens `dev_path` (O_RDONLY|O_NONBLOCK, as hdparm) for SG_IO.
[[nodiscard]] Result<std::unique_ptr<SgIo>> OpenSgIo(const std::string& dev_path);

// The ATA registers a command left, from its reply.
struct AtaRegisters {
  std::uint8_t status = 0, error = 0, count = 0;
};
// IoError when the reply carries no ATA return descriptor, a host or driver error, or the
// ATA status has ERR or DRQ set (the drive refused the command).
[[nodiscard]] Result<AtaRegisters> ParseAtaReply(const SgIoReply& reply);

// CHECK POWER MODE's sector count as hdparm -C names it: 0x00 "standby", 0x40/0x41 "NVcache
// spun down/up", 0x80 "idle", 0x81–0x83 "idle_a/b/c", 0xFF "active/idle", else "unknown".
std::string AtaPowerModeName(std::uint8_t count);

// One ATA disk.
class AtaDisk {
 public:
  explicit AtaDisk(std::unique_ptr<SgIo> io) : io_(std::move(io)) {}
  // The drive's state name (AtaPowerModeName). Failure: as SgIo::Execute, or ParseAtaReply's.
  [[nodiscard]] Result<std::string> CheckPowerMode();
  [[nodiscard]] Status StandbyImmediate();
  [[nodiscard]] Status IdleImmediate();

 private:
  Result<AtaRegisters> Command(std::uint8_t command);
  std::unique_ptr<SgIo> io_;
};

struct RealDiskOptions {
  BlockDeviceInfo info;
  bool manage = false;  // named by --manage-disk (and not the root disk, or forced)
  std::string note;     // why it is not managed, for `ghostctl devices`
};

// A rotating ATA disk behind the model's disk.
class AtaDiskBackend final : public DeviceBackend {
 public:
  // `io` may be null (the device could not be opened; `options.note` says why).
  AtaDiskBackend(RealDiskOptions options, std::unique_ptr<SgIo> io);
  void Apply(const DeviceProfile& profile, int mode) override;
  void Refresh() override;
  bool managed() const override { return manage_; }
  nlohmann::json ToJson() const override;
  // Commands sent so far (tests; the log of what STPM's decisions became).
  const std::vector<std::string>& commands() const { return commands_; }
  const std::string& hardware_mode() const { return hardware_mode_; }

 private:
  void Fail(const Status& s, const std::string& what);
  RealDiskOptions options_;
  std::unique_ptr<AtaDisk> disk_;
  bool manage_;
  std::string hardware_mode_ = "unknown";
  std::string error_;
  std::vector<std::string> commands_;
};

// An SSD or NVMe drive: reported, never driven (nothing to spin down; the drive and the
// kernel's APST choose its power states).
class SsdBackend final : public DeviceBackend {
 public:
  SsdBackend(const Sysfs& sysfs, BlockDeviceInfo info);
  void Apply(const DeviceProfile&, int) override {}
  void Refresh() override;
  bool managed() const override { return false; }
  nlohmann::json ToJson() const override;

 private:
  Sysfs sysfs_;
  BlockDeviceInfo info_;
  nlohmann::json state_;
};

}  // namespace ghost

#endif  // GHOST_COMMON_POWER_REAL_DISK_H_
