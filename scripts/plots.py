#!/usr/bin/env python3
"""Draws the paper's figures from ghostsim runs, with live runs on top when given.

Usage: plots.py --ghostsim PATH [--traces DIR] [--profile NAME] [--live FILE ...] [--out DIR]
       plots.py --shaping FILE [--shaping-out PNG]

Figures (PNG, one per file in --out):
  knob-web.png, knob-mail.png   response time and energy against the knob (adaptive with and
                                without ghost hints; the static cache as a horizontal line),
                                like the paper's Figures 8–11
  hints-web-cached.png          the all-cached web trace: ghost hints on and off against the
                                knob (the paper's Figure 12)
  energy-by-device.png          energy of each device and of the base power, static vs
                                adaptive K=50, per trace

shaping.png (--shaping: the JSON of scripts/bench_shaping.py --json, "-" for stdin)
                                shaped energy×delay against RTT, one line per loss rate and
                                size, normalised to plain TCP with the same fixed window (the
                                paper's baseline, solid) and to autotuned plain TCP (dashed);
                                ideal PSM over the fixed-window plain as crosses; HTTPS through
                                a CONNECT tunnel as triangles (dotted); the paper's 0.46× mean
                                as a horizontal line

--live takes files of JSON objects, one per line, as printed by scripts/replay (or
scripts/bench-energy.sh's results file); each live run is drawn as a marker at its knob
(static at the left edge), so the reader sees live and simulated side by side.
"""
import argparse
import json
import os
import subprocess
import sys

import matplotlib

matplotlib.use("Agg")  # files only; no display
import matplotlib.pyplot as plt  # noqa: E402

KNOBS = list(range(0, 101, 5)) + [92, 96, 97, 98, 99]


def ghostsim(binary, trace, profile, *args):
    cmd = [binary, "--profile", profile, *args, trace]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"plots: {' '.join(cmd)} failed: {out.stderr.strip()}")
    return [json.loads(line) for line in out.stdout.splitlines() if line.strip()]


def sweep(binary, trace, profile, hints):
    extra = [] if hints else ["--no-ghost-hints"]
    knobs = ",".join(str(k) for k in sorted(set(KNOBS)))
    runs = ghostsim(binary, trace, profile, "--policy", "adaptive", "--knob-sweep", knobs, *extra)
    return sorted(runs, key=lambda r: r["knob"])


def load_live(paths):
    runs = []
    for path in paths:
        with open(path) as f:
            for n, line in enumerate(f, 1):
                line = line.strip()
                if not line:
                    continue
                try:
                    runs.append(json.loads(line))
                except json.JSONDecodeError as e:
                    sys.exit(f"plots: {path}:{n}: not a JSON object ({e})")
    return runs


def trace_name(path):
    return os.path.splitext(os.path.basename(path))[0]


def live_points(live, trace, hints):
    """(knob, run) of live adaptive runs of `trace` with the given hint setting, and static runs."""
    adaptive = [r for r in live if r.get("policy") == "adaptive" and trace_name(r.get("trace", "")) == trace
                and bool(r.get("ghost_hints")) == hints]
    static = [r for r in live if r.get("policy") == "static" and trace_name(r.get("trace", "")) == trace]
    return adaptive, static


# The static cache has no knob: its live runs are drawn at the left edge, and the legend says so.
STATIC_LIVE_LABEL = "static live (no knob; drawn at K=0)"


def knob_figure(binary, traces, profile, trace, live, out):
    path = os.path.join(traces, f"{trace}.trace")
    with_hints = sweep(binary, path, profile, True)
    without = sweep(binary, path, profile, False)
    static = ghostsim(binary, path, profile, "--policy", "static")[0]
    fig, (ax_t, ax_e) = plt.subplots(1, 2, figsize=(11, 4.2))
    draw_knob_axes(ax_t, ax_e, with_hints, without, static, live, trace)
    fig.suptitle(f"{trace} trace, {profile}: response time and energy against the knob")
    fig.tight_layout()
    name = os.path.join(out, f"knob-{trace}.png")
    fig.savefig(name, dpi=110)
    plt.close(fig)
    return name


def draw_knob_axes(ax_t, ax_e, with_hints, without, static, live, trace):
    """Response time (ax_t) and energy (ax_e) against the knob; each axis has its own legend,
    so the energy axis's lower-bound line is named."""
    for ax, key, label in ((ax_t, "mean_response_ms", "mean response time (ms)"),
                           (ax_e, "energy_j", "energy (J)")):
        ax.plot([r["knob"] for r in with_hints], [r[key] for r in with_hints], "o-", ms=3,
                label="adaptive, ghost hints (sim)")
        ax.plot([r["knob"] for r in without], [r[key] for r in without], "s--", ms=3,
                label="adaptive, no hints (sim)")
        ax.axhline(static[key], color="grey", ls=":", label="static cache (sim)")
        if key == "energy_j":
            ax.axhline(with_hints[0]["lower_bound_j"], color="black", lw=0.8, ls="-.",
                       label="lower bound")
        for hints, marker in ((True, "^"), (False, "v")):
            adaptive, live_static = live_points(live, trace, hints)
            if adaptive:
                ax.plot([r["knob"] for r in adaptive], [r[key] for r in adaptive], marker, ms=9,
                        mfc="none", mew=1.6, label=f"adaptive live{'' if hints else ', no hints'}")
            if hints and live_static:
                ax.plot([0] * len(live_static), [r[key] for r in live_static], "D", ms=8, mfc="none",
                        mew=1.6, color="grey", label=STATIC_LIVE_LABEL)
        ax.set_xlabel("knob K (0 saves energy, 100 favours performance)")
        ax.set_ylabel(label)
        ax.set_xlim(-3, 103)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)


def hints_figure(binary, traces, profile, out):
    path = os.path.join(traces, "web-cached.trace")
    on = sweep(binary, path, profile, True)
    off = sweep(binary, path, profile, False)
    fig, (ax_t, ax_e) = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, key, label in ((ax_t, "mean_response_ms", "mean response time (ms)"),
                           (ax_e, "energy_j", "energy (J)")):
        ax.plot([r["knob"] for r in on], [r[key] for r in on], "o-", ms=3, label="ghost hints")
        ax.plot([r["knob"] for r in off], [r[key] for r in off], "s--", ms=3, label="no hints")
        ax.set_xlabel("knob K")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    ax_t.legend(fontsize=8)
    fig.suptitle(f"all-cached web trace, {profile}: ghost hints on and off (paper Fig. 12)")
    fig.tight_layout()
    name = os.path.join(out, "hints-web-cached.png")
    fig.savefig(name, dpi=110)
    plt.close(fig)
    return name


def device_figure(binary, traces, profile, live, out):
    bars = []  # (label, {part: joules})
    for trace in ("web", "mail"):
        path = os.path.join(traces, f"{trace}.trace")
        for policy, args in (("static", ["--policy", "static"]),
                             ("adaptive K=50", ["--policy", "adaptive", "--knob", "50"])):
            r = ghostsim(binary, path, profile, *args)[0]
            bars.append((f"{trace}\n{policy}\nsim", r))
            kind = "static" if policy == "static" else "adaptive"
            for lr in live:
                if (lr.get("policy") == kind and trace_name(lr.get("trace", "")) == trace
                        and (kind == "static" or (lr.get("knob") == 50 and lr.get("ghost_hints")))):
                    bars.append((f"{trace}\n{policy}\nlive", lr))
                    break
    parts = ["base"]
    for _, r in bars:
        for d in r.get("devices", []):
            if d["name"] not in parts:
                parts.append(d["name"])
    fig, ax = plt.subplots(figsize=(max(6, 1.3 * len(bars)), 4.5))
    bottoms = [0.0] * len(bars)
    for part in parts:
        heights = []
        for _, r in bars:
            if part == "base":
                heights.append(r.get("base_energy_j", 0.0))
            else:
                heights.append(next((d["energy_j"] for d in r.get("devices", []) if d["name"] == part), 0.0))
        ax.bar(range(len(bars)), heights, bottom=bottoms, label=part)
        bottoms = [b + h for b, h in zip(bottoms, heights)]
    ax.set_xticks(range(len(bars)), [b[0] for b in bars], fontsize=8)
    ax.set_ylabel("energy (J)")
    ax.set_title(f"energy by device, {profile}")
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    name = os.path.join(out, "energy-by-device.png")
    fig.savefig(name, dpi=110)
    plt.close(fig)
    return name


def shaping_figure(results, name):
    """scripts/bench_shaping.py's sweep: E×D of shaped against both plains, and PSM's."""
    med = lambda rows, k: sorted(x[k] for x in rows)[len(rows) // 2] if rows else float("nan")  # noqa: E731
    fig, (ax_f, ax_a) = plt.subplots(1, 2, figsize=(11, 4.2))
    links = {}
    for r in results:
        links.setdefault((r["size"], r["loss_pct"]), []).append(r)
    for i, ((size, loss), rs) in enumerate(sorted(links.items())):
        rs = sorted(rs, key=lambda r: r["rtt_ms"])
        rtts = [r["rtt_ms"] for r in rs]
        label = f"{size / 1e6:g} MB, loss {loss:g}%"
        line, = ax_f.plot(rtts, [med(r["rounds"], "ed_fixed") for r in rs], "o-", label=label)
        ax_f.plot(rtts, [med(r["rounds"], "psm_fixed") for r in rs], "x", color=line.get_color())
        ax_a.plot(rtts, [med(r["rounds"], "ed_auto") for r in rs], "o--", color=line.get_color(),
                  label=label)
        # HTTPS through a CONNECT tunnel, where the sweep ran it: triangles, same colour.
        tls = [r for r in rs if r.get("https_rounds")]
        if tls:
            ax_f.plot([r["rtt_ms"] for r in tls], [med(r["https_rounds"], "ed_fixed") for r in tls],
                      "^:", color=line.get_color(), label=label + " https")
            ax_a.plot([r["rtt_ms"] for r in tls], [med(r["https_rounds"], "ed_auto") for r in tls],
                      "^:", color=line.get_color())
    for ax, title in ((ax_f, "against plain TCP with the same fixed window (× = ideal PSM, "
                             "▲ = https via CONNECT)"),
                      (ax_a, "against autotuned plain TCP")):
        ax.axhline(0.46, color="grey", linestyle=":", label="paper: 0.46× mean")
        ax.axhline(1.0, color="black", linewidth=0.6)
        ax.set_xlabel("RTT (ms)")
        ax.set_ylabel("energy×delay, shaped / plain")
        ax.set_title(title, fontsize=9)
        ax.set_yscale("log")
        ax.grid(True, alpha=0.3)
    ax_f.legend(fontsize=7)
    fig.suptitle("Download shaping on the emulated link (scripts/bench-shaping.sh)", fontsize=10)
    fig.tight_layout()
    fig.savefig(name, dpi=110)
    plt.close(fig)
    return name


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ghostsim", help="the ghostsim binary (the knob figures)")
    ap.add_argument("--shaping", help="scripts/bench_shaping.py's --json file ('-': stdin)")
    ap.add_argument("--shaping-out", help="where shaping.png goes (default OUT/shaping.png)")
    ap.add_argument("--traces", default=os.path.join(here, "..", "common", "traces"))
    ap.add_argument("--profile", default="ipaq-2004")
    ap.add_argument("--live", nargs="*", default=[], help="files of live-run JSON lines")
    ap.add_argument("--out", default=os.path.join(here, "figures"))
    a = ap.parse_args()
    if a.shaping:
        with (sys.stdin if a.shaping == "-" else open(a.shaping)) as f:
            results = json.load(f)
        out = a.shaping_out or os.path.join(a.out, "shaping.png")
        os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
        print(shaping_figure(results, out))
        if not a.ghostsim:
            return
    if not a.ghostsim:
        ap.error("--ghostsim (or --shaping) is required")
    live = load_live(a.live)
    os.makedirs(a.out, exist_ok=True)
    for name in (knob_figure(a.ghostsim, a.traces, a.profile, "web", live, a.out),
                 knob_figure(a.ghostsim, a.traces, a.profile, "mail", live, a.out),
                 hints_figure(a.ghostsim, a.traces, a.profile, a.out),
                 device_figure(a.ghostsim, a.traces, a.profile, live, a.out)):
        print(name)


if __name__ == "__main__":
    main()
