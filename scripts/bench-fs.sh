#!/usr/bin/env bash
# File-system benchmark: ghostfs side by side with httpdirfs, rclone mount (--vfs-cache-mode
# full) and direct local reads, against one nginx origin on 127.0.0.1, in one run. Prints a
# table of ratios (common/DESIGN.md §7) and one line per speed goal. Takes a few minutes (< 10).
#
#   scripts/bench-fs.sh [bench_fs.py run options, e.g. --large-rounds 7 --json out.json]
#
# Environment: GHOSTFS=path/to/ghostfs (skip the build), GHOST_BUILD=build dir (default build/),
# BENCH_TIMEOUT=hard limit in seconds for the whole measurement (default 840).
# Installs what is missing (nginx-light fuse3 httpdirfs rclone); a peer that cannot be
# installed is reported as n/a. Every mount and process it starts is removed on exit, also on
# failure or Ctrl-C. Needs root: FUSE mounts and /proc/sys/vm/drop_caches.
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
GHOST_BUILD=${GHOST_BUILD:-$ROOT/build}
PRIVATE_BUILD=${PRIVATE_BUILD:-/tmp/ghost-bench-build}
BENCH_TIMEOUT=${BENCH_TIMEOUT:-840}

say() { printf '== %s\n' "$*" >&2; }

if [ "$(id -u)" -ne 0 ]; then
  echo "bench-fs: run as root (FUSE mounts and dropping the page cache need it)" >&2
  exit 1
fi
if [ ! -e /dev/fuse ]; then
  echo "bench-fs: /dev/fuse is missing; cannot mount" >&2
  exit 1
fi

# --- packages -------------------------------------------------------------------------------
installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q 'install ok installed'; }
apt_install() {
  DEBIAN_FRONTEND=noninteractive timeout 300 apt-get install -y -qq "$@" >/dev/null 2>&1
}
missing=()
for p in nginx-light fuse3 python3 httpdirfs rclone; do installed "$p" || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
  say "installing ${missing[*]}"
  if ! apt_install "${missing[@]}"; then
    timeout 300 apt-get update -qq >/dev/null 2>&1
    for p in "${missing[@]}"; do
      apt_install "$p" || say "could not install $p"
    done
  fi
fi
for p in nginx-light fuse3 python3; do
  installed "$p" || { echo "bench-fs: $p is required and could not be installed" >&2; exit 1; }
done
# httpdirfs / rclone: if still missing, bench_fs.py reports them as n/a.

# --- ghostfs --------------------------------------------------------------------------------
if [ -n "${GHOSTFS:-}" ]; then
  [ -x "$GHOSTFS" ] || { echo "bench-fs: GHOSTFS=$GHOSTFS is not executable" >&2; exit 1; }
elif [ -f "$GHOST_BUILD/build.ninja" ] && timeout 900 ninja -C "$GHOST_BUILD" fs/ghostfs fs/ghostctl >/dev/null 2>&1; then
  GHOSTFS=$GHOST_BUILD/fs/ghostfs
else
  say "$GHOST_BUILD does not build fs/ghostfs; using a private build dir $PRIVATE_BUILD"
  if [ ! -f "$PRIVATE_BUILD/build.ninja" ]; then
    meson setup "$PRIVATE_BUILD" "$ROOT" >/dev/null || { echo "bench-fs: meson setup $PRIVATE_BUILD failed" >&2; exit 1; }
  fi
  timeout 900 ninja -C "$PRIVATE_BUILD" fs/ghostfs fs/ghostctl >/dev/null \
    || timeout 900 ninja -C "$PRIVATE_BUILD" fs/ghostfs \
    || { echo "bench-fs: cannot build ghostfs" >&2; exit 1; }
  GHOSTFS=$PRIVATE_BUILD/fs/ghostfs
fi
say "ghostfs: $GHOSTFS ($(git -C "$ROOT" describe --always --dirty 2>/dev/null || echo '?'))"

# --- scratch dir and cleanup ----------------------------------------------------------------
# On a real disk (not tmpfs), so dropping the page cache sends reads to the disk.
WORK=$(mktemp -d "${BENCH_WORK_PARENT:-/var/tmp}/bench-fs.XXXXXX") || exit 1
PY_PID=
WATCHDOG_PID=

unmount_all() {
  local m cid
  for m in "$WORK"/mnt-*; do
    [ -d "$m" ] || continue
    if grep -q " $m " /proc/self/mountinfo; then
      if ! timeout 15 fusermount3 -u "$m" 2>/dev/null; then
        cid=$(awk -v m="$m" '$5 == m { split($3, d, ":"); print d[2] }' /proc/self/mountinfo | head -1)
        [ -n "$cid" ] && [ -w "/sys/fs/fuse/connections/$cid/abort" ] && echo 1 >"/sys/fs/fuse/connections/$cid/abort"
        timeout 15 umount -l "$m" 2>/dev/null
      fi
    fi
  done
}

cleanup() {
  local pid name i
  trap - EXIT INT TERM
  [ -n "$WATCHDOG_PID" ] && kill "$WATCHDOG_PID" 2>/dev/null
  if [ -n "$PY_PID" ] && kill -0 "$PY_PID" 2>/dev/null; then
    kill -TERM "$PY_PID" 2>/dev/null
    for i in $(seq 1 40); do kill -0 "$PY_PID" 2>/dev/null || break; sleep 0.5; done
    kill -KILL "$PY_PID" 2>/dev/null
  fi
  unmount_all
  # Daemons the helper started (pid and program name, one a line): only these, by pid.
  if [ -f "$WORK/pids" ]; then
    while read -r pid name; do
      [ -n "$pid" ] || continue
      if [ "$(cat /proc/"$pid"/comm 2>/dev/null)" = "${name:0:15}" ]; then
        kill -TERM "$pid" 2>/dev/null
        for i in $(seq 1 20); do kill -0 "$pid" 2>/dev/null || break; sleep 0.25; done
        kill -KILL "$pid" 2>/dev/null
      fi
    done <"$WORK/pids"
  fi
  unmount_all
  if grep -q " $WORK/" /proc/self/mountinfo; then
    echo "bench-fs: something is still mounted under $WORK; left it in place" >&2
  else
    rm -rf --one-file-system "$WORK"
  fi
}
trap cleanup EXIT
trap 'echo "bench-fs: interrupted; cleaning up" >&2; exit 130' INT
trap 'echo "bench-fs: terminated; cleaning up" >&2; exit 143' TERM

# --- run ------------------------------------------------------------------------------------
say "scratch dir $WORK; measuring (a few minutes)"
python3 "$ROOT/scripts/bench_fs.py" run --work "$WORK" --ghostfs "$GHOSTFS" "$@" &
PY_PID=$!
# A hard bound on the whole measurement (the helper also bounds each read and each phase).
sleep "$BENCH_TIMEOUT" &
WATCHDOG_PID=$!
DONE=
wait -n -p DONE "$PY_PID" "$WATCHDOG_PID"
status=$?
if [ "$DONE" != "$PY_PID" ]; then
  WATCHDOG_PID=
  echo "bench-fs: the measurement did not finish within ${BENCH_TIMEOUT} s; stopping it" >&2
  exit 124  # cleanup (the EXIT trap) stops the helper, its mounts and its daemons
fi
PY_PID=
kill "$WATCHDOG_PID" 2>/dev/null
WATCHDOG_PID=
if [ $status -gt 128 ]; then
  echo "bench-fs: the helper was killed by signal $((status - 128))" >&2
fi
exit $status
