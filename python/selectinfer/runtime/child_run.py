"""A model run in a child process of its own (its peak RSS is the run's), under a memory limit if
asked: how `selectinfer prepare` measures a file and `selectinfer eval` runs each configuration."""
from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

from .memlimit import run_limited
from .model import Model
from .paths import atomic_path
from .timing import one_run, prompt_tokens


@dataclass
class Config:
    label: str
    family: str  # original, quantized, selectinfer, coreinfer, random
    path: str
    model_kwargs: dict = field(default_factory=dict)
    weight_type: str = ""
    gamma: float | None = None
    phi: float | None = None  # None: every loaded neuron
    select_by: str | None = None


@dataclass
class RunRequest:
    """What one child process does for one configuration."""
    config: Config
    tasks: list[str]
    n: int
    n_threads: int = 0
    n_ctx: int = 2048
    speed: dict | None = None  # {"n_prompt", "n_gen", "rounds"}: timed in this process (not interleaved)
    memory_limit_bytes: int | None = None  # run under a cgroup memory limit (memlimit.py)


# run_tasks(model, request) -> {task: records}: the tasks of a request (evaluation.evaluate's)
TaskRunner = Callable[[Model, RunRequest], dict]


def run_config(req: RunRequest, run_tasks: TaskRunner | None = None) -> dict:
    """The records of one configuration: run_tasks' records of req.tasks; the peak RSS; with
    req.speed, prefill and decode tokens/s (medians of the rounds)."""
    import resource
    import statistics

    if req.tasks and run_tasks is None:
        raise ValueError(f"tasks {req.tasks} given without a task runner")
    records: dict = {}
    with Model(req.config.path, n_ctx=req.n_ctx, n_threads=req.n_threads, **req.config.model_kwargs) as model:
        if req.tasks:
            records.update(run_tasks(model, req))
        if req.speed:
            prompt = prompt_tokens(model, req.speed["n_prompt"])
            one_run(model, prompt, 4)  # warm-up: page in the weights
            faults = resource.getrusage(resource.RUSAGE_SELF).ru_majflt
            runs = [one_run(model, prompt, req.speed["n_gen"]) for _ in range(req.speed["rounds"])]
            records["_speed"] = {"prefill_tokens_per_s": statistics.median(r[0] for r in runs),
                                 "decode_tokens_per_s": statistics.median(r[1] for r in runs)}
            # pages read from disk again while timed: a model that fits its memory reads none
            records["_major_faults_timed"] = resource.getrusage(resource.RUSAGE_SELF).ru_majflt - faults
        records["_peak_rss_bytes"] = model.stats()["peak_rss_bytes"]
    return records


def run_in_child(req: RunRequest, runs: Path, module: str = __name__) -> dict:
    """run_config in a fresh Python process (its peak RSS is this configuration's), under the
    request's memory limit if any; the child is `python -m module`, a module that runs child_main
    (this one: no tasks; evaluation.evaluate: with its tasks). The records are kept in `runs` under
    a digest of the request and of the model file, and reused by a later run. A failure is recorded
    as {"_error": message}."""
    request = json.dumps(asdict(req), sort_keys=True)
    stat = Path(req.config.path).stat()
    key = hashlib.sha256(f"{request}|{stat.st_size}|{stat.st_mtime_ns}".encode()).hexdigest()[:20]
    out_json, request_json = runs / f"{key}.json", runs / f"{key}.request.json"
    if out_json.exists():
        return json.loads(out_json.read_text())
    with atomic_path(request_json) as tmp:
        tmp.write_text(request)
    cmd = [sys.executable, "-m", module, str(request_json), str(out_json)]
    if req.memory_limit_bytes:
        done = run_limited(cmd, req.memory_limit_bytes, evict=[req.config.path])
        peak = done.peak_bytes
    else:
        done, peak = subprocess.run(cmd, text=True, capture_output=True), None
    if done.returncode != 0:
        tail = (done.stderr or "").strip().splitlines()[-1:] or [f"exit status {done.returncode}"]
        if done.returncode < 0 and req.memory_limit_bytes:
            tail = [f"killed by signal {-done.returncode} under the memory limit"]
        return {"_error": tail[0]}
    records = json.loads(out_json.read_text())
    if peak is not None:
        records["_cgroup_peak_bytes"] = peak
        out_json.write_text(json.dumps(records))
    return records


def child_main(request_json: str, out_json: str, run_tasks: TaskRunner | None = None) -> int:
    raw = json.loads(Path(request_json).read_text())
    req = RunRequest(**{**raw, "config": Config(**raw["config"])})
    records = run_config(req, run_tasks)
    with atomic_path(Path(out_json)) as tmp:
        Path(tmp).write_text(json.dumps(records))
    return 0


if __name__ == "__main__":
    sys.exit(child_main(sys.argv[1], sys.argv[2]))
