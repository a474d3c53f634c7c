#!/usr/bin/env python3
"""Render the result tables of the docs from the result files under docs/results/.

A table lives between two marker comments in README.md, docs/benchmarks.md or docs/accuracy.md:

    <!-- results:KIND FILE -->
    ...generated table and provenance line...
    <!-- /results -->

KIND names the table (one function per kind, TABLES below) and FILE a JSON file under docs/results/:
`selectinfer bench ... --json FILE` for the bench kind, `selectinfer eval`'s results.json for the
eval kinds. Every result file must carry a top-level "provenance" (cpu, cpu_features, threads,
commit, version, command, date); each table is followed by one line that names them.

    python scripts/render_docs.py           # rewrite the tables in place
    python scripts/render_docs.py --check   # exit 1, naming file and marker, where the docs differ

Standard library only.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = ("README.md", "docs/benchmarks.md", "docs/accuracy.md")
RESULTS = "docs/results"
MIB = 1 << 20
PROVENANCE_KEYS = ("cpu", "cpu_features", "threads", "commit", "version", "command", "date")

MARKER = re.compile(r"<!-- results:(?P<kind>[\w-]+) (?P<file>[\w.-]+\.json) -->\n(?P<body>.*?)<!-- /results -->",
                    re.DOTALL)
OPENING = re.compile(r"<!-- results:[^\n]*-->")


class RenderError(Exception):
    """A table that cannot be rendered: unknown kind, missing or malformed result file."""


# --- cells ----------------------------------------------------------------------------------------
def _mib(n) -> str:
    return "-" if n is None else f"{n / MIB:.1f}"


def _rate(x) -> str:
    return "-" if not x else f"{x:.1f}"


def _ratio(x) -> str:
    return "-" if x is None else f"{x:.2f}x"


def _share(x) -> str:
    return "-" if x is None else f"{100 * x:.0f}%"


def _estimate(e) -> str:
    """A metric with its bootstrap 95% interval: value [low, high], three significant digits."""
    if not e:
        return "-"
    return f"{e['value']:.3g} [{e['low']:.3g}, {e['high']:.3g}]"


def provenance_line(data: dict, name: str) -> str:
    """One line: CPU, its features, threads, commit, version, date and the exact command."""
    p = data.get("provenance")
    if not isinstance(p, dict):
        raise RenderError(f"{name}: no \"provenance\" key (cpu, cpu_features, threads, commit, version, command, "
                          f"date); measure again with a selectinfer that writes it (scripts/measure_docs.sh)")
    missing = [k for k in PROVENANCE_KEYS if k not in p]
    if missing:
        raise RenderError(f"{name}: provenance lacks {', '.join(missing)}")
    features = p["cpu_features"]
    features = " ".join(features) if isinstance(features, list) else str(features)
    threads = "default threads" if p["threads"] is None else f"{p['threads']} threads"
    commit = "commit not recorded" if p["commit"] is None else f"commit {p['commit']}"
    return (f"Measured on {p['cpu'] or 'an unnamed CPU'} ({features}), {threads}, {commit}, selectinfer "
            f"{p['version']}, {p['date']}: `{p['command']}`")


def _table(header: list[str], align: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(align) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def _configurations(data: dict, name: str) -> list[dict]:
    rows = data.get("configurations")
    if not rows:
        raise RenderError(f"{name}: no \"configurations\" (not a results.json of `selectinfer eval`)")
    return rows


# --- one function per table kind ------------------------------------------------------------------
def render_bench(data: dict, name: str = "bench") -> str:
    """`selectinfer bench --json`: one row per configuration, ratios against the first."""
    results = data.get("results")
    if not results:
        raise RenderError(f"{name}: no \"results\" (not the JSON of `selectinfer bench --json`)")
    rows = [[r["label"], _mib(r["model_bytes"]), _mib(r["read_bytes_per_token"]), _rate(r["prefill_tokens_per_s"]),
             _rate(r["decode_tokens_per_s"]), _ratio(r["prefill_vs_first"]), _ratio(r["decode_vs_first"]),
             _ratio(r["bytes_read_ideal"]), _share(r["share_of_ideal"])] for r in results]
    return _table(["model", "weights MiB", "read/token MiB", "prefill tok/s", "decode tok/s", "prefill vs first",
                   "decode vs first", "bytes-read ideal", "of ideal"], ["---"] + ["---:"] * 8, rows)


def _decode_vs(row: dict, base: dict):
    if row.get("decode_tokens_per_s") and base.get("decode_tokens_per_s"):
        return row["decode_tokens_per_s"] / base["decode_tokens_per_s"]
    return None


def render_eval_summary(data: dict, name: str = "eval") -> str:
    """`selectinfer eval`: memory, speed and quality of each configuration in one table."""
    rows = _configurations(data, name)
    base = rows[0]
    out = []
    for r in rows:
        acc = r.get("accuracy", {}) if "error" not in r else {}
        speed = _rate(r.get("decode_tokens_per_s"))
        vs = _decode_vs(r, base)
        out.append([r["label"], _mib(r.get("model_bytes")), _mib(r.get("peak_rss_bytes")),
                    speed if vs is None else f"{speed} ({vs:.2f}x)",
                    _estimate(acc.get("text.perplexity")) if "error" not in r else "failed",
                    _estimate(acc.get("qa.contains")) if "error" not in r else "failed"])
    return _table(["configuration", "file MiB", "peak RSS MiB", "decode tok/s (vs original)",
                   "text perplexity [95%]", "QA answer contained [95%]"], ["---"] + ["---:"] * 5, out)


def render_eval_speed(data: dict, name: str = "eval") -> str:
    """`selectinfer eval`: memory and speed of each configuration, against the bytes-read ideal."""
    rows = _configurations(data, name)
    base = rows[0]
    out = []
    for r in rows:
        ideal = base["read_bytes_per_token"] / r["read_bytes_per_token"]
        vs = _decode_vs(r, base)
        out.append([r["label"], r.get("weight_type") or "-", _mib(r.get("model_bytes")), _mib(r.get("peak_rss_bytes")),
                    _mib(r["read_bytes_per_token"]), _ratio(ideal), _rate(r.get("prefill_tokens_per_s")),
                    _rate(r.get("decode_tokens_per_s")), _ratio(vs), _share(None if vs is None else vs / ideal)])
    return _table(["configuration", "weights", "file MiB", "peak RSS MiB", "read/token MiB", "bytes-read ideal",
                   "prefill tok/s", "decode tok/s", "decode vs original", "of ideal"],
                  ["---", "---"] + ["---:"] * 8, out)


def _metric_keys(rows: list[dict]) -> list[str]:
    keys: list[str] = []
    for r in rows:
        keys += [k for k in r.get("accuracy", {}) if k not in keys]
    return keys


def render_eval_accuracy(data: dict, name: str = "eval") -> str:
    """`selectinfer eval`: every task metric of each configuration with its 95% interval."""
    rows = _configurations(data, name)
    keys = _metric_keys(rows)
    if not keys:
        raise RenderError(f"{name}: no task metrics (a --speed-only run)")
    out = [[r["label"]] + (["failed"] * len(keys) if "error" in r else
                           [_estimate(r.get("accuracy", {}).get(k)) for k in keys]) for r in rows]
    return _table(["configuration"] + keys, ["---"] + ["---:"] * len(keys), out)


def render_eval_paired(data: dict, name: str = "eval") -> str:
    """`selectinfer eval`: each metric's paired difference against the original (same examples)."""
    rows = _configurations(data, name)
    keys = _metric_keys(rows)
    if not keys:
        raise RenderError(f"{name}: no task metrics (a --speed-only run)")
    out = [[r["label"]] + (["failed"] * len(keys) if "error" in r else
                           [_estimate(r.get("vs_original", {}).get(k)) for k in keys]) for r in rows[1:]]
    return _table(["configuration"] + keys, ["---"] + ["---:"] * len(keys), out)


TABLES = {"bench": render_bench, "eval-summary": render_eval_summary, "eval-speed": render_eval_speed,
          "eval-accuracy": render_eval_accuracy, "eval-paired": render_eval_paired}


# --- documents ------------------------------------------------------------------------------------
def render_block(kind: str, data: dict, name: str) -> str:
    """The text between the markers: the table, then the provenance line."""
    if kind not in TABLES:
        raise RenderError(f"unknown table kind {kind!r} (known: {', '.join(TABLES)})")
    return f"\n{TABLES[kind](data, name)}\n\n{provenance_line(data, name)}\n\n"


def load_result(results_dir: Path, file: str) -> dict:
    path = results_dir / file
    shown = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
    if not path.is_file():
        raise RenderError(f"result file {shown} is missing (scripts/measure_docs.sh writes it)")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise RenderError(f"{shown}: not JSON ({e})") from None


def render_text(text: str, results_dir: Path) -> tuple[str, list[tuple[str, str]]]:
    """The document with every marked table rendered, and (marker, problem) for those that could not be."""
    problems: list[tuple[str, str]] = []
    closed = {m.start() for m in MARKER.finditer(text)}
    for m in OPENING.finditer(text):
        if m.start() not in closed:
            problems.append((m.group(0), "malformed marker (want `<!-- results:KIND FILE.json -->` ... "
                                         "`<!-- /results -->`)"))

    def replace(m: re.Match) -> str:
        marker = f"results:{m['kind']} {m['file']}"
        try:
            body = render_block(m["kind"], load_result(results_dir, m["file"]), m["file"])
        except (RenderError, KeyError, TypeError, ZeroDivisionError) as e:
            problems.append((marker, str(e) if isinstance(e, RenderError) else f"{m['file']}: malformed ({e!r})"))
            return m.group(0)
        return f"<!-- {marker} -->\n{body}<!-- /results -->"

    return MARKER.sub(replace, text), problems


def _rendered(root: Path):
    """Each doc: (path, its text, the text rendered from the result files, problems as lines naming
    the doc and the marker); a missing doc as (path, None, None, [problem])."""
    for doc in DOCS:
        path = root / doc
        if not path.is_file():
            yield path, None, None, [f"{doc}: missing"]
            continue
        text = path.read_text()
        new, problems = render_text(text, root / RESULTS)
        yield path, text, new, [f"{doc}: <!-- {marker} -->: {why}" for marker, why in problems]


def check(root: Path = ROOT) -> list[str]:
    """Problems, one line each naming the file and the marker: tables that differ from what the result
    files render, and tables that cannot be rendered. Empty when the docs are up to date."""
    out = []
    for path, text, new, problems in _rendered(root):
        out += problems
        if text is None:
            continue
        doc = path.relative_to(root).as_posix()
        new_blocks = {f"{m['kind']} {m['file']}": m.group(0) for m in MARKER.finditer(new)}
        for m in MARKER.finditer(text):
            key = f"{m['kind']} {m['file']}"
            if new_blocks.get(key) != m.group(0):
                out.append(f"{doc}: <!-- results:{key} -->: the table differs from what {RESULTS}/"
                           f"{m['file']} renders (run scripts/render_docs.py)")
    return out


def write(root: Path = ROOT) -> list[str]:
    """Render every table in place; the problems of those that could not be rendered."""
    out = []
    for path, text, new, problems in _rendered(root):
        out += problems
        if text is not None and new != text:
            path.write_text(new)
            print(f"rendered {path.relative_to(root).as_posix()}")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="change nothing; exit 1 where the docs differ")
    ap.add_argument("--root", type=Path, default=ROOT, help="repository root (default: this script's)")
    args = ap.parse_args(argv)
    problems = check(args.root) if args.check else write(args.root)
    for p in problems:
        print(p, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
