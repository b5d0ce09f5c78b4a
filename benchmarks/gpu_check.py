"""One-command first GPU run (issue 4): every kernel path checked on the device first, then
decode speed, then the rest while a time budget lasts; a cold run ends within 8 minutes.

    PYTHONUNBUFFERED=1 PYTHONPATH=. python3 benchmarks/gpu_check.py --out DIR [--smoke] [--cache-dir DIR]

Needs jax (+ its CUDA plugin), flax and numpy from a source checkout; torch and triton are
optional. DIR/gpu_check.json and DIR/gpu_check.md are rewritten (atomically) after every
section and every item of a long one, so a run killed at any moment keeps what it measured.
Each section records its status (ok, failed or skipped, with a reason) and seconds.

Sections in order, with the expected seconds of a cold H200 run. These are estimates from
the deviceless H200 compiles recorded on a 2-core CPU (RECORDED_COMPILE_S, taken from
benchmarks/results/decode_nodes.json and gpu_compile_h200.json; compile_speed.json for the
tiny shapes), not measurements: the GPU host's CPU may compile faster, while on a device XLA
also autotunes its GEMMs. So each decode/models item starts only if its recorded compile
seconds, times the slowest measured/recorded ratio so far, fit what is left of TOTAL_BUDGET_S.

1. parity, ~64 s (cap PARITY_BUDGET_S): every Pallas kernel against its plain-jnp reference
   on random inputs (C=192, H=3, odd B; the chunked varlen wkv kernel on lengths 0..300),
   sparse channel-mix exactness (the unfused kernel and the fused one's skipped value rows),
   the fused decode path's self-check as kernels="auto" runs it at load, and whole random
   float32 models (tiny, and ODD: C=192, 3 heads; decode B = 1 and 4/5, prefill T = 17/9;
   3 calls) with kernels "xla", "pallas" and "pallas-fused" on the device against
   kernels="xla" on the CPU. 16 one-kernel and 24 tiny-model compiles of ~1-2 s (the 12-layer
   0.1b compiles in 6-8 s).
2. torch_parity, ~0 s on the critical path (~30 s in a child process beside section 1: torch
   and CUDA start-up, 2 Triton kernels x 2 shapes, 4 tiny JAX compiles on the CPU): the
   torch reference with its Triton kernels compiled for the device against the same torch
   model without them and against the JAX model (kernels="xla", CPU), same random weights:
   logits of a prefill and 3 decode steps and the final state, float32, within
   TOL x max(1, |reference|). torch and JAX never share a process; skipped with the reason
   without torch or a CUDA device for it; in --smoke on a CPU the Triton kernels run
   interpreted (TRITON_INTERPRET=1).
3. roofline, ~5 s: copy bandwidth (2 GB) and bf16 matmul rate (8192^3).
4. decode, ~300 s: the 1.5b shape in bf16 at B = 1, 8, 32, 256 for kernels "pallas-fused",
   "pallas" and "xla": tok/s, step ms, fraction of the roofline, launches per step (the
   summary derives the per-launch cost), and the engine's whole decode step (forward +
   sampling, greedy and with a sampling row) for "pallas-fused". Recorded compiles:
   pallas-fused 11-15 s per B, pallas 11-18 s, the fused engine step ~13 s, xla 26 s (B=1)
   and 95 s (B=8); xla at B=32 (199 s) and B=256 (485 s) come last and start only if the
   compiles measured so far were that much faster.
5. deviceless, ~15 s: a tiny forward compiled for the H200 description (no device), loaded on
   this GPU and run: it must equal the same forward compiled here.
5b. quantized, <= QUANTIZED_BUDGET_S: decode with int8, int4 (library groups) and fp8 weights on the
   Pallas kernels that dequantize in registers (``run_quantized``): 1.5b and 2.9b, B = 1..256,
   tok/s and the fraction of the HBM roofline of the quantized step's bytes; at the recorded
   compile speed the 1.5b B=1 int8 and int4 rows fit, the rest start only if compiles ran faster.
6. prefill, what fits of the rest (issue 24): whole-model 1.5b bf16 prefill with the kernels
   "auto" runs for prefill on a GPU ("pallas": chunked wkv, fused shift-mix rows) at the
   Albatross shapes, cheapest compile first: B=1 x T=1024 dense (~45 s), a varlen batch of 64
   prompts in 4,096 flat tokens (~73 s), B=32 x T=1024 dense (~55 s); tok/s and the fraction of
   the roofline that binds (FLOPs / bf16 matmul rate or bytes / copy bandwidth, both measured
   in section 3; also FLOPs against the 989 TFLOP/s dense bf16 spec). At the recorded compile
   speed a cold run has no time left for it after the quantized rows; a rerun with --cache-dir
   compiles nothing and measures all three.
7. models, the rest of the budget: 2.9b decode B=1 and 256 (pallas-fused 43-64 s a compile,
   xla 55 s at B=1, pallas 126 s), prefill T=1024 (1.5b pallas ~45 s), other decode buckets.
8. kernels, <= KERNEL_BUDGET_S: each kernel's time against the XLA op it replaces (29 cases,
   a Pallas and an XLA compile each).
9. serving (<= SERVING_BUDGET_S), http_serving (<= HTTP_BUDGET_S), data_parallel (>= 2 GPUs).

Start-up (~10 s) + 64 + 5 + 300 + 15 = ~394 s; then the quantized section's 1.5b B=1 int8 and
int4 rows (~35 s; fp8 after them, reached by a rerun); the prefill and models sections start
what still fits and list the rest as skipped, with the reason (a rerun with --cache-dir compiles nothing and reaches them); 30 s of margin
remain under 8 minutes.

--smoke runs every section on the CPU with tiny shapes and interpret-mode kernels and no time
budget (a CI test); the deviceless section then compiles and serializes but cannot load.
"""
from __future__ import annotations

import time

START = time.perf_counter()  # the budget counts the imports too

import argparse
import datetime
import functools
import importlib
import importlib.metadata
import importlib.util
import json
import math
import os
import platform
import subprocess
import sys
import tempfile
import types
from pathlib import Path as FsPath

if __package__ in (None, ""):  # run as a script from the source tree
    sys.path.insert(0, str(FsPath(__file__).resolve().parents[1]))
# other processes on the GPU (the torch parity child, the HTTP server) need memory too: allocate on demand
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import jax
import jax.numpy as jnp
import numpy as np

import rwkv_jax
from pallas_kernels import shift_mix, small_m_linear, sparse_channel_mix, wkv_chunk_varlen, wkv_seq, wkv_step
from pallas_kernels import quantized_channel_mix, quantized_linear
from pallas_kernels.fused_time_mix import fused_channel_mix
from pallas_kernels.quantized import QuantizedWeight
from rwkv7_core.config import ModelConfig, named_config
from rwkv7_core.quantization import quantize, spec_for
from rwkv7_core.cost import step_bytes_and_flops
from rwkv7_core.random_weights import write_random_checkpoint
from rwkv_jax.engine import JaxEngine
from rwkv_jax.kernels import Kernels
from rwkv_jax.model import Model
from rwkv_jax.ops import XLA_OPS
from rwkv_jax.pallas_ops import channel_mix as pallas_channel_mix
from rwkv_jax.pallas_ops import wkv_seq as pallas_wkv_seq
from rwkv_jax.random_params import params_struct, random_params
from rwkv_jax.self_check import check_decode
from rwkv_jax.varlen import Segments
from tests.support.pallas_inputs import ffn_inputs, linear_inputs, mix_inputs, varlen_wkv_inputs, wkv_inputs

TOTAL_BUDGET_S = 450          # whole run from the imports on: 30 s margin under 8 minutes
PARITY_BUDGET_S = 150         # parity items stop starting after this long
TORCH_WAIT_S = 60             # the torch child's answer is awaited this long after parity
KERNEL_BUDGET_S = 90          # per-kernel timings stop starting new cases after this long
SERVING_BUDGET_S = 180        # at most, for rwkv7_apps.serving_bench.gpu_check_section
HTTP_BUDGET_S = 120           # at most, for benchmarks/http_serving.gpu_check_section
SECTION_MIN_S = 60            # serving / HTTP / data-parallel start only with this much left
DEVICELESS_S = 15             # expected seconds of the deviceless section
FIRST_COMPILE_GUESS_S = 60    # compile estimate of a shape with no recorded compile
DECODE_BATCHES = (1, 8, 32, 256)
PREFILL_T = 1024
VARLEN_LENGTHS = tuple(int(n) for n in np.random.default_rng(0).multinomial(4096 - 64, [1 / 64] * 64) + 1)
PREFILL_ITEMS = (("dense", 1, PREFILL_T), ("varlen", 64, 4096), ("dense", 32, PREFILL_T))  # cheapest first
# Deviceless 1.5b pallas prefill compiles, scaled like RECORDED_COMPILE_S's 1x1024 (44.5 s) by
# their ratios in benchmarks/results/chunked_wkv_prefill_h200.md (69.6 / 114.2 / 85.6 s)
PREFILL_COMPILE_S = {("dense", 1, PREFILL_T): 44.5, ("varlen", 64, 4096): 73.0, ("dense", 32, PREFILL_T): 54.7}
BF16_SPEC_FLOPS = 989e12      # H200 dense bf16 tensor throughput (spec)
TOL = 1e-4                    # float32 parity: max |diff| <= TOL * max(1, max |reference|)
GOALS = {"pallas_over_xla_b1": 1.5, "b1_hbm_roofline_fraction": 0.7, "2.9b_b256_tok_s": 30000}
ODD = ModelConfig(n_layer=3, n_embd=192, n_head=3, head_size=64, vocab_size=300, dim_ffn=768,
                  d_decay=24, d_aaa=40, d_mv=20, d_gate=56)
# Deviceless H200 compile seconds of the bf16 forward on a 2-core CPU, (shape, kernels, B, T):
# decode rows of benchmarks/results/decode_nodes.json (pallas-fused "after", pallas/xla
# "before"); the 1.5b pallas prefill is gpu_compile_h200.json's 164.7 s (machine load ~15)
# over 3.7, its ratio to decode_nodes.json on their common row (1.5b pallas B=1).
RECORDED_COMPILE_S = {
    ("1.5b", "pallas-fused", 1, 1): 13.4, ("1.5b", "pallas-fused", 2, 1): 14.5,
    ("1.5b", "pallas-fused", 8, 1): 14.2, ("1.5b", "pallas-fused", 32, 1): 14.6,
    ("1.5b", "pallas-fused", 256, 1): 11.2, ("1.5b", "pallas", 1, 1): 12.7, ("1.5b", "pallas", 8, 1): 18.2,
    ("1.5b", "pallas", 32, 1): 12.5, ("1.5b", "pallas", 256, 1): 11.1, ("1.5b", "pallas", 1, PREFILL_T): 44.5,
    ("1.5b", "xla", 1, 1): 26.0, ("1.5b", "xla", 8, 1): 94.5, ("1.5b", "xla", 32, 1): 198.5,
    ("1.5b", "xla", 256, 1): 484.5, ("2.9b", "pallas-fused", 1, 1): 43.3, ("2.9b", "pallas-fused", 8, 1): 58.2,
    ("2.9b", "pallas-fused", 32, 1): 63.6, ("2.9b", "pallas-fused", 256, 1): 50.1,
    ("2.9b", "pallas", 1, 1): 125.9, ("2.9b", "pallas", 8, 1): 129.7, ("2.9b", "xla", 1, 1): 54.6,
    ("2.9b", "xla", 8, 1): 280.7,
}


# ----------------------------------------------------------------------------- run plumbing
class Budget:
    """Wall-clock budget counted from ``start``."""

    def __init__(self, total_s: float, start: float | None = None):
        self.start, self.total_s = time.perf_counter() if start is None else start, total_s

    def left(self) -> float:
        return self.total_s - (time.perf_counter() - self.start)

    def capped(self, cap_s: float) -> "Budget":
        """A budget from now: cap_s or what is left, whichever is less (no cap when unlimited)."""
        return Budget(self.left() if math.isinf(self.total_s) else min(cap_s, self.left()))

    def shortfall(self, need_s: float) -> str | None:
        """Why an item needing need_s seconds must not start, or None if it fits."""
        left = self.left()
        return None if left >= need_s else f"time budget: needs ~{need_s:.0f} s, {max(left, 0):.0f} s left"


class CompileClock:
    """Compile-time estimates: RECORDED_COMPILE_S (else the largest recorded for the shape and
    kernels, else FIRST_COMPILE_GUESS_S) times the slowest measured/recorded ratio so far."""

    def __init__(self):
        self.ratios = []

    @staticmethod
    def recorded(name, kernels, B, T) -> float | None:
        same = [s for (n, k, _, _), s in RECORDED_COMPILE_S.items() if (n, k) == (name, kernels)]
        return RECORDED_COMPILE_S.get((name, kernels, B, T), max(same, default=None))

    def estimate(self, name, kernels, B, T) -> float:
        base = self.recorded(name, kernels, B, T) or FIRST_COMPILE_GUESS_S
        return base * max(self.ratios, default=1.0)

    def measured(self, name, kernels, B, T, seconds: float) -> None:
        if (name, kernels, B, T) in RECORDED_COMPILE_S:
            self.ratios.append(seconds / RECORDED_COMPILE_S[(name, kernels, B, T)])


def skipped(reason: str) -> dict:
    return {"status": "skipped", "reason": reason}


def attempt(row: dict, fn, *args, **kwargs) -> dict:
    """row updated with fn(...)'s dict, or with the error: one failing kernel or model must
    not cost the rest of a one-shot GPU run."""
    try:
        row.update(fn(*args, **kwargs))
    except Exception as e:  # recorded in the report, never hidden
        row.update({"error": f"{type(e).__name__}: {str(e)[:600]}", "ok": False})
    return row


def failures(tree) -> int:
    """Entries of a section's results that errored or are not ok."""
    if isinstance(tree, dict):
        return int("error" in tree or tree.get("ok") is False) + sum(failures(v) for v in tree.values())
    if isinstance(tree, list):
        return sum(failures(v) for v in tree)
    return 0


class Report:
    """The results dict, written atomically as gpu_check.json and gpu_check.md by save()."""

    def __init__(self, out_dir: FsPath, results: dict):
        self.out_dir, self.results = out_dir, results
        results["sections"] = {}

    def save(self) -> None:
        """The JSON first; a bug in the summary or the markdown must not cost the measurements."""
        self.results["summary"] = attempt({}, summary, self.results["sections"])
        self._write("gpu_check.json", json.dumps(self.results, indent=1, default=str))
        try:
            text = markdown(self.results)
        except Exception as e:
            text = f"markdown failed ({type(e).__name__}: {e}); the results are in gpu_check.json\n"
        self._write("gpu_check.md", text)

    def _write(self, name: str, text: str) -> None:
        tmp = self.out_dir / f".{name}.tmp"
        tmp.write_text(text)
        os.replace(tmp, self.out_dir / name)

    def section(self, name: str, fn, *args) -> dict:
        """Run section fn(*args): a dict, or a generator of dicts (one per item) merged into
        the section's results, each followed by a save; then its status and seconds."""
        part = self.results["sections"][name] = {"status": "running"}
        self.save()
        start = time.perf_counter()
        try:
            got = fn(*args)
            for update in (got if isinstance(got, types.GeneratorType) else (got,)):
                part.update(update)
                self.save()
        except Exception as e:  # recorded; the next sections still run
            part["error"] = f"{type(e).__name__}: {str(e)[:600]}"
        part["seconds"] = round(time.perf_counter() - start, 2)
        if part["status"] == "running":
            bad = failures(part)
            part["status"] = "failed" if bad else "ok"
            if bad:
                part["reason"] = part.get("error", f"{bad} failing entries")
        self.save()
        print(f"[{time.perf_counter() - START:6.1f} s] {name}: {part['status']} in {part['seconds']} s "
              f"{part.get('reason') or ''}", flush=True)
        return part


def block(tree):
    return jax.block_until_ready(tree)


def _keys(seed, n):
    return jax.random.split(jax.random.key(seed), n)


def kernel_names(interpret: bool) -> tuple[str, str, str]:
    """(fused, pallas, xla) kernels option names, interpreted in --smoke."""
    suffix = "-interpret" if interpret else ""
    return f"pallas-fused{suffix}", f"pallas{suffix}", "xla"


def cpu_device():
    """The CPU device for reference models, None when the default device is the CPU."""
    return None if jax.default_backend() == "cpu" else jax.devices("cpu")[0]


@functools.lru_cache(maxsize=None)
def params_for(config: ModelConfig, dtype) -> dict:
    """The random params (seed 0) of a config, made once per run; small shapes (tiny, ODD)
    drawn on the host, which compiles nothing."""
    return block(random_params(config, dtype, seed=0, host=config.n_embd <= 256))


@functools.lru_cache(maxsize=None)
def model_for(config: ModelConfig, dtype, kernels: str, device=None) -> Model:
    """One Model per (config, dtype, kernels, device), so each executable compiles once a run."""
    return Model(params_for(config, dtype), config, dtype, kernels, device)


@functools.lru_cache(maxsize=None)
def executables_for(model: Model):
    """One engine's executable cache per Model, so each forward compiles once a run."""
    return JaxEngine(model).executables


def diff(got, want) -> dict:
    """Max |got - want| over paired arrays (as float32), the max |want| and finiteness."""
    pairs = [(np.asarray(g, np.float32), np.asarray(w, np.float32)) for g, w in zip(got, want)]
    return {"max_abs_err": max(float(np.abs(g - w).max()) for g, w in pairs),
            "max_abs_ref": max(float(np.abs(w).max()) for _, w in pairs),
            "finite": all(bool(np.isfinite(g).all()) for g, _ in pairs)}


def within(d: dict, tol: float) -> bool:
    """ok for a diff(): finite and within tol * max(1, max |reference|) (ulps grow with it)."""
    return d["finite"] and d["max_abs_err"] <= tol * max(1.0, d["max_abs_ref"])


# ----------------------------------------------------------------------------- parity
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


def xla_wkv_varlen(r, w, k, v, kk, a, S, cu_seqlens):
    """The XLA op the chunked varlen kernel replaces (a per-token loop), on the kernel's operands."""
    return XLA_OPS.wkv_varlen(r, w, k, v, kk, a, S, Segments(cu_seqlens[:-1], jnp.diff(cu_seqlens)))


REFERENCES = {"wkv_step": wkv_step.wkv_step_reference, "wkv_seq": wkv_seq.wkv_seq_reference,
              "shift_mix": shift_mix.shift_mix_reference, "linear": small_m_linear.linear_reference,
              "channel_mix": XLA_OPS.channel_mix, "wkv_varlen": wkv_chunk_varlen.wkv_varlen_reference,
              "wkv_seq_chunked": wkv_seq.wkv_seq_reference}
XLA_EQUIVALENT = {"wkv_step": XLA_OPS.wkv_step, "wkv_seq": XLA_OPS.wkv_seq,
                  "shift_mix": XLA_OPS.shift_mix, "linear": XLA_OPS.linear,
                  "channel_mix": XLA_OPS.channel_mix, "wkv_varlen": xla_wkv_varlen,
                  "wkv_seq_chunked": XLA_OPS.wkv_seq}


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


# ----------------------------------------------------------------------------- torch parity
def start_torch_parity(smoke: bool) -> subprocess.Popen:
    """This script with --torch-parity in a child process (JAX on the CPU there)."""
    cmd = [sys.executable, str(FsPath(__file__).resolve()), "--torch-parity"] + (["--smoke"] if smoke else [])
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "JAX_PLATFORMS": "cpu"})


def collect_torch_parity(child: subprocess.Popen, wait_s: float) -> dict:
    """The child's JSON answer, waiting at most wait_s more for it."""
    try:
        out, err = child.communicate(timeout=max(wait_s, 1.0))
    except subprocess.TimeoutExpired:
        child.kill()
        child.communicate()
        return {"error": f"no answer within {wait_s:.0f} s after the JAX parity"}
    if child.returncode != 0:
        return {"error": f"exit status {child.returncode}: {err.strip()[-1500:]}"}
    return json.loads(out.strip().splitlines()[-1])


def run_torch_parity(smoke: bool) -> dict:
    """The torch reference with its Triton kernels (compiled for CUDA; interpreted on a CPU in
    --smoke) against itself without them and against the JAX model, same random weights."""
    try:
        import torch
    except ImportError as e:
        return skipped(f"torch is not installed ({e})")
    if torch.cuda.is_available():
        device, how = "cuda", f"compiled for {torch.cuda.get_device_name()}"
    elif smoke:
        device, how = "cpu", "interpreted (TRITON_INTERPRET=1, CPU)"
    else:
        return skipped(f"torch {torch.__version__} sees no CUDA device (built for CUDA {torch.version.cuda})")
    has_triton = importlib.util.find_spec("triton") is not None
    if has_triton and device == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernels' @triton.jit runs
        from rwkv_torch_ref.triton_kernels import runtime_loops_broken
        if runtime_loops_broken():
            has_triton, how = False, f"skipped: {runtime_loops_broken()}"
    kinds = ("triton", "torch") if has_triton else ("torch",)
    shapes = ((named_config("tiny"), 2, 9),) + (() if smoke else ((ODD, 1, 6),))
    cases = [attempt({"config": f"C={c.n_embd} H={c.n_head} L={c.n_layer}", "B": B, "T": T},
                     torch_case, c, B, T, device, kinds) for c, B, T in shapes]
    return {"device": device, "torch": torch.__version__,
            "triton": how if has_triton else how if how.startswith("skipped") else "not installed: torch path only",
            "jax": f"kernels=xla on {jax.default_backend()}", "tol": TOL, "cases": cases,
            "ok": all(c.get("ok", False) for c in cases)}


def torch_case(config, B, T, device, kinds) -> dict:
    """Prefill of T tokens then 3 decode steps through torch models of ``kinds`` and the JAX
    model from one random checkpoint; every pair compared on all logits and the last state."""
    import rwkv_torch_ref
    with tempfile.TemporaryDirectory() as d:
        path = FsPath(d) / "model.safetensors"
        write_random_checkpoint(path, config, seed=0)
        models = {k: rwkv_torch_ref.load(path, dtype="float32", kernels=k, device=device) for k in kinds}
        models["jax"] = rwkv_jax.load(path, dtype="float32", kernels="xla")
    states = {k: m.init_state(B) for k, m in models.items()}
    logits = {k: [] for k in models}
    rng = np.random.default_rng(B * 100 + T)
    for t in (T, 1, 1, 1):
        tokens = rng.integers(0, config.vocab_size, (B, t))
        for k, m in models.items():
            out, states[k] = m.forward(tokens, states[k])
            logits[k].append(_host(out))
    rows = []
    for a, b in [(a, b) for i, a in enumerate(models) for b in list(models)[i + 1:]]:
        d = {"logits": diff(logits[a], logits[b]), "state": diff(map(_host, states[a]), map(_host, states[b]))}
        rows.append({"kernels": a, "reference": b, **d, "ok": all(within(x, TOL) for x in d.values())})
    return {"pairs": rows, "ok": all(r["ok"] for r in rows)}


def _host(x) -> np.ndarray:
    """A torch tensor (any device) or a JAX array as a host numpy array."""
    return x.detach().cpu().numpy() if hasattr(x, "detach") else np.asarray(x)


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
    nbytes, flops = step_bytes_and_flops(model.config, params_bytes, jnp.dtype(model.dtype).itemsize, B, T)
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
    step samples in straight-line code (rwkv_jax.kernels.sampler_form): both cost
    the same, the difference between them is noise."""
    from rwkv7_core.sampling import SamplingParams

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


def decode_items(smoke: bool, fused: str, pallas: str, xla: str) -> list:
    """("forward" | "engine", kernels, B) in priority order: the expensive XLA compiles last.
    The engine step runs the fused kernels (--smoke: xla; interpreted, the fused step takes
    ~10 s to compile and its time means nothing)."""
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


def model_items(smoke: bool, fused: str, pallas: str, xla: str) -> list:
    """(model name, kernels, B, T) beyond the decode section, in priority order."""
    if smoke:  # a shape the parity section compiled: the code path, no compile
        return [("tiny", xla, 1, 1)]
    items = [("2.9b", k, 1, 1) for k in (fused, pallas, xla)]
    items += [("1.5b", k, 1, PREFILL_T) for k in (pallas, xla)]
    items += [("2.9b", k, 256, 1) for k in (fused, pallas, xla)]
    items += [("2.9b", k, 1, PREFILL_T) for k in (pallas, xla)]
    return items + [(name, k, B, 1) for name in ("1.5b", "2.9b") for B in (2, 4, 8, 16, 32, 64, 128)
                    for k in (fused, pallas, xla) if (name, B) not in {("1.5b", b) for b in DECODE_BATCHES}]


def run_models(smoke: bool, interpret: bool, roofline: dict, budget: Budget, clock: CompileClock):
    """Decode/prefill rows of model_items while the budget lasts; yields after each item."""
    out = {"rows": []}
    for name, kernels, B, T in model_items(smoke, *kernel_names(interpret)):
        out["rows"].append(model_row(name, kernels, B, T, smoke, roofline, budget, clock))
        yield out


# ----------------------------------------------------------------------------- prefill
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
    from rwkv_jax.forward import varlen_forward_fn
    from rwkv_jax.varlen import segments_from_lengths
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


def _prefill_lines(p: dict) -> list:
    lines = ["| kind | B (prompts) | T (tokens) | tok/s | step ms | binds | roofline fraction | "
             "FLOPs / 989 TFLOP/s spec |", "|---|---|---|---|---|---|---|---|"]
    for r in p.get("rows", []):
        head = f"| {r['kind']} | {r['B']} | {r['T']} |"
        if "tok_s" not in r:
            lines.append(f"{head} {r.get('skipped') or r.get('error', '')} | | | | |")
            continue
        lines.append(f"{head} {r['tok_s']:,.0f} | {r['step_ms']:.2f} | {r['binding']} | "
                     f"{r['roofline_fraction']:.2f} | {r['spec_compute_fraction']:.2f} |")
    return lines


# ----------------------------------------------------------------------------- quantized decode
QUANTIZED_BUDGET_S = 60       # quantized rows stop starting after this long
QUANTIZED_SCHEMES = ("int8", "int4", "fp8")  # in this order: a cold run reaches 1.5b B=1 int8 and int4
Q_STD = {"int8": 40.0, "fp8": 64.0, "int4": 4.6}  # spread of the drawn values (int8 within +-127; int4:
# uniform random bytes, each nibble uniform in -8..7)
# Compile seconds of the quantized 1.5b decode step (kernels named "<kernels> <scheme>"): the
# bf16 step's recorded ones plus ~20 % (deviceless, at load ~10: int8 102 s, fp8 127 s against
# 110 s for bf16 with pallas-fused; benchmarks/quant_decode_kernels.py).
QUANTIZED_RECORDED_COMPILE_S = {
    ("1.5b", "pallas-fused int8", 1, 1): 16.0, ("1.5b", "pallas-fused fp8", 1, 1): 16.0,
    ("1.5b", "pallas int8", 1, 1): 16.0, ("1.5b", "pallas fp8", 1, 1): 16.0,
    ("1.5b", "pallas-fused int4", 1, 1): 16.0, ("1.5b", "pallas int4", 1, 1): 16.0,
}
RECORDED_COMPILE_S.update(QUANTIZED_RECORDED_COMPILE_S)


def quantized_items(smoke: bool, fused: str, pallas: str) -> list:
    """(model, kernels, scheme, B) in priority order: 1.5b B=1, 2.9b B=1, the other decode
    buckets, then the unfused Pallas kernels at B=1. --smoke: the tiny model on xla (the code
    path; the interpreted kernels are checked by the tests)."""
    if smoke:
        return [("tiny", "xla", "int8", 1)]
    items = [(name, fused, q, 1) for name in ("1.5b", "2.9b") for q in QUANTIZED_SCHEMES]
    items += [(name, fused, q, B) for name in ("1.5b", "2.9b") for B in (8, 32, 256, 2, 4, 16, 64, 128)
              for q in QUANTIZED_SCHEMES]
    return items + [(name, pallas, q, 1) for name in ("1.5b", "2.9b") for q in QUANTIZED_SCHEMES]


def _draw_quantized(struct: dict, plain, key):
    """params_struct's tree with every quantized weight drawn (q: normal x Q_STD rounded into the
    scheme's type; scales 1 / (Q_STD sqrt(in)), so the weights are ~N(0, 1/in) as the plain
    ones) and every other leaf taken from the plain random params."""
    if isinstance(struct, dict) and set(struct) == {"q", "scale"}:
        q, width = struct["q"], struct["q"].shape[1]
        scheme = {jnp.dtype(jnp.int8): "int8", jnp.dtype(jnp.uint8): "int4"}.get(q.dtype, "fp8")
        values = Q_STD[scheme] * jax.random.normal(key, q.shape)
        values = jnp.clip(jnp.round(values), -127, 127) if scheme == "int8" else values
        if scheme == "int4":  # packed: two values a byte, twice the width
            values, width = jax.random.randint(key, q.shape, 0, 256), 2 * width
        return {"q": values.astype(q.dtype),
                "scale": jnp.full(struct["scale"].shape, 1 / (Q_STD[scheme] * math.sqrt(width)), jnp.float32)}
    if isinstance(struct, dict):
        return {k: _draw_quantized(v, plain[k], jax.random.fold_in(key, i)) for i, (k, v) in enumerate(struct.items())}
    return plain


@functools.lru_cache(maxsize=None)
def quantized_params_for(config: ModelConfig, dtype, scheme: str) -> dict:
    """Random params of a config with its large projections drawn quantized (`scheme`, the
    library's default int8 group), on the default device; made once per run."""
    struct = params_struct(config, dtype, spec_for(scheme))
    return block(_draw_quantized(struct, params_for(config, dtype), jax.random.key(1)))


def measure_quantized(config: ModelConfig, dtype, kernels: str, scheme: str, B: int, smoke: bool, roofline) -> dict:
    """measure_model of a random model with `scheme` weights, and its params' bytes."""
    params = quantized_params_for(config, dtype, scheme)
    model = Model(params, config, dtype, kernels)
    return {**measure_model(model, B, 1, smoke, roofline), "params_bytes": sum(x.nbytes for x in jax.tree.leaves(params))}


def quantized_row(name, kernels, scheme, B, smoke, roofline, budget, clock) -> dict:
    """One quantized decode row (measure_model: tok/s and the roofline fractions of the step's
    bytes, the quantized weights' bytes), or why it was skipped."""
    label = f"{kernels} {scheme}"
    row = {"model": name, "kernels": kernels, "quantization": scheme, "B": B, "T": 1}
    reason = budget.shortfall(clock.estimate(name, label, B, 1) + 5)
    if reason:
        return {**row, "skipped": reason}
    dtype = jnp.float32 if smoke else jnp.bfloat16
    attempt(row, measure_quantized, named_config(name), dtype, kernels, scheme, B, smoke, roofline)
    if "compile_s" in row:
        clock.measured(name, label, B, 1, row["compile_s"])
    return row


def quantized_weight(seed: int, out: int, width: int, scheme: str) -> QuantizedWeight:
    """A random [out, width] weight quantized by rwkv7_core.quantization (library default group)."""
    w = np.random.default_rng(seed).standard_normal((out, width), np.float32) / math.sqrt(width)
    q, scale = quantize(w, spec_for(scheme))
    return QuantizedWeight(jnp.asarray(q), jnp.asarray(scale))


def quantized_parity(interpret: bool, smoke: bool) -> list:
    """The quantized kernels on the device against their plain-jnp references: rows of
    kernel_parity (float32 activations; 2.9b widths, tiny in --smoke)."""
    C, F = (128, 512) if smoke else (2560, 10240)
    p = functools.partial
    linear = p(quantized_linear.quantized_linear, out_dtype=jnp.float32, interpret=interpret)
    reference = p(quantized_linear.quantized_linear_reference, out_dtype=jnp.float32)
    mix = p(quantized_channel_mix.quantized_channel_mix, interpret=interpret)
    fused = lambda *a: fused_channel_mix(*a, skip=True, interpret=interpret).total()  # noqa: E731
    x = lambda seed, M, K: jax.random.normal(jax.random.key(seed), (M, K))  # noqa: E731
    cases = [("quantized_linear int8 M=1", linear, reference, (x(1, 1, F), quantized_weight(1, C, F, "int8")))]
    if not smoke:
        cases += [("quantized_linear fp8 M=8", linear, reference, (x(2, 8, C), quantized_weight(2, F, C, "fp8"))),
                  ("quantized_linear int8 M=16 skip", p(linear, skip=True), reference,
                   (jnp.maximum(x(3, 16, F), 0), quantized_weight(3, C, F, "int8"))),
                  ("quantized_linear int4 M=1 skip", p(linear, skip=True), reference,
                   (jnp.maximum(x(6, 1, F), 0), quantized_weight(6, C, F, "int4")))]
        for scheme, M in (("int8", 1), ("fp8", 4)):
            args = (x(4, M, C), quantized_weight(4, F, C, scheme), quantized_weight(5, C, F, scheme))
            cases += [(f"quantized_channel_mix {scheme} M={M}", mix,
                       quantized_channel_mix.quantized_channel_mix_reference, args),
                      (f"fused channel-mix {scheme} M={M}", fused,
                       quantized_channel_mix.quantized_channel_mix_reference, args)]
    with jax.default_matmul_precision("highest"):
        return [attempt({"case": label}, kernel_parity, fn, ref, args, 1e-4) for label, fn, ref, args in cases]


def run_quantized(smoke: bool, interpret: bool, roofline: dict, budget: Budget, clock: CompileClock):
    """The quantized kernels' device parity, then the decode rows (quantized_items) within
    QUANTIZED_BUDGET_S; yields after each."""
    fused, pallas, _ = kernel_names(interpret)
    limit, out = budget.capped(QUANTIZED_BUDGET_S), {"rows": []}
    out["parity"] = quantized_parity(interpret, smoke)
    yield out
    for name, kernels, scheme, B in quantized_items(smoke, fused, pallas):
        out["rows"].append(quantized_row(name, kernels, scheme, B, smoke, roofline, limit, clock))
        yield out


def _quantized_lines(p: dict) -> list:
    lines = [f"- parity {r['case']}: {_status(r) or format(r['max_abs_err'], '.2e')} (ok {r.get('ok')})"
             for r in p.get("parity", [])] + ["", "| model | kernels | weights | B | tok/s | step ms | HBM roofline fraction (quantized bytes) | "
             "params GB | compile s |", "|---|---|---|---|---|---|---|---|---|"]
    for r in p.get("rows", []):
        head = f"| {r['model']} | {r['kernels']} | {r['quantization']} | {r['B']} |"
        lines.append(f"{head} {_status(r)} | | | | |" if _status(r) else
                     f"{head} {r['tok_s']:,.0f} | {r['step_ms']:.3f} | {r['hbm_roofline_fraction']:.2f} | "
                     f"{r['params_bytes'] / 1e9:.2f} | {r['compile_s']:.1f} |")
    return lines


# ----------------------------------------------------------------------------- kernels
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


# ----------------------------------------------------------------------------- deviceless
def run_deviceless(smoke: bool, budget: Budget) -> dict:
    """Deviceless H200 compile of a tiny forward (B=2, T=1), serialized; on a GPU also loaded
    and run against the same forward compiled on the device (exact equality expected: both
    are XLA:GPU compiles of one program for sm_90; any other GPU records a load error)."""
    reason = budget.shortfall(DEVICELESS_S)
    if reason:
        return skipped(reason)
    from rwkv_jax import deviceless

    config, B = named_config("tiny"), 2
    target = deviceless.load_target("h200")
    kernels = "xla" if smoke else "pallas"
    engine = deviceless.abstract_engine(config, "float32", kernels, target)
    t0 = time.perf_counter()
    compiled = engine.lower(("forward", (B, 1, False))).compile()
    blob = deviceless.serialize(compiled)
    out = {"target": target.device, "kernels": kernels, "compile_s": time.perf_counter() - t0,
           "serialized_bytes": len(blob)}
    if smoke:
        return {**out, "loaded": False, "ok": True, "note": "loading needs a GPU"}
    local = Model(params_for(config, jnp.float32), config, jnp.float32, kernels)  # default precision
    tokens = jax.random.randint(jax.random.key(5), (B, 1), 0, config.vocab_size)
    want = block(executables_for(local).get(("forward", (B, 1, False)))(local.params, tokens, local.init_state(B)))
    got = block(deviceless.deserialize(blob)(local.params, tokens, local.init_state(B)))
    d = diff(jax.tree.leaves(got), jax.tree.leaves(want))
    return {**out, "loaded": True, "max_abs_diff": d["max_abs_err"], "ok": d["max_abs_err"] == 0.0}


# ----------------------------------------------------------------------------- serving
def run_serving(smoke: bool, out_dir: str, budget: Budget) -> dict:
    """rwkv7_apps.serving_bench.gpu_check_section(out_dir, budget_s) within the budget."""
    hook = getattr(importlib.import_module("rwkv7_apps.serving_bench"), "gpu_check_section", None)
    if hook is None:
        return skipped("rwkv7_apps.serving_bench has no gpu_check_section(out_dir, budget_s)")
    reason = "not run in --smoke" if smoke else budget.shortfall(SECTION_MIN_S)
    return skipped(reason) if reason else hook(out_dir=out_dir, budget_s=min(SERVING_BUDGET_S, budget.left()))


def run_http_serving(smoke: bool, out_dir: str, budget: Budget) -> dict:
    """benchmarks/http_serving.py's short GPU run (rwkv7-serve vs in-process scheduler on the
    same workload) within the budget."""
    reason = "not run in --smoke" if smoke else budget.shortfall(SECTION_MIN_S)
    if reason:
        return skipped(reason)
    module = importlib.import_module("benchmarks.http_serving")
    return module.gpu_check_section(out_dir, min(HTTP_BUDGET_S, budget.left()))


def run_data_parallel(smoke: bool, budget: Budget) -> dict:
    """Batch-generation throughput (0.1b shape, bf16) on one GPU vs a replica on every local
    GPU (rwkv7_apps.replicas), same workload per GPU; skipped unless several devices."""
    devices = jax.local_devices()
    if smoke or len(devices) < 2:
        return skipped(f"{len(devices)} local device(s); needs 2 or more")
    reason = budget.shortfall(SECTION_MIN_S)
    if reason:
        return skipped(reason)
    from rwkv7_apps.engines import load_engines
    from rwkv7_apps.replicas import build_replica_set
    from scheduler import Request, SamplingParams, Scheduler, SchedulerConfig

    with tempfile.TemporaryDirectory() as d:
        path = FsPath(d) / "model.safetensors"
        write_random_checkpoint(path, named_config("0.1b"), seed=0)
        engines = load_engines("jax", path, "bfloat16", "auto", list(range(len(devices))))
    config = SchedulerConfig(max_batch=128, precompile=True)
    rng = np.random.default_rng(0)
    rows = {}
    for label, n in (("1 device", 1), (f"{len(devices)} devices", len(devices))):
        sched = (Scheduler(engines[0], config) if n == 1
                 else build_replica_set(engines, [str(x) for x in devices], config))
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
    return {"runs": rows, "scaling_efficiency": every / (len(devices) * one)}


# ----------------------------------------------------------------------------- summary
def measured_rows(sections: dict) -> list:
    """Every decode/models row with a measurement."""
    return [r for s in ("decode", "models") for r in sections.get(s, {}).get("rows", []) if "tok_s" in r]


def goals(rows: list) -> dict:
    """The issue's speed goals, evaluated on the measured rows (None where not measured); the
    Pallas side is the faster of "pallas" and "pallas-fused"."""
    got = {(r["model"], r["kernels"], r["B"], r["T"]): r for r in rows}
    out = {}
    for name in ("1.5b", "2.9b"):
        p = max((got[k] for k in ((name, "pallas", 1, 1), (name, "pallas-fused", 1, 1)) if k in got),
                key=lambda r: r["tok_s"], default=None)
        x = got.get((name, "xla", 1, 1))
        out[f"{name} best pallas/xla at B=1 >= {GOALS['pallas_over_xla_b1']}"] = (
            None if not (p and x) else p["tok_s"] / x["tok_s"])
        out[f"{name} best pallas B=1 HBM roofline fraction >= {GOALS['b1_hbm_roofline_fraction']}"] = (
            None if not p else p["hbm_roofline_fraction"])
    best = [r["tok_s"] for k, r in got.items() if k[0] == "2.9b" and k[2] == 256 and k[3] == 1]
    out[f"2.9b B=256 tok/s >= {GOALS['2.9b_b256_tok_s']}"] = max(best) if best else None
    return out


def per_launch_us(rows: list) -> dict:
    """{B: (step_pallas - step_fused) / (launches_pallas - launches_fused)} in us (issue 15)."""
    got = {(r["kernels"].removesuffix("-interpret"), r["B"]): r for r in rows if r["T"] == 1}
    out = {}
    for (kernels, B), fused in got.items():
        pallas = got.get(("pallas", B))
        if kernels == "pallas-fused" and pallas and pallas["launches"] > fused["launches"]:
            out[B] = (pallas["step_ms"] - fused["step_ms"]) * 1e3 / (pallas["launches"] - fused["launches"])
    return out


ESTIMATES = FsPath(__file__).resolve().parent / "results" / "gpu_compile_h200.json"


@functools.lru_cache(maxsize=None)
def paper_estimates() -> dict:
    """{(shape, kernels, B, T): estimate} of the compiled rows of ESTIMATES ({} without it)."""
    if not ESTIMATES.exists():
        return {}
    return {(r["shape"], r["kernels_option"], r["B"], r["T"]): r["estimate"]
            for r in json.loads(ESTIMATES.read_text())["rows"] if r.get("ok")}


def estimate_check(rows: list) -> list:
    """Measured decode rows beside the deviceless paper estimate for the same bucket."""
    out = []
    for r in rows:
        est = paper_estimates().get((r["model"], r["kernels"], r["B"], r["T"]))
        if est:
            ratio = r["step_ms"] * 1e3 / est["step_us"]
            out.append({"model": r["model"], "kernels": r["kernels"], "B": r["B"], "T": r["T"],
                        "measured_us": r["step_ms"] * 1e3, "estimated_us": est["step_us"],
                        "measured_over_estimate": ratio, "held_within_2x": 0.5 <= ratio <= 2.0})
    return out


def summary(sections: dict) -> dict:
    """Goals, per-launch cost and paper-estimate check from the rows measured so far."""
    rows = measured_rows(sections)
    return {"goals": goals(rows), "per_launch_us": per_launch_us(rows), "estimate_check": estimate_check(rows)}


# ----------------------------------------------------------------------------- report
def environment() -> dict:
    versions = {"python": platform.python_version(), "jax": jax.__version__, "numpy": np.__version__}
    for dist in ("jaxlib", "flax", "torch", "triton"):  # not imported: torch stays out of this process
        try:
            versions[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:  # optional on the machine; record its absence
            versions[dist] = None
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


def _diff_cell(r: dict) -> str:
    return _status(r) or f"logits {r['logits']['max_abs_err']:.1e}, state {r['state']['max_abs_err']:.1e}"


def _parity_lines(p: dict) -> list:
    lines = ["| case | error vs reference | ok |", "|---|---|---|"]
    for r in p.get("kernels", []):
        lines.append(f"| {r['case']} | {_status(r) or format(r['max_abs_err'], '.2e')} | {r.get('ok')} |")
    for r in p.get("sparse", []):
        err = _status(r) or f"rel {r['rel_err']:.1e}, bit-identical {r['bit_identical']}"
        lines.append(f"| sparse {r['zero_fraction']:.0%} zeros M={r['rows']} | {err} | {r.get('ok')} |")
    for r in p.get("models", []):
        lines.append(f"| model {r['config']} B={r['B']} T={r['T']} {r['kernels']} vs {r['reference']} | "
                     f"{_diff_cell(r)} | {r.get('ok')} |")
    return lines


def _torch_lines(p: dict) -> list:
    lines = [f"torch device {p.get('device')}, Triton {p.get('triton')}, JAX {p.get('jax')}", "",
             "| case | pair | error | ok |", "|---|---|---|---|"]
    for c in p.get("cases", []):
        case = f"{c['config']} B={c['B']} T={c['T']}"
        lines += [f"| {case} | {_status(c)} | | False |"] if _status(c) else [
            f"| {case} | {r['kernels']} vs {r['reference']} | {_diff_cell(r)} | {r['ok']} |" for r in c["pairs"]]
    return lines


def _rows_lines(rows: list) -> list:
    lines = ["| model | kernels | B | T | tok/s | step ms | roofline fraction (HBM / compute) | launches | "
             "compile s |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        head = f"| {r['model']} | {r['kernels']} | {r['B']} | {r['T']} |"
        if _status(r):
            lines.append(f"{head} {_status(r)} | | | | |")
            continue
        lines.append(f"{head} {r['tok_s']:,.0f} | {r['step_ms']:.3f} | {r['hbm_roofline_fraction']:.2f} / "
                     f"{r['compute_roofline_fraction']:.2f} | {r['launches']} | {r['compile_s']:.1f} |")
    return lines


def _engine_lines(rows: list) -> list:
    def cell(r):
        return _status(r) or (f"greedy {r['engine_step_greedy_ms']:.3f}, sampled {r['engine_step_sampled_ms']:.3f}, "
                              f"compile {r['engine_compile_s']:.1f} s")
    return ["", "Engine's whole decode step (forward + sampling), ms:", ""] + [
        f"- {r['kernels']} B={r['B']}: {cell(r)}" for r in rows]


def _kernel_lines(p: dict) -> list:
    lines = ["| case | pallas | xla | xla/pallas |", "|---|---|---|---|"]
    for r in p.get("rows", []):
        if "pallas_us" not in r:
            lines.append(f"| {r['case']} | {_status(r)} | | |")
            continue
        extra = (f" (value product: sparse {r['value_sparse_us']:.1f} vs dense {r['value_dense_xla_us']:.1f}, "
                 f"active {r['active_fraction']:.0%})" if "value_sparse_us" in r else "")
        lines.append(f"| {r['case']}{extra} | {r['pallas_us']:.1f} | {r['xla_us']:.1f} | {r['speedup']:.2f} |")
    return lines + ["", f"Measured sparse channel-mix threshold (largest M where the sparse value product "
                        f"wins): {p.get('measured_sparse_max_rows')}"]


def markdown(results: dict) -> str:
    env, sections = results["environment"], results["sections"]
    lines = [f"# GPU check — {env['date_utc']}", "",
             f"devices: {', '.join(env['devices'])}; versions: "
             + ", ".join(f"{k} {v}" for k, v in env["versions"].items()), "",
             "| section | status | seconds | reason |", "|---|---|---|---|"]
    lines += [f"| {name} | {p['status']} | {p.get('seconds', '')} | {p.get('reason') or p.get('error', '')} |"
              for name, p in sections.items()]
    tables = {"parity": _parity_lines, "torch_parity": _torch_lines, "kernels": _kernel_lines,
              "decode": lambda p: _rows_lines(p.get("rows", [])) + _engine_lines(p.get("engine", [])),
              "models": lambda p: _rows_lines(p.get("rows", [])), "prefill": _prefill_lines,
              "quantized": _quantized_lines}
    for name, p in sections.items():
        if p["status"] == "skipped":  # the table above says why
            continue
        lines += ["", f"## {name}: {p['status']}", ""]
        if name == "roofline" and "copy_GBps" in p:
            lines.append(f"copy {p['copy_GBps']:.4g} GB/s, bf16 matmul {p['bf16_matmul_TFLOPs']:.4g} TFLOP/s")
        elif name in tables:
            lines += tables[name](p)
        else:
            lines += ["```", json.dumps(p, indent=1, default=str)[:4000], "```"]
    s = results["summary"]
    lines += ["", "## Goals", ""] + [f"- {k}: {'not measured' if v is None else f'{v:.3g}'}"
                                    for k, v in s["goals"].items()]
    lines += [f"- per launch (pallas vs pallas-fused) at B={B}: {us:.2f} us" for B, us in s["per_launch_us"].items()]
    lines += [f"- estimate {r['model']} {r['kernels']} B={r['B']} T={r['T']}: measured {r['measured_us']:.0f} us vs "
              f"estimated {r['estimated_us']:.0f} us (x{r['measured_over_estimate']:.2f})" for r in s["estimate_check"]]
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------- main
def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description="First GPU run: kernel parity, decode speed, the rest (issue 4)")
    ap.add_argument("--out", default="benchmarks/results/", help="directory for gpu_check.json/.md")
    ap.add_argument("--smoke", action="store_true", help="CPU run with tiny shapes and interpret-mode kernels")
    ap.add_argument("--cache-dir", default=None,
                    help="persistent JAX compilation cache (a rerun on the same machine skips compiles)")
    ap.add_argument("--torch-parity", action="store_true",
                    help="only the torch parity, printed as JSON (the child process of that section)")
    args = ap.parse_args(argv)
    if args.torch_parity:
        print(json.dumps(run_torch_parity(args.smoke), default=str))
        return {}
    if not args.smoke and jax.default_backend() != "gpu":
        raise SystemExit(f"gpu_check needs a GPU (backend is {jax.default_backend()!r}); use --smoke on a CPU")
    child = start_torch_parity(args.smoke)  # runs beside the JAX parity
    budget = Budget(float("inf") if args.smoke else TOTAL_BUDGET_S, START)  # --smoke: CI load must not skip pieces
    if args.cache_dir:
        rwkv_jax.enable_compilation_cache(args.cache_dir)
    out_dir = FsPath(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    interpret, clock = args.smoke, CompileClock()
    report = Report(out_dir, {"environment": environment(), "smoke": args.smoke, "interpret": interpret,
                              "budget_s": None if args.smoke else TOTAL_BUDGET_S})
    report.section("parity", run_parity, args.smoke, interpret, budget)
    report.section("torch_parity", collect_torch_parity, child, min(TORCH_WAIT_S, budget.left()))
    roofline = report.section("roofline", run_roofline, args.smoke)
    report.section("decode", run_decode, args.smoke, interpret, roofline, budget, clock)
    report.section("deviceless", run_deviceless, args.smoke, budget)
    report.section("quantized", run_quantized, args.smoke, interpret, roofline, budget, clock)
    report.section("prefill", run_prefill, args.smoke, interpret, roofline, budget, clock)
    report.section("models", run_models, args.smoke, interpret, roofline, budget, clock)
    report.section("kernels", run_kernel_times, args.smoke, interpret, budget)
    report.section("serving", run_serving, args.smoke, str(out_dir), budget)
    report.section("http_serving", run_http_serving, args.smoke, str(out_dir), budget)
    report.section("data_parallel", run_data_parallel, args.smoke, budget)
    report.results["elapsed_s"] = time.perf_counter() - START
    report.save()
    print((out_dir / "gpu_check.md").read_text())
    return report.results


if __name__ == "__main__":
    main()
