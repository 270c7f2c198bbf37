// libFuzzer target for the trace parser (common/sim/trace.h). Built and run by
// tests/fuzz/fuzz.sh.
//
// Each input is parsed as a trace file; a trace that parses must write back (WriteTrace) and
// parse again to the same events, the format's documented promise. The summary of a parsed
// trace must not crash either.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>

#include "common/sim/trace.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace ghost;
  std::istringstream in(std::string(reinterpret_cast<const char*>(data), size));
  Result<Trace> t = ParseTrace(in, "fuzz");
  if (!t.ok()) {
    if (t.status().message().empty()) {
      std::fprintf(stderr, "trace_fuzz: an error without a message\n");
      std::abort();
    }
    return 0;
  }
  (void)SummarizeTrace(*t);
  std::ostringstream out;
  WriteTrace(*t, out, "fuzz");
  std::istringstream again(out.str());
  Result<Trace> back = ParseTrace(again, "fuzz-written");
  if (!back.ok() || back->kind != t->kind || back->web != t->web || back->mail != t->mail ||
      back->block != t->block) {
    std::fprintf(stderr, "trace_fuzz: a parsed trace does not round-trip: %s\n%s\n",
                 back.ok() ? "different events" : back.status().message().c_str(),
                 out.str().c_str());
    std::abort();
  }
  return 0;
}
