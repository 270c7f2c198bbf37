#!/usr/bin/env python3
"""HTTPS through ghostproxy's CONNECT tunnel is shaped (issue 13's goal "HTTPS (CONNECT)
downloads shaped as well as plain HTTP ones"; proxy/connection.cc RelayTunnel): a 2 MB download
from nginx over TLS (a self-signed certificate made at run time with openssl, bound to the
namespace's address) behind the emulated link (scripts/linkemu.sh, 60 ms RTT, 20 Mb/s, Reno
origin without slow start after idle, as shaping_test), fetched with curl through
ghostproxy --mount --shape always as an HTTP proxy (curl sends CONNECT), with the shaping
paper's 16 KiB receive buffer (shape_buffer, as bench_shaping.py's shaped arm: ~24 KB bursts,
~70 of them).

Checks that the body is byte-identical to the origin's file (SHA-256), that the proxy's
/ghost/status counts one shaped download with bursts (more than 10; 0 when the tunnel's buffer
was fixed before the SYN: its window stayed below the full flight that ends slow start) and
estimated sleep, and that no
shaper is left active once the tunnel closed, and that the tunnel's shaper timed its wake-ups
with the path's round trip: its minimum RTT is the handshake's (tcpi_min_rtt when the connect
completed), within 10% of the link's 60 ms, lowered only by later samples (round 9: it was the
kernel's receive estimate 256 KiB in, with the bottleneck queue full: 41.5 ms on a 30 ms link).
One retry when a check fails (the timing of a
live link under the machine's load: a retried pass says so in the TAP output).

Skips without root, FUSE, the link emulator, nginx, curl or openssl."""
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts"))
import harness  # noqa: E402
import bench_shaping  # noqa: E402

PLANNED = 5
RTT_MS = 60
SIZE = 2_000_000
BUFFER = 16384


def sha(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def main():
    if os.geteuid() != 0:
        harness.skip_all("needs root (the link emulator)")
    harness.require_root_and_fuse()
    build = harness.build_dir()
    for tool in ("nginx", "curl", "openssl"):
        if shutil.which(tool) is None:
            harness.skip_all(f"{tool} is missing")
    nfq = os.path.join(build, "tests", "linkemu", "nfq_delay")
    # --name: the probe namespace is NAME-probe; with the default name a check running at the
    # same time in another test (shaping, shaping_naps) removes this one's probe.
    check = subprocess.run([os.path.join(bench_shaping.ROOT, "scripts", "linkemu.sh"), "check",
                            "--name", "shcon", "--nfq-delay", nfq], capture_output=True, text=True)
    if check.returncode != 0:
        harness.skip_all(f"the link emulator cannot run here: {check.stderr.strip()[:200]}")
    t = harness.Tap(PLANNED)
    work = tempfile.mkdtemp(prefix="ghost-shconnect-")
    os.chmod(work, 0o755)  # nginx's workers are not root
    harness.on_exit(lambda: shutil.rmtree(work, ignore_errors=True))
    os.makedirs(os.path.join(work, "www"))
    data = os.path.join(work, "www", "data")
    with open(data, "wb") as f:
        f.write(os.urandom(SIZE))
    want = sha(data)
    try:
        link = bench_shaping.Link(build, "shcon", "10.77.47", RTT_MS, 0, 0, 20, work,
                                  bench_shaping.DEFAULT_ORIGIN_CC, tls=True)
        harness.on_exit(link.close)
        mnt, ctl = os.path.join(work, "mnt"), os.path.join(work, "ctl")
        os.makedirs(mnt)
        conf = os.path.join(work, "proxy.toml")
        with open(conf, "w") as f:
            f.write(f"shape_buffer = {BUFFER}\n")
        fs = harness.Ghostfs(mnt, os.path.join(work, "cache"), {}, control=ctl)
        if not fs.start():
            raise RuntimeError(f"ghostfs did not start: {fs.output()[-1500:]}")
    except Exception as e:  # the set-up failed: every check fails with the reason
        for name in ("identical", "shaped", "bursts", "not active", "min rtt"):
            t.check(False, name, e)
        t.done()
    url = f"https://{link.ip}:{link.tls_port}/data"

    def attempt(n):
        """One download through a fresh proxy; returns (secs, body ok, status, curl's error)."""
        port = harness.free_port()
        log_path = os.path.join(work, f"proxy-{n}.log")
        with open(log_path, "w") as log:
            proxy = subprocess.Popen([os.path.join(build, "proxy", "ghostproxy"), "--listen",
                                      f"127.0.0.1:{port}", "--mount", mnt, "--control", ctl,
                                      "--config", conf, "--shape", "always",
                                      "--connect-ports", str(link.tls_port)],
                                     stdout=log, stderr=subprocess.STDOUT)
        try:
            if not harness.wait_port(port, 15):
                raise RuntimeError(f"ghostproxy did not start: {open(log_path).read()[-1500:]}")
            out = os.path.join(work, f"body-{n}")
            start = time.monotonic()
            # -k: the origin's certificate is self-signed; curl sends CONNECT to an https URL.
            r = subprocess.run(["curl", "-sSf", "-k", "-o", out, "-x", f"http://127.0.0.1:{port}", url],
                               capture_output=True, text=True, timeout=60)
            secs = time.monotonic() - start
            ok = r.returncode == 0 and sha(out) == want
            status = None
            for _ in range(20):  # the tunnel's close reaches the proxy's counters just after
                status = json.loads(subprocess.run(
                    ["curl", "-sf", "--noproxy", "*", f"http://127.0.0.1:{port}/ghost/status"],
                    capture_output=True, text=True, timeout=10, check=True).stdout)["shaping"]
                if status["active"] == 0:
                    break
                time.sleep(0.1)
            return secs, ok, status, r.stderr.strip()
        finally:
            proxy.terminate()
            proxy.wait(timeout=10)

    def good(res):
        _, ok, s, _ = res
        return (ok and s["shaped_downloads"] == 1 and s["bursts"] > 10 and s["sleep_s"] > 0 and
                s["active"] == 0 and rtt_ok(s))

    def rtt_ok(s):
        return (0.9 * RTT_MS <= s.get("last_handshake_rtt_ms", 0) <= 1.1 * RTT_MS and
                0.9 * RTT_MS <= s.get("last_min_rtt_ms", 0) <= 1.1 * RTT_MS)

    try:
        res = attempt(1)
        retried = not good(res)
        if retried:
            print(f"# first try: {res[0]:.2f} s, body ok {res[1]}, curl '{res[3]}', status "
                  f"{json.dumps(res[2])}; once more", flush=True)
            res = attempt(2)
    except Exception as e:
        for name in ("identical", "shaped", "bursts", "not active", "min rtt"):
            t.check(False, name, e)
        t.done()
    secs, ok, s, err = res
    note = " (second try)" if retried else ""
    t.check(ok, f"https://{link.ip}:{link.tls_port}/data through ghostproxy's CONNECT tunnel in {secs:.2f} s"
            f"{note}: the body is byte-identical to the origin's file (SHA-256)", err)
    t.check(s["shaped_downloads"] == 1, f"/ghost/status counts the tunnel as a shaped download "
            f"({s['shaped_downloads']})", json.dumps(s))
    t.check(s["bursts"] > 10 and s["sleep_s"] > 0,
            f"it went in bursts: {s['bursts']} bursts of {s['mean_burst_bytes']} bytes, "
            f"{s['sleep_s']:.2f} s estimated sleep (> 0), {s['missed_packets']} missed packets",
            json.dumps(s))
    t.check(s["active"] == 0, "no shaper is left active after the tunnel closed", json.dumps(s))
    t.check(rtt_ok(s), f"the tunnel's shaper timed wake-ups with the path's RTT: handshake "
            f"{s.get('last_handshake_rtt_ms', 0):.1f} ms, minimum {s.get('last_min_rtt_ms', 0):.1f} ms "
            f"(link {RTT_MS} ms, ±10%)", json.dumps(s))
    t.done()


if __name__ == "__main__":
    main()
