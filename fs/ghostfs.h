// GhostFs: the ghostfs daemon — a FUSE file system (libfuse3 low-level API) that fronts a
// local cache and remote HTTP(S) origins, choosing for every read the cheaper of the cached
// copy and the network (DESIGN §3.4, §4).
//
// One libevent loop runs everything: the FUSE channel, io_uring completions (an eventfd),
// curl's sockets and timers, the emulated devices' timers and the control socket. Requests
// that wait (a fetch, a spin-up, a deferred write's flush) keep their fuse_req_t and are
// answered later from a callback; every request gets exactly one reply.
//
// Namespace:
//   MOUNT/NAME/...   one directory per origin: URL paths as files, HTML directory listings
//                    (nginx, Apache autoindex) as directories; read-only (EROFS)
//   MOUNT/local/...  an ordinary writable tree stored under CACHE/local; writes wait in the
//                    write queue while the (emulated) disk sleeps; fsync makes them durable
//
// Thread-safety: one thread (the loop's) runs every method after Create.
#ifndef GHOST_FS_GHOSTFS_H_
#define GHOST_FS_GHOSTFS_H_

#include <memory>

#include "common/config/config.h"
#include "common/base/status.h"

namespace ghost {

class GhostFs {
 public:
  // Opens the cache, loads the profile, listens on the control socket. Does not mount.
  [[nodiscard]] static Result<std::unique_ptr<GhostFs>> Create(const GhostfsOptions& options);
  virtual ~GhostFs() = default;
  // Mounts, serves until unmounted or signalled (SIGINT, SIGTERM), flushes deferred writes,
  // unmounts. Returns the process exit status.
  virtual int Run() = 0;
};

}  // namespace ghost

#endif  // GHOST_FS_GHOSTFS_H_
