"""gpu_check's Mosaic GPU section: the self-check of ``kernels="mosaic"`` on the device, then
decode rows for mosaic beside pallas-fused at B = 1, 8, 32, 256 (1.5b bf16; tiny float32 and
the interpreted kernels in --smoke), and the op table (``rwkv_jax.mosaic_ops.MOSAIC_TABLE``)
saying which lowering ran each op. On jax < 0.11 the section records why it was skipped.
"""
from __future__ import annotations

import time
from typing import Callable, Iterator

import jax.numpy as jnp

from rwkv7_core.config import named_config
from rwkv_jax.kernels import MOSAIC_MIN_JAX, Kernels, jax_version
from rwkv_jax.random_params import random_params
from rwkv_jax.self_check import check_decode

BATCHES = (1, 8, 32, 256)


def run_mosaic(smoke: bool, interpret: bool, row: Callable[[str, str, int], dict]) -> Iterator[dict]:
    """Yields the section's results after each item. row(model name, kernels, B) measures one
    decode forward row (gpu_check's ``model_row`` with its roofline, budget and clock bound)."""
    if jax_version() < MOSAIC_MIN_JAX:
        yield {"status": "skipped", "reason": "kernels=mosaic needs jax >= 0.11 (Pallas Mosaic GPU)"}
        return
    from rwkv_jax.mosaic_ops import MOSAIC_TABLE  # imports Pallas Mosaic GPU: jax >= 0.11 only

    suffix = "-interpret" if interpret else ""
    mosaic, fused = f"mosaic{suffix}", f"pallas-fused{suffix}"
    out: dict = {"table": [{"op": c.op, "lowering": c.lowering(interpret).value, "reason": c.reason}
                           for c in MOSAIC_TABLE], "rows": []}
    config = named_config("tiny")
    start = time.perf_counter()
    try:
        reason = check_decode(random_params(config, jnp.float32, seed=0, host=True), config, jnp.float32,
                              Kernels(mosaic))
        out["self_check"] = {"verdict": reason or "passed", "ok": reason is None}
    except Exception as e:  # recorded; the decode rows still run
        out["self_check"] = {"error": f"{type(e).__name__}: {str(e)[:600]}", "ok": False}
    out["self_check"]["seconds"] = time.perf_counter() - start
    yield out
    name = "tiny" if smoke else "1.5b"
    for B in (1,) if smoke else BATCHES:
        for kernels in (mosaic, fused):
            out["rows"].append(row(name, kernels, B))
            yield out
