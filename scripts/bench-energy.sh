#!/usr/bin/env bash
# Energy benchmark: the paper's experiment live and simulated, side by side (DESIGN §7.2).
#
#   scripts/bench-energy.sh [--prefix SECONDS] [--profile NAME] [--traces "web mail"]
#                                [--out DIR]
#
# For each trace (default: the shipped web and mail traces, whole — about 20 and 15 minutes
# each per run), replays it live with scripts/replay (real ghostfs/ghostproxy with emulated
# devices, origins behind the link emulator) for: static, adaptive K=50 with ghost hints,
# adaptive K=50 without; then runs ghostsim on exactly the same requests and prints the table
# (mean and p95 response time, energy, lower bound, live ÷ simulated) with the acceptance
# verdicts (scripts/energy_report.py), and draws the figures (scripts/plots.py, live runs as
# markers on the simulated knob curves). --prefix replays only the first SECONDS of each trace
# (a quick run). Results: DIR/live.jsonl, DIR/report.txt, DIR/*.png (default DIR:
# /var/tmp/ghost-bench-energy). Installs what is missing and builds into GHOST_BUILD (default
# build/). Exit status 1 when a verdict fails.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=scripts/lib.sh
. "$ROOT/scripts/lib.sh"

prefix="" profile=ipaq-2004 traces="web mail" out=/var/tmp/ghost-bench-energy
while [ $# -gt 0 ]; do
  case "$1" in
    --prefix) prefix=$2; shift 2 ;;
    --profile) profile=$2; shift 2 ;;
    --traces) traces=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    -h|--help) sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "bench-energy: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
ghost_need_root bench-energy "it creates network namespaces and mounts ghostfs"
ghost_install python3-matplotlib
ghost_build
mkdir -p "$out"
: >"$out/live.jsonl"
PY=/usr/bin/python3  # Debian's, which has matplotlib

n=0
for t in $traces; do
  trace=$ROOT/common/traces/$t.trace
  [ -f "$trace" ] || { echo "bench-energy: no trace $trace" >&2; exit 2; }
  for policy in "static" "adaptive --knob 50" "adaptive --knob 50 --no-ghost-hints"; do
    n=$((n + 1))
    args=(--build "$GHOST_BUILD" --profile "$profile" --trace "$trace")
    # A prefix is written out so that ghostsim replays exactly the same requests (the JSON's
    # "trace" names that file); it keeps the trace's name for the figures.
    [ -n "$prefix" ] && args+=(--prefix "$prefix" --write-trace "$out/prefix-$n/$t.trace")
    [ -n "$prefix" ] && mkdir -p "$out/prefix-$n"
    ghost_log "live: $t trace, $policy${prefix:+, first $prefix s}"
    # shellcheck disable=SC2086
    python3 "$ROOT/scripts/replay" "${args[@]}" --policy $policy >>"$out/live.jsonl"
  done
done

status=0
python3 "$ROOT/scripts/energy_report.py" --ghostsim "$GHOST_BUILD/fs/ghostsim" "$out/live.jsonl" \
  | tee "$out/report.txt" || status=1
"$PY" "$ROOT/scripts/plots.py" --ghostsim "$GHOST_BUILD/fs/ghostsim" --profile "$profile" \
  --live "$out/live.jsonl" --out "$out"
exit $status
