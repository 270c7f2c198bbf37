#!/usr/bin/env python3
"""The fill backlog's RAM is bounded (fs/write_back.h, issue 16): a storm of inline "store"
requests, pipelined on one control connection faster than the cache store commits them, must
not grow ghostfs's RSS past the bound (fill_backlog_max, default 64 MiB) plus a fixed slack:
the stores are answered later (back pressure: the control server stops reading a client owed
too many answers), never refused and never lost. Every store is answered "stored", every object
is in the index afterwards and reads back byte-identical, and another control client is answered
promptly throughout. Run on a daemon without the bound, ghostfs held every queued fill (1.27 GB
at a million 512-byte objects). TAP; skipped without root or /dev/fuse."""
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

PLAN = 7
N = int(os.environ.get("GHOST_FILL_STORM", "24000"))
BODY = 12 * 1024          # under the inline limit (16 KiB)
BOUND = 64 << 20          # ghostfs's default fill_backlog_max
SLACK = 48 << 20          # held requests, socket buffers, sqlite's cache, malloc's slack


def body_of(i):
    seed = hashlib.sha256(str(i).encode()).digest()
    return (seed * (BODY // len(seed) + 1))[:BODY]


def key_of(i):
    return f"http://storm.test/o/{i}"


def rss_kb(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def main():
    h.require_root_and_fuse()
    t = h.Tap(PLAN)
    work = h.tempdir()
    mnt = os.path.join(work, "mnt")
    os.makedirs(mnt)
    sock_path = os.path.join(work, "control.sock")
    fs = h.Ghostfs(mnt, os.path.join(work, "cache"), {}, control=sock_path)
    if not t.check(fs.start(), "mounts with a control socket", fs.output()):
        t.skip_rest(PLAN, "not mounted")
        t.done()
    pid = fs.proc.pid
    ctl = h.Control(sock_path)
    # A few stores first, so the RSS baseline includes what any fill brings in (sqlite's pages).
    for i in range(N, N + 64):
        ctl.ok("store", key=key_of(i), body_base64=base64.b64encode(body_of(i)).decode(),
               content_type="application/octet-stream")
    h.wait_for(lambda: ctl.ok("stats")["cache"]["objects"] >= 64, timeout=60)
    base_rss = rss_kb(pid)

    # The storm: one connection, every request written without waiting for answers.
    storm = socket.socket(socket.AF_UNIX)
    storm.connect(sock_path)
    replies = {}
    errors = []

    def reader():
        f = storm.makefile("r")
        while len(replies) < N:
            line = f.readline()
            if not line:
                errors.append(f"the connection closed after {len(replies)} answers")
                return
            r = json.loads(line)
            replies[r.get("id")] = r

    def writer():
        try:
            for i in range(N):
                req = {"id": i, "op": "store", "key": key_of(i), "content_type": "application/octet-stream",
                       "body_base64": base64.b64encode(body_of(i)).decode()}
                storm.sendall((json.dumps(req) + "\n").encode())
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
    deadline = t0 + 600
    while rt.is_alive() and time.monotonic() < deadline:
        peak = max(peak, rss_kb(pid))
        s0 = time.monotonic()
        st = other.ok("stats")
        stats_lat.append(time.monotonic() - s0)
        peak = max(peak, rss_kb(pid))
        time.sleep(0.05)
    wt.join(timeout=60)
    rt.join(timeout=60)
    storm_s = time.monotonic() - t0
    ok = [r for r in replies.values() if r.get("ok") and r["result"].get("stored") == BODY]
    t.check(not errors and len(ok) == N,
            f"every one of {N} stores of {BODY} B pipelined on one connection is answered \"stored\"",
            f"{len(ok)} stored of {len(replies)} answers; {errors[:3]}; a bad one: "
            f"{next((r for r in replies.values() if not r.get('ok')), None)}")

    indexed = h.wait_for(lambda: ctl.ok("stats")["cache"]["objects"] >= N + 64, timeout=300)
    st = ctl.ok("stats")
    t.check(indexed, f"all {N + 64} objects are in the index afterwards",
            f"{st['cache']['objects']} indexed; write queue {st.get('write_queue')}")

    grew = (peak - base_rss) * 1024
    wq = st.get("write_queue", {})
    print(f"# storm {storm_s:.1f} s; RSS {base_rss / 1024:.1f} MB before, peak {peak / 1024:.1f} MB "
          f"(+{grew / 2**20:.1f} MB; {N * BODY / 2**20:.0f} MB of bodies stored); fill backlog peak "
          f"{wq.get('fill_backlog_peak', 0) / 2**20:.1f} MB of {wq.get('fill_backlog_max', 0) / 2**20:.0f} MB; "
          f"{st['proxy'].get('held')} requests held; {wq.get('writes')} writes, at most "
          f"{wq.get('most_merged')} batches in one; stats p_max {max(stats_lat or [0]) * 1000:.0f} ms",
          flush=True)
    t.check(grew <= BOUND + SLACK,
            f"ghostfs's RSS grew by at most the fill backlog's bound + {SLACK >> 20} MiB during the storm",
            f"grew {grew / 2**20:.1f} MB (peak {peak / 1024:.1f} MB, before {base_rss / 1024:.1f} MB)")
    t.check(wq.get("fill_backlog_max") == BOUND and
            wq.get("fill_backlog_peak", 1 << 62) <= BOUND + 2 * BODY + 4096 and
            st["proxy"].get("held", 0) > 0,
            "the backlog's own count stayed within its bound, and stores were held back to keep it",
            json.dumps({"write_queue": wq, "held": st["proxy"].get("held")}))
    t.check(stats_lat and max(stats_lat) < 5.0,
            "another control client was answered within 5 s throughout the storm",
            f"slowest stats {max(stats_lat or [0]):.2f} s of {len(stats_lat)}")

    bad = []
    for i in list(range(0, N, max(1, N // 40))) + [N - 1]:
        got = ctl.ok("lookup", key=key_of(i))
        data = base64.b64decode(got["body_base64"]) if "body_base64" in got else open(got["path"], "rb").read()
        if data != body_of(i):
            bad.append(i)
    t.check(not bad, "stored objects read back byte-identical (a sample of 41)", f"differ: {bad[:10]}")
    other.close()
    storm.close()
    ctl.close()
    t.done()


if __name__ == "__main__":
    main()
