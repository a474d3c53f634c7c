"""selectinfer eval end to end on a tiny random model: the grid's files, the tasks in child
processes, intervals and paired differences, speed, and the report (JSON, markdown, plots).
Random weights: the numbers say nothing about accuracy; the test checks the bookkeeping."""
import json
import shlex
from pathlib import Path

import pytest
from helpers import needs_cgroups

from selectinfer.evaluation import eval_report, evaluate
from selectinfer.evaluation.bench import bytes_read_per_token
from selectinfer.runtime.si_format import key as si_key


@pytest.fixture(scope="module")
def report(tiny_model, tmp_path_factory):
    pytest.importorskip("sacrebleu")
    pytest.importorskip("rouge_score")
    out = tmp_path_factory.mktemp("eval")
    source = tiny_model("tiny-qwen2", "F32")
    report, written = evaluate.run_eval(
        source, out, gammas=[0.75], phis=[0.5], select_by=["value", "magnitude"], quants=["Q8_0"],
        si_quants=["Q8_0"], tasks=["qa", "translation", "summarization", "text"], n=3, n_threads=2,
        speed_rounds=1, n_prompt=8, n_gen=4, n_bootstrap=200, progress=False,
        argv=["eval", str(source), "-o", "an out dir"])
    return report, written, out


def test_the_grid(report):
    report, _, out = report
    rows = report["configurations"]
    families = [r["family"] for r in rows]
    assert families[0] == "original"
    assert families.count("quantized") == 1  # Q8_0
    # gamma 0.75: loaded-only and phi 0.5 by value and magnitude; the Q8_0 file: loaded-only and phi 0.5
    assert families.count("selectinfer") == 3 + 2
    assert families.count("coreinfer") == 1
    assert [r["label"] for r in rows if "error" in r] == []
    for r in rows[1:]:  # made from the source, under OUT/models
        assert Path(r["path"]).parent == out / "models"
    for r in rows:
        assert r["read_bytes_per_token"] == bytes_read_per_token(r["path"], r["phi"], r["model_kwargs"].get("strategy"))
    si = [r for r in rows if r["family"] == "selectinfer" and r["weight_type"] != "Q8_0"]
    loaded, selected = si[0], si[1]
    assert loaded["phi"] is None and selected["phi"] == 0.5
    assert selected["read_bytes_per_token"] < loaded["read_bytes_per_token"] < rows[0]["read_bytes_per_token"]
    assert loaded["model_bytes"] < rows[0]["model_bytes"]


def test_the_report_records_its_provenance(report):
    report, _, out = report
    saved = json.loads((out / "results.json").read_text())
    prov = saved["provenance"]
    assert set(prov) == {"cpu", "cpu_features", "threads", "commit", "version", "command", "date"}
    assert prov["threads"] == 2 and prov["command"] == report["meta"]["command"]
    assert shlex.split(prov["command"])[1:] == ["eval", report["configurations"][0]["path"], "-o", "an out dir"]


def test_intervals_and_paired_differences(report):
    report, _, _ = report
    rows = report["configurations"]
    keys = set(rows[0]["accuracy"])
    assert {"qa.exact_match", "qa.f1", "qa.contains", "translation.bleu", "translation.chrf",
            "summarization.rouge_l_vs_original", "text.perplexity"} <= keys
    # against itself, the original's summaries score 1
    assert rows[0]["accuracy"]["summarization.rouge_l_vs_original"]["value"] == pytest.approx(1.0)
    for r in rows:
        for key, e in r["accuracy"].items():
            assert e["n"] == 3 and e["low"] <= e["value"] + 1e-9 and e["value"] <= e["high"] + 1e-9, (r["label"], key)
        if r is rows[0]:
            assert r["vs_original"] == {}
            continue
        for key, d in r["vs_original"].items():  # the difference of the two point estimates
            assert d["value"] == pytest.approx(r["accuracy"][key]["value"] - rows[0]["accuracy"][key]["value"])
    assert rows[0]["accuracy"]["text.perplexity"]["value"] > 1


def test_records_are_reused_and_tasks_rerun_when_the_request_changes(report, tmp_path):
    report, _, out = report
    config = evaluate.Config(**{k: report["configurations"][0][k] for k in
                                ("label", "family", "path", "model_kwargs", "weight_type", "gamma", "phi", "select_by")})
    runs = out / "runs"
    before = set(runs.iterdir())
    again = evaluate.run_in_child(evaluate.RunRequest(config, ["qa", "translation", "summarization", "text"], 3, 2), runs)
    assert set(runs.iterdir()) == before and "qa" in again  # the same request: reused
    other = evaluate.run_in_child(evaluate.RunRequest(config, ["qa"], 2, 2), runs)
    assert len(set(runs.iterdir())) == len(before) + 2 and len(other["qa"]["outputs"]) == 2  # records, request


def test_a_failing_configuration_is_reported_not_fatal(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\0" * 60)
    config = evaluate.Config("bad", "original", str(bad))
    rec = evaluate.run_in_child(evaluate.RunRequest(config, ["qa"], 2, 1), tmp_path)
    assert "_error" in rec and rec["_error"]


def test_speed_and_the_report(report):
    report, written, out = report
    for r in report["configurations"]:
        assert r["decode_tokens_per_s"] > 0 and r["prefill_tokens_per_s"] > 0 and r["peak_rss_bytes"] > 0
    names = {p.name for p in written}
    assert {"results.json", "results.md", "text.perplexity_vs_bytes_read.png", "qa.f1_vs_peak_rss.png",
            "decode_speed_vs_bytes_read.png"} <= names
    for p in written:
        if p.suffix == ".png":
            assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    md = (out / "results.md").read_text()
    assert all(r["label"] in md for r in report["configurations"])
    assert json.loads((out / "results.json").read_text())["meta"]["n"] == 3


def test_runs_are_joined_into_one_report(report, tmp_path, selectinfer_cmd):
    """`selectinfer eval-report` joins runs of one model: every configuration once (the original of
    both runs once), one frontier over all of them; runs that differ in what they measured are refused."""
    import copy

    report, _, out = report
    other = copy.deepcopy(report)
    for r in other["configurations"][1:]:
        r["label"] += " (second grid)"
    other["meta"]["command"] = "selectinfer eval second"
    second = tmp_path / "second"
    second.mkdir()
    (second / "results.json").write_text(json.dumps(other))
    done = selectinfer_cmd("eval-report", str(out), str(second), "-o", str(tmp_path / "joined"))
    assert done.returncode == 0, done.stderr
    joined = json.loads((tmp_path / "joined" / "results.json").read_text())
    labels = [r["label"] for r in joined["configurations"]]
    n = len(report["configurations"])
    assert labels == [r["label"] for r in report["configurations"]] + [r["label"] for r in other["configurations"][1:]]
    assert len(labels) == 2 * n - 1 and [r["command"] for r in joined["meta"]["runs"]][1] == "selectinfer eval second"
    assert (tmp_path / "joined" / "plots" / "text.perplexity_vs_bytes_read.png").read_bytes()[:4] == b"\x89PNG"
    md = (tmp_path / "joined" / "results.md").read_text()
    assert all(label in md for label in labels)
    other["meta"]["n"] = 5
    (second / "results.json").write_text(json.dumps(other))
    refused = selectinfer_cmd("eval-report", str(out), str(second), "-o", str(tmp_path / "refused"))
    assert refused.returncode == 1 and "the runs differ in n (3 and 5)" in refused.stderr
    (second / "results.json").write_text("[1, 2]")
    refused = selectinfer_cmd("eval-report", str(out), str(second), "-o", str(tmp_path / "refused"))
    assert refused.returncode == 1 and "not a results.json of `selectinfer eval`" in refused.stderr
    missing = selectinfer_cmd("eval-report", str(tmp_path / "nowhere"), "-o", str(tmp_path / "refused"))
    assert missing.returncode == 1 and "results.json not found" in missing.stderr


def test_speed_only(tiny_model, tmp_path):
    report, written = evaluate.run_eval(tiny_model("tiny-qwen2", "F32"), tmp_path, gammas=[0.75], phis=[0.5],
                                        select_by=["value"], quants=[], si_quants=[], tasks=[], speed_rounds=1,
                                        n_prompt=8, n_gen=4, n_threads=1, progress=False)
    assert all("accuracy" not in r for r in report["configurations"])
    assert "Speed and memory only" in (tmp_path / "results.md").read_text()
    assert [r["family"] for r in report["configurations"]] == ["original", "selectinfer", "selectinfer", "coreinfer"]


def test_delta_zero_grid_has_no_static_neurons_and_phis_below_the_default_delta(tiny_model, tmp_path):
    from gguf import GGUFReader

    report, _ = evaluate.run_eval(tiny_model("tiny-qwen2", "F32"), tmp_path, gammas=[0.75], phis=[0.25, 0.5],
                                  select_by=["gate-guided"], quants=[], si_quants=[], delta=0.0, baselines=False,
                                  tasks=[], speed_rounds=1, n_prompt=8, n_gen=4, n_threads=1, progress=False)
    rows = report["configurations"]
    assert [(r["family"], r["phi"]) for r in rows] == [("original", None), ("selectinfer", None),
                                                      ("selectinfer", 0.25), ("selectinfer", 0.5)]
    assert [r["label"] for r in rows if "error" in r] == []
    path = Path(rows[1]["path"])
    assert path.stem.endswith("si75d0")  # not the default delta's file name
    field = GGUFReader(path).fields[si_key("static_ratio")]
    assert float(field.parts[field.data[0]][0]) == 0.0
    assert rows[2]["read_bytes_per_token"] < rows[3]["read_bytes_per_token"] < rows[1]["read_bytes_per_token"]


def test_predictor_grid_runs_the_predicted_strategy(tiny_model, tmp_path):
    from selectinfer.evaluation.bench import bytes_read_per_token
    from selectinfer.method.profiler import profile_model

    source = tiny_model("tiny-qwen2", "F32")
    profile = tmp_path / "p.safetensors"
    profile_model(source, ["botchan"], profile, max_prompts=2, max_new_tokens=4, n_ctx=256, progress=False,
                  input_moments=True)
    report, _ = evaluate.run_eval(source, tmp_path / "eval", profile=profile, task="text", gammas=[0.75], phis=[0.5],
                                  select_by=["predicted", "value"], quants=[], si_quants=[], baselines=False,
                                  predictor_rank=32, layer_budgets=["uniform", "profile"], tasks=[], speed_rounds=1,
                                  n_prompt=8, n_gen=4, n_threads=1, progress=False)
    rows = report["configurations"]
    assert [r["label"] for r in rows if "error" in r] == []
    assert [r.get("select_by") for r in rows] == [None, None, "predicted", "predicted", "value", "value"]
    assert [r["model_kwargs"].get("layer_budgets") for r in rows[2:]] == [None, "profile"] * 2
    assert rows[3]["label"].endswith("predicted profile budgets")
    path = Path(rows[1]["path"])
    assert path.stem.endswith("si75p32")
    # the predictor is read by the predicted strategy only
    assert rows[2]["read_bytes_per_token"] == bytes_read_per_token(path, 0.5, "predicted")
    assert rows[4]["read_bytes_per_token"] < rows[2]["read_bytes_per_token"] < rows[1]["read_bytes_per_token"]
    for uniform, profile in ((rows[2], rows[3]), (rows[4], rows[5])):  # the same bytes, shared out otherwise
        strategy = uniform["model_kwargs"].get("strategy")
        assert profile["read_bytes_per_token"] == bytes_read_per_token(path, 0.5, strategy, "profile")
        assert 0 <= uniform["read_bytes_per_token"] - profile["read_bytes_per_token"] < 3 * 64 * 4  # one F32 neuron


def test_compensation_grid_adds_uncompensated_step_strategies():
    """compensation on and off: the step strategies (gate-guided, predicted) once with the engine's
    default and once with compensate=False (their own series in the plots), the others once."""
    configs = evaluate.selectinfer_configs(Path("m.si70d0p32.gguf"), "selectinfer", 0.7, 0.0, [0.3],
                                           ["value", "gate-guided", "predicted"], "F32", compensation=["on", "off"])
    assert [c.label for c in configs] == ["m.si70d0p32 loaded-only", "m.si70d0p32 phi 0.3 value",
                                          "m.si70d0p32 phi 0.3 gate-guided",
                                          "m.si70d0p32 phi 0.3 gate-guided uncompensated",
                                          "m.si70d0p32 phi 0.3 predicted", "m.si70d0p32 phi 0.3 predicted uncompensated"]
    assert [c.model_kwargs.get("compensate") for c in configs] == [None, None, None, False, None, False]
    assert [c.select_by for c in configs[1:]] == ["value", "gate-guided", "gate-guided uncompensated", "predicted",
                                                  "predicted uncompensated"]
    assert all(c.select_by in eval_report.RULE_STYLE for c in configs[1:])


def test_unknown_task_and_too_few_examples(tiny_model, tmp_path):
    with pytest.raises(ValueError, match="unknown task"):
        evaluate.run_eval(tiny_model("tiny-qwen2", "F32"), tmp_path, tasks=["poetry"])
    with pytest.raises(ValueError, match="at least 2"):
        evaluate.run_eval(tiny_model("tiny-qwen2", "F32"), tmp_path, tasks=["qa"], n=1)


@needs_cgroups
def test_under_a_memory_limit_each_configuration_runs_and_is_timed_in_its_own_process(tiny_model, tmp_path):
    source = tiny_model("tiny-qwen2", "F32")
    report, _ = evaluate.run_eval(source, tmp_path, gammas=[0.75], phis=[0.5], select_by=["value"], quants=[],
                                  si_quants=[], baselines=False, tasks=["qa"], n=2, speed_rounds=1, n_prompt=8,
                                  n_gen=4, n_threads=1, n_bootstrap=50, memory_limit_bytes=1 << 30, progress=False)
    assert report["meta"]["speed"]["mode"] == "per process"
    for r in report["configurations"]:
        assert "error" not in r and r["decode_tokens_per_s"] > 0
        assert r["cgroup_peak_bytes"] is None or 0 < r["cgroup_peak_bytes"] <= 1 << 30
    assert "memory limit of 1024 MiB" in (tmp_path / "results.md").read_text()
    # a limit no process fits in: every configuration fails, and the report says so
    report, _ = evaluate.run_eval(source, tmp_path / "tight", gammas=[0.75], phis=[0.5], select_by=["value"],
                                  quants=[], si_quants=[], baselines=False, tasks=["qa"], n=2, speed_rounds=1,
                                  n_threads=1, memory_limit_bytes=4 << 20, progress=False)
    assert all("error" in r for r in report["configurations"])
    assert "## Failed configurations" in (tmp_path / "tight" / "results.md").read_text()


def test_frontier_keeps_the_non_dominated_points():
    from selectinfer.evaluation.eval_report import frontier

    # x = memory (lower better), y = accuracy (higher better)
    pts = [(100, 0.5), (80, 0.5), (120, 0.9), (90, 0.3), (80, 0.6)]
    assert frontier(pts, True, False) == [4, 2]  # (80, 0.6) dominates (80, 0.5), (100, 0.5), (90, 0.3)
    # y = perplexity (lower better), x = speed (higher better)
    assert frontier([(10, 50.0), (20, 60.0), (15, 40.0)], False, True) == [2, 1]


@needs_cgroups
def test_a_model_larger_than_the_limit_is_paged_from_its_file_not_killed(tiny_model, tmp_path):
    from selectinfer.evaluation.synthetic import make_model

    # FFN weights of 3 x 3 x 64 x 90112 F32: a 200 MiB file, run in a cgroup 80 MiB above what the
    # process needs besides it: its weights must be read from the file again and again (offloading)
    big = tmp_path / "big.gguf"
    make_model(big, "tiny-llama", weight_type="F32", seed=4, n_ff=90112, n_layer=3)
    speed = {"n_prompt": 8, "n_gen": 4, "rounds": 1}
    small = evaluate.run_in_child(evaluate.RunRequest(evaluate.Config("small", "original", str(tiny_model())), [], 0, 1,
                                                      256, speed, 1 << 30), tmp_path)
    limit = small["_cgroup_peak_bytes"] + (80 << 20)
    assert big.stat().st_size > limit - small["_cgroup_peak_bytes"] + (100 << 20)
    rec = evaluate.run_in_child(evaluate.RunRequest(evaluate.Config("big", "original", str(big)), [], 0, 1, 256,
                                                    speed, limit), tmp_path)
    assert "_error" not in rec, rec
    assert rec["_speed"]["decode_tokens_per_s"] > 0
    assert rec["_cgroup_peak_bytes"] <= limit
    # paging seen as pages read again from the file while timed; none for the model that fits
    assert rec["_major_faults_timed"] > 0 and small["_major_faults_timed"] == 0


@needs_cgroups
def test_a_prepared_model_runs_under_a_limit_equal_to_its_budget(tmp_path):
    """`eval --prepare-budget`: the file prepare fits to a budget runs under a memory limit of that
    budget, with the workload its peak was fitted to: near the budget, no page read again, and the
    report's verdict follows its numbers. (This 90 MiB process's peak moves by up to 1-2 MiB from
    run to run, transparent huge pages included: more than prepare's 0.5% margin. A large model's
    peak does not move by 0.5%; the README shows the default model fitted within 0.3% below.)"""
    import json

    from selectinfer.method import prepare
    from selectinfer.evaluation.synthetic import make_model

    wide = tmp_path / "wide.gguf"  # FFN weights (36 MiB) large against the compute buffers and RSS noise
    make_model(wide, "tiny-llama", weight_type="F32", seed=1, n_embd=256, n_ff=4096, n_layer=3)
    data = tmp_path / "calib.jsonl"
    data.write_text("".join(json.dumps({"text": t}) + "\n" for t in ["The market grew into a town.",
                                                                     "Traders met to exchange grain and salt."]))
    profile = prepare.cached_profile(wide, [f"{data}:text"], max_prompts=2, max_new_tokens=4, progress=False)
    budget = prepare.measure_peak_rss(wide, 256, 1) - 3 * 3 * 256 * 4096 * 4 // 3  # a third of the FFN must go
    report, _ = evaluate.run_eval(wide, tmp_path / "ev", profile=profile, task="text", gammas=[0.75], phis=[0.5],
                                  select_by=["value"], quants=[], si_quants=[], baselines=False, tasks=[],
                                  speed_rounds=1, n_prompt=8, n_gen=4, n_threads=1, n_ctx=256,
                                  prepare_budget=str(budget), progress=False)
    prepared = report["configurations"][-1]
    assert prepared["family"] == "prepared" and prepared["memory_limit_bytes"] == budget and "error" not in prepared
    peak = prepared["peak_rss_bytes"]
    assert 0.97 * budget <= peak <= budget + (2 << 20), (peak, budget)
    assert prepared["major_faults_timed"] == 0 and prepared["decode_tokens_per_s"] > 0
    assert all(r["memory_limit_bytes"] is None for r in report["configurations"][:-1])
    fits = 0.98 * budget <= peak <= budget and (prepared["cgroup_peak_bytes"] or 0) <= budget
    verdict = "Fits: within 2% below the budget, no paging." if fits else "Does not meet the budget check"
    assert verdict in (tmp_path / "ev" / "results.md").read_text()


def test_quick_run_on_the_default_model(default_model, selectinfer_cmd, tmp_path):
    # the everyday command end to end: profile (cached), files, tasks, speed, report
    r = selectinfer_cmd("eval", default_model, "--quick", "-o", tmp_path, "-t", "2", timeout=900)
    assert r.returncode == 0, r.stderr[-2000:]
    report = json.loads((tmp_path / "results.json").read_text())
    rows = report["configurations"]
    assert [r["family"] for r in rows] == ["original", "quantized", "selectinfer", "selectinfer", "coreinfer",
                                          "random", "random"]
    assert all("error" not in r and r["decode_tokens_per_s"] > 0 for r in rows)
    assert report["meta"]["n"] == 10 and report["meta"]["speed"]["mode"] == "interleaved"
    # the original answers some capitals; random loading at phi 0.4 is far worse at continuing text
    assert rows[0]["accuracy"]["qa.contains"]["value"] > 0
    assert rows[-1]["accuracy"]["text.perplexity"]["value"] > 2 * rows[0]["accuracy"]["text.perplexity"]["value"]
    assert "## Paired difference" in (tmp_path / "results.md").read_text()


def test_plots_split_selectinfer_points_by_selection_rule():
    """Where a run compares selection rules, each gets a legend entry of its own (loaded-only apart)."""
    from selectinfer.evaluation.eval_report import _groups

    rows = [{"family": "original"}, {"family": "selectinfer", "select_by": None},
            {"family": "selectinfer", "select_by": "value"}, {"family": "selectinfer", "select_by": "gate-guided"},
            {"family": "selectinfer", "select_by": "value"}]
    groups = {label: len(members) for label, _, _, members in _groups(rows)}
    assert groups == {"original": 1, "selectinfer loaded-only": 1, "selectinfer gate-guided": 1,
                      "selectinfer value": 2}
    one_rule = [r for r in rows if r.get("select_by") != "gate-guided"]
    assert {label for label, *_ in _groups(one_rule)} == {"original", "selectinfer"}
