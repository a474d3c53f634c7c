#!/usr/bin/env python3
"""Provide the pinned, patched llama.cpp source tree for the build.

llama.cpp is a build-time dependency, never committed: it comes from the `vendor/llama.cpp`
folder of the pinned PyPI sdist of llama-cpp-python, checked by sha256. The patches in
ggml-patches/ are applied in name order. The result is cached outside the repository, keyed
by the sdist version and a digest of the patch series, so later builds reuse it.

Prints the path of the patched tree on stdout; everything else goes to stderr.
Environment:
  SELECTINFER_CACHE_DIR     cache root (default: $XDG_CACHE_HOME/selectinfer or ~/.cache/selectinfer)
  SELECTINFER_LLAMA_SDIST   use this local sdist file instead of downloading it (offline builds)
  SELECTINFER_LLAMA_SOURCE  use this unpatched llama.cpp source folder instead of the sdist, e.g. one
                            written by `--export-pruned DIR` (a machine that cannot take the 76 MB
                            sdist: the folder holds what a build of the engine, CPU and CUDA, needs)
"""
from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

SDIST_PACKAGE = "llama-cpp-python"
SDIST_VERSION = "0.3.36"
SDIST_FILE = f"llama_cpp_python-{SDIST_VERSION}.tar.gz"
SDIST_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
VENDOR_PREFIX = f"llama_cpp_python-{SDIST_VERSION}/vendor/llama.cpp/"


class SourceError(RuntimeError):
    """A problem with the upstream source or the patch series; the message names the fix."""


def cache_root() -> Path:
    if os.environ.get("SELECTINFER_CACHE_DIR"):
        return Path(os.environ["SELECTINFER_CACHE_DIR"])
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(xdg) / "selectinfer"


def compiler_cache_dir(cxx: str) -> Path:
    """ccache's folder for builds with this compiler on this CPU, created. One per CPU: ccache hashes
    the words `-march=native`, not what they mean, and an object built for another CPU may fault."""
    probe = [cxx, "-march=native", "-dM", "-E", "-x", "c++", "-"]  # empty for a cross compiler
    native = subprocess.run(probe, input="", capture_output=True, text=True).stdout
    version = subprocess.run([cxx, "--version"], capture_output=True, text=True).stdout
    key = hashlib.sha256((version + native).encode()).hexdigest()[:16]
    folder = cache_root() / "ccache" / key
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def ccache_launcher(cxx: str) -> list[str]:
    """The compiler launcher for a build through ccache, or [] where ccache is not installed.
    Paths are taken relative (CCACHE_BASEDIR) so that build folders of the same depth share objects."""
    ccache = shutil.which("ccache")
    if not ccache:
        return []
    try:
        folder = compiler_cache_dir(cxx)
    except OSError:  # no such compiler, or a cache that cannot be written: build without ccache
        return []
    return ["env", f"CCACHE_DIR={folder}", "CCACHE_BASEDIR=/", "CCACHE_NOHASHDIR=1", ccache]


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def fetch_sdist(cache: Path) -> Path:
    """The pinned sdist, from SELECTINFER_LLAMA_SDIST, the cache, or `pip download`."""
    local = os.environ.get("SELECTINFER_LLAMA_SDIST")
    sdist = Path(local) if local else cache / SDIST_FILE
    if not sdist.exists():
        if local:
            raise SourceError(f"SELECTINFER_LLAMA_SDIST={local} does not exist; unset it to download the sdist")
        cache.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=cache) as tmp:
            print(f"selectinfer: downloading {SDIST_PACKAGE}=={SDIST_VERSION} sdist (llama.cpp source)", file=sys.stderr)
            # --no-binary for this package only: ':all:' would also build pip's build deps from source.
            cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", SDIST_PACKAGE,
                   f"{SDIST_PACKAGE}=={SDIST_VERSION}", "-d", tmp]
            proc = subprocess.run(cmd, stdout=sys.stderr, stderr=sys.stderr)
            if proc.returncode != 0 or not (Path(tmp) / SDIST_FILE).exists():
                raise SourceError(f"could not download {SDIST_PACKAGE}=={SDIST_VERSION} from the package index; "
                                  "check network access or point SELECTINFER_LLAMA_SDIST at a local copy")
            os.replace(Path(tmp) / SDIST_FILE, sdist)
    actual = sha256_of(sdist)
    if actual != SDIST_SHA256:
        raise SourceError(f"{sdist} has sha256 {actual}, expected {SDIST_SHA256}; delete it and rebuild to download it again")
    return sdist


def extract_vendor_tree(sdist: Path, dest: Path) -> None:
    with tarfile.open(sdist, "r:gz") as tar:
        members = [m for m in tar.getmembers() if m.name.startswith(VENDOR_PREFIX) and (m.isfile() or m.isdir())]
        for m in members:
            m.name = m.name[len(VENDOR_PREFIX):]
        # drop the submodule's `.git` link: git apply would follow it to a repository that is not there
        members = [m for m in members if m.name and m.name.split("/")[0] != ".git"]
        if hasattr(tarfile, "data_filter"):
            tar.extractall(dest, members=members, filter="data")
        else:  # Python < 3.11.4
            tar.extractall(dest, members=members)


# What a build of the engine (libllama, ggml's CPU and CUDA backends) reads of the vendor tree:
# everything but these (the vocabularies, docs, tests, tools and the other backends).
PRUNED_TOP = {"models", "docs", "tests", "tools", "examples", "benches", "media", "gguf-py", "scripts",
              "conversion", "common", "pocs", "app", "grammars", "prompts", ".github", ".devops"}
PRUNED_BACKENDS = {"ggml-cann", "ggml-et", "ggml-hexagon", "ggml-hip", "ggml-metal", "ggml-musa", "ggml-opencl",
                   "ggml-openvino", "ggml-rpc", "ggml-sycl", "ggml-virtgpu", "ggml-vulkan", "ggml-webgpu",
                   "ggml-zdnn", "ggml-zendnn"}


def export_pruned(dest: Path) -> None:
    """The unpatched vendor tree, pruned to what the engine's build reads, into `dest`."""
    if dest.exists() and any(dest.iterdir()):
        raise SourceError(f"{dest} is not empty; give a new folder")
    sdist = fetch_sdist(cache_root())
    with tempfile.TemporaryDirectory() as tmp:
        extract_vendor_tree(sdist, Path(tmp))
        for name in PRUNED_TOP:
            shutil.rmtree(Path(tmp) / name, ignore_errors=True)
        for name in PRUNED_BACKENDS:
            shutil.rmtree(Path(tmp) / "ggml" / "src" / name, ignore_errors=True)
        shutil.copytree(tmp, dest, dirs_exist_ok=True)


def source_tree(dest: Path) -> str:
    """Puts the unpatched llama.cpp source into `dest`; returns what it came from."""
    folder = os.environ.get("SELECTINFER_LLAMA_SOURCE")
    if folder:
        if not (Path(folder) / "CMakeLists.txt").exists() or not (Path(folder) / "ggml").is_dir():
            raise SourceError(f"SELECTINFER_LLAMA_SOURCE={folder} is not a llama.cpp source folder; "
                              "write one with `python3 cmake/llama_cpp_source.py --export-pruned DIR`, or unset it")
        shutil.copytree(folder, dest, dirs_exist_ok=True, ignore=shutil.ignore_patterns(".git"))
        return "source"
    extract_vendor_tree(fetch_sdist(cache_root()), dest)
    return "sdist"


def patch_series(patch_dir: Path) -> list[Path]:
    return sorted(patch_dir.glob("*.patch")) if patch_dir.is_dir() else []


def series_digest(patches: list[Path]) -> str:
    digest = hashlib.sha256()
    for p in patches:
        digest.update(p.name.encode() + b"\0" + p.read_bytes() + b"\0")
    return digest.hexdigest()[:12]


def apply_patches(tree: Path, patches: list[Path]) -> None:
    """Apply each patch to `tree` in order; stop at the first one that does not apply cleanly."""
    env = dict(os.environ, GIT_CEILING_DIRECTORIES=str(tree.parent.resolve()))
    env.pop("GIT_DIR", None)
    for p in patches:
        for extra in (["--check"], []):
            proc = subprocess.run(["git", "apply", "-p1", "--whitespace=nowarn", *extra, str(p.resolve())],
                                  cwd=tree, env=env, capture_output=True, text=True)
            if proc.returncode != 0:
                detail = proc.stderr.strip().splitlines()
                raise SourceError(f"patch {p.name} does not apply to llama.cpp from {SDIST_PACKAGE}=={SDIST_VERSION}: "
                                  f"{detail[0] if detail else 'git apply failed'}; rebase it on the pinned source")


def patched_tree(patch_dir: Path) -> Path:
    """The cached patched tree for the current patch series, created on first use."""
    cache = cache_root()
    patches = patch_series(patch_dir)
    # a tree from a source folder may be pruned: cached apart from the sdist's
    origin = "-from-source" if os.environ.get("SELECTINFER_LLAMA_SOURCE") else ""
    tree = cache / f"llama.cpp-{SDIST_VERSION}-{series_digest(patches)}{origin}"
    if (tree / ".selectinfer-complete").exists():
        return tree
    cache.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=tree.name + ".tmp-", dir=cache))
    try:
        source_tree(tmp)
        apply_patches(tmp, patches)
        (tmp / ".selectinfer-complete").write_text("\n".join(p.name for p in patches) + "\n")
        try:
            os.rename(tmp, tree)  # atomic: a concurrent build may have won the race
        except OSError:
            if not (tree / ".selectinfer-complete").exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"selectinfer: llama.cpp source ready at {tree} ({len(patches)} patches)", file=sys.stderr)
    return tree


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--patches", type=Path, help="folder of *.patch files: print the patched tree's path")
    parser.add_argument("--export-pruned", type=Path, metavar="DIR",
                        help="write the unpatched source, pruned to what the engine's build needs, into DIR")
    parser.add_argument("--ccache-launcher", metavar="CXX",
                        help="print the compiler launcher (a CMake list) for builds with CXX through ccache; "
                             "nothing where ccache is not installed")
    args = parser.parse_args()
    if not args.patches and not args.export_pruned and not args.ccache_launcher:
        parser.error("give --patches, --export-pruned or --ccache-launcher")
    try:
        if args.ccache_launcher:
            print(";".join(ccache_launcher(args.ccache_launcher)))
        elif args.export_pruned:
            export_pruned(args.export_pruned)
        else:
            print(patched_tree(args.patches))
    except SourceError as e:
        print(f"selectinfer: error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
