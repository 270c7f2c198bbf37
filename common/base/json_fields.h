// Reading the fields of JSON that was read back from a file (a journal, saved state, a log
// record's metadata) without trusting their types. nlohmann's value(), at() and get<>() throw
// type_error on a field of another type, which aborts a daemon that does not catch it; and
// get<> of an integer type casts a negative number or a float (undefined beyond the range)
// without a word. These return false instead, so the caller can say which file is damaged.
//
//   As(v, &out)        v of out's type (an integer in out's range): out set, true; else false,
//                      out untouched.
//   Get(j, key, &out)  j's field `key`: absent (or j no object) leaves out as it is (its
//                      default) and is true; present: As().
#ifndef GHOST_COMMON_BASE_JSON_FIELDS_H_
#define GHOST_COMMON_BASE_JSON_FIELDS_H_

#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace ghost::json_fields {

template <typename T>
  requires(std::is_unsigned_v<T> && !std::is_same_v<T, bool>)
inline bool As(const nlohmann::json& v, T* out) {
  if (!v.is_number_unsigned()) return false;  // a negative integer is number_integer
  const std::uint64_t x = v.get<std::uint64_t>();
  if (x > std::numeric_limits<T>::max()) return false;
  *out = static_cast<T>(x);
  return true;
}

inline bool As(const nlohmann::json& v, std::int64_t* out) {
  if (!v.is_number_integer()) return false;
  if (v.is_number_unsigned() && v.get<std::uint64_t>() > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
    return false;
  }
  *out = v.get<std::int64_t>();
  return true;
}

inline bool As(const nlohmann::json& v, std::string* out) {
  if (!v.is_string()) return false;
  *out = v.get<std::string>();
  return true;
}

inline bool As(const nlohmann::json& v, std::vector<std::string>* out) {
  if (!v.is_array()) return false;
  std::vector<std::string> r;
  r.reserve(v.size());
  for (const nlohmann::json& e : v) {
    if (!e.is_string()) return false;
    r.push_back(e.get<std::string>());
  }
  *out = std::move(r);
  return true;
}

template <typename T>
inline bool Get(const nlohmann::json& j, const char* key, T* out) {
  if (!j.is_object()) return true;
  auto it = j.find(key);
  if (it == j.end()) return true;
  return As(*it, out);
}

}  // namespace ghost::json_fields

#endif  // GHOST_COMMON_BASE_JSON_FIELDS_H_
