#!/usr/bin/env python3
"""scripts/plots.py's knob figure names every line: the energy axis has a legend with
the lower-bound line, and the static cache's live marker at K=0 says why it is there. Draws
from made-up runs, no ghostsim needed. TAP; skipped without matplotlib."""
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
import harness as h  # noqa: E402

PLAN = 3


def main():
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        h.skip_all("python3-matplotlib is not installed")
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "scripts"))
    import plots
    t = h.Tap(PLAN)
    sim = [{"knob": k, "mean_response_ms": 100 - k / 2, "energy_j": 50 + k / 4, "lower_bound_j": 30}
           for k in (0, 50, 100)]
    static = {"mean_response_ms": 90, "energy_j": 80}
    live = [{"policy": "static", "trace": "web.trace", "mean_response_ms": 91, "energy_j": 82},
            {"policy": "adaptive", "trace": "web.trace", "ghost_hints": True, "knob": 50,
             "mean_response_ms": 75, "energy_j": 62}]
    fig, (ax_t, ax_e) = plots.plt.subplots(1, 2)
    plots.draw_knob_axes(ax_t, ax_e, sim, sim, static, live, "web")
    energy = [x.get_text() for x in ax_e.get_legend().get_texts()] if ax_e.get_legend() else []
    time_ = [x.get_text() for x in ax_t.get_legend().get_texts()] if ax_t.get_legend() else []
    t.check("lower bound" in energy, "the energy axis's legend names the lower-bound line", energy)
    static_live = [x for x in energy + time_ if x.startswith("static live")]
    t.check(static_live and all("K=0" in x and "no knob" in x for x in static_live),
            "the static live marker at K=0 is explained in the legend", static_live)
    t.check("lower bound" not in time_ and "static cache (sim)" in time_,
            "the time axis keeps its own legend", time_)
    plots.plt.close(fig)
    t.done()


if __name__ == "__main__":
    main()
