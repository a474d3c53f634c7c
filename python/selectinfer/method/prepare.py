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

from ..runtime.child_run import Config, RunRequest, run_in_child
from ..runtime.paths import cache_dir, check_writable_file, sha256_file

MAX_FIT_ROUNDS = 8
CLOSE_BELOW = 0.02  # a fitted process peaks within 2% below the budget, where the file's steps allow
# ... and at least 0.5% below it: a peak measured again differs by up to a few hundred KiB, and a
# file at the budget's edge would not fit on the next run
NOISE_MARGIN = 0.005


def cached_profile(model_path: str | os.PathLike, dataset_specs: list[str] | None = None, *, max_prompts: int = 40,
                   max_new_tokens: int = 128, n_ctx: int = 2048, n_threads: int = 0, input_moments: bool = False,
                   progress: bool = True) -> Path:
    """The engine's profile of this model file on these data sets, made once and kept in the cache
    under the file's sha256, the data sets (a user file by its sha256) and the profiling settings
    (input_moments: with the FFN input moments and means the gate predictor and the compensation need)."""
    from .profiler import DEFAULT_DATASETS, profile_model

    specs = list(dataset_specs or DEFAULT_DATASETS)
    data = [spec if ":" not in spec else f"{spec}@{sha256_file(spec.rsplit(':', 1)[0])}" for spec in specs]
    key = {"model": sha256_file(model_path), "data": data, "max_prompts": max_prompts, "max_new_tokens": max_new_tokens,
           **({"input_moments": True, "input_means": True} if input_moments else {})}  # (older keys stay valid)
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    path = cache_dir() / "profiles" / f"{Path(model_path).stem}.{digest}.safetensors"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        profile_model(model_path, specs, path, max_prompts=max_prompts, max_new_tokens=max_new_tokens, n_ctx=n_ctx,
                      n_threads=n_threads, progress=progress, input_moments=input_moments)
    return path


def budget_workload(n_ctx: int) -> dict:
    """What a process does when its peak is measured against a budget: a prompt as long as one full
    batch (512 tokens, the engine's n_batch; half the context if that is less: the compute buffers'
    worst case) and 16 decode steps. The KV cache is cleared when the context is made, so all of
    it counts."""
    return {"n_prompt": max(1, min(512, n_ctx // 2)), "n_gen": 16, "rounds": 1}


def measure_peak_rss(model_path: str | os.PathLike, n_ctx: int, n_threads: int = 0) -> int:
    """Peak RSS of a fresh process that loads the model with an n_ctx context and runs
    budget_workload (runtime.child_run, in a child of its own)."""
    speed = budget_workload(n_ctx)
    with tempfile.TemporaryDirectory() as runs:
        rec = run_in_child(RunRequest(Config("prepare", "measure", str(model_path)), [], 0, n_threads, n_ctx, speed),
                           Path(runs))
    if "_error" in rec:
        raise RuntimeError(f"could not run {model_path} to measure its memory: {rec['_error']}")
    return int(rec["_peak_rss_bytes"])


def next_gamma(fits: dict, over: dict, target: int, step: int, n_ff: int, gamma_for_weights) -> float | None:
    """The next gamma to try, from the trials so far (gamma -> (file bytes, peak)): where the
    measured slope of the peak in the file's size says the peak meets `target` (compute buffers grow
    with the loaded neurons too; slope 1 before two trials), kept strictly between the largest
    gamma that fits and the smallest that does not (halfway where the slope points outside);
    None when no gamma is left between them. Gammas are whole steps: k * step / n_ff."""
    from .convert import ConvertError

    lo = max(fits) if fits else 0.0
    hi = min(over) if over else (n_ff + step) / n_ff
    trials = sorted({**fits, **over}.items())
    if fits and over:  # the bracket's own slope: the steps nearest the budget
        (w0, p0), (w1, p1) = fits[lo], over[hi]
    elif len(trials) > 1:
        (w0, p0), (w1, p1) = trials[-2][1], trials[-1][1]
    else:
        (w0, p0), (w1, p1) = (0, 0), trials[-1][1]
    slope = (p1 - p0) / (w1 - w0) if len(trials) > 1 and w1 != w0 and (p1 - p0) * (w1 - w0) > 0 else 1.0
    try:
        gamma = gamma_for_weights(int(w1 + (target - p1) / slope))
    except ConvertError:
        gamma = None
    if gamma is None or not lo < gamma < hi:
        gamma = round((lo + hi) / 2 * n_ff / step) * step / n_ff  # bisect the bracket, in whole steps
        if not lo < gamma < hi or gamma > 1.0:
            return None
    return gamma


@dataclass
class Prepared:
    path: Path
    profile: Path
    load_ratio: float
    file_bytes: int
    peak_rss_bytes: int | None  # measured, with a memory budget
    budget_bytes: int | None


def no_fit_message(budget: int, n_ctx: int, rest_bytes: int | None) -> str:
    """Why no file fits `budget`; rest_bytes None: the smallest file's weights alone exceed it."""
    size = f"{budget / 2**20:.0f} MiB" if budget >= 2**20 else f"{budget / 2**10:.0f} KiB"
    if rest_bytes is None:
        return (f"no load ratio fits {size}: the smallest file's weights alone take more (the attention, embeddings "
                "and static neurons stay whole); give a larger budget or a lower --static-ratio")
    return (f"no load ratio fits {size} at a context of {n_ctx} tokens: besides the weights, the "
            f"process needs about {rest_bytes / 2**20:.0f} MiB (KV cache, buffers, runtime); give a larger budget, "
            "a smaller --ctx-size, or a lower --static-ratio")


def prepare(model_path: str | os.PathLike, output: str | os.PathLike, *, task: str = "qa",
            memory_budget: str | None = None, load_ratio: float | None = None, static_ratio: float = 0.3,
            layers: str | None = None, dataset_specs: list[str] | None = None, max_prompts: int = 40,
            max_new_tokens: int = 128, n_ctx: int = 2048, n_threads: int = 0, profile: str | os.PathLike | None = None,
            progress: bool = True) -> Prepared:
    """Profiles the model (cached; or takes `profile`, a profile of this file) and writes its
    SelectInfer GGUF at load_ratio, or at the largest gamma whose process fits memory_budget
    (measured)."""
    from .convert import ConvertError, SourceGGUF, convert, fit_load_ratio, neuron_step, parse_layers, parse_size

    if (memory_budget is None) == (load_ratio is None):
        raise ValueError("give either a memory budget (--memory-budget 3G) or a load ratio (--load-ratio 0.7)")
    model_path, output = Path(model_path), check_writable_file(output)
    if not model_path.is_file():
        raise FileNotFoundError(f"model file not found: {model_path}")
    if memory_budget is not None:  # whether any file can fit is known from the file: before profiling
        budget = parse_size(memory_budget)
        src = SourceGGUF(model_path)
        arch = src.get("general.architecture")
        n_ff, n_layer = int(src.get(f"{arch}.feed_forward_length")), int(src.get(f"{arch}.block_count"))
        layer_range = parse_layers(layers, n_layer)
        ceiling = int((1 - NOISE_MARGIN) * budget)  # what a trial must peak under to count as fitting
        target = int((1 - (CLOSE_BELOW + NOISE_MARGIN) / 2) * budget)
        try:  # the weights alone, before a run measures the rest
            fit_load_ratio(src, layer_range, n_ff, static_ratio, target)
        except ConvertError:
            raise ConvertError(no_fit_message(budget, n_ctx, None)) from None
        rest = measure_peak_rss(model_path, n_ctx, n_threads) - model_path.stat().st_size  # KV, buffers, runtime
        try:
            gamma = fit_load_ratio(src, layer_range, n_ff, static_ratio, target - rest)
        except ConvertError:
            raise ConvertError(no_fit_message(budget, n_ctx, rest)) from None
    if profile is None:
        profile = cached_profile(model_path, dataset_specs, max_prompts=max_prompts, max_new_tokens=max_new_tokens,
                                 n_threads=n_threads, progress=progress)
    profile = Path(profile)

    def write(gamma: float) -> None:
        convert(model_path, output, profile=profile, task=task, load_ratio=gamma, static_ratio=static_ratio,
                layers=layers, progress=progress)

    if memory_budget is None:
        write(load_ratio)
        return Prepared(output, profile, load_ratio, output.stat().st_size, None, None)

    step = neuron_step(n_ff)  # a file's gammas are k * step / n_ff
    fits, over = {}, {}  # gamma -> (file bytes, measured peak), at or under the budget / over it
    written = None  # the gamma of the file on disk
    for _ in range(MAX_FIT_ROUNDS):
        write(gamma)
        written, peak = gamma, measure_peak_rss(output, n_ctx, n_threads)
        (fits if peak <= ceiling else over)[gamma] = (output.stat().st_size, peak)
        if ceiling >= peak >= (1 - CLOSE_BELOW) * budget or (peak <= ceiling and gamma >= 1.0):
            break
        gamma = next_gamma(fits, over, target, step, n_ff,
                           lambda weights: fit_load_ratio(src, layer_range, n_ff, static_ratio, weights))
        if gamma is None:
            break  # no file size left between one that fits and one that does not
    best = (max(fits), fits[max(fits)][1]) if fits else None
    if best is None:
        output.unlink(missing_ok=True)
        raise ConvertError(no_fit_message(budget, n_ctx, rest))
    if written != best[0]:
        write(best[0])
    return Prepared(output, profile, best[0], output.stat().st_size, best[1], budget)
