// The HTTP/1.1 message layer of ghostproxy (RFC 9112): incremental parsers for requests (from
// browsers and other clients) and responses (from origins the proxy talks to itself), and the
// serializers and helpers a forward proxy needs to pass a message on.
//
// The parsers take bytes and give events; they know nothing of sockets or libevent. The caller
// owns a buffer, hands the parser a view of what it has (Parse(in)), and drains `consumed`
// bytes from the front after each call:
//
//   for (;;) {
//     Event e = parser.Parse(buffer);       // one event per call
//     ... use e (e.body points into buffer) ...
//     buffer.drain(e.consumed);
//     if (e.type == EventType::kNeedMore) break;  // wait for the socket
//   }
//
// A message gives kHead, then zero or more kBody, then kMessageComplete; the next call starts
// the next message with the bytes that follow (pipelining). Whatever the bytes, and however
// they are split across calls, the parser produces the same events (bodies may come in
// different pieces), never reads outside `in`, never throws, and holds at most one partial line
// (bounded by Limits) besides the head being built.
//
// Strictness. Requests are checked as a server must (RFC 9112 §2–§7): a bad request-line,
// field line, framing or chunk is an error naming the status to answer (400, 414, 431, 501,
// 505), and nothing is guessed. Request smuggling vectors are errors: Content-Length together
// with Transfer-Encoding, differing Content-Lengths, a Transfer-Encoding in HTTP/1.0 or not
// ending in chunked, obs-fold, whitespace before a colon, bare CR, bad chunk sizes and chunk
// lines not ending in CR LF. Responses are checked the same way but read as a proxy must
// (RFC 9112 §5.1, §5.2, §6.3): obs-fold is replaced by a space, whitespace before a colon is
// dropped, a body without framing runs until the origin closes; every response error maps to
// 502. Head lines (start line, fields, trailers) may end in LF alone (§2.2); chunk lines and the
// end of chunk data must be CR LF.
//
// Thread-safety: parsers are single-owner objects; the free functions are pure.
#ifndef GHOST_PROXY_HTTP1_H_
#define GHOST_PROXY_HTTP1_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/http/http_message.h"
#include "common/base/status.h"
#include "common/base/units.h"

namespace ghost::http1 {

// ---- Limits and errors ----

// Bounds on what a peer can make the parser hold. Defaults are those of common servers
// (nginx's 8 KiB request line, 32 KiB of header fields).
struct Limits {
  // Request-line or status-line, with its CR LF. Exceeding it: 414 (request), 502 (response).
  std::size_t max_start_line = 8 * 1024;
  // All header field lines together, with their CR LFs and the empty line that ends the head.
  // Exceeding it: 431 (request), 502 (response).
  std::size_t max_header_bytes = 32 * 1024;
  // Field lines in the head (and, separately, in the trailer section). Exceeding it: 431.
  std::size_t max_headers = 100;
  // One chunk-size line with its extensions and CR LF. Exceeding it: 400.
  std::size_t max_chunk_line = 4 * 1024;
  // The trailer section after the last chunk, like max_header_bytes. Exceeding it: 431.
  std::size_t max_trailer_bytes = 8 * 1024;
};

// What was wrong with a message. Each request error has one status to answer (HttpStatusFor);
// a response error always becomes 502 Bad Gateway.
enum class ParseErrorCode {
  kNone = 0,
  kBadStartLine,               // 400: request-line / status-line syntax
  kBadTarget,                  // 400: request-target syntax or form not allowed for the method
  kStartLineTooLong,           // 414: longer than Limits::max_start_line
  kVersionNotSupported,        // 505: HTTP/x.y with x != 1
  kBadHeader,                  // 400: field line syntax (name not a token, no colon, bad bytes)
  kWhitespaceBeforeColon,      // 400: "Name : value" (RFC 9112 §5.1)
  kObsFold,                    // 400: a field line starting with whitespace (RFC 9112 §5.2)
  kHeadersTooLarge,            // 431: more than Limits::max_header_bytes
  kTooManyHeaders,             // 431: more than Limits::max_headers field lines
  kBadHost,                    // 400: HTTP/1.1 without Host, several Host fields, or a bad Host
  kBadContentLength,           // 400: not digits, overflow, or differing values
  kConflictingFraming,         // 400: both Transfer-Encoding and Content-Length (smuggling)
  kBadTransferEncoding,        // 400: chunked not last or twice, empty, or in HTTP/1.0
  kUnsupportedTransferCoding,  // 501: a transfer coding other than chunked
  kBadChunk,                   // 400: chunk size not hex, overflow, bad extension, no CR LF
  kTrailersTooLarge,           // 431: trailer section over its limits
  kTruncated,                  // 400: the peer closed in the middle of a message
};

// The HTTP status a proxy answers to a request that failed with `code` (0 for kNone).
int HttpStatusFor(ParseErrorCode code);
// A short name for logs and tests ("bad chunk").
std::string_view ToString(ParseErrorCode code);
// The standard reason phrase of `status` ("Bad Request"), or "Unknown" for others.
std::string_view ReasonPhrase(int status);

struct ParseError {
  ParseErrorCode code = ParseErrorCode::kNone;
  // What the proxy should answer: HttpStatusFor(code) for a request, 502 for a response.
  int http_status = 0;
  // What was wrong, on what, in words for a log or an error page.
  std::string message;

  bool ok() const { return code == ParseErrorCode::kNone; }
  // kInvalidArgument, or kNotSupported for 501/505; OK when there is no error.
  [[nodiscard]] Status ToStatus() const;
};

// ---- Header fields ----

struct HeaderField {
  std::string name;   // as sent (a token)
  std::string value;  // without surrounding whitespace
};

// Header (or trailer) fields in arrival order. Names compare ASCII case-insensitively.
class HeaderList {
 public:
  void Add(std::string name, std::string value) {
    fields_.push_back({std::move(name), std::move(value)});
  }
  // The value of the first field named `name`, or nullptr.
  const std::string* Find(std::string_view name) const;
  // Every value of the fields named `name`, joined with ", " (RFC 9110 §5.3); empty if none.
  std::string FindAll(std::string_view name) const;
  // How many fields are named `name`.
  std::size_t Count(std::string_view name) const;
  // Removes every field named `name`; returns how many there were.
  std::size_t Remove(std::string_view name);
  // True when a field named `name` holds `token` as a comma-separated list element
  // (case-insensitive), e.g. HasToken("Connection", "close").
  bool HasToken(std::string_view name, std::string_view token) const;

  std::size_t size() const { return fields_.size(); }
  bool empty() const { return fields_.empty(); }
  // Keeps the vector's capacity for the next message.
  void clear() { fields_.clear(); }
  const HeaderField& operator[](std::size_t i) const { return fields_[i]; }
  HeaderField& operator[](std::size_t i) { return fields_[i]; }
  std::vector<HeaderField>::const_iterator begin() const { return fields_.begin(); }
  std::vector<HeaderField>::const_iterator end() const { return fields_.end(); }
  std::vector<HeaderField>& fields() { return fields_; }
  const std::vector<HeaderField>& fields() const { return fields_; }

  friend bool operator==(const HeaderList&, const HeaderList&) = default;

 private:
  std::vector<HeaderField> fields_;
};

// The header fields that describe one connection and must not be forwarded (RFC 9110 §7.6.1,
// plus the proxy authentication fields and the non-standard Proxy-Connection).
inline constexpr std::array<std::string_view, 9> kHopByHopHeaders = {
    "Connection", "Keep-Alive",          "Proxy-Connection",   "TE", "Trailer", "Transfer-Encoding",
    "Upgrade",    "Proxy-Authorization", "Proxy-Authenticate",
};

// True when `name` is one of kHopByHopHeaders.
bool IsHopByHopHeader(std::string_view name);
// Removes the hop-by-hop fields from `headers`: kHopByHopHeaders and every field named in a
// Connection field. (A client can name any field in Connection; the proxy must set Host and
// the framing fields itself afterwards.)
void RemoveHopByHopHeaders(HeaderList* headers);
// Whether the connection stays open after this message (RFC 9112 §9.3): HTTP/1.1 unless
// Connection has "close"; HTTP/1.0 only with Connection "keep-alive" and no "close".
bool WantsKeepAlive(int version_minor, const HeaderList& headers);

// ---- URLs and authorities ----

struct HostPort {
  std::string host;        // lower case; an IPv6 literal keeps its brackets ("[::1]")
  std::uint16_t port = 0;  // 0 when absent and not required
};

// Splits "host[:port]" (authority-form of CONNECT with require_port, or a Host field). The host
// is a DNS name or IPv4 address (letters, digits, '-', '.', '_') or a bracketed IPv6 address.
// Fails (kInvalidArgument, saying what is wrong) on userinfo ("user@host"), an empty host,
// other characters, a missing port when required, a port that is not 1..65535.
[[nodiscard]] Result<HostPort> SplitAuthority(std::string_view authority, bool require_port);

// An absolute-form request-target taken apart (RFC 9112 §3.2.2).
struct AbsoluteUrl {
  std::string scheme;       // "http"
  std::string host;         // as HostPort::host
  std::uint16_t port = 80;  // 80 when absent
  std::string path;         // origin-form to send to the origin: path and query, at least "/"
  // "host" or "host:port" (port only when not 80), for the Host field.
  std::string Authority() const;
};

// Splits "http://host[:port][/path][?query]". The scheme is case-insensitive. Fails with
// kNotSupported for any scheme but http (https goes through CONNECT), and kInvalidArgument
// for no "//", userinfo, a bad host or port, a fragment, or bytes not allowed in a target.
[[nodiscard]] Result<AbsoluteUrl> SplitAbsoluteUrl(std::string_view url);

// ---- Messages ----

// How the body of a message is delimited (RFC 9112 §6.3).
enum class BodyFraming {
  kNone,           // no body (or a tunnel follows)
  kContentLength,  // exactly content_length bytes
  kChunked,        // chunked transfer coding, then trailers
  kUntilClose,     // responses only: everything until the origin closes
};

enum class TargetForm {
  kOrigin,     // "/path?query"
  kAbsolute,   // "http://host/path" (to a proxy); see SplitAbsoluteUrl
  kAuthority,  // "host:port" (CONNECT only)
  kAsterisk,   // "*" (OPTIONS only)
};

struct RequestHead {
  std::string method;  // case-sensitive token, e.g. "GET"
  std::string target;  // the request-target as sent
  TargetForm target_form = TargetForm::kOrigin;
  int version_minor = 1;  // HTTP/1.<version_minor>
  HeaderList headers;
  BodyFraming framing = BodyFraming::kNone;
  Bytes content_length = 0;  // for kContentLength
  bool keep_alive = true;    // WantsKeepAlive

  void Clear();
};

struct ResponseHead {
  int version_minor = 1;  // HTTP/1.<version_minor>
  int status = 0;         // 100..599
  std::string reason;     // may be empty
  HeaderList headers;
  BodyFraming framing = BodyFraming::kNone;
  Bytes content_length = 0;  // for kContentLength
  // The connection can carry another response after this one (WantsKeepAlive, and the body
  // does not run until close, and no tunnel follows).
  bool keep_alive = true;

  void Clear();
  // The head in the form the cache and freshness rules use (common/http/http_message.h), with its
  // derived fields computed (HttpResponseHead::Finish).
  HttpResponseHead ToCacheHead() const;
};

// ---- Parsers ----

enum class EventType {
  kNeedMore,         // all of `in` was consumed; call again with more bytes
  kHead,             // the head is complete: head() is ready
  kBody,             // `body` holds the next body bytes (decoded from chunked framing)
  kMessageComplete,  // the message ended; trailers() holds its trailer fields
  kTunnel,           // the stream is no longer HTTP (after CONNECT, a 2xx to it, or a 101);
                     // nothing was consumed and the remaining bytes belong to the tunnel
  kEnd,              // from Eof(): the stream ended cleanly between messages
  kError,            // error() says why; the parser stays in this state
};

struct Event {
  EventType type = EventType::kNeedMore;
  // Bytes of `in` this call used; the caller drains them. Always <= in.size().
  std::size_t consumed = 0;
  // For kBody: the bytes, a view into `in` (within the consumed prefix). Use it before
  // draining the input.
  std::string_view body;
};

// The engine shared by RequestParser and ResponseParser: line assembly, limits, field lines,
// body framing, chunked decoding and trailers. Use one of the two subclasses.
//
// States (one per message; error and tunnel are final):
//
//   kStartLine ──line──▶ kHeaders ──empty line (kHead)──┬─▶ kFixedBody ──0 left──▶ done
//        ▲                                              ├─▶ kChunkSize ◀──────────┐
//        │                                              │     │ n>0               │ CR LF
//        │                                              │     ▼                   │
//        │                                              │   kChunkData ─n bytes─▶ kChunkDataCr/Lf
//        │                                              │     │ n=0
//        │                                              │     ▼
//        │                                              │   kTrailers ──empty line──▶ done
//        │                                              └─▶ kUntilClose ──Eof()──▶ done
//        └────────── next Parse() after kMessageComplete (kMessageDone) ◀── done
//
//   done = kMessageComplete; then kMessageDone, or kTunnel when a tunnel follows the message.
class MessageParser {
 public:
  virtual ~MessageParser() = default;
  MessageParser(const MessageParser&) = delete;
  MessageParser& operator=(const MessageParser&) = delete;

  // Parses from the front of `in` until one event happens or `in` is used up. Bytes of a line
  // that is not complete yet are copied into the parser (at most the line's limit) and count
  // as consumed. After kMessageComplete, the next call starts a new message (head() and
  // trailers() stay valid until then).
  [[nodiscard]] Event Parse(std::string_view in);
  // The peer closed its side. Returns kMessageComplete when that ends a body that runs until
  // close (or a head without body whose completion was not yet reported), kEnd between
  // messages or after a tunnel began, and kError (kTruncated) in the middle of a message.
  // Afterwards Parse returns kEnd.
  [[nodiscard]] Event Eof();
  // Forgets the current message and any error or tunnel state; the next bytes start a new
  // message. (E.g. after the proxy refused a CONNECT and keeps the connection.)
  void Reset();

  const HeaderList& trailers() const { return trailers_; }
  const ParseError& error() const { return error_; }
  // Body bytes of the current message delivered so far.
  Bytes body_bytes() const { return body_bytes_; }

 protected:
  MessageParser(const Limits& limits, bool is_request);

  // Parses the start line (no line ending). On failure calls Fail and returns false.
  virtual bool OnStartLine(std::string_view line) = 0;
  // Decides the framing once the head is complete: calls SetFraming, or Fail and returns false.
  virtual bool OnHeadComplete() = 0;
  // Clears the head for a new message.
  virtual void ClearHead() = 0;
  virtual HeaderList& head_headers() = 0;

  // Records the error (http_status from the direction) and moves to the error state.
  bool Fail(ParseErrorCode code, std::string message);
  // `tunnel_after`: once the message completes, the stream belongs to a tunnel.
  void SetFraming(BodyFraming framing, Bytes content_length, bool tunnel_after);

  const Limits limits_;
  const bool is_request_;

 private:
  // Each state: what it waits for → the state that follows. Bad input from any state → kError.
  enum class State {
    kStartLine,    // a request/status line        → kHeaders (empty lines: stay)
    kHeaders,      // field lines, empty line      → by framing: kFixedBody / kChunkSize /
                   //                                kUntilClose (event kHead)
    kFixedBody,    // remaining_ body bytes        → kMessageDone or kTunnel when 0 left
    kChunkSize,    // a chunk-size line (CR LF)    → kChunkData (n > 0) / kTrailers (n = 0)
    kChunkData,    // remaining_ chunk bytes       → kChunkDataCr
    kChunkDataCr,  // CR                           → kChunkDataLf
    kChunkDataLf,  // LF                           → kChunkSize
    kTrailers,     // trailer lines, empty line    → kMessageDone
    kUntilClose,   // body bytes until Eof()       → kEnded
    kMessageDone,  // the next Parse call          → kStartLine (a new message)
    kTunnel,       // nothing: not HTTP any more   → (Reset)
    kEnded,        // nothing: Eof() was called    → (Reset)
    kError,        // nothing: error_ is set       → (Reset)
  };
  enum class LineStatus { kLine, kNeedMore, kTooLong };

  // Takes one line ending in LF from in[*pos...], joining bytes buffered earlier, if the whole
  // line fits in `budget` bytes (line ending included). On kLine, *line excludes the LF and
  // *had_cr says whether a CR preceded it (stripped); *raw_size counts every byte.
  LineStatus TakeLine(std::string_view in, std::size_t* pos, std::size_t budget,
                      std::string_view* line, bool* had_cr, std::size_t* raw_size);
  // A field line of the head (trailers = false) or of the trailer section.
  bool OnFieldLine(std::string_view line, bool trailers);
  bool OnChunkSizeLine(std::string_view line);
  Event Complete(std::size_t consumed);
  void StartMessage();
  void AssertInvariants() const;

  State state_ = State::kStartLine;
  std::string line_;             // bytes of an incomplete line (capacity reused)
  bool line_taken_ = false;      // line_ holds a line already returned by TakeLine
  std::size_t empty_lines_ = 0;  // empty lines before the start line
  std::size_t head_bytes_ = 0;   // field-line bytes of the head or trailer section so far
  BodyFraming framing_ = BodyFraming::kNone;
  bool tunnel_after_ = false;
  Bytes remaining_ = 0;  // body bytes left in the fixed body or the current chunk
  Bytes body_bytes_ = 0;
  HeaderList trailers_;
  ParseError error_;
};

// Parses requests from a client (see the file comment). A CONNECT request has no body; once it
// is complete the parser reports kTunnel until Reset.
class RequestParser final : public MessageParser {
 public:
  explicit RequestParser(const Limits& limits = Limits()) : MessageParser(limits, true) {}
  // Valid from kHead until the next Parse after kMessageComplete; partial after an error.
  const RequestHead& head() const { return head_; }

 private:
  bool OnStartLine(std::string_view line) override;
  bool OnHeadComplete() override;
  void ClearHead() override { head_.Clear(); }
  HeaderList& head_headers() override { return head_.headers; }

  RequestHead head_;
};

// Parses responses from an origin. Which responses have a body depends on the request
// (RFC 9112 §6.3): tell the parser the method before its response starts.
class ResponseParser final : public MessageParser {
 public:
  explicit ResponseParser(const Limits& limits = Limits()) : MessageParser(limits, false) {}
  // The method of the request the next response answers ("HEAD": no body; "CONNECT": a 2xx
  // starts a tunnel). It stays in force for later responses until changed; default "GET".
  void SetRequestMethod(std::string_view method);
  // Valid from kHead until the next Parse after kMessageComplete; partial after an error.
  // 1xx responses are complete messages of their own; the final response follows.
  const ResponseHead& head() const { return head_; }

 private:
  bool OnStartLine(std::string_view line) override;
  bool OnHeadComplete() override;
  void ClearHead() override { head_.Clear(); }
  HeaderList& head_headers() override { return head_.headers; }

  ResponseHead head_;
  bool head_request_ = false;
  bool connect_request_ = false;
};

// ---- Serializers ----
// Each appends to *out. The head ones fail (kInvalidArgument, *out unchanged) when a part would
// break the framing: a method or field name that is not a token, a target with whitespace or
// control bytes, a value or reason with CR, LF or other control bytes. They write the fields as
// given: removing hop-by-hop fields and setting Host, Content-Length or Transfer-Encoding is
// the caller's job.

// "METHOD target HTTP/1.x" CR LF, "Name: value" CR LF per field, CR LF.
[[nodiscard]] Status AppendRequestHead(const RequestHead& head, std::string* out);
// "HTTP/1.x status reason" CR LF (ReasonPhrase(status) when reason is empty), fields, CR LF.
[[nodiscard]] Status AppendResponseHead(const ResponseHead& head, std::string* out);
// The line that starts a chunk of `size` bytes: hex size, CR LF. `size` must be > 0.
void AppendChunkHeader(Bytes size, std::string* out);
// One chunk: header, data, CR LF. Nothing for empty data (an empty chunk ends the body).
void AppendChunk(std::string_view data, std::string* out);
// The last chunk and the trailer section: "0" CR LF, trailer fields, CR LF.
[[nodiscard]] Status AppendLastChunk(const HeaderList& trailers, std::string* out);

}  // namespace ghost::http1

#endif  // GHOST_PROXY_HTTP1_H_
