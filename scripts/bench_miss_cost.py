#!/usr/bin/env python3
"""Where a miss's CPU goes: N unique 512-byte URLs filled through ghostproxy (over a ghostfs
mount, `--memory-cache 0`, as bench_scale.py does) and, unless --no-squid, through squid, against
one nginx origin on 127.0.0.1; prints per process (ghostproxy, ghostfs, nginx, wrk, squid) the
CPU time per miss (user + system, from /proc/PID/stat and wrk's rusage) and the fill rate.

On a shared machine the fill rate moves with the load; the CPU per miss moves much less, so it is
the figure to compare between builds. With --perf DIR, `perf record -g` runs on ghostfs and
ghostproxy during the fill (DIR/ghostfs.data, DIR/ghostproxy.data).

Usage: bench_miss_cost.py BUILD_DIR [--objects N] [--no-squid] [--perf DIR] [--rounds R]
"""
import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "tests", "integration"))
import harness as h  # noqa: E402
from bench_proxy import Ghostproxy, Squid  # noqa: E402
from bench_scale import FILL_LUA, LineCounter, write_lua  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")


def cpu_s(pid):
    """User + system CPU seconds of process `pid` (all its threads)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / TICK
    except OSError:
        return 0.0


def children(pid):
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(p) for p in f.read().split()]
    except OSError:
        return []


def fill(port, lua, access_log, n, pids):
    """wrk (16 connections, 2 threads) until `access_log` grew by n lines; (seconds, wrk CPU s,
    {name: CPU s}) with the CPU of each of `pids` ({name: [pid, ...]}) over the fill."""
    before = {name: sum(cpu_s(p) for p in ps) for name, ps in pids.items()}
    log_lines = LineCounter(access_log)
    start = log_lines()
    cmd = ["wrk", "-t", "2", "-c", "16", "-d", "3600s", "--timeout", "10s", "-s", lua,
           f"http://127.0.0.1:{port}"]
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    while proc.poll() is None and log_lines() - start < n:
        time.sleep(0.05)
    elapsed = time.monotonic() - t0
    after = {name: sum(cpu_s(p) for p in ps) for name, ps in pids.items()}
    proc.send_signal(signal.SIGINT)
    proc.stdout.read()
    _, _, ru = os.wait4(proc.pid, 0)
    done = log_lines() - start
    return elapsed, done, ru.ru_utime + ru.ru_stime, {k: after[k] - before[k] for k in pids}


def strace_counts(directory, name, pid):
    """`strace -c -f` attached to `pid` (and its threads and children) writing DIR/NAME.txt
    when interrupted; [] without a directory."""
    if not directory:
        return []
    os.makedirs(directory, exist_ok=True)
    p = subprocess.Popen(["strace", "-c", "-f", "-p", str(pid), "-o", os.path.join(directory, name + ".txt")],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(1)
    return [p]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("build")
    ap.add_argument("--objects", type=int, default=10000)
    ap.add_argument("--rounds", type=int, default=1, help="fills of --objects new URLs each")
    ap.add_argument("--no-squid", action="store_true")
    ap.add_argument("--perf", help="directory for perf record's data of ghostfs and ghostproxy")
    ap.add_argument("--strace", help="directory for `strace -c -f` counts of ghostfs, ghostproxy "
                    "and squid over their fills (DIR/NAME.txt; strace slows the fill: the CPU "
                    "figures of such a run are not the build's)")
    a = ap.parse_args()
    build = os.path.abspath(a.build)
    os.environ["GHOST_BUILD"] = build
    work = h.tempdir("ghost-misscost-")
    os.chmod(work, 0o755)
    site = os.path.join(work, "site")
    os.makedirs(site)
    with open(os.path.join(site, "one.bin"), "wb") as f:
        f.write(os.urandom(512))
    nginx = h.Nginx(site, extra_location="location /o/ { try_files /one.bin =404; expires 1h; }")
    if not nginx.start():
        raise SystemExit("nginx did not start")
    origin = nginx.url()
    mnt, cache, control = (os.path.join(work, n) for n in ("mnt", "cache", "control.sock"))
    os.makedirs(mnt)
    fs = h.Ghostfs(mnt, cache, {"origin": origin}, args=["--cache-size", str(1 << 30)], control=control)
    if not fs.start():
        raise SystemExit("ghostfs did not mount:\n" + fs.output())
    h.on_exit(fs.stop)
    gp = Ghostproxy(work, os.path.join(build, "proxy", "ghostproxy"), mnt, control, ["--memory-cache", "0"])
    if not gp.start():
        raise SystemExit("ghostproxy did not start")
    nginx_pids = children(nginx.proc.pid) or [nginx.proc.pid]
    perfs = []
    if a.perf:
        os.makedirs(a.perf, exist_ok=True)
        for name, pid in (("ghostfs", fs.proc.pid), ("ghostproxy", gp.proc.pid)):
            perfs.append(subprocess.Popen(["perf", "record", "--call-graph", os.environ.get("PERF_CG", "fp"), "-F", "999", "-p", str(pid), "-o",
                                           os.path.join(a.perf, name + ".data")],
                                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        time.sleep(1)
    for name, pid in (("ghostfs", fs.proc.pid), ("ghostproxy", gp.proc.pid)):
        perfs += strace_counts(a.strace, name, pid)
    rows = []
    for r in range(a.rounds):
        lua = os.path.join(work, f"fill{r}.lua")
        # Unique per round: the URLs of round r are under /o/r<r>-<thread>/.
        write_lua(lua, FILL_LUA.replace('"o/" .. tid', f'"o/r{r}-" .. tid'), ORIGIN=origin,
                  ORIGIN_HOST=origin.split("/")[2])
        s, n, wrk_cpu, cpu = fill(gp.port, lua, gp.access_log, a.objects,
                                  {"ghostproxy": [gp.proc.pid], "ghostfs": [fs.proc.pid], "nginx": nginx_pids})
        rows.append(("ghostproxy", n / s, {**cpu, "wrk": wrk_cpu}, n))
    for p in perfs:
        p.send_signal(signal.SIGINT)
        p.wait(60)
    gp.stop()
    if not a.no_squid and shutil.which("squid"):
        squid = Squid(work)
        if not squid.start():
            raise SystemExit("squid did not start")
        straces = strace_counts(a.strace, "squid", squid.proc.pid)
        for r in range(a.rounds):
            lua = os.path.join(work, f"fill{r}.lua")
            s, n, wrk_cpu, cpu = fill(squid.port, lua, squid.access_log, a.objects,
                                      {"squid": [squid.proc.pid] + children(squid.proc.pid),
                                       "nginx": nginx_pids})
            rows.append(("squid", n / s, {**cpu, "wrk": wrk_cpu}, n))
        for p in straces:
            p.send_signal(signal.SIGINT)
            p.wait(60)
        squid.stop()
    print(f"\nbench-miss-cost: {a.objects} unique 512 B misses per round, wrk 16 connections; "
          f"CPU µs per miss (user+system)")
    for name, rate, cpu, n in rows:
        parts = "  ".join(f"{k} {v * 1e6 / n:6.0f}" for k, v in cpu.items())
        print(f"{name:11} {rate:7.0f} misses/s   {parts}   total {sum(cpu.values()) * 1e6 / n:6.0f}")
    for name in ("ghostproxy", "squid"):
        rs = [r for r in rows if r[0] == name]
        if len(rs) > 1:
            tot = [sum(r[2].values()) * 1e6 / r[3] for r in rs]
            print(f"{name}: median {statistics.median(r[1] for r in rs):.0f} misses/s, "
                  f"median total CPU {statistics.median(tot):.0f} µs/miss")
    print(f"load average {os.getloadavg()[0]:.1f}")
    nginx.stop()


if __name__ == "__main__":
    main()
