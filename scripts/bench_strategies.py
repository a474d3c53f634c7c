#!/usr/bin/env python3
"""Decode speed of a per-step strategy against the method (frequency) at the same bytes read per
token. For each phi of the method's file, the strategy's phi on its own file is solved so that
both read the same weight bytes per decode step (selectinfer.evaluation.bench.bytes_read_per_token); then
every configuration runs side by side, interleaved (selectinfer.evaluation.bench.run_configs), and the
medians and the ratio of each pair are printed.

    python scripts/bench_strategies.py --method si70.gguf --file si85d20p128.gguf --strategy predicted \\
        --phis 0.4 0.467 -r 21 -t 2
"""
from __future__ import annotations

import argparse
import statistics

from selectinfer.evaluation.bench import BenchConfig, bytes_read_per_token, run_configs


def phi_reading(path: str, strategy: str, target_bytes: int) -> float:
    """The phi (to 3 decimals, reading at most target_bytes) at which `strategy` on `path` reads
    target_bytes per token: bytes grow with phi, so a bisection finds it."""
    lo, hi = 0.0, 1.0
    for _ in range(30):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if bytes_read_per_token(path, mid, strategy) <= target_bytes else (lo, mid)
    phi = round(lo, 3)
    while phi > 0 and bytes_read_per_token(path, phi, strategy) > target_bytes:
        phi = round(phi - 0.001, 3)
    return phi


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--method", required=True, help="SelectInfer GGUF the method (frequency) runs on")
    ap.add_argument("--file", required=True, help="SelectInfer GGUF the strategy runs on")
    ap.add_argument("--strategy", default="predicted", choices=["gate-guided", "predicted"])
    ap.add_argument("--phis", type=float, nargs="+", default=[0.4, 0.467], help="the method's compute ratios")
    ap.add_argument("-p", "--n-prompt", type=int, default=64)
    ap.add_argument("-n", "--n-gen", type=int, default=32)
    ap.add_argument("-r", "--repeats", type=int, default=21)
    ap.add_argument("-t", "--threads", type=int, default=2)
    args = ap.parse_args(argv)

    configs, pairs = [], []
    for phi in args.phis:
        target = bytes_read_per_token(args.method, phi, "frequency")
        own_phi = phi_reading(args.file, args.strategy, target)
        method = BenchConfig(f"frequency phi {phi}", args.method, {"compute_ratio": phi, "strategy": "frequency"},
                             target)
        step = BenchConfig(f"{args.strategy} phi {own_phi}", args.file,
                           {"compute_ratio": own_phi, "strategy": args.strategy},
                           bytes_read_per_token(args.file, own_phi, args.strategy))
        configs += [method, step]
        pairs.append((method.label, step.label))
    results = run_configs(configs, n_prompt=args.n_prompt, n_gen=args.n_gen, repeats=args.repeats,
                          n_threads=args.threads)
    decode = {r.label: statistics.median(r.decode_tokens_per_s) for r in results}
    print(f"{args.repeats} interleaved rounds, {args.n_prompt}-token prompt, {args.n_gen} decode steps, "
          f"{args.threads} threads; medians")
    for r in results:
        print(f"  {r.label:28s} {r.read_bytes / 2**20:6.1f} MiB read/token  decode {decode[r.label]:7.1f} tok/s  "
              f"prefill {r.prefill_median:8.1f} tok/s")
    for method, step in pairs:
        print(f"{step} / {method}: decode {decode[step] / decode[method]:.3f}")


if __name__ == "__main__":
    main()
