// A fake sysfs tree in a fresh temporary directory (what GHOST_SYSFS_ROOT points to in tests):
// files written with their contents, symbolic links as the kernel's dev/block links.
#ifndef GHOST_TESTS_COMMON_POWER_FAKE_SYSFS_H_
#define GHOST_TESTS_COMMON_POWER_FAKE_SYSFS_H_

#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "common/power/sysfs.h"

namespace ghost {

class FakeSysfs {
 public:
  FakeSysfs() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "ghost-sysfs-XXXXXX").string();
    root_ = ::mkdtemp(tmpl.data());
  }
  ~FakeSysfs() {
    std::error_code ec;
    std::filesystem::remove_all(root_, ec);
  }
  FakeSysfs(const FakeSysfs&) = delete;
  FakeSysfs& operator=(const FakeSysfs&) = delete;

  const std::string& root() const { return root_; }
  Sysfs sysfs() const { return Sysfs(root_); }
  void Write(const std::string& rel, const std::string& content) const {
    std::filesystem::path p = std::filesystem::path(root_) / rel;
    std::filesystem::create_directories(p.parent_path());
    std::ofstream(p) << content;
  }
  void Mkdir(const std::string& rel) const {
    std::filesystem::create_directories(std::filesystem::path(root_) / rel);
  }
  void Remove(const std::string& rel) const {
    std::filesystem::remove_all(std::filesystem::path(root_) / rel);
  }
  // rel → target (relative to rel's directory, as sysfs links are).
  void Link(const std::string& rel, const std::string& target) const {
    std::filesystem::path p = std::filesystem::path(root_) / rel;
    std::filesystem::create_directories(p.parent_path());
    std::filesystem::create_directory_symlink(target, p);
  }
  // A whole disk `name` with major:minor `dev` and partition `name`1 at dev+1, as
  // block/NAME{,/NAME1} and dev/block/MAJ:MIN links.
  void AddDisk(const std::string& name, int major, int minor, bool rotational,
               const std::string& model = "FAKE DISK") const {
    Write("block/" + name + "/queue/rotational", rotational ? "1\n" : "0\n");
    Write("block/" + name + "/removable", "0\n");
    Write("block/" + name + "/device/model", model + "   \n");
    Write("block/" + name + "/" + name + "1/partition", "1\n");
    Link("dev/block/" + std::to_string(major) + ":" + std::to_string(minor), "../../block/" + name);
    Link("dev/block/" + std::to_string(major) + ":" + std::to_string(minor + 1),
         "../../block/" + name + "/" + name + "1");
    Link("class/block/" + name + "1", "../../block/" + name + "/" + name + "1");
  }

 private:
  std::string root_;
};

}  // namespace ghost

#endif  // GHOST_TESTS_COMMON_POWER_FAKE_SYSFS_H_
