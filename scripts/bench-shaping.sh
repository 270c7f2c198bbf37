#!/usr/bin/env bash
# bench-shaping.sh: the shaping paper's experiment on the emulated link (scripts/bench_shaping.py
# does the work): RTT 30/60/90/120 ms × loss 0/0.1/0.5/1% × 1/5/20 MB at 20 Mb/s; in each round
# plain TCP autotuned, plain TCP with the paper's fixed window (--plain-rcvbuf, the same
# SO_RCVBUF as the shaped arm), shaped, and ideal PSM; median of the rounds with the spread,
# E×D normalised to BOTH plains (the paper's ratio is the fixed-window one). Every arm runs
# twice per round: HTTP (a GET through the proxy) and HTTPS (TLS through a CONNECT tunnel to the
# origin's nginx, self-signed certificate made at run time), each against its own plains.
# --quick: CI-sized (60 ms, no loss, 1 MB, one round, both schemes; about a minute).
# Needs root, the build (nfq_delay, wnic_energy, proxy_shaping_test), nginx, tcpdump, openssl;
# the plot needs python3-matplotlib (skipped with a message without it).
#   scripts/bench-shaping.sh [--quick] [--rounds 3] [--rtts 30,60] [--losses 0,1] [--jitter-ms 2]
#                            [--sizes-mb 1,5,20 | --size-mb 5] [--schemes http,https] [--buffer 16384]
#                            [--origin-cc reno] [--profile wifi-ac] [--mode auto]
#                            [--json FILE] [--plot FILE.png]
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=lib.sh
. "$ROOT/scripts/lib.sh"
BUILD=${GHOST_BUILD:-$ROOT/build}
ghost_need_root bench-shaping "the link emulator"
ninja -C "$BUILD" tests/proxy_shaping_test tests/linkemu/nfq_delay tests/linkemu/wnic_energy >/dev/null
exec python3 "$ROOT/scripts/bench_shaping.py" --build "$BUILD" "$@"
