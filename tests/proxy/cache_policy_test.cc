#include "proxy/cache_policy.h"

#include <gtest/gtest.h>

#include <string>

namespace ghost {
namespace {

constexpr std::int64_t kNow = 1'700'000'000;
const Duration kHeuristic = std::chrono::seconds(300);

http1::RequestHead Req(const std::string& method,
                       std::initializer_list<std::pair<const char*, const char*>> fields = {}) {
  http1::RequestHead r;
  r.method = method;
  r.target = "http://example.com/a";
  r.target_form = http1::TargetForm::kAbsolute;
  for (const auto& [n, v] : fields) r.headers.Add(n, v);
  return r;
}

http1::ResponseHead Resp(int status,
                         std::initializer_list<std::pair<const char*, const char*>> fields = {}) {
  http1::ResponseHead r;
  r.status = status;
  r.framing = http1::BodyFraming::kContentLength;
  for (const auto& [n, v] : fields) r.headers.Add(n, v);
  return r;
}

StoredResponse Stored(int status, std::vector<std::pair<std::string, std::string>> fields,
                      std::int64_t stored_unix = kNow, Bytes size = 12) {
  StoredResponse s;
  s.status = status;
  s.headers = std::move(fields);
  s.stored_unix = stored_unix;
  s.size = size;
  return s;
}

TEST(CachePolicyTest, UrlKeyIsNormalized) {
  Result<http1::AbsoluteUrl> a = http1::SplitAbsoluteUrl("HTTP://Example.COM:80/a/b?c=d");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(UrlKey(*a), "http://example.com/a/b?c=d");
  Result<http1::AbsoluteUrl> b = http1::SplitAbsoluteUrl("http://example.com:8080");
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(UrlKey(*b), "http://example.com:8080/");
}

TEST(CachePolicyTest, VariantKeyDependsOnlyOnTheVaryFields) {
  http1::HeaderList en;
  en.Add("Accept-Language", "en");
  en.Add("Accept-Encoding", "gzip,  br");
  en.Add("Cookie", "a=1");
  http1::HeaderList en_again;
  en_again.Add("accept-encoding", "gzip br");  // not the same value: one blank is kept
  en_again.Add("ACCEPT-LANGUAGE", " en ");
  http1::HeaderList en_same;
  en_same.Add("Accept-Encoding", "gzip, br");
  en_same.Add("Accept-Language", "en");
  http1::HeaderList fr;
  fr.Add("Accept-Language", "fr");
  fr.Add("Accept-Encoding", "gzip, br");

  const std::string url = "http://example.com/a";
  const std::string k1 = VariantKey(url, "Accept-Language, Accept-Encoding", en);
  EXPECT_EQ(k1, VariantKey(url, "accept-encoding,accept-language, Accept-Language", en_same));
  EXPECT_NE(k1, VariantKey(url, "Accept-Language, Accept-Encoding", en_again));
  EXPECT_NE(k1, VariantKey(url, "Accept-Language, Accept-Encoding", fr));
  EXPECT_EQ(k1.rfind(url + "#vary;", 0), 0u) << k1;
  EXPECT_EQ(k1.find("Cookie"), std::string::npos);

  http1::HeaderList empty_value;
  empty_value.Add("Accept-Language", "");
  EXPECT_NE(VariantKey(url, "Accept-Language", {}),
            VariantKey(url, "Accept-Language", empty_value));

  http1::HeaderList tricky;
  tricky.Add("X", "a;b=c");
  http1::HeaderList split;
  split.Add("X", "a");
  EXPECT_EQ(VariantKey(url, "X", tricky).find(";b=c"), std::string::npos);  // escaped
}

TEST(CachePolicyTest, VaryIndexIsRecognized) {
  const StoredResponse index = MakeVaryIndex("Accept-Language", kNow);
  std::string vary;
  EXPECT_TRUE(IsVaryIndex(index, &vary));
  EXPECT_EQ(vary, "Accept-Language");
  EXPECT_FALSE(IsVaryIndex(Stored(200, {{"Vary", "Accept-Language"}}), &vary));
}

TEST(CachePolicyTest, RequestDirectives) {
  http1::HeaderList pragma;
  pragma.Add("Pragma", "no-cache");
  EXPECT_TRUE(RequestCacheControl(pragma).no_cache);
  pragma.Add("Cache-Control", "max-age=5");  // Cache-Control wins over Pragma
  EXPECT_FALSE(RequestCacheControl(pragma).no_cache);
  EXPECT_EQ(RequestCacheControl(pragma).max_age, 5);

  http1::HeaderList cc;
  cc.Add("Cache-Control", "max-stale, min-fresh=10");
  cc.Add("Cache-Control", "only-if-cached, no-store");
  const CacheControl c = RequestCacheControl(cc);
  EXPECT_TRUE(c.max_stale.has_value());
  EXPECT_GT(*c.max_stale, 1'000'000'000);
  EXPECT_EQ(c.min_fresh, 10);
  EXPECT_TRUE(c.only_if_cached);
  EXPECT_TRUE(c.no_store);
}

TEST(CachePolicyTest, MethodsAndPreconditions) {
  EXPECT_TRUE(IsLookupMethod("GET"));
  EXPECT_TRUE(IsLookupMethod("HEAD"));
  EXPECT_FALSE(IsLookupMethod("POST"));
  EXPECT_TRUE(InvalidatesCache("POST"));
  EXPECT_TRUE(InvalidatesCache("DELETE"));
  EXPECT_FALSE(InvalidatesCache("GET"));
  EXPECT_FALSE(InvalidatesCache("OPTIONS"));
  EXPECT_TRUE(CacheMayAnswer(Req("GET", {{"If-None-Match", "\"x\""}})));
  EXPECT_FALSE(CacheMayAnswer(Req("GET", {{"If-Match", "\"x\""}})));
  EXPECT_FALSE(
      CacheMayAnswer(Req("GET", {{"If-Unmodified-Since", "Sun, 06 Nov 1994 08:49:37 GMT"}})));
}

TEST(CachePolicyTest, StorageFollowsRfc9111Section3) {
  auto store = [](const http1::RequestHead& q, const http1::ResponseHead& r) {
    return DecideStorage(q, r, kNow, kHeuristic).store;
  };
  EXPECT_TRUE(store(Req("GET"), Resp(200, {{"Cache-Control", "max-age=60"}})));
  EXPECT_TRUE(store(Req("GET"), Resp(200)));  // heuristic
  EXPECT_TRUE(store(Req("GET"), Resp(404)));
  EXPECT_TRUE(store(Req("GET"), Resp(301)));
  EXPECT_FALSE(store(Req("GET"), Resp(302)));  // not cacheable by default
  EXPECT_TRUE(store(Req("GET"), Resp(302, {{"Cache-Control", "max-age=60"}})));
  EXPECT_FALSE(store(Req("GET"), Resp(500)));
  EXPECT_FALSE(store(Req("HEAD"), Resp(200, {{"Cache-Control", "max-age=60"}})));
  EXPECT_FALSE(store(Req("POST"), Resp(200, {{"Cache-Control", "max-age=60"}})));
  EXPECT_FALSE(store(Req("GET"), Resp(206, {{"Cache-Control", "max-age=60"}})));
  EXPECT_FALSE(store(Req("GET"), Resp(304)));
  EXPECT_FALSE(store(Req("GET", {{"Cache-Control", "no-store"}}), Resp(200)));
  EXPECT_FALSE(store(Req("GET"), Resp(200, {{"Cache-Control", "no-store"}})));
  EXPECT_FALSE(store(Req("GET"), Resp(200, {{"Cache-Control", "private, max-age=60"}})));
  EXPECT_FALSE(store(Req("GET"), Resp(200, {{"Vary", "Accept, *"}})));
  EXPECT_TRUE(
      store(Req("GET"), Resp(200, {{"Cache-Control", "no-cache"}})));  // stored, always revalidated
  EXPECT_FALSE(store(Req("GET", {{"Authorization", "Basic x"}}),
                     Resp(200, {{"Cache-Control", "max-age=60"}})));
  EXPECT_TRUE(
      store(Req("GET", {{"Authorization", "Basic x"}}), Resp(200, {{"Cache-Control", "public"}})));
  EXPECT_TRUE(store(Req("GET", {{"Authorization", "Basic x"}}),
                    Resp(200, {{"Cache-Control", "s-maxage=60"}})));
  EXPECT_TRUE(store(Req("GET", {{"Authorization", "Basic x"}}),
                    Resp(200, {{"Cache-Control", "must-revalidate"}})));
  // A cookie is one client's; the answer to a range or a precondition is not the resource's.
  EXPECT_FALSE(store(Req("GET"), Resp(200, {{"Cache-Control", "max-age=60"},
                                            {"Set-Cookie", "session=1"}})));
  for (const char* field : {"Range", "If-Range", "If-Match", "If-None-Match", "If-Modified-Since",
                            "If-Unmodified-Since"}) {
    SCOPED_TRACE(field);
    EXPECT_FALSE(store(Req("GET", {{field, "bytes=999999-"}}),
                       Resp(416, {{"Cache-Control", "max-age=60"}})));
    EXPECT_FALSE(store(Req("GET", {{field, "x"}}), Resp(412, {{"Cache-Control", "max-age=60"}})));
    EXPECT_FALSE(store(Req("GET", {{field, "x"}}), Resp(404)));
    EXPECT_TRUE(store(Req("GET", {{field, "x"}}), Resp(200, {{"Cache-Control", "max-age=60"}})));
  }
  EXPECT_TRUE(store(Req("GET"), Resp(416, {{"Cache-Control", "max-age=60"}})));
  EXPECT_STRNE(
      DecideStorage(Req("GET"), Resp(200, {{"Cache-Control", "private"}}), kNow, kHeuristic)
          .why_not,
      "");
}

TEST(CachePolicyTest, StoredResponseKeepsEndToEndFieldsAndItsExpiry) {
  const http1::ResponseHead r = Resp(200, {{"Cache-Control", "max-age=100"},
                                           {"Age", "10"},
                                           {"Connection", "close, X-Hop"},
                                           {"X-Hop", "1"},
                                           {"Keep-Alive", "timeout=5"},
                                           {"Content-Length", "12"},
                                           {"X-Ghost-Source", "cache"},
                                           {"ETag", "\"v1\""}});
  const StorageDecision d = DecideStorage(Req("GET"), r, kNow, kHeuristic);
  ASSERT_TRUE(d.store);
  const StoredResponse s = MakeStoredResponse(r, d.freshness, kNow, 12);
  std::vector<std::string> names;
  for (const auto& [n, v] : s.headers) names.push_back(n);
  EXPECT_EQ(names, (std::vector<std::string>{"Cache-Control", "Age", "ETag"}));
  EXPECT_EQ(s.stored_unix, kNow);
  ASSERT_TRUE(s.expires_unix.has_value());
  EXPECT_EQ(*s.expires_unix, kNow + 90);  // 100 s of life, 10 s of it already used
  EXPECT_EQ(s.size, 12u);
}

TEST(CachePolicyTest, FreshnessAndTheClientsDirectives) {
  StoredResponse s = Stored(200, {{"Cache-Control", "max-age=100"}, {"ETag", "\"v1\""}});
  CacheControl none;
  StoredState st = EvaluateStored(s, none, kNow + 50, kHeuristic);
  EXPECT_TRUE(st.fresh);
  EXPECT_TRUE(st.usable);
  EXPECT_EQ(st.age, 50);
  EXPECT_EQ(st.remaining, 50);
  EXPECT_TRUE(st.has_validators);
  EXPECT_TRUE(st.may_serve_stale);

  st = EvaluateStored(s, none, kNow + 150, kHeuristic);
  EXPECT_FALSE(st.fresh);
  EXPECT_FALSE(st.usable);
  EXPECT_EQ(st.remaining, -50);

  CacheControl max_age0;
  max_age0.max_age = 0;
  EXPECT_FALSE(EvaluateStored(s, max_age0, kNow, kHeuristic).usable);  // a reload revalidates
  CacheControl max_age10;
  max_age10.max_age = 10;
  EXPECT_TRUE(EvaluateStored(s, max_age10, kNow + 5, kHeuristic).usable);
  EXPECT_FALSE(EvaluateStored(s, max_age10, kNow + 20, kHeuristic).usable);
  CacheControl no_cache;
  no_cache.no_cache = true;
  EXPECT_FALSE(EvaluateStored(s, no_cache, kNow, kHeuristic).usable);
  CacheControl min_fresh;
  min_fresh.min_fresh = 60;
  EXPECT_FALSE(EvaluateStored(s, min_fresh, kNow + 50, kHeuristic).usable);
  CacheControl max_stale;
  max_stale.max_stale = 60;
  EXPECT_TRUE(EvaluateStored(s, max_stale, kNow + 150, kHeuristic).usable);
  EXPECT_FALSE(EvaluateStored(s, max_stale, kNow + 200, kHeuristic).usable);

  StoredResponse strict = Stored(200, {{"Cache-Control", "max-age=100, must-revalidate"}});
  st = EvaluateStored(strict, max_stale, kNow + 150, kHeuristic);
  EXPECT_FALSE(st.usable);
  EXPECT_FALSE(st.may_serve_stale);
  EXPECT_FALSE(st.has_validators);

  // The backend's expiry, when it has one, wins over the fields.
  s.expires_unix = kNow + 500;
  EXPECT_TRUE(EvaluateStored(s, none, kNow + 400, kHeuristic).fresh);
}

TEST(CachePolicyTest, ValidatorsReplaceTheClients) {
  http1::HeaderList h;
  h.Add("If-None-Match", "\"client\"");
  h.Add("Range", "bytes=0-1");
  h.Add("Accept", "*/*");
  StoredResponse s =
      Stored(200, {{"ETag", "\"v1\""}, {"Last-Modified", "Sun, 06 Nov 1994 08:49:37 GMT"}});
  EXPECT_TRUE(SetValidators(s, &h));
  EXPECT_EQ(h.FindAll("If-None-Match"), "\"v1\"");
  EXPECT_EQ(*h.Find("If-Modified-Since"), "Sun, 06 Nov 1994 08:49:37 GMT");
  EXPECT_EQ(h.Find("Range"), nullptr);
  EXPECT_NE(h.Find("Accept"), nullptr);
  http1::HeaderList none;
  EXPECT_FALSE(SetValidators(Stored(200, {}), &none));
  EXPECT_TRUE(none.empty());
}

TEST(CachePolicyTest, A304RefreshesTheStoredFields) {
  StoredResponse s = Stored(
      200, {{"Cache-Control", "max-age=10"}, {"ETag", "\"v1\""}, {"X-Keep", "1"}}, kNow - 100);
  const http1::ResponseHead nm = Resp(304, {{"Cache-Control", "max-age=60"},
                                            {"Content-Length", "0"},
                                            {"X-New", "2"},
                                            {"Connection", "close"}});
  const StoredResponse r = RefreshStored(s, nm, kNow, kHeuristic);
  EXPECT_EQ(r.stored_unix, kNow);
  ASSERT_TRUE(r.expires_unix.has_value());
  EXPECT_EQ(*r.expires_unix, kNow + 60);
  EXPECT_EQ(r.size, 12u);
  std::string all;
  for (const auto& [n, v] : r.headers) all += n + "=" + v + ";";
  EXPECT_EQ(all, "ETag=\"v1\";X-Keep=1;Cache-Control=max-age=60;X-New=2;");
}

TEST(CachePolicyTest, ConditionalRequestsAgainstAStoredResponse) {
  const StoredResponse s =
      Stored(200, {{"ETag", "W/\"v1\""}, {"Last-Modified", "Sun, 06 Nov 1994 08:49:37 GMT"}});
  EXPECT_TRUE(IsNotModified(Req("GET", {{"If-None-Match", "\"v1\""}}), s));  // weak comparison
  EXPECT_TRUE(IsNotModified(Req("HEAD", {{"If-None-Match", "\"x\", W/\"v1\""}}), s));
  EXPECT_TRUE(IsNotModified(Req("GET", {{"If-None-Match", "*"}}), s));
  EXPECT_FALSE(IsNotModified(Req("GET", {{"If-None-Match", "\"v2\""}}), s));
  // If-None-Match decides alone when present.
  EXPECT_FALSE(IsNotModified(Req("GET", {{"If-None-Match", "\"v2\""},
                                         {"If-Modified-Since", "Mon, 07 Nov 1994 08:49:37 GMT"}}),
                             s));
  EXPECT_TRUE(
      IsNotModified(Req("GET", {{"If-Modified-Since", "Sun, 06 Nov 1994 08:49:37 GMT"}}), s));
  EXPECT_FALSE(
      IsNotModified(Req("GET", {{"If-Modified-Since", "Sat, 05 Nov 1994 08:49:37 GMT"}}), s));
  EXPECT_FALSE(IsNotModified(Req("GET", {{"If-Modified-Since", "garbage"}}), s));
  EXPECT_FALSE(IsNotModified(Req("POST", {{"If-None-Match", "*"}}), s));
  EXPECT_FALSE(IsNotModified(Req("GET", {{"If-None-Match", "*"}}), Stored(404, {})));

  const http1::HeaderList f = NotModifiedFields(Stored(200, {{"ETag", "\"a\""},
                                                             {"Content-Type", "text/html"},
                                                             {"Cache-Control", "max-age=5"},
                                                             {"Vary", "Accept"}}));
  EXPECT_EQ(f.size(), 3u);
  EXPECT_EQ(f.Find("Content-Type"), nullptr);
}

TEST(CachePolicyTest, RangesAgainstAStoredBody) {
  const StoredResponse s =
      Stored(200, {{"ETag", "\"v1\""}, {"Last-Modified", "Sun, 06 Nov 1994 08:49:37 GMT"}});
  auto range = [&](std::initializer_list<std::pair<const char*, const char*>> fields,
                   const std::string& method = "GET") {
    return EvaluateRange(Req(method, fields), s, 100);
  };
  using Kind = RangeDecision::Kind;
  RangeDecision r = range({{"Range", "bytes=10-19"}});
  EXPECT_EQ(r.kind, Kind::kPartial);
  EXPECT_EQ(r.first, 10u);
  EXPECT_EQ(r.last, 19u);
  r = range({{"Range", "bytes=90-200"}});
  EXPECT_EQ(r.kind, Kind::kPartial);
  EXPECT_EQ(r.last, 99u);
  r = range({{"Range", "bytes=95-"}});
  EXPECT_EQ(r.first, 95u);
  r = range({{"Range", "bytes=-10"}});
  EXPECT_EQ(r.kind, Kind::kPartial);
  EXPECT_EQ(r.first, 90u);
  r = range({{"Range", "bytes=-1000"}});
  EXPECT_EQ(r.first, 0u);
  EXPECT_EQ(range({{"Range", "bytes=100-"}}).kind, Kind::kUnsatisfiable);
  EXPECT_EQ(range({{"Range", "bytes=-0"}}).kind, Kind::kUnsatisfiable);
  EXPECT_EQ(range({{"Range", "bytes=0-1,5-6"}}).kind, Kind::kFull);  // several: whole body
  EXPECT_EQ(range({{"Range", "bytes=5-1"}}).kind, Kind::kFull);      // invalid: ignored
  EXPECT_EQ(range({{"Range", "items=0-1"}}).kind, Kind::kFull);
  EXPECT_EQ(range({{"Range", "bytes=x-1"}}).kind, Kind::kFull);
  EXPECT_EQ(range({{"Range", "bytes=0-1"}}, "HEAD").kind, Kind::kFull);
  EXPECT_EQ(range({}).kind, Kind::kFull);
  EXPECT_EQ(range({{"Range", "bytes=0-1"}, {"If-Range", "\"v1\""}}).kind, Kind::kPartial);
  EXPECT_EQ(range({{"Range", "bytes=0-1"}, {"If-Range", "\"v2\""}}).kind, Kind::kFull);
  EXPECT_EQ(range({{"Range", "bytes=0-1"}, {"If-Range", "W/\"v1\""}}).kind,
            Kind::kFull);  // weak never matches
  EXPECT_EQ(range({{"Range", "bytes=0-1"}, {"If-Range", "Sun, 06 Nov 1994 08:49:37 GMT"}}).kind,
            Kind::kPartial);
  EXPECT_EQ(range({{"Range", "bytes=0-1"}, {"If-Range", "Mon, 07 Nov 1994 08:49:37 GMT"}}).kind,
            Kind::kFull);
}

}  // namespace
}  // namespace ghost
