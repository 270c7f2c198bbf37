#include "proxy/http1.h"

#include <gtest/gtest.h>

#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

namespace ghost::http1 {
namespace {

std::string FormName(TargetForm f) {
  switch (f) {
    case TargetForm::kOrigin:
      return "origin";
    case TargetForm::kAbsolute:
      return "absolute";
    case TargetForm::kAuthority:
      return "authority";
    case TargetForm::kAsterisk:
      return "asterisk";
  }
  return "?";
}

std::string FramingName(BodyFraming f, Bytes length) {
  switch (f) {
    case BodyFraming::kNone:
      return "none";
    case BodyFraming::kContentLength:
      return "cl:" + std::to_string(length);
    case BodyFraming::kChunked:
      return "chunked";
    case BodyFraming::kUntilClose:
      return "close";
  }
  return "?";
}

std::string Fields(const HeaderList& h) {
  std::string s = "[";
  for (const HeaderField& f : h) {
    if (s.size() > 1) s += "|";
    s += f.name + "=" + f.value;
  }
  return s + "]";
}

std::string Describe(const RequestHead& h) {
  return "head " + h.method + " " + h.target + " " + FormName(h.target_form) + " 1." +
         std::to_string(h.version_minor) + " " + Fields(h.headers) + " " +
         FramingName(h.framing, h.content_length) + (h.keep_alive ? " ka" : " close");
}

std::string Describe(const ResponseHead& h) {
  return "head 1." + std::to_string(h.version_minor) + " " + std::to_string(h.status) + " " +
         h.reason + " " + Fields(h.headers) + " " + FramingName(h.framing, h.content_length) +
         (h.keep_alive ? " ka" : " close");
}

// Feeds `pieces` one after another as a connection's input buffer would receive them: after
// each piece, parse until kNeedMore, draining what each event consumed. Returns the events as
// text, with consecutive body pieces joined, so that any split of the same bytes must give the
// same transcript. Checks the Event contract on the way (consumed within the buffer, body a
// view into it, kNeedMore consumes everything).
template <typename Parser>
std::vector<std::string> Feed(Parser& p, const std::vector<std::string>& pieces, bool eof = false) {
  std::vector<std::string> out;
  std::string buf;
  bool body_open = false;
  auto add = [&](std::string item) {
    body_open = false;
    out.push_back(std::move(item));
  };
  for (std::size_t k = 0; k < pieces.size(); ++k) {
    buf += pieces[k];
    while (true) {
      const Event e = p.Parse(buf);
      EXPECT_LE(e.consumed, buf.size());
      switch (e.type) {
        case EventType::kNeedMore:
          EXPECT_EQ(e.consumed, buf.size());
          break;
        case EventType::kHead:
          add(Describe(p.head()));
          break;
        case EventType::kBody:
          EXPECT_FALSE(e.body.empty());
          EXPECT_GE(e.body.data(), buf.data());
          EXPECT_LE(e.body.data() + e.body.size(), buf.data() + e.consumed);
          if (!body_open) out.push_back("body:");
          out.back().append(e.body);
          body_open = true;
          break;
        case EventType::kMessageComplete:
          add("complete" + (p.trailers().empty() ? "" : " " + Fields(p.trailers())));
          break;
        case EventType::kTunnel: {
          EXPECT_EQ(e.consumed, 0u);
          std::string rest = buf;
          for (std::size_t j = k + 1; j < pieces.size(); ++j) rest += pieces[j];
          add("tunnel:" + rest);
          return out;
        }
        case EventType::kEnd:
          add("end");
          return out;
        case EventType::kError:
          add("error " + std::to_string(p.error().http_status) + " " +
              std::string(ToString(p.error().code)));
          return out;
      }
      buf.erase(0, e.consumed);
      if (e.type == EventType::kNeedMore) break;
    }
  }
  if (eof) {
    const Event e = p.Eof();
    if (e.type == EventType::kMessageComplete) add("complete");
    if (e.type == EventType::kEnd) add("end");
    if (e.type == EventType::kError) {
      add("error " + std::to_string(p.error().http_status) + " " +
          std::string(ToString(p.error().code)));
    }
  }
  return out;
}

std::vector<std::string> Whole(std::string_view bytes) { return {std::string(bytes)}; }

std::vector<std::string> Bytewise(std::string_view bytes) {
  std::vector<std::string> v;
  for (char c : bytes) v.emplace_back(1, c);
  return v;
}

std::vector<std::string> ParseRequests(std::string_view bytes, const Limits& limits = Limits(),
                                       bool eof = false) {
  RequestParser p(limits);
  return Feed(p, Whole(bytes), eof);
}

std::vector<std::string> ParseResponses(std::string_view bytes, std::string_view method = "GET",
                                        bool eof = false) {
  ResponseParser p;
  p.SetRequestMethod(method);
  return Feed(p, Whole(bytes), eof);
}

// The error code of the first request in `bytes` (kNone if it parses).
ParseErrorCode RequestError(std::string_view bytes, const Limits& limits = Limits()) {
  RequestParser p(limits);
  std::string buf(bytes);
  while (true) {
    const Event e = p.Parse(buf);
    if (e.type == EventType::kError) return p.error().code;
    if (e.type == EventType::kNeedMore || e.type == EventType::kMessageComplete ||
        e.type == EventType::kTunnel) {
      return ParseErrorCode::kNone;
    }
    buf.erase(0, e.consumed);
  }
}

int RequestStatus(std::string_view bytes, const Limits& limits = Limits()) {
  return HttpStatusFor(RequestError(bytes, limits));
}

ParseErrorCode ResponseError(std::string_view bytes) {
  ResponseParser p;
  std::string buf(bytes);
  while (true) {
    const Event e = p.Parse(buf);
    if (e.type == EventType::kError) {
      EXPECT_EQ(p.error().http_status, 502);
      return p.error().code;
    }
    if (e.type == EventType::kNeedMore || e.type == EventType::kMessageComplete) {
      return ParseErrorCode::kNone;
    }
    buf.erase(0, e.consumed);
  }
}

// ---- Request-targets ----

TEST(RequestParserTest, ParsesOriginForm) {
  EXPECT_EQ(ParseRequests("GET /a/b?c=d HTTP/1.1\r\nHost: example.com\r\n\r\n"),
            (std::vector<std::string>{"head GET /a/b?c=d origin 1.1 [Host=example.com] none ka",
                                      "complete"}));
}

TEST(RequestParserTest, ParsesAbsoluteFormAndSplitsIt) {
  RequestParser p;
  const std::string req =
      "GET http://Example.COM:8080/x?y HTTP/1.1\r\nHost: example.com:8080\r\n\r\n";
  const Event e = p.Parse(req);
  ASSERT_EQ(e.type, EventType::kHead);
  EXPECT_EQ(e.consumed, req.size());
  EXPECT_EQ(p.head().target_form, TargetForm::kAbsolute);
  Result<AbsoluteUrl> u = SplitAbsoluteUrl(p.head().target);
  ASSERT_TRUE(u.ok()) << u.status().ToString();
  EXPECT_EQ(u->host, "example.com");
  EXPECT_EQ(u->port, 8080);
  EXPECT_EQ(u->path, "/x?y");
  EXPECT_EQ(u->Authority(), "example.com:8080");
}

TEST(RequestParserTest, ParsesAuthorityFormForConnectThenTunnels) {
  EXPECT_EQ(ParseRequests("CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n"
                          "\x16\x03\x01 TLS bytes"),
            (std::vector<std::string>{
                "head CONNECT example.com:443 authority 1.1 [Host=example.com:443] none close",
                "complete", "tunnel:\x16\x03\x01 TLS bytes"}));
  EXPECT_EQ(ParseRequests("CONNECT [::1]:8443 HTTP/1.1\r\nHost: [::1]:8443\r\n\r\n").at(0),
            "head CONNECT [::1]:8443 authority 1.1 [Host=[::1]:8443] none close");
}

TEST(RequestParserTest, ResetAfterTunnelParsesAgain) {
  RequestParser p;
  std::string buf = "CONNECT h:443 HTTP/1.1\r\nHost: h:443\r\n\r\n";
  Event e = p.Parse(buf);
  ASSERT_EQ(e.type, EventType::kHead);
  EXPECT_EQ(p.Parse("").type, EventType::kMessageComplete);
  EXPECT_EQ(p.Parse("GET / HTTP/1.1\r\n").type, EventType::kTunnel);
  p.Reset();
  e = p.Parse("GET / HTTP/1.1\r\nHost: h\r\n\r\n");
  EXPECT_EQ(e.type, EventType::kHead);
  EXPECT_EQ(p.head().method, "GET");
}

TEST(RequestParserTest, ParsesAsteriskFormForOptionsOnly) {
  EXPECT_EQ(ParseRequests("OPTIONS * HTTP/1.1\r\nHost: h\r\n\r\n").at(0),
            "head OPTIONS * asterisk 1.1 [Host=h] none ka");
  EXPECT_EQ(RequestError("GET * HTTP/1.1\r\nHost: h\r\n\r\n"), ParseErrorCode::kBadTarget);
}

TEST(RequestParserTest, RejectsTargetsInTheWrongForm) {
  // CONNECT needs host:port; other methods cannot use authority-form or a bare word.
  EXPECT_EQ(RequestError("CONNECT /x HTTP/1.1\r\nHost: h\r\n\r\n"), ParseErrorCode::kBadTarget);
  EXPECT_EQ(RequestError("CONNECT example.com HTTP/1.1\r\nHost: h\r\n\r\n"),
            ParseErrorCode::kBadTarget);
  EXPECT_EQ(RequestError("CONNECT user@h:443 HTTP/1.1\r\nHost: h\r\n\r\n"),
            ParseErrorCode::kBadTarget);
  EXPECT_EQ(RequestError("CONNECT h:0 HTTP/1.1\r\nHost: h\r\n\r\n"), ParseErrorCode::kBadTarget);
  EXPECT_EQ(RequestError("CONNECT h:65536 HTTP/1.1\r\nHost: h\r\n\r\n"),
            ParseErrorCode::kBadTarget);
  EXPECT_EQ(RequestError("GET index.html HTTP/1.1\r\nHost: h\r\n\r\n"), ParseErrorCode::kBadTarget);
  EXPECT_EQ(RequestError("GET /a#frag HTTP/1.1\r\nHost: h\r\n\r\n"), ParseErrorCode::kBadTarget);
  EXPECT_EQ(RequestError("GET /caf\xc3\xa9 HTTP/1.1\r\nHost: h\r\n\r\n"),
            ParseErrorCode::kBadTarget);
  // "host:port" with another method reads as a URL with an odd scheme; SplitAbsoluteUrl
  // refuses it.
  RequestParser p;
  ASSERT_EQ(p.Parse("GET example.com:80 HTTP/1.1\r\nHost: h\r\n\r\n").type, EventType::kHead);
  EXPECT_EQ(SplitAbsoluteUrl(p.head().target).status().code(), Status::Code::kNotSupported);
}

TEST(RequestParserTest, ConnectWithABodyIsRejected) {
  EXPECT_EQ(RequestError("CONNECT h:443 HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\n\r\n"),
            ParseErrorCode::kConflictingFraming);
  EXPECT_EQ(RequestError("CONNECT h:443 HTTP/1.1\r\nHost: h\r\nContent-Length: 0\r\n\r\n"),
            ParseErrorCode::kNone);
}

// ---- Host ----

TEST(RequestParserTest, Http11NeedsExactlyOneValidHost) {
  EXPECT_EQ(RequestStatus("GET / HTTP/1.1\r\n\r\n"), 400);
  EXPECT_EQ(RequestError("GET / HTTP/1.1\r\nHost: a\r\nHost: a\r\n\r\n"), ParseErrorCode::kBadHost);
  EXPECT_EQ(RequestError("GET / HTTP/1.1\r\nHost: a b\r\n\r\n"), ParseErrorCode::kBadHost);
  EXPECT_EQ(RequestError("GET / HTTP/1.1\r\nHost: u@a\r\n\r\n"), ParseErrorCode::kBadHost);
  EXPECT_EQ(RequestError("GET / HTTP/1.1\r\nHost: a:x\r\n\r\n"), ParseErrorCode::kBadHost);
  EXPECT_EQ(RequestError("GET / HTTP/1.1\r\nHost:\r\n\r\n"), ParseErrorCode::kNone);
  EXPECT_EQ(RequestError("GET / HTTP/1.0\r\n\r\n"), ParseErrorCode::kNone);
}

// ---- Request-line ----

TEST(RequestParserTest, RejectsBadRequestLinesWith400) {
  for (std::string_view line : {
           "GET /",                 // HTTP/0.9
           "GET / HTTP/1.1 extra",  //
           "GET  / HTTP/1.1",       // two spaces
           "GET /  HTTP/1.1",       //
           " GET / HTTP/1.1",       //
           "GET\t/ HTTP/1.1",       //
           "G(T / HTTP/1.1",        // method not a token
           "GET / http/1.1",        //
           "GET / HTTP/1.10",       //
           "GET / HTTP/1",          //
           "GET / HTTP/1.x",        //
           "GET /\x01 HTTP/1.1",    //
           "GET / HTTP/1.1\r",      // bare CR before CR LF
           "GET /a\rb HTTP/1.1",    //
           "",                      // only empty lines, then junk below
       }) {
    const std::string req = std::string(line) + "\r\nHost: h\r\n\r\n";
    EXPECT_EQ(RequestStatus(req), 400) << line;
  }
}

TEST(RequestParserTest, OtherHttpVersionsAre505) {
  for (std::string_view v : {"HTTP/2.0", "HTTP/2", "HTTP/3", "HTTP/0.9"}) {
    const std::string req = "GET / " + std::string(v) + "\r\nHost: h\r\n\r\n";
    EXPECT_EQ(RequestError(req), ParseErrorCode::kVersionNotSupported) << v;
    EXPECT_EQ(RequestStatus(req), 505) << v;
  }
  // The HTTP/2 connection preface, sent to an HTTP/1.1 port.
  EXPECT_EQ(RequestStatus("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"), 505);
}

TEST(RequestParserTest, AcceptsHttp10AndLineFeedOnlyLines) {
  EXPECT_EQ(
      ParseRequests("GET /x HTTP/1.0\nUser-Agent: a\n\n"),
      (std::vector<std::string>{"head GET /x origin 1.0 [User-Agent=a] none close", "complete"}));
}

TEST(RequestParserTest, IgnoresAFewEmptyLinesBeforeTheRequestLine) {
  EXPECT_EQ(ParseRequests("\r\n\nGET / HTTP/1.1\r\nHost: h\r\n\r\n").at(0),
            "head GET / origin 1.1 [Host=h] none ka");
  std::string many;
  for (int i = 0; i < 9; ++i) many += "\r\n";
  EXPECT_EQ(RequestError(many + "GET / HTTP/1.1\r\nHost: h\r\n\r\n"),
            ParseErrorCode::kBadStartLine);
}

// ---- Limits ----

TEST(RequestParserTest, RequestLineLongerThanTheLimitIs414) {
  Limits limits;
  limits.max_start_line = 64;
  // "GET /" + path + " HTTP/1.1\r\n" is exactly 64 bytes: accepted; one more byte: 414.
  const std::string fits = "GET /" + std::string(64 - 16, 'a') + " HTTP/1.1\r\n";
  ASSERT_EQ(fits.size(), 64u);
  EXPECT_EQ(RequestError(fits + "Host: h\r\n\r\n", limits), ParseErrorCode::kNone);
  const std::string longer = "GET /" + std::string(64 - 15, 'a') + " HTTP/1.1\r\n";
  EXPECT_EQ(RequestError(longer + "Host: h\r\n\r\n", limits), ParseErrorCode::kStartLineTooLong);
  EXPECT_EQ(RequestStatus(longer + "Host: h\r\n\r\n", limits), 414);
}

TEST(RequestParserTest, OversizedRequestLineFailsBeforeItEnds) {
  // A peer that never sends LF cannot make the parser buffer more than the limit.
  Limits limits;
  limits.max_start_line = 100;
  RequestParser p(limits);
  const std::string junk(99, 'a');
  EXPECT_EQ(p.Parse(junk).type, EventType::kNeedMore);
  const Event e = p.Parse("a");
  EXPECT_EQ(e.type, EventType::kError);
  EXPECT_EQ(p.error().code, ParseErrorCode::kStartLineTooLong);
  EXPECT_EQ(p.error().http_status, 414);
  // The error is final.
  EXPECT_EQ(p.Parse("GET / HTTP/1.1\r\n").type, EventType::kError);
}

TEST(RequestParserTest, HeaderSectionLargerThanTheLimitIs431) {
  Limits limits;
  limits.max_header_bytes = 40;
  // Field lines "Host: h\r\n" (9) + "X: " + v + "\r\n" + "\r\n" = 40 exactly.
  const std::string v(40 - 9 - 5 - 2, 'v');
  EXPECT_EQ(RequestError("GET / HTTP/1.1\r\nHost: h\r\nX: " + v + "\r\n\r\n", limits),
            ParseErrorCode::kNone);
  EXPECT_EQ(RequestError("GET / HTTP/1.1\r\nHost: h\r\nX: " + v + "v\r\n\r\n", limits),
            ParseErrorCode::kHeadersTooLarge);
  EXPECT_EQ(RequestStatus("GET / HTTP/1.1\r\nHost: h\r\nX: " + v + "v\r\n\r\n", limits), 431);
  // An endless field line fails without its LF.
  RequestParser p(limits);
  EXPECT_EQ(p.Parse("GET / HTTP/1.1\r\nX: " + std::string(100, 'v')).type, EventType::kError);
  EXPECT_EQ(p.error().code, ParseErrorCode::kHeadersTooLarge);
}

TEST(RequestParserTest, TooManyHeaderFieldsIs431WithItsOwnCode) {
  Limits limits;
  limits.max_headers = 3;
  EXPECT_EQ(RequestError("GET / HTTP/1.1\r\nHost: h\r\nA: 1\r\nB: 2\r\n\r\n", limits),
            ParseErrorCode::kNone);
  EXPECT_EQ(RequestError("GET / HTTP/1.1\r\nHost: h\r\nA: 1\r\nB: 2\r\nC: 3\r\n\r\n", limits),
            ParseErrorCode::kTooManyHeaders);
  EXPECT_EQ(RequestStatus("GET / HTTP/1.1\r\nHost: h\r\nA: 1\r\nB: 2\r\nC: 3\r\n\r\n", limits),
            431);
}

// ---- Field lines ----

TEST(RequestParserTest, TrimsOptionalWhitespaceAroundValues) {
  EXPECT_EQ(ParseRequests("GET / HTTP/1.1\r\nHost:h\r\nX: \t a  b \t\r\nEmpty:   \r\n\r\n").at(0),
            "head GET / origin 1.1 [Host=h|X=a  b|Empty=] none ka");
}

TEST(RequestParserTest, ObsFoldIs400) {
  EXPECT_EQ(RequestError("GET / HTTP/1.1\r\nHost: h\r\nX: a\r\n  b\r\n\r\n"),
            ParseErrorCode::kObsFold);
  EXPECT_EQ(RequestError("GET / HTTP/1.1\r\nHost: h\r\nX: a\r\n\tb\r\n\r\n"),
            ParseErrorCode::kObsFold);
  // Whitespace before the first field line too (RFC 9112 §2.2).
  EXPECT_EQ(RequestError("GET / HTTP/1.1\r\n Host: h\r\n\r\n"), ParseErrorCode::kObsFold);
  EXPECT_EQ(RequestStatus("GET / HTTP/1.1\r\nHost: h\r\nX: a\r\n  b\r\n\r\n"), 400);
}

TEST(RequestParserTest, WhitespaceBetweenNameAndColonIs400) {
  EXPECT_EQ(RequestError("GET / HTTP/1.1\r\nHost : h\r\n\r\n"),
            ParseErrorCode::kWhitespaceBeforeColon);
  EXPECT_EQ(RequestError("GET / HTTP/1.1\r\nHost: h\r\nContent-Length\t: 0\r\n\r\n"),
            ParseErrorCode::kWhitespaceBeforeColon);
  EXPECT_EQ(RequestStatus("GET / HTTP/1.1\r\nHost : h\r\n\r\n"), 400);
}

TEST(RequestParserTest, RejectsMalformedFieldLines) {
  for (std::string_view field : std::initializer_list<std::string_view>{
           "NoColon",                       //
           ": no name",                     //
           "Bad Name: v",                   //
           "B@d: v",                        //
           "X: a\x01z",                     // control byte
           "X: a\x7f",                      // DEL
           std::string_view("X: a\0b", 6),  // NUL
           "X: a\rb",                       // bare CR
       }) {
    const std::string req = "GET / HTTP/1.1\r\nHost: h\r\n" + std::string(field) + "\r\n\r\n";
    EXPECT_EQ(RequestError(req), ParseErrorCode::kBadHeader) << field;
  }
  // obs-text (bytes >= 0x80) is allowed in values.
  EXPECT_EQ(RequestError("GET / HTTP/1.1\r\nHost: h\r\nX: caf\xc3\xa9\r\n\r\n"),
            ParseErrorCode::kNone);
}

// ---- Body framing ----

TEST(RequestParserTest, ContentLengthBody) {
  EXPECT_EQ(ParseRequests("POST /f HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\n\r\nhello"),
            (std::vector<std::string>{"head POST /f origin 1.1 [Host=h|Content-Length=5] cl:5 ka",
                                      "body:hello", "complete"}));
}

TEST(RequestParserTest, ContentLengthAndTransferEncodingTogetherAre400) {
  for (std::string_view fields : {
           "Content-Length: 5\r\nTransfer-Encoding: chunked",
           "Transfer-Encoding: chunked\r\nContent-Length: 5",
           "Transfer-Encoding: chunked\r\nContent-Length: 0",
       }) {
    const std::string req =
        "POST / HTTP/1.1\r\nHost: h\r\n" + std::string(fields) + "\r\n\r\n5\r\nhello\r\n0\r\n\r\n";
    EXPECT_EQ(RequestError(req), ParseErrorCode::kConflictingFraming) << fields;
    EXPECT_EQ(RequestStatus(req), 400) << fields;
  }
}

TEST(RequestParserTest, DifferingContentLengthsAre400) {
  EXPECT_EQ(RequestError("POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\n"
                         "Content-Length: 6\r\n\r\nhello!"),
            ParseErrorCode::kBadContentLength);
  EXPECT_EQ(RequestError("POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 5, 6\r\n\r\nhello!"),
            ParseErrorCode::kBadContentLength);
  // Repeating the same value is allowed (RFC 9110 §8.6).
  EXPECT_EQ(ParseRequests("POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\n"
                          "Content-Length: 5, 5\r\n\r\nhello")
                .at(1),
            "body:hello");
}

TEST(RequestParserTest, ContentLengthMustBeDigits) {
  for (std::string_view v :
       {"+5", "-1", "5a", "0x5", "1 2", "", ",", "5,", "5.0", "99999999999999999999999"}) {
    const std::string req =
        "POST / HTTP/1.1\r\nHost: h\r\nContent-Length: " + std::string(v) + "\r\n\r\n";
    EXPECT_EQ(RequestError(req), ParseErrorCode::kBadContentLength) << v;
  }
  EXPECT_EQ(ParseRequests("POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 007\r\n\r\nabcdefg").at(1),
            "body:abcdefg");
}

TEST(RequestParserTest, TransferEncodingMustEndInChunked) {
  auto te = [](std::string_view value, std::string_view version = "1.1") {
    return RequestError("POST / HTTP/" + std::string(version) +
                        "\r\nHost: h\r\nTransfer-Encoding: " + std::string(value) +
                        "\r\n\r\n0\r\n\r\n");
  };
  EXPECT_EQ(te("chunked"), ParseErrorCode::kNone);
  EXPECT_EQ(te("Chunked"), ParseErrorCode::kNone);
  EXPECT_EQ(te("gzip"), ParseErrorCode::kBadTransferEncoding);
  EXPECT_EQ(te("chunked, gzip"), ParseErrorCode::kBadTransferEncoding);
  EXPECT_EQ(te("chunked, chunked"), ParseErrorCode::kBadTransferEncoding);
  EXPECT_EQ(te(""), ParseErrorCode::kBadTransferEncoding);
  EXPECT_EQ(te("chunked;x=1"), ParseErrorCode::kBadTransferEncoding);
  EXPECT_EQ(te("chunked", "1.0"), ParseErrorCode::kBadTransferEncoding);
  EXPECT_EQ(te("gzip, chunked"), ParseErrorCode::kUnsupportedTransferCoding);
  EXPECT_EQ(HttpStatusFor(te("gzip, chunked")), 501);
  EXPECT_EQ(HttpStatusFor(te("gzip")), 400);
}

TEST(RequestParserTest, ChunkedBodyWithExtensionsAndTrailers) {
  const std::string req =
      "POST /up HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n"
      "5;name=value\r\nhello\r\n"
      "6 ; a ; b=\"q \\\" s\"\r\n world\r\n"
      "000\r\n"
      "Checksum: abc\r\nX-Trailer:  2 \r\n\r\n";
  EXPECT_EQ(ParseRequests(req),
            (std::vector<std::string>{
                "head POST /up origin 1.1 [Host=h|Transfer-Encoding=chunked] chunked ka",
                "body:hello world", "complete [Checksum=abc|X-Trailer=2]"}));
}

TEST(RequestParserTest, RejectsBadChunks) {
  const std::string head = "POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n";
  for (std::string_view body : {
           "zz\r\n",                         // not hex
           "\r\n",                           // no size
           "-5\r\nhello\r\n0\r\n\r\n",       //
           "0x5\r\nhello\r\n0\r\n\r\n",      //
           "10000000000000000\r\n",          // 2^64: overflow
           "fffffffffffffffff\r\n",          //
           "5\r\nhelloX\r\n0\r\n\r\n",       // data not followed by CR LF
           "5\r\nhello\n0\r\n\r\n",          // ... by a bare LF
           "5\r\nhello\rX",                  //
           "5\nhello\r\n0\r\n\r\n",          // size line ending in bare LF
           "5;\r\nhello\r\n0\r\n\r\n",       // extension without name
           "5;a=\r\nhello\r\n0\r\n\r\n",     // ... without value
           "5;a=\"x\r\nhello\r\n0\r\n\r\n",  // unterminated quoted string
           "5;a b\r\nhello\r\n0\r\n\r\n",    //
           "5 x\r\nhello\r\n0\r\n\r\n",      //
           "5;a\rb\r\nhello\r\n0\r\n\r\n",   // bare CR in an extension
       }) {
    EXPECT_EQ(RequestError(head + std::string(body)), ParseErrorCode::kBadChunk) << body;
  }
  // The largest chunk size still parses (and then waits for its data).
  EXPECT_EQ(RequestError(head + "ffffffffffffffff\r\nabc"), ParseErrorCode::kNone);
  // A chunk-size line over the limit fails before it ends.
  Limits limits;
  limits.max_chunk_line = 32;
  EXPECT_EQ(RequestError(head + "5;" + std::string(40, 'a'), limits), ParseErrorCode::kBadChunk);
}

TEST(RequestParserTest, TrailerSectionIsBounded) {
  Limits limits;
  limits.max_trailer_bytes = 32;
  limits.max_headers = 2;
  const std::string head = "POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n";
  EXPECT_EQ(RequestError(head + "A: 1\r\nB: 2\r\n\r\n", limits), ParseErrorCode::kNone);
  EXPECT_EQ(RequestError(head + "A: 1\r\nB: 2\r\nC: 3\r\n\r\n", limits),
            ParseErrorCode::kTrailersTooLarge);
  EXPECT_EQ(RequestError(head + "A: " + std::string(40, 'x') + "\r\n\r\n", limits),
            ParseErrorCode::kTrailersTooLarge);
  EXPECT_EQ(RequestStatus(head + "A: " + std::string(40, 'x') + "\r\n\r\n", limits), 431);
  EXPECT_EQ(RequestError(head + "A: 1\r\n b\r\n\r\n", limits), ParseErrorCode::kObsFold);
}

// ---- Pipelining and splitting ----

const char kPipelined[] =
    "GET /one HTTP/1.1\r\nHost: h\r\n\r\n"
    "POST /two HTTP/1.1\r\nHost: h\r\nContent-Length: 11\r\n\r\nhello world"
    "PUT /three HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n"
    "3;x=y\r\nabc\r\n10\r\n0123456789abcdef\r\n0\r\nT: v\r\n\r\n"
    "\r\n"  // a stray CR LF after a body, as old clients send
    "GET http://h:81/four HTTP/1.0\r\nConnection: keep-alive\r\n\r\n"
    "OPTIONS * HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n";

const std::vector<std::string> kPipelinedEvents = {
    "head GET /one origin 1.1 [Host=h] none ka",
    "complete",
    "head POST /two origin 1.1 [Host=h|Content-Length=11] cl:11 ka",
    "body:hello world",
    "complete",
    "head PUT /three origin 1.1 [Host=h|Transfer-Encoding=chunked] chunked ka",
    "body:abc0123456789abcdef",
    "complete [T=v]",
    "head GET http://h:81/four absolute 1.0 [Connection=keep-alive] none ka",
    "complete",
    "head OPTIONS * asterisk 1.1 [Host=h|Connection=close] none close",
    "complete",
    "end",
};

TEST(RequestParserTest, ParsesPipelinedRequestsInOneBuffer) {
  EXPECT_EQ(ParseRequests(kPipelined, Limits(), /*eof=*/true), kPipelinedEvents);
}

TEST(RequestParserTest, ConsumedCountsEndEachMessageExactly) {
  RequestParser p;
  std::string_view in = kPipelined;
  Event e = p.Parse(in);
  ASSERT_EQ(e.type, EventType::kHead);
  EXPECT_EQ(e.consumed, std::string_view("GET /one HTTP/1.1\r\nHost: h\r\n\r\n").size());
  in.remove_prefix(e.consumed);
  e = p.Parse(in);
  EXPECT_EQ(e.type, EventType::kMessageComplete);
  EXPECT_EQ(e.consumed, 0u);
  e = p.Parse(in);
  ASSERT_EQ(e.type, EventType::kHead);
  EXPECT_EQ(p.head().target, "/two");
  in.remove_prefix(e.consumed);
  e = p.Parse(in);
  ASSERT_EQ(e.type, EventType::kBody);
  EXPECT_EQ(e.body, "hello world");
  EXPECT_EQ(e.consumed, 11u);
  EXPECT_EQ(e.body.data(), in.data());
  in.remove_prefix(e.consumed);
  EXPECT_TRUE(in.starts_with("PUT /three"));
}

TEST(RequestParserTest, SameEventsAtEverySplitPoint) {
  const std::string_view all = kPipelined;
  for (std::size_t i = 0; i <= all.size(); ++i) {
    RequestParser p;
    EXPECT_EQ(Feed(p, {std::string(all.substr(0, i)), std::string(all.substr(i))}, true),
              kPipelinedEvents)
        << "split at " << i;
  }
}

TEST(RequestParserTest, SameEventsFedOneByteAtATime) {
  RequestParser p;
  EXPECT_EQ(Feed(p, Bytewise(kPipelined), true), kPipelinedEvents);
}

TEST(RequestParserTest, SameErrorsFedOneByteAtATime) {
  Limits limits;
  limits.max_start_line = 40;
  limits.max_header_bytes = 60;
  limits.max_headers = 3;
  for (std::string_view bad : {
           "GET / HTTP/2.0\r\n\r\n",
           "GET /"
           "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa HTTP/1.1\r\n\r\n",
           "GET / HTTP/1.1\r\nHost: h\r\nA: 1\r\nB: 2\r\nC: 3\r\n\r\n",
           "GET / HTTP/1.1\r\nHost: h\r\nA: "
           "11111111111111111111111111111111111111111111111\r\n\r\n",
           "POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhelloX",
           "GET / HTTP/1.1\r\nHost : h\r\n\r\n",
       }) {
    RequestParser whole(limits), bytewise(limits);
    const std::vector<std::string> expected = Feed(whole, Whole(bad));
    ASSERT_FALSE(expected.empty());
    EXPECT_TRUE(expected.back().starts_with("error ")) << bad;
    EXPECT_EQ(Feed(bytewise, Bytewise(bad)), expected) << bad;
  }
}

// ---- End of stream ----

TEST(RequestParserTest, EofBetweenMessagesIsClean) {
  EXPECT_EQ(
      ParseRequests("GET / HTTP/1.1\r\nHost: h\r\n\r\n", Limits(), true),
      (std::vector<std::string>{"head GET / origin 1.1 [Host=h] none ka", "complete", "end"}));
  EXPECT_EQ(ParseRequests("", Limits(), true), (std::vector<std::string>{"end"}));
}

TEST(RequestParserTest, EofInsideAMessageIsTruncated) {
  for (std::string_view partial : {
           "GET / HT",
           "GET / HTTP/1.1\r\nHost: h\r\n",
           "POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\n\r\nhel",
           "POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n",
       }) {
    const std::vector<std::string> events = ParseRequests(partial, Limits(), true);
    ASSERT_FALSE(events.empty());
    EXPECT_EQ(events.back(), "error 400 truncated message") << partial;
  }
}

// ---- Keep-alive and errors ----

TEST(RequestParserTest, KeepAliveFollowsVersionAndConnection) {
  auto ka = [](std::string_view version, std::string_view connection) {
    RequestParser p;
    std::string req = "GET / HTTP/" + std::string(version) + "\r\nHost: h\r\n";
    if (!connection.empty()) req += "Connection: " + std::string(connection) + "\r\n";
    EXPECT_EQ(p.Parse(req + "\r\n").type, EventType::kHead);
    return p.head().keep_alive;
  };
  EXPECT_TRUE(ka("1.1", ""));
  EXPECT_FALSE(ka("1.1", "close"));
  EXPECT_FALSE(ka("1.1", "Upgrade, CLOSE"));
  EXPECT_FALSE(ka("1.0", ""));
  EXPECT_TRUE(ka("1.0", "Keep-Alive"));
  EXPECT_FALSE(ka("1.0", "keep-alive, close"));
}

TEST(RequestParserTest, ErrorsCarryTheStatusAndAMessage) {
  RequestParser p;
  EXPECT_EQ(
      p.Parse("GET / HTTP/1.1\r\nHost: h\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n").type,
      EventType::kError);
  EXPECT_EQ(p.error().http_status, 400);
  EXPECT_NE(p.error().message.find("disagree"), std::string::npos) << p.error().message;
  const Status s = p.error().ToStatus();
  EXPECT_EQ(s.code(), Status::Code::kInvalidArgument);
  EXPECT_NE(s.message().find("(400)"), std::string::npos);
  EXPECT_EQ(p.Parse("more").consumed, 0u);
  EXPECT_EQ(p.Eof().type, EventType::kError);
  p.Reset();
  EXPECT_TRUE(p.error().ok());
  EXPECT_EQ(p.Parse("GET / HTTP/1.1\r\nHost: h\r\n\r\n").type, EventType::kHead);

  ParseError e{ParseErrorCode::kVersionNotSupported, 505, "HTTP/2.0"};
  EXPECT_EQ(e.ToStatus().code(), Status::Code::kNotSupported);
  EXPECT_TRUE(ParseError().ToStatus().ok());
}

// ---- Responses ----

TEST(ResponseParserTest, ContentLengthAndChunkedBodies) {
  EXPECT_EQ(
      ParseResponses("HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nabc"
                     "HTTP/1.1 404 Not Found\r\nTransfer-Encoding: chunked\r\n\r\n"
                     "2\r\nno\r\n0\r\n\r\n"),
      (std::vector<std::string>{
          "head 1.1 200 OK [Content-Length=3] cl:3 ka", "body:abc", "complete",
          "head 1.1 404 Not Found [Transfer-Encoding=chunked] chunked ka", "body:no", "complete"}));
}

TEST(ResponseParserTest, BodyWithoutFramingRunsUntilClose) {
  const std::vector<std::string> expected = {"head 1.0 200 OK [Server=x] close close",
                                             "body:everything until close", "complete"};
  EXPECT_EQ(
      ParseResponses("HTTP/1.0 200 OK\r\nServer: x\r\n\r\neverything until close", "GET", true),
      expected);
  ResponseParser p;
  EXPECT_EQ(Feed(p, Bytewise("HTTP/1.0 200 OK\r\nServer: x\r\n\r\neverything until close"), true),
            expected);
  // A transfer coding that is not chunked last also runs until close (RFC 9112 §6.3 item 4).
  EXPECT_EQ(
      ParseResponses("HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\nzz", "GET", true).at(0),
      "head 1.1 200 OK [Transfer-Encoding=gzip] close close");
}

TEST(ResponseParserTest, ResponsesWithoutBodies) {
  // 204 and 304 ignore their Content-Length; the next response follows at once.
  EXPECT_EQ(ParseResponses("HTTP/1.1 204 No Content\r\nContent-Length: 10\r\n\r\n"
                           "HTTP/1.1 304 Not Modified\r\nTransfer-Encoding: chunked\r\n\r\n"
                           "HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nx"),
            (std::vector<std::string>{
                "head 1.1 204 No Content [Content-Length=10] none ka", "complete",
                "head 1.1 304 Not Modified [Transfer-Encoding=chunked] none ka", "complete",
                "head 1.1 200 OK [Content-Length=1] cl:1 ka", "body:x", "complete"}));
  // The response to HEAD.
  EXPECT_EQ(
      ParseResponses("HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n", "HEAD"),
      (std::vector<std::string>{"head 1.1 200 OK [Content-Length=1000] none ka", "complete"}));
  // Interim responses before the final one.
  EXPECT_EQ(ParseResponses("HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\n"
                           "Link: </s.css>\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"),
            (std::vector<std::string>{"head 1.1 100 Continue [] none ka", "complete",
                                      "head 1.1 103 Early Hints [Link=</s.css>] none ka",
                                      "complete", "head 1.1 200 OK [Content-Length=2] cl:2 ka",
                                      "body:ok", "complete"}));
}

TEST(ResponseParserTest, SwitchingProtocolsAndConnectStartATunnel) {
  EXPECT_EQ(
      ParseResponses("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r\nWS"),
      (std::vector<std::string>{"head 1.1 101 Switching Protocols [Upgrade=websocket] none close",
                                "complete", "tunnel:WS"}));
  EXPECT_EQ(ParseResponses("HTTP/1.1 200 Connection established\r\n\r\nTLS", "CONNECT"),
            (std::vector<std::string>{"head 1.1 200 Connection established [] none close",
                                      "complete", "tunnel:TLS"}));
  EXPECT_EQ(ParseResponses("HTTP/1.1 407 Auth\r\nContent-Length: 2\r\n\r\nno", "CONNECT"),
            (std::vector<std::string>{"head 1.1 407 Auth [Content-Length=2] cl:2 ka", "body:no",
                                      "complete"}));
}

TEST(ResponseParserTest, RepairsWhatAProxyMayRepair) {
  // obs-fold becomes a space; whitespace before the colon is dropped (RFC 9112 §5.1, §5.2).
  EXPECT_EQ(ParseResponses("HTTP/1.1 200 OK\r\nX: a\r\n  b\r\n\t\r\nServer : s\r\n"
                           "Content-Length: 0\r\n\r\n")
                .at(0),
            "head 1.1 200 OK [X=a b|Server=s|Content-Length=0] cl:0 ka");
  // No reason phrase, with or without the space.
  EXPECT_EQ(ParseResponses("HTTP/1.1 200\r\nContent-Length: 0\r\n\r\n").at(0),
            "head 1.1 200  [Content-Length=0] cl:0 ka");
  EXPECT_EQ(ParseResponses("HTTP/1.1 200 \r\nContent-Length: 0\r\n\r\n").at(0),
            "head 1.1 200  [Content-Length=0] cl:0 ka");
}

TEST(ResponseParserTest, ErrorsAre502) {
  EXPECT_EQ(ResponseError("HTTP/1.1 2000 OK\r\n\r\n"), ParseErrorCode::kBadStartLine);
  EXPECT_EQ(ResponseError("HTTP/1.1 20 OK\r\n\r\n"), ParseErrorCode::kBadStartLine);
  EXPECT_EQ(ResponseError("HTTP/1.1 099 Low\r\n\r\n"), ParseErrorCode::kBadStartLine);
  EXPECT_EQ(ResponseError("HTTP/1.1 600 High\r\n\r\n"), ParseErrorCode::kBadStartLine);
  EXPECT_EQ(ResponseError("HTTP/1.1  200 OK\r\n\r\n"), ParseErrorCode::kBadStartLine);
  EXPECT_EQ(ResponseError("ICY 200 OK\r\n\r\n"), ParseErrorCode::kBadStartLine);
  EXPECT_EQ(ResponseError("HTTP/2 200\r\n\r\n"), ParseErrorCode::kVersionNotSupported);
  EXPECT_EQ(ResponseError("HTTP/1.1 200 OK\r\nContent-Length: 2\r\nTransfer-Encoding: chunked"
                          "\r\n\r\n"),
            ParseErrorCode::kConflictingFraming);
  EXPECT_EQ(ResponseError("HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n"),
            ParseErrorCode::kBadContentLength);
  EXPECT_EQ(ResponseError("HTTP/1.1 200 OK\r\n folded\r\n\r\n"), ParseErrorCode::kObsFold);
  EXPECT_EQ(ResponseError("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nxyz\r\n"),
            ParseErrorCode::kBadChunk);
  EXPECT_EQ(ResponseError("HTTP/1.0 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"),
            ParseErrorCode::kBadTransferEncoding);
  EXPECT_EQ(ParseResponses("HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nab", "GET", true).back(),
            "error 502 truncated message");
}

TEST(ResponseParserTest, SameEventsAtEverySplitPoint) {
  const std::string all =
      "HTTP/1.1 100 Continue\r\n\r\n"
      "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nX: a\r\n b\r\n\r\n"
      "4;e=1\r\nWiki\r\n5\r\npedia\r\n0\r\nT: 1\r\n\r\n"
      "HTTP/1.1 304 Not Modified\r\nETag: \"x\"\r\n\r\n"
      "HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\nrest of the stream";
  ResponseParser first;
  const std::vector<std::string> expected = Feed(first, Whole(all), true);
  ASSERT_EQ(expected.size(), 10u);
  EXPECT_EQ(expected.at(3), "body:Wikipedia");
  EXPECT_EQ(expected.at(8), "body:rest of the stream");
  EXPECT_EQ(expected.at(9), "complete");
  for (std::size_t i = 0; i <= all.size(); ++i) {
    ResponseParser p;
    EXPECT_EQ(Feed(p, {all.substr(0, i), all.substr(i)}, true), expected) << "split at " << i;
  }
  ResponseParser p;
  EXPECT_EQ(Feed(p, Bytewise(all), true), expected);
}

TEST(ResponseParserTest, CacheHeadCarriesTheDerivedFields) {
  ResponseParser p;
  ASSERT_EQ(p.Parse("HTTP/1.1 200 OK\r\nContent-Length: 42\r\nETag: \"v1\"\r\n"
                    "Cache-Control: max-age=60\r\n\r\n")
                .type,
            EventType::kHead);
  const HttpResponseHead h = p.head().ToCacheHead();
  EXPECT_EQ(h.status, 200);
  EXPECT_EQ(h.content_length, 42u);
  EXPECT_EQ(h.etag, "\"v1\"");
  EXPECT_EQ(h.cache_control, "max-age=60");
}

// ---- Helpers ----

TEST(HeaderListTest, LooksUpNamesCaseInsensitively) {
  HeaderList h;
  h.Add("Accept", "a");
  h.Add("accept", "b");
  h.Add("Connection", "Keep-Alive, X-Foo");
  EXPECT_EQ(*h.Find("ACCEPT"), "a");
  EXPECT_EQ(h.Find("Host"), nullptr);
  EXPECT_EQ(h.FindAll("Accept"), "a, b");
  EXPECT_EQ(h.Count("accept"), 2u);
  EXPECT_TRUE(h.HasToken("connection", "x-foo"));
  EXPECT_FALSE(h.HasToken("Connection", "X"));
  EXPECT_EQ(h.Remove("Accept"), 2u);
  EXPECT_EQ(h.size(), 1u);
}

TEST(HeaderListTest, RemovesHopByHopFieldsAndThoseNamedInConnection) {
  HeaderList h;
  for (std::string_view name : kHopByHopHeaders) h.Add(std::string(name), "x");
  h.Add("connection", "X-Private, close");
  h.Add("x-private", "1");
  h.Add("Host", "h");
  h.Add("Accept", "*/*");
  h.Add("Te", "trailers");
  RemoveHopByHopHeaders(&h);
  EXPECT_EQ(Fields(h), "[Host=h|Accept=*/*]");
  EXPECT_TRUE(IsHopByHopHeader("proxy-authorization"));
  EXPECT_FALSE(IsHopByHopHeader("Authorization"));
}

TEST(UrlTest, SplitsHttpUrls) {
  struct Case {
    std::string_view url, host;
    int port;
    std::string_view path;
  };
  for (const Case& c : {
           Case{"http://example.com/a?b", "example.com", 80, "/a?b"},
           Case{"http://example.com", "example.com", 80, "/"},
           Case{"http://example.com?q=1", "example.com", 80, "/?q=1"},
           Case{"HTTP://EXAMPLE.com:8080/P", "example.com", 8080, "/P"},
           Case{"http://example.com:/x", "example.com", 80, "/x"},
           Case{"http://127.0.0.1:1/", "127.0.0.1", 1, "/"},
           Case{"http://[::1]:65535/x", "[::1]", 65535, "/x"},
           Case{"http://[2001:DB8::1]/", "[2001:db8::1]", 80, "/"},
       }) {
    Result<AbsoluteUrl> u = SplitAbsoluteUrl(c.url);
    ASSERT_TRUE(u.ok()) << c.url << ": " << u.status().ToString();
    EXPECT_EQ(u->scheme, "http");
    EXPECT_EQ(u->host, c.host) << c.url;
    EXPECT_EQ(u->port, c.port) << c.url;
    EXPECT_EQ(u->path, c.path) << c.url;
  }
  EXPECT_EQ(SplitAbsoluteUrl("http://h:80/").value().Authority(), "h");
  EXPECT_EQ(SplitAbsoluteUrl("http://h:81/").value().Authority(), "h:81");
}

TEST(UrlTest, RejectsOtherSchemesClearly) {
  Result<AbsoluteUrl> https = SplitAbsoluteUrl("https://example.com/");
  EXPECT_EQ(https.status().code(), Status::Code::kNotSupported);
  EXPECT_NE(https.status().message().find("CONNECT"), std::string::npos);
  Result<AbsoluteUrl> ftp = SplitAbsoluteUrl("ftp://example.com/file");
  EXPECT_EQ(ftp.status().code(), Status::Code::kNotSupported);
  EXPECT_NE(ftp.status().message().find("\"ftp\""), std::string::npos);
}

TEST(UrlTest, RejectsMalformedUrls) {
  for (std::string_view url : {
           "http://user:pass@example.com/",  // userinfo
           "http://@example.com/",           //
           "http://a@b@example.com/",        //
           "http://example.com@evil.com/",   //
           "http://example.com:0/",          // bad ports
           "http://example.com:65536/",      //
           "http://example.com:99999999999999999999/",
           "http://example.com:-1/",     //
           "http://example.com:8a/",     //
           "http://example.com/a#frag",  // fragment
           "http:example.com/",          // no //
           "http:///path",               // empty host
           "http://exa mple.com/",       //
           "http://exa%41mple.com/",     //
           "http://[::1/",               //
           "http://[zz]/",               //
           "http://[::1]x/",             //
           "http://h/\x01",              //
           "://h/",                      //
           "1http://h/",                 //
           "/just/a/path",               //
       }) {
    Result<AbsoluteUrl> u = SplitAbsoluteUrl(url);
    EXPECT_FALSE(u.ok()) << url;
    if (!u.ok()) {
      EXPECT_EQ(u.status().code(), Status::Code::kInvalidArgument) << url;
    }
  }
  EXPECT_NE(SplitAbsoluteUrl("http://u@h/").status().message().find("user information"),
            std::string::npos);
}

TEST(UrlTest, SplitsAuthorities) {
  Result<HostPort> hp = SplitAuthority("Example.com:443", true);
  ASSERT_TRUE(hp.ok());
  EXPECT_EQ(hp->host, "example.com");
  EXPECT_EQ(hp->port, 443);
  EXPECT_FALSE(SplitAuthority("example.com", true).ok());
  EXPECT_FALSE(SplitAuthority("example.com:", true).ok());
  EXPECT_EQ(SplitAuthority("example.com", false).value().port, 0);
  EXPECT_FALSE(SplitAuthority("", false).ok());
}

// ---- Serializers ----

TEST(SerializerTest, RequestHeadRoundTripsThroughTheParser) {
  RequestHead head;
  head.method = "POST";
  head.target = "/a?b=c";
  head.headers.Add("Host", "example.com");
  head.headers.Add("Content-Length", "3");
  std::string out = "prefix";
  ASSERT_TRUE(AppendRequestHead(head, &out).ok());
  EXPECT_EQ(out, "prefixPOST /a?b=c HTTP/1.1\r\nHost: example.com\r\nContent-Length: 3\r\n\r\n");
  out.erase(0, 6);
  out += "abc";
  EXPECT_EQ(ParseRequests(out),
            (std::vector<std::string>{
                "head POST /a?b=c origin 1.1 [Host=example.com|Content-Length=3] cl:3 ka",
                "body:abc", "complete"}));
}

TEST(SerializerTest, RefusesFieldsThatWouldBreakTheFraming) {
  RequestHead head;
  head.method = "GET";
  head.target = "/";
  head.headers.Add("X", "a\r\nInjected: 1");
  std::string out = "keep";
  EXPECT_EQ(AppendRequestHead(head, &out).code(), Status::Code::kInvalidArgument);
  EXPECT_EQ(out, "keep");
  head.headers[0] = {"Bad Name", "v"};
  EXPECT_FALSE(AppendRequestHead(head, &out).ok());
  head.headers.clear();
  head.target = "/a b";
  EXPECT_FALSE(AppendRequestHead(head, &out).ok());
  head.target = "/";
  head.method = "G T";
  EXPECT_FALSE(AppendRequestHead(head, &out).ok());
  EXPECT_EQ(out, "keep");

  ResponseHead resp;
  resp.status = 200;
  resp.reason = "OK\r\nX: y";
  EXPECT_FALSE(AppendResponseHead(resp, &out).ok());
  EXPECT_EQ(out, "keep");
  HeaderList trailers;
  trailers.Add("T", "\n");
  EXPECT_FALSE(AppendLastChunk(trailers, &out).ok());
  EXPECT_EQ(out, "keep");
}

TEST(SerializerTest, ResponseHeadAndChunksRoundTripThroughTheParser) {
  ResponseHead head;
  head.status = 404;  // reason left empty: the standard one is sent
  head.headers.Add("Transfer-Encoding", "chunked");
  std::string out;
  ASSERT_TRUE(AppendResponseHead(head, &out).ok());
  EXPECT_EQ(out, "HTTP/1.1 404 Not Found\r\nTransfer-Encoding: chunked\r\n\r\n");
  AppendChunk("hello ", &out);
  AppendChunk("", &out);  // nothing: an empty chunk would end the body
  AppendChunk(std::string(300, 'x'), &out);
  HeaderList trailers;
  trailers.Add("Digest", "d");
  ASSERT_TRUE(AppendLastChunk(trailers, &out).ok());
  EXPECT_NE(out.find("\r\n12c\r\nxxx"), std::string::npos);
  EXPECT_EQ(
      ParseResponses(out),
      (std::vector<std::string>{"head 1.1 404 Not Found [Transfer-Encoding=chunked] chunked ka",
                                "body:hello " + std::string(300, 'x'), "complete [Digest=d]"}));
}

TEST(SerializerTest, ChunkHeadersAreLowerCaseHex) {
  std::string out;
  AppendChunkHeader(1, &out);
  AppendChunkHeader(255, &out);
  AppendChunkHeader(4096, &out);
  AppendChunkHeader(~Bytes{0}, &out);
  EXPECT_EQ(out, "1\r\nff\r\n1000\r\nffffffffffffffff\r\n");
}

TEST(ErrorTest, StatusesAndReasons) {
  EXPECT_EQ(HttpStatusFor(ParseErrorCode::kStartLineTooLong), 414);
  EXPECT_EQ(HttpStatusFor(ParseErrorCode::kHeadersTooLarge), 431);
  EXPECT_EQ(HttpStatusFor(ParseErrorCode::kTooManyHeaders), 431);
  EXPECT_EQ(HttpStatusFor(ParseErrorCode::kUnsupportedTransferCoding), 501);
  EXPECT_EQ(HttpStatusFor(ParseErrorCode::kVersionNotSupported), 505);
  EXPECT_EQ(HttpStatusFor(ParseErrorCode::kConflictingFraming), 400);
  EXPECT_EQ(ReasonPhrase(431), "Request Header Fields Too Large");
  EXPECT_EQ(ReasonPhrase(299), "Unknown");
}

}  // namespace
}  // namespace ghost::http1
