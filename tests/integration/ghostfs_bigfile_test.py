#!/usr/bin/env python3
"""A body larger than the daemon's memory budget streams through a fixed window:
an uncached file read through the mount keeps ghostfs's peak RSS (VmHWM) under
100 MB, whether the body can be cached (it is written to the store as it arrives) or not
(bigger than --cache-size). Bytes are checked by SHA-256.

    ghostfs_bigfile_test.py [MIB]   (default 512, or $GHOST_BIG_MIB; the acceptance figure is
                                     2048)
TAP; skipped without root, /dev/fuse or nginx."""
import hashlib
import os
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
# Under AddressSanitizer (scripts/test.sh's build) freed memory waits in a 256 MB quarantine
# before it is reused, which is not the daemon's memory: a small one keeps the RSS figure about
# ghostfs's own buffers (freed-memory checks still run, over fewer recent blocks).
if os.environ.get("ASAN_OPTIONS") is not None:
    os.environ["ASAN_OPTIONS"] += ":quarantine_size_mb=4:thread_local_quarantine_size_kb=64"
import harness as h  # noqa: E402

PLAN = 7
RSS_LIMIT_KB = 100 * 1024
# What streaming may add to the daemon's peak RSS over its own at rest (about 16 MB in a plain
# build, so the 100 MB goal). Under ASan the daemon rests at about 76 MB (shadow memory and the
# sanitizer's own tables), so there the growth is what is checked.
GROWTH_LIMIT_KB = 84 * 1024
SANITIZED = os.environ.get("ASAN_OPTIONS") is not None


def rss_ok(hwm, rest):
    return 0 < hwm and hwm - rest < GROWTH_LIMIT_KB and (SANITIZED or hwm < RSS_LIMIT_KB)


def vm_hwm_kb(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    return -1


def read_sha(path):
    d = hashlib.sha256()
    n = 0
    with open(path, "rb", buffering=0) as f:
        while True:
            b = f.read(1 << 20)
            if not b:
                break
            d.update(b)
            n += len(b)
    return d.hexdigest(), n


def main():
    mib = int(sys.argv[1]) if len(sys.argv) > 1 else int(os.environ.get("GHOST_BIG_MIB", "512"))
    h.require_root_and_fuse()
    work = h.tempdir()
    site = os.path.join(work, "site")
    os.makedirs(site)
    # Generated in 1 MiB blocks of distinct content (no run of identical blocks to hide a
    # misplaced one).
    digest = hashlib.sha256()
    seed = os.urandom(1 << 20)
    with open(os.path.join(site, "big.bin"), "wb") as f:
        for i in range(mib):
            block = i.to_bytes(8, "little") * 8 + seed[64:]
            f.write(block)
            digest.update(block)
    want = digest.hexdigest()
    size = mib << 20
    nginx = h.started_nginx(site)
    t = h.Tap(PLAN)
    for label, args in (("cacheable", []), ("bigger than --cache-size", ["--cache-size", "64M"])):
        mnt = os.path.join(work, "mnt-" + label[:3])
        os.makedirs(mnt)
        fs = h.Ghostfs(mnt, os.path.join(work, "cache-" + label[:3]), {"www": nginx.url()}, args=args)
        if not fs.start():
            t.check(False, f"{label}: mounts", fs.output()[-2000:])
            continue
        path = os.path.join(mnt, "www", "big.bin")
        rest = vm_hwm_kb(fs.proc.pid)
        start = time.time()
        got, n = read_sha(path)
        took = time.time() - start
        hwm = vm_hwm_kb(fs.proc.pid)
        print(f"# {label}: {mib} MiB uncached in {took:.1f} s, ghostfs VmHWM {hwm // 1024} MB "
              f"({rest // 1024} MB at rest)", flush=True)
        t.check(got == want and n == size, f"{label}: the {mib} MiB file streams through byte-identical", (n, size))
        t.check(rss_ok(hwm, rest), f"{label}: ghostfs's peak RSS stays under 100 MB (under ASan: grows < 84 MB)",
                f"{hwm} kB, {rest} kB at rest")
        if not args:
            cached = h.wait_for(lambda: os.getxattr(path, "user.ghost.cached") == b"1", timeout=60)
            again, n2 = read_sha(path) if cached else ("", 0)
            t.check(cached and again == want, f"{label}: it was cached as it streamed and reads back from the cache",
                    (cached, n2))
            t.check(rss_ok(vm_hwm_kb(fs.proc.pid), rest), f"{label}: the read from the cache keeps RSS down too",
                    (vm_hwm_kb(fs.proc.pid), rest))
        else:
            t.check(os.getxattr(path, "user.ghost.cached") == b"0", f"{label}: it is not cached",
                    fs.output()[-500:])
        fs.stop()
    t.done()


if __name__ == "__main__":
    main()
