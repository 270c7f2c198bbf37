#include "common/http/origin_health.h"

#include <cerrno>

#include "common/base/log.h"

namespace ghost {

int OriginErrno(const Status& transport, int http_status) {
  if (http_status == 404 || http_status == 410) return ENOENT;
  if (http_status == 401 || http_status == 403) return EACCES;
  if (http_status >= 400) return EIO;
  if (transport.ok()) return EIO;
  if (IsLocalResourceErrno(transport.ToErrno())) return transport.ToErrno();
  switch (transport.code()) {
    case Status::Code::kUnavailable: {
      int e = transport.ToErrno();
      return e == ENOTCONN ? EHOSTUNREACH : e;  // no errno recorded: nothing reached it
    }
    case Status::Code::kTimedOut: return ETIMEDOUT;
    case Status::Code::kNotFound: return ENOENT;
    case Status::Code::kPermissionDenied: return EACCES;
    default: return EIO;
  }
}

Status OriginHttpStatus(const std::string& url, int http_status) {
  std::string what = url + ": HTTP " + std::to_string(http_status);
  switch (OriginErrno(Status::Ok(), http_status)) {
    case ENOENT: return Status::NotFound(what);
    case EACCES: return Status::PermissionDenied(what + " (the origin refuses access)");
    default: return Status::IoError(what);
  }
}

const char* ErrnoName(int err) {
  switch (err) {
    case ENOENT: return "ENOENT";
    case EACCES: return "EACCES";
    case EIO: return "EIO";
    case EHOSTUNREACH: return "EHOSTUNREACH";
    case ENETUNREACH: return "ENETUNREACH";
    case ECONNREFUSED: return "ECONNREFUSED";
    case ETIMEDOUT: return "ETIMEDOUT";
    case ENOTCONN: return "ENOTCONN";
    case EMFILE: return "EMFILE";
    case ENFILE: return "ENFILE";
    default: return "errno";
  }
}

OriginHealth::OriginHealth(Clock& clock, std::vector<Origin> origins) : clock_(clock) {
  for (Origin& o : origins) {
    Entry e;
    e.origin = std::move(o);
    e.since = clock_.Now();
    entries_.push_back(std::move(e));
  }
}

OriginHealth::Entry* OriginHealth::Find(const std::string& url) {
  Entry* best = nullptr;
  for (Entry& e : entries_) {
    const std::string& base = e.origin.url;
    // "http://h/a" is the base of "http://h/a/x" and of itself, not of "http://h/ab".
    std::string dir = base.ends_with("/") ? base : base + "/";
    bool match = url == base || url.starts_with(dir) || dir == url + "/";
    if (match && (!best || base.size() > best->origin.url.size())) best = &e;
  }
  return best;
}

void OriginHealth::Record(const std::string& method, const std::string& url, int http_status,
                          const Status& status) {
  const bool answered = http_status > 0;
  const bool failed = answered ? http_status >= 400 : !status.ok();
  int err = failed ? OriginErrno(answered ? Status::Ok() : status, http_status) : 0;
  // The transport's message names the request already ("GET http://...: reason").
  std::string reason = answered ? "HTTP " + std::to_string(http_status) : status.message();
  std::string line = answered ? method + " " + url + ": " + reason : reason;
  // A 404 is an ordinary answer (a lookup of a name the origin lacks): info, not a warning.
  LogLevel level = http_status == 404 || http_status == 410 ? LogLevel::kInfo : LogLevel::kWarn;
  Outcome(Find(url), answered, failed, err, url, reason, line, level);
}

void OriginHealth::RecordImap(const std::string& url, bool answered, const Status& status) {
  const bool failed = !status.ok();
  int err = failed ? (answered ? EACCES : OriginErrno(status, 0)) : 0;
  std::string reason = status.message();
  std::string line = "IMAP " + url + ": " + (answered ? "login refused: " : "") + reason;
  Outcome(Find(url), answered, failed, err, url, reason, line, LogLevel::kWarn);
}

void OriginHealth::Outcome(Entry* e, bool answered, bool failed, int err, const std::string& url,
                           const std::string& reason, const std::string& line, LogLevel level) {
  if (e) ++e->fetches;
  if (failed) {
    Log(level, "origin %s: %s (readers get %s)", e ? e->origin.name.c_str() : "?", line.c_str(),
        ErrnoName(err));
    if (e) {
      ++e->failures;
      e->has_failure = true;
      e->last_url = url;
      e->last_reason = reason;
      e->last_errno = err;
      e->last_failure_at = clock_.Now();
    }
  }
  if (!e) return;
  State next = e->state;
  if (answered) {
    next = State::kUp;
  } else if (failed && !IsLocalResourceErrno(err)) {  // out of descriptors here: not the origin's doing
    next = State::kDown;
  }
  if (next == e->state) return;
  State before = e->state;
  e->state = next;
  e->since = clock_.Now();
  if (next == State::kDown) {
    Log(LogLevel::kError, "origin %s (%s) down; cached copies are served, other reads fail",
        e->origin.name.c_str(), e->origin.url.c_str());
  } else if (before == State::kDown) {
    Log(LogLevel::kInfo, "origin %s (%s) up again", e->origin.name.c_str(),
        e->origin.url.c_str());
  }
  if (on_change) on_change(e->origin.name, next);
}

OriginHealth::State OriginHealth::state(const std::string& name) const {
  for (const Entry& e : entries_) {
    if (e.origin.name == name) return e.state;
  }
  return State::kUnknown;
}

const char* OriginHealth::StateName(State s) {
  switch (s) {
    case State::kUnknown: return "unknown";
    case State::kUp: return "up";
    case State::kDown: return "down";
  }
  return "unknown";
}

nlohmann::json OriginHealth::ToJson() const {
  nlohmann::json out = nlohmann::json::object();
  TimePoint now = clock_.Now();
  for (const Entry& e : entries_) {
    nlohmann::json last = nullptr;
    if (e.has_failure) {
      last = {{"url", e.last_url},
              {"reason", e.last_reason},
              {"errno", ErrnoName(e.last_errno)},
              {"ago_s", ToSeconds(now - e.last_failure_at)}};
    }
    out[e.origin.name] = {{"url", e.origin.url},
                          {"state", StateName(e.state)},
                          {"for_s", ToSeconds(now - e.since)},
                          {"fetches", e.fetches},
                          {"failures", e.failures},
                          {"last_failure", last}};
  }
  return out;
}

}  // namespace ghost
