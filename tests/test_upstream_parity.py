"""Dense mode equals stock llama.cpp built from the same sdist (scripts/check_upstream_parity.py)."""
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def test_default_model_matches_stock_llama_cpp(default_model):
    if not (REPO / "build" / "upstream-venv" / "bin" / "python").exists():
        pytest.skip("stock llama.cpp not built: `make upstream` builds it (make test does)")
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "check_upstream_parity.py"), "--model",
                           str(default_model), "-n", "24"], capture_output=True, text=True, timeout=600)
    print(proc.stdout)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-2000:]
    assert proc.stdout.count("greedy tokens identical:  True") == 2  # flash attention off and on
    assert "PARITY OK" in proc.stdout  # and logits within 1e-4
