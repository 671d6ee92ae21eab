#include "tessera/gpu.h"

#include <cctype>
#include <nlohmann/json.hpp>

#include "embedded.h"
#include "tessera/file_io.h"

namespace tessera {

namespace {

using nlohmann::json;

constexpr size_t kMaxSpecBytes = size_t{64} * 1024;
constexpr uint64_t kMaxFigure = 1000000000000000000ULL;

std::string Lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

Result<uint64_t> Positive(const json& j, const char* field) {
  auto it = j.find(field);
  if (it == j.end() || it->is_null()) return InvalidArgument(field, "missing from the GPU spec");
  // At most 10^18 (an exabyte, an exaFLOP/s): products of two figures stay inside 128 bits.
  if (!it->is_number_unsigned() || it->get<uint64_t>() == 0 || it->get<uint64_t>() > kMaxFigure) {
    return InvalidArgument(field, "must be a positive integer of at most 10^18");
  }
  return it->get<uint64_t>();
}

Result<std::string> Text(const json& j, const char* field, bool required) {
  auto it = j.find(field);
  if (it == j.end() || it->is_null()) {
    if (required) return InvalidArgument(field, "missing from the GPU spec");
    return std::string();
  }
  if (!it->is_string()) return InvalidArgument(field, "must be a string");
  std::string s = it->get<std::string>();
  if (s.size() > 200) return InvalidArgument(field, "longer than 200 characters");
  for (char c : s) {
    if (static_cast<unsigned char>(c) < 0x20) return InvalidArgument(field, "holds a control character");
  }
  return s;
}

}  // namespace

Result<GpuSpec> GpuSpecFromJson(std::string_view json_text, std::string_view source) {
  if (json_text.size() > kMaxSpecBytes) {
    return OutOfRange("gpu-spec", std::string(source) + " is larger than " + std::to_string(kMaxSpecBytes) + " B");
  }
  json j = json::parse(json_text.begin(), json_text.end(), nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    return InvalidArgument("gpu-spec", std::string(source) + " is not a JSON object");
  }
  GpuSpec s;
  TESSERA_ASSIGN_OR_RETURN(s.name, Text(j, "name", true));
  if (s.name.empty()) return InvalidArgument("name", "must not be empty");
  TESSERA_ASSIGN_OR_RETURN(s.description, Text(j, "description", false));
  TESSERA_ASSIGN_OR_RETURN(s.memory_bytes, Positive(j, "memory_bytes"));
  TESSERA_ASSIGN_OR_RETURN(s.hbm_bytes_per_s, Positive(j, "hbm_bytes_per_s"));
  TESSERA_ASSIGN_OR_RETURN(s.dense_bf16_flops, Positive(j, "dense_bf16_flops"));
  TESSERA_ASSIGN_OR_RETURN(s.dense_fp8_flops, Positive(j, "dense_fp8_flops"));
  return s;
}

std::vector<std::string> GpuNames() {
  size_t n = 0;
  const data::EmbeddedFile* files = data::GpuFiles(&n);
  std::vector<std::string> names;
  for (size_t i = 0; i < n; ++i) {
    Result<GpuSpec> s = GpuSpecFromJson(files[i].text, files[i].name);
    if (s.ok()) names.push_back(s->name);
  }
  return names;
}

Result<GpuSpec> LoadGpu(std::string_view name) {
  size_t n = 0;
  const data::EmbeddedFile* files = data::GpuFiles(&n);
  const std::string want = Lower(name);
  for (size_t i = 0; i < n; ++i) {
    Result<GpuSpec> s = GpuSpecFromJson(files[i].text, files[i].name);
    if (!s.ok()) return Internal("gpu", "shipped spec " + std::string(files[i].name) + ": " + s.status().ToString());
    if (Lower(s->name) == want || Lower(files[i].name) == want) return s;
  }
  std::string known;
  for (const std::string& k : GpuNames()) known += (known.empty() ? "" : ", ") + k;
  std::string shown(name.substr(0, 40));
  for (char& c : shown) {
    if (static_cast<unsigned char>(c) < 0x20) c = '?';
  }
  return NotFound("gpu", "unknown GPU \"" + shown + "\" (known: " + known + ")");
}

Result<GpuSpec> LoadGpuSpecFile(const std::string& path) {
  TESSERA_ASSIGN_OR_RETURN(std::string text, ReadRegularFile(path, "gpu-spec", kMaxSpecBytes));
  return GpuSpecFromJson(text, path);
}

}  // namespace tessera
