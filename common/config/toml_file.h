// Reading a TOML configuration file, for ghostfs's config (config.h) and ghostproxy's
// (proxy/proxy_config.h): the file parsed whole, and "FILE:LINE" for messages about a node.
#ifndef GHOST_COMMON_CONFIG_TOML_FILE_H_
#define GHOST_COMMON_CONFIG_TOML_FILE_H_

#include <toml++/toml.h>

#include <string>

#include "common/base/status.h"
#include "common/base/units.h"

namespace ghost {

// The table in `path`: kNotFound when it cannot be opened, kInvalidArgument with FILE:LINE and
// the parser's description when it is not TOML.
[[nodiscard]] Result<toml::table> ParseTomlFile(const std::string& path);

// A size value: a non-negative integer (bytes) or a string ParseSize reads ("64M", "1GiB").
// kInvalidArgument naming `key` otherwise; the caller adds where the node is.
[[nodiscard]] Result<Bytes> TomlSize(const toml::node& n, const std::string& key);

// "PATH:LINE" of a node (just PATH when the parser gave no line), to begin a message.
std::string TomlWhere(const std::string& path, const toml::source_region& r);

}  // namespace ghost

#endif  // GHOST_COMMON_CONFIG_TOML_FILE_H_
