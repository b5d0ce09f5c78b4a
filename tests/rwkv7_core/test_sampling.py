"""The numpy sampling reference (rwkv7_core.sampling) that the engines implement on device."""
import numpy as np
import pytest

from rwkv7_core.sampling import (
    GOLDEN,
    banned_mask,
    gumbel_noise,
    lowbias32,
    nucleus_mask,
    sample_rows,
    sampling_rows,
    update_counts,
)
from scheduler import NONFINITE_TOKEN, SamplingParams


def draw_many(logits, params, n):
    """Draw n tokens from one row of logits with seeds 0..n-1."""
    ps = [params.replace(seed=s) for s in range(n)]
    rows = sampling_rows(ps)
    batch = np.repeat(logits[None], n, axis=0)
    return sample_rows(batch, np.zeros_like(batch), rows, banned_mask(ps, logits.size), np.zeros(n, np.int32))


def test_draws_follow_the_tempered_softmax():
    rng = np.random.default_rng(0)
    logits = rng.standard_normal(6).astype(np.float32)
    tokens = draw_many(logits, SamplingParams(temperature=0.7), 20000)
    p = np.exp(logits / 0.7)
    p /= p.sum()
    freq = np.bincount(tokens, minlength=6) / len(tokens)
    assert np.abs(freq - p).max() < 0.015


def test_top_k_top_p_and_bans_restrict_the_support():
    rng = np.random.default_rng(1)
    logits = rng.standard_normal(50).astype(np.float32) * 2
    order = np.argsort(-logits)
    top3 = set(draw_many(logits, SamplingParams(temperature=1.5, top_k=3), 3000).tolist())
    assert top3 == set(order[:3].tolist())
    p = np.exp(logits - logits.max())
    p /= p.sum()
    nucleus = order[:int(np.searchsorted(np.cumsum(p[order]), 0.6) + 1)]
    drawn = set(draw_many(logits, SamplingParams(temperature=1.0, top_p=0.6), 3000).tolist())
    assert drawn == set(nucleus.tolist())
    banned = tuple(order[:2].tolist())
    greedy = draw_many(logits, SamplingParams(banned_tokens=banned), 3)
    assert (greedy == order[2]).all()
    sampled = draw_many(logits, SamplingParams(temperature=2.0, banned_tokens=banned), 3000)
    assert not set(sampled.tolist()) & set(banned)


def test_nucleus_mask_keeps_ties_and_first_token():
    z = np.array([[1.0, 1.0, 0.0, -1.0]], np.float32)
    assert nucleus_mask(z, np.array([0]), np.array([0.01], np.float32)).tolist() == [[True, True, False, False]]
    assert nucleus_mask(z, np.array([3]), np.array([1.0], np.float32)).tolist() == [[True, True, True, False]]


def test_penalties_decay_and_nonfinite_rows():
    params = SamplingParams(presence_penalty=0.5, frequency_penalty=0.25, penalty_decay=0.5)
    rows = sampling_rows([params, params])
    counts = np.zeros((2, 4), np.float32)
    counts = update_counts(counts, np.array([1, 2]), rows.decay)
    counts = update_counts(counts, np.array([1, 3]), rows.decay)
    assert counts.tolist() == [[0, 1.5, 0, 0], [0, 0, 0.5, 1]]
    logits = np.array([[0, 1.0, 0.9, 0], [0, 0, 0.4, np.nan]], np.float32)
    # row 0: token 1 pays 0.5 + 1.5 * 0.25 = 0.875 -> 0.125 < 0.9, so token 2 wins
    out = sample_rows(logits, counts, rows, banned_mask([params, params], 4), np.zeros(2, np.int32))
    assert out.tolist() == [2, NONFINITE_TOKEN]


def test_noise_depends_only_on_seed_and_position():
    zeros = np.zeros(3, np.uint32)
    a = gumbel_noise(np.array([5, 6, 5], np.uint32), zeros, np.array([0, 0, 1]), 100)
    b = gumbel_noise(np.array([5], np.uint32), zeros[:1], np.array([0]), 100)
    assert np.array_equal(a[0], b[0]) and not np.array_equal(a[0], a[1]) and not np.array_equal(a[0], a[2])
    u = np.exp(-np.exp(-gumbel_noise(np.arange(200, dtype=np.uint32), np.zeros(200, np.uint32), np.zeros(200), 500)))
    assert 0 < u.min() and u.max() < 1 and abs(u.mean() - 0.5) < 0.01


def test_64_bit_seeds_draw_their_own_streams():
    """Seeds up to 2**64 - 1 are valid; seeds differing only in the high word draw
    different tokens, and a seed below 2**32 keys as before (high word 0 hashes to 0)."""
    rng = np.random.default_rng()
    low = int(rng.integers(2**32))
    seeds = [low, low + 2**32, low + 2**40, 2**64 - 1 - low]
    params = [SamplingParams(temperature=1.0, seed=s).validate() for s in seeds]
    rows = sampling_rows(params)
    assert rows.seed.tolist() == [s % 2**32 for s in seeds] and rows.seed_hi.tolist() == [s >> 32 for s in seeds]
    logits = np.zeros((len(seeds), 1000), np.float32)
    streams = {tuple(sample_rows(logits, np.zeros_like(logits), rows, np.zeros(logits.shape, bool),
                                 np.full(len(seeds), pos)).tolist()) for pos in range(8)}
    per_seed = list(zip(*streams))
    assert len(set(per_seed)) == len(seeds)
    with np.errstate(over="ignore"):  # seed < 2**32: the 32-bit scheme's key h(seed + h(pos + 1))
        key = lowbias32(np.uint32(low) + lowbias32(np.array([1], np.uint32)))
    bits = lowbias32(key[:, None] ^ lowbias32(np.arange(5, dtype=np.uint32) + np.uint32(GOLDEN))[None, :])
    old = -np.log(-np.log(((bits >> np.uint32(8)).astype(np.float32) + np.float32(0.5)) * np.float32(2.0 ** -24)))
    assert np.array_equal(gumbel_noise(rows.seed[:1], rows.seed_hi[:1], np.zeros(1), 5), old)
    for bad in (-1, 2**64, 10**30):
        with pytest.raises(ValueError, match="seed"):
            SamplingParams(seed=bad).validate()
