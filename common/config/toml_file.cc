#include "common/config/toml_file.h"

#include "common/config/config.h"

#include <fstream>
#include <sstream>

namespace ghost {

Result<toml::table> ParseTomlFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return Status::NotFound(path + ": cannot open config file");
  std::stringstream ss;
  ss << in.rdbuf();
  try {
    return toml::parse(ss.str(), path);
  } catch (const toml::parse_error& e) {
    return Status::InvalidArgument(TomlWhere(path, e.source()) + ": " + std::string(e.description()));
  }
}

Result<Bytes> TomlSize(const toml::node& n, const std::string& key) {
  if (auto i = n.value<std::int64_t>(); i && n.is_integer()) {
    if (*i < 0) return Status::InvalidArgument("\"" + key + "\" must not be negative");
    return static_cast<Bytes>(*i);
  }
  if (auto s = n.value<std::string>()) return ParseSize(*s);
  return Status::InvalidArgument("\"" + key + "\" must be a size (bytes, or a string such as \"64M\")");
}

std::string TomlWhere(const std::string& path, const toml::source_region& r) {
  return path + (r.begin.line > 0 ? ":" + std::to_string(r.begin.line) : "");
}

}  // namespace ghost
