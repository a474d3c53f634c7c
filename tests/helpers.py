"""Helpers the tests share (the fixtures that use them are in conftest.py)."""
from __future__ import annotations

import functools
import importlib.util
import os
import shutil
import struct
import sys
from pathlib import Path

import numpy as np
import pytest

from selectinfer.evaluation.synthetic import make_model
from selectinfer.runtime.si_format import key as si_key


def make_si_model(root: Path, *, seed: int, layers: str, n_ff: int = 256, shape: str = "tiny-llama") -> tuple[Path, Path]:
    """A random tiny model (3 layers, N = n_ff, F32) and its SelectInfer GGUF (random neurons,
    gamma 0.75, delta 0.25, the given layers): (dense path, SelectInfer path)."""
    from selectinfer.method.convert import convert

    src, out = root / "dense.gguf", root / "si.gguf"
    make_model(src, shape, weight_type="F32", seed=seed, n_ff=n_ff, n_layer=3)
    convert(src, out, ranking="random", seed=2, load_ratio=0.75, static_ratio=0.25, layers=layers, progress=False)
    return src, out


def make_predicted_si_model(root: Path, *, seed: int, layers: str, rank: int = 32, shape: str = "tiny-llama") -> Path:
    """make_si_model's tiny model (N = 256) profiled with FFN input moments (2 prompts of botchan, 4
    tokens each), converted by that profile's ranking (gamma 0.75, delta 0.25) with a gate
    predictor of the given rank: the SelectInfer path."""
    from selectinfer.method.convert import convert
    from selectinfer.method.profiler import profile_model

    src, profile, out = root / "dense.gguf", root / "p.safetensors", root / "si-predicted.gguf"
    make_model(src, shape, weight_type="F32", seed=seed, n_ff=256, n_layer=3)
    profile_model(src, ["botchan"], profile, max_prompts=2, max_new_tokens=4, n_ctx=256, progress=False,
                  input_moments=True)
    convert(src, out, profile=profile, task="text", load_ratio=0.75, static_ratio=0.25, layers=layers,
            predictor_rank=rank, progress=False)
    return out


def profiled_si_model(model: Path, root: Path, load_ratio: float = 0.7) -> Path:
    """A real model's SelectInfer GGUF from a short profile (4 prompts of the QA and text data
    sets, 16 tokens each), the QA ranking, delta 0.3, the default layers."""
    from selectinfer.method.convert import convert
    from selectinfer.method.profiler import profile_model

    profile = root / "p.safetensors"
    profile_model(model, ["capitals-qa", "botchan"], profile, max_prompts=4, max_new_tokens=16, progress=False)
    out = root / f"si{round(100 * load_ratio)}.gguf"
    convert(model, out, profile=profile, task="qa", load_ratio=load_ratio, static_ratio=0.3, progress=False)
    return out


def tool(name: str) -> str:
    """The path of an installed program of this package: from $SELECTINFER_BIN (a variant build's,
    scripts/test_variant.sh), else the venv's bin/, else the PATH."""
    for folder in (os.environ.get("SELECTINFER_BIN"), Path(sys.executable).parent):
        if folder and (Path(folder) / name).exists():
            return str(Path(folder) / name)
    found = shutil.which(name)
    if not found:
        pytest.fail(f"{name} is not installed; run `make install` (or `pip install .`) first")
    return found


def gguf_fields(path) -> dict:
    """{key: (GGUFValueType, value, array item type or None)} of a GGUF's metadata (not the header's own)."""
    from gguf import GGUFReader, GGUFValueType

    out = {}
    for name, field in GGUFReader(str(path)).fields.items():
        if name.startswith("GGUF."):
            continue
        vtype = field.types[0]
        sub = field.types[-1] if vtype == GGUFValueType.ARRAY and len(field.types) > 1 else None
        value = field.contents()
        if vtype == GGUFValueType.ARRAY and sub is None:
            value = []  # an empty array: gguf-py reports no item type
        out[name] = (vtype, value, sub if sub is not None else (GGUFValueType.INT32 if vtype == GGUFValueType.ARRAY else None))
    return out


def gguf_tensors(path) -> list[dict]:
    """Each tensor of a GGUF as stored: name, raw bytes (uint8), ggml shape (ne) and type."""
    from gguf import GGUFReader

    return [{"name": t.name, "data": np.asarray(t.data).view(np.uint8).reshape(-1).copy(),
             "ne": [int(d) for d in t.shape], "type": t.tensor_type} for t in GGUFReader(str(path)).tensors]


def write_gguf(path, fields: dict, tensors: list[dict], alignment: int = 32) -> Path:
    """Writes a GGUF (version 3) from gguf_fields / gguf_tensors style values, edited as a test needs:
    any value of any type, empty arrays included (gguf-py's writer refuses those), and tensor infos
    taken as given (a shape that does not fit the data is written as it is); tensor data padded to
    `alignment` (general.alignment's default 32: a file that sets another also passes it here)."""
    from gguf import GGUFValueType as V

    scalar = {V.UINT8: "<B", V.INT8: "<b", V.UINT16: "<H", V.INT16: "<h", V.UINT32: "<I", V.INT32: "<i",
              V.FLOAT32: "<f", V.UINT64: "<Q", V.INT64: "<q", V.FLOAT64: "<d", V.BOOL: "<?"}

    def string(text) -> bytes:
        raw = text.encode() if isinstance(text, str) else bytes(text)
        return struct.pack("<Q", len(raw)) + raw

    def value(vtype, v, item=None) -> bytes:
        if vtype == V.STRING:
            return string(v)
        if vtype == V.ARRAY:
            return struct.pack("<IQ", item, len(v)) + b"".join(value(item, x) for x in v)
        return struct.pack(scalar[vtype], v)

    out = bytearray(b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(fields)))
    for key, (vtype, v, item) in fields.items():
        out += string(key) + struct.pack("<I", vtype) + value(vtype, v, item)
    offset = 0
    for t in tensors:
        out += string(t["name"]) + struct.pack("<I", len(t["ne"])) + struct.pack(f"<{len(t['ne'])}Q", *t["ne"])
        out += struct.pack("<IQ", t["type"], offset)
        offset += -(-len(t["data"]) // alignment) * alignment
    out += bytes(-len(out) % alignment)
    for t in tensors:
        out += t["data"].tobytes() + bytes(-len(t["data"]) % alignment)
    Path(path).write_bytes(bytes(out))
    return Path(path)


@functools.cache
def why_no_memory_limits() -> str | None:
    """None when this machine lets the tests limit a child's memory (cgroup), else why not."""
    from selectinfer.runtime.memlimit import MemoryLimitError, run_limited

    try:
        run_limited([sys.executable, "-c", "pass"], 256 * 2**20, timeout_s=60)
    except MemoryLimitError as e:
        return str(e)
    return None


def needs_cgroups(test):
    """Skips the test, saying why, where the machine does not let it limit a child's memory
    (asked when the test runs, not when a module imports this one)."""
    @functools.wraps(test)
    def run(*args, **kwargs):
        reason = why_no_memory_limits()
        if reason is not None:
            pytest.skip(f"cannot limit memory here: {reason}")
        return test(*args, **kwargs)
    return run


def stored_rows(type_name: str, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """F32 rows stored as `type_name` (ggml's quantizer; F16 by numpy) and the float64 values the
    stored rows hold (gguf-py's dequantization): the op and kernel tests' reference weights."""
    from gguf import GGMLQuantizationType as T
    from gguf.quants import dequantize

    from selectinfer import _native

    qtype = T[type_name]
    if qtype == T.F32:
        raw = values
    elif qtype == T.F16:
        raw = values.astype(np.float16)
    else:
        raw = _native.quantize_rows(int(qtype), values)
    stored = raw if qtype in (T.F32, T.F16) else dequantize(raw, qtype)
    return raw, np.asarray(stored, dtype=np.float64).reshape(values.shape)


def ggml_include() -> Path:
    """ggml.h of the pinned, patched llama.cpp tree (the build's cache; made on first use)."""
    spec = importlib.util.spec_from_file_location("llama_cpp_source", Path(__file__).resolve().parents[1] / "cmake" / "llama_cpp_source.py")
    src = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(src)
    return src.patched_tree(Path(__file__).resolve().parents[1] / "ggml-patches") / "ggml" / "include"


# inputs and outputs of _testing.run_sparse_op: (ggml type, ne in ggml order, raw bytes)
def f32(a):
    from gguf import GGMLQuantizationType as T

    a = np.ascontiguousarray(a, dtype=np.float32)
    return (int(T.F32), list(reversed(a.shape)), a.tobytes())


def i32(a):
    from gguf import GGMLQuantizationType as T

    a = np.ascontiguousarray(a, dtype=np.int32)
    return (int(T.I32), [len(a)], a.tobytes())


# an optional op input left out (_testing.run_sparse_op: an input without shape or data)
LEFT_OUT = (0, [], b"")


def out_f32(raw, shape):
    return np.frombuffer(raw, dtype=np.float32).reshape(shape)


def file_budget_inputs(path, strategy: str | None = None) -> tuple[list[int], list[tuple[int, int, float, list[float]]], int]:
    """A SelectInfer file's layers as the per-layer budgets weigh them, read with gguf-py: (layer
    ids, [(n_load, n_min, bytes a computed neuron reads, shares)], N). gate-guided reads every
    loaded gate row anyway, so its neurons cost their up and down rows."""
    fields = gguf_fields(path)
    nbytes = {t["name"]: len(t["data"]) for t in gguf_tensors(path)}
    layers = list(fields[si_key("layers")][1])
    inputs = []
    for il, n_static in zip(layers, fields[si_key("static_counts")][1]):
        n_load = len(fields[si_key("neuron_ids", il)][1])
        gate, up = (nbytes[f"blk.{il}.{m}.weight"] / n_load for m in ("ffn_gate", "ffn_up"))
        down = nbytes[f"blk.{il}.ffn_down_t.weight"] / (n_load - n_static)
        shares = list(fields.get(si_key("neuron_shares", il), (None, []))[1])
        inputs.append((n_load, max(1, n_static), up + down if strategy == "gate-guided" else gate + up + down, shares))
    return layers, inputs, int(fields[si_key("original_n")][1])


def file_dropped_means(path, n_select: dict[int, int]) -> dict[int, "np.ndarray"]:
    """Each SelectInfer layer's expected activation of a dropped gathered neuron by the numpy
    reference, from the file's gate statistics (read with gguf-py) for steps that compute
    n_select[il] neurons, static ones included; {} for a file without gate statistics."""
    import numpy as np
    from reference import gelu, reference_dropped_means, silu

    fields = gguf_fields(path)
    act = gelu if fields["general.architecture"][1] == "gemma3" else silu
    out = {}
    for il, n_static in zip(fields[si_key("layers")][1], fields[si_key("static_counts")][1]):
        if si_key("gate_rms", il) not in fields:
            return {}
        rms = np.asarray(fields[si_key("gate_rms", il)][1])[n_static:]
        slope = np.asarray(fields[si_key("up_slope", il)][1])[n_static:]
        means = {}
        if si_key("gate_mean", il) in fields:
            means = {"gate_mean": np.asarray(fields[si_key("gate_mean", il)][1])[n_static:],
                     "up_mean": np.asarray(fields[si_key("up_mean", il)][1])[n_static:]}
        out[il] = reference_dropped_means(rms, slope, n_select[il] - n_static, act, **means,
                                          up_rms=file_step_weights(path).get(il))
    return out


def file_step_weights(path) -> dict[int, "np.ndarray"]:
    """Each SelectInfer layer's weight of a gathered neuron's score in a decode step's choice: the
    file's up root mean squares (read with gguf-py); {} for a file without them."""
    import numpy as np

    fields = gguf_fields(path)
    out = {}
    for il, n_static in zip(fields[si_key("layers")][1], fields[si_key("static_counts")][1]):
        if si_key("up_rms", il) not in fields:
            return {}
        out[il] = np.asarray(fields[si_key("up_rms", il)][1], dtype=np.float64)[n_static:]
    return out
