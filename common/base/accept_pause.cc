#include "common/base/accept_pause.h"

#include <event2/event.h>
#include <event2/listener.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

namespace ghost {

AcceptPause::AcceptPause(event_base* base, std::string what, std::chrono::milliseconds pause)
    : base_(base), what_(std::move(what)), pause_(pause) {
  timer_ = evtimer_new(base_, &AcceptPause::OnTimer, this);
}

AcceptPause::~AcceptPause() {
  if (timer_) event_free(timer_);
}

void AcceptPause::Failed(evconnlistener* listener) {
  const int err = EVUTIL_SOCKET_ERROR();
  if (err != EMFILE && err != ENFILE && err != ENOBUFS && err != ENOMEM) return;
  evconnlistener_disable(listener);
  if (std::find(paused_.begin(), paused_.end(), listener) == paused_.end()) paused_.push_back(listener);
  ++pauses_;
  // One line per run of pauses: a run ends when a minute passes without one.
  const auto now = std::chrono::steady_clock::now();
  if (now - last_pause_ > std::chrono::minutes(1)) logged_ = false;
  last_pause_ = now;
  if (!logged_) {
    logged_ = true;
    std::fprintf(stderr,
                 "%s: cannot accept a connection: %s; not accepting for %lld ms at a "
                 "time until descriptors are free (raise `ulimit -n`?)\n",
                 what_.c_str(), std::strerror(err), static_cast<long long>(pause_.count()));
  }
  if (timer_ && !evtimer_pending(timer_, nullptr)) {
    timeval tv{static_cast<time_t>(pause_.count() / 1000),
               static_cast<suseconds_t>((pause_.count() % 1000) * 1000)};
    evtimer_add(timer_, &tv);
  }
}

void AcceptPause::Resume() {
  if (paused_.empty()) return;
  if (timer_) evtimer_del(timer_);
  for (evconnlistener* l : paused_) evconnlistener_enable(l);
  paused_.clear();
}

void AcceptPause::OnTimer(int, short, void* arg) {
  // Still out of descriptors: the pending connection fails again at once and pauses again.
  static_cast<AcceptPause*>(arg)->Resume();
}

}  // namespace ghost
