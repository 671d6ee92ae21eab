// Shared by the benchmark programs.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <string>

namespace tessera::bench {

// A fresh directory for a benchmark's files: $TESSERA_BENCH_DIR (default: the system's temporary
// directory) / tessera-bench-<name>, emptied first. Never the working directory: a run from the
// source tree must not leave files there to be committed.
inline std::string BenchDir(const char* name) {
  const char* base = std::getenv("TESSERA_BENCH_DIR");
  std::string dir = (base != nullptr ? std::string(base) : std::filesystem::temp_directory_path().string()) +
                    "/tessera-bench-" + name;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

}  // namespace tessera::bench
