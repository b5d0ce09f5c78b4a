"""rwkv_jax.random_params: host=True draws exactly the weights of write_random_checkpoint."""
import jax
import jax.numpy as jnp
import numpy as np

import rwkv_jax
from rwkv7_core import named_config, write_random_checkpoint
from rwkv_jax.random_params import random_params


def test_host_draw_equals_the_random_checkpoint(tmp_path):
    config = named_config("tiny")
    write_random_checkpoint(tmp_path / "model.safetensors", config, seed=7)
    want = rwkv_jax.load(tmp_path / "model.safetensors", dtype="float32").params
    got = random_params(config, jnp.float32, seed=7, host=True)
    assert jax.tree.structure(got) == jax.tree.structure(want)
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_array_equal(np.asarray(g), np.asarray(w))
