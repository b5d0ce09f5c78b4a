"""Scheduler benchmark: (a) host overhead per decode step at 256 live rows with a zero-cost
engine (goal <= 0.2 ms); (b) 64-request runs of the JAX engine on CPU with the tiny and the
0.1b-shape random models, precompiled buckets: bucket timeline, compile seconds per bucket,
and the worst inter-step gap at a shrink over the median gap in the bucket shrunk from
(goal <= 1.5x). For scale, "no-shrink p95" is the 95th percentile of ordinary gaps
(same bucket before and after) over their median: the host's own jitter.

    .venv/bin/python benchmarks/scheduler_bench.py [--models tiny,0.1b] [--quick]

Prints a table and writes benchmarks/results/scheduler_bench.json.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from pathlib import Path

import numpy as np

from scheduler import Request, SamplingParams, Scheduler, SchedulerConfig

RESULTS = Path(__file__).parent / "results"


class ZeroCostEngine:
    """Engine protocol with no model: every step returns token 1 for every slot."""
    capabilities = frozenset()
    vocab_size = 65536
    last_path = "none"
    config, dtype, kernels, device, prefill_pieces = None, "none", "none", None, ()  # no model

    def __init__(self):
        self.bucket = 0
        self._out = np.ones(0, np.int32)

    def compile(self, buckets):
        return {b: 0.0 for b in buckets}

    def prefill(self, tokens, start=None):
        return None, None

    def sample(self, row, params, position=0):
        return 1

    def insert(self, slot, row, params):
        pass

    def extract(self, slot):
        return None, None

    def resize(self, keep_slots, new_bucket):
        self.bucket = new_bucket
        self._out = np.ones(new_bucket, np.int32)

    def step(self, tokens, positions):
        return self._out

    def to_host(self, row):
        return ()

    def from_host(self, host_row):
        return None, None


def step_gaps(steps) -> np.ndarray:
    """Seconds between consecutive step starts (len(steps) - 1)."""
    return np.diff([s.time for s in steps])


def overhead_bench(rows: int = 256, tokens: int = 400) -> dict:
    """Host time per step that is not engine.step, at the fullest batch the run reached
    (`rows` live rows, unless a slow prefill thread let early rows finish before the last
    ones joined: then the most live rows seen, reported as `measured_at_rows`)."""
    result = {}
    for label, on_token in (("no_callback", None), ("with_on_token", lambda i, t: None)):
        scheduler = Scheduler(ZeroCostEngine(), SchedulerConfig(max_batch=rows))
        for i in range(rows):
            scheduler.add(Request(f"r{i}", [1], SamplingParams(max_tokens=tokens, stop_tokens=())))
        start = time.perf_counter()
        scheduler.run(on_token=on_token)
        wall = time.perf_counter() - start
        steps = scheduler.stats.steps
        top = max(s.live for s in steps)
        full = [i for i in range(len(steps) - 1) if steps[i].live == top and steps[i + 1].live == top]
        gaps = step_gaps(steps)
        overhead = np.array([gaps[i] - steps[i].seconds for i in full]) * 1e3
        result[label] = {"measured_at_rows": top, "steps_at_full_batch": len(full), "overhead_ms_median": float(np.median(overhead)),
                         "overhead_ms_p90": float(np.percentile(overhead, 90)),
                         "overhead_ms_max": float(overhead.max()), "run_seconds": wall,
                         "generated_tokens": sum(r.generated_tokens for r in scheduler.stats.requests)}
    return result


def workload(vocab: int, n: int = 64, seed: int = 0) -> list[Request]:
    """n greedy requests: prompts of 8-64 tokens, 8-64 new tokens."""
    rng = np.random.default_rng(seed)
    return [Request(f"q{i}", rng.integers(1, vocab, int(rng.integers(8, 65))).tolist(),
                    SamplingParams(max_tokens=int(rng.integers(8, 65)), stop_tokens=()))
            for i in range(n)]


def shrink_gaps(steps, switches, prefills) -> list[dict]:
    """For each shrink between two steps: the gap spanning it over the median gap between
    consecutive steps of the bucket it shrank from, and whether a prefill (which shares the
    CPU cores) overlapped that gap."""
    gaps = step_gaps(steps)
    out = []
    for sw in switches:
        if sw.to_bucket >= sw.from_bucket:
            continue
        k = max(i for i, s in enumerate(steps) if s.time < sw.time)
        if k + 1 >= len(steps):
            continue
        same = [gaps[i] for i in range(len(gaps)) if steps[i].bucket == steps[i + 1].bucket == sw.from_bucket]
        if not same:
            continue
        median = float(np.median(same))
        noise = float(np.percentile(same, 95)) / median
        lo, hi = steps[k].time, steps[k + 1].time
        overlap = any(p.time < hi and p.time + p.seconds > lo for p in prefills)
        out.append({"from": sw.from_bucket, "to": sw.to_bucket, "live": sw.live, "resize_ms": sw.seconds * 1e3,
                    "gap_ms": float(gaps[k]) * 1e3, "median_gap_ms": median * 1e3,
                    "ratio": float(gaps[k]) / median, "prefill_overlapped": overlap,
                    "ordinary_gap_p95_ratio": noise})
    return out


def model_bench(name: str, max_batch: int, n_requests: int) -> dict:
    import rwkv_jax
    from rwkv7_core.config import named_config
    from rwkv7_core.random_weights import write_random_checkpoint
    from rwkv_jax.engine import JaxEngine

    config = named_config(name)
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "model.safetensors")
        write_random_checkpoint(path, config, seed=0)
        model = rwkv_jax.load(path, dtype="float32")
    engine = JaxEngine(model, prefill_pieces=(64, 16, 4, 1))
    start = time.perf_counter()
    prefill_compiles = engine.compile_prefill()
    prefill_compile_s = time.perf_counter() - start
    requests = workload(config.vocab_size, n_requests)
    scheduler = Scheduler(engine, SchedulerConfig(max_batch=max_batch, precompile=True))
    for r in requests:
        scheduler.add(r)
    start = time.perf_counter()
    scheduler.run()
    wall = time.perf_counter() - start
    stats = scheduler.stats
    t0 = min(r.arrival_time for r in stats.requests)
    steps = stats.steps
    decode_tokens = sum(s.live for s in steps)
    shrinks = shrink_gaps(steps, stats.switches, stats.prefills)
    quiet = [s["ratio"] for s in shrinks if not s["prefill_overlapped"]]
    per_bucket = {}
    for s in steps:
        per_bucket.setdefault(s.bucket, []).append(s.seconds)
    return {
        "model": name, "config": config._asdict(), "requests": n_requests, "max_batch": max_batch,
        "wall_seconds_incl_precompile": wall,
        "compile_seconds_per_bucket": {c.what: c.seconds for c in stats.compiles},
        "prefill_compile_seconds": {str(k): v for k, v in prefill_compiles.items()},
        "prefill_compile_total_seconds": prefill_compile_s,
        "steps": len(steps), "decode_tokens": decode_tokens,
        "median_step_ms_per_bucket": {b: float(np.median(v)) * 1e3 for b, v in sorted(per_bucket.items())},
        "decode_seconds": sum(s.seconds for s in steps),
        "prefill_seconds": sum(p.seconds for p in stats.prefills),
        "prefill_tokens": sum(p.tokens for p in stats.prefills),
        "bucket_timeline": [{"t": sw.time - t0, "from": sw.from_bucket, "to": sw.to_bucket, "live": sw.live,
                             "resize_ms": sw.seconds * 1e3} for sw in stats.switches],
        "shrinks": shrinks,
        "worst_shrink_gap_ratio": max((s["ratio"] for s in shrinks), default=None),
        "median_shrink_gap_ratio": float(np.median([s["ratio"] for s in shrinks])) if shrinks else None,
        "worst_shrink_gap_ratio_no_prefill": max(quiet, default=None),
        "ordinary_gap_p95_over_median_max": max((s["ordinary_gap_p95_ratio"] for s in shrinks), default=None),
        "all_ok": all(r.finish_reason == "length" for r in stats.requests),
    }


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="tiny,0.1b")
    parser.add_argument("--quick", action="store_true", help="small run (smoke test)")
    parser.add_argument("--out", default=str(RESULTS / "scheduler_bench.json"))
    args = parser.parse_args(argv)
    result = {"machine": {"platform": platform.platform(), "cpus": os.cpu_count(),
                          "load_average_at_start": os.getloadavg()},
              "overhead": overhead_bench(tokens=50 if args.quick else 400), "models": []}
    o = result["overhead"]
    print("(a) scheduler overhead per decode step, 256 live rows, zero-cost engine (goal <= 0.2 ms)")
    print(f"{'':16}{'median ms':>10}{'p90 ms':>10}{'max ms':>10}{'steps':>8}")
    for label, r in o.items():
        print(f"{label:16}{r['overhead_ms_median']:10.3f}{r['overhead_ms_p90']:10.3f}{r['overhead_ms_max']:10.3f}"
              f"{r['steps_at_full_batch']:8d}")
    sizes = {"tiny": 64, "0.1b": 16}
    for name in [m for m in args.models.split(",") if m]:
        n = 16 if args.quick else 64
        result["models"].append(model_bench(name, min(sizes.get(name, 16), n), n))
    if result["models"]:
        print("\n(b) JAX engine on CPU, 64 requests, precompiled buckets (goal: worst shrink gap <= 1.5x median)")
        print(f"{'model':6}{'max_batch':>10}{'steps':>7}{'decode tok/s':>13}{'shrink gap worst':>17}"
              f"{'median':>8}{'worst w/o prefill':>18}{'no-shrink p95':>14}  compile s per bucket")

        def ratio(x):
            return "n/a" if x is None else f"{x:.2f}x"
        for m in result["models"]:
            tok_s = m["decode_tokens"] / m["decode_seconds"]
            compiles = " ".join(f"{b}:{s:.1f}" for b, s in m["compile_seconds_per_bucket"].items())
            print(f"{m['model']:6}{m['max_batch']:10d}{m['steps']:7d}{tok_s:13.1f}"
                  f"{ratio(m['worst_shrink_gap_ratio']):>17}{ratio(m['median_shrink_gap_ratio']):>8}"
                  f"{ratio(m['worst_shrink_gap_ratio_no_prefill']):>18}"
                  f"{ratio(m['ordinary_gap_p95_over_median_max']):>14}  {compiles}")
        for m in result["models"]:
            print(f"\n{m['model']} bucket timeline (t s: from->to live, resize ms):")
            print("  " + ", ".join(f"{e['t']:.2f}: {e['from']}->{e['to']} ({e['live']}, {e['resize_ms']:.1f})"
                                   for e in m["bucket_timeline"]))
            print("  shrink gaps: " + ", ".join(f"{s['from']}->{s['to']}: {s['gap_ms']:.1f} ms vs median "
                                                 f"{s['median_gap_ms']:.1f} ms ({s['ratio']:.2f}x"
                                                 f"{', prefill running' if s['prefill_overlapped'] else ''})"
                                                 for s in m["shrinks"]))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
