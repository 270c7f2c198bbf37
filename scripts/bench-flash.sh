#!/usr/bin/env bash
# bench-flash.sh: the flash questions in ghostsim, with the papers' figures beside ours.
#   NVCache Fig. 5: flush time by policy (each-spinup, when-full) and algorithm (1..4), and
#   the DRAM-buffer and log-size sweeps (Figs. 6-8); storage alternatives Table 4 (energy and
#   read/write response per device) and §5.2 (flash card at 40% -> 95% utilisation).
# Traces (seeded, common/sim/trace_gen.h):
#   NVCache Figs. 5-8: ghosttrace nvcache --seed 1 (2 h on a 40 MB disk: read bursts that spin
#   the disk up, the update daemon's small writes every 30 s, 80% of them to a hot set of 64
#   pages; GenerateNvcacheTrace says where each trait comes from), plus a sweep of the hot
#   share (0.5 .. 0.95) to show what the paper's figures need. The earlier desktop trace
#   (ghosttrace block --seed 1 --disk-mib 40 --hot-space 0.02: write bursts of 4-128 KB, few
#   overwrites) is printed for reference; it is not the paper's shape and is not judged.
#   Storage alternatives Table 4: the desktop trace (Douglis et al.'s SYNTH-like).
#   Storage alternatives §5.2: the HP-UX workstation shape (ghosttrace nvcache --seed 1
#   --disk-mib 4: Ruemmler & Wilkes's hplajw; the paper's traces include an HP-UX desktop) over
#   a 4 MiB data set, the whole of the 40% point's live data on the 10 MB card (so the same data
#   is on the card at 40% and at 95%, cold filler making up the rest), measured in the card's
#   steady state (ghostsim --steady-state; DESIGN §3.7 *The §5.2 workload*).
# Usage: scripts/bench-flash.sh [BUILD_DIR] [--live DIR]
# The last section prints each goal of issue 15 with the paper's figure and PASS/FAIL (PASS: within
# +-20% of the paper's figure, or the paper's ordering for Table 4).
# --live DIR also flushes one real log content (2000 random overwrites of a 2 MiB file, 4 MiB
# DRAM buffer) with alg 1 and alg 4 on the file system of DIR (tests/bench/flash_flush_bench.cc)
# and prints the measured alg4/alg1 time ratio beside ghostsim's prediction.
set -euo pipefail
build=${1:-build}
live=""
if [ "${2:-}" = "--live" ]; then live=${3:?--live needs a directory}; fi
sim=$build/fs/ghostsim
gen=$build/fs/ghosttrace
trace=$(mktemp /tmp/bench-flash.XXXXXX.trace)
nvtrace=$(mktemp /tmp/bench-flash-nv.XXXXXX.trace)
cardtrace=$(mktemp /tmp/bench-flash-card.XXXXXX.trace)
trap 'rm -f "$trace" "$nvtrace" "$nvtrace".* "$cardtrace"' EXIT
"$gen" block --seed 1 --disk-mib 40 --hot-space 0.02 -o "$trace"
"$gen" nvcache --seed 1 -o "$nvtrace"
"$gen" nvcache --seed 1 --disk-mib 4 -o "$cardtrace"
field() { python3 -c "import json,sys; print(json.load(sys.stdin)['$1'])"; }

# fig5 TRACE LABEL: Fig. 5 on TRACE for both buffers; sets f5_policy, f5_sort (best buffer).
fig5() {
  local tr=$1 label=$2
  f5_policy=0 f5_sort=0
  for buf in 256K 2M; do
    echo "== NVCache Fig. 5 ($label): total flush time (s), 2 MiB log on intel-flash, cu140 disk, $buf DRAM buffer"
    declare -A ft
    for p in each-spinup when-full; do
      for a in 1 2 3 4; do
        ft[$p$a]=$("$sim" --flash-log 2M --dram-buffer "$buf" --flush-policy "$p" --flush-alg "$a" "$tr" | field flush_time_s)
        printf '  %-12s alg %s  %8.3f s\n' "$p" "$a" "${ft[$p$a]}"
      done
    done
    python3 - "${ft[each-spinup4]}" "${ft[when-full4]}" "${ft[when-full1]}" "${ft[when-full2]}" "${ft[when-full3]}" <<'PY'
import sys
es4, wf4, wf1, wf2, wf3 = map(float, sys.argv[1:])
print(f"  when-full vs each-spinup (alg 4): {1 - wf4/es4:6.1%} less   (paper: > 75% less)")
print(f"  alg 4 vs alg 1 (when-full):       {1 - wf4/wf1:6.1%} less   (paper: up to 90% less)")
print(f"  alg 4 vs alg 2 (when-full):       {1 - wf4/wf2:6.1%} less   (paper: up to 90% less)")
print(f"  alg 4 vs alg 3 (when-full):       {1 - wf4/wf3:6.1%} less   (sorting and merging alone)")
PY
    f5_policy=$(python3 -c "print(max($f5_policy, 1 - ${ft[when-full4]}/${ft[each-spinup4]}))")
  done
}

# fig5_grid TRACE: alg 4 against each algorithm without sorting and merging (1, 2, 3), when-full,
# over the DRAM-buffer x log-size configurations of Figs. 6-8 (buffer <= log); sets f5_sort to
# the largest reduction: the paper's "up to 90%" is the most sorting and merging saved over its
# algorithms and configurations, so ours is taken the same way.
fig5_grid() {
  local tr=$1
  f5_sort=0
  echo "== NVCache sort+merge over the Figs. 6-8 configurations (when-full; alg 4 vs 1 / 2 / 3, % less flush time)"
  for l in 512K 1M 2M 4M 8M; do
    for buf in 256K 512K 1M 2M; do
      [ "$(numfmt --from=iec "$buf")" -le "$(numfmt --from=iec "$l")" ] || continue
      declare -A g
      for a in 1 2 3 4; do
        g[$a]=$("$sim" --flash-log "$l" --dram-buffer "$buf" --flush-policy when-full --flush-alg "$a" "$tr" | field flush_time_s)
      done
      line=$(python3 - "$l" "$buf" "${g[1]}" "${g[2]}" "${g[3]}" "${g[4]}" <<'PY'
import sys
l, buf = sys.argv[1:3]
t1, t2, t3, t4 = map(float, sys.argv[3:])
r = [1 - t4 / t for t in (t1, t2, t3)]
print(f"  log {l:>3s} buffer {buf:>4s}: alg 1..4 {t1:7.2f} {t2:7.2f} {t3:7.2f} {t4:7.2f} s   "
      + " / ".join(f"{x:4.0%}" for x in r) + f" less|{max(r)}")
PY
)
      echo "${line%|*}"
      f5_sort=$(python3 -c "print(max($f5_sort, ${line##*|}))")
    done
  done
}

fig5 "$trace" "desktop block trace, for reference, not judged"
fig5 "$nvtrace" "NVCache-shaped trace, judged"
fig5_policy=$f5_policy
fig5_grid "$nvtrace"
fig5_sort=$f5_sort

echo "== NVCache Fig. 5 by the hot share of writes (nvcache trace, 2M buffer; when-full vs each-spinup at alg 4, alg 4 vs alg 1 when-full)"
echo "   (what the paper's > 75% and up to 90% need: the share of writes that overwrite a small hot set)"
for hf in 0.5 0.8 0.9 0.95; do
  "$gen" nvcache --seed 1 --hot-writes "$hf" -o "$nvtrace.$hf"
  es4=$("$sim" --flash-log 2M --dram-buffer 2M --flush-policy each-spinup --flush-alg 4 "$nvtrace.$hf" | field flush_time_s)
  wf4=$("$sim" --flash-log 2M --dram-buffer 2M --flush-policy when-full --flush-alg 4 "$nvtrace.$hf" | field flush_time_s)
  wf1=$("$sim" --flash-log 2M --dram-buffer 2M --flush-policy when-full --flush-alg 1 "$nvtrace.$hf" | field flush_time_s)
  python3 -c "print(f'  hot share {$hf:4.2f}: when-full vs each-spinup {1 - $wf4/$es4:6.1%} less, alg 4 vs alg 1 {1 - $wf4/$wf1:6.1%} less')"
done

echo "== NVCache Figs. 6-8: DRAM buffer and log size sweeps (NVCache-shaped trace, when-full, alg 4): flush time (s)"
for b in 32K 64K 128K 256K 512K 1M; do
  printf '  buffer %-5s %8.3f s\n' "$b" "$("$sim" --flash-log 2M --dram-buffer "$b" "$nvtrace" | field flush_time_s)"
done
for l in 512K 1M 2M 4M 8M; do
  printf '  log    %-5s %8.3f s\n' "$l" "$("$sim" --flash-log "$l" "$nvtrace" | field flush_time_s)"
done

echo "== Storage alternatives Table 4: the whole trace on one device"
echo "  (paper: the flash devices use several times less energy than the disk, with much slower writes)"
declare -A t4
for d in cu140 sdp10 intel-flash; do
  t4[$d]=$("$sim" --storage "$d" --utilisation 0.4 "$trace")
  printf '  %-12s energy %8.1f J   read %8.1f ms   write %8.1f ms\n' "$d" \
    "$(echo "${t4[$d]}" | field energy_j)" "$(echo "${t4[$d]}" | field mean_read_ms)" \
    "$(echo "${t4[$d]}" | field mean_write_ms)"
done

echo "== Storage alternatives §5.2: intel-flash card at 40% and 95% utilisation"
echo "  (paper: +70-190% energy, about 30% slower writes, up to a third of the lifetime lost)"
echo "  (book version, 1996: +50-165% energy, +24% writes, up to 70% of the lifetime lost)"
echo "  (hplajw-shaped trace over 4 MiB, 2 h; the card in its steady state: --steady-state, DESIGN §3.7)"
declare -A u
for c in async on-demand; do
  for p in 0.4 0.95; do
    u[$c$p]=$("$sim" --storage intel-flash --utilisation "$p" --cleaning "$c" --steady-state "$cardtrace")
  done
  echo "  $c cleaning:"
  python3 - "${u[${c}0.4]}" "${u[${c}0.95]}" <<'PY'
import json, sys
a, b = json.loads(sys.argv[1]), json.loads(sys.argv[2])
def more(k): return (b[k] / a[k] - 1) if a[k] else float('nan')
print(f"    energy        {a['energy_j']:8.1f} J -> {b['energy_j']:8.1f} J  ({more('energy_j'):+.0%})")
print(f"    write resp.   {a['mean_write_ms']:8.1f} ms -> {b['mean_write_ms']:8.1f} ms ({more('mean_write_ms'):+.0%})")
lost = 1 - a['erasures'] / b['erasures'] if b.get('erasures') else float('nan')
print(f"    erasures      {a.get('erasures',0):8d} -> {b.get('erasures',0):8d}   (lifetime lost: {lost:.0%})")
print(f"    copied        {a.get('copied_bytes',0)/1e6:8.2f} MB -> {b.get('copied_bytes',0)/1e6:8.2f} MB (live data moved by the cleaner)")
print(f"    utilisation   {a['utilisation']:8.3f}    -> {b['utilisation']:8.3f}    (held: the trace lies inside the live data)")
if a.get('written_bytes') and b.get('written_bytes'):
    pa, pb = (x['erasures'] / (x['written_bytes'] / 1e6) for x in (a, b))
    print(f"    erasures/MB   {pa:8.2f}    -> {pb:8.2f}    (per MB the trace wrote: {b['written_bytes']/1e6:.2f} MB)")
if a.get('idle_block_copies') or b.get('idle_block_copies'):
    print(f"    idle cleaner  {a['idle_block_copies']} -> {b['idle_block_copies']} block copies in idle time; requests behind a copy "
          f"{a['preempted_waits']} -> {b['preempted_waits']}; writes finishing a cleaning {a['writes_finishing_a_cleaning']} -> {b['writes_finishing_a_cleaning']}")
if 'writes_behind_an_erasure' in b:
    print(f"    erase waits   {a['writes_behind_an_erasure']} -> {b['writes_behind_an_erasure']} host blocks waited for an erasure in flight "
          f"(not an on-demand cleaning's own) on their chip ({a['wait_behind_erasures_ms']/1e3:.1f} -> {b['wait_behind_erasures_ms']/1e3:.1f} s; the requests queued behind them wait too)")
if 'copies_behind_an_erasure' in b:
    print(f"    copy waits    {a['copies_behind_an_erasure']} -> {b['copies_behind_an_erasure']} copied blocks waited for an erasure in flight "
          f"({a['copy_wait_behind_erasures_ms']/1e3:.1f} -> {b['copy_wait_behind_erasures_ms']/1e3:.1f} s; a write's cleaning: inside its response); "
          f"erasures held back off the writer's chip {a['erasures_deferred']} -> {b['erasures_deferred']}")
if a.get('erasures') and b.get('erasures'):
    # The victim's live share v (copied per erasure / the card's 64 KB segment): erasures per byte
    # written go as 1/(1-v), so lifetime lost = 1 - (1-v95)/(1-v40) (round 14, DESIGN §3.7).
    va, vb = (x['copied_bytes'] / x['erasures'] / 65536 for x in (a, b))
    print(f"    victim live   {va:8.1%}    -> {vb:8.1%}    (1-(1-v95)/(1-v40) = {1 - (1 - vb) / (1 - va):.0%}; a third lost needs v95 <= {1 - 2 / 3 * (1 - va):.0%})")
print(f"    warm-up       {a['warm_up_passes']:4d} rounds, {a['warm_up_written_bytes']/1e6:.1f} MB, steady {a['steady']} -> "
      f"{b['warm_up_passes']} rounds, {b['warm_up_written_bytes']/1e6:.1f} MB, steady {b['steady']}")
for x in (a, b):
    if not x['steady']:
        print("    WARNING: the warm-up did not settle; the figure is not a steady state")
if b.get('erasures'):
    print(f"    energy bound  +{a['erasures'] and b['erasures']/a['erasures']-1:.0%} (erasure growth: an erasure costs more than a segment's copy, DESIGN §3.7)")
PY
done

# Round 15: a host write buffer in front of the card (ghostsim --write-buffer), a sensitivity, not
# judged: the Series 2 card holds no write buffer (Intel 290434), and we hold no text saying what
# the paper's simulator put in front of it (DESIGN §3.7, round 15).
echo "== §5.2 with a host write buffer in front of the card (async; not judged: no source for one, DESIGN §3.7)"
for wb in 16K 64K 128K; do
  wa=$("$sim" --storage intel-flash --utilisation 0.4 --cleaning async --steady-state --write-buffer "$wb" "$cardtrace")
  wz=$("$sim" --storage intel-flash --utilisation 0.95 --cleaning async --steady-state --write-buffer "$wb" "$cardtrace")
  python3 - "$wb" "$wa" "$wz" <<'PY'
import json, sys
wb, a, b = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
more = f"{b['mean_write_ms'] / a['mean_write_ms'] - 1:+.0%}" if a['mean_write_ms'] >= 1 else "(n/a: under 1 ms)"
print(f"  buffer {wb:>4s}: write resp. {a['mean_write_ms']:7.2f} -> {b['mean_write_ms']:7.2f} ms {more:>18s}; "
      f"writes waiting for room {a['writes_waiting_for_buffer']} -> {b['writes_waiting_for_buffer']}; "
      f"energy {b['energy_j'] / a['energy_j'] - 1:+.0%}, erasures {a['erasures']} -> {b['erasures']}")
PY
done

# Round 16: the victim choice of the card's documented host software, a sensitivity, not judged:
# the PCMCIA FTL driver (Linux drivers/mtd/ftl.c reclaim_block) is greedy and, one reclamation
# in shuffle_freq = 50, takes the least-erased unit for wear levelling (profile
# clean_wear_shuffle; intel-flash keeps the paper's greedy cleaner, DESIGN §3.7 round 16).
# "most-worn" is the lifetime lost if the card dies with its most-erased segment (no levelling).
wearprof=$(mktemp /tmp/bench-flash-wear.XXXXXX.toml)
trap 'rm -f "$trace" "$nvtrace" "$nvtrace".* "$cardtrace" "$wearprof"' EXIT
sed '0,/^\[\[mode\]\]/s//clean_wear_shuffle = 50\n&/' "$(dirname "$0")/../common/profiles/intel-flash.toml" > "$wearprof"
echo "== §5.2 with the FTL driver's wear levelling (every 50th cleaning the least-worn segment; not judged, DESIGN §3.7)"
for c in async on-demand; do
  wa=$("$sim" --storage "$wearprof" --utilisation 0.4 --cleaning "$c" --steady-state "$cardtrace")
  wz=$("$sim" --storage "$wearprof" --utilisation 0.95 --cleaning "$c" --steady-state "$cardtrace")
  python3 - "$c" "$wa" "$wz" "${u[${c}0.4]}" "${u[${c}0.95]}" <<'PY'
import json, sys
c, a, b, ga, gb = sys.argv[1], *(json.loads(x) for x in sys.argv[2:])
def lost(x, y, k): return 1 - x[k] / y[k] if y.get(k) else float('nan')
print(f"  {c:9s} write resp. {a['mean_write_ms']:7.1f} -> {b['mean_write_ms']:7.1f} ms ({b['mean_write_ms'] / a['mean_write_ms'] - 1:+.0%}); "
      f"energy {b['energy_j'] / a['energy_j'] - 1:+.0%}; erasures {a['erasures']} -> {b['erasures']} "
      f"(lifetime lost {lost(a, b, 'erasures'):.0%}); wear cleanings {a['wear_cleanings']} -> {b['wear_cleanings']}")
print(f"  {'':9s} most-worn segment {a['max_segment_erasures']} -> {b['max_segment_erasures']} erasures "
      f"(lost {lost(a, b, 'max_segment_erasures'):.0%}); greedy: {ga['max_segment_erasures']} -> {gb['max_segment_erasures']} "
      f"(lost {lost(ga, gb, 'max_segment_erasures'):.0%})")
PY
done

# The goals (issue 15): each of our figures beside the paper's, PASS within +-20% of it.
echo "== Goals: ours vs the papers' (PASS within +-20% of the paper's figure)"
python3 - "$fig5_policy" "$fig5_sort" "${t4[cu140]}" "${t4[sdp10]}" "${t4[intel-flash]}" \
  "${u[async0.4]}" "${u[async0.95]}" "${u[on-demand0.4]}" "${u[on-demand0.95]}" <<'PY'
import json, sys
policy, sort = float(sys.argv[1]), float(sys.argv[2])
cu, sdp, card = (json.loads(x) for x in sys.argv[3:6])
fails = total = 0
book = []
def verdict(ok, what, ours, paper):
    global fails, total
    fails += not ok
    total += 1
    print(f"  {'PASS' if ok else 'FAIL'}  {what:50s} ours {ours:>22s}   paper {paper}")
verdict(policy >= 0.75 * 0.8, "Fig. 5 when-full vs each-spinup (nvcache trace, alg 4)", f"{policy:.0%} less", "> 75% less")
verdict(0.9 * 0.8 <= sort <= 1.0, "Fig. 5 sort+merge (nvcache trace) vs alg 1-3, Figs. 6-8 configs", f"up to {sort:.1%} less", "up to 90% less")
e_ok = cu['energy_j'] > 2 * sdp['energy_j'] and cu['energy_j'] > 2 * card['energy_j']
verdict(e_ok, "Table 4 energy: disk several x each flash device",
        f"{cu['energy_j']/max(sdp['energy_j'], card['energy_j']):.1f}x or more", "several times")
w_ok = sdp['mean_write_ms'] > cu['mean_write_ms'] and card['mean_write_ms'] > cu['mean_write_ms']
verdict(w_ok, "Table 4 writes: each flash device slower than disk",
        f"{sdp['mean_write_ms']:.0f},{card['mean_write_ms']:.0f} vs {cu['mean_write_ms']:.0f} ms", "much slower")
for name, i in (("async", 6), ("on-demand", 8)):
    a, b = json.loads(sys.argv[i]), json.loads(sys.argv[i + 1])
    de = b['energy_j'] / a['energy_j'] - 1
    verdict(0.70 * 0.8 <= de <= 1.90 * 1.2, f"§5.2 energy 40% -> 95% ({name} cleaning)", f"{de:+.0%}", "+70-190%")
    dw = b['mean_write_ms'] / a['mean_write_ms'] - 1
    verdict(0.30 * 0.8 <= dw <= 0.30 * 1.2, f"§5.2 write response 40% -> 95% ({name})", f"{dw:+.0%}", "about +30%")
    lost = 1 - a['erasures'] / b['erasures'] if b['erasures'] else float('nan')
    verdict(0 < lost <= 0.4, f"§5.2 lifetime lost, erasures 40%/95% ({name})", f"{lost:.0%}", "up to 1/3")
    book.append((name, de, dw, lost))
print(f"  {fails} of {total} FAIL")
# The book version of the paper (Douglis et al., Mobile Computing, Kluwer 1996, ch. 18) revised
# §5.2; the OSDI figures above cannot all hold at once under greedy cleaning (DESIGN §3.7).
print("== §5.2 against the book version (not goals; same +-20% band)")
bfails = 0
for name, de, dw, lost in book:
    for ok, what, ours, paper in (
            (0.50 * 0.8 <= de <= 1.65 * 1.2, f"energy ({name})", f"{de:+.0%}", "+50-165%"),
            (0.24 * 0.8 <= dw <= 0.24 * 1.2, f"write response ({name})", f"{dw:+.0%}", "+24%"),
            (0 < lost <= 0.70 * 1.2, f"lifetime lost ({name})", f"{lost:.0%}", "up to 70%")):
        bfails += not ok
        print(f"  {'PASS' if ok else 'FAIL'}  book §5.2 {what:38s} ours {ours:>8s}   book {paper}")
print(f"  {bfails} of {len(book) * 3} FAIL against the book")
PY

if [ -n "$live" ]; then
  # Three runs, the median ratio: on a shared machine one run can be off by 5x (seen: 0.09-1.03).
  echo "== Live flush (goal: alg 4 <= 0.25 x alg 1) on $(df -P "$live" | awk 'NR==2{print $1}'), 3 runs"
  ninja -C "$build" tests/flash_flush_bench >/dev/null || exit 1  # not built by default
  runs=()
  for i in 1 2 3; do
    runs+=("$("$build/tests/flash_flush_bench" "$live" --records 2000 --file-mib 2 --buffer-kib 4096)")
  done
  python3 - "${runs[@]}" <<'PY'
import json, statistics, sys
rs = [json.loads(a) for a in sys.argv[1:]]
for j in rs:
    print(f"  alg 1 {j['alg1']['seconds']:.3f} s ({j['alg1']['writes']} writes), "
          f"alg 4 {j['alg4']['seconds']:.3f} s ({j['alg4']['writes']} writes), via {j['io']}: "
          f"{j['measured_ratio_alg4_over_alg1']:.3f}")
m = statistics.median(j['measured_ratio_alg4_over_alg1'] for j in rs)
p = rs[0].get('predicted_ratio_alg4_over_alg1', float('nan'))
print(f"  measured alg4/alg1 median = {m:.3f}   ghostsim predicts {p:.3f} "
      f"({rs[0].get('predicted_profile', '?')} profile)")
print(f"  {'PASS' if m <= 0.25 else 'FAIL'}  live flush alg 4 / alg 1 = {m:.3f}   goal <= 0.25")
PY
fi
