"""Accuracy of selective computation on held-out data: the original model against a SelectInfer
GGUF computing every loaded neuron and at each compute ratio phi.

- capitals-qa, eval split: greedy answer (chat template, as profiled) contains an accepted answer;
- botchan, eval split: perplexity of each passage's second half after its first half as the prompt,
  scored one decode step at a time (Model.perplexity(n_prompt=...)), i.e. with the prompt's
  selection; reported as the exp of the mean over all scored tokens.

    python scripts/eval_accuracy.py "$(selectinfer pull -q)" smollm2.si70.gguf --compute-ratios 0.3 0.4 0.5 --n 100
"""
from __future__ import annotations

import argparse
import math
from pathlib import Path

from tqdm import tqdm

from selectinfer import Model
from selectinfer.tasks import format_prompt, load_dataset, sample_examples


def qa_accuracy(m: Model, examples: list[dict], max_tokens: int) -> float:
    chat = m.metadata("tokenizer.chat_template") is not None
    right = 0
    for ex in examples:
        text, special = format_prompt(ex, chat, lambda msgs: m.engine.apply_chat_template(msgs, True))
        answer = m.generate(m.tokenize(text, True, special), max_tokens, temperature=0).lower()
        right += any(a.lower() in answer for a in ex["answers"])
    return right / len(examples)


def continuation_nll(m: Model, passages: list[dict]) -> tuple[float, int]:
    """Summed negative log-likelihood of each passage's second half after its first half, and the token count."""
    total, count = 0.0, 0
    for ex in passages:
        tokens = m.tokenize(ex["text"])
        _, logprobs = m.token_logprobs(tokens, n_prompt=len(tokens) // 2)
        total -= float(logprobs.sum())
        count += len(logprobs)
    return total, count


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("original", help="the dense model")
    ap.add_argument("selectinfer", help="its SelectInfer GGUF")
    ap.add_argument("--compute-ratios", type=float, nargs="+", default=[0.3, 0.4, 0.5])
    ap.add_argument("--n", type=int, default=100, help="examples of each dataset")
    ap.add_argument("--max-tokens", type=int, default=16, help="generated tokens per QA answer")
    ap.add_argument("-t", "--threads", type=int, default=0)
    args = ap.parse_args(argv)

    qa = sample_examples(load_dataset("capitals-qa", "eval").examples, args.n)
    text = sample_examples(load_dataset("botchan", "eval").examples, args.n)
    configs = [(Path(args.original).name, args.original, {}),
               (f"{Path(args.selectinfer).name} (dense over loaded)", args.selectinfer, {"dense": True})]
    configs += [(f"{Path(args.selectinfer).name} (phi {phi})", args.selectinfer, {"compute_ratio": phi})
                for phi in args.compute_ratios]
    print(f"capitals-qa eval: {len(qa)} questions; botchan eval: {len(text)} passages (second half scored)")
    print("| model | capitals-qa accuracy | botchan continuation perplexity |")
    print("|---|---:|---:|")
    for label, path, kwargs in tqdm(configs, desc="models", leave=False):
        with Model(path, n_ctx=2048, n_threads=args.threads, **kwargs) as m:
            accuracy = qa_accuracy(m, qa, args.max_tokens)
            nll, count = continuation_nll(m, text)
        print(f"| {label} | {100 * accuracy:.1f}% | {math.exp(nll / count):.2f} |", flush=True)


if __name__ == "__main__":
    main()
