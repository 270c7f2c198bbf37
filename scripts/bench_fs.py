#!/usr/bin/env python3
"""Side-by-side file-system benchmark: ghostfs vs httpdirfs vs rclone mount vs the local disk.

Called by scripts/bench-fs.sh (which installs the packages, builds ghostfs and cleans up
after us even if we are killed). One nginx on 127.0.0.1 serves a generated tree (one 64 MiB
file, ~200 files of 4–32 KiB); every file system mounts that same origin, and all figures come
from the same run, interleaved round by round, so they can be compared as ratios.

Figures (common/DESIGN.md §7: ratios measured side by side in one run):
  large   cached 64 MiB sequential read, MiB/s (median over rounds), and ÷ direct
  small   cached open+read+close per small file, p50/p95 µs over all files and rounds
  first   first read of each small file on a fresh mount with a fresh cache dir, p50 ms
"Cached" rounds drop the kernel page cache before each measurement (sync; echo 3 >
/proc/sys/vm/drop_caches), so what is measured is the daemon's own cache path (and, for
direct, the local disk). A separate "hot" table shows the same reads without dropping.

Every measurement runs in a child process with a hard timeout; a file system that hangs or
returns wrong bytes is reported as failed ("n/a"), never given a number.

Usage: bench_fs.py run --work DIR --ghostfs PATH [options]   (see --help)
       bench_fs.py worker < TASK_JSON                         (internal)
"""
import argparse
import hashlib
import http.client
import json
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "integration"))

LARGE_NAME = "big.bin"
SMALL_DIR = "small"
# Files are dated in the past, like a static mirror: HTTP heuristic freshness (10% of the age
# since Last-Modified) then keeps cached copies fresh for the whole run in every client.
TREE_MTIME = 1704067200  # 2024-01-01T00:00:00Z
DIRECT_UA = "bench-fs-direct"


T0 = time.time()


def log(msg):
    print(f"== [{time.time() - T0:5.0f} s] {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------
# Worker: the timed loops. Runs in a child process so that a hung FUSE read can be killed.
# ---------------------------------------------------------------------------------------------

def read_whole(path, size_hint):
    """open+read-to-EOF+close; returns the bytes."""
    fd = os.open(path, os.O_RDONLY)
    try:
        chunks = []
        want = max(size_hint + 1, 4096)
        while True:
            b = os.read(fd, want)
            if not b:
                break
            chunks.append(b)
        return b"".join(chunks)
    finally:
        os.close(fd)


def task_small(t):
    """Times open+read+close of each file once, in the given order. With "prepare", lists the
    directory and stats every file first (untimed), so a cold run times the data, not the
    listing."""
    root = t["root"]
    files = t["files"]  # [[rel, size, sha256], ...]
    if t.get("prepare"):
        os.listdir(os.path.join(root, SMALL_DIR))
        for rel, _, _ in files:
            os.stat(os.path.join(root, rel))
    lat = []
    bad = []
    datas = []
    clock = time.perf_counter_ns
    for rel, size, _ in files:
        p = os.path.join(root, rel)
        t0 = clock()
        data = read_whole(p, size)
        t1 = clock()
        lat.append((t1 - t0) / 1000.0)  # µs
        datas.append(data)
    for (rel, size, sha), data in zip(files, datas):
        if len(data) != size or hashlib.sha256(data).hexdigest() != sha:
            bad.append(f"{rel}: got {len(data)} bytes, want {size}")
    return {"lat_us": lat, "bad": bad}


def task_large(t):
    """Times one sequential read of the whole large file in 1 MiB reads into one buffer."""
    path, size, sha = t["path"], t["size"], t["sha256"]
    buf = bytearray(size + (1 << 20))
    mv = memoryview(buf)
    chunk = 1 << 20
    t0 = time.perf_counter_ns()
    with open(path, "rb", buffering=0) as f:
        got = 0
        while True:
            n = f.readinto(mv[got:got + chunk])
            if not n:
                break
            got += n
            if got > size:
                break
    t1 = time.perf_counter_ns()
    secs = (t1 - t0) / 1e9
    bad = []
    if got != size:
        bad.append(f"{path}: read {got} bytes, want {size}")
    elif hashlib.sha256(mv[:got]).hexdigest() != sha:
        bad.append(f"{path}: wrong bytes (sha256 differs)")
    return {"secs": secs, "mib_s": size / (1 << 20) / secs if secs > 0 else 0.0, "bad": bad}


def task_http(t):
    """Direct HTTP baseline: GET of each small file over one persistent loopback connection."""
    conn = http.client.HTTPConnection("127.0.0.1", t["port"], timeout=10)
    lat, bad = [], []
    clock = time.perf_counter_ns
    for rel, size, sha in t["files"]:
        t0 = clock()
        conn.request("GET", "/" + rel, headers={"User-Agent": DIRECT_UA})
        r = conn.getresponse()
        data = r.read()
        t1 = clock()
        lat.append((t1 - t0) / 1000.0)
        if r.status != 200 or len(data) != size or hashlib.sha256(data).hexdigest() != sha:
            bad.append(f"{rel}: HTTP {r.status}, {len(data)} bytes")
    conn.close()
    return {"lat_us": lat, "bad": bad}


def worker_main():
    t = json.load(sys.stdin)
    fn = {"small": task_small, "large": task_large, "http": task_http}[t["kind"]]
    try:
        out = fn(t)
    except OSError as e:
        out = {"error": f"{type(e).__name__}: {e}"}
    json.dump(out, sys.stdout)


# ---------------------------------------------------------------------------------------------
# Orchestrator
# ---------------------------------------------------------------------------------------------

class Failed(Exception):
    pass


def fuse_conn_id(mnt):
    """The FUSE connection number of the mount at mnt (its st_dev minor), from mountinfo, so a
    hung mount can be aborted without stat()ing it."""
    try:
        with open("/proc/self/mountinfo") as f:
            for line in f:
                parts = line.split()
                if len(parts) > 4 and parts[4] == mnt:
                    return parts[2].split(":")[1]
    except OSError:
        pass
    return None


def is_mounted(mnt):
    return fuse_conn_id(mnt) is not None


def abort_fuse(mnt):
    cid = fuse_conn_id(mnt)
    if cid:
        try:
            with open(f"/sys/fs/fuse/connections/{cid}/abort", "w") as f:
                f.write("1")
        except OSError:
            pass


def run_bounded(cmd, timeout, **kw):
    try:
        return subprocess.run(cmd, timeout=timeout, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, **kw).returncode
    except subprocess.TimeoutExpired:
        return None


class Target:
    """A mounted file system under test (or the local disk, for the direct row)."""

    def __init__(self, name, work, pids_file):
        self.name = name
        self.work = work
        self.pids_file = pids_file
        self.mnt = os.path.join(work, f"mnt-{name}")
        self.cache = None
        self.proc = None
        self.root = None
        self.error = None  # why this target has no (more) figures
        self.log = os.path.join(work, f"{name}.log")
        self.ua = None  # regex for its requests in the access log

    # Subclasses: command() -> argv; root_of(mnt) -> where the origin's tree appears.
    def start(self, timeout=30):
        self.cache = os.path.join(self.work, f"cache-{self.name}-{int(time.time() * 1000)}")
        os.makedirs(self.cache)
        os.makedirs(self.mnt, exist_ok=True)
        logf = open(self.log, "a")
        self.proc = subprocess.Popen(self.command(), stdout=logf, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL)
        logf.close()
        with open(self.pids_file, "a") as f:
            f.write(f"{self.proc.pid} {os.path.basename(self.command()[0])}\n")
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise Failed(f"exited with {self.proc.returncode} before mounting ({self.tail()})")
            if is_mounted(self.mnt):
                # Mounted; wait until the tree is visible (the daemon may still be listing).
                try:
                    if SMALL_DIR in os.listdir(self.root) and LARGE_NAME in os.listdir(self.root):
                        return
                except OSError:
                    pass
            time.sleep(0.05)
        raise Failed(f"not mounted after {timeout} s ({self.tail()})")

    def alive(self):
        return self.proc is not None and self.proc.poll() is None and is_mounted(self.mnt)

    def stop(self):
        if self.proc is None and not is_mounted(self.mnt):
            return
        if is_mounted(self.mnt):
            if run_bounded(["fusermount3", "-u", self.mnt], 15) != 0:
                abort_fuse(self.mnt)
                run_bounded(["umount", "-l", self.mnt], 15)
        if self.proc is not None:
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
            self.proc = None
        if is_mounted(self.mnt):
            abort_fuse(self.mnt)
            run_bounded(["umount", "-l", self.mnt], 15)

    def tail(self, n=400):
        try:
            with open(self.log, errors="replace") as f:
                s = f.read()
            return " ".join(s[-n:].split()) or "no output"
        except OSError:
            return "no log"

    def settle(self):
        """After the warm-up reads: let the daemon finish writing its cache."""


class Ghostfs(Target):
    def __init__(self, work, pids_file, exe, url):
        super().__init__("ghostfs", work, pids_file)
        self.exe, self.url = exe, url
        self.root = os.path.join(self.mnt, "www")
        self.control = os.path.join(work, "ghostfs.sock")
        ctl = os.path.join(os.path.dirname(exe), "ghostctl")
        self.ghostctl = ctl if os.access(ctl, os.X_OK) else None
        self.ua = re.compile(r'"ghost/')

    def command(self):
        return [self.exe, "-f", "--cache", self.cache, "--control", self.control,
                "--origin", f"www={self.url}", self.mnt]

    def ctl(self, *args, timeout=30):
        if not self.ghostctl:
            return None
        try:
            r = subprocess.run([self.ghostctl, "--control", self.control, *args], timeout=timeout,
                               capture_output=True, text=True)
            return r.stdout if r.returncode == 0 else None
        except subprocess.TimeoutExpired:
            return None

    def settle(self):
        self.ctl("flush")

    def stats(self):
        out = self.ctl("--json", "stats", timeout=10)
        try:
            return json.loads(out) if out else None
        except ValueError:
            return None


class Httpdirfs(Target):
    def __init__(self, work, pids_file, url):
        super().__init__("httpdirfs", work, pids_file)
        self.url = url
        self.root = self.mnt
        self.ua = re.compile(r'"HTTPDirFS')

    def command(self):
        # --no-range-check: httpdirfs 1.2.5's check misreads nginx's 206 replies and exits
        # ("This web server does not support HTTP range requests", upstream issue
        # fangfufu/httpdirfs#188); nginx does serve ranges, and the reads still use them.
        return ["httpdirfs", "--cache", "--cache-location", self.cache, "--no-range-check", "-f",
                self.url, self.mnt]


class Rclone(Target):
    def __init__(self, work, pids_file, url):
        super().__init__("rclone", work, pids_file)
        self.url = url
        self.root = self.mnt
        self.ua = re.compile(r'"rclone/')
        self.conf = os.path.join(work, "rclone.conf")
        open(self.conf, "a").close()

    def command(self):
        return ["rclone", "mount", ":http:", self.mnt, "--http-url", self.url,
                "--vfs-cache-mode", "full", "--cache-dir", self.cache, "--config", self.conf,
                "--log-file", self.log, "--log-level", "NOTICE"]

    def settle(self):
        # rclone writes its cache file and item metadata asynchronously.
        time.sleep(1.0)


def make_tree(root, n_small, large_mib, seed):
    rng = random.Random(seed)
    os.makedirs(os.path.join(root, SMALL_DIR), exist_ok=True)
    large_size = large_mib << 20
    h = hashlib.sha256()
    with open(os.path.join(root, LARGE_NAME), "wb") as f:
        left = large_size
        while left:
            b = rng.randbytes(min(left, 1 << 20))
            h.update(b)
            f.write(b)
            left -= len(b)
    large = {"rel": LARGE_NAME, "size": large_size, "sha256": h.hexdigest()}
    small = []
    for i in range(n_small):
        size = rng.randint(4 << 10, 32 << 10)
        rel = f"{SMALL_DIR}/f{i:03d}.bin"
        data = rng.randbytes(size)
        with open(os.path.join(root, rel), "wb") as f:
            f.write(data)
        small.append([rel, size, hashlib.sha256(data).hexdigest()])
    for dirpath, dirnames, filenames in os.walk(root):
        for n in filenames + dirnames:
            os.utime(os.path.join(dirpath, n), (TREE_MTIME, TREE_MTIME))
    os.utime(root, (TREE_MTIME, TREE_MTIME))
    return large, small


def sync_and_drop():
    run_bounded(["sync"], 60)
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def pct(values, p):
    s = sorted(values)
    if not s:
        return None
    k = max(0, min(len(s) - 1, int(round(p / 100.0 * len(s) + 0.5)) - 1))  # nearest rank
    return s[k]


class Bench:
    def __init__(self, a):
        self.a = a
        self.work = os.path.abspath(a.work)
        self.deadline = time.time() + a.budget
        self.results = {}  # target name -> dict of figures
        self.notes = []

    # --- running one timed task in a child, bounded ---
    def task(self, target, task, timeout):
        p = subprocess.Popen([sys.executable, os.path.abspath(__file__), "worker"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
        try:
            out, err = p.communicate(json.dumps(task), timeout=timeout)
        except subprocess.TimeoutExpired:
            if target is not None and target.mnt:
                abort_fuse(target.mnt)  # unblocks a reader stuck in the FUSE request queue
            p.kill()
            try:
                p.communicate(timeout=15)
            except subprocess.TimeoutExpired:
                pass
            raise Failed(f"{task['kind']} read did not finish within {timeout} s")
        if p.returncode != 0:
            raise Failed(f"{task['kind']} worker failed: {' '.join(err.split())[-300:]}")
        r = json.loads(out)
        if "error" in r:
            raise Failed(r["error"])
        if r.get("bad"):
            raise Failed(f"wrong data: {r['bad'][0]} ({len(r['bad'])} bad)")
        return r

    def fail(self, target, why):
        if target.error is None:
            target.error = why
            log(f"{target.name}: FAILED: {why}")

    def time_left(self, need=0):
        return time.time() + need < self.deadline

    # --- the access log: requests each client made in a window ---
    def log_mark(self):
        return len(self.nginx.log_lines())

    def requests_since(self, mark, ua):
        lines = self.nginx.log_lines()[mark:]
        return sum(1 for ln in lines if ua.search(ln))

    def run(self):
        a = self.a
        import harness  # tests/integration/harness.py: Nginx, cleanup on exit/signals

        os.makedirs(self.work, exist_ok=True)
        self.load_start = os.getloadavg()[0]
        pids_file = os.path.join(self.work, "pids")
        fstype = subprocess.run(["findmnt", "-n", "-o", "FSTYPE", "-T", self.work],
                                capture_output=True, text=True).stdout.strip() or "?"
        if fstype in ("tmpfs", "ramfs"):
            self.notes.append(f"WARNING: {self.work} is on {fstype}: the page cache cannot be "
                              "dropped there, so direct and cache reads come from memory")

        log(f"generating the tree ({a.large_mib} MiB + {a.small_files} small files) in {self.work}/origin")
        origin = os.path.join(self.work, "origin")
        large, small = make_tree(origin, a.small_files, a.large_mib, a.seed)
        self.large, self.small = large, small

        self.nginx = harness.Nginx(origin)
        # Keep its config, pid and logs under the scratch dir, which bench-fs.sh removes even
        # if this process is killed.
        shutil.rmtree(self.nginx.dir, ignore_errors=True)
        self.nginx.dir = os.path.join(self.work, "nginx")
        self.nginx.access_log = os.path.join(self.nginx.dir, "access.log")
        os.makedirs(self.nginx.dir)
        if not self.nginx.start():
            raise SystemExit("bench-fs: nginx did not start on 127.0.0.1 (is nginx-light installed?)")
        url = self.nginx.url()
        log(f"nginx serving {origin} at {url}")

        direct = Target("direct", self.work, pids_file)
        direct.root = origin
        direct.mnt = None
        targets = [Ghostfs(self.work, pids_file, a.ghostfs, url)]
        for name in ("httpdirfs", "rclone"):
            if name in a.skip:
                t = Target(name, self.work, pids_file)
                t.error = "skipped (--skip)"
            elif shutil.which(name) is None:
                t = Target(name, self.work, pids_file)
                t.error = f"not installed ({name} not found)"
            else:
                t = Httpdirfs(self.work, pids_file, url) if name == "httpdirfs" else Rclone(self.work, pids_file, url)
            targets.append(t)
        self.targets = targets
        for t in targets:
            harness.on_exit(t.stop)
            self.results[t.name] = {}
        self.results["direct"] = {}

        # Every file once over HTTP, untimed: puts the origin's files in nginx's and the page
        # cache, the same for every client's first read.
        try:
            self.task(None, {"kind": "http", "port": self.nginx.port, "files": small}, 120)
        except Failed as e:
            raise SystemExit(f"bench-fs: the origin does not serve the tree: {e}")

        # 1. Cold: every file system mounted fresh on a fresh cache dir; each lists the small
        #    directory and stats its files (untimed), then the first read of every small file is
        #    timed, in chunks that alternate between the file systems so that load on the
        #    machine hits them alike; last, the first (network) read of the large file, which
        #    also warms each cache.
        for t in targets:
            if t.error:
                continue
            try:
                t.start()
                log(f"{t.name}: mounted with a fresh cache dir {t.cache}")
            except Failed as e:
                self.fail(t, f"mount: {e}")
                t.stop()
        for t in targets:
            if t.error:
                continue
            try:
                self.task(t, {"kind": "small", "root": t.root, "files": [], "prepare": True}, 120)
            except Failed as e:
                self.fail(t, f"listing: {e}")
        mark = self.log_mark()
        order = small[:]
        random.Random(a.seed + 1).shuffle(order)
        n_chunks = max(1, min(a.cold_chunks, len(order)))
        chunks = [order[i::n_chunks] for i in range(n_chunks)]
        log(f"first reads: {len(order)} files in {n_chunks} chunks, alternating between file systems")
        for ci, chunk in enumerate(chunks):
            if not self.time_left(60):
                self.notes.append(f"time budget reached: first reads stopped after {ci} of {n_chunks} chunks")
                break
            # The direct row: the same files over HTTP (one keep-alive connection), same chunks.
            try:
                r = self.task(None, {"kind": "http", "port": self.nginx.port, "files": chunk}, 120)
                self.results["direct"].setdefault("first_lat_us", []).extend(r["lat_us"])
            except Failed as e:
                self.notes.append(f"direct HTTP baseline failed in chunk {ci + 1}: {e}")
            for t in targets[ci % len(targets):] + targets[:ci % len(targets)]:
                if t.error:
                    continue
                try:
                    r = self.task(t, {"kind": "small", "root": t.root, "files": chunk}, 120)
                    self.results[t.name].setdefault("first_lat_us", []).extend(r["lat_us"])
                except Failed as e:
                    self.fail(t, f"first read: {e}")
        for t in targets:
            if "first_lat_us" in self.results[t.name]:
                self.results[t.name]["cold_requests"] = self.requests_since(mark, t.ua)
        for t in targets:
            if t.error:
                continue
            try:
                r = self.task(t, {"kind": "large", "path": os.path.join(t.root, LARGE_NAME),
                                  "size": large["size"], "sha256": large["sha256"]}, 180)
                self.results[t.name]["large_first_mib_s"] = r["mib_s"]
                t.settle()
                if not t.alive():
                    raise Failed(f"daemon died or unmounted after the cold run ({t.tail()})")
                log(f"{t.name}: first small read p50 {statistics.median(self.results[t.name]['first_lat_us']) / 1000:.2f} ms,"
                    f" large first read {r['mib_s']:.0f} MiB/s")
            except Failed as e:
                self.fail(t, f"large first read: {e}")

        # 2. Cached, page cache dropped before every measurement; rounds interleave the targets
        #    (rotating the order) so drift on a shared machine hits all of them alike.
        run_bounded(["sync"], 60)
        mark = self.log_mark()
        everyone = [direct] + targets
        for kind, rounds in (("large", a.large_rounds), ("small", a.small_rounds)):
            log(f"{kind} cached: {rounds} rounds, page cache dropped before each read")
            for rnd in range(rounds):
                if not self.time_left(30):
                    self.notes.append(f"time budget reached: {kind} cached stopped after {rnd} of {rounds} rounds")
                    break
                order = everyone[rnd % len(everyone):] + everyone[:rnd % len(everyone)]
                for t in order:
                    if t.error:
                        continue
                    self.measure(t, kind, rnd, drop=True, key=f"{kind}_cached")
        for t in targets:
            if "first_lat_us" in self.results[t.name]:
                self.results[t.name]["cached_requests"] = self.requests_since(mark, t.ua)

        # 3. Hot: the same reads without dropping the page cache (one untimed read first).
        log(f"hot (page cache kept): {a.hot_rounds} rounds")
        for kind in ("large", "small"):
            for rnd in range(a.hot_rounds + 1):
                if not self.time_left(20):
                    self.notes.append(f"time budget reached: hot {kind} stopped after {rnd} rounds")
                    break
                for t in everyone:
                    if t.error:
                        continue
                    self.measure(t, kind, rnd, drop=False, key=f"{kind}_hot" if rnd else None)

        for t in targets:
            if isinstance(t, Ghostfs) and not t.error:
                self.ghost_stats = t.stats()
        for t in targets:
            t.stop()
        self.nginx.stop()
        self.report()

    def measure(self, t, kind, rnd, drop, key):
        try:
            if drop:
                sync_and_drop()
            if kind == "large":
                r = self.task(t, {"kind": "large", "path": os.path.join(t.root, LARGE_NAME),
                                  "size": self.large["size"], "sha256": self.large["sha256"]}, 120)
                if key:
                    self.results[t.name].setdefault(key, []).append(r["mib_s"])
            else:
                order = self.small[:]
                random.Random(self.a.seed * 1000 + rnd).shuffle(order)
                r = self.task(t, {"kind": "small", "root": t.root, "files": order}, 120)
                if key:
                    self.results[t.name].setdefault(key, []).extend(r["lat_us"])
            if t.mnt and not t.alive():
                raise Failed(f"daemon died or unmounted ({t.tail()})")
        except Failed as e:
            self.fail(t, f"{kind} {'cached' if drop else 'hot'} round {rnd + 1}: {e}")

    # --- the report ---
    def figures(self, name):
        r = self.results.get(name, {})
        f = {}
        if r.get("large_cached"):
            f["large"] = statistics.median(r["large_cached"])
        if r.get("small_cached"):
            f["small_p50"] = statistics.median(r["small_cached"])
            f["small_p95"] = pct(r["small_cached"], 95)
        if r.get("first_lat_us"):
            f["first_p50"] = statistics.median(r["first_lat_us"]) / 1000.0
            f["first_p95"] = pct(r["first_lat_us"], 95) / 1000.0
        if r.get("large_hot"):
            f["large_hot"] = statistics.median(r["large_hot"])
        if r.get("small_hot"):
            f["small_hot_p50"] = statistics.median(r["small_hot"])
        if "large_first_mib_s" in r:
            f["large_first"] = r["large_first_mib_s"]
        return f

    def report(self):
        a = self.a
        names = [t.name for t in self.targets] + ["direct"]
        errors = {t.name: t.error for t in self.targets}
        F = {n: self.figures(n) for n in names}
        d = F["direct"]

        def num(v, fmt):
            return "n/a" if v is None else format(v, fmt)

        def ratio(v, base):
            return "n/a" if v is None or not base else f"{v / base:.2f}×"

        out = []
        out.append("")
        out.append(f"bench-fs: {a.large_mib} MiB file, {len(self.small)} files of 4–32 KiB, nginx on 127.0.0.1, "
                   f"{a.large_rounds} large + {a.small_rounds} small cached rounds, {a.hot_rounds} hot rounds")
        out.append("Cached figures: the kernel page cache is dropped (sync; echo 3 > /proc/sys/vm/drop_caches) before "
                   "every measurement, so each read goes through the daemon's own cache (its files on disk); "
                   "direct = the same bytes read from the local file on the same disk, also after the drop.")
        out.append("First read: fresh cache dir and fresh mount, directory listed and files stat()ed first (untimed), "
                   "then open+read+close of each file once (file systems alternating in chunks); "
                   "direct = HTTP GET on one keep-alive connection.")
        out.append("")
        hdr = ["", "large cached MiB/s", "×direct", "small cached p50 µs", "×direct", "small p95 µs", "×direct",
               "first small p50 ms"]
        rows = []
        for n in names:
            f = F[n]
            rows.append([n,
                         num(f.get("large"), ".0f"), ratio(f.get("large"), d.get("large")) if n != "direct" else "1.00×",
                         num(f.get("small_p50"), ".0f"), ratio(f.get("small_p50"), d.get("small_p50")) if n != "direct" else "1.00×",
                         num(f.get("small_p95"), ".0f"), ratio(f.get("small_p95"), d.get("small_p95")) if n != "direct" else "1.00×",
                         num(f.get("first_p50"), ".2f") + (" (HTTP GET)" if n == "direct" and "first_p50" in f else "")])
        out += table(hdr, rows)
        out.append("(large: higher is better, ×direct = MiB/s ÷ direct's; small and first: lower is better, "
                   "×direct = latency ÷ direct's)")
        for n in names:
            if errors.get(n):
                partial = any(k in F[n] for k in ("large", "small_p50", "first_p50"))
                out.append(f"{n}: FAILED — {errors[n]}" +
                           ("; its figures above come from the reads before the failure" if partial else ""))

        out.append("")
        out.append("Also measured (same run):")
        hdr2 = ["", "large cached min–max", "large first read MiB/s", "first small p95 ms", "large hot MiB/s",
                "×direct", "small hot p50 µs", "×direct", "origin requests: first reads / cached rounds"]
        rows2 = []
        for n in names:
            f, r = F[n], self.results.get(n, {})
            reqs = "—" if n == "direct" else f"{r.get('cold_requests', 'n/a')} / {r.get('cached_requests', 'n/a')}"
            lc = r.get("large_cached")
            spread = f"{min(lc):.0f}–{max(lc):.0f}" if lc else "n/a"
            rows2.append([n, spread, num(f.get("large_first"), ".0f"), num(f.get("first_p95"), ".2f"),
                          num(f.get("large_hot"), ".0f"), ratio(f.get("large_hot"), d.get("large_hot")),
                          num(f.get("small_hot_p50"), ".0f"), ratio(f.get("small_hot_p50"), d.get("small_hot_p50")),
                          reqs])
        out += table(hdr2, rows2)
        out.append("(hot = page cache not dropped: a file system that lets the kernel keep its pages "
                   "(keep_cache) is served from memory; that is real, but it is not the daemon's cache path)")
        gs = getattr(self, "ghost_stats", None)
        if gs:
            src = gs.get("requests_by_source") or gs.get("requests") or {}
            out.append(f"ghostfs opens by source (ghostctl stats): {json.dumps(src, sort_keys=True)}")
            fuse = gs.get("fuse") or {}
            if fuse:
                # READ requests that reached the daemon, and opens the kernel read itself
                # (passthrough: a body file, or a packed body's memfd copy): the round trips.
                out.append(f"ghostfs FUSE requests (ghostctl stats): {json.dumps(fuse, sort_keys=True)}")
        out.append(f"machine: {os.cpu_count()} CPUs, 1-min load average {self.load_start:.1f} at the start and "
                   f"{os.getloadavg()[0]:.1f} at the end (other work on the machine makes every figure noisier; "
                   "the rounds interleave the file systems so it hits them alike)")
        for note in self.notes:
            out.append(f"note: {note}")

        # Goals.
        out.append("")
        g = F["ghostfs"]
        if g.get("large") and d.get("large"):
            r = g["large"] / d["large"]
            out.append(f"ghostfs large cached ≥ 0.9× direct: {'yes' if r >= 0.9 else 'no'} ({r:.2f}×)")
        else:
            out.append("ghostfs large cached ≥ 0.9× direct: no (not measured)")
        checks = [("large", "large cached MiB/s", True), ("small_p50", "small cached p50", False),
                  ("small_p95", "small cached p95", False), ("first_p50", "first small read p50", False)]
        behind, unknown = [], []
        for peer in ("httpdirfs", "rclone"):
            p = F[peer]
            for key, label, higher in checks:
                gv, pv = g.get(key), p.get(key)
                if gv is None:
                    behind.append(f"{label} vs {peer} (ghostfs not measured)")
                elif pv is None:
                    unknown.append(f"{peer} {label}")
                elif (gv <= pv) if higher else (gv >= pv):
                    unit = "MiB/s" if key == "large" else ("ms" if key == "first_p50" else "µs")
                    g3 = lambda v: f"{v:.0f}" if v >= 100 else f"{v:.3g}"
                    behind.append(f"{label} vs {peer} ({g3(gv)} vs {g3(pv)} {unit}, {gv / pv:.2f}×)")
        verdict = "yes" if not behind and not unknown else "no"
        line = f"ghostfs ahead of httpdirfs and rclone on every figure: {verdict}"
        if behind:
            line += ", not on: " + "; ".join(behind)
        if unknown:
            line += ("; " if behind else ", ") + "not comparable (peer n/a): " + ", ".join(unknown)
        out.append(line)
        print("\n".join(out), flush=True)

        if a.json:
            with open(a.json, "w") as f:
                json.dump({"figures": F, "errors": errors, "raw": self.results, "notes": self.notes}, f, indent=1)


def table(hdr, rows):
    w = [max(len(str(r[i])) for r in [hdr] + rows) for i in range(len(hdr))]
    fmt = lambda r: "  ".join(str(c).ljust(w[i]) if i == 0 else str(c).rjust(w[i]) for i, c in enumerate(r))
    lines = [fmt(hdr), "  ".join("-" * x for x in w)]
    return lines + [fmt(r) for r in rows]


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "worker":
        return worker_main()
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--work", required=True, help="scratch directory (on a real disk, not tmpfs)")
    r.add_argument("--ghostfs", required=True, help="the ghostfs binary")
    r.add_argument("--large-mib", type=int, default=64)
    r.add_argument("--small-files", type=int, default=200)
    r.add_argument("--large-rounds", type=int, default=9)
    r.add_argument("--small-rounds", type=int, default=6)
    r.add_argument("--hot-rounds", type=int, default=3)
    r.add_argument("--cold-chunks", type=int, default=10, help="first reads alternate between file systems in this many chunks")
    r.add_argument("--budget", type=float, default=480, help="seconds; later rounds are skipped past it")
    r.add_argument("--seed", type=int, default=7)
    r.add_argument("--skip", default="", help="comma-separated peers not to run (httpdirfs,rclone)")
    r.add_argument("--json", help="also write the figures and raw samples here")
    a = ap.parse_args()
    a.skip = [s for s in a.skip.split(",") if s]
    if os.geteuid() != 0:
        raise SystemExit("bench-fs: must run as root (FUSE mounts, drop_caches)")
    Bench(a).run()


if __name__ == "__main__":
    main()
