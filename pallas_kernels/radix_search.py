"""The sampler's threshold search: per row, the smallest key at which a monotone predicate
holds, found by radix passes; each pass is one launch that also finishes the pass before.

Keys are int32 in signed order (``signed_keys``: a float32's order), weights float32 [B, V]
(None: every key weighs 1, so sums are counts). A pass splits the row's window
[lo, lo + 2**(shift + bits)) into 2**bits parts and sums, for each part's last key but the
top one (candidate j = lo + j * 2**shift - 1, j >= 1), the weights of the keys above it;
column 0 sums every key (the total a mass predicate scales by). ``failing`` counts the
candidates whose predicate fails, and the window moves up by that many parts:

- ``mass=False``: holds when the count above is below ``limit`` (top-k: limit = k);
- ``mass=True``: holds when the mass above is below ``limit`` x the total, or limit >= 1 (top-p).

``smallest_key_reference``: the pass sums by XLA reductions, 32 one-bit passes in a fori_loop
(``unrolled=False``) or unrolled passes of ``bits`` (straight-line: no device control flow).
``smallest_key``: the Pallas form, grid (B, V / BLOCK) per pass. Program (b, c) sums the
previous pass's partials of row b over the blocks (fixed order, so every program of a row
derives the same lo), applies ``failing``, writes lo, and sums its block of keys for this
pass's candidates: partials [B, V / BLOCK, 2**BITS]. A last launch of one program per row
finishes the last pass. 8 + 1 launches a search, none of them XLA's; the candidates' compares
are 16 x V per row and pass.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl

from .common import next_pow2, pow2_divisor, triton_params

BITS = 4          # the Pallas passes: 16 parts (15 candidates and the total), 8 passes
BLOCK = 2048      # keys per program (64 registers, no spill at 8 warps)
WARPS = 8
LOWEST = np.int32(np.iinfo(np.int32).min)   # the smallest signed-order key (unsigned 0)


def signed_keys(z: jax.Array) -> jax.Array:
    """int32 keys [B, V] ordered (as signed integers) like the float32 values z (NaN aside;
    -0.0 keys as 0.0, which it equals)."""
    bits = jax.lax.bitcast_convert_type(jnp.where(z == 0, 0.0, z), jnp.int32)
    return jnp.where(bits < 0, bits ^ jnp.int32(0x7FFFFFFF), bits)


def failing(sums: jax.Array, limit: jax.Array, mass: bool, total: jax.Array | None = None) -> jax.Array:
    """int32 [...]: candidates (columns j >= 1 of sums float32 [..., M]; column 0 the total)
    whose predicate fails, under limit float32 [...]; ``total`` [...]: column 0, where the caller
    cannot slice it (the Triton lowering has no slice)."""
    j = jax.lax.broadcasted_iota(jnp.int32, sums.shape, sums.ndim - 1)
    limit = limit[..., None]
    if mass:
        total = sums[..., :1] if total is None else total[..., None]
        holds = (sums < limit * total) | (limit >= 1)
    else:
        holds = sums < limit
    return jnp.sum(((j >= 1) & ~holds).astype(jnp.int32), axis=-1)


def above(keys: jax.Array, lo: jax.Array, j: jax.Array, shift) -> jax.Array:
    """bool: whether keys exceed candidate j = lo + j * 2**shift - 1 (every key for j = 0);
    int32 arguments broadcast against each other."""
    return (keys > lo + jnp.left_shift(j, shift) - 1) | (j == 0)


def moved(lo: jax.Array, sums: jax.Array, limit: jax.Array, mass: bool, shift, total=None) -> jax.Array:
    """The window's start after a pass of part width 2**shift: lo [...] moved up one part per
    failing candidate (``failing`` of sums [..., M])."""
    return lo + jnp.left_shift(failing(sums, limit, mass, total), shift)


def _shifts(bits: int) -> list[int]:
    return [32 - bits * (p + 1) for p in range(32 // bits)]


def pass_sums(keys: jax.Array, weights: jax.Array | None, lo: jax.Array, shift, bits: int,
              total: jax.Array | None = None) -> jax.Array:
    """float32 [B, 2**bits]: column 0 every key's weight (or ``total`` [B], when the caller has
    it), column j the weight of the keys above candidate j = lo + j * 2**shift - 1 (keys int32
    [B, V], lo int32 [B]; XLA reductions)."""
    j = np.arange(0 if total is None else 1, 2 ** bits, dtype=np.int32)  # numpy: constant first candidates
    over = above(keys[:, None, :], lo[:, None, None], j[None, :, None], shift)
    if weights is None:
        sums = jnp.sum(over, axis=2, dtype=jnp.int32).astype(jnp.float32)
    else:
        sums = jnp.sum(jnp.where(over, weights[:, None, :], 0.0), axis=2)
    return sums if total is None else jnp.concatenate([total[:, None], sums], axis=1)


def smallest_key_reference(keys: jax.Array, weights: jax.Array | None, limit: jax.Array, mass: bool,
                           unrolled: bool, bits: int = BITS) -> jax.Array:
    """int32 [B]: per row the smallest signed-order key at which the predicate holds (keys
    int32 [B, V], weights float32 [B, V] or None, limit float32 [B]); XLA passes of ``bits``
    unrolled, or 32 one-bit passes in a fori_loop. A count's total is V; a mass's is summed
    beside the candidates by each unrolled pass (as the kernel does: no separate reduction),
    once before the loop's passes."""
    lo = np.full(keys.shape[:1], LOWEST)
    total = None if mass else jnp.full(keys.shape[:1], keys.shape[1], jnp.float32)
    if not unrolled:
        total = jnp.sum(weights, axis=1) if mass else total

        def one_bit(p, lo):
            shift = 31 - p
            return moved(lo, pass_sums(keys, weights, lo, shift, 1, total), limit, mass, shift)

        return jax.lax.fori_loop(0, 32, one_bit, lo)
    for shift in _shifts(bits):
        shift = jnp.int32(shift)
        lo = moved(lo, pass_sums(keys, weights, lo, shift, bits, total), limit, mass, shift)
    return lo


def supports(V: int) -> bool:
    """Whether ``smallest_key`` takes rows of V keys: whole blocks, a power-of-two count."""
    return pow2_divisor(V, BLOCK) == BLOCK and next_pow2(V // BLOCK) == V // BLOCK


def _pass_kernel(*refs, shift, prior_shift, mass, first, weighted):
    refs = list(refs)
    keys_ref = refs.pop(0) if shift is not None else None
    w_ref = refs.pop(0) if weighted and shift is not None else None
    limit_ref = refs.pop(0)
    lo_ref, prior_ref = (None, None) if first else (refs.pop(0), refs.pop(0))
    lo_out = refs.pop(0)
    if first:
        lo = jnp.int32(LOWEST)
    else:
        sums = jnp.sum(prior_ref[...], axis=0)                      # [2**BITS]
        total = jnp.sum(jnp.where(jnp.arange(2 ** BITS) == 0, sums, 0.0))
        lo = moved(lo_ref[0], sums, limit_ref[...], mass, prior_shift, total)
    lo_out[...] = jnp.full(lo_out.shape, lo, jnp.int32)
    if shift is None:
        return
    over = above(keys_ref[...][None, :], lo, jnp.arange(2 ** BITS, dtype=jnp.int32)[:, None], shift)
    if w_ref is None:
        refs[0][...] = jnp.sum(over.astype(jnp.float32), axis=1)
    else:
        refs[0][...] = jnp.sum(jnp.where(over, w_ref[...][None, :], 0.0), axis=1)


def _pass(keys, weights, limit, lo, prior, *, shift, prior_shift, mass, interpret):
    B, V = keys.shape
    blocks = 1 if shift is None else V // BLOCK
    M = 2 ** BITS
    first = lo is None
    args, specs = [], []
    if shift is not None:
        args.append(keys)
        specs.append(pl.BlockSpec((None, BLOCK), lambda b, c: (b, c)))
        if weights is not None:
            args.append(weights)
            specs.append(pl.BlockSpec((None, BLOCK), lambda b, c: (b, c)))
    args.append(limit)
    specs.append(pl.BlockSpec((None,), lambda b, c: (b,)))
    if not first:
        args += [lo, prior]
        specs += [pl.BlockSpec((None, lo.shape[1]), lambda b, c: (b, 0)),
                  pl.BlockSpec((None,) + prior.shape[1:], lambda b, c: (b, 0, 0))]
    out_shape = [jax.ShapeDtypeStruct((B, blocks), jnp.int32)]
    out_specs = [pl.BlockSpec((None, None), lambda b, c: (b, c))]
    if shift is not None:
        out_shape.append(jax.ShapeDtypeStruct((B, blocks, M), jnp.float32))
        out_specs.append(pl.BlockSpec((None, None, M), lambda b, c: (b, c, 0)))
    return pl.pallas_call(
        functools.partial(_pass_kernel, shift=shift, prior_shift=prior_shift, mass=mass, first=first,
                          weighted=weights is not None),
        out_shape=out_shape, grid=(B, blocks), in_specs=specs, out_specs=out_specs,
        compiler_params=triton_params(num_warps=WARPS, num_stages=1),
        name="rwkv7_radix_pass" if shift is not None else "rwkv7_radix_finish",
        interpret=interpret,
    )(*args)


def smallest_key(keys: jax.Array, weights: jax.Array | None, limit: jax.Array, mass: bool,
                 interpret: bool = False) -> jax.Array:
    """Pallas: what ``smallest_key_reference(..., unrolled=True)`` returns, int32 [B], in
    32 / BITS pass launches and one finishing launch (rows of V keys with ``supports(V)``)."""
    lo = prior = prior_shift = None
    for shift in _shifts(BITS):
        lo, prior = _pass(keys, weights, limit, lo, prior, shift=shift, prior_shift=prior_shift, mass=mass,
                          interpret=interpret)
        prior_shift = shift
    (lo,) = _pass(keys, weights, limit, lo, prior, shift=None, prior_shift=prior_shift, mass=mass,
                  interpret=interpret)
    return lo[:, 0]
