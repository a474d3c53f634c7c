"""Helpers the tests share (the fixtures that use them are in conftest.py)."""
from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

from selectinfer.synthetic import make_model


def make_si_model(root: Path, *, seed: int, layers: str, n_ff: int = 256) -> tuple[Path, Path]:
    """A random tiny llama (3 layers, N = n_ff, F32) and its SelectInfer GGUF (random neurons,
    gamma 0.75, delta 0.25, the given layers): (dense path, SelectInfer path)."""
    from selectinfer.convert import convert

    src, out = root / "dense.gguf", root / "si.gguf"
    make_model(src, "tiny-llama", weight_type="F32", seed=seed, n_ff=n_ff, n_layer=3)
    convert(src, out, ranking="random", seed=2, load_ratio=0.75, static_ratio=0.25, layers=layers, progress=False)
    return src, out


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


def write_gguf(path, fields: dict, tensors: list[dict]) -> Path:
    """Writes a GGUF from gguf_fields / gguf_tensors style values (edited as a test needs)."""
    from gguf import GGUFValueType, GGUFWriter
    from gguf.quants import quant_shape_to_byte_shape

    empty = [k for k, (vt, v, _) in fields.items() if vt == GGUFValueType.ARRAY and len(v) == 0]
    if empty:  # gguf-py refuses to write empty arrays: a placeholder, then ggml's own writer empties them
        staged = write_gguf(Path(str(path) + ".staged"), {**fields, **{k: (GGUFValueType.ARRAY, [0], GGUFValueType.INT32)
                                                                      for k in empty}}, tensors)
        _with_empty_arrays(staged, Path(path), empty)
        staged.unlink()
        return Path(path)
    arch = fields["general.architecture"][1]
    w = GGUFWriter(str(path), arch)
    for key, (vtype, value, sub) in fields.items():
        if key == "general.architecture":
            continue
        w.add_key_value(key, value, vtype, sub if vtype == GGUFValueType.ARRAY else None)
    for t in tensors:
        # raw bytes: gguf-py takes the byte shape and works the element shape out from the type
        byte_shape = quant_shape_to_byte_shape(tuple(reversed(t["ne"])), t["type"])
        w.add_tensor(t["name"], t["data"].reshape(-1), raw_shape=byte_shape, raw_dtype=t["type"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return Path(path)


def _with_empty_arrays(src: Path, dst: Path, keys: list[str]) -> None:
    from selectinfer import _native

    old = _native.read_gguf_header(str(src))
    infos = [(t["name"], t["type"], t["ne"]) for t in old["tensors"]]
    new = _native.write_gguf_header(str(src), str(dst), keys, [(k, "arr_i32", []) for k in keys], infos)
    with open(src, "rb") as fin, open(dst, "r+b") as fout:
        for a, b in zip(old["tensors"], new["tensors"]):
            fin.seek(old["data_offset"] + a["offset"])
            fout.seek(new["data_offset"] + b["offset"])
            fout.write(fin.read(a["nbytes"]))
