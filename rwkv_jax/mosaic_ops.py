"""The Pallas Mosaic GPU Ops (``kernels="mosaic"``, and ``"mosaic-interpret"``: the same in GPU
interpret mode for checks on any backend); jax >= 0.11 (``rwkv_jax.kernels.REQUIRES``).

They are the ``pallas-fused`` decode Ops (``rwkv_jax.pallas_ops.fused_ops``) with every op that
has a Mosaic GPU kernel (``pallas_kernels/mosaic/``) swapped in; every other op runs what
``pallas-fused`` runs (its Triton-lowered Pallas kernel, or XLA where that kernel does not
serve the shape). ``MOSAIC_TABLE`` declares, per op, which lowering runs it compiled for a
GPU and in GPU interpret mode, and why (an op whose Mosaic kernel ran in interpret mode but
did not lower for the GPU would run its Triton kernel there: declared, not probed); the
compile report (``rwkv7-gpu-compile --kernels mosaic``) and docs/kernels-and-gpu-free-compile.md
list it. The prefill (DENSE) path is ``pallas-fused``'s.
"""
from __future__ import annotations

import enum
import functools
from typing import NamedTuple

import jax.numpy as jnp

from pallas_kernels import ffn_value as triton_ffn_value
from pallas_kernels import fused_time_mix as triton_fused
from pallas_kernels import lora_up as triton_lora_up
from pallas_kernels import segment_linear as triton_segment_linear
from pallas_kernels import shift_mix as triton_shift_mix
from pallas_kernels import wkv_tail as triton_wkv_tail
from pallas_kernels.mosaic import ffn_value as mosaic_ffn_value
from pallas_kernels.mosaic import lora_up as mosaic_lora_up
from pallas_kernels.mosaic import segment_linear as mosaic_segment_linear
from pallas_kernels.mosaic import shift_mix as mosaic_shift_mix
from pallas_kernels.mosaic import wkv_tail as mosaic_wkv_tail
from pallas_kernels.quantized import QuantizedWeight
from pallas_kernels.segment_linear import SplitSum

from .ops import Ops
from .pallas_ops import fused_channel_mix, fused_ops, in_place_shift_mix, in_place_time_mix, pallas_ops
from .paths import Path


class Lowering(str, enum.Enum):
    """Which code runs an op under ``kernels="mosaic"``."""

    MOSAIC = "mosaic"   # a plgpu.kernel in pallas_kernels/mosaic/
    TRITON = "triton"   # pallas-fused's Triton-lowered Pallas kernel
    XLA = "xla"


class OpChoice(NamedTuple):
    """One op of the decode step, where it runs under ``kernels="mosaic"`` (compiled) and
    ``"mosaic-interpret"`` (interpreted), and why."""

    op: str
    compiled: Lowering
    interpreted: Lowering
    reason: str

    def lowering(self, interpret: bool) -> Lowering:
        """Where the op runs compiled (interpret False) or interpreted."""
        return self.interpreted if interpret else self.compiled


MOSAIC_TABLE: tuple[OpChoice, ...] = (
    OpChoice("wkv tail (operands, wkv step on the whole state in place, GroupNorm, bonus, gate)",
             Lowering.MOSAIC, Lowering.MOSAIC,
             "pallas_kernels/mosaic/wkv_tail.py: one warpgroup per (row, head); TMA copies of the head's "
             "slices into shared memory; the 64 x 64 state is one WGMMA-layout tile, the key-side vectors in "
             "its column layout and the value side in its row layout (a 64-wide head vector is half a "
             "128-lane strided vector, which Lane semantics rejects); the state block written back in place; "
             "a head size not a multiple of 64 takes the Triton kernel"),
    OpChoice("residual + LayerNorm + token-shift mixes (shift_mix)", Lowering.MOSAIC, Lowering.MOSAIC,
             "pallas_kernels/mosaic/shift_mix.py: one warpgroup per row; the row, its delta (row or split-K "
             "partials), LayerNorm vectors and mixes copied by TMA into shared memory padded to a multiple of "
             "128 elements (C = 192 -> 256: zeroed padding, the variance corrected for it), a delta's split-K "
             "partials in groups that fit 64 KiB; the shift row written back in place; a shift leaf of another "
             "dtype than h, or a row whose TMA pieces are not whole multiples of 128 bytes, takes the Triton kernel"),
    OpChoice("small-M products: r/k/v + LoRA downs, output, FFN key (segment_linear)", Lowering.MOSAIC,
             Lowering.MOSAIC,
             "pallas_kernels/mosaic/segment_linear.py for plain bfloat16 / float16 / float32 weights and "
             "M <= 16 rows: an emit_pipeline of TMA-copied [bn, bk] weight tiles per segment (depth from the "
             "shared-memory budget), read transposed in the WGMMA layout so segment widths need a divisor of "
             "8 (LoRA widths 16, 32, 96), CUDA-core products (exact in float32: no TF32, which a float32 "
             "wgmma would use); int8 / fp8 / int4 weights, M > 16 rows (where a wgmma product with "
             "64-row tiles pays off; not ported) and an output block under a whole 128 bytes (one row of a "
             "16-wide segment: TMA) take the Triton kernel"),
    OpChoice("LoRA ups (lora_up)", Lowering.MOSAIC, Lowering.MOSAIC,
             "pallas_kernels/mosaic/lora_up.py for M <= 16 rows: one warpgroup per 64 output columns, the "
             "pairs' down partials and up blocks copied by TMA under one barrier, each up block in the WGMMA "
             "layout with the LoRA width as its columns (pieces of <= 64, multiples of 8: widths 16, 48, 96 "
             "unpadded); widths not a multiple of 8 or over 256 (TMA's box), a pair's partials under a whole "
             "128 bytes, C not a multiple of 64, more rows, or buffers over 200 KiB of shared memory take the "
             "Triton kernel"),
    OpChoice("channel-mix value product (ffn_value)", Lowering.MOSAIC, Lowering.MOSAIC,
             "pallas_kernels/mosaic/ffn_value.py, the dense product, plain bfloat16 / float16 / float32 "
             "weights, M <= 16 rows: an emit_pipeline of TMA-copied key partials and [bf, bc] value tiles "
             "(depth from the shared-memory budget), CUDA-core products; the sparse product (rows <= "
             "pallas_ops.SPARSE_MAX_ROWS skip the value rows of zero units: a data-dependent load that a "
             "pipeline of static TMA tiles does not express), quantized value weights and M > 16 take the "
             "Triton kernel"),
    OpChoice("head (vocabulary) product (linear)", Lowering.MOSAIC, Lowering.MOSAIC,
             "the Mosaic segment_linear with one segment (split-K partials summed by XLA, as the Triton "
             "small-M product's are) for plain weights, M <= 16 and a vocabulary with a divisor of 8; "
             "else pallas-fused's product (the Triton small-M kernel or XLA)"),
    OpChoice("sampler threshold search (radix_search)", Lowering.TRITON, Lowering.TRITON,
             "not ported: a vocabulary not a multiple of the 2048-key block needs masked tail loads"),
    OpChoice("prefill (DENSE path: chunked wkv, operands, output, shift_mix_rows; GEMMs)", Lowering.TRITON, Lowering.TRITON,
             "as pallas-fused (Triton kernels, XLA GEMMs): the prefill port is later work"),
)

WKV_TAIL, SHIFT_MIX, SEGMENT_LINEAR, LORA_UP, FFN_VALUE, HEAD = MOSAIC_TABLE[:6]


def shift_mix(h, delta, shift, ln_w, ln_b, mix, *, layer: int | None = None, interpret: bool = False):
    """The Mosaic shift_mix where the shift has h's dtype (its in-place contract) and the row's TMA
    copies suit, else the Triton one."""
    items = {x.dtype.itemsize for x in (h, ln_w, mix)} | {4}  # a delta: rows in h's dtype or float32 partials
    serves = shift.dtype == h.dtype and mosaic_shift_mix.supports(h.shape[1], items)
    kernel = mosaic_shift_mix if serves else triton_shift_mix
    return kernel.shift_mix(h, delta, shift, ln_w, ln_b, mix, layer=layer, interpret=interpret)


def segment_linear(xs, weights, inputs, *, splits: int | None = None,
                   target: int = triton_segment_linear.TARGET_PROGRAMS, interpret: bool = False):
    """The Mosaic segment_linear where it serves the rows and weights, else the Triton one."""
    _, M, K = xs.shape
    serves = mosaic_segment_linear.supports(M, [w.shape[0] for w in weights], K, weights)
    kernel = mosaic_segment_linear if serves else triton_segment_linear
    return kernel.segment_linear(xs, weights, inputs, splits=splits, target=target, interpret=interpret)


def lora_up(partials, ups, offsets, kinds, *, M: int, dtype, interpret: bool = False):
    """The Mosaic lora_up where it serves the rows, widths and shared memory, else the Triton one."""
    splits, Mp, _ = partials.shape
    serves = (all(u.dtype == jnp.dtype(dtype) for u in ups)
              and mosaic_lora_up.supports(M, splits, Mp, ups[0].shape[0], [u.shape[1] for u in ups], dtype))
    kernel = mosaic_lora_up if serves else triton_lora_up
    return kernel.lora_up(partials, ups, offsets, kinds, M=M, dtype=dtype, interpret=interpret)


def ffn_value(pre_partials, w_val_t, *, M: int, dtype, splits: int | None = None, skip: bool = False,
              interpret: bool = False):
    """The Mosaic (dense) ffn_value where it serves, else the Triton one (skip, quantized, M > 16)."""
    F = pre_partials.shape[2]
    C = w_val_t.shape[0] if isinstance(w_val_t, QuantizedWeight) else w_val_t.shape[1]
    kernel = mosaic_ffn_value if mosaic_ffn_value.supports(M, F, C, w_val_t, skip) else triton_ffn_value
    return kernel.ffn_value(pre_partials, w_val_t, M=M, dtype=dtype, splits=splits, skip=skip, interpret=interpret)


def linear(x, w, *, fallback, interpret: bool):
    """Contract linear (the head): the Mosaic segment_linear with one segment where it serves x's
    rows and w, its partials summed by XLA; else `fallback` (pallas-fused's linear)."""
    M, K = x.shape
    if mosaic_segment_linear.supports(M, [w.shape[0]], K, [w]) and w.dtype == x.dtype:
        partials = mosaic_segment_linear.segment_linear(x[None], [w], [0], interpret=interpret)
        return SplitSum(partials, M, x.dtype).total()
    return fallback(x, w)


def wkv_tail(partials, lora, vecs, r_k, v_first, S, *, layer: int | None = None, interpret: bool = False):
    """The Mosaic wkv tail where it serves the head size (N % 64 == 0), else the Triton one."""
    kernel = mosaic_wkv_tail if mosaic_wkv_tail.supports(r_k.shape[1]) else triton_wkv_tail
    return kernel.wkv_tail(partials, lora, vecs, r_k, v_first, S, layer=layer, interpret=interpret)


def fused_kernels(interpret: bool) -> triton_fused.FusedKernels:
    """The kernel set of the fused mixes: each op's Mosaic dispatcher where ``MOSAIC_TABLE``
    assigns it Mosaic (compiled, or interpreted with interpret=True), else its Triton kernel."""
    def pick(choice: OpChoice, mosaic, triton):
        return mosaic if choice.lowering(interpret) is Lowering.MOSAIC else triton

    triton = triton_fused.TRITON
    return triton_fused.FusedKernels(
        segment_linear=pick(SEGMENT_LINEAR, segment_linear, triton.segment_linear),
        lora_up=pick(LORA_UP, lora_up, triton.lora_up),
        wkv_tail=pick(WKV_TAIL, wkv_tail, triton.wkv_tail),
        ffn_value=pick(FFN_VALUE, ffn_value, triton.ffn_value),
    )


def mosaic_ops(path: Path, interpret: bool) -> Ops:
    """The Ops for `path` with the Mosaic GPU kernels ``MOSAIC_TABLE`` assigns (compiled, or
    interpreted with interpret=True) swapped into ``fused_ops``; interpret=True runs the Mosaic
    kernels in GPU interpret mode (race detection on) and the rest in the Pallas interpreter."""
    if not isinstance(path, Path):
        raise ValueError(f"path must be a rwkv_jax.Path, got {path!r}")
    base = fused_ops(path, interpret)
    if path is Path.DENSE:
        return base
    kernels = fused_kernels(interpret)
    lin = (functools.partial(linear, fallback=base.linear, interpret=interpret)
           if HEAD.lowering(interpret) is Lowering.MOSAIC else base.linear)
    return base._replace(
        linear=lin,
        time_mix=functools.partial(in_place_time_mix, linear=lin, interpret=interpret, kernels=kernels),
        channel_mix=functools.partial(fused_channel_mix, fallback=pallas_ops(path, interpret).channel_mix,
                                      interpret=interpret, kernels=kernels),
        shift_mix=(functools.partial(in_place_shift_mix, interpret=interpret, kernel=shift_mix)
                   if SHIFT_MIX.lowering(interpret) is Lowering.MOSAIC else base.shift_mix))
