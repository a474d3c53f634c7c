#!/usr/bin/env python3
"""Fuzz the SelectInfer GGUF loader and engine: seeded mutants of a valid file (metadata values,
arrays, tensor infos, header bytes, truncation), each loaded and run in a child process. Prints a
table of outcomes; files that crash or hang the engine are kept for reproduction.

    python scripts/fuzz_si_gguf.py --cases 5000 --seed 1 --keep crashes/
"""
import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from fuzzing import run_cases, summary  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--keep", type=Path, default=Path("fuzz-crashes"), help="folder for crashing files")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds one case may take")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="si-fuzz-") as tmp:
        report = run_cases(args.cases, args.seed, Path(tmp), args.timeout, keep=args.keep, progress=True)
    print(summary(report))
    print("refusals by exception type:", dict(report.messages))
    for kind, path, what in report.crashes:
        print(f"CRASH {kind}: {path}: {what}")
    return 1 if report.crashes else 0


if __name__ == "__main__":
    sys.exit(main())
