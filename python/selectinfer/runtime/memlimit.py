"""Run a command as if on a device with less memory: a child process under a memory limit of the
OS's memory controller (cgroup v2's `memory.max`, or v1's `memory.limit_in_bytes` where that is
what the machine has; swap is limited too where the kernel offers it). A model larger than the
limit then runs from its file with mmap, its weights paged in from disk at every step: llama.cpp's
disk offloading, the baseline a SelectInfer file that fits is compared with.

Needs write access to the cgroup hierarchy (root, or a delegated cgroup); otherwise
MemoryLimitError says so and how to get it.
"""
from __future__ import annotations

import os
import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")


class MemoryLimitError(RuntimeError):
    """The machine does not let this process limit a child's memory; the message says why."""


@dataclass
class LimitedRun:
    returncode: int
    stdout: str
    stderr: str
    wall_s: float
    peak_bytes: int | None  # the cgroup's peak usage (page cache included), where the kernel reports it
    limit_bytes: int


def _controller(root: Path) -> tuple[str, Path]:
    """("v2", parent) or ("v1", parent): where a child cgroup with a memory limit can be made."""
    controllers = root / "cgroup.controllers"
    if controllers.is_file() and "memory" in controllers.read_text().split():
        return "v2", root
    if (root / "memory" / "memory.limit_in_bytes").is_file():
        return "v1", root / "memory"
    raise MemoryLimitError(f"no cgroup memory controller under {root} (cgroup v2 with the memory controller, "
                           f"or v1's memory hierarchy, is needed to limit a process's memory)")


class _Cgroup:
    def __init__(self, root: Path, limit_bytes: int):
        self.version, parent = _controller(root)
        self.path = parent / f"selectinfer-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        try:
            self.path.mkdir()
        except PermissionError:
            raise MemoryLimitError(f"cannot create a cgroup in {parent}: limiting memory needs root or a delegated "
                                   f"cgroup (e.g. `sudo`, or `systemd-run --user --scope -p MemoryMax=...`)") from None
        try:
            if self.version == "v2":
                self._write("memory.max", limit_bytes)
                if (self.path / "memory.swap.max").exists():
                    self._write("memory.swap.max", 0)
            else:
                self._write("memory.limit_in_bytes", limit_bytes)
                if (self.path / "memory.memsw.limit_in_bytes").exists():  # memory + swap: no swap at all
                    self._write("memory.memsw.limit_in_bytes", limit_bytes)
        except OSError:
            self.remove()
            raise

    def _write(self, name: str, value: int | str) -> None:
        (self.path / name).write_text(str(value))

    def procs_file(self) -> str:
        return str(self.path / "cgroup.procs")

    def peak_bytes(self) -> int | None:
        for name in ("memory.peak", "memory.max_usage_in_bytes"):
            f = self.path / name
            if f.is_file():
                return int(f.read_text().split()[0])
        return None

    def remove(self) -> None:
        for _ in range(50):  # the kernel frees a cgroup shortly after its last process exits
            try:
                self.path.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError:
                time.sleep(0.1)


def evict_from_page_cache(path: str | os.PathLike) -> None:
    """Drops a file's clean pages from the page cache. A page already cached is charged to the
    cgroup that read it first, not to the limited child: evicting the model file first makes its
    pages count against the limit as they would on a device that never had them in memory."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def run_limited(cmd: list[str], limit_bytes: int, timeout_s: float | None = None,
                root: Path = CGROUP_ROOT, evict: list[str | os.PathLike] = ()) -> LimitedRun:
    """Runs `cmd` in a child process whose memory (anonymous and page cache) may not exceed
    limit_bytes, after evicting the files `evict` (the model) from the page cache; returns its
    output, wall time and the cgroup's peak usage."""
    if limit_bytes <= 0:
        raise ValueError(f"the memory limit must be positive, got {limit_bytes}")
    group = _Cgroup(root, limit_bytes)
    for path in evict:
        evict_from_page_cache(path)
    procs = group.procs_file()

    def join_group() -> None:  # in the child, before exec: everything it runs is limited
        with open(procs, "w") as f:
            f.write(str(os.getpid()))

    try:
        t0 = time.monotonic()
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, preexec_fn=join_group)
        except subprocess.SubprocessError as e:
            if isinstance(e, subprocess.TimeoutExpired):
                raise
            raise MemoryLimitError(f"could not move the child into {group.path}: {e}") from None
        wall = time.monotonic() - t0
        return LimitedRun(p.returncode, p.stdout, p.stderr, wall, group.peak_bytes(), limit_bytes)
    finally:
        group.remove()
