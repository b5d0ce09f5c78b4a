"""Deviceless H200 compile of the 1.5b and 2.9b shapes: per-kernel resources, launches per
step, compile seconds and a paper estimate of the decode step time.

    PYTHONPATH=. RWKV7_CUDA_PLUGIN_DIR=.venv/cuda-plugin python benchmarks/gpu_compile_report.py \
        [--shapes 1.5b,2.9b] [--kernels pallas,xla] [--buckets 1x1,...,256x1,1x1024] [--out benchmarks/results/]

Writes <out>/gpu_compile_h200.json and .md (rewritten after every bucket). The estimate is
a paper number, not a measurement: bytes one step moves (rwkv7_core.cost.step_bytes_and_flops)
over the target's memory bandwidth, plus launches x LAUNCH_US.
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import sys
from pathlib import Path as FsPath

os.environ.setdefault("JAX_PLATFORMS", "cpu")
if __package__ in (None, ""):  # run as a script from the source tree
    sys.path.insert(0, str(FsPath(__file__).resolve().parents[1]))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from rwkv7_core.config import named_config  # noqa: E402
from rwkv7_core.cost import step_bytes_and_flops  # noqa: E402
from rwkv_jax import deviceless  # noqa: E402
from rwkv_jax.model import DTYPES  # noqa: E402
from rwkv_jax.random_params import params_struct  # noqa: E402

LAUNCH_US = 1.0  # assumed cost per kernel boundary: XLA replays the thunks as CUDA graphs (not measured)
BUCKETS = ",".join([f"{b}x1" for b in (1, 2, 4, 8, 16, 32, 64, 128, 256)] + ["1x1024"])
ANCHORS = {"Albatross 1.5b on an H200, B=1 (tok/s)": 684, "Albatross 1.5b on an H200, B=32 forward-only (tok/s)": 10800}


def estimate(config, dtype: str, B: int, T: int, launches: int, bandwidth: float) -> dict:
    """Paper step time: bytes / bandwidth + launches * LAUNCH_US (labelled an estimate)."""
    params_bytes = sum(math.prod(x.shape) * x.dtype.itemsize for x in jax.tree.leaves(params_struct(config, DTYPES[dtype])))
    nbytes, flops = step_bytes_and_flops(config, params_bytes, jnp.dtype(DTYPES[dtype]).itemsize, B, T)
    memory_s, launch_s = nbytes / bandwidth, launches * LAUNCH_US * 1e-6
    step_s = memory_s + launch_s
    return {"bytes": nbytes, "flops": flops, "memory_us": memory_s * 1e6, "launch_us": launch_s * 1e6,
            "step_us": step_s * 1e6, "tok_s": B * T / step_s}


def markdown(doc: dict) -> str:
    lines = [f"# Deviceless compile for {doc['device']} ({doc['date_utc']}, jax {doc['jax_version']})", "",
             "Compiled on a 2-core CPU with no GPU (rwkv_jax.deviceless). **Step times are paper estimates**: "
             f"bytes moved / {doc['bandwidth_TBps']} TB/s + launches x {LAUNCH_US} us (assumed per-launch cost), "
             "not measurements.", ""] + ([doc["note"], ""] if doc.get("note") else []) + [
             "| shape | kernels | bucket | ok | compile s | launches | copies (MB) | Pallas launches | worst regs | "
             "spill B | max smem B | est. step us (memory + launches) | est. tok/s |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in doc["rows"]:
        head = f"| {r['shape']} | {r['kernels_option']} | {r['B']}x{r['T']} | {r['ok']} | {r['compile_s']} |"
        if not r["ok"]:
            lines.append(f"{head} {r['error'][:200]} | | | | | | | |")
            continue
        pallas = [k for k in r["kernels"] if k["name"].startswith("rwkv7")]
        e = r["estimate"]
        lines.append(f"{head} {r['launches']} | {r['copies']} ({r['copy_bytes'] / 1e6:.2f}) | "
                     f"{sum(k['launches'] for k in pallas)} | {max((k['registers'] or 0 for k in pallas), default=0)} | "
                     f"{sum(k['spill_bytes'] or 0 for k in pallas)} | {max((k['shared_bytes'] for k in r['kernels']), default=0)} | "
                     + (f"{e['step_us']:.0f} ({e['memory_us']:.0f} + {e['launch_us']:.0f}) | {e['tok_s']:,.0f} |"
                        if r["T"] == 1 else "n/a: a prefill is compute-bound | |"))
    lines += ["", "## Decode estimate beside the anchors", ""]
    for r in doc["rows"]:
        if r["ok"] and r["T"] == 1 and r["B"] in (1, 32, 256):
            e = r["estimate"]
            lines.append(f"- {r['shape']} {r['kernels_option']} B={r['B']}: estimate {e['tok_s']:,.0f} tok/s "
                         f"({e['step_us']:.0f} us per step: {e['memory_us']:.0f} us moving {e['bytes'] / 1e9:.2f} GB + "
                         f"{e['launch_us']:.0f} us for {r['launches']} launches)")
    lines += ["", "Anchors (measured elsewhere): " + "; ".join(f"{k}: {v:,}" for k, v in ANCHORS.items()), "",
              "## Pallas kernels (per bucket: launches, grid, threads, registers, spill bytes, shared bytes)", ""]
    for r in doc["rows"]:
        if not r["ok"]:
            continue
        lines.append(f"- **{r['shape']} {r['kernels_option']} {r['B']}x{r['T']}**: " + "; ".join(
            f"{k['name']} x{k['launches']} grid {tuple(k['grid'])} thr {k['threads'][0]} "
            f"{k['registers']} regs {k['spill_bytes']} spill {k['shared_bytes']} smem"
            for k in r["kernels"] if k["name"].startswith("rwkv7")))
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default="1.5b,2.9b")
    ap.add_argument("--kernels", default="pallas,xla")
    ap.add_argument("--buckets", default=BUCKETS)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--target", default="h200")
    ap.add_argument("--out", default="benchmarks/results/")
    ap.add_argument("--append", action="store_true", help="keep the rows already in the JSON")
    ap.add_argument("--rewrite", action="store_true", help="no compiles: recompute the estimates and the markdown")
    args = ap.parse_args(argv)
    target = deviceless.load_target(args.target)
    out = FsPath(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"gpu_compile_{target.name}.json"
    if args.rewrite:
        doc = json.loads(path.read_text())
        doc["launch_us_assumed"] = LAUNCH_US
        for r in doc["rows"]:
            if r["ok"]:
                r["estimate"] = estimate(named_config(r["shape"]), r["dtype"], r["B"], r["T"], r["launches"],
                                         target.memory_bandwidth)
        path.write_text(json.dumps(doc, indent=1))
        (out / f"gpu_compile_{target.name}.md").write_text(markdown(doc))
        return 0
    old = json.loads(path.read_text())["rows"] if args.append and path.exists() else []
    doc = {"date_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "target": target.name, "device": target.device, "jax_version": jax.__version__,
           "bandwidth_TBps": target.memory_bandwidth / 1e12, "launch_us_assumed": LAUNCH_US, "anchors": ANCHORS,
           "rows": old}
    failed = 0
    for shape in args.shapes.split(","):
        config = named_config(shape)
        for kernels in args.kernels.split(","):
            engine = deviceless.abstract_engine(config, args.dtype, kernels, target)
            for label in args.buckets.split(","):
                bucket = deviceless.Bucket.parse(label)
                result = deviceless.compile_bucket(engine, bucket, target)
                row = {"shape": shape, "kernels_option": kernels, "dtype": args.dtype, **result.as_dict()}
                if result.ok:
                    row["estimate"] = estimate(config, args.dtype, bucket.B, bucket.T, row["launches"],
                                               target.memory_bandwidth)
                failed += not result.ok
                doc["rows"] = [r for r in doc["rows"] if (r["shape"], r["kernels_option"], r["B"], r["T"]) !=
                               (shape, kernels, bucket.B, bucket.T)] + [row]
                path.write_text(json.dumps(doc, indent=1))
                (out / f"gpu_compile_{target.name}.md").write_text(markdown(doc))
                print(f"{shape} {kernels} {label}: ok={result.ok} {result.compile_s:.1f}s "
                      f"launches={row.get('launches')}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
