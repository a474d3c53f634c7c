"""Weight-type variants made with llama.cpp's quantizer from the same tree."""
import numpy as np
import pytest
from reference import ReferenceModel

from selectinfer import Model, ModelLoadError, quantize


@pytest.mark.parametrize("weight_type", ["F16", "Q8_0", "Q4_0"])
def test_quantized_variant_loads_and_matches_reference(tiny_model, tmp_path, weight_type):
    src = tiny_model("tiny-llama", "F32")
    out = quantize(src, tmp_path / f"tiny.{weight_type}.gguf", weight_type)
    with Model(out, n_ctx=64) as m:
        assert weight_type in repr(m)
        tokens = m.tokenize("the capital of france")
        got = m.logits(tokens)
    expected = ReferenceModel.load(out).forward(tokens)  # the quantized file's own weights
    assert np.abs(got - expected).max() < 3e-2 * np.abs(expected).max()
    assert out.stat().st_size < src.stat().st_size


def test_quantize_errors_leave_no_file(tiny_model, tmp_path):
    with pytest.raises(ValueError, match="unknown weight type 'Q9'"):
        quantize(tiny_model("tiny-llama", "F32"), tmp_path / "x.gguf", "Q9")
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + bytes(100))
    with pytest.raises(ModelLoadError):
        quantize(bad, tmp_path / "y.gguf", "F16")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.gguf"]
