"""Section kernels: each Pallas kernel's time against the XLA op it replaces, and the sparse
value product against the dense one beside the channel-mix (the measured value for
rwkv_jax.pallas_ops.SPARSE_MAX_ROWS)."""
from __future__ import annotations

import functools

import jax.numpy as jnp

from benchmarks.gpu_checks.common import attempt, time_calls
from benchmarks.gpu_checks.parity import pallas_fns
from benchmarks.gpu_checks.schedule import KERNEL_BUDGET_S, PREFILL_T, VARLEN_LENGTHS, Budget
from pallas_kernels import sparse_channel_mix
from rwkv_jax.ops import XLA_OPS
from rwkv_jax.varlen import Segments
from tests.support.pallas_inputs import ffn_inputs, linear_inputs, mix_inputs, varlen_wkv_inputs, wkv_inputs


def xla_wkv_varlen(r, w, k, v, kk, a, S, cu_seqlens):
    """The XLA op the chunked varlen kernel replaces (a per-token loop), on the kernel's operands."""
    return XLA_OPS.wkv_varlen(r, w, k, v, kk, a, S, Segments(cu_seqlens[:-1], jnp.diff(cu_seqlens)))


XLA_EQUIVALENT = {"wkv_step": XLA_OPS.wkv_step, "wkv_seq": XLA_OPS.wkv_seq,
                  "shift_mix": XLA_OPS.shift_mix, "linear": XLA_OPS.linear,
                  "channel_mix": XLA_OPS.channel_mix, "wkv_varlen": xla_wkv_varlen,
                  "wkv_seq_chunked": XLA_OPS.wkv_seq}


def _copies(args, reps, share_bytes):
    """reps argument sets: inputs under share_bytes are perturbed copies, larger ones shared
    (the shared weights are far bigger than the L2 cache, so no set hits in cache)."""
    sets = []
    for i in range(reps):
        sets.append(tuple(a if (a is None or a.nbytes >= share_bytes) else a + jnp.asarray(i * 1e-3, a.dtype)
                          for a in args))
    return sets


def kernel_time_cases(smoke: bool) -> list:
    """(label, kernel name, args maker) at 2.9b shapes in bf16 (tiny shapes for --smoke); the
    inputs are made only for the cases the budget lets run."""
    bf16, p = jnp.bfloat16, functools.partial
    C, H, F, V = (128, 2, 512, 512) if smoke else (2560, 40, 10240, 65536)
    if smoke:  # the channel-mix: it has the extra value-product timing
        return [("channel_mix M=1", "channel_mix", p(ffn_inputs, 1, 1, C, F, bf16))]
    cases = [(f"wkv_step B={B}", "wkv_step", p(wkv_inputs, B, (B,), H)) for B in (1, 64, 256)]
    cases += [(f"wkv_seq B=1 T={PREFILL_T}", "wkv_seq", p(wkv_inputs, 1, (1, PREFILL_T), H))]
    cases += [(f"wkv_seq chunked B=1 T={PREFILL_T}", "wkv_seq_chunked", p(wkv_inputs, 1, (1, PREFILL_T), H)),
              ("wkv_varlen 64 prompts in 4096 tokens", "wkv_varlen", p(varlen_wkv_inputs, 2, VARLEN_LENGTHS, H))]
    cases += [(f"shift_mix B={B} n=6", "shift_mix", p(mix_inputs, B, B, C, 6, bf16)) for B in (1, 16, 256)]
    shapes = [(1, C, C), (1, F, C), (1, C, F), (1, V, C), (4, C, C), (4, F, C), (16, C, C), (16, F, C)]
    cases += [(f"linear M={M} N={N} K={K}", "linear", p(linear_inputs, N + K, M, N, K, bf16)) for M, N, K in shapes]
    cases += [(f"channel_mix M={M}", "channel_mix", p(ffn_inputs, M, M, C, F, bf16)) for M in (1, 2, 4, 8, 16)]
    return cases


def run_kernel_times(smoke: bool, interpret: bool, budget: Budget):
    """Pallas vs XLA seconds per call for each case; the value product alone (sparse kernel vs
    the XLA dense product, both on the model's [F, C] value layout) is timed beside the
    channel-mix. Yields after each case."""
    fns, out = pallas_fns(interpret), {"rows": []}
    limit = budget.capped(KERNEL_BUDGET_S)
    reps = 1 if smoke else 8
    for label, name, make_args in kernel_time_cases(smoke):
        reason = limit.shortfall(5)
        out["rows"].append({"case": label, "skipped": reason} if reason else attempt(
            {"case": label}, kernel_case_times, fns[name], name, make_args, reps, interpret, smoke))
        yield out
    out["measured_sparse_max_rows"] = sparse_rows_threshold(out["rows"])
    yield out


def kernel_case_times(pallas_fn, name, make_args, reps, interpret, smoke) -> dict:
    """kernel_times of one case, and sparse_split_times beside a channel-mix."""
    args = make_args()
    times = kernel_times(pallas_fn, XLA_EQUIVALENT[name], args, reps, smoke)
    return {**times, **sparse_split_times(args, reps, interpret, smoke)} if name == "channel_mix" else times


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


def sparse_rows_threshold(kernel_rows: list) -> int | None:
    """Largest row count M whose sparse value product beat the dense one (the measured value
    for rwkv_jax.pallas_ops.SPARSE_MAX_ROWS); 0 if it never did, None if not measured."""
    timed = [(int(r["case"].split("M=")[1]), r["value_sparse_us"] < r["value_dense_xla_us"])
             for r in kernel_rows if "value_sparse_us" in r]
    if not timed:
        return None
    return max((m for m, wins in timed if wins), default=0)
