"""What a request's output must match: ``Constraint``, plain data (no grammar engine).

Kinds: "json_schema" (``spec``: the schema as JSON text), "json_object" (any JSON object;
``spec`` ""), "regex" (``spec``: the pattern, matched in full), "choice" (``spec``: a JSON
list of the allowed strings), "grammar" (``spec``: a Lark grammar, llguidance's dialect).
scheduler/grammar.py compiles one (cached by kind and text) and matches tokens against it.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Sequence

KINDS = ("json_schema", "json_object", "regex", "choice", "grammar")

JSON_DEPTH = 512
"""The deepest JSON a schema may nest when it is read or written here (Python's json
recursion ends near 1000); grammar_limits.py applies the configured, smaller bound."""


def json_text_depth(text: str) -> int:
    """The deepest container nesting of JSON ``text`` (strings skipped), read without parsing it."""
    depth = deepest = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            escaped, in_string = (False, True) if escaped else (ch == "\\", ch != '"')
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "]}" and depth:
            depth -= 1
    return deepest


def json_value_depth(value: Any) -> int:
    """The deepest container nesting of a parsed JSON value (iterative)."""
    deepest, todo = 0, [(value, 1)]
    while todo:
        node, depth = todo.pop()
        children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else None
        if children is not None:
            deepest = max(deepest, depth)
            todo.extend((child, depth + 1) for child in children)
    return deepest


@dataclass(frozen=True)
class Constraint:
    """One request's output constraint (see the module docstring); hashable, picklable."""
    kind: str
    spec: str = ""

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"unknown constraint kind {self.kind!r}; one of {', '.join(KINDS)}")
        if not isinstance(self.spec, str):
            raise ValueError(f"a {self.kind} constraint's spec must be a string, got {type(self.spec).__name__}")

    @classmethod
    def json_schema(cls, schema: dict[str, Any] | bool | str) -> "Constraint":
        """The output is one JSON value valid under ``schema`` (a dict, or its JSON text)."""
        if isinstance(schema, str):
            if json_text_depth(schema) > JSON_DEPTH:
                raise ValueError(f"the JSON schema nests deeper than {JSON_DEPTH} levels")
            try:
                schema = json.loads(schema)
            except json.JSONDecodeError as e:
                raise ValueError(f"the JSON schema is not valid JSON: {e}") from None
        if not isinstance(schema, (dict, bool)):
            raise ValueError(f"a JSON schema must be an object, got {type(schema).__name__}")
        if json_value_depth(schema) > JSON_DEPTH:
            raise ValueError(f"the JSON schema nests deeper than {JSON_DEPTH} levels")
        return cls("json_schema", json.dumps(schema))

    @classmethod
    def json_object(cls) -> "Constraint":
        return cls("json_object")

    @classmethod
    def regex(cls, pattern: str) -> "Constraint":
        return cls("regex", pattern)

    @classmethod
    def choice(cls, choices: Sequence[str]) -> "Constraint":
        """The output is exactly one of ``choices`` (non-empty strings)."""
        if isinstance(choices, str) or not isinstance(choices, Sequence) or not choices:
            raise ValueError("a choice constraint needs a non-empty list of strings")
        if not all(isinstance(c, str) and c for c in choices):
            raise ValueError("every choice must be a non-empty string")
        return cls("choice", json.dumps(list(choices)))

    @classmethod
    def grammar(cls, lark: str) -> "Constraint":
        return cls("grammar", lark)

    @classmethod
    def from_response_format(cls, response_format) -> "Constraint | None":
        """OpenAI's ``response_format``: ``{"type": "text"}`` -> None, ``{"type": "json_object"}``,
        ``{"type": "json_schema", "json_schema": {"name", "schema", "strict"}}``; ValueError
        naming what is wrong."""
        kind = response_format.get("type") if isinstance(response_format, dict) else None
        if kind == "text":
            return None
        if kind == "json_object":
            return cls.json_object()
        if kind == "json_schema":
            spec = response_format.get("json_schema")
            if not isinstance(spec, dict) or "schema" not in spec and "name" not in spec:
                raise ValueError('json_schema needs {"name", "schema"}')
            return cls.json_schema(spec.get("schema", {}))
        raise ValueError(f"type {kind!r} is not one of text, json_object, json_schema")
