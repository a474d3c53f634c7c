"""selectinfer prepare: the profile cached by model file, data and settings; a load ratio; a memory
budget that the measured process fits, and one that nothing fits."""
import json

import pytest

from selectinfer.method import prepare
from selectinfer.method.convert import ConvertError
from selectinfer.evaluation.synthetic import make_model

PROMPTS = ["The history of the city begins with a small settlement on the river.",
           "Traders met there to exchange grain, salt and cloth.",
           "Over the centuries the market grew into a town."]


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SELECTINFER_CACHE_DIR", str(tmp_path / "cache"))
    data = tmp_path / "calib.jsonl"
    data.write_text("".join(json.dumps({"text": p}) + "\n" for p in PROMPTS))
    return f"{data}:text"


@pytest.fixture(scope="module")
def wide_model(tmp_path_factory):
    # FFN weights (3 x 3 x 256 x 4096 F32: 36 MiB) large against the compute buffers and RSS noise
    path = tmp_path_factory.mktemp("prepare") / "wide.gguf"
    make_model(path, "tiny-llama", weight_type="F32", seed=1, n_embd=256, n_ff=4096, n_layer=3)
    return path


def test_the_profile_is_made_once_per_model_data_and_settings(tiny_model, cache):
    model = tiny_model("tiny-llama", "F32")
    first = prepare.cached_profile(model, [cache], max_prompts=3, max_new_tokens=4, progress=False)
    stamp = first.stat().st_mtime_ns
    again = prepare.cached_profile(model, [cache], max_prompts=3, max_new_tokens=4, progress=False)
    assert again == first and again.stat().st_mtime_ns == stamp  # reused, not made again
    other = prepare.cached_profile(model, [cache], max_prompts=2, max_new_tokens=4, progress=False)
    assert other != first and other.exists()


def test_prepare_at_a_load_ratio(tiny_model, cache, tmp_path):
    r = prepare.prepare(tiny_model("tiny-llama", "F32"), tmp_path / "si.gguf", task="text", load_ratio=0.75,
                        static_ratio=0.25, layers="0:2", dataset_specs=[cache], max_prompts=3, max_new_tokens=4,
                        progress=False)
    assert r.path.exists() and r.load_ratio == 0.75 and r.peak_rss_bytes is None


def test_prepare_to_a_memory_budget(wide_model, cache, tmp_path):
    original_peak = prepare.measure_peak_rss(wide_model, 256, 1)
    ffn_bytes = 3 * 3 * 256 * 4096 * 4
    budget = original_peak - ffn_bytes // 3  # a third of the FFN weights must go
    r = prepare.prepare(wide_model, tmp_path / "fit.gguf", task="text", memory_budget=str(budget), layers="0:3",
                        dataset_specs=[cache], max_prompts=3, max_new_tokens=4, n_ctx=256, n_threads=1, progress=False)
    assert 0.98 * budget <= r.peak_rss_bytes <= budget == r.budget_bytes
    assert 0.3 <= r.load_ratio < 0.9
    assert prepare.measure_peak_rss(r.path, 256, 1) <= budget + (1 << 20)  # measured again: it fits (1 MiB noise)


def test_next_gamma_stays_between_the_trials_that_fit_and_those_that_do_not():
    step, n_ff = 32, 4096
    gamma_of = lambda weights: (weights // 1000) * step / n_ff  # noqa: E731  1000 bytes per step
    # one trial over the budget: slope 1 -> fewer weights by the excess
    g = prepare.next_gamma({}, {0.5: (16_000, 110_000)}, 100_000, step, n_ff, gamma_of)
    assert g == 6 * step / n_ff
    # a bracket: its own slope (here 3 bytes of peak per byte of file) picks the step inside it
    fits, over = {20 * step / n_ff: (20_000, 90_000)}, {30 * step / n_ff: (30_000, 120_000)}
    assert prepare.next_gamma(fits, over, 99_000, step, n_ff, gamma_of) == 23 * step / n_ff
    # a slope pointing outside the bracket (noise): halfway instead
    fits, over = {20 * step / n_ff: (20_000, 90_000)}, {24 * step / n_ff: (24_000, 89_000)}
    assert prepare.next_gamma(fits, over, 99_000, step, n_ff, gamma_of) == 22 * step / n_ff
    # neighbouring steps: nothing left to try
    fits, over = {20 * step / n_ff: (20_000, 90_000)}, {21 * step / n_ff: (21_000, 101_000)}
    assert prepare.next_gamma(fits, over, 99_000, step, n_ff, gamma_of) is None


def test_a_budget_nothing_fits_says_what_the_process_needs(wide_model, cache, tmp_path, monkeypatch):
    def no_profiling(*args, **kwargs):
        raise AssertionError("profiled for a budget that no file fits")

    monkeypatch.setattr(prepare, "cached_profile", no_profiling)  # refused at once, before profiling
    with pytest.raises(ConvertError, match="no load ratio fits .* besides the weights"):
        prepare.prepare(wide_model, tmp_path / "none.gguf", task="text", memory_budget="30M", layers="0:3",
                        dataset_specs=[cache], max_prompts=3, max_new_tokens=4, n_ctx=256, n_threads=1,
                        progress=False)
    assert not (tmp_path / "none.gguf").exists()


def test_a_budget_below_the_smallest_files_weights_is_refused_without_a_run(wide_model, tmp_path, monkeypatch):
    def no_run(*args, **kwargs):
        raise AssertionError("ran the model for a budget that the weights alone exceed")

    monkeypatch.setattr(prepare, "measure_peak_rss", no_run)
    monkeypatch.setattr(prepare, "cached_profile", no_run)
    with pytest.raises(ConvertError, match="no load ratio fits 1 KiB: the smallest file's weights alone"):
        prepare.prepare(wide_model, tmp_path / "none.gguf", task="text", memory_budget="1K", progress=False)


def test_budget_or_ratio_is_required(tiny_model, tmp_path):
    with pytest.raises(ValueError, match="either a memory budget"):
        prepare.prepare(tiny_model("tiny-llama", "F32"), tmp_path / "x.gguf")
