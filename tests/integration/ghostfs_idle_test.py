#!/usr/bin/env python3
"""The idle criterion of ghostfs: with no requests, from 30 s after the last activity, the
daemon's threads make no wake-ups over 60 s (the sum of voluntary and involuntary context
switches in /proc/PID/task/*/status), apart from device-mode timers the model itself scheduled.
The same for ghostproxy, run on mount (b) and measured in the same window. nginx
closes idle keep-alive connections after 5 s here, so the proxy's pooled origin connection is
gone before the window (its close is the origin's doing, not a timer of ours).

Two mounts against one nginx, measured over the same window to keep the suite short:
  (a) without --profile: the devices are always ready, nothing is scheduled: 0 switches;
  (b) with --profile ipaq-2004: the emulated disk steps down ~2.5 s and ~4.4 s after its last
      I/O and the card returns to PSM ~1 s after its last transfer; 30 s later nothing is
      scheduled any more, so 0 switches too.
Each daemon is checked twice: all of its threads (the criterion as stated), and its own
threads alone (the kernel's io_uring workers, iou-wrk-PID, left out), so a regression in the
daemon's loop is caught on its own. A daemon with no wake-ups must still answer afterwards
(a hung loop also makes none).

A window in which the kernel dropped or reclaimed its dentry and inode caches is not counted:
each inode of a mount the kernel forgets is a FUSE FORGET sent to the daemon, a wake-up that is
the kernel's doing, not the daemon's. Other tests of the suite do it (`echo 3 >
/proc/sys/vm/drop_caches`: ghostfs_tools, ghostfs_kept_backing, ghostfs_fresh_change,
ghostfs_inval), and so does memory pressure; /proc/vmstat's drop_slab and slabs_scanned say
whether it happened. Such a window is measured again (up to MAX_WINDOWS); if none was clean, the
counts are reported as skipped, never as passed. TAP; skipped without root, /dev/fuse or nginx."""
import hashlib
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
import harness as h  # noqa: E402

PLAN = 12
SETTLE_S = 30  # quiet time after the last activity before counting
WINDOW_S = 60  # the counted window
MAX_WINDOWS = 2  # windows tried while the kernel's cache drops void them (meson stops the test at 300 s)
RECLAIM_MARKS = ("drop_slab", "slabs_scanned")  # /proc/vmstat: dentries and inodes dropped or reclaimed
IO_WQ_PREFIX = "iou-wrk-"  # the kernel's io_uring worker threads (io-wq), shown as tasks


def task_switches(pid):
    """{tid: (name, voluntary + involuntary context switches)} for every thread of `pid`."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/status") as f:
                fields = dict(line.split(":", 1) for line in f if ":" in line)
        except OSError:  # the thread ended while we looked
            continue
        out[int(tid)] = (fields["Name"].strip(),
                         int(fields["voluntary_ctxt_switches"]) + int(fields["nonvoluntary_ctxt_switches"]))
    return out


def switches_between(before, after):
    """{tid: (name, switches in the window)}; a thread that ended or began counts at least 1."""
    diff = {}
    for tid in before.keys() | after.keys():
        name = (after.get(tid) or before.get(tid))[0]
        if tid not in after:
            diff[tid] = (name + " (ended)", 1)
        elif tid not in before:
            diff[tid] = (name + " (new)", max(1, after[tid][1]))
        else:
            diff[tid] = (name, after[tid][1] - before[tid][1])
    return diff


def report(label, diff):
    for tid, (name, n) in sorted(diff.items()):
        print(f"# {label}: thread {tid} {name}: {n} context switches", flush=True)


def own_total(diff):
    return sum(n for name, n in diff.values() if not name.startswith(IO_WQ_PREFIX))


def io_wq_todo(diff):
    """The TODO reason when every wake-up came from the kernel's io_uring workers, else None."""
    total = sum(n for _, n in diff.values())
    if total == 0 or own_total(diff) != 0:
        return None
    return ("ghostfs bug: UringFileIo's buffered writes are punted to the kernel's io-wq, whose "
            "last worker (iou-wrk-PID) never exits and wakes every ~5 s (io_wq_worker idle "
            "timeout) for the life of the daemon's thread")


def activity(fs, sums):
    """Reads (listing, several files) and a write to local/; True if all gave what they should."""
    www = os.path.join(fs.mnt, "www")
    ok = sorted(os.listdir(www)) == sorted(["small.txt", "empty.txt", "page.html", "medium.bin",
                                             "large.bin", "dir1", "dir2"])
    for rel in ["small.txt", "page.html", "medium.bin", "dir1/a.txt", "dir1/sub/deep.txt"]:
        ok = ok and h.sha256_file(os.path.join(www, rel)) == sums[rel]
    p = os.path.join(fs.mnt, "local", "idle-note.txt")
    with open(p, "w") as f:
        f.write("written before going idle\n")
    with open(p) as f:
        ok = ok and f.read() == "written before going idle\n"
    return ok


def main():
    work, root, sums, nginx = h.serve_tree(extra_location="keepalive_timeout 5s;")
    t = h.Tap(PLAN)

    mounts = {}
    ctl = os.path.join(work, "control.sock")
    for label, args, control in (("a", [], None), ("b", ["--profile", "ipaq-2004"], ctl)):
        mnt = os.path.join(work, "mnt-" + label)
        os.makedirs(mnt)
        mounts[label] = h.Ghostfs(mnt, os.path.join(work, "cache-" + label), {"www": nginx.url()},
                                  args=args, control=control)
    a, b = mounts["a"], mounts["b"]
    up_a = t.check(a.start(), "(a) mounts without --profile", a.output())
    up_b = t.check(b.start(), "(b) mounts with --profile ipaq-2004 and a control socket", b.output())
    if not (up_a and up_b):
        t.skip_rest(PLAN, "not mounted")
        t.done()

    port = h.free_port()
    proxy = subprocess.Popen([os.path.join(h.build_dir(), "proxy", "ghostproxy"), "--listen", f"127.0.0.1:{port}",
                              "--mount", b.mnt, "--control", ctl],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    h.on_exit(lambda: proxy.poll() is None and proxy.terminate())
    proxied = h.wait_port(port, 15)

    def via_proxy(rel):
        r = subprocess.run(["curl", "-s", "-x", f"http://127.0.0.1:{port}", nginx.url() + rel],
                           capture_output=True, timeout=30)
        return hashlib.sha256(r.stdout).hexdigest() == sums[rel]

    ok = activity(a, sums) and activity(b, sums)
    ok_proxy = proxied and via_proxy("dir1/b.bin") and via_proxy("dir1/b.bin") and via_proxy("medium.bin")
    last_activity = time.monotonic()
    t.check(ok, "activity on both mounts: reads match the origin and a local/ write reads back")
    t.check(ok_proxy, "(c) ghostproxy on mount (b) serves objects through its cache")

    # Nothing touches the mounts from here until the window has been counted.
    pids = {label: fs.proc.pid for label, fs in mounts.items()}
    pids["c"] = proxy.pid
    settle_from = {label: task_switches(pid) for label, pid in pids.items()}
    time.sleep(max(0.0, last_activity + SETTLE_S - time.monotonic()))
    clean = False
    for attempt in range(1, MAX_WINDOWS + 1):
        marks = h.vmstat(RECLAIM_MARKS)
        start = {label: task_switches(pid) for label, pid in pids.items()}
        t0 = time.monotonic()
        time.sleep(WINDOW_S)
        end = {label: task_switches(pid) for label, pid in pids.items()}
        after = h.vmstat(RECLAIM_MARKS)
        moved = {k: after[k] - marks[k] for k in marks if after.get(k) != marks[k]}
        print(f"# window {attempt}: {SETTLE_S + (attempt - 1) * WINDOW_S} s after the last activity, "
              f"{time.monotonic() - t0:.1f} s long", flush=True)
        for label in pids:
            if attempt == 1:
                report(f"({label}) settling, first {SETTLE_S} s", switches_between(settle_from[label], start[label]))
            report(f"({label}) window {attempt}", switches_between(start[label], end[label]))
        if not moved:
            clean = True
            break
        print(f"# window {attempt} not counted: the kernel dropped or reclaimed its dentry and inode caches "
              f"during it ({moved}); each inode it forgets is a FORGET that wakes the daemon", flush=True)
    voided = f"the kernel dropped or reclaimed its caches in each of {MAX_WINDOWS} windows"

    def judge(ok, name, detail, todo=None):
        if not clean:
            return t.skip(name, voided)
        if todo:  # a failure with a known cause is a shortfall, not a failure
            return t.shortfall(ok, name, todo, detail)
        t.check(ok, name, detail)

    for label, what in (("a", "without --profile"), ("b", "with ipaq-2004")):
        diff = switches_between(start[label], end[label])
        total = sum(n for _, n in diff.values())
        goal = (f"({label}) {what}: the daemon's threads make 0 context switches over {WINDOW_S} s "
                f"from {SETTLE_S} s after the last activity (saw {total})")
        detail = "\n".join(f"thread {tid} {name}: {n}" for tid, (name, n) in sorted(diff.items()))
        judge(total == 0, goal, detail, io_wq_todo(diff))
        own = own_total(diff)
        judge(own == 0,
              f"({label}) {what}: the daemon's own threads (io_uring kernel workers aside) make "
              f"0 context switches in the window (saw {own})",
              "\n".join(f"thread {tid} {name}: {n}" for tid, (name, n) in sorted(diff.items())))

    diff = switches_between(start["c"], end["c"])
    total = sum(n for _, n in diff.values())
    judge(total == 0, f"(c) ghostproxy's threads make 0 context switches over {WINDOW_S} s from {SETTLE_S} s "
          f"after the last request (saw {total})",
            "\n".join(f"thread {tid} {name}: {n}" for tid, (name, n) in sorted(diff.items())))

    # (b)'s zero means something only if the model ran: its timers stepped the devices down
    # before the window (asked only now, after the counting).
    exe = os.path.join(h.build_dir(), "fs", "ghostctl")
    r = subprocess.run([exe, "--control", ctl, "--json", "devices"], capture_output=True, text=True, timeout=30)
    try:
        modes = {d["kind"]: d["mode"] for d in json.loads(r.stdout)}
    except (ValueError, KeyError, TypeError):
        modes = {}
    t.check(modes.get("disk") == "standby" and modes.get("network") == "PSM",
            "(b) the model's timers ran before the window: the disk is in standby, the card in PSM",
            (modes, r.stdout, r.stderr))

    # No wake-ups from a hung loop would also be 0: both daemons must still answer.
    ok = all(fs.proc.poll() is None and
             h.sha256_file(os.path.join(fs.mnt, "www", "dir1", "b.bin")) == sums["dir1/b.bin"]
             for fs in mounts.values())
    t.check(ok, "both daemons still serve reads after the idle period")
    # (Not counted: after the window.) The proxy must answer too.
    t.check(proxy.poll() is None and via_proxy("dir1/b.bin"), "(c) ghostproxy still serves after the idle period")
    proxy.terminate()
    for fs in mounts.values():
        fs.stop()
    t.done()


if __name__ == "__main__":
    main()
