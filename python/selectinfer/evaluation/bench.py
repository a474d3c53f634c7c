"""Side-by-side speed benchmark: prefill and decode tokens/s of several GGUF models.

Runs are interleaved (model A, model B, ..., then again) so that the noise of a shared machine
falls on every model alike; the report gives medians and each model's ratio to the first.
"""
from __future__ import annotations

import itertools
import re
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from tqdm import tqdm

from .. import _native
from ..runtime.si_format import key
from ..runtime.model import STEP_STRATEGIES, Model
from ..runtime.timing import one_run, prompt_tokens


@dataclass
class BenchResult:
    path: str
    label: str
    model_bytes: int
    read_bytes: int  # weight bytes one decode step reads (bytes_read_per_token)
    prefill_tokens_per_s: list[float] = field(default_factory=list)
    decode_tokens_per_s: list[float] = field(default_factory=list)

    @property
    def prefill_median(self) -> float:
        return statistics.median(self.prefill_tokens_per_s)

    @property
    def decode_median(self) -> float:
        return statistics.median(self.decode_tokens_per_s)


@dataclass
class BenchConfig:
    label: str
    path: str
    model_kwargs: dict
    read_bytes: int  # weight bytes a decode step reads (bytes_read_per_token)


def run_bench(paths: list[str | Path], *, n_prompt: int = 64, n_gen: int = 64, repeats: int = 5,
              n_threads: int = 0, **options) -> list[BenchResult]:
    """Benchmarks each model side by side, in the configurations of bench_configs(paths, **options)."""
    return run_configs(bench_configs(paths, **options), n_prompt=n_prompt, n_gen=n_gen, repeats=repeats,
                       n_threads=n_threads)


def bench_configs(paths: list[str | Path], *, profiling: bool = False, compute_ratios: list[float] | None = None,
                  strategies: list[str] | None = None, layer_budgets: list[str] | None = None,
                  compensation: list[str] | None = None, repack: tuple[bool, ...] = (True,),
                  flash_attn: tuple[bool | None, ...] = (None,), n_gpu_layers: int = 0) -> list[BenchConfig]:
    """What run_bench runs: each model; profiling=True adds each model with profiling on;
    compute_ratios runs each SelectInfer model densely over its loaded neurons and at each phi
    within its [delta, gamma], with each of `strategies` (None: the file's), of `layer_budgets`
    (None: uniform) and, for gate-guided and predicted, of `compensation` ("on", the engine's
    default, and/or "off"; None: on);
    repack=(True, False) runs every configuration with and without ggml's weight repacking;
    flash_attn: every configuration with each of these (None: llama.cpp's choice, True on, False off);
    n_gpu_layers: layers on the GPU (a CUDA build), -1 all."""
    configs = []
    for p in paths:
        header = _native.read_gguf_header(str(p))  # once per file
        name = Path(p).name
        if key("format_version") in header["kv"] and compute_ratios:
            configs.append(BenchConfig(f"{name} (dense over loaded)", p, {"dense": True}, _bytes_read(header)))
            kv, eps = header["kv"], 1e-6
            for phi in compute_ratios:
                if not kv[key("static_ratio")] - eps <= phi <= kv[key("load_ratio")] + eps:
                    continue
                for strategy, budgets, comp in itertools.product(strategies or [None], layer_budgets or ["uniform"],
                                                                 compensation or ["on"]):
                    if comp == "off" and strategy not in STEP_STRATEGIES:
                        continue  # (nothing to compensate)
                    kwargs = {"compute_ratio": phi, **({"strategy": strategy} if strategy else {}),
                              **({"layer_budgets": budgets} if budgets != "uniform" else {}),
                              **({"compensate": False} if comp == "off" else {})}
                    label = (f"{name} (phi {phi}{' ' + strategy if strategy else ''}"
                             f"{'' if budgets == 'uniform' else ', ' + budgets + ' budgets'}"
                             f"{', uncompensated' if comp == 'off' else ''})")
                    configs.append(BenchConfig(label, p, kwargs, _bytes_read(header, phi, strategy, budgets)))
        else:
            configs.append(BenchConfig(name, p, {}, _bytes_read(header)))
        if profiling:
            configs.append(BenchConfig(f"{name} (profiling)", p, {"profile": True}, _bytes_read(header)))
    gpu = {"n_gpu_layers": n_gpu_layers} if n_gpu_layers else {}
    fa_label = {None: "", True: " (flash attn on)", False: " (flash attn off)"}
    return [BenchConfig(c.label + ("" if r else " (no repack)") + fa_label[fa], c.path,
                        {**c.model_kwargs, "repack": r, **gpu, **({} if fa is None else {"flash_attn": fa})},
                        c.read_bytes)
            for c in configs for r in repack for fa in flash_attn]


def run_configs(configs: list[BenchConfig], *, n_prompt: int = 64, n_gen: int = 64, repeats: int = 5,
                n_threads: int = 0) -> list[BenchResult]:
    """Every configuration loaded side by side, then `repeats` interleaved rounds of one prompt of
    n_prompt tokens and n_gen decode steps each (after a warm-up run)."""
    if n_prompt < 1 or n_gen < 1 or repeats < 1:
        raise ValueError("n_prompt, n_gen and repeats must be >= 1")
    models = []
    try:
        for c in configs:
            models.append(Model(c.path, n_ctx=n_prompt + n_gen + 8, n_batch=max(n_prompt, 32), n_threads=n_threads,
                                **c.model_kwargs))
        results = [BenchResult(str(c.path), c.label, m.stats()["model_bytes"], c.read_bytes)
                   for c, m in zip(configs, models)]
        prompts = [prompt_tokens(m, n_prompt) for m in models]
        for m, prompt in zip(models, prompts):  # warm-up: page in the weights, fill caches
            one_run(m, prompt, 4)
        for _ in tqdm(range(repeats), desc="bench", unit="round", leave=False):
            for m, prompt, r in zip(models, prompts, results):
                prefill, decode = one_run(m, prompt, n_gen)
                r.prefill_tokens_per_s.append(prefill)
                r.decode_tokens_per_s.append(decode)
        return results
    finally:
        for m in models:
            m.close()


def bytes_read_per_token(path, compute_ratio: float | None = None, strategy: str | None = None,
                         layer_budgets: str = "uniform") -> int:
    """Weight bytes one decode step reads, the yardstick of a memory-bound decode:
    every matrix once, the token embedding only where it is also the output projection (tied);
    in a SelectInfer layer at compute ratio phi only the FFN rows computed (layer_counts), but
    every loaded row of the gate with the gate-guided strategy, and the gate predictor (read only by
    the predicted strategy) in full."""
    return _bytes_read(_native.read_gguf_header(str(path)), compute_ratio, strategy, layer_budgets)


_SI_FFN = re.compile(r"blk\.(\d+)\.(ffn_gate|ffn_up|ffn_down_static|ffn_down_t)\.weight")
_GATE_PREDICTOR = re.compile(r"blk\.\d+\.ffn_gate_pred_(in|out)\.weight")


def computed_neurons(compute_ratio: float, n_original: int, n_load: int) -> int:
    """Neurons a SelectInfer layer computes at decode with uniform budgets, by the engine's rule
    (cpp/layer_budgets.cpp: lround of phi * N in float32, at most the loaded ones, at least one)."""
    return _native.layer_budget_sizes([(n_load, 1, 1.0, [])], compute_ratio, n_original, "uniform")[0]


def layer_counts(header: dict, compute_ratio: float, strategy: str | None = None,
                 layer_budgets: str = "uniform") -> dict[int, int]:
    """Per SelectInfer layer of a file (its header), the neurons a decode step computes, as the
    engine counts them (cpp/layer_budgets.cpp, with the bytes per neuron the engine weighs)."""
    kv = header["kv"]
    sizes = {t["name"]: t["nbytes"] for t in header["tensors"]}
    widths = kv.get(f"{kv.get('general.architecture')}.feed_forward_length")
    layers = list(kv.get(key("layers")) or [])
    inputs = []
    for il, n_static in zip(layers, kv.get(key("static_counts")) or []):
        n_load = int(widths[il])
        n_gathered = n_load - n_static
        gate, up = (sizes[f"blk.{il}.{m}.weight"] / n_load for m in ("ffn_gate", "ffn_up"))
        down = sizes[f"blk.{il}.ffn_down_t.weight"] / n_gathered if n_gathered else 0
        neuron_bytes = (up + down if strategy == "gate-guided" else gate + up + down) if n_gathered else 1.0
        shares = list(kv.get(key("neuron_shares", il)) or []) if layer_budgets == "profile" else []
        inputs.append((n_load, max(1, n_static), neuron_bytes, shares))
    counts = _native.layer_budget_sizes(inputs, compute_ratio, int(kv[key("original_n")]),
                                        layer_budgets)
    return dict(zip(layers, counts))


def _bytes_read(header: dict, compute_ratio: float | None = None, strategy: str | None = None,
                layer_budgets: str = "uniform") -> int:
    kv = header["kv"]
    tensors = {t["name"]: t for t in header["tensors"]}
    counts = layer_counts(header, compute_ratio, strategy, layer_budgets) if compute_ratio is not None else {}
    widths = kv.get(f"{kv.get('general.architecture')}.feed_forward_length")
    total = 0
    for name, t in tensors.items():
        if name == "token_embd.weight" and "output.weight" in tensors:
            continue  # only one row per token is read
        if _GATE_PREDICTOR.fullmatch(name) and not (compute_ratio is not None and strategy == "predicted"):
            continue
        nbytes = t["nbytes"]
        ffn = _SI_FFN.fullmatch(name)
        partial = ffn and not (strategy == "gate-guided" and ffn.group(2) == "ffn_gate")
        if partial and int(ffn.group(1)) in counts:  # an FFN matrix of a SelectInfer layer
            n_load = int(widths[int(ffn.group(1))])  # the same bytes per neuron in every part of it
            nbytes = nbytes * counts[int(ffn.group(1))] // n_load
        total += nbytes
    return total


def results_json(results: list[BenchResult]) -> list[dict]:
    """Each configuration's medians, samples and ratios to the first (format_table's numbers)."""
    base = results[0]
    out = []
    for r in results:
        speedup, ideal = r.decode_median / base.decode_median, base.read_bytes / r.read_bytes
        out.append({"label": r.label, "path": r.path, "model_bytes": r.model_bytes, "read_bytes_per_token": r.read_bytes,
                    "prefill_tokens_per_s": r.prefill_median, "decode_tokens_per_s": r.decode_median,
                    "prefill_samples": r.prefill_tokens_per_s, "decode_samples": r.decode_tokens_per_s,
                    "prefill_vs_first": r.prefill_median / base.prefill_median, "decode_vs_first": speedup,
                    "bytes_read_ideal": ideal, "share_of_ideal": speedup / ideal})
    return out


def format_table(results: list[BenchResult]) -> str:
    """Medians, and ratios to the first model: measured, and the bytes-read ideal (how much less
    a decode step reads) with the share of it reached."""
    base = results[0]
    lines = [
        "| model | weights MiB | read/token MiB | prefill tok/s | decode tok/s | prefill vs first "
        "| decode vs first | bytes ideal | of ideal |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        speedup, ideal = r.decode_median / base.decode_median, base.read_bytes / r.read_bytes
        lines.append(f"| {r.label} | {r.model_bytes / 2**20:.1f} | {r.read_bytes / 2**20:.1f} | {r.prefill_median:.1f} "
                     f"| {r.decode_median:.1f} | {r.prefill_median / base.prefill_median:.2f}x | {speedup:.2f}x "
                     f"| {ideal:.2f}x | {100 * speedup / ideal:.0f}% |")
    return "\n".join(lines)
