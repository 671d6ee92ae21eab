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
    """Tile scale of ADR 0017: amax / 448 in float32; 1.0 for an all-zero tile; FLT_MIN floor."""
    amax32 = np.float32(amax)
    if amax32 == 0:
        return np.float32(1.0)
    s = np.float32(amax32 / np.float32(E4M3_MAX))
    if s < np.float32(FLT_MIN):
        return np.float32(FLT_MIN)
    return s


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
