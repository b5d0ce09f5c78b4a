"""kernels="auto"'s guard: the on-device self-check adopts a kernel choice that equals XLA and
falls back (logging why) from a wrong one; verdicts are kept beside the compilation cache.
Run on the CPU with the interpreted kernels (the GPU guard is the same code)."""
from __future__ import annotations

import functools
import json
import logging

import jax
import pytest

import rwkv_jax
from pallas_kernels import radix_search
from rwkv_jax.forward import forward_fn
from rwkv_jax.kernels import Guard, Kernels, guarded, resolve, sampler_form
from rwkv_jax.sampling import SearchForm
from rwkv_jax.self_check import cached_check, check_decode, verdict_key, verdicts_path

GUARD = Guard(Kernels.PALLAS_FUSED_INTERPRET, Kernels.PALLAS_INTERPRET)


def _off_by_one_percent(params, tokens, state, *, kernels, **kw):
    """forward_fn whose candidate kernel is wrong: its logits come out 1 % too large."""
    logits, state = forward_fn(params, tokens, state, kernels=kernels, **kw)
    return (logits * 1.01 if kernels is GUARD.preferred else logits), state


@pytest.fixture(scope="module")
def model(tiny_ckpt):
    return rwkv_jax.load(tiny_ckpt, dtype="float32", kernels="xla")


def test_auto_on_the_cpu_is_the_native_kernels_once_checked(model, caplog):
    def never(candidate):
        raise AssertionError("a named choice is not checked")
    check = functools.partial(cached_check, model.params, model.config, model.dtype)
    assert jax.default_backend() == "cpu" and resolve("auto", check) is Kernels.NATIVE
    with caplog.at_level(logging.WARNING, logger="rwkv_jax.kernels"):
        assert resolve("auto", lambda candidate: "no compiler here") is Kernels.XLA
    assert "native failed its self-check on this device (no compiler here); using xla" in caplog.records[0].message
    assert resolve("pallas-fused", never) is Kernels.PALLAS_FUSED  # a named choice is forced


def test_guard_adopts_the_fused_kernels_and_falls_back_from_a_wrong_one(model, caplog):
    check = functools.partial(check_decode, model.params, model.config, model.dtype)
    assert guarded(GUARD, check) is GUARD.preferred
    with caplog.at_level(logging.WARNING, logger="rwkv_jax.kernels"):
        assert guarded(GUARD, functools.partial(check, forward=_off_by_one_percent)) is GUARD.fallback
    [record] = caplog.records
    assert "pallas-fused-interpret failed its self-check" in record.message
    assert "logits differ from XLA's by 0.01" in record.message and "using pallas-interpret" in record.message
    assert guarded(GUARD, None) is GUARD.fallback  # nothing to check: the safe choice


def _one_key_too_high(keys, weights, limit, mass, interpret):
    """radix_search.smallest_key off by one key: the kept set loses the threshold's ties."""
    return radix_search.smallest_key(keys, weights, limit, mass, interpret=interpret) + 1


def test_guard_falls_back_from_a_wrong_sampler_search(model, caplog):
    check = functools.partial(check_decode, model.params, model.config, model.dtype, search=_one_key_too_high)
    with caplog.at_level(logging.WARNING, logger="rwkv_jax.kernels"):
        assert guarded(GUARD, check) is GUARD.fallback
    assert "top-k threshold search differs from XLA's" in caplog.records[0].message
    assert sampler_form(GUARD.fallback) is SearchForm.LOOP and sampler_form("pallas") is SearchForm.UNROLLED
    assert sampler_form("pallas-fused") is SearchForm.PALLAS  # the form only the guarded choice uses


def test_verdicts_are_kept_beside_the_compilation_cache(model, tmp_path):
    before = jax.config.jax_compilation_cache_dir
    jax.config.update("jax_compilation_cache_dir", str(tmp_path))
    try:
        reason = cached_check(model.params, model.config, model.dtype, GUARD.preferred, forward=_off_by_one_percent)
        assert reason.startswith("logits differ")
        stored = json.loads(verdicts_path().read_text())
        assert stored[verdict_key(model.config, model.dtype, GUARD.preferred)] == reason
        # the verdict is reused, not recomputed (the correct kernels would pass)
        assert cached_check(model.params, model.config, model.dtype, GUARD.preferred) == reason
    finally:
        jax.config.update("jax_compilation_cache_dir", before)


def test_quantized_weights_are_checked_and_kept_under_their_own_verdict(tiny_ckpt, model, tmp_path):
    """The guard runs the fused kernels on the quantized weights (against XLA on the same
    weights) and keeps that verdict apart from the plain model's."""
    quantized = rwkv_jax.load(tiny_ckpt.with_suffix(".safetensors"), dtype="float32", kernels="xla",
                              quantization="int8", group_size=64)
    before = jax.config.jax_compilation_cache_dir
    jax.config.update("jax_compilation_cache_dir", str(tmp_path))
    try:
        assert cached_check(quantized.params, quantized.config, quantized.dtype, GUARD.preferred) is None
        stored = json.loads(verdicts_path().read_text())
        [key] = [k for k in stored if "|int8 (groups of 64)|" in k]
        assert stored[key] is None and key != verdict_key(model.config, model.dtype, GUARD.preferred)
    finally:
        jax.config.update("jax_compilation_cache_dir", before)
