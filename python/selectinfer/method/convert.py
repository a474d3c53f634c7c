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
the conversion. Layers outside the sparsified range are copied unchanged. A file ranked by a
profile also holds `selectinfer.neuron_shares.N` (F32 array): each kept neuron's share of the
layer's profiled activation mass (its model-wide score over the sum of all N scores), largest first,
from which the engine's per-layer budgets share out the bytes a decode step reads.

Gathering columns or transposing keeps F32/F16/BF16 values exact (BF16 rows of ffn_down_t are
stored as F16, see DOWN_T_TYPE); quantized types store their blocks along the rows, so both parts
of their down projection are re-quantized to the same type (from the dequantized values, with
ggml's own quantizer; ffn_down_t as Q8_0 where its rows of n_embd values are not whole blocks of
the type: down_t_type), and the static count is a whole number of the type's blocks. gate and up
are never re-quantized.

Optionally (predictor_rank R > 0, from a profile with FFN input moments C = E[h h^T]) a sparsified
layer also holds a rank-R predictor of its gathered neurons' gate, pred_out @ (pred_in @ h), the
best rank-R approximation of W h (W: the gathered gate rows) in the mean square over the profiled
inputs: W C^{1/2} = U S V^T, pred_in = V_R^T C^{-1/2} (`blk.N.ffn_gate_pred_in`, ne [n_embd, R]),
pred_out = U_R S_R (`blk.N.ffn_gate_pred_out`, ne [R, n_gathered]); in the gate's type as ffn_down_t
is (predictor_type), right after the layer's FFN tensors; `selectinfer.predictor_rank` holds R.
A profile with input moments also gives every loaded neuron's gate statistics (gate_stats:
`selectinfer.gate_rms.N`, `selectinfer.up_slope.N`, `selectinfer.up_rms.N`, F32, file order), which
the engine's dropped-neuron compensation needs, and by which (up_rms) the strategies that choose per
decode step weigh each neuron's |act(gate)|.
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

from .. import _native
from ..runtime.paths import atomic_path, check_writable_file, sha256_file
from ..runtime.si_format import ARCHITECTURES, DEFAULT_COMPUTE_RATIO, DEFAULT_TOKEN_RATIO, FORMAT_VERSION, entry, key
from .profiles import Profile

PREDICTOR_RANK_STEP = 32  # Q8_0 blocks: the rank is the row length of pred_out
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
    source: dict  # the source tensor it comes from (the gate, for the predictor)
    part: str     # "copy", "rows" (gate/up), "down_static", "down_t", "pred_in", "pred_out"


@dataclass
class ConvertResult:
    path: Path
    load_ratio: float
    static_ratio: float
    layers: range
    source_bytes: int
    output_bytes: int


def predictor_type(n_per_row: int, gate_type: int) -> int:
    """The type of a predictor tensor with rows of n_per_row values: the gate's, as ffn_down_t's
    (down_t_type: Q8_0 or F16 where the rows are not whole blocks of it), so that it costs per
    weight what the rows it stands for cost."""
    return down_t_type(gate_type, n_per_row)


def _predictor_tensors(gate: dict, plan: LayerPlan, rank: int) -> list[OutputTensor]:
    il, n_embd = _layer_kind(gate["name"])[0], gate["ne"][0]
    n_gathered = len(plan.neuron_ids) - plan.n_static
    return [OutputTensor(f"blk.{il}.ffn_gate_pred_in.weight", predictor_type(n_embd, gate["type"]), [n_embd, rank],
                         gate, "pred_in"),
            OutputTensor(f"blk.{il}.ffn_gate_pred_out.weight", predictor_type(rank, gate["type"]), [rank, n_gathered], gate,
                         "pred_out")]


def _output_tensors(src: SourceGGUF, plans: dict[int, LayerPlan], predictor_rank: int = 0) -> list[OutputTensor]:
    """Every output tensor, in the source's order (a SelectInfer layer's ffn_down becomes
    ffn_down_static and ffn_down_t, each only when it has neurons; its gate predictor follows the
    layer's last ffn_* tensor)."""
    last_ffn, gates = {}, {}  # per sparsified layer: the name of its last ffn_* tensor; its gate
    for t in src.tensors:
        il, kind = _layer_kind(t["name"])
        if il in plans and kind.startswith("ffn_"):
            last_ffn[il] = t["name"]
            if kind == "ffn_gate":
                gates[il] = t
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
        if predictor_rank > 0 and plan is not None and last_ffn.get(il) == t["name"]:
            if il not in gates:
                raise ConvertError(f"layer {il} has no ffn_gate to predict; convert without --predictor-rank")
            out += _predictor_tensors(gates[il], plan, predictor_rank)
    return out


def whitening(moments: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(C^{1/2}, C^{-1/2}) of C = moments + eps I, eps = 1e-6 * mean eigenvalue: directions the
    inputs never take get eps, not zero, so that the inverse stays finite."""
    c = np.asarray(moments, dtype=np.float64)
    n_embd = c.shape[0]
    eps = 1e-6 * np.trace(c) / n_embd
    eigenvalues, q = np.linalg.eigh(c + eps * np.eye(n_embd))
    root = np.sqrt(np.maximum(eigenvalues, eps))
    return (q * root) @ q.T, (q / root) @ q.T


def gate_predictor(gate: np.ndarray, moments: np.ndarray, rank: int) -> tuple[np.ndarray, np.ndarray]:
    """(pred_in [rank, n_embd], pred_out [n_gathered, rank]), float64, from the gathered gate rows
    [n_gathered, n_embd] and E[h h^T] [n_embd, n_embd]: pred_out @ pred_in minimises
    E|(W - M) h|^2 over rank-`rank` matrices M (the SVD of the whitened W, Eckart-Young)."""
    c_half, c_inv_half = whitening(moments)
    u, s, vt = np.linalg.svd(np.asarray(gate, dtype=np.float64) @ c_half, full_matrices=False)
    return vt[:rank] @ c_inv_half, u[:, :rank] * s[:rank]


def gate_stats(gate: np.ndarray, up: np.ndarray, moments: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(gate_rms, up_slope, up_rms) per neuron, float32, from its gate and up rows [n, n_embd] and
    E[h h^T]: sqrt(E[g^2]), E[g u] / E[g^2] (0 for a gate that is always 0) and sqrt(E[u^2]), what the
    engine's dropped-neuron compensation models a neuron by (cpp/compensation.h) and the weight of
    its gate in a step's choice (a neuron's output scales with its up)."""
    gate, up = np.asarray(gate, dtype=np.float64), np.asarray(up, dtype=np.float64)
    moments = np.asarray(moments, dtype=np.float64)
    gate_c = gate @ moments
    mean_square = np.maximum(np.einsum("ij,ij->i", gate_c, gate), 0.0)
    cross = np.einsum("ij,ij->i", gate_c, up)
    slope = np.divide(cross, mean_square, out=np.zeros_like(cross), where=mean_square > 0)
    up_square = np.maximum(np.einsum("ij,ij->i", up @ moments, up), 0.0)
    return np.sqrt(mean_square).astype(np.float32), slope.astype(np.float32), np.sqrt(up_square).astype(np.float32)


def gate_means(gate: np.ndarray, up: np.ndarray, mean: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(gate_mean, up_mean) per neuron, float32: E[g] and E[u] from its gate and up rows and E[h]."""
    mean = np.asarray(mean, dtype=np.float64)
    return ((np.asarray(gate, dtype=np.float64) @ mean).astype(np.float32),
            (np.asarray(up, dtype=np.float64) @ mean).astype(np.float32))


def _gate_stats_keys(src: SourceGGUF, plans: dict[int, LayerPlan], moments: np.ndarray,
                     means: np.ndarray | None) -> list[tuple]:
    by_name = {t["name"]: t for t in src.tensors}
    keys = []
    for il, plan in plans.items():
        gate = _dequantized_rows(src, by_name[f"blk.{il}.ffn_gate.weight"], plan.neuron_ids)
        up = _dequantized_rows(src, by_name[f"blk.{il}.ffn_up.weight"], plan.neuron_ids)
        rms, slope, up_rms = gate_stats(gate, up, moments[il])
        keys += [entry("gate_rms", rms.tolist(), il), entry("up_slope", slope.tolist(), il),
                 entry("up_rms", up_rms.tolist(), il)]
        if means is not None:
            gate_mean, up_mean = gate_means(gate, up, means[il])
            gate_mean = np.clip(gate_mean, -rms, rms)  # |E[g]| <= sqrt(E[g^2]), also after rounding
            keys += [entry("gate_mean", gate_mean.tolist(), il), entry("up_mean", up_mean.tolist(), il)]
    return keys


def _encode_predictor(values: np.ndarray, qtype: GGMLQuantizationType) -> np.ndarray:
    """Predictor rows in their type (predictor_type), by ggml's own quantizer."""
    values = np.ascontiguousarray(values, dtype=np.float32)
    if qtype in (GGMLQuantizationType.F32, GGMLQuantizationType.F16):
        return values.astype(np.float32 if qtype == GGMLQuantizationType.F32 else np.float16)
    return _native.quantize_rows(int(qtype), values)


class _Predictors:
    """Each sparsified layer's gate predictor, made when its first tensor is written (the last
    layer's kept for its second: one SVD per layer)."""

    def __init__(self, src: SourceGGUF, plans: dict[int, LayerPlan], moments: np.ndarray, rank: int):
        self.src, self.plans, self.moments, self.rank = src, plans, moments, rank
        self._layer, self._factors = None, None

    def factors(self, gate: dict) -> tuple[np.ndarray, np.ndarray]:
        il = _layer_kind(gate["name"])[0]
        if il != self._layer:
            plan = self.plans[il]
            w = _dequantized_rows(self.src, gate, plan.neuron_ids[plan.n_static:])
            self._layer, self._factors = il, gate_predictor(w, self.moments[il], self.rank)
        return self._factors


def _dequantized_rows(src: SourceGGUF, t: dict, ids: np.ndarray) -> np.ndarray:
    """The rows `ids` of a matrix as float32 [len(ids), ne[0]] (ggml has no to_float for F32)."""
    qtype = GGMLQuantizationType(t["type"])
    rows = np.ascontiguousarray(src.rows(t)[ids])
    if qtype == GGMLQuantizationType.F32:
        return rows.view(np.float32)
    if qtype == GGMLQuantizationType.F16:
        return rows.view(np.float16).astype(np.float32)
    if qtype == GGMLQuantizationType.BF16:
        return (rows.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
    return _native.dequantize_rows(int(qtype), rows, t["ne"][0])


def _converted_tensor(src: SourceGGUF, out: OutputTensor, plans: dict[int, LayerPlan],
                      predictors: _Predictors | None = None) -> np.ndarray:
    if out.part == "copy":
        return src.rows(out.source)
    if out.part in ("pred_in", "pred_out"):
        pred_in, pred_out = predictors.factors(out.source)
        return _encode_predictor(pred_in if out.part == "pred_in" else pred_out, GGMLQuantizationType(out.type))
    plan = plans[_layer_kind(out.source["name"])[0]]
    if out.part == "rows":
        return src.rows(out.source)[plan.neuron_ids]  # rows copied byte for byte, any type
    if out.part == "down_static":
        return _down_columns(src, out.source, plan.neuron_ids[:plan.n_static])
    return _down_transposed(src, out.source, plan.neuron_ids[plan.n_static:])


def neuron_shares(scores: np.ndarray, neuron_ids: np.ndarray) -> np.ndarray:
    """The kept neurons' shares of a layer's mass (scores: the layer's N model-wide scores), largest first."""
    scores = np.maximum(np.asarray(scores, dtype=np.float64), 0.0)
    total = scores.sum()
    kept = scores[neuron_ids] / total if total > 0 else np.zeros(len(neuron_ids))
    return np.sort(kept)[::-1].astype(np.float32)


def _down_block(src: SourceGGUF, layers: range) -> int:
    """The largest block size among the sparsified layers' ffn_down types (1, 32 or 256)."""
    blocks = [_native.block_size(t["type"]) for t in src.tensors if _layer_kind(t["name"]) in
              {(il, "ffn_down") for il in layers}]
    return max(blocks, default=1)


def estimate_output_bytes(src: SourceGGUF, layers: range, n_load: int, *, n_static: int = 0,
                          predictor_rank: int = 0) -> int:
    """Tensor bytes of the converted file for n_load neurons (n_static of them static) per
    sparsified layer, with a gate predictor of rank predictor_rank (0: none)."""
    fake = {il: LayerPlan(np.zeros(n_load, dtype=np.int32), n_static) for il in layers}
    return sum(_native.row_bytes(t.type, t.ne[0]) * int(np.prod(t.ne[1:]))
               for t in _output_tensors(src, fake, predictor_rank))


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


def fit_load_ratio(src: SourceGGUF, layers: range, n_ff: int, static_ratio: float, budget_bytes: int,
                   predictor_rank: int = 0) -> float:
    """The largest gamma (in steps of one neuron, or of a group of them, see load_count) whose
    converted weights fit budget_bytes."""
    step = neuron_step(n_ff)
    down_block = _down_block(src, layers)

    def needed(n_load: int) -> int:
        # the static count sizes the predictor (it covers the gathered neurons only); without one the
        # estimate stays the all-gathered one of before (an upper bound where ffn_down_t's type is wider)
        n_static = layer_counts(n_ff, n_load / n_ff, static_ratio, down_block)[1] if predictor_rank else 0
        return estimate_output_bytes(src, layers, n_load, n_static=n_static, predictor_rank=predictor_rank)

    lo, hi = max(1, -(-neuron_count(static_ratio, n_ff) // step)), n_ff // step  # in steps
    need = needed(lo * step)
    if need > budget_bytes:
        raise ConvertError(f"the budget of {budget_bytes / 2**20:.1f} MiB is too small: even gamma = delta "
                           f"({static_ratio}) needs {need / 2**20:.1f} MiB; lower --static-ratio or sparsify more layers")
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if needed(mid * step) <= budget_bytes:
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


def check_predictor_rank(rank: int, profile) -> None:
    """The rank alone: 0 (no predictor) or a positive multiple of 32, and a profile to whiten with."""
    if isinstance(rank, bool) or not isinstance(rank, (int, np.integer)) or rank < 0 or rank % PREDICTOR_RANK_STEP:
        raise ConvertError(f"the predictor rank must be a positive multiple of {PREDICTOR_RANK_STEP} (e.g. 64), "
                           f"or 0 for none; got {rank!r}")
    if rank > 0 and profile is None:
        raise ConvertError("the gate predictor is made from the profile's FFN input moments: pass --profile FILE "
                           "(a profile of this model made with --input-moments)")


def check_moments(prof: Profile, src: SourceGGUF, layers: range) -> None:
    """The profile's FFN input moments: present, of this model's n_embd, not all zero."""
    if prof.input_moments is None:
        raise ConvertError("profile the model again with this selectinfer: the profile has no FFN input moments "
                           "(selectinfer profile --input-moments)")
    n_embd = int(src.get(f"{src.get('general.architecture')}.embedding_length"))
    if prof.input_moments.shape[1:] != (n_embd, n_embd):
        raise ConvertError(f"the profile's FFN input moments are {prof.input_moments.shape[1]} wide, the model's "
                           f"inputs {n_embd}; profile this model again")
    for il in layers:
        if not np.trace(prof.input_moments[il], dtype=np.float64) > 0:
            raise ConvertError(f"the profile's FFN input moments of layer {il} are zero; profile the model again")


def check_predictor_fits(rank: int, src: SourceGGUF, plans: dict[int, LayerPlan]) -> None:
    """A rank of at most min(n_embd, gathered neurons) in every sparsified layer."""
    n_embd = int(src.get(f"{src.get('general.architecture')}.embedding_length"))
    il, plan = min(plans.items(), key=lambda item: len(item[1].neuron_ids) - item[1].n_static)
    n_gathered = len(plan.neuron_ids) - plan.n_static
    if rank > min(n_embd, n_gathered):
        raise ConvertError(f"the predictor rank {rank} exceeds min(n_embd {n_embd}, gathered neurons {n_gathered} "
                           f"of layer {il}); choose --predictor-rank at most {min(n_embd, n_gathered)} "
                           f"(rounded down to a multiple of {PREDICTOR_RANK_STEP}), or load more neurons")


def convert(model_path: str | os.PathLike, output: str | os.PathLike, *, profile: str | os.PathLike | None = None,
            task: str | None = None, load_ratio: float | None = 0.7, static_ratio: float = DEFAULT_STATIC_RATIO,
            layers: str | None = None, ranking: str = "profile", seed: int = 0, memory_budget: str | None = None,
            strategy: str = "frequency", progress: bool = True, check_profile_source: bool = True,
            predictor_rank: int = 0) -> ConvertResult:
    """Writes the SelectInfer GGUF `output` from the dense GGUF `model_path` (see module docs).
    `strategy` is the selection strategy the file suggests (the engine's default for this file;
    the environment and a program's own setting override it).
    check_profile_source=False accepts a profile made on another file of the same shape (the same
    model in another weight type: the evaluation's quantized SelectInfer files).
    predictor_rank > 0 adds each sparsified layer's gate predictor of that rank (a multiple of 32;
    needs `profile` with FFN input moments, also with ranking 'random')."""
    model_path, output = Path(model_path), check_writable_file(output)
    if not model_path.is_file():
        raise FileNotFoundError(f"model file not found: {model_path}")
    if strategy not in _native.STRATEGIES:
        raise ConvertError(f"strategy must be one of {', '.join(_native.STRATEGIES)}, got '{strategy}'")
    if ranking not in ("profile", "random"):
        raise ConvertError(f"ranking must be 'profile' or 'random', got '{ranking}'")
    check_predictor_rank(predictor_rank, profile)
    predictor_rank = int(predictor_rank)
    src = SourceGGUF(model_path)
    arch = src.get("general.architecture")
    if arch not in ARCHITECTURES:
        raise ConvertError(f"unsupported architecture '{arch}'; selectinfer converts {', '.join(ARCHITECTURES)}")
    if src.get(key("format_version")) is not None:
        raise ConvertError(f"{model_path} is already a SelectInfer GGUF; convert the original model")
    n_layer = int(src.get(f"{arch}.block_count"))
    n_ff = int(src.get(f"{arch}.feed_forward_length"))
    layer_range = parse_layers(layers, n_layer)

    prof = None
    if ranking == "profile" and profile is None:
        raise ConvertError("a profile is needed (--profile FILE), or use --ranking random")
    if ranking == "profile" or predictor_rank > 0:
        prof = Profile.load(profile)
        prof.check_model(prof.model.digest, n_layer, n_ff)  # the shape now; the file digest below
    if predictor_rank > 0:
        check_moments(prof, src, layer_range)
    if ranking == "profile":
        if task is None:
            raise ConvertError(f"choose the task whose neurons stay static (--task); the profile has: "
                               f"{', '.join(prof.tasks())}")
        prof.task_scores(task)  # fails clearly for a task the profile lacks
    if memory_budget is not None:
        load_ratio = fit_load_ratio(src, layer_range, n_ff, static_ratio, parse_size(memory_budget), predictor_rank)
    plans = plan_layers(n_ff, layer_range, load_ratio, static_ratio, profile=prof if ranking == "profile" else None,
                        task=task, seed=seed, down_block=_down_block(src, layer_range))
    if predictor_rank > 0:
        check_predictor_fits(predictor_rank, src, plans)

    source_digest = _Sha256InBackground(model_path)
    widths = [len(plans[il].neuron_ids) if il in plans else n_ff for il in range(n_layer)]
    keys = [
        (f"{arch}.feed_forward_length", "arr_u32", widths),
        entry("format_version", FORMAT_VERSION),
        entry("task", task or ""),
        entry("ranking", ranking),
        entry("seed", seed),
        entry("load_ratio", float(load_ratio)),
        entry("static_ratio", float(static_ratio)),
        entry("static_count", next(iter(plans.values())).n_static),  # per sparsified layer
        entry("compute_ratio", float(min(load_ratio, max(static_ratio, DEFAULT_COMPUTE_RATIO)))),
        entry("token_ratio", DEFAULT_TOKEN_RATIO),
        entry("strategy", strategy),
        entry("original_n", n_ff),
        entry("source_digest", _DIGEST_PLACEHOLDER),
        entry("profile_digest", sha256_file(profile) if prof else ""),
        entry("layers", list(layer_range)),
        entry("static_counts", [plans[il].n_static for il in layer_range]),
    ]
    # neuron ids are metadata, not tensors: llama.cpp refuses files with tensors it does not use
    keys += [entry("neuron_ids", plans[il].neuron_ids.tolist(), il) for il in layer_range]
    if ranking == "profile":
        scores = prof.model_scores()
        keys += [entry("neuron_shares", neuron_shares(scores[il], plans[il].neuron_ids).tolist(), il)
                 for il in layer_range]
    if predictor_rank > 0:
        keys.append(entry("predictor_rank", predictor_rank))
    if prof is not None and prof.input_moments is not None:
        keys += _gate_stats_keys(src, plans, prof.input_moments, prof.input_means)
    tensors = _output_tensors(src, plans, predictor_rank)
    predictors = _Predictors(src, plans, prof.input_moments, predictor_rank) if predictor_rank > 0 else None
    with atomic_path(output) as tmp:
        header = _native.write_gguf_header(str(model_path), str(tmp), [f"{arch}.feed_forward_length"], keys,
                                           [(t.name, t.type, t.ne) for t in tensors])
        offsets = {t["name"]: t["offset"] for t in header["tensors"]}
        total = sum(t["nbytes"] for t in header["tensors"])
        with open(tmp, "r+b") as f, tqdm(total=total, unit="B", unit_scale=True, desc="convert",
                                         disable=not progress) as bar:
            for t in tensors:
                data = _converted_tensor(src, t, plans, predictors)
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
    ffn_types = sorted({GGMLQuantizationType(t["type"]).name for t in src.tensors
                        if ".ffn_" in t["name"] and ".ffn_gate_pred_" not in t["name"]})  # the predictor's: below
    total = sum(t["nbytes"] for t in src.tensors)
    lines = [f"file          {path} ({path.stat().st_size / 2**20:.1f} MiB, tensors {total / 2**20:.1f} MiB)",
             f"architecture  {arch}, {n_layer} layers, FFN weight types {', '.join(ffn_types)}"]
    version = src.get(key("format_version"))
    if version is None:
        lines.append("selectinfer   none: a dense model")
        return "\n".join(lines)
    layers = list(src.get(key("layers")))
    statics = dict(zip(layers, src.get(key("static_counts"))))
    n_orig = int(src.get(key("original_n")))
    first = layers[0]
    lines += [
        f"selectinfer   format v{version}, task '{src.get(key('task'))}', ranking {src.get(key('ranking'))}",
        f"ratios        load (gamma) {src.get(key('load_ratio')):.3f}, "
        f"static (delta) {src.get(key('static_ratio')):.3f} of the original {n_orig} neurons",
        f"sparsified    layers {layers[0]}..{layers[-1]} ({len(layers)} of {n_layer})",
        f"defaults      strategy {src.get(key('strategy')) or 'frequency'}, compute (phi) "
        f"{src.get(key('compute_ratio'), -1):.3f}, token (alpha) {src.get(key('token_ratio'), -1):.3f}",
        f"source        sha256 {src.get(key('source_digest'))}",
        f"profile       sha256 {src.get(key('profile_digest')) or '(random ranking)'}",
        f"predictor     {_predictor_summary(src)}",
        "budgets       uniform" + (", or per layer by the profile's neuron shares (layer_budgets=profile)"
                                   if src.get(key("neuron_shares", first)) is not None else ""),
        "compensation " + (" gate statistics" + (" and means" if src.get(key("gate_mean", first)) is not None
                                                   else "") +
                           ": gate-guided and predicted add the dropped neurons' expected output"
                           if src.get(key("gate_rms", first)) is not None
                           else " none (no gate statistics: convert from a profile with input moments)"),
        "step choice   " + ("|act(gate)| times each neuron's up rms (gate-guided, predicted)"
                            if src.get(key("up_rms", first)) is not None else "|act(gate)| (gate-guided, predicted)"),
        "layer  width  static  profiled mass loaded",
    ]
    for il in range(n_layer):
        shares = src.get(key("neuron_shares", il)) if il in statics else None
        mass = f"{100 * float(np.sum(shares)):.1f}%" if shares is not None else "-"
        lines.append(f"{il:5d}  {int(widths[il]):5d}  {statics.get(il, '-')!s:>6}  {mass:>20}")
    return "\n".join(lines)


def _predictor_summary(src: SourceGGUF) -> str:
    rank = src.get(key("predictor_rank"))
    if rank is None:
        return "none"
    types = sorted({GGMLQuantizationType(t["type"]).name for t in src.tensors if ".ffn_gate_pred_" in t["name"]})
    return f"gate, rank {int(rank)} (ffn_gate_pred_in/out, {', '.join(types)})"
