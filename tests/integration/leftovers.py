#!/usr/bin/env python3
"""What a test left behind: processes and mounts, found and removed.

Processes are found by an environment marker every program a test starts inherits (a
daemonised ghostfs, a tmux server or dovecot leave the test's process group and session, not
its environment), by session (meson starts each test in a session of its own), or by pid with
the start time recorded when it was started (nginx overwrites its environment with its process
title). Mounts are found in /proc/self/mountinfo, dead FUSE mounts included
(os.path.ismount() says False for a mount whose daemon is gone: stat fails with ENOTCONN).

Three users: tests/integration/harness.py at a test's exit (a leftover fails the test), its
reaper (`leftovers.py reap`, in a session of its own: cleans up after a test that was killed,
e.g. by meson's timeout, which sends SIGTERM and 0.5 s later SIGKILL to the test's process
group), and scripts/test.sh after the whole run (`leftovers.py check`: a leftover of the run
is a failure)."""
import argparse
import os
import shutil
import signal
import subprocess
import sys
import time


def start_time(pid):
    """The start time of process `pid` (clock ticks since boot), None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return int(f.read().rsplit(b")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def _stat(pid):
    """(state, session) of a process, None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return fields[0].decode(), int(fields[3])
    except (OSError, IndexError, ValueError):
        return None


def describe(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        cmd = ""
    return f"pid {pid} ({cmd[:160] or '?'})"


def processes(marker=None, session=None, pids=(), exclude=()):
    """Live (not zombie) processes whose environment holds `marker` ("NAME=value"), or in
    `session`, or in `pids` ({pid: start time}); never those in `exclude`."""
    needle = b"\0" + marker.encode() + b"\0" if marker else None
    pids = dict(pids)
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        pid = int(name)
        if pid in exclude:
            continue
        st = _stat(pid)
        if st is None or st[0] in ("Z", "X"):
            continue
        hit = session is not None and st[1] == session
        if not hit and pid in pids:
            hit = start_time(pid) == pids[pid]
        if not hit and needle:
            try:
                with open(f"/proc/{pid}/environ", "rb") as f:
                    hit = needle in b"\0" + f.read()  # whole entries only
            except OSError:
                pass
        if hit:
            out.append(pid)
    return out


def _unescape(field):
    # mountinfo writes space, tab, newline and backslash as \ooo
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and field[i + 1:i + 4].isdigit() and len(field[i + 1:i + 4]) == 3:
            out.append(chr(int(field[i + 1:i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def mounts(dirs=(), points=()):
    """[(mount point, fstype)] of the mounts at `points` or at or under one of `dirs`, deepest
    first."""
    dirs = [os.path.abspath(d).rstrip("/") for d in dirs]
    points = {os.path.abspath(p) for p in points}
    out = []
    try:
        with open("/proc/self/mountinfo") as f:
            lines = f.read().splitlines()
    except OSError:
        return out
    for line in lines:
        left, _, right = line.partition(" - ")
        fields = left.split()
        if len(fields) < 5 or not right:
            continue
        mp, fstype = _unescape(fields[4]), right.split()[0]
        if mp in points or any(mp == d or mp.startswith(d + "/") for d in dirs):
            out.append((mp, fstype))
    out.sort(key=lambda m: -m[0].count("/"))
    return out


def stop(pids, grace=3.0):
    """SIGTERM to each, SIGKILL to those still there after `grace` seconds."""
    starts = {p: start_time(p) for p in pids}
    for p in pids:
        try:
            os.kill(p, signal.SIGTERM)
        except OSError:
            pass
    deadline = time.time() + grace
    alive = list(pids)
    while alive and time.time() < deadline:
        time.sleep(0.05)
        alive = [p for p in alive if start_time(p) is not None and start_time(p) == starts[p]
                 and (_stat(p) or ("Z",))[0] not in ("Z", "X")]
    for p in alive:
        try:
            os.kill(p, signal.SIGKILL)
        except OSError:
            pass


def unmount(points):
    """Detaches each mount (lazily: a dead FUSE mount or a busy one goes too)."""
    for mp, _ in points:
        subprocess.run(["umount", "-l", mp], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def clean(marker=None, session=None, pids=(), dirs=(), points=(), exclude=(), wait=0.0):
    """Finds what is left (after waiting up to `wait` seconds for processes to go by
    themselves), stops and unmounts it, removes `dirs` when nothing is mounted under them any
    more. Returns one line per leftover found."""
    exclude = set(exclude) | {os.getpid()}
    deadline = time.time() + wait
    while True:
        left = processes(marker, session, pids, exclude)
        if not left or time.time() >= deadline:
            break
        time.sleep(0.1)
    found = [f"mount left behind: {mp} ({fs})" for mp, fs in mounts(dirs, points)]
    found += [f"process left running: {describe(p)}" for p in left]
    if left:
        stop(left)  # a daemon stopped unmounts its mount itself
    mnt = mounts(dirs, points)
    if mnt:
        unmount(mnt)  # what is left: dead mounts, and those of daemons that did not stop
    for d in dirs:
        if os.path.isdir(d) and not mounts([d]):
            shutil.rmtree(d, ignore_errors=True)
    return found


def _reap():
    """Reaper: reads "test PID START", "mark VALUE", "session N", "pid N START", "dir PATH",
    "mount PATH" lines from stdin until EOF (the test is exiting, however), waits until the test
    process is gone, then cleans up after it."""
    test, marker, session, pids, dirs, points = None, None, None, {}, [], []
    for line in sys.stdin:
        kind, _, arg = line.rstrip("\n").partition(" ")
        if kind == "test":
            p, s = arg.split()
            test = (int(p), int(s))
        elif kind == "mark":
            marker = arg
        elif kind == "session":
            session = int(arg)
        elif kind == "pid":
            p, s = arg.split()
            pids[int(p)] = int(s)
        elif kind == "dir":
            dirs.append(arg)
        elif kind == "mount":
            points.append(arg)
    if test is not None:  # the test still runs its own exit checks after closing our stdin
        while start_time(test[0]) == test[1] and (_stat(test[0]) or ("Z",))[0] not in ("Z", "X"):
            time.sleep(0.05)
    found = clean(marker, session, pids, dirs, points, exclude={test[0]} if test else ())
    for f in found:
        try:
            print(f"# harness reaper: {f} (cleaned up)", file=sys.stderr, flush=True)
        except OSError:
            pass  # nobody reads our stderr any more
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("reap", help="clean up after a test once stdin closes (harness.py)")
    c = sub.add_parser("check", help="report and remove what a run left; exit 1 if anything")
    c.add_argument("--marker", help="NAME=value in the environment of every program of the run")
    c.add_argument("--dir", action="append", default=[], help="the run's temporary directory")
    a = ap.parse_args()
    if a.cmd == "reap":
        return _reap()
    # Not our own session or ancestors: the check runs beside the run it checks.
    ancestors, p = set(), os.getppid()
    while p > 1 and p not in ancestors:
        ancestors.add(p)
        try:
            with open(f"/proc/{p}/stat", "rb") as f:
                p = int(f.read().rsplit(b")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
    found = clean(marker=a.marker, dirs=a.dir, exclude=ancestors, wait=5.0)
    for f in found:
        print(f"left behind by the tests: {f}")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
