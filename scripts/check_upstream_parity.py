#!/usr/bin/env python3
"""Check that dense selectinfer equals stock llama.cpp from the same pinned sdist.

Builds llama-cpp-python==0.3.36 from the very sdist our build uses (unpatched llama.cpp, its own
bindings) into a separate virtual environment, then on the default model compares:
  - greedy tokens: upstream (argmax of its logits, step by step) vs selectinfer's greedy sampler;
  - logits of the whole prompt + generated sequence, one row per token (bound: 1e-4).
The two engines run in separate processes so their ggml symbols never meet.

    python scripts/check_upstream_parity.py [--model PATH] [-n 32] [--venv build/upstream-venv]

The first run builds the upstream package (about 10 minutes on 2 cores). One patch is applied to
it, ggml-patches/0005 (AMX_FIX): built natively on a Xeon with AMX, stock llama.cpp crashes on its
first prompt (GCC 12 miscompiles the AMX tile configuration); the fix changes no arithmetic.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "cmake"))
import llama_cpp_source  # noqa: E402  (the build's own sdist fetch and sha256 check)

AMX_FIX = REPO / "ggml-patches" / "0005-amx-tile-config.patch"

UPSTREAM_CHILD = r"""
import json, sys
import numpy as np
from llama_cpp import Llama
cfg = json.loads(sys.argv[1])
llm = Llama(model_path=cfg["model"], n_ctx=cfg["n_ctx"], n_batch=cfg["n_ctx"], n_threads=cfg["n_threads"],
            n_threads_batch=cfg["n_threads"], flash_attn=cfg["flash_attn"], logits_all=True, verbose=False)
tokens = llm.tokenize(cfg["prompt"].encode(), add_bos=True, special=False)
llm.eval(tokens)
generated = []
for _ in range(cfg["n_predict"]):
    tok = int(np.argmax(llm.scores[llm.n_tokens - 1]))
    if llm.token_eos() == tok:
        break
    generated.append(tok)
    llm.eval([tok])
llm.reset()
sequence = tokens + generated
llm.eval(sequence)  # one batch, like selectinfer's Model.logits
np.save(cfg["out"] + ".npy", np.asarray(llm.scores[: len(sequence)], dtype=np.float32))
json.dump({"prompt_tokens": tokens, "generated": generated, "version": __import__("llama_cpp").__version__},
          open(cfg["out"] + ".json", "w"))
"""


def ensure_upstream_venv(venv: Path) -> Path:
    python = venv / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([python, "-m", "pip", "install", "-q", "numpy", "diskcache", "jinja2", "typing-extensions"],
                       check=True)
    installed = subprocess.run([python, "-m", "pip", "show", "-q", "llama_cpp_python"], capture_output=True)
    if installed.returncode != 0:
        sdist = llama_cpp_source.fetch_sdist(llama_cpp_source.cache_root())  # same file, sha256-checked
        print(f"building stock llama-cpp-python from {sdist} into {venv} (takes a while)", file=sys.stderr)
        cmake_args = ["-DGGML_NATIVE=ON", "-DGGML_OPENMP=OFF", "-DLLAVA_BUILD=OFF"]
        launcher = ";".join(llama_cpp_source.ccache_launcher(os.environ.get("CXX", "c++")))
        if launcher:  # the engine's compiler cache; the fixed source and build folders below let it hit
            cmake_args += [f"-DCMAKE_C_COMPILER_LAUNCHER={launcher}", f"-DCMAKE_CXX_COMPILER_LAUNCHER={launcher}"]
        env = dict(os.environ, CMAKE_ARGS=" ".join(shlex.quote(a) for a in cmake_args))
        shutil.rmtree(venv / "src", ignore_errors=True)
        source = stock_source_with_amx_fix(sdist, venv / "src")
        subprocess.run([python, "-m", "pip", "install", "--no-deps", f"--config-settings=build-dir={venv / 'build'}",
                        str(source)], check=True, env=env)
        shutil.rmtree(venv / "src", ignore_errors=True)
        shutil.rmtree(venv / "build", ignore_errors=True)
    return python


def stock_source_with_amx_fix(sdist: Path, dest: Path) -> Path:
    """The sdist unpacked, with ggml-patches/0005 applied to its vendor/llama.cpp (see the docstring)."""
    import tarfile

    with tarfile.open(sdist, "r:gz") as tar:
        if hasattr(tarfile, "data_filter"):
            tar.extractall(dest, filter="data")
        else:  # Python < 3.11.4
            tar.extractall(dest)
    source = dest / f"llama_cpp_python-{llama_cpp_source.SDIST_VERSION}"
    vendor = source / "vendor" / "llama.cpp"
    (vendor / ".git").unlink(missing_ok=True)  # a submodule link git apply would follow
    llama_cpp_source.apply_patches(vendor, [AMX_FIX])
    return source


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="GGUF model (default: the registry's smollm2-135m)")
    parser.add_argument("--prompt", default="The capital of France is")
    parser.add_argument("-n", "--n-predict", type=int, default=32)
    parser.add_argument("-t", "--threads", type=int, default=2)
    parser.add_argument("--venv", type=Path, default=REPO / "build" / "upstream-venv")
    parser.add_argument("--tolerance", type=float, default=1e-4)
    parser.add_argument("--build-only", action="store_true", help="only build the stock llama-cpp-python venv")
    args = parser.parse_args()
    if args.build_only:
        ensure_upstream_venv(args.venv)
        return 0

    from selectinfer import pull

    model = args.model or str(pull("smollm2-135m", quiet=True))
    python = ensure_upstream_venv(args.venv)
    ok = True
    # llama-cpp-python exposes flash attention as on/off only; check both paths.
    for flash_attn in (False, True):
        ok &= compare(python, model, args, flash_attn)
    print("PARITY OK" if ok else "PARITY FAILED")
    return 0 if ok else 1


def compare(python: Path, model: str, args: argparse.Namespace, flash_attn: bool) -> bool:
    from selectinfer import Model

    n_ctx = 512
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "upstream")
        cfg = dict(model=model, prompt=args.prompt, n_predict=args.n_predict, n_ctx=n_ctx, n_threads=args.threads,
                   flash_attn=flash_attn, out=out)
        subprocess.run([python, "-c", UPSTREAM_CHILD, json.dumps(cfg)], check=True)
        upstream_logits = np.load(out + ".npy")
        upstream = json.load(open(out + ".json"))

    with Model(model, n_ctx=n_ctx, n_batch=n_ctx, n_threads=args.threads, flash_attn=flash_attn) as m:
        prompt_tokens = m.tokenize(args.prompt)
        ours_text = m.generate(prompt_tokens, args.n_predict, temperature=0)
        sequence = prompt_tokens + upstream["generated"]
        ours_logits = m.logits(sequence)
        ours_argmax = [int(t) for t in np.argmax(ours_logits[len(prompt_tokens) - 1: -1], axis=1)]
        upstream_text = m.detokenize(upstream["generated"])

    same_prompt = prompt_tokens == upstream["prompt_tokens"]
    same_tokens = ours_argmax == upstream["generated"] and ours_text == upstream_text
    max_diff = float(np.abs(ours_logits - upstream_logits).max())
    print(f"flash attention {'on' if flash_attn else 'off'}: upstream llama-cpp-python {upstream['version']} "
          f"(stock llama.cpp + the AMX fix) vs selectinfer, model {Path(model).name}")
    print(f"  prompt tokens identical:  {same_prompt} ({len(prompt_tokens)} tokens)")
    print(f"  greedy tokens identical:  {same_tokens} ({len(upstream['generated'])} tokens)")
    print(f"  logits max |diff|:        {max_diff:.3e} over {ours_logits.shape[0]} x {ours_logits.shape[1]} "
          f"(bound {args.tolerance:g})")
    return same_prompt and same_tokens and max_diff <= args.tolerance


if __name__ == "__main__":
    sys.exit(main())
