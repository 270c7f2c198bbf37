// libFuzzer target for the machine and device profile TOML (common/power/profile.h). Built and
// run by tests/fuzz/fuzz.sh.
//
// Each input is parsed as a machine profile and as a device profile (devices named in a
// machine profile are looked up among the shipped ones). Checked: no crash, no uncaught
// exception, no sanitizer report; an error always has a message.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "common/power/profile.h"

namespace {

template <typename R>
void CheckError(const R& r) {
  if (!r.ok() && r.status().message().empty()) {
    std::fprintf(stderr, "profile_fuzz: an error without a message\n");
    std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace ghost;
  const std::string text(reinterpret_cast<const char*>(data), size);
  auto machine = ParseMachineProfile(text, "fuzz.toml", GHOST_PROFILE_DIR);
  CheckError(machine);
  if (machine.ok()) {
    for (DeviceKind kind : {DeviceKind::kDisk, DeviceKind::kNetwork})
      (void)machine->FindDevice(kind);
  }
  CheckError(ParseDeviceProfile(text, "fuzz.toml"));
  return 0;
}
