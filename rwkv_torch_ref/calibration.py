"""Activation statistics of the quantized projections on a calibration text, for the
activation-aware scale search of ``rwkv7_core.quantization`` (``quantize``'s ``importance``).

The float model runs the text as one sequence; every ``F.linear`` whose weight is a quantized
projection (``rwkv7_core.quantization.quantized_key``) adds its input rows' squares to that
projection's sum (a ``TorchFunctionMode`` sees the calls; the model code is unchanged).
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from .model import RWKV7

CHUNK = 256  # tokens per forward call


class _InputPower(TorchFunctionMode):
    """Sums x² per input channel of the F.linear calls whose weight is one of `keys`."""

    def __init__(self, keys: dict[int, str]):
        super().__init__()
        self.keys = keys
        self.sums: dict[str, torch.Tensor] = {}
        self.rows: dict[str, int] = {}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.linear and id(args[1]) in self.keys:
            key, x = self.keys[id(args[1])], args[0].detach()
            x = x.reshape(-1, x.shape[-1]).double()
            self.sums[key] = self.sums.get(key, 0) + (x * x).sum(0)
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
    recorder = _InputPower({id(w): key for key, w in projection_weights(model).items()})
    state = model.init_state(1)
    tokens = np.asarray(tokens, np.int64)
    with torch.no_grad(), recorder:
        for start in range(0, len(tokens), CHUNK):
            _, state = model.forward(tokens[None, start:start + CHUNK], state, full_output=True)
    return {key: (recorder.sums[key] / recorder.rows[key]).cpu().numpy() for key in recorder.sums}
