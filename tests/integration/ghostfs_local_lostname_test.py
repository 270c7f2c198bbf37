#!/usr/bin/env python3
"""A local/ file that loses its last name while its writes are still deferred (the disk asleep:
`--profile ipaq-2004 --knob 0`, with and without a flash log) keeps its bytes for as long as the
kernel can still open it. That is the atomic-save race ghostfs_concurrent [flash] saw once (seed
7020: another worker's saved file read empty): a reader's lookup finds the old file, the writer
renames its new version over the name, then the reader's open reaches the old file, which must
still hold its bytes. Forced here step by step with an O_PATH descriptor (a lookup, no open):
  - O_PATH of save.txt; a new version renamed over it; open /proc/self/fd/N: the old bytes whole
    (main: 0 bytes, the old file's queued writes were dropped at the rename);
  - the same with unlink instead of a rename;
  - the new save.txt reads the new bytes.
TAP; skipped without root or /dev/fuse."""
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
import harness as h  # noqa: E402

MODES = {"profile": ["--profile", "ipaq-2004", "--knob", "0"],
         "flash": ["--profile", "ipaq-2004", "--knob", "0", "--flash-log", "{work}/flash:512K"]}
CHECKS = 4
PLAN = CHECKS * len(MODES)


def content(tag, n):
    return (f"{tag}: bytes written while the disk sleeps\n".encode() * (n // 20 + 1))[:n]


def write(path, data):
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        for off in range(0, len(data), 16384):
            os.write(fd, data[off:off + 16384])
    finally:
        os.close(fd)


def read_via(opath_fd):
    """Opens the file an O_PATH descriptor holds (as a racing open whose lookup came first)."""
    fd = os.open(f"/proc/self/fd/{opath_fd}", os.O_RDONLY)
    try:
        out = bytearray()
        while True:
            b = os.read(fd, 1 << 20)
            if not b:
                return bytes(out)
            out += b
    finally:
        os.close(fd)


def run_mode(t, name, args, work):
    mnt, cache = os.path.join(work, f"mnt-{name}"), os.path.join(work, f"cache-{name}")
    os.makedirs(mnt)
    fs = h.Ghostfs(mnt, cache, {}, args=[a.format(work=work) for a in args])
    if not t.check(fs.start(), f"[{name}] mounts", fs.output()):
        t.skip_rest(t.n + CHECKS - 1, "not mounted")
        return
    local = os.path.join(mnt, "local")
    save, tmp, gone = (os.path.join(local, n) for n in ("save.txt", ".save.tmp", "gone.txt"))
    old, new, lost = content("old", 150_000), content("new", 120_000), content("unlinked", 90_000)

    write(save, old)
    held = os.open(save, os.O_PATH)
    write(tmp, new)
    os.rename(tmp, save)
    got = read_via(held)
    os.close(held)
    t.check(got == old, f"[{name}] the file a rename replaced, opened after the rename through a lookup made "
            "before it, reads its bytes whole", f"{len(got)} bytes of {len(old)}; starts {got[:24]!r}")

    write(gone, lost)
    held = os.open(gone, os.O_PATH)
    os.unlink(gone)
    got = read_via(held)
    os.close(held)
    t.check(got == lost, f"[{name}] the same after an unlink", f"{len(got)} bytes of {len(lost)}")

    with open(save, "rb") as f:
        now = f.read()
    t.check(now == new, f"[{name}] the name reads the new version", f"{len(now)} bytes of {len(new)}")
    fs.stop()


def main():
    h.require_root_and_fuse()
    work = h.tempdir()
    t = h.Tap(PLAN)
    for name, args in MODES.items():
        run_mode(t, name, args, work)
    t.done()


if __name__ == "__main__":
    main()
