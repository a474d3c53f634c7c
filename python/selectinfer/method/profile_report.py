"""Plots of a profile: per-layer score distributions and the task/model-wide overlap of top
neurons (the "dual structure" selective loading rests on)."""
from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np

from .profiles import Profile, jaccard, top_set

TOP_FRACTION = 0.3


def overlap_table(profile: Profile, fraction: float = TOP_FRACTION) -> dict[str, np.ndarray]:
    """Per layer Jaccard overlap of the top `fraction` neurons: each pair of tasks, and each task
    against the model-wide ranking. Keys: "qa~text", "qa~model-wide", ..."""
    tops = {t: top_set(profile.task_scores(t), fraction) for t in profile.tasks()}
    model_top = top_set(profile.model_scores(), fraction)
    table = {}
    for a, b in itertools.combinations(profile.tasks(), 2):
        table[f"{a}~{b}"] = np.array([jaccard(x, y) for x, y in zip(tops[a], tops[b])])
    for t in profile.tasks():
        table[f"{t}~model-wide"] = np.array([jaccard(x, y) for x, y in zip(tops[t], model_top)])
    return table


def write_report(profile: Profile, out_dir: str | Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    title = f"{profile.model.file}: {len(profile.datasets)} datasets, tasks {', '.join(profile.tasks())}"

    # 1. distribution of model-wide scores per layer (log scale): quantile bands
    scores = profile.model_scores()
    layers = np.arange(profile.model.n_layer)
    fig, ax = plt.subplots(figsize=(10, 5))
    qs = np.quantile(scores, [0.05, 0.25, 0.5, 0.75, 0.95], axis=1)
    ax.fill_between(layers, qs[0], qs[4], alpha=0.2, label="5-95%")
    ax.fill_between(layers, qs[1], qs[3], alpha=0.4, label="25-75%")
    ax.plot(layers, qs[2], label="median")
    ax.plot(layers, scores.max(axis=1), ":", label="max")
    ax.set_yscale("log")
    ax.set_xlabel("layer")
    ax.set_ylabel("mean |a| per neuron (model-wide)")
    ax.set_title(f"Neuron score distribution per layer\n{title}", fontsize=9)
    ax.legend()
    fig.tight_layout()
    written.append(out_dir / "score_distribution.png")
    fig.savefig(written[-1], dpi=110)
    plt.close(fig)

    # 2. sorted score curves of a few layers: how concentrated the mass is
    fig, ax = plt.subplots(figsize=(10, 5))
    for il in sorted({0, profile.model.n_layer // 4, profile.model.n_layer // 2, 3 * profile.model.n_layer // 4,
                      profile.model.n_layer - 1}):
        s = np.sort(scores[il])[::-1]
        ax.plot(np.arange(len(s)) / len(s), np.cumsum(s) / s.sum(), label=f"layer {il}")
    ax.axvline(TOP_FRACTION, color="gray", ls="--", lw=0.8)
    ax.set_xlabel("fraction of neurons (highest score first)")
    ax.set_ylabel("fraction of total mean |a|")
    ax.set_title(f"Concentration of activation mass\n{title}", fontsize=9)
    ax.legend()
    fig.tight_layout()
    written.append(out_dir / "score_concentration.png")
    fig.savefig(written[-1], dpi=110)
    plt.close(fig)

    # 3. overlap of top-30% sets: task pairs (dashed) and task vs model-wide (solid)
    fig, ax = plt.subplots(figsize=(10, 5))
    for name, values in overlap_table(profile).items():
        ax.plot(layers, values, "-" if name.endswith("model-wide") else "--", label=name)
    ax.set_ylim(0, 1)
    ax.set_xlabel("layer")
    ax.set_ylabel(f"Jaccard overlap of top {int(TOP_FRACTION * 100)}% neurons")
    ax.set_title(f"Task-specific vs model-wide neurons\n{title}", fontsize=9)
    ax.legend(fontsize=8, ncol=2)
    fig.tight_layout()
    written.append(out_dir / "task_overlap.png")
    fig.savefig(written[-1], dpi=110)
    plt.close(fig)
    return written
