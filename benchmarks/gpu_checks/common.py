"""What every section uses: a row recorded whatever happens (``attempt``, ``failures``), the
kernels option names, the run's random params / models / executables made once, the parity
measure (``diff``, ``within``) and the timing loop (``time_calls``)."""
from __future__ import annotations

import functools
import time

import jax
import jax.numpy as jnp
import numpy as np

from rwkv7_core.config import ModelConfig
from rwkv_jax.engine import JaxEngine
from rwkv_jax.model import Model
from rwkv_jax.random_params import random_params

TOL = 1e-4                    # float32 parity: max |diff| <= TOL * max(1, max |reference|)
ODD = ModelConfig(n_layer=3, n_embd=192, n_head=3, head_size=64, vocab_size=300, dim_ffn=768,
                  d_decay=24, d_aaa=40, d_mv=20, d_gate=56)


def skipped(reason: str) -> dict:
    return {"status": "skipped", "reason": reason}


def attempt(row: dict, fn, *args, **kwargs) -> dict:
    """row updated with fn(...)'s dict, or with the error: one failing kernel or model must
    not cost the rest of a one-shot GPU run."""
    try:
        row.update(fn(*args, **kwargs))
    except Exception as e:  # recorded in the report, never hidden
        row.update({"error": f"{type(e).__name__}: {str(e)[:600]}", "ok": False})
    return row


def failures(tree) -> int:
    """Entries of a section's results that errored or are not ok."""
    if isinstance(tree, dict):
        return int("error" in tree or tree.get("ok") is False) + sum(failures(v) for v in tree.values())
    if isinstance(tree, list):
        return sum(failures(v) for v in tree)
    return 0


def block(tree):
    return jax.block_until_ready(tree)


def kernel_names(interpret: bool) -> tuple[str, str, str]:
    """(fused, pallas, xla) kernels option names, interpreted in --smoke."""
    suffix = "-interpret" if interpret else ""
    return f"pallas-fused{suffix}", f"pallas{suffix}", "xla"


def cpu_device():
    """The CPU device for reference models, None when the default device is the CPU."""
    return None if jax.default_backend() == "cpu" else jax.devices("cpu")[0]


@functools.lru_cache(maxsize=None)


def params_for(config: ModelConfig, dtype) -> dict:
    """The random params (seed 0) of a config, made once per run; small shapes (tiny, ODD)
    drawn on the host, which compiles nothing."""
    return block(random_params(config, dtype, seed=0, host=config.n_embd <= 256))


@functools.lru_cache(maxsize=None)


def model_for(config: ModelConfig, dtype, kernels: str, device=None, state_dtype=jnp.float32) -> Model:
    """One Model per (config, dtype, kernels, device, state dtype), so each executable compiles once a run."""
    return Model(params_for(config, dtype), config, dtype, kernels, device, state_dtype)


@functools.lru_cache(maxsize=None)


def executables_for(model: Model):
    """One engine's executable cache per Model, so each forward compiles once a run."""
    return JaxEngine(model).executables


def diff(got, want) -> dict:
    """Max |got - want| over paired arrays (as float32), the max |want| and finiteness."""
    pairs = [(np.asarray(g, np.float32), np.asarray(w, np.float32)) for g, w in zip(got, want)]
    return {"max_abs_err": max(float(np.abs(g - w).max()) for g, w in pairs),
            "max_abs_ref": max(float(np.abs(w).max()) for _, w in pairs),
            "finite": all(bool(np.isfinite(g).all()) for g, _ in pairs)}


def within(d: dict, tol: float) -> bool:
    """ok for a diff(): finite and within tol * max(1, max |reference|) (ulps grow with it)."""
    return d["finite"] and d["max_abs_err"] <= tol * max(1.0, d["max_abs_ref"])


def time_calls(fn, argsets, min_time_s: float = 0.3) -> float:
    """Seconds per call of fn, from one jit that runs fn on each of the argument sets
    (distinct inputs, so nothing is shared or merged) repeated until min_time_s passes."""
    many = jax.jit(lambda sets: [fn(*a) for a in sets])
    block(many(argsets))
    start, n = time.perf_counter(), 0
    while True:
        out = many(argsets)
        n += 1
        if n >= 3 and time.perf_counter() - start >= min_time_s:
            break
        if n % 4 == 0:
            block(out)
    block(out)
    return (time.perf_counter() - start) / (n * len(argsets))
