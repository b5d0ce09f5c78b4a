"""Where compile time goes, and what the layer loop costs: unrolled layers against ``lax.scan``.

Sections (each optional, all by default):

- ``cpu``: the JAX model on XLA:CPU with its layers unrolled (what ``rwkv_jax`` runs) and as a
  ``lax.scan`` over layer-stacked weights (layer 0 unrolled: it makes ``v_first``; the scan
  below reuses ``rwkv_jax.modules.Block`` per layer, so only the loop differs), plus XLA:CPU's
  backend optimisation level 1 against the default on the unrolled model. Per (shape, B, T):
  compile seconds and tok/s (decode B = 1, 8, 32; dense prefill T = 128), rounds interleaved.
- ``h200``: the same two layer loops compiled for an H200 without a GPU (``rwkv_jax.deviceless``):
  compile seconds, and the launches in the compiled step's thunk sequence (a scan's body runs
  L - 1 times: ``executed`` counts it so).
- ``anatomy``: what one decode-step compile of the demo's model (tiny shape, World vocabulary,
  B = 8) is made of: the forward alone at 1, 2 and 4 layers (the per-layer cost) and the
  on-device sampling alone.
- ``demo``: ``rwkv7-generate`` as ``make demo`` runs it, on a cold compilation cache (a fresh
  cache directory holding only the random model): compile seconds (in total and per kind of
  executable), compiles, wall seconds and a hash of the outputs; ``--demo-tree`` runs another
  checkout's demo the same way (before/after).

Writes benchmarks/results/compile_speed.json and .md. Run:
``JAX_PLATFORMS=cpu python benchmarks/compile_speed.py [--sections cpu,h200,anatomy,demo]`` (the h200
section needs jax's CUDA plugin, see ``rwkv7-gpu-compile``; ~10 minutes on 2 cores).
"""
from __future__ import annotations

import argparse
import collections
import functools
import glob
import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402

from pallas_kernels.shift_mix import layer_norm  # noqa: E402
from rwkv7_core.config import named_config  # noqa: E402
from rwkv_jax.forward import forward_fn  # noqa: E402
from rwkv_jax.kernels import ops_for  # noqa: E402
from rwkv_jax.layouts import DenseRows, StepRows  # noqa: E402
from rwkv_jax.modules import Block, Tensors  # noqa: E402
from rwkv_jax.paths import Path as KernelPath  # noqa: E402
from rwkv_jax.paths import select_path
from rwkv_jax.state import State, init_state  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
CPU_SHAPES = (("tiny", 1), ("tiny", 8), ("tiny", 32), ("tiny", 128),
              ("0.1b", 1), ("0.1b", 8), ("0.1b", 32), ("0.1b", 128))  # (config, B, or T for prefill)
OPT1 = {"xla_backend_optimization_level": 1}


# ------------------------------------------------------------------ the scanned variant
def stack_layers(params: dict, n_layer: int) -> dict:
    """params with blocks 1..L-1 stacked on a leading axis ('stacked') and block 0 apart."""
    blocks = params["blocks"]
    out = {k: v for k, v in params.items() if k != "blocks"}
    out["block0"] = blocks[0]
    out["stacked"] = jax.tree.map(lambda *xs: jnp.stack(xs), *(blocks[i] for i in range(1, n_layer)))
    return out


@functools.lru_cache(maxsize=None)
def _block_skeleton(config, layer: int):
    return nnx.split(nnx.eval_shape(lambda: Block(config, layer, Tensors(None, jnp.float32))))


def _bound_block(params: dict, config, layer: int) -> Block:
    graphdef, abstract = _block_skeleton(config, layer)
    state = jax.tree.map(lambda x: x, abstract)
    nnx.replace_by_pure_dict(state, params)
    return nnx.merge(graphdef, state)


def scan_forward_fn(params: dict, tokens, state: State, *, config, path, kernels):
    """forward_fn's math with layers 1..L-1 under lax.scan (params from ``stack_layers``)."""
    B, T = tokens.shape
    rows = StepRows() if path is not KernelPath.DENSE else DenseRows(B, T, False)
    ops = ops_for(path, kernels)
    ln0_w, ln0_b, lnout_w, lnout_b = params["ln"]
    h = layer_norm(jnp.take(params["emb"], tokens.reshape(B * T), axis=0), ln0_w, ln0_b)

    def run(block, carry, i):
        h, delta, v_first, leaves = carry
        layer_state = tuple(jax.lax.dynamic_index_in_dim(x, i, 1, keepdims=False) for x in leaves)
        h, delta, new, v_first = block(h, delta, layer_state, v_first, ops=ops, rows=rows)
        leaves = tuple(jax.lax.dynamic_update_index_in_dim(x, n.astype(x.dtype), i, 1) for x, n in zip(leaves, new))
        return h, delta, v_first, leaves

    carry = run(_bound_block(params["block0"], config, 0), (h, None, None, tuple(state)), 0)
    carry, _ = jax.lax.scan(lambda c, xs: (run(_bound_block(xs[0], config, 1), c, xs[1]), None),
                            carry, (params["stacked"], jnp.arange(1, config.n_layer)))
    h, delta, _, leaves = carry
    logits = ops.linear(layer_norm(rows.outputs(h + delta), lnout_w, lnout_b), params["head"])
    return logits.astype(jnp.float32), State(*leaves)


LOOPS = {"unrolled": (forward_fn, lambda p, L: p), "scan": (scan_forward_fn, stack_layers)}


def _jitted(loop: str, config, B: int, T: int, kernels: str = "xla"):
    fn = LOOPS[loop][0]
    path = select_path(B, T)
    return jax.jit(lambda p, tok, s: fn(p, tok, s, config=config, path=path, kernels=kernels), donate_argnums=2)


# ------------------------------------------------------------------------------ CPU
def cpu_section(rounds: int, seconds: float) -> list[dict]:
    from rwkv_jax.random_params import random_model

    variants = (("unrolled", {}), ("scan", {}), ("unrolled", OPT1))
    rows, runs = [], []
    models = {}
    for name, n in CPU_SHAPES:
        if name not in models:
            config = named_config(name)
            params = random_model(config, "float32").params
            models[name] = (config, {loop: make(params, config.n_layer) for loop, (_, make) in LOOPS.items()})
        config, params = models[name]
        B, T = (1, n) if n > 32 else (n, 1)
        for loop, options in variants:
            lowered = _jitted(loop, config, B, T).lower(params[loop], jnp.zeros((B, T), jnp.int32),
                                                        init_state(config, B, jnp.float32))
            start = time.perf_counter()
            exe = lowered.compile(options)
            row = dict(config=name, B=B, T=T, loop=loop, backend_opt=options.get("xla_backend_optimization_level", "default"),
                       compile_s=round(time.perf_counter() - start, 3), tok_s=[])
            print(f"compiled {row}", flush=True)
            rows.append(row)
            runs.append((row, exe, params[loop], config))
    for _ in range(rounds):  # interleaved: load drift hits every variant alike
        for row, exe, params, config in runs:
            B, T = row["B"], row["T"]
            box = [init_state(config, B, jnp.float32)]
            tokens = jnp.zeros((B, T), jnp.int32)

            def call():
                logits, box[0] = exe(params, tokens, box[0])  # noqa: B023 - called in this iteration
                logits.block_until_ready()
            call()
            calls, start = 0, time.perf_counter()
            while calls < 3 or time.perf_counter() - start < seconds:
                call()
                calls += 1
            row["tok_s"].append(B * T * calls / (time.perf_counter() - start))
    for row in rows:
        row["tok_s_median"] = round(float(np.median(row["tok_s"])), 1)
        row["tok_s"] = [round(x, 1) for x in row["tok_s"]]
    return rows


# ------------------------------------------------------------------------------ H200
def h200_section(configs: list[str], batches: list[int], n_layer: int | None = None) -> list[dict]:
    from rwkv_jax import deviceless
    from rwkv_jax.random_params import params_struct

    target = deviceless.load_target("h200")
    rows = []
    for name in configs:
        config = named_config(name)
        config = config if n_layer is None else config._replace(n_layer=n_layer)
        params = params_struct(config, jnp.bfloat16)
        for B in batches:
            state = jax.eval_shape(lambda: init_state(config, B, jnp.bfloat16))  # noqa: B023 - called in this iteration
            for loop, (_, make) in LOOPS.items():
                structs = (jax.eval_shape(lambda p: make(p, config.n_layer), params),  # noqa: B023 - called in this iteration
                           jax.ShapeDtypeStruct((B, 1), jnp.int32), state)
                with tempfile.TemporaryDirectory(prefix="rwkv7_loop_dump_") as dump:
                    start = time.perf_counter()
                    with deviceless.on_target(target) as sharding:
                        lowered = _jitted(loop, config, B, 1).trace(*deviceless.placed(structs, sharding)).lower()
                    lowered.compile(deviceless.dump_options(dump))
                    seconds = time.perf_counter() - start
                    launches = _launches(dump, config.n_layer)
                rows.append(dict(config=name, n_layer=config.n_layer, B=B, T=1, dtype="bfloat16", kernels="xla", loop=loop,
                                 compile_s=round(seconds, 2), **launches))
                print(rows[-1], flush=True)
    return rows


def _launches(dump: str, n_layer: int) -> dict:
    """Launches in the step's thunk sequence (``rwkv_jax.gpu_dump.step_report``: kernels and
    copies, a loop body listed once): listed, and executed per step (a while loop's condition
    and body counted once per layer it runs: L - 1 times)."""
    from rwkv_jax.gpu_dump import step_report

    report = step_report(dump, ptxas=False)
    thunks = report.launches + report.copies
    body = sum(t.in_loop for t in thunks)
    sequence = open(sorted(glob.glob(os.path.join(dump, "*.thunk_sequence.txt")))[0]).read()
    return dict(launches_listed=len(thunks), while_loops=len(re.findall(r"^\s*\d+: kWhile", sequence, re.M)),
                body_launches=body, launches_executed=len(thunks) + body * (n_layer - 2),
                copies_listed=len(report.copies))


# --------------------------------------------------------------------------- anatomy
def anatomy_section(B: int = 8) -> list[dict]:
    from rwkv7_apps.engines import random_model_config
    from rwkv7_core.sampling import SamplingRows, sampling_rows
    from rwkv_jax.random_params import random_model
    from rwkv_jax.sampling import sample_rows

    rows = []
    config = random_model_config("tiny-world")
    for n_layer in (1, 2, 4):
        c = config._replace(n_layer=n_layer)
        params = random_model(c, "float32").params
        lowered = _jitted("unrolled", c, B, 1).lower(params, jnp.zeros((B, 1), jnp.int32), init_state(c, B, jnp.float32))
        start = time.perf_counter()
        lowered.compile()
        rows.append(dict(what=f"forward, {n_layer} layer(s)", compile_s=round(time.perf_counter() - start, 3)))
    V = config.vocab_size
    srows = SamplingRows(*(jax.ShapeDtypeStruct((B,), a.dtype) for a in sampling_rows([])))
    lowered = jax.jit(sample_rows).lower(jax.ShapeDtypeStruct((B, V), jnp.float32), jax.ShapeDtypeStruct((B, V), jnp.float32),
                                         srows, jax.ShapeDtypeStruct((B, V), jnp.bool_), jax.ShapeDtypeStruct((B,), jnp.int32))
    start = time.perf_counter()
    lowered.compile()
    rows.append(dict(what=f"sampling alone, [{B}, {V}]", compile_s=round(time.perf_counter() - start, 3)))
    for r in rows:
        print(r, flush=True)
    return rows


# ------------------------------------------------------------------------------ demo
def demo_section(model_file: Path, tree: Path = ROOT) -> dict:
    """One cold-cache run of the demo command of the checkout ``tree``, with the random
    tiny-world model file copied in (so the run only compiles)."""
    with tempfile.TemporaryDirectory(prefix="rwkv7_cold_demo_") as tmp:
        cache = Path(tmp) / "cache"
        (cache / "rwkv7").mkdir(parents=True)
        shutil.copy(model_file, cache / "rwkv7" / model_file.name)
        out, metrics = Path(tmp) / "out.jsonl", Path(tmp) / "metrics.json"
        env = {**os.environ, "XDG_CACHE_HOME": str(cache), "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(tree)}
        start = time.perf_counter()
        subprocess.run([sys.executable, "-m", "rwkv7_apps.generate", "--random-model", "tiny-world",
                        "--input", str(tree / "rwkv7_apps" / "data" / "example_prompts.jsonl"),
                        "--output", str(out), "--max-tokens", "32", "--metrics", str(metrics)],
                       check=True, env=env, cwd=tree, capture_output=True)
        wall = time.perf_counter() - start
        m = json.loads(metrics.read_text())
        texts = sorted(json.loads(line)["id"] + json.loads(line).get("text", "") for line in out.open())
    by_kind = collections.Counter()
    for e in m["compile_events"]:
        by_kind[e["what"].split(":")[0].removesuffix(" first run")] += e["seconds"]
    return dict(tree=str(tree), process_wall_s=round(wall, 2), compile_s=round(m["compile_seconds"], 3),
                compile_s_by_kind={k: round(v, 3) for k, v in by_kind.most_common()},
                compiles=len(m["compile_events"]), buckets=sorted({e["bucket"] for e in m["bucket_timeline"]}),
                decode_tok_s=m["decode_tok_s"]["average"], generated=m["tokens"]["generated"],
                outputs_sha1=hashlib.sha1("\n".join(texts).encode()).hexdigest()[:12])


# ------------------------------------------------------------------------------ report
def markdown(results: dict) -> str:
    lines = [f"# Compile time and the layer loop ({results['date']}, jax {results['jax']}, "
             f"{results['cpus']} CPUs)", ""]
    if results.get("cpu"):
        lines += ["## XLA:CPU, float32 (tok/s: median of interleaved rounds)", "",
                  "| config | B | T | loop | backend opt | compile s | tok/s |", "|---|---|---|---|---|---|---|"]
        lines += [f"| {r['config']} | {r['B']} | {r['T']} | {r['loop']} | {r['backend_opt']} | {r['compile_s']} | "
                  f"{r['tok_s_median']} |" for r in results["cpu"]]
    if results.get("h200"):
        lines += ["", "## H200 decode step, deviceless compile (bf16, kernels=xla)", "",
                  "| config | B | loop | compile s | launches listed | while loops | launches executed / step | copies listed |",
                  "|---|---|---|---|---|---|---|---|"]
        lines += [f"| {r['config']} | {r['B']} | {r['loop']} | {r['compile_s']} | {r['launches_listed']} | "
                  f"{r['while_loops']} | {r['launches_executed']} | {r['copies_listed']} |" for r in results["h200"]]
    if results.get("anatomy"):
        lines += ["", "## One decode-step compile of the demo model (tiny, V = 65,536, B = 8, XLA:CPU)", "",
                  "| part | compile s |", "|---|---|"]
        lines += [f"| {r['what']} | {r['compile_s']} |" for r in results["anatomy"]]
    if results.get("demo"):
        lines += ["", "## Demo on a cold compilation cache (interleaved runs)", "",
                  "| checkout | run | compile s | compile events | by kind (s) | buckets | process wall s | decode tok/s | tokens | outputs sha1 |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        for d in results["demo"]:
            kinds = ", ".join(f"{k} {v}" for k, v in d["compile_s_by_kind"].items())
            lines.append(f"| {d['label']} | {d['run']} | {d['compile_s']} | {d['compiles']} | {kinds} | {d['buckets']} | "
                         f"{d['process_wall_s']} | {d['decode_tok_s']:.1f} | {d['generated']} | {d['outputs_sha1']} |")
    if results.get("notes"):
        lines += ["", "## Notes", ""] + [f"- {n}" for n in results["notes"]]
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sections", default="cpu,h200,anatomy,demo")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=1.5, help="timing per variant per round")
    ap.add_argument("--h200-configs", default="1.5b")
    ap.add_argument("--h200-batch", default="1,32")
    ap.add_argument("--h200-layers", type=int, help="override the layer count of the h200 configs")
    ap.add_argument("--demo-tree", action="append", default=[], metavar="LABEL=PATH",
                    help="also run the demo of another checkout (e.g. before=/path/to/old); repeatable")
    ap.add_argument("--demo-runs", type=int, default=1, help="runs per checkout, interleaved")
    ap.add_argument("--out", type=Path, default=RESULTS / "compile_speed.json")
    args = ap.parse_args(argv)
    sections = set(args.sections.split(","))
    results = dict(date=time.strftime("%Y-%m-%d"), jax=jax.__version__, python=platform.python_version(),
                   cpus=os.cpu_count())
    if "cpu" in sections:
        results["cpu"] = cpu_section(args.rounds, args.seconds)
    if "h200" in sections:
        results["h200"] = h200_section(args.h200_configs.split(","), [int(b) for b in args.h200_batch.split(",")],
                                       args.h200_layers)
    if "anatomy" in sections:
        results["anatomy"] = anatomy_section()
    if "demo" in sections:
        from rwkv7_apps.engines import random_model_path
        model_file = random_model_path("tiny-world")  # written once into the user's cache
        trees = [("this", ROOT)] + [(t.split("=", 1)[0], Path(t.split("=", 1)[1])) for t in args.demo_tree]
        results["demo"] = []
        for run in range(args.demo_runs):
            for label, tree in trees:
                results["demo"].append(dict(label=label, run=run, **demo_section(model_file, tree)))
                print(results["demo"][-1], flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1))
    args.out.with_suffix(".md").write_text(markdown(results))
    print(markdown(results))


if __name__ == "__main__":
    main()
