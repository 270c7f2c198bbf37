#include "common/base/log.h"

#include <event2/event.h>
#include <fcntl.h>
#include <syslog.h>
#include <unistd.h>

#include <cerrno>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <string>

namespace ghost {
namespace {

LogOptions WarnToStderr() {
  LogOptions o;
  o.level = LogLevel::kWarn;
  return o;
}

// The process's sink (log.h: configured once in main, before threads start).
struct Sink {
  // Unconfigured (ghostsim, tests): warnings and errors to stderr.
  LogOptions options = WarnToStderr();
  int fd = 2;  // kStderr: 2; kFile: the file
  bool syslog_open = false;
};

Sink& TheSink() {
  static Sink sink;
  return sink;
}

int SyslogPriority(LogLevel level) {
  switch (level) {
    case LogLevel::kError: return LOG_ERR;
    case LogLevel::kWarn: return LOG_WARNING;
    case LogLevel::kInfo: return LOG_INFO;
    case LogLevel::kDebug: return LOG_DEBUG;
  }
  return LOG_INFO;
}

void WriteAll(int fd, const std::string& s) {
  std::size_t done = 0;
  while (done < s.size()) {
    ssize_t n = ::write(fd, s.data() + done, s.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // nowhere to report a failing log
    done += static_cast<std::size_t>(n);
  }
}

// The captured stderr pipe (CaptureStderr): its read end and the partial line so far.
struct Capture {
  int fd = -1;
  std::string partial;
  event* ev = nullptr;
};

void OnCaptured(evutil_socket_t fd, short, void* arg) {
  auto* c = static_cast<Capture*>(arg);
  char buf[4096];
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    c->partial.append(buf, static_cast<std::size_t>(n));
  }
  std::size_t nl;
  while ((nl = c->partial.find('\n')) != std::string::npos) {
    std::string line = c->partial.substr(0, nl);
    c->partial.erase(0, nl + 1);
    // "ghostfs: x" from the old fprintf calls: the sink adds the program itself.
    const std::string prefix = TheSink().options.program + ": ";
    if (line.starts_with(prefix)) line.erase(0, prefix.size());
    if (!line.empty()) LogLine(LogLevel::kWarn, line);
  }
}

}  // namespace

const char* LogLevelName(LogLevel level) {
  switch (level) {
    case LogLevel::kError: return "error";
    case LogLevel::kWarn: return "warn";
    case LogLevel::kInfo: return "info";
    case LogLevel::kDebug: return "debug";
  }
  return "info";
}

Result<LogLevel> ParseLogLevel(std::string_view text) {
  if (text == "error") return LogLevel::kError;
  if (text == "warn" || text == "warning") return LogLevel::kWarn;
  if (text == "info") return LogLevel::kInfo;
  if (text == "debug") return LogLevel::kDebug;
  return Status::InvalidArgument("log level \"" + std::string(text) +
                                 "\" is not one of error, warn, info, debug");
}

Result<LogOptions> ChooseLogOptions(const std::string& program, const std::string& file,
                                    const std::string& level_text, bool verbose, bool daemon) {
  LogOptions o;
  o.program = program;
  o.level = verbose ? LogLevel::kDebug : LogLevel::kInfo;
  if (!level_text.empty()) {
    Result<LogLevel> l = ParseLogLevel(level_text);
    if (!l.ok()) return l.status();
    o.level = *l;
  }
  o.file = file;
  o.sink = !file.empty() ? LogSink::kFile : daemon ? LogSink::kSyslog : LogSink::kStderr;
  return o;
}

Status ConfigureLog(const LogOptions& options) {
  Sink& s = TheSink();
  int fd = 2;
  if (options.sink == LogSink::kFile) {
    fd = ::open(options.file.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0640);
    if (fd < 0) {
      return Status::FromErrno(errno, "cannot open the log file " + options.file +
                                          " (check the directory exists and is writable)");
    }
  }
  if (s.fd > 2) ::close(s.fd);
  if (s.syslog_open) {
    ::closelog();
    s.syslog_open = false;
  }
  s.options = options;
  s.fd = fd;
  if (options.sink == LogSink::kSyslog) {
    // openlog keeps the pointer: the ident lives in the sink, which lives until exit.
    ::openlog(s.options.program.c_str(), LOG_PID, LOG_DAEMON);
    s.syslog_open = true;
  }
  return Status::Ok();
}

const LogOptions& CurrentLogOptions() { return TheSink().options; }

bool LogEnabled(LogLevel level) { return level <= TheSink().options.level; }

void LogLine(LogLevel level, std::string_view line) {
  if (!LogEnabled(level)) return;
  Sink& s = TheSink();
  if (s.options.sink == LogSink::kSyslog) {
    ::syslog(SyslogPriority(level), "%s: %.*s", LogLevelName(level), static_cast<int>(line.size()),
             line.data());
    return;
  }
  std::string out;
  if (s.options.sink == LogSink::kFile) {
    char when[32];
    std::time_t now = std::time(nullptr);
    std::tm tm{};
    ::gmtime_r(&now, &tm);
    std::strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", &tm);
    out = std::string(when) + " " + s.options.program + "[" + std::to_string(::getpid()) + "] ";
  } else {
    out = s.options.program + ": ";
  }
  out += LogLevelName(level);
  out += ": ";
  out += line;
  out += '\n';
  WriteAll(s.fd, out);
}

void Log(LogLevel level, const char* format, ...) {
  if (!LogEnabled(level)) return;
  va_list ap;
  va_start(ap, format);
  va_list copy;
  va_copy(copy, ap);
  int n = std::vsnprintf(nullptr, 0, format, copy);
  va_end(copy);
  std::string line(n > 0 ? static_cast<std::size_t>(n) : 0, '\0');
  if (n > 0) std::vsnprintf(line.data(), line.size() + 1, format, ap);
  va_end(ap);
  LogLine(level, line);
}

Status CaptureStderr(event_base* base) {
  if (TheSink().options.sink == LogSink::kStderr) return Status::Ok();
  int p[2];
  if (::pipe2(p, O_CLOEXEC | O_NONBLOCK) != 0) return Status::FromErrno(errno, "pipe for stderr");
  if (::dup2(p[1], 2) < 0) {
    int err = errno;
    ::close(p[0]);
    ::close(p[1]);
    return Status::FromErrno(err, "dup2 onto stderr");
  }
  ::close(p[1]);
  static Capture capture;  // one per process, like fd 2
  capture.fd = p[0];
  capture.ev = event_new(base, p[0], EV_READ | EV_PERSIST, &OnCaptured, &capture);
  if (!capture.ev || event_add(capture.ev, nullptr) != 0) return Status::Internal("event for stderr");
  return Status::Ok();
}

}  // namespace ghost
