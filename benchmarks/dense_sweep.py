"""Deviceless H200 compile of the dense (prefill) path over a sweep of (B, T) shapes.

    PYTHONPATH=. RWKV7_CUDA_PLUGIN_DIR=.venv/cuda-plugin python benchmarks/dense_sweep.py \
        [--shape tiny] [--kernels xla,pallas] [--B 1,...,8] [--T 2,3,17,...,1100] [--out benchmarks/results/]

Before the mixes were built on flattened rows, XLA:GPU's GEMM emitter could not tile the
products of every B >= 2 with T in {3, 17, 33, 127, 257, 1023, 1100} ("Couldn't find output
tile sizes"). Writes <out>/dense_sweep_h200.json (rewritten after every shape); exits 1 if any
shape failed.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path as FsPath

os.environ.setdefault("JAX_PLATFORMS", "cpu")
if __package__ in (None, ""):  # run as a script from the source tree
    sys.path.insert(0, str(FsPath(__file__).resolve().parents[1]))

import jax  # noqa: E402

from rwkv7_core.config import named_config  # noqa: E402
from rwkv_jax import deviceless  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", default="tiny")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--kernels", default="xla,pallas")
    ap.add_argument("--B", default="1,2,3,4,5,6,7,8")
    ap.add_argument("--T", default="2,3,17,33,64,127,256,257,1023,1100")
    ap.add_argument("--out", default="benchmarks/results/")
    args = ap.parse_args(argv)
    target = deviceless.load_target("h200")
    path = FsPath(args.out) / "dense_sweep_h200.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {"target": target.name, "jax_version": jax.__version__, "shape": args.shape, "dtype": args.dtype, "rows": []}
    for kernels in args.kernels.split(","):
        engine = deviceless.abstract_engine(named_config(args.shape), args.dtype, kernels, target)
        for B in map(int, args.B.split(",")):
            for T in map(int, args.T.split(",")):
                bucket = deviceless.Bucket("prefill" if B == 1 else "forward", B, T)
                r = deviceless.compile_bucket(engine, bucket, target, ptxas=False)
                doc["rows"].append({"kernels": kernels, "B": B, "T": T, "kind": bucket.kind, "ok": r.ok,
                                    "error": r.error, "compile_s": round(r.compile_s, 2)})
                path.write_text(json.dumps(doc, indent=1))
                print(f"{kernels} B={B} T={T}: {'ok' if r.ok else 'FAILED ' + r.error[:200]} {r.compile_s:.1f}s",
                      flush=True)
    failed = [r for r in doc["rows"] if not r["ok"]]
    print(f"{len(doc['rows']) - len(failed)}/{len(doc['rows'])} shapes compiled")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
