"""The CUDA backend, in the style of llama.cpp's test-backend-ops: every selectinfer op on the GPU
against numpy at numpy's bounds, and against the CPU op at the CPU op's own error; random inputs,
every weight type the CUDA kernels take, odd and large sizes (K > 1024, E > 4096, a prompt GEMM in
chunks), several token counts. End to end, the default model (or, on a machine that cannot fetch it,
a random-weight model of its shape: $SELECTINFER_GPU_TEST_MODEL) with every layer on the GPU against
the CPU, dense and SelectInfer at phi 0.4, the per-step strategies with and without dropped-neuron
compensation, and profiling on GPU layers. Skipped, with the reason in the test summary, where this
build or machine has no CUDA GPU (scripts/device_check.sh runs them on one, and fails if any is
skipped there). The logic the kernels share with the host is checked everywhere (tests/test_cuda_logic.py)."""
import os
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from helpers import f32, i32, make_predicted_si_model, profiled_si_model, stored_rows
from reference import gelu, reference_choose, reference_count, silu

from selectinfer import Model, _native, _testing

CUDA_TYPES = [name.upper() for name in _testing.sparse_fused_types()]  # GGML_SI_FUSED_TYPES, as built
BLOCK = {t: 256 if t.endswith("_K") else 32 for t in CUDA_TYPES}


def test_the_cuda_types_include_gemmas_gate_and_up_types():
    # Gemma-3's files as shipped hold gate and up in Q5_0; other files use Q5_1
    assert {"F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K"} <= set(CUDA_TYPES)


@pytest.fixture(scope="module")
def cuda():
    names = [d["name"] for d in _native.compute_devices() if d["type"] in ("GPU", "IGPU") and d["name"].startswith("CUDA")]
    if not names:
        if os.environ.get("SELECTINFER_REHEARSE") == "1":
            return None  # device_check.sh --rehearse: every fixture is built (pytest --setup-only), no test runs
        pytest.skip("no CUDA GPU: this build has no CUDA backend (SELECTINFER_CUDA=ON) or this machine no GPU; "
                    "scripts/device_check.sh runs these tests on a GPU machine")
    return names[0]


def weights(type_name, rows, cols, seed):
    values = np.random.default_rng(seed).standard_normal((rows, cols)).astype(np.float32)
    if type_name == "BF16":
        raw = (values.view(np.uint32) >> 16).astype(np.uint16)
        stored = (raw.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    else:
        raw, stored = stored_rows(type_name, values)
    return (int(T[type_name]), [cols, rows], np.ascontiguousarray(raw).tobytes()), stored


def run(device, op, inputs, shape, dtype=np.float32, **kw):
    return np.frombuffer(_testing.run_sparse_op(op, inputs, 2, device=device, **kw), dtype=dtype).reshape(shape)


def close(got, expected, bound):
    """Within bound of the largest |expected| (numpy's float64 product of the stored values)."""
    scale = max(np.abs(expected).max(), 1e-30)
    assert np.abs(got - expected).max() <= bound * scale, np.abs(got - expected).max() / scale


def close_to_cpu(got, cpu, expected, bound):
    """The GPU's result against the CPU op's, at the CPU op's own error: each value of the two
    differs by at most the CPU's distance from numpy's (its 8-bit activations, int8 row factors or
    bf16 tiles, tests/test_sparse_ops.py) plus the GPU's own bound."""
    scale = max(np.abs(expected).max(), 1e-30)
    allowed = np.abs(cpu - expected) + bound * scale
    worst = np.argmax(np.abs(got - cpu) - allowed)
    assert (np.abs(got - cpu) <= allowed).all(), (np.unravel_index(worst, got.shape), got.flat[worst], cpu.flat[worst])


# the prompt path of mul_rows_t is a cuBLAS GEMM in TF32 (ggml's cuBLAS math mode): 10-bit products
GEMM_BOUND = 3e-3


@pytest.mark.parametrize("type_name", CUDA_TYPES)
@pytest.mark.parametrize("n_tokens", [1, 3, 17])
def test_mul_rows(cuda, type_name, n_tokens):
    rows, cols = 37, 3 * BLOCK[type_name]
    w, w_values = weights(type_name, rows, cols, seed=1)
    x = np.random.default_rng(2).standard_normal((n_tokens, cols)).astype(np.float32)
    ids = np.array([36, 0, 5, 5, 17, 2, 30, 11, 20], dtype=np.int32) + 4  # odd count, unsorted, repeated
    inputs = [w, f32(x), i32(ids)]
    got = run(cuda, "mul_rows", inputs, (n_tokens, len(ids)), first_id=4)
    expected = x.astype(np.float64) @ w_values[ids - 4].T
    close(got, expected, 1e-5)
    close_to_cpu(got, run("CPU", "mul_rows", inputs, (n_tokens, len(ids)), first_id=4), expected, 1e-5)


@pytest.mark.parametrize("type_name", ["F16", "Q4_0", "Q6_K"])
def test_mul_rows_wide_rows(cuda, type_name):
    # K > 4096: each lane of the warp takes many 32-value groups
    rows, cols = 70, 8192 + BLOCK[type_name]
    w, w_values = weights(type_name, rows, cols, seed=11)
    x = np.random.default_rng(12).standard_normal((2, cols)).astype(np.float32)
    ids = np.random.default_rng(13).choice(rows, 45, replace=False).astype(np.int32)
    got = run(cuda, "mul_rows", [w, f32(x), i32(ids)], (2, len(ids)))
    close(got, x.astype(np.float64) @ w_values[ids].T, 1e-5)


@pytest.mark.parametrize("type_name", CUDA_TYPES)
@pytest.mark.parametrize("n_tokens", [1, 2, 9, 70])
@pytest.mark.parametrize("with_ids", [True, False])
@pytest.mark.parametrize("size", ["odd", "wide"])
def test_mul_rows_t(cuda, type_name, n_tokens, with_ids, size):
    if size == "odd":
        rows, cols = 301, 2 * BLOCK[type_name] + (96 if BLOCK[type_name] == 32 else 0)
    else:  # E > 4096: several blocks of 128 groups along the output
        rows, cols = 260, 4096 + 4 * BLOCK[type_name]
    w, w_values = weights(type_name, rows, cols, seed=3)
    rng = np.random.default_rng(4)
    ids = rng.choice(rows, 157, replace=False).astype(np.int32) if with_ids else np.arange(200, dtype=np.int32)
    h = rng.standard_normal((n_tokens, len(ids))).astype(np.float32)
    h[:, ::7] = 0.0  # zeros are skipped at decode
    inputs = [w, f32(h)] + ([i32(ids)] if with_ids else [])
    got = run(cuda, "mul_rows_t", inputs, (n_tokens, cols))
    expected = h.astype(np.float64) @ w_values[ids]
    bound = 1e-5 if n_tokens == 1 else GEMM_BOUND
    close(got, expected, bound)
    close_to_cpu(got, run("CPU", "mul_rows_t", inputs, (n_tokens, cols)), expected, bound)


@pytest.mark.parametrize("type_name", ["F16", "Q4_0", "Q4_K"])
def test_mul_rows_t_prompt_in_chunks(cuda, type_name):
    # E = 16384: the GEMM's scratch holds 1024 rows (64 MiB), so 1100 neurons take two chunks, the
    # second added onto the first
    rows, cols, n_tokens = 1200, 16384, 3
    w, w_values = weights(type_name, rows, cols, seed=21)
    rng = np.random.default_rng(22)
    ids = rng.choice(rows, 1100, replace=False).astype(np.int32)
    h = rng.standard_normal((n_tokens, len(ids))).astype(np.float32)
    got = run(cuda, "mul_rows_t", [w, f32(h), i32(ids)], (n_tokens, cols))
    close(got, h.astype(np.float64) @ w_values[ids], GEMM_BOUND)
    # the first chunk's product alone is far from it: a chunk left out or written over is caught
    assert np.abs(got - h[:, :1024].astype(np.float64) @ w_values[ids[:1024]]).max() > 10 * GEMM_BOUND * np.abs(got).max()


@pytest.mark.parametrize("type_name", CUDA_TYPES)
def test_mul_rows_t_with_offset(cuda, type_name):
    # decode's compensation: each activation less the offset of its weight row
    rows, cols = 301, 2 * BLOCK[type_name]
    w, w_values = weights(type_name, rows, cols, seed=5)
    rng = np.random.default_rng(6)
    ids = rng.choice(rows, 157, replace=False).astype(np.int32)
    h = rng.standard_normal((1, len(ids))).astype(np.float32)
    offset = rng.standard_normal(rows).astype(np.float32)
    inputs = [w, f32(h), i32(ids), f32(offset)]
    got = run(cuda, "mul_rows_t", inputs, (1, cols))
    expected = (h.astype(np.float64) - offset[ids]) @ w_values[ids]
    close(got, expected, 1e-5)
    close_to_cpu(got, run("CPU", "mul_rows_t", inputs, (1, cols)), expected, 1e-5)


@pytest.mark.parametrize("n_tokens", [1, 5, 33])
@pytest.mark.parametrize("alpha", [0.2, 0.5, 1.0])
@pytest.mark.parametrize("by_magnitude", [False, True])
@pytest.mark.parametrize("n_load", [1031, 8197])  # k up to ~500, and k > 1024 (8197: ~4100 positives)
def test_count(cuda, n_tokens, alpha, by_magnitude, n_load):
    rng = np.random.default_rng(n_tokens)
    act = rng.standard_normal((n_tokens, n_load)).astype(np.float32)
    act[:, ::13] = np.round(act[:, ::13])  # ties
    act[0, 5] = np.nan
    act[:, 7:9] = [1e-40, -1e-40]  # subnormals count as positive (on the bits), as on the CPU
    prev = rng.integers(0, 9, n_load).astype(np.float32)
    inputs = [f32(act), f32(prev)]
    got = run(cuda, "count", inputs, (n_load,), alpha=alpha, by_magnitude=by_magnitude)
    np.testing.assert_array_equal(got, reference_count(act, alpha, by_magnitude, prev))
    np.testing.assert_array_equal(got, run("CPU", "count", inputs, (n_load,), alpha=alpha, by_magnitude=by_magnitude))


@pytest.mark.parametrize("n_load,n_static,n_dynamic", [(1031, 0, 1), (1031, 0, 300), (1031, 64, 200), (1031, 100, 931),
                                                    (1031, 1, 0), (8197, 300, 3000), (8197, 0, 8197)])
def test_select(cuda, n_load, n_static, n_dynamic):
    counts = np.random.default_rng(n_dynamic).integers(0, 20, n_load).astype(np.float32)  # many ties
    got = run(cuda, "select", [f32(counts)], (n_static + n_dynamic,), dtype=np.int32, n_static=n_static,
              n_dynamic=n_dynamic)
    np.testing.assert_array_equal(got, reference_choose(counts, n_static, n_dynamic))


@pytest.mark.parametrize("score,act", [(0, None), (1, silu), (2, gelu)])
def test_select_with_a_scale(cuda, score, act):
    # a decode step's choice by |act(gate)| times each neuron's scale (the up weights' norms)
    rng = np.random.default_rng(31 + score)
    n_load, n_static, n_dynamic = 4099, 37, 1500
    values = (3 * rng.standard_normal(n_load)).astype(np.float32)
    scale = rng.uniform(0.1, 3.0, n_load - n_static).astype(np.float32)
    scale[7] = 0.0
    scores = values.astype(np.float64) if act is None else np.abs(act(values.astype(np.float64)))
    scores[n_static:] = (scores[n_static:].astype(np.float32) * scale).astype(np.float64)  # as the op rounds
    got = run(cuda, "select", [f32(values), f32(scale)], (n_static + n_dynamic,), dtype=np.int32, n_static=n_static,
              n_dynamic=n_dynamic, score=score)
    np.testing.assert_array_equal(got, reference_choose(scores, n_static, n_dynamic))


@pytest.mark.parametrize("score", [1, 2])  # |silu|, |gelu| of gate values: a decode step's choice
def test_select_by_activation_magnitude(cuda, score):
    # on a grid of 1/8: equal gates tie on both devices, different ones are far apart beside the
    # few 1e-6 by which the devices' exp may differ (selection_rule.h)
    gate = (np.round(24 * np.random.default_rng(score).standard_normal(1031)) / 8).astype(np.float32)
    kw = dict(dtype=np.int32, n_static=0, n_dynamic=400, score=score)
    got = run(cuda, "select", [f32(gate)], (400,), **kw)
    np.testing.assert_array_equal(got, run("CPU", "select", [f32(gate)], (400,), **kw))
    scores = np.abs((silu if score == 1 else gelu)(gate.astype(np.float64)))
    np.testing.assert_array_equal(got, reference_choose(scores, 0, 400))


# --- end to end: the default model on the GPU against the CPU ---------------------------------------

PROMPT = "The capital of France is Paris. The capital of Germany is"


@pytest.fixture(scope="module")
def model_path(request):
    """The default model, or the random-weight model of its shape that $SELECTINFER_GPU_TEST_MODEL
    names (scripts/device_check.sh makes it where no registry can be reached): (path, is_real)."""
    made = os.environ.get("SELECTINFER_GPU_TEST_MODEL")
    if made:
        return Path(made), False
    return request.getfixturevalue("default_model"), True


def gpu_follows_cpu(path, n=24, **kw):
    """Greedy decode on the CPU, then the GPU fed the same tokens: the GPU's greedy choice at every
    step is the CPU's, except where the CPU's own top two are within 1% of the logit range."""
    with Model(path, n_ctx=256, **kw) as cpu:
        prompt = cpu.tokenize(PROMPT)
        tokens, cpu_logits = cpu.decode_tokens(prompt, n, logits=True)
    with Model(path, n_ctx=256, n_gpu_layers=-1, **kw) as gpu:
        _, gpu_logits = gpu.decode_tokens(prompt, n, follow=tokens, logits=True)
    for step, (c, g) in enumerate(zip(cpu_logits, gpu_logits)):
        top2 = np.sort(c)[-2:]
        if g.argmax() != c.argmax():
            assert top2[1] - top2[0] < 0.01 * (c.max() - c.min()), f"step {step}: GPU {g.argmax()} vs CPU {c.argmax()}"
    return tokens


def test_default_model_on_the_gpu_decodes_like_the_cpu(cuda, model_path):
    path, is_real = model_path
    gpu_follows_cpu(path)
    if is_real:
        with Model(path, n_ctx=256, n_gpu_layers=-1) as gpu:
            assert "Berlin" in gpu.generate(PROMPT, 8, temperature=0)


@pytest.fixture(scope="module")
def si_default(model_path, tmp_path_factory):
    return profiled_si_model(model_path[0], tmp_path_factory.mktemp("cuda_si"))


# the share of each layer's chosen neurons the GPU and CPU must agree on: their activations come
# from different kernels (MMQ, cuBLAS attention) and differ in the last bits, and vote counts full
# of ties may flip at the cut; the exact rule is tested op by op above (test_count, test_select)
SAME_CHOICE = 0.98


def test_selectinfer_on_the_gpu_selects_and_decodes_like_the_cpu(cuda, si_default):
    gpu_follows_cpu(si_default, compute_ratio=0.4)
    gpu_follows_cpu(si_default, dense=True)
    chosen = []
    for layers in (0, -1):
        with Model(si_default, n_ctx=256, n_gpu_layers=layers, compute_ratio=0.4) as m:
            m.decode_tokens(m.tokenize(PROMPT), 1)
            chosen.append(m.selected_neurons())
    assert chosen[0] and chosen[0].keys() == chosen[1].keys()
    for layer, on_cpu in chosen[0].items():
        on_gpu = chosen[1][layer]
        assert len(on_gpu) == len(on_cpu), f"layer {layer}"
        shared = len(np.intersect1d(on_cpu, on_gpu))
        assert shared >= SAME_CHOICE * len(on_cpu), f"layer {layer}: {shared} of {len(on_cpu)} chosen alike"


def test_gathered_weights_are_placed_in_vram(cuda, si_default):
    with Model(si_default, n_ctx=256, n_gpu_layers=-1) as m:
        placement = m.weight_placement()
    gathered = {name: buf for name, (_, buf) in placement.items() if name.endswith(("ffn_gate_dyn.weight", "ffn_down_t.weight"))}
    assert gathered and all(buf.startswith("CUDA") for buf in gathered.values()), gathered


def test_profiling_gpu_layers_matches_the_cpu(cuda, model_path):
    sums = []
    for layers in (0, -1):
        with Model(model_path[0], n_ctx=256, n_gpu_layers=layers, profile=True) as m:
            m.decode_tokens(m.tokenize(PROMPT), 4)
            sums.append(m.activation_sums()[0])
    for a, b in zip(sums[0], sums[1]):
        np.testing.assert_allclose(b, a, rtol=5e-2, atol=1e-3 * np.abs(a).max())


@pytest.mark.parametrize("strategy", ["gate-guided", "predicted"])
@pytest.mark.parametrize("compensate", [True, False])
def test_step_strategies_on_the_gpu_decode_like_the_cpu(cuda, tmp_path, strategy, compensate):
    """Each step's own choice, and the compensation's vectors (made on the host, kept on the
    layer's device), on the GPU as on the CPU (a tiny model profiled with input moments)."""
    pytest.importorskip("safetensors.numpy", reason="safetensors' extension does not load on this interpreter",
                        exc_type=ImportError)
    path = make_predicted_si_model(tmp_path, seed=11, layers="1:3")
    gpu_follows_cpu(path, n=8, strategy=strategy, compute_ratio=0.4, compensate=compensate)
