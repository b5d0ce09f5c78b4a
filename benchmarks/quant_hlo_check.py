"""Does a quantized decode step keep a dequantized copy of any weight? Read the optimised HLO.

A copy would be an instruction outside every fusion (so its result is written to memory)
that reads one of the step's int8 / float8 parameters and gives a float result of as many
elements. On XLA:CPU it also lists the products that recompute their input row: a fused dot
on a quantized weight whose other operand is computed inside the fusion (XLA:CPU's loop then
recomputes it for every output row, ``pallas_kernels.quantized.computed_once``). The
check compiles the XLA:CPU forward step (T = 1) of a random --config model with quantized
weights at each --batch and counts them; ``--gpu-dump DIR`` checks instead the
``*gpu_after_optimizations.txt`` of a deviceless GPU compile, e.g. from
``benchmarks/decode_nodes.py --kernels xla --quantization int8 --keep-dumps DIR``.

usage: python benchmarks/quant_hlo_check.py [--config 0.1b] [--batch 1,4] [--quantization int8,fp8]
       python benchmarks/quant_hlo_check.py --gpu-dump /tmp/dumps
Exit status 1 when a copy or a recomputed input is found.
"""
from __future__ import annotations

import argparse
import glob
import math
import os
import re
import sys

QUANTIZED_PARAM = re.compile(r"(\w[\w.\-]*): (?:s8|f8e4m3fn)\[([\d,]*)\]")
FLOAT_RESULT = re.compile(r"\s*(?:ROOT )?%([\w.\-]+) = (?:f32|bf16|f16)\[([\d,]+)\]")
COMPUTATION = re.compile(r"(?:ENTRY )?(%[\w.\-]+) .*\{$")


def _size(dims: str) -> int:
    return math.prod(int(d) for d in dims.split(","))


def materialised(hlo: str) -> list[str]:
    """The instructions of `hlo` (optimised HLO text) outside fusions that read a quantized
    parameter of the entry computation and give a float result of its element count."""
    entry_head = hlo[hlo.index("\nENTRY ") + 1:].split("\n", 1)[0]
    params = QUANTIZED_PARAM.findall(entry_head)
    sizes, names = {_size(dims) for _, dims in params}, {"%" + name for name, _ in params}
    fused = set(re.findall(r"calls=(%[\w.\-]+)", hlo))
    computation, found = None, []
    for line in hlo.splitlines():
        if m := COMPUTATION.match(line):
            computation = m.group(1)
        elif computation not in fused and (m := FLOAT_RESULT.match(line)) and "parameter(" not in line:
            if _size(m.group(2)) in sizes and any(re.search(re.escape(n) + r"\b", line) for n in names):
                found.append(line.strip()[:160])
    return found


INSTRUCTION = re.compile(r"\s*(?:ROOT )?%([\w.\-]+) = (\w+)\[[^ ]* ([\w\-]+)\(([^)]*)\)")
PASS_THROUGH = {"parameter", "bitcast", "reshape", "slice", "copy", "transpose"}


def recomputed_inputs(hlo: str) -> list[str]:
    """The fused dots of `hlo` that read a quantized (s8 / f8e4m3fn) operand and compute their
    other operand inside the fusion (anything but parameters, bitcasts, reshapes, slices,
    copies and transposes between it and the dot): the dot's loop recomputes it per output."""
    found, computation, defs = [], None, {}
    fused = set(re.findall(r"calls=(%[\w.\-]+)", hlo))

    def reaches(name: str, test) -> bool:
        seen, todo = set(), [name]
        while todo:
            n = todo.pop()
            if n in seen or n not in defs:
                continue
            seen.add(n)
            if test(*defs[n][:2]):
                return True
            todo += defs[n][2]
        return False

    for line in hlo.splitlines() + [""]:
        if m := COMPUTATION.match(line):
            computation, defs = m.group(1), {}
        elif m := INSTRUCTION.match(line):
            name, dtype, op, args = m.groups()
            defs[name] = (dtype, op, re.findall(r"%([\w.\-]+)", args))
            if op != "dot" or computation not in fused:
                continue
            operands = defs[name][2]
            weights = [reaches(o, lambda t, op: op == "parameter" and t in ("s8", "f8e4m3fn")) for o in operands]
            if any(weights) and any(not w and reaches(o, lambda t, op: op not in PASS_THROUGH)
                                    for o, w in zip(operands, weights)):
                found.append(f"{computation}: {line.strip()[:120]}")
    return found


def cpu_hlo(config_name: str, scheme: str, B: int) -> str:
    import jax
    import jax.numpy as jnp

    import rwkv_jax
    from rwkv7_core.config import named_config
    from rwkv7_core.quantization import spec_for
    from rwkv_jax.random_params import params_struct
    from rwkv_jax.state import init_state

    config = named_config(config_name)
    params = params_struct(config, jnp.float32, spec_for(scheme))
    state = jax.eval_shape(lambda: init_state(config, B, jnp.float32))
    tokens = jax.ShapeDtypeStruct((B, 1), jnp.int32)
    fn = jax.jit(rwkv_jax.forward_fn, static_argnames=("config", "path", "kernels"), donate_argnames=("state",))
    return fn.lower(params, tokens, state, config=config, path=rwkv_jax.select_path(B, 1),
                    kernels="xla").compile().as_text()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default="0.1b")
    ap.add_argument("--batch", default="1,4",
                    help="XLA:CPU dequantizes into slice-sized scratches on purpose past "
                         "pallas_kernels.quantized.CPU_ROW_PRODUCTS rows")
    ap.add_argument("--quantization", default="int8,fp8")
    ap.add_argument("--gpu-dump", help="check the GPU dumps under this folder instead")
    a = ap.parse_args(argv)
    bad = 0
    if a.gpu_dump:
        runs = [(f, open(f).read()) for f in sorted(glob.glob(os.path.join(a.gpu_dump, "**", "*gpu_after_optimizations.txt"),
                                                            recursive=True))]
    else:
        runs = [(f"XLA:CPU {a.config} {s} B={B}", cpu_hlo(a.config, s, B))
                for s in a.quantization.split(",") for B in map(int, a.batch.split(","))]
    for name, hlo in runs:
        found = materialised(hlo)
        recomputed = [] if a.gpu_dump else recomputed_inputs(hlo)
        bad += len(found) + len(recomputed)
        print(f"{name}: {len(found)} dequantized weight copies" + "".join(f"\n    {x}" for x in found[:4]))
        if not a.gpu_dump:
            print(f"{name}: {len(recomputed)} products recomputing their input row"
                  + "".join(f"\n    {x}" for x in recomputed[:4]))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
