"""Launches per layer of the compiled H200 varlen prefill, by kind (deviceless compile, no GPU).

The varlen prefill (``rwkv_jax.forward.varlen_forward_fn``: P prompts flattened into one
stream of T tokens) is compiled for an H200 from this CPU machine twice, with the model's widths
and 2 and 3 layers; the second compile's launches minus the first's are exactly one layer's
(everything outside the layers, embedding, LN0/LN_out, head, logits gather, the final stack of
the shift state rows, is in both; 1 layer is not used: its state needs no stacking).
Each launch of that layer is classified by what it is:

- ``gemm``: a matrix product XLA hands to cuBLAS / cuBLASLt or emits as a Triton GEMM fusion;
- ``gemm_aux``: the second kernel of a split-K GEMM (the ``loop_reduce_fusion`` summing its K
  partials) or a slice of a GEMM XLA merged from two products on one input (each slice issued
  right after that GEMM), i.e. launches that exist only because of how XLA emits its GEMMs;
- ``pallas``: one of our Pallas kernels (name ``rwkv7_*``);
- ``fusion``: any other XLA kernel (elementwise, reductions, gathers: the pieces between);
- ``copy``: a device-to-device copy.

usage: JAX_PLATFORMS=cpu RWKV7_CUDA_PLUGIN_DIR=... python benchmarks/prefill_launches.py
       [--config 1.5b] [--kernels pallas] [--prompts 64] [--tokens 4096] [--ptxas]
       [--json benchmarks/results/prefill_launches_h200.json]
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import re
import sys
import tempfile
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

GEMM_KINDS = ("kGemm", "kCublasLtMatmul", "kCuDnn")


def kind_of(thunk, previous: str | None = None) -> str:
    """gemm | gemm_aux | pallas | fusion | copy for one rwkv_jax.gpu_dump.Thunk (`previous`: the
    kind of the launch issued just before it)."""
    from rwkv_jax.gpu_dump import COPIES
    name = thunk.name or ""
    if thunk.kind in COPIES or (thunk.hlo or "").startswith(("wrapped_slice", "copy")):
        return "copy"
    if thunk.kind in GEMM_KINDS or "gemm" in name or "cublas" in name or "gemm" in (thunk.hlo or ""):
        return "gemm"
    if previous == "gemm" and name.startswith(("loop_reduce_fusion", "loop_slice_fusion")):
        return "gemm_aux"
    if previous == "gemm_aux" and name.startswith("loop_slice_fusion"):  # the merged GEMM's next slice
        return "gemm_aux"
    if name.startswith("rwkv7"):
        return "pallas"
    return "fusion"


def compile_layers(config, n_layer: int, dtype, kernels: str, lengths: list[int], n_tokens: int, target,
                   ptxas: bool):
    """StepReport of the varlen prefill of `lengths` (packed from 0, padded to n_tokens) for
    `config` cut to n_layer layers; (report, compile seconds)."""
    from rwkv_jax.deviceless import dump_options, on_target, placed
    from rwkv_jax.forward import varlen_forward_fn
    from rwkv_jax.gpu_dump import step_report
    from rwkv_jax.random_params import params_struct
    from rwkv_jax.state import init_state
    cfg = config._replace(n_layer=n_layer)
    P = len(lengths)
    args = (params_struct(cfg, dtype), jax.ShapeDtypeStruct((n_tokens,), jnp.int32),
            jax.eval_shape(lambda: init_state(cfg, P, dtype)), jax.ShapeDtypeStruct((P,), jnp.int32),
            jax.ShapeDtypeStruct((P,), jnp.int32))
    jitted = jax.jit(varlen_forward_fn, static_argnames=("config", "kernels", "n_single"), donate_argnames="state")
    with tempfile.TemporaryDirectory(prefix="prefill_launches_") as dump:
        t0 = time.perf_counter()
        with on_target(target) as sharding:
            lowered = jitted.trace(*placed(args, sharding), config=cfg, kernels=kernels).lower()
        lowered.compile(dump_options(dump))
        seconds = time.perf_counter() - t0
        return step_report(dump, ptxas=ptxas, entry_prefix="rwkv7"), seconds


def layer_launches(one, two) -> list:
    """The launches (and copies) of the second report that the first lacks: one layer's, by
    multiset difference of (kind, base name) so XLA's renumbering does not matter."""
    from rwkv_jax.gpu_dump import base_name

    def keys(report):
        counts, previous = collections.Counter(), None
        for t in sorted(report.launches + report.copies, key=lambda t: t.id):
            previous = kind_of(t, previous)
            counts[previous, re.sub(r"[._]\d+$", "", base_name(t.name or t.hlo or t.kind))] += 1
        return counts

    extra = keys(two)
    extra.subtract(keys(one))
    return sorted((k, n) for k, n in extra.items() if n)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default="1.5b")
    ap.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    ap.add_argument("--kernels", default="pallas")
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=4096, help="flat stream length (prompt lengths sum to it)")
    ap.add_argument("--target", default="h200")
    ap.add_argument("--ptxas", action="store_true", help="registers / spills of the Pallas kernels")
    ap.add_argument("--json", help="write the result here")
    a = ap.parse_args(argv)
    from rwkv7_core.config import named_config
    from rwkv_jax import deviceless
    config, target = named_config(a.config), deviceless.load_target(a.target)
    dtype = {"bfloat16": jnp.bfloat16, "float16": jnp.float16, "float32": jnp.float32}[a.dtype]
    # uneven prompts with length-1 ones among them, summing to --tokens
    base = [1 + (7 * i) % (2 * a.tokens // a.prompts) for i in range(a.prompts)]
    base[-1] += a.tokens - sum(base)
    reports, seconds = {}, {}
    for n in (2, 3):
        reports[n], seconds[n] = compile_layers(config, n, dtype, a.kernels, base, a.tokens, target, a.ptxas)
        print(f"{a.config} L={n}: {len(reports[n].launches)} launches, {len(reports[n].copies)} copies, "
              f"{reports[n].while_loops} while, {reports[n].conditionals} cond, compile {seconds[n]:.1f}s", flush=True)
    per_layer = layer_launches(reports[2], reports[3])
    by_kind = collections.Counter()
    for (kind, _), n in per_layer:
        by_kind[kind] += n
    print(f"per layer: {sum(by_kind.values())} = " + ", ".join(f"{k} {v}" for k, v in sorted(by_kind.items())))
    for (kind, name), n in per_layer:
        print(f"  {kind:7s} {n:3d}  {name}")
    pallas = [k for k in reports[3].kernels if k.name.startswith("rwkv7")]
    for k in pallas:
        print(f"  pallas {k.name}: grid {k.grid} regs {k.registers} spill {k.spill_bytes} B smem {k.shared_bytes} B")
    if a.json:
        row = {"config": a.config, "dtype": a.dtype, "kernels": a.kernels, "prompts": a.prompts, "tokens": a.tokens,
               "lengths": base, "compile_s": seconds, "per_layer_total": sum(by_kind.values()),
               "per_layer_by_kind": dict(by_kind),
               "per_layer_launches": [{"kind": k, "name": n, "count": c} for (k, n), c in per_layer],
               "model_L3": reports[3].summary(), "pallas_kernels": [k.as_dict() for k in pallas]}
        json.dump(row, open(a.json, "w"), indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
