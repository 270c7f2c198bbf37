#!/usr/bin/env python3
"""scripts/count_tests.py counts what the tests really did: a throwaway meson project's TAP
tests, run by meson test, each one a way a test can end; its last line and exit status are
checked against the counts they must give. meson 1.0 judges a TAP test whose plan was not met
SKIP when all it printed were skips or nothing (its plan alone, or no output at all): those are
failures, never skips. TAP. Usage: count_tests_test.py (skipped without meson)."""
import os
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))

# name -> (the test's stdout, lines count_tests must print about it)
CASES = {
    "passes": ("1..2\nok 1 - a\nok 2 - b\n", []),
    "fails": ("1..2\nok 1 - a\nnot ok 2 - b\n", []),
    "skipped_whole": ("1..0 # SKIP nothing to test here\n", []),
    "all_skipped": ("1..2\nok 1 # SKIP x\nok 2 # SKIP x\n", []),
    "known_failure": ("1..2\nok 1 - a\nnot ok 2 - b # TODO not yet\n", ["known failure (TODO"]),
    "plan_unmet_skips": ("1..3\nok 1 # SKIP x\n", ["TAP plan 1..3 not met: 1 test lines: plan_unmet_skips"]),
    "plan_only": ("1..3\n", ["TAP plan 1..3 not met: 0 test lines: plan_only"]),
    "no_output": ("", ["no TAP plan (0 test lines): no_output"]),
}
# passes 2 + known_failure's ok 1; fails' not ok 2; the three unmet plans fail as a whole.
# Skipped: skipped_whole 1, all_skipped 2, known_failure's TODO 1. fails' ok 1 is a pass too.
WANT = "4 passed, 4 failed, 4 skipped"


def main():
    meson = shutil.which("meson")
    if not meson:
        print("1..0 # SKIP meson is not installed")
        return 0
    print("1..4", flush=True)
    work = tempfile.mkdtemp(prefix="ghost-count-tests-")
    try:
        lines = ["project('count_tests_cases')", f"py = find_program({sys.executable!r})"]
        for name, (out, _) in CASES.items():
            with open(os.path.join(work, name + ".py"), "w") as f:
                f.write(f"import sys\nsys.stdout.write({out!r})\n")
            lines.append(f"test({name!r}, py, args : [files({name + '.py'!r})], protocol : 'tap', suite : 'cases')")
        with open(os.path.join(work, "meson.build"), "w") as f:
            f.write("\n".join(lines) + "\n")
        build = os.path.join(work, "build")
        setup = subprocess.run([meson, "setup", build, work], capture_output=True, text=True, timeout=120)
        run = subprocess.run([meson, "test", "-C", build], capture_output=True, text=True, timeout=120)
        r = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "count_tests.py"),
                            os.path.join(build, "meson-logs", "testlog.junit.xml")],
                           capture_output=True, text=True, timeout=60)
        out = r.stdout.strip().splitlines()
        ran = setup.returncode == 0 and "plan_only" in run.stdout
        print(f"{'' if ran else 'not '}ok 1 - meson ran the {len(CASES)} cases")
        if not ran:
            for l in (setup.stdout + setup.stderr + run.stdout + run.stderr).splitlines()[-20:]:
                print(f"# {l}")
        last = out[-1] if out else ""
        print(f"{'' if last == WANT else 'not '}ok 2 - the last line is \"{WANT}\" (got \"{last}\")")
        missing = [w for _, (_, ws) in CASES.items() for w in ws if not any(w in l for l in out)]
        print(f"{'' if not missing else 'not '}ok 3 - each unmet plan and the known failure is named"
              + (f" (missing: {missing})" if missing else ""))
        print(f"{'' if r.returncode == 1 else 'not '}ok 4 - the exit status is 1 (got {r.returncode})")
        if last != WANT or missing or r.returncode != 1:
            for l in (r.stdout + r.stderr).splitlines()[-20:]:
                print(f"# {l}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
