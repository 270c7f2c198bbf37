#!/usr/bin/env python3
"""A full cache disk (DESIGN §2: bad input): the cache directory on a 3 MiB tmpfs. Objects that
do not fit are served but not cached, with a log line; a deferred write to local/ that fails
is reported by fsync (ENOSPC), as the kernel reports writeback errors; what was already
cached stays readable and the mount stays up. TAP; skipped without root, /dev/fuse or nginx."""
import errno
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
import harness as h  # noqa: E402

PLAN = 6


def main():
    work, root, sums, nginx = h.serve_tree()
    t = h.Tap(PLAN)
    small_disk = os.path.join(work, "small-disk")
    os.makedirs(small_disk)
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", small_disk]).returncode != 0:
        h.skip_all("cannot mount a tmpfs for the full-disk test")
    h.on_exit(lambda: subprocess.run(["umount", "-l", small_disk]))
    mnt = os.path.join(work, "mnt")
    os.makedirs(mnt)
    fs = h.Ghostfs(mnt, os.path.join(small_disk, "cache"), {"www": nginx.url()})
    if not t.check(fs.start(), "mounts with its cache on a 3 MiB file system", fs.output()):
        t.skip_rest(PLAN, "not mounted")
        t.done()
    www = os.path.join(mnt, "www")
    local = os.path.join(mnt, "local")

    ok_small = h.sha256_file(os.path.join(www, "page.html")) == sums["page.html"]
    time.sleep(0.5)
    cached = os.getxattr(os.path.join(www, "page.html"), "user.ghost.cached").decode()
    # 6 MiB cannot be stored on a 3 MiB disk: it is read from the network and not cached.
    ok_large = h.sha256_file(os.path.join(www, "large.bin")) == sums["large.bin"]
    time.sleep(0.5)
    large_cached = os.getxattr(os.path.join(www, "large.bin"), "user.ghost.cached").decode()
    t.check(ok_small and cached == "1" and ok_large and large_cached == "0",
            "an object that does not fit is served byte-identical and not cached", (cached, large_cached))
    t.check("large.bin" in fs.output() and ("No space" in fs.output() or "ENOSPC" in fs.output()
                                            or "not caching" in fs.output()),
            "the daemon logs why it did not cache it", fs.output()[-600:])

    # 4 MiB into local/: the deferred write fails on the full disk; fsync says so.
    fd = os.open(os.path.join(local, "big.bin"), os.O_WRONLY | os.O_CREAT, 0o644)
    wrote = 0
    write_err = None
    try:
        for _ in range(16):
            wrote += os.write(fd, b"x" * (256 * 1024))
    except OSError as e:
        write_err = e.errno
    try:
        os.fsync(fd)
        sync_err = 0
    except OSError as e:
        sync_err = e.errno
    try:
        os.close(fd)
    except OSError:
        pass
    print(f"# wrote {wrote} bytes; write errno {write_err}; fsync errno {sync_err}")
    t.check(write_err == errno.ENOSPC or sync_err == errno.ENOSPC,
            "a write to local/ that cannot land is reported (ENOSPC from write or fsync), not lost silently",
            (wrote, write_err, sync_err))

    again = h.sha256_file(os.path.join(www, "page.html")) == sums["page.html"]
    src = os.getxattr(os.path.join(www, "page.html"), "user.ghost.source").decode()
    t.check(again and src in ("disk", "memory", "revalidated"), "what was cached before stays cached and readable", src)
    t.check(fs.proc.poll() is None and os.path.ismount(mnt), "the mount stays up")
    fs.stop()
    t.done()


if __name__ == "__main__":
    main()
