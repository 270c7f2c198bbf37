// ghostsim: replays a trace through Ghost's model in virtual time and prints the results as
// JSON (DESIGN §7). See `ghostsim --help`.
//
// Exit codes: 0 success, 2 bad input (options, profile, trace), 1 internal failure.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <fstream>
#include <optional>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "common/build_info.h"
#include "common/power/profile.h"
#include "common/sim/flash_sim.h"
#include "common/sim/simulator.h"
#include "common/sim/trace.h"

namespace {

constexpr int kBadInput = 2;

int Fail(const std::string& msg) {
  std::fprintf(stderr, "ghostsim: %s\n", msg.c_str());
  return kBadInput;
}

// "0,50,90" → {0, 50, 90}; every value must be an integer in 0..100.
bool ParseKnobList(const std::string& text, std::vector<int>* out, std::string* err) {
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    std::size_t used = 0;
    int k = -1;
    try {
      k = std::stoi(item, &used);
    } catch (...) {
      used = 0;
    }
    if (item.empty() || used != item.size() || k < 0 || k > 100) {
      *err = "--knob-sweep: \"" + item + "\" is not a knob value in 0..100";
      return false;
    }
    out->push_back(k);
  }
  if (out->empty()) {
    *err = "--knob-sweep needs a list such as 0,50,90,95,99,100";
    return false;
  }
  return true;
}

// "4096", "256K", "2M", "1G" -> bytes.
bool ParseSize(const std::string& text, ghost::Bytes* out) {
  if (text.empty() || text[0] == '-' || text[0] == '+') return false;
  std::size_t used = 0;
  unsigned long long v = 0;
  try {
    v = std::stoull(text, &used);
  } catch (...) {
    return false;
  }
  std::string suffix = text.substr(used);
  ghost::Bytes mult = 1;
  if (suffix == "K" || suffix == "k") mult = 1024;
  else if (suffix == "M" || suffix == "m") mult = 1024 * 1024;
  else if (suffix == "G" || suffix == "g") mult = ghost::Bytes{1} << 30;
  else if (!suffix.empty()) return false;
  *out = v * mult;
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "ghostsim: replay a trace (web, mail or block; common/DESIGN.md §6) through Ghost's\n"
      "power model in virtual time and print one JSON object per run (common/DESIGN.md §7)."};
  app.set_version_flag("--version", std::string("ghostsim ") + GHOST_VERSION,
                       "print the version and exit");
  std::string profile = "ipaq-2004";
  std::string policy = "adaptive";
  std::string disk_policy = "stpm";
  int knob = 50;
  bool no_hints = false;
  bool pretty = false;
  std::string sweep;
  std::string trace_path;
  std::string requests_path;
  app.add_option("--profile", profile,
                 "machine or device profile: a shipped name (" + ghost::DefaultProfileDir() +
                     ") or a .toml file")
      ->capture_default_str();
  app.add_option("--policy", policy, "static (the paper's unmodified cache) or adaptive (cost model + STPM)")
      ->check(CLI::IsMember({"static", "adaptive"}))
      ->capture_default_str();
  app.add_option("--knob", knob, "performance/energy knob K: 0 saves energy, 100 performance")
      ->capture_default_str();
  app.add_flag("--no-ghost-hints", no_hints, "adaptive policy without ghost hints");
  app.add_option("--disk-policy", disk_policy,
                 "adaptive disk policy: stpm (self-tuning, eq. 1-3) or experts (Helmbold et al.)")
      ->check(CLI::IsMember({"stpm", "experts"}))
      ->capture_default_str();
  app.add_option("--knob-sweep", sweep, "run once per knob value, e.g. 0,50,90,95,99,100");
  app.add_flag("--pretty", pretty, "indent the JSON");
  app.add_option("--requests", requests_path,
                 "also write every request (start_s, response_ms, source, size, key) as CSV "
                 "to this file (the last run's, with --knob-sweep)");
  // Block-trace replay for the flash questions (common/sim/flash_sim.h).
  std::string flash_log_size, flush_policy = "when-full", flush_alg = "4", dram_buffer = "256K";
  std::string storage, log_device = "intel-flash", cleaning = "async", write_buffer = "0";
  double utilisation = 0.4;
  bool steady_state = false;
  app.add_option("--flash-log", flash_log_size,
                 "block trace: put a flash log of SIZE (e.g. 2M) in front of the disk");
  app.add_option("--flush-policy", flush_policy, "flash log flush policy: each-spinup or when-full")
      ->check(CLI::IsMember({"each-spinup", "when-full"}))
      ->capture_default_str();
  app.add_option("--flush-alg", flush_alg, "flash log flush algorithm 1..4 (DESIGN §3.5)")
      ->check(CLI::IsMember({"1", "2", "3", "4"}))
      ->capture_default_str();
  app.add_option("--dram-buffer", dram_buffer, "flash log flush buffer SIZE")->capture_default_str();
  app.add_option("--storage", storage,
                 "block trace: the device holding the data (cu140, sdp10, intel-flash, sd-card, ...)");
  app.add_option("--log-device", log_device, "the flash log's device profile")->capture_default_str();
  app.add_option("--utilisation", utilisation, "flash storage: live fraction preloaded (0..1)")
      ->check(CLI::Range(0.0, 0.97))
      ->capture_default_str();
  app.add_option("--cleaning", cleaning, "flash storage cleaning: on-demand or async")
      ->check(CLI::IsMember({"on-demand", "async"}))
      ->capture_default_str();
  app.add_option("--write-buffer", write_buffer,
                 "flash storage: a host write buffer of SIZE in front of the device (0: none)")
      ->capture_default_str();
  app.add_flag("--steady-state", steady_state,
               "flash storage: measure after the trace's writes have brought the card to its "
               "steady state (the trace must lie inside the live data)");
  app.add_option("TRACE", trace_path, "trace file (see common/traces/README.md)")->required();
  try {
    app.parse(argc, argv);
  } catch (const CLI::Success& e) {  // --help, --version
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    return Fail(e.what());
  }

  std::vector<int> knobs;
  if (!sweep.empty()) {
    std::string err;
    if (!ParseKnobList(sweep, &knobs, &err)) return Fail(err);
  } else {
    if (knob < 0 || knob > 100) return Fail("--knob " + std::to_string(knob) + " is outside 0..100");
    knobs.push_back(knob);
  }

  if (!flash_log_size.empty() || !storage.empty()) {
    ghost::Result<ghost::Trace> trace = ghost::LoadTrace(trace_path);
    if (!trace.ok()) return Fail(trace.status().message());
    ghost::FlashSimOptions o;
    if (!flash_log_size.empty() && !ParseSize(flash_log_size, &o.log_capacity)) {
      return Fail("--flash-log: \"" + flash_log_size + "\" is not a size such as 2M");
    }
    if (!ParseSize(dram_buffer, &o.dram_buffer) || o.dram_buffer <= 64) {
      return Fail("--dram-buffer: \"" + dram_buffer + "\" is not a size such as 256K");
    }
    if (!ParseSize(write_buffer, &o.write_buffer)) {
      return Fail("--write-buffer: \"" + write_buffer + "\" is not a size such as 64K");
    }
    o.policy = *ghost::ParseLogFlushPolicy(flush_policy);
    o.algorithm = *ghost::ParseFlushAlgorithm(flush_alg);
    o.utilisation = utilisation;
    o.cleaning = *ghost::ParseCleaningPolicy(cleaning);
    o.steady_state = steady_state;
    ghost::Result<ghost::DeviceProfile> dev =
        ghost::LoadDeviceProfile(storage.empty() ? "cu140" : storage);
    if (!dev.ok()) return Fail(dev.status().message());
    std::optional<ghost::DeviceProfile> log_dev;
    if (o.log_capacity > 0) {
      ghost::Result<ghost::DeviceProfile> l = ghost::LoadDeviceProfile(log_device);
      if (!l.ok()) return Fail(l.status().message());
      log_dev = *l;
    }
    ghost::Result<ghost::FlashSimResult> r =
        ghost::SimulateFlash(*dev, log_dev ? &*log_dev : nullptr, *trace, o);
    if (!r.ok()) return Fail(r.status().message());
    std::cout << ghost::ToJson(*r, o).dump(pretty ? 2 : -1) << "\n";
    return 0;
  }

  ghost::Result<ghost::MachineProfile> machine = ghost::LoadMachineProfile(profile);
  if (!machine.ok()) return Fail(machine.status().message());
  ghost::Result<ghost::Trace> trace = ghost::LoadTrace(trace_path);
  if (!trace.ok()) return Fail(trace.status().message());

  for (int k : knobs) {
    ghost::SimOptions o;
    o.policy = policy == "static" ? ghost::Policy::kStatic : ghost::Policy::kAdaptive;
    o.knob = k;
    o.ghost_hints = !no_hints;
    o.disk_policy = disk_policy == "experts" ? ghost::DiskPolicyKind::kExperts : ghost::DiskPolicyKind::kStpm;
    ghost::Result<ghost::SimResult> r = ghost::Simulate(*machine, *trace, o);
    if (!r.ok()) return Fail(r.status().message());
    std::cout << ghost::ToJson(*r).dump(pretty ? 2 : -1) << "\n";
    if (!requests_path.empty()) {
      std::ofstream csv(requests_path);
      if (!csv) return Fail("cannot write " + requests_path);
      csv << "start_s,response_ms,source,size,key\n";
      for (const ghost::RequestRecord& q : r->log) {
        csv << ghost::ToSeconds(q.start) << "," << ghost::ToMillis(q.response) << "," << q.source << ","
            << q.size << "," << q.key << "\n";
      }
    }
  }
  return 0;
}
