#!/usr/bin/env python3
"""Push latency of the daemon's control socket: a `knob` set on one control connection until
the `modes` event reaches a subscriber on another connection.

Called by scripts/bench-push.sh (which builds ghostfs and cleans up); usable alone:

    bench_push.py --ghostfs build/fs/ghostfs [--runs 500] [--rounds 3] [--json out.json]

Mounts one ghostfs (no origin) in a temporary directory, opens two unix-socket connections to
its --control socket, subscribes one to "modes", and times, per run, from just before the
knob request is written on the other connection to the moment the subscriber has read the
whole event line. Prints p50/p99/max per round and the median of the rounds' figures.
"""

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time


class Conn:
    def __init__(self, path):
        self.s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.s.connect(path)
        self.buf = b""

    def send(self, obj):
        self.s.sendall((json.dumps(obj) + "\n").encode())

    def line(self, timeout=10.0):
        self.s.settimeout(timeout)
        while b"\n" not in self.buf:
            chunk = self.s.recv(65536)
            if not chunk:
                raise RuntimeError("control socket closed")
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return json.loads(line)

    def close(self):
        self.s.close()


def pct(values, p):
    v = sorted(values)
    k = min(len(v) - 1, max(0, int(round(p / 100.0 * (len(v) - 1)))))
    return v[k]


def wait_for(pred, timeout):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.02)
    return False


def one_round(path, runs):
    sub, ctl = Conn(path), Conn(path)
    try:
        sub.send({"id": 1, "op": "subscribe", "topics": ["modes"]})
        r = sub.line()
        if not r.get("ok"):
            raise RuntimeError(f"subscribe: {r}")
        ctl.send({"id": 0, "op": "knob"})
        knob = ctl.line()["result"]["knob"]
        lat = []
        clock = time.perf_counter_ns
        for i in range(runs):
            value = (knob + 1 + i) % 11  # a different value each time: the modes really change
            t0 = clock()
            ctl.send({"id": i + 2, "op": "knob", "value": value})
            while True:
                ev = sub.line()
                if ev.get("event") == "modes":
                    break
            t1 = clock()
            lat.append((t1 - t0) / 1000.0)
            reply = ctl.line()  # the knob's own reply, read untimed
            if not reply.get("ok"):
                raise RuntimeError(f"knob: {reply}")
        ctl.send({"id": 0, "op": "knob", "value": knob})
        ctl.line()
        return lat
    finally:
        sub.close()
        ctl.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ghostfs", required=True)
    ap.add_argument("--runs", type=int, default=500)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--json", help="write the figures here")
    a = ap.parse_args()

    work = tempfile.mkdtemp(prefix="ghost-bench-push.")
    mnt, cache = os.path.join(work, "mnt"), os.path.join(work, "cache")
    os.makedirs(mnt)
    os.makedirs(cache)
    sock = os.path.join(work, "ghostfs.sock")
    logf = open(os.path.join(work, "ghostfs.log"), "w")
    proc = subprocess.Popen([a.ghostfs, "-f", "--cache", cache, "--control", sock, mnt],
                            stdout=logf, stderr=subprocess.STDOUT)
    rc = 0
    try:
        if not wait_for(lambda: os.path.exists(sock) or proc.poll() is not None, 30) or \
                proc.poll() is not None:
            logf.flush()
            sys.stderr.write(open(os.path.join(work, "ghostfs.log")).read()[-4000:])
            raise RuntimeError("ghostfs did not start")
        one_round(sock, a.warmup)
        rounds = []
        for r in range(a.rounds):
            lat = one_round(sock, a.runs)
            fig = {"p50_us": pct(lat, 50), "p99_us": pct(lat, 99), "max_us": max(lat)}
            rounds.append(fig)
            print(f"round {r + 1}: {a.runs} runs  p50 {fig['p50_us']:.0f} µs  "
                  f"p99 {fig['p99_us']:.0f} µs  max {fig['max_us']:.0f} µs")
        med = {k: statistics.median(f[k] for f in rounds) for k in rounds[0]}
        print(f"knob -> modes push, median of {a.rounds} rounds: p50 {med['p50_us']:.0f} µs  "
              f"p99 {med['p99_us']:.0f} µs")
        ok = med["p99_us"] < 1000
        print(f"push p99 < 1 ms: {'yes' if ok else 'no'}")
        if a.json:
            with open(a.json, "w") as f:
                json.dump({"rounds": rounds, "median": med}, f, indent=1)
    except Exception as e:  # noqa: BLE001 - report and clean up
        print(f"bench-push: {e}", file=sys.stderr)
        rc = 1
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        subprocess.run(["fusermount3", "-u", "-z", mnt], stderr=subprocess.DEVNULL)
        shutil.rmtree(work, ignore_errors=True)
    return rc


if __name__ == "__main__":
    sys.exit(main())
