#!/usr/bin/env python3
"""One reader, one version: the minimal case behind ghostfs_evict_random's rare "kept read
mixing two versions" (evict15, round 15). With a profile, a cached copy opens in the kernel's
page cache (cached mode: the emulated disk is charged per read, so no passthrough). A reader R
opens version 1 that way and reads half of it. The origin replaces the file with version 2; a
second process opens the file and maps it MAP_PRIVATE. The kernel serves a private mapping of a
direct_io file through the inode's page cache (fuse_file_mmap: invalidate, then
generic_file_mmap), so before the fix the new version's direct_io open put version 2's pages
where R reads, and R's second half came back as version 2. Now, while R is open, opens get R's
version (fs/origin_tree.cc OpenPinned, DESIGN §4.1); once R closes, the next open reads version
2. Skipped without root, /dev/fuse or nginx."""
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
import harness as h  # noqa: E402

SIZE = 256 * 1024
PLANNED = 5

MMAP_PRIVATE_CHILD = """
import mmap, os, sys
fd = os.open(sys.argv[1], os.O_RDONLY)
size = os.fstat(fd).st_size
m = mmap.mmap(fd, size, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ)
sys.stdout.buffer.write(bytes(m))
"""


def version(v):
    """Version v: every 64-byte line names it, so a mix shows."""
    line = f"page mix version {v} ".encode()
    line = line + b"." * (63 - len(line)) + b"\n"
    return (line * (SIZE // 64 + 1))[:SIZE]


def put(site, v):
    tmp = os.path.join(site, ".f.bin")
    with open(tmp, "wb") as f:
        f.write(version(v))
    # Last modified 8 s ago: heuristic freshness (10 % of that) keeps a copy 0.8 s.
    os.utime(tmp, (time.time() - 8, time.time() - 8))
    os.rename(tmp, os.path.join(site, "f.bin"))


def main():
    h.require_root_and_fuse()
    work = h.tempdir()
    site = os.path.join(work, "site")
    os.makedirs(site)
    put(site, 1)
    nginx = h.started_nginx(site)
    conf = os.path.join(work, "ghostfs.toml")
    with open(conf, "w") as f:
        f.write("heuristic_freshness = 1\n")
    t = h.Tap(PLANNED)
    fs, mnt, _ = h.mount_origin(t, PLANNED, work, nginx.url(), args=["--profile", "ipaq-2004", "--config", conf],
                                check="ghostfs mounts an nginx origin with the ipaq-2004 profile")
    path = os.path.join(mnt, "www", "f.bin")
    # Cached, then opened until the page cache may serve this version (its first cached open
    # comes once the kernel's attributes have settled, kAttrTimeout + 0.5 s).
    first = h.read_bytes(path)
    deadline = time.time() + 20
    while time.time() < deadline and os.getxattr(path, "user.ghost.source").decode() == "network":
        time.sleep(0.3)
        h.read_bytes(path)
    time.sleep(2.0)
    fd = os.open(path, os.O_RDONLY)
    try:
        half = os.pread(fd, SIZE // 2, 0)
        t.check(first == version(1) and half == version(1)[:SIZE // 2],
                "reader R opens the cached copy (version 1) and reads its first half",
                f"first read {first[:40]!r}, half {half[:40]!r}")
        put(site, 2)
        time.sleep(1.5)  # the copy is stale: the next open revalidates and gets version 2
        r = subprocess.run([sys.executable, "-c", MMAP_PRIVATE_CHILD, path], capture_output=True, timeout=60)
        # R's version (pinned while R is open, DESIGN §4.1); main gave version 2 here and then
        # R read version 2's pages.
        t.check(r.returncode == 0 and r.stdout == version(1),
                "another process maps the file MAP_PRIVATE while R is open: R's version (1) whole",
                f"exit {r.returncode}, {len(r.stdout)} bytes, starts {r.stdout[:40]!r}, {r.stderr[-300:]!r}")
        rest = os.pread(fd, SIZE - SIZE // 2, SIZE // 2)
    finally:
        os.close(fd)
    mixed = sorted({ln[:20] for ln in rest.split(b"\n") if ln and not version(1).startswith(ln)})
    t.check(rest == version(1)[SIZE // 2:], "R's second half is still version 1 (one reader, one version)",
            f"{len(rest)} bytes; lines not of version 1: {mixed[:3]}")
    # R closed: the next open (the copy stale) asks the origin again and reads version 2.
    time.sleep(1.5)
    after = h.read_bytes(path)
    t.check(after == version(2), "once R closed, an open reads version 2",
            f"{len(after)} bytes, starts {after[:40]!r}")
    fs.stop()
    t.done()


if __name__ == "__main__":
    main()
