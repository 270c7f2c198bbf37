#!/usr/bin/env python3
"""Prints "N passed, N failed[, N skipped]" from meson's JUnit logs (one or more).

googletest binaries contribute one test case per TEST; TAP scripts one per check.
A TAP check reported "not ok ... # TODO" is a known failure that is not enforced yet: meson
counts it as a pass, so it is taken out of the passed count here, listed, and counted as
skipped (it is neither passed nor a regression).
A TAP test whose plan was not met (fewer or more "ok"/"not ok" lines than its "1..N", or no plan
at all) fails as a whole here: meson 1.0 judges such a test SKIP when every line it printed was a
skip, or when it printed none (a test that exits 0 after its plan and before its first check).
Exits 1 if any failed, or if the log holds no test at all. --also-failed N adds N failures
found outside the log (scripts/test.sh: what the run left behind, one per process or mount).
"""
import json
import os
import re
import sys
import xml.etree.ElementTree as ET

TODO = re.compile(r"^not ok \d+ - (.*?)\s+# TODO\b(.*)$")
PLAN = re.compile(r"^1\.\.(\d+)\b")
TAP_TEST = re.compile(r"^(?:not )?ok\b")


def json_log(junit_path):
    """meson's JSON log beside a JUnit log (testlog.junit.xml -> testlog.json; --logbase)."""
    base = junit_path[:-len(".junit.xml")] if junit_path.endswith(".junit.xml") else junit_path
    return base + ".json"


def json_records(junit_path):
    """The records of meson's JSON log beside a JUnit log, one a test, up to the first that
    cannot be read; none when the log is missing."""
    try:
        with open(json_log(junit_path)) as f:
            for line in f:
                yield json.loads(line)
    except (OSError, ValueError):
        return


def known_failures(junit_path):
    """TAP "not ok # TODO" lines from meson's JSON log: (test, check, reason)."""
    out = []
    for rec in json_records(junit_path):
        for l in rec.get("stdout", "").splitlines():
            m = TODO.match(l)
            if m:
                out.append((rec.get("name", "?"), m.group(1), m.group(2).strip()))
    return out


def tap_tests(junit_path):
    """Names of the build's TAP tests, from meson's introspection beside the log
    (BUILD/meson-logs/X.junit.xml -> BUILD/meson-info/intro-tests.json); None when it is missing."""
    build = os.path.dirname(os.path.dirname(os.path.abspath(junit_path)))
    try:
        with open(os.path.join(build, "meson-info", "intro-tests.json")) as f:
            return {t["name"] for t in json.load(f) if t.get("protocol") == "tap"}
    except (OSError, ValueError, KeyError, TypeError):
        return None


def unmet_plans(junit_path):
    """TAP tests that meson judged SKIP though their plan was not met: [(test, why)]. A whole
    skip is "1..0 # SKIP why"; a plan of N > 0 is met by N test lines, skips included."""
    tap = tap_tests(junit_path)
    out = []
    for rec in json_records(junit_path):
        if rec.get("result") != "SKIP":
            continue
        name = rec.get("name", "?")
        lines = rec.get("stdout", "").splitlines()
        plans = [int(m.group(1)) for m in map(PLAN.match, lines) if m]
        ran = sum(1 for l in lines if TAP_TEST.match(l))
        if not plans:
            # meson's log names a test "project:suite / name", its introspection "name".
            if ran or tap is None or name.rsplit(" / ", 1)[-1] in tap:
                out.append((name, f"no TAP plan ({ran} test lines)"))
        elif plans[0] != ran:
            out.append((name, f"TAP plan 1..{plans[0]} not met: {ran} test lines"))
    return out


def skipped_cases(junit_root, test):
    """The JUnit log's skipped cases of one test: its TAP lines (a suite "project.test"), or the
    test itself as one case of the project's suite when it printed no test line."""
    n = 0
    for suite in junit_root.iter("testsuite"):
        own = suite.get("name", "").endswith("." + test)
        for c in suite.iter("testcase"):
            if c.find("skipped") is not None and (own or c.get("name") == test):
                n += 1
    return n


def failed_without_a_failed_case(junit_root, junit_path):
    """Tests that meson judged failed (a non-zero exit, a crash, a timeout, a TAP plan that does
    not match) while none of their cases in the JUnit log failed: [(test, result)]. Each counts
    as one failure, so a test that dies after its last "ok" is never counted as passing."""
    bad_suites = set()
    for suite in junit_root.iter("testsuite"):
        for c in suite.iter("testcase"):
            if c.find("failure") is not None or c.find("error") is not None:
                # A TAP or gtest test is a suite of its own; an exit-status test is one case
                # of the project's suite.
                bad_suites.add(suite.get("name", ""))
                bad_suites.add(suite.get("name", "") + "." + c.get("name", ""))
    out = []
    for rec in json_records(junit_path):
        if rec.get("result") not in ("FAIL", "ERROR", "TIMEOUT", "UNEXPECTEDPASS"):
            continue
        name = rec.get("name", "?")
        if not any(s == name or s.endswith("." + name) or f".{name}." in s for s in bad_suites):
            out.append((name, rec["result"]))
    return out


def main(paths, also_failed=0):
    passed = failed = skipped = 0
    for path in paths:
        try:
            root = ET.parse(path).getroot()
        except (OSError, ET.ParseError) as e:
            print(f"count_tests: cannot read {path}: {e}", file=sys.stderr)
            failed += 1
            continue
        for case in root.iter("testcase"):
            if case.find("failure") is not None or case.find("error") is not None:
                failed += 1
            elif case.find("skipped") is not None:
                skipped += 1
            else:
                passed += 1
        for test, result in failed_without_a_failed_case(root, path):
            print(f"failed as a whole ({result}), with no failed case: {test}")
            failed += 1
        for test, why in unmet_plans(path):
            print(f"failed as a whole (judged SKIP by meson), {why}: {test}")
            failed += 1
            skipped -= skipped_cases(root, test)  # counted once, as the failure
        todo = known_failures(path)
        for test, check, why in todo:
            print(f"known failure (TODO, not counted as passed): {test}: {check} — {why}")
        passed -= len(todo)
        skipped += len(todo)
    if also_failed:
        print(f"left behind by the run (scripts/test.sh): {also_failed}, counted as failed")
        failed += also_failed
    line = f"{passed} passed, {failed} failed"
    if skipped:
        line += f", {skipped} skipped"
    print(line)
    return 1 if failed or passed + skipped == 0 else 0


if __name__ == "__main__":
    import argparse
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("junit", nargs="+")
    ap.add_argument("--also-failed", type=int, default=0)
    a = ap.parse_args()
    sys.exit(main(a.junit, a.also_failed))
