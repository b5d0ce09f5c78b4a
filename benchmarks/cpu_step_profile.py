"""Where the XLA:CPU decode step's time goes: a profile of the compiled step by kind of work.

Random 0.1b-shape model; for each weight format (float32, bfloat16, int8 groups of 64) and
batch size it compiles the decode step as the engine does (the CPU compiler options of
``rwkv_jax.compilation``, or ``--options`` JSON instead), runs it under ``jax.profiler`` and
sums the runtime's per-instruction events (each XLA:CPU thunk: a library dot, a YNNPACK
fusion, a loop fusion, a copy) into groups: the products by weight (the head, the time-mix
projections, the channel-mix key and value, the LoRA pairs), copies, and everything else
(elementwise and reduction fusions, the recurrence). Times are summed over both runtime
threads (busy time, not wall time); the rate of each product group is the bytes of its weights
over its busy time. Prints a table per case and writes ``benchmarks/results/cpu_step_profile.md``
and ``.json``.

Run: ``PYTHONPATH=. python benchmarks/cpu_step_profile.py [--batches 1,32] [--steps 10]``.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import re
import tempfile
import time
from pathlib import Path

import jax
import jax.numpy as jnp
from flax import nnx

import rwkv_jax
from rwkv7_core.config import named_config
from rwkv7_core.quantization import QuantSpec
from rwkv7_core.random_weights import random_tensors
from rwkv_jax.compilation import compiler_options
from rwkv_jax.modules import RWKV7

RESULTS = Path(__file__).resolve().parent / "results" / "cpu_step_profile.json"
FORMATS = {"float32": (jnp.float32, None), "bfloat16": (jnp.bfloat16, None),
           "int8": (jnp.float32, QuantSpec("int8", 64)), "int8 bfloat16-rows": (jnp.bfloat16, QuantSpec("int8", 64))}
LORA = {f"{kind}{end}" for kind in "wavg" for end in "12"}
# name = type op(operands), kind=..., calls=...; a tuple type (a custom call's several results) has spaces
INSTRUCTION = re.compile(r"^\s*(?:ROOT )?%([\w.\-]+) = (\([^()]*\)|\S+) (\w[\w\-]*)\((.*?)\)(?:, kind=(\w+))?"
                         r"(?:, calls=%([\w.\-]+))?", re.M)


def params_for(config, fmt: str) -> dict:
    dtype, quant = FORMATS[fmt]
    return nnx.to_pure_dict(nnx.split(RWKV7(config, random_tensors(config, 0), dtype, quant))[1])


def group_bytes(params: dict) -> dict[str, int]:
    """Bytes of the weights each product group reads per step."""
    out: collections.Counter = collections.Counter()
    for path, leaf in jax.tree.leaves_with_path(params):
        out[classify_weight([str(getattr(k, "key", k)) for k in path])] += leaf.nbytes
    return dict(out)


def classify_weight(keys: list[str]) -> str:
    """The product group of a weight from its keys in the params dict (e.g. blocks, 0, att, key)."""
    if "head" in keys:
        return "head"
    if "att" in keys and {"receptance", "key", "value", "output"} & set(keys):
        return "time-mix r/k/v/o"
    if "ffn" in keys and {"key", "value"} & set(keys):
        return "channel-mix " + ("key" if "key" in keys else "value")
    return "LoRA products" if "att" in keys and LORA & set(keys) else "other"


def instruction_groups(hlo: str) -> dict[str, str]:
    """HLO instruction name -> group, for the entry computation's instructions."""
    bodies = {m.group(1): m.group(2) for m in re.finditer(r"^%?([\w.\-]+) [^\n]*\{\n(.*?)\n\}", hlo, re.M | re.S)}
    groups = {}
    for name, _, op, operands, _, calls in INSTRUCTION.findall(hlo):
        has_dot = op in ("dot", "custom-call") or (op == "fusion" and " dot(" in bodies.get(calls, ""))
        if has_dot:
            weights = re.findall(r"%params_(\w+?)\.\d+", operands)  # params__blocks___0___att____key__
            kinds = {classify_weight([k for k in w.split("_") if k]) for w in weights} - {"other"}
            # several kinds: one grouped call (cpu_kernels.linear.matmul_group); none: the recurrence
            # (and, native, the shift mixes)
            native = "native recurrence / shift mixes" if op == "custom-call" else "other products (recurrence)"
            groups[name] = " + ".join(sorted(kinds)) if kinds else native
        elif op == "copy":
            groups[name] = "copies"
        else:
            groups[name] = "elementwise / reduce / other"
    return groups


def profile(params: dict, config, B: int, steps: int, options: dict, kernels: str = "xla") -> dict:
    dtype = jnp.bfloat16 if params["emb"].dtype == jnp.bfloat16 else jnp.float32
    fn = jax.jit(rwkv_jax.forward_fn, static_argnames=("config", "path", "kernels"), donate_argnames=("state",))
    tokens = jnp.zeros((B, 1), jnp.int32)
    kw = dict(config=config, path=rwkv_jax.select_path(B, 1), kernels=kernels)
    exe = fn.lower(params, tokens, rwkv_jax.init_state(config, B, dtype), **kw).compile(options)
    groups = instruction_groups(exe.as_text())
    state = rwkv_jax.init_state(config, B, dtype)
    for _ in range(3):
        logits, state = exe(params, tokens, state)
    logits.block_until_ready()
    with tempfile.TemporaryDirectory() as tmp:
        jax.profiler.start_trace(tmp)
        start, cpu = time.perf_counter(), time.process_time()
        for _ in range(steps):
            logits, state = exe(params, tokens, state)
            logits.block_until_ready()
        wall, cpu = (time.perf_counter() - start) / steps, (time.process_time() - cpu) / steps
        jax.profiler.stop_trace()
        trace = max(Path(tmp).rglob("*.xplane.pb"), key=os.path.getmtime)
        data = jax.profiler.ProfileData.from_file(str(trace))
    busy: collections.Counter = collections.Counter()
    for plane in data.planes:
        for line in plane.lines:
            for event in line.events:
                if event.name in groups:
                    busy[groups[event.name]] += event.duration_ns / 1e6 / steps
    text = exe.as_text()
    entry = text[text.index("\nENTRY"):]  # copies inside a fusion's body write no buffer
    return {"wall_ms": wall * 1e3, "cpu_ms": cpu * 1e3, "busy_ms": dict(busy),
            "copies": entry.count(" copy("), "ynn_fusions": text.count("__ynn_fusion")}


def table(fmt: str, B: int, res: dict, weight_bytes: dict) -> list[str]:
    total = sum(res["busy_ms"].values())
    lines = [f"**{fmt}, B = {B}**: wall {res['wall_ms']:.1f} ms/step, process CPU {res['cpu_ms']:.1f} ms/step, "
             f"busy (sum of runtime events) {total:.1f} ms; {res['copies']} copies (buffers written), "
             f"{res['ynn_fusions']} YNNPACK fusions in the compiled step", "", "| group | busy ms/step | share | weight MB | GB/s of busy time |",
             "|---|---|---|---|---|"]
    for group, ms in sorted(res["busy_ms"].items(), key=lambda kv: -kv[1]):
        mb = weight_bytes.get(group, 0) / 1e6
        rate = f"{mb / ms:.1f}" if mb and ms else ""
        lines.append(f"| {group} | {ms:.2f} | {ms / total:.0%} | {mb:.0f} | {rate} |" if mb else
                     f"| {group} | {ms:.2f} | {ms / total:.0%} | | |")
    return lines + [""]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", default="1,32")
    ap.add_argument("--formats", default="float32,int8,bfloat16")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--kernels", default="xla", help="xla | native (rwkv_jax.Kernels)")
    ap.add_argument("--options", default=None, help="XLA compile options as JSON (default: the engine's)")
    ap.add_argument("--output", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    config = named_config("0.1b")
    options = json.loads(args.options) if args.options else compiler_options("cpu")
    out: dict = {"options": options, "cpus": os.cpu_count(), "jax": jax.__version__, "cases": {}}
    lines = [f"XLA:CPU decode step of the 0.1b shape, compile options {options}, {os.cpu_count()} CPUs, "
             f"{args.steps} profiled steps each; load average at the start "
             f"{', '.join(f'{x:.1f}' for x in os.getloadavg())}.", ""]
    for fmt in args.formats.split(","):
        params = params_for(config, fmt)
        weight_bytes = group_bytes(params)
        for B in (int(b) for b in args.batches.split(",")):
            res = profile(params, config, B, args.steps, options, args.kernels)
            out["cases"][f"{fmt} {args.kernels} B={B}"] = {**res, "weight_bytes": weight_bytes}
            block = table(f"{fmt}, kernels={args.kernels}", B, res, weight_bytes)
            print("\n".join(block), flush=True)
            lines += block
        del params
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(out, indent=1) + "\n")
    args.output.with_suffix(".md").write_text("\n".join(lines))
    print(f"wrote {args.output} and {args.output.with_suffix('.md')}")


if __name__ == "__main__":
    main()
