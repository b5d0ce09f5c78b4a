"""The spec-exact RWKV-7 reference in PyTorch.

    m = load(path, dtype="float32", kernels="torch")
    state = m.init_state(B)
    logits, state = m.forward(tokens, state)                  # tokens int [B, T] -> float32 [B, V]
    logits, state = m.forward(tokens, state, full_output=True)  # float32 [B, T, V]

Weights and the residual stream are in the model dtype; LayerNorm/GroupNorm statistics,
the decay, kk normalisation, relu**2 and the wkv recurrence run in the accumulation
dtype (float32, or float64 for a float64 model); the wkv state is held between calls in the
state dtype (``load(..., state_dtype=)``, rwkv7_core.state). See docs/MODEL.md for the math.
"""
from __future__ import annotations

import enum
import os
from collections.abc import Mapping
from typing import NamedTuple

import ml_dtypes
import numpy as np
import torch
import torch.nn.functional as F

from rwkv7_core.checkpoint import read_checkpoint
from rwkv7_core.config import ModelConfig
from rwkv7_core.constants import LN_EPS
from rwkv7_core.quantization import (
    QuantSpec,
    dequantize,
    quantize,
    quantized_key,
    resolve_spec,
    scale_key,
    spec_for,
    stored_spec,
)
from rwkv7_core.state import check_state_dtype, check_tokens

from .state import State, check_state, wkv_dtype, zeros_state
from .wkv import CoreParams, time_mix_core

DTYPES = {"float64": torch.float64, "float32": torch.float32,
          "bfloat16": torch.bfloat16, "float16": torch.float16}


class Kernels(str, enum.Enum):
    """Which implementation runs the time-mix core (decay/kk prep, wkv, read-out)."""
    TORCH = "torch"    # plain torch (wkv.py)
    TRITON = "triton"  # triton_kernels/: fused T=1 step, [B, T] recurrence
    AUTO = "auto"      # TRITON on CUDA, TORCH on the CPU; resolved by ``load``


class Layer(NamedTuple):
    """One block's weights. Vectors [C] and matrices in the model dtype; ``core``, the
    LayerNorm vectors and ``ffn_value`` (multiplied by the float32 relu**2, which float16
    cannot hold) in the accumulation dtype. Linear weights are [out, in]."""
    ln1: tuple[torch.Tensor, torch.Tensor]
    ln2: tuple[torch.Tensor, torch.Tensor]
    mix: torch.Tensor                     # [6, C]: x_r, x_w, x_k, x_v, x_a, x_g
    w0: torch.Tensor
    w1: torch.Tensor
    w2: torch.Tensor
    a0: torch.Tensor
    a1: torch.Tensor
    a2: torch.Tensor
    v0: torch.Tensor
    v1: torch.Tensor
    v2: torch.Tensor
    g1: torch.Tensor
    g2: torch.Tensor
    receptance: torch.Tensor
    key: torch.Tensor
    value: torch.Tensor
    output: torch.Tensor
    core: CoreParams
    ffn_x_k: torch.Tensor
    ffn_key: torch.Tensor
    ffn_value: torch.Tensor


def _layer_norm(x: torch.Tensor, wb: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """LayerNorm over the last axis with statistics in wb's (accumulation) dtype."""
    return F.layer_norm(x.to(wb[0].dtype), x.shape[-1:], wb[0], wb[1], LN_EPS).to(x.dtype)


def _shifted(x: torch.Tensor, prev: torch.Tensor) -> torch.Tensor:
    """[B, T, C] -> the previous position's rows, the carried ``prev`` [B, C] at t = 0."""
    return torch.cat([prev[:, None].to(x.dtype), x[:, :-1]], dim=1)


class RWKV7:
    """A loaded model. ``config`` (ModelConfig), ``dtype`` (torch dtype), ``state_dtype`` (the
    wkv state's torch dtype), ``kernels``."""

    def __init__(self, tensors: Mapping[str, np.ndarray], config: ModelConfig, dtype: torch.dtype,
                 kernels: Kernels, device: torch.device, quant: QuantSpec | None = None,
                 state_dtype: torch.dtype | None = None):
        self.config, self.dtype, self.kernels, self.device = config, dtype, kernels, device
        self.acc_dtype, self.quant = wkv_dtype(dtype), quant
        self.state_dtype = state_dtype or self.acc_dtype

        def t(key: str, acc: bool = False) -> torch.Tensor:
            a = weight(tensors, key, quant)
            if a.dtype == ml_dtypes.bfloat16:  # numpy->torch has no bfloat16: widen first
                a = a.astype(np.float32)
            x = torch.from_numpy(np.array(a))
            return x.to(device=device, dtype=self.acc_dtype if acc else dtype)

        C = config.n_embd
        self.emb = t("emb.weight")
        self.ln0 = (t("blocks.0.ln0.weight", True), t("blocks.0.ln0.bias", True))
        self.ln_out = (t("ln_out.weight", True), t("ln_out.bias", True))
        self.head = t("head.weight")
        self.layers = []
        for i in range(config.n_layer):
            p = f"blocks.{i}."
            self.layers.append(Layer(
                ln1=(t(p + "ln1.weight", True), t(p + "ln1.bias", True)),
                ln2=(t(p + "ln2.weight", True), t(p + "ln2.bias", True)),
                mix=torch.stack([t(p + f"att.x_{n}").reshape(C) for n in "rwkvag"]),
                **{n: t(p + f"att.{n}").reshape(C) for n in ("w0", "a0", "v0")},
                **{n: t(p + f"att.{n}") for n in ("w1", "w2", "a1", "a2", "v1", "v2", "g1", "g2")},
                **{n: t(p + f"att.{n}.weight") for n in ("receptance", "key", "value", "output")},
                core=CoreParams(k_k=t(p + "att.k_k", True).reshape(C),
                                k_a=t(p + "att.k_a", True).reshape(C),
                                r_k=t(p + "att.r_k", True).reshape(config.n_head, config.head_size),
                                ln_w=t(p + "att.ln_x.weight", True).reshape(C),
                                ln_b=t(p + "att.ln_x.bias", True).reshape(C)),
                ffn_x_k=t(p + "ffn.x_k").reshape(C),
                ffn_key=t(p + "ffn.key.weight"),
                ffn_value=t(p + "ffn.value.weight").to(self.acc_dtype)))
        if kernels is Kernels.TRITON:
            from .triton_kernels import interpreted, time_mix_core_triton
            if device.type == "cpu" and not interpreted():
                raise ValueError("kernels='triton' on CPU needs TRITON_INTERPRET=1 set before triton is first "
                                 "imported (another package may have imported it already: set it in the "
                                 "environment)")
            self._core = time_mix_core_triton
        else:
            self._core = time_mix_core

    # ------------------------------------------------------------------ public API
    def init_state(self, batch_size: int) -> State:
        """Zeros: att_shift/ffn_shift [B, L, C] model dtype, wkv [B, L, H, N, N] state dtype."""
        return zeros_state(self.config, batch_size, self.dtype, self.device, self.state_dtype)

    @torch.no_grad()
    def forward(self, tokens, state: State, full_output: bool = False):
        """Run B sequences of T tokens from ``state``.

        tokens: int [B, T] (torch tensor, numpy array or nested list), ids in [0, V).
        Returns (logits float32 [B, V] for the last position, or [B, T, V] with
        full_output, and the new State). The input state is not modified.
        """
        tokens = self._check_tokens(tokens)
        B, T = tokens.shape
        state = check_state(state, self.config, B, self.dtype, self.state_dtype)
        h = _layer_norm(self.emb[tokens], self.ln0)
        att_shift, wkv, ffn_shift = [], [], []
        v_first = None
        for i, layer in enumerate(self.layers):
            delta, a_shift, S, v_first = self._time_mix(
                i, layer, _layer_norm(h, layer.ln1), state.att_shift[:, i], state.wkv[:, i], v_first)
            h = h + delta
            delta, f_shift = self._channel_mix(layer, _layer_norm(h, layer.ln2), state.ffn_shift[:, i])
            h = h + delta
            att_shift.append(a_shift)
            wkv.append(S)
            ffn_shift.append(f_shift)
        if not full_output:
            h = h[:, -1]
        logits = F.linear(_layer_norm(h, self.ln_out), self.head).float()
        new_state = State(torch.stack(att_shift, 1), torch.stack(wkv, 1), torch.stack(ffn_shift, 1))
        return logits, new_state

    __call__ = forward

    # ------------------------------------------------------------------ blocks
    def _time_mix(self, i: int, m: Layer, x, shift, S, v_first):
        """x [B, T, C] = LN1(h); shift [B, C]; S [B, H, N, N]. Returns (delta, x[:, -1], S, v_first)."""
        acc = self.acc_dtype
        d = _shifted(x, shift) - x
        xr, xw, xk, xv, xa, xg = (x + d * m.mix[j] for j in range(6))
        r = F.linear(xr, m.receptance)
        k = F.linear(xk, m.key)
        v = F.linear(xv, m.value)
        w_raw = m.w0 + torch.tanh(xw @ m.w1) @ m.w2
        a = torch.sigmoid(m.a0 + (xa @ m.a1) @ m.a2)
        g = torch.sigmoid(xg @ m.g1) @ m.g2
        if i == 0:
            v_first = v
        else:
            v = v + (v_first - v) * torch.sigmoid(m.v0 + (xv @ m.v1) @ m.v2)
        y, S = self._core(r.to(acc), w_raw.to(acc), k.to(acc), v.to(acc), a.to(acc), m.core, S)
        return F.linear(y.to(x.dtype) * g, m.output), x[:, -1], S, v_first

    def _channel_mix(self, m: Layer, x, shift):
        """x [B, T, C] = LN2(h); relu(.)**2 and the value product in the accumulation dtype."""
        kx = x + (_shifted(x, shift) - x) * m.ffn_x_k
        hidden = torch.relu(F.linear(kx, m.ffn_key).to(self.acc_dtype)) ** 2
        return F.linear(hidden, m.ffn_value).to(x.dtype), x[:, -1]

    # ------------------------------------------------------------------ input checks
    def _check_tokens(self, tokens) -> torch.Tensor:
        if isinstance(tokens, torch.Tensor):
            if tokens.is_floating_point() or tokens.is_complex() or tokens.dtype == torch.bool:
                raise ValueError(f"tokens must be integers, got dtype {tokens.dtype}")
            tokens = tokens.detach().cpu().numpy()
        arr = check_tokens(tokens, self.config.vocab_size)
        return torch.from_numpy(arr).to(device=self.device)


def weight(tensors, key: str, quant: QuantSpec | None) -> np.ndarray:
    """Checkpoint tensor `key`; with `quant`, a quantized projection is the float32
    dequantization of its q and scales (stored, or quantized here from the float weight)."""
    if quant is None or not quantized_key(key):
        return tensors[key]
    if scale_key(key) in tensors:
        return dequantize(tensors[key], tensors[scale_key(key)])
    return dequantize(*quantize(tensors[key], quant, key))


def load(path: str | os.PathLike, dtype: str = "float32", kernels: str | Kernels = "torch",
         device: str | torch.device | None = None, quantization: str = "none",
         group_size: int | None = None, state_dtype: str | None = None) -> RWKV7:
    """Load a checkpoint (.pth, .safetensors or a Hugging Face model directory) as an RWKV7 model.

    dtype: float64 | float32 | bfloat16 | float16. kernels: torch | triton | auto (Triton on
    CUDA, torch on the CPU; Triton needs float32/bfloat16/float16 and runs on CUDA, or on
    CPU under TRITON_INTERPRET=1, which is set here when the kernels are first imported on a
    CPU-only run). device defaults to CUDA when available for Triton and auto, else CPU.
    quantization: none | int8 | int4 | fp8 (group_size: int8 / int4 input channels per scale), as in
    ``rwkv_jax.load``: the quantized projections hold their dequantized values (the same
    numbers the JAX model multiplies by). state_dtype: float32 | bfloat16 | float16, the dtype
    the wkv state is held in between calls (None: the accumulation dtype, float32, or float64
    for a float64 model), as in ``rwkv_jax.load``.
    """
    if dtype not in DTYPES:
        raise ValueError(f"dtype {dtype!r} not in {list(DTYPES)}")
    if state_dtype is not None:
        check_state_dtype(state_dtype)
    spec_for(quantization, group_size)
    try:
        kind = Kernels(kernels)
    except ValueError:
        raise ValueError(f"kernels {kernels!r} not in {[k.value for k in Kernels]}") from None
    if device is None:
        device = "cuda" if kind is not Kernels.TORCH and torch.cuda.is_available() else "cpu"
    on = torch.device(device)
    if kind is Kernels.AUTO:
        kind = Kernels.TRITON if on.type == "cuda" and dtype != "float64" else Kernels.TORCH
    if kind is Kernels.TRITON:
        if dtype == "float64":
            raise ValueError("kernels='triton' accumulates in float32; use kernels='torch' "
                             "for a float64 model")
        if on.type == "cpu":
            os.environ.setdefault("TRITON_INTERPRET", "1")
    tensors, config = read_checkpoint(path)
    quant = resolve_spec(quantization, group_size, stored_spec(tensors.metadata), str(path))
    return RWKV7(tensors, config, DTYPES[dtype], kind, on, quant,
                 None if state_dtype is None else DTYPES[state_dtype])
