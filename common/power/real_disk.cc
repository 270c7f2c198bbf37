#include "common/power/real_disk.h"

#include <fcntl.h>
#include <scsi/sg.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>

namespace ghost {
namespace {

constexpr std::uint8_t kProtocolNonData = 3 << 1;  // SAT: protocol field, bits 4..1 of byte 1
constexpr std::uint8_t kCheckCondition = 1 << 5;   // CK_COND, byte 2
constexpr std::uint8_t kDeviceLba = 1 << 6;        // ATA device register: LBA
constexpr std::uint8_t kSenseDescriptorFormat = 0x72;
constexpr std::uint8_t kAtaReturnDescriptor = 0x09;
constexpr std::uint8_t kAtaStatusErr = 0x01;
constexpr std::uint8_t kAtaStatusDrq = 0x08;
constexpr std::uint16_t kDriverSense = 0x08;
constexpr std::uint8_t kScsiCheckCondition = 0x02;
constexpr unsigned kTimeoutMs = 15000;  // spin-up may take seconds

class LinuxSgIo final : public SgIo {
 public:
  LinuxSgIo(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  ~LinuxSgIo() override { ::close(fd_); }
  Result<SgIoReply> Execute(const AtaCdb& cdb) override {
    AtaCdb c = cdb;
    SgIoReply reply;
    reply.sense.assign(32, 0);
    sg_io_hdr_t h{};
    h.interface_id = 'S';
    h.cmd_len = static_cast<unsigned char>(c.size());
    h.cmdp = c.data();
    h.dxfer_direction = SG_DXFER_NONE;
    h.mx_sb_len = static_cast<unsigned char>(reply.sense.size());
    h.sbp = reply.sense.data();
    h.timeout = kTimeoutMs;
    if (::ioctl(fd_, SG_IO, &h) != 0) return Status::FromErrno(errno, "SG_IO on " + path_);
    reply.status = h.status;
    reply.host_status = h.host_status;
    reply.driver_status = h.driver_status;
    reply.sense.resize(h.sb_len_wr);
    return reply;
  }

 private:
  int fd_;
  std::string path_;
};

char Hex(int v) { return "0123456789abcdef"[v & 15]; }

std::string CommandName(std::uint8_t c) {
  switch (c) {
    case kAtaCheckPowerMode: return "CHECK POWER MODE";
    case kAtaStandbyImmediate: return "STANDBY IMMEDIATE";
    case kAtaIdleImmediate: return "IDLE IMMEDIATE";
  }
  return std::string("ATA 0x") + Hex(c >> 4) + Hex(c);
}

bool IsPermission(const Status& s) { return s.ToErrno() == EPERM || s.ToErrno() == EACCES; }
// The device takes no SCSI/ATA pass-through at all (virtio-blk, a loop or dm device).
bool IsNotAta(const Status& s) {
  return s.ToErrno() == ENOTTY || s.ToErrno() == EINVAL || s.ToErrno() == EOPNOTSUPP;
}
bool IsGone(const Status& s) {
  return s.ToErrno() == ENODEV || s.ToErrno() == ENXIO || s.ToErrno() == ENOENT;
}

}  // namespace

AtaCdb AtaNonDataCdb(std::uint8_t command) {
  AtaCdb c{};
  c[0] = kAtaPassThrough16;
  c[1] = kProtocolNonData;
  c[2] = kCheckCondition;
  c[13] = kDeviceLba;
  c[14] = command;
  return c;
}

Result<std::unique_ptr<SgIo>> OpenSgIo(const std::string& dev_path) {
  int fd = ::open(dev_path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return Status::FromErrno(errno, "open " + dev_path);
  return std::unique_ptr<SgIo>(new LinuxSgIo(fd, dev_path));
}

Result<AtaRegisters> ParseAtaReply(const SgIoReply& r) {
  // As hdparm: with CK_COND the command "fails" with CHECK CONDITION carrying the registers.
  if (r.host_status != 0 || (r.driver_status & ~kDriverSense) != 0 ||
      (r.status != 0 && r.status != kScsiCheckCondition)) {
    char buf[96];
    std::snprintf(buf, sizeof buf, "SG_IO failed: SCSI status 0x%02x, host 0x%x, driver 0x%x", r.status,
                  r.host_status, r.driver_status);
    return Status::IoError(buf);
  }
  const auto& sb = r.sense;
  if (sb.size() < 8 + 14 || sb[0] != kSenseDescriptorFormat || sb[7] < 14 ||
      sb[8] != kAtaReturnDescriptor || sb[9] < 0x0c) {
    return Status::IoError("the disk returned no ATA status (no ATA pass-through on this device?)");
  }
  const std::uint8_t* d = sb.data() + 8;
  AtaRegisters regs{.status = d[13], .error = d[3], .count = d[5]};
  if (regs.status & (kAtaStatusErr | kAtaStatusDrq)) {
    char buf[80];
    std::snprintf(buf, sizeof buf, "the disk refused the command: ATA status 0x%02x, error 0x%02x",
                  regs.status, regs.error);
    return Status::IoError(buf);
  }
  return regs;
}

std::string AtaPowerModeName(std::uint8_t count) {
  switch (count) {
    case 0x00: return "standby";
    case 0x40: return "NVcache_spindown";
    case 0x41: return "NVcache_spinup";
    case 0x80: return "idle";
    case 0x81: return "idle_a";
    case 0x82: return "idle_b";
    case 0x83: return "idle_c";
    case 0xff: return "active/idle";
  }
  return "unknown";
}

Result<AtaRegisters> AtaDisk::Command(std::uint8_t command) {
  Result<SgIoReply> r = io_->Execute(AtaNonDataCdb(command));
  if (!r.ok()) return r.status();
  return ParseAtaReply(*r);
}

Result<std::string> AtaDisk::CheckPowerMode() {
  Result<AtaRegisters> r = Command(kAtaCheckPowerMode);
  if (!r.ok()) return r.status();
  return AtaPowerModeName(r->count);
}

Status AtaDisk::StandbyImmediate() {
  Result<AtaRegisters> r = Command(kAtaStandbyImmediate);
  return r.ok() ? Status::Ok() : r.status();
}

Status AtaDisk::IdleImmediate() {
  Result<AtaRegisters> r = Command(kAtaIdleImmediate);
  return r.ok() ? Status::Ok() : r.status();
}

AtaDiskBackend::AtaDiskBackend(RealDiskOptions options, std::unique_ptr<SgIo> io)
    : options_(std::move(options)), manage_(options_.manage && io != nullptr) {
  if (io) disk_ = std::make_unique<AtaDisk>(std::move(io));
  Refresh();
}

void AtaDiskBackend::Fail(const Status& s, const std::string& what) {
  if (IsPermission(s)) {
    error_ = what + " on " + options_.info.dev_path() +
             ": permission denied (needs CAP_SYS_RAWIO); the disk is modelled only";
    manage_ = false;
  } else if (IsNotAta(s)) {
    error_ = options_.info.dev_path() + " takes no ATA commands (" + s.message() +
             "); the disk is modelled only";
    manage_ = false;
    disk_.reset();
    hardware_mode_ = "n/a";
  } else if (IsGone(s)) {
    error_ = options_.info.dev_path() + " is gone; the disk is modelled only";
    manage_ = false;
    disk_.reset();
    hardware_mode_ = "gone";
  } else {
    error_ = what + " on " + options_.info.dev_path() + ": " + s.message();
  }
}

void AtaDiskBackend::Refresh() {
  if (!disk_) return;
  Result<std::string> m = disk_->CheckPowerMode();
  if (!m.ok()) {
    hardware_mode_ = "unknown";
    return Fail(m.status(), "CHECK POWER MODE");
  }
  hardware_mode_ = *m;
}

void AtaDiskBackend::Apply(const DeviceProfile& profile, int mode) {
  if (!manage_ || !disk_ || mode < 0 || mode >= static_cast<int>(profile.modes.size())) return;
  const std::string& name = profile.modes[mode].name;
  const bool standby = mode == static_cast<int>(profile.modes.size()) - 1 ||
                       name.find("standby") != std::string::npos ||
                       name.find("sleep") != std::string::npos;
  std::uint8_t cmd = 0;
  if (standby && hardware_mode_ != "standby") cmd = kAtaStandbyImmediate;
  if (!standby && (hardware_mode_ == "standby" || hardware_mode_ == "unknown")) cmd = kAtaIdleImmediate;
  if (cmd != 0) {
    commands_.push_back(CommandName(cmd));
    Status s = cmd == kAtaStandbyImmediate ? disk_->StandbyImmediate() : disk_->IdleImmediate();
    if (!s.ok()) return Fail(s, CommandName(cmd));
    error_.clear();
  }
  Refresh();  // read back, never assumed
}

nlohmann::json AtaDiskBackend::ToJson() const {
  nlohmann::json j = {{"backend", "ata"},
                      {"path", options_.info.dev_path()},
                      {"model", options_.info.model},
                      {"rotational", true},
                      {"managed", manage_},
                      {"hardware_mode", hardware_mode_}};
  if (!options_.note.empty()) j["note"] = options_.note;
  if (!error_.empty()) j["error"] = error_;
  return j;
}

SsdBackend::SsdBackend(const Sysfs& sysfs, BlockDeviceInfo info)
    : sysfs_(sysfs), info_(std::move(info)) {
  Refresh();
}

void SsdBackend::Refresh() {
  state_ = {{"backend", info_.nvme() ? "nvme" : "ssd"},
            {"path", info_.dev_path()},
            {"model", info_.model},
            {"rotational", false},
            {"managed", false},
            {"note", "solid-state: nothing to spin down; power states are the drive's (read-only)"}};
  Result<std::string> rt = sysfs_.ReadString("block/" + info_.disk + "/device/power/runtime_status");
  state_["hardware_mode"] = rt.ok() ? *rt : "unknown";
  if (info_.nvme()) {
    // nvme0n1 → controller nvme0; APST is on unless the latency tolerance is 0.
    std::string ctrl = info_.disk.substr(0, info_.disk.find('n', 4));
    Result<std::int64_t> tol =
        sysfs_.ReadInt("class/nvme/" + ctrl + "/power/pm_qos_latency_tolerance_us");
    if (tol.ok()) {
      state_["apst"] = *tol != 0;
      state_["apst_latency_tolerance_us"] = *tol;
    } else {
      state_["apst"] = nullptr;
    }
  }
}

nlohmann::json SsdBackend::ToJson() const { return state_; }

}  // namespace ghost
