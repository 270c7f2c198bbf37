#!/usr/bin/env python3
"""Scale benchmark: N unique 512-byte objects filled through ghostproxy (over a ghostfs mount,
`--memory-cache 0`) and through squid, in one run, against one nginx origin on 127.0.0.1.

Called by scripts/bench-scale.sh (which installs wrk and squid and builds the programs).

ghostproxy / ghostfs:
  fill rate      N misses over wrk (16 connections, 2 threads, unique absolute-form URLs made by
                 a Lua script), counted until ghostfs's index holds them (the write queue drained)
  mount ready    ghostfs unmounted and started again on the same cache directory: from the exec
                 to the mount appearing and the first `ghostctl stats` answering
  RSS            ghostfs's VmRSS right after that remount, and after the hit phase
  disk/object    allocated bytes (st_blocks) under the cache directory / objects indexed
  hits           random URLs among those filled, 1 connection, one request at a time: first
                 hit_latency.py (every request timed with CLOCK_MONOTONIC: p50/p99/p99.9/max,
                 the figures reported), then wrk --latency for as long (its p50/p99 beside:
                 wrk corrects its histogram for coordinated omission, so one stall among
                 thousands of hits sets its p99); hit rate from the access log over both
squid (if installed): the same fill, its RSS, the time from a restart to answering a hit, its
disk use per object.

Usage: bench_scale.py --work DIR --ghostfs PATH --ghostproxy PATH --ghostctl PATH [--objects N]
"""
import argparse
import fcntl
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "tests", "integration"))
import harness as h  # noqa: E402
from bench_proxy import Ghostproxy, Squid  # noqa: E402
import hit_latency  # noqa: E402

# Unique absolute-form URLs: thread t asks for /o/t/0, /o/t/1, ...; the benchmark stops wrk
# (SIGINT: it prints its summary) once the proxy's access log has N answers. ORIGIN etc. are
# prepended by the benchmark.
FILL_LUA = r"""
local counter = 0
local threads = {}
setup = function(thread)
  thread:set("tid", counter)
  counter = counter + 1
end
local n = 0
local answered = 0
request = function()
  local url = ORIGIN .. "o/" .. tid .. "/" .. n
  n = n + 1
  return wrk.format("GET", url, { ["Host"] = ORIGIN_HOST })
end
"""

# Random URLs among those filled (thread t, index < SHARE - SLACK).
HIT_LUA = r"""
math.randomseed(42)
request = function()
  local url = ORIGIN .. "o/" .. math.random(0, THREADS - 1) .. "/" .. math.random(0, math.floor(SHARE - SLACK - 1))
  return wrk.format("GET", url, { ["Host"] = ORIGIN_HOST })
end
"""


def log(msg):
    print(f"== {msg}", file=sys.stderr, flush=True)


def proc_number(pid, name, field):
    """The number after `field` (e.g. "VmRSS:") in /proc/PID/<name>; 0 if it is gone."""
    try:
        with open(f"/proc/{pid}/{name}") as f:
            for line in f:
                if line.startswith(field):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def rss_kb(pid):
    return proc_number(pid, "status", "VmRSS:")


def disk_bytes(path):
    total = 0
    for root, dirs, files in os.walk(path):
        for name in files + dirs:
            try:
                total += os.lstat(os.path.join(root, name)).st_blocks * 512
            except OSError:
                pass
    return total


def wrk(port, lua, connections, threads, seconds):
    cmd = ["wrk", "--latency", "-t", str(threads), "-c", str(connections), "-d", f"{seconds}s",
           "--timeout", "10s", "-s", lua, f"http://127.0.0.1:{port}"]
    t0 = time.monotonic()
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 120).stdout
    elapsed = time.monotonic() - t0
    scale = {"us": 1.0, "ms": 1000.0, "s": 1e6}
    p50 = re.search(r"^\s+50%\s+([\d.]+)(us|ms|s)\s*$", out, re.M)
    p99 = re.search(r"^\s+99%\s+([\d.]+)(us|ms|s)\s*$", out, re.M)
    req = re.search(r"(\d+) requests in", out)
    bad = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    if not req:
        raise RuntimeError(f"wrk output not understood:\n{out}")
    return {"elapsed": elapsed, "requests": int(req.group(1)),
            "p50_us": float(p50.group(1)) * scale[p50.group(2)] if p50 else float("nan"),
            "p99_us": float(p99.group(1)) * scale[p99.group(2)] if p99 else float("nan"),
            "bad": int(bad.group(1)) if bad else 0}


def hits_timed(port, hit_lua, consts, seconds):
    """The hit phase: hit_latency.py (1 connection) for `seconds`, then wrk as long."""
    urls = hit_latency.bench_urls(consts["ORIGIN"], consts["THREADS"], consts["SHARE"],
                                  consts["SLACK"])
    own = hit_latency.summary(hit_latency.run(port, urls, consts["ORIGIN_HOST"], 1, seconds),
                              seconds)
    return own, wrk(port, hit_lua, 1, 1, seconds)


def write_bytes(pid):
    """Bytes process `pid` (all its threads) has sent towards the disk (/proc/PID/io)."""
    return proc_number(pid, "io", "write_bytes:")


def cpu_s(pid):
    """User + system CPU seconds of process `pid` (all its threads; 0 if it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except OSError:
        return 0.0


class LineCounter:
    """Lines of an append-only file, counted from where the last call stopped. Reading the whole
    access log at every poll took ~20 % of a CPU at 900k lines (at normal priority, beside the
    processes being measured, and growing with N)."""

    def __init__(self, path):
        self.path, self.offset, self.lines = path, 0, 0

    def __call__(self):
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                for buf in iter(lambda: f.read(1 << 20), b""):
                    self.lines += buf.count(b"\n")
                    self.offset += len(buf)
        except OSError:
            pass
        return self.lines


def wrk_until(port, lua, connections, threads, access_log, n):
    """Runs wrk until `access_log` has grown by `n` lines, then stops it; wrk's figures."""
    log_lines = LineCounter(access_log)
    start = log_lines()
    cmd = ["wrk", "-t", str(threads), "-c", str(connections), "-d", "3600s", "--timeout", "10s",
           "-s", lua, f"http://127.0.0.1:{port}"]
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    while proc.poll() is None and log_lines() - start < n:
        time.sleep(0.1)
    elapsed = time.monotonic() - t0
    proc.send_signal(signal.SIGINT)
    out = proc.communicate(timeout=60)[0]
    req = re.search(r"(\d+) requests in", out)
    bad = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    if not req:
        raise RuntimeError(f"wrk output not understood:\n{out}")
    return {"elapsed": elapsed, "requests": int(req.group(1)), "bad": int(bad.group(1)) if bad else 0}


def ghost_stats(ghostctl, control):
    out = subprocess.run([ghostctl, "--control", control, "--json", "stats"], capture_output=True,
                         text=True, timeout=30)
    if out.returncode != 0:
        return None
    return json.loads(out.stdout)


def cached_objects(stats):
    def find(o):
        if isinstance(o, dict):
            if "objects" in o and isinstance(o["objects"], int):
                return o["objects"]
            for v in o.values():
                r = find(v)
                if r is not None:
                    return r
        return None
    return find(stats) if stats else None


def write_lua(path, body, **consts):
    with open(path, "w") as f:
        for k, v in consts.items():
            f.write(f"{k} = {json.dumps(v)}\n")
        f.write(body)


def write_rest(index, threads, share, total):
    """Brings the stopped ghostfs's index to `total` objects of the fill's URLs (thread t's
    o/t/0, o/t/1, ...), each row a copy of the last packed one the proxy stored (its head,
    validators, expiry and 512-byte body) under its own key."""
    import sqlite3
    db = sqlite3.connect(index)
    try:
        cols = ("key, size, etag, last_modified, content_type, expires_us, fetched_us, "
                "accessed_us, response, body")
        tmpl = db.execute(f"SELECT {cols} FROM objects WHERE complete = 1 AND body IS NOT NULL "
                          "ORDER BY rowid DESC LIMIT 1").fetchone()
        have = {k for (k,) in db.execute("SELECT key FROM objects")}
        tick = db.execute("SELECT max(accessed_us) FROM objects").fetchone()[0]
        try:  # access times saved after their rows (the ticks table, round 14)
            tick = max(tick, db.execute("SELECT max(tick) FROM ticks").fetchone()[0] or 0)
        except sqlite3.OperationalError:
            pass
    finally:
        db.close()
    prefix = re.match(r"^(.*/o/)\d+/\d+$", tmpl[0]).group(1)

    def rows():
        n = len(have)
        for i in range(share):
            for t in range(threads):
                if n >= total:
                    return
                key = f"{prefix}{t}/{i}"
                if key in have:
                    continue
                n += 1
                yield (key,) + tuple(tmpl[1:7]) + (tick + n,) + tuple(tmpl[8:])
    return h.add_cached_objects(index, rows())


class PhaseLock:
    """flock on a file around each measured phase (--lock); nothing without a path."""

    def __init__(self, path):
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644) if path else None

    def take(self, what):
        if self.fd is not None:
            t0 = time.monotonic()
            fcntl.flock(self.fd, fcntl.LOCK_EX)
            log(f"lock taken for {what} after {time.monotonic() - t0:.0f} s; "
                f"load {os.getloadavg()[0]:.1f}")

    def give(self):
        if self.fd is not None:
            fcntl.flock(self.fd, fcntl.LOCK_UN)


def hit_cols(r):
    o = r["hit"]
    return (f"{o['p50_us']:11.0f} {o['p99_us']:8.0f} {o['p999_us']:9.0f} {o['max_us']:8.0f} "
            f"{o['count']:6d} {r['wrk_p50']:7.0f}/{r['wrk_p99']:.0f} (ours corrected as wrk does: "
          f"p99 {o['co_p99_us']:.0f})")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", required=True)
    ap.add_argument("--ghostfs", required=True)
    ap.add_argument("--ghostproxy", required=True)
    ap.add_argument("--ghostctl", required=True)
    ap.add_argument("--objects", type=int, default=100_000)
    ap.add_argument("--hit-seconds", type=int, default=8)
    ap.add_argument("--no-squid", action="store_true")
    ap.add_argument("--remounts", type=int, default=1,
                    help="unmount and mount again this many times; ready time is their median")
    ap.add_argument("--proxy-fill", type=int, default=0, metavar="K",
                    help="fill only K objects through the proxy (the fill rate is theirs), then "
                         "write the rest of --objects straight into the stopped ghostfs's index "
                         "with the head of a proxy-filled one (harness.add_cached_objects): "
                         "for sizes whose fill takes hours on a loaded machine")
    ap.add_argument("--lock", metavar="FILE",
                    help="hold flock(FILE) only while each phase is measured (ghostproxy's "
                         "fill, remounts and hits; squid's fill; squid's restart and hits), "
                         "released between them, so a long run shares a benchmark lock")
    ap.add_argument("--crash", action="store_true",
                    help="after the hits, SIGKILL ghostfs and time the next mount to ready "
                         "(crash recovery at this size)")
    a = ap.parse_args()
    lock = PhaseLock(a.lock)
    os.environ["GHOST_BUILD"] = os.path.dirname(os.path.dirname(os.path.abspath(a.ghostfs)))
    threads, conns, slack = 2, 16, 64
    share = (a.objects + threads - 1) // threads

    os.chmod(a.work, 0o755)  # squid runs as user proxy
    site = os.path.join(a.work, "site")
    os.makedirs(site)
    with open(os.path.join(site, "one.bin"), "wb") as f:
        f.write(os.urandom(512))
    # Every /o/... URL is the same 512-byte file (with its ETag and Last-Modified): N unique
    # URLs without N files on the origin.
    nginx = h.Nginx(site, extra_location="location /o/ { try_files /one.bin =404; expires 1h; }")
    if not nginx.start():
        raise SystemExit("bench-scale: nginx did not start")
    origin = nginx.url()
    origin_host = origin.split("/")[2]
    fill_lua = os.path.join(a.work, "fill.lua")
    hit_lua = os.path.join(a.work, "hit.lua")
    consts = dict(ORIGIN=origin, ORIGIN_HOST=origin_host, SHARE=share, THREADS=threads, SLACK=slack)
    write_lua(fill_lua, FILL_LUA, **consts)
    write_lua(hit_lua, HIT_LUA, **consts)
    load0 = os.getloadavg()[0]

    mnt = os.path.join(a.work, "mnt")
    os.makedirs(mnt)
    cache = os.path.join(a.work, "cache")
    control = os.path.join(a.work, "control.sock")
    size = max(1 << 30, a.objects * 8192)
    lock.take("ghostproxy")
    fs = h.Ghostfs(mnt, cache, {"origin": origin}, args=["--cache-size", str(size)], control=control)
    if not fs.start():
        raise SystemExit(f"bench-scale: ghostfs did not mount:\n{fs.output()}")
    h.on_exit(fs.stop)
    empty_rss = rss_kb(fs.proc.pid)
    gp = Ghostproxy(a.work, a.ghostproxy, mnt, control, ["--memory-cache", "0"])
    if not gp.start():
        raise SystemExit("bench-scale: ghostproxy did not start")

    proxy_fill = a.proxy_fill if 0 < a.proxy_fill < a.objects else a.objects
    log(f"filling ghostproxy with {proxy_fill} unique 512-byte objects")
    cpu0 = cpu_s(fs.proc.pid) + cpu_s(gp.proc.pid)
    # ghostfs's peak RSS while it fills (sampled every 0.2 s until the index holds the fill).
    peak = {"kb": rss_kb(fs.proc.pid), "stop": False}

    def sample_rss(pid=fs.proc.pid):
        while not peak["stop"]:
            peak["kb"] = max(peak["kb"], rss_kb(pid))
            time.sleep(0.2)
    sampler = threading.Thread(target=sample_rss, daemon=True)
    sampler.start()
    t0 = time.monotonic()
    fill = wrk_until(gp.port, fill_lua, conns, threads, gp.access_log, proxy_fill)
    objects = None
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:  # the write queue reaches the index
        objects = cached_objects(ghost_stats(a.ghostctl, control))
        if objects is not None and objects >= fill["requests"] - fill["bad"] - conns:
            break
        time.sleep(0.2)
    fill_s = time.monotonic() - t0
    peak["stop"] = True
    sampler.join()
    wq = (ghost_stats(a.ghostctl, control) or {}).get("write_queue", {})
    # CPU per miss of both processes (moves far less with the machine's load than the rate).
    fill_cpu = cpu_s(fs.proc.pid) + cpu_s(gp.proc.pid) - cpu0
    g = {"requests": fill["requests"], "bad": fill["bad"], "fill_s": fill_s, "objects": objects,
         "cpu_us": fill_cpu * 1e6 / max(1, fill["requests"]),
         "fill_rate": objects / fill_s if objects else 0.0, "empty_rss_kb": empty_rss,
         "filled_rss_kb": rss_kb(fs.proc.pid), "peak_fill_rss_kb": peak["kb"], "wrk_s": fill["elapsed"],
         "write_queue": wq}
    log(f"ghostproxy: {fill['requests']} requests ({fill['bad']} not 2xx) in {fill['elapsed']:.1f} s, "
        f"{objects} objects indexed after {fill_s:.1f} s")

    gp.stop()
    if proxy_fill < a.objects:
        fs.stop()
        t0 = time.monotonic()
        g["written"] = write_rest(os.path.join(cache, "objects-db", "index.sqlite"), threads, share,
                                  a.objects)
        log(f"wrote {g['written']} more objects straight into the index in "
            f"{time.monotonic() - t0:.1f} s")
    readies, mounts = [], []
    for _ in range(max(1, a.remounts)):
        fs.stop()
        t0 = time.monotonic()
        if not fs.start(timeout=120):
            raise SystemExit(f"bench-scale: ghostfs did not mount again:\n{fs.output()}")
        mounts.append(time.monotonic() - t0)
        st = None
        while st is None and time.monotonic() - t0 < 120:
            st = ghost_stats(a.ghostctl, control)
        readies.append(time.monotonic() - t0)
    g["mount_s"] = sorted(mounts)[len(mounts) // 2]
    g["ready_s"] = sorted(readies)[len(readies) // 2]
    g["ready_all"] = readies
    g["objects_after"] = cached_objects(st)
    g["rss_kb"] = rss_kb(fs.proc.pid)
    g["disk"] = disk_bytes(cache)
    gp = Ghostproxy(a.work, a.ghostproxy, mnt, control, ["--memory-cache", "0"])
    gp.access_log = os.path.join(a.work, "ghostproxy-hits.log")
    if not gp.start():
        raise SystemExit("bench-scale: ghostproxy did not start again")
    io0 = write_bytes(fs.proc.pid)
    cpu0 = cpu_s(fs.proc.pid), cpu_s(gp.proc.pid)
    own, hit = hits_timed(gp.port, hit_lua, consts, a.hit_seconds)
    hits, other = gp.hits_and_misses()
    n_hit = max(1, hits + other)
    g.update(hit_cpu_us=((cpu_s(fs.proc.pid) - cpu0[0]) * 1e6 / n_hit,
                         (cpu_s(gp.proc.pid) - cpu0[1]) * 1e6 / n_hit))
    g.update(hit_write_bytes=write_bytes(fs.proc.pid) - io0, hit=own, wrk_p50=hit["p50_us"], wrk_p99=hit["p99_us"], hits=hits, other=other,
             rss_after_hits_kb=rss_kb(fs.proc.pid))
    gp.stop()
    if a.crash:
        fs.kill9()
        t0 = time.monotonic()
        if not fs.start(timeout=600):
            raise SystemExit(f"bench-scale: ghostfs did not mount after SIGKILL:\n{fs.output()}")
        st = None
        while st is None and time.monotonic() - t0 < 600:
            st = ghost_stats(a.ghostctl, control)
        g["crash_ready_s"] = time.monotonic() - t0
        g["objects_after_crash"] = cached_objects(st)
        log(f"ghostfs ready {g['crash_ready_s']:.2f} s after a SIGKILL, "
            f"{g['objects_after_crash']} objects")
    fs.stop()
    log("ghostproxy figures: " + json.dumps(g))
    lock.give()

    s = None
    if not a.no_squid and shutil.which("squid"):
        squid = Squid(a.work)
        conf = open(squid.conf).read()
        mb = max(256, a.objects * 8192 // (1 << 20))
        conf = re.sub(r"cache_dir ufs (\S+) 256 16 256", rf"cache_dir ufs \1 {mb} 64 256", conf)
        open(squid.conf, "w").write(conf)
        lock.take("squid's fill")
        if not squid.start():
            raise SystemExit("bench-scale: squid did not start")
        log(f"filling squid with the same {a.objects} URLs")
        squid_pids = [squid.proc.pid]
        try:
            with open(f"/proc/{squid.proc.pid}/task/{squid.proc.pid}/children") as f:
                squid_pids += [int(p) for p in f.read().split()]
        except OSError:
            pass
        cpu0 = sum(cpu_s(p) for p in squid_pids)
        t0 = time.monotonic()
        sfill = wrk_until(squid.port, fill_lua, conns, threads, squid.access_log, a.objects)
        s = {"requests": sfill["requests"], "bad": sfill["bad"], "fill_s": time.monotonic() - t0,
             "cpu_us": (sum(cpu_s(p) for p in squid_pids) - cpu0) * 1e6 / max(1, sfill["requests"])}
        s["fill_rate"] = (sfill["requests"] - sfill["bad"]) / s["fill_s"]
        s["filled_rss_kb"] = rss_kb(squid.proc.pid)
        squid.stop()
        s["disk"] = disk_bytes(squid.cache)
        lock.give()
        lock.take("squid's restart and hits")
        url = f"{origin}o/0/0"
        logged = squid.hits_and_misses()  # squid has exited: its log is complete
        probes = [0, 0]  # the readiness probes' own log lines: (hits, other)
        cache_log = os.path.join(squid.dir, "cache.log")
        log_from = os.path.getsize(cache_log) if os.path.exists(cache_log) else 0
        t0 = time.monotonic()
        squid.proc = subprocess.Popen(["squid", "-f", squid.conf, "-N"], stdout=subprocess.DEVNULL,
                                      stderr=subprocess.DEVNULL)
        ok = False
        while time.monotonic() - t0 < 300:
            try:
                _, head = __import__("bench_proxy").fetch_via(squid.port, url)
                hit = "HIT" in head.get("X-Cache", "")
                probes[0 if hit else 1] += 1
                if hit:
                    ok = True
                    break
            except OSError:
                pass
            time.sleep(0.05)
        s["ready_s"] = time.monotonic() - t0 if ok else float("nan")
        # A restarted squid answers at once but rebuilds its store index from swap.state in the
        # background: until that ends, objects not yet read back are misses. At 1M objects the
        # rebuild takes minutes, so the hit phase waits for it (its time is reported too).
        s["rebuilt_s"] = float("nan")
        while time.monotonic() - t0 < 1800:
            with open(cache_log, errors="replace") as f:
                f.seek(log_from)  # the first start logged a rebuild of the empty store too
                if "Finished rebuilding storage" in f.read():
                    s["rebuilt_s"] = time.monotonic() - t0
                    break
            time.sleep(0.2)
        s["rss_kb"] = rss_kb(squid.proc.pid)
        sown, shit = hits_timed(squid.port, hit_lua, consts, a.hit_seconds)
        s.update(hit=sown, wrk_p50=shit["p50_us"], wrk_p99=shit["p99_us"],
                 rss_after_hits_kb=rss_kb(squid.proc.pid))
        squid.stop()  # squid's access log is buffered: count it once squid has exited
        after = squid.hits_and_misses()
        s.update(hits=after[0] - logged[0] - probes[0], other=after[1] - logged[1] - probes[1])
        lock.give()

    n = g["objects_after"] or 1
    print(f"\nbench-scale: {a.objects} unique objects of 512 B from nginx on 127.0.0.1, "
          f"ghostproxy --memory-cache 0; one run")
    print(f"{'':11} {'fill/s':>8} {'ready s':>8} {'RSS MB':>7} {'disk/obj':>9} {'hit rate':>9} "
          f"{'hit p50 µs':>11} {'p99 µs':>8} {'p99.9 µs':>9} {'max µs':>8} {'hits':>6} "
          f"{'wrk p50/p99 µs':>16}")
    print(f"{'ghostproxy':11} {g['fill_rate']:8.0f} {g['ready_s']:8.2f} {g['rss_kb'] / 1024:7.1f} "
          f"{g['disk'] / n:8.0f}B {g['hits'] / max(1, g['hits'] + g['other']):9.3f} "
          f"{hit_cols(g)}")
    if s:
        sn = max(1, s["requests"] - s["bad"])
        print(f"{'squid':11} {s['fill_rate']:8.0f} {s['ready_s']:8.2f} {s['rss_kb'] / 1024:7.1f} "
              f"{s['disk'] / sn:8.0f}B {s['hits'] / max(1, s['hits'] + s['other']):9.3f} "
              f"{hit_cols(s)}")
    if "written" in g:
        print(f"ghostfs: {g['objects']} objects filled through the proxy (the fill rate is "
              f"theirs), {g['written']} more written straight into the index")
    print(f"ghostfs: {g['objects']} objects indexed after the fill, {g['objects_after']} after the "
          f"remount (mount {g['mount_s']:.2f} s); RSS empty {g['empty_rss_kb'] / 1024:.1f} MB, peak "
          f"during the fill {g['peak_fill_rss_kb'] / 1024:.1f} MB, filled "
          f"{g['filled_rss_kb'] / 1024:.1f} MB, after remount {g['rss_kb'] / 1024:.1f} MB, after hits "
          f"{g['rss_after_hits_kb'] / 1024:.1f} MB; RAM/object after remount "
          f"{(g['rss_kb'] - g['empty_rss_kb']) * 1024 / n:.0f} B; disk {g['disk'] / 1e6:.1f} MB "
          f"({g['disk'] / (n * 512):.2f}× the bodies)")
    print(f"ghostfs wrote {g['hit_write_bytes'] / 1e6:.1f} MB towards the disk during the hits "
          f"({g['hits'] + g['other']} requests; /proc/PID/io write_bytes); CPU per hit-phase "
          f"request: ghostfs {g['hit_cpu_us'][0]:.0f} µs, ghostproxy {g['hit_cpu_us'][1]:.0f} µs")
    print(f"ghostproxy answered the fill's requests in {g['wrk_s']:.1f} s; indexed after {g['fill_s']:.1f} s")
    wq = g.get("write_queue") or {}
    if wq:
        print("ghostfs write queue after the fill: "
              + ", ".join(f"{k} {wq[k]}" for k in ("writes", "backlog_batches", "most_merged",
                                                    "fill_backlog_peak") if k in wq))
    print(f"ghostfs ready after each of {len(g['ready_all'])} remounts (s): "
          + " ".join(f"{t:.2f}" for t in g["ready_all"]))
    if "crash_ready_s" in g:
        print(f"ghostfs after a SIGKILL: ready {g['crash_ready_s']:.2f} s, "
              f"{g['objects_after_crash']} objects")
    if s:
        print(f"squid: ready = restart until a hit; its store index rebuilt after "
              f"{s['rebuilt_s']:.1f} s (the hits were measured after that); RSS filled "
              f"{s['filled_rss_kb'] / 1024:.1f} MB")
    print(f"fill CPU per miss (user+system): ghostfs+ghostproxy {g['cpu_us']:.0f} µs"
          + (f", squid {s['cpu_us']:.0f} µs" if s else ""))
    print(f"machine: {os.cpu_count()} CPUs, load average {load0:.1f} at start, "
          f"{os.getloadavg()[0]:.1f} at end")


if __name__ == "__main__":
    main()
