"""The evaluation's metrics and their intervals (selectinfer.evaluation.metrics) against hand-computed values
and the packages they wrap."""
import math

import numpy as np
import pytest

from selectinfer.evaluation import metrics


@pytest.mark.parametrize("generated, answers, em, f1", [
    ("Paris", ["Paris"], 1.0, 1.0),
    ("The capital is Paris.", ["Paris"], 0.0, 2 * (1 / 3) * 1 / (1 / 3 + 1)),  # 'capital is paris' vs 'paris'
    ("Answer: the Paris\nmore text", ["Paris"], 1.0, 1.0),  # label, article and later lines dropped
    ("Buenos Aires", ["Buenos Aires", "BA"], 1.0, 1.0),
    ("Buenos", ["Buenos Aires"], 0.0, 2 * 1.0 * 0.5 / 1.5),
    ("Lyon", ["Paris"], 0.0, 0.0),
    ("", ["Paris"], 0.0, 0.0),
])
def test_qa_metrics(generated, answers, em, f1):
    assert metrics.exact_match(generated, answers) == em
    assert metrics.token_f1(generated, answers) == pytest.approx(f1)


def test_contains_answer_is_case_blind():
    assert metrics.contains_answer("I think it is PARIS, France", ["Paris"]) == 1.0
    assert metrics.contains_answer("Lyon", ["Paris"]) == 0.0


def test_bootstrap_interval_of_a_mean_matches_the_normal_approximation():
    rng = np.random.default_rng(3)
    x = (rng.random(400) < 0.5).astype(float)
    est = metrics.bootstrap(lambda idx: float(x[idx].mean()), len(x))
    half = 1.96 * math.sqrt(x.mean() * (1 - x.mean()) / len(x))
    assert est.value == pytest.approx(x.mean())
    assert est.low < est.value < est.high
    assert (est.high - est.low) / 2 == pytest.approx(half, rel=0.15)
    assert est.n == 400


def test_constant_scores_have_an_empty_interval():
    est = metrics.bootstrap(lambda idx: float(np.ones(10)[idx].mean()), 10)
    assert (est.value, est.low, est.high) == (1.0, 1.0, 1.0)


def test_paired_difference_uses_the_same_examples():
    rng = np.random.default_rng(5)
    a = rng.random(60)
    b = a + 0.1  # the same systems' scores shifted: every paired resample differs by exactly 0.1
    d = metrics.paired_difference(lambda idx: float(a[idx].mean()), lambda idx: float(b[idx].mean()), len(a))
    assert d.value == pytest.approx(0.1) and d.low == pytest.approx(0.1) and d.high == pytest.approx(0.1)
    # unpaired, the two intervals overlap widely: pairing is what makes the difference visible
    ea, eb = (metrics.bootstrap(lambda idx, v=v: float(v[idx].mean()), len(a)) for v in (a, b))
    assert ea.high > eb.low


def test_rouge_l():
    pytest.importorskip("rouge_score")
    scores = metrics.rouge_l(["the cat sat", "completely different words", "", "..."], ["the cat sat", "the cat sat", "", "the cat"])
    assert scores[0] == pytest.approx(1.0)
    assert scores[1] == 0.0 and scores[2] == 1.0 and scores[3] == 0.0  # identical (empty) texts: 1


def test_perplexity_is_exp_of_the_mean_token_nll():
    nll, counts = np.array([10.0, 4.0, 6.0]), np.array([5, 2, 3])
    assert metrics.perplexity(nll, counts, np.arange(3)) == pytest.approx(math.exp(20 / 10))
    assert metrics.perplexity(nll, counts, np.array([1, 1])) == pytest.approx(math.exp(8 / 4))


def test_corpus_statistics_give_the_corpus_scores_of_any_resample():
    sacrebleu = pytest.importorskip("sacrebleu")
    hyps = ["the cat sat on the mat", "a dog barks at night", "it is raining", "hello world"]
    refs = ["the cat sat on a mat", "the dog barks at night", "it rains", "hello there world"]
    for kind, corpus in (("bleu", sacrebleu.corpus_bleu), ("chrf", sacrebleu.corpus_chrf)):
        stat = metrics.corpus_statistic(kind, hyps, refs)
        for idx in ([0, 1, 2, 3], [1, 1, 3], [2]):
            expected = corpus([hyps[i] for i in idx], [[refs[i] for i in idx]]).score
            assert stat(np.array(idx)) == pytest.approx(expected), (kind, idx)
    assert metrics.corpus_statistic("bleu", refs, refs)(np.arange(4)) == pytest.approx(100.0)
