"""The fused block loops (cpp/ggml/cpu/block_loops.h) built for every x86 level this CPU can run, not only
the one the engine was built for: SSE2, SSE4.2, AVX, AVX2, AVX-512 and the two VNNI levels each
compile different code (vector width, F16C, byte widening, dot instructions), and a CPU only ever
runs one of them. Each build decodes random rows of every fused type, adds them and dots them;
numpy (gguf-py's dequantization) is the reference."""
import platform
import shutil
import subprocess
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from gguf.constants import GGML_QUANT_SIZES
from helpers import ggml_include, stored_rows

from selectinfer import _testing

REPO = Path(__file__).resolve().parents[1]
TYPES = [name.upper() for name in _testing.sparse_fused_types()]  # the types with fused row loops
# (name, compiler flags, the /proc/cpuinfo flags a CPU needs to run it): ggml's x86 variants' levels
LEVELS = [
    ("x86-64", [], []),
    ("sse4.2", ["-msse4.2"], ["sse4_2"]),
    ("avx", ["-mavx"], ["avx"]),
    ("avx2", ["-mavx2", "-mfma", "-mf16c"], ["avx2", "fma", "f16c"]),
    ("avx512", ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx2", "-mfma", "-mf16c"],
     ["avx512f", "avx512bw", "avx512vl", "avx2", "fma", "f16c"]),
    # the K-quants' integer dot products take one VNNI instruction where the CPU has it
    ("avxvnni", ["-mavxvnni", "-mavx2", "-mfma", "-mf16c"], ["avx_vnni", "avx2", "fma", "f16c"]),
    ("avx512vnni", ["-mavx512vnni", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx2", "-mfma", "-mf16c"],
     ["avx512_vnni", "avx512f", "avx512bw", "avx512vl", "avx2", "fma", "f16c"]),
]


def cpu_flags() -> set[str]:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


@pytest.fixture(scope="module")
def builds(tmp_path_factory):
    """{level: program} for every level this CPU runs."""
    if platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip(f"x86 levels only; this machine is {platform.machine()}")
    compiler = shutil.which("c++") or shutil.which("g++")
    if not compiler:
        pytest.skip("no C++ compiler on the PATH")
    include, flags, out = ggml_include(), cpu_flags(), tmp_path_factory.mktemp("block_loops")
    programs = {}
    for name, cflags, needs in LEVELS:
        if not set(needs) <= flags:
            continue
        program = out / name
        subprocess.run([compiler, "-O2", "-std=gnu++17", "-w", *cflags, "-I", str(REPO / "cpp" / "ggml"), "-I", str(REPO / "cpp" / "ggml" / "cpu"), "-I", str(include),
                        str(REPO / "tests" / "native" / "block_loops_check.cpp"), "-o", str(program)], check=True)
        programs[name] = program
    return programs


class LevelRun(NamedTuple):
    values: np.ndarray    # the rows decoded
    added: np.ndarray     # x + v @ rows
    dots: np.ndarray      # rows @ x, float loop
    int_dots: np.ndarray  # rows @ x with x quantized to int8 (the float loop where the build has none)
    int_rows: bool        # rows are added in integers
    int_dotted: bool      # int_dots came from the integer loop


def run_level(program, type_name, raw, n_rows, n_cols, v, x) -> LevelRun:
    row_bytes = len(raw) // n_rows
    data = raw + v.astype(np.float32).tobytes() + x.astype(np.float32).tobytes()
    result = subprocess.run([str(program), str(int(T[type_name])), str(n_rows), str(n_cols), str(row_bytes)],
                            input=data, capture_output=True, check=True)
    out = np.frombuffer(result.stdout, dtype=np.float32)
    assert len(out) == n_rows * n_cols + n_cols + 2 * n_rows + 2
    values, rest = out[:n_rows * n_cols].reshape(n_rows, n_cols), out[n_rows * n_cols:]
    return LevelRun(values, rest[:n_cols], rest[n_cols:n_cols + n_rows], rest[n_cols + n_rows:n_cols + 2 * n_rows],
                    bool(rest[-2]), bool(rest[-1]))


def test_every_level_this_cpu_runs_is_checked(builds):
    # x86-64 and SSE4.2 run everywhere the engine does; AVX2 on every CPU it is tuned for
    assert {"x86-64", "sse4.2"} <= set(builds)


# quantized types whose rows x86 builds with AVX2 add in integers (block_loops.h, SI_INT_ROWS)
INT_TYPES = {"Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K"}
INT_LEVELS = {"avx2", "avx512", "avxvnni", "avx512vnni"}
# and dots, x quantized to int8 (block_loops.h, SI_INT_DOTS)
INT_DOT_TYPES = {"Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K"}


@pytest.mark.parametrize("type_name", TYPES)
def test_block_loops_at_every_level(builds, type_name):
    rng = np.random.default_rng(7)
    block = GGML_QUANT_SIZES[T[type_name]][0]
    n_rows, n_cols = 21, 2 * max(block, 32) + (0 if block > 32 else 64)  # whole groups of rows and partial ones
    raw, stored = stored_rows(type_name, rng.standard_normal((n_rows, n_cols)).astype(np.float32))
    raw = raw.tobytes()
    v, x = rng.standard_normal(n_rows), rng.standard_normal(n_cols)
    expected_sum = x + v @ stored
    expected_dots = stored @ x
    for level, program in builds.items():
        values, y, dots, int_dots, int_rows, int_dotted = run_level(program, type_name, raw, n_rows, n_cols, v, x)
        assert int_rows == (type_name in INT_TYPES and level in INT_LEVELS), level
        assert int_dotted == (type_name in INT_DOT_TYPES and level in INT_LEVELS), level
        np.testing.assert_allclose(values, stored, rtol=1e-6, atol=1e-6, err_msg=f"{level}: decoded values")
        error = np.abs(y - expected_sum)
        if int_rows:  # 8-bit factors: upstream's dot-product precision (tests/test_sparse_ops.py's bound)
            assert error.max() <= 2e-2 * np.abs(expected_sum).max(), f"{level}: rows added"
            assert (error ** 2).mean() <= 1e-4 * (expected_sum ** 2).mean(), f"{level}: rows added (mean square)"
        else:  # converted exactly, float32 sums
            np.testing.assert_allclose(y, expected_sum, rtol=1e-4, atol=1e-4 * np.abs(expected_sum).max(),
                                       err_msg=f"{level}: rows added")
        np.testing.assert_allclose(dots, expected_dots, rtol=1e-4, atol=1e-4 * np.abs(expected_dots).max(),
                                   err_msg=f"{level}: rows dotted")
        if int_dotted:  # x rounded to 8 bits per 32 values, as upstream's Q8_0 activations
            error = np.abs(int_dots - expected_dots)
            assert error.max() <= 2e-2 * np.abs(expected_dots).max(), f"{level}: rows dotted in integers"
            assert (error ** 2).mean() <= 1e-4 * (expected_dots ** 2).mean(), f"{level}: (mean square)"


@pytest.mark.parametrize("type_name", ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0"])
@pytest.mark.parametrize("n_blocks", [1, 2, 3, 5, 6, 7, 18])
def test_rows_dotted_and_added_in_integers_over_any_block_count(builds, type_name, n_blocks):
    # AVX-512 VNNI dots four blocks per vector (a row's last group may hold one to three) and adds
    # two per vector, eight per call (an odd last block alone)
    rng = np.random.default_rng(10 + n_blocks)
    n_rows, n_cols = 21, 32 * n_blocks
    raw, stored = stored_rows(type_name, rng.standard_normal((n_rows, n_cols)).astype(np.float32))
    v, x = rng.standard_normal(n_rows), rng.standard_normal(n_cols)
    expected_dots, expected_sum = stored @ x, x + v @ stored
    # x rounded to int8 per block moves each of its values by at most half the block's step
    half_steps = np.repeat(np.abs(x.reshape(-1, 32)).max(axis=1) / 127 / 2, 32)
    dot_bound = np.abs(stored) @ half_steps * 1.001 + 1e-5 * np.abs(expected_dots).max()
    for level, program in builds.items():
        run = run_level(program, type_name, raw.tobytes(), n_rows, n_cols, v, x)
        assert (np.abs(run.int_dots - expected_dots) <= dot_bound).all(), f"{level}: rows dotted"
        error = np.abs(run.added - expected_sum)  # 8-bit factors: test_block_loops_at_every_level's bounds
        assert error.max() <= 2e-2 * np.abs(expected_sum).max(), f"{level}: rows added"
        assert (error ** 2).mean() <= 1e-4 * (expected_sum ** 2).mean(), f"{level}: rows added (mean square)"


@pytest.mark.parametrize("type_name", sorted(INT_TYPES))
@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_rows_added_with_a_non_finite_factor(builds, type_name, bad):
    # the integer loops take the float loop for such a group: NaN and inf reach the sum
    rng = np.random.default_rng(8)
    n_rows, n_cols = 11, 256
    raw, stored = stored_rows(type_name, rng.standard_normal((n_rows, n_cols)).astype(np.float32))
    v = rng.standard_normal(n_rows)
    v[3] = bad
    with np.errstate(invalid="ignore"):
        expected = np.zeros(n_cols) + v @ stored
    for level, program in builds.items():
        y = run_level(program, type_name, raw.tobytes(), n_rows, n_cols, v, np.zeros(n_cols)).added
        assert not np.isfinite(y[~np.isfinite(expected)]).any(), level  # never silently finite


def test_f16_edge_values_at_every_level(builds):
    # levels without F16C convert from the bits: zeros, subnormals, the largest half, inf, NaN
    specials = np.array([0.0, -0.0, 2.0**-24, -(2.0**-24), 3 * 2.0**-20, 6.1e-5, 65504.0, -65504.0,
                         np.inf, -np.inf, np.nan, 1.0, -2.5, 0.333], dtype=np.float16)
    row = np.resize(specials, 64)
    for level, program in builds.items():
        values = run_level(program, "F16", row.tobytes(), 1, 64, np.ones(1), np.zeros(64)).values
        np.testing.assert_array_equal(values[0], row.astype(np.float32), err_msg=level)


@pytest.mark.parametrize("type_name", sorted(INT_DOT_TYPES))
@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_rows_dotted_with_a_non_finite_input(builds, type_name, bad):
    # the block of x holding it quantizes with a NaN step: its dot products are NaN, never finite
    rng = np.random.default_rng(9)
    n_rows, n_cols = 13, 256  # a K-quant super-block
    raw, _ = stored_rows(type_name, rng.standard_normal((n_rows, n_cols)).astype(np.float32))
    x = rng.standard_normal(n_cols)
    x[40] = bad
    for level, program in builds.items():
        run = run_level(program, type_name, raw.tobytes(), n_rows, n_cols, np.zeros(n_rows), x)
        assert not np.isfinite(run.int_dots).any(), level


def extreme_q8_0_rows(rng, n_rows, n_cols, step=None):
    """(raw blocks, their values): Q8_0 rows of bytes -128 and 127 only (-128 is valid, though
    ggml's quantizer never writes it); every block's step `step` where given, else the quantizer's."""
    from gguf.quants import dequantize
    raw, _ = stored_rows("Q8_0", rng.standard_normal((n_rows, n_cols)).astype(np.float32))
    blocks = raw.reshape(n_rows, n_cols // 32, 34).copy()
    blocks[:, :, 2:] = np.where(rng.random((n_rows, n_cols // 32, 32)) < 0.5, 0x80, 0x7F)
    if step is not None:
        blocks[:, :, :2] = np.frombuffer(np.float16(step).tobytes(), dtype=np.uint8)
    return blocks, dequantize(blocks.reshape(n_rows, -1), T.Q8_0)


def test_q8_0_rows_of_extreme_bytes_dotted(builds):
    # |w| * x pairs reach 2 * 128 * 127
    rng = np.random.default_rng(10)
    n_rows, n_cols = 9, 96
    blocks, stored = extreme_q8_0_rows(rng, n_rows, n_cols)
    x = np.where(rng.random(n_cols) < 0.5, -1.0, 1.0) * rng.uniform(0.9, 1.0, n_cols)
    expected = stored @ x
    for level, program in builds.items():
        run = run_level(program, "Q8_0", blocks.tobytes(), n_rows, n_cols, np.zeros(n_rows), x)
        assert np.abs(run.int_dots - expected).max() <= 2e-2 * np.abs(expected).max(), level


def test_q8_0_rows_of_extreme_bytes_added(builds):
    # the integer loop adds |q| times a factor with q's sign: bytes of -128 and 127 under factors
    # of +-127 (every row's v of one magnitude) reach 2 * 128 * 127 per pair of rows in 16 bits
    rng = np.random.default_rng(11)
    n_rows, n_cols = 16, 96
    blocks, stored = extreme_q8_0_rows(rng, n_rows, n_cols, step=0.01)  # one step: factors at +-127
    v = np.where(rng.random(n_rows) < 0.5, -1.0, 1.0)
    expected = v @ stored
    for level, program in builds.items():
        run = run_level(program, "Q8_0", blocks.tobytes(), n_rows, n_cols, v, np.zeros(n_cols))
        assert np.abs(run.added - expected).max() <= 1e-2 * np.abs(expected).max() + 1e-6, level


@pytest.mark.parametrize("type_name", ["Q4_K", "Q5_K", "Q6_K"])
@pytest.mark.parametrize("n_rows", [1, 3, 6, 19])
def test_k_quant_rows_of_random_bytes_dotted_and_added(builds, type_name, n_rows):
    # every byte pattern is a valid K-quant super-block once its steps are finite: 6-bit scales
    # and minimums of 0 and 63, Q6_K's int8 scales of -128 and its values at 0 and 63, every bit
    # of qh (AVX-512 adds two blocks per vector, their high bits shifted per half); groups of
    # rows whole, partial and under a quad of four
    from gguf.quants import dequantize
    rng = np.random.default_rng(11 + n_rows)
    n_cols = 768
    block_bytes = GGML_QUANT_SIZES[T[type_name]][1]
    blocks = rng.integers(0, 256, (n_rows, n_cols // 256, block_bytes), dtype=np.uint8)
    steps = [block_bytes - 2] if type_name == "Q6_K" else [0, 2]  # d (and dmin) as fp16
    for at in steps:
        halves = rng.uniform(0.01, 0.1, (n_rows, n_cols // 256)).astype(np.float16)
        blocks[:, :, at:at + 2] = halves.view(np.uint8).reshape(n_rows, n_cols // 256, 2)
    stored = dequantize(blocks.reshape(n_rows, -1), T[type_name]).astype(np.float64)
    v, x = rng.standard_normal(n_rows), rng.standard_normal(n_cols)
    expected_dots, expected_sum = stored @ x, x + v @ stored
    # x rounded to int8 per 32 values moves each of its values by at most half the step
    half_steps = np.repeat(np.abs(x.reshape(-1, 32)).max(axis=1) / 127 / 2, 32)
    dot_bound = np.abs(stored) @ half_steps * 1.001 + 1e-5 * np.abs(expected_dots).max()
    for level, program in builds.items():
        run = run_level(program, type_name, blocks.tobytes(), n_rows, n_cols, v, x)
        assert run.int_dotted == run.int_rows == (level in INT_LEVELS), level
        assert (np.abs(run.int_dots - expected_dots) <= dot_bound).all(), f"{level}: rows dotted"
        error = np.abs(run.added - expected_sum)  # 8-bit factors: test_block_loops_at_every_level's bounds
        assert error.max() <= 2e-2 * np.abs(expected_sum).max(), f"{level}: rows added"
        assert (error ** 2).mean() <= 1e-4 * (expected_sum ** 2).mean(), f"{level}: rows added (mean square)"
