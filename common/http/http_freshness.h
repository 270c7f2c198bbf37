// HTTP caching rules for the cache manager: may a response be stored, and for how long may
// it be served without asking the origin (RFC 9111 §3, §4.2, §5.2), plus HTTP-date parsing
// and formatting (RFC 9110 §5.6.7).
//
// Ghost's cache serves several applications (ghostfs readers, ghostproxy's browsers), so it
// follows the rules for a *shared* cache: s-maxage overrides max-age (and implies
// proxy-revalidate), and "private" responses are not stored.
//
// Freshness lifetime, first rule that applies (RFC 9111 §4.2.1, §4.2.2):
//   1. s-maxage=N                      → N
//   2. max-age=N                       → N
//   3. Expires                         → Expires − Date (Date absent: the receive time);
//                                        an invalid Expires ("0", junk) → 0 (already stale)
//   4. heuristic, only for heuristically cacheable statuses (200 203 204 206 300 301 304 308
//      404 405 410 414 501) or "public":
//        Last-Modified present        → 10% of (Date − Last-Modified), capped at 24 h
//        no (valid) Last-Modified     → the caller's heuristic_default
// no-cache (or Pragma: no-cache without Cache-Control) keeps the response storable but makes
// every use revalidate: lifetime 0, must_revalidate. "Vary: *" does the same.
// Age when received (§4.2.3, without the request/response delay the caller does not pass):
//   age = max(0, now − Date, Age header).
// Delta-seconds beyond 2^31 are taken as 2^31 (§1.2.2).
//
// Thread-safety: pure functions of their arguments.
#ifndef GHOST_COMMON_HTTP_HTTP_FRESHNESS_H_
#define GHOST_COMMON_HTTP_HTTP_FRESHNESS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "common/http/http_message.h"
#include "common/base/units.h"

namespace ghost {

struct FreshnessInfo {
  // The response may be kept in the cache (not no-store, not private, and a status this cache
  // may store: explicit freshness, "public", or heuristically cacheable).
  bool storable = false;
  // Once stale, the copy must not be served without a successful revalidation, not even when
  // the origin is unreachable (must-revalidate, proxy-revalidate, s-maxage, no-cache).
  bool must_revalidate = false;
  // The lifetime came from the heuristic (rule 4), not from the origin.
  bool heuristic = false;
  // How long the response is fresh, counted from its creation at the origin.
  Duration lifetime{0};
  // Its age when received.
  Duration age{0};
  // Model time until which the cached copy is fresh: now_model + lifetime − age. At or before
  // now_model when the response arrived stale (or must always be revalidated).
  TimePoint fresh_until{};

  bool IsFresh(TimePoint now) const { return storable && now < fresh_until; }
};

// The Cache-Control directives Ghost acts on, response and request ones (RFC 9111 §5.2).
// Unknown directives are ignored; an invalid delta-seconds value reads as 0 (the restrictive
// reading); the first occurrence of a directive wins.
struct CacheControl {
  bool no_store = false;
  bool no_cache = false;  // qualified or not
  bool is_private = false;
  bool is_public = false;
  bool must_revalidate = false;
  bool proxy_revalidate = false;
  std::optional<std::int64_t> max_age;   // seconds
  std::optional<std::int64_t> s_maxage;  // seconds
  // Request directives.
  std::optional<std::int64_t> max_stale;  // seconds; "max-stale" alone: 2^31 (any staleness)
  std::optional<std::int64_t> min_fresh;  // seconds
  bool only_if_cached = false;
};

// Parses a Cache-Control field value (all fields joined with ", "). Never fails.
CacheControl ParseCacheControl(std::string_view value);

// Computes the freshness of `head`, received now. `now_model` is the cache's clock
// (Clock::Now) and `now_unix` the wall-clock time in Unix seconds (HTTP dates are wall-clock);
// `heuristic_default` is the lifetime of a response with no explicit freshness and no
// Last-Modified. The head's Cache-Control, Expires, Date, Age and Last-Modified fields are
// used (and Pragma, Vary from its header list).
FreshnessInfo ComputeFreshness(const HttpResponseHead& head, TimePoint now_model,
                               std::int64_t now_unix, Duration heuristic_default);

// Parses an HTTP-date in any of the three formats recipients must accept (RFC 9110 §5.6.7):
//   IMF-fixdate  "Sun, 06 Nov 1994 08:49:37 GMT"
//   RFC 850      "Sunday, 06-Nov-94 08:49:37 GMT"   (two-digit years: 70–99 → 19xx,
//                                                    00–69 → 20xx)
//   asctime      "Sun Nov  6 08:49:37 1994"
// Leading and trailing blanks are ignored; the weekday must be a weekday name but is not
// checked against the date. Returns Unix seconds, or nullopt for anything malformed
// (including impossible dates such as 31 Feb).
std::optional<std::int64_t> ParseHttpDate(std::string_view text);

// Formats Unix seconds as an IMF-fixdate ("Sun, 06 Nov 1994 08:49:37 GMT").
std::string FormatHttpDate(std::int64_t unix_seconds);

}  // namespace ghost

#endif  // GHOST_COMMON_HTTP_HTTP_FRESHNESS_H_
