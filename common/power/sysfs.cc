#include "common/power/sysfs.h"

#include <sys/sysmacros.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <fstream>

namespace ghost {
namespace {

std::string Trim(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ' || s.back() == '\t')) s.pop_back();
  std::size_t start = s.find_first_not_of(" \t");
  return start == std::string::npos ? std::string() : s.substr(start);
}

}  // namespace

Sysfs Sysfs::FromEnvironment() {
  const char* root = std::getenv("GHOST_SYSFS_ROOT");
  return Sysfs(root != nullptr && *root != '\0' ? root : "/sys");
}

std::string Sysfs::Path(std::string_view rel) const {
  return root_ + "/" + std::string(rel);
}

bool Sysfs::Exists(std::string_view rel) const {
  std::error_code ec;
  return std::filesystem::exists(Path(rel), ec);
}

Result<std::string> Sysfs::ReadString(std::string_view rel) const {
  const std::string path = Path(rel);
  std::FILE* f = std::fopen(path.c_str(), "re");
  if (f == nullptr) {
    if (errno == ENOENT || errno == ENODEV || errno == ENXIO) {
      return Status::NotFound(path + ": no such attribute (device gone?)");
    }
    return Status::FromErrno(errno, "open " + path);
  }
  char buf[4096];
  std::size_t n = std::fread(buf, 1, sizeof buf - 1, f);
  const bool failed = std::ferror(f) != 0;
  const int err = errno;
  std::fclose(f);
  if (failed) {
    if (err == ENODEV || err == ENXIO) return Status::NotFound(path + ": device gone");
    return Status::FromErrno(err, "read " + path);
  }
  std::string s(buf, n);
  if (std::size_t nl = s.find('\n'); nl != std::string::npos) s.resize(nl);
  return Trim(std::move(s));
}

Result<std::int64_t> Sysfs::ReadInt(std::string_view rel) const {
  Result<std::string> s = ReadString(rel);
  if (!s.ok()) return s.status();
  errno = 0;
  char* end = nullptr;
  long long v = std::strtoll(s->c_str(), &end, 10);
  if (s->empty() || end == nullptr || *end != '\0' || errno == ERANGE) {
    return Status::Corruption(Path(rel) + ": \"" + *s + "\" is not an integer");
  }
  return static_cast<std::int64_t>(v);
}

Status Sysfs::Write(std::string_view rel, std::string_view value) const {
  const std::string path = Path(rel);
  std::FILE* f = std::fopen(path.c_str(), "we");
  if (f == nullptr) {
    if (errno == ENOENT) return Status::NotFound(path + ": no such attribute (device gone?)");
    return Status::FromErrno(errno, "open " + path);
  }
  std::size_t n = std::fwrite(value.data(), 1, value.size(), f);
  int err = n == value.size() ? 0 : errno;
  if (std::fclose(f) != 0 && err == 0) err = errno;
  if (err != 0) return Status::FromErrno(err, "write " + path);
  return Status::Ok();
}

std::vector<std::string> Sysfs::List(std::string_view rel, std::string_view prefix) const {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(Path(rel), ec)) {
    std::string name = e.path().filename().string();
    if (name.starts_with(prefix)) out.push_back(std::move(name));
  }
  std::sort(out.begin(), out.end());
  return out;
}

Result<BlockDeviceInfo> Sysfs::Describe(const std::string& disk, const std::string& partition) const {
  if (!Exists("block/" + disk)) return Status::NotFound("no block device " + disk + " in " + root_ + "/block");
  BlockDeviceInfo info;
  info.disk = disk;
  info.partition = partition;
  Result<std::int64_t> rot = ReadInt("block/" + disk + "/queue/rotational");
  info.rotational = rot.ok() && *rot == 1;
  Result<std::int64_t> rem = ReadInt("block/" + disk + "/removable");
  info.removable = rem.ok() && *rem == 1;
  if (Result<std::string> m = ReadString("block/" + disk + "/device/model"); m.ok()) info.model = *m;
  return info;
}

Result<BlockDeviceInfo> Sysfs::BlockDevice(dev_t dev) const {
  const std::string rel =
      "dev/block/" + std::to_string(major(dev)) + ":" + std::to_string(minor(dev));
  std::error_code ec;
  std::filesystem::path real = std::filesystem::canonical(Path(rel), ec);
  if (ec) {
    return Status::NotFound("device " + std::to_string(major(dev)) + ":" +
                            std::to_string(minor(dev)) +
                            " is not a block device (an overlay, tmpfs or network file system)");
  }
  // .../block/sda/sda1 for a partition (it has a "partition" attribute), .../block/sda else.
  if (std::filesystem::exists(real / "partition", ec)) {
    return Describe(real.parent_path().filename().string(), real.filename().string());
  }
  return Describe(real.filename().string(), "");
}

Result<BlockDeviceInfo> Sysfs::BlockDeviceByName(std::string_view name) const {
  std::string n(name);
  if (n.starts_with("/dev/")) n = n.substr(5);
  if (n.empty() || n.find('/') != std::string::npos) {
    return Status::InvalidArgument("\"" + std::string(name) + "\" is not a disk name like /dev/sda");
  }
  if (Exists("block/" + n)) return Describe(n, "");
  // A partition: class/block/sda1 is a link into its disk's directory.
  std::error_code ec;
  std::filesystem::path real = std::filesystem::canonical(Path("class/block/" + n), ec);
  if (!ec && std::filesystem::exists(real / "partition", ec)) {
    return Describe(real.parent_path().filename().string(), n);
  }
  return Status::NotFound("no disk " + std::string(name) + " (not in " + root_ + "/block)");
}

}  // namespace ghost
