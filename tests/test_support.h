// Shared helpers for the test suite.
#pragma once

#include <string>

#include "tessera/geometry.h"
#include "tessera/ledger.h"

namespace tessera::testing {

// Loads a preset or fails the test.
Geometry Preset(const std::string& name);
// Parses config text or fails the test.
Geometry FromJson(const std::string& json);
// The seed guide's fixture: 2 layers, 8 heads x 128, latent 512, rope 64.
Geometry SeedFixture();
// Computes a ledger or fails the test.
Ledger MustLedger(const Geometry& g, const LedgerOptions& options);
LedgerOptions Context(uint64_t tokens, const std::string& kv_format = "", Engine engine = Engine::kTessera);

// A fresh directory under the system temp dir, removed by the destructor.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string Write(const std::string& name, const std::string& contents) const;

 private:
  std::string path_;
};

struct CommandResult {
  int exit_code = -1;
  std::string out;
  std::string err;
};
// Runs the tessera binary with `args` (a shell-quoted string).
CommandResult RunTessera(const std::string& args);

}  // namespace tessera::testing
