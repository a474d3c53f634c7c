"""Selective loading (step 2 of the method): write a SelectInfer GGUF that holds only the FFN
neurons that matter.

Per sparsified layer, of the ORIGINAL width N:
  static neurons    the top delta*N of the task's base ranking, stored first;
  secondary neurons the next (gamma - delta)*N of the model-wide ranking not already kept.
`ffn_gate` and `ffn_up` keep the rows of the kept neurons byte for byte (any weight type), static
neurons first. The down projection is split: the static neurons, computed at every step as one
block, keep upstream's layout as `blk.N.ffn_down_static` ([n_static, n_embd] in ggml order: their
columns of `ffn_down`), so that upstream's matmul (and ggml's repacked kernels) computes them; the
other neurons, gathered at decode, are stored transposed as `blk.N.ffn_down_t` ([n_embd,
n_load - n_static]) with one row per neuron. `selectinfer.neuron_ids.N` (I32 array) holds the
original id of each kept neuron (metadata: llama.cpp refuses files with tensors it does not use).
`<arch>.feed_forward_length` becomes a per-layer array and the other `selectinfer.*` keys describe
the conversion. Layers outside the sparsified range are copied unchanged.

Gathering columns or transposing keeps F32/F16/BF16 values exact (BF16 rows of ffn_down_t are
stored as F16, see DOWN_T_TYPE); quantized types store their blocks along the rows, so both parts
of their down projection are re-quantized to the same type (from the dequantized values, with
ggml's own quantizer; ffn_down_t as Q8_0 where its rows of n_embd values are not whole blocks of
the type: down_t_type), and the static count is a whole number of the type's blocks. gate and up
are never re-quantized.
"""
from __future__ import annotations

import math
import os
import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType
from tqdm import tqdm

from . import _native
from .paths import atomic_path, sha256_file
from .profiles import Profile

SI_FORMAT_VERSION = 2
# run-time defaults written into the file (the authors' reference values): phi and alpha
DEFAULT_COMPUTE_RATIO = 0.4
DEFAULT_TOKEN_RATIO = 0.2
SUPPORTED_ARCHS = ("llama", "qwen2", "gemma3")
EXACT_TYPES = (GGMLQuantizationType.F32, GGMLQuantizationType.F16, GGMLQuantizationType.BF16)


# The type ffn_down_t is stored in, when not the source type: ggml's CPU backend has no BF16
# out-product, and F16 holds every BF16 weight of magnitude 6e-8..65504 exactly, at the same size.
DOWN_T_TYPE = {GGMLQuantizationType.BF16: GGMLQuantizationType.F16}


def down_t_type(source_type: int, n_embd: int) -> int:
    """The type of ffn_down_t, whose rows hold n_embd values: the source's (DOWN_T_TYPE aside), or
    Q8_0 where n_embd is not a whole number of the source type's blocks (a K-quant's 256 and
    Gemma-3-270M's 640: Q8_0's blocks of 32 fit, more precise than any 4-6 bit source), else F16."""
    qtype = DOWN_T_TYPE.get(GGMLQuantizationType(source_type), GGMLQuantizationType(source_type))
    if n_embd % _native.block_size(int(qtype)) == 0:
        return int(qtype)
    return int(GGMLQuantizationType.Q8_0 if n_embd % 32 == 0 else GGMLQuantizationType.F16)


class ConvertError(ValueError):
    """Input the converter refuses; the message names the problem and the fix."""


@dataclass
class LayerPlan:
    neuron_ids: np.ndarray  # int32, static neurons first
    n_static: int


def default_layers(n_layer: int) -> range:
    """The first n_layer//7 and the last n_layer//9 layers stay dense: layers 4..24 of
    Llama-3.2-3B's 28, the reference setting; 4..26 of SmolLM2-135M's 30."""
    return range(n_layer // 7, n_layer - n_layer // 9)


def parse_layers(spec: str | None, n_layer: int) -> range:
    """`START:END` (END exclusive, Python slice style) or None for default_layers."""
    if spec is None:
        return default_layers(n_layer)
    try:
        start_s, end_s = spec.split(":")
        start, end = int(start_s or 0), int(end_s or n_layer)
    except ValueError:
        raise ConvertError(f"layer range '{spec}' is not START:END (e.g. 4:25)") from None
    if not 0 <= start < end <= n_layer:
        raise ConvertError(f"layer range {start}:{end} is outside the model's layers 0:{n_layer}")
    return range(start, end)


def check_ratios(load_ratio: float, static_ratio: float) -> None:
    if not 0 < load_ratio <= 1:
        raise ConvertError(f"load ratio (gamma) must be in (0, 1], got {load_ratio}")
    if not 0 <= static_ratio <= 1:
        raise ConvertError(f"static ratio (delta) must be in [0, 1], got {static_ratio}")
    if static_ratio > load_ratio:
        raise ConvertError(f"static ratio (delta {static_ratio}) cannot exceed the load ratio (gamma {load_ratio})")


# Loaded and static neurons per layer come in whole groups of NEURON_GROUP in layers of at least
# 32 groups: upstream's tiled matmul (llamafile sgemm), which computes gate and up over the loaded
# neurons in a prompt and over the static ones at decode, takes its fast path only for row counts
# in multiples of 16 (2.5x slower otherwise, scripts/bench_ffn.py). gamma and delta move by at
# most NEURON_GROUP / 2 neurons.
NEURON_GROUP = 32


def neuron_step(n_ff: int) -> int:
    """The unit of a layer's loaded neuron count: a group in large layers, else one neuron."""
    return NEURON_GROUP if n_ff >= 32 * NEURON_GROUP and n_ff % NEURON_GROUP == 0 else 1


def neuron_count(ratio: float, n_ff: int, step: int | None = None) -> int:
    """Neurons a layer of n_ff keeps at load ratio gamma, or holds static at static ratio delta,
    in whole steps (default: neuron_step)."""
    step = step or neuron_step(n_ff)
    return round(ratio * n_ff / step) * step


def static_step(n_ff: int, down_block: int) -> int:
    """The unit of a layer's static count: whole groups (neuron_step) that are also whole blocks
    of the down projection's type, since ffn_down_static has a row of n_static values."""
    return math.lcm(neuron_step(n_ff), down_block)


def layer_counts(n_ff: int, load_ratio: float, static_ratio: float, down_block: int = 1) -> tuple[int, int]:
    """(n_load, n_static) of a sparsified layer. gamma = delta keeps only static neurons (a dense
    layer over them: the yardstick of selective computation)."""
    step = static_step(n_ff, down_block)
    n_static = neuron_count(static_ratio, n_ff, step)
    if static_ratio == load_ratio:
        return n_static, n_static
    n_load = neuron_count(load_ratio, n_ff)
    return n_load, min(n_static, n_load // step * step)


def plan_layers(n_ff: int, layers: range, load_ratio: float, static_ratio: float, *,
                profile: Profile | None = None, task: str | None = None, seed: int = 0,
                down_block: int = 1) -> dict[int, LayerPlan]:
    """Which neurons each sparsified layer keeps. With a profile: static from the task's base
    ranking, secondary from the model-wide ranking; without one: a seeded random choice.
    down_block: the block size of the down projection's type (static counts are whole blocks)."""
    check_ratios(load_ratio, static_ratio)
    n_load, n_static = layer_counts(n_ff, load_ratio, static_ratio, down_block)
    if n_load < 1:
        raise ConvertError(f"load ratio {load_ratio} keeps no neuron of {n_ff}")
    plans = {}
    if profile is None:
        rng = np.random.default_rng(seed)
        for il in layers:
            ids = rng.permutation(n_ff)[:n_load]
            plans[il] = LayerPlan(ids.astype(np.int32), n_static)
        return plans
    from .profiles import ranking

    base, secondary = ranking(profile.task_scores(task)), ranking(profile.model_scores())
    for il in layers:
        static = base[il, :n_static]
        taken = np.zeros(n_ff, dtype=bool)
        taken[static] = True
        rest = secondary[il][~taken[secondary[il]]][: n_load - n_static]
        plans[il] = LayerPlan(np.concatenate([static, rest]).astype(np.int32), n_static)
    return plans


# --- reading the source ----------------------------------------------------------------------

class SourceGGUF:
    """A GGUF's metadata (read by ggml's gguf code: fast) and its tensors as memory-mapped views."""

    def __init__(self, path: Path):
        try:
            header = _native.read_gguf_header(str(path))
        except RuntimeError:
            raise ConvertError(f"{path} is not a readable GGUF file; pass a .gguf model") from None
        self.path = path
        self.kv: dict = header["kv"]
        self.tensors: list[dict] = header["tensors"]
        self.data_offset: int = header["data_offset"]
        self._map = np.memmap(path, dtype=np.uint8, mode="r")

    def get(self, key: str, default=None):
        value = self.kv.get(key)
        return default if value is None else value

    def rows(self, t: dict) -> np.ndarray:
        """The tensor's bytes as rows: uint8 [n_rows, row_bytes]."""
        start = self.data_offset + t["offset"]
        n_rows = int(np.prod(t["ne"][1:]))
        return self._map[start: start + t["nbytes"]].reshape(n_rows, -1)


def _layer_kind(name: str) -> tuple[int, str]:
    parts = name.split(".")
    if len(parts) == 4 and parts[0] == "blk" and parts[3] == "weight":
        return int(parts[1]), parts[2]
    return -1, ""


def _gather_transposed(matrix: np.ndarray, ids: np.ndarray, block: int = 256) -> np.ndarray:
    """matrix[:, ids].T as a contiguous array, in blocks of rows so that both sides stay in cache."""
    out = np.empty((len(ids), matrix.shape[0]), dtype=matrix.dtype)
    for r in range(0, matrix.shape[0], block):
        out[:, r: r + block] = matrix[r: r + block][:, ids].T
    return out


def _down_transposed(src: SourceGGUF, t: dict, ids: np.ndarray) -> np.ndarray:
    """The columns `ids` of ffn_down ([n_embd rows of n_ff] in numpy order) as rows [len(ids), n_embd]:
    ffn_down_t, encoded in down_t_type."""
    qtype = GGMLQuantizationType(t["type"])
    n_ff, n_embd = t["ne"][0], t["ne"][1]
    target = GGMLQuantizationType(down_t_type(t["type"], n_embd))
    rows = src.rows(t)
    if qtype in (GGMLQuantizationType.F32, GGMLQuantizationType.F16) and target == qtype:
        dtype = np.float32 if qtype == GGMLQuantizationType.F32 else np.float16
        return _gather_transposed(rows.view(dtype), ids)
    if qtype == GGMLQuantizationType.BF16 and target == GGMLQuantizationType.F16:  # 16-bit words -> F16
        words = _gather_transposed(rows.view(np.uint16), ids).astype(np.uint32) << 16
        return words.view(np.float32).astype(np.float16)
    dense = _native.dequantize_rows(int(qtype), np.ascontiguousarray(rows), n_ff)
    values = _gather_transposed(dense, ids)
    if target == GGMLQuantizationType.F16:
        return values.astype(np.float16)
    return _native.quantize_rows(int(target), values)


def _down_columns(src: SourceGGUF, t: dict, ids: np.ndarray) -> np.ndarray:
    """The columns `ids` of ffn_down in its own layout, [n_embd rows of len(ids)]: ffn_down_static,
    in the source type (len(ids) whole blocks of it)."""
    qtype = GGMLQuantizationType(t["type"])
    rows = src.rows(t)
    if qtype in EXACT_TYPES:
        dtype = {GGMLQuantizationType.F32: np.float32, GGMLQuantizationType.F16: np.float16,
                 GGMLQuantizationType.BF16: np.uint16}[qtype]
        return np.ascontiguousarray(rows.view(dtype)[:, ids])
    dense = _native.dequantize_rows(int(qtype), np.ascontiguousarray(rows), t["ne"][0])
    return _native.quantize_rows(int(qtype), np.ascontiguousarray(dense[:, ids]))


@dataclass
class OutputTensor:
    name: str
    type: int
    ne: list[int]
    source: dict  # the source tensor it comes from
    part: str     # "copy", "rows" (gate/up), "down_static", "down_t"


@dataclass
class ConvertResult:
    path: Path
    load_ratio: float
    static_ratio: float
    layers: range
    source_bytes: int
    output_bytes: int


def _output_tensors(src: SourceGGUF, plans: dict[int, LayerPlan]) -> list[OutputTensor]:
    """Every output tensor, in the source's order (a SelectInfer layer's ffn_down becomes
    ffn_down_static and ffn_down_t, each only when it has neurons)."""
    out = []
    for t in src.tensors:
        il, kind = _layer_kind(t["name"])
        ne = [d for d in t["ne"]]
        while len(ne) > 1 and ne[-1] == 1:
            ne.pop()
        plan = plans.get(il)
        if plan is not None and kind in ("ffn_gate", "ffn_up"):
            out.append(OutputTensor(t["name"], t["type"], [ne[0], len(plan.neuron_ids)], t, "rows"))
        elif plan is not None and kind == "ffn_down":
            n_dynamic = len(plan.neuron_ids) - plan.n_static
            if plan.n_static > 0:
                out.append(OutputTensor(f"blk.{il}.ffn_down_static.weight", t["type"], [plan.n_static, ne[1]], t,
                                        "down_static"))
            if n_dynamic > 0:
                down_type = down_t_type(t["type"], ne[1])
                out.append(OutputTensor(f"blk.{il}.ffn_down_t.weight", down_type, [ne[1], n_dynamic], t, "down_t"))
        else:
            out.append(OutputTensor(t["name"], t["type"], ne, t, "copy"))
    return out


def _converted_tensor(src: SourceGGUF, out: OutputTensor, plans: dict[int, LayerPlan]) -> np.ndarray:
    if out.part == "copy":
        return src.rows(out.source)
    plan = plans[_layer_kind(out.source["name"])[0]]
    if out.part == "rows":
        return src.rows(out.source)[plan.neuron_ids]  # rows copied byte for byte, any type
    if out.part == "down_static":
        return _down_columns(src, out.source, plan.neuron_ids[:plan.n_static])
    return _down_transposed(src, out.source, plan.neuron_ids[plan.n_static:])


def _down_block(src: SourceGGUF, layers: range) -> int:
    """The largest block size among the sparsified layers' ffn_down types (1, 32 or 256)."""
    blocks = [_native.block_size(t["type"]) for t in src.tensors if _layer_kind(t["name"]) in
              {(il, "ffn_down") for il in layers}]
    return max(blocks, default=1)


def estimate_output_bytes(src: SourceGGUF, layers: range, n_load: int) -> int:
    """Tensor bytes of the converted file for n_load neurons per sparsified layer."""
    fake = {il: LayerPlan(np.zeros(n_load, dtype=np.int32), 0) for il in layers}
    return sum(_native.row_bytes(t.type, t.ne[0]) * int(np.prod(t.ne[1:])) for t in _output_tensors(src, fake))


def parse_size(text: str) -> int:
    """'512M', '1.5G', '800MiB', '123456' -> bytes (binary units)."""
    units = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
    s = text.strip().upper().removesuffix("IB").removesuffix("B")
    num, unit = (s[:-1], s[-1]) if s and s[-1] in units else (s, "")
    try:
        value = float(num) * units[unit]
    except ValueError:
        raise ConvertError(f"cannot read the size '{text}'; write e.g. 512M or 1.5G") from None
    if value <= 0:
        raise ConvertError(f"the memory budget must be positive, got '{text}'")
    return int(value)


def fit_load_ratio(src: SourceGGUF, layers: range, n_ff: int, static_ratio: float, budget_bytes: int) -> float:
    """The largest gamma (in steps of one neuron, or of a group of them, see load_count) whose
    converted weights fit budget_bytes."""
    step = neuron_step(n_ff)
    lo, hi = max(1, -(-neuron_count(static_ratio, n_ff) // step)), n_ff // step  # in steps
    need = estimate_output_bytes(src, layers, lo * step)
    if need > budget_bytes:
        raise ConvertError(f"the budget of {budget_bytes / 2**20:.1f} MiB is too small: even gamma = delta "
                           f"({static_ratio}) needs {need / 2**20:.1f} MiB; lower --static-ratio or sparsify more layers")
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if estimate_output_bytes(src, layers, mid * step) <= budget_bytes:
            lo = mid
        else:
            hi = mid - 1
    return lo * step / n_ff


class _Sha256InBackground(threading.Thread):
    """Hashes a file while the conversion runs (both mostly wait on memory and disk)."""

    def __init__(self, path: Path):
        super().__init__(daemon=True)
        self.path, self.digest, self.error = path, None, None
        self.start()

    def run(self):
        try:
            self.digest = sha256_file(self.path)
        except OSError as e:
            self.error = e

    def result(self) -> str:
        self.join()
        if self.error:
            raise self.error
        return self.digest


_DIGEST_PLACEHOLDER = "pending-sha256-".ljust(64, "x")  # same length as a hex sha256


DEFAULT_STATIC_RATIO = 0.3  # delta: static neurons per layer, of N


def convert(model_path: str | os.PathLike, output: str | os.PathLike, *, profile: str | os.PathLike | None = None,
            task: str | None = None, load_ratio: float | None = 0.7, static_ratio: float = DEFAULT_STATIC_RATIO,
            layers: str | None = None, ranking: str = "profile", seed: int = 0, memory_budget: str | None = None,
            strategy: str = "frequency", progress: bool = True, check_profile_source: bool = True) -> ConvertResult:
    """Writes the SelectInfer GGUF `output` from the dense GGUF `model_path` (see module docs).
    `strategy` is the selection strategy the file suggests (the engine's default for this file;
    the environment and a program's own setting override it).
    check_profile_source=False accepts a profile made on another file of the same shape (the same
    model in another weight type: the evaluation's quantized SelectInfer files)."""
    model_path, output = Path(model_path), Path(output)
    if not model_path.is_file():
        raise FileNotFoundError(f"model file not found: {model_path}")
    if strategy not in _native.STRATEGIES:
        raise ConvertError(f"strategy must be one of {', '.join(_native.STRATEGIES)}, got '{strategy}'")
    if ranking not in ("profile", "random"):
        raise ConvertError(f"ranking must be 'profile' or 'random', got '{ranking}'")
    src = SourceGGUF(model_path)
    arch = src.get("general.architecture")
    if arch not in SUPPORTED_ARCHS:
        raise ConvertError(f"unsupported architecture '{arch}'; selectinfer converts {', '.join(SUPPORTED_ARCHS)}")
    if src.get("selectinfer.format_version") is not None:
        raise ConvertError(f"{model_path} is already a SelectInfer GGUF; convert the original model")
    n_layer = int(src.get(f"{arch}.block_count"))
    n_ff = int(src.get(f"{arch}.feed_forward_length"))
    layer_range = parse_layers(layers, n_layer)

    prof = None
    if ranking == "profile":
        if profile is None:
            raise ConvertError("a profile is needed (--profile FILE), or use --ranking random")
        prof = Profile.load(profile)
        prof.check_model(prof.model.digest, n_layer, n_ff)  # the shape now; the file digest below
        if task is None:
            raise ConvertError(f"choose the task whose neurons stay static (--task); the profile has: "
                               f"{', '.join(prof.tasks())}")
        prof.task_scores(task)  # fails clearly for a task the profile lacks
    if memory_budget is not None:
        load_ratio = fit_load_ratio(src, layer_range, n_ff, static_ratio, parse_size(memory_budget))
    plans = plan_layers(n_ff, layer_range, load_ratio, static_ratio, profile=prof, task=task, seed=seed,
                        down_block=_down_block(src, layer_range))

    out_dir = output.parent if str(output.parent) else Path(".")
    if not out_dir.is_dir() or not os.access(out_dir, os.W_OK):
        raise ConvertError(f"cannot write {output}: folder {out_dir} does not exist or is not writable")
    source_digest = _Sha256InBackground(model_path)
    widths = [len(plans[il].neuron_ids) if il in plans else n_ff for il in range(n_layer)]
    keys = [
        (f"{arch}.feed_forward_length", "arr_u32", widths),
        ("selectinfer.format_version", "u32", SI_FORMAT_VERSION),
        ("selectinfer.task", "str", task or ""),
        ("selectinfer.ranking", "str", ranking),
        ("selectinfer.seed", "u32", seed),
        ("selectinfer.load_ratio", "f32", float(load_ratio)),
        ("selectinfer.static_ratio", "f32", float(static_ratio)),
        ("selectinfer.static_count", "u32", next(iter(plans.values())).n_static),  # per sparsified layer
        ("selectinfer.compute_ratio", "f32", float(min(load_ratio, max(static_ratio, DEFAULT_COMPUTE_RATIO)))),
        ("selectinfer.token_ratio", "f32", DEFAULT_TOKEN_RATIO),
        ("selectinfer.strategy", "str", strategy),
        ("selectinfer.original_feed_forward_length", "u32", n_ff),
        ("selectinfer.source_digest", "str", _DIGEST_PLACEHOLDER),
        ("selectinfer.profile_digest", "str", sha256_file(profile) if prof else ""),
        ("selectinfer.layers", "arr_i32", list(layer_range)),
        ("selectinfer.static_counts", "arr_i32", [plans[il].n_static for il in layer_range]),
    ]
    # neuron ids are metadata, not tensors: llama.cpp refuses files with tensors it does not use
    keys += [(f"selectinfer.neuron_ids.{il}", "arr_i32", plans[il].neuron_ids.tolist()) for il in layer_range]
    tensors = _output_tensors(src, plans)
    with atomic_path(output) as tmp:
        header = _native.write_gguf_header(str(model_path), str(tmp), [f"{arch}.feed_forward_length"], keys,
                                           [(t.name, t.type, t.ne) for t in tensors])
        offsets = {t["name"]: t["offset"] for t in header["tensors"]}
        total = sum(t["nbytes"] for t in header["tensors"])
        with open(tmp, "r+b") as f, tqdm(total=total, unit="B", unit_scale=True, desc="convert",
                                         disable=not progress) as bar:
            for t in tensors:
                data = _converted_tensor(src, t, plans)
                f.seek(header["data_offset"] + offsets[t.name])
                f.write(memoryview(np.ascontiguousarray(data)).cast("B"))
                bar.update(data.nbytes)
            digest = source_digest.result()
            if prof is not None and check_profile_source:
                prof.check_model(digest, n_layer, n_ff)
            f.seek(0)
            meta = f.read(header["data_offset"])
            f.seek(meta.index(_DIGEST_PLACEHOLDER.encode()))
            f.write(digest.encode())
    return ConvertResult(output, float(load_ratio), float(static_ratio), layer_range, model_path.stat().st_size,
                         output.stat().st_size)


def inspect(path: str | os.PathLike) -> str:
    """A human-readable summary of a GGUF: architecture, SelectInfer metadata, per-layer widths."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"file not found: {path}")
    src = SourceGGUF(path)
    arch = src.get("general.architecture", "?")
    n_layer = int(src.get(f"{arch}.block_count", 0))
    widths = src.get(f"{arch}.feed_forward_length")
    widths = list(widths) if isinstance(widths, list) else [widths] * n_layer
    ffn_types = sorted({GGMLQuantizationType(t["type"]).name for t in src.tensors if ".ffn_" in t["name"]})
    total = sum(t["nbytes"] for t in src.tensors)
    lines = [f"file          {path} ({path.stat().st_size / 2**20:.1f} MiB, tensors {total / 2**20:.1f} MiB)",
             f"architecture  {arch}, {n_layer} layers, FFN weight types {', '.join(ffn_types)}"]
    version = src.get("selectinfer.format_version")
    if version is None:
        lines.append("selectinfer   none: a dense model")
        return "\n".join(lines)
    layers = list(src.get("selectinfer.layers"))
    statics = dict(zip(layers, src.get("selectinfer.static_counts")))
    n_orig = int(src.get("selectinfer.original_feed_forward_length"))
    lines += [
        f"selectinfer   format v{version}, task '{src.get('selectinfer.task')}', ranking {src.get('selectinfer.ranking')}",
        f"ratios        load (gamma) {src.get('selectinfer.load_ratio'):.3f}, "
        f"static (delta) {src.get('selectinfer.static_ratio'):.3f} of the original {n_orig} neurons",
        f"sparsified    layers {layers[0]}..{layers[-1]} ({len(layers)} of {n_layer})",
        f"defaults      strategy {src.get('selectinfer.strategy') or 'frequency'}, compute (phi) "
        f"{src.get('selectinfer.compute_ratio', -1):.3f}, token (alpha) {src.get('selectinfer.token_ratio', -1):.3f}",
        f"source        sha256 {src.get('selectinfer.source_digest')}",
        f"profile       sha256 {src.get('selectinfer.profile_digest') or '(random ranking)'}",
        "layer  width  static",
    ]
    for il in range(n_layer):
        lines.append(f"{il:5d}  {int(widths[il]):5d}  {statics.get(il, '-')!s:>6}")
    return "\n".join(lines)
