#!/usr/bin/env bash
# bench-flash-edit.sh: the flash log's editing goal, full size: a 10-minute editing trace in
# local/ (a few files saved with fsync every ~2.5 s) under --profile ipaq-2004, with the flash
# log and without it; prints the disk's mode changes of each (goal with the log: 0 until the log
# is full). CI runs the same test for 10 s (tests/integration/ghostfs_flash_edit_test.py).
# Needs root and /dev/fuse. Usage: scripts/bench-flash-edit.sh [BUILD_DIR] [SECONDS]
set -euo pipefail
build=$(realpath "${1:-build}")
seconds=${2:-600}
here=$(dirname "$0")
GHOST_BUILD=$build exec python3 "$here/../tests/integration/ghostfs_flash_edit_test.py" "$seconds"
