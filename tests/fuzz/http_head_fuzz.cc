// libFuzzer target for the origin side's HTTP head and freshness rules (common/http/
// http_message.h, http_freshness.h). Built and run by tests/fuzz/fuzz.sh.
//
// The input is fed line by line to HttpResponseHead::AddHeaderLine (as the fetcher does), the
// head is finished twice (Finish must be idempotent) and its freshness computed at three
// clocks; every line is also given to the value parsers (Cache-Control, HTTP-date, Content-
// Range, decimals, status lines). Checked: no crash or sanitizer report, Finish idempotent, a
// parsed HTTP-date formats and parses back to itself, a parsed Content-Range is ordered.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "common/http/http_freshness.h"
#include "common/http/http_message.h"

namespace ghost {
namespace {

void Check(bool ok, const char* what, std::string_view detail) {
  if (ok) return;
  std::fprintf(stderr, "http_head_fuzz: %s\n%.*s\n", what, static_cast<int>(detail.size()),
               detail.data());
  std::abort();
}

std::string Describe(const HttpResponseHead& h) {
  std::string s = std::to_string(h.status) + "|";
  s += (h.content_length ? std::to_string(*h.content_length) : "-") + "|" + h.etag + "|" +
       h.last_modified + "|" + h.content_type + "|" + h.cache_control + "|" + h.expires + "|" +
       h.date + "|" + h.age + "|" + std::to_string(h.total_size_from_content_range);
  if (h.content_range)
    s += "|" + std::to_string(h.content_range->first) + "-" + std::to_string(h.content_range->second);
  return s;
}

void Value(std::string_view v) {
  (void)ParseCacheControl(v);
  (void)ParseStatusLine(v);
  (void)ParseDecimal(v);
  (void)TrimBlanks(v);
  if (std::optional<std::int64_t> t = ParseHttpDate(v)) {
    const std::string formatted = FormatHttpDate(*t);
    const std::optional<std::int64_t> back = ParseHttpDate(formatted);
    Check(back && *back == *t, "an HTTP-date does not round-trip", formatted);
  }
  std::optional<std::pair<Bytes, Bytes>> range;
  Bytes total = 0;
  if (ParseContentRange(v, &range, &total)) {
    Check(!range || (range->first <= range->second && (total == 0 || range->second < total)),
          "a parsed Content-Range is out of order", v);
  }
}

}  // namespace
}  // namespace ghost

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace ghost;
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  HttpResponseHead head;
  std::size_t pos = 0;
  while (pos <= in.size()) {
    std::size_t nl = in.find('\n', pos);
    if (nl == std::string_view::npos) nl = in.size();
    const std::string_view line = in.substr(pos, nl - pos);
    (void)head.AddHeaderLine(line);
    Value(line);
    if (std::size_t colon = line.find(':'); colon != std::string_view::npos)
      Value(line.substr(colon + 1));
    pos = nl + 1;
  }
  head.Finish();
  const std::string once = Describe(head);
  head.Finish();
  Check(Describe(head) == once, "Finish is not idempotent", once);
  (void)head.FindAll("Cache-Control");
  (void)head.Find("Vary");
  for (const std::int64_t now_unix : {std::int64_t{0}, std::int64_t{784111777},
                                      std::int64_t{4102444800}}) {
    const FreshnessInfo f = ComputeFreshness(head, TimePoint(Seconds(1000)), now_unix, Seconds(60));
    (void)f.IsFresh(TimePoint(Seconds(1000)));
  }
  return 0;
}
