// GhostfsOptions: every setting of the ghostfs daemon, from the command line or a config file
// (TOML, the same keys), parsed once and passed by const& (after leveldb's options.h).
//
// Config file (all keys optional; the command line wins over the file):
//
//   cache = "/var/cache/ghost"        # cache directory (created if missing)
//   cache_size = "2G"                 # hard byte cap of the cache (K, M, G suffixes)
//   profile = "ipaq-2004"             # emulated devices; absent: devices always ready
//   knob = 50                         # 0 = save energy … 100 = performance
//   policy = "adaptive"               # or "static": the paper's baseline (see Policy)
//   ghost_hints = true                # false: the cost model sends no ghost hints
//   control = "/run/ghost/control.sock"
//   max_stale = 0                     # seconds a stale object may still be served
//   heuristic_freshness = 300         # seconds, when a reply gives no freshness at all
//   write_queue_cap = "4M"            # deferred-write queue cap (DESIGN §3.5)
//   fill_backlog_max = "64M"          # RAM of fills waiting for the store (0: unbounded)
//   cacert = "/etc/ghost/ca.pem"      # CA bundle that https:// and imaps:// servers are
//                                     # verified against (absent: the system's CAs)
//   imap_delete = "move:Trash"        # what unlinking a message does: "move:MAILBOX" (UID
//                                     # MOVE there; created if missing) or "expunge"
//   passthrough = true                # kernel FUSE passthrough for cached bodies
//   flash_log = "/mnt/sd/ghost:16M"   # flash log in front of the disk: DIR[:SIZE]
//   flash_policy = "when-full"        # or "each-spinup": when the log goes to the disk
//   flash_alg = 4                     # NVCache flush algorithm 1..4 (4: sort + merge)
//   [origins]
//   www = "http://127.0.0.1:8080/"
//   mail = { url = "imaps://me@mail.example:993/", password_file = "/etc/ghost/mail.pass" }
//
// An IMAP origin (imap:// or imaps://, fs/mail_tree.cc) needs a password: `password_file`
// (its first line), or `password` in the config file, or `--password-file NAME=PATH`. A
// password is never taken from the command line, where other users can read it (ps).
//
// Thread-safety: plain values; the parsers are reentrant.
#ifndef GHOST_COMMON_CONFIG_CONFIG_H_
#define GHOST_COMMON_CONFIG_CONFIG_H_

#include <string>
#include <vector>

#include "common/base/status.h"
#include "common/base/units.h"
#include "common/power/machine.h"

namespace ghost {

struct Origin {
  std::string name;  // the top-level directory: [A-Za-z0-9._-]+, not "local", not "." / ".."
  std::string url;   // http://, https://, imap:// or imaps://, ending in '/'
  // IMAP origins only: where the password is (file: its first line), or the password itself
  // (config file only).
  std::string password_file;
  std::string password;
  bool imap() const { return url.starts_with("imap://") || url.starts_with("imaps://"); }
};

struct GhostfsOptions {
  std::string cache_dir;
  Bytes cache_size = 0;  // 0 = unlimited
  std::vector<Origin> origins;
  std::string profile;   // empty: an ideal machine whose devices are always ready
  int knob = 50;
  // How the daemon manages its cache and devices, with the meanings ghostsim gives them
  // (common/power/machine.h, common/cache/cache_manager.h; DESIGN §7), so a live run can be
  // compared with a simulated one. kStatic or kAdaptive (ParsePolicy).
  Policy policy = Policy::kAdaptive;
  bool ghost_hints = true;   // adaptive only: static sends none
  std::string control_path;  // empty: MountControlPath(mountpoint) (common/control/control.h)
  Duration max_stale{0};
  Duration heuristic_freshness = std::chrono::seconds(300);
  // An origin that sends nothing for this long (connecting included) fails the fetch: a
  // reader then gets the cached copy if there is one (stale-if-error, logged), else an error.
  // Zero disables stall detection (only for tests).
  Duration stall_timeout = std::chrono::seconds(10);
  Bytes write_queue_cap = 4 * 1024 * 1024;
  // RAM the fills waiting for the cache store may hold before the proxy's stores are answered
  // later (fs/write_back.h); 0: no bound.
  Bytes fill_backlog_max = 64 * 1024 * 1024;
  // PEM file of the CAs that TLS servers (https://, imaps://, STARTTLS) must be signed by;
  // empty: the system's default CA store.
  std::string cacert;
  // Unlink of a message in an IMAP Maildir: "move:MAILBOX" moves it to MAILBOX (UTF-8 name,
  // hierarchy written with the server's delimiter; created if missing; an unlink inside that
  // mailbox expunges), "expunge" removes it for good. The default keeps it recoverable, as
  // mail clients do.
  std::string imap_delete = "move:Trash";
  bool foreground = false;
  std::string mountpoint;
  std::vector<std::string> fuse_options;  // the -o options, passed to libfuse
  // Kernel FUSE passthrough for opens of fully cached bodies (fs/fuse_passthrough.h); off
  // with --profile, whose emulated disk must see every read.
  bool passthrough = true;
  // The machine's own devices (common/power/hardware.h): "none" (the model only) or "auto"
  // (the disk under the cache directory and the link to the origins follow the model; the
  // battery and RAPL are metered). A disk is managed only when named in `manage_disk`, and
  // never the one holding / unless `force_manage_disk`.
  std::string devices = "none";
  std::string manage_disk;
  bool force_manage_disk = false;
  // Where the log goes (common/base/log.h): a file, else stderr in the foreground and syslog
  // (journald) when daemonised; and how much of it (log_level "error" | "warn" | "info" |
  // "debug"; empty: info).
  std::string log_file;
  std::string log_level;
  // The flash log in front of the disk (fs/flash_local.h, DESIGN §3.5): "DIR[:SIZE]", empty
  // for none; its flush policy ("each-spinup" | "when-full") and algorithm (1..4, NVCache).
  std::string flash_log;
  std::string flash_policy = "when-full";
  int flash_alg = 4;
  // The flash log's device profile (common/profiles/): reads served from the log are charged
  // to it (Machine::AddFlash) when a machine profile is given.
  std::string flash_device = "sd-card";
};

// "NAME=URL" → Origin, validated (name and URL rules above).
[[nodiscard]] Result<Origin> ParseOrigin(const std::string& spec);
// "NAME=PATH" (--password-file): sets the password file of IMAP origin NAME in `options`.
[[nodiscard]] Status ApplyPasswordFile(const std::string& spec, GhostfsOptions* options);
// The password of IMAP origin `o`: its `password`, else the first line of its password file.
[[nodiscard]] Result<std::string> ReadOriginPassword(const Origin& o);
// "move:MAILBOX" or "expunge" (imap_delete): the trash mailbox's UTF-8 name, or "" for
// expunge. Fails (kInvalidArgument, saying what is accepted) on anything else.
[[nodiscard]] Result<std::string> ParseImapDelete(const std::string& text);
// "4096", "64K", "2M", "1G" (binary multiples) → bytes.
[[nodiscard]] Result<Bytes> ParseSize(const std::string& text);
// Reads a config file into `options` (keys present in the file overwrite the fields).
// Errors name the file and line.
[[nodiscard]] Status LoadConfigFile(const std::string& path, GhostfsOptions* options);
// Checks the combination: a cache dir, at least one origin or none (local only is fine),
// unique origin names, knob in 0..100.
[[nodiscard]] Status Validate(const GhostfsOptions& options);

}  // namespace ghost

#endif  // GHOST_COMMON_CONFIG_CONFIG_H_
