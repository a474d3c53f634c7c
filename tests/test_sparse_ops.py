"""selectinfer's ggml ops on the CPU backend against plain numpy references: random inputs,
every supported weight type, odd sizes, 1 and several threads (like upstream's test-backend-ops)."""
import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from helpers import LEFT_OUT, f32, i32, out_f32, stored_rows
from reference import gelu, reference_choose, reference_count, reference_select, silu, to_bf16

from selectinfer import _native, _testing

# every weight type a SelectInfer layer may hold (the loader refuses others: cpp/llama/si_gguf.cpp)
TYPES = ["F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"]
BLOCK = {t: 1 if t in ("F32", "F16", "BF16") else 256 if t.endswith("_K") else 32 for t in TYPES}
# relative error bound of each op's result for a weight type; the activations of mul_rows are
# converted to the type's vec_dot type (Q8 for quantized weights, F16/BF16 for half types)
BOUND = {t: 1e-5 if t == "F32" else 5e-3 if t == "F16" else 2e-2 for t in TYPES}
INT_ROW_TYPES = {"Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K"}  # mul_rows_t's integer loops (one token, AVX2)
INT_ROWS_BUILT = "AVX2 = 1" in _native.system_info()  # ggml-cpu's compile flags, which the loops share
# a prompt's mul_rows and mul_rows_t over quantized or BF16 rows on AMX tiles in bf16 (ggml-cpu
# built for a CPU with AMX, as ggml's own AMX code)
BF16_TILES_BUILT = "AMX_INT8 = 1" in _native.system_info()
BF16_TILE_TYPES = {t for t in TYPES if t not in ("F32", "F16")}
# elsewhere with AVX-512 VNNI, a prompt's mul_rows_t over quantized rows in int8 (8 tokens or more)
INT8_PROMPT_BUILT = "AVX512_VNNI = 1" in _native.system_info() and not BF16_TILES_BUILT
INT8_PROMPT_TYPES = {t for t in TYPES if t not in ("F32", "F16", "BF16")}


def check_mul_rows(got, x, w_rows, type_name):
    """mul_rows's result against numpy: within the type's bound of the exact product and, for a
    prompt on bf16 tiles, equal to the product of the bf16-rounded operands but for the float32
    sums (a misplaced value or tile is ~1e-2 off, the 8-bit activations of the other kernels ~2e-3)."""
    expected = x.astype(np.float64) @ w_rows.T
    scale = np.abs(expected).max()
    assert np.abs(got - expected).max() <= BOUND[type_name] * scale
    if x.shape[0] > 1 and BF16_TILES_BUILT and type_name in BF16_TILE_TYPES:
        assert np.abs(got - to_bf16(x) @ to_bf16(w_rows).T).max() <= 2e-4 * scale


def weights(type_name, rows, cols, seed):
    """A weight matrix stored as `type_name` and the float64 values it holds (dequantized by gguf-py)."""
    values = np.random.default_rng(seed).standard_normal((rows, cols)).astype(np.float32)
    raw, stored = stored_rows(type_name, values)
    return (int(T[type_name]), [cols, rows], raw.tobytes()), stored


@pytest.mark.parametrize("type_name", TYPES)
@pytest.mark.parametrize("n_tokens", [1, 3])
@pytest.mark.parametrize("n_threads", [1, 3])
def test_mul_rows(type_name, n_tokens, n_threads):
    rows, cols = 37, 2 * max(BLOCK[type_name], 64)
    w, w_values = weights(type_name, rows, cols, seed=1)
    rng = np.random.default_rng(2)
    x = rng.standard_normal((n_tokens, cols)).astype(np.float32)  # numpy [T, K] = ggml [K, T]
    ids = np.array([36, 0, 5, 5, 17, 2, 30, 11, 20], dtype=np.int32)  # odd count, unsorted, repeated
    got = out_f32(_testing.run_sparse_op("mul_rows", [w, f32(x), i32(ids)], n_threads), (n_tokens, len(ids)))
    check_mul_rows(got, x, w_values[ids], type_name)


@pytest.mark.parametrize("type_name", TYPES)
@pytest.mark.parametrize("n_tokens", [2, 4, 7, 70])
@pytest.mark.parametrize("n_threads", [1, 2, 4])
@pytest.mark.parametrize("with_ids", [True, False])
def test_mul_rows_tokens_many_rows(type_name, n_tokens, n_threads, with_ids):
    # a prompt's products (on AMX, quantized and BF16 rows on bf16 tiles, 32 rows by 32 tokens at a
    # time; else Q4_0 and Q4_1 on AVX2: the rows repacked 32 at a time for upstream's Q4_0 GEMM over
    # four tokens at a time, the last tokens one by one, Q4_1's offsets added after): several chunks
    # of rows and a partial one, token counts with and without a remainder of four or of a tile;
    # without ids, every row (n = R)
    rows, cols = 203, 3 * max(BLOCK[type_name], 64)
    w, w_values = weights(type_name, rows, cols, seed=5)
    rng = np.random.default_rng(6)
    x = rng.standard_normal((n_tokens, cols)).astype(np.float32)
    ids = rng.integers(0, rows, 101).astype(np.int32) if with_ids else np.arange(rows, dtype=np.int32)
    inputs = [w, f32(x)] + ([i32(ids)] if with_ids else [])
    got = out_f32(_testing.run_sparse_op("mul_rows", inputs, n_threads), (n_tokens, len(ids)))
    check_mul_rows(got, x, w_values[ids], type_name)


@pytest.mark.parametrize("type_name", TYPES)
@pytest.mark.parametrize("n_threads", [1, 2, 4])
@pytest.mark.parametrize("with_ids", [True, False])
def test_mul_rows_one_token_many_groups(type_name, n_threads, with_ids):
    # decode's loops take rows eight at a time, groups dealt out to threads, each reading its next
    # group ahead (Q4_0, Q4_1, Q8_0 and the K-quants in integers on AVX2): many groups and a partial last one;
    # without ids, every row (decode over every loaded neuron)
    rows, cols = 300, 3 * max(BLOCK[type_name], 64)
    w, w_values = weights(type_name, rows, cols, seed=3)
    rng = np.random.default_rng(4)
    x = rng.standard_normal((1, cols)).astype(np.float32)
    ids = rng.integers(0, rows, 101).astype(np.int32) if with_ids else np.arange(rows, dtype=np.int32)
    inputs = [w, f32(x)] + ([i32(ids)] if with_ids else [])  # with ids: unsorted, with repeats
    got = out_f32(_testing.run_sparse_op("mul_rows", inputs, n_threads), (1, len(ids)))
    expected = x.astype(np.float64) @ w_values[ids].T
    assert np.abs(got - expected).max() <= BOUND[type_name] * np.abs(expected).max()


@pytest.mark.parametrize("type_name", TYPES)
@pytest.mark.parametrize("n_tokens", [1, 5, 8, 70])
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
    got = out_f32(_testing.run_sparse_op("mul_rows_t", inputs, n_threads), (n_tokens, cols))
    expected = h.astype(np.float64) @ w_values[ids]
    error = np.abs(got - expected)
    if n_tokens == 1 and type_name in INT_ROW_TYPES and INT_ROWS_BUILT:
        # one token on x86 with AVX2: rows added in integers with 8-bit factors (cpp/ggml/cpu/block_loops.h),
        # mul_rows' bound; and its mean square error that of 8-bit rounding (~1e-5, not ~1e-2 of a bug)
        assert error.max() <= BOUND[type_name] * np.abs(expected).max()
        assert (error ** 2).mean() <= 1e-4 * (expected ** 2).mean()
    elif n_tokens > 1 and BF16_TILES_BUILT and type_name not in ("F32", "F16"):
        # weights and activations rounded to bf16 (8-bit mantissa, ~0.2% each): mean square error
        # ~5e-6 of the result's, not the ~1 of a misplaced pair or tile
        assert error.max() <= 1e-2 * np.abs(expected).max()
        assert (error ** 2).mean() <= 3e-5 * (expected ** 2).mean()
    elif n_tokens >= 8 and INT8_PROMPT_BUILT and type_name in INT8_PROMPT_TYPES:
        # weights and activations rounded to int8 along the neurons, each within half a step of
        # max|value| / 127 (a step per column or token and panel of neurons, never above the whole
        # column's or token's): the bound of those roundings, and a mean square error of ~1e-4
        # of the result's, not the ~1 of a misplaced column or neuron
        w_abs, h_abs = np.abs(w_values[ids]), np.abs(h.astype(np.float64))
        w_max, h_max = w_abs.max(axis=0), h_abs.max(axis=1)
        bound = (h_abs.sum(axis=1)[:, None] * w_max[None, :] + h_max[:, None] * w_abs.sum(axis=0)[None, :]) / 254 + \
            len(ids) * h_max[:, None] * w_max[None, :] / 254 ** 2
        assert (error <= bound + 1e-5 * np.abs(expected).max()).all()
        assert (error ** 2).mean() <= 3e-4 * (expected ** 2).mean()
    else:  # rows dequantized exactly; only the float32 accumulation differs from float64
        assert error.max() <= 1e-5 * np.abs(expected).max()


@pytest.mark.parametrize("type_name", TYPES)
@pytest.mark.parametrize("n_threads", [1, 3])
def test_mul_rows_t_with_offset(type_name, n_threads):
    # decode's compensation: each chosen neuron's activation less its nu (h_offset, by weight row)
    rows, cols = 300, max(2 * BLOCK[type_name], 128)
    w, w_values = weights(type_name, rows, cols, seed=7)
    rng = np.random.default_rng(8)
    ids = rng.permutation(rows)[:101].astype(np.int32)
    h = rng.standard_normal((1, len(ids))).astype(np.float32)
    offset = rng.standard_normal(rows).astype(np.float32)
    offset[ids[3]] = h[0, 3]  # an activation its offset cancels: the row adds nothing
    got = out_f32(_testing.run_sparse_op("mul_rows_t", [w, f32(h), i32(ids), f32(offset)], n_threads), (1, cols))
    expected = (h.astype(np.float64) - offset[ids]) @ w_values[ids]
    error = np.abs(got - expected)
    if type_name in INT_ROW_TYPES and INT_ROWS_BUILT:  # as test_mul_rows_t, one token
        assert error.max() <= BOUND[type_name] * np.abs(expected).max()
        assert (error ** 2).mean() <= 1e-4 * (expected ** 2).mean()
    else:
        assert error.max() <= 1e-5 * np.abs(expected).max()


def ffn_rows_case(gate_type, down_type, seed, rows=300, n_ids=101):
    """A gathered layer's weights as ggml_si_ffn_rows reads them: gate and up [K, rows] of one type,
    down_t [E, rows] (K and E whole blocks, several of the kernels' vectors), one token x, and ids
    (unsorted, with repeats, 101 = six groups of 16 and a partial one)."""
    K = 3 * max(BLOCK[gate_type], 64)
    E = max(2 * BLOCK[down_type], 160)
    gate, gate_values = weights(gate_type, rows, K, seed)
    up, up_values = weights(gate_type, rows, K, seed + 1)
    down, down_values = weights(down_type, rows, E, seed + 2)
    rng = np.random.default_rng(seed + 3)
    x = rng.standard_normal((1, K)).astype(np.float32)
    ids = rng.integers(0, rows, n_ids).astype(np.int32)
    return (gate, up, down, x, ids), (gate_values, up_values, down_values)


def ffn_rows_reference(values, x, ids, activation, prev):
    gate_values, up_values, down_values = values
    act = gelu if activation == "gelu" else silu
    h = act(x.astype(np.float64) @ gate_values[ids].T) * (x.astype(np.float64) @ up_values[ids].T)
    return h @ down_values[ids] + (0.0 if prev is None else prev.astype(np.float64))


@pytest.mark.parametrize("type_name", TYPES)
@pytest.mark.parametrize("n_threads", [1, 2, 3])
@pytest.mark.parametrize("activation", ["silu", "gelu"])
def test_ffn_rows(type_name, n_threads, activation):
    # a decode step's gathered FFN in one op: against numpy, and against the ops it stands for run
    # one by one (gate and up by mul_rows, the activation in numpy, down by mul_rows_t), first_id
    # set as for a layer whose gathered rows start after its static ones
    (gate, up, down, x, ids), values = ffn_rows_case(type_name, type_name, seed=11)
    first_id = 7
    prev = np.random.default_rng(12).standard_normal(down[1][0]).astype(np.float32)
    inputs = [gate, up, down, f32(x), i32(ids + first_id), f32(prev)]
    got = out_f32(_testing.run_sparse_op("ffn_rows", inputs, n_threads, first_id=first_id, activation=activation),
                  (1, down[1][0]))
    expected = ffn_rows_reference(values, x, ids, activation, prev)
    error, scale = np.abs(got - expected), np.abs(expected).max()
    # gate and up with x in 8 bits (mul_rows' bound), down's rows in 8-bit factors: a few percent
    # at most, a mean square error ~1e-4 of the result's, not the ~1 of a misplaced neuron
    assert error.max() <= 5 * BOUND[type_name] * scale
    assert (error ** 2).mean() <= 1e-3 * (expected ** 2).mean()

    def op(name, ins, shape):
        return out_f32(_testing.run_sparse_op(name, ins, n_threads, first_id=first_id), shape).astype(np.float64)
    g = op("mul_rows", [gate, f32(x), i32(ids + first_id)], (1, len(ids)))
    u = op("mul_rows", [up, f32(x), i32(ids + first_id)], (1, len(ids)))
    h = (gelu(g) if activation == "gelu" else silu(g)) * u
    in_steps = op("mul_rows_t", [down, f32(h), i32(ids + first_id)], (1, down[1][0])) + prev
    # the same kernels: apart only by the activation's float32 rounding (numpy's is float64)
    assert np.abs(got - in_steps).max() <= 2e-3 * scale


@pytest.mark.parametrize("gate_type,down_type", [("Q4_K", "Q6_K"), ("Q5_0", "Q8_0"), ("Q4_1", "F16"), ("F16", "Q4_0")])
@pytest.mark.parametrize("with_prev", [True, False])
def test_ffn_rows_down_of_another_type(gate_type, down_type, with_prev):
    # files keep down_t in another type than gate and up (Q4_K_M's Q6_K down; Q8_0 where a row is
    # not whole blocks of the source's type); no static block's output to add when prev is absent
    (gate, up, down, x, ids), values = ffn_rows_case(gate_type, down_type, seed=21, n_ids=40)
    prev = np.random.default_rng(22).standard_normal(down[1][0]).astype(np.float32) if with_prev else None
    inputs = [gate, up, down, f32(x), i32(ids)] + ([f32(prev)] if with_prev else [])
    got = out_f32(_testing.run_sparse_op("ffn_rows", inputs, 2), (1, down[1][0]))
    expected = ffn_rows_reference(values, x, ids, "silu", prev)
    error = np.abs(got - expected)
    assert error.max() <= 5 * max(BOUND[gate_type], BOUND[down_type]) * np.abs(expected).max()
    assert (error ** 2).mean() <= 1e-3 * (expected ** 2).mean()


@pytest.mark.parametrize("type_name", TYPES)
@pytest.mark.parametrize("n_threads", [1, 3])
@pytest.mark.parametrize("given", ["gate_values", "h_offset", "both"])
def test_ffn_rows_given_gate_values_and_offset(type_name, n_threads, given):
    # a step that chose its neurons by their gate passes the gate's values (random here, unlike the
    # gate rows' products, so that a gate dotted anyway shows), and the compensation's nu per row;
    # where both are given, without prev (the step's sum without a static block) and without the
    # gate weights (a gate-guided load repacks them for upstream's matmul)
    (gate, up, down, x, ids), values = ffn_rows_case(type_name, type_name, seed=31)
    rows = gate[1][1]
    rng = np.random.default_rng(32)
    x64 = x.astype(np.float64)
    g = x64 @ values[0][ids].T
    if given != "h_offset":
        gate_values = (g.std() * rng.standard_normal(rows)).astype(np.float32)
        g = gate_values[ids].astype(np.float64)
    else:
        gate_values = None
    h = silu(g) * (x64 @ values[1][ids].T)
    # offsets as large as the activations (an offset left out is then far outside the bound)
    offset = (h.std() * rng.standard_normal(rows)).astype(np.float32) if given != "gate_values" else None
    if offset is not None:
        h = h - offset[ids]
    prev = rng.standard_normal(down[1][0]).astype(np.float32) if given != "both" else None
    first_id = 5
    optional = [None if a is None else f32(a) for a in (prev, gate_values, offset)]
    inputs = [LEFT_OUT if given == "both" else gate, up, down, f32(x), i32(ids + first_id)]
    inputs += [LEFT_OUT if a is None else a for a in optional]
    got = out_f32(_testing.run_sparse_op("ffn_rows", inputs, n_threads, first_id=first_id), (1, down[1][0]))
    expected = h @ values[2][ids] + (0.0 if prev is None else prev)
    error, scale = np.abs(got - expected), np.abs(expected).max()
    assert error.max() <= 5 * BOUND[type_name] * scale
    assert (error ** 2).mean() <= 1e-3 * (expected ** 2).mean()

    # against the ops one by one: up by mul_rows, the activation in numpy, down by mul_rows_t with
    # the offset (the same kernels, apart by the activation's float32 rounding)
    def op(name, ins, shape):
        return out_f32(_testing.run_sparse_op(name, ins, n_threads, first_id=first_id), shape).astype(np.float64)
    if gate_values is None:
        g = op("mul_rows", [gate, f32(x), i32(ids + first_id)], (1, len(ids)))
    h = silu(g) * op("mul_rows", [up, f32(x), i32(ids + first_id)], (1, len(ids)))
    down_ins = [down, f32(h), i32(ids + first_id)] + ([f32(offset)] if offset is not None else [])
    in_steps = op("mul_rows_t", down_ins, (1, down[1][0])) + (0.0 if prev is None else prev)
    assert np.abs(got - in_steps).max() <= 2e-3 * scale


def run_count(act, alpha, by_magnitude, n_threads, prev=None):
    inputs = [f32(act)] + ([f32(prev)] if prev is not None else [])
    return out_f32(_testing.run_sparse_op("count", inputs, n_threads, alpha=alpha, by_magnitude=by_magnitude),
                   (act.shape[1],))


def run_select(counts, n_static, n_dynamic, score=0, n_threads=1, scale=None):
    inputs = [f32(counts)] + ([f32(scale)] if scale is not None else [])
    raw = _testing.run_sparse_op("select", inputs, n_threads, n_static, n_dynamic, score=score)
    return np.frombuffer(raw, dtype=np.int32).tolist()


@pytest.mark.parametrize("by_magnitude", [False, True])
@pytest.mark.parametrize("n_tokens", [1, 9])
@pytest.mark.parametrize("alpha", [0.2, 0.5, 1.0])
@pytest.mark.parametrize("n_threads", [1, 3])  # threads rank tokens in turn, then merge the counts
def test_count_matches_reference(by_magnitude, n_tokens, alpha, n_threads):
    rng = np.random.default_rng(5)
    act = rng.standard_normal((n_tokens, 53)).astype(np.float32)
    act[:, 20:23] = act[:, 20:21]  # ties in value
    prev = rng.integers(0, 5, 53).astype(np.float32)
    assert run_count(act, alpha, by_magnitude, n_threads).tolist() == reference_count(act, alpha, by_magnitude).tolist()
    assert run_count(act, alpha, by_magnitude, n_threads, prev).tolist() == \
        reference_count(act, alpha, by_magnitude, prev).tolist()


@pytest.mark.parametrize("by_magnitude", [False, True])
@pytest.mark.parametrize("n_load", [1077, 4099])
@pytest.mark.parametrize("n_threads", [1, 2])
def test_count_many_neurons_matches_reference(by_magnitude, n_load, n_threads):
    # a real layer's width (on AVX-512 the k-th largest is found by partitions around sampled
    # pivots, then a sort of the few left): tokens of other scales and signs, many equal values
    # (a token of one value, a token of zeros and -0, values repeated across the k-th), NaN and
    # infinities, a neuron count that is not a multiple of sixteen
    rng = np.random.default_rng(11)
    act = rng.standard_normal((12, n_load)).astype(np.float32)
    act[1] *= 1e4
    act[2] = -np.abs(act[2])
    act[3] = 0.5
    act[4, ::2] = 0.0
    act[4, 1::2] = -0.0
    act[5] = np.round(act[5] * 2) / 2  # a few distinct values, each many times
    act[6, ::7] = np.nan
    act[6, 3] = np.inf
    act[6, 5] = -np.inf
    act[7] = np.sort(act[7])[::-1]  # sorted: the sample's evenly spaced keys are in order
    act[8, : n_load // 2] = act[8, n_load // 2: 2 * (n_load // 2)]  # every value twice
    for alpha in (0.05, 0.2, 1.0):
        assert run_count(act, alpha, by_magnitude, n_threads).tolist() == \
            reference_count(act, alpha, by_magnitude).tolist(), alpha


@pytest.mark.parametrize("n_first", [1, 16, 448, 1076])
@pytest.mark.parametrize("n_threads", [1, 2, 3])
def test_count_in_two_parts_matches_reference(n_first, n_threads):
    # a prompt's static and gathered activations, counted where they are (no copy into one
    # tensor): the same counts as over the whole, ties and NaN across the seam included
    rng = np.random.default_rng(12)
    act = rng.standard_normal((9, 1077)).astype(np.float32)
    act[1, n_first - 1: n_first + 1] = act[1, 0]  # equal values on both sides of the seam
    act[2, ::5] = np.nan
    act[3] = np.round(act[3] * 2) / 2
    prev = rng.integers(0, 5, 1077).astype(np.float32)
    first, rest = np.ascontiguousarray(act[:, :n_first]), np.ascontiguousarray(act[:, n_first:])
    for alpha, by_magnitude in ((0.2, False), (0.5, True), (1.0, False)):
        for p in (None, prev):
            inputs = [f32(first), f32(rest)] + ([f32(p)] if p is not None else [])
            got = out_f32(_testing.run_sparse_op("count_parts", inputs, n_threads, alpha=alpha, by_magnitude=by_magnitude),
                          (1077,))
            assert got.tolist() == reference_count(act, alpha, by_magnitude, p).tolist(), (alpha, p is None)


def test_count_ranks_nan_below_every_number():
    act = np.random.default_rng(7).standard_normal((6, 40)).astype(np.float32)
    act[:, ::3] = np.nan
    act[2, :] = np.nan  # a token with nothing but NaN: k of them are counted, lower rows first
    for by_magnitude in (False, True):
        assert run_count(act, 0.5, by_magnitude, 2).tolist() == reference_count(act, 0.5, by_magnitude).tolist()


@pytest.mark.parametrize("n_static,n_dynamic", [(11, 17), (0, 30), (5, 0), (0, 53)])
def test_select_matches_reference(n_static, n_dynamic):
    counts = np.random.default_rng(8).integers(0, 6, 53).astype(np.float32)  # many ties
    assert run_select(counts, n_static, n_dynamic) == reference_choose(counts, n_static, n_dynamic)


@pytest.mark.parametrize("score,act", [(1, silu), (2, gelu)])
@pytest.mark.parametrize("n_static,n_dynamic", [(0, 40), (7, 150), (0, 300)])
def test_select_by_activation_magnitude_matches_reference(score, act, n_static, n_dynamic):
    # a decode step's choice: gate values in, the largest |act(gate)| chosen
    gate = (3 * np.random.default_rng(10).standard_normal(300)).astype(np.float32)
    gate[5] = np.nan  # ranked below every number
    scores = np.abs(act(gate.astype(np.float64)))
    scores[5] = -np.inf
    expected = reference_choose(scores, n_static, n_dynamic)
    if n_dynamic == 150:  # half the neurons: negative gates near act's minimum beat small positive ones
        assert expected != reference_choose(np.nan_to_num(gate, nan=-np.inf), n_static, n_dynamic)
    assert run_select(gate, n_static, n_dynamic, score) == expected


@pytest.mark.parametrize("score,act", [(0, None), (1, silu), (2, gelu)])
@pytest.mark.parametrize("n_static,n_dynamic", [(0, 1), (64, 700), (37, 2000), (0, 4099)])
@pytest.mark.parametrize("n_threads", [1, 3])  # threads score a range of candidates each, one chooses
@pytest.mark.parametrize("scaled", [False, True])
def test_select_many_neurons_matches_reference(score, act, n_static, n_dynamic, n_threads, scaled):
    # a real layer's width: a prompt's votes (few distinct values, each many times) or a decode
    # step's gate values, a NaN, and a neuron count that is not a multiple of sixteen; scaled: each
    # non-static neuron's score times its scale (a step's up weights; one of them 0)
    rng = np.random.default_rng(12)
    if act is None:
        values = rng.integers(0, 65, 4099).astype(np.float32)
        scores = values.astype(np.float64)
    else:
        values = (3 * rng.standard_normal(4099)).astype(np.float32)
        values[[5, 2000]] = np.nan
        scores = np.abs(act(values.astype(np.float64)))
    scale = None
    if scaled:
        scale = rng.uniform(0.1, 3.0, 4099 - n_static).astype(np.float32)
        scale[7] = 0.0
        scores[n_static:] = (scores[n_static:].astype(np.float32) * scale).astype(np.float64)  # as the op rounds
    scores[np.isnan(scores)] = -np.inf
    n_dynamic = min(n_dynamic, 4099 - n_static)
    expected = reference_choose(scores, n_static, n_dynamic)
    if scaled and act is not None and n_dynamic == 700:  # the scale changes the choice
        assert expected != reference_choose(np.nan_to_num(np.abs(act(values.astype(np.float64))), nan=-np.inf),
                                            n_static, n_dynamic)
    assert run_select(values, n_static, n_dynamic, score, n_threads, scale) == expected


def test_batches_add_up_to_the_prompts_selection():
    """A prompt in three batches: the running counts of each batch feed the next, and the selection
    from the last equals the reference's over the whole prompt."""
    act = np.random.default_rng(9).standard_normal((23, 61)).astype(np.float32)
    counts = None
    for start in range(0, 23, 8):
        counts = run_count(act[start:start + 8], 0.3, False, 2, counts)
    assert run_select(counts, 7, 19) == reference_select(act, 7, 19, 0.3, False, n_batch=8)


def test_select_with_no_positive_activation_keeps_best_ranked():
    act = -np.abs(np.random.default_rng(6).standard_normal((4, 20))).astype(np.float32)
    counts = run_count(act, 0.2, False, 1)
    assert counts.tolist() == [0.0] * 20  # k = 0: no votes
    assert run_select(counts, 3, 5) == [0, 1, 2, 3, 4, 5, 6, 7]  # ties to the lower (better-ranked) rows


def test_op_argument_errors():
    """Arguments that do not fit an op are exceptions, not assertions inside ggml."""
    w, _ = weights("F32", 8, 64, 0)
    x = f32(np.ones((1, 64)))
    bad = [
        (("mul_rows", [w, (int(T.F32), [64, 1], b"\0" * 10), i32([1])], 1), "input size"),
        (("nope", [w], 1), "unknown op"),
        (("mul_rows", [w, x, i32([8])], 1), "row id 8 outside"),
        (("mul_rows", [w, x, i32([-1])], 1), "row id -1 outside"),
        (("mul_rows", [w, f32(np.ones((1, 32))), i32([1])], 1), "row length"),
        (("mul_rows_t", [w, f32(np.ones((1, 2))), i32([1, 9])], 1), "row id 9 outside"),
        (("mul_rows_t", [w, f32(np.ones((1, 9)))], 1), "more values than the weight has rows"),
        (("count", [f32(np.ones((2, 5))), f32(np.ones(4))], 1, 0, 0, 0.5), "prev must be"),
        (("count", [f32(np.ones((2, 5)))], 1, 0, 0, 1.5), "alpha"),
        (("count_parts", [f32(np.ones((2, 5))), f32(np.ones((3, 4)))], 1, 0, 0, 0.5), "act's tokens"),
        (("count_parts", [f32(np.ones((2, 5))), f32(np.ones((2, 4))), f32(np.ones(5))], 1, 0, 0, 0.5), "prev must be"),
        (("select", [f32(np.ones(5))], 1, 3, 3), "n_static \\+ n_dynamic"),
        (("select", [f32(np.ones(5))], 1, -1, 2), "n_static \\+ n_dynamic"),
        (("select", [f32(np.ones(5))], 1, 1, 2, 0.0, False, 0, 3), "score must be"),
        (("mul_rows_t", [w, f32(np.ones((1, 2))), i32([1, 2]), f32(np.ones(7))], 1), "h_offset must be"),
        (("mul_rows_t", [w, f32(np.ones((2, 2))), i32([1, 2]), f32(np.ones(8))], 1), "h_offset takes one token"),
        (("mul_rows", [(int(T.Q4_0), [48, 2], b"\0" * 100), x, i32([0])], 1), "whole blocks"),
        (("mul_rows", [(999, [64, 2], b""), x, i32([0])], 1), "unknown ggml type"),
        (("mul_rows", [w, x, i32([0])], 0), "n_threads"),
        (("ffn_rows", [w, w, w, f32(np.ones(64)), i32([3, 8])], 1), "row id 8 outside"),
        (("ffn_rows", [w, w, w, f32(np.ones(64)), i32([3]), f32(np.ones(63))], 1), "prev must be"),
        (("ffn_rows", [w, weights("F16", 8, 64, 0)[0], w, f32(np.ones(64)), i32([3])], 1), "one type and shape"),
        (("ffn_rows", [w, w, weights("F32", 7, 64, 0)[0], f32(np.ones(64)), i32([3])], 1), "down_t must have"),
        (("ffn_rows", [w, w, w, f32(np.ones((2, 64))), i32([3])], 1), "x must be one token"),
        (("ffn_rows", [w, w, w, f32(np.ones(64)), i32([3]), LEFT_OUT, f32(np.ones(7))], 1), "gate_values must be"),
        (("ffn_rows", [w, w, w, f32(np.ones(64)), i32([3]), LEFT_OUT, LEFT_OUT, i32(range(8))], 1), "h_offset must be F32"),
        (("ffn_rows", [w, w, w, f32(np.ones(64)), LEFT_OUT], 1), "only ffn_rows's gate, prev"),
        (("mul_rows", [w, x, LEFT_OUT], 1), "only ffn_rows's gate, prev"),
        (("ffn_rows", [LEFT_OUT, w, w, f32(np.ones(64)), i32([3])], 1), "the gate or its values"),
    ]
    for args, match in bad:
        with pytest.raises(ValueError, match=match):
            _testing.run_sparse_op(*args)
    with pytest.raises(ValueError, match="activation must be"):
        _testing.run_sparse_op("ffn_rows", [w, w, w, f32(np.ones(64)), i32([3])], 1, activation="relu")


def test_unknown_device_names_the_devices():
    with pytest.raises(ValueError, match="no device NPU7 in this build .devices: CPU"):
        _testing.run_sparse_op("select", [f32(np.ones(4))], 1, 1, 1, device="NPU7")


def test_every_cpu_has_the_fused_loops():
    """The float, 4/8-bit and K-quant types (Q4_K_M and Q5_K_M files) take the fused row loops on
    every architecture (x86 with or without F16C, ARM); a build where one falls back to the per-row
    conversion fails here."""
    fused = {name.upper() for name in _testing.sparse_fused_types()}
    assert {"F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K"} <= fused, fused
