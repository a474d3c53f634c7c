"""Per-layer budgets (cpp/llama/layer_budgets.cpp) against the numpy reference: uniform sizes are phi N
within each layer's bounds; the profile's share the uniform sizes' bytes out by share per byte."""
import numpy as np
import pytest
from reference import reference_layer_budgets, reference_uniform_size

from selectinfer import _native


def random_layers(rng, n_layers: int, n_original: int, *, equal_bytes: bool, ties: bool = False):
    layers = []
    for _ in range(n_layers):
        n_load = int(rng.integers(n_original // 4, n_original + 1))
        n_min = int(rng.integers(1, n_load // 2 + 1))
        mass = rng.gamma(rng.uniform(0.2, 3.0), size=n_original)
        if ties:
            mass = np.round(mass, 1)  # many equal shares, zeros too
        shares = np.sort(mass / mass.sum())[::-1][:n_load].astype(np.float32)
        neuron_bytes = 3 * 1088.0 if equal_bytes else float(rng.choice([3 * 544.0, 2 * 544.0 + 1088.0, 3 * 1088.0]))
        layers.append((n_load, n_min, neuron_bytes, shares.tolist()))
    return layers


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("equal_bytes", [True, False], ids=["equal-bytes", "mixed-types"])
def test_profile_budgets_match_reference(seed, equal_bytes):
    rng = np.random.default_rng(seed)
    n_original = 384
    layers = random_layers(rng, int(rng.integers(2, 9)), n_original, equal_bytes=equal_bytes, ties=seed % 3 == 0)
    for phi in (0.05, 0.2, 0.4, 0.55, 0.9, 1.0):
        uniform = _native.layer_budget_sizes(layers, phi, n_original, "uniform")
        profile = _native.layer_budget_sizes(layers, phi, n_original, "profile")
        assert uniform == [reference_uniform_size(phi, n_original, n, m) for n, m, _, _ in layers], phi
        assert profile == reference_layer_budgets(layers, phi, n_original), phi
        cost = [b for _, _, b, _ in layers]
        uniform_bytes, profile_bytes = np.dot(uniform, cost), np.dot(profile, cost)
        assert profile_bytes <= uniform_bytes
        assert all(m <= k <= n for k, (n, m, _, _) in zip(profile, layers))
        if equal_bytes:  # nothing left over but what no layer can take
            assert profile_bytes == uniform_bytes or profile == [n for n, _, _, _ in layers]


def test_profile_budgets_follow_the_spread_of_the_mass():
    """Two layers of the same cost: one whose mass sits in few neurons, one whose mass is spread
    evenly. At the same total the spread one gets more, and the concentrated one keeps at least
    its few heavy neurons."""
    n = 100
    concentrated = [0.09] * 10 + [0.1 / 90] * 90
    spread = [0.01] * 100
    layers = [(n, 1, 3.0, concentrated), (n, 1, 3.0, spread)]
    sizes = _native.layer_budget_sizes(layers, 0.3, n, "profile")
    assert sum(sizes) == 60 and sizes == [10, 50]  # ten heavy neurons, then every share of 0.01 before 0.0011


def test_a_layer_at_its_bounds_passes_its_budget_on():
    """A layer that cannot take more (n_load) or less (n_min) than uniform leaves the rest to the others."""
    full = (20, 1, 1.0, [0.05] * 20)           # all 20 kept at uniform already: n_load caps it
    fixed = (40, 40, 1.0, [0.025] * 40)        # all static: n_min holds it
    open_ = (100, 1, 1.0, sorted(np.linspace(0.02, 0.0, 100).tolist(), reverse=True))
    sizes = _native.layer_budget_sizes([full, fixed, open_], 0.3, 100, "profile")
    uniform = _native.layer_budget_sizes([full, fixed, open_], 0.3, 100, "uniform")
    assert uniform == [20, 40, 30] and sizes == [20, 40, 30]
    assert _native.layer_budget_sizes([full, open_], 0.3, 100, "profile") == [20, 30]


def test_bad_requests_say_what_is_wrong():
    with pytest.raises(ValueError, match="layer budgets must be uniform or profile, got 'even'"):
        _native.layer_budget_sizes([(10, 1, 1.0, [])], 0.5, 10, "even")
    with pytest.raises(ValueError, match="need each layer's neuron shares"):
        _native.layer_budget_sizes([(10, 1, 1.0, [0.1] * 9)], 0.5, 10, "profile")
