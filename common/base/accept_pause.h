// AcceptPause: a listener out of file descriptors stops accepting for a moment instead of
// spinning. Used by ghostproxy's HTTP, IMAP and SMTP listeners and by the control socket.
//
// accept() failing with EMFILE or ENFILE (or ENOBUFS, ENOMEM) leaves the connection pending, so
// the listening socket is readable again at once: libevent calls accept again, and without an
// error callback logs "Error from accept() call" each time. Under a low `ulimit -n` the IMAP and
// SMTP listeners used 1-3 CPU-seconds and wrote 15-37 MB of that line per 3 s (round 20,
// helper adv20) for as long as the descriptors stayed taken; the HTTP one, which paused only
// while it had connections of its own, spun silently. Here the listener is disabled for `pause`
// (a timer enables it again: descriptors taken by another part of the process free no slot this
// listener would be told about), and the first pause of a run of them is logged once.
//
// Thread-safety: the loop's thread only.
#ifndef GHOST_COMMON_BASE_ACCEPT_PAUSE_H_
#define GHOST_COMMON_BASE_ACCEPT_PAUSE_H_

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

struct event;
struct event_base;
struct evconnlistener;

namespace ghost {

class AcceptPause {
 public:
  // `what` names the listener in the log ("ghostproxy: imap", "ghostfs: control socket").
  AcceptPause(event_base* base, std::string what,
              std::chrono::milliseconds pause = std::chrono::milliseconds(100));
  ~AcceptPause();
  AcceptPause(const AcceptPause&) = delete;
  AcceptPause& operator=(const AcceptPause&) = delete;

  // Called from the listener's error callback (evconnlistener_set_error_cb; libevent hands that
  // callback the listener's own argument, so the owner forwards it here). Pauses `listener` when
  // the error (errno) is a lack of descriptors or memory; other errors concern one connection.
  // A paused listener must not be freed before this object (the owner frees this first).
  void Failed(evconnlistener* listener);
  // A connection of the owner closed: a slot is free, accept again now.
  void Resume();

  std::uint64_t pauses() const { return pauses_; }

 private:
  static void OnTimer(int, short, void* arg);

  event_base* base_;
  std::string what_;
  std::chrono::milliseconds pause_;
  event* timer_ = nullptr;
  std::vector<evconnlistener*> paused_;
  std::uint64_t pauses_ = 0;
  bool logged_ = false;  // this run of pauses was logged
  std::chrono::steady_clock::time_point last_pause_{};
};

}  // namespace ghost

#endif  // GHOST_COMMON_BASE_ACCEPT_PAUSE_H_
