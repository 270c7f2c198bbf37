#include "common/http/http_freshness.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>

namespace ghost {
namespace {

constexpr std::int64_t kMaxDeltaSeconds = std::int64_t{1} << 31;  // RFC 9111 §1.2.2
constexpr std::int64_t kHeuristicCapSeconds = 24 * 3600;
constexpr std::int64_t kSecondsPerDay = 86400;

constexpr std::array<std::string_view, 7> kShortWeekdays = {"Sun", "Mon", "Tue", "Wed",
                                                            "Thu", "Fri", "Sat"};
constexpr std::array<std::string_view, 7> kLongWeekdays = {
    "Sunday", "Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday"};
constexpr std::array<std::string_view, 12> kMonths = {"Jan", "Feb", "Mar", "Apr", "May", "Jun",
                                                      "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};

Duration FromSeconds(std::int64_t s) { return Duration(s * 1'000'000); }

// A left-to-right reader over a date string. Every method leaves the position unchanged when
// it fails.
class Cursor {
 public:
  explicit Cursor(std::string_view s) : s_(s) {}
  bool AtEnd() const { return i_ == s_.size(); }
  bool Char(char c) {
    if (i_ < s_.size() && s_[i_] == c) {
      ++i_;
      return true;
    }
    return false;
  }
  bool Spaces() {  // one or more
    const std::size_t start = i_;
    while (i_ < s_.size() && s_[i_] == ' ') ++i_;
    return i_ > start;
  }
  // Between min and max decimal digits.
  std::optional<int> Digits(std::size_t min, std::size_t max) {
    std::size_t j = i_;
    int v = 0;
    while (j < s_.size() && j - i_ < max && s_[j] >= '0' && s_[j] <= '9')
      v = v * 10 + (s_[j++] - '0');
    if (j - i_ < min) return std::nullopt;
    i_ = j;
    return v;
  }
  // One of `words` (ASCII case-insensitive), longest first; returns its index.
  template <std::size_t N>
  std::optional<int> Word(const std::array<std::string_view, N>& words) {
    std::optional<int> best;
    std::size_t best_len = 0;
    for (std::size_t k = 0; k < N; ++k) {
      const std::string_view w = words[k];
      if (s_.size() - i_ >= w.size() && w.size() > best_len &&
          EqualsIgnoreCase(s_.substr(i_, w.size()), w)) {
        best = static_cast<int>(k);
        best_len = w.size();
      }
    }
    if (best) i_ += best_len;
    return best;
  }
  bool Literal(std::string_view lit) {
    if (s_.size() - i_ >= lit.size() && s_.substr(i_, lit.size()) == lit) {
      i_ += lit.size();
      return true;
    }
    return false;
  }

 private:
  std::string_view s_;
  std::size_t i_ = 0;
};

struct Civil {
  int year = 0, month = 0, day = 0, hour = 0, minute = 0, second = 0;
};

bool ReadTime(Cursor& c, Civil* t) {
  std::optional<int> h = c.Digits(2, 2);
  if (!h || !c.Char(':')) return false;
  std::optional<int> m = c.Digits(2, 2);
  if (!m || !c.Char(':')) return false;
  std::optional<int> s = c.Digits(2, 2);
  if (!s) return false;
  t->hour = *h;
  t->minute = *m;
  t->second = *s;
  return true;
}

std::optional<std::int64_t> ToUnix(const Civil& t) {
  using namespace std::chrono;
  if (t.hour > 23 || t.minute > 59 || t.second > 60) return std::nullopt;  // 60: leap second
  const year_month_day ymd{year{t.year}, month{static_cast<unsigned>(t.month)},
                           day{static_cast<unsigned>(t.day)}};
  if (!ymd.ok()) return std::nullopt;
  const std::int64_t days = sys_days{ymd}.time_since_epoch().count();
  const std::int64_t unix_seconds = days * kSecondsPerDay + t.hour * 3600 + t.minute * 60 + t.second;
  // A leap second on 31 Dec 9999 would be year 10000, which no HTTP-date (and so no
  // FormatHttpDate output) can express.
  constexpr std::int64_t kYear10000 = 253402300800;
  if (unix_seconds >= kYear10000) return std::nullopt;
  return unix_seconds;
}

// "Sun, 06 Nov 1994 08:49:37 GMT" (after the weekday and comma).
std::optional<std::int64_t> ParseImfRest(Cursor& c) {
  Civil t;
  std::optional<int> d = c.Digits(1, 2);
  if (!d || !c.Spaces()) return std::nullopt;
  std::optional<int> mon = c.Word(kMonths);
  if (!mon || !c.Spaces()) return std::nullopt;
  std::optional<int> y = c.Digits(4, 4);
  if (!y || !c.Spaces() || !ReadTime(c, &t) || !c.Spaces() || !c.Literal("GMT") || !c.AtEnd()) {
    return std::nullopt;
  }
  t.day = *d;
  t.month = *mon + 1;
  t.year = *y;
  return ToUnix(t);
}

// "Sunday, 06-Nov-94 08:49:37 GMT" (after the weekday and comma).
std::optional<std::int64_t> ParseRfc850Rest(Cursor& c) {
  Civil t;
  std::optional<int> d = c.Digits(1, 2);
  if (!d || !c.Char('-')) return std::nullopt;
  std::optional<int> mon = c.Word(kMonths);
  if (!mon || !c.Char('-')) return std::nullopt;
  std::optional<int> y = c.Digits(2, 2);
  if (!y || !c.Spaces() || !ReadTime(c, &t) || !c.Spaces() || !c.Literal("GMT") || !c.AtEnd()) {
    return std::nullopt;
  }
  t.day = *d;
  t.month = *mon + 1;
  t.year = *y >= 70 ? 1900 + *y : 2000 + *y;
  return ToUnix(t);
}

// "Sun Nov  6 08:49:37 1994" (after the weekday).
std::optional<std::int64_t> ParseAsctimeRest(Cursor& c) {
  Civil t;
  std::optional<int> mon = c.Word(kMonths);
  if (!mon || !c.Spaces()) return std::nullopt;
  std::optional<int> d = c.Digits(1, 2);
  if (!d || !c.Spaces() || !ReadTime(c, &t) || !c.Spaces()) return std::nullopt;
  std::optional<int> y = c.Digits(4, 4);
  if (!y || !c.AtEnd()) return std::nullopt;
  t.day = *d;
  t.month = *mon + 1;
  t.year = *y;
  return ToUnix(t);
}

// delta-seconds (RFC 9111 §1.2.2): digits; too large → 2^31. nullopt if not digits.
std::optional<std::int64_t> ParseDeltaSeconds(std::string_view v) {
  v = TrimBlanks(v);
  if (v.empty()) return std::nullopt;
  std::int64_t n = 0;
  for (char c : v) {
    if (c < '0' || c > '9') return std::nullopt;
    n = std::min<std::int64_t>(n * 10 + (c - '0'), kMaxDeltaSeconds);
  }
  return n;
}

}  // namespace

CacheControl ParseCacheControl(std::string_view cc) {
  CacheControl d;
  std::size_t i = 0;
  while (i < cc.size()) {
    while (i < cc.size() && (cc[i] == ',' || cc[i] == ' ' || cc[i] == '\t')) ++i;
    const std::size_t name_start = i;
    while (i < cc.size() && cc[i] != '=' && cc[i] != ',' && cc[i] != ' ' && cc[i] != '\t') ++i;
    const std::string_view name = cc.substr(name_start, i - name_start);
    while (i < cc.size() && (cc[i] == ' ' || cc[i] == '\t')) ++i;
    std::string value;
    bool has_value = false;
    if (i < cc.size() && cc[i] == '=') {
      has_value = true;
      ++i;
      while (i < cc.size() && (cc[i] == ' ' || cc[i] == '\t')) ++i;
      if (i < cc.size() && cc[i] == '"') {  // quoted-string, may hold commas
        ++i;
        while (i < cc.size() && cc[i] != '"') {
          if (cc[i] == '\\' && i + 1 < cc.size()) ++i;
          value += cc[i++];
        }
        if (i < cc.size()) ++i;  // closing quote
      } else {
        const std::size_t v_start = i;
        while (i < cc.size() && cc[i] != ',') ++i;
        value = std::string(TrimBlanks(cc.substr(v_start, i - v_start)));
      }
    }
    // Skip anything up to the next comma (junk after a value).
    while (i < cc.size() && cc[i] != ',') ++i;
    if (name.empty()) continue;

    auto delta = [&](std::optional<std::int64_t>* slot) {
      if (slot->has_value()) return;  // first occurrence wins (RFC 9111 §4.2.1)
      std::optional<std::int64_t> n = has_value ? ParseDeltaSeconds(value) : std::nullopt;
      *slot = n.value_or(0);  // invalid: treat as stale, the restrictive reading
    };
    if (EqualsIgnoreCase(name, "no-store")) {
      d.no_store = true;
    } else if (EqualsIgnoreCase(name, "no-cache")) {
      d.no_cache = true;  // qualified or not: revalidate every use (restrictive)
    } else if (EqualsIgnoreCase(name, "private")) {
      d.is_private = true;
    } else if (EqualsIgnoreCase(name, "public")) {
      d.is_public = true;
    } else if (EqualsIgnoreCase(name, "must-revalidate")) {
      d.must_revalidate = true;
    } else if (EqualsIgnoreCase(name, "proxy-revalidate")) {
      d.proxy_revalidate = true;
    } else if (EqualsIgnoreCase(name, "max-age")) {
      delta(&d.max_age);
    } else if (EqualsIgnoreCase(name, "s-maxage")) {
      delta(&d.s_maxage);
    } else if (EqualsIgnoreCase(name, "max-stale")) {
      // Without a value: any staleness (RFC 9111 §5.2.1.2).
      if (!d.max_stale) d.max_stale = has_value ? ParseDeltaSeconds(value).value_or(0) : kMaxDeltaSeconds;
    } else if (EqualsIgnoreCase(name, "min-fresh")) {
      delta(&d.min_fresh);
    } else if (EqualsIgnoreCase(name, "only-if-cached")) {
      d.only_if_cached = true;
    }
  }
  return d;
}

namespace {

bool ListHasToken(std::string_view list, std::string_view token) {
  std::size_t i = 0;
  while (i <= list.size()) {
    std::size_t comma = list.find(',', i);
    if (comma == std::string_view::npos) comma = list.size();
    if (EqualsIgnoreCase(TrimBlanks(list.substr(i, comma - i)), token)) return true;
    i = comma + 1;
  }
  return false;
}

// RFC 9110 §15.1 / RFC 9111 §4.2.2: statuses whose responses may get heuristic freshness.
// 304 is included because it stands for the refreshed stored response (RFC 9111 §4.3.4).
bool HeuristicallyCacheable(int status) {
  switch (status) {
    case 200:
    case 203:
    case 204:
    case 206:
    case 300:
    case 301:
    case 304:
    case 308:
    case 404:
    case 405:
    case 410:
    case 414:
    case 501:
      return true;
    default:
      return false;
  }
}

}  // namespace

std::optional<std::int64_t> ParseHttpDate(std::string_view text) {
  Cursor c(TrimBlanks(text));
  if (c.Word(kLongWeekdays)) {  // only RFC 850 uses the long names
    if (!c.Char(',') || !c.Spaces()) return std::nullopt;
    return ParseRfc850Rest(c);
  }
  if (!c.Word(kShortWeekdays)) return std::nullopt;
  if (c.Char(',')) {
    if (!c.Spaces()) return std::nullopt;
    // IMF-fixdate has spaces around the month, RFC 850 with a short weekday (seen in the
    // wild) has dashes: try one, then the other.
    Cursor again = c;
    if (std::optional<std::int64_t> t = ParseImfRest(c)) return t;
    return ParseRfc850Rest(again);
  }
  if (!c.Spaces()) return std::nullopt;
  return ParseAsctimeRest(c);
}

std::string FormatHttpDate(std::int64_t unix_seconds) {
  using namespace std::chrono;
  std::int64_t days = unix_seconds / kSecondsPerDay;
  std::int64_t rem = unix_seconds % kSecondsPerDay;
  if (rem < 0) {
    rem += kSecondsPerDay;
    --days;
  }
  const sys_days sd{std::chrono::days{days}};
  const year_month_day ymd{sd};
  const weekday wd{sd};
  char buf[64];
  std::snprintf(buf, sizeof buf, "%s, %02u %s %04d %02d:%02d:%02d GMT",
                std::string(kShortWeekdays[wd.c_encoding()]).c_str(),
                static_cast<unsigned>(ymd.day()),
                std::string(kMonths[static_cast<unsigned>(ymd.month()) - 1]).c_str(),
                static_cast<int>(ymd.year()), static_cast<int>(rem / 3600),
                static_cast<int>(rem / 60 % 60), static_cast<int>(rem % 60));
  return buf;
}

FreshnessInfo ComputeFreshness(const HttpResponseHead& head, TimePoint now_model,
                               std::int64_t now_unix, Duration heuristic_default) {
  FreshnessInfo info;
  const CacheControl cc = ParseCacheControl(head.cache_control);
  const bool has_cache_control = !head.cache_control.empty() || head.Find("Cache-Control");
  bool no_cache = cc.no_cache;
  if (!has_cache_control) {
    if (const std::string* pragma = head.Find("Pragma")) {
      no_cache = no_cache || ListHasToken(*pragma, "no-cache");  // RFC 9111 §5.4 (HTTP/1.0)
    }
  }
  const bool vary_star = ListHasToken(head.FindAll("Vary"), "*");

  // Date: the origin's clock; without one, the time we received it.
  const std::optional<std::int64_t> date = ParseHttpDate(head.date);
  const std::int64_t date_value = date.value_or(now_unix);

  // Lifetime (the rules in the header comment).
  std::optional<Duration> explicit_lifetime;
  if (cc.s_maxage) {
    explicit_lifetime = FromSeconds(*cc.s_maxage);
  } else if (cc.max_age) {
    explicit_lifetime = FromSeconds(*cc.max_age);
  } else if (head.Find("Expires") || !head.expires.empty()) {
    std::optional<std::int64_t> expires = ParseHttpDate(head.expires);
    const std::int64_t delta = expires ? std::max<std::int64_t>(0, *expires - date_value) : 0;
    explicit_lifetime = FromSeconds(std::min(delta, kMaxDeltaSeconds));
  }

  const bool status_ok = head.status >= 200 &&
                         (explicit_lifetime || cc.is_public || HeuristicallyCacheable(head.status));
  info.storable = status_ok && !cc.no_store && !cc.is_private;

  if (explicit_lifetime) {
    info.lifetime = *explicit_lifetime;
  } else {
    info.heuristic = true;
    const std::optional<std::int64_t> last_modified = ParseHttpDate(head.last_modified);
    if (last_modified) {
      const std::int64_t since = std::max<std::int64_t>(0, date_value - *last_modified);
      // 10% of the time since the last change (RFC 9111 §4.2.2), in microseconds.
      info.lifetime = std::min(Duration(since * 100'000), FromSeconds(kHeuristicCapSeconds));
    } else {
      info.lifetime = std::max(heuristic_default, Duration::zero());
    }
  }
  if (no_cache || vary_star) {
    info.lifetime = Duration::zero();
    info.heuristic = false;
  }
  info.must_revalidate =
      cc.must_revalidate || cc.proxy_revalidate || cc.s_maxage.has_value() || no_cache || vary_star;

  // Age when received (RFC 9111 §4.2.3).
  std::int64_t age = std::max<std::int64_t>(0, now_unix - date_value);
  if (std::optional<std::int64_t> age_value = ParseDeltaSeconds(head.age)) {
    age = std::max(age, *age_value);
  }
  info.age = FromSeconds(std::min(age, kMaxDeltaSeconds));
  info.fresh_until = now_model + info.lifetime - info.age;
  return info;
}

}  // namespace ghost
