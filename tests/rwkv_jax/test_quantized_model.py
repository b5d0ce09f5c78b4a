"""Quantized weights (int8, int4, fp8) in the JAX model: parity with the quantized torch reference,
save -> load of a quantized checkpoint, and the load-time errors."""
import jax
import numpy as np
import pytest

import rwkv_jax
import rwkv_torch_ref
from rwkv7_core.checkpoint import read_checkpoint, write_checkpoint
from rwkv7_core.quantization import QuantizationError, metadata, quantize_tensors, scale_key, spec_for

SCHEMES = {"int8": 64, "fp8": None, "int4": 64}


def _safetensors(ckpt):
    return ckpt.with_suffix(".safetensors")


@pytest.fixture(scope="module")
def quantized_files(tiny_ckpt, tmp_path_factory):
    """{scheme: a quantized .safetensors of the tiny checkpoint}."""
    tensors, _ = read_checkpoint(_safetensors(tiny_ckpt))
    d = tmp_path_factory.mktemp("quantized")
    out = {}
    for scheme, group in SCHEMES.items():
        spec = spec_for(scheme, group)
        out[scheme] = d / f"{scheme}.safetensors"
        write_checkpoint(out[scheme], quantize_tensors(tensors, spec), metadata(spec))
    return out


@pytest.mark.parametrize("scheme", SCHEMES)
def test_quantized_jax_matches_quantized_torch(tiny_ckpt, scheme):
    path, group = _safetensors(tiny_ckpt), SCHEMES[scheme]
    m = rwkv_jax.load(path, quantization=scheme, group_size=group)
    ref = rwkv_torch_ref.load(path, quantization=scheme, group_size=group)
    plain = rwkv_torch_ref.load(path)
    # int8: 36 rows, more than CPU_ROW_PRODUCTS (the dequantized scratch); fp8: 4 rows, the
    # per-row products a small decode batch runs (int8's: test_cli_quantization)
    B, T = (3, 12) if scheme != "fp8" else (2, 2)
    tokens = np.random.default_rng(len(scheme)).integers(0, m.config.vocab_size, (B, T))
    seq, _ = m.forward(tokens, m.init_state(B), full_output=True)
    want, _ = ref.forward(tokens, ref.init_state(B), full_output=True)
    np.testing.assert_allclose(np.asarray(seq), want.numpy(), atol=1e-4, rtol=0)
    float_logits, _ = plain.forward(tokens, plain.init_state(B), full_output=True)
    assert np.abs(np.asarray(seq) - float_logits.numpy()).max() > 1e-3  # the weights really are quantized


@pytest.mark.parametrize("scheme", SCHEMES)
def test_saved_quantized_checkpoint_loads_bit_identical(tiny_ckpt, quantized_files, scheme):
    at_load = rwkv_jax.load(_safetensors(tiny_ckpt), quantization=scheme, group_size=SCHEMES[scheme])
    saved = rwkv_jax.load(quantized_files[scheme], quantization=scheme)
    a, b = jax.tree.leaves_with_path(at_load.params), jax.tree.leaves_with_path(saved.params)
    assert [k for k, _ in a] == [k for k, _ in b]
    for (key, x), (_, y) in zip(a, b):
        assert x.dtype == y.dtype and x.shape == y.shape, key
        assert np.asarray(x).tobytes() == np.asarray(y).tobytes(), key
    from_file = rwkv_torch_ref.load(quantized_files[scheme], quantization=scheme)
    quantized_here = rwkv_torch_ref.load(_safetensors(tiny_ckpt), quantization=scheme, group_size=SCHEMES[scheme])
    assert all(a.equal(b) for a, b in zip(from_file.layers[1], quantized_here.layers[1]) if hasattr(a, "equal"))
    assert from_file.head.equal(quantized_here.head)


def test_quantized_checkpoint_errors_name_the_tensor(tiny_ckpt, quantized_files, tmp_path):
    path = quantized_files["int8"]
    with pytest.raises(QuantizationError, match="holds int8 \\(groups of 64\\) weights but quantization fp8"):
        rwkv_jax.load(path, quantization="fp8")
    with pytest.raises(QuantizationError, match="quantization none was requested"):
        rwkv_torch_ref.load(path)
    with pytest.raises(QuantizationError, match="unknown quantization 'int3'"):
        rwkv_jax.load(_safetensors(tiny_ckpt), quantization="int3")
    with pytest.raises(QuantizationError, match="group size 96 does not divide its width 128"):
        rwkv_jax.load(_safetensors(tiny_ckpt), quantization="int8", group_size=96)
    tensors, _ = read_checkpoint(path)
    missing = {k: tensors[k] for k in tensors if k != scale_key("blocks.1.ffn.key.weight")}
    write_checkpoint(tmp_path / "m.safetensors", missing, metadata(spec_for("int8", 64)))
    with pytest.raises(QuantizationError, match="key 'blocks.1.ffn.key.weight': its scales 'blocks.1.ffn.key.weight_scale' are missing"):
        rwkv_jax.load(tmp_path / "m.safetensors", quantization="int8")
    with pytest.raises(QuantizationError, match="key 'head.weight': quantization group size 48 "
                                                "does not divide its width 128"):
        rwkv_jax.load(_safetensors(tiny_ckpt), quantization="int4", group_size=48)
    int4 = dict(read_checkpoint(quantized_files["int4"])[0])
    write_checkpoint(tmp_path / "g.safetensors", int4, metadata(spec_for("int4", 256)))
    with pytest.raises(QuantizationError, match="key 'blocks.0.att.receptance.weight': quantization group size 256 "
                                                "does not divide its width 128"):
        rwkv_jax.load(tmp_path / "g.safetensors", quantization="int4")
    write_checkpoint(tmp_path / "f.safetensors", dict(tensors), metadata(spec_for("fp8")))
    with pytest.raises(QuantizationError, match="key 'blocks.0.att.receptance.weight': dtype int8 in a fp8 checkpoint"):
        rwkv_jax.load(tmp_path / "f.safetensors", quantization="fp8")


@pytest.mark.parametrize("kernels,scheme,B", [("pallas-interpret", "int8", 1), ("pallas-fused-interpret", "fp8", 3),
                                               ("pallas-fused-interpret", "int4", 1), ("pallas-interpret", "int4", 3)])
def test_pallas_kernels_on_quantized_weights_match_xla(tiny_ckpt, kernels, scheme, B):
    """The quantized decode kernels (dequantized in registers) give the XLA path's logits and state."""
    path, group = _safetensors(tiny_ckpt), SCHEMES[scheme]
    xla = rwkv_jax.load(path, quantization=scheme, group_size=group)
    pallas = rwkv_jax.load(path, quantization=scheme, group_size=group, kernels=kernels)
    tokens = np.random.default_rng(B).integers(0, xla.config.vocab_size, (B, 1))
    (lx, sx), (lp, sp) = xla.forward(tokens, xla.init_state(B)), pallas.forward(tokens, pallas.init_state(B))
    np.testing.assert_allclose(np.asarray(lp), np.asarray(lx), atol=1e-4, rtol=0)
    for name, leaf_p, leaf_x in zip(sx._fields, sp, sx):
        np.testing.assert_allclose(np.asarray(leaf_p), np.asarray(leaf_x), atol=1e-4, rtol=0, err_msg=name)


def test_many_row_cpu_product_dequantizes_one_slice_at_a_time():
    """More rows than CPU_ROW_PRODUCTS: the product equals x @ dequantized.T, and a weight of
    more than CPU_SCRATCH_ELEMENTS is dequantized in slices whose float32 copies are not all
    live at once (the compiled temporaries stay below one whole float32 copy)."""
    import jax.numpy as jnp

    from pallas_kernels import quantized
    from rwkv7_core.quantization import quantize

    rng = np.random.default_rng(5)
    n, k = quantized.CPU_SCRATCH_ELEMENTS // 768 * 3 // 2, 768  # two slices
    q, scale = quantize(rng.standard_normal((n, k)).astype(np.float32), spec_for("int8"))
    w = quantized.QuantizedWeight(jnp.asarray(q), jnp.asarray(scale))
    x = jnp.asarray(rng.standard_normal((quantized.CPU_ROW_PRODUCTS + 3, k)), jnp.float32)
    fn = jax.jit(quantized.quantized_matmul_f32)
    want = np.asarray(x) @ np.asarray(w.dequantize(jnp.float32)).T
    np.testing.assert_allclose(np.asarray(fn(x, w)), want, atol=2e-3 * np.abs(want).max(), rtol=0)
    assert fn.lower(x, w).compile().memory_analysis().temp_size_in_bytes < n * k * 4


def _kl_mean(p_logits, q_logits) -> float:
    """Mean over positions of KL(softmax p || softmax q)."""
    lp = jax.nn.log_softmax(np.asarray(p_logits, np.float64), -1)
    lq = jax.nn.log_softmax(np.asarray(q_logits, np.float64), -1)
    return float((np.exp(lp) * (lp - lq)).sum(-1).mean())


def test_int4_logits_stay_close_to_float(tiny_ckpt):
    """int4 (groups of 64) next-token distributions against the float model's on the tiny
    random checkpoint: mean KL below 0.2 (measured 0.05-0.07 over three seeds of this shape;
    int8 1.7e-4), and clearly coarser than int8's."""
    path = _safetensors(tiny_ckpt)
    tokens = np.random.default_rng(3).integers(0, 512, (3, 12))
    logits = {}
    for scheme in ("none", "int8", "int4"):
        m = rwkv_jax.load(path, quantization=scheme, group_size=None if scheme == "none" else 64)
        logits[scheme], _ = m.forward(tokens, m.init_state(3), full_output=True)
    int4, int8 = _kl_mean(logits["none"], logits["int4"]), _kl_mean(logits["none"], logits["int8"])
    assert int4 < 0.2 and int8 < int4 / 10, (int4, int8)
