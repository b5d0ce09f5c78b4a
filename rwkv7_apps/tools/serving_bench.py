"""Serving benchmark (`rwkv7-bench`): one seeded workload under each prefill policy.

    rwkv7-bench --model tiny --requests 256 --prompt-len 20 2000 --output-len 16 256
    rwkv7-bench --smoke                      # tiny model, 8 short requests, < 1 minute

The workload: `--requests` greedy requests, prompt lengths log-uniform in `--prompt-len`,
output lengths uniform in `--output-len` (no stop token, so every request runs its full
length), all enqueued at t=0. The model has random weights of a named shape (made on the
device). One JaxEngine serves every policy; every executable the policies need is compiled
before the first measured run, and any compile during a run is reported.

Per policy (the seed's table plus latency): time to enqueue all requests, prefill tok/s
(prompt tokens over the summed prefill-call seconds; a mixed step's seconds are shared
between its prompt tokens and decode rows by row count), total prefill seconds, prefill
share of all tokens, decode tok/s (average: tokens drawn by decode steps over the span from
first to last step; peak: best window of 16 consecutive steps), each bucket shrink
(from -> to, ms), TTFT p50/p99, decode-step latency p50/p99 and the select_path mix of
steps. Writes serving_<tag>.json, serving_<tag>.md and serving_<tag>.png under --out.

`gpu_check_section(out_dir, budget_s)` is the hook benchmarks/gpu_check.py calls on a GPU.
"""
from __future__ import annotations

import argparse
import json
import platform
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import jax
import numpy as np

import rwkv_jax
from rwkv7_core.config import named_config
from rwkv7_core.engine import MAX_PIECES, varlen_shape
from rwkv7_core.random_weights import write_random_checkpoint
from rwkv_jax.engine import JaxEngine
from rwkv_jax.kernels import Kernels
from rwkv_jax.random_params import random_model
from scheduler import Request, SamplingParams, Scheduler, SchedulerConfig

RESULTS = Path("benchmarks") / "results"  # relative to the working directory (the checkout)
POLICIES = ("auto", "serial", "varlen", "mixed")
PEAK_WINDOW = 16


def make_workload(n: int, prompt_len: tuple[int, int], output_len: tuple[int, int], vocab: int,
                  seed: int) -> list[Request]:
    """Seeded greedy requests: log-uniform prompt lengths, uniform output lengths."""
    rng = np.random.default_rng(seed)
    lo, hi = prompt_len
    lengths = np.exp(rng.uniform(np.log(lo), np.log(hi + 1), n)).astype(int).clip(lo, hi)
    outputs = rng.integers(output_len[0], output_len[1] + 1, n)
    return [Request(f"req{i}", rng.integers(1, vocab, int(p)).tolist(),
                    SamplingParams(max_tokens=int(o), stop_tokens=(), seed=i))
            for i, (p, o) in enumerate(zip(lengths, outputs))]


def build_engine(model_name: str, dtype: str, kernels: str, seed: int = 0, prefill_pieces=None):
    """A JaxEngine on a random-weight model of a named shape; `prefill_pieces`: the serial
    prefill's piece sizes (None = the engine's default). On a GPU the weights are drawn on
    the device; elsewhere a random checkpoint is written to a temporary file and loaded."""
    config = named_config(model_name)
    if jax.default_backend() == "gpu":
        model = random_model(config, dtype, kernels, seed)
    else:
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "model.safetensors"
            write_random_checkpoint(path, config, seed=seed)
            model = rwkv_jax.load(path, dtype=dtype, kernels=kernels)
    return JaxEngine(model) if prefill_pieces is None else JaxEngine(model, prefill_pieces)


def precompile(engine, buckets, chunk: int, policies) -> float:
    """Compile every executable the runs can touch; returns seconds spent."""
    start = time.perf_counter()
    engine.compile(buckets)
    engine.compile_prefill()
    if "varlen" in policies or "auto" in policies:
        engine.compile_varlen(varlen_shape(chunk))
    if "mixed" in policies:
        for b in buckets:
            engine.compile_mixed(b, varlen_shape(chunk))
    return time.perf_counter() - start


def call_costs(engine, buckets, chunk: int, repeats: int = 5) -> dict:
    """Milliseconds per engine call, to explain the policies by kernel path: serial prefill
    (B=1, T=chunk: DENSE), varlen prefill of 1 x chunk and of MAX_PIECES x chunk/MAX_PIECES
    tokens vs that many serial calls, and per bucket the decode step (B1T1 / BATCHED_DECODE)
    against the mixed step carrying a full chunk (DENSE). Run before the measured runs."""

    def ms(fn):
        jax.block_until_ready(fn())
        start = time.perf_counter()
        for _ in range(repeats):
            jax.block_until_ready(fn())
        return (time.perf_counter() - start) / repeats * 1e3

    rng = np.random.default_rng(0)
    prompt = rng.integers(1, engine.vocab_size, chunk).astype(np.int32)
    split = np.array_split(prompt, MAX_PIECES)
    rows = varlen_shape(chunk)
    out = {"serial_prefill_1x": ms(lambda: engine.prefill(prompt)),
           "serial_prefill_split": ms(lambda: [engine.prefill(p) for p in split]),
           "varlen_prefill_1x": ms(lambda: engine.prefill_varlen([prompt], [None], rows)),
           "varlen_prefill_split": ms(lambda: engine.prefill_varlen(split, [None] * len(split), rows)),
           "decode_step": {}, "mixed_step": {}}
    row = engine.prefill(prompt[:4])
    for b in buckets:
        engine.resize([], b)
        for slot in range(b):
            engine.insert(slot, row, SamplingParams(seed=slot))
        tokens, positions = np.ones(b, np.int32), np.zeros(b, np.int32)
        out["decode_step"][b] = ms(lambda: engine.step(tokens, positions))  # noqa: B023 - called in this iteration
        out["mixed_step"][b] = ms(lambda: engine.mixed_step(tokens, positions, [prompt], [None], rows)[0])  # noqa: B023 - called in this iteration
    return out


def _pct(values, q):
    return float(np.percentile(values, q)) if len(values) else None


def summarize(stats, enqueue_s: float, wall_s: float, compiles_during_run: dict) -> dict:
    """The per-policy row of the table from a Scheduler's Stats."""
    requests, steps = stats.requests, stats.steps
    prompt_tokens = sum(r.prompt_tokens for r in requests)
    generated = sum(r.generated_tokens for r in requests)
    prefill_s = sum(p.seconds for p in stats.prefills)
    decode_tokens = np.array([s.live for s in steps], float)
    step_s = np.array([s.seconds for s in steps])
    starts = np.array([s.time for s in steps])
    ends = starts + step_s
    span = ends[-1] - starts[0] if len(steps) else 0.0
    peak = 0.0
    for i in range(max(0, len(steps) - PEAK_WINDOW + 1)):
        j = i + PEAK_WINDOW - 1
        peak = max(peak, decode_tokens[i:j + 1].sum() / (ends[j] - starts[i]))
    ttft = [r.ttft for r in requests if r.ttft is not None]
    return {
        "requests": len(requests),
        "finished": Counter(r.finish_reason for r in requests),
        "wall_s": wall_s,
        "enqueue_s": enqueue_s,
        "prompt_tokens": prompt_tokens,
        "generated_tokens": generated,
        "prefill_share": prompt_tokens / max(1, prompt_tokens + generated),
        "total_prefill_s": prefill_s,
        "prefill_tok_s": prompt_tokens / prefill_s if prefill_s else None,
        "decode_tok_s_avg": decode_tokens.sum() / span if span else None,
        "decode_tok_s_peak": peak or None,
        "output_tok_s": generated / wall_s,
        "ttft_p50_s": _pct(ttft, 50), "ttft_p99_s": _pct(ttft, 99),
        "step_ms_p50": _pct(step_s * 1e3, 50), "step_ms_p99": _pct(step_s * 1e3, 99),
        "steps": len(steps),
        "path_mix": Counter(s.path for s in steps),
        "shrinks": [{"from": s.from_bucket, "to": s.to_bucket, "ms": s.seconds * 1e3}
                    for s in stats.switches if s.to_bucket < s.from_bucket],
        "grows": sum(1 for s in stats.switches if s.to_bucket > s.from_bucket),
        "compiles_during_run": compiles_during_run,
        "timeline": {"step_start_s": (starts - starts[0]).round(4).tolist() if len(steps) else [],
                     "live": decode_tokens.astype(int).tolist(), "bucket": [s.bucket for s in steps]},
    }


def run_policy(engine, requests, policy: str, max_batch: int, chunk: int, buckets=None) -> dict:
    """One measured run of `requests` under `policy`; returns its summary."""
    before = set(engine.compile_seconds)
    scheduler = Scheduler(engine, SchedulerConfig(max_batch=max_batch, buckets=buckets, prefill_policy=policy,
                                                  chunk=chunk, stats_records=10**6))
    start = time.perf_counter()
    for r in requests:
        scheduler.add(r)
    enqueue_s = time.perf_counter() - start
    scheduler.run()
    wall_s = time.perf_counter() - start
    new = {f"{k[0]}:{k[1]}": engine.compile_seconds[k] for k in set(engine.compile_seconds) - before}
    summary = summarize(scheduler.stats, enqueue_s, wall_s, new)
    summary["outputs_digest"] = hash(tuple(tuple(scheduler.results[r.id].tokens) for r in requests))
    return summary


def run_serving_benchmark(model: str = "tiny", *, requests: int = 256, prompt_len=(20, 2000),
                          output_len=(16, 256), max_batch: int = 64, chunk: int = 256,
                          policies=POLICIES, dtype: str = "float32", kernels: str = "xla",
                          seed: int = 0, budget_s: float | None = None, prefill_pieces=None,
                          buckets=None, repeats: int = 1) -> dict:
    """Build the engine, precompile, run each policy on the same workload `repeats` times
    (interleaved: auto, serial, varlen, mixed, auto, ...); a JSON-able dict whose per-policy
    row is the run with the median wall time, every run's headline numbers under
    "repeats". With `budget_s`, runs that would start after the budget is spent are
    skipped. `buckets`: decode batch sizes (default powers of two up to max_batch)."""
    t0 = time.perf_counter()
    engine = build_engine(model, dtype, kernels, seed, prefill_pieces)
    config = SchedulerConfig(max_batch=max_batch, buckets=buckets, chunk=chunk).validated()
    work = make_workload(requests, tuple(prompt_len), tuple(output_len), engine.vocab_size, seed)
    compile_s = precompile(engine, config.buckets, chunk, policies)
    costs = call_costs(engine, config.buckets, chunk)
    result: dict[str, Any] = {"environment": {"date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                              "backend": jax.default_backend(), "jax": jax.__version__,
                              "python": platform.python_version(), "machine": platform.machine()},
              "settings": {"model": model, "dtype": dtype, "kernels": engine.kernels,
                           "requests": requests, "prompt_len": list(prompt_len),
                           "output_len": list(output_len), "max_batch": max_batch, "chunk": chunk,
                           "buckets": list(config.buckets), "seed": seed, "repeats": repeats,
                           "serial_prefill_pieces": list(engine.prefill_pieces)},
              "precompile_s": compile_s, "call_ms": costs, "policies": {}, "repeats": {}}
    runs: dict[str, list] = {p: [] for p in policies}
    for _ in range(repeats):
        for policy in policies:
            if budget_s is not None and time.perf_counter() - t0 > budget_s:
                continue
            runs[policy].append(run_policy(engine, work, policy, max_batch, chunk, config.buckets))
            print(f"{policy}: {runs[policy][-1]['wall_s']:.1f}s", flush=True)
    headline = ("wall_s", "prefill_tok_s", "decode_tok_s_avg", "ttft_p50_s", "ttft_p99_s", "step_ms_p50",
                "step_ms_p99")
    result["repeats"] = {p: [{k: r[k] for k in headline} for r in rs] for p, rs in runs.items()}
    for policy, rs in runs.items():
        result["policies"][policy] = (sorted(rs, key=lambda r: r["wall_s"])[len(rs) // 2] if rs else
                                      {"skipped": f"time budget {budget_s:.0f}s spent"})
    digests = {p: r.get("outputs_digest") for p, r in result["policies"].items() if "skipped" not in r}
    result["same_tokens_all_policies"] = len(set(digests.values())) == 1
    result["elapsed_s"] = time.perf_counter() - t0
    return result


def _fmt(v, spec=".1f"):
    return "—" if v is None else format(v, spec)


def markdown(result: dict) -> str:
    s = result["settings"]
    lines = [f"# Serving benchmark — {result['environment']['date_utc']} ({result['environment']['backend']})", "",
             f"model {s['model']} ({s['dtype']}, kernels={s['kernels']}), {s['requests']} requests, prompt "
             f"{s['prompt_len'][0]}–{s['prompt_len'][1]} tokens (log-uniform), output {s['output_len'][0]}–"
             f"{s['output_len'][1]} (uniform), max_batch {s['max_batch']}, chunk {s['chunk']}, seed {s['seed']}; "
             f"precompile {result['precompile_s']:.0f}s; same tokens under every policy: "
             f"{result['same_tokens_all_policies']}", "",
             "| policy | wall s | enqueue ms | prefill tok/s | total prefill s | prefill share | decode tok/s avg | "
             "decode tok/s peak | output tok/s | TTFT p50 / p99 s | step ms p50 / p99 | steps by path | "
             "shrinks from→to (ms) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for policy, r in result["policies"].items():
        if "skipped" in r:
            lines.append(f"| {policy} | skipped: {r['skipped']} |" + " |" * 11)
            continue
        shrinks = ", ".join(f"{x['from']}→{x['to']} ({x['ms']:.1f})" for x in r["shrinks"]) or "none"
        paths = ", ".join(f"{k} {v}" for k, v in sorted(r["path_mix"].items()))
        lines.append(
            f"| {policy} | {r['wall_s']:.1f} | {r['enqueue_s'] * 1e3:.1f} | {_fmt(r['prefill_tok_s'], ',.0f')} | "
            f"{r['total_prefill_s']:.1f} | {r['prefill_share']:.1%} | {_fmt(r['decode_tok_s_avg'], ',.0f')} | "
            f"{_fmt(r['decode_tok_s_peak'], ',.0f')} | {r['output_tok_s']:,.0f} | "
            f"{_fmt(r['ttft_p50_s'], '.2f')} / {_fmt(r['ttft_p99_s'], '.2f')} | "
            f"{_fmt(r['step_ms_p50'], '.2f')} / {_fmt(r['step_ms_p99'], '.2f')} | {paths} | {shrinks} |")
    compiles = {p: len(r.get("compiles_during_run", {})) for p, r in result["policies"].items()}
    walls = {p: [round(r["wall_s"], 1) for r in rs] for p, rs in result["repeats"].items()}
    lines += ["", f"rows: the median-wall run of {s['repeats']}; wall s of every run: {walls}",
              f"compiles during the measured runs: {compiles}", "",
              f"Engine call costs (ms, chunk = {s['chunk']} prompt tokens):", "",
              "| call | ms |", "|---|---|"]
    c = result["call_ms"]
    lines += [f"| {name.replace('_', ' ')} | {c[name]:.2f} |" for name in
              ("serial_prefill_1x", "varlen_prefill_1x", "serial_prefill_split", "varlen_prefill_split")]
    lines += ["", "| bucket | decode step ms | mixed step (+chunk) ms |", "|---|---|---|"]
    lines += [f"| {b} | {c['decode_step'][b]:.2f} | {c['mixed_step'][b]:.2f} |" for b in c["decode_step"]]
    return "\n".join(lines) + "\n"


def plot(result: dict, path: Path) -> None:
    """Live decode rows and cumulative decode tokens over time, per policy (Agg backend)."""
    import matplotlib  # lazy: pyplot takes about a second to import and --no-plot runs without it
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (ax_live, ax_tok) = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
    for policy, r in result["policies"].items():
        if "skipped" in r:
            continue
        t, live = r["timeline"]["step_start_s"], r["timeline"]["live"]
        ax_live.plot(t, live, label=policy, lw=1)
        ax_tok.plot(t, np.cumsum(live), label=policy, lw=1)
    ax_live.set_ylabel("live decode rows")
    ax_tok.set_ylabel("decode tokens (cumulative)")
    ax_tok.set_xlabel("seconds since the first decode step")
    ax_live.legend()
    s = result["settings"]
    ax_live.set_title(f"{s['model']} {s['requests']} requests, prompts {s['prompt_len']}, chunk {s['chunk']}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def save(result: dict, out_dir: Path, tag: str, with_plot: bool = True) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"serving_{tag}.json"
    path.write_text(json.dumps(result, indent=1))
    (out_dir / f"serving_{tag}.md").write_text(markdown(result))
    if with_plot:
        plot(result, out_dir / f"serving_{tag}.png")
    return path


def gpu_check_section(out_dir: str, budget_s: float) -> dict:
    """The serving section of benchmarks/gpu_check.py: 0.1b-shape bf16 model (few layers, so
    compiles fit the budget), Pallas kernels, 128 requests (prompts 20–2000, outputs
    16–256), buckets 1/8/32/128, chunk 512. Writes serving_gpu.*; returns a summary."""
    result = run_serving_benchmark("0.1b", requests=128, prompt_len=(20, 2000), output_len=(16, 256),
                                   max_batch=128, buckets=(1, 8, 32, 128), chunk=512, dtype="bfloat16",
                                   kernels="pallas", prefill_pieces=(512, 64, 8, 1),
                                   budget_s=max(0.0, budget_s - 45))
    save(result, Path(out_dir), "gpu")
    keys = ("wall_s", "prefill_tok_s", "decode_tok_s_avg", "ttft_p50_s", "ttft_p99_s", "step_ms_p99",
            "path_mix", "skipped")
    return {"precompile_s": result["precompile_s"], "same_tokens": result["same_tokens_all_policies"],
            **{p: {k: r.get(k) for k in keys} for p, r in result["policies"].items()}}


def run_cli(argv=None) -> dict:
    """Parse argv, run, save and print the benchmark; returns its result."""
    ap = argparse.ArgumentParser(description="Serving benchmark: prefill policies on one seeded workload")
    ap.add_argument("--model", default="tiny", help="named shape: tiny, 0.1b, 0.4b, 1.5b, 2.9b (random weights)")
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"))
    ap.add_argument("--kernels", default="auto", choices=[k.value for k in Kernels])
    ap.add_argument("--requests", type=int, default=256)
    ap.add_argument("--prompt-len", type=int, nargs=2, default=(20, 2000), metavar=("MIN", "MAX"))
    ap.add_argument("--output-len", type=int, nargs=2, default=(16, 256), metavar=("MIN", "MAX"))
    ap.add_argument("--max-batch", type=int, default=64)
    ap.add_argument("--chunk", type=int, default=256, help="prompt tokens per varlen call / mixed step")
    ap.add_argument("--buckets", type=int, nargs="+", default=None, help="decode batch sizes (default 1, 2, 4, ...)")
    ap.add_argument("--prefill-pieces", type=int, nargs="+", default=None,
                    help="serial prefill piece sizes (must include 1; default the engine's 1..256 powers of two)")
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeats", type=int, default=1, help="runs per policy (interleaved); rows show the median")
    ap.add_argument("--out", default=str(RESULTS))
    ap.add_argument("--tag", default=None, help="file suffix (default: <backend>_<model>)")
    ap.add_argument("--smoke", action="store_true",
                    help="tiny model, 8 requests of 4-40 prompt tokens, one bucket of 2 (CI: < 1 minute)")
    ap.add_argument("--no-plot", action="store_true")
    ap.add_argument("--compile-cache", default=None, metavar="DIR",
                    help="persistent JAX compilation cache directory (reruns skip compiles)")
    args = ap.parse_args(argv)
    policies = tuple(p.strip() for p in args.policies.split(",") if p.strip())
    bad = [p for p in policies if p not in POLICIES]
    if bad:
        ap.error(f"unknown policies {bad}; choose from {POLICIES}")
    if min(args.prompt_len) < 1 or args.prompt_len[0] > args.prompt_len[1]:
        ap.error(f"--prompt-len needs 1 <= MIN <= MAX, got {args.prompt_len}")
    if min(args.output_len) < 1 or args.output_len[0] > args.output_len[1]:
        ap.error(f"--output-len needs 1 <= MIN <= MAX, got {args.output_len}")
    if args.compile_cache:
        rwkv_jax.enable_compilation_cache(args.compile_cache)
    pieces, buckets = args.prefill_pieces, args.buckets
    if args.smoke:  # few shapes to compile
        args.model, args.requests, args.prompt_len, args.output_len = "tiny", 8, (4, 40), (2, 8)
        args.max_batch, args.chunk, pieces, buckets = 2, 16, (16, 1), (2,)
    result = run_serving_benchmark(args.model, requests=args.requests, prompt_len=args.prompt_len,
                                   output_len=args.output_len, max_batch=args.max_batch, chunk=args.chunk,
                                   policies=policies, dtype=args.dtype, kernels=args.kernels, seed=args.seed,
                                   prefill_pieces=pieces, buckets=buckets, repeats=args.repeats)
    tag = args.tag or f"{'smoke' if args.smoke else jax.default_backend()}_{args.model}"
    path = save(result, Path(args.out), tag, with_plot=not args.no_plot)
    print(markdown(result))
    print(f"wrote {path}")
    return result


def main(argv=None) -> int:
    """The rwkv7-bench console script: exit status 0 after a run (errors raise)."""
    run_cli(argv)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
