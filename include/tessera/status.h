// Status and Result<T>: the error channel at every module boundary.
//
// A Status carries a code, the name of the input field it concerns (may be empty) and a
// one-line message. ToString() renders "field: message", which is what the CLI prints.
// No exceptions cross the library boundary; bindings convert a Status into one.
#pragma once

#include <cassert>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

namespace tessera {

enum class StatusCode {
  kOk = 0,
  // The caller passed a value that is wrong whatever the state (zero dims, bad format name,
  // malformed JSON). Fix the input.
  kInvalidArgument,
  // A named thing (preset, format, file) does not exist.
  kNotFound,
  // A value is well formed but its arithmetic would overflow or leave a supported range.
  kOutOfRange,
  // Reading or writing a file failed.
  kIoError,
  // A pool could not satisfy an allocation; nothing was changed.
  kOutOfBlocks,
  // The call is valid only in another state (e.g. sealing a block twice).
  kFailedPrecondition,
  // Stored bytes failed verification.
  kDataLoss,
  // A bug in Tessera.
  kInternal,
};

std::string_view StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string field, std::string message)
      : code_(code), field_(std::move(field)), message_(std::move(message)) {}

  static Status Ok() { return {}; }
  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& field() const { return field_; }
  const std::string& message() const { return message_; }
  // "field: message" (or just the message when no field applies); one line.
  std::string ToString() const;
  // The one explicit way to drop a Status on purpose; `(void)` is not used for this.
  void IgnoreError() const {}

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string field_;
  std::string message_;
};

inline Status InvalidArgument(std::string field, std::string message) {
  return {StatusCode::kInvalidArgument, std::move(field), std::move(message)};
}
inline Status NotFound(std::string field, std::string message) {
  return {StatusCode::kNotFound, std::move(field), std::move(message)};
}
inline Status OutOfRange(std::string field, std::string message) {
  return {StatusCode::kOutOfRange, std::move(field), std::move(message)};
}
inline Status IoError(std::string field, std::string message) {
  return {StatusCode::kIoError, std::move(field), std::move(message)};
}
inline Status OutOfBlocks(std::string field, std::string message) {
  return {StatusCode::kOutOfBlocks, std::move(field), std::move(message)};
}
inline Status FailedPrecondition(std::string field, std::string message) {
  return {StatusCode::kFailedPrecondition, std::move(field), std::move(message)};
}
inline Status DataLoss(std::string field, std::string message) {
  return {StatusCode::kDataLoss, std::move(field), std::move(message)};
}
inline Status Internal(std::string field, std::string message) {
  return {StatusCode::kInternal, std::move(field), std::move(message)};
}

// Either a value or a non-OK Status.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : value_(std::move(value)) {}         // NOLINT(google-explicit-constructor)
  Result(Status status) : status_(std::move(status)) {  // NOLINT(google-explicit-constructor)
    assert(!status_.ok() && "Result constructed from an OK status without a value");
  }

  bool ok() const { return value_.has_value(); }
  const Status& status() const { return status_; }
  // The one explicit way to drop a Result (its value and its Status) on purpose.
  void IgnoreError() const {}
  // REQUIRES: ok().
  const T& value() const& {
    assert(ok());
    return *value_;
  }
  T& value() & {
    assert(ok());
    return *value_;
  }
  T&& value() && {
    assert(ok());
    return std::move(*value_);
  }
  const T& operator*() const& { return value(); }
  T& operator*() & { return value(); }
  T&& operator*() && { return std::move(*this).value(); }
  const T* operator->() const { return &value(); }
  T* operator->() { return &value(); }

 private:
  std::optional<T> value_;
  Status status_;
};

}  // namespace tessera

// Propagate a non-OK Status from an expression returning Status.
#define TESSERA_RETURN_IF_ERROR(expr)          \
  do {                                         \
    ::tessera::Status tessera_st_ = (expr);    \
    if (!tessera_st_.ok()) return tessera_st_; \
  } while (0)

#define TESSERA_CONCAT_INNER(a, b) a##b
#define TESSERA_CONCAT(a, b) TESSERA_CONCAT_INNER(a, b)
// Declare `lhs` from a Result expression, or return its Status. `lhs` is a declaration
// ("uint64_t x"), so it cannot be parenthesized.
// NOLINTBEGIN(bugprone-macro-parentheses)
#define TESSERA_ASSIGN_OR_RETURN(lhs, expr)                                                                 \
  auto TESSERA_CONCAT(tessera_res_, __LINE__) = (expr);                                                     \
  if (!TESSERA_CONCAT(tessera_res_, __LINE__).ok()) return TESSERA_CONCAT(tessera_res_, __LINE__).status(); \
  lhs = std::move(TESSERA_CONCAT(tessera_res_, __LINE__)).value()
// NOLINTEND(bugprone-macro-parentheses)
