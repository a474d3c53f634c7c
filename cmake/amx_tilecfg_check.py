#!/usr/bin/env python3
"""Check that ggml's AMX tile configuration survives the compiler.

ggml's `ggml_tile_config_init` (ggml/src/ggml-cpu/amx/mmq.cpp) fills a 64-byte `tile_config_t`
and loads it with `ldtilecfg`. GCC's `_tile_loadconfig` intrinsic names only 8 bytes of it, so
GCC 12 at -O2 deletes the stores of `rows` and `colsb`, and every AMX instruction after it faults
(ggml-patches/0005 loads it with an operand covering the whole struct). This script copies the
routine verbatim out of a llama.cpp tree, compiles it into cmake/amx_tilecfg_probe.cpp with the
given compiler and flags, runs it, and compares the 64 bytes ldtilecfg receives with the
`tc.rows[i] = R; tc.colsb[i] = C;` assignments in the source. It needs no AMX CPU.

Exit status: 0 the configuration arrives intact, 1 it does not (miscompiled), 2 the check could not
run (the routine was not found, or the compiler cannot target AMX). One line on stdout says which.
"""
from __future__ import annotations

import argparse
import os
import re
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
MMQ = Path("ggml/src/ggml-cpu/amx/mmq.cpp")
FLAGS = "-O3 -march=sapphirerapids"  # what a native build on an AMX Xeon compiles ggml-cpu with
UPSTREAM_LOAD = "_tile_loadconfig(&tc);"


class CheckError(RuntimeError):
    """The check itself could not run."""


def extract_routine(source: str) -> str:
    """`struct tile_config_t` and `ggml_tile_config_init` as they stand in mmq.cpp."""
    struct = re.search(r"^struct tile_config_t\s*\{.*?^\};", source, re.S | re.M)
    func = re.search(r"^inline void ggml_tile_config_init\(void\) \{.*?^\}", source, re.S | re.M)
    if not struct or not func:
        raise CheckError(f"tile_config_t / ggml_tile_config_init not found in {MMQ}; update {Path(__file__).name}")
    return struct.group(0) + "\n\n" + func.group(0) + "\n"


def expected_tiles(routine: str) -> dict[int, tuple[int, int]]:
    tiles = {int(i): (int(r), int(c)) for i, r, c in
             re.findall(r"tc\.rows\[(\d+)\]\s*=\s*(\d+);\s*tc\.colsb\[\1\]\s*=\s*(\d+);", routine)}
    if not tiles:
        raise CheckError(f"no `tc.rows[i] = R; tc.colsb[i] = C;` lines in ggml_tile_config_init; update {Path(__file__).name}")
    return tiles


def unpatched(routine: str) -> str:
    """The routine with upstream's intrinsic in place of ggml-patches/0005's load."""
    patched = re.search(r'__asm__ volatile\("ldtilecfg %0" : : "m"\(tc\)\);', routine)
    if not patched:
        raise CheckError("the routine does not carry ggml-patches/0005's load")
    return routine[:patched.start()] + UPSTREAM_LOAD + routine[patched.end():]


def run_probe(routine: str, cxx: str, flags: str, run_with: str = "") -> str:
    with tempfile.TemporaryDirectory(prefix="amx-tilecfg-") as tmp:
        snippet = Path(tmp) / "tilecfg.inc"
        snippet.write_text(routine)
        exe = Path(tmp) / "probe"
        cmd = [*shlex.split(cxx), "-std=c++17", *shlex.split(flags), "-mamx-tile", "-mamx-int8",
               f'-DTILECFG_SOURCE="{snippet}"', str(HERE / "amx_tilecfg_probe.cpp"), "-o", str(exe)]
        built = subprocess.run(cmd, capture_output=True, text=True)
        if built.returncode != 0:
            raise CheckError(f"{cxx} cannot compile the AMX probe: " + (built.stderr.strip().splitlines() or ["?"])[0])
        ran = subprocess.run([*shlex.split(run_with), str(exe)], capture_output=True, text=True, timeout=60)
        if ran.returncode != 0:
            raise CheckError(f"the probe failed (exit {ran.returncode}): {ran.stderr.strip()}")
        return ran.stdout


def parse_probe(output: str) -> tuple[int, list[int], list[int]]:
    fields = {line.split()[0]: line.split()[1:] for line in output.splitlines() if line.strip()}
    return int(fields["palette_id"][0]), [int(v) for v in fields["rows"]], [int(v) for v in fields["colsb"]]


def check(tree: Path, cxx: str, flags: str, upstream: bool = False, run_with: str = "") -> tuple[bool, str]:
    """(intact, one-line report) for the routine in `tree` (upstream's load if `upstream`)."""
    mmq = tree / MMQ
    if not mmq.is_file():
        raise CheckError(f"{mmq} not found: pass the llama.cpp tree the build uses")
    routine = extract_routine(mmq.read_text())
    tiles = expected_tiles(routine)
    if upstream:
        routine = unpatched(routine)
    palette, rows, colsb = parse_probe(run_probe(routine, cxx, flags, run_with))
    wrong = [f"tile {i}: rows {rows[i]} colsb {colsb[i]} (source: {r}, {c})"
             for i, (r, c) in sorted(tiles.items()) if (rows[i], colsb[i]) != (r, c)]
    if palette != 1:
        wrong.insert(0, f"palette_id {palette} (source: 1)")
    what = f"{cxx} {flags}" + (" (upstream's _tile_loadconfig)" if upstream else "")
    if wrong:
        return False, f"MISCOMPILED with {what}: ldtilecfg receives " + "; ".join(wrong)
    return True, f"ok with {what}: ldtilecfg receives the {len(tiles)} tiles of the source"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("tree", type=Path, help="the (patched) llama.cpp source tree")
    parser.add_argument("--cxx", default=os.environ.get("CXX", "c++"), help="C++ compiler (default: $CXX or c++)")
    parser.add_argument("--flags", default=FLAGS, help=f"compile flags (default: {FLAGS!r})")
    parser.add_argument("--upstream", action="store_true",
                        help="check upstream's intrinsic instead of the patched load (shows the miscompilation)")
    parser.add_argument("--run-with", default="", help="run the probe under this command (e.g. 'qemu-x86_64 -cpu max')")
    args = parser.parse_args()
    try:
        intact, report = check(args.tree, args.cxx, args.flags, args.upstream, args.run_with)
    except (CheckError, subprocess.TimeoutExpired) as e:
        print(f"cannot check: {e}")
        return 2
    print(report)
    return 0 if intact else 1


if __name__ == "__main__":
    sys.exit(main())
