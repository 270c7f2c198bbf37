// libFuzzer target for the HTML directory-listing parser (common/http/autoindex.h). Built and
// run by tests/fuzz/fuzz.sh.
//
// Each input is parsed as a listing with and without a directory URL, and given to the
// percent and entity decoders. Checked: no crash or sanitizer report, and every entry the
// parser returns is a usable path segment (not empty, not "." or "..", no '/' or NUL) with an
// exact or an approximate size but not both.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "common/http/autoindex.h"

namespace {

void Check(bool ok, const char* what, const std::string& detail) {
  if (ok) return;
  std::fprintf(stderr, "autoindex_fuzz: %s: \"%s\"\n", what, detail.c_str());
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace ghost;
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  for (std::string_view url : {std::string_view{}, std::string_view{"http://127.0.0.1:8080/pub/dir/"}}) {
    Result<std::vector<DirEntry>> entries = ParseAutoindex(in, url);
    if (!entries.ok()) continue;
    for (const DirEntry& e : *entries) {
      Check(!e.name.empty() && e.name != "." && e.name != "..", "an unusable entry name", e.name);
      Check(e.name.find('/') == std::string::npos && e.name.find('\0') == std::string::npos,
            "an entry name with '/' or NUL", e.name);
      Check(!(e.size && e.approximate_size), "both an exact and an approximate size", e.name);
    }
  }
  (void)PercentDecode(in);
  (void)DecodeHtmlEntities(in);
  return 0;
}
