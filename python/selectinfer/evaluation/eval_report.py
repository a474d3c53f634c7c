"""The evaluation's report: results.json (everything), results.md (tables) and PNG plots of each
metric against the weight bytes read per decoded token and against peak memory."""
from __future__ import annotations

import json
from pathlib import Path

MIB = 1 << 20
FAMILY_STYLE = {"original": ("k", "*"), "quantized": ("tab:blue", "s"), "selectinfer": ("tab:green", "o"),
                "coreinfer": ("tab:red", "^"), "random": ("tab:gray", "x")}
# SelectInfer points by selection rule (SELECTION_RULES), where a run has several
RULE_STYLE = {"value": ("tab:green", "o"), "magnitude": ("tab:olive", "D"), "sum-magnitude": ("tab:cyan", "P"),
              "fixed": ("tab:brown", "v"), "gate-guided": ("tab:purple", "h"), "predicted": ("tab:pink", "p"),
              "gate-guided uncompensated": ("tab:purple", "1"), "predicted uncompensated": ("tab:pink", "2")}


def _groups(rows: list[dict]):
    """(label, colour, marker, rows) per family, SelectInfer split by selection rule when there are several."""
    for family, (color, marker) in FAMILY_STYLE.items():
        fam = [r for r in rows if r["family"] == family]
        rules = sorted({r.get("select_by") for r in fam if r.get("select_by")})
        if family != "selectinfer" or len(rules) < 2:
            if fam:
                yield family, color, marker, fam
            continue
        loaded = [r for r in fam if not r.get("select_by")]
        if loaded:
            yield f"{family} loaded-only", color, "s", loaded
        for rule in rules:
            rule_color, rule_marker = RULE_STYLE.get(rule, (color, marker))
            yield f"{family} {rule}", rule_color, rule_marker, [r for r in fam if r.get("select_by") == rule]


def _mib(n) -> str:
    return "-" if n is None else f"{n / MIB:.1f}"


def _estimate(e: dict | None, digits: int = 3) -> str:
    if not e:
        return "-"
    return f"{e['value']:.{digits}g} [{e['low']:.{digits}g}, {e['high']:.{digits}g}]"


def _rate(x) -> str:
    return "-" if not x else f"{x:.1f}"


def markdown(report: dict) -> str:
    meta, rows = report["meta"], report["configurations"]
    base = rows[0]
    lines = [f"# selectinfer eval: {meta['source']}", "",
             f"CPU: {meta['cpu']}; threads {meta['threads']}; command: `{meta['command']}`", ""]
    if meta.get("tasks"):
        lines += [f"Tasks (eval splits, n examples each): {', '.join(meta['tasks'])}; n = {meta['n']}; "
                  f"bootstrap 95% intervals over {meta['n_bootstrap']} resamples of the examples.", ""]
    else:
        lines += ["Speed and memory only: no task was run (random weights say nothing about accuracy).", ""]
    speed, limit = meta["speed"], meta.get("memory_limit_bytes")
    if speed["mode"] != "none":
        how = ("every configuration loaded side by side, interleaved rounds" if speed["mode"] == "interleaved"
               else "each configuration in its own process")
        rounds = f"medians of {speed['rounds']} rounds" if speed["rounds"] > 1 else "one round"
        lines += [f"Speed: {speed['n_prompt']}-token prompt, {speed['n_gen']} decoded tokens, {rounds}, {how}.", ""]
    if not meta.get("repack", True):
        lines += ["Weight repacking off in every configuration (every weight stays in the mapped file).", ""]
    if limit:
        lines += [f"Every configuration ran under a memory limit of {limit / MIB:.0f} MiB (a cgroup around its "
                  "process, its file evicted from the page cache first): one larger than the limit runs from "
                  "disk (mmap offloading). cgroup peak: the group's peak, page cache included.", ""]
    lines += ["## Memory and speed", "",
              "| configuration | family | weights | model MiB | peak RSS MiB | "
              + ("cgroup peak MiB | " if limit else "") + "read/token MiB | bytes ideal | "
              "prefill tok/s | decode tok/s | decode vs original | of ideal |",
              "|---|---|---|---:|---:|" + ("---:|" if limit else "") + "---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        ideal = base["read_bytes_per_token"] / r["read_bytes_per_token"]
        speedup = (r["decode_tokens_per_s"] / base["decode_tokens_per_s"]
                   if r.get("decode_tokens_per_s") and base.get("decode_tokens_per_s") else None)
        lines.append(f"| {r['label']} | {r['family']} | {r['weight_type']} | {_mib(r['model_bytes'])} | "
                     f"{_mib(r.get('peak_rss_bytes'))} | "
                     + (f"{_mib(r.get('cgroup_peak_bytes'))} | " if limit else "")
                     + f"{_mib(r['read_bytes_per_token'])} | {ideal:.2f}x | "
                     f"{_rate(r.get('prefill_tokens_per_s'))} | {_rate(r.get('decode_tokens_per_s'))} | "
                     + ("-" if speedup is None else f"{speedup:.2f}x") + " | "
                     + ("-" if speedup is None else f"{100 * speedup / ideal:.0f}%") + " |")
    for r in (r for r in rows if r["family"] == "prepared"):
        budget, peak, group = r["memory_limit_bytes"], r.get("peak_rss_bytes"), r.get("cgroup_peak_bytes")
        faults = r.get("major_faults_timed")
        fits = (peak is not None and (1 - 0.02) * budget <= peak <= budget and (group or 0) <= budget and faults == 0
                and "error" not in r)
        lines += ["", f"**{r['label']}** (`selectinfer prepare --memory-budget`), run under a memory limit equal to "
                  f"its budget of {budget / MIB:.1f} MiB with the workload its peak was fitted to (a one-batch "
                  f"prompt, 16 decoded tokens): cgroup peak {_mib(group)} MiB, peak RSS {_mib(peak)} MiB"
                  + (f" ({100 * abs(1 - peak / budget):.1f}% {'below' if peak <= budget else 'above'} the budget)"
                     if peak else "")
                  + f", pages read again from disk while timed: {'-' if faults is None else faults}. "
                  + ("Fits: within 2% below the budget, no paging." if fits else
                     "Does not meet the budget check (within 2% below it, no paging)" +
                     (f": {r['error']}" if "error" in r else ".")), ""]
    keys = [k for k in base.get("accuracy", {})]
    if keys:
        lines += ["", "## Accuracy (value [95% interval])", "",
                  "| configuration | " + " | ".join(keys) + " |", "|---|" + "---:|" * len(keys)]
        for r in rows:
            cells = [_estimate(r.get("accuracy", {}).get(k)) if "error" not in r else "failed" for k in keys]
            lines.append(f"| {r['label']} | " + " | ".join(cells) + " |")
        lines += ["", "## Paired difference against the original (same examples; value [95% interval])", "",
                  "| configuration | " + " | ".join(keys) + " |", "|---|" + "---:|" * len(keys)]
        for r in rows[1:]:
            cells = [_estimate(r.get("vs_original", {}).get(k)) for k in keys]
            lines.append(f"| {r['label']} | " + " | ".join(cells) + " |")
    errors = [r for r in rows if "error" in r]
    if errors:
        lines += ["", "## Failed configurations", ""] + [f"- {r['label']}: {r['error']}" for r in errors]
    return "\n".join(lines) + "\n"


def lower_is_better(metric: str) -> bool:
    return metric.endswith("perplexity")


def frontier(points: list[tuple[float, float]], x_lower_better: bool, y_lower_better: bool) -> list[int]:
    """Indices of the non-dominated points (no other point is at least as good on both axes and
    better on one), in order of x."""
    def better_eq(a, b, lower):
        return a <= b if lower else a >= b

    def strictly(a, b, lower):
        return a < b if lower else a > b

    keep = []
    for i, (x, y) in enumerate(points):
        dominated = any(better_eq(x2, x, x_lower_better) and better_eq(y2, y, y_lower_better)
                        and (strictly(x2, x, x_lower_better) or strictly(y2, y, y_lower_better))
                        for j, (x2, y2) in enumerate(points) if j != i)
        if not dominated:
            keep.append(i)
    return sorted(keep, key=lambda i: points[i][0])


def plot(report: dict, out_dir: Path) -> list[Path]:
    """Per metric: against peak memory, against decode speed (the non-dominated configurations
    joined: the frontier) and against weight bytes read per token; and decode speed against bytes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in report["configurations"] if "error" not in r]
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []

    def scatter(name: str, ylabel: str, x, xlabel: str, value, err=None, x_lower_better=True,
                y_lower_better=False) -> None:
        pts = [r for r in rows if x(r) and value(r) is not None]
        if not pts:
            return
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for label, color, marker, fam in _groups(pts):
            yerr = None
            if err is not None:
                yerr = [[value(r) - err(r)[0] for r in fam], [err(r)[1] - value(r) for r in fam]]
            ax.errorbar([x(r) for r in fam], [value(r) for r in fam], yerr=yerr, fmt=marker, color=color,
                        label=label, capsize=3)
        best = frontier([(x(r), value(r)) for r in pts], x_lower_better, y_lower_better)
        ax.plot([x(pts[i]) for i in best], [value(pts[i]) for i in best], "--", color="tab:orange", lw=1,
                label="frontier (not dominated)")
        if ylabel.endswith("perplexity"):
            ax.set_yscale("log")  # a random choice's perplexity is several times the others'
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel + (" (lower is better)" if y_lower_better else ""))
        ax.set_title(f"{report['meta']['source']}: {ylabel}", fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        path = out_dir / f"{name}.png"
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)

    memory = lambda r: (r.get("peak_rss_bytes") or 0) / MIB  # noqa: E731
    read = lambda r: r["read_bytes_per_token"] / MIB  # noqa: E731
    decode = lambda r: r.get("decode_tokens_per_s")  # noqa: E731
    for key in report["configurations"][0].get("accuracy", {}):
        value = lambda r, k=key: r.get("accuracy", {}).get(k, {}).get("value")  # noqa: E731
        err = lambda r, k=key: (r["accuracy"][k]["low"], r["accuracy"][k]["high"])  # noqa: E731
        low = lower_is_better(key)
        scatter(f"{key}_vs_peak_rss", key, memory, "peak RSS MiB", value, err, True, low)
        scatter(f"{key}_vs_decode_speed", key, decode, "decode tokens/s", value, err, False, low)
        scatter(f"{key}_vs_bytes_read", key, read, "weight MiB read per decoded token", value, err, True, low)
    scatter("decode_speed_vs_bytes_read", "decode tokens/s", read, "weight MiB read per decoded token", decode,
            x_lower_better=True, y_lower_better=False)
    return written


# what runs must share to be one report: their rows are then comparable, the paired differences
# made against the same original on the same examples
_SHARED_META = ("source", "tasks", "n", "n_bootstrap", "speed", "memory_limit_bytes", "repack")


def merge_reports(reports: list[dict]) -> dict:
    """One report of several eval runs of the same source model (e.g. grids of different delta or
    predictor rank): every configuration once, by label, in the order the runs give them; the
    runs' commands and profiles kept. Raises ValueError when the runs are not comparable."""
    if not reports:
        raise ValueError("no report to merge")
    for r in reports:
        if not (isinstance(r, dict) and isinstance(r.get("meta"), dict) and isinstance(r.get("configurations"), list)
                and all(isinstance(c, dict) and "label" in c for c in r["configurations"])):
            raise ValueError("not a results.json of `selectinfer eval` (meta and configurations)")
    first = reports[0]["meta"]
    for r in reports[1:]:
        for key in _SHARED_META:
            if r["meta"].get(key) != first.get(key):
                raise ValueError(f"the runs differ in {key} ({first.get(key)!r} and {r['meta'].get(key)!r}): "
                                 "merge runs of the same model, tasks, examples and speed settings")
    rows, seen = [], set()
    for r in reports:
        for row in r["configurations"]:
            if row["label"] not in seen:
                seen.add(row["label"])
                rows.append(row)
    meta = dict(first)
    meta["command"] = " ; ".join(r["meta"]["command"] for r in reports)
    meta["runs"] = [{"command": r["meta"]["command"], "profile": r["meta"].get("profile"),
                     "provenance": r.get("provenance")} for r in reports]
    return {"meta": meta, "configurations": rows}


def write_report(report: dict, out_dir: Path) -> list[Path]:
    from ..runtime.paths import atomic_path

    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / "results.json", out_dir / "results.md"]
    with atomic_path(paths[0]) as tmp:
        Path(tmp).write_text(json.dumps(report, indent=1))
    with atomic_path(paths[1]) as tmp:
        Path(tmp).write_text(markdown(report))
    return paths + plot(report, out_dir / "plots")
