"""The decode time-mix (``time_mix_reference`` on one-token rows) in four launches:
``segment_linear`` (r, k, v and the LoRA down products over the mixes in place), ``lora_up``
(the four up products), ``wkv_tail`` (operands, wkv step on the state in place, GroupNorm,
bonus, gate) and the output projection; and the decode channel-mix in two (the key product,
``ffn_value``). The split-K partials go from one kernel to the next unreduced; both mixes
return a ``SplitSum`` the next shift_mix reduces. Quantized weights (``QuantizedWeight`` r, k, v,
output, FFN key and value) run through the same launches, dequantized in registers.
"""
from __future__ import annotations

from typing import Callable, NamedTuple

from . import ffn_value as ffn_value_kernel
from . import lora_up as lora_up_kernel
from . import segment_linear as segment_kernel
from .segment_linear import SplitSum
from .time_mix import TimeMixWeights
from .wkv_tail import wkv_tail


class FusedKernels(NamedTuple):
    """The kernels the fused mixes launch, each with the contract of the Triton-lowered one
    named here (so another lowering, e.g. ``rwkv_jax.mosaic_ops``'s Mosaic GPU set, plugs in)."""

    segment_linear: Callable  # segment_linear.segment_linear
    lora_up: Callable         # lora_up.lora_up
    wkv_tail: Callable        # wkv_tail.wkv_tail
    ffn_value: Callable       # ffn_value.ffn_value


TRITON = FusedKernels(segment_kernel.segment_linear, lora_up_kernel.lora_up, wkv_tail, ffn_value_kernel.ffn_value)


def supports(M: int, wts: TimeMixWeights) -> bool:
    """Whether the four launches serve M rows of these weights (else use the reference)."""
    downs, _ = wts.down(first=False)
    C = wts.receptance.shape[1]
    ups = wts.ups(first=False)
    return (segment_kernel.supports(M, [w.shape[0] for w in downs], C, segment_kernel.groups(downs),
                                    segment_kernel.packed(downs))
            and segment_kernel.supports(M, [C], C, segment_kernel.groups([wts.output]),
                                        segment_kernel.packed([wts.output]))
            and lora_up_kernel.supports(C, [u.shape[1] for u in ups]))


def fused_time_mix(mixed, wts: TimeMixWeights, S, v_first, *, first: bool, layer: int | None = None,
                   interpret: bool = False, kernels: FusedKernels = TRITON):
    """mixed [6, B, C] (model dtype), S float32 [B, H, N, N] (or [B, L, H, N, N] with `layer`,
    updated in place), v_first [B, C] float32 | None -> (out SplitSum [B, C] model dtype, S',
    v_first): ``time_mix_reference`` with one wkv step per row, launched by `kernels`."""
    _, M, C = mixed.shape
    downs, inputs = wts.down(first)
    partials = kernels.segment_linear(mixed, downs, inputs, interpret=interpret)
    ups = wts.ups(first)
    offsets, col = [], 3 * C
    for w in downs[3:]:
        offsets.append(col)
        col += w.shape[0]
    lora = kernels.lora_up(partials, ups, offsets, wts.up_kinds(first), M=M, dtype=mixed.dtype, interpret=interpret)
    y, S, v_first = kernels.wkv_tail(partials, lora, wts.vecs, wts.r_k, v_first, S, layer=layer, interpret=interpret)
    out = kernels.segment_linear(y[None], [wts.output], [0], interpret=interpret)
    return SplitSum(out, M, mixed.dtype), S, v_first


def channel_mix_supported(M: int, w_key, w_val_t) -> bool:
    """Whether the two launches serve M rows (w_val_t [F, C], or a QuantizedWeight [C, F])."""
    F, C = w_key.shape
    value_groups = segment_kernel.groups([w_val_t])
    return (segment_kernel.supports(M, [F], C, segment_kernel.groups([w_key]), segment_kernel.packed([w_key]))
            and ffn_value_kernel.supports(F, C, value_groups[0] if value_groups else None,
                                          segment_kernel.packed([w_val_t])))


def fused_channel_mix(xk, w_key, w_val_t, *, skip: bool = False, interpret: bool = False,
                      kernels: FusedKernels = TRITON) -> SplitSum:
    """xk [M, C], w_key [F, C], w_val_t [F, C] (quantized weights: key [F, C], value [C, F])
    -> SplitSum [M, C] in xk.dtype:
    ``channel_mix_reference`` as the key product and ``ffn_value`` (skip: the value rows of zero
    activations unread). The key product uses half the usual programs (>= 2 per SM): its
    partials are re-read by every value program."""
    M = xk.shape[0]
    pre = kernels.segment_linear(xk[None], [w_key], [0], target=segment_kernel.TARGET_PROGRAMS // 2,
                                        interpret=interpret)
    return SplitSum(kernels.ffn_value(pre, w_val_t, M=M, dtype=xk.dtype, skip=skip, interpret=interpret),
                    M, xk.dtype)
