// Shared by the benchmark programs.
#pragma once

#include <benchmark/benchmark.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "tessera/status.h"

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

// A failing call fails the benchmark: false, and the state skipped with the Status, when `st` is
// not OK. In a timed loop it is one branch on a Status the call returns anyway; the caller
// breaks out of the loop (or returns, outside it) on false.
inline bool Check(benchmark::State& state, const Status& st) {
  if (st.ok()) return true;
  state.SkipWithError(st.ToString().c_str());
  return false;
}
template <typename T>
bool Check(benchmark::State& state, const Result<T>& r) {
  return Check(state, r.status());
}

// For a setup that has no benchmark state to fail (a shared fixture): a failed call ends the
// program with the Status and `what`, so no figure is reported from a broken setup.
inline void OrDie(const Status& st, const char* what) {
  if (st.ok()) return;
  std::fprintf(stderr, "%s: %s\n", what, st.ToString().c_str());
  std::abort();
}

}  // namespace tessera::bench
