#!/usr/bin/env python3
"""The download-shaping experiment of the shaping paper, repeated (DESIGN §3.6).

For each emulated link (scripts/linkemu.sh: RTT, random loss, optional gamma jitter, a
20 Mb/s bottleneck) and each round, one download of SIZE bytes from nginx behind the link
through ghostproxy's shaping code (the driver is tests/proxy_shaping_test's emulated-link
test, an in-process proxy), twice: plain (--shape off) and shaped. tcpdump captures each on
the client side of the link; tests/linkemu/wnic_energy prices the capture with the WNIC model
(common/power/wnic_trace.h): plain TCP (card awake), ideal PSM (from the plain capture) and
shaped (the proxy's logged sleep/wake decisions; packets that came while it slept are
missed). Every body is compared with the origin's file by SHA-256.

The origin's namespace runs with net.ipv4.tcp_slow_start_after_idle=0 (the paper's servers
did not reset the congestion window after an idle period; Linux does by default) and the
namespace's default congestion control (BBR on this kernel; --origin-cc changes it); the
table's header says which.

Why shaping does not pay against this plain TCP (measured here, 60 ms / 20 Mb/s / 5 MB: plain
2.38 s, 3.35 J, so 1.41 W mean card power): plain TCP autotunes its window past the
bandwidth-delay product and receives at the bottleneck's rate with no idle gap, so its card
power never falls below P_idle. Every window the shaper closes adds at least one RTT to the
delay T and saves at most (P_idle − P_sleep)·RTT of energy E, so it changes E×D by at least
RTT·(E − (P_idle − P_sleep)·T) > 0 whenever E/T > P_idle − P_sleep (1.14 W on the WaveLAN
card). Against such a plain run no shaping lowers E×D; the "bound" column prints plain's
mean card power beside P_idle − P_sleep. The paper's plain TCP had a fixed window below the
bandwidth-delay product, which idles between windows: that idle is what shaping turns into
sleep.

Prints, per link, the medians (and min–max over the rounds) of energy×delay, time and energy
normalised to plain TCP, and missed packets per download, beside the paper's figures.
Used by scripts/bench-shaping.sh (full sweep) and tests/integration/shaping_test.py (one
CI-sized link)."""
import argparse
import hashlib
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAPER_ED_MEAN = 0.46  # the paper: mean normalised energy×delay over 30–120 ms × 0–1% loss
# SO_RCVBUF of the shaped and the fixed-window plain arms: the kernel doubles it and the window
# measured ~22 KB (~15 segments), the paper's era of fixed client windows. At 64 KiB (a ~90 KB
# window, 0.6 of the 150 KB bandwidth-delay product at 60 ms) shaping cannot stay within 1.3×
# the time: each window costs a round trip plus the burst, plain TCP one round trip.
DEFAULT_BUFFER = 16 * 1024
# The origin's congestion control. BBR (this kernel's default) paces a window over the round
# trip, so a burst is not one burst (measured at 60 ms, 16 KiB: 54–68 missed packets per 5 MB
# with BBR, 3–5 with Reno); the paper's servers sent each window at once.
DEFAULT_ORIGIN_CC = "reno"


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


class Link:
    """One emulated link with nginx behind it; removed on exit."""

    def __init__(self, build, name, subnet, rtt_ms, loss_pct, jitter_ms, rate_mbit, workdir,
                 origin_cc=None, tls=False):
        self.build, self.name, self.subnet, self.workdir = build, name, subnet, workdir
        self.rtt_ms = rtt_ms
        self.script = os.path.join(ROOT, "scripts", "linkemu.sh")
        self.env = dict(os.environ, GHOST_BUILD=build)
        args = [self.script, "up", "--name", name, "--subnet", subnet,
                "--delay-ms", str(rtt_ms / 2), "--down-kbit", str(int(rate_mbit * 1000)),
                "--up-kbit", str(int(rate_mbit * 1000)), "--queue-ms", "100",
                "--loss-pct", str(loss_pct), "--jitter-ms", str(jitter_ms)]
        subprocess.run([self.script, "down", "--name", name], env=self.env,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        subprocess.run(args, env=self.env, check=True, stdout=subprocess.DEVNULL,
                       stderr=subprocess.PIPE)
        # The sender as the paper's servers: no congestion-window reset after idle (the closed
        # window between bursts is idle time to it). Per namespace, so the host is untouched.
        sysctls = ["net.ipv4.tcp_slow_start_after_idle=0"]
        if origin_cc:
            sysctls.append(f"net.ipv4.tcp_congestion_control={origin_cc}")
        subprocess.run([self.script, "exec", "--name", name, "sysctl", "-q", "-w"] + sysctls,
                       env=self.env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self.cc = subprocess.run([self.script, "exec", "--name", name, "sysctl", "-n",
                                  "net.ipv4.tcp_congestion_control"], env=self.env,
                                 capture_output=True, text=True).stdout.strip()
        self.ip = subnet + ".2"
        self.port = 8081
        # `tls`: the same files over HTTPS on tls_port too, with a self-signed certificate for
        # the namespace's address made now (the bench's HTTPS arm goes through CONNECT).
        self.tls_port = 8443 if tls else None
        ngx = os.path.join(workdir, "nginx")
        os.makedirs(os.path.join(ngx, "logs"), exist_ok=True)
        tls_server = ""
        if tls:
            subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
                            "-keyout", os.path.join(ngx, "server.key"),
                            "-out", os.path.join(ngx, "server.pem"), "-subj", f"/CN={self.ip}",
                            "-addext", f"subjectAltName=IP:{self.ip}"],
                           check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            tls_server = (f"server {{ listen {self.ip}:{self.tls_port} ssl sndbuf=4m; "
                          f"ssl_certificate {ngx}/server.pem; ssl_certificate_key {ngx}/server.key; "
                          f"root {workdir}/www; }}")
        with open(os.path.join(ngx, "nginx.conf"), "w") as f:
            f.write(f"""daemon off; worker_processes 1; pid {ngx}/nginx.pid;
error_log {ngx}/logs/error.log;
events {{ worker_connections 64; }}
http {{ access_log off; sendfile on;
  server {{ listen {self.ip}:{self.port} sndbuf=4m; root {workdir}/www; }}
  {tls_server} }}
""")
        self.nginx = subprocess.Popen([self.script, "exec", "--name", name, "nginx", "-c",
                                       os.path.join(ngx, "nginx.conf"), "-p", ngx],
                                      env=self.env, stdout=subprocess.DEVNULL,
                                      stderr=subprocess.DEVNULL, start_new_session=True)
        for _ in range(50):
            if subprocess.run(["curl", "-s", "-o", "/dev/null", "-m", "2",
                               f"http://{self.ip}:{self.port}/"]).returncode == 0:
                break
            time.sleep(0.1)

    def close(self):
        try:
            os.killpg(self.nginx.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        self.nginx.wait(timeout=10)
        subprocess.run([self.script, "down", "--name", self.name], env=self.env,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def read_capture(pcap, port):
    """The capture as (t, from_origin, seq, end, raw_window) tuples, times in seconds (tcpdump
    -tt -S: absolute sequence numbers; windows as sent, unscaled)."""
    out = subprocess.run(["tcpdump", "-r", pcap, "-tt", "-n", "-S"], capture_output=True,
                         text=True).stdout
    pkts = []
    pat = re.compile(r"^(\d+\.\d+) IP [\d.]+\.(\d+) > [\d.]+\.(\d+): Flags \[([^\]]*)\]"
                     r"(?:, seq (\d+)(?::(\d+))?)?(?:, ack \d+)?, win (\d+)", re.M)
    for m in pat.finditer(out):
        t, sport, _, _, seq, end, win = m.groups()
        seq = int(seq) if seq else 0
        pkts.append((float(t), int(sport) == port, seq, int(end) if end else seq, int(win)))
    return pkts


def read_client_acks(pcap, port):
    """The client's cumulative ACKs as (t, ack) and, per data sequence number, when a segment
    starting there first came (round 19: how long the kernel held each ACK back)."""
    out = subprocess.run(["tcpdump", "-r", pcap, "-tt", "-n", "-S"], capture_output=True,
                         text=True).stdout
    pat = re.compile(r"^(\d+\.\d+) IP [\d.]+\.(\d+) > [\d.]+\.\d+: Flags \[[^\]]*\]"
                     r"(?:, seq (\d+)(?::(\d+))?)?(?:, ack (\d+))?", re.M)
    acks, first = [], {}
    for m in pat.finditer(out):
        t, sport, seq, end, ack = m.groups()
        if int(sport) == port:
            if seq and end and int(end) > int(seq):
                first.setdefault(int(seq), float(t))
        elif ack:
            acks.append((float(t), int(ack)))
    return acks, first


def delayed_ack_ages(pcap, port, detail, rtt_s):
    """Round 19: for each "ack-clocked" missed packet, how long after the oldest segment it
    acknowledged the client sent the ACK that clocked it (the latest client ACK RTT ± 1.5 ms
    before the packet, as classify_missed). Linux ACKs at once only the second segment after a
    read that grew the window; while the proxy does not read (a closed window, a held part)
    the rest waits for the delayed-ACK timer (tcpi_ato, at least 40 ms, on a 4 ms jiffy), so
    an age of 38 ms or more is that timer's ACK. Returns the ages in ms (None: not found)."""
    import bisect
    acks, first = read_client_acks(pcap, port)
    at = [a[0] for a in acks]
    ages = []
    for m in detail:
        if m["cause"] != "ack-clocked":
            continue
        i = bisect.bisect_right(at, m["t"] - rtt_s + 0.0015) - 1
        if i < 1:
            ages.append(None)
            continue
        oldest = first.get(acks[i - 1][1])
        ages.append(round((acks[i][0] - oldest) * 1e3, 1) if oldest is not None and
                    acks[i][1] > acks[i - 1][1] else None)
    return ages


def classify_missed(pcap, card_log, port, wake_s=0.002, rtt_s=None):
    """Why each missed packet was missed (the bench's --diagnose): replays the card log against
    the capture as wnic_energy does (a packet inside a nap, or inside the wake-up transition,
    is missed) and sorts each missed packet by what the client had done before it:
      retransmission  its bytes were below the highest byte already seen;
      straggler       it came within half a min RTT of the last open (a window update the
                      client sent) or before any open since the nap began: data of the burst
                      the shaper judged ended (the end was judged too early);
      early burst     it came later than that after an open but before the card listened
                      again: the next burst, sooner than the wake-up (woke too late);
      waking          as early burst, but inside the wake-up transition itself.
    Round 15 sorts each one again, by cause ("causes", first that fits):
      retransmission   as above;
      slow-start tail  in the download's first nap (the flight read freely is still clocked);
      hole open        new data while a hole (a lost segment) is still unfilled: the sender
                       sends on the duplicate ACKs during its recovery;
      napped on hole   a hole was open when the nap began (its retransmission or the data its
                       duplicate ACKs release came in the nap); counted before the next three;
      waking           inside the wake-up transition;
      open's data      RTT − 1.5 ms to RTT + 3 ms after the last open: the next burst; the card
                       woke late, or ("… after a clump") the open came before the nap: a clump
                       between the open and its data was taken for the burst;
      ack-clocked      RTT ± 1.5 ms after a client ACK that is not the last open: released by
                       the ACK of an earlier clump (a sender short of cwnd, slow start's tail);
      late tail        within half an RTT of the last open, or no open since the nap: the rest
                       of the burst the shaper judged ended (Td fired too early);
      other            none of these.
    `rtt_s`: the link's RTT (default 60 ms). Also returns, per open, the delay to the first new
    data after it (open→data), to compare the shaper's expected min RTT with."""
    pkts = read_capture(pcap, port)
    sched = []
    with open(card_log) as f:
        for line in f:
            w = line.split()
            if len(w) == 2 and w[0] in ("sleep", "wake"):
                sched.append((int(w[1]) / 1e9, w[0] == "wake"))
    data = [p for p in pkts if p[1] and p[3] > p[2]]
    if rtt_s is None:  # the handshake's RTT is not captured on this side: use open→data
        rtt_s = 0.06
    # Opens: a client segment whose window grew by a quarter or more over the previous one.
    opens, prev_win = [], None
    for p in pkts:
        if not p[1]:
            if prev_win is not None and p[4] > prev_win * 1.25 and p[4] - prev_win > 2:
                opens.append(p[0])
            prev_win = p[4]
    acks = [p[0] for p in pkts if not p[1]]
    import bisect
    counts = {"retransmission": 0, "straggler": 0, "early burst": 0, "waking": 0}
    causes = {k: 0 for k in ("retransmission", "slow-start tail", "hole open", "napped on hole",
                             "waking", "open's data", "open's data after a clump", "ack-clocked",
                             "late tail", "other")}
    detail = []
    awake, s, nap_start, top = True, 0, None, 0
    naps_seen, hole_at_nap = 0, False
    cum, ooo = None, []  # the receiver's cumulative byte and the out-of-order ranges above it
    oi = 0
    for t, _, seq, end, _ in data:
        while s < len(sched) and sched[s][0] + (wake_s if sched[s][1] else 0) <= t:
            awake = sched[s][1]
            if not awake:
                naps_seen += 1
                hole_at_nap = bool(ooo)
            nap_start = None if awake else sched[s][0]
            s += 1
        if cum is None:
            cum = seq
        hole = bool(ooo)
        if not awake:
            while oi + 1 < len(opens) and opens[oi + 1] <= t:
                oi += 1
            last_open = opens[oi] if opens and opens[oi] <= t else None
            waking = s < len(sched) and sched[s][1] and sched[s][0] <= t
            if end <= top:
                kind = "retransmission"
            elif last_open is None or last_open < nap_start or t - last_open < rtt_s / 2:
                kind = "straggler"
            else:
                kind = "waking" if waking else "early burst"
            counts[kind] += 1
            fresh = last_open is not None and last_open >= nap_start
            a = bisect.bisect_right(acks, t - rtt_s + 0.0015) - 1
            clocked = a >= 0 and acks[a] >= t - rtt_s - 0.0015 and acks[a] != last_open
            if end <= top:
                cause = "retransmission"
            elif naps_seen == 1:
                cause = "slow-start tail"
            elif hole:
                cause = "hole open"
            elif hole_at_nap:
                cause = "napped on hole"
            elif waking:
                cause = "waking"
            elif last_open is not None and rtt_s - 0.0015 <= t - last_open <= rtt_s + 0.003:
                # The open's data: the card woke late, or (the open before the nap) a clump
                # that came between the open and its data was taken for the burst.
                cause = "open's data" if fresh else "open's data after a clump"
            elif clocked:
                cause = "ack-clocked"
            elif not fresh or t - last_open < rtt_s / 2:
                cause = "late tail"
            else:
                cause = "other"
            causes[cause] += 1
            # What the link and the card did in the 150 ms before it (ms before, D data seq end
            # or A ack window, S/W the card), for reading one by hand.
            ctx = [(round((p[0] - t) * 1e3, 2), ("D%d" % (p[3] - top)) if p[1] else ("A%d" % p[4]))
                   for p in pkts if t - 0.15 <= p[0] <= t + 0.002 and (p[1] and p[3] > p[2] or not p[1])]
            ctx += [(round((x[0] - t) * 1e3, 2), "W" if x[1] else "S") for x in sched
                    if t - 0.15 <= x[0] <= t + 0.01]
            detail.append({"t": t, "kind": kind, "cause": cause,
                           "since_nap_ms": (t - nap_start) * 1e3,
                           "since_open_ms": (t - last_open) * 1e3 if last_open else None,
                           "context": sorted(ctx)})
            awake = True  # the card wakes for the rest (as wnic_energy)
        top = max(top, end)
        # The receiver's view: the cumulative byte, and the ranges that came past a hole.
        if seq <= cum:
            cum = max(cum, end)
        else:
            ooo.append((seq, end))
        ooo.sort()
        while ooo and ooo[0][0] <= cum:
            cum = max(cum, ooo.pop(0)[1])
    # open → first new data after it
    delays, di = [], 0
    for o in opens:
        while di < len(data) and data[di][0] <= o:
            di += 1
        if di < len(data):
            delays.append((data[di][0] - o) * 1e3)
    delays.sort()
    ages = delayed_ack_ages(pcap, port, detail, rtt_s)
    return {"counts": counts, "causes": causes, "missed": sum(counts.values()), "detail": detail,
            # Round 19: the ack-clocked misses whose clocking ACK was the kernel's delayed ACK.
            "delayed_ack": sum(1 for a in ages if a is not None and a >= 38), "ack_ages_ms": ages,
            "open_data_ms": [delays[int(q * (len(delays) - 1))] for q in (0, 0.05, 0.1, 0.5, 0.9)]
            if delays else []}


def cycle_budget(pcap, card_log, port, wake_s=0.002):
    """Where a shaped download's time and awake time go (the bench's --diagnose; round 11): the
    cycle model of DESIGN §3.6 (each window = the open's round trip + the burst + Td; the card
    awake for the burst, Td, its wake-up and the guard before the burst) read off the capture
    and the card log. Per nap (sleep → wake) the cycle around it:
      tail     the burst's last data → the sleep: Td as applied (a held part-window, whose
               tail is longer than 10 ms, is counted apart as `held`)
      to_open  the sleep → the window update the client sent (the open; user-space latency:
               the timer's slack, the loop, the drain)
      rtt      the open → the first data after it (what the wake-up is timed from: min RTT)
      guard    the card listening (wake + the transition) → that first data: the wake lead
      burst    that first data → the last data before the next sleep
    and the awake time outside the cycles: before the first nap (slow start) and after the
    last wake. Medians and sums, in ms."""
    pkts = read_capture(pcap, port)
    sched, start, end = [], None, None
    with open(card_log) as f:
        for line in f:
            w = line.split()
            if len(w) != 2:
                continue
            t = int(w[1]) / 1e9
            if w[0] in ("sleep", "wake"):
                sched.append((t, w[0] == "wake"))
            elif w[0] == "start":
                start = t
            elif w[0] == "end":
                end = t
    data = [p[0] for p in pkts if p[1] and p[3] > p[2]]
    if not data or not sched:
        return None
    ups, prev_win = [], None  # window updates that opened the window (as classify_missed)
    for p in pkts:
        if not p[1]:
            if prev_win is not None and p[4] > prev_win * 1.25 and p[4] - prev_win > 2:
                ups.append(p[0])
            prev_win = p[4]
    import bisect
    naps = [(sched[i][0], sched[i + 1][0]) for i in range(len(sched) - 1)
            if not sched[i][1] and sched[i + 1][1]]
    parts = {k: [] for k in ("tail", "held", "to_open", "rtt", "guard", "burst", "nap")}
    for k, (s, w) in enumerate(naps):
        i = bisect.bisect_right(data, s) - 1
        if i >= 0:
            tail = (s - data[i]) * 1e3
            parts["held" if tail > 10 else "tail"].append(tail)
        parts["nap"].append((w - s) * 1e3)
        j = bisect.bisect_left(ups, s)
        listen = w + wake_s
        f = bisect.bisect_left(data, w)
        if f < len(data):
            parts["guard"].append((data[f] - listen) * 1e3)
            if j < len(ups) and ups[j] < data[f]:
                parts["to_open"].append((ups[j] - s) * 1e3)
                parts["rtt"].append((data[f] - ups[j]) * 1e3)
            nxt = naps[k + 1][0] if k + 1 < len(naps) else None
            if nxt is not None:
                li = bisect.bisect_right(data, nxt) - 1
                if li >= f:
                    parts["burst"].append((data[li] - data[f]) * 1e3)
    first_sleep = next((t for t, a in sched if not a), None)
    last_wake = max((t for t, a in sched if a), default=None)
    t0 = start if start is not None else pkts[0][0]
    out = {"naps": len(naps),
           "slow_start_ms": ((first_sleep or data[-1]) - t0) * 1e3,
           "after_last_wake_ms": (data[-1] - last_wake) * 1e3 if last_wake else None,
           "delay_ms": (data[-1] - t0) * 1e3}
    for k, v in parts.items():
        out[k] = {"n": len(v), "median": statistics.median(v) if v else None,
                  "sum": sum(v)}
    return out


def download(build, link, mode, workdir, tag, profile, buffer=None, plain_rcvbuf=None,
             scheme="http", diagnose=False, limit_s=300, extra_env=None):
    """One download through the proxy with a capture; returns the priced runs. `buffer`: the
    shaper's SO_RCVBUF; `plain_rcvbuf`: with mode off, SO_RCVBUF fixed before connect (the
    paper's plain TCP); neither: the proxy's defaults (plain TCP autotunes). `scheme` https:
    from the link's TLS server through a CONNECT tunnel (the proxy fixes a shaped tunnel's
    buffer before connect)."""
    port = link.tls_port if scheme == "https" else link.port
    pcap = os.path.join(workdir, f"{tag}.pcap")
    log = os.path.join(workdir, f"{tag}.card")
    out = os.path.join(workdir, f"{tag}.body")
    for p in (log,):
        if os.path.exists(p):
            os.unlink(p)
    td = subprocess.Popen(["tcpdump", "-i", link.name, "-w", pcap, "-s", "128", "-B", "8192",
                           "--immediate-mode", f"host {link.ip} and port {port}"],
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    # tcpdump says "listening on" once the capture is open.
    line = td.stderr.readline()
    env = dict(os.environ, GHOST_SHAPING_URL=f"{scheme}://{link.ip}:{port}/data",
               GHOST_SHAPING_MODE=mode, GHOST_SHAPING_OUT=out)
    env.update(extra_env or {})
    if mode != "off":
        env["GHOST_SHAPER_CARD_LOG"] = log
    if buffer:
        env["GHOST_SHAPING_BUFFER"] = str(buffer)
    if plain_rcvbuf:
        env["GHOST_SHAPING_PLAIN_RCVBUF"] = str(plain_rcvbuf)
    r = subprocess.run([os.path.join(build, "tests", "proxy_shaping_test"),
                        "--gtest_filter=*EmulatedLink*"], env=env, capture_output=True,
                       text=True, timeout=limit_s)
    time.sleep(0.3)
    td.send_signal(signal.SIGTERM)
    td.wait(timeout=10)
    result = None
    for l in r.stdout.splitlines():
        if l.startswith("RESULT "):
            result = json.loads(l[7:])
    if result is None:
        raise RuntimeError(f"{tag}: no RESULT from the driver:\n{r.stdout[-2000:]}{r.stderr[-2000:]}")
    cmd = [os.path.join(build, "tests", "linkemu", "wnic_energy"), "--pcap", pcap,
           "--origin-port", str(port), "--profile", profile,
           # This tree's profiles: a build copied aside (--variants) may outlive its source tree.
           "--profile-dir", os.path.join(ROOT, "common", "profiles")]
    if mode != "off" and os.path.exists(log):
        cmd += ["--card-log", log]
    priced = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
    priced["driver"] = result
    if diagnose and mode != "off" and os.path.exists(log):
        priced["diagnosis"] = classify_missed(pcap, log, port, rtt_s=link.rtt_ms / 1e3)
        priced["diagnosis"]["budget"] = cycle_budget(pcap, log, port)
    priced["sha256"] = sha256(out) if os.path.exists(out) else None
    # Closed windows the proxy had to open itself (proxy/shaper.cc ForceOpen): why and where.
    priced["forced_open_log"] = [l for l in r.stderr.splitlines() if "opening a closed window" in l]
    if r.returncode != 0:  # the driver's own checks failed: keep why, for the table's "NO"
        priced["driver_failure"] = (r.stdout[-3000:] + r.stderr[-2000:])
    return priced


def ratios(auto, fixed, shaped, want):
    """One round's row: the shaped arm against both plains (see run_link)."""
    a, s = auto["plain"], shaped.get("shaped", shaped["plain"])
    # Without the fixed arm its ratios are NaN (JSON null after the dump).
    nan = {"ed": float("nan"), "delay_s": float("nan"), "energy_j": float("nan")}
    f = fixed["plain"] if fixed else nan
    if fixed is None:
        fixed = {"psm": nan, "sha256": want}
    row = {
        "auto_ed": a["ed"], "fixed_ed": f["ed"], "shaped_ed": s["ed"],
        # against the paper's baseline: plain TCP with the same fixed window
        "ed_fixed": s["ed"] / f["ed"], "time_fixed": s["delay_s"] / f["delay_s"],
        "energy_fixed": s["energy_j"] / f["energy_j"],
        "psm_fixed": fixed["psm"]["ed"] / f["ed"],
        # against plain TCP as Linux runs it: autotuned past the BDP
        "ed_auto": s["ed"] / a["ed"], "time_auto": s["delay_s"] / a["delay_s"],
        "energy_auto": s["energy_j"] / a["energy_j"],
        "psm_auto": auto["psm"]["ed"] / a["ed"],
        # fixed-window plain against autotuned plain (what the fixed window costs)
        "fixed_time_auto": f["delay_s"] / a["delay_s"],
        "missed": s["missed"], "bursts": shaped["driver"]["shaping"]["bursts"],
        "shaped_downloads": shaped["driver"]["shaping"].get("shaped_downloads", 0),
        "mean_burst_bytes": shaped["driver"]["shaping"].get("mean_burst_bytes", 0),
        "per_packet": shaped["driver"]["shaping"].get("per_packet", 0),
        "declined": shaped["driver"]["shaping"].get("declined", 0),
        "saturated": shaped["driver"]["shaping"].get("saturated", 0),
        # closed windows the proxy opened itself (a stall averted, proxy/shaper.h)
        "forced_opens": shaped["driver"]["shaping"].get("forced_opens", 0),
        "lost_opens": shaped["driver"]["shaping"].get("lost_opens", 0),
        # bursts held as part-windows until the rest of the grant came (round 10)
        "held_bursts": shaped["driver"]["shaping"].get("held_bursts", 0),
        # bursts timed by the ACK clock after a loss (round 12)
        "clocked_bursts": shaped["driver"]["shaping"].get("clocked_bursts", 0),
        # bursts with the grant clamped to the sender's cwnd (round 13)
        "clamped_bursts": shaped["driver"]["shaping"].get("clamped_bursts", 0),
        "clamps_declined": shaped["driver"]["shaping"].get("clamps_declined", 0),
        "clamps_released": shaped["driver"]["shaping"].get("clamps_released", 0),
        # The minimum RTT the shaper ended with and the connection's handshake RTT (round 9).
        "min_rtt_ms": shaped["driver"]["shaping"].get("last_min_rtt_ms"),
        "handshake_rtt_ms": shaped["driver"]["shaping"].get("last_handshake_rtt_ms"),
        "forced_open_log": shaped.get("forced_open_log", []),
        "secs": {"auto": a["delay_s"], "fixed": f["delay_s"], "shaped": s["delay_s"]},
        "joules": {"auto": a["energy_j"], "fixed": f["energy_j"], "shaped": s["energy_j"]},
        # Plain TCP's mean card power (the bound of the docstring), both plains.
        "plain_power_w": a["energy_j"] / a["delay_s"],
        "fixed_power_w": f["energy_j"] / f["delay_s"],
        "identical": all(x["sha256"] == want for x in (auto, fixed, shaped)),
        "bytes_ok": {k: x["sha256"] == want
                     for k, x in (("auto", auto), ("fixed", fixed), ("shaped", shaped))},
        "body_bytes": {k: x.get("driver", {}).get("body_bytes")
                       for k, x in (("auto", auto), ("fixed", fixed), ("shaped", shaped))},
        "driver_failure": {k: x["driver_failure"]
                           for k, x in (("auto", auto), ("fixed", fixed), ("shaped", shaped))
                           if "driver_failure" in x},
    }
    # The names the callers used before the fixed-window arm: against autotuned.
    row.update(ed=row["ed_auto"], time=row["time_auto"], energy=row["energy_auto"],
               psm=row["psm_auto"])
    return row


def run_link(build, rtt, loss, jitter, size, rounds, rate, profile, mode, name, subnet, log=print,
             origin_cc=None, buffer=DEFAULT_BUFFER, fixed_arm=True, at_connect=False,
             schemes=("http",), diagnose=False, keep=None, variants=None):
    """All rounds on one link; returns a dict of the per-round ratios and checks.

    Each round runs, for each of `schemes` in turn (http: a GET through the proxy; https: TLS
    through a CONNECT tunnel to the link's TLS server), in this order: plain TCP autotuned (the
    proxy's default), plain TCP with the paper's fixed window (--plain-rcvbuf = `buffer`, fixed
    before connect, shaping off) and shaped (SO_RCVBUF = `buffer`); ideal PSM is priced from the
    fixed-window plain capture (the paper's PSM ran over the same fixed-window TCP) and from the
    autotuned one. Ratios: `*_fixed` against fixed-window plain (None without `fixed_arm`),
    `*_auto` against autotuned plain, each against the same scheme's plains. `buffer` None: the
    proxy's default shaping buffer. The http rows are "rounds", the https rows "https_rounds".

    `variants` (--variants): [(name, build, env)]; each round then runs the plains once and one
    shaped download per variant (the driver from its build, its environment added), in an order
    rotated each round, every ratio against the same round's plains; the rows carry "variant"
    and the http rows of every variant are in "rounds"."""
    workdir = tempfile.mkdtemp(prefix="ghost-shaping-")
    os.chmod(workdir, 0o755)  # nginx's workers are not root
    try:
        os.makedirs(os.path.join(workdir, "www"))
        data = os.path.join(workdir, "www", "data")
        with open(data, "wb") as f:
            f.write(os.urandom(size))
        want = sha256(data)
        link = Link(build, name, subnet, rtt, loss, jitter, rate, workdir, origin_cc,
                    tls="https" in schemes)
        out = {scheme: [] for scheme in schemes}
        # One download's time limit: 300 s, or four times what the paper's fixed window
        # (~22 KB per round trip) needs for `size` (20 MB at 120 ms: ~110 s at that window,
        # 1.3–1.8× that shaped or with 1% loss; the limit is then 436 s).
        limit_s = max(300.0, 4 * size * (rtt / 1e3) / 22e3)
        try:
            for i in range(rounds):
                for scheme in schemes:
                    t = "" if scheme == "http" else scheme
                    auto = download(build, link, "off", workdir, f"plain{t}{i}", profile,
                                    scheme=scheme, limit_s=limit_s)
                    fixed = download(build, link, "off", workdir, f"fixed{t}{i}", profile,
                                     plain_rcvbuf=buffer or DEFAULT_BUFFER,
                                     scheme=scheme, limit_s=limit_s) if fixed_arm else None
                    # As the proxy shapes HTTP: the buffer is fixed after the handshake, with
                    # the window scale of an autotuned socket (a tunnel's before connect, by the
                    # proxy itself). `at_connect`: fixed before connect, as the plain arm's
                    # (measured at 60 ms: bursts ~22 KB instead of ~26 KB, more missed
                    # packets, E×D 0.67–0.69× instead of 0.32–0.52×).
                    arms = variants or [(None, build, None)]
                    arms = arms[i % len(arms):] + arms[:i % len(arms)]
                    for vname, vbuild, venv in arms:
                        vt = f"{t}{vname}" if vname else t
                        shaped = download(vbuild, link, mode, workdir, f"shaped{vt}{i}", profile,
                                          buffer=buffer, plain_rcvbuf=buffer if at_connect else None,
                                          scheme=scheme, diagnose=diagnose, limit_s=limit_s,
                                          extra_env=venv)
                        row = ratios(auto, fixed, shaped, want)
                        if vname:
                            row["variant"] = vname
                        if "diagnosis" in shaped:
                            d = shaped["diagnosis"]
                            row["diagnosis"] = d
                            log(f"# missed packets by cause (--diagnose): {d['counts']}; by cause (round 15): "
                                f"{ {k: v for k, v in d['causes'].items() if v} } (ack-clocked by a "
                                f"delayed ACK: {d.get('delayed_ack', 0)}); open→data ms "
                                f"min/p5/p10/p50/p90 {[round(x, 1) for x in d['open_data_ms']]}")
                            b = d.get("budget")
                            if b:
                                med = lambda k: b[k]["median"] if b[k]["median"] is not None else float("nan")  # noqa: E731
                                log(f"# cycle budget (--diagnose), ms: {b['naps']} naps; medians: burst "
                                    f"{med('burst'):.1f}, tail (Td) {med('tail'):.2f}, sleep→open "
                                    f"{med('to_open'):.2f}, open→data {med('rtt'):.1f}, guard {med('guard'):.2f}, "
                                    f"nap {med('nap'):.1f}; held {b['held']['n']} ({b['held']['sum']:.0f} ms); "
                                    f"slow start {b['slow_start_ms']:.0f}, delay {b['delay_ms']:.0f}")
                        out[scheme].append(row)
                        s = row["secs"]
                        log(f"# {scheme} rtt {rtt} ms loss {loss}% {size / 1e6:g} MB round {i + 1}"
                            f"{' [' + vname + ']' if vname else ''}: "
                            f"shaped vs fixed-window plain: E×D {row['ed_fixed']:.2f}× time "
                            f"{row['time_fixed']:.2f}× energy {row['energy_fixed']:.2f}× (PSM E×D "
                            f"{row['psm_fixed']:.2f}×); vs autotuned plain: E×D {row['ed_auto']:.2f}× "
                            f"time {row['time_auto']:.2f}×; missed {row['missed']}, bursts "
                            f"{row['bursts']} (held {row['held_bursts']}, clocked {row['clocked_bursts']}, clamped {row['clamped_bursts']}, clamps declined {row['clamps_declined']} released {row['clamps_released']}), forced opens {row['forced_opens']}, min RTT "
                            f"{row['min_rtt_ms'] or 0:.1f} ms (handshake {row['handshake_rtt_ms'] or 0:.1f}), secs "
                            f"auto/fixed/shaped {s['auto']:.2f}/{s['fixed']:.2f}/{s['shaped']:.2f}, "
                            f"bytes {'ok' if row['identical'] else 'DIFFER ' + json.dumps(row['body_bytes'])}")
        finally:
            link.close()
        r = {"rtt_ms": rtt, "loss_pct": loss, "size": size, "buffer": buffer,
             "origin_cc": link.cc, "rounds": out.get("http", [])}
        if "https" in out:
            r["https_rounds"] = out["https"]
        return r
    finally:
        if keep:  # the captures and card logs, for reading a round by hand (--keep)
            dest = os.path.join(keep, f"rtt{rtt:g}-loss{loss:g}-{size // 1000000}mb-{int(time.time())}")
            os.makedirs(dest, exist_ok=True)
            for f in os.listdir(workdir):
                if f.endswith((".pcap", ".card")):
                    shutil.copy(os.path.join(workdir, f), dest)
        shutil.rmtree(workdir, ignore_errors=True)


def card_gap_w(profile):
    """P_idle − P_sleep of the profile's card, watts (the docstring's bound)."""
    path = os.path.join(ROOT, "common", "profiles", f"{profile}.toml")
    try:
        import tomllib
        with open(path, "rb") as f:
            modes = tomllib.load(f)["mode"]
        return (modes[0]["power_mw"] - modes[-1]["power_mw"]) / 1000
    except (OSError, KeyError, ImportError):
        return float("nan")


def summary(values):
    m = statistics.median(values)
    return f"{m:5.2f} [{min(values):.2f}–{max(values):.2f}]"


def print_variants(results, schemes, names, out=sys.stdout):
    """--variants: per link, scheme and variant, the medians [min–max] over the rounds."""
    print(f"{'RTT':>4} {'loss':>4} {'MB':>3} {'scheme':6} {'variant':14} {'n':>2} | {'E×D /fixed':17} | "
          f"{'time /fixed':17} | {'energy /fixed':17} | missed/dl (each round)  | held | bytes ok", file=out)
    for r in results:
        for scheme in schemes:
            rows = r["rounds"] if scheme == "http" else r.get("https_rounds", [])
            for name in names:
                v = [x for x in rows if x.get("variant") == name]
                if not v:
                    continue
                missed = [x["missed"] for x in v]
                print(f"{r['rtt_ms']:4g} {r['loss_pct']:4g} {r['size'] / 1e6:3g} {scheme:6} {name:14} "
                      f"{len(v):2} | {summary([x['ed_fixed'] for x in v]):17} | "
                      f"{summary([x['time_fixed'] for x in v]):17} | "
                      f"{summary([x['energy_fixed'] for x in v]):17} | "
                      f"{statistics.median(missed):4g} {missed!s:18} | "
                      f"{sum(x['held_bursts'] for x in v):4} | "
                      f"{'yes' if all(x['identical'] for x in v) else 'NO'}", file=out)


# The paper's PSM comparison where it gave one (issue 13): shaping won at 60 ms, PSM at 90 ms.
PAPER_VS_PSM = {60: "won", 90: "lost"}


def scheme_rows(r):
    """(scheme, rounds) of one link's result, http first."""
    out = [("http", r["rounds"])] if r.get("rounds") else []
    if r.get("https_rounds"):
        out.append(("https", r["https_rounds"]))
    return out


def print_table(results, a, out=sys.stdout):
    """The sweep's table: per link, size and scheme, medians [min–max] over the rounds, with the
    paper's figures beside them; then the means per scheme and size, and HTTPS against HTTP."""
    w = lambda *x: print(*x, file=out)
    w(f"\nshaping at {a.rate_mbit:g} Mb/s, {a.rounds} round(s), card {a.profile}, mode {a.mode}, "
      f"SO_RCVBUF {a.buffer} (shaped and fixed-window plain), origin "
      f"{results[0]['origin_cc']} without slow start after idle; medians [min–max]")
    w("fixed = plain TCP with the same fixed window (the paper's baseline); auto = plain TCP "
      "autotuned (Linux's default); https = TLS through a CONNECT tunnel, against https plains; "
      "vs PSM: shaped E×D below ideal PSM's (the paper's verdict where it gave one)")
    w(f"{'RTT':>4} {'loss':>4} {'MB':>3} {'proto':>5} | {'E×D /fixed':>17} | {'time /fixed':>17} | "
      f"{'energy /fixed':>17} | {'PSM E×D /fixed':>17} | {'E×D /auto':>17} | {'time /auto':>17} | "
      f"missed/dl | bursts | ok | vs PSM (paper) | paper E×D")
    for r in sorted(results, key=lambda r: (r["size"], r["rtt_ms"], r["loss_pct"])):
        for scheme, rows in scheme_rows(r):
            col = lambda k: summary([x[k] for x in rows])  # noqa: E731
            wins = statistics.median(x["ed_fixed"] for x in rows) < \
                statistics.median(x["psm_fixed"] for x in rows)
            paper_psm = PAPER_VS_PSM.get(int(r["rtt_ms"]), "–") if r["loss_pct"] == 0 else "–"
            w(f"{r['rtt_ms']:4g} {r['loss_pct']:4g} {r['size'] / 1e6:3g} {scheme:>5} | "
              f"{col('ed_fixed'):>17} | {col('time_fixed'):>17} | {col('energy_fixed'):>17} | "
              f"{col('psm_fixed'):>17} | {col('ed_auto'):>17} | {col('time_auto'):>17} | "
              f"{statistics.median(x['missed'] for x in rows):9g} | "
              f"{statistics.median(x['bursts'] for x in rows):6g} | "
              f"{'yes' if all(x['identical'] for x in rows) else 'NO':>2} | "
              f"{'won' if wins else 'lost':>4} ({paper_psm:>4})    | {PAPER_ED_MEAN} mean, 0.27 best")
    for scheme in ("http", "https"):
        rs = [(r, rows) for r in results for s, rows in scheme_rows(r) if s == scheme]
        if not rs:
            continue
        eds = [x["ed_fixed"] for _, rows in rs for x in rows]
        auto = [x["ed_auto"] for _, rows in rs for x in rows]
        per_size = ", ".join(
            f"{size / 1e6:g} MB {statistics.mean(x['ed_fixed'] for r, rows in rs if r['size'] == size for x in rows):.2f}×"
            for size in sorted({r["size"] for r, _ in rs}))
        w(f"{scheme}: mean E×D shaped / fixed-window plain over the sweep: "
          f"{statistics.mean(eds):.2f}× ({per_size}; paper: {PAPER_ED_MEAN}× mean, best 0.27×, "
          f"against its fixed-window plain TCP); shaped / autotuned plain: "
          f"{statistics.mean(auto):.2f}×; bodies identical in "
          f"{sum(x['identical'] for _, rows in rs for x in rows)} of {len(eds)} rounds")
    pairs = [(statistics.median(x["ed_fixed"] for x in r["https_rounds"]),
              statistics.median(x["ed_fixed"] for x in r["rounds"]))
             for r in results if r.get("https_rounds") and r.get("rounds")]
    if pairs:
        q = [h / p for h, p in pairs]
        w(f"https against http, shaped E×D /fixed per link (medians): {statistics.median(q):.2f}× "
          f"median [{min(q):.2f}–{max(q):.2f}] over {len(q)} links (1 = shaped as well)")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--rtts", default="30,60,90,120")
    ap.add_argument("--losses", default="0,0.1,0.5,1")
    ap.add_argument("--jitter-ms", type=float, default=0)
    ap.add_argument("--sizes-mb", default="1,5,20", help="download sizes, MB (comma-separated)")
    ap.add_argument("--size-mb", type=float, help="one size (overrides --sizes-mb)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--rate-mbit", type=float, default=20)
    ap.add_argument("--buffer", type=int, default=DEFAULT_BUFFER,
                    help="SO_RCVBUF of the shaped and the fixed-window plain arm (the kernel "
                         f"doubles it; default {DEFAULT_BUFFER})")
    ap.add_argument("--profile", default="wavelan-2.4")
    ap.add_argument("--mode", default="always", choices=["always", "auto"])
    ap.add_argument("--name", default="shbench")
    ap.add_argument("--subnet", default="10.77.44")
    ap.add_argument("--origin-cc", default=DEFAULT_ORIGIN_CC,
                    help=f"the origin's congestion control (default {DEFAULT_ORIGIN_CC}; "
                         "'default': the namespace's)")
    ap.add_argument("--shaped-at-connect", action="store_true",
                    help="fix the shaped arm's buffer before connect too (the proxy fixes it "
                         "after the handshake for HTTP)")
    ap.add_argument("--schemes", default="http,https",
                    help="http (a GET through the proxy), https (TLS through a CONNECT tunnel) or "
                         "both (default), measured in the same rounds")
    ap.add_argument("--quick", action="store_true",
                    help="CI-sized: one link (60 ms, no loss), 1 MB, one round, both schemes "
                         "(the other link options still apply when given after it)")
    ap.add_argument("--diagnose", action="store_true",
                    help="classify each missed packet (straggler, early burst, waking, "
                         "retransmission) from the capture and the card log")
    ap.add_argument("--keep", metavar="DIR",
                    help="copy each link's captures (.pcap) and card logs (.card) into DIR")
    ap.add_argument("--variants", metavar="SPEC",
                    help="A/B in one run: NAME=BUILD[:VAR=VALUE,...] separated by ';' -- each "
                         "round runs the plains once (from --build) and one shaped download per "
                         "variant (its build's driver, its environment added), order rotated per "
                         "round; prints each variant's medians against the same plains")
    ap.add_argument("--json", help="write every round here")
    ap.add_argument("--plot", help="draw the sweep into this PNG (scripts/plots.py --shaping)")
    a = ap.parse_args()
    if a.quick:
        given = set(sys.argv[1:])
        for opt, key, value in (("--rtts", "rtts", "60"), ("--losses", "losses", "0"),
                                ("--sizes-mb", "sizes_mb", "1"), ("--rounds", "rounds", 1)):
            if opt not in given:
                setattr(a, key, value)
    schemes = tuple(x for x in a.schemes.split(",") if x)
    if not schemes or any(x not in ("http", "https") for x in schemes):
        ap.error("--schemes: http, https or both")
    if "https" in schemes and shutil.which("openssl") is None:
        ap.error("the https arm needs openssl (the origin's certificate); --schemes http runs without")
    sizes = [a.size_mb] if a.size_mb else [float(x) for x in a.sizes_mb.split(",")]
    cc = None if a.origin_cc == "default" else a.origin_cc
    variants = None
    if a.variants:
        variants = []
        for spec in a.variants.split(";"):
            name, _, rest = spec.partition("=")
            vbuild, _, envs = rest.partition(":")
            if not name or not vbuild or not os.path.exists(os.path.join(vbuild, "tests", "proxy_shaping_test")):
                ap.error(f"--variants: {spec!r} is not NAME=BUILD[:VAR=VALUE,...] with a built BUILD")
            env = dict(e.split("=", 1) for e in envs.split(",") if e)
            variants.append((name, vbuild, env))
    results = []
    for size in sizes:
        for rtt in [float(x) for x in a.rtts.split(",")]:
            for loss in [float(x) for x in a.losses.split(",")]:
                results.append(run_link(a.build, rtt, loss, a.jitter_ms, int(size * 1e6), a.rounds,
                                        a.rate_mbit, a.profile, a.mode, a.name, a.subnet,
                                        origin_cc=cc, buffer=a.buffer,
                                        at_connect=a.shaped_at_connect, schemes=schemes,
                                        diagnose=a.diagnose, keep=a.keep, variants=variants))
                if a.json:  # after every link, so an interrupted sweep keeps what it measured
                    with open(a.json, "w") as f:
                        json.dump(results, f, indent=1)
    if variants:
        print_variants(results, schemes, [v[0] for v in variants])
    else:
        print_table(results, a)
    if a.plot:
        py = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
        if subprocess.run([py, "-c", "import matplotlib"], capture_output=True).returncode != 0:
            print(f"no plot: matplotlib is missing for {py} (apt-get install python3-matplotlib); "
                  f"the table above has every figure", file=sys.stderr)
            return 0 if all(x["identical"] for r in results for _, rows in scheme_rows(r)
                            for x in rows) else 1
        subprocess.run([py, os.path.join(ROOT, "scripts", "plots.py"),
                        "--shaping", a.json or "-", "--shaping-out", a.plot], check=False,
                       input=json.dumps(results), text=True)
    return 0 if all(x["identical"] for r in results for _, rows in scheme_rows(r) for x in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
