"""The oracle's own number formats and small building blocks.

Everything here is written from the format definitions (OCP OFP8 E4M3FN, bf16 = upper half of an
IEEE binary32) and ADR 0017, not from Tessera's C++ codec. Tensors are torch.float32 on the CPU.
"""

import math

import numpy as np
import torch

E4M3_MAX = 448.0
E4M3_MIN_NORMAL_EXP = -6  # 2^-6 is the smallest normal; subnormals step by 2^-9
E4M3_MANTISSA_BITS = 3
FLT_MIN = float(np.finfo(np.float32).tiny)  # 2^-126


def e4m3_round(x: torch.Tensor) -> torch.Tensor:
    """Rounds float32 values to the nearest E4M3FN value, ties to even, saturating at +-448.

    The quantum of |x| is 2^(floor(log2|x|) - 3) for normal results and 2^-9 below 2^-6. Scaling by
    a power of two is exact in float32, so round-half-even on the scaled value is the exact RNE.
    +-inf saturate to +-448 (the format has no infinity); NaN stays NaN; the sign of zero is kept.
    """
    x = x.to(torch.float32)
    a = x.abs().clamp(max=E4M3_MAX)
    _, e = torch.frexp(a)  # a = m * 2^e with m in [0.5, 1), so floor(log2 a) = e - 1
    exp = torch.clamp(e - 1, min=E4M3_MIN_NORMAL_EXP)
    quantum_exp = exp - E4M3_MANTISSA_BITS
    one = torch.ones_like(a)
    q = torch.ldexp(one, quantum_exp)
    r = torch.round(a / q) * q  # torch.round rounds half to even
    r = torch.copysign(r, x)
    return torch.where(torch.isnan(x), x, r)


def e4m3_decode_table() -> torch.Tensor:
    """The value of each of the 256 E4M3FN codes (sign | 4 exponent bits, bias 7 | 3 mantissa bits)."""
    values = []
    for code in range(256):
        sign = -1.0 if code & 0x80 else 1.0
        e = (code >> 3) & 0xF
        m = code & 0x7
        if e == 0xF and m == 0x7:
            values.append(math.nan)
        elif e == 0:
            values.append(sign * math.ldexp(m / 8.0, -6))
        else:
            values.append(sign * math.ldexp(1.0 + m / 8.0, e - 7))
    return torch.tensor(values, dtype=torch.float32)


_E4M3_TABLE = e4m3_decode_table()


def e4m3_decode(codes: torch.Tensor) -> torch.Tensor:
    return _E4M3_TABLE[codes.to(torch.int64)]


def e4m3_encode(x: torch.Tensor) -> torch.Tensor:
    """The E4M3FN code (uint8) of each float32 value: RNE, saturating; NaN -> 0x7F | sign."""
    x = x.to(torch.float32)
    r = e4m3_round(x)
    sign = torch.signbit(x).to(torch.int64) << 7
    a = r.abs()
    _, e = torch.frexp(a)
    exp = e.to(torch.int64) - 1
    normal = exp >= E4M3_MIN_NORMAL_EXP
    exp_c = torch.clamp(exp, min=E4M3_MIN_NORMAL_EXP)
    # normal: a = 2^exp * (1 + m/8); subnormal: a = 2^-9 * m
    mant_normal = (torch.ldexp(a, -exp_c) * 8.0 - 8.0).to(torch.int64)
    mant_sub = torch.ldexp(a, torch.full_like(exp, 9)).to(torch.int64)
    code = torch.where(normal, ((exp_c + 7) << 3) | mant_normal, mant_sub)
    code = torch.where(a == 0, torch.zeros_like(code), code)
    code = torch.where(torch.isnan(x), torch.full_like(code, 0x7F), code)
    return (code | sign).to(torch.uint8)


def bf16_round(x: torch.Tensor) -> torch.Tensor:
    """Rounds float32 to bf16 (RNE; torch's conversion) and back to float32, exactly."""
    return x.to(torch.float32).to(torch.bfloat16).to(torch.float32)


def bf16_bits(x: torch.Tensor) -> np.ndarray:
    """bf16 bit patterns (uint16) of float32 values, RNE."""
    return x.to(torch.float32).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16).copy()


def bf16_from_bits(bits: np.ndarray) -> torch.Tensor:
    wide = bits.astype(np.uint32) << np.uint32(16)
    return torch.from_numpy(wide.view(np.float32).copy())


def fp8_scale(amax: float) -> np.float32:
    """fp8_ds_mla tile scale as vLLM's concat_and_cache_ds_mla writes it (ADR 0033): amax / 448 in
    float32, floored at FLT_MIN (so an all-zero tile gets FLT_MIN, not 1.0)."""
    amax32 = np.float32(amax)
    s = np.float32(amax32 / np.float32(E4M3_MAX))
    if s < np.float32(FLT_MIN):
        return np.float32(FLT_MIN)
    return s


INDEXER_SCALE_FORMATS = ("ue8m0", "amax")
INDEXER_SCALE_FLOOR = 1e-4


def indexer_fp8_scale(amax: float, scale_fmt: str = "ue8m0") -> np.float32:
    """The indexer-fp8 key scale as the engines compute it (ADR 0043), written from their rule:
    q = max(amax, 1e-4) / 448 in float32 (vLLM's indexer_k_quant_and_cache; DeepSeek's act_quant
    floors amax at 1e-4 the same way); scale_fmt "ue8m0" (DeepSeek-V3.2's config.json
    `scale_fmt`, which vLLM passes on) rounds q up to a power of two, "amax" keeps q."""
    if scale_fmt not in INDEXER_SCALE_FORMATS:
        raise ValueError(f"scale_fmt: {scale_fmt!r} (expected one of {', '.join(INDEXER_SCALE_FORMATS)})")
    q = np.float32(max(np.float32(amax), np.float32(INDEXER_SCALE_FLOOR)) / np.float32(E4M3_MAX))
    if scale_fmt == "amax":
        return q
    return np.float32(ue8m0_value(ue8m0_ceil(q)))


def encode_indexer_fp8(key: torch.Tensor, scale_fmt: str = "ue8m0") -> bytes:
    """indexer-fp8 record in per-token order: n e4m3 codes of key / scale, then the fp32 scale."""
    scale = indexer_fp8_scale(key.abs().max().item(), scale_fmt)
    codes = e4m3_encode(key.float() / torch.tensor(scale, dtype=torch.float32))
    return codes.numpy().astype(np.uint8).tobytes() + np.array([scale], dtype="<f4").tobytes()


def rms_norm(v: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """v / sqrt(mean(v^2) + eps) * w, in float32."""
    ms = (v * v).sum() / v.shape[-1]
    return v / torch.sqrt(ms + eps) * w


def layer_norm(v: torch.Tensor, w: torch.Tensor, b: torch.Tensor, eps: float) -> torch.Tensor:
    """(v - mean) / sqrt(var + eps) * w + b with the biased variance, in float32."""
    n = v.shape[-1]
    mean = v.sum() / n
    d = v - mean
    var = (d * d).sum() / n
    return d / torch.sqrt(var + eps) * w + b


def silu(v: torch.Tensor) -> torch.Tensor:
    return v / (1.0 + torch.exp(-v))


def softmax(s: torch.Tensor) -> torch.Tensor:
    e = torch.exp(s - s.max())
    return e / e.sum()


def softmax_columns(s: torch.Tensor) -> torch.Tensor:
    """Softmax over the rows (dim 0) of each column, max subtracted (ADR 0018's compressor)."""
    e = torch.exp(s - s.max(dim=0, keepdim=True).values)
    return e / e.sum(dim=0, keepdim=True)


def rope_cos_sin(pos: int, dim: int, theta: float):
    """cos/sin of the angles pos * theta^(-2i/dim), i in 0..dim/2-1, computed in double, rounded to float."""
    ang = [pos * theta ** (-2.0 * i / dim) for i in range(dim // 2)]
    cos = torch.tensor([math.cos(a) for a in ang], dtype=torch.float32)
    sin = torch.tensor([math.sin(a) for a in ang], dtype=torch.float32)
    return cos, sin


def rope_interleaved(x: torch.Tensor, pos: int, theta: float) -> torch.Tensor:
    """Rotates the pairs (x[2i], x[2i+1]) (DeepSeek-V3 apply_rotary_emb). x: [..., dim]."""
    dim = x.shape[-1]
    cos, sin = rope_cos_sin(pos, dim, theta)
    a = x[..., 0::2]
    b = x[..., 1::2]
    out = torch.empty_like(x)
    out[..., 0::2] = a * cos - b * sin
    out[..., 1::2] = a * sin + b * cos
    return out


def rope_half(x: torch.Tensor, pos: int, theta: float) -> torch.Tensor:
    """Rotates the pairs (x[i], x[i + dim/2]) (non-interleaved; the V3.2 indexer's rope part)."""
    dim = x.shape[-1]
    half = dim // 2
    cos, sin = rope_cos_sin(pos, dim, theta)
    a = x[..., :half]
    b = x[..., half:]
    return torch.cat([a * cos - b * sin, a * sin + b * cos], dim=-1)


def hadamard(n: int) -> torch.Tensor:
    """Sylvester Hadamard matrix of size n (a power of two), entries +-1: H[i][j] = (-1)^popcount(i & j)."""
    if n < 1 or n & (n - 1):
        raise ValueError(f"hadamard: size {n} is not a power of two")
    h = torch.ones(1, 1, dtype=torch.float32)
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h


def hadamard_transform(v: torch.Tensor) -> torch.Tensor:
    """H_n v * n^-0.5 along the last dimension."""
    n = v.shape[-1]
    return (v @ hadamard(n).to(v.dtype).T) * (n ** -0.5)


# --- ADR 0018 (DeepSeek-V4): UE8M0 scales, FP4 E2M1, the v4-fp8 record, indexer-mxfp4 ----------
# From the OCP Microscaling (MX) v1.0 definitions: UE8M0 = unsigned 8-bit exponent, bias 127,
# value 2^(code-127), 0xFF NaN; E2M1 = sign, 2 exponent bits (bias 1), 1 mantissa bit, finite
# values +-{0, 0.5, 1, 1.5, 2, 3, 4, 6}, no infinity, no NaN.

E2M1_MAX = 6.0
UE8M0_NAN = 0xFF
V4_NOPE, V4_ROPE, V4_TILE = 448, 64, 64
V4_TILES = V4_NOPE // V4_TILE  # 7
V4_DATA_ROW = V4_NOPE + 2 * V4_ROPE  # 576: 448 e4m3, 64 bf16
V4_SCALE_ROW = V4_TILES + 1  # 8: 7 ue8m0, one pad byte
V4_RECORD = V4_DATA_ROW + V4_SCALE_ROW  # 584
MXFP4_BLOCK = 32


def ue8m0_ceil(x: float) -> int:
    """UE8M0 code of the smallest power of two >= x (x a float32 value): the MX scale rule.

    Written from the definition: x = m 2^e with m in [0.5, 1) (frexp, exact for a float), so the
    smallest power of two >= x is 2^(e-1) when m == 0.5, else 2^e. x <= 2^-127 (zero, negatives)
    -> code 0 (2^-127, the smallest scale); beyond 2^127 -> 0xFE (clamped); NaN -> 0xFF.
    """
    x = float(np.float32(x))
    if math.isnan(x):
        return UE8M0_NAN
    if x <= 0.0:
        return 0
    if math.isinf(x):
        return 0xFE
    m, e = math.frexp(x)
    k = e - 1 if m == 0.5 else e
    return min(max(k + 127, 0), 0xFE)


def ue8m0_value(code: int) -> float:
    """2^(code-127) (a float32 value: 2^-127 is a float subnormal); NaN for 0xFF."""
    if code == UE8M0_NAN:
        return math.nan
    return math.ldexp(1.0, code - 127)


def e2m1_round(x: torch.Tensor) -> torch.Tensor:
    """Nearest E2M1 value, ties to the even mantissa bit, saturating at +-6; sign of zero kept.

    The quantum is 0.5 below 2 (subnormal 0.5 and the binade [1, 2)), 1 in [2, 4), 2 in [4, 6];
    |x| / quantum is exact (a power-of-two scaling), so round-half-even on it is the exact RNE,
    and an even multiple of the quantum is the even mantissa bit in each range. NaN -> +-0 (the
    format has none; the sign is kept).
    """
    x = x.to(torch.float32)
    a = torch.nan_to_num(x.abs(), nan=0.0, posinf=E2M1_MAX).clamp(max=8.0)
    q = torch.where(a < 2.0, torch.full_like(a, 0.5), torch.where(a < 4.0, torch.ones_like(a), torch.full_like(a, 2.0)))
    r = (torch.round(a / q) * q).clamp(max=E2M1_MAX)
    return torch.copysign(r, x)


_E2M1_VALUES = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


def e2m1_decode_nibbles(nib: torch.Tensor) -> torch.Tensor:
    """Value of each 4-bit code (bit 3 sign, bits 2..1 exponent, bit 0 mantissa)."""
    table = torch.tensor(_E2M1_VALUES + [-v for v in _E2M1_VALUES], dtype=torch.float32)
    return table[nib.to(torch.int64) & 0xF]


def e2m1_encode(x: torch.Tensor) -> torch.Tensor:
    """4-bit codes (int64 0..15) of e2m1_round(x)."""
    r = e2m1_round(x)
    mag = r.abs()
    idx = torch.zeros_like(mag, dtype=torch.int64)
    for i, v in enumerate(_E2M1_VALUES):
        idx = torch.where(mag == v, torch.full_like(idx, i), idx)
    return idx | (torch.signbit(r).to(torch.int64) << 3)


def pack_nibbles(codes: torch.Tensor) -> bytes:
    """Two codes per byte, element 2i in the low nibble (OCP MX); an even count."""
    c = codes.to(torch.int64).view(-1, 2)
    return bytes((c[:, 0] | (c[:, 1] << 4)).to(torch.uint8).numpy().tobytes())


def unpack_nibbles(raw: bytes) -> torch.Tensor:
    b = torch.from_numpy(np.frombuffer(raw, dtype=np.uint8).astype(np.int64))
    return torch.stack([b & 0xF, b >> 4], dim=1).reshape(-1)


def mxfp4_scale_code(block: torch.Tensor) -> int:
    """ADR 0018: scale = 2^ceil(log2(max(amax, 6 * 2^-126) * (1/6))), the product in float32."""
    amax = np.float32(block.abs().max().item())
    m = max(amax, np.float32(6.0 * 2.0**-126))
    return ue8m0_ceil(np.float32(m * np.float32(1.0 / 6.0)))


def fp4_round_blocks(x: torch.Tensor) -> torch.Tensor:
    """The indexer query's fp4 step: per 32 values e2m1(x / scale) * scale in float32, not stored."""
    out = []
    for b in x.to(torch.float32).view(-1, MXFP4_BLOCK):
        s = torch.tensor(ue8m0_value(mxfp4_scale_code(b)), dtype=torch.float32)
        out.append(e2m1_round(b / s) * s)
    return torch.cat(out).view(x.shape)


def encode_mxfp4(x: torch.Tensor) -> bytes:
    """indexer-mxfp4 record: n/2 bytes of packed e2m1, then n/32 ue8m0 scales (128 values: 68 B)."""
    codes, scales = [], []
    for b in x.to(torch.float32).view(-1, MXFP4_BLOCK):
        sc = mxfp4_scale_code(b)
        codes.append(e2m1_encode(b / torch.tensor(ue8m0_value(sc), dtype=torch.float32)))
        scales.append(sc)
    return pack_nibbles(torch.cat(codes)) + bytes(scales)


def decode_mxfp4(rec: bytes, n: int) -> torch.Tensor:
    vals = e2m1_decode_nibbles(unpack_nibbles(rec[: n // 2]))
    scales = torch.tensor([ue8m0_value(c) for c in rec[n // 2 : n // 2 + n // MXFP4_BLOCK]], dtype=torch.float32)
    return vals * scales.repeat_interleave(MXFP4_BLOCK)


def v4_tile_scale_code(tile: torch.Tensor) -> int:
    """ADR 0018 v4-fp8: scale = 2^ceil(log2(max(amax / 448, 1e-4))), in float32."""
    amax = np.float32(tile.abs().max().item())
    return ue8m0_ceil(max(np.float32(amax / np.float32(E4M3_MAX)), np.float32(1e-4)))


def encode_v4fp8(nope: torch.Tensor, rope: torch.Tensor) -> bytes:
    """v4-fp8 record as a window row holds it: data row (448 e4m3 | 64 bf16 LE) then scale row
    (7 ue8m0 | one zero pad byte); 584 bytes."""
    codes, scales = [], []
    for t in nope.to(torch.float32).view(V4_TILES, V4_TILE):
        sc = v4_tile_scale_code(t)
        codes.append(e4m3_encode(t / torch.tensor(ue8m0_value(sc), dtype=torch.float32)).numpy())
        scales.append(sc)
    rope_bytes = bf16_bits(rope).astype("<u2").tobytes()
    return np.concatenate(codes).tobytes() + rope_bytes + bytes(scales) + b"\x00"


def decode_v4fp8(rec: bytes) -> torch.Tensor:
    """The dequantized 512-value row: e4m3 * 2^(code-127) per 64 nope values, then bf16 rope."""
    raw = np.frombuffer(bytes(rec), dtype=np.uint8)
    vals = e4m3_decode(torch.from_numpy(raw[:V4_NOPE].astype(np.int64)))
    scales = torch.tensor([ue8m0_value(int(c)) for c in raw[V4_DATA_ROW : V4_DATA_ROW + V4_TILES]],
                          dtype=torch.float32)
    nope = vals * scales.repeat_interleave(V4_TILE)
    rope = bf16_from_bits(raw[V4_NOPE:V4_DATA_ROW].copy().view("<u2"))
    return torch.cat([nope, rope])
