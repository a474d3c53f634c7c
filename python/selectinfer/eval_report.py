"""The evaluation's report: results.json (everything), results.md (tables) and PNG plots of each
metric against the weight bytes read per decoded token and against peak memory."""
from __future__ import annotations

import json
from pathlib import Path

MIB = 1 << 20
FAMILY_STYLE = {"original": ("k", "*"), "quantized": ("tab:blue", "s"), "selectinfer": ("tab:green", "o"),
                "coreinfer": ("tab:red", "^"), "random": ("tab:gray", "x")}


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
        lines += [f"Speed: {speed['n_prompt']}-token prompt, {speed['n_gen']} decoded tokens, medians of "
                  f"{speed['rounds']} rounds, {how}.", ""]
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


def plot(report: dict, out_dir: Path) -> list[Path]:
    """One PNG per metric against bytes read per token and against peak RSS, and decode speed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in report["configurations"] if "error" not in r]
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []

    def scatter(name: str, ylabel: str, xkey: str, xlabel: str, value, err=None) -> None:
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for family, (color, marker) in FAMILY_STYLE.items():
            pts = [r for r in rows if r["family"] == family and r.get(xkey) and value(r) is not None]
            if not pts:
                continue
            xs = [r[xkey] / MIB for r in pts]
            ys = [value(r) for r in pts]
            yerr = None
            if err is not None:
                yerr = [[value(r) - err(r)[0] for r in pts], [err(r)[1] - value(r) for r in pts]]
            ax.errorbar(xs, ys, yerr=yerr, fmt=marker, color=color, label=family, capsize=3)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.set_title(f"{report['meta']['source']}: {ylabel}", fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        path = out_dir / f"{name}.png"
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)

    keys = list(report["configurations"][0].get("accuracy", {}))
    for key in keys:
        value = lambda r, k=key: r.get("accuracy", {}).get(k, {}).get("value")  # noqa: E731
        err = lambda r, k=key: (r["accuracy"][k]["low"], r["accuracy"][k]["high"])  # noqa: E731
        scatter(f"{key}_vs_bytes_read", key, "read_bytes_per_token", "weight MiB read per decoded token", value, err)
        scatter(f"{key}_vs_peak_rss", key, "peak_rss_bytes", "peak RSS MiB", value, err)
    if any(r.get("decode_tokens_per_s") for r in rows):
        scatter("decode_speed_vs_bytes_read", "decode tokens/s", "read_bytes_per_token",
                "weight MiB read per decoded token", lambda r: r.get("decode_tokens_per_s"))
    return written


def write_report(report: dict, out_dir: Path) -> list[Path]:
    from .paths import atomic_path

    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / "results.json", out_dir / "results.md"]
    with atomic_path(paths[0]) as tmp:
        Path(tmp).write_text(json.dumps(report, indent=1))
    with atomic_path(paths[1]) as tmp:
        Path(tmp).write_text(markdown(report))
    return paths + plot(report, out_dir / "plots")
