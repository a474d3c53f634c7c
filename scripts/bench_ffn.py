"""FFN time of one layer: the original dense layer against a SelectInfer layer, with the real
ggml kernels on random weights (selectinfer._testing.time_ffn_layer). Shows where decode and
prefill time goes, step by step, without the rest of the model. Steps run interleaved;
medians of every step and ratios are printed.

    python scripts/bench_ffn.py --shape llama-3.2-3b --type F16 --load-ratio 0.7 \\
        --compute-ratios 0.3 0.4 0.5 0.7 --tokens 1 64
"""
from __future__ import annotations

import argparse
import statistics

from selectinfer import _native, _testing
from selectinfer.evaluation.bench import computed_neurons
from selectinfer.method.convert import layer_counts
from selectinfer.evaluation.synthetic import SHAPES

TYPES = {"F32": 0, "F16": 1, "Q4_0": 2, "Q4_1": 3, "Q5_0": 6, "Q5_1": 7, "Q8_0": 8, "Q4_K": 12, "Q5_K": 13, "Q6_K": 14, "BF16": 30}
SHAPES_AND_DEFAULT = {**{k: (v.n_embd, v.n_ff) for k, v in SHAPES.items()}, "smollm2-135m": (576, 1536)}


def medians(type_id: int, n_embd: int, n_ff: int, n_load: int, n_static: int, n_select: int, n_tokens: int,
            threads: int, reps: int) -> dict[str, float]:
    times = _testing.time_ffn_layer(type_id, n_embd, n_ff, n_load, n_static, n_select, n_tokens, threads, reps)
    return {step: statistics.median(ms) for step, ms in times}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", default="llama-3.2-3b", choices=sorted(SHAPES_AND_DEFAULT))
    ap.add_argument("--type", default="F16", choices=sorted(TYPES))
    ap.add_argument("--load-ratio", type=float, default=0.7, help="gamma: loaded neurons / original")
    ap.add_argument("--static-ratio", type=float, default=0.3, help="delta: static neurons / original")
    ap.add_argument("--compute-ratios", type=float, nargs="+", default=[0.3, 0.4, 0.5, 0.7], help="phi values")
    ap.add_argument("--tokens", type=int, nargs="+", default=[1, 64], help="tokens per run (1 = decode)")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-r", "--reps", type=int, default=21)
    args = ap.parse_args(argv)

    n_embd, n_ff = SHAPES_AND_DEFAULT[args.shape]
    # as the converter keeps them (static counts in whole blocks of the type)
    n_load, n_static = layer_counts(n_ff, args.load_ratio, args.static_ratio, _native.block_size(TYPES[args.type]))
    print(f"{args.shape} FFN layer: n_embd {n_embd}, n_ff {n_ff}, {args.type}, gamma {args.load_ratio} "
          f"({n_load} loaded), delta {args.static_ratio} ({n_static} static), {args.threads} threads, "
          f"medians of {args.reps} interleaved runs, ms")
    if 1 in args.tokens:
        print("\ndecode (1 token)   gate+up   down  = FFN    | SI FFN | SI/loaded  target  dense/SI")
        shown_dense = False
        for phi in args.compute_ratios:
            n_select = max(n_static, computed_neurons(phi, n_ff, n_load))
            if n_select == n_load:  # the engine computes every loaded neuron with the dense graph
                print(f"  phi {phi:<4}         = dense-over-loaded (every loaded neuron)")
                continue
            m = medians(TYPES[args.type], n_embd, n_ff, n_load, n_static, n_select, 1, args.threads, args.reps)
            dense = m["dense gate+up"] + m["dense down"]
            loaded = m["loaded gate+up"] + m["loaded down"]
            si = m["selected FFN"]  # the engine's decode graph: static block + dynamic rows
            if not shown_dense:
                shown_dense = True
                print(f"  dense (original) {m['dense gate+up']:7.3f} {m['dense down']:6.3f} = {dense:6.3f}")
                print(f"  dense-over-loaded{m['loaded gate+up']:7.3f} {m['loaded down']:6.3f} = {loaded:6.3f}")
            # the target set for selective computation: SI FFN time at phi at most 1.15 x phi/gamma of dense-over-loaded
            print(f"  phi {phi:<4}         {'':22} | {si:6.3f} | {si / loaded:9.3f} "
                  f"{1.15 * phi / args.load_ratio:7.3f} {dense / si:8.3f}")
            if "selected gate+up" in m:  # the gathered rows alone, per row against the dense layer's
                n_chosen = n_select - n_static
                per_row = {k: m[f"selected {k}"] / n_chosen / (m[f"dense {k}"] / n_ff) for k in ("gate+up", "down")}
                print(f"    gathered {n_chosen} rows: gate+up {m['selected gate+up']:6.3f} ms "
                      f"({per_row['gate+up']:.2f}x dense per row), down {m['selected down']:6.3f} ms "
                      f"({per_row['down']:.2f}x dense per row)")
    for n_tokens in [t for t in args.tokens if t > 1]:
        n_select = max(n_static, computed_neurons(args.compute_ratios[0], n_ff, n_load))
        m = medians(TYPES[args.type], n_embd, n_ff, n_load, n_static, n_select, n_tokens, args.threads, args.reps)
        dense = m["dense gate+up"] + m["dense down"]
        loaded = m["loaded gate+up"] + m["loaded down"]
        print(f"\nprefill ({n_tokens} tokens) gate+up   down  selection = FFN  | vs dense")
        print(f"  dense (original) {m['dense gate+up']:8.3f} {m['dense down']:7.3f} {'':9} = {dense:7.3f}")
        print(f"  SI, selecting    {m['loaded gate+up']:8.3f} {m['loaded down']:7.3f} {m['selection']:9.3f} = "
              f"{loaded + m['selection']:7.3f} | {(loaded + m['selection']) / dense:.3f}")


if __name__ == "__main__":
    main()
