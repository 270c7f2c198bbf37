#!/usr/bin/env bash
# linkemu.sh: a slow, distant link between this host and the origin servers, for tests and
# benchmarks (DESIGN §7.2). This kernel has no netem, so the one-way delay comes from nfq_delay
# (tests/linkemu/nfq_delay.cc: NFQUEUE, each packet's verdict held for the delay) and the rate
# caps from TBF.
#
#   host (client)                 NAME-link (the wire)                      NAME (origins)
#   NAME 10.77.0.1/24 ===veth=== to-host | forward | to-origin ===veth=== eth0 10.77.0.2/24
#
# The origins run in namespace NAME (linkemu.sh exec). Namespace NAME-link forwards between
# the two veth pairs (proxy ARP: both ends see one /24) and is where the link lives: packets
# entering it from either side are held for the one-way delay (iptables raw PREROUTING ->
# NFQUEUE), then leave through a TBF capped at the direction's rate (to-host: downlink,
# to-origin: uplink). The delay is applied to packets no socket owns any more (they crossed a
# veth), so TCP small queues do not throttle senders, and it happens before the packets reach
# the host interface, so ping and packet captures on the host see the emulated link.
# Nothing is added to the host's firewall or routing: deleting the two namespaces removes
# every rule, qdisc and interface.
#
# Usage:
#   linkemu.sh up [--name NAME] [--delay-ms 20] [--down-delay-ms D] [--up-delay-ms D]
#                 [--down-kbit 3000] [--up-kbit 256] [--queue-ms 50] [--subnet 10.77.0]
#                 [--loss-pct 0] [--jitter-ms 0] [--jitter-shape 2] [--seed N]
#                 [--nfq-delay PATH]
#   linkemu.sh down [--name NAME]          remove everything (idempotent, works on stale state)
#   linkemu.sh exec [--name NAME] CMD...   run CMD in the origin namespace
#   linkemu.sh status [--name NAME]        exit 0 up, 1 broken (run down), 3 not up
#   linkemu.sh selftest [--name NAME] [up options]
#                                          RTT and throughput against the settings (ups and
#                                          downs the link unless it is already up)
#   linkemu.sh check [--name NAME] [--nfq-delay PATH]
#                                          can this machine run the link? exit 0 yes, 77 no
# --loss-pct drops that share of the packets at random (both directions; 0-100, fractions
# allowed); --jitter-ms adds a gamma-distributed extra one-way delay of that mean (shape
# --jitter-shape) without reordering, as the shaping paper's modified DummyNet; --seed makes
# both repeatable. The delayer runs SCHED_FIFO where it may, so the link's timing does not
# follow the machine's load (measured: under a load of 12 on 2 cores, SCHED_OTHER left gaps of
# 5-13 ms inside a 20 Mb/s flow).
# A rate of 0 kbit means no cap. NAME defaults to $LINKEMU_NAME or "ghostlink"; nfq_delay to
# $NFQ_DELAY or $GHOST_BUILD/tests/linkemu/nfq_delay. State lives in
# ${LINKEMU_STATE_DIR:-/run/linkemu}/NAME.
# Exit codes: 0 success, 1 failure, 2 usage, 77 the machine cannot run the link (check,
# selftest).
set -uo pipefail

GHOST_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
GHOST_BUILD=${GHOST_BUILD:-$GHOST_ROOT/build}
STATE_ROOT=${LINKEMU_STATE_DIR:-/run/linkemu}
UNAVAILABLE=77
ETH_FRAME=1514  # largest frame TBF sees on a 1500-byte-MTU veth

name=${LINKEMU_NAME:-ghostlink}
delay_ms=20
down_delay_ms=
up_delay_ms=
down_kbit=3000
up_kbit=256
queue_ms=50
loss_pct=0
jitter_ms=0
jitter_shape=2
seed=0
subnet=10.77.0
nfq_delay=${NFQ_DELAY:-$GHOST_BUILD/tests/linkemu/nfq_delay}

say() { printf 'linkemu: %s\n' "$*" >&2; }
die() {
  say "$*"
  exit 1
}
usage() {
  say "$*"
  say "usage: linkemu.sh up|down|exec|status|selftest|check [options]; run linkemu.sh --help"
  exit 2
}

# ---- Options ----

# parse_options ALLOWED ARGS...: sets the globals; ALLOWED is "up" (all link options) or
# "name" (--name only; --nfq-delay too for check). Leaves the rest in REST.
REST=()
parse_options() {
  local allowed=$1
  shift
  while [ $# -gt 0 ]; do
    case $1 in
      --name) need_value "$@"; name=$2; shift 2 ;;
      --nfq-delay) need_value "$@"; nfq_delay=$2; shift 2 ;;
      --delay-ms | --down-delay-ms | --up-delay-ms | --down-kbit | --up-kbit | --queue-ms | --subnet | \
        --loss-pct | --jitter-ms | --jitter-shape | --seed)
        [ "$allowed" = up ] || usage "$1 is an option of up and selftest"
        need_value "$@"
        case $1 in
          --delay-ms) delay_ms=$2 ;;
          --down-delay-ms) down_delay_ms=$2 ;;
          --up-delay-ms) up_delay_ms=$2 ;;
          --down-kbit) down_kbit=$2 ;;
          --up-kbit) up_kbit=$2 ;;
          --queue-ms) queue_ms=$2 ;;
          --subnet) subnet=$2 ;;
          --loss-pct) loss_pct=$2 ;;
          --jitter-ms) jitter_ms=$2 ;;
          --jitter-shape) jitter_shape=$2 ;;
          --seed) seed=$2 ;;
        esac
        shift 2
        ;;
      --) shift; break ;;
      -*) usage "unknown option $1" ;;
      *) break ;;
    esac
  done
  REST=("$@")
  [[ $name =~ ^[a-z][a-z0-9_]{0,9}$ ]] ||
    usage "--name '$name': 1-10 characters, a-z, 0-9 and _, starting with a letter (it names an interface)"
  down_delay_ms=${down_delay_ms:-$delay_ms}
  up_delay_ms=${up_delay_ms:-$delay_ms}
  local v
  for v in "$delay_ms" "$down_delay_ms" "$up_delay_ms"; do
    [[ $v =~ ^[0-9]+(\.[0-9]+)?$ ]] || usage "a delay must be a number of milliseconds, not '$v'"
  done
  for v in "$loss_pct" "$jitter_ms" "$jitter_shape"; do
    [[ $v =~ ^[0-9]+(\.[0-9]+)?$ ]] || usage "loss, jitter and shape must be numbers, not '$v'"
  done
  awk -v l="$loss_pct" 'BEGIN { exit !(l <= 100) }' || usage "--loss-pct must be at most 100"
  awk -v k="$jitter_shape" 'BEGIN { exit !(k > 0) }' || usage "--jitter-shape must be above 0"
  [[ $seed =~ ^[0-9]+$ ]] || usage "--seed must be a whole number, not '$seed'"
  for v in "$down_kbit" "$up_kbit" "$queue_ms"; do
    [[ $v =~ ^[0-9]+$ ]] || usage "a rate (kbit/s) or queue length (ms) must be a whole number, not '$v'"
  done
  [ "$queue_ms" -gt 0 ] || usage "--queue-ms must be at least 1"
  if ! [[ $subnet =~ ^([0-9]{1,3})\.([0-9]{1,3})\.([0-9]{1,3})$ ]] ||
    [ "${BASH_REMATCH[1]}" -gt 255 ] || [ "${BASH_REMATCH[2]}" -gt 255 ] ||
    [ "${BASH_REMATCH[3]}" -gt 255 ]; then
    usage "--subnet '$subnet': the first three octets of a /24, e.g. 10.77.0"
  fi
  derive_names
}

need_value() {
  if [ $# -lt 2 ] || [ -z "$2" ]; then usage "$1 needs a value"; fi
}

derive_names() {
  ns=$name              # the origins' namespace
  link_ns=$name-link    # the wire
  host_if=$name         # the host's end
  host_ip=$subnet.1
  ns_ip=$subnet.2
  state=$STATE_ROOT/$name
}

# ---- Small helpers ----

# run CMD...: runs CMD; on failure says what failed with its error output and returns 1.
run() {
  local err
  if ! err=$("$@" 2>&1 >/dev/null); then
    say "failed: $*${err:+: $err}"
    return 1
  fi
}

in_link() { ip netns exec "$link_ns" "$@"; }

# For `ip netns exec NETNS sh -c "$DROP_FUSE" sh CMD...`: runs CMD without the FUSE mounts that
# the new mount namespace copied from ours. Where / has private propagation (containers, this
# CI), such a copy keeps a FUSE file system alive after it is unmounted here: its daemon never
# sees the unmount (nor runs its unmount flush) until CMD exits. Long-lived commands in a
# namespace (the delayer, servers, `linkemu.sh exec`) drop them; nothing else in them uses FUSE.
# shellcheck disable=SC2016  # a script for the inner shell
DROP_FUSE='awk '"'"'$3 == "fuse" || $3 == "fuseblk" || $3 ~ /^fuse\./ { print $2 }'"'"' /proc/self/mounts |
  while IFS= read -r m; do umount -l "$(printf "%b" "$m")" 2>/dev/null || true; done
exec "$@"'

# bound_queues NETNS N...: how many of the NFQUEUE queues N... are bound in NETNS.
bound_queues() {
  local n=$1
  shift
  # shellcheck disable=SC2016  # an awk program
  ip netns exec "$n" awk -v want=" $* " 'index(want, " " $1 " ")' \
    /proc/net/netfilter/nfnetlink_queue 2>/dev/null | wc -l
}
netns_exists() { [ -e "/run/netns/$1" ] || ip netns list 2>/dev/null | grep -qE "^$1( |$)"; }
iface_exists() { ip link show dev "$1" >/dev/null 2>&1; }

# Whether PID is an nfq_delay of this link (pids are reused; never kill a stranger).
is_our_delayer() {
  local pid=$1 cmd
  [ -r "/proc/$pid/cmdline" ] || return 1
  cmd=$(tr '\0' ' ' <"/proc/$pid/cmdline")
  [[ $cmd == *nfq_delay* && $cmd == *"--link $name "* ]]
}

# Whether PID runs (a zombie has exited: its parent, often init, may reap it late).
running() {
  local stat
  stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
  stat=${stat##*) }
  [ "${stat%% *}" != Z ]
}

# stop_pids PID...: SIGTERM, up to 3 s to exit, then SIGKILL.
stop_pids() {
  [ $# -gt 0 ] || return 0
  kill -TERM "$@" 2>/dev/null
  local pid alive
  for _ in $(seq 30); do
    alive=()
    for pid in "$@"; do running "$pid" && alive+=("$pid"); done
    [ ${#alive[@]} -eq 0 ] && return 0
    sleep 0.1
  done
  say "killing ${alive[*]} (did not exit on SIGTERM)"
  kill -KILL "${alive[@]}" 2>/dev/null
  return 0
}

# TBF for RATE kbit/s: "rate R burst B limit L". Burst: two frames (one frame's worth of tokens
# would make every late timer cost rate), or 2 ms of traffic at high rates. Limit: queue_ms of
# traffic, at least 4 frames, so TCP keeps the link busy without an unbounded queue.
tbf_args() {
  local kbit=$1 bytes_per_ms burst limit
  bytes_per_ms=$((kbit / 8))
  burst=$((2 * ETH_FRAME))
  [ $((2 * bytes_per_ms)) -gt $burst ] && burst=$((2 * bytes_per_ms))
  limit=$((queue_ms * bytes_per_ms))
  [ $limit -lt $((4 * ETH_FRAME)) ] && limit=$((4 * ETH_FRAME))
  echo "rate ${kbit}kbit burst $burst limit $((limit + burst))"
}

# ---- down ----

cmd_down() {
  local pids=() pid
  # The delayer by its pid file, then whatever else runs in the two namespaces (the origin
  # servers started with exec, a delayer whose pid was never written).
  if [ -f "$state/delayer.pid" ]; then
    pid=$(cat "$state/delayer.pid" 2>/dev/null)
    [[ $pid =~ ^[0-9]+$ ]] && is_our_delayer "$pid" && pids+=("$pid")
  fi
  local n
  for n in "$link_ns" "$ns"; do
    netns_exists "$n" || continue
    for pid in $(ip netns pids "$n" 2>/dev/null); do pids+=("$pid"); done
  done
  stop_pids "${pids[@]}"
  for n in "$link_ns" "$ns"; do
    if netns_exists "$n"; then
      run ip netns delete "$n" || say "could not delete namespace $n; retry linkemu.sh down"
    fi
  done
  # The host end goes with its peer; this only catches a pair created half-way by a crash.
  if iface_exists "$host_if" && ip -d link show dev "$host_if" 2>/dev/null | grep -q veth; then
    run ip link delete "$host_if"
  fi
  rm -rf "$state"
  if netns_exists "$ns" || netns_exists "$link_ns" || iface_exists "$host_if"; then
    die "link $name is not fully removed (see above); run linkemu.sh down --name $name again"
  fi
  return 0
}

# ---- up ----

up_failed() {
  local rc=$?
  trap - EXIT INT TERM
  say "up failed; removing what was set up"
  [ -s "$state/delayer.log" ] && sed 's/^/linkemu: nfq_delay: /' "$state/delayer.log" >&2
  cmd_down >/dev/null 2>&1 || cmd_down
  exit $((rc == 0 ? 1 : rc))
}

cmd_up() {
  [ "$(id -u)" -eq 0 ] || die "up needs root (namespaces, qdiscs, iptables)"
  local c
  for c in ip tc iptables; do
    command -v "$c" >/dev/null || die "$c is missing (Debian: iproute2, iptables)"
  done
  [ -x "$nfq_delay" ] ||
    die "no nfq_delay at $nfq_delay (build it: ninja -C \$GHOST_BUILD, needs libnetfilter-queue-dev; or --nfq-delay PATH)"
  # One up at a time, so that the checks below and the creation they guard are one step for
  # concurrent ups (same name or same subnet). Released when up ends; the delayer does not
  # inherit it.
  local lock
  mkdir -p "$STATE_ROOT" || die "cannot create $STATE_ROOT"
  exec {lock}>"$STATE_ROOT/.lock" || die "cannot open $STATE_ROOT/.lock"
  flock -w 30 "$lock" || die "another linkemu.sh up holds $STATE_ROOT/.lock"
  netns_exists "$ns" && die "namespace $ns already exists; run linkemu.sh down --name $name first"
  netns_exists "$link_ns" &&
    die "namespace $link_ns already exists; run linkemu.sh down --name $name first"
  iface_exists "$host_if" && die "interface $host_if already exists; run linkemu.sh down --name $name first (or choose another --name)"
  ip -4 -o addr show | grep -qE "inet ${subnet//./\\.}\.[0-9]+/" &&
    die "the host already has an address in $subnet.0/24; choose another --subnet"
  [ -e "$state" ] && rm -rf "$state"

  # From here on, any failure or signal removes what was set up.
  trap up_failed EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM
  mkdir -p "$state" || exit 1
  cat >"$state/config" <<EOF
name=$name
subnet=$subnet
down_delay_ms=$down_delay_ms
up_delay_ms=$up_delay_ms
down_kbit=$down_kbit
up_kbit=$up_kbit
queue_ms=$queue_ms
loss_pct=$loss_pct
jitter_ms=$jitter_ms
jitter_shape=$jitter_shape
EOF

  run ip netns add "$link_ns" || exit 1
  run ip netns add "$ns" || exit 1
  # For the tests only: hold `up` here so a signal is sure to land half-way through it.
  if [ -n "${LINKEMU_TEST_PAUSE_S:-}" ]; then sleep "$LINKEMU_TEST_PAUSE_S"; fi
  # Each pair is created with its ends already in place, so a crash leaves nothing in the host
  # but (at most) the host end, which down removes.
  run ip link add "$host_if" type veth peer name to-host netns "$link_ns" || exit 1
  run ip -n "$link_ns" link add to-origin type veth peer name eth0 netns "$ns" || exit 1

  # IPv4 only: no IPv6 autoconfiguration chatter on the link.
  run sysctl -qw "net.ipv6.conf.$host_if.disable_ipv6=1" || exit 1
  local n
  for n in "$link_ns" "$ns"; do
    run ip netns exec "$n" sysctl -qw net.ipv6.conf.all.disable_ipv6=1 || exit 1
    run ip netns exec "$n" sysctl -qw net.ipv6.conf.default.disable_ipv6=1 || exit 1
    run ip -n "$n" link set lo up || exit 1
  done

  run ip addr add "$host_ip/24" dev "$host_if" || exit 1
  run ip -n "$ns" addr add "$ns_ip/24" dev eth0 || exit 1
  run ip link set "$host_if" up || exit 1
  run ip -n "$ns" link set eth0 up || exit 1
  run ip -n "$link_ns" link set to-host up || exit 1
  run ip -n "$link_ns" link set to-origin up || exit 1

  # The wire forwards; proxy ARP makes it invisible at layer 3 (both ends share one /24).
  # Static neighbours for the two ends, so no ARP is ever queued behind the link.
  run in_link sysctl -qw net.ipv4.ip_forward=1 || exit 1
  for c in to-host to-origin; do
    run in_link sysctl -qw "net.ipv4.conf.$c.proxy_arp=1" || exit 1
    run in_link sysctl -qw "net.ipv4.neigh.$c.proxy_delay=0" || exit 1
  done
  run ip -n "$link_ns" route add "$subnet.0/24" dev to-origin || exit 1
  run ip -n "$link_ns" route add "$host_ip/32" dev to-host || exit 1
  local mac_host mac_ns mac_to_host mac_to_origin
  mac_host=$(cat "/sys/class/net/$host_if/address")
  mac_ns=$(ip -n "$ns" -br link show dev eth0 | awk '{print $3}')
  mac_to_host=$(ip -n "$link_ns" -br link show dev to-host | awk '{print $3}')
  mac_to_origin=$(ip -n "$link_ns" -br link show dev to-origin | awk '{print $3}')
  run ip -n "$link_ns" neigh replace "$host_ip" lladdr "$mac_host" dev to-host nud permanent || exit 1
  run ip -n "$link_ns" neigh replace "$ns_ip" lladdr "$mac_ns" dev to-origin nud permanent || exit 1
  run ip neigh replace "$ns_ip" lladdr "$mac_to_host" dev "$host_if" nud permanent || exit 1
  run ip -n "$ns" neigh replace "$host_ip" lladdr "$mac_to_origin" dev eth0 nud permanent || exit 1

  # Rates: TBF where packets leave the wire.
  local args
  if [ "$down_kbit" -gt 0 ]; then
    read -ra args <<<"$(tbf_args "$down_kbit")"
    run ip netns exec "$link_ns" tc qdisc add dev to-host root tbf "${args[@]}" || exit 1
  fi
  if [ "$up_kbit" -gt 0 ]; then
    read -ra args <<<"$(tbf_args "$up_kbit")"
    run ip netns exec "$link_ns" tc qdisc add dev to-origin root tbf "${args[@]}" || exit 1
  fi

  # Delay: queue 0 holds the downlink (entering from the origins), queue 1 the uplink. Its own
  # session, so a Ctrl-C meant for a later command in this terminal does not reach it.
  local rt=()
  command -v chrt >/dev/null && chrt -f 10 true 2>/dev/null && rt=(chrt -f 10)
  local impair=(--loss-pct "$loss_pct" --jitter-ms "$jitter_ms" --jitter-shape "$jitter_shape")
  [ "$seed" != 0 ] && impair+=(--seed "$seed")
  setsid "${rt[@]}" ip netns exec "$link_ns" sh -c "$DROP_FUSE" sh "$nfq_delay" --queue 0 --queue 1 \
    --delay-ms "$down_delay_ms" --delay-ms "$up_delay_ms" "${impair[@]}" --link "$name" \
    </dev/null >"$state/delayer.log" 2>&1 {lock}>&- &
  local pid=$!
  echo "$pid" >"$state/delayer.pid"
  local ready=''
  for _ in $(seq 50); do
    running "$pid" || break
    if [ "$(bound_queues "$link_ns" 0 1)" -eq 2 ]; then
      ready=1
      break
    fi
    sleep 0.1
  done
  [ -n "$ready" ] || {
    say "nfq_delay did not bind its queues (is the nfnetlink_queue module available?)"
    exit 1
  }
  run in_link iptables -w -t raw -A PREROUTING -i to-origin -j NFQUEUE --queue-num 0 \
    --queue-bypass || exit 1
  run in_link iptables -w -t raw -A PREROUTING -i to-host -j NFQUEUE --queue-num 1 \
    --queue-bypass || exit 1

  date +%s >"$state/up"
  trap - EXIT INT TERM
  exec {lock}>&-
  say "link $name up: host $host_if $host_ip <-> $ns_ip in namespace $ns;" \
    "delay ${down_delay_ms} ms down / ${up_delay_ms} ms up;" \
    "rate $(fmt_kbit "$down_kbit") down / $(fmt_kbit "$up_kbit") up;" \
    "loss ${loss_pct}%; jitter ${jitter_ms} ms (gamma, shape ${jitter_shape})"
  say "run servers with: $0 exec --name $name CMD... (bind them to $ns_ip)"
}

fmt_kbit() { if [ "$1" -eq 0 ]; then echo "uncapped"; else echo "$1 kbit/s"; fi; }

# ---- status ----

load_config() {
  [ -f "$state/config" ] || return 1
  local key value
  while IFS='=' read -r key value; do
    case $key in
      subnet | down_delay_ms | up_delay_ms | down_kbit | up_kbit | queue_ms | loss_pct | jitter_ms | jitter_shape) printf -v "$key" '%s' "$value" ;;
    esac
  done <"$state/config"
  derive_names
}

# Prints what exists of the link; returns 0 when it is fully up, 1 when only part of it is.
cmd_status() {
  local problems=() pid=
  if ! load_config; then
    if netns_exists "$ns" || netns_exists "$link_ns" || iface_exists "$host_if"; then
      echo "link $name: stale (namespaces or interface without state); run linkemu.sh down --name $name"
      return 1
    fi
    echo "link $name: not up"
    return 3
  fi
  echo "link $name: host $host_if $host_ip <-> $ns_ip (namespace $ns)"
  echo "  delay ${down_delay_ms} ms down, ${up_delay_ms} ms up;" \
    "rate $(fmt_kbit "$down_kbit") down, $(fmt_kbit "$up_kbit") up; queue ${queue_ms} ms;" \
    "loss ${loss_pct}%, jitter ${jitter_ms} ms"
  [ -f "$state/up" ] || problems+=("setup did not finish")
  netns_exists "$ns" || problems+=("namespace $ns is missing")
  netns_exists "$link_ns" || problems+=("namespace $link_ns is missing")
  iface_exists "$host_if" || problems+=("interface $host_if is missing")
  pid=$(cat "$state/delayer.pid" 2>/dev/null)
  if [[ $pid =~ ^[0-9]+$ ]] && is_our_delayer "$pid"; then
    echo "  nfq_delay pid $pid"
  else
    problems+=("nfq_delay is not running (packets pass undelayed)")
  fi
  if netns_exists "$link_ns"; then
    echo "  queues (num portid held copy_mode copy_range queue_dropped user_dropped last_id):"
    in_link cat /proc/net/netfilter/nfnetlink_queue 2>/dev/null | sed 's/^/    /'
    echo "  qdiscs:"
    in_link tc -s qdisc show 2>/dev/null | grep -A2 tbf | sed 's/^/    /'
    echo "  rules:"
    in_link iptables -w -t raw -S PREROUTING 2>/dev/null | grep NFQUEUE | sed 's/^/    /'
    local procs
    procs=$(ip netns pids "$ns" 2>/dev/null | tr '\n' ' ')
    echo "  processes in $ns: ${procs:-none}"
  fi
  if [ ${#problems[@]} -gt 0 ]; then
    printf '  BROKEN: %s\n' "${problems[@]}"
    echo "  run linkemu.sh down --name $name"
    return 1
  fi
  return 0
}

# ---- check ----

# Whether this machine can run the link: root, the tools, nfq_delay, namespaces, TBF, NFQUEUE
# and the iptables NFQUEUE target, tried in a scratch namespace. Prints the reason and returns
# 77 when not.
cmd_check() {
  local why='' probe=${name}-probe c
  [ "$(id -u)" -eq 0 ] || why="not root"
  for c in ip tc iptables ping python3; do
    [ -n "$why" ] || command -v "$c" >/dev/null || why="$c is missing"
  done
  [ -n "$why" ] || [ -x "$nfq_delay" ] || why="nfq_delay not built at $nfq_delay (libnetfilter-queue-dev missing?)"
  if [ -z "$why" ]; then
    netns_exists "$probe" && ip netns delete "$probe" 2>/dev/null
    if ! ip netns add "$probe" 2>/dev/null; then
      why="cannot create network namespaces"
    else
      ip -n "$probe" link set lo up 2>/dev/null
      ip netns exec "$probe" tc qdisc add dev lo root tbf rate 1mbit burst 3028 limit 10000 \
        2>/dev/null || why="no TBF qdisc"
      if [ -z "$why" ]; then
        ip netns exec "$probe" iptables -w -t raw -A PREROUTING -i lo -j NFQUEUE --queue-num 0 \
          --queue-bypass 2>/dev/null || why="iptables has no NFQUEUE target"
      fi
      if [ -z "$why" ]; then
        ip netns exec "$probe" sh -c "$DROP_FUSE" sh "$nfq_delay" --queue 0 --link "$probe" </dev/null >/dev/null 2>&1 &
        local pid=$! ok=''
        for _ in $(seq 30); do
          if [ "$(bound_queues "$probe" 0)" -eq 1 ]; then
            ok=1
            break
          fi
          running "$pid" || break
          sleep 0.1
        done
        stop_pids "$pid"
        wait "$pid" 2>/dev/null
        [ -n "$ok" ] || why="NFQUEUE is unavailable (nfnetlink_queue module)"
      fi
      ip netns delete "$probe" 2>/dev/null
    fi
  fi
  if [ -n "$why" ]; then
    echo "linkemu: cannot run here: $why"
    return $UNAVAILABLE
  fi
  echo "linkemu: this machine can run the link"
}

# ---- selftest ----

# The bulk-transfer helper. "serve ADDR" (in the origin namespace) prints its port, then per
# connection sends for ever ('D') or swallows what comes and reports the byte count back about
# every 10 ms ('U'). "measure D|U SRC DST PORT WARM DUR LINK_NS DEV" transfers for WARM+DUR
# seconds over one TCP connection and prints two rates in bit/s over the last DUR seconds:
# goodput, counted where the bytes arrive (the client for D, the server's reports for U, so the
# sender's buffers do not inflate it), and the wire rate, the bytes that the TBF on DEV in
# LINK_NS sent (Ethernet frames; "-" when DEV has no TBF).
read -r -d '' BULK_PY <<'PYEOF'
import json, select, socket, struct, subprocess, sys, time

def serve(addr):
    ls = socket.socket()
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind((addr, 0))
    ls.listen(4)
    print(ls.getsockname()[1], flush=True)
    buf = bytes(1 << 16)
    while True:
        c, _ = ls.accept()
        try:
            mode = c.recv(1)
            if mode == b"D":
                while True:
                    c.sendall(buf)
            elif mode == b"U":
                # Reports leave at once (no Nagle), so their arrival times are their send times
                # plus the constant downlink delay.
                c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                count, last = 0, 0.0
                while True:
                    d = c.recv(1 << 16)
                    if not d:
                        break
                    count += len(d)
                    now = time.monotonic()
                    if now - last >= 0.01:
                        c.sendall(struct.pack("!Q", count))
                        last = now
        except OSError:
            pass
        finally:
            c.close()

def tbf_bytes(link_ns, dev):
    """(time, bytes sent by the TBF on dev) or None without a TBF."""
    t0 = time.monotonic()
    out = subprocess.run(["ip", "netns", "exec", link_ns, "tc", "-s", "-j", "qdisc", "show",
                          "dev", dev], capture_output=True, text=True, check=True).stdout
    t = (t0 + time.monotonic()) / 2
    for q in json.loads(out):
        if q.get("kind") == "tbf":
            return (t, q["bytes"])
    return None

def rate(samples, lo, hi):
    """bit/s: the least-squares slope of (time, bytes) over the samples in [lo, hi], so that
    jitter in when a sample was taken (scheduling, a report's trip) does not weigh as it would
    at two end points."""
    inside = [s for s in samples if lo <= s[0] <= hi]
    if len(inside) < 2 or inside[-1][0] <= inside[0][0]:
        raise SystemExit("too few samples to measure a rate")
    n = len(inside)
    mt = sum(t for t, _ in inside) / n
    mb = sum(b for _, b in inside) / n
    var = sum((t - mt) ** 2 for t, _ in inside)
    return 8 * sum((t - mt) * (b - mb) for t, b in inside) / var

def measure(mode, src, dst, port, warm, dur, link_ns, dev):
    warm, dur = float(warm), float(dur)
    s = socket.create_connection((dst, int(port)), timeout=10, source_address=(src, 0))
    s.sendall(mode.encode())
    s.setblocking(False)
    buf = bytes(1 << 16)
    received, reports = 0, b""
    goodput, wire = [], []
    t0 = time.monotonic()
    while True:
        now = time.monotonic() - t0
        if now >= warm and not wire or now >= warm + dur:
            w = tbf_bytes(link_ns, dev)
            wire.append((w[0] - t0, w[1]) if w else None)
        if now >= warm + dur:
            break
        r, w, _ = select.select([s], [s] if mode == "U" else [], [], 0.01)
        now = time.monotonic() - t0
        if r:
            d = s.recv(1 << 16)
            if not d:
                raise SystemExit("the server closed the connection")
            if mode == "D":
                received += len(d)
                goodput.append((now, received))
            else:
                reports += d
                while len(reports) >= 8:
                    goodput.append((now, struct.unpack("!Q", reports[:8])[0]))
                    reports = reports[8:]
        if w:
            try:
                s.send(buf)
            except BlockingIOError:
                pass
    s.close()
    g = rate(goodput, warm, warm + dur)
    print(f"{g:.0f}", f"{rate(wire, 0, float('inf')):.0f}" if None not in wire else "-")

if sys.argv[1] == "serve":
    serve(sys.argv[2])
else:
    measure(*sys.argv[2:])
PYEOF

# within VALUE WANT PERCENT: whether |VALUE - WANT| <= PERCENT% of WANT.
within() {
  awk -v v="$1" -v w="$2" -v p="$3" 'BEGIN { d = v - w; if (d < 0) d = -d; exit !(d <= w * p / 100) }'
}

selftest_done() {
  local rc=$?
  trap - EXIT INT TERM
  if [ -n "${server_pid:-}" ]; then
    stop_pids "$server_pid"
    wait "$server_pid" 2>/dev/null
  fi
  if [ -n "${brought_up:-}" ]; then
    cmd_down >/dev/null || say "down after the self-test failed; run linkemu.sh down --name $name"
  fi
  exit "$rc"
}

cmd_selftest() {
  local out rc
  out=$(cmd_check)
  rc=$?
  if [ $rc -ne 0 ]; then
    echo "$out"
    return $rc
  fi
  brought_up=
  server_pid=
  trap selftest_done EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM
  if [ -f "$STATE_ROOT/$name/up" ]; then
    load_config || die "cannot read $state/config"
    cmd_status >/dev/null || die "link $name is broken; run linkemu.sh down --name $name"
    say "testing the link $name that is already up"
  else
    cmd_up || return 1
    brought_up=1
    trap selftest_done EXIT  # up replaced the traps
    trap 'exit 130' INT
    trap 'exit 143' TERM
  fi
  local warm=1 dur=5 want_rtt failed=0
  want_rtt=$(awk -v a="$down_delay_ms" -v b="$up_delay_ms" 'BEGIN { print a + b }')
  echo "linkemu selftest: link $name: delay ${down_delay_ms} ms down + ${up_delay_ms} ms up," \
    "rate $(fmt_kbit "$down_kbit") down, $(fmt_kbit "$up_kbit") up"

  # RTT: the median of 20 pings (idle link, so no queueing).
  local times median
  times=$(ping -n -c 20 -i 0.2 -W 2 -I "$host_ip" "$ns_ip" 2>&1 | sed -n 's/.*time=\([0-9.]*\) ms.*/\1/p')
  if [ "$(echo "$times" | grep -c .)" -lt 15 ]; then
    echo "  FAIL ping RTT: only $(echo "$times" | grep -c .) of 20 replies"
    failed=1
  else
    median=$(echo "$times" | sort -n | awk '{ a[NR] = $1 } END { print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2 }')
    local lo hi verdict=FAIL
    lo=$(echo "$times" | sort -n | head -1)
    hi=$(echo "$times" | sort -n | tail -1)
    within "$median" "$want_rtt" 5 && verdict=PASS
    [ $verdict = PASS ] || failed=1
    printf '  %s ping RTT: median %.2f ms (min %s, max %s, %d pings); want %.2f ms +-5%%\n' \
      "$verdict" "$median" "$lo" "$hi" "$(echo "$times" | grep -c .)" "$want_rtt"
  fi

  # Throughput each way: one TCP connection, goodput over DUR s after WARM s of warm-up.
  local port
  ip netns exec "$ns" sh -c "$DROP_FUSE" sh python3 -c "$BULK_PY" serve "$ns_ip" >"$state/bulk.port" 2>"$state/bulk.err" &
  server_pid=$!
  for _ in $(seq 50); do
    [ -s "$state/bulk.port" ] && break
    sleep 0.1
  done
  port=$(cat "$state/bulk.port")
  if ! [[ $port =~ ^[0-9]+$ ]]; then
    echo "  FAIL downlink throughput: the test server did not start: $(cat "$state/bulk.err")"
    echo "  FAIL uplink throughput: the test server did not start"
    return 1
  fi
  local dir mode kbit dev res good wire
  for dir in down up; do
    if [ $dir = down ]; then
      mode=D kbit=$down_kbit dev=to-host
    else
      mode=U kbit=$up_kbit dev=to-origin
    fi
    if ! res=$(python3 -c "$BULK_PY" measure "$mode" \
      "$host_ip" "$ns_ip" "$port" "$warm" "$dur" "$link_ns" "$dev" 2>&1); then
      echo "  FAIL ${dir}link goodput: transfer failed: $res"
      echo "  FAIL ${dir}link wire rate: transfer failed"
      failed=1
      continue
    fi
    read -r good wire <<<"$res"
    if [ "$kbit" -eq 0 ]; then
      printf '  INFO %slink goodput: %.1f Mb/s (uncapped)\n' "$dir" \
        "$(awk -v g="$good" 'BEGIN { print g / 1e6 }')"
      continue
    fi
    local what value verdict
    for what in goodput wire; do
      if [ $what = goodput ]; then value=$good; else value=$wire; fi
      verdict=FAIL
      within "$value" "$((kbit * 1000))" 10 && verdict=PASS
      [ $verdict = PASS ] || failed=1
      printf '  %s %slink %s: %.1f kb/s; want %d kb/s +-10%%\n' "$verdict" "$dir" \
        "$([ $what = goodput ] && echo "goodput (TCP payload)" || echo "wire rate (frames out of the TBF)")" \
        "$(awk -v g="$value" 'BEGIN { print g / 1e3 }')" "$kbit"
    done
  done
  if [ $failed -eq 0 ]; then echo "linkemu selftest: PASS"; else echo "linkemu selftest: FAIL"; fi
  return $failed
}

# ---- main ----

[ $# -ge 1 ] || usage "a command is required"
command=$1
shift
case $command in
  up)
    parse_options up "$@"
    [ ${#REST[@]} -eq 0 ] || usage "unexpected argument ${REST[0]}"
    cmd_up
    ;;
  down)
    parse_options name "$@"
    [ ${#REST[@]} -eq 0 ] || usage "unexpected argument ${REST[0]}"
    [ "$(id -u)" -eq 0 ] || die "down needs root"
    cmd_down
    ;;
  exec)
    parse_options name "$@"
    [ ${#REST[@]} -gt 0 ] || usage "exec needs a command"
    netns_exists "$ns" || die "link $name is not up (no namespace $ns); run linkemu.sh up first"
    exec ip netns exec "$ns" sh -c "$DROP_FUSE" sh "${REST[@]}"
    ;;
  status)
    parse_options name "$@"
    [ ${#REST[@]} -eq 0 ] || usage "unexpected argument ${REST[0]}"
    cmd_status
    ;;
  selftest)
    parse_options up "$@"
    [ ${#REST[@]} -eq 0 ] || usage "unexpected argument ${REST[0]}"
    cmd_selftest
    ;;
  check)
    parse_options name "$@"
    [ ${#REST[@]} -eq 0 ] || usage "unexpected argument ${REST[0]}"
    cmd_check
    ;;
  -h | --help | help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//' ;;
  *) usage "unknown command '$command'" ;;
esac
