"""The side-by-side benchmark: what it runs and the bytes-read yardstick it reports against."""
import pytest
from gguf import GGUFReader

from helpers import make_predicted_si_model, make_si_model

from selectinfer.evaluation.bench import bench_configs, bytes_read_per_token, format_table, run_bench


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """A dense tiny llama with an untied output, and its SelectInfer conversion (gamma 0.75, layers 1..2)."""
    return make_si_model(tmp_path_factory.mktemp("bench"), seed=3, layers="1:3")


def tensor_bytes(path):
    return {t.name: int(t.n_bytes) for t in GGUFReader(str(path)).tensors}


def test_bytes_read_per_token(models):
    dense, si = models
    d, s = tensor_bytes(dense), tensor_bytes(si)
    embd_read = 0 if "output.weight" in d else d["token_embd.weight"]  # one row per token unless tied
    assert bytes_read_per_token(dense) == sum(d.values()) - d["token_embd.weight"] + embd_read
    loaded = bytes_read_per_token(si)
    assert loaded == sum(s.values()) - s["token_embd.weight"] + embd_read
    # phi 0.5 of N = 256: 128 of the 192 loaded neurons of layers 1 and 2 (their gate and up rows,
    # and their down projection, the static neurons' and the others')
    for il in (1, 2):
        for kind in ("ffn_gate", "ffn_up", "ffn_down_static", "ffn_down_t"):
            nbytes = s[f"blk.{il}.{kind}.weight"]
            loaded -= nbytes - nbytes * 128 // 192
    assert bytes_read_per_token(si, 0.5) == loaded
    assert bytes_read_per_token(si, 0.75) == bytes_read_per_token(si)
    # gate-guided reads every loaded row of the gate, and phi N of up and down
    gate = [s[f"blk.{il}.ffn_gate.weight"] for il in (1, 2)]
    gate_rows = sum(nbytes - nbytes * 128 // 192 for nbytes in gate)
    assert bytes_read_per_token(si, 0.5, "gate-guided") == loaded + gate_rows


def test_bench_runs_each_strategy_at_each_phi(models):
    dense, si = models
    results = run_bench([si], n_prompt=8, n_gen=4, repeats=1, n_threads=1, compute_ratios=[0.5],
                        strategies=["frequency", "gate-guided"])
    assert [r.label for r in results] == ["si.gguf (dense over loaded)", "si.gguf (phi 0.5 frequency)",
                                          "si.gguf (phi 0.5 gate-guided)"]
    assert results[1].read_bytes == bytes_read_per_token(si, 0.5)
    assert results[2].read_bytes == bytes_read_per_token(si, 0.5, "gate-guided") > results[1].read_bytes
    assert all(min(r.decode_tokens_per_s) > 0 for r in results)


def test_bench_runs_the_step_strategies_with_and_without_compensation(tmp_path):
    pytest.importorskip("safetensors.numpy", reason="safetensors' extension does not load on this interpreter",
                        exc_type=ImportError)
    si = make_predicted_si_model(tmp_path, seed=5, layers="1:3")  # gate statistics: compensated by default
    results = run_bench([si], n_prompt=8, n_gen=4, repeats=1, n_threads=1, compute_ratios=[0.5],
                        strategies=["fixed", "gate-guided"], compensation=["on", "off"])
    name = si.name
    assert [r.label for r in results] == [f"{name} (dense over loaded)", f"{name} (phi 0.5 fixed)",
                                          f"{name} (phi 0.5 gate-guided)", f"{name} (phi 0.5 gate-guided, uncompensated)"]
    assert results[2].read_bytes == results[3].read_bytes == bytes_read_per_token(si, 0.5, "gate-guided")
    assert all(min(r.decode_tokens_per_s) > 0 for r in results)


def test_bench_runs_every_configuration_side_by_side(models):
    dense, si = models
    results = run_bench([dense, si], n_prompt=8, n_gen=4, repeats=2, n_threads=1, compute_ratios=[0.5])
    assert [r.label for r in results] == ["dense.gguf", "si.gguf (dense over loaded)", "si.gguf (phi 0.5)"]
    for r in results:
        assert len(r.decode_tokens_per_s) == 2 and min(r.decode_tokens_per_s) > 0
        assert len(r.prefill_tokens_per_s) == 2 and min(r.prefill_tokens_per_s) > 0
    table = format_table(results).splitlines()
    assert len(table) == 2 + 3 and "bytes ideal" in table[0]
    assert table[2].split("|")[-3].strip() == "1.00x"  # the first model against itself


def test_bench_runs_each_configuration_with_flash_attention_on_and_off(models, selectinfer_cmd):
    dense, si = models
    # llama.cpp's choice unless asked: the engine gets no flash_attn
    assert "flash_attn" not in bench_configs([dense])[0].model_kwargs
    configs = bench_configs([dense, si], compute_ratios=[0.5], flash_attn=(True, False))
    assert [(c.label, c.model_kwargs["flash_attn"]) for c in configs] == [
        ("dense.gguf (flash attn on)", True), ("dense.gguf (flash attn off)", False),
        ("si.gguf (dense over loaded) (flash attn on)", True), ("si.gguf (dense over loaded) (flash attn off)", False),
        ("si.gguf (phi 0.5) (flash attn on)", True), ("si.gguf (phi 0.5) (flash attn off)", False)]
    assert configs[4].model_kwargs["compute_ratio"] == configs[5].model_kwargs["compute_ratio"] == 0.5
    proc = selectinfer_cmd("bench", dense, "-p", "4", "-n", "2", "-r", "1", "-t", "1", "--flash-attn", "both")
    assert proc.returncode == 0, proc.stderr
    rows = [line for line in proc.stdout.splitlines() if line.startswith("| dense.gguf")]
    assert len(rows) == 2 and "(flash attn on)" in rows[0] and "(flash attn off)" in rows[1]
    assert float(rows[1].split("|")[5]) > 0  # decode tok/s of the second


def test_bench_json_has_the_table_numbers(models, selectinfer_cmd, tmp_path):
    import json
    import shlex

    dense, si = models
    out = tmp_path / "bench.json"
    proc = selectinfer_cmd("bench", dense, si, "--compute-ratios", "0.5", "-p", "8", "-n", "4", "-r", "2", "-t", "1",
                           "-ngl", "-1", "--json", out)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(out.read_text())
    assert report["gpu_layers"] == -1 and report["devices"][0]["name"] == "CPU"
    prov = report["provenance"]  # where the numbers came from
    assert prov["threads"] == 1 and prov["version"] and isinstance(prov["cpu_features"], list)
    assert shlex.split(prov["command"]) == ["selectinfer", "bench", str(dense), str(si), "--compute-ratios", "0.5",
                                            "-p", "8", "-n", "4", "-r", "2", "-t", "1", "-ngl", "-1", "--json", str(out)]
    results = report["results"]
    assert [r["label"] for r in results] == ["dense.gguf", "si.gguf (dense over loaded)", "si.gguf (phi 0.5)"]
    assert results[0]["decode_vs_first"] == 1.0 and results[0]["bytes_read_ideal"] == 1.0
    for r in results:
        assert len(r["decode_samples"]) == 2 and r["decode_tokens_per_s"] > 0
        assert abs(r["share_of_ideal"] - r["decode_vs_first"] / r["bytes_read_ideal"]) < 1e-9
    # the table printed from the same results
    assert f"{results[2]['decode_tokens_per_s']:.1f}" in proc.stdout


def test_the_strategy_comparison_runs_both_at_the_same_bytes(models, tmp_path, capsys):
    pytest.importorskip("safetensors.numpy", reason="safetensors' extension does not load on this interpreter",
                        exc_type=ImportError)
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location(
        "bench_strategies", Path(__file__).resolve().parents[1] / "scripts" / "bench_strategies.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    _, method = models
    step = make_predicted_si_model(tmp_path, seed=5, layers="1:3")
    target = bytes_read_per_token(method, 0.5, "frequency")
    phi = script.phi_reading(str(step), "predicted", target)
    # the largest phi (in thousandths) that reads no more than the method
    assert bytes_read_per_token(step, phi, "predicted") <= target < bytes_read_per_token(step, phi + 0.001, "predicted")
    script.main(["--method", str(method), "--file", str(step), "--phis", "0.5", "-p", "8", "-n", "4", "-r", "1",
                 "-t", "1"])
    out = capsys.readouterr().out
    assert f"predicted phi {phi} / frequency phi 0.5: decode " in out
    assert float(out.rsplit("decode ", 1)[1]) > 0
