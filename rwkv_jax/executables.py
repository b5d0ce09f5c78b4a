"""The registry of ``JaxEngine``'s executables: one ``Executable`` per kind, in ``EXECUTABLES``.

An executable is named by a key (kind, shape): the shape (an int or a tuple, see each entry)
fixes its abstract arguments, so each key compiles once. ``lower(model, key)`` gives the
``jax.stages.Lowered`` of a key, ``warm_up_args(model, key)`` the scratch arguments of its
first run. Adding an executable is one entry here.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable

import jax
import jax.numpy as jnp

from rwkv7_core.engine import MAX_PIECES, Slots
from rwkv7_core.sampling import SamplingRows, sampling_rows
from rwkv7_core.token_mask import mask_words

from . import slot_fns
from .forward import forward_fn
from .paths import select_path
from .state import init_state
from .varlen_engine import mixed_step_fn, varlen_prefill_fn


@dataclass(frozen=True)
class Executable:
    """fn: the jitted function; args(model, shape): its arguments after the weights as
    ShapeDtypeStructs; static(model, shape): its static keyword arguments; with_params: the
    model's params come first; warm_up(zero_args): the first run's arguments made from zeros
    of ``args`` (default: the zeros)."""

    fn: jax.stages.Wrapped
    args: Callable[..., tuple]
    static: Callable[..., dict] = lambda model, shape: {}
    with_params: bool = True
    warm_up: Callable[[tuple], tuple] = lambda zero_args: zero_args


def _i32(*shape):
    return jax.ShapeDtypeStruct(shape, jnp.int32)


def _state(model, batch: int):
    """The model's State of ``batch`` rows as ShapeDtypeStructs (shape and dtype only)."""
    shapes = jax.eval_shape(functools.partial(init_state, model.config, batch, model.dtype, model.state_dtype))
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), shapes)


def abstract_slots(model, bucket: int) -> Slots:
    """Slots of ``bucket`` rows as ShapeDtypeStructs."""
    V = model.config.vocab_size
    rows = SamplingRows(*(jax.ShapeDtypeStruct((bucket,), a.dtype) for a in sampling_rows([])))
    return Slots(_state(model, bucket), jax.ShapeDtypeStruct((bucket, V), jnp.float32),
                 jax.ShapeDtypeStruct((bucket, V), jnp.bool_), rows)


def _on_path(path_of: Callable[..., tuple[int, int]]):
    """Static arguments of a model forward whose kernel path is select_path(*path_of(shape))."""
    return lambda model, shape: dict(config=model.config, kernels=model.kernels, path=select_path(*path_of(shape)))


def _flat_static(model, shape) -> dict:
    return dict(config=model.config, kernels=model.kernels)


def _logits(model, *rows):
    return jax.ShapeDtypeStruct((*rows, model.config.vocab_size), jnp.float32)


# -- each kind's arguments after the weights, given its shape ------------------------------
def _step_args(model, bucket):
    return abstract_slots(model, bucket), _i32(bucket), _i32(bucket)


def _sample_args(model, _):
    one = abstract_slots(model, 1)
    return _logits(model), one.rows, one.banned, _i32(1)


def _masks(model, bucket: int):
    """Packed allowed-token masks of ``bucket`` rows (rwkv7_core/token_mask.py)."""
    return _i32(bucket, mask_words(model.config.vocab_size))


def _masked(args: Callable, bucket_of: Callable = lambda shape: shape) -> Callable:
    """An executable's arguments with the packed masks of its decode rows appended."""
    return lambda model, shape: (*args(model, shape), _masks(model, bucket_of(shape)))


def _insert_args(model, bucket):
    one = abstract_slots(model, 1)
    return abstract_slots(model, bucket), _i32(), one.state, one.rows, one.banned


def _pieces(model, token_rows: int) -> tuple:
    """A flattened call's prompt pieces: flat tokens, MAX_PIECES start rows, seg starts, lengths."""
    return _i32(token_rows), (_state(model, 1),) * MAX_PIECES, _i32(MAX_PIECES), _i32(MAX_PIECES)


def _mixed_args(model, shape):
    bucket, token_rows = shape
    return (abstract_slots(model, bucket), _i32(bucket), _i32(bucket), *_pieces(model, token_rows))


def _one_token_piece(zero_args: tuple) -> tuple:
    """Zero arguments of a flattened call with its first piece one token long (so its loop runs)."""
    *rest, lengths = zero_args
    return (*rest, lengths.at[0].set(1))


_MODEL_STATIC = ("config", "path", "kernels")


def _model_jit(fn, donate: str):
    return jax.jit(fn, static_argnames=_MODEL_STATIC, donate_argnames=donate)


EXECUTABLES: dict[str, Executable] = {
    # shape = bucket: the decode step, and the one also scoring the drawn tokens (LOGPROBS)
    "step": Executable(_model_jit(slot_fns.decode_step, "slots"), _step_args, _on_path(lambda b: (b, 1))),
    "step_logprobs": Executable(_model_jit(functools.partial(slot_fns.decode_step, with_logprobs=True), "slots"),
                                _step_args, _on_path(lambda b: (b, 1))),
    # the same two with packed allowed-token masks [bucket, W] (Capability.TOKEN_MASK; first use)
    # the masked step as two calls: the forward, dispatched first, then the masked sampling, so
    # the host computes the masks while the forward runs (rwkv7_core/token_mask.Masks)
    "step_forward": Executable(_model_jit(slot_fns.decode_forward, "slots"),
                               lambda model, b: (abstract_slots(model, b), _i32(b)), _on_path(lambda b: (b, 1))),
    "step_sample_masked": Executable(jax.jit(slot_fns.decode_sample, static_argnames="kernels"),
                                     _masked(lambda model, b: (_logits(model, b), abstract_slots(model, b), _i32(b))),
                                     lambda model, b: dict(kernels=model.kernels), with_params=False),
    "step_logprobs_masked": Executable(
        _model_jit(functools.partial(slot_fns.decode_step, with_logprobs=True), "slots"), _masked(_step_args),
        _on_path(lambda b: (b, 1))),
    # shape = piece length T: one prompt piece from a B=1 state, and its full-output scoring
    "prefill": Executable(_model_jit(slot_fns.prefill_piece, "state"),
                          lambda model, T: (_i32(T), _state(model, 1)), _on_path(lambda T: (1, T))),
    "score_piece": Executable(_model_jit(slot_fns.score_piece, "state"),
                              lambda model, T: (_i32(T), _i32(T), _state(model, 1)), _on_path(lambda T: (1, T))),
    # shape = 1: a prefilled row's first token and its score; a fresh and a copied row
    "sample": Executable(jax.jit(slot_fns.sample_one), _sample_args, with_params=False),
    "sample_masked": Executable(jax.jit(slot_fns.sample_one), _masked(_sample_args, lambda _: 1), with_params=False),
    "row_logprobs": Executable(jax.jit(slot_fns.row_logprobs), lambda model, _: (_logits(model), _i32(1)),
                               with_params=False),
    "fresh_row": Executable(jax.jit(init_state, static_argnames=("config", "batch_size", "dtype", "state_dtype")),
                            lambda model, _: (),
                            lambda model, _: dict(config=model.config, batch_size=1, dtype=model.dtype,
                                                  state_dtype=model.state_dtype),
                            with_params=False),
    "copy_row": Executable(jax.jit(slot_fns.copy_row), lambda model, _: (_state(model, 1),), with_params=False),
    # shape = bucket: the slot operations; shape = (old bucket, new bucket): a resize's gather
    "empty": Executable(jax.jit(slot_fns.empty_slots, static_argnames=("config", "dtype", "state_dtype", "bucket")),
                        lambda model, b: (), lambda model, b: dict(config=model.config, dtype=model.dtype,
                                                                   state_dtype=model.state_dtype, bucket=b),
                        with_params=False),
    "insert": Executable(jax.jit(slot_fns.insert, donate_argnames="slots"), _insert_args, with_params=False),
    "extract": Executable(jax.jit(slot_fns.extract), lambda model, b: (_state(model, b), _i32()), with_params=False),
    "gather": Executable(jax.jit(slot_fns.gather),
                         lambda model, pair: (abstract_slots(model, pair[0]), _i32(pair[1])), with_params=False),
    # shape = flat tokens T / (bucket, T): the varlen prefill and the mixed step
    "varlen_prefill": Executable(jax.jit(varlen_prefill_fn, static_argnames=("config", "kernels")),
                                 _pieces, _flat_static, warm_up=_one_token_piece),
    "mixed": Executable(jax.jit(mixed_step_fn, static_argnames=("config", "kernels"), donate_argnames="slots"),
                        _mixed_args, _flat_static, warm_up=_one_token_piece),
    "mixed_masked": Executable(jax.jit(mixed_step_fn, static_argnames=("config", "kernels"), donate_argnames="slots"),
                               _masked(_mixed_args, lambda shape: shape[0]), _flat_static,
                               warm_up=lambda zero_args: (*_one_token_piece(zero_args[:-1]), zero_args[-1])),
    # shape = (B, T, full_output): the model forward (benchmarks, GPU-free compile reports)
    "forward": Executable(jax.jit(forward_fn, static_argnames=(*_MODEL_STATIC, "full_output"),
                                  donate_argnames="state"),
                          lambda model, shape: (_i32(*shape[:2]), _state(model, shape[0])),
                          lambda model, shape: dict(config=model.config, kernels=model.kernels,
                                                    path=select_path(*shape[:2]), full_output=shape[2])),
}


def lower(model, key: tuple):
    """The jax.stages.Lowered of key = (kind, shape) for ``model`` (a ``rwkv_jax.Model``)."""
    kind, shape = key
    if kind not in EXECUTABLES:
        raise ValueError(f"unknown executable kind {kind!r}; choose one of {sorted(EXECUTABLES)}")
    entry = EXECUTABLES[kind]
    params = (model.params,) if entry.with_params else ()
    return entry.fn.lower(*params, *entry.args(model, shape), **entry.static(model, shape))


def warm_up_args(model, key: tuple) -> tuple:
    """Concrete arguments for key's first run: the model's params and zeros."""
    kind, shape = key
    entry = EXECUTABLES[kind]
    zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), entry.args(model, shape))
    return ((model.params,) if entry.with_params else ()) + tuple(entry.warm_up(zeros))
