"""Section prefill: whole-model prefill rows (dense B x T and varlen packed prompts) with the
fraction of the roofline that binds."""
from __future__ import annotations

import functools
import time

import jax
import jax.numpy as jnp

from benchmarks.gpu_checks.common import attempt, block, kernel_names, model_for
from benchmarks.gpu_checks.decode import measure_model
from benchmarks.gpu_checks.schedule import (
    FIRST_COMPILE_GUESS_S,
    PREFILL_COMPILE_S,
    PREFILL_ITEMS,
    VARLEN_LENGTHS,
    Budget,
    CompileClock,
)
from rwkv7_core.config import ModelConfig, named_config
from rwkv7_core.cost import step_bytes_and_flops
from rwkv_jax.forward import varlen_forward_fn
from rwkv_jax.model import Model
from rwkv_jax.varlen import segments_from_lengths

BF16_SPEC_FLOPS = 989e12      # H200 dense bf16 tensor throughput (spec)


def prefill_roofline(config: ModelConfig, params_bytes: int, itemsize: int, B: int, T: int, step_s: float,
                     roofline: dict) -> dict:
    """Fractions of the roofline for a forward of B x T tokens taking step_s: FLOPs / measured
    bf16 matmul rate and bytes / measured copy bandwidth; the larger time binds."""
    nbytes, flops = step_bytes_and_flops(config, params_bytes, itemsize, B, T)
    bytes_s = nbytes / (roofline["copy_GBps"] * 1e9)
    flops_s = flops / (roofline["bf16_matmul_TFLOPs"] * 1e12)
    return {"binding": "compute" if flops_s >= bytes_s else "bandwidth",
            "roofline_fraction": max(bytes_s, flops_s) / step_s, "compute_roofline_fraction": flops_s / step_s,
            "hbm_roofline_fraction": bytes_s / step_s, "spec_compute_fraction": flops / BF16_SPEC_FLOPS / step_s}


def measure_varlen_prefill(model: Model, lengths: tuple, n_tokens: int, smoke: bool, roofline: dict) -> dict:
    """Compile and time the varlen prefill (rwkv_jax.forward.varlen_forward_fn) of prompts of
    `lengths` packed into n_tokens flat tokens, each from its own fresh state row (donated)."""
    P = len(lengths)
    segs = segments_from_lengths(lengths)
    tokens = jax.random.randint(jax.random.key(P), (n_tokens,), 0, model.config.vocab_size)
    fn = jax.jit(functools.partial(varlen_forward_fn, config=model.config, kernels=model.kernels),
                 donate_argnames="state")
    args = (model.params, tokens, model.init_state(P), jnp.asarray(segs.starts), jnp.asarray(segs.lengths))
    t0 = time.perf_counter()
    exe = fn.lower(*args).compile()
    compile_s = time.perf_counter() - t0
    _, state = block(exe(*args))
    n = 3 if smoke else 20
    start = time.perf_counter()
    for _ in range(n):
        _, state = exe(model.params, tokens, state, args[3], args[4])
    block(state)
    step_s = (time.perf_counter() - start) / n
    params_bytes = sum(x.nbytes for x in jax.tree.leaves(model.params))
    # bytes and FLOPs as P sequences of equal length (the same tokens, weights and state rows)
    cost = prefill_roofline(model.config, params_bytes, jnp.dtype(model.dtype).itemsize, P, n_tokens // P,
                            step_s, roofline)
    return {"compile_s": compile_s, "step_ms": step_s * 1e3, "tok_s": sum(lengths) / step_s, **cost}


def measure_dense_prefill(model: Model, B: int, T: int, smoke: bool, roofline: dict) -> dict:
    """measure_model's row of the B x T forward with prefill_roofline's fractions."""
    row = measure_model(model, B, T, smoke, roofline)
    params_bytes = sum(x.nbytes for x in jax.tree.leaves(model.params))
    return {**row, **prefill_roofline(model.config, params_bytes, jnp.dtype(model.dtype).itemsize, B, T,
                                      row["step_ms"] / 1e3, roofline)}


def prefill_items(smoke: bool) -> list:
    """(kind, B or prompts, T or flat tokens, lengths) of the prefill rows, in order."""
    if smoke:
        return [("dense", 1, 17, None), ("varlen", 3, 32, (1, 20, 7))]
    return [(kind, B, T, VARLEN_LENGTHS if kind == "varlen" else None) for kind, B, T in PREFILL_ITEMS]


def run_prefill(smoke: bool, interpret: bool, roofline: dict, budget: Budget, clock: CompileClock):
    """Whole-model prefill rows (PREFILL_ITEMS; tiny float32 in --smoke) while the budget
    lasts; yields after each item."""
    name = "tiny" if smoke else "1.5b"
    kernels = kernel_names(interpret)[1]  # what auto runs for prefill on a GPU (fused == pallas there)
    model = model_for(named_config(name), jnp.float32 if smoke else jnp.bfloat16, kernels)
    out = {"model": name, "kernels": kernels, "rows": []}
    for kind, B, T, lengths in prefill_items(smoke):
        row = {"model": name, "kernels": kernels, "kind": kind, "B": B, "T": T}
        need = PREFILL_COMPILE_S.get((kind, B, T), FIRST_COMPILE_GUESS_S) * max(clock.ratios, default=1.0)
        reason = None if smoke else budget.shortfall(need + 5)
        if reason:
            out["rows"].append({**row, "skipped": reason})
        elif kind == "varlen":
            out["rows"].append(attempt(row, measure_varlen_prefill, model, lengths, T, smoke, roofline))
        else:
            out["rows"].append(attempt(row, measure_dense_prefill, model, B, T, smoke, roofline))
        if "compile_s" in out["rows"][-1]:
            clock.measured(name, kernels, B, T, out["rows"][-1]["compile_s"])
        yield out
