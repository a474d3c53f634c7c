"""Where selectinfer keeps downloaded and derived files."""
from __future__ import annotations

import hashlib
import os
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator


def cache_dir() -> Path:
    """$SELECTINFER_CACHE_DIR, else $XDG_CACHE_HOME/selectinfer, else ~/.cache/selectinfer.

    The build (cmake/llama_cpp_source.py) follows the same rule for the llama.cpp source.
    """
    if os.environ.get("SELECTINFER_CACHE_DIR"):
        return Path(os.environ["SELECTINFER_CACHE_DIR"])
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(xdg) / "selectinfer"


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def check_writable_file(path: str | os.PathLike) -> Path:
    """`path` as a file to write: refused at once where it is a folder, or its folder is missing or
    not writable (before any long work that would end in writing it)."""
    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(f"cannot write {path}: it is a folder; give a file path, e.g. {path / 'model.si.gguf'}")
    if not path.parent.is_dir() or not os.access(path.parent, os.W_OK):
        raise PermissionError(f"cannot write {path}: folder {path.parent} does not exist or is not writable")
    return path


@contextmanager
def atomic_path(final: str | os.PathLike) -> Iterator[Path]:
    """A temporary path beside `final` that becomes `final` only when the block succeeds.

    Readers never see a half-written file, and a failure leaves nothing behind.
    """
    final = check_writable_file(final)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{final.name}.", suffix=".tmp", dir=final.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        yield tmp
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600 files; give the usual permissions
        os.replace(tmp, final)
    finally:
        tmp.unlink(missing_ok=True)


def sha256_file(path: str | os.PathLike) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
