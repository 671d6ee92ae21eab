"""The tiny DeepSeek-architecture models of ADR 0017, naive formulation, fp32.

Per head K and V are materialized from the cached latents (k_h = [W_UK_h c, k_pe], v_h = W_UV_h c)
and attended with an ordinary softmax. The cache holds each token's record as bytes in the page
format (mla-bf16: 512 + 64 bf16; fp8_ds_mla: 512 e4m3, 4 fp32 tile scales, 64 bf16), appended before
the token's own attention, and attention reads every key back from those bytes.
"""

import numpy as np
import torch

from . import numerics as nm

CONFIGS = {
    "tiny-mla": dict(
        layers=4, hidden=256, heads=4, q_lora=128, kv_lora=512, nope=64, rope=64, v=64,
        vocab=256, ffn=256, eps=1e-6, theta=10000.0, max_pos=131072, indexer=None,
    ),
    "tiny-dsa": dict(
        layers=4, hidden=256, heads=4, q_lora=128, kv_lora=512, nope=64, rope=64, v=64,
        vocab=256, ffn=256, eps=1e-6, theta=10000.0, max_pos=131072,
        indexer=dict(heads=4, dim=128, rope=64, topk=64, scale_fmt="ue8m0"),
    ),
}

KV_FORMATS = ("mla-bf16", "fp8_ds_mla")
RECORD_BYTES = {"mla-bf16": 1152, "fp8_ds_mla": 656}
FP8_TILE = 128
WEIGHT_FORMAT = "tessera-tiny-v1"


def expected_shapes(cfg):
    """Tensor name -> shape, as ADR 0017's weight file lists them."""
    H, hid = cfg["heads"], cfg["hidden"]
    qk = cfg["nope"] + cfg["rope"]
    shapes = {"embed.weight": [cfg["vocab"], hid]}
    for l in range(cfg["layers"]):
        p = f"layers.{l}."
        shapes.update({
            p + "attn_norm.weight": [hid],
            p + "attn.wq_a.weight": [cfg["q_lora"], hid],
            p + "attn.q_norm.weight": [cfg["q_lora"]],
            p + "attn.wq_b.weight": [H * qk, cfg["q_lora"]],
            p + "attn.wkv_a.weight": [cfg["kv_lora"] + cfg["rope"], hid],
            p + "attn.kv_norm.weight": [cfg["kv_lora"]],
            p + "attn.wkv_b.weight": [H * (cfg["nope"] + cfg["v"]), cfg["kv_lora"]],
            p + "attn.wo.weight": [hid, H * cfg["v"]],
            p + "ffn_norm.weight": [hid],
            p + "ffn.w1.weight": [cfg["ffn"], hid],
            p + "ffn.w3.weight": [cfg["ffn"], hid],
            p + "ffn.w2.weight": [hid, cfg["ffn"]],
        })
        ix = cfg["indexer"]
        if ix:
            shapes.update({
                p + "attn.indexer.wq_b.weight": [ix["heads"] * ix["dim"], cfg["q_lora"]],
                p + "attn.indexer.wk.weight": [ix["dim"], hid],
                p + "attn.indexer.k_norm.weight": [ix["dim"]],
                p + "attn.indexer.k_norm.bias": [ix["dim"]],
                p + "attn.indexer.weights_proj.weight": [ix["heads"], hid],
            })
    shapes["norm.weight"] = [hid]
    shapes["head.weight"] = [cfg["vocab"], hid]
    return shapes


def check_weights(model, tensors, metadata):
    """Raises ValueError naming the tensor (or metadata field) that does not fit the model."""
    if model not in CONFIGS:
        raise ValueError(f"model: unknown {model!r} (expected one of {', '.join(CONFIGS)})")
    if metadata.get("format") != WEIGHT_FORMAT:
        raise ValueError(f"__metadata__.format: {metadata.get('format')!r}, expected {WEIGHT_FORMAT!r}")
    if metadata.get("model") != model:
        raise ValueError(f"__metadata__.model: {metadata.get('model')!r}, expected {model!r}")
    want = expected_shapes(CONFIGS[model])
    for name, shape in want.items():
        if name not in tensors:
            raise ValueError(f"tensor {name!r}: missing")
        if list(tensors[name].shape) != shape:
            raise ValueError(f"tensor {name!r}: shape {list(tensors[name].shape)}, expected {shape}")
        if not np.isfinite(tensors[name]).all():
            raise ValueError(f"tensor {name!r}: holds a non-finite value")
    for name in tensors:
        if name not in want:
            raise ValueError(f"tensor {name!r}: not a tensor of {model}")


class LatentCache:
    """Per layer, one byte record per position, in the page's record format."""

    def __init__(self, kv_format, layers, kv_lora, rope):
        if kv_format not in KV_FORMATS:
            raise ValueError(f"kv_format: {kv_format!r} (expected one of {', '.join(KV_FORMATS)})")
        self.fmt = kv_format
        self.kv_lora, self.rope = kv_lora, rope
        self.records = [[] for _ in range(layers)]

    def encode(self, c, k_pe):
        rope_bytes = nm.bf16_bits(k_pe).astype("<u2").tobytes()
        if self.fmt == "mla-bf16":
            return bytearray(nm.bf16_bits(c).astype("<u2").tobytes() + rope_bytes)
        codes, scales = [], []
        for t in range(self.kv_lora // FP8_TILE):
            tile = c[t * FP8_TILE : (t + 1) * FP8_TILE]
            scale = nm.fp8_scale(tile.abs().max().item())
            q = tile / torch.tensor(scale, dtype=torch.float32)  # float32 division
            codes.append(nm.e4m3_encode(q).numpy())
            scales.append(scale)
        return bytearray(np.concatenate(codes).tobytes() + np.array(scales, dtype="<f4").tobytes() + rope_bytes)

    def append(self, layer, c, k_pe):
        rec = self.encode(c, k_pe)
        assert len(rec) == RECORD_BYTES[self.fmt]
        self.records[layer].append(rec)

    def __len__(self):
        return len(self.records[0])

    def read(self, layer, positions):
        """(c [T, kv_lora], k_pe [T, rope]) decoded from the records at `positions`."""
        raw = np.frombuffer(b"".join(bytes(self.records[layer][p]) for p in positions), dtype=np.uint8)
        raw = raw.reshape(len(positions), RECORD_BYTES[self.fmt])
        L = self.kv_lora
        if self.fmt == "mla-bf16":
            c = nm.bf16_from_bits(raw[:, : 2 * L].copy().view("<u2"))
            k_pe = nm.bf16_from_bits(raw[:, 2 * L :].copy().view("<u2"))
            return c, k_pe
        tiles = L // FP8_TILE
        vals = nm.e4m3_decode(torch.from_numpy(raw[:, :L].copy()))
        scales = torch.from_numpy(raw[:, L : L + 4 * tiles].copy().view("<f4").astype(np.float32))
        c = vals * scales.repeat_interleave(FP8_TILE, dim=1)  # one float32 multiply per value
        k_pe = nm.bf16_from_bits(raw[:, L + 4 * tiles :].copy().view("<u2"))
        return c, k_pe

    def flip(self, layer, position, byte):
        rec = self.records[layer][position]
        if not 0 <= byte < len(rec):
            raise ValueError(f"flip: byte {byte} outside the {len(rec)}-byte record")
        rec[byte] ^= 0x01


class IndexerCache:
    """Per layer, each position's indexer key as indexer-fp8: 128 e4m3 values and one fp32 scale,
    in the config's scale format (scale_fmt: ue8m0, as DeepSeek-V3.2's config.json sets it)."""

    def __init__(self, layers, scale_fmt="ue8m0"):
        self.keys = [[] for _ in range(layers)]
        self.scale_fmt = scale_fmt

    def append(self, layer, ik):
        scale = nm.indexer_fp8_scale(ik.abs().max().item(), self.scale_fmt)
        s = torch.tensor(scale, dtype=torch.float32)
        codes = nm.e4m3_encode(ik / s)
        self.keys[layer].append((codes, s))

    def read(self, layer):
        return torch.stack([nm.e4m3_decode(codes) * s for codes, s in self.keys[layer]])


def topk_positions(score, k):
    """The k positions of highest score (all when fewer), ascending; equal scores: lower position first."""
    order = np.argsort(-score.numpy().astype(np.float64), kind="stable")[:k]  # stable: index order on ties
    return sorted(int(t) for t in order)


class Oracle:
    """One request's forward, one token at a time (positions 0, 1, ...)."""

    def __init__(self, model, kv_format, tensors, metadata, dtype=torch.float32):
        """dtype: the activations' type; float32 as the ADR specifies (float64 only to measure how
        far another correct evaluation order drifts, see precision_probe)."""
        check_weights(model, tensors, metadata)
        self.model = model
        self.cfg = cfg = CONFIGS[model]
        self.w = {k: torch.from_numpy(np.array(v, dtype=np.float32)).to(dtype) for k, v in tensors.items()}
        self.cache = LatentCache(kv_format, cfg["layers"], cfg["kv_lora"], cfg["rope"])
        self.icache = IndexerCache(cfg["layers"], cfg["indexer"]["scale_fmt"]) if cfg["indexer"] else None
        self.pos = 0
        self.tokens = []  # fed so far
        self.selected = []  # per step, per layer: the positions attended (tiny-dsa)
        self.forced = None  # per position, per layer: the positions to attend (a dump's "selected")
        self.scores = []  # (layer, position, indexer scores) of each top-k selection made

    def _select(self, l, x, qr, pos):
        cfg, ix = self.cfg, self.cfg["indexer"]
        p = f"layers.{l}.attn.indexer."
        w = self.w
        r = ix["rope"]
        iq = (w[p + "wq_b.weight"] @ qr).view(ix["heads"], ix["dim"])
        iq = torch.cat([nm.rope_half(iq[:, :r], pos, cfg["theta"]), iq[:, r:]], dim=1)
        ik = nm.layer_norm(w[p + "wk.weight"] @ x, w[p + "k_norm.weight"], w[p + "k_norm.bias"], cfg["eps"])
        ik = torch.cat([nm.rope_half(ik[:r], pos, cfg["theta"]), ik[r:]])
        iq = nm.hadamard_transform(iq)
        ik = nm.hadamard_transform(ik)
        self.icache.append(l, ik)
        keys = self.icache.read(l).to(iq.dtype)  # [T, dim], the current token's key included, from the cache
        if keys.shape[0] <= ix["topk"]:
            return list(range(keys.shape[0]))
        wj = (w[p + "weights_proj.weight"] @ x) * (ix["heads"] ** -0.5) * (ix["dim"] ** -0.5)
        score = (torch.relu(keys @ iq.T) * wj).sum(dim=1)  # [T]
        mine = topk_positions(score, ix["topk"])
        self.scores.append((l, pos, score))
        if self.forced is None:
            return mine
        # A dump's selection: attended as given; compare.selection_gaps checks each is admissible.
        theirs = self.forced[pos][l]
        if sorted(set(theirs)) != list(theirs) or len(theirs) != len(mine) or not all(0 <= t <= pos for t in theirs):
            raise ValueError(f"selected[{pos}][{l}]: {theirs!r} is not {len(mine)} distinct ascending positions <= {pos}")
        return list(theirs)

    def attend(self, l, q, positions):
        """Naive MLA attention of layer l for queries q [H, nope + rope] over the cached `positions`:
        per head k = [W_UK c, k_pe], v = W_UV c, softmax(scale * k q) v. Returns [H * v]."""
        cfg = self.cfg
        H, nope, rope, vd, L = cfg["heads"], cfg["nope"], cfg["rope"], cfg["v"], cfg["kv_lora"]
        scale = (nope + rope) ** -0.5
        C, KPE = (t.to(q.dtype) for t in self.cache.read(l, positions))
        wkv_b = self.w[f"layers.{l}.attn.wkv_b.weight"].view(H, nope + vd, L)
        outs = []
        for hd in range(H):
            k = torch.cat([C @ wkv_b[hd, :nope].T, KPE], dim=1)  # [T, nope + rope]
            v = C @ wkv_b[hd, nope:].T  # [T, v]
            s = (k @ q[hd]) * scale
            outs.append(nm.softmax(s) @ v)
        return torch.cat(outs)

    def step(self, token):
        cfg, w = self.cfg, self.w
        if not 0 <= token < cfg["vocab"]:
            raise ValueError(f"token {token} outside the vocabulary of {cfg['vocab']}")
        if self.pos >= cfg["max_pos"]:
            raise ValueError(f"position {self.pos} beyond max_position_embeddings")
        pos = self.pos
        H, nope, rope, L = cfg["heads"], cfg["nope"], cfg["rope"], cfg["kv_lora"]
        eps, theta = cfg["eps"], cfg["theta"]
        h = w["embed.weight"][token].clone()
        chosen = []
        for l in range(cfg["layers"]):
            p = f"layers.{l}."
            x = nm.rms_norm(h, w[p + "attn_norm.weight"], eps)
            qr = nm.rms_norm(w[p + "attn.wq_a.weight"] @ x, w[p + "attn.q_norm.weight"], eps)
            q = (w[p + "attn.wq_b.weight"] @ qr).view(H, nope + rope)
            q = torch.cat([q[:, :nope], nm.rope_interleaved(q[:, nope:], pos, theta)], dim=1)
            kv = w[p + "attn.wkv_a.weight"] @ x
            c = nm.rms_norm(kv[:L], w[p + "attn.kv_norm.weight"], eps)
            k_pe = nm.rope_interleaved(kv[L:], pos, theta)
            self.cache.append(l, c, k_pe)
            positions = self._select(l, x, qr, pos) if self.icache else list(range(pos + 1))
            chosen.append(positions)
            h = h + w[p + "attn.wo.weight"] @ self.attend(l, q, positions)
            y = nm.rms_norm(h, w[p + "ffn_norm.weight"], eps)
            h = h + w[p + "ffn.w2.weight"] @ (nm.silu(w[p + "ffn.w1.weight"] @ y) * (w[p + "ffn.w3.weight"] @ y))
        self.selected.append(chosen)
        self.tokens.append(token)
        self.pos += 1
        return w["head.weight"] @ nm.rms_norm(h, w["norm.weight"], eps)


def teacher_forced(oracle, tokens, prompt_len, count):
    """Feeds tokens[0 : prompt_len - 1 + count]; returns the logits at positions prompt_len-1 onwards."""
    out = []
    last = prompt_len - 1 + count
    for i in range(last):
        logits = oracle.step(tokens[i])
        if i >= prompt_len - 1:
            out.append(logits)
    return out


def greedy(oracle, prompt, steps, flip=None):
    """Greedy decoding (argmax, lowest id on a tie): returns (tokens, logits that chose each new token).

    flip = (layer, position, byte) XORs 0x01 into that record byte once the prompt is cached
    (after prefill), as `tessera generate --flip-page-byte` does.
    """
    tokens = list(prompt)
    logits_out = []
    for i in range(len(prompt) + steps - 1):
        if flip is not None and i == len(prompt):
            oracle.cache.flip(*flip)
        logits = oracle.step(tokens[i])
        if i >= len(prompt) - 1:
            logits_out.append(logits)
            tokens.append(int(np.argmax(logits.numpy())))
    return tokens, logits_out
