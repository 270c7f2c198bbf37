// The mount(8) form of ghostfs's command line, so that an fstab line works.
//
// For a line of type fuse.ghostfs, mount(8) runs mount.fuse3, which runs
//   ghostfs SOURCE MOUNTPOINT -o OPTIONS
// with the fstab options in one comma-separated list: ghostfs's own settings (cache=DIR,
// origin=NAME=URL, profile=..., config=FILE, ...) mixed with the standard mount options (rw,
// nodev, nosuid, noauto, _netdev, ...). RewriteMountArgs turns that form into ghostfs's own
// command line before it is parsed, so there is one parser and one set of meanings:
//   - SOURCE: a config file when it contains a '/' (as --config), else a label (ignored);
//   - an -o entry KEY=VALUE whose KEY names a ghostfs option (kMountOptionKeys) becomes
//     --KEY VALUE ('_' in KEY read as '-'); the flags no_passthrough and no_ghost_hints become
//     --no-passthrough and --no-ghost-hints;
//   - entries meant for mount(8) and not for the file system (auto, noauto, user, users,
//     nouser, owner, group, _netdev, nofail, defaults, comment=..., x-...) are dropped;
//   - everything else stays in -o and goes to libfuse (rw, ro, nodev, nosuid, allow_other, ...).
// An argv with one positional argument (the ordinary form) is returned unchanged apart from
// the -o entries. Reentrant: no state.
#pragma once

#include <string>
#include <vector>

namespace ghost {

// Returns the arguments (argv[0] included) in ghostfs's own form: ghost settings first, then
// one -o with the libfuse options, then MOUNTPOINT. The options of the ordinary form that take
// a value are named in `value_options` ("--cache", ...) so that their values are not mistaken
// for positional arguments. An -o entry cannot contain a comma (a URL with one needs config=).
std::vector<std::string> RewriteMountArgs(const std::vector<std::string>& args,
                                          const std::vector<std::string>& value_options);

// A message for the first argument (after argv[0], before a "--") that looks like a long
// option ("--name" or "--name=value") but names none of `known` ("--origin", ...), with the
// closest known name when one is near ("unknown option --orgin (did you mean --origin?)");
// empty when every option is known. Checked before parsing, so a misspelt option is blamed
// alone (the parser would also blame the arguments it then could not place).
std::string UnknownLongOption(const std::vector<std::string>& args, const std::vector<std::string>& known);

}  // namespace ghost
