"""CPU benchmark of the JAX (XLA) model against the torch reference and the official package.

0.1b-shape random model, float32 (plus JAX with bfloat16 weights): decode tok/s at
B = 1, 8, 32, prefill tok/s at T = 512, the machine's measured read bandwidth and matmul
rate, roofline fractions, per-call dispatch overhead on the tiny model, and compile
time per bucket for the tiny and 0.1b shapes. Prints a table and writes
benchmarks/results/cpu_model_bench.json. Run: `python benchmarks/cpu_model_bench.py`
(a few minutes on 2 cores; `--quick` shortens every measurement; `--quantization int8`
(repeatable) adds float32-activation JAX rows with quantized weights, e.g.
``jax_xla_float32_int8_B1``; benchmarks/quant_speed.py is the interleaved A/B of those).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

import rwkv_jax
from rwkv7_core.config import named_config
from rwkv7_core.random_weights import write_random_checkpoint
from rwkv_jax.engine import JaxEngine

RESULTS = Path(__file__).resolve().parent / "results" / "cpu_model_bench.json"
DECODE_BATCHES = (1, 8, 32)
PREFILL_T = 512


def timed(fn, min_seconds: float, min_calls: int = 3, warmup: int = 1) -> float:
    """Seconds per call of fn() after `warmup` calls, over >= min_calls and >= min_seconds."""
    for _ in range(warmup):
        fn()
    calls, start = 0, time.perf_counter()
    while calls < min_calls or time.perf_counter() - start < min_seconds:
        fn()
        calls += 1
    return (time.perf_counter() - start) / calls


# ----------------------------------------------------------------------------- machine
def read_bandwidth_gbs(seconds: float) -> float:
    """Best of numpy and XLA sums over a 1 GiB float32 array (GB/s)."""
    host = np.ones(1 << 28, np.float32)
    dev = jnp.asarray(host)
    total = jax.jit(jnp.sum)
    rates = [host.nbytes / timed(lambda: host.sum(), seconds) / 1e9,
             host.nbytes / timed(lambda: total(dev).block_until_ready(), seconds) / 1e9]
    return max(rates)


def matmul_gflops(seconds: float) -> dict:
    """float32 [32, 768] x [768, 3072] in numpy and XLA (GFLOP/s)."""
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal((32, 768), np.float32), rng.standard_normal((768, 3072), np.float32)
    xd, wd = jnp.asarray(x), jnp.asarray(w)
    mm = jax.jit(jnp.matmul)
    flops = 2 * 32 * 768 * 3072
    return {"numpy": flops / timed(lambda: x @ w, seconds) / 1e9,
            "xla": flops / timed(lambda: mm(xd, wd).block_until_ready(), seconds) / 1e9}


# ----------------------------------------------------------------------------- models
def compile_forwards(engine: JaxEngine, buckets) -> dict:
    """Compile the (B, T) forwards ahead of time: {(B, T): seconds}."""
    keys = {(B, T): ("forward", (B, T, False)) for B, T in buckets}
    for key in keys.values():
        engine.executables.get(key)
    return {bt: engine.compile_seconds[key] for bt, key in keys.items()}


def jax_decode(engine: JaxEngine, B: int, seconds: float) -> float:
    m, exe = engine.model, engine.executables.get(("forward", (B, 1, False)))
    tokens = jnp.asarray(np.random.default_rng(B).integers(0, m.config.vocab_size, (B, 1)), jnp.int32)
    box = [m.init_state(B)]

    def step():
        logits, box[0] = exe(m.params, tokens, box[0])
        logits.block_until_ready()
    return B / timed(step, seconds)


def jax_prefill(engine: JaxEngine, T: int, seconds: float) -> float:
    m, exe = engine.model, engine.executables.get(("forward", (1, T, False)))
    tokens = jnp.asarray(np.random.default_rng(T).integers(0, m.config.vocab_size, (1, T)), jnp.int32)
    return T / timed(lambda: exe(m.params, tokens, m.init_state(1))[0].block_until_ready(), seconds, 2)


def torch_decode(ref, B: int, seconds: float) -> float:
    tokens = np.random.default_rng(B).integers(0, ref.config.vocab_size, (B, 1))
    box = [ref.init_state(B)]

    def step():
        _, box[0] = ref.forward(tokens, box[0])
    return B / timed(step, seconds, warmup=3)


def torch_prefill(ref, T: int, seconds: float) -> float:
    tokens = np.random.default_rng(T).integers(0, ref.config.vocab_size, (1, T))
    return T / timed(lambda: ref.forward(tokens, ref.init_state(1)), seconds, 2)


def official_model(pth: Path):
    os.environ["RWKV_V7_ON"] = "1"
    from rwkv.model import RWKV
    return RWKV(model=str(pth)[:-len(".pth")], strategy="cpu fp32")


def official_decode(model, seconds: float) -> float:
    box = [None]

    def step():
        _, box[0] = model.forward([7], box[0])
    return 1 / timed(step, seconds, warmup=3)


def official_thread_probe(model, seconds: float) -> dict:
    """Official B=1 decode with 1 and 2 torch threads; keeps the faster count for every
    later torch measurement. (On a shared, oversubscribed machine torch's OpenMP threads
    can collapse to a few tok/s at 2 threads; on an idle one 2 threads win.)"""
    import torch
    rates = {}
    for n in (1, 2):
        torch.set_num_threads(n)
        rates[n] = official_decode(model, seconds)
    best = max(rates, key=rates.get)
    torch.set_num_threads(best)
    return {"official_decode_tok_s": rates, "used": best}


def official_prefill(model, T: int, seconds: float) -> float:
    tokens = np.random.default_rng(T).integers(0, 65536, T).tolist()
    return T / timed(lambda: model.forward(tokens, None), seconds, 2, warmup=2)


def dispatch_overhead_us(engine: JaxEngine, seconds: float) -> dict:
    """Per-call wall time on the tiny model (compute is ~1 MFLOP, so this is overhead):
    a no-op jit taking the same params pytree, the compiled B1T1 step, and m.forward."""
    noop = jax.jit(lambda params, x: x + 1)
    x = jnp.zeros(())
    tiny, exe = engine.model, engine.executables.get(("forward", (1, 1, False)))
    tokens, box = jnp.zeros((1, 1), jnp.int32), [tiny.init_state(1)]

    def step():
        logits, box[0] = exe(tiny.params, tokens, box[0])
        logits.block_until_ready()

    def api():
        logits, box[0] = tiny.forward(np.zeros((1, 1), np.int32), box[0])
        logits.block_until_ready()
    return {"noop_jit_same_params": timed(lambda: noop(tiny.params, x).block_until_ready(), seconds) * 1e6,
            "compiled_step": timed(step, seconds) * 1e6, "model_forward": timed(api, seconds) * 1e6,
            "param_leaves": len(jax.tree.leaves(tiny.params))}


def weight_bytes_per_token(config, itemsize: int) -> int:
    """Bytes of every weight read for one decoded token: all parameters but the embedding."""
    return (config.n_params - config.vocab_size * config.n_embd) * itemsize


def prefill_flops_per_token(config) -> int:
    """Prefill runs the head on the last position only: 2 x (parameters - embedding - head)."""
    return 2 * (config.n_params - 2 * config.vocab_size * config.n_embd)


# ----------------------------------------------------------------------------- main
def run(seconds: float, quantizations=()) -> dict:
    out: dict = {"machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                             "jax": jax.__version__, "seconds_per_measurement": seconds,
                             "load_average_at_start": os.getloadavg()}}
    out["read_bandwidth_gbs"] = read_bandwidth_gbs(seconds)
    out["matmul_gflops"] = matmul_gflops(seconds)
    with tempfile.TemporaryDirectory() as tmp:
        tiny_path = Path(tmp) / "tiny.safetensors"
        write_random_checkpoint(tiny_path, named_config("tiny"), seed=0)
        tiny = JaxEngine(rwkv_jax.load(tiny_path))
        buckets = [(1, 1), (8, 1), (32, 1), (1, PREFILL_T)]
        out["compile_seconds"] = {"tiny": {f"{b}x{t}": s for (b, t), s in compile_forwards(tiny, buckets).items()}}
        out["dispatch_us_tiny"] = dispatch_overhead_us(tiny, seconds)

        config = named_config("0.1b")
        st_path, pth_path = Path(tmp) / "m.safetensors", Path(tmp) / "m.pth"
        write_random_checkpoint(st_path, config, seed=0)
        write_random_checkpoint(pth_path, config, seed=0)
        decode, prefill = {}, {}
        for dtype, quant in [("float32", "none"), ("bfloat16", "none")] + [("float32", q) for q in quantizations]:
            engine = JaxEngine(rwkv_jax.load(st_path, dtype=dtype, quantization=quant))
            name = f"jax_xla_{dtype}" + ("" if quant == "none" else f"_{quant}")
            full = dtype == "float32"
            times = compile_forwards(engine, buckets if full else [(1, 1)])
            if full:
                out["compile_seconds"]["0.1b" + ("" if quant == "none" else f"_{quant}")] = {
                    f"{b}x{t}": s for (b, t), s in times.items()}
                prefill[name] = jax_prefill(engine, PREFILL_T, seconds)
            for B in (DECODE_BATCHES if full else (1,)):
                decode[f"{name}_B{B}"] = jax_decode(engine, B, seconds)
            del engine
        official = official_model(pth_path)
        threads = official_thread_probe(official, seconds)
        out["torch_threads"] = threads
        decode["official_float32_B1"] = max(threads["official_decode_tok_s"].values())
        prefill["official_float32"] = official_prefill(official, PREFILL_T, seconds)
        del official
        import rwkv_torch_ref
        ref = rwkv_torch_ref.load(pth_path)
        for B in DECODE_BATCHES:
            decode[f"torch_ref_float32_B{B}"] = torch_decode(ref, B, seconds)
        prefill["torch_ref_float32"] = torch_prefill(ref, PREFILL_T, seconds)

    out["machine"]["load_average_at_end"] = os.getloadavg()
    out["decode_tok_s"], out["prefill_tok_s_T512"] = decode, prefill
    out["analysis"] = analyse(out, config)
    return out


def analyse(out: dict, config) -> dict:
    """Roofline fractions and the issue's goals."""
    bw, mm = out["read_bandwidth_gbs"], max(out["matmul_gflops"].values())
    flops_per_token = 2 * (config.n_params - config.vocab_size * config.n_embd)
    d, p = out["decode_tok_s"], out["prefill_tok_s_T512"]
    roof32 = bw * 1e9 / weight_bytes_per_token(config, 4)
    res = {"b1_roofline_tok_s_float32": roof32,
           "b1_roofline_tok_s_bfloat16": bw * 1e9 / weight_bytes_per_token(config, 2),
           "flops_per_token": flops_per_token, "matmul_gflops_used": mm}
    for key, tps in d.items():
        if key.endswith("_B1"):
            if not any(f"_{q}_" in key for q in ("int8", "fp8")):  # quantized bytes: benchmarks/quant_speed.py
                itemsize = 2 if "bfloat16" in key else 4
                res[f"{key}_fraction_of_bandwidth_roofline"] = tps * weight_bytes_per_token(config, itemsize) / (bw * 1e9)
        else:
            res[f"{key}_fraction_of_matmul_rate"] = tps * flops_per_token / (mm * 1e9)
    res["goal_jax_b1_vs_official (>=0.9)"] = d["jax_xla_float32_B1"] / d["official_float32_B1"]
    res["goal_jax_bf16_b1_vs_official (>1)"] = d["jax_xla_bfloat16_B1"] / d["official_float32_B1"]
    res["goal_jax_b32_vs_b1 (>=5)"] = d["jax_xla_float32_B32"] / d["jax_xla_float32_B1"]
    res["goal_jax_b32_fraction_of_matmul (>=0.7)"] = res["jax_xla_float32_B32_fraction_of_matmul_rate"]
    res["goal_jax_prefill_vs_official (>=1.5)"] = p["jax_xla_float32"] / p["official_float32"]
    res["prefill_fraction_of_matmul_rate"] = {k: v * prefill_flops_per_token(config) / (mm * 1e9)
                                              for k, v in p.items()}
    return res


def print_table(out: dict) -> None:
    print("load average (1, 5, 15 min) at start / end:", out["machine"]["load_average_at_start"],
          out["machine"]["load_average_at_end"])
    print(f"read bandwidth {out['read_bandwidth_gbs']:.1f} GB/s; matmul [32,768]x[768,3072] "
          + ", ".join(f"{k} {v:.1f}" for k, v in out["matmul_gflops"].items()) + " GFLOP/s")
    print(f"{'decode (0.1b)':32s} {'tok/s':>9s}")
    for k, v in out["decode_tok_s"].items():
        print(f"{k:32s} {v:9.1f}")
    print(f"{'prefill T=512 (0.1b)':32s} {'tok/s':>9s}")
    for k, v in out["prefill_tok_s_T512"].items():
        print(f"{k:32s} {v:9.1f}")
    print("torch threads (official B=1 decode tok/s by thread count):", out["torch_threads"])
    print("dispatch on tiny (us/call):", {k: round(v, 1) for k, v in out["dispatch_us_tiny"].items()})
    for name, times in out["compile_seconds"].items():
        print(f"compile seconds {name}:", {k: round(v, 2) for k, v in times.items()})
    for k, v in out["analysis"].items():
        if isinstance(v, float):
            print(f"  {k}: {v:.3f}")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="0.3 s per measurement instead of 2 s")
    ap.add_argument("--output", type=Path, default=RESULTS)
    ap.add_argument("--quantization", action="append", default=[], choices=("int8", "fp8"),
                    help="also time the JAX float32 model with these quantized weights (repeatable)")
    args = ap.parse_args(argv)
    out = run(0.3 if args.quick else 2.0, args.quantization)
    print_table(out)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
