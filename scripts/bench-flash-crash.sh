#!/usr/bin/env bash
# bench-flash-crash.sh: the flash log's crash goal, full size: 100 SIGKILLs of ghostfs (with
# --profile ipaq-2004 --flash-log, the disk asleep) during write + fsync in local/, each followed
# by a remount that recovers and replays the log; prints the acknowledged fsyncs and the files
# lost (goal: 0). CI runs the same test with 20 kills (tests/integration/ghostfs_flash_crash_test.py).
# Needs root and /dev/fuse. Usage: scripts/bench-flash-crash.sh [BUILD_DIR] [KILLS]
set -euo pipefail
build=$(realpath "${1:-build}")
kills=${2:-100}
here=$(dirname "$0")
GHOST_BUILD=$build exec python3 "$here/../tests/integration/ghostfs_flash_crash_test.py" "$kills"
