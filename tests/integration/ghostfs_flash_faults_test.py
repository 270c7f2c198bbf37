#!/usr/bin/env python3
"""ghostfs --flash-log under faults (fs/flash_local.h, common/cache/flash_log.h):

1. The flash device full (the log directory on a 16 KiB tmpfs): a local/ write + fsync that the
   log cannot take is written through to the disk with a warning, never acknowledged and lost;
   the file's older logged bytes go to the disk first; `ghostctl stats` counts it.
2. A corrupt record in the middle of the log (one byte flipped between two mounts, after a
   SIGKILL left records in the log): the mount comes up, the records before and after it are
   replayed, the bad one is saved beside the log and reported (a log line naming the file, the
   corrupt-region counter in `ghostctl stats`).

3. The disk failing mid-flush (EIO through the fault-injecting FileIo, switched on by the
   test-only GHOST_TEST_DISK_FAULT=PATH while PATH exists; it fails the fsyncs of the flush's changed directories too): a
   create and a rename made during the fault, and the earlier files' bytes, all stay in the log
   (data and metadata records), `ghostctl stats` reports them and the error, reads still see the
   bytes, the next flush (fault gone) applies them, and after a remount nothing is lost.

(The read-only log directory is refused at start: ghostfs_flash_test. The unit-level versions
of 3: flash_log_test and flash_local_test.)
TAP; skipped without root or /dev/fuse."""
import glob
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(__file__))
import harness as h  # noqa: E402
from harness import wait_for  # noqa: E402

PLAN = 21


def disk_mode(ctl):
    try:
        return [d for d in h.ghostctl_json(ctl, "devices") if d["kind"] == "disk"][0]["mode"]
    except (ValueError, IndexError, KeyError):
        return "?"


def write_fsync(path, data, flags=os.O_CREAT | os.O_WRONLY):
    """Writes `data` at 0 and fsyncs; returns None or the OSError's text."""
    try:
        fd = os.open(path, flags, 0o644)
        try:
            os.pwrite(fd, data, 0)
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as e:
        return str(e)
    return None


def read(path):
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        return str(e).encode()


def full_device(t, work):
    mnt = os.path.join(work, "mnt")
    cache = os.path.join(work, "cache")
    ctl = os.path.join(work, "control.sock")
    flash = os.path.join(work, "flash-full")
    os.makedirs(flash)
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16k", "tmpfs", flash]).returncode != 0:
        t.skip_rest(7, "cannot mount a tmpfs")
        return
    h.on_exit(lambda: subprocess.run(["umount", "-l", flash], stderr=subprocess.DEVNULL))
    try:
        fs = h.Ghostfs(mnt, cache, {}, control=ctl,
                       args=["--profile", "ipaq-2004", "--knob", "0", "--flash-log", flash + ":1M"])
        if not t.check(fs.start(timeout=20), "mounts with the flash log on a 16 KiB tmpfs", fs.output()[-2000:]):
            t.skip_rest(7, "not mounted")
            return
        local = os.path.join(mnt, "local")
        wait_for(lambda: disk_mode(ctl) == "standby", 10)
        small = os.path.join(local, "small.txt")
        head = b"head of the file\n" * 8
        err = write_fsync(small, head)
        logged = h.ghostctl_json(ctl, "stats")["flash_log"]["records"]
        # 64 KiB do not fit the 16 KiB device: the append fails with ENOSPC.
        big = bytes((i * 7) % 251 for i in range(64 << 10))
        err2 = write_fsync(small, big)
        t.check(err is None and logged >= 1 and err2 is None,
                "an fsync whose bytes the full flash device cannot take still succeeds",
                (err, logged, err2, fs.output()[-1500:]))
        on_disk = read(os.path.join(cache, "local", "small.txt"))
        t.check(on_disk == big, "its bytes are on the disk, over the file's older logged bytes (flushed first)",
                (len(on_disk), on_disk[:40]))
        t.check(read(small) == big, "reads through the mount see them")
        fl = h.ghostctl_json(ctl, "stats")["flash_log"]
        t.check(fl.get("write_throughs", 0) >= 1 and fl.get("append_failures", 0) >= 1
                and fl.get("records", -1) == 0,
                "ghostctl stats counts the failed append and the write-through", fl)
        out = h.ghostctl(ctl, "stats").stdout
        t.check("written through to the disk" in out, "ghostctl stats says so in words", out)
        t.check("writing them through to the disk" in fs.output() and "No space left" in fs.output(),
                "ghostfs logs a warning naming the cause", fs.output()[-1500:])
        fs.stop()
    finally:
        subprocess.run(["umount", "-l", flash], stderr=subprocess.DEVNULL)


def corrupt_record(t, work):
    mnt = os.path.join(work, "mnt")
    cache = os.path.join(work, "cache2")
    ctl = os.path.join(work, "control2.sock")
    flash = os.path.join(work, "flash")
    args = ["--profile", "ipaq-2004", "--knob", "0", "--flash-log", flash + ":1M"]
    fs = h.Ghostfs(mnt, cache, {}, control=ctl, args=args)
    if not fs.start(timeout=20):
        t.check(False, "mounts with a flash log", fs.output()[-2000:])
        t.skip_rest(PLAN, "not mounted")
        return
    local = os.path.join(mnt, "local")
    wait_for(lambda: disk_mode(ctl) == "standby", 10)
    want = {"a.txt": b"AAAA first file\n" * 10, "b.txt": b"BBBB second file\n" * 10,
            "c.txt": b"CCCC third file\n" * 10}
    errs = [write_fsync(os.path.join(local, n), d) for n, d in sorted(want.items())]
    records = h.ghostctl_json(ctl, "stats")["flash_log"]["records"]
    fs.kill9()  # the records stay in the log (an unmount would flush them)
    log = os.path.join(flash, "flash.log")
    data = bytearray(read(log))
    at = data.find(want["b.txt"])
    t.check(errs == [None] * 3 and records >= 3 and at > 0,
            "three fsync'd files are in the flash log when ghostfs is killed", (errs, records, at))
    if at <= 0:
        t.skip_rest(PLAN, "nothing to corrupt")
        return
    data[at + 5] ^= 0x20  # a data byte of b.txt's record: its CRC fails
    with open(log, "wb") as f:
        f.write(data)
    fs = h.Ghostfs(mnt, cache, {}, control=ctl, args=args)
    up = fs.start(timeout=20)
    t.check(up, "ghostfs mounts over a log with a corrupt record in the middle", fs.output()[-2000:])
    if not up:
        t.skip_rest(PLAN, "not mounted")
        return
    wait_for(lambda: h.ghostctl_json(ctl, "stats")["flash_log"]["records"] == 0, 10)
    backing = os.path.join(cache, "local")
    got = {n: read(os.path.join(backing, n)) for n in want}
    t.check(got["a.txt"] == want["a.txt"] and got["c.txt"] == want["c.txt"],
            "the records before and after the corrupt one are replayed to the disk", got)
    saved = glob.glob(os.path.join(flash, "corrupt-*.bin"))
    saved_bytes = read(saved[0]) if saved else b""
    t.check(len(saved) == 1 and b"BBBB" in saved_bytes and got["b.txt"] != want["b.txt"],
            "the corrupt record is not applied; its bytes are kept beside the log", (saved, saved_bytes[:80]))
    fl = h.ghostctl_json(ctl, "stats")["flash_log"]
    out = h.ghostctl(ctl, "stats").stdout
    t.check(fl.get("corrupt_regions") == 1 and "1 corrupt region" in out,
            "ghostctl stats reports the corrupt region", (fl, out))
    t.check("corrupt record (bad CRC)" in fs.output() and (saved[0] if saved else "?") in fs.output(),
            "ghostfs logs it, naming the saved copy", fs.output()[-1500:])
    fs.stop()


def disk_fails_mid_flush(t, work):
    mnt = os.path.join(work, "mnt")
    cache = os.path.join(work, "cache3")
    ctl = os.path.join(work, "control3.sock")
    flash = os.path.join(work, "flash3")
    fault = os.path.join(work, "disk-fails")
    args = ["--profile", "ipaq-2004", "--knob", "0", "--flash-log", flash + ":1M"]
    os.environ["GHOST_TEST_DISK_FAULT"] = fault
    try:
        fs = h.Ghostfs(mnt, cache, {}, control=ctl, args=args)
        up = fs.start(timeout=20)
    finally:
        del os.environ["GHOST_TEST_DISK_FAULT"]
    if not t.check(up, "mounts with the test-only disk fault switch", fs.output()[-2000:]):
        t.skip_rest(PLAN, "not mounted")
        return
    local = os.path.join(mnt, "local")
    wait_for(lambda: disk_mode(ctl) == "standby", 10)
    want = {"one.txt": b"first file, fsync'd into the log\n" * 40,
            "two.txt": bytes((i * 13) % 251 for i in range(20000))}
    errs = [write_fsync(os.path.join(local, n), d) for n, d in sorted(want.items())]
    with open(fault, "w"):
        pass  # from now on the disk fails every write and fsync of a flush
    # A create and a rename while the disk fails: metadata records in the log (the backing tree
    # holds the names already, in the page cache; the flush's directory fsyncs make them durable).
    want["three.txt"] = b"created while the disk fails\n" * 20
    made = write_fsync(os.path.join(local, "three.txt"), want["three.txt"])
    try:
        os.rename(os.path.join(local, "one.txt"), os.path.join(local, "uno.txt"))
        renamed = None
    except OSError as e:
        renamed = str(e)
    want["uno.txt"] = want.pop("one.txt")
    before = h.ghostctl_json(ctl, "stats")["flash_log"]
    flushed = h.ghostctl(ctl, "flush")
    fl = h.ghostctl_json(ctl, "stats")["flash_log"]
    backing = os.path.join(cache, "local")
    # Every record stays, the metadata ones too: the flush's directory fsyncs failed (fs/flash_local.h).
    t.check(errs == [None, None] and made is None and renamed is None
            and before.get("meta_logged", 0) >= 4 and before["records"] > before["meta_logged"]
            and fl["records"] == before["records"] and fl["records_kept"] >= before["records"],
            "EIO during the flush: every record, data and metadata (a create and a rename made during "
            "the fault), stays in the log and is counted as kept",
            (errs, made, renamed, before, fl, flushed.stdout, flushed.stderr))
    errors = " ".join(fl.get("last_flush_errors", []))
    out = h.ghostctl(ctl, "stats").stdout
    t.check("Input/output error" in errors and "injected fault" in errors
            and "refused (kept in the log)" in out,
            "ghostctl stats reports the refused records and the disk's error", (errors, out))
    t.check("sync the metadata changes of local/" in errors and "every record kept" in errors,
            "the fsyncs of the flush's changed directories failed too, and the stats say every record was kept "
            "for it", errors)
    t.check("kept in the log" in fs.output() and "Input/output error" in fs.output(),
            "ghostfs logs what the disk refused", fs.output()[-1500:])
    t.check(all(read(os.path.join(local, n)) == d for n, d in want.items()),
            "reads through the mount still see the kept bytes (from the log)")
    os.unlink(fault)
    h.ghostctl(ctl, "flush")
    fl = h.ghostctl_json(ctl, "stats")["flash_log"]
    got = {n: read(os.path.join(backing, n)) for n in want}
    t.check(fl["records"] == 0 and got == want and fl.get("last_flush_errors") == []
            and not os.path.exists(os.path.join(backing, "one.txt")),
            "the next flush (disk healthy) applies them all to the disk, the new and the renamed names too",
            (fl, {n: len(b) for n, b in got.items()}))
    fs.stop()
    fs = h.Ghostfs(mnt, cache, {}, control=ctl, args=args)
    if not fs.start(timeout=20):
        t.check(False, "remounts", fs.output()[-2000:])
        return
    t.check(all(read(os.path.join(local, n)) == d for n, d in want.items())
            and not os.path.exists(os.path.join(local, "one.txt")),
            "after a remount every acknowledged byte and name is there")
    fs.stop()


def main():
    h.require_root_and_fuse()
    work = h.tempdir()
    os.makedirs(os.path.join(work, "mnt"))
    t = h.Tap(PLAN)
    full_device(t, work)
    corrupt_record(t, work)
    disk_fails_mid_flush(t, work)
    t.done()


if __name__ == "__main__":
    main()
