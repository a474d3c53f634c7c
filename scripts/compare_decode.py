#!/usr/bin/env python3
"""Why does the text of two builds differ? Dump what a build computes for a prompt (the neurons
each SelectInfer layer selects, and the logits of each decode step) and compare two dumps: a
build on another CPU (the aarch64 one under qemu, say) against this one.

    python scripts/compare_decode.py dump MODEL -o x86.npz [--compute-ratio 0.4] [-n 16]
    qemu-aarch64 -L SYSROOT SYSROOT/usr/bin/python3.11 scripts/compare_decode.py dump MODEL \\
        -o arm.npz --follow x86.npz          # (PYTHONPATH=build/aarch64/pkg)
    python scripts/compare_decode.py compare x86.npz arm.npz

`--follow` feeds the other dump's tokens instead of the build's own greedy choices (teacher
forcing), so that every step's logits are computed on the same inputs. The comparison prints,
per step, the largest logit difference and the gap between the two best tokens: where the text
parts while the gap is within the difference, the builds disagree on a near-tie, which float
rounding decides; a bug shows as differences far above rounding on clear decisions.
"""
from __future__ import annotations

import argparse
import sys

import numpy as np


def dump(args: argparse.Namespace) -> None:
    from selectinfer import Model, _native

    kwargs = {"repack": not args.no_repack}
    if args.compute_ratio is not None:
        kwargs["compute_ratio"] = args.compute_ratio
    if args.dense:
        kwargs["dense"] = True
    followed = np.load(args.follow)["tokens"].tolist() if args.follow else None
    with Model(args.model, n_ctx=256, n_threads=args.threads, **kwargs) as m:
        n = args.n_predict if followed is None else len(followed)
        tokens, logits = m.decode_tokens(m.tokenize(args.prompt), n, follow=followed, logits=True)
        selection = m.selected_neurons() if m.engine.selective else {}
    np.savez(args.output, tokens=np.array(tokens), logits=np.array(logits), info=_native.system_info(),
             **{f"layer{il}": ids for il, ids in selection.items()})
    print(f"{args.output}: {len(tokens)} steps, {len(selection)} SelectInfer layers")


def compare(args: argparse.Namespace) -> int:
    a, b = np.load(args.a), np.load(args.b)
    print(f"A: {str(a['info'])[:100]}\nB: {str(b['info'])[:100]}")
    layers = sorted(k for k in a.files if k.startswith("layer"))
    differ = [k for k in layers if k not in b.files or not np.array_equal(a[k], b[k])]
    print(f"selections: {len(layers) - len(differ)} of {len(layers)} layers identical"
          + (f"; differ in {', '.join(differ)} (" + ", ".join(
              f"{len(set(a[k]) ^ set(b[k])) // 2} neurons" for k in differ) + ")" if differ else ""))
    same_tokens = np.array_equal(a["tokens"], b["tokens"])
    print(f"tokens: {'the same (B followed A)' if same_tokens else 'differ: pass --follow to compare step by step'}")
    n = min(len(a["logits"]), len(b["logits"]))
    print("step | token | max |logit diff| | top-2 gap in A | argmax equal")
    for i in range(n):
        la, lb = a["logits"][i], b["logits"][i]
        top = np.sort(la)[-2:]
        print(f"{i:4d} | {int(a['tokens'][i]):6d} | {np.abs(la - lb).max():17.5f} | {top[1] - top[0]:14.5f} | "
              f"{int(la.argmax()) == int(lb.argmax())}")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    d = sub.add_parser("dump")
    d.add_argument("model")
    d.add_argument("-o", "--output", required=True)
    d.add_argument("-p", "--prompt", default="The capital of France is")
    d.add_argument("-n", "--n-predict", type=int, default=16)
    d.add_argument("-t", "--threads", type=int, default=2)
    d.add_argument("--compute-ratio", type=float)
    d.add_argument("--dense", action="store_true", help="compute every loaded neuron (no selection)")
    d.add_argument("--no-repack", action="store_true", help="no weight repacking (AMX, CPU_REPACK)")
    d.add_argument("--follow", help="a dump whose tokens to feed (teacher forcing)")
    c = sub.add_parser("compare")
    c.add_argument("a")
    c.add_argument("b")
    args = parser.parse_args()
    if args.command == "dump":
        dump(args)
        return 0
    return compare(args)


if __name__ == "__main__":
    sys.exit(main())
