// Sysfs: the kernel's sysfs attributes, read under a root that tests replace.
//
// Every real-hardware backend (real_disk.h, real_wifi.h, meters.h) finds its device and reads
// its state here, never through a hard-coded "/sys": the root is $GHOST_SYSFS_ROOT when set
// (a fake tree built by a test), else "/sys". Attributes are small text files; a read returns
// the first line without its newline.
//
// Thread-safety: a value; reads are plain file reads, safe from any thread.
#ifndef GHOST_COMMON_POWER_SYSFS_H_
#define GHOST_COMMON_POWER_SYSFS_H_

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/base/status.h"

namespace ghost {

// A block device as sysfs describes it: the whole disk a device number belongs to.
struct BlockDeviceInfo {
  std::string disk;       // the whole disk's kernel name: "sda", "nvme0n1", "mmcblk0"
  std::string partition;  // the partition's name ("sda1"), empty for the whole disk
  bool rotational = false;  // queue/rotational: a spinning disk
  bool removable = false;
  std::string model;        // device/model, trimmed; may be empty
  bool nvme() const { return disk.starts_with("nvme"); }
  std::string dev_path() const { return "/dev/" + disk; }
};

class Sysfs {
 public:
  explicit Sysfs(std::string root) : root_(std::move(root)) {}
  // $GHOST_SYSFS_ROOT when set and non-empty, else "/sys".
  static Sysfs FromEnvironment();

  const std::string& root() const { return root_; }
  // root + "/" + rel.
  std::string Path(std::string_view rel) const;
  bool Exists(std::string_view rel) const;

  // The attribute's first line. NotFound when the file is missing (the device is gone);
  // IoError naming the path for any other failure (EIO from a driver, EACCES).
  [[nodiscard]] Result<std::string> ReadString(std::string_view rel) const;
  // As ReadString, then a decimal integer; Corruption naming the path when it is not one.
  [[nodiscard]] Result<std::int64_t> ReadInt(std::string_view rel) const;
  // Writes `value` to the attribute (IoError/NotFound as ReadString).
  [[nodiscard]] Status Write(std::string_view rel, std::string_view value) const;
  // The names in directory `rel` starting with `prefix`, sorted; empty if it does not exist.
  std::vector<std::string> List(std::string_view rel, std::string_view prefix = "") const;

  // The whole disk holding device number `dev` (a file system's st_dev), through
  // dev/block/MAJ:MIN. NotFound when sysfs has no block device for it (an overlay, tmpfs or
  // FUSE file system: anonymous device numbers).
  [[nodiscard]] Result<BlockDeviceInfo> BlockDevice(dev_t dev) const;
  // The whole disk named `name` ("sda", or "/dev/sda", or a partition "/dev/sda2").
  [[nodiscard]] Result<BlockDeviceInfo> BlockDeviceByName(std::string_view name) const;

 private:
  Result<BlockDeviceInfo> Describe(const std::string& disk, const std::string& partition) const;
  std::string root_;
};

}  // namespace ghost

#endif  // GHOST_COMMON_POWER_SYSFS_H_
