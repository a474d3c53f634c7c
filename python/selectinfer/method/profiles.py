"""The profile file: per-dataset neuron statistics of one model, and the rankings made from them.

One safetensors file, self-describing:
  tensors   mean_abs/<dataset>  float32 [n_layer, n_ff]  sum_t |a_n(t)| / #tokens, per layer and neuron
            n_tokens/<dataset>  int64   [n_layer]        tokens behind each layer's means
            input_moments       float32 [n_layer, n_embd, n_embd]  optional: sum_t h(t) h(t)^T / #tokens over
                                every profiled token, h the layer's FFN input (after ffn_norm); the
                                converter's gate predictor whitens with it
            input_means         float32 [n_layer, n_embd]  optional, with input_moments: sum_t h(t) / #tokens
                                over the same tokens (the compensation's gate and up means)
  metadata  "selectinfer.profile" = JSON: format version, model (digest, file, architecture, n_layer,
            n_ff), datasets (name, task, source, prompts), settings (profiler, max_new_tokens, ...)

Merging follows the reference code: each dataset is normalised by its token count (the mean),
a task's *base* scores are the mean over its datasets, and the *secondary* (model-wide) scores
are the mean over tasks. Rankings sort by score, highest first, ties broken by lower neuron id.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..runtime.paths import atomic_path

FORMAT = "selectinfer-profile"
FORMAT_VERSION = 1
META_KEY = "selectinfer.profile"
MOMENTS_TENSOR = "input_moments"  # optional: old profiles lack it, so FORMAT_VERSION stays 1
MEANS_TENSOR = "input_means"      # optional, with MOMENTS_TENSOR (profiles before it lack it)


class ProfileError(ValueError):
    """A profile file that is malformed or does not belong to the model at hand."""


@dataclass
class ModelInfo:
    digest: str  # sha256 of the model file(s)
    file: str
    architecture: str
    n_layer: int
    n_ff: int


@dataclass
class DatasetStats:
    name: str
    task: str
    source: str
    n_prompts: int
    mean_abs: np.ndarray  # [n_layer, n_ff]
    n_tokens: np.ndarray  # [n_layer]


@dataclass
class Profile:
    model: ModelInfo
    datasets: list[DatasetStats]
    settings: dict = field(default_factory=dict)
    input_moments: np.ndarray | None = None  # float32 [n_layer, n_embd, n_embd], E[h h^T] of each FFN input
    input_means: np.ndarray | None = None    # float32 [n_layer, n_embd], E[h] over the same tokens

    # --- merging ------------------------------------------------------------------------------
    def tasks(self) -> list[str]:
        return sorted({d.task for d in self.datasets})

    def task_scores(self, task: str) -> np.ndarray:
        """Base scores of a task: mean over its datasets of the per-dataset mean |a|."""
        members = [d.mean_abs for d in self.datasets if d.task == task]
        if not members:
            raise ProfileError(f"the profile has no dataset of task '{task}'; it has: {', '.join(self.tasks())}")
        return np.mean(np.stack(members), axis=0)

    def model_scores(self) -> np.ndarray:
        """Secondary (model-wide) scores: mean over tasks of the task scores."""
        return np.mean(np.stack([self.task_scores(t) for t in self.tasks()]), axis=0)

    # --- checks -------------------------------------------------------------------------------
    def check_model(self, digest: str, n_layer: int, n_ff: int) -> None:
        if (n_layer, n_ff) != (self.model.n_layer, self.model.n_ff):
            raise ProfileError(f"the profile is of a model with {self.model.n_layer} layers x {self.model.n_ff} FFN "
                               f"neurons ({self.model.file}), not {n_layer} x {n_ff}; profile this model first")
        if digest != self.model.digest:
            raise ProfileError(f"the profile was made on another model file ({self.model.file}, sha256 "
                               f"{self.model.digest[:12]}...); profile this model first")

    # --- file ---------------------------------------------------------------------------------
    def save(self, path: str | os.PathLike) -> None:
        from safetensors.numpy import save_file

        tensors, meta_datasets = {}, []
        for d in self.datasets:
            tensors[f"mean_abs/{d.name}"] = np.ascontiguousarray(d.mean_abs, dtype=np.float32)
            tensors[f"n_tokens/{d.name}"] = np.ascontiguousarray(d.n_tokens, dtype=np.int64)
            meta_datasets.append({"name": d.name, "task": d.task, "source": d.source, "n_prompts": d.n_prompts})
        if self.input_moments is not None:
            tensors[MOMENTS_TENSOR] = np.ascontiguousarray(self.input_moments, dtype=np.float32)
            if self.input_means is not None:
                tensors[MEANS_TENSOR] = np.ascontiguousarray(self.input_means, dtype=np.float32)
        meta = {"format": FORMAT, "version": FORMAT_VERSION, "model": vars(self.model), "datasets": meta_datasets,
                "settings": self.settings}
        with atomic_path(path) as tmp:
            save_file(tensors, str(tmp), metadata={META_KEY: json.dumps(meta, sort_keys=True)})

    @classmethod
    def load(cls, path: str | os.PathLike) -> "Profile":
        from safetensors import SafetensorError
        from safetensors.numpy import safe_open

        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"profile not found: {path} (make one with `selectinfer profile`)")
        try:
            with safe_open(str(path), "np") as f:
                raw = (f.metadata() or {}).get(META_KEY)
                if raw is None:
                    raise ProfileError(f"{path} is not a selectinfer profile (no '{META_KEY}' metadata)")
                meta = json.loads(raw)
                if meta.get("format") != FORMAT or meta.get("version") != FORMAT_VERSION:
                    raise ProfileError(f"{path}: unsupported profile format {meta.get('format')} "
                                       f"v{meta.get('version')}; this selectinfer reads v{FORMAT_VERSION}")
                model = ModelInfo(**meta["model"])
                datasets = [DatasetStats(d["name"], d["task"], d["source"], d["n_prompts"],
                                         f.get_tensor(f"mean_abs/{d['name']}"), f.get_tensor(f"n_tokens/{d['name']}"))
                            for d in meta["datasets"]]
                moments = f.get_tensor(MOMENTS_TENSOR) if MOMENTS_TENSOR in f.keys() else None
                means = f.get_tensor(MEANS_TENSOR) if MEANS_TENSOR in f.keys() else None
        except (SafetensorError, OSError, json.JSONDecodeError, KeyError, TypeError) as e:
            raise ProfileError(f"{path} is not a readable selectinfer profile ({e}); profile the model again") from None
        for d in datasets:
            if d.mean_abs.shape != (model.n_layer, model.n_ff) or d.n_tokens.shape != (model.n_layer,):
                raise ProfileError(f"{path}: dataset '{d.name}' has shape {d.mean_abs.shape}, expected "
                                   f"{(model.n_layer, model.n_ff)}; the file is corrupt")
        if moments is not None:
            _check_moments(path, moments, model.n_layer)
            moments = moments.astype(np.float32, copy=False)
        if means is not None:
            _check_means(path, means, moments)
            means = means.astype(np.float32, copy=False)
        return cls(model, datasets, meta.get("settings", {}), moments, means)


def _check_moments(path: Path, moments: np.ndarray, n_layer: int) -> None:
    """input_moments must be [n_layer, n_embd, n_embd] and finite (n_embd is not in the metadata)."""
    shape = tuple(moments.shape)
    if len(shape) != 3 or shape[0] != n_layer or shape[1] != shape[2]:
        raise ProfileError(f"{path}: {MOMENTS_TENSOR} has shape {shape}, expected ({n_layer}, n_embd, n_embd); "
                           "the file is corrupt, profile the model again")
    if not np.isfinite(moments).all():
        raise ProfileError(f"{path}: {MOMENTS_TENSOR} holds values that are not finite; the file is corrupt, "
                           "profile the model again")


def _check_means(path: Path, means: np.ndarray, moments: np.ndarray | None) -> None:
    """input_means must come with input_moments, be [n_layer, n_embd] and finite."""
    if moments is None:
        raise ProfileError(f"{path}: {MEANS_TENSOR} without {MOMENTS_TENSOR}; the file is corrupt, profile the model again")
    if tuple(means.shape) != tuple(moments.shape[:2]):
        raise ProfileError(f"{path}: {MEANS_TENSOR} has shape {tuple(means.shape)}, expected {tuple(moments.shape[:2])}; "
                           "the file is corrupt, profile the model again")
    if not np.isfinite(means).all():
        raise ProfileError(f"{path}: {MEANS_TENSOR} holds values that are not finite; the file is corrupt, "
                           "profile the model again")


def ranking(scores: np.ndarray) -> np.ndarray:
    """Neuron ids per layer, highest score first; equal scores keep the lower id first."""
    return np.argsort(-scores, axis=-1, kind="stable")


def top_set(scores: np.ndarray, fraction: float) -> list[set[int]]:
    """Per layer, the ids of the top `fraction` of neurons."""
    k = int(round(fraction * scores.shape[-1]))
    return [set(row[:k].tolist()) for row in ranking(scores)]


def jaccard(a: set[int], b: set[int]) -> float:
    return len(a & b) / len(a | b) if a or b else 1.0
