"""Accuracy of a 16-bit wkv state (bfloat16, float16) against the float32 state on the same
random checkpoint with trained-like statistics (CPU, JAX xla, float32 weights).

The worst rounding schedule is measured: every token is its own decode step, so the state is
rounded to the state dtype after every token (a prefill call carries it in float32 and
rounds once at its end). All the models run side by side in one jitted step (the text fed to each, or generation).

- KL(float32 state || 16-bit state) of the next-token distribution at every position of
  --sequences texts of --positions tokens (the repo's README and docs/*.md, World tokenizer,
  ids folded into the vocabulary, one text per offset); mean and p99 over the 128 positions
  ending at 128, 1k, 4k and 8k (all sequences), with the top-1 agreement there;
- greedy agreement over --generate tokens from each text's first 64 tokens: "forced" is the
  fraction of positions where the 16-bit model, fed the float32 model's continuation, picks
  the same token; "identical prefix" is how many tokens the 16-bit model's own greedy run
  equals float32's before the first difference (mean over sequences);
- the same after a state save/load round trip: the 16-bit state after the prompt goes through
  a state file (``rwkv7_core.state_files``, in its own dtype) before the generation; the
  continuation is checked to be bit-identical to the run without the round trip.

Checkpoint: ``benchmarks/quant_accuracy.trained_like`` on ``random_tensors`` (heavy-tailed
projections with outlier channels), shape --config (default ``SHAPE``: 12 layers of C = 256,
4 heads of 64, V = 4096, so that the run takes minutes on 2 CPU cores; depth and head size
are those of the 0.1b/0.4b shapes). Writes benchmarks/results/state_dtype_accuracy.json/.md.
Run: ``python benchmarks/state_dtype_accuracy.py``.
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")
if __package__ in (None, ""):  # run as a script from the source tree
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    sys.path.insert(0, str(Path(__file__).resolve().parent))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from quant_accuracy import text_tokens, trained_like  # noqa: E402

import rwkv_jax  # noqa: E402
from rwkv7_core.checkpoint import write_checkpoint  # noqa: E402
from rwkv7_core.config import ModelConfig, named_config  # noqa: E402
from rwkv7_core.random_weights import random_tensors  # noqa: E402
from rwkv7_core.state_files import SequenceState, load_state, save_state  # noqa: E402
from rwkv_jax.forward import forward_fn  # noqa: E402
from rwkv_jax.paths import select_path  # noqa: E402
from rwkv_jax.state import State  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
SHAPE = ModelConfig(n_layer=12, n_embd=256, n_head=4, head_size=64, vocab_size=4096, dim_ffn=1024,
                    d_decay=32, d_aaa=32, d_mv=32, d_gate=64)
MARKS = (128, 1024, 4096, 8192)
WINDOW = 128
PROMPT = 64


def _step(params, tok, state, config):
    """One decode step of B rows: tok int32 [B] -> (logits float32 [B, V], state)."""
    return forward_fn(params, tok[:, None], state, config=config, path=select_path(tok.shape[0], 1), kernels="xla")


@functools.partial(jax.jit, static_argnames="config", donate_argnames="states")
def step(params, toks, states, *, config):
    """One decode step of each state in ``states`` (the first the float32 reference) fed its
    tokens int32 [B] of ``toks`` -> (KL of each other state's next-token distribution from the
    reference's [n - 1, B], each state's argmax [n, B], max |logit - reference logit| [n - 1, B],
    the new states)."""
    outs = [_step(params, t, s, config) for t, s in zip(toks, states)]
    ref = jax.nn.log_softmax(outs[0][0])
    kl = jnp.stack([jnp.sum(jnp.exp(ref) * (ref - jax.nn.log_softmax(lg)), -1) for lg, _ in outs[1:]])
    err = jnp.stack([jnp.abs(outs[0][0] - lg).max(-1) for lg, _ in outs[1:]])
    return kl, jnp.stack([lg.argmax(-1).astype(jnp.int32) for lg, _ in outs]), err, tuple(s for _, s in outs)


def forced(params, tokens: np.ndarray, states: tuple, config) -> tuple:
    """Every state fed tokens [T, B] step by step -> (KL [T, n - 1, B], argmax [T, n, B],
    errors [T, n - 1, B], final states)."""
    kls, tops, errs = [], [], []
    for t in range(tokens.shape[0]):
        tok = jnp.asarray(tokens[t])
        kl, top, err, states = step(params, (tok,) * len(states), states, config=config)
        kls.append(kl)
        tops.append(top)
        errs.append(err)
    return np.stack(kls), np.stack(tops), np.stack(errs), states


def window_stats(kl: np.ndarray, top1: np.ndarray, err: np.ndarray) -> dict:
    """KL mean / p99, top-1 agreement and max |logit error| ([T, B] each) over the WINDOW
    positions ending at each mark."""
    out = {}
    for mark in MARKS:
        if mark > kl.shape[0]:
            continue
        k = kl[mark - WINDOW:mark].ravel().astype(np.float64)
        out[str(mark)] = {"kl_mean": float(k.mean()), "kl_p99": float(np.percentile(k, 99)),
                          "top1": float(top1[mark - WINDOW:mark].mean()),
                          "max_logit_error": float(err[mark - WINDOW:mark].max())}
    return out


def round_trip(state: State, config: ModelConfig, folder: str) -> State:
    """Each row of a B-row state through a state file and back (in its own dtype)."""
    rows = []
    for b in range(state.wkv.shape[0]):
        path = Path(folder) / f"row{b}.safetensors"
        att, wkv, ffn = (np.asarray(leaf[b]) for leaf in state)
        save_state(path, SequenceState(att, wkv, ffn, PROMPT), config)
        back = load_state(path, config, np.dtype(wkv.dtype).name)
        rows.append([back.att_shift, back.wkv, back.ffn_shift])
    return State(*(jnp.asarray(np.stack(leaf)) for leaf in zip(*rows)))


def identical_prefix(a: np.ndarray, b: np.ndarray) -> float:
    """Mean over columns of how many leading rows of a [n, B] and b agree."""
    same = a == b
    return float(np.mean([len(col) if col.all() else int(np.argmin(col)) for col in same.T]))


def generate(params, first: np.ndarray, states: tuple, n: int, config) -> np.ndarray:
    """n steps from the tokens ``first`` int32 [B]: states[0] (float32) greedy on its own
    tokens; then per 16-bit state dtype a pair (fed float32's tokens, greedy on its own).
    Returns the argmax of every state [n, len(states), B] (row t: after t + 1 steps)."""
    toks = [jnp.asarray(first)] * len(states)
    tops = []
    for _ in range(n):
        _, top, _, states = step(params, tuple(toks), states, config=config)
        tops.append(top)
        toks = [top[0] if i % 2 else top[i] for i in range(len(states))]  # odd: forced on float32's
    return np.stack(tops)


def greedy_rows(tops: np.ndarray, i: int) -> dict:
    """Agreement of the pair of 16-bit states at columns (i, i + 1) of ``generate`` with float32."""
    ref = tops[:, 0]
    return {"forced_agreement": float((tops[:, i] == ref).mean()),
            "identical_prefix": identical_prefix(tops[:, i + 1], ref)}


def measure(path: Path, config: ModelConfig, texts: np.ndarray, n_gen: int, state_dtypes: list, folder: str) -> dict:
    """The float32 state against each of ``state_dtypes``, side by side (see module doc)."""
    models = [rwkv_jax.load(path, state_dtype=sd) for sd in ["float32", *state_dtypes]]
    params, B = models[0].params, texts.shape[0]
    t0 = time.perf_counter()
    kl, tops, err, _ = forced(params, texts.T, tuple(m.init_state(B) for m in models), config)
    rows = {sd: {"text": window_stats(kl[:, i], tops[:, i + 1] == tops[:, 0], err[:, i])}
            for i, sd in enumerate(state_dtypes)}
    print(f"  text: {time.perf_counter() - t0:.0f} s", flush=True)
    # the prompt step by step, then generation from the last prompt token: float32, and per
    # 16-bit dtype a forced and a free state, with and without a round trip through a state file
    _, _, _, after = forced(params, texts[:, :PROMPT - 1].T, tuple(m.init_state(B) for m in models), config)
    pairs = [after[0]]
    for state in after[1:]:
        pairs += [jax.tree.map(jnp.copy, state), jax.tree.map(jnp.copy, state)]
    for state in after[1:]:
        loaded = round_trip(state, config, folder)
        pairs += [loaded, jax.tree.map(jnp.copy, loaded)]
    tops = generate(params, texts[:, PROMPT - 1], tuple(pairs), n_gen, config)
    n = len(state_dtypes)
    for i, sd in enumerate(state_dtypes):
        plain, trip = 1 + 2 * i, 1 + 2 * (n + i)
        rows[sd]["greedy"] = greedy_rows(tops, plain)
        rows[sd]["greedy_after_round_trip"] = {
            **greedy_rows(tops, trip), "bit_identical_to_no_round_trip": bool(
                np.array_equal(tops[:, trip:trip + 2], tops[:, plain:plain + 2]))}
        print(f"  {sd}: {json.dumps(rows[sd])}", flush=True)
    print(f"  total {time.perf_counter() - t0:.0f} s", flush=True)
    return rows


def markdown(out: dict) -> str:
    c = out["config"]
    lines = [f"16-bit wkv state vs the float32 state on the same trained-like random checkpoint "
             f"(L{c['n_layer']} C{c['n_embd']} H{c['n_head']}x{c['head_size']} V{c['vocab_size']}, float32 weights, "
             f"JAX xla, CPU), the state rounded after every token: {out['sequences']} texts of {out['positions']} "
             f"tokens; {out['generated']} greedy tokens after a {PROMPT}-token prompt per text.", "",
             "| state | position | KL mean | KL p99 | top-1 | max logit err |", "|---|---|---|---|---|---|"]
    for sd, row in out["state_dtypes"].items():
        for mark, r in row["text"].items():
            lines.append(f"| {sd} | {mark} | {r['kl_mean']:.2e} | {r['kl_p99']:.2e} | {r['top1']:.4f} | "
                         f"{r['max_logit_error']:.4f} |")
    lines += ["", "| state | greedy forced | identical prefix | after round trip: forced | identical prefix | "
                  "bit-identical to no round trip |", "|---|---|---|---|---|---|"]
    for sd, row in out["state_dtypes"].items():
        g, rt = row["greedy"], row["greedy_after_round_trip"]
        lines.append(f"| {sd} | {g['forced_agreement']:.4f} | {g['identical_prefix']:.0f} of {out['generated']} | "
                     f"{rt['forced_agreement']:.4f} | {rt['identical_prefix']:.0f} | "
                     f"{'yes' if rt['bit_identical_to_no_round_trip'] else 'no'} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=None, help="a named shape (default: SHAPE, see the module doc)")
    ap.add_argument("--positions", type=int, default=8192)
    ap.add_argument("--sequences", type=int, default=4)
    ap.add_argument("--generate", type=int, default=2000)
    ap.add_argument("--state-dtypes", default="bfloat16,float16")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--output", type=Path, default=RESULTS / "state_dtype_accuracy.json")
    args = ap.parse_args(argv)
    config = named_config(args.config) if args.config else SHAPE
    flat = text_tokens(args.positions * args.sequences, config.vocab_size)
    texts = flat.reshape(args.sequences, args.positions)
    out = {"config": config._asdict(), "positions": args.positions, "sequences": args.sequences,
           "generated": args.generate, "state_dtypes": {}}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trained-like.safetensors"
        write_checkpoint(path, trained_like(random_tensors(config, args.seed), args.seed + 1))
        out["state_dtypes"] = measure(path, config, texts, args.generate, args.state_dtypes.split(","), tmp)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(out, indent=1) + "\n")
    args.output.with_suffix(".md").write_text(markdown(out))
    print(markdown(out))
    print(f"wrote {args.output} and {args.output.with_suffix('.md')}")


if __name__ == "__main__":
    main()
