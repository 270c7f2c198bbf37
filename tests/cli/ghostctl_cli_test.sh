#!/usr/bin/env bash
# ghostctl's command line without a daemon: bad arguments are usage errors (exit 2, a message
# naming the problem, nothing on stdout); a missing daemon is a one-line "is ghostfs running?"
# (exit 1). TAP output, one line per check.
# Usage: ghostctl_cli_test.sh GHOSTCTL
set -u
GHOSTCTL=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
sock="$tmp/control.sock"  # nothing listens here
n=0
ok() { n=$((n + 1)); echo "ok $n - $1"; }
not_ok() { n=$((n + 1)); echo "not ok $n - $1"; shift; for l in "$@"; do echo "# $l"; done; }

# expect NAME CODE PATTERN ARGS...: exit code CODE, stderr matching PATTERN, nothing on stdout.
expect() {
  local name=$1 code=$2 pattern=$3
  shift 3
  GHOST_CONTROL="$sock" "$GHOSTCTL" "$@" >"$tmp/out" 2>"$tmp/err" </dev/null
  local rc=$?
  if [ $rc -eq "$code" ] && grep -qE -- "$pattern" "$tmp/err" && [ ! -s "$tmp/out" ]; then
    ok "$name"
  else
    not_ok "$name" "exit $rc (want $code); stderr: $(head -c 300 "$tmp/err"); stdout: $(head -c 200 "$tmp/out")"
  fi
}

echo "1..21"

expect "no command is a usage error" 2 "subcommand is required"
expect "an unknown command is a usage error" 2 "ghostctl: " frobnicate
expect "an unknown option is a usage error" 2 "--bogus" --bogus devices
expect "status without PATH is a usage error" 2 "PATH" status
expect "knob out of range is a usage error" 2 "\"170\" is not a knob value in 0..100" knob 170
expect "knob that is not a number is a usage error" 2 "\"high\" is not a knob value" knob high
expect "extra arguments are a usage error" 2 "ghostctl: " stats extra
expect "--control without a path is a usage error" 2 "--control" devices --control

not_running="^ghostctl: cannot connect to .*: is ghostfs running\? \(--control PATH\)$"
expect "devices without a daemon says ghostfs is not running" 1 "$not_running" devices
expect "stats --json without a daemon says so too" 1 "$not_running" stats --json
expect "--control names the socket in the message" 1 "cannot connect to $tmp/other.sock" \
  --control "$tmp/other.sock" knob 70
expect "watch without a daemon says so" 1 "$not_running" watch

GHOST_CONTROL="$sock" "$GHOSTCTL" stats >/dev/null 2>"$tmp/err"
[ "$(wc -l <"$tmp/err")" -eq 1 ] && ok "the not-running message is one line" \
  || not_ok "one-line message" "$(cat "$tmp/err")"

if "$GHOSTCTL" --help >"$tmp/help" 2>&1 && grep -q -- "--control" "$tmp/help" && grep -q "watch" "$tmp/help"; then
  ok "--help lists the options and commands (exit 0)"
else
  not_ok "--help" "$(head -c 300 "$tmp/help")"
fi

# Each subcommand once in --help (it was listed in the description and again by the parser).
for c in devices knob stats status flush sync watch; do
  count=$(grep -cE "^  $c( |$)" "$tmp/help")
  [ "$count" -eq 1 ] || { not_ok "--help lists $c once" "$count times: $(cat "$tmp/help")"; c=fail; break; }
done
[ "$c" = fail ] || ok "--help lists each subcommand once, sync among them"

# status of a file that does not exist: a message and a non-zero exit, before any daemon.
expect "status of a missing file exits 1 with a message" 1 "status: $tmp/missing: No such file" \
  status "$tmp/missing"
expect "sync without a daemon says ghostfs is not running" 1 "$not_running" sync


# stats --proxy ADDR: ghostproxy's download shaping from its /ghost/status (a stand-in server
# on 127.0.0.1 answers with a fixed status), printed even when no ghostfs answers (exit 1).
cat >"$tmp/status.json" <<'JSON'
{"requests": {"total": 3}, "shaping": {"mode": "auto", "knob": 50, "knob_used": 40,
 "shaped_downloads": 2, "active": 1, "bursts": 10, "mean_burst_bytes": 126464,
 "missed_packets": 3, "declined": 0, "saturated": 1, "sleep_s": 2.5, "mean_slowdown": 1.25}}
JSON
python3 - "$tmp" <<'PY' &
import http.server, os, sys
d = sys.argv[1]
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = open(os.path.join(d, "status.json"), "rb").read() if self.path == "/ghost/status" else b""
        self.send_response(200 if body else 404)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
s = http.server.HTTPServer(("127.0.0.1", 0), H)
open(os.path.join(d, "port.tmp"), "w").write(str(s.server_address[1]))
os.rename(os.path.join(d, "port.tmp"), os.path.join(d, "port"))
s.serve_forever()
PY
server=$!
trap 'kill $server 2>/dev/null; rm -rf "$tmp"' EXIT
for _ in $(seq 50); do [ -s "$tmp/port" ] && break; sleep 0.1; done
port=$(cat "$tmp/port" 2>/dev/null)
GHOST_CONTROL="$sock" "$GHOSTCTL" stats --proxy "127.0.0.1:$port" >"$tmp/out" 2>"$tmp/err"
rc=$?
if [ $rc -eq 1 ] && grep -qE "^shaping +auto, knob 40$" "$tmp/out" &&
   grep -qE "^  downloads +2 shaped \(1 now\), 0 declined, 1 left for plain TCP" "$tmp/out" &&
   grep -qE "^  bursts +10, 123.5 KiB mean$" "$tmp/out" &&
   grep -qE "^  card asleep +2.5 s \(estimated\)$" "$tmp/out" &&
   grep -qE "^  missed packets +3$" "$tmp/out" && grep -qE "^  slowdown +1.25× " "$tmp/out" &&
   grep -qE "$not_running" "$tmp/err"; then
  ok "stats --proxy prints the proxy's shaping (bursts, mean size, sleep, missed, slowdown) without a ghostfs, and exits 1"
else
  not_ok "stats --proxy" "exit $rc; stdout: $(cat "$tmp/out")" "stderr: $(cat "$tmp/err")"
fi
GHOST_CONTROL="$sock" "$GHOSTCTL" stats --json --proxy "http://127.0.0.1:$port/" >"$tmp/out" 2>/dev/null
if python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); assert j["ghostproxy"]["shaping"]["bursts"] == 10' "$tmp/out"; then
  ok "stats --json --proxy URL carries the proxy's status as \"ghostproxy\""
else
  not_ok "stats --json --proxy" "$(head -c 300 "$tmp/out")"
fi
kill $server 2>/dev/null
wait $server 2>/dev/null
expect "stats --proxy with nothing listening names the URL" 1 \
  "cannot read http://127.0.0.1:$port/ghost/status: .*is ghostproxy listening there" stats --proxy "127.0.0.1:$port"
expect "--proxy is an option of stats only" 2 "--proxy" devices --proxy "127.0.0.1:$port"
