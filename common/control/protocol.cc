#include "common/control/protocol.h"

#include <openssl/evp.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>

namespace ghost {
namespace {

using nlohmann::json;

Status Bad(std::string message) { return Status::InvalidArgument(std::move(message)); }

std::string JoinNames(const auto& names) {
  std::string out;
  for (std::string_view n : names) {
    if (!out.empty()) out += ", ";
    out += n;
  }
  return out;
}

// The member `key` of object `r`, or null when it is absent or null.
const json* Field(const json& r, const char* key) {
  auto it = r.find(key);
  return it == r.end() || it->is_null() ? nullptr : &*it;
}

const std::string* NonEmptyString(const json& r, const char* key) {
  const json* v = Field(r, key);
  if (v == nullptr || !v->is_string() || v->get_ref<const std::string&>().empty()) return nullptr;
  return &v->get_ref<const std::string&>();
}

// An integer member in [lo, hi]: nullopt when absent or anything else. Unsigned integers above
// INT64_MAX are refused rather than wrapped.
std::optional<std::int64_t> IntegerIn(const json* v, std::int64_t lo, std::int64_t hi) {
  if (v == nullptr || !v->is_number_integer()) return std::nullopt;
  std::int64_t n = 0;
  if (v->is_number_unsigned()) {
    std::uint64_t u = v->get<std::uint64_t>();
    if (u > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) return std::nullopt;
    n = static_cast<std::int64_t>(u);
  } else {
    n = v->get<std::int64_t>();
  }
  if (n < lo || n > hi) return std::nullopt;
  return n;
}

// A non-negative integer (parsed JSON holds those as unsigned; json built in a program may hold
// them as signed).
std::optional<std::uint64_t> Unsigned(const json* v) {
  if (v == nullptr || !v->is_number_integer()) return std::nullopt;
  if (v->is_number_unsigned()) return v->get<std::uint64_t>();
  std::int64_t n = v->get<std::int64_t>();
  if (n < 0) return std::nullopt;
  return static_cast<std::uint64_t>(n);
}

// A number in 0..max, default 0 when absent; nullopt for anything else.
std::optional<double> NonNegative(const json& r, const char* key, double max) {
  const json* v = Field(r, key);
  if (v == nullptr) return 0.0;
  if (!v->is_number()) return std::nullopt;
  double d = v->get<double>();
  if (!std::isfinite(d) || d < 0 || d > max) return std::nullopt;
  return d;
}

std::string Base64(std::string_view bytes) {
  std::string out(4 * ((bytes.size() + 2) / 3) + 1, '\0');
  int n = EVP_EncodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                          reinterpret_cast<const unsigned char*>(bytes.data()),
                          static_cast<int>(bytes.size()));
  out.resize(static_cast<std::size_t>(n));
  return out;
}

// nullopt unless `text` is padded base64.
std::optional<std::string> FromBase64(std::string_view text) {
  if (text.size() % 4 != 0) return std::nullopt;
  // EVP_DecodeBlock skips surrounding white space and takes '=' anywhere: only the alphabet,
  // with at most two '=' at the end, is base64 here.
  std::size_t end = text.size();
  for (int i = 0; i < 2 && end > 0 && text[end - 1] == '='; ++i) --end;
  for (std::size_t i = 0; i < end; ++i) {
    const char c = text[i];
    const bool alphabet = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
                          c == '+' || c == '/';
    if (!alphabet) return std::nullopt;
  }
  std::string out(text.size() / 4 * 3, '\0');
  int n = EVP_DecodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                          reinterpret_cast<const unsigned char*>(text.data()),
                          static_cast<int>(text.size()));
  if (n < 0) return std::nullopt;
  std::size_t pad = 0;  // EVP_DecodeBlock counts the padding as zero bytes
  for (std::size_t i = text.size(); i > 0 && pad < 2 && text[i - 1] == '='; --i) ++pad;
  out.resize(static_cast<std::size_t>(n) - pad);
  return out;
}


Result<ControlArgs> NoArguments(const json&) { return ControlArgs(NoArgs{}); }

Result<ControlArgs> ParseStatus(const json& r) {
  const std::string* path = NonEmptyString(r, "path");
  if (path == nullptr) {
    return Bad("needs \"path\", the file's path, e.g. "
               "{\"id\":1,\"op\":\"status\",\"path\":\"/mnt/ghost/web/index.html\"}");
  }
  return ControlArgs(StatusArgs{*path});
}

Result<ControlArgs> ParseHint(const json& r) {
  static constexpr std::array<std::pair<std::string_view, HintKind>, 4> kKinds = {{
      {"ghost", HintKind::kGhost},
      {"transfer_begin", HintKind::kTransferBegin},
      {"transfer_end", HintKind::kTransferEnd},
      {"background", HintKind::kBackground},
  }};
  HintArgs out;
  const json* kind = Field(r, "kind");
  auto k = std::find_if(kKinds.begin(), kKinds.end(), [&](const auto& e) {
    return kind != nullptr && kind->is_string() && kind->get_ref<const std::string&>() == e.first;
  });
  if (k == kKinds.end()) {
    std::vector<std::string_view> names;
    for (const auto& e : kKinds) names.push_back(e.first);
    return Bad("needs \"kind\": one of " + JoinNames(names));
  }
  out.kind = k->second;
  if (const std::string* name = NonEmptyString(r, "device")) {
    out.device = *name;
  } else if (auto id = IntegerIn(Field(r, "device"), 0, std::numeric_limits<int>::max())) {
    out.device = *id;
  } else {
    return Bad("needs \"device\": a device name (see devices) or id");
  }
  std::optional<double> t = NonNegative(r, "time_s", kMaxHintSeconds);
  std::optional<double> e = NonNegative(r, "energy_j", kMaxHintJoules);
  if (!t) return Bad("\"time_s\" must be a number of seconds in 0..3.15e7 (a year)");
  if (!e) return Bad("\"energy_j\" must be a number of joules in 0..1e9");
  out.time_s = *t;
  out.energy_j = *e;
  return ControlArgs(out);
}

Result<ControlArgs> ParseKnob(const json& r) {
  KnobArgs out;
  const json* v = Field(r, "value");
  if (v == nullptr) return ControlArgs(out);
  if (!v->is_number_integer()) {
    return Bad("\"value\" must be an integer in " + std::to_string(kKnobMin) + ".." +
               std::to_string(kKnobMax));
  }
  std::optional<std::int64_t> k = IntegerIn(v, kKnobMin, kKnobMax);
  if (!k) {
    return Bad(v->dump() + " is outside " + std::to_string(kKnobMin) + ".." +
               std::to_string(kKnobMax));
  }
  out.value = static_cast<int>(*k);
  return ControlArgs(out);
}

Result<ControlArgs> ParseSubscribe(const json& r) {
  SubscribeArgs out;
  const json* topics = Field(r, "topics");
  bool good = topics != nullptr && topics->is_array() && !topics->empty();
  if (good) {
    for (const json& t : *topics) {
      good = good && t.is_string() &&
             std::find(kControlTopics.begin(), kControlTopics.end(),
                       t.get_ref<const std::string&>()) != kControlTopics.end();
      if (good) out.topics.push_back(t.get<std::string>());
    }
  }
  if (!good) return Bad("needs \"topics\": a list of " + JoinNames(kControlTopics));
  return ControlArgs(out);
}

Result<ControlArgs> ParseObject(const json& r) {
  ObjectArgs out;
  const std::string* key = NonEmptyString(r, "key");
  if (key == nullptr) return Bad("needs \"key\", a non-empty string (the cache key)");
  out.key = *key;
  for (auto [field, slot] : {std::pair{"response", &out.response}, std::pair{"etag", &out.etag},
                             std::pair{"last_modified", &out.last_modified},
                             std::pair{"content_type", &out.content_type}}) {
    auto it = r.find(field);
    if (it == r.end()) continue;
    if (!it->is_string()) return Bad(std::string("\"") + field + "\" must be a string");
    *slot = it->get<std::string>();
  }
  if (auto x = r.find("expires_unix"); x != r.end()) {
    if (x->is_null()) {
      out.expires_unix = std::optional<std::int64_t>();
    } else if (auto n = IntegerIn(&*x, -kMaxUnixSeconds, kMaxUnixSeconds)) {
      out.expires_unix = n;
    } else {
      return Bad("\"expires_unix\" must be an integer (Unix seconds, at most 1e11) or null");
    }
  }
  return ControlArgs(out);
}

// lookup: ParseObject's fields and "begin_transfer" (protocol.h).
Result<ControlArgs> ParseLookup(const json& r) {
  Result<ControlArgs> parsed = ParseObject(r);
  if (!parsed.ok()) return parsed;
  if (const json* b = Field(r, "begin_transfer")) {
    if (!b->is_boolean()) return Bad("\"begin_transfer\" must be true or false");
    std::get<ObjectArgs>(*parsed).begin_transfer = b->get<bool>();
  }
  return parsed;
}

// store: ParseObject's fields, and the body inline (protocol.h). The text's length is checked
// before it is decoded, so an over-long body costs no decoding.
Result<ControlArgs> ParseStore(const json& r) {
  Result<ControlArgs> parsed = ParseObject(r);
  if (!parsed.ok()) return parsed;
  const json* b = Field(r, "body_base64");
  if (b == nullptr) {
    if (Field(r, "transfer_end") != nullptr || Field(r, "transfer_bytes") != nullptr) {
      return Bad("\"transfer_end\" comes only with an inline body (\"body_base64\"); end the "
                 "transfer of a fill file with transfer {\"phase\":\"end\"}");
    }
    return parsed;
  }
  static constexpr std::size_t kMaxText = 4 * ((kMaxInlineStoreBytes + 2) / 3);
  if (!b->is_string()) return Bad("\"body_base64\" must be a string (the body in padded base64)");
  const std::string& text = b->get_ref<const std::string&>();
  auto too_long = [] {
    return Bad("\"body_base64\" holds more than " + std::to_string(kMaxInlineStoreBytes) +
               " bytes: write a larger body to the fill file (a store without it)");
  };
  if (text.size() > kMaxText) return too_long();
  std::optional<std::string> body = FromBase64(text);
  if (!body) return Bad("\"body_base64\" is not padded base64");
  if (body->size() > kMaxInlineStoreBytes) return too_long();  // the last group's few bytes
  ObjectArgs& args = std::get<ObjectArgs>(*parsed);
  args.body = std::move(body);
  if (const json* t = Field(r, "transfer_end")) {
    std::optional<std::uint64_t> id = Unsigned(t);
    if (!id) return Bad("\"transfer_end\" must be the number transfer \"begin\" returned");
    args.transfer_end = id;
  }
  if (const json* n = Field(r, "transfer_bytes")) {
    std::optional<std::uint64_t> bytes = Unsigned(n);
    if (!bytes || *bytes > kMaxTransferBytes) return Bad("\"transfer_bytes\" must be a byte count up to 2^40");
    if (!args.transfer_end) return Bad("\"transfer_bytes\" needs \"transfer_end\"");
    args.transfer_bytes = bytes;
  }
  return parsed;
}

Result<ControlArgs> ParseTransfer(const json& r) {
  TransferArgs out;
  const json* phase = Field(r, "phase");
  std::string p = phase != nullptr && phase->is_string() ? phase->get<std::string>() : "";
  if (p == "begin") {
    out.phase = TransferPhase::kBegin;
    return ControlArgs(out);
  }
  if (p == "data") {
    out.phase = TransferPhase::kData;
  } else if (p == "end") {
    out.phase = TransferPhase::kEnd;
  } else {
    return Bad("\"phase\" must be begin, data or end");
  }
  std::optional<std::uint64_t> id = Unsigned(Field(r, "transfer"));
  if (!id) return Bad("needs \"transfer\", the number \"begin\" returned");
  out.transfer = *id;
  if (out.phase == TransferPhase::kData) {
    std::optional<std::uint64_t> bytes = Unsigned(Field(r, "bytes"));
    if (!bytes || *bytes > kMaxTransferBytes) return Bad("needs \"bytes\", a byte count up to 2^40");
    out.bytes = *bytes;
    if (const json* up = Field(r, "upload")) {
      if (!up->is_boolean()) return Bad("\"upload\" must be true or false");
      out.upload = up->get<bool>();
    }
  } else if (const json* b = Field(r, "bytes")) {
    std::optional<std::uint64_t> bytes = Unsigned(b);
    if (!bytes || *bytes > kMaxTransferBytes) return Bad("\"bytes\" must be a byte count up to 2^40");
    out.end_bytes = bytes;
  }
  return ControlArgs(out);
}

Result<ControlArgs> ParseNap(const json& r) {
  NapArgs out;
  const json* phase = Field(r, "phase");
  std::string p = phase != nullptr && phase->is_string() ? phase->get<std::string>() : "";
  if (p == "end") {
    out.begin = false;
    return ControlArgs(out);
  }
  if (p != "begin") return Bad("\"phase\" must be begin or end");
  std::optional<double> due = NonNegative(r, "due_in_s", kMaxNapSeconds);
  std::optional<double> rtt = NonNegative(r, "min_rtt_s", kMaxNapSeconds);
  std::optional<double> lead = NonNegative(r, "wake_lead_s", kMaxNapSeconds);
  if (!due || *due <= 0) return Bad("needs \"due_in_s\", seconds in (0, 60] until the next burst");
  if (!rtt || *rtt <= 0) return Bad("needs \"min_rtt_s\", the path's minimum RTT in (0, 60] s");
  if (!lead) return Bad("\"wake_lead_s\" must be a number of seconds in 0..60");
  out.due_in_s = *due;
  out.min_rtt_s = *rtt;
  out.wake_lead_s = *lead;
  return ControlArgs(out);
}

Result<ControlArgs> ParseServed(const json& r) {
  ServedArgs out;
  const json* memory = Field(r, "memory");
  bool good = memory != nullptr && memory->is_object();
  if (good) {
    for (const auto& [key, n] : memory->items()) {
      std::optional<std::uint64_t> reads = Unsigned(&n);
      good = good && !key.empty() && reads && *reads >= 1 && *reads <= kMaxServedReads;
      if (good) out.memory.emplace_back(key, *reads);
    }
  }
  if (!good) return Bad("needs \"memory\": an object of cache keys and read counts in 1..1000000");
  if (const json* bytes = Field(r, "bytes")) {
    std::optional<std::uint64_t> b = Unsigned(bytes);
    if (!b || *b > kMaxTransferBytes) return Bad("\"bytes\" must be an integer in 0..2^40");
    out.bytes = *b;
  }
  return ControlArgs(out);
}

// The one table of ops: name and argument check, indexed by ControlOp.
struct OpSpec {
  ControlOp op;
  std::string_view name;
  Result<ControlArgs> (*parse)(const json& request);
};
constexpr std::array<OpSpec, kControlOpCount> kOps = {{
    {ControlOp::kStatus, "status", &ParseStatus},
    {ControlOp::kHint, "hint", &ParseHint},
    {ControlOp::kKnob, "knob", &ParseKnob},
    {ControlOp::kDevices, "devices", &NoArguments},
    {ControlOp::kStats, "stats", &NoArguments},
    {ControlOp::kFlush, "flush", &NoArguments},
    {ControlOp::kDropCaches, "drop_caches", &NoArguments},
    {ControlOp::kSubscribe, "subscribe", &ParseSubscribe},
    {ControlOp::kLookup, "lookup", &ParseLookup},
    {ControlOp::kStore, "store", &ParseStore},
    {ControlOp::kRefresh, "refresh", &ParseObject},
    {ControlOp::kInvalidate, "invalidate", &ParseObject},
    {ControlOp::kTransfer, "transfer", &ParseTransfer},
    {ControlOp::kServed, "served", &ParseServed},
    {ControlOp::kSync, "sync", &NoArguments},
    {ControlOp::kNap, "nap", &ParseNap},
}};

constexpr bool TableInEnumOrder() {
  for (std::size_t i = 0; i < kOps.size(); ++i) {
    if (static_cast<std::size_t>(kOps[i].op) != i) return false;
  }
  return true;
}
static_assert(TableInEnumOrder(), "kOps must list the ops in ControlOp's order");

const OpSpec& Spec(ControlOp op) { return kOps[static_cast<std::size_t>(op)]; }

// Reading results: a present field of the wrong type is an error, a missing one keeps the
// default.
template <typename T>
bool Read(const json& j, const char* key, T* out) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return true;
  if constexpr (std::is_same_v<T, bool>) {
    if (!it->is_boolean()) return false;
  } else if constexpr (std::is_same_v<T, std::string>) {
    if (!it->is_string()) return false;
  } else if constexpr (std::is_same_v<T, std::uint64_t>) {
    std::optional<std::uint64_t> n = Unsigned(&*it);
    if (!n) return false;
    *out = *n;
    return true;
  } else {
    static_assert(std::is_same_v<T, std::int64_t>);
    if (!it->is_number_integer()) return false;
    if (it->is_number_unsigned() && it->get<std::uint64_t>() >
                                        static_cast<std::uint64_t>(INT64_MAX))
      return false;
  }
  *out = it->get<T>();
  return true;
}

}  // namespace

const std::array<ControlOp, kControlOpCount>& AllControlOps() {
  static const std::array<ControlOp, kControlOpCount> all = [] {
    std::array<ControlOp, kControlOpCount> a{};
    for (std::size_t i = 0; i < kOps.size(); ++i) a[i] = kOps[i].op;
    return a;
  }();
  return all;
}

std::string_view ControlOpName(ControlOp op) { return Spec(op).name; }

std::optional<ControlOp> ParseControlOp(std::string_view name) {
  for (const OpSpec& s : kOps) {
    if (s.name == name) return s.op;
  }
  return std::nullopt;
}

std::string ControlOpList() {
  std::vector<std::string_view> names;
  for (const OpSpec& s : kOps) names.push_back(s.name);
  return JoinNames(names);
}

Result<int> ParseKnobText(std::string_view text) {
  int k = -1;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), k);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size() || k < kKnobMin ||
      k > kKnobMax) {
    return Bad("\"" + std::string(text) + "\" is not a knob value in " + std::to_string(kKnobMin) +
               ".." + std::to_string(kKnobMax) + " (0 saves energy, 100 performance)");
  }
  return k;
}

Result<ControlArgs> ParseControlArgs(ControlOp op, const json& request) {
  if (!request.is_object()) return Bad("a request is a JSON object");
  return Spec(op).parse(request);
}

json KnobResult::ToJson() const {
  json out = {{"knob", knob}};
  if (previous) out["previous"] = *previous;
  return out;
}

Result<KnobResult> KnobResult::FromJson(const json& j) {
  if (!j.is_object()) return Bad("the knob result is not an object");
  KnobResult out;
  std::optional<std::int64_t> k = IntegerIn(Field(j, "knob"), kKnobMin, kKnobMax);
  if (!k) return Bad("the knob result has no \"knob\" in 0..100");
  out.knob = static_cast<int>(*k);
  if (const json* p = Field(j, "previous")) {
    std::optional<std::int64_t> prev = IntegerIn(p, kKnobMin, kKnobMax);
    if (!prev) return Bad("the knob result's \"previous\" is not in 0..100");
    out.previous = static_cast<int>(*prev);
  }
  return out;
}


json LookupResult::ToJson() const {
  if (!cached) {
    json miss = {{"cached", false}};
    if (transfer) miss["transfer"] = *transfer;
    if (card) miss["card"] = *card;
    return miss;
  }
  json out = {{"cached", true},
              {"path", path},
              {"version", version},
              {"etag", etag},
              {"last_modified", last_modified},
              {"content_type", content_type},
              {"expires_unix", expires_unix ? json(*expires_unix) : json()},
              {"size", size},
              {"response", response},
              {"choice", choice == LookupChoice::kNetwork ? "network" : "disk"},
              {"source", source},
              {"ghost_hint", ghost_hint}};
  if (!cost.is_null()) out["cost"] = cost;
  if (!body_path.empty()) out["body_path"] = body_path;
  if (packed_body) out["body_base64"] = Base64(*packed_body);
  return out;
}

namespace {

std::string DumpReplaced(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

// `s` as nlohmann::json dumps a string (ensure_ascii off, invalid UTF-8 replaced): ASCII is
// escaped here as nlohmann escapes it; a string with any other byte goes through nlohmann.
void AppendJsonString(std::string_view s, std::string* out) {
  for (const char ch : s) {
    if (static_cast<unsigned char>(ch) >= 0x80) {
      *out += DumpReplaced(json(std::string(s)));
      return;
    }
  }
  *out += '"';
  for (const char ch : s) {
    switch (ch) {
      case '"': *out += "\\\""; break;
      case '\\': *out += "\\\\"; break;
      case '\b': *out += "\\b"; break;
      case '\f': *out += "\\f"; break;
      case '\n': *out += "\\n"; break;
      case '\r': *out += "\\r"; break;
      case '\t': *out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(ch) < 0x20) {
          static constexpr char kHex[] = "0123456789abcdef";
          *out += "\\u00";
          *out += kHex[(ch >> 4) & 0xf];
          *out += kHex[ch & 0xf];
        } else {
          *out += ch;
        }
    }
  }
  *out += '"';
}

}  // namespace

std::string LookupResult::ToJsonText() const {
  if (!cached) return DumpReplaced(ToJson());
  std::string out;
  out.reserve(400 + path.size() + body_path.size() + response.size() * 5 / 4 +
              (packed_body ? packed_body->size() * 4 / 3 + 32 : 0));
  out += '{';
  bool first = true;
  auto member = [&](std::string_view name) {
    if (!first) out += ',';
    first = false;
    out += '"';
    out += name;
    out += "\":";
  };
  // The members in std::map's order, as ToJson() builds them.
  if (!body_path.empty()) {
    member("body_path");
    AppendJsonString(body_path, &out);
  }
  member("cached");
  out += "true";
  member("choice");
  out += choice == LookupChoice::kNetwork ? "\"network\"" : "\"disk\"";
  member("content_type");
  AppendJsonString(content_type, &out);
  if (!cost.is_null()) {
    member("cost");
    out += DumpReplaced(cost);
  }
  member("etag");
  AppendJsonString(etag, &out);
  member("expires_unix");
  out += expires_unix ? std::to_string(*expires_unix) : "null";
  member("ghost_hint");
  out += ghost_hint ? "true" : "false";
  member("last_modified");
  AppendJsonString(last_modified, &out);
  member("path");
  AppendJsonString(path, &out);
  member("response");
  AppendJsonString(response, &out);
  member("size");
  out += std::to_string(size);
  member("source");
  AppendJsonString(source, &out);
  member("version");
  AppendJsonString(version, &out);
  if (packed_body) {  // last, as DumpBodyLast writes it (base64 needs no escaping)
    member("body_base64");
    out += '"';
    out += Base64(*packed_body);
    out += '"';
  }
  out += '}';
  return out;
}

Result<LookupResult> LookupResult::FromJson(const json& j) {
  if (!j.is_object()) return Bad("the lookup result is not an object");
  LookupResult out;
  std::string choice = "disk";
  std::int64_t expires = 0;
  bool good = Read(j, "cached", &out.cached) && Read(j, "size", &out.size) &&
              Read(j, "response", &out.response) && Read(j, "choice", &choice) &&
              Read(j, "source", &out.source) && Read(j, "ghost_hint", &out.ghost_hint) &&
              Read(j, "etag", &out.etag) && Read(j, "last_modified", &out.last_modified) &&
              Read(j, "content_type", &out.content_type) && Read(j, "path", &out.path) &&
              Read(j, "body_path", &out.body_path) && Read(j, "version", &out.version) &&
              Read(j, "expires_unix", &expires);
  if (!good) return Bad("the lookup result has a field of the wrong type");
  if (choice != "disk" && choice != "network") return Bad("the lookup result's choice is " + choice);
  out.choice = choice == "network" ? LookupChoice::kNetwork : LookupChoice::kDisk;
  if (const json* c = Field(j, "cost")) out.cost = *c;
  if (const json* b = Field(j, "body_base64")) {
    std::optional<std::string> body = b->is_string() ? FromBase64(b->get<std::string>()) : std::nullopt;
    if (!body || body->size() != out.size) {
      return Bad("the lookup result's body_base64 is not base64 of its size's bytes");
    }
    out.packed_body = std::move(body);
  }
  if (const json* x = Field(j, "expires_unix")) {
    (void)x;
    out.expires_unix = expires;
  }
  if (const json* t = Field(j, "transfer")) {
    out.transfer = Unsigned(t);
    if (!out.transfer) return Bad("the lookup result's transfer is not a transfer id");
  }
  if (const json* c = Field(j, "card")) {
    if (!c->is_boolean()) return Bad("the lookup result's card is not true or false");
    out.card = c->get<bool>();
  }
  return out;
}

Result<std::string> StorePathFromJson(const json& result) {
  const std::string* path = result.is_object() ? NonEmptyString(result, "path") : nullptr;
  if (path == nullptr) return Status::Internal("store reply without a path");
  return *path;
}

Result<std::uint64_t> TransferIdFromJson(const json& result) {
  std::optional<std::uint64_t> id =
      result.is_object() ? Unsigned(Field(result, "transfer")) : std::nullopt;
  if (!id) return Status::Internal("no transfer id in the reply");
  return *id;
}

std::optional<bool> TransferCardFromJson(const json& result) {
  const json* c = result.is_object() ? Field(result, "card") : nullptr;
  if (c == nullptr || !c->is_boolean()) return std::nullopt;
  return c->get<bool>();
}

std::string EncodeBase64(std::string_view bytes) { return Base64(bytes); }

Result<std::string> ObjectsEventKey(const json& data) {
  const std::string* key = data.is_object() ? NonEmptyString(data, "key") : nullptr;
  if (key == nullptr) return Bad("an objects event without a key");
  return *key;
}

}  // namespace ghost
