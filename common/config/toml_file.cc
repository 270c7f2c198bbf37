#include "common/config/toml_file.h"

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

std::string TomlWhere(const std::string& path, const toml::source_region& r) {
  return path + (r.begin.line > 0 ? ":" + std::to_string(r.begin.line) : "");
}

}  // namespace ghost
