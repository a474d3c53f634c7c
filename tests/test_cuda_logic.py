"""The logic the CUDA kernels share with the host, checked on any machine: the per-type
dequantization (cpp/ggml/row_decode.h, built for the host) against gguf-py's, and the selection rule
(cpp/ggml/selection_rule.h: rank keys, their order bits, the radix select, ties to the lower row)
against numpy. The CPU kernels of count and select run the same rule (tests/test_sparse_ops.py);
the CUDA kernels themselves run in tests/test_cuda.py where a GPU is present."""
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from gguf.constants import GGML_QUANT_SIZES
from helpers import ggml_include, stored_rows

from selectinfer import _testing

REPO = Path(__file__).resolve().parents[1]
TYPES = [name.upper() for name in _testing.sparse_fused_types()]  # the types with fused row loops


def build_check(root: Path, *flags: str) -> Path:
    compiler = shutil.which("c++") or shutil.which("g++")
    if not compiler:
        pytest.skip("no C++ compiler on the PATH")
    program = root / "cuda_logic_check"
    subprocess.run([compiler, "-O2", "-std=gnu++17", "-Wall", "-Werror", *flags, "-I", str(REPO / "cpp" / "ggml"),
                    "-I", str(ggml_include()), str(REPO / "tests" / "native" / "cuda_logic_check.cpp"),
                    "-o", str(program)], check=True)
    return program


@pytest.fixture(scope="module")
def check(tmp_path_factory):
    return build_check(tmp_path_factory.mktemp("cuda_logic"))


@pytest.fixture(scope="module")
def check_flushing_subnormals(tmp_path_factory):
    """The checker built with -ffast-math, whose start-up code sets the x86 flags that read and
    write subnormals as zero: the host's stand-in for CUDA's -use_fast_math (flush to zero)."""
    import platform

    if platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("-ffast-math sets flush-to-zero at start-up on x86 only")
    return build_check(tmp_path_factory.mktemp("cuda_logic_ftz"), "-ffast-math")


def decode(program, type_name, raw: bytes, n_rows, n_cols):
    out = subprocess.run([str(program), "decode", str(int(T[type_name])), str(n_rows), str(n_cols),
                          str(len(raw) // n_rows)], input=raw, capture_output=True, check=True).stdout
    return np.frombuffer(out, dtype=np.float32).reshape(n_rows, n_cols)


def top(program, a: np.ndarray, k: int, by_magnitude: bool) -> np.ndarray:
    out = subprocess.run([str(program), "top", str(len(a)), str(k), str(int(by_magnitude))],
                         input=a.astype(np.float32).tobytes(), capture_output=True, check=True).stdout
    return np.frombuffer(out, dtype=np.int32)


def reference_top(a: np.ndarray, k: int, by_magnitude: bool) -> np.ndarray:
    """numpy: rank by value (or |value|), NaN last, ties to the lower index; ids ascending."""
    key = np.abs(a) if by_magnitude else a.astype(np.float64)
    key = np.where(np.isnan(key), -np.inf, key)
    order = np.lexsort((np.arange(len(a)), -key))  # by key descending, then index ascending
    return np.sort(order[:k]).astype(np.int32)


@pytest.mark.parametrize("type_name", TYPES)
def test_row_groups_decode_like_gguf_py(check, type_name):
    rng = np.random.default_rng(3)
    block = GGML_QUANT_SIZES[T[type_name]][0]
    n_rows, n_cols = 5, 3 * max(block, 32)
    values = rng.standard_normal((n_rows, n_cols)).astype(np.float32) * rng.uniform(0.01, 4, (n_rows, 1)).astype(np.float32)
    if type_name == "BF16":
        raw = (values.view(np.uint32) >> 16).astype(np.uint16)  # truncated: the stored bits
        stored = (raw.astype(np.uint32) << 16).view(np.float32)
    else:
        raw, stored = stored_rows(type_name, values)
    got = decode(check, type_name, np.ascontiguousarray(raw).tobytes(), n_rows, n_cols)
    np.testing.assert_allclose(got, stored, rtol=1e-6, atol=1e-6 * np.abs(stored).max())


def test_f16_edge_values_decode_exactly(check):
    specials = np.array([0.0, -0.0, 2.0**-24, -(2.0**-24), 3 * 2.0**-20, 6.1e-5, 65504.0, -65504.0,
                         np.inf, -np.inf, np.nan, 1.0, -2.5, 0.333], dtype=np.float16)
    row = np.resize(specials, 64)
    got = decode(check, "F16", row.tobytes(), 1, 64)
    np.testing.assert_array_equal(got[0], row.astype(np.float32))


@pytest.mark.parametrize("by_magnitude", [False, True])
@pytest.mark.parametrize("n,k", [(1, 1), (7, 3), (100, 1), (100, 100), (1000, 137), (4097, 2048)])
def test_top_k_matches_numpy(check, n, k, by_magnitude):
    rng = np.random.default_rng(n + k)
    a = rng.standard_normal(n).astype(np.float32)
    np.testing.assert_array_equal(top(check, a, k, by_magnitude), reference_top(a, k, by_magnitude))


@pytest.mark.parametrize("by_magnitude", [False, True])
def test_top_k_ties_nan_signed_zeros_and_infinities(check, by_magnitude):
    rng = np.random.default_rng(11)
    # few distinct values: most of the top k are ties, decided by the row
    a = rng.choice(np.array([0.0, -0.0, 1.5, -1.5, 2.0, np.nan, np.inf, -np.inf, 1e-40, -1e-40], dtype=np.float32), 500)
    for k in (1, 5, 17, 100, 250, 499, 500):
        np.testing.assert_array_equal(top(check, a, k, by_magnitude), reference_top(a, k, by_magnitude), err_msg=f"k={k}")


def test_top_k_of_nothing_is_empty(check):
    assert top(check, np.ones(10, dtype=np.float32), 0, False).size == 0


SIGNED_EDGES = np.array([1e-40, -1e-40, 0.0, -0.0, np.nan, -np.nan, np.inf, -np.inf, 1.0, -1.0, 3e-38], dtype=np.float32)


def positives(program, a: np.ndarray) -> int:
    return int(subprocess.run([str(program), "positives", str(len(a))], input=a.astype(np.float32).tobytes(),
                              capture_output=True, check=True).stdout)


@pytest.mark.parametrize("flush", [False, True])
def test_positives_are_counted_on_the_bits(request, flush):
    # subnormals count as positive even where the arithmetic flushes them to zero, as on the CPU
    program = request.getfixturevalue("check_flushing_subnormals" if flush else "check")
    assert positives(program, SIGNED_EDGES) == int(np.sum(SIGNED_EDGES > 0)) == 4


def score_of(program, x: np.ndarray, score: int) -> np.ndarray:
    out = subprocess.run([str(program), "score", str(len(x)), str(score)], input=x.astype(np.float32).tobytes(),
                         capture_output=True, check=True).stdout
    return np.frombuffer(out, dtype=np.float32)


@pytest.mark.parametrize("score", [1, 2])
def test_activation_scores_are_precise_for_negative_gates(check, score):
    """|SiLU| and |GELU| within a few 1e-5 relative of float64 where a gate is negative too: the
    GELU score has no cancellation of 1 + tanh(u) (upstream's form loses every digit by x = -5)."""
    from reference import gelu, silu

    x = np.linspace(-9, 9, 4001).astype(np.float32)
    x64 = x.astype(np.float64)
    if score == 1:
        expected = np.abs(silu(x64))
    else:  # 0.5 (1 + tanh(u)) = 1 / (1 + e^-2u), in float64, anchored to the tanh form where that one is exact
        u = np.sqrt(2.0 / np.pi) * (x64 + 0.044715 * x64 ** 3)
        expected = np.abs(x64 / (1.0 + np.exp(-2.0 * u)))
        np.testing.assert_allclose(expected[x > -2], np.abs(gelu(x64[x > -2])), rtol=1e-12)
    np.testing.assert_allclose(score_of(check, x, score), expected, rtol=3e-5, atol=0)
    edges = score_of(check, SIGNED_EDGES, score)
    assert np.isnan(edges[4:6]).all() and edges[6] == np.inf  # NaN stays NaN (ranked last), +inf is the largest
