// libFuzzer target for the HTTP/1.1 message layer (proxy/http1.h). Built and run by
// tests/fuzz/fuzz.sh with clang's -fsanitize=fuzzer,address,undefined.
//
// Each input is fed, as plain bytes, to the request parser and to the response parser (as the
// answer to GET, HEAD and CONNECT), with the default limits and with tiny ones, and each time:
//   - whole, in two pieces split at a point taken from the input's hash, in pseudo-random
//     small pieces, and (for short inputs) one byte at a time: the event transcripts must be
//     identical (the parser's promise that splitting never changes the result);
//   - every Event must keep its contract (consumed within the input, body inside the consumed
//     prefix, kNeedMore consumes everything);
//   - every head that parses must serialize (Append*Head) and parse back to the same head.
// Any difference aborts, which libFuzzer reports as a crash. ASan/UBSan catch reads outside the
// input and undefined arithmetic.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "proxy/http1.h"

namespace ghost::http1 {
namespace {

[[noreturn]] void Die(const char* what, const std::string& detail) {
  std::fprintf(stderr, "http1_fuzz: %s\n%s\n", what, detail.c_str());
  std::abort();
}

void Check(bool ok, const char* what) {
  if (!ok) Die(what, "");
}

std::string Fields(const HeaderList& h) {
  std::string s;
  for (const HeaderField& f : h) s += f.name + "=" + f.value + "|";
  return s;
}

std::string Describe(const RequestHead& h) {
  return "req " + h.method + " " + h.target + " " +
         std::to_string(static_cast<int>(h.target_form)) + " 1." + std::to_string(h.version_minor) +
         " [" + Fields(h.headers) + "] " + std::to_string(static_cast<int>(h.framing)) + ":" +
         std::to_string(h.content_length) + (h.keep_alive ? " ka" : " close");
}

std::string Describe(const ResponseHead& h) {
  return "resp 1." + std::to_string(h.version_minor) + " " + std::to_string(h.status) + " " +
         h.reason + " [" + Fields(h.headers) + "] " + std::to_string(static_cast<int>(h.framing)) +
         ":" + std::to_string(h.content_length) + (h.keep_alive ? " ka" : " close");
}

// Limits small enough that fuzzed inputs reach every limit.
Limits TinyLimits() {
  Limits l;
  l.max_start_line = 48;
  l.max_header_bytes = 96;
  l.max_headers = 4;
  l.max_chunk_line = 16;
  l.max_trailer_bytes = 32;
  return l;
}

Limits HugeLimits() {
  Limits l;
  l.max_start_line = 1 << 20;
  l.max_header_bytes = 1 << 20;
  l.max_headers = 1 << 16;
  return l;
}

// Re-parses a serialized head and checks it reads back the same.
void RoundTrip(const RequestHead& head) {
  std::string wire;
  if (!AppendRequestHead(head, &wire).ok())
    Die("parsed request head does not serialize", Describe(head));
  RequestParser p(HugeLimits());
  const Event e = p.Parse(wire);
  if (e.type != EventType::kHead || e.consumed != wire.size() ||
      Describe(p.head()) != Describe(head)) {
    Die("request head does not round-trip",
        Describe(head) + "\n" + wire + "\n" + p.error().message);
  }
}

void RoundTrip(const ResponseHead& head, std::string_view method) {
  std::string wire;
  if (!AppendResponseHead(head, &wire).ok())
    Die("parsed response head does not serialize", Describe(head));
  ResponseParser p(HugeLimits());
  p.SetRequestMethod(method);
  const Event e = p.Parse(wire);
  ResponseHead expected = head;
  if (expected.reason.empty()) expected.reason = std::string(ReasonPhrase(head.status));
  if (e.type != EventType::kHead || e.consumed != wire.size() ||
      Describe(p.head()) != Describe(expected)) {
    Die("response head does not round-trip",
        Describe(head) + "\n" + wire + "\n" + p.error().message);
  }
  (void)head.ToCacheHead();
}

// Feeds `pieces` like a connection buffer (see tests/proxy/http1_test.cc, Run) and returns the
// transcript. `on_head` checks each head on the way.
template <typename Parser, typename OnHead>
std::string Run(Parser& p, const std::vector<std::string_view>& pieces, OnHead on_head) {
  std::string out;
  std::string buf;
  bool body_open = false;
  for (std::size_t k = 0; k < pieces.size(); ++k) {
    buf.append(pieces[k]);
    while (true) {
      const Event e = p.Parse(buf);
      Check(e.consumed <= buf.size(), "consumed more than the input");
      switch (e.type) {
        case EventType::kNeedMore:
          Check(e.consumed == buf.size(), "kNeedMore left bytes unconsumed");
          break;
        case EventType::kHead:
          out += "\n" + Describe(p.head());
          on_head(p.head());
          break;
        case EventType::kBody:
          Check(!e.body.empty(), "empty body event");
          Check(e.body.data() >= buf.data() &&
                    e.body.data() + e.body.size() <= buf.data() + e.consumed,
                "body outside the consumed input");
          if (!body_open) out += "\nbody:";
          out.append(e.body);
          break;
        case EventType::kMessageComplete:
          out += "\ncomplete " + Fields(p.trailers());
          break;
        case EventType::kTunnel: {
          Check(e.consumed == 0, "kTunnel consumed bytes");
          out += "\ntunnel:" + buf;
          for (std::size_t j = k + 1; j < pieces.size(); ++j) out.append(pieces[j]);
          return out;
        }
        case EventType::kEnd:
          Die("kEnd from Parse before Eof", out);
        case EventType::kError:
          Check(!p.error().ok() && p.error().http_status != 0 && !p.error().message.empty(),
                "kError without an error");
          return out + "\nerror " + std::to_string(static_cast<int>(p.error().code));
      }
      body_open = e.type == EventType::kBody || (body_open && e.type == EventType::kNeedMore);
      buf.erase(0, e.consumed);
      if (e.type == EventType::kNeedMore) break;
    }
  }
  const Event e = p.Eof();
  if (e.type == EventType::kError) {
    return out + "\nerror " + std::to_string(static_cast<int>(p.error().code));
  }
  return out + (e.type == EventType::kMessageComplete ? "\ncomplete-at-eof" : "\nend");
}

std::uint64_t Hash(std::string_view s) {
  std::uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

// The ways to cut `in` into pieces; the first is "whole".
std::vector<std::vector<std::string_view>> Splits(std::string_view in) {
  std::vector<std::vector<std::string_view>> splits;
  splits.push_back({in});
  std::uint64_t h = Hash(in);
  const std::size_t at = in.empty() ? 0 : h % (in.size() + 1);
  splits.push_back({in.substr(0, at), in.substr(at)});
  std::vector<std::string_view> random;
  for (std::size_t pos = 0; pos < in.size();) {
    h = h * 6364136223846793005ull + 1442695040888963407ull;
    const std::size_t n = 1 + (h >> 33) % 17;
    random.push_back(in.substr(pos, n));
    pos += n;
  }
  splits.push_back(random);
  if (in.size() <= 512) {
    std::vector<std::string_view> bytes;
    for (std::size_t i = 0; i < in.size(); ++i) bytes.push_back(in.substr(i, 1));
    splits.push_back(bytes);
  }
  return splits;
}

template <typename MakeParser, typename OnHead>
void CheckSplits(const std::vector<std::vector<std::string_view>>& splits, MakeParser make,
                 OnHead on_head, const char* what) {
  std::string expected;
  for (std::size_t i = 0; i < splits.size(); ++i) {
    auto p = make();
    if (i == 0) {
      expected = Run(*p, splits[i], on_head);
    } else {
      const std::string got = Run(*p, splits[i], [](const auto&) {});
      if (got != expected) {
        Die(what, "split " + std::to_string(i) + " gave:" + got + "\n---- whole gave:" + expected);
      }
    }
  }
}

}  // namespace
}  // namespace ghost::http1

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace ghost::http1;
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  const auto splits = Splits(in);

  for (const bool tiny : {false, true}) {
    const Limits limits = tiny ? TinyLimits() : Limits();
    CheckSplits(
        splits, [&] { return std::make_unique<RequestParser>(limits); },
        [](const RequestHead& h) {
          RoundTrip(h);
          if (h.target_form == TargetForm::kAbsolute) (void)SplitAbsoluteUrl(h.target);
          HeaderList copy = h.headers;
          RemoveHopByHopHeaders(&copy);
          for (const HeaderField& f : copy) {
            if (IsHopByHopHeader(f.name) || h.headers.HasToken("Connection", f.name)) {
              Die("hop-by-hop field survived", f.name);
            }
          }
        },
        "request transcript depends on the split");
    for (const char* method : {"GET", "HEAD", "CONNECT"}) {
      if (tiny && std::string_view(method) != "GET") continue;  // tiny limits: GET only
      CheckSplits(
          splits,
          [&] {
            auto p = std::make_unique<ResponseParser>(limits);
            p->SetRequestMethod(method);
            return p;
          },
          [method](const ResponseHead& h) { RoundTrip(h, method); },
          "response transcript depends on the split");
    }
  }
  return 0;
}
