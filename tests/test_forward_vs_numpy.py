"""The engine's logits against the independent numpy forward pass (tests/reference.py)."""
import numpy as np
import pytest
from reference import ReferenceModel

from selectinfer import Model

# Relative bound on max |engine - reference| / max |reference| over all logits. F32/F16 weights
# differ only by llama.cpp's F16 KV cache and summation order; quantized weight types also
# quantize the activations (to Q8) before each matmul.
BOUNDS = {"F32": 2e-3, "F16": 2e-3, "Q8_0": 3e-2, "Q4_0": 3e-2, "Q4_1": 3e-2}
TEXT = "the capital of france is paris, a city on the seine"


@pytest.mark.parametrize("shape", ["tiny-llama", "tiny-qwen2", "tiny-gemma3"])
@pytest.mark.parametrize("weight_type", list(BOUNDS))
def test_logits_match_numpy_reference(tiny_model, shape, weight_type):
    path = tiny_model(shape, weight_type)
    with Model(path, n_ctx=128) as m:
        tokens = m.tokenize(TEXT)
        got = m.logits(tokens)
    expected = ReferenceModel.load(path).forward(tokens)
    assert got.shape == expected.shape == (len(tokens), 320)
    max_abs = float(np.abs(got - expected).max())
    scale = float(np.abs(expected).max())
    print(f"{shape} {weight_type}: {len(tokens)} tokens, max |diff| {max_abs:.2e}, max |logit| {scale:.2f}")
    assert max_abs <= BOUNDS[weight_type] * scale
    # the predicted next token agrees wherever the reference has a clear winner
    top2 = np.sort(expected, axis=1)[:, -2:]
    clear = (top2[:, 1] - top2[:, 0]) > 4 * BOUNDS[weight_type] * scale
    assert np.array_equal(got.argmax(1)[clear], expected.argmax(1)[clear])


def test_batched_prompt_equals_one_batch(tiny_model):
    """Splitting a prompt over several batches (n_batch 7) gives the same logits as one batch."""
    path = tiny_model("tiny-llama", "F32")
    with Model(path, n_ctx=128) as whole, Model(path, n_ctx=128, n_batch=7) as split:
        tokens = whole.tokenize(TEXT)
        a, b = whole.logits(tokens), split.logits(tokens)
    assert np.abs(a - b).max() < 1e-3 * np.abs(a).max()


def test_token_logprobs_match_reference(tiny_model):
    path = tiny_model("tiny-qwen2", "F32")
    with Model(path, n_ctx=128, n_batch=8) as m:
        tokens, logprobs = m.token_logprobs(TEXT)
    logits = ReferenceModel.load(path).forward(tokens)
    shifted = logits - logits.max(axis=1, keepdims=True)
    log_softmax = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    expected = log_softmax[np.arange(len(tokens) - 1), tokens[1:]]
    assert logprobs.shape == (len(tokens) - 1,)
    assert np.abs(logprobs - expected).max() < 0.05
    assert np.all(logprobs <= 0)
