"""Where a result came from (the "provenance" key of `selectinfer bench --json` and `selectinfer eval`
results): CPU and its features, threads, source commit, version, command and date."""
from __future__ import annotations

import re
import shlex
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Sequence

from .. import _native
from .._version import __version__


def cpu_name() -> str | None:
    """The CPU's model name: /proc/cpuinfo's 'model name' (x86), else lscpu's 'Model name' (aarch64)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    for line in out.splitlines():
        if line.strip().startswith("Model name:"):
            return line.split(":", 1)[1].strip()
    return None


def cpu_features() -> list[str]:
    """The CPU features the engine's ggml build uses here (llama_print_system_info's `NAME = 1`)."""
    return re.findall(r"(\w+) = 1", _native.system_info())


def source_commit() -> str | None:
    """The commit the engine was built from ("-dirty": with uncommitted changes); None where the
    source was not a git checkout."""
    return _native.BUILD_COMMIT or None


def provenance(threads: int | None, argv: Sequence[str] | None = None) -> dict:
    """The provenance record; threads: the threads asked for (None: the engine's default); argv:
    the command's arguments (default sys.argv[1:])."""
    argv = sys.argv[1:] if argv is None else list(argv)
    return {"cpu": cpu_name(), "cpu_features": cpu_features(), "threads": threads or None,
            "commit": source_commit(), "version": __version__, "command": "selectinfer " + shlex.join(argv),
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds")}
