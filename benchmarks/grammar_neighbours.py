"""Does one row under an ambiguous grammar slow the unconstrained rows beside it? (issue 37 item 4)

A scheduler on a random-weight model with the World vocabulary (JAX engine, CPU) runs
``--neighbours`` unconstrained requests (random prompts, ``--max-tokens`` each, no stop
token), alone and beside one request constrained by the ambiguous Lark grammar
``s: s s | "a" | "aa"`` (every prefix has exponentially many parses; its mask work grows
with its length) with a long ``max_tokens``. Reported per run: the neighbours' median and
p90 gap between tokens, the constrained row's tokens and finish (a row over the per-step
mask budget, ``--grammar-step-items``, fails with an error naming it), and the host's mask
time per step. The runs alternate ``--repeats`` times (loaded, shared machine: the ratio
of medians is the number that matters).

    python benchmarks/grammar_neighbours.py --out benchmarks/results/grammar_neighbours_cpu.json
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np

AMBIGUOUS = 's: s s | "a" | "aa"\nstart: s\n'


def run(sched, neighbours: list[list[int]], max_tokens: int, constrained_tokens: int | None, tag: str) -> dict:
    """One run: the neighbours (and the constrained row when ``constrained_tokens``); their gaps."""
    from scheduler import Request, SamplingParams
    from scheduler.constraint import Constraint

    arrivals: dict[str, list[float]] = {}
    outputs = {}
    steps0, seconds0 = sched.stats.mask_steps, sched.stats.mask_seconds
    if constrained_tokens:
        sched.add(Request(f"{tag}-grammar", [1, 2, 3], SamplingParams(max_tokens=constrained_tokens, stop_tokens=[]),
                          constraint=Constraint.grammar(AMBIGUOUS)))
    for i, prompt in enumerate(neighbours):
        sched.add(Request(f"{tag}-n{i}", prompt, SamplingParams(max_tokens=max_tokens, stop_tokens=[])))
    sched.run(on_token=lambda rid, _: arrivals.setdefault(rid, []).append(time.perf_counter()),
              on_finish=lambda out: outputs.__setitem__(out.id, out))
    gaps = [g for rid, a in arrivals.items() if "-n" in rid for g in np.diff(a).tolist()]
    grammar = outputs.get(f"{tag}-grammar")
    steps = sched.stats.mask_steps - steps0
    return {"neighbour_gap_median_ms": statistics.median(gaps) * 1e3,
            "neighbour_gap_p90_ms": float(np.percentile(gaps, 90)) * 1e3,
            "constrained": None if grammar is None else {"tokens": len(grammar.tokens), "finish": grammar.finish_reason,
                                                          "error": grammar.error},
            "mask_ms_per_step": (sched.stats.mask_seconds - seconds0) / steps * 1e3 if steps else 0.0}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="tiny-world")
    p.add_argument("--neighbours", type=int, default=3)
    p.add_argument("--max-tokens", type=int, default=64, help="each neighbour's tokens")
    p.add_argument("--constrained-tokens", type=int, default=2000, help="the ambiguous row's max_tokens")
    p.add_argument("--grammar-step-items", type=int, default=None, help="override the mask budget")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()

    from rwkv7_apps.engines import load_engine, random_model_path
    from rwkv7_core.tokenizer import tokenizer_for
    from scheduler import Scheduler, SchedulerConfig
    from scheduler.grammar import current_limits, set_limits

    if args.grammar_step_items is not None:
        set_limits(current_limits().__class__(**{**current_limits().__dict__, "step_items": args.grammar_step_items}))
    engine = load_engine("jax", random_model_path(args.model))
    sched = Scheduler(engine, SchedulerConfig(max_batch=args.neighbours + 1, buckets=[args.neighbours + 1]),
                      tokenizer=tokenizer_for(engine.vocab_size))
    rng = np.random.default_rng(0)
    neighbours = [rng.integers(1, engine.vocab_size, 8).tolist() for _ in range(args.neighbours)]
    run(sched, neighbours, 4, 4, "warm")  # compiles the masked and unmasked steps, the grammar
    runs: dict[str, list[dict]] = {"alone": [], "beside_ambiguous": []}
    for r in range(args.repeats):
        runs["alone"].append(run(sched, neighbours, args.max_tokens, None, f"a{r}"))
        runs["beside_ambiguous"].append(run(sched, neighbours, args.max_tokens, args.constrained_tokens, f"b{r}"))
    medians = {k: statistics.median(x["neighbour_gap_median_ms"] for x in v) for k, v in runs.items()}
    result = {"model": args.model, "neighbours": args.neighbours, "max_tokens": args.max_tokens,
              "constrained_tokens": args.constrained_tokens, "step_items": current_limits().step_items,
              "runs": runs, "neighbour_gap_median_ms": medians,
              "ratio": medians["beside_ambiguous"] / medians["alone"]}
    print(json.dumps(result, indent=1))
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
