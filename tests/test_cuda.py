"""The CUDA backend, in the style of llama.cpp's test-backend-ops: every selectinfer op on the GPU
against numpy and against the CPU op, random inputs, every weight type the CUDA kernels take, odd
sizes, several token counts; end to end, the default model with every layer on the GPU against the
CPU, dense and SelectInfer at phi 0.4, the per-step strategies with and without dropped-neuron
compensation, and profiling on GPU layers. Skipped, with the reason in the
test summary, where this build or machine has no CUDA GPU (scripts/device_check.sh runs them on
one). The logic the kernels share with the host is checked everywhere (tests/test_cuda_logic.py)."""
import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from helpers import f32, i32, make_predicted_si_model, profiled_si_model, stored_rows
from reference import reference_choose, reference_count

from selectinfer import Model, _native, _testing

CUDA_TYPES = [name.upper() for name in _testing.sparse_fused_types()]  # the types with fused row loops
BLOCK = {t: 256 if t.endswith("_K") else 32 for t in CUDA_TYPES}


@pytest.fixture(scope="module")
def cuda():
    names = [d["name"] for d in _native.compute_devices() if d["type"] in ("GPU", "IGPU") and d["name"].startswith("CUDA")]
    if not names:
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
    scale = max(np.abs(expected).max(), 1e-30)
    assert np.abs(got - expected).max() <= bound * scale, np.abs(got - expected).max() / scale


@pytest.mark.parametrize("type_name", CUDA_TYPES)
@pytest.mark.parametrize("n_tokens", [1, 3, 17])
def test_mul_rows(cuda, type_name, n_tokens):
    rows, cols = 37, 3 * BLOCK[type_name]
    w, w_values = weights(type_name, rows, cols, seed=1)
    x = np.random.default_rng(2).standard_normal((n_tokens, cols)).astype(np.float32)
    ids = np.array([36, 0, 5, 5, 17, 2, 30, 11, 20], dtype=np.int32) + 4  # odd count, unsorted, repeated
    inputs = [w, f32(x), i32(ids)]
    got = run(cuda, "mul_rows", inputs, (n_tokens, len(ids)), first_id=4)
    close(got, x.astype(np.float64) @ w_values[ids - 4].T, 1e-5)
    close(got, run("CPU", "mul_rows", inputs, (n_tokens, len(ids)), first_id=4), 2e-2)


@pytest.mark.parametrize("type_name", CUDA_TYPES)
@pytest.mark.parametrize("n_tokens", [1, 2, 9, 70])
@pytest.mark.parametrize("with_ids", [True, False])
def test_mul_rows_t(cuda, type_name, n_tokens, with_ids):
    rows, cols = 301, 2 * BLOCK[type_name] + (96 if BLOCK[type_name] == 32 else 0)
    w, w_values = weights(type_name, rows, cols, seed=3)
    rng = np.random.default_rng(4)
    ids = rng.choice(rows, 157, replace=False).astype(np.int32) if with_ids else np.arange(200, dtype=np.int32)
    h = rng.standard_normal((n_tokens, len(ids))).astype(np.float32)
    h[:, ::7] = 0.0  # zeros are skipped at decode
    inputs = [w, f32(h)] + ([i32(ids)] if with_ids else [])
    got = run(cuda, "mul_rows_t", inputs, (n_tokens, cols))
    # the prompt path is a cuBLAS GEMM in TF32 (ggml's cuBLAS math mode): 10-bit products
    close(got, h.astype(np.float64) @ w_values[ids], 1e-5 if n_tokens == 1 else 3e-3)
    close(got, run("CPU", "mul_rows_t", inputs, (n_tokens, cols)), 3e-3)


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
    close(got, (h.astype(np.float64) - offset[ids]) @ w_values[ids], 1e-5)
    close(got, run("CPU", "mul_rows_t", inputs, (1, cols)), 3e-3)


@pytest.mark.parametrize("n_tokens", [1, 5, 33])
@pytest.mark.parametrize("alpha", [0.2, 0.5, 1.0])
@pytest.mark.parametrize("by_magnitude", [False, True])
def test_count(cuda, n_tokens, alpha, by_magnitude):
    rng = np.random.default_rng(n_tokens)
    n_load = 1031
    act = rng.standard_normal((n_tokens, n_load)).astype(np.float32)
    act[:, ::13] = np.round(act[:, ::13])  # ties
    act[0, 5] = np.nan
    prev = rng.integers(0, 9, n_load).astype(np.float32)
    inputs = [f32(act), f32(prev)]
    got = run(cuda, "count", inputs, (n_load,), alpha=alpha, by_magnitude=by_magnitude)
    np.testing.assert_array_equal(got, reference_count(act, alpha, by_magnitude, prev))
    np.testing.assert_array_equal(got, run("CPU", "count", inputs, (n_load,), alpha=alpha, by_magnitude=by_magnitude))


@pytest.mark.parametrize("n_static,n_dynamic", [(0, 1), (0, 300), (64, 200), (100, 931), (1, 0)])
def test_select(cuda, n_static, n_dynamic):
    counts = np.random.default_rng(n_dynamic).integers(0, 20, 1031).astype(np.float32)  # many ties
    got = run(cuda, "select", [f32(counts)], (n_static + n_dynamic,), dtype=np.int32, n_static=n_static,
              n_dynamic=n_dynamic)
    np.testing.assert_array_equal(got, reference_choose(counts, n_static, n_dynamic))


@pytest.mark.parametrize("score", [1, 2])  # |silu|, |gelu| of gate values: a decode step's choice
def test_select_by_activation_magnitude(cuda, score):
    # on a grid of 1/8: equal gates tie on both devices, different ones are far apart beside the
    # few ulps by which the devices' expf and tanhf may differ
    gate = (np.round(24 * np.random.default_rng(score).standard_normal(1031)) / 8).astype(np.float32)
    kw = dict(dtype=np.int32, n_static=0, n_dynamic=400, score=score)
    got = run(cuda, "select", [f32(gate)], (400,), **kw)
    np.testing.assert_array_equal(got, run("CPU", "select", [f32(gate)], (400,), **kw))


# --- end to end: the default model on the GPU against the CPU ---------------------------------------

PROMPT = "The capital of France is Paris. The capital of Germany is"


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


def test_default_model_on_the_gpu_decodes_like_the_cpu(cuda, default_model):
    gpu_follows_cpu(default_model)
    with Model(default_model, n_ctx=256, n_gpu_layers=-1) as gpu:
        assert "Berlin" in gpu.generate(PROMPT, 8, temperature=0)


@pytest.fixture(scope="module")
def si_default(default_model, tmp_path_factory):
    return profiled_si_model(default_model, tmp_path_factory.mktemp("cuda_si"))


def test_selectinfer_on_the_gpu_selects_and_decodes_like_the_cpu(cuda, si_default):
    gpu_follows_cpu(si_default, compute_ratio=0.4)
    gpu_follows_cpu(si_default, dense=True)
    # the same neurons chosen from the prompt (the selection ops are exact)
    chosen = []
    for layers in (0, -1):
        with Model(si_default, n_ctx=256, n_gpu_layers=layers, compute_ratio=0.4) as m:
            m.decode_tokens(m.tokenize(PROMPT), 1)
            chosen.append(m.selected_neurons())
    assert chosen[0].keys() == chosen[1].keys()
    for layer in chosen[0]:
        np.testing.assert_array_equal(chosen[1][layer], chosen[0][layer], err_msg=f"layer {layer}")


def test_gathered_weights_are_placed_in_vram(cuda, si_default):
    with Model(si_default, n_ctx=256, n_gpu_layers=-1) as m:
        placement = m.weight_placement()
    gathered = {name: buf for name, (_, buf) in placement.items() if name.endswith(("ffn_gate_dyn.weight", "ffn_down_t.weight"))}
    assert gathered and all(buf.startswith("CUDA") for buf in gathered.values()), gathered


def test_profiling_gpu_layers_matches_the_cpu(cuda, default_model):
    sums = []
    for layers in (0, -1):
        with Model(default_model, n_ctx=256, n_gpu_layers=layers, profile=True) as m:
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
