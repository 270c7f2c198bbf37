// Status and Result<T>: how every fallible call in Ghost reports failure.
//
// A Status is OK or carries a code and a message that says what failed, on what, and what to
// do. errno enters through Status::FromErrno and leaves through Status::ToErrno, at the FUSE
// edge only (after leveldb's include/leveldb/status.h). Result<T> is a value or a Status
// (g++ 12 has no std::expected).
//
// Thread-safety: plain values.
#ifndef GHOST_COMMON_BASE_STATUS_H_
#define GHOST_COMMON_BASE_STATUS_H_

#include <cassert>
#include <optional>
#include <string>
#include <utility>
#include <variant>

namespace ghost {

class [[nodiscard]] Status {
 public:
  enum class Code {
    kOk = 0,
    kInvalidArgument,  // bad input from a user, a file or a peer
    kNotFound,
    kIoError,
    kUnavailable,      // a remote origin could not be reached
    kCorruption,
    kTimedOut,
    kReadOnly,
    kPermissionDenied,  // credentials refused (e.g. an IMAP LOGIN)
    kExists,
    kNotSupported,
    kInternal,
  };

  Status() = default;
  static Status Ok() { return Status(); }
  static Status InvalidArgument(std::string msg) { return Status(Code::kInvalidArgument, std::move(msg)); }
  static Status NotFound(std::string msg) { return Status(Code::kNotFound, std::move(msg)); }
  static Status IoError(std::string msg) { return Status(Code::kIoError, std::move(msg)); }
  static Status Unavailable(std::string msg) { return Status(Code::kUnavailable, std::move(msg)); }
  static Status Corruption(std::string msg) { return Status(Code::kCorruption, std::move(msg)); }
  static Status TimedOut(std::string msg) { return Status(Code::kTimedOut, std::move(msg)); }
  static Status ReadOnly(std::string msg) { return Status(Code::kReadOnly, std::move(msg)); }
  static Status PermissionDenied(std::string msg) { return Status(Code::kPermissionDenied, std::move(msg)); }
  static Status Exists(std::string msg) { return Status(Code::kExists, std::move(msg)); }
  static Status NotSupported(std::string msg) { return Status(Code::kNotSupported, std::move(msg)); }
  static Status Internal(std::string msg) { return Status(Code::kInternal, std::move(msg)); }

  // The one place errno becomes a Status; `what` names the operation and its object.
  static Status FromErrno(int err, const std::string& what);
  // The one place a Status becomes an errno (for FUSE replies); 0 for OK.
  int ToErrno() const;

  bool ok() const { return code_ == Code::kOk; }
  Code code() const { return code_; }
  const std::string& message() const { return message_; }
  // "invalid argument: <message>", or "OK".
  std::string ToString() const;

  // Returns this status with ToErrno() giving `err` (a failure only: an OK status is returned
  // unchanged). For failures whose errno is known beside their code (ECONNREFUSED).
  Status WithErrno(int err) const {
    Status s = *this;
    if (!ok()) s.errno_ = err;
    return s;
  }

  // Returns this status with `context` prepended to the message ("context: message").
  Status WithContext(const std::string& context) const {
    if (ok()) return *this;
    Status s(code_, context + ": " + message_);
    s.errno_ = errno_;  // the errno still describes the failure
    return s;
  }

 private:
  Status(Code code, std::string msg) : code_(code), message_(std::move(msg)) {}
  Code code_ = Code::kOk;
  std::string message_;
  int errno_ = 0;  // set by FromErrno so ToErrno gives the original back
};

template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}              // NOLINT: implicit by design
  Result(Status status) : v_(std::move(status)) {        // NOLINT: implicit by design
    assert(!std::get<Status>(v_).ok() && "Result built from an OK status has no value");
  }
  bool ok() const { return std::holds_alternative<T>(v_); }
  const T& value() const& { assert(ok()); return std::get<T>(v_); }
  T& value() & { assert(ok()); return std::get<T>(v_); }
  T&& value() && { assert(ok()); return std::get<T>(std::move(v_)); }
  const T& operator*() const& { return value(); }
  T& operator*() & { return value(); }
  const T* operator->() const { return &value(); }
  T* operator->() { return &value(); }
  Status status() const { return ok() ? Status::Ok() : std::get<Status>(v_); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace ghost

#endif  // GHOST_COMMON_BASE_STATUS_H_
