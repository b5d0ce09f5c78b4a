"""Section data_parallel: batch-generation throughput on one GPU against a replica on every
local GPU (skipped unless there are several)."""
from __future__ import annotations

import tempfile
import time
from pathlib import Path as FsPath

import jax
import numpy as np

from benchmarks.gpu_checks.common import skipped
from benchmarks.gpu_checks.schedule import SECTION_MIN_S, Budget
from rwkv7_apps.engines import load_engines
from rwkv7_core.config import named_config
from rwkv7_core.random_weights import write_random_checkpoint
from scheduler import Request, SamplingParams, Scheduler, SchedulerConfig
from scheduler.replicas.build import build_replica_set


def run_data_parallel(smoke: bool, budget: Budget) -> dict:
    """Batch-generation throughput (0.1b shape, bf16) on one GPU vs a replica on every local
    GPU (scheduler.replicas), same workload per GPU; skipped unless several devices."""
    devices = jax.local_devices()
    if smoke or len(devices) < 2:
        return skipped(f"{len(devices)} local device(s); needs 2 or more")
    reason = budget.shortfall(SECTION_MIN_S)
    if reason:
        return skipped(reason)

    with tempfile.TemporaryDirectory() as d:
        path = FsPath(d) / "model.safetensors"
        write_random_checkpoint(path, named_config("0.1b"), seed=0)
        engines = load_engines("jax", path, "bfloat16", "auto", list(range(len(devices))))
    config = SchedulerConfig(max_batch=128, precompile=True)
    rng = np.random.default_rng(0)
    rows = {}
    for label, n in (("1 device", 1), (f"{len(devices)} devices", len(devices))):
        sched = (Scheduler(engines[0], config) if n == 1
                 else build_replica_set(engines, [str(x) for x in devices], config))
        for measured in (False, True):  # the first pass compiles
            reqs = [Request(f"{measured}-{i}", rng.integers(1, 65536, size=128).tolist(),
                            SamplingParams(max_tokens=256 if measured else 8)) for i in range(128 * n)]
            for r in reqs:
                sched.add(r)
            start = time.perf_counter()
            tokens = []
            sched.run(on_finish=lambda out: tokens.append(out.generated_tokens))  # noqa: B023 - called in this iteration
            seconds = time.perf_counter() - start
        rows[label] = {"replicas": n, "seconds": seconds, "tok_s": sum(tokens) / seconds}
    one, every = rows["1 device"]["tok_s"], rows[f"{len(devices)} devices"]["tok_s"]
    return {"runs": rows, "scaling_efficiency": every / (len(devices) * one)}
