"""tiny-v4: the DeepSeek-V4 hybrid model of ADR 0018, recomputed from the ADR text alone, fp32.

Layers by compress ratio: 0 = SWA (sliding window only), 4 = CSA (overlapping compressor, indexer
top-k over fp4 keys), other r > 1 = HCA (every compressed entry); every softmax carries the
head's attention sink in its denominator. What the cache holds is kept as bytes in the record
formats (window rows and compressed entries: v4-fp8, 584 B; indexer entries: indexer-mxfp4, 68 B,
or indexer-fp8, 132 B) and attention reads every row back from those bytes. The compressor's
state rows are fp32 and not lossy, so they are kept as float tensors.

Written from ADR 0018 (and ADR 0017 for what it does not restate), not from Tessera's C++.
"""

import numpy as np
import torch

from . import numerics as nm

CONFIG = dict(
    layers=4, hidden=256, heads=4, head_dim=512, rope=64, q_lora=128, o_groups=2, o_lora=64,
    window=16, ratios=(0, 4, 128, 4), iheads=4, ihd=128, topk=8, vocab=256, ffn=256, eps=1e-6,
    theta=10000.0, ctheta=160000.0, max_pos=131072, scale_fmt="ue8m0",
)
MODEL = "tiny-v4"
KV_FORMATS = ("v4-fp8",)
INDEXER_FORMATS = ("indexer-mxfp4", "indexer-fp8")
WEIGHT_FORMAT = "tessera-tiny-v1"


def coff(r):
    """Compressor column multiple: 2 for the overlapping ratio-4 compressor, else 1."""
    return 2 if r == 4 else 1


def weight_specs(cfg=CONFIG):
    """[(name, shape)] in ADR 0018's generation (and file) order."""
    H, D, hid = cfg["heads"], cfg["head_dim"], cfg["hidden"]
    G, OL, I, ID = cfg["o_groups"], cfg["o_lora"], cfg["iheads"], cfg["ihd"]
    specs = [("embed.weight", [cfg["vocab"], hid])]
    for l, r in enumerate(cfg["ratios"]):
        p = f"layers.{l}."
        specs += [
            (p + "attn_norm.weight", [hid]),
            (p + "attn.attn_sink", [H]),
            (p + "attn.wq_a.weight", [cfg["q_lora"], hid]),
            (p + "attn.q_norm.weight", [cfg["q_lora"]]),
            (p + "attn.wq_b.weight", [H * D, cfg["q_lora"]]),
            (p + "attn.wkv.weight", [D, hid]),
            (p + "attn.kv_norm.weight", [D]),
            (p + "attn.wo_a.weight", [G * OL, H * D // G]),
            (p + "attn.wo_b.weight", [hid, G * OL]),
        ]
        if r > 0:
            specs += [
                (p + "attn.compressor.ape", [r, coff(r) * D]),
                (p + "attn.compressor.wkv.weight", [coff(r) * D, hid]),
                (p + "attn.compressor.wgate.weight", [coff(r) * D, hid]),
                (p + "attn.compressor.norm.weight", [D]),
            ]
        if r == 4:
            specs += [
                (p + "attn.indexer.wq_b.weight", [I * ID, cfg["q_lora"]]),
                (p + "attn.indexer.weights_proj.weight", [I, hid]),
                (p + "attn.indexer.compressor.ape", [4, 2 * ID]),
                (p + "attn.indexer.compressor.wkv.weight", [2 * ID, hid]),
                (p + "attn.indexer.compressor.wgate.weight", [2 * ID, hid]),
                (p + "attn.indexer.compressor.norm.weight", [ID]),
            ]
        specs += [
            (p + "ffn_norm.weight", [hid]),
            (p + "ffn.w1.weight", [cfg["ffn"], hid]),
            (p + "ffn.w3.weight", [cfg["ffn"], hid]),
            (p + "ffn.w2.weight", [hid, cfg["ffn"]]),
        ]
    specs += [("norm.weight", [hid]), ("head.weight", [cfg["vocab"], hid])]
    return specs


def check_weights(tensors, metadata):
    """Raises ValueError naming the tensor (or metadata field) that does not fit tiny-v4."""
    if metadata.get("format") != WEIGHT_FORMAT:
        raise ValueError(f"__metadata__.format: {metadata.get('format')!r}, expected {WEIGHT_FORMAT!r}")
    if metadata.get("model") != MODEL:
        raise ValueError(f"__metadata__.model: {metadata.get('model')!r}, expected {MODEL!r}")
    want = dict(weight_specs())
    for name, shape in want.items():
        if name not in tensors:
            raise ValueError(f"tensor {name!r}: missing")
        if list(tensors[name].shape) != shape:
            raise ValueError(f"tensor {name!r}: shape {list(tensors[name].shape)}, expected {shape}")
        if not np.isfinite(tensors[name]).all():
            raise ValueError(f"tensor {name!r}: holds a non-finite value")
    for name in tensors:
        if name not in want:
            raise ValueError(f"tensor {name!r}: not a tensor of {MODEL}")


def rope_angles(pos, dim, theta):
    return nm.rope_cos_sin(pos, dim, theta)


def rope(x, pos, theta, inverse=False):
    """Interleaved RoPE (pairs x[2i], x[2i+1], angle pos * theta^(-2i/dim)) of the whole last dim;
    inverse: the rotation by -angle (ADR 0018 step 6)."""
    dim = x.shape[-1]
    cos, sin = rope_angles(pos, dim, theta)
    a, b = x[..., 0::2], x[..., 1::2]
    out = torch.empty_like(x)
    if inverse:
        out[..., 0::2] = a * cos + b * sin
        out[..., 1::2] = -a * sin + b * cos
    else:
        out[..., 0::2] = a * cos - b * sin
        out[..., 1::2] = a * sin + b * cos
    return out


def rope_tail(x, pos, theta, n_rope, inverse=False):
    """RoPE on the last n_rope dims of the last axis, the rest unchanged."""
    split = x.shape[-1] - n_rope
    return torch.cat([x[..., :split], rope(x[..., split:], pos, theta, inverse)], dim=-1)


def unweighted_rms(v, eps):
    """v / sqrt(mean(v^2) + eps) per row (step 1's per-head query norm, no weight)."""
    ms = (v * v).sum(dim=-1, keepdim=True) / v.shape[-1]
    return v / torch.sqrt(ms + eps)


def compress(rows_k, rows_s, r, d):
    """Step 3's pooled entry before its norm. rows_k/rows_s: [n, coff*d] state rows of the rows
    the entry reads, oldest first: for r == 4 the previous group's 4 rows (absent for group 0),
    then the group's own 4; else the group's r rows. Per column a softmax over the rows of the
    logits s, weighting the values k."""
    if r == 4:
        own_k, own_s = rows_k[-4:, d:], rows_s[-4:, d:]
        prev_k, prev_s = rows_k[:-4, :d], rows_s[:-4, :d]  # empty for group 0
        k = torch.cat([prev_k, own_k])
        s = torch.cat([prev_s, own_s])
    else:
        k, s = rows_k, rows_s
    w = nm.softmax_columns(s)
    return (w * k).sum(dim=0)


def sink_attention(q, rows, sink, d):
    """Step 5 for all heads: q [H, d], rows [n, d] (dequantized), sink [H]. Returns o [H, d]."""
    s = (rows @ q.T).T / torch.sqrt(torch.tensor(float(d), dtype=q.dtype))  # [H, n]
    m = s.max(dim=1, keepdim=True).values
    e = torch.exp(s - m)
    denom = e.sum(dim=1, keepdim=True) + torch.exp(sink.view(-1, 1) - m)
    return (e / denom) @ rows


def topk_entries(score, k):
    """The min(k, n) highest scores' entries, ascending; equal scores: the lower entry first."""
    order = np.argsort(-score.numpy().astype(np.float64), kind="stable")[:k]
    return sorted(int(t) for t in order)


class Layer:
    """One layer's cache: window rows (v4-fp8 bytes, one per position; only the last W are read),
    compressor state rows (fp32), compressed entries (v4-fp8 bytes), and for CSA the indexer's
    state rows and entries (indexer-mxfp4 or indexer-fp8 bytes)."""

    def __init__(self, ratio):
        self.ratio = ratio
        self.window = []
        self.state_k, self.state_s = [], []
        self.entries = []
        self.istate_k, self.istate_s = [], []
        self.ientries = []


class V4Oracle:
    """One request's forward, one token at a time (positions 0, 1, ...)."""

    def __init__(self, tensors, metadata, kv_format="v4-fp8", indexer_format="indexer-mxfp4",
                 dtype=torch.float32, scale_fmt=None):
        """scale_fmt: indexer-fp8's scale format; None follows the config's (ue8m0)."""
        check_weights(tensors, metadata)
        if kv_format not in KV_FORMATS:
            raise ValueError(f"kv_format: {kv_format!r} (tiny-v4 pages: {', '.join(KV_FORMATS)})")
        if indexer_format not in INDEXER_FORMATS:
            raise ValueError(f"indexer_format: {indexer_format!r} (expected one of {', '.join(INDEXER_FORMATS)})")
        self.cfg = CONFIG
        self.model = MODEL
        self.indexer_format = indexer_format
        self.scale_fmt = CONFIG["scale_fmt"] if scale_fmt is None else scale_fmt
        if self.scale_fmt not in nm.INDEXER_SCALE_FORMATS:
            raise ValueError(f"scale_fmt: {self.scale_fmt!r} (expected one of {', '.join(nm.INDEXER_SCALE_FORMATS)})")
        self.w = {k: torch.from_numpy(np.array(v, dtype=np.float32)).to(dtype) for k, v in tensors.items()}
        self.layers = [Layer(r) for r in self.cfg["ratios"]]
        self.pos = 0
        self.selected = []  # per step, per layer: the entries attended (CSA) or None
        self.forced = None  # per position, per layer: the entries to attend in CSA layers (a dump's)
        self.scores = []  # (layer, position, indexer scores) of every CSA selection
        self.flip = None  # (kind, layer, index, byte), applied once that record exists
        self.flipped = False

    # -- records --------------------------------------------------------------------------------

    def _encode_row(self, v):
        n = self.cfg["head_dim"] - self.cfg["rope"]
        return bytearray(nm.encode_v4fp8(v[:n].float(), v[n:].float()))

    def _encode_ikey(self, ik):
        if self.indexer_format == "indexer-mxfp4":
            return bytearray(nm.encode_mxfp4(ik.float()))
        # The key is the reference's fp4-rounded key (ADR 0018 step 4) whatever stores it; indexer-fp8
        # then stores that as the engines do (ADR 0043): 128 e4m3 and one fp32 scale in the config's
        # scale format (scale_fmt, ue8m0 as DeepSeek's configs set it).
        ik = nm.fp4_round_blocks(ik.float())
        return bytearray(nm.encode_indexer_fp8(ik, self.scale_fmt))

    def _decode_ikey(self, rec):
        n = self.cfg["ihd"]
        if self.indexer_format == "indexer-mxfp4":
            return nm.decode_mxfp4(bytes(rec), n)
        raw = np.frombuffer(bytes(rec), dtype=np.uint8)
        scale = float(raw[n : n + 4].copy().view("<f4")[0])
        return nm.e4m3_decode(torch.from_numpy(raw[:n].astype(np.int64))) * torch.tensor(scale, dtype=torch.float32)

    def set_flip(self, kind, layer, index, byte):
        """XOR 0x01 into byte `byte` of compressed entry `index` of `layer` (kind "entry") or of its
        indexer entry (kind "indexer"), right after the step that writes that record."""
        if kind not in ("entry", "indexer"):
            raise ValueError(f"flip kind {kind!r}: expected entry or indexer")
        if not 0 <= layer < self.cfg["layers"]:
            raise ValueError(f"flip layer {layer}: tiny-v4 has {self.cfg['layers']}")
        r = self.cfg["ratios"][layer]
        if r == 0 or (kind == "indexer" and r != 4):
            raise ValueError(f"flip layer {layer}: ratio {r} has no {kind} records")
        size = nm.V4_RECORD if kind == "entry" else len(self._encode_ikey(torch.zeros(self.cfg["ihd"])))
        if not 0 <= byte < size:
            raise ValueError(f"flip byte {byte}: outside the {size}-byte record")
        if index < 0:
            raise ValueError(f"flip entry {index}: negative")
        self.flip = (kind, layer, index, byte)

    def _apply_flip(self):
        if self.flip is None or self.flipped:
            return
        kind, layer, index, byte = self.flip
        recs = self.layers[layer].entries if kind == "entry" else self.layers[layer].ientries
        if index < len(recs):
            recs[index][byte] ^= 0x01
            self.flipped = True

    # -- the forward ----------------------------------------------------------------------------

    def _compressor(self, prefix, x, pos, r, d, sk, ss, norm_rope, theta):
        """Step 3: appends the token's state row; when it completes a group, returns the entry
        (normed and rotated at the group's first position), else None."""
        w = self.w
        sk.append(w[prefix + "wkv.weight"] @ x)
        ss.append(w[prefix + "wgate.weight"] @ x + w[prefix + "ape"][pos % r])
        if (pos + 1) % r:
            return None
        g = (pos + 1) // r - 1
        first = (g - 1) * r if r == 4 and g > 0 else g * r
        e = compress(torch.stack(sk[first : pos + 1]), torch.stack(ss[first : pos + 1]), r, d)
        e = nm.rms_norm(e, w[prefix + "norm.weight"], self.cfg["eps"])
        return rope_tail(e, g * r, theta, norm_rope)

    def _select(self, l, x, qr, pos, theta):
        """Step 4: the CSA layer's selected entries (the token's own indexer entry first written)."""
        cfg, w, L = self.cfg, self.w, self.layers[l]
        p = f"layers.{l}.attn.indexer."
        I, ID = cfg["iheads"], cfg["ihd"]
        ik = self._compressor(p + "compressor.", x, pos, 4, ID, L.istate_k, L.istate_s, cfg["rope"], theta)
        if ik is not None:
            L.ientries.append(self._encode_ikey(nm.hadamard_transform(ik)))
        n_c = len(L.ientries)
        if n_c == 0:
            return []
        iq = (w[p + "wq_b.weight"] @ qr).view(I, ID)
        iq = rope_tail(iq, pos, theta, cfg["rope"])
        iq = nm.fp4_round_blocks(nm.hadamard_transform(iq))
        keys = torch.stack([self._decode_ikey(rec) for rec in L.ientries]).to(iq.dtype)  # [n_c, ID]
        c = torch.tensor((1.0 / np.sqrt(ID)) / np.sqrt(I), dtype=torch.float32).to(iq.dtype)
        wj = (w[p + "weights_proj.weight"] @ x) * c
        score = (torch.relu(keys @ iq.T) * wj).sum(dim=1)  # [n_c]
        mine = topk_entries(score, cfg["topk"])
        self.scores.append((l, pos, score))
        if self.forced is None:
            return mine
        theirs = self.forced[pos][l]
        if sorted(set(theirs)) != list(theirs) or len(theirs) != len(mine) or not all(0 <= e < n_c for e in theirs):
            raise ValueError(f"selected[{pos}][{l}]: {theirs!r} is not {len(mine)} distinct ascending entries below {n_c}")
        return list(theirs)

    def _attention(self, l, x, pos):
        cfg, w, L = self.cfg, self.w, self.layers[l]
        H, D, R, eps = cfg["heads"], cfg["head_dim"], cfg["rope"], cfg["eps"]
        r = L.ratio
        theta = cfg["theta"] if r == 0 else cfg["ctheta"]
        p = f"layers.{l}.attn."
        qr = nm.rms_norm(w[p + "wq_a.weight"] @ x, w[p + "q_norm.weight"], eps)
        q = unweighted_rms((w[p + "wq_b.weight"] @ qr).view(H, D), eps)
        q = rope_tail(q, pos, theta, R)
        kv = nm.rms_norm(w[p + "wkv.weight"] @ x, w[p + "kv_norm.weight"], eps)
        L.window.append(self._encode_row(rope_tail(kv, pos, theta, R)))
        chosen = None
        if r > 0:
            e = self._compressor(p + "compressor.", x, pos, r, D, L.state_k, L.state_s, R, theta)
            if e is not None:
                L.entries.append(self._encode_row(e))
            if r == 4:
                chosen = self._select(l, x, qr, pos, theta)
            ids = chosen if r == 4 else list(range(len(L.entries)))
        else:
            ids = []
        first = max(0, pos - cfg["window"] + 1)
        recs = L.window[first : pos + 1] + [L.entries[i] for i in ids]
        rows = torch.stack([nm.decode_v4fp8(rec) for rec in recs]).to(q.dtype)
        o = sink_attention(q, rows, w[p + "attn_sink"], D)
        o = rope_tail(o, pos, theta, R, inverse=True)
        G, OL = cfg["o_groups"], cfg["o_lora"]
        og = o.reshape(G, H // G * D)
        wo_a = w[p + "wo_a.weight"].view(G, OL, H // G * D)
        y = torch.cat([wo_a[g] @ og[g] for g in range(G)])
        return w[p + "wo_b.weight"] @ y, chosen

    def step(self, token):
        cfg, w = self.cfg, self.w
        if not 0 <= token < cfg["vocab"]:
            raise ValueError(f"token {token} outside the vocabulary of {cfg['vocab']}")
        if self.pos >= cfg["max_pos"]:
            raise ValueError(f"position {self.pos} beyond max_position_embeddings")
        pos, eps = self.pos, cfg["eps"]
        h = w["embed.weight"][token].clone()
        chosen = []
        for l in range(cfg["layers"]):
            p = f"layers.{l}."
            a, sel = self._attention(l, nm.rms_norm(h, w[p + "attn_norm.weight"], eps), pos)
            chosen.append(sel)
            h = h + a
            y = nm.rms_norm(h, w[p + "ffn_norm.weight"], eps)
            h = h + w[p + "ffn.w2.weight"] @ (nm.silu(w[p + "ffn.w1.weight"] @ y) * (w[p + "ffn.w3.weight"] @ y))
        self.selected.append(chosen)
        self.pos += 1
        self._apply_flip()  # a record written in this step is corrupted for the steps after it
        return w["head.weight"] @ nm.rms_norm(h, w["norm.weight"], eps)


def greedy(oracle, prompt, steps):
    """Greedy decoding (argmax, lowest id on a tie): (tokens, the logits that chose each new token)."""
    tokens = list(prompt)
    out = []
    for i in range(len(prompt) + steps - 1):
        logits = oracle.step(tokens[i])
        if i >= len(prompt) - 1:
            out.append(logits)
            tokens.append(int(np.argmax(logits.numpy())))
    return tokens, out
