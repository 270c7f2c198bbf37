#!/usr/bin/env python3
"""The flash log under random operations (ghostfs --flash-log, fs/flash_local.h), seeded.

ghostfs runs with `--profile ipaq-2004 --knob 0` (the emulated disk goes to sleep, so local/
writes, fsyncs and metadata changes go to the flash log) and a log of a size drawn from the seed
(as small as 64K: the log fills and is flushed mid-run). Several writer threads, each in its
own directory of local/ (so the model is exact while the daemon serves them at once), do random
operations: pwrite at offsets (holes too), O_TRUNC rewrites, truncate up and down, O_APPEND
appends, renames onto free names and over existing files, unlinks (of files whose bytes are only
in the log, also while a descriptor stays open and is written and fsync'd after the unlink),
mkdir/rmdir and fsync; a controller thread wakes the disk and puts it to sleep again (`ghostctl
knob 100` / `knob 0`) and flushes the log (`ghostctl flush`) between them. A model holds every
file's expected bytes and every directory's names. Checked:
  - during the run, each writer reads back a file it just changed, through the mount;
  - at the end through the mount (names, sizes, bytes), with the log's flush errors and kept
    records (`ghostctl stats`: none may be there);
  - after unmount, on the cache directory's local/ (the log went to the disk);
  - after a remount (with the log again), through the mount.

    ghostfs_flash_random_test.py [--seed N] [--seconds S] [--threads T] [--log-size SIZE]
    (defaults: a random seed, printed; 12 s; 3 threads; a size drawn from the seed)
TAP; skipped without root or /dev/fuse."""
import argparse
import errno
import json
import os
import random
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(__file__))
import harness as h  # noqa: E402

PLAN = 10
NAMES = 6  # file names per writer directory (and as many in its subdirectory)


def ctl_json(ctl, *args):
    exe = os.path.join(h.build_dir(), "fs", "ghostctl")
    r = subprocess.run([exe, "--control", ctl, "--json", *args], capture_output=True, text=True, timeout=60)
    if r.returncode != 0:
        raise RuntimeError(f"ghostctl {' '.join(args)}: {r.stderr.strip()}")
    return json.loads(r.stdout) if r.stdout.strip() else {}


class Writer:
    """One thread's directory `w{i}` of local/ and its model: rel path -> bytes, and the set of
    its subdirectories (only `d`, which holds files too)."""

    def __init__(self, i, local, rng):
        self.i = i
        self.local = local
        self.rng = rng
        self.top = f"w{i}"
        self.files = {}  # "w0/f3" or "w0/d/f1" -> bytes
        self.dirs = set()  # "w0/d" when it exists
        self.ops = {}
        self.errors = []  # (op, rel, what differs)
        self.open_unlinked = []  # (fd, bytes): descriptors of unlinked files, written later

    def path(self, rel):
        return os.path.join(self.local, rel)

    def pick_name(self):
        where = self.top
        if "w%d/d" % self.i in self.dirs and self.rng.random() < 0.4:
            where = f"{self.top}/d"
        return f"{where}/f{self.rng.randrange(NAMES)}"

    def count(self, op):
        self.ops[op] = self.ops.get(op, 0) + 1

    def check(self, op, rel):
        """Reads `rel` back through the mount and compares it with the model."""
        want = self.files.get(rel)
        try:
            with open(self.path(rel), "rb") as f:
                got = f.read()
            size = os.stat(self.path(rel)).st_size
        except FileNotFoundError:
            got = size = None
        if got != want or (want is not None and size != len(want)):
            self.errors.append((op, rel, describe(got, want, size)))

    def step(self):
        rng = self.rng
        rel = self.pick_name()
        old = self.files.get(rel)
        r = rng.random()
        fsync = rng.random() < 0.5
        if r < 0.17:  # pwrite at an offset, maybe past the end (a hole)
            base = old or b""
            off = rng.randrange(len(base) + 20_000)
            chunk = rng.randbytes(rng.randrange(1, 12_000))
            new = base.ljust(off, b"\0")[:off] + chunk + base[off + len(chunk):]
            self.write(rel, os.O_CREAT, off, chunk, fsync)
            op = "pwrite"
        elif r < 0.30:  # O_TRUNC rewrite
            new = rng.randbytes(rng.randrange(0, 50_000))
            self.write(rel, os.O_CREAT | os.O_TRUNC, 0, new, fsync)
            op = "rewrite"
        elif r < 0.40:  # append
            chunk = rng.randbytes(rng.randrange(1, 8_000))
            new = (old or b"") + chunk
            self.write(rel, os.O_CREAT | os.O_APPEND, None, chunk, fsync)
            op = "append"
        elif r < 0.52 and old is not None:  # truncate up or down
            size = rng.randrange(len(old) + 30_000)
            new = old[:size].ljust(size, b"\0")
            if rng.random() < 0.5:
                os.truncate(self.path(rel), size)
                if fsync:
                    fd = os.open(self.path(rel), os.O_RDONLY)
                    os.fsync(fd)
                    os.close(fd)
            else:
                fd = os.open(self.path(rel), os.O_WRONLY)
                os.ftruncate(fd, size)
                if fsync:
                    os.fsync(fd)
                os.close(fd)
            op = "truncate"
        elif r < 0.62 and old is not None:  # rename, onto a free name or over a file
            to = self.pick_name()
            if to == rel:
                return
            over = to in self.files
            kept = os.open(self.path(rel), os.O_WRONLY) if rng.random() < 0.3 else None
            os.rename(self.path(rel), self.path(to))
            self.files[to] = self.files.pop(rel)
            self.count("rename-over" if over else "rename")
            if kept is not None:  # written after the rename through a descriptor opened before it
                off = rng.randrange(len(old) + 1)
                chunk = rng.randbytes(rng.randrange(1, 6_000))
                os.pwrite(kept, chunk, off)
                if fsync:
                    os.fsync(kept)
                os.close(kept)
                self.files[to] = old[:off] + chunk + old[off + len(chunk):]
                self.count("write-after-rename")
            self.check("rename", to)
            self.check("rename(source)", rel)
            return
        elif r < 0.70 and old is not None:  # unlink; sometimes write the open file after
            if rng.random() < 0.4:
                fd = os.open(self.path(rel), os.O_RDWR)
                os.unlink(self.path(rel))
                os.pwrite(fd, rng.randbytes(rng.randrange(1, 6_000)), rng.randrange(len(old) + 1))
                os.fsync(fd)
                self.open_unlinked.append(fd)
                op = "unlink-open"
            else:
                os.unlink(self.path(rel))
                op = "unlink"
            del self.files[rel]
            self.count(op)
            self.check(op, rel)
            return
        elif r < 0.74:  # mkdir / rmdir of the subdirectory
            d = f"{self.top}/d"
            if d in self.dirs and rng.random() < 0.4:
                # Away and back: two logged renames of a directory holding files with logged bytes.
                os.rename(self.path(d), self.path(d + ".away"))
                os.rename(self.path(d + ".away"), self.path(d))
                self.count("rename-dir")
                return
            if d in self.dirs:
                inside = [k for k in self.files if k.startswith(d + "/")]
                for k in inside:  # empty it first (unlinks of logged files)
                    os.unlink(self.path(k))
                    del self.files[k]
                os.rmdir(self.path(d))
                self.dirs.discard(d)
                op = "rmdir"
                ok = not os.path.exists(self.path(d))
            else:
                os.mkdir(self.path(d))
                self.dirs.add(d)
                op = "mkdir"
                ok = os.path.isdir(self.path(d))
            if not ok:
                self.errors.append((op, d, "not as the model says"))
            self.count(op)
            return
        elif r < 0.82 and self.open_unlinked:  # close a descriptor of an unlinked file
            os.close(self.open_unlinked.pop())
            self.count("close-unlinked")
            return
        else:  # fsync a file (or the directory) with nothing else
            if old is None:
                return
            fd = os.open(self.path(rel), os.O_RDONLY)
            os.fsync(fd)
            os.close(fd)
            self.count("fsync")
            return
        self.files[rel] = new
        self.count(op + ("+fsync" if fsync else ""))
        if rng.random() < 0.5:
            self.check(op, rel)

    def write(self, rel, flags, off, data, fsync):
        fd = os.open(self.path(rel), os.O_WRONLY | flags, 0o644)
        try:
            # In pieces sometimes: the queue merges, the log holds several records of one file.
            pos = 0
            while pos < len(data) or pos == 0:
                n = len(data) - pos if self.rng.random() < 0.6 else self.rng.randrange(1, max(2, len(data) - pos + 1))
                piece = data[pos:pos + n]
                if off is None:
                    os.write(fd, piece)
                else:
                    os.pwrite(fd, piece, off + pos)
                pos += len(piece)
                if not data:
                    break
            if fsync:
                os.fsync(fd)
        finally:
            os.close(fd)

    def run(self, stop):
        os.mkdir(self.path(self.top))
        while not stop.is_set():
            try:
                self.step()
            except OSError as e:
                self.errors.append(("exception", "", f"{type(e).__name__}: {e}"))
                if e.errno in (errno.ENOTCONN, errno.EIO):
                    return


def truncate_during_flush(work, t):
    """The minimal case found by this test: a truncate of a file with bytes in the log, made
    while a long flush runs (`ghostctl flush` of ~4 MiB in 16 KiB records, algorithm 1), then an
    unmount. The truncate's record waited behind the flush, the flush rewrote the file's older
    bytes into the cut file, and the unmount's flush (asked while the first ran) was answered by
    the first one: the disk kept 10000 bytes, the log the truncate (5 of 5 runs on c380af4)."""
    mnt = os.path.join(work, "mnt-min")
    os.makedirs(mnt)
    cache = os.path.join(work, "cache-min")
    ctl = os.path.join(work, "min.sock")
    fs = h.Ghostfs(mnt, cache, {}, control=ctl, args=["--profile", "ipaq-2004", "--knob", "0", "--flash-log",
                                                      os.path.join(work, "flash-min") + ":8M", "--flash-alg", "1"])
    if not fs.start(timeout=60):
        return t.check(False, "a truncate made during a flush is on the disk after unmount", log_tail(fs))
    local = os.path.join(mnt, "local")
    h.wait_for(lambda: [d for d in ctl_json(ctl, "devices") if d["kind"] == "disk"][0]["mode"] == "standby", 15)
    with open(os.path.join(local, "big"), "wb") as f:
        for _ in range(250):
            f.write(os.urandom(16384))
            f.flush()
            os.fsync(f.fileno())
    with open(os.path.join(local, "b"), "wb") as f:
        f.write(b"x" * 10000)
        f.flush()
        os.fsync(f.fileno())
    exe = os.path.join(h.build_dir(), "fs", "ghostctl")
    flush = subprocess.Popen([exe, "--control", ctl, "flush"], stdout=subprocess.DEVNULL)
    ctl_json(ctl, "stats")  # the flush has started meanwhile
    os.truncate(os.path.join(local, "b"), 5)
    fs.stop()
    flush.wait(60)
    size = os.path.getsize(os.path.join(cache, "local", "b"))
    left = os.path.getsize(os.path.join(work, "flash-min", "flash.log"))
    return t.check(size == 5, f"a truncate made during a flush is on the disk after unmount (size {size}, want 5)",
                   f"flash.log holds {left} bytes after the unmount")


def log_tail(fs):
    try:
        with open(fs.log, errors="replace") as f:
            return f.read()[-2000:]
    except OSError as e:
        return str(e)


def describe(got, want, size=None):
    if got is None:
        return f"missing, want {len(want)} bytes" if want is not None else "ok"
    if want is None:
        return f"there ({len(got)} bytes), want removed"
    first = next((i for i in range(min(len(got), len(want))) if got[i] != want[i]), min(len(got), len(want)))
    return f"{len(got)} bytes (stat {size}), want {len(want)}; first difference at {first}"


def tree_diff(local, writers):
    """Everything that differs between `local` (a directory) and the writers' models."""
    diff = []
    for w in writers:
        want_names = set(w.files) | w.dirs
        seen = set()
        for dirpath, dirnames, filenames in os.walk(os.path.join(local, w.top)):
            for n in dirnames + filenames:
                seen.add(os.path.relpath(os.path.join(dirpath, n), local))
        for extra in sorted(seen - want_names):
            diff.append((extra, "there, want removed"))
        for rel, want in sorted(w.files.items()):
            try:
                with open(os.path.join(local, rel), "rb") as f:
                    got = f.read()
                size = os.stat(os.path.join(local, rel)).st_size
            except OSError as e:
                diff.append((rel, f"{e}, want {len(want)} bytes"))
                continue
            if got != want or size != len(want):
                diff.append((rel, describe(got, want, size)))
        for d in sorted(w.dirs):
            if not os.path.isdir(os.path.join(local, d)):
                diff.append((d, "directory missing"))
    return diff


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--seconds", type=float, default=float(os.environ.get("GHOST_FLASH_RANDOM_SECONDS", "12")))
    ap.add_argument("--threads", type=int, default=3)
    ap.add_argument("--log-size", default=None)
    ap.add_argument("--policy", default=None, choices=["each-spinup", "when-full"])
    ap.add_argument("--alg", default=None, choices=["1", "2", "3", "4"])
    a = ap.parse_args()
    seed = a.seed if a.seed is not None else random.randrange(1 << 30)
    rng = random.Random(seed)
    size = a.log_size or rng.choice(["64K", "128K", "256K", "1M", "4M"])
    policy = a.policy or rng.choice(["each-spinup", "when-full"])
    alg = a.alg or rng.choice(["1", "2", "3", "4", "4"])
    print(f"# seed {seed} (--seed {seed} --seconds {a.seconds} --threads {a.threads} --log-size {size} "
          f"--policy {policy} --alg {alg})", flush=True)
    h.require_root_and_fuse()
    work, mnt, cache, flash, ctl = h.flash_dirs()
    args = ["--profile", "ipaq-2004", "--knob", "0", "--flash-log", f"{flash}:{size}", "--flash-policy", policy,
            "--flash-alg", alg]
    t = h.Tap(PLAN)
    truncate_during_flush(work, t)
    fs = h.Ghostfs(mnt, cache, {}, control=ctl, args=args)
    if not t.check(fs.start(timeout=60), f"mounts with --flash-log {size}", log_tail(fs)):
        t.skip_rest(PLAN, "not mounted")
        t.done()
    local = os.path.join(mnt, "local")
    # A second daemon (another cache) given the same log directory: refused (on cd5857e both
    # mounted, appended over each other's records, and both files' fsync'd bytes were lost).
    os.makedirs(os.path.join(work, "mnt2"))
    second = h.Ghostfs(os.path.join(work, "mnt2"), os.path.join(work, "cache2"), {}, args=args)
    started = second.start(timeout=60)
    said = log_tail(second)
    second.stop()
    t.check(not started and "in use by another ghostfs" in said and flash in said,
            "a second ghostfs given the same --flash-log directory is refused, naming it", said)
    h.wait_for(lambda: [d for d in ctl_json(ctl, "devices") if d["kind"] == "disk"][0]["mode"] == "standby", 15)
    writers = [Writer(i, local, random.Random(rng.randrange(1 << 30))) for i in range(a.threads)]
    stop = threading.Event()
    ctl_ops = {"wake": 0, "sleep": 0, "flush": 0}
    ctl_errors = []

    def controller():
        crng = random.Random(rng.randrange(1 << 30))
        while not stop.wait(crng.uniform(0.2, 1.5)):
            r = crng.random()
            try:
                if r < 0.3:
                    ctl_json(ctl, "knob", "100")
                    ctl_ops["wake"] += 1
                elif r < 0.7:
                    ctl_json(ctl, "knob", "0")
                    ctl_ops["sleep"] += 1
                else:
                    ctl_json(ctl, "flush")
                    ctl_ops["flush"] += 1
            except (RuntimeError, subprocess.TimeoutExpired, ValueError) as e:
                ctl_errors.append(str(e))

    threads = [threading.Thread(target=w.run, args=(stop,)) for w in writers]
    threads.append(threading.Thread(target=controller))
    with h.Watchdog(a.seconds + 240, lambda: [fs.proc.pid] if fs.proc else []):
        for th in threads:
            th.start()
        time.sleep(a.seconds)
        stop.set()
        for th in threads:
            th.join(120)
    for w in writers:
        for fd in w.open_unlinked:
            os.close(fd)
        w.open_unlinked = []
    ops = {}
    for w in writers:
        for k, v in w.ops.items():
            ops[k] = ops.get(k, 0) + v
    print(f"# ops {sum(ops.values())}: {json.dumps(ops, sort_keys=True)}; ghostctl {ctl_ops}", flush=True)
    errors = [e for w in writers for e in w.errors]
    t.check(not errors and not ctl_errors, f"{sum(ops.values())} random ops: every file read back right at once "
            f"through the mount, every op and ghostctl call succeeded", (errors[:8], ctl_errors[:4]))
    stats = ctl_json(ctl, "stats").get("flash_log", {})
    print(f"# flash log: {json.dumps({k: stats.get(k) for k in ('capacity', 'used', 'records', 'appends', 'flushes', 'meta_logged', 'write_throughs', 'records_kept')})}",
          flush=True)
    t.check(stats.get("appends", 0) > 0 and stats.get("meta_logged", 0) > 0,
            "the log took writes and metadata changes", stats)
    diff = tree_diff(local, writers)
    t.check(not diff, "at the end, through the mount: every name, size and byte is the model's", diff[:10])
    t.check(not stats.get("last_flush_errors") and not stats.get("records_kept"),
            "no record was refused or kept by a flush", stats)
    fs.stop()
    diff = tree_diff(os.path.join(cache, "local"), writers)
    t.check(not diff, "after unmount, on the cache directory: every name, size and byte is the model's", diff[:10])
    left = os.path.getsize(os.path.join(flash, "flash.log")) if os.path.exists(os.path.join(flash, "flash.log")) else 0
    print(f"# flash.log after unmount: {left} bytes", flush=True)
    fs = h.Ghostfs(mnt, cache, {}, control=ctl, args=args)
    ok = fs.start(timeout=60)
    t.check(ok, "remounts on the same cache and log", log_tail(fs))
    diff = tree_diff(local, writers) if ok else ["not mounted"]
    t.check(not diff, "after the remount, through the mount: every name, size and byte is the model's", diff[:10])
    fs.stop()
    t.done()


if __name__ == "__main__":
    main()
