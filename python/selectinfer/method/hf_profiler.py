"""Profiling Hugging Face checkpoints with transformers (hooks on each `mlp.down_proj` input).

Writes the same profile file as the engine profiler (profiler.py), so a profile can come from
either; tests check that both agree on the same weights. Needs `torch` and `transformers`.
"""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np

from .profiles import ModelInfo
from .tasks import format_prompt


def checkpoint_digest(model_dir: Path) -> str:
    """sha256 over the checkpoint's weight files (sorted by name)."""
    digest = hashlib.sha256()
    files = sorted(model_dir.glob("*.safetensors")) or sorted(model_dir.glob("*.bin"))
    if not files:
        raise FileNotFoundError(f"{model_dir} has no *.safetensors or *.bin weights; is it a Hugging Face checkpoint?")
    for f in files:
        digest.update(f.name.encode())
        with open(f, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()


class TransformersCollector:
    name = "transformers"
    input_moments = False

    def __init__(self, model_dir: str | os.PathLike, *, n_threads: int = 0):
        try:
            import torch
            from transformers import AutoModelForCausalLM, AutoTokenizer
        except ImportError:
            raise ValueError("profiling a Hugging Face checkpoint needs torch and transformers: "
                             "pip install torch transformers") from None
        self.torch = torch
        if n_threads > 0:
            torch.set_num_threads(n_threads)
        model_dir = Path(model_dir)
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        except (OSError, ValueError):
            self.tokenizer = None  # pre-tokenized examples (input_ids) still work
        config = self.model.config
        layers = self.model.model.layers
        self.sums = [torch.zeros(config.intermediate_size, dtype=torch.float64) for _ in layers]
        self.counts = [0] * len(layers)
        for il, layer in enumerate(layers):
            layer.mlp.down_proj.register_forward_pre_hook(self._hook(il))
        self.info = ModelInfo(digest=checkpoint_digest(model_dir), file=model_dir.name,
                              architecture=config.model_type, n_layer=len(layers), n_ff=config.intermediate_size)

    def _hook(self, il: int):
        def hook(module, inputs):
            act = inputs[0].detach()  # [batch, tokens, n_ff]: act(gate) * up
            self.sums[il] += act.abs().sum(dim=(0, 1)).double()
            self.counts[il] += act.shape[0] * act.shape[1]
        return hook

    def _tokens(self, example: dict) -> list[int]:
        if "input_ids" in example:
            return list(example["input_ids"])
        if self.tokenizer is None:
            raise ValueError("this checkpoint has no tokenizer: give examples as input_ids")
        has_chat = getattr(self.tokenizer, "chat_template", None) is not None
        apply = lambda msgs: self.tokenizer.apply_chat_template(  # noqa: E731
            [{"role": r, "content": c} for r, c in msgs], tokenize=False, add_generation_prompt=True)
        text, special = format_prompt(example, has_chat, apply)
        return self.tokenizer(text, add_special_tokens=not special)["input_ids"]

    def collect(self, example: dict, max_new_tokens: int) -> tuple[np.ndarray, int, None]:
        torch = self.torch
        for s in self.sums:
            s.zero_()
        self.counts = [0] * len(self.counts)
        ids = torch.tensor([self._tokens(example)])
        with torch.no_grad():
            if max_new_tokens > 0:
                self.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                                    do_sample=False, pad_token_id=self.model.config.eos_token_id)
            else:
                self.model(ids)
        if len(set(self.counts)) != 1:
            raise RuntimeError(f"layers saw different token counts {set(self.counts)}")
        return torch.stack(self.sums).numpy(), self.counts[0], None
