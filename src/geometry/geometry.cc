#include "tessera/geometry.h"

#include <openssl/evp.h>

#include "embedded.h"
#include "tessera/file_io.h"

namespace tessera {

std::string_view LayerKindName(LayerKind kind) {
  switch (kind) {
    case LayerKind::kMha:
      return "mha";
    case LayerKind::kMla:
      return "mla";
    case LayerKind::kMlaSparse:
      return "dsa";
    case LayerKind::kSwa:
      return "swa";
    case LayerKind::kCsa:
      return "csa";
    case LayerKind::kHca:
      return "hca";
    case LayerKind::kSliding:
      return "sliding";
    case LayerKind::kLinear:
      return "linear";
  }
  return "?";
}

std::string_view CacheRoleName(CacheRole role) {
  switch (role) {
    case CacheRole::kKv:
      return "kv";
    case CacheRole::kLatent:
      return "latent";
    case CacheRole::kCompressed:
      return "compressed";
    case CacheRole::kIndexer:
      return "indexer";
    case CacheRole::kWindow:
      return "window";
    case CacheRole::kCompressorState:
      return "compressor_state";
    case CacheRole::kIndexerCompressorState:
      return "indexer_compressor_state";
    case CacheRole::kLinearState:
      return "linear_state";
  }
  return "?";
}

std::string_view StateDtypeName(StateDtype dtype) {
  switch (dtype) {
    case StateDtype::kBf16:
      return "bf16";
    case StateDtype::kFp16:
      return "fp16";
    case StateDtype::kFp32:
      return "fp32";
  }
  return "?";
}

bool IsPaged(CacheRole role) {
  return role == CacheRole::kKv || role == CacheRole::kLatent || role == CacheRole::kCompressed ||
         role == CacheRole::kIndexer;
}

uint32_t Geometry::CountLayers(LayerKind kind, bool include_mtp) const {
  uint32_t n = 0;
  for (const LayerSpec& l : layers) {
    if (l.kind == kind && (include_mtp || !l.is_mtp)) ++n;
  }
  return n;
}

std::string Sha256Hex(std::string_view data) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_Digest(data.data(), data.size(), digest, &len, EVP_sha256(), nullptr);
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(static_cast<size_t>(len) * 2);
  for (unsigned int i = 0; i < len; ++i) {
    out += kHex[digest[i] >> 4];
    out += kHex[digest[i] & 15];
  }
  return out;
}

Result<Geometry> LoadConfigFile(const std::string& path) {
  TESSERA_ASSIGN_OR_RETURN(std::string text, ReadRegularFile(path, "config", kMaxInputFileBytes));
  return GeometryFromConfigJson(text, path);
}

std::vector<std::string> PresetNames() {
  size_t n = 0;
  const data::EmbeddedFile* files = data::ModelFiles(&n);
  std::vector<std::string> names;
  for (size_t i = 0; i < n; ++i) names.emplace_back(files[i].name);
  return names;
}

Result<std::string> PresetConfigText(std::string_view name) {
  size_t n = 0;
  const data::EmbeddedFile* files = data::ModelFiles(&n);
  for (size_t i = 0; i < n; ++i) {
    if (files[i].name == name) return std::string(files[i].text);
  }
  std::string known;
  for (size_t i = 0; i < n; ++i) known += (i ? ", " : "") + std::string(files[i].name);
  return NotFound("model", "unknown preset \"" + std::string(name) + "\" (known: " + known + ")");
}

Result<Geometry> LoadPreset(std::string_view name) {
  TESSERA_ASSIGN_OR_RETURN(std::string text, PresetConfigText(name));
  return GeometryFromConfigJson(text, name);
}

}  // namespace tessera
