// libFuzzer target for ghostfs's TOML configuration (common/config/config.h). Built and run by
// tests/fuzz/fuzz.sh.
//
// Each input is loaded as a config file (through an in-memory file, /proc/self/fd/N), then
// validated; each of its lines is also given to the option parsers (--origin, sizes,
// policies, imap_delete). Checked: no crash, no uncaught exception, no sanitizer report; an
// error always has a message.
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "common/config/config.h"

namespace {

void CheckStatus(const ghost::Status& s) {
  if (!s.ok() && s.message().empty()) {
    std::fprintf(stderr, "config_fuzz: an error without a message\n");
    std::abort();
  }
}

int ConfigFd() {
  static const int fd = memfd_create("config_fuzz.toml", 0);
  if (fd < 0) {
    std::perror("config_fuzz: memfd_create");
    std::abort();
  }
  return fd;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace ghost;
  const int fd = ConfigFd();
  if (ftruncate(fd, 0) != 0 || pwrite(fd, data, size, 0) != static_cast<ssize_t>(size)) {
    std::perror("config_fuzz: writing the memfd");
    std::abort();
  }
  GhostfsOptions options;
  const Status loaded = LoadConfigFile("/proc/self/fd/" + std::to_string(fd), &options);
  CheckStatus(loaded);
  if (loaded.ok()) CheckStatus(Validate(options));

  const std::string_view in(reinterpret_cast<const char*>(data), size);
  std::size_t pos = 0;
  for (int n = 0; pos <= in.size() && n < 64; ++n) {
    std::size_t nl = in.find('\n', pos);
    if (nl == std::string_view::npos) nl = in.size();
    const std::string line(in.substr(pos, nl - pos));
    CheckStatus(ParseOrigin(line).status());
    CheckStatus(ParseSize(line).status());
    CheckStatus(ParsePolicy(line).status());
    CheckStatus(ParseImapDelete(line).status());
    pos = nl + 1;
  }
  return 0;
}
