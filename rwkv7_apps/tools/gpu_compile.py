"""``rwkv7-gpu-compile``: compile the engine's executables for an H200 (or another described
GPU) on a machine without one, and report what was built.

    rwkv7-gpu-compile (--model PATH | --shape NAME) [--dtype bfloat16|float16|float32]
        [--kernels pallas,pallas-fused,mosaic,xla] [--buckets 1x1,2x1,...,256x1,1x256]
        [--target h200|h100|FILE.txtpb] [--json OUT] [--plugin-dir DIR] [--pallas-only-ptxas] [--strict]

Buckets: ``BxT`` with T=1 is the decode step with sampling, B=1 and T>1 a prefill piece,
otherwise the forward over B x T tokens; ``varlen:T`` and ``mixed:BxT`` the varlen prefill and
mixed step. Prints one line per bucket (launches and device copies per run, the Pallas
kernels' worst registers / spills / shared memory) and the Pallas kernels' resources, for
each kernels option given (with ``mosaic``, also which lowering runs each decode op and why,
``rwkv_jax.mosaic_ops.MOSAIC_TABLE``); exits 0 only if every bucket compiled (1 otherwise, 2 for bad
options); ``--strict`` also fails on a resource problem (spill, shared memory over the limit)
or when ptxas could not report registers. Needs a CUDA plugin of the installed jax (cuda12 or
cuda13, see rwkv_jax.deviceless; the header names the one used and the ptxas);
JAX_PLATFORMS defaults to cpu.
"""
from __future__ import annotations

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")  # before jax is imported: the CPU stays the default backend

import argparse  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402

import jax  # noqa: E402

from rwkv7_core.checkpoint import read_checkpoint  # noqa: E402
from rwkv7_core.config import NAMED_CONFIGS, named_config  # noqa: E402
from rwkv_jax import deviceless  # noqa: E402
from rwkv_jax.gpu_dump import ptxas  # noqa: E402
from rwkv_jax.kernels import Kernels  # noqa: E402

KERNELS = tuple(k.value for k in Kernels if k is not Kernels.AUTO and not k.interpreted)
"""The kernel sets that compile for a GPU."""
DECODE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
DEFAULT_BUCKETS = ",".join([f"{b}x1" for b in DECODE_BUCKETS] + ["1x256"])
PALLAS_PREFIX = "rwkv7"


def parse_args(argv):
    p = argparse.ArgumentParser(prog="rwkv7-gpu-compile", description=__doc__.split("\n\n")[0])
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--model", help="checkpoint (.pth, .safetensors or an HF model directory): its shapes are used")
    src.add_argument("--shape", choices=sorted(NAMED_CONFIGS), help="a named shape (no weights are made)")
    p.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    p.add_argument("--kernels", default="pallas", help=f"comma-separated, of {', '.join(KERNELS)} (default pallas)")
    p.add_argument("--buckets", default=DEFAULT_BUCKETS, help=f"comma-separated (default {DEFAULT_BUCKETS})")
    p.add_argument("--target", default="h200", help="bundled target name (h200, h100) or a GpuTargetConfig .txtpb")
    p.add_argument("--json", help="write the results here")
    p.add_argument("--plugin-dir", help="directory holding the jax CUDA plugin (else $RWKV7_CUDA_PLUGIN_DIR)")
    p.add_argument("--pallas-only-ptxas", action="store_true",
                   help="run ptxas on the Pallas kernels only (faster; XLA's kernels get no registers)")
    p.add_argument("--strict", action="store_true",
                   help="exit 1 on any resource problem or when ptxas reported no registers")
    args = p.parse_args(argv)
    args.kernels = [k.strip() for k in args.kernels.split(",") if k.strip()]
    unknown = sorted(set(args.kernels) - set(KERNELS))
    if unknown or not args.kernels:
        p.error(f"--kernels: unknown {unknown or 'empty'}; choose from {', '.join(KERNELS)}")
    return args


def pallas_rows(result) -> list:
    return [k for k in (result.report.kernels if result.report else []) if k.name.startswith(PALLAS_PREFIX)]


def bucket_line(result) -> str:
    b = result.bucket
    head = f"{b.label():>12} {b.kind:>7} {b.path:>14}"
    if not result.ok:
        return f"{head}  FAILED after {result.compile_s:.1f}s: {result.error[:300]}"
    s = result.report.summary()
    pallas = pallas_rows(result)
    regs = max((k.registers or 0 for k in pallas), default=0)
    spills = sum(k.spill_bytes or 0 for k in pallas)
    smem = max((k.shared_bytes for k in result.report.kernels), default=0)
    return (f"{head} {result.compile_s:8.1f} {s['launches']:8d} {s['copies']:6d} {s['copy_bytes'] / 1e6:9.2f} "
            f"{sum(k.launches for k in pallas):7d} {regs:5d} {spills:7d} {smem:8d}")


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        buckets = [deviceless.Bucket.parse(b) for b in args.buckets.split(",") if b.strip()]
        target = deviceless.load_target(args.target)
        config = _model_config(args)
        if args.json and not os.access(os.path.dirname(os.path.abspath(args.json)), os.W_OK):
            raise ValueError(f"--json {args.json}: directory not writable")
        engines = {k: deviceless.abstract_engine(config, args.dtype, k, target, args.plugin_dir) for k in args.kernels}
    except (ValueError, RuntimeError) as e:
        print(f"rwkv7-gpu-compile: {e}", file=sys.stderr)
        return 2
    tools = _tool_versions()
    print(f"{target.device} ({target.arch}, {target.sm_count} SMs, {target.shared_memory_optin} B opt-in shared "
          f"memory); {args.model or args.shape} {args.dtype}; "
          + "; ".join(f"{k} {v}" for k, v in tools.items()))
    results, problems = _compile_all(engines, buckets, target, args.pallas_only_ptxas)
    print("\nPallas kernels per bucket (registers and spills per thread, shared memory per block):")
    for kernels, r in results:
        for k in pallas_rows(r):
            print(f"  {kernels:>12} {r.bucket.label():>8} {k.name:32} x{k.launches:<4} grid {tuple(k.grid)} threads "
                  f"{k.threads[0] if k.threads else '-'} regs {k.registers} spill {k.spill_bytes} B shared {k.shared_bytes} B")
    table = _mosaic_table() if "mosaic" in args.kernels else None
    for row in table or []:
        print(f"  mosaic op {row['op']}: {row['compiled']} (interpret: {row['interpreted']}): {row['reason']}")
    for p in problems:
        print(f"WARNING {p}")
    failed = [f"{kernels} {r.bucket.label()}" for kernels, r in results if not r.ok]
    print(f"\n{len(results) - len(failed)}/{len(results)} buckets compiled" + (f"; FAILED: {failed}" if failed else "")
          + (f"; {len(problems)} resource problems" if problems else ""))
    if args.json:
        doc = {"target": target.name, "device": target.device, **tools,
               "model": args.model or args.shape, "dtype": args.dtype, "kernels": args.kernels,
               "resource_problems": problems, "mosaic_table": table,
               "buckets": [{"kernels": kernels, **r.as_dict()} for kernels, r in results]}
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1)
    return 1 if failed or (args.strict and problems) else 0


def _mosaic_table() -> list[dict]:
    """``rwkv_jax.mosaic_ops.MOSAIC_TABLE`` as dicts."""
    from rwkv_jax.mosaic_ops import MOSAIC_TABLE  # lazy: loads Mosaic GPU (jax >= 0.11), only for --kernels mosaic
    return [{"op": c.op, "compiled": c.compiled.value, "interpreted": c.interpreted.value, "reason": c.reason}
            for c in MOSAIC_TABLE]


def _model_config(args: argparse.Namespace):
    """The ModelConfig of --model (its checkpoint's) or else of --shape."""
    if not args.model:
        return named_config(args.shape)
    if not (os.path.isfile(args.model) or os.path.isdir(args.model)):
        raise ValueError(f"--model {args.model}: no such file or model directory")
    return read_checkpoint(args.model)[1]


def _tool_versions() -> dict:
    """{"jax_version", "cuda_plugin", "ptxas"} of this compile."""
    found = ptxas()
    return {"jax_version": jax.__version__, "cuda_plugin": deviceless.cuda_plugin(),
            "ptxas": f"{found[1][0]}.{found[1][1]} ({found[0]})" if found else None}


def _compile_all(engines: dict, buckets: list, target, pallas_only_ptxas: bool) -> tuple[list, list[str]]:
    """Compile every bucket for every kernel choice, printing a row each: [(kernels,
    BucketResult)] and the resource problems found (spills, ptxas errors, missing registers)."""
    results, problems = [], []
    for kernels, engine in engines.items():
        print(f"\nkernels={kernels}")
        print(f"{'bucket':>12} {'kind':>7} {'path':>14} {'compile':>8} {'launches':>8} {'copies':>6} {'copy MB':>9} "
              f"{'pallas':>7} {'regs':>5} {'spill B':>7} {'smem B':>8}")
        for bucket in buckets:
            result = deviceless.compile_bucket(engine, bucket, target,
                                               entry_prefix=PALLAS_PREFIX if pallas_only_ptxas else "")
            results.append((kernels, result))
            print(bucket_line(result), flush=True)
            label = f"{kernels} {bucket.label()}"
            problems += [f"{label} {p}" for p in deviceless.resource_problems(result.report, target, no_spill=True)]
            if result.report and result.report.ptxas_error:
                problems.append(f"{label} {result.report.ptxas_error}")
            if result.ok and any(k.registers is None for k in pallas_rows(result)):
                problems.append(f"{label}: Pallas kernels without registers (ptxas did not run)")
    return results, problems

if __name__ == "__main__":
    sys.exit(main())
