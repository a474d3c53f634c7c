"""The high-level Python API, in the shape llama-cpp-python users know.

    with Model("model.gguf", n_ctx=2048) as m:
        print(m.generate("The capital of France is", max_tokens=16, temperature=0))
        for piece in m.stream("Once upon a time"):
            print(piece, end="")
"""
from __future__ import annotations

import codecs
import os
from typing import Iterable, Iterator, Sequence

import numpy as np

from .. import _native


def _check_max_tokens(max_tokens: int) -> None:
    if not isinstance(max_tokens, (int, np.integer)) or max_tokens < -1:
        raise ValueError(f"max_tokens must be an integer >= -1 (-1: until the context is full), got {max_tokens!r}")


def _stop_list(stop: str | Sequence[str] | None) -> list[str]:
    stops = [stop] if isinstance(stop, str) else list(stop or [])
    if any(not isinstance(s, str) or not s for s in stops):
        raise ValueError(f"stop must be a non-empty string or a list of them, got {stop!r}")
    return stops


class _StopFilter:
    """Streams text, holding back what could still become a stop string."""

    def __init__(self, stops: list[str]):
        self.stops = stops
        self.pending = ""
        self.stopped = False

    def feed(self, text: str) -> str:
        self.pending += text
        hits = [i for i in (self.pending.find(s) for s in self.stops) if i >= 0]
        if hits:
            self.stopped = True
            out, self.pending = self.pending[: min(hits)], ""
            return out
        hold = max((k for s in self.stops for k in range(1, len(s)) if self.pending.endswith(s[:k])), default=0)
        cut = len(self.pending) - hold
        out, self.pending = self.pending[:cut], self.pending[cut:]
        return out

    def flush(self) -> str:
        out, self.pending = self.pending, ""
        return out


# Model's keywords for selective computation (SelectionOverrides), for callers that pass them on.
SELECTION_KEYWORDS = tuple(s["name"] for s in _native.SELECTION_SETTINGS)
LAYER_BUDGETS = tuple(_native.LAYER_BUDGETS)  # "uniform" (phi N per layer, the method's), "profile"
STRATEGIES = tuple(_native.STRATEGIES)  # "frequency" (the method's, the default), "sum-magnitude", ...
STEP_STRATEGIES = tuple(_native.STEP_STRATEGIES)  # "gate-guided", "predicted": each decode step chooses (and compensates)
# The ways a prompt chooses its neurons, by name (selectinfer eval --select-by) -> Model keywords:
# the method's frequency strategy ranking each token's neurons by value or by magnitude, and the
# other strategies.
SELECTION_RULES = {
    "value": {"select_by": "value"},
    "magnitude": {"select_by": "magnitude"},
    **{name: {"strategy": name} for name in STRATEGIES if name != "frequency"},
}


class Model:
    """A GGUF model with one context (one sequence), on the patched llama.cpp engine.

    Args:
        model_path: GGUF file.
        n_ctx: context size in tokens.
        n_batch: prompt tokens evaluated per batch.
        n_threads: CPU threads; 0 uses all hardware threads.
        seed: default sampling seed; -1 draws a fresh one for every generation.
        use_mmap: map the weights from the file instead of reading them into memory.
        repack: let ggml repack weights for its faster CPU kernels (AMX, CPU_REPACK); the repacked
            weights are a second copy beside the mapped file (see `weight_buffers`).
        n_gpu_layers: layers whose weights and compute go to the GPU, as llama.cpp splits them (the
            last layers first, then the output); 0 none, -1 all. A build without a GPU backend
            (`selectinfer info` lists the devices) keeps every layer on the CPU.
        flash_attn: None lets llama.cpp decide (its default), True/False forces it on/off.
        profile: accumulate FFN activation statistics while evaluating (see `activation_sums`).
        profile_input_moments: with profile, also the FFN inputs' h h^T (see `input_moments`).
        strategy, compute_ratio, layer_budgets, token_ratio, select_by, dense, coreinfer, compensate: selective
            computation of a SelectInfer GGUF (how a prompt chooses its neurons: "frequency", the
            method's, "sum-magnitude", "fixed", or per decode step "gate-guided" or "predicted"; phi;
            "uniform", phi N neurons in every layer, or "profile", the same bytes shared out over the
            layers by the file's profile shares; alpha; "value" or "magnitude" for frequency; compute
            every loaded neuron; CoreInfer mode: no static neurons, for a gamma = 1, delta = 0
            file; for gate-guided and predicted, add the dropped neurons' expected output, on by
            default in files with gate statistics); a value given here overrides the SELECTINFER_* environment variables, None keeps
            them (or the file's defaults).
        verbose: let llama.cpp log to stderr.
    """

    def __init__(self, model_path: str | os.PathLike, *, n_ctx: int = 2048, n_batch: int = 512,
                 n_threads: int = 0, seed: int = -1, use_mmap: bool = True, repack: bool = True,
                 n_gpu_layers: int = 0, flash_attn: bool | None = None,
                 profile: bool = False, profile_input_moments: bool = False, strategy: str | None = None,
                 compute_ratio: float | None = None, layer_budgets: str | None = None,
                 token_ratio: float | None = None,
                 select_by: str | None = None, dense: bool | None = None, coreinfer: bool | None = None,
                 compensate: bool | None = None, verbose: bool = False):
        self.model_path = os.fspath(model_path)
        if not os.path.isfile(self.model_path):
            raise FileNotFoundError(f"model file not found: {self.model_path} "
                                    "(fetch the default model with `selectinfer pull smollm2-135m`)")
        params = _native.ModelParams()
        params.path = self.model_path
        params.n_ctx, params.n_batch, params.n_threads = n_ctx, n_batch, n_threads
        params.use_mmap, params.repack, params.verbose = use_mmap, repack, verbose
        params.n_gpu_layers = n_gpu_layers
        params.flash_attn = -1 if flash_attn is None else int(bool(flash_attn))
        params.profile = profile
        params.profile_input_moments = profile_input_moments
        for name, value in (("compute_ratio", compute_ratio), ("token_ratio", token_ratio)):
            if value is not None and not 0 <= value <= 1:
                raise ValueError(f"{name} must be in [0, 1], got {value}")
        # what is given here overrides the SELECTINFER_* environment; None keeps it (or the file's default)
        sel = params.selection
        # each a setting of the engine's table (_native.SELECTION_SETTINGS), which checks its value
        sel.strategy, sel.compute_ratio, sel.layer_budgets, sel.token_ratio = strategy, compute_ratio, layer_budgets, token_ratio
        sel.select_by, sel.dense, sel.coreinfer, sel.compensate = select_by, dense, coreinfer, compensate
        self.seed = seed
        self._engine: _native.Engine | None = _native.Engine(params)

    # --- lifetime -------------------------------------------------------------------------
    def close(self) -> None:
        """Frees the model and context now (also done by `with` and by garbage collection)."""
        self._engine = None

    def __enter__(self) -> "Model":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def engine(self) -> _native.Engine:
        if self._engine is None:
            raise RuntimeError("the model is closed")
        return self._engine

    # --- vocabulary -----------------------------------------------------------------------
    @property
    def n_ctx(self) -> int:
        return self.engine.n_ctx

    @property
    def n_vocab(self) -> int:
        return self.engine.n_vocab

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = False) -> list[int]:
        return self.engine.tokenize(text, add_special, parse_special)

    def detokenize(self, tokens: Iterable[int], render_special: bool = False) -> str:
        return self.engine.detokenize(list(tokens), render_special)

    def weight_buffers(self) -> dict[str, int]:
        """Bytes of weights per ggml buffer type: "CPU_Mapped" (read from the file as it is),
        "AMX" / "CPU_REPACK" (repacked for faster kernels), "CPU" (read into memory)."""
        return dict(self.engine.weight_buffers())

    def weight_placement(self) -> dict[str, tuple[list[int], str]]:
        """Per weight tensor as loaded: (shape in ggml order, buffer type). With repacking on, a
        SelectInfer layer's static gate/up rows are tensors of their own (`blk.N.ffn_gate`,
        which ggml may repack) beside the gathered rows (`blk.N.ffn_gate_dyn`)."""
        return {name: (list(ne), buffer) for name, (ne, buffer) in self.engine.weight_placement().items()}

    def metadata(self, key: str) -> str | None:
        value = self.engine.meta(key)
        return value if value != "" else None

    # --- evaluation -----------------------------------------------------------------------
    def logits(self, tokens: Sequence[int]) -> np.ndarray:
        """Logits after each token of `tokens` (a fresh sequence): shape (len(tokens), n_vocab)."""
        return self.engine.eval_prompt(list(tokens), True)

    def token_logprobs(self, text: str | Sequence[int], n_prompt: int | None = None) -> tuple[list[int], np.ndarray]:
        """Tokens of `text` (with BOS when the model adds one) and log p(token_i | tokens_<i) for
        i >= 1, all in one pass. With n_prompt, the first n_prompt tokens are a prompt and only the
        tokens after it are scored, one decode step each: as generation computes them (in a
        SelectInfer model, with the neurons the prompt selected)."""
        tokens = self.tokenize(text) if isinstance(text, str) else list(text)
        if len(tokens) < 2:
            raise ValueError("need at least two tokens to score a text")
        if n_prompt is None:
            return tokens, self.engine.token_logprobs(tokens)
        if not 1 <= n_prompt < len(tokens):
            raise ValueError(f"n_prompt must be in [1, {len(tokens) - 1}] for a text of {len(tokens)} tokens, "
                             f"got {n_prompt}")
        logprobs, _ = self.continuation_scores(tokens[:n_prompt], tokens[n_prompt:])
        return tokens, logprobs

    def continuation_scores(self, prompt: Sequence[int], continuation: Sequence[int]) -> tuple[np.ndarray, bool]:
        """log p of each continuation token after `prompt`, one decode step each (in a SelectInfer
        model, with the neurons the prompt selected), and whether greedy decoding would have produced
        the whole continuation (every token the most likely one)."""
        if not prompt or not continuation:
            raise ValueError("need a prompt and a continuation of at least one token each")
        engine = self.engine
        engine.eval_prompt(list(prompt), False)
        logprobs, greedy = [], True
        for i, token in enumerate(continuation):
            logits = np.asarray(engine.last_logits(), dtype=np.float64)
            top = logits.max()
            logprobs.append(logits[token] - top - np.log(np.exp(logits - top).sum()))
            greedy = greedy and logits[token] == top
            if i + 1 < len(continuation):
                engine.eval_token(token)
        return np.asarray(logprobs, dtype=np.float32), bool(greedy)

    def perplexity(self, text: str | Sequence[int], n_prompt: int | None = None) -> float:
        """exp of the mean negative log-likelihood of the scored tokens (token_logprobs)."""
        _, logprobs = self.token_logprobs(text, n_prompt)
        return float(np.exp(-np.mean(logprobs)))

    def activation_sums(self, reset: bool = True) -> tuple[list[np.ndarray], int]:
        """Per layer, sum over evaluated tokens of |a_n| for each FFN neuron n (a: input of the down
        projection), and the number of tokens; needs profile=True. Resets the sums by default."""
        return self.engine.activation_sums(reset)

    def input_moments(self) -> tuple[list[np.ndarray], list[np.ndarray], int]:
        """Per layer, sum of h h^T [n_embd, n_embd] and sum of h [n_embd] over the tokens of prompt
        batches (more than one token; h: the FFN input, after its norm), and their number; needs
        profile_input_moments=True. activation_sums(reset=True) resets them."""
        return self.engine.input_moments()

    # --- selective computation ------------------------------------------------------------
    def selected_neurons(self) -> dict[int, np.ndarray]:
        """Per SelectInfer layer, the rows (neurons of the file) that decode steps compute (empty
        for the gate-guided and predicted strategies, whose decode steps each choose their own)."""
        return {il: np.asarray(ids, dtype=np.int32) for il, ids in self.engine.selected_neurons()}

    def computed_counts(self) -> dict[int, int]:
        """Per SelectInfer layer, how many neurons a decode step computes (static ones included; every
        strategy): phi N in every layer, or the profile's per-layer budgets (layer_budgets)."""
        return dict(self.engine.computed_counts())

    def selection_config(self) -> dict:
        return self.engine.selection_config()

    # --- generation -----------------------------------------------------------------------
    def stream(self, prompt: str | Sequence[int], max_tokens: int = 128, *, temperature: float = 0.8,
               top_k: int = 40, top_p: float = 0.95, stop: str | Sequence[str] | None = None,
               seed: int | None = None) -> Iterator[str]:
        """Yields the generated text piece by piece (whole UTF-8 characters only)."""
        _check_max_tokens(max_tokens)
        stops = _stop_list(stop)
        self._set_sampling(temperature, top_k, top_p, self.seed if seed is None else seed)
        tokens = self.tokenize(prompt) if isinstance(prompt, str) else list(prompt)
        return self._generate(tokens, max_tokens, _StopFilter(stops))

    def generate(self, prompt: str | Sequence[int], max_tokens: int = 128, **kwargs) -> str:
        """The text generated after `prompt`: until end of text, max_tokens, a full context or a stop string."""
        return "".join(self.stream(prompt, max_tokens, **kwargs))

    def chat(self, messages: Sequence[dict], max_tokens: int = 128, *, stream: bool = False,
             **kwargs) -> str | Iterator[str]:
        """Answers a conversation ([{"role": ..., "content": ...}, ...]) with the model's chat template."""
        pairs = [(m["role"], m["content"]) for m in messages]
        prompt = self.engine.apply_chat_template(pairs, True)
        tokens = self.engine.tokenize(prompt, True, True)
        pieces = self.stream(tokens, max_tokens, **kwargs)
        return pieces if stream else "".join(pieces)

    def decode_tokens(self, prompt: Sequence[int], n: int, *, follow: Sequence[int] | None = None,
                      stop_at_eog: bool = False, logits: bool = False) -> tuple[list[int], np.ndarray | None]:
        """The prompt-then-decode loop of benchmarks and comparisons: evaluates `prompt` as a new
        prompt (a SelectInfer model selects from it), then n greedy decode steps, each feeding the
        greedy token (or the next one of `follow`, to compare two models on the same sequence).
        Returns the tokens fed and, with logits=True, each step's logits [n, n_vocab]; stop_at_eog
        ends at an end-of-text token (not fed, not returned)."""
        if n < 0:
            raise ValueError(f"n must be >= 0, got {n}")
        if follow is not None and len(follow) < n:
            raise ValueError(f"follow has {len(follow)} tokens for {n} steps")
        engine = self.engine
        self.set_sampling(temperature=0.0)
        engine.eval_prompt(list(prompt), False)
        tokens, steps = [], []
        for i in range(n):
            token = engine.sample() if follow is None else int(follow[i])
            if stop_at_eog and engine.is_eog(token):
                break
            engine.eval_token(token)
            tokens.append(token)
            if logits:
                steps.append(engine.last_logits())
        return tokens, (np.asarray(steps, dtype=np.float32) if logits else None)

    def set_sampling(self, temperature: float = 0.8, top_k: int = 40, top_p: float = 0.95,
                     seed: int | None = None) -> None:
        """Sampling for decode_tokens and low-level engine use (generate and stream take their own)."""
        self._set_sampling(temperature, top_k, top_p, self.seed if seed is None else seed)

    def _set_sampling(self, temperature: float, top_k: int, top_p: float, seed: int | None) -> None:
        params = _native.SamplingParams()
        params.temperature, params.top_k, params.top_p = float(temperature), int(top_k), float(top_p)
        params.seed = _native.RANDOM_SEED if seed is None or seed < 0 else int(seed) & 0xFFFFFFFF
        self.engine.set_sampling(params)  # validates

    def _generate(self, tokens: list[int], max_tokens: int, stops: _StopFilter) -> Iterator[str]:
        engine = self.engine
        engine.eval_prompt(tokens, False)
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        n = 0
        while max_tokens < 0 or n < max_tokens:
            token = engine.sample()
            if engine.is_eog(token):
                break
            text = stops.feed(decoder.decode(engine.token_piece(token)))
            if text:
                yield text
            n += 1
            if stops.stopped or len(engine.history) >= engine.n_ctx:
                return
            if max_tokens < 0 or n < max_tokens:
                engine.eval_token(token)
        tail = stops.feed(decoder.decode(b"", final=True))
        if not stops.stopped:
            tail += stops.flush()
        if tail:
            yield tail

    # --- statistics -----------------------------------------------------------------------
    def stats(self) -> dict:
        """Prefill and decode throughput since the last reset_stats(), model bytes and process RSS."""
        s = self.engine.stats()
        rate = lambda n, ms: 1000.0 * n / ms if ms > 0 else 0.0  # noqa: E731
        return {
            "n_prefill_tokens": s.n_prefill_tokens,
            "prefill_ms": s.prefill_ms,
            "prefill_tokens_per_s": rate(s.n_prefill_tokens, s.prefill_ms),
            "n_decode_tokens": s.n_decode_tokens,
            "decode_ms": s.decode_ms,
            "decode_tokens_per_s": rate(s.n_decode_tokens, s.decode_ms),
            "model_bytes": s.model_bytes,
            "rss_bytes": s.rss_bytes,
            "peak_rss_bytes": s.peak_rss_bytes,
        }

    def reset_stats(self) -> None:
        self.engine.reset_stats()

    def __repr__(self) -> str:
        state = "closed" if self._engine is None else self._engine.describe()
        return f"Model({self.model_path!r}, {state})"
