"""Profiling: in-graph activation sums against numpy, the profile file, merging, resume, errors."""
import json

import numpy as np
import pytest
from reference import ReferenceModel

from selectinfer import Model
from selectinfer.method.profiler import EngineCollector, run_profile
from selectinfer.method.profiles import DatasetStats, ModelInfo, Profile, ProfileError, jaccard, ranking, top_set
from selectinfer.method.tasks import Dataset, load_dataset, load_user_dataset


def reference_ffn_steps(path, tokens):
    """Per layer, the FFN input h [T, n_embd] and activations act(gate) * up [T, n_ff] of the numpy
    forward pass."""
    ref = ReferenceModel.load(path)
    x = ref.embed(tokens)
    positions = np.arange(len(tokens))
    for il in range(ref.n_layer):
        x = ref.attention_block(x, il, positions)
        h = ref.ffn_input(x, il)
        act = ref.ffn_activations(h, il)
        yield h, act
        x = ref.ffn_block(x, il, act)


def reference_abs_sums(path, tokens):
    """Per layer sum over tokens of |act(gate) * up| from the numpy forward pass."""
    return np.stack([np.abs(act).sum(axis=0) for _, act in reference_ffn_steps(path, tokens)])


@pytest.mark.parametrize("shape,weight_type,bound", [
    ("tiny-llama", "F32", 2e-3), ("tiny-qwen2", "F32", 2e-3), ("tiny-gemma3", "F32", 5e-3), ("tiny-llama", "F16", 2e-3),
    ("tiny-qwen2", "Q8_0", 3e-2), ("tiny-llama", "Q4_0", 3e-2),
])
def test_activation_sums_match_numpy(tiny_model, shape, weight_type, bound):
    path = tiny_model(shape, weight_type)
    with Model(path, n_ctx=128, n_batch=8, profile=True) as m:  # n_batch 8: the prompt spans several batches
        prompt = m.tokenize("the capital of france is paris, a city on the seine")
        m.generate(prompt, 6, temperature=0)
        evaluated = list(m.engine.history)  # prompt + every decoded token
        sums, n_tokens = m.activation_sums()
        again, zero = m.activation_sums()
    expected = reference_abs_sums(path, evaluated)
    got = np.stack(sums)
    assert n_tokens == len(evaluated) == len(prompt) + 5 and got.shape == expected.shape
    rel = np.abs(got - expected).max() / expected.max()
    print(f"{shape} {weight_type}: {n_tokens} tokens, max rel diff {rel:.2e}")
    assert rel < bound
    assert zero == 0 and all(np.all(a == 0) for a in again), "reading with reset must clear the sums"


def reference_input_moments(path, tokens):
    """Per layer sums over tokens of h h^T and of h, h the FFN input, from the numpy forward pass."""
    steps = list(reference_ffn_steps(path, tokens))
    return np.stack([h.T @ h for h, _ in steps]), np.stack([h.sum(0) for h, _ in steps])


@pytest.mark.parametrize("shape,weight_type,bound", [
    ("tiny-llama", "F32", 2e-3), ("tiny-gemma3", "F32", 5e-3), ("tiny-qwen2", "Q8_0", 3e-2),
])
def test_input_moments_match_numpy(tiny_model, shape, weight_type, bound):
    path = tiny_model(shape, weight_type)
    with Model(path, n_ctx=128, n_batch=8, profile=True, profile_input_moments=True) as m:
        prompt = m.tokenize("the capital of france is paris, a city on the seine")
        m.generate(prompt, 6, temperature=0)
        evaluated = list(m.engine.history)
        layers, h_sums, n_moment_tokens = m.input_moments()
        _, n_tokens = m.activation_sums()  # resets the moments too
        zero, zero_sums, no_tokens = m.input_moments()
    # the prompt's batches of 8 tokens and its last one (if more than one token), not decode steps
    n_batched = len(prompt) - (1 if len(prompt) % 8 == 1 else 0)
    expected, expected_sums = reference_input_moments(path, evaluated[:n_batched])
    got, got_sums = np.stack(layers), np.stack(h_sums)
    assert n_moment_tokens == n_batched and n_tokens == len(evaluated) and got.shape == expected.shape
    assert got_sums.shape == expected_sums.shape
    rel = np.abs(got - expected).max() / np.abs(expected).max()
    rel_sums = np.abs(got_sums - expected_sums).max() / np.abs(expected_sums).max()
    print(f"{shape} {weight_type}: max rel diff {rel:.2e} (sums {rel_sums:.2e})")
    assert rel < bound and rel_sums < bound
    assert np.all(np.stack(zero) == 0) and np.all(np.stack(zero_sums) == 0) and no_tokens == 0, \
        "activation_sums(reset=True) must clear the moments"


def test_input_moments_need_their_mode(tiny_model):
    with Model(tiny_model("tiny-llama", "F32"), n_ctx=64, profile=True) as m:
        with pytest.raises(RuntimeError, match="profile_input_moments"):
            m.input_moments()


def test_profiling_needs_profile_mode(tiny_model):
    with Model(tiny_model("tiny-llama", "F32"), n_ctx=64) as m:
        with pytest.raises(RuntimeError, match="profile=True"):
            m.activation_sums()


def test_profile_mode_does_not_change_logits(tiny_model):
    path = tiny_model("tiny-qwen2", "F16")
    with Model(path, n_ctx=64) as plain, Model(path, n_ctx=64, profile=True) as profiled:
        tokens = plain.tokenize("the capital of")
        assert np.array_equal(plain.logits(tokens), profiled.logits(tokens))


# --- merging and the file ---------------------------------------------------------------------

def synthetic_profile(n_layer=3, n_ff=10, seed=0):
    rng = np.random.default_rng(seed)
    info = ModelInfo("ab" * 32, "m.gguf", "llama", n_layer, n_ff)
    stats = [DatasetStats(name, task, "test", 5, rng.random((n_layer, n_ff)).astype(np.float32),
                          np.full(n_layer, 100 + i, dtype=np.int64))
             for i, (name, task) in enumerate([("a", "qa"), ("b", "qa"), ("c", "text")])]
    return Profile(info, stats, {"profiler": "test"})


def test_merging_follows_the_reference_rule():
    p = synthetic_profile()
    a, b, c = (d.mean_abs.astype(np.float64) for d in p.datasets)
    assert np.allclose(p.task_scores("qa"), (a + b) / 2)
    assert np.allclose(p.task_scores("text"), c)
    assert np.allclose(p.model_scores(), ((a + b) / 2 + c) / 2)  # mean over tasks, not datasets
    with pytest.raises(ProfileError, match="no dataset of task 'translation'"):
        p.task_scores("translation")


def test_ranking_is_descending_with_stable_ties():
    scores = np.array([[0.5, 0.9, 0.5, 0.1, 0.9]])
    assert ranking(scores).tolist() == [[1, 4, 0, 2, 3]]
    assert top_set(scores, 0.4) == [{1, 4}]
    assert jaccard({1, 2}, {2, 3}) == pytest.approx(1 / 3)


def test_profile_file_roundtrip(tmp_path):
    p = synthetic_profile()
    p.save(tmp_path / "p.safetensors")
    q = Profile.load(tmp_path / "p.safetensors")
    assert q.model == p.model and q.settings == p.settings
    for x, y in zip(p.datasets, q.datasets):
        assert (x.name, x.task, x.n_prompts) == (y.name, y.task, y.n_prompts)
        assert np.array_equal(x.mean_abs, y.mean_abs) and np.array_equal(x.n_tokens, y.n_tokens)


def test_profile_file_errors(tmp_path):
    with pytest.raises(FileNotFoundError):
        Profile.load(tmp_path / "missing.safetensors")
    junk = tmp_path / "junk.safetensors"
    junk.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json}")
    with pytest.raises(ProfileError, match="not a readable selectinfer profile"):
        Profile.load(junk)
    p = synthetic_profile()
    with pytest.raises(ProfileError, match="3 layers x 10 FFN neurons"):
        p.check_model(p.model.digest, 4, 10)
    with pytest.raises(ProfileError, match="another model file"):
        p.check_model("cd" * 32, 3, 10)


# --- the profiling loop -----------------------------------------------------------------------

class FlakyCollector:
    """Wraps a collector and fails after `fail_after` prompts: an interrupted run."""

    def __init__(self, inner, fail_after):
        self.inner, self.fail_after, self.calls = inner, fail_after, 0
        self.info, self.name, self.input_moments = inner.info, inner.name, inner.input_moments

    def collect(self, example, max_new_tokens):
        if self.calls >= self.fail_after:
            raise KeyboardInterrupt
        self.calls += 1
        return self.inner.collect(example, max_new_tokens)


def tiny_datasets():
    def ds(name, task, texts):
        return Dataset(name, task, [{"id": f"{name}:{i}", "task": task, "split": "calibration", "text": t}
                                    for i, t in enumerate(texts)], "test")
    return [ds("story", "text", ["the capital of", "a city on the", "in the north", "the end of"]),
            ds("notes", "summarization", ["the seine runs through paris", "he is in the city", "of the town"])]


@pytest.mark.parametrize("input_moments", [False, True])
def test_profile_reproducible_and_resumable(tiny_model, tmp_path, input_moments):
    path = tiny_model("tiny-llama", "F32")
    first, second, resumed = tmp_path / "a.safetensors", tmp_path / "b.safetensors", tmp_path / "c.safetensors"

    def collector():
        return EngineCollector(path, n_ctx=128, input_moments=input_moments)

    run_profile(collector(), tiny_datasets(), first, max_new_tokens=5, progress=False)
    run_profile(collector(), tiny_datasets(), second, max_new_tokens=5, progress=False)
    assert first.read_bytes() == second.read_bytes()

    import selectinfer.method.profiler as profiler
    profiler.CHECKPOINT_EVERY, saved = 2, profiler.CHECKPOINT_EVERY
    try:
        with pytest.raises(KeyboardInterrupt):
            run_profile(FlakyCollector(collector(), 5), tiny_datasets(), resumed, max_new_tokens=5, progress=False)
        checkpoint = tmp_path / "c.safetensors.partial.npz"
        assert checkpoint.exists() and not resumed.exists()
        flaky = FlakyCollector(collector(), 100)
        run_profile(flaky, tiny_datasets(), resumed, max_new_tokens=5, progress=False)
    finally:
        profiler.CHECKPOINT_EVERY = saved
    assert flaky.calls == 7 - 4, "the resumed run must skip the 4 checkpointed prompts"
    assert resumed.read_bytes() == first.read_bytes()
    assert not checkpoint.exists()

    profile = Profile.load(first)
    assert [d.name for d in profile.datasets] == ["story", "notes"]
    assert profile.settings["max_new_tokens"] == 5 and profile.model.n_layer == 2 and profile.model.n_ff == 96
    # token counts: every prompt token plus the decoded generated tokens
    assert int(profile.datasets[0].n_tokens[0]) > 4 * 3
    if input_moments:  # E[h h^T]: symmetric, positive diagonal, one per layer
        m = profile.input_moments
        assert m.shape == (2, 64, 64) and np.allclose(m, m.transpose(0, 2, 1), atol=1e-5) and np.all(np.diagonal(m, 0, 1, 2) > 0)
    else:
        assert profile.input_moments is None


def test_profile_report_writes_plots(tmp_path):
    from selectinfer.method.profile_report import overlap_table, write_report

    p = synthetic_profile()
    paths = write_report(p, tmp_path / "report")
    assert [x.name for x in paths] == ["score_distribution.png", "score_concentration.png", "task_overlap.png"]
    assert all(x.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and x.stat().st_size > 10_000 for x in paths)
    table = overlap_table(p)
    assert set(table) == {"qa~text", "qa~model-wide", "text~model-wide"}
    same = Profile(p.model, [p.datasets[0], DatasetStats("d", "text", "x", 1, p.datasets[0].mean_abs,
                                                           p.datasets[0].n_tokens)])
    assert all(np.all(v == 1.0) for v in overlap_table(same).values()), "identical tasks overlap fully"


# --- datasets ---------------------------------------------------------------------------------

def test_user_jsonl_dataset(tmp_path):
    f = tmp_path / "mine.jsonl"
    f.write_text(json.dumps({"question": "What is 2+2?", "answers": ["4"]}) + "\n\n" +
                 json.dumps({"prompt": "Say hi", "split": "eval"}) + "\n")
    ds = load_dataset(f"{f}:qa")
    assert ds.task == "qa" and len(ds.examples) == 1 and ds.examples[0]["question"] == "What is 2+2?"
    assert load_dataset(f"{f}:qa", split="eval").examples[0]["prompt"] == "Say hi"


def test_user_csv_dataset(tmp_path):
    f = tmp_path / "mine.csv"
    f.write_text("text\nThe first line of a story.\nAnother line.\n")
    assert [ex["text"] for ex in load_user_dataset(f, "text").examples] == ["The first line of a story.",
                                                                          "Another line."]


@pytest.mark.parametrize("content,match", [
    ('{"question": "ok?"}\n{"question": "broken"\n', r"mine.jsonl:2: malformed JSON"),
    ('{"question": "ok?"}\n[1, 2]\n', r"mine.jsonl:2: expected a JSON object"),
    ('{"text": "no question"}\n', r"mine.jsonl:1: a qa example needs 'question'"),
])
def test_malformed_jsonl_names_file_and_line(tmp_path, content, match):
    f = tmp_path / "mine.jsonl"
    f.write_text(content)
    with pytest.raises(ValueError, match=match):
        load_dataset(f"{f}:qa")


def test_dataset_errors(tmp_path):
    f = tmp_path / "empty.jsonl"
    f.write_text("")
    with pytest.raises(ValueError, match="dataset 'empty' has no calibration examples"):
        load_dataset(f"{f}:text")
    with pytest.raises(ValueError, match="unknown task 'poetry'; known tasks: qa, translation, summarization, text"):
        load_dataset(f"{f}:poetry")
    with pytest.raises(ValueError, match="unknown dataset 'nope'"):
        load_dataset("nope")
    with pytest.raises(FileNotFoundError):
        load_dataset(f"{tmp_path / 'missing.jsonl'}:qa")


def test_unavailable_source_package(tmp_path):
    from selectinfer.runtime.fetch import FetchError, apt_download, pip_download

    with pytest.raises(FetchError, match="could not download selectinfer-no-such-package==0.0.0 from PyPI"):
        pip_download("selectinfer-no-such-package", "0.0.0", tmp_path)
    with pytest.raises(FetchError, match="selectinfer-no-such-deb"):
        apt_download("selectinfer-no-such-deb", tmp_path)


# --- the transformers profiler ----------------------------------------------------------------

def spearman(a: np.ndarray, b: np.ndarray) -> float:
    ra, rb = np.argsort(np.argsort(a)), np.argsort(np.argsort(b))
    return float(np.corrcoef(ra, rb)[0, 1])


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_transformers_and_engine_profilers_agree(tmp_path, arch):
    torch = pytest.importorskip("torch", reason="the transformers profiler needs torch (pip install torch)")
    transformers = pytest.importorskip("transformers", reason="needs transformers (pip install transformers)")
    from selectinfer.evaluation.hf_gguf import hf_to_gguf
    from selectinfer.method.hf_profiler import TransformersCollector

    config_cls, model_cls = {"llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
                             "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM)}[arch]
    config = config_cls(vocab_size=320, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                        rms_norm_eps=1e-5, tie_word_embeddings=False, initializer_range=0.2,
                        bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    hf_dir = tmp_path / f"hf-{arch}"
    model_cls(config).eval().save_pretrained(hf_dir)
    gguf = tmp_path / f"{arch}.gguf"
    hf_to_gguf(model_cls.from_pretrained(hf_dir), gguf)

    rng = np.random.default_rng(1)
    examples = [{"id": f"x{i}", "task": "text", "split": "calibration",
                 "input_ids": [1] + rng.integers(5, 320, size=12).tolist()} for i in range(6)]
    datasets = [Dataset("random-ids", "text", examples, "test")]
    hf = run_profile(TransformersCollector(hf_dir), datasets, tmp_path / "hf.safetensors", max_new_tokens=4,
                     progress=False)
    engine = run_profile(EngineCollector(gguf, n_ctx=64), datasets, tmp_path / "engine.safetensors",
                         max_new_tokens=4, progress=False)
    assert hf.model.architecture == arch and hf.settings["profiler"] == "transformers"
    assert (hf.model.n_layer, hf.model.n_ff) == (engine.model.n_layer, engine.model.n_ff) == (3, 128)
    assert hf.datasets[0].n_tokens[0] == engine.datasets[0].n_tokens[0] == 6 * (13 + 3)
    for il in range(3):
        rho = spearman(hf.datasets[0].mean_abs[il], engine.datasets[0].mean_abs[il])
        print(f"{arch} layer {il}: Spearman {rho:.5f}")
        assert rho > 0.99
