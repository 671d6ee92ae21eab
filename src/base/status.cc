#include "tessera/status.h"

namespace tessera {

std::string_view StatusCodeName(StatusCode code) {
  switch (code) {
    case StatusCode::kOk:
      return "ok";
    case StatusCode::kInvalidArgument:
      return "invalid argument";
    case StatusCode::kNotFound:
      return "not found";
    case StatusCode::kOutOfRange:
      return "out of range";
    case StatusCode::kIoError:
      return "i/o error";
    case StatusCode::kOutOfBlocks:
      return "out of blocks";
    case StatusCode::kFailedPrecondition:
      return "failed precondition";
    case StatusCode::kDataLoss:
      return "data loss";
    case StatusCode::kInternal:
      return "internal";
  }
  return "unknown";
}

std::string Status::ToString() const {
  if (ok()) return "ok";
  std::string out = field_.empty() ? message_ : field_ + ": " + message_;
  // One line, always: a message must never smuggle a newline into the CLI's error line.
  for (char& c : out) {
    if (c == '\n' || c == '\r') c = ' ';
  }
  return out;
}

}  // namespace tessera
