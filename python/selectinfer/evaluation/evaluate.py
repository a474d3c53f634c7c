"""selectinfer eval: a grid of configurations x tasks from one source model, with memory, speed and
accuracy in one run, written as results.json, results.md and PNG plots.

Configurations (all made from the source model, cached in OUT/models/):
  original           the model as given;
  quantized          its weights in other types (F16, Q8_0, Q4_0, Q4_K_M) with the tree's quantizer;
  selectinfer        SelectInfer files at each gamma (profile ranking), every loaded neuron computed
                     (loaded-only) and at each phi in [delta, gamma], by each selection rule
                     (SELECTION_RULES: frequency by value or magnitude, sum-magnitude, fixed,
                     gate-guided, predicted: the files then carry a gate predictor, --predictor-rank);
                     also built from the quantized files (--si-quants);
  coreinfer          gamma 1, delta 0 (every neuron loaded, the whole choice per prompt) at each phi;
  random             random loading at the middle gamma, loaded-only and at the middle phi.

Each configuration's tasks run in a child process of its own (its peak RSS is the configuration's);
speed is measured afterwards with every configuration loaded side by side, in interleaved rounds
(medians), as `selectinfer bench` does. Accuracy comes with n and a bootstrap 95% interval, and a
paired difference against the original model on the same examples (metrics.py).
"""
from __future__ import annotations

import itertools
import os
import sys
from dataclasses import asdict
from pathlib import Path

import numpy as np

from .. import _native
from ..method.convert import DEFAULT_STATIC_RATIO as DEFAULT_DELTA
from ..method.prepare import budget_workload, prepare
from ..method.tasks import format_prompt, load_dataset, sample_examples
from ..runtime import child_run
from ..runtime.child_run import Config, RunRequest
from ..runtime.si_format import key
from ..runtime.model import SELECTION_RULES, STEP_STRATEGIES
from . import metrics
from .provenance import cpu_features, cpu_name, provenance

# task -> (built-in data set, tokens generated per example; None: scored, not generated)
TASKS = {
    "qa": ("capitals-qa", 16),
    "translation": ("de-en", 48),
    "summarization": ("botchan-summ", 64),
    "text": ("botchan", None),
}
QUANT_TYPES = ("F16", "Q8_0", "Q4_0", "Q4_K_M")
FLOAT_TYPES = ("F32", "F16", "BF16")


# --- configurations ------------------------------------------------------------------------------
def file_type_name(path: str | os.PathLike) -> str:
    """The weight type a GGUF declares (general.file_type), e.g. Q4_1, Q4_K_M, F16."""
    from gguf import LlamaFileType

    header = _native.read_gguf_header(str(path))
    try:
        return LlamaFileType(int(header["kv"]["general.file_type"])).name.removeprefix("MOSTLY_").removeprefix("ALL_")
    except (KeyError, ValueError):  # not declared: the type of the most weight bytes
        from gguf import GGMLQuantizationType

        by_type: dict[int, int] = {}
        for t in header["tensors"]:
            by_type[t["type"]] = by_type.get(t["type"], 0) + t["nbytes"]
        return GGMLQuantizationType(max(by_type, key=by_type.get)).name if by_type else "?"


def _made(path: Path, make, inputs: list[Path]) -> Path:
    """path, made by make(path) unless a previous run made it after its inputs changed last (the
    writers are atomic: a file that exists is whole)."""
    if not path.exists() or any(p.stat().st_mtime > path.stat().st_mtime for p in inputs):
        path.parent.mkdir(parents=True, exist_ok=True)
        make(path)
    return path


def _phis_within(phis, gamma: float, delta: float) -> list[float]:
    return [phi for phi in phis if delta - 1e-6 <= phi <= gamma + 1e-6 and abs(phi - gamma) > 1e-6]


def selectinfer_configs(path: Path, family: str, gamma: float, delta: float, phis, select_by, weight_type: str,
                        loaded_only: bool = True, layer_budgets=("uniform",), compensation=("on",)) -> list[Config]:
    name = path.stem
    out = [Config(f"{name} loaded-only", family, str(path), {"dense": True}, weight_type, gamma)] if loaded_only else []
    extra = {"coreinfer": True} if family == "coreinfer" else {}
    for phi in _phis_within(phis, gamma, delta):
        for by in select_by:
            for budgets, comp in itertools.product(layer_budgets, compensation):
                if comp == "off" and by not in STEP_STRATEGIES:
                    continue  # (the prompt's choice has nothing to compensate)
                # uniform and on, the engine's defaults: labels without a suffix
                settings = {"layer_budgets": budgets} if budgets != "uniform" else {}
                suffix = "" if budgets == "uniform" else f" {budgets} budgets"
                if comp == "off":
                    settings["compensate"] = False
                    suffix += " uncompensated"
                out.append(Config(f"{name} phi {phi} {by}{suffix}", family, str(path),
                                  {"compute_ratio": phi, **SELECTION_RULES[by], **settings, **extra}, weight_type,
                                  gamma, phi, by if comp == "on" else f"{by} uncompensated"))
    return out


def build_configs(source: Path, out_dir: Path, *, profile: Path | None, task: str, gammas, phis, select_by,
                  quants, si_quants, delta: float = DEFAULT_DELTA, baselines: bool = True,
                  predictor_rank: int = 0, layer_budgets=("uniform",), compensation=("on",),
                  progress: bool = True) -> list[Config]:
    """Every configuration of the grid, its files made (or reused) under out_dir/models; delta: the
    static ratio of the SelectInfer files (their names carry it when it is not the default);
    predictor_rank: the main grid's files carry a gate predictor of that rank (names: pR);
    layer_budgets: the main grid's configurations at each phi with each of these ("uniform", "profile");
    compensation: "on" (the engine's default: dropped-neuron compensation where the file has the
    gate statistics) and/or "off", for the rules whose decode steps choose (STEP_STRATEGIES)."""
    from ..method.convert import convert
    from ..runtime.registry import quantize

    models = out_dir / "models"
    source_type = file_type_name(source)
    inputs = [source] + ([profile] if profile else [])
    configs = [Config(f"{source.stem} (original)", "original", str(source), {}, source_type)]

    def quantized(qtype: str) -> Path:
        # a quantized source is widened to F16 first, and every other type made from that
        base = source if qtype == "F16" or source_type in FLOAT_TYPES else quantized("F16")
        return _made(models / f"{source.stem}.{qtype}.gguf", lambda p: quantize(base, p, qtype), [base])

    for qtype in quants:
        if qtype != source_type:
            configs.append(Config(quantized(qtype).stem, "quantized", str(quantized(qtype)), {}, qtype))

    def si_file(base: Path, gamma: float, static: float, ranking: str, tag: str, rank: int = 0) -> Path:
        def make(p: Path) -> None:
            convert(base, p, profile=profile if ranking == "profile" else None, task=task if ranking == "profile" else None,
                    load_ratio=gamma, static_ratio=static, ranking=ranking, progress=progress,
                    check_profile_source=base == source, predictor_rank=rank)
        return _made(models / f"{base.stem}.{tag}.gguf", make, [base] + inputs)

    def tag(prefix: str, gamma: float) -> str:
        return (f"{prefix}{round(100 * gamma)}" + ("" if abs(delta - DEFAULT_DELTA) < 1e-9 else f"d{round(100 * delta)}")
                + (f"p{predictor_rank}" if predictor_rank else ""))

    ranking = "profile" if profile else "random"
    for gamma in gammas:
        path = si_file(source, gamma, delta, ranking, tag("si", gamma), predictor_rank)
        configs += selectinfer_configs(path, "selectinfer", gamma, delta, phis, select_by, source_type,
                                       layer_budgets=layer_budgets, compensation=compensation)
    mid_gamma = sorted(gammas)[len(gammas) // 2]
    for qtype in si_quants:
        if qtype == source_type:
            continue  # the main grid
        path = si_file(quantized(qtype), mid_gamma, delta, ranking, tag("si", mid_gamma), predictor_rank)
        configs += selectinfer_configs(path, "selectinfer", mid_gamma, delta, phis, select_by[:1], qtype)
    if baselines:
        path = si_file(source, 1.0, 0.0, ranking, "coreinfer")
        configs += selectinfer_configs(path, "coreinfer", 1.0, 0.0, phis, select_by[:1], source_type,
                                       loaded_only=False)
        if ranking == "profile":  # random loading against the profile's choice, at the middle point
            path = si_file(source, mid_gamma, delta, "random", tag("random", mid_gamma))
            mid_phi = sorted(phis)[len(phis) // 2]
            configs += selectinfer_configs(path, "random", mid_gamma, delta, [mid_phi], select_by[:1], source_type)
    return configs


# --- tasks (run in a child process per configuration) ---------------------------------------------
def task_examples(task: str, n: int) -> list[dict]:
    return sample_examples(load_dataset(TASKS[task][0], "eval").examples, n)


def _generate(model, example: dict, max_tokens: int) -> str:
    chat = model.metadata("tokenizer.chat_template") is not None
    text, special = format_prompt(example, chat, lambda msgs: model.engine.apply_chat_template(msgs, True))
    prompt = model.tokenize(text, True, special)
    return model.generate(prompt, max_tokens, temperature=0, stop=None if chat else "\n")


def _continuation_nll(model, example: dict, max_tokens: int) -> tuple[float, int]:
    """Negative log-likelihood of a passage's second half after its first half as the prompt,
    scored one decode step at a time (the prompt selects), and the number of tokens scored."""
    tokens = model.tokenize(example["text"])[: max_tokens]
    _, logprobs = model.token_logprobs(tokens, n_prompt=len(tokens) // 2)
    return -float(logprobs.sum()), len(logprobs)


def prepared_config(source: Path, out_dir: Path, budget: str, task: str, profile: Path | None, n_ctx: int,
                    n_threads: int, progress: bool) -> Config:
    """The SelectInfer file `selectinfer prepare` fits to the budget (made once, then reused)."""
    path = out_dir / "models" / f"{source.stem}.prepared-{budget}-ctx{n_ctx}.gguf"
    _made(path, lambda p: prepare(source, p, task=task, memory_budget=budget, n_ctx=n_ctx, n_threads=n_threads,
                                  profile=profile, progress=progress), [source] + ([profile] if profile else []))
    gamma = float(_native.read_gguf_header(str(path))["kv"][key("load_ratio")])
    return Config(f"prepared to {budget} (gamma {gamma:.3f})", "prepared", str(path), {}, file_type_name(source),
                  gamma=gamma)


def run_tasks(model, req: RunRequest) -> dict:
    """Per task of the request, the generations or token NLLs of each example (in the child)."""
    records: dict = {}
    for task in req.tasks:
        examples = task_examples(task, req.n)
        max_tokens = TASKS[task][1]
        if max_tokens is None:
            scored = [_continuation_nll(model, ex, req.n_ctx // 2) for ex in examples]
            records[task] = {"nll": [s[0] for s in scored], "n_tokens": [s[1] for s in scored]}
        else:
            records[task] = {"outputs": [_generate(model, ex, max_tokens) for ex in examples]}
        records[task]["ids"] = [ex["id"] for ex in examples]
    return records


def run_in_child(req: RunRequest, runs: Path) -> dict:
    """child_run.run_in_child with this module's tasks in the child; a request without tasks runs in
    child_run's own process, the one `prepare` measures a file's peak in (a few MiB lighter)."""
    return child_run.run_in_child(req, runs, module=__name__ if req.tasks else child_run.__name__)


# --- metrics ---------------------------------------------------------------------------------------
def _statistics(task: str, records: dict, examples: list[dict], reference_outputs: list[str] | None) -> dict:
    """{metric: statistic(indices)} for one configuration's records of a task."""
    if task == "text":
        nll, counts = np.array(records["nll"]), np.array(records["n_tokens"])
        return {"perplexity": lambda idx: metrics.perplexity(nll, counts, idx)}
    outputs = records["outputs"]
    if task == "qa":
        per = {name: np.array([fn(o, ex["answers"]) for o, ex in zip(outputs, examples)])
               for name, fn in (("exact_match", metrics.exact_match), ("f1", metrics.token_f1),
                                ("contains", metrics.contains_answer))}
        return {name: (lambda idx, v=v: float(v[idx].mean())) for name, v in per.items()}
    if task == "translation":
        hyps = [metrics.answer_span(o) for o in outputs]
        refs = [ex["reference"] for ex in examples]
        return {kind: metrics.corpus_statistic(kind, hyps, refs) for kind in ("bleu", "chrf")}
    if task == "summarization":
        out = {}
        if all("reference" in ex for ex in examples):
            v = metrics.rouge_l(outputs, [ex["reference"] for ex in examples])
            out["rouge_l"] = lambda idx: float(v[idx].mean())
        if reference_outputs is not None:  # against the original model's summaries: fidelity
            f = metrics.rouge_l(outputs, reference_outputs)
            out["rouge_l_vs_original"] = lambda idx: float(f[idx].mean())
        return out
    raise ValueError(f"unknown task {task}")


def score(configs: list[Config], records: list[dict], tasks: list[str], n: int,
          n_bootstrap: int = metrics.N_BOOTSTRAP) -> list[dict]:
    """Per configuration and task: every metric with its interval, and its paired difference against
    the first configuration (the original model) on the same examples and resamples."""
    base = records[0]
    results = [{"accuracy": {}, "vs_original": {}} for _ in configs]
    if "_error" in base:
        return results
    for task in tasks:  # the examples, resamples and the original's statistics once per task
        examples = task_examples(task, n)
        draws = metrics.resamples(len(examples), n_bootstrap)
        ref_outputs = base[task].get("outputs") if task == "summarization" else None
        theirs = _statistics(task, base[task], examples, ref_outputs)
        for i, (rec, entry) in enumerate(zip(records, results)):
            if "_error" in rec:
                continue
            mine = theirs if i == 0 else _statistics(task, rec[task], examples, ref_outputs)
            for name, stat in mine.items():
                key = f"{task}.{name}"
                entry["accuracy"][key] = metrics.bootstrap(stat, len(examples), draws).as_dict()
                if i > 0 and name in theirs:
                    entry["vs_original"][key] = metrics.paired_difference(theirs[name], stat, len(examples),
                                                                          draws).as_dict()
    return results


# --- speed ------------------------------------------------------------------------------------------
def read_bytes(config: Config) -> int:
    """Weight bytes one decode step of the configuration reads (bench.bytes_read_per_token)."""
    from .bench import bytes_read_per_token

    return bytes_read_per_token(config.path, config.phi, config.model_kwargs.get("strategy"),
                                config.model_kwargs.get("layer_budgets", "uniform"))


def measure_speed(configs: list[Config], read: list[int], n_prompt: int, n_gen: int, rounds: int,
                  n_threads: int) -> list[dict]:
    """Prefill and decode tokens/s of every configuration (read: its bytes read per token), loaded
    side by side, interleaved rounds (medians)."""
    from .bench import BenchConfig, run_configs

    bench = [BenchConfig(c.label, c.path, c.model_kwargs, r) for c, r in zip(configs, read)]
    results = run_configs(bench, n_prompt=n_prompt, n_gen=n_gen, repeats=rounds, n_threads=n_threads)
    return [{"prefill_tokens_per_s": r.prefill_median, "decode_tokens_per_s": r.decode_median} for r in results]


# --- the whole run ------------------------------------------------------------------------------------
def cpu_description() -> str:
    """The CPU's model name and the features ggml uses on it (selectinfer info)."""
    return f"{cpu_name() or 'unknown CPU'} ({', '.join(cpu_features())}; {os.cpu_count()} hardware threads)"


def _ram_bytes() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def run_eval(source: Path, out_dir: Path, *, profile: Path | None = None, task: str = "qa",
             gammas=(0.5, 0.7, 0.9), phis=(0.3, 0.4, 0.5), select_by=("value", "magnitude"), quants=QUANT_TYPES,
             si_quants=("Q4_0", "Q8_0"), delta: float = DEFAULT_DELTA, baselines: bool = True, tasks=tuple(TASKS),
             n: int = 40, n_threads: int = 0,
             speed_rounds: int = 3, n_prompt: int = 64, n_gen: int = 32, n_bootstrap: int = metrics.N_BOOTSTRAP,
             n_ctx: int = 2048, memory_limit_bytes: int | None = None, repack: bool = True,
             argv: list[str] | None = None, prepare_budget: str | None = None, predictor_rank: int = 0, layer_budgets=("uniform",),
             compensation=("on",), progress: bool = True) -> tuple[dict, list[Path]]:
    """Builds the grid's files, runs every configuration in a child process of its own (tasks; speed
    too where it is not interleaved), the interleaved speed rounds, and writes the report; returns
    it and the files written.

    Speed is measured with every configuration loaded side by side in interleaved rounds when their
    files fit in half the RAM together; otherwise, and always under memory_limit_bytes (each
    configuration as on a device with that much memory: cgroup, its file evicted from the page
    cache first; one larger than the limit runs from disk, llama.cpp's mmap offloading), each
    configuration's child times its own rounds. repack=False keeps every weight in the mapped file
    (ggml's repacked copies are anonymous memory, which a memory limit cannot page out).
    prepare_budget (e.g. "200M"): also the SelectInfer file `selectinfer prepare` fits to that
    budget at n_ctx, run under a memory limit equal to the budget with the workload its peak was
    measured with (prepare.budget_workload), counting the pages read again from disk while timed
    (none when it fits). argv: the command's arguments, for the report's provenance (default
    sys.argv[1:])."""
    from tqdm import tqdm

    from .eval_report import write_report

    unknown = [t for t in tasks if t not in TASKS]
    if unknown:
        raise ValueError(f"unknown task(s) {', '.join(unknown)}; tasks: {', '.join(TASKS)}")
    if tasks and n < 2:
        raise ValueError(f"n must be at least 2 examples per task (bootstrap intervals), got {n}")
    if speed_rounds < 0:
        raise ValueError(f"speed_rounds must be >= 0, got {speed_rounds}")
    out_dir.mkdir(parents=True, exist_ok=True)
    configs = build_configs(source, out_dir, profile=profile, task=task, gammas=list(gammas), phis=list(phis),
                            select_by=list(select_by), quants=list(quants), si_quants=list(si_quants),
                            delta=delta, baselines=baselines, predictor_rank=predictor_rank,
                            layer_budgets=list(layer_budgets), compensation=list(compensation), progress=progress)
    from ..method.convert import parse_size

    limits = {}  # configuration label -> its own memory limit
    if prepare_budget:
        prepared = prepared_config(source, out_dir, prepare_budget, task, profile, n_ctx, n_threads, progress)
        configs.append(prepared)
        limits[prepared.label] = parse_size(prepare_budget)
    if not repack:
        for c in configs:
            c.model_kwargs["repack"] = False
    total_bytes = sum(Path(p).stat().st_size for p in {c.path for c in configs})
    interleaved = speed_rounds > 0 and memory_limit_bytes is None and total_bytes < _ram_bytes() // 2
    speed = ({"n_prompt": n_prompt, "n_gen": n_gen, "rounds": speed_rounds}
             if speed_rounds > 0 and not interleaved else None)
    runs = out_dir / "runs"
    runs.mkdir(exist_ok=True)
    records = []
    for config in tqdm(configs, desc="configurations", disable=not progress):
        if config.label not in limits:
            req = RunRequest(config, list(tasks), n, n_threads, n_ctx, speed, memory_limit_bytes)
            records.append(run_in_child(req, runs) if tasks or speed or memory_limit_bytes else {})
            continue
        # a prepared file: its tasks as every configuration's, then, in a process of its own under
        # a limit equal to its budget, the workload its peak was fitted to (memory, speed, paging)
        rec = run_in_child(RunRequest(config, list(tasks), n, n_threads, n_ctx), runs) if tasks else {}
        check = run_in_child(RunRequest(config, [], 0, n_threads, n_ctx,
                                        {**budget_workload(n_ctx), "rounds": max(1, speed_rounds)},
                                        limits[config.label]), runs)
        records.append({**rec, **{k: v for k, v in check.items() if k.startswith("_")}})
    scores = score(configs, records, list(tasks), n, n_bootstrap) if tasks else [{} for _ in configs]
    read = [read_bytes(c) for c in configs]
    speeds = [rec.get("_speed", {}) for rec in records]
    if interleaved:  # side by side, but for the configurations timed under a limit of their own
        shared = [i for i, c in enumerate(configs) if c.label not in limits]
        measured = measure_speed([configs[i] for i in shared], [read[i] for i in shared], n_prompt, n_gen,
                                 speed_rounds, n_threads)
        for i, sp in zip(shared, measured):
            speeds[i] = sp
    rows = []
    for config, rec, sc, sp, r in zip(configs, records, scores, speeds, read):
        row = {**asdict(config), "model_bytes": Path(config.path).stat().st_size,
               "read_bytes_per_token": r, "peak_rss_bytes": rec.get("_peak_rss_bytes"),
               "cgroup_peak_bytes": rec.get("_cgroup_peak_bytes"), "major_faults_timed": rec.get("_major_faults_timed"),
               "memory_limit_bytes": limits.get(config.label, memory_limit_bytes), **sp, **sc}
        if "_error" in rec:
            row["error"] = rec["_error"]
        rows.append(row)
    origin = provenance(n_threads, argv)
    report = {"provenance": origin,
              "meta": {"source": source.name, "cpu": cpu_description(), "threads": n_threads or os.cpu_count(),
                       "command": origin["command"], "tasks": list(tasks), "n": n, "n_bootstrap": n_bootstrap,
                       "profile": str(profile) if profile else None, "profile_task": task,
                       "memory_limit_bytes": memory_limit_bytes, "repack": repack,
                       "speed": {"rounds": speed_rounds, "n_prompt": n_prompt, "n_gen": n_gen,
                                 "mode": "interleaved" if interleaved else "per process" if speed else "none"}},
              "configurations": rows}
    return report, write_report(report, out_dir)


if __name__ == "__main__":
    sys.exit(child_run.child_main(sys.argv[1], sys.argv[2], run_tasks))
