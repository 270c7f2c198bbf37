#!/usr/bin/env bash
# bench-shaping.sh: the shaping paper's experiment on the emulated link (scripts/bench_shaping.py
# does the work): RTT 30/60/90/120 ms × loss 0/0.5/1% at 20 Mb/s, 5 MB downloads, plain TCP vs
# ideal PSM vs shaped, median of several rounds with the spread, E×D normalised to plain TCP.
# Needs root, the build (nfq_delay, wnic_energy, proxy_shaping_test), nginx and tcpdump.
#   scripts/bench-shaping.sh [--rounds 3] [--rtts 30,60] [--losses 0,1] [--jitter-ms 2]
#                            [--size-mb 5] [--profile wifi-ac] [--mode auto] [--json FILE]
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=lib.sh
. "$ROOT/scripts/lib.sh"
BUILD=${GHOST_BUILD:-$ROOT/build}
[ "$(id -u)" -eq 0 ] || { echo "bench-shaping: needs root (the link emulator)" >&2; exit 1; }
ninja -C "$BUILD" tests/proxy_shaping_test tests/linkemu/nfq_delay tests/linkemu/wnic_energy >/dev/null
exec python3 "$ROOT/scripts/bench_shaping.py" --build "$BUILD" "$@"
