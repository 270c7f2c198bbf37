#!/usr/bin/env bash
# Fuzzes the parsers for longer than the test suite does (libFuzzer, ASan+UBSan, clang):
#   scripts/fuzz.sh TARGET [SECONDS]   one target (default 300 s)
#   scripts/fuzz.sh all [SECONDS]      every target in turn
#   scripts/fuzz.sh list               the targets
# Work (binaries, grown corpora, crash-* inputs, fuzz.log) goes to build-fuzz/TARGET/; the grown
# corpus is kept between runs. A crashing input is named in the output; replay it with
#   build-fuzz/TARGET/TARGET_fuzz build-fuzz/TARGET/crash-...
# The targets and their sources are listed in tests/fuzz/fuzz.sh; the suite runs each briefly
# (meson test --suite fuzz).
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
targets=($(sed -n "/^fuzz_targets = \[/,/^\]/p" "$root/tests/meson.build" | grep -o "^  '[a-z0-9_]*'" |
           tr -d " '"))
what=${1:-}
secs=${2:-300}
case "$what" in
  ""|-h|--help) sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
  list) printf '%s\n' "${targets[@]}"; exit 0 ;;
  all) run=("${targets[@]}") ;;
  *) run=("$what") ;;
esac
failed=0
for t in "${run[@]}"; do
  echo "== $t: ${secs}s" >&2
  out=$(bash "$root/tests/fuzz/fuzz.sh" "$root" "$root/build-fuzz/$t" "$t" "$secs")
  echo "$out"
  grep -q '^not ok' <<<"$out" && failed=$((failed + 1))
done
[ $failed -eq 0 ]
