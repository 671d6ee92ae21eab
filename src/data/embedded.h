// Files shipped inside the binary (data/models/*.json, data/claims/*.json, data/gpus/*.json), generated at build
// time by cmake/embed.cmake so that the tool stands alone and presets go through the same
// reader as user files.
#pragma once

#include <cstddef>
#include <string_view>

namespace tessera::data {

struct EmbeddedFile {
  std::string_view name;  // file name without directory or ".json"
  std::string_view text;
};

// Sorted by name.
const EmbeddedFile* ModelFiles(size_t* count);
const EmbeddedFile* ClaimFiles(size_t* count);
const EmbeddedFile* GpuFiles(size_t* count);

}  // namespace tessera::data
