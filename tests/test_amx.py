"""ggml's AMX kernels (Intel Xeons of the Sapphire Rapids class): GCC 12 deletes the stores of their
tile configuration (`_tile_loadconfig` names 8 of its 64 bytes), and every tile instruction after
it faults. ggml-patches/0005 loads the configuration with an operand covering the whole struct;
cmake/amx_tilecfg_check.py compiles ggml's routine and reads back what `ldtilecfg` receives, on any
CPU; on an AMX machine the default model must run with its weights in the AMX buffer."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers import tool

from selectinfer import Model, _native

ROOT = Path(__file__).resolve().parent.parent
CHECK = ROOT / "cmake" / "amx_tilecfg_check.py"
CXX = os.environ.get("CXX", "c++")


@pytest.fixture(scope="module")
def tree():
    """The patched llama.cpp tree the build uses (from the cache)."""
    out = subprocess.run([sys.executable, str(ROOT / "cmake" / "llama_cpp_source.py"), "--patches",
                          str(ROOT / "ggml-patches")], capture_output=True, text=True, check=True)
    return out.stdout.strip()


def check(tree, *args):
    r = subprocess.run([sys.executable, str(CHECK), tree, "--cxx", CXX, *args], capture_output=True, text=True)
    if r.returncode == 2:
        pytest.skip(r.stdout.strip())  # e.g. a compiler that cannot target AMX
    return r


def test_the_patched_tile_configuration_survives_the_compiler(tree):
    r = check(tree)
    assert r.returncode == 0, r.stdout
    assert "receives the 8 tiles of the source" in r.stdout


def test_the_check_catches_upstreams_deleted_stores(tree):
    """The check can fail: upstream's intrinsic, compiled by this platform's GCC, loses rows and colsb."""
    r = check(tree, "--upstream")
    if r.returncode == 0:
        pytest.skip(f"{CXX} keeps the stores of upstream's routine: the miscompilation does not occur with it")
    assert r.returncode == 1 and "MISCOMPILED" in r.stdout and "rows 0 colsb 0" in r.stdout, r.stdout


def test_the_check_reads_the_operand_on_a_cpu_without_amx(tree):
    """Under qemu (no AMX), ldtilecfg raises SIGILL and the probe decodes its memory operand instead."""
    if not shutil.which("qemu-x86_64"):
        pytest.skip("qemu-x86_64 (Debian qemu-user) is not installed")
    # qemu has no AVX-512: compile the routine for AVX2 plus the AMX instructions
    ok = check(tree, "--flags", "-O3 -march=haswell", "--run-with", "qemu-x86_64 -cpu max")
    assert ok.returncode == 0, ok.stdout
    bad = check(tree, "--flags", "-O3 -march=haswell", "--run-with", "qemu-x86_64 -cpu max", "--upstream")
    assert bad.returncode in (0, 1)  # it ran; whether GCC dropped the stores depends on the compiler


def amx_in_use() -> bool:
    return "AMX" in _native.extra_buffer_types()


def test_info_reports_amx():
    info = _native.system_info()
    compiled = "AMX_INT8 = 1" in info
    assert amx_in_use() == (compiled and cpu_has_amx()), (info, _native.extra_buffer_types())


def cpu_has_amx() -> bool:
    flags = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    return " amx_int8" in flags and " amx_tile" in flags


@pytest.mark.skipif(not cpu_has_amx(), reason="this CPU has no AMX (the AMX kernels never run here)")
def test_the_default_model_runs_on_amx(default_model):
    """In a child process (a fault would kill it): the default model's weights go to the AMX buffer,
    and generation gives the right answer."""
    if not amx_in_use():
        pytest.fail("this CPU has AMX but the build does not use it: " + _native.system_info())
    r = subprocess.run([tool("selectinfer-cli"), "-m", default_model, "-p", "The capital of France is", "-n", "8",
                        "--temp", "0", "-t", "2", "--repack"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"exit {r.returncode}: {r.stderr[-2000:]}"
    assert "Paris" in r.stdout
    with Model(default_model, n_ctx=256, repack=True) as m:
        assert m.weight_buffers().get("AMX", 0) > 0, m.weight_buffers()


@pytest.mark.skipif(not cpu_has_amx(), reason="this CPU has no AMX (the AMX kernels never run here)")
def test_a_selectinfer_prompt_between_amx_kernels_matches_the_same_without_amx(default_model, tmp_path):
    """A SelectInfer prompt's gathered gate, up and down projection run on the tile unit (bf16) on
    the threads that run ggml's AMX matmuls, which configure their tiles once per thread: the sparse
    kernels restore their configuration, so the prompt's logits match those of the same file with no
    weights in the AMX buffer within what ggml's AMX and plain kernels differ by (5% of the mean
    logit, the original model's too); a wrong tile shape in those matmuls gives other logits."""
    from selectinfer.method.convert import convert

    si = tmp_path / "si.gguf"
    convert(default_model, si, ranking="random", seed=3, load_ratio=0.7, static_ratio=0.3, progress=False)
    text = "The quick brown fox jumps over the lazy dog, and then it runs into the forest to hide. " * 2
    logits = {}
    for repack in (True, False):
        with Model(si, n_ctx=256, repack=repack) as m:
            assert (m.weight_buffers().get("AMX", 0) > 0) == repack, m.weight_buffers()
            tokens = m.tokenize(text)
            logits[repack] = m.logits(tokens)
            logits[repack] = np.concatenate([logits[repack], m.logits(tokens)])  # a second prompt after the first
    amx, plain = logits[True], logits[False]
    assert np.abs(amx - plain).mean() <= 0.1 * np.abs(plain).mean()  # ggml's AMX and plain kernels: 0.05
    assert (amx.argmax(axis=1) == plain.argmax(axis=1)).mean() >= 0.9
