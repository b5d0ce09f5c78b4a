"""Where llguidance's native stack overflows, against the grammar limits (issue 37, item 1).

For each shape that compiles by native recursion (a JSON schema of objects chained by
``$ref``, plain nested objects, a chain of Lark rules), bisect the smallest size whose
compile (``grammar_from_*`` then ``validate_grammar``, no tokenizer) kills a child process
when run on a thread with ``S`` bytes of stack, for a few ``S``; report the stack per level,
the size the default ``GrammarLimits`` let through, and the margin on the compile thread's
stack (scheduler/grammar_worker.py ``STACK_BYTES``) projected from the per-level cost.

    python benchmarks/grammar_limits.py --out benchmarks/results/grammar_limits.json
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

CHILD = """
import json, sys, threading, llguidance
shape, n, stack = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
M = llguidance.LLMatcher
def grammar():
    if shape == "object_chain":
        defs = {f"d{i}": {"type": "object", "properties": {"a": {"$ref": f"#/$defs/d{i + 1}"}}} for i in range(n)}
        defs[f"d{n}"] = {"type": "string"}
        return M.grammar_from_json_schema(json.dumps({"$defs": defs, "$ref": "#/$defs/d0"}))
    if shape == "nested_objects":
        text = '{"type": "object", "properties": {"a": ' * n + '{"type": "string"}' + "}}" * n
        return M.grammar_from_json_schema(text)
    return M.grammar_from_lark("start: r0\\n" + "".join(f"r{i}: r{i + 1}\\n" for i in range(n)) + f'r{n}: "a"\\n')
threading.stack_size(stack)
t = threading.Thread(target=lambda: M.validate_grammar(grammar()))
t.start()
t.join()
"""

SHAPES = {"object_chain": "levels", "nested_objects": "levels", "rule_chain": "rules"}


def survives(shape: str, n: int, stack: int) -> bool:
    return subprocess.run([sys.executable, "-c", CHILD, shape, str(n), str(stack)], capture_output=True,
                          timeout=300).returncode == 0


def crash_size(shape: str, stack: int, high: int = 1 << 16) -> int | None:
    """The smallest size that dies on ``stack`` bytes (None: none up to ``high``)."""
    low = 1
    if survives(shape, high, stack):
        return None
    while high - low > max(1, low // 50):  # to 2 %
        mid = (low + high) // 2
        low, high = (mid, high) if survives(shape, mid, stack) else (low, mid)
    return high


def allowed(shape: str) -> int:
    """The largest size of ``shape`` the default GrammarLimits let through."""
    from scheduler.constraint import Constraint
    from scheduler.grammar_limits import GrammarLimitError, GrammarLimits, check

    def ok(n: int) -> bool:
        if shape == "rule_chain":
            c = Constraint.grammar("start: r0\n" + "".join(f"r{i}: r{i + 1}\n" for i in range(n)) + f'r{n}: "a"\n')
        elif shape == "object_chain":
            defs = {f"d{i}": {"type": "object", "properties": {"a": {"$ref": f"#/$defs/d{i + 1}"}}} for i in range(n)}
            defs[f"d{n}"] = {"type": "string"}
            c = Constraint.json_schema({"$defs": defs, "$ref": "#/$defs/d0"})
        else:
            c = Constraint.json_schema('{"type": "object", "properties": {"a": ' * n + '{"type": "string"}' + "}}" * n)
        try:
            check(c, GrammarLimits())
            return True
        except GrammarLimitError:
            return False

    n = 1
    while ok(n * 2):
        n *= 2
    step = n // 2
    while step:
        n += step if ok(n + step) else 0
        step //= 2
    return n


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--stacks-kb", default="512,2048,8192")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    from scheduler.grammar_worker import STACK_BYTES

    rows = {}
    for shape, unit in SHAPES.items():
        crashes = {kb: crash_size(shape, kb * 1024) for kb in map(int, args.stacks_kb.split(","))}
        per_level = [kb * 1024 / n for kb, n in crashes.items() if n]
        bytes_per = max(per_level) if per_level else None
        limit = allowed(shape)
        rows[shape] = {"unit": unit, "crash_size_by_stack_kb": crashes,
                       "stack_bytes_per_unit": bytes_per, "allowed_by_default_limits": limit,
                       "projected_crash_on_compile_thread": int(STACK_BYTES / bytes_per) if bytes_per else None,
                       "margin": STACK_BYTES / bytes_per / limit if bytes_per else None}
        print(shape, json.dumps(rows[shape]), flush=True)
    result = {"compile_thread_stack_bytes": STACK_BYTES, "shapes": rows}
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
