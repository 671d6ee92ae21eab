// The CUDA side of Tessera (ADR 0025): device regions for the pool, the paged MLA decode over
// the pool's pages in place, and the batched host <-> device transfers of the tiers.
//
// Built only when nvcc is found (src/cuda/cuda.cmake; target tessera_cudart). Every entry point
// checks for a device first and fails with kFailedPrecondition on "device" naming the CUDA
// runtime's reason ("no CUDA-capable device is detected", a missing driver) when there is none,
// so binaries and tests that link it run on machines without a GPU.
//
// Thread-safety: QueryDevice and InstallDeviceRegions are safe from any thread; an MlaDecoder or
// a DeviceTransfer has one owner (its stream and buffers are its own).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "tessera/attention.h"
#include "tessera/cuda_plan.h"
#include "tessera/hash128.h"
#include "tessera/host_tier.h"
#include "tessera/memory.h"
#include "tessera/status.h"

namespace tessera::cuda {

struct DeviceProperties {
  int ordinal = 0;
  std::string name;
  int major = 0, minor = 0;  // compute capability
  uint32_t sm_count = 0;
  uint64_t global_bytes = 0;
  uint64_t shared_per_block_optin = 0;
};

// Devices the runtime sees; 0 when none or when there is no driver (never an error).
int DeviceCount();
// The properties of device `ordinal`; kFailedPrecondition on "device" when it does not exist.
Result<DeviceProperties> QueryDevice(int ordinal = 0);

// Installs the cudaMalloc allocator for RegionKind::kDevice regions (memory.h) on the current
// device. Idempotent. Without a device, AddRegion(kDevice) then fails on "device" with the
// runtime's reason; out of device memory, kOutOfBlocks on "device".
void InstallDeviceRegions();

// The absorbed MLA decode of one query token per request, for one layer, over pages in device
// memory laid out as the pool lays them out (DevicePageView). Owns its stream, the weights it was
// given and its workspace (grown on demand).
class MlaDecoder {
 public:
  // Errors: "device" (none), "model" dims beyond the kernel's limits (kMaxLatent, kMaxRope).
  static Result<std::unique_ptr<MlaDecoder>> Create(const MlaDims& dims, int device = 0);
  ~MlaDecoder();
  MlaDecoder(const MlaDecoder&) = delete;
  MlaDecoder& operator=(const MlaDecoder&) = delete;

  // wkv_b: [heads * (nope + v)][latent] row-major fp32, as MlaDecode takes it.
  Status SetWeights(std::span<const float> wkv_b);

  // out[b] = MlaDecode(absorbed) of request b of `tables` over the pages at `region_base` (the
  // device address of the view's region). q_nope: batch x heads x nope, q_pe: batch x heads x
  // rope, out: batch x heads x v, on the host. Errors: "kv-format" when the view's dims differ
  // from the model's, spans as MlaDecode, "device" for a CUDA error (named).
  Status Decode(const DevicePageView& view, uint64_t region_base, const PackedBlockTables& tables,
                std::span<const float> q_nope, std::span<const float> q_pe, std::span<float> out);

  // Runs the attention kernels (split + combine, not the weight products) of the last Decode
  // `iterations` more times and returns the mean seconds per run (CUDA events). For benchmarks.
  Result<double> TimeAttention(int iterations);
  // The plan of the last Decode.
  const DecodePlan& last_plan() const { return plan_; }

 private:
  struct Impl;
  explicit MlaDecoder(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
  DecodePlan plan_;
};

struct TransferStats {
  uint64_t blocks = 0;
  uint64_t bytes = 0;
  uint64_t copies = 0;  // cudaMemcpyAsync calls after coalescing
  uint64_t rounds = 0;
};

// Batched block transfers between host bytes and device pages through a pinned staging buffer on
// one stream (PlanTransfers): the host side of round k + 1 (verifying and staging, or draining
// and verifying) overlaps the copies of round k.
class DeviceTransfer {
 public:
  // staging_bytes of pinned host memory (cudaMallocHost). Errors: "device", "staging-bytes" (0).
  static Result<std::unique_ptr<DeviceTransfer>> Create(uint64_t staging_bytes, int device = 0);
  ~DeviceTransfer();
  DeviceTransfer(const DeviceTransfer&) = delete;
  DeviceTransfer& operator=(const DeviceTransfer&) = delete;

  // Promotes src[i] into device handle dst[i] (of `regions`, a kDevice region). Each source is
  // verified against xxh3[i] (XXH3-64, the host tier's checksum) before it is staged: a mismatch
  // is kDataLoss on "block <i>" and nothing of that round or later is copied. Errors: "blocks"
  // (span sizes, a source whose size differs from its handle), the plan's, "device".
  Status Promote(std::span<const std::span<const std::byte>> src, std::span<const uint64_t> xxh3,
                 const RegionTable& regions, std::span<const BlockHandle> dst, TransferStats* stats = nullptr);
  // Demotes device handle src[i] into dst[i] and returns each block's XXH3-64 in xxh3_out[i]
  // (computed on the host after the copy). When `expected` is not empty, a block whose bytes do
  // not hash to expected[i] is kDataLoss on "block <i>" and its dst is zeroed.
  Status Demote(const RegionTable& regions, std::span<const BlockHandle> src, std::span<const std::span<std::byte>> dst,
                std::span<uint64_t> xxh3_out, std::span<const uint64_t> expected = {}, TransferStats* stats = nullptr);

  // The tiers' path: each key's record is read from the host tier straight into the staging
  // buffer (HostTier::GetInto verifies its checksum; a failure is the tier's kDataLoss, the record
  // dropped) and copied to dst[i]; the record's size must equal the handle's ("blocks").
  Status PromoteFromHostTier(HostTier& tier, std::span<const Hash128> keys, const RegionTable& regions,
                             std::span<const BlockHandle> dst, TransferStats* stats = nullptr);
  // Copies src[i] out and stores it in the host tier under keys[i] (the tier checksums it); with
  // `expected`, verified as Demote does before it is stored.
  Status DemoteToHostTier(HostTier& tier, std::span<const Hash128> keys, uint16_t format_id, const RegionTable& regions,
                          std::span<const BlockHandle> src, std::span<const uint64_t> expected = {},
                          TransferStats* stats = nullptr);

  // The baseline the benchmarks compare against: one cudaMemcpyAsync of `bytes` from the pinned
  // staging buffer to device address `dst`, synchronized; seconds (CUDA events).
  Result<double> TimePlainCopy(uint64_t dst, uint64_t bytes, bool to_device);
  uint64_t staging_bytes() const;

 private:
  struct Impl;
  explicit DeviceTransfer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// A plain device buffer (cudaMalloc), for tests and benchmarks that stage pages themselves.
class DeviceBuffer {
 public:
  static Result<DeviceBuffer> Allocate(uint64_t bytes);
  DeviceBuffer() = default;
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(o.ptr_), bytes_(o.bytes_) { o.ptr_ = 0, o.bytes_ = 0; }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;
  ~DeviceBuffer();
  uint64_t address() const { return ptr_; }
  uint64_t bytes() const { return bytes_; }
  Status CopyFromHost(std::span<const std::byte> src, uint64_t offset = 0);
  Status CopyToHost(std::span<std::byte> dst, uint64_t offset = 0) const;

 private:
  uint64_t ptr_ = 0;
  uint64_t bytes_ = 0;
};

// Sets the bytes of a device range of `regions` to `value` (cudaMemset; synchronized). Errors:
// "handle" as RegionTable::DeviceAddress, "device".
Status FillDeviceRange(const RegionTable& regions, const BlockHandle& range, uint8_t value);

// Device-to-device copy bandwidth (bytes read + bytes written per second) of `bytes`-byte copies,
// the best of `iterations`: the HBM figure decode bandwidth is compared with.
Result<double> MeasureCopyBandwidth(uint64_t bytes, int iterations);

}  // namespace tessera::cuda
