"""Selective loading: the SelectInfer GGUF converter and the patched loader."""
import os

import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType
from gguf.quants import dequantize
from helpers import gguf_fields
from reference import ReferenceModel

from selectinfer import Model, ModelLoadError, _native
from selectinfer.method.convert import (ConvertError, SourceGGUF, convert, default_layers,
                                 estimate_output_bytes, inspect, layer_counts, neuron_count, plan_layers,
                                 predictor_type)
from selectinfer.method.profiles import DatasetStats, ModelInfo, Profile, ProfileError, ranking
from selectinfer.runtime.paths import sha256_file
from selectinfer.evaluation.synthetic import make_model
from selectinfer.runtime.si_format import FORMAT_VERSION
from selectinfer.runtime.si_format import key as si_key

TEXT = "the capital of france is paris, a city on the seine"
# engine vs float64 numpy, relative to max |logit|: exact layouts, then re-quantized down projections
BOUNDS = {"F32": 2e-3, "F16": 2e-3, "BF16": 5e-3, "Q8_0": 3e-2, "Q4_0": 3e-2, "Q4_1": 3e-2, "Q4_K": 3e-2}


def field(reader, key):
    return reader.get_field(key).contents()


def kept_ids(path):
    r = GGUFReader(str(path))
    return {il: np.array(field(r, si_key("neuron_ids", il))) for il in field(r, si_key("layers"))}


def engine_logits(path, tokens=None, **kw):
    with Model(path, n_ctx=128, **kw) as m:
        tokens = tokens or m.tokenize(TEXT)
        return tokens, m.logits(tokens)


def zero_dropped(ref: ReferenceModel, ids: dict[int, np.ndarray]) -> ReferenceModel:
    """The reference with every dropped neuron removed (its gate and up rows zeroed: a = 0)."""
    for il, keep in ids.items():
        for name in ("ffn_gate", "ffn_up"):
            w = ref.weights[f"blk.{il}.{name}.weight"]
            mask = np.ones(w.shape[0], dtype=bool)
            mask[keep] = False
            w[mask] = 0.0
    return ref


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """Random-weight sources (n_embd 256 so that K-quants fit), made once."""
    root = tmp_path_factory.mktemp("convert-src")
    made = {}

    def get(shape="tiny-llama", weight_type="F32"):
        key = (shape, weight_type)
        if key not in made:
            made[key] = root / f"{shape}-{weight_type}.gguf"
            make_model(made[key], shape, weight_type=weight_type, seed=3, n_embd=256, n_ff=768, n_head=4,
                       n_head_kv=2, n_layer=3)
        return made[key]

    return get


@pytest.mark.parametrize("shape", ["tiny-llama", "tiny-qwen2"])
@pytest.mark.parametrize("weight_type", ["F32", "F16", "BF16"])
def test_exact_types_equal_reference_without_dropped_neurons(models, tmp_path, shape, weight_type):
    src = models(shape, weight_type)
    out = tmp_path / "si.gguf"
    convert(src, out, ranking="random", seed=5, load_ratio=0.55, static_ratio=0.2, layers="1:3", progress=False)
    tokens, got = engine_logits(out)
    expected = zero_dropped(ReferenceModel.load(src), kept_ids(out)).forward(tokens)
    rel = np.abs(got - expected).max() / np.abs(expected).max()
    print(f"{shape} {weight_type}: max rel diff {rel:.2e} vs the original without the dropped neurons")
    assert rel < BOUNDS[weight_type]
    _, original = engine_logits(src, tokens)
    assert np.abs(original - got).max() > 10 * BOUNDS[weight_type] * np.abs(expected).max(), "dropping must matter"


@pytest.mark.parametrize("weight_type", ["Q8_0", "Q4_0", "Q4_1", "Q4_K"])
def test_quantized_types_equal_reference_of_stored_weights(models, tmp_path, weight_type):
    """gate/up rows are copied byte for byte; the down projection is re-quantized after the
    transpose, so the reference is the file's own (dequantized) weights."""
    src = models("tiny-llama", weight_type)
    out = tmp_path / "si.gguf"
    convert(src, out, ranking="random", load_ratio=0.5, static_ratio=0.25, layers="0:3", progress=False)
    tokens, got = engine_logits(out)
    expected = ReferenceModel.load(out).forward(tokens)
    assert np.abs(got - expected).max() < BOUNDS[weight_type] * np.abs(expected).max()
    src_r, out_r = GGUFReader(str(src)), GGUFReader(str(out))
    ids = kept_ids(out)
    src_t = {t.name: t for t in src_r.tensors}
    for t in out_r.tensors:
        if t.name.endswith(("ffn_gate.weight", "ffn_up.weight")):
            il = int(t.name.split(".")[1])
            assert np.array_equal(np.asarray(t.data), np.asarray(src_t[t.name].data)[ids[il]]), t.name
    # and the re-quantized down projection stays close to the original one
    orig, conv = ReferenceModel.load(src).weights, ReferenceModel.load(out).weights
    for il, keep in ids.items():
        a, b = orig[f"blk.{il}.ffn_down.weight"][:, keep], conv[f"blk.{il}.ffn_down.weight"]
        assert np.abs(a - b).max() < 0.3 * np.abs(a).max()


def test_full_load_ratio_reproduces_the_original(models, tmp_path):
    src = models("tiny-qwen2", "F16")
    out = tmp_path / "si.gguf"
    convert(src, out, ranking="random", load_ratio=1.0, static_ratio=0.3, layers="0:3", progress=False)
    tokens, original = engine_logits(src)
    _, converted = engine_logits(out, tokens)
    assert np.abs(original - converted).max() < 2e-3 * np.abs(original).max()
    assert np.array_equal(original.argmax(1), converted.argmax(1))


def test_loads_with_and_without_mmap(models, tmp_path):
    src = models("tiny-llama", "Q8_0")
    out = tmp_path / "si.gguf"
    convert(src, out, ranking="random", load_ratio=0.6, static_ratio=0.3, progress=False)
    tokens, mapped = engine_logits(out, use_mmap=True)
    _, read = engine_logits(out, tokens, use_mmap=False)
    assert np.array_equal(mapped, read)
    with Model(out, n_ctx=64) as m:
        assert m.stats()["model_bytes"] < os.path.getsize(src)
        assert m.metadata(si_key("format_version")) == str(FORMAT_VERSION)


def profile_for(src, n_layer=3, n_ff=768, input_moments=None, input_means=None):
    rng = np.random.default_rng(0)
    info = ModelInfo(sha256_file(src), src.name, "llama", n_layer, n_ff)
    stats = [DatasetStats(n, t, "test", 1, rng.random((n_layer, n_ff)).astype(np.float32), np.full(n_layer, 10))
             for n, t in [("a", "qa"), ("b", "text")]]
    return Profile(info, stats, input_moments=input_moments, input_means=input_means)


def test_profile_ranking_layout(models, tmp_path):
    src = models("tiny-llama", "F32")
    prof = profile_for(src)
    prof.save(tmp_path / "p.safetensors")
    out = tmp_path / "si.gguf"
    convert(src, out, profile=tmp_path / "p.safetensors", task="qa", load_ratio=0.5, static_ratio=0.2,
            layers="0:3", progress=False)
    r = GGUFReader(str(out))
    n_static, n_load = round(0.2 * 768), round(0.5 * 768)
    base, secondary = ranking(prof.task_scores("qa")), ranking(prof.model_scores())
    for il, ids in kept_ids(out).items():
        assert len(ids) == n_load and len(set(ids.tolist())) == n_load
        assert ids[:n_static].tolist() == base[il, :n_static].tolist(), "static neurons first, task ranking order"
        rest = [i for i in secondary[il] if i not in set(base[il, :n_static].tolist())][: n_load - n_static]
        assert ids[n_static:].tolist() == rest, "then the model-wide ranking"
    assert field(r, "llama.feed_forward_length") == [n_load] * 3
    assert field(r, si_key("static_counts")) == [n_static] * 3
    assert field(r, si_key("task")) == "qa"
    assert field(r, si_key("profile_digest")) == sha256_file(tmp_path / "p.safetensors")
    assert field(r, si_key("source_digest")) == sha256_file(src)
    scores = prof.model_scores().astype(np.float64)
    for il, ids in kept_ids(out).items():  # each kept neuron's share of its layer's model-wide mass, largest first
        key = si_key("neuron_shares", il)
        shares, expected = np.asarray(field(r, key)), -np.sort(-scores[il][ids]) / scores[il].sum()
        assert r.get_field(key).types[-1] == GGUFValueType.FLOAT32 and np.allclose(shares, expected, rtol=1e-6, atol=0)
        assert 0.5 < shares.sum() < 1  # half the neurons kept, of random scores
    text = inspect(out)
    assert "task 'qa'" in text and "load (gamma) 0.500" in text and "layers 0..2 (3 of 3)" in text
    assert "a dense model" in inspect(src)


def test_random_ranking_is_seeded(models):
    a = plan_layers(100, range(2), 0.5, 0.1, seed=1)
    b = plan_layers(100, range(2), 0.5, 0.1, seed=1)
    c = plan_layers(100, range(2), 0.5, 0.1, seed=2)
    assert all(np.array_equal(a[i].neuron_ids, b[i].neuron_ids) for i in a)
    assert not np.array_equal(a[0].neuron_ids, c[0].neuron_ids)


def test_memory_budget_picks_the_largest_fitting_gamma(models, tmp_path):
    src = models("tiny-llama", "Q8_0")
    source = SourceGGUF(src)
    budget = (estimate_output_bytes(source, range(0, 3), 300) + estimate_output_bytes(source, range(0, 3), 301)) // 2
    out = tmp_path / "si.gguf"
    r = convert(src, out, ranking="random", static_ratio=0.1, layers="0:3", memory_budget=str(budget), progress=False)
    assert r.load_ratio == pytest.approx(300 / 768)
    tensor_bytes = sum(int(t.n_bytes) for t in GGUFReader(str(out)).tensors)
    assert tensor_bytes == estimate_output_bytes(source, range(0, 3), 300)
    with pytest.raises(ConvertError, match="too small"):
        convert(src, tmp_path / "x.gguf", ranking="random", static_ratio=0.5, memory_budget="10K", progress=False)


def test_large_layers_keep_whole_groups_of_neurons():
    """Layers of 1024+ neurons keep and hold static multiples of 32 (upstream's tiled matmul wants
    multiples of 16)."""
    assert neuron_count(0.7, 8192) == 5728  # 0.7 * 8192 = 5734.4 -> 179 groups
    assert neuron_count(0.7, 1536) == 1088  # 1075.2 -> 34 groups
    assert neuron_count(0.5, 96) == 48  # small layers: one neuron steps
    plans = plan_layers(8192, range(2), 0.7, 0.2)
    assert [len(p.neuron_ids) for p in plans.values()] == [5728, 5728]
    assert [p.n_static for p in plans.values()] == [1632, 1632]  # 1638.4 -> 51 groups
    with pytest.raises(ConvertError, match="keeps no neuron"):
        plan_layers(8192, range(2), 0.001, 0.0)


def test_static_counts_are_whole_blocks_of_the_down_type():
    """ffn_down_static has a row of n_static values: a whole number of the type's blocks (256 for
    the K-quants). gamma = delta keeps only static neurons."""
    assert layer_counts(8192, 0.7, 0.3, down_block=256) == (5728, 2560)  # 2457.6 -> 10 blocks
    assert layer_counts(8192, 0.7, 0.3, down_block=32) == (5728, 2464)
    assert layer_counts(8192, 0.4, 0.4, down_block=256) == (3328, 3328)
    assert layer_counts(1536, 0.7, 0.3, down_block=256) == (1088, 512)
    assert layer_counts(256, 0.6, 0.6, down_block=256) == (256, 256)
    assert layer_counts(256, 0.75, 0.25, down_block=256) == (192, 0)  # no whole block fits


@pytest.mark.parametrize("weight_type", ["F32", "BF16", "Q8_0", "Q4_K"])
def test_the_down_projection_in_two_layouts(models, tmp_path, weight_type):
    """A SelectInfer layer's down projection: the static neurons' columns in upstream's layout
    (ffn_down_static [n_static, n_embd]), the others' as rows (ffn_down_t [n_embd, n_load - n_static]),
    each equal to the source's columns (exactly, or to one re-quantization)."""
    src, out = models("tiny-llama", weight_type), tmp_path / "si.gguf"
    convert(src, out, ranking="random", seed=5, load_ratio=0.6, static_ratio=0.35, progress=False)

    def values(path):
        return {t.name: (np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float64).reshape(
            [int(d) for d in reversed(t.shape)]), t.tensor_type) for t in GGUFReader(str(path)).tensors}
    before, after = values(src), values(out)
    fields = gguf_fields(out)
    block = 256 if weight_type == "Q4_K" else 32 if weight_type == "Q8_0" else 1
    for il in fields[si_key("layers")][1]:
        ids = np.asarray(fields[si_key("neuron_ids", il)][1])
        n_static = int(fields[si_key("static_counts")][1][list(fields[si_key("layers")][1]).index(il)])
        assert n_static > 0 and n_static % block == 0
        down, _ = before[f"blk.{il}.ffn_down.weight"]  # numpy [n_embd, n_ff]
        static, static_type = after[f"blk.{il}.ffn_down_static.weight"]
        rows, rows_type = after[f"blk.{il}.ffn_down_t.weight"]
        assert static.shape == (256, n_static) and rows.shape == (len(ids) - n_static, 256)
        assert static_type.name == weight_type and rows_type.name == ("F16" if weight_type == "BF16" else weight_type)
        if block == 1:  # gathered values, exact (BF16 as F16 in the rows: down to F16's subnormals)
            assert np.array_equal(static, down[:, ids[:n_static]])
            assert np.abs(rows - down[:, ids[n_static:]].T).max() <= (1e-7 if weight_type == "BF16" else 0)
        else:  # one re-quantization of the gathered values, by ggml's quantizer
            for got, values in ((static, down[:, ids[:n_static]]), (rows, down[:, ids[n_static:]].T)):
                q = _native.quantize_rows(int(static_type), np.ascontiguousarray(values, dtype=np.float32))
                assert np.array_equal(got, dequantize(q, static_type).reshape(got.shape))


def test_default_layer_rule():
    assert default_layers(28) == range(4, 25)  # Llama-3.2-3B: layers 4..24, the reference setting
    assert default_layers(30) == range(4, 27)


def test_unpatched_upstream_refuses_cleanly(models, tmp_path):
    """What stock llama.cpp (llama-cpp-python 0.3.36 from the same sdist) does with a SelectInfer GGUF."""
    import subprocess
    from pathlib import Path

    python = Path(__file__).resolve().parents[1] / "build" / "upstream-venv" / "bin" / "python"
    if not python.exists():
        pytest.skip("stock llama.cpp not built: `make upstream` builds it (make test does)")
    out = tmp_path / "si.gguf"
    convert(models("tiny-llama", "F16"), out, ranking="random", load_ratio=0.5, static_ratio=0.2, progress=False)
    code = ("import sys\nfrom llama_cpp import Llama\n"
            "try:\n    Llama(model_path=sys.argv[1], verbose=True)\nexcept ValueError as e:\n    print('refused:', e)\n")
    proc = subprocess.run([python, "-c", code, str(out)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "refused: Failed to load model from file" in proc.stdout
    assert "tensor 'blk.0.ffn_down.weight' not found" in proc.stderr


# --- bad input --------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs,match", [
    ({"load_ratio": 1.2}, r"load ratio \(gamma\) must be in \(0, 1\]"),
    ({"load_ratio": 0.0}, r"load ratio \(gamma\) must be in \(0, 1\]"),
    ({"static_ratio": -0.1}, r"static ratio \(delta\) must be in \[0, 1\]"),
    ({"load_ratio": 0.3, "static_ratio": 0.5}, "cannot exceed the load ratio"),
    ({"layers": "2:9"}, "outside the model's layers 0:3"),
    ({"layers": "x"}, "is not START:END"),
    ({"ranking": "magic"}, "ranking must be"),
    ({"strategy": "best"}, "strategy must be one of frequency, sum-magnitude, fixed, gate-guided, predicted, got 'best'"),
])
def test_bad_arguments(models, tmp_path, kwargs, match):
    out = tmp_path / "out.gguf"
    with pytest.raises(ConvertError, match=match):
        convert(models("tiny-llama", "F32"), out, **{"ranking": "random", **kwargs}, progress=False)
    assert list(tmp_path.iterdir()) == []


def test_profile_of_another_model(models, tmp_path):
    src, other = models("tiny-llama", "F32"), models("tiny-llama", "F16")
    profile_for(other).save(tmp_path / "other.safetensors")
    with pytest.raises(ProfileError, match="another model file"):
        convert(src, tmp_path / "o.gguf", profile=tmp_path / "other.safetensors", task="qa", progress=False)
    prof = profile_for(src, n_ff=100)
    prof.save(tmp_path / "shape.safetensors")
    with pytest.raises(ProfileError, match="3 layers x 100 FFN neurons"):
        convert(src, tmp_path / "o.gguf", profile=tmp_path / "shape.safetensors", task="qa", progress=False)
    profile_for(src).save(tmp_path / "mine.safetensors")
    with pytest.raises(ProfileError, match="no dataset of task 'translation'"):
        convert(src, tmp_path / "o.gguf", profile=tmp_path / "mine.safetensors", task="translation", progress=False)
    with pytest.raises(ConvertError, match="a profile is needed"):
        convert(src, tmp_path / "o.gguf", progress=False)
    assert not (tmp_path / "o.gguf").exists()


def test_unsupported_architecture_and_inputs(tmp_path):
    from gguf import GGUFWriter

    w = GGUFWriter(str(tmp_path / "gpt2.gguf"), "gpt2")
    w.add_block_count(1)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ConvertError, match="unsupported architecture 'gpt2'"):
        convert(tmp_path / "gpt2.gguf", tmp_path / "o.gguf", ranking="random", progress=False)
    (tmp_path / "junk.gguf").write_bytes(b"junk" * 10)
    with pytest.raises(ConvertError, match="not a readable GGUF"):
        convert(tmp_path / "junk.gguf", tmp_path / "o.gguf", ranking="random", progress=False)
    with pytest.raises(FileNotFoundError):
        convert(tmp_path / "missing.gguf", tmp_path / "o.gguf", ranking="random", progress=False)


def test_unwritable_output_and_reconversion(models, tmp_path):
    src = models("tiny-llama", "F32")
    with pytest.raises(OSError, match="does not exist or is not writable"):
        convert(src, tmp_path / "no-such-dir" / "o.gguf", ranking="random", progress=False)
    with pytest.raises(IsADirectoryError, match=f"cannot write {tmp_path}: it is a folder; give a file path"):
        convert(src, tmp_path, ranking="random", progress=False)
    out = tmp_path / "si.gguf"
    convert(src, out, ranking="random", progress=False)
    with pytest.raises(ConvertError, match="already a SelectInfer GGUF"):
        convert(out, tmp_path / "again.gguf", ranking="random", progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["si.gguf"]


def test_truncated_si_file_is_refused(models, tmp_path):
    out = tmp_path / "si.gguf"
    convert(models("tiny-llama", "F32"), out, ranking="random", progress=False)
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(out.read_bytes()[: out.stat().st_size // 2])
    with pytest.raises(ModelLoadError, match="not within the file bounds"):
        Model(cut)


def test_the_static_block_takes_the_originals_kernels(default_model, tmp_path):
    """ggml repacks a SelectInfer layer's static block (gate, up, ffn_down_static) wherever it
    repacks the original's FFN (AMX, CPU_REPACK; plain buffers on a CPU without them), and keeps the
    gathered rows in plain buffers: the static neurons run on the original's kernels. Loaded for
    dense use, the gathered gate and up rows do as well."""
    out = tmp_path / "si70.gguf"
    convert(default_model, out, ranking="random", load_ratio=0.7, static_ratio=0.3, progress=False)
    with Model(default_model, n_ctx=64) as m:
        original = m.weight_placement()
    with Model(out, n_ctx=64) as m:
        placed = m.weight_placement()
    for il in (4, 15, 26):
        for kind in ("ffn_gate", "ffn_up"):
            assert placed[f"blk.{il}.{kind}.weight"][1] == original[f"blk.{il}.{kind}.weight"][1], (il, kind)
            assert placed[f"blk.{il}.{kind}_dyn.weight"][1] == "CPU_Mapped"
        assert placed[f"blk.{il}.ffn_down_static.weight"][1] == original[f"blk.{il}.ffn_down.weight"][1]
        assert placed[f"blk.{il}.ffn_down_t.weight"][1] == "CPU_Mapped"
    # dense over the loaded neurons gathers nothing: its gathered gate and up rows take the original's kernels too
    with Model(out, n_ctx=64, dense=True) as m:
        placed = m.weight_placement()
    for il in (4, 15, 26):
        for kind in ("ffn_gate", "ffn_up"):
            assert placed[f"blk.{il}.{kind}_dyn.weight"][1] == original[f"blk.{il}.{kind}.weight"][1], (il, kind)
        assert placed[f"blk.{il}.ffn_down_t.weight"][1] == "CPU_Mapped"


def test_down_t_type_fits_the_row_length():
    """ffn_down_t rows hold n_embd values: the source type where they are whole blocks of it, Q8_0
    where not (Gemma-3-270M's 640 values and a K-quant's 256-value blocks), F16 for BF16."""
    from gguf import GGMLQuantizationType as T

    from selectinfer.method.convert import down_t_type

    assert down_t_type(T.Q4_K, 3072) == T.Q4_K and down_t_type(T.Q6_K, 2048) == T.Q6_K
    assert down_t_type(T.Q4_K, 640) == T.Q8_0 and down_t_type(T.Q6_K, 640) == T.Q8_0
    assert down_t_type(T.Q4_0, 640) == T.Q4_0 and down_t_type(T.F32, 100) == T.F32
    assert down_t_type(T.BF16, 640) == T.F16 and down_t_type(T.Q4_K, 100) == T.F16


# --- the gate predictor -----------------------------------------------------------------------

def synthetic_moments(n_layer=3, n_embd=256, n_tokens=2000, seed=1):
    """E[h h^T] of random FFN inputs that are correlated and of unequal spread (not white)."""
    rng = np.random.default_rng(seed)
    mix = np.eye(n_embd) + rng.standard_normal((n_layer, n_embd, n_embd)) / np.sqrt(n_embd)
    spread = np.exp(rng.uniform(-1.5, 1.5, n_embd))
    h = (rng.standard_normal((n_layer, n_tokens, n_embd)) * spread) @ mix
    return (np.einsum("lti,ltj->lij", h, h) / n_tokens).astype(np.float32)


def moments_profile(src, path, input_moments="synthetic", input_means=None):
    """A profile of src with synthetic FFN input moments (None: a profile without them), and the
    given means, saved at path."""
    moments = synthetic_moments() if isinstance(input_moments, str) else input_moments
    profile_for(src, input_moments=moments, input_means=input_means).save(path)
    return path


def stored_predictors(path):
    """{layer: (pred_in [R, n_embd], pred_out [n_gathered, R])} as stored, dequantized to float64."""
    tensors = {t.name: t for t in GGUFReader(str(path)).tensors}

    def values(name):
        t = tensors[name]
        return np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float64).reshape(
            [int(d) for d in reversed(t.shape)])
    return {int(name.split(".")[1]): (values(name), values(name.replace("_pred_in", "_pred_out")))
            for name in tensors if name.endswith("ffn_gate_pred_in.weight")}


def gathered_gate(src, ids, n_static):
    """The source's gate rows of the gathered (dynamic) neurons, float64 [n_gathered, n_embd]."""
    return {il: np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float64).reshape(
        [int(d) for d in reversed(t.shape)])[ids[il][n_static:]]
        for t in GGUFReader(str(src)).tensors for il in ids if t.name == f"blk.{il}.ffn_gate.weight"}


def storage_error(stored, qtype):
    """Per value, how far its storage may have moved it. Q8_0: half a step d = amax/127 of its
    block, plus the F16 rounding of d (127 * 2^-11 d), taken a little wide (0.6 d) and from the
    stored amax. F16: half an ulp, 2^-11 relative; F32: 2^-24."""
    if qtype in ("F16", "F32"):
        return np.abs(stored) * 2.0**(-11 if qtype == "F16" else -24)
    amax = np.abs(stored).reshape(stored.shape[0], -1, 32).max(axis=2)
    return np.repeat(0.6 * amax / 127, 32, axis=1)


def product_error_bound(pred_in, pred_out, qtype):
    """|pred_out' pred_in' - pred_out pred_in| elementwise, the primes the stored factors (of qtype,
    F16 for rows that are not whole blocks of 32): |O'| e_I + e_O |I'| + e_O e_I (O = O' + dO,
    I = I' + dI, |dO| <= e_O, |dI| <= e_I)."""
    def error(stored):
        return storage_error(stored, "F16" if stored.shape[1] % 32 else qtype)
    e_in, e_out = error(pred_in), error(pred_out)
    return np.abs(pred_out) @ e_in + e_out @ np.abs(pred_in) + e_out @ e_in


def whitened_low_rank(w, moments, rank):
    """The best rank-`rank` M for E|(W - M) h|^2 = |(W - M) L|_F^2 with C = L L^T (Cholesky, not
    the converter's symmetric root): M = trunc(W L) L^-1."""
    c = moments.astype(np.float64)
    c += 1e-6 * np.trace(c) / len(c) * np.eye(len(c))
    lower = np.linalg.cholesky(c)
    u, s, vt = np.linalg.svd(w @ lower)
    truncated = (u[:, :rank] * s[:rank]) @ vt[:rank]
    return np.linalg.solve(lower.T, truncated.T).T  # truncated @ inv(L)


def test_predictor_tensors_names_shapes_and_types(models, tmp_path):
    src = models("tiny-llama", "F32")
    prof = moments_profile(src, tmp_path / "p.safetensors")
    out, dense_out = tmp_path / "si.gguf", tmp_path / "plain.gguf"
    convert(src, out, profile=prof, task="qa", load_ratio=0.75, static_ratio=0.25, layers="1:3", predictor_rank=64,
            progress=False)
    n_load, n_static = 576, 192
    names = [t.name for t in GGUFReader(str(out)).tensors]
    tensors = {t.name: t for t in GGUFReader(str(out)).tensors}
    for il in (1, 2):
        pred_in, pred_out = tensors[f"blk.{il}.ffn_gate_pred_in.weight"], tensors[f"blk.{il}.ffn_gate_pred_out.weight"]
        assert [int(d) for d in pred_in.shape] == [256, 64]  # ggml ne
        assert [int(d) for d in pred_out.shape] == [64, n_load - n_static]
        assert pred_in.tensor_type.name == pred_out.tensor_type.name == "F32"  # the gate's
        at = names.index(f"blk.{il}.ffn_down_t.weight")  # right after the layer's FFN tensors
        assert names[at + 1: at + 3] == [f"blk.{il}.ffn_gate_pred_in.weight", f"blk.{il}.ffn_gate_pred_out.weight"]
    assert not any(n.startswith("blk.0.") and "_pred_" in n for n in names), "dense layers have no predictor"
    fields = gguf_fields(out)
    assert fields[si_key("predictor_rank")][:2] == (GGUFValueType.UINT32, 64)
    assert "predictor     gate, rank 64 (ffn_gate_pred_in/out, F32)" in inspect(out)
    assert "FFN weight types F32\n" in inspect(out)
    tensor_bytes = sum(int(t.n_bytes) for t in tensors.values())
    assert tensor_bytes == estimate_output_bytes(SourceGGUF(src), range(1, 3), n_load, n_static=n_static,
                                                 predictor_rank=64)

    convert(src, dense_out, profile=prof, task="qa", load_ratio=0.75, static_ratio=0.25, layers="1:3", progress=False)
    assert not any("_pred_" in t.name for t in GGUFReader(str(dense_out)).tensors)
    assert si_key("predictor_rank") not in gguf_fields(dense_out)
    assert "predictor     none" in inspect(dense_out)


@pytest.mark.parametrize("weight_type", ["F32", "Q8_0"])
def test_gate_statistics_from_the_profile_moments(models, tmp_path, weight_type):
    """A profile with input moments gives every loaded neuron of a sparsified layer, in file order,
    sqrt(w_g C w_g^T), (w_g C w_u^T) / (w_g C w_g^T) and sqrt(w_u C w_u^T) from its source rows
    (dequantized); a profile without them, none."""
    src = models("tiny-llama", weight_type)
    prof = moments_profile(src, tmp_path / "p.safetensors")
    moments = Profile.load(prof).input_moments.astype(np.float64)
    out = tmp_path / "si.gguf"
    convert(src, out, profile=prof, task="qa", load_ratio=0.75, static_ratio=0.25, layers="1:3", progress=False)
    weights = {t.name: np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float64).reshape(
        [int(d) for d in reversed(t.shape)]) for t in GGUFReader(str(src)).tensors}
    r = GGUFReader(str(out))
    for il, ids in kept_ids(out).items():
        gate, up = weights[f"blk.{il}.ffn_gate.weight"][ids], weights[f"blk.{il}.ffn_up.weight"][ids]
        mean_square = np.einsum("ij,jk,ik->i", gate, moments[il], gate)
        slope = np.einsum("ij,jk,ik->i", gate, moments[il], up) / mean_square
        up_rms = np.sqrt(np.einsum("ij,jk,ik->i", up, moments[il], up))
        for key, want in ((si_key("gate_rms", il), np.sqrt(mean_square)), (si_key("up_slope", il), slope),
                          (si_key("up_rms", il), up_rms)):
            assert r.get_field(key).types[-1] == GGUFValueType.FLOAT32
            np.testing.assert_allclose(np.asarray(field(r, key)), want, rtol=1e-4)
    plain = tmp_path / "plain.gguf"
    convert(src, plain, profile=moments_profile(src, tmp_path / "old.safetensors", None), task="qa", load_ratio=0.75,
            static_ratio=0.25, layers="1:3", progress=False)
    assert not any(k.startswith(("selectinfer.gate_rms", "selectinfer.up_slope", "selectinfer.up_rms"))
                   for k in gguf_fields(plain))
    assert not any(k.startswith("selectinfer.gate_mean") for k in gguf_fields(out))  # (no means in that profile)
    assert "compensation  gate statistics:" in inspect(out) and "compensation  none" in inspect(plain)
    assert "step choice   |act(gate)| times each neuron's up rms" in inspect(out)
    assert "step choice   |act(gate)| (gate-guided" in inspect(plain)


def test_gate_means_from_the_profile_means(models, tmp_path):
    """A profile with input means also gives every loaded neuron w_g m and w_u m, the gate's
    within its root mean square; the engine loads them."""
    src = models("tiny-llama", "F32")
    means = np.random.default_rng(6).normal(0, 0.3, (3, 256)).astype(np.float32)
    prof = moments_profile(src, tmp_path / "p.safetensors", input_means=means)
    out = tmp_path / "si.gguf"
    convert(src, out, profile=prof, task="qa", load_ratio=0.75, static_ratio=0.25, layers="1:3", progress=False)
    weights = {t.name: np.asarray(t.data, dtype=np.float64).reshape([int(d) for d in reversed(t.shape)])
               for t in GGUFReader(str(src)).tensors}
    r = GGUFReader(str(out))
    for il, ids in kept_ids(out).items():
        gate, up = weights[f"blk.{il}.ffn_gate.weight"][ids], weights[f"blk.{il}.ffn_up.weight"][ids]
        for key, want in ((si_key("gate_mean", il), gate @ means[il]), (si_key("up_mean", il), up @ means[il])):
            assert r.get_field(key).types[-1] == GGUFValueType.FLOAT32
            np.testing.assert_allclose(np.asarray(field(r, key)), want, rtol=1e-4, atol=1e-6)
        assert np.all(np.abs(field(r, si_key("gate_mean", il))) <= np.asarray(field(r, si_key("gate_rms", il))))
    assert "compensation  gate statistics and means:" in inspect(out)
    with Model(out, n_ctx=64, strategy="gate-guided") as m:
        assert m.selection_config()["compensate"] is True


@pytest.mark.parametrize("weight_type", ["F32", "Q8_0"])
def test_full_rank_predictor_reproduces_the_gathered_gate(models, tmp_path, weight_type):
    """R = n_embd: pred_out @ pred_in is W itself, up to the factors' rounding (in the gate's type).
    With random ranking the profile serves only the predictor; with delta 0 every loaded neuron is
    gathered."""
    src = models("tiny-llama", weight_type)
    prof = moments_profile(src, tmp_path / "p.safetensors")
    for static_ratio in (0.25, 0.0):
        out = tmp_path / f"si{static_ratio}.gguf"
        convert(src, out, profile=prof, ranking="random", load_ratio=0.75, static_ratio=static_ratio, layers="0:3",
                predictor_rank=256, progress=False)
        n_static = 192 if static_ratio else 0
        expected = gathered_gate(src, kept_ids(out), n_static)
        for il, (pred_in, pred_out) in stored_predictors(out).items():
            w = expected[il]
            assert pred_out.shape == (576 - n_static, 256)
            err = np.abs(pred_out @ pred_in - w)
            bound = product_error_bound(pred_in, pred_out, weight_type)
            assert np.all(err <= bound + 1e-9 * np.abs(w).max()), (il, err.max())
            print(f"{weight_type} delta {static_ratio} layer {il}: max |error| {err.max() / np.abs(w).max():.1e} "
                  "of max |W|")
            assert err.max() < 0.05 * np.abs(w).max()
        assert gguf_fields(out)[si_key("profile_digest")][1] == sha256_file(prof)


def test_low_rank_predictor_is_the_whitened_best_approximation(models, tmp_path):
    """R < n_embd: the stored product equals an independent whitened truncated SVD (by Cholesky),
    its mean-square error over the inputs is the tail of the whitened singular values, and it is
    better there than the plain (unwhitened) truncated SVD."""
    src = models("tiny-llama", "F32")
    moments = synthetic_moments()
    prof = moments_profile(src, tmp_path / "p.safetensors", moments)
    out = tmp_path / "si.gguf"
    rank = 64
    convert(src, out, profile=prof, task="qa", load_ratio=0.75, static_ratio=0.25, layers="0:3", predictor_rank=rank,
            progress=False)
    expected_w = gathered_gate(src, kept_ids(out), 192)
    for il, (pred_in, pred_out) in stored_predictors(out).items():
        w, c = expected_w[il], moments[il].astype(np.float64)
        expected = whitened_low_rank(w, moments[il], rank)
        got = pred_out @ pred_in
        err = np.abs(got - expected)
        assert np.all(err <= product_error_bound(pred_in, pred_out, "F32") + 1e-8 * np.abs(expected).max()), \
            (il, err.max())

        def mean_square_error(m):  # E|(W - M) h|^2 = tr((W - M) C (W - M)^T)
            d = w - m
            return np.einsum("ij,jk,ik->", d, c, d)
        u, s, vt = np.linalg.svd(w)
        plain = (u[:, :rank] * s[:rank]) @ vt[:rank]
        optimum = mean_square_error(expected)
        print(f"layer {il}: E|(W-M)h|^2 stored {mean_square_error(got):.4g}, optimum {optimum:.4g}, "
              f"plain SVD {mean_square_error(plain):.4g}, E|Wh|^2 {mean_square_error(0 * w):.4g}")
        assert mean_square_error(got) < 1.01 * optimum < mean_square_error(plain)


def test_rows_of_partial_blocks_are_stored_as_f16(tmp_path):
    """n_embd 80 (not whole blocks of 32): a quantized gate's predictor rows of 80 are F16, as
    predictor_type says; the product is still the whitened best approximation."""
    src = tmp_path / "narrow.gguf"
    make_model(src, "tiny-llama", weight_type="F32", seed=4, n_embd=80, n_ff=256, n_head=2, n_head_kv=1, n_layer=3)
    moments = synthetic_moments(n_embd=80, n_tokens=800)
    info = ModelInfo(sha256_file(src), src.name, "llama", 3, 256)
    Profile(info, [DatasetStats("a", "qa", "test", 1, np.ones((3, 256), np.float32), np.full(3, 10))],
            input_moments=moments).save(tmp_path / "p.safetensors")
    out = tmp_path / "si.gguf"
    convert(src, out, profile=tmp_path / "p.safetensors", task="qa", load_ratio=0.75, static_ratio=0.25, layers="0:3",
            predictor_rank=32, progress=False)
    types = {t.name: t.tensor_type.name for t in GGUFReader(str(out)).tensors}
    assert types["blk.1.ffn_gate_pred_in.weight"] == "F32"  # beside an F32 gate
    assert predictor_type(80, GGMLQuantizationType.Q8_0) == GGMLQuantizationType.F16
    assert predictor_type(32, GGMLQuantizationType.Q4_K) == GGMLQuantizationType.Q8_0
    assert predictor_type(64, GGMLQuantizationType.Q4_1) == GGMLQuantizationType.Q4_1
    assert predictor_type(3072, GGMLQuantizationType.Q4_K) == GGMLQuantizationType.Q4_K
    assert predictor_type(576, GGMLQuantizationType.BF16) == GGMLQuantizationType.F16
    expected_w = gathered_gate(src, kept_ids(out), 64)
    for il, (pred_in, pred_out) in stored_predictors(out).items():
        assert pred_in.shape == (32, 80) and pred_out.shape == (128, 32)
        expected = whitened_low_rank(expected_w[il], moments[il], 32)
        err = np.abs(pred_out @ pred_in - expected)
        assert np.all(err <= product_error_bound(pred_in, pred_out, "F32") + 1e-8 * np.abs(expected).max()), \
            (il, err.max())


def test_memory_budget_counts_the_predictor(models, tmp_path):
    src = models("tiny-llama", "Q8_0")
    source = SourceGGUF(src)
    prof = moments_profile(src, tmp_path / "p.safetensors")

    def need(n_load):  # delta 0.1: 64 static neurons (two Q8_0 blocks)
        return estimate_output_bytes(source, range(0, 3), n_load, n_static=64, predictor_rank=32)
    assert need(300) > estimate_output_bytes(source, range(0, 3), 300, n_static=64) + 3 * 300 * 34
    out = tmp_path / "si.gguf"
    r = convert(src, out, profile=prof, ranking="random", static_ratio=0.1, layers="0:3", predictor_rank=32,
                memory_budget=str((need(300) + need(301)) // 2), progress=False)
    assert r.load_ratio == pytest.approx(300 / 768)
    assert sum(int(t.n_bytes) for t in GGUFReader(str(out)).tensors) == need(300)


def test_predictor_rank_from_the_command_line(models, tmp_path, capsys):
    from selectinfer.cli import main

    src = models("tiny-llama", "F32")
    prof = moments_profile(src, tmp_path / "p.safetensors")
    out = tmp_path / "si.gguf"
    assert main(["convert", str(src), "-o", str(out), "--profile", str(prof), "--task", "qa", "--layers", "1:3",
                 "--predictor-rank", "32"]) == 0
    assert sorted(stored_predictors(out)) == [1, 2]
    assert main(["convert", str(src), "-o", str(tmp_path / "x.gguf"), "--ranking", "random",
                 "--predictor-rank", "32"]) == 1
    assert "pass --profile FILE" in capsys.readouterr().err


@pytest.mark.parametrize("kwargs,moments,match", [
    ({"predictor_rank": 48}, "synthetic", "predictor rank must be a positive multiple of 32"),
    ({"predictor_rank": -32}, "synthetic", "predictor rank must be a positive multiple of 32"),
    ({"predictor_rank": 288}, "synthetic", r"predictor rank 288 exceeds min\(n_embd 256, gathered neurons 384"),
    ({"predictor_rank": 64, "load_ratio": 0.3, "static_ratio": 0.25}, "synthetic",
     r"exceeds min\(n_embd 256, gathered neurons 38 of layer"),
    ({"predictor_rank": 32, "profile": None, "ranking": "random"}, "synthetic", "pass --profile FILE"),
    ({"predictor_rank": 32}, None,
     "profile the model again with this selectinfer: the profile has no FFN input moments"),
    ({"predictor_rank": 32}, np.ones((3, 128, 128), np.float32), "128 wide, the model's inputs 256; profile this"),
    ({"predictor_rank": 32}, np.zeros((3, 256, 256), np.float32), "moments of layer 0 are zero"),
])
def test_bad_predictor_arguments(models, tmp_path, kwargs, moments, match):
    src = models("tiny-llama", "F32")
    prof = moments_profile(src, tmp_path / "p.safetensors", moments)
    args = {"profile": prof, "task": "qa", "load_ratio": 0.75, "static_ratio": 0.25, "layers": "0:3", **kwargs}
    with pytest.raises(ConvertError, match=match) as info:
        convert(src, tmp_path / "out.gguf", progress=False, **args)
    assert "\n" not in str(info.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.safetensors"]


def test_profile_input_moments_round_trip_and_checks(models, tmp_path):
    src = models("tiny-llama", "F32")
    moments = synthetic_moments(n_embd=32, n_tokens=100)
    path = moments_profile(src, tmp_path / "m.safetensors", moments)
    loaded = Profile.load(path).input_moments
    assert loaded.dtype == np.float32 and np.array_equal(loaded, moments)
    assert Profile.load(moments_profile(src, tmp_path / "old.safetensors", None)).input_moments is None
    for name, bad in [("flat", moments[0]), ("layers", moments[:2]), ("square", moments[:, :, :16]),
                      ("nan", np.where(np.eye(32, dtype=bool), np.nan, moments))]:
        bad_path = moments_profile(src, tmp_path / f"{name}.safetensors", bad)
        with pytest.raises(ProfileError, match=rf"{name}.safetensors: input_moments .*profile the model again"):
            Profile.load(bad_path)
    # the means: with the moments, one per layer and channel, finite
    means = np.random.default_rng(5).normal(0, 1, (3, 32)).astype(np.float32)
    loaded = Profile.load(moments_profile(src, tmp_path / "means.safetensors", moments, means))
    assert np.array_equal(loaded.input_means, means) and loaded.input_means.dtype == np.float32
    assert Profile.load(path).input_means is None
    orphan = profile_for(src, input_moments=moments, input_means=means)
    orphan.input_moments = None  # (save writes the means only beside the moments)
    orphan.save(tmp_path / "orphan.safetensors")
    assert Profile.load(tmp_path / "orphan.safetensors").input_means is None
    for name, bad in [("short", means[:, :16]), ("layers", means[:2]), ("nanmean", np.where(means > 1, np.nan, means))]:
        bad_path = moments_profile(src, tmp_path / f"{name}.safetensors", moments, bad)
        with pytest.raises(ProfileError, match=rf"{name}.safetensors: input_means .*profile the model again"):
            Profile.load(bad_path)
