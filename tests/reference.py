"""An independent numpy forward pass of llama, qwen2 and gemma3 GGUF models, in float64.

It reads the GGUF with the gguf package (dequantizing with gguf.quants), not with the engine, and
follows the llama.cpp graph semantics: RMSNorm, RoPE (adjacent pairs for llama, halves for
qwen2/gemma3: NeoX), causal grouped-query attention, SwiGLU FFN, tied or separate output matrix.
gemma3 adds: embeddings scaled by sqrt(n_embd), RMSNorm of each head's q and k, RMSNorm after
attention and after the FFN (before their residual adds), and a GeGLU FFN (tanh GELU).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize


@dataclass
class ReferenceModel:
    arch: str
    n_layer: int
    n_head: int
    n_head_kv: int
    rope_base: float
    eps: float
    weights: dict[str, np.ndarray]

    @classmethod
    def load(cls, path) -> "ReferenceModel":
        reader = GGUFReader(str(path))
        arch = _field(reader, "general.architecture")
        weights, down_parts = {}, {}
        for t in reader.tensors:
            shape = tuple(int(d) for d in reversed(t.shape))  # ggml ne -> numpy (rows, cols)
            w = np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float64).reshape(shape)
            # SelectInfer layout: the static neurons' columns of ffn_down, the others' rows transposed
            if t.name.endswith(".ffn_down_static.weight"):
                down_parts.setdefault(t.name.replace("ffn_down_static", "ffn_down"), {})[0] = w
            elif t.name.endswith(".ffn_down_t.weight"):
                down_parts.setdefault(t.name.replace("ffn_down_t", "ffn_down"), {})[1] = w.T
            else:
                weights[t.name] = w
        for name, parts in down_parts.items():  # [n_embd, n_load], neurons in the file's order
            weights[name] = np.concatenate([parts[k] for k in sorted(parts)], axis=1)
        return cls(
            arch=arch,
            n_layer=int(_field(reader, f"{arch}.block_count")),
            n_head=int(_field(reader, f"{arch}.attention.head_count")),
            n_head_kv=int(_field(reader, f"{arch}.attention.head_count_kv")),
            rope_base=float(_field(reader, f"{arch}.rope.freq_base")),
            eps=float(_field(reader, f"{arch}.attention.layer_norm_rms_epsilon")),
            weights=weights,
        )

    # --- the forward pass, step by step (tests that change the FFN use the steps) -------------
    def forward(self, tokens: list[int]) -> np.ndarray:
        """Logits after each token: shape (len(tokens), n_vocab)."""
        x = self.embed(tokens)
        positions = np.arange(len(tokens))
        for il in range(self.n_layer):
            x = self.attention_block(x, il, positions)
            x = self.ffn_block(x, il, self.ffn_activations(self.ffn_input(x, il), il))
        return self.logits(x)

    def embed(self, tokens) -> np.ndarray:
        x = self.weights["token_embd.weight"][np.asarray(tokens)]
        return x * np.sqrt(x.shape[1]) if self.arch == "gemma3" else x

    def attention_block(self, x: np.ndarray, il: int, positions: np.ndarray) -> np.ndarray:
        """The residual stream after layer il's attention."""
        p = f"blk.{il}."
        out = self._attention(rms_norm(x, self.weights[p + "attn_norm.weight"], self.eps), p, positions)
        if self.arch == "gemma3":
            out = rms_norm(out, self.weights[p + "post_attention_norm.weight"], self.eps)
        return x + out

    def ffn_input(self, x: np.ndarray, il: int) -> np.ndarray:
        return rms_norm(x, self.weights[f"blk.{il}.ffn_norm.weight"], self.eps)

    def gate_up(self, h: np.ndarray, il: int) -> tuple[np.ndarray, np.ndarray]:
        p = f"blk.{il}."
        return h @ self.weights[p + "ffn_gate.weight"].T, h @ self.weights[p + "ffn_up.weight"].T

    def act(self, gate: np.ndarray) -> np.ndarray:
        """The gated activation of the architecture's FFN."""
        return gelu(gate) if self.arch == "gemma3" else silu(gate)

    def ffn_activations(self, h: np.ndarray, layer: int) -> np.ndarray:
        """Input of the down projection, act(gate(h)) * up(h): shape (tokens, n_ff)."""
        gate, up = self.gate_up(h, layer)
        return self.act(gate) * up

    def ffn_block(self, x: np.ndarray, il: int, act: np.ndarray) -> np.ndarray:
        """The residual stream after layer il's FFN, given the down projection's input act."""
        p = f"blk.{il}."
        out = act @ self.weights[p + "ffn_down.weight"].T
        if self.arch == "gemma3":
            out = rms_norm(out, self.weights[p + "post_ffw_norm.weight"], self.eps)
        return x + out

    def ffn(self, h: np.ndarray, layer: int) -> np.ndarray:
        return self.ffn_activations(h, layer) @ self.weights[f"blk.{layer}.ffn_down.weight"].T

    def logits(self, x: np.ndarray) -> np.ndarray:
        x = rms_norm(x, self.weights["output_norm.weight"], self.eps)
        out = self.weights.get("output.weight", self.weights["token_embd.weight"])
        return x @ out.T

    def _attention(self, h: np.ndarray, p: str, positions: np.ndarray) -> np.ndarray:
        w = self.weights
        n_tok = h.shape[0]

        def proj(name: str, n_heads: int) -> np.ndarray:
            y = h @ w[p + f"attn_{name}.weight"].T
            if p + f"attn_{name}.bias" in w:
                y = y + w[p + f"attn_{name}.bias"]
            return y.reshape(n_tok, n_heads, -1)

        q, k, v = proj("q", self.n_head), proj("k", self.n_head_kv), proj("v", self.n_head_kv)
        if self.arch == "gemma3":  # each head's q and k normalised
            q = rms_norm(q, w[p + "attn_q_norm.weight"], self.eps)
            k = rms_norm(k, w[p + "attn_k_norm.weight"], self.eps)
        neox = self.arch in ("qwen2", "gemma3")
        q, k = rope(q, positions, self.rope_base, neox), rope(k, positions, self.rope_base, neox)
        group = self.n_head // self.n_head_kv
        head_dim = q.shape[-1]
        mask = np.triu(np.full((n_tok, n_tok), -np.inf), k=1)
        out = np.empty_like(q)
        for hq in range(self.n_head):
            hk = hq // group
            scores = q[:, hq] @ k[:, hk].T / np.sqrt(head_dim) + mask
            scores = np.exp(scores - scores.max(axis=1, keepdims=True))
            out[:, hq] = (scores / scores.sum(axis=1, keepdims=True)) @ v[:, hk]
        return out.reshape(n_tok, -1) @ w[p + "attn_output.weight"].T


def _field(reader: GGUFReader, key: str):
    field = reader.get_field(key)
    if field is None:
        raise KeyError(key)
    return field.contents()


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * weight


def gelu(x: np.ndarray) -> np.ndarray:
    """GELU, tanh approximation (ggml_gelu, gemma's gelu_pytorch_tanh)."""
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x ** 3)))


def silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def to_bf16(x: np.ndarray) -> np.ndarray:
    """x rounded to bfloat16 (8-bit mantissa), nearest even, as ggml's conversion and the AVX512-BF16
    instructions round finite values; float64 out."""
    bits = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16 << 16
    return bits.astype(np.uint32).view(np.float32).astype(np.float64)


def rope(x: np.ndarray, positions: np.ndarray, base: float, neox: bool) -> np.ndarray:
    """x: (tokens, heads, head_dim). Rotates pairs (2i, 2i+1), or (i, i + d/2) in NeoX mode."""
    d = x.shape[-1]
    theta = positions[:, None] * base ** (-np.arange(0, d, 2) / d)  # (tokens, d/2)
    cos, sin = np.cos(theta)[:, None, :], np.sin(theta)[:, None, :]
    if neox:
        a, b = x[..., : d // 2], x[..., d // 2:]
    else:
        a, b = x[..., 0::2], x[..., 1::2]
    ra, rb = a * cos - b * sin, a * sin + b * cos
    out = np.empty_like(x)
    if neox:
        out[..., : d // 2], out[..., d // 2:] = ra, rb
    else:
        out[..., 0::2], out[..., 1::2] = ra, rb
    return out


# --- the prompt's neuron selection, written plainly ------------------------------------------

def reference_count(act: np.ndarray, alpha: float, by_magnitude: bool, prev: np.ndarray | None = None) -> np.ndarray:
    """Votes of one batch of prompt tokens, act [T, n_load]: each token's top k neurons by value
    (or |value|), k = round(alpha * mean positive activations per token of the batch), ties to the
    lower row, NaN below every number; added to the previous batches' counts `prev`."""
    n_tokens, n_load = act.shape
    k = min(n_load, int(np.floor(alpha * (act > 0).sum() / n_tokens + 0.5)))
    counts = np.zeros(n_load) if prev is None else np.array(prev, dtype=np.float64)
    for t in range(n_tokens):
        v = np.abs(act[t]) if by_magnitude else act[t]
        v = np.where(np.isnan(v), -np.inf, v)
        order = sorted(range(n_load), key=lambda i: (-v[i], i))  # value desc, lower index first
        counts[order[:k]] += 1
    return counts


def reference_choose(counts: np.ndarray, n_static: int, n_dynamic: int) -> list[int]:
    """The static rows, then the n_dynamic most counted others (ties to the lower row), ascending."""
    candidates = sorted(range(n_static, len(counts)), key=lambda i: (-counts[i], i))
    return list(range(n_static)) + sorted(candidates[:n_dynamic])


def reference_sum_magnitude(act: np.ndarray, n_static: int, n_dynamic: int) -> list[int]:
    """The sum-magnitude strategy's selection for a prompt act [T, n_load]: the static rows, then
    the others with the largest sum over the prompt's tokens of |a|."""
    return reference_choose(np.abs(act.astype(np.float64)).sum(axis=0), n_static, n_dynamic)


def reference_select(act: np.ndarray, n_static: int, n_dynamic: int, alpha: float, by_magnitude: bool,
                     n_batch: int | None = None) -> list[int]:
    """The selection of a prompt act [T, n_load] evaluated in batches of n_batch tokens (one batch
    when None): votes counted per batch and added up, then the most counted rows."""
    n_batch = n_batch or act.shape[0]
    counts = None
    for start in range(0, act.shape[0], n_batch):
        counts = reference_count(act[start:start + n_batch], alpha, by_magnitude, counts)
    return reference_choose(counts, n_static, n_dynamic)


# --- per-layer budgets, written plainly ------------------------------------------------------

def reference_uniform_size(phi: float, n_original: int, n_load: int, n_min: int) -> int:
    """phi N in float32, rounded half away from zero, within [n_min, n_load]."""
    wanted = int(np.floor(float(np.float32(phi) * np.float32(n_original)) + 0.5))
    return max(min(n_min, n_load), min(n_load, wanted))


def reference_layer_budgets(layers: list[tuple[int, int, float, list[float]]], phi: float, n_original: int) -> list[int]:
    """The profile's per-layer budgets: layers are (n_load, n_min, bytes per neuron, shares largest
    first). Every layer starts at n_min; then all the other neurons of all layers, by share per byte
    (largest first, ties to the lower layer, then the lower neuron), each taken while the bytes
    stay within what the uniform sizes read."""
    budget = sum(reference_uniform_size(phi, n_original, n, m) * b for n, m, b, _ in layers)
    sizes = [min(m, n) for n, m, _, _ in layers]
    spent = sum(s * b for s, (_, _, b, _) in zip(sizes, layers))
    candidates = sorted((-float(np.float32(shares[r])) / b, il, r)
                        for il, (n, _, b, shares) in enumerate(layers) for r in range(sizes[il], n))
    for _, il, r in candidates:
        b = layers[il][2]
        if r == sizes[il] and spent + b <= budget * (1 + 1e-9):
            sizes[il] += 1
            spent += b
    return sizes


def reference_dropped_means(gate_rms, up_slope, n_kept: int, act=silu, gate_mean=None, up_mean=None,
                            grid=(8.0, 16001), up_rms=None) -> np.ndarray:
    """E[act(g) u | neuron dropped] per neuron (cpp/llama/compensation.h) with g ~ N(mu_g, sigma^2),
    sigma^2 = gate_rms^2 - mu_g^2, E[u | g] = mu_u + b (g - mu_g), b = (up_slope gate_rms^2 - mu_g mu_u)
    / sigma^2 (means 0 when not given), and a neuron dropped where |act(g)| (times up_rms, when
    given) is under the one threshold that keeps n_kept neurons on average: the threshold from every (neuron, grid point)
    sorted by score (by default a finer grid than the engine's: 16001 points on [-8, 8]; `grid` =
    (z_max, points))."""
    z = np.linspace(-grid[0], grid[0], grid[1])
    weight = np.exp(-0.5 * z * z)
    weight /= weight.sum()
    square = np.asarray(gate_rms, dtype=np.float64) ** 2
    mu_g = np.zeros_like(square) if gate_mean is None else np.asarray(gate_mean, dtype=np.float64)
    mu_u = np.zeros_like(square) if up_mean is None else np.asarray(up_mean, dtype=np.float64)
    variance = np.maximum(square - mu_g ** 2, 0.0)
    covariance = np.asarray(up_slope, dtype=np.float64) * square - mu_g * mu_u
    b = np.divide(covariance, variance, out=np.zeros_like(variance), where=variance > 0)
    centered = np.sqrt(variance)[:, None] * z[None, :]
    gate = mu_g[:, None] + centered
    score = np.abs(act(gate))
    if up_rms is not None:
        score = score * np.asarray(up_rms, dtype=np.float64)[:, None]
    order = np.argsort(-score, axis=None, kind="stable")
    kept_mass = np.cumsum(np.broadcast_to(weight, score.shape).ravel()[order])
    theta = score.ravel()[order[np.searchsorted(kept_mass, n_kept)]] if 0 < n_kept < len(gate) else (
        np.inf if n_kept == 0 else 0.0)
    dropped = score < theta
    mass = (dropped * weight).sum(axis=1)
    moment = (dropped * weight * act(gate) * (mu_u[:, None] + b[:, None] * centered)).sum(axis=1)
    return np.divide(moment, mass, out=np.zeros_like(mass), where=mass > 0)
