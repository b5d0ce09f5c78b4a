"""On-device self-check of a kernel choice against the XLA ops, before ``kernels="auto"`` adopts it.

``check_decode`` runs STEPS B=1 decode steps of a model with the candidate kernels and with XLA
from the same random state and tokens, and returns None when logits and state agree within
the dtype's tolerance, else the reason; for the kernels whose decode step samples with the
Pallas threshold search (``pallas-fused``, ``mosaic``: ``kernels.sampler_form``) it also runs
that search (``check_search``) against XLA's on random rows. ``cached_check`` keeps each verdict
in a JSON file beside the persistent compilation cache (``jax_compilation_cache_dir``; in
memory without one), keyed by device kind, jax version,
model shape, dtype, quantization (scheme and group size) and candidate, so a process pays the
check (a few compiles and milliseconds) once per combination. A kept pass of the native CPU
kernels still needs them built in this process (``cpu_kernels.library.load``): where they no
longer can be (the compiler gone), the candidate fails with that reason instead.
"""
from __future__ import annotations

import functools
import json
import os
from pathlib import Path as FsPath

import jax
import jax.numpy as jnp
import numpy as np

from cpu_kernels import library
from cpu_kernels.library import NativeKernelsUnavailable
from pallas_kernels import radix_search
from rwkv7_core.config import ModelConfig
from rwkv7_core.quantization import QuantSpec

from .forward import forward_fn
from .kernels import INTERPRETED, Kernels, sampler_form
from .modules import quant_spec_of
from .paths import Path
from .sampling import SearchForm
from .state import init_state

STEPS = 3
# max |difference| of logits and state / max |reference|: float32 sums in a different order
# differ by ~1e-6; a bf16 / fp16 model rounds its activations differently along the way
TOLERANCE = {"float32": 1e-3, "bfloat16": 5e-2, "float16": 2e-2}
VERDICTS_FILE = "rwkv7_kernel_self_checks.json"
_MEMORY: dict[str, str | None] = {}


def check_decode(params: dict, config: ModelConfig, dtype, candidate: Kernels, *, forward=forward_fn,
                 search=radix_search.smallest_key, device: jax.Device | None = None, seed: int = 0) -> str | None:
    """None if `candidate`'s B=1 decode steps equal XLA's within TOLERANCE on `device` (JAX's
    default: None), and with the fused kernels its sampler search too, else the reason.
    `forward` has ``forward_fn``'s signature, `search` ``radix_search.smallest_key``'s (a test
    passes a wrong kernel through them)."""
    with jax.default_device(device):
        try:
            reason = _compare(params, config, dtype, candidate, forward, seed)
        except NativeKernelsUnavailable as e:
            return str(e)
        if reason is None and sampler_form(_compiled(candidate)) is SearchForm.PALLAS:
            reason = check_search(search, interpret=candidate in INTERPRETED, seed=seed)
        return reason


def _compiled(kind: Kernels) -> Kernels:
    """The compiled family of an interpreted one (whose decode step samples as the compiled one's)."""
    return {Kernels.PALLAS_FUSED_INTERPRET: Kernels.PALLAS_FUSED, Kernels.MOSAIC_INTERPRET: Kernels.MOSAIC}.get(kind, kind)


def check_search(search, interpret: bool, seed: int = 0) -> str | None:
    """None if `search` finds the thresholds XLA's unrolled passes find (top-k counts and
    top-p masses on 4 random rows of 4,096 keys, a tie and banned keys among them), else why not."""
    rng = np.random.default_rng(seed)
    z = (rng.standard_normal((4, 4096)) * np.array([[0.5], [2.0], [4.0], [8.0]])).astype(np.float32)
    z[0, :3], z[1, 5:50] = z[0].max() + 1.0, -np.inf
    z = jnp.asarray(z)
    keys, weights = radix_search.signed_keys(z), jnp.exp(z - z.max(axis=1, keepdims=True))
    for mass, limit in ((False, [1, 9, 300, 4096]), (True, [0.05, 0.5, 0.9, 1.0])):
        limit, w = jnp.asarray(limit, jnp.float32), weights if mass else None
        got = jax.jit(functools.partial(search, mass=mass, interpret=interpret))(keys, w, limit)
        want = radix_search.smallest_key_reference(keys, w, limit, mass, unrolled=True)
        if not np.array_equal(np.asarray(got), np.asarray(want)):
            return f"the sampler's {'top-p' if mass else 'top-k'} threshold search differs from XLA's"
    return None


def _compare(params, config, dtype, candidate, forward, seed) -> str | None:
    step = jax.jit(forward, static_argnames=("config", "path", "kernels"))
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, config.vocab_size, (STEPS, 1, 1)).astype(np.int32)
    start = init_state(config, 1, dtype)
    keys = jax.random.split(jax.random.key(seed), len(start))
    start = type(start)(*(0.5 * jax.random.normal(k, leaf.shape).astype(leaf.dtype) for k, leaf in zip(keys, start)))
    results = []
    for kernels in (candidate, Kernels.XLA):
        state, logits = jax.tree.map(jnp.copy, start), []
        for t in tokens:
            out, state = step(params, jnp.asarray(t), state, config=config, path=Path.B1T1, kernels=kernels)
            logits.append(out)
        results.append((jnp.stack(logits), state))
    tolerance = TOLERANCE[jnp.dtype(dtype).name]
    for name, got, want in zip(("logits", *start._fields), jax.tree.leaves(results[0]), jax.tree.leaves(results[1])):
        got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)
        if not np.isfinite(got).all():
            return f"{name} not finite"
        error = float(np.abs(got - want).max() / max(float(np.abs(want).max()), 1e-30))
        if not error <= tolerance:
            return f"{name} differ from XLA's by {error:.3g} of their scale (tolerance {tolerance:g})"
    return None


def verdict_key(config: ModelConfig, dtype, candidate: Kernels, quant: QuantSpec | None = None) -> str:
    """The combination a verdict holds for (quant: the weights' quantization, None for plain)."""
    shape = ",".join(f"{k}={v}" for k, v in sorted(config._asdict().items()))
    scheme = "none" if quant is None else quant.describe()
    return "|".join((jax.devices()[0].device_kind, jax.__version__, shape, jnp.dtype(dtype).name, scheme,
                     candidate.value))


def verdicts_path() -> FsPath | None:
    """The verdicts file beside the persistent compilation cache, or None without one."""
    directory = jax.config.jax_compilation_cache_dir or os.environ.get("JAX_COMPILATION_CACHE_DIR")
    return FsPath(directory) / VERDICTS_FILE if directory else None


def cached_check(params: dict, config: ModelConfig, dtype, candidate: Kernels, *, forward=forward_fn,
                 search=radix_search.smallest_key, device: jax.Device | None = None) -> str | None:
    """`check_decode`'s verdict, run once per `verdict_key` (kept in `verdicts_path()`)."""
    if candidate is Kernels.NATIVE:
        try:  # a kept verdict says the kernels passed, not that this process can still build them
            library.load()
        except NativeKernelsUnavailable as e:
            return str(e)
    key = verdict_key(config, dtype, candidate, quant_spec_of(params))
    path = verdicts_path()
    stored = dict(_MEMORY)
    if path is not None and path.exists():
        stored.update(json.loads(path.read_text()))
    if key not in stored:
        stored[key] = check_decode(params, config, dtype, candidate, forward=forward, search=search, device=device)
        _MEMORY[key] = stored[key]
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(stored, indent=1, sort_keys=True))
            tmp.replace(path)
    return stored[key]
