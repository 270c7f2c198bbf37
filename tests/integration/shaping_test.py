#!/usr/bin/env python3
"""Download shaping on the emulated link, CI-sized (scripts/bench_shaping.py, one link): a 5 MB
download at 60 ms RTT and 20 Mb/s through the proxy's shaping code, plain and shaped, each
captured with tcpdump and priced with the WNIC model (tests/linkemu/wnic_energy). Checks that
both bodies are byte-identical to the origin's file (SHA-256), that the shaped download was
timed per packet and went in bursts, that the model priced it, and (a TAP TODO: shaping does
not pay on this link yet; measured 3-5× plain TCP's energy×delay on a loaded 2-core machine)
that its energy×delay is below 0.8× plain TCP's. Skips without root, the link emulator, nginx or tcpdump."""
import os
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts"))
import harness  # noqa: E402
import bench_shaping  # noqa: E402

PLANNED = 5


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
        for name in ("run", "identical", "per packet", "bursts", "E×D"):
            tap.check(False, name, e)
        tap.done()
    row = r["rounds"][0]
    tap.check(True, "the plain and the shaped download ran and were priced")
    tap.check(row["identical"], "both bodies are byte-identical to the origin's file (SHA-256)")
    tap.check(row["per_packet"] == 1, "the shaped download was timed per packet (capture)", row)
    tap.check(row["bursts"] > 0, "the shaped download went in bursts", row)
    ok = row["ed"] < 0.8
    print(f"{'ok' if ok else 'not ok'} 5 - shaped energy×delay {row['ed']:.2f}× plain TCP < 0.8× "
          f"# TODO shaping does not pay on the emulated link yet", flush=True)
    tap.n += 1
    tap.done()


if __name__ == "__main__":
    main()
