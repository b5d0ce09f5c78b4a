"""Quantized weights on the Pallas decode paths, compiled for an H200 without a GPU: per kernels
option the step's kernel bytes against the bf16 step's (goal <= 0.55 for int8 / fp8, <= 0.32 for
int4), nodes per layer (goal: not above the bf16 step's) and every Pallas kernel's registers and
spills from ptxas (goal: none).

Runs ``benchmarks/decode_nodes.py --ptxas`` once per (kernels, weights) into a raw JSON, then
writes the table (``--render`` only re-renders a raw JSON). Needs jax's CUDA plugin, as
decode_nodes.py does (``RWKV7_CUDA_PLUGIN_DIR``).

usage: JAX_PLATFORMS=cpu python benchmarks/quant_decode_kernels.py --config 1.5b --batch 1
       --kernels pallas-fused,pallas --out benchmarks/results/quant_decode_kernels_h200
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import re
import sys

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import decode_nodes  # noqa: E402

SCHEMES = ("none", "int8", "fp8")  # the default run; --schemes picks others (int4)


def kernel_resources(ptxas: dict) -> dict:
    """{kernel base name: entries, max registers, spill bytes (stores + loads) summed}."""
    out = collections.defaultdict(lambda: {"entries": 0, "max_regs": 0, "spill_bytes": 0})
    for entry, r in ptxas.items():
        k = out[re.sub(r"__\d+$", "", entry).removeprefix("rwkv7_")]
        k["entries"] += 1
        k["max_regs"] = max(k["max_regs"], r.get("regs") or 0)
        k["spill_bytes"] += r.get("spill_stores", 0) + r.get("spill_loads", 0) + (1 if "error" in r else 0)
    return dict(sorted(out.items()))


def condensed(raw: list) -> list:
    """One row per (config, kernels, B, weights) with bytes relative to the bf16 row of its kernels."""
    rows = [{"config": r["config"], "dtype": r["dtype"], "kernels": r["kernels"], "B": r["B"],
             "weights": r.get("quantization", "bf16"), "nodes_per_layer": r["nodes_per_layer"],
             "kernel_launches": r["kernel_launches"], "copies": r["copies"], "kernel_bytes": r["kernel_bytes"],
             "kernels_ptxas": kernel_resources(r.get("ptxas", {}))} for r in raw if "error" not in r]
    base = {(r["config"], r["kernels"], r["B"]): r for r in rows if r["weights"] == "bf16"}
    for r in rows:
        b = base.get((r["config"], r["kernels"], r["B"]))
        r["bytes_vs_bf16"] = round(r["kernel_bytes"] / b["kernel_bytes"], 4) if b else None
        r["nodes_vs_bf16"] = round(r["nodes_per_layer"] - b["nodes_per_layer"], 2) if b else None
    return rows


def markdown(rows: list, command: str) -> str:
    lines = [f"Deviceless H200 compile of the decode step (bf16 activations), `{command}`: kernel bytes = "
             "operand + result bytes of every launch (embedding lookup counted as nothing); registers and "
             "spills from ptxas -v (sm_90a) on every Pallas entry (max registers over a kernel's entries, spill "
             "bytes summed).", "",
             "| config | kernels | B | weights | nodes/layer | kernel bytes | vs bf16 | Pallas kernels: max registers, "
             "spill bytes |", "|---|---|---|---|---|---|---|---|"]
    for r in sorted(rows, key=lambda r: (r["config"], r["kernels"], r["B"], r["weights"] != "bf16", r["weights"])):
        res = "; ".join(f"{k} {v['max_regs']}, {v['spill_bytes']}" for k, v in r["kernels_ptxas"].items())
        vs = "" if r["bytes_vs_bf16"] is None else f"{r['bytes_vs_bf16']:.3f}"
        lines.append(f"| {r['config']} | {r['kernels']} | {r['B']} | {r['weights']} | {r['nodes_per_layer']:.2f} | "
                     f"{r['kernel_bytes'] / 1e6:,.0f} MB | {vs} | {res} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default="1.5b")
    ap.add_argument("--batch", default="1")
    ap.add_argument("--kernels", default="pallas-fused,pallas")
    ap.add_argument("--out", default="benchmarks/results/quant_decode_kernels_h200",
                    help="writes OUT.raw.json (decode_nodes rows), OUT.json and OUT.md")
    ap.add_argument("--render", action="store_true", help="only re-render OUT.json / OUT.md from OUT.raw.json")
    ap.add_argument("--schemes", default=",".join(SCHEMES),
                    help="comma list of quantizations to compile (rows append to OUT.raw.json; the table "
                         "compares each with the bf16 row there)")
    ap.add_argument("--group-size", default=None, help="int8 / int4 group size (default: the library's)")
    a = ap.parse_args(argv)
    raw_path = a.out + ".raw.json"
    if not a.render:
        for scheme in a.schemes.split(","):
            group = ["--group-size", a.group_size] if a.group_size and scheme in ("int8", "int4") else []
            decode_nodes.main(["--config", a.config, "--batch", a.batch, "--kernels", a.kernels, "--ptxas",
                               "--quantization", scheme, *group, "--json", raw_path])
    rows = condensed(json.load(open(raw_path)))
    json.dump(rows, open(a.out + ".json", "w"), indent=1)
    command = f"python benchmarks/quant_decode_kernels.py --config {a.config} --batch {a.batch} --kernels {a.kernels}"
    open(a.out + ".md", "w").write(markdown(rows, command))
    print(open(a.out + ".md").read())


if __name__ == "__main__":
    main()
