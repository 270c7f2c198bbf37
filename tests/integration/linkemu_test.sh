#!/usr/bin/env bash
# The link emulator (scripts/linkemu.sh): its self-test against the default settings (ping RTT
# within 5% of twice the one-way delay, goodput and wire rate within 10% of each cap), and that
# nothing is left behind on any way out: after the self-test, after Ctrl-C and SIGTERM in the
# middle of up, after kill -9 in the middle of up followed by down, after a delayer that dies
# at start, and after the delayer is killed under a running link. TAP; skipped when the
# machine cannot run the link (not root, no namespaces, no NFQUEUE, nfq_delay not built).
# Usage: linkemu_test.sh LINKEMU_SH NFQ_DELAY
set -u
LINKEMU=$1
export NFQ_DELAY=${2:-}
# A name and a subnet of this run's own, so neither a link a developer has up nor another
# build directory's run of this test is touched.
NAME=lkt$$
export LINKEMU_NAME=$NAME
SUBNET=
for i in $(seq 0 149); do
  octet=$((100 + ($$ + i) % 150))  # start where this pid points, so runs rarely collide
  ip -4 -o addr show 2>/dev/null | grep -q "inet 10\.77\.$octet\." && continue
  SUBNET=10.77.$octet
  break
done
tmp=$(mktemp -d)
# shellcheck disable=SC2317  # called by the EXIT trap
cleanup() {
  "$LINKEMU" down >/dev/null 2>&1
  rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 1' INT TERM

n=0
failed=0
ok() { n=$((n + 1)); echo "ok $n - $1"; }
not_ok() {
  n=$((n + 1))
  failed=1
  echo "not ok $n - $1"
  shift
  local l
  for l in "$@"; do printf '%s\n' "$l" | head -20 | sed 's/^/# /'; done
}

# What the link NAME left behind: namespaces, the host interface, state, delayer processes.
leftovers() {
  local what=() n d
  for n in "$NAME" "$NAME-link" "$NAME-probe"; do
    ip netns list 2>/dev/null | grep -qE "^$n( |$)" && what+=("namespace $n")
  done
  ip link show dev "$NAME" >/dev/null 2>&1 && what+=("interface $NAME")
  [ -e "/run/linkemu/$NAME" ] && what+=("state /run/linkemu/$NAME")
  for d in /proc/[0-9]*; do
    tr '\0' ' ' <"$d/cmdline" 2>/dev/null | grep -q -- "nfq_delay.*--link $NAME " &&
      ! grep -q '^State:.*Z' "$d/status" 2>/dev/null && what+=("nfq_delay pid ${d#/proc/}")
  done
  echo "${what[*]}"
}

expect_clean() {
  local left
  left=$(leftovers)
  if [ -z "$left" ]; then ok "$1"; else not_ok "$1" "left: $left"; fi
}

if [ -z "$NFQ_DELAY" ]; then
  echo "1..0 # SKIP nfq_delay not built (libnetfilter-queue-dev missing)"
  exit 0
fi
why=$("$LINKEMU" check 2>&1)
rc=$?
if [ $rc -eq 77 ]; then
  echo "1..0 # SKIP ${why#linkemu: cannot run here: }"
  exit 0
elif [ $rc -ne 0 ]; then
  echo "1..1"
  not_ok "linkemu.sh check" "$why"
  exit 1
fi
if [ -z "$SUBNET" ]; then
  echo "1..0 # SKIP no free subnet in 10.77.100-249.0/24"
  exit 0
fi

echo "1..15"

# 1-5: the self-test, one TAP line per check it prints.
"$LINKEMU" selftest --subnet "$SUBNET" >"$tmp/selftest" 2>"$tmp/selftest.err"
rc=$?
checks=("ping RTT" "downlink goodput" "downlink wire rate" "uplink goodput" "uplink wire rate")
for c in "${checks[@]}"; do
  line=$(grep -E "^  (PASS|FAIL) $c" "$tmp/selftest")
  if [[ $line == "  PASS "* ]]; then
    ok "${line#  PASS }"
  elif [ -n "$line" ]; then
    not_ok "${line#  FAIL }" "$(cat "$tmp/selftest.err")"
  else
    not_ok "$c: not measured (selftest exit $rc)" "$(cat "$tmp/selftest" "$tmp/selftest.err")"
  fi
done
# Whatever the checks said, the self-test itself must agree with them.
if { [ $rc -eq 0 ] && grep -q "selftest: PASS" "$tmp/selftest"; } ||
  { [ $rc -ne 0 ] && grep -q "FAIL" "$tmp/selftest"; }; then
  expect_clean "after the self-test nothing is left (namespaces, interface, state, delayer)"
else
  not_ok "self-test exit code agrees with its checks" "exit $rc" "$(cat "$tmp/selftest")"
fi

# 7: up refuses a link that is already up, with a message that says what to do, and leaves
# the running link alone.
"$LINKEMU" up --subnet "$SUBNET" >/dev/null 2>"$tmp/up1"
"$LINKEMU" up --subnet "$SUBNET" >/dev/null 2>"$tmp/up2"
rc=$?
"$LINKEMU" status >"$tmp/status" 2>&1
src=$?
if [ $rc -eq 1 ] && grep -q "already exists; run linkemu.sh down" "$tmp/up2" && [ $src -eq 0 ]; then
  ok "up twice: the second fails ('$(head -1 "$tmp/up2")') and the first link stays up"
else
  not_ok "up twice" "exit $rc, status exit $src" "$(cat "$tmp/up1" "$tmp/up2" "$tmp/status")"
fi

# 8: a delayer killed under a running link: status says broken, down cleans up.
pid=$(cat "/run/linkemu/$NAME/delayer.pid" 2>/dev/null)
[ -n "$pid" ] && kill -KILL "$pid"
"$LINKEMU" status >"$tmp/status" 2>&1
src=$?
"$LINKEMU" down 2>"$tmp/down"
drc=$?
if [ $src -eq 1 ] && grep -q "nfq_delay is not running" "$tmp/status" && [ $drc -eq 0 ] &&
  [ -z "$(leftovers)" ]; then
  ok "a killed delayer: status reports it (exit 1), down removes the rest"
else
  not_ok "killed delayer" "status exit $src, down exit $drc, left: $(leftovers)" \
    "$(cat "$tmp/status" "$tmp/down")"
fi

# 9: down again (nothing up) succeeds.
if "$LINKEMU" down 2>"$tmp/down"; then
  ok "down with nothing up succeeds"
else
  not_ok "down with nothing up" "$(cat "$tmp/down")"
fi

# 10: a delayer that dies at start makes up fail and clean up after itself.
"$LINKEMU" up --subnet "$SUBNET" --nfq-delay /bin/false >/dev/null 2>"$tmp/up"
rc=$?
if [ $rc -ne 0 ] && grep -q "did not bind its queues" "$tmp/up" && [ -z "$(leftovers)" ]; then
  ok "a failing delayer: up fails ('did not bind its queues') and leaves nothing"
else
  not_ok "failing delayer" "exit $rc, left: $(leftovers)" "$(cat "$tmp/up")"
fi

# 11-12: Ctrl-C (SIGINT to the process group, as a terminal sends it) and SIGTERM in the middle
# of up: up removes what it made. (A background job starts with SIGINT ignored; env restores
# it, as in a terminal. setsid gives up its own process group.)
for sig in INT TERM; do
  LINKEMU_TEST_PAUSE_S=5 env --default-signal=INT setsid "$LINKEMU" up --subnet "$SUBNET" >/dev/null 2>"$tmp/up" &
  pid=$!
  # up pauses for 5 s once its namespaces exist (a test hook): the signal lands mid-way.
  for _ in $(seq 100); do ip netns list | awk '{print $1}' | grep -qx "$NAME" && break; sleep 0.1; done
  kill -"$sig" -- -"$pid" 2>"$tmp/kill" || echo "kill failed: $(cat "$tmp/kill")" >>"$tmp/up"
  wait "$pid"
  rc=$?
  if [ -z "$(leftovers)" ]; then
    ok "SIG$sig during up (exit $rc): nothing is left"
  else
    not_ok "SIG$sig during up" "exit $rc, left: $(leftovers)" "$(cat "$tmp/up")"
    "$LINKEMU" down >/dev/null 2>&1
  fi
done

# 13-15: kill -9 of up and the commands it runs, at three points (no trap runs), then down:
# nothing is left.
for at in 0.1 0.3 0.5; do
  setsid "$LINKEMU" up --subnet "$SUBNET" >/dev/null 2>&1 &
  pid=$!
  sleep "$at"
  kill -KILL -- -"$pid" 2>/dev/null
  wait "$pid" 2>/dev/null
  "$LINKEMU" down >/dev/null 2>"$tmp/down"
  drc=$?
  if [ $drc -eq 0 ] && [ -z "$(leftovers)" ]; then
    ok "kill -9 of up after ${at} s, then down: nothing is left"
  else
    not_ok "kill -9 of up after ${at} s, then down" "down exit $drc, left: $(leftovers)" \
      "$(cat "$tmp/down")"
  fi
done

exit $failed
