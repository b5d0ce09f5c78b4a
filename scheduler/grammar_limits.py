"""What a grammar constraint may ask of the grammar library, checked before it is compiled.

llguidance compiles JSON schemas and Lark grammars by native recursion: a schema nested
deeply enough (directly or through a chain of ``$ref``\\ s) or a long enough chain of Lark
rules overflows the compiling thread's stack and the process dies (SIGSEGV). The checks
here bound every dimension that recursion follows, walking the spec iteratively (never by
Python or native recursion), so a spec within ``GrammarLimits`` compiles far inside the
stack of the compile thread (scheduler/grammar_worker.py), and one outside them is a
``GrammarLimitError`` naming the limit and its value. The library's own resource bounds
(lexer fuel, lexer states, Earley items per mask step) come from the same limits
(``ll_limits``). benchmarks/grammar_limits.py measures the crash depths and the margins.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, fields
from typing import Any

from .constraint import Constraint


class GrammarLimitError(ValueError):
    """A constraint beyond a ``GrammarLimits`` bound: ``limit`` is the bound's name, the
    message one line naming it and its value."""

    def __init__(self, limit: str, message: str):
        super().__init__(message)
        self.limit = limit


@dataclass(frozen=True)
class GrammarLimits:
    """Bounds on one constraint (each a positive int; the server's and batch job's
    ``--grammar-*`` options set them):

    ``max_bytes``: the spec's text; ``max_regex_size``: a regex's length with its counted
    repetitions (``x{m,n}``) written out (``regex_size``; regexes, a Lark grammar's ``/regex/``
    terminals and schema ``pattern``\\ s), the compiled automaton's size before any compile; ``max_depth``:
    nesting of brackets / JSON containers,
    followed through ``$ref``\\ s; ``max_rules``: Lark rules; ``max_refs``: ``$ref``\\ s on
    one path of a schema; ``max_choices``: entries of a choice constraint;
    ``max_automaton_mb``: memory one compiled constraint may take (measured at compile and
    first mask; the library's lexer-state count is bounded to match); ``step_items``: the
    parser's work budget for one mask (Earley items; a row over it fails with an error
    instead of stalling its batch); ``cache_mb``: the compiled-constraint cache, in bytes
    of memory measured at compile."""
    max_bytes: int = 1 << 20
    max_regex_size: int = 100_000
    max_depth: int = 128
    max_rules: int = 1000
    max_refs: int = 100
    max_choices: int = 1000
    max_automaton_mb: int = 64
    step_items: int = 1000
    cache_mb: int = 256

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"grammar limit {f.name} must be a positive integer, got {value!r}")
        if self.max_choices > MAX_ITEMS_IN_ROW:
            raise ValueError(f"grammar limit max_choices is at most {MAX_ITEMS_IN_ROW} (the parser's row width)")


MAX_ITEMS_IN_ROW = 2000
"""The parser's widest production (llguidance's default): a choice of more entries fails at run time."""

LEXER_STATE_BYTES = 2048
"""An upper estimate of one lexer state's memory (llguidance documents 1-2 kB)."""


def ll_limits(limits: GrammarLimits) -> dict[str, Any]:
    """Keyword arguments of ``llguidance.LLParserLimits`` for ``limits``."""
    return {"max_items_in_row": MAX_ITEMS_IN_ROW, "step_max_items": limits.step_items,
            "max_lexer_states": max(1, limits.max_automaton_mb * 2**20 // LEXER_STATE_BYTES),
            "initial_lexer_fuel": 1_000_000, "step_lexer_fuel": 200_000, "verbose_errors": False}


def check(c: Constraint, limits: GrammarLimits) -> None:
    """GrammarLimitError when ``c`` is beyond ``limits`` (see the module docstring)."""
    if c.kind == "choice":
        n = len(json.loads(c.spec))
        if n > limits.max_choices:
            raise GrammarLimitError("max_choices", f"{n} choices, more than the limit max_choices={limits.max_choices}")
    size = len(c.spec.encode())
    if size > limits.max_bytes:
        raise GrammarLimitError("max_bytes", f"the {_name(c)} is {size} bytes, more than the limit "
                                             f"max_bytes={limits.max_bytes}")
    if c.kind == "json_schema":
        schema = json.loads(c.spec)
        check_schema(schema, limits)
        for pattern in _patterns(schema):
            _check_regex_size(pattern, "JSON schema's pattern", limits)
    elif c.kind == "regex":
        _check_depth(bracket_depth(c.spec), "regex", limits)
        _check_regex_size(c.spec, "regex", limits)
    elif c.kind == "grammar":
        _check_depth(bracket_depth(c.spec), "grammar", limits)
        for terminal in LARK_REGEX.findall(c.spec):
            _check_regex_size(terminal, "grammar's regex", limits)
        rules = len(RULE.findall(c.spec))
        if rules > limits.max_rules:
            raise GrammarLimitError("max_rules", f"the grammar has {rules} rules, more than the limit "
                                                 f"max_rules={limits.max_rules}")


RULE = re.compile(r"^[ \t]*[?!]?[A-Za-z_][A-Za-z_0-9]*(?:\[[^\]\n]*\])?[ \t]*(?:\.[0-9-]+)?[ \t]*:", re.M)
"""A Lark rule or terminal definition at the start of a line (``name:``, ``name[lazy]:``, ``?name:``)."""


def _name(c: Constraint) -> str:
    return {"json_schema": "JSON schema", "json_object": "JSON object", "choice": "choice list"}.get(c.kind, c.kind)


def _check_depth(depth: int, what: str, limits: GrammarLimits) -> None:
    if depth > limits.max_depth:
        raise GrammarLimitError("max_depth", f"the {what} nests {depth} deep, more than the limit "
                                             f"max_depth={limits.max_depth}")


def _check_regex_size(text: str, what: str, limits: GrammarLimits) -> None:
    size = regex_size(text)
    if size > limits.max_regex_size:
        raise GrammarLimitError("max_regex_size", f"the {what} is {size} units long with its counted repetitions "
                                                  f"written out, more than the limit max_regex_size="
                                                  f"{limits.max_regex_size}")


LARK_REGEX = re.compile(r"/((?:[^/\\\n]|\\.)+)/")
"""A Lark ``/regex/`` terminal (its text in group 1)."""

COUNTED = re.compile(r"\{(\d{1,9})(?:,(\d{0,9}))?\}")
"""A counted repetition ``{m}``, ``{m,}`` or ``{m,n}``."""


def regex_size(text: str) -> int:
    """An upper bound of ``text``'s length as a regex with each counted repetition written out
    (``((a{100}){100}){100}`` is 10**6): what the compiled automaton grows with. Escapes and
    character classes count one each, alternatives add up; a ``{`` that is not a counted
    repetition is a character. Iterative (a stack of group sums), linear in the text."""
    sums, last, i = [0], 0, 0
    while i < len(text):
        ch = text[i]
        if ch == "\\":
            i += 2
            last = 1
        elif ch == "[":
            i += 1
            if i < len(text) and text[i] == "]":
                i += 1
            while i < len(text) and text[i] != "]":
                i += 2 if text[i] == "\\" else 1
            i += 1
            last = 1
        elif ch == "(":
            sums.append(0)
            i += 1
            continue
        elif ch == ")" and len(sums) > 1:
            last = sums.pop()
            sums[-1] += last
            i += 1
            continue
        elif ch == "{" and (m := COUNTED.match(text, i)):
            low, high = m.group(1), m.group(2)
            count = int(low) if high is None else int(high) if high else int(low) + 1  # {m}, {m,n}, {m,}
            sums[-1] += last * max(count - 1, 0)
            last *= max(count, 1)
            i = m.end()
            continue
        elif ch in "*+?|":
            i += 1
            continue
        else:
            i += 1
            last = 1
        sums[-1] += last
    return sum(sums)


def _patterns(schema: Any) -> list[str]:
    """The ``pattern`` strings of a parsed JSON schema (and its ``patternProperties`` keys)."""
    out, todo = [], [schema]
    while todo:
        node = todo.pop()
        if isinstance(node, dict):
            if isinstance(node.get("pattern"), str):
                out.append(node["pattern"])
            if isinstance(node.get("patternProperties"), dict):
                out.extend(k for k in node["patternProperties"] if isinstance(k, str))
            todo.extend(node.values())
        elif isinstance(node, list):
            todo.extend(node)
    return out


def bracket_depth(text: str) -> int:
    """The deepest nesting of (), [] and {} in ``text`` (escaped brackets count too: an upper bound)."""
    depth = deepest = 0
    for ch in text:
        if ch in "([{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in ")]}" and depth:
            depth -= 1
    return deepest


def check_schema(schema: Any, limits: GrammarLimits) -> None:
    """GrammarLimitError when a parsed JSON schema nests deeper than ``max_depth`` or holds
    more than ``max_refs`` ``$ref``\\ s on one path, each followed into its local target
    (a recursive schema's cycle counts once), or when a ``$ref`` leads only to ``$ref``\\ s
    back to itself (a schema that says nothing: refused rather than compiled to any text)."""
    targets = _ref_targets(schema)
    _check_ref_loops(schema, targets, limits)
    # the longest path below each container (depth, refs), by an iterative post-order walk
    # over containers and $ref edges; an edge back into the walk's current path is cut.
    best: dict[int, tuple[int, int]] = {}
    on_path: set[int] = set()
    stack: list[tuple[Any, bool]] = [(schema, False)]
    while stack:
        node, expanded = stack.pop()
        key = id(node)
        if expanded:
            on_path.discard(key)
            depth, refs = 0, 0
            for child, is_ref in _edges(node, targets):
                d, r = best.get(id(child), (0, 0))
                depth, refs = max(depth, d + (0 if is_ref else 1)), max(refs, r + is_ref)
            best[key] = (depth, refs)
            if depth + 1 > limits.max_depth:
                _check_depth(depth + 1, "JSON schema (its $refs followed)", limits)
            if refs > limits.max_refs:
                raise GrammarLimitError("max_refs", f"the JSON schema follows {refs} $refs on one path, more "
                                                    f"than the limit max_refs={limits.max_refs}")
            continue
        if key in best or key in on_path:
            continue
        on_path.add(key)
        stack.append((node, True))
        stack.extend((child, False) for child, _ in _edges(node, targets)
                     if id(child) not in best and id(child) not in on_path)


def _edges(node: Any, targets: dict[str, Any]) -> list[tuple[Any, bool]]:
    """(child container, via a $ref) pairs of a JSON container."""
    if isinstance(node, dict):
        out = [(v, False) for v in node.values() if isinstance(v, (dict, list))]
        ref = node.get("$ref")
        if isinstance(ref, str) and ref in targets and isinstance(targets[ref], (dict, list)):
            out.append((targets[ref], True))
        return out
    if isinstance(node, list):
        return [(v, False) for v in node if isinstance(v, (dict, list))]
    return []


def _ref_targets(schema: Any) -> dict[str, Any]:
    """Every local ``$ref`` of ``schema`` ("#", "#/a/b") -> the value it points at (absent
    when it points nowhere in the document: the compiler reports those)."""
    refs: set[str] = set()
    todo = [schema]
    while todo:
        node = todo.pop()
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and ref.startswith("#"):
                refs.add(ref)
            todo.extend(node.values())
        elif isinstance(node, list):
            todo.extend(node)
    out = {}
    for ref in refs:
        found, value = True, schema
        for part in ref[1:].split("/")[1:] if ref != "#" else []:
            part = part.replace("~1", "/").replace("~0", "~")
            if isinstance(value, dict) and part in value:
                value = value[part]
            elif isinstance(value, list) and part.isdigit() and int(part) < len(value):
                value = value[int(part)]
            else:
                found = False
                break
        if found:
            out[ref] = value
    return out


def _check_ref_loops(schema: Any, targets: dict[str, Any], limits: GrammarLimits) -> None:
    """GrammarLimitError("ref_loop") when following ``$ref`` from a schema whose only
    keyword is ``$ref`` comes back to it without any other keyword in between."""
    for ref in targets:
        seen, node = {ref}, targets[ref]
        while isinstance(node, dict) and set(node) - {"$ref", "$defs", "definitions", "$schema", "$id",
                                                     "title", "description"} == set():
            nxt = node.get("$ref")
            if not isinstance(nxt, str) or nxt not in targets:
                break
            if nxt in seen:
                raise GrammarLimitError("ref_loop", f"the JSON schema's $ref {nxt!r} leads back to itself "
                                                    "through $refs alone (it constrains nothing)")
            seen.add(nxt)
            if len(seen) > limits.max_refs:
                raise GrammarLimitError("max_refs", f"the JSON schema chains more than max_refs={limits.max_refs} "
                                                    "$refs")
            node = targets[nxt]
