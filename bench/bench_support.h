// Shared by the benchmark programs.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <string>

namespace tessera::bench {

// A fresh directory for a benchmark's files: $TESSERA_BENCH_DIR (default: the working
// directory) / tessera-bench-<name>, emptied first.
inline std::string BenchDir(const char* name) {
  const char* base = std::getenv("TESSERA_BENCH_DIR");
  std::string dir = std::string(base != nullptr ? base : ".") + "/tessera-bench-" + name;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

}  // namespace tessera::bench
