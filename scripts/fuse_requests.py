#!/usr/bin/env python3
"""What one small cached read through ghostfs costs in FUSE requests, and how long it takes
beside a direct read of the same bytes: builds side by side, interleaved round by round.

For each ghostfs executable given, mounts a fresh cache over one nginx origin (the tree of
bench_fs.py: 200 files of 4–32 KiB), reads every small file once (the fill), then for each
round and each mount (rotating the order) drops the kernel's caches (sync; drop_caches=3, as
bench-fs does before a round) and times open+read+close of every file in a shuffled order, the
direct read of the origin's files in the same rounds. With --trace, the kernel's fuse
tracepoints (fuse_request_send / fuse_request_end, Linux >= 6.13) are recorded for the mount
during its rounds: requests per read by opcode and the time each waited for its reply.

  scripts/fuse_requests.py --ghostfs build/fs/ghostfs [--ghostfs other/ghostfs] [--rounds 5]
                           [--trace] [--files 200] [--json out.json]

Needs root, /dev/fuse and nginx. Prints one table; every mount and process is removed on exit.
"""
import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "tests", "integration"))
import bench_fs  # noqa: E402  (make_tree, read_whole, sync_and_drop)
import harness  # noqa: E402  (Nginx)

TRACING = "/sys/kernel/tracing"


def pct(values, p):
    v = sorted(values)
    return v[min(len(v) - 1, int(round(p / 100.0 * (len(v) - 1))))]


class Tracer:
    """The fuse tracepoints, filtered to one connection at a time."""

    def __init__(self):
        if not os.path.isdir(os.path.join(TRACING, "events", "fuse")):
            subprocess.run(["mount", "-t", "tracefs", "nodev", TRACING], stderr=subprocess.DEVNULL)
        self.ok = os.path.isdir(os.path.join(TRACING, "events", "fuse"))

    def _w(self, rel, text):
        with open(os.path.join(TRACING, rel), "w") as f:
            f.write(text)

    def start(self, conn):
        self._w("buffer_size_kb", "8192")
        self._w("trace", "")
        for ev in ("fuse_request_send", "fuse_request_end"):
            self._w(f"events/fuse/{ev}/filter", f"connection == {conn}")
            self._w(f"events/fuse/{ev}/enable", "1")

    def stop(self):
        for ev in ("fuse_request_send", "fuse_request_end"):
            self._w(f"events/fuse/{ev}/enable", "0")
            self._w(f"events/fuse/{ev}/filter", "0")
        with open(os.path.join(TRACING, "trace")) as f:
            text = f.read()
        self._w("trace", "")
        return text


def parse_trace(text):
    """{opcode name: [latency µs, ...]} from fuse_request_send/end lines."""
    sent = {}
    out = {}
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        try:
            head, rest = line.split(": fuse_request_", 1)
            ts = float(head.split()[-1].rstrip(":"))
        except ValueError:
            continue
        f = rest.split()
        if rest.startswith("send"):
            req = f[f.index("req") + 1]
            op = f[f.index("opcode") + 2].strip("()").replace("FUSE_", "")
            sent[req] = (op, ts)
        elif rest.startswith("end"):
            req = f[f.index("req") + 1]
            if req in sent:
                op, t0 = sent.pop(req)
                out.setdefault(op, []).append((ts - t0) * 1e6)
    for op, t0 in sent.values():  # never answered (FORGET) or still pending
        out.setdefault(op, [])
    return out


class Mount:
    def __init__(self, work, exe, url, idx):
        self.exe = exe
        self.name = f"{idx}:{os.path.relpath(exe)}"
        self.mnt = os.path.join(work, f"mnt{idx}")
        self.cache = os.path.join(work, f"cache{idx}")
        self.control = os.path.join(work, f"ctl{idx}.sock")
        os.makedirs(self.mnt)
        os.makedirs(self.cache)
        self.log = open(os.path.join(work, f"ghostfs{idx}.log"), "w")
        self.proc = subprocess.Popen([exe, "-f", "--cache", self.cache, "--control", self.control,
                                      "--origin", f"www={url}", self.mnt],
                                     stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        self.root = os.path.join(self.mnt, "www")
        deadline = time.time() + 20
        while time.time() < deadline and not bench_fs.is_mounted(self.mnt):
            if self.proc.poll() is not None:
                raise SystemExit(f"{exe} exited before mounting")
            time.sleep(0.05)
        self.conn = bench_fs.fuse_conn_id(self.mnt)

    def settle(self):
        ctl = os.path.join(os.path.dirname(self.exe), "ghostctl")
        if os.access(ctl, os.X_OK):
            subprocess.run([ctl, "--control", self.control, "flush"], stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, timeout=60)

    def stop(self):
        if bench_fs.is_mounted(self.mnt):
            if bench_fs.run_bounded(["fusermount3", "-u", self.mnt], 15) != 0:
                bench_fs.abort_fuse(self.mnt)
                bench_fs.run_bounded(["umount", "-l", self.mnt], 15)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def time_reads(root, files):
    lat = []
    clock = time.perf_counter_ns
    for rel, size, _ in files:
        p = os.path.join(root, rel)
        t0 = clock()
        data = bench_fs.read_whole(p, size)
        t1 = clock()
        if len(data) != size:
            raise SystemExit(f"{p}: read {len(data)} bytes, want {size}")
        lat.append((t1 - t0) / 1000.0)
    return lat


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ghostfs", action="append", required=True)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--files", type=int, default=200)
    ap.add_argument("--trace", action="store_true")
    ap.add_argument("--json")
    ap.add_argument("--perf", help="perf record the first mount's daemon during the rounds into this file")
    a = ap.parse_args()
    work = tempfile.mkdtemp(prefix="fuse-requests-", dir="/var/tmp")
    origin = os.path.join(work, "origin")
    _, small = bench_fs.make_tree(origin, a.files, 1, 7)
    nginx = harness.Nginx(origin)
    if not nginx.start():
        raise SystemExit("nginx did not start")
    mounts = []
    tracer = Tracer() if a.trace else None
    if tracer and not tracer.ok:
        print("fuse tracepoints not available: no request counts", file=sys.stderr)
        tracer = None
    try:
        for i, exe in enumerate(a.ghostfs):
            m = Mount(work, os.path.abspath(exe), nginx.url(), i)
            mounts.append(m)
            os.listdir(os.path.join(m.root, bench_fs.SMALL_DIR))
            time_reads(m.root, small)  # the fill
            m.settle()
        lat = {m.name: [] for m in mounts}
        lat["direct"] = []
        traces = {m.name: {} for m in mounts}
        targets = [None] + mounts
        load = [os.getloadavg()[0]]
        perf = None
        if a.perf:
            cmd = ["perf", "record", "-F", "4999", "--call-graph", "dwarf", "-o", a.perf]
            if a.perf.endswith(".strace"):
                cmd = ["strace", "-f", "-tt", "-T", "-o", a.perf]
            perf = subprocess.Popen(cmd + ["-p", str(mounts[0].proc.pid)],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            time.sleep(1)
        for rnd in range(a.rounds):
            order = small[:]
            random.Random(rnd).shuffle(order)
            rot = targets[rnd % len(targets):] + targets[:rnd % len(targets)]
            for m in rot:
                bench_fs.sync_and_drop()
                if m is None:
                    lat["direct"] += time_reads(origin, order)
                    continue
                if tracer:
                    tracer.start(m.conn)
                lat[m.name] += time_reads(m.root, order)
                if tracer:
                    for op, v in parse_trace(tracer.stop()).items():
                        traces[m.name].setdefault(op, []).extend(v)
        load.append(os.getloadavg()[0])
        if perf:
            perf.send_signal(2)
            perf.wait(30)
        d50 = statistics.median(lat["direct"])
        print(f"small cached read, {len(small)} files x {a.rounds} rounds, caches dropped before each round; "
              f"load {load[0]:.1f} -> {load[1]:.1f}")
        print(f"{'':40s} {'p50 us':>8s} {'p95 us':>8s} {'x direct':>8s}")
        for name, v in lat.items():
            print(f"{name:40s} {statistics.median(v):8.0f} {pct(v, 95):8.0f} {statistics.median(v) / d50:7.2f}x")
        if tracer:
            n = len(small) * a.rounds
            for name, ops in traces.items():
                print(f"\nFUSE requests per read ({name}): opcode, count per read, reply wait p50/mean us")
                for op, v in sorted(ops.items(), key=lambda kv: -len(kv[1])):
                    c = len(v) if v else 0
                    if v:
                        print(f"  {op:12s} {c / n:6.2f}   {statistics.median(v):7.1f} {statistics.mean(v):7.1f}")
                    else:
                        print(f"  {op:12s}   (no reply)")
        if a.json:
            with open(a.json, "w") as f:
                json.dump({"lat_us": lat, "load": load,
                           "trace": {k: {op: v for op, v in ops.items()} for k, ops in traces.items()}}, f)
    finally:
        if tracer:
            try:
                tracer.stop()
            except OSError:
                pass
        for m in mounts:
            m.stop()
        nginx.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
