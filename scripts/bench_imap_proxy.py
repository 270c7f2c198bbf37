#!/usr/bin/env python3
"""IMAP proxy benchmark (issue 14's goals): the latency of a cached message body fetched through
ghostproxy's IMAP proxy (proxy/imap_proxy.h) vs the same body fetched from dovecot directly.

  loopback   dovecot, ghostfs and ghostproxy on 127.0.0.1: one session each way, one
             `UID FETCH u BODY.PEEK[]` at a time, --fetches of them; p50/p95 and the ratio of the
             p50s (goal: the proxy adds at most 20%, proxy/direct <= 1.2).
  link       dovecot behind the emulated link (scripts/linkemu.sh, --delay-ms each way, default
             20 = 40 ms RTT; rates uncapped unless --down-kbit/--up-kbit, so the figures are the
             round trips, not the bandwidth): one cached body, p50 each way (goal: through the
             proxy >= 10x faster); --bodies distinct cached bodies, each with its own
             UID FETCH, one at a time, as a reader opening messages does, wall time each way
             (goal >= 10x). The direct time of the same bodies in ONE batch command
             (UID FETCH 1:N) is printed too, for scale.

Every body is fetched through the proxy once first and checked to come back
"(Ghost: from the cache)" before it is measured; the proxy's answers during the measurement are
counted (hits / fetches). Rounds (--rounds, default 3) alternate proxy and direct; each figure is
the median of the rounds with its spread (min-max). Called by scripts/bench-imap-proxy.sh.

Usage: bench_imap_proxy.py --build DIR [--rounds 3] [--fetches 300] [--bodies 1000]
                           [--body-size 4096] [--delay-ms 20] [--no-link]
"""
import argparse
import os
import socket
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "integration"))
import harness as h  # noqa: E402

UNAVAILABLE = 77


def log(msg):
    print(f"== {msg}", file=sys.stderr, flush=True)


def message(i, size):
    head = (f"From: s{i}@example.org\r\nTo: me@example.org\r\nSubject: bench {i}\r\n"
            f"Message-ID: <b{i}@ghost.bench>\r\n\r\n")
    out, n = head, 0
    while len(out) < size:
        out += f"{i:05d} {n:05d} " + "z" * 64 + "\r\n"
        n += 1
    return out[:size].encode() if len(out) > size else out.encode()


class Session:
    """A raw IMAP session (LOGIN, SELECT) with a reader of whole tagged responses."""

    def __init__(self, host, port, user, password):
        self.s = socket.create_connection((host, port), timeout=60)
        self.s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.f = self.s.makefile("rb")
        self.f.readline()
        self.n = 0
        self.cmd(f'LOGIN {user} "{password}"'.encode())
        self.cmd(b"SELECT INBOX")

    def cmd(self, text):
        self.n += 1
        tag = b"t%d" % self.n
        self.s.sendall(tag + b" " + text + b"\r\n")
        out = b""
        while True:
            line = self.f.readline()
            if not line:
                raise OSError("connection closed: " + out[-300:].decode(errors="replace"))
            out += line
            stripped = line.rstrip(b"\r\n")
            if stripped.endswith(b"}"):
                n = int(stripped.rsplit(b"{", 1)[1][:-1].rstrip(b"+"))
                out += self.f.read(n)
                continue
            if line.startswith(tag + b" "):
                if not line.startswith(tag + b" OK"):
                    raise OSError(f"{text!r}: {line!r}")
                return out

    def close(self):
        try:
            self.s.sendall(b"z LOGOUT\r\n")
        except OSError:
            pass
        self.s.close()


def timed_fetches(sess, uids):
    """Seconds of each UID FETCH BODY.PEEK[] in turn, and how many came from the cache."""
    times, hits = [], 0
    for u in uids:
        t0 = time.perf_counter()
        out = sess.cmd(b"UID FETCH %d BODY.PEEK[]" % u)
        times.append(time.perf_counter() - t0)
        hits += b"from the cache" in out
    return times, hits


def pct(values, p):
    v = sorted(values)
    return v[min(len(v) - 1, int(round(p / 100 * (len(v) - 1))))]


def med(values):
    return statistics.median(values), min(values), max(values)


def fmt(triple, unit="ms", scale=1000.0):
    m, lo, hi = triple
    return f"{m * scale:.3f} {unit} (spread {lo * scale:.3f}-{hi * scale:.3f})"


class Bench:
    def __init__(self, args):
        self.args = args
        self.build = os.path.abspath(args.build)
        os.environ["GHOST_BUILD"] = self.build
        self.linkemu = os.path.join(ROOT, "scripts", "linkemu.sh")
        self.env = dict(os.environ, GHOST_BUILD=self.build,
                        NFQ_DELAY=os.path.join(self.build, "tests", "linkemu", "nfq_delay"))

    def dovecot(self, count, host="127.0.0.1", in_ns=None):
        """A dovecot with `count` bodies in INBOX, listening on host (in namespace in_ns)."""
        dc = h.Dovecot(password="bench-pass")
        if host != "127.0.0.1":
            plain = dc.conf

            def conf():
                return plain().replace("127.0.0.1", host)
            dc.conf = conf
        md = dc.maildir
        for sub in ("", "/cur", "/new", "/tmp"):
            os.makedirs(md + sub, exist_ok=True)
        names = []
        for i in range(count):
            name = f"1700000000.M{i + 1}P1.bench"
            path = os.path.join(md, "cur", name + ":2,S")
            with open(path, "wb") as f:
                f.write(message(i + 1, self.args.body_size))
            names.append(f"{i + 1} :{name}")
        with open(os.path.join(md, "dovecot-uidlist"), "w") as f:
            f.write(f"3 V1700000000 N{count + 1}\n" + "".join(n + "\n" for n in names))
        for root, dirs, files in os.walk(dc.home):
            for x in dirs + files:
                os.chown(os.path.join(root, x), dc.UID, dc.UID)
        os.chown(dc.home, dc.UID, dc.UID)
        if in_ns is None:
            if not dc.start():
                raise SystemExit("dovecot did not start: " + dc.log()[-500:])
            return dc
        for sub in ("base", "state"):
            os.makedirs(os.path.join(dc.dir, sub), exist_ok=True)
        with open(os.path.join(dc.dir, "passwd"), "w") as f:
            f.write(f"{dc.user}:{{PLAIN}}{dc.password}:{dc.UID}:{dc.UID}::{dc.home}\n")
        with open(dc.conf_path, "w") as f:
            f.write(dc.conf())
        proc = subprocess.Popen([self.linkemu, "exec", "--name", in_ns, "/usr/sbin/dovecot", "-F", "-c",
                                 dc.conf_path], env=self.env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, start_new_session=True)

        def stop():
            subprocess.run([self.linkemu, "exec", "--name", in_ns, "/usr/bin/doveadm", "-c", dc.conf_path, "stop"],
                           capture_output=True, timeout=20, env=self.env)
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()
        h.on_exit(stop)
        if not self.wait_host(host, dc.port, 15):
            raise SystemExit("dovecot did not start in the origin namespace: " + dc.log()[-500:])
        return dc

    @staticmethod
    def wait_host(host, port, timeout):
        deadline = time.time() + timeout
        while time.time() < deadline:
            try:
                socket.create_connection((host, port), timeout=1).close()
                return True
            except OSError:
                time.sleep(0.1)
        return False

    def ghost(self, dc, host):
        """ghostfs with the account as a mail origin, and ghostproxy's IMAP proxy in front."""
        work = h.tempdir("ghost-bench-imap-")
        mnt = os.path.join(work, "mnt")
        os.makedirs(mnt)
        ctl = os.path.join(work, "control.sock")
        fs = h.Ghostfs(mnt, os.path.join(work, "cache"), {"mail": f"imap://{dc.user}@{host}:{dc.port}/"},
                       args=["--password-file", f"mail={dc.password_file()}"], control=ctl)
        if not fs.start(30):
            raise SystemExit("ghostfs did not mount: " + fs.output()[-500:])
        iport = h.free_port()
        plog = os.path.join(work, "ghostproxy.log")
        p = subprocess.Popen([os.path.join(self.build, "proxy", "ghostproxy"), "--listen", f"127.0.0.1:{h.free_port()}",
                              "--mount", mnt, "--control", ctl, "--imap-listen", f"127.0.0.1:{iport}",
                              "--imap-origin", f"imap://{host}:{dc.port}/",
                              # (the emulated origin is not loopback and its dovecot has no TLS)
                              "--imap-origin-plain-login"],
                             stdout=open(plog, "w"), stderr=subprocess.STDOUT)
        h.on_exit(lambda: p.poll() is None and (p.terminate(), p.wait(10)))
        if not h.wait_port(iport, 15):
            raise SystemExit("ghostproxy did not listen: " + open(plog).read()[-500:])
        return iport

    def warm(self, port, dc, uids):
        """Fetches every body through the proxy (one batch), then waits until each is a hit."""
        s = Session("127.0.0.1", port, dc.user, dc.password)
        lo, hi = min(uids), max(uids)
        s.cmd(b"UID FETCH %d:%d BODY.PEEK[]" % (lo, hi))
        deadline = time.time() + 120
        pending = list(uids)
        while pending and time.time() < deadline:
            _, hits = timed_fetches(s, [pending[0]])
            if hits:
                pending.pop(0)
            else:
                time.sleep(0.05)
        s.close()
        if pending:
            raise SystemExit(f"{len(pending)} bodies never came from the proxy's cache (first UID {pending[0]})")

    def loopback(self):
        n = self.args.fetches
        dc = self.dovecot(20)
        iport = self.ghost(dc, "127.0.0.1")
        uids = list(range(1, 21))
        self.warm(iport, dc, uids)
        seq = [uids[i % len(uids)] for i in range(n)]
        rounds = {"proxy": [], "direct": []}
        hits = 0
        for r in range(self.args.rounds):
            for who, port in (("proxy", iport), ("direct", dc.port)):
                s = Session("127.0.0.1", port, dc.user, dc.password)
                timed_fetches(s, uids[:5])  # warm the session
                times, hit = timed_fetches(s, seq)
                s.close()
                if who == "proxy":
                    hits += hit
                rounds[who].append((pct(times, 50), pct(times, 95)))
                log(f"loopback round {r + 1} {who}: p50 {pct(times, 50) * 1e3:.3f} ms p95 {pct(times, 95) * 1e3:.3f} ms")
        p50p = med([x[0] for x in rounds["proxy"]])
        p95p = med([x[1] for x in rounds["proxy"]])
        p50d = med([x[0] for x in rounds["direct"]])
        p95d = med([x[1] for x in rounds["direct"]])
        ratios = [p[0] / d[0] for p, d in zip(rounds["proxy"], rounds["direct"])]
        r = med(ratios)
        print(f"loopback, {self.args.body_size}-byte body, {n} fetches a round, {self.args.rounds} rounds "
              f"(proxy hits {hits}/{n * self.args.rounds}):")
        print(f"  direct p50 {fmt(p50d)}, p95 {fmt(p95d)}")
        print(f"  proxy  p50 {fmt(p50p)}, p95 {fmt(p95p)}")
        print(f"  proxy/direct p50 {r[0]:.2f} (spread {r[1]:.2f}-{r[2]:.2f})  "
              f"goal <= 1.20: {'MET' if r[0] <= 1.2 else 'NOT MET'}")

    def link(self):
        name = "imapb"
        subnet = "10.81.0"
        r = subprocess.run([self.linkemu, "check", "--name", name], capture_output=True, text=True, env=self.env)
        if r.returncode != 0:
            print(f"link: skipped, this machine cannot run the link emulator: {r.stderr.strip()[-300:]}")
            return
        up = [self.linkemu, "up", "--name", name, "--subnet", subnet, "--delay-ms", str(self.args.delay_ms),
              "--down-kbit", str(self.args.down_kbit), "--up-kbit", str(self.args.up_kbit)]
        h.on_exit(lambda: subprocess.run([self.linkemu, "down", "--name", name], capture_output=True, env=self.env))
        r = subprocess.run(up, capture_output=True, text=True, env=self.env, timeout=60)
        if r.returncode != 0:
            raise SystemExit(f"linkemu up failed: {r.stderr[-500:]}")
        host = f"{subnet}.2"
        nb = self.args.bodies
        dc = self.dovecot(nb, host=host, in_ns=name)
        iport = self.ghost(dc, host)
        uids = list(range(1, nb + 1))
        log(f"warming {nb} bodies through the proxy over the link")
        self.warm(iport, dc, uids)
        one = {"proxy": [], "direct": []}
        many = {"proxy": [], "direct": []}
        batch = []
        hits = total = 0
        k = self.args.single_fetches
        for rnd in range(self.args.rounds):
            for who, (hst, port) in (("proxy", ("127.0.0.1", iport)), ("direct", (host, dc.port))):
                s = Session(hst, port, dc.user, dc.password)
                times, hit = timed_fetches(s, [uids[0]] * k)
                one[who].append(pct(times, 50))
                t0 = time.perf_counter()
                times, hit2 = timed_fetches(s, uids)
                many[who].append(time.perf_counter() - t0)
                if who == "proxy":
                    hits += hit + hit2
                    total += k + len(uids)
                else:
                    t0 = time.perf_counter()
                    s.cmd(b"UID FETCH 1:%d BODY.PEEK[]" % nb)
                    batch.append(time.perf_counter() - t0)
                s.close()
                log(f"link round {rnd + 1} {who}: one body p50 {one[who][-1] * 1e3:.2f} ms, "
                    f"{nb} bodies {many[who][-1]:.2f} s")
        r1 = med([d / p for p, d in zip(one["proxy"], one["direct"])])
        rn = med([d / p for p, d in zip(many["proxy"], many["direct"])])
        print(f"link, {2 * self.args.delay_ms} ms RTT (down {self.args.down_kbit} kbit/s, up {self.args.up_kbit} "
              f"kbit/s, 0 = uncapped), {self.args.body_size}-byte bodies, {self.args.rounds} rounds "
              f"(proxy hits {hits}/{total}):")
        print(f"  one cached body: direct p50 {fmt(med(one['direct']))}, proxy p50 {fmt(med(one['proxy']))}")
        print(f"    direct/proxy {r1[0]:.1f}x (spread {r1[1]:.1f}-{r1[2]:.1f})  goal >= 10x: "
              f"{'MET' if r1[0] >= 10 else 'NOT MET'}")
        print(f"  {nb} cached bodies, one UID FETCH each: direct {fmt(med(many['direct']), 's', 1)}, "
              f"proxy {fmt(med(many['proxy']), 's', 1)}")
        print(f"    direct/proxy {rn[0]:.1f}x (spread {rn[1]:.1f}-{rn[2]:.1f})  goal >= 10x: "
              f"{'MET' if rn[0] >= 10 else 'NOT MET'}")
        print(f"  (for scale: direct, all {nb} in one UID FETCH 1:{nb}: {fmt(med(batch), 's', 1)})")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--fetches", type=int, default=300, help="loopback fetches a round")
    ap.add_argument("--single-fetches", type=int, default=30, help="link: fetches of one body a round")
    ap.add_argument("--bodies", type=int, default=1000)
    ap.add_argument("--body-size", type=int, default=4096)
    ap.add_argument("--delay-ms", type=int, default=20, help="one-way delay of the link (RTT = 2x)")
    ap.add_argument("--down-kbit", type=int, default=0)
    ap.add_argument("--up-kbit", type=int, default=0)
    ap.add_argument("--no-link", action="store_true")
    args = ap.parse_args()
    if os.geteuid() != 0 or not os.path.exists("/usr/sbin/dovecot"):
        print("bench-imap-proxy: needs root and dovecot", file=sys.stderr)
        sys.exit(UNAVAILABLE)
    b = Bench(args)
    b.loopback()
    sys.stdout.flush()
    if not args.no_link:
        b.link()


if __name__ == "__main__":
    main()
