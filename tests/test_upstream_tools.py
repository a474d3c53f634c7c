"""llama.cpp's own tools built from the patched tree (SELECTINFER_TOOLS=ON, as `make test` builds
them): they load SelectInfer GGUFs, and the SELECTINFER_* environment reaches them through libllama."""
import json
import os
import re
import socket
import subprocess
import time
import urllib.request

import pytest
from helpers import make_si_model, tool

from selectinfer import Model

PROMPT = "the capital of france is paris, a city on the"


@pytest.fixture(scope="module")
def si_model(tmp_path_factory):
    # not the last layer: upstream's tools ask only for the last token's output, and llama.cpp
    # computes the last layer's FFN for output tokens only (the engine asks for every token)
    return make_si_model(tmp_path_factory.mktemp("tools"), seed=5, layers="0:2")[1]


def run_tool(name, *args, env=None, timeout=300):
    return subprocess.run([tool(name), *map(str, args)], capture_output=True, text=True, errors="replace",
                          timeout=timeout, env={**os.environ, **(env or {})})


def test_llama_bench_runs_a_selectinfer_model(si_model):
    r = run_tool("llama-bench", "-m", si_model, "-p", "8", "-n", "4", "-r", "1", "-t", "1", "-o", "json",
                 env={"SELECTINFER_COMPUTE_RATIO": "0.5"})
    assert r.returncode == 0, r.stderr[-2000:]
    runs = json.loads(r.stdout)
    assert {(x["n_prompt"], x["n_gen"]) for x in runs} == {(8, 0), (0, 4)}
    assert all(x["avg_ts"] > 0 for x in runs)


def test_a_bad_knob_stops_the_tool_with_the_reason(si_model):
    r = run_tool("llama-bench", "-m", si_model, "-p", "8", "-n", "0", "-r", "1", "-t", "1",
                 env={"SELECTINFER_COMPUTE_RATIO": "0.95"})
    assert r.returncode != 0
    assert "compute ratio (phi) 0.95 must lie between" in r.stderr


def test_llama_perplexity_runs_a_selectinfer_model(si_model, tmp_path):
    text = tmp_path / "text.txt"
    text.write_text((PROMPT + " ") * 40)
    r = run_tool("llama-perplexity", "-m", si_model, "-f", text, "-c", "32", "-b", "32", "-t", "1",
                 env={"SELECTINFER_TOKEN_RATIO": "0.3"})
    assert r.returncode == 0, r.stderr[-2000:]
    # running perplexity per chunk, on stdout (the "Final estimate" log line may be lost at exit)
    chunks = re.findall(r"\[(\d+)\](\d+\.\d+)", r.stdout)
    assert len(chunks) >= 10 and all(1.0 < float(ppl) < 1e6 for _, ppl in chunks), r.stdout[-500:]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(port, path, body, timeout=60):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.loads(resp.read())


@pytest.mark.parametrize("knobs,kwargs", [
    ({"SELECTINFER_COMPUTE_RATIO": "0.3"}, {"compute_ratio": 0.3}),
    ({"SELECTINFER_COMPUTE_RATIO": "0.5", "SELECTINFER_SELECT_BY": "magnitude"}, {"compute_ratio": 0.5, "select_by": "magnitude"}),
])
def test_llama_server_generates_what_the_engine_generates(si_model, knobs, kwargs):
    """Greedy tokens from llama-server with the environment knobs equal Model's with the same knobs:
    the server's prompt selects and its decode steps compute the selected neurons."""
    port = free_port()
    server = subprocess.Popen([tool("llama-server"), "-m", str(si_model), "--port", str(port), "-np", "1", "-c", "256",
                               "-t", "1", "--no-webui"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              env={**os.environ, **knobs})
    try:
        deadline = time.time() + 120
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as resp:
                    if resp.status == 200:
                        break
            except OSError:
                pass
            assert server.poll() is None, server.stdout.read().decode(errors="replace")[-2000:]
            assert time.time() < deadline, "llama-server did not become healthy"
            time.sleep(0.3)
        reply = post(port, "/completion", {"prompt": PROMPT, "n_predict": 8, "temperature": 0, "top_k": 1,
                                           "cache_prompt": False, "return_tokens": True})
    finally:
        server.terminate()
        server.wait(timeout=30)
    with Model(si_model, n_ctx=256, n_threads=1, **kwargs) as m:
        expected, _ = m.decode_tokens(m.tokenize(PROMPT), 8, stop_at_eog=True)
    assert reply["tokens"] == expected


def test_more_than_one_sequence_is_refused_with_the_fix(si_model):
    """One selection per context: llama-server with two slots would mix their tokens in it."""
    r = run_tool("llama-server", "-m", si_model, "--port", str(free_port()), "-np", "2", "-c", "256", "-t", "1",
                 "--no-webui", timeout=120)
    assert r.returncode != 0
    assert "serves one sequence: got n_seq_max 2 (llama-server: -np 1" in r.stdout + r.stderr


def lora_adapter(path, target: str, n_in: int, n_out: int, rank: int = 4):
    """A LoRA adapter GGUF (llama.cpp's format) that changes one weight of the tiny llama."""
    import numpy as np
    from gguf import GGUFWriter

    w = GGUFWriter(str(path), "llama")
    w.add_string("general.type", "adapter")
    w.add_string("adapter.type", "lora")
    w.add_float32("adapter.lora.alpha", float(rank))
    rng = np.random.default_rng(0)
    w.add_tensor(f"{target}.lora_a", rng.standard_normal((rank, n_in)).astype(np.float32))
    w.add_tensor(f"{target}.lora_b", rng.standard_normal((n_out, rank)).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_a_lora_adapter_for_a_selectinfer_layer_is_refused(si_model, tmp_path):
    """The sparse ops compute a SelectInfer layer's FFN without LoRA: llama_set_adapters_lora refuses
    such an adapter (logged), where one for a dense layer is taken."""
    text = tmp_path / "text.txt"
    text.write_text((PROMPT + " ") * 10)
    args = ["-f", text, "-c", "32", "-b", "32", "-t", "1", "--chunks", "1"]
    # layers 1..2 are SelectInfer; with repacking on, ffn_up holds the 64 static rows (loaded apart)
    sparse = lora_adapter(tmp_path / "sparse.gguf", "blk.1.ffn_up.weight", 64, 64)
    r = run_tool("llama-perplexity", "-m", si_model, "--lora", sparse, *args)
    assert "the LoRA adapter changes blk.1.ffn_up.weight, the FFN of a SelectInfer layer" in r.stderr, r.stderr[-2000:]
    dense = lora_adapter(tmp_path / "dense.gguf", "blk.2.ffn_up.weight", 64, 256)  # layer 2 stays dense
    r = run_tool("llama-perplexity", "-m", si_model, "--lora", dense, *args)
    assert r.returncode == 0 and "SelectInfer layer" not in r.stderr, r.stderr[-2000:]
