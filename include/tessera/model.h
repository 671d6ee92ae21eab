// The tiny DeepSeek-architecture models of ADR 0017 (tiny-mla: V3 shape; tiny-dsa: V3.2 with a
// lightning indexer): their config, seeded weights, the safetensors weight file, and a runner
// whose KV cache is a RequestManager (prefix cache, dedup, eviction and tiers in the loop).
//
// The forward is ADR 0017's, in fp32; attention is the reference decode of attention.h reading
// the manager's pages. A prompt is run token by token (each token's records are encoded, attended
// to, then appended), so a token's logits depend on earlier tokens only through page bytes: a
// run resumed from cached blocks gives bit-identical logits.
//
// Thread-safety: a TinyModel is immutable after Create and may be shared; a TinyRunner has a
// single owner.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tessera/attention.h"
#include "tessera/geometry.h"
#include "tessera/request_manager.h"
#include "tessera/status.h"

namespace tessera {

// What the forward needs beyond Geometry, read from the preset's config.json.
struct TinyConfig {
  std::string name;  // preset
  Geometry geometry;
  uint32_t layers = 0, hidden = 0, heads = 0, q_lora = 0, kv_lora = 0, nope = 0, rope = 0, v = 0;
  uint32_t vocab = 0, ffn = 0;
  uint32_t index_heads = 0, index_head_dim = 0, index_topk = 0;  // 0 without an indexer
  float rms_eps = 1e-6f;
  double rope_theta = 10000.0;
  bool has_indexer() const { return index_heads != 0; }
};

// The fields of a tiny preset's config.json that a tiny forward reads beyond its Geometry
// (tiny-mla and tiny-dsa here, tiny-v4 in v4_model.h), checked as both read them.
class TinyConfigFields {
 public:
  // Errors: kInvalidArgument on "config" when `text` is not a JSON object (`model` names it).
  static Result<TinyConfigFields> Parse(std::string_view model, std::string_view text);
  // A positive integer up to 2^20 (0 when absent and not `required`). Errors: kInvalidArgument on
  // `field`: "missing", or "must be a positive integer up to 2^20".
  Result<uint32_t> Count(const char* field, bool required = true) const;
  // A positive finite number. Errors: kInvalidArgument on `field`.
  Result<double> Number(const char* field) const;
  // Present and not null.
  bool Has(const char* field) const;

 private:
  struct Field {
    enum class Kind : uint8_t { kUnsigned, kNumber, kNull, kOther } kind = Kind::kOther;
    uint64_t count = 0;  // kUnsigned
    double number = 0;   // kUnsigned, kNumber
  };
  std::map<std::string, Field, std::less<>> fields_;
};

// y = W x with W [y.size(), x.size()] row-major, each row summed in index order (the order the
// oracle's products are checked against: ADR 0017).
void MatVec(std::span<const float> w, std::span<const float> x, std::span<float> y);

// The tiny presets ("tiny-mla", "tiny-dsa"). Errors: kNotFound on "model" for any other name;
// kInvalidArgument naming the config field the forward cannot run with (e.g. "rope_scaling",
// "index_head_dim" not 128, "qk_rope_head_dim" odd, a model_type other than deepseek_v3/_v32).
Result<TinyConfig> LoadTinyConfig(std::string_view model);
std::vector<std::string> TinyModelNames();

struct TensorSpec {
  std::string name;
  std::vector<uint64_t> shape;
  uint64_t elements() const;  // UINT64_MAX when the product leaves 64 bits
};
// Every tensor of the weight file, in generation and file order (ADR 0017).
std::vector<TensorSpec> WeightSpecs(const TinyConfig& c);

struct Weights {
  std::string model;
  uint64_t seed = 0;
  std::map<std::string, std::vector<float>, std::less<>> tensors;
  // REQUIRES: a name of WeightSpecs (checked by Generate/Read).
  const std::vector<float>& at(std::string_view name) const { return tensors.find(name)->second; }
};

// SplitMix64 from `seed`, one stream over WeightSpecs order (ADR 0017).
Weights GenerateWeights(const TinyConfig& c, uint64_t seed);

// The safetensors bytes of `w` (header JSON with __metadata__, then the F32 data in spec order).
Result<std::string> SerializeWeights(const TinyConfig& c, const Weights& w);
// Writes atomically (WriteFilesAtomically); errors on "out".
Status WriteWeightsFile(const std::string& path, const TinyConfig& c, const Weights& w);
// Parses and validates: the header length within the file, valid JSON, __metadata__ naming this
// model and format, every tensor of WeightSpecs present with dtype F32 and its shape, no other
// tensor, data offsets in order and tiling the data exactly, the file exactly that long, every
// value finite. Errors are kInvalidArgument on "weights" with the tensor or field in the message.
Result<Weights> ParseWeights(std::string_view bytes, const TinyConfig& c);
Result<Weights> ReadWeightsFile(const std::string& path, const TinyConfig& c);

// The weight file of any tiny model (tiny-v4 too): safetensors, every tensor F32 little-endian in
// `specs` order, __metadata__ {model, seed, format "tessera-tiny-v1"}. Parse validates what
// ParseWeights documents, against `model` and `specs`; errors on "weights" naming the tensor.
Result<std::string> SerializeWeightFile(std::string_view model, std::span<const TensorSpec> specs, const Weights& w);
Result<Weights> ParseWeightFile(std::string_view bytes, std::string_view model, std::span<const TensorSpec> specs);
Status WriteWeightFile(const std::string& path, std::string_view model, std::span<const TensorSpec> specs,
                       const Weights& w);
Result<Weights> ReadWeightFile(const std::string& path, std::string_view model, std::span<const TensorSpec> specs);
// The next draw of ADR 0017's weight stream: SplitMix64 advances `state`; u = (z >> 40 + 0.5) /
// 2^24 * 2 - 1, in (-1, 1), in double (the caller scales it and rounds to float once).
double NextWeightDraw(uint64_t& state);

// Page formats the tiny models run with (the record formats the cache writer encodes).
// Errors: kInvalidArgument on "kv-format" for any other format name.
Status CheckTinyKvFormat(std::string_view kv_format);

struct RunOptions {
  std::string kv_format = "mla-bf16";
  AttentionForm form = AttentionForm::kAbsorbed;
  uint32_t capacity_blocks = 64;
  std::optional<uint64_t> block_tokens;  // unset: the layout's choice (64)
};

// One generation: logits[i] are the logits at position prompt_len - 1 + i; tokens holds the
// prompt, then the generated tokens (tokens[prompt_len + i] = argmax logits[i], lowest id on a
// tie). `steps` tokens are generated; the last one is not fed.
struct Generation {
  std::vector<uint32_t> tokens;
  uint64_t prompt_len = 0;
  std::vector<std::vector<float>> logits;
  uint64_t cached_tokens = 0;  // prompt tokens served from the cache (pool or block source)
  uint32_t tier_blocks = 0;
  AttentionCounters counters;    // every attention call of the run
  AttentionCounters last_token;  // the last token's attention calls (all layers)
  // Models with an indexer: the positions each computed position attended, per layer
  // (selected[p][l], ascending); prompt positions served from the cache are empty.
  std::vector<std::vector<std::vector<uint64_t>>> selected;
};

// A model bound to a request manager it owns.
class TinyRunner {
 public:
  static Result<std::unique_ptr<TinyRunner>> Create(TinyConfig config, Weights weights, const RunOptions& options);
  ~TinyRunner();

  RequestManager& manager() { return *manager_; }
  const TinyConfig& config() const { return config_; }

  // Admits `prompt` (prefix-cache and block-source hits included), computes the prompt's uncached
  // tokens and `steps` decode tokens. The request is kept (request()) until the next Generate or
  // Release. `after_prefill` (may be empty) runs once the prompt is in pages, before decoding.
  // `force` (empty, or `steps` tokens): feed these instead of the argmax (teacher forcing, to
  // compare two runs position by position even where their argmax would part).
  Result<Generation> Generate(std::span<const uint32_t> prompt, uint32_t steps,
                              const std::function<Status(RequestId)>& after_prefill = {},
                              std::span<const uint32_t> force = {});
  // Releases the last request (its blocks stay cached).
  Status Release();
  std::optional<RequestId> request() const { return request_; }

  // The forward of one token at the request's next position: encodes and attends to its own
  // records, writes logits (vocab floats), then appends the token to the manager. Exposed for
  // tests; Generate drives it.
  Status Step(RequestId r, uint32_t token, std::span<float> logits, AttentionCounters* counters);

 private:
  TinyRunner() = default;
  TinyConfig config_;
  Weights weights_;
  RunOptions options_;
  std::unique_ptr<RequestManager> manager_;
  std::optional<RequestId> request_;
  struct Cache;  // per-layer weight pointers
  // Step's layer l at position p: the token's records (pending in the pages), attention over its
  // positions, the FFN, added into the residual stream h.
  Status Layer(RequestId r, uint32_t l, uint64_t p, std::span<float> h, AttentionCounters* counters);
  // The positions layer l's query attends: every one, or (V3.2) the indexer's top-k; sets the
  // layer's pending records.
  Status Positions(uint32_t l, uint64_t p, std::span<const float> x, std::span<const float> qr, PagedLayer& pages,
                   std::vector<uint64_t>* positions, AttentionCounters* counters);
  std::unique_ptr<Cache> cache_;
  std::vector<std::vector<uint64_t>> last_selected_;  // per layer, what the last Step attended
};

}  // namespace tessera
