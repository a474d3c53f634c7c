"""The lm-evaluation-harness model (selectinfer.evaluation.lm_eval_adapter) on tasks defined from local JSON
files (the hub is not reachable): each request type's result against the same quantity computed
with the Model API, on a SelectInfer file at a compute ratio."""
import json
import math
import subprocess
import sys

import pytest
from helpers import make_si_model

lm_eval = pytest.importorskip("lm_eval")

from selectinfer import Model  # noqa: E402
from selectinfer.evaluation.lm_eval_adapter import SelectInferLM  # noqa: E402

QUESTIONS = [
    {"question": "What is the capital of France?", "choices": [" Paris", " Rome", " Oslo"], "label": 0, "answer": "Paris"},
    {"question": "What is two plus two?", "choices": [" four", " five"], "label": 0, "answer": "four"},
    {"question": "Which colour is the sky?", "choices": [" green", " blue", " red"], "label": 1, "answer": "blue"},
]
TEXTS = [{"text": "The history of the city begins with a small settlement on the river."},
         {"text": "Traders met there to exchange grain, salt and cloth, and the market grew into a town."}]
MODEL_ARGS = {"compute_ratio": 0.5, "n_ctx": 256, "n_threads": 1}


def task_yaml(name, data, body):
    return (f"task: {name}\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {data}\n"
            f"test_split: test\n{body}")


@pytest.fixture(scope="module")
def tasks_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("lm_eval_tasks")
    (root / "qa.jsonl").write_text("".join(json.dumps(q) + "\n" for q in QUESTIONS))
    (root / "text.jsonl").write_text("".join(json.dumps(t) + "\n" for t in TEXTS))
    (root / "mc.yaml").write_text(task_yaml("si_mc", root / "qa.jsonl", (
        "output_type: multiple_choice\ndoc_to_text: \"Question: {{question}}\\nAnswer:\"\n"
        "doc_to_choice: \"{{choices}}\"\ndoc_to_target: \"{{label}}\"\nmetric_list:\n  - metric: acc\n")))
    (root / "gen.yaml").write_text(task_yaml("si_gen", root / "qa.jsonl", (
        "output_type: generate_until\ndoc_to_text: \"Question: {{question}}\\nAnswer:\"\n"
        "doc_to_target: \"{{answer}}\"\ngeneration_kwargs:\n  until: [\"\\n\"]\n  max_gen_toks: 6\n"
        "  do_sample: false\nmetric_list:\n  - metric: exact_match\n")))
    (root / "ppl.yaml").write_text(task_yaml("si_ppl", root / "text.jsonl", (
        "output_type: loglikelihood_rolling\ndoc_to_text: \"\"\ndoc_to_target: \"{{text}}\"\n"
        "metric_list:\n  - metric: word_perplexity\n  - metric: bits_per_byte\n")))
    return root


@pytest.fixture(scope="module")
def si_model(tmp_path_factory):
    _, si = make_si_model(tmp_path_factory.mktemp("lm_eval_model"), seed=3, layers="0:3")
    return si


@pytest.fixture(scope="module")
def results(tasks_dir, si_model, monkeypatch_module):
    from lm_eval.tasks import TaskManager

    lm = SelectInferLM(path=str(si_model), **MODEL_ARGS)
    out = lm_eval.simple_evaluate(model=lm, tasks=["si_mc", "si_gen", "si_ppl"],
                                  task_manager=TaskManager(include_path=str(tasks_dir)), log_samples=True)
    return out


@pytest.fixture(scope="module")
def monkeypatch_module():
    mp = pytest.MonkeyPatch()
    mp.setenv("HF_DATASETS_OFFLINE", "1")
    mp.setenv("HF_HUB_OFFLINE", "1")
    yield mp
    mp.undo()


def test_multiple_choice_scores_each_choice_after_the_prompt(results, si_model):
    with Model(si_model, n_ctx=256, n_threads=1, compute_ratio=0.5) as m:
        right = 0
        for q in QUESTIONS:
            prompt = m.tokenize(f"Question: {q['question']}\nAnswer:")
            scores = []
            for choice in q["choices"]:
                whole = m.tokenize(f"Question: {q['question']}\nAnswer:{choice}")
                assert whole[:len(prompt)] == prompt
                scores.append(float(m.continuation_scores(prompt, whole[len(prompt):])[0].sum()))
            right += int(max(range(len(scores)), key=scores.__getitem__) == q["label"])
    assert results["results"]["si_mc"]["acc,none"] == pytest.approx(right / len(QUESTIONS))


def test_generate_until_is_greedy_generation(results, si_model):
    samples = results["samples"]["si_gen"]
    with Model(si_model, n_ctx=256, n_threads=1, compute_ratio=0.5) as m:
        for s in samples:
            q = QUESTIONS[s["doc_id"]]
            expected = m.generate(m.tokenize(f"Question: {q['question']}\nAnswer:"), 6, temperature=0, stop="\n")
            assert s["resps"][0][0] == expected


def test_loglikelihood_rolling_is_the_whole_text(results, si_model):
    total_logprob, words, n_bytes = 0.0, 0, 0
    with Model(si_model, n_ctx=256, n_threads=1, compute_ratio=0.5) as m:
        for t in TEXTS:
            tokens, logprobs = m.token_logprobs(t["text"])  # BOS, then the text in one pass
            total_logprob += float(logprobs.sum())
            words += len(t["text"].split())
            n_bytes += len(t["text"].encode())
    got = results["results"]["si_ppl"]
    assert got["word_perplexity,none"] == pytest.approx(math.exp(-total_logprob / words), rel=1e-4)
    assert got["bits_per_byte,none"] == pytest.approx(-total_logprob / n_bytes / math.log(2), rel=1e-4)


def test_unknown_model_args_are_refused(si_model):
    with pytest.raises(ValueError, match="unknown selectinfer model_args: temprature"):
        SelectInferLM(path=str(si_model), temprature=0.5)
    with pytest.raises(FileNotFoundError):
        SelectInferLM(path="missing.gguf")


def test_the_command_line(tasks_dir, si_model, tmp_path):
    r = subprocess.run([sys.executable, "-m", "selectinfer.cli", "lm-eval", "--model", "selectinfer", "--model_args",
                        f"path={si_model},compute_ratio=0.5,n_ctx=256,n_threads=1", "--tasks", "si_mc",
                        "--include_path", str(tasks_dir), "--output_path", str(tmp_path / "out")],
                       capture_output=True, text=True, timeout=600,
                       env={**__import__("os").environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"})
    assert r.returncode == 0, r.stderr[-2000:]
    assert "si_mc" in r.stdout and "acc" in r.stdout
