#include "common/http/http_freshness.h"

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <utility>
#include <vector>

namespace ghost {
namespace {

constexpr std::int64_t kSunday6Nov1994 = 784111777;  // Sun, 06 Nov 1994 08:49:37 GMT
constexpr std::int64_t kNow = 1795377480;            // Sun, 22 Nov 2026 19:58:00 GMT
const TimePoint kModelNow = TimePoint(Seconds(1000));
const Duration kDefault = Seconds(300);

// A finished head with the given status and header fields.
HttpResponseHead Head(int status, std::vector<std::pair<std::string, std::string>> fields) {
  HttpResponseHead h;
  h.AddHeaderLine("HTTP/1.1 " + std::to_string(status) + " X\r\n");
  for (const auto& [name, value] : fields) h.AddHeaderLine(name + ": " + value + "\r\n");
  h.Finish();
  return h;
}

FreshnessInfo Compute(const HttpResponseHead& h) {
  return ComputeFreshness(h, kModelNow, kNow, kDefault);
}

std::string DateAt(std::int64_t unix_seconds) { return FormatHttpDate(unix_seconds); }

// ---- HTTP-date ----

TEST(HttpDateTest, ParsesTheThreeFormats) {
  EXPECT_EQ(ParseHttpDate("Sun, 06 Nov 1994 08:49:37 GMT"), kSunday6Nov1994);
  EXPECT_EQ(ParseHttpDate("Sunday, 06-Nov-94 08:49:37 GMT"), kSunday6Nov1994);
  EXPECT_EQ(ParseHttpDate("Sun Nov  6 08:49:37 1994"), kSunday6Nov1994);
  EXPECT_EQ(ParseHttpDate("  Sun, 06 Nov 1994 08:49:37 GMT \r\n"), kSunday6Nov1994);
  // RFC 850 two-digit years: 70–99 are 19xx, 00–69 are 20xx.
  EXPECT_EQ(ParseHttpDate("Thursday, 01-Jan-70 00:00:00 GMT"), 0);
  EXPECT_EQ(ParseHttpDate("Thursday, 29-Feb-24 12:00:00 GMT"), 1709208000);
  // Leap day, single-digit asctime day, end of year.
  EXPECT_EQ(ParseHttpDate("Thu, 29 Feb 2024 12:00:00 GMT"), 1709208000);
  EXPECT_EQ(ParseHttpDate("Thu Feb 29 12:00:00 2024"), 1709208000);
  EXPECT_EQ(ParseHttpDate("Fri, 31 Dec 1999 23:59:59 GMT"), 946684799);
}

// Found by tests/fuzz/http_head_fuzz.cc: a leap second at the very end of year 9999 parsed to
// a time that formats as year 10000, which does not parse back.
TEST(HttpDateTest, EveryAcceptedDateFormatsBackToItselfEvenALeapSecondAtYear9999) {
  EXPECT_EQ(ParseHttpDate("Fri, 31 Dec 9999 23:59:60 GMT"), std::nullopt);
  EXPECT_EQ(ParseHttpDate("Fri, 31 Dec 9999 23:59:59 GMT"), 253402300799);
  for (const char* good : {"Fri, 31 Dec 9999 23:59:59 GMT", "Sat, 31 Dec 2016 23:59:60 GMT",
                           "Thu, 01 Jan 1970 00:00:00 GMT"}) {
    const std::optional<std::int64_t> t = ParseHttpDate(good);
    ASSERT_TRUE(t) << good;
    EXPECT_EQ(ParseHttpDate(FormatHttpDate(*t)), t) << good << " -> " << FormatHttpDate(*t);
  }
}

TEST(HttpDateTest, RejectsMalformedDates) {
  for (const char* bad : {"",
                          "0",
                          "-1",
                          "yesterday",
                          "Sun, 06 Nov 1994 08:49:37",  // no GMT
                          "Sun, 06 Nov 1994 08:49:37 UTC",
                          "Sun, 06 Nov 1994 08:49:37 GMT extra",
                          "Sun, 31 Feb 1994 08:49:37 GMT",
                          "Sun, 29 Feb 2023 08:49:37 GMT",
                          "Sun, 06 Nov 1994 24:00:00 GMT",
                          "Sun, 06 Nov 1994 08:60:00 GMT",
                          "Sun, 06 Foo 1994 08:49:37 GMT",
                          "Sun, 00 Nov 1994 08:49:37 GMT",
                          "Sun, 06 Nov 94 08:49:37 GMT",
                          "Xyz, 06 Nov 1994 08:49:37 GMT",
                          "Sun 06 Nov 1994 08:49:37 GMT",
                          "Sun, 06 Nov 1994 8:49:37 GMT",
                          "Sunday, 06-Nov-1994 08:49:37 GMT",
                          "Sun Nov  6 08:49:37 94",
                          "Sun Nov 6 08:49:37",
                          "Sun, 06 Nov 1994 08:49:37 GMT\x01"}) {
    EXPECT_FALSE(ParseHttpDate(bad).has_value()) << bad;
  }
}

TEST(HttpDateTest, FormatsImfFixdateAndRoundTrips) {
  EXPECT_EQ(FormatHttpDate(kSunday6Nov1994), "Sun, 06 Nov 1994 08:49:37 GMT");
  EXPECT_EQ(FormatHttpDate(0), "Thu, 01 Jan 1970 00:00:00 GMT");
  EXPECT_EQ(FormatHttpDate(-1), "Wed, 31 Dec 1969 23:59:59 GMT");
  std::mt19937_64 rng(7);
  for (int i = 0; i < 2000; ++i) {
    const std::int64_t t = static_cast<std::int64_t>(rng() % 8'000'000'000ULL) - 1'000'000'000;
    EXPECT_EQ(ParseHttpDate(FormatHttpDate(t)), t) << FormatHttpDate(t);
  }
}

TEST(HttpDateTest, SurvivesRandomBytes) {
  std::mt19937_64 rng(11);
  const std::string base = "Sun, 06 Nov 1994 08:49:37 GMT";
  int parsed = 0;
  for (int i = 0; i < 5000; ++i) {
    std::string s = base;
    s[rng() % s.size()] = static_cast<char>(rng());
    if (rng() % 3 == 0) s.resize(rng() % s.size());
    std::optional<std::int64_t> t = ParseHttpDate(s);
    if (s == base) {
      EXPECT_EQ(t, kSunday6Nov1994);
    }
    if (!t) continue;
    ++parsed;
    // Whatever parses is a real date that formats back to a parseable IMF-fixdate.
    EXPECT_EQ(ParseHttpDate(FormatHttpDate(*t)), t) << s;
  }
  // Most single-byte changes break the date; some (e.g. in the weekday) do not.
  EXPECT_LT(parsed, 5000);
}

// ---- Freshness ----

TEST(HttpFreshnessTest, MaxAgeGivesTheLifetime) {
  const FreshnessInfo f = Compute(Head(200, {{"Cache-Control", "public, max-age=600"}}));
  EXPECT_TRUE(f.storable);
  EXPECT_FALSE(f.must_revalidate);
  EXPECT_FALSE(f.heuristic);
  EXPECT_EQ(f.lifetime, Seconds(600));
  EXPECT_EQ(f.age, Duration::zero());
  EXPECT_EQ(f.fresh_until, kModelNow + Seconds(600));
  EXPECT_TRUE(f.IsFresh(kModelNow + Seconds(599)));
  EXPECT_FALSE(f.IsFresh(kModelNow + Seconds(600)));
}

TEST(HttpFreshnessTest, SharedMaxAgeWinsAndImpliesRevalidation) {
  const FreshnessInfo f = Compute(Head(200, {{"Cache-Control", "max-age=600, s-maxage=60"}}));
  EXPECT_EQ(f.lifetime, Seconds(60));
  EXPECT_TRUE(f.must_revalidate);
  EXPECT_TRUE(f.storable);
}

TEST(HttpFreshnessTest, MaxAgeBeatsExpires) {
  const FreshnessInfo f = Compute(Head(
      200,
      {{"Cache-Control", "max-age=5"}, {"Date", DateAt(kNow)}, {"Expires", DateAt(kNow + 3600)}}));
  EXPECT_EQ(f.lifetime, Seconds(5));
}

TEST(HttpFreshnessTest, ExpiresMinusDate) {
  // The origin's clock is 100 s behind ours: Expires − Date, not Expires − now, is the
  // lifetime, and the response is already 100 s old.
  const FreshnessInfo f =
      Compute(Head(200, {{"Date", DateAt(kNow - 100)}, {"Expires", DateAt(kNow + 500)}}));
  EXPECT_TRUE(f.storable);
  EXPECT_EQ(f.lifetime, Seconds(600));
  EXPECT_EQ(f.age, Seconds(100));
  EXPECT_EQ(f.fresh_until, kModelNow + Seconds(500));
  // Without Date, the time of receipt stands in.
  const FreshnessInfo no_date = Compute(Head(200, {{"Expires", DateAt(kNow + 50)}}));
  EXPECT_EQ(no_date.lifetime, Seconds(50));
}

TEST(HttpFreshnessTest, InvalidOrPastExpiresMeansStale) {
  for (const std::string& expires : {std::string("0"), std::string("never"), DateAt(kNow - 10)}) {
    const FreshnessInfo f = Compute(Head(
        200,
        {{"Date", DateAt(kNow)}, {"Expires", expires}, {"Last-Modified", DateAt(kNow - 86400)}}));
    EXPECT_TRUE(f.storable) << expires;
    EXPECT_FALSE(f.heuristic) << expires;  // explicit, even if invalid: no heuristic
    EXPECT_EQ(f.lifetime, Duration::zero()) << expires;
    EXPECT_FALSE(f.IsFresh(kModelNow)) << expires;
  }
}

TEST(HttpFreshnessTest, NoStoreAndPrivateAreNotStorable) {
  EXPECT_FALSE(Compute(Head(200, {{"Cache-Control", "no-store"}})).storable);
  EXPECT_FALSE(Compute(Head(200, {{"Cache-Control", "private, max-age=600"}})).storable);
  EXPECT_FALSE(Compute(Head(200, {{"Cache-Control", "max-age=60"}, {"Cache-Control", "NO-STORE"}}))
                   .storable);
}

TEST(HttpFreshnessTest, NoCacheIsStoredButAlwaysRevalidated) {
  const FreshnessInfo f = Compute(Head(200, {{"Cache-Control", "no-cache, max-age=600"}}));
  EXPECT_TRUE(f.storable);
  EXPECT_TRUE(f.must_revalidate);
  EXPECT_EQ(f.lifetime, Duration::zero());
  EXPECT_FALSE(f.IsFresh(kModelNow));
  // Qualified no-cache ("no-cache=\"Set-Cookie, X\"", a quoted list with a comma) is taken
  // as plain no-cache, and the directive after it is still read.
  const FreshnessInfo q =
      Compute(Head(200, {{"Cache-Control", "no-cache=\"Set-Cookie, X\", must-revalidate"}}));
  EXPECT_EQ(q.lifetime, Duration::zero());
  EXPECT_TRUE(q.must_revalidate);
}

TEST(HttpFreshnessTest, PragmaNoCacheCountsOnlyWithoutCacheControl) {
  EXPECT_EQ(Compute(Head(200, {{"Pragma", "no-cache"}})).lifetime, Duration::zero());
  EXPECT_TRUE(Compute(Head(200, {{"Pragma", "no-cache"}})).must_revalidate);
  EXPECT_EQ(Compute(Head(200, {{"Pragma", "no-cache"}, {"Cache-Control", "max-age=60"}})).lifetime,
            Seconds(60));
}

TEST(HttpFreshnessTest, MustRevalidateIsReported) {
  const FreshnessInfo f = Compute(Head(200, {{"Cache-Control", "max-age=60, must-revalidate"}}));
  EXPECT_TRUE(f.must_revalidate);
  EXPECT_EQ(f.lifetime, Seconds(60));
  EXPECT_TRUE(Compute(Head(200, {{"Cache-Control", "proxy-revalidate"}})).must_revalidate);
  EXPECT_FALSE(Compute(Head(200, {{"Cache-Control", "max-age=60"}})).must_revalidate);
}

TEST(HttpFreshnessTest, AgeHeaderAndClockSkewAgeTheResponse) {
  const FreshnessInfo by_header = Compute(
      Head(200, {{"Cache-Control", "max-age=600"}, {"Date", DateAt(kNow)}, {"Age", "200"}}));
  EXPECT_EQ(by_header.age, Seconds(200));
  EXPECT_EQ(by_header.fresh_until, kModelNow + Seconds(400));

  const FreshnessInfo by_date = Compute(
      Head(200, {{"Cache-Control", "max-age=600"}, {"Date", DateAt(kNow - 300)}, {"Age", "100"}}));
  EXPECT_EQ(by_date.age, Seconds(300));  // the larger of the two
  // A Date in the future gives no negative age.
  const FreshnessInfo future =
      Compute(Head(200, {{"Cache-Control", "max-age=600"}, {"Date", DateAt(kNow + 999)}}));
  EXPECT_EQ(future.age, Duration::zero());
  // Older than its lifetime: stale on arrival.
  const FreshnessInfo old = Compute(Head(200, {{"Cache-Control", "max-age=60"}, {"Age", "61"}}));
  EXPECT_FALSE(old.IsFresh(kModelNow));
  // An invalid Age is ignored.
  EXPECT_EQ(Compute(Head(200, {{"Cache-Control", "max-age=60"}, {"Age", "soon"}})).age,
            Duration::zero());
}

TEST(HttpFreshnessTest, HeuristicIsTenPercentOfTheTimeSinceLastModified) {
  const FreshnessInfo f =
      Compute(Head(200, {{"Date", DateAt(kNow)}, {"Last-Modified", DateAt(kNow - 10 * 3600)}}));
  EXPECT_TRUE(f.storable);
  EXPECT_TRUE(f.heuristic);
  EXPECT_EQ(f.lifetime, Seconds(3600));
}

TEST(HttpFreshnessTest, HeuristicIsCappedAtOneDay) {
  const FreshnessInfo f =
      Compute(Head(200, {{"Date", DateAt(kNow)}, {"Last-Modified", DateAt(kNow - 400 * 86400)}}));
  EXPECT_EQ(f.lifetime, Seconds(86400));
}

TEST(HttpFreshnessTest, HeuristicDefaultWithoutLastModified) {
  const FreshnessInfo f = Compute(Head(200, {{"Date", DateAt(kNow)}}));
  EXPECT_TRUE(f.storable);
  EXPECT_TRUE(f.heuristic);
  EXPECT_EQ(f.lifetime, kDefault);
  const FreshnessInfo junk = Compute(Head(200, {{"Last-Modified", "last tuesday"}}));
  EXPECT_EQ(junk.lifetime, kDefault);
  // Modified "in the future" (clock skew): no heuristic freshness at all.
  EXPECT_EQ(
      Compute(Head(200, {{"Date", DateAt(kNow)}, {"Last-Modified", DateAt(kNow + 60)}})).lifetime,
      Duration::zero());
}

TEST(HttpFreshnessTest, OnlyHeuristicallyCacheableStatusesGetHeuristics) {
  for (int status : {200, 203, 204, 206, 300, 301, 304, 308, 404, 405, 410, 414, 501}) {
    EXPECT_TRUE(Compute(Head(status, {})).storable) << status;
  }
  for (int status : {201, 302, 303, 307, 400, 403, 500, 502, 503}) {
    EXPECT_FALSE(Compute(Head(status, {})).storable) << status;
    EXPECT_TRUE(Compute(Head(status, {{"Cache-Control", "max-age=10"}})).storable) << status;
    EXPECT_TRUE(Compute(Head(status, {{"Cache-Control", "public"}})).storable) << status;
  }
  EXPECT_FALSE(Compute(Head(100, {{"Cache-Control", "max-age=10"}})).storable);
  EXPECT_FALSE(Compute(HttpResponseHead{}).storable);
}

TEST(HttpFreshnessTest, DirectiveValuesAreParsedCarefully) {
  // Quoted value, spaces, case.
  EXPECT_EQ(Compute(Head(200, {{"Cache-Control", "MAX-AGE = \"120\""}})).lifetime, Seconds(120));
  // First occurrence wins.
  EXPECT_EQ(Compute(Head(200, {{"Cache-Control", "max-age=10, max-age=999"}})).lifetime,
            Seconds(10));
  // Invalid value: stale.
  EXPECT_EQ(Compute(Head(200, {{"Cache-Control", "max-age=ten"}})).lifetime, Duration::zero());
  EXPECT_EQ(Compute(Head(200, {{"Cache-Control", "max-age"}})).lifetime, Duration::zero());
  // Huge values saturate at 2^31 s (RFC 9111 §1.2.2).
  EXPECT_EQ(Compute(Head(200, {{"Cache-Control", "max-age=99999999999999999999999"}})).lifetime,
            Seconds(2147483648.0));
  // Unknown directives are ignored.
  EXPECT_EQ(Compute(Head(200, {{"Cache-Control",
                                "immutable, stale-while-revalidate=5, "
                                "max-age=30"}}))
                .lifetime,
            Seconds(30));
}

TEST(HttpFreshnessTest, VaryStarAlwaysRevalidates) {
  const FreshnessInfo f =
      Compute(Head(200, {{"Cache-Control", "max-age=600"}, {"Vary", "Accept, *"}}));
  EXPECT_EQ(f.lifetime, Duration::zero());
  EXPECT_TRUE(f.must_revalidate);
  EXPECT_EQ(
      Compute(Head(200, {{"Cache-Control", "max-age=600"}, {"Vary", "Accept-Encoding"}})).lifetime,
      Seconds(600));
}

}  // namespace
}  // namespace ghost
