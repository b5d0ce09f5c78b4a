"""Packed allowed-token masks (rwkv7_core/token_mask.py): llguidance's bit layout."""
import numpy as np

from rwkv7_core.token_mask import ALL_ALLOWED, all_allowed, mask_words, pack_allowed, unpack_allowed


def test_pack_and_unpack_are_inverse_in_the_word_bit_layout():
    rng = np.random.default_rng()
    V = int(rng.integers(33, 200))
    allowed = rng.random((3, V)) < 0.4
    packed = pack_allowed(allowed)
    assert packed.shape == (3, mask_words(V)) and packed.dtype == np.int32
    np.testing.assert_array_equal(unpack_allowed(packed, V), allowed)
    v = int(rng.integers(V))
    assert bool((packed[0, v // 32] >> (v % 32)) & 1) == allowed[0, v]
    assert unpack_allowed(all_allowed(2, V), V).all() and (all_allowed(1, V) == ALL_ALLOWED).all()
