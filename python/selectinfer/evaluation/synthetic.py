"""Random-weight GGUF models of a chosen shape.

Tests use tiny ones (a few layers, small vocabulary, fixed seeds) to compare the engine with an
independent numpy forward pass; benchmarks use paper-scale shapes, where speed and memory do
not depend on what the weights have learned.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, replace

import numpy as np
from tqdm import tqdm
from gguf import GGMLQuantizationType, GGUFWriter, TokenType

from .. import _native
from ..runtime.paths import atomic_path

CHATML_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


@dataclass(frozen=True)
class ModelShape:
    arch: str = "llama"  # "llama", "qwen2" (q/k/v biases, NeoX RoPE) or "gemma3" (GeGLU, q/k and post norms)
    n_vocab: int = 320
    n_embd: int = 64
    n_ff: int = 96
    n_layer: int = 2
    n_head: int = 4
    n_head_kv: int = 2
    n_ctx_train: int = 512
    rope_freq_base: float = 10000.0
    rms_norm_eps: float = 1e-5
    tied_embeddings: bool = False

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head


SHAPES: dict[str, ModelShape] = {
    "tiny-llama": ModelShape(),
    "tiny-qwen2": ModelShape(arch="qwen2", n_embd=64, n_ff=160, n_layer=3, n_head=8, n_head_kv=2, tied_embeddings=True),
    "tiny-gemma3": ModelShape(arch="gemma3", n_embd=64, n_ff=128, n_layer=3, n_head=4, n_head_kv=1, rms_norm_eps=1e-6,
                              tied_embeddings=True),
    # the default model's shape (SmolLM2-135M): the GPU check's end-to-end tests, where the file cannot travel
    "smollm2-135m": ModelShape(n_vocab=49152, n_embd=576, n_ff=1536, n_layer=30, n_head=9, n_head_kv=3,
                               n_ctx_train=8192, rope_freq_base=100000.0, tied_embeddings=True),
    # paper-scale shapes (random weights measure speed and memory honestly)
    "llama-3.2-1b": ModelShape(n_vocab=128256, n_embd=2048, n_ff=8192, n_layer=16, n_head=32, n_head_kv=8,
                               n_ctx_train=131072, rope_freq_base=500000.0, tied_embeddings=True),
    "llama-3.2-3b": ModelShape(n_vocab=128256, n_embd=3072, n_ff=8192, n_layer=28, n_head=24, n_head_kv=8,
                               n_ctx_train=131072, rope_freq_base=500000.0, tied_embeddings=True),
    "qwen2.5-3b": ModelShape(arch="qwen2", n_vocab=151936, n_embd=2048, n_ff=11008, n_layer=36, n_head=16,
                             n_head_kv=2, n_ctx_train=32768, rope_freq_base=1000000.0, rms_norm_eps=1e-6,
                             tied_embeddings=True),
}

WEIGHT_TYPES = {name: GGMLQuantizationType[name] for name in ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q4_K", "Q6_K")}


def tokenizer_vocab(n_vocab: int) -> tuple[list[str], list[float], list[int]]:
    """A SentencePiece-style vocabulary: specials, 256 byte tokens, a few merges, fillers."""
    tokens = ["<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"]
    types = [TokenType.UNKNOWN, TokenType.CONTROL, TokenType.CONTROL, TokenType.CONTROL, TokenType.CONTROL]
    tokens += [f"<0x{b:02X}>" for b in range(256)]
    types += [TokenType.BYTE] * 256
    words = ["\u2581", *"abcdefghijklmnopqrstuvwxyz", "\u2581t", "\u2581a", "th", "he", "\u2581the", "in", "er",
             "an", "\u2581of", "on", "\u2581ca", "pi", "tal", "\u2581is"]
    tokens += words
    types += [TokenType.NORMAL] * len(words)
    if n_vocab < len(tokens):
        raise ValueError(f"n_vocab must be at least {len(tokens)}")
    fillers = n_vocab - len(tokens)
    tokens += [f"\u2581w{i}" for i in range(fillers)]
    types += [TokenType.NORMAL] * fillers
    scores = [0.0] * 261 + [-float(i) for i in range(len(words))] + [-1000.0 - i for i in range(fillers)]
    return tokens, scores, [int(t) for t in types]


def tensor_shapes(shape: ModelShape) -> dict[str, tuple[int, ...]]:
    """GGUF tensor names and numpy shapes; matrices as (out_features, in_features)."""
    e, hd = shape.n_embd, shape.head_dim
    t = {"token_embd.weight": (shape.n_vocab, e)}
    for i in range(shape.n_layer):
        p = f"blk.{i}."
        t[p + "attn_norm.weight"] = (e,)
        t[p + "attn_q.weight"] = (shape.n_head * hd, e)
        t[p + "attn_k.weight"] = (shape.n_head_kv * hd, e)
        t[p + "attn_v.weight"] = (shape.n_head_kv * hd, e)
        if shape.arch == "qwen2":
            for name, n in (("q", shape.n_head), ("k", shape.n_head_kv), ("v", shape.n_head_kv)):
                t[p + f"attn_{name}.bias"] = (n * hd,)
        t[p + "attn_output.weight"] = (e, shape.n_head * hd)
        if shape.arch == "gemma3":  # each head's q and k normalised; a norm after attention and after the FFN
            t[p + "attn_q_norm.weight"] = (hd,)
            t[p + "attn_k_norm.weight"] = (hd,)
            t[p + "post_attention_norm.weight"] = (e,)
        t[p + "ffn_norm.weight"] = (e,)
        t[p + "ffn_gate.weight"] = (shape.n_ff, e)
        t[p + "ffn_up.weight"] = (shape.n_ff, e)
        t[p + "ffn_down.weight"] = (e, shape.n_ff)
        if shape.arch == "gemma3":
            t[p + "post_ffw_norm.weight"] = (e,)
    t["output_norm.weight"] = (e,)
    if not shape.tied_embeddings:
        t["output.weight"] = (shape.n_vocab, e)
    return t


def random_tensor(name: str, dims: tuple[int, ...], seed: int, index: int) -> np.ndarray:
    """One float32 tensor, seeded by (seed, index) so tensors can be made in any order, one at a time:
    embeddings N(0, 1), matrices N(0, 1/fan_in), norms 1 + N(0, 0.01), biases N(0, 0.01)."""
    rng = np.random.default_rng([seed, index])
    values = rng.standard_normal(dims, dtype=np.float32)
    if name.endswith("norm.weight"):
        return 1.0 + 0.1 * values
    if name.endswith(".bias"):
        return 0.1 * values
    if name == "token_embd.weight":
        return values
    values *= np.float32(1.0 / np.sqrt(dims[1]))
    return values


def _stored(dims: tuple[int, ...], qtype: GGMLQuantizationType) -> tuple[tuple[int, ...], np.dtype, int, bool]:
    """How a float tensor is stored: (numpy shape to declare, dtype, bytes, quantized?)."""
    if len(dims) == 1 or qtype == GGMLQuantizationType.F32:
        return dims, np.dtype(np.float32), 4 * int(np.prod(dims)), False
    if qtype == GGMLQuantizationType.F16:
        return dims, np.dtype(np.float16), 2 * int(np.prod(dims)), False
    row = _native.row_bytes(int(qtype), dims[1])
    return (dims[0], row), np.dtype(np.uint8), dims[0] * row, True


def _encode(values: np.ndarray, qtype: GGMLQuantizationType) -> np.ndarray:
    if values.ndim == 1 or qtype == GGMLQuantizationType.F32:
        return values.astype(np.float32, copy=False)
    if qtype == GGMLQuantizationType.F16:
        return values.astype(np.float16)
    return _native.quantize_rows(int(qtype), values)  # ggml's own quantizer


def write_gguf(path: str | os.PathLike, shape: ModelShape, weights: dict[str, np.ndarray] | None = None,
               weight_type: str = "F32", chat_template: str | None = CHATML_TEMPLATE, seed: int = 0,
               progress: bool = False) -> None:
    """Writes a GGUF llama.cpp can load: hyperparameters, tokenizer, and the weights with every
    matrix stored as `weight_type` (1-D tensors stay F32). Without `weights`, random weights are
    made and written one tensor at a time, so paper-scale models need little memory."""
    if weight_type not in WEIGHT_TYPES:
        raise ValueError(f"weight_type must be one of {', '.join(WEIGHT_TYPES)}, got {weight_type!r}")
    qtype = WEIGHT_TYPES[weight_type]
    dims_of = {name: tuple(v.shape) for name, v in weights.items()} if weights is not None else tensor_shapes(shape)
    with atomic_path(path) as tmp:
        writer = GGUFWriter(str(tmp), shape.arch)
        writer.add_name(f"selectinfer-random-{shape.arch}")
        writer.add_context_length(shape.n_ctx_train)
        writer.add_embedding_length(shape.n_embd)
        writer.add_feed_forward_length(shape.n_ff)
        writer.add_block_count(shape.n_layer)
        writer.add_head_count(shape.n_head)
        writer.add_head_count_kv(shape.n_head_kv)
        writer.add_rope_freq_base(shape.rope_freq_base)
        writer.add_layer_norm_rms_eps(shape.rms_norm_eps)
        tokens, scores, types = tokenizer_vocab(shape.n_vocab)
        writer.add_tokenizer_model("llama")
        writer.add_token_list(tokens)
        writer.add_token_scores(scores)
        writer.add_token_types(types)
        writer.add_unk_token_id(0)
        writer.add_bos_token_id(1)
        writer.add_eos_token_id(2)
        writer.add_add_bos_token(True)
        if chat_template:
            writer.add_chat_template(chat_template)
        for name, dims in dims_of.items():
            declared, dtype, nbytes, quantized = _stored(dims, qtype)
            writer.add_tensor_info(name, declared, dtype, nbytes, raw_dtype=qtype if quantized else None)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        for i, (name, dims) in enumerate(tqdm(dims_of.items(), desc="write", unit="tensor", disable=not progress)):
            values = weights[name] if weights is not None else random_tensor(name, dims, seed, i)
            writer.write_tensor_data(_encode(values, qtype))
        writer.close()


def make_model(path: str | os.PathLike, name_or_shape: str | ModelShape = "tiny-llama", *, weight_type: str = "F32",
               seed: int = 0, progress: bool = False, **overrides) -> ModelShape:
    """Writes a random-weight model of a named (or given) shape; returns the shape."""
    shape = SHAPES[name_or_shape] if isinstance(name_or_shape, str) else name_or_shape
    shape = replace(shape, **overrides)
    write_gguf(path, shape, None, weight_type, seed=seed, progress=progress)
    return shape
