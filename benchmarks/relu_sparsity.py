"""Measure the exact-zero sparsity of the channel-mix relu^2 activations, and the decode
bytes the sparse channel-mix can save.

Runs the JAX model eagerly on random tokens with an Ops whose channel_mix records
relu(xk @ Wk.T)^2 per layer. `union_sparsity[M]` is the fraction of hidden units that are
zero in all of M rows at once (what a kernel serving M rows can skip). The saving is the
skipped share of the ffn.value bytes among all weight bytes one B=1 decode step reads.

    python benchmarks/relu_sparsity.py --model tiny --model 0.1b    # CPU, random checkpoints
"""
from __future__ import annotations

import argparse
import json

import jax
import jax.numpy as jnp
import numpy as np

from rwkv7_core.config import ModelConfig, named_config
from rwkv_jax.forward import bind
from rwkv_jax.layouts import DenseRows
from rwkv_jax.ops import XLA_OPS
from rwkv_jax.state import init_state

UNION_ROWS = (1, 2, 4, 8, 16)


def measure(params: dict, config: ModelConfig, dtype, tokens: int = 64, seed: int = 0) -> dict:
    """Sparsity of relu^2 over `tokens` random tokens (one sequence, dense path)."""
    hidden_per_layer = []

    def recording_channel_mix(xk, w_key, w_val):
        pre = XLA_OPS.linear(xk, w_key).astype(jnp.float32)
        hidden_per_layer.append(np.asarray(pre) > 0)
        return XLA_OPS.channel_mix(xk, w_key, w_val)

    ids = jax.random.randint(jax.random.key(seed), (1, tokens), 0, config.vocab_size)
    model = bind(params, config)
    with jax.disable_jit():
        model(ids.reshape(-1), tuple(init_state(config, 1, dtype)),
              ops=XLA_OPS._replace(channel_mix=recording_channel_mix), rows=DenseRows(1, tokens, True))
    per_layer = [1.0 - float(active.mean()) for active in hidden_per_layer]
    union = {}
    for m in UNION_ROWS:
        groups = [a[: tokens // m * m].reshape(-1, m, a.shape[-1]).any(axis=1) for a in hidden_per_layer]
        union[m] = 1.0 - float(np.mean([g.mean() for g in groups]))
    return {"per_layer_sparsity": per_layer, "mean_sparsity": float(np.mean(per_layer)),
            "union_sparsity": union, **saving(config, union)}


def saving(config: ModelConfig, union: dict) -> dict:
    """Share of a B=1 (or M-row) decode step's weight bytes the sparse value product skips."""
    c = config
    step_weights = c.n_params - c.vocab_size * c.n_embd  # the embedding reads only B rows
    value_share = c.n_layer * c.n_embd * c.dim_ffn / step_weights
    return {"value_weight_share_of_step_bytes": value_share,
            "theoretical_byte_saving": {m: s * value_share for m, s in union.items()},
            "theoretical_speedup_b1": 1.0 / (1.0 - union[1] * value_share)}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", action="append", default=None, help="named shape (repeatable)")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--out", default=None, help="write the JSON here")
    args = ap.parse_args(argv)
    from rwkv_jax.random_params import random_params
    results = {}
    for name in args.model or ["tiny"]:
        config = named_config(name)
        results[name] = measure(random_params(config, jnp.float32, seed=0), config, jnp.float32, args.tokens)
        r = results[name]
        print(f"{name}: mean relu^2 sparsity {r['mean_sparsity']:.3f}; union over M rows "
              + ", ".join(f"M={m}: {s:.3f}" for m, s in r["union_sparsity"].items())
              + f"; value weights = {r['value_weight_share_of_step_bytes']:.1%} of B=1 step bytes; "
              f"B=1 byte saving {r['theoretical_byte_saving'][1]:.1%} "
              f"(speedup <= {r['theoretical_speedup_b1']:.2f}x)")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
