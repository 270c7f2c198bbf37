#!/usr/bin/env python3
"""The fill backlog's RAM is bounded (fs/write_back.h, issue 16): a storm of inline "store"
requests, pipelined on one control connection faster than the cache store commits them, must
not grow ghostfs's RSS past the bound (fill_backlog_max, default 64 MiB) plus a fixed slack:
the stores are answered later (back pressure: the control server stops reading a client owed
too many answers), never refused and never lost. Every store is answered "stored", every object
is in the index afterwards and reads back byte-identical, and another control client is answered
promptly throughout. A second storm against a bound of 32 KiB (--fill-backlog-max) shows the
stores held back and the backlog's count within it. Run on a daemon without the bound, ghostfs
held every queued fill (here +132 MB; 1.27 GB at a million 512-byte objects). TAP; skipped
without root or /dev/fuse."""
import base64
import hashlib
import json
import os
import socket
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(__file__))
import harness as h  # noqa: E402

# Under ASan a freed block sits in the sanitizer's quarantine (256 MB by default) before it is
# reused: a storm of 281 MB of bodies grew an ASan ghostfs by 341 MB with the backlog at 0.09 MB.
# That is the tool's memory, not the daemon's; a small quarantine keeps the RSS check about ours.
os.environ["ASAN_OPTIONS"] = os.environ.get("ASAN_OPTIONS", "") + ":quarantine_size_mb=8"

PLAN = 12
# 16000 × 12 KiB = 188 MB of bodies, 2.9× the 64 MiB bound (24000 took 219 s of the test's
# 300 in stop 29's CI, ASan beside a cold build).
N = int(os.environ.get("GHOST_FILL_STORM", "16000"))
N_SMALL = 8000            # the second storm, against a bound of SMALL_BOUND
SMALL_BOUND = 32 << 10  # two fills: with the write queue merging behind a busy writer (advfs11) the
#                          storm no longer passes 256 KiB (peak 215 KB), so the holds would not engage
BODY = 12 * 1024          # under the inline limit (16 KiB)
BOUND = 64 << 20          # ghostfs's default fill_backlog_max
SLACK = 48 << 20          # held requests, socket buffers, sqlite's cache, malloc's slack


def body_of(i):
    seed = hashlib.sha256(str(i).encode()).digest()
    return (seed * (BODY // len(seed) + 1))[:BODY]


def key_of(i, prefix="o"):
    return f"http://storm.test/{prefix}/{i}"


def rss_kb(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def storm(t, fs, sock_path, n, prefix, bound):
    """`n` inline stores of BODY bytes pipelined on one connection while ghostfs's RSS is
    sampled and another client asks for stats; checks that all are stored, indexed and
    readable, and returns (RSS growth in bytes, the daemon's stats)."""
    pid = fs.proc.pid
    ctl = h.Control(sock_path)
    have = ctl.ok("stats")["cache"]["objects"]
    # A few stores first, so the RSS baseline includes what any fill brings in (sqlite's pages).
    for i in range(n, n + 64):
        ctl.ok("store", key=key_of(i, prefix), body_base64=base64.b64encode(body_of(i)).decode(),
               content_type="application/octet-stream")
    h.wait_for(lambda: ctl.ok("stats")["cache"]["objects"] >= have + 64, timeout=60)
    base_rss = rss_kb(pid)

    conn = socket.socket(socket.AF_UNIX)
    conn.connect(sock_path)
    replies = {}
    errors = []

    def reader():
        f = conn.makefile("r")
        while len(replies) < n:
            line = f.readline()
            if not line:
                errors.append(f"the connection closed after {len(replies)} answers")
                return
            r = json.loads(line)
            replies[r.get("id")] = r

    def writer():
        try:
            for i in range(n):
                req = {"id": i, "op": "store", "key": key_of(i, prefix), "content_type": "application/octet-stream",
                       "body_base64": base64.b64encode(body_of(i)).decode()}
                conn.sendall((json.dumps(req) + "\n").encode())
        except OSError as e:
            errors.append(f"writing the storm: {e}")

    rt = threading.Thread(target=reader, daemon=True)
    wt = threading.Thread(target=writer, daemon=True)
    t0 = time.monotonic()
    rt.start()
    wt.start()
    peak = base_rss
    stats_lat = []  # another client's stats during the storm: the daemon is not stuck
    other = h.Control(sock_path)
    while rt.is_alive() and time.monotonic() < t0 + 600:
        peak = max(peak, rss_kb(pid))
        s0 = time.monotonic()
        other.ok("stats")
        stats_lat.append(time.monotonic() - s0)
        peak = max(peak, rss_kb(pid))
        time.sleep(0.05)
    wt.join(timeout=60)
    rt.join(timeout=60)
    storm_s = time.monotonic() - t0
    ok = [r for r in replies.values() if r.get("ok") and r["result"].get("stored") == BODY]
    t.check(not errors and len(ok) == n,
            f"every one of {n} stores of {BODY} B pipelined on one connection is answered \"stored\"",
            f"{len(ok)} stored of {len(replies)} answers; {errors[:3]}; a bad one: "
            f"{next((r for r in replies.values() if not r.get('ok')), None)}")
    indexed = h.wait_for(lambda: ctl.ok("stats")["cache"]["objects"] >= have + n + 64, timeout=300)
    st = ctl.ok("stats")
    t.check(indexed, f"all {n + 64} objects are in the index afterwards",
            f"{st['cache']['objects'] - have} indexed; write queue {st.get('write_queue')}")
    # Peak RSS after the storm too: the index may still have been catching up.
    peak = max(peak, rss_kb(pid))
    wq = st.get("write_queue", {})
    print(f"# storm of {n} against a bound of {bound >> 10} KiB: {storm_s:.1f} s; RSS {base_rss / 1024:.1f} MB "
          f"before, peak {peak / 1024:.1f} MB (+{(peak - base_rss) / 1024:.1f} MB; {n * BODY / 2**20:.0f} MB of "
          f"bodies stored); fill backlog peak {wq.get('fill_backlog_peak', 0) / 2**20:.2f} MB; "
          f"{st['proxy'].get('held')} requests held in all; {wq.get('writes')} writes, at most "
          f"{wq.get('most_merged')} batches in one; slowest stats {max(stats_lat or [0]) * 1000:.0f} ms",
          flush=True)
    # Answered during the storm, not after it (a daemon that serves one connection until its
    # input is gone answers the other only when the storm ends): within 5 s, or a quarter of
    # the storm where the machine stretched it. Stop 29's CI (cold build beside, load ~12):
    # slowest 7.1 s in a 58.5 s storm, the daemon at SCHED_IDLE among a dozen compilers.
    within = max(5.0, storm_s / 4)
    t.check(stats_lat and max(stats_lat) < within,
            f"another control client was answered within {within:.0f} s throughout the {storm_s:.0f} s storm",
            f"slowest stats {max(stats_lat or [0]):.2f} s of {len(stats_lat)}")
    bad = []
    for i in list(range(0, n, max(1, n // 40))) + [n - 1]:
        got = ctl.ok("lookup", key=key_of(i, prefix))
        if "body_base64" in got:
            data = base64.b64decode(got["body_base64"])
        elif "path" in got:
            with open(got["path"], "rb") as f:
                data = f.read()
        else:
            data = None
        if data != body_of(i):
            bad.append(i)
    t.check(not bad, "stored objects read back byte-identical (a sample of 41)", f"differ: {bad[:10]}")
    other.close()
    conn.close()
    ctl.close()
    return (peak - base_rss) * 1024, st


def main():
    h.require_root_and_fuse()
    t = h.Tap(PLAN)
    work = h.tempdir()
    mnt = os.path.join(work, "mnt")
    os.makedirs(mnt)
    sock_path = os.path.join(work, "control.sock")
    cache = os.path.join(work, "cache")
    fs = h.Ghostfs(mnt, cache, {}, control=sock_path)
    if not t.check(fs.start(), "mounts with a control socket", fs.output()):
        t.skip_rest(PLAN, "not mounted")
        t.done()
    # The default bound: the storm outruns the commit here only on a daemon without the
    # writer's merged batches (ghostfs kept up at 24000 x 12 KiB with them, 2.2 MB of backlog).
    grew, _ = storm(t, fs, sock_path, N, "o", BOUND)
    t.check(grew <= BOUND + SLACK,
            f"ghostfs's RSS grew by at most the fill backlog's bound + {SLACK >> 20} MiB during the storm",
            f"grew {grew / 2**20:.1f} MB")
    fs.stop()

    # A bound the storm does pass: the stores wait for it, none is lost.
    fs = h.Ghostfs(mnt, cache, {}, control=sock_path, args=["--fill-backlog-max", str(SMALL_BOUND)])
    if not t.check(fs.start(), "mounts again with --fill-backlog-max 32K", fs.output()):
        t.skip_rest(PLAN, "not mounted")
        t.done()
    grew, st = storm(t, fs, sock_path, N_SMALL, "small", SMALL_BOUND)
    wq = st.get("write_queue", {})
    cost = BODY + 4 * len(key_of(N_SMALL, "small")) + len("application/octet-stream") + 1024
    t.check(wq.get("fill_backlog_max") == SMALL_BOUND and
            wq.get("fill_backlog_peak", 1 << 62) <= SMALL_BOUND + cost and
            st["proxy"].get("held", 0) > 0 and grew <= SLACK,
            "the backlog stayed within its bound (+ one fill), stores were held back to keep it, "
            f"and RSS grew by at most {SLACK >> 20} MiB",
            json.dumps({"write_queue": wq, "held": st["proxy"].get("held"), "rss_growth": grew}))
    fs.stop()
    t.done()


if __name__ == "__main__":
    # meson stops the test at 300 s: before that, a hang reports where it waits
    with h.Watchdog(270, h.tracked_alive):
        main()
