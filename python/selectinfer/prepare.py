"""selectinfer prepare: profile (once per model file and data sets, cached) and convert in one step,
to a load ratio or to a memory budget that the whole process fits.

A budget means what a user means by it: the peak resident memory of a process that loads the
SelectInfer file, with its KV cache at the chosen context size, evaluates a prompt and decodes.
The weights' share is found by measuring: the original's peak minus its weights gives the rest
(KV cache, compute buffers, the runtime), the largest gamma whose weights fit the remainder is
converted, and the result is measured again; if it is over (the compute buffers grow with the
loaded neurons) or more than 2% under, the weights' share moves along the measured slope of the
peak in the file's size and the file is converted again (a few rounds; the largest file that
fitted is kept).
"""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from .paths import cache_dir, sha256_file

MAX_FIT_ROUNDS = 5
CLOSE_BELOW = 0.02  # a fitted process peaks within 2% below the budget, where the file's steps allow


def cached_profile(model_path: str | os.PathLike, dataset_specs: list[str] | None = None, *, max_prompts: int = 40,
                   max_new_tokens: int = 128, n_ctx: int = 2048, n_threads: int = 0, progress: bool = True) -> Path:
    """The engine's profile of this model file on these data sets, made once and kept in the cache
    under the file's sha256, the data sets (a user file by its sha256) and the profiling settings."""
    from .profiler import DEFAULT_DATASETS, profile_model

    specs = list(dataset_specs or DEFAULT_DATASETS)
    data = [spec if ":" not in spec else f"{spec}@{sha256_file(spec.rsplit(':', 1)[0])}" for spec in specs]
    key = {"model": sha256_file(model_path), "data": data, "max_prompts": max_prompts, "max_new_tokens": max_new_tokens}
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    path = cache_dir() / "profiles" / f"{Path(model_path).stem}.{digest}.safetensors"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        profile_model(model_path, specs, path, max_prompts=max_prompts, max_new_tokens=max_new_tokens, n_ctx=n_ctx,
                      n_threads=n_threads, progress=progress)
    return path


def measure_peak_rss(model_path: str | os.PathLike, n_ctx: int, n_threads: int = 0) -> int:
    """Peak RSS of a fresh process that loads the model with an n_ctx context, evaluates a prompt
    and decodes 16 tokens (evaluate.run_config, in a child of its own)."""
    from .evaluate import Config, RunRequest, run_in_child

    speed = {"n_prompt": max(1, min(256, n_ctx // 2)), "n_gen": 16, "rounds": 1}
    with tempfile.TemporaryDirectory() as runs:
        rec = run_in_child(RunRequest(Config("prepare", "measure", str(model_path)), [], 0, n_threads, n_ctx, speed),
                           Path(runs))
    if "_error" in rec:
        raise RuntimeError(f"could not run {model_path} to measure its memory: {rec['_error']}")
    return int(rec["_peak_rss_bytes"])


@dataclass
class Prepared:
    path: Path
    profile: Path
    load_ratio: float
    file_bytes: int
    peak_rss_bytes: int | None  # measured, with a memory budget
    budget_bytes: int | None


def prepare(model_path: str | os.PathLike, output: str | os.PathLike, *, task: str = "qa",
            memory_budget: str | None = None, load_ratio: float | None = None, static_ratio: float = 0.3,
            layers: str | None = None, dataset_specs: list[str] | None = None, max_prompts: int = 40,
            max_new_tokens: int = 128, n_ctx: int = 2048, n_threads: int = 0, progress: bool = True) -> Prepared:
    """Profiles the model (cached) and writes its SelectInfer GGUF at load_ratio, or at the largest
    gamma whose process fits memory_budget (measured)."""
    from .convert import ConvertError, SourceGGUF, convert, fit_load_ratio, parse_layers, parse_size

    if (memory_budget is None) == (load_ratio is None):
        raise ValueError("give either a memory budget (--memory-budget 3G) or a load ratio (--load-ratio 0.7)")
    model_path, output = Path(model_path), Path(output)
    if not model_path.is_file():
        raise FileNotFoundError(f"model file not found: {model_path}")
    profile = cached_profile(model_path, dataset_specs, max_prompts=max_prompts, max_new_tokens=max_new_tokens,
                             n_threads=n_threads, progress=progress)

    def write(gamma: float) -> None:
        convert(model_path, output, profile=profile, task=task, load_ratio=gamma, static_ratio=static_ratio,
                layers=layers, progress=progress)

    if memory_budget is None:
        write(load_ratio)
        return Prepared(output, profile, load_ratio, output.stat().st_size, None, None)

    budget = parse_size(memory_budget)
    src = SourceGGUF(model_path)
    arch = src.get("general.architecture")
    n_ff, n_layer = int(src.get(f"{arch}.feed_forward_length")), int(src.get(f"{arch}.block_count"))
    layer_range = parse_layers(layers, n_layer)
    rest = measure_peak_rss(model_path, n_ctx, n_threads) - model_path.stat().st_size  # KV, buffers, runtime
    target = int((1 - CLOSE_BELOW / 2) * budget)
    weights_budget = target - rest
    trials = []  # (file bytes, measured peak): the peak's slope in the file's size, from the last two
    best, written = None, None  # (gamma, peak) of the largest file that fitted; the gamma on disk
    for _ in range(MAX_FIT_ROUNDS):
        try:
            gamma = fit_load_ratio(src, layer_range, n_ff, static_ratio, weights_budget)
        except ConvertError:
            break
        if gamma == written or (best is not None and gamma <= best[0] and trials[-1][1] <= budget):
            break  # nothing new to try
        write(gamma)
        written, peak = gamma, measure_peak_rss(output, n_ctx, n_threads)
        trials.append((output.stat().st_size, peak))
        if peak <= budget and (best is None or gamma > best[0]):
            best = (gamma, peak)
        if budget >= peak >= (1 - CLOSE_BELOW) * budget or (peak <= budget and gamma >= 1.0):
            break
        # compute buffers grow with the loaded neurons too: follow the measured slope (1 at first)
        (w0, p0), (w1, p1) = trials[-2] if len(trials) > 1 else (0, 0), trials[-1]
        slope = (p1 - p0) / (w1 - w0) if len(trials) > 1 and w1 != w0 and p1 > p0 else 1.0
        weights_budget = int(w1 + (target - p1) / slope)
    if best is None:
        output.unlink(missing_ok=True)
        raise ConvertError(f"no load ratio fits {budget / 2**20:.0f} MiB at a context of {n_ctx} tokens: besides "
                           f"the weights, the process needs about {rest / 2**20:.0f} MiB (KV cache, buffers, "
                           "runtime); give a larger budget, a smaller --ctx-size, or a lower --static-ratio")
    if written != best[0]:
        write(best[0])
    return Prepared(output, profile, best[0], output.stat().st_size, best[1], budget)
