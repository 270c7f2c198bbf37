// HTTP request and response-head values shared by the origin fetcher (http_fetcher.h), the
// freshness rules (http_freshness.h) and the cache manager.
//
// HttpResponseHead is built from the header lines of one response as they arrive (status line,
// then "Name: value" lines, then a blank line) and derives the fields the cache needs
// (Content-Length, ETag, validators, freshness inputs, Content-Range). Parsing is lenient, as
// a client must be: a malformed field is left unset (nullopt / empty), never an error, and
// never a crash, whatever the bytes.
//
// Thread-safety: plain values.
#ifndef GHOST_COMMON_HTTP_HTTP_MESSAGE_H_
#define GHOST_COMMON_HTTP_HTTP_MESSAGE_H_

#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/base/units.h"

namespace ghost {

// One request to an origin.
struct HttpRequest {
  std::string url;    // absolute http:// or https:// URL
  bool head = false;  // HEAD instead of GET
  // Byte range, first and last inclusive (a "Range: bytes=first-last" header).
  std::optional<std::pair<Bytes, Bytes>> range;
  std::string if_none_match;      // entity tag(s) for If-None-Match, empty for none
  std::string if_modified_since;  // HTTP-date for If-Modified-Since, empty for none
  // With `range`: an entity tag or HTTP-date for If-Range, so a changed object answers 200
  // (the whole new version) instead of a range of another version. Empty for none.
  std::string if_range;
};

// The head (status line and header fields) of the final response to a request.
struct HttpResponseHead {
  int status = 0;
  // Every header field of the final response, in arrival order; names as sent.
  std::vector<std::pair<std::string, std::string>> headers;
  // The URL that answered, after redirects (empty when unknown).
  std::string effective_url;

  // Derived from `headers` by Finish (first occurrence wins, except cache_control, which
  // joins every Cache-Control field with ", ", as RFC 9110 §5.3 allows).
  std::optional<Bytes> content_length;
  std::string etag, last_modified, content_type, cache_control, expires, date, age;
  // For a 206: the range this body holds ("Content-Range: bytes first-last/total").
  std::optional<std::pair<Bytes, Bytes>> content_range;
  // The complete length from Content-Range ("bytes a-b/total" or, on a 416, "bytes */total");
  // 0 when absent or "*" (unknown).
  Bytes total_size_from_content_range = 0;

  // The value of the first field named `name` (ASCII case-insensitive), or nullptr.
  const std::string* Find(std::string_view name) const;
  // Every value of the fields named `name`, joined with ", " (RFC 9110 §5.3); empty if none.
  std::string FindAll(std::string_view name) const;

  // Feeds one raw header line (with or without its CR LF) of the response. A status line
  // ("HTTP/1.1 200 OK", "HTTP/2 404") starts a new head: everything before is discarded, as a
  // 1xx or a followed redirect is not the final response. Lines before the first status line,
  // the blank line and lines without a colon are ignored; a line starting with a space or tab
  // continues the previous field (obsolete line folding). Returns true for a status line.
  bool AddHeaderLine(std::string_view line);
  // Derives the fields above from `status` and `headers`, resetting them first. Call after
  // the last header line (the fetcher does before on_head); idempotent.
  void Finish();
};

// Parses "HTTP/<version> <3-digit code>[ reason]". Returns the code, or nullopt.
std::optional<int> ParseStatusLine(std::string_view line);

// Parses a Content-Range value. On success sets *range (nullopt for "bytes */total") and
// *total (0 for "*"). Returns false for a malformed value (first > last, last >= total, not
// "bytes").
bool ParseContentRange(std::string_view value, std::optional<std::pair<Bytes, Bytes>>* range,
                       Bytes* total);

// Parses a non-negative decimal (optional surrounding blanks). nullopt on anything else or on
// overflow.
std::optional<Bytes> ParseDecimal(std::string_view text);

// ASCII case-insensitive equality (header and directive names).
bool EqualsIgnoreCase(std::string_view a, std::string_view b);

// `text` without leading and trailing spaces, tabs, CR and LF.
std::string_view TrimBlanks(std::string_view text);

}  // namespace ghost

#endif  // GHOST_COMMON_HTTP_HTTP_MESSAGE_H_
