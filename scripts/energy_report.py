#!/usr/bin/env python3
"""Live runs beside the simulator: one table row per live run, ghostsim run on the same trace.

Usage: energy_report.py --ghostsim PATH [--markdown] LIVE.jsonl ...

Each line of LIVE.jsonl is a JSON object printed by scripts/replay (the ghostsim fields plus
"mode": "live"). For each, ghostsim replays the same trace file (the run's "trace") with the
same profile, policy, knob and hint setting, and the table shows mean and p95 response time,
energy and the lower bound, live and simulated, with live ÷ simulated. The verdict lines
check the live experiment's tolerance (DESIGN §7.2): live within ±15% of simulated on mean response time and energy
(goal ±10%), and, live, adaptive K=50 beating static on both for each trace. Exit status 1 if
a verdict fails, 2 on bad input.
"""
import argparse
import json
import os
import subprocess
import sys

from sim_report import table


def load(paths):
    runs = []
    for path in paths:
        try:
            f = open(path)
        except OSError as e:
            sys.exit(f"energy_report: {e}")
        with f:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    r = json.loads(line)
                except json.JSONDecodeError as e:
                    print(f"energy_report: {path}:{n}: not a JSON object ({e})", file=sys.stderr)
                    sys.exit(2)
                for key in ("trace", "profile", "policy", "mean_response_ms", "energy_j"):
                    if key not in r:
                        print(f"energy_report: {path}:{n}: no \"{key}\"", file=sys.stderr)
                        sys.exit(2)
                runs.append(r)
    return runs


def simulate(ghostsim, live):
    cmd = [ghostsim, "--profile", live["profile"], "--policy", live["policy"]]
    if live["policy"] == "adaptive":
        cmd += ["--knob", str(live.get("knob", 50))]
        if not live.get("ghost_hints", True):
            cmd.append("--no-ghost-hints")
    cmd.append(live["trace"])
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        print(f"energy_report: {' '.join(cmd)} failed: {out.stderr.strip()}", file=sys.stderr)
        sys.exit(2)
    return json.loads(out.stdout.splitlines()[0])


def label(r):
    if r["policy"] == "static":
        return "static"
    return f"adaptive K={r.get('knob', 50)}" + ("" if r.get("ghost_hints", True) else " no hints")


def trace_name(r):
    """The trace's file name; a mail trace replayed through ghostproxy's IMAP proxy says so."""
    return os.path.basename(r["trace"]) + (" via IMAP proxy" if r.get("via") == "imap-proxy" else "")


def ratio(live, sim):
    return live / sim if sim else float("nan")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ghostsim", required=True)
    ap.add_argument("--markdown", action="store_true")
    ap.add_argument("--tolerance", type=float, default=0.15, help="acceptance band (default 0.15)")
    ap.add_argument("live", nargs="+")
    a = ap.parse_args()
    runs = load(a.live)
    rows, verdicts, pairs = [], [], []
    for live in runs:
        sim = simulate(a.ghostsim, live)
        pairs.append((live, sim))
        rt, en = ratio(live["mean_response_ms"], sim["mean_response_ms"]), ratio(live["energy_j"], sim["energy_j"])
        rows.append([trace_name(live), label(live), live["requests"],
                     f'{live["mean_response_ms"]:.0f}', f'{sim["mean_response_ms"]:.0f}', f"{rt:.2f}",
                     f'{live["p95_response_ms"]:.0f}', f'{sim["p95_response_ms"]:.0f}',
                     f'{live["energy_j"]:.1f}', f'{sim["energy_j"]:.1f}', f"{en:.2f}",
                     f'{live.get("lower_bound_j", float("nan")):.1f}', f'{sim["lower_bound_j"]:.1f}'])
        for what, r in (("mean response time", rt), ("energy", en)):
            ok = abs(r - 1) <= a.tolerance
            verdicts.append((ok, f"{trace_name(live)} {label(live)}: live {what} within "
                                 f"±{a.tolerance * 100:.0f}% of ghostsim: {'yes' if ok else 'no'} ({r:.2f}×"
                                 f"{', goal ±10% met' if abs(r - 1) <= 0.10 else ''})"))
    print(table(["trace", "policy", "requests", "mean ms live", "sim", "live/sim", "p95 ms live", "sim",
                 "energy J live", "sim", "live/sim", "lower bound J live", "sim"], rows, a.markdown))
    print()
    by_trace = {}
    for live, _ in pairs:  # runs of one trace (and prefix) compared with each other
        name = trace_name(live) + (f" (first {live['prefix_s']:g} s)" if live.get("prefix_s") else "")
        by_trace.setdefault(name, {})[label(live)] = live
    for trace, runs_of in by_trace.items():
        s, d = runs_of.get("static"), runs_of.get("adaptive K=50")
        if not (s and d):
            continue
        ok = d["mean_response_ms"] < s["mean_response_ms"] and d["energy_j"] < s["energy_j"]
        verdicts.append((ok, f"{trace}: live adaptive K=50 beats static on time and energy: "
                             f"{'yes' if ok else 'no'} ({d['mean_response_ms']:.0f} vs {s['mean_response_ms']:.0f} ms, "
                             f"{d['energy_j']:.1f} vs {s['energy_j']:.1f} J)"))
    for _, line in verdicts:
        print(line)
    sys.exit(0 if all(ok for ok, _ in verdicts) else 1)


if __name__ == "__main__":
    main()
