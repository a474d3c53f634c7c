"""Selective computation: in-graph selection against a numpy reference of the algorithm, sparse
decode against the reference with the same masks, phi = gamma against dense-over-loaded."""
import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFReader
from helpers import file_budget_inputs, file_dropped_means, file_step_weights, make_predicted_si_model, make_si_model
from reference import (ReferenceModel, reference_layer_budgets, reference_select, reference_sum_magnitude,
                       reference_uniform_size)

from selectinfer import Model, ModelLoadError
from selectinfer.method.convert import convert
from selectinfer.evaluation.synthetic import make_model
from selectinfer.runtime.si_format import key as si_key

PROMPT = "the capital of france is paris, a city on the"


@pytest.fixture(scope="module", params=["tiny-llama", "tiny-gemma3"])
def si_model(request, tmp_path_factory):
    """A SelectInfer tiny llama (SwiGLU) or gemma3 (GeGLU, post-FFN norm): N = 256, gamma 0.75,
    delta 0.25, layers 1..2 of 3."""
    root = tmp_path_factory.mktemp("selective")
    return make_si_model(root, seed=11, layers="1:3", shape=request.param)[1]


def forward_with_masks(ref: ReferenceModel, tokens, n_prompt, masks, si_layers):
    """Logits of the reference where SelectInfer layers compute only masks[il] for positions >= n_prompt;
    also returns the prompt's per-layer activations (dense over the loaded neurons)."""
    x = ref.embed(tokens)
    positions = np.arange(len(tokens))
    acts = {}
    for il in range(ref.n_layer):
        x = ref.attention_block(x, il, positions)
        act = ref.ffn_activations(ref.ffn_input(x, il), il)
        acts[il] = act[:n_prompt]
        if il in si_layers and il in masks:
            keep = np.zeros(act.shape[1], dtype=bool)
            keep[masks[il]] = True
            act[n_prompt:, ~keep] = 0.0
        x = ref.ffn_block(x, il, act)
    return ref.logits(x), acts


def decode(m: Model, prompt, n):
    """Greedy: prompt, then n decode steps; returns the generated tokens and each step's logits."""
    return m.decode_tokens(prompt, n, logits=True)


PROMPTS = ["the capital of", "paris is a city", "in the north of the", "a city on the seine", "the end of the",
           "he is in the town", "of the city", "the north", "a capital", "on the river"]


def top_k_margin(acts: dict, alpha: float, by_magnitude: bool) -> float:
    """Smallest gap, relative to max |a|, between a token's k-th and (k+1)-th activation: float32 and
    float64 can only disagree on the selection where this gap is at rounding level."""
    worst = np.inf
    for a in acts.values():
        v = np.abs(a) if by_magnitude else a
        k = min(a.shape[1], int(np.floor(alpha * (a > 0).sum() / a.shape[0] + 0.5)))
        if k < 1 or k >= a.shape[1]:
            continue
        s = -np.sort(-v, axis=1)
        worst = min(worst, float((s[:, k - 1] - s[:, k]).min() / np.abs(a).max()))
    return worst


@pytest.mark.parametrize("repack", [True, False], ids=["repack", "no-repack"])
@pytest.mark.parametrize("phi,alpha,select_by", [(0.5, 0.2, "value"), (0.4, 0.5, "magnitude"), (0.25, 0.2, "value")])
def test_selection_and_decode_match_reference(si_model, phi, alpha, select_by, repack):
    ref = ReferenceModel.load(si_model)
    with Model(si_model, n_ctx=128) as m:
        candidates = [m.tokenize(p) for p in PROMPTS]
    # a prompt without float-level near-ties at any top-k boundary, so the sets must agree exactly
    for prompt in candidates:
        _, acts = forward_with_masks(ref, prompt, len(prompt), {}, set())
        acts = {il: a for il, a in acts.items() if il in (1, 2)}
        if top_k_margin(acts, alpha, select_by == "magnitude") > 2e-5:  # 20x float32 rounding
            break
    else:
        pytest.fail("every candidate prompt has a near-tie at a top-k boundary")
    with Model(si_model, n_ctx=128, compute_ratio=phi, token_ratio=alpha, select_by=select_by, repack=repack) as m:
        tokens, logits = decode(m, prompt, 4)
        selected = m.selected_neurons()
    assert sorted(selected) == [1, 2]
    n_static, n_select = round(0.25 * 256), round(phi * 256)
    for il, ids in selected.items():
        expected = reference_select(acts[il], n_static, n_select - n_static, alpha, select_by == "magnitude")
        assert ids.tolist() == expected, f"layer {il}"
    # decode: the reference computes only the selected neurons after the prompt
    sequence = prompt + tokens
    ref_logits, _ = forward_with_masks(ref, sequence, len(prompt), selected, set(selected))
    expected_logits = ref_logits[len(prompt): len(prompt) + 4]
    assert np.abs(logits - expected_logits).max() < 2e-3 * np.abs(expected_logits).max()


def test_static_neurons_load_as_tensors_of_their_own(si_model, tmp_path):
    """Rows [0, n_static) of gate/up and ffn_down_static are upstream's matmul kinds (which ggml may
    repack), the gathered rows `ffn_*_dyn` and ffn_down_t; a layer without static neurons is whole."""
    n_embd, n_load, n_static = 64, round(0.75 * 256), round(0.25 * 256)
    for repack in (True, False):
        with Model(si_model, n_ctx=64, repack=repack) as m:
            placed = {name: ne for name, (ne, _) in m.weight_placement().items()}
        for il in (1, 2):
            for kind in ("ffn_gate", "ffn_up"):
                assert placed[f"blk.{il}.{kind}.weight"] == [n_embd, n_static]
                assert placed[f"blk.{il}.{kind}_dyn.weight"] == [n_embd, n_load - n_static]
            assert placed[f"blk.{il}.ffn_down_static.weight"] == [n_static, n_embd]
            assert placed[f"blk.{il}.ffn_down_t.weight"] == [n_embd, n_load - n_static]
        assert placed["blk.0.ffn_gate.weight"] == [n_embd, 256] and "blk.0.ffn_down.weight" in placed  # dense
    src, no_static = tmp_path / "dense.gguf", tmp_path / "no-static.gguf"
    make_model(src, "tiny-llama", weight_type="F32", seed=11, n_ff=256, n_layer=3)
    convert(src, no_static, ranking="random", seed=2, load_ratio=0.5, static_ratio=0.0, layers="1:3", progress=False)
    with Model(no_static, n_ctx=64) as m:
        placed = {name: ne for name, (ne, _) in m.weight_placement().items()}
    assert placed["blk.1.ffn_gate.weight"] == [n_embd, 128] and placed["blk.1.ffn_down_t.weight"] == [n_embd, 128]
    assert "blk.1.ffn_gate_dyn.weight" not in placed and "blk.1.ffn_down_static.weight" not in placed


def test_coreinfer_mode_needs_a_file_without_static_neurons(si_model, cli):
    """The static neurons are stored in upstream's layout, for upstream's matmul: the prompt cannot
    choose them. CoreInfer mode on such a file is refused with the way to convert for it."""
    with pytest.raises(ValueError, match="convert the model with --static-ratio 0 for CoreInfer mode"):
        Model(si_model, n_ctx=64, compute_ratio=0.5, coreinfer=True)
    core = cli("-m", si_model, "-p", "the capital", "-n", "2", "--coreinfer", "--compute-ratio", "0.5")
    assert core.returncode == 1 and "--static-ratio 0 for CoreInfer mode" in core.stderr
    assert len(core.stderr.strip().splitlines()) == 1


def clear_prompt(ref, candidates, alpha):
    """The first candidate prompt without float-level near-ties at a top-k boundary, and its activations."""
    for prompt in candidates:
        _, acts = forward_with_masks(ref, prompt, len(prompt), {}, set())
        acts = {il: a for il, a in acts.items() if il in (1, 2)}
        if top_k_margin(acts, alpha, False) > 2e-5:
            return prompt, acts
    pytest.fail("every candidate prompt has a near-tie at a top-k boundary")


def test_every_prompt_selects_over_all_its_tokens(si_model):
    """A one-token prompt selects (it is not a decode step), and a prompt that extends the cached
    one selects over all its tokens, not only the new ones."""
    ref = ReferenceModel.load(si_model)
    n_static, n_select = round(0.25 * 256), round(0.5 * 256)
    with Model(si_model, n_ctx=128, compute_ratio=0.5, token_ratio=0.5) as m:
        long_prompt, long_acts = clear_prompt(ref, [m.tokenize(p) for p in PROMPTS], 0.5)
        one_token, one_acts = clear_prompt(ref, [[t] for t in long_prompt], 0.5)
        for prompt, acts in [(long_prompt, long_acts), (one_token, one_acts), (long_prompt, long_acts)]:
            decode(m, prompt, 2)
            for il, ids in m.selected_neurons().items():
                expected = reference_select(acts[il], n_static, n_select - n_static, 0.5, False)
                assert ids.tolist() == expected, f"layer {il}, prompt of {len(prompt)} tokens"
        extended = long_prompt + [long_prompt[0]]  # the cached prompt plus one token
        _, ext_acts = forward_with_masks(ref, extended, len(extended), {}, set())
        decode(m, long_prompt, 1)
        decode(m, extended, 1)
        for il, ids in m.selected_neurons().items():
            if top_k_margin({il: ext_acts[il]}, 0.5, False) > 2e-5:
                expected = reference_select(ext_acts[il], n_static, n_select - n_static, 0.5, False)
                assert ids.tolist() == expected, f"layer {il}, extended prompt"


def test_a_prompt_in_several_batches_selects_from_all_of_them(si_model):
    """A prompt longer than n_batch is evaluated in batches; their votes add up (k per batch), so the
    selection is the reference's over the whole prompt, not the last batch's."""
    ref = ReferenceModel.load(si_model)
    n_static, n_select, n_batch = round(0.25 * 256), round(0.5 * 256), 6
    with Model(si_model, n_ctx=128) as m:
        prompt = m.tokenize(PROMPT + " " + PROMPT)[:17]  # three batches: 6 + 6 + 5 tokens
    _, acts = forward_with_masks(ref, prompt, len(prompt), {}, set())
    with Model(si_model, n_ctx=128, n_batch=n_batch, compute_ratio=0.5, token_ratio=0.5) as m:
        for _ in range(2):  # the second prompt counts from zero again
            decode(m, prompt, 2)
            selected = m.selected_neurons()
            for il in (1, 2):
                whole = reference_select(acts[il], n_static, n_select - n_static, 0.5, False, n_batch=n_batch)
                last_batch = reference_select(acts[il][12:], n_static, n_select - n_static, 0.5, False)
                assert whole != last_batch, "the prompt does not tell the two apart"
                assert selected[il].tolist() == whole, f"layer {il}"


def sum_magnitude_margin(acts: dict, n_static: int, n_dynamic: int) -> float:
    """Smallest gap, relative to the largest score, between the last chosen and the first left-out
    non-static neuron by sum |a|: float32 and float64 can only disagree where it is at rounding level."""
    worst = np.inf
    for a in acts.values():
        scores = -np.sort(-np.abs(a.astype(np.float64)).sum(axis=0)[n_static:])
        worst = min(worst, (scores[n_dynamic - 1] - scores[n_dynamic]) / scores[0])
    return worst


@pytest.mark.parametrize("n_batch", [512, 6], ids=["one-batch", "three-batches"])
def test_sum_magnitude_strategy_matches_reference(si_model, n_batch):
    """strategy="sum-magnitude": the neurons with the largest sum of |a| over the prompt (over all its
    batches), then decode computes exactly those, as the reference does."""
    ref = ReferenceModel.load(si_model)
    n_static, n_select = round(0.25 * 256), round(0.5 * 256)
    with Model(si_model, n_ctx=128) as m:
        candidates = [m.tokenize(p + " " + p) for p in PROMPTS]
    for prompt in candidates:
        _, acts = forward_with_masks(ref, prompt, len(prompt), {}, set())
        acts = {il: a for il, a in acts.items() if il in (1, 2)}
        if len(prompt) > 12 and sum_magnitude_margin(acts, n_static, n_select - n_static) > 1e-5:
            break
    else:
        pytest.fail("every candidate prompt has a near-tie at the selection boundary")
    with Model(si_model, n_ctx=128, n_batch=n_batch, strategy="sum-magnitude", compute_ratio=0.5) as m:
        assert m.selection_config()["strategy"] == "sum-magnitude"
        tokens, logits = decode(m, prompt, 3)
        selected = m.selected_neurons()
    for il in (1, 2):
        expected = reference_sum_magnitude(acts[il], n_static, n_select - n_static)
        assert selected[il].tolist() == expected, f"layer {il}"
        by_votes = reference_select(acts[il], n_static, n_select - n_static, 0.2, False)
        assert expected != by_votes, "the prompt does not tell the strategies apart"
    ref_logits, _ = forward_with_masks(ref, prompt + tokens, len(prompt), selected, set(selected))
    expected_logits = ref_logits[len(prompt): len(prompt) + 3]
    assert np.abs(logits - expected_logits).max() < 2e-3 * np.abs(expected_logits).max()


def test_fixed_strategy_computes_the_best_ranked_neurons_for_every_prompt(si_model):
    """strategy="fixed": no choice per prompt; decode computes the static neurons and the next in the
    file's ranking (stored in that order: rows 0..n-1), whatever the prompt."""
    ref = ReferenceModel.load(si_model)
    n_select = round(0.4 * 256)
    with Model(si_model, n_ctx=128, strategy="fixed", compute_ratio=0.4) as m:
        for text in PROMPTS[:2]:
            prompt = m.tokenize(text)
            tokens, logits = decode(m, prompt, 3)
            selected = m.selected_neurons()
            assert {il: ids.tolist() for il, ids in selected.items()} == {1: list(range(n_select)),
                                                                          2: list(range(n_select))}
            ref_logits, _ = forward_with_masks(ref, prompt + tokens, len(prompt), selected, set(selected))
            expected_logits = ref_logits[len(prompt): len(prompt) + 3]
            assert np.abs(logits - expected_logits).max() < 2e-3 * np.abs(expected_logits).max()


def test_the_files_strategy_is_its_default_and_settings_override_it(tmp_path, monkeypatch):
    """`selectinfer convert --strategy fixed` writes selectinfer.strategy: the file then decodes as
    strategy="fixed" does (the best-ranked neurons, whatever the prompt); SELECTINFER_STRATEGY
    overrides the file, and Model(strategy=) the environment."""
    src = tmp_path / "dense.gguf"
    make_model(src, "tiny-llama", weight_type="F32", seed=11, n_ff=256, n_layer=3)
    fixed = tmp_path / "fixed.gguf"
    convert(src, fixed, ranking="random", seed=2, load_ratio=0.75, static_ratio=0.25, layers="1:3",
            strategy="fixed", progress=False)
    assert GGUFReader(fixed).get_field(si_key("strategy")).contents() == "fixed"
    best_ranked = list(range(round(0.4 * 256)))

    def selections(**kwargs):
        with Model(fixed, n_ctx=128, compute_ratio=0.4, **kwargs) as m:
            out = []
            for text in PROMPTS[:3]:
                decode(m, m.tokenize(text), 1)
                out.append({il: ids.tolist() for il, ids in m.selected_neurons().items()})
            return out

    assert selections() == [{1: best_ranked, 2: best_ranked}] * 3
    by_prompt = selections(strategy="frequency")
    assert any(s != {1: best_ranked, 2: best_ranked} for s in by_prompt), "the prompts choose the best-ranked too"
    monkeypatch.setenv("SELECTINFER_STRATEGY", "frequency")
    assert selections() == by_prompt
    assert selections(strategy="fixed") == [{1: best_ranked, 2: best_ranked}] * 3


def forward_step_chosen(ref: ReferenceModel, tokens, n_prompt, n_static, n_select: dict, score_of, dropped=None):
    """Logits of the reference where each position >= n_prompt of a SelectInfer layer il (the keys
    of n_select) computes the static neurons and the n_select[il] - n_static others with the largest
    score_of(il, h, gate) (h: the
    token's FFN input, gate: its gate of every loaded neuron; one score per gathered neuron; ties to
    the lower row), and gives each dropped gathered neuron the activation dropped[il][its gathered
    row] (compensation; 0 without); also the smallest gap at that boundary, relative to the token's
    largest score."""
    x = ref.embed(tokens)
    positions = np.arange(len(tokens))
    margin = np.inf
    for il in range(ref.n_layer):
        x = ref.attention_block(x, il, positions)
        h = ref.ffn_input(x, il)
        gate, up = ref.gate_up(h, il)
        act = ref.act(gate) * up
        if il in n_select:
            for t in range(n_prompt, len(tokens)):
                score = score_of(il, h[t], gate[t])
                order = sorted(range(len(score)), key=lambda i: (-score[i], i))
                k = n_select[il] - n_static
                margin = min(margin, (score[order[k - 1]] - score[order[k]]) / score[order[0]])
                keep = np.zeros(act.shape[1], dtype=bool)
                keep[:n_static] = True
                keep[n_static + np.asarray(order[:k])] = True
                act[t, ~keep] = dropped[il][~keep[n_static:]] if dropped else 0.0
        x = ref.ffn_block(x, il, act)
    return ref.logits(x), margin


def expected_counts(path, phi: float, strategy: str | None, layer_budgets: str) -> dict[int, int]:
    """The neurons each SelectInfer layer of a file computes at decode, by the numpy reference."""
    layers, inputs, n_original = file_budget_inputs(path, strategy)
    if layer_budgets == "uniform":
        sizes = [reference_uniform_size(phi, n_original, n_load, n_min) for n_load, n_min, _, _ in inputs]
    else:
        sizes = reference_layer_budgets(inputs, phi, n_original)
    return dict(zip(layers, sizes))


def check_step_chosen(path, strategy, score_of, layer_budgets="uniform", compensate=None, weighted=True):
    """Decode steps of `strategy` against forward_step_chosen (phi 0.4, gamma 0.75, delta 0.25,
    layers 1..2; each layer's count by the reference's budgets; each neuron's score weighted by its
    up root mean square where the file has them (and weighted); the dropped neurons compensated by the
    reference's means where the file has gate statistics and compensate is not False): returns the
    logits."""
    ref = ReferenceModel.load(path)
    n_static, n_select = round(0.25 * 256), expected_counts(path, 0.4, strategy, layer_budgets)
    dropped = file_dropped_means(path, n_select) if compensate is not False else {}
    weights = file_step_weights(path) if weighted else {}
    with Model(path, n_ctx=128, strategy=strategy, compute_ratio=0.4, layer_budgets=layer_budgets,
               compensate=compensate) as m:
        assert m.computed_counts() == n_select
        assert m.selection_config()["compensate"] == bool(dropped)
        for text in PROMPTS:
            prompt = m.tokenize(text)
            tokens, logits = decode(m, prompt, 4)
            ref_logits, margin = forward_step_chosen(ref, prompt + tokens, len(prompt), n_static, n_select,
                                                     lambda il, h, gate: score_of(ref, il, h, gate, n_static) *
                                                     weights.get(il, 1.0), dropped)
            if margin > 2e-5:  # no float-level near-tie at any step's boundary
                break
        else:
            pytest.fail("every candidate prompt has a near-tie at a step's selection boundary")
        assert {il: ids.tolist() for il, ids in m.selected_neurons().items()} == {1: [], 2: []}
    expected_logits = ref_logits[len(prompt): len(prompt) + 4]
    assert np.abs(logits - expected_logits).max() < 2e-3 * np.abs(expected_logits).max()
    with Model(path, n_ctx=128, compute_ratio=0.4, layer_budgets=layer_budgets) as m:  # the prompt's choice differs
        _, by_prompt = decode(m, prompt, 4)
    assert np.abs(by_prompt - logits).max() > 1e-3
    return logits


def test_gate_guided_strategy_matches_reference(si_model):
    """strategy="gate-guided": each decode step computes gate over every loaded neuron, then up and
    down for the static ones and the phi N - n_static others with the largest |act(gate)| of that
    token; the prompt chooses nothing."""
    check_step_chosen(si_model, "gate-guided", gate_score)


@pytest.fixture(scope="module", params=["tiny-llama", "tiny-gemma3"])
def predicted_si_model(request, tmp_path_factory):
    # the profile is a safetensors file: its Rust extension is x86-64 only in the aarch64 (qemu) run
    pytest.importorskip("safetensors.numpy", reason="safetensors' extension does not load on this interpreter",
                        exc_type=ImportError)
    return make_predicted_si_model(tmp_path_factory.mktemp("predicted"), seed=11, layers="1:3", shape=request.param)


def predicted_score(ref, il, h, gate, n_static):
    p = f"blk.{il}.ffn_gate_pred_"
    return np.abs(ref.act(ref.weights[p + "out.weight"] @ (ref.weights[p + "in.weight"] @ h)))


def gate_score(ref, il, h, gate, n_static):
    return np.abs(ref.act(gate[n_static:]))


def test_predicted_strategy_matches_reference(predicted_si_model):
    """strategy="predicted": each decode step scores the gathered neurons by |act(pred_out @ pred_in
    @ h)| (the file's low-rank gate predictor), then gate, up and down for the static ones and the
    phi N - n_static best; the prompt chooses nothing."""
    types = {t.name: t.tensor_type for t in GGUFReader(str(predicted_si_model)).tensors if "_pred_" in t.name}
    assert set(types.values()) == {GGMLQuantizationType.F32} and len(types) == 4  # the gate's type
    check_step_chosen(predicted_si_model, "predicted", predicted_score)


# --- per-layer budgets (a profile-ranked file: the predicted fixture) ----------------------------

@pytest.mark.parametrize("strategy", ["frequency", "gate-guided", "predicted"])
def test_profile_budgets_share_out_the_same_bytes(predicted_si_model, strategy):
    """layer_budgets="profile": each layer's count is the reference's greedy share-out of the uniform
    sizes' bytes by the file's neuron shares; the layers' counts differ, their bytes do not grow."""
    uniform = expected_counts(predicted_si_model, 0.4, strategy, "uniform")
    with Model(predicted_si_model, n_ctx=64, compute_ratio=0.4, strategy=strategy, layer_budgets="profile") as m:
        counts = m.computed_counts()
        assert m.selection_config()["layer_budgets"] == "profile"
    assert counts == expected_counts(predicted_si_model, 0.4, strategy, "profile")
    assert counts != uniform and sum(counts.values()) == sum(uniform.values())  # the layers' rows cost the same
    with Model(predicted_si_model, n_ctx=64, compute_ratio=0.4, strategy=strategy) as m:
        assert m.computed_counts() == uniform


def test_profile_budgets_selection_and_decode_match_reference(predicted_si_model):
    """The frequency strategy with the profile's budgets: each layer's prompt selection is the
    reference's with that layer's count, and decode computes just those neurons."""
    ref = ReferenceModel.load(predicted_si_model)
    counts = expected_counts(predicted_si_model, 0.4, "frequency", "profile")
    with Model(predicted_si_model, n_ctx=128) as m:
        candidates = [m.tokenize(p) for p in PROMPTS]
    for prompt in candidates:
        _, acts = forward_with_masks(ref, prompt, len(prompt), {}, set())
        acts = {il: a for il, a in acts.items() if il in counts}
        if top_k_margin(acts, 0.2, False) > 2e-5:
            break
    else:
        pytest.fail("every candidate prompt has a near-tie at a top-k boundary")
    with Model(predicted_si_model, n_ctx=128, compute_ratio=0.4, layer_budgets="profile") as m:
        tokens, logits = decode(m, prompt, 4)
        selected = m.selected_neurons()
    n_static = round(0.25 * 256)
    for il, ids in selected.items():
        assert ids.tolist() == reference_select(acts[il], n_static, counts[il] - n_static, 0.2, False), f"layer {il}"
    ref_logits, _ = forward_with_masks(ref, prompt + tokens, len(prompt), selected, set(selected))
    expected_logits = ref_logits[len(prompt): len(prompt) + 4]
    assert np.abs(logits - expected_logits).max() < 2e-3 * np.abs(expected_logits).max()


@pytest.mark.parametrize("strategy,score_of", [("gate-guided", gate_score), ("predicted", predicted_score)],
                         ids=["gate-guided", "predicted"])
def test_step_strategies_with_profile_budgets_match_reference(predicted_si_model, strategy, score_of):
    check_step_chosen(predicted_si_model, strategy, score_of, layer_budgets="profile")


def test_profile_budgets_need_the_files_shares(si_model, monkeypatch):
    """A randomly ranked file has no profile shares: asking for its per-layer budgets says so, from
    Model(...) and from the environment."""
    with pytest.raises(ValueError, match="per-layer budgets from the profile need the neuron shares"):
        Model(si_model, layer_budgets="profile")
    monkeypatch.setenv("SELECTINFER_LAYER_BUDGETS", "profile")
    with pytest.raises(ValueError, match="per-layer budgets from the profile need the neuron shares"):
        Model(si_model)
    with Model(si_model, layer_budgets="uniform") as m:  # the caller's setting wins over the environment
        assert m.selection_config()["layer_budgets"] == "uniform"


# --- dropped-neuron compensation (the predicted fixture: its profile has input moments) -----------

def test_gate_guided_with_compensation_matches_reference(predicted_si_model):
    """A file with gate statistics compensates by default: each step's dropped gathered neurons
    count with the reference's expected activation (cpp/llama/compensation.h)."""
    check_step_chosen(predicted_si_model, "gate-guided", gate_score)


@pytest.mark.parametrize("strategy,score_of", [("gate-guided", gate_score), ("predicted", predicted_score)],
                         ids=["gate-guided", "predicted"])
def test_step_choice_weighs_each_gate_by_up_rms(predicted_si_model, strategy, score_of):
    """A file converted from a profile with input moments holds each loaded neuron's up root mean
    square, and a step ranks its gathered neurons by the score times it (a neuron's output scales
    with its up): the engine matches the weighted reference, and the unweighted one differs."""
    weights = file_step_weights(predicted_si_model)
    assert set(weights) == {1, 2} and all(np.all(w > 0) and w.std() > 0 for w in weights.values())
    check_step_chosen(predicted_si_model, strategy, score_of, compensate=False)
    with pytest.raises(AssertionError):
        check_step_chosen(predicted_si_model, strategy, score_of, compensate=False, weighted=False)


def test_compensation_off_matches_reference(predicted_si_model, monkeypatch):
    """compensate=False (or SELECTINFER_COMPENSATE=0) drops the neurons outright, and the logits differ."""
    on = check_step_chosen(predicted_si_model, "predicted", predicted_score)
    off = check_step_chosen(predicted_si_model, "predicted", predicted_score, compensate=False)
    assert np.abs(on - off).max() > 1e-3 * np.abs(on).max()
    monkeypatch.setenv("SELECTINFER_COMPENSATE", "0")
    with Model(predicted_si_model, n_ctx=64, strategy="predicted") as m:
        assert m.selection_config()["compensate"] is False
    with Model(predicted_si_model, n_ctx=64, strategy="predicted", compensate=True) as m:
        assert m.selection_config()["compensate"] is True


def test_compensation_leaves_prompt_strategies_alone(predicted_si_model):
    """The frequency strategy's decode is the same with compensation on or off (nothing to compensate)."""
    runs = []
    for compensate in (True, False):
        with Model(predicted_si_model, n_ctx=128, compute_ratio=0.4, compensate=compensate) as m:
            runs.append(decode(m, m.tokenize(PROMPTS[0]), 4)[1])
    np.testing.assert_array_equal(runs[0], runs[1])


def test_predicted_strategy_needs_a_predictor(si_model):
    with pytest.raises(ValueError, match="--predictor-rank"):
        Model(si_model, strategy="predicted")


def test_strategy_from_the_environment_and_overridden(si_model, monkeypatch):
    monkeypatch.setenv("SELECTINFER_STRATEGY", "sum-magnitude")
    with Model(si_model) as m:
        assert m.selection_config()["strategy"] == "sum-magnitude"
    with Model(si_model, strategy="frequency") as m:
        assert m.selection_config()["strategy"] == "frequency"


def test_scoring_after_a_prompt_uses_the_selection(si_model):
    """token_logprobs(n_prompt=...) scores each later token as a decode step with the prompt's neurons."""
    ref = ReferenceModel.load(si_model)
    with Model(si_model, n_ctx=128, compute_ratio=0.5) as m:
        tokens = m.tokenize(PROMPT)
        n_prompt = 5
        _, got = m.token_logprobs(tokens, n_prompt=n_prompt)
        selected = m.selected_neurons()
        with pytest.raises(ValueError, match="n_prompt"):
            m.token_logprobs(tokens, n_prompt=len(tokens))
    logits, _ = forward_with_masks(ref, tokens, n_prompt, selected, set(selected))
    logits = logits.astype(np.float64)
    logz = np.log(np.exp(logits - logits.max(1, keepdims=True)).sum(1)) + logits.max(1)
    expected = [logits[i - 1, tokens[i]] - logz[i - 1] for i in range(n_prompt, len(tokens))]
    assert got.shape == (len(tokens) - n_prompt,)
    # float32 rounding grows with the logits (gemma3's scaled embeddings make them large)
    assert np.abs(got - expected).max() < 2e-3 * max(1.0, np.abs(logits).max() / 20)


def test_one_pass_scoring_is_a_prompt_after_generation_too(si_model):
    """token_logprobs(text) in one pass computes every loaded neuron, also right after decode steps."""
    with Model(si_model, n_ctx=128, compute_ratio=0.25) as fresh:
        _, expected = fresh.token_logprobs(PROMPT)
    with Model(si_model, n_ctx=128, compute_ratio=0.25) as m:
        decode(m, m.tokenize("the north"), 3)  # a selection, and the engine in its decode phase
        _, got = m.token_logprobs(PROMPT)
    assert np.array_equal(got, expected)


def test_coreinfer_mode_chooses_every_neuron_from_the_prompt(tmp_path):
    """CoreInfer: with a gamma = 1, delta = 0 file the prompt chooses all phi N neurons."""
    src, out = tmp_path / "dense.gguf", tmp_path / "coreinfer.gguf"
    make_model(src, "tiny-llama", weight_type="F32", seed=11, n_ff=256, n_layer=3)
    convert(src, out, ranking="random", seed=2, load_ratio=1.0, static_ratio=0.0, layers="1:3", progress=False)
    ref = ReferenceModel.load(out)
    with Model(out, n_ctx=128) as m:
        prompt, acts = clear_prompt(ref, [m.tokenize(p) for p in PROMPTS], 0.2)
    with Model(out, n_ctx=128, compute_ratio=0.3, token_ratio=0.2, coreinfer=True) as m:
        decode(m, prompt, 2)
        assert m.selection_config()["coreinfer"]
        for il, ids in m.selected_neurons().items():
            assert ids.tolist() == reference_select(acts[il], 0, round(0.3 * 256), 0.2, False), f"layer {il}"
    with Model(out, n_ctx=128, compute_ratio=0.05, coreinfer=True) as m:
        decode(m, m.tokenize(PROMPT), 1)
        assert all(len(ids) == round(0.05 * 256) for ids in m.selected_neurons().values())


def test_full_compute_ratio_equals_dense_over_loaded(si_model):
    with Model(si_model, n_ctx=128, compute_ratio=0.75) as sel, Model(si_model, n_ctx=128, dense=True) as dense:
        prompt = sel.tokenize(PROMPT)
        t1, l1 = decode(sel, prompt, 6)
        t2, l2 = decode(dense, prompt, 6)
        assert all(len(ids) == 192 for ids in sel.selected_neurons().values())
    assert t1 == t2
    assert np.array_equal(l1, l2)


@pytest.mark.parametrize("static_ratio", [0.25, 0.0], ids=["static-rows", "no-static-rows"])
def test_dense_use_loads_the_gathered_rows_for_upstreams_matmul(tmp_path, monkeypatch, static_ratio):
    """dense=True (nothing will be gathered) loads every gate and up row as upstream's matmul kind:
    placed where ggml places the original's ffn_gate (CPU_REPACK or AMX where this CPU repacks
    Q4_0), with the logits of the same file loaded without repacking; ffn_down_t stays gathered."""
    src, out = tmp_path / "q4_0.gguf", tmp_path / "si.gguf"
    make_model(src, "tiny-llama", weight_type="Q4_0", seed=5, n_ff=256, n_layer=3)
    convert(src, out, ranking="random", seed=2, load_ratio=0.75, static_ratio=static_ratio, layers="1:3",
            progress=False)
    with Model(src, n_ctx=64) as m:
        original = m.weight_placement()["blk.1.ffn_gate.weight"][1]
    gathered = "ffn_{}_dyn" if static_ratio > 0 else "ffn_{}"
    logits = {}
    for repack in (True, False):
        with Model(out, n_ctx=64, dense=True, repack=repack) as m:
            placed = m.weight_placement()
            logits[repack] = m.logits(m.tokenize(PROMPT))
        for il in (1, 2):
            for kind in ("gate", "up"):
                name = f"blk.{il}.{gathered.format(kind)}.weight"
                assert placed[name][1] == (original if repack else "CPU_Mapped"), (name, placed[name])
            assert placed[f"blk.{il}.ffn_down_t.weight"][1] == "CPU_Mapped"
    # upstream's repacked kernels quantize the activations to 8 bits, the plain path less coarsely
    assert np.abs(logits[True] - logits[False]).mean() <= 0.05 * np.abs(logits[False]).mean()
    name = f"blk.1.{gathered.format('gate')}.weight"
    with Model(out, n_ctx=64) as m:  # loaded for selection: gathered rows in plain buffers
        assert m.weight_placement()[name][1] == "CPU_Mapped"
    monkeypatch.setenv("SELECTINFER_DENSE", "1")  # as llama.cpp's tools ask for it; the caller's word wins
    with Model(out, n_ctx=64) as m:
        assert m.weight_placement()[name][1] == original
    with Model(out, n_ctx=64, dense=False, compute_ratio=0.5) as m:
        assert m.weight_placement()[name][1] == "CPU_Mapped"
        decode(m, m.tokenize(PROMPT), 2)
        assert all(len(ids) == 128 for ids in m.selected_neurons().values())


@pytest.mark.parametrize("static_ratio", [0.25, 0.0], ids=["static-rows", "no-static-rows"])
def test_gate_guided_load_repacks_the_gathered_gate(tmp_path, monkeypatch, static_ratio):
    """The gate-guided strategy reads every gathered gate row at each step and at each prompt, so
    the model loads them as upstream's matmul kind (placed where ggml places the original's
    ffn_gate) and passes the gate's values to ggml_si_ffn_rows; up and ffn_down_t stay gathered.
    Decode matches the same file loaded without repacking (the repacked kernels' 8-bit activations
    apart), whichever of the caller, the environment or the file names the strategy."""
    src, out = tmp_path / "q4_0.gguf", tmp_path / "si.gguf"
    make_model(src, "tiny-llama", weight_type="Q4_0", seed=5, n_ff=256, n_layer=3)
    convert(src, out, ranking="random", seed=2, load_ratio=0.75, static_ratio=static_ratio, layers="1:3",
            strategy="gate-guided", progress=False)
    with Model(src, n_ctx=64) as m:
        original = m.weight_placement()["blk.1.ffn_gate.weight"][1]
    gathered = "ffn_{}_dyn" if static_ratio > 0 else "ffn_{}"
    gate, up = (f"blk.1.{gathered.format(kind)}.weight" for kind in ("gate", "up"))
    logits, counts = {}, {}
    for repack in (True, False):
        with Model(out, n_ctx=64, compute_ratio=0.5, repack=repack) as m:  # the file's strategy
            placed = m.weight_placement()
            _, logits[repack] = decode(m, m.tokenize(PROMPT), 4)
            counts[repack] = m.computed_counts()
        for il in (1, 2):
            assert placed[f"blk.{il}.{gathered.format('gate')}.weight"][1] == (original if repack else "CPU_Mapped")
            assert placed[f"blk.{il}.{gathered.format('up')}.weight"][1] == "CPU_Mapped"
            assert placed[f"blk.{il}.ffn_down_t.weight"][1] == "CPU_Mapped"
    assert counts[True] == counts[False] == {1: 128, 2: 128}
    assert np.abs(logits[True] - logits[False]).mean() <= 0.05 * np.abs(logits[False]).mean()
    with Model(out, n_ctx=64, strategy="frequency") as m:  # the caller's word wins over the file's
        assert m.weight_placement()[gate][1] == "CPU_Mapped"
        decode(m, m.tokenize(PROMPT), 2)
    monkeypatch.setenv("SELECTINFER_STRATEGY", "fixed")
    with Model(out, n_ctx=64) as m:  # the environment's over the file's
        assert m.weight_placement()[gate][1] == "CPU_Mapped"
    with Model(out, n_ctx=64, strategy="gate-guided") as m:  # the caller's over the environment's
        assert m.weight_placement()[gate][1] == original and m.weight_placement()[up][1] == "CPU_Mapped"


def test_sparse_decode_differs_from_dense(si_model):
    with Model(si_model, n_ctx=128, compute_ratio=0.25) as sel, Model(si_model, n_ctx=128, dense=True) as dense:
        prompt = sel.tokenize(PROMPT)
        _, l1 = decode(sel, prompt, 3)
        _, l2 = decode(dense, prompt, 3)
    assert np.abs(l1 - l2).max() > 1e-3


def test_defaults_come_from_the_file(si_model):
    r = GGUFReader(str(si_model))
    assert r.get_field(si_key("compute_ratio")).contents() == pytest.approx(0.4)
    with Model(si_model) as m:
        cfg = m.selection_config()
    assert cfg["compute_ratio"] == pytest.approx(0.4) and cfg["token_ratio"] == pytest.approx(0.2)
    assert cfg["select_by"] == "value" and cfg["dense"] is False and cfg["strategy"] == "frequency"


def test_environment_sets_the_knobs(si_model, monkeypatch):
    monkeypatch.setenv("SELECTINFER_COMPUTE_RATIO", "0.5")
    monkeypatch.setenv("SELECTINFER_SELECT_BY", "magnitude")
    monkeypatch.setenv("SELECTINFER_DENSE", "1")
    with Model(si_model) as m:
        cfg = m.selection_config()
    assert cfg["compute_ratio"] == pytest.approx(0.5) and cfg["select_by"] == "magnitude" and cfg["dense"]


def test_explicit_settings_override_the_environment(si_model, monkeypatch):
    """What Model(...) says wins over SELECTINFER_*, False and "value" included; None keeps it."""
    for name, value in [("SELECTINFER_COMPUTE_RATIO", "0.5"), ("SELECTINFER_SELECT_BY", "magnitude"),
                        ("SELECTINFER_DENSE", "1"), ("SELECTINFER_COREINFER", "1"), ("SELECTINFER_COMPENSATE", "1")]:
        monkeypatch.setenv(name, value)
    with Model(si_model, compute_ratio=0.3, select_by="value", dense=False, coreinfer=False, compensate=False) as m:
        cfg = m.selection_config()
    assert cfg == {"strategy": "frequency", "compute_ratio": pytest.approx(0.3), "token_ratio": pytest.approx(0.2),
                   "select_by": "value", "dense": False, "coreinfer": False, "layer_budgets": "uniform",
                   "compensate": False}
    with pytest.raises((ValueError, ModelLoadError), match="CoreInfer mode"):  # the environment's, on this file
        Model(si_model, compensate=False)
    with pytest.raises((ValueError, ModelLoadError), match="needs the gate statistics"):  # neither has this file
        Model(si_model, coreinfer=False)
    monkeypatch.delenv("SELECTINFER_COREINFER")
    monkeypatch.delenv("SELECTINFER_COMPENSATE")
    with Model(si_model) as m:
        cfg = m.selection_config()
    assert cfg["compute_ratio"] == pytest.approx(0.5) and cfg["select_by"] == "magnitude" and cfg["dense"]


@pytest.mark.parametrize("name,value,match", [
    ("SELECTINFER_SELECT_BY", "size", "SELECTINFER_SELECT_BY='size': use value or magnitude"),
    ("SELECTINFER_STRATEGY", "best", "SELECTINFER_STRATEGY='best': use frequency, sum-magnitude, fixed, gate-guided or predicted"),
    ("SELECTINFER_COMPUTE_RATIO", "0.4x", "SELECTINFER_COMPUTE_RATIO='0.4x': use a number"),
    ("SELECTINFER_TOKEN_RATIO", "nan", "SELECTINFER_TOKEN_RATIO='nan': use a number"),
    ("SELECTINFER_LAYER_BUDGETS", "even", "SELECTINFER_LAYER_BUDGETS='even': use uniform or profile"),
    ("SELECTINFER_DENSE", "yes", "SELECTINFER_DENSE='yes': use 0 or 1"),
    ("SELECTINFER_COMPUTE_RATIO", "0.9", r"compute ratio \(phi\) 0.9 must lie between"),
    ("SELECTINFER_COMPENSATE", "1", "dropped-neuron compensation needs the gate statistics"),
])
def test_bad_environment_knobs(si_model, monkeypatch, name, value, match):
    monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=match):
        Model(si_model)


@pytest.mark.parametrize("kwargs,match", [
    ({"compute_ratio": 0.1}, r"compute ratio \(phi\) 0.1 must lie between"),
    ({"compute_ratio": 0.9}, r"compute ratio \(phi\) 0.9 must lie between"),
    ({"token_ratio": 0.0}, r"token ratio \(alpha\) must be in \(0, 1\]"),
    ({"compute_ratio": float("nan")}, r"compute_ratio must be in \[0, 1\]"),
    ({"select_by": "size"}, "select_by must be"),
    ({"strategy": "best"}, "strategy must be frequency, sum-magnitude, fixed, gate-guided or predicted, got 'best'"),
    ({"strategy": "fixed", "select_by": "magnitude"}, "the fixed strategy does not rank tokens"),
    ({"layer_budgets": "even"}, "layer_budgets must be uniform or profile, got 'even'"),
    ({"compensate": True}, "dropped-neuron compensation needs the gate statistics .* --input-moments"),
])
def test_bad_knobs(si_model, kwargs, match):
    with pytest.raises(ValueError, match=match):
        Model(si_model, **kwargs)


def test_knobs_on_a_dense_model(tiny_model):
    with pytest.raises(ValueError, match="need a SelectInfer GGUF"):
        Model(tiny_model("tiny-llama", "F32"), compute_ratio=0.4)
    with pytest.raises(ValueError, match="need a SelectInfer GGUF"):
        Model(tiny_model("tiny-llama", "F32"), compensate=True)
    Model(tiny_model("tiny-llama", "F32"), compensate=False).close()  # restates nothing to do


def test_cli_knobs(cli, si_model, tiny_model):
    ok = cli("-m", si_model, "-p", "the capital", "-n", "4", "--temp", "0", "--compute-ratio", "0.5",
             "--token-ratio", "0.3", "--select-by", "magnitude")
    assert ok.returncode == 0, ok.stderr
    for strategy in ("sum-magnitude", "fixed", "gate-guided"):
        ok = cli("-m", si_model, "-p", "the capital", "-n", "2", "--temp", "0", "--strategy", strategy)
        assert ok.returncode == 0, ok.stderr
    unknown = cli("-m", si_model, "-p", "the capital", "--strategy", "best")
    assert unknown.returncode != 0 and "invalid value 'best' for --strategy" in unknown.stderr
    unknown = cli("-m", si_model, "-p", "the capital", "--layer-budgets", "even")
    assert unknown.returncode != 0 and "invalid value 'even' for --layer-budgets (uniform or profile)" in unknown.stderr
    no_shares = cli("-m", si_model, "-p", "the capital", "--layer-budgets", "profile")
    assert no_shares.returncode == 1 and "need the neuron shares" in no_shares.stderr
    no_stats = cli("-m", si_model, "-p", "the capital", "--strategy", "gate-guided", "--compensate")
    assert no_stats.returncode == 1 and "needs the gate statistics" in no_stats.stderr
    off = cli("-m", si_model, "-p", "the capital", "-n", "2", "--strategy", "gate-guided", "--no-compensate")
    assert off.returncode == 0, off.stderr
    bad = cli("-m", si_model, "-p", "the capital", "--compute-ratio", "0.95")
    assert bad.returncode == 1 and "compute ratio (phi)" in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1
    dense = cli("-m", tiny_model("tiny-llama", "F32"), "-p", "x", "--dense-ffn")
    assert dense.returncode == 1 and "need a SelectInfer GGUF" in dense.stderr


def test_python_counts_the_computed_neurons_as_the_engine_does(si_model):
    """The benchmark's bytes-read yardstick counts the neurons a layer computes as the engine does
    (lround of phi * N in float32), at every phi a file allows."""
    from selectinfer import _native
    from selectinfer.evaluation.bench import computed_neurons, layer_counts

    header = _native.read_gguf_header(str(si_model))
    for phi in (0.25, 0.2501, 0.3, 0.333, 0.4, 0.5, 0.61, 0.75):
        with Model(si_model, n_ctx=64, compute_ratio=phi) as m:
            engine = {len(ids) for ids in m.selected_neurons().values()}
            assert m.computed_counts() == layer_counts(header, phi)
        assert engine == {computed_neurons(phi, 256, 192)} == {reference_uniform_size(phi, 256, 192, 64)}, phi
