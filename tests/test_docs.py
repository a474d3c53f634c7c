"""The docs: generated tables equal what scripts/render_docs.py renders from docs/results/, the
renderer itself, the README's length and wording, and every relative link. Imports nothing from
selectinfer (no compiled package needed)."""
from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _load_renderer():
    spec = importlib.util.spec_from_file_location("render_docs", ROOT / "scripts" / "render_docs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


rd = _load_renderer()

PROVENANCE = {"cpu": "Test CPU 9000", "cpu_features": ["AVX2", "F16C"], "threads": 2, "commit": "abc1234",
              "version": "0.1.0", "command": "selectinfer bench a.gguf b.gguf -t 2 --json out.json",
              "date": "2025-01-02T03:04:05+00:00"}
MIB = 1 << 20


def bench_result(label, decode, prefill, first_decode=100.0, first_prefill=1000.0, read=80 * MIB):
    return {"label": label, "path": f"/x/{label}", "model_bytes": 90 * MIB, "read_bytes_per_token": read,
            "prefill_tokens_per_s": prefill, "decode_tokens_per_s": decode, "prefill_samples": [prefill],
            "decode_samples": [decode], "prefill_vs_first": prefill / first_prefill,
            "decode_vs_first": decode / first_decode, "bytes_read_ideal": 80 * MIB / read,
            "share_of_ideal": (decode / first_decode) / (80 * MIB / read)}


def bench_data():
    return {"n_prompt": 64, "n_gen": 32, "repeats": 3, "threads": 2, "gpu_layers": 0, "devices": [],
            "results": [bench_result("orig.gguf", 100.0, 1000.0), bench_result("si70.gguf (phi 0.4)", 120.0, 1100.0,
                                                                               read=64 * MIB)],
            "provenance": dict(PROVENANCE)}


def estimate(v):
    return {"value": v, "low": v * 0.9, "high": v * 1.1}


def eval_data():
    rows = [{"label": "m (original)", "family": "original", "weight_type": "Q4_1", "model_bytes": 94 * MIB,
             "read_bytes_per_token": 92 * MIB, "peak_rss_bytes": 250 * MIB, "prefill_tokens_per_s": 1000.0,
             "decode_tokens_per_s": 200.0,
             "accuracy": {"text.perplexity": estimate(46.8), "qa.contains": estimate(0.175)}, "vs_original": {}},
            {"label": "m.si70 phi 0.4 value", "family": "selectinfer", "weight_type": "Q4_1",
             "model_bytes": 83 * MIB, "read_bytes_per_token": 70 * MIB, "peak_rss_bytes": 240 * MIB,
             "prefill_tokens_per_s": 1100.0, "decode_tokens_per_s": 220.0,
             "accuracy": {"text.perplexity": estimate(133.0), "qa.contains": estimate(0.05)},
             "vs_original": {"text.perplexity": estimate(86.0), "qa.contains": estimate(-0.125)}},
            {"label": "m.broken", "family": "selectinfer", "weight_type": "Q4_1", "model_bytes": 83 * MIB,
             "read_bytes_per_token": 70 * MIB, "error": "it failed"}]
    return {"meta": {"source": "m.gguf"}, "configurations": rows, "provenance": dict(PROVENANCE)}


# --- (a) the committed docs equal their rendering --------------------------------------------------
def test_committed_docs_match_results():
    problems = rd.check(ROOT)
    assert not problems, "\n".join(problems)


def test_docs_have_markers():
    """Every generated table is marked: the docs carry result tables, not hand-written numbers."""
    for doc in rd.DOCS:
        assert rd.MARKER.search((ROOT / doc).read_text()), f"{doc}: no <!-- results:KIND FILE --> marker"


# --- (b) the renderer ------------------------------------------------------------------------------
def test_bench_table_has_a_row_per_result():
    table = rd.render_bench(bench_data())
    lines = table.splitlines()
    assert lines[0].startswith("| model | weights MiB |")
    assert len(lines) == 2 + 2
    assert lines[2] == "| orig.gguf | 90.0 | 80.0 | 1000.0 | 100.0 | 1.00x | 1.00x | 1.00x | 100% |"
    assert lines[3] == "| si70.gguf (phi 0.4) | 90.0 | 64.0 | 1100.0 | 120.0 | 1.10x | 1.20x | 1.25x | 96% |"


def test_eval_tables():
    data = eval_data()
    summary = rd.render_eval_summary(data).splitlines()
    assert len(summary) == 2 + 3
    assert summary[2] == "| m (original) | 94.0 | 250.0 | 200.0 (1.00x) | 46.8 [42.1, 51.5] | 0.175 [0.158, 0.193] |"
    assert summary[3].startswith("| m.si70 phi 0.4 value | 83.0 | 240.0 | 220.0 (1.10x) | 133 [120, 146] |")
    assert "failed" in summary[4]
    speed = rd.render_eval_speed(data).splitlines()
    assert len(speed) == 2 + 3 and "| 1.31x |" in speed[3] and "| 84% |" in speed[3]
    accuracy = rd.render_eval_accuracy(data).splitlines()
    assert accuracy[0] == "| configuration | text.perplexity | qa.contains |" and len(accuracy) == 2 + 3
    paired = rd.render_eval_paired(data).splitlines()
    assert len(paired) == 2 + 2 and "86 [77.4, 94.6]" in paired[2]


def test_provenance_line():
    line = rd.provenance_line(bench_data(), "bench.json")
    assert line == ("Measured on Test CPU 9000 (AVX2 F16C), 2 threads, commit abc1234, selectinfer 0.1.0, "
                    "2025-01-02T03:04:05+00:00: `selectinfer bench a.gguf b.gguf -t 2 --json out.json`")
    assert "\n" not in line
    data = bench_data()
    data["provenance"].update(cpu_features="AVX2 F16C", threads=None, commit=None)
    line = rd.provenance_line(data, "bench.json")
    assert "(AVX2 F16C), default threads, commit not recorded," in line


def test_missing_provenance_refused():
    data = bench_data()
    del data["provenance"]
    with pytest.raises(rd.RenderError, match="provenance"):
        rd.render_block("bench", data, "bench.json")
    data = bench_data()
    del data["provenance"]["commit"]
    with pytest.raises(rd.RenderError, match="commit"):
        rd.render_block("bench", data, "bench.json")


def test_render_document(tmp_path):
    results = tmp_path / "results"
    results.mkdir()
    (results / "b.json").write_text(json.dumps(bench_data()))
    text = "# Title\n\n<!-- results:bench b.json -->\nstale table\n<!-- /results -->\n\nAfter.\n"
    new, problems = rd.render_text(text, results)
    assert not problems
    assert new.startswith("# Title\n\n<!-- results:bench b.json -->\n\n| model |")
    assert "| si70.gguf (phi 0.4) |" in new and "stale table" not in new
    assert "Measured on Test CPU 9000" in new and new.endswith("<!-- /results -->\n\nAfter.\n")
    again, problems = rd.render_text(new, results)
    assert again == new and not problems  # idempotent


def test_marker_without_results_file_refused(tmp_path):
    text = "<!-- results:bench absent.json -->\n<!-- /results -->\n"
    new, problems = rd.render_text(text, tmp_path)
    assert new == text
    assert len(problems) == 1 and problems[0][0] == "results:bench absent.json" and "missing" in problems[0][1]


def test_unknown_kind_and_malformed_marker_refused(tmp_path):
    (tmp_path / "b.json").write_text(json.dumps(bench_data()))
    _, problems = rd.render_text("<!-- results:nonsense b.json -->\n<!-- /results -->\n", tmp_path)
    assert problems and "unknown table kind" in problems[0][1]
    _, problems = rd.render_text("<!-- results:bench b.json -->\nno closing marker\n", tmp_path)
    assert problems and "malformed marker" in problems[0][1]


def test_check_names_file_and_marker_of_a_hand_edit(tmp_path):
    (tmp_path / "docs" / "results").mkdir(parents=True)
    (tmp_path / "docs" / "results" / "b.json").write_text(json.dumps(bench_data()))
    (tmp_path / "docs" / "results" / "e.json").write_text(json.dumps(eval_data()))
    (tmp_path / "README.md").write_text("<!-- results:eval-summary e.json -->\n<!-- /results -->\n")
    (tmp_path / "docs" / "benchmarks.md").write_text("<!-- results:bench b.json -->\n<!-- /results -->\n")
    (tmp_path / "docs" / "accuracy.md").write_text("<!-- results:eval-accuracy e.json -->\n<!-- /results -->\n")
    problems = rd.check(tmp_path)
    assert len(problems) == 3 and all("differs" in p for p in problems)
    assert rd.main(["--root", str(tmp_path)]) == 0
    assert rd.check(tmp_path) == [] and rd.main(["--check", "--root", str(tmp_path)]) == 0
    bench = tmp_path / "docs" / "benchmarks.md"
    bench.write_text(bench.read_text().replace("120.0", "130.0"))  # a hand-edited number
    problems = rd.check(tmp_path)
    assert problems == ["docs/benchmarks.md: <!-- results:bench b.json -->: the table differs from what "
                        "docs/results/b.json renders (run scripts/render_docs.py)"]
    assert rd.main(["--check", "--root", str(tmp_path)]) == 1


# --- (c) the README: short, for users, about now ---------------------------------------------------
BANNED = ["this machine", "this session", "then faster", "earlier run", "CI took"]


def test_readme_length_and_wording():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 300
    lower = text.lower()
    for phrase in BANNED:
        assert phrase.lower() not in lower, f"README.md says {phrase!r}"
    assert not re.search(r"(?<![\w&/])#\d+\b", text), "README.md names an issue number"
    assert not re.search(r"\bissues? \d+", lower), "README.md names an issue"


# --- (d) every relative link points to a file ------------------------------------------------------
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def _relative_links(path: Path):
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.DOTALL)  # (code blocks hold no links)
    for target in LINK.findall(text):
        if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue  # a URL, mailto:, or an anchor in the same page
        yield target.split("#", 1)[0]


def _markdown_files():
    return [ROOT / "README.md"] + sorted((ROOT / "docs").glob("*.md"))


@pytest.mark.parametrize("doc", _markdown_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_exist(doc):
    missing = [t for t in _relative_links(doc) if not (doc.parent / t).exists()]
    assert not missing, f"{doc.relative_to(ROOT)} links to missing files: {missing}"


def test_readme_links_the_docs():
    links = set(_relative_links(ROOT / "README.md"))
    for doc in ("docs/format.md", "docs/architecture.md", "docs/kernels.md", "docs/benchmarks.md",
                "docs/accuracy.md", "docs/reliability.md", "docs/speed-history.md", "ggml-patches/README.md"):
        assert doc in links, f"README.md does not link {doc}"
