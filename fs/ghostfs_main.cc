// ghostfs: mounts the energy-aware caching file system. See `ghostfs --help`.
//
// Exit codes: 0 clean unmount, 1 runtime failure (mount, cache, the cache directory in use by
// another ghostfs, a mount point that already is a FUSE mount), 2 bad options or config.
#include <CLI/CLI.hpp>
#include <sys/resource.h>

#include <cstdio>
#include <iostream>

#include "common/base/log.h"
#include "common/build_info.h"
#include "common/config/config.h"
#include "common/control/control.h"
#include "common/control/protocol.h"
#include "common/power/profile.h"
#include "fs/ghostfs.h"
#include "fs/mount_args.h"

namespace {

// Every local/ inode the kernel holds keeps an O_PATH descriptor (fs/inode_table.h), and the
// kernel forgets inodes only under memory pressure: a directory of 100k entries needs 100k
// descriptors. The soft limit goes up to the hard one, and both up to fs.nr_open when the
// process may (root). Returns the limit in force.
rlim_t RaiseFdLimit() {
  rlimit rl{};
  if (getrlimit(RLIMIT_NOFILE, &rl) != 0) return 0;
  rlim_t most = rl.rlim_max;
  if (FILE* f = std::fopen("/proc/sys/fs/nr_open", "r")) {
    unsigned long long n = 0;
    if (std::fscanf(f, "%llu", &n) == 1 && n > most) most = static_cast<rlim_t>(n);
    std::fclose(f);
  }
  for (rlim_t limit : {most, rl.rlim_max}) {
    rlimit up{limit, std::max(limit, rl.rlim_max)};
    if (limit >= rl.rlim_cur && setrlimit(RLIMIT_NOFILE, &up) == 0) return limit;
  }
  return rl.rlim_cur;
}

}  // namespace

int main(int argc, char** argv) {
  ghost::GhostfsOptions o;
  std::vector<std::string> origins, password_files;
  std::string stall_timeout;
  std::string config, cache_size, fill_backlog_max, max_stale, knob_text, cacert, imap_delete, policy_text;
  bool no_ghost_hints = false;
  std::string log_file, log_level;
  bool verbose = false;
  CLI::App app{
      "ghostfs: an energy-aware caching file system over HTTP(S) and IMAP origins.\n\n"
      "Each origin appears as MOUNTPOINT/NAME/ (URL paths as files, HTML directory listings as\n"
      "directories, read-only; an imap:// or imaps:// origin as a Maildir); MOUNTPOINT/local/ is\n"
      "an ordinary writable tree kept in the cache\n"
      "directory. For every read, ghostfs picks the cached copy or the network, whichever costs\n"
      "less given the devices' power modes and the knob (common/DESIGN.md §3.4)."};
  app.set_version_flag("--version", std::string("ghostfs ") + GHOST_VERSION,
                       "print the version and exit");
  app.add_flag("-f,--foreground", o.foreground, "stay in the foreground (log to stderr)");
  app.add_option("--cache", o.cache_dir, "cache directory (created if missing); holds objects, the index and local/");
  app.add_option("--origin", origins,
                 "NAME=URL of an HTTP(S) origin, or an IMAP server imap[s]://USER@HOST:PORT/ (shown as "
                 "a Maildir), as MOUNTPOINT/NAME (repeatable)");
  app.add_option("--password-file", password_files,
                 "NAME=PATH: the password of IMAP origin NAME is the first line of PATH (repeatable; "
                 "a password is never taken from the command line)");
  app.add_option("--profile", o.profile,
                 "emulate the devices of this profile (a name from " + ghost::DefaultProfileDir() +
                     " or a .toml file): power modes, spin-up and beacon delays, energy. Without it the "
                     "devices are always ready and nothing is injected");
  app.add_option("--knob", knob_text, "0 saves energy … 100 favours performance (default 50)");
  app.add_option(
      "--policy", policy_text,
      "adaptive (default): the cost model picks disk or network for each read, STPM runs the "
      "devices at the knob, cache fills wait while the disk sleeps; static: the paper's "
      "baseline cache, which reads the cached copy whenever there is one, leaves the devices "
      "to their default power management (disk: low-power idle after 0.5 s, standby after "
      "10 s; card: PSM, CAM while transfers come < 200 ms apart) and writes every fetched "
      "object to the disk at once. Same meanings as ghostsim --policy (common/DESIGN.md §7)");
  app.add_flag(
      "--no-ghost-hints", no_ghost_hints,
      "adaptive policy: choose sources by cost but never send the ideal device a ghost hint");
  app.add_option("--control", o.control_path,
                 "Unix socket for ghostctl and ghostproxy (mode 0600). Default: a path derived from "
                 "the mount point (" + ghost::ControlRunDir() + "/NAME-HASH.sock), which "
                 "`ghostctl --mount MOUNTPOINT` and `ghostproxy --mount MOUNTPOINT` find on their own");
  app.add_option("--log-file", log_file,
                 "append the log here (default: stderr with -f, else syslog, which journald reads)");
  app.add_option("--log-level", log_level,
                 "error, warn, info (default) or debug: origin failures and state changes are "
                 "info and above");
  app.add_flag("-v,--verbose", verbose, "log at debug level (as --log-level debug)");
  app.add_option("--config", config, "TOML file with the same settings (see common/config/config.h); the command line wins");
  app.add_option("--cache-size", cache_size, "hard cap of the cache in bytes (K, M, G suffixes); LRU eviction");
  app.add_option("--fill-backlog-max", fill_backlog_max,
                 "RAM the fills waiting for the cache may hold before stores wait (K, M, G; default 64M, 0: no bound)");
  app.add_option("--max-stale", max_stale, "seconds past expiry that a cached copy is still served without revalidation");
  app.add_option("--stall-timeout", stall_timeout,
                 "seconds an origin may send nothing before its fetch fails and a stale cached copy is "
                 "served instead (default 10; 0 disables)");
  app.add_option(
      "--cacert", cacert,
      "PEM file of the CAs that https:// and imaps:// servers must be signed by (default: the "
      "system's CAs)");
  app.add_option(
      "--imap-delete", imap_delete,
      "what unlinking a message in an IMAP Maildir does: move:MAILBOX (UID MOVE there, created "
      "if missing; the default is move:Trash) or expunge");
  std::string devices_text;
  app.add_option(
      "--devices", devices_text,
      "none (default): only the model's devices. auto: the machine's own devices follow the "
      "model: the disk under --cache (ATA: CHECK POWER MODE, STANDBY/IDLE IMMEDIATE as hdparm; "
      "SSD/NVMe reported only), the Wi-Fi card carrying the route to the first origin (nl80211 "
      "power save, restored on exit), the battery and RAPL as energy meters; without --profile "
      "the model is laptop-2024 (laptop-hdd, wifi-ac). See `ghostctl devices`");
  bool force_manage_disk = false;
  app.add_option("--manage-disk", o.manage_disk,
                 "with --devices auto: let STPM spin this disk (/dev/sdX, the one under --cache) "
                 "down and up; without it the disk is only read");
  app.add_flag("--force-manage-disk", force_manage_disk,
               "allow --manage-disk on the disk that holds / (its spin-ups stall the whole system)");
  std::string flash_log, flash_policy, flash_alg, flash_device;
  app.add_option("--flash-log", flash_log,
                 "DIR[:SIZE]: a durable log on a flash device (SD card, USB stick, NVMe) in front "
                 "of the disk: while the disk sleeps, local/ writes and their fsyncs go there instead "
                 "of waking it (SIZE default 16M). A read-only DIR stops ghostfs at start; a write the "
                 "log cannot take (device full or failing) goes to the disk instead, with a warning");
  app.add_option("--flash-policy", flash_policy,
                 "when the flash log goes to the disk: when-full (default: only when it is full) or "
                 "each-spinup (also whenever the disk spins up)");
  app.add_option("--flash-alg", flash_alg,
                 "the flash log's flush algorithm (NVCache): 1 one record at a time, 2 chunked reads, "
                 "3 two buffers, 4 two buffers + sort and merge (default)");
  app.add_option("--flash-device", flash_device,
                 "the flash log's device profile (default sd-card): with --profile, reads served from "
                 "the log are charged to it, and the stats show its energy");
  bool no_passthrough = false;
  app.add_flag(
      "--no-passthrough", no_passthrough,
      "serve every read of a cached body through the daemon, without kernel FUSE passthrough "
      "(passthrough, Linux >= 6.9, is also off with --profile: the emulated disk must see every "
      "read)");
  app.add_option("-o", o.fuse_options,
                 "FUSE mount options (e.g. -o allow_other), repeatable; also any setting above as "
                 "KEY=VALUE (cache=DIR,origin=NAME=URL,profile=..., as in the config file), the "
                 "form mount(8) uses for an fstab line of type fuse.ghostfs");
  app.add_option("MOUNTPOINT", o.mountpoint,
                 "where to mount (mount(8) form: SOURCE MOUNTPOINT, SOURCE a config file if it "
                 "contains a '/', else a label)")->required();
  // mount.fuse3's form (fstab): ghostfs SOURCE MOUNTPOINT -o cache=...,origin=...,nodev,...
  std::vector<std::string> value_options;
  for (const CLI::Option* opt : app.get_options()) {
    if (opt->get_expected_max() > 0) {  // takes a value (flags expect none)
      for (const std::string& n : opt->get_lnames()) value_options.push_back("--" + n);
      for (const std::string& n : opt->get_snames()) value_options.push_back("-" + n);
    }
  }
  const std::vector<std::string> args =
      ghost::RewriteMountArgs(std::vector<std::string>(argv, argv + argc), value_options);
  std::vector<std::string> long_options;
  for (const CLI::Option* opt : app.get_options()) {
    for (const std::string& n : opt->get_lnames()) long_options.push_back("--" + n);
  }
  if (std::string unknown = ghost::UnknownLongOption(args, long_options); !unknown.empty()) {
    std::fprintf(stderr, "ghostfs: %s (see --help)\n", unknown.c_str());
    return 2;
  }
  std::vector<const char*> arg_ptrs;
  for (const std::string& a : args) arg_ptrs.push_back(a.c_str());
  try {
    app.parse(static_cast<int>(arg_ptrs.size()), arg_ptrs.data());
  } catch (const CLI::Success& e) {  // --help, --version
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "ghostfs: %s (see --help)\n", e.what());
    return 2;
  }
  auto fail = [](const std::string& msg) {
    std::fprintf(stderr, "ghostfs: %s\n", msg.c_str());
    return 2;
  };
  // The file first, then the command line over it.
  if (!config.empty()) {
    ghost::GhostfsOptions file;
    if (ghost::Status s = ghost::LoadConfigFile(config, &file); !s.ok()) return fail(s.message());
    if (o.cache_dir.empty()) o.cache_dir = file.cache_dir;
    if (o.profile.empty()) o.profile = file.profile;
    if (o.control_path.empty()) o.control_path = file.control_path;
    if (knob_text.empty()) o.knob = file.knob;
    if (policy_text.empty()) o.policy = file.policy;
    o.ghost_hints = file.ghost_hints;
    if (cache_size.empty()) o.cache_size = file.cache_size;
    if (max_stale.empty()) o.max_stale = file.max_stale;
    o.heuristic_freshness = file.heuristic_freshness;
    if (stall_timeout.empty()) o.stall_timeout = file.stall_timeout;
    o.write_queue_cap = file.write_queue_cap;
    if (fill_backlog_max.empty()) o.fill_backlog_max = file.fill_backlog_max;
    o.cacert = file.cacert;
    o.imap_delete = file.imap_delete;
    o.passthrough = file.passthrough;
    if (devices_text.empty()) o.devices = file.devices;
    if (o.manage_disk.empty()) o.manage_disk = file.manage_disk;
    if (file.force_manage_disk) o.force_manage_disk = true;
    o.origins = file.origins;
    if (log_file.empty()) log_file = file.log_file;
    if (log_level.empty()) log_level = file.log_level;
    if (flash_log.empty()) o.flash_log = file.flash_log;
    if (flash_policy.empty()) o.flash_policy = file.flash_policy;
    if (flash_alg.empty()) o.flash_alg = file.flash_alg;
    if (flash_device.empty()) o.flash_device = file.flash_device;
  }
  if (!flash_device.empty()) o.flash_device = flash_device;
  if (!flash_log.empty()) o.flash_log = flash_log;
  if (!flash_policy.empty()) {
    if (flash_policy != "each-spinup" && flash_policy != "when-full") {
      return fail("--flash-policy \"" + flash_policy + "\" is neither \"each-spinup\" nor \"when-full\"");
    }
    o.flash_policy = flash_policy;
  }
  if (!flash_alg.empty()) {
    if (flash_alg.size() != 1 || flash_alg[0] < '1' || flash_alg[0] > '4') {
      return fail("--flash-alg \"" + flash_alg + "\" is not 1, 2, 3 or 4");
    }
    o.flash_alg = flash_alg[0] - '0';
  }
  if (no_passthrough) o.passthrough = false;
  if (!devices_text.empty()) {
    if (devices_text != "auto" && devices_text != "none") {
      return fail("--devices \"" + devices_text + "\" is neither \"auto\" nor \"none\"");
    }
    o.devices = devices_text;
  }
  if (force_manage_disk) o.force_manage_disk = true;
  if (!o.manage_disk.empty() && o.devices != "auto") return fail("--manage-disk needs --devices auto");
  // Real devices need a model with real numbers: the shipped laptop unless one is named.
  if (o.devices == "auto" && o.profile.empty()) o.profile = "laptop-2024";
  if (!cacert.empty()) o.cacert = cacert;
  if (!imap_delete.empty()) {
    if (ghost::Result<std::string> d = ghost::ParseImapDelete(imap_delete); !d.ok()) {
      return fail("--imap-delete: " + d.status().message());
    }
    o.imap_delete = imap_delete;
  }
  for (const std::string& spec : origins) {
    ghost::Result<ghost::Origin> origin = ghost::ParseOrigin(spec);
    if (!origin.ok()) return fail(origin.status().message());
    o.origins.push_back(*origin);
  }
  for (const std::string& spec : password_files) {
    if (ghost::Status s = ghost::ApplyPasswordFile(spec, &o); !s.ok()) return fail(s.message());
  }
  if (!knob_text.empty()) {
    ghost::Result<int> k = ghost::ParseKnobText(knob_text);  // the control protocol's range
    if (!k.ok()) return fail("--knob " + k.status().message());
    o.knob = *k;
  }
  if (!policy_text.empty()) {
    ghost::Result<ghost::Policy> p = ghost::ParsePolicy(policy_text);
    if (!p.ok()) return fail("--policy: " + p.status().message());
    o.policy = *p;
  }
  if (no_ghost_hints) o.ghost_hints = false;
  if (!cache_size.empty()) {
    ghost::Result<ghost::Bytes> b = ghost::ParseSize(cache_size);
    if (!b.ok()) return fail("--cache-size: " + b.status().message());
    o.cache_size = *b;
  }
  if (!fill_backlog_max.empty()) {
    ghost::Result<ghost::Bytes> b = ghost::ParseSize(fill_backlog_max);
    if (!b.ok()) return fail("--fill-backlog-max: " + b.status().message());
    o.fill_backlog_max = *b;
  }
  if (!max_stale.empty()) {
    try {
      double s = std::stod(max_stale);
      if (!ghost::IsUserSeconds(s)) throw std::invalid_argument(max_stale);
      o.max_stale = ghost::Seconds(s);
    } catch (...) {
      return fail("--max-stale \"" + max_stale + "\" is not a number of seconds in 0..1e9");
    }
  }
  if (!stall_timeout.empty()) {
    try {
      double s = std::stod(stall_timeout);
      if (!ghost::IsUserSeconds(s)) throw std::invalid_argument(stall_timeout);
      o.stall_timeout = ghost::Seconds(s);
    } catch (...) {
      return fail("--stall-timeout \"" + stall_timeout + "\" is not a number of seconds in 0..1e9");
    }
  }
  ghost::Result<ghost::LogOptions> log =
      ghost::ChooseLogOptions("ghostfs", log_file, log_level, verbose, !o.foreground);
  if (!log.ok()) return fail("--log-level: " + log.status().message());
  if (ghost::Status s = ghost::ConfigureLog(*log); !s.ok()) return fail(s.message());
  o.log_file = log_file;
  o.log_level = ghost::LogLevelName(log->level);
  ghost::Log(ghost::LogLevel::kDebug, "up to %llu open descriptors", static_cast<unsigned long long>(RaiseFdLimit()));
  ghost::Result<std::unique_ptr<ghost::GhostFs>> fs = ghost::GhostFs::Create(o);
  if (!fs.ok()) {
    std::fprintf(stderr, "ghostfs: %s\n", fs.status().message().c_str());
    return fs.status().code() == ghost::Status::Code::kInvalidArgument ||
                   fs.status().code() == ghost::Status::Code::kNotFound
               ? 2
               : 1;
  }
  return (*fs)->Run();
}
