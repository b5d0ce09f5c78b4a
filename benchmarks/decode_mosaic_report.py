"""Deviceless H200 decode table of kernels="mosaic" beside "pallas-fused": the engine's whole
decode step (on-device sampling) compiled on this CPU-only machine, per batch size: launches
(per layer), copies, the Triton Pallas kernels' launches and worst registers / spills, each Mosaic
GPU kernel's registers and spills in the step and, compiled alone at the same sizes for one row
and 16 (``kernel_cases``), its shared memory (``MOSAIC_GPU_DUMP_PTXAS`` / ``MOSAIC_GPU_DUMP_TO`` via
``rwkv_jax.mosaic_resources``), and the paper estimate of the step (``decode_nodes.estimate_ms``:
max(bytes / HBM bandwidth, flops / matmul rate) + launches x per-launch cost; not a measurement).

    PYTHONPATH=. JAX_PLATFORMS=cpu RWKV7_CUDA_PLUGIN_DIR=.venv-gpu/cuda-plugin \\
        .venv-gpu/bin/python benchmarks/decode_mosaic_report.py [--shape 1.5b] [--dtype bfloat16] \\
        [--batches 1,8,32,256] [--kernel-rows 1,16] [--out benchmarks/results]

Writes <out>/decode_mosaic_report_<shape>_h200.json and .md (rewritten after every row), headed
with the date, jax, CUDA plugin and ptxas versions, and ``rwkv_jax.mosaic_ops.MOSAIC_TABLE`` (which
lowering runs each op, and why). Needs jax >= 0.11 (Pallas Mosaic GPU) and a CUDA plugin.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
from pathlib import Path as FsPath

os.environ.setdefault("JAX_PLATFORMS", "cpu")
if __package__ in (None, ""):  # run as a script from the source tree
    sys.path.insert(0, str(FsPath(__file__).resolve().parents[1]))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from benchmarks.decode_nodes import ANCHORS, estimate_ms  # noqa: E402
from pallas_kernels.segment_linear import SplitSum, padded_rows  # noqa: E402
from rwkv7_core.config import named_config  # noqa: E402
from rwkv_jax import deviceless  # noqa: E402
from rwkv_jax.gpu_dump import ptxas  # noqa: E402
from rwkv_jax.kernels import MOSAIC_MIN_JAX, jax_version  # noqa: E402

KERNELS = ("mosaic", "pallas-fused")
TRITON_PREFIX = "rwkv7"      # the Triton-lowered Pallas kernels' names in XLA's dump
MOSAIC_LAUNCH = "kCustomCall"  # a Mosaic GPU kernel's launch in XLA's thunk sequence (it has no kernel name there)


def kernel_cases(config, M: int, dtype) -> list:
    """[(fn, arg structs)]: every Mosaic kernel of the decode step once, at `config`'s sizes for
    M rows (the whole state leaves, a delta of 32 split-K partials as the sparse value
    product's at B = 1, and rows of C = 192 besides), for a kernel-level compile."""
    from pallas_kernels.mosaic import ffn_value, lora_up, segment_linear, shift_mix, wkv_tail
    SD, F32 = jax.ShapeDtypeStruct, jnp.float32
    C, H, N, F, V, L = (config.n_embd, config.n_head, config.head_size, config.dim_ffn, config.vocab_size,
                        config.n_layer)
    lora = [config.d_decay, config.d_aaa, config.d_mv, config.d_gate]
    Mp = padded_rows(M)
    n_down = 3 * C + sum(lora)
    offsets = [3 * C + sum(lora[:i]) for i in range(4)]
    return [
        (lambda h, p, s, w, b, mix: shift_mix.shift_mix(h, SplitSum(p, M, dtype), s, w, b, mix, layer=L - 1),
         (SD((M, C), dtype), SD((32, Mp, C), F32), SD((M, L, C), dtype), SD((C,), dtype), SD((C,), dtype),
          SD((6, C), dtype))),
        (lambda h, d, s, w, b, mix: shift_mix.shift_mix(h, d, s, w, b, mix),
         (SD((M, 192), dtype), SD((M, 192), dtype), SD((M, 192), dtype), SD((192,), dtype), SD((192,), dtype),
          SD((1, 192), dtype))),
        (lambda xs, *ws: segment_linear.segment_linear(xs, list(ws), [0, 2, 3, 1, 4, 3, 5]),
         (SD((6, M, C), dtype), *[SD((C, C), dtype)] * 3, *[SD((d, C), dtype) for d in lora])),
        (lambda x, w: segment_linear.segment_linear(x, [w], [0]), (SD((1, M, C), dtype), SD((V, C), dtype))),
        (lambda p, *u: lora_up.lora_up(p, list(u), offsets, "wavg", M=M, dtype=dtype),
         (SD((2, Mp, n_down), F32), *[SD((C, d), dtype) for d in lora])),
        (lambda p, lo, vecs, rk, vf, S: wkv_tail.wkv_tail(p, lo, vecs, rk, vf, S, layer=L - 1),
         (SD((2, Mp, n_down), F32), SD((4, Mp, C), dtype), SD((7, C), F32), SD((H, N), F32), SD((M, C), F32),
          SD((M, L, H, N, N), F32))),
        (lambda p, w: ffn_value.ffn_value(p, w, M=M, dtype=dtype), (SD((2, Mp, F), F32), SD((F, C), dtype))),
    ]


def compile_kernels(config, M: int, dtype, target, plugin_dir: str | None = None) -> list:
    """Every Mosaic kernel of ``kernel_cases`` compiled in one program for target: their
    ``MosaicKernel`` records, shared memory included."""
    from rwkv_jax.mosaic_resources import recorded  # Pallas Mosaic GPU: jax >= 0.11
    cases = kernel_cases(config, M, dtype)

    def program(*arg_lists):
        return [fn(*args) for (fn, _), args in zip(cases, arg_lists)]

    with recorded(files=True) as kernels:
        deviceless.compile_function(program, tuple(args for _, args in cases), target, plugin_dir=plugin_dir,
                                    ptxas=False)
    return kernels


def compile_row(config, shape: str, dtype: str, kernels: str, B: int, target) -> dict:
    """One deviceless compile of the B-row decode step: its launches, copies, kernel resources
    and estimate (an ``error`` row if it failed)."""
    from rwkv_jax.mosaic_resources import recorded, summary  # Pallas Mosaic GPU: jax >= 0.11
    engine = deviceless.abstract_engine(config, dtype, kernels, target)
    with recorded() as mosaic:
        result = deviceless.compile_bucket(engine, deviceless.Bucket("step", B, 1), target, entry_prefix=TRITON_PREFIX)
    row = {"kernels": kernels, "B": B, "config": shape, "dtype": dtype, "compile_s": round(result.compile_s, 1)}
    if not result.ok:
        return {**row, "error": result.error}
    report = result.report
    triton = [k for k in report.kernels if k.name.startswith(TRITON_PREFIX)]
    counts = report.launch_counts()
    row.update(launches=len(report.launches), launches_per_layer=round(len(report.launches) / config.n_layer, 2),
               copies=len(report.copies), copy_bytes=report.copy_bytes,
               triton_launches=sum(n for name, n in counts.items() if name.startswith(TRITON_PREFIX)),
               mosaic_launches=sum(t.kind == MOSAIC_LAUNCH for t in report.launches),
               triton_max_registers=max((k.registers or 0 for k in triton), default=0),
               triton_spill_bytes=sum(k.spill_bytes or 0 for k in triton),
               mosaic_kernels=summary(mosaic), ptxas_error=report.ptxas_error)
    row["nodes"] = row["launches"]
    row["est_step_ms"] = round(estimate_ms(row), 4)
    row["est_tok_s"] = round(B / row["est_step_ms"] * 1e3)
    return row


def markdown(doc: dict) -> str:
    """The report: the launches / estimate table, the Mosaic kernels' resources, the op table."""
    lines = [f"# Decode on Pallas Mosaic GPU vs pallas-fused, compiled for the H200 without a GPU ({doc['date']})",
             "", f"{doc['shape']} shape, {doc['dtype']}, jax {doc['jax_version']}, {doc['cuda_plugin']}, ptxas "
             f"{doc['ptxas']}; the engine's whole decode step with on-device sampling. Nothing here ran on a GPU; "
             "the estimate is a paper number (benchmarks/decode_nodes.py `estimate_ms`).", "",
             "| kernels | B | launches | launches / layer | Mosaic launches | Triton launches | copies (MB) | "
             "Triton max regs / spill B | compile s | est. step ms | est. tok/s (Albatross) |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in doc["rows"]:
        if "error" in r:
            lines.append(f"| {r['kernels']} | {r['B']} | FAILED: {r['error'][:200]} |" + " |" * 8)
            continue
        anchor = ANCHORS.get(r["B"]) if r["config"] == "1.5b" else None
        lines.append(f"| {r['kernels']} | {r['B']} | {r['launches']} | {r['launches_per_layer']:.2f} | "
                     f"{r['mosaic_launches']} | {r['triton_launches']} | {r['copies']} ({r['copy_bytes'] / 1e6:.1f}) | "
                     f"{r['triton_max_registers']} / {r['triton_spill_bytes']} | {r['compile_s']} | "
                     f"{r['est_step_ms']:.3f} | {r['est_tok_s']:,}{f' ({anchor:,})' if anchor else ''} |")
    lines += ["", "## Mosaic GPU kernels in the step (ptxas -v, sm_90a)", "",
              "| B | kernel | compiles | registers | spill B |", "|---|---|---|---|---|"]
    for r in doc["rows"]:
        for k in r.get("mosaic_kernels", []) if r["kernels"] == "mosaic" else []:
            regs = k["registers"]
            lines.append(f"| {r['B']} | {k['name']} | {k['compiles']} | {regs[0]}-{regs[1]} | {k['max_spill_bytes']} |")
    lines += ["", "## Each Mosaic kernel compiled alone at these sizes (`kernel_cases`; shared memory = scratch + "
              "static, per block)", "", "| rows | kernel | registers | spill B | shared memory B |", "|---|---|---|---|---|"]
    for M, kernels in doc["kernel_level"].items():
        lines += [f"| {M} | {k['name']} | {k['registers']} | {k['spill_bytes']} | {k['smem_bytes']} |" for k in kernels]
    lines += ["", "## Where each op runs under kernels=\"mosaic\" (rwkv_jax.mosaic_ops.MOSAIC_TABLE)", "",
              "| op | compiled | interpreted | why |", "|---|---|---|---|"]
    lines += [f"| {t['op']} | {t['compiled']} | {t['interpreted']} | {t['reason']} |" for t in doc["table"]]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shape", default="1.5b")
    ap.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    ap.add_argument("--batches", default="1,8,32,256", help="comma list of decode batch sizes")
    ap.add_argument("--kernel-rows", default="1,16",
                    help="rows of the kernel-level compiles (shared memory per kernel); empty: none")
    ap.add_argument("--out", default="benchmarks/results")
    a = ap.parse_args(argv)
    if jax_version() < MOSAIC_MIN_JAX:
        print(f"kernels=mosaic needs jax >= {MOSAIC_MIN_JAX[0]}.{MOSAIC_MIN_JAX[1]}; this is jax {jax.__version__}")
        return 2
    from rwkv_jax.mosaic_ops import MOSAIC_TABLE  # Pallas Mosaic GPU: jax >= 0.11
    config = named_config(a.shape)
    target = deviceless.load_target("h200")
    deviceless.target_device(target)  # registers the CUDA plugin (and its Mosaic runtime) now
    found = ptxas()
    doc = {"date": datetime.date.today().isoformat(), "shape": a.shape, "dtype": a.dtype, "target": target.name,
           "jax_version": jax.__version__, "cuda_plugin": deviceless.cuda_plugin(),
           "ptxas": f"{found[1][0]}.{found[1][1]}" if found else None,
           "table": [{"op": c.op, "compiled": c.compiled.value, "interpreted": c.interpreted.value, "reason": c.reason}
                     for c in MOSAIC_TABLE], "rows": []}
    dtype = jnp.dtype(a.dtype)
    doc["kernel_level"] = {str(M): [k.as_dict() for k in compile_kernels(config, M, dtype, target)]
                           for M in (int(m) for m in a.kernel_rows.split(",") if m)}
    os.makedirs(a.out, exist_ok=True)
    stem = os.path.join(a.out, f"decode_mosaic_report_{a.shape}_{target.name}")
    for B in (int(b) for b in a.batches.split(",")):
        for kernels in KERNELS:
            row = compile_row(config, a.shape, a.dtype, kernels, B, target)
            doc["rows"].append(row)
            print(json.dumps({k: v for k, v in row.items() if k != "mosaic_kernels"}), flush=True)
            with open(stem + ".json", "w") as f:
                json.dump(doc, f, indent=1)
            with open(stem + ".md", "w") as f:
                f.write(markdown(doc))
    return 1 if any("error" in r for r in doc["rows"]) else 0


if __name__ == "__main__":
    sys.exit(main())
