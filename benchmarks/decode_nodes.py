"""Graph nodes of the compiled H200 decode step, from a deviceless compile (no GPU needed).

For each (config, kernels, B) the forward step (T = 1, bf16 by default) is compiled for an H200
from this CPU machine with ``xla_dump_to``; the dump's thunk sequence gives every launch of the
step (XLA puts the whole step in one command buffer, so each thunk is one graph node):

- kernels: kernel launches (Pallas calls, XLA fusions, library calls), with the grid (programs
  per kernel) and the bytes each one touches (operand + result sizes from the optimised HLO,
  an upper bound on what it streams);
- copies: device-to-device copies (``kCopy`` thunks and ``wrapped_slice`` / ``copy`` fusions);
- nodes / layer = (kernels + copies) / n_layer; the Pallas launches by kernel name.

``--ptxas`` also runs ptxas (the newest found, ``rwkv_jax.gpu_dump.ptxas``) on every Pallas
entry for registers and spills. Needs jax's CUDA plugin (installed, or in the folder
``RWKV7_CUDA_PLUGIN_DIR`` names; compiling for a GPU target needs no device); the target is
``--target`` (default: the package's H200 description, ``rwkv_jax/gpu_targets/h200.txtpb``).

usage: JAX_PLATFORMS=cpu python benchmarks/decode_nodes.py --config 1.5b --kernels pallas,xla
       --batch 1,8 [--dtype bfloat16] [--state-dtype float32] [--ptxas] [--json benchmarks/results/decode_nodes.json]
"""
from __future__ import annotations

import argparse
import collections
import glob
import json
import os
import re
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

DEFAULT_TARGET = "h200"  # bundled with the package: rwkv_jax/gpu_targets/h200.txtpb
DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}
BYTES = {"pred": 1, "f8e4m3fn": 1, "s8": 1, "u8": 1, "bf16": 2, "f16": 2, "s16": 2, "u16": 2, "f32": 4, "s32": 4,
         "u32": 4, "f64": 8, "s64": 8, "u64": 8}
THUNK = re.compile(r"^\s*(\d+): (k\w+)\s+\[[^\]]*\]\s*(\S+)?(?: grid: \[(\d+), (\d+), (\d+)\] threads: "
                   r"\[(\d+), (\d+), (\d+)\])?")
ARRAY = re.compile(r"\b(pred|bf16|f8e4m3fn|[subf]\d+)\[([\d,]*)\]")
COPY_KINDS = ("kCopy", "kMemcpy")
NON_LAUNCH = ("kSequential", "kCommandBuffer", "kWhile", "kConditional", "kDynamicSliceFusion")


def array_bytes(type_text: str, per_layer: tuple = (), n_layer: int = 1) -> int:
    """Total bytes of every array type in an HLO type string (tuples summed). Arrays whose
    shape is in `per_layer` (the [B, L, ...] state leaves) count 1 / n_layer: a layer's
    kernel reads and writes only its layer of them."""
    total = 0
    for dt, dims in ARRAY.findall(type_text):
        shape = tuple(int(d) for d in filter(None, dims.split(",")))
        n = 1
        for d in shape:
            n *= d
        total += n * BYTES.get(dt, 4) // (n_layer if shape in per_layer else 1)
    return total


def _one(dump: str, pattern: str) -> str:
    files = sorted(glob.glob(os.path.join(dump, pattern)))
    if not files:
        raise FileNotFoundError(f"no {pattern} in {dump}")
    return files[0]


def hlo_bytes(dump: str, per_layer: tuple = (), n_layer: int = 1) -> dict:
    """({HLO instruction name: bytes of its operands + result}, {name: result bytes}) for the
    entry computation (state leaves per layer, see array_bytes; the embedding table counts
    nothing: a lookup reads B rows)."""
    text = open(_one(dump, "*gpu_after_optimizations.txt")).read()
    entry = text[text.index("\nENTRY ") + 1:]
    head, body = entry.split("\n", 1)
    sizes = {name: 0 if name.startswith("params__emb__") else array_bytes(t, per_layer, n_layer)
             for name, t in re.findall(r"(\w[\w.\-]*): ((?:pred|bf16|f8e4m3fn|[subf]\d+)\[[\d,]*\])", head)}
    out = {}
    for line in body.split("\n"):
        m = re.match(r"\s*(?:ROOT )?%([\w.\-]+) = (.*?) ([\w\-]+)\((.*)", line)
        if not m:
            continue
        name, result, kind, rest = m.groups()
        if kind == "parameter" and name in sizes:  # sized from the header (the embedding: nothing)
            continue
        sizes[name] = array_bytes(result.split("{")[0] if not result.startswith("(") else result,
                                  per_layer, n_layer)
        operands = re.findall(r"%([\w.\-]+)", rest.split("), ")[0])
        out[name] = sizes[name] + sum(sizes.get(o, 0) for o in operands)
    return out, {n: array_bytes(t) for n, t in re.findall(r"%([\w.\-]+) = (\S+)", body)}


def thunks(dump: str, per_layer: tuple = (), n_layer: int = 1) -> list[dict]:
    """One record per launch thunk: kind, kernel name, HLO name, grid, programs, bytes."""
    meta = open(_one(dump, "*.thunk_metadata.txt")).read()
    hlo_name = {int(i): a for a, i in re.findall(r'profile_annotation: "([^"]*)"\s*thunk_id: (\d+)', meta)}
    sizes, results = hlo_bytes(dump, per_layer, n_layer)
    seq = [f for f in glob.glob(os.path.join(dump, "*.thunk_sequence.txt"))]
    out = []
    for line in open(sorted(seq)[0]):
        m = THUNK.match(line)
        if not m or m[2] in NON_LAUNCH:
            continue
        tid, kind, name = int(m[1]), m[2], m[3] or ""
        hlo = hlo_name.get(tid, "")
        rec = {"kind": kind, "name": name, "hlo": hlo, "bytes": sizes.get(hlo, 0)}
        rec["copy"] = kind in COPY_KINDS or hlo.startswith(("wrapped_slice", "copy"))
        if rec["copy"]:  # a copy reads and writes its result's bytes (not its whole operand)
            rec["bytes"] = 2 * results.get(hlo, 0)
        if m[4]:
            grid = tuple(int(x) for x in m.groups()[3:6])
            rec.update(grid=grid, programs=grid[0] * grid[1] * grid[2],
                       threads=int(m[7]) * int(m[8]) * int(m[9]))
        out.append(rec)
    return out


def ptxas_resources(dump: str, prefix: str = "rwkv7") -> dict:
    """{Pallas entry: registers, stack, spill stores/loads} from ptxas -v on the dumped PTX."""
    from rwkv_jax.gpu_dump import ptxas
    exe = ptxas()[0]  # the newest on the machine (XLA's PTX ISA version grows with jax)
    res = {}
    for f in glob.glob(os.path.join(dump, "*.ptx")):
        if not re.search(rf"\.entry {prefix}", open(f).read()):
            continue
        r = subprocess.run([exe, "-v", "-arch=sm_90a", f, "-o", os.devnull], capture_output=True, text=True)
        text = r.stdout + r.stderr
        for fn, body in re.findall(r"Compiling entry function '(\w+)'.*?\n(.*?)(?=Compiling entry|\Z)", text, re.S):
            if not fn.startswith(prefix):
                continue
            spill = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", body)
            regs = re.search(r"Used (\d+) registers", body)
            res[fn] = {"regs": int(regs[1]) if regs else None, "stack": int(spill[1]),
                       "spill_stores": int(spill[2]), "spill_loads": int(spill[3])}
        if r.returncode:
            res[os.path.basename(f)] = {"error": text[-300:]}
    return res


def summarize(records: list[dict], n_layer: int) -> dict:
    kernels = [r for r in records if not r["copy"]]
    copies = [r for r in records if r["copy"]]
    pallas = [r for r in kernels if r["name"].startswith("rwkv7")]
    by_name = collections.defaultdict(list)
    for r in pallas:
        by_name[re.sub(r"__\d+$", "", r["name"])].append(r)
    return {
        "nodes": len(records), "kernel_launches": len(kernels), "copies": len(copies),
        "nodes_per_layer": round(len(records) / n_layer, 2),
        "copy_bytes": sum(r["bytes"] for r in copies),
        "kernel_bytes": sum(r["bytes"] for r in kernels),
        "pallas_launches": {k: len(v) for k, v in sorted(by_name.items())},
        "pallas_programs": {k: sorted({r["programs"] for r in v}) for k, v in sorted(by_name.items())},
        "pallas_bytes": {k: sorted({r["bytes"] for r in v}) for k, v in sorted(by_name.items())},
        "copy_names": dict(collections.Counter(re.sub(r"[.\d]+$", "", r["hlo"] or r["kind"]) for r in copies)),
        "xla_kernels": len(kernels) - len(pallas),
    }


HBM_BYTES_S = 4.8e12        # H200 HBM3e bandwidth (spec)
MATMUL_FLOP_S = 0.6 * 989e12  # 60% of the bf16 dense spec: what large GEMMs sustain
PER_NODE_US = 2.0           # launch + ramp/tail of one dependent node in a CUDA graph (see report)
ANCHORS = {1: 684, 8: 2549, 32: 10767}  # Albatross 1.5b on an H200, forward only, tok/s


def estimate_ms(row: dict, per_node_us: float = PER_NODE_US) -> float:
    """Paper step time: max(bytes / HBM bandwidth, flops / matmul rate) + nodes x per-node cost,
    bytes = the step's minimum traffic (every weight once, the state read and written:
    rwkv7_core.cost) + what its copies move. An estimate, not a measurement (calibrate
    per_node_us with benchmarks/gpu_check.py)."""
    from rwkv7_core.config import named_config
    from rwkv7_core.cost import step_bytes_and_flops
    config = named_config(row["config"])
    short = {"bfloat16": "bf16", "float16": "f16", "float32": "f32"}
    itemsize = BYTES[short[row["dtype"]]]
    state_itemsize = BYTES[short[row.get("state_dtype", "float32")]]
    streamed, flops = step_bytes_and_flops(config, config.n_params * itemsize, itemsize, row["B"], 1, state_itemsize)
    moved = streamed + row["copy_bytes"]
    return (max(moved / HBM_BYTES_S, flops / MATMUL_FLOP_S) + row["nodes"] * per_node_us * 1e-6) * 1e3


def spills(row: dict) -> str:
    """The Pallas entries ptxas found spilling ("none (n entries)"; "-" where it did not run)."""
    if "ptxas" not in row:
        return "-"
    bad = [f"{k.removeprefix('rwkv7_')} {v.get('spill_stores', '?')}/{v.get('spill_loads', '?')} B"
           for k, v in row["ptxas"].items() if v.get("spill_stores") or v.get("spill_loads") or "error" in v]
    return ", ".join(bad) or f"none ({len(row['ptxas'])} entries)"


def markdown(rows: list) -> str:
    """The before/after table: one line per (config, kernels, B, label)."""
    lines = ["| config | label | kernels | B | nodes | nodes/layer | kernels (pallas) | copies | "
             "Pallas programs per kernel | ptxas spills (stores/loads) | est. step ms | est. tok/s (Albatross) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in sorted(rows, key=lambda r: (r["config"], r["B"], r["label"], r["kernels"])):
        if "error" in r:
            lines.append(f"| {r['config']} | {r['label']} | {r['kernels']} | {r['B']} | {r['error'][:80]} |"
                         + " |" * 7)
            continue
        est = estimate_ms(r)
        anchor = ANCHORS.get(r["B"]) if r["config"] == "1.5b" else None
        programs = ", ".join(f"{k.removeprefix('rwkv7_')} {'/'.join(map(str, v))}"
                             for k, v in r["pallas_programs"].items())
        lines.append(f"| {r['config']} | {r['label']} | {r['kernels']} | {r['B']} | {r['nodes']} | "
                     f"{r['nodes_per_layer']:.1f} | {r['kernel_launches']} ({sum(r['pallas_launches'].values())}) | "
                     f"{r['copies']} | {programs} | {spills(r)} | "
                     f"{est:.3f} | {r['B'] / est * 1e3:,.0f}{f' ({anchor:,})' if anchor else ''} |")
    return "\n".join(lines) + "\n"


def compile_step(config, dtype, kernels: str, B: int, dump: str, target, quant=None,
                 state_dtype=jnp.float32) -> float:
    """Deviceless compile of the forward decode step (B sequences, T = 1), with weights
    quantized by `quant` (a rwkv7_core.quantization.QuantSpec or None) and the wkv state in
    `state_dtype`; returns seconds."""
    from rwkv_jax.deviceless import dump_options, on_target, placed
    from rwkv_jax.forward import forward_fn
    from rwkv_jax.paths import select_path
    from rwkv_jax.random_params import params_struct
    from rwkv_jax.state import init_state
    params = params_struct(config, dtype, quant)
    state = jax.eval_shape(lambda: init_state(config, B, dtype, state_dtype))
    tokens = jax.ShapeDtypeStruct((B, 1), jnp.int32)
    static = dict(config=config, path=select_path(B, 1), kernels=kernels)
    t0 = time.perf_counter()
    jitted = jax.jit(forward_fn, static_argnames=tuple(static), donate_argnames=("state",))
    with on_target(target) as sharding:
        lowered = jitted.trace(*placed((params, tokens, state), sharding), **static).lower()
    lowered.compile(dump_options(dump))
    return time.perf_counter() - t0


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default="0.1b")
    ap.add_argument("--dtype", default="bfloat16", choices=sorted(DTYPES))
    ap.add_argument("--kernels", default="pallas,xla", help="comma list of rwkv_jax.Kernels values")
    ap.add_argument("--batch", default="1", help="comma list of batch sizes (T = 1)")
    ap.add_argument("--target", default=DEFAULT_TARGET,
                    help="bundled GPU target (rwkv_jax/gpu_targets) or a GpuTargetConfig .txtpb file")
    ap.add_argument("--quantization", default="none", choices=("none", "int8", "int4", "fp8"),
                    help="quantized weights (every kernels option takes them)")
    ap.add_argument("--group-size", type=int, default=None, help="int8 / int4 group size (default: the library's)")
    ap.add_argument("--state-dtype", default="float32", choices=sorted(DTYPES), help="the wkv state's dtype")
    ap.add_argument("--ptxas", action="store_true", help="ptxas -v every Pallas entry (regs, spills)")
    ap.add_argument("--keep-dumps", help="keep the XLA dumps under this folder")
    ap.add_argument("--json", help="append the rows to this JSON file (a list)")
    ap.add_argument("--label", default="", help="free text stored with each row (e.g. before/after)")
    ap.add_argument("--markdown", help="only write the table of the rows in --json to this file")
    a = ap.parse_args(argv)
    if a.markdown:
        open(a.markdown, "w").write(markdown(json.load(open(a.json))))
        return
    from rwkv7_core.config import named_config
    from rwkv7_core.quantization import spec_for
    from rwkv_jax import deviceless
    config = named_config(a.config)
    target = deviceless.load_target(a.target)
    quant = spec_for(a.quantization, a.group_size)

    def save(row):  # after every row: a long sweep cut short keeps what it measured
        if a.json:
            old = json.load(open(a.json)) if os.path.exists(a.json) else []
            json.dump(old + [row], open(a.json, "w"), indent=1)

    for kernels in a.kernels.split(","):
        for B in map(int, a.batch.split(",")):
            dump = tempfile.mkdtemp(prefix=f"nodes_{a.config}_{kernels}_B{B}_", dir=a.keep_dumps)
            try:
                seconds = compile_step(config, DTYPES[a.dtype], kernels, B, dump, target, quant,
                                       DTYPES[a.state_dtype])
            except Exception as e:  # a shape that does not compile is a result too
                print(f"{a.config} {a.dtype} {kernels} B={B} FAILED: {type(e).__name__}: {str(e)[:300]}", flush=True)
                save({"label": a.label, "config": a.config, "dtype": a.dtype, "kernels": kernels, "B": B,
                      "error": f"{type(e).__name__}: {str(e)[:300]}"})
                continue
            from rwkv7_core.state import state_shapes
            records = thunks(dump, tuple(state_shapes(config, B).values()), config.n_layer)
            row = {"label": a.label, "config": a.config, "dtype": a.dtype, "kernels": kernels, "B": B,
                   **({"quantization": quant.describe()} if quant else {}),
                   **({"state_dtype": a.state_dtype} if a.state_dtype != "float32" else {}), "n_layer": config.n_layer,
                   "compile_s": round(seconds, 1), **summarize(records, config.n_layer),
                   "launches": [{k: r[k] for k in ("name", "programs", "bytes") if k in r}
                                for r in records if r["name"].startswith("rwkv7")]}
            if a.ptxas:
                row["ptxas"] = ptxas_resources(dump)
            print(f"{a.config} {a.dtype} {kernels:>15} B={B:<3} nodes {row['nodes']:4d} "
                  f"({row['nodes_per_layer']:.1f}/layer)  kernels {row['kernel_launches']:4d} "
                  f"(pallas {sum(row['pallas_launches'].values())}, xla {row['xla_kernels']})  "
                  f"copies {row['copies']:4d} ({row['copy_bytes'] / 1e6:.2f} MB)  "
                  f"kernel bytes {row['kernel_bytes'] / 1e6:.1f} MB  "
                  f"compile {seconds:.1f}s  {row['pallas_launches']}", flush=True)
            if a.ptxas:
                spills = {k: v for k, v in row["ptxas"].items() if v.get("spill_stores") or "error" in v}
                print(f"    ptxas: {len(row['ptxas'])} Pallas entries, spilling: {spills or 'none'}")
            if not a.keep_dumps:
                subprocess.run(["rm", "-rf", dump])
            save(row)


if __name__ == "__main__":
    sys.exit(main())
