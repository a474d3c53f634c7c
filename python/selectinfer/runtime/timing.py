"""One timed run of a loaded model: a prompt prefilled, then a fixed number of decode steps."""
from __future__ import annotations

from .model import Model

BENCH_TEXT = (
    "The history of the city begins with a small settlement on the river, where traders met to exchange "
    "grain, salt and cloth. Over the centuries the market grew into a town, the town into a city, and the "
    "city into the capital of a kingdom whose roads reached every corner of the land. "
)


def prompt_tokens(model: Model, n_prompt: int) -> list[int]:
    tokens = model.tokenize(BENCH_TEXT * (1 + n_prompt // 32))
    return tokens[:n_prompt]


def one_run(model: Model, prompt: list[int], n_gen: int) -> tuple[float, float]:
    """Prefill `prompt`, then exactly n_gen greedy decode steps (end-of-text is ignored)."""
    model.engine.clear()
    model.reset_stats()
    if model.engine.profiling:
        model.activation_sums(reset=True)
    model.decode_tokens(prompt, n_gen)
    s = model.stats()
    return s["prefill_tokens_per_s"], s["decode_tokens_per_s"]
