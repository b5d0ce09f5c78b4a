"""Host time of the token masks of rwkv7-serve's tool-call grammar (tool_choice "auto",
rwkv7_apps/serve/tool_calls.py) on the World vocabulary, against a plain JSON schema.

A seeded random walk draws an allowed token each step: in the text phase one without "<"
(free text that never starts the marker), in the call phase (after ``Sure.<tool_call>``) a
uniformly random allowed one, until the grammar completes. Reported: the grammar's compile
time (once per grammar) and the p50/p99/max host time of one step's packed mask ([V/32]
int32). The call-phase walks never draw end-of-text, so they write call after call.

    python benchmarks/tool_call_masks.py --walks 10 --out benchmarks/results/tool_call_masks.json
"""
from __future__ import annotations

import argparse
import json
import time

import numpy as np

from rwkv7_apps.serve.tool_calls import MARKER, ToolPlan
from rwkv7_core.constants import END_OF_TEXT
from rwkv7_core.tokenizer import WorldTokenizer
from scheduler.constraint import Constraint
from scheduler.grammar import grammars_for

TOOLS = {"weather": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                                      "days": {"type": "integer", "minimum": 1, "maximum": 14}},
                     "required": ["city", "days"], "additionalProperties": False},
         "clock": {"type": "object", "properties": {"zone": {"enum": ["UTC", "CET", "JST"]}}, "required": ["zone"],
                   "additionalProperties": False}}


def walk(grammars, tok, constraint, prefix: str, steps: int, rng, text: bool) -> list[float]:
    """Mask times (s) of one walk of at most ``steps`` tokens after ``prefix``."""
    m = grammars.matcher(constraint)
    for t in tok.encode(prefix):
        m.consume(t)
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        mask = m.mask(tok.vocab_size)
        times.append(time.perf_counter() - start)
        allowed = np.flatnonzero(np.unpackbits(mask.view(np.uint8), bitorder="little"))
        allowed = allowed[allowed != END_OF_TEXT]
        if m.done or not len(allowed):
            break
        if text:
            picks = [int(a) for a in rng.choice(allowed, 64) if b"<" not in tok.decode_bytes([int(a)])]
            allowed = picks or allowed
        m.consume(int(rng.choice(allowed)))
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--walks", type=int, default=10)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    tok = WorldTokenizer()
    grammars = grammars_for(tok, tok.vocab_size)
    rng = np.random.default_rng(args.seed)
    tools = Constraint.grammar(ToolPlan(TOOLS, {n: "" for n in TOOLS}, None, True).grammar())
    plain = Constraint.json_schema(TOOLS["weather"])
    rows, seen = [], set()
    for name, constraint, prefix, text in (("tools auto, text", tools, "", True),
                                           ("tools auto, call", tools, "Sure." + MARKER, False),
                                           ("json schema", plain, "", False)):
        start = time.perf_counter()
        grammars.compiled(constraint)
        compile_ms = None if constraint in seen else round(1e3 * (time.perf_counter() - start), 2)
        seen.add(constraint)
        ms = 1e3 * np.array([t for _ in range(args.walks)
                             for t in walk(grammars, tok, constraint, prefix, args.steps, rng, text)])
        rows.append({"grammar": name, "compile_ms": compile_ms, "masks": int(ms.size),
                     "p50_ms": round(float(np.median(ms)), 4), "p99_ms": round(float(np.percentile(ms, 99)), 3),
                     "max_ms": round(float(ms.max()), 2)})
        print(rows[-1])
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"walks": args.walks, "steps": args.steps, "seed": args.seed, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
