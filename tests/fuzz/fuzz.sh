#!/usr/bin/env bash
# Fuzzes one parser with libFuzzer, ASan and UBSan for a bounded time: builds
# tests/fuzz/TARGET_fuzz.cc with clang++ from the few sources it needs (not through the g++
# meson build; the list is in TARGETS below), seeds it with tests/fuzz/TARGET_corpus/, and runs
# it. A crash, a hang, a leak, a sanitizer report or a failed check in the target fails the
# test; the crashing input is kept in WORK_DIR and named in the output.
# TAP; skipped (1..0 # SKIP) when clang++ or its libFuzzer runtime is missing.
#
# Usage: fuzz.sh SOURCE_ROOT WORK_DIR TARGET [SECONDS]
#   SECONDS defaults to $GHOST_FUZZ_SECONDS or 15. CLANGXX picks the compiler (clang++).
#   scripts/fuzz.sh runs a target (or all) for longer by hand.
set -u
root=$1
work=$2
target=$3
secs=${4:-${GHOST_FUZZ_SECONDS:-15}}
cxx=${CLANGXX:-clang++}

# TARGET -> "sources (besides tests/fuzz/TARGET_fuzz.cc) | pkg-config packages"; a source
# ending in "?" is compiled only where it exists (a file that a layer gains or loses).
declare -A TARGETS=(
  [http1]="proxy/http1.cc common/http/http_message.cc common/base/status.cc |"
  [http_head]="common/http/http_message.cc common/http/http_freshness.cc common/base/status.cc |"
  [autoindex]="common/http/autoindex.cc common/http/http_message.cc common/base/status.cc |"
  [control]="common/control/control.cc common/control/protocol.cc? common/base/status.cc common/base/accept_pause.cc?
             common/base/mounts.cc? common/base/clock.cc | libevent_pthreads libevent_core nlohmann_json openssl"
  [imap]="common/imap/imap_client.cc common/imap/maildir_names.cc common/base/status.cc
          common/base/clock.cc | libevent_pthreads libevent_core libevent_extra libevent_openssl openssl nlohmann_json"
  [config]="common/config/config.cc common/config/toml_file.cc common/imap/imap_client.cc common/imap/maildir_names.cc
            common/base/status.cc common/base/clock.cc common/base/log.cc common/power/machine.cc
            common/power/profile.cc common/power/device.cc common/power/energy_meter.cc
            common/power/power_manager.cc common/power/spin_down_timers.cc
            common/power/default_pm.cc common/power/stpm_disk.cc common/power/stpm_network.cc
            common/power/adaptive_spindown.cc common/power/cost_model.cc |
            tomlplusplus libevent_pthreads libevent_core libevent_extra libevent_openssl openssl nlohmann_json"
  [profile]="common/power/profile.cc common/base/status.cc | tomlplusplus"
  [trace]="common/sim/trace.cc common/base/status.cc | nlohmann_json"
  [imap_proxy]="proxy/imap_wire.cc proxy/imap_section.cc | openssl"
  [smtp_proxy]="proxy/smtp_wire.cc | openssl"
)

if [ -z "${TARGETS[$target]+x}" ]; then
  echo "1..1"
  echo "not ok 1 - unknown fuzz target '$target' (known: ${!TARGETS[*]})"
  exit 0
fi
if ! command -v "$cxx" >/dev/null 2>&1; then
  echo "1..0 # SKIP $cxx is not installed (apt-get install clang)"
  exit 0
fi
mkdir -p "$work/corpus" || exit 1
# Crashes from an earlier run are kept for inspection, not replayed as passes.
rm -f "$work"/crash-* "$work"/leak-* "$work"/timeout-* "$work"/oom-*

spec=${TARGETS[$target]}
sources=("$root/tests/fuzz/${target}_fuzz.cc")
set -f  # no globbing of the "?"
for s in ${spec%%|*}; do
  case $s in
    *\?) [ -f "$root/${s%\?}" ] && sources+=("$root/${s%\?}") ;;
    *) sources+=("$root/$s") ;;
  esac
done
set +f
packages=(${spec#*|})
# Every source is compiled with the compile flags of all the targets' packages (only toml++'s
# say anything: its shared library, not header-only, as in the meson build), so that a source
# several targets list compiles to the same object for each; each target links its own.
all_packages=()
for t in "${!TARGETS[@]}"; do
  all_packages+=(${TARGETS[$t]#*|})
done
pkgcflags=()
pkglibs=()
if [ ${#all_packages[@]} -gt 0 ]; then
  if ! pkgcflags=($(pkg-config --cflags "${all_packages[@]}" 2>"$work/build.log")) ||
     { [ ${#packages[@]} -gt 0 ] && ! pkglibs=($(pkg-config --libs "${packages[@]}" 2>>"$work/build.log")); }; then
    echo "1..1"
    echo "not ok 1 - ${target}_fuzz: pkg-config ${packages[*]}"
    sed 's/^/# /' "$work/build.log"
    exit 0
  fi
fi
exe="$work/${target}_fuzz"
# Objects are shared by the targets (beside WORK_DIR, in fuzz-objects/): a source compiled with
# the same compiler and flags for one target (common/base/status.cc for eight of them) is not
# compiled again for the next; each object is named by a hash of its source path, compiler and
# flags, and is rebuilt when a file in its dependency list is newer.
objdir="$(dirname "$work")/fuzz-objects"
mkdir -p "$objdir/include/common" || exit 1
# The header meson generates (common/build_info.h), made here from its template: the version
# and the profile directory of the source tree (a temporary name per process, then renamed:
# two targets building at once write the same content).
sed -e 's/@version@/fuzz/' -e "s|@source_profile_dir@|$root/common/profiles|" \
    -e "s|@installed_profile_dir@|$root/common/profiles|" -e 's|@profile_dir_from_bindir@||' \
    -e "s|@build_root@|$(dirname "$work")|" "$root/common/base/build_info.h.in" > "$objdir/include/common/build_info.h.$$"
if cmp -s "$objdir/include/common/build_info.h.$$" "$objdir/include/common/build_info.h"; then
  rm -f "$objdir/include/common/build_info.h.$$"
else
  mv "$objdir/include/common/build_info.h.$$" "$objdir/include/common/build_info.h"
fi
# -gline-tables-only: all a crash report needs (file:line, inlined frames), 11% less CPU than -g.
flags=(-std=c++20 -gline-tables-only -O1 -fno-omit-frame-pointer -fsanitize=fuzzer,address,undefined
       -fno-sanitize-recover=undefined -I "$root" -I "$objdir/include"
       -DGHOST_PROFILE_DIR="\"$root/common/profiles\"")
# Compiles run side by side, up to $GHOST_FUZZ_JOBS (the number of CPUs by default).
jobs=${GHOST_FUZZ_JOBS:-$(nproc 2>/dev/null || echo 1)}
compiler_id=$("$cxx" --version 2>/dev/null | head -n 1)

# deps_newer FILE DEPFILE: true when a file listed in DEPFILE (a make-style dependency list)
# is newer than FILE, or DEPFILE is missing.
deps_newer() {
  [ -f "$2" ] || return 0
  local s
  for s in $(sed -e 's/^[^:]*://' -e 's/\\$//' "$2"); do
    [ "$s" -nt "$1" ] && return 0
  done
  return 1
}

# Rebuild when this script, a source or a header it includes (from the last build's
# dependency file) is newer than the binary.
rebuild=1
if [ -x "$exe" ] && [ -f "$exe.deps" ]; then
  rebuild=0
  { [ "$0" -nt "$exe" ] || deps_newer "$exe" "$exe.deps"; } && rebuild=1
fi
if [ $rebuild -eq 1 ]; then
  rm -f "$exe.deps" "$exe.deps.tmp"
  objs=()
  pids=()
  logs=()
  ok=1
  : >"$work/build.log"
  for s in "${sources[@]}"; do
    key=$(printf '%s\0' "$compiler_id" "$s" "${flags[@]}" "${pkgcflags[@]}" | sha1sum | cut -c1-12)
    o="$objdir/$(basename "${s%.cc}")-$key.o"
    objs+=("$o")
    if [ -f "$o" ] && [ -f "$o.d" ] && ! [ "$0" -nt "$o" ] && ! deps_newer "$o" "$o.d"; then
      continue  # built already, for this target or another one
    fi
    while [ "$(jobs -pr | wc -l)" -ge "$jobs" ]; do wait -n; done
    log="$work/build-$(basename "${s%.cc}").log"
    logs+=("$log")
    # Into temporary names, renamed once complete: a target building at the same time sees a
    # whole object or none.
    ( "$cxx" "${flags[@]}" "${pkgcflags[@]}" -c "$s" -MD -MF "$o.d.$$" -o "$o.$$" >"$log" 2>&1 &&
        mv "$o.d.$$" "$o.d" && mv "$o.$$" "$o" ) &
    pids+=($!)
  done
  for p in "${pids[@]}"; do
    wait "$p" || ok=0
  done
  for log in "${logs[@]}"; do
    cat "$log" >>"$work/build.log"
    rm -f "$log"
  done
  if [ $ok -eq 1 ]; then
    for o in "${objs[@]}"; do
      cat "$o.d" >>"$exe.deps.tmp" || ok=0
    done
  fi
  if [ $ok -eq 1 ] && ! "$cxx" "${flags[@]}" "${objs[@]}" "${pkglibs[@]}" -o "$exe.tmp" \
                         >>"$work/build.log" 2>&1; then
    ok=0
  fi
  if [ $ok -eq 0 ]; then
    rm -f "$exe.deps.tmp" "$objdir"/*."$$" "$objdir"/*.d."$$"
    if grep -q -e "libclang_rt.fuzzer" -e "cannot find -l.*fuzzer" "$work/build.log"; then
      echo "1..0 # SKIP $cxx has no libFuzzer runtime (apt-get install clang)"
      exit 0
    fi
    echo "1..1"
    echo "not ok 1 - ${target}_fuzz builds with $cxx"
    sed 's/^/# /' "$work/build.log" | tail -n 40
    exit 0
  fi
  mv "$exe.deps.tmp" "$exe.deps"
  mv "$exe.tmp" "$exe"
fi

echo "1..1"
# Run from WORK_DIR so crash-* files land there; new corpus entries go to WORK_DIR/corpus, the
# checked-in seeds stay read-only.
seeds=()
[ -d "$root/tests/fuzz/${target}_corpus" ] && seeds=("$root/tests/fuzz/${target}_corpus")
(cd "$work" && ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 \
  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  "$exe" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -max_len=8192 \
    -print_final_stats=1 corpus "${seeds[@]}") >"$work/fuzz.log" 2>&1
rc=$?
stats=$(grep -E '^stat::(number_of_executed_units|average_exec_per_sec|peak_rss_mb|new_units_added)' \
          "$work/fuzz.log" | sed 's/^stat:://' | tr -s ' \n' ' ')
done_line=$(grep -E '^Done [0-9]+ runs' "$work/fuzz.log" | tail -n 1)
crash=$(ls "$work"/crash-* "$work"/leak-* "$work"/timeout-* "$work"/oom-* 2>/dev/null | head -n 1)
if [ $rc -eq 0 ] && [ -z "$crash" ] && [ -n "$done_line" ]; then
  echo "ok 1 - $target parser survives ${secs}s of libFuzzer (ASan+UBSan): $done_line; $stats"
else
  echo "not ok 1 - $target parser under libFuzzer (exit $rc)${crash:+; input kept in $crash}"
  grep -E -A 30 'ERROR|runtime error|_fuzz:|deadly signal|terminate called' "$work/fuzz.log" |
    head -n 60 | sed 's/^/# /'
fi
exit 0
