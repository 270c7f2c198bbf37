// libFuzzer target for the IMAP proxy's stream framing and recognizers (proxy/imap_wire.h).
// Built and run by tests/fuzz/fuzz.sh.
//
// The input is a byte stream from either side. It is framed twice, whole and in pieces whose
// sizes come from the input's first byte; both must give the same segments, literal bytes and
// error (what a socket delivers in pieces must not change what the proxy sees). Every segment
// goes to each recognizer. Checked: no crash, no sanitizer report; a segment never exceeds the
// line limit; literal bytes never exceed what was announced; FilterCapabilities leaves no
// COMPRESS= or STARTTLS in a capability line and is idempotent; a parsed UID STORE names only
// known UIDs, as does a parsed COPY (sorted); a parsed APPEND's literal is the one the segment
// announces; a FETCH FLAGS rewritten with other flags parses to them.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "proxy/imap_section.h"
#include "proxy/imap_wire.h"

namespace ghost::imapwire {
namespace {

void Check(bool ok, const char* what, std::string_view detail) {
  if (ok) return;
  std::fprintf(stderr, "imap_proxy_fuzz: %s\n%.*s\n", what, static_cast<int>(detail.size()),
               detail.data());
  std::abort();
}

constexpr Limits kLimits{512, 4096};

void Recognize(std::string_view seg) {
  if (std::optional<Command> c = ParseCommand(seg)) {
    std::string_view rest = c->rest;
    while (ReadAstring(&rest)) {
    }
    if (std::optional<BodyFetch> f = ParseBodyFetch(c->rest)) {
      // The section's name (as echoed in the answer) parses back to the same section.
      std::optional<Section> again = ParseSection(SectionName(f->section));
      Check(again && SectionName(*again) == SectionName(f->section) && again->part == f->section.part,
            "a section's name does not parse back to it", seg);
    }
    static const std::vector<std::uint32_t> kKnown = {1, 2, 3, 7, 4000000000u};
    if (std::optional<UidStore> st = ParseUidStore(c->rest, kKnown, 100)) {
      Check(!st->uids.empty() && st->uids.size() <= 100 && !st->flags.empty(),
            "a parsed UID STORE names no message, too many, or no flag", seg);
      for (std::uint32_t u : st->uids)
        Check(std::binary_search(kKnown.begin(), kKnown.end(), u), "a UID STORE names an unknown UID", seg);
    }
    for (bool by_uid : {false, true}) {
      if (std::optional<CopyCommand> cp = ParseCopy(c->rest, kKnown, by_uid, 100)) {
        Check(!cp->uids.empty() && cp->uids.size() <= 100 && std::is_sorted(cp->uids.begin(), cp->uids.end()),
              "a parsed COPY names no message, too many, or is unsorted", seg);
        for (std::uint32_t u : cp->uids)
          Check(std::binary_search(kKnown.begin(), kKnown.end(), u), "a COPY names an unknown message", seg);
      }
    }
    if (std::optional<AppendCommand> a = ParseAppend(c->rest)) {
      bool nonsync = false, bad = false;
      std::optional<std::uint64_t> n = AnnouncedLiteral(seg, &nonsync, &bad);
      Check(n && *n == a->size && nonsync == a->nonsync, "a parsed APPEND's literal is not the segment's", seg);
    }
  }
  if (std::optional<FetchFlags> ff = ParseFetchFlags(seg)) {
    // Rewriting the flags with the ones found gives the segment back; with others, a segment
    // that parses to them.
    Check(RewriteFlags(seg, *ff, ff->flags).size() <= seg.size(), "RewriteFlags grew an identical list", seg);
    std::string again = RewriteFlags(seg, *ff, {"\\Seen", "$Ghost"});
    std::optional<FetchFlags> ff2 = ParseFetchFlags(again);
    Check(ff2 && ff2->flags == std::vector<std::string>({"\\Seen", "$Ghost"}) && ff2->seq == ff->seq,
          "a rewritten FETCH FLAGS does not parse to the new flags", again);
  }
  (void)PlainPassword(seg);
  (void)ParseBodyPrefix(seg);
  (void)UntaggedNumber(seg, "EXISTS");
  (void)UidValidity(seg);
  (void)EsearchUids(seg, "ghostp1", 10000);
  (void)PlainUser(seg);
  std::string f = FilterCapabilities(seg);
  Check(FilterCapabilities(f) == f, "FilterCapabilities is not idempotent", seg);
  std::string upper = f;
  for (char& ch : upper) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  if (upper.starts_with("* CAPABILITY ")) {
    std::string_view caps = StripEol(upper).substr(13);
    while (!caps.empty()) {
      std::size_t sp = caps.find(' ');
      std::string_view w = caps.substr(0, sp);
      Check(!w.starts_with("COMPRESS=") && w != "STARTTLS",
            "a filtered capability line keeps COMPRESS or STARTTLS", f);
      if (sp == std::string_view::npos) break;
      caps.remove_prefix(sp + 1);
    }
  }
}

// The framing of `in` delivered in pieces of `piece` bytes: the structure (segments, literal
// ends, the error) and the literal bytes, as two comparable strings.
std::pair<std::string, std::string> Frame(std::string_view in, std::size_t piece, bool recognize) {
  Framer f(kLimits);
  std::string out, literals;
  std::size_t pos = 0;
  std::uint64_t literal_left = 0;
  for (int guard = 0; guard < 1'000'000; ++guard) {
    std::string_view chunk = in.substr(pos, std::min(piece, in.size() - pos));
    Event ev;
    std::size_t used = f.Next(chunk, &ev);
    Check(used <= chunk.size(), "consumed more than given", in);
    pos += used;
    switch (ev.kind) {
      case Event::Kind::kSegment:
        Check(ev.text.size() <= kLimits.max_line, "segment over the line limit", ev.text);
        out += ev.first ? "S+" : "S";
        out += ev.text;
        if (ev.literal) literal_left = *ev.literal;
        if (recognize) Recognize(ev.text);
        break;
      case Event::Kind::kLiteralData:
        Check(ev.text.size() <= literal_left, "literal bytes beyond the announced size", in);
        literal_left -= ev.text.size();
        literals += ev.text;
        break;
      case Event::Kind::kLiteralEnd:
        Check(literal_left == 0, "literal ended early", in);
        out += "E";
        break;
      case Event::Kind::kError:
        return {out + "X" + ev.error, literals};
      case Event::Kind::kNeedMore:
        if (pos >= in.size()) return {out, literals};
        break;
    }
  }
  Check(false, "the framer made no progress", in);
  return {out, literals};
}

}  // namespace
}  // namespace ghost::imapwire

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace ghost::imapwire;
  if (size == 0) return 0;
  std::size_t piece = 1 + data[0] % 17;
  std::string_view in(reinterpret_cast<const char*>(data) + 1, size - 1);
  auto whole = Frame(in, in.size() + 1, true);
  // The input as a cached message: every section the locator answers lies within it (or, for
  // HEADER.FIELDS, is made of its lines), and nothing crashes or loops.
  static const char* kSections[] = {"HEADER", "TEXT", "1", "2", "1.MIME", "2.1", "2.TEXT", "2.HEADER",
                                    "1.2.3", "HEADER.FIELDS (SUBJECT FROM)", "2.HEADER.FIELDS.NOT (TO)",
                                    "3.1.2.MIME"};
  for (const std::vector<std::uint32_t>& part : {std::vector<std::uint32_t>{1}, {2}, {2, 1}, {1, 2, 3}}) {
    bool literal8 = false;
    if (std::optional<std::string> got = ExtractBinary(in, part, &literal8)) {
      Check(got->size() <= in.size() && got->find('\0') == std::string::npos,
            "a decoded part is longer than the message or holds a NUL", in);
    }
  }
  for (const char* spec : kSections) {
    std::optional<Section> sec = ParseSection(spec);
    Check(sec.has_value(), "a fixed section does not parse", spec);
    if (std::optional<std::string> got = ExtractSection(in, *sec)) {
      bool fields = sec->text == Section::Text::kHeaderFields || sec->text == Section::Text::kHeaderFieldsNot;
      Check(fields ? got->size() <= in.size() + 2 : in.find(*got) != std::string_view::npos,
            "a section is not part of the message", spec);
    }
  }
  auto pieces = Frame(in, piece, false);
  Check(whole == pieces, "framing depends on how the bytes are split", in);
  return 0;
}
