"""Offline neuron profiling (step 1 of the method).

For every calibration prompt the model reads the prompt and greedily generates up to
`max_new_tokens` more tokens; for every layer and FFN neuron the engine accumulates
sum_t |a_n(t)| over all those tokens (a: input of the down projection) inside its own graph.
Per dataset the sums and token counts add up; the profile stores their ratio.

The loop checkpoints its partial sums next to the output, so an interrupted run resumes where
it stopped, and greedy decoding makes a re-run produce the identical file.
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np
from tqdm import tqdm

from ..runtime.model import Model
from ..runtime.paths import atomic_path, sha256_file
from .profiles import DatasetStats, ModelInfo, Profile
from .tasks import Dataset, format_prompt, load_dataset, sample_examples

DEFAULT_DATASETS = ["capitals-qa", "de-en", "botchan-summ", "botchan"]
CHECKPOINT_EVERY = 8  # prompts


class Collector(Protocol):
    """Runs one example through a model and returns per-layer sum |a| ([n_layer, n_ff]), the tokens,
    and when `input_moments` is set the per-layer sum of h h^T ([n_layer, n_embd, n_embd]) with the
    number of tokens behind it (else None)."""

    info: ModelInfo
    name: str
    input_moments: bool

    def collect(self, example: dict, max_new_tokens: int) -> tuple[np.ndarray, int, tuple | None]:
        ...


class EngineCollector:
    """Profiles a GGUF model with selectinfer's engine (in-graph accumulation, CPU or CUDA)."""

    name = "selectinfer"

    def __init__(self, model_path: str | os.PathLike, *, n_ctx: int = 2048, n_threads: int = 0,
                 input_moments: bool = False):
        self.model = Model(model_path, n_ctx=n_ctx, n_threads=n_threads, profile=True,
                           profile_input_moments=input_moments)
        self.input_moments = input_moments
        self.has_chat_template = self.model.metadata("tokenizer.chat_template") is not None
        layers = self.model.activation_sums(reset=True)[0]
        widths = sorted({len(layer) for layer in layers})
        if len(widths) != 1:
            raise ValueError(f"{model_path}: layers have different FFN widths {widths}; profile the original "
                             "(dense) model, not a converted one")
        self.info = ModelInfo(
            digest=sha256_file(model_path), file=Path(model_path).name,
            architecture=self.model.metadata("general.architecture") or "unknown",
            n_layer=len(layers), n_ff=widths[0])
        self.truncated_prompts = 0

    def collect(self, example: dict, max_new_tokens: int) -> tuple[np.ndarray, int, tuple[np.ndarray, int] | None]:
        m = self.model
        if "input_ids" in example:  # pre-tokenized
            tokens = list(example["input_ids"])
        else:
            text, special = format_prompt(example, self.has_chat_template,
                                          lambda msgs: m.engine.apply_chat_template(msgs, True))
            tokens = m.engine.tokenize(text, True, special)
        room = m.n_ctx - max_new_tokens
        if len(tokens) > room:  # keep the end of an over-long prompt: it is what generation continues
            tokens = tokens[-room:]
            self.truncated_prompts += 1
        m.engine.clear()  # every prompt token must pass through the model, none reused from the cache
        for _ in m.stream(tokens, max_new_tokens, temperature=0):
            pass
        moments = None
        if self.input_moments:  # (the prompt's tokens: see Model.input_moments)
            layers, h_sums, n_moment_tokens = m.input_moments()
            moments = np.stack(layers).astype(np.float64), np.stack(h_sums).astype(np.float64), n_moment_tokens
        sums, n_tokens = m.activation_sums(reset=True)
        return np.stack(sums).astype(np.float64), n_tokens, moments


@dataclass
class _Partial:
    sums: np.ndarray  # float64 [n_layer, n_ff]
    tokens: int = 0
    done: int = 0
    moments: np.ndarray | None = None  # float64 [n_layer, n_embd, n_embd], sum of h h^T, when collected
    h_sums: np.ndarray | None = None   # float64 [n_layer, n_embd], sum of h over the same tokens
    moment_tokens: int = 0             # the tokens behind them


def _run_key(info: ModelInfo, datasets: list[Dataset], settings: dict) -> str:
    """Identifies a profiling run: a checkpoint is resumed only by the same run."""
    ids = [[d.name, d.task, [ex["id"] for ex in d.examples]] for d in datasets]
    blob = json.dumps([vars(info), ids, settings], sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()


def _save_checkpoint(path: Path, key: str, partials: dict[str, _Partial]) -> None:
    arrays = {"key": np.frombuffer(key.encode(), dtype=np.uint8)}
    for name, p in partials.items():
        arrays[f"sums/{name}"] = p.sums
        arrays[f"count/{name}"] = np.array([p.tokens, p.done], dtype=np.int64)
        if p.moments is not None:
            arrays[f"moments/{name}"] = p.moments
            arrays[f"h_sums/{name}"] = p.h_sums
            arrays[f"moment_tokens/{name}"] = np.array([p.moment_tokens], dtype=np.int64)
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as f:
            np.savez(f, **arrays)


def _load_checkpoint(path: Path, key: str, partials: dict[str, _Partial]) -> bool:
    try:
        with np.load(path) as data:
            if data["key"].tobytes().decode() != key:
                return False
            for name, p in partials.items():
                p.sums = data[f"sums/{name}"]
                p.tokens, p.done = (int(v) for v in data[f"count/{name}"])
                if f"moments/{name}" in data:
                    p.moments = data[f"moments/{name}"]
                    p.h_sums = data[f"h_sums/{name}"]
                    p.moment_tokens = int(data[f"moment_tokens/{name}"][0])
    except (OSError, KeyError, ValueError):
        return False
    return True


def run_profile(collector: Collector, datasets: list[Dataset], output: str | os.PathLike, *,
                max_new_tokens: int = 128, resume: bool = True, progress: bool = True) -> Profile:
    """Profiles `datasets` (their calibration examples, already limited) and writes `output`."""
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    if not datasets:
        raise ValueError("no datasets to profile")
    names = [d.name for d in datasets]
    if len(set(names)) != len(names):
        raise ValueError(f"dataset names must be unique, got {names}")
    output = Path(output)
    checkpoint = output.with_name(output.name + ".partial.npz")
    info = collector.info
    settings = {"profiler": collector.name, "max_new_tokens": max_new_tokens, "decoding": "greedy",
                "split": "calibration", "input_moments": collector.input_moments,
                "input_means": collector.input_moments}  # (a checkpoint from before the means is not resumed)
    key = _run_key(info, datasets, settings)
    partials = {d.name: _Partial(np.zeros((info.n_layer, info.n_ff))) for d in datasets}
    if resume and checkpoint.exists() and _load_checkpoint(checkpoint, key, partials):
        print(f"resuming from {checkpoint}", flush=True)

    total = sum(len(d.examples) for d in datasets)
    bar = tqdm(total=total, initial=sum(p.done for p in partials.values()), unit="prompt", desc="profile",
               disable=not progress)
    since_checkpoint = 0
    for d in datasets:
        p = partials[d.name]
        for example in d.examples[p.done:]:
            bar.set_postfix_str(d.name)
            sums, n_tokens, moments = collector.collect(example, max_new_tokens)
            p.sums += sums
            if moments is not None:
                p.moments = moments[0] if p.moments is None else p.moments + moments[0]
                p.h_sums = moments[1] if p.h_sums is None else p.h_sums + moments[1]
                p.moment_tokens += moments[2]
            p.tokens += n_tokens
            p.done += 1
            bar.update(1)
            since_checkpoint += 1
            if since_checkpoint >= CHECKPOINT_EVERY:
                _save_checkpoint(checkpoint, key, partials)
                since_checkpoint = 0
    bar.close()

    stats = []
    for d in datasets:
        p = partials[d.name]
        if p.tokens == 0:
            raise ValueError(f"dataset '{d.name}' produced no tokens")
        stats.append(DatasetStats(d.name, d.task, d.source, p.done, (p.sums / p.tokens).astype(np.float32),
                                  np.full(info.n_layer, p.tokens, dtype=np.int64)))
    moments, means = _mean_input_moments(partials.values())
    profile = Profile(info, stats, settings, input_moments=moments, input_means=means)
    profile.save(output)
    checkpoint.unlink(missing_ok=True)
    return profile


def _mean_input_moments(partials) -> tuple[np.ndarray | None, np.ndarray | None]:
    """(E[h h^T], E[h]) per layer over the prompt tokens of every dataset (None when not collected)."""
    partials = [p for p in partials if p.moments is not None]
    if not partials:
        return None, None
    n_tokens = sum(p.moment_tokens for p in partials)
    if n_tokens == 0:
        raise ValueError("no prompt of more than one token: the FFN input moments have no tokens")
    return ((sum(p.moments for p in partials) / n_tokens).astype(np.float32),
            (sum(p.h_sums for p in partials) / n_tokens).astype(np.float32))


def profile_model(model_path: str | os.PathLike, dataset_specs: list[str] | None, output: str | os.PathLike, *,
                  max_prompts: int = 40, max_new_tokens: int = 128, n_ctx: int = 2048, n_threads: int = 0,
                  resume: bool = True, progress: bool = True, input_moments: bool = False) -> Profile:
    """Profiles a GGUF file (with the engine) or a Hugging Face checkpoint folder (with
    transformers) over built-in or user data sets (see tasks.load_dataset). input_moments: also
    E[h h^T] of each layer's FFN input (n_embd^2 floats per layer), which the converter's gate
    predictor needs (GGUF files only)."""
    if max_prompts < 1:
        raise ValueError(f"max_prompts must be >= 1, got {max_prompts}")
    datasets = [load_dataset(spec) for spec in (dataset_specs or DEFAULT_DATASETS)]
    for d in datasets:
        d.examples = sample_examples(d.examples, max_prompts)
    if Path(model_path).is_dir():
        from .hf_profiler import TransformersCollector

        if input_moments:
            raise ValueError("FFN input moments are collected by the engine only: profile the GGUF file")
        collector = TransformersCollector(model_path, n_threads=n_threads)
    else:
        collector = EngineCollector(model_path, n_ctx=n_ctx, n_threads=n_threads, input_moments=input_moments)
    return run_profile(collector, datasets, output, max_new_tokens=max_new_tokens, resume=resume, progress=progress)
