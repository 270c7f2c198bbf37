// What the test fixtures of real servers (nginx_fixture.h, dovecot_fixture.h) share: a free
// loopback port, starting the server as a child that dies with the test, and waiting until it
// accepts connections or has exited.
#ifndef GHOST_TESTS_COMMON_SERVER_PROCESS_H_
#define GHOST_TESTS_COMMON_SERVER_PROCESS_H_

#include <sys/types.h>

#include <functional>
#include <string>
#include <vector>

#include "common/base/status.h"

namespace ghost {

// The whole file, or "" when it cannot be read.
std::string ReadFile(const std::string& path);

// A port on 127.0.0.1 that nothing listens on right now (the kernel's pick).
[[nodiscard]] Result<int> PickFreePort();

// Whether something accepts a TCP connection on 127.0.0.1:port.
bool Accepts(int port);

// A new directory $TMPDIR/ghost-NAME-XXXXXX (/tmp without TMPDIR); "" on failure (errno set).
std::string MakeTempDir(const std::string& name);

// Starts args[0] (an absolute path) with `args`, stdout and stderr to `out_path` (truncated
// first, or appended to), no other fd inherited, killed when the test process dies.
[[nodiscard]] Result<pid_t> StartChild(std::vector<std::string> args, const std::string& out_path,
                                       bool append = false);

// Waits up to 10 s until every port in `ports` accepts. If the child exits first, *pid becomes
// -1 and the answer is kUnavailable with `log()`; *port_taken says whether the log shows the
// port was taken (the caller may try another). kTimedOut when it never accepted.
[[nodiscard]] Status WaitUntilAccepting(pid_t* pid, const std::vector<int>& ports,
                                        const std::string& name,
                                        const std::function<std::string()>& log, bool* port_taken);

// Sends `sig` and reaps the child, with SIGKILL after 5 s; no-op for pid <= 0. Sets *pid = -1.
void StopChild(pid_t* pid, int sig);

}  // namespace ghost

#endif  // GHOST_TESTS_COMMON_SERVER_PROCESS_H_
