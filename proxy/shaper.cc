#include "proxy/shaper.h"

#include "proxy/cache_backend.h"

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <linux/sockios.h>
#include <linux/tcp.h>
#include <netinet/in.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <sys/uio.h>
#include <unistd.h>

#include <time.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string_view>
#include <nlohmann/json.hpp>

namespace ghost {

std::string ShapingStatusJson(const ShapingOptions& options, const ShapingStats& s) {
  nlohmann::json j = {
      {"mode", ShapeModeName(options.mode)},
      {"knob", options.knob},
      {"max_slowdown", options.max_slowdown > 0 ? options.max_slowdown
                                                : DefaultMaxSlowdown(options.knob)},
      {"threshold_bytes", options.threshold},
      {"buffer_bytes", options.buffer},
      {"shaped_downloads", s.shaped_downloads},
      {"per_packet", s.per_packet},
      {"knob_used", s.knob_used},
      {"active", s.active},
      {"bursts", s.bursts},
      {"mean_burst_bytes", s.bursts > 0 ? s.burst_bytes / s.bursts : 0},
      {"missed_packets", s.missed_packets},
      {"lost_opens", s.lost_opens},
      {"bad_bursts", s.bad_bursts},
      {"held_bursts", s.held_bursts},
      {"clocked_bursts", s.clocked_bursts},
      {"clamped_bursts", s.clamped_bursts},
      {"clamps_declined", s.clamps_declined},
      {"clamps_released", s.clamps_released},
      {"forced_opens", s.forced_opens},
      {"declined", s.declined},
      {"saturated", s.saturated},
      {"sleep_s", ToSeconds(s.sleep)},
      {"elapsed_s", ToSeconds(s.elapsed)},
      {"bytes", s.bytes},
      {"mean_slowdown", s.slowdown_count > 0 ? s.slowdown_sum / s.slowdown_count : 1.0},
      {"last_min_rtt_ms", ToSeconds(s.last_min_rtt) * 1e3},
      {"last_handshake_rtt_ms", ToSeconds(s.last_handshake_rtt) * 1e3},
  };
  return j.dump();
}

std::string ShapingMetricsText(const ShapingStats& s) {
  std::string out;
  auto metric = [&out](const char* name, const char* type, const char* help, const std::string& v) {
    out += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " " + type + "\n" +
           name + " " + v + "\n";
  };
  metric("ghostproxy_shaped_downloads_total", "counter", "Downloads a shaper ran on.",
         std::to_string(s.shaped_downloads));
  metric("ghostproxy_shaped_downloads_active", "gauge", "Shaped downloads running now.",
         std::to_string(s.active));
  metric("ghostproxy_shaping_bursts_total", "counter", "Bursts of shaped downloads.",
         std::to_string(s.bursts));
  metric("ghostproxy_shaping_burst_bytes_total", "counter", "Bytes in those bursts.",
         std::to_string(s.burst_bytes));
  metric("ghostproxy_shaping_mean_burst_bytes", "gauge", "Mean size of those bursts.",
         std::to_string(s.bursts > 0 ? s.burst_bytes / s.bursts : 0));
  metric("ghostproxy_shaping_missed_packets_total", "counter",
         "Packets that arrived while the card model slept.", std::to_string(s.missed_packets));
  metric("ghostproxy_shaping_declined_total", "counter",
         "Shaped downloads the eq. 4 cost sent back to plain TCP.", std::to_string(s.declined));
  metric("ghostproxy_shaping_saturated_total", "counter",
         "Shaped downloads that reverted to plain TCP on a saturated link.",
         std::to_string(s.saturated));
  metric("ghostproxy_shaping_sleep_seconds_total", "counter",
         "Estimated time the network card slept between bursts.", std::to_string(ToSeconds(s.sleep)));
  metric("ghostproxy_shaping_slowdown", "gauge",
         "Mean slowdown of shaped downloads against plain TCP at the bursts' rate.",
         std::to_string(s.slowdown_count > 0 ? s.slowdown_sum / s.slowdown_count : 1.0));
  return out;
}

Bytes TunnelShapingThreshold(const ShapingOptions& options) {
  static const long long env = [] {
    const char* v = std::getenv("GHOST_SHAPER_TUNNEL_THRESHOLD");
    return v != nullptr ? std::atoll(v) : -1LL;
  }();
  return env >= 0 ? static_cast<Bytes>(env) : options.threshold;
}

bool SetShapingBuffer(int fd, int bytes) {
  return fd >= 0 && setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &bytes, sizeof bytes) == 0;
}

namespace {

bool EnvIs(const char* name, std::string_view value) {
  const char* v = std::getenv(name);
  return v != nullptr && std::string_view(v) == value;
}

bool ReadTcpInfo(int fd, tcp_info* info) {
  socklen_t len = sizeof *info;
  *info = {};
  return getsockopt(fd, IPPROTO_TCP, TCP_INFO, info, &len) == 0;
}

}  // namespace

void PathMinRtt::SetHandshake(Duration rtt) {
  if (rtt > Duration::zero()) handshake_ = rtt;
}

void PathMinRtt::Sample(Duration rtt) {
  if (rtt <= Duration::zero()) return;
  if (!lowest_sample_ || rtt < *lowest_sample_) lowest_sample_ = rtt;
}

std::optional<Duration> PathMinRtt::value() const {
  if (handshake_ && lowest_sample_) return std::min(*handshake_, *lowest_sample_);
  return handshake_ ? handshake_ : lowest_sample_;
}

std::optional<Duration> HandshakeRtt(int fd) {
  tcp_info info;
  if (fd < 0 || !ReadTcpInfo(fd, &info)) return std::nullopt;
  // ~0u: no sample (tcp_min_rtt's initial value); 0 is no sample either.
  if (info.tcpi_min_rtt == 0 || info.tcpi_min_rtt == ~0u) return std::nullopt;
  return Duration(info.tcpi_min_rtt);
}

UpstreamShaper::UpstreamShaper(Clock* clock, bufferevent* bev, const ShapingOptions& options,
                               Bytes size, bool fixed_at_connect, ShapingStats* stats,
                               std::optional<Duration> handshake_rtt)
    : clock_(clock), bev_(bev), fd_(bufferevent_getfd(bev)), stats_(stats),
      fixed_at_connect_(fixed_at_connect) {
  SetShapingBuffer(fd_, options.buffer);  // harmless if it was set before connect
  buffer_ = options.buffer;
  applied_buffer_ = options.buffer;
  int rcvbuf = 0;
  socklen_t len = sizeof rcvbuf;
  if (getsockopt(fd_, SOL_SOCKET, SO_RCVBUF, &rcvbuf, &len) != 0 || rcvbuf <= 0)
    rcvbuf = 2 * options.buffer;
  lowat_cap_ = rcvbuf / 2;  // tcp_set_rcvlowat caps SO_RCVLOWAT at half a locked buffer

  ShaperOptions so;
  so.mode = options.mode == ShapeMode::kOff ? ShapeMode::kAlways : options.mode;
  so.knob = options.knob;
  so.max_slowdown = options.max_slowdown;
  so.size = size;
  // What one open window holds: measured here as ≈ 0.94 of the doubled buffer (TESTING.md:
  // ≈ 123 KB with SO_RCVBUF = 64 KiB).
  so.window = static_cast<Bytes>(rcvbuf) * 15 / 16;
  so.plain_window = fixed_at_connect ? so.window : 0;
  tcp_info info;
  if (ReadTcpInfo(fd_, &info) && info.tcpi_rcv_mss > 0) so.mss = info.tcpi_rcv_mss;
  if (so.mss < 536) so.mss = 1448;
  if (const char* pct = std::getenv("GHOST_SHAPER_WAKE_PCT")) so.wake_percentile = std::atof(pct);
  // Round 9's two changes, opt-in until measured better (scripts/RESULTS.md, round 9).
  so.settle_after_slow_start = EnvIs("GHOST_SHAPER_SETTLE", "1");
  quiet_bursts_ = EnvIs("GHOST_SHAPER_QUIET_BURSTS", "1");
  one_read_drain_ = EnvIs("GHOST_SHAPER_ONE_READ_DRAIN", "1");
  // Round 10: part-windows are held (ShaperOptions::hold_part_windows); =0 for side-by-side runs.
  if (EnvIs("GHOST_SHAPER_HOLD", "0")) so.hold_part_windows = false;
  if (const char* v = std::getenv("GHOST_SHAPER_HOLD_RTTS")) so.hold_rtts = std::atof(v);
  // Round 12: the ACK clock after a loss (ShaperOptions::ack_clock_after_loss); opt-in, not
  // measured better in E×D (RESULTS.md, round 12).
  if (EnvIs("GHOST_SHAPER_ACK_CLOCK", "1")) so.ack_clock_after_loss = true;
  if (const char* v = std::getenv("GHOST_SHAPER_CLOCK_HOLD_RTTS")) so.clock_hold_rtts = std::atof(v);
  // Round 13: the grant clamped to the sender's cwnd (ShaperOptions::clamp_to_sender).
  if (EnvIs("GHOST_SHAPER_CLAMP", "1")) so.clamp_to_sender = true;
  // Round 14: the clamp only where eq. 4 says it pays (ShaperOptions::clamp_when_pays).
  if (EnvIs("GHOST_SHAPER_CLAMP", "auto")) so.clamp_to_sender = so.clamp_when_pays = true;
  // Round 14: the nap ends for slow start's clocked tail (ShaperOptions::wake_for_slow_start_tail).
  if (EnvIs("GHOST_SHAPER_TAIL_WAKE", "1")) so.wake_for_slow_start_tail = true;
  // Round 15: the tail's wake armed by losses and misses too, for every recent clump (on by
  // default; =0 is round 14's behaviour).
  if (EnvIs("GHOST_SHAPER_CLUMP_WAKE", "0")) so.wake_for_clocked_clumps = false;
  // Round 19: the kernel's delayed ACK in the clump ring (ShaperOptions::delayed_ack; on by
  // default; =0 is round 16's behaviour).
  if (EnvIs("GHOST_SHAPER_DELACK", "0")) so.delayed_ack = Duration::zero();
  // Round 20, both opt-in (not measured better): the ACK a hold owes flushed at the hold's start
  // (ShaperOptions::flush_ack_on_hold), or the hold ended before the delayed-ACK timer fires
  // (ShaperOptions::hold_ends_before_delayed_ack).
  if (EnvIs("GHOST_SHAPER_HOLD_QUICKACK", "1")) so.flush_ack_on_hold = true;
  if (EnvIs("GHOST_SHAPER_HOLD_BEFORE_DELACK", "1")) so.hold_ends_before_delayed_ack = true;
  if (const char* v = std::getenv("GHOST_SHAPER_DELACK_SLACK_MS"))
    so.delayed_ack_slack = Millis(std::atof(v));  // a measurement aid (bench --variants)
  // A measurement aid (bench_shaping.py --variants): Td's floor once a burst holds a whole window.
  if (const char* v = std::getenv("GHOST_SHAPER_TD_FULL_MS")) so.td_full = Millis(std::atof(v));
  // Round 11's two, for side-by-side runs: Td once a whole grant has come, and the wake lead.
  if (const char* v = std::getenv("GHOST_SHAPER_TD_GRANT_MS"))
    so.td_grant = Millis(std::atof(v));
  if (const char* v = std::getenv("GHOST_SHAPER_WAKE_LEAD_MS"))
    so.wake_lead = Millis(std::atof(v));
  start_ = clock_->Now();
  last_arrival_ = start_;
  progress_at_ = start_;
  shaper_ = std::make_unique<DownloadShaper>(so, start_);
  // GHOST_SHAPER_HANDSHAKE_RTT=0: a measurement aid for side-by-side runs (bench_shaping.py
  // --rtt-ab): the minimum RTT as before round 9 (the smallest receive estimate from the
  // shaper's start, not sampled at opens with a capture).
  const char* hs = std::getenv("GHOST_SHAPER_HANDSHAKE_RTT");
  legacy_rtt_ = hs != nullptr && std::string_view(hs) == "0";
  if (handshake_rtt && !legacy_rtt_) {
    rtt_.SetHandshake(*handshake_rtt);
    if (rtt_.value()) shaper_->SetMinRtt(*rtt_.value());
  }
  if (ReadTcpInfo(fd_, &info)) {
    UpdateRtt(info);
    ooo_seen_ = info.tcpi_rcv_ooopack;
  }

  event_base* base = bufferevent_get_base(bev_);
  watch_ = event_new(base, fd_, EV_READ | EV_PERSIST, &UpstreamShaper::OnWatch, this);
  // GHOST_SHAPER_COARSE_TIMER=1: libevent's own timer, as before round 11 (side-by-side runs).
  if (!EnvIs("GHOST_SHAPER_COARSE_TIMER", "1")) {
    timer_fd_ = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
  }
  timer_ = timer_fd_ >= 0
               ? event_new(base, timer_fd_, EV_READ | EV_PERSIST, &UpstreamShaper::OnTimerEvent, this)
               : evtimer_new(base, &UpstreamShaper::OnTimerEvent, this);
  deliver_ = event_new(base, -1, 0, &UpstreamShaper::OnDeliver, this);
  evbuffer_add_cb(bufferevent_get_input(bev_), &UpstreamShaper::OnInput, this);

  if (const char* path = std::getenv("GHOST_SHAPER_CARD_LOG")) {
    // The benchmark's record of the card model's decisions (scripts/bench-shaping.sh prices
    // them against the capture): "start|sleep|wake|end REALTIME_NS", CLOCK_REALTIME like the
    // capture's timestamps.
    card_log_ = std::fopen(path, "ae");
    if (card_log_ != nullptr) {
      timespec real{};
      clock_gettime(CLOCK_REALTIME, &real);
      real_offset_ = std::chrono::duration_cast<Duration>(std::chrono::seconds(real.tv_sec) +
                                                          std::chrono::nanoseconds(real.tv_nsec)) -
                     start_.time_since_epoch();
      LogCard("start", start_);
    }
  }
  // Owned by shaper_, which this outlives.
  shaper_->SetCardListener([this](TimePoint when, bool awake) { OnCard(when, awake); });
  std::string why;
  tap_ = ArrivalTap::Open(fd_, clock_, &why);
  if (tap_) {
    tap_event_ = event_new(base, tap_->fd(), EV_READ | EV_PERSIST, &UpstreamShaper::OnTapEvent, this);
    event_add(tap_event_, nullptr);
    ++stats_->per_packet;
  } else if (std::getenv("GHOST_SHAPER_TRACE")) {
    std::fprintf(stderr, "shaper: no per-packet arrivals (%s)\n", why.c_str());
  }
  ++stats_->shaped_downloads;
  stats_->knob_used = options.knob;
  ++stats_->active;
  Step();
}

UpstreamShaper::~UpstreamShaper() {
  const TimePoint now = clock_->Now();
  shaper_->Finish(now);
  if (card_log_ != nullptr) {
    LogCard("end", now);
    std::fclose(card_log_);
  }
  evbuffer_remove_cb(bufferevent_get_input(bev_), &UpstreamShaper::OnInput, this);
  if (watch_) event_free(watch_);
  if (timer_) event_free(timer_);
  if (timer_fd_ >= 0) close(timer_fd_);
  if (deliver_) event_free(deliver_);
  if (tap_event_) event_free(tap_event_);
  tap_.reset();
  int one = 1;
  setsockopt(fd_, SOL_SOCKET, SO_RCVLOWAT, &one, sizeof one);
  if (!paused_) bufferevent_enable(bev_, EV_READ);
  // Bytes ReadQueued moved into the input that the owner was not yet told of: tell it from the
  // loop (deferred: the owner may be destroying this shaper right now).
  if (deliver_pending_) bufferevent_trigger(bev_, EV_READ, BEV_TRIG_DEFER_CALLBACKS);

  const ShaperStats& s = shaper_->stats();
  --stats_->active;
  stats_->bursts += s.bursts;
  stats_->burst_bytes += s.burst_bytes;
  stats_->missed_packets += s.missed_packets;
  stats_->lost_opens += s.lost_opens;
  stats_->bad_bursts += s.bad_bursts;
  stats_->held_bursts += s.held_bursts;
  stats_->clocked_bursts += s.clocked_bursts;
  stats_->clamped_bursts += s.clamped_bursts;
  stats_->clamps_declined += s.clamps_declined;
  stats_->clamps_released += s.clamps_released;
  if (s.declined) ++stats_->declined;
  if (s.saturated) ++stats_->saturated;
  stats_->sleep += s.sleep;
  const Duration elapsed = now - start_;
  stats_->elapsed += elapsed;
  stats_->last_min_rtt = shaper_->min_rtt();
  stats_->last_handshake_rtt = rtt_.handshake().value_or(Duration::zero());
  stats_->bytes += bytes_;
  if (shaper_->rate() > 0 && bytes_ > 0 && s.bursts > 0) {
    // Slowdown against plain TCP at the bursts' rate: one RTT, then the bytes at that rate.
    const double plain = ToSeconds(shaper_->min_rtt()) + static_cast<double>(bytes_) / shaper_->rate();
    if (plain > 0) {
      stats_->slowdown_sum += ToSeconds(elapsed) / plain;
      ++stats_->slowdown_count;
    }
  }
}

void UpstreamShaper::OnCard(TimePoint when, bool awake) {
  if (card_log_ != nullptr) LogCard(awake ? "wake" : "sleep", when);
  if (card_backend_ == nullptr || naps_hopeless_) return;
  if (awake) {
    if (daemon_napping_) card_backend_->NapEnd();
    daemon_napping_ = false;
    return;
  }
  std::optional<TimePoint> due = shaper_->nap_due();
  const TimePoint now = clock_->Now();
  if (!due || *due <= now) return;
  daemon_napping_ = true;  // until the reply says otherwise; a NapEnd then does no harm
  std::weak_ptr<bool> alive = alive_;
  card_backend_->NapBegin(*due - now, shaper_->min_rtt(), shaper_->wake_lead(),
                          [this, alive](bool napping, bool hopeless) {
                            if (alive.expired()) return;
                            if (!napping && !shaper_->card_awake()) daemon_napping_ = false;
                            if (hopeless) naps_hopeless_ = true;
                          });
}

void UpstreamShaper::LogCard(const char* what, TimePoint when) {
  const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(when.time_since_epoch() + real_offset_);
  std::fprintf(card_log_, "%s %lld\n", what, static_cast<long long>(ns.count()));
}

void UpstreamShaper::SetPaused(bool paused) {
  paused_ = paused;
  Step();
}

std::size_t UpstreamShaper::Queued() const {
  int n = 0;
  if (ioctl(fd_, SIOCINQ, &n) != 0 || n < 0) return 0;
  return static_cast<std::size_t>(n);
}

void UpstreamShaper::UpdateRtt(const tcp_info& info) {
  // Round 19: the delayed-ACK timeout the kernel would use now (tcpi_ato: at least 40 ms, more
  // as the arrivals spread): the shaper's model of when the kernel ACKs what it did not ACK at
  // once (the timer's jiffy is in ShaperOptions::delayed_ack_slack).
  if (info.tcpi_ato > 0) shaper_->SetDelayedAck(Duration(info.tcpi_ato));
  // The round trip from an open to its data is the receiver's: the handshake's RTT (given by
  // the owner) lowered by tcpi_rcv_rtt samples (from TCP timestamps), never raised (PathMinRtt).
  // tcpi_min_rtt now comes from the few segments this side sent (the request) and was seen far
  // below the path's RTT on the emulated link: used only when nothing else is known.
  rtt_.Sample(Duration(info.tcpi_rcv_rtt));
  if (std::optional<Duration> v = rtt_.value()) {
    shaper_->SetMinRtt(*v);
  } else if (info.tcpi_min_rtt > 0 && info.tcpi_min_rtt != ~0u) {
    shaper_->SetMinRtt(Duration(info.tcpi_min_rtt));
  }
}

bool UpstreamShaper::MissingData() {
  tcp_info info;
  if (!ReadTcpInfo(fd_, &info)) return false;
  UpdateRtt(info);
  const bool missing = info.tcpi_rcv_ooopack != ooo_seen_;
  ooo_seen_ = info.tcpi_rcv_ooopack;
  return missing;
}

void UpstreamShaper::OnInput(evbuffer*, const evbuffer_cb_info* info, void* arg) {
  auto* self = static_cast<UpstreamShaper*>(arg);
  if (info->n_added == 0) return;
  const TimePoint now = self->clock_->Now();
  self->bytes_ += info->n_added;  // every byte read from the socket, once
  if (self->tap_) {
    // The capture times the packets; the read only says the socket was (partly) emptied.
    self->DrainTap();
    self->awaiting_burst_ = false;
    if (self->draining_ && !self->drain_first_read_) self->drain_first_read_ = now;
    if (self->draining_ && self->Queued() == 0) {
      self->draining_ = false;
      self->awaiting_burst_ = true;
      self->Opened(std::max(self->OpenedAt(now), self->last_arrival_));
    }
  } else if (!self->draining_) {
    // Reading freely, or the first bytes of a burst after an open: each read is an arrival.
    self->awaiting_burst_ = false;
    self->shaper_->OnTimer(now);
    self->shaper_->OnArrival(now, info->n_added, self->MissingData());
    self->last_arrival_ = now;
    self->progress_at_ = now;
  } else {
    if (!self->drain_first_read_) self->drain_first_read_ = now;
    if (self->Queued() == 0) {
      // The window is open again: everything queued has been read.
      self->draining_ = false;
      self->seen_ = 0;
      self->awaiting_burst_ = true;
      self->Opened(std::max(self->OpenedAt(now), self->last_arrival_));
    }
  }
  if (!self->reading_direct_) self->Step();  // ReadQueued's caller steps on itself
}

void UpstreamShaper::DrainTap() {
  if (!tap_) return;
  tap_->Drain([this](const TappedSegment& seg) {
    const TimePoint at = std::max(seg.at, last_arrival_);
    if (seg.payload > 0) {
      shaper_->OnTimer(at);
      shaper_->OnArrival(at, seg.payload, seg.missing);
      last_arrival_ = at;
      progress_at_ = std::max(progress_at_, at);
      if (!draining_) {
        awaiting_burst_ = false;  // the burst began: the window closes
        forced_await_read_ = false;
      }
    }
    if (seg.closing) peer_closing_ = true;
  });
}

void UpstreamShaper::OnTapEvent(int, short, void* arg) {
  auto* self = static_cast<UpstreamShaper*>(arg);
  self->DrainTap();
  self->shaper_->OnTimer(std::max(self->clock_->Now(), self->last_arrival_));
  self->Step();
}

bool UpstreamShaper::Observe(TimePoint now, bool woke_readable) {
  if (tap_) {
    DrainTap();
    return true;
  }
  const std::size_t q = Queued();
  if (q > seen_) {
    tcp_info info;
    TimePoint at = now;
    // Woken by the read event, the data has just come (SO_RCVLOWAT wakes per segment);
    // from the timer, TCP_INFO says when (to the millisecond) the last segment came.
    if (!woke_readable && ReadTcpInfo(fd_, &info)) at = now - Millis(info.tcpi_last_data_recv);
    at = std::max(at, last_arrival_);
    const Bytes added = q - seen_;
    seen_ = q;
    shaper_->OnTimer(at);
    shaper_->OnArrival(at, added, MissingData());
    last_arrival_ = at;
    progress_at_ = std::max(progress_at_, at);
    return true;
  }
  return !woke_readable;
}

void UpstreamShaper::OnWatch(int, short, void* arg) {
  auto* self = static_cast<UpstreamShaper*>(arg);
  const TimePoint now = self->clock_->Now();
  if (!self->Observe(now, /*woke_readable=*/true)) {
    // Readable with nothing new: the origin closed or reset. Read, so the owner sees it.
    self->StartDrain();
  }
  self->shaper_->OnTimer(now);
  self->Step();
}

void UpstreamShaper::ArmTimer(std::optional<Duration> in) {
  if (timer_fd_ < 0) {
    event_del(timer_);
    if (!in) return;
    timeval tv{static_cast<time_t>(in->count() / 1000000), static_cast<suseconds_t>(in->count() % 1000000)};
    event_add(timer_, &tv);
    return;
  }
  // Persistent on the descriptor; a zero it_value disarms it.
  const auto ns = in ? std::max<std::int64_t>(
                           1, std::chrono::duration_cast<std::chrono::nanoseconds>(*in).count())
                     : 0;
  itimerspec spec{};
  spec.it_value.tv_sec = static_cast<time_t>(ns / 1000000000);
  spec.it_value.tv_nsec = static_cast<long>(ns % 1000000000);
  timerfd_settime(timer_fd_, 0, &spec, nullptr);
  if (in && !event_pending(timer_, EV_READ, nullptr)) event_add(timer_, nullptr);
}

void UpstreamShaper::OnTimerEvent(int, short, void* arg) {
  auto* self = static_cast<UpstreamShaper*>(arg);
  if (self->timer_fd_ >= 0) {
    std::uint64_t expirations = 0;
    if (read(self->timer_fd_, &expirations, sizeof expirations) < 0) {
      // EAGAIN: disarmed or re-armed since it fired; the deadlines below decide anyway.
    }
  }
  self->DrainTap();
  const TimePoint now = std::max(self->clock_->Now(), self->last_arrival_);
  if (!self->reading_) self->Observe(now, /*woke_readable=*/false);
  self->shaper_->OnTimer(now);
  self->Step();
}

void UpstreamShaper::ForceOpen(TimePoint now, const char* why) {
  ++stats_->forced_opens;
  if (std::getenv("GHOST_SHAPER_TRACE") || card_log_ != nullptr) {
    std::fprintf(stderr, "ghostproxy: shaper: opening a closed window (%s; state %s, %zu bytes queued)\n",
                 why, ShaperStateName(shaper_->state()), Queued());
  }
  Observe(now, /*woke_readable=*/false);
  progress_at_ = now;
  if (Queued() == 0) {
    seen_ = 0;
    awaiting_burst_ = true;
    // Read until the next data, so the bufferevent's read timeout sees an origin that stalls.
    forced_await_read_ = true;
    Opened(std::max(now, last_arrival_));
  } else {
    StartDrain();
    if (one_read_drain_ && !reading_direct_) ReadQueued(now);
  }
}

void UpstreamShaper::Opened(TimePoint at) {
  if (tap_ && !legacy_rtt_) {
    // With a capture MissingData (which samples the RTT) is never called: sample once per
    // open, before the shaper times the next burst from it.
    tcp_info info;
    if (ReadTcpInfo(fd_, &info)) UpdateRtt(info);
  }
  shaper_->OnOpened(at);
  if (shaper_->reads_freely() || !quiet_bursts_) return;
  // No ACK until the next open (TCP_QUICKACK off: delayed ACKs, whose timer, at least 40 ms,
  // the next open's window update normally cancels). An ACK sent while the burst comes gives
  // the sender credit although nothing was read: with a window scale of 2^s the kernel never
  // shrinks the offered window, it rounds what is left up to 2^s bytes (tcp_select_window), so
  // each ACK moves the right edge up to 2^s − 1 bytes. The sender sends that much one round
  // trip after the ACK, in the middle of the next nap (round 8, --diagnose at 60 ms / 0%: a
  // 1.5–2.3 KB tail one min RTT after each burst's first segment, whose quick ACK carried the
  // credit). Out-of-order data is still ACKed at once (the kernel's rule), so loss recovery
  // keeps its duplicate ACKs.
  int zero = 0;
  setsockopt(fd_, IPPROTO_TCP, TCP_QUICKACK, &zero, sizeof zero);
}

void UpstreamShaper::StartDrain() {
  draining_ = true;
  drain_first_read_.reset();
}

bool UpstreamShaper::ReadQueued(TimePoint now) {
  // libevent reads at most 4 KB per read callback (evbuffer_read caps a read at
  // EVBUFFER_MAX_READ whatever FIONREAD says, and this libevent has no evbuffer_set_max_read),
  // one callback per loop turn, and each read sends a window update: the window opened in
  // 4 KB steps, up to 5 ms apart under load, and the origin sent a part-window for each
  // (round 8). One recvmsg of everything queued frees the whole buffer at once: one update.
  // Bytes are only moved, in order, into the same evbuffer the bufferevent would have filled.
  evbuffer* in = bufferevent_get_input(bev_);
  bool any = false;
  for (int turn = 0; turn < 4 && draining_; ++turn) {
    const std::size_t q = Queued();
    if (q == 0) break;
    evbuffer_iovec vec[2];
    const int n = evbuffer_reserve_space(in, static_cast<ev_ssize_t>(q), vec, 2);
    if (n <= 0) break;
    iovec iov[2];
    for (int i = 0; i < n; ++i) iov[i] = {vec[i].iov_base, vec[i].iov_len};
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = static_cast<std::size_t>(n);
    // With data queued, recvmsg returns data before any pending error or EOF (tcp_recvmsg
    // reports those only when it copied nothing); if it returns nothing anyway, nothing is
    // committed and the bufferevent's own read (enabled while draining) sees what happened.
    const ssize_t got = recvmsg(fd_, &msg, MSG_DONTWAIT);
    if (got <= 0) break;
    std::size_t left = static_cast<std::size_t>(got);
    int used = 0;
    for (int i = 0; i < n && left > 0; ++i) {
      vec[i].iov_len = std::min(left, vec[i].iov_len);
      left -= vec[i].iov_len;
      used = i + 1;
    }
    if (!drain_first_read_) drain_first_read_ = now;
    reading_direct_ = true;
    evbuffer_commit_space(in, vec, used);  // OnInput counts the bytes and, emptied, opens
    reading_direct_ = false;
    any = true;
  }
  // The owner's read callback, from the loop (it may end this download and free this shaper).
  if (any && !deliver_pending_) {
    deliver_pending_ = true;
    event_active(deliver_, EV_TIMEOUT, 0);
  }
  return any;
}

void UpstreamShaper::OnDeliver(int, short, void* arg) {
  auto* self = static_cast<UpstreamShaper*>(arg);
  self->deliver_pending_ = false;
  // Last: the owner's callback may destroy this shaper.
  bufferevent_trigger(self->bev_, EV_READ, 0);
}

TimePoint UpstreamShaper::OpenedAt(TimePoint now) {
  // The window opened at the drain's first read: the kernel sends the window update as soon
  // as a read frees room, so the next burst can come one round trip after that read, however
  // long the rest of the drain takes (measured at load ~20: a drain in two reads 5 ms apart
  // whose burst came on the first one's update, 5 ms before the shaper's wake-up).
  const TimePoint first = drain_first_read_.value_or(now);
  drain_first_read_.reset();
  return std::min(first, now);
}

Duration UpstreamShaper::WatchdogBound() const {
  // Longer than any wait of the shaper with the window closed: a burst's end (≤ half a min
  // RTT after its last arrival), a straggler's window up to the lost-open deadline (two min
  // RTTs and 200 ms after the open).
  return 4 * shaper_->min_rtt() + Millis(300);
}

void UpstreamShaper::SetReading(bool on) {
  if (on == reading_) return;
  progress_at_ = std::max(progress_at_, clock_->Now());  // the watchdog counts from a close
  reading_ = on;
  if (on) {
    bufferevent_enable(bev_, EV_READ);
  } else {
    bufferevent_disable(bev_, EV_READ);
  }
}

void UpstreamShaper::Watch(bool on) {
  // Past SO_RCVLOWAT's cap the socket would stay readable: the timer looks instead.
  if (on && seen_ + 1 > static_cast<std::size_t>(lowat_cap_)) on = false;
  // Not watching, SO_RCVLOWAT is back to 1: the bufferevent must see every byte when it reads.
  const int lowat = on ? static_cast<int>(seen_ + 1) : 1;
  if (lowat != lowat_) {
    setsockopt(fd_, SOL_SOCKET, SO_RCVLOWAT, &lowat, sizeof lowat);
    lowat_ = lowat;
  }
  if (on == watching_) return;
  watching_ = on;
  if (on) {
    event_add(watch_, nullptr);
  } else {
    event_del(watch_);
  }
}

void UpstreamShaper::ReleaseBuffer() {
  if (buffer_released_) return;
  buffer_released_ = true;
  // The kernel caps the value at net.core.rmem_max (and doubles it). Measured on
  // scripts/linkemu.sh (60 ms, 20 Mb/s, 5 MB): a declined download kept at the 128 KiB
  // shaping buffer took 3.3 s, autotuned plain TCP 2.4 s. The window can grow back only when
  // the buffer was fixed after the handshake (the window scale was chosen for the large one).
  int big = 64 << 20;
  setsockopt(fd_, SOL_SOCKET, SO_RCVBUF, &big, sizeof big);
  // A locked buffer ends autotuning, which is what raised the window clamp; without raising
  // it too the window stayed where the clamp was when shaping began (same 3.3 s).
  int got = 0;
  socklen_t len = sizeof got;
  if (getsockopt(fd_, SOL_SOCKET, SO_RCVBUF, &got, &len) == 0 && got > 0) {
    int clamp = got / 2;
    setsockopt(fd_, IPPROTO_TCP, TCP_WINDOW_CLAMP, &clamp, sizeof clamp);
  }
}

void UpstreamShaper::ApplyGrant() {
  if (buffer_released_) return;
  const double share = shaper_->grant_share();
  const int want = share >= 1 ? buffer_
                              : std::max(1, static_cast<int>(std::lround(buffer_ * share)));
  if (want == applied_buffer_) return;
  if (SetShapingBuffer(fd_, want)) {
    applied_buffer_ = want;
    if (std::getenv("GHOST_SHAPER_TRACE")) {
      std::fprintf(stderr, "ghostproxy: shaper: grant %s: SO_RCVBUF %d (share %.2f of %d)\n",
                   share >= 1 ? "unclamped" : "clamped", want, share, buffer_);
    }
  }
}

void UpstreamShaper::Step() {
  DrainTap();
  const TimePoint now = std::max(clock_->Now(), last_arrival_);
  if (shaper_->wants_ack_flush()) {
    // Round 20: a hold began with an ACK owed for the part: send it now (TCP_QUICKACK = 1 sends
    // a scheduled ACK when over one MSS is unacknowledged; nothing is read, so it moves the
    // cumulative ACK, not the window's right edge), so what it releases comes one min RTT after
    // now rather than after the kernel's delayed-ACK timer.
    int one = 1;
    setsockopt(fd_, IPPROTO_TCP, TCP_QUICKACK, &one, sizeof one);
    shaper_->OnAckFlushed(now);
    if (std::getenv("GHOST_SHAPER_TRACE")) std::fprintf(stderr, "%.4f ack flushed (hold)\n", ToSeconds(now));
  }
  if (shaper_->stats().declined && !fixed_at_connect_) ReleaseBuffer();
  // Back to the whole buffer once the shaper reads freely (plain TCP, slow start again).
  if (shaper_->reads_freely() && applied_buffer_ != buffer_) ApplyGrant();
  if (!shaper_->reads_freely() && shaper_->wants_open() && !draining_ && !paused_) {
    ApplyGrant();
    Observe(now, /*woke_readable=*/false);
    if (Queued() == 0) {
      seen_ = 0;
      awaiting_burst_ = true;
      Opened(std::max(now, last_arrival_));
    } else {
      StartDrain();
    }
  }
  // Drain in one read (not while paused: back-pressure wins, the drain waits).
  if (draining_ && !paused_ && one_read_drain_ && !reading_direct_) ReadQueued(now);
  const bool freely = shaper_->reads_freely();
  if (std::getenv("GHOST_SHAPER_TRACE")) {
    std::fprintf(stderr, "%.4f %s free=%d drain=%d await=%d wants=%d q=%zu seen=%zu paused=%d awake=%d rtt=%.1fms rate=%.0f W=%.0f td=%.1fms\n",
                 ToSeconds(now), ShaperStateName(shaper_->state()), freely, draining_, awaiting_burst_,
                 shaper_->wants_open(), Queued(), seen_, paused_, shaper_->card_awake(),
                 ToSeconds(shaper_->min_rtt()) * 1e3, shaper_->rate(), shaper_->window_packets(),
                 ToSeconds(shaper_->BurstEndThreshold()) * 1e3);
  }
  if (!freely && was_freely_) awaiting_burst_ = Queued() == 0;  // bursts begin
  was_freely_ = freely;
  // Waiting for a burst with the socket empty: without a capture the bufferevent reads, and its
  // first read ends the wait (its read timeout still catches an origin that stalls between
  // bursts). With a capture it does not read: every byte read while the burst comes frees room
  // that the next ACK advertises, and the sender sends that much more one round trip later, in
  // the middle of the next nap (round 8, --diagnose: most missed packets at 60 ms / 0% were such
  // ACK-clocked tails). The capture sees the burst begin; the watchdog's forced open (which
  // reads until data comes) still catches an origin that stalls.
  // Off unless GHOST_SHAPER_QUIET_BURSTS=1 (proxy/shaper.h: measured mixed in round 8).
  // While the grant is clamped to the sender's cwnd the awaited burst is not read either (round
  // 13): the byte read would be a byte of grant past the sender's cwnd.
  const bool quiet = quiet_bursts_ || shaper_->grant_clamp() > 0;
  bool read = freely || draining_ ||
              (awaiting_burst_ && (!tap_ || !quiet || forced_await_read_)) || peer_closing_;
  if (!read && !paused_) {
    // The window is closed. The shaper must be waiting for something that comes whether or
    // not the origin can send: a deadline (the burst's end, a wake-up, a lost open) or the
    // open. Waiting for an arrival alone can last forever (a full buffer: zero window).
    const char* why = nullptr;
    if (!shaper_->wants_open() && !shaper_->NextDeadline()) {
      // What is queued but not yet counted may start a burst (and so its deadline).
      Observe(now, /*woke_readable=*/false);
      if (!shaper_->NextDeadline()) why = "nothing pending";
    } else if (reading_ ? false : now - progress_at_ >= WatchdogBound()) {
      why = "watchdog";
    }
    if (why != nullptr) {
      ForceOpen(now, why);
      read = true;
    }
  }
  SetReading(!paused_ && read);
  Watch(!tap_ && !paused_ && !read);
  std::optional<TimePoint> next = shaper_->NextDeadline();
  if (!next && !tap_ && !read && !paused_ && !watching_) {
    // Window closed and past the SO_RCVLOWAT cap with no deadline: look again soon.
    next = now + Millis(3);
  }
  if (!read && !paused_) {
    // The watchdog: a closed window is looked at again by its bound at the latest.
    const TimePoint bound = progress_at_ + WatchdogBound();
    if (!next || bound < *next) next = bound;
  }
  std::optional<Duration> in;
  // A hair past the deadline (the precise timer 20 µs, libevent's 100 µs), so it is due when run.
  if (next) in = std::max(Duration::zero(), *next - now) + Duration(timer_fd_ >= 0 ? 20 : 100);
  ArmTimer(in);
}

}  // namespace ghost
