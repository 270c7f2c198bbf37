#!/usr/bin/env bash
# Fuzzes the HTTP/1.1 parsers (proxy/http1.h) with libFuzzer, ASan and UBSan for a bounded time:
# builds tests/proxy/http1_fuzz.cc with clang++ from the few sources it needs (not through the
# g++ meson build), seeds it with tests/proxy/http1_corpus/, and runs it. A crash, a sanitizer
# report or a failed check in the target (split-dependent events, a head that does not
# round-trip) fails the test; the crashing input is kept in WORK_DIR and named in the output.
# TAP; skipped (1..0 # SKIP) when clang++ or its libFuzzer runtime is missing.
#
# Usage: fuzz_http1.sh SOURCE_ROOT WORK_DIR [SECONDS]
#   SECONDS defaults to $GHOST_FUZZ_SECONDS or 20. CLANGXX picks the compiler (clang++).
set -u
root=$1
work=$2
secs=${3:-${GHOST_FUZZ_SECONDS:-20}}
cxx=${CLANGXX:-clang++}

if ! command -v "$cxx" >/dev/null 2>&1; then
  echo "1..0 # SKIP $cxx is not installed (apt-get install clang)"
  exit 0
fi
mkdir -p "$work/corpus" || exit 1
# Crashes from an earlier run are kept for inspection, not replayed as passes.
rm -f "$work"/crash-* "$work"/leak-* "$work"/timeout-* "$work"/oom-*

exe="$work/http1_fuzz"
sources=("$root/tests/proxy/http1_fuzz.cc" "$root/proxy/http1.cc" "$root/common/http/http_message.cc"
         "$root/common/base/status.cc")
flags=(-std=c++20 -g -O1 -fno-omit-frame-pointer -fsanitize=fuzzer,address,undefined
       -fno-sanitize-recover=undefined -I "$root")

# Rebuild when a source is newer than the binary.
rebuild=1
if [ -x "$exe" ]; then
  rebuild=0
  for s in "${sources[@]}" "$root/proxy/http1.h" "$root/common/http/http_message.h" \
           "$root/common/base/status.h" "$0"; do
    [ "$s" -nt "$exe" ] && rebuild=1
  done
fi
if [ $rebuild -eq 1 ]; then
  if ! "$cxx" "${flags[@]}" "${sources[@]}" -o "$exe.tmp" >"$work/build.log" 2>&1; then
    if grep -q -e "libclang_rt.fuzzer" -e "cannot find -l.*fuzzer" "$work/build.log"; then
      echo "1..0 # SKIP $cxx has no libFuzzer runtime (apt-get install clang)"
      exit 0
    fi
    echo "1..1"
    echo "not ok 1 - http1_fuzz builds with $cxx"
    sed 's/^/# /' "$work/build.log" | tail -n 40
    exit 0
  fi
  mv "$exe.tmp" "$exe"
fi

echo "1..1"
# Run from WORK_DIR so crash-* files land there; new corpus entries go to WORK_DIR/corpus, the
# checked-in seeds stay read-only.
(cd "$work" && ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 \
  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  "$exe" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -max_len=4096 \
    -print_final_stats=1 corpus "$root/tests/proxy/http1_corpus") >"$work/fuzz.log" 2>&1
rc=$?
stats=$(grep -E '^stat::(number_of_executed_units|average_exec_per_sec|peak_rss_mb|new_units_added)' \
          "$work/fuzz.log" | sed 's/^stat:://' | tr -s ' \n' ' ')
done_line=$(grep -E '^Done [0-9]+ runs' "$work/fuzz.log" | tail -n 1)
crash=$(ls "$work"/crash-* "$work"/leak-* "$work"/timeout-* "$work"/oom-* 2>/dev/null | head -n 1)
if [ $rc -eq 0 ] && [ -z "$crash" ] && [ -n "$done_line" ]; then
  echo "ok 1 - http1 parsers survive ${secs}s of libFuzzer (ASan+UBSan): $done_line; $stats"
else
  echo "not ok 1 - http1 parsers under libFuzzer (exit $rc)${crash:+; input kept in $crash}"
  grep -E -A 30 'ERROR|runtime error|http1_fuzz:|deadly signal' "$work/fuzz.log" | head -n 60 |
    sed 's/^/# /'
fi
exit 0
