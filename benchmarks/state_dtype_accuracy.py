"""Accuracy of a 16-bit wkv state (bfloat16, float16) against the float32 state on the same
random checkpoint with trained-like statistics (CPU, JAX xla, float32 weights).

The worst rounding schedule is measured: every token is its own decode step, so the state is
rounded to the state dtype after every token (a prefill call carries it in float32 and
rounds once at its end). Both models run side by side in one jitted scan.

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

import rwkv_jax  # noqa: E402
from quant_accuracy import text_tokens, trained_like  # noqa: E402
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


@functools.partial(jax.jit, static_argnames="config")
def forced(params, tokens, ref_state, state, *, config):
    """Both states fed tokens int32 [T, B] one step at a time -> (KL [T, B], top-1 equal [T, B],
    |logit error| max [T, B], final states)."""
    def body(carry, tok):
        a, b = carry
        la, a = _step(params, tok, a, config)
        lb, b = _step(params, tok, b, config)
        lp, lq = jax.nn.log_softmax(la), jax.nn.log_softmax(lb)
        kl = jnp.sum(jnp.exp(lp) * (lp - lq), -1)
        return (a, b), (kl, la.argmax(-1) == lb.argmax(-1), jnp.abs(la - lb).max(-1))
    (a, b), out = jax.lax.scan(body, (ref_state, state), tokens)
    return out, a, b


@functools.partial(jax.jit, static_argnames=("config", "n"))
def greedy(params, first, state, *, config, n):
    """n greedy tokens [n, B] from the logits-producing token `first` int32 [B] and its state."""
    def body(carry, _):
        tok, s = carry
        logits, s = _step(params, tok, s, config)
        nxt = logits.argmax(-1).astype(jnp.int32)
        return (nxt, s), nxt
    _, toks = jax.lax.scan(body, (first, state), None, length=n)
    return toks


def window_stats(kl: np.ndarray, top1: np.ndarray, err: np.ndarray) -> dict:
    """KL mean / p99, top-1 agreement and max |logit error| over the WINDOW positions ending at each mark."""
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


def measure(path: Path, config: ModelConfig, texts: np.ndarray, n_gen: int, state_dtype: str, folder: str) -> dict:
    ref_model = rwkv_jax.load(path)
    model = rwkv_jax.load(path, state_dtype=state_dtype)
    params, B = ref_model.params, texts.shape[0]
    t0 = time.perf_counter()
    (kl, top1, err), _, _ = forced(params, jnp.asarray(texts.T), ref_model.init_state(B), model.init_state(B),
                                   config=config)
    row = {"text": window_stats(*(np.asarray(x) for x in (kl, top1, err)))}
    # greedy: both models read the prompt step by step, then the float32 model generates
    prompt = jnp.asarray(texts[:, :PROMPT].T)
    _, ref_state, state = forced(params, prompt[:-1], ref_model.init_state(B), model.init_state(B), config=config)
    ref_gen = np.asarray(greedy(params, prompt[-1], ref_state, config=config, n=n_gen))
    feed = jnp.asarray(np.concatenate([np.asarray(prompt[-1:]), ref_gen[:-1]]))
    (_, agree, _), _, _ = forced(params, feed, ref_state, state, config=config)
    own = np.asarray(greedy(params, prompt[-1], state, config=config, n=n_gen))
    row["greedy"] = {"forced_agreement": float(np.asarray(agree).mean()), "identical_prefix": identical_prefix(own, ref_gen)}
    loaded = round_trip(state, config, folder)
    (_, agree_rt, _), _, _ = forced(params, feed, ref_state, loaded, config=config)
    own_rt = np.asarray(greedy(params, prompt[-1], loaded, config=config, n=n_gen))
    row["greedy_after_round_trip"] = {"forced_agreement": float(np.asarray(agree_rt).mean()),
                                      "identical_prefix": identical_prefix(own_rt, ref_gen),
                                      "bit_identical_to_no_round_trip": bool(np.array_equal(own_rt, own)
                                                                             and np.array_equal(agree_rt, agree))}
    row["seconds"] = round(time.perf_counter() - t0, 1)
    print(f"  {state_dtype}: {json.dumps(row)}", flush=True)
    return row


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
        for sd in args.state_dtypes.split(","):
            out["state_dtypes"][sd] = measure(path, config, texts, args.generate, sd, tmp)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(out, indent=1) + "\n")
    args.output.with_suffix(".md").write_text(markdown(out))
    print(markdown(out))
    print(f"wrote {args.output} and {args.output.with_suffix('.md')}")


if __name__ == "__main__":
    main()
