#include "proxy/socket_activation.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <string>

namespace ghost {
namespace {

// Parses a decimal number that is the whole of `text`; -1 for anything else.
long ParseCount(const char* text) {
  if (text == nullptr || *text == '\0') return -1;
  char* end = nullptr;
  errno = 0;
  const long v = std::strtol(text, &end, 10);
  if (errno != 0 || *end != '\0' || v < 0) return -1;
  return v;
}

}  // namespace

Result<int> TakeInheritedListenSocket() {
  const char* pid_text = std::getenv("LISTEN_PID");
  const char* fds_text = std::getenv("LISTEN_FDS");
  const long pid = ParseCount(pid_text);
  const long fds = ParseCount(fds_text);
  const bool for_us = fds_text != nullptr && pid == static_cast<long>(getpid());
  unsetenv("LISTEN_PID");
  unsetenv("LISTEN_FDS");
  unsetenv("LISTEN_FDNAMES");
  if (!for_us) return -1;
  if (fds < 0) {
    return Status::InvalidArgument("LISTEN_FDS=\"" + std::string(fds_text) + "\" is not a number");
  }
  if (fds == 0) return -1;
  if (fds > 1) {
    return Status::InvalidArgument("socket activation passed " + std::to_string(fds) +
                                   " sockets; ghostproxy listens on one (one ListenStream= in "
                                   "the .socket unit)");
  }
  const int fd = kFirstListenFd;
  int type = 0, listening = 0;
  socklen_t len = sizeof type;
  if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) != 0) {
    return Status::FromErrno(errno, "socket activation: fd 3 is not a socket");
  }
  len = sizeof listening;
  if (type != SOCK_STREAM || getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &len) != 0 ||
      !listening) {
    return Status::InvalidArgument(
        "socket activation: fd 3 is not a listening stream socket (ListenStream= in the "
        ".socket unit)");
  }
  fcntl(fd, F_SETFD, FD_CLOEXEC);
  return fd;
}

}  // namespace ghost
