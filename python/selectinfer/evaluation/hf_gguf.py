"""A minimal Hugging Face -> GGUF weight mapping for llama and qwen2 checkpoints (F32).

Enough to write the same weights for both profilers in tests and for small experiments; real
models are converted with llama.cpp's own tools.
"""
from __future__ import annotations

import os

import numpy as np

from .synthetic import ModelShape, write_gguf

_LAYER_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.o_proj.weight": "attn_output.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}


def _rope_pairs_interleaved(w: np.ndarray, n_head: int) -> np.ndarray:
    """HF rotates halves of each head (rotate_half); llama.cpp's llama RoPE rotates adjacent pairs.
    Reorder each head's rows (i, i + d/2) -> (2i, 2i + 1) so both compute the same thing."""
    rows = w.shape[0]
    return w.reshape(n_head, 2, rows // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def hf_to_gguf(model, path: str | os.PathLike) -> ModelShape:
    """Writes a transformers LlamaForCausalLM / Qwen2ForCausalLM as an F32 GGUF (synthetic vocabulary)."""
    config = model.config
    arch = {"llama": "llama", "qwen2": "qwen2"}.get(config.model_type)
    if arch is None:
        raise ValueError(f"unsupported model type '{config.model_type}' (llama and qwen2 are)")
    rope = getattr(config, "rope_theta", None) or (getattr(config, "rope_parameters", None) or {}).get("rope_theta")
    shape = ModelShape(arch=arch, n_vocab=config.vocab_size, n_embd=config.hidden_size, n_ff=config.intermediate_size,
                       n_layer=config.num_hidden_layers, n_head=config.num_attention_heads,
                       n_head_kv=config.num_key_value_heads, n_ctx_train=config.max_position_embeddings,
                       rope_freq_base=float(rope or 10000.0), rms_norm_eps=config.rms_norm_eps,
                       tied_embeddings=bool(config.tie_word_embeddings))
    state = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
    weights = {"token_embd.weight": state["model.embed_tokens.weight"]}
    for i in range(shape.n_layer):
        for hf, gg in _LAYER_NAMES.items():
            key = f"model.layers.{i}.{hf}"
            if key not in state:
                continue
            w = state[key]
            if arch == "llama" and hf.startswith(("self_attn.q_proj", "self_attn.k_proj")):
                w = _rope_pairs_interleaved(w, shape.n_head if "q_proj" in hf else shape.n_head_kv)
            weights[f"blk.{i}.{gg}"] = w
    weights["output_norm.weight"] = state["model.norm.weight"]
    if not shape.tied_embeddings:
        weights["output.weight"] = state["lm_head.weight"]
    write_gguf(path, shape, {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in weights.items()})
    return shape
