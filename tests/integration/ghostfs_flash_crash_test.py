#!/usr/bin/env python3
"""Crash safety of the flash log (ghostfs --flash-log, fs/flash_local.h): ghostfs runs with
`--profile ipaq-2004` (the emulated disk sleeps, so local/ fsyncs are acknowledged from the flash
log) and is killed with SIGKILL at a random point while a writer does write + fsync in local/
(new files, rewrites in place, appends, truncates down and up) mixed with renames (onto free
names and over files with records in the log) and unlinks, while a second thread flushes the log
to the disk (`ghostctl flush`) and wakes the disk and puts it back to sleep (`ghostctl knob`), so
kills land mid-flush too; some cycles kill ghostfs again right after the remount, while its
replay runs. It is remounted on the same cache and flash log each cycle (the log is recovered and
replayed at mount). After every remount, and after a last mount
without the flash log, the tree matches the model of what was acknowledged: every byte whose
fsync returned is there under the file's current name, and no name that a returned unlink or
rename removed has come back (a logged record of an unlinked or replaced file must not revive
it or land on the file now holding the name). Nothing that was never written may appear: the
file of an operation the kill interrupted holds its state before or after it, or (a write) bytes
that are each the old file's, the new one's or zero; that state is then what later cycles
expect. At the end, a kill leaves an fsync'd file only in the log: a mount without the log is
refused, naming it (kFlashLogDirXattr, fs/flash_local.h).

Names go through the log too (creates, renames, unlinks while the disk sleeps are metadata
records, fs/flash_local.h): in every cycle the emulated disk changes mode only when the log
was full and flushed (no spin-up is caused by a create, rename or unlink), and the log took
metadata records (`meta_logged` in `ghostctl stats`).

    ghostfs_flash_crash_test.py [CYCLES]   (default 20, or $GHOST_FLASH_CRASH_CYCLES;
                                            scripts/bench-flash-crash.sh runs 100)
TAP; skipped without root or /dev/fuse."""
import json
import os
import random
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(__file__))
import harness as h  # noqa: E402


def check_acked(local, acked, gone=()):
    """Files whose last acknowledged content is missing or differs, and removed names back."""
    lost = [(rel, "removed, but there") for rel in sorted(gone) if os.path.lexists(os.path.join(local, rel))]
    try:
        lost += [(rel, "never written, but there") for rel in sorted(set(os.listdir(local)) - set(acked) - set(gone))]
    except OSError as e:
        lost.append((".", str(e)))
    for rel, data in acked.items():
        try:
            with open(os.path.join(local, rel), "rb") as f:
                got = f.read()
        except OSError as e:
            lost.append((rel, str(e)))
            continue
        if got != data:
            lost.append((rel, f"{len(got)} bytes, want {len(data)}, content differs"))
    return lost


def resolve(local, doubt, acked, gone, cycle, mixed, never_written):
    """The files of operations a kill interrupted (`doubt`: rel -> (before, after), None for no
    file): the state found must be before or after (for bytes: each byte the old file's, the new
    one's or zero); it is then what later cycles expect."""
    for rel, (before_op, after_op) in doubt.items():
        try:
            with open(os.path.join(local, rel), "rb") as f:
                got = f.read()
        except FileNotFoundError:
            got = None
        if got in (before_op, after_op) or (got == b"" and after_op is not None):
            pass
        elif got is not None and is_mix(got, before_op or b"", after_op or b""):
            mixed.append((cycle, rel))
        else:
            never_written.append((cycle, rel, None if got is None else len(got),
                                  None if before_op is None else len(before_op),
                                  None if after_op is None else len(after_op)))
        if got is None:
            acked.pop(rel, None)
            gone.add(rel)
        else:
            acked[rel] = got
            gone.discard(rel)
    doubt.clear()


def is_mix(got, old, new):
    """Whether every byte of `got` is the old file's, the new one's or zero at its offset (what
    an interrupted write, truncate or O_TRUNC rewrite may leave), and it is no longer than both."""
    if len(got) > max(len(old), len(new)):
        return False
    for i, b in enumerate(got):
        if b != 0 and (i >= len(old) or old[i] != b) and (i >= len(new) or new[i] != b):
            return False
    return True


def disk_mode(ctl):
    exe = os.path.join(h.build_dir(), "fs", "ghostctl")
    r = subprocess.run([exe, "--control", ctl, "--json", "devices"], capture_output=True, text=True, timeout=30)
    return [d for d in json.loads(r.stdout) if d["kind"] == "disk"][0]["mode"] if r.returncode == 0 else None


def disk_and_log(ctl):
    """(the disk's mode changes so far, the log's full flushes, metadata records logged), or None."""
    exe = os.path.join(h.build_dir(), "fs", "ghostctl")
    r = subprocess.run([exe, "--control", ctl, "--json", "stats"], capture_output=True, text=True, timeout=30)
    if r.returncode != 0:
        return None
    s = json.loads(r.stdout)
    fl = s.get("flash_log", {})
    disk = [d for d in s["devices"] if d["kind"] == "disk"][0]
    return disk["transitions"], fl.get("flushes", {}).get("full", 0), fl.get("meta_logged", 0)


def main():
    cycles = int(sys.argv[1]) if len(sys.argv) > 1 else int(os.environ.get("GHOST_FLASH_CRASH_CYCLES", "20"))
    h.require_root_and_fuse()
    work, mnt, cache, flash, ctl = h.flash_dirs()
    plan = cycles + 5
    woken = []  # cycles whose disk changed mode with no full flush of the log
    meta_logged = 0
    t = h.Tap(plan)
    acked = {}  # local/ relative path -> the bytes its last returned fsync covered
    gone = set()  # names a returned unlink or rename removed (and nothing created since)
    renames = unlinks = truncates = 0
    mixed = []  # (cycle, file): an interrupted write left a mix of old, new and zero bytes
    never_written = []  # (cycle, file, ...): an interrupted operation left a state it never made
    doubt = {}  # rel -> (before, after) of the operation the last kill interrupted
    replay_kills = 0
    ctl_calls = {"flush": 0, "wake": 0, "sleep": 0}
    acked_bytes = 0
    fsyncs = 0
    logged_at_kill = []
    for cycle in range(cycles):
        # A small log: some cycles flush it when full, mid-run.
        fs = h.Ghostfs(mnt, cache, {}, control=ctl, args=["--profile", "ipaq-2004", "--knob", "0",
                                                          "--flash-log", flash + ":256K"])
        if not fs.start(timeout=20):
            t.check(False, f"cycle {cycle}: ghostfs remounts on the same cache and flash log", fs.output()[-2000:])
            t.skip_rest(plan - cycle - 1, "ghostfs did not restart")
            t.done()
        local = os.path.join(mnt, "local")
        resolve(local, doubt, acked, gone, cycle, mixed, never_written)
        if cycle == 0:  # nothing acknowledged yet: what there is to check is that nothing is there
            names = os.listdir(local)
            t.check(not names, "cycle 0: local/ of the fresh cache is empty", names[:5])
        elif not acked and not gone:
            t.skip(f"cycle {cycle}: every fsync'd byte of the earlier cycles is there", "no fsync returned before a kill yet")
        else:
            lost = check_acked(local, acked, gone)
            t.check(not lost, f"cycle {cycle}: every fsync'd byte of the earlier cycles is there ({len(acked)} files), "
                    f"{len(gone)} removed names stay removed", lost[:5])
        # The disk sleeps (knob 0: within about 2 s): fsyncs are acknowledged from the log.
        h.wait_for(lambda: disk_mode(ctl) == "standby", 10)
        before = disk_and_log(ctl)
        stop = threading.Event()
        crng = random.Random(1000 + cycle)
        in_flight = []

        def writer():
            nonlocal acked_bytes, fsyncs, renames, unlinks, truncates
            n = 0
            while not stop.is_set():
                rel = f"f{crng.randrange(12):02d}"
                old = acked.get(rel, b"")
                op = crng.random()
                if old and op >= 0.85:  # rename (maybe over another file) or unlink
                    to = f"f{crng.randrange(12):02d}"
                    if op < 0.93 and to != rel:
                        in_flight[:] = [(rel, old, None), (to, acked.get(to), old)]
                    else:
                        in_flight[:] = [(rel, old, None)]
                    try:
                        if op < 0.93 and to != rel:
                            os.rename(os.path.join(local, rel), os.path.join(local, to))
                            acked[to] = acked.pop(rel)
                            gone.discard(to)
                            gone.add(rel)
                            renames += 1
                        else:
                            os.unlink(os.path.join(local, rel))
                            del acked[rel]
                            gone.add(rel)
                            unlinks += 1
                    except OSError:
                        return  # the daemon is gone
                    in_flight[:] = []
                    continue
                chunk = None
                if old and op >= 0.75:  # truncate down or up (to `off`)
                    off = crng.randrange(len(old) + 20_000)
                    new = old[:off].ljust(off, b"\0")
                    flags = 0
                    truncates += 1
                elif op < 0.35 or not old:  # rewrite whole
                    new = crng.randbytes(crng.randrange(1, 40_000))
                    flags, off, chunk = os.O_TRUNC, 0, new
                elif op < 0.6:  # overwrite in place
                    off = crng.randrange(len(old))
                    chunk = crng.randbytes(crng.randrange(1, 5_000))
                    new = old[:off] + chunk + old[off + len(chunk):]
                    flags = 0
                else:  # append
                    off, chunk = len(old), crng.randbytes(crng.randrange(1, 5_000))
                    new = old + chunk
                    flags = 0
                in_flight[:] = [(rel, old or None, new)]
                try:
                    fd = os.open(os.path.join(local, rel), os.O_WRONLY | os.O_CREAT | flags, 0o644)
                    try:
                        if chunk is None:
                            os.ftruncate(fd, off)
                        else:
                            os.pwrite(fd, chunk, off)
                        os.fsync(fd)
                    finally:
                        os.close(fd)
                except OSError:
                    return  # the daemon is gone
                acked[rel] = new
                gone.discard(rel)
                in_flight[:] = []
                acked_bytes += len(chunk or b"")
                fsyncs += 1
                n += 1

        def meddler():
            # Flushes the log and wakes the disk while the writer runs: kills land mid-flush.
            mrng = random.Random(crng.random())
            exe = os.path.join(h.build_dir(), "fs", "ghostctl")
            while not stop.wait(mrng.uniform(0.1, 0.6)):
                r = mrng.random()
                which, args = (("flush", ["flush"]) if r < 0.5 else ("wake", ["knob", "100"]) if r < 0.7
                               else ("sleep", ["knob", "0"]))
                try:
                    if subprocess.run([exe, "--control", ctl, *args], capture_output=True,
                                      timeout=30).returncode == 0:
                        ctl_calls[which] += 1
                except subprocess.TimeoutExpired:
                    pass

        th = threading.Thread(target=writer)
        th.start()
        meddle = crng.random() < 0.5
        mt = threading.Thread(target=meddler)
        if meddle:
            mt.start()
        time.sleep(crng.uniform(0.3, 1.5))
        after = disk_and_log(ctl)
        if before and after:
            if after[0] != before[0] and after[1] == before[1] and not meddle:
                woken.append((cycle, after[0] - before[0]))
            meta_logged += after[2]
        fs.proc.kill()  # SIGKILL wherever it is: appending, flushing, replaying
        fs.proc.wait()
        stop.set()
        th.join(30)
        if meddle:
            mt.join(60)
        doubt = {rel: (before_op, after_op) for rel, before_op, after_op in in_flight}  # the next mount resolves it
        subprocess.run(["umount", "-l", mnt], stderr=subprocess.DEVNULL)
        fs.proc = None
        if crng.random() < 0.25:
            # Kill it again during the replay of what this kill left in the log.
            again = h.Ghostfs(mnt, cache, {}, control=ctl, args=["--profile", "ipaq-2004", "--knob", "0",
                                                                 "--flash-log", flash + ":256K"])
            again.proc = subprocess.Popen(again.command(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            h.track(again.proc)
            h.track_mount(mnt)
            time.sleep(crng.uniform(0.0, 0.3))
            again.kill9()
            replay_kills += 1
        try:
            logged_at_kill.append(os.path.getsize(os.path.join(flash, "flash.log")))
        except OSError:
            logged_at_kill.append(0)
    t.check(not woken and meta_logged > 0 and renames + unlinks > 0,
            f"in the cycles nothing woke it, the sleeping disk changed mode only for full-log flushes: creates, {renames} renames and {unlinks} "
            f"unlinks went to the log ({meta_logged} metadata records)", woken)
    # A kill with an fsync'd file only in the log, then a mount without the log: refused, naming
    # the log (it would show the file without those bytes, and replaying the log after writes
    # made without it puts its older bytes over theirs: seen on e5b4cf5, "BBBBBBBB" then read
    # "AAAABBBB").
    fs = h.Ghostfs(mnt, cache, {}, control=ctl, args=["--profile", "ipaq-2004", "--knob", "0",
                                                      "--flash-log", flash + ":256K"])
    refused, said = None, ""
    if fs.start(timeout=60):
        resolve(os.path.join(mnt, "local"), doubt, acked, gone, cycles, mixed, never_written)
        h.wait_for(lambda: disk_mode(ctl) == "standby", 10)
        probe = b"only in the flash log " * 100
        with open(os.path.join(mnt, "local", "probe"), "wb") as f:
            f.write(probe)
            f.flush()
            os.fsync(f.fileno())
        acked["probe"] = probe
        fs.kill9()
        without = h.Ghostfs(mnt, cache, {})
        refused = not without.start(timeout=60)
        with open(without.log, errors="replace") as f:
            said = f.read()
        without.stop()
        refused = refused and f"--flash-log {os.path.realpath(flash)}" in said
    t.check(refused, "after a kill with records in the log, a mount without the log is refused and names it",
            said[-600:])
    fs = h.Ghostfs(mnt, cache, {}, args=["--flash-log", flash + ":256K"])
    ok = fs.start(timeout=20)
    if ok:
        resolve(os.path.join(mnt, "local"), doubt, acked, gone, cycles, mixed, never_written)
    lost = check_acked(os.path.join(mnt, "local"), acked, gone) if ok else ["not mounted"]
    t.check(ok and (acked or gone) and not lost, f"after {cycles} kills and a last replay: 0 of {len(acked)} fsync'd files lost",
            lost[:5])
    t.check(not never_written, f"no interrupted operation left a state it never made ({len(mixed)} interrupted "
            f"writes left a mix of old, new and zero bytes)", never_written[:5])
    fs.stop()
    # Unmounted (the log went to the disk): the files as they are on the disk, without a log.
    fs = h.Ghostfs(mnt, cache, {})
    ok = fs.start(timeout=20)
    lost = check_acked(os.path.join(mnt, "local"), acked, gone) if ok else ["not mounted"]
    t.check(ok and not lost and any(logged_at_kill),
            f"and on the disk without the log ({sum(1 for x in logged_at_kill if x)} kills left records in the log)",
            (lost[:5], logged_at_kill))
    fs.stop()
    print(f"# {cycles} SIGKILLs ({replay_kills} more during a replay): {fsyncs} fsyncs acknowledged "
          f"({acked_bytes} bytes), {truncates} truncates, {renames} renames, {unlinks} unlinks, {len(lost)} files lost; "
          f"ghostctl while writing: {ctl_calls}; "
          f"log bytes at each kill: {logged_at_kill}", flush=True)
    t.done()


if __name__ == "__main__":
    main()
