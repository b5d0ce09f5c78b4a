"""Section deviceless: an executable compiled for the H200 description without a device,
loaded on this GPU and run against the same forward compiled here."""
from __future__ import annotations

import time

import jax
import jax.numpy as jnp

from benchmarks.gpu_checks.common import block, diff, executables_for, params_for, skipped
from benchmarks.gpu_checks.schedule import DEVICELESS_S, Budget
from rwkv7_core.config import named_config
from rwkv_jax import deviceless
from rwkv_jax.model import Model


def run_deviceless(smoke: bool, budget: Budget) -> dict:
    """Deviceless H200 compile of a tiny forward (B=2, T=1), serialized; on a GPU also loaded
    and run against the same forward compiled on the device (exact equality expected: both
    are XLA:GPU compiles of one program for sm_90; any other GPU records a load error)."""
    reason = budget.shortfall(DEVICELESS_S)
    if reason:
        return skipped(reason)

    config, B = named_config("tiny"), 2
    target = deviceless.load_target("h200")
    kernels = "xla" if smoke else "pallas"
    engine = deviceless.abstract_engine(config, "float32", kernels, target)
    t0 = time.perf_counter()
    compiled = engine.lower(("forward", (B, 1, False))).compile()
    blob = deviceless.serialize(compiled)
    out = {"target": target.device, "kernels": kernels, "compile_s": time.perf_counter() - t0,
           "serialized_bytes": len(blob)}
    if smoke:
        return {**out, "loaded": False, "ok": True, "note": "loading needs a GPU"}
    local = Model(params_for(config, jnp.float32), config, jnp.float32, kernels)  # default precision
    tokens = jax.random.randint(jax.random.key(5), (B, 1), 0, config.vocab_size)
    want = block(executables_for(local).get(("forward", (B, 1, False)))(local.params, tokens, local.init_state(B)))
    got = block(deviceless.deserialize(blob)(local.params, tokens, local.init_state(B)))
    d = diff(jax.tree.leaves(got), jax.tree.leaves(want))
    return {**out, "loaded": True, "max_abs_diff": d["max_abs_err"], "ok": d["max_abs_err"] == 0.0}
