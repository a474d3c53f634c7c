"""The provenance record of result files (`selectinfer bench --json`, `selectinfer eval`)."""
import shlex
import subprocess
from datetime import datetime, timezone
from pathlib import Path

import selectinfer
from selectinfer.evaluation import provenance


def test_the_record_has_every_key_and_the_command_round_trips():
    argv = ["bench", "a model.gguf", "--json", "out.json", "-t", "2", "it's"]
    p = provenance.provenance(2, argv)
    assert set(p) == {"cpu", "cpu_features", "threads", "commit", "version", "command", "date"}
    assert p["command"].startswith("selectinfer ") and shlex.split(p["command"]) == ["selectinfer", *argv]
    assert p["threads"] == 2 and provenance.provenance(0, [])["threads"] is None  # 0: the engine's default
    assert p["version"] == selectinfer.__version__
    assert abs((datetime.now(timezone.utc) - datetime.fromisoformat(p["date"])).total_seconds()) < 60
    assert p["cpu_features"] == provenance.cpu_features() and all(isinstance(f, str) for f in p["cpu_features"])
    assert p["cpu"] is None or isinstance(p["cpu"], str) and p["cpu"]


def test_the_commit_is_the_checkouts_when_the_package_runs_from_one():
    root = Path(provenance.__file__).resolve().parents[3]
    if (root / "pyproject.toml").is_file() and (root / ".git").exists():  # python/selectinfer of a checkout
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True).stdout.strip()
        assert provenance.source_commit() == (head or None)
    else:  # installed
        assert provenance.source_commit() is None
