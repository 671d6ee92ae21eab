// A program built against the installed package (tests/install_consumer_test.sh): it computes a
// ledger and loads a shipped GPU spec (the embedded data), and checks the figures.
#include <cstdint>
#include <cstdio>

#include "tessera/geometry.h"
#include "tessera/gpu.h"
#include "tessera/ledger.h"

int main() {
  tessera::Result<tessera::Geometry> g = tessera::LoadPreset("deepseek-v3");
  if (!g.ok()) {
    std::fprintf(stderr, "LoadPreset: %s\n", g.status().ToString().c_str());
    return 1;
  }
  tessera::LedgerOptions o;
  o.context_tokens = 131072;
  o.kv_format = "mla-bf16";
  tessera::Result<tessera::Ledger> l = tessera::ComputeLedger(*g, o);
  if (!l.ok()) {
    std::fprintf(stderr, "ComputeLedger: %s\n", l.status().ToString().c_str());
    return 1;
  }
  // DeepSeek-V3: 61 layers, one bf16 record of kv_lora_rank 512 + rope 64 = 576 elements
  // (1,152 B) per token per layer.
  const uint64_t want = uint64_t{61} * 1152 * 131072;
  tessera::Result<tessera::GpuSpec> gpu = tessera::LoadGpu("H200-141G");
  if (!gpu.ok()) {
    std::fprintf(stderr, "LoadGpu: %s\n", gpu.status().ToString().c_str());
    return 1;
  }
  std::printf("deepseek-v3 mla-bf16 at 131072 tokens: requested %llu B (want %llu); H200 memory %llu B\n",
              static_cast<unsigned long long>(l->requested_bytes), static_cast<unsigned long long>(want),
              static_cast<unsigned long long>(gpu->memory_bytes));
  if (l->requested_bytes != want || gpu->memory_bytes != 141000000000ULL) return 1;
  return 0;
}
