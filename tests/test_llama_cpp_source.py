"""The build's source step (cmake/llama_cpp_source.py): pinned sdist, ordered patch series, cache."""
import importlib.util
import io
import tarfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("llama_cpp_source", REPO / "cmake" / "llama_cpp_source.py")
src = importlib.util.module_from_spec(spec)
spec.loader.exec_module(src)

PATCH_1 = """--- a/ggml/a.txt
+++ b/ggml/a.txt
@@ -1,3 +1,3 @@
 one
-two
+TWO
 three
"""
# applies only on top of PATCH_1 (its context has TWO)
PATCH_2 = """--- a/ggml/a.txt
+++ b/ggml/a.txt
@@ -1,3 +1,3 @@
 one
 TWO
-three
+THREE
"""


def fake_tree(root: Path) -> Path:
    (root / "ggml").mkdir(parents=True)
    (root / "ggml" / "a.txt").write_text("one\ntwo\nthree\n")
    return root


def write_series(folder: Path, patches: dict[str, str]) -> list[Path]:
    folder.mkdir()
    for name, text in patches.items():
        (folder / name).write_text(text)
    return src.patch_series(folder)


def test_patches_apply_in_name_order(tmp_path):
    tree = fake_tree(tmp_path / "tree")
    series = write_series(tmp_path / "patches", {"0002-second.patch": PATCH_2, "0001-first.patch": PATCH_1})
    assert [p.name for p in series] == ["0001-first.patch", "0002-second.patch"]
    src.apply_patches(tree, series)
    assert (tree / "ggml" / "a.txt").read_text() == "one\nTWO\nTHREE\n"


def test_failing_patch_is_named(tmp_path):
    tree = fake_tree(tmp_path / "tree")
    series = write_series(tmp_path / "patches", {"0001-first.patch": PATCH_1, "0002-stale.patch": PATCH_1})
    with pytest.raises(src.SourceError, match="patch 0002-stale.patch does not apply"):
        src.apply_patches(tree, series)


def test_series_digest_tracks_content(tmp_path):
    a = write_series(tmp_path / "a", {"0001-x.patch": PATCH_1})
    b = write_series(tmp_path / "b", {"0001-x.patch": PATCH_2})
    assert src.series_digest(a) != src.series_digest(b)
    assert src.series_digest(a) == src.series_digest(src.patch_series(tmp_path / "a"))


def test_wrong_sdist_is_rejected(tmp_path, monkeypatch):
    fake = tmp_path / src.SDIST_FILE
    buf = io.BytesIO(b"not llama.cpp")
    with tarfile.open(fake, "w:gz") as tar:
        info = tarfile.TarInfo(src.VENDOR_PREFIX + "README.md")
        info.size = len(buf.getvalue())
        tar.addfile(info, buf)
    monkeypatch.setenv("SELECTINFER_LLAMA_SDIST", str(fake))
    monkeypatch.setenv("SELECTINFER_CACHE_DIR", str(tmp_path / "cache"))
    with pytest.raises(src.SourceError, match="sha256"):
        src.patched_tree(tmp_path / "no-patches")
    assert not any((tmp_path / "cache").glob("llama.cpp-*")), "no partial tree may be left behind"


def test_a_source_folder_replaces_the_sdist(tmp_path, monkeypatch):
    """--export-pruned writes the unpatched tree without what the engine's build does not read;
    SELECTINFER_LLAMA_SOURCE builds from such a folder (a machine without the sdist), cached apart."""
    monkeypatch.delenv("SELECTINFER_LLAMA_SOURCE", raising=False)
    pruned = tmp_path / "llama-src"
    src.export_pruned(pruned)
    assert (pruned / "CMakeLists.txt").exists() and (pruned / "ggml" / "src" / "ggml-cuda" / "ggml-cuda.cu").exists()
    assert not (pruned / "models").exists() and not (pruned / "ggml" / "src" / "ggml-vulkan").exists()
    assert not (pruned / "ggml" / "src" / "ggml-cuda" / "ggml-cuda.cu").read_text().count("GGML_OP_SI_MUL_ROWS")
    size = sum(f.stat().st_size for f in pruned.rglob("*") if f.is_file())
    assert size < 40 * 2**20, size
    with pytest.raises(src.SourceError, match="not empty"):
        src.export_pruned(pruned)

    monkeypatch.setenv("SELECTINFER_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("SELECTINFER_LLAMA_SDIST", str(tmp_path / "no-such-sdist.tar.gz"))  # never read
    monkeypatch.setenv("SELECTINFER_LLAMA_SOURCE", str(pruned))
    tree = src.patched_tree(REPO / "ggml-patches")
    assert tree.name.endswith("-from-source")
    assert "GGML_OP_SI_MUL_ROWS" in (tree / "ggml" / "src" / "ggml-cuda" / "ggml-cuda.cu").read_text()

    monkeypatch.setenv("SELECTINFER_LLAMA_SOURCE", str(tmp_path / "nothing-here"))
    with pytest.raises(src.SourceError, match="--export-pruned"):
        src.patched_tree(tmp_path / "other-patches")


def test_installed_build_used_the_current_series():
    """The cached tree for this checkout's ggml-patches/ exists and lists exactly its patches."""
    series = src.patch_series(REPO / "ggml-patches")
    tree = src.cache_root() / f"llama.cpp-{src.SDIST_VERSION}-{src.series_digest(series)}"
    stamp = tree / ".selectinfer-complete"
    assert stamp.exists(), f"{tree} missing: was the package built from this checkout?"
    assert stamp.read_text().split() == [p.name for p in series]
    assert (tree / "include" / "llama.h").exists()


def fake_compiler(path: Path, native_macros: str) -> str:
    """A compiler whose `-march=native` preprocessor output is `native_macros`."""
    path.write_text(f"#!/bin/sh\nif [ \"$1\" = --version ]; then echo 'fake 1.0'; else echo '{native_macros}'; fi\n")
    path.chmod(0o755)
    return str(path)


def test_compiler_cache_is_one_per_cpu(tmp_path, monkeypatch):
    """Objects built with -march=native on one CPU are never found by a build on another
    (ccache hashes the flag's words only); the same compiler on the same CPU shares one cache."""
    monkeypatch.setenv("SELECTINFER_CACHE_DIR", str(tmp_path / "cache"))
    avx2 = fake_compiler(tmp_path / "cc-avx2", "#define __AVX2__ 1")
    avx512 = fake_compiler(tmp_path / "cc-avx512", "#define __AVX2__ 1\n#define __AVX512F__ 1")
    avx2_again = fake_compiler(tmp_path / "cc-avx2-again", "#define __AVX2__ 1")
    folders = [src.compiler_cache_dir(c) for c in (avx2, avx512, avx2_again)]
    assert folders[0] != folders[1] and folders[0] == folders[2]
    assert all(f.is_dir() and f.parent == tmp_path / "cache" / "ccache" for f in folders)


def test_ccache_launcher_only_where_it_can_work(tmp_path, monkeypatch):
    monkeypatch.setenv("SELECTINFER_CACHE_DIR", str(tmp_path / "cache"))
    compiler = fake_compiler(tmp_path / "cc", "#define __AVX2__ 1")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "ccache").write_text("#!/bin/sh\n")
    (bin_dir / "ccache").chmod(0o755)
    monkeypatch.setenv("PATH", str(bin_dir))
    launcher = src.ccache_launcher(compiler)
    assert launcher[0] == "env" and launcher[-1] == str(bin_dir / "ccache")
    assert f"CCACHE_DIR={src.compiler_cache_dir(compiler)}" in launcher
    assert src.ccache_launcher(str(tmp_path / "no-such-compiler")) == []
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert src.ccache_launcher(compiler) == [], "no ccache installed: compile directly"
