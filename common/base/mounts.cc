#include "common/base/mounts.h"

#include <fstream>
#include <sstream>

namespace ghost {
namespace {

// mountinfo escapes space, tab, newline and backslash in paths as \ooo.
std::string Unescape(const std::string& s) {
  std::string out;
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\\' && i + 3 < s.size()) {
      int v = 0;
      bool octal = true;
      for (std::size_t k = 1; k <= 3; ++k) {
        if (s[i + k] < '0' || s[i + k] > '7') {
          octal = false;
        } else {
          v = v * 8 + (s[i + k] - '0');
        }
      }
      if (octal) {
        out.push_back(static_cast<char>(v));
        i += 3;
        continue;
      }
    }
    out.push_back(s[i]);
  }
  return out;
}

}  // namespace

std::vector<MountInfo> ReadMounts() {
  // "36 35 98:0 / /mnt/ghost rw,nosuid shared:1 - fuse.ghost ghostfs rw,user_id=0"
  std::vector<MountInfo> out;
  std::ifstream in("/proc/self/mountinfo");
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    std::string id, parent, devno, root, point, word;
    if (!(fields >> id >> parent >> devno >> root >> point)) continue;
    while (fields >> word && word != "-") {
    }
    MountInfo m;
    if (!(fields >> m.fstype)) continue;
    fields >> m.source;
    m.point = Unescape(point);
    m.source = Unescape(m.source);
    out.push_back(std::move(m));
  }
  return out;
}

std::optional<MountInfo> MountAt(const std::string& path) {
  std::optional<MountInfo> found;
  for (MountInfo& m : ReadMounts()) {
    if (m.point == path) found = std::move(m);  // later entries are mounted on top
  }
  return found;
}

}  // namespace ghost
