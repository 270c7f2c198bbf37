#!/usr/bin/env python3
"""Side-by-side proxy benchmark: ghostproxy (over a ghostfs mount) vs squid (disk cache) vs
nginx's own proxy_cache (a caching forward proxy in front of the origin), cache hits of 16 KiB
objects with wrk, against one nginx origin on 127.0.0.1, in one run.

Called by scripts/bench-proxy.sh (which installs squid, wrk and nginx and builds the
programs). Every proxy is warmed with every object and checked to answer from its cache
(X-Ghost-Source: cache; squid's and nginx's X-Cache: HIT) before wrk runs, and their access
logs are counted afterwards, so only hits are measured. The rounds rotate the proxies' order.
nginx-cache runs one worker process, as squid and ghostproxy each serve from one process.

Figures (common/DESIGN.md §7: ratios measured side by side in one run):
  hits/s   wrk, 16 connections, 2 threads, absolute-form GETs over keep-alive connections
  p50/p99  wrk --latency, 1 connection (one request at a time)

Usage: bench_proxy.py --work DIR --ghostfs PATH --ghostproxy PATH [options]
"""
import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "integration"))
import harness as h  # noqa: E402

WRK_LUA = r"""
-- Forward-proxy requests: absolute-form targets, the origin's Host, objects in turn.
local urls = {}
local n = 0
init = function(args)
  for i = 1, #args do urls[i] = args[i] end
end
request = function()
  n = n + 1
  return wrk.format("GET", urls[(n % #urls) + 1], { ["Host"] = ORIGIN_HOST })
end
"""


def log(msg):
    print(f"== {msg}", file=sys.stderr, flush=True)


def fetch_via(proxy_port, url):
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({"http": f"http://127.0.0.1:{proxy_port}"}))
    with opener.open(url, timeout=10) as r:
        return r.read(), dict(r.headers)


class Server:
    """A process the benchmark started, with a squid-format access log (result code in field 4)."""
    proc = None
    access_log = None

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()

    def hits_and_misses(self):
        """(hits, other results) in the access log: TCP_HIT, TCP_MEM_HIT, HIT/200, ..."""
        hits = misses = 0
        with open(self.access_log) as f:
            for line in f:
                fields = line.split()
                if len(fields) > 3:
                    if "HIT" in fields[3]:
                        hits += 1
                    else:
                        misses += 1
        return hits, misses


class Squid(Server):
    def __init__(self, work):
        self.dir = os.path.join(work, "squid")
        self.cache = os.path.join(self.dir, "cache")
        os.makedirs(self.cache)
        self.port = h.free_port()
        self.access_log = os.path.join(self.dir, "access.log")
        self.proc = None
        self.conf = os.path.join(self.dir, "squid.conf")
        with open(self.conf, "w") as f:
            f.write(f"""http_port 127.0.0.1:{self.port}
cache_dir ufs {self.cache} 256 16 256
cache_mem 64 MB
maximum_object_size_in_memory 512 KB
access_log stdio:{self.access_log} squid
cache_log {self.dir}/cache.log
cache_store_log none
pid_filename {self.dir}/squid.pid
coredump_dir {self.dir}
cache_effective_user proxy
http_access allow localhost
http_access deny all
refresh_pattern . 0 20% 4320
shutdown_lifetime 1 seconds
dns_v4_first on
# No ICMP helper: its (pinger) process outlived squid's stop (bench-scale --full, round 19).
pinger_enable off
""")
        shutil.chown(self.dir, "proxy")
        for root, dirs, files in os.walk(self.dir):
            for d in dirs:
                shutil.chown(os.path.join(root, d), "proxy")

    def start(self):
        z = subprocess.run(["squid", "-f", self.conf, "-z", "-N"], capture_output=True, text=True, timeout=60)
        if z.returncode != 0:
            log(f"squid -z failed: {z.stderr.strip()[-500:]}")
            return False
        self.proc = subprocess.Popen(["squid", "-f", self.conf, "-N"], stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
        h.on_exit(self.stop)
        return h.wait_port(self.port, 20)


class NginxCache(Server):
    """nginx as a caching proxy: proxy_cache on a cache dir on the disk, one worker, every
    request (absolute-form, as to the other proxies) passed to the origin on a miss. The access
    log puts $upstream_cache_status/$status in field 4, like squid's result code."""

    def __init__(self, work, origin_url):
        self.dir = os.path.join(work, "nginx-cache")
        self.cache = os.path.join(self.dir, "cache")
        os.makedirs(self.cache)
        self.port = h.free_port()
        self.access_log = os.path.join(self.dir, "access.log")
        self.proc = None
        self.conf = os.path.join(self.dir, "nginx.conf")
        d = self.dir
        with open(self.conf, "w") as f:
            f.write(f"""worker_processes 1;
user root;
daemon off;
pid {d}/nginx.pid;
error_log {d}/error.log warn;
events {{ worker_connections 1024; }}
http {{
  log_format squidlike '$msec $request_time $remote_addr $upstream_cache_status/$status $body_bytes_sent $request_method $request_uri';
  access_log {self.access_log} squidlike;
  client_body_temp_path {d}/body;
  proxy_temp_path {d}/proxy;
  fastcgi_temp_path {d}/fastcgi;
  uwsgi_temp_path {d}/uwsgi;
  scgi_temp_path {d}/scgi;
  proxy_cache_path {self.cache} levels=1:2 keys_zone=bench:16m max_size=1g inactive=60m use_temp_path=off;
  upstream origin {{ server {origin_url.split("/")[2]}; keepalive 16; }}
  server {{
    listen 127.0.0.1:{self.port};
    location / {{
      proxy_pass http://origin;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_cache bench;
      proxy_cache_key $scheme$proxy_host$request_uri;
      add_header X-Cache $upstream_cache_status;
    }}
  }}
}}
""")

    def start(self):
        nginx = shutil.which("nginx") or "/usr/sbin/nginx"
        if not os.path.exists(nginx):
            log("nginx is missing: no nginx-cache arm")
            return False
        self.proc = subprocess.Popen([nginx, "-c", self.conf, "-p", self.dir],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        h.on_exit(self.stop)
        return h.wait_port(self.port, 20)


class Ghostproxy(Server):
    def __init__(self, work, exe, mount, control, extra_args=(), name="ghostproxy"):
        self.exe, self.mount, self.control = exe, mount, control
        self.extra_args = list(extra_args)
        self.port = h.free_port()
        self.access_log = os.path.join(work, f"{name}-access.log")
        self.proc = None

    def start(self):
        self.proc = subprocess.Popen([self.exe, "--listen", f"127.0.0.1:{self.port}", "--mount", self.mount,
                                      "--control", self.control, "--access-log", self.access_log,
                                      *self.extra_args],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        h.on_exit(self.stop)
        return h.wait_port(self.port, 20)


def run_wrk(port, lua, urls, connections, threads, seconds):
    cmd = ["wrk", "--latency", "-t", str(threads), "-c", str(connections), "-d", f"{seconds}s",
           "-s", lua, f"http://127.0.0.1:{port}", "--", *urls]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 60).stdout
    rps = re.search(r"Requests/sec:\s+([\d.]+)", out)
    p50 = re.search(r"^\s+50%\s+([\d.]+)(us|ms|s)\s*$", out, re.M)
    p99 = re.search(r"^\s+99%\s+([\d.]+)(us|ms|s)\s*$", out, re.M)
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)|Socket errors: .*", out)
    scale = {"us": 1.0, "ms": 1000.0, "s": 1e6}
    if not rps or not p50:
        raise RuntimeError(f"wrk output not understood:\n{out}")
    return {
        "rps": float(rps.group(1)),
        "p50_us": float(p50.group(1)) * scale[p50.group(2)],
        "p99_us": float(p99.group(1)) * scale[p99.group(2)] if p99 else float("nan"),
        "errors": errors.group(0) if errors else "",
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", required=True)
    ap.add_argument("--ghostfs", required=True)
    ap.add_argument("--ghostproxy", required=True)
    ap.add_argument("--objects", type=int, default=100, help="16 KiB objects on the origin")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=int, default=8, help="per wrk run")
    ap.add_argument("--memory-cache", help="ghostproxy's --memory-cache (e.g. 0: every hit asks ghostfs)")
    ap.add_argument("--ghostproxy-base", help="a second ghostproxy binary (e.g. main's), run as a fourth "
                    "arm 'ghostproxy-base' on the same mount, interleaved round by round with the others")
    a = ap.parse_args()
    os.environ["GHOST_BUILD"] = os.path.dirname(os.path.dirname(os.path.abspath(a.ghostfs)))

    os.chmod(a.work, 0o755)  # squid runs as user proxy and must reach its cache_dir
    site = os.path.join(a.work, "site")
    os.makedirs(os.path.join(site, "obj"))
    for i in range(a.objects):
        with open(os.path.join(site, "obj", f"{i}.bin"), "wb") as f:
            f.write(os.urandom(16 * 1024))
    nginx = h.Nginx(site, extra_location="expires 1h;")
    if not nginx.start():
        raise SystemExit("bench-proxy: nginx did not start")
    urls = [f"{nginx.url()}obj/{i}.bin" for i in range(a.objects)]
    origin_host = nginx.url().split("/")[2]
    lua = os.path.join(a.work, "proxy.lua")
    with open(lua, "w") as f:
        f.write(f'ORIGIN_HOST = "{origin_host}"\n' + WRK_LUA)

    mnt = os.path.join(a.work, "mnt")
    os.makedirs(mnt)
    control = os.path.join(a.work, "control.sock")
    fs = h.Ghostfs(mnt, os.path.join(a.work, "cache"), {"origin": nginx.url()}, control=control)
    if not fs.start():
        raise SystemExit(f"bench-proxy: ghostfs did not mount:\n{fs.output()}")
    h.on_exit(fs.stop)
    gp_args = ["--memory-cache", a.memory_cache] if a.memory_cache is not None else []
    gp = Ghostproxy(a.work, a.ghostproxy, mnt, control, gp_args)
    if not gp.start():
        raise SystemExit("bench-proxy: ghostproxy did not start")
    squid = Squid(a.work)
    if not squid.start():
        raise SystemExit("bench-proxy: squid did not start")
    proxies = [("ghostproxy", gp.port), ("squid", squid.port)]
    servers = {"ghostproxy": gp, "squid": squid}
    if a.ghostproxy_base:
        base = Ghostproxy(a.work, a.ghostproxy_base, mnt, control, gp_args, name="ghostproxy-base")
        if not base.start():
            raise SystemExit(f"bench-proxy: {a.ghostproxy_base} did not start")
        proxies.append(("ghostproxy-base", base.port))
        servers["ghostproxy-base"] = base
    ngc = NginxCache(a.work, nginx.url())
    if ngc.start():
        proxies.append(("nginx-cache", ngc.port))
        servers["nginx-cache"] = ngc
    else:
        log("nginx proxy_cache did not start: its arm is left out")

    log(f"warming the caches with {a.objects} objects of 16 KiB")
    for name, port in proxies:
        for _ in range(2):
            for u in urls:
                fetch_via(port, u)
    time.sleep(1)  # ghostproxy's fills reach the cache through ghostfs's write queue
    for name, port in proxies:
        _, phead = fetch_via(port, urls[0])
        if name.startswith("ghostproxy"):
            if phead.get("X-Ghost-Source") != "cache":
                raise SystemExit(f"bench-proxy: {name} does not answer from its cache after warming: {phead}")
            continue
        if "HIT" not in phead.get("X-Cache", ""):
            raise SystemExit(f"bench-proxy: {name} does not answer from its cache after warming: {phead}")
    before = {name: srv.hits_and_misses() for name, srv in servers.items()}

    results = {name: {"rps": [], "p50_us": [], "p99_us": []} for name, _ in proxies}
    for r in range(a.rounds):
        k = r % len(proxies)
        order = proxies[k:] + proxies[:k]  # each proxy goes first in turn
        for name, port in order:
            t = run_wrk(port, lua, urls, 16, 2, a.seconds)
            one = run_wrk(port, lua, urls, 1, 1, a.seconds)
            results[name]["rps"].append(t["rps"])
            results[name]["p50_us"].append(one["p50_us"])
            results[name]["p99_us"].append(one["p99_us"])
            log(f"round {r + 1} {name}: {t['rps']:.0f} req/s at 16 connections; p50 {one['p50_us']:.0f} µs at 1"
                + (f" ({t['errors']} {one['errors']})" if t["errors"] or one["errors"] else ""))
    after = {name: srv.hits_and_misses() for name, srv in servers.items()}

    med = {name: {k: statistics.median(v) for k, v in res.items()} for name, res in results.items()}
    spread = {name: {k: (min(v), max(v)) for k, v in res.items()} for name, res in results.items()}
    s = med["squid"]
    n = med.get("nginx-cache")
    print(f"\nbench-proxy: {a.objects} objects of 16 KiB from nginx on 127.0.0.1, all cache hits; "
          f"{a.rounds} rounds of {a.seconds} s per figure, proxies in turn; medians (min–max over rounds)"
          + (f"; ghostproxy --memory-cache {a.memory_cache}" if a.memory_cache is not None else ""))
    print(f"{'':15} {'hits/s (16 conn)':>17} {'rounds':>13} {'× squid':>8} {'× nginx':>8} "
          f"{'p50 µs (1 conn)':>16} {'rounds':>9} {'× squid':>8} {'× nginx':>8} {'p99 µs':>8}")
    for name, _ in proxies:
        v, sp = med[name], spread[name]
        print(f"{name:15} {v['rps']:17.0f} {sp['rps'][0]:6.0f}–{sp['rps'][1]:<6.0f} {v['rps'] / s['rps']:7.2f}× "
              + (f"{v['rps'] / n['rps']:7.2f}× " if n else f"{'n/a':>8} ")
              + f"{v['p50_us']:16.0f} {sp['p50_us'][0]:4.0f}–{sp['p50_us'][1]:<4.0f} {v['p50_us'] / s['p50_us']:7.2f}× "
              + (f"{v['p50_us'] / n['p50_us']:7.2f}× " if n else f"{'n/a':>8} ")
              + f"{v['p99_us']:8.0f}")
    for name in servers:
        hits = after[name][0] - before[name][0]
        misses = after[name][1] - before[name][1]
        print(f"{name}: {hits} hits, {misses} other results during the measurement (access log)")
    print(f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}")
    g = med["ghostproxy"]
    print(f"goal ≥ 2× squid's hits/s: {'yes' if g['rps'] >= 2 * s['rps'] else 'no'} ({g['rps'] / s['rps']:.2f}×); "
          f"lower p50: {'yes' if g['p50_us'] < s['p50_us'] else 'no'} ({g['p50_us']:.0f} vs {s['p50_us']:.0f} µs)")
    if n:
        print(f"goal ahead of nginx proxy_cache: hits/s {'yes' if g['rps'] > n['rps'] else 'no'} "
              f"({g['rps'] / n['rps']:.2f}×); p50 {'yes' if g['p50_us'] < n['p50_us'] else 'no'} "
              f"({g['p50_us']:.0f} vs {n['p50_us']:.0f} µs)")
    else:
        print("goal ahead of nginx proxy_cache: n/a (nginx-cache did not run)")
    if "ghostproxy-base" in med:
        b = med["ghostproxy-base"]
        print(f"ghostproxy against ghostproxy-base ({a.ghostproxy_base}): hits/s {g['rps'] / b['rps']:.2f}×, "
              f"p50 {g['p50_us'] / b['p50_us']:.2f}× ({g['p50_us']:.0f} vs {b['p50_us']:.0f} µs)")


if __name__ == "__main__":
    main()
