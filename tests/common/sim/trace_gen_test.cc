#include "common/sim/trace_gen.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "common/sim/trace.h"

namespace ghost {
namespace {

class TraceGenTest : public ::testing::Test {
 protected:
  static std::set<std::string> Urls(const Trace& t) {
    std::set<std::string> urls;
    for (const WebRequest& r : t.web) urls.insert(r.url);
    return urls;
  }

  static std::size_t CachedUrls(const Trace& t) {
    std::set<std::string> cached;
    for (const WebRequest& r : t.web) {
      if (r.cached) cached.insert(r.url);
    }
    return cached.size();
  }

  template <typename Event>
  static void ExpectSortedWithin(const std::vector<Event>& events, Duration duration) {
    ASSERT_FALSE(events.empty());
    for (std::size_t i = 1; i < events.size(); ++i) {
      ASSERT_LE(events[i - 1].time, events[i].time) << "event " << i;
    }
    EXPECT_GE(events.front().time, TimePoint{});
    EXPECT_LT(events.back().time, TimePoint(duration));
  }

  static Result<Trace> RoundTrip(const Trace& t) {
    std::stringstream text;
    WriteTrace(t, text, "round trip");
    return ParseTrace(text, t.name);
  }

  static double Median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  }
};

TEST_F(TraceGenTest, WebTraceHas116UniqueUrlsAndExactly58Cached) {
  Trace t = GenerateWebTrace();
  EXPECT_EQ(t.kind, TraceKind::kWeb);
  EXPECT_EQ(Urls(t).size(), 116u);
  EXPECT_EQ(CachedUrls(t), 58u);
  EXPECT_EQ(SummarizeTrace(t).cached_objects, 58u);
}

TEST_F(TraceGenTest, WebTraceLastsMoreThan15AndAtMost20Minutes) {
  for (std::uint64_t seed = 1; seed <= 20; ++seed) {
    WebTraceOptions o;
    o.seed = seed;
    Trace t = GenerateWebTrace(o);
    SCOPED_TRACE(seed);
    ExpectSortedWithin(t.web, std::chrono::minutes(20));
    EXPECT_GT(t.web.back().time, TimePoint(std::chrono::minutes(15)));
    EXPECT_EQ(t.web.front().time, TimePoint{});
  }
}

TEST_F(TraceGenTest, WebTraceRevisitsSomeObjects) {
  Trace t = GenerateWebTrace();
  // 58% of views are revisits, so there are between two and four requests per object.
  EXPECT_GT(t.web.size(), 2 * Urls(t).size());
  EXPECT_LT(t.web.size(), 4 * Urls(t).size());
}

TEST_F(TraceGenTest, WebRevisitNeverReloadsThePageOnScreen) {
  for (std::uint64_t seed = 1; seed <= 20; ++seed) {
    WebTraceOptions o;
    o.seed = seed;
    std::string previous;
    int pages = 0;
    for (const WebRequest& r : GenerateWebTrace(o).web) {
      if (!r.url.ends_with(".html")) continue;
      EXPECT_NE(r.url, previous) << "seed " << seed;
      previous = r.url;
      ++pages;
    }
    EXPECT_GE(pages, 2) << "seed " << seed << ": too few pages for a revisit to be possible";
  }
}

TEST_F(TraceGenTest, WebCachedFlagBelongsToTheObject) {
  std::map<std::string, bool> flag;
  const Trace t = GenerateWebTrace();
  ASSERT_GT(t.web.size(), Urls(t).size());  // some object is asked for twice, or nothing is compared
  for (const WebRequest& r : t.web) {
    auto [it, inserted] = flag.emplace(r.url, r.cached);
    EXPECT_EQ(it->second, r.cached) << r.url;
  }
}

TEST_F(TraceGenTest, WebObjectsKeepTheirSizeAndAreCapped) {
  std::map<std::string, Bytes> size;
  const Trace t = GenerateWebTrace();
  ASSERT_GT(t.web.size(), Urls(t).size());  // some object is asked for twice, or nothing is compared
  for (const WebRequest& r : t.web) {
    auto [it, inserted] = size.emplace(r.url, r.size);
    EXPECT_EQ(it->second, r.size) << r.url;
    EXPECT_GE(r.size, 1u);
    EXPECT_LE(r.size, WebTraceOptions{}.max_object_size);
  }
}

TEST_F(TraceGenTest, WebUrlsAreBasePagesAndTheirParts) {
  Trace t = GenerateWebTrace();
  std::size_t pages = 0;
  for (const std::string& url : Urls(t)) {
    EXPECT_EQ(url.rfind("http://origin.test/site", 0), 0u) << url;
    bool html = url.ends_with(".html");
    pages += html ? 1 : 0;
    EXPECT_TRUE(html || url.ends_with(".css") || url.ends_with(".js") || url.ends_with(".png") ||
                url.ends_with(".jpg"))
        << url;
  }
  EXPECT_GT(pages, 116u / 12) << "at most 10 embedded objects per page";
  EXPECT_LT(pages, 116u);
  // The first request of a view is its base page: the trace starts with one.
  EXPECT_TRUE(t.web.front().url.ends_with(".html"));
}

TEST_F(TraceGenTest, WebSizesFollowSurgesLognormalBody) {
  // SURGE's body has median e^9.357 = 11.6 KB; the Pareto tail only moves the top 3%.
  std::vector<double> sizes;
  for (std::uint64_t seed = 1; seed <= 30; ++seed) {
    WebTraceOptions o;
    o.seed = seed;
    std::map<std::string, Bytes> objects;
    for (const WebRequest& r : GenerateWebTrace(o).web) objects.emplace(r.url, r.size);
    for (const auto& [url, size] : objects) sizes.push_back(static_cast<double>(size));
  }
  EXPECT_GT(Median(sizes), 9'500);
  EXPECT_LT(Median(sizes), 14'000);
  const auto big =
      std::count_if(sizes.begin(), sizes.end(), [](double s) { return s > 133 * 1024; });
  EXPECT_GT(big, 0);
  EXPECT_LT(static_cast<double>(big) / static_cast<double>(sizes.size()), 0.06);
}

TEST_F(TraceGenTest, OddObjectCountCachesHalfRoundedDown) {
  WebTraceOptions o;
  o.unique_objects = 7;
  Trace t = GenerateWebTrace(o);
  EXPECT_EQ(Urls(t).size(), 7u);
  EXPECT_EQ(CachedUrls(t), 3u);
  o.unique_objects = 1;
  t = GenerateWebTrace(o);
  EXPECT_EQ(Urls(t).size(), 1u);
  EXPECT_EQ(CachedUrls(t), 0u);
  o.unique_objects = 0;
  EXPECT_TRUE(GenerateWebTrace(o).web.empty());
}

TEST_F(TraceGenTest, WebTraceHonoursAShortDuration) {
  WebTraceOptions o;
  o.duration = std::chrono::seconds(30);
  Trace t = GenerateWebTrace(o);
  EXPECT_EQ(Urls(t).size(), 116u);
  ExpectSortedWithin(t.web, o.duration);
}

TEST_F(TraceGenTest, SameSeedGivesTheSameTraces) {
  EXPECT_EQ(GenerateWebTrace().web, GenerateWebTrace().web);
  EXPECT_EQ(GenerateMailTrace().mail, GenerateMailTrace().mail);
  EXPECT_EQ(GenerateBlockTrace().block, GenerateBlockTrace().block);
  WebTraceOptions w;
  w.seed = 77;
  EXPECT_EQ(GenerateWebTrace(w).web, GenerateWebTrace(w).web);
}

TEST_F(TraceGenTest, DifferentSeedsGiveDifferentTraces) {
  WebTraceOptions w;
  w.seed = 2;
  EXPECT_NE(GenerateWebTrace().web, GenerateWebTrace(w).web);
  MailTraceOptions m;
  m.seed = 2;
  EXPECT_NE(GenerateMailTrace().mail, GenerateMailTrace(m).mail);
  BlockTraceOptions b;
  b.seed = 2;
  EXPECT_NE(GenerateBlockTrace().block, GenerateBlockTrace(b).block);
}

TEST_F(TraceGenTest, AllCachedTraceCachesEveryObject) {
  Trace t = GenerateAllCachedWebTrace();
  EXPECT_EQ(Urls(t).size(), 116u);
  EXPECT_EQ(CachedUrls(t), 116u);
  for (const WebRequest& r : t.web) EXPECT_TRUE(r.cached) << r.url;
}

TEST_F(TraceGenTest, AllCachedTraceIsTheWebTraceWithEveryFlagSet) {
  Trace all = GenerateAllCachedWebTrace();
  Trace web = GenerateWebTrace();
  for (WebRequest& r : web.web) r.cached = true;
  EXPECT_EQ(all.web, web.web);
}

TEST_F(TraceGenTest, MailTraceReads41DistinctMessagesAndSends) {
  Trace t = GenerateMailTrace();
  EXPECT_EQ(t.kind, TraceKind::kMail);
  std::set<std::uint32_t> uids;
  std::size_t reads = 0;
  std::size_t sends = 0;
  std::uint32_t last_uid = 0;
  for (const MailEvent& e : t.mail) {
    if (e.op == MailEvent::Op::kRead) {
      ++reads;
      uids.insert(e.uid);
      EXPECT_EQ(e.mailbox, "INBOX");
      EXPECT_GT(e.uid, last_uid) << "a user catching up reads in uid order";
      last_uid = e.uid;
    } else {
      ++sends;
      EXPECT_EQ(e.uid, 0u);
    }
    EXPECT_LE(e.size, MailTraceOptions{}.max_message_size);
  }
  EXPECT_EQ(reads, 41u);
  EXPECT_EQ(uids.size(), 41u);
  EXPECT_GE(sends, 1u);
  EXPECT_EQ(sends, MailTraceOptions{}.sends);
}

TEST_F(TraceGenTest, MailTraceSpansMostOf15Minutes) {
  for (std::uint64_t seed = 1; seed <= 20; ++seed) {
    MailTraceOptions o;
    o.seed = seed;
    Trace t = GenerateMailTrace(o);
    SCOPED_TRACE(seed);
    ExpectSortedWithin(t.mail, std::chrono::minutes(15));
    EXPECT_GT(t.mail.back().time, TimePoint(std::chrono::minutes(13)));
  }
}

TEST_F(TraceGenTest, MailSizesLookLikeMail) {
  std::vector<double> sizes;
  for (std::uint64_t seed = 1; seed <= 30; ++seed) {
    MailTraceOptions o;
    o.seed = seed;
    for (const MailEvent& e : GenerateMailTrace(o).mail)
      sizes.push_back(static_cast<double>(e.size));
  }
  // The fitted mixture has a median near 4 KB and ~10% of messages above 64 KB.
  EXPECT_GT(Median(sizes), 3'000);
  EXPECT_LT(Median(sizes), 6'000);
  const auto big = std::count_if(sizes.begin(), sizes.end(), [](double s) { return s > 65536; });
  EXPECT_GT(static_cast<double>(big) / static_cast<double>(sizes.size()), 0.04);
  EXPECT_LT(static_cast<double>(big) / static_cast<double>(sizes.size()), 0.18);
}

TEST_F(TraceGenTest, MailReaderPausesBetweenBursts) {
  Trace t = GenerateMailTrace();
  std::vector<double> gaps;
  for (std::size_t i = 1; i < t.mail.size(); ++i) {
    gaps.push_back(ToSeconds(t.mail[i].time - t.mail[i - 1].time));
  }
  const double median = Median(gaps);
  EXPECT_GT(median, 5);
  EXPECT_LT(median, 30);
  EXPECT_GT(*std::max_element(gaps.begin(), gaps.end()), 2 * median);
}

TEST_F(TraceGenTest, MailTraceWithoutMessagesStillSends) {
  MailTraceOptions o;
  o.messages = 0;
  o.sends = 2;
  Trace t = GenerateMailTrace(o);
  ASSERT_EQ(t.mail.size(), 2u);
  EXPECT_EQ(t.mail[0].op, MailEvent::Op::kSend);
  ExpectSortedWithin(t.mail, o.duration);
}

TEST_F(TraceGenTest, BlockTraceStaysOnTheDiskAndWithinTheDuration) {
  BlockTraceOptions o;
  Trace t = GenerateBlockTrace(o);
  EXPECT_EQ(t.kind, TraceKind::kBlock);
  ExpectSortedWithin(t.block, o.duration);
  std::size_t hot = 0;
  for (const BlockEvent& e : t.block) {
    EXPECT_GE(e.sectors, 8u);
    EXPECT_EQ(e.sector % 8, 0u);
    EXPECT_LE(e.sector + e.sectors, o.disk_sectors);
    if (e.sector < o.disk_sectors / 10) ++hot;
  }
  const double hot_share = static_cast<double>(hot) / static_cast<double>(t.block.size());
  EXPECT_GT(hot_share, 0.7) << "hot and cold: most requests land in the hot tenth";
  TraceSummary s = SummarizeTrace(t);
  EXPECT_GT(s.reads, 0u);
  EXPECT_GT(s.writes, 0u);
}

TEST_F(TraceGenTest, BlockTraceHasIdlePeriodsLongerThanASpinDown) {
  Trace t = GenerateBlockTrace();
  std::size_t over_5s = 0;
  std::size_t over_10s = 0;
  for (std::size_t i = 1; i < t.block.size(); ++i) {
    Duration gap = t.block[i].time - t.block[i - 1].time;
    over_5s += gap > std::chrono::seconds(5) ? 1 : 0;
    over_10s += gap > std::chrono::seconds(10) ? 1 : 0;
  }
  EXPECT_GT(over_5s, 10u);
  EXPECT_GT(over_10s, 5u);
  EXPECT_GT(t.block.size(), 10 * over_5s) << "requests come in bursts";
}

TEST_F(TraceGenTest, GeneratedTracesSurviveWriteAndParse) {
  for (const Trace& t : {GenerateWebTrace(), GenerateAllCachedWebTrace(), GenerateMailTrace(),
                         GenerateBlockTrace()}) {
    Result<Trace> back = RoundTrip(t);
    ASSERT_TRUE(back.ok()) << back.status().ToString();
    EXPECT_EQ(back->web, t.web);
    EXPECT_EQ(back->mail, t.mail);
    EXPECT_EQ(back->block, t.block);
  }
}

// The traces shipped in common/traces/ are the generators' output with seed 1 and default
// options (regenerate them with the command on their second line if this fails after a
// deliberate model change).
TEST_F(TraceGenTest, ShippedTracesMatchTheGeneratorsWithSeed1) {
  const std::string dir = GHOST_TRACE_DIR;
  struct Shipped {
    const char* file;
    Trace expected;
  };
  const Shipped shipped[] = {
      {"web.trace", GenerateWebTrace()},
      {"web-cached.trace", GenerateAllCachedWebTrace()},
      {"mail.trace", GenerateMailTrace()},
      {"block.trace", GenerateBlockTrace()},
  };
  for (const Shipped& s : shipped) {
    SCOPED_TRACE(s.file);
    Result<Trace> t = LoadTrace(dir + "/" + s.file);
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    EXPECT_EQ(t->kind, s.expected.kind);
    EXPECT_EQ(t->web, s.expected.web);
    EXPECT_EQ(t->mail, s.expected.mail);
    EXPECT_EQ(t->block, s.expected.block);
  }
}

// The NVCache-shaped trace: seeded, in time order, inside the disk; reads outnumber writes;
// the writes come every sync period and most of them overwrite a few hot pages (what makes a
// log flushed only when full merge away most of its records).
TEST(GenerateNvcacheTraceTest, IsSeededAndHasReadBurstsAndAHotOverwriteSet) {
  NvcacheTraceOptions o;
  o.duration = std::chrono::minutes(30);
  Trace t = GenerateNvcacheTrace(o);
  EXPECT_EQ(t.kind, TraceKind::kBlock);
  EXPECT_EQ(t.block, GenerateNvcacheTrace(o).block);
  NvcacheTraceOptions other = o;
  other.seed = 2;
  EXPECT_NE(t.block, GenerateNvcacheTrace(other).block);
  std::size_t reads = 0, writes = 0, hot = 0;
  std::map<std::uint64_t, int> written;  // sector -> writes starting there
  for (std::size_t i = 0; i < t.block.size(); ++i) {
    const BlockEvent& e = t.block[i];
    if (i > 0) {
      EXPECT_LE(t.block[i - 1].time, e.time);
    }
    EXPECT_LE(e.sector + e.sectors, o.disk_sectors);
    EXPECT_GE(e.sectors, 1u);
    EXPECT_LT(e.time, TimePoint(std::chrono::minutes(30)));
    if (e.write) {
      ++writes;
      ++written[e.sector];
    } else {
      ++reads;
    }
  }
  EXPECT_GT(reads, writes);
  // About writes_per_sync (8) per 30 s sync: 60 syncs -> ~480.
  EXPECT_GT(writes, 300u);
  EXPECT_LT(writes, 700u);
  // The 64 most written places take most writes (the hot set: 80% of them).
  std::vector<int> counts;
  for (const auto& [sector, n] : written) counts.push_back(n);
  std::sort(counts.rbegin(), counts.rend());
  for (std::size_t i = 0; i < std::min<std::size_t>(64, counts.size()); ++i) hot += static_cast<std::size_t>(counts[i]);
  EXPECT_GT(static_cast<double>(hot) / static_cast<double>(writes), 0.7);
}

}  // namespace
}  // namespace ghost
