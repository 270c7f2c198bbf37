#!/usr/bin/env python3
"""The shared store's two fill paths side by side, on one ghostfs mount: N fills of 512 B each
handed over through the fill file ("store", then open/write/close of .ghost/fill/<token>) and N
sent inline ("store" with "body_base64"), in interleaved rounds; prints fills/s per path and
round, and the median ratio. Client: one Python control connection (the daemon's side of a miss,
without the proxy's HTTP work or wrk).

Usage: bench_fill_paths.py BUILD_DIR [--fills N] [--rounds R]"""
import argparse
import base64
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "integration"))
import harness as h  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("build")
    ap.add_argument("--fills", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    os.environ["GHOST_BUILD"] = os.path.abspath(a.build)
    work = h.tempdir("ghost-fillpaths-")
    mnt, cache, sock = (os.path.join(work, n) for n in ("mnt", "cache", "control.sock"))
    os.makedirs(mnt)
    fs = h.Ghostfs(mnt, cache, {"www": "http://127.0.0.1:9/"}, control=sock)
    if not fs.start():
        raise SystemExit("ghostfs did not mount:\n" + fs.output())
    h.on_exit(fs.stop)
    ctl = h.Control(sock)
    body = os.urandom(512)
    b64 = base64.b64encode(body).decode()
    rates = {"file": [], "inline": []}
    n = 0
    for r in range(a.rounds):
        for path in ("file", "inline") if r % 2 == 0 else ("inline", "file"):
            t0 = time.monotonic()
            for _ in range(a.fills):
                key = f"http://fill.test/{n}"
                n += 1
                if path == "inline":
                    ctl.ok("store", key=key, response="{}", body_base64=b64)
                else:
                    with open(ctl.ok("store", key=key, response="{}")["path"], "wb") as w:
                        w.write(body)
            rates[path].append(a.fills / (time.monotonic() - t0))
        ctl.ok("flush")
    for path, rs in rates.items():
        print(f"{path:7} fills/s: " + ", ".join(f"{x:.0f}" for x in rs) + f"  median {statistics.median(rs):.0f}")
    ratios = [i / f for i, f in zip(rates["inline"], rates["file"])]
    print("inline/file per round: " + ", ".join(f"{x:.2f}" for x in ratios)
          + f"  median {statistics.median(ratios):.2f}")
    print(f"load average {os.getloadavg()[0]:.1f}")
    ctl.close()


if __name__ == "__main__":
    main()
