"""The pure, traceable forward functions the model (and engines) jit.

Weights travel as a plain nested dict of arrays (``nnx.to_pure_dict`` of the split NNX
model, made once at load): flattening a plain dict costs less per call than NNX's
State. Inside a trace the dict is bound back to an abstract NNX skeleton (built once
per config), so tracing pays the module bookkeeping and the executable does not.

Layers are unrolled (static Python loop) over per-layer weight arrays rather than run
under ``lax.scan`` over layer-stacked weights. Measured (``benchmarks/compile_speed.py``,
``benchmarks/results/compile_speed.md``, 2 idle cores): on XLA:CPU the scan compiles the
0.1b step 2.3-3.5x faster (0.9 s vs 3.2 s at B=1) but decodes 20-31% slower (B=1 29.5 vs
42.9 tok/s, B=32 244 vs 314) and prefills 14% slower, because XLA:CPU copies a stacked
weight's layer slice before its products; for an H200 (deviceless, 1.5b bf16) it compiles
5-15x faster (1.6 s vs 7.7 s at B=1, 3.1 s vs 45 s at B=32) but runs a device while loop
that executes more launches per step (794 vs 654 at B=1, 1,602 vs 747 at B=32), and the
fused decode kernels need a static layer index. So both backends unroll, and pay the
compile once per executable (kept by the persistent cache; the scheduler compiles the
buckets it is about to need on a thread of its own, scheduler/ahead.py). The price is more leaves
(19 per layer; ~0.4 us each per call) and a compile time linear in L.
"""
from __future__ import annotations

import functools

import jax
from flax import nnx

from rwkv7_core.config import ModelConfig
from rwkv7_core.quantization import QuantSpec

from .kernels import Kernels, ops_for
from .layouts import DenseRows, FlatRows, StepRows
from .modules import RWKV7, quant_spec_of
from .paths import Path
from .state import State
from .varlen import Segments


@functools.lru_cache(maxsize=None)
def _skeleton(config: ModelConfig, quant: QuantSpec | None):
    """(graphdef, abstract state) of an RWKV7 of this config and quantization; no arrays are
    allocated."""
    return nnx.split(nnx.eval_shape(lambda: RWKV7(config, quant=quant)))


def bind(params: dict, config: ModelConfig):
    """An RWKV7 module whose weights are `params` (a pure dict, possibly of tracers; quantized
    or not, as its structure says)."""
    graphdef, abstract = _skeleton(config, quant_spec_of(params))
    state = jax.tree.map(lambda x: x, abstract)  # fresh Variables to fill in
    nnx.replace_by_pure_dict(state, params)
    return nnx.merge(graphdef, state)


def forward_fn(params: dict, tokens: jax.Array, state: State, *, config: ModelConfig,
               path: Path, kernels: Kernels, full_output: bool = False):
    """tokens int32 [B, T], state State -> (logits float32 [B, V] ([B, T, V] with
    full_output), new State). `path` picks the ops (``ops_for(path, kernels)``) and the
    layout: B1T1 / BATCHED_DECODE run one token per sequence (T must be 1), DENSE the
    sequence form. Pure and traceable; jit it with `config`, `path`, `kernels`,
    `full_output` static."""
    B, T = tokens.shape
    step = path is not Path.DENSE
    if step and T != 1:
        raise ValueError(f"path {path} runs one token per sequence, got T={T}")
    rows = StepRows() if step else DenseRows(B, T, full_output)
    logits, new_state = bind(params, config)(tokens.reshape(B * T), state,
                                             ops=ops_for(path, kernels), rows=rows)
    return (logits.reshape(B, T, -1) if full_output else logits), State(*new_state)


def varlen_forward_fn(params: dict, tokens: jax.Array, state: State, starts: jax.Array,
                      lengths: jax.Array, *, config: ModelConfig, kernels: Kernels,
                      n_single: int = 0):
    """The model over P sequences flattened into one stream (see rwkv_jax.varlen).

    tokens int32 [T] (sequence p at [starts[p], starts[p] + lengths[p]); the rest is
    padding); state: State with P rows, row p the state sequence p starts from;
    starts, lengths int32 [P]. The first `n_single` sequences have length <= 1 (decode
    rows of a mixed step). Returns (logits float32 [P, V] at each sequence's last token
    (meaningless for empty sequences), new State with P rows; empty sequences keep
    theirs). Runs the DENSE path's ops. Pure; jit with config, kernels, n_single static."""
    rows = FlatRows(Segments(starts, lengths), n_single)
    logits, new_state = bind(params, config)(tokens, state, ops=ops_for(Path.DENSE, kernels), rows=rows)
    return logits, State(*new_state)
