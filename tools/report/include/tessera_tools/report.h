// `tessera report`: the main job. Ledgers for DeepSeek-V3 and DeepSeek-V4-Pro at 8K, 128K and
// 1M tokens — the structural bytes and what Tessera, vLLM and SGLang commit, side by side —
// followed by the claim check of the seed note's published table.
#pragma once

#include <string>

#include "tessera/status.h"
#include "tessera_tools/render.h"

namespace tessera {

Result<std::string> RenderReport(OutputFormat format);

}  // namespace tessera
