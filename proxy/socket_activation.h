// Socket activation: the listening socket systemd (or any supervisor speaking the same
// protocol, sd_listen_fds(3)) passes to a service it starts on the first connection.
//
// The protocol: the supervisor binds and listens, then starts the program with the socket as
// fd 3 (SD_LISTEN_FDS_START) and sets LISTEN_PID to the program's pid and LISTEN_FDS to the
// number of sockets passed. ghostproxy takes exactly one. Not thread-safe (reads and clears
// the environment): call once, at the start of main().
#pragma once

#include "common/base/status.h"

namespace ghost {

// The first fd passed by sd_listen_fds(3)'s protocol.
inline constexpr int kFirstListenFd = 3;

// Returns the inherited listening socket (fd 3) when LISTEN_PID is this process and LISTEN_FDS
// is 1, or -1 when nothing was passed (LISTEN_FDS unset, or LISTEN_PID names another process).
// Fails when LISTEN_FDS is not a number or passes more than one socket, or fd 3 is not a
// listening stream socket. Clears LISTEN_PID, LISTEN_FDS and LISTEN_FDNAMES in every case so
// that children do not inherit them. The fd gets close-on-exec.
[[nodiscard]] Result<int> TakeInheritedListenSocket();

}  // namespace ghost
