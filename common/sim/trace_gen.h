// Trace generators: seeded, documented workloads in the formats of common/sim/trace.h, modelled on
// the papers' experiments (DESIGN §6). The default traces in common/traces/ are these
// generators with seed 1 (see common/traces/README.md).
//
// Determinism: every generator draws from one std::mt19937_64 seeded with `seed` (its output
// is fixed by the C++ standard) through our own inverse-CDF and polar-method code, never
// std::*_distribution (whose output differs between standard libraries). The only library
// math is std::log/exp/pow/sqrt; results are rounded to milliseconds and bytes, so the same
// seed gives the same trace on every platform. Different seeds give different traces.
//
// Web (GenerateWebTrace), after the MobiSys 2004 ghost-hints paper's web trace (M. Anand,
// E. Nightingale, J. Flinn, "Ghosts in the Machine: Interfaces for Better Power Management":
// 20 minutes, 116 unique objects, half of them in the disk cache at the start):
//  - Objects: pages of one base HTML object plus embedded objects (.css/.js/.png/.jpg),
//    added until exactly `unique_objects` exist. The number of embedded objects per page is
//    SURGE's Pareto(alpha 2.43, k 1), rounded down and capped at `max_embedded` (P. Barford,
//    M. Crovella, "Generating Representative Web Workloads for Network and Server Performance
//    Evaluation", SIGMETRICS 1998). Consecutive new pages stay on one site with
//    probability 0.7 (our choice).
//  - Sizes (per object): SURGE's hybrid: lognormal body (mu 9.357, sigma 1.318, in ln bytes);
//    a draw above the cut-off k = 133 KB is replaced by the Pareto tail (alpha 1.1, k 133 KB),
//    truncated at `max_object_size` so a trace stays realistic for a 3 Mb/s link.
//  - Cached: exactly floor(unique_objects / 2) objects, chosen uniformly; the flag belongs to
//    the object, so every request of a URL carries the same flag.
//  - Page views: each page is first visited once; `revisit_fraction` of all views return to
//    an earlier page (58% of page visits are revisits in L. Tauscher, S. Greenberg, "How
//    people revisit web pages", Int. J. Human-Computer Studies 47(1), 1997), chosen by
//    Zipf-like popularity (weight 1/rank, L. Breslau et al., "Web Caching and Zipf-like
//    Distributions", INFOCOM 1999), never the page just viewed. A view requests the base
//    page, then its embedded objects 0-50 ms apart (a browser fetching a page's parts).
//  - Think time between views: SURGE's inactive OFF time, a Pareto with alpha 1.5,
//    capped at `max_think_time`. SURGE's scale k = 1 s gives ~3 s between pages,
//    which would need ~10 views of every page to fill 20 minutes; we keep SURGE's tail index
//    and fit the scale so the views span 92-98% of the duration (with the defaults k comes
//    out near 3 s, i.e. a median of ~5 s and a mean of ~9 s between pages, ~120 views
//    and ~270 requests).
//
// Mail (GenerateMailTrace), after the paper's mail trace (15 minutes, 41 messages read by a
// user catching up on mail, with the mailbox cached locally):
//  - READs of `messages` distinct messages of INBOX in uid order (the oldest unread first);
//    uids ascend with occasional gaps (deleted messages). `sends` replies are SENT to the
//    `sent_mailbox`, each after reading a random message.
//  - Sizes: a two-part lognormal mixture (75%: median 3300 B, sigma 0.9; 25%: messages with
//    attachments, median 40 KB, sigma 1.8) redrawn above `max_message_size`, fitted by us to
//    a mail server's measured size distribution (posted to freebsd-net in 2002 and tabulated
//    by J. Buchner, "Modelling realistic email traffic - email size distribution", 2009:
//    23.5% under 2 KB, 49% under 4 KB, 68% under 8 KB, 90% under 64 KB, 98.5% under 1 MB,
//    99.96% under 2 MB; the fit is within 0.02 of every point, median ~4 KB).
//  - Timing (our model, in bursts): reading a message takes lognormal(median 10 s, sigma 0.9);
//    after a message the user pauses (lognormal, median 30 s, sigma 0.8) with probability
//    1/`mean_burst`; composing a reply takes lognormal(median 30 s, sigma 0.6); going back to
//    the inbox after a SEND 1-5 s. The gaps are then scaled by one factor (near 1 with the
//    defaults) so the trace spans 92-98% of the duration, as the paper's 41 messages spanned
//    15 minutes (~22 s per message); a gap is capped at `max_gap` unless too few events
//    could not otherwise fill the duration.
//
// Block (GenerateBlockTrace), a modest desktop-like disk workload for the spin-down and flash
// experiments (F. Douglis et al., "Storage Alternatives for Mobile Computers", OSDI 1994):
// bursts of 4 KB-aligned requests (burst length geometric, mean `mean_burst_requests`; 0-20 ms
// apart; 70% of bursts read-mostly (90% reads), the rest write-mostly (90% writes); half the
// requests continue sequentially from the previous one; sizes 4 KB, or 8-128 KB with
// probability 0.4), separated by heavy-tailed idle periods (Pareto alpha 1.3, 2 s to 300 s:
// about 30% longer than the cu140's 5 s spin-down, 12% longer than 10 s; disk idle periods
// are heavy-tailed, R. Golding et al., "Idleness is not sloth", USENIX 1995). Addresses are
// hot-and-cold like Douglis's SYNTH workload: `hot_access_fraction` of the random starts fall
// in the first `hot_space_fraction` of the disk. These numbers are ours.
//
// Thread-safety: pure functions of their options; safe to call from any thread.
#ifndef GHOST_COMMON_SIM_TRACE_GEN_H_
#define GHOST_COMMON_SIM_TRACE_GEN_H_

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>

#include "common/sim/trace.h"
#include "common/base/units.h"

namespace ghost {

struct WebTraceOptions {
  std::uint64_t seed = 1;
  // Every request starts before this (the paper: 20 minutes). Must be positive.
  Duration duration = std::chrono::minutes(20);
  // Exactly this many distinct URLs appear (the paper: 116); half, rounded down, are cached.
  std::size_t unique_objects = 116;

  // SURGE file sizes (Barford & Crovella 1998): lognormal body, Pareto tail above k.
  double size_log_mean = 9.357;
  double size_log_sd = 1.318;
  double size_tail_alpha = 1.1;
  Bytes size_tail_min = 133 * 1024;
  Bytes max_object_size = 2 * 1024 * 1024;

  // SURGE embedded references per page: Pareto(alpha, k = 1), at most max_embedded.
  double embedded_alpha = 2.43;
  std::size_t max_embedded = 10;
  // Gap between the requests of one page view: uniform in [0, max_embedded_gap].
  Duration max_embedded_gap = std::chrono::milliseconds(50);

  // SURGE inactive OFF (think) time tail index; the scale is fitted to the duration.
  double think_alpha = 1.5;
  Duration max_think_time = std::chrono::seconds(120);

  // Fraction of page views that revisit an earlier page (Tauscher & Greenberg 1997); < 1.
  double revisit_fraction = 0.58;
  // Revisits pick page of popularity rank r with weight 1 / r^zipf_exponent.
  double zipf_exponent = 1.0;
};

struct MailTraceOptions {
  std::uint64_t seed = 1;
  // Every event happens before this (the paper: 15 minutes). Must be positive.
  Duration duration = std::chrono::minutes(15);
  std::size_t messages = 41;  // distinct messages READ (the paper: 41)
  std::size_t sends = 3;      // replies SENT
  std::string mailbox = "INBOX";
  std::string sent_mailbox = "Sent";
  Bytes max_message_size = 2 * 1024 * 1024;
  // Mean number of messages read between two pauses.
  double mean_burst = 8;
  Duration max_gap = std::chrono::seconds(300);
};

struct BlockTraceOptions {
  std::uint64_t seed = 1;
  Duration duration = std::chrono::minutes(20);                 // every request starts before this
  std::uint64_t disk_sectors = (Bytes{1} << 30) / kSectorSize;  // a 1 GiB disk
  double hot_space_fraction = 0.1;   // the hot region: this much of the disk, at its start
  double hot_access_fraction = 0.9;  // this share of random starts fall in the hot region
  double mean_burst_requests = 8;
};

// The NVCache-shaped block trace (GenerateNvcacheTrace, scripts/bench-flash.sh Fig. 5): what a
// flash log in front of a laptop disk sees, after the traits the NVCache flush results rest on
// (the numbers are ours [E]; the traits are from C. Ruemmler, J. Wilkes, "UNIX disk access
// patterns", USENIX Winter 1993, on the personal workstation hplajw):
//  - reads spin the disk up: reads come in bursts (a program or file opened: 1-16 sequential
//    runs of 4-64 KB, cold, anywhere on the disk) separated by the same heavy-tailed idle
//    periods as GenerateBlockTrace (Pareto alpha 1.3, 2-300 s), so with a 5 s spin-down most
//    bursts find the disk asleep;
//  - writes are small and periodic: the update daemon writes the dirty blocks every 30 s
//    (`sync_period`), a Poisson number of them (mean `writes_per_sync`), most 4 KB (metadata:
//    inodes, directories, bitmaps, logs; 4-8 KB with probability 0.8, else 8-64 KB data);
//  - writes overwrite a small hot set: `hot_write_fraction` (0.8) of them go to one of
//    `hot_write_pages` (64) pages (the paper's "most writes are to a few blocks, and most
//    written blocks are overwritten soon"), the rest to random cold places.
// So a log flushed on every spin-up holds a few writes with few repeats each time, and a log
// flushed only when full holds many overwrites of the same hot pages, which merge away.
struct NvcacheTraceOptions {
  std::uint64_t seed = 1;
  Duration duration = std::chrono::hours(2);
  std::uint64_t disk_sectors = (Bytes{40} << 20) / kSectorSize;  // a 40 MB laptop disk (cu140)
  Duration sync_period = std::chrono::seconds(30);
  double writes_per_sync = 8;
  double hot_write_fraction = 0.8;
  std::uint64_t hot_write_pages = 64;
};

// A web trace of `options.unique_objects` distinct URLs, half of them cached.
[[nodiscard]] Trace GenerateWebTrace(const WebTraceOptions& options = {});
// The paper's Figure 12 experiment: GenerateWebTrace(options) with every object cached.
[[nodiscard]] Trace GenerateAllCachedWebTrace(const WebTraceOptions& options = {});
// A user catching up on mail: `messages` distinct READs of INBOX and `sends` SENDs.
[[nodiscard]] Trace GenerateMailTrace(const MailTraceOptions& options = {});
// Bursts of block I/O separated by spin-down-length idle periods.
[[nodiscard]] Trace GenerateBlockTrace(const BlockTraceOptions& options = {});
// Read bursts that spin the disk up, periodic small writes to a hot overwrite set (above).
[[nodiscard]] Trace GenerateNvcacheTrace(const NvcacheTraceOptions& options = {});

}  // namespace ghost

#endif  // GHOST_COMMON_SIM_TRACE_GEN_H_
