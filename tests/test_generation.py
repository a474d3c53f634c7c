"""Generation through the Python API on tiny random models."""
import gc

import numpy as np
import pytest
from reference import ReferenceModel

from selectinfer import Model

PROMPT = "the capital of"


def greedy_tokens(m: Model, prompt: str, n: int) -> list[int]:
    return m.tokenize(m.generate(prompt, n, temperature=0), add_special=False)


def test_greedy_follows_reference_argmax(tiny_model):
    """Each greedy token is the reference model's best next token (up to near-ties)."""
    path = tiny_model("tiny-llama", "F32")
    with Model(path, n_ctx=128) as m:
        prompt = m.tokenize(PROMPT)
        generated, _ = m.decode_tokens(prompt, 16)
    logits = ReferenceModel.load(path).forward(prompt + generated)
    for i, tok in enumerate(generated):
        row = logits[len(prompt) - 1 + i]
        assert row[tok] >= row.max() - 1e-2 * np.abs(row).max(), f"step {i}: token {tok} is not the argmax"


def test_greedy_is_deterministic(tiny_model):
    path = tiny_model("tiny-qwen2", "Q8_0")
    with Model(path, n_ctx=128) as a:
        first = a.generate(PROMPT, 24, temperature=0)
        again = a.generate(PROMPT, 24, temperature=0)
    with Model(path, n_ctx=128, n_threads=1) as b:
        other_process_state = b.generate(PROMPT, 24, temperature=0)
    assert first == again == other_process_state
    assert len(first) > 0


def test_seeded_sampling_is_reproducible(tiny_model):
    path = tiny_model("tiny-llama", "F16")
    with Model(path, n_ctx=128) as m:
        a = m.generate(PROMPT, 32, temperature=1.5, top_k=0, top_p=1.0, seed=7)
        b = m.generate(PROMPT, 32, temperature=1.5, top_k=0, top_p=1.0, seed=7)
        c = m.generate(PROMPT, 32, temperature=1.5, top_k=0, top_p=1.0, seed=8)
    assert a == b
    assert a != c


def test_stream_pieces_join_to_generate(tiny_model):
    path = tiny_model("tiny-llama", "F32")
    with Model(path, n_ctx=128) as m:
        pieces = list(m.stream(PROMPT, 20, temperature=0))
        whole = m.generate(PROMPT, 20, temperature=0)
    assert len(pieces) > 1
    assert "".join(pieces) == whole


def test_stop_string_truncates(tiny_model):
    path = tiny_model("tiny-llama", "F32")
    with Model(path, n_ctx=128) as m:
        full = m.generate(PROMPT, 30, temperature=0)
        stop = full[len(full) // 2: len(full) // 2 + 2]
        assert stop.strip(), "the generated text should not be blank"
        cut = m.generate(PROMPT, 30, temperature=0, stop=[stop])
        streamed = "".join(m.stream(PROMPT, 30, temperature=0, stop=stop))
    assert cut == full[: full.index(stop)]
    assert streamed == cut


def test_max_tokens_counts_tokens(tiny_model):
    path = tiny_model("tiny-llama", "F32")
    with Model(path, n_ctx=128) as m:
        n_prompt = len(m.tokenize(PROMPT))
        m.reset_stats()
        m.generate(PROMPT, 5, temperature=0)
        s = m.stats()
        assert m.generate(PROMPT, 0) == ""
    # five sampled tokens need four decode steps after the prompt
    assert s["n_decode_tokens"] == 4
    assert s["n_prefill_tokens"] == n_prompt


def test_generation_stops_at_full_context(tiny_model):
    path = tiny_model("tiny-llama", "F32")
    with Model(path, n_ctx=32) as m:
        n_prompt = len(m.tokenize(PROMPT))
        text = m.generate(PROMPT, -1, temperature=0)
        assert len(m.engine.history) == 32
    assert len(text) > 0 and n_prompt < 32


def test_chat_uses_model_template(tiny_model):
    path = tiny_model("tiny-llama", "F32")
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    with Model(path, n_ctx=128) as m:
        prompt = m.engine.apply_chat_template([(x["role"], x["content"]) for x in messages], True)
        assert prompt == "<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
        reply = m.chat(messages, 12, temperature=0)
        direct = m.generate(m.tokenize(prompt, parse_special=True), 12, temperature=0)
        streamed = "".join(m.chat(messages, 12, temperature=0, stream=True))
    assert reply == direct == streamed


def test_tokenize_roundtrip(tiny_model):
    with Model(tiny_model("tiny-llama", "F32"), n_ctx=64) as m:
        text = "the capital of Zürich, 42!"
        tokens = m.tokenize(text)
        assert tokens[0] == 1  # BOS
        assert m.detokenize(tokens[1:]).strip() == text
        assert m.tokenize(text, add_special=False) == tokens[1:]


def test_stats_report_speed_and_memory(tiny_model):
    with Model(tiny_model("tiny-llama", "F32"), n_ctx=64) as m:
        m.generate(PROMPT, 8, temperature=0)
        s = m.stats()
    assert s["prefill_tokens_per_s"] > 0 and s["decode_tokens_per_s"] > 0
    assert s["model_bytes"] > 0
    assert s["rss_bytes"] > s["model_bytes"] and s["peak_rss_bytes"] >= s["rss_bytes"]


def test_close_is_deterministic(tiny_model):
    path = tiny_model("tiny-llama", "F32")
    m = Model(path, n_ctx=64)
    m.close()
    with pytest.raises(RuntimeError, match="closed"):
        m.generate(PROMPT, 4)
    with Model(path, n_ctx=64) as m2:
        pass
    with pytest.raises(RuntimeError, match="closed"):
        m2.tokenize("x")
    gc.collect()


def test_decode_tokens_follows_or_chooses(tiny_model):
    """The prompt-then-decode loop: greedy steps, or a given sequence fed step by step (the same
    logits as when the model chose those tokens itself)."""
    path = tiny_model("tiny-llama", "F32")
    with Model(path, n_ctx=128) as m:
        prompt = m.tokenize(PROMPT)
        chosen, logits = m.decode_tokens(prompt, 6, logits=True)
        followed, again = m.decode_tokens(prompt, 6, follow=chosen, logits=True)
        assert followed == chosen and logits.shape == (6, m.engine.n_vocab) and np.array_equal(logits, again)
        assert [int(row.argmax()) for row in logits[:-1]] == chosen[1:]
        assert m.decode_tokens(prompt, 0) == ([], None)
        with pytest.raises(ValueError, match="follow has 2 tokens for 3 steps"):
            m.decode_tokens(prompt, 3, follow=chosen[:2])
