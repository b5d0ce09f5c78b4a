"""Structured-output benchmark on the CPU: JSON-schema-constrained decoding under the scheduler.

N requests over 20 JSON schemas (nested objects, enums, arrays, numbers, strings with
patterns) on a random-weight model with the World vocabulary (JAX engine, one decode bucket
B, precompiled, grammars compiled before the clock starts). Reported:
- validity: every output that finishes "stop" must parse and validate (jsonschema); outputs
  that hit max_tokens are counted apart (random weights write long strings and numbers);
- throughput: generated tokens per wall second with the constraints against the same requests
  without them, each run to exactly the length its constrained twin produced (so both runs
  have the same requests, tokens and batch fill; wall time includes the host's mask work),
  the two kinds alternated ``--repeats`` times (min and median); also tokens per CPU second
  of the process (all threads), the work done, which the load of a shared machine moves far
  less than the wall time;
- the per-step host time of the masks (stats.mask_seconds / mask_steps) and per row;
- the step at B (``mask_overlap``): unmasked, the masks alone, masks-then-masked-step and the
  masked step that computes the masks while its forward runs, and the share of the mask
  time that hides behind the device.

    python benchmarks/structured_output.py --model tiny-world --requests 500 --batch 64 \\
        --out benchmarks/results/structured_output_tiny.json
    python benchmarks/structured_output.py --model 0.1b --requests 128 --batch 64 --max-tokens 48 \\
        --repeats 2 --out benchmarks/results/structured_output_0.1b.json
"""
from __future__ import annotations

import argparse
import json
import time
from typing import NamedTuple

import numpy as np

SCHEMAS = [
    {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer", "minimum": 0, "maximum": 120}},
     "required": ["name", "age"], "additionalProperties": False},
    {"type": "object", "properties": {"label": {"enum": ["positive", "negative", "neutral"]}}, "required": ["label"],
     "additionalProperties": False},
    {"type": "object", "properties": {"tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "minItems": 1, "maxItems": 3}},
     "required": ["tags"], "additionalProperties": False},
    {"type": "object", "properties": {"zip": {"type": "string", "pattern": "^[0-9]{5}$"}, "city": {"type": "string", "maxLength": 10}},
     "required": ["zip", "city"], "additionalProperties": False},
    {"type": "object", "properties": {"price": {"type": "number", "minimum": 0, "maximum": 1000}, "currency": {"enum": ["EUR", "USD"]}},
     "required": ["price", "currency"], "additionalProperties": False},
    {"type": "object", "properties": {"user": {"type": "object", "properties": {"id": {"type": "integer", "minimum": 1, "maximum": 9999},
                                                                             "admin": {"type": "boolean"}},
                                               "required": ["id", "admin"], "additionalProperties": False}},
     "required": ["user"], "additionalProperties": False},
    {"type": "object", "properties": {"date": {"type": "string", "pattern": "^20[0-9]{2}-[01][0-9]-[0-3][0-9]$"}}, "required": ["date"],
     "additionalProperties": False},
    {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9}, "minItems": 2, "maxItems": 5},
    {"type": "object", "properties": {"ok": {"type": "boolean"}, "code": {"enum": [200, 404, 500]}}, "required": ["ok", "code"],
     "additionalProperties": False},
    {"type": "object", "properties": {"point": {"type": "object", "properties": {"x": {"type": "integer", "minimum": -99, "maximum": 99},
                                                                              "y": {"type": "integer", "minimum": -99, "maximum": 99}},
                                                "required": ["x", "y"], "additionalProperties": False}},
     "required": ["point"], "additionalProperties": False},
    {"type": "object", "properties": {"sku": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{4}$"}, "qty": {"type": "integer", "minimum": 1, "maximum": 50}},
     "required": ["sku", "qty"], "additionalProperties": False},
    {"type": "object", "properties": {"answer": {"enum": ["yes", "no"]}, "confidence": {"type": "number", "minimum": 0, "maximum": 1}},
     "required": ["answer", "confidence"], "additionalProperties": False},
    {"type": "object", "properties": {"items": {"type": "array", "maxItems": 2, "items": {
        "type": "object", "properties": {"id": {"type": "integer", "minimum": 0, "maximum": 99}, "kind": {"enum": ["x", "y"]}},
        "required": ["id", "kind"], "additionalProperties": False}}}, "required": ["items"], "additionalProperties": False},
    {"type": "object", "properties": {"color": {"type": "string", "pattern": "^#[0-9a-f]{6}$"}}, "required": ["color"],
     "additionalProperties": False},
    {"type": "object", "properties": {"lang": {"enum": ["en", "de", "fr", "zh"]}, "words": {"type": "integer", "minimum": 0, "maximum": 500}},
     "required": ["lang", "words"], "additionalProperties": False},
    {"type": "object", "properties": {"title": {"type": "string", "maxLength": 16}, "year": {"type": "integer", "minimum": 1900, "maximum": 2030},
                                      "genre": {"enum": ["drama", "comedy"]}},
     "required": ["title", "year", "genre"], "additionalProperties": False},
    {"type": "object", "properties": {"matrix": {"type": "array", "maxItems": 2, "items": {"type": "array", "maxItems": 2,
                                                                                        "items": {"type": "integer", "minimum": 0, "maximum": 9}}}},
     "required": ["matrix"], "additionalProperties": False},
    {"type": "object", "properties": {"email": {"type": "string", "pattern": "^[a-z]{1,8}@[a-z]{1,8}\\.(com|org)$"}}, "required": ["email"],
     "additionalProperties": False},
    {"type": "object", "properties": {"status": {"enum": ["open", "closed"]}, "meta": {"type": "object", "properties": {
        "priority": {"type": "integer", "minimum": 1, "maximum": 5}, "flag": {"type": "boolean"}},
        "required": ["priority", "flag"], "additionalProperties": False}}, "required": ["status", "meta"], "additionalProperties": False},
    {"type": "object", "properties": {"note": {"type": "string"}}, "required": ["note"], "additionalProperties": False},  # unbounded
]


def build_engine(model: str, dtype: str):
    import rwkv_jax
    from rwkv7_apps.engines import random_model_path
    from rwkv_jax.engine import JaxEngine
    return JaxEngine(rwkv_jax.load(random_model_path(model), dtype=dtype), prefill_pieces=(16, 4, 1))


class Run(NamedTuple):
    results: dict
    wall_s: float
    cpu_s: float      # this process's CPU seconds (every thread): the work, whatever the machine's load
    stats: object


def run_once(engine, tok, requests, batch: int) -> Run:
    from scheduler import Scheduler, SchedulerConfig

    sched = Scheduler(engine, SchedulerConfig(max_batch=batch, buckets=[batch], prefill_policy="serial"),
                      tokenizer=tok)
    for r in requests:
        sched.add(r)
    start, cpu = time.perf_counter(), time.process_time()
    sched.run()
    return Run(sched.results, time.perf_counter() - start, time.process_time() - cpu, sched.stats)


def summary(runs: list[Run]) -> dict:
    """Tokens, decode steps and the min / median wall and CPU seconds (and tok/s) of repeated runs."""
    tokens = sum(len(o.tokens) for o in runs[0].results.values())
    stats = runs[0].stats
    wall, cpu = sorted(r.wall_s for r in runs), sorted(r.cpu_s for r in runs)
    return {"tokens": tokens, "decode_steps": stats.decode_steps,
            "mean_live_rows": round(stats.decode_tokens / max(1, stats.decode_steps), 1),
            "wall_s": [round(w, 2) for w in wall], "cpu_s": [round(c, 2) for c in cpu],
            "tok_s_best": round(tokens / wall[0], 1), "tok_s_median": round(tokens / float(np.median(wall)), 1),
            "tok_per_cpu_s_best": round(tokens / cpu[0], 1), "tok_per_cpu_s_median": round(tokens / float(np.median(cpu)), 1),
            "step_ms_median": [round(1e3 * float(np.median([s.seconds for s in r.stats.steps])), 1) for r in runs]}


def mask_overlap(engine, tok, constraints, batch: int, reps: int = 7, advance: int = 3) -> dict:
    """One B-row step of constrained rows (the schemas in turn, each ``advance`` tokens in),
    median and min ms over ``reps`` interleaved rounds: the unmasked step, the host masks alone, the
    masks computed first and then the masked step ("serial"), and the masked step given the
    mask function, which it calls after dispatching the forward ("overlapped"); the share of
    the mask time hidden behind the device is (serial - overlapped) / masks. Also, for the
    overlapped step, when the mask function started and ended and when the step ended (ms
    after the call, median): masks done well before the step's end ran under the forward."""
    from rwkv7_core.sampling import SamplingParams
    from rwkv7_core.token_mask import all_allowed, unpack_allowed
    from scheduler.grammar import fill_masks, grammars_for
    grammars, rng = grammars_for(tok, engine.vocab_size), np.random.default_rng(1)
    rows = [(r, grammars.matcher(constraints[r % len(constraints)])) for r in range(batch)]
    for _ in range(advance):  # a few tokens into each document
        for _, m in rows:
            m.consume(int(rng.choice(np.flatnonzero(unpack_allowed(m.mask(engine.vocab_size), engine.vocab_size)))))

    def masks():
        out = all_allowed(batch, engine.vocab_size)
        fill_masks(rows, out)
        return out

    row = engine.prefill(np.array([1, 2, 3], np.int32))
    engine.resize([], batch)
    for s in range(batch):
        engine.insert(s, row, SamplingParams(temperature=1.0, top_p=0.95, seed=s))
    tokens = np.full(batch, 5, np.int32)
    kinds = {"unmasked": lambda i: engine.step(tokens, np.full(batch, i, np.int32)),
             "masks": lambda i: masks(),
             "serial": lambda i: engine.step(tokens, np.full(batch, i, np.int32), allowed=masks()),
             "overlapped": lambda i: overlapped(i)}
    windows = []  # overlapped: ms from the step call to the mask function's start and end, and to the step's end

    def overlapped(i):
        start, marks = time.perf_counter(), []

        def timed():
            marks.append(time.perf_counter() - start)
            out = masks()
            marks.append(time.perf_counter() - start)
            return out
        engine.step(tokens, np.full(batch, i, np.int32), allowed=timed)
        windows.append([*marks, time.perf_counter() - start])

    times = {k: [] for k in kinds}
    for i in range(reps + 1):  # the first round compiles / warms
        for k, run in kinds.items():
            t = time.perf_counter()
            run(i)
            if i:
                times[k].append(1e3 * (time.perf_counter() - t))
    out = {}
    for stat, f in (("median", np.median), ("min", np.min)):
        ms = {k: float(f(v)) for k, v in times.items()}
        out[stat] = {**{f"{k}_ms": round(v, 2) for k, v in ms.items()},
                     "hidden_fraction": round((ms["serial"] - ms["overlapped"]) / ms["masks"], 2)}
    start, end, step = np.median(np.array(windows[1:]) * 1e3, axis=0)
    out["overlapped_mask_window_ms"] = {"masks_start": round(start, 2), "masks_end": round(end, 2), "step_end": round(step, 2)}
    return out


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="tiny-world", help="random model name with the World vocabulary")
    ap.add_argument("--requests", type=int, default=500)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--repeats", type=int, default=3, help="runs of each kind, alternated (min and median reported)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    import jsonschema

    from rwkv7_core.tokenizer import WorldTokenizer
    from scheduler import Request, SamplingParams
    from scheduler.constraint import Constraint
    from scheduler.grammar import grammars_for

    tok = WorldTokenizer()
    engine = build_engine(args.model, args.dtype)
    engine.compile([args.batch])
    t = time.perf_counter()
    constraints = [Constraint.json_schema(s) for s in SCHEMAS]
    for c in constraints:
        grammars_for(tok, engine.vocab_size).compiled(c)
    grammar_compile_s = time.perf_counter() - t
    rng = np.random.default_rng(0)
    prompts = [tok.encode(f"Record {i}: ") for i in range(args.requests)]
    seeds = rng.integers(2**32, size=args.requests)

    def requests(lengths=None):
        """Constrained requests, or (``lengths``) the same unconstrained, each to its length."""
        return [Request(f"r{i}", prompts[i], SamplingParams(
            max_tokens=args.max_tokens if lengths is None else max(1, lengths[i]), temperature=1.0, top_p=0.95,
            seed=int(seeds[i]), stop_tokens=(0,) if lengths is None else ()),
            constraint=constraints[i % len(SCHEMAS)] if lengths is None else None) for i in range(args.requests)]

    run_once(engine, tok, requests()[:args.batch], args.batch)  # warm: masked executables compiled
    constrained = [run_once(engine, tok, requests(), args.batch)]
    results = constrained[0].results
    lengths = [len(results[f"r{i}"].tokens) for i in range(args.requests)]
    plain = [run_once(engine, tok, requests(lengths), args.batch)]
    for _ in range(args.repeats - 1):  # alternate the two kinds of run (a shared machine)
        constrained.append(run_once(engine, tok, requests(), args.batch))
        plain.append(run_once(engine, tok, requests(lengths), args.batch))
    stop = valid = length = errors = 0
    per_schema = [[0, 0] for _ in SCHEMAS]  # stopped, length
    for i in range(args.requests):
        out = results[f"r{i}"]
        if out.finish_reason == "stop":
            stop += 1
            per_schema[i % len(SCHEMAS)][0] += 1
            try:
                jsonschema.validate(json.loads(tok.decode(out.tokens)), SCHEMAS[i % len(SCHEMAS)])
                valid += 1
            except (ValueError, jsonschema.ValidationError) as e:
                print("INVALID", i, repr(tok.decode(out.tokens))[:200], e)
        elif out.finish_reason == "length":
            length += 1
            per_schema[i % len(SCHEMAS)][1] += 1
        else:
            errors += 1
    stats = constrained[0].stats
    mask_s = float(np.median([r.stats.mask_seconds for r in constrained]))
    report = {
        "model": args.model, "backend": "jax", "device": "cpu", "requests": args.requests, "schemas": len(SCHEMAS),
        "batch": args.batch, "max_tokens": args.max_tokens, "repeats": args.repeats, "grammar_compile_s_20_schemas": round(grammar_compile_s, 3),
        "finished_stop": stop, "stop_valid": valid, "stop_valid_fraction": valid / stop if stop else None,
        "finished_length": length, "errors": errors, "per_schema_stop_length": per_schema,
        "same_tokens_every_repeat": all(r.results[k].tokens == results[k].tokens for r in constrained for k in results),
        "constrained": summary(constrained), "unconstrained": summary(plain),
        "mask_host_ms_per_step": round(1e3 * mask_s / max(1, stats.mask_steps), 3),
        "mask_host_us_per_row": round(1e6 * mask_s / max(1, stats.mask_rows), 2),
        "mask_share_of_wall": round(mask_s / float(np.median([r.wall_s for r in constrained])), 4),
        "step_at_batch": mask_overlap(engine, tok, constraints, args.batch),
    }
    c, u = report["constrained"], report["unconstrained"]
    report["throughput_ratio"] = {k: round(c[k] / u[k], 3) for k in ("tok_s_best", "tok_s_median", "tok_per_cpu_s_best",
                                                                    "tok_per_cpu_s_median")}
    print(json.dumps(report, indent=1))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)
    return report


if __name__ == "__main__":
    main()
