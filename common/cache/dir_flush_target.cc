#include "common/cache/dir_flush_target.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <filesystem>

namespace ghost {

DirFlushTarget::DirFlushTarget(std::string root, int open_flags)
    : root_(std::move(root)), open_flags_(open_flags) {}

Result<std::string> DirFlushTarget::Resolve(const std::string& path) const {
  std::filesystem::path p(path);
  if (path.empty() || p.is_absolute()) {
    return Status::InvalidArgument("flash log record path \"" + path + "\" is not relative");
  }
  for (const auto& part : p) {
    if (part == "..") {
      return Status::InvalidArgument("flash log record path \"" + path + "\" leaves " + root_);
    }
  }
  return root_ + "/" + path;
}

Result<int> DirFlushTarget::OpenForFlush(LogRecordKind, const std::string& path) {
  Result<std::string> file = Resolve(path);
  if (!file.ok()) return file.status();
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(*file).parent_path(), ec);
  UniqueFd fd(open(file->c_str(), O_RDWR | O_CREAT | O_CLOEXEC | open_flags_, 0644));
  if (!fd.valid()) return Status::FromErrno(errno, "open " + *file + " to flush the flash log");
  int raw = fd.get();
  fds_[path] = std::move(fd);
  return raw;
}

Status DirFlushTarget::ApplyMeta(MetaOp op, const std::string& path, Bytes arg,
                                 const std::string& arg2) {
  Result<std::string> file = Resolve(path);
  if (!file.ok()) return file.status();
  const std::string& f = *file;
  switch (op) {
    case MetaOp::kNone:
    case MetaOp::kFill:  // a fill's commit: its bytes are in the file already
      return Status::Ok();
    case MetaOp::kTruncate:
      if (truncate(f.c_str(), static_cast<off_t>(arg)) != 0) {
        return Status::FromErrno(errno, "truncate " + f);
      }
      return Status::Ok();
    case MetaOp::kUnlink:
      if (unlink(f.c_str()) != 0 && errno != ENOENT) return Status::FromErrno(errno, "unlink " + f);
      return Status::Ok();
    case MetaOp::kRmdir:
      if (rmdir(f.c_str()) != 0 && errno != ENOENT) return Status::FromErrno(errno, "rmdir " + f);
      return Status::Ok();
    case MetaOp::kMkdir:
      if (mkdir(f.c_str(), static_cast<mode_t>(arg == 0 ? 0755 : arg)) != 0 && errno != EEXIST) {
        return Status::FromErrno(errno, "mkdir " + f);
      }
      return Status::Ok();
    case MetaOp::kChmod:
      if (chmod(f.c_str(), static_cast<mode_t>(arg)) != 0) return Status::FromErrno(errno, "chmod " + f);
      return Status::Ok();
    case MetaOp::kCreate: {
      UniqueFd fd(open(f.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC,
                       static_cast<mode_t>(arg == 0 ? 0644 : arg)));
      if (!fd.valid()) return Status::FromErrno(errno, "create " + f);
      return Status::Ok();
    }
    case MetaOp::kRename: {
      Result<std::string> to = Resolve(arg2);
      if (!to.ok()) return to.status();
      if (rename(f.c_str(), to->c_str()) != 0) {
        struct stat st;
        if (errno == ENOENT && stat(to->c_str(), &st) == 0) return Status::Ok();  // replayed
        return Status::FromErrno(errno, "rename " + f + " to " + *to);
      }
      return Status::Ok();
    }
  }
  return Status::InvalidArgument("unknown metadata operation in the flash log");
}

void DirFlushTarget::EndFlush() { fds_.clear(); }

}  // namespace ghost
