"""Activation statistics of the quantized projections on a calibration text: each input
channel's mean square, for the activation-aware scale search of ``rwkv7_core.quantization``
(``quantize``'s ``importance``), and the inputs' mean Gram matrix, for GPTQ
(``rwkv7_core.gptq``).

The float model runs the text as one sequence; every ``F.linear`` whose weight is a recorded
projection (``rwkv7_core.quantization.quantized_key``) adds its input rows' squares, or their
outer products, to that projection's sum (a ``TorchFunctionMode`` sees the calls; the model
code is unchanged).
"""
from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from .model import RWKV7

CHUNK = 256  # tokens per forward call


class _InputSums(TorchFunctionMode):
    """Sums, over the input rows x [in] of the F.linear calls whose weight is one of `keys`,
    x² per channel (gram False: float64 [in]) or x^T x (gram True: float64 [in, in])."""

    def __init__(self, keys: dict[int, str], gram: bool):
        super().__init__()
        self.keys, self.gram = keys, gram
        self.sums: dict[str, torch.Tensor] = {}
        self.rows: dict[str, int] = {}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.linear and id(args[1]) in self.keys:
            key, x = self.keys[id(args[1])], args[0].detach()
            x = x.reshape(-1, x.shape[-1]).double()
            part = x.T @ x if self.gram else (x * x).sum(0)
            self.sums[key] = self.sums[key] + part if key in self.sums else part
            self.rows[key] = self.rows.get(key, 0) + x.shape[0]
        return func(*args, **kwargs)


def projection_weights(model: RWKV7) -> dict[str, torch.Tensor]:
    """Checkpoint key -> the model's weight tensor of each quantized projection."""
    out = {"head.weight": model.head}
    for i, layer in enumerate(model.layers):
        p = f"blocks.{i}."
        out.update({p + f"att.{n}.weight": getattr(layer, n) for n in ("receptance", "key", "value", "output")})
        out.update({p + "ffn.key.weight": layer.ffn_key, p + "ffn.value.weight": layer.ffn_value})
    return out


def input_power(model: RWKV7, tokens: np.ndarray) -> dict[str, np.ndarray]:
    """Mean square of each input channel of every quantized projection over the tokens (int
    [T], one sequence) run through `model` (load it unquantized): checkpoint key -> float64
    [in]."""
    return _input_means(model, tokens, None, gram=False)


def input_gram(model: RWKV7, tokens: np.ndarray, keys: Iterable[str] | None = None) -> dict[str, np.ndarray]:
    """Mean Gram matrix x^T x / rows of the inputs of the quantized projections named by
    `keys` (default all; each is in² float64 values, so a large model takes them a few at a
    time) over the tokens (int [T], one sequence) run through `model` (load it unquantized):
    checkpoint key -> float64 [in, in]."""
    return _input_means(model, tokens, keys, gram=True)


def _input_means(model: RWKV7, tokens: np.ndarray, keys: Iterable[str] | None, gram: bool) -> dict[str, np.ndarray]:
    weights = projection_weights(model)
    wanted = weights if keys is None else {key: weights[key] for key in keys}
    recorder = _InputSums({id(w): key for key, w in wanted.items()}, gram)
    state = model.init_state(1)
    tokens = np.asarray(tokens, np.int64)
    with torch.no_grad(), recorder:
        for start in range(0, len(tokens), CHUNK):
            _, state = model.forward(tokens[None, start:start + CHUNK], state, full_output=True)
    return {key: (recorder.sums[key] / recorder.rows[key]).cpu().numpy() for key in recorder.sums}
