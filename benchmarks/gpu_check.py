"""One-command GPU check of the Pallas kernels (issue 4); about 8 minutes on one H200.

    python benchmarks/gpu_check.py [--out benchmarks/results/] [--smoke] [--cache-dir DIR]

Needs only jax (+ its CUDA plugin), flax and numpy from a source checkout. Sections, in
order; the JSON is rewritten after each one, so a run cut short still leaves its results:

1. parity   — every Pallas kernel, compiled, against its plain-jnp reference on random
              inputs (incl. C=192, H=3, odd B), sparse channel-mix exactness, and whole
              random models with kernels="pallas" vs kernels="xla" (float32, several steps).
2. roofline — measured copy bandwidth and bf16 matmul rate.
3. kernels  — each kernel's time against the XLA op it replaces, at 2.9b shapes (bf16).
4. models   — decode tok/s at B = 1, 2, 4, ..., 256 and prefill tok/s at T = 1024 for
              random 1.5b- and 2.9b-shape models in bf16, kernels=pallas and kernels=xla,
              each as a fraction of its roofline; items run in priority order and the rest
              are marked skipped once the time budget is spent.
5. deviceless — a tiny-model forward compiled for the H200 *description* (no device:
              rwkv_jax.deviceless), serialized, loaded on this GPU and run: its logits and
              state must equal those of the same forward compiled here the normal way (the
              proof that a CPU-side deviceless compile is the real thing); then whether the
              paper estimates of benchmarks/results/gpu_compile_h200.json held for the
              decode rows measured in section 4.
6. serving  — hook for the serving benchmark: if `rwkv7_apps.serving_bench` defines
              `gpu_check_section(out_dir: str, budget_s: float) -> dict`, it runs last with
              SERVING_BUDGET_S seconds reserved; otherwise the section says it is absent.

--smoke runs every section on the CPU with tiny shapes and interpret-mode kernels (a CI
test does this; the deviceless section then compiles and serializes but cannot load). Output: <out>/gpu_check.json and <out>/gpu_check.md.
"""
from __future__ import annotations

import argparse
import datetime
import functools
import importlib
import json
import math
import platform
import sys
import time
from pathlib import Path as FsPath

if __package__ in (None, ""):  # run as a script from the source tree
    sys.path.insert(0, str(FsPath(__file__).resolve().parents[1]))

import jax
import jax.numpy as jnp
import numpy as np

import rwkv_jax
from pallas_kernels import shift_mix, small_m_linear, sparse_channel_mix, wkv_seq, wkv_step
from pallas_kernels.random_inputs import ffn_inputs, linear_inputs, mix_inputs, wkv_inputs
from rwkv7_core.config import ModelConfig, named_config
from rwkv_jax.model import Model
from rwkv_jax.ops import XLA_OPS
from rwkv7_core.cost import step_bytes_and_flops
from rwkv_jax.pallas_ops import channel_mix as pallas_channel_mix, sparse_rows_threshold
from rwkv_jax.random_params import random_params

TOTAL_BUDGET_S = 465          # whole run, leaving margin under 8 minutes
SERVING_BUDGET_S = 180        # reserved for rwkv7_apps.serving_bench when it provides the hook
KERNEL_BUDGET_S = 90          # per-kernel timings stop starting new cases after this long
MODEL_MIN_S = 150             # ... or when fewer seconds than this are left for the models
FIRST_COMPILE_GUESS_S = 60    # model compile estimate before one has been measured
DECODE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
PREFILL_T = 1024
GOALS = {"pallas_over_xla_b1": 1.5, "b1_hbm_roofline_fraction": 0.7, "2.9b_b256_tok_s": 30000}
ODD = ModelConfig(n_layer=3, n_embd=192, n_head=3, head_size=64, vocab_size=300, dim_ffn=768,
                  d_decay=24, d_aaa=40, d_mv=20, d_gate=56)


class Budget:
    """Wall-clock budget of the run."""

    def __init__(self, total_s: float):
        self.start, self.total_s = time.perf_counter(), total_s

    def left(self) -> float:
        return self.total_s - (time.perf_counter() - self.start)


def block(tree):
    return jax.block_until_ready(tree)


def attempt(row: dict, fn, *args, **kwargs) -> dict:
    """row updated with fn(...)'s dict, or with the error: one failing kernel or model must
    not cost the rest of a one-shot GPU run."""
    try:
        row.update(fn(*args, **kwargs))
    except Exception as e:  # recorded in the report, never hidden
        row.update({"error": f"{type(e).__name__}: {str(e)[:600]}", "ok": False})
    return row


def _keys(seed, n):
    return jax.random.split(jax.random.key(seed), n)


# ----------------------------------------------------------------------------- kernels
def pallas_fns(interpret: bool) -> dict:
    """Kernel name -> the Pallas callable, with the Ops-contract argument layout."""
    p = functools.partial
    return {
        "wkv_step": p(wkv_step.wkv_step, interpret=interpret),
        "wkv_seq": p(wkv_seq.wkv_seq, interpret=interpret),
        "shift_mix": p(shift_mix.shift_mix, interpret=interpret),
        "linear": p(small_m_linear.small_m_linear, interpret=interpret),
        "channel_mix": p(pallas_channel_mix, max_rows=small_m_linear.MAX_M, interpret=interpret),
    }


REFERENCES = {"wkv_step": wkv_step.wkv_step_reference, "wkv_seq": wkv_seq.wkv_seq_reference,
              "shift_mix": shift_mix.shift_mix_reference, "linear": small_m_linear.linear_reference,
              "channel_mix": XLA_OPS.channel_mix}
XLA_EQUIVALENT = {"wkv_step": XLA_OPS.wkv_step, "wkv_seq": XLA_OPS.wkv_seq,
                  "shift_mix": XLA_OPS.shift_mix, "linear": XLA_OPS.linear,
                  "channel_mix": XLA_OPS.channel_mix}


def parity_cases(smoke: bool) -> list:
    """(label, kernel name, args, tolerance) on small odd shapes (float32 unless stated)."""
    f32, bf16 = jnp.float32, jnp.bfloat16
    cases = [("wkv_step B=3 H=3", "wkv_step", wkv_inputs(1, (3,), 3), 1e-4),
             ("shift_mix B=5 C=192 n=6", "shift_mix", mix_inputs(3, 5, 192, 6, f32), 1e-5),
             ("channel_mix M=1 C=192", "channel_mix", ffn_inputs(6, 1, 192, 768, f32), 1e-5)]
    if not smoke:  # (the CPU tests cover the rest in interpret mode)
        cases += [("wkv_seq B=2 T=5 H=3", "wkv_seq", wkv_inputs(2, (2, 5), 3), 1e-4),
                  ("linear M=3 N=320 K=192", "linear", linear_inputs(5, 3, 320, 192, f32), 1e-5),
                  ("linear M=1 N=96 K=192", "linear", linear_inputs(4, 1, 96, 192, f32), 1e-5),
                  ("wkv_step B=5 H=40", "wkv_step", wkv_inputs(7, (5,), 40), 1e-4),
                  ("wkv_seq B=1 T=300 H=40", "wkv_seq", wkv_inputs(8, (1, 300), 40), 1e-3),
                  ("shift_mix B=7 C=2560 n=1 bf16", "shift_mix", mix_inputs(9, 7, 2560, 1, bf16), 1e-2),
                  ("linear M=1 N=2560 K=10240 bf16", "linear", linear_inputs(10, 1, 2560, 10240, bf16), 1e-2),
                  ("linear M=16 N=10240 K=2560 bf16", "linear", linear_inputs(11, 16, 10240, 2560, bf16), 1e-2),
                  ("linear M=5 N=96 K=96 f32", "linear", linear_inputs(12, 5, 96, 96, f32), 1e-5),
                  ("channel_mix M=3 C=2560 bf16", "channel_mix", ffn_inputs(13, 3, 2560, 10240, bf16), 1e-2)]
    return cases


def run_parity(smoke: bool, interpret: bool) -> dict:
    """Kernel vs reference errors, sparse exactness, whole-model pallas vs xla errors."""
    out = {"kernels": [], "sparse": [], "models": []}
    fns = pallas_fns(interpret)
    with jax.default_matmul_precision("highest"):
        for label, name, args, tol in parity_cases(smoke):
            out["kernels"].append(attempt({"case": label, "tol": tol}, kernel_parity, fns[name], REFERENCES[name],
                                          args, tol))
        out["sparse"] = [attempt({"zero_fraction": z, "rows": M}, sparse_exactness, z, M, interpret)
                         for z, M in (((0.5, 1),) if smoke else ((0.5, 1), (0.95, 3), (0.5, 4)))]
        model_cases = [(named_config("tiny"), 1, 1)] if smoke else [
            (named_config("tiny"), B, T) for B, T in ((1, 1), (4, 1), (1, 17), (3, 1))] + [(ODD, 5, 1), (ODD, 2, 9)]
        kernels = "pallas-interpret" if interpret else "pallas"
        for config, B, T in model_cases:
            out["models"].append(attempt({"config": f"C={config.n_embd} H={config.n_head} L={config.n_layer}",
                                          "B": B, "T": T}, model_parity, config, B, T, kernels,
                                         steps=2 if smoke else 3))
    out["ok"] = all(r["ok"] for part in ("kernels", "sparse", "models") for r in out[part])
    return out


def kernel_parity(fn, reference, args, tol) -> dict:
    """Max |kernel - reference| over all outputs (compiled, or interpreted in --smoke); ok when
    within tol * max(1, max |reference|) (a bf16 ulp grows with the magnitude)."""
    got = block(jax.jit(fn)(*args))
    want = reference(*args)
    pairs = [(jnp.asarray(g, jnp.float32), jnp.asarray(w, jnp.float32))
             for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want))]
    err = max(float(jnp.max(jnp.abs(g - w))) for g, w in pairs)
    scale = max(float(jnp.max(jnp.abs(w))) for _, w in pairs)
    finite = all(bool(jnp.all(jnp.isfinite(g))) for g, _ in pairs)
    return {"max_abs_err": err, "max_abs_ref": scale, "ok": finite and err <= tol * max(1.0, scale)}


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


def model_parity(config, B, T, kernels, steps) -> dict:
    """Max |pallas - xla| over logits and state leaves of a random float32 model."""
    params = random_params(config, jnp.float32, seed=3)
    models = {k: Model(params, config, jnp.float32, k) for k in ("xla", kernels)}
    states = {k: m.init_state(B) for k, m in models.items()}
    rng = np.random.default_rng(B * 100 + T)
    worst = {"logits": 0.0, "att_shift": 0.0, "wkv": 0.0, "ffn_shift": 0.0}
    for _ in range(steps):
        tokens = rng.integers(0, config.vocab_size, (B, T))
        res = {}
        for k, m in models.items():
            logits, states[k] = m.forward(tokens, states[k])
            res[k] = (logits, *states[k])
        for name, a, b in zip(worst, res["xla"], res[kernels]):
            worst[name] = max(worst[name], float(jnp.max(jnp.abs(a - b))))
    return {"path": models[kernels].last_path.name, "max_abs_err": worst,
            "ok": all(e <= 1e-4 for e in worst.values())}


# ----------------------------------------------------------------------------- timing
def time_calls(fn, argsets, min_time_s: float = 0.3) -> float:
    """Seconds per call of fn, from one jit that runs fn on each of the argument sets
    (distinct inputs, so nothing is shared or merged) repeated until min_time_s passes."""
    many = jax.jit(lambda sets: [fn(*a) for a in sets])
    block(many(argsets))
    start, n = time.perf_counter(), 0
    while True:
        out = many(argsets)
        n += 1
        if n >= 3 and time.perf_counter() - start >= min_time_s:
            break
        if n % 4 == 0:
            block(out)
    block(out)
    return (time.perf_counter() - start) / (n * len(argsets))


def _copies(args, reps, share_bytes):
    """reps argument sets: inputs under share_bytes are perturbed copies, larger ones shared
    (the shared weights are far bigger than the L2 cache, so no set hits in cache)."""
    sets = []
    for i in range(reps):
        sets.append(tuple(a if (a is None or a.nbytes >= share_bytes) else a + jnp.asarray(i * 1e-3, a.dtype)
                          for a in args))
    return sets


def kernel_time_cases(smoke: bool) -> list:
    """(label, kernel name, args) at 2.9b shapes in bf16 (tiny shapes for --smoke)."""
    bf16 = jnp.bfloat16
    C, H, F, V = (128, 2, 512, 512) if smoke else (2560, 40, 10240, 65536)
    if smoke:  # one cheap kernel and the channel-mix (it has the extra value-product timing)
        return [("shift_mix B=1 n=6", "shift_mix", mix_inputs(1, 1, C, 6, bf16)),
                ("channel_mix M=1", "channel_mix", ffn_inputs(1, 1, C, F, bf16))]
    cases = [(f"wkv_step B={B}", "wkv_step", wkv_inputs(B, (B,), H)) for B in (1, 64, 256)]
    cases += [(f"wkv_seq B=1 T={PREFILL_T}", "wkv_seq", wkv_inputs(1, (1, PREFILL_T), H))]
    cases += [(f"shift_mix B={B} n=6", "shift_mix", mix_inputs(B, B, C, 6, bf16)) for B in (1, 16, 256)]
    shapes = [(1, C, C), (1, F, C), (1, C, F), (1, V, C), (4, C, C), (4, F, C), (16, C, C), (16, F, C)]
    cases += [(f"linear M={M} N={N} K={K}", "linear", linear_inputs(N + K, M, N, K, bf16)) for M, N, K in shapes]
    cases += [(f"channel_mix M={M}", "channel_mix", ffn_inputs(M, M, C, F, bf16)) for M in (1, 2, 4, 8, 16)]
    return cases


def run_kernel_times(smoke: bool, interpret: bool, budget: Budget, until_left_s: float) -> list:
    """Pallas vs XLA seconds per call for each case; the value product alone (sparse kernel vs
    the XLA dense product, both on the model's [F, C] value layout) is timed beside the
    channel-mix."""
    fns, rows = pallas_fns(interpret), []
    reps = 1 if smoke else 8
    for label, name, args in kernel_time_cases(smoke):
        if budget.left() < until_left_s:
            rows.append({"case": label, "skipped": "time budget"})
            continue
        rows.append(attempt({"case": label}, kernel_times, fns[name], XLA_EQUIVALENT[name], args, reps, smoke))
        if name == "channel_mix":
            attempt(rows[-1], sparse_split_times, args, reps, interpret, smoke)
    return rows


def kernel_times(pallas_fn, xla_fn, args, reps, smoke) -> dict:
    sets = _copies(args, reps, share_bytes=64 << 20)
    pallas_s = time_calls(pallas_fn, sets, 0.05 if smoke else 0.3)
    xla_s = time_calls(xla_fn, sets, 0.05 if smoke else 0.3)
    return {"pallas_us": pallas_s * 1e6, "xla_us": xla_s * 1e6, "speedup": xla_s / pallas_s}


def sparse_split_times(args, reps, interpret, smoke) -> dict:
    """Value product alone: the sparse kernel vs XLA's dense product, on hidden [M, F] and the
    model's w_val_t [F, C]."""
    xk, w_key, w_val_t = args
    hidden = sparse_channel_mix.relu_square(XLA_OPS.linear(xk, w_key).astype(jnp.float32), xk.dtype)
    sparse = functools.partial(sparse_channel_mix.sparse_value_product, interpret=interpret)
    sets = _copies((hidden, w_val_t), reps, share_bytes=1 << 20)
    min_t = 0.05 if smoke else 0.3
    return {"active_fraction": float(jnp.mean(jnp.any(hidden != 0, axis=0))),
            "value_sparse_us": time_calls(sparse, sets, min_t) * 1e6,
            "value_dense_xla_us": time_calls(jnp.matmul, sets, min_t) * 1e6}


def run_roofline(smoke: bool) -> dict:
    """Copy bandwidth (read + write of a large buffer) and bf16 matmul rate."""
    n_bytes = (16 << 20) if smoke else (2 << 30)
    x = jnp.ones((n_bytes // 4,), jnp.float32)
    bw = 2 * n_bytes / time_calls(lambda a: a + 1.0, [(x,)], 0.05 if smoke else 0.5)
    n = 256 if smoke else 8192
    a = jax.random.normal(jax.random.key(0), (n, n)).astype(jnp.bfloat16)
    b = jax.random.normal(jax.random.key(1), (n, n)).astype(jnp.bfloat16)
    rate = 2 * n ** 3 / time_calls(lambda p, q: p @ q, [(a, b)], 0.05 if smoke else 0.5)
    return {"copy_bytes": n_bytes, "copy_GBps": bw / 1e9, "matmul_n": n, "bf16_matmul_TFLOPs": rate / 1e12}


# ----------------------------------------------------------------------------- models
def model_items(smoke: bool) -> list:
    """(model name, kernels, B, T) in priority order (see the module docstring)."""
    if smoke:
        # the kernels="pallas" compile is exercised by the smoke parity section already
        return [("tiny", "xla", 1, 1), ("tiny", "xla", 1, 8)]
    items = []
    for name, B, T in [("2.9b", 1, 1), ("1.5b", 1, 1), ("2.9b", 256, 1), ("2.9b", 1, PREFILL_T),
                       ("1.5b", 256, 1), ("1.5b", 1, PREFILL_T)]:
        items += [(name, k, B, T) for k in ("pallas", "xla")]
    for name in ("2.9b", "1.5b"):
        items += [(name, k, B, 1) for B in DECODE_BUCKETS[1:-1] for k in ("pallas", "xla")]
    return items


def run_models(smoke: bool, roofline: dict, budget: Budget, until_left_s: float, on_result) -> list:
    """Decode/prefill throughput per item while the budget lasts; on_result(rows) after each."""
    dtype = jnp.float32 if smoke else jnp.bfloat16
    jitted = jax.jit(rwkv_jax.forward_fn, static_argnames=("config", "path", "kernels", "full_output"),
                     donate_argnames=("state",))
    params_cache, compile_est, rows = {}, {}, []
    for name, kernels, B, T in model_items(smoke):
        row = {"model": name, "kernels": kernels, "B": B, "T": T}
        est = compile_est.get((name, kernels), FIRST_COMPILE_GUESS_S) + 5
        if budget.left() - until_left_s < est:
            rows.append({**row, "skipped": f"time budget (needs ~{est:.0f} s)"})
            on_result(rows)
            continue
        config = named_config(name)
        if name not in params_cache:
            params_cache[name] = block(random_params(config, dtype, seed=0))
        t0 = time.perf_counter()
        rows.append(attempt(row, measure_model, jitted, params_cache[name], config, kernels, B, T, smoke,
                            roofline))
        compile_est[(name, kernels)] = row.get("compile_s", time.perf_counter() - t0)
        on_result(rows)
    return rows


def measure_model(jitted, params, config, kernels, B, T, smoke, roofline) -> dict:
    """Compile one (B, T) forward and time it with the state carried (donated) across steps."""
    dtype = params["emb"].dtype
    tokens = jax.random.randint(jax.random.key(B * T), (B, T), 0, config.vocab_size)
    state = rwkv_jax.init_state(config, B, dtype)
    path = rwkv_jax.select_path(B, T)
    t0 = time.perf_counter()
    exe = jitted.lower(params, tokens, state, config=config, path=path, kernels=kernels).compile()
    compile_s = time.perf_counter() - t0
    _, state = block(exe(params, tokens, state))
    one = time.perf_counter()
    _, state = block(exe(params, tokens, state))
    one = time.perf_counter() - one
    n = int(min(200, max(3, (0.1 if smoke else 1.0) / max(one, 1e-6))))
    start = time.perf_counter()
    for _ in range(n):
        logits, state = exe(params, tokens, state)
    block((logits, state))
    step_s = (time.perf_counter() - start) / n
    params_bytes = sum(x.nbytes for x in jax.tree.leaves(params))
    nbytes, flops = step_bytes_and_flops(config, params_bytes, jnp.dtype(dtype).itemsize, B, T)
    bytes_s = nbytes / (roofline["copy_GBps"] * 1e9)
    flops_s = flops / (roofline["bf16_matmul_TFLOPs"] * 1e12)
    return {"path": path.name, "compile_s": compile_s, "step_ms": step_s * 1e3, "tok_s": B * T / step_s,
            "hbm_roofline_fraction": bytes_s / step_s, "compute_roofline_fraction": flops_s / step_s,
            "roofline_fraction": max(bytes_s, flops_s) / step_s}


def measure_engine_step(params, config, kernels, B, smoke) -> dict:
    """The engine's whole decode step (forward + on-device sampling + the host reading the
    drawn tokens, as rwkv7-generate runs it) at bucket B: ms per step with every row greedy,
    and with one row sampling (temperature 1, top-k 50, top-p 0.9: the sampler's
    conditionals and threshold loops then run; they are a device while loop each on a GPU)."""
    from rwkv_jax.engine import JaxEngine
    from rwkv7_core.sampling import SamplingParams

    engine = JaxEngine(Model(params, config, params["emb"].dtype, kernels), prefill_pieces=(1,))
    t0 = time.perf_counter()
    engine.compile([B])
    out = {"engine_compile_s": time.perf_counter() - t0}
    engine.resize([], B)
    tokens, positions = np.zeros(B, np.int32), np.zeros(B, np.int32)
    for label in ("greedy", "sampled"):
        if label == "sampled":
            engine.insert(0, engine.prefill(np.array([1], np.int32)),
                          SamplingParams(temperature=1.0, top_k=50, top_p=0.9, seed=0))
        engine.step(tokens, positions)
        n, start = (3 if smoke else 50), time.perf_counter()
        for _ in range(n):
            engine.step(tokens, positions)
        out[f"engine_step_{label}_ms"] = (time.perf_counter() - start) / n * 1e3
    return out


def run_fused_decode(smoke: bool, roofline: dict, budget: Budget, until_left_s: float) -> dict:
    """kernels="pallas" vs "pallas-fused" (issue 15): float32 parity of the fused path against
    XLA, then decode tok/s at B = 1, 8, 32, 256 (1.5b shape, bf16) for both, the launches of
    each compiled step (fusions + custom calls + copies in its HLO) and the per-launch cost
    they imply: (step_pallas - step_fused) / (launches_pallas - launches_fused); and, for the
    fused kernels, the engine's whole decode step greedy and sampling (``measure_engine_step``:
    what sampling adds to the forward's step_ms)."""
    kernels = "pallas-fused-interpret" if smoke else "pallas-fused"
    out = {"parity": [attempt({"config": "odd", "B": B}, model_parity, ODD, B, 1, kernels, 3)
                      for B in ((1,) if smoke else (1, 5))], "decode": []}
    dtype = jnp.float32 if smoke else jnp.bfloat16
    name = "tiny" if smoke else "1.5b"
    config = named_config(name)
    params = block(random_params(config, dtype, seed=0))
    jitted = jax.jit(rwkv_jax.forward_fn, static_argnames=("config", "path", "kernels", "full_output"),
                     donate_argnames=("state",))

    def launches(kind, B):
        tokens, state = jnp.zeros((B, 1), jnp.int32), rwkv_jax.init_state(config, B, dtype)
        text = jitted.lower(params, tokens, state, config=config, path=rwkv_jax.select_path(B, 1),
                            kernels=kind).compile().as_text()
        entry = text[text.index("\nENTRY "):]
        return sum(entry.count(op) for op in (" fusion(", " custom-call(", " copy("))

    for B in (1,) if smoke else (1, 8, 32, 256):
        pair = {}
        for kind in ("pallas-interpret" if smoke else "pallas", kernels):
            if budget.left() - until_left_s < FIRST_COMPILE_GUESS_S:
                pair[kind] = {"skipped": "time budget"}
                continue
            row = attempt({"model": name, "kernels": kind, "B": B, "T": 1},
                          measure_model, jitted, params, config, kind, B, 1, smoke, roofline)
            row.update(attempt({}, lambda: {"launches": launches(kind, B)}))
            if kind == kernels and budget.left() - until_left_s > FIRST_COMPILE_GUESS_S:
                row.update(attempt({}, measure_engine_step, params, config, kind, B, smoke))
            pair[kind] = row
        old, new = pair.values()
        if "step_ms" in old and "step_ms" in new and old.get("launches", 0) > new.get("launches", 0):
            pair["per_launch_us"] = (old["step_ms"] - new["step_ms"]) * 1e3 / (old["launches"] - new["launches"])
        out["decode"].append({"B": B, **pair})
    return out


def goals(rows: list) -> dict:
    """The issue's speed goals, evaluated on the measured rows (None where not measured)."""
    got = {(r["model"], r["kernels"], r["B"], r["T"]): r for r in rows if "tok_s" in r}
    out = {}
    for name in ("1.5b", "2.9b"):
        p, x = got.get((name, "pallas", 1, 1)), got.get((name, "xla", 1, 1))
        out[f"{name} pallas/xla at B=1 >= {GOALS['pallas_over_xla_b1']}"] = (
            None if not (p and x) else p["tok_s"] / x["tok_s"])
        out[f"{name} pallas B=1 HBM roofline fraction >= {GOALS['b1_hbm_roofline_fraction']}"] = (
            None if not p else p["hbm_roofline_fraction"])
    best = [r["tok_s"] for k, r in got.items() if k[0] == "2.9b" and k[2] == 256 and k[3] == 1]
    out[f"2.9b B=256 tok/s >= {GOALS['2.9b_b256_tok_s']}"] = max(best) if best else None
    return out


# ----------------------------------------------------------------------------- deviceless
ESTIMATES = FsPath(__file__).resolve().parent / "results" / "gpu_compile_h200.json"


def run_deviceless(smoke: bool) -> dict:
    """Deviceless H200 compile of a tiny forward (B=2, T=1), serialized; on a GPU also loaded
    and run against the same forward compiled on the device (exact equality expected: both
    are XLA:GPU compiles of one program for sm_90; any other GPU records a load error)."""
    from rwkv_jax import deviceless

    config, B = named_config("tiny"), 2
    target = deviceless.load_target("h200")
    kernels = "xla" if smoke else "pallas"
    model = deviceless.abstract_engine(config, "float32", kernels, target).model
    t0 = time.perf_counter()
    compiled = model.lower((B, 1, False)).compile()
    blob = deviceless.serialize(compiled)
    out = {"target": target.device, "kernels": kernels, "compile_s": time.perf_counter() - t0,
           "serialized_bytes": len(blob)}
    if smoke:
        return {**out, "loaded": False, "ok": True, "note": "loading needs a GPU"}
    params = random_params(config, jnp.float32, seed=5)
    local = Model(params, config, jnp.float32, kernels)
    tokens = jax.random.randint(jax.random.key(5), (B, 1), 0, config.vocab_size)
    want = block(local.executables.get((B, 1, False))(params, tokens, local.init_state(B)))
    loaded = deviceless.deserialize(blob)
    got = block(loaded(params, tokens, local.init_state(B)))
    diff = max(float(jnp.max(jnp.abs(jnp.asarray(g, jnp.float32) - jnp.asarray(w, jnp.float32))))
               for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)))
    return {**out, "loaded": True, "max_abs_diff": diff, "ok": diff == 0.0}


def estimate_check(rows: list) -> list:
    """Measured decode rows beside the deviceless paper estimate for the same bucket."""
    if not ESTIMATES.exists():
        return []
    estimates = {(r["shape"], r["kernels_option"], r["B"], r["T"]): r["estimate"]
                 for r in json.loads(ESTIMATES.read_text())["rows"] if r.get("ok")}
    out = []
    for r in rows:
        est = estimates.get((r["model"], r["kernels"], r["B"], r["T"]))
        if est and "step_ms" in r:
            ratio = r["step_ms"] * 1e3 / est["step_us"]
            out.append({"model": r["model"], "kernels": r["kernels"], "B": r["B"], "T": r["T"],
                        "measured_us": r["step_ms"] * 1e3, "estimated_us": est["step_us"],
                        "measured_over_estimate": ratio, "held_within_2x": 0.5 <= ratio <= 2.0})
    return out


# ----------------------------------------------------------------------------- serving hook
def load_serving_hook():
    """rwkv7_apps.serving_bench.gpu_check_section if it exists, else (None, reason)."""
    try:
        module = importlib.import_module("rwkv7_apps.serving_bench")
    except ImportError as e:
        return None, f"rwkv7_apps.serving_bench not importable ({e})"
    hook = getattr(module, "gpu_check_section", None)
    if hook is None:
        return None, "rwkv7_apps.serving_bench has no gpu_check_section(out_dir, budget_s)"
    return hook, None


def run_http_serving(out_dir: str, budget_s: float = 120) -> dict:
    """benchmarks/http_serving.py's short GPU run (rwkv7-serve vs in-process scheduler on the
    same workload), at most about budget_s seconds; {"status": ...} when it cannot run."""
    try:
        module = importlib.import_module("benchmarks.http_serving")
    except ImportError as e:
        return {"status": "absent", "reason": str(e)}
    return module.gpu_check_section(out_dir, budget_s)


# ----------------------------------------------------------------------------- report
def environment() -> dict:
    versions = {"python": platform.python_version(), "jax": jax.__version__, "numpy": np.__version__}
    for mod in ("jaxlib", "flax", "torch", "triton"):
        try:
            versions[mod] = importlib.import_module(mod).__version__
        except Exception:  # optional on the machine; record its absence
            versions[mod] = None
    return {"date_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "backend": jax.default_backend(), "devices": [d.device_kind for d in jax.devices()],
            "versions": versions}


def _status(row: dict) -> str | None:
    """'error: ...' / 'skipped: ...' for a row that has no measurement, else None."""
    if "error" in row:
        return "error: " + row["error"].splitlines()[0][:160]
    if "skipped" in row:
        return "skipped: " + row["skipped"]
    return None


def markdown(results: dict) -> str:
    env = results["environment"]
    lines = [f"# GPU check — {env['date_utc']}", "",
             f"devices: {', '.join(env['devices'])}; versions: "
             + ", ".join(f"{k} {v}" for k, v in env["versions"].items()), ""]
    parity = results.get("parity")
    if parity:
        lines += [f"## Parity: {'all ok' if parity['ok'] else 'FAILURES'}", "", "| case | error vs reference | ok |",
                  "|---|---|---|"]
        for r in parity["kernels"]:
            lines.append(f"| {r['case']} | {_status(r) or format(r['max_abs_err'], '.2e')} | {r['ok']} |")
        for r in parity["sparse"]:
            err = _status(r) or f"rel {r['rel_err']:.1e}, bit-identical {r['bit_identical']}"
            lines.append(f"| sparse {r['zero_fraction']:.0%} zeros M={r['rows']} | {err} | {r['ok']} |")
        for r in parity["models"]:
            err = _status(r) or f"{max(r['max_abs_err'].values()):.2e} ({r['path']})"
            lines.append(f"| model {r['config']} B={r['B']} T={r['T']} | {err} | {r['ok']} |")
        lines.append("")
    roof = results.get("roofline")
    if roof:
        lines += [f"## Roofline: copy {roof['copy_GBps']:.4g} GB/s, bf16 matmul "
                  f"{roof['bf16_matmul_TFLOPs']:.4g} TFLOP/s", ""]
    if results.get("kernels"):
        lines += ["## Kernels (us per call)", "", "| case | pallas | xla | xla/pallas |", "|---|---|---|---|"]
        for r in results["kernels"]:
            if _status(r) and "pallas_us" not in r:
                lines.append(f"| {r['case']} | {_status(r)} | | |")
                continue
            extra = (f" (value product: sparse {r['value_sparse_us']:.1f} vs dense {r['value_dense_xla_us']:.1f}, "
                     f"active {r['active_fraction']:.0%})" if "value_sparse_us" in r else "")
            lines.append(f"| {r['case']}{extra} | {r['pallas_us']:.1f} | {r['xla_us']:.1f} | {r['speedup']:.2f} |")
        lines += ["", f"Measured sparse channel-mix threshold (largest M where the sparse value product wins): "
                      f"{results.get('measured_sparse_max_rows')}", ""]
    if results.get("models"):
        lines += [f"## Models ({'float32 (smoke)' if results['smoke'] else 'bf16'}, random weights)", "",
                  "| model | kernels | B | T | tok/s | step ms | roofline fraction (HBM / compute) | compile s |",
                  "|---|---|---|---|---|---|---|---|"]
        for r in results["models"]:
            head = f"| {r['model']} | {r['kernels']} | {r['B']} | {r['T']} |"
            if _status(r):
                lines.append(f"{head} {_status(r)} | | | |")
                continue
            lines.append(f"{head} {r['tok_s']:,.0f} | {r['step_ms']:.3f} | {r['hbm_roofline_fraction']:.2f} / "
                         f"{r['compute_roofline_fraction']:.2f} | {r['compile_s']:.1f} |")
        lines += ["", "## Goals", ""] + [f"- {k}: {'not measured' if v is None else f'{v:.3g}'}"
                                        for k, v in results.get("goals", {}).items()]
    dl = results.get("deviceless")
    if dl:
        lines += ["", f"## Deviceless H200 executable: {'ok' if dl.get('ok') else 'FAILED'}", "",
                  "```", json.dumps(dl, indent=1, default=str)[:2000], "```"]
    for r in results.get("estimate_check", []):
        lines.append(f"- estimate {r['model']} {r['kernels']} B={r['B']}: measured {r['measured_us']:.0f} us vs "
                     f"estimated {r['estimated_us']:.0f} us (x{r['measured_over_estimate']:.2f})")
    if results.get("fused_decode"):
        lines += ["", "## pallas vs pallas-fused decode (and the engine's whole step)", "", "```",
                  json.dumps(results["fused_decode"], indent=1, default=str)[:6000], "```"]
    if results.get("serving"):
        lines += ["", "## Serving", "", "```", json.dumps(results["serving"], indent=1)[:4000], "```"]
    return "\n".join(lines) + "\n"


def run_data_parallel(smoke: bool) -> dict:
    """Batch-generation throughput (0.1b shape, bf16) on one GPU vs a replica on every local
    GPU (rwkv7_apps.replicas), same workload per GPU; skipped unless several devices."""
    devices = jax.local_devices()
    if smoke or len(devices) < 2:
        return {"status": "skipped", "reason": f"{len(devices)} local device(s); needs 2 or more"}
    import tempfile

    from rwkv7_apps.engines import load_engines
    from rwkv7_apps.replicas import build_replica_set
    from rwkv7_core.random_weights import write_random_checkpoint
    from scheduler import Request, SamplingParams, Scheduler, SchedulerConfig

    with tempfile.TemporaryDirectory() as d:
        path = FsPath(d) / "model.safetensors"
        write_random_checkpoint(path, named_config("0.1b"), seed=0)
        engines = load_engines("jax", path, "bfloat16", "auto", list(range(len(devices))))
    config = SchedulerConfig(max_batch=128, precompile=True)
    rng = np.random.default_rng(0)
    rows = {}
    for label, n in (("1 device", 1), (f"{len(devices)} devices", len(devices))):
        sched = Scheduler(engines[0], config) if n == 1 else build_replica_set(engines, [str(x) for x in devices], config)
        for measured in (False, True):  # the first pass compiles
            reqs = [Request(f"{measured}-{i}", rng.integers(1, 65536, size=128).tolist(),
                            SamplingParams(max_tokens=256 if measured else 8)) for i in range(128 * n)]
            for r in reqs:
                sched.add(r)
            start = time.perf_counter()
            tokens = []
            sched.run(on_finish=lambda out: tokens.append(out.generated_tokens))
            seconds = time.perf_counter() - start
        rows[label] = {"replicas": n, "seconds": seconds, "tok_s": sum(tokens) / seconds}
    one, every = rows["1 device"]["tok_s"], rows[f"{len(devices)} devices"]["tok_s"]
    return {"status": "ok", "runs": rows, "scaling_efficiency": every / (len(devices) * one)}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description="Pallas kernel GPU check (issue 4)")
    ap.add_argument("--out", default="benchmarks/results/", help="directory for gpu_check.json/.md")
    ap.add_argument("--smoke", action="store_true", help="CPU run with tiny shapes and interpret-mode kernels")
    ap.add_argument("--cache-dir", default=None,
                    help="persistent JAX compilation cache (a rerun on the same machine skips compiles)")
    args = ap.parse_args(argv)
    if not args.smoke and jax.default_backend() != "gpu":
        raise SystemExit(f"gpu_check needs a GPU (backend is {jax.default_backend()!r}); use --smoke on a CPU")
    budget = Budget(math.inf if args.smoke else TOTAL_BUDGET_S)  # --smoke: CI load must not skip pieces
    if args.cache_dir:
        rwkv_jax.enable_compilation_cache(args.cache_dir)
    out_dir = FsPath(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    interpret = args.smoke
    results = {"environment": environment(), "smoke": args.smoke, "interpret": interpret}

    def save():
        (out_dir / "gpu_check.json").write_text(json.dumps(results, indent=1, default=str))
        (out_dir / "gpu_check.md").write_text(markdown(results))

    hook, why_not = load_serving_hook()
    reserve = SERVING_BUDGET_S if (hook and not args.smoke) else 0
    results["parity"] = run_parity(args.smoke, interpret)
    save()
    results["roofline"] = run_roofline(args.smoke)
    save()
    results["kernels"] = run_kernel_times(args.smoke, interpret, budget,
                                          until_left_s=max(reserve + MODEL_MIN_S, budget.left() - KERNEL_BUDGET_S))
    results["measured_sparse_max_rows"] = sparse_rows_threshold(results["kernels"])
    save()

    def on_models(rows):
        results["models"], results["goals"] = rows, goals(rows)
        save()

    on_models(run_models(args.smoke, results["roofline"], budget, reserve, on_models))
    results["deviceless"] = attempt({}, run_deviceless, args.smoke)
    results["estimate_check"] = estimate_check(results["models"])
    results["fused_decode"] = run_fused_decode(args.smoke, results["roofline"], budget, reserve)
    save()
    if hook and not args.smoke:
        results["serving"] = attempt({}, hook, out_dir=str(out_dir),
                                     budget_s=min(SERVING_BUDGET_S, max(budget.left(), 0)))
    else:
        results["serving"] = {"status": "skipped in --smoke" if hook else "absent", "reason": why_not}
    results["data_parallel"] = attempt({}, run_data_parallel, args.smoke)
    results["http_serving"] = ({"status": "skipped in --smoke"} if args.smoke
                               else attempt({}, run_http_serving, out_dir=str(out_dir)))
    results["elapsed_s"] = time.perf_counter() - budget.start
    save()
    print(markdown(results))
    return results


if __name__ == "__main__":
    main()
