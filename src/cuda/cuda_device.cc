#include "tessera/cuda_device.h"

#include <cuda_runtime.h>
#include <xxhash.h>

#include <algorithm>
#include <cstring>
#include <mutex>
#include <string>

#include "kernels.h"

namespace tessera::cuda {
namespace {

// Tessera names device bytes by integer addresses (memory.h: a region's device address); the CUDA
// API takes pointers. The one conversion.
void* Ptr(uint64_t address) { return reinterpret_cast<void*>(address); }  // NOLINT(performance-no-int-to-ptr)

Status CudaError(cudaError_t e, const std::string& what) {
  return FailedPrecondition("device", what + ": " + cudaGetErrorString(e));
}

#define TESSERA_CUDA_RETURN(expr, what)        \
  do {                                         \
    const cudaError_t tessera_cuda_e = (expr); \
    if (tessera_cuda_e != cudaSuccess) {       \
      return CudaError(tessera_cuda_e, what);  \
    }                                          \
  } while (false)

// Seconds the work `run` enqueues on `stream` takes, between two CUDA events; `run` returns
// the first error it met. Errors name `what`.
template <class Run>
Result<double> TimeOnStream(cudaStream_t stream, const char* what, Run&& run) {
  cudaEvent_t start = nullptr, stop = nullptr;
  TESSERA_CUDA_RETURN(cudaEventCreate(&start), "cudaEventCreate");
  if (const cudaError_t c = cudaEventCreate(&stop); c != cudaSuccess) {
    cudaEventDestroy(start);
    return CudaError(c, "cudaEventCreate");
  }
  cudaEventRecord(start, stream);
  const cudaError_t e = run();
  cudaEventRecord(stop, stream);
  const cudaError_t sync = cudaEventSynchronize(stop);
  float ms = 0.0f;
  cudaEventElapsedTime(&ms, start, stop);
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  if (e != cudaSuccess) return CudaError(e, what);
  if (sync != cudaSuccess) return CudaError(sync, what);
  return static_cast<double>(ms) * 1e-3;
}

// OK when device `ordinal` exists, else the runtime's reason.
Status RequireDevice(int ordinal) {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    cudaGetLastError();  // clear the sticky-free error so a later query starts clean
    return CudaError(e, "no CUDA device (cudaGetDeviceCount)");
  }
  if (ordinal < 0 || ordinal >= count) {
    return FailedPrecondition("device",
                              "no CUDA device " + std::to_string(ordinal) + " (" + std::to_string(count) + " present)");
  }
  TESSERA_CUDA_RETURN(cudaSetDevice(ordinal), "cudaSetDevice");
  return Status::Ok();
}

Result<uint64_t> DeviceAllocate(uint64_t bytes) {
  int device = 0;
  const cudaError_t g = cudaGetDevice(&device);
  if (g != cudaSuccess) {
    cudaGetLastError();
    return CudaError(g, "no CUDA device for a device region");
  }
  TESSERA_RETURN_IF_ERROR(RequireDevice(device));
  void* p = nullptr;
  const cudaError_t e = cudaMalloc(&p, bytes);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return OutOfBlocks("device", "cudaMalloc of " + std::to_string(bytes) + " bytes: " + cudaGetErrorString(e));
  }
  return reinterpret_cast<uint64_t>(p);
}

void DeviceRelease(uint64_t address) { cudaFree(Ptr(address)); }

const DeviceAllocator kCudaAllocator{&DeviceAllocate, &DeviceRelease};

uint64_t Xxh3(std::span<const std::byte> bytes) { return XXH3_64bits(bytes.data(), bytes.size()); }

// A device allocation freed on scope exit.
struct DevicePtr {
  void* p = nullptr;
  uint64_t bytes = 0;
  ~DevicePtr() {
    if (p != nullptr) cudaFree(p);
  }
  Status Ensure(uint64_t n, const char* what) {
    if (n <= bytes) return Status::Ok();
    if (p != nullptr) cudaFree(p);
    p = nullptr;
    bytes = 0;
    TESSERA_CUDA_RETURN(cudaMalloc(&p, std::max<uint64_t>(n, 1)), std::string("cudaMalloc ") + what);
    bytes = n;
    return Status::Ok();
  }
  template <typename T>
  T* as() const {
    return static_cast<T*>(p);
  }
};

}  // namespace

int DeviceCount() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return count;
}

Result<DeviceProperties> QueryDevice(int ordinal) {
  TESSERA_RETURN_IF_ERROR(RequireDevice(ordinal));
  cudaDeviceProp prop{};
  TESSERA_CUDA_RETURN(cudaGetDeviceProperties(&prop, ordinal), "cudaGetDeviceProperties");
  DeviceProperties p;
  p.ordinal = ordinal;
  p.name = prop.name;
  p.major = prop.major;
  p.minor = prop.minor;
  p.sm_count = static_cast<uint32_t>(prop.multiProcessorCount);
  p.global_bytes = prop.totalGlobalMem;
  p.shared_per_block_optin = prop.sharedMemPerBlockOptin;
  return p;
}

void InstallDeviceRegions() { InstallDeviceAllocator(&kCudaAllocator); }

// ---- DeviceBuffer ------------------------------------------------------------------------------

Result<DeviceBuffer> DeviceBuffer::Allocate(uint64_t bytes) {
  if (bytes == 0) return InvalidArgument("bytes", "a device buffer needs at least one byte");
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) cudaGetLastError();
  TESSERA_RETURN_IF_ERROR(RequireDevice(device));
  DeviceBuffer b;
  void* p = nullptr;
  TESSERA_CUDA_RETURN(cudaMalloc(&p, bytes), "cudaMalloc of " + std::to_string(bytes) + " bytes");
  b.ptr_ = reinterpret_cast<uint64_t>(p);
  b.bytes_ = bytes;
  return b;
}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  if (this != &o) {
    if (ptr_ != 0) cudaFree(Ptr(ptr_));
    ptr_ = o.ptr_;
    bytes_ = o.bytes_;
    o.ptr_ = 0;
    o.bytes_ = 0;
  }
  return *this;
}

DeviceBuffer::~DeviceBuffer() {
  if (ptr_ != 0) cudaFree(Ptr(ptr_));
}

Status DeviceBuffer::CopyFromHost(std::span<const std::byte> src, uint64_t offset) {
  if (offset > bytes_ || src.size() > bytes_ - offset) return InvalidArgument("src", "runs past the device buffer");
  TESSERA_CUDA_RETURN(cudaMemcpy(Ptr(ptr_ + offset), src.data(), src.size(), cudaMemcpyHostToDevice),
                      "cudaMemcpy to device");
  return Status::Ok();
}

Status DeviceBuffer::CopyToHost(std::span<std::byte> dst, uint64_t offset) const {
  if (offset > bytes_ || dst.size() > bytes_ - offset) return InvalidArgument("dst", "runs past the device buffer");
  TESSERA_CUDA_RETURN(cudaMemcpy(dst.data(), Ptr(ptr_ + offset), dst.size(), cudaMemcpyDeviceToHost),
                      "cudaMemcpy to host");
  return Status::Ok();
}

Status FillDeviceRange(const RegionTable& regions, const BlockHandle& range, uint8_t value) {
  TESSERA_ASSIGN_OR_RETURN(uint64_t address, regions.DeviceAddress(range));
  TESSERA_CUDA_RETURN(cudaMemset(Ptr(address), value, range.len), "cudaMemset");
  TESSERA_CUDA_RETURN(cudaDeviceSynchronize(), "cudaMemset");
  return Status::Ok();
}

Result<double> MeasureCopyBandwidth(uint64_t bytes, int iterations) {
  if (bytes == 0 || iterations <= 0) return InvalidArgument("bytes", "a copy needs bytes and iterations");
  TESSERA_ASSIGN_OR_RETURN(DeviceBuffer a, DeviceBuffer::Allocate(bytes));
  TESSERA_ASSIGN_OR_RETURN(DeviceBuffer b, DeviceBuffer::Allocate(bytes));
  TESSERA_CUDA_RETURN(cudaMemset(Ptr(a.address()), 1, bytes), "cudaMemset");
  cudaEvent_t start = nullptr, stop = nullptr;
  TESSERA_CUDA_RETURN(cudaEventCreate(&start), "cudaEventCreate");
  TESSERA_CUDA_RETURN(cudaEventCreate(&stop), "cudaEventCreate");
  double best = 0.0;
  Status st = Status::Ok();
  for (int i = 0; i <= iterations && st.ok(); ++i) {  // the first run warms up
    cudaEventRecord(start);
    cudaMemcpyAsync(Ptr(b.address()), Ptr(a.address()), bytes, cudaMemcpyDeviceToDevice);
    cudaEventRecord(stop);
    const cudaError_t e = cudaEventSynchronize(stop);
    if (e != cudaSuccess) {
      st = CudaError(e, "device-to-device copy");
      break;
    }
    float ms = 0.0f;
    cudaEventElapsedTime(&ms, start, stop);
    if (i > 0 && ms > 0.0f) best = std::max(best, 2.0 * static_cast<double>(bytes) / (ms * 1e-3));
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  if (!st.ok()) return st;
  return best;
}

// ---- MlaDecoder --------------------------------------------------------------------------------

struct MlaDecoder::Impl {
  MlaDims dims;
  int device = 0;
  uint32_t sm_count = 0;
  cudaStream_t stream = nullptr;
  DevicePtr wkv_b, q_nope, q_pe, q_lat, o_lat, out, table, seq_lens, items, split_offset, partial, lse;
  kernels::SplitArgs split{};
  uint32_t batch = 0;
  bool have_weights = false;
  ~Impl() {
    if (stream != nullptr) cudaStreamDestroy(stream);
  }
};

MlaDecoder::MlaDecoder(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
MlaDecoder::~MlaDecoder() = default;

Result<std::unique_ptr<MlaDecoder>> MlaDecoder::Create(const MlaDims& dims, int device) {
  if (dims.heads == 0 || dims.nope == 0 || dims.v == 0 || dims.latent == 0 || dims.latent > kMaxLatent ||
      dims.rope == 0 || dims.rope > kMaxRope) {
    return InvalidArgument("model", "MLA dims beyond the CUDA decode's limits (latent <= 512, rope <= 64)");
  }
  TESSERA_ASSIGN_OR_RETURN(DeviceProperties p, QueryDevice(device));
  auto impl = std::make_unique<Impl>();
  impl->dims = dims;
  impl->device = device;
  impl->sm_count = p.sm_count;
  TESSERA_CUDA_RETURN(cudaStreamCreateWithFlags(&impl->stream, cudaStreamNonBlocking), "cudaStreamCreate");
  return std::unique_ptr<MlaDecoder>(new MlaDecoder(std::move(impl)));
}

Status MlaDecoder::SetWeights(std::span<const float> wkv_b) {
  const MlaDims& d = impl_->dims;
  const uint64_t want = uint64_t{d.heads} * (d.nope + d.v) * d.latent;
  if (wkv_b.size() != want) {
    return InvalidArgument("wkv_b",
                           "holds " + std::to_string(wkv_b.size()) + " floats, expected " + std::to_string(want));
  }
  TESSERA_RETURN_IF_ERROR(impl_->wkv_b.Ensure(want * 4, "wkv_b"));
  TESSERA_CUDA_RETURN(cudaMemcpy(impl_->wkv_b.p, wkv_b.data(), want * 4, cudaMemcpyHostToDevice), "upload wkv_b");
  impl_->have_weights = true;
  return Status::Ok();
}

// Long (~85 lines): argument checks, uploads and the kernel launches in the order the device runs
// them, each followed by its error check.
Status MlaDecoder::Decode(const DevicePageView& view, uint64_t region_base, const PackedBlockTables& tables,
                          std::span<const float> q_nope, std::span<const float> q_pe, std::span<float> out) {
  Impl& m = *impl_;
  const MlaDims& d = m.dims;
  if (!m.have_weights) return FailedPrecondition("wkv_b", "SetWeights first");
  if (view.latent != d.latent || view.rope != d.rope) {
    return InvalidArgument("kv-format", "page records are " + std::to_string(view.latent) + " + " +
                                            std::to_string(view.rope) + ", the model's " + std::to_string(d.latent) +
                                            " + " + std::to_string(d.rope));
  }
  const uint64_t batch = tables.seq_lens.size();
  if (batch == 0 || tables.table.size() != batch * tables.stride) {
    return InvalidArgument("tables", "a packed table of " + std::to_string(tables.table.size()) + " entries for " +
                                         std::to_string(batch) + " requests x " + std::to_string(tables.stride));
  }
  auto check = [](const char* field, size_t got, uint64_t want) {
    return got == want
               ? Status::Ok()
               : InvalidArgument(field, "holds " + std::to_string(got) + " floats, expected " + std::to_string(want));
  };
  TESSERA_RETURN_IF_ERROR(check("q_nope", q_nope.size(), batch * d.heads * d.nope));
  TESSERA_RETURN_IF_ERROR(check("q_pe", q_pe.size(), batch * d.heads * d.rope));
  TESSERA_RETURN_IF_ERROR(check("out", out.size(), batch * d.heads * d.v));
  TESSERA_ASSIGN_OR_RETURN(plan_, PlanDecode(tables.seq_lens, DecodeShape{d.heads, d.latent, d.rope, view.block_tokens},
                                             DeviceLimits{m.sm_count, 2}));
  TESSERA_CUDA_RETURN(cudaSetDevice(m.device), "cudaSetDevice");
  TESSERA_RETURN_IF_ERROR(m.q_nope.Ensure(q_nope.size() * 4, "q_nope"));
  TESSERA_RETURN_IF_ERROR(m.q_pe.Ensure(q_pe.size() * 4, "q_pe"));
  TESSERA_RETURN_IF_ERROR(m.q_lat.Ensure(batch * d.heads * d.latent * 4, "q_lat"));
  TESSERA_RETURN_IF_ERROR(m.o_lat.Ensure(batch * d.heads * d.latent * 4, "o_lat"));
  TESSERA_RETURN_IF_ERROR(m.out.Ensure(out.size() * 4, "out"));
  TESSERA_RETURN_IF_ERROR(m.table.Ensure(tables.table.size() * 4, "block table"));
  TESSERA_RETURN_IF_ERROR(m.items.Ensure(plan_.items.size() * sizeof(kernels::Item), "work items"));
  TESSERA_RETURN_IF_ERROR(m.split_offset.Ensure(plan_.split_offset.size() * 4, "split offsets"));
  TESSERA_RETURN_IF_ERROR(m.partial.Ensure(plan_.partial_floats * 4, "partial outputs"));
  TESSERA_RETURN_IF_ERROR(m.lse.Ensure(plan_.lse_floats * 4, "partial lse"));
  static_assert(sizeof(kernels::Item) == sizeof(WorkItem));
  cudaStream_t s = m.stream;
  TESSERA_CUDA_RETURN(cudaMemcpyAsync(m.q_nope.p, q_nope.data(), q_nope.size() * 4, cudaMemcpyHostToDevice, s),
                      "upload q_nope");
  TESSERA_CUDA_RETURN(cudaMemcpyAsync(m.q_pe.p, q_pe.data(), q_pe.size() * 4, cudaMemcpyHostToDevice, s),
                      "upload q_pe");
  TESSERA_CUDA_RETURN(
      cudaMemcpyAsync(m.table.p, tables.table.data(), tables.table.size() * 4, cudaMemcpyHostToDevice, s),
      "upload block table");
  TESSERA_CUDA_RETURN(
      cudaMemcpyAsync(m.items.p, plan_.items.data(), plan_.items.size() * sizeof(WorkItem), cudaMemcpyHostToDevice, s),
      "upload work items");
  TESSERA_CUDA_RETURN(cudaMemcpyAsync(m.split_offset.p, plan_.split_offset.data(), plan_.split_offset.size() * 4,
                                      cudaMemcpyHostToDevice, s),
                      "upload split offsets");
  TESSERA_CUDA_RETURN(kernels::LaunchAbsorb(m.q_nope.as<float>(), m.wkv_b.as<float>(), static_cast<uint32_t>(batch),
                                            d.heads, d.nope, d.v, d.latent, m.q_lat.as<float>(), s),
                      "absorb kernel");
  kernels::SplitArgs& a = m.split;
  a.pages = static_cast<const uint8_t*>(Ptr(region_base + view.layer_offset));
  a.block_stride = view.block_stride;
  a.record_bytes = view.record_bytes;
  a.block_tokens = view.block_tokens;
  a.format = static_cast<uint32_t>(view.format);
  a.table = m.table.as<int32_t>();
  a.table_stride = tables.stride;
  a.q_lat = m.q_lat.as<float>();
  a.q_pe = m.q_pe.as<float>();
  a.items = m.items.as<kernels::Item>();
  a.item_count = static_cast<uint32_t>(plan_.items.size());
  a.partial = m.partial.as<float>();
  a.lse = m.lse.as<float>();
  a.heads = d.heads;
  a.latent = d.latent;
  a.rope = d.rope;
  a.heads_per_cta = plan_.heads_per_cta;
  a.head_groups = plan_.head_groups;
  a.scale = d.scale();
  a.shared_bytes = plan_.shared_bytes;
  m.batch = static_cast<uint32_t>(batch);
  TESSERA_CUDA_RETURN(kernels::LaunchSplit(a, s), "split kernel");
  TESSERA_CUDA_RETURN(kernels::LaunchCombine(a.partial, a.lse, m.split_offset.as<int32_t>(), m.batch, d.heads, d.latent,
                                             m.o_lat.as<float>(), s),
                      "combine kernel");
  TESSERA_CUDA_RETURN(kernels::LaunchProjectV(m.o_lat.as<float>(), m.wkv_b.as<float>(), m.batch, d.heads, d.nope, d.v,
                                              d.latent, m.out.as<float>(), s),
                      "projection kernel");
  TESSERA_CUDA_RETURN(cudaMemcpyAsync(out.data(), m.out.p, out.size() * 4, cudaMemcpyDeviceToHost, s), "download out");
  TESSERA_CUDA_RETURN(cudaStreamSynchronize(s), "decode");
  return Status::Ok();
}

Result<double> MlaDecoder::TimeAttention(int iterations) {
  Impl& m = *impl_;
  if (m.batch == 0 || iterations <= 0) return FailedPrecondition("decode", "Decode first");
  Result<double> total = TimeOnStream(m.stream, "attention kernels", [&] {
    cudaError_t e = cudaSuccess;
    for (int i = 0; i < iterations && e == cudaSuccess; ++i) {
      e = kernels::LaunchSplit(m.split, m.stream);
      if (e == cudaSuccess) {
        e = kernels::LaunchCombine(m.split.partial, m.split.lse, m.split_offset.as<int32_t>(), m.batch, m.dims.heads,
                                   m.dims.latent, m.o_lat.as<float>(), m.stream);
      }
    }
    return e;
  });
  if (!total.ok()) return total.status();
  return *total / iterations;
}

// ---- DeviceTransfer ----------------------------------------------------------------------------

namespace {
// The staging pipeline a DeviceTransfer owns.
struct Pipe {
  int device = 0;
  std::byte* staging = nullptr;
  uint64_t staging_bytes = 0;
  cudaStream_t stream = nullptr;
  cudaEvent_t done[2] = {nullptr, nullptr};
};
}  // namespace

struct DeviceTransfer::Impl : Pipe {
  ~Impl() {
    for (cudaEvent_t e : done) {
      if (e != nullptr) cudaEventDestroy(e);
    }
    if (stream != nullptr) cudaStreamDestroy(stream);
    if (staging != nullptr) cudaFreeHost(staging);
  }
};

DeviceTransfer::DeviceTransfer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
DeviceTransfer::~DeviceTransfer() = default;
uint64_t DeviceTransfer::staging_bytes() const { return impl_->staging_bytes; }

Result<std::unique_ptr<DeviceTransfer>> DeviceTransfer::Create(uint64_t staging_bytes, int device) {
  if (staging_bytes < 2) return InvalidArgument("staging-bytes", "a staging buffer needs two halves");
  TESSERA_RETURN_IF_ERROR(RequireDevice(device));
  auto impl = std::make_unique<Impl>();
  impl->device = device;
  void* p = nullptr;
  TESSERA_CUDA_RETURN(cudaMallocHost(&p, staging_bytes), "cudaMallocHost of the staging buffer");
  impl->staging = static_cast<std::byte*>(p);
  impl->staging_bytes = staging_bytes;
  TESSERA_CUDA_RETURN(cudaStreamCreateWithFlags(&impl->stream, cudaStreamNonBlocking), "cudaStreamCreate");
  for (cudaEvent_t& e : impl->done) {
    TESSERA_CUDA_RETURN(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate");
  }
  return std::unique_ptr<DeviceTransfer>(new DeviceTransfer(std::move(impl)));
}

namespace {

// Every handle must be a kDevice range of `regions`.
Status CheckDeviceHandles(const RegionTable& regions, std::span<const BlockHandle> blocks) {
  for (size_t i = 0; i < blocks.size(); ++i) {
    Result<uint64_t> a = regions.DeviceAddress(blocks[i]);
    if (!a.ok()) return InvalidArgument("blocks", "block " + std::to_string(i) + ": " + a.status().message());
  }
  return Status::Ok();
}

// Promotion pipeline: fill half (r % 2) on the host once its previous copies are done, then
// enqueue its coalesced host-to-device copies; the next round's fill overlaps them.
template <typename Fill>
Status RunPromote(Pipe& m, const RegionTable& regions, std::span<const BlockHandle> dst, Fill fill,
                  TransferStats* stats) {
  TESSERA_ASSIGN_OR_RETURN(TransferPlan plan, PlanTransfers(dst, m.staging_bytes));
  TESSERA_RETURN_IF_ERROR(CheckDeviceHandles(regions, dst));
  TESSERA_CUDA_RETURN(cudaSetDevice(m.device), "cudaSetDevice");
  Status result = Status::Ok();
  for (size_t r = 0; r < plan.rounds.size() && result.ok(); ++r) {
    const TransferRound& round = plan.rounds[r];
    std::byte* half = m.staging + (r % 2) * plan.half_bytes;
    if (r >= 2) {
      const cudaError_t e = cudaEventSynchronize(m.done[r % 2]);
      if (e != cudaSuccess) return CudaError(e, "promotion copies");
    }
    for (size_t k = 0; k < round.items.size() && result.ok(); ++k) {
      const uint32_t i = round.items[k];
      result = fill(i, std::span<std::byte>(half + round.item_offset[k], dst[i].len));
    }
    if (!result.ok()) break;
    for (const TransferCopy& c : round.copies) {
      const uint64_t device = *regions.DeviceAddress(c.device);  // checked: a run of checked handles
      const cudaError_t e =
          cudaMemcpyAsync(Ptr(device), half + c.staging_offset, c.device.len, cudaMemcpyHostToDevice, m.stream);
      if (e != cudaSuccess) return CudaError(e, "cudaMemcpyAsync to device");
    }
    const cudaError_t e = cudaEventRecord(m.done[r % 2], m.stream);
    if (e != cudaSuccess) return CudaError(e, "cudaEventRecord");
    if (stats != nullptr) {
      stats->rounds += 1;
      stats->copies += round.copies.size();
      stats->blocks += round.items.size();
      stats->bytes += round.bytes;
    }
  }
  const cudaError_t e = cudaStreamSynchronize(m.stream);
  if (e != cudaSuccess) return CudaError(e, "promotion copies");
  return result;
}

// Demotion pipeline: enqueue round r + 1's device-to-host copies before draining round r.
template <typename Drain>
Status RunDemote(Pipe& m, const RegionTable& regions, std::span<const BlockHandle> src, Drain drain,
                 TransferStats* stats) {
  TESSERA_ASSIGN_OR_RETURN(TransferPlan plan, PlanTransfers(src, m.staging_bytes));
  TESSERA_RETURN_IF_ERROR(CheckDeviceHandles(regions, src));
  TESSERA_CUDA_RETURN(cudaSetDevice(m.device), "cudaSetDevice");
  auto issue = [&](size_t r) -> Status {
    const TransferRound& round = plan.rounds[r];
    std::byte* half = m.staging + (r % 2) * plan.half_bytes;
    for (const TransferCopy& c : round.copies) {
      const uint64_t device = *regions.DeviceAddress(c.device);
      TESSERA_CUDA_RETURN(
          cudaMemcpyAsync(half + c.staging_offset, Ptr(device), c.device.len, cudaMemcpyDeviceToHost, m.stream),
          "cudaMemcpyAsync to host");
    }
    TESSERA_CUDA_RETURN(cudaEventRecord(m.done[r % 2], m.stream), "cudaEventRecord");
    return Status::Ok();
  };
  TESSERA_RETURN_IF_ERROR(issue(0));
  Status result = Status::Ok();
  for (size_t r = 0; r < plan.rounds.size(); ++r) {
    if (r + 1 < plan.rounds.size()) TESSERA_RETURN_IF_ERROR(issue(r + 1));
    TESSERA_CUDA_RETURN(cudaEventSynchronize(m.done[r % 2]), "demotion copies");
    const TransferRound& round = plan.rounds[r];
    const std::byte* half = m.staging + (r % 2) * plan.half_bytes;
    for (size_t k = 0; k < round.items.size(); ++k) {
      const uint32_t i = round.items[k];
      Status st = drain(i, std::span<const std::byte>(half + round.item_offset[k], src[i].len));
      if (result.ok() && !st.ok()) result = st;
    }
    if (stats != nullptr) {
      stats->rounds += 1;
      stats->copies += round.copies.size();
      stats->blocks += round.items.size();
      stats->bytes += round.bytes;
    }
    // Round r + 2 reuses this half: it is issued only after this drain (next iteration).
  }
  TESSERA_CUDA_RETURN(cudaStreamSynchronize(m.stream), "demotion copies");
  return result;
}

}  // namespace

Status DeviceTransfer::Promote(std::span<const std::span<const std::byte>> src, std::span<const uint64_t> xxh3,
                               const RegionTable& regions, std::span<const BlockHandle> dst, TransferStats* stats) {
  if (src.size() != dst.size() || xxh3.size() != dst.size()) {
    return InvalidArgument("blocks", std::to_string(src.size()) + " sources, " + std::to_string(xxh3.size()) +
                                         " checksums for " + std::to_string(dst.size()) + " blocks");
  }
  for (size_t i = 0; i < src.size(); ++i) {
    if (src[i].size() != dst[i].len) {
      return InvalidArgument("blocks", "block " + std::to_string(i) + ": " + std::to_string(src[i].size()) +
                                           " source bytes for a " + std::to_string(dst[i].len) + "-byte page range");
    }
  }
  return RunPromote(
      *impl_, regions, dst,
      [&](uint32_t i, std::span<std::byte> out) -> Status {
        if (Xxh3(src[i]) != xxh3[i]) {
          return DataLoss("block " + std::to_string(i), "checksum mismatch before promotion");
        }
        std::memcpy(out.data(), src[i].data(), out.size());
        return Status::Ok();
      },
      stats);
}

Status DeviceTransfer::Demote(const RegionTable& regions, std::span<const BlockHandle> src,
                              std::span<const std::span<std::byte>> dst, std::span<uint64_t> xxh3_out,
                              std::span<const uint64_t> expected, TransferStats* stats) {
  if (dst.size() != src.size() || xxh3_out.size() != src.size() ||
      (!expected.empty() && expected.size() != src.size())) {
    return InvalidArgument("blocks", "span sizes differ from the " + std::to_string(src.size()) + " blocks");
  }
  for (size_t i = 0; i < src.size(); ++i) {
    if (dst[i].size() != src[i].len) {
      return InvalidArgument("blocks", "block " + std::to_string(i) + ": a " + std::to_string(dst[i].size()) +
                                           "-byte destination for a " + std::to_string(src[i].len) + "-byte range");
    }
  }
  return RunDemote(
      *impl_, regions, src,
      [&](uint32_t i, std::span<const std::byte> in) -> Status {
        const uint64_t h = Xxh3(in);
        xxh3_out[i] = h;
        if (!expected.empty() && h != expected[i]) {
          std::memset(dst[i].data(), 0, dst[i].size());
          return DataLoss("block " + std::to_string(i), "checksum mismatch after demotion");
        }
        std::memcpy(dst[i].data(), in.data(), in.size());
        return Status::Ok();
      },
      stats);
}

Status DeviceTransfer::PromoteFromHostTier(HostTier& tier, std::span<const Hash128> keys, const RegionTable& regions,
                                           std::span<const BlockHandle> dst, TransferStats* stats) {
  if (keys.size() != dst.size()) {
    return InvalidArgument("blocks",
                           std::to_string(keys.size()) + " keys for " + std::to_string(dst.size()) + " blocks");
  }
  for (size_t i = 0; i < keys.size(); ++i) {
    const std::optional<uint64_t> size = tier.PayloadSize(keys[i]);
    if (!size) return NotFound("blocks", "block " + std::to_string(i) + " is not in the host tier");
    if (*size != dst[i].len) {
      return InvalidArgument("blocks", "block " + std::to_string(i) + ": a " + std::to_string(*size) +
                                           "-byte record for a " + std::to_string(dst[i].len) + "-byte page range");
    }
  }
  return RunPromote(
      *impl_, regions, dst, [&](uint32_t i, std::span<std::byte> out) { return tier.GetInto(keys[i], out); }, stats);
}

Status DeviceTransfer::DemoteToHostTier(HostTier& tier, std::span<const Hash128> keys, uint16_t format_id,
                                        const RegionTable& regions, std::span<const BlockHandle> src,
                                        std::span<const uint64_t> expected, TransferStats* stats) {
  if (keys.size() != src.size() || (!expected.empty() && expected.size() != src.size())) {
    return InvalidArgument("blocks", "span sizes differ from the " + std::to_string(src.size()) + " blocks");
  }
  return RunDemote(
      *impl_, regions, src,
      [&](uint32_t i, std::span<const std::byte> in) -> Status {
        if (!expected.empty() && Xxh3(in) != expected[i]) {
          return DataLoss("block " + std::to_string(i), "checksum mismatch after demotion");
        }
        return tier.Put(keys[i], format_id, in);
      },
      stats);
}

Result<double> DeviceTransfer::TimePlainCopy(uint64_t dst, uint64_t bytes, bool to_device) {
  Impl& m = *impl_;
  if (bytes == 0 || bytes > m.staging_bytes) return InvalidArgument("bytes", "must fit the staging buffer");
  return TimeOnStream(m.stream, "plain copy", [&] {
    return to_device ? cudaMemcpyAsync(Ptr(dst), m.staging, bytes, cudaMemcpyHostToDevice, m.stream)
                     : cudaMemcpyAsync(m.staging, Ptr(dst), bytes, cudaMemcpyDeviceToHost, m.stream);
  });
}

}  // namespace tessera::cuda
