#!/usr/bin/env bash
# Installs what is missing, builds, and runs every test (unit and integration). Ends with one
# line "N passed, N failed[, N skipped]" counted from the test results; exits non-zero on any
# failure.
set -uo pipefail
. "$(dirname "$0")/lib.sh"

ghost_install || exit 1
ghost_build || exit 1

ghost_log "running the tests"
meson test -C "$GHOST_BUILD" --print-errorlogs --num-processes 2 "$@"
status=$?

# Count individual test cases (googletest cases, and whole scripts for other tests) from
# meson's JUnit log.
python3 "$GHOST_ROOT/scripts/count_tests.py" "$GHOST_BUILD/meson-logs/testlog.junit.xml" || status=1
exit $status
