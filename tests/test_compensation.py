"""Dropped-neuron compensation (cpp/llama/compensation.cpp): each gathered neuron's expected activation
when a decode step drops it, against a numpy reference on a finer grid and against a Monte Carlo
simulation of the steps it models; the converter's gate statistics against numpy."""
import numpy as np
import pytest
from reference import gelu, reference_dropped_means, silu

from selectinfer import _testing
from selectinfer.method.convert import gate_means, gate_stats

ACTS = {"silu": silu, "gelu": gelu}


@pytest.mark.parametrize("activation", ["silu", "gelu"])
@pytest.mark.parametrize("n_kept", [0, 1, 17, 40, 63, 64])
def test_dropped_means_match_reference(activation, n_kept):
    rng = np.random.default_rng(n_kept)
    rms = rng.uniform(0.05, 4.0, 64).astype(np.float32)
    rms[5] = 0.0  # a gate that is always 0: never kept, nothing to add
    slope = rng.normal(0.0, 1.0, 64).astype(np.float32)
    got = np.array(_testing.dropped_means(rms.tolist(), slope.tolist(), n_kept, activation))
    want = reference_dropped_means(rms, slope, n_kept, ACTS[activation])
    assert got[5] == 0.0
    scale = max(np.abs(want).max(), 1e-6)
    assert np.abs(got - want).max() < 3e-2 * scale, (got, want)  # the engine's grid: 401 points
    if n_kept == 64:
        assert np.abs(want).max() < 1e-6  # nothing dropped
    if n_kept == 0:  # every neuron dropped: the unconditional mean, slope * E[act(g) g]
        z = np.random.default_rng(1).standard_normal(400_000)
        mc = slope * np.array([np.mean(ACTS[activation](s * z) * s * z) for s in rms])
        assert np.abs(got - mc).max() < 0.02 * np.abs(mc).max()


@pytest.mark.parametrize("activation", ["silu", "gelu"])
def test_dropped_means_are_what_steps_drop(activation):
    """Simulated steps: each token's gates g ~ N(0, rms^2), up = slope g + noise, the n_kept neurons
    with the largest |act(g)| kept; the mean activation of each neuron over the tokens that drop it
    is what dropped_means predicts."""
    rng = np.random.default_rng(7)
    n, n_kept, n_tokens = 300, 100, 20_000
    rms = rng.uniform(0.3, 3.0, n)
    slope = rng.normal(0.0, 1.0, n)
    g = rng.standard_normal((n_tokens, n)) * rms
    u = slope * g + rng.standard_normal((n_tokens, n))
    a = ACTS[activation](g) * u
    score = np.abs(ACTS[activation](g))
    kept = np.zeros_like(score, dtype=bool)
    np.put_along_axis(kept, np.argpartition(-score, n_kept - 1, axis=1)[:, :n_kept], True, axis=1)
    simulated = (a * ~kept).sum(0) / (~kept).sum(0)
    got = np.array(_testing.dropped_means(rms.tolist(), slope.tolist(), n_kept, activation))
    assert np.corrcoef(got, simulated)[0, 1] > 0.99
    assert np.abs(got - simulated).max() < 0.05 * np.abs(simulated).max()


@pytest.mark.parametrize("activation", ["silu", "gelu"])
@pytest.mark.parametrize("n_kept", [1, 17, 40])
def test_dropped_means_weighted_by_up_rms_match_reference(activation, n_kept):
    # a step that ranks |act(g)| times each neuron's up rms: the one threshold is on that score
    rng = np.random.default_rng(200 + n_kept)
    rms = rng.uniform(0.05, 4.0, 64).astype(np.float32)
    slope = rng.normal(0.0, 1.0, 64).astype(np.float32)
    up_rms = rng.uniform(0.1, 5.0, 64).astype(np.float32)
    got = np.array(_testing.dropped_means(rms.tolist(), slope.tolist(), n_kept, activation, up_rms=up_rms.tolist()))
    want = reference_dropped_means(rms, slope, n_kept, ACTS[activation], up_rms=up_rms)
    scale = max(np.abs(want).max(), 1e-6)
    assert np.abs(got - want).max() < 3e-2 * scale, (got, want)
    unweighted = reference_dropped_means(rms, slope, n_kept, ACTS[activation])
    assert np.abs(unweighted - want).max() > 0.2 * scale  # the weights move the threshold per neuron
    np.testing.assert_array_equal(  # weights of 1 are no weights, to the bit
        _testing.dropped_means(rms.tolist(), slope.tolist(), n_kept, activation, up_rms=[1.0] * 64),
        _testing.dropped_means(rms.tolist(), slope.tolist(), n_kept, activation))


@pytest.mark.parametrize("activation", ["silu", "gelu"])
def test_weighted_dropped_means_are_what_steps_drop(activation):
    """Simulated steps that keep the n_kept neurons with the largest |act(g)| times up's rms."""
    rng = np.random.default_rng(8)
    n, n_kept, n_tokens = 300, 100, 20_000
    rms = rng.uniform(0.3, 3.0, n)
    slope = rng.normal(0.0, 1.0, n)
    g = rng.standard_normal((n_tokens, n)) * rms
    u = slope * g + rng.standard_normal((n_tokens, n))
    up_rms = np.sqrt((u * u).mean(0))
    a = ACTS[activation](g) * u
    score = np.abs(ACTS[activation](g)) * up_rms
    kept = np.zeros_like(score, dtype=bool)
    np.put_along_axis(kept, np.argpartition(-score, n_kept - 1, axis=1)[:, :n_kept], True, axis=1)
    often = (~kept).sum(0) > 500  # neurons dropped often enough to measure
    simulated = (a * ~kept).sum(0)[often] / (~kept).sum(0)[often]
    got = np.array(_testing.dropped_means(rms.tolist(), slope.tolist(), n_kept, activation,
                                         up_rms=up_rms.tolist()))[often]
    assert often.sum() > 150
    assert np.corrcoef(got, simulated)[0, 1] > 0.99
    # (a heavily weighted neuron is dropped only in a narrow band of its gate, few grid points wide)
    scale = np.abs(simulated).max()
    assert np.abs(got - simulated).max() < 0.1 * scale and np.abs(got - simulated).mean() < 0.02 * scale


@pytest.mark.parametrize("activation", ["silu", "gelu"])
@pytest.mark.parametrize("n_kept", [0, 9, 31, 48])
def test_dropped_means_with_means_match_reference(activation, n_kept):
    rng = np.random.default_rng(100 + n_kept)
    n = 48
    sd = rng.uniform(0.05, 3.0, n)
    mu_g, mu_u = rng.normal(0.0, 1.5, n), rng.normal(0.0, 1.0, n)
    sd[7], mu_g[7] = 0.0, 0.8  # a constant gate
    b = rng.normal(0.0, 1.0, n)
    rms = np.sqrt(sd ** 2 + mu_g ** 2)
    slope = (b * sd ** 2 + mu_g * mu_u) / rms ** 2  # E[g u] / E[g^2]
    args = [rms.astype(np.float32).tolist(), slope.astype(np.float32).tolist(), n_kept, activation]
    got = np.array(_testing.dropped_means(*args, mu_g.astype(np.float32).tolist(), mu_u.astype(np.float32).tolist()))
    # the same grid as the engine's (401 points on [-6, 6]): the same numbers but where a point ties the threshold
    same_grid = reference_dropped_means(rms, slope, n_kept, ACTS[activation], mu_g, mu_u, grid=(6.0, 401))
    scale = max(np.abs(same_grid).max(), 1e-6)
    assert np.abs(got - same_grid).max() < 2e-2 * scale, (got, same_grid)  # (grid points at the threshold)
    # a 40x finer one: the grid's error (a shifted gate's dropped interval spans few grid points)
    fine = reference_dropped_means(rms, slope, n_kept, ACTS[activation], mu_g, mu_u)
    assert np.abs(got - fine).max() < 0.1 * scale and np.abs(got - fine).mean() < 0.02 * scale
    # zero means are the model without means, to the bit
    zero = [0.0] * n
    np.testing.assert_array_equal(_testing.dropped_means(*args, zero, zero), _testing.dropped_means(*args))
    if n_kept == 0:  # every neuron dropped: E[act(g) u], by Monte Carlo
        z = np.random.default_rng(2).standard_normal(400_000)
        mc = np.array([np.mean(ACTS[activation](m + s * z) * (mu + bb * s * z)) for m, s, mu, bb in zip(mu_g, sd, mu_u, b)])
        assert np.abs(got - mc).max() < 0.02 * np.abs(mc).max()


@pytest.mark.parametrize("activation", ["silu", "gelu"])
def test_dropped_means_with_means_are_what_steps_drop(activation):
    """As above, with gates of non-zero mean: g ~ N(mu_g, sd^2), up = mu_u + b (g - mu_g) + noise."""
    rng = np.random.default_rng(8)
    n, n_kept, n_tokens = 300, 100, 20_000
    sd, mu_g, mu_u, b = rng.uniform(0.3, 3.0, n), rng.normal(0, 1.5, n), rng.normal(0, 1, n), rng.normal(0, 1, n)
    g = mu_g + rng.standard_normal((n_tokens, n)) * sd
    u = mu_u + b * (g - mu_g) + rng.standard_normal((n_tokens, n))
    a = ACTS[activation](g) * u
    score = np.abs(ACTS[activation](g))
    kept = np.zeros_like(score, dtype=bool)
    np.put_along_axis(kept, np.argpartition(-score, n_kept - 1, axis=1)[:, :n_kept], True, axis=1)
    dropped = (~kept).sum(0)
    simulated = (a * ~kept).sum(0) / np.maximum(dropped, 1)
    often = dropped >= 3000  # (a gate of large mean is kept at nearly every step: too few samples)
    rms = np.sqrt((g * g).mean(0))
    slope = (g * u).mean(0) / (g * g).mean(0)
    got = np.array(_testing.dropped_means(rms.tolist(), slope.tolist(), n_kept, activation, g.mean(0).tolist(),
                                         u.mean(0).tolist()))
    got, simulated = got[often], simulated[often]
    assert often.sum() > 150
    assert np.corrcoef(got, simulated)[0, 1] > 0.99
    assert np.abs(got - simulated).max() < 0.05 * np.abs(simulated).max()
    # the zero-mean model misses them
    without = np.array(_testing.dropped_means(rms.tolist(), slope.tolist(), n_kept, activation))[often]
    assert np.abs(without - simulated).max() > 3 * np.abs(got - simulated).max()


def test_dropped_means_refuse_bad_arguments():
    with pytest.raises(ValueError, match=r"one slope \(and mean, up rms\) per neuron"):
        _testing.dropped_means([1.0, 1.0], [1.0], 1, "silu")
    with pytest.raises(ValueError, match="n_kept <= neurons"):
        _testing.dropped_means([1.0], [1.0], 2, "silu")
    with pytest.raises(ValueError, match="n_kept <= neurons"):
        _testing.dropped_means([1.0], [1.0], -1, "silu")
    with pytest.raises(ValueError, match="silu or gelu"):
        _testing.dropped_means([1.0], [1.0], 0, "relu")
    with pytest.raises(ValueError, match="and mean"):
        _testing.dropped_means([1.0, 1.0], [1.0, 1.0], 1, "silu", [0.5], [0.5, 0.5])
    with pytest.raises(ValueError, match="up rms"):
        _testing.dropped_means([1.0, 1.0], [1.0, 1.0], 1, "silu", up_rms=[1.0])


def test_gate_stats_match_numpy():
    """sqrt(E[g^2]), E[g u] / E[g^2] and sqrt(E[u^2]) over inputs whose second moment is the given one."""
    rng = np.random.default_rng(3)
    h = rng.standard_normal((5000, 24)) @ rng.normal(0, 1, (24, 24))
    moments = h.T @ h / len(h)
    gate, up = rng.normal(0, 1, (10, 24)), rng.normal(0, 1, (10, 24))
    gate[3] = 0.0
    rms, slope, up_rms = gate_stats(gate, up, moments)
    g, u = h @ gate.T, h @ up.T
    assert rms.dtype == np.float32 and slope.dtype == np.float32 and up_rms.dtype == np.float32
    np.testing.assert_allclose(rms, np.sqrt((g * g).mean(0)), rtol=1e-5)
    np.testing.assert_allclose(up_rms, np.sqrt((u * u).mean(0)), rtol=1e-5)
    want = np.divide((g * u).mean(0), (g * g).mean(0), out=np.zeros(10), where=rms > 0)
    np.testing.assert_allclose(slope, want, rtol=1e-4, atol=1e-6)
    assert rms[3] == 0.0 and slope[3] == 0.0


def test_gate_means_match_numpy():
    rng = np.random.default_rng(4)
    h = rng.standard_normal((3000, 16)) + rng.normal(0, 2, 16)  # not centered
    gate, up = rng.normal(0, 1, (7, 16)), rng.normal(0, 1, (7, 16))
    gate_mean, up_mean = gate_means(gate, up, h.mean(0))
    assert gate_mean.dtype == np.float32 and up_mean.dtype == np.float32
    np.testing.assert_allclose(gate_mean, (h @ gate.T).mean(0), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(up_mean, (h @ up.T).mean(0), rtol=1e-5, atol=1e-5)
