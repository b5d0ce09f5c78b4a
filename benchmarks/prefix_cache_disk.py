"""Prefill time saved by the persistent (disk) prefix cache on a rerun of a job whose
prompts share a 1,000-token system prompt, on the CPU, random models of the tiny and 0.1b
shapes (float32).

Each scenario is a fresh Scheduler (so nothing is kept in memory between them; what a new
process sees), over the same requests: the shared system prompt plus 8-24 tokens of
question each, 4 greedy tokens out, max_batch 8, a 256 MB host prefix cache:

- ``memory_only``: the host LRU alone (a rerun before the disk tier: every run starts cold);
- ``disk_cold``: first run with ``--prefix-cache-dir`` on an empty directory (writes entries);
- ``disk_rerun``: the same job again, new scheduler, same directory: whole prompts hit.

Compilation is done before timing. ``prefill s`` sums each request's prefill (start of its
prefill, cache lookup included, to its first token drawn). Prints a table and writes
benchmarks/results/prefix_cache_disk.json.

    .venv/bin/python benchmarks/prefix_cache_disk.py [--models tiny,0.1b] [--backend jax|torch]
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

from rwkv7_apps.engines import cache_dir, load_engine, random_model_path
from rwkv7_apps.states import checkpoint_digest, model_fingerprint
from scheduler import Request, SamplingParams, Scheduler, SchedulerConfig
from scheduler.prefix_disk import DiskPrefixStore

RESULTS = Path(__file__).parent / "results"
SYSTEM_TOKENS = 1000


def job(vocab: int, n_requests: int, seed: int = 0) -> list[Request]:
    rng = np.random.default_rng(seed)
    system = rng.integers(1, vocab, SYSTEM_TOKENS).tolist()
    return [Request(f"q{i}", system + rng.integers(1, vocab, int(rng.integers(8, 25))).tolist(),
                    SamplingParams(max_tokens=4, stop_tokens=())) for i in range(n_requests)]


def run(engine, requests, store) -> dict:
    sched = Scheduler(engine, SchedulerConfig(max_batch=8, prefix_cache_bytes=256 << 20), prefix_store=store)
    for r in requests:
        sched.add(r)
    start = time.perf_counter()
    sched.run()
    wall = time.perf_counter() - start
    s = sched.stats
    ttft = sorted(r.ttft for r in s.requests)
    # per request: from the start of its prefill to its first token (JAX dispatches
    # asynchronously, so the engine call alone would not show the work); serial: no overlap
    prefill = sum(r.prefill_seconds or 0.0 for r in s.requests)
    return {"wall_s": round(wall, 3), "prefill_s": round(prefill, 3),
            "prefilled_tokens": sum(p.tokens for p in s.prefills),
            "prompt_tokens": sum(len(r.prompt_tokens) for r in requests),
            "prefix_hits": s.prefix_hits, "prefix_misses": s.prefix_misses,
            "ttft_p50_s": round(ttft[len(ttft) // 2], 4),
            "tokens": {r.id: sched.results[r.id].tokens for r in requests}}


def bench_model(name: str, backend: str, n_requests: int) -> dict:
    path = random_model_path(name)
    engine = load_engine(backend, path, "float32", "auto")
    if backend == "jax":
        engine.compile_prefill()
        engine.compile(SchedulerConfig(max_batch=8).validated().buckets)
    requests = job(engine.vocab_size, n_requests)
    run(engine, requests[:1], None)  # warm-up: first calls of every prefill piece
    with tempfile.TemporaryDirectory() as d:
        digest_start = time.perf_counter()
        checkpoint_digest(path, Path(d))  # what a first run hashes once (memoized afterwards)
        digest_s = time.perf_counter() - digest_start
        fingerprint = model_fingerprint(path, backend, engine, "float32", cache_dir())
        store = lambda: DiskPrefixStore(Path(d) / "cache", 4 << 30, fingerprint)  # noqa: E731
        out = {"memory_only": run(engine, requests, None), "disk_cold": run(engine, requests, store()),
               "disk_rerun": run(engine, requests, store())}
        disk_bytes = sum(f.stat().st_size for f in (Path(d) / "cache").iterdir())
    same = out["disk_rerun"]["tokens"] == out["memory_only"]["tokens"] == out["disk_cold"]["tokens"]
    for r in out.values():
        del r["tokens"]
    saved = out["memory_only"]["prefill_s"] - out["disk_rerun"]["prefill_s"]
    return {"model": name, "backend": backend, "requests": n_requests, "system_prompt_tokens": SYSTEM_TOKENS,
            "checkpoint_bytes": path.stat().st_size, "checkpoint_digest_s": round(digest_s, 3),
            "disk_bytes": disk_bytes, "same_tokens": same, "scenarios": out,
            "prefill_s_saved_on_rerun": round(saved, 3),
            "wall_s_saved_on_rerun": round(out["memory_only"]["wall_s"] - out["disk_rerun"]["wall_s"], 3)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="tiny,0.1b")
    p.add_argument("--backend", default="jax", choices=("jax", "torch"))
    p.add_argument("--requests", type=int, default=16)
    p.add_argument("--out", default=str(RESULTS / "prefix_cache_disk.json"))
    args = p.parse_args()
    load_before = os.getloadavg()  # the host is shared: the load says how much CPU the run had
    results = [bench_model(m, args.backend, args.requests) for m in args.models.split(",") if m]
    load_after = os.getloadavg()
    print(f"{'model':6} {'scenario':12} {'prefill s':>9} {'wall s':>7} {'prefilled':>9} {'hits':>5} {'TTFT p50':>9}")
    for r in results:
        for name, s in r["scenarios"].items():
            print(f"{r['model']:6} {name:12} {s['prefill_s']:9.3f} {s['wall_s']:7.3f} {s['prefilled_tokens']:9d} "
                  f"{s['prefix_hits']:5d} {s['ttft_p50_s']:9.4f}")
        print(f"{r['model']:6} rerun saves {r['prefill_s_saved_on_rerun']:.3f} s of prefill "
              f"({r['wall_s_saved_on_rerun']:.3f} s wall); same tokens: {r['same_tokens']}; "
              f"{r['disk_bytes'] / 2**20:.1f} MiB on disk; checkpoint hash {r['checkpoint_digest_s']:.2f} s (once)")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    print(f"load average (1 min) before / after: {load_before[0]:.1f} / {load_after[0]:.1f} on {os.cpu_count()} CPUs")
    Path(args.out).write_text(json.dumps({"machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                                                      "load_average_before_after": [load_before[0], load_after[0]]},
                                          "results": results}, indent=1) + "\n")


if __name__ == "__main__":
    main()
