// SGLang's sizing rules, pinned to what SGLang's own pool, allocator and scheduler code gives for
// one request (provenance below): FlashMLA pages of 64 (or --block-tokens), a page of one token for
// MHA, DeepSeek-V4's compressed caches on 256-token full pages and its window on 256-token SWA
// pages freed late, admission by PrefillAdder's gate, decode after the first decode step.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tessera/ledger.h"
#include "test_support.h"

namespace tessera {
namespace {

using testing::Context;
using testing::MustLedger;
using testing::Preset;

// Ground truth from SGLang's own code, run for one request per case (not read): the files of
// github.com/modal-projects/sglang at 8905cbd42f4a27dbecad6487cd3904278756fef8 (2026-07-20, a
// fork tracking upstream sgl-project/sglang main through #31837), run with Debian's python3 outside
// this repository. Pools under a shapes-only torch stand-in (tensors carry shape and dtype size):
// python/sglang/srt/mem_cache/memory_pool.py (MLATokenToKVPool, DSATokenToKVPool with
// kv_cache_dim from kv_cache_configurator.calculate_mla_kv_cache_dim, flashmla_sparse/flashmla_kv
// backends), deepseek_v4_memory_pool.py (DeepSeekV4TokenToKVPool, page_size = swa_page_size = 256
// as _build_dsv4_kv_pool passes them, no speculative decoding, offline C128 state) and
// deepseek_v4_compress_state.py; bytes per page = the layers' buffer rows of one page
// (get_contiguous_buf_infos's kv_item_lens), the DSA/V4 indexer's page row, and per DeepSeek-V4 SWA
// page its C4 state rows (CompressStatePool.translate_from_swa_loc_to_state_loc: ring_size rows
// per SWA page, 8 x (8,192 + 2,048) B per C4 layer).
//
// The allocators and the admission gate under real torch on CPU, other modules stubbed:
// mem_cache/allocator/{paged,token,swa}.py (the Triton kernels replaced by paged.py's own
// alloc_extend_naive, decode as a one-token extend; get_num_new_pages from utils/common.py),
// managers/schedule_policy.py (PrefillAdder.add_one_req with nothing evictable and the request's
// max_new_tokens = 128, SamplingParams' default; admission = the fewest free pages it admits
// with, checked: one fewer page refuses) and mem_cache/common.py
// (free_swa_out_of_window_slots with a chunk cache, called as ScheduleBatch.maybe_evict_swa does
// with the overlap scheduler on: before extend k >= 2 at prefix - chunked_prefill_size; not at the
// first decode step). One request: prefill in chunks of chunked_prefill_size (page-floored), then
// one decode step; pages held = pool pages minus available pages.
//
// Page counts depend only on the page size, the prompt and the chunk; bytes are pages x the pool's
// bytes per page. Not run, so not pinned: speculative decoding (SGLang's draft worker keeps a pool
// of its own; the ledger's draft slots and doubled compressor rings are unchecked), the radix
// cache (it keeps the earlier SWA pages as evictable cache), the CUTLASS/TRTLLM MLA pages, V4 with
// pages other than 256 (SGLang asserts 256), V4 on NPU/ROCm.
constexpr uint64_t kV3Bf16Page64 = 4497408;    // MLATokenToKVPool bf16, 61 layers x 64 x 1,152
constexpr uint64_t kV3Bf16Page1 = 70272;       // page_size 1
constexpr uint64_t kV3Fp8Page64 = 2248704;     // fp8_e4m3 (mla-fp8), 61 x 64 x 576
constexpr uint64_t kV3Fp8Page1 = 35136;        // page_size 1
constexpr uint64_t kV32Fp8Page64 = 3076352;    // DSATokenToKVPool fp8: 61 x 64 x 656 + indexer 61 x 8,448
constexpr uint64_t kV32Bf16Page64 = 5012736;   // DSATokenToKVPool bf16: 61 x 64 x 1,152 + indexer 61 x 8,448
constexpr uint64_t kV4ProFullPage = 1430208;   // C4 30 x 37,440 + C128 31 x 1,728 + indexer 30 x 8,448
constexpr uint64_t kV4ProSwaPage = 11592960;   // SWA 61 x 149,760 + C4 state 30 x 8 x 10,240
constexpr uint64_t kV4ProRing = 16252928;      // C128 state ring: 31 x 128 x 4,096
constexpr uint64_t kV4FlashFullPage = 998208;  // C4 21 x 37,440 + C128 20 x 1,728 + indexer 21 x 8,448
constexpr uint64_t kV4FlashSwaPage = 8160000;  // SWA 43 x 149,760 + C4 state 21 x 8 x 10,240
constexpr uint64_t kV4FlashRing = 10485760;    // C128 state ring: 20 x 128 x 4,096

struct DensePages {
  uint64_t n, admission, peak, decode;
};
// page_size 64 and 1; the same at chunks 2,048 and 8,192.
const DensePages kPage64[] = {
    {1024, 20, 16, 17}, {8192, 132, 128, 129}, {131072, 2052, 2048, 2049}, {1048576, 16388, 16384, 16385}};
const DensePages kPage1[] = {{1024, 1154, 1024, 1025},
                             {8192, 8322, 8192, 8193},
                             {131072, 131202, 131072, 131073},
                             {1048576, 1048706, 1048576, 1048577}};

TEST(EngineSglang, DensePhasesEqualSglangsOwnAllocator) {
  struct Case {
    const char* model;
    const char* format;
    uint64_t page, page_bytes;
  };
  const Case cases[] = {
      {"deepseek-v3", "mla-bf16", 64, kV3Bf16Page64},     {"deepseek-v3", "mla-bf16", 1, kV3Bf16Page1},
      {"deepseek-v3", "mla-fp8", 64, kV3Fp8Page64},       {"deepseek-v3", "mla-fp8", 1, kV3Fp8Page1},
      {"deepseek-v3.2", "fp8_ds_mla", 64, kV32Fp8Page64}, {"deepseek-v3.2", "mla-bf16", 64, kV32Bf16Page64},
  };
  size_t checked = 0;
  for (const Case& c : cases) {
    for (const DensePages& t : c.page == 64 ? std::vector<DensePages>(std::begin(kPage64), std::end(kPage64))
                                            : std::vector<DensePages>(std::begin(kPage1), std::end(kPage1))) {
      for (uint64_t chunk : {2048, 8192}) {
        SCOPED_TRACE(std::string(c.model) + " " + c.format + " page " + std::to_string(c.page) + " n " +
                     std::to_string(t.n) + " chunk " + std::to_string(chunk));
        LedgerOptions o = Context(t.n, c.format, Engine::kSglang);
        o.block_tokens = c.page;
        o.prefill_chunk_tokens = chunk;
        Ledger l = MustLedger(Preset(c.model), o);
        ASSERT_EQ(l.phases.size(), 3u);
        EXPECT_EQ(l.phases[0].bytes, t.admission * c.page_bytes);
        EXPECT_EQ(l.reserved_at_admission_bytes, l.phases[0].bytes);
        EXPECT_EQ(l.phases[1].bytes, t.peak * c.page_bytes);
        EXPECT_EQ(l.phases[2].bytes, t.decode * c.page_bytes);
        EXPECT_EQ(l.committed_bytes, l.phases[2].bytes);
        ++checked;
      }
    }
  }
  EXPECT_EQ(checked, 48u);
}

// DeepSeek-V4 (SWATokenToKVPoolAllocator, page 256, window 128): {full pages, SWA pages} at
// admission (each the fewest that admits with the other pool ample; the pair admits, one fewer of
// either refuses), after the prefill chunk holding the most bytes, after the first decode step.
// The same pages for V4-Pro and V4-Flash.
struct V4Pages {
  uint64_t n, chunk;
  uint64_t admission[2], peak[2], decode[2];
};
const V4Pages kV4[] = {
    {1024, 2048, {6, 3}, {4, 4}, {5, 5}},
    {1024, 8192, {6, 3}, {4, 4}, {5, 5}},
    {1024, 16384, {6, 3}, {4, 4}, {5, 5}},
    {8192, 2048, {34, 3}, {32, 17}, {33, 18}},
    {8192, 8192, {34, 3}, {32, 32}, {33, 33}},
    {8192, 16384, {34, 3}, {32, 32}, {33, 33}},
    {131072, 2048, {514, 3}, {512, 17}, {513, 18}},
    {131072, 8192, {514, 3}, {512, 65}, {513, 66}},
    {131072, 16384, {514, 3}, {512, 129}, {513, 130}},
    {1048576, 2048, {4098, 3}, {4096, 17}, {4097, 18}},
    {1048576, 8192, {4098, 3}, {4096, 65}, {4097, 66}},
    {1048576, 16384, {4098, 3}, {4096, 129}, {4097, 130}},
    // chunks that are not a multiple of the page: PrefillAdder floors the chunk to pages, the
    // overlap eviction still steps back by chunked_prefill_size.
    {1000, 1000, {6, 3}, {4, 4}, {4, 4}},
    {5000, 1000, {22, 3}, {18, 8}, {20, 7}},
    {5000, 3000, {22, 3}, {20, 20}, {20, 20}},
    {20000, 1000, {80, 3}, {78, 8}, {79, 6}},
    {20000, 3000, {80, 3}, {77, 24}, {79, 15}},
};

TEST(EngineSglang, V4PhasesEqualSglangsOwnAllocator) {
  struct Model {
    const char* name;
    uint64_t full, swa, ring;
  };
  const Model models[] = {{"deepseek-v4-pro", kV4ProFullPage, kV4ProSwaPage, kV4ProRing},
                          {"deepseek-v4-flash", kV4FlashFullPage, kV4FlashSwaPage, kV4FlashRing}};
  size_t checked = 0;
  for (const Model& m : models) {
    for (const V4Pages& t : kV4) {
      SCOPED_TRACE(std::string(m.name) + " n " + std::to_string(t.n) + " chunk " + std::to_string(t.chunk));
      LedgerOptions o = Context(t.n, "", Engine::kSglang);
      o.prefill_chunk_tokens = t.chunk;
      Ledger l = MustLedger(Preset(m.name), o);
      ASSERT_EQ(l.phases.size(), 3u);
      auto bytes = [&](const uint64_t pages[2]) { return pages[0] * m.full + pages[1] * m.swa + m.ring; };
      EXPECT_EQ(l.phases[0].bytes, bytes(t.admission));
      EXPECT_EQ(l.phases[1].bytes, bytes(t.peak));
      EXPECT_EQ(l.phases[2].bytes, bytes(t.decode));
      EXPECT_EQ(l.committed_bytes, l.phases[2].bytes);
      ++checked;
    }
  }
  EXPECT_EQ(checked, 34u);
}

// The pools' pages (DeepSeekV4SingleKVPool.create_buffer: ceil(P x 584 / 576) x 576;
// DeepSeekV4IndexerPool: P x 132, unpadded), P = 256 / ratio entries, the SWA page 256 tokens.
TEST(EngineSglang, V4Pages) {
  Ledger l = MustLedger(Preset("deepseek-v4-pro"), Context(1048576, "", Engine::kSglang));
  EXPECT_EQ(l.FindLine("csa.compressed")->page.page_bytes, 37440u);
  EXPECT_EQ(l.FindLine("hca.compressed")->page.page_bytes, 1728u);
  EXPECT_EQ(l.FindLine("csa.indexer")->page.page_bytes, 8448u);   // not padded
  EXPECT_EQ(l.FindLine("csa.window")->page.page_bytes, 149760u);  // 256-token pages padded to 576
  EXPECT_FALSE(l.FindLine("csa.compressor_state")->in_pages);
  EXPECT_FALSE(l.FindLine("hca.compressor_state")->in_pages);
}

// By hand, DeepSeek-V4-Pro at 2^20 tokens, chunk 8,192 (128 chunks): before the last chunk
// (k = 127) SGLang has freed the window pages wholly before 127 x 8,192 - 8,192 - 128 = 1,032,064
// tokens, 4,031 pages (1,031,936 tokens); after the first decode step it holds 4,097 full pages and
// 4,097 - 4,031 = 66 SWA pages: 66 x 61 layers x 149,760 + C4 state 66 x 30 x 8 x 10,240 + full
// pages 4,097 x 1,430,208 + C128 ring 31 x 128 x 4,096. The window's records are the 16,640
// tokens not yet freed, the rest of its last page rounding.
TEST(EngineSglang, V4DecodeByHand) {
  LedgerOptions o = Context(1048576, "", Engine::kSglang);
  Ledger l = MustLedger(Preset("deepseek-v4-pro"), o);
  const uint64_t swa = 66ULL * 61 * 149760 + 66ULL * 30 * 8 * 10240;
  EXPECT_EQ(l.committed_bytes, swa + 4097ULL * 1430208 + 31ULL * 128 * 4096);
  const CacheLine* w = l.FindLine("csa.window");
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(w->committed_bytes, 66ULL * 30 * 149760);
  uint64_t records = 0;
  for (const Term& t : w->terms) {
    if (t.term == LedgerTerm::kRecords) records = t.bytes;
  }
  EXPECT_EQ(records, 16640ULL * 30 * 584);
  EXPECT_EQ(l.block_id_bytes, 0u);
  EXPECT_EQ(l.TermBytes(LedgerTerm::kUniformBlockPadding), 0u);
}

TEST(EngineSglang, MhaPageOfOneToken) {
  Ledger l = MustLedger(Preset("llama-3.1-8b"), Context(100, "", Engine::kSglang));
  EXPECT_EQ(l.block_tokens, 1u);
  // After the first decode step: the 100 tokens' records and the sampled token's slot.
  EXPECT_EQ(l.committed_bytes, l.requested_bytes / 100 * 101);
  EXPECT_EQ(l.committed_bytes - l.requested_bytes, l.TermBytes(LedgerTerm::kPageRounding));
}

TEST(EngineSglang, DeepSeekV3FlashMlaPages) {
  Ledger l = MustLedger(Preset("deepseek-v3"), Context(100, "fp8_ds_mla", Engine::kSglang));
  EXPECT_EQ(l.block_tokens, 64u);
  EXPECT_EQ(l.lines[0].page.page_bytes, 64u * 656);
  EXPECT_EQ(l.committed_bytes, 61ULL * 2 * 64 * 656);
  EXPECT_EQ(l.TermBytes(LedgerTerm::kBlockMetadata), 0u);
}

}  // namespace
}  // namespace tessera
