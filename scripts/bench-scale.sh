#!/usr/bin/env bash
# Scale benchmark: N unique 512-byte objects filled through ghostproxy (--memory-cache 0, over a
# ghostfs mount) and through squid with the same URLs, then a remount/restart of each: fill
# rate, mount-ready time, RSS, disk per object, hit rate and hit latency (scripts/bench_scale.py).
#
#   scripts/bench-scale.sh            N = 100k (CI size)
#   scripts/bench-scale.sh --full     N = 1M
#   scripts/bench-scale.sh --objects N [--no-squid] [--hit-seconds S] [--crash] [--proxy-fill K]
#     --crash: SIGKILL ghostfs after the hits and time its next mount (crash recovery)
#     --proxy-fill K: fill K through the proxy, write the rest straight into the index
#
# Installs what is missing (wrk squid), builds into GHOST_BUILD (default build/). Every process
# and mount it starts is removed on exit, also on failure or Ctrl-C.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=scripts/lib.sh
. "$ROOT/scripts/lib.sh"

ghost_need_root bench-scale "it mounts ghostfs and starts squid as user proxy"
args=()
for a in "$@"; do
  if [ "$a" = --full ]; then args+=(--objects 1000000); else args+=("$a"); fi
done
ghost_install squid wrk
ghost_build
WORK=$(mktemp -d /var/tmp/bench-scale.XXXXXX)
trap 'rm -rf --one-file-system "$WORK"' EXIT
python3 "$ROOT/scripts/bench_scale.py" --work "$WORK" --ghostfs "$GHOST_BUILD/fs/ghostfs" \
  --ghostproxy "$GHOST_BUILD/proxy/ghostproxy" --ghostctl "$GHOST_BUILD/fs/ghostctl" "${args[@]}"
