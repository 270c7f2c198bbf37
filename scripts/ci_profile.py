#!/usr/bin/env python3
"""Where a CI run's time went, in CPU seconds (scripts/test.sh's run, scripts/RESULTS.md ci12).

ci_profile.py BUILD_DIR [--times FILE] [--top N]

BUILD_DIR is the tests' build (build-test/): its .ninja_log gives each build step's wall, its
meson-logs/testlog*.json each test's wall. FILE is what GHOST_TEST_TIME=FILE scripts/test.sh
wrote (one "wall user sys command" line a test, from /usr/bin/time): each test's CPU (its own
and its waited-for children's) and so how much of its wall it spent asleep or waiting for a CPU.
On a shared machine the walls are the load's; the CPU seconds are the figures that carry over.
"""
import argparse
import glob
import json
import os
import shlex


def ninja_runs(build):
    """The .ninja_log's steps, one dict per ninja run (output -> (start, end) in s from that
    run's start): ninja writes a step when it ends, so a run begins where the end times fall."""
    runs, last_end = [], None
    with open(os.path.join(build, ".ninja_log")) as f:
        for line in f:
            if line.startswith("#"):
                continue
            start, end, _, out, _ = line.rstrip("\n").split("\t")
            start, end = int(start) / 1000, int(end) / 1000
            if last_end is None or end < last_end:
                runs.append({})
            runs[-1][out] = (start, end)
            last_end = end
    return runs


def tests(build):
    out = {}
    for path in glob.glob(os.path.join(build, "meson-logs", "testlog*.json")):
        with open(path) as f:
            for line in f:
                t = json.loads(line)
                out[t["name"]] = t
    return out


def test_key(command):
    """The test a /usr/bin/time command line ran: the script's or program's name."""
    words = shlex.split(command)
    for w in words:
        base = os.path.basename(w)
        if base.endswith("_test.py") or base.endswith("_test"):
            return base.removesuffix(".py").removesuffix("_test")
        if base.endswith("_test.sh"):
            return base.removesuffix("_test.sh")
    if words and os.path.basename(words[0]) == "fuzz.sh" and len(words) > 3:
        return words[3] + "_fuzz"
    return os.path.basename(words[-1] if words else "?")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("build")
    ap.add_argument("--times")
    ap.add_argument("--top", type=int, default=15)
    a = ap.parse_args()

    runs = ninja_runs(a.build)
    steps = {}
    for i, run in enumerate(runs):
        span = max(e for _, e in run.values()) - min(s for s, _ in run.values())
        print(f"build, ninja run {i + 1}: {len(run)} steps, {span:.0f} s from its first step to its last, "
              f"{sum(e - s for s, e in run.values()):.0f} s of step time")
        steps.update(run)
    total = sum(e - s for s, e in steps.values())
    tests_obj = sum(e - s for o, (s, e) in steps.items() if o.startswith("tests/") and o.endswith(".o"))
    print(f"build: {len(steps)} steps, {total:.0f} s of step time (test files' objects {tests_obj:.0f} s)")
    for o, (s, e) in sorted(steps.items(), key=lambda kv: kv[1][0] - kv[1][1])[:a.top]:
        print(f"  {e - s:7.1f} s  {o}")

    ts = tests(a.build)
    wall = sum(t["duration"] for t in ts.values())
    print(f"tests: {len(ts)}, {wall:.0f} s of test time")
    if not a.times:
        for name, t in sorted(ts.items(), key=lambda kv: -kv[1]["duration"])[:a.top]:
            print(f"  {t['duration']:7.1f} s  {name}")
        return
    cpu = {}
    with open(a.times) as f:
        for line in f:
            parts = line.split(" ", 3)
            if len(parts) < 4 or not parts[0].replace(".", "").isdigit():
                continue  # "Command exited with non-zero status" and the like
            w, u, s, cmd = float(parts[0]), float(parts[1]), float(parts[2]), parts[3].strip()
            cpu[test_key(cmd)] = (w, u + s)
    rows = sorted(cpu.items(), key=lambda kv: -kv[1][0])
    cpu_sum = sum(c for _, c in cpu.values())
    wall_sum = sum(w for w, _ in cpu.values())
    print(f"timed tests: {len(cpu)}, wall {wall_sum:.0f} s, CPU {cpu_sum:.0f} s "
          f"({100 * cpu_sum / wall_sum:.0f}% of the wall)")
    print("     wall      CPU  asleep/waiting  test")
    for name, (w, c) in rows[:a.top]:
        print(f"  {w:7.1f}  {c:7.1f}  {100 * (1 - c / w) if w else 0:5.0f}%  {name}")


if __name__ == "__main__":
    main()
