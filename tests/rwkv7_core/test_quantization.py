"""rwkv7_core.quantization: the numpy quantize/dequantize math and the spec checks."""
import ml_dtypes
import numpy as np
import pytest

from rwkv7_core.quantization import (
    QuantizationError,
    QuantSpec,
    dequantize,
    metadata,
    pack_int4,
    quantize,
    quantized_key,
    resolve_spec,
    spec_for,
    stored_spec,
    unpack_int4,
)


def _weight(rng, shape=(48, 256)):
    w = rng.standard_t(3, size=shape).astype(np.float32) * 0.05
    w[:, 7] *= 40  # an outlier input channel
    return w


@pytest.mark.parametrize("group", [64, 128])
def test_int8_error_within_half_a_step_of_its_group(group):
    w = _weight(np.random.default_rng(group))
    q, scale = quantize(w, spec_for("int8", group))
    assert q.dtype == np.int8 and scale.shape == (48, 256 // group) and scale.dtype == np.float32
    assert np.abs(q.astype(int)).max() == 127 and q.min() >= -127
    step = np.repeat(scale, group, axis=1)
    err = np.abs(dequantize(q, scale) - w)
    assert (err <= step / 2 * (1 + 1e-6)).all()
    # every group's largest entry is exact to float32 rounding
    groups = np.abs(w).reshape(48, -1, group).max(-1)
    np.testing.assert_allclose(scale * 127, groups, rtol=1e-6)


def test_fp8_per_row_scale_and_relative_error():
    w = _weight(np.random.default_rng(3))
    q, scale = quantize(w, spec_for("fp8"))
    assert q.dtype == ml_dtypes.float8_e4m3fn and scale.shape == (48, 1)
    np.testing.assert_allclose(np.abs(q.astype(np.float32)).max(1), 448.0)
    err = np.abs(dequantize(q, scale) - w)
    bound = np.maximum(np.abs(w) * 2.0 ** -4, scale * 2.0 ** -10)  # 3 mantissa bits; subnormal step 2^-9
    assert (err <= bound * (1 + 1e-6)).all()


def test_zero_rows_stay_zero():
    w = np.zeros((16, 64), np.float32)
    for spec in (spec_for("int8", 32), spec_for("fp8")):
        q, scale = quantize(w, spec)
        assert np.isfinite(scale).all() and (dequantize(q, scale) == 0).all()


def test_which_keys_are_quantized():
    assert quantized_key("head.weight") and quantized_key("blocks.3.att.output.weight")
    assert quantized_key("blocks.0.ffn.value.weight") and quantized_key("blocks.11.att.receptance.weight")
    for key in ("emb.weight", "blocks.0.att.w1", "blocks.0.ln1.weight", "blocks.0.ffn.x_k", "blocks.0.att.x_r"):
        assert not quantized_key(key)


def test_bad_requests_name_the_problem():
    with pytest.raises(QuantizationError, match="unknown quantization 'int3'"):
        spec_for("int3")
    with pytest.raises(QuantizationError, match="applies to int8 and int4 only"):
        spec_for("fp8", 64)
    with pytest.raises(QuantizationError, match="group size 24"):
        spec_for("int8", 24)
    with pytest.raises(QuantizationError, match=r"key 'head.weight': quantization group size 96 does not divide its width 128"):
        quantize(np.ones((4, 128), np.float32), spec_for("int8", 96), "head.weight")
    stored = QuantSpec("int8", 64)
    with pytest.raises(QuantizationError, match="holds int8 \\(groups of 64\\) weights but quantization fp8"):
        resolve_spec("fp8", None, stored, "m.safetensors")
    with pytest.raises(QuantizationError, match="quantization none was requested"):
        resolve_spec("none", None, stored, "m.safetensors")
    with pytest.raises(QuantizationError, match="groups of 128"):
        resolve_spec("int8", 128, stored, "m.safetensors")
    assert resolve_spec("int8", None, stored) == stored and resolve_spec("none", None, None) is None


@pytest.mark.parametrize("group", [16, 64, 128])
def test_int4_error_within_half_a_step_of_its_group(group):
    rng = np.random.default_rng(100 + group)
    w = _weight(rng, (37, 3 * group))  # odd rows, several groups
    q, scale = quantize(w, spec_for("int4", group))
    assert q.dtype == np.uint8 and q.shape == (37, 3 * group // 2) and scale.shape == (37, 3)
    values = unpack_int4(q, group)
    assert values.min() >= -7 and values.max() <= 7  # symmetric: -8 never used
    step = np.repeat(scale, group, axis=1)
    assert (np.abs(dequantize(q, scale) - w) <= step / 2 * (1 + 1e-6)).all()
    groups = np.abs(w).reshape(37, -1, group).max(-1)
    np.testing.assert_allclose(scale * 7, groups, rtol=1e-6)
    np.testing.assert_array_equal(np.abs(values).reshape(37, -1, group).max(-1), 7)


@pytest.mark.parametrize("group", [16, 64])
def test_int4_packing_layout_and_round_trip(group):
    """Every 4-bit value in every position survives pack/unpack, and byte j of a group holds
    channel j (low nibble) and channel j + G / 2 (high nibble)."""
    rng = np.random.default_rng(group)
    q = rng.integers(-8, 8, size=(5, 4 * group), dtype=np.int8)
    packed = pack_int4(q, group)
    assert packed.dtype == np.uint8 and packed.shape == (5, 2 * group)
    np.testing.assert_array_equal(unpack_int4(packed, group), q)
    j, g = rng.integers(group // 2), rng.integers(4)
    byte = packed[:, g * group // 2 + j].astype(np.int16)
    low, high = q[:, g * group + j], q[:, g * group + group // 2 + j]
    np.testing.assert_array_equal(byte & 0xF, low.astype(np.int16) & 0xF)
    np.testing.assert_array_equal(byte >> 4, high.astype(np.int16) & 0xF)


def test_int4_spec_checks_and_metadata():
    spec = spec_for("int4")
    assert spec.scheme == "int4" and spec.group_size > 0 and spec.describe() == f"int4 (groups of {spec.group_size})"
    assert stored_spec(metadata(spec_for("int4", 128))) == QuantSpec("int4", 128)
    with pytest.raises(QuantizationError, match=r"key 'blocks.0.ffn.key.weight': quantization group size 128 "
                                                r"does not divide its width 192"):
        quantize(np.ones((8, 192), np.float32), spec_for("int4", 128), "blocks.0.ffn.key.weight")
    with pytest.raises(QuantizationError, match="holds int4 \\(groups of 64\\) weights but quantization int8"):
        resolve_spec("int8", None, QuantSpec("int4", 64), "m.safetensors")
    w = np.zeros((16, 64), np.float32)
    q, scale = quantize(w, spec_for("int4", 32))
    assert np.isfinite(scale).all() and (dequantize(q, scale) == 0).all()


@pytest.mark.parametrize("scheme,group", [("int4", 64), ("int8", 32)])
def test_scale_search_never_raises_the_weighted_error_and_lowers_it_on_heavy_tails(scheme, group):
    rng = np.random.default_rng(7)
    w = _weight(rng, (40, 4 * group))
    importance = rng.gamma(0.5, size=4 * group) * np.where(rng.random(4 * group) < 0.05, 30.0, 1.0)
    spec = spec_for(scheme, group)

    def weighted_error(q, scale):
        return ((dequantize(q, scale) - w) ** 2 * importance).reshape(40, 4, group).sum(-1)

    rtn, searched = weighted_error(*quantize(w, spec)), weighted_error(*quantize(w, spec, importance=importance))
    assert (searched <= rtn * (1 + 1e-6)).all()
    assert searched.sum() < (0.9 if scheme == "int4" else 0.97) * rtn.sum()  # int8: 0.92 measured
    with pytest.raises(QuantizationError, match="a scale search needs int8 / int4"):
        quantize(w, spec_for("fp8"), "head.weight", importance)
