// Tiny-model config, seeded weights and the safetensors weight file (ADR 0017).
#include <bit>
#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string>

#include "tessera/checked.h"
#include "tessera/file_io.h"
#include "tessera/model.h"

namespace tessera {

using nlohmann::json;

namespace {

constexpr std::string_view kWeightsFormat = "tessera-tiny-v1";
// A weight file of the tiny presets is ~15 MB; anything much larger is not one.
constexpr uint64_t kMaxWeightFileBytes = uint64_t{256} << 20;
constexpr uint64_t kMaxHeaderBytes = uint64_t{1} << 20;
constexpr int kMaxHeaderDepth = 8;

// Deepest nesting of `text` (outside strings); nlohmann recurses once per level.
int JsonDepth(std::string_view text) {
  int depth = 0, max_depth = 0;
  bool in_string = false, escape = false;
  for (char ch : text) {
    if (in_string) {
      if (escape) {
        escape = false;
      } else if (ch == '\\') {
        escape = true;
      } else if (ch == '"') {
        in_string = false;
      }
    } else if (ch == '"') {
      in_string = true;
    } else if (ch == '{' || ch == '[') {
      max_depth = std::max(max_depth, ++depth);
    } else if (ch == '}' || ch == ']') {
      --depth;
    }
  }
  return max_depth;
}

uint64_t SplitMix64Next(uint64_t& state) {
  state += 0x9e3779b97f4a7c15ULL;
  uint64_t z = state;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

bool EndsWith(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

Status Bad(const std::string& what) { return InvalidArgument("weights", what); }

// The F32 bytes of a tensor of `t`'s shape, checked: a shape whose bytes leave 64 bits is an
// error naming the tensor.
Result<uint64_t> DataBytes(const TensorSpec& t) {
  Checked n(4);
  for (uint64_t d : t.shape) n *= d;
  if (n.overflowed()) return Bad(t.name + ": shape's bytes overflow 64 bits");
  return n.value();
}

// At most 40 characters of a name from outside, control characters shown as '?'.
std::string Shown(std::string_view name) {
  std::string s(name.substr(0, 40));
  for (char& c : s) {
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = '?';
  }
  return s;
}

}  // namespace

Result<TinyConfigFields> TinyConfigFields::Parse(std::string_view model, std::string_view text) {
  const json cfg = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!cfg.is_object()) return InvalidArgument("config", std::string(model) + " is not a JSON object");
  TinyConfigFields f;
  for (const auto& [key, v] : cfg.items()) {
    Field& field = f.fields_[key];
    if (v.is_number_unsigned()) {
      field = Field{Field::Kind::kUnsigned, v.get<uint64_t>(), v.get<double>()};
    } else if (v.is_number()) {
      field = Field{Field::Kind::kNumber, 0, v.get<double>()};
    } else if (v.is_null()) {
      field.kind = Field::Kind::kNull;
    }
  }
  return f;
}

Result<uint32_t> TinyConfigFields::Count(const char* field, bool required) const {
  const auto it = fields_.find(field);
  if (it == fields_.end()) {
    if (required) return InvalidArgument(field, "missing");
    return uint32_t{0};
  }
  const Field& v = it->second;
  if (v.kind != Field::Kind::kUnsigned || v.count == 0 || v.count > (uint64_t{1} << 20)) {
    return InvalidArgument(field, "must be a positive integer up to 2^20");
  }
  return static_cast<uint32_t>(v.count);
}

Result<double> TinyConfigFields::Number(const char* field) const {
  const auto it = fields_.find(field);
  if (it == fields_.end() || (it->second.kind != Field::Kind::kUnsigned && it->second.kind != Field::Kind::kNumber)) {
    return InvalidArgument(field, "must be a number");
  }
  const double d = it->second.number;
  if (!std::isfinite(d) || d <= 0) return InvalidArgument(field, "must be a positive finite number");
  return d;
}

bool TinyConfigFields::Has(const char* field) const {
  const auto it = fields_.find(field);
  return it != fields_.end() && it->second.kind != Field::Kind::kNull;
}

double NextWeightDraw(uint64_t& state) {
  const uint64_t u24 = SplitMix64Next(state) >> 40;
  return (static_cast<double>(u24) + 0.5) / 16777216.0 * 2.0 - 1.0;
}

std::vector<std::string> TinyModelNames() { return {"tiny-dsa", "tiny-mla"}; }

Result<TinyConfig> LoadTinyConfig(std::string_view model) {
  bool known = false;
  for (const std::string& n : TinyModelNames()) known = known || n == model;
  if (!known) return NotFound("model", "unknown tiny model \"" + Shown(model) + "\" (known: tiny-mla, tiny-dsa)");
  TinyConfig c;
  c.name = std::string(model);
  TESSERA_ASSIGN_OR_RETURN(c.geometry, LoadPreset(model));
  TESSERA_ASSIGN_OR_RETURN(std::string text, PresetConfigText(model));
  TESSERA_ASSIGN_OR_RETURN(const TinyConfigFields cfg, TinyConfigFields::Parse(c.name, text));
  const Geometry& g = c.geometry;
  if (g.model_type != "deepseek_v3" && g.model_type != "deepseek_v32") {
    return InvalidArgument("model_type", g.model_type + " (the tiny forward runs deepseek_v3 and deepseek_v32)");
  }
  if (cfg.Has("rope_scaling")) return InvalidArgument("rope_scaling", "the tiny forward has no YaRN");
  c.layers = g.num_layers;
  c.heads = g.num_attention_heads;
  c.kv_lora = g.kv_lora_rank;
  c.nope = g.qk_nope_head_dim;
  c.rope = g.qk_rope_head_dim;
  c.v = g.v_head_dim;
  if (c.rope % 2 != 0) return InvalidArgument("qk_rope_head_dim", "must be even (RoPE rotates pairs)");
  TESSERA_ASSIGN_OR_RETURN(c.hidden, cfg.Count("hidden_size"));
  TESSERA_ASSIGN_OR_RETURN(c.q_lora, cfg.Count("q_lora_rank"));
  TESSERA_ASSIGN_OR_RETURN(c.vocab, cfg.Count("vocab_size"));
  TESSERA_ASSIGN_OR_RETURN(c.ffn, cfg.Count("intermediate_size"));
  TESSERA_ASSIGN_OR_RETURN(double eps, cfg.Number("rms_norm_eps"));
  c.rms_eps = static_cast<float>(eps);
  TESSERA_ASSIGN_OR_RETURN(c.rope_theta, cfg.Number("rope_theta"));
  if (g.num_mtp_layers != 0) return InvalidArgument("num_nextn_predict_layers", "the tiny models have no MTP layers");
  if (g.model_type == "deepseek_v32") {
    c.index_heads = g.index_n_heads;
    c.index_head_dim = g.index_head_dim;
    c.index_topk = g.index_topk;
    if (c.index_head_dim != 128) return InvalidArgument("index_head_dim", "must be 128 (the Hadamard size)");
    if (c.rope > c.index_head_dim) return InvalidArgument("qk_rope_head_dim", "exceeds index_head_dim");
  }
  return c;
}

uint64_t TensorSpec::elements() const {
  Checked n(1);
  for (uint64_t d : shape) n *= d;
  return n.overflowed() ? UINT64_MAX : n.value();
}

std::vector<TensorSpec> WeightSpecs(const TinyConfig& c) {
  const uint64_t hidden = c.hidden, H = c.heads;
  std::vector<TensorSpec> s;
  s.push_back({"embed.weight", {c.vocab, hidden}});
  for (uint32_t l = 0; l < c.layers; ++l) {
    const std::string p = "layers." + std::to_string(l) + ".";
    s.push_back({p + "attn_norm.weight", {hidden}});
    s.push_back({p + "attn.wq_a.weight", {c.q_lora, hidden}});
    s.push_back({p + "attn.q_norm.weight", {c.q_lora}});
    s.push_back({p + "attn.wq_b.weight", {H * (c.nope + c.rope), c.q_lora}});
    s.push_back({p + "attn.wkv_a.weight", {uint64_t{c.kv_lora} + c.rope, hidden}});
    s.push_back({p + "attn.kv_norm.weight", {c.kv_lora}});
    s.push_back({p + "attn.wkv_b.weight", {H * (c.nope + c.v), c.kv_lora}});
    s.push_back({p + "attn.wo.weight", {hidden, H * c.v}});
    s.push_back({p + "ffn_norm.weight", {hidden}});
    s.push_back({p + "ffn.w1.weight", {c.ffn, hidden}});
    s.push_back({p + "ffn.w3.weight", {c.ffn, hidden}});
    s.push_back({p + "ffn.w2.weight", {hidden, c.ffn}});
    if (c.has_indexer()) {
      s.push_back({p + "attn.indexer.wq_b.weight", {uint64_t{c.index_heads} * c.index_head_dim, c.q_lora}});
      s.push_back({p + "attn.indexer.wk.weight", {c.index_head_dim, hidden}});
      s.push_back({p + "attn.indexer.k_norm.weight", {c.index_head_dim}});
      s.push_back({p + "attn.indexer.k_norm.bias", {c.index_head_dim}});
      s.push_back({p + "attn.indexer.weights_proj.weight", {c.index_heads, hidden}});
    }
  }
  s.push_back({"norm.weight", {hidden}});
  s.push_back({"head.weight", {c.vocab, hidden}});
  return s;
}

Weights GenerateWeights(const TinyConfig& c, uint64_t seed) {
  Weights w;
  w.model = c.name;
  w.seed = seed;
  uint64_t state = seed;
  for (const TensorSpec& t : WeightSpecs(c)) {
    std::vector<float> v(t.elements());
    const bool bias = EndsWith(t.name, ".bias");
    const bool norm = !bias && t.shape.size() == 1;
    // Linear weights [out, in] and the embedding [vocab, hidden]: in = the last dim.
    const double gain = t.shape.size() == 2 ? 1.0 / std::sqrt(static_cast<double>(t.shape[1])) : 1.0;
    for (float& x : v) {
      const double u = NextWeightDraw(state);
      x = static_cast<float>(norm ? 1.0 + 0.1 * u : bias ? 0.1 * u : u * gain);
    }
    w.tensors.emplace(t.name, std::move(v));
  }
  return w;
}

Result<std::string> SerializeWeightFile(std::string_view model, std::span<const TensorSpec> specs, const Weights& w) {
  json header = json::object();
  header["__metadata__"] = {
      {"model", std::string(model)}, {"seed", std::to_string(w.seed)}, {"format", kWeightsFormat}};
  uint64_t offset = 0;
  std::string data;
  for (const TensorSpec& t : specs) {
    TESSERA_ASSIGN_OR_RETURN(const uint64_t bytes, DataBytes(t));
    auto it = w.tensors.find(t.name);
    if (it == w.tensors.end() || it->second.size() != t.elements()) return Bad(t.name + ": missing or mis-sized");
    // The tensors are in memory: their bytes sum inside 64 bits.
    header[t.name] = {{"dtype", "F32"}, {"shape", t.shape}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
    for (float f : it->second) {
      const uint32_t b = std::bit_cast<uint32_t>(f);
      const char le[4] = {static_cast<char>(b & 0xff), static_cast<char>((b >> 8) & 0xff),
                          static_cast<char>((b >> 16) & 0xff), static_cast<char>(b >> 24)};
      data.append(le, 4);
    }
  }
  std::string text = header.dump();
  while (text.size() % 8 != 0) text.push_back(' ');  // safetensors pads the header with spaces
  std::string out(8, '\0');
  uint64_t n = text.size();
  for (int i = 0; i < 8; ++i) out[static_cast<size_t>(i)] = static_cast<char>((n >> (8 * i)) & 0xff);
  out += text;
  out += data;
  return out;
}

Status WriteWeightFile(const std::string& path, std::string_view model, std::span<const TensorSpec> specs,
                       const Weights& w) {
  TESSERA_ASSIGN_OR_RETURN(std::string bytes, SerializeWeightFile(model, specs, w));
  return WriteFilesAtomically({{path, std::move(bytes)}});
}

Result<std::string> SerializeWeights(const TinyConfig& c, const Weights& w) {
  return SerializeWeightFile(c.name, WeightSpecs(c), w);
}

Status WriteWeightsFile(const std::string& path, const TinyConfig& c, const Weights& w) {
  return WriteWeightFile(path, c.name, WeightSpecs(c), w);
}

// Long (~95 lines) on purpose: one pass over hostile bytes, each check beside the read it guards
// and returning at the first failure; split, the offsets checked so far would have to travel along.
Result<Weights> ParseWeightFile(std::string_view bytes, std::string_view model_name,
                                std::span<const TensorSpec> specs) {
  if (bytes.size() < 8)
    return Bad("file is " + std::to_string(bytes.size()) + " B, shorter than the 8-byte header length");
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= uint64_t{static_cast<uint8_t>(bytes[static_cast<size_t>(i)])} << (8 * i);
  if (n > bytes.size() - 8) {
    return Bad("header length " + std::to_string(n) + " runs past the end of the file (" +
               std::to_string(bytes.size()) + " B)");
  }
  if (n > kMaxHeaderBytes) return Bad("header length " + std::to_string(n) + " exceeds 1 MiB");
  const std::string_view text = bytes.substr(8, n);
  if (JsonDepth(text) > kMaxHeaderDepth) return Bad("header nests deeper than 8 levels");
  const json h = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (h.is_discarded()) return Bad("header is not valid JSON");
  if (!h.is_object()) return Bad("header is not a JSON object");
  const std::string_view data = bytes.substr(8 + n);
  // __metadata__
  if (!h.contains("__metadata__") || !h["__metadata__"].is_object()) return Bad("__metadata__ missing");
  const json& meta = h["__metadata__"];
  auto meta_string = [&](const char* key) -> Result<std::string> {
    if (!meta.contains(key) || !meta[key].is_string()) return Bad(std::string("__metadata__.") + key + " missing");
    return meta[key].get<std::string>();
  };
  TESSERA_ASSIGN_OR_RETURN(std::string format, meta_string("format"));
  if (format != kWeightsFormat)
    return Bad("__metadata__.format is \"" + format + "\", expected " + std::string(kWeightsFormat));
  TESSERA_ASSIGN_OR_RETURN(std::string model, meta_string("model"));
  if (model != model_name) return Bad("__metadata__.model is \"" + model + "\", expected " + std::string(model_name));
  TESSERA_ASSIGN_OR_RETURN(std::string seed, meta_string("seed"));
  Weights w;
  w.model = model;
  {
    if (seed.empty() || seed.size() > 20 || seed.find_first_not_of("0123456789") != std::string::npos) {
      return Bad("__metadata__.seed is not a decimal integer");
    }
    Checked s(0);
    for (char ch : seed) s = s * 10 + static_cast<uint64_t>(ch - '0');
    if (s.overflowed()) return Bad("__metadata__.seed exceeds 64 bits");
    w.seed = s.value();
  }
  for (auto it = h.begin(); it != h.end(); ++it) {
    if (it.key() == "__metadata__") continue;
    bool expected = false;
    for (const TensorSpec& t : specs) expected = expected || t.name == it.key();
    if (!expected) return Bad(it.key() + ": not a tensor of " + std::string(model_name));
  }
  uint64_t offset = 0;
  for (const TensorSpec& t : specs) {
    if (!h.contains(t.name)) return Bad(t.name + ": missing");
    const json& e = h[t.name];
    if (!e.is_object() || !e.contains("dtype") || !e["dtype"].is_string()) return Bad(t.name + ": dtype missing");
    if (e["dtype"].get<std::string>() != "F32")
      return Bad(t.name + ": dtype " + e["dtype"].get<std::string>() + ", expected F32");
    if (!e.contains("shape") || !e["shape"].is_array()) return Bad(t.name + ": shape missing");
    std::vector<uint64_t> shape;
    for (const json& d : e["shape"]) {
      if (!d.is_number_unsigned()) return Bad(t.name + ": shape is not a list of non-negative integers");
      shape.push_back(d.get<uint64_t>());
    }
    if (shape != t.shape) {
      std::string want, got;
      for (uint64_t d : t.shape) want += (want.empty() ? "" : ",") + std::to_string(d);
      for (uint64_t d : shape) got += (got.empty() ? "" : ",") + std::to_string(d);
      return Bad(t.name + ": shape [" + got + "], expected [" + want + "]");
    }
    if (!e.contains("data_offsets") || !e["data_offsets"].is_array() || e["data_offsets"].size() != 2 ||
        !e["data_offsets"][0].is_number_unsigned() || !e["data_offsets"][1].is_number_unsigned()) {
      return Bad(t.name + ": data_offsets is not [begin, end]");
    }
    const uint64_t begin = e["data_offsets"][0].get<uint64_t>(), end = e["data_offsets"][1].get<uint64_t>();
    TESSERA_ASSIGN_OR_RETURN(const uint64_t size, DataBytes(t));
    if (begin != offset || end < begin || end - begin != size) {
      const Checked want_end = Checked(offset) + size;
      return Bad(t.name + ": data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) + "], expected [" +
                 std::to_string(offset) + ", " +
                 (want_end.overflowed() ? std::string("beyond 2^64") : std::to_string(want_end.value())) + "]");
    }
    if (end > data.size()) return Bad(t.name + ": data runs past the end of the file");
    std::vector<float> v(t.elements());
    for (uint64_t i = 0; i < v.size(); ++i) {
      const char* p = data.data() + begin + 4 * i;
      const uint32_t b = uint32_t{static_cast<uint8_t>(p[0])} | uint32_t{static_cast<uint8_t>(p[1])} << 8 |
                         uint32_t{static_cast<uint8_t>(p[2])} << 16 | uint32_t{static_cast<uint8_t>(p[3])} << 24;
      v[i] = std::bit_cast<float>(b);
      if (!std::isfinite(v[i])) return Bad(t.name + ": value " + std::to_string(i) + " is not finite");
    }
    w.tensors.emplace(t.name, std::move(v));
    offset = end;
  }
  if (offset != data.size()) {
    return Bad("file size: " + std::to_string(data.size()) + " data bytes, the tensors cover " +
               std::to_string(offset));
  }
  return w;
}

Result<Weights> ReadWeightFile(const std::string& path, std::string_view model, std::span<const TensorSpec> specs) {
  TESSERA_ASSIGN_OR_RETURN(std::string bytes, ReadRegularFile(path, "weights", kMaxWeightFileBytes));
  return ParseWeightFile(bytes, model, specs);
}

Result<Weights> ParseWeights(std::string_view bytes, const TinyConfig& c) {
  return ParseWeightFile(bytes, c.name, WeightSpecs(c));
}

Result<Weights> ReadWeightsFile(const std::string& path, const TinyConfig& c) {
  return ReadWeightFile(path, c.name, WeightSpecs(c));
}

Status CheckTinyKvFormat(std::string_view kv_format) {
  if (kv_format == "mla-bf16" || kv_format == "fp8_ds_mla") return Status::Ok();
  return InvalidArgument("kv-format", "\"" + std::string(kv_format) +
                                          "\" is not a format the tiny models run with (mla-bf16, fp8_ds_mla)");
}

}  // namespace tessera
