"""The whole model with kernels="native" against kernels="xla" on fresh random tokens and
states: float32 (greedy tokens equal over many steps), int8 / int4 / float8 and bfloat16 weights, single and
batched decode and a short prefill, and ``auto`` on a host that cannot build the kernels."""
from __future__ import annotations

import os
import subprocess
import sys

import jax
import numpy as np
import pytest

import rwkv_jax
from cpu_kernels import library
from cpu_kernels import wkv_step as wkv_kernel
from cpu_kernels.linear import QUANTIZED_DOT_MIN_ROWS
from rwkv_jax.kernels import Kernels, KernelsUnavailable, require_platform
from rwkv_jax.self_check import TOLERANCE


def pair(ckpt, **kw):
    return rwkv_jax.load(ckpt, kernels="xla", **kw), rwkv_jax.load(ckpt, kernels="native", **kw)


def random_state(model, B, rng):
    state = model.init_state(B)
    return type(state)(*(jax.numpy.asarray(0.5 * rng.standard_normal(leaf.shape), leaf.dtype) for leaf in state))


def relative(got, want) -> float:
    got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)
    return float(np.abs(got - want).max() / max(np.abs(want).max(), 1e-30))


def test_float32_greedy_tokens_equal_xla_over_64_steps(tiny_ckpt):
    xla, native = pair(tiny_ckpt)
    rng = np.random.default_rng()
    start = random_state(xla, 1, rng)
    token = rng.integers(0, xla.config.vocab_size, (1, 1)).astype(np.int32)
    runs = []
    for model in (xla, native):
        state, tok, chosen = jax.tree.map(jax.numpy.copy, start), token, []
        for _ in range(64):
            logits, state = model.forward(tok, state)
            tok = np.asarray(logits).argmax(-1).reshape(1, 1).astype(np.int32)
            chosen.append(int(tok[0, 0]))
        runs.append((chosen, state))
    assert runs[0][0] == runs[1][0]
    for got, want in zip(runs[1][1], runs[0][1]):
        assert relative(got, want) < 1e-4


@pytest.mark.parametrize("dtype,quantization,B", [("float32", "none", 3), ("float32", "int8", 1),
                                                  ("float32", "int8", 6), ("float32", "int4", 1),
                                                  ("float32", "int4", 5), ("float32", "fp8", 2),
                                                  ("bfloat16", "none", 2), ("float32", "none", 12)])
def test_decode_steps_equal_xla(tiny_ckpt, dtype, quantization, B):
    hlo = decode_steps_equal_xla(tiny_ckpt, dtype, quantization, B)
    assert hlo.count("@rwkv7_time_mix_step(") == 2  # one a layer of the tiny model


@pytest.mark.parametrize("quantization", ["int8", "int4", "fp8"])
def test_bfloat16_rows_with_quantized_weights_take_the_dot_product(tiny_ckpt, quantization):
    """A bfloat16 model with quantized weights decoding QUANTIZED_DOT_MIN_ROWS or more sequences
    multiplies by the quantized dot-product kernel where the build has the bfloat16 dot product."""
    hlo = decode_steps_equal_xla(tiny_ckpt, "bfloat16", quantization, QUANTIZED_DOT_MIN_ROWS[quantization] + 1)
    dot = library.BF16_DOT in library.load().capabilities
    assert ("@rwkv7_linear_quantized_dot(" in hlo) == dot


def test_decode_steps_without_the_native_time_mix_body_equal_xla(tiny_ckpt, monkeypatch):
    """A state or dtype the fused body does not take runs the reference body around the native
    recurrence step (the fallback of ``rwkv_jax.native_ops.time_mix``)."""
    monkeypatch.setattr(wkv_kernel, "time_mix_supports", lambda S, dtype: False)
    hlo = decode_steps_equal_xla(tiny_ckpt, "bfloat16", "none", 3)
    assert "@rwkv7_time_mix_step(" not in hlo and hlo.count("@rwkv7_wkv_step(") == 2


def decode_steps_equal_xla(tiny_ckpt, dtype, quantization, B) -> str:
    """Three decode steps of native against xla from one random state; the native step's HLO."""
    xla, native = pair(tiny_ckpt, dtype=dtype, quantization=quantization)
    rng = np.random.default_rng()
    start = random_state(xla, B, rng)
    tokens = rng.integers(0, xla.config.vocab_size, (3, B, 1)).astype(np.int32)
    results = []
    for model in (xla, native):
        state, logits = jax.tree.map(jax.numpy.copy, start), []
        for t in tokens:
            out, state = model.forward(t, state)
            logits.append(np.asarray(out))
        results.append((np.stack(logits), state))
    tolerance = TOLERANCE[dtype]
    assert relative(results[1][0], results[0][0]) < tolerance
    for got, want in zip(results[1][1], results[0][1]):
        assert relative(got, want) < tolerance
    assert native.last_path is rwkv_jax.select_path(B, 1)
    step = jax.jit(rwkv_jax.forward_fn, static_argnames=("config", "path", "kernels"))
    return step.lower(native.params, tokens[0], start, config=native.config, path=native.last_path,
                      kernels=native.kernels).as_text()


def test_a_short_prefill_equals_xla(tiny_ckpt):
    xla, native = pair(tiny_ckpt)
    rng = np.random.default_rng()
    tokens = rng.integers(0, xla.config.vocab_size, (2, 4)).astype(np.int32)  # 8 rows: the native products
    (lx, sx), (ln, sn) = (m.forward(tokens, m.init_state(2), full_output=True) for m in (xla, native))
    assert relative(ln, lx) < 1e-4
    for got, want in zip(sn, sx):
        assert relative(got, want) < 1e-4


def test_a_bfloat16_int4_prefill_equals_xla_by_the_dot_product(tiny_ckpt):
    """A prefill's many rows (no upper bound) of a bfloat16 model with quantized weights go to the
    quantized dot product where the build has it."""
    xla, native = pair(tiny_ckpt, dtype="bfloat16", quantization="int4")
    rng = np.random.default_rng()
    tokens = rng.integers(0, xla.config.vocab_size, (3, 24)).astype(np.int32)  # 72 rows
    (lx, sx), (ln, sn) = (m.forward(tokens, m.init_state(3), full_output=True) for m in (xla, native))
    assert relative(ln, lx) < TOLERANCE["bfloat16"]
    for got, want in zip(sn, sx):
        assert relative(got, want) < TOLERANCE["bfloat16"]
    step = jax.jit(rwkv_jax.forward_fn, static_argnames=("config", "path", "kernels"))
    hlo = step.lower(native.params, tokens, native.init_state(3), config=native.config, path=native.last_path,
                     kernels=native.kernels).as_text()
    assert ("@rwkv7_linear_quantized_dot(" in hlo) == (library.BF16_DOT in library.load().capabilities)


def test_native_runs_only_on_the_cpu():
    require_platform(Kernels.NATIVE, "cpu")
    with pytest.raises(KernelsUnavailable, match="kernels=native runs only on cpu; this model is on gpu"):
        require_platform(Kernels.NATIVE, "gpu")


def load_auto(ckpt, **env_changes) -> subprocess.CompletedProcess:
    """rwkv_jax.load(ckpt, kernels="auto") in a fresh process; prints the kernels it chose."""
    code = ("import rwkv_jax, sys; m = rwkv_jax.load(sys.argv[1], kernels='auto'); "
            "print('kernels', m.kernels.value)")
    done = subprocess.run([sys.executable, "-c", code, str(ckpt)], env={**os.environ, "JAX_PLATFORMS": "cpu", **env_changes},
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    return done


def test_auto_without_a_compiler_runs_xla_and_says_why(tiny_ckpt, tmp_path):
    done = load_auto(tiny_ckpt, CXX=str(tmp_path / "missing-c++"), RWKV7_CPU_KERNELS_DIR=str(tmp_path / "cache"),
                     JAX_COMPILATION_CACHE_DIR=str(tmp_path / "jax-cache"))
    assert "kernels xla" in done.stdout
    assert "native failed its self-check" in done.stderr and "missing-c++" in done.stderr


def test_a_kept_pass_without_a_compiler_now_runs_xla(tiny_ckpt, tmp_path):
    """The verdict file says native passed (an earlier run), but this process cannot build the
    kernels any more: auto falls back to xla with the reason instead of failing at trace."""
    jax_cache = str(tmp_path / "jax-cache")
    assert "kernels native" in load_auto(tiny_ckpt, JAX_COMPILATION_CACHE_DIR=jax_cache).stdout
    done = load_auto(tiny_ckpt, CXX=str(tmp_path / "missing-c++"), RWKV7_CPU_KERNELS_DIR=str(tmp_path / "cache"),
                     JAX_COMPILATION_CACHE_DIR=jax_cache)
    assert "kernels xla" in done.stdout and "missing-c++" in done.stderr
