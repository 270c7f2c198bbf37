// Log: the one logging sink of ghostfs and ghostproxy — lines with a level, written to stderr
// (the foreground), a log file (--log-file) or syslog(3) (a daemon without a log file; journald
// reads syslog), and filtered by a verbosity (--log-level error|warn|info|debug, -v).
//
// What goes in the log (DESIGN §4 "what a user sees"): every origin failure (its URL and the
// reason), every state change a user would ask about (an origin down or up again, a write queue
// flushed and why, a disk spun up and by whom), and the failures of the daemon itself. A line
// is one event; callers do not end it with '\n'.
//
// The sink is process-wide, like syslog(3) itself: a program calls ConfigureLog once in main
// (before its loop and threads start) and then Log from anywhere. A line is formatted and written
// with one write(2) (O_APPEND for a file), so lines of different threads never interleave; the
// configuration must not change while other threads log.
//
// Lines written to stderr or a file look like
//   2026-11-25T15:02:11Z ghostfs[1234] warn: origin web down: GET http://... : connection refused
// (stderr in the foreground: "ghostfs: warn: ..." — the terminal already knows the time).
#ifndef GHOST_COMMON_BASE_LOG_H_
#define GHOST_COMMON_BASE_LOG_H_

#include <string>
#include <string_view>

#include "common/base/status.h"

struct event_base;

namespace ghost {

enum class LogLevel { kError = 0, kWarn = 1, kInfo = 2, kDebug = 3 };

// "error", "warn", "info", "debug".
const char* LogLevelName(LogLevel level);
// The names above ("warning" too), case-sensitive; kInvalidArgument naming them otherwise.
[[nodiscard]] Result<LogLevel> ParseLogLevel(std::string_view text);

enum class LogSink { kStderr, kFile, kSyslog };

struct LogOptions {
  std::string program = "ghost";  // "ghostfs", "ghostproxy": the prefix and the syslog ident
  LogLevel level = LogLevel::kInfo;
  LogSink sink = LogSink::kStderr;
  std::string file;  // kFile: appended to, created 0640 if missing
};

// The options a program's flags ask for: `file` non-empty → kFile; else `daemon` → kSyslog;
// else kStderr. `level_text` empty: kInfo, or kDebug when `verbose` (-v); a level given wins
// over -v. kInvalidArgument for a level that is not one of the names.
[[nodiscard]] Result<LogOptions> ChooseLogOptions(const std::string& program,
                                                  const std::string& file,
                                                  const std::string& level_text, bool verbose,
                                                  bool daemon);

// Sets the process's sink. kFile opens the file now (an error names it and says why); kSyslog
// calls openlog(program, LOG_PID, LOG_DAEMON). Replaces an earlier configuration.
[[nodiscard]] Status ConfigureLog(const LogOptions& options);
// The configuration in force. Before any ConfigureLog: stderr, kWarn.
const LogOptions& CurrentLogOptions();
// Whether a line at `level` would be written (to skip building an expensive message).
bool LogEnabled(LogLevel level);

// Writes one line at `level` if the verbosity lets it through.
void Log(LogLevel level, const char* format, ...) __attribute__((format(printf, 2, 3)));
void LogLine(LogLevel level, std::string_view line);

// Lines written to the file descriptor 2 by code that predates this module (plain fprintf to
// stderr) reach the sink too: for kFile and kSyslog, fd 2 becomes a pipe whose lines `base`'s
// loop reads and logs at kWarn (an event on the pipe, nothing while idle). Call after
// daemonising (which points fd 2 at /dev/null). The pipe's write end is non-blocking: a burst
// larger than the pipe (64 KiB) within one loop turn loses lines rather than blocking the loop
// that drains it. No-op for kStderr. The event lives until the loop is freed.
[[nodiscard]] Status CaptureStderr(event_base* base);

}  // namespace ghost

#endif  // GHOST_COMMON_BASE_LOG_H_
