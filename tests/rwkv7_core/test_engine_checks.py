"""The engine contract's argument checks, shared by the JAX and torch engines."""
import numpy as np
import pytest

from rwkv7_core.engine_checks import check_prompt, check_resize, check_slot


def test_a_prompt_is_a_1d_token_array_of_enough_tokens():
    rng = np.random.default_rng()
    tokens = rng.integers(0, 100, int(rng.integers(2, 9)))
    assert check_prompt(tokens.tolist(), "prefill").tolist() == tokens.tolist()
    for bad, n in ((tokens[None], 1), (tokens[:0], 1), (tokens[:1], 2)):
        with pytest.raises(ValueError, match=f"prompt_logprobs needs a 1-D token array of >= {n} tokens"):
            check_prompt(bad, "prompt_logprobs", min_tokens=n)


def test_slots_and_kept_slots_lie_in_the_bucket():
    check_slot(3, 4)
    with pytest.raises(ValueError, match="slot 4 outside the current bucket of 4"):
        check_slot(4, 4)
    assert check_resize((2, 0), 4, 2) == [2, 0]
    for keep, new_bucket in (([0, 1, 2], 2), ([4], 8), ([-1], 2)):
        with pytest.raises(ValueError, match="cannot keep slots"):
            check_resize(keep, 4, new_bucket)
