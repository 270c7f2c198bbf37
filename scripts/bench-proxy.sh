#!/usr/bin/env bash
# Proxy benchmark: ghostproxy (over a ghostfs mount) side by side with squid (disk cache) and
# nginx's own proxy_cache, cache hits of 16 KiB objects with wrk against one nginx on
# 127.0.0.1. Prints the figures as ratios and one line per goal (≥ 2× squid's hits/s and a
# lower p50; ahead of nginx proxy_cache). About 3 minutes.
#
#   scripts/bench-proxy.sh [bench_proxy.py options, e.g. --rounds 5 --seconds 10]
#   scripts/bench-proxy.sh --ghostproxy-base /tmp/main-build/proxy/ghostproxy   # A/B: a fourth
#       arm runs another ghostproxy build on the same mount, interleaved with the others
#
# Installs what is missing (squid wrk nginx-light fuse3), builds into GHOST_BUILD (default
# build/). Every process and mount it starts is removed on exit, also on failure or Ctrl-C.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=scripts/lib.sh
. "$ROOT/scripts/lib.sh"

ghost_need_root bench-proxy "it mounts ghostfs and starts squid as user proxy"
ghost_install squid wrk
ghost_build
WORK=$(mktemp -d /var/tmp/bench-proxy.XXXXXX)
trap 'rm -rf --one-file-system "$WORK"' EXIT
python3 "$ROOT/scripts/bench_proxy.py" --work "$WORK" --ghostfs "$GHOST_BUILD/fs/ghostfs" \
  --ghostproxy "$GHOST_BUILD/proxy/ghostproxy" "$@"
