// UpstreamShaper: download shaping on one origin socket of ghostproxy (DESIGN §3.6), the
// libevent adapter over common/power/shaper.h's DownloadShaper.
//
// The socket's receive buffer is fixed (SO_RCVBUF, before connect where the caller can: see
// SetShapingBuffer). While the shaper saves energy the origin's bufferevent does not read
// (EV_READ disabled): the kernel queues what arrives and, when the buffer is full, advertises
// a zero window. What arrives meanwhile is observed without reading it: a read event with
// SO_RCVLOWAT one byte above what is queued wakes the loop for each new segment (FIONREAD
// says how much, TCP_INFO's tcpi_last_data_recv when the last one came and tcpi_rcv_ooopack
// whether a segment was missing); past SO_RCVLOWAT's cap (half the buffer) the shaper's
// deadline timer looks instead. When the shaper judges the burst ended, the bufferevent reads
// again until the socket is empty (the window opens), then stops; with
// GHOST_SHAPER_ONE_READ_DRAIN=1 (round 9, opt-in: not measured better at load ~30) the adapter
// reads everything queued in one recvmsg into the bufferevent's input (ReadQueued: the window
// opens in one step, one window update) and runs the owner's read callback from the loop;
// should that read nothing (EOF or an error first), the bufferevent reads as before. Reading freely (slow start, plain TCP) the bufferevent reads
// as usual and each read is an arrival.
//
// Shaping never changes a byte: it only decides when the bufferevent reads. Back-pressure
// from a slow client (SetPaused) wins over an open: nothing is read while paused. An origin
// that closes or resets while the window is closed makes the socket readable with nothing
// new queued: the adapter then reads, so the bufferevent sees the end.
//
// One open, one burst (round 8, from bench_shaping.py --diagnose; only with
// GHOST_SHAPER_QUIET_BURSTS=1 in the environment: one round per link at load ~20 measured it
// better at 60 ms (0%, 0.1%) and 90 ms, worse at 30 and 120 ms, see RESULTS.md): with a
// capture the adapter reads nothing while it waits for a burst, and after each open it turns
// TCP_QUICKACK off, so
// no ACK during the burst offers the sender room it fills one round trip later, mid-nap (a read
// byte is room; a quick ACK moves the window's right edge by the window scale's rounding). The
// open is timed at the drain's first read: libevent reads 4 KB at a time and each read sends a
// window update, so the burst can come one RTT after the first (with the one-read drain there
// is one read).
//
// Part-windows are held (round 10, common/power/shaper.h ShaperOptions::hold_part_windows; on
// by default): a burst clearly short of what a whole grant delivers is not answered by an open
// until the rest arrives or half a min RTT passes. GHOST_SHAPER_HOLD=0 turns it off,
// GHOST_SHAPER_HOLD_RTTS sets the bound and GHOST_SHAPER_TD_FULL_MS Td's floor for a whole window
// (measurement aids for bench_shaping.py --variants). On the quiet machine (RESULTS.md, round 10)
// the one-read drain, the settle time and quiet bursts made no measurable difference, so they
// stay opt-in.
//
// Round 13: the grant clamped to the sender (ShaperOptions::clamp_to_sender; opt-in,
// GHOST_SHAPER_CLAMP=1). Before each open the receive buffer is set to the shaper's share of
// the shaping buffer (a kernel window is proportional to the free buffer, and the drain's reads
// send the window update, so the next grant is the clamp), and while clamped the awaited burst
// is not read (a byte read while it comes is a byte more of grant than the sender's cwnd, sent
// one round trip later, mid-nap). Not TCP_WINDOW_CLAMP: it bounds the window from rcv_nxt, not
// from what was read, so with a buffer larger than the clamp every ACK of a burst slides the
// edge on and one open still lets the sender send a whole buffer, a clamp's worth per round
// trip: the ACK clock again. The buffer is lowered only at an open (the socket then holds a
// whole grant of in-order data the drain reads at once; a segment arriving while the queue is
// over the new size would make the kernel prune it).
// Round 14: GHOST_SHAPER_CLAMP=auto arms the clamp only where eq. 4 says it pays, from the
// cycles the shaper measured (ShaperOptions::clamp_when_pays; opt-in: not measured better), and
// the nap after a burst of slow start's tail ends for the next ACK-clocked clump
// (ShaperOptions::wake_for_slow_start_tail; opt-in since the round-14 merge,
// GHOST_SHAPER_TAIL_WAKE=1).
//
// Round 15: after a loss or a miss as well, until three whole grants in a row, a nap ends for
// every recent clump's clocked data (ShaperOptions::wake_for_clocked_clumps; on,
// GHOST_SHAPER_CLUMP_WAKE=0 turns it off; it arms slow start's tail too).
//
// Round 11: a burst that has delivered a whole (confirmed) grant ends td_grant (0.5 ms) after
// its last packet, and the card wakes 0.5 ms (wake_lead) before the next burst is due;
// GHOST_SHAPER_TD_GRANT_MS and GHOST_SHAPER_WAKE_LEAD_MS set them for side-by-side runs.
//
// Timers: one timer per shaped download, a timerfd (CLOCK_MONOTONIC) under a persistent
// libevent read event, armed only while a deadline of the shaper is pending or the window is
// closed (the watchdog); a proxy with no shaped download has none. Not libevent's own timer:
// without EVENT_BASE_FLAG_PRECISE_TIMER libevent keeps time with CLOCK_MONOTONIC_COARSE, one
// jiffy (4 ms on this kernel) per tick, and its timers fired up to that late — a 0.5 ms Td's
// open came 3.9 ms (median) after the burst's end (RESULTS.md, round 11).
// GHOST_SHAPER_COARSE_TIMER=1 (or no timerfd) falls back to a libevent timer.
//
// No closed window without a way out (the round-5/6 stall: a shaped body cut short, the
// shaper still active): while the shaper saves, the window is closed only while it waits for
// the burst's end (a deadline) or for the open (wants_open). The shaper could also be left
// waiting for an arrival with nothing pending: entering kSaving from a flight read freely
// whose last bytes the capture saw before the socket was read (the window then closed on a
// full buffer, so nothing more could come), or a burst judged a straggler followed by a lost
// open (kRecovery with nothing pending). Step opens such a window at once (drain, OnOpened).
// A watchdog bounds every closed window besides: no arrival, open or close for
// WatchdogBound() (4 min RTTs + 300 ms) while closed and not paused, it logs and opens.
//
// GHOST_SHAPER_TRACE=1 in the environment prints each step (state, queue, card) to stderr.
//
// Per-packet arrivals (proxy/arrival_tap.h): where the proxy may capture (CAP_NET_RAW), a
// capture filtered to the socket's 4-tuple reports every segment with the kernel's receive
// time, so Td(P) is computed from real interarrival times and a burst's end is judged on the
// last segment, not on a batch. The socket then only decides when to read; a FIN or RST seen
// by the capture makes the adapter read (so the bufferevent sees the end) while the window is
// closed. Without a capture the SO_RCVLOWAT watch above is used; on scripts/linkemu.sh (60 ms
// RTT, 20 Mb/s) it saw the second half of each window only at the deadline timer and judged
// bursts ended too early (a third to two thirds of the bursts missed packets).
//
// Known limit (measured with the capture, same link, nginx origin with the kernel's default
// BBR, on a loaded 2-core machine): missed packets fell (40-115 → 6-38 per 5 MB) but about
// half the bursts are still bad and the shaper leaves for plain TCP as "saturated": a window
// arrives as ~100 KB at line rate, then the rest 20-40 ms later (the sender's pacing/cwnd,
// not the link), so the measured burst rate is low and the window looks ≥ 90% of the BDP.
// scripts/bench-shaping.sh measured shaped E×D at 2.9-5× plain TCP there.
//
// Why it cannot pay there (round 4, same link, origin without slow start after idle): plain
// TCP's window autotunes past the bandwidth-delay product, so it receives at the bottleneck's
// rate without idle gaps (2.38 s, 3.35 J: 1.41 W mean card power). Each window the shaper
// closes adds at least one RTT to the delay T and saves at most (P_idle − P_sleep)·RTT of
// energy E, changing E×D by at least RTT·(E − (P_idle − P_sleep)·T): positive whenever plain's
// mean card power exceeds P_idle − P_sleep (1.14 W on the WaveLAN card), whatever the window,
// Td or wake time. Fixing the buffer before the SYN (HTTP fixed it after; tunnels, then, before;
// both now fix it when their shaping starts) made
// it worse (E×D 2.7-3.2×: the whole download held to the 128 KiB window); the sender's BBR or
// CUBIC and tcp_slow_start_after_idle=0 changed nothing measurable. The paper's plain TCP had
// a fixed window below the BDP, which idles between windows; that idle is what shaping turns
// into sleep. So --shape auto declines there (EstimateShaping compares with plain TCP at the
// link rate), and then gives the window back (ReleaseBuffer).
//
// Against the paper's baseline (round 5): ShapingOptions::plain_buffer (--plain-rcvbuf) fixes
// plain TCP's buffer before connect, so plain idles between windows too. Same link, 5 MB,
// SO_RCVBUF 16 KiB for both (a ~22 KB window), Reno origin, 13 runs at load 6–20: shaped E×D
// 0.32–0.72× that plain (median 0.49×; 3–79 missed packets per download, median 14);
// 0.67–0.69× with the shaped buffer fixed before connect too (the window scale then fits the
// small buffer; bursts ~22 KB instead of ~26 KB). With BBR at the origin 1.5× (it paces each
// window over the round trip: 54–68 missed). With a 64 KiB buffer (a ~90 KB window, 0.6 of the
// BDP) 1.2–3.7× (before the wake-up double count was fixed): each window costs a round trip
// plus the burst against plain's one round trip, so the time ratio is ≈ 1 + window/BDP.
//
// Thread-safety: the proxy's event-loop thread only.
#ifndef GHOST_PROXY_SHAPER_H_
#define GHOST_PROXY_SHAPER_H_

#include <cstdint>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>

#include "common/base/clock.h"
#include "common/base/units.h"
#include "common/power/shaper.h"
#include "proxy/arrival_tap.h"

struct bufferevent;
struct evbuffer;
struct evbuffer_cb_info;
struct event;
struct tcp_info;

namespace ghost {

// The proxy's shaping settings (ProxyOptions::shaping; config keys shape, shape_knob,
// shape_max_slowdown, shape_threshold, shape_buffer).
struct ShapingOptions {
  ShapeMode mode = ShapeMode::kAuto;
  // The knob the eq. 4 decision uses (0 saves energy, 100 never shapes). Without
  // knob_fixed, the knob of the ghostfs whose cache the proxy shares wins once known
  // (CacheBackend::DaemonKnob); --shape-knob and the shape_knob key set knob_fixed.
  int knob = 50;
  bool knob_fixed = false;
  // Shaping never slows a download more than this; 0: DefaultMaxSlowdown(knob).
  double max_slowdown = 0;
  // Responses shaped: declared length over this, or this many bytes of an unknown length.
  Bytes threshold = 256 * 1024;
  // SO_RCVBUF of a shaped socket (the kernel doubles it; about 1.9× this is one window).
  int buffer = 64 * 1024;
  // A measurement aid, not a saving (--plain-rcvbuf, key plain_rcvbuf; 0: off): SO_RCVBUF of
  // every origin socket, set before connect, so plain TCP (--shape off) runs with the paper's
  // fixed client window instead of autotuning (Yan et al.'s baseline; DESIGN §3.6). With the
  // same size as `buffer`, plain and shaped downloads are held to the same window. With
  // shaping on, a shaper still fixes `buffer`, and its eq. 4 decision compares with plain TCP
  // held to that window.
  int plain_buffer = 0;
};

// Counters behind /ghost/status and /ghost/metrics ("shaping").
struct ShapingStats {
  std::uint64_t shaped_downloads = 0;  // downloads a shaper ran on
  std::uint64_t per_packet = 0;        // of which timed per packet (proxy/arrival_tap.h)
  int knob_used = -1;                  // the knob the latest one decided with (-1: none yet)
  std::uint64_t active = 0;            // running now
  std::uint64_t bursts = 0;
  Bytes burst_bytes = 0;
  std::uint64_t missed_packets = 0;  // arrived while the card model slept
  std::uint64_t lost_opens = 0;
  std::uint64_t bad_bursts = 0;
  std::uint64_t held_bursts = 0;  // bursts held as part-windows until the rest came (round 10)
  std::uint64_t clocked_bursts = 0;  // bursts timed by the ACK clock after a loss (round 12)
  std::uint64_t clamped_bursts = 0;  // bursts with the grant clamped to the sender (round 13)
  std::uint64_t clamps_declined = 0; // clamps eq. 4 said would not pay (round 14)
  std::uint64_t clamps_released = 0; // clamps measured dearer than unclamped (round 14)
  // Closed windows the adapter opened itself: the shaper waited for an arrival with nothing
  // pending (a stall), or the watchdog's bound passed (proxy/shaper.cc Step).
  std::uint64_t forced_opens = 0;
  std::uint64_t declined = 0;   // the eq. 4 cost said plain TCP
  std::uint64_t saturated = 0;  // left for plain TCP: window ≥ 90% of the BDP
  Duration sleep{};             // estimated card sleep time
  Duration elapsed{};           // time shaped downloads ran
  // The minimum RTT the latest shaped download ended with, and its handshake RTT (0: none).
  Duration last_min_rtt{};
  Duration last_handshake_rtt{};
  Bytes bytes = 0;              // bytes of shaped downloads
  double slowdown_sum = 0;      // Σ (elapsed / the plain-TCP estimate), one per download
  std::uint64_t slowdown_count = 0;
};

// The "shaping" object of /ghost/status (JSON text) and the ghostproxy_shaping_* metrics
// (Prometheus text): shaped downloads, bursts, mean burst size, estimated sleep time, missed
// packets, mean slowdown.
std::string ShapingStatusJson(const ShapingOptions& options, const ShapingStats& stats);
std::string ShapingMetricsText(const ShapingStats& stats);

// Bytes a CONNECT tunnel sends toward the client before its shaping starts: `threshold`, or
// GHOST_SHAPER_TUNNEL_THRESHOLD (bytes) from the environment, a measurement aid for
// bench_shaping.py (round 9).
Bytes TunnelShapingThreshold(const ShapingOptions& options);

// Sets SO_RCVBUF on a socket about to connect (or connected). Returns false on failure.
bool SetShapingBuffer(int fd, int bytes);

class CacheBackend;

// The minimum round trip a shaper times its wake-ups with (the next burst is due one minimum
// RTT after an open), from samples that cannot include a queue the download itself built.
//   - The handshake's RTT: TCP_INFO's tcpi_min_rtt read when connect() completes, before any
//     data. On the connecting side the kernel's first RTT sample is the SYN → SYN-ACK time
//     (tcp_ack_update_rtt), so this is the path's round trip with nothing of ours queued.
//   - Later receive-side samples, tcpi_rcv_rtt: the time from one of our ACKs (its TSval) to
//     data echoing it (tcp_rcv_rtt_measure_ts; ms resolution with timestamps, the kernel
//     keeps a falling sample at once and smooths a rising one by 1/8). While the bottleneck
//     queue holds our data this includes the queue (41.5 ms measured on a 30 ms link 256 KiB
//     into an autotuned tunnel), so samples only ever lower the value.
// tcpi_min_rtt later in the download is the sender-side minimum over the few segments this
// side sent (requests, TLS records of the client), and tcpi_rtt their smoothed RTT: neither
// times the downstream, so neither is used after the handshake. Without a handshake RTT the
// smallest receive sample is the value (as before round 9).
class PathMinRtt {
 public:
  // The handshake's RTT (> 0; others ignored). Sets the value unless a sample is lower.
  void SetHandshake(Duration rtt);
  // A receive-side sample (tcpi_rcv_rtt; > 0, others ignored): lowers the value, never raises.
  void Sample(Duration rtt);
  std::optional<Duration> value() const;
  std::optional<Duration> handshake() const { return handshake_; }

 private:
  std::optional<Duration> handshake_;
  std::optional<Duration> lowest_sample_;
};

// tcpi_min_rtt of a connected socket whose handshake just completed (before any data), or
// nothing when the kernel has no sample (a SYN that was retransmitted gives none).
std::optional<Duration> HandshakeRtt(int fd);

class UpstreamShaper {
 public:
  // Shapes what `bev` (a connected TCP socket, borrowed: must outlive this) reads. `stats` is
  // borrowed too. `size` is the declared length (0 unknown). Starts reading freely.
  // `fixed_at_connect`: the buffer was fixed before connect, so plain TCP on this socket is
  // limited to the same window (the eq. 4 decision compares with that, else with plain TCP at
  // the link rate). `handshake_rtt`: the connection's RTT measured when it connected
  // (HandshakeRtt), the minimum RTT's starting value; later receive samples only lower it
  // (PathMinRtt). A shaper that starts late (a tunnel, 256 KiB in, the bottleneck queue full)
  // would otherwise start from a queued estimate.
  UpstreamShaper(Clock* clock, bufferevent* bev, const ShapingOptions& options, Bytes size,
                 bool fixed_at_connect, ShapingStats* stats,
                 std::optional<Duration> handshake_rtt = std::nullopt);
  // Stops shaping: counts the download, and leaves the bufferevent reading unless paused.
  ~UpstreamShaper();
  UpstreamShaper(const UpstreamShaper&) = delete;
  UpstreamShaper& operator=(const UpstreamShaper&) = delete;

  // The daemon whose emulated card naps with this download (DESIGN §3.6 rules 2–5): each
  // sleep of the card model is a NapBegin (with the burst's due time), each wake-up a NapEnd.
  // Borrowed; must outlive this. Null (the default): no daemon is told.
  void SetCardBackend(CacheBackend* backend) { card_backend_ = backend; }

  // Back-pressure from the owner: true stops all reading (as bufferevent_disable did).
  void SetPaused(bool paused);
  bool paused() const { return paused_; }
  const DownloadShaper& shaper() const { return *shaper_; }
  // Arrivals come per packet from a capture (else from the socket's reads and wake-ups).
  bool per_packet() const { return tap_ != nullptr; }

 private:
  static void OnInput(evbuffer* buf, const evbuffer_cb_info* info, void* arg);
  static void OnWatch(int fd, short what, void* arg);
  static void OnTimerEvent(int fd, short what, void* arg);
  static void OnTapEvent(int fd, short what, void* arg);
  // Hands what the capture saw to the shaper (no-op without a capture).
  void DrainTap();
  // Counts what the kernel queued since the last look. False when the socket was readable
  // with nothing new (EOF or an error is waiting).
  bool Observe(TimePoint now, bool woke_readable);
  // Does what the shaper wants: read or not, watch, the timer.
  void Step();
  void SetReading(bool on);
  void Watch(bool on);
  // Opens the window now: drains what is queued (or, with nothing queued, tells the shaper it
  // is open and waits for the burst). For a closed window the shaper waits on with nothing
  // that could end the wait (see Step).
  void ForceOpen(TimePoint now, const char* why);
  std::size_t Queued() const;
  bool MissingData();
  void UpdateRtt(const struct tcp_info& info);

  Clock* clock_;
  bufferevent* bev_;
  int fd_;
  ShapingStats* stats_;
  std::unique_ptr<DownloadShaper> shaper_;
  event* watch_ = nullptr;
  event* timer_ = nullptr;
  // The timer's own clock (round 11): a timerfd on CLOCK_MONOTONIC, -1 when it could not be
  // made (then timer_ is a libevent timer). libevent times its timers with
  // CLOCK_MONOTONIC_COARSE (without EVENT_BASE_FLAG_PRECISE_TIMER), which ticks once a jiffy
  // (4 ms here), so a burst's end or a hold fired up to 4 ms late and the open with it
  // (measured with --diagnose at 60 ms: 3.9 ms from a 0.5 ms Td's end to the open).
  int timer_fd_ = -1;
  void ArmTimer(std::optional<Duration> in);
  bool watching_ = false;
  bool reading_ = true;
  bool paused_ = false;
  bool draining_ = false;  // opening the window: read until the socket is empty
  bool awaiting_burst_ = false;  // window open, socket empty: the next data starts a burst
  // Awaiting a burst after a forced open: read (with a capture, awaiting does not read).
  bool forced_await_read_ = false;
  bool quiet_bursts_ = false;  // GHOST_SHAPER_QUIET_BURSTS=1: one open, one burst (above)
  // The drain's first read (the window update goes out then): the open's time.
  std::optional<TimePoint> drain_first_read_;
  void StartDrain();
  // The one-read drain (round 9): reads everything the socket holds straight from the fd into
  // the bufferevent's input (recvmsg into reserved space), so the window opens in one step,
  // then has libevent run the owner's read callback (deferred). False when nothing was read
  // (nothing queued, or recvmsg saw EOF or an error first): the bufferevent then reads as before
  // and sees the end itself. Loops while more arrived meanwhile, at most a few times.
  bool ReadQueued(TimePoint now);
  bool one_read_drain_ = false;  // GHOST_SHAPER_ONE_READ_DRAIN=1 (opt-in, RESULTS.md round 9)
  bool reading_direct_ = false;  // inside ReadQueued: OnInput leaves Step to the caller
  // The owner's read callback for what ReadQueued read, run from the loop by this event (owned
  // here, so it never runs after this is destroyed and never outlives the event base, unlike a
  // deferred bufferevent callback, which holds a reference to the bufferevent until it runs).
  static void OnDeliver(int fd, short what, void* arg);
  // Known limit (opt-in path only): destroyed with a delivery pending, the destructor defers
  // the owner's read callback through libevent, which holds a reference to the bufferevent until
  // the loop runs it; an event base freed before that leaks the bufferevent (ASan: the
  // UpstreamShaperTest cases Awaiting… and Flight… run with GHOST_SHAPER_ONE_READ_DRAIN=1).
  event* deliver_ = nullptr;
  bool deliver_pending_ = false;
  // Tells the shaper the window opened at `at`; while shaping, quiets the ACKs of the burst.
  void Opened(TimePoint at);
  // When the window opened, for a drain that emptied the socket at `now`; clears the record.
  TimePoint OpenedAt(TimePoint now);

  bool was_freely_ = true;
  std::size_t seen_ = 0;   // bytes queued in the socket at the last look, window closed
  std::uint32_t ooo_seen_ = 0;
  int lowat_cap_ = 0;
  int lowat_ = 1;  // SO_RCVLOWAT now
  PathMinRtt rtt_;  // the handshake's RTT, lowered by receive samples
  bool legacy_rtt_ = false;  // GHOST_SHAPER_HANDSHAKE_RTT=0 (proxy/shaper.cc)
  TimePoint start_{};
  TimePoint last_arrival_{};
  // The watchdog (Step): when the window last closed or anything last arrived or opened; a
  // closed window with no progress past WatchdogBound() is opened.
  TimePoint progress_at_{};
  Duration WatchdogBound() const;
  Bytes bytes_ = 0;
  std::unique_ptr<ArrivalTap> tap_;  // per-packet arrivals; null: the socket's view
  event* tap_event_ = nullptr;
  bool peer_closing_ = false;  // the capture saw FIN or RST: read to the end
  // The shaper declined (eq. 4): the fixed buffer was given back (ReleaseBuffer), once.
  bool buffer_released_ = false;
  // The grant clamped to the sender (round 13, ShaperOptions::clamp_to_sender): SO_RCVBUF is
  // `buffer_` × the shaper's grant_share() from the next open on; applied_buffer_ is what was
  // last set.
  int buffer_ = 0;
  int applied_buffer_ = 0;
  void ApplyGrant();
  bool fixed_at_connect_ = false;
  // Declined for good: lets the receive window grow again (SO_RCVBUF to the system's maximum),
  // so a download shaping would not help is not held to the shaping window either.
  void ReleaseBuffer();
  // GHOST_SHAPER_CARD_LOG: the card model's decisions, for scripts/bench-shaping.sh.
  void LogCard(const char* what, TimePoint when);
  std::FILE* card_log_ = nullptr;
  // The card model slept or woke at `when`: the card log and the daemon's card.
  void OnCard(TimePoint when, bool awake);
  CacheBackend* card_backend_ = nullptr;
  bool daemon_napping_ = false;  // the daemon accepted the last NapBegin (as far as known)
  bool naps_hopeless_ = false;   // the daemon's card cannot nap on this path (rule 4)
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);  // for the daemon's replies
  Duration real_offset_{};  // CLOCK_REALTIME − clock_ at the start
};

}  // namespace ghost

#endif  // GHOST_PROXY_SHAPER_H_
