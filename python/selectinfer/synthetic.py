"""Random-weight GGUF models of a chosen shape.

Tests use tiny ones (a few layers, small vocabulary, fixed seeds) to compare the engine with an
independent numpy forward pass; benchmarks use paper-scale shapes, where speed and memory do
not depend on what the weights have learned.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, replace

import numpy as np
from gguf import GGMLQuantizationType, GGUFWriter, TokenType

from . import _native
from .paths import atomic_path

CHATML_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


@dataclass(frozen=True)
class ModelShape:
    arch: str = "llama"  # "llama" or "qwen2" (qwen2 adds q/k/v biases and uses NeoX RoPE)
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


def random_weights(shape: ModelShape, seed: int = 0) -> dict[str, np.ndarray]:
    """float32 weights by GGUF tensor name; matrices as (out_features, in_features)."""
    rng = np.random.default_rng(seed)

    def matrix(rows: int, cols: int) -> np.ndarray:
        return (rng.standard_normal((rows, cols)) / np.sqrt(cols)).astype(np.float32)

    def norm(n: int) -> np.ndarray:
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    e, hd = shape.n_embd, shape.head_dim
    w = {"token_embd.weight": rng.standard_normal((shape.n_vocab, e)).astype(np.float32)}
    for i in range(shape.n_layer):
        p = f"blk.{i}."
        w[p + "attn_norm.weight"] = norm(e)
        w[p + "attn_q.weight"] = matrix(shape.n_head * hd, e)
        w[p + "attn_k.weight"] = matrix(shape.n_head_kv * hd, e)
        w[p + "attn_v.weight"] = matrix(shape.n_head_kv * hd, e)
        if shape.arch == "qwen2":
            for t, n in (("q", shape.n_head), ("k", shape.n_head_kv), ("v", shape.n_head_kv)):
                w[p + f"attn_{t}.bias"] = (0.1 * rng.standard_normal(n * hd)).astype(np.float32)
        w[p + "attn_output.weight"] = matrix(e, shape.n_head * hd)
        w[p + "ffn_norm.weight"] = norm(e)
        w[p + "ffn_gate.weight"] = matrix(shape.n_ff, e)
        w[p + "ffn_up.weight"] = matrix(shape.n_ff, e)
        w[p + "ffn_down.weight"] = matrix(e, shape.n_ff)
    w["output_norm.weight"] = norm(e)
    if not shape.tied_embeddings:
        w["output.weight"] = matrix(shape.n_vocab, e)
    return w


def write_gguf(path: str | os.PathLike, shape: ModelShape, weights: dict[str, np.ndarray],
               weight_type: str = "F32", chat_template: str | None = CHATML_TEMPLATE) -> None:
    """Writes a GGUF llama.cpp can load: hyperparameters, tokenizer, and the weights with every
    matrix stored as `weight_type` (1-D tensors stay F32)."""
    if weight_type not in WEIGHT_TYPES:
        raise ValueError(f"weight_type must be one of {', '.join(WEIGHT_TYPES)}, got {weight_type!r}")
    qtype = WEIGHT_TYPES[weight_type]
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
        for name, value in weights.items():
            if value.ndim == 2 and qtype == GGMLQuantizationType.F16:
                writer.add_tensor(name, value.astype(np.float16))
            elif value.ndim == 2 and qtype != GGMLQuantizationType.F32:  # with ggml's own quantizer
                writer.add_tensor(name, _native.quantize_rows(int(qtype), value), raw_dtype=qtype)
            else:
                writer.add_tensor(name, value.astype(np.float32))
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()


def make_model(path: str | os.PathLike, name_or_shape: str | ModelShape = "tiny-llama", *, weight_type: str = "F32",
               seed: int = 0, **overrides) -> ModelShape:
    """Writes a random-weight model of a named (or given) shape; returns the shape."""
    shape = SHAPES[name_or_shape] if isinstance(name_or_shape, str) else name_or_shape
    shape = replace(shape, **overrides)
    write_gguf(path, shape, random_weights(shape, seed), weight_type)
    return shape
