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
# -O1: the sanitizer build compiles about twice as fast as at -O2 (g++ 12), and the tests
# spend their time waiting on mounts, servers and timers, not computing. -g1: line tables only
# (after meson's -g), all that a sanitizer report's stack needs for file:line and inlined
# frames; it compiles 11-31% faster than full debug information (scripts/RESULTS.md, ci10).
ghost_build "$GHOST_TEST_BUILD" -Db_sanitize="$GHOST_SANITIZE" -Db_lundef=false \
  -Doptimization="${GHOST_TEST_OPTIMIZATION:-1}" -Dcpp_args=-g1 || exit 1

ghost_log "running the tests in $GHOST_TEST_BUILD (sanitizers: $GHOST_SANITIZE)"
# Every program of the run carries GHOST_CI_RUN in its environment and puts its temporary files
# under a directory of the run's own ($TMPDIR, mode 1777 like /tmp: dovecot's mail user reads
# its home there): afterwards a process carrying it, or a mount under that directory (a dead
# FUSE mount whose daemon is gone included), is a leftover of this run and counts as a failure
# (tests/integration/leftovers.py; other runs on the machine are not looked at).
run_tmp=$(mktemp -d /tmp/ghost-run-XXXXXX) && chmod 1777 "$run_tmp" || exit 1
run_mark=GHOST_CI_RUN=$$-$RANDOM$RANDOM
logs=$GHOST_TEST_BUILD/meson-logs
# The live replay (replay_test, ~460 s mostly asleep on the traces' clock) stays in the one
# meson run: run in a lane of its own beside two other tests (round 11, ci11) its web static
# ratio came to 1.141 against its 1.15 bound (1.106 in the run before), too thin a margin.
env "$run_mark" TMPDIR="$run_tmp" \
  meson test -C "$GHOST_TEST_BUILD" --print-errorlogs --num-processes 2 "$@"
status=$?
junits=("$logs/testlog.junit.xml")
python3 "$GHOST_ROOT/tests/integration/leftovers.py" check --marker "$run_mark" --dir "$run_tmp" \
  > "$logs/leftovers.txt"
left=$(grep -c . "$logs/leftovers.txt")
cat "$logs/leftovers.txt"

# Count individual test cases (googletest cases, and whole scripts for other tests) from
# meson's JUnit logs; each leftover is one more failure.
python3 "$GHOST_ROOT/scripts/count_tests.py" "${junits[@]}" --also-failed "$left" || status=1
exit $status
