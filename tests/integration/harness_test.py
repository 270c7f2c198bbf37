#!/usr/bin/env python3
"""The harness leaves nothing behind (tests/integration/leftovers.py): a test that forgets a
mounted ghostfs and a daemon fails with a "left no process and no mount behind" line and they
are removed; a test killed the way meson's timeout kills one (SIGTERM to its process group,
SIGKILL 0.5 s later) while a ghostfs is mounted, a daemonised one too, is cleaned up by the
reaper: no mount (dead or alive), no process, no temporary directory. A ghostfs whose mount
another mount namespace copied (`unshare -m`, private propagation, as `ip netns exec` makes one)
still ends at Ghostfs.stop(): the harness names the holder and aborts the FUSE connection, and the
daemon runs its unmount flush and exits 0 instead of being killed 30 s later. TAP; skips without
root, /dev/fuse or nginx."""
import os
import signal
import subprocess
import sys
import textwrap
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness as h  # noqa: E402

PLAN = 7

# A test that mounts a ghostfs on nginx and, for "forget", drops its cleanups (a test that
# loses track of what it started) and daemonises a second ghostfs no cleanup knows about; for
# "hang", waits to be killed. It prints its work directory and the pids first.
CHILD = textwrap.dedent("""
    import os, subprocess, sys, time
    sys.path.insert(0, {here!r})
    import harness as h
    mode = sys.argv[1]
    work, root, sums, nginx = h.serve_tree()
    t = h.Tap(1)
    mnt = os.path.join(work, "mnt")
    os.makedirs(mnt)
    fs = h.Ghostfs(mnt, os.path.join(work, "cache"), {{"www": nginx.url()}})
    ok = fs.start()
    mnt2 = os.path.join(work, "mnt2")
    os.makedirs(mnt2)
    r = subprocess.run([os.path.join(h.build_dir(), "fs", "ghostfs"), "--cache", os.path.join(work, "cache2"),
                        "--origin", "www=" + nginx.url(), mnt2])
    ok = ok and r.returncode == 0 and h.wait_for(lambda: os.path.ismount(mnt2), 10)
    print("# work " + work + " pids " + str(fs.proc.pid) + " " + str(nginx.proc.pid), flush=True)
    t.check(ok, "mounted")
    if mode == "forget":
        h._cleanups.clear()
        t.done()
    while True:
        time.sleep(1)
""")


def run_child(t, mode, work):
    script = os.path.join(work, f"child-{mode}.py")
    with open(script, "w") as f:
        f.write(CHILD.format(here=os.path.dirname(os.path.abspath(__file__))))
    out = os.path.join(work, f"child-{mode}.out")
    p = subprocess.Popen([sys.executable, script, mode], stdout=open(out, "w"), stderr=subprocess.STDOUT,
                         start_new_session=True)  # its own session and group, as meson runs a test
    if mode == "hang":
        h.wait_for(lambda: "ok 1 - mounted" in open(out).read(), 30)
        os.killpg(p.pid, signal.SIGTERM)  # meson's timeout: SIGTERM, 0.5 s, SIGKILL to the group
        time.sleep(0.5)
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except OSError:
            pass
    try:
        p.wait(60)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()
    text = open(out).read()
    cwork, pids = None, []
    for line in text.splitlines():
        if line.startswith("# work "):
            parts = line.split()
            cwork, pids = parts[2], [int(x) for x in parts[4:]]
    return p.returncode, text, cwork, pids


def gone(cwork, pids):
    """(nothing left, what is left): no mount under the child's work directory, its ghostfs and
    nginx gone, no process carrying a ghostfs of its work directory, the directory removed."""
    left = [f"mount {m}" for m, _ in h.leftovers.mounts([cwork])] if cwork else []
    left += [f"pid {p}" for p in pids if os.path.exists(f"/proc/{p}") and
             open(f"/proc/{p}/stat").read().split(")")[-1].split()[0] not in "ZX"]
    for pid in os.listdir("/proc"):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if cwork and cwork.encode() in f.read():
                    left.append(f"process {pid} of {cwork}")
        except OSError:
            pass
    if cwork and os.path.exists(cwork):
        left.append(f"directory {cwork}")
    return not left and cwork is not None, left


def main():
    h.require_root_and_fuse()
    if not os.path.exists(os.path.join(h.build_dir(), "fs", "ghostfs")):
        h.skip_all("ghostfs is not built")
    work = h.tempdir()
    t = h.Tap(PLAN)

    rc, text, cwork, pids = run_child(t, "forget", work)
    if "ok 1 - mounted" not in text:
        if "1..0 # SKIP" in text:  # what the child needs is missing here (nginx)
            t.skip_rest(PLAN, "the child test was skipped: " + text[-300:].replace("\n", " "))
        else:
            t.check(False, "the child test mounts", text[-1500:])
            t.skip_rest(PLAN, "the child test did not mount")
        t.done()
    t.check(rc != 0 and "not ok 2 - the test left no process and no mount behind" in text,
            "a test that leaves a mount and daemons behind fails, naming them", text[-1500:])
    t.check(all(w in text for w in ("mount left behind: " + os.path.join(cwork, "mnt2"),
                                    "process left running")),
            "the failure names the daemonised ghostfs's mount and the processes left", text[-1500:])
    h.wait_for(lambda: gone(cwork, pids)[0], 10)
    ok, left = gone(cwork, pids)
    t.check(ok, "and they are removed: no mount, no process, no directory", left)

    rc, text, cwork, pids = run_child(t, "hang", work)
    t.check("ok 1 - mounted" in text and rc in (-signal.SIGKILL, -signal.SIGTERM, 1),
            "a test killed as meson's timeout kills one (SIGTERM, then SIGKILL to its group)",
            f"exit {rc}\n{text[-1000:]}")
    h.wait_for(lambda: gone(cwork, pids)[0], 20)
    ok, left = gone(cwork, pids)
    t.check(ok, "its reaper unmounts its ghostfs mounts, stops its daemons and removes its "
            "directory", left)

    # A copy of the mount in another mount namespace, made after the mount, alive past stop().
    mnt, cache = os.path.join(work, "held"), os.path.join(work, "held-cache")
    os.makedirs(mnt)
    ctl = os.path.join(work, "held.sock")
    fs = h.Ghostfs(mnt, cache, {}, control=ctl, args=["--profile", "ipaq-2004", "--knob", "0",
                                                      "--flash-log", os.path.join(work, "held-flash") + ":4M"])
    if not fs.start():
        t.check(False, "a ghostfs mounts for the held-mount case", fs.output()[-800:])
        t.skip_rest(1, "not mounted")
        t.done()
    asleep = h.wait_for(lambda: any(d["kind"] == "disk" and d["mode"] == "standby"
                                    for d in h.ghostctl_json(ctl, "devices")), 20)
    holder = subprocess.Popen(["unshare", "-m", "--propagation", "private", "sleep", "120"])
    h.on_exit(holder.kill)
    h.wait_for(lambda: bool(h.mount_copies(fs.dev)), 10)
    with open(os.path.join(mnt, "local", "saved.txt"), "wb") as f:
        f.write(b"saved before the unmount\n")
        f.flush()
        os.fsync(f.fileno())  # into the flash log: the disk sleeps, the unmount flush applies it
    fs.stop()
    with open(os.path.join(cache, "local", "saved.txt"), "rb") as f:
        on_disk = f.read()
    t.check(any(str(holder.pid) in held for held in fs.held_elsewhere) and not fs.stop_killed
            and fs.exit_code == 0 and fs.stop_seconds < 20,
            "a ghostfs still mounted in another mount namespace after its unmount: the harness names "
            "the holder and aborts the connection; the daemon exits 0",
            f"held elsewhere {fs.held_elsewhere}, killed {fs.stop_killed}, exit {fs.exit_code}, "
            f"{fs.stop_seconds:.1f} s")
    t.check(asleep and on_disk == b"saved before the unmount\n",
            "its unmount flush put the save the flash log held (the disk asleep) on the disk",
            f"disk asleep before the save: {asleep}; on the disk: {on_disk!r}")
    holder.kill()
    holder.wait()
    t.done()


if __name__ == "__main__":
    main()
