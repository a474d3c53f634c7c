"""The values llama.cpp would assert on (abort the process) rather than refuse, checked before it
reads them (cpp/llama/file_checks.cpp): for each rule of the table, a plain file that breaks it is
refused with one line naming the key and its value, loaded in a child process so that a check that
is missing fails this test instead of ending the test run. Files that keep every rule still load."""
import os
import subprocess
import sys

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf import GGUFValueType as V
from helpers import gguf_fields, gguf_tensors, write_gguf

from selectinfer import _native

SUPPORTED = "the file is corrupted or not a model this build supports"


def u32(v):
    return (V.UINT32, v, None)


def set_key(key, value):
    return lambda fields, tensors: fields.__setitem__(key, value)


def drop_key(key):
    return lambda fields, tensors: fields.pop(key, None)


def retype(name, qtype):
    def edit(fields, tensors):
        for t in tensors:
            if t["name"] == name:
                t["type"] = qtype
                if qtype == Q.F16:  # the same values in half the bytes
                    t["data"] = t["data"].view(np.float32).astype(np.float16).view(np.uint8)
    return edit


def both(*edits):
    def edit(fields, tensors):
        for e in edits:
            e(fields, tensors)
    return edit


# (shape, the edit, the text the refusal must hold: the key and its value), one or more per rule
CASES = {
    "block_count 0": ("tiny-llama", set_key("llama.block_count", u32(0)), "llama.block_count = 0"),
    "block_count 600": ("tiny-llama", set_key("llama.block_count", u32(600)), "llama.block_count = 600"),
    "nextn layers": ("tiny-llama", set_key("llama.nextn_predict_layers", u32(1)), "llama.nextn_predict_layers = 1"),
    "experts": ("tiny-llama", set_key("llama.expert_count", u32(5000)), "llama.expert_count = 5000"),
    "used experts": ("tiny-llama", set_key("llama.expert_used_count", u32(2)), "llama.expert_used_count = 2"),
    "experts none used": ("tiny-llama", set_key("llama.expert_count", u32(192)),
                          "llama.expert_used_count is missing for 192 experts"),
    "expert groups": ("tiny-llama", set_key("llama.expert_group_count", u32(2)), "llama.expert_group_count = 2"),
    "rope scaling": ("tiny-llama", set_key("llama.rope.scaling.type", (V.STRING, "bogus", None)),
                     'llama.rope.scaling.type = "bogus"'),
    "no heads": ("tiny-llama", set_key("llama.attention.head_count", u32(0)), "llama.attention.head_count = 0"),
    "no kv heads": ("tiny-llama", set_key("llama.attention.head_count_kv", u32(0)),
                    "llama.attention.head_count_kv = 0"),
    "head ratio": ("tiny-llama", set_key("llama.attention.head_count_kv", u32(3)),
                   "llama.attention.head_count_kv = 3 for 4 heads"),
    "layer heads": ("tiny-llama", set_key("llama.attention.head_count", (V.ARRAY, [4, 2], V.UINT32)),
                    "llama.attention.head_count = 2 in one layer"),
    "value width": ("tiny-llama", set_key("llama.attention.value_length", u32(8)),
                    "llama.attention.value_length = 8 for a head width of 16"),
    "odd head": ("tiny-llama", set_key("llama.attention.key_length", u32(15)), "llama.attention.key_length = 15"),
    "rope dims": ("tiny-qwen2", set_key("qwen2.rope.dimension_count", u32(4)),
                  "qwen2.rope.dimension_count = 4 for a head width of 8"),
    "qwen2 width": ("tiny-qwen2", both(set_key("qwen2.attention.key_length", u32(16)),
                                       set_key("qwen2.attention.value_length", u32(16)),
                                       drop_key("qwen2.rope.dimension_count")),
                    "qwen2.embedding_length = 64 for 8 heads of 16"),
    "eps nan": ("tiny-llama", set_key("llama.attention.layer_norm_rms_epsilon", (V.FLOAT32, float("nan"), None)),
                "llama.attention.layer_norm_rms_epsilon = nan"),
    "eps negative": ("tiny-llama", set_key("llama.attention.layer_norm_rms_epsilon", (V.FLOAT32, -1.0, None)),
                     "llama.attention.layer_norm_rms_epsilon = -1"),
    "window pattern": ("tiny-gemma3", both(set_key("gemma3.attention.sliding_window", u32(16)),
                                           set_key("gemma3.attention.sliding_window_pattern", u32(1))),
                       "gemma3.attention.sliding_window_pattern = 1"),
    "window layers": ("tiny-gemma3", both(set_key("gemma3.attention.sliding_window", u32(16)),
                                          set_key("gemma3.attention.sliding_window_pattern",
                                                  (V.ARRAY, [False, False, False], V.BOOL))),
                      "gemma3.attention.sliding_window_pattern marks no layer"),
    "not causal": ("tiny-llama", set_key("llama.attention.causal", (V.BOOL, False, None)),
                   "llama.attention.causal = false"),
    "pooling": ("tiny-llama", set_key("llama.pooling_type", u32(7)), "llama.pooling_type = 7"),
    "no tokens": ("tiny-llama", set_key("tokenizer.ggml.tokens", (V.ARRAY, [], V.STRING)),
                  "tokenizer.ggml.tokens is empty"),
    "bos id": ("tiny-llama", both(set_key("tokenizer.ggml.add_bos_token", (V.BOOL, True, None)),
                                  set_key("tokenizer.ggml.bos_token_id", u32(99999))),
               "tokenizer.ggml.bos_token_id = 99999 of 320 tokens"),
    "bert bytes": ("tiny-llama", set_key("tokenizer.ggml.model", (V.STRING, "bert", None)),
                   "tokenizer.ggml.token_type[5] = 6 (a byte) in a bert vocabulary"),
    "norm type": ("tiny-llama", retype("blk.0.attn_norm.weight", Q.F16), "blk.0.attn_norm.weight (a vector) of type f16"),
    "weight type": ("tiny-llama", retype("blk.1.ffn_up.weight", Q.I32), "blk.1.ffn_up.weight (a matrix) of type i32"),
}


@pytest.fixture(scope="module")
def bases(tmp_path_factory):
    from selectinfer.evaluation.synthetic import make_model

    root = tmp_path_factory.mktemp("file-checks")
    out = {}
    for shape in ("tiny-llama", "tiny-qwen2", "tiny-gemma3"):
        path = root / f"{shape}.gguf"
        make_model(path, shape, weight_type="F32", seed=3)
        out[shape] = (gguf_fields(path), gguf_tensors(path))
    return out


def load_each(paths) -> list[str]:
    """One child process loads each file and decodes a token; each outcome's line ('ran', or
    'refused' and the message). A child that dies fails the test, naming the file."""
    code = ("import sys\nfrom selectinfer import Model\nfor path in sys.argv[1:]:\n"
            "    try:\n        with Model(path, n_ctx=64) as m:\n            m.generate('the capital of', max_tokens=1)\n"
            "        print('ran', flush=True)\n"
            "    except Exception as e:\n        print('refused', str(e).replace(chr(10), ' '), flush=True)\n")
    proc = subprocess.run([sys.executable, "-c", code, *map(str, paths)], capture_output=True, text=True,
                          errors="replace", timeout=600, env={**os.environ, "GGML_NO_BACKTRACE": "1"})
    lines = [line for line in proc.stdout.splitlines() if line.startswith(("ran", "refused"))]
    assert proc.returncode == 0 and len(lines) == len(paths), (
        f"the child died (exit {proc.returncode}) loading {paths[min(len(lines), len(paths) - 1)]}: "
        f"{proc.stderr[-1500:]}")
    return lines


def test_files_that_break_a_rule_are_refused_naming_the_key(bases, tmp_path):
    paths = []
    for name, (shape, edit, _) in CASES.items():
        fields, tensors = dict(bases[shape][0]), [dict(t) for t in bases[shape][1]]
        edit(fields, tensors)
        paths.append(write_gguf(tmp_path / f"{name.replace(' ', '-')}.gguf", fields, tensors))
    for (name, (_, _, expected)), line in zip(CASES.items(), load_each(paths)):
        assert line.startswith("refused") and expected in line and SUPPORTED in line, f"{name}: {line}"


def test_misaligned_tensor_data_is_refused(bases, tmp_path):
    fields, tensors = dict(bases["tiny-llama"][0]), bases["tiny-llama"][1]
    fields["general.alignment"] = u32(16)
    # a first tensor of 16 bytes puts the next at an odd multiple of 16
    tensors = [{"name": "rope_freqs.weight", "data": np.ones(4, np.float32).view(np.uint8), "ne": [4],
                "type": Q.F32}] + tensors
    path = write_gguf(tmp_path / "aligned16.gguf", fields, tensors, alignment=16)
    (line,) = load_each([path])
    assert line.startswith("refused") and "at byte" in line and SUPPORTED in line, line


def test_a_split_whose_index_has_another_type_is_refused(bases, tmp_path):
    # llama.cpp reads a sibling split's split.no as a uint16 without asking its type (ggml-patches/0010)
    fields, tensors = dict(bases["tiny-llama"][0]), bases["tiny-llama"][1]
    split = {"split.count": (V.UINT16, 2, None), "split.tensors.count": (V.INT32, len(tensors), None)}
    first = write_gguf(tmp_path / "m-00001-of-00002.gguf", {**fields, **split, "split.no": (V.UINT16, 0, None)}, tensors)
    write_gguf(tmp_path / "m-00002-of-00002.gguf", {**split, "split.no": u32(1)}, [])
    (line,) = load_each([first])
    assert line.startswith("refused") and "missing key split.no (a uint16) in GGUF split" in line, line


def test_files_within_the_rules_load(bases, tmp_path):
    paths = [write_gguf(tmp_path / f"{shape}.gguf", *bases[shape]) for shape in bases]
    assert load_each(paths) == ["ran"] * len(paths)


def test_every_rule_of_the_table_has_a_case():
    tested = " ".join(expected for _, _, expected in CASES.values()) + " at byte of type"
    for check in _native.FILE_CHECKS:
        keys = [k.replace("{arch}.", "") for k in check["keys"].split() if "." in k]
        assert not keys or any(k in tested for k in keys) or check["keys"].startswith("tensor"), check
    assert len(_native.FILE_CHECKS) >= 15


def test_the_reliability_doc_lists_every_rule():
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[1] / "docs" / "reliability.md").read_text()
    for check in _native.FILE_CHECKS:
        assert check["allowed"] in doc and check["aborts_in"] in doc, check["keys"]


def test_an_spm_vocabulary_without_byte_tokens_fails_to_tokenize_with_an_exception(bases, tmp_path):
    # left to the tokenizer (real files may lack byte tokens): a character outside the vocabulary
    # raises in the engine (llama.cpp's own tools end there, in llama_tokenize)
    fields, tensors = dict(bases["tiny-llama"][0]), bases["tiny-llama"][1]
    tokens = [f"filler{i}" if tok.startswith("<0x") else tok for i, tok in enumerate(fields["tokenizer.ggml.tokens"][1])]
    types = [1 if kind == 6 else kind for kind in fields["tokenizer.ggml.token_type"][1]]
    fields["tokenizer.ggml.tokens"] = (V.ARRAY, tokens, V.STRING)
    fields["tokenizer.ggml.token_type"] = (V.ARRAY, types, V.INT32)
    path = write_gguf(tmp_path / "no-byte-tokens.gguf", fields, tensors)
    code = f"from selectinfer import Model\\nwith Model({str(path)!r}, n_ctx=64) as m:\\n    m.tokenize('h\\u00e9llo \\u6f22')\\n"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and "Error" in proc.stderr.splitlines()[-1], proc.stderr[-800:]
