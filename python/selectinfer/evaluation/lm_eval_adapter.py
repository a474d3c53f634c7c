"""A model for EleutherAI's lm-evaluation-harness (PyPI `lm-eval`): any SelectInfer configuration
evaluated on the harness's tasks.

    selectinfer lm-eval --model selectinfer --model_args path=MODEL.gguf,compute_ratio=0.4 --tasks ...

(`lm_eval` finds only the models it ships or that an imported module registered: the command is
lm_eval's own command line with this module imported.) In Python: import this module, then
`lm_eval.simple_evaluate(model="selectinfer", model_args="path=...")`.

- loglikelihood: the context is the prompt (it selects the neurons, as in generation) and each
  continuation token is scored as a decode step;
- loglikelihood_rolling: the text in windows of the context size, each scored in one pass (as a
  prompt: no earlier prompt to select from, so a SelectInfer layer computes every loaded neuron);
- generate_until: greedy (or sampled, with `temperature` > 0) generation until a stop string.
"""
from __future__ import annotations

import sys

from lm_eval.api.model import LM
from lm_eval.api.registry import register_model
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window
from tqdm import tqdm

from ..runtime.model import SELECTION_KEYWORDS, Model

# accepted from lm_eval's command line (batch size, device) and ignored: one sequence, on this CPU
_HARNESS_ARGS = ("batch_size", "max_batch_size", "device")


@register_model("selectinfer")
class SelectInferLM(LM):
    def __init__(self, path: str, n_ctx: int = 2048, n_threads: int = 0, max_gen_toks: int = 256, **args):
        super().__init__()
        unknown = sorted(set(args) - set(SELECTION_KEYWORDS) - set(_HARNESS_ARGS))
        if unknown:
            raise ValueError(f"unknown selectinfer model_args: {', '.join(unknown)}; known: path, "
                             f"{', '.join(SELECTION_KEYWORDS)}, n_ctx, n_threads, max_gen_toks")
        selection = {k: v for k, v in args.items() if k in SELECTION_KEYWORDS}
        self.model = Model(path, n_ctx=int(n_ctx), n_threads=int(n_threads), **selection)
        self.n_ctx, self.max_gen_toks = int(n_ctx), int(max_gen_toks)
        self._prefix = self.model.tokenize("", add_special=True) or [self._eos()]

    def _eos(self) -> int:
        for token in range(self.model.n_vocab):
            if self.model.engine.is_eog(token):
                return token
        raise ValueError("the model has neither a BOS nor an end-of-generation token to condition on")

    @property
    def tokenizer_name(self) -> str:
        return self.model.model_path

    def _fits(self, n_tokens: int, what: str) -> None:
        if n_tokens > self.n_ctx:
            raise ValueError(f"{what} of {n_tokens} tokens does not fit the context of {self.n_ctx}; "
                             "raise n_ctx in --model_args")

    def loglikelihood(self, requests, disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        out = []
        for req in tqdm(requests, disable=disable_tqdm, desc="loglikelihood"):
            context, continuation = req.args
            prompt = (self.model.tokenize(context, add_special=True) if context else []) or list(self._prefix)
            whole = self.model.tokenize(context + continuation, add_special=True)
            # the continuation's tokens as the whole text tokenizes them, where the context is a prefix
            cont = (whole[len(prompt):] if context and whole[:len(prompt)] == prompt
                    else self.model.tokenize(continuation, add_special=False))
            if not cont:
                raise ValueError(f"empty continuation after {context[-40:]!r}")
            self._fits(len(prompt) + len(cont), "a context and continuation")
            logprobs, greedy = self.model.continuation_scores(prompt, cont)
            out.append((float(logprobs.sum()), greedy))
        return out

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        out = []
        for req in tqdm(requests, disable=disable_tqdm, desc="loglikelihood_rolling"):
            (text,) = req.args
            tokens = self.model.tokenize(text, add_special=False)
            total = 0.0
            windows = get_rolling_token_windows(token_list=tokens, prefix_token=self._prefix[0],
                                                max_seq_len=self.n_ctx, context_len=1)
            for context, pred in map(make_disjoint_window, windows):
                logprobs = self.model.engine.token_logprobs(context + pred)  # log p(token i | < i), i >= 1
                total += float(sum(logprobs[len(context) - 1:]))
            out.append(total)
        return out

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        out = []
        for req in tqdm(requests, disable=disable_tqdm, desc="generate_until"):
            context, gen_kwargs = req.args
            kwargs = dict(gen_kwargs or {})
            until = kwargs.pop("until", None) or []
            until = [until] if isinstance(until, str) else list(until)
            max_tokens = int(kwargs.pop("max_gen_toks", self.max_gen_toks))
            temperature = float(kwargs.pop("temperature", 0.0)) if kwargs.pop("do_sample", True) else 0.0
            prompt = self.model.tokenize(context, add_special=True)
            self._fits(len(prompt) + 1, "a prompt")
            text = self.model.generate(prompt, max_tokens, temperature=temperature, stop=until or None,
                                       seed=int(kwargs.pop("seed", 0)))
            out.append(text)
        return out


def main(argv: list[str] | None = None) -> int:
    """lm_eval's command line, with the selectinfer model registered."""
    from lm_eval.__main__ import cli_evaluate

    sys.argv = ["lm_eval", *(sys.argv[1:] if argv is None else argv)]
    cli_evaluate()
    return 0


if __name__ == "__main__":
    sys.exit(main())
