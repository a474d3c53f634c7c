"""Tasks, their prompt templates, and the data sets a profile is computed on.

A data set is a built-in corpus (corpora.py) or a user file (JSONL, CSV or Parquet) tagged with
a task. An example either has the task's fields (filled into the task's template, then wrapped
in the model's chat template when the task is conversational and the model has one) or a
`prompt` field used verbatim.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

from .corpora import CORPORA, load_corpus


@dataclass(frozen=True)
class Task:
    name: str
    template: str
    fields: tuple[str, ...]
    chat: bool  # wrap in the model's chat template when it has one
    description: str


TASKS: dict[str, Task] = {t.name: t for t in [
    Task("qa", "Answer the question in a few words.\nQuestion: {question}\nAnswer:", ("question",), True,
         "closed-book question answering"),
    Task("translation", "Translate this German sentence into English.\nGerman: {source}\nEnglish:", ("source",), True,
         "German to English translation"),
    Task("summarization", "Summarize the following text in one or two sentences.\n\n{text}", ("text",), True,
         "summarization of a passage"),
    Task("text", "{text}", ("text",), False, "plain language modelling: continue the text"),
]}


def get_task(name: str) -> Task:
    if name not in TASKS:
        raise ValueError(f"unknown task '{name}'; known tasks: {', '.join(TASKS)}")
    return TASKS[name]


@dataclass
class Dataset:
    name: str
    task: str
    examples: list[dict] = field(repr=False)
    source: str = ""


def _check_example(ex: object, task: Task, where: str) -> dict:
    if not isinstance(ex, dict):
        raise ValueError(f"{where}: expected a JSON object, got {type(ex).__name__}")
    if "prompt" not in ex and "input_ids" not in ex and not all(isinstance(ex.get(f), str) and ex.get(f) for f in task.fields):
        need = " and ".join(repr(f) for f in task.fields)
        raise ValueError(f"{where}: a {task.name} example needs {need} (or 'prompt', or 'input_ids'); got fields {sorted(ex)}")
    return ex


def _read_jsonl(path: Path, task: Task) -> list[dict]:
    examples = []
    with open(path, encoding="utf-8") as f:
        for line_no, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                ex = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{line_no}: malformed JSON ({e.msg}); each line must be one JSON object") from None
            examples.append(_check_example(ex, task, f"{path}:{line_no}"))
    return examples


def _read_table(path: Path, task: Task) -> list[dict]:
    try:
        import datasets  # Hugging Face datasets, for CSV and Parquet
    except ImportError:
        raise ValueError(f"reading {path.suffix} files needs the `datasets` package: pip install datasets") from None
    kind = "csv" if path.suffix == ".csv" else "parquet"
    table = datasets.load_dataset(kind, data_files=str(path), split="train")
    return [_check_example(row, task, f"{path} row {i + 2 if kind == 'csv' else i}") for i, row in enumerate(table)]


def load_user_dataset(path: str | Path, task: str) -> Dataset:
    """A user file as a data set. Rows with split == "eval" are held out; others calibrate."""
    t = get_task(task)
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"data file not found: {path}")
    readers = {".jsonl": _read_jsonl, ".csv": _read_table, ".parquet": _read_table}
    if path.suffix not in readers:
        raise ValueError(f"{path}: unsupported data file type '{path.suffix}'; use .jsonl, .csv or .parquet")
    examples = readers[path.suffix](path, t)
    for i, ex in enumerate(examples):
        ex.setdefault("id", f"{path.stem}:{i}")
        ex.setdefault("split", "calibration")
        ex["task"] = task
    return Dataset(path.stem, task, examples, f"user file {path}")


def load_dataset(spec: str, split: str = "calibration") -> Dataset:
    """`spec` is a built-in corpus name (see corpora.CORPORA) or `PATH:TASK` for a user file.
    Returns only the examples of `split`, and fails when there are none."""
    if spec in CORPORA:
        corpus = CORPORA[spec]
        ds = Dataset(spec, corpus.task, load_corpus(spec), corpus.source)
    elif ":" in spec:
        path, task = spec.rsplit(":", 1)
        ds = load_user_dataset(path, task)
    else:
        raise ValueError(f"unknown dataset '{spec}': use a built-in name ({', '.join(CORPORA)}) or PATH:TASK "
                         f"with a task among {', '.join(TASKS)}")
    ds.examples = [ex for ex in ds.examples if ex.get("split", "calibration") == split]
    if not ds.examples:
        raise ValueError(f"dataset '{ds.name}' has no {split} examples")
    return ds


def sample_examples(examples: list[dict], n: int) -> list[dict]:
    """n examples spread over the whole set (ordered by a hash of their id): deterministic, and not
    just the first entries of a file sorted by topic or alphabet."""
    return sorted(examples, key=lambda ex: hashlib.sha256(str(ex["id"]).encode()).hexdigest())[:n]


def format_prompt(example: dict, chat_template: bool, apply_chat) -> tuple[str, bool]:
    """The prompt text for an example and whether it contains special (chat) tokens.
    `apply_chat(messages)` formats a list of messages with the model's chat template."""
    task = get_task(example["task"])
    text = example["prompt"] if "prompt" in example else task.template.format(**example)
    if task.chat and chat_template:
        return apply_chat([("user", text)]), True
    return text, False
