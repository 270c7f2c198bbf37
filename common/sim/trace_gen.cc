#include "common/sim/trace_gen.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <iterator>
#include <limits>
#include <numeric>
#include <random>
#include <utility>
#include <vector>

namespace ghost {
namespace {

// Random variates from a std::mt19937_64 by inverse CDF (and the polar method for the
// normal), so that a seed means the same numbers with every standard library.
class Random {
 public:
  explicit Random(std::uint64_t seed) : gen_(seed) {}

  // Uniform in [0, 1), from the top 53 bits.
  double Uniform() { return static_cast<double>(gen_() >> 11) * 0x1.0p-53; }
  // Uniform in (0, 1], safe to take the logarithm of.
  double UniformPositive() { return 1.0 - Uniform(); }
  bool Bernoulli(double p) { return Uniform() < p; }

  // Uniform integer in [0, n), without modulo bias (rejects the short top range). n > 0.
  std::uint64_t UniformInt(std::uint64_t n) {
    assert(n > 0);
    const std::uint64_t threshold = (std::uint64_t{0} - n) % n;  // 2^64 mod n
    while (true) {
      std::uint64_t x = gen_();
      if (x >= threshold) return x % n;
    }
  }

  // Standard normal (Marsaglia's polar method; the second variate is dropped).
  double Normal() {
    while (true) {
      double u = 2 * Uniform() - 1;
      double v = 2 * Uniform() - 1;
      double s = u * u + v * v;
      if (s > 0 && s < 1) return u * std::sqrt(-2 * std::log(s) / s);
    }
  }
  double LogNormal(double mu, double sigma) { return std::exp(mu + sigma * Normal()); }

  // Pareto with tail index alpha and minimum k: P(X > x) = (k / x)^alpha.
  double Pareto(double alpha, double k) { return k / std::pow(UniformPositive(), 1 / alpha); }
  // Pareto conditioned on X <= max (inverse of the truncated CDF). k < max.
  double BoundedPareto(double alpha, double k, double max) {
    double tail = std::pow(k / max, alpha);  // P(X > max) of the untruncated law
    return k / std::pow(1 - Uniform() * (1 - tail), 1 / alpha);
  }
  // Number of trials up to and including the first success, mean `mean` (>= 1).
  std::uint64_t Geometric(double mean) {
    if (mean <= 1) return 1;
    return 1 + static_cast<std::uint64_t>(
                   std::floor(std::log(UniformPositive()) / std::log(1 - 1 / mean)));
  }

  // Fisher-Yates.
  template <typename T>
  void Shuffle(std::vector<T>& v) {
    for (std::size_t i = v.size(); i > 1; --i) std::swap(v[i - 1], v[UniformInt(i)]);
  }

 private:
  std::mt19937_64 gen_;
};

TimePoint AtMillis(std::int64_t ms) { return TimePoint(std::chrono::milliseconds(ms)); }
std::int64_t ToWholeMillis(double seconds) { return std::llround(seconds * 1000); }

// Scales `raw` gaps (seconds, > 0) by one factor s so that sum(min(s * raw[i], cap)) is
// `target` (to within rounding, never above). When even every gap at `cap` falls short, the
// cap yields and the gaps are scaled uncapped.
std::vector<double> FitGaps(const std::vector<double>& raw, double target, double cap) {
  std::vector<double> gaps(raw.size(), 0);
  if (raw.empty() || target <= 0) return gaps;
  const double sum_raw = std::accumulate(raw.begin(), raw.end(), 0.0);
  if (static_cast<double>(raw.size()) * cap <= target) {
    for (std::size_t i = 0; i < raw.size(); ++i) gaps[i] = raw[i] * (target / sum_raw);
  } else {
    auto capped_sum = [&](double s) {
      double sum = 0;
      for (double r : raw) sum += std::min(s * r, cap);
      return sum;
    };
    double lo = 0;
    double hi = cap / *std::min_element(raw.begin(), raw.end());  // every gap at the cap
    for (int i = 0; i < 200 && lo < hi; ++i) {
      double mid = lo + (hi - lo) / 2;
      if (mid <= lo || mid >= hi) break;
      (capped_sum(mid) <= target ? lo : hi) = mid;
    }
    for (std::size_t i = 0; i < raw.size(); ++i) gaps[i] = std::min(lo * raw[i], cap);
  }
  return gaps;
}

// Start times (whole milliseconds) of events separated by `gaps`, the first at 0.
std::vector<std::int64_t> StartTimes(const std::vector<double>& gaps) {
  std::vector<std::int64_t> times{0};
  double t = 0;
  for (double g : gaps) {
    t += g;
    times.push_back(ToWholeMillis(t));
  }
  return times;
}

// --- Web ---------------------------------------------------------------------------------

struct WebObject {
  std::string url;
  Bytes size = 0;
  bool cached = false;
};

// SURGE's hybrid file size: lognormal body, Pareto tail above its minimum.
Bytes SurgeSize(Random& rng, const WebTraceOptions& o) {
  double size = rng.LogNormal(o.size_log_mean, o.size_log_sd);
  const auto tail_min = static_cast<double>(o.size_tail_min);
  const auto max = static_cast<double>(o.max_object_size);
  if (size > tail_min) {
    size = tail_min < max ? rng.BoundedPareto(o.size_tail_alpha, tail_min, max) : max;
  }
  return std::clamp<Bytes>(static_cast<Bytes>(std::llround(size)), 1, o.max_object_size);
}

const char* EmbeddedName(Random& rng) {
  // Our mix of a page's parts: images most often, then scripts and style sheets.
  double u = rng.Uniform();
  if (u < 0.35) return "img%.jpg";
  if (u < 0.60) return "img%.png";
  if (u < 0.80) return "script%.js";
  return "style%.css";
}

std::string NumberedName(const char* pattern, std::size_t n) {
  std::string s = pattern;
  s.replace(s.find('%'), 1, std::to_string(n));
  return s;
}

}  // namespace

Trace GenerateWebTrace(const WebTraceOptions& o) {
  assert(o.duration > Duration::zero());
  assert(o.revisit_fraction >= 0 && o.revisit_fraction < 1);
  Random rng(o.seed);
  Trace trace;
  trace.kind = TraceKind::kWeb;
  trace.name = "generated web trace, seed " + std::to_string(o.seed);
  const std::size_t n = o.unique_objects;
  if (n == 0) return trace;

  // Pages: a base object then its embedded objects, until exactly n objects exist.
  std::vector<WebObject> objects;
  std::vector<std::vector<std::size_t>> pages;  // object indices, the base first
  std::size_t site = 1;
  while (objects.size() < n) {
    if (!pages.empty() && rng.Bernoulli(0.3)) ++site;
    const std::size_t page = pages.size() + 1;
    const std::string dir =
        "http://origin.test/site" + std::to_string(site) + "/page" + std::to_string(page);
    auto embedded = static_cast<std::size_t>(
        std::min(std::floor(rng.Pareto(o.embedded_alpha, 1)), static_cast<double>(o.max_embedded)));
    embedded = std::min(embedded, n - objects.size() - 1);
    std::vector<std::size_t> members{objects.size()};
    objects.push_back({dir + ".html", SurgeSize(rng, o), false});
    for (std::size_t j = 1; j <= embedded; ++j) {
      members.push_back(objects.size());
      objects.push_back({dir + "/" + NumberedName(EmbeddedName(rng), j), SurgeSize(rng, o), false});
    }
    pages.push_back(std::move(members));
  }

  std::vector<std::size_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  rng.Shuffle(order);
  for (std::size_t i = 0; i < n / 2; ++i) objects[order[i]].cached = true;

  // Popularity: a random rank per page; weight 1 / rank^zipf.
  const std::size_t p = pages.size();
  std::vector<std::size_t> rank(p);
  std::iota(rank.begin(), rank.end(), 1);
  rng.Shuffle(rank);
  std::vector<double> weight(p);
  for (std::size_t i = 0; i < p; ++i) {
    weight[i] = 1 / std::pow(static_cast<double>(rank[i]), o.zipf_exponent);
  }

  // Time budget: the views' starts span `target`; the last view's parts fit after it.
  const double duration_s = ToSeconds(o.duration);
  const double max_span =
      std::min(ToSeconds(o.max_embedded_gap) * static_cast<double>(o.max_embedded), duration_s / 2);
  const double gap_limit_ms =
      std::floor(1000 * max_span / static_cast<double>(std::max<std::size_t>(o.max_embedded, 1)));
  const double target = (duration_s - max_span) * (0.92 + 0.06 * rng.Uniform());
  const double cap = ToSeconds(o.max_think_time);

  // Views: enough for the revisit fraction, and enough that the mean think time stays well
  // under the cap (so the fitted scale, not the cap, sets the gaps).
  auto views =
      static_cast<std::size_t>(std::ceil(static_cast<double>(p) / (1 - o.revisit_fraction)));
  views = std::max({views, p, static_cast<std::size_t>(std::ceil(4 * target / cap)) + 1});

  // Which views are first visits: view 0 and p - 1 of the others, chosen uniformly.
  std::vector<std::size_t> slots(views - 1);
  std::iota(slots.begin(), slots.end(), 1);
  for (std::size_t i = 0; i + 1 < p; ++i) {
    std::swap(slots[i], slots[i + rng.UniformInt(slots.size() - i)]);
  }
  std::vector<bool> first_visit(views, false);
  first_visit[0] = true;
  for (std::size_t i = 0; i + 1 < p; ++i) first_visit[slots[i]] = true;

  // A revisit returns to an earlier page other than the one on screen; while there is none,
  // the view visits a new page instead and a later first-visit slot becomes a revisit.
  std::vector<std::size_t> sequence;  // page of each view
  std::vector<std::size_t> visited;
  for (std::size_t v = 0; v < views; ++v) {
    const bool pages_left = visited.size() < p;
    if (pages_left && (first_visit[v] || visited.size() < 2)) {
      visited.push_back(visited.size());
      sequence.push_back(visited.back());
      continue;
    }
    const std::size_t current = sequence.back();
    const bool may_repeat = visited.size() == 1;  // a one-page site: only reloads remain
    double total = 0;
    for (std::size_t page : visited) {
      if (page != current || may_repeat) total += weight[page];
    }
    double pick = rng.Uniform() * total;
    std::size_t chosen = current;
    for (std::size_t page : visited) {
      if (page == current && !may_repeat) continue;
      chosen = page;
      if (pick < weight[page]) break;
      pick -= weight[page];
    }
    sequence.push_back(chosen);
  }

  std::vector<double> raw(views - 1);
  for (double& r : raw) r = rng.Pareto(o.think_alpha, 1);
  const std::vector<std::int64_t> starts = StartTimes(FitGaps(raw, target, cap));

  const auto limit_ms = static_cast<std::int64_t>(gap_limit_ms);
  for (std::size_t v = 0; v < views; ++v) {
    std::int64_t t = starts[v];
    bool first = true;
    for (std::size_t index : pages[sequence[v]]) {
      if (!first)
        t += static_cast<std::int64_t>(rng.UniformInt(static_cast<std::uint64_t>(limit_ms) + 1));
      first = false;
      const WebObject& obj = objects[index];
      trace.web.push_back({AtMillis(t), obj.url, obj.size, obj.cached});
    }
  }
  std::stable_sort(trace.web.begin(), trace.web.end(),
                   [](const WebRequest& a, const WebRequest& b) { return a.time < b.time; });
  return trace;
}

Trace GenerateAllCachedWebTrace(const WebTraceOptions& options) {
  Trace trace = GenerateWebTrace(options);
  trace.name = "generated all-cached web trace, seed " + std::to_string(options.seed);
  for (WebRequest& r : trace.web) r.cached = true;
  return trace;
}

// --- Mail --------------------------------------------------------------------------------

namespace {

// Mixture fitted to a measured mail size distribution (see the header).
Bytes MailSize(Random& rng, Bytes max) {
  for (int attempt = 0; attempt < 100; ++attempt) {
    double size = rng.Bernoulli(0.25) ? rng.LogNormal(std::log(40'000.0), 1.8)
                                      : rng.LogNormal(std::log(3300.0), 0.9);
    auto bytes = static_cast<Bytes>(std::llround(size));
    if (bytes <= max) return std::max<Bytes>(bytes, 1);
  }
  return max;
}

double ReadingTime(Random& rng) { return rng.LogNormal(std::log(10.0), 0.9); }
double PauseTime(Random& rng) { return rng.LogNormal(std::log(30.0), 0.8); }
double ComposeTime(Random& rng) { return rng.LogNormal(std::log(30.0), 0.6); }
double BackToInboxTime(Random& rng) { return 1 + 4 * rng.Uniform(); }

}  // namespace

Trace GenerateMailTrace(const MailTraceOptions& o) {
  assert(o.duration > Duration::zero());
  Random rng(o.seed);
  Trace trace;
  trace.kind = TraceKind::kMail;
  trace.name = "generated mail trace, seed " + std::to_string(o.seed);
  const std::size_t m = o.messages;

  // Which message each reply follows, and where the reader pauses.
  std::vector<std::size_t> replies_after(std::max<std::size_t>(m, 1), 0);
  for (std::size_t s = 0; s < o.sends; ++s) {
    ++replies_after[m == 0 ? 0 : rng.UniformInt(m)];
  }

  std::vector<MailEvent> events;
  std::vector<double> raw;  // raw[i]: gap before events[i + 1]
  std::uint32_t uid = 1 + static_cast<std::uint32_t>(rng.UniformInt(5000));
  double pause = 0;
  auto add = [&](MailEvent e, double gap) {
    if (!events.empty()) raw.push_back(gap);
    events.push_back(std::move(e));
  };
  // Time from the previous event until the user is ready for the next one.
  auto settle = [&]() {
    if (events.empty()) return 0.0;
    return events.back().op == MailEvent::Op::kRead ? ReadingTime(rng) : BackToInboxTime(rng);
  };
  for (std::size_t i = 0; i < std::max<std::size_t>(m, 1); ++i) {
    if (m > 0) {
      double gap = settle() + pause;
      add({TimePoint{}, MailEvent::Op::kRead, o.mailbox, uid, MailSize(rng, o.max_message_size)},
          gap);
      uid += 1 + (rng.Bernoulli(0.2) ? static_cast<std::uint32_t>(1 + rng.UniformInt(4)) : 0);
      pause = i + 1 < m && rng.Bernoulli(1 / std::max(o.mean_burst, 1.0)) ? PauseTime(rng) : 0;
    }
    for (std::size_t s = 0; s < replies_after[i]; ++s) {
      double gap = settle() + ComposeTime(rng);
      add({TimePoint{}, MailEvent::Op::kSend, o.sent_mailbox, 0, MailSize(rng, o.max_message_size)},
          gap);
    }
  }

  const double target = ToSeconds(o.duration) * (0.92 + 0.06 * rng.Uniform());
  const std::vector<std::int64_t> starts = StartTimes(FitGaps(raw, target, ToSeconds(o.max_gap)));
  for (std::size_t i = 0; i < events.size(); ++i) events[i].time = AtMillis(starts[i]);
  trace.mail = std::move(events);
  return trace;
}

// --- Block -------------------------------------------------------------------------------

Trace GenerateBlockTrace(const BlockTraceOptions& o) {
  assert(o.duration > Duration::zero());
  Random rng(o.seed);
  Trace trace;
  trace.kind = TraceKind::kBlock;
  trace.name = "generated block trace, seed " + std::to_string(o.seed);

  constexpr std::uint64_t kPage = 4096 / kSectorSize;  // requests are 4 KB aligned
  const std::uint64_t disk_pages = std::max<std::uint64_t>(o.disk_sectors / kPage, 1);
  const std::uint64_t hot_pages = std::clamp<std::uint64_t>(
      static_cast<std::uint64_t>(static_cast<double>(disk_pages) * o.hot_space_fraction), 1,
      disk_pages);
  const std::int64_t end_ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(o.duration).count();

  std::int64_t t = 0;
  std::uint64_t next_page = 0;  // where a sequential request would continue
  while (t < end_ms) {
    const double read_share = rng.Bernoulli(0.7) ? 0.9 : 0.1;
    const std::uint64_t requests = rng.Geometric(o.mean_burst_requests);
    for (std::uint64_t i = 0; i < requests && t < end_ms; ++i) {
      const bool write = !rng.Bernoulli(read_share);
      std::uint64_t pages = rng.Bernoulli(0.6) ? 1 : 2 + rng.UniformInt(31);
      pages = std::min(pages, disk_pages);
      std::uint64_t start = next_page;
      if (i == 0 || !rng.Bernoulli(0.5) || start + pages > disk_pages) {
        const bool hot = rng.Bernoulli(o.hot_access_fraction);
        const std::uint64_t base = hot ? 0 : hot_pages;
        const std::uint64_t span =
            hot ? hot_pages : std::max<std::uint64_t>(disk_pages - hot_pages, 1);
        start = std::min(base + rng.UniformInt(span), disk_pages - pages);
      }
      trace.block.push_back(
          {AtMillis(t), write, start * kPage, static_cast<std::uint32_t>(pages * kPage)});
      next_page = start + pages;
      t += static_cast<std::int64_t>(rng.UniformInt(21));
    }
    t += ToWholeMillis(rng.BoundedPareto(1.3, 2, 300));
  }
  return trace;
}

// --- NVCache-shaped block trace ----------------------------------------------------------

Trace GenerateNvcacheTrace(const NvcacheTraceOptions& o) {
  assert(o.duration > Duration::zero());
  Random rng(o.seed);
  Trace trace;
  trace.kind = TraceKind::kBlock;
  trace.name = "generated NVCache-shaped block trace, seed " + std::to_string(o.seed);
  constexpr std::uint64_t kPage = 4096 / kSectorSize;
  const std::uint64_t disk_pages = std::max<std::uint64_t>(o.disk_sectors / kPage, 2);
  const std::uint64_t hot_pages = std::clamp<std::uint64_t>(o.hot_write_pages, 1, disk_pages / 2);
  // The hot pages are scattered over the disk (inodes, directories, bitmaps live in every
  // cylinder group), one fixed set for the whole trace.
  std::vector<std::uint64_t> hot(hot_pages);
  for (std::uint64_t& p : hot) p = rng.UniformInt(disk_pages - 1);
  const std::int64_t end_ms = std::chrono::duration_cast<std::chrono::milliseconds>(o.duration).count();
  const std::int64_t sync_ms = std::max<std::int64_t>(
      std::chrono::duration_cast<std::chrono::milliseconds>(o.sync_period).count(), 1);

  std::vector<BlockEvent> reads, writes;
  // Read bursts.
  for (std::int64_t t = 0; t < end_ms;) {
    const std::uint64_t runs = 1 + rng.UniformInt(16);
    for (std::uint64_t r = 0; r < runs && t < end_ms; ++r) {
      const std::uint64_t pages = std::min<std::uint64_t>(1 + rng.UniformInt(16), disk_pages);
      const std::uint64_t start = rng.UniformInt(disk_pages - pages + 1);
      reads.push_back({AtMillis(t), false, start * kPage, static_cast<std::uint32_t>(pages * kPage)});
      t += static_cast<std::int64_t>(rng.UniformInt(21));
    }
    t += ToWholeMillis(rng.BoundedPareto(1.3, 2, 300));
  }
  // The update daemon's writes, every sync period (Poisson count: exponential gaps in [0, 1)).
  for (std::int64_t t = sync_ms; t < end_ms; t += sync_ms) {
    std::uint64_t n = 0;
    for (double acc = -std::log(rng.UniformPositive()); acc < o.writes_per_sync;
         acc += -std::log(rng.UniformPositive())) {
      ++n;
    }
    std::int64_t at = t;
    for (std::uint64_t i = 0; i < n && at < end_ms; ++i) {
      std::uint64_t start, pages;
      if (rng.Bernoulli(o.hot_write_fraction)) {
        start = hot[rng.UniformInt(hot_pages)];
        pages = rng.Bernoulli(0.8) ? 1 : 2;
      } else {
        pages = rng.Bernoulli(0.8) ? 1 + rng.UniformInt(2) : 2 + rng.UniformInt(15);
        start = rng.UniformInt(disk_pages - pages + 1);
      }
      pages = std::min(pages, disk_pages - start);
      writes.push_back({AtMillis(at), true, start * kPage, static_cast<std::uint32_t>(pages * kPage)});
      at += static_cast<std::int64_t>(rng.UniformInt(5));
    }
  }
  trace.block.reserve(reads.size() + writes.size());
  std::merge(reads.begin(), reads.end(), writes.begin(), writes.end(), std::back_inserter(trace.block),
             [](const BlockEvent& a, const BlockEvent& b) { return a.time < b.time; });
  return trace;
}

}  // namespace ghost
