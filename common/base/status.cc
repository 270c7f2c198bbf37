#include "common/base/status.h"

#include <cerrno>
#include <cstring>

namespace ghost {

Status Status::FromErrno(int err, const std::string& what) {
  Code code = Code::kIoError;
  switch (err) {
    case ENOENT: code = Code::kNotFound; break;
    case EINVAL: case ENAMETOOLONG: code = Code::kInvalidArgument; break;
    case EROFS: case EPERM: case EACCES: code = Code::kReadOnly; break;
    case EEXIST: code = Code::kExists; break;
    case ETIMEDOUT: code = Code::kTimedOut; break;
    case ENOTCONN: case ECONNREFUSED: case EHOSTUNREACH: case ENETUNREACH: code = Code::kUnavailable; break;
    case ENOTSUP: code = Code::kNotSupported; break;
    default: break;
  }
  Status s(code, what + ": " + std::strerror(err));
  s.errno_ = err;
  return s;
}

int Status::ToErrno() const {
  if (errno_ != 0) return errno_;
  switch (code_) {
    case Code::kOk: return 0;
    case Code::kInvalidArgument: return EINVAL;
    case Code::kNotFound: return ENOENT;
    case Code::kIoError: return EIO;
    case Code::kUnavailable: return ENOTCONN;
    case Code::kCorruption: return EIO;
    case Code::kTimedOut: return ETIMEDOUT;
    case Code::kReadOnly: return EROFS;
    case Code::kPermissionDenied: return EACCES;
    case Code::kExists: return EEXIST;
    case Code::kNotSupported: return ENOTSUP;
    case Code::kInternal: return EIO;
  }
  return EIO;
}

std::string Status::ToString() const {
  const char* name = "OK";
  switch (code_) {
    case Code::kOk: return "OK";
    case Code::kInvalidArgument: name = "invalid argument"; break;
    case Code::kNotFound: name = "not found"; break;
    case Code::kIoError: name = "I/O error"; break;
    case Code::kUnavailable: name = "unavailable"; break;
    case Code::kCorruption: name = "corruption"; break;
    case Code::kTimedOut: name = "timed out"; break;
    case Code::kReadOnly: name = "read-only"; break;
    case Code::kPermissionDenied: name = "permission denied"; break;
    case Code::kExists: name = "exists"; break;
    case Code::kNotSupported: name = "not supported"; break;
    case Code::kInternal: name = "internal error"; break;
  }
  return std::string(name) + ": " + message_;
}

}  // namespace ghost
