"""Section parity: every Pallas kernel against its plain-jnp reference on random inputs,
sparse channel-mix exactness, the fused decode path's self-check as kernels="auto" runs it,
and whole random float32 models with each kernels option on the device against kernels="xla"
on the CPU."""
from __future__ import annotations

import functools
import math
import time

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.gpu_checks.common import (
    ODD,
    TOL,
    attempt,
    block,
    cpu_device,
    diff,
    kernel_names,
    model_for,
    params_for,
    within,
)
from benchmarks.gpu_checks.schedule import PARITY_BUDGET_S, Budget
from pallas_kernels import shift_mix, small_m_linear, sparse_channel_mix, wkv_chunk_varlen, wkv_seq, wkv_step
from pallas_kernels.fused_time_mix import fused_channel_mix
from rwkv7_core.config import named_config
from rwkv_jax.kernels import Kernels
from rwkv_jax.ops import XLA_OPS
from rwkv_jax.pallas_ops import channel_mix as pallas_channel_mix
from rwkv_jax.pallas_ops import wkv_seq as pallas_wkv_seq
from rwkv_jax.self_check import check_decode
from tests.support.pallas_inputs import ffn_inputs, linear_inputs, mix_inputs, varlen_wkv_inputs, wkv_inputs


def pallas_fns(interpret: bool) -> dict:
    """Kernel name -> the Pallas callable, with the Ops-contract argument layout."""
    p = functools.partial
    return {
        "wkv_step": p(wkv_step.wkv_step, interpret=interpret),
        "wkv_seq": p(wkv_seq.wkv_seq, interpret=interpret),
        "shift_mix": p(shift_mix.shift_mix, interpret=interpret),
        "linear": p(small_m_linear.small_m_linear, interpret=interpret),
        "channel_mix": p(pallas_channel_mix, max_rows=small_m_linear.MAX_M, interpret=interpret),
        "wkv_varlen": p(wkv_chunk_varlen.wkv_chunk_varlen, interpret=interpret),
        "wkv_seq_chunked": p(pallas_wkv_seq, interpret=interpret),
    }


REFERENCES = {"wkv_step": wkv_step.wkv_step_reference, "wkv_seq": wkv_seq.wkv_seq_reference,
              "shift_mix": shift_mix.shift_mix_reference, "linear": small_m_linear.linear_reference,
              "channel_mix": XLA_OPS.channel_mix, "wkv_varlen": wkv_chunk_varlen.wkv_varlen_reference,
              "wkv_seq_chunked": wkv_seq.wkv_seq_reference}


def parity_cases(smoke: bool) -> list:
    """(label, kernel name, args, tolerance) on small odd shapes (float32 unless stated)."""
    f32, bf16 = jnp.float32, jnp.bfloat16
    cases = [("wkv_step B=3 H=3", "wkv_step", wkv_inputs(1, (3,), 3), 1e-4),
             ("wkv_varlen lengths 0,1,17,40,3 H=3", "wkv_varlen", varlen_wkv_inputs(14, (0, 1, 17, 40, 3), 3, pad=2),
              1e-4)]
    if not smoke:  # (the CPU tests cover the rest in interpret mode)
        cases += [("shift_mix B=5 C=192 n=6", "shift_mix", mix_inputs(3, 5, 192, 6, f32), 1e-5),
                  ("channel_mix M=1 C=192", "channel_mix", ffn_inputs(6, 1, 192, 768, f32), 1e-5),
                  ("wkv_seq B=2 T=5 H=3", "wkv_seq", wkv_inputs(2, (2, 5), 3), 1e-4),
                  ("linear M=3 N=320 K=192", "linear", linear_inputs(5, 3, 320, 192, f32), 1e-5),
                  ("linear M=1 N=96 K=192", "linear", linear_inputs(4, 1, 96, 192, f32), 1e-5),
                  ("wkv_step B=5 H=40", "wkv_step", wkv_inputs(7, (5,), 40), 1e-4),
                  ("wkv_seq B=1 T=300 H=40", "wkv_seq", wkv_inputs(8, (1, 300), 40), 1e-3),
                  ("shift_mix B=7 C=2560 n=1 bf16", "shift_mix", mix_inputs(9, 7, 2560, 1, bf16), 1e-2),
                  ("linear M=1 N=2560 K=10240 bf16", "linear", linear_inputs(10, 1, 2560, 10240, bf16), 1e-2),
                  ("linear M=16 N=10240 K=2560 bf16", "linear", linear_inputs(11, 16, 10240, 2560, bf16), 1e-2),
                  ("linear M=5 N=96 K=96 f32", "linear", linear_inputs(12, 5, 96, 96, f32), 1e-5),
                  ("channel_mix M=3 C=2560 bf16", "channel_mix", ffn_inputs(13, 3, 2560, 10240, bf16), 1e-2),
                  ("wkv_varlen 8 prompts 1..300 H=40", "wkv_varlen",
                   varlen_wkv_inputs(15, (1, 300, 0, 17, 64, 2, 129, 33), 40), 1e-3)]
    return cases


def model_parity_cases(smoke: bool) -> list:
    """(config, B, T): decode (B1T1 and batched paths) and a short prefill (--smoke: one
    decode case; the CPU tests cover the rest in interpret mode)."""
    tiny = named_config("tiny")
    if smoke:
        return [(tiny, 1, 1)]
    return [(tiny, 1, 1), (tiny, 4, 1), (tiny, 1, 17), (ODD, 1, 1), (ODD, 5, 1), (ODD, 2, 9)]


def run_parity(smoke: bool, interpret: bool, budget: Budget):
    """Kernel vs reference errors, sparse exactness, and whole models with every kernels
    option on the device vs kernels="xla" on the CPU; yields after each item."""
    limit = budget.capped(PARITY_BUDGET_S)
    out = {"kernels": [], "sparse": [], "fused_sparse": [], "models": [], "self_check": []}
    fns = pallas_fns(interpret)

    def item(rows, row, fn, *args):
        spent = limit.left() <= 0
        rows.append({**row, "skipped": f"parity time budget ({PARITY_BUDGET_S} s) spent"} if spent
                    else attempt(row, fn, *args))
        return out

    with jax.default_matmul_precision("highest"):
        for label, name, args, tol in parity_cases(smoke):
            yield item(out["kernels"], {"case": label, "tol": tol}, kernel_parity, fns[name], REFERENCES[name],
                       args, tol)
        for z, M in ((0.5, 1),) if smoke else ((0.5, 1), (0.95, 3), (0.5, 4)):
            yield item(out["sparse"], {"zero_fraction": z, "rows": M}, sparse_exactness, z, M, interpret)
        for z, M in ((0.9, 1),) if smoke else ((0.9, 1), (0.9, 4)):
            yield item(out["fused_sparse"], {"zero_fraction": z, "rows": M}, fused_sparse_exactness, z, M, interpret)
        for config, B, T in model_parity_cases(smoke):
            for kernels in kernel_names(interpret):
                yield item(out["models"], {"config": f"C={config.n_embd} H={config.n_head} L={config.n_layer}",
                                           "B": B, "T": T, "kernels": kernels, "reference": "xla on the CPU"},
                           model_parity, config, B, T, kernels, 3)
        yield item(out["self_check"], {"kernels": kernel_names(interpret)[0]}, guard_self_check, interpret)
    out["ok"] = all(r.get("ok", False) for part in ("kernels", "sparse", "fused_sparse", "models", "self_check")
                    for r in out[part])
    yield out


def kernel_parity(fn, reference, args, tol) -> dict:
    """Kernel (compiled, or interpreted in --smoke) against its reference on all outputs."""
    got = block(jax.jit(fn)(*args))
    d = diff(jax.tree.leaves(got), jax.tree.leaves(reference(*args)))
    return {**d, "ok": within(d, tol)}


def _keys(seed, n):
    return jax.random.split(jax.random.key(seed), n)


def sparse_exactness(zero_fraction: float, M: int, interpret: bool) -> dict:
    """Sparse value product vs dense (<= 1e-6 relative) and bit-identical to skip=False."""
    F, C = 768, 192
    w_val_t = jax.random.normal(jax.random.key(70), (F, C))
    k1, k2 = _keys(int(100 * zero_fraction) + M, 2)
    keep = jax.random.uniform(k2, (F,)) >= zero_fraction
    hidden = jnp.where(keep, jnp.square(jax.random.normal(k1, (M, F))), 0.0)
    # skip is traced, so both runs use one compiled program (as on the GPU, where the
    # kernel binary never depends on it).
    fn = jax.jit(lambda h, w, skip: sparse_channel_mix.sparse_value_product(h, w, skip=skip, interpret=interpret))
    sparse, full = (np.asarray(fn(hidden, w_val_t, jnp.asarray(s))) for s in (True, False))
    dense = np.asarray(jnp.dot(hidden, w_val_t, precision=jax.lax.Precision.HIGHEST))
    rel = float(np.abs(sparse - dense).max() / np.abs(dense).max())
    bitwise = bool((sparse.view(np.uint32) == full.view(np.uint32)).all())
    return {"rel_err": rel, "bit_identical": bitwise, "ok": rel <= 1e-6 and bitwise}


def fused_sparse_exactness(zero_fraction: float, M: int, interpret: bool) -> dict:
    """The fused channel-mix skipping zero units' value rows vs the same without skipping
    (bit-identical expected), bf16, zero_fraction of the units off in every row."""
    F, C = 768, 192
    k1, k2, k3, k4 = _keys(int(100 * zero_fraction) + 10 * M, 4)
    xk = jnp.abs(jax.random.normal(k1, (M, C))).astype(jnp.bfloat16)
    w_key = jax.random.normal(k2, (F, C)) / math.sqrt(C)
    w_key = jnp.where(jax.random.uniform(k3, (F, 1)) < zero_fraction, -jnp.abs(w_key), w_key).astype(jnp.bfloat16)
    w_val_t = (jax.random.normal(k4, (F, C)) / math.sqrt(F)).astype(jnp.bfloat16)
    fn = jax.jit(lambda *a, skip: fused_channel_mix(*a, skip=skip, interpret=interpret).partials, static_argnames="skip")
    sparse, dense = (np.asarray(fn(xk, w_key, w_val_t, skip=s)) for s in (True, False))
    active = float(jnp.mean(jnp.any(XLA_OPS.linear(xk, w_key) > 0, axis=0)))
    bitwise = bool((sparse.view(np.uint32) == dense.view(np.uint32)).all())
    return {"active_fraction": active, "bit_identical": bitwise, "ok": bitwise}


def guard_self_check(interpret: bool) -> dict:
    """What kernels="auto" runs at load on a GPU (rwkv_jax.self_check), on the tiny model: the
    fused decode steps against XLA's, its verdict and seconds (two compiles included)."""
    config, fused = named_config("tiny"), Kernels(kernel_names(interpret)[0])
    start = time.perf_counter()
    reason = check_decode(params_for(config, jnp.float32), config, jnp.float32, fused)
    return {"verdict": reason or "passed", "seconds": time.perf_counter() - start, "ok": reason is None}


def model_parity(config, B, T, kernels, calls) -> dict:
    """A random float32 model with ``kernels`` on the default device against kernels="xla"
    on the CPU: ``calls`` forwards of B x T random tokens, logits of each and the last state."""
    models = [model_for(config, jnp.float32, kernels), model_for(config, jnp.float32, "xla", cpu_device())]
    states = [m.init_state(B) for m in models]
    logits = [[], []]
    rng = np.random.default_rng(B * 100 + T)
    for _ in range(calls):
        tokens = rng.integers(0, config.vocab_size, (B, T))
        for i, m in enumerate(models):
            with m.on_device():
                out, states[i] = m.forward(tokens, states[i])
            logits[i].append(out)
    d = {"logits": diff(*logits), "state": diff(*states)}
    return {"path": models[0].last_path.name, **d, "ok": all(within(x, TOL) for x in d.values())}
