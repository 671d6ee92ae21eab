#include "test_support.h"

#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace tessera::testing {

Geometry Preset(const std::string& name) {
  Result<Geometry> g = LoadPreset(name);
  EXPECT_TRUE(g.ok()) << g.status().ToString();
  return g.ok() ? *g : Geometry{};
}

Geometry FromJson(const std::string& json) {
  Result<Geometry> g = GeometryFromConfigJson(json, "test-config");
  EXPECT_TRUE(g.ok()) << g.status().ToString();
  return g.ok() ? *g : Geometry{};
}

Geometry SeedFixture() {
  Result<Geometry> g = LoadConfigFile(std::string(TESSERA_TEST_DATA) + "/seed-fixture.json");
  EXPECT_TRUE(g.ok()) << g.status().ToString();
  return g.ok() ? *g : Geometry{};
}

Ledger MustLedger(const Geometry& g, const LedgerOptions& options) {
  Result<Ledger> l = ComputeLedger(g, options);
  EXPECT_TRUE(l.ok()) << l.status().ToString();
  return l.ok() ? *l : Ledger{};
}

LedgerOptions Context(uint64_t tokens, const std::string& kv_format, Engine engine) {
  LedgerOptions o;
  o.context_tokens = tokens;
  o.kv_format = kv_format;
  o.engine = engine;
  return o;
}

TempDir::TempDir() {
  std::string tmpl = (std::filesystem::temp_directory_path() / "tessera-test-XXXXXX").string();
  char* made = ::mkdtemp(tmpl.data());
  EXPECT_NE(made, nullptr);
  path_ = tmpl;
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

std::string TempDir::Write(const std::string& name, const std::string& contents) const {
  std::string p = path_ + "/" + name;
  std::ofstream(p, std::ios::binary) << contents;
  return p;
}

CommandResult RunTessera(const std::string& args) {
  TempDir dir;
  std::string out = dir.path() + "/stdout", err = dir.path() + "/stderr";
  std::string cmd = std::string(TESSERA_BINARY) + " " + args + " >" + out + " 2>" + err + " </dev/null";
  int status = std::system(cmd.c_str());
  CommandResult r;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  std::ifstream o(out), e(err);
  std::stringstream so, se;
  so << o.rdbuf();
  se << e.rdbuf();
  r.out = so.str();
  r.err = se.str();
  return r;
}

}  // namespace tessera::testing
