"""Sections decode and state_dtype: forward rows of the decode shapes for each kernels option
(tok/s, step ms, roofline fractions, launches per step), the engine's whole decode step, and
the bfloat16-state row; ``model_row`` is the one measured (or skipped) forward row the models
and mosaic sections use too."""
from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np

import rwkv_jax
from benchmarks.gpu_checks.common import attempt, block, executables_for, kernel_names, model_for
from benchmarks.gpu_checks.schedule import DECODE_BATCHES, Budget, CompileClock
from rwkv7_core.config import named_config
from rwkv7_core.cost import step_bytes_and_flops
from rwkv7_core.sampling import SamplingParams
from rwkv_jax.engine import JaxEngine
from rwkv_jax.model import Model


def measure_model(model: Model, B, T, smoke, roofline) -> dict:
    """Compile (once a run) one (B, T) forward and time it with the state carried (donated)."""
    key = ("forward", (B, T, False))
    exe = executables_for(model).get(key)
    tokens = jax.random.randint(jax.random.key(B * T), (B, T), 0, model.config.vocab_size)
    state = model.init_state(B)
    _, state = block(exe(model.params, tokens, state))
    one = time.perf_counter()
    _, state = block(exe(model.params, tokens, state))
    one = time.perf_counter() - one
    n = int(min(200, max(3, (0.1 if smoke else 1.0) / max(one, 1e-6))))
    start = time.perf_counter()
    for _ in range(n):
        logits, state = exe(model.params, tokens, state)
    block((logits, state))
    step_s = (time.perf_counter() - start) / n
    params_bytes = sum(x.nbytes for x in jax.tree.leaves(model.params))
    nbytes, flops = step_bytes_and_flops(model.config, params_bytes, jnp.dtype(model.dtype).itemsize, B, T,
                                         jnp.dtype(model.state_dtype).itemsize)
    bytes_s = nbytes / (roofline["copy_GBps"] * 1e9)
    flops_s = flops / (roofline["bf16_matmul_TFLOPs"] * 1e12)
    return {"path": rwkv_jax.select_path(B, T).name, "compile_s": executables_for(model).compile_seconds[key],
            "step_ms": step_s * 1e3, "tok_s": B * T / step_s, "launches": launches(exe.as_text()),
            "hbm_roofline_fraction": bytes_s / step_s, "compute_roofline_fraction": flops_s / step_s,
            "roofline_fraction": max(bytes_s, flops_s) / step_s}


def launches(hlo_text: str) -> int:
    """Fusions + custom calls + copies in the compiled ENTRY computation."""
    entry = hlo_text[hlo_text.index("\nENTRY "):]
    return sum(entry.count(op) for op in (" fusion(", " custom-call(", " copy("))


def measure_engine_step(model: Model, B, smoke) -> dict:
    """The engine's whole decode step (forward + on-device sampling + the host reading the
    drawn tokens, as rwkv7-generate runs it) at bucket B: ms per step with every row greedy,
    and with one row sampling (temperature 1, top-k 50, top-p 0.9). With the GPU kernels the
    step samples in straight-line code (rwkv_jax.kernels.sampler_form) in both."""

    engine = JaxEngine(model, prefill_pieces=(1,))
    t0 = time.perf_counter()
    engine.compile([B])
    out = {"engine_compile_s": time.perf_counter() - t0}
    engine.resize([], B)
    tokens, positions = np.zeros(B, np.int32), np.zeros(B, np.int32)
    for label in ("greedy", "sampled"):
        if label == "sampled":  # slot 0's own state back in, sampling (no prefill to compile)
            engine.insert(0, engine.extract(0), SamplingParams(temperature=1.0, top_k=50, top_p=0.9, seed=0))
        engine.step(tokens, positions)
        n, start = (3 if smoke else 50), time.perf_counter()
        for _ in range(n):
            engine.step(tokens, positions)
        out[f"engine_step_{label}_ms"] = (time.perf_counter() - start) / n * 1e3
    return out


def model_row(name, kernels, B, T, smoke, roofline, budget, clock) -> dict:
    """One measured (or skipped) forward row; its compile time calibrates the clock."""
    row = {"model": name, "kernels": kernels, "B": B, "T": T}
    reason = budget.shortfall(clock.estimate(name, kernels, B, T) + 5)
    if reason:
        return {**row, "skipped": reason}
    dtype = jnp.float32 if smoke else jnp.bfloat16
    attempt(row, measure_model, model_for(named_config(name), dtype, kernels), B, T, smoke, roofline)
    if "compile_s" in row:
        clock.measured(name, kernels, B, T, row["compile_s"])
    return row


def mosaic_decode_row(name, kernels, B, *, smoke, roofline, budget, clock) -> dict:
    """One decode forward row for the Mosaic section (benchmarks/gpu_check_mosaic.py)."""
    return model_row(name, kernels, B, 1, smoke, roofline, budget, clock)


def decode_items(smoke: bool, fused: str, pallas: str, xla: str) -> list:
    """("forward" | "engine", kernels, B) in priority order: the expensive XLA compiles last.
    The engine step runs the fused kernels (--smoke: xla; an interpreted fused step's
    time means nothing)."""
    batches = (1,) if smoke else DECODE_BATCHES
    items = [("forward", k, B) for B in batches for k in ((fused, pallas, xla) if B == 1 else (fused, pallas))]
    items += [("engine", xla if smoke else fused, B) for B in batches]
    return items + [("forward", xla, B) for B in batches[1:]]


def run_decode(smoke: bool, interpret: bool, roofline: dict, budget: Budget, clock: CompileClock):
    """Decode rows for the three kernels options at DECODE_BATCHES (1.5b, bf16; tiny, float32
    in --smoke), and the engine's whole step for the fused kernels; yields after each item."""
    name = "tiny" if smoke else "1.5b"
    fused, pallas, xla = kernel_names(interpret)
    out = {"model": name, "rows": [], "engine": []}
    measured = set()
    for what, kernels, B in decode_items(smoke, fused, pallas, xla):
        if what == "forward":
            out["rows"].append(model_row(name, kernels, B, 1, smoke, roofline, budget, clock))
            if "step_ms" in out["rows"][-1]:
                measured.add((kernels, B))
        else:
            row = {"kernels": kernels, "B": B}
            reason = (budget.shortfall(clock.estimate(name, kernels, B, 1) + 10) if (kernels, B) in measured
                      else "its forward was not measured")
            model = model_for(named_config(name), jnp.float32 if smoke else jnp.bfloat16, kernels)
            out["engine"].append({**row, "skipped": reason} if reason else
                                 attempt(row, measure_engine_step, model, B, smoke))
        yield out


def run_state_dtype(smoke: bool, interpret: bool, roofline: dict, budget: Budget, clock: CompileClock) -> dict:
    """Decode with a bfloat16 wkv state (issue 39) beside the decode section's float32-state
    row: 1.5b bf16 pallas-fused at B = 256 (tiny float32 at B = 4 in --smoke); tok/s, step ms,
    launches and the HBM roofline fraction of the step's bytes (the state at 2 bytes)."""
    name, B = ("tiny", 4) if smoke else ("1.5b", 256)
    kernels = kernel_names(interpret)[0]
    row = {"model": name, "kernels": kernels, "B": B, "T": 1, "state_dtype": "bfloat16"}
    reason = budget.shortfall(clock.estimate(name, kernels, B, 1) + 5)
    if reason:
        return {**row, "skipped": reason}
    model = model_for(named_config(name), jnp.float32 if smoke else jnp.bfloat16, kernels, state_dtype=jnp.bfloat16)
    return attempt(row, measure_model, model, B, 1, smoke, roofline)
