#!/usr/bin/env bash
# ghostsim's command line: output fields, determinism, and bad input (exit 2 with a one-line
# message naming where). TAP output, one line per check.
# Usage: ghostsim_cli_test.sh GHOSTSIM TRACE_DIR
set -u
GHOSTSIM=$1
TRACES=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
n=0
failed=0
ok() { n=$((n + 1)); echo "ok $n - $1"; }
not_ok() { n=$((n + 1)); failed=1; echo "not ok $n - $1"; shift; for l in "$@"; do echo "# $l"; done; }

# expect_bad NAME PATTERN ARGS...: exit code 2, one line on stderr matching PATTERN, no stdout.
expect_bad() {
  local name=$1 pattern=$2
  shift 2
  "$GHOSTSIM" "$@" >"$tmp/out" 2>"$tmp/err"
  local rc=$?
  local lines
  lines=$(wc -l <"$tmp/err")
  if [ $rc -eq 2 ] && [ "$lines" -eq 1 ] && grep -qE -- "$pattern" "$tmp/err" && [ ! -s "$tmp/out" ]; then
    ok "$name"
  else
    not_ok "$name" "exit $rc, $lines stderr lines: $(head -c 300 "$tmp/err")"
  fi
}

trace() {  # trace NAME LINES...: writes a web trace
  local f="$tmp/$1"
  shift
  printf '%s\n' "# ghost-trace web v1" "$@" >"$f"
  echo "$f"
}

echo "1..23"

out=$("$GHOSTSIM" --policy adaptive "$TRACES/web.trace")
if python3 -c '
import json, sys
r = json.loads(sys.argv[1])
need = ["policy", "knob", "ghost_hints", "requests", "mean_response_ms", "p95_response_ms",
        "energy_j", "lower_bound_j", "duration_s", "devices", "ghost_hints_sent", "sources"]
missing = [k for k in need if k not in r]
assert not missing, missing
for d in r["devices"]:
    for k in ["energy_j", "time_in_mode_s", "transitions"]:
        assert k in d, k
assert r["requests"] > 0 and r["energy_j"] >= r["lower_bound_j"] > 0
' "$out" 2>"$tmp/err"; then ok "prints one JSON object with the fields of DESIGN §7"; else not_ok "JSON fields" "$(cat "$tmp/err")"; fi

again=$("$GHOSTSIM" --policy adaptive "$TRACES/web.trace")
[ "$out" = "$again" ] && ok "same inputs, same output" || not_ok "deterministic output"

sweep=$("$GHOSTSIM" --policy adaptive --knob-sweep 0,50,90,95,99,100 "$TRACES/mail.trace")
knobs=$(printf '%s\n' "$sweep" | python3 -c 'import json,sys; print(",".join(str(json.loads(l)["knob"]) for l in sys.stdin))')
[ "$knobs" = "0,50,90,95,99,100" ] && ok "--knob-sweep prints one object per knob" || not_ok "--knob-sweep" "got $knobs"

"$GHOSTSIM" --help >"$tmp/help" 2>&1 && grep -q -- "--knob-sweep" "$tmp/help" && ok "--help explains the options" || not_ok "--help"

expect_bad "unknown profile lists the available ones" 'unknown profile "nosuch".*ipaq-2004.*microdrive-1gb' --profile nosuch "$TRACES/web.trace"
expect_bad "knob above 100" 'knob 101 is outside 0\.\.100' --knob 101 "$TRACES/web.trace"
expect_bad "negative knob" 'outside 0\.\.100' --knob -1 "$TRACES/web.trace"
expect_bad "bad knob in a sweep" 'knob-sweep: "abc"' --knob-sweep 0,abc "$TRACES/web.trace"
expect_bad "negative time names file and line" 'neg\.trace:3:.*time' "$(trace neg.trace '0 GET http://o.test/a 10 0' '-1 GET http://o.test/b 10 0')"
expect_bad "non-monotonic time names file and line" 'back\.trace:3:' "$(trace back.trace '5 GET http://o.test/a 10 0' '4 GET http://o.test/b 10 0')"
expect_bad "size that is not a number names file and line" 'size\.trace:2:.*size' "$(trace size.trace '0 GET http://o.test/a 12k 0')"
expect_bad "missing trace file" 'nofile\.trace' "$tmp/nofile.trace"
expect_bad "unknown policy" 'policy' --policy fastest "$TRACES/web.trace"
printf 'kind = "disk"\nname = "x"\n[[mode]]\nname = "on"\npower_mw = "lots"\n' >"$tmp/bad.toml"
expect_bad "malformed profile names file and line" 'bad\.toml:5:' --profile "$tmp/bad.toml" "$TRACES/web.trace"

# Block-trace replay with a flash log and on flash storage (common/sim/flash_sim.h).
if "$GHOSTSIM" --flash-log 2M --flush-policy each-spinup --flush-alg 1 "$TRACES/nvcache.trace" >"$tmp/flash" 2>"$tmp/err" &&
   python3 -c '
import json, sys
r = json.load(open(sys.argv[1]))
assert r["flush_policy"] == "each-spinup" and r["flush_alg"] == 1
assert r["flushes"] > 0 and r["flush_time_s"] > 0 and r["bytes_flushed"] == r["bytes_logged"] > 0
' "$tmp/flash" 2>>"$tmp/err"; then ok "--flash-log prints the flush fields"; else not_ok "--flash-log" "$(cat "$tmp/err")"; fi
if "$GHOSTSIM" --storage intel-flash --utilisation 0.9 --cleaning on-demand "$TRACES/nvcache.trace" >"$tmp/card" 2>"$tmp/err" &&
   python3 -c '
import json, sys
r = json.load(open(sys.argv[1]))
assert r["storage"] == "intel-flash" and r["erasures"] > 0 and r["energy_j"] > 0
' "$tmp/card" 2>>"$tmp/err"; then ok "--storage intel-flash reports erasures"; else not_ok "--storage" "$(cat "$tmp/err")"; fi
expect_bad "flash log size that is not a size" 'flash-log: "2Q"' --flash-log 2Q "$TRACES/nvcache.trace"
expect_bad "flash simulation of a web trace" 'block traces' --flash-log 2M "$TRACES/web.trace"
expect_bad "flash log smaller than its buffer" 'at least one DRAM buffer' --flash-log 64K "$TRACES/nvcache.trace"
# A host write buffer in front of a flash device (round 15).
if "$GHOSTSIM" --storage intel-flash --utilisation 0.9 --write-buffer 64K "$TRACES/nvcache.trace" >"$tmp/buf" 2>"$tmp/err" &&
   python3 -c '
import json, sys
r = json.load(open(sys.argv[1]))
assert r["write_buffer_bytes"] == 65536 and r["writes"] > 0 and r["writes_waiting_for_buffer"] >= 0
' "$tmp/buf" 2>>"$tmp/err"; then ok "--write-buffer prints its fields"; else not_ok "--write-buffer" "$(cat "$tmp/err")"; fi
expect_bad "write buffer that is a negative size" 'write-buffer: "-1"' --storage intel-flash --write-buffer -1 "$TRACES/nvcache.trace"
expect_bad "write buffer in front of a disk" 'write buffer is for a flash device' --storage cu140 --write-buffer 64K "$TRACES/nvcache.trace"
# A replay frees what it allocated (round 17): the suite runs with detect_leaks=0, so this one
# run turns LeakSanitizer on, as ghostproxy_exit_fill does. The issuer of the trace's requests
# held itself through a shared_ptr cycle: 192 bytes at every exit. Only in an ASan build.
if ldd "$GHOSTSIM" 2>/dev/null | grep -q libasan; then
  ASAN_OPTIONS="${ASAN_OPTIONS:-}:detect_leaks=1:log_path=stderr" \
    "$GHOSTSIM" --profile ipaq-2004 "$TRACES/web.trace" >/dev/null 2>"$tmp/err"
  rc=$?
  if [ $rc -eq 0 ] && ! grep -q LeakSanitizer "$tmp/err"; then
    ok "a replay leaks nothing at exit (LeakSanitizer)"
  else
    mapfile -t report < <(grep -E 'LeakSanitizer|SUMMARY|in Replay' "$tmp/err" | head -5)
    not_ok "a replay leaks nothing at exit (LeakSanitizer)" "exit $rc" "${report[@]}"
  fi
else
  ok "a replay leaks nothing at exit # SKIP not an ASan build"
fi

exit $failed
