"""Section roofline: the copy bandwidth and bf16 matmul rate the decode and prefill rows are
measured against."""
from __future__ import annotations

import jax
import jax.numpy as jnp

from benchmarks.gpu_checks.common import time_calls


def run_roofline(smoke: bool) -> dict:
    """Copy bandwidth (read + write of a large buffer) and bf16 matmul rate."""
    n_bytes = (16 << 20) if smoke else (2 << 30)
    x = jnp.ones((n_bytes // 4,), jnp.float32)
    bw = 2 * n_bytes / time_calls(lambda a: a + 1.0, [(x,)], 0.05 if smoke else 0.5)
    n = 256 if smoke else 8192
    a = jax.random.normal(jax.random.key(0), (n, n)).astype(jnp.bfloat16)
    b = jax.random.normal(jax.random.key(1), (n, n)).astype(jnp.bfloat16)
    rate = 2 * n ** 3 / time_calls(lambda p, q: p @ q, [(a, b)], 0.05 if smoke else 0.5)
    return {"copy_bytes": n_bytes, "copy_GBps": bw / 1e9, "matmul_n": n, "bf16_matmul_TFLOPs": rate / 1e12}
