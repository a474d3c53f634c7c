"""Built-in data sets, built from package-registry sources and cached as JSONL.

Every example carries a `split` ("calibration" or "eval") decided by a hash of a *split key*:
examples derived from the same source unit (a passage of a book, a dictionary entry, a
country) share the key, so no evaluation text is ever seen during calibration, even across
corpora built from the same book. Nothing here reaches a model hub.
"""
from __future__ import annotations

import gzip
import hashlib
import json
import re
import tarfile
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from ..runtime.fetch import FetchError, apt_download, deb_extract, pip_download
from ..runtime.paths import atomic_path, cache_dir

EVAL_FRACTION_PERCENT = 20
FORMAT_VERSION = 1  # bump to rebuild every cached corpus


def split_of(split_key: str) -> str:
    """Deterministic, order-independent split: about 20% of keys are held out for evaluation."""
    bucket = int(hashlib.sha256(split_key.encode()).hexdigest()[:8], 16) % 100
    return "eval" if bucket < EVAL_FRACTION_PERCENT else "calibration"


def _example(corpus: str, task: str, uid: str, split_key: str, **fields) -> dict:
    return {"id": f"{corpus}:{uid}", "task": task, "split": split_of(split_key), **fields}


# --- sources ----------------------------------------------------------------------------------

def _botchan_text(workdir: Path) -> str:
    """Botchan (Project Gutenberg #8868, public domain) from the sentencepiece 0.2.3 sdist."""
    sdist = pip_download("sentencepiece", "0.2.3", workdir, sdist=True)
    with tarfile.open(sdist) as tar:
        raw = tar.extractfile("sentencepiece-0.2.3/test/botchan.txt").read().decode("utf-8-sig")
    start = raw.index("*** START OF THIS PROJECT GUTENBERG EBOOK")
    end = raw.index("*** END OF THIS PROJECT GUTENBERG EBOOK")
    body = raw[raw.index("\n", start) + 1: end]
    story = body.find("CHAPTER I")  # skip the title page and the translator's note
    body = body[story if story >= 0 else 0:]
    for tail in ("--(THE END)--", "End of Project Gutenberg"):  # and the transcriber's notes after it
        if tail in body:
            body = body[: body.index(tail)]
    return " ".join(body.split())


def _sentences(text: str) -> list[str]:
    return [s for s in re.split(r'(?:(?<=[.!?])|(?<=[.!?]["\']))\s+(?=["\'A-Z])', text) if s]


def _passages(text: str, min_words: int) -> list[str]:
    """Consecutive sentences grouped into passages of at least min_words words."""
    passages, current, words = [], [], 0
    for sentence in _sentences(text):
        current.append(sentence)
        words += len(sentence.split())
        if words >= min_words:
            passages.append(" ".join(current))
            current, words = [], 0
    return passages


def build_botchan_text(workdir: Path) -> Iterator[dict]:
    for i, passage in enumerate(_passages(_botchan_text(workdir), 100)):
        yield _example("botchan", "text", f"p{i}", f"botchan:block{i // 2}", text=passage)


def build_botchan_summarization(workdir: Path) -> Iterator[dict]:
    # a summarization source is the two text passages of one block: it shares their split
    passages = _passages(_botchan_text(workdir), 100)
    for b in range(len(passages) // 2):
        yield _example("botchan-summ", "summarization", f"b{b}", f"botchan:block{b}",
                       text=passages[2 * b] + " " + passages[2 * b + 1])


_ANNOTATION = re.compile(r"[{\[(<]")


def _sentence_pair(de: str, en: str) -> tuple[str, str] | None:
    """A full example-sentence pair from one Ding alternative, or None."""
    de, en = de.strip(), en.strip()
    if _ANNOTATION.search(de) or _ANNOTATION.search(en) or ";" in de or ";" in en:
        return None
    for s in (de, en):
        if not (s[:1].isupper() and s[-1:] in ".?!" and 5 <= len(s.split()) <= 30):
            return None
    return de, en


def build_de_en(workdir: Path) -> Iterator[dict]:
    """German->English example sentences from Debian's trans-de-en (the Ding dictionary, GPL-2+)."""
    root = deb_extract(apt_download("trans-de-en", workdir), workdir / "deb")
    path = root / "usr/share/trans/de-en"
    seen = set()
    with open(path, encoding="utf-8") as f:
        for line_no, line in enumerate(f, 1):
            if line.startswith("#") or " :: " not in line:
                continue
            de_side, en_side = line.rstrip("\n").split(" :: ", 1)
            for de, en in zip(de_side.split(" | "), en_side.split(" | ")):
                pair = _sentence_pair(de, en)
                if pair and pair[0] not in seen:
                    seen.add(pair[0])
                    # the dictionary entry is the split unit: its other sentences go the same way
                    yield _example("de-en", "translation", f"l{line_no}:{len(seen)}", f"de-en:l{line_no}",
                                   source=pair[0], reference=pair[1])


def build_capitals_qa(workdir: Path) -> Iterator[dict]:
    """Closed-book QA: the capital of every country in the PyPI package countryinfo 1.0.1 (MIT)."""
    wheel = pip_download("countryinfo", "1.0.1", workdir)
    with zipfile.ZipFile(wheel) as zf:
        names = sorted(n for n in zf.namelist() if n.startswith("countryinfo/data/") and n.endswith(".json"))
        for name in names:
            info = json.loads(zf.read(name))
            country, capital = info.get("name"), info.get("capital")
            if not country or not capital or not isinstance(capital, str):
                continue
            # accepted answers: the capital, and its name without a parenthesised part
            answers = sorted({capital, re.sub(r"\s*\(.*?\)", "", capital).strip()} - {""})
            uid = Path(name).stem
            yield _example("capitals-qa", "qa", uid, f"country:{uid}",
                           question=f"What is the capital of {country}?", answers=answers)


@dataclass(frozen=True)
class Corpus:
    name: str
    task: str
    source: str  # where the data comes from and its licence
    build: Callable[[Path], Iterator[dict]]


CORPORA: dict[str, Corpus] = {c.name: c for c in [
    Corpus("capitals-qa", "qa", "PyPI countryinfo==1.0.1 (MIT): capital of each country", build_capitals_qa),
    Corpus("de-en", "translation",
           "Debian trans-de-en (Ding German-English dictionary, GPL-2+): full example-sentence pairs", build_de_en),
    Corpus("botchan-summ", "summarization",
           "Botchan, Project Gutenberg #8868 (public domain), from the PyPI sentencepiece==0.2.3 sdist: "
           "~200-word passages to summarize", build_botchan_summarization),
    Corpus("botchan", "text",
           "Botchan, Project Gutenberg #8868 (public domain), from the PyPI sentencepiece==0.2.3 sdist: "
           "~100-word passages", build_botchan_text),
]}


def corpus_path(name: str) -> Path:
    return cache_dir() / "data" / f"{name}.v{FORMAT_VERSION}.jsonl.gz"


def load_corpus(name: str, split: str | None = None) -> list[dict]:
    """The examples of a built-in corpus (built and cached on first use), optionally one split."""
    if name not in CORPORA:
        raise ValueError(f"unknown built-in dataset '{name}'; known: {', '.join(CORPORA)}")
    path = corpus_path(name)
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=path.parent) as tmp:
            try:
                examples = list(CORPORA[name].build(Path(tmp)))
            except FetchError as e:
                raise FetchError(f"dataset '{name}': {e}") from None
        if not examples:
            raise RuntimeError(f"dataset '{name}' came out empty; its source package may have changed")
        with atomic_path(path) as out, gzip.open(out, "wt", encoding="utf-8") as f:
            for ex in examples:
                f.write(json.dumps(ex, ensure_ascii=False) + "\n")
    with gzip.open(path, "rt", encoding="utf-8") as f:
        examples = [json.loads(line) for line in f]
    return [ex for ex in examples if split is None or ex["split"] == split]
