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


def test_the_commit_is_the_one_the_engine_was_built_from():
    """A build from a git checkout records its commit (git describe, "-dirty" with uncommitted
    changes): a commit this repository holds."""
    import re

    commit = provenance.source_commit()
    if commit is None:
        assert selectinfer._native.BUILD_COMMIT == ""
        return
    match = re.fullmatch(r"([0-9a-f]{7,40})(-dirty)?", commit)
    assert match, commit
    root = Path(__file__).resolve().parents[1]
    known = subprocess.run(["git", "-C", str(root), "cat-file", "-e", match.group(1) + "^{commit}"], capture_output=True)
    assert known.returncode == 0, f"{commit} is not a commit of {root}"
