// DownloadShaper: the estimator and state machine of client-centred TCP download shaping
// (DESIGN §3.6; after Yan, Fan, Papadopoulos, "Client-centred energy and delay analysis for
// TCP downloads", the shaping paper of DESIGN §1 item 2).
//
// The receiver of a large download reads its socket in bursts. While the window is closed it
// does not read, so the kernel's receive buffer fills and it advertises a zero window; when it
// judges that a window's worth has arrived (the burst has ended) it drains the socket, a full
// window opens, and one round trip later the server sends the next window as one burst. The
// network card sleeps from the burst end until just before the next burst is due. This class
// decides, from the arrival times the adapter reports, when a burst has ended, when the card
// may sleep and when it must be awake; it never touches a socket, a timer or a byte of data.
// The adapter (proxy/shaper.cc, the benchmark's post-mortem model) does the I/O.
//
// Burst end (DESIGN §3.6, the paper's eq. for the closed-ack timer). With SA the interarrival
// time of the latest packet and SD = |SA − IA|:
//   IA = 7/8·IA + 1/8·SA        ID = 3/4·ID + 1/4·SD
//   Td(P) = (W − P)·IA + 4·ID,  clamped to [td_min (3 ms), one-way delay = min RTT / 2]
//   (the floor may be td_full once P ≥ W − 1: the window is complete; off by default)
//   Td = td_grant (flat) once the burst has delivered a whole grant in bytes (round 11)
// P is the packets of the current burst so far, W one more than the packets of the last good
// window. The burst has ended when no packet came for Td(P) after the last one. The next
// burst is expected one minimum RTT after the open; the card wakes `wake_lead` before it.
//
// States (the paper's, plus the knob's veto):
//
//        ┌────────── no longer saturated (3 samples) ────────────┐
//        v                                                       │
//   kSlowStart ──flight ≥ ¾ window──> kSaving ──saturated ×3───> kPlain
//        │  (auto: the eq. 4 cost      │   ^                     ^  ^
//        │   says no ─> kPlain)   loss or  │ clean burst         │  │
//        │                         bad v   │                     │  │
//        │                           kRecovery ──3 bad bursts ───┘  │
//        └──────────────────── saturated ×3 ────────────────────────┘
//
//   state       reads        card between bursts   leaves on
//   kSlowStart  freely       awake                 a flight of ≥ ¾ window (→ kSaving, or
//                                                  kPlain when shaping does not pay);
//                                                  saturated for 3 flights (→ kPlain)
//   kSaving     in bursts    asleep (end → wake)   loss or a bad burst (→ kRecovery); saturated for
//                                                  3 bursts (→ kPlain)
//   kRecovery   in bursts    awake                 a clean burst (→ kSaving); the 3rd bad burst
//                                                  in a row, or saturated ×3 (→ kPlain)
//   kPlain      freely       awake                 3 flights not saturated: ended by a gap, or
//                                                  window < 90% BDP (→ kSlowStart), unless the
//                                                  knob vetoed shaping (then inert: no timers)
//
// Past the paper (each measured on the synthetic link of tests/common/power/shaper_test.cc):
// W rises at once and falls slowly; while P < W − 1, Td is at least twice the longest recent
// gap inside a burst (jitter bunches packets); data that comes long before an open can be
// answered (a retransmission, a tail) is a straggler of the last window, not a new burst;
// a burst clearly short of the grant its open gave (the bytes since the open, against what a
// whole grant delivers) with no loss is a part-window and is held, the card awake, until the
// rest comes or half a min RTT passes (round 10: opening on a part lets the sender send only what
// is not in flight, the two-half-window regime; ShaperOptions::hold_part_windows).
//
// A burst with missing data (the adapter saw out-of-order or retransmitted segments) sends the
// shaper to kRecovery: the card stays awake for the retransmission, the next clean burst
// returns to kSaving (with the opt-in ACK clock of round 12 it stays in kSaving and the card
// wakes one min RTT after the lossy burst's first packet, when the retransmission and the
// data its ACKs released come: ShaperOptions::ack_clock_after_loss). A burst is *bad* when the
// shaper was wrong: a packet arrived while the
// card slept (a missed packet: the end was predicted too early), or no data came by open +
// 2·min RTT + 200 ms (a lost open: the window update was lost and the server waits for its
// persist timer). Loss is the network's doing and is not counted as bad: at 1% loss most
// bursts of 80 packets lose one, and the paper still shaped there. Saturated: the
// window is at least 90% of the bandwidth-delay product (rate of the burst × min RTT), so
// there is no idle time between bursts to sleep in.
//
// The knob decides (DESIGN §3.4 eq. 4): in kAuto, shaping continues past slow start only if
// EstimateShaping() says its `K·time + (100 − K)·energy` is below plain TCP's and its
// slowdown is within max_slowdown; K = 100 never shapes.
//
// Thread-safety: none; one shaper belongs to one download on one thread.
#ifndef GHOST_COMMON_POWER_SHAPER_H_
#define GHOST_COMMON_POWER_SHAPER_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <utility>

#include "common/base/units.h"

namespace ghost {

// The WNIC of the shaping paper (WaveLAN; DESIGN §3.6): idle 1319, receive 1425, transmit
// 1675, sleep 177 mW; waking costs 2 ms of idle.
struct WnicPowers {
  Power idle = Power::Milliwatts(1319);
  Power receive = Power::Milliwatts(1425);
  Power transmit = Power::Milliwatts(1675);
  Power sleep = Power::Milliwatts(177);
  Duration wake = Millis(2);
};

enum class ShapeMode { kOff, kAuto, kAlways };
const char* ShapeModeName(ShapeMode mode);
// Parses "off", "auto", "always". Returns nullopt for anything else.
std::optional<ShapeMode> ParseShapeMode(const char* text);

// The maximum slowdown the knob tolerates when none is configured: 3× at K = 0, 2× at K = 50,
// 1× (never slower, so never shaped) at K = 100.
double DefaultMaxSlowdown(int knob);

// What one download costs plain and shaped, from a simple cycle model: shaped, each window W
// takes one min RTT from the open to its first byte, W / rate to arrive and Td to be judged
// ended; the card sleeps through the RTT less the wake-up. Plain, the data arrives at `rate`
// after one RTT with the card awake throughout.
struct ShapingEstimate {
  Duration plain_time{};
  Duration shaped_time{};
  Energy plain_energy;   // card + base power over plain_time
  Energy shaped_energy;  // card + base power over shaped_time
  double slowdown = 1;   // shaped_time / plain_time
};
struct ShapingLink {
  double rate_bytes_per_s = 0;  // bottleneck rate seen by the receiver; > 0
  Duration min_rtt{};           // > 0
  Bytes window = 0;             // the shaped receive window in bytes; > 0
  Duration td = Millis(3);      // burst-end detection delay
  Bytes plain_window = 0;       // the window plain TCP would have; 0 = never limits it
};
ShapingEstimate EstimateShaping(const WnicPowers& wnic, Power base, Bytes size,
                                const ShapingLink& link);
// Eq. 4 of the ghost-hints paper: shaping pays when K·t + (100 − K)·E is lower shaped than
// plain and the slowdown is at most max_slowdown. Always false at K = 100.
bool ShapingPays(const ShapingEstimate& estimate, int knob, double max_slowdown);

struct ShaperOptions {
  ShapeMode mode = ShapeMode::kAuto;  // kOff: the adapter makes no shaper at all
  int knob = 50;                      // 0..100
  double max_slowdown = 0;            // 0: DefaultMaxSlowdown(knob)
  Bytes mss = 1448;                   // bytes per packet, to count packets from bytes
  Bytes window = 120 * 1024;          // what one open window holds (the fixed receive buffer)
  Bytes size = 0;                     // declared length of the download; 0 = unknown
  // The window the connection would have unshaped (0: autotuned, never the limit). Shaping
  // only saves energy against a plain download that idles between windows.
  Bytes plain_window = 0;
  Duration td_min = Millis(3);
  // The floor of Td once the burst holds a whole window (P ≥ W − 1, W from a clean burst): the
  // sender can send no more than the window the open offered, so only the paper's
  // (W − P)·IA + 4·ID need be waited. Off by default (= td_min): at 1 ms, measured interleaved
  // at load ~20 (round 8), E×D and missed packets rose (timing jitter under load).
  Duration td_full = Millis(3);
  // Round 11: Td once the burst in progress has delivered a whole grant (its bytes, and the
  // bytes since the open, within MSS/2 of what whole grants deliver, a grant confirmed by the
  // last clean burst; hold_part_windows on):
  // the sender can send nothing more until the next open moves the window's right edge, so
  // the burst-end wait (the 3 ms floor, for jitter inside a window that is still coming) only
  // keeps the card awake and delays the open. A flat wait, not the (W − P)·IA + 4·ID formula:
  // no packet of the grant is left to come. `td_grant` ≥ td_min turns it off (the proxy:
  // GHOST_SHAPER_TD_GRANT_MS=3). 0.5 ms: measured with the wake lead below against main's
  // defaults, interleaved, at 60 ms / 0% (RESULTS.md, round 11).
  Duration td_grant = Millis(0.5);
  // Wake this long before the next burst is due (on top of the card's own wake-up time): the
  // shaper's guard against a burst earlier than one min RTT after the open (a late-timed open,
  // a min RTT estimated high). Each millisecond costs P_idle·1 ms per cycle. Until round 10
  // 2 ms; the first data after an open came 0.0–0.2 ms after the open + min RTT in the
  // captures of round 11 (--diagnose, 60 ms / 0%), so 0.5 ms (GHOST_SHAPER_WAKE_LEAD_MS).
  Duration wake_lead = Millis(0.5);
  // When the next burst is due after an open. 0 (the paper's): one min RTT. Above 0: this
  // percentile (0..1) of the last 16 open→first-data delays seen on the connection, once 2
  // are, within [½, 2] min RTT (ExpectedDelay). The card must be awake before data can come,
  // and data comes one *observed* open→data delay after an open, not one kernel estimate.
  double wake_percentile = 0;
  // Round 9: the first burst after slow start ends no earlier than one min RTT after reading
  // stopped. Read freely, the flight is ACK-clocked, spread over the round trip; an open while
  // part of it is still in flight grants the sender only the window less that part (the grant
  // counts from the cumulative ACK), so two part-windows circulate from then on, each answered
  // by its own open, the second arriving mid-nap (the two-half-window regime, see DESIGN §3.6).
  // One round trip after the last read nothing of the flight can still be on its way. Off by
  // default (the proxy: GHOST_SHAPER_SETTLE=1): not measured better yet (RESULTS.md, round 9).
  bool settle_after_slow_start = false;
  // Round 10: no open on a part-window. An open grants the sender one window counted from the
  // cumulative ACK, so everything that arrives after it, up to a window, is that grant's; a
  // burst judged ended with clearly less of it arrived (over 2 MSS short of the grant learned
  // from whole bursts) and no loss is a part-window: the rest is in transit, or comes a round
  // trip after the part (a sender short of cwnd). Opening then lets the sender send only what
  // is not in flight, and two part-windows circulate from then on (the two-half-window regime,
  // DESIGN §3.6). Held, the burst goes on (the card awake) until the rest arrives or half a min
  // RTT (hold_rtts) has passed since its last packet; a hold that saw nothing more was a whole window, and
  // the grant is lowered to it at once. With a declared size the last grant's worth of the
  // download is not held (its last window is short by nature). Without one (a tunnel, an
  // unknown length) the last window waits up to half a min RTT unless the origin's FIN comes
  // with it (the adapter then reads to the end). `hold_part_windows = false` is the old behaviour (the
  // proxy: GHOST_SHAPER_HOLD=0).
  bool hold_part_windows = true;
  // Round 12: the ACK clock after a loss. A loss halves the sender's congestion window, which
  // then limits it below the grant for several round trips (Reno regrows one MSS per round
  // trip; at 1% loss and ~16 packets per window a loss comes about every 7 windows, so the
  // sender is cwnd-limited most of the time). A cwnd-limited sender is ACK-clocked: every ACK
  // the kernel sends while a burst comes (every second segment, and at once for the first
  // segments read while the burst is awaited) releases data that arrives one round trip later,
  // so the next data comes one min RTT after this burst's *first* packet, not after the open
  // (read off the capture at 60 ms / 1%: of 77 missed packets 40 came 60.2 ms after the ACK of a
  // burst's first packet, RESULTS.md, round 12). While the clock runs (`ack_clock_after_loss`),
  // a burst with loss stays in kSaving instead of kRecovery (its retransmission, sent on the
  // duplicate ACKs of the segments after the hole, comes with that clock too), the card wakes
  // for min(open, the burst's first packet) + one min RTT, and part-windows are not held (their
  // rest is the next clocked clump, a round trip later). The clock starts at a burst with loss
  // or a packet that came while the card slept, and stops after `ack_clock_clean` bursts in a
  // row whose first data came one min RTT after their open (less 1 ms): the sender is
  // window-limited again. Off by default (the proxy: GHOST_SHAPER_ACK_CLOCK=1): measured
  // interleaved with main (RESULTS.md, round 12) it cut the missed packets at 1% loss from a
  // median of 81 to 12 per 5 MB at 60 ms and from 73 to 0 at 30 ms, but not E×D: 0.74× against
  // main's 0.74× at 60 ms (6 rounds), 1.27× against 1.05× at 30 ms (3 rounds): the card
  // listens from the clocked piece to the open's data.
  bool ack_clock_after_loss = false;
  int ack_clock_clean = 3;
  // Round 13: the grant clamped to what the sender sends. A sender short of congestion window
  // (after a loss halves Reno's cwnd) sends only cwnd of a grant; the burst's own ACKs release
  // the rest one round trip after its first packet, mid-nap. With `clamp_to_sender` the shaper
  // estimates cwnd from the bursts it sees — the bytes a grant brought before its sender stopped
  // (a part: a burst over MSS/2 short of what the open granted, no loss in it) — and asks the
  // adapter for a grant of that much (grant_share()), so one open brings one whole burst
  // again. A part only proves a short cwnd when its rest follows one min RTT after its first
  // packet, before the open's data could come: the nap after a part ends then, and the clamp
  // falls when that rest begins (a part with no such rest was all the kernel granted — a
  // clamped buffer's window is not exactly the share asked for — and the next share asks for
  // more). A clamped grant delivered whole is raised one MSS (Reno's growth per round trip: a
  // grant of exactly cwnd keeps the sender cwnd-limited, so its cwnd still grows); the clamp
  // ends when it reaches the unclamped grant (measured from whole bursts before the clamp;
  // none measured, no clamp). Off by default (the proxy: GHOST_SHAPER_CLAMP=1; RESULTS.md,
  // round 13).
  bool clamp_to_sender = false;
  // Round 14: the clamp only where eq. 4 says it pays (with clamp_to_sender; the proxy:
  // GHOST_SHAPER_CLAMP=auto). A clamped cycle carries the sender's cwnd c in one open's round
  // trip plus the burst and Td; unclamped, the ACK clock carries the rest of the grant in the
  // same cycle (as missed packets, after which the card wakes and the shaper may hold or
  // recover awake). So the clamp costs time, (c/rate + Td)/min RTT per cycle, a larger share at
  // a short RTT, and saves only the awake time the unclamped cycles spend on the clock's misses.
  // The shaper measures both per cycle (time, card energy, bytes: EWMAs over the cycles of a
  // loss episode, unclamped and clamped) and when a part proves the sender short of cwnd it
  // clamps only if K·t + (100 − K)·E per byte is lower clamped: measured clamped cycles when
  // it has `pays_cycles` of them, else the cycle model (ClampedCycleModel). Clamped cycles
  // measured worse than the unclamped ones release the clamp.
  bool clamp_when_pays = false;
  // Round 14: slow start's tail. When reading stops the sender is still in slow start (or just
  // out of it) and ACK-clocked: each clump of the flight is followed by the next one round trip
  // after the clump's first packet, sooner than the open's data (read off the capture at 30 and
  // 60 ms / 0%: every missed packet of a loss-free download came so, within the first second).
  // Until a burst confirms a whole grant, the nap after a burst ends one min RTT after the first
  // packet of that burst's last clump (a held burst gathers several) if that is sooner than the
  // open's data (the card listens for the
  // clocked clump, which the shaper takes as the last window's straggler, and naps again until
  // the open's data). Off by default: on the emulated link it was not shown to catch the
  // packet it is for (RESULTS.md, round 14). The proxy: GHOST_SHAPER_TAIL_WAKE=1 turns it on.
  bool wake_for_slow_start_tail = false;
  // Round 15: the clocked clumps after a loss. Read off the captures at 60 and 120 ms / 1%
  // (RESULTS.md, round 15), most missed packets were data released by the ACKs of an earlier
  // clump (a sender short of cwnd after a loss halved it), or the open's data after such a clump
  // had been taken for the burst and the card napped behind it. With `wake_for_clocked_clumps`
  // the tail's wake above is armed also by a burst with loss or with a missed packet, stays
  // armed through kRecovery (until a burst confirms a whole grant, or reading goes free), and
  // a nap ends one min RTT after the first packet of the earliest clump (or open) of the last
  // min RTT whose clocked data cannot have come yet (several clumps circulate once a part was
  // opened on), the straggler's nap included; a wake for a clump that finds nothing by its due
  // + td_min naps again until the open's data; three whole grants in a row (not one: a hold that
  // ran out lowers the grant to a cwnd-limited part), each released by its open (round 16: its
  // first packet one min RTT after the open; a sender at a steady cwnd confirms its part every
  // cycle), end the clocked regime; an open's entry leaves the ring when its burst begins. It
  // also arms slow start's tail. On by default since round 15 (measured against main interleaved, RESULTS.md);
  // the proxy's GHOST_SHAPER_CLUMP_WAKE=0 turns it off.
  bool wake_for_clocked_clumps = true;
  // Round 19: the kernel's delayed ACK is a clock too. While the adapter does not read (the
  // window closed, a part held, a straggler's window already open), Linux ACKs a segment at
  // once only when more than one MSS is unacknowledged and the window's right edge would not
  // move back (__tcp_ack_snd_check), which with nothing read holds at most for the first
  // segments after a read that freed more than its update offered; every other segment waits
  // for the delayed-ACK timer, armed at the first segment not ACKed (tcpi_ato, at least
  // TCP_DELACK_MIN = 40 ms, fired on a 4 ms jiffy at HZ=250), or for the next read. That ACK releases a
  // cwnd-limited sender's next data one min RTT after it, ~40 ms after the clump the ring
  // holds: read off the captures at 90 ms / 1% and 120 ms / 0.5% (RESULTS.md, round 19), 103
  // of 118 "ack-clocked" misses came one RTT after an ACK sent 38–92 ms (median ~43) after the
  // oldest segment it acknowledged, mid-hold (a hold lasts half a min RTT: 45 and 60 ms, past
  // the timer; at 60 ms it is 30 ms and the open's update cancels the timer). With the clump
  // wake on, the shaper models the timer: armed by the first segment the kernel does not ACK at
  // once — the first after an open (a full drain's update advertised all the free space, so the
  // next segment shrinks the window), or the next clump's (a drain in several reads whose first
  // update advertised less than was freed: the first clump is then ACKed at once), so both get
  // an entry; after a firing, the next segment — cancelled by an open before it fires; its
  // firing time is a ring entry, so a nap ends one min RTT after it, and the card listens
  // `delayed_ack_slack` longer for it (the timer fires on a 4 ms jiffy, and tcpi_ato moves).
  // `delayed_ack` is the time from the arming segment to the ACK (the adapter sets tcpi_ato
  // when it can read it: SetDelayedAck); 0 turns the model off (the proxy:
  // GHOST_SHAPER_DELACK=0). Measured interleaved against main (RESULTS.md, round 19): missed
  // packets per download 44 → 27 at 90 ms / 1%, 22 → 10 at 120 ms / 0.5%, 18 → 6 at 60 ms /
  // 0.5%; E×D not shown better (0.61 → 0.68×, 0.40 → 0.44×, 0.82 → 0.67×, ranges overlapping).
  Duration delayed_ack = Millis(40);
  Duration delayed_ack_slack = Millis(6);
  // Round 20: the ACK a hold owes is flushed instead of awaited. With the delayed-ACK model on
  // (delayed_ack > 0, wake_for_clocked_clumps, the clocked regime armed), when a part-window is
  // held (the burst judged ended by Td, HoldsPart) and the model's timer, armed by a segment of
  // the part, would fire before the hold runs out (at 90 and 120 ms, hold_rtts·RTT > tcpi_ato;
  // at 30 and 60 ms the open's read cancels it first), and more than one MSS came since the
  // open (the kernel flushes only then: tcp_cleanup_rbuf), the shaper asks the adapter to send
  // that ACK now (wants_ack_flush(): TCP_QUICKACK = 1 on the socket) at the hold's start. The
  // data it releases is then due one min RTT after a time the shaper knows (OnAckFlushed puts
  // it in the clump ring), and the timer's guessed entries armed before it are dropped (the
  // ACK sent stops the kernel's timer). Off by default: measured interleaved against main
  // (RESULTS.md, round 20) missed packets did not fall and E×D was worse at 90 ms / 1% and
  // 120 ms / 0.5% (the flushed ACK's data comes half a round trip before the open's, two clumps
  // a cycle where the timer's came close to the open's). The proxy: GHOST_SHAPER_HOLD_QUICKACK=1.
  bool flush_ack_on_hold = false;
  // Round 20, the other way to avoid the delayed ACK: a hold ends (the open's read sends the ACK
  // owed, with the window update) `delayed_ack_margin` before the model's timer would fire
  // (armed + delayed_ack), if that is sooner than hold_rtts after the part; never before Td.
  // The rest of a cwnd-limited part then comes with the open's data, one round trip after the
  // open, instead of one round trip after the timer's ACK, mid-nap. The timer fires on a jiffy
  // (4 ms here): up to 4 ms before armed + tcpi_ato. Off by default (the proxy:
  // GHOST_SHAPER_HOLD_BEFORE_DELACK=1).
  bool hold_ends_before_delayed_ack = false;
  Duration delayed_ack_margin = Millis(4.5);
  int pays_cycles = 4;
  // While the clock runs, a clocked piece is held (the card awake) for its open's data, due one
  // min RTT after the open, when that is due within this many min RTTs of the piece's last
  // packet; 0: never held (the proxy: GHOST_SHAPER_CLOCK_HOLD_RTTS). Measured at 60 ms / 1%
  // (RESULTS.md, round 12): held within 6 ms, 0.86–1.51× E×D; never, 0.92–1.24×; within 60 ms
  // (one min RTT), 0.69–0.81× with 2 and 7 missed packets in two of three rounds.
  double clock_hold_rtts = 1.0;
  // How long a hold lasts after the part's last packet, in min RTTs: the rest of a grant in
  // transit comes within half a round trip of the part (round 10, RESULTS.md: 1.0 held bursts at
  // 60 ms / 0.1% whose rest never came for a whole RTT, E×D 0.56× against 0.50× at 0.5).
  double hold_rtts = 0.5;
  Duration default_rtt = Millis(100); // until the first min RTT sample
  double saturation = 0.9;            // window ≥ this × BDP is saturated
  int saturated_bursts = 3;           // in a row, to leave for plain TCP
  int bad_bursts = 3;                 // in a row, to leave for plain TCP
  WnicPowers wnic;
  Power base = Power::Watts(0);       // the rest of the machine, for the eq. 4 decision
};

enum class ShaperState { kSlowStart, kSaving, kRecovery, kPlain };
const char* ShaperStateName(ShaperState state);

struct ShaperStats {
  std::uint64_t bursts = 0;          // bursts that ended while shaping (saving or recovery)
  Bytes burst_bytes = 0;             // their bytes (mean burst = burst_bytes / bursts)
  std::uint64_t bad_bursts = 0;
  std::uint64_t lost_opens = 0;
  std::uint64_t held_bursts = 0;     // bursts held past Td as part-windows (hold_part_windows)
  std::uint64_t clocked_bursts = 0;  // bursts that ended while the ACK clock ran (round 12)
  std::uint64_t clamped_bursts = 0;  // bursts that ended with the grant clamped (round 13)
  std::uint64_t clamps_declined = 0; // clamps eq. 4 said would not pay (clamp_when_pays)
  std::uint64_t clamps_released = 0; // clamps released as measured dearer than unclamped
  std::uint64_t missed_packets = 0;  // packets that arrived while the card slept
  Duration sleep{};                  // time the card was asleep
  Duration awake{};                  // time the card was awake, from start to Finish
  bool declined = false;             // the knob said shaping does not pay
  bool saturated = false;            // left for plain TCP because the link was saturated
};

class DownloadShaper {
 public:
  // Told of every card transition: awake = false at the burst end, true at the wake-up.
  using CardListener = std::function<void(TimePoint when, bool awake)>;

  // Precondition: options.mode != kOff, 0 ≤ knob ≤ 100, mss > 0, window > 0.
  DownloadShaper(const ShaperOptions& options, TimePoint start);
  DownloadShaper(const DownloadShaper&) = delete;
  DownloadShaper& operator=(const DownloadShaper&) = delete;

  void SetCardListener(CardListener listener) { listener_ = std::move(listener); }

  // The kernel's delayed-ACK timeout now (ShaperOptions::delayed_ack; tcpi_ato). Ignored when the option is 0 (the model off) or `ato` is not positive.
  void SetDelayedAck(Duration ato);

  // Round 20 (ShaperOptions::flush_ack_on_hold): a hold began and the kernel owes an ACK for
  // the part: the adapter should send it now (TCP_QUICKACK = 1) and call OnAckFlushed.
  bool wants_ack_flush() const { return wants_ack_flush_; }
  // The adapter flushed the ACK owed at `now`: its data is due one min RTT later (a ring entry).
  void OnAckFlushed(TimePoint now);
  std::uint64_t ack_flushes() const { return ack_flushes_; }

  // The connection's minimum RTT now (TCP_INFO's tcpi_min_rtt, the kernel's windowed
  // minimum; the first call may come from the connect handshake). Replaces the last value.
  void SetMinRtt(Duration rtt);

  // `bytes` (> 0) arrived at `now` (one packet or a batch). `missing_data`: the adapter saw
  // loss in it (out-of-order or retransmitted segments). Call OnTimer first if a deadline
  // passed before `now`.
  void OnArrival(TimePoint now, Bytes bytes, bool missing_data = false);

  // The adapter drained the socket at `now`: the window is open again. Precondition:
  // wants_open() or reads_freely().
  void OnOpened(TimePoint now);

  // When OnTimer must run next (burst end if nothing arrives, wake-up, lost open), or nullopt
  // when nothing is pending. Timers exist only while a download runs.
  std::optional<TimePoint> NextDeadline() const;
  // Runs what is due at `now`; harmless when nothing is.
  void OnTimer(TimePoint now);

  // The download ended (EOF, error, client gone) at `now`: the card is awake again, the
  // shaper stops. Idempotent.
  void Finish(TimePoint now);

  // The adapter reads as data comes (slow start, plain TCP) rather than in bursts.
  bool reads_freely() const;
  // A burst ended: the adapter should drain the socket and call OnOpened.
  bool wants_open() const { return wants_open_; }
  bool card_awake() const { return awake_; }
  // While the card sleeps: when the burst it sleeps for is due (its wake-up is wake_lead and
  // the wake-up time before it); nullopt while awake.
  std::optional<TimePoint> nap_due() const { return awake_ ? std::nullopt : nap_due_; }
  Duration wake_lead() const { return options_.wake_lead; }
  ShaperState state() const { return state_; }
  const ShaperStats& stats() const { return stats_; }
  Duration min_rtt() const { return min_rtt_ ? *min_rtt_ : options_.default_rtt; }
  // How long after an open its burst is expected (ShaperOptions::wake_percentile).
  Duration ExpectedDelay() const;
  // The ACK clock runs (ShaperOptions::ack_clock_after_loss): the next data is due one min RTT
  // after the last burst's first packet, if that is sooner than after the open.
  bool ack_clocked() const { return ack_clock_; }
  // The grant the next open should offer, as a share of the unclamped grant (0 < share ≤ 1;
  // 1 = unclamped): ShaperOptions::clamp_to_sender. The adapter sizes the receive buffer by it.
  double grant_share() const;
  // The clamped grant in bytes, 0 when unclamped.
  double grant_clamp() const { return clamp_; }
  // Td(P) for the current burst (DESIGN §3.6).
  Duration BurstEndThreshold() const;
  double window_packets() const { return w_; }
  // The rate of the last complete burst or flight, bytes/s (0 before one).
  double rate() const { return rate_; }

  void AssertInvariants() const;

 private:
  // When the burst in progress ends if nothing more comes: Td(P) after its last packet, not
  // before the settle time (settle_after_slow_start).
  TimePoint BurstEnd() const;
  // `cut`: a flight read freely was cut at a window's worth, not ended by a gap.
  // `nap` false: the burst is ended by the next one's first packet (a straggler's burst
  // followed at once by the open's data), so the card must not nap behind it (round 20).
  void EndBurst(TimePoint now, TimePoint last, bool cut = false, bool nap = true);
  void Judge(bool missing, bool mistaken, bool saturated, double packets);
  void Enter(ShaperState next);
  void Sleep(TimePoint now, TimePoint due);
  void Wake(TimePoint now);
  double MaxSlowdown() const;

  ShaperOptions options_;
  ShaperState state_ = ShaperState::kSlowStart;
  CardListener listener_;
  std::optional<Duration> min_rtt_;

  // Estimator (seconds as doubles inside, durations at the edges).
  double ia_ = 0, id_ = 0;  // EWMAs of interarrival time and its deviation, in seconds
  bool have_ia_ = false;
  double gap_max_ = 0;      // longest gap inside recent bursts, seconds (decays per burst)
  double w_ = 0;            // W: one more than the packets of the last good window
  double w_before_ = 0;     // W before the last update, restored when that burst missed data
  bool w_measured_ = false; // W is the count of a clean burst (not the first guess or a flight)

  // The burst (or, reading freely, the flight) in progress.
  bool in_burst_ = false;
  TimePoint burst_first_{}, burst_last_{};
  double burst_packets_ = 0;
  Bytes burst_bytes_ = 0;
  Bytes total_bytes_ = 0;
  bool burst_missing_ = false;
  bool burst_missed_ = false;
  bool burst_straggler_ = false;        // data of the last window, after its open

  bool wants_open_ = false;
  // The part-window hold (ShaperOptions::hold_part_windows). since_open_: bytes arrived since
  // the last open (or since reading stopped at the end of slow start), stragglers included: all
  // of it is that open's grant. grant_: what a whole grant delivers, in bytes (from the option's
  // window at first; rises at once to a bigger one, falls by 1/8 per smaller clean burst, and at
  // once to a hold's bytes when nothing more came). held_gap_: the hold's gaps inside the burst,
  // left out of the estimator and the burst's rate.
  Bytes since_open_ = 0;
  double grant_ = 0;
  double held_gap_ = 0;
  bool held_ = false;  // the burst in progress was held past Td at least once
  int grant_confirmed_ = 0;  // clean bursts in a row that delivered grant_ (within MSS/2)
  // Round 16: of those, in a row, the ones whose first data came one min RTT after their open
  // (burst_by_open_): only these end the clump wake's clocked regime.
  int opened_grants_ = 0;
  bool burst_by_open_ = false;  // the burst in progress began one min RTT after the last open
  // The burst in progress is a part-window to hold (Td alone would end it early).
  bool HoldsPart() const;
  // The burst in progress has delivered a whole grant (ShaperOptions::td_grant).
  bool GrantComplete() const;
  // Slow start ended (reading stopped) at settle_until_ − min RTT: no burst ends, and no open is
  // asked for, before settle_until_ (ShaperOptions::settle_after_slow_start).
  std::optional<TimePoint> settle_until_;
  std::optional<TimePoint> opened_at_;   // the open whose burst has not begun
  std::optional<TimePoint> expected_;    // opened_at_ + min RTT: when its burst is due
  std::optional<TimePoint> wake_at_;     // while asleep
  std::optional<TimePoint> nap_due_;     // while asleep: the burst it sleeps for is due
  bool awake_ = true;
  TimePoint since_{};                    // last card transition, for the time totals
  bool finished_ = false;

  // The recent open→first-data delays (a ring), for ExpectedDelay.
  static constexpr int kOpenDelays = 16;
  Duration open_delays_[kOpenDelays] = {};
  int open_delay_count_ = 0;
  int open_delay_next_ = 0;

  // The ACK clock (ShaperOptions::ack_clock_after_loss): running, the first packet of the last
  // shaped burst, and the bursts in a row whose data came by their open, not the clock.
  bool ack_clock_ = false;
  std::optional<TimePoint> clock_first_;
  std::optional<TimePoint> last_open_;  // the latest open (kept after its data began)
  int clock_clean_ = 0;
  // While the ACK clock runs, a burst that began before its open's data was due (a clocked
  // piece) goes on until that data has had its chance: the open releases the rest of the grant
  // one min RTT after it, a gap of about Td behind the clocked piece.
  bool ClockHolds() const;
  // When the next burst is due for an open (or a burst's end) at `t`: one ExpectedDelay after
  // it, or one min RTT after the last burst's first packet while the ACK clock runs.
  TimePoint DueAfter(TimePoint t) const;
  void StartAckClock();

  // The clamp (ShaperOptions::clamp_to_sender): the grant in bytes (0: unclamped), the
  // unclamped grant it is a share of (the latest grant confirmed by whole bursts while
  // unclamped; 0: none yet), and a nap due one min RTT after the last burst's first packet
  // (the cycle in which the clamp fell).
  double clamp_ = 0;
  double full_grant_ = 0;
  bool clocked_once_ = false;
  bool burst_clocked_ = false;  // the burst in progress began while clocked_once_ was set
  double suspect_cwnd_ = 0;     // a part's bytes, the clamp once its clocked rest is seen
  // The kernel's grant for a share of the buffer is not exactly that share of the grant (per
  // segment overhead, the window scale's rounding): a clamped part whose rest never came was
  // the kernel's short grant, and the next share asks for that much more (≤ 1.5×).
  double clamp_gain_ = 1;
  // Called at a shaped burst's end, after grant_ is updated. A part sets suspect_cwnd_; the clamp
  // falls to it when the next burst proves the sender short of cwnd (OnArrival).
  void UpdateClamp(bool hold_expired);

  // Round 14 (ShaperOptions::clamp_when_pays): what a shaped cycle of a loss episode costs, per
  // cycle (EWMAs, 1/4 per cycle): seconds, card joules, bytes.
  struct CycleCost {
    double time = 0, energy = 0, bytes = 0;
    int n = 0;
    void Add(double t, double e, double b);
    // Eq. 4's K·t + (100 − K)·E per byte; +inf without a byte.
    double PerByte(int knob) const;
  };
  CycleCost unclamped_cost_, clamped_cost_;
  // Slow start's tail (ShaperOptions::wake_for_slow_start_tail): no whole grant confirmed since
  // slow start ended; and the clocked clump's due time for the nap in progress.
  bool tail_clocked_ = false;
  TimePoint clump_first_{};  // the first packet of the burst's last clump (a held burst has several)
  std::optional<TimePoint> tail_due_;
  // When the card must wake for a burst due at `due` (the tail's clump if that is sooner).
  TimePoint WakeFor(TimePoint due) const;
  // The first packets of the recent clumps, a ring (ShaperOptions::wake_for_clocked_clumps).
  static constexpr int kClumps = 8;
  TimePoint clumps_[kClumps] = {};
  int clump_count_ = 0, clump_next_ = 0;
  int open_slot_ = -1;  // the ring slot of the open whose data has not come (round 16)
  // Round 19, the kernel's delayed ACK (ShaperOptions::delayed_ack): armed at the first segment
  // not ACKed at once (nullopt: no ACK owed), its ring slot (its firing time), and whether the
  // segments since the last open may still get the immediate ACK of a grown window.
  std::optional<TimePoint> delack_armed_;
  bool delack_second_ok_ = false;  // the next clump may arm it instead (a partial update)
  bool clump_delack_[kClumps] = {};  // the ring entry is a delayed ACK's firing time
  static constexpr int kDelackPending = 4;
  std::pair<int, TimePoint> delack_pending_[kDelackPending] = {};  // (slot, firing), since the open
  int delack_pending_n_ = 0, delack_pending_next_ = 0;
  void AddDelayedAckEntry(TimePoint fire);
  // The delayed ACK's model, at each arrival (`new_clump`: it began a clump) and at each open.
  void NoteDelayedAck(TimePoint now, bool new_clump);
  void DelayedAckOnOpen(TimePoint now);
  // An ACK went out (an open's read, or a flush): the timer stops, its entries not yet due
  // leave the ring.
  void CancelDelayedAck(TimePoint now);
  bool DueIsDelayedAck(TimePoint due) const;
  // Round 20: the hold's ACK flush (ShaperOptions::flush_ack_on_hold). flushed_for_: the
  // burst_last_ whose hold was flushed (one flush per hold start); FlushDue: when the hold in
  // progress should flush (its start, Td after the part's last packet), nullopt if it should not.
  bool wants_ack_flush_ = false;
  std::optional<TimePoint> flushed_for_;
  std::uint64_t ack_flushes_ = 0;
  std::optional<TimePoint> FlushDue() const;
  void NoteClump(TimePoint first);
  // When the tail's nap from `end` must end: one min RTT after the last clump's first packet,
  // or (wake_for_clocked_clumps) after the earliest recent clump's whose clocked data is still
  // to come (nullopt: none).
  std::optional<TimePoint> ClockedDue(TimePoint end) const;
  // Woken for a clump that has not come: nap again at this time if still nothing has.
  std::optional<TimePoint> renap_at_;
  bool episode_ = false;      // a loss episode runs: from a burst with loss or a miss until
  int episode_clean_ = 0;     // ... this many whole-grant bursts in a row (3) end it
  bool cycle_clamped_ = false;  // the cycle in progress was opened with the grant clamped
  std::optional<TimePoint> cycle_start_;  // the last shaped burst's end
  double cycle_awake_at_ = 0, cycle_sleep_at_ = 0;  // the card's totals then, seconds
  std::uint64_t naps_ = 0, cycle_naps_at_ = 0;
  // Books the cycle that ended at `end` (a shaped burst's end) to the regime it ran in.
  void BookCycle(TimePoint end, Bytes bytes);
  // Whether a clamp to `cwnd` bytes pays by eq. 4 against the measured unclamped cycles.
  bool ClampPays(double cwnd) const;

 public:
  // The cycle model of a clamped grant of `cwnd` bytes (round 14): one open's round trip, the
  // burst at `rate`, Td; the card awake for the guard, the burst and Td, one wake-up, asleep
  // otherwise. Returns {seconds, joules} per cycle.
  static std::pair<double, double> ClampedCycleModel(const WnicPowers& wnic, double cwnd, double rate,
                                                     Duration min_rtt, Duration td, Duration lead);

 private:

  double rate_ = 0;
  int bad_run_ = 0, saturated_run_ = 0, unsaturated_run_ = 0;
  ShaperStats stats_;
};

}  // namespace ghost

#endif  // GHOST_COMMON_POWER_SHAPER_H_
