// nfq_delay: the one-way delay of the link emulator (scripts/linkemu.sh; this kernel has no
// netem). It binds NFQUEUE queues, holds each queued packet's verdict for a fixed delay and then
// accepts it, in arrival order.
//
//   nfq_delay --queue N [--queue M ...] [--delay-ms D [--delay-ms E ...]] [--maxlen 65536]
//             [--loss-pct P ...] [--jitter-ms J ...] [--jitter-shape K] [--seed S] [--link NAME]
//
// --loss-pct drops that share of packets at random; --jitter-ms adds a gamma-distributed extra
// delay of that mean (shape --jitter-shape, default 2) without reordering (a packet never
// leaves before the one ahead of it). Like --delay-ms, one value for all queues or one each.
//
// One --delay-ms applies to every queue; several give each queue its own, in order (so the
// downlink and the uplink of a link can differ). The default is 20 ms.
//
// One thread, one epoll loop: the netlink socket, one timerfd per queue (armed at the first
// held packet's deadline, never while the queue is empty) and a signalfd. No thread sleeps per
// packet; the packets due at a timer tick leave with one batch verdict (DelayLine). Only the
// packet metadata is copied to user space (NFQNL_COPY_META) and GSO packets stay whole, so the
// delayer carries hundreds of Mb/s. The queue is fail-open: when it is full the kernel accepts
// rather than drops.
//
// SIGTERM/SIGINT: accept every held packet, unbind, print per-queue counts, exit 0.
// Exit codes: 0 clean shutdown, 1 runtime failure (cannot bind, netlink error), 2 bad arguments.
// --link NAME only labels the process, so `linkemu.sh down` can find the delayers of one link.

// glibc's <netinet/in.h> before the kernel's <linux/in.h> (pulled in by netfilter.h), or the
// two define the same structs.
#include <arpa/inet.h>
#include <libnetfilter_queue/libnetfilter_queue.h>
#include <linux/netfilter.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "tests/linkemu/delay_line.h"

namespace {

using ghost::linkemu::DelayLine;
using ghost::linkemu::Nanos;

constexpr int kFailed = 1;
constexpr int kUsage = 2;
// Packets due within this much of a timer tick leave with it: one verdict per burst rather than
// per packet, at most 0.1 ms early (0.5% of a 20 ms delay).
constexpr Nanos kCoalesce = std::chrono::microseconds(100);
// Netlink receive buffer: a few hundred ms of packet metadata at line rate, so a slow turn of
// the loop does not lose messages (a lost message's packet still leaves with the next batch
// verdict, which accepts every id up to the one given).
constexpr int kRcvBuf = 8 << 20;

struct Options {
  std::vector<int> queues;
  std::vector<double> delays_ms;  // one for all queues, or one per queue
  std::vector<double> loss_pct;   // same
  std::vector<double> jitter_ms;  // same: mean of the gamma-distributed extra delay
  double jitter_shape = 2;
  std::uint64_t seed = 0;         // 0: from the clock
  std::uint32_t maxlen = 65536;
  std::string link;  // a label only
};

Nanos Now() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return std::chrono::seconds(ts.tv_sec) + Nanos(ts.tv_nsec);
}

class Fd {
 public:
  explicit Fd(int fd = -1) : fd_(fd) {}
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() {
    if (fd_ >= 0) close(fd_);
  }
  int get() const { return fd_; }

 private:
  int fd_;
};

struct NfqCloser {
  void operator()(nfq_handle* h) const { nfq_close(h); }
};

// One bound queue and its delay line. Owned by Delayer; the nfq_q_handle belongs to the
// Delayer's nfq_handle and is destroyed by Unbind (or with the handle).
class DelayedQueue {
 public:
  DelayedQueue(int num, Nanos delay, ghost::linkemu::Impairment impairment)
      : num_(num), line_(delay, kCoalesce), impairment_(std::move(impairment)) {}
  DelayedQueue(const DelayedQueue&) = delete;
  DelayedQueue& operator=(const DelayedQueue&) = delete;

  // Binds queue `num_` on `h` in metadata-only, fail-open mode. Returns false with a message
  // on stderr on failure.
  bool Bind(nfq_handle* h, std::uint32_t maxlen) {
    qh_ = nfq_create_queue(h, static_cast<std::uint16_t>(num_), &DelayedQueue::OnPacket, this);
    if (qh_ == nullptr) {
      std::fprintf(stderr,
                   "nfq_delay: cannot bind NFQUEUE queue %d: %s (run as root; is another "
                   "program bound to that queue in this network namespace?)\n",
                   num_, std::strerror(errno));
      return false;
    }
    if (nfq_set_mode(qh_, NFQNL_COPY_META, 0) < 0) {
      std::fprintf(stderr, "nfq_delay: queue %d: cannot set metadata-only copy mode: %s\n", num_,
                   std::strerror(errno));
      return false;
    }
    if (nfq_set_queue_maxlen(qh_, maxlen) < 0) {
      std::fprintf(stderr, "nfq_delay: queue %d: cannot set queue length %u: %s\n", num_, maxlen,
                   std::strerror(errno));
      return false;
    }
    const std::uint32_t flags = NFQA_CFG_F_FAIL_OPEN | NFQA_CFG_F_GSO;
    if (nfq_set_queue_flags(qh_, flags, flags) < 0) {
      std::fprintf(stderr, "nfq_delay: queue %d: cannot set fail-open/GSO flags: %s\n", num_,
                   std::strerror(errno));
      return false;
    }
    timer_ = std::make_unique<Fd>(timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC));
    if (timer_->get() < 0) {
      std::fprintf(stderr, "nfq_delay: timerfd_create: %s\n", std::strerror(errno));
      return false;
    }
    return true;
  }

  int timer_fd() const { return timer_->get(); }

  // Timer tick: accepts the packets that are due and re-arms for the next one.
  void OnTimer() {
    std::uint64_t expirations;
    (void)!read(timer_->get(), &expirations, sizeof(expirations));
    armed_.reset();
    if (auto last = line_.TakeDue(Now())) Accept(*last);
    Rearm();
  }

  // Arms the timer at the first held packet's deadline if it is not armed there already;
  // disarms it when nothing is held.
  void Rearm() {
    std::optional<Nanos> next = line_.NextDeadline();
    if (next == armed_) return;
    itimerspec its{};
    if (next) {
      its.it_value.tv_sec = static_cast<time_t>(next->count() / 1'000'000'000);
      its.it_value.tv_nsec = static_cast<long>(next->count() % 1'000'000'000);
    }
    if (timerfd_settime(timer_->get(), TFD_TIMER_ABSTIME, &its, nullptr) < 0) {
      std::fprintf(stderr, "nfq_delay: timerfd_settime: %s\n", std::strerror(errno));
      std::abort();  // an unarmed timer would hold packets for ever
    }
    armed_ = next;
  }

  // Shutdown: accepts everything still held (and any id up to the newest seen).
  void AcceptAll() {
    line_.TakeAll();
    if (newest_ && newest_ != accepted_) Accept(*newest_);
  }

  void Unbind() {
    if (qh_ != nullptr) nfq_destroy_queue(qh_);
    qh_ = nullptr;
  }

  void PrintCounts() const {
    std::fprintf(stderr,
                 "nfq_delay: queue %d: %llu packets, %llu dropped, %llu verdicts, at most %zu "
                 "held, %llu verdict errors\n",
                 num_, static_cast<unsigned long long>(packets_),
                 static_cast<unsigned long long>(dropped_),
                 static_cast<unsigned long long>(verdicts_), line_.max_held(),
                 static_cast<unsigned long long>(verdict_errors_));
  }

 private:
  // libnetfilter_queue callback, from nfq_handle_packet on the loop thread. No exception may
  // leave it (C caller); allocation failure aborts.
  static int OnPacket(nfq_q_handle* /*qh*/, nfgenmsg* /*msg*/, nfq_data* nfad, void* data) {
    auto* self = static_cast<DelayedQueue*>(data);
    const nfqnl_msg_packet_hdr* hdr = nfq_get_msg_packet_hdr(nfad);
    if (hdr == nullptr) return 0;
    const std::uint32_t id = ntohl(hdr->packet_id);
    const ghost::linkemu::Impairment::Fate fate = self->impairment_.Next();
    if (fate.drop) {
      // Out of the kernel queue now; later batch verdicts skip it.
      ++self->dropped_;
      if (nfq_set_verdict(self->qh_, id, NF_DROP, 0, nullptr) < 0) ++self->verdict_errors_;
      return 0;
    }
    try {
      self->line_.Push(Now(), id, fate.extra);
    } catch (...) {
      std::fprintf(stderr, "nfq_delay: out of memory holding packets\n");
      std::abort();
    }
    self->newest_ = id;
    ++self->packets_;
    return 0;
  }

  // One verdict accepts every packet of the queue with an id up to `last`, in queue order.
  void Accept(std::uint32_t last) {
    ++verdicts_;
    accepted_ = last;
    if (nfq_set_verdict_batch(qh_, last, NF_ACCEPT) < 0) {
      if (verdict_errors_++ == 0) {
        std::fprintf(stderr, "nfq_delay: queue %d: verdict failed: %s\n", num_,
                     std::strerror(errno));
      }
    }
  }

  const int num_;
  DelayLine line_;
  ghost::linkemu::Impairment impairment_;
  std::uint64_t dropped_ = 0;
  nfq_q_handle* qh_ = nullptr;
  std::unique_ptr<Fd> timer_;
  std::optional<Nanos> armed_;
  std::optional<std::uint32_t> newest_;    // the last packet read
  std::optional<std::uint32_t> accepted_;  // the last id given a verdict
  std::uint64_t packets_ = 0;
  std::uint64_t verdicts_ = 0;
  std::uint64_t verdict_errors_ = 0;
};

// The event loop: the netlink socket, the queues' timers and the termination signals.
class Delayer {
 public:
  explicit Delayer(const Options& opt) : opt_(opt) {}

  // Opens netlink, binds the queues and builds the epoll set. False (message printed) on
  // failure.
  bool Start() {
    handle_.reset(nfq_open());
    if (!handle_) {
      std::fprintf(stderr, "nfq_delay: cannot open nfnetlink: %s (run as root)\n",
                   std::strerror(errno));
      return false;
    }
    const int fd = nfq_fd(handle_.get());
    if (setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &kRcvBuf, sizeof(kRcvBuf)) < 0) {
      (void)setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &kRcvBuf, sizeof(kRcvBuf));
    }
    for (std::size_t i = 0; i < opt_.queues.size(); ++i) {
      const double ms = opt_.delays_ms.size() == 1 ? opt_.delays_ms[0] : opt_.delays_ms[i];
      const auto delay =
          std::chrono::duration_cast<Nanos>(std::chrono::duration<double, std::milli>(ms));
      auto per_queue = [&](const std::vector<double>& v) {
        return v.empty() ? 0.0 : v.size() == 1 ? v[0] : v[i];
      };
      const auto jitter = std::chrono::duration_cast<Nanos>(
          std::chrono::duration<double, std::milli>(per_queue(opt_.jitter_ms)));
      ghost::linkemu::Impairment impairment(per_queue(opt_.loss_pct) / 100.0, jitter,
                                            opt_.jitter_shape, opt_.seed + i);
      queues_.push_back(std::make_unique<DelayedQueue>(opt_.queues[i], delay, std::move(impairment)));
      if (!queues_.back()->Bind(handle_.get(), opt_.maxlen)) return false;
    }

    // A shell starts background jobs with SIGINT ignored, and an ignored signal never reaches
    // the signalfd: take the default back before blocking.
    for (int sig : {SIGTERM, SIGINT, SIGHUP}) signal(sig, SIG_DFL);
    sigset_t mask;
    sigemptyset(&mask);
    sigaddset(&mask, SIGTERM);
    sigaddset(&mask, SIGINT);
    sigaddset(&mask, SIGHUP);
    sigprocmask(SIG_BLOCK, &mask, nullptr);
    signals_ = std::make_unique<Fd>(signalfd(-1, &mask, SFD_NONBLOCK | SFD_CLOEXEC));
    epoll_ = std::make_unique<Fd>(epoll_create1(EPOLL_CLOEXEC));
    if (signals_->get() < 0 || epoll_->get() < 0) {
      std::fprintf(stderr, "nfq_delay: signalfd/epoll: %s\n", std::strerror(errno));
      return false;
    }
    // epoll data: nullptr = netlink, &signals_ = signals, a queue = its timer.
    bool ok = Watch(fd, nullptr) && Watch(signals_->get(), &signals_);
    for (auto& q : queues_) ok = ok && Watch(q->timer_fd(), q.get());
    return ok;
  }

  // Runs until SIGTERM/SIGINT/SIGHUP (returns 0) or a netlink failure (returns 1).
  int Run() {
    epoll_event events[16];
    for (;;) {
      const int n = epoll_wait(epoll_->get(), events, 16, -1);
      if (n < 0) {
        if (errno == EINTR) continue;
        std::fprintf(stderr, "nfq_delay: epoll_wait: %s\n", std::strerror(errno));
        return Stop(kFailed);
      }
      for (int i = 0; i < n; ++i) {
        void* what = events[i].data.ptr;
        if (what == nullptr) {
          if (!ReadPackets()) return Stop(kFailed);
        } else if (what == &signals_) {
          signalfd_siginfo si;
          (void)!read(signals_->get(), &si, sizeof(si));
          return Stop(0);
        } else {
          static_cast<DelayedQueue*>(what)->OnTimer();
        }
      }
      for (auto& q : queues_) q->Rearm();
    }
  }

 private:
  bool Watch(int fd, void* what) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.ptr = what;
    if (epoll_ctl(epoll_->get(), EPOLL_CTL_ADD, fd, &ev) < 0) {
      std::fprintf(stderr, "nfq_delay: epoll_ctl: %s\n", std::strerror(errno));
      return false;
    }
    return true;
  }

  // Reads the queued packets' messages until the socket is empty (at most a bounded number per
  // turn, so timers are not starved). False on an unrecoverable netlink error.
  bool ReadPackets() {
    const int fd = nfq_fd(handle_.get());
    for (int i = 0; i < 1024; ++i) {
      const ssize_t len = recv(fd, buf_, sizeof(buf_), MSG_DONTWAIT);
      if (len < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK) return true;
        if (errno == EINTR) continue;
        if (errno == ENOBUFS) {  // messages were lost; their packets leave with later verdicts
          if (lost_++ == 0) std::fprintf(stderr, "nfq_delay: netlink overrun (ENOBUFS)\n");
          continue;
        }
        std::fprintf(stderr, "nfq_delay: recv: %s\n", std::strerror(errno));
        return false;
      }
      nfq_handle_packet(handle_.get(), buf_, static_cast<int>(len));
    }
    return true;
  }

  int Stop(int code) {
    (void)ReadPackets();
    for (auto& q : queues_) q->AcceptAll();
    // Packets queued while the above ran: one more pass narrows the window in which unbinding
    // drops them (the iptables rules use --queue-bypass, so later packets pass undelayed).
    (void)ReadPackets();
    for (auto& q : queues_) {
      q->AcceptAll();
      q->Unbind();
      q->PrintCounts();
    }
    if (lost_ > 0) {
      std::fprintf(stderr, "nfq_delay: %llu netlink overruns\n",
                   static_cast<unsigned long long>(lost_));
    }
    return code;
  }

  const Options& opt_;
  std::unique_ptr<nfq_handle, NfqCloser> handle_;
  std::vector<std::unique_ptr<DelayedQueue>> queues_;
  std::unique_ptr<Fd> signals_;
  std::unique_ptr<Fd> epoll_;
  std::uint64_t lost_ = 0;
  alignas(8) char buf_[1 << 16];
};

}  // namespace

int main(int argc, char** argv) {
  Options opt;
  CLI::App app{"Holds each packet of NFQUEUE queues for a fixed delay, then accepts it in order."};
  app.add_option("--queue", opt.queues, "NFQUEUE queue number (repeatable)")
      ->required()
      ->check(CLI::Range(0, 65535));
  app.add_option("--delay-ms", opt.delays_ms,
                 "one-way delay in milliseconds: one for all queues or one per queue (default 20)")
      ->check(CLI::Range(0.0, 60000.0));
  app.add_option("--maxlen", opt.maxlen, "kernel queue length in packets (default 65536)")
      ->check(CLI::Range(1u, 1u << 24));
  app.add_option("--loss-pct", opt.loss_pct,
                 "random loss in percent: one for all queues or one per queue (default 0)")
      ->check(CLI::Range(0.0, 100.0));
  app.add_option("--jitter-ms", opt.jitter_ms,
                 "mean of a gamma-distributed extra delay (no reordering): one or one per queue")
      ->check(CLI::Range(0.0, 60000.0));
  app.add_option("--jitter-shape", opt.jitter_shape, "shape of the jitter's gamma (default 2)")
      ->check(CLI::Range(0.01, 1000.0));
  app.add_option("--seed", opt.seed, "random seed of loss and jitter (default: the clock)");
  app.add_option("--link", opt.link, "label of the link this delayer belongs to (informational)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);
    std::fprintf(stderr, "nfq_delay: %s\nRun 'nfq_delay --help' for usage.\n", e.what());
    return kUsage;
  }
  if (opt.delays_ms.empty()) opt.delays_ms.push_back(20);
  if (opt.delays_ms.size() != 1 && opt.delays_ms.size() != opt.queues.size()) {
    std::fprintf(stderr,
                 "nfq_delay: %zu --delay-ms for %zu --queue: give one for all queues or one per "
                 "queue\n",
                 opt.delays_ms.size(), opt.queues.size());
    return kUsage;
  }

  for (const auto* v : {&opt.loss_pct, &opt.jitter_ms}) {
    if (v->size() > 1 && v->size() != opt.queues.size()) {
      std::fprintf(stderr, "nfq_delay: give one --loss-pct/--jitter-ms for all queues or one per queue\n");
      return kUsage;
    }
  }
  if (opt.seed == 0) opt.seed = static_cast<std::uint64_t>(Now().count());

  // Timer precision is the point of the program: no 50 us default slack.
  prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0);

  // Heap: the loop owns a 64 KiB receive buffer.
  auto delayer = std::make_unique<Delayer>(opt);
  if (!delayer->Start()) return kFailed;
  return delayer->Run();
}
