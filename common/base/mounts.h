// The mount table as this process sees it (/proc/self/mountinfo): to find ghostfs mounts and
// to refuse to mount over one.
//
// Thread-safety: plain functions.
#ifndef GHOST_COMMON_BASE_MOUNTS_H_
#define GHOST_COMMON_BASE_MOUNTS_H_

#include <optional>
#include <string>
#include <vector>

namespace ghost {

struct MountInfo {
  std::string point;   // the mount point, unescaped
  std::string fstype;  // e.g. "fuse.ghost" (ghostfs), "tmpfs"
  std::string source;  // e.g. "ghostfs"
};

// Every mount, in mount order (empty if /proc is not mounted).
std::vector<MountInfo> ReadMounts();

// The topmost mount whose mount point is exactly `path` (compare real paths), if any.
std::optional<MountInfo> MountAt(const std::string& path);

}  // namespace ghost

#endif  // GHOST_COMMON_BASE_MOUNTS_H_
