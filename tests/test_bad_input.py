"""Bad input gives a Python exception or a one-line CLI error, never a crash."""
import pytest

from selectinfer import ContextOverflowError, Model, ModelLoadError, pull

PROMPT = "the capital of"


@pytest.fixture(scope="module")
def broken_files(tiny_model, tmp_path_factory):
    good = tiny_model("tiny-llama", "F32").read_bytes()
    root = tmp_path_factory.mktemp("broken")
    files = {
        "not_gguf": b"this is a text file, not a model\n" * 10,
        "empty": b"",
        "header_only": good[:24],           # magic, version, counts; no metadata
        "cut_in_metadata": good[:1000],
        "cut_in_tensor_data": good[: len(good) // 2],
        "garbage_after_magic": b"GGUF" + bytes(range(256)) * 8,
    }
    paths = {}
    for name, data in files.items():
        paths[name] = root / f"{name}.gguf"
        paths[name].write_bytes(data)
    return paths


def test_missing_file():
    with pytest.raises(FileNotFoundError, match="model file not found"):
        Model("/nonexistent/model.gguf")


@pytest.mark.parametrize("name,reason", [
    ("not_gguf", "not a GGUF file"),
    ("empty", "not a GGUF file"),
    ("header_only", "failed to load model"),
    ("cut_in_metadata", "failed to read key-value pairs"),
    ("cut_in_tensor_data", "not within the file bounds"),
    ("garbage_after_magic", "failed to load model"),
])
def test_corrupt_files_raise(broken_files, name, reason):
    with pytest.raises(ModelLoadError, match=reason):
        Model(broken_files[name])


@pytest.mark.parametrize("name", ["not_gguf", "cut_in_metadata", "cut_in_tensor_data", "garbage_after_magic"])
def test_cli_rejects_corrupt_files_with_one_line(cli, broken_files, name):
    proc = cli("-m", broken_files[name], "-p", "hi", "-n", "2")
    assert proc.returncode == 1, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("selectinfer-cli: error: ")
    assert proc.stdout == ""


def test_prompt_longer_than_context(tiny_model):
    with Model(tiny_model("tiny-llama", "F32"), n_ctx=16) as m:
        with pytest.raises(ContextOverflowError, match="prompt has 3[0-9] tokens but the context holds 16"):
            m.generate("the " * 30, 4)
        with pytest.raises(ContextOverflowError):
            m.token_logprobs("the " * 30)
        # the model stays usable afterwards
        assert isinstance(m.generate(PROMPT, 2, temperature=0), str)


def test_cli_prompt_longer_than_context(cli, tiny_model):
    proc = cli("-m", tiny_model("tiny-llama", "F32"), "-c", "16", "-p", "the " * 30, "-n", "4")
    assert proc.returncode == 1
    assert "prompt has" in proc.stderr and "context holds 16" in proc.stderr


@pytest.mark.parametrize("kwargs,match", [
    ({"temperature": -0.5}, "temperature"),
    ({"temperature": float("nan")}, "temperature"),
    ({"top_p": 0.0}, "top_p"),
    ({"top_p": 1.5}, "top_p"),
    ({"top_k": -1}, "top_k"),
    ({"max_tokens": -2}, "max_tokens"),
    ({"stop": [""]}, "stop"),
])
def test_invalid_sampling_parameters(tiny_model, kwargs, match):
    with Model(tiny_model("tiny-llama", "F32"), n_ctx=64) as m:
        with pytest.raises(ValueError, match=match):
            m.generate(PROMPT, **kwargs)


@pytest.mark.parametrize("kwargs,match", [({"n_ctx": 0}, "n_ctx"), ({"n_batch": 0}, "n_batch"), ({"n_threads": -1}, "n_threads"),
                                          ({"n_gpu_layers": -2}, "n_gpu_layers")])
def test_invalid_model_parameters(tiny_model, kwargs, match):
    with pytest.raises(ValueError, match=match):
        Model(tiny_model("tiny-llama", "F32"), **kwargs)


@pytest.mark.parametrize("args,match", [
    (["--temp", "-1"], "temperature"),
    (["--top-p", "0"], "top_p"),
    (["--top-k", "x"], "invalid value 'x' for --top-k"),
    (["--bogus"], "unknown argument --bogus"),
    (["-n"], "missing value for -n"),
    (["-ngl", "all"], "invalid value 'all' for -ngl"),
    (["-ngl", "-2"], "n_gpu_layers must be >= -1"),
])
def test_cli_invalid_arguments(cli, tiny_model, args, match):
    proc = cli("-m", tiny_model("tiny-llama", "F32"), "-p", "hi", *args)
    assert proc.returncode != 0
    assert match in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_empty_and_out_of_vocabulary_tokens(tiny_model):
    with Model(tiny_model("tiny-llama", "F32"), n_ctx=64) as m:
        with pytest.raises(ValueError, match="empty"):
            m.generate([], 2)
        with pytest.raises(IndexError, match="outside the vocabulary"):
            m.logits([1, 5, m.n_vocab])


def test_unknown_model_name():
    with pytest.raises(ValueError, match="unknown model 'no-such-model'; known models: gemma3-270m, smollm2-135m"):
        pull("no-such-model")


def test_cli_unknown_model_name(selectinfer_cmd):
    proc = selectinfer_cmd("pull", "no-such-model")
    assert proc.returncode == 1
    assert proc.stderr.strip() == "selectinfer: error: unknown model 'no-such-model'; known models: gemma3-270m, smollm2-135m"


def test_cli_prompt_file_that_is_not_text(cli, tiny_model, tmp_path):
    binary = tmp_path / "prompt.bin"
    binary.write_bytes(b"the capital of \xff\xfe\x00\x01 is")
    proc = cli("-m", tiny_model("tiny-llama", "F32"), "-f", binary)
    assert proc.returncode != 0
    assert f"the prompt file {binary} is not UTF-8 text (byte 15)" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
