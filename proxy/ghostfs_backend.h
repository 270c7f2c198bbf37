// GhostfsBackend: ghostproxy's cache is the running ghostfs daemon's (DESIGN §3.4, §4).
//
// How the two processes share one cache (the daemon's side is fs/store_tree.cc):
//   - The daemon owns everything that persists or costs energy: the sqlite index, the bodies,
//     the byte cap, the write queue, the emulated devices and the cost model.
//   - The proxy asks over the control socket (common/control/control.h, AsyncControlClient): "lookup"
//     returns whether a key is cached, its stored response head and the cost model's choice
//     (the daemon sends the disk a ghost hint when the network wins); "store", "refresh" and
//     "invalidate" change it; "hint" discloses the proxy's own network transfers.
//   - Bodies move through the mount: a lookup names one version of a body (its "version":
//     d<inode>-<size> for a body file, q<n> for a fill still in the write queue) and
//     MOUNTPOINT/.ghost/objects/<hash>@<version> (or the body file itself), which is opened
//     when the answer arrives and read by every slice of that exchange (CacheLookup::body), so
//     a replacement meanwhile never mixes two versions in one response; a version gone before
//     the open is looked up again. Read here
//     with io_uring (common/base/uring_file_io.h) so a disk spin-up never stalls the proxy's loop;
//     a store names MOUNTPOINT/.ghost/fill/<token>, written the same way and closed to hand
//     the fill to the daemon's deferred write queue (a sleeping disk stays asleep). A fill
//     abandoned (its client went away) is unlinked at once and closed once no write names its
//     fd any more (common/base/file_io.h: the io_uring submitter may enter the kernel later).
//   - Objects ghostfs fetched itself (through its origins) have no stored head; the proxy is
//     given one made from what the index knows (status 200, Content-Type, ETag,
//     Last-Modified), so a page read through the mount is a proxy hit too.
// Opening a .ghost file is a blocking open(2) on the proxy's loop; the daemon answers it
// without I/O (no network, no disk wait), so it costs a FUSE round trip.
//   - Hot objects are also kept in the proxy's RAM (proxy/memory_cache.h: the memory source,
//     which the cost model always prefers, DESIGN §3.4): a body read whole by one ReadBody
//     after a lookup is kept, and FindInMemory then answers without asking the daemon. The
//     daemon pushes every change of a stored object ("objects" subscription), which drops the
//     copy; our own store/refresh/invalidate drop it at once; a lost control connection drops
//     them all. Reads served from RAM are reported to the daemon in batches ("served", at most
//     one report per GhostfsBackendOptions::report_delay while hits come in; nothing while
//     idle), so `ghostctl stats` counts them under "memory".
//
// Thread-safety: everything on the proxy's event-loop thread.
#ifndef GHOST_PROXY_GHOSTFS_BACKEND_H_
#define GHOST_PROXY_GHOSTFS_BACKEND_H_

#include <functional>
#include <memory>
#include <string>

#include "common/base/file_io.h"
#include "common/base/status.h"
#include "common/base/units.h"
#include "proxy/cache_backend.h"

struct event_base;

namespace ghost {

struct GhostfsBackendOptions {
  // Bytes of responses kept in the proxy's RAM (MemoryCache); 0 keeps none (every hit asks
  // the daemon and reads the body file).
  Bytes memory_cache = 64ull << 20;
  // How long reads served from RAM are collected before they are reported to the daemon.
  Duration report_delay = std::chrono::milliseconds(50);
  // Makes the FileIo that reads and writes bodies; unset: io_uring (UringFileIo), or pread/
  // pwrite where that is unavailable. Tests pass one that holds requests back.
  std::function<std::unique_ptr<FileIo>(event_base*)> file_io;
};

// Connects to the daemon at `control_path` (checking that `mountpoint` is its mount). Errors
// say which of the two is wrong and what to do. `base` is borrowed.
Result<std::unique_ptr<CacheBackend>> MakeGhostfsBackend(event_base* base,
                                                         const std::string& mountpoint,
                                                         const std::string& control_path,
                                                         const GhostfsBackendOptions& options = {});

// The stored head as the proxy keeps it in the daemon's index ("response" in the control
// protocol): JSON {"status":200,"headers":[["Name","value"],...],"stored_unix":N,
// "expires_unix":N|null}. Parse fails on anything else.
std::string SerializeStoredResponse(const StoredResponse& r);
Result<StoredResponse> ParseStoredResponse(const std::string& text);

}  // namespace ghost

#endif  // GHOST_PROXY_GHOSTFS_BACKEND_H_
