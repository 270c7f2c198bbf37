#!/usr/bin/env python3
"""Download shaping on the emulated link, CI-sized (scripts/bench_shaping.py, one link): a 5 MB
download at 60 ms RTT and 20 Mb/s through the proxy's shaping code, plain and shaped, each
captured with tcpdump and priced with the WNIC model (tests/linkemu/wnic_energy). Checks that
both bodies are byte-identical to the origin's file (SHA-256), that the shaped download was
timed per packet and went in bursts, that the model priced it, and (a TAP TODO: shaping does
not pay on this link yet; measured 3-5× plain TCP's energy×delay on a loaded 2-core machine)
that its energy×delay is below 0.8× plain TCP's. That TODO cannot pass against this plain TCP:
it autotunes past the bandwidth-delay product and never idles, and each window shaping closes
adds an RTT of delay for at most (P_idle − P_sleep)·RTT of energy, which raises E×D whenever
plain's mean card power (1.41 W measured) exceeds P_idle − P_sleep (1.14 W): see
scripts/bench_shaping.py. The product behaviour that follows is checked for real: with
--shape auto the proxy declines on this link and the download is not slowed (it kept the
shaping buffer and took 1.35× plain TCP's time before the window was given back). The
origin runs without slow start after idle (the paper's servers). Skips without root, the link
emulator, nginx or tcpdump."""
import os
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts"))
import harness  # noqa: E402
import bench_shaping  # noqa: E402

PLANNED = 7


def main():
    if os.geteuid() != 0:
        harness.skip_all("needs root (the link emulator)")
    build = harness.build_dir()
    for tool in ("nginx", "tcpdump", "curl"):
        if shutil.which(tool) is None:
            harness.skip_all(f"{tool} is missing")
    nfq = os.path.join(build, "tests", "linkemu", "nfq_delay")
    check = subprocess.run([os.path.join(bench_shaping.ROOT, "scripts", "linkemu.sh"), "check",
                            "--nfq-delay", nfq], capture_output=True, text=True)
    if check.returncode != 0:
        harness.skip_all(f"the link emulator cannot run here: {check.stderr.strip()[:200]}")
    tap = harness.Tap(PLANNED)
    try:
        r = bench_shaping.run_link(build, 60, 0, 0, 5_000_000, 1, 20, "wavelan-2.4", "always",
                                   "shci", "10.77.45", log=lambda s: print(s, flush=True))
    except Exception as e:  # the run itself failed: every check fails with the reason
        for name in ("run", "identical", "per packet", "bursts", "E×D", "auto declines",
                     "auto not slowed"):
            tap.check(False, name, e)
        tap.done()
    row = r["rounds"][0]
    tap.check(True, "the plain and the shaped download ran and were priced")
    tap.check(row["identical"], "both bodies are byte-identical to the origin's file (SHA-256)")
    tap.check(row["per_packet"] == 1, "the shaped download was timed per packet (capture)", row)
    tap.check(row["bursts"] > 0, "the shaped download went in bursts", row)
    ok = row["ed"] < 0.8
    print(f"{'ok' if ok else 'not ok'} 5 - shaped energy×delay {row['ed']:.2f}× plain TCP < 0.8× "
          f"# TODO cannot pay against autotuned plain TCP (plain card power "
          f"{row['plain_power_w']:.2f} W > P_idle − P_sleep; scripts/bench_shaping.py)", flush=True)
    tap.n += 1
    try:
        a = bench_shaping.run_link(build, 60, 0, 0, 5_000_000, 1, 20, "wavelan-2.4", "auto",
                                   "shci", "10.77.45", log=lambda s: print(s, flush=True))["rounds"][0]
    except Exception as e:
        for name in ("auto declines", "auto not slowed"):
            tap.check(False, name, e)
        tap.done()
    tap.check(a["declined"] == 1 and a["bursts"] == 0 and a["identical"],
              "--shape auto declines here (eq. 4: shaping would cost more), bytes identical", a)
    tap.check(a["time"] < 1.2, f"the declined download is not held to the shaping window "
              f"({a['time']:.2f}× plain TCP's time < 1.2×)", a)
    tap.done()


if __name__ == "__main__":
    main()
