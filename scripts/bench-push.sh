#!/usr/bin/env bash
# Push latency: a `knob` set on one control connection until the `modes` event reaches a
# subscriber on another (issue 16's goal: p99 < 1 ms). Prints p50/p99 per round of 500 runs
# and the median of 3 rounds. Takes a few seconds.
#
#   scripts/bench-push.sh [bench_push.py options, e.g. --runs 1000 --rounds 5 --json out.json]
#
# Environment: GHOSTFS=path/to/ghostfs (skip the build), GHOST_BUILD=build dir (default build/).
# Needs /dev/fuse (it mounts one ghostfs in a temporary directory, removed on exit).
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
GHOST_BUILD=${GHOST_BUILD:-$ROOT/build}

if [ -z "${GHOSTFS:-}" ]; then
  ninja -C "$GHOST_BUILD" fs/ghostfs >/dev/null || { echo "bench-push: building fs/ghostfs in $GHOST_BUILD failed" >&2; exit 1; }
  GHOSTFS=$GHOST_BUILD/fs/ghostfs
fi
exec python3 "$ROOT/scripts/bench_push.py" --ghostfs "$GHOSTFS" "$@"
