"""Structured outputs and tool calling for the server: a request body's constraint
(scheduler/constraint.py) and its tool-call plan, checked before any decode work.

Where a constraint comes from (at most one per request):
- ``response_format``: ``{"type": "text"}`` (none), ``{"type": "json_object"}``,
  ``{"type": "json_schema", "json_schema": {"name", "schema", "strict"}}``;
- vLLM's extensions: ``guided_json``, ``guided_regex``, ``guided_choice``, ``guided_grammar``
  (Lark) and their newer form ``structured_outputs: {json|regex|choice|grammar|json_object}``;
- tools (chat): the answer follows the tool-call format (tool_calls.py): under ``tool_choice``
  "auto" free text or calls, under "required" or a named function calls only; "none"
  ignores the tools.

vLLM's names were checked against its source (docs/server.md names the files and commits):
``structured_outputs`` is current vLLM's field (``json``, ``regex``, ``choice``, ``grammar``,
``json_object: true``, and the options ``disable_any_whitespace``,
``disable_additional_properties``, ``whitespace_pattern``, ``structural_tag``); the
``guided_*`` fields are older vLLM's, kept for old clients.
"""
from __future__ import annotations

import asyncio
import json
from dataclasses import replace

from rwkv7_core.engine import Capability
from scheduler.constraint import Constraint
from scheduler.grammar import Grammars, current_limits, grammars_for
from scheduler.grammar_limits import check

from . import tool_calls
from .protocol import APIError, ChatCompletionRequest
from .tool_calls import ToolPlan

GUIDED = {"guided_json": "json", "guided_regex": "regex", "guided_choice": "choice", "guided_grammar": "grammar"}


def _one(body) -> list[tuple[str, Constraint]]:
    """(field, constraint) of every structured-output field the body sets."""
    found = []
    if body.response_format is not None:
        try:
            constraint = Constraint.from_response_format(body.response_format)
        except ValueError as e:
            raise APIError(400, f"response_format: {e}", "response_format") from None
        if constraint is not None:
            found.append(("response_format", constraint))
    for name, kind in GUIDED.items():
        value = getattr(body, name)
        if value is not None:
            found.append((name, _constraint(name, kind, value)))
    so = body.structured_outputs
    if so is not None:
        found.append(("structured_outputs", _structured_outputs(so)))
    return found


SO_KINDS = ("json", "regex", "choice", "grammar", "json_object")
SO_OPTIONS = ("disable_any_whitespace", "disable_additional_properties", "whitespace_pattern", "structural_tag",
              "disable_fallback")


def _structured_outputs(so: dict) -> Constraint:
    """vLLM's ``structured_outputs`` (its StructuredOutputsParams): exactly one of SO_KINDS
    (``json_object`` as ``true``); the options: ``disable_any_whitespace`` (JSON here never
    has any), ``disable_additional_properties`` (objects without ``additionalProperties``
    take none) and ``disable_fallback`` (there is no other backend) are honoured, a
    ``whitespace_pattern`` or ``structural_tag`` is a 400."""
    field = "structured_outputs"
    unknown = sorted(set(so) - set(SO_KINDS) - set(SO_OPTIONS))
    if unknown:
        raise APIError(400, f"{field}: unknown field(s) {', '.join(unknown)}; known: "
                            + ", ".join(SO_KINDS + SO_OPTIONS), field)
    for option in ("disable_any_whitespace", "disable_additional_properties", "disable_fallback"):
        if not isinstance(so.get(option, False), bool):
            raise APIError(400, f"{field}.{option}: must be true or false", field)
    for option in ("whitespace_pattern", "structural_tag"):
        if so.get(option) is not None:
            raise APIError(400, f"{field}.{option}: not supported by this server", field)
    if so.get("json_object") not in (None, True):
        raise APIError(400, f"{field}.json_object: must be true when given", field)
    given = [k for k in SO_KINDS if so.get(k) is not None]
    if len(given) != 1:
        raise APIError(400, f"{field}: give exactly one of {', '.join(SO_KINDS)}", field)
    value = so[given[0]]
    if given[0] == "json" and so.get("disable_additional_properties"):
        value = _closed(_constraint(field, "json", value))
    return _constraint(field, given[0], value)


def _closed(constraint: Constraint) -> dict:
    """The schema of ``constraint`` with ``additionalProperties: false`` on every object
    schema that lists ``properties`` and says nothing about others (vLLM's
    disable_additional_properties); iterative, as the schema may nest deeply."""
    schema = json.loads(constraint.spec)
    todo = [schema]
    while todo:
        node = todo.pop()
        if isinstance(node, dict):
            if "properties" in node and "additionalProperties" not in node:
                node["additionalProperties"] = False
            todo.extend(node.values())
        elif isinstance(node, list):
            todo.extend(node)
    return schema


def _constraint(field: str, kind: str, value) -> Constraint:
    try:
        if kind == "json":
            return Constraint.json_schema(value)
        if kind == "json_object":
            return Constraint.json_object()
        if kind == "choice":
            return Constraint.choice(value)
        if not isinstance(value, str) or not value:
            raise ValueError(f"a {kind} must be a non-empty string")
        return Constraint.regex(value) if kind == "regex" else Constraint.grammar(value)
    except ValueError as e:
        raise APIError(400, f"{field}: {e}", field) from None


def tool_plan(body) -> ToolPlan | None:
    """The tools of a chat body (None: no tools, or tool_choice "none"); 400 naming the problem."""
    tools, choice = getattr(body, "tools", None), getattr(body, "tool_choice", None)
    if not tools:
        if choice not in (None, "none", "auto"):
            raise APIError(400, "tool_choice: no tools given", "tool_choice")
        return None
    params, descriptions = {}, {}
    for i, tool in enumerate(tools):
        function = tool.get("function") if tool.get("type", "function") == "function" else None
        if not isinstance(function, dict):
            raise APIError(400, f"tools[{i}]: only {{\"type\": \"function\", \"function\": {{...}}}} tools are served",
                           "tools")
        name = function.get("name")
        if not isinstance(name, str) or not name:
            raise APIError(400, f"tools[{i}].function.name: every tool needs a name", "tools")
        if name in params:
            raise APIError(400, f"tools[{i}].function.name: {name!r} appears twice", "tools")
        schema = function.get("parameters") or {"type": "object", "properties": {}}
        if not isinstance(schema, dict):
            raise APIError(400, f"tools[{i}].function.parameters: must be a JSON schema object", "tools")
        try:
            check(Constraint.json_schema(schema), current_limits())
        except ValueError as e:
            raise APIError(400, f"tools[{i}].function.parameters: {e}", "tools") from None
        params[name], descriptions[name] = schema, str(function.get("description", ""))
    if choice in (None, "auto"):
        forced = None
    elif choice == "none":
        return None
    elif choice == "required":
        forced = "required"
    elif isinstance(choice, dict) and isinstance(choice.get("function"), dict):
        forced = choice["function"].get("name")
        if forced not in params:
            raise APIError(400, f"tool_choice: no tool named {forced!r}", "tool_choice")
    else:
        raise APIError(400, f"tool_choice: {choice!r} is not auto, none, required or "
                            "{\"type\": \"function\", \"function\": {\"name\": ...}}", "tool_choice")
    parallel = getattr(body, "parallel_tool_calls", None) is not False and forced in (None, "required")
    return ToolPlan(params, descriptions, forced, parallel)


def prepare(ctx, body, chat: bool) -> tuple[Constraint | None, ToolPlan | None]:
    """A body's structure, prepared once for the job builder: its tool plan (``chat`` bodies
    only) and its one constraint (``request_constraint``); 400 naming the problem."""
    return request_constraint(ctx, body, tool_plan(body) if chat else None)


def request_constraint(ctx, body, plan: ToolPlan | None) -> tuple[Constraint | None, ToolPlan | None]:
    """The body's one constraint (compiled now: 400 naming an invalid schema or grammar, or an
    unsupported feature, before any decode work; None for free text), and its tool plan with
    the JSON answer a ``response_format`` asks for under tool_choice "auto"."""
    found = _one(body)
    if len(found) > 1:
        raise APIError(400, f"{found[1][0]}: only one structured-output field per request "
                            f"(also given: {found[0][0]})", found[1][0])
    if found:
        _compile(ctx, *found[0])
    if plan is not None:
        if found:
            field, constraint = found[0]
            if field != "response_format" or plan.forced is not None:
                raise APIError(400, f"{field}: with tools only response_format (under tool_choice \"auto\") "
                                    "shapes the answer; send tool_choice \"none\" to use it without tools", field)
            schema = json.loads(constraint.spec) if constraint.kind == "json_schema" else {"type": "object"}
            plan = replace(plan, answer=schema if isinstance(schema, dict) else {} if schema else {"not": {}})
        found = [("tools", Constraint.grammar(plan.grammar()))]
        _compile(ctx, *found[0])
    return (found[0][1] if found else None), plan


def _compile(ctx, field: str, constraint: Constraint) -> None:
    """Compile ``constraint`` now (cached for the scheduler): 400 naming ``field`` when it is
    invalid, beyond a grammar limit, or the server cannot constrain output."""
    try:
        _grammars(ctx, field).compiled(constraint)
    except ValueError as e:
        raise APIError(400, f"{field}: {e}", field) from None


def _grammars(ctx, field: str) -> Grammars:
    engine = ctx.service.scheduler.engine
    if ctx.tokenizer is None or Capability.TOKEN_MASK not in engine.capabilities:
        raise APIError(400, f"{field}: structured output needs the World vocabulary and an engine with token "
                            "masks", field)
    return grammars_for(ctx.tokenizer, ctx.vocab_size)


async def compile_off_loop(ctx, body) -> None:
    """Compile a request body's constraint on the compile thread (scheduler/grammar_worker.py),
    awaited, so the event loop never runs a compile; ``request_constraint`` then finds it
    cached. Errors are left to ``request_constraint``, which names them in order."""
    try:
        plan = tool_plan(body) if isinstance(body, ChatCompletionRequest) else None
        found = _one(body)
        if plan is not None and not found:
            found = [("tools", Constraint.grammar(plan.grammar()))]
        if len(found) == 1:
            await asyncio.wrap_future(_grammars(ctx, found[0][0]).submit(found[0][1]))
    except (APIError, ValueError):
        return


def warm_up(tokenizer, vocab_size: int, engine) -> None:
    """Build the grammar tokenizer now (start-up), not on a first constrained request."""
    if tokenizer is not None and Capability.TOKEN_MASK in engine.capabilities:
        grammars_for(tokenizer, vocab_size)


def history_text(message) -> str:
    """A chat message's text for the prompt: an assistant's tool calls written in the
    tool-call format after its content, a tool result as its content."""
    if message.role == "assistant" and message.tool_calls:
        return tool_calls.history_text(message.text(), message.tool_calls)
    return message.text()
