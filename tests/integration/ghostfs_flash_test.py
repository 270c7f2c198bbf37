#!/usr/bin/env python3
"""ghostfs --flash-log (fs/flash_local.h): with the emulated disk asleep (--profile ipaq-2004),
local/ writes and their fsyncs go into the flash log, not to the disk (no spin-up, nothing on the
backing file yet); reads and stat see the logged bytes (read-your-writes), a truncate of a logged
file is honoured; `ghostctl stats` shows the log; `ghostctl flush` writes the log to the disk;
an unmount leaves everything on the disk; bad --flash-log values are refused with a message.
TAP; skipped without root or /dev/fuse."""
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(__file__))
import harness as h  # noqa: E402
from harness import wait_for  # noqa: E402

PLAN = 15


def disk(ctl):
    return [d for d in h.ghostctl_json(ctl, "devices") if d["kind"] == "disk"][0]


def spin_ups(ctl):
    return [d for d in h.ghostctl_json(ctl, "stats")["devices"] if d["kind"] == "disk"][0]["transitions"]


def main():
    h.require_root_and_fuse()
    work, mnt, cache, flash, ctl = h.flash_dirs()
    t = h.Tap(PLAN)

    bad = h.Ghostfs(mnt, cache, {}, args=["--flash-log", flash, "--flash-alg", "7"])
    t.check(not bad.start(timeout=5) and "--flash-alg" in bad.output(),
            "--flash-alg 7 is refused, naming the option", bad.output()[-500:])
    bad.stop()

    fs = h.Ghostfs(mnt, cache, {}, control=ctl,
                   args=["--profile", "ipaq-2004", "--flash-log", flash + ":1M", "--flash-policy", "when-full"])
    if not t.check(fs.start(), "mounts with --flash-log DIR:1M", fs.output()[-2000:]):
        t.skip_rest(PLAN - 2, "not mounted")
        t.done()
    local = os.path.join(mnt, "local")
    t.check(wait_for(lambda: disk(ctl)["mode"] == "standby", 20), "the idle disk reaches standby", disk(ctl))
    before = spin_ups(ctl)

    p = os.path.join(local, "notes.txt")
    backing = os.path.join(cache, "local", "notes.txt")
    fd = os.open(p, os.O_WRONLY | os.O_CREAT, 0o644)
    os.write(fd, b"first draft\n" * 100)
    os.fsync(fd)
    os.write(fd, b"second part\n")
    os.fdatasync(fd)
    os.close(fd)
    stats = h.ghostctl_json(ctl, "stats")
    fl = stats.get("flash_log", {})
    t.check(disk(ctl)["mode"] == "standby" and spin_ups(ctl) == before,
            "fsync and fdatasync in local/ return with the disk still in standby", disk(ctl))
    t.check(fl.get("records", 0) >= 1 and fl.get("used", 0) > 1200 and os.path.getsize(backing) == 0,
            "the fsync'd bytes are in the flash log, not on the disk", (fl, os.path.getsize(backing)))
    want = b"first draft\n" * 100 + b"second part\n"
    with open(p, "rb") as f:
        got = f.read()
    t.check(got == want and os.path.getsize(p) == len(want),
            "reads and stat see the logged bytes (read-your-writes)", (len(got), os.path.getsize(p)))
    src = os.getxattr(p, "user.ghost.source").decode()
    t.check(src == "flash", "user.ghost.source of a file with logged bytes says flash", src)

    # A truncate of a logged file, then a rewrite: the log's replay must not revive the cut bytes.
    with open(p, "r+b") as f:
        f.truncate(5)
        f.seek(0, 2)
        f.write(b"!")
        f.flush()
        os.fsync(f.fileno())
    with open(p, "rb") as f:
        got = f.read()
    t.check(got == b"first!", "a truncate of a logged file cuts its logged bytes", got[:40])

    out = h.ghostctl(ctl, "stats").stdout
    t.check("flash log" in out and "records" in out, "ghostctl stats shows the flash log", out)

    r = h.ghostctl(ctl, "flush")
    stats = h.ghostctl_json(ctl, "stats")
    with open(backing, "rb") as f:
        on_disk = f.read()
    t.check(r.returncode == 0 and stats["flash_log"]["records"] == 0 and on_disk == b"first!",
            "ghostctl flush writes the flash log to the disk", (r.stderr, stats["flash_log"], on_disk[:40]))
    t.check(stats["flash_log"]["flushes"].get("explicit", 0) >= 1, "the flush is counted by its reason",
            stats["flash_log"]["flushes"])

    # Logged again, then unmounted: the disk holds everything afterwards.
    t.check(wait_for(lambda: disk(ctl)["mode"] == "standby", 20), "the disk sleeps again")
    with open(os.path.join(local, "late.txt"), "wb") as f:
        f.write(b"late\n")
        f.flush()
        os.fsync(f.fileno())
    logged = h.ghostctl_json(ctl, "stats")["flash_log"]["records"]
    fs.stop()
    with open(os.path.join(cache, "local", "late.txt"), "rb") as f:
        on_disk = f.read()
    t.check(logged >= 1 and on_disk == b"late\n", "an unmount writes the flash log to the disk", (logged, on_disk))

    ro = os.path.join(work, "ro")
    os.makedirs(ro)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1M", "tmpfs", ro], check=False)
    bad = h.Ghostfs(mnt, cache, {}, args=["--flash-log", ro])
    started = bad.start(timeout=5)
    out = bad.output()
    bad.stop()
    subprocess.run(["umount", ro], stderr=subprocess.DEVNULL)
    t.check(not started and "flash log" in out and ro in out and "Read-only" in out,
            "a read-only flash log directory is refused with a message naming it", out[-500:])
    fs2 = h.Ghostfs(mnt, cache, {})
    ok = fs2.start()
    with open(os.path.join(mnt, "local", "notes.txt"), "rb") as f:
        again = f.read() if ok else b""
    fs2.stop()
    t.check(again == b"first!", "a mount without --flash-log sees the same file", again[:40])
    t.done()


if __name__ == "__main__":
    main()
