"""Grammar limits (issue 37, items 1, 2, 3, 12): every bound of scheduler/grammar_limits.py
refuses a spec just over it with a GrammarLimitError naming it and passes one at it; the
shapes that overflowed llguidance's native stack are refused before any compile, and a
spec within the limits compiles even when asked from a thread with a small stack (the
compile runs on the large-stack compile thread); a refused blow-up is not kept and the
cache stays within its bytes."""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from rwkv7_core.constants import WORLD_VOCAB_SIZE
from rwkv7_core.tokenizer import tokenizer_for
from scheduler.constraint import JSON_DEPTH, Constraint
from scheduler.grammar import Grammars
from scheduler.grammar_limits import GrammarLimitError, GrammarLimits, check, regex_size

pytest.importorskip("llguidance")


def object_chain(n: int) -> dict:
    """A schema n objects deep, each level a $ref to the next definition."""
    defs = {f"d{i}": {"type": "object", "properties": {"a": {"$ref": f"#/$defs/d{i + 1}"}}} for i in range(n)}
    defs[f"d{n}"] = {"type": "string"}
    return {"$defs": defs, "$ref": "#/$defs/d0"}


def nested(n: int) -> dict:
    schema: dict = {"type": "string"}
    for _ in range(n):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


def ref_chain(n: int) -> dict:
    defs = {f"d{i}": {"$ref": f"#/$defs/d{i + 1}"} for i in range(n)}
    defs[f"d{n}"] = {"type": "integer"}
    return {"$defs": defs, "$ref": "#/$defs/d0"}


def rule_chain(n: int) -> str:
    return "start: r0\n" + "".join(f"r{i}: r{i + 1}\n" for i in range(n)) + f'r{n}: "a"\n'


def refused(c: Constraint, limits: GrammarLimits) -> str:
    with pytest.raises(GrammarLimitError) as e:
        check(c, limits)
    assert "\n" not in str(e.value)
    return e.value.limit


def test_each_limit_refuses_just_over_it_and_passes_at_it():
    rng = np.random.default_rng()
    n = int(rng.integers(5, 40))
    at = GrammarLimits(max_depth=2 * n + 1, max_refs=n + 1)
    check(Constraint.json_schema(nested(n)), at)  # two containers a level, one at the bottom
    assert refused(Constraint.json_schema(nested(n + 1)), at) == "max_depth"
    check(Constraint.json_schema(object_chain(n)), GrammarLimits(max_depth=3 * n + 3, max_refs=n + 1))
    assert refused(Constraint.json_schema(object_chain(n)), at) == "max_depth"  # nesting through the $refs
    at = GrammarLimits(max_refs=n + 1, max_rules=n + 2, max_choices=n, max_bytes=4096)
    check(Constraint.json_schema(ref_chain(n)), at)
    assert refused(Constraint.json_schema(ref_chain(n + 2)), at) == "max_refs"
    check(Constraint.grammar(rule_chain(n)), at)
    assert refused(Constraint.grammar(rule_chain(n + 1)), at) == "max_rules"
    check(Constraint.choice([f"c{i}" for i in range(n)]), at)
    assert refused(Constraint.choice([f"c{i}" for i in range(n + 1)]), at) == "max_choices"
    at = GrammarLimits(max_depth=n, max_bytes=4096)
    check(Constraint.regex("(" * n + "a" + ")" * n), at)
    assert refused(Constraint.regex("(" * (n + 1) + "a" + ")" * (n + 1)), at) == "max_depth"
    check(Constraint.grammar("start: " + "(" * n + '"a"' + ")" * n), at)
    assert refused(Constraint.grammar("start: " + "(" * (n + 1) + '"a"' + ")" * (n + 1)), at) == "max_depth"
    assert refused(Constraint.regex("a" * 4097), at) == "max_bytes"


def test_ref_loops_are_refused_and_recursive_schemas_pass():
    limits = GrammarLimits()
    assert refused(Constraint.json_schema({"$ref": "#"}), limits) == "ref_loop"
    loop = {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}
    assert refused(Constraint.json_schema(loop), limits) == "ref_loop"
    tree = {"$defs": {"n": {"type": "object", "properties": {"kids": {"type": "array", "items": {"$ref": "#/$defs/n"}}}}},
            "$ref": "#/$defs/n"}
    check(Constraint.json_schema(tree), limits)


def test_json_too_deep_to_read_is_one_line():
    depth = JSON_DEPTH + int(np.random.default_rng().integers(1, 10_000))
    nested: dict = {"type": "string"}
    for _ in range(depth):
        nested = {"a": nested}
    for schema in ("[" * depth + "]" * depth, nested):
        with pytest.raises(ValueError, match=f"deeper than {JSON_DEPTH} levels"):
            Constraint.json_schema(schema)


SMALL_STACK_CHILD = """
import json, sys, threading
from rwkv7_core.constants import WORLD_VOCAB_SIZE
from rwkv7_core.tokenizer import tokenizer_for
import llguidance
from scheduler.constraint import Constraint
from scheduler.grammar import Grammars
from tests.scheduler.test_grammar_limits import object_chain
schema = object_chain(int(sys.argv[2]))
grammars = Grammars(tokenizer_for(WORLD_VOCAB_SIZE), WORLD_VOCAB_SIZE)
if sys.argv[1] == "compile-thread":
    compile = lambda: grammars.compiled(Constraint.json_schema(schema))
else:  # the library called on this thread
    grammar = llguidance.LLMatcher.grammar_from_json_schema(schema)
    compile = lambda: llguidance.LLMatcher.validate_grammar(grammar)
threading.stack_size(256 * 1024)
t = threading.Thread(target=lambda: print("compiled", compile() is not None, flush=True))
t.start()
t.join()
"""


def test_a_schema_within_the_limits_compiles_from_a_small_stack():
    """From a thread with 256 KiB of stack, a schema at the depth limit compiles (on the
    compile thread) where compiling it on that thread itself overflows the stack."""
    depth = GrammarLimits().max_depth // 2 - 2  # two containers per level, the root's two
    check(Constraint.json_schema(object_chain(depth)), GrammarLimits())
    runs = {how: subprocess.run([sys.executable, "-c", SMALL_STACK_CHILD, how, str(depth)], capture_output=True,
                                text=True, timeout=120) for how in ("compile-thread", "caller-thread")}
    assert runs["compile-thread"].returncode == 0 and "compiled True" in runs["compile-thread"].stdout, runs
    assert runs["caller-thread"].returncode < 0, runs  # the control: the same compile on the small stack dies


@pytest.fixture(scope="module")
def tokenizer():
    return tokenizer_for(WORLD_VOCAB_SIZE)


def test_the_native_crash_shapes_are_refused_before_compiling(tokenizer):
    grammars = Grammars(tokenizer, WORLD_VOCAB_SIZE)
    for c, limit in ((Constraint.json_schema(object_chain(2000)), "max_depth"),
                     (Constraint.grammar(rule_chain(3000)), "max_rules")):
        for _ in range(2):  # a repeat is answered from the refusals kept
            with pytest.raises(GrammarLimitError, match=f"limit {limit}=") as e:
                grammars.matcher(c)
            assert e.value.limit == limit
    assert grammars.cache_bytes == 0


def test_an_automaton_blow_up_is_refused_and_the_cache_keeps_its_bytes(tokenizer):
    rng = np.random.default_rng()
    limits = GrammarLimits(max_automaton_mb=4, cache_mb=1, max_regex_size=10**9)  # the measured backstop
    grammars = Grammars(tokenizer, WORLD_VOCAB_SIZE, limits)
    n = int(rng.integers(40, 60))
    with pytest.raises(GrammarLimitError, match="max_automaton_mb=4") as e:
        grammars.matcher(Constraint.regex(f"((a{{{n}}}){{{n}}}){{{n}}}"))
    assert e.value.limit == "max_automaton_mb"
    sizes = []
    for i in range(12):  # distinct constraints of 160-320 kB: the cache drops the oldest past 1 MB
        words = [f"w{i}x{j}" + "ab" * int(rng.integers(10_000, 20_000)) for j in range(8)]
        sizes.append(sum(map(len, words)))
        assert not grammars.matcher(Constraint.choice(words)).error
        assert grammars.cache_bytes <= limits.cache_mb * 2**20 or grammars.cache_entries == 1
    assert sum(sizes) > 2 * limits.cache_mb * 2**20 and grammars.cache_entries < len(sizes)


def test_a_mask_over_the_step_budget_is_one_line_error(tokenizer):
    grammars = Grammars(tokenizer, WORLD_VOCAB_SIZE, GrammarLimits(step_items=200))
    matcher = grammars.matcher(Constraint.grammar('start: s\ns: s s | "a" | "aa"\n'))
    a = tokenizer.encode("a")[0]
    for _ in range(400):
        matcher.mask(WORLD_VOCAB_SIZE)
        if matcher.error:
            break
        matcher.consume(a)
    assert matcher.error is not None and "limit 200" in matcher.error and "\n" not in matcher.error


def test_regex_size_writes_out_nested_counted_repetitions():
    """regex_size against the length of the regex's expansion, built alongside it at random:
    nested groups, counted repetitions {m} / {m,n} / {m,} (upper counts), escapes, classes."""
    rng = np.random.default_rng()
    for _ in range(200):
        def build(depth: int) -> tuple[str, int]:
            parts, total = [], 0
            for _ in range(int(rng.integers(1, 4))):
                kind = int(rng.integers(0, 4)) if depth < 3 else int(rng.integers(0, 3))
                text, size = [("a", 1), ("\\d", 1), ("[a-z]", 1)][kind] if kind < 3 else build(depth + 1)
                if kind == 3:
                    text = f"({text})"
                form = int(rng.integers(0, 4))
                m, k = int(rng.integers(1, 9)), int(rng.integers(0, 5))
                text, size = [(text, size), (f"{text}{{{m}}}", size * m), (f"{text}{{{m},{m + k}}}", size * (m + k)),
                              (f"{text}{{{m},}}", size * (m + 1))][form]
                parts.append(text)
                total += size
            return "".join(parts), total
        text, size = build(0)
        assert regex_size(text) == size, text
    assert regex_size("((a{100}){100}){100}") == 10**6
    c = Constraint.regex("((a{100}){100}){100}")
    with pytest.raises(GrammarLimitError, match="max_regex_size=100000") as e:
        check(c, GrammarLimits())
    assert e.value.limit == "max_regex_size"
