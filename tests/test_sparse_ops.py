"""selectinfer's ggml ops on the CPU backend against plain numpy references: random inputs,
every supported weight type, odd sizes, 1 and several threads (like upstream's test-backend-ops)."""
import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize

from selectinfer import _native

TYPES = ["F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q4_K", "Q6_K"]
BLOCK = {"F32": 1, "F16": 1, "BF16": 1, "Q8_0": 32, "Q4_0": 32, "Q4_1": 32, "Q4_K": 256, "Q6_K": 256}
# relative error bound of each op's result for a weight type; the activations of mul_rows are
# converted to the type's vec_dot type (Q8 for quantized weights, F16/BF16 for half types)
BOUND = {"F32": 1e-5, "F16": 5e-3, "BF16": 2e-2, "Q8_0": 2e-2, "Q4_0": 2e-2, "Q4_1": 2e-2, "Q4_K": 2e-2, "Q6_K": 2e-2}


def weights(type_name, rows, cols, seed):
    """A weight matrix stored as `type_name` and the float64 values it holds (dequantized by gguf-py)."""
    rng = np.random.default_rng(seed)
    values = rng.standard_normal((rows, cols)).astype(np.float32)
    qtype = T[type_name]
    if qtype == T.F32:
        raw = values
    elif qtype == T.F16:
        raw = values.astype(np.float16)
    else:
        raw = _native.quantize_rows(int(qtype), values)
    stored = np.asarray(dequantize(raw, qtype) if qtype not in (T.F32, T.F16) else raw, dtype=np.float64)
    return (int(qtype), [cols, rows], raw.tobytes()), stored.reshape(rows, cols)


def f32(a):
    a = np.ascontiguousarray(a, dtype=np.float32)
    return (int(T.F32), list(reversed(a.shape)), a.tobytes())


def i32(a):
    a = np.ascontiguousarray(a, dtype=np.int32)
    return (int(T.I32), [len(a)], a.tobytes())


def out_f32(raw, shape):
    return np.frombuffer(raw, dtype=np.float32).reshape(shape)


@pytest.mark.parametrize("type_name", TYPES)
@pytest.mark.parametrize("n_tokens", [1, 3])
@pytest.mark.parametrize("n_threads", [1, 3])
def test_mul_rows(type_name, n_tokens, n_threads):
    rows, cols = 37, 2 * max(BLOCK[type_name], 64)
    w, w_values = weights(type_name, rows, cols, seed=1)
    rng = np.random.default_rng(2)
    x = rng.standard_normal((n_tokens, cols)).astype(np.float32)  # numpy [T, K] = ggml [K, T]
    ids = np.array([36, 0, 5, 5, 17, 2, 30, 11, 20], dtype=np.int32)  # odd count, unsorted, repeated
    got = out_f32(_native.run_sparse_op("mul_rows", [w, f32(x), i32(ids)], n_threads), (n_tokens, len(ids)))
    expected = x.astype(np.float64) @ w_values[ids].T
    assert np.abs(got - expected).max() <= BOUND[type_name] * np.abs(expected).max()


@pytest.mark.parametrize("type_name", TYPES)
@pytest.mark.parametrize("n_tokens", [1, 5, 70])
@pytest.mark.parametrize("n_threads", [1, 4])
@pytest.mark.parametrize("with_ids", [True, False])
@pytest.mark.parametrize("size", ["odd", "large"])
def test_mul_rows_t(type_name, n_tokens, n_threads, with_ids, size):
    rng = np.random.default_rng(4)
    if size == "odd":  # odd sizes (whole blocks of the type): the kernels' leftover paths
        rows, cols = 41, 3 * BLOCK[type_name] if BLOCK[type_name] > 1 else 77
        ids = np.array([40, 3, 3, 19, 0, 7, 28], dtype=np.int32) if with_ids else np.arange(rows - 4, dtype=np.int32)
    else:  # several row groups, weight panels and column tiles: the vectorised paths
        rows, cols = 300, max(2 * BLOCK[type_name], 320 if BLOCK[type_name] == 1 else 128)
        ids = rng.permutation(rows)[:203].astype(np.int32) if with_ids else np.arange(rows - 3, dtype=np.int32)
    w, w_values = weights(type_name, rows, cols, seed=3)
    h = rng.standard_normal((n_tokens, len(ids))).astype(np.float32)
    h[:, 1] = 0.0  # zero activations are skipped by the kernel: still correct
    inputs = [w, f32(h)] + ([i32(ids)] if with_ids else [])
    got = out_f32(_native.run_sparse_op("mul_rows_t", inputs, n_threads), (n_tokens, cols))
    expected = h.astype(np.float64) @ w_values[ids]
    # rows are dequantized exactly; only the float32 accumulation differs from float64
    assert np.abs(got - expected).max() <= 1e-5 * np.abs(expected).max()


def reference_select(act, n_static, n_dynamic, alpha, by_magnitude):
    """The selection algorithm, written plainly: act is numpy [T, n_load]."""
    n_tokens, n_load = act.shape
    k = min(n_load, int(np.floor(alpha * (act > 0).sum() / n_tokens + 0.5)))
    counts = np.zeros(n_load, dtype=np.int64)
    for t in range(n_tokens):
        v = np.abs(act[t]) if by_magnitude else act[t]
        order = sorted(range(n_load), key=lambda i: (-v[i], i))  # value desc, lower index first
        counts[order[:k]] += 1
    candidates = sorted(range(n_static, n_load), key=lambda i: (-counts[i], i))
    return list(range(n_static)) + sorted(candidates[:n_dynamic])


@pytest.mark.parametrize("by_magnitude", [False, True])
@pytest.mark.parametrize("n_tokens", [1, 9])
@pytest.mark.parametrize("alpha", [0.2, 0.5, 1.0])
@pytest.mark.parametrize("n_threads", [1, 3])  # threads rank tokens in turn, then counts merge
def test_select_matches_reference(by_magnitude, n_tokens, alpha, n_threads):
    rng = np.random.default_rng(5)
    n_load, n_static, n_dynamic = 53, 11, 17
    act = rng.standard_normal((n_tokens, n_load)).astype(np.float32)
    act[:, 20:23] = act[:, 20:21]  # ties in value
    got = np.frombuffer(_native.run_sparse_op("select", [f32(act)], n_threads, n_static, n_dynamic, alpha,
                                              by_magnitude), dtype=np.int32)
    assert got.tolist() == reference_select(act, n_static, n_dynamic, alpha, by_magnitude)


def test_select_with_no_positive_activation_keeps_best_ranked():
    act = -np.abs(np.random.default_rng(6).standard_normal((4, 20))).astype(np.float32)
    got = np.frombuffer(_native.run_sparse_op("select", [f32(act)], 1, 3, 5, 0.2, False), dtype=np.int32)
    assert got.tolist() == [0, 1, 2, 3, 4, 5, 6, 7]  # k = 0: no votes, ties to the lower (better-ranked) rows


def test_op_shape_errors():
    w, _ = weights("F32", 8, 64, 0)
    with pytest.raises(ValueError, match="input size"):
        _native.run_sparse_op("mul_rows", [w, (int(T.F32), [64, 1], b"\0" * 10), i32([1])], 1)
    with pytest.raises(ValueError, match="unknown op"):
        _native.run_sparse_op("nope", [w], 1)
