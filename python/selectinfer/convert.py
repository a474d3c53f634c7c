"""Selective loading (step 2 of the method): write a SelectInfer GGUF that holds only the FFN
neurons that matter.

Per sparsified layer, of the ORIGINAL width N:
  static neurons    the top delta*N of the task's base ranking, stored first;
  secondary neurons the next (gamma - delta)*N of the model-wide ranking not already kept.
A neuron is a row of every FFN matrix: `ffn_gate` and `ffn_up` keep the rows of the kept
neurons byte for byte (any weight type), and the down projection is stored transposed as
`blk.N.ffn_down_t` ([n_embd, n_loaded] in ggml order) with one row per kept neuron.
`selectinfer.neuron_ids.N` (I32 array) holds the original id of each row (metadata: llama.cpp
refuses files with tensors it does not use). `<arch>.feed_forward_length` becomes a per-layer
array and the other `selectinfer.*` keys describe the conversion. Layers outside the
sparsified range are copied unchanged.

Transposing the down projection keeps F32/F16 values exact (BF16 ones too: they are stored as
F16, see DOWN_T_TYPE); quantized types store their blocks along the other axis, so their down
projection is re-quantized to the same type (from the dequantized values, with ggml's own
quantizer); gate and up are never re-quantized.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter
from tqdm import tqdm

from . import _native
from .paths import atomic_path, sha256_file
from .profiles import Profile

SI_FORMAT_VERSION = 1
SUPPORTED_ARCHS = ("llama", "qwen2")
EXACT_TYPES = (GGMLQuantizationType.F32, GGMLQuantizationType.F16, GGMLQuantizationType.BF16)


# The type ffn_down_t is stored in, when not the source type: ggml's CPU backend has no BF16
# out-product, and F16 holds every BF16 weight of magnitude 6e-8..65504 exactly, at the same size.
DOWN_T_TYPE = {GGMLQuantizationType.BF16: GGMLQuantizationType.F16}


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


def plan_layers(n_ff: int, layers: range, load_ratio: float, static_ratio: float, *,
                profile: Profile | None = None, task: str | None = None, seed: int = 0) -> dict[int, LayerPlan]:
    """Which neurons each sparsified layer keeps. With a profile: static from the task's base
    ranking, secondary from the model-wide ranking; without one: a seeded random choice."""
    check_ratios(load_ratio, static_ratio)
    n_load, n_static = round(load_ratio * n_ff), round(static_ratio * n_ff)
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


# --- GGUF helpers ---------------------------------------------------------------------------------

def _field(reader: GGUFReader, key: str, default=None):
    f = reader.get_field(key)
    return default if f is None else f.contents()


def _tensor_rows(t) -> np.ndarray:
    """A tensor's data as uint8 rows [n_rows, row_bytes] (quantized) or typed rows [n_rows, n]."""
    data = np.asarray(t.data)
    return data.reshape(int(np.prod(t.shape[1:])), -1) if data.ndim != 2 else data


def _down_transposed(t, ids: np.ndarray) -> tuple[np.ndarray, GGMLQuantizationType]:
    """Kept columns of ffn_down ([n_embd, n_ff] as numpy rows) as rows: [n_loaded, n_embd]."""
    qtype = GGMLQuantizationType(t.tensor_type)
    n_ff, n_embd = int(t.shape[0]), int(t.shape[1])
    rows = np.asarray(t.data)
    if qtype == GGMLQuantizationType.F32:
        return np.ascontiguousarray(rows.reshape(n_embd, n_ff)[:, ids].T), qtype
    if qtype == GGMLQuantizationType.F16:
        return np.ascontiguousarray(rows.reshape(n_embd, n_ff)[:, ids].T), qtype
    if qtype == GGMLQuantizationType.BF16:  # raw 16-bit words -> F16 (see DOWN_T_TYPE)
        words = rows.view(np.uint16).reshape(n_embd, n_ff)[:, ids].T.astype(np.uint32) << 16
        return np.ascontiguousarray(words.view(np.float32).astype(np.float16)), GGMLQuantizationType.F16
    dense = _native.dequantize_rows(int(qtype), np.ascontiguousarray(rows.reshape(n_embd, -1)), n_ff)
    return _native.quantize_rows(int(qtype), np.ascontiguousarray(dense[:, ids].T)), qtype


def _copy_fields(reader: GGUFReader, writer: GGUFWriter, skip: set[str]) -> None:
    for key, f in reader.fields.items():
        if key.startswith("GGUF.") or key in skip:
            continue
        vtype = f.types[0]
        sub = f.types[-1] if vtype == GGUFValueType.ARRAY and len(f.types) > 1 else None
        writer.add_key_value(key, f.contents(), vtype, sub)


@dataclass
class ConvertResult:
    path: Path
    load_ratio: float
    static_ratio: float
    layers: range
    source_bytes: int
    output_bytes: int


def estimate_output_bytes(reader: GGUFReader, layers: range, n_load: int) -> int:
    """Tensor bytes of the converted file for n_load neurons per sparsified layer."""
    total = 0
    for t in reader.tensors:
        parts = t.name.split(".")
        if len(parts) == 4 and parts[0] == "blk" and int(parts[1]) in layers and parts[2] in ("ffn_gate", "ffn_up", "ffn_down"):
            n_ff = int(t.shape[1]) if parts[2] != "ffn_down" else int(t.shape[0])
            n_embd = int(t.shape[0]) if parts[2] != "ffn_down" else int(t.shape[1])
            qtype = GGMLQuantizationType(t.tensor_type)
            if parts[2] == "ffn_down":
                qtype = DOWN_T_TYPE.get(qtype, qtype)
            total += _native.row_bytes(int(qtype), n_embd) * n_load
            if parts[2] == "ffn_down":
                total += 4 * n_load  # neuron ids (metadata)
        else:
            total += int(t.n_bytes)
    return total


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


def fit_load_ratio(reader: GGUFReader, layers: range, n_ff: int, static_ratio: float, budget_bytes: int) -> float:
    """The largest gamma (in steps of one neuron) whose converted weights fit budget_bytes."""
    lo, hi = max(1, round(static_ratio * n_ff)), n_ff
    if estimate_output_bytes(reader, layers, lo) > budget_bytes:
        need = estimate_output_bytes(reader, layers, lo)
        raise ConvertError(f"the budget of {budget_bytes / 2**20:.1f} MiB is too small: even gamma = delta "
                           f"({static_ratio}) needs {need / 2**20:.1f} MiB; lower --static-ratio or sparsify more layers")
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if estimate_output_bytes(reader, layers, mid) <= budget_bytes:
            lo = mid
        else:
            hi = mid - 1
    return lo / n_ff


def convert(model_path: str | os.PathLike, output: str | os.PathLike, *, profile: str | os.PathLike | None = None,
            task: str | None = None, load_ratio: float | None = 0.7, static_ratio: float = 0.3,
            layers: str | None = None, ranking: str = "profile", seed: int = 0, memory_budget: str | None = None,
            progress: bool = True) -> ConvertResult:
    """Writes the SelectInfer GGUF `output` from the dense GGUF `model_path` (see module docs)."""
    model_path, output = Path(model_path), Path(output)
    if not model_path.is_file():
        raise FileNotFoundError(f"model file not found: {model_path}")
    if ranking not in ("profile", "random"):
        raise ConvertError(f"ranking must be 'profile' or 'random', got '{ranking}'")
    try:
        reader = GGUFReader(str(model_path))
    except (ValueError, OSError) as e:
        raise ConvertError(f"{model_path} is not a readable GGUF file ({e})") from None
    arch = _field(reader, "general.architecture")
    if arch not in SUPPORTED_ARCHS:
        raise ConvertError(f"unsupported architecture '{arch}'; selectinfer converts {', '.join(SUPPORTED_ARCHS)}")
    if _field(reader, "selectinfer.format_version") is not None:
        raise ConvertError(f"{model_path} is already a SelectInfer GGUF; convert the original model")
    n_layer = int(_field(reader, f"{arch}.block_count"))
    n_ff = int(_field(reader, f"{arch}.feed_forward_length"))
    layer_range = parse_layers(layers, n_layer)

    source_digest = sha256_file(model_path)
    prof = None
    if ranking == "profile":
        if profile is None:
            raise ConvertError("a profile is needed (--profile FILE), or use --ranking random")
        prof = Profile.load(profile)
        prof.check_model(source_digest, n_layer, n_ff)
        if task is None:
            raise ConvertError(f"choose the task whose neurons stay static (--task); the profile has: "
                               f"{', '.join(prof.tasks())}")
        prof.task_scores(task)  # fails clearly for a task the profile lacks
    if memory_budget is not None:
        load_ratio = fit_load_ratio(reader, layer_range, n_ff, static_ratio, parse_size(memory_budget))
    plans = plan_layers(n_ff, layer_range, load_ratio, static_ratio, profile=prof, task=task, seed=seed)

    out_dir = output.parent if str(output.parent) else Path(".")
    if not out_dir.is_dir() or not os.access(out_dir, os.W_OK):
        raise ConvertError(f"cannot write {output}: folder {out_dir} does not exist or is not writable")
    widths = [len(plans[il].neuron_ids) if il in plans else n_ff for il in range(n_layer)]
    with atomic_path(output) as tmp:
        writer = GGUFWriter(str(tmp), arch)
        _copy_fields(reader, writer, skip={"general.architecture", f"{arch}.feed_forward_length"})
        writer.add_key_value(f"{arch}.feed_forward_length", widths, GGUFValueType.ARRAY, GGUFValueType.UINT32)
        meta = {
            "selectinfer.format_version": (SI_FORMAT_VERSION, GGUFValueType.UINT32),
            "selectinfer.task": (task or "", GGUFValueType.STRING),
            "selectinfer.ranking": (ranking, GGUFValueType.STRING),
            "selectinfer.seed": (seed, GGUFValueType.UINT32),
            "selectinfer.load_ratio": (float(load_ratio), GGUFValueType.FLOAT32),
            "selectinfer.static_ratio": (float(static_ratio), GGUFValueType.FLOAT32),
            "selectinfer.original_feed_forward_length": (n_ff, GGUFValueType.UINT32),
            "selectinfer.source_digest": (source_digest, GGUFValueType.STRING),
            "selectinfer.profile_digest": (sha256_file(profile) if prof else "", GGUFValueType.STRING),
        }
        for key, (value, vtype) in meta.items():
            writer.add_key_value(key, value, vtype)
        writer.add_key_value("selectinfer.layers", list(layer_range), GGUFValueType.ARRAY, GGUFValueType.INT32)
        writer.add_key_value("selectinfer.static_counts", [plans[il].n_static for il in layer_range],
                             GGUFValueType.ARRAY, GGUFValueType.INT32)
        for il in layer_range:  # metadata, not tensors: llama.cpp requires every tensor to be used
            writer.add_key_value(f"selectinfer.neuron_ids.{il}", plans[il].neuron_ids.tolist(),
                                 GGUFValueType.ARRAY, GGUFValueType.INT32)

        jobs = _tensor_jobs(reader, plans)
        for name, shape, dtype, nbytes, raw, _ in jobs:
            writer.add_tensor_info(name, shape, dtype, nbytes, raw_dtype=raw)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        total = sum(job[3] for job in jobs)
        with tqdm(total=total, unit="B", unit_scale=True, desc="convert", disable=not progress) as bar:
            for name, shape, dtype, nbytes, raw, make in jobs:
                data = make()
                writer.write_tensor_data(data)
                bar.update(nbytes)
        writer.close()
    return ConvertResult(output, float(load_ratio), float(static_ratio), layer_range, model_path.stat().st_size,
                         output.stat().st_size)


def _tensor_jobs(reader: GGUFReader, plans: dict[int, LayerPlan]) -> list:
    """(name, numpy shape, dtype, nbytes, raw_dtype, make_data) for every output tensor, in order;
    data is produced lazily so the conversion streams tensor by tensor."""
    jobs = []
    for t in reader.tensors:
        parts = t.name.split(".")
        il = int(parts[1]) if parts[0] == "blk" else -1
        kind = parts[2] if len(parts) == 4 else ""
        qtype = GGMLQuantizationType(t.tensor_type)
        raw = None if qtype in (GGMLQuantizationType.F32, GGMLQuantizationType.F16) else qtype
        if il in plans and kind in ("ffn_gate", "ffn_up") and parts[3] == "weight":
            ids = plans[il].neuron_ids
            rows = _tensor_rows(t)
            jobs.append((t.name, (len(ids), *rows.shape[1:]), rows.dtype, len(ids) * rows.shape[1] * rows.itemsize, raw,
                         lambda rows=rows, ids=ids: np.ascontiguousarray(rows[ids])))
        elif il in plans and kind == "ffn_down" and parts[3] == "weight":
            ids = plans[il].neuron_ids
            n_embd = int(t.shape[1])
            out_type = DOWN_T_TYPE.get(qtype, qtype)
            row_bytes = _native.row_bytes(int(out_type), n_embd)
            dtype = {GGMLQuantizationType.F32: np.float32, GGMLQuantizationType.F16: np.float16}.get(out_type, np.uint8)
            shape = (len(ids), n_embd if dtype != np.uint8 else row_bytes)
            out_raw = None if dtype != np.uint8 else out_type
            jobs.append((f"blk.{il}.ffn_down_t.weight", shape, np.dtype(dtype), len(ids) * row_bytes, out_raw,
                         lambda t=t, ids=ids: _down_transposed(t, ids)[0]))
        else:
            rows = np.asarray(t.data)
            shape = tuple(int(d) for d in reversed(t.shape)) if rows.dtype != np.uint8 else rows.shape
            jobs.append((t.name, shape, rows.dtype, int(t.n_bytes), raw, lambda rows=rows: rows))
    return jobs


def inspect(path: str | os.PathLike) -> str:
    """A human-readable summary of a GGUF: architecture, SelectInfer metadata, per-layer widths."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"file not found: {path}")
    try:
        reader = GGUFReader(str(path))
    except (ValueError, OSError) as e:
        raise ConvertError(f"{path} is not a readable GGUF file ({e})") from None
    arch = _field(reader, "general.architecture", "?")
    n_layer = int(_field(reader, f"{arch}.block_count", 0))
    widths = _field(reader, f"{arch}.feed_forward_length")
    widths = list(widths) if isinstance(widths, list) else [widths] * n_layer
    ffn_types = sorted({GGMLQuantizationType(t.tensor_type).name for t in reader.tensors if ".ffn_" in t.name})
    total = sum(int(t.n_bytes) for t in reader.tensors)
    lines = [f"file          {path} ({path.stat().st_size / 2**20:.1f} MiB, tensors {total / 2**20:.1f} MiB)",
             f"architecture  {arch}, {n_layer} layers, FFN weight types {', '.join(ffn_types)}"]
    version = _field(reader, "selectinfer.format_version")
    if version is None:
        lines.append("selectinfer   none: a dense model")
        return "\n".join(lines)
    layers = list(_field(reader, "selectinfer.layers"))
    statics = dict(zip(layers, _field(reader, "selectinfer.static_counts")))
    n_orig = int(_field(reader, "selectinfer.original_feed_forward_length"))
    lines += [
        f"selectinfer   format v{version}, task '{_field(reader, 'selectinfer.task')}', "
        f"ranking {_field(reader, 'selectinfer.ranking')}",
        f"ratios        load (gamma) {_field(reader, 'selectinfer.load_ratio'):.3f}, "
        f"static (delta) {_field(reader, 'selectinfer.static_ratio'):.3f} of the original {n_orig} neurons",
        f"sparsified    layers {layers[0]}..{layers[-1]} ({len(layers)} of {n_layer})",
        f"source        sha256 {_field(reader, 'selectinfer.source_digest')}",
        f"profile       sha256 {_field(reader, 'selectinfer.profile_digest') or '(random ranking)'}",
        "layer  width  static",
    ]
    for il in range(n_layer):
        lines.append(f"{il:5d}  {int(widths[il]):5d}  {statics.get(il, '-')!s:>6}")
    return "\n".join(lines)
