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
from conftest import _tool, make_si_model

from selectinfer import Model

PROMPT = "the capital of france is paris, a city on the"


@pytest.fixture(scope="module")
def si_model(tmp_path_factory):
    # not the last layer: upstream's tools ask only for the last token's output, and llama.cpp
    # computes the last layer's FFN for output tokens only (the engine asks for every token)
    return make_si_model(tmp_path_factory.mktemp("tools"), seed=5, layers="0:2")[1]


def run_tool(name, *args, env=None, timeout=300):
    return subprocess.run([_tool(name), *map(str, args)], capture_output=True, text=True, errors="replace",
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
    server = subprocess.Popen([_tool("llama-server"), "-m", str(si_model), "--port", str(port), "-np", "1", "-c", "256",
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
        tokens = m.tokenize(PROMPT)
        expected = []
        m._set_sampling(0, 0, 1.0, 0)
        m.engine.eval_prompt(tokens, False)
        for _ in range(8):
            t = m.engine.sample()
            if m.engine.is_eog(t):
                break
            expected.append(t)
            m.engine.eval_token(t)
    assert reply["tokens"] == expected
