"""`rwkv_jax.load`: the user-facing JAX RWKV-7 model (weights, config and a jitted forward)."""
from __future__ import annotations

import functools
import logging
import os
from collections import Counter

import jax
import jax.numpy as jnp
from flax import nnx

from rwkv7_core.checkpoint import read_checkpoint
from rwkv7_core.config import ModelConfig
from rwkv7_core.quantization import resolve_spec, stored_spec
from rwkv7_core.state import DEFAULT_STATE_DTYPE, check_state_dtype, check_tokens

from .compilation import compiler_options, platform_of, slow_weights_note
from .forward import forward_fn
from .kernels import Kernels, ops_for, require_platform, resolve
from .modules import RWKV7
from .paths import Path, select_path
from .self_check import cached_check
from .state import State, check_state, init_state

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}
log = logging.getLogger(__name__)


class Model:
    """A loaded RWKV-7 model. `forward` consumes (donates) the state passed to it.

    Attributes: config (ModelConfig), dtype, state_dtype (the wkv state's, see
    rwkv7_core.state), kernels (a resolved Kernels), device (the
    jax.Device the weights live on and every executable runs on; None = JAX's default),
    params (pure dict of per-layer weights), last_path (Path of the last forward), path_counts (Counter of
    Path -> calls). ``forward`` is jitted (one trace per (B, T, full_output)); the engine's
    executables, the forward's among them, are compiled ahead of time by ``rwkv_jax.engine.JaxEngine``.
    """

    def __init__(self, params: dict, config: ModelConfig, dtype, kernels: str | Kernels,
                 device: jax.Device | None = None, state_dtype=jnp.float32):
        self.device = device
        self.params = params if device is None else jax.device_put(params, device)
        self.config, self.dtype, self.state_dtype = config, dtype, state_dtype
        self.kernels = resolve(kernels, self_check=functools.partial(cached_check, self.params, config, dtype,
                                                                     device=device))
        require_platform(self.kernels, platform_of(self.params))
        note = slow_weights_note(platform_of(self.params), dtype) if self.kernels is Kernels.XLA else None
        if note is not None:
            log.warning(note)
        self.last_path: Path | None = None
        self.path_counts: Counter = Counter()
        self._forward = jax.jit(forward_fn, static_argnames=("config", "path", "kernels", "full_output"),
                                donate_argnames="state", compiler_options=compiler_options(platform_of(self.params)))

    def on_device(self):
        """Context in which new arrays and lowered executables land on ``device``."""
        return jax.default_device(self.device)

    def init_state(self, batch_size: int) -> State:
        """Fresh zero State for `batch_size` sequences on ``device`` (see rwkv_jax.state.State)."""
        with self.on_device():
            return init_state(self.config, batch_size, self.dtype, self.state_dtype)

    def forward(self, tokens, state: State, full_output: bool = False):
        """tokens int [B, T] (numpy or jax); state State of batch B (consumed)
        -> (logits float32 [B, V], or [B, T, V] with full_output; new State)."""
        tokens = check_tokens(tokens, self.config.vocab_size)
        B, T = tokens.shape
        state = check_state(state, self.config, B, self.dtype, self.state_dtype)
        path = select_path(B, T)
        with self.on_device():
            logits, state = self._forward(self.params, jnp.asarray(tokens, jnp.int32), state, config=self.config,
                                          path=path, kernels=self.kernels, full_output=bool(full_output))
        self.last_path = path
        self.path_counts[path] += 1
        return logits, state


def load(path: str | os.PathLike, dtype: str = "float32", kernels: str | Kernels = "xla",
         device: jax.Device | int | None = None, quantization: str = "none",
         group_size: int | None = None, state_dtype: str = DEFAULT_STATE_DTYPE) -> Model:
    """Load a .pth or .safetensors RWKV-7 checkpoint, or a Hugging Face RWKV7ForCausalLM model
    directory (.safetensors and directories need no torch).

    dtype: float32 | bfloat16 | float16 weights and activations (the wkv recurrence, decay, kk
    and relu^2 stay float32). kernels: xla | native (CPU: the native CPU kernels, ``cpu_kernels``) |
    pallas | pallas-fused | pallas-interpret | pallas-fused-interpret | mosaic | mosaic-interpret |
    auto (on a GPU pallas-fused once its self-check passes, else pallas; on the CPU native once
    its self-check passes, else xla; resolved by Model). device: where the weights are put once and every
    executable runs: a jax.Device, an index into ``jax.local_devices()``, or None (JAX's
    default device). quantization: none | int8 | int4 | fp8 weight-only quantization of the
    large projections (``rwkv7_core.quantization``; group_size: int8 / int4 input channels per
    scale, default ``DEFAULT_GROUP_SIZE``); a checkpoint saved quantized loads only with its own
    scheme. Every kernel choice takes quantized weights (the Pallas ones dequantize in
    registers: ``pallas_kernels.quantized_linear``). state_dtype: float32 | bfloat16 | float16,
    the dtype the wkv state is held in between calls (``rwkv7_core.state``; every kernel choice
    reads and writes it, the recurrence runs in float32).
    """
    if dtype not in DTYPES:
        raise ValueError(f"dtype {dtype!r} not supported; choose one of {sorted(DTYPES)}")
    check_state_dtype(state_dtype)
    device = local_device(device)
    ops_for(Path.B1T1, kernels)  # fail now, not at the first call, if the kernels are missing
    tensors, config = read_checkpoint(path)
    quant = resolve_spec(quantization, group_size, stored_spec(tensors.metadata), str(path))
    _, params = nnx.split(RWKV7(config, tensors, DTYPES[dtype], quant))
    return Model(nnx.to_pure_dict(params), config, DTYPES[dtype], kernels, device, DTYPES[state_dtype])


def local_device(device: jax.Device | int | None) -> jax.Device | None:
    """A jax.Device for ``device`` (an index into ``jax.local_devices()`` or a Device);
    ValueError naming the devices there are for an index out of range."""
    if device is None or isinstance(device, jax.Device):
        return device
    devices = jax.local_devices()
    if not isinstance(device, int) or not 0 <= device < len(devices):
        raise ValueError(f"device {device!r}: choose an index below {len(devices)} "
                         f"(local devices: {', '.join(str(d) for d in devices)})")
    return devices[device]
