// The RFC 9111 rules ghostproxy applies between its clients, the origins and the shared cache:
// which requests may be answered from the cache, which responses may be stored and under what
// key, whether a stored response may be used now (freshness, the client's directives), how it
// is revalidated and refreshed, and how a client's conditional and range requests are answered
// from a stored response (RFC 9110 §13, §14).
//
// Freshness itself (lifetime, age, heuristics) is common/http/http_freshness.h, the same rules
// ghostfs uses; this file adds what only a proxy between HTTP clients and the cache needs.
//
// Keys (the opaque strings CacheBackend stores under):
//   - UrlKey: "http://host[:port]/path?query", host lower case, port only when not 80.
//   - A response with `Vary: a, b` is stored under VariantKey: UrlKey + "#vary;" + the
//     normalized values of the request's a and b fields. '#' never occurs in a request URL
//     (the parser refuses fragments), so the two kinds of key cannot collide. UrlKey then
//     holds a *vary index*: an empty response whose only fields are the Vary value and
//     X-Ghost-Vary-Index, telling a later lookup which variant key to compute.
//   - `Vary: *` responses are never stored (no request can be known to match).
//
// Thread-safety: pure functions of their arguments.
#ifndef GHOST_PROXY_CACHE_POLICY_H_
#define GHOST_PROXY_CACHE_POLICY_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "common/http/http_freshness.h"
#include "common/base/units.h"
#include "proxy/cache_backend.h"
#include "proxy/http1.h"

namespace ghost {

// ---- Keys ----

// The cache key of an absolute URL (see the file comment).
std::string UrlKey(const http1::AbsoluteUrl& url);
// The key of the variant of `url_key` selected by the request fields named in `vary` (a Vary
// field value, names case-insensitive, order and duplicates irrelevant). A field the request
// lacks is recorded as absent, distinct from an empty value. Values are normalized: several
// fields joined with ", ", runs of blanks collapsed.
std::string VariantKey(const std::string& url_key, std::string_view vary,
                       const http1::HeaderList& request_headers);
// The vary index stored under the URL key of a response with Vary (see the file comment).
StoredResponse MakeVaryIndex(std::string_view vary, std::int64_t now_unix);
// True for a vary index; then `*vary` is its Vary value.
bool IsVaryIndex(const StoredResponse& stored, std::string* vary);

// ---- Requests ----

// The request's cache directives: Cache-Control (RFC 9111 §5.2.1), or Pragma: no-cache when
// there is no Cache-Control (§5.4).
CacheControl RequestCacheControl(const http1::HeaderList& headers);

// GET and HEAD are answered from the cache (HEAD from a stored GET response).
bool IsLookupMethod(std::string_view method);
// Methods whose non-error response invalidates the stored response of their URL (RFC 9111
// §4.4): every method but the safe ones (GET, HEAD, OPTIONS, TRACE).
bool InvalidatesCache(std::string_view method);

// Whether the cache may answer this request at all, from a stored response: false when the
// request carries preconditions the proxy does not evaluate (If-Match, If-Unmodified-Since),
// which the origin must see.
bool CacheMayAnswer(const http1::RequestHead& request);

// ---- Storing ----

struct StorageDecision {
  bool store = false;
  const char* why_not = "";  // for the log and tests when !store
  FreshnessInfo freshness;   // computed with TimePoint{} as the model's now
};

// May `response` to `request`, received at `now_unix`, be stored (RFC 9111 §3)? Only complete
// responses to GET: a final status that is cacheable by default or has explicit freshness
// (ComputeFreshness), no no-store in the request or response, not private, no `Vary: *`, not a
// 206 (the cache keeps whole bodies), not setting a cookie (Set-Cookie: one client's cookie is
// not for the others, as nginx and Varnish decide), only a 200 to a request with Range or a
// precondition (a 416 or 412 answers the request's fields, which the key does not hold) and,
// for a request with Authorization, only with public, s-maxage or must-revalidate (§3.5).
StorageDecision DecideStorage(const http1::RequestHead& request,
                              const http1::ResponseHead& response, std::int64_t now_unix,
                              Duration heuristic_default);

// The response as the cache keeps it: the end-to-end fields (no hop-by-hop fields, no
// Content-Length: the size says it, no X-Ghost-Source), the receive time, and the time it stops
// being fresh. `size` is the body length when known (0 otherwise: the backend counts the bytes
// written).
StoredResponse MakeStoredResponse(const http1::ResponseHead& response,
                                  const FreshnessInfo& freshness, std::int64_t now_unix,
                                  Bytes size);

// ---- Using a stored response ----

struct StoredState {
  std::int64_t age = 0;        // current age in seconds (RFC 9111 §4.2.3)
  std::int64_t remaining = 0;  // seconds of freshness left (negative: stale by that much)
  bool fresh = false;          // remaining > 0
  // May be served without contacting the origin, given the client's directives (no-cache,
  // max-age, min-fresh, max-stale).
  bool usable = false;
  // May be served stale when the origin cannot be reached (no must-revalidate,
  // proxy-revalidate, s-maxage or no-cache).
  bool may_serve_stale = false;
  bool has_validators = false;  // ETag or Last-Modified
};

// Evaluates `stored` at `now_unix` for a request with directives `request_cc`. The stored
// expires_unix, when present, is the end of freshness; otherwise it is computed from the
// stored fields.
StoredState EvaluateStored(const StoredResponse& stored, const CacheControl& request_cc,
                           std::int64_t now_unix, Duration heuristic_default);

// EvaluateStored in two steps, for a copy judged at every hit (ghostproxy's RAM copies): what
// the stored head says about freshness, parsed once (PrepareStored), then the arithmetic against
// the time and the request. EvaluateStored(stored, ...) is EvaluateStored(PrepareStored(stored,
// heuristic_default), ...).
struct StoredFreshness {
  std::int64_t age_when_stored = 0;  // whole seconds, from the stored Age and Date fields
  std::int64_t lifetime = 0;         // whole seconds
  std::int64_t stored_unix = 0;
  std::optional<std::int64_t> expires_unix;
  bool must_revalidate = false;
  bool has_validators = false;
};
StoredFreshness PrepareStored(const StoredResponse& stored, Duration heuristic_default);
StoredState EvaluateStored(const StoredFreshness& stored, const CacheControl& request_cc,
                           std::int64_t now_unix);

// Replaces the client's validators in `headers` with the stored response's (If-None-Match
// from its ETag, If-Modified-Since from its Last-Modified), for a revalidation request.
// Returns false (headers without validators) when the stored response has none.
bool SetValidators(const StoredResponse& stored, http1::HeaderList* headers);

// The stored response refreshed by a 304 (RFC 9111 §4.3.4): every field the 304 carries
// replaces the stored fields of that name (except Content-Length and hop-by-hop fields),
// received now, freshness recomputed.
StoredResponse RefreshStored(const StoredResponse& stored, const http1::ResponseHead& not_modified,
                             std::int64_t now_unix, Duration heuristic_default);

// True when the client's conditional GET/HEAD is satisfied by `stored` (a 200) so the answer
// is 304 Not Modified (RFC 9110 §13.1.2, §13.1.3, §13.2.2): If-None-Match matches its ETag
// (weak comparison, "*" matches), or, without If-None-Match, If-Modified-Since is not older
// than its Last-Modified.
bool IsNotModified(const http1::RequestHead& request, const StoredResponse& stored);
// The fields of a 304 made from `stored` (RFC 9110 §15.4.5): Cache-Control, Content-Location,
// Date, ETag, Expires, Last-Modified, Vary.
http1::HeaderList NotModifiedFields(const StoredResponse& stored);

// A client's Range request against a stored complete body of `size` bytes (RFC 9110 §14).
struct RangeDecision {
  enum class Kind { kFull, kPartial, kUnsatisfiable };
  Kind kind = Kind::kFull;
  Bytes first = 0, last = 0;  // kPartial: inclusive
};
// kFull when there is no Range, it is not "bytes=", it has several ranges (served whole, as
// RFC 9110 §14.2 allows), it is malformed, the stored response is not a 200, or If-Range does
// not match (a strong ETag, or exactly the Last-Modified date). kUnsatisfiable when no byte of
// the range exists.
RangeDecision EvaluateRange(const http1::RequestHead& request, const StoredResponse& stored,
                            Bytes size);

}  // namespace ghost

#endif  // GHOST_PROXY_CACHE_POLICY_H_
