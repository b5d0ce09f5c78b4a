"""rwkv7_core.gptq: GPTQ rounding against round-to-nearest on fresh random layers."""
import numpy as np
import pytest

from rwkv7_core.gptq import DAMP, inverse_factor, quantize_gptq
from rwkv7_core.quantization import QuantizationError, dequantize, quantize, spec_for


def correlated_inputs(rng, rows: int, width: int) -> np.ndarray:
    """Inputs [rows, width] with correlated channels and a few loud ones (as hidden states have)."""
    x = rng.standard_normal((rows, width)) @ rng.standard_normal((width, width)) / np.sqrt(width)
    x[:, rng.choice(width, 3, replace=False)] *= 6.0
    return x


def output_error(x: np.ndarray, w: np.ndarray, w_q: np.ndarray) -> float:
    return float(((x @ (w - w_q).T) ** 2).mean())


@pytest.mark.parametrize("scheme,group", [("int4", 32), ("int4", 64), ("int8", 32)])
def test_gptq_output_error_is_below_round_to_nearest(scheme, group):
    rng = np.random.default_rng()
    out, width = 96, 128
    x = correlated_inputs(rng, 2048, width)
    w = (rng.standard_t(3, (out, width)) * 0.05).astype(np.float32)
    spec = spec_for(scheme, group)
    gram = x.T @ x / len(x)
    q, scale = quantize_gptq(w, spec, gram)
    rtn_q, rtn_scale = quantize(w, spec)
    assert q.dtype == rtn_q.dtype and q.shape == rtn_q.shape and scale.shape == rtn_scale.shape
    assert scale.dtype == np.float32 and (scale > 0).all()
    gptq_err = output_error(x, w, dequantize(q, scale))
    rtn_err = output_error(x, w, dequantize(rtn_q, rtn_scale))
    assert gptq_err < 0.8 * rtn_err, (gptq_err, rtn_err)


def test_uncorrelated_equal_inputs_leave_nothing_to_compensate():
    """With a diagonal Gram matrix, U is diagonal: no error moves, GPTQ is round-to-nearest."""
    rng = np.random.default_rng()
    w = rng.standard_normal((40, 64)).astype(np.float32)
    gram = np.diag(rng.uniform(0.5, 2.0, 64))
    for scheme in ("int8", "int4"):
        spec = spec_for(scheme, 32)
        q, scale = quantize_gptq(w, spec, gram)
        rtn_q, rtn_scale = quantize(w, spec)
        np.testing.assert_array_equal(q, rtn_q)
        np.testing.assert_array_equal(scale, rtn_scale)


def test_inverse_factor_and_dead_channels():
    rng = np.random.default_rng()
    x = correlated_inputs(rng, 500, 48)
    x[:, [5, 17]] = 0.0  # two channels that never carry a value
    gram = x.T @ x / len(x)
    u, dead = inverse_factor(gram)
    assert np.flatnonzero(dead).tolist() == [5, 17]
    assert np.allclose(u, np.triu(u))
    damped = gram.copy()
    damped[[5, 17], [5, 17]] = 1.0
    damped += DAMP * np.mean(np.diag(damped)) * np.eye(48)
    np.testing.assert_allclose(u.T @ u, np.linalg.inv(damped), rtol=1e-6, atol=1e-9)
    w = rng.standard_normal((8, 48)).astype(np.float32)
    q, scale = quantize_gptq(w, spec_for("int8", 16), gram)
    assert (q[:, [5, 17]] == 0).all()


def test_gptq_refuses_what_it_cannot_do_naming_the_tensor():
    w = np.ones((4, 64), np.float32)
    with pytest.raises(QuantizationError, match="'blocks.0.att.key.weight': GPTQ needs int8 or int4"):
        quantize_gptq(w, spec_for("fp8"), np.eye(64), "blocks.0.att.key.weight")
    with pytest.raises(QuantizationError, match=r"'head.weight': GPTQ needs a Gram matrix of shape \(64, 64\)"):
        quantize_gptq(w, spec_for("int4", 32), np.eye(32), "head.weight")
    with pytest.raises(QuantizationError, match="'head.weight': quantization group size 48 does not divide"):
        quantize_gptq(w, spec_for("int4", 48), np.eye(64), "head.weight")
