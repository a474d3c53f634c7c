#!/usr/bin/env python3
"""Memory of selective loading: process RSS after load and after a 64-token generation, for the
original model and SelectInfer GGUFs at several load ratios (gamma), each in a fresh process.

    python scripts/bench_memory.py MODEL.gguf [--profile P --task T] [--gammas 0.5 0.7 0.9] [--mmap]

Without --profile the neurons are chosen at random (memory does not depend on which ones). The
expected saving is (1 - gamma) x the bytes of the sparsified layers' FFN weights. With
--time-convert it also times the conversion against a plain copy of the file, in the same run.
"""
from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from gguf import GGUFReader

CHILD = r"""
import json, sys
from selectinfer import Model
path, use_mmap, n_gen, repack = sys.argv[1], sys.argv[2] == "1", int(sys.argv[3]), sys.argv[4] == "1"
m = Model(path, n_ctx=256, use_mmap=use_mmap, repack=repack)
after_load = m.stats()["rss_bytes"]
m.decode_tokens(m.tokenize("The history of the city begins with a small settlement on the river"), n_gen)
s = m.stats()
print(json.dumps({"after_load": after_load, "after_gen": s["rss_bytes"], "peak": s["peak_rss_bytes"],
                  "model_bytes": s["model_bytes"], "decode_tok_s": s["decode_tokens_per_s"]}))
"""


def measure(path: Path, use_mmap: bool, n_gen: int, repack: bool = True) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD, str(path), "1" if use_mmap else "0", str(n_gen),
                          "1" if repack else "0"],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def ffn_bytes(path: Path, layers: range) -> int:
    reader = GGUFReader(str(path))
    return sum(int(t.n_bytes) for t in reader.tensors
               if t.name.startswith("blk.") and int(t.name.split(".")[1]) in layers and ".ffn_" in t.name
               and t.name.endswith("weight") and "norm" not in t.name)


def main() -> int:
    from selectinfer.method.convert import convert, default_layers

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", type=Path)
    ap.add_argument("--profile")
    ap.add_argument("--task")
    ap.add_argument("--gammas", type=float, nargs="+", default=[0.5, 0.7, 0.9])
    ap.add_argument("--delta", type=float, default=0.3)
    ap.add_argument("-n", "--n-gen", type=int, default=64)
    ap.add_argument("--mmap", action="store_true", help="map the weights (default: read them into memory)")
    ap.add_argument("--no-repack", action="store_true", help="no weight repacking (AMX, CPU_REPACK)")
    ap.add_argument("--workdir", type=Path, default=Path("build/bench-memory"))
    ap.add_argument("--time-convert", action="store_true", help="also time conversion vs a file copy")
    args = ap.parse_args()

    args.workdir.mkdir(parents=True, exist_ok=True)
    n_layer = int(GGUFReader(str(args.model)).get_field(
        f"{GGUFReader(str(args.model)).get_field('general.architecture').contents()}.block_count").contents())
    layers = default_layers(n_layer)
    rows = [("original", args.model, 1.0)]
    convert_s, copy_s = [], []
    for g in args.gammas:
        out = args.workdir / f"{args.model.stem}.si{int(round(g * 100))}.gguf"
        if args.time_convert:  # a copy of the source, then the conversion: interleaved, same page cache state
            t0 = time.perf_counter()
            shutil.copyfile(args.model, args.workdir / "copy.gguf")
            copy_s.append(time.perf_counter() - t0)
            (args.workdir / "copy.gguf").unlink()
        if not out.exists() or args.time_convert:
            t0 = time.perf_counter()
            convert(args.model, out, profile=args.profile, task=args.task,
                    ranking="profile" if args.profile else "random", load_ratio=g,
                    static_ratio=min(args.delta, g), progress=False)
            convert_s.append(time.perf_counter() - t0)
        rows.append((f"gamma {g}", out, g))
    if args.time_convert:
        print(f"convert: {' '.join(f'{x:.1f}' for x in convert_s)} s (median {statistics.median(convert_s):.1f}); "
              f"copy of the source file: {' '.join(f'{x:.1f}' for x in copy_s)} s (median "
              f"{statistics.median(copy_s):.1f}); convert / copy = "
              f"{statistics.median(convert_s) / statistics.median(copy_s):.2f}")

    sparsified = ffn_bytes(args.model, layers)
    mib = 2**20
    print(f"model {args.model.name}, sparsified layers {layers.start}..{layers.stop - 1} of {n_layer}, their FFN "
          f"weights {sparsified / mib:.1f} MiB; weights {'mapped' if args.mmap else 'read into memory'}; "
          f"{args.n_gen}-token generation")
    print("| model | weights MiB | RSS after load MiB | RSS after generation MiB | RSS saving MiB "
          "| expected (1-gamma) x FFN MiB | diff | decode tok/s |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    base = None
    for label, path, g in rows:
        r = measure(path, args.mmap, args.n_gen, not args.no_repack)
        base = base or r
        saving = (base["after_gen"] - r["after_gen"]) / mib
        expected = (1 - g) * sparsified / mib
        diff = f"{(saving - expected) / expected * 100:+.1f}%" if g < 1 else ""
        print(f"| {label} | {r['model_bytes'] / mib:.1f} | {r['after_load'] / mib:.1f} | {r['after_gen'] / mib:.1f} "
              f"| {saving:.1f} | {expected:.1f} | {diff} | {r['decode_tok_s']:.1f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
