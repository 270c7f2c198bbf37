#!/usr/bin/env python3
"""The tests of suite early need no more of the build than scripts/test.sh builds first
(GHOST_FIRST_TARGETS in scripts/lib.sh): a whole run starts them beside the rest of the build
with --no-rebuild, so one that needed a program or a test binary built later would find it
missing, or an old one, depending on how far the build had got. Read from meson's introspection
of the build (meson-info/): each early test's declared dependencies and its command. They also
time no emulated link (none depends on the delayer, nfq_delay): those run after the build.
TAP. Usage: early_suite_test.py BUILD_DIR"""
import json
import os
import subprocess
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def runs_meson_install(path):
    """Whether a test's script (a source file among its command's words) runs `meson install`."""
    if not path.startswith(ROOT + os.sep) or not os.path.isfile(path):
        return False
    with open(path, errors="replace") as f:
        text = f.read()
    return '"meson", "install"' in text or "meson install" in text


def main():
    build = os.path.abspath(sys.argv[1])
    with open(os.path.join(build, "meson-info", "intro-tests.json")) as f:
        tests = json.load(f)
    with open(os.path.join(build, "meson-info", "intro-targets.json")) as f:
        targets = json.load(f)
    first = subprocess.run(["bash", "-c", '. "$1/scripts/lib.sh" && echo "${GHOST_FIRST_TARGETS[@]}"',
                            "-", ROOT], capture_output=True, text=True, check=True).stdout.split()
    # Each target's outputs, relative to the build directory.
    outputs = {t["id"]: [os.path.relpath(f, build) for f in t["filename"]] for t in targets}
    built = {o for outs in outputs.values() for o in outs}
    early = [t for t in tests if any(s.split(":")[-1] == "early" for s in t["suite"])]
    # A test that runs `meson install` needs everything the build installs, whatever it declares
    # (acceptance declared three programs and failed a CI run on a ghosttrace not yet built).
    with open(os.path.join(build, "meson-info", "intro-installed.json")) as f:
        installed = sorted(os.path.relpath(src, build) for src in json.load(f)
                           if os.path.abspath(src).startswith(build + os.sep))

    print("1..4")
    missing = [f for f in first if f not in built]
    print(f"{'not ' if missing else ''}ok 1 - GHOST_FIRST_TARGETS are targets of the build: "
          f"{' '.join(first)}" + (f" (not built by anything: {missing})" if missing else ""))
    print(f"{'' if early else 'not '}ok 2 - suite early has tests ({len(early)})")
    beyond = []
    for t in early:
        needs = [o for d in t["depends"] for o in outputs.get(d, [d])]
        # The command itself when it is a build output (a test binary).
        needs += [os.path.relpath(t["cmd"][0], build)] if t["cmd"][0] in {
            os.path.join(build, b) for b in built} else []
        if any(runs_meson_install(arg) for arg in t["cmd"]):
            needs += installed
        later = sorted(set(n for n in needs if n not in first))
        if later:
            beyond.append(f"{t['name']} needs {', '.join(later)}")
    print(f"{'not ' if beyond else ''}ok 3 - every test of suite early needs only those programs")
    for b in beyond:
        print(f"#   {b}")
    link = [t["name"] for t in early
            if any(o.endswith("nfq_delay") for d in t["depends"] for o in outputs.get(d, []))]
    print(f"{'not ' if link else ''}ok 4 - no test of suite early runs the emulated link"
          + (f": {', '.join(link)}" if link else ""))


if __name__ == "__main__":
    main()
