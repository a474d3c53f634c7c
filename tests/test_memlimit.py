"""Running under a memory limit (cgroup), as on a smaller device: the limit holds, the peak is
reported, and a machine that does not allow it says so."""
import subprocess
import sys

import pytest
from helpers import needs_cgroups, tool

from selectinfer.runtime.memlimit import CGROUP_ROOT, MemoryLimitError, run_limited

ALLOCATE = "import sys; b = bytearray(int(sys.argv[1]) * 2**20); b[::4096] = b'x' * len(b[::4096]); print('ok')"




@needs_cgroups
def test_the_limit_holds_and_the_peak_is_reported():
    small = run_limited([sys.executable, "-c", ALLOCATE, "64"], 512 * 2**20, timeout_s=120, evict=[__file__])
    assert small.returncode == 0 and small.stdout.strip() == "ok", small.stderr
    assert small.peak_bytes is None or 64 * 2**20 <= small.peak_bytes <= 512 * 2**20
    big = run_limited([sys.executable, "-c", ALLOCATE, "600"], 256 * 2**20, timeout_s=120)
    assert big.returncode == -9 and "ok" not in big.stdout  # killed by the kernel, not run to the end


@needs_cgroups
def test_the_cli_runs_a_command_under_a_limit():
    r = subprocess.run([tool("selectinfer"), "limit", "512M", "--", sys.executable, "-c", "print('inside')"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "inside", r.stderr
    assert "selectinfer limit: " in r.stderr and "of 0.50 GiB" in r.stderr
    r = subprocess.run([tool("selectinfer"), "limit", "128M", "--", sys.executable, "-c", ALLOCATE, "600"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 137 and "killed" in r.stderr


def test_without_a_memory_controller_the_error_says_why(tmp_path):
    with pytest.raises(MemoryLimitError, match="no cgroup memory controller"):
        run_limited([sys.executable, "-c", "pass"], 2**30, root=tmp_path)
    with pytest.raises(ValueError, match="must be positive"):
        run_limited([sys.executable, "-c", "pass"], 0, root=CGROUP_ROOT)
    r = subprocess.run([tool("selectinfer"), "limit", "1G"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "give the command to run after --" in r.stderr
