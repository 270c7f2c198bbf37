#!/usr/bin/env bash
# Installs what is missing, builds, and runs every test (unit, fuzz and integration). Ends with
# one line "N passed, N failed[, N skipped]" counted from the test results; exits non-zero on
# any failure.
#
# The tests run in their own build, build-test/ ($GHOST_TEST_BUILD), compiled with ASan and
# UBSan ($GHOST_SANITIZE, "address,undefined"; "none" for a plain build): a memory error,
# undefined behaviour or a leak in a unit test, or in a daemon an integration test starts,
# fails that test. build/ (the demo, the benchmarks) stays an ordinary optimised build.
# Extra arguments go to meson test (e.g. --suite unit, or test names).
set -uo pipefail
. "$(dirname "$0")/lib.sh"

GHOST_TEST_BUILD=${GHOST_TEST_BUILD:-$GHOST_ROOT/build-test}
GHOST_SANITIZE=${GHOST_SANITIZE:-address,undefined}

ghost_install || exit 1
# The build and every test but the live replay run at SCHED_IDLE (`chrt --idle 0`; nice 19
# where that is refused): on a machine of its own that changes nothing, and it lets the
# replay, which times the daemons against the traces' clock, come first whenever it wakes.
if chrt --idle 0 true 2>/dev/null; then idle=(chrt --idle 0); else idle=(nice -n 19); fi
GHOST_NINJA_PREFIX=${idle[*]}
# -O1: the sanitizer build compiles about twice as fast as at -O2 (g++ 12), and the tests
# spend their time waiting on mounts, servers and timers, not computing. -g1: line tables only
# (after meson's -g), all that a sanitizer report's stack needs for file:line and inlined
# frames; it compiles 11-31% faster than full debug information (scripts/RESULTS.md, ci10).
ghost_configure "$GHOST_TEST_BUILD" -Db_sanitize="$GHOST_SANITIZE" -Db_lundef=false \
  -Doptimization="${GHOST_TEST_OPTIMIZATION:-1}" -Dcpp_args=-g1 || exit 1

# Every program of the run carries GHOST_CI_RUN in its environment and puts its temporary files
# under a directory of the run's own ($TMPDIR, mode 1777 like /tmp: dovecot's mail user reads
# its home there): afterwards a process carrying it, or a mount under that directory (a dead
# FUSE mount whose daemon is gone included), is a leftover of this run and counts as a failure
# (tests/integration/leftovers.py; other runs on the machine are not looked at).
run_tmp=$(mktemp -d /tmp/ghost-run-XXXXXX) && chmod 1777 "$run_tmp" || exit 1
run_mark=GHOST_CI_RUN=$$-$RANDOM$RANDOM
logs=$GHOST_TEST_BUILD/meson-logs
# $GHOST_TEST_TIME=FILE: each test runs under /usr/bin/time, which appends "wall user sys
# command" (seconds; the CPU of the test and of the children it waited for) to FILE
# (scripts/ci_profile.py reads it). meson names its logs after a wrapper: testlog-time.*.
timing=()
logsuffix=
if [ -n "${GHOST_TEST_TIME:-}" ]; then
  timing=(--wrapper "/usr/bin/time -a -o $GHOST_TEST_TIME -f '%e %U %S %C'")
  logsuffix=-time
fi
junits=("$logs/testlog$logsuffix.junit.xml")

# The live replay (replay_test, suite live: ~460 s on the traces' clock, mostly asleep) needs
# only the daemons, ghostsim and the link emulator, about 60% of the build. A whole run builds
# those first and starts the replay beside the rest of the build and then the other tests, all
# of which run at SCHED_IDLE below it; in one meson run it held one of the two lanes for a
# third of the run, while the replay side by side with two tests at nice 5 came to 1.141 of
# its 1.15 bound (round 11). $GHOST_LIVE_WRAPPER prefixes its meson run (on a shared machine:
# the benchmark lock and normal priority); GHOST_TEST_LIVE_FIRST=0 runs it with the others.
# The tests of suite early (tests/meson.build: those programs or none of the build, no
# emulated link; four fifths of the test time, mostly asleep) start then too, at SCHED_IDLE in
# lanes of their own beside the rest of the build; the others (unit, install, shaping, the link)
# once it is built. $GHOST_TEST_LANES tests at once in each of those two meson runs, 3 by
# default: the tests are mostly asleep, and the CPU-bound ones (the fuzz targets' clang) share
# the CPUs with the build at the same SCHED_IDLE (scripts/RESULTS.md, ci13). One meson run
# (GHOST_TEST_LIVE_FIRST=0, or tests named): 2 lanes.
lanes=${GHOST_TEST_LANES:-2}
live_pid=
early_pid=
if [ $# -eq 0 ] && [ "${GHOST_TEST_LIVE_FIRST:-1}" != 0 ]; then
  ghost_ninja "$GHOST_TEST_BUILD" "${GHOST_FIRST_TARGETS[@]}" || exit 1
  ghost_log "running the live replay in $GHOST_TEST_BUILD beside the rest of the build"
  # shellcheck disable=SC2086  # the wrapper is a command line
  env "$run_mark" TMPDIR="$run_tmp" ${GHOST_LIVE_WRAPPER:-} \
    meson test -C "$GHOST_TEST_BUILD" --no-rebuild --print-errorlogs --logbase testlog-live \
    --suite live "${timing[@]}" > "$logs/live-console.txt" 2>&1 &
  live_pid=$!
  junits+=("$logs/testlog-live$logsuffix.junit.xml")
  lanes=${GHOST_TEST_LANES:-3}
  ghost_log "running the tests of suite early in $GHOST_TEST_BUILD beside the rest of the build"
  env "$run_mark" TMPDIR="$run_tmp" "${idle[@]}" \
    meson test -C "$GHOST_TEST_BUILD" --no-rebuild --print-errorlogs --logbase testlog-early \
    --num-processes "$lanes" --suite early --no-suite live "${timing[@]}" \
    > "$logs/early-console.txt" 2>&1 &
  early_pid=$!
  junits+=("$logs/testlog-early$logsuffix.junit.xml")
  set -- --no-suite live --no-suite early
fi
if ! ghost_ninja "$GHOST_TEST_BUILD"; then
  [ -n "$early_pid" ] && wait "$early_pid"
  [ -n "$live_pid" ] && wait "$live_pid"
  exit 1
fi

ghost_log "running the tests in $GHOST_TEST_BUILD (sanitizers: $GHOST_SANITIZE)"
env "$run_mark" TMPDIR="$run_tmp" "${idle[@]}" \
  meson test -C "$GHOST_TEST_BUILD" --no-rebuild --print-errorlogs --num-processes "$lanes" \
  "${timing[@]}" "$@"
status=$?
if [ -n "$early_pid" ]; then
  wait "$early_pid" || status=1
  ghost_log "the tests of suite early (their meson output; log: $logs/testlog-early$logsuffix.txt)"
  cat "$logs/early-console.txt"
fi
if [ -n "$live_pid" ]; then
  wait "$live_pid" || status=1
  ghost_log "the live replay (its meson output; log: $logs/testlog-live$logsuffix.txt)"
  cat "$logs/live-console.txt"
fi
python3 "$GHOST_ROOT/tests/integration/leftovers.py" check --marker "$run_mark" --dir "$run_tmp" \
  > "$logs/leftovers.txt"
left=$(grep -c . "$logs/leftovers.txt")
cat "$logs/leftovers.txt"

# Count individual test cases (googletest cases, and whole scripts for other tests) from
# meson's JUnit logs; each leftover is one more failure.
python3 "$GHOST_ROOT/scripts/count_tests.py" "${junits[@]}" --also-failed "$left" || status=1
exit $status
