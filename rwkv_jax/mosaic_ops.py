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

from pallas_kernels import shift_mix as triton_shift_mix
from pallas_kernels import wkv_tail as triton_wkv_tail
from pallas_kernels.mosaic import shift_mix as mosaic_shift_mix
from pallas_kernels.mosaic import wkv_tail as mosaic_wkv_tail

from .ops import Ops
from .pallas_ops import fused_ops, in_place_shift_mix, in_place_time_mix
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
             "128 elements (C = 192 -> 256: zeroed padding, the variance corrected for it); the shift row "
             "written back in place; a shift leaf of another dtype than h takes the Triton kernel"),
    OpChoice("small-M products: r/k/v + LoRA downs, output, FFN key (segment_linear; plain, int8, fp8)",
             Lowering.TRITON, Lowering.TRITON, "not ported: the split-K weight stream wants an emit_pipeline of "
             "[block_n, 128k] tiles; M <= 16 rows leave WGMMA's 64-row tiles mostly empty"),
    OpChoice("LoRA ups (lora_up)", Lowering.TRITON, Lowering.TRITON,
             "not ported: LoRA widths (e.g. 48, 80) are not multiples of the 128-lane tiles"),
    OpChoice("channel-mix value product with sparse reads (ffn_value)", Lowering.TRITON, Lowering.TRITON,
             "not ported: skipping zero units is a data-dependent masked row load, which Mosaic's "
             "TMA copies (static tiles) do not express"),
    OpChoice("sampler threshold search (radix_search)", Lowering.TRITON, Lowering.TRITON,
             "not ported: a vocabulary not a multiple of the 2048-key block needs masked tail loads"),
    OpChoice("prefill (DENSE path: chunked wkv, operands, output, shift_mix_rows; GEMMs)", Lowering.TRITON, Lowering.TRITON,
             "as pallas-fused (Triton kernels, XLA GEMMs): the prefill port is later work"),
)

WKV_TAIL, SHIFT_MIX = MOSAIC_TABLE[0], MOSAIC_TABLE[1]


def mosaic_ops(path: Path, interpret: bool) -> Ops:
    """The Ops for `path` with the Mosaic GPU kernels ``MOSAIC_TABLE`` assigns (compiled, or
    interpreted with interpret=True) swapped into ``fused_ops``; interpret=True runs the Mosaic
    kernels in GPU interpret mode (race detection on) and the rest in the Pallas interpreter."""
    if not isinstance(path, Path):
        raise ValueError(f"path must be a rwkv_jax.Path, got {path!r}")
    base = fused_ops(path, interpret)
    if path is Path.DENSE:
        return base
    swaps = {}
    if WKV_TAIL.lowering(interpret) is Lowering.MOSAIC:
        swaps["time_mix"] = functools.partial(in_place_time_mix, linear=base.linear, interpret=interpret, tail=wkv_tail)
    if SHIFT_MIX.lowering(interpret) is Lowering.MOSAIC:
        swaps["shift_mix"] = functools.partial(in_place_shift_mix, interpret=interpret, kernel=shift_mix)
    return base._replace(**swaps)


def shift_mix(h, delta, shift, ln_w, ln_b, mix, *, layer: int | None = None, interpret: bool = False):
    """The Mosaic shift_mix where the shift has h's dtype (its in-place contract), else the Triton one."""
    kernel = mosaic_shift_mix if shift.dtype == h.dtype else triton_shift_mix
    return kernel.shift_mix(h, delta, shift, ln_w, ln_b, mix, layer=layer, interpret=interpret)


def wkv_tail(partials, lora, vecs, r_k, v_first, S, *, layer: int | None = None, interpret: bool = False):
    """The Mosaic wkv tail where it serves the head size (N % 64 == 0), else the Triton one."""
    kernel = mosaic_wkv_tail if mosaic_wkv_tail.supports(r_k.shape[1]) else triton_wkv_tail
    return kernel.wkv_tail(partials, lora, vecs, r_k, v_first, S, layer=layer, interpret=interpret)
