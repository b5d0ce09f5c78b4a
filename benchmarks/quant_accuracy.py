"""Accuracy of quantized weights against the float32 model on the same checkpoint (CPU, JAX xla).

For each checkpoint kind and quantization (int8 and int4 with groups of 64 and 128, fp8 per row;
``--variants`` picks some):

- next-token KL(float32 || quantized), mean and p99 over the positions of real English text
  (the repo's README and docs/*.md through the World tokenizer, --positions of them), the
  largest |logit error| there, and top-1 agreement;
- greedy agreement over --generate tokens: the float32 model decodes greedily from the text's
  first 64 tokens; "forced" is the fraction of those positions where the quantized model, fed
  the float32 continuation, picks the same token; "identical prefix" runs the quantized model
  greedily on its own and counts the tokens equal to float32's before the first difference
  (it stops there: after one different token the two texts are unrelated).

The ``-search`` and ``-gptq`` variants are calibrated as ``rwkv7-convert --calibration``
writes them (``rwkv7_apps.tools.calibrate``: the activation-aware scale search, and GPTQ) on
CALIBRATION tokens of the same docs after the measured positions (disjoint text), through the
float32 torch reference.

Checkpoint kinds (0.1b shape by default, float32, seeded; --config for another shape):
- ``plain``: ``rwkv7_core.random_weights`` (Gaussian projections);
- ``trained-like``: the same, with every quantized projection (r/k/v/o, channel-mix key/value,
  head) redrawn from a Student-t with 3 degrees of freedom rescaled to the Gaussian's standard
  deviation (heavy tails, as trained weights have), and 4 input channels per matrix (outlier
  features) scaled up 8x.

``--embedding`` measures instead what quantizing the embedding too would cost: the embedding
rows rounded through int8 with groups of 128 (``rwkv7_core.quantization.quantize`` then
``dequantize``: the numbers a lookup of int8 rows would give), alone (projections float32) and
with int8 projections (groups of 128); it writes quant_accuracy_embedding[_KIND].json/.md.

Writes benchmarks/results/quant_accuracy[_KIND].json and .md. Run:
``python benchmarks/quant_accuracy.py`` (~20 min on 2 idle cores; --kind plain / trained-like runs
one of them; --config tiny for a smoke run).
"""
from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np

import rwkv_jax
from rwkv7_apps.tools.calibrate import METHODS, calibrated_tensors
from rwkv7_core.checkpoint import read_checkpoint, write_checkpoint
from rwkv7_core.config import named_config
from rwkv7_core.quantization import dequantize, metadata, quantize, quantized_key, spec_for
from rwkv7_core.random_weights import random_tensors
from rwkv7_core.tokenizer import WorldTokenizer

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
VARIANTS = {"int8-g64": ("int8", 64), "int8-g128": ("int8", 128), "fp8": ("fp8", None),
            "int4-g64": ("int4", 64), "int4-g128": ("int4", 128)}
CALIBRATED = {f"int4-g{g}-{method}": ("int4", g, method) for method in METHODS for g in (64, 128)}  # module doc
CALIBRATION = 4096  # calibration tokens, the docs' text after the measured positions
EMBEDDING_VARIANTS = {"emb-int8-g128": ("none", None), "int8-g128 + emb-int8-g128": ("int8", 128)}
CHUNK = 256
PROMPT = 64
OUTLIER_CHANNELS, OUTLIER_SCALE, T_DOF = 4, 8.0, 3


def trained_like(tensors: dict, seed: int) -> dict:
    """Heavy-tailed projections with a few outlier input channels (see module doc)."""
    rng = np.random.default_rng(seed)
    out = dict(tensors)
    for key, w in tensors.items():
        if not quantized_key(key):
            continue
        t = rng.standard_t(T_DOF, size=w.shape) / np.sqrt(T_DOF / (T_DOF - 2))  # unit variance
        t = (t * w.std()).astype(np.float32)
        t[:, rng.choice(w.shape[1], OUTLIER_CHANNELS, replace=False)] *= OUTLIER_SCALE
        out[key] = t
    return out


def int8_embedding(tensors: dict) -> dict:
    """The checkpoint with its embedding rounded through int8 (groups of 128, see module doc)."""
    return {**tensors, "emb.weight": dequantize(*quantize(tensors["emb.weight"], spec_for("int8", 128), "emb.weight"))}


def text_tokens(n: int, vocab: int) -> np.ndarray:
    """n tokens of the repo's English docs (World tokenizer; ids folded into a smaller vocab)."""
    text = "\n\n".join(p.read_text() for p in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))])
    ids = np.asarray(WorldTokenizer().encode(text), np.int64)
    if len(ids) < n:
        raise SystemExit(f"the docs hold {len(ids)} tokens, fewer than --positions {n}")
    return (ids[:n] % vocab).astype(np.int32)


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def full_logits(model, tokens: np.ndarray):
    """Yields float32 logits [T_chunk, V] of consecutive chunks of tokens (state carried)."""
    state = model.init_state(1)
    for i in range(0, len(tokens), CHUNK):
        logits, state = model.forward(tokens[None, i:i + CHUNK], state, full_output=True)
        yield np.asarray(logits[0], np.float32)


def greedy(model, prompt: np.ndarray, n: int, follow: np.ndarray | None = None) -> np.ndarray:
    """n greedy tokens after prompt; with `follow`, stops after the first token that differs."""
    state = model.init_state(1)
    logits, state = model.forward(prompt[None], state)
    out = []
    for i in range(n):
        out.append(int(np.argmax(np.asarray(logits[0]))))
        if follow is not None and out[-1] != follow[i]:
            break
        logits, state = model.forward(np.asarray([[out[-1]]], np.int32), state)
    return np.asarray(out, np.int32)


def calibrated_checkpoint(path: Path, out: Path, scheme: str, group: int, method: str,
                          calibration: np.ndarray) -> Path:
    """`path`'s checkpoint quantized by `method` (gptq | search) on `calibration` tokens,
    written to `out`."""
    tensors, _ = read_checkpoint(path)
    spec = spec_for(scheme, group)
    t0 = time.perf_counter()
    write_checkpoint(out, calibrated_tensors(path, {k: tensors[k] for k in tensors}, spec, calibration, method),
                     metadata(spec))
    print(f"  calibrated {out.name} in {time.perf_counter() - t0:.0f} s", flush=True)
    return out


def measure(path: Path, tokens: np.ndarray, n_gen: int, variants: dict = VARIANTS, variant_path: Path | None = None,
            variant_paths: dict | None = None) -> dict:
    """The float32 model at `path` against each of `variants` (loaded from `variant_path`,
    default `path`, or from variant_paths[name])."""
    base = rwkv_jax.load(path)
    ref_chunks = list(full_logits(base, tokens))
    prompt = tokens[:PROMPT]
    t0 = time.perf_counter()
    ref_gen = greedy(base, prompt, n_gen)
    print(f"  float32 greedy {n_gen} tokens in {time.perf_counter() - t0:.0f} s", flush=True)
    forced_input = np.concatenate([prompt, ref_gen[:-1]])
    del base
    rows = {}
    for name, (scheme, group) in variants.items():
        t0 = time.perf_counter()
        stored = variant_paths is not None and name in variant_paths  # a quantized file: its own group
        model = rwkv_jax.load(variant_paths[name] if stored else variant_path or path, quantization=scheme,
                              group_size=None if stored else group)
        kl, max_err, top1 = [], 0.0, []
        for ref, got in zip(ref_chunks, full_logits(model, tokens)):
            lp, lq = log_softmax(ref.astype(np.float64)), log_softmax(got.astype(np.float64))
            kl.append((np.exp(lp) * (lp - lq)).sum(-1))
            max_err = max(max_err, float(np.abs(ref - got).max()))
            top1.append(ref.argmax(-1) == got.argmax(-1))
        kl, top1 = np.concatenate(kl), np.concatenate(top1)
        forced = np.concatenate([c.argmax(-1) for c in full_logits(model, forced_input)])[PROMPT - 1:]
        free = greedy(model, prompt, n_gen, follow=ref_gen)
        same = free == ref_gen[:len(free)]
        rows[name] = {"kl_mean": float(kl.mean()), "kl_p99": float(np.percentile(kl, 99)),
                      "kl_max": float(kl.max()), "max_abs_logit_error": max_err,
                      "top1_agreement_text": float(top1.mean()),
                      "greedy_forced_agreement": float((forced == ref_gen).mean()),
                      "greedy_free_identical_prefix": int(n_gen if same.all() else np.argmin(same))}
        print(f"  {name}: {rows[name]} ({time.perf_counter() - t0:.0f} s)", flush=True)
        del model
    ref_all = np.concatenate(ref_chunks)
    return {"variants": rows, "float32_logit_std": float(ref_all.std()),
            "float32_mean_top1_prob": float(np.exp(log_softmax(ref_all.astype(np.float64)).max(-1)).mean())}


def markdown(out: dict) -> str:
    lines = [f"Quantized vs float32 on the same random checkpoint ({out['config']} shape, JAX xla, CPU): "
             f"{out['positions']} text positions, {out['generated']} greedy tokens.", "",
             "| checkpoint | weights | KL mean | KL p99 | max logit err | top-1 (text) | greedy forced | "
             "identical prefix |", "|---|---|---|---|---|---|---|---|"]
    for kind, res in out["checkpoints"].items():
        for name, r in res["variants"].items():
            lines.append(f"| {kind} | {name} | {r['kl_mean']:.2e} | {r['kl_p99']:.2e} | {r['max_abs_logit_error']:.3f} | "
                         f"{r['top1_agreement_text']:.4f} | {r['greedy_forced_agreement']:.4f} | "
                         f"{r['greedy_free_identical_prefix']} |")
    lines.append("")
    for kind, res in out["checkpoints"].items():
        lines.append(f"- {kind}: float32 logit std {res['float32_logit_std']:.2f}, "
                     f"mean top-1 probability {res['float32_mean_top1_prob']:.3f}")
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="0.1b")
    ap.add_argument("--positions", type=int, default=2048)
    ap.add_argument("--generate", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--kind", choices=("both", "plain", "trained-like"), default="both")
    ap.add_argument("--variants", default=",".join([*VARIANTS, *CALIBRATED]),
                    help=f"comma-separated subset of {', '.join([*VARIANTS, *CALIBRATED])} (default all)")
    ap.add_argument("--tag", default="", help="results name suffix (default none)")
    ap.add_argument("--embedding", action="store_true", help="measure an int8 embedding instead (see module doc)")
    ap.add_argument("--output", type=Path, default=None,
                    help="default benchmarks/results/quant_accuracy[_embedding][_KIND].json")
    args = ap.parse_args(argv)
    if args.output is None:
        stem = "quant_accuracy_embedding" if args.embedding else "quant_accuracy"
        stem += f"_{args.tag}" if args.tag else ""
        args.output = RESULTS / (f"{stem}.json" if args.kind == "both" else f"{stem}_{args.kind}.json")
    unknown = set(args.variants.split(",")) - set(VARIANTS) - set(CALIBRATED)
    if unknown:
        ap.error(f"--variants: unknown {', '.join(sorted(unknown))}")
    variants = {name: VARIANTS[name] if name in VARIANTS else CALIBRATED[name][:2] for name in args.variants.split(",")}
    config = named_config(args.config)
    text = text_tokens(args.positions + CALIBRATION, config.vocab_size)
    tokens, calibration = text[:args.positions], text[args.positions:]
    out = {"config": args.config, "positions": args.positions, "generated": args.generate,
           "calibration_tokens": CALIBRATION, "checkpoints": {}}
    plain = random_tensors(config, args.seed)
    with tempfile.TemporaryDirectory() as tmp:
        for kind, tensors in (("plain", plain), ("trained-like", trained_like(plain, args.seed + 1))):
            if args.kind not in ("both", kind):
                continue
            path = Path(tmp) / f"{kind}.safetensors"
            write_checkpoint(path, tensors)
            print(f"{kind}:", flush=True)
            if args.embedding:
                write_checkpoint(Path(tmp) / f"{kind}-emb.safetensors", int8_embedding(tensors))
                out["checkpoints"][kind] = measure(path, tokens, args.generate, EMBEDDING_VARIANTS,
                                                   Path(tmp) / f"{kind}-emb.safetensors")
            else:
                calibrated = {name: calibrated_checkpoint(path, Path(tmp) / f"{kind}-{name}.safetensors",
                                                          *CALIBRATED[name], calibration)
                              for name in variants if name in CALIBRATED}
                out["checkpoints"][kind] = measure(path, tokens, args.generate, variants, variant_paths=calibrated)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(out, indent=1) + "\n")
    args.output.with_suffix(".md").write_text(markdown(out))
    print(markdown(out))
    print(f"wrote {args.output} and {args.output.with_suffix('.md')}")


if __name__ == "__main__":
    main()
