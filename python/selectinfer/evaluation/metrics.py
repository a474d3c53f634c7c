"""Task metrics, each with a bootstrap 95% interval and a paired comparison (selectinfer eval).

Every metric is a statistic of per-example records (answers, translations, summaries, token
log-likelihoods), so one resampling of the examples serves every metric and a paired comparison
resamples both systems with the same indices. Corpus-level metrics (BLEU, chrF, perplexity) are
recomputed on each resample, as sacreBLEU's own bootstrap does.

- qa: exact match and token F1 after SQuAD's answer normalization (best over the accepted answers),
  and `contains` (an accepted answer appears in the generated text);
- translation: sacreBLEU BLEU and chrF against the references;
- summarization: ROUGE-L F1 (rouge-score) against references where the data has them, and against
  the original model's summary (fidelity);
- text: perplexity of the scored continuation tokens (exp of their mean negative log-likelihood).
"""
from __future__ import annotations

import math
import re
import string
from collections import Counter
from dataclasses import asdict, dataclass
from typing import Callable, Sequence

import numpy as np

N_BOOTSTRAP = 1000
CONFIDENCE = 0.95


@dataclass(frozen=True)
class Estimate:
    """A metric's value on all n examples and its bootstrap interval."""
    value: float
    low: float
    high: float
    n: int

    def as_dict(self) -> dict:
        return asdict(self)

    def __str__(self) -> str:
        return f"{self.value:.3g} [{self.low:.3g}, {self.high:.3g}]"


def resamples(n: int, n_bootstrap: int = N_BOOTSTRAP, seed: int = 0) -> np.ndarray:
    """[n_bootstrap, n] example indices drawn with replacement (the same for every system: paired)."""
    if n < 1:
        raise ValueError("no examples to resample")
    return np.random.default_rng(seed).integers(0, n, size=(n_bootstrap, n))


def bootstrap(statistic: Callable[[np.ndarray], float], n: int, draws: np.ndarray | None = None) -> Estimate:
    """statistic(indices) on all n examples, with the percentile interval over the resamples."""
    draws = resamples(n) if draws is None else draws
    values = np.array([statistic(idx) for idx in draws])
    tail = 100 * (1 - CONFIDENCE) / 2
    return Estimate(float(statistic(np.arange(n))), float(np.percentile(values, tail)),
                    float(np.percentile(values, 100 - tail)), n)


def paired_difference(statistic_a: Callable[[np.ndarray], float], statistic_b: Callable[[np.ndarray], float],
                      n: int, draws: np.ndarray | None = None) -> Estimate:
    """b - a on the same examples, with its interval over the same resamples of both."""
    return bootstrap(lambda idx: statistic_b(idx) - statistic_a(idx), n, draws)


# --- question answering ---------------------------------------------------------------------------
def normalize_answer(text: str) -> str:
    """SQuAD's normalization: lower case, no punctuation, no articles, single spaces."""
    text = "".join(ch for ch in text.lower() if ch not in string.punctuation)
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def answer_span(generated: str) -> str:
    """The answer part of a generation: its first non-empty line, without an 'Answer:' label."""
    for line in generated.strip().splitlines():
        line = re.sub(r"^\s*answer\s*:\s*", "", line, flags=re.IGNORECASE).strip()
        if line:
            return line
    return ""


def exact_match(generated: str, answers: Sequence[str]) -> float:
    span = normalize_answer(answer_span(generated))
    return float(any(span == normalize_answer(a) for a in answers))


def token_f1(generated: str, answers: Sequence[str]) -> float:
    """Best token-overlap F1 between the answer span and an accepted answer."""
    predicted = normalize_answer(answer_span(generated)).split()
    best = 0.0
    for answer in answers:
        truth = normalize_answer(answer).split()
        common = sum((Counter(predicted) & Counter(truth)).values())
        if common:
            precision, recall = common / len(predicted), common / len(truth)
            best = max(best, 2 * precision * recall / (precision + recall))
        elif not predicted and not truth:
            best = 1.0
    return best


def contains_answer(generated: str, answers: Sequence[str]) -> float:
    return float(any(a.lower() in generated.lower() for a in answers))


# --- translation, summarization, text ------------------------------------------------------------
def _sacrebleu():
    try:
        import sacrebleu
    except ImportError:
        raise ImportError("translation metrics need sacreBLEU: pip install 'selectinfer[eval]' (or sacrebleu)") from None
    return sacrebleu


def corpus_statistic(kind: str, hypotheses: Sequence[str], references: Sequence[str]) -> Callable[[np.ndarray], float]:
    """BLEU or chrF ("bleu", "chrf") of the examples idx, from sentence statistics extracted once
    and summed per resample, as sacreBLEU's own bootstrap does (recomputing the corpus score from
    the text on each of 1000 resamples takes seconds per system)."""
    sacrebleu = _sacrebleu()
    metric = {"bleu": sacrebleu.BLEU, "chrf": sacrebleu.CHRF}[kind]()
    stats = np.array(metric._extract_corpus_statistics(list(hypotheses), [list(references)]))
    return lambda idx: float(metric._compute_score_from_stats(stats[idx].sum(0).tolist()).score)


def rouge_l(hypotheses: Sequence[str], references: Sequence[str]) -> np.ndarray:
    """ROUGE-L F1 of each hypothesis against its reference (rouge-score, with stemming); identical
    texts score 1 even when rouge-score finds no words in them (it scores two empty texts 0)."""
    try:
        from rouge_score import rouge_scorer
    except ImportError:
        raise ImportError("summarization metrics need rouge-score: pip install 'selectinfer[eval]' "
                          "(or rouge-score)") from None
    scorer = rouge_scorer.RougeScorer(["rougeL"], use_stemmer=True)
    return np.array([1.0 if h == r else scorer.score(r, h)["rougeL"].fmeasure for h, r in zip(hypotheses, references)])


def perplexity(nll: np.ndarray, counts: np.ndarray, idx: np.ndarray) -> float:
    """exp of the mean negative log-likelihood per token over the examples idx (summed NLL, token counts)."""
    return math.exp(float(nll[idx].sum()) / max(1, int(counts[idx].sum())))
