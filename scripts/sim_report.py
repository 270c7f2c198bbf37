#!/usr/bin/env python3
"""Runs ghostsim on the shipped traces and prints the comparison tables of the README.

Usage: sim_report.py GHOSTSIM TRACE_DIR [--profile NAME] [--markdown]

Tables: static vs adaptive (K=50) for the web and mail traces; the knob sweep; ghost hints
on and off for the all-cached web trace (the paper's Figure 12 experiment).
"""
import argparse
import json
import subprocess
import sys
import time

SWEEP = [0, 50, 90, 95, 99, 100]


def run(ghostsim, trace, profile, *args):
    cmd = [ghostsim, "--profile", profile, *args, trace]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"sim_report: {' '.join(cmd)} failed: {out.stderr.strip()}")
    return [json.loads(line) for line in out.stdout.splitlines() if line.strip()]


def pct(new, old):
    return f"{(new - old) / old * 100:+.1f}%" if old else "n/a"


def table(headers, rows, markdown):
    widths = [max(len(str(h)), *(len(str(r[i])) for r in rows)) for i, h in enumerate(headers)]
    def fmt(cells):
        if markdown:
            return "| " + " | ".join(str(c).rjust(w) for c, w in zip(cells, widths)) + " |"
        return "  ".join(str(c).rjust(w) for c, w in zip(cells, widths))
    lines = [fmt(headers)]
    lines.append("|" + "|".join("-" * (w + 2) for w in widths) + "|" if markdown
                 else "  ".join("-" * w for w in widths))
    lines += [fmt(r) for r in rows]
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("ghostsim")
    ap.add_argument("trace_dir")
    ap.add_argument("--profile", default="ipaq-2004")
    ap.add_argument("--markdown", action="store_true")
    a = ap.parse_args()
    md = a.markdown
    traces = {k: f"{a.trace_dir}/{k}.trace" for k in ("web", "mail", "web-cached")}

    print(f"Static cache vs adaptive (K=50, ghost hints on), profile {a.profile}\n")
    rows = []
    for kind in ("web", "mail"):
        s = run(a.ghostsim, traces[kind], a.profile, "--policy", "static")[0]
        d = run(a.ghostsim, traces[kind], a.profile, "--policy", "adaptive", "--knob", "50")[0]
        for name, r in (("static", s), ("adaptive K=50", d)):
            rows.append([kind, name, r["requests"], f'{r["mean_response_ms"]:.0f}',
                         f'{r["p95_response_ms"]:.0f}', f'{r["energy_j"]:.1f}',
                         f'{r["lower_bound_j"]:.1f}',
                         "" if r is s else pct(d["mean_response_ms"], s["mean_response_ms"]),
                         "" if r is s else pct(d["energy_j"], s["energy_j"])])
    print(table(["trace", "policy", "requests", "mean ms", "p95 ms", "energy J", "lower bound J",
                 "Δ time", "Δ energy"], rows, md))

    print(f"\nKnob sweep (adaptive, ghost hints on)\n")
    rows = []
    knobs = ",".join(map(str, SWEEP))
    for kind in ("web", "mail"):
        for r in run(a.ghostsim, traces[kind], a.profile, "--policy", "adaptive", "--knob-sweep", knobs):
            rows.append([kind, r["knob"], f'{r["mean_response_ms"]:.0f}', f'{r["energy_j"]:.1f}',
                         r["sources"]["disk"], r["sources"]["network"], r["ghost_hints_sent"]])
    print(table(["trace", "K", "mean ms", "energy J", "disk reads", "network reads", "ghost hints"],
                rows, md))

    print(f"\nSimulator speed: virtual time replayed per second of wall time\n")
    rows = []
    for kind in ("web", "mail"):
        t0 = time.perf_counter()
        r = run(a.ghostsim, traces[kind], a.profile, "--policy", "adaptive")[0]
        wall = time.perf_counter() - t0  # includes the lower-bound replay and process start
        rows.append([kind, f'{r["duration_s"]:.0f}', f"{wall * 1000:.0f}", f'{r["duration_s"] / wall:.0f}x'])
    print(table(["trace", "trace time s", "wall ms (2 replays + start-up)", "virtual / wall"], rows, md))

    print(f"\nGhost hints on the all-cached web trace (the paper's Figure 12 experiment)\n")
    rows = []
    on = run(a.ghostsim, traces["web-cached"], a.profile, "--policy", "adaptive", "--knob-sweep", knobs)
    off = run(a.ghostsim, traces["web-cached"], a.profile, "--policy", "adaptive", "--no-ghost-hints",
              "--knob-sweep", knobs)
    for h, n in zip(on, off):
        rows.append([h["knob"], f'{n["mean_response_ms"]:.0f}', f'{h["mean_response_ms"]:.0f}',
                     pct(h["mean_response_ms"], n["mean_response_ms"]), f'{n["energy_j"]:.1f}',
                     f'{h["energy_j"]:.1f}', pct(h["energy_j"], n["energy_j"]), h["ghost_hints_sent"]])
    print(table(["K", "mean ms (off)", "mean ms (on)", "Δ time", "energy J (off)", "energy J (on)",
                 "Δ energy", "hints sent"], rows, md))


if __name__ == "__main__":
    main()
