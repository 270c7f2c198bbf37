#include "proxy/cache_policy.h"

#include <algorithm>
#include <set>
#include <vector>

namespace ghost {
namespace {

constexpr const char* kVaryIndexField = "X-Ghost-Vary-Index";

std::string Lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) {
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  }
  return out;
}

// Calls fn(element) for each non-empty, trimmed element of a comma-separated list.
template <typename Fn>
void ForEachElement(std::string_view list, Fn fn) {
  std::size_t i = 0;
  while (i <= list.size()) {
    std::size_t comma = list.find(',', i);
    if (comma == std::string_view::npos) comma = list.size();
    const std::string_view e = TrimBlanks(list.substr(i, comma - i));
    if (!e.empty()) fn(e);
    i = comma + 1;
  }
}

bool ListHas(std::string_view list, std::string_view token) {
  bool found = false;
  ForEachElement(list, [&](std::string_view e) { found = found || EqualsIgnoreCase(e, token); });
  return found;
}

// Runs of blanks become one space; leading and trailing blanks go.
std::string CollapseBlanks(std::string_view v) {
  std::string out;
  bool blank = false;
  for (char c : TrimBlanks(v)) {
    if (c == ' ' || c == '\t') {
      blank = true;
      continue;
    }
    if (blank) out += ' ';
    blank = false;
    out += c;
  }
  return out;
}

// Escapes the bytes that structure a variant key (';', '=', '%') and non-printable bytes.
std::string EscapeKeyPart(std::string_view v) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : v) {
    if (c <= 0x20 || c >= 0x7f || c == ';' || c == '=' || c == '%') {
      out += '%';
      out += kHex[c >> 4];
      out += kHex[c & 15];
    } else {
      out += static_cast<char>(c);
    }
  }
  return out;
}

HttpResponseHead ToHead(const StoredResponse& stored) {
  HttpResponseHead h;
  h.status = stored.status;
  h.headers = stored.headers;
  h.Finish();
  return h;
}

std::int64_t WholeSeconds(Duration d) {
  return std::chrono::duration_cast<std::chrono::seconds>(d).count();
}

// An entity-tag without its weakness prefix: the opaque-tag with its quotes.
std::string_view OpaqueTag(std::string_view tag, bool* weak) {
  tag = TrimBlanks(tag);
  *weak = tag.size() >= 2 && tag[0] == 'W' && tag[1] == '/';
  if (*weak) tag.remove_prefix(2);
  return tag;
}

// Fields a stored response never keeps: the framing, and what the proxy itself adds.
bool NotStoredField(std::string_view name) {
  return EqualsIgnoreCase(name, "Content-Length") || EqualsIgnoreCase(name, "X-Ghost-Source") ||
         EqualsIgnoreCase(name, kVaryIndexField) || http1::IsHopByHopHeader(name);
}

std::optional<std::int64_t> ExpiresAt(const FreshnessInfo& f, std::int64_t now_unix) {
  return now_unix + WholeSeconds(f.lifetime) - WholeSeconds(f.age);
}

// The request carries fields that can make the origin answer something other than the
// resource as it is (RFC 9110 §13, §14): a range, or a precondition.
bool AnswersRequestFields(const http1::RequestHead& request) {
  for (const char* name : {"Range", "If-Range", "If-Match", "If-None-Match", "If-Modified-Since",
                           "If-Unmodified-Since"}) {
    if (request.headers.Count(name) > 0) return true;
  }
  return false;
}

}  // namespace

// ---- Keys ----

std::string UrlKey(const http1::AbsoluteUrl& url) { return "http://" + url.Authority() + url.path; }

std::string VariantKey(const std::string& url_key, std::string_view vary,
                       const http1::HeaderList& request_headers) {
  std::set<std::string> names;
  ForEachElement(vary, [&](std::string_view e) { names.insert(Lower(e)); });
  std::string key = url_key + "#vary";
  for (const std::string& name : names) {
    key += ';';
    key += EscapeKeyPart(name);
    if (request_headers.Count(name) == 0) {
      key += '!';  // absent, unlike an empty value
      continue;
    }
    key += '=';
    key += EscapeKeyPart(CollapseBlanks(request_headers.FindAll(name)));
  }
  return key;
}

StoredResponse MakeVaryIndex(std::string_view vary, std::int64_t now_unix) {
  StoredResponse index;
  index.status = 200;
  index.headers = {{"Vary", std::string(vary)}, {kVaryIndexField, "1"}};
  index.size = 0;
  index.stored_unix = now_unix;
  return index;
}

bool IsVaryIndex(const StoredResponse& stored, std::string* vary) {
  bool index = false;
  std::string v;
  for (const auto& [name, value] : stored.headers) {
    if (EqualsIgnoreCase(name, kVaryIndexField)) index = true;
    if (EqualsIgnoreCase(name, "Vary")) v = v.empty() ? value : v + ", " + value;
  }
  if (index && vary != nullptr) *vary = v;
  return index;
}

// ---- Requests ----

CacheControl RequestCacheControl(const http1::HeaderList& headers) {
  if (headers.Count("Cache-Control") > 0)
    return ParseCacheControl(headers.FindAll("Cache-Control"));
  CacheControl cc;
  cc.no_cache = ListHas(headers.FindAll("Pragma"), "no-cache");
  return cc;
}

bool IsLookupMethod(std::string_view method) { return method == "GET" || method == "HEAD"; }

bool InvalidatesCache(std::string_view method) {
  return method != "GET" && method != "HEAD" && method != "OPTIONS" && method != "TRACE";
}

bool CacheMayAnswer(const http1::RequestHead& request) {
  return request.headers.Count("If-Match") == 0 &&
         request.headers.Count("If-Unmodified-Since") == 0;
}

// ---- Storing ----

StorageDecision DecideStorage(const http1::RequestHead& request,
                              const http1::ResponseHead& response, std::int64_t now_unix,
                              Duration heuristic_default) {
  StorageDecision d;
  if (request.method != "GET") {
    d.why_not = "only responses to GET are stored";
    return d;
  }
  if (response.status < 200 || response.status == 304) {
    d.why_not = "not a complete response";
    return d;
  }
  if (response.status == 206) {
    d.why_not = "partial content (the cache keeps whole bodies)";
    return d;
  }
  if (RequestCacheControl(request.headers).no_store) {
    d.why_not = "the request says no-store";
    return d;
  }
  if (response.status != 200 && AnswersRequestFields(request)) {
    // A 416 to `Range: bytes=9999999-`, a 412 to If-Match: stored under the URL, it would answer
    // every later request for it (with max-age, as nginx's `expires` gives its 416 pages).
    d.why_not = "an answer to a Range or a precondition the cache key does not hold";
    return d;
  }
  const HttpResponseHead head = response.ToCacheHead();
  if (ListHas(head.FindAll("Vary"), "*")) {
    d.why_not = "Vary: * (no later request can be known to match)";
    return d;
  }
  d.freshness = ComputeFreshness(head, TimePoint{}, now_unix, heuristic_default);
  const CacheControl cc = ParseCacheControl(head.cache_control);
  if (cc.no_store) {
    d.why_not = "the response says no-store";
    return d;
  }
  if (cc.is_private) {
    d.why_not = "the response is private";
    return d;
  }
  if (head.Find("Set-Cookie")) {
    // One client's cookie (a session) would be handed to every other client (DESIGN §4.3).
    d.why_not = "the response sets a cookie (Set-Cookie)";
    return d;
  }
  if (!d.freshness.storable) {
    d.why_not = "status not cacheable without explicit freshness";
    return d;
  }
  if (request.headers.Count("Authorization") > 0 && !cc.is_public && !cc.s_maxage &&
      !cc.must_revalidate) {
    d.why_not = "answer to an Authorization request without public, s-maxage or must-revalidate";
    return d;
  }
  d.store = true;
  return d;
}

StoredResponse MakeStoredResponse(const http1::ResponseHead& response,
                                  const FreshnessInfo& freshness, std::int64_t now_unix,
                                  Bytes size) {
  http1::HeaderList fields = response.headers;
  http1::RemoveHopByHopHeaders(&fields);
  StoredResponse stored;
  stored.status = response.status;
  for (const http1::HeaderField& f : fields) {
    if (!NotStoredField(f.name)) stored.headers.emplace_back(f.name, f.value);
  }
  stored.size = size;
  stored.stored_unix = now_unix;
  stored.expires_unix = ExpiresAt(freshness, now_unix);
  return stored;
}

// ---- Using a stored response ----

StoredFreshness PrepareStored(const StoredResponse& stored, Duration heuristic_default) {
  const HttpResponseHead head = ToHead(stored);
  const FreshnessInfo f =
      ComputeFreshness(head, TimePoint{}, stored.stored_unix, heuristic_default);
  StoredFreshness p;
  p.age_when_stored = WholeSeconds(f.age);
  p.lifetime = WholeSeconds(f.lifetime);
  p.stored_unix = stored.stored_unix;
  p.expires_unix = stored.expires_unix;
  p.must_revalidate = f.must_revalidate;
  p.has_validators = !head.etag.empty() || !head.last_modified.empty();
  return p;
}

StoredState EvaluateStored(const StoredResponse& stored, const CacheControl& request_cc,
                           std::int64_t now_unix, Duration heuristic_default) {
  return EvaluateStored(PrepareStored(stored, heuristic_default), request_cc, now_unix);
}

StoredState EvaluateStored(const StoredFreshness& stored, const CacheControl& request_cc,
                           std::int64_t now_unix) {
  StoredState s;
  s.age = stored.age_when_stored + std::max<std::int64_t>(0, now_unix - stored.stored_unix);
  s.remaining =
      stored.expires_unix ? *stored.expires_unix - now_unix : stored.lifetime - s.age;
  s.fresh = s.remaining > 0;
  s.may_serve_stale = !stored.must_revalidate;
  s.has_validators = stored.has_validators;

  // The client's limits (RFC 9111 §5.2.1). max-age=0 always revalidates: that is what a
  // browser's reload means by it.
  bool client_ok = !request_cc.no_cache;
  if (request_cc.max_age && (*request_cc.max_age == 0 || s.age > *request_cc.max_age))
    client_ok = false;
  if (request_cc.min_fresh && s.remaining < *request_cc.min_fresh) client_ok = false;
  bool fresh_enough = s.fresh;
  if (!s.fresh && request_cc.max_stale && !stored.must_revalidate &&
      -s.remaining <= *request_cc.max_stale) {
    fresh_enough = true;
  }
  s.usable = client_ok && fresh_enough;
  return s;
}

bool SetValidators(const StoredResponse& stored, http1::HeaderList* headers) {
  for (const char* name : {"If-None-Match", "If-Modified-Since", "If-Range", "Range"})
    headers->Remove(name);
  const HttpResponseHead head = ToHead(stored);
  if (!head.etag.empty()) headers->Add("If-None-Match", head.etag);
  if (!head.last_modified.empty()) headers->Add("If-Modified-Since", head.last_modified);
  return !head.etag.empty() || !head.last_modified.empty();
}

StoredResponse RefreshStored(const StoredResponse& stored, const http1::ResponseHead& not_modified,
                             std::int64_t now_unix, Duration heuristic_default) {
  http1::HeaderList fresh = not_modified.headers;
  http1::RemoveHopByHopHeaders(&fresh);
  StoredResponse out = stored;
  std::set<std::string> replaced;
  for (const http1::HeaderField& f : fresh) {
    if (!NotStoredField(f.name)) replaced.insert(Lower(f.name));
  }
  std::erase_if(out.headers,
                [&](const auto& field) { return replaced.count(Lower(field.first)) > 0; });
  for (const http1::HeaderField& f : fresh) {
    if (!NotStoredField(f.name)) out.headers.emplace_back(f.name, f.value);
  }
  out.stored_unix = now_unix;
  const FreshnessInfo f = ComputeFreshness(ToHead(out), TimePoint{}, now_unix, heuristic_default);
  out.expires_unix = ExpiresAt(f, now_unix);
  return out;
}

bool IsNotModified(const http1::RequestHead& request, const StoredResponse& stored) {
  if (!IsLookupMethod(request.method) || stored.status != 200) return false;
  const HttpResponseHead head = ToHead(stored);
  if (request.headers.Count("If-None-Match") > 0) {
    const std::string inm = request.headers.FindAll("If-None-Match");
    if (TrimBlanks(inm) == "*") return true;
    if (head.etag.empty()) return false;
    bool weak = false;
    const std::string_view ours = OpaqueTag(head.etag, &weak);
    bool match = false;
    ForEachElement(inm, [&](std::string_view tag) {
      bool w = false;
      match = match || OpaqueTag(tag, &w) == ours;  // weak comparison (RFC 9110 §8.8.3.2)
    });
    return match;
  }
  if (const std::string* ims = request.headers.Find("If-Modified-Since")) {
    const std::optional<std::int64_t> since = ParseHttpDate(*ims);
    const std::optional<std::int64_t> modified = ParseHttpDate(head.last_modified);
    return since && modified && *modified <= *since;
  }
  return false;
}

http1::HeaderList NotModifiedFields(const StoredResponse& stored) {
  http1::HeaderList out;
  for (const auto& [name, value] : stored.headers) {
    for (const char* keep : {"Cache-Control", "Content-Location", "Date", "ETag", "Expires",
                             "Last-Modified", "Vary"}) {
      if (EqualsIgnoreCase(name, keep)) out.Add(name, value);
    }
  }
  return out;
}

RangeDecision EvaluateRange(const http1::RequestHead& request, const StoredResponse& stored,
                            Bytes size) {
  RangeDecision full;
  const std::string* range = request.headers.Find("Range");
  if (range == nullptr || request.method != "GET" || stored.status != 200 ||
      request.headers.Count("Range") != 1) {
    return full;
  }
  if (const std::string* if_range = request.headers.Find("If-Range")) {
    const HttpResponseHead head = ToHead(stored);
    const std::string_view v = TrimBlanks(*if_range);
    if (!v.empty() && (v.front() == '"' || v.substr(0, 2) == "W/")) {
      bool weak_req = false, weak_ours = false;
      const std::string_view req_tag = OpaqueTag(v, &weak_req);
      const std::string_view our_tag = OpaqueTag(head.etag, &weak_ours);
      // Strong comparison (RFC 9110 §13.1.5).
      if (weak_req || weak_ours || head.etag.empty() || req_tag != our_tag) return full;
    } else {
      const std::optional<std::int64_t> date = ParseHttpDate(v);
      const std::optional<std::int64_t> modified = ParseHttpDate(head.last_modified);
      if (!date || !modified || *date != *modified) return full;
    }
  }
  std::string_view spec = TrimBlanks(*range);
  if (spec.size() < 6 || !EqualsIgnoreCase(spec.substr(0, 6), "bytes=")) return full;
  spec = TrimBlanks(spec.substr(6));
  if (spec.find(',') != std::string_view::npos) return full;  // several ranges: send it whole
  const std::size_t dash = spec.find('-');
  if (dash == std::string_view::npos) return full;
  const std::optional<Bytes> first = dash == 0 ? std::nullopt : ParseDecimal(spec.substr(0, dash));
  const std::optional<Bytes> last =
      dash + 1 == spec.size() ? std::nullopt : ParseDecimal(spec.substr(dash + 1));
  if ((dash != 0 && !first) || (dash + 1 != spec.size() && !last)) return full;  // malformed
  RangeDecision d;
  d.kind = RangeDecision::Kind::kPartial;
  if (!first) {  // suffix: the last N bytes
    if (!last || *last == 0 || size == 0) {
      d.kind = RangeDecision::Kind::kUnsatisfiable;
      return d;
    }
    d.first = size > *last ? size - *last : 0;
    d.last = size - 1;
    return d;
  }
  if (last && *last < *first) return full;  // invalid range-spec: ignore the field
  if (*first >= size) {
    d.kind = RangeDecision::Kind::kUnsatisfiable;
    return d;
  }
  d.first = *first;
  d.last = last ? std::min(*last, size - 1) : size - 1;
  return d;
}

}  // namespace ghost
