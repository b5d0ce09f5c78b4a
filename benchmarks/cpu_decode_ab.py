"""A/B of the XLA decode step on the CPU between two source trees, interleaved in one run.

First, per tree, the XLA:CPU compiled decode program's cost analysis (flops, bytes accessed,
fusion and copy counts at 0.1b, B = 1 and 8, float32 and bfloat16): equal numbers mean the
same program, whatever the timing noise of a loaded machine. Then each round runs one
subprocess per tree (PYTHONPATH = that tree) that times the jitted kernels="xla" forward step of a random 0.1b-shape model (state donated and carried) at
B = 1, 8, 32 in float32 and bfloat16; rounds alternate the trees so machine load hits both
alike. Prints the median ms per step per tree and writes --out (JSON).

usage: python benchmarks/cpu_decode_ab.py --before /path/to/old/tree --after . [--rounds 3]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

CHILD = r"""
import json, sys, time
import jax, jax.numpy as jnp
import rwkv_jax
from rwkv7_core.config import named_config
from rwkv_jax.random_params import random_params
config = named_config("0.1b")
out = {}
fn = jax.jit(rwkv_jax.forward_fn, static_argnames=("config", "path", "kernels"), donate_argnames=("state",))
for dtype in ("float32", "bfloat16"):
    params = random_params(config, getattr(jnp, dtype), seed=0)
    for B in (1, 8, 32):
        state = rwkv_jax.init_state(config, B, getattr(jnp, dtype))
        tokens = jnp.zeros((B, 1), jnp.int32)
        kw = dict(config=config, path=rwkv_jax.select_path(B, 1), kernels="xla")
        for _ in range(3):
            logits, state = fn(params, tokens, state, **kw)
        jax.block_until_ready(logits)
        n, t0 = 0, time.perf_counter()
        while n < 5 or time.perf_counter() - t0 < 1.5:
            logits, state = fn(params, tokens, state, **kw)
            jax.block_until_ready(logits)
            n += 1
        out[f"{dtype} B={B}"] = (time.perf_counter() - t0) / n * 1e3
print("RESULT " + json.dumps(out))
"""


PROGRAM = r"""
import json, jax, jax.numpy as jnp, rwkv_jax
from rwkv7_core.config import named_config
from rwkv_jax.random_params import params_struct
out, c = {}, named_config("0.1b")
fn = jax.jit(rwkv_jax.forward_fn, static_argnames=("config", "path", "kernels"), donate_argnames=("state",))
for B in (1, 8):
    for dt in ("float32", "bfloat16"):
        state = jax.eval_shape(lambda: rwkv_jax.init_state(c, B, getattr(jnp, dt)))
        comp = fn.lower(params_struct(c, getattr(jnp, dt)), jax.ShapeDtypeStruct((B, 1), jnp.int32), state,
                        config=c, path=rwkv_jax.select_path(B, 1), kernels="xla").compile()
        cost, text = comp.cost_analysis(), comp.as_text()
        cost = cost[0] if isinstance(cost, list) else cost
        out[f"{dt} B={B}"] = {"flops": cost.get("flops"), "bytes": cost.get("bytes accessed"),
                              "fusions": text.count(" fusion("), "copies": text.count(" copy(")}
print("RESULT " + json.dumps(out))
"""


def run(tree: str, child: str = CHILD) -> dict:
    env = {**os.environ, "PYTHONPATH": os.path.abspath(tree), "JAX_PLATFORMS": "cpu"}
    res = subprocess.run([sys.executable, "-c", child], env=env, capture_output=True, text=True, check=True)
    line = [x for x in res.stdout.splitlines() if x.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT "):])


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--before", required=True)
    ap.add_argument("--after", default=".")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default="benchmarks/results/cpu_decode_ab.json")
    a = ap.parse_args(argv)
    program = {name: run(getattr(a, name), PROGRAM) for name in ("before", "after")}
    print("same compiled XLA:CPU program:", program["before"] == program["after"])
    runs = {"before": [], "after": []}
    for i in range(a.rounds):
        order = ("before", "after") if i % 2 == 0 else ("after", "before")
        for name in order:
            runs[name].append(run(getattr(a, name)))
    table = {case: {name: statistics.median(r[case] for r in runs[name]) for name in runs} for case in runs["after"][0]}
    for case, t in table.items():
        print(f"{case:16s} before {t['before']:8.2f} ms  after {t['after']:8.2f} ms  after/before {t['after'] / t['before']:.3f}")
    json.dump({"compiled_program": program, "median_ms": table, "runs": runs, "load_avg": os.getloadavg()},
              open(a.out, "w"), indent=1)


if __name__ == "__main__":
    main()
