"""A SelectInfer GGUF is untrusted input: every selectinfer.* key and every SelectInfer layer's tensors
are checked when the model loads (cpp/llama/si_gguf.cpp), and what does not fit is refused with
ModelLoadError naming the key and the layer, in Python and in the CLI."""
import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf import GGUFValueType as V
from helpers import gguf_fields, gguf_tensors, make_si_model, write_gguf

from selectinfer import Model, ModelLoadError, _native
from selectinfer.runtime.si_format import key as si_key


@pytest.fixture(scope="module")
def si_parts(tmp_path_factory):
    """The metadata and tensors of a tiny SelectInfer llama (N 256, gamma 0.75, delta 0.25, layers 1..2)."""
    _, si = make_si_model(tmp_path_factory.mktemp("validation"), seed=3, layers="1:3")
    return si, gguf_fields(si), gguf_tensors(si)


def with_fields(fields, **changes):
    out = dict(fields)
    for key, value in changes.items():
        key = key.replace("__", ".")
        if value is None:
            out.pop(key)
        else:
            out[key] = value
    return out


def arr(values, item=V.INT32):
    return (V.ARRAY, list(values), item)


def ids_of(fields, il):
    return list(fields[si_key("neuron_ids", il)][1])


# (what is changed, the message it must give)
BAD_METADATA = [
    (dict(selectinfer__format_version=(V.UINT32, 1, None)),
     r"selectinfer.format_version = 1: this build of selectinfer reads version 2; convert the model again"),
    (dict(selectinfer__format_version=(V.STRING, "1", None)), r"selectinfer.format_version is a str, not an integer"),
    (dict(selectinfer__original_feed_forward_length=(V.UINT32, 0, None)), r"original_feed_forward_length = 0 is outside"),
    (dict(selectinfer__original_feed_forward_length=(V.UINT32, 100, None)), r"blk.1.ffn_down_static and ffn_down_t hold 192 neurons, outside \[1, .* = 100\]"),
    (dict(selectinfer__original_feed_forward_length=None), r"original_feed_forward_length is missing"),
    (dict(selectinfer__load_ratio=(V.FLOAT32, float("nan"), None)), r"selectinfer.load_ratio = nan is outside \[0, 1\]"),
    (dict(selectinfer__load_ratio=(V.FLOAT32, 1.5, None)), r"selectinfer.load_ratio = 1.5 is outside"),
    (dict(selectinfer__static_ratio=(V.FLOAT32, 0.9, None)), r"selectinfer.static_ratio = 0.9 is outside \[0, 0.75\]"),
    (dict(selectinfer__compute_ratio=(V.FLOAT32, 0.9, None)), r"selectinfer.compute_ratio = 0.9 is outside"),
    (dict(selectinfer__token_ratio=(V.FLOAT32, 0.0, None)), r"selectinfer.token_ratio must be > 0"),
    (dict(selectinfer__token_ratio=(V.FLOAT32, float("inf"), None)), r"selectinfer.token_ratio = inf is outside"),
    (dict(selectinfer__strategy=(V.STRING, "best", None)),
     r"selectinfer.strategy = 'best' is not a strategy \(frequency, sum-magnitude, fixed, gate-guided or predicted\)"),
    (dict(selectinfer__strategy=(V.STRING, b"\xbb\x01fixed", None)), r"selectinfer.strategy = '\?\?fixed' is not a strategy"),
    (dict(selectinfer__strategy=(V.UINT32, 2, None)), r"selectinfer.strategy is a u32, not a string"),
    (dict(selectinfer__layers=arr([])), r"selectinfer.layers is empty"),
    (dict(selectinfer__layers=arr([1]), selectinfer__static_counts=arr([64])), r"blk.2 is a SelectInfer layer \(ffn_down_static, ffn_down_t\) but layer 2 is not in selectinfer.layers"),
    (dict(selectinfer__layers=arr([2, 1])), r"selectinfer.layers is not strictly increasing"),
    (dict(selectinfer__layers=arr([1, 7])), r"selectinfer.layers lists layer 7 of a model with 3 layers"),
    (dict(selectinfer__layers=arr([0, 1])), r"selectinfer.layers lists layer 0 but blk.0 has neither ffn_down_static nor ffn_down_t"),
    (dict(selectinfer__layers=(V.STRING, "1,2", None)), r"selectinfer.layers is not an array"),
    (dict(selectinfer__layers=arr([1.0, 2.0], V.FLOAT32)), r"selectinfer.layers is an array of f32, not of integers"),
    (dict(selectinfer__static_counts=arr([64])), r"selectinfer.static_counts has 1 entries for the 2 layers"),
    (dict(selectinfer__static_counts=arr([64, -1])), r"gives layer 2 -1 static neurons"),
    (dict(selectinfer__static_counts=arr([64, 193])), r"gives layer 2 193 static neurons \(blk.2.ffn_down_static holds 64"),
    (dict(selectinfer__static_counts=arr([64, 32])), r"gives layer 2 32 static neurons .*static_count = 64"),
    (dict(selectinfer__static_count=(V.INT32, -5, None)), r"selectinfer.static_count = -5 is outside"),
    (dict(selectinfer__neuron_ids__2=None), r"selectinfer.neuron_ids.2 is missing"),
]


@pytest.mark.parametrize("changes,message", BAD_METADATA, ids=[m for _, m in BAD_METADATA])
def test_bad_metadata_is_refused_naming_the_key(si_parts, tmp_path, changes, message):
    _, fields, tensors = si_parts
    path = write_gguf(tmp_path / "bad.gguf", with_fields(fields, **changes), tensors)
    with pytest.raises(ModelLoadError, match=message):
        Model(path, n_ctx=64)


@pytest.mark.parametrize("edit,message", [
    (lambda ids: ids[:-1], r"selectinfer.neuron_ids.1 has 191 ids for the 192 neurons of layer 1"),
    (lambda ids: ids[:-1] + [ids[0]], r"selectinfer.neuron_ids.1 holds neuron \d+ twice"),
    (lambda ids: ids[:-1] + [256], r"selectinfer.neuron_ids.1 holds neuron 256, outside \[0, 256\)"),
    (lambda ids: ids[:-1] + [-3], r"selectinfer.neuron_ids.1 holds neuron -3, outside"),
])
def test_bad_neuron_ids_are_refused(si_parts, tmp_path, edit, message):
    _, fields, tensors = si_parts
    changed = with_fields(fields, selectinfer__neuron_ids__1=arr(edit(ids_of(fields, 1))))
    with pytest.raises(ModelLoadError, match=message):
        Model(write_gguf(tmp_path / "bad.gguf", changed, tensors), n_ctx=64)


GOOD_SHARES = (np.linspace(0.008, 0.001, 192) / 1.0).astype(np.float32).tolist()  # sums to 0.86


@pytest.mark.parametrize("layer1,layer2,message", [
    (GOOD_SHARES[:-1], GOOD_SHARES, r"selectinfer.neuron_shares.1 has 191 shares for the 192 neurons of layer 1"),
    (GOOD_SHARES[::-1], GOOD_SHARES, r"selectinfer.neuron_shares.1 is not in decreasing order"),
    ([float("nan")] + GOOD_SHARES[1:], GOOD_SHARES, r"selectinfer.neuron_shares.1 holds -?nan, not a share in \[0, 1\]"),
    (GOOD_SHARES, [2.0] + GOOD_SHARES[1:], r"selectinfer.neuron_shares.2 holds 2.0+, not a share"),
    (GOOD_SHARES, [-0.0001] * 192, r"selectinfer.neuron_shares.2 holds -0.0001"),
    ([0.9] * 2 + GOOD_SHARES[2:], GOOD_SHARES, r"selectinfer.neuron_shares.1 sums to 2.6\d+, more than the layer's whole mass"),
    ([1] * 192, GOOD_SHARES, r"selectinfer.neuron_shares.1 is an array of i32, not of f32"),
    (GOOD_SHARES, None, r"selectinfer.neuron_shares.2 is missing, but other layers have their shares"),
    (None, GOOD_SHARES, r"selectinfer.neuron_shares.1 is missing, but other layers have their shares"),
])
def test_bad_neuron_shares_are_refused(si_parts, tmp_path, layer1, layer2, message):
    _, fields, tensors = si_parts

    changes = {f"selectinfer__neuron_shares__{il}": arr(values, V.INT32 if isinstance(values[0], int) else V.FLOAT32)
               for il, values in ((1, layer1), (2, layer2)) if values is not None}
    changed = with_fields(fields, **changes)
    with pytest.raises(ModelLoadError, match=message):
        Model(write_gguf(tmp_path / "bad.gguf", changed, tensors), n_ctx=64)


def test_good_neuron_shares_give_per_layer_budgets(si_parts, tmp_path):
    """The same shares in both layers share the bytes out evenly; one layer's heavier head draws more."""
    _, fields, tensors = si_parts
    even = with_fields(fields, selectinfer__neuron_shares__1=arr(GOOD_SHARES, V.FLOAT32),
                       selectinfer__neuron_shares__2=arr(GOOD_SHARES, V.FLOAT32))
    with Model(write_gguf(tmp_path / "even.gguf", even, tensors), n_ctx=64, compute_ratio=0.4, layer_budgets="profile") as m:
        assert m.computed_counts() == {1: 102, 2: 102}
    flat = [0.86 / 192] * 192
    uneven = with_fields(even, selectinfer__neuron_shares__2=arr(flat, V.FLOAT32))
    with Model(write_gguf(tmp_path / "uneven.gguf", uneven, tensors), n_ctx=64, compute_ratio=0.4,
               layer_budgets="profile") as m:
        counts = m.computed_counts()
    assert sum(counts.values()) == 204 and counts[1] != counts[2]


GOOD_RMS, GOOD_SLOPE = [1.0] * 192, [0.5] * 192
MEANS = [0.25] * 192
BOTH_MEANS = {f"{name}__{il}": MEANS for il in (1, 2) for name in ("gate_mean", "up_mean")}
BOTH_RMS = {f"up_rms__{il}": GOOD_RMS for il in (1, 2)}


@pytest.mark.parametrize("changes,message", [
    ({"gate_rms__1": GOOD_RMS[:-1]}, r"selectinfer.gate_rms.1 has 191 values for the 192 neurons of layer 1"),
    ({"up_slope__2": GOOD_SLOPE + [0.5]}, r"selectinfer.up_slope.2 has 193 values for the 192 neurons of layer 2"),
    ({"gate_rms__1": [-1.0] + GOOD_RMS[1:]}, r"selectinfer.gate_rms.1 holds -1.0+, not a finite root mean square >= 0"),
    ({"gate_rms__2": [float("inf")] + GOOD_RMS[1:]}, r"selectinfer.gate_rms.2 holds inf, not a finite root mean square"),
    ({"up_slope__1": [float("nan")] + GOOD_SLOPE[1:]}, r"selectinfer.up_slope.1 holds -?nan, not a finite slope"),
    ({"up_slope__1": None}, r"selectinfer.gate_rms.1 is present but selectinfer.up_slope.1 is not"),
    ({"gate_rms__2": None}, r"selectinfer.up_slope.2 is present but selectinfer.gate_rms.2 is not"),
    ({"gate_rms__2": None, "up_slope__2": None}, r"selectinfer.gate_rms.2 is missing, but other layers have their gate statistics"),
    ({"gate_rms__1": [1] * 192}, r"selectinfer.gate_rms.1 is an array of i32, not of f32"),
    # the optional means
    ({"gate_mean__1": MEANS}, r"selectinfer.gate_mean.1 is present but selectinfer.up_mean.1 is not"),
    ({"up_mean__2": MEANS}, r"selectinfer.up_mean.2 is present but selectinfer.gate_mean.2 is not"),
    ({"gate_mean__1": MEANS, "up_mean__1": MEANS}, r"selectinfer.gate_mean.2 is missing, but other layers have their gate means"),
    ({**BOTH_MEANS, "gate_mean__2": [1.5] + MEANS[1:]}, r"selectinfer.gate_mean.2 holds 1.5\d*, larger than the gate's root mean square"),
    ({**BOTH_MEANS, "up_mean__1": [float("nan")] + MEANS[1:]}, r"selectinfer.up_mean.1 holds -?nan, not a finite mean"),
    ({**BOTH_MEANS, "gate_mean__1": MEANS[:-1]}, r"selectinfer.gate_mean.1 has 191 values for the 192 neurons of layer 1"),
    ({**BOTH_MEANS, "gate_rms__2": None, "up_slope__2": None}, r"selectinfer.gate_mean.2 is present but selectinfer.gate_rms.2 is not"),
    # the optional up root mean squares (a step's weights)
    ({"up_rms__1": GOOD_RMS}, r"selectinfer.up_rms.2 is missing, but other layers have their up root mean squares"),
    ({**BOTH_RMS, "up_rms__2": [-0.5] + GOOD_RMS[1:]}, r"selectinfer.up_rms.2 holds -0.50*, not a finite root mean square >= 0"),
    ({**BOTH_RMS, "up_rms__1": [float("nan")] + GOOD_RMS[1:]}, r"selectinfer.up_rms.1 holds -?nan, not a finite root mean square"),
    ({**BOTH_RMS, "up_rms__1": GOOD_RMS + [1.0]}, r"selectinfer.up_rms.1 has 193 values for the 192 neurons of layer 1"),
    ({**BOTH_RMS, "gate_rms__2": None, "up_slope__2": None}, r"selectinfer.up_rms.2 is present but selectinfer.gate_rms.2 is not"),
])
def test_bad_gate_statistics_are_refused(si_parts, tmp_path, changes, message):
    _, fields, tensors = si_parts
    stats = {f"selectinfer__{name}__{il}": arr(values, V.FLOAT32)
             for il in (1, 2) for name, values in (("gate_rms", GOOD_RMS), ("up_slope", GOOD_SLOPE))}
    for key, values in changes.items():
        stats[f"selectinfer__{key}"] = None if values is None else arr(
            values, V.INT32 if isinstance(values[0], int) else V.FLOAT32)
    changed = with_fields(fields, **{k: v for k, v in stats.items() if v is not None})  # None: left out
    with pytest.raises(ModelLoadError, match=message):
        Model(write_gguf(tmp_path / "bad.gguf", changed, tensors), n_ctx=64)


def test_good_gate_statistics_turn_compensation_on(si_parts, tmp_path):
    _, fields, tensors = si_parts
    good = with_fields(fields, **{f"selectinfer__{name}__{il}": arr(values, V.FLOAT32)
                                  for il in (1, 2) for name, values in (("gate_rms", GOOD_RMS), ("up_slope", GOOD_SLOPE))})
    with Model(write_gguf(tmp_path / "good.gguf", good, tensors), n_ctx=64, strategy="gate-guided") as m:
        assert m.selection_config()["compensate"] is True
        assert len(m.generate("the capital of", max_tokens=3, temperature=0)) > 0
    with_means = with_fields(good, **{f"selectinfer__{key}": arr(values, V.FLOAT32) for key, values in BOTH_MEANS.items()})
    with Model(write_gguf(tmp_path / "means.gguf", with_means, tensors), n_ctx=64, strategy="gate-guided") as m:
        assert m.selection_config()["compensate"] is True
        assert len(m.generate("the capital of", max_tokens=3, temperature=0)) > 0
    with_up_rms = with_fields(good, **{f"selectinfer__{key}": arr(values, V.FLOAT32) for key, values in BOTH_RMS.items()})
    for strategy in ("gate-guided", "frequency"):
        with Model(write_gguf(tmp_path / "up_rms.gguf", with_up_rms, tensors), n_ctx=64, strategy=strategy) as m:
            assert len(m.generate("the capital of", max_tokens=3, temperature=0)) > 0


def test_ffn_down_t_without_metadata_is_refused(si_parts, tmp_path):
    _, fields, tensors = si_parts
    dense_keys = {k: v for k, v in fields.items() if not k.startswith("selectinfer.")}
    with pytest.raises(ModelLoadError, match=r"blk.1 is a SelectInfer layer without selectinfer.format_version"):
        Model(write_gguf(tmp_path / "bad.gguf", dense_keys, tensors), n_ctx=64)


def reshaped(t, ne):
    """Tensor t with shape ne (F32; zeros, or its own values when they fit)."""
    data = np.zeros(int(np.prod(ne)), dtype=np.float32)
    return dict(t, data=data.view(np.uint8), ne=list(ne))


@pytest.mark.parametrize("edit,message", [
    # the two parts of the down projection must add up to the layer's width
    (lambda t: None if t["name"] == "blk.1.ffn_down_t.weight" else t,
     r"blk.1.ffn_down_static and ffn_down_t hold 64 \+ 0 neurons, but feed_forward_length gives the layer 192"),
    (lambda t: reshaped(t, [64, 100]) if t["name"] == "blk.2.ffn_down_t.weight" else t,
     r"blk.2.ffn_down_static and ffn_down_t hold 64 \+ 100 neurons"),
    # the static part in upstream's layout: [n_static, n_embd]
    (lambda t: reshaped(t, [64, 32]) if t["name"] == "blk.1.ffn_down_static.weight" else t,
     r"tensor 'blk.1.ffn_down_static.weight' has wrong shape"),
    # gate rows fewer than the static neurons: left whole by the loader, refused by its shape
    (lambda t: reshaped(t, [64, 32]) if t["name"] == "blk.1.ffn_gate.weight" else t,
     r"blk.1.ffn_gate.weight.*(shape|dimensions)"),
])
def test_bad_layer_tensors_are_refused(si_parts, tmp_path, edit, message):
    _, fields, tensors = si_parts
    changed = [e for e in (edit(t) for t in tensors) if e is not None]
    with pytest.raises(ModelLoadError, match=message):
        Model(write_gguf(tmp_path / "bad.gguf", fields, changed), n_ctx=64)


def bias(name, n):
    return {"name": name, "data": np.zeros(n, dtype=np.float32).view(np.uint8), "ne": [n], "type": Q.F32}


@pytest.mark.parametrize("extra,message", [
    (bias("blk.1.ffn_up.bias", 192), r"blk.1.ffn_up.bias is present: a SelectInfer layer's FFN is computed without it"),
    (bias("blk.2.ffn_gate.bias", 192), r"blk.2.ffn_gate.bias is present"),
])
def test_a_selectinfer_layer_with_biases_is_refused(si_parts, tmp_path, extra, message):
    _, fields, tensors = si_parts
    with pytest.raises(ModelLoadError, match=message):
        Model(write_gguf(tmp_path / "bad.gguf", fields, tensors + [extra]), n_ctx=64)


def test_a_weight_type_the_sparse_ops_lack_is_refused(si_parts, tmp_path):
    _, fields, tensors = si_parts
    changed = []
    for t in tensors:
        if t["name"] == "blk.1.ffn_up.weight":
            values = t["data"].view(np.float32).reshape(t["ne"][1], t["ne"][0])
            t = dict(t, data=_native.quantize_rows(int(Q.IQ4_NL), values).reshape(-1), type=Q.IQ4_NL)
        changed.append(t)
    with pytest.raises(ModelLoadError, match=r"blk.1.ffn_up is IQ4_NL, a type the sparse kernels do not compute"):
        Model(write_gguf(tmp_path / "bad.gguf", fields, changed), n_ctx=64)



def zeros(name, ne):
    return {"name": name, "data": np.zeros(int(np.prod(ne)), dtype=np.float32).view(np.uint8), "ne": list(ne),
            "type": Q.F32}


@pytest.mark.parametrize("extra,message", [
    ([zeros("blk.1.ffn_gate_pred_in.weight", [64, 32])], r"blk.1.ffn_gate_pred_in and ffn_gate_pred_out: .* needs both"),
    ([zeros("blk.1.ffn_gate_pred_out.weight", [32, 128])], r"needs both"),
    ([zeros("blk.1.ffn_gate_pred_in.weight", [64, 32]), zeros("blk.1.ffn_gate_pred_out.weight", [32, 100])],
     r"tensor 'blk.1.ffn_gate_pred_out.weight' has wrong shape"),
    ([zeros("blk.1.ffn_gate_pred_in.weight", [64, 32]), zeros("blk.1.ffn_gate_pred_out.weight", [16, 128])],
     r"tensor 'blk.1.ffn_gate_pred_out.weight' has wrong shape"),
])
def test_a_broken_gate_predictor_is_refused(si_parts, tmp_path, extra, message):
    _, fields, tensors = si_parts
    with pytest.raises(ModelLoadError, match=message):
        Model(write_gguf(tmp_path / "bad.gguf", fields, tensors + extra), n_ctx=64)


def test_the_predicted_strategy_needs_every_layer_s_predictor(si_parts, tmp_path):
    _, fields, tensors = si_parts
    one_layer = [zeros("blk.1.ffn_gate_pred_in.weight", [64, 32]), zeros("blk.1.ffn_gate_pred_out.weight", [32, 128])]
    path = write_gguf(tmp_path / "half.gguf", fields, tensors + one_layer)
    with Model(path, n_ctx=64) as m:  # the other strategies do not read it
        m.generate(m.tokenize("the capital of"), 2, temperature=0)
    with pytest.raises(ValueError, match="which layer 2 lacks: convert the model with --predictor-rank"):
        Model(path, n_ctx=64, strategy="predicted")


def test_the_cli_refuses_in_one_line(si_parts, tmp_path, cli):
    _, fields, tensors = si_parts
    path = write_gguf(tmp_path / "bad.gguf", with_fields(fields, selectinfer__format_version=(V.UINT32, 9, None)),
                      tensors)
    r = cli("-m", path, "-p", "x", "-n", "1")
    assert r.returncode == 1
    assert "selectinfer.format_version = 9" in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_an_unchanged_copy_still_loads(si_parts, tmp_path):
    """The rewriting itself keeps a valid file valid: the refusals above come from the edits."""
    si, fields, tensors = si_parts
    copy = write_gguf(tmp_path / "copy.gguf", fields, tensors)
    with Model(si, n_ctx=64) as a, Model(copy, n_ctx=64) as b:
        assert a.generate("the capital", max_tokens=4, temperature=0) == b.generate("the capital", max_tokens=4,
                                                                                     temperature=0)


def test_a_message_quoting_bytes_from_the_file_is_still_text(si_parts, tmp_path):
    """An error that quotes the file (here an architecture name that is not UTF-8) is ModelLoadError
    with the bad bytes replaced, not a UnicodeDecodeError from turning it into a Python string."""
    _, fields, tensors = si_parts
    changed = with_fields(fields, general__architecture=(V.STRING, b"l\xbbama", None))
    with pytest.raises(ModelLoadError, match="unknown model architecture: 'l\ufffdama'"):
        Model(write_gguf(tmp_path / "bad.gguf", changed, tensors), n_ctx=64)


def test_a_converted_file_holds_the_format_tables_keys(si_parts):
    """The converter writes the keys of the engine's format table (cpp/llama/si_format.h): every
    required one, at the table's version and type, and no selectinfer.* key the table lacks."""
    from selectinfer import _native

    _, fields, _ = si_parts
    table = _native.FORMAT["keys"]
    ours = {k for k in fields if k.startswith("selectinfer.")}
    layers = list(fields[si_key("layers")][1])
    names = {e["name"] + (str(il) if e["per_layer"] else "") for e in table.values()
             for il in (layers if e["per_layer"] else [None])}
    assert ours <= names, ours - names
    for key_id, e in table.items():
        if e["required"]:
            for il in (layers if e["per_layer"] else [None]):
                assert si_key(key_id, il) in fields, key_id
    gguf_type = {"u32": V.UINT32, "f32": V.FLOAT32, "str": V.STRING, "arr_i32": V.ARRAY, "arr_f32": V.ARRAY}
    for name in ours:
        key_id = next(i for i, e in table.items() if name == e["name"] or (e["per_layer"] and name.startswith(e["name"])))
        assert fields[name][0] == gguf_type[table[key_id]["type"]], name
    assert fields[si_key("format_version")][1] == _native.FORMAT["version"]


def test_no_format_key_is_spelled_outside_the_table():
    """The format's keys are spelled once, in cpp/llama/si_format.h: the reader, the converter,
    bench, eval and the scripts take them from it (grep for each key's name as a quoted string)."""
    import re
    from pathlib import Path

    from selectinfer import _native

    root = Path(__file__).resolve().parent.parent
    table = root / "cpp" / "llama" / "si_format.h"
    sources = [p for folder in ("cpp", "python", "scripts") for p in (root / folder).rglob("*")
               if p.suffix in (".h", ".cpp", ".cu", ".cuh", ".py", ".sh") and p != table]
    names = [e["name"] for e in _native.FORMAT["keys"].values()]
    spelled = re.compile("[\"']" + "(" + "|".join(re.escape(n) for n in names) + ")")
    found = [f"{p.relative_to(root)}:{n}: {line.strip()}" for p in sources
             for n, line in enumerate(p.read_text(errors="replace").splitlines(), 1) if spelled.search(line)]
    assert not found, "\n".join(found)
    assert spelled.search(table.read_text())  # the check would see a spelled key


def test_gate_statistics_too_large_for_float32_are_refused(si_parts, tmp_path):
    # finite, valid one by one, but the expected outputs they give overflow float32: refused when
    # the compensation is worked out, naming the layer, not left to fill the logits with inf
    _, fields, tensors = si_parts
    huge = with_fields(fields, **{f"selectinfer__{name}__{il}": arr(values, V.FLOAT32)
                                  for il in (1, 2) for name, values in (("gate_rms", [3e38] * 192), ("up_slope", GOOD_SLOPE))})
    with pytest.raises(ModelLoadError, match=r"gate statistics of layer 1 give a dropped-neuron compensation that is not finite"):
        with Model(write_gguf(tmp_path / "huge.gguf", huge, tensors), n_ctx=64, strategy="gate-guided") as m:
            m.generate("the capital of", max_tokens=2, temperature=0)
    with Model(write_gguf(tmp_path / "huge.gguf", huge, tensors), n_ctx=64, strategy="gate-guided", compensate=False) as m:
        assert len(m.generate("the capital of", max_tokens=2, temperature=0)) > 0
